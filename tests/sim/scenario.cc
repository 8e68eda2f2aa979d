// The scenario generator; see scenario.h.
#include "sim/scenario.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "base/check.h"
#include "net/prng.h"

namespace urdma::sim {
namespace {

using net::Xoshiro256;

//                      name              wr                            wc
//                      rc     uc     ud     recv   remote atomic local
constexpr std::array<OpInfo, kOpCount> kOps = {{
    {"send", IBV_WR_SEND, IBV_WC_SEND, true, true, true, true, false, false, false},
    {"send_imm", IBV_WR_SEND_WITH_IMM, IBV_WC_SEND, true, true, true, true, false, false, false},
    {"send_inv", IBV_WR_SEND_WITH_INV, IBV_WC_SEND, true, false, false, true, false, false, false},
    {"write", IBV_WR_RDMA_WRITE, IBV_WC_RDMA_WRITE, true, true, false, false, true, false, false},
    {"write_imm", IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WC_RDMA_WRITE, true, true, false, true, true,
     false, false},
    {"read", IBV_WR_RDMA_READ, IBV_WC_RDMA_READ, true, false, false, false, true, false, false},
    {"cmp_swp", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP, true, false, false, false, true, true,
     false},
    {"fetch_add", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD, true, false, false, false, true,
     true, false},
    {"local_inv", IBV_WR_LOCAL_INV, IBV_WC_LOCAL_INV, true, true, false, false, false, false, true},
    {"bind_mw", IBV_WR_BIND_MW, IBV_WC_BIND_MW, true, true, false, false, false, false, true},
}};

// Regions per host.
constexpr uint32_t kSourceRegionsPerHost = 2;
constexpr uint32_t kTargetRegionsPerHost = 2;
// Spacing of IOVAs: each region gets its own 1 TiB slot, so IOVAs never overlap and never
// equal host addresses.
constexpr uint64_t kIovaBase = uint64_t{0x5a} << 40;
constexpr uint64_t kIovaStride = uint64_t{1} << 40;
// Largest gap left between two consecutive allocations in a target region.
constexpr uint64_t kMaxGapBytes = 48;
// Sizes beyond this are "large" and drawn rarely.
constexpr uint64_t kCommonSizeMax = 16 * 1024;
// Receive buffers of an SRQ must hold any message of any QP using it: SENDs on SRQ QPs are
// capped at this size so the SRQ's buffers stay small.
constexpr uint64_t kSrqMessageMax = 8 * 1024;
constexpr uint32_t kMtuBytes[] = {0, 256, 512, 1024, 2048, 4096};  // indexed by ibv_mtu

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15;

uint64_t region_seed(uint64_t seed, uint32_t region) {
  return (seed ^ 0x5eed'0000'0000'0000) * kGolden + region * 0xbf58476d1ce4e5b9 + 1;
}

class Generator {
 public:
  Generator(const ScenarioConfig& config, uint64_t seed) : rng_(seed) {
    s_.seed = seed;
    s_.config = config;
  }

  Scenario run() {
    const ScenarioConfig& c = s_.config;
    base::check(c.hosts >= 2 && c.hosts <= 16, "hosts must be in [2, 16]");
    base::check(c.wrs_min <= c.wrs_max, "wrs_min > wrs_max");
    make_regions();
    make_qps();
    make_sends();
    make_recvs();
    finish_regions();
    return std::move(s_);
  }

 private:
  bool enabled(Op op) const { return s_.config.ops[static_cast<size_t>(op)]; }
  bool chance(uint32_t percent) { return rng_.below(100) < percent; }
  uint64_t pick(uint64_t lo, uint64_t hi) { return rng_.between(lo, hi); }

  uint32_t add_region(uint32_t host, RegionSpec::Kind kind, uint64_t size, int access) {
    const auto index = static_cast<uint32_t>(s_.regions.size());
    // A random page offset inside the region's IOVA slot: IOVAs are not page aligned.
    // (8-aligned for the atomic region: IBA 9.4.5 atomics need 8-byte aligned addresses.)
    uint64_t iova = kIovaBase + index * kIovaStride + pick(0, 4095);
    if (kind == RegionSpec::Kind::kAtomic) iova &= ~uint64_t{7};
    s_.regions.push_back(RegionSpec{host, kind, size, iova, access});
    bump_.push_back(0);
    return index;
  }

  void make_regions() {
    const ScenarioConfig& c = s_.config;
    source_size_ = std::max<uint64_t>(c.max_size_bytes, 64 * 1024) + 4096;
    for (uint32_t h = 0; h < c.hosts; ++h) {
      std::vector<uint32_t> src, dst;
      for (uint32_t i = 0; i < kSourceRegionsPerHost; ++i)
        src.push_back(
            add_region(h, RegionSpec::Kind::kSource, source_size_, IBV_ACCESS_REMOTE_READ));
      for (uint32_t i = 0; i < kTargetRegionsPerHost; ++i)
        dst.push_back(add_region(h, RegionSpec::Kind::kTarget, 0,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
      s_.atomic_region.push_back(add_region(h, RegionSpec::Kind::kAtomic, kAtomicRegionBytes,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
      window_region_.push_back(
          add_region(h, RegionSpec::Kind::kWindow, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND));
      sources_.push_back(src);
      targets_.push_back(dst);
      // The generator's serial model of every CMP_SWP counter (for plausible compare values).
      const std::vector<uint8_t> img = s_.initial_image(s_.atomic_region.back());
      for (uint32_t i = 0; i < kCountersPerKind; ++i) {
        uint64_t v;
        std::memcpy(&v, img.data() + kGuardBytes + counter_offset(kCountersPerKind + i), 8);
        cas_model_.push_back(v);
      }
    }
  }

  // A fresh range of `len` bytes in one of the host's target regions (or its window region).
  Sge alloc(uint32_t host, uint64_t len, bool window = false, uint64_t align = 1) {
    const uint32_t region =
        window ? window_region_[host] : targets_[host][rng_.below(targets_[host].size())];
    uint64_t off = bump_[region] + pick(0, kMaxGapBytes);
    off = (off + align - 1) / align * align;
    bump_[region] = off + len;
    used_ += len;
    return Sge{region, off, static_cast<uint32_t>(len)};
  }

  // Message sizes: zero, tiny, around MTU multiples, common, and (rarely) large — within the
  // configured maximum and the seed's memory budget.
  uint64_t draw_size(uint64_t mtu, uint64_t cap) {
    const ScenarioConfig& c = s_.config;
    cap = std::min(cap, c.max_size_bytes);
    const uint64_t left = c.memory_budget_bytes > used_ ? c.memory_budget_bytes - used_ : 0;
    cap = std::min(cap, left / 2);
    uint64_t n;
    const uint64_t r = rng_.below(100);
    if (r < 12) {
      n = 0;
    } else if (r < 35) {
      n = pick(1, 64);
    } else if (r < 65) {
      const uint64_t k = pick(1, 4);
      n = k * mtu + pick(0, 2) - 1;  // k*MTU - 1, k*MTU, k*MTU + 1
    } else if (r < 95) {
      n = pick(1, kCommonSizeMax);
    } else {
      n = pick(1, std::max<uint64_t>(cap, 1));
    }
    return std::min(n, cap);
  }

  // Splits `len` bytes over 1..kMaxSge SGEs (some possibly empty); `place` gives each piece
  // its memory.
  template <class Place>
  std::vector<Sge> split(uint64_t len, Place place) {
    std::vector<Sge> out;
    if (len == 0 && chance(50)) return out;  // a zero-length WR with no SGE at all
    const auto n = static_cast<uint32_t>(pick(1, std::min<uint64_t>(kMaxSge, len + 1)));
    std::vector<uint64_t> cuts;
    for (uint32_t i = 0; i + 1 < n; ++i) cuts.push_back(pick(0, len));
    std::sort(cuts.begin(), cuts.end());
    uint64_t prev = 0;
    cuts.push_back(len);
    for (uint64_t cut : cuts) {
      out.push_back(place(cut - prev));
      prev = cut;
    }
    return out;
  }

  Sge source_piece(uint32_t host, uint64_t len) {
    const uint32_t region = sources_[host][rng_.below(sources_[host].size())];
    return Sge{region, pick(0, source_size_ - len), static_cast<uint32_t>(len)};
  }

  void add_pair(ibv_qp_type type, uint32_t a, uint32_t b) {
    const auto qa = static_cast<uint32_t>(s_.qps.size());
    QpSpec x;
    x.type = type;
    const auto mtu = static_cast<ibv_mtu>(pick(IBV_MTU_256, IBV_MTU_4096));
    x.mtu = mtu;
    QpSpec y = x;
    x.host = a;
    y.host = b;
    x.peer = qa + 1;
    y.peer = qa;
    for (QpSpec* q : {&x, &y}) {
      const ScenarioConfig& c = s_.config;
      q->timeout = static_cast<uint8_t>(pick(c.timeout_min, c.timeout_max));
      q->retry_cnt = static_cast<uint8_t>(pick(c.retry_cnt_min, c.retry_cnt_max));
      // 7 is infinite: late receives fail no clean run. A finite range fails some legitimately
      // (the checker then wants the RNR NAKs in the trace).
      q->rnr_retry = static_cast<uint8_t>(pick(c.rnr_retry_min, c.rnr_retry_max));
      q->min_rnr_timer = static_cast<uint8_t>(pick(1, 6));  // 0.01 .. 0.08 ms
      q->max_rd_atomic = static_cast<uint8_t>(pick(1, 8));
      q->sq_sig_all = chance(10);
      q->use_srq = type == IBV_QPT_RC && s_.host_has_srq[q->host] && chance(50);
      // A quarter of the PSNs start just below the 24-bit wrap.
      q->sq_psn = chance(25) ? static_cast<uint32_t>(0xffffff - pick(0, 40))
                             : static_cast<uint32_t>(rng_.below(1u << 24));
    }
    // The responder accepts at least what the requester may have outstanding.
    x.max_dest_rd_atomic = static_cast<uint8_t>(y.max_rd_atomic + pick(0, 2));
    y.max_dest_rd_atomic = static_cast<uint8_t>(x.max_rd_atomic + pick(0, 2));
    s_.qps.push_back(x);
    s_.qps.push_back(y);
  }

  void make_qps() {
    const ScenarioConfig& c = s_.config;
    for (uint32_t h = 0; h < c.hosts; ++h) s_.host_has_srq.push_back(chance(50));
    auto two_hosts = [&] {
      const auto a = static_cast<uint32_t>(rng_.below(c.hosts));
      auto b = static_cast<uint32_t>(rng_.below(c.hosts - 1));
      if (b >= a) ++b;
      return std::pair{a, b};
    };
    for (uint32_t i = 0; i < c.rc_pairs; ++i) {
      auto [a, b] = two_hosts();
      add_pair(IBV_QPT_RC, a, b);
    }
    // Injected errors: a seed-chosen minority of RC pairs, one fault each, on a random side.
    fault_of_.assign(s_.qps.size() + c.hosts * c.ud_per_host + 2 * c.uc_pairs, Fault::kNone);
    for (uint32_t i = 0; i < c.rc_pairs; ++i) {
      if (!chance(c.errors_percent)) continue;
      const uint32_t qi = 2 * i + static_cast<uint32_t>(rng_.below(2));
      const std::vector<Fault> kinds = faults_for(qi);
      const Fault f = kinds[rng_.below(kinds.size())];
      fault_of_[qi] = f;
      if (f == Fault::kDeadPeer) s_.qps[s_.qps[qi].peer].dead = true;
      if (f == Fault::kNoRdAtomic) s_.qps[s_.qps[qi].peer].max_dest_rd_atomic = 0;
    }
    ud_fault_percent_ = c.errors_percent;
    for (uint32_t i = 0; i < c.uc_pairs; ++i) {
      auto [a, b] = two_hosts();
      add_pair(IBV_QPT_UC, a, b);
    }
    for (uint32_t h = 0; h < c.hosts; ++h) {
      for (uint32_t i = 0; i < c.ud_per_host; ++i) {
        QpSpec q;
        q.host = h;
        q.type = IBV_QPT_UD;
        q.sq_sig_all = chance(10);
        q.sq_psn = static_cast<uint32_t>(rng_.below(1u << 24));
        if (enabled(Op::kSend) && ud_fault_percent_ && chance(ud_fault_percent_ / 2))
          fault_of_[s_.qps.size()] = Fault::kUdTooLong;
        s_.qps.push_back(q);
      }
    }
  }

  // The ops this QP may use, weighted equally.
  std::vector<Op> ops_for(const QpSpec& q) const {
    std::vector<Op> out;
    for (size_t i = 0; i < kOpCount; ++i) {
      const Op op = static_cast<Op>(i);
      const OpInfo& info = kOps[i];
      if (!enabled(op)) continue;
      if (op == Op::kBindMw || op == Op::kLocalInv || op == Op::kSendInv) continue;  // flows
      const bool ok = (q.type == IBV_QPT_RC && info.rc) || (q.type == IBV_QPT_UC && info.uc) ||
                      (q.type == IBV_QPT_UD && info.ud);
      if (ok) out.push_back(op);
    }
    return out;
  }

  SendSpec& push_send(uint32_t qp, Op op) {
    SendSpec w;
    w.qp = qp;
    w.op = op;
    w.post_ns = now_ns_;
    w.signaled = chance(70);
    w.solicited = op_info(op).consumes_recv && chance(20);
    s_.sends.push_back(w);
    return s_.sends.back();
  }

  // Sends consuming receives at a QP's peer need a buffer large enough there: recorded here,
  // receives are made once all sends exist.
  // Its buffer is reserved against the memory budget now.
  void note_consumer(uint32_t qp, uint64_t len) {
    consumers_[s_.qps[qp].peer].push_back(len);
    used_ += len;
  }

  // ---- injected errors ----
  // The faults this pair can get, given the enabled operations and the responder's queues.
  std::vector<Fault> faults_for(uint32_t qi) const {
    const QpSpec& q = s_.qps[qi];
    const bool own_rq = !s_.qps[q.peer].use_srq;
    std::vector<Fault> out = {Fault::kDeadPeer};
    if (enabled(Op::kRead) || enabled(Op::kCmpSwp) || enabled(Op::kFetchAdd))
      out.push_back(Fault::kNoRdAtomic);
    if (enabled(Op::kWrite)) out.insert(out.end(), {Fault::kBadRkey, Fault::kNoAccess});
    if (enabled(Op::kRead)) out.push_back(Fault::kOutOfRange);
    if (enabled(Op::kWrite) && enabled(Op::kBindMw) && enabled(Op::kLocalInv))
      out.push_back(Fault::kStaleWindow);
    if (enabled(Op::kSend) && own_rq) out.insert(out.end(), {Fault::kShortRecv, Fault::kRnr});
    if (enabled(Op::kSendInv) && own_rq) out.push_back(Fault::kBadInvalidate);
    if (enabled(Op::kLocalInv)) out.push_back(Fault::kUnboundInv);
    return out;
  }

  // The faulted WR waits for the previous WR of its QP (made signaled), so everything before
  // it has completed when it is posted and the statuses before it are certain.
  void after_previous(SendSpec& w) {
    const auto self = static_cast<uint32_t>(&w - s_.sends.data());
    for (uint32_t j = self; j-- > 0;)
      if (s_.sends[j].qp == w.qp) {
        s_.sends[j].signaled = true;
        w.after = j;
        return;
      }
  }

  void gen_fault(uint32_t qi, Fault f) {
    const QpSpec& q = s_.qps[qi];
    const uint64_t mtu = kMtuBytes[q.mtu];
    const uint32_t host = q.host;
    const uint32_t peer_host = q.peer != kNone ? s_.qps[q.peer].host : host;
    auto source_sges = [&](uint64_t len, uint32_t h) {
      return split(len, [&](uint64_t n) { return source_piece(h, n); });
    };
    switch (f) {
      case Fault::kBadRkey:
      case Fault::kNoAccess: {
        // At least one byte: a zero-length WRITE checks no R_Key (IBA 9.7.4.1.x, rxe).
        const uint64_t len = std::max<uint64_t>(draw_size(mtu, ~uint64_t{0}), 1);
        SendSpec& w = push_send(qi, Op::kWrite);
        w.sges = source_sges(len, host);
        // kNoAccess: into a source region, registered with REMOTE_READ only.
        const Sge dst = f == Fault::kBadRkey ? alloc(peer_host, len) : source_piece(peer_host, len);
        w.remote_region = dst.region;
        w.remote_offset = dst.offset;
        w.fault = f;
        after_previous(w);
        return;
      }
      case Fault::kOutOfRange: {
        const uint64_t len = std::max<uint64_t>(draw_size(mtu, ~uint64_t{0}), 1);
        SendSpec& w = push_send(qi, Op::kRead);
        w.sges = split(len, [&](uint64_t n) { return alloc(host, n); });
        w.remote_region = sources_[peer_host][rng_.below(sources_[peer_host].size())];
        w.remote_offset = source_size_ - len + pick(1, 64);  // 1..64 bytes past the end
        w.fault = f;
        after_previous(w);
        return;
      }
      case Fault::kStaleWindow: {
        // The peer binds a window, this QP writes through it, the peer invalidates it, then
        // this QP writes through the stale rkey.
        const auto win = static_cast<uint32_t>(s_.windows.size());
        s_.windows.push_back(WindowSpec{peer_host});
        const uint64_t len = std::max<uint64_t>(draw_size(mtu, ~uint64_t{0}), 1);
        const Sge range = alloc(peer_host, len, /*window=*/true);
        SendSpec& b = push_send(q.peer, Op::kBindMw);
        b.window = win;
        b.remote_region = range.region;
        b.remote_offset = range.offset;
        b.bind_length = len;
        b.signaled = true;
        const auto bind_id = static_cast<uint32_t>(s_.sends.size() - 1);
        SendSpec& w = push_send(qi, Op::kWrite);
        w.after = bind_id;
        w.window = win;
        w.remote_region = range.region;
        w.remote_offset = range.offset;
        w.sges = source_sges(pick(0, len), host);
        w.signaled = true;
        const auto write_id = static_cast<uint32_t>(s_.sends.size() - 1);
        SendSpec& v = push_send(q.peer, Op::kLocalInv);
        v.window = win;
        v.after = write_id;
        v.signaled = true;
        const auto inv_id = static_cast<uint32_t>(s_.sends.size() - 1);
        SendSpec& x = push_send(qi, Op::kWrite);
        x.after = inv_id;
        x.window = win;
        x.remote_region = range.region;
        x.remote_offset = range.offset;
        x.sges = source_sges(pick(1, len), host);
        x.fault = f;
        return;
      }
      case Fault::kShortRecv:
      case Fault::kRnr: {
        const uint64_t len = std::max<uint64_t>(draw_size(mtu, kSrqMessageMax), 1);
        SendSpec& w = push_send(qi, Op::kSend);
        w.sges = source_sges(len, host);
        w.inline_data = len <= kMaxInlineBytes && chance(30);
        w.fault = f;
        after_previous(w);
        if (f == Fault::kShortRecv) {
          exact_[q.peer].insert(consumers_[q.peer].size());
          note_consumer(qi, pick(0, len - 1));  // its buffer: too short, no slack
        } else {
          // No receive for this message or any later one is ever posted at the peer.
          rnr_cut_[q.peer] = std::min<size_t>(rnr_cut_[q.peer], consumers_[q.peer].size());
          s_.qps[qi].rnr_retry = static_cast<uint8_t>(pick(0, 6));
        }
        return;
      }
      case Fault::kBadInvalidate: {
        const uint64_t len = draw_size(mtu, kSrqMessageMax);
        SendSpec& w = push_send(qi, Op::kSendInv);
        w.sges = source_sges(len, host);
        w.remote_region = targets_[peer_host][0];  // its rkey is what the SEND invalidates
        w.remote_offset = 0;
        w.fault = f;
        after_previous(w);
        note_consumer(qi, len);
        return;
      }
      case Fault::kUnboundInv: {
        const auto win = static_cast<uint32_t>(s_.windows.size());
        s_.windows.push_back(WindowSpec{host});
        SendSpec& w = push_send(qi, Op::kLocalInv);
        w.window = win;
        w.fault = f;
        after_previous(w);
        return;
      }
      case Fault::kUdTooLong: {
        // Longer than any receive buffer (at most kUdMaxPayloadBytes + GRH + 64 of slack), within
        // the UD path MTU (the port's 4096).
        std::vector<uint32_t> dests;
        for (uint32_t i = 0; i < s_.qps.size(); ++i)
          if (s_.qps[i].type == IBV_QPT_UD && i != qi) dests.push_back(i);
        const uint64_t len = pick(kUdMaxPayloadBytes + kGrhBytes + 64 + 1, 4096);
        SendSpec& w = push_send(qi, Op::kSend);
        w.sges = source_sges(len, host);
        w.ud_dest = dests[rng_.below(dests.size())];
        w.fault = f;
        return;
      }
      case Fault::kNone:
      case Fault::kDeadPeer:
      case Fault::kNoRdAtomic:
        break;
    }
  }

  void gen_one(uint32_t qi, const std::vector<Op>& ops) {
    const QpSpec& q = s_.qps[qi];
    const uint64_t mtu = q.type == IBV_QPT_UD ? kUdMaxPayloadBytes : kMtuBytes[q.mtu];
    const Op op = ops[rng_.below(ops.size())];
    const uint32_t host = q.host;
    const uint32_t peer_host = q.type == IBV_QPT_UD ? kNone : s_.qps[q.peer].host;

    // A fence chain: READ into a local buffer, then a fenced WRITE or SEND out of it — the
    // fence is what makes the second see the first's data (IBA 10.8.3.3).
    if (q.type == IBV_QPT_RC && op == Op::kRead && chance(25) &&
        (enabled(Op::kWrite) || enabled(Op::kSend))) {
      const uint64_t len = draw_size(mtu, peer_uses_srq(qi) ? kSrqMessageMax : ~uint64_t{0});
      const Sge local = alloc(host, len);
      SendSpec& r = push_send(qi, Op::kRead);
      r.sges = {local};
      const Sge remote = source_piece(peer_host, len);
      r.remote_region = remote.region;
      r.remote_offset = remote.offset;
      const bool write = enabled(Op::kWrite) && (!enabled(Op::kSend) || chance(50));
      SendSpec& w = push_send(qi, write ? Op::kWrite : Op::kSend);
      w.fence = true;
      w.sges = {local};
      if (write) {
        const Sge dst = alloc(peer_host, len);
        w.remote_region = dst.region;
        w.remote_offset = dst.offset;
      } else {
        note_consumer(qi, len);
      }
      return;
    }

    // A memory-window flow on an RC pair (RC, so that "the write completed" means it landed):
    // this side binds a type 2B window over a fresh
    // range, the peer writes through the window's rkey once the bind completed, then the peer
    // invalidates it with SEND_WITH_INV or this side with LOCAL_INV once the write completed.
    if (q.type == IBV_QPT_RC && enabled(Op::kBindMw) && enabled(Op::kWrite) && chance(8)) {
      const auto win = static_cast<uint32_t>(s_.windows.size());
      s_.windows.push_back(WindowSpec{host});
      const uint64_t len = std::max<uint64_t>(draw_size(mtu, ~uint64_t{0}), 1);
      const Sge range = alloc(host, len, /*window=*/true);
      SendSpec& b = push_send(qi, Op::kBindMw);
      b.window = win;
      b.remote_region = range.region;
      b.remote_offset = range.offset;
      b.bind_length = len;
      b.signaled = true;
      const auto bind_id = static_cast<uint32_t>(s_.sends.size() - 1);
      const uint64_t wlen = pick(0, len);
      const uint64_t woff = pick(0, len - wlen);
      SendSpec& w = push_send(q.peer, Op::kWrite);
      w.after = bind_id;
      w.window = win;
      w.remote_region = range.region;
      w.remote_offset = range.offset + woff;
      w.sges = split(wlen, [&](uint64_t n) { return source_piece(peer_host, n); });
      w.signaled = true;
      const auto write_id = static_cast<uint32_t>(s_.sends.size() - 1);
      const bool remote_inv =
          q.type == IBV_QPT_RC && enabled(Op::kSendInv) && !s_.qps[qi].use_srq && chance(50);
      if (remote_inv) {
        SendSpec& v = push_send(q.peer, Op::kSendInv);
        v.window = win;
        const uint64_t n = draw_size(mtu, kSrqMessageMax);
        v.sges = split(n, [&](uint64_t k) { return source_piece(peer_host, k); });
        note_consumer(q.peer, n);
      } else if (enabled(Op::kLocalInv)) {
        SendSpec& v = push_send(qi, Op::kLocalInv);
        v.window = win;
        v.after = write_id;
      }
      return;
    }

    SendSpec& w = push_send(qi, op);
    const OpInfo& info = kOps[static_cast<size_t>(op)];
    if (info.atomic) {
      const Sge result = alloc(host, 8, false, chance(50) ? 8 : 1);
      w.sges = {result};
      w.remote_region = s_.atomic_region[peer_host];
      auto counter = static_cast<uint32_t>(rng_.below(kCountersPerKind));
      if (op == Op::kFetchAdd) {
        w.compare_add = pick(1, 1u << 16);
      } else {
        uint64_t& model = cas_model_[size_t{peer_host} * kCountersPerKind + counter];
        counter += kCountersPerKind;
        w.compare_add = chance(70) ? model : model ^ (pick(1, 255) << 8);
        // Swap values never repeat, so the counter's history is a chain (checker.cc).
        w.swap = (uint64_t{0xc5} << 56) | (++cas_serial_ << 8) | rng_.below(256);
        if (w.compare_add == model) model = w.swap;
      }
      w.remote_offset = counter_offset(counter);
      return;
    }
    uint64_t cap = ~uint64_t{0};
    if (q.type == IBV_QPT_UD) cap = kUdMaxPayloadBytes;
    // Buffers shared by messages of any size (SRQ; UC, where loss shifts which buffer a message
    // lands in) are sized for the largest one, so those messages stay small.
    if (info.consumes_recv && op != Op::kWriteImm && (peer_uses_srq(qi) || q.type == IBV_QPT_UC))
      cap = kSrqMessageMax;
    const uint64_t len = draw_size(mtu, cap);
    if (op == Op::kRead) {
      w.sges = split(len, [&](uint64_t n) { return alloc(host, n); });
      const Sge remote = source_piece(peer_host, len);
      w.remote_region = remote.region;
      w.remote_offset = remote.offset;
      return;
    }
    w.sges = split(len, [&](uint64_t n) { return source_piece(host, n); });
    w.inline_data = len <= kMaxInlineBytes && chance(30);
    if (op == Op::kSendImm || op == Op::kWriteImm) w.imm = static_cast<uint32_t>(rng_.next());
    if (info.remote) {
      const Sge dst = alloc(peer_host, len);
      w.remote_region = dst.region;
      w.remote_offset = dst.offset;
    }
    if (q.type == IBV_QPT_UD) {
      // To a UD QP on another host (or, rarely, on this one: loopback through the network).
      std::vector<uint32_t> dests;
      for (uint32_t i = 0; i < s_.qps.size(); ++i)
        if (s_.qps[i].type == IBV_QPT_UD && i != qi) dests.push_back(i);
      base::check(!dests.empty(), "UD QP without a destination");
      w.ud_dest = dests[rng_.below(dests.size())];
      consumers_[w.ud_dest].push_back(len + kGrhBytes);
      used_ += len + kGrhBytes;
      return;
    }
    if (info.consumes_recv) note_consumer(qi, op == Op::kWriteImm ? 0 : len);
  }

  bool peer_uses_srq(uint32_t qi) const {
    const QpSpec& q = s_.qps[qi];
    return q.type != IBV_QPT_UD && s_.qps[q.peer].use_srq;
  }

  void make_sends() {
    const ScenarioConfig& c = s_.config;
    consumers_.assign(s_.qps.size(), {});
    std::vector<uint32_t> budget;  // send WRs left per QP
    std::vector<std::vector<Op>> ops;
    for (const QpSpec& q : s_.qps) {
      ops.push_back(ops_for(q));
      budget.push_back(ops.back().empty() ? 0 : static_cast<uint32_t>(pick(c.wrs_min, c.wrs_max)));
    }
    // The position in its QP's sequence at which each fault is emitted.
    std::vector<uint32_t> fault_at(s_.qps.size(), kNone);
    for (uint32_t i = 0; i < s_.qps.size(); ++i)
      if (fault_of_[i] != Fault::kNone && fault_of_[i] != Fault::kDeadPeer &&
          fault_of_[i] != Fault::kNoRdAtomic && budget[i] > 0)
        fault_at[i] = static_cast<uint32_t>(rng_.below(budget[i]));
    exact_.assign(s_.qps.size(), {});
    rnr_cut_.assign(s_.qps.size(), ~size_t{0});
    uint64_t total = 0;
    for (uint32_t b : budget) total += b;
    const uint64_t step_max = total ? 2 * c.post_window_ns / total : 0;
    // One global sequence: per-QP order and every dependency point backwards in it, so the
    // runner can never deadlock on them.
    for (;;) {
      std::vector<uint32_t> live;
      for (uint32_t i = 0; i < budget.size(); ++i)
        if (budget[i] > 0) live.push_back(i);
      if (live.empty()) break;
      const uint32_t qi = live[rng_.below(live.size())];
      --budget[qi];
      if (budget[qi] == fault_at[qi])
        gen_fault(qi, fault_of_[qi]);
      else
        gen_one(qi, ops[qi]);
      now_ns_ = std::min(c.post_window_ns, now_ns_ + pick(0, step_max));
    }
    // A dead peer: the first WR that sends a packet fails with RETRY_EXC_ERR. A responder
    // without READ/ATOMIC resources: the first READ or ATOMIC is refused.
    for (uint32_t qi = 0; qi < s_.qps.size(); ++qi) {
      const Fault f = fault_of_[qi];
      if (f != Fault::kDeadPeer && f != Fault::kNoRdAtomic) continue;
      for (SendSpec& w : s_.sends)
        if (w.qp == qi && !op_info(w.op).local &&
            (f == Fault::kDeadPeer || w.op == Op::kRead || op_info(w.op).atomic)) {
          w.fault = f;
          break;
        }
    }
    // The last send of every QP is signaled: its completion means every earlier one is done.
    std::vector<bool> seen(s_.qps.size());
    for (size_t i = s_.sends.size(); i-- > 0;) {
      SendSpec& w = s_.sends[i];
      if (!seen[w.qp]) w.signaled = true;
      seen[w.qp] = true;
      if (s_.qps[w.qp].sq_sig_all) w.signaled = true;
    }
  }

  void make_recvs() {
    const ScenarioConfig& c = s_.config;
    // Own receive queues: one buffer per consuming message, sized for it (RC delivers in
    // order), plus a few spare ones that are flushed at the end.
    std::vector<std::vector<uint64_t>> srq_lens(c.hosts);
    for (uint32_t qi = 0; qi < s_.qps.size(); ++qi) {
      const QpSpec& q = s_.qps[qi];
      std::vector<uint64_t> lens = consumers_[qi];
      if (rnr_cut_[qi] <= lens.size()) {
        // Kept out of the memory budget: never posted (Fault::kRnr).
        lens.resize(rnr_cut_[qi]);
        add_recvs(qi, kNone, lens, true, {});
        continue;
      }
      if (q.use_srq) {
        srq_lens[q.host].insert(srq_lens[q.host].end(), lens.begin(), lens.end());
        continue;
      }
      if (q.type != IBV_QPT_RC) {
        // UC/UD: messages may come in any order (faults), so every buffer fits the largest.
        const uint64_t biggest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
        for (uint64_t& l : lens) l = biggest;
      }
      // Spares are small on RC (nothing arrives beyond what was sent); on UC/UD a duplicated
      // datagram may land in one, so they fit any message there.
      const uint32_t spare = static_cast<uint32_t>(pick(0, 2));
      const bool fits_any = q.type != IBV_QPT_RC && !lens.empty();
      for (uint32_t i = 0; i < spare; ++i) lens.push_back(fits_any ? lens.front() : pick(0, 64));
      add_recvs(qi, kNone, lens, q.type == IBV_QPT_RC, exact_[qi]);
    }
    for (uint32_t h = 0; h < c.hosts; ++h) {
      if (!s_.host_has_srq[h]) continue;
      std::vector<uint64_t>& lens = srq_lens[h];
      const uint64_t biggest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
      const size_t n = lens.size() + pick(0, 2);
      lens.assign(n, biggest);
      add_recvs(kNone, h, lens, true, {});
    }
  }

  // `exact`: indices of buffers that get no slack (a short receive must stay short).
  void add_recvs(uint32_t qp, uint32_t srq_host, const std::vector<uint64_t>& lens, bool rnr_ok,
                 const std::set<size_t>& exact) {
    const uint32_t host = qp != kNone ? s_.qps[qp].host : srq_host;
    // Some RC queues get only part of their receives at first: RNR NAKs until the rest comes.
    size_t early = lens.size();
    uint64_t late_ns = 0;
    if (rnr_ok && !lens.empty() && chance(s_.config.late_recv_percent)) {
      early = pick(0, lens.size() - 1);
      late_ns = pick(s_.config.post_window_ns / 4, s_.config.post_window_ns * 2);
    }
    for (size_t i = 0; i < lens.size(); ++i) {
      RecvSpec r;
      r.qp = qp;
      r.srq_host = srq_host;
      r.post_ns = i < early ? 0 : late_ns;
      const uint64_t slack = exact.count(i) ? 0 : pick(0, 64);
      r.sges = split(lens[i] + slack, [&](uint64_t n) { return alloc(host, n); });
      if (r.sges.empty()) r.sges.push_back(alloc(host, 0));
      s_.recvs.push_back(std::move(r));
    }
  }

  void finish_regions() {
    for (uint32_t i = 0; i < s_.regions.size(); ++i) {
      RegionSpec& r = s_.regions[i];
      if (r.kind == RegionSpec::Kind::kTarget || r.kind == RegionSpec::Kind::kWindow)
        r.size = bump_[i] + pick(1, kMaxGapBytes);  // never empty; ends with a gap
    }
  }

  Xoshiro256 rng_;
  Scenario s_;
  uint64_t source_size_ = 0;
  uint64_t used_ = 0;
  uint64_t now_ns_ = 0;
  uint64_t cas_serial_ = 0;
  std::vector<uint64_t> bump_;
  std::vector<std::vector<uint32_t>> sources_, targets_;
  std::vector<uint32_t> window_region_;
  std::vector<uint64_t> cas_model_;
  std::vector<std::vector<uint64_t>> consumers_;  // per QP: lengths of messages it receives
  std::vector<Fault> fault_of_;                   // per QP: the fault it will inject
  uint32_t ud_fault_percent_ = 0;
  std::vector<std::set<size_t>> exact_;  // per QP: consumers whose buffer gets no slack
  std::vector<size_t> rnr_cut_;          // per QP: receives from this consumer on are never posted
};

}  // namespace

const char* fault_name(Fault f) {
  static constexpr const char* kNames[kFaultCount] = {
      "none", "bad-rkey",       "out-of-range", "no-access", "stale-window", "short-recv",
      "rnr",  "bad-invalidate", "unbound-inv",  "dead-peer", "ud-too-long",  "no-rd-atomic"};
  return kNames[static_cast<size_t>(f)];
}

FaultOutcome fault_outcome(Fault f) {
  switch (f) {
    case Fault::kBadRkey:
    case Fault::kOutOfRange:
    case Fault::kNoAccess:
    case Fault::kStaleWindow:
      // IBA 9.7.5.2.8 / C9-88: R_Key violation → NAK Remote Access Error; responder class C
      // (QP → ERR).
      return {IBV_WC_REM_ACCESS_ERR, std::nullopt, true};
    case Fault::kShortRecv:
      // IBA 9.7.5.2.x: the receive WQE completes with Local Length Error, NAK Invalid Request.
      return {IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR, true};
    case Fault::kRnr:
      // IBA 9.7.5.1.5: RNR NAKs beyond rnr_retry → RNR Retry Counter Exceeded; the responder
      // is fine.
      return {IBV_WC_RNR_RETRY_EXC_ERR, std::nullopt, false};
    case Fault::kBadInvalidate:
      // rxe class J (IBA 10.6.7.2.x leaves the reply open): the receive WQE completes with
      // Remote Invalid Request Error and the responder QP enters ERR, but the request is
      // ACKed as usual, so the requester's SEND succeeds.
      return {IBV_WC_SUCCESS, IBV_WC_REM_INV_REQ_ERR, true};
    case Fault::kUnboundInv:
      // IBA 10.6.7.2.x (o10-37.2.x): LOCAL_INV of a window not bound fails the WR (rxe:
      // Local QP Operation Error); only the requester's QP enters ERR.
      return {IBV_WC_LOC_QP_OP_ERR, std::nullopt, false};
    case Fault::kDeadPeer:
      // IBA 9.7.6.1.1: no ACK within retry_cnt + 1 local ACK timeouts.
      return {IBV_WC_RETRY_EXC_ERR, std::nullopt, false};
    case Fault::kNoRdAtomic:
      // IBA 9.7.5.2.x / rxe RESPST_ERR_TOO_MANY_RDMA_ATM_REQ (class C): a READ or ATOMIC beyond
      // the responder's resources (none at all) is NAKed Invalid Request; the responder QP
      // enters ERR.
      return {IBV_WC_REM_INV_REQ_ERR, std::nullopt, true};
    case Fault::kUdTooLong:
      // IBA 9.8.4 / 11.4.2, rxe class D: the datagram is dropped; no receive is consumed and
      // the QP goes on. The send completed when it left (IBA 9.8).
      return {IBV_WC_SUCCESS, std::nullopt, false};
    case Fault::kNone:
      break;
  }
  return {};
}

std::array<uint8_t, kGrhBytes> ud_grh(uint32_t src_host, uint32_t dst_host, uint64_t payload,
                                      bool imm) {
  // UDP payload: BTH 12 + DETH 8 (+ ImmDt 4) + payload padded to 4 + ICRC 4 (IBA 9.2, 9.3).
  const uint64_t udp = 8 + 12 + 8 + (imm ? 4 : 0) + (payload + 3) / 4 * 4 + 4;
  std::array<uint8_t, kGrhBytes> g{};
  uint8_t* ip = g.data() + 20;  // the IPv4 header sits in the last 20 bytes
  const uint64_t total = 20 + udp;
  const uint32_t src = host_ipv4(src_host), dst = host_ipv4(dst_host);
  const uint8_t header[20] = {0x45,
                              0,
                              static_cast<uint8_t>(total >> 8),
                              static_cast<uint8_t>(total),  // ver/IHL, TOS, len
                              0,
                              0,
                              0x40,
                              0,  // ID 0, DF
                              64,
                              17,
                              0,
                              0,  // TTL, UDP, csum
                              static_cast<uint8_t>(src >> 24),
                              static_cast<uint8_t>(src >> 16),
                              static_cast<uint8_t>(src >> 8),
                              static_cast<uint8_t>(src),
                              static_cast<uint8_t>(dst >> 24),
                              static_cast<uint8_t>(dst >> 16),
                              static_cast<uint8_t>(dst >> 8),
                              static_cast<uint8_t>(dst)};
  std::memcpy(ip, header, 20);
  // RFC 791: one's complement of the one's complement sum of the header's 16-bit words.
  uint32_t sum = 0;
  for (size_t i = 0; i < 20; i += 2) sum += uint32_t{ip[i]} << 8 | ip[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  const auto csum = static_cast<uint16_t>(~sum);
  ip[10] = static_cast<uint8_t>(csum >> 8);
  ip[11] = static_cast<uint8_t>(csum);
  return g;
}

const OpInfo& op_info(Op op) {
  return kOps[static_cast<size_t>(op)];
}

std::optional<Op> parse_op(std::string_view name) {
  for (size_t i = 0; i < kOpCount; ++i)
    if (name == kOps[i].name) return static_cast<Op>(i);
  return std::nullopt;
}

OpSet all_ops() {
  OpSet s;
  s.fill(true);
  return s;
}

std::optional<OpSet> parse_ops(std::string_view list) {
  if (list == "all") return all_ops();
  OpSet s{};
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    const std::optional<Op> op = parse_op(name);
    if (!op) return std::nullopt;
    s[static_cast<size_t>(*op)] = true;
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return s;
}

std::string to_string(const OpSet& ops) {
  std::string out;
  for (size_t i = 0; i < kOpCount; ++i) {
    if (!ops[i]) continue;
    if (!out.empty()) out += ',';
    out += kOps[i].name;
  }
  return out;
}

uint64_t SendSpec::length() const {
  uint64_t n = 0;
  for (const Sge& s : sges) n += s.length;
  return n;
}

uint64_t RecvSpec::length() const {
  uint64_t n = 0;
  for (const Sge& s : sges) n += s.length;
  return n;
}

std::vector<uint8_t> Scenario::initial_image(uint32_t region) const {
  base::check(region < regions.size(), "region out of range");
  const RegionSpec& r = regions[region];
  std::vector<uint8_t> img(kGuardBytes + r.size + kGuardBytes);
  Xoshiro256 rng(region_seed(seed, region));
  size_t i = 0;
  for (; i + 8 <= img.size(); i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(img.data() + i, &v, 8);
  }
  for (; i < img.size(); ++i) img[i] = static_cast<uint8_t>(rng.next());
  if (r.kind == RegionSpec::Kind::kAtomic) {
    // Counters start below 2^60 so that no sum of FETCH_ADDs wraps (checker.cc sorts them).
    for (uint64_t off = 0; off < r.size; off += 8) {
      uint64_t v;
      std::memcpy(&v, img.data() + kGuardBytes + off, 8);
      v >>= 4;
      std::memcpy(img.data() + kGuardBytes + off, &v, 8);
    }
  }
  return img;
}

Scenario generate(const ScenarioConfig& config, uint64_t seed) {
  return Generator(config, seed).run();
}

std::string dump(const Scenario& s) {
  std::ostringstream os;
  static constexpr const char* kMtu[] = {"?", "256", "512", "1024", "2048", "4096"};
  for (uint32_t q = 0; q < s.qps.size(); ++q) {
    const QpSpec& p = s.qps[q];
    os << "qp " << q << " host " << p.host << " "
       << (p.type == IBV_QPT_RC   ? "RC"
           : p.type == IBV_QPT_UC ? "UC"
                                  : "UD");
    if (p.peer != kNone) os << " peer qp " << p.peer << " mtu " << kMtu[p.mtu];
    if (p.type == IBV_QPT_RC)
      os << " timeout " << int{p.timeout} << " retry_cnt " << int{p.retry_cnt} << " rnr_retry "
         << int{p.rnr_retry} << " min_rnr_timer " << int{p.min_rnr_timer} << " max_rd_atomic "
         << int{p.max_rd_atomic} << " max_dest_rd_atomic " << int{p.max_dest_rd_atomic};
    os << " sq_psn 0x" << std::hex << p.sq_psn << std::dec << (p.use_srq ? " srq" : "")
       << (p.sq_sig_all ? " sq_sig_all" : "") << (p.dead ? " DEAD" : "") << "\n";
  }
  for (size_t i = 0; i < s.sends.size(); ++i) {
    const SendSpec& w = s.sends[i];
    os << "send #" << i << " t=" << w.post_ns << " qp " << w.qp << " " << op_info(w.op).name
       << " len " << w.length() << " sge " << w.sges.size() << (w.signaled ? "" : " unsignaled")
       << (w.fence ? " fence" : "") << (w.inline_data ? " inline" : "")
       << (w.solicited ? " solicited" : "");
    if (w.remote_region != kNone)
      os << " remote region " << w.remote_region << "+" << w.remote_offset;
    if (w.window != kNone) os << " window " << w.window;
    if (w.ud_dest != kNone) os << " to qp " << w.ud_dest;
    if (w.after != kNone) os << " after #" << w.after;
    if (w.fault != Fault::kNone) os << " FAULT " << fault_name(w.fault);
    os << "\n";
  }
  for (size_t i = 0; i < s.recvs.size(); ++i) {
    const RecvSpec& r = s.recvs[i];
    os << "recv #" << i << " t=" << r.post_ns << " "
       << (r.qp != kNone ? "qp " + std::to_string(r.qp) : "srq host " + std::to_string(r.srq_host))
       << " len " << r.length() << " sge " << r.sges.size() << "\n";
  }
  return os.str();
}

std::string summary(const Scenario& s) {
  size_t by_type[3] = {};
  for (const QpSpec& q : s.qps) ++by_type[q.type == IBV_QPT_RC ? 0 : q.type == IBV_QPT_UC ? 1 : 2];
  uint64_t bytes = 0;
  for (const RegionSpec& r : s.regions) bytes += r.size;
  std::ostringstream os;
  os << s.config.hosts << " hosts, " << s.qps.size() << " QPs (RC " << by_type[0] << " UC "
     << by_type[1] << " UD " << by_type[2] << "), " << s.sends.size() << " sends, "
     << s.recvs.size() << " recvs, " << bytes / 1024 << " KiB registered";
  return os.str();
}

}  // namespace urdma::sim
