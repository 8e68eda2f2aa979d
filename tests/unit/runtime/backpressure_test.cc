// Back-pressure: a PacketIo that says kWouldBlock (a full socket buffer: EAGAIN/ENOBUFS) has
// not lost the datagram. The engine keeps it (a copy, in order) and sends it when the I/O takes
// datagrams again — the engine thread waits for EPOLLOUT — so no retransmission is started and
// no retry_cnt is spent because a local buffer was full, and no UD datagram is dropped silently.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

TEST(RuntimeBackpressure, WouldBlockIsQueuedNotLost) {
  // 5 of every 16 send attempts on both sides say kWouldBlock.
  auto [a, b] = make_hosts({.would_block = 5});
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  constexpr size_t kBytes = 2 << 20;
  constexpr size_t kChunk = 128 * 1024;
  std::vector<uint8_t> src(kBytes), dst(kBytes, 0), back(kBytes, 0);
  fill_pattern(src, 21);
  provider::Mr* ms = a.reg(src.data(), kBytes);
  provider::Mr* mback = a.reg(back.data(), kBytes);
  provider::Mr* md = b.reg(dst.data(), kBytes);
  for (size_t i = 0; i < kBytes / kChunk; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + i * kChunk), kChunk, ms->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE, &sge,
                             reinterpret_cast<uintptr_t>(dst.data() + i * kChunk), md->rkey(), i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  for (const ibv_wc& wc : wait_cqes(*a.rt, cqa, kBytes / kChunk, false))
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  for (size_t i = 0; i < kBytes / kChunk; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(back.data() + i * kChunk), kChunk, mback->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_READ, &sge,
                             reinterpret_cast<uintptr_t>(dst.data() + i * kChunk), md->rkey(), i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  for (const ibv_wc& wc : wait_cqes(*a.rt, cqa, kBytes / kChunk, true))
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), kBytes), fnv1a(src.data(), kBytes));
  EXPECT_EQ(fnv1a(back.data(), kBytes), fnv1a(src.data(), kBytes));
  const engine::EngineCounters ca = a.rt->counters();
  const engine::EngineCounters cb = b.rt->counters();
  EXPECT_GT(ca.tx_blocked + cb.tx_blocked, 0u);
  // Not one datagram refused and dropped: every kWouldBlock was kept and sent later. (The
  // retransmission counter is not asserted: the loopback socket itself may drop under load.)
  EXPECT_EQ(ca.send_err + cb.send_err, 0u);
}

// A socket that stays full for longer than the local ACK timeout (268 ms here) costs no retry:
// the timers wait with the packets (Engine::pause_timers). With retry_cnt 0 a single timeout
// would end the WRITE in RETRY_EXC_ERR.
TEST(RuntimeBackpressure, BlockedLongerThanTheAckTimeoutCostsNoRetry) {
  std::vector<uint8_t> src(64 * 1024), dst(64 * 1024);
  fill_pattern(src, 41);
  LinkIo* io_a = nullptr;
  auto [a, b] = make_hosts({.io_a = &io_a});
  provider::Cq* cqa = a.make_cq();
  test::QpParams params;
  params.retry_cnt = 0;
  RcPair p = connect_rc(a, cqa, b, b.make_cq(), params);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  io_a->block_for(std::chrono::milliseconds(800));
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  const std::vector<ibv_wc> wcs = wait_cqes(*a.rt, cqa, 1, false);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(a.rt->counters().completer_retry_err, 0u);
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
}

// UD has no retransmission: a datagram the socket refuses for now must still leave, or it
// would be lost silently. Every one of them arrives.
TEST(RuntimeBackpressure, UdDatagramsAreNotDroppedWhenTheSocketIsFull) {
  constexpr uint32_t kLen = 512;
  constexpr int kBatches = 6;
  constexpr int kBatch = 32;
  std::vector<uint8_t> src(kLen), dst(kBatch * (40 + kLen));
  fill_pattern(src, 31);
  auto [a, b] = make_hosts({.would_block = 5});
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  test::QpParams params;
  params.type = IBV_QPT_UD;
  RcPair p = connect_rc(a, cqa, b, cqb, params);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = test::gid_of(b.addr);
  ah_attr.grh.hop_limit = 64;
  provider::Ah* ah = a.dev().create_ah(a.pd, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();
  for (int batch = 0; batch < kBatches; ++batch) {
    for (int i = 0; i < kBatch; ++i) {
      ASSERT_TRUE(post_one_recv(*p.qb, dst.data() + i * (40 + kLen), 40 + kLen, md->lkey(),
                                static_cast<uint64_t>(i))
                      .ok());
    }
    for (int i = 0; i < kBatch; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), kLen, ms->lkey()};
      ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, static_cast<uint64_t>(i));
      wr.wr.ud.ah = &verbs_ah;
      wr.wr.ud.remote_qpn = p.qb->qp_num();
      wr.wr.ud.remote_qkey = params.qkey;
      ibv_send_wr* bad = nullptr;
      ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    }
    for (const ibv_wc& wc : wait_cqes(*a.rt, cqa, kBatch, false))
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    const std::vector<ibv_wc> got = wait_cqes(*b.rt, cqb, kBatch, false);
    ASSERT_EQ(got.size(), static_cast<size_t>(kBatch)) << "batch " << batch;
    for (const ibv_wc& wc : got) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.byte_len, 40 + kLen);
      EXPECT_EQ(0, std::memcmp(dst.data() + wc.wr_id * (40 + kLen) + 40, src.data(), kLen));
    }
  }
  const engine::EngineCounters ca = a.rt->counters();
  EXPECT_GT(ca.tx_blocked, 0u);
  EXPECT_EQ(ca.send_err, 0u);
}

}  // namespace
}  // namespace urdma::runtime::testing
