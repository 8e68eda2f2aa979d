// Memory windows: type 1 (ibv_bind_mw) and type 2B (BIND_MW WR, LOCAL_INV, SEND_WITH_INV),
// the bind rules of IBA 10.6.7.2 and the invalidation rules. Binds are posted through the QP
// and executed the way the engine does: take the BIND_MW WQE from the send queue and run
// MrTable::bind_mw_st for that QP.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <unordered_set>
#include <vector>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

constexpr int kLw = IBV_ACCESS_LOCAL_WRITE;
constexpr int kRw = IBV_ACCESS_REMOTE_WRITE;
constexpr int kRr = IBV_ACCESS_REMOTE_READ;
constexpr int kBind = IBV_ACCESS_MW_BIND;

class MwTest : public ProviderTest {
 protected:
  void SetUp() override {
    qp_ = make_qp(IBV_QPT_RC);
    drive(qp_, IBV_QPS_RTS);
    mr_ = dev_.reg_mr(pd(), buf_.data(), buf_.size(), base_, kLw | kRr | kRw | kBind).value();
    ibv_mr_.handle = mr_->handle();
  }
  MrTable& table() { return dev_.mr_table(); }

  // Executes the oldest send WQE (a bind) as the engine would.
  Status execute_bind(Qp* qp) {
    const SendWqe* wqe = qp->sq_peek_st(0);
    EXPECT_NE(wqe, nullptr);
    EXPECT_EQ(wqe->opcode, IBV_WR_BIND_MW);
    const Status s = table().bind_mw_st(qp->pd(), qp->qp_num(), wqe->bind);
    qp->sq_pop_st();
    return s;
  }

  Status bind1(Mw* mw, uint64_t addr, uint64_t length, int access, ibv_mr* mr, uint32_t* rkey) {
    ibv_mw_bind bind = {};
    bind.wr_id = 7;
    bind.send_flags = IBV_SEND_SIGNALED;
    bind.bind_info = {
        .mr = mr, .addr = addr, .length = length, .mw_access_flags = static_cast<unsigned>(access)};
    Status s = qp_->bind_mw(mw, bind, rkey);
    if (!s.ok()) return s;
    return execute_bind(qp_);
  }

  Status bind2(Qp* qp, Mw* mw, uint32_t rkey, uint64_t addr, uint64_t length, int access) {
    ibv_mw handle = {};
    handle.handle = mw->handle();
    ibv_send_wr wr = {};
    wr.wr_id = 9;
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = &handle;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info = {.mr = &ibv_mr_,
                            .addr = addr,
                            .length = length,
                            .mw_access_flags = static_cast<unsigned>(access)};
    ibv_send_wr* bad = nullptr;
    Status s = qp->post_send(&wr, &bad);
    if (!s.ok()) return s;
    return execute_bind(qp);
  }

  std::vector<uint8_t> buf_ = std::vector<uint8_t>(4096);
  const uint64_t base_ = 0x700000;
  Qp* qp_ = nullptr;
  Mr* mr_ = nullptr;
  ibv_mr ibv_mr_ = {};
};

TEST_F(MwTest, AllocTypes) {
  EXPECT_TRUE(dev_.alloc_mw(pd(), IBV_MW_TYPE_1).ok());
  EXPECT_TRUE(dev_.alloc_mw(pd(), IBV_MW_TYPE_2).ok());
  EXPECT_EQ(dev_.alloc_mw(pd(), ibv_mw_type(3)).error(), EINVAL);
  EXPECT_EQ(dev_.alloc_mw(nullptr, IBV_MW_TYPE_1).error(), EINVAL);
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  EXPECT_FALSE(mw->bound());
  // An unbound window grants nothing.
  EXPECT_EQ(table().lookup_remote(mw->rkey(), pd(), 0, kRr, base_, 1).error,
            MemError::kInvalidated);
}

TEST_F(MwTest, Type1BindGivesANewKeyAndASubRange) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  const uint32_t old_key = mw->rkey();
  uint32_t rkey = 0;
  ASSERT_EQ(bind1(mw, base_ + 100, 200, kRr, &ibv_mr_, &rkey), kOk);
  EXPECT_NE(rkey, old_key);
  EXPECT_EQ(rkey >> 8, old_key >> 8) << "same window, new key byte";
  EXPECT_EQ(mw->rkey(), rkey);
  const MemRef ref = table().lookup_remote(rkey, pd(), qp_->qp_num(), kRr, base_ + 100, 200);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref.addr, buf_.data() + 100);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), 0, kRr, base_ + 99, 2).error, MemError::kOutOfBounds);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), 0, kRr, base_ + 299, 2).error,
            MemError::kOutOfBounds);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), 0, kRw, base_ + 100, 8).error,
            MemError::kAccessDenied);
  EXPECT_EQ(table().lookup_remote(old_key, pd(), 0, kRr, base_ + 100, 8).error, MemError::kBadKey);
  // A window key is not an lkey.
  EXPECT_EQ(table().lookup_local(rkey, pd(), 0, base_ + 100, 8).error, MemError::kBadKey);
  // The MR cannot go while the window is bound; a zero-length type 1 bind unbinds.
  EXPECT_EQ(dev_.dereg_mr(mr_).error(), EINVAL);
  EXPECT_EQ(mr_->bound_mw_count(), 1u);
  ASSERT_EQ(bind1(mw, 0, 0, 0, nullptr, &rkey), kOk);
  EXPECT_FALSE(mw->bound());
  EXPECT_EQ(dev_.dereg_mr(mr_), kOk);
}

TEST_F(MwTest, Type1BindRules) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  uint32_t rkey = 0;
  // Zero-based type 1 windows do not exist.
  EXPECT_EQ(bind1(mw, base_, 8, kRr | IBV_ACCESS_ZERO_BASED, &ibv_mr_, &rkey).error(), EINVAL);
  // Range outside the MR (C10-76).
  EXPECT_EQ(bind1(mw, base_ + 4000, 200, kRr, &ibv_mr_, &rkey).error(), EINVAL);
  // No MR but an address (ibv_bind_mw(3)).
  EXPECT_EQ(bind1(mw, base_, 8, kRr, nullptr, &rkey).error(), EINVAL);
  // MR without MW_BIND (C10-73).
  Mr* plain = dev_.reg_mr(pd(), buf_.data(), 64, base_, kLw | kRr).value();
  ibv_mr plain_handle = {};
  plain_handle.handle = plain->handle();
  EXPECT_EQ(bind1(mw, base_, 8, kRr, &plain_handle, &rkey).error(), EACCES);
  // Remote write through the window needs LOCAL_WRITE on the MR (C10-75).
  Mr* ro = dev_.reg_mr(pd(), buf_.data(), 64, base_, kRr | kBind).value();
  ibv_mr ro_handle = {};
  ro_handle.handle = ro->handle();
  EXPECT_EQ(bind1(mw, base_, 8, kRw, &ro_handle, &rkey).error(), EACCES);
  EXPECT_EQ(bind1(mw, base_, 8, kRr, &ro_handle, &rkey), kOk);
  // MR of another PD: EPERM at ibv_bind_mw time (verbs.h's inline check).
  Pd* other = dev_.alloc_pd().value();
  Mr* foreign = dev_.reg_mr(other, buf_.data(), 64, base_, kLw | kBind).value();
  ibv_mr foreign_handle = {};
  foreign_handle.handle = foreign->handle();
  EXPECT_EQ(bind1(mw, base_, 8, kRr, &foreign_handle, &rkey).error(), EPERM);
  // A type 2 window cannot be bound with ibv_bind_mw, nor a type 1 by a BIND_MW WR.
  Mw* mw2 = dev_.alloc_mw(pd(), IBV_MW_TYPE_2).value();
  EXPECT_EQ(bind1(mw2, base_, 8, kRr, &ibv_mr_, &rkey).error(), EINVAL);
  EXPECT_EQ(bind2(qp_, mw, mw->rkey() + 1, base_, 8, kRr).error(), EINVAL);
  // Not before RTS.
  Qp* idle = make_qp(IBV_QPT_RC);
  ibv_mw_bind bind = {};
  bind.bind_info = {.mr = &ibv_mr_, .addr = base_, .length = 8, .mw_access_flags = kRr};
  EXPECT_EQ(idle->bind_mw(mw, bind, &rkey).error(), EINVAL);
  // A type 1 window cannot be invalidated by a WR.
  ASSERT_EQ(bind1(mw, base_, 8, kRr, &ibv_mr_, &rkey), kOk);
  EXPECT_EQ(table().invalidate_st(rkey, pd(), qp_->qp_num(), false).error(), EINVAL);
  EXPECT_TRUE(mw->bound());
}

// rdma-core's tests/test_mr.py binds with REMOTE_WRITE | LOCAL_WRITE (rxe and mlx5 take it):
// LOCAL_WRITE is accepted and grants nothing, a window having no lkey. Other bits stay EINVAL.
TEST_F(MwTest, BindAcceptsLocalWriteAndGrantsOnlyRemoteRights) {
  Mw* mw1 = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  uint32_t rkey = 0;
  ASSERT_EQ(bind1(mw1, base_, 64, kRw | kLw, &ibv_mr_, &rkey), kOk);
  EXPECT_TRUE(table().lookup_remote(rkey, pd(), qp_->qp_num(), kRw, base_, 64).ok());
  EXPECT_EQ(mw1->access(), kRw);
  EXPECT_EQ(table().lookup_local(rkey, pd(), kLw, base_, 8).error, MemError::kBadKey);
  EXPECT_EQ(bind1(mw1, base_, 64, kRw | kBind, &ibv_mr_, &rkey).error(), EINVAL);

  Mw* mw2 = dev_.alloc_mw(pd(), IBV_MW_TYPE_2).value();
  const uint32_t rkey2 = ibv_inc_rkey(mw2->rkey());
  ASSERT_EQ(bind2(qp_, mw2, rkey2, base_, 64, kRw | kLw), kOk);
  EXPECT_TRUE(table().lookup_remote(rkey2, pd(), qp_->qp_num(), kRw, base_, 64).ok());
}

// rxe_bind_mw: a type 1 bind of length 0 unbinds the window even when it names an MR (the
// test's invalidation, MWBindInfo(mr, buf, 0, 0)); the MR is no longer held by it.
TEST_F(MwTest, Type1ZeroLengthBindWithAnMrUnbinds) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  uint32_t rkey = 0;
  ASSERT_EQ(bind1(mw, base_, 64, kRw, &ibv_mr_, &rkey), kOk);
  EXPECT_EQ(mr_->bound_mw_count(), 1u);
  uint32_t rkey2 = 0;
  ASSERT_EQ(bind1(mw, base_, 0, 0, &ibv_mr_, &rkey2), kOk);
  EXPECT_FALSE(mw->bound());
  EXPECT_EQ(mr_->bound_mw_count(), 0u);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), 0, kRw, base_, 8).error, MemError::kBadKey);
  EXPECT_EQ(table().lookup_remote(rkey2, pd(), 0, kRw, base_, 8).error, MemError::kInvalidated);
  EXPECT_EQ(dev_.dereg_mr(mr_), kOk);
}

TEST_F(MwTest, Type2BindIsTiedToItsQp) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_2).value();
  const uint32_t rkey = ibv_inc_rkey(mw->rkey());
  ASSERT_EQ(bind2(qp_, mw, rkey, base_, 64, kRr | kRw), kOk);
  EXPECT_EQ(mw->rkey(), rkey);
  EXPECT_TRUE(table().lookup_remote(rkey, pd(), qp_->qp_num(), kRw, base_, 64).ok());
  // IBA 10.6.7.2.2: only through the QP it is bound to.
  Qp* other = make_qp(IBV_QPT_RC);
  drive(other, IBV_QPS_RTS);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), other->qp_num(), kRr, base_, 8).error,
            MemError::kWrongQp);
  // o10-37.2.30: a bound type 2 window must be invalidated before it is bound again.
  EXPECT_EQ(bind2(qp_, mw, ibv_inc_rkey(rkey), base_, 8, kRr).error(), EINVAL);
  // A remote invalidate must arrive on the window's QP and name the exact key.
  EXPECT_EQ(table().invalidate_st(rkey, pd(), other->qp_num(), true).error(), EINVAL);
  EXPECT_EQ(table().invalidate_st(rkey ^ 1, pd(), qp_->qp_num(), true).error(), EINVAL);
  Pd* other_pd = dev_.alloc_pd().value();
  EXPECT_EQ(table().invalidate_st(rkey, other_pd, qp_->qp_num(), true).error(), EINVAL);
  ASSERT_EQ(table().invalidate_st(rkey, pd(), qp_->qp_num(), true), kOk);
  EXPECT_EQ(table().lookup_remote(rkey, pd(), qp_->qp_num(), kRr, base_, 8).error,
            MemError::kInvalidated);
  EXPECT_EQ(table().invalidate_st(rkey, pd(), qp_->qp_num(), false).error(), EINVAL);
  EXPECT_EQ(mr_->bound_mw_count(), 0u);
  // Free again: bind through the other QP, then LOCAL_INV from any QP of the PD.
  const uint32_t rkey2 = ibv_inc_rkey(rkey);
  ASSERT_EQ(bind2(other, mw, rkey2, base_ + 8, 8, kRr), kOk);
  EXPECT_EQ(table().invalidate_st(rkey2, pd(), qp_->qp_num(), false), kOk);
}

TEST_F(MwTest, Type2RulesAndZeroBased) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_2).value();
  // o10-37.2.40: type 2 needs a length.
  EXPECT_EQ(bind2(qp_, mw, mw->rkey(), base_, 0, kRr).error(), EINVAL);
  // Zero based type 2: the peer addresses offsets from the window start.
  ASSERT_EQ(bind2(qp_, mw, mw->rkey(), base_ + 256, 128, kRr | IBV_ACCESS_ZERO_BASED), kOk);
  const MemRef ref = table().lookup_remote(mw->rkey(), pd(), qp_->qp_num(), kRr, 0, 128);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref.addr, buf_.data() + 256);
  EXPECT_FALSE(table().lookup_remote(mw->rkey(), pd(), qp_->qp_num(), kRr, 1, 128).ok());
  // Deallocating a bound window releases the MR.
  EXPECT_EQ(dev_.dereg_mr(mr_).error(), EINVAL);
  EXPECT_EQ(dev_.dealloc_mw(mw), kOk);
  EXPECT_EQ(dev_.dereg_mr(mr_), kOk);
}

TEST_F(MwTest, DestroyingTheQpInvalidatesItsType2Windows) {
  Qp* qp = make_qp(IBV_QPT_RC);
  drive(qp, IBV_QPS_RTS);
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_2).value();
  ASSERT_EQ(bind2(qp, mw, mw->rkey(), base_, 64, kRr), kOk);
  EXPECT_EQ(dev_.dereg_mr(mr_).error(), EINVAL);
  ASSERT_EQ(dev_.destroy_qp(qp), kOk);
  EXPECT_FALSE(mw->bound());
  EXPECT_EQ(dev_.dereg_mr(mr_), kOk);
}

TEST_F(MwTest, MrKeysAreNotInvalidatedByWr) {
  EXPECT_EQ(table().invalidate_st(mr_->rkey(), pd(), qp_->qp_num(), false).error(), EINVAL);
  EXPECT_TRUE(table().lookup_remote(mr_->rkey(), pd(), 0, kRr, base_, 8).ok());
}

TEST_F(MwTest, BindWqeCarriesWhatTheEngineNeeds) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  ibv_mw_bind bind = {};
  bind.wr_id = 0x77;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = {.mr = &ibv_mr_, .addr = base_ + 8, .length = 16, .mw_access_flags = kRr};
  uint32_t rkey = 0;
  ASSERT_EQ(qp_->bind_mw(mw, bind, &rkey), kOk);
  const SendWqe* wqe = qp_->sq_peek_st(0);
  ASSERT_NE(wqe, nullptr);
  EXPECT_EQ(wqe->wr_id, 0x77u);
  EXPECT_EQ(wqe->send_flags, unsigned{IBV_SEND_SIGNALED});
  EXPECT_EQ(wqe->bind.mw_handle, mw->handle());
  EXPECT_EQ(wqe->bind.mr_handle, mr_->handle());
  EXPECT_EQ(wqe->bind.new_rkey, rkey);
  EXPECT_EQ(wqe->bind.addr, base_ + 8);
  EXPECT_EQ(wqe->bind.length, 16u);
  EXPECT_EQ(send_opcode_info(wqe->opcode)->wc_opcode, IBV_WC_BIND_MW);
  // Until the engine executes it the window keeps its old key.
  EXPECT_NE(mw->rkey(), rkey);
}

// 10,000 windows live beside the MR: every tag (the window's identity, IBA 10.6.7) is non-zero
// and unlike the MR's and every other window's, the tags spread over the whole 24-bit space
// (expect_uniform_tags), every window's key is found (unbound: kInvalidated, not kBadKey), and
// each is refused as kBadKey once its window is deallocated.
TEST_F(MwTest, ManyLiveWindowsHaveDistinctUniformTags) {
  std::vector<Mw*> mws;
  std::vector<uint32_t> keys;
  std::unordered_set<uint32_t> tags = {mr_->rkey() >> 8};
  for (int i = 0; i < 10'000; ++i) {
    Mw* mw = dev_.alloc_mw(pd(), i % 2 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2).value();
    const uint32_t tag = mw->rkey() >> 8;
    EXPECT_NE(tag, 0u);
    EXPECT_TRUE(tags.insert(tag).second) << "tag " << std::hex << tag << " is live twice";
    mws.push_back(mw);
    keys.push_back(mw->rkey());
  }
  expect_uniform_tags(keys);
  for (Mw* mw : mws) {
    EXPECT_EQ(table().lookup_remote(mw->rkey(), pd(), 0, kRr, base_, 8).error,
              MemError::kInvalidated);
  }
  for (Mw* mw : mws) {
    const uint32_t key = mw->rkey();
    ASSERT_EQ(dev_.dealloc_mw(mw), kOk);
    EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, base_, 8).error, MemError::kBadKey);
  }
  EXPECT_TRUE(table().lookup_remote(mr_->rkey(), pd(), 0, kRr, base_, 8).ok());
}

// 10,000 window allocations with deallocations between them (up to 300 live), each bound once
// with ibv_bind_mw: the bind keeps the tag and changes only the key byte (ibv_inc_rkey(3),
// o10-37); a new tag is never a live window's or the MR's; the old key byte and a deallocated
// window's key are refused as kBadKey at once; over the run the tags spread like uniform draws.
TEST_F(MwTest, ChurnKeepsWindowTagsDistinctAndUniform) {
  std::mt19937 pick(2);
  std::vector<Mw*> live;
  std::unordered_set<uint32_t> live_tags = {mr_->rkey() >> 8};
  std::vector<uint32_t> keys;
  for (int i = 0; i < 10'000; ++i) {
    while (live.size() >= 300 || (!live.empty() && pick() % 2 == 0)) {
      const size_t j = pick() % live.size();
      const uint32_t key = live[j]->rkey();
      ASSERT_EQ(dev_.dealloc_mw(live[j]), kOk);
      live_tags.erase(key >> 8);
      live[j] = live.back();
      live.pop_back();
      EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, base_, 8).error, MemError::kBadKey);
    }
    Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
    const uint32_t key = mw->rkey();
    EXPECT_NE(key >> 8, 0u);
    EXPECT_TRUE(live_tags.insert(key >> 8).second) << "tag " << std::hex << (key >> 8);
    keys.push_back(key);
    uint32_t rkey = 0;
    ASSERT_EQ(bind1(mw, base_, 64, kRr, &ibv_mr_, &rkey), kOk);
    EXPECT_EQ(rkey >> 8, key >> 8) << "a bind keeps the window's tag";
    EXPECT_NE(rkey & 0xFF, key & 0xFF) << "and draws another key byte";
    EXPECT_EQ(table().lookup_remote(key, pd(), 0, kRr, base_, 8).error, MemError::kBadKey);
    EXPECT_TRUE(table().lookup_remote(rkey, pd(), 0, kRr, base_, 8).ok());
    live.push_back(mw);
  }
  expect_uniform_tags(keys);
  for (Mw* mw : live) ASSERT_EQ(dev_.dealloc_mw(mw), kOk);
  EXPECT_EQ(mr_->bound_mw_count(), 0u);
}

// next_mw_rkey draws the key byte uniformly from the 255 bytes other than the current one: in
// 10,000 draws every other byte occurs (each is missed with probability (254/255)^10000 <
// e^-39) and the current one never does.
TEST_F(MwTest, NextRkeyIsAnyKeyByteButTheCurrentOne) {
  Mw* mw = dev_.alloc_mw(pd(), IBV_MW_TYPE_1).value();
  std::array<int, 256> seen{};
  for (int i = 0; i < 10'000; ++i) {
    const uint32_t next = table().next_mw_rkey(mw);
    ASSERT_EQ(next >> 8, mw->rkey() >> 8);
    ++seen[next & 0xFF];
  }
  for (int b = 0; b < 256; ++b) {
    if (b == static_cast<int>(mw->rkey() & 0xFF)) {
      EXPECT_EQ(seen[b], 0);
    } else {
      EXPECT_GT(seen[b], 0) << "key byte " << b << " never drawn";
    }
  }
}

}  // namespace
}  // namespace urdma::provider::testing
