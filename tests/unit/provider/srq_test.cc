// SRQ: validation, posting with bad_wr, limit event once per arming, resize, sharing by QPs.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace urdma::provider::testing
