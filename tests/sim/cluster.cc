// The simulated cluster; see cluster.h.
#include "sim/cluster.h"

#include <isa-l/crc64.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <span>

#include "base/check.h"
#include "engine/engine.h"
#include "support/sim_world.h"
#include "provider/device.h"
#include "support/engine_participant.h"
#include "support/qp_setup.h"

namespace urdma::sim {
namespace {

// After the last completion: time for datagrams still in flight (UC/UD receives) to land.
constexpr uint64_t kSettleNs = 2'000'000;
// CQE slack beyond the WRs a CQ can ever hold.
constexpr uint32_t kCqSlack = 16;
constexpr uint8_t kHopLimit = 64;
constexpr int kWindowAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

net::Address host_address(uint32_t h) {
  const uint32_t a = host_ipv4(h);
  return net::Address::from_v4(static_cast<uint8_t>(a >> 24), static_cast<uint8_t>(a >> 16),
                               static_cast<uint8_t>(a >> 8), static_cast<uint8_t>(a));
}
ibv_gid host_gid(uint32_t h) {
  ibv_gid gid;
  const net::Address::Bytes b = host_address(h).bytes();  // IPv4-mapped: the RoCEv2 GID form
  std::memcpy(gid.raw, b.data(), sizeof gid.raw);
  return gid;
}

// A 64-bit digest of the run (isa-l's CRC-64/ECMA: a library, and stable everywhere).
class TraceHash {
 public:
  void bytes(const void* p, size_t n) {
    h_ = crc64_ecma_refl(h_, static_cast<const unsigned char*>(p), n);
  }
  template <class T>
  void value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof v);
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 0;
};

// The engine's PacketIo, seen through: every datagram the engine transmits passes here on its
// way into the network, so the runner has its bytes when the network reports the send (the
// kSend trace event fires inside the inner send). Everything else is forwarded as is.
class TracingIo final : public net::PacketIo {
 public:
  explicit TracingIo(net::PacketIo& inner) : inner_(inner) {}
  net::TxStatus send(const net::TxDatagram& d) override {
    current_.clear();
    for (const iovec& v : d.iov) {
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      current_.insert(current_.end(), p, p + v.iov_len);
    }
    return inner_.send(d);
  }
  size_t send_batch(std::span<const net::TxDatagram> batch) override {
    for (const net::TxDatagram& d : batch) send(d);  // the simulated network never blocks
    return batch.size();
  }
  size_t recv_batch(std::span<net::RxDatagram> batch) override { return inner_.recv_batch(batch); }
  int readable_fd() const override { return inner_.readable_fd(); }
  size_t rx_buffer_bytes() const override { return inner_.rx_buffer_bytes(); }
  net::IoCounters counters() const override { return inner_.counters(); }
  uint16_t source_port(uint16_t wanted) const override { return inner_.source_port(wanted); }
  uint64_t next_deadline_ns() const override { return inner_.next_deadline_ns(); }
  // The bytes of the datagram being sent right now.
  const std::vector<uint8_t>& current() const { return current_; }

 private:
  net::PacketIo& inner_;
  std::vector<uint8_t> current_;
};

struct Region {
  std::unique_ptr<uint8_t[]> mem;  // guard + registration + guard
  size_t total = 0;
  provider::Mr* mr = nullptr;
  ibv_mr handle = {};  // what an application's WR points at (the provider reads .handle)
  uint8_t* base() const { return mem.get() + kGuardBytes; }
};

struct Host {
  explicit Host(uint32_t host_id) : id(host_id) {}
  uint32_t id;
  engine::DoorbellRelay relay;
  std::unique_ptr<TracingIo> io;
  std::unique_ptr<provider::Device> device;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<test::EngineParticipant> driver;  // how the world polls the engine
  provider::Pd* pd = nullptr;
  provider::Cq* send_cq = nullptr;
  provider::Cq* recv_cq = nullptr;
  provider::Srq* srq = nullptr;
};

class Cluster {
 public:
  Cluster(const Scenario& s, const RunOptions& o) : s_(s), o_(o), world_(sim_options(s)) {}

  RunResult run() {
    world_.network().set_trace([this](const net::SimEvent& e) { on_event(e); });
    build();
    drive();
    return finish();
  }

 private:
  net::VirtualClock& clock() { return world_.clock(); }
  uint64_t now() { return world_.clock().now_ns(); }

  void fail_setup(const std::string& what, int err) {
    post_errors_.push_back({"setup", what + " failed with errno " + std::to_string(err)});
  }

  // ---- building the cluster ----
  void build() {
    const uint32_t n = s_.config.hosts;
    std::vector<uint32_t> sends_on(n), recvs_on(n);
    for (const SendSpec& w : s_.sends) ++sends_on[s_.qps[w.qp].host];
    for (const RecvSpec& v : s_.recvs) ++recvs_on[v.qp != kNone ? s_.qps[v.qp].host : v.srq_host];
    for (uint32_t h = 0; h < n; ++h) {
      const net::HostId id = world_.network().add_host(host_address(h));
      base::check(id == h, "host ids are 0..n-1");
      auto host = std::make_unique<Host>(h);
      provider::DeviceConfig cfg;
      cfg.gids = {host_gid(h)};
      cfg.max_mtu = IBV_MTU_4096;
      cfg.active_mtu = IBV_MTU_4096;
      cfg.doorbell = &host->relay;
      cfg.key_seed = s_.seed * 0xd1b54a32d192ed03 + h;  // keys replay with the seed
      host->device = std::make_unique<provider::Device>(cfg);
      engine::EngineConfig ecfg;
      ecfg.local_address = host_address(h);
      host->io = std::make_unique<TracingIo>(world_.network().io(h));
      host->engine =
          std::make_unique<engine::Engine>(*host->device, *host->io, world_.clock(), ecfg);
      host->driver = std::make_unique<test::EngineParticipant>(*host->engine);
      world_.add_participant(*host->driver, h);
      provider::Device& dev = *host->device;
      host->pd = dev.alloc_pd().value();
      const auto cqe = [](uint32_t k) {
        return static_cast<int>(std::min(k + kCqSlack, provider::kLimits.max_cqe));
      };
      host->send_cq = dev.create_cq(cqe(sends_on[h])).value();
      host->recv_cq = dev.create_cq(cqe(recvs_on[h])).value();
      if (s_.host_has_srq[h]) {
        ibv_srq_attr a = {};
        a.max_wr = std::min(recvs_on[h] + 1, provider::kLimits.max_srq_wr);
        a.max_sge = kMaxSge;
        auto srq = dev.create_srq(host->pd, a);
        if (srq.ok())
          host->srq = srq.value();
        else
          fail_setup("create_srq", srq.error());
      }
      hosts_.push_back(std::move(host));
    }
    make_regions();
    make_qps();
    connect_qps();
    for (const WindowSpec& w : s_.windows) {
      auto mw = hosts_[w.host]->device->alloc_mw(hosts_[w.host]->pd, IBV_MW_TYPE_2);
      windows_.push_back(mw.ok() ? mw.value() : nullptr);
      if (!mw.ok()) fail_setup("alloc_mw", mw.error());
      ibv_mw handle = {};
      handle.handle = mw.ok() ? mw.value()->handle() : 0;
      handle.type = IBV_MW_TYPE_2;
      window_handles_.push_back(handle);
    }
    record_.window_rkey.assign(s_.windows.size(), 0);
    record_.send_posted_ns.assign(s_.sends.size(), std::nullopt);
    record_.recv_posted_ns.assign(s_.recvs.size(), std::nullopt);
    send_status_.assign(s_.sends.size(), -1);
  }

  void make_regions() {
    for (uint32_t r = 0; r < s_.regions.size(); ++r) {
      const RegionSpec& spec = s_.regions[r];
      const std::vector<uint8_t> img = s_.initial_image(r);
      Region reg;
      reg.total = img.size();
      reg.mem = std::make_unique<uint8_t[]>(reg.total);
      std::memcpy(reg.mem.get(), img.data(), reg.total);
      Host& h = *hosts_[spec.host];
      auto mr = h.device->reg_mr(h.pd, reg.base(), spec.size, spec.iova, spec.access);
      if (mr.ok()) {
        reg.mr = mr.value();
        reg.handle.handle = reg.mr->handle();
        reg.handle.lkey = reg.mr->lkey();
        reg.handle.rkey = reg.mr->rkey();
      } else {
        fail_setup("reg_mr of region " + std::to_string(r), mr.error());
      }
      regions_.push_back(std::move(reg));
    }
  }

  void make_qps() {
    std::vector<uint32_t> sends(s_.qps.size()), recvs(s_.qps.size());
    for (const SendSpec& w : s_.sends) ++sends[w.qp];
    for (const RecvSpec& v : s_.recvs)
      if (v.qp != kNone) ++recvs[v.qp];
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      const QpSpec& spec = s_.qps[q];
      Host& h = *hosts_[spec.host];
      provider::QpInitAttr init;
      init.qp_type = spec.type;
      init.pd = h.pd;
      init.send_cq = h.send_cq;
      init.recv_cq = h.recv_cq;
      init.srq = spec.use_srq ? h.srq : nullptr;
      init.sq_sig_all = spec.sq_sig_all;
      init.cap.max_send_wr = std::min(sends[q] + 1, provider::kLimits.max_qp_wr);
      init.cap.max_recv_wr = spec.use_srq ? 0 : std::min(recvs[q] + 1, provider::kLimits.max_qp_wr);
      init.cap.max_send_sge = kMaxSge;
      init.cap.max_recv_sge = spec.use_srq ? 0 : kMaxSge;
      init.cap.max_inline_data = kMaxInlineBytes;
      auto qp = h.device->create_qp(init);
      if (!qp.ok()) {
        fail_setup("create_qp " + std::to_string(q), qp.error());
        qps_.push_back(nullptr);
        record_.qp_num.push_back(0);
        continue;
      }
      qps_.push_back(qp.value());
      record_.qp_num.push_back(qp.value()->qp_num());
    }
    // UD address handles: one per (host, destination host), as an application would cache.
    ahs_.resize(hosts_.size() * hosts_.size());
    for (uint32_t a = 0; a < hosts_.size(); ++a)
      for (uint32_t b = 0; b < hosts_.size(); ++b) {
        ibv_ah_attr attr = path_to(b);
        auto ah = hosts_[a]->device->create_ah(hosts_[a]->pd, attr);
        ibv_ah handle = {};
        if (ah.ok())
          handle.handle = ah.value()->handle();
        else
          fail_setup("create_ah", ah.error());
        ahs_[a * hosts_.size() + b] = handle;
      }
  }

  static ibv_ah_attr path_to(uint32_t host) {
    ibv_ah_attr a = {};
    a.is_global = 1;
    a.port_num = 1;
    a.grh.dgid = host_gid(host);
    a.grh.sgid_index = 0;
    a.grh.hop_limit = kHopLimit;
    return a;
  }

  // RESET → INIT → RTR → RTS with exactly the masks ibv_modify_qp(3) lists per QP type
  // (test::bring_up, shared with the engine tests, the fuzz target and the benchmark).
  void connect_qps() {
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (qps_[q] == nullptr) continue;
      const QpSpec& spec = s_.qps[q];
      test::QpParams p;
      p.type = spec.type;
      p.mtu = spec.mtu;
      p.sq_psn = spec.sq_psn;
      p.timeout = spec.timeout;
      p.retry_cnt = spec.retry_cnt;
      p.rnr_retry = spec.rnr_retry;
      p.min_rnr_timer = spec.min_rnr_timer;
      p.max_rd_atomic = spec.max_rd_atomic;
      p.max_dest_rd_atomic = spec.max_dest_rd_atomic;
      p.access = spec.type == IBV_QPT_RC
                     ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                     : IBV_ACCESS_REMOTE_WRITE;
      p.qkey = kQkey;
      p.hop_limit = kHopLimit;
      p.sgid_index = 0;
      net::Address peer_address = host_address(spec.host);  // UD: no peer
      uint32_t peer_qpn = 0;
      if (spec.type != IBV_QPT_UD) {
        const QpSpec& peer = s_.qps[spec.peer];
        p.rq_psn = peer.sq_psn;
        peer_address = host_address(peer.host);
        peer_qpn = record_.qp_num[spec.peer];
      }
      const test::BringUp r = test::bring_up(*qps_[q], p, peer_address, peer_qpn);
      if (!r.ok())
        fail_setup(std::string("modify_qp to ") +
                       (r.failed_to == IBV_QPS_INIT  ? "INIT"
                        : r.failed_to == IBV_QPS_RTR ? "RTR"
                                                     : "RTS") +
                       " of qp " + std::to_string(q),
                   r.status.error());
    }
  }

  // ---- posting, as an application ----
  ibv_sge sge(const Sge& g, bool host_address) const {
    const Region& r = regions_[g.region];
    ibv_sge out;
    // Inline data is copied by the CPU at post time from a process address; every other SGE
    // names registered memory by IOVA and lkey.
    out.addr = host_address ? reinterpret_cast<uint64_t>(r.base() + g.offset)
                            : s_.regions[g.region].iova + g.offset;
    out.length = g.length;
    out.lkey = r.mr ? r.mr->lkey() : 0;
    return out;
  }
  uint64_t remote_addr(uint32_t region, uint64_t offset) const {
    return s_.regions[region].iova + offset;
  }
  uint32_t rkey(uint32_t region) const {
    return regions_[region].mr ? regions_[region].mr->rkey() : 0;
  }

  void post_send(size_t i) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    provider::Qp* qp = qps_[w.qp];
    record_.send_posted_ns[i] = now();
    if (qp == nullptr) return;
    std::vector<ibv_sge> sges;
    for (const Sge& g : w.sges) sges.push_back(sge(g, w.inline_data));
    ibv_send_wr wr = {};
    wr.wr_id = kWrIdSend | i;
    wr.sg_list = sges.empty() ? nullptr : sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    wr.opcode = op_info(w.op).wr;
    wr.send_flags = (w.signaled ? IBV_SEND_SIGNALED : 0) | (w.fence ? IBV_SEND_FENCE : 0) |
                    (w.solicited ? IBV_SEND_SOLICITED : 0) | (w.inline_data ? IBV_SEND_INLINE : 0);
    wr.imm_data = w.imm;
    switch (w.op) {
      case Op::kWrite:
      case Op::kWriteImm:
      case Op::kRead:
        wr.wr.rdma.remote_addr = remote_addr(w.remote_region, w.remote_offset);
        wr.wr.rdma.rkey = w.window != kNone ? record_.window_rkey[w.window] : rkey(w.remote_region);
        // Another key byte of the same slot: a key no region has (IBA 10.6.3.1).
        if (w.fault == Fault::kBadRkey) wr.wr.rdma.rkey ^= 0x80;
        break;
      case Op::kCmpSwp:
      case Op::kFetchAdd:
        wr.wr.atomic.remote_addr = remote_addr(w.remote_region, w.remote_offset);
        wr.wr.atomic.rkey = rkey(w.remote_region);
        wr.wr.atomic.compare_add = w.compare_add;
        wr.wr.atomic.swap = w.swap;
        break;
      case Op::kSendInv:
      case Op::kLocalInv:
        if (w.window != kNone) wr.invalidate_rkey = record_.window_rkey[w.window];
        // Misuse: an MR's rkey (no window at all), or a window that was never bound.
        if (w.fault == Fault::kBadInvalidate) wr.invalidate_rkey = rkey(w.remote_region);
        if (w.fault == Fault::kUnboundInv && windows_[w.window] != nullptr)
          wr.invalidate_rkey = windows_[w.window]->rkey();
        break;
      case Op::kBindMw: {
        provider::Mw* mw = windows_[w.window];
        if (mw == nullptr) break;
        // ibv_inc_rkey: a new key byte for every bind, so a stale rkey never matches again.
        const uint32_t next = ibv_inc_rkey(mw->rkey());
        record_.window_rkey[w.window] = next;
        wr.bind_mw.mw = &window_handles_[w.window];
        wr.bind_mw.rkey = next;
        wr.bind_mw.bind_info.mr = &regions_[w.remote_region].handle;
        wr.bind_mw.bind_info.addr = remote_addr(w.remote_region, w.remote_offset);
        wr.bind_mw.bind_info.length = w.bind_length;
        wr.bind_mw.bind_info.mw_access_flags = kWindowAccess;
        break;
      }
      default:
        break;
    }
    if (q.type == IBV_QPT_UD) {
      const uint32_t dest_host = s_.qps[w.ud_dest].host;
      wr.wr.ud.ah = &ahs_[q.host * hosts_.size() + dest_host];
      wr.wr.ud.remote_qpn = record_.qp_num[w.ud_dest];
      wr.wr.ud.remote_qkey = kQkey;
    }
    ibv_send_wr* bad = nullptr;
    const provider::Status st = qp->post_send(&wr, &bad);
    if (!st.ok())
      post_errors_.push_back({"post", "post_send of send #" + std::to_string(i) +
                                          " failed with errno " + std::to_string(st.error())});
  }

  void post_recv(size_t i) {
    const RecvSpec& v = s_.recvs[i];
    record_.recv_posted_ns[i] = now();
    std::vector<ibv_sge> sges;
    for (const Sge& g : v.sges) sges.push_back(sge(g, false));
    ibv_recv_wr wr = {};
    wr.wr_id = kWrIdRecv | i;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    ibv_recv_wr* bad = nullptr;
    provider::Status st;
    if (v.qp != kNone) {
      if (qps_[v.qp] == nullptr) return;
      st = qps_[v.qp]->post_recv(&wr, &bad);
    } else {
      if (hosts_[v.srq_host]->srq == nullptr) return;
      st = hosts_[v.srq_host]->srq->post_recv(&wr, &bad);
    }
    if (!st.ok())
      post_errors_.push_back({"post", "post_recv of recv #" + std::to_string(i) +
                                          " failed with errno " + std::to_string(st.error())});
  }

  // ---- the application loop ----
  void poll_cqs() {
    ibv_wc wcs[32];
    for (const auto& h : hosts_) {
      for (provider::Cq* cq : {h->send_cq, h->recv_cq}) {
        if (cq == nullptr) continue;
        for (int n; (n = cq->poll(32, wcs)) > 0;) {
          for (int k = 0; k < n; ++k) on_completion(*h, cq == h->recv_cq, wcs[k]);
        }
      }
    }
  }

  void on_completion(const Host& h, bool recv, const ibv_wc& wc) {
    const ObservedCompletion c{now(), h.id, recv, wc};
    record_.completions.push_back(c);
    hash_.value(uint8_t{2});
    hash_.value(c.time_ns);
    hash_.value(c.host);
    hash_.value(c.recv_cq);
    hash_.value(wc.wr_id);
    hash_.value(wc.status);
    hash_.value(wc.opcode);
    hash_.value(wc.byte_len);
    hash_.value(wc.qp_num);
    hash_.value(wc.src_qp);
    hash_.value(wc.wc_flags);
    hash_.value(wc.imm_data);  // or invalidated_rkey: keys are seeded, so they replay too
    const uint64_t index = wc.wr_id & ~kWrIdKindMask;
    if (!recv && (wc.wr_id & kWrIdKindMask) == kWrIdSend && index < send_status_.size())
      if (send_status_[index] < 0) send_status_[index] = wc.status;
    if (o_.trace_out)
      *o_.trace_out << "t=" << c.time_ns << " cqe host " << h.id << (recv ? " rcq" : " scq")
                    << " wr_id 0x" << std::hex << wc.wr_id << std::dec << " "
                    << ibv_wc_status_str(wc.status) << " opcode " << wc.opcode << " len "
                    << wc.byte_len << " qpn " << wc.qp_num << "\n";
  }

  void on_event(const net::SimEvent& e) {
    record_event(e);
    hash_.value(uint8_t{1});
    hash_.value(e.time_ns);
    hash_.value(e.kind);
    hash_.value(e.packet_id);
    hash_.value(e.copy);
    hash_.value(e.src);
    hash_.value(e.dst);
    hash_.value(e.length);
    hash_.value(e.detail);
    if (o_.trace_out) *o_.trace_out << to_string(e) << "\n";
  }

  // The network trace for the checker: each datagram's transport header (decoded from its
  // bytes, which go into the hash too) and the times its intact copies arrived.
  void record_event(const net::SimEvent& e) {
    switch (e.kind) {
      case net::SimEventKind::kSend: {
        const std::vector<uint8_t>& bytes = hosts_[e.src]->io->current();
        hash_.bytes(bytes.data(), bytes.size());
        TracedDatagram d;
        d.src_host = e.src;
        d.dst_host = e.dst;
        d.sent_ns = e.time_ns;
        if (!decode_datagram(bytes.data(), bytes.size(), d)) d.opcode = 0xff;
        datagram_of_[e.packet_id] = record_.datagrams.size();
        record_.datagrams.push_back(d);
        if (o_.trace_out)
          *o_.trace_out << "  #" << e.packet_id << " opcode 0x" << std::hex << int{d.opcode}
                        << " dest_qp 0x" << d.dest_qpn << " psn 0x" << d.psn
                        << (d.has_aeth ? " syndrome 0x" : "") << std::dec;
        if (o_.trace_out && d.has_aeth) *o_.trace_out << std::hex << int{d.syndrome} << std::dec;
        if (o_.trace_out) *o_.trace_out << "\n";
        break;
      }
      case net::SimEventKind::kCorrupt:
        corrupted_.insert({e.packet_id, e.copy});
        break;
      case net::SimEventKind::kDropRxFull:
      case net::SimEventKind::kDropQueueFull:
        ++record_.overflow_drops;
        break;
      case net::SimEventKind::kDeliver: {
        const auto it = datagram_of_.find(e.packet_id);
        if (it != datagram_of_.end() && !corrupted_.count({e.packet_id, e.copy}))
          record_.datagrams[it->second].delivered_ns.push_back(e.time_ns);
        break;
      }
      default:
        break;
    }
  }

  // Can the head send of QP q be posted now? Sets blocked_ when its dependency failed.
  bool head_ready(uint32_t q) {
    if (blocked_[q] || cursor_[q] >= by_qp_[q].size()) return false;
    const SendSpec& w = s_.sends[by_qp_[q][cursor_[q]]];
    // The dependency first: a QP blocked behind a failed one is blocked whatever the time.
    if (w.after != kNone) {
      const int st = send_status_[w.after];
      if (st < 0) {
        // Still waiting — unless it can never be posted: its own QP is blocked behind it.
        const uint32_t dq = s_.sends[w.after].qp;
        if (!record_.send_posted_ns[w.after] && blocked_[dq]) blocked_[q] = true;
        return false;
      }
      if (st != IBV_WC_SUCCESS) {
        blocked_[q] = true;
        return false;
      }
    }
    return w.post_ns <= now();
  }

  bool postable_now() {
    if (next_recv_ < recv_order_.size() && s_.recvs[recv_order_[next_recv_]].post_ns <= now())
      return true;
    for (uint32_t q = 0; q < s_.qps.size(); ++q)
      if (head_ready(q)) return true;
    return false;
  }

  void post_due() {
    // Receives first: at equal times an application posts its buffers before it sends.
    while (next_recv_ < recv_order_.size() && s_.recvs[recv_order_[next_recv_]].post_ns <= now())
      post_recv(recv_order_[next_recv_++]);
    // Sends in the scenario's global order (which respects every dependency).
    bool progress = true;
    while (progress) {
      progress = false;
      for (uint32_t q = 0; q < s_.qps.size(); ++q)
        while (head_ready(q)) {
          post_send(by_qp_[q][cursor_[q]++]);
          progress = true;
        }
    }
  }

  // The next virtual time at which something becomes postable by time alone.
  uint64_t next_post_time() {
    uint64_t t = net::kNever;
    if (next_recv_ < recv_order_.size()) t = std::min(t, s_.recvs[recv_order_[next_recv_]].post_ns);
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (blocked_[q] || cursor_[q] >= by_qp_[q].size()) continue;
      const SendSpec& w = s_.sends[by_qp_[q][cursor_[q]]];
      if (w.after == kNone || send_status_[w.after] >= 0) t = std::min(t, w.post_ns);
    }
    return t;
  }

  bool all_done() {
    if (next_recv_ < recv_order_.size()) return false;
    // Discover every QP blocked behind a failed dependency, transitively (to a fixed point).
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t q = 0; q < s_.qps.size(); ++q) {
        const bool was = blocked_[q];
        head_ready(q);
        changed |= blocked_[q] != was;
      }
    }
    for (uint32_t q = 0; q < s_.qps.size(); ++q)
      if (cursor_[q] < by_qp_[q].size() && !blocked_[q]) return false;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (record_.send_posted_ns[i] && (w.signaled || s_.qps[w.qp].sq_sig_all) &&
          send_status_[i] < 0)
        return false;
    }
    return true;
  }

  void drive() {
    by_qp_.assign(s_.qps.size(), {});
    for (size_t i = 0; i < s_.sends.size(); ++i) by_qp_[s_.sends[i].qp].push_back(i);
    cursor_.assign(s_.qps.size(), 0);
    blocked_.assign(s_.qps.size(), false);
    for (size_t i = 0; i < s_.recvs.size(); ++i) recv_order_.push_back(i);
    std::stable_sort(recv_order_.begin(), recv_order_.end(),
                     [&](size_t a, size_t b) { return s_.recvs[a].post_ns < s_.recvs[b].post_ns; });

    // A peer that never answers: moved to ERR before anything is posted.
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (!s_.qps[q].dead || qps_[q] == nullptr) continue;
      ibv_qp_attr a = {};
      a.qp_state = IBV_QPS_ERR;
      const provider::Status r = qps_[q]->modify(a, IBV_QP_STATE);
      if (!r.ok()) fail_setup("modify_qp ERR of dead qp " + std::to_string(q), r.error());
    }
    const uint64_t steps_at_start = world_.steps();
    for (;;) {
      post_due();
      poll_cqs();
      if (all_done()) {
        record_.finished = true;
        break;
      }
      if (now() >= o_.deadline_ns) {
        record_.stall = "virtual deadline " + std::to_string(o_.deadline_ns) + " ns reached";
        break;
      }
      const uint64_t used = world_.steps() - steps_at_start;
      if (used >= o_.max_steps) {
        record_.stall = "step limit " + std::to_string(o_.max_steps) + " reached";
        break;
      }
      const uint64_t next = next_post_time();
      const uint64_t until = std::min(next, o_.deadline_ns);
      const net::RunOutcome out = world_.run_until(
          [&] {
            poll_cqs();
            return all_done() || postable_now();
          },
          until, o_.max_steps - used);
      if (out == net::RunOutcome::kIdle) {
        // The last step may have completed the WR something waited on.
        if (postable_now()) continue;
        const uint64_t again = next_post_time();
        if (again == net::kNever) {
          record_.stall =
              "idle: nothing in flight, no timer, nothing left to post, but " + pending_summary();
          break;
        }
        clock().set(std::max(again, now()));
      }
    }
    if (!record_.finished && record_.stall.find("never completed") == std::string::npos)
      record_.stall += "; " + pending_summary();

    // Settle, then the final drain: every QP to ERR; every leftover WR must flush.
    world_.run_until(
        [&] {
          poll_cqs();
          return false;
        },
        now() + kSettleNs, o_.max_steps);
    record_.drain_ns = now();
    for (uint32_t q = 0; q < qps_.size(); ++q) {
      if (qps_[q] == nullptr) continue;
      const ibv_qp_state st = qps_[q]->state();
      if (st == IBV_QPS_ERR || st == IBV_QPS_RESET) continue;
      ibv_qp_attr a = {};
      a.qp_state = IBV_QPS_ERR;
      const provider::Status r = qps_[q]->modify(a, IBV_QP_STATE);
      if (!r.ok()) fail_setup("modify_qp ERR of qp " + std::to_string(q), r.error());
    }
    world_.run_until(
        [&] {
          poll_cqs();
          return false;
        },
        now() + kSettleNs, o_.max_steps);
    poll_cqs();
  }

  std::string pending_summary() {
    size_t waiting = 0;
    std::string first;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (record_.send_posted_ns[i] && (w.signaled || s_.qps[w.qp].sq_sig_all) &&
          send_status_[i] < 0) {
        if (waiting++ == 0)
          first = "send #" + std::to_string(i) + " (" + op_info(w.op).name + " on qp " +
                  std::to_string(w.qp) + ")";
      }
    }
    std::string heads;
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (blocked_[q] || cursor_[q] >= by_qp_[q].size()) continue;
      const size_t i = by_qp_[q][cursor_[q]];
      const SendSpec& w = s_.sends[i];
      heads += "; qp " + std::to_string(q) + " waits to post send #" + std::to_string(i);
      if (w.after != kNone)
        heads += " after #" + std::to_string(w.after) +
                 (record_.send_posted_ns[w.after] ? " (posted, status " : " (unposted, status ") +
                 std::to_string(send_status_[w.after]) + ")";
    }
    return std::to_string(waiting) + " signaled sends never completed" +
           (waiting ? ", first " + first : "") + heads;
  }

  RunResult finish() {
    RunResult r;
    for (uint32_t i = 0; i < regions_.size(); ++i) {
      const Region& reg = regions_[i];
      record_.memory.emplace_back(reg.mem.get(), reg.mem.get() + reg.total);
      hash_.bytes(reg.mem.get(), reg.total);
    }
    r.end_ns = now();
    r.steps = world_.steps();
    r.network = world_.network().counters();
    for (const auto& h : hosts_) r.engines.push_back(h->engine->counters());
    r.violations = post_errors_;
    std::vector<Violation> v = sim::check(s_, record_);
    r.violations.insert(r.violations.end(), v.begin(), v.end());
    r.trace_hash = hash_.digest();
    r.record = std::move(record_);
    return r;
  }

  const Scenario& s_;
  const RunOptions& o_;
  net::SimWorld world_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::vector<Region> regions_;
  std::vector<provider::Qp*> qps_;
  std::vector<provider::Mw*> windows_;
  std::deque<ibv_mw> window_handles_;
  std::vector<ibv_ah> ahs_;
  RunRecord record_;
  std::vector<int> send_status_;  // first completion status per send, -1 = none yet
  std::vector<std::vector<size_t>> by_qp_;
  std::vector<size_t> cursor_;
  std::vector<bool> blocked_;
  std::vector<size_t> recv_order_;
  size_t next_recv_ = 0;
  std::vector<Violation> post_errors_;
  TraceHash hash_;
  std::map<uint64_t, size_t> datagram_of_;  // network packet id → record_.datagrams index
  std::set<std::pair<uint64_t, uint8_t>> corrupted_;  // (packet id, copy)
};

}  // namespace

net::SimOptions sim_options(const Scenario& s) {
  const FaultProfile& f = s.config.faults;
  net::SimOptions o;
  o.seed = s.seed * 0x9e3779b97f4a7c15 + 0x51;  // the network's stream, apart from the scenario's
  static_cast<net::FaultRates&>(o) = f;
  for (const PartitionSpec& p : f.partitions) {
    net::SimPartition cut;
    cut.start_ns = p.start_ns;
    cut.end_ns = p.start_ns + p.duration_ns;
    cut.a = net::HostSet{0};
    for (uint32_t h = 1; h < s.config.hosts; ++h) cut.b.insert(h);
    o.partitions.push_back(cut);
  }
  return o;
}

RunResult run_scenario(const Scenario& scenario, const RunOptions& options) {
  return Cluster(scenario, options).run();
}

}  // namespace urdma::sim
