// Two runtimes in one test process, joined by LinkIo (real UDP sockets on loopback), each with
// its engine thread; helpers to make connected RC pairs, register memory and wait for
// completions. Every wait is bounded by a generous timeout that only guards against hangs.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "link_io.h"
#include "runtime/runtime.h"
#include "support/qp_setup.h"
#include "support/checksum.h"

namespace urdma::runtime::testing {

using test_support::fill_pattern;
using test_support::fnv1a;

inline constexpr auto kHangGuard = std::chrono::seconds(30);

struct Host {
  net::Address addr;
  std::unique_ptr<Runtime> rt;
  provider::Pd* pd = nullptr;

  // Before this thread reads memory this host's engine wrote for a peer (the target of the
  // peer's WRITEs): the peer's completion proves the placement (the responder ACKs after it,
  // IBA 9.7.5.1), but that order runs through the network, which TSan does not see. Taking the
  // engine's turn lock (a counters snapshot) orders every write of its finished turns before
  // the caller's reads.
  void settle() { (void)rt->counters(); }

  provider::Device& dev() { return rt->device(); }
  provider::Cq* make_cq(int n = 4096) {
    auto c = dev().create_cq(n);
    EXPECT_TRUE(c.ok());
    return c.ok() ? c.value() : nullptr;
  }
  provider::Mr* reg(void* p, size_t n) {
    auto mr = dev().reg_mr(pd, p, n, reinterpret_cast<uintptr_t>(p),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    EXPECT_TRUE(mr.ok());
    return mr.ok() ? mr.value() : nullptr;
  }
};

struct HostOptions {
  bool engine_thread = true;
  uint64_t busy_poll_ns = 0;
  bool busy_poll_adaptive = false;  // RuntimeConfig's: false, a fixed window of busy_poll_ns
  uint32_t would_block = 0;  // LinkIo::set_would_block on both sides
  LinkIo** io_a = nullptr;   // out: A's LinkIo (owned by A's runtime), to block it later
  size_t tx_batch = 1;       // EngineConfig::tx_batch on both sides
};

inline std::pair<Host, Host> make_hosts(HostOptions o = {}) {
  Host a{net::Address::from_v4(10, 0, 0, 1), nullptr, nullptr};
  Host b{net::Address::from_v4(10, 0, 0, 2), nullptr, nullptr};
  auto [ia, ib] = LinkIo::pair(a.addr, b.addr);
  ia->set_would_block(o.would_block);
  ib->set_would_block(o.would_block);
  if (o.io_a != nullptr) *o.io_a = ia.get();
  auto config = [&](const net::Address& addr) {
    RuntimeConfig c;
    c.device = test::device_config(nullptr, addr, IBV_MTU_4096);
    c.engine.local_address = addr;
    c.engine.tx_batch = o.tx_batch;
    c.engine_thread = o.engine_thread;
    c.busy_poll_ns = o.busy_poll_ns;
    c.busy_poll_adaptive = o.busy_poll_adaptive;
    return c;
  };
  a.rt = std::make_unique<Runtime>(std::move(ia), config(a.addr));
  b.rt = std::make_unique<Runtime>(std::move(ib), config(b.addr));
  a.pd = a.dev().alloc_pd().value();
  b.pd = b.dev().alloc_pd().value();
  return {std::move(a), std::move(b)};
}

struct RcPair {
  provider::Qp* qa = nullptr;
  provider::Qp* qb = nullptr;
};

inline RcPair connect_rc(Host& a, provider::Cq* cqa, Host& b, provider::Cq* cqb,
                         test::QpParams p = {}) {
  auto make = [&](Host& h, provider::Cq* cq) {
    provider::QpInitAttr init;
    init.qp_type = p.type;
    init.pd = h.pd;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    init.cap.max_send_sge = 4;
    init.cap.max_recv_sge = 4;
    auto q = h.dev().create_qp(init);
    EXPECT_TRUE(q.ok());
    return q.value();
  };
  p.mtu = IBV_MTU_4096;
  // Local ACK timeout 4.096 us << 16 = 268 ms: retry_cnt + 1 tries span ~2 s, so an engine
  // thread starved by a loaded 2-core machine (or by TSan) does not end in RETRY_EXC_ERR.
  p.timeout = 16;
  RcPair r{make(a, cqa), make(b, cqb)};
  test::QpParams pb = p;
  std::swap(pb.sq_psn, pb.rq_psn);
  EXPECT_TRUE(test::bring_up(*r.qa, p, b.addr, r.qb->qp_num()).ok());
  EXPECT_TRUE(test::bring_up(*r.qb, pb, a.addr, r.qa->qp_num()).ok());
  return r;
}

// Polls `cq` until `n` completions arrived (or the hang guard), driving the engine inline
// when `drive` (as ibv_poll_cq will), else leaving it to the engine thread.
inline std::vector<ibv_wc> wait_cqes(Runtime& rt, provider::Cq* cq, size_t n, bool drive) {
  std::vector<ibv_wc> got;
  const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
  ibv_wc wc[32];
  while (got.size() < n) {
    const int k = cq->poll(32, wc);
    for (int i = 0; i < k; ++i) got.push_back(wc[i]);
    if (k > 0) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "timed out with " << got.size() << " of " << n << " completions";
      break;
    }
    if (!drive || !rt.try_progress()) std::this_thread::yield();
  }
  return got;
}

// Posts one receive WR of one SGE: `len` bytes at `buf` (registered with `lkey`).
inline provider::Status post_one_recv(provider::Qp& qp, const void* buf, uint32_t len,
                                      uint32_t lkey, uint64_t wr_id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return qp.post_recv(&wr, &bad);
}

inline ibv_send_wr rdma_wr(ibv_wr_opcode op, ibv_sge* sge, uint64_t remote, uint32_t rkey,
                           uint64_t wr_id) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  return wr;
}

// Posts one signaled RDMA WRITE (wr_id 1) of the whole of `src` (registered as `ms`) into `dst`
// (registered as `md` on the peer).
inline provider::Status post_write_all(provider::Qp& qp, std::vector<uint8_t>& src,
                                       const provider::Mr* ms, std::vector<uint8_t>& dst,
                                       const provider::Mr* md) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), static_cast<uint32_t>(src.size()),
              ms->lkey()};
  ibv_send_wr wr =
      rdma_wr(IBV_WR_RDMA_WRITE, &sge, reinterpret_cast<uintptr_t>(dst.data()), md->rkey(), 1);
  ibv_send_wr* bad = nullptr;
  return qp.post_send(&wr, &bad);
}

}  // namespace urdma::runtime::testing
