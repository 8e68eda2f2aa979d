// The IB Communication Manager (IBA Vol. 1 chapter 12) as Linux rdma_cm drives it over RoCE:
// a deterministic state machine with no I/O.
//
// A `Manager` is fed three things and produces three things:
//   in:  API calls (listen, connect, accept, reject, establish, disconnect, destroy, SIDR query
//        and answer), received CM MADs with the GID/QPN they came from (`receive`), and time
//        from the clock it was given (`run_timers` when `next_deadline_ns` has come);
//   out: MADs to send (`take_outgoing`: 256 bytes and a destination GID, for a UD SEND to QP1
//        with the GSI Q_Key), events for the layer above (`take_events`: rdma_cm's CONNECT_REQUEST,
//        CONNECT_RESPONSE, ESTABLISHED, REJECTED, UNREACHABLE, DISCONNECTED, TIMEWAIT_EXIT and the
//        SIDR pair), and the QP attributes to apply (`accept`'s result, `qp_attrs`).
// No sockets, threads or global state: two managers joined by a list of MADs are a whole
// network (tests/unit/cm).
//
// Connections are named by their local communication ID (`ConnId`), which carries the
// process's urdmad slot in its top 8 bits (daemon::comm_id_for_slot) so that urdmad routes
// every reply to this process; SIDR requests use the same space for their request IDs.
//
// States are the IBA's (12.9.x, Figures "Communication establishment", "Communication release"
// and "Service ID resolution"), named as Linux ib_cm names them. Retransmission follows
// IBA 12.7.x and Linux's timer arithmetic (timing.h): one message awaits an answer at a time
// (REQ, REP, DREQ or SIDR_REQ), resent every response timeout up to Max CM Retries; an MRA
// stretches the wait by its service timeout. rdma_cm's "delayed MRA" is built in: a duplicate
// REQ (REP) while the application has not answered yet is answered with an MRA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include <infiniband/verbs.h>

#include "cm/timing.h"
#include "net/clock.h"
#include "net/prng.h"
#include "provider/status.h"
#include "wire/cm.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::cm {

using Gid = std::array<uint8_t, 16>;
using ConnId = uint32_t;
using Mad = std::array<uint8_t, wire::kMadSize>;

// Private data left to applications (Linux IB_CM_*_PRIVATE_DATA_SIZE; rdma_cm's REQ and
// SIDR_REQ lose the 36-byte IP header, cma.c cma_user_data_offset). More is EINVAL, as
// rdma_connect(3) / rdma_accept / rdma_reject / rdma_disconnect report it.
inline constexpr size_t kReqPrivateDataMax = wire::CmReq::kPrivateDataSize;               // 92
inline constexpr size_t kRdmaReqPrivateDataMax = kReqPrivateDataMax - wire::kCmaHdrSize;  // 56
inline constexpr size_t kRepPrivateDataMax = wire::CmRep::kPrivateDataSize;               // 196
inline constexpr size_t kRejPrivateDataMax = wire::CmRej::kPrivateDataSize;               // 148
inline constexpr size_t kRejAriMax = wire::CmRej::ari_max;                                // 72
inline constexpr size_t kRtuPrivateDataMax = wire::CmRtu::kPrivateDataSize;               // 224
inline constexpr size_t kDreqPrivateDataMax = wire::CmDreq::kPrivateDataSize;             // 220
inline constexpr size_t kDrepPrivateDataMax = wire::CmDrep::kPrivateDataSize;             // 224
inline constexpr size_t kSidrReqPrivateDataMax = wire::CmSidrReq::kPrivateDataSize;       // 216
inline constexpr size_t kRdmaSidrReqPrivateDataMax =
    kSidrReqPrivateDataMax - wire::kCmaHdrSize;                                      // 180
inline constexpr size_t kSidrRepPrivateDataMax = wire::CmSidrRep::kPrivateDataSize;  // 136
static_assert(kRdmaReqPrivateDataMax == 56 && kRdmaSidrReqPrivateDataMax == 180);

// rdma_cma.h RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: "as many as the device allows".
inline constexpr uint8_t kMaxResources = 0xFF;

// IBA 12.9.x states (Linux enum ib_cm_state), plus the SIDR pair.
enum class State : uint8_t {
  kIdle,
  kReqSent,
  kReqRcvd,
  kMraReqSent,
  kMraReqRcvd,
  kRepSent,
  kRepRcvd,
  kMraRepSent,
  kMraRepRcvd,
  kEstablished,
  kDreqSent,
  kDreqRcvd,
  kTimewait,
  kSidrReqSent,
  kSidrReqRcvd,
};
std::string_view state_name(State s);

struct ManagerConfig {
  unsigned slot = 1;                  // urdmad slot: the top 8 bits of every ID we allocate
  uint64_t local_ca_guid = 0;         // REQ/REP Local CA GUID, REJ timeout ARI
  uint64_t seed = 1;                  // first communication ID and TID (Linux: random)
  uint32_t tid_high = 1;              // upper 32 bits of our transaction IDs (Linux: the agent's)
  uint8_t local_ca_ack_delay = 15;    // REP Target ACK Delay (rxe: 15)
  uint8_t max_initiator_depth = 128;  // device max_qp_rd_atom
  uint8_t max_responder_resources = 128;  // device max_qp_init_rd_atom
  uint8_t max_path_mtu = IBV_MTU_4096;    // the largest path MTU the port takes (enum ibv_mtu)
  uint8_t cm_response_timeout = kCmaCmResponseTimeout;
  uint8_t max_cm_retries = kCmaMaxCmRetries;
  uint8_t mra_service_timeout = kCmaMraServiceTimeout;
  size_t max_connections = 4096;  // connections + SIDR requests held at once
  // A REQ / SIDR_REQ for a claimed service ID (bound, not listened on yet) waits this long for
  // listen(); at most max_waiting of them at once, max_waiting_per_service for one ID.
  uint64_t listen_wait_ns = kListenWaitMs * 1'000'000;
  size_t max_waiting = 256;
  size_t max_waiting_per_service = 64;
  // Where the REP Starting PSNs come from. Unset: a SplitMix64 stream of `seed` (replayable, for
  // tests); a process passes an unpredictable source (base::SecureRandom), as a peer sees them.
  std::function<uint64_t()> random;
};

// The path a REQ or SIDR_REQ travels (rdma_cm's resolved route).
struct Path {
  Gid local_gid{};
  Gid remote_gid{};
  uint32_t flow_label = 0;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
  uint8_t sl = 0;
  uint8_t packet_rate = 0;
  uint8_t packet_life_time = kCmaIboePacketLifetime;
  uint8_t mtu = IBV_MTU_1024;  // enum ibv_mtu
  uint16_t pkey = 0xFFFF;
};

// The flow label rdma_cm gives a RoCEv2 route (Linux cma.c cma_get_roce_udp_flow_label): an
// IPv6 source's own flow label if it has one, else a hash of the IP ports. Both ends derive the
// connection's UDP source port from it.
constexpr uint32_t roce_flow_label(uint16_t src_port, uint16_t dst_port, uint32_t ipv6_flow = 0) {
  constexpr uint32_t kFlowLabelMask = 0xFFFFF;
  if (ipv6_flow & kFlowLabelMask) return ipv6_flow & kFlowLabelMask;
  return (uint32_t{src_port} * 31 + dst_port) & kFlowLabelMask;
}
// rping's connection in tests/data/rxe-to-rxe.pcap: ports 0xac67 -> 7174, flow label 0x4fc7f.
static_assert(roce_flow_label(0xac67, 7174) == 0x4fc7f);

struct ConnectParams {
  Path path;
  uint64_t service_id = 0;
  uint32_t qpn = 0;
  // The REQ's Starting PSN: the PSN our QP expects first (its RTR rq_psn); the passive side
  // sends from it. The REP's is the other way round (Linux cm.c: the active side's sq_psn is
  // the REP's, the passive side's the REQ's; rxe NAKs anything else with a PSN sequence error).
  uint32_t starting_psn = 0;
  bool unreliable = false;                      // UC instead of RC
  uint8_t responder_resources = kMaxResources;  // our max_dest_rd_atomic offer
  uint8_t initiator_depth = kMaxResources;      // our max_rd_atomic offer
  uint8_t retry_count = 7;                      // clamped to 7 as rdma_cm does
  uint8_t rnr_retry_count = 7;
  bool flow_control = false;
  bool srq = false;
  std::optional<wire::CmaAddress> ip;  // rdma_cm's IP header (nullopt: AF_IB, native IB)
  std::span<const uint8_t> private_data;
  // The application created no QP (RDMA_CM_EVENT_CONNECT_RESPONSE): the REP is reported and
  // the RTU waits for establish().
  bool manual_rtu = false;
};

// The REP's starting PSN is not a parameter: the Manager picks it when the REQ arrives (as
// Linux rdma_cm picks its id's seq_num), so rdma_init_qp_attr's RTR is right before accept too.
struct AcceptParams {
  uint32_t qpn = 0;
  uint8_t responder_resources = kMaxResources;  // kMaxResources: the peer's offer, clamped
  uint8_t initiator_depth = kMaxResources;
  uint8_t rnr_retry_count = 7;  // how often the peer retries our RNR NAKs
  bool flow_control = false;
  bool srq = false;
  std::span<const uint8_t> private_data;
};

struct RejectParams {
  uint16_t reason = static_cast<uint16_t>(wire::CmRejReason::kConsumerDefined);
  std::span<const uint8_t> ari;
  std::span<const uint8_t> private_data;
};

struct SidrQueryParams {
  Path path;
  uint64_t service_id = 0;
  std::optional<wire::CmaAddress> ip;
  std::span<const uint8_t> private_data;
};

struct SidrAnswerParams {
  uint8_t status = static_cast<uint8_t>(wire::CmSidrStatus::kSuccess);
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  std::span<const uint8_t> private_data;
};

// Attributes for ibv_modify_qp (rdma_init_qp_attr's answer). `sgid` is the path's local GID:
// the caller turns it into ah_attr.grh.sgid_index.
struct QpAttrs {
  ibv_qp_attr attr{};
  int mask = 0;
  Gid sgid{};
};

struct AcceptResult {
  QpAttrs rtr;
  QpAttrs rts;
};

enum class EventType : uint8_t {
  kConnectRequest,   // a REQ for a listener: `id` is the new passive connection
  kConnectResponse,  // manual_rtu: the REP arrived; establish() or reject() next
  kEstablished,      // active: REP (RTU sent); passive: RTU (or notify_established)
  kRejected,         // a REJ arrived (reason, ARI, private data)
  kUnreachable,      // our REQ / REP / SIDR_REQ went unanswered (status ETIMEDOUT)
  kDisconnected,     // DREQ received, DREP received, or our DREQ unanswered (ETIMEDOUT)
  kTimewaitExit,
  kSidrRequest,   // a SIDR_REQ for a listener: answer with sidr_answer(id)
  kSidrResponse,  // the SIDR_REP for our query (status, QPN, Q_Key)
};
std::string_view event_name(EventType t);

struct Event {
  EventType type = EventType::kEstablished;
  ConnId id = 0;
  int status = 0;  // 0, or ETIMEDOUT for kUnreachable / an unanswered DREQ
  uint64_t service_id = 0;
  std::vector<uint8_t> private_data;  // the application's part of the message's area
  // Requests: the sender and what it offers, as rdma_cm reports it to this side (its
  // initiator depth is our responder resources and vice versa).
  std::optional<wire::CmaAddress> ip;
  Gid remote_gid{};
  Gid local_gid{};
  uint32_t remote_qpn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 0;
  uint8_t rnr_retry_count = 0;
  bool flow_control = false;
  bool srq = false;
  // kRejected
  uint16_t reason = 0;
  std::vector<uint8_t> ari;
  // kSidrResponse
  uint8_t sidr_status = 0;
  uint32_t qkey = 0;
};

struct OutgoingMad {
  Gid dest_gid{};
  uint32_t dest_qpn = wire::kMadGsiQpn;
  Mad mad{};
};

struct Counters {
  uint64_t received = 0;
  uint64_t sent = 0;
  uint64_t retransmitted = 0;
  uint64_t duplicates = 0;      // duplicate REQ/REP/DREQ/MRA/SIDR_REQ recognised
  uint64_t malformed = 0;       // parse_cm refused it
  uint64_t unmatched = 0;       // no connection in a state that takes it
  uint64_t unsupported = 0;     // LAP (answered with APR "unsupported"), APR, ClassPortInfo
  uint64_t stale_rejected = 0;  // REJ stale connection sent
  // Requests for a claimed service ID (Manager::claim).
  uint64_t waited_for_listen = 0;  // waited for listen()
  uint64_t wait_expired = 0;       // of those, refused when the wait ended or the claim went
  uint64_t wait_full = 0;          // refused at once: max_waiting / max_waiting_per_service
};

class Manager {
 public:
  Manager(const ManagerConfig& config, const net::Clock& clock);

  // Listeners by service ID (rdma_cm: wire::rdma_service_id(port space, port)). EADDRINUSE
  // for a second listen on one ID; EINVAL to stop one that does not exist.
  // listen() takes over a claim and serves the requests that waited for it.
  provider::Status listen(uint64_t service_id);
  provider::Status stop_listening(uint64_t service_id);
  // A service ID bound but not listened on yet (rdma_bind_addr before rdma_listen). Linux
  // refuses a REQ that comes in between (REJ 8); here it waits up to listen_wait_ns for
  // listen(), so a client quicker than its server's rdma_listen is served. A retransmission of
  // a waiting REQ is answered with an MRA for the rest of the wait (IBA 12.6.6), as Linux
  // answers a duplicate REQ it is still deciding on. When the wait ends (run_timers) or the
  // claim is given back, the request is refused as for a service nobody holds: REJ 8, SIDR_REP
  // status 1. EADDRINUSE for an ID listened on or claimed already.
  provider::Status claim(uint64_t service_id);
  // The claim given back (the id will not listen); EINVAL if there is none.
  provider::Status unclaim(uint64_t service_id);

  // Active side: sends a REQ. EINVAL for too much private data or resources beyond the device;
  // ENOMEM when max_connections are held.
  provider::Result<ConnId> connect(const ConnectParams& p);
  // Passive side, after kConnectRequest: the QP's RTR and RTS attributes (apply them, then
  // the REP is already queued); EINVAL in any other state.
  provider::Result<AcceptResult> accept(ConnId id, const AcceptParams& p);
  // A REQ (passive) or, in manual_rtu mode, a REP (active).
  provider::Status reject(ConnId id, const RejectParams& p);
  // manual_rtu: sends the RTU after kConnectResponse (rdma_establish).
  provider::Status establish(ConnId id);
  // Passive: the QP saw traffic before the RTU came (IBA 12.9.7.2; Linux ib_cm_notify).
  provider::Status notify_established(ConnId id);
  // Established: sends a DREQ. After kDisconnected (DREQ received): sends the DREP.
  provider::Status disconnect(ConnId id, std::span<const uint8_t> private_data = {});
  // Forgets the connection as Linux ib_destroy_cm_id does: whatever the peer must hear is sent
  // (REJ timeout for our pending REQ, REJ consumer-defined for an unanswered REQ or REP, DREQ
  // for an established connection, DREP for a received DREQ, SIDR_REP reject) and no event is
  // reported for it any more; a disconnection still runs to timewait's end in the background.
  void destroy(ConnId id);

  provider::Result<ConnId> sidr_query(const SidrQueryParams& p);
  provider::Status sidr_answer(ConnId id, const SidrAnswerParams& p);

  // rdma_init_qp_attr: INIT (any connection), RTR and RTS once the peer's QPN and both starting
  // PSNs are known (active: after the REP; passive: after the REQ). EINVAL otherwise.
  provider::Result<QpAttrs> qp_attrs(ConnId id, ibv_qp_state target) const;

  // A CM MAD received on QP1 from `src_gid` (its GRH source) and `src_qpn` (its DETH).
  void receive(const Gid& src_gid, uint32_t src_qpn, std::span<const uint8_t> mad);
  // Retransmissions, their exhaustion, timewait exits due at the clock's time.
  void run_timers();
  // When run_timers has something to do (net::kNever when nothing).
  uint64_t next_deadline_ns() const;

  std::vector<OutgoingMad> take_outgoing();
  std::vector<Event> take_events();

  // State of a connection; nullopt once it is gone.
  std::optional<State> state(ConnId id) const;
  // Who a connection's peer is, as the peer names it: its communication ID and QPN, and the two
  // GIDs. nullopt once the connection is gone or before the peer is known.
  struct Peer {
    uint32_t remote_comm_id = 0;
    uint32_t remote_qpn = 0;
    Gid local_gid{};
    Gid remote_gid{};
  };
  std::optional<Peer> peer(ConnId id) const;
  size_t connection_count() const { return conns_.size(); }
  size_t waiting_count() const { return waiting_.size(); }
  const Counters& counters() const { return counters_; }

 private:
  // One connection (or SIDR request): what the IBA's state machine and rdma_cm's negotiation
  // need to remember. Written only by the Manager's handlers.
  struct Conn {
    ConnId id = 0;
    State state = State::kIdle;
    bool active = false;
    bool silent = false;  // destroyed, or its story ended for the application: no more events
    bool manual_rtu = false;
    bool unreliable = false;
    bool reported_disconnect = false;
    uint32_t remote_id = 0;  // the peer's communication ID (SIDR: its request ID)
    uint64_t remote_ca_guid = 0;
    uint64_t tid = 0;  // the transaction we answer in (the REQ's, then the DREQ's)
    uint64_t service_id = 0;
    Gid local_gid{};
    Gid remote_gid{};  // where our MADs go
    uint32_t local_qpn = 0;
    uint32_t remote_qpn = 0;
    uint32_t sq_psn = 0;  // the peer's message's Starting PSN
    uint32_t rq_psn = 0;  // our message's Starting PSN
    bool remote_known = false;
    uint8_t mtu = IBV_MTU_1024;
    uint16_t pkey = 0xFFFF;
    uint32_t flow_label = 0;
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 64;
    uint8_t sl = 0;
    uint8_t responder_resources = 0;  // our max_dest_rd_atomic
    uint8_t initiator_depth = 0;      // our max_rd_atomic
    uint8_t retry_count = 7;
    uint8_t rnr_retry_count = 7;
    uint8_t ack_timeout = 0;  // the QP's local ACK timeout (Linux av.timeout)
    // The message that awaits an answer, resent every timeout_ns up to retries_left times.
    std::optional<Mad> tracked;
    uint64_t timeout_ns = 0;          // the connection's CM response wait
    uint8_t max_cm_retries = 0;       // ours (active), the REQ's (passive)
    uint64_t tracked_timeout_ns = 0;  // the tracked message's (an MRA stretches it)
    unsigned retries_left = 0;
    uint64_t deadline_ns = net::kNever;
    uint64_t timewait_end_ns = net::kNever;
    Mad last_reply{};  // the REP we sent (resent for a duplicate REQ)
  };

  ConnId allocate_id();
  uint64_t own_tid(ConnId id) const { return (uint64_t{config_.tid_high} << 32) | id; }
  Conn* find(ConnId id);
  const Conn* find(ConnId id) const;

  void send(const Gid& to, const Mad& mad, uint32_t dest_qpn = wire::kMadGsiQpn);
  void send_tracked(Conn& c, const Mad& mad);  // the message that awaits an answer
  void resend_tracked(Conn& c);
  void cancel_tracked(Conn& c);
  std::array<uint8_t, 8> guid_ari() const;
  void emit(Conn& c, Event e);
  void enter_timewait(Conn& c);
  void finish(Conn& c);  // to kIdle: the connection is gone once nothing refers to it

  Mad build_rej(const Conn& c, uint16_t reason, wire::CmRejMessage msg,
                std::span<const uint8_t> ari, std::span<const uint8_t> private_data) const;
  Mad build_mra(const Conn& c, wire::CmMraMessage msg) const;
  Mad build_rtu(const Conn& c) const;
  Mad build_drep(const Conn& c, std::span<const uint8_t> private_data) const;
  void send_rej_reply(const Gid& to, const Mad& request, uint32_t remote_comm_id,
                      uint32_t local_comm_id, uint16_t reason, wire::CmRejMessage msg);

  void on_req(const Gid& src, const Mad& mad);
  void on_mra(const Mad& mad);
  void on_rej(const Mad& mad);
  void on_rep(const Gid& src, const Mad& mad);
  void on_rtu(const Mad& mad);
  void on_dreq(const Gid& src, const Mad& mad);
  void on_drep(const Mad& mad);
  void on_sidr_req(const Gid& src, const Mad& mad);
  void on_sidr_rep(const Mad& mad);
  void on_lap(const Mad& mad);
  void on_send_timeout(Conn& c);
  // A request for a claimed, unlistened service ID: waits (true), or is refused by the caller.
  bool wait_for_listen(uint64_t service_id, const Gid& src, const Mad& mad);
  // A request refused as for a service nobody holds (REJ 8 / SIDR_REP status 1).
  void refuse_unlistened(const Gid& src, const Mad& mad);

  ManagerConfig config_;
  const net::Clock& clock_;
  uint32_t next_low_id_;
  std::function<uint64_t()> psn_random_;  // the REP Starting PSNs we pick (ManagerConfig::random)
  std::map<uint64_t, bool> listeners_;
  std::set<uint64_t> claimed_;  // bound, not listened on yet
  // Requests for claimed IDs, oldest first: every wait is listen_wait_ns, so by deadline too.
  struct Waiting {
    uint64_t service_id = 0;
    Gid src{};
    Mad mad{};
    uint64_t deadline_ns = 0;
  };
  std::deque<Waiting> waiting_;
  std::map<ConnId, Conn> conns_;
  std::vector<OutgoingMad> outgoing_;
  std::vector<Event> events_;
  Counters counters_;
};

}  // namespace urdma::cm
