#include "daemon/cm_agent.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace urdma::daemon {

namespace {

std::optional<wire::CmMessage> parse(std::span<const uint8_t> mad) {
  if (mad.size() < wire::kMadSize) return std::nullopt;
  const wire::CmParse p = wire::parse_cm(mad.first(wire::kMadSize));
  if (!p.ok()) return std::nullopt;
  return p.message;
}

template <typename View>
View start(CmMad& mad, uint64_t transaction_id) {
  return wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(mad), transaction_id);
}

}  // namespace

std::optional<CmMad> no_listener_reply(std::span<const uint8_t> mad) {
  const auto m = parse(mad);
  if (!m) return std::nullopt;
  const uint64_t tid = m->header.transaction_id();
  CmMad out{};
  if (const auto* req = std::get_if<wire::CmReqView>(&m->view)) {
    // Linux cm_issue_rej: the REJ's comm IDs are the request's swapped (a REQ's remote comm ID
    // is reserved, zero), no ARI, no private data.
    auto rej = start<wire::CmRej>(out, tid);
    rej.set_local_comm_id(0);
    rej.set_remote_comm_id(req->local_comm_id());
    rej.set_message_rejected(static_cast<uint8_t>(wire::CmRejMessage::kReq));
    rej.set_reason(static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
    return out;
  }
  if (const auto* sidr = std::get_if<wire::CmSidrReqView>(&m->view)) {
    // Linux cm_reject_sidr_req → cm_format_sidr_rep: the request ID and service ID echoed,
    // QPN and Q_Key 0.
    auto rep = start<wire::CmSidrRep>(out, tid);
    rep.set_request_id(sidr->request_id());
    rep.set_status(static_cast<uint8_t>(wire::CmSidrStatus::kUnsupported));
    rep.set_service_id(sidr->service_id());
    return out;
  }
  return std::nullopt;
}

std::optional<CmMad> orphan_drep(std::span<const uint8_t> mad) {
  const auto m = parse(mad);
  if (!m) return std::nullopt;
  const auto* dreq = std::get_if<wire::CmDreqView>(&m->view);
  if (!dreq) return std::nullopt;
  CmMad out{};
  auto drep = start<wire::CmDrep>(out, m->header.transaction_id());
  drep.set_local_comm_id(dreq->remote_comm_id());
  drep.set_remote_comm_id(dreq->local_comm_id());
  return out;
}

CmMad build_dreq(const PeerConn& c, uint64_t transaction_id) {
  CmMad out{};
  auto dreq = start<wire::CmDreq>(out, transaction_id);
  dreq.set_local_comm_id(c.local_comm_id);
  dreq.set_remote_comm_id(c.remote_comm_id);
  dreq.set_remote_qpn_eecn(c.remote_qpn);
  return out;
}

size_t build_gmp(std::span<uint8_t, kGmpDatagramSize> buf, std::span<const uint8_t> mad,
                 uint32_t psn, const net::Address& src, uint16_t src_port, const net::Address& dst,
                 uint16_t dst_port) {
  auto built = wire::build_packet(buf, wire::op::kUdSendOnly, mad.first(wire::kMadSize));
  if (!built) return 0;
  auto bth = built->headers.bth();
  bth.set_pkey(wire::kDefaultPkey);
  bth.set_dest_qp(wire::kMadGsiQpn);
  bth.set_ack_req(1);  // as Linux (rxe) sends its MADs
  bth.set_psn(psn & wire::kQpnMask);
  auto deth = *built->headers.deth();
  deth.set_qkey(wire::kMadGsiQKey);
  deth.set_src_qp(wire::kMadGsiQpn);
  if (src.is_v4() && dst.is_v4()) {
    wire::IcrcIpv4 h;
    std::copy_n(src.bytes().begin() + 12, 4, h.flow.src_addr.begin());
    std::copy_n(dst.bytes().begin() + 12, 4, h.flow.dst_addr.begin());
    h.flow.udp_src_port = src_port;
    h.flow.udp_dst_port = dst_port;
    wire::seal_icrc(h, built->datagram);
  } else {
    wire::IcrcIpv6 h;
    h.src_addr = src.bytes();
    h.dst_addr = dst.bytes();
    h.udp_src_port = src_port;
    h.udp_dst_port = dst_port;
    wire::seal_icrc(h, built->datagram);
  }
  return built->datagram.size();
}

bool icrc_ok(std::span<const uint8_t> datagram, const net::Endpoint& src,
             const net::Endpoint& dst) {
  if (src.address.is_v4() && dst.address.is_v4()) {
    wire::IcrcIpv4Flow flow;
    std::copy_n(src.address.bytes().begin() + 12, 4, flow.src_addr.begin());
    std::copy_n(dst.address.bytes().begin() + 12, 4, flow.dst_addr.begin());
    flow.udp_src_port = src.port;
    flow.udp_dst_port = dst.port;
    return wire::verify_icrc_ipv4(flow, datagram, wire::Ipv4DfSearch::kSetOnly).ok;
  }
  wire::IcrcIpv6 h;
  h.src_addr = src.address.bytes();
  h.dst_addr = dst.address.bytes();
  h.udp_src_port = src.port;
  h.udp_dst_port = dst.port;
  return wire::verify_icrc_ipv6(h, datagram);
}

// --- ConnTable ------------------------------------------------------------------------------

void ConnTable::observe(unsigned slot, const net::Address& peer, const net::Address& local,
                        std::span<const uint8_t> mad) {
  const auto m = parse(mad);
  if (!m) return;
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, wire::CmReqView>) {
          // Passive side, step 1: the peer's QPN, until the RTU names our comm ID.
          Slot& s = slots_[slot];
          s.pending[{peer.bytes(), v.local_comm_id()}] =
              Pending{.remote_qpn = v.local_qpn(), .order = ++order_};
          if (s.pending.size() > kMaxPendingReqs) {
            s.pending.erase(std::min_element(
                s.pending.begin(), s.pending.end(),
                [](const auto& a, const auto& b) { return a.second.order < b.second.order; }));
          }
        } else if constexpr (std::is_same_v<V, wire::CmRtuView>) {
          const auto it = slots_.find(slot);
          if (it == slots_.end()) return;
          const auto p = it->second.pending.find({peer.bytes(), v.local_comm_id()});
          if (p == it->second.pending.end()) return;
          establish(it->second, PeerConn{.local_comm_id = v.remote_comm_id(),
                                         .remote_comm_id = v.local_comm_id(),
                                         .remote_qpn = p->second.remote_qpn,
                                         .local = local,
                                         .peer = peer});
          it->second.pending.erase(p);
        } else if constexpr (std::is_same_v<V, wire::CmRepView>) {
          // Active side: the REP carries everything; the process answers with its RTU.
          establish(slots_[slot], PeerConn{.local_comm_id = v.remote_comm_id(),
                                           .remote_comm_id = v.local_comm_id(),
                                           .remote_qpn = v.local_qpn(),
                                           .local = local,
                                           .peer = peer});
        } else if constexpr (std::is_same_v<V, wire::CmRejView>) {
          forget(slot, v.remote_comm_id(), v.local_comm_id());
          const auto it = slots_.find(slot);
          if (it != slots_.end()) it->second.pending.erase({peer.bytes(), v.local_comm_id()});
        } else if constexpr (std::is_same_v<V, wire::CmDreqView> ||
                             std::is_same_v<V, wire::CmDrepView>) {
          // The peer releases it (the process answers), or answers the process's DREQ: a DREQ
          // repeated after the process died is answered by the daemon (orphan_drep).
          forget(slot, v.remote_comm_id(), v.local_comm_id());
        }
      },
      m->view);
}

void ConnTable::establish(Slot& s, const PeerConn& c) {
  if (s.conns.size() >= kMaxConns && !s.conns.contains(c.local_comm_id)) return;
  s.conns[c.local_comm_id] = c;
}

void ConnTable::forget(unsigned slot, uint32_t local_comm_id, uint32_t remote_comm_id) {
  const auto it = slots_.find(slot);
  if (it == slots_.end()) return;
  const auto c = it->second.conns.find(local_comm_id);
  // A REJ may carry Local Comm ID 0 (a sender that never learnt its own, Linux cm_issue_rej).
  if (c != it->second.conns.end() &&
      (remote_comm_id == 0 || c->second.remote_comm_id == remote_comm_id))
    it->second.conns.erase(c);
}

std::vector<PeerConn> ConnTable::reclaim(unsigned slot) {
  std::vector<PeerConn> out;
  const auto it = slots_.find(slot);
  if (it == slots_.end()) return out;
  for (const auto& [id, c] : it->second.conns) out.push_back(c);
  slots_.erase(it);
  return out;
}

size_t ConnTable::established(unsigned slot) const {
  const auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.conns.size();
}

// --- Releases -------------------------------------------------------------------------------

void Releases::sent(const Dreq& d, int64_t now_ms) {
  if (entries_.size() >= kMax && !entries_.contains(d.conn.local_comm_id)) return;
  entries_[d.conn.local_comm_id] =
      Entry{.dreq = d, .deadline_ms = now_ms + kTimeoutMs, .retries_left = kRetries};
}

bool Releases::take_drep(const net::Address& peer, std::span<const uint8_t> mad) {
  if (entries_.empty()) return false;
  const auto m = parse(mad);
  if (!m) return false;
  const auto* drep = std::get_if<wire::CmDrepView>(&m->view);
  if (!drep) return false;
  const auto it = entries_.find(drep->remote_comm_id());
  if (it == entries_.end() || it->second.dreq.conn.remote_comm_id != drep->local_comm_id() ||
      it->second.dreq.conn.peer != peer)
    return false;
  entries_.erase(it);
  return true;
}

std::vector<Releases::Dreq> Releases::due(int64_t now_ms) {
  std::vector<Dreq> out;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (e.deadline_ms > now_ms) {
      ++it;
    } else if (e.retries_left == 0) {
      it = entries_.erase(it);  // the peer is gone too, or will time out its connection
    } else {
      --e.retries_left;
      e.deadline_ms = now_ms + kTimeoutMs;
      out.push_back(e.dreq);
      ++it;
    }
  }
  return out;
}

std::optional<int64_t> Releases::next_deadline_ms() const {
  std::optional<int64_t> next;
  for (const auto& [id, e] : entries_)
    if (!next || e.deadline_ms < *next) next = e.deadline_ms;
  return next;
}

}  // namespace urdma::daemon
