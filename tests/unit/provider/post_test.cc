// post_send / post_recv: validation as a device does it, bad_wr pointing at the failing WR,
// what the WQE carries (copied SGEs, inline data copied at post time, UD address), capacity
// rounding, and the doorbell.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

// A doorbell that counts rings: the engine's view of new work.
class CountingDoorbell : public Doorbell {
 public:
  void ring_sq(Qp&) override { ++sq; }
  void ring_rq(Qp&) override { ++rq; }
  void qp_modified(Qp&, ibv_qp_state from, ibv_qp_state to) override {
    last_from = from;
    last_to = to;
    ++modified;
  }
  int sq = 0, rq = 0, modified = 0;
  ibv_qp_state last_from = IBV_QPS_RESET, last_to = IBV_QPS_RESET;
};

class PostTest : public ProviderTest {
 protected:
  PostTest() : ProviderTest(&doorbell_) {}
  void SetUp() override {
    mr_ = dev_.reg_mr(pd(), buf_.data(), buf_.size(), addr(), IBV_ACCESS_LOCAL_WRITE).value();
    for (int i = 0; i < 8; ++i) sge_[i] = {addr() + 64 * i, 16, mr_->lkey()};
  }
  uint64_t addr() { return reinterpret_cast<uintptr_t>(buf_.data()); }
  ibv_send_wr send_wr(uint64_t wr_id, ibv_wr_opcode op = IBV_WR_SEND, int num_sge = 1) {
    ibv_send_wr wr = {};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = sge_;
    wr.num_sge = num_sge;
    wr.send_flags = IBV_SEND_SIGNALED;
    return wr;
  }
  Qp* rts(ibv_qp_type type, ibv_qp_cap cap = {16, 16, 4, 4, 64}) {
    Qp* qp = make_qp(type, nullptr, cap);
    drive(qp, IBV_QPS_RTS);
    return qp;
  }
  Status post1(Qp* qp, ibv_send_wr wr) {
    ibv_send_wr* bad = nullptr;
    return qp->post_send(&wr, &bad);
  }

  CountingDoorbell doorbell_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(4096);
  Mr* mr_ = nullptr;
  ibv_sge sge_[8] = {};
};

TEST_F(PostTest, CapacitiesAreRoundedAndReported) {
  Qp* qp = make_qp(IBV_QPT_RC, nullptr, {10, 5, 2, 3, 64});
  EXPECT_EQ(qp->cap().max_send_wr, 15u);
  EXPECT_EQ(qp->cap().max_recv_wr, 7u);
  EXPECT_EQ(qp->cap().max_send_sge, 4u);  // 64 inline bytes hold 4 SGEs
  EXPECT_EQ(qp->cap().max_recv_sge, 3u);
  EXPECT_EQ(qp->cap().max_inline_data, 64u);
  Qp* small = make_qp(IBV_QPT_RC, nullptr, {1, 1, 3, 1, 0});
  EXPECT_EQ(small->cap().max_inline_data, 48u);  // 3 SGEs of 16 bytes
  QpInitAttr init = {.qp_type = IBV_QPT_RC, .pd = pd(), .send_cq = cq(), .recv_cq = cq()};
  init.cap = {kLimits.max_qp_wr + 1, 1, 1, 1, 0};
  EXPECT_EQ(dev_.create_qp(init).error(), EINVAL);
  init.cap = {1, 1, kLimits.max_sge + 1, 1, 0};
  EXPECT_EQ(dev_.create_qp(init).error(), EINVAL);
  init.cap = {1, 1, 1, kLimits.max_sge + 1, 0};
  EXPECT_EQ(dev_.create_qp(init).error(), EINVAL);
  init.cap = {1, 1, 1, 1, kLimits.max_inline_data_bytes + 1};
  EXPECT_EQ(dev_.create_qp(init).error(), EINVAL);
  init.cap = {1, 1, 1, 1, 0};
  init.qp_type = IBV_QPT_RAW_PACKET;
  EXPECT_EQ(dev_.create_qp(init).error(), EOPNOTSUPP);
  init.qp_type = IBV_QPT_RC;
  init.send_cq = nullptr;
  EXPECT_EQ(dev_.create_qp(init).error(), EINVAL);
}

TEST_F(PostTest, QpNumbersAreDistinctAndFoundByTheEngine) {
  Qp* a = make_qp(IBV_QPT_RC);
  Qp* b = make_qp(IBV_QPT_UD);
  EXPECT_NE(a->qp_num(), b->qp_num());
  EXPECT_GE(a->qp_num(), 2u);
  EXPECT_EQ(dev_.qp_by_num(a->qp_num()), a);
  EXPECT_EQ(dev_.qp_by_num(b->qp_num()), b);
  EXPECT_EQ(dev_.qp_by_num(1), nullptr);
  const uint32_t num = a->qp_num();
  ASSERT_EQ(dev_.destroy_qp(a), kOk);
  EXPECT_EQ(dev_.qp_by_num(num), nullptr);
  // A destroyed QP's number is not handed out again at once.
  EXPECT_NE(make_qp(IBV_QPT_RC)->qp_num(), num);
}

TEST_F(PostTest, SendBeforeRtsIsEinval) {
  Qp* qp = make_qp(IBV_QPT_RC);
  for (ibv_qp_state st : {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR}) {
    drive(qp, st);
    ibv_send_wr wr = send_wr(1);
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(qp->post_send(&wr, &bad).error(), EINVAL) << st;
    EXPECT_EQ(bad, &wr);
  }
  EXPECT_EQ(doorbell_.sq, 0);
}

TEST_F(PostTest, BadWrPointsAtTheFailingWrAndEarlierOnesArePosted) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr wrs[3] = {send_wr(0), send_wr(1, IBV_WR_SEND, 5), send_wr(2)};  // 5 > max_sge 4
  wrs[0].next = &wrs[1];
  wrs[1].next = &wrs[2];
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(qp->post_send(wrs, &bad).error(), EINVAL);
  EXPECT_EQ(bad, &wrs[1]);
  EXPECT_EQ(qp->sq_size(), 1u);
  EXPECT_EQ(qp->sq_peek_st(0)->wr_id, 0u);
  EXPECT_EQ(doorbell_.sq, 1) << "the posted WR was announced";
}

TEST_F(PostTest, OpcodesPerQpType) {
  struct Case {
    ibv_wr_opcode op;
    bool rc, uc, ud;
  };
  const Case kCases[] = {
      {IBV_WR_SEND, true, true, true},
      {IBV_WR_SEND_WITH_IMM, true, true, true},
      {IBV_WR_SEND_WITH_INV, true, false, false},
      {IBV_WR_RDMA_WRITE, true, true, false},
      {IBV_WR_RDMA_WRITE_WITH_IMM, true, true, false},
      {IBV_WR_RDMA_READ, true, false, false},
      {IBV_WR_ATOMIC_CMP_AND_SWP, true, false, false},
      {IBV_WR_ATOMIC_FETCH_AND_ADD, true, false, false},
      {IBV_WR_LOCAL_INV, true, true, false},
      {IBV_WR_TSO, false, false, false},
      {IBV_WR_DRIVER1, false, false, false},
      {IBV_WR_ATOMIC_WRITE, true, false, false},
      {ibv_wr_opcode(13), false, false, false},
      {ibv_wr_opcode(14), false, false, false},
  };
  Qp* rc = rts(IBV_QPT_RC);
  Qp* uc = rts(IBV_QPT_UC);
  Qp* ud = rts(IBV_QPT_UD);
  Ah* ah = dev_.create_ah(pd(), global_ah_attr(ipv4_gid(192, 0, 2, 9))).value();
  ibv_ah ibv_ah = {};
  ibv_ah.handle = ah->handle();
  for (const Case& c : kCases) {
    ibv_send_wr wr = send_wr(1, c.op);
    wr.sg_list[0].length = 8;  // valid for atomics too
    wr.wr.atomic.remote_addr = 0x1000;
    EXPECT_EQ(post1(rc, wr).ok(), c.rc) << "RC op " << c.op;
    EXPECT_EQ(post1(uc, wr).ok(), c.uc) << "UC op " << c.op;
    wr.wr.ud.ah = &ibv_ah;
    EXPECT_EQ(post1(ud, wr).ok(), c.ud) << "UD op " << c.op;
  }
}

TEST_F(PostTest, AtomicsNeedOneAlignedEightByteOperand) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr wr = send_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD);
  sge_[0].length = 8;
  wr.wr.atomic = {.remote_addr = 0x1008, .compare_add = 5, .swap = 0, .rkey = 0x1234};
  EXPECT_EQ(post1(qp, wr), kOk);
  wr.wr.atomic.remote_addr = 0x1004;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
  wr.wr.atomic.remote_addr = 0x1008;
  sge_[0].length = 4;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
  sge_[0].length = 8;
  wr.num_sge = 2;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
  const SendWqe* wqe = qp->sq_peek_st(0);
  EXPECT_EQ(wqe->compare_add, 5u);
  EXPECT_EQ(wqe->rkey, 0x1234u);
  EXPECT_EQ(wqe->remote_addr, 0x1008u);
}

TEST_F(PostTest, AtomicWriteCarriesExactlyEightBytes) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr wr = send_wr(1, IBV_WR_ATOMIC_WRITE);
  wr.wr.rdma = {.remote_addr = 0x1004, .rkey = 0x1234};  // alignment is the responder's check
  sge_[0] = {addr(), 4, mr_->lkey()};
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
  sge_[0].length = 8;
  EXPECT_EQ(post1(qp, wr), kOk);
  // Inline: the 8 bytes travel in the WQE, taken at post time.
  const uint64_t value = 0x8877665544332211;
  std::memcpy(buf_.data(), &value, sizeof value);
  wr.send_flags |= IBV_SEND_INLINE;
  EXPECT_EQ(post1(qp, wr), kOk);
  std::memset(buf_.data(), 0, 8);
  const SendWqe* wqe = qp->sq_peek_st(1);
  ASSERT_NE(wqe, nullptr);
  EXPECT_EQ(wqe->opcode, IBV_WR_ATOMIC_WRITE);
  EXPECT_TRUE(wqe->send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(wqe->compare_add, value);
  EXPECT_EQ(wqe->remote_addr, 0x1004u);
  EXPECT_EQ(wqe->rkey, 0x1234u);
}

TEST_F(PostTest, InlineDataIsCopiedAtPostTime) {
  Qp* qp = rts(IBV_QPT_RC);
  std::memcpy(buf_.data(), "hello, ", 7);
  std::memcpy(buf_.data() + 64, "world", 5);
  sge_[0].length = 7;
  sge_[1].length = 5;
  ibv_send_wr wr = send_wr(1, IBV_WR_RDMA_WRITE, 2);
  wr.send_flags |= IBV_SEND_INLINE;
  ASSERT_EQ(post1(qp, wr), kOk);
  std::memset(buf_.data(), 'x', 128);  // the application reuses its buffer at once
  const SendWqe* wqe = qp->sq_peek_st(0);
  ASSERT_NE(wqe, nullptr);
  EXPECT_TRUE(wqe->send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(wqe->length, 12u);
  EXPECT_EQ(wqe->num_sge, 0u);
  const std::span<const uint8_t> data = qp->sq_inline_st(*wqe);
  EXPECT_EQ(std::string(data.begin(), data.end()), "hello, world");
  // Too big for max_inline_data.
  sge_[0].length = 60;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
  // INLINE on a READ is ignored, as on rxe: the SGE list is kept.
  ibv_send_wr rd = send_wr(2, IBV_WR_RDMA_READ);
  rd.send_flags |= IBV_SEND_INLINE;
  ASSERT_EQ(post1(qp, rd), kOk);
  EXPECT_FALSE(qp->sq_peek_st(1)->send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(qp->sq_peek_st(1)->num_sge, 1u);
}

TEST_F(PostTest, SgeListIsCopied) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr wr = send_wr(7, IBV_WR_SEND_WITH_IMM, 3);
  wr.imm_data = htobe32(0xabcd);
  ASSERT_EQ(post1(qp, wr), kOk);
  const ibv_sge original = sge_[2];
  sge_[2] = {};
  const SendWqe* wqe = qp->sq_peek_st(0);
  EXPECT_EQ(wqe->length, 48u);
  EXPECT_EQ(wqe->imm_data, htobe32(0xabcd));
  const std::span<const ibv_sge> sges = qp->sq_sges_st(*wqe);
  ASSERT_EQ(sges.size(), 3u);
  EXPECT_EQ(sges[2].addr, original.addr);
  EXPECT_EQ(sges[2].lkey, original.lkey);
  EXPECT_EQ(send_opcode_info(wqe->opcode)->wc_opcode, IBV_WC_SEND);
}

TEST_F(PostTest, UnknownSendFlagsAreRefused) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr wr = send_wr(1);
  wr.send_flags |= 1u << 7;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL);
}

TEST_F(PostTest, FullSendQueueIsEnomem) {
  Qp* qp = rts(IBV_QPT_RC, {3, 1, 1, 1, 0});
  std::vector<ibv_send_wr> wrs(5);
  for (int i = 0; i < 5; ++i) {
    wrs[i] = send_wr(i);
    wrs[i].next = i < 4 ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(qp->post_send(wrs.data(), &bad).error(), ENOMEM);
  EXPECT_EQ(bad, &wrs[3]);
  // The engine retires one; one more fits.
  qp->sq_pop_st();
  bad = nullptr;
  EXPECT_EQ(qp->post_send(&wrs[3], &bad).error(), ENOMEM);
  EXPECT_EQ(bad, &wrs[4]);
  EXPECT_EQ(qp->sq_peek_st(2)->wr_id, 3u);
}

TEST_F(PostTest, UdNeedsAnAhOfTheQpsPdAndCopiesTheAddress) {
  Qp* qp = rts(IBV_QPT_UD);
  ibv_send_wr wr = send_wr(1);
  EXPECT_EQ(post1(qp, wr).error(), EINVAL) << "no AH";
  Pd* other = dev_.alloc_pd().value();
  Ah* foreign = dev_.create_ah(other, global_ah_attr(ipv4_gid(192, 0, 2, 7))).value();
  ibv_ah foreign_handle = {};
  foreign_handle.handle = foreign->handle();
  wr.wr.ud.ah = &foreign_handle;
  EXPECT_EQ(post1(qp, wr).error(), EINVAL) << "AH of another PD";
  Ah* ah = dev_.create_ah(pd(), global_ah_attr(ipv4_gid(192, 0, 2, 7))).value();
  ibv_ah handle = {};
  handle.handle = ah->handle();
  wr.wr.ud = {.ah = &handle, .remote_qpn = 0x42, .remote_qkey = 0x11111111};
  ASSERT_EQ(post1(qp, wr), kOk);
  ASSERT_EQ(dev_.destroy_ah(ah), kOk);  // the WQE has its own copy
  const SendWqe* wqe = qp->sq_peek_st(0);
  EXPECT_EQ(wqe->remote_qpn, 0x42u);
  EXPECT_EQ(wqe->remote_qkey, 0x11111111u);
  EXPECT_EQ(wqe->av.family, AddressVector::Family::kIpv4);
  EXPECT_EQ(wqe->av.dest_ip[3], 7);
  EXPECT_EQ(wqe->av.flow_label, 0x12345u);
}

TEST_F(PostTest, PostingInErrorQueuesForFlush) {
  Qp* qp = rts(IBV_QPT_RC);
  ASSERT_EQ(qp->modify(valid_attr(IBV_QPS_RTS, IBV_QPS_ERR), IBV_QP_STATE), kOk);
  EXPECT_EQ(doorbell_.last_to, IBV_QPS_ERR);
  EXPECT_EQ(post1(qp, send_wr(1)), kOk);
  EXPECT_EQ(qp->sq_size(), 1u);
}

TEST_F(PostTest, FlushCompletesEveryQueuedWrInOrder) {
  Qp* qp = rts(IBV_QPT_RC);
  ibv_send_wr rd = send_wr(1, IBV_WR_RDMA_READ);
  ASSERT_EQ(post1(qp, send_wr(0)), kOk);
  ASSERT_EQ(post1(qp, rd), kOk);
  ibv_recv_wr rwr = {.wr_id = 2, .next = nullptr, .sg_list = sge_, .num_sge = 1};
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(qp->post_recv(&rwr, &bad), kOk);
  ASSERT_TRUE(qp->enter_error_st(IBV_QPS_ERR));
  EXPECT_EQ(qp->flush_st(), 3u);
  ibv_wc wc[4] = {};
  ASSERT_EQ(cq()->poll(4, wc), 3);
  EXPECT_EQ(wc[0].wr_id, 0u);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wc[1].wr_id, 1u);
  EXPECT_EQ(wc[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[2].wr_id, 2u);
  EXPECT_EQ(wc[2].opcode, IBV_WC_RECV);
  for (const ibv_wc& w : std::span(wc, 3)) {
    EXPECT_EQ(w.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(w.qp_num, qp->qp_num());
  }
  EXPECT_EQ(qp->flush_st(), 0u);
}

TEST_F(PostTest, Receive) {
  Qp* qp = make_qp(IBV_QPT_RC, nullptr, {4, 3, 1, 2, 0});
  ibv_recv_wr wrs[4] = {};
  for (int i = 0; i < 4; ++i)
    wrs[i] = {.wr_id = uint64_t(10 + i),
              .next = i < 3 ? &wrs[i + 1] : nullptr,
              .sg_list = sge_,
              .num_sge = 2};
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(qp->post_recv(wrs, &bad).error(), EINVAL) << "RESET";
  EXPECT_EQ(bad, &wrs[0]);
  drive(qp, IBV_QPS_INIT);
  wrs[2].num_sge = 3;
  bad = nullptr;
  EXPECT_EQ(qp->post_recv(wrs, &bad).error(), EINVAL);
  EXPECT_EQ(bad, &wrs[2]);
  EXPECT_EQ(qp->rq_size(), 2u);
  EXPECT_EQ(doorbell_.rq, 1);
  wrs[2].num_sge = 1;
  bad = nullptr;
  EXPECT_EQ(qp->post_recv(&wrs[2], &bad).error(), ENOMEM);  // capacity 3
  EXPECT_EQ(bad, &wrs[3]);
  RecvWork work;
  ASSERT_TRUE(qp->take_recv_st(work));
  EXPECT_EQ(work.wr_id, 10u);
  EXPECT_EQ(work.sges().size(), 2u);
  EXPECT_EQ(work.sge[1].addr, sge_[1].addr);
}

TEST_F(PostTest, ResetEmptiesTheQueuesAfterTheEngineWasTold) {
  Qp* qp = rts(IBV_QPT_RC);
  ASSERT_EQ(post1(qp, send_wr(1)), kOk);
  ibv_recv_wr rwr = {.wr_id = 1, .next = nullptr, .sg_list = sge_, .num_sge = 1};
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(qp->post_recv(&rwr, &bad), kOk);
  ASSERT_EQ(qp->modify(valid_attr(IBV_QPS_RTS, IBV_QPS_RESET), IBV_QP_STATE), kOk);
  EXPECT_EQ(doorbell_.last_from, IBV_QPS_RTS);
  EXPECT_EQ(doorbell_.last_to, IBV_QPS_RESET);
  EXPECT_EQ(qp->sq_size(), 0u);
  EXPECT_EQ(qp->rq_size(), 0u);
}

TEST_F(PostTest, PostingThreadAndEngineThreadShareTheSendQueue) {
  Qp* qp = rts(IBV_QPT_RC, {7, 1, 2, 1, 0});
  constexpr uint64_t kCount = 20000;
  std::thread engine([&] {
    const EngineTurnMark turn;
    for (uint64_t expected = 0; expected < kCount;) {
      const SendWqe* wqe = qp->sq_peek_st(0);
      if (wqe == nullptr) {
        std::this_thread::yield();
        continue;
      }
      ASSERT_EQ(wqe->wr_id, expected);
      const std::span<const ibv_sge> sges = qp->sq_sges_st(*wqe);
      ASSERT_EQ(sges.size(), 2u);
      ASSERT_EQ(sges[0].addr, expected);  // the side area travels with its WQE
      ASSERT_EQ(sges[1].length, static_cast<uint32_t>(expected * 3));
      qp->sq_pop_st();
      ++expected;
    }
  });
  for (uint64_t i = 0; i < kCount;) {
    ibv_sge sges[2] = {{i, 1, 0}, {0, static_cast<uint32_t>(i * 3), 0}};
    ibv_send_wr wr = {};
    wr.wr_id = i;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = sges;
    wr.num_sge = 2;
    ibv_send_wr* bad = nullptr;
    const Status s = qp->post_send(&wr, &bad);
    if (s.ok()) {
      ++i;
    } else {
      ASSERT_EQ(s.error(), ENOMEM);
      std::this_thread::yield();
    }
  }
  engine.join();
  EXPECT_EQ(qp->sq_size(), 0u);
}

}  // namespace
}  // namespace urdma::provider::testing
