// Memory lifetime: ibv_dereg_mr returns only once the engine can no longer touch the region
// (Doorbell::memory_released, the engine's turn epoch). A stream of incoming WRITEs and READs
// targets a heap buffer that the application deregisters and frees mid-stream; under ASan any
// access by the engine thread after the free (the responder's memcpy of a WRITE, the sendmsg
// of a READ response straight from registered memory) is a reported use-after-free.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

// With tx_batch > 1 the engine queues the packets it builds and sends them later in one batch:
// READ responses gathered from the region must neither outlive the dereg nor carry bytes a
// later WRITE of the same turn placed (their ICRC was sealed over the bytes at build time).
class RuntimeMemory : public ::testing::TestWithParam<size_t> {};

TEST_P(RuntimeMemory, DeregAndFreeUnderIncomingWritesAndReads) {
  auto [a, b] = make_hosts({.tx_batch = GetParam()});
  constexpr size_t kTarget = 256 * 1024;
  constexpr size_t kOp = 16 * 1024;
  constexpr size_t kWindow = 16;
  std::vector<uint8_t> src(kOp), back(kWindow * kOp);
  fill_pattern(src, 11);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* mb = a.reg(back.data(), back.size());

  for (int round = 0; round < 6; ++round) {
    provider::Cq* cqa = a.make_cq();
    provider::Cq* cqb = b.make_cq();
    RcPair p = connect_rc(a, cqa, b, cqb);
    auto* target = new uint8_t[kTarget];
    std::memset(target, 0, kTarget);
    provider::Mr* mt = b.reg(target, kTarget);
    const uint64_t remote = reinterpret_cast<uintptr_t>(target);
    const uint32_t rkey = mt->rkey();

    std::atomic<uint64_t> succeeded{0};
    std::atomic<bool> stream_failed{false};
    ibv_wc_status first_error = IBV_WC_SUCCESS;
    std::thread stream([&] {
      size_t posted = 0, done = 0;
      bool error = false;
      const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
      while (!error || done < posted) {
        while (!error && posted - done < kWindow) {
          const bool read = posted % 2 == 1;
          const size_t off = (posted * 7919 * kOp / 3) % (kTarget - kOp);
          ibv_sge sge =
              read ? ibv_sge{reinterpret_cast<uintptr_t>(back.data() + (posted % kWindow) * kOp),
                             kOp, mb->lkey()}
                   : ibv_sge{reinterpret_cast<uintptr_t>(src.data()), kOp, ms->lkey()};
          ibv_send_wr wr = rdma_wr(read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, &sge, remote + off,
                                   rkey, posted);
          ibv_send_wr* bad = nullptr;
          if (!p.qa->post_send(&wr, &bad).ok()) break;  // the QP went to ERR meanwhile
          ++posted;
        }
        ibv_wc wc[16];
        const int n = cqa->poll(16, wc);
        for (int i = 0; i < n; ++i) {
          ++done;
          if (wc[i].status == IBV_WC_SUCCESS) {
            succeeded.fetch_add(1);
          } else if (!error) {
            error = true;
            first_error = wc[i].status;
          }
        }
        if (n == 0) std::this_thread::yield();
        if (std::chrono::steady_clock::now() > deadline) {
          stream_failed.store(true);
          return;
        }
      }
    });
    // Let the stream run, then pull the memory from under it.
    const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
    while (succeeded.load() < 20 + 10 * static_cast<uint64_t>(round) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_TRUE(b.dev().dereg_mr(mt).ok());
    delete[] target;  // from here on, any engine access is a use-after-free (ASan)
    stream.join();
    ASSERT_FALSE(stream_failed.load()) << "round " << round << ": the stream hung";
    // The first failure is the responder's refusal of the stale rkey (IBA 9.7.5.2.8 NAK
    // Remote Access Error → IBV_WC_REM_ACCESS_ERR); everything after it is flushed.
    EXPECT_EQ(first_error, IBV_WC_REM_ACCESS_ERR) << "round " << round;
    // Every READ response left with the bytes its ICRC was sealed over (none dropped by A).
    EXPECT_EQ(a.rt->counters().drop_icrc, 0u) << "round " << round;
    // Destroying the QPs and CQs from this thread while both engine threads run.
    EXPECT_TRUE(a.dev().destroy_qp(p.qa).ok());
    EXPECT_TRUE(b.dev().destroy_qp(p.qb).ok());
    EXPECT_TRUE(a.dev().destroy_cq(cqa).ok());
    EXPECT_TRUE(b.dev().destroy_cq(cqb).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(TxBatch, RuntimeMemory, ::testing::Values(1, 64),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return "TxBatch" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace urdma::runtime::testing
