// CQ: every ibv_wc field through the ring, wrap-around, overflow → CQ error event, resize,
// notification arming; and the SPSC ring under a real concurrent producer and consumer.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <thread>
#include <vector>

#include "provider/device.h"
#include "provider/spsc_ring.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

ibv_wc make_wc(uint64_t wr_id, ibv_wc_status status = IBV_WC_SUCCESS) {
  ibv_wc wc = {};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RECV;
  return wc;
}

class CqTest : public ProviderTest {
 protected:
  Cq* make(int cqe) { return dev_.create_cq(cqe).value(); }
};

TEST_F(CqTest, SizesFollowIbvCreateCq) {
  EXPECT_EQ(dev_.create_cq(0).error(), EINVAL);
  EXPECT_EQ(dev_.create_cq(-1).error(), EINVAL);
  EXPECT_EQ(dev_.create_cq(static_cast<int>(kLimits.max_cqe) + 1).error(), EINVAL);
  EXPECT_EQ(make(1)->cqe(), 1u);
  EXPECT_EQ(make(10)->cqe(), 15u);  // 2^k - 1 >= requested, as rxe reports
  EXPECT_EQ(make(16)->cqe(), 31u);
  EXPECT_EQ(make(static_cast<int>(kLimits.max_cqe))->cqe(), kLimits.max_cqe);
}

TEST_F(CqTest, EveryFieldSurvives) {
  Cq* cq = make(4);
  ibv_wc in = {};
  in.wr_id = 0x0123456789abcdef;
  in.status = IBV_WC_REM_ACCESS_ERR;
  in.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  in.vendor_err = 0x55;
  in.byte_len = 4096;
  in.imm_data = htonl(0xdeadbeef);
  in.qp_num = 0x11;
  in.src_qp = 0x22;
  in.wc_flags = IBV_WC_GRH | IBV_WC_WITH_IMM;
  in.pkey_index = 0;
  in.slid = 0xffff;
  in.sl = 3;
  in.dlid_path_bits = 1;
  ASSERT_TRUE(cq->push_st(in, false));
  ibv_wc out = {};
  ASSERT_EQ(cq->poll(1, &out), 1);
  EXPECT_EQ(0, std::memcmp(&in, &out, sizeof in));
  EXPECT_EQ(cq->poll(1, &out), 0);
}

TEST_F(CqTest, RingWrapsInOrder) {
  Cq* cq = make(3);
  uint64_t next_in = 0, next_out = 0;
  std::vector<ibv_wc> out(3);
  for (int round = 0; round < 1000; ++round) {
    const int n = 1 + round % 3;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(cq->push_st(make_wc(next_in++), false));
    const int got = cq->poll(static_cast<int>(out.size()), out.data());
    ASSERT_EQ(got, n);
    for (int i = 0; i < got; ++i) ASSERT_EQ(out[i].wr_id, next_out++);
  }
  EXPECT_FALSE(cq->in_error());
}

TEST_F(CqTest, OverflowPutsTheCqInErrorWithOneEvent) {
  Cq* cq = make(3);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(cq->push_st(make_wc(i), false));
  EXPECT_FALSE(cq->push_st(make_wc(3), false));
  EXPECT_TRUE(cq->in_error());
  EXPECT_FALSE(cq->push_st(make_wc(4), false));
  std::optional<AsyncEvent> ev = dev_.async_events().try_pop();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev->cq, cq);
  EXPECT_FALSE(dev_.async_events().try_pop().has_value()) << "one event per CQ error";
  // What was there stays pollable.
  std::vector<ibv_wc> out(8);
  ASSERT_EQ(cq->poll(8, out.data()), 3);
  EXPECT_EQ(out[2].wr_id, 2u);
}

TEST_F(CqTest, Resize) {
  Cq* cq = make(8);
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(cq->push_st(make_wc(i), false));
  EXPECT_EQ(cq->resize(5).error(), EINVAL);  // fewer than the entries present
  EXPECT_EQ(cq->resize(0).error(), EINVAL);
  EXPECT_EQ(cq->resize(kLimits.max_cqe + 1).error(), EINVAL);
  ASSERT_EQ(cq->resize(6), kOk);
  EXPECT_EQ(cq->cqe(), 7u);
  ASSERT_EQ(cq->resize(100), kOk);
  EXPECT_EQ(cq->cqe(), 127u);
  for (uint64_t i = 6; i < 100; ++i) ASSERT_TRUE(cq->push_st(make_wc(i), false));
  std::vector<ibv_wc> out(200);
  ASSERT_EQ(cq->poll(200, out.data()), 100);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(out[i].wr_id, i);
}

ibv_wc wc_of_qp(uint64_t wr_id, uint32_t qp_num) {
  ibv_wc wc = make_wc(wr_id, IBV_WC_WR_FLUSH_ERR);
  wc.qp_num = qp_num;
  return wc;
}

// The entries of one QP go, the others keep their order, across the ring's wrap-around.
TEST_F(CqTest, DiscardQpRemovesOnlyThatQpsEntriesInOrder) {
  Cq* cq = make(8);  // 15 usable entries, 16 slots
  std::vector<ibv_wc> out(16);
  for (uint64_t i = 0; i < 11; ++i) ASSERT_TRUE(cq->push_st(make_wc(i), false));
  ASSERT_EQ(cq->poll(11, out.data()), 11);  // the next entries wrap around the 16 slots
  const uint32_t qpns[] = {5, 9, 5, 5, 9, 7, 5, 9, 9, 5, 7};
  for (uint64_t i = 0; i < std::size(qpns); ++i)
    ASSERT_TRUE(cq->push_st(wc_of_qp(100 + i, qpns[i]), false));
  EXPECT_EQ(cq->discard_qp(5), 5u);
  EXPECT_EQ(cq->discard_qp(5), 0u);
  EXPECT_EQ(cq->size(), 6u);
  ASSERT_EQ(cq->poll(16, out.data()), 6);
  const uint64_t kept[] = {101, 104, 105, 107, 108, 110};
  for (size_t i = 0; i < std::size(kept); ++i) EXPECT_EQ(out[i].wr_id, kept[i]) << i;
  // The ring is whole afterwards: it fills to its capacity again.
  for (uint64_t i = 0; i < cq->cqe(); ++i) ASSERT_TRUE(cq->push_st(make_wc(i), false));
  EXPECT_FALSE(cq->push_st(make_wc(99), false));
}

// A QP moved to RESET takes its unpolled completions with it (as mlx4/mlx5 do); a QP sharing
// the CQ keeps its own.
TEST_F(CqTest, ModifyToResetDiscardsTheQpsCompletions) {
  Qp* a = make_qp(IBV_QPT_RC);
  Qp* b = make_qp(IBV_QPT_RC);
  drive(a, IBV_QPS_RTS);
  drive(b, IBV_QPS_RTS);
  ASSERT_TRUE(cq()->push_st(wc_of_qp(1, a->qp_num()), false));
  ASSERT_TRUE(cq()->push_st(wc_of_qp(2, b->qp_num()), false));
  ASSERT_TRUE(cq()->push_st(wc_of_qp(3, a->qp_num()), false));
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(a->modify(attr, IBV_QP_STATE), kOk);
  EXPECT_EQ(cq()->size(), 3u) << "ERR keeps them";
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(a->modify(attr, IBV_QP_STATE), kOk);
  std::vector<ibv_wc> out(4);
  ASSERT_EQ(cq()->poll(4, out.data()), 1);
  EXPECT_EQ(out[0].wr_id, 2u);
  EXPECT_EQ(out[0].qp_num, b->qp_num());
}

TEST_F(CqTest, NotificationArming) {
  Cq* cq = make(16);
  int fired = 0;
  cq->set_notify([&](Cq& c) {
    EXPECT_EQ(&c, cq);
    ++fired;
  });
  ASSERT_TRUE(cq->push_st(make_wc(0), true));
  EXPECT_EQ(fired, 0) << "not armed";
  // Next completion: fires once, then disarms.
  cq->req_notify(false);
  ASSERT_TRUE(cq->push_st(make_wc(1), false));
  ASSERT_TRUE(cq->push_st(make_wc(2), false));
  EXPECT_EQ(fired, 1);
  // Solicited only: an unsolicited success does not fire; a solicited one does.
  cq->req_notify(true);
  ASSERT_TRUE(cq->push_st(make_wc(3), false));
  EXPECT_EQ(fired, 1);
  ASSERT_TRUE(cq->push_st(make_wc(4), true));
  EXPECT_EQ(fired, 2);
  // Solicited only also fires on an error completion (IBA 11.4.2.2).
  cq->req_notify(true);
  ASSERT_TRUE(cq->push_st(make_wc(5, IBV_WC_WR_FLUSH_ERR), false));
  EXPECT_EQ(fired, 3);
  // A later "next completion" request widens a solicited-only arming.
  cq->req_notify(true);
  cq->req_notify(false);
  ASSERT_TRUE(cq->push_st(make_wc(6), false));
  EXPECT_EQ(fired, 4);
}

// The device counts its armed CQs (the runtime keeps watching its socket while one is armed):
// an arming counts once however often it is repeated, a firing or a destroyed CQ counts down.
TEST_F(CqTest, TheDeviceCountsItsArmedCqs) {
  Cq* one = make(16);
  Cq* two = make(16);
  EXPECT_EQ(dev_.armed_cqs(), 0u);
  one->req_notify(true);
  one->req_notify(false);
  EXPECT_EQ(dev_.armed_cqs(), 1u);
  two->req_notify(false);
  EXPECT_EQ(dev_.armed_cqs(), 2u);
  ASSERT_TRUE(one->push_st(make_wc(0), false));
  EXPECT_EQ(dev_.armed_cqs(), 1u) << "a fired CQ still counted";
  ASSERT_TRUE(one->push_st(make_wc(1), false));
  EXPECT_EQ(dev_.armed_cqs(), 1u);
  ASSERT_EQ(dev_.destroy_cq(two), kOk);
  EXPECT_EQ(dev_.armed_cqs(), 0u) << "a destroyed armed CQ still counted";
}

TEST_F(CqTest, CqInUseCannotBeDestroyed) {
  Qp* qp = make_qp(IBV_QPT_RC);
  EXPECT_EQ(dev_.destroy_cq(cq()).error(), EBUSY);
  ASSERT_EQ(dev_.destroy_qp(qp), kOk);
  EXPECT_EQ(dev_.destroy_cq(cq()), kOk);
  cq_ = nullptr;
}

TEST_F(CqTest, EngineProducesWhileAPollerConsumes) {
  Cq* cq = make(15);
  constexpr uint64_t kCount = 50000;
  std::thread engine([&] {
    const EngineTurnMark turn;
    for (uint64_t i = 0; i < kCount; ++i) {
      while (cq->size() == cq->cqe()) std::this_thread::yield();  // only the poller frees
      ASSERT_TRUE(cq->push_st(make_wc(i), false));
    }
  });
  std::vector<ibv_wc> out(4);
  for (uint64_t expected = 0; expected < kCount;) {
    const int n = cq->poll(static_cast<int>(out.size()), out.data());
    if (n == 0) std::this_thread::yield();
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i].wr_id, expected++);
  }
  engine.join();
  EXPECT_FALSE(cq->in_error());
}

TEST(SpscRing, ConcurrentProducerAndConsumerSeeEveryEntryInOrder) {
  SpscRing<uint64_t> ring(7);
  constexpr uint64_t kCount = 50000;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount;) {
      if (ring.push(i)) {
        ++i;
      } else {
        std::this_thread::yield();
      }
    }
  });
  uint64_t expected = 0;
  while (expected < kCount) {
    const uint64_t* v = ring.peek();
    if (v == nullptr) {
      std::this_thread::yield();
      continue;
    }
    ASSERT_EQ(*v, expected);
    ring.pop();
    ++expected;
  }
  producer.join();
  EXPECT_TRUE(ring.empty());
}

TEST(SpscRing, FreeRunningIndicesWrapAround32Bits) {
  SpscRing<uint32_t> ring(3);
  EXPECT_EQ(ring.capacity(), 3u);
  // 2^32 + a few pushes would take long; instead check fill level across many laps.
  for (uint32_t i = 0; i < 100000; ++i) {
    ASSERT_TRUE(ring.push(i));
    ASSERT_TRUE(ring.push(i + 1));
    ASSERT_EQ(ring.size(), 2u);
    ASSERT_EQ(*ring.peek(), i);
    ASSERT_EQ(*ring.peek_at(1), i + 1);
    EXPECT_EQ(ring.peek_at(2), nullptr);
    ring.pop();
    ring.pop();
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ring.push(0));
  EXPECT_FALSE(ring.push(0));
}

}  // namespace
}  // namespace urdma::provider::testing
