// SRQ: validation, posting with bad_wr, limit event once per arming, resize, sharing by QPs;
// a tag-matching SRQ's list operations, matching and phase synchronization without an engine
// (the test runs the engine's side itself under an EngineTurnMark).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

class SrqTest : public ProviderTest {
 protected:
  Srq* make(uint32_t max_wr, uint32_t max_sge = 2, uint32_t limit = 0) {
    Result<Srq*> srq = dev_.create_srq(pd(), {max_wr, max_sge, limit});
    EXPECT_TRUE(srq.ok()) << srq.error();
    return srq.value();
  }
  Status post(Srq* srq, uint64_t wr_id, int num_sge = 1) {
    ibv_recv_wr wr = {.wr_id = wr_id, .next = nullptr, .sg_list = sge_, .num_sge = num_sge};
    ibv_recv_wr* bad = nullptr;
    return srq->post_recv(&wr, &bad);
  }
  int limit_events() {
    int n = 0;
    while (std::optional<AsyncEvent> ev = dev_.async_events().try_pop()) {
      EXPECT_EQ(ev->type, IBV_EVENT_SRQ_LIMIT_REACHED);
      ++n;
    }
    return n;
  }
  ibv_sge sge_[4] = {{0x1000, 64, 1}, {0x2000, 64, 1}, {0x3000, 64, 1}, {0x4000, 64, 1}};
};

TEST_F(SrqTest, CreateValidation) {
  EXPECT_EQ(dev_.create_srq(pd(), {0, 1, 0}).error(), EINVAL);
  EXPECT_EQ(dev_.create_srq(pd(), {kLimits.max_srq_wr + 1, 1, 0}).error(), EINVAL);
  EXPECT_EQ(dev_.create_srq(pd(), {16, kLimits.max_srq_sge + 1, 0}).error(), EINVAL);
  EXPECT_EQ(dev_.create_srq(pd(), {16, 1, 17}).error(), EINVAL);
  EXPECT_EQ(dev_.create_srq(nullptr, {16, 1, 0}).error(), EINVAL);
  Srq* srq = make(10, 3, 4);
  const ibv_srq_attr attr = srq->query();
  EXPECT_EQ(attr.max_wr, 15u);
  EXPECT_EQ(attr.max_sge, 3u);
  EXPECT_EQ(attr.srq_limit, 4u);
}

TEST_F(SrqTest, PostValidationPointsBadWrAtTheFailingWr) {
  Srq* srq = make(3, 2);
  ibv_recv_wr wrs[3] = {};
  for (int i = 0; i < 3; ++i) {
    wrs[i] = {
        .wr_id = uint64_t(i), .next = i < 2 ? &wrs[i + 1] : nullptr, .sg_list = sge_, .num_sge = 1};
  }
  wrs[1].num_sge = 3;  // above max_sge
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(srq->post_recv(wrs, &bad).error(), EINVAL);
  EXPECT_EQ(bad, &wrs[1]);
  EXPECT_EQ(srq->size(), 1u);
  // Full → ENOMEM at the WR that did not fit.
  wrs[1].num_sge = 2;
  bad = nullptr;
  EXPECT_EQ(srq->post_recv(wrs, &bad).error(), ENOMEM);
  EXPECT_EQ(bad, &wrs[2]);
  EXPECT_EQ(srq->size(), 3u);
  RecvWork work;
  ASSERT_TRUE(srq->take_st(work));
  EXPECT_EQ(work.wr_id, 0u);
  ASSERT_TRUE(srq->take_st(work));
  EXPECT_EQ(work.wr_id, 0u);
  ASSERT_TRUE(srq->take_st(work));
  EXPECT_EQ(work.wr_id, 1u);
  EXPECT_EQ(work.num_sge, 2u);
  EXPECT_EQ(work.length, 128u);
  EXPECT_EQ(work.sge[1].addr, 0x2000u);
  EXPECT_FALSE(srq->take_st(work));
}

TEST_F(SrqTest, LimitEventFiresOncePerArming) {
  Srq* srq = make(16);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(post(srq, i), kOk);
  ibv_srq_attr attr = {};
  attr.srq_limit = 5;
  ASSERT_EQ(srq->modify(attr, IBV_SRQ_LIMIT), kOk);
  RecvWork work;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(srq->take_st(work));  // 5 left: not below 5
  EXPECT_EQ(limit_events(), 0);
  ASSERT_TRUE(srq->take_st(work));  // 4 < 5
  EXPECT_EQ(limit_events(), 1);
  EXPECT_EQ(srq->query().srq_limit, 0u) << "disarmed";
  ASSERT_TRUE(srq->take_st(work));
  EXPECT_EQ(limit_events(), 0);
  // Re-armed: fires again on the next drop below the limit.
  attr.srq_limit = 3;
  ASSERT_EQ(srq->modify(attr, IBV_SRQ_LIMIT), kOk);
  ASSERT_TRUE(srq->take_st(work));  // 2 left
  EXPECT_EQ(limit_events(), 1);
}

TEST_F(SrqTest, ModifyValidationAndResize) {
  Srq* srq = make(7);
  ibv_srq_attr attr = {};
  attr.srq_limit = 8;
  EXPECT_EQ(srq->modify(attr, IBV_SRQ_LIMIT).error(), EINVAL);  // above max_wr
  EXPECT_EQ(srq->modify(attr, 1 << 5).error(), EINVAL);
  for (int i = 0; i < 6; ++i) ASSERT_EQ(post(srq, i), kOk);
  attr.max_wr = 5;
  EXPECT_EQ(srq->modify(attr, IBV_SRQ_MAX_WR).error(), EINVAL);  // below the WQEs present
  attr.max_wr = 40;
  ASSERT_EQ(srq->modify(attr, IBV_SRQ_MAX_WR), kOk);
  EXPECT_EQ(srq->query().max_wr, 63u);
  for (int i = 6; i < 40; ++i) ASSERT_EQ(post(srq, i), kOk);
  RecvWork work;
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(srq->take_st(work));
    EXPECT_EQ(work.wr_id, i);
  }
}

TEST_F(SrqTest, SharedByQps) {
  Srq* srq = make(16);
  Qp* a = make_qp(IBV_QPT_RC, srq);
  Qp* b = make_qp(IBV_QPT_UD, srq);
  EXPECT_EQ(a->cap().max_recv_wr, 0u);
  drive(a, IBV_QPS_INIT);
  // ibv_post_recv on a QP with an SRQ is EINVAL.
  ibv_recv_wr wr = {.wr_id = 1, .next = nullptr, .sg_list = sge_, .num_sge = 1};
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(a->post_recv(&wr, &bad).error(), EINVAL);
  EXPECT_EQ(bad, &wr);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post(srq, i), kOk);
  RecvWork work;
  ASSERT_TRUE(a->take_recv_st(work));
  EXPECT_EQ(work.wr_id, 0u);
  ASSERT_TRUE(b->take_recv_st(work));
  EXPECT_EQ(work.wr_id, 1u);
  EXPECT_EQ(a->rq_size(), 2u);
  EXPECT_EQ(dev_.destroy_srq(srq).error(), EBUSY);
  EXPECT_EQ(dev_.dealloc_pd(pd()).error(), EBUSY);
  ASSERT_EQ(dev_.destroy_qp(a), kOk);
  ASSERT_EQ(dev_.destroy_qp(b), kOk);
  EXPECT_EQ(dev_.destroy_srq(srq), kOk);
}

class TmSrqTest : public SrqTest {
 protected:
  void SetUp() override {
    srq_ = dev_.create_srq(pd(), {16, 1, 0}, nullptr, nullptr, nullptr, SrqTmAttr{4, 8, cq()}).value();
  }
  ibv_ops_wr add_wr(uint64_t wr_id, uint64_t tag, uint64_t mask, int flags = IBV_OPS_SIGNALED,
                    uint32_t unexpected = 0) {
    ibv_ops_wr wr = {};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_TAG_ADD;
    wr.flags = flags;
    wr.tm.unexpected_cnt = unexpected;
    wr.tm.add.recv_wr_id = wr_id + 1000;
    wr.tm.add.sg_list = sge_;
    wr.tm.add.num_sge = 1;
    wr.tm.add.tag = tag;
    wr.tm.add.mask = mask;
    return wr;
  }
  Status post(ibv_ops_wr wr, uint32_t* handle = nullptr) {
    ibv_ops_wr* bad = nullptr;
    Status s = srq_->post_ops(&wr, &bad);
    if (handle != nullptr) *handle = wr.tm.handle;
    return s;
  }
  std::vector<Completion> run() {
    {
      const EngineTurnMark turn;
      srq_->run_ops_st();
    }
    std::vector<Completion> out(16);
    out.resize(static_cast<size_t>(cq()->poll(16, out.data())));
    return out;
  }
  std::optional<TagMatch> match(uint64_t tag) {
    const EngineTurnMark turn;
    return srq_->match_st(tag);
  }
  Srq* srq_ = nullptr;
};

// Operations wait for the engine (here: run()) and complete in order on the SRQ's CQ, only when
// signaled; handles are given out at post time.
TEST_F(TmSrqTest, OperationsRunInOrderOnTheEnginesSideAndCompleteOnTheSrqCq) {
  uint32_t h0 = 99, h1 = 99;
  ASSERT_TRUE(post(add_wr(1, 0x10, 0xFF), &h0).ok());
  ASSERT_TRUE(post(add_wr(2, 0x20, 0xFF, 0), &h1).ok());  // unsignaled
  EXPECT_EQ(h0, 0u);
  EXPECT_EQ(h1, 1u);
  EXPECT_EQ(cq()->size(), 0u);  // nothing ran yet
  ibv_ops_wr del = {};
  del.wr_id = 3;
  del.opcode = IBV_WR_TAG_DEL;
  del.flags = IBV_OPS_SIGNALED;
  del.tm.handle = h0;
  ASSERT_TRUE(post(del).ok());
  std::vector<Completion> c = run();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wc.opcode, IBV_WC_TM_ADD);
  EXPECT_EQ(c[0].wc.wr_id, 1u);
  EXPECT_EQ(c[1].wc.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(c[1].wc.status, IBV_WC_SUCCESS);
  // The deleted tag matches nothing; the other one does.
  EXPECT_FALSE(match(0x10).has_value());
  std::optional<TagMatch> m = match(0x20);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->wr_id, 1002u);
  EXPECT_EQ(m->buffer.length, 64u);
  // Consumed: a DEL now is the race ibv_post_srq_ops(3) reports in the completion.
  del.wr_id = 4;
  del.tm.handle = h1;
  ASSERT_TRUE(post(del).ok());
  c = run();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wc.status, IBV_WC_TM_ERR);
  // max_ops operations wait at most.
  ibv_ops_wr sync = {};
  sync.opcode = IBV_WR_TAG_SYNC;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(post(sync).ok());
  EXPECT_EQ(post(sync).error(), ENOMEM);
  EXPECT_TRUE(run().empty());  // unsignaled and successful
}

// Matching takes the earliest added tag the message's tag fits under its mask; an unexpected
// message makes tags added behind it (an older unexpected_cnt) wait for a sync.
TEST_F(TmSrqTest, MatchingOrderMasksAndPhaseSync) {
  ASSERT_TRUE(post(add_wr(1, 0x100, 0xF00)).ok());
  ASSERT_TRUE(post(add_wr(2, 0x123, ~uint64_t{0})).ok());
  ASSERT_EQ(run().size(), 2u);
  std::optional<TagMatch> m = match(0x123);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->wr_id, 1001u);  // the masked one was added first
  m = match(0x123);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->wr_id, 1002u);
  EXPECT_FALSE(match(0x123).has_value());
  {
    const EngineTurnMark turn;
    EXPECT_FALSE(srq_->count_unexpected_st());
  }
  EXPECT_EQ(srq_->unexpected_count(), 1u);
  ASSERT_TRUE(post(add_wr(3, 0x5, ~uint64_t{0}, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC, 0)).ok());
  std::vector<Completion> c = run();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wc.wc_flags, unsigned{IBV_WC_TM_SYNC_REQ});
  EXPECT_FALSE(match(0x5).has_value());
  ibv_ops_wr sync = {};
  sync.wr_id = 9;
  sync.opcode = IBV_WR_TAG_SYNC;
  sync.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
  sync.tm.unexpected_cnt = 1;
  ASSERT_TRUE(post(sync).ok());
  c = run();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wc.opcode, IBV_WC_TM_SYNC);
  EXPECT_EQ(c[0].wc.wc_flags, 0u);
  EXPECT_TRUE(match(0x5).has_value());
}

// Bad arguments are errnos at post time, naming the failing WR; a basic SRQ has no list.
TEST_F(TmSrqTest, PostValidation) {
  ibv_ops_wr a = add_wr(1, 1, 1);
  ibv_ops_wr b = add_wr(2, 2, 2);
  b.tm.add.num_sge = 2;
  a.next = &b;
  ibv_ops_wr* bad = nullptr;
  EXPECT_EQ(srq_->post_ops(&a, &bad).error(), EINVAL);
  EXPECT_EQ(bad, &b);
  EXPECT_EQ(run().size(), 1u);  // `a` was posted
  ibv_ops_wr del = {};
  del.opcode = IBV_WR_TAG_DEL;
  del.tm.handle = 4;
  EXPECT_EQ(post(del).error(), EINVAL);
  const int unknown_opcode = 3;  // stored as a caller may store it: no such enumerator
  std::memcpy(&del.opcode, &unknown_opcode, sizeof unknown_opcode);
  EXPECT_EQ(post(del).error(), EINVAL);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(post(add_wr(10, 0, 0, 0)).ok());
  EXPECT_EQ(post(add_wr(11, 0, 0, 0)).error(), ENOMEM);  // max_num_tags 4
  Srq* basic = make(4, 1);
  EXPECT_EQ(basic->post_ops(&a, &bad).error(), EOPNOTSUPP);
  EXPECT_EQ(dev_.create_srq(pd(), {4, 1, 0}, nullptr, nullptr, nullptr, SrqTmAttr{4, 0, cq()}).error(), EINVAL);
  EXPECT_EQ(dev_.create_srq(pd(), {4, 1, 0}, nullptr, nullptr, nullptr, SrqTmAttr{4, kTmMaxOps + 1, cq()}).error(),
            EINVAL);
}

// The tag and user data of a tag-matching completion travel in the UD/GSI-only ibv_wc fields:
// ibv_wc_read_tm_info reads them back, a plain ibv_poll_cq reader sees zeros there.
TEST(TmInfo, RidesInTheUdOnlyFieldsAndIsScrubbedForPlainPolls) {
  ibv_wc wc = {};
  wc.opcode = IBV_WC_TM_RECV;
  set_tm_info(wc, {.tag = 0x0123456789ABCDEFull, .priv = 0xFEEDBEEF});
  EXPECT_EQ(tm_info(wc).tag, 0x0123456789ABCDEFull);
  EXPECT_EQ(tm_info(wc).priv, 0xFEEDBEEFu);
  ibv_wc plain = wc;
  scrub_tm_info(plain);
  EXPECT_EQ(plain.src_qp, 0u);
  EXPECT_EQ(plain.slid, 0u);
  EXPECT_EQ(plain.pkey_index, 0u);
  EXPECT_EQ(plain.vendor_err, 0u);
  ibv_wc recv = {};
  recv.opcode = IBV_WC_RECV;
  recv.src_qp = 77;
  EXPECT_EQ(tm_info(recv).tag, 0u);
  scrub_tm_info(recv);
  EXPECT_EQ(recv.src_qp, 77u);  // not a tag-matching completion: untouched
}

}  // namespace
}  // namespace urdma::provider::testing
