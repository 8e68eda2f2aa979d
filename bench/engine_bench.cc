// The engine's cost per message and per packet: two engines connected back to back through
// in-memory packet I/O, driven through the provider API as an application drives a device.
//
// What one iteration is: one RC work request (RDMA WRITE, SEND or RDMA READ of `size` bytes)
// posted on host A and completed on A's send CQ, with up to `window` WRs outstanding so the
// requester → responder → completer pipeline stays full. Everything runs on the benchmark
// thread: post, poll engine A until B→A is empty, poll engine B until A→B is empty, poll CQs.
// BM_Memcpy of the same sizes runs in the same binary so the ratio engine/memcpy can be read off
// one run.
//
// The wire: two linked test::MemoryIo (tests/support/memory_io.h), one FIFO of datagrams per
// direction. send() copies the gathered datagram into a frame of the peer's queue (the copy a
// NIC's DMA or a socket's sendmsg makes) and recv_batch() copies it into the engine's receive
// buffer (the copy recvmsg makes). The PacketIo interface forces both: the engine's transmit
// buffer lives only until send() returns, and receive buffers are the engine's own. Frames are
// recycled, so the steady state allocates nothing. No delay, no loss, no reordering.
//
// Proof the path works (every benchmark, after the timed loop): every WR completed successfully,
// the responder accepted exactly the request packets the messages need, nothing was dropped,
// duplicated or retransmitted, and the destination buffer's checksum equals the source's (each
// message carries its sequence number at both ends, so a missing first or last packet shows).
// Any failure is SkipWithError: the benchmark cannot report a rate for a broken path.
#include <benchmark/benchmark.h>
#include <isa-l/crc64.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/engine.h"
#include "net/clock.h"
#include "net/icrc_flow.h"
#include "net/packet_io.h"
#include "provider/device.h"
#include "support/memory_io.h"
#include "support/qp_setup.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace {

using namespace urdma;

constexpr uint32_t kHostA = 0x0a000001;  // 10.0.0.1: the requester
constexpr uint32_t kHostB = 0x0a000002;  // 10.0.0.2: the responder
constexpr uint8_t kHopLimit = 64;
// Local ACK timeout code 14: 4.096 us × 2^14 ≈ 67 ms. Nothing is lost in memory, so a timer that
// fires means the path is broken (checked after the run), not a slow turn of the loop.
constexpr uint8_t kAckTimeoutCode = 14;
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetryInfinite = 7;
constexpr uint8_t kMinRnrTimerCode = 1;  // 0.01 ms (IBA table 45)
constexpr uint8_t kMaxRdAtomic = 16;
// The data a benchmark touches is capped near L3-resident sizes: slots of `size` bytes, at most
// `window` of them and at most this many bytes per buffer.
constexpr size_t kBufferBudgetBytes = size_t{4} << 20;
// Turns of the loop without a single completion before the run is declared stalled.
constexpr uint64_t kStallTurns = 10'000'000;
constexpr int kCqBatch = 32;
constexpr size_t kStampBytes = sizeof(uint64_t);
// Buffers are page-aligned, as registered memory usually is; memcpy between 16-byte-aligned
// std::vector storage runs at half the speed of aligned copies on this machine (38 vs ~90 GiB/s
// at 4 KiB), which would flatter the ratios.
constexpr size_t kPageBytes = 4096;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
class PageBuffer {
 public:
  explicit PageBuffer(size_t n = 0)
      : size_(n),
        p_(static_cast<uint8_t*>(std::aligned_alloc(
            kPageBytes, (std::max<size_t>(n, 1) + kPageBytes - 1) / kPageBytes * kPageBytes))) {
    base::check(p_ != nullptr, "aligned_alloc");
    std::memset(p_.get(), 0, n);
  }
  uint8_t* data() const { return p_.get(); }
  size_t size() const { return size_; }
  std::span<uint8_t> span() const { return {p_.get(), size_}; }

 private:
  size_t size_;
  std::unique_ptr<uint8_t, FreeDeleter> p_;
};

// ---------------------------------------------------------------------------------------------
// Two hosts, one RC connection.

enum class Op { kWrite, kSend, kRead };

struct Host {
  Host(net::Address addr, const net::Clock& clock, bool verify_icrc) : address(addr) {
    provider::DeviceConfig cfg = test::device_config(&relay, addr, IBV_MTU_4096);
    cfg.max_mtu = IBV_MTU_4096;
    device = std::make_unique<provider::Device>(cfg);
    engine::EngineConfig ecfg;
    ecfg.local_address = addr;
    ecfg.verify_icrc = verify_icrc;
    engine = std::make_unique<engine::Engine>(*device, io, clock, ecfg);
  }
  net::Address address;
  engine::DoorbellRelay relay;
  test::MemoryIo io;  // linked to the other host's: two copies per datagram, as a socket
  std::unique_ptr<provider::Device> device;
  std::unique_ptr<engine::Engine> engine;
  provider::Pd* pd = nullptr;
  provider::Cq* send_cq = nullptr;
  provider::Cq* recv_cq = nullptr;
  provider::Qp* qp = nullptr;
  provider::Mr* mr = nullptr;
  PageBuffer buffer;
};

struct Params {
  Op op = Op::kWrite;
  size_t size = 0;
  uint32_t window = 32;
  ibv_mtu mtu = IBV_MTU_4096;
  bool verify_icrc = true;
};

ibv_mtu mtu_code(int64_t bytes) {
  for (const ibv_mtu m : {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096})
    if (engine::mtu_bytes(m) == bytes) return m;
  base::check(false, "path MTU must be 256, 512, 1024, 2048 or 4096 bytes");
  return IBV_MTU_4096;
}

class Bench {
 public:
  explicit Bench(const Params& p)
      : p_(p),
        slots_(std::clamp<size_t>(kBufferBudgetBytes / std::max<size_t>(p.size, 1), 1, p.window)),
        a_(net::Address::from_v4(kHostA), clock_, p.verify_icrc),
        b_(net::Address::from_v4(kHostB), clock_, p.verify_icrc) {
    base::check(p.size >= 2 * kStampBytes, "messages carry a stamp at both ends");
    a_.io.link(b_.io);
    b_.io.link(a_.io);
    setup(a_);
    setup(b_);
    connect(a_, b_);
    connect(b_, a_);
    // The source holds a fixed pattern; each post stamps its slot with the WR's sequence number.
    const std::span<uint8_t> src = source().buffer.span();
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
    if (p_.op == Op::kSend)
      for (uint32_t i = 0; i < rq_depth(); ++i) post_recv();
  }

  const std::string& error() const { return error_; }

  // Posts WR number `posted_` once fewer than `window` are outstanding.
  void post_next() {
    uint64_t idle = 0;
    while (outstanding_ >= p_.window && error_.empty()) {
      if (turn())
        idle = 0;
      else if (++idle > kStallTurns)
        fail("stalled: no completion in " + std::to_string(kStallTurns) + " turns");
    }
    if (!error_.empty()) return;
    post_send();
  }

  // Completes everything outstanding.
  void drain() {
    uint64_t idle = 0;
    while (outstanding_ > 0 && error_.empty()) {
      if (turn())
        idle = 0;
      else if (++idle > kStallTurns)
        fail("stalled while draining");
    }
  }

  uint64_t completed() const { return completed_; }
  uint64_t packets_sent() const {
    return a_.engine->counters().sent_pkts + b_.engine->counters().sent_pkts;
  }

  // After drain(): is every byte where it should be, and did nothing go wrong on the way?
  void verify(uint64_t messages) {
    if (!error_.empty()) return;
    if (completed_ != messages || posted_ != messages)
      return fail("completions " + std::to_string(completed_) + " != posted " +
                  std::to_string(posted_));
    if (p_.op == Op::kSend && received_ != messages)
      return fail("receive completions " + std::to_string(received_) +
                  " != " + std::to_string(messages));
    const uint64_t mtu = engine::mtu_bytes(p_.mtu);
    const uint64_t pkts_per_msg = (p_.size + mtu - 1) / mtu;
    const uint64_t expect_requests = p_.op == Op::kRead ? messages : messages * pkts_per_msg;
    const engine::EngineCounters& ca = a_.engine->counters();
    const engine::EngineCounters& cb = b_.engine->counters();
    if (cb.rdma_recvs != expect_requests)
      return fail("responder accepted " + std::to_string(cb.rdma_recvs) + " requests, expected " +
                  std::to_string(expect_requests));
    for (const engine::EngineCounters* c : {&ca, &cb}) {
      if (c->drops() != 0) return fail("packets dropped: " + std::to_string(c->drops()));
      if (c->completer_retry_err != 0 || c->duplicate_request != 0 || c->out_of_seq_request != 0 ||
          c->send_rnr_err != 0 || c->send_err != 0 || c->duplicate_response != 0)
        return fail("retransmission, duplicate, RNR or send error in a lossless run");
    }
    // Final image: slot s holds the last message sent through it, stamp and all.
    const std::span<const uint8_t> src = source().buffer.span();
    std::vector<uint8_t> expect(src.begin(), src.end());
    for (size_t s = 0; s < slots_ && s < messages; ++s) {
      const uint64_t last = s + ((messages - 1 - s) / slots_) * slots_;
      stamp(expect.data() + s * p_.size, last);
    }
    const PageBuffer& got = target().buffer;
    const size_t used = std::min<uint64_t>(slots_, messages) * p_.size;
    if (crc64_ecma_refl(0, got.data(), used) != crc64_ecma_refl(0, expect.data(), used))
      return fail("destination checksum differs from the source's");
  }

  size_t wire_high_water() const { return std::max(a_.io.high_water(), b_.io.high_water()); }

 private:
  Host& source() { return p_.op == Op::kRead ? b_ : a_; }
  Host& target() { return p_.op == Op::kRead ? a_ : b_; }
  uint32_t rq_depth() const { return p_.window * 2; }

  void fail(const std::string& what) {
    if (error_.empty()) error_ = what;
  }

  void setup(Host& h) {
    h.pd = h.device->alloc_pd().value();
    const int cqe = static_cast<int>(rq_depth() + kCqBatch);
    h.send_cq = h.device->create_cq(cqe).value();
    h.recv_cq = h.device->create_cq(cqe).value();
    provider::QpInitAttr init;
    init.qp_type = IBV_QPT_RC;
    init.pd = h.pd;
    init.send_cq = h.send_cq;
    init.recv_cq = h.recv_cq;
    init.cap.max_send_wr = p_.window;
    init.cap.max_recv_wr = rq_depth();
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    auto qp = h.device->create_qp(init);
    base::check(qp.ok(), "create_qp");
    h.qp = qp.value();
    h.buffer = PageBuffer(slots_ * p_.size);
    // IOVA = the process address, as ibv_reg_mr gives.
    auto mr = h.device->reg_mr(
        h.pd, h.buffer.data(), h.buffer.size(), reinterpret_cast<uint64_t>(h.buffer.data()),
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    base::check(mr.ok(), "reg_mr");
    h.mr = mr.value();
  }

  // RESET → INIT → RTR → RTS (test::bring_up: the masks ibv_modify_qp(3) requires for RC).
  void connect(Host& h, const Host& peer) {
    test::QpParams q;
    q.type = IBV_QPT_RC;
    q.mtu = p_.mtu;
    q.sq_psn = 0;
    q.rq_psn = 0;
    q.timeout = kAckTimeoutCode;
    q.retry_cnt = kRetryCount;
    q.rnr_retry = kRnrRetryInfinite;
    q.min_rnr_timer = kMinRnrTimerCode;
    q.max_rd_atomic = kMaxRdAtomic;
    q.max_dest_rd_atomic = kMaxRdAtomic;
    q.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    q.hop_limit = kHopLimit;
    base::check(test::bring_up(*h.qp, q, peer.address, peer.qp->qp_num()).ok(), "modify_qp");
  }

  void stamp(uint8_t* msg, uint64_t seq) const {
    std::memcpy(msg, &seq, kStampBytes);
    std::memcpy(msg + p_.size - kStampBytes, &seq, kStampBytes);
  }

  uint8_t* slot(Host& h, uint64_t seq) { return h.buffer.data() + (seq % slots_) * p_.size; }

  void post_send() {
    const uint64_t seq = posted_;
    stamp(slot(source(), seq), seq);
    ibv_sge sge;
    ibv_send_wr wr = {};
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    sge.length = static_cast<uint32_t>(p_.size);
    if (p_.op == Op::kRead) {
      sge.addr = reinterpret_cast<uint64_t>(slot(a_, seq));
      sge.lkey = a_.mr->lkey();
      wr.opcode = IBV_WR_RDMA_READ;
      wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(slot(b_, seq));
      wr.wr.rdma.rkey = b_.mr->rkey();
    } else {
      sge.addr = reinterpret_cast<uint64_t>(slot(a_, seq));
      sge.lkey = a_.mr->lkey();
      wr.opcode = p_.op == Op::kSend ? IBV_WR_SEND : IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(slot(b_, seq));
      wr.wr.rdma.rkey = b_.mr->rkey();
    }
    ibv_send_wr* bad = nullptr;
    if (!a_.qp->post_send(&wr, &bad).ok()) return fail("post_send failed");
    ++posted_;
    ++outstanding_;
  }

  // Receive number `recvs_posted_` lands in the slot of the SEND with the same number (RC
  // delivers SENDs to receive WQEs in order).
  void post_recv() {
    const uint64_t seq = recvs_posted_;
    ibv_sge sge;
    sge.addr = reinterpret_cast<uint64_t>(slot(b_, seq));
    sge.length = static_cast<uint32_t>(p_.size);
    sge.lkey = b_.mr->lkey();
    ibv_recv_wr wr = {};
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (!b_.qp->post_recv(&wr, &bad).ok()) return fail("post_recv failed");
    ++recvs_posted_;
  }

  // One turn of the application's loop; true if anything completed.
  bool turn() {
    // Each engine runs until its inbound queue is empty, as an engine thread that keeps up with
    // its socket would. (Alternating one poll each instead lets the requester's 256-packet turns
    // outrun the 32-datagram receive batches, and the queue then holds the whole window.)
    a_.engine->poll();
    while (a_.io.pending() > 0) a_.engine->poll();
    b_.engine->poll();
    while (b_.io.pending() > 0) b_.engine->poll();
    bool progress = false;
    ibv_wc wc[kCqBatch];
    for (int n; (n = a_.send_cq->poll(kCqBatch, wc)) > 0;) {
      progress = true;
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != completed_)
          fail(std::string("send completion ") + std::to_string(wc[i].wr_id) + ": " +
               ibv_wc_status_str(wc[i].status));
        ++completed_;
        --outstanding_;
      }
    }
    if (p_.op == Op::kSend) {
      for (int n; (n = b_.recv_cq->poll(kCqBatch, wc)) > 0;) {
        for (int i = 0; i < n; ++i) {
          if (wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len != p_.size ||
              wc[i].wr_id != received_)
            fail(std::string("receive completion ") + std::to_string(wc[i].wr_id) + ": " +
                 ibv_wc_status_str(wc[i].status));
          ++received_;
          post_recv();
        }
      }
    }
    return progress;
  }

  const Params p_;
  const size_t slots_;
  net::MonotonicClock clock_;
  Host a_;
  Host b_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
  uint64_t outstanding_ = 0;
  uint64_t received_ = 0;
  uint64_t recvs_posted_ = 0;
  std::string error_;
};

void run(benchmark::State& state, Op op, bool verify_icrc = true) {
  Params p;
  p.op = op;
  p.size = static_cast<size_t>(state.range(0));
  p.window = static_cast<uint32_t>(state.range(1));
  p.mtu = mtu_code(state.range(2));
  p.verify_icrc = verify_icrc;
  Bench bench(p);
  const uint64_t pkts_before = bench.packets_sent();
  for (auto _ : state) {
    bench.post_next();
    if (!bench.error().empty()) break;
  }
  // Rates count what happened inside the timed loop: the last `window` WRs complete in drain().
  const uint64_t pkts = bench.packets_sent() - pkts_before;
  const uint64_t done = bench.completed();
  bench.drain();
  bench.verify(state.iterations());
  if (!bench.error().empty()) {
    state.SkipWithError(bench.error().c_str());
    return;
  }
  const auto n = static_cast<int64_t>(done);
  state.SetItemsProcessed(n);
  state.SetBytesProcessed(n * static_cast<int64_t>(p.size));
  const double pkt_count = static_cast<double>(pkts);
  state.counters["pkts"] = benchmark::Counter(pkt_count, benchmark::Counter::kIsRate);
  // Seconds per packet (printed as e.g. "230ns"): CPU time over every packet both engines sent.
  state.counters["per_pkt"] =
      benchmark::Counter(pkt_count, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["pkts_per_msg"] = pkt_count / static_cast<double>(n);
  state.counters["wire_frames"] = static_cast<double>(bench.wire_high_water());
}

void BM_Write(benchmark::State& state) {
  run(state, Op::kWrite);
}
void BM_Send(benchmark::State& state) {
  run(state, Op::kSend);
}
void BM_Read(benchmark::State& state) {
  run(state, Op::kRead);
}
// The same 64 B WRITE with the receive-side ICRC check off (the transmit side always seals):
// the difference is what verifying the ICRC costs per packet.
void BM_WriteNoIcrcCheck(benchmark::State& state) {
  run(state, Op::kWrite, false);
}

void BM_Memcpy(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PageBuffer src(n), dst(n);
  std::memset(src.data(), 0x5a, n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

// The ICRC work the two engines do for one packet: the sender's seal (pseudo-header + CRC pass)
// and the receiver's verify (the same pass, ID 0 + DF matches at once for an urdma peer), on
// packets of exactly the size the engine benchmarks send, so the fraction of `per_pkt` that is
// ICRC can be read off the same run.
void BM_IcrcSealVerify(benchmark::State& state, uint8_t opcode, size_t payload_bytes) {
  const std::optional<wire::PacketLayout> layout = wire::packet_layout(opcode, payload_bytes);
  base::check(layout.has_value(), "packet layout");
  std::vector<uint8_t> packet(layout->total_length());
  wire::write_headers(packet, *layout);
  const net::Endpoint src{net::Address::from_v4(10, 0, 0, 1), engine::roce_src_port(0x11)};
  const net::Endpoint dst{net::Address::from_v4(10, 0, 0, 2), net::kRoceV2UdpPort};
  for (auto _ : state) {
    net::seal_icrc(packet, src, dst);
    const bool ok = net::icrc_ok(packet, src, dst, wire::Ipv4DfSearch::kSetOnly);
    if (!ok) {
      state.SkipWithError("ICRC did not verify");
      break;
    }
    benchmark::DoNotOptimize(ok);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * packet.size()));
}

// Arguments: message bytes, window (WRs outstanding), path MTU bytes.
void engine_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"size", "window", "mtu"});
  b->Args({64, 32, 4096});
  b->Args({4096, 32, 4096});
  b->Args({4096, 32, 1024});
  b->Args({1 << 20, 16, 4096});
}

BENCHMARK(BM_Memcpy)->Arg(64)->Arg(4096)->Arg(1 << 20);
BENCHMARK(BM_Write)->Apply(engine_args);
BENCHMARK(BM_Send)->Apply(engine_args);
BENCHMARK(BM_Read)->Apply(engine_args);
BENCHMARK_CAPTURE(BM_IcrcSealVerify, write_only_64B, wire::op::kRcWriteOnly, 64);
BENCHMARK_CAPTURE(BM_IcrcSealVerify, ack, wire::op::kRcAck, 0);
BENCHMARK_CAPTURE(BM_IcrcSealVerify, write_only_4KiB, wire::op::kRcWriteOnly, 4096);
BENCHMARK(BM_WriteNoIcrcCheck)->ArgNames({"size", "window", "mtu"})->Args({64, 32, 4096});

}  // namespace
