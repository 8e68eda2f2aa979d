#include "cm/manager.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <variant>

#include "base/check.h"
#include "daemon/mad_router.h"
#include "net/prng.h"
#include "wire/byte_order.h"

namespace urdma::cm {
namespace {

using provider::Status;
using wire::CmRejMessage;
using wire::CmRejReason;

constexpr uint32_t kIdLowMask = (1u << daemon::kCommIdSlotShift) - 1;
constexpr uint32_t kMask24 = 0xFFFFFF;

template <typename View>
View start(Mad& mad, uint64_t tid) {
  return wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(mad), tid);
}

wire::MadHeaderView header_of(const Mad& mad) {
  return wire::MadHeaderView(
      std::span<const uint8_t, wire::kMadHeaderSize>(mad.data(), wire::kMadHeaderSize));
}
bool is_sidr_req(const Mad& mad) {
  return static_cast<wire::CmAttr>(header_of(mad).attribute_id()) == wire::CmAttr::kSidrReq;
}

template <size_t N>
std::vector<uint8_t> tail(std::span<const uint8_t, N> area, size_t skip = 0) {
  return std::vector<uint8_t>(area.begin() + static_cast<ptrdiff_t>(skip), area.end());
}

// The rdma_cm IP header of a REQ / SIDR_REQ for this service ID: required in the IP port
// spaces (cma.c rejects a REQ whose header it cannot read), optional for RDMA_PS_IB (AF_IB
// sends none; an IP-addressed id in that space does).
struct IpHeader {
  bool ok = true;
  std::optional<wire::CmaAddress> address;
};
IpHeader read_ip_header(uint64_t service_id, std::span<const uint8_t> private_data) {
  const auto sid = wire::decode_rdma_service_id(service_id);
  if (!sid) return {};
  const wire::CmaHdrParse p = wire::parse_cma_hdr(private_data);
  if (p.ok()) return {true, p.address};
  return {sid->port_space == wire::RdmaPortSpace::kIb, std::nullopt};
}

bool is_rdma_resource_ok(uint8_t requested, uint8_t device_max) {
  return requested == kMaxResources || requested <= device_max;
}

}  // namespace

std::string_view state_name(State s) {
  switch (s) {
    case State::kIdle:
      return "idle";
    case State::kReqSent:
      return "REQ sent";
    case State::kReqRcvd:
      return "REQ rcvd";
    case State::kMraReqSent:
      return "MRA(REQ) sent";
    case State::kMraReqRcvd:
      return "MRA(REQ) rcvd";
    case State::kRepSent:
      return "REP sent";
    case State::kRepRcvd:
      return "REP rcvd";
    case State::kMraRepSent:
      return "MRA(REP) sent";
    case State::kMraRepRcvd:
      return "MRA(REP) rcvd";
    case State::kEstablished:
      return "established";
    case State::kDreqSent:
      return "DREQ sent";
    case State::kDreqRcvd:
      return "DREQ rcvd";
    case State::kTimewait:
      return "timewait";
    case State::kSidrReqSent:
      return "SIDR_REQ sent";
    case State::kSidrReqRcvd:
      return "SIDR_REQ rcvd";
  }
  return "unknown";
}

std::string_view event_name(EventType t) {
  switch (t) {
    case EventType::kConnectRequest:
      return "connect request";
    case EventType::kConnectResponse:
      return "connect response";
    case EventType::kEstablished:
      return "established";
    case EventType::kRejected:
      return "rejected";
    case EventType::kUnreachable:
      return "unreachable";
    case EventType::kDisconnected:
      return "disconnected";
    case EventType::kTimewaitExit:
      return "timewait exit";
    case EventType::kSidrRequest:
      return "SIDR request";
    case EventType::kSidrResponse:
      return "SIDR response";
  }
  return "unknown";
}

Manager::Manager(const ManagerConfig& config, const net::Clock& clock)
    : config_(config), clock_(clock), psn_random_(config.random) {
  if (!psn_random_) {
    psn_random_ = [rng = net::SplitMix64(config.seed ^ 0x5053'4e00'0000'0000ULL)]() mutable {
      return rng.next();
    };
  }
  base::check(config.slot < (1u << (32 - daemon::kCommIdSlotShift)), "cm: slot out of range");
  next_low_id_ = static_cast<uint32_t>(net::SplitMix64(config.seed).next()) & kIdLowMask;
}

// --- bookkeeping ----------------------------------------------------------------------------

ConnId Manager::allocate_id() {
  for (;;) {
    next_low_id_ = (next_low_id_ + 1) & kIdLowMask;
    const ConnId id = daemon::comm_id_for_slot(config_.slot, next_low_id_);
    if (id != 0 && !conns_.contains(id)) return id;
  }
}

Manager::Conn* Manager::find(ConnId id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}
const Manager::Conn* Manager::find(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

std::optional<State> Manager::state(ConnId id) const {
  const Conn* c = find(id);
  if (!c) return std::nullopt;
  return c->state;
}

std::optional<Manager::Peer> Manager::peer(ConnId id) const {
  const Conn* c = find(id);
  if (!c || !c->remote_known) return std::nullopt;
  return Peer{.remote_comm_id = c->remote_id,
              .remote_qpn = c->remote_qpn,
              .local_gid = c->local_gid,
              .remote_gid = c->remote_gid};
}

void Manager::send(const Gid& to, const Mad& mad, uint32_t dest_qpn) {
  outgoing_.push_back(OutgoingMad{to, dest_qpn, mad});
  ++counters_.sent;
}

// IBA 12.7.x: a REQ, REP, DREQ or SIDR_REQ is resent every response timeout until answered,
// at most Max CM Retries times (Linux: the MAD layer's retries = cm_id max_cm_retries).
void Manager::send_tracked(Conn& c, const Mad& mad) {
  c.tracked = mad;
  c.tracked_timeout_ns = c.timeout_ns;
  c.deadline_ns = clock_.now_ns() + c.tracked_timeout_ns;
  send(c.remote_gid, mad);
}

void Manager::resend_tracked(Conn& c) {
  c.deadline_ns = clock_.now_ns() + c.tracked_timeout_ns;
  send(c.remote_gid, *c.tracked);
}

void Manager::cancel_tracked(Conn& c) {
  c.tracked.reset();
  c.deadline_ns = net::kNever;
}

void Manager::emit(Conn& c, Event e) {
  if (c.silent) return;
  e.id = c.id;
  if (e.service_id == 0) e.service_id = c.service_id;
  events_.push_back(std::move(e));
}

// IBA 12.9.8.4 / Linux cm_enter_timewait: the QPN stays reserved for the local ACK timeout
// (cm_convert_to_ms(av.timeout)), so late packets of this connection die before it is reused.
void Manager::enter_timewait(Conn& c) {
  cancel_tracked(c);
  c.state = State::kTimewait;
  c.timewait_end_ns = clock_.now_ns() + cm_timeout_ns(c.ack_timeout);
}

void Manager::finish(Conn& c) {
  cancel_tracked(c);
  c.state = State::kIdle;
  conns_.erase(c.id);
}

std::vector<OutgoingMad> Manager::take_outgoing() {
  return std::exchange(outgoing_, {});
}
std::vector<Event> Manager::take_events() {
  return std::exchange(events_, {});
}

// Linux puts its CA GUID (big-endian, as the node GUID travels) in a REJ timeout's ARI.
std::array<uint8_t, 8> Manager::guid_ari() const {
  std::array<uint8_t, 8> g{};
  wire::store_be64(g.data(), config_.local_ca_guid);
  return g;
}

// --- message builders -----------------------------------------------------------------------

Mad Manager::build_rej(const Conn& c, uint16_t reason, CmRejMessage msg,
                       std::span<const uint8_t> ari, std::span<const uint8_t> private_data) const {
  Mad mad{};
  auto rej = start<wire::CmRej>(mad, c.active ? own_tid(c.id) : c.tid);
  rej.set_local_comm_id(c.id);
  rej.set_remote_comm_id(c.remote_id);
  rej.set_message_rejected(static_cast<uint8_t>(msg));
  rej.set_reason(reason);
  base::check(rej.set_ari(ari) == wire::MadError::kOk, "cm: ARI checked by caller");
  base::check(rej.set_private_data(private_data) == wire::MadError::kOk,
              "cm: REJ private data checked by caller");
  return mad;
}

Mad Manager::build_mra(const Conn& c, wire::CmMraMessage msg) const {
  Mad mad{};
  auto mra = start<wire::CmMra>(mad, c.active ? own_tid(c.id) : c.tid);
  mra.set_local_comm_id(c.id);
  mra.set_remote_comm_id(c.remote_id);
  mra.set_message_mraed(static_cast<uint8_t>(msg));
  mra.set_service_timeout(config_.mra_service_timeout);
  return mad;
}

Mad Manager::build_rtu(const Conn& c) const {
  Mad mad{};
  auto rtu = start<wire::CmRtu>(mad, own_tid(c.id));
  rtu.set_local_comm_id(c.id);
  rtu.set_remote_comm_id(c.remote_id);
  return mad;
}

Mad Manager::build_drep(const Conn& c, std::span<const uint8_t> private_data) const {
  Mad mad{};
  auto drep = start<wire::CmDrep>(mad, c.tid);
  drep.set_local_comm_id(c.id);
  drep.set_remote_comm_id(c.remote_id);
  base::check(drep.set_private_data(private_data) == wire::MadError::kOk,
              "cm: DREP private data checked by caller");
  return mad;
}

// A REJ for a message no connection of ours takes (Linux cm_issue_rej): the comm IDs swapped
// from the message, its transaction ID.
void Manager::send_rej_reply(const Gid& to, const Mad& request, uint32_t remote_comm_id,
                             uint32_t local_comm_id, uint16_t reason, CmRejMessage msg) {
  Mad mad{};
  const wire::MadHeaderView h(
      std::span<const uint8_t, wire::kMadHeaderSize>(request.data(), wire::kMadHeaderSize));
  auto rej = start<wire::CmRej>(mad, h.transaction_id());
  rej.set_local_comm_id(local_comm_id);
  rej.set_remote_comm_id(remote_comm_id);
  rej.set_message_rejected(static_cast<uint8_t>(msg));
  rej.set_reason(reason);
  send(to, mad);
}

// --- API ------------------------------------------------------------------------------------

Status Manager::listen(uint64_t service_id) {
  if (!listeners_.emplace(service_id, true).second) return Status(EADDRINUSE);
  claimed_.erase(service_id);
  // The requests that waited for this listen, in the order they came.
  std::vector<Waiting> served;
  std::erase_if(waiting_, [&](const Waiting& w) {
    if (w.service_id != service_id) return false;
    served.push_back(w);
    return true;
  });
  for (const Waiting& w : served) {
    if (is_sidr_req(w.mad))
      on_sidr_req(w.src, w.mad);
    else
      on_req(w.src, w.mad);
  }
  return provider::kOk;
}

Status Manager::claim(uint64_t service_id) {
  if (listeners_.contains(service_id) || !claimed_.insert(service_id).second)
    return Status(EADDRINUSE);
  return provider::kOk;
}

Status Manager::unclaim(uint64_t service_id) {
  if (!claimed_.erase(service_id)) return Status(EINVAL);
  std::vector<Waiting> refused;
  std::erase_if(waiting_, [&](const Waiting& w) {
    if (w.service_id != service_id) return false;
    refused.push_back(w);
    return true;
  });
  for (const Waiting& w : refused) {
    ++counters_.wait_expired;
    refuse_unlistened(w.src, w.mad);
  }
  return provider::kOk;
}

bool Manager::wait_for_listen(uint64_t service_id, const Gid& src, const Mad& mad) {
  if (!claimed_.contains(service_id) || config_.listen_wait_ns == 0) return false;
  const bool sidr = is_sidr_req(mad);
  const auto sender_id = [](const Mad& m, bool is_sidr) {
    return is_sidr ? wire::CmSidrReqView(m).request_id() : wire::CmReqView(m).local_comm_id();
  };
  size_t for_service = 0;
  for (const Waiting& w : waiting_) {
    if (w.service_id != service_id) continue;
    ++for_service;
    if (is_sidr_req(w.mad) != sidr || w.src != src ||
        sender_id(w.mad, sidr) != sender_id(mad, sidr))
      continue;
    if (!sidr && wire::CmReqView(w.mad).local_ca_guid() != wire::CmReqView(mad).local_ca_guid())
      continue;
    // The same request again: the requester's timer fired while it waits. A REQ is told to
    // wait the rest (IBA 12.6.6 MRA; Local Comm ID 0: we have none yet, and Linux's
    // cm_mra_handler finds the requester by the Remote Comm ID alone); a SIDR_REQ has no MRA.
    ++counters_.duplicates;
    if (!sidr) {
      const uint64_t now = clock_.now_ns();
      const uint64_t left_ms =
          w.deadline_ns > now ? (w.deadline_ns - now + 999'999) / 1'000'000 : 1;
      Mad out{};
      auto mra = start<wire::CmMra>(out, header_of(mad).transaction_id());
      mra.set_local_comm_id(0);
      mra.set_remote_comm_id(sender_id(mad, false));
      mra.set_message_mraed(static_cast<uint8_t>(wire::CmMraMessage::kReq));
      mra.set_service_timeout(cm_timeout_covering_ms(left_ms));
      send(src, out);
    }
    return true;
  }
  if (waiting_.size() >= config_.max_waiting || for_service >= config_.max_waiting_per_service) {
    ++counters_.wait_full;
    return false;
  }
  ++counters_.waited_for_listen;
  waiting_.push_back(Waiting{.service_id = service_id,
                             .src = src,
                             .mad = mad,
                             .deadline_ns = clock_.now_ns() + config_.listen_wait_ns});
  return true;
}

void Manager::refuse_unlistened(const Gid& src, const Mad& mad) {
  const uint64_t tid = header_of(mad).transaction_id();
  if (is_sidr_req(mad)) {
    // IBA 12.11.2 / Linux cm_sidr_req_handler: status 1, "service ID not supported".
    const wire::CmSidrReqView req(mad);
    Mad out{};
    auto rep = start<wire::CmSidrRep>(out, tid);
    rep.set_request_id(req.request_id());
    rep.set_status(static_cast<uint8_t>(wire::CmSidrStatus::kUnsupported));
    rep.set_service_id(req.service_id());
    send(src, out);
    return;
  }
  // IBA 12.6.7 reason 8; Linux cm_match_req → cm_issue_rej(IB_CM_REJ_INVALID_SERVICE_ID).
  send_rej_reply(src, mad, wire::CmReqView(mad).local_comm_id(), 0,
                 static_cast<uint16_t>(CmRejReason::kInvalidServiceId), CmRejMessage::kReq);
}

Status Manager::stop_listening(uint64_t service_id) {
  return listeners_.erase(service_id) ? provider::kOk : Status(EINVAL);
}

provider::Result<ConnId> Manager::connect(const ConnectParams& p) {
  const size_t pd_max = p.ip ? kRdmaReqPrivateDataMax : kReqPrivateDataMax;
  if (p.private_data.size() > pd_max) return Status(EINVAL);
  if (!is_rdma_resource_ok(p.responder_resources, config_.max_responder_resources) ||
      !is_rdma_resource_ok(p.initiator_depth, config_.max_initiator_depth))
    return Status(EINVAL);
  if (p.path.mtu < IBV_MTU_256 || p.path.mtu > config_.max_path_mtu) return Status(EINVAL);
  if (p.ip && p.ip->ip_version != wire::kCmaIpVersion4 && p.ip->ip_version != wire::kCmaIpVersion6)
    return Status(EINVAL);
  if (conns_.size() >= config_.max_connections) return Status(ENOMEM);

  Conn c;
  c.id = allocate_id();
  c.active = true;
  c.manual_rtu = p.manual_rtu;
  c.unreliable = p.unreliable;
  c.service_id = p.service_id;
  c.local_gid = p.path.local_gid;
  c.remote_gid = p.path.remote_gid;
  c.local_qpn = p.qpn & kMask24;
  c.rq_psn = p.starting_psn & kMask24;
  c.mtu = p.path.mtu;
  c.pkey = p.path.pkey;
  c.flow_label = p.path.flow_label;
  c.traffic_class = p.path.traffic_class;
  c.hop_limit = p.path.hop_limit;
  c.sl = p.path.sl;
  // librdmacm rdma_connect: RDMA_MAX_* means the device's limit.
  c.responder_resources = p.responder_resources == kMaxResources ? config_.max_responder_resources
                                                                 : p.responder_resources;
  c.initiator_depth =
      p.initiator_depth == kMaxResources ? config_.max_initiator_depth : p.initiator_depth;
  c.retry_count = std::min<uint8_t>(p.retry_count, 7);  // cma.c min_t(u8, 7, retry_count)
  c.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
  // Linux cm_init_av_by_path: the QP's ACK timeout is packet lifetime + 1; the REQ carries
  // cm_ack_timeout(the CA's ACK delay, packet lifetime).
  c.ack_timeout = static_cast<uint8_t>(std::min(p.path.packet_life_time + 1, 31));
  // Linux ib_send_cm_req: wait 2 × packet lifetime + the remote's CM response time.
  c.timeout_ns =
      2 * cm_timeout_ns(p.path.packet_life_time) + cm_timeout_ns(config_.cm_response_timeout);
  c.max_cm_retries = config_.max_cm_retries;
  c.retries_left = c.max_cm_retries;

  Mad mad{};
  auto req = start<wire::CmReq>(mad, own_tid(c.id));
  req.set_local_comm_id(c.id);
  req.set_service_id(p.service_id);
  req.set_local_ca_guid(config_.local_ca_guid);
  req.set_local_q_key(0);
  req.set_local_qpn(c.local_qpn);
  req.set_responder_resources(c.responder_resources);
  req.set_initiator_depth(c.initiator_depth);
  req.set_remote_cm_response_timeout(config_.cm_response_timeout);
  req.set_transport_service_type(
      static_cast<uint8_t>(p.unreliable ? wire::CmTransportType::kUc : wire::CmTransportType::kRc));
  req.set_end_to_end_flow_control(p.flow_control);
  req.set_starting_psn(c.rq_psn);
  req.set_local_cm_response_timeout(config_.cm_response_timeout);
  req.set_retry_count(c.retry_count);
  req.set_partition_key(p.path.pkey);
  req.set_path_packet_payload_mtu(p.path.mtu);
  req.set_rnr_retry_count(c.rnr_retry_count);
  req.set_max_cm_retries(config_.max_cm_retries);
  req.set_srq(p.srq);
  auto path = req.primary_path();
  // RoCE (IBA Annex A17): no LIDs — Linux writes the permissive LID; the GIDs are the addresses.
  path.set_local_port_lid(wire::kCmPermissiveLid);
  path.set_remote_port_lid(wire::kCmPermissiveLid);
  std::copy(p.path.local_gid.begin(), p.path.local_gid.end(), path.local_port_gid().begin());
  std::copy(p.path.remote_gid.begin(), p.path.remote_gid.end(), path.remote_port_gid().begin());
  path.set_flow_label(p.path.flow_label);
  path.set_packet_rate(p.path.packet_rate);
  path.set_traffic_class(p.path.traffic_class);
  path.set_hop_limit(p.path.hop_limit);
  path.set_sl(p.path.sl);
  path.set_local_ack_timeout(cm_ack_timeout(config_.local_ca_ack_delay, p.path.packet_life_time));
  const auto area = req.private_data();
  size_t offset = 0;
  if (p.ip) {
    wire::write_cma_hdr(area, *p.ip);
    offset = wire::kCmaHdrSize;
  }
  std::copy(p.private_data.begin(), p.private_data.end(), area.begin() + offset);

  c.state = State::kReqSent;
  Conn& stored = conns_.emplace(c.id, std::move(c)).first->second;
  send_tracked(stored, mad);
  return stored.id;
}

provider::Result<AcceptResult> Manager::accept(ConnId id, const AcceptParams& p) {
  Conn* c = find(id);
  if (!c || c->active || (c->state != State::kReqRcvd && c->state != State::kMraReqSent))
    return Status(EINVAL);
  if (p.private_data.size() > kRepPrivateDataMax) return Status(EINVAL);
  if (!is_rdma_resource_ok(p.responder_resources, config_.max_responder_resources) ||
      !is_rdma_resource_ok(p.initiator_depth, config_.max_initiator_depth))
    return Status(EINVAL);
  // librdmacm rdma_accept: RDMA_MAX_* takes the peer's offer, clamped to the device.
  c->responder_resources = p.responder_resources == kMaxResources
                               ? std::min(c->responder_resources, config_.max_responder_resources)
                               : p.responder_resources;
  c->initiator_depth = p.initiator_depth == kMaxResources
                           ? std::min(c->initiator_depth, config_.max_initiator_depth)
                           : p.initiator_depth;
  c->local_qpn = p.qpn & kMask24;

  Mad mad{};
  auto rep = start<wire::CmRep>(mad, c->tid);
  rep.set_local_comm_id(c->id);
  rep.set_remote_comm_id(c->remote_id);
  rep.set_local_q_key(0);
  rep.set_local_qpn(c->local_qpn);
  rep.set_starting_psn(c->rq_psn);
  rep.set_responder_resources(c->responder_resources);
  rep.set_initiator_depth(c->initiator_depth);
  rep.set_target_ack_delay(config_.local_ca_ack_delay);
  rep.set_failover_accepted(static_cast<uint8_t>(wire::CmFailover::kAccepted));
  rep.set_end_to_end_flow_control(p.flow_control);
  rep.set_rnr_retry_count(std::min<uint8_t>(p.rnr_retry_count, 7));
  rep.set_srq(p.srq);
  rep.set_local_ca_guid(config_.local_ca_guid);
  base::check(rep.set_private_data(p.private_data) == wire::MadError::kOk, "cm: REP private data");

  AcceptResult r{*qp_attrs(id, IBV_QPS_RTR), *qp_attrs(id, IBV_QPS_RTS)};
  c->state = State::kRepSent;
  c->last_reply = mad;
  c->retries_left = c->max_cm_retries;
  send_tracked(*c, mad);
  return r;
}

Status Manager::reject(ConnId id, const RejectParams& p) {
  Conn* c = find(id);
  if (!c) return Status(EINVAL);
  if (p.private_data.size() > kRejPrivateDataMax || p.ari.size() > kRejAriMax)
    return Status(EINVAL);
  CmRejMessage msg;
  switch (c->state) {
    case State::kReqRcvd:
    case State::kMraReqSent:
      msg = CmRejMessage::kReq;
      break;
    case State::kRepRcvd:
    case State::kMraRepSent:
      msg = CmRejMessage::kRep;
      break;
    default:
      return Status(EINVAL);
  }
  send(c->remote_gid, build_rej(*c, p.reason, msg, p.ari, p.private_data));
  if (msg == CmRejMessage::kRep)
    enter_timewait(*c);  // Linux: a REP we refuse leaves its QPN in timewait
  else
    finish(*c);
  return provider::kOk;
}

Status Manager::establish(ConnId id) {
  Conn* c = find(id);
  if (!c || (c->state != State::kRepRcvd && c->state != State::kMraRepSent)) return Status(EINVAL);
  send(c->remote_gid, build_rtu(*c));
  c->state = State::kEstablished;
  return provider::kOk;
}

Status Manager::notify_established(ConnId id) {
  Conn* c = find(id);
  if (!c || (c->state != State::kRepSent && c->state != State::kMraRepRcvd)) return Status(EINVAL);
  cancel_tracked(*c);
  c->state = State::kEstablished;
  emit(*c, Event{.type = EventType::kEstablished});
  return provider::kOk;
}

Status Manager::disconnect(ConnId id, std::span<const uint8_t> private_data) {
  Conn* c = find(id);
  if (!c) return Status(EINVAL);
  if (c->state == State::kEstablished) {
    if (private_data.size() > kDreqPrivateDataMax) return Status(EINVAL);
    Mad mad{};
    auto dreq = start<wire::CmDreq>(mad, own_tid(c->id));
    dreq.set_local_comm_id(c->id);
    dreq.set_remote_comm_id(c->remote_id);
    dreq.set_remote_qpn_eecn(c->remote_qpn);
    base::check(dreq.set_private_data(private_data) == wire::MadError::kOk, "cm: DREQ data");
    c->state = State::kDreqSent;
    c->retries_left = c->max_cm_retries;
    send_tracked(*c, mad);
    return provider::kOk;
  }
  if (c->state == State::kDreqRcvd) {
    if (private_data.size() > kDrepPrivateDataMax) return Status(EINVAL);
    send(c->remote_gid, build_drep(*c, private_data));
    enter_timewait(*c);
    return provider::kOk;
  }
  return Status(EINVAL);
}

void Manager::destroy(ConnId id) {
  Conn* c = find(id);
  if (!c) return;
  c->silent = true;
  const std::array<uint8_t, 8> guid = guid_ari();
  switch (c->state) {
    case State::kReqSent:
    case State::kMraReqRcvd:
      // Linux cm_destroy_id: REJ timeout with our CA GUID as ARI (rxe-guest-to-host.pcap).
      send(c->remote_gid, build_rej(*c, static_cast<uint16_t>(CmRejReason::kTimeout),
                                    CmRejMessage::kOther, guid, {}));
      finish(*c);
      return;
    case State::kReqRcvd:
    case State::kMraReqSent:
      send(c->remote_gid, build_rej(*c, static_cast<uint16_t>(CmRejReason::kConsumerDefined),
                                    CmRejMessage::kReq, {}, {}));
      finish(*c);
      return;
    case State::kRepSent:
    case State::kMraRepRcvd:
    case State::kRepRcvd:
    case State::kMraRepSent:
      send(c->remote_gid, build_rej(*c, static_cast<uint16_t>(CmRejReason::kConsumerDefined),
                                    c->active ? CmRejMessage::kRep : CmRejMessage::kOther, {}, {}));
      finish(*c);
      return;
    case State::kEstablished:
      (void)disconnect(id);  // DREQ; runs to timewait's end silently
      return;
    case State::kDreqRcvd:
      (void)disconnect(id);  // DREP
      return;
    case State::kDreqSent:
    case State::kTimewait:
      return;  // keeps the QPN in timewait and answers duplicate DREQs
    case State::kSidrReqRcvd: {
      Mad mad{};
      auto rep = start<wire::CmSidrRep>(mad, c->tid);
      rep.set_request_id(c->remote_id);
      rep.set_status(static_cast<uint8_t>(wire::CmSidrStatus::kReject));
      rep.set_service_id(c->service_id);
      send(c->remote_gid, mad);
      finish(*c);
      return;
    }
    case State::kSidrReqSent:
    case State::kIdle:
      finish(*c);
      return;
  }
}

provider::Result<ConnId> Manager::sidr_query(const SidrQueryParams& p) {
  const size_t pd_max = p.ip ? kRdmaSidrReqPrivateDataMax : kSidrReqPrivateDataMax;
  if (p.private_data.size() > pd_max) return Status(EINVAL);
  // As connect(): the rdma_cm IP header names IPv4 or IPv6.
  if (p.ip && p.ip->ip_version != wire::kCmaIpVersion4 && p.ip->ip_version != wire::kCmaIpVersion6)
    return Status(EINVAL);
  if (conns_.size() >= config_.max_connections) return Status(ENOMEM);
  Conn c;
  c.id = allocate_id();
  c.active = true;
  c.service_id = p.service_id;
  c.local_gid = p.path.local_gid;
  c.remote_gid = p.path.remote_gid;
  c.pkey = p.path.pkey;
  // cma.c cma_resolve_ib_udp: timeout 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms, CMA_MAX_CM_RETRIES.
  c.timeout_ns = cm_timeout_ns(config_.cm_response_timeout);
  c.max_cm_retries = config_.max_cm_retries;
  c.retries_left = c.max_cm_retries;
  Mad mad{};
  auto req = start<wire::CmSidrReq>(mad, own_tid(c.id));
  req.set_request_id(c.id);
  req.set_partition_key(p.path.pkey);
  req.set_service_id(p.service_id);
  size_t offset = 0;
  if (p.ip) {
    wire::write_cma_hdr(req.private_data(), *p.ip);
    offset = wire::kCmaHdrSize;
  }
  std::copy(p.private_data.begin(), p.private_data.end(), req.private_data().begin() + offset);
  c.state = State::kSidrReqSent;
  Conn& stored = conns_.emplace(c.id, std::move(c)).first->second;
  send_tracked(stored, mad);
  return stored.id;
}

Status Manager::sidr_answer(ConnId id, const SidrAnswerParams& p) {
  Conn* c = find(id);
  if (!c || c->state != State::kSidrReqRcvd) return Status(EINVAL);
  if (p.private_data.size() > kSidrRepPrivateDataMax) return Status(EINVAL);
  Mad mad{};
  auto rep = start<wire::CmSidrRep>(mad, c->tid);
  rep.set_request_id(c->remote_id);
  rep.set_status(p.status);
  rep.set_qpn(p.qpn & kMask24);
  rep.set_service_id(c->service_id);
  rep.set_q_key(p.qkey);
  base::check(rep.set_private_data(p.private_data) == wire::MadError::kOk, "cm: SIDR_REP data");
  send(c->remote_gid, mad);
  finish(*c);
  return provider::kOk;
}

// Linux cm_init_qp_init_attr / cm_init_qp_rtr_attr / cm_init_qp_rts_attr, and librdmacm's
// choice of max_rd_atomic / max_dest_rd_atomic.
provider::Result<QpAttrs> Manager::qp_attrs(ConnId id, ibv_qp_state target) const {
  const Conn* c = find(id);
  if (!c || c->state == State::kSidrReqSent || c->state == State::kSidrReqRcvd ||
      c->state == State::kTimewait || c->state == State::kIdle)
    return Status(EINVAL);
  QpAttrs q;
  q.sgid = c->local_gid;
  ibv_qp_attr& a = q.attr;
  a.qp_state = target;
  switch (target) {
    case IBV_QPS_INIT:
      q.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      a.pkey_index = 0;
      a.port_num = 1;
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (!c->unreliable && c->responder_resources)
        a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      return q;
    case IBV_QPS_RTR:
      if (!c->remote_known) return Status(EINVAL);
      q.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      a.path_mtu = static_cast<ibv_mtu>(c->mtu);
      a.dest_qp_num = c->remote_qpn;
      a.rq_psn = c->rq_psn;
      a.ah_attr.is_global = 1;
      a.ah_attr.port_num = 1;
      a.ah_attr.sl = c->sl;
      std::memcpy(a.ah_attr.grh.dgid.raw, c->remote_gid.data(), 16);
      a.ah_attr.grh.flow_label = c->flow_label;
      a.ah_attr.grh.hop_limit = c->hop_limit;
      a.ah_attr.grh.traffic_class = c->traffic_class;
      if (!c->unreliable) {
        q.mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        a.max_dest_rd_atomic = c->responder_resources;
        a.min_rnr_timer = 0;  // Linux cm_init_qp_rtr_attr
      }
      return q;
    case IBV_QPS_RTS:
      if (!c->remote_known) return Status(EINVAL);
      q.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      a.sq_psn = c->sq_psn;
      if (!c->unreliable) {
        q.mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        a.timeout = c->ack_timeout;
        a.retry_cnt = c->retry_count;
        a.rnr_retry = c->rnr_retry_count;
        a.max_rd_atomic = c->initiator_depth;
      }
      return q;
    default:
      return Status(EINVAL);
  }
}

// --- receive --------------------------------------------------------------------------------

void Manager::receive(const Gid& src_gid, uint32_t src_qpn, std::span<const uint8_t> bytes) {
  ++counters_.received;
  const wire::CmParse p = wire::parse_cm(bytes);
  if (!p.ok()) {
    ++counters_.malformed;
    return;
  }
  (void)src_qpn;  // CM MADs come from QP1; answers go to QP1 (IBA 13.5.1)
  Mad mad;
  std::copy_n(bytes.begin(), wire::kMadSize, mad.begin());
  switch (p.message.attr) {
    case wire::CmAttr::kReq:
      on_req(src_gid, mad);
      break;
    case wire::CmAttr::kMra:
      on_mra(mad);
      break;
    case wire::CmAttr::kRej:
      on_rej(mad);
      break;
    case wire::CmAttr::kRep:
      on_rep(src_gid, mad);
      break;
    case wire::CmAttr::kRtu:
      on_rtu(mad);
      break;
    case wire::CmAttr::kDreq:
      on_dreq(src_gid, mad);
      break;
    case wire::CmAttr::kDrep:
      on_drep(mad);
      break;
    case wire::CmAttr::kSidrReq:
      on_sidr_req(src_gid, mad);
      break;
    case wire::CmAttr::kSidrRep:
      on_sidr_rep(mad);
      break;
    case wire::CmAttr::kLap:
      on_lap(mad);
      break;
    case wire::CmAttr::kApr:
    case wire::CmAttr::kClassPortInfo:
      ++counters_.unsupported;
      break;
  }
}

void Manager::on_req(const Gid& src, const Mad& mad) {
  const wire::CmReqView req(mad);
  const uint32_t their_id = req.local_comm_id();
  const uint64_t guid = req.local_ca_guid();

  // A REQ we hold already: a retransmission (IBA 12.9.5, Linux cm_dup_req_handler).
  for (auto& [id, c] : conns_) {
    if (c.active || c.remote_id != their_id || c.remote_ca_guid != guid ||
        c.state == State::kSidrReqRcvd)
      continue;
    ++counters_.duplicates;
    switch (c.state) {
      case State::kReqRcvd:  // rdma_cm's delayed MRA: the peer is waiting for our consumer
        c.state = State::kMraReqSent;
        [[fallthrough]];
      case State::kMraReqSent:
        send(c.remote_gid, build_mra(c, wire::CmMraMessage::kReq));
        break;
      case State::kRepSent:
      case State::kMraRepRcvd:
        send(c.remote_gid, c.last_reply);
        break;  // our REP was lost
      case State::kTimewait:
        send(c.remote_gid, build_rej(c, static_cast<uint16_t>(CmRejReason::kStaleConn),
                                     CmRejMessage::kReq, {}, {}));
        ++counters_.stale_rejected;
        break;
      default:
        break;  // established or later: the REQ is old news
    }
    return;
  }

  // IBA 12.9.8.3.1 / Linux cm_match_req: a REQ from a QP that is still connected to us (or in
  // timewait) under another communication ID is stale: REJ it, and drop the old connection.
  for (auto& [id, c] : conns_) {
    if (!c.remote_known || c.remote_qpn != req.local_qpn() || c.remote_ca_guid != guid ||
        c.state == State::kSidrReqRcvd || c.state == State::kSidrReqSent)
      continue;
    send_rej_reply(src, mad, their_id, 0, static_cast<uint16_t>(CmRejReason::kStaleConn),
                   CmRejMessage::kReq);
    ++counters_.stale_rejected;
    if (c.state == State::kEstablished) (void)disconnect(c.id);
    return;
  }

  // No listener: REJ "invalid service ID" (IBA 12.6.7 reason 8; Linux cm_match_req →
  // cm_issue_rej(IB_CM_REJ_INVALID_SERVICE_ID), which nvme-rdma reports as "status 8") — unless
  // the ID is bound and its listen is still to come (claim).
  if (!listeners_.contains(req.service_id())) {
    if (!wait_for_listen(req.service_id(), src, mad)) refuse_unlistened(src, mad);
    return;
  }
  const auto type = static_cast<wire::CmTransportType>(req.transport_service_type());
  if ((type != wire::CmTransportType::kRc && type != wire::CmTransportType::kUc) ||
      req.extended_transport_type() != 0) {
    send_rej_reply(src, mad, their_id, 0, static_cast<uint16_t>(CmRejReason::kInvalidTransportType),
                   CmRejMessage::kReq);
    return;
  }
  const uint8_t mtu = req.path_packet_payload_mtu();
  if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) {
    send_rej_reply(src, mad, their_id, 0, static_cast<uint16_t>(CmRejReason::kInvalidMtu),
                   CmRejMessage::kReq);
    return;
  }
  const IpHeader ip = read_ip_header(req.service_id(), req.private_data());
  if (!ip.ok || conns_.size() >= config_.max_connections) {
    // cma.c: a header it cannot read, or no room: the new id is destroyed → REJ consumer
    // defined (Linux cm_destroy_id in REQ_RCVD).
    send_rej_reply(src, mad, their_id, 0, static_cast<uint16_t>(CmRejReason::kConsumerDefined),
                   CmRejMessage::kReq);
    return;
  }

  Conn c;
  c.id = allocate_id();
  c.service_id = req.service_id();
  c.remote_id = their_id;
  c.remote_ca_guid = guid;
  c.tid = wire::MadHeaderView(
              std::span<const uint8_t, wire::kMadHeaderSize>(mad.data(), wire::kMadHeaderSize))
              .transaction_id();
  const auto path = req.primary_path();
  std::copy(path.remote_port_gid().begin(), path.remote_port_gid().end(), c.local_gid.begin());
  c.remote_gid = src;
  c.remote_qpn = req.local_qpn();
  c.remote_known = true;
  // Linux cm_req_handler: we send from the REQ's Starting PSN and expect the REP's.
  c.sq_psn = req.starting_psn();
  c.rq_psn = static_cast<uint32_t>(psn_random_()) & kMask24;
  c.unreliable = type == wire::CmTransportType::kUc;
  c.mtu = std::min(mtu, config_.max_path_mtu);
  c.pkey = req.partition_key();
  c.flow_label = path.flow_label();
  c.traffic_class = path.traffic_class();
  c.hop_limit = path.hop_limit();
  c.sl = path.sl();
  // Linux cm_req_handler: our responder resources are their initiator depth and vice versa.
  c.responder_resources = req.initiator_depth();
  c.initiator_depth = req.responder_resources();
  c.retry_count = req.retry_count();
  c.rnr_retry_count = req.rnr_retry_count();
  c.ack_timeout = path.local_ack_timeout();
  // Linux cm_req_handler: our REP waits the active side's Local CM Response Timeout.
  c.timeout_ns = cm_timeout_ns(req.local_cm_response_timeout());
  c.max_cm_retries = req.max_cm_retries();  // IBA 12.7.26: how often the active side resends
  c.state = State::kReqRcvd;

  Event e{.type = EventType::kConnectRequest};
  const size_t skip = ip.address ? wire::kCmaHdrSize : 0;
  e.private_data = tail(req.private_data(), skip);
  e.ip = ip.address;
  e.remote_gid = c.remote_gid;
  e.local_gid = c.local_gid;
  e.remote_qpn = c.remote_qpn;
  e.responder_resources = c.responder_resources;
  e.initiator_depth = c.initiator_depth;
  e.retry_count = c.retry_count;
  e.rnr_retry_count = c.rnr_retry_count;
  e.flow_control = req.end_to_end_flow_control();
  e.srq = req.srq();
  Conn& stored = conns_.emplace(c.id, std::move(c)).first->second;
  emit(stored, std::move(e));
}

void Manager::on_mra(const Mad& mad) {
  const wire::CmMraView mra(mad);
  Conn* c = find(mra.remote_comm_id());
  if (!c) {
    ++counters_.unmatched;
    return;
  }
  // IBA 12.6.6 / Linux cm_mra_handler: wait the service timeout plus the path's ACK timeout.
  const auto what = static_cast<wire::CmMraMessage>(mra.message_mraed());
  State next;
  if (what == wire::CmMraMessage::kReq && c->state == State::kReqSent) {
    next = State::kMraReqRcvd;
  } else if (what == wire::CmMraMessage::kRep && c->state == State::kRepSent) {
    next = State::kMraRepRcvd;
  } else {
    if (c->state == State::kMraReqRcvd || c->state == State::kMraRepRcvd)
      ++counters_.duplicates;
    else
      ++counters_.unmatched;
    return;
  }
  c->remote_id = mra.local_comm_id();
  c->state = next;
  // Later retries keep the longer wait (Linux ib_modify_mad changes the MAD's timeout).
  c->tracked_timeout_ns = cm_timeout_ns(mra.service_timeout()) + cm_timeout_ns(c->ack_timeout);
  c->deadline_ns = clock_.now_ns() + c->tracked_timeout_ns;
}

void Manager::on_rej(const Mad& mad) {
  const wire::CmRejView rej(mad);
  Conn* c = find(rej.remote_comm_id());
  if (!c && rej.reason() == static_cast<uint16_t>(CmRejReason::kTimeout) && rej.ari().size() == 8) {
    // Linux cm_acquire_rejected_id: an active side that gave up names itself by its CA GUID
    // (the ARI) and its own comm ID, not ours (it may never have heard ours).
    uint64_t guid = 0;
    for (uint8_t b : rej.ari()) guid = guid << 8 | b;
    for (auto& [id, conn] : conns_)
      if (!conn.active && conn.remote_id == rej.local_comm_id() && conn.remote_ca_guid == guid) {
        c = &conn;
        break;
      }
  }
  if (!c ||
      (c->remote_id != 0 && rej.local_comm_id() != 0 && c->remote_id != rej.local_comm_id())) {
    ++counters_.unmatched;
    return;
  }
  Event e{.type = EventType::kRejected};
  e.reason = rej.reason();
  e.ari.assign(rej.ari().begin(), rej.ari().end());
  e.private_data = tail(rej.private_data());
  switch (c->state) {
    case State::kReqSent:
    case State::kMraReqRcvd:
    case State::kRepSent:
    case State::kMraRepRcvd:
    case State::kReqRcvd:
    case State::kMraReqSent:
      emit(*c, std::move(e));
      // Linux cm_rej_handler: "stale connection" keeps the QPN in timewait.
      if (rej.reason() == static_cast<uint16_t>(CmRejReason::kStaleConn)) {
        c->silent = true;
        enter_timewait(*c);
      } else {
        finish(*c);
      }
      return;
    case State::kRepRcvd:
    case State::kMraRepSent:
      emit(*c, std::move(e));
      c->silent = true;
      enter_timewait(*c);
      return;
    case State::kEstablished:
    case State::kDreqSent:
      if (!c->reported_disconnect) emit(*c, Event{.type = EventType::kDisconnected});
      c->reported_disconnect = true;
      enter_timewait(*c);
      return;
    default:
      ++counters_.unmatched;
      return;
  }
}

void Manager::on_rep(const Gid& src, const Mad& mad) {
  const wire::CmRepView rep(mad);
  Conn* c = find(rep.remote_comm_id());
  if (!c || !c->active) {
    ++counters_.unmatched;
    return;
  }
  switch (c->state) {
    case State::kReqSent:
    case State::kMraReqRcvd:
      break;
    case State::kEstablished:  // our RTU was lost (Linux cm_dup_rep_handler)
      ++counters_.duplicates;
      if (c->remote_id == rep.local_comm_id()) send(c->remote_gid, build_rtu(*c));
      return;
    case State::kRepRcvd:  // manual RTU: the application has not answered yet
      c->state = State::kMraRepSent;
      [[fallthrough]];
    case State::kMraRepSent:
      ++counters_.duplicates;
      send(c->remote_gid, build_mra(*c, wire::CmMraMessage::kRep));
      return;
    default:
      ++counters_.unmatched;
      return;
  }
  // Linux cm_rep_handler: a REP from a QP still connected to us under another ID is stale.
  for (auto& [id, other] : conns_) {
    if (other.id == c->id || !other.remote_known || other.remote_qpn != rep.local_qpn() ||
        other.remote_ca_guid != rep.local_ca_guid())
      continue;
    send_rej_reply(src, mad, rep.local_comm_id(), rep.remote_comm_id(),
                   static_cast<uint16_t>(CmRejReason::kStaleConn), CmRejMessage::kRep);
    ++counters_.stale_rejected;
    if (other.state == State::kEstablished) (void)disconnect(other.id);
    return;
  }
  cancel_tracked(*c);
  c->remote_id = rep.local_comm_id();
  c->remote_ca_guid = rep.local_ca_guid();
  c->remote_qpn = rep.local_qpn();
  c->remote_known = true;
  c->sq_psn = rep.starting_psn();  // Linux cm_rep_handler
  // Linux cm_rep_handler: their responder resources bound our initiator depth and vice versa.
  c->initiator_depth =
      std::min({rep.responder_resources(), c->initiator_depth, config_.max_initiator_depth});
  c->responder_resources =
      std::min({rep.initiator_depth(), c->responder_resources, config_.max_responder_resources});
  c->rnr_retry_count = rep.rnr_retry_count();
  c->ack_timeout = cm_ack_timeout(rep.target_ack_delay(),
                                  static_cast<uint8_t>(std::max(c->ack_timeout, uint8_t{1}) - 1));

  Event e{.type = c->manual_rtu ? EventType::kConnectResponse : EventType::kEstablished};
  e.private_data = tail(rep.private_data());
  e.remote_gid = c->remote_gid;
  e.local_gid = c->local_gid;
  e.remote_qpn = c->remote_qpn;
  e.responder_resources = c->responder_resources;
  e.initiator_depth = c->initiator_depth;
  e.rnr_retry_count = c->rnr_retry_count;
  e.flow_control = rep.end_to_end_flow_control();
  e.srq = rep.srq();
  if (c->manual_rtu) {
    c->state = State::kRepRcvd;
  } else {
    send(c->remote_gid, build_rtu(*c));
    c->state = State::kEstablished;
  }
  emit(*c, std::move(e));
}

void Manager::on_rtu(const Mad& mad) {
  const wire::CmRtuView rtu(mad);
  Conn* c = find(rtu.remote_comm_id());
  if (!c || c->remote_id != rtu.local_comm_id() ||
      (c->state != State::kRepSent && c->state != State::kMraRepRcvd)) {
    ++counters_.unmatched;
    return;
  }
  cancel_tracked(*c);
  c->state = State::kEstablished;
  emit(*c, Event{.type = EventType::kEstablished, .private_data = tail(rtu.private_data())});
}

void Manager::on_dreq(const Gid& src, const Mad& mad) {
  const wire::CmDreqView dreq(mad);
  const uint64_t tid = wire::MadHeaderView(std::span<const uint8_t, wire::kMadHeaderSize>(
                                               mad.data(), wire::kMadHeaderSize))
                           .transaction_id();
  Conn* c = find(dreq.remote_comm_id());
  if (!c || c->remote_id != dreq.local_comm_id()) {
    // Linux cm_issue_drep: a DREQ for a connection we no longer know (its timewait is over)
    // is answered, so the peer's disconnect completes.
    ++counters_.unmatched;
    Mad out{};
    auto drep = start<wire::CmDrep>(out, tid);
    drep.set_local_comm_id(dreq.remote_comm_id());
    drep.set_remote_comm_id(dreq.local_comm_id());
    send(src, out);
    return;
  }
  if (dreq.remote_qpn_eecn() != c->local_qpn) {  // Linux cm_dreq_handler: not our QP
    ++counters_.unmatched;
    return;
  }
  Event e{.type = EventType::kDisconnected, .private_data = tail(dreq.private_data())};
  switch (c->state) {
    case State::kRepSent:
    case State::kMraRepRcvd:
    case State::kEstablished:
      cancel_tracked(*c);
      c->tid = tid;
      c->state = State::kDreqRcvd;
      if (!c->reported_disconnect) emit(*c, std::move(e));
      c->reported_disconnect = true;
      if (c->silent) (void)disconnect(c->id);  // destroyed: nobody else will answer
      return;
    case State::kDreqSent:  // both sides disconnect at once: answer and wait
      c->tid = tid;
      send(c->remote_gid, build_drep(*c, {}));
      if (!c->reported_disconnect) emit(*c, std::move(e));
      c->reported_disconnect = true;
      enter_timewait(*c);
      return;
    case State::kTimewait:  // our DREP was lost
      ++counters_.duplicates;
      c->tid = tid;
      send(c->remote_gid, build_drep(*c, {}));
      return;
    case State::kDreqRcvd:
      ++counters_.duplicates;
      return;
    default:
      ++counters_.unmatched;
      return;
  }
}

void Manager::on_drep(const Mad& mad) {
  const wire::CmDrepView drep(mad);
  Conn* c = find(drep.remote_comm_id());
  if (!c || c->remote_id != drep.local_comm_id() || c->state != State::kDreqSent) {
    ++counters_.unmatched;
    return;
  }
  if (!c->reported_disconnect)
    emit(*c, Event{.type = EventType::kDisconnected, .private_data = tail(drep.private_data())});
  c->reported_disconnect = true;
  enter_timewait(*c);
}

void Manager::on_sidr_req(const Gid& src, const Mad& mad) {
  const wire::CmSidrReqView req(mad);
  const uint64_t tid = wire::MadHeaderView(std::span<const uint8_t, wire::kMadHeaderSize>(
                                               mad.data(), wire::kMadHeaderSize))
                           .transaction_id();
  for (auto& [id, c] : conns_) {
    if (c.state == State::kSidrReqRcvd && c.remote_id == req.request_id() && c.remote_gid == src) {
      ++counters_.duplicates;  // Linux cm_sidr_req_handler: already being answered
      return;
    }
  }
  if (!listeners_.contains(req.service_id()) && wait_for_listen(req.service_id(), src, mad)) return;
  const IpHeader ip = read_ip_header(req.service_id(), req.private_data());
  if (!listeners_.contains(req.service_id()) || !ip.ok ||
      conns_.size() >= config_.max_connections) {
    // IBA 12.11.2 / Linux cm_sidr_req_handler: status 1, "service ID not supported".
    Mad out{};
    auto rep = start<wire::CmSidrRep>(out, tid);
    rep.set_request_id(req.request_id());
    rep.set_status(static_cast<uint8_t>(listeners_.contains(req.service_id())
                                            ? wire::CmSidrStatus::kReject
                                            : wire::CmSidrStatus::kUnsupported));
    rep.set_service_id(req.service_id());
    send(src, out);
    return;
  }
  Conn c;
  c.id = allocate_id();
  c.service_id = req.service_id();
  c.remote_id = req.request_id();
  c.remote_gid = src;
  c.tid = tid;
  c.pkey = req.partition_key();
  c.state = State::kSidrReqRcvd;
  Event e{.type = EventType::kSidrRequest};
  e.private_data = tail(req.private_data(), ip.address ? wire::kCmaHdrSize : 0);
  e.ip = ip.address;
  e.remote_gid = src;
  Conn& stored = conns_.emplace(c.id, std::move(c)).first->second;
  emit(stored, std::move(e));
}

void Manager::on_sidr_rep(const Mad& mad) {
  const wire::CmSidrRepView rep(mad);
  Conn* c = find(rep.request_id());
  if (!c || c->state != State::kSidrReqSent) {
    ++counters_.unmatched;
    return;
  }
  Event e{.type = EventType::kSidrResponse, .private_data = tail(rep.private_data())};
  e.sidr_status = rep.status();
  e.remote_qpn = rep.qpn();
  e.qkey = rep.q_key();
  e.remote_gid = c->remote_gid;
  emit(*c, std::move(e));
  finish(*c);
}

// urdma does not migrate paths (one port, no alternate path): a LAP for a connection we hold is
// answered with an APR whose AP status is "unsupported" (IBA 12.8).
void Manager::on_lap(const Mad& mad) {
  ++counters_.unsupported;
  const wire::CmLapView lap(mad);
  Conn* c = find(lap.remote_comm_id());
  if (!c || c->remote_id != lap.local_comm_id() || c->state != State::kEstablished) return;
  Mad out{};
  auto apr =
      start<wire::CmApr>(out, wire::MadHeaderView(std::span<const uint8_t, wire::kMadHeaderSize>(
                                                      mad.data(), wire::kMadHeaderSize))
                                  .transaction_id());
  apr.set_local_comm_id(c->id);
  apr.set_remote_comm_id(c->remote_id);
  apr.set_ap_status(static_cast<uint8_t>(wire::CmAprStatus::kUnsupported));
  send(c->remote_gid, out);
}

// --- time -----------------------------------------------------------------------------------

uint64_t Manager::next_deadline_ns() const {
  uint64_t t = waiting_.empty() ? net::kNever : waiting_.front().deadline_ns;
  for (const auto& [id, c] : conns_) t = std::min({t, c.deadline_ns, c.timewait_end_ns});
  return t;
}

void Manager::run_timers() {
  const uint64_t now = clock_.now_ns();
  while (!waiting_.empty() && waiting_.front().deadline_ns <= now) {
    const Waiting w = waiting_.front();
    waiting_.pop_front();
    ++counters_.wait_expired;
    refuse_unlistened(w.src, w.mad);
  }
  std::vector<ConnId> due;
  for (const auto& [id, c] : conns_)
    if (c.deadline_ns <= now || c.timewait_end_ns <= now) due.push_back(id);
  for (ConnId id : due) {
    Conn* c = find(id);
    if (!c) continue;
    if (c->state == State::kTimewait && c->timewait_end_ns <= now) {
      // (A connection whose story ended in REJECTED is `silent`: its timewait reports nothing.)
      emit(*c, Event{.type = EventType::kTimewaitExit});
      finish(*c);
      continue;
    }
    if (c->deadline_ns > now || !c->tracked) continue;
    if (c->retries_left > 0) {
      --c->retries_left;
      ++counters_.retransmitted;
      resend_tracked(*c);
    } else {
      on_send_timeout(*c);
    }
  }
}

// The tracked message's last retry went unanswered (IBA 12.9.x "timeout" transitions; Linux
// cm_process_send_error and the REJ its cm_destroy_id sends for a REQ).
void Manager::on_send_timeout(Conn& c) {
  cancel_tracked(c);
  const std::array<uint8_t, 8> guid = guid_ari();
  switch (c.state) {
    case State::kReqSent:
    case State::kMraReqRcvd:
    case State::kRepSent:
    case State::kMraRepRcvd:
      send(c.remote_gid, build_rej(c, static_cast<uint16_t>(CmRejReason::kTimeout),
                                   CmRejMessage::kOther, guid, {}));
      emit(c, Event{.type = EventType::kUnreachable, .status = ETIMEDOUT});
      finish(c);
      return;
    case State::kDreqSent:
      // A peer that never answers our DREQ: disconnected all the same, then timewait.
      if (!c.reported_disconnect)
        emit(c, Event{.type = EventType::kDisconnected, .status = ETIMEDOUT});
      c.reported_disconnect = true;
      enter_timewait(c);
      return;
    case State::kSidrReqSent:
      emit(c, Event{.type = EventType::kUnreachable, .status = ETIMEDOUT});
      finish(c);
      return;
    default:
      return;
  }
}

}  // namespace urdma::cm
