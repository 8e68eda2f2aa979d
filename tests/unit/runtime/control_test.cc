// Control operations from application threads while the engine thread runs: ibv_modify_qp is a
// command the engine executes (it returns without waiting for a turn; the flush of a modify to
// ERR completes afterwards, as on hardware — ibv_modify_qp(3) promises no completions by its
// return), and destroy waits until the engine no longer touches the QP.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

TEST(RuntimeControl, ModifyToErrUnderTrafficCompletesEveryWrOnce) {
  std::vector<uint8_t> src(1 << 20), dst(1 << 20);
  auto [a, b] = make_hosts();
  provider::Cq* cqa = a.make_cq();
  RcPair p = connect_rc(a, cqa, b, b.make_cq());
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  for (int round = 0; round < 8; ++round) {
    constexpr uint64_t kWrs = 64;
    for (uint64_t i = 0; i < kWrs; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 16 * 1024, ms->lkey()};
      ibv_send_wr wr =
          rdma_wr(IBV_WR_RDMA_WRITE, &sge, reinterpret_cast<uintptr_t>(dst.data()) + i * 16 * 1024,
                  md->rkey(), i);
      ibv_send_wr* bad = nullptr;
      ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    }
    // Mid-stream: into ERR from this thread while the engine thread sends.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ASSERT_TRUE(p.qa->modify(attr, IBV_QP_STATE).ok());
    const std::vector<ibv_wc> wcs = wait_cqes(*a.rt, cqa, kWrs, round % 2 == 0);
    ASSERT_EQ(wcs.size(), kWrs);
    // In order, each once: some succeeded, the rest flushed (IBA 10.3.1.6).
    bool flushing = false;
    for (uint64_t i = 0; i < kWrs; ++i) {
      EXPECT_EQ(wcs[i].wr_id, i);
      if (wcs[i].status != IBV_WC_SUCCESS) flushing = true;
      if (flushing) {
        EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
      }
    }
    // Back to work: RESET (waits for the engine) → RTS, then destroy in the last round.
    test::QpParams params;
    params.timeout = 16;
    params.mtu = IBV_MTU_4096;
    attr.qp_state = IBV_QPS_RESET;
    ASSERT_TRUE(p.qa->modify(attr, IBV_QP_STATE).ok());
    attr.qp_state = IBV_QPS_RESET;
    ASSERT_TRUE(p.qb->modify(attr, IBV_QP_STATE).ok());
    params.sq_psn = 0x1000 * (round + 1);
    params.rq_psn = 0x800 * (round + 1);
    test::QpParams pb = params;
    std::swap(pb.sq_psn, pb.rq_psn);
    ASSERT_TRUE(test::bring_up(*p.qb, pb, a.addr, p.qa->qp_num()).ok());
    ASSERT_TRUE(test::bring_up(*p.qa, params, b.addr, p.qb->qp_num()).ok());
  }
  EXPECT_TRUE(a.dev().destroy_qp(p.qa).ok());
  EXPECT_TRUE(b.dev().destroy_qp(p.qb).ok());
}

// A receive WQE wakes the engine thread only on a QP in ERR (engine.h, DoorbellRelay::ring_rq),
// where it must be flushed at once. One thread moves B's QP into ERR while another posts
// receives without pause and nothing else drives the engine: every receive posted, before,
// during or after the modify, completes exactly once — the early ones flushed by the modify's
// flush, the late ones because their post read ERR and woke the sleeping engine thread.
TEST(RuntimeControl, ReceivesPostedAroundAModifyToErrAreEachFlushedOnce) {
  std::vector<uint8_t> dst(64);
  for (int round = 0; round < 10; ++round) {
    auto [a, b] = make_hosts();
    provider::Cq* cqb = b.make_cq(8192);
    RcPair p = connect_rc(a, a.make_cq(), b, cqb);
    provider::Mr* md = b.reg(dst.data(), dst.size());
    constexpr uint64_t kRecvs = 1000;
    std::atomic<bool> go{false};
    std::thread poster([&] {
      while (!go.load()) std::this_thread::yield();
      for (uint64_t i = 0; i < kRecvs; ++i) {
        // A full receive queue (256) waits for the flush to empty it.
        const auto until = std::chrono::steady_clock::now() + kHangGuard;
        provider::Status st;
        while (!(st = post_one_recv(*p.qb, dst.data(), 64, md->lkey(), i)).ok() &&
               st.error() == ENOMEM && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
        ASSERT_TRUE(st.ok()) << st.error() << " at receive " << i;
      }
    });
    go.store(true);
    std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ASSERT_TRUE(p.qb->modify(attr, IBV_QP_STATE).ok());
    poster.join();
    const std::vector<ibv_wc> wcs = wait_cqes(*b.rt, cqb, kRecvs, /*drive=*/false);
    ASSERT_EQ(wcs.size(), kRecvs) << "round " << round;
    for (uint64_t i = 0; i < kRecvs; ++i) {
      EXPECT_EQ(wcs[i].wr_id, i);
      EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR);
    }
  }
}

}  // namespace
}  // namespace urdma::runtime::testing
