#include "daemon/cm_agent.h"

#include <algorithm>
#include <cerrno>
#include <type_traits>
#include <variant>

#include "daemon/mad_router.h"
#include "wire/cm.h"

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

std::optional<CmMad> wait_mra(std::span<const uint8_t> mad, int64_t wait_ms) {
  const auto m = parse(mad);
  if (!m) return std::nullopt;
  const auto* req = std::get_if<wire::CmReqView>(&m->view);
  if (!req) return std::nullopt;
  // Linux cm_convert_to_ms: 4.096 µs × 2^t is taken as 2^(t-8) ms; the 5-bit field's largest
  // value (31: 2^23 ms) bounds it.
  constexpr unsigned kMsBase = 8, kMaxTimeout = 31;
  unsigned t = kMsBase;
  while (t < kMaxTimeout && (int64_t{1} << (t - kMsBase)) < wait_ms) ++t;
  CmMad out{};
  auto mra = start<wire::CmMra>(out, m->header.transaction_id());
  mra.set_local_comm_id(0);
  mra.set_remote_comm_id(req->local_comm_id());
  mra.set_message_mraed(static_cast<uint8_t>(wire::CmMraMessage::kReq));
  mra.set_service_timeout(static_cast<uint8_t>(t));
  return out;
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

// --- ListenWaits ----------------------------------------------------------------------------

ListenWaits::Added ListenWaits::add(uint64_t service_id, std::span<const uint8_t> datagram,
                                    std::span<const uint8_t> mad, const net::Endpoint& src,
                                    const net::Endpoint& dst, int64_t now_ms,
                                    std::optional<CmMad>* mra) {
  const auto m = parse(mad);
  if (!m) return Added::kNotRequest;
  Key key{.requester = src.address};
  if (const auto* req = std::get_if<wire::CmReqView>(&m->view)) {
    key.id = req->local_comm_id();
  } else if (const auto* sidr = std::get_if<wire::CmSidrReqView>(&m->view)) {
    key.sidr = true;
    key.id = sidr->request_id();
  } else {
    return Added::kNotRequest;
  }
  if (const auto it = by_key_.find(key); it != by_key_.end()) {
    // The requester's timer fired while its request waits: an MRA for the rest of the wait (a
    // SIDR_REQ has none; its retransmission is simply the same request).
    const int64_t left = entries_.at(it->second).request.deadline_ms - now_ms;
    if (mra && !key.sidr) *mra = wait_mra(mad, std::max<int64_t>(left, 1));
    return Added::kDuplicate;
  }
  size_t& from_requester = per_requester_[key.requester];
  if (by_key_.size() >= kMax || from_requester >= kMaxPerRequester) {
    if (from_requester == 0) per_requester_.erase(key.requester);
    return Added::kFull;
  }
  ++from_requester;
  const uint64_t seq = next_seq_++;
  by_key_.emplace(key, seq);
  entries_.emplace(seq, Entry{.key = key,
                              .request = Request{.service_id = service_id,
                                                 .src = src,
                                                 .dst = dst,
                                                 .datagram = {datagram.begin(), datagram.end()},
                                                 .deadline_ms = now_ms + wait_ms_}});
  return Added::kWaiting;
}

void ListenWaits::forget(const Key& k) {
  by_key_.erase(k);
  const auto it = per_requester_.find(k.requester);
  if (it != per_requester_.end() && --it->second == 0) per_requester_.erase(it);
}

std::vector<ListenWaits::Request> ListenWaits::take(uint64_t service_id) {
  std::vector<Request> out;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.request.service_id != service_id) {
      ++it;
      continue;
    }
    forget(it->second.key);
    out.push_back(std::move(it->second.request));
    it = entries_.erase(it);
  }
  return out;
}

std::vector<ListenWaits::Request> ListenWaits::expired(int64_t now_ms) {
  std::vector<Request> out;
  while (!entries_.empty() && entries_.begin()->second.request.deadline_ms <= now_ms) {
    forget(entries_.begin()->second.key);
    out.push_back(std::move(entries_.begin()->second.request));
    entries_.erase(entries_.begin());
  }
  return out;
}

std::optional<int64_t> ListenWaits::next_deadline_ms() const {
  if (entries_.empty()) return std::nullopt;
  return entries_.begin()->second.request.deadline_ms;
}

// --- ConnTable ------------------------------------------------------------------------------

int ConnTable::add(unsigned slot, const PeerConn& c) {
  if (slot_of_comm_id(c.local_comm_id) != slot) return EINVAL;
  auto& conns = slots_[slot];
  if (conns.size() >= kMaxConnsPerSlot && !conns.contains(c.local_comm_id)) return ENOSPC;
  conns[c.local_comm_id] = c;
  return 0;
}

int ConnTable::remove(unsigned slot, uint32_t local_comm_id) {
  const auto it = slots_.find(slot);
  if (it == slots_.end() || it->second.erase(local_comm_id) == 0) return ENOENT;
  return 0;
}

std::vector<PeerConn> ConnTable::reclaim(unsigned slot) {
  std::vector<PeerConn> out;
  const auto it = slots_.find(slot);
  if (it == slots_.end()) return out;
  for (const auto& [id, c] : it->second) out.push_back(c);
  slots_.erase(it);
  return out;
}

size_t ConnTable::established(unsigned slot) const {
  const auto it = slots_.find(slot);
  return it == slots_.end() ? 0 : it->second.size();
}

// --- Releases -------------------------------------------------------------------------------

bool Releases::add(const Dreq& d, int64_t now_ms) {
  if (entries_.size() >= kMax && !entries_.contains(d.conn.local_comm_id)) return false;
  entries_[d.conn.local_comm_id] =
      Entry{.dreq = d, .deadline_ms = now_ms, .sends_left = 1 + kRetries};
  return true;
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
  tokens_ = std::min(kBurst, tokens_ + (now_ms - refilled_ms_) * kPerSecond / 1000);
  refilled_ms_ = now_ms;
  std::vector<Dreq> out;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (e.deadline_ms > now_ms) {
      ++it;
    } else if (e.sends_left == 0) {
      it = entries_.erase(it);  // the peer is gone too, or will time out its connection
    } else if (tokens_ > 0) {
      --tokens_;
      --e.sends_left;
      e.deadline_ms = now_ms + kTimeoutMs;
      ++e.dreq.sends;
      out.push_back(e.dreq);
      ++it;
    } else {
      ++it;  // due, waiting for the pace
    }
  }
  return out;
}

std::optional<int64_t> Releases::next_deadline_ms() const {
  std::optional<int64_t> next;
  for (const auto& [id, e] : entries_)
    if (!next || e.deadline_ms < *next) next = e.deadline_ms;
  // Due but paced: when the next token comes.
  if (next && tokens_ == 0) next = std::max(*next, refilled_ms_ + 1000 / kPerSecond);
  return next;
}

}  // namespace urdma::daemon
