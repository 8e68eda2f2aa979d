// Per-QP engine state: everything the transport keeps about a QP that the application must
// never see or write (PSNs, retry counts, timers, the position inside a message). It lives in
// the engine, keyed by QPN, never in the app-visible rings (the rxe lesson: "don't trust user
// space data").
//
// One owner per field. Requester and completer share the send queue's per-WQE records
// (`WqeState`, one per SQ slot, indexed from the SQ head as the provider's sq_peek_st is): the
// requester (requester.cc) writes a record's PSNs and moves it kNew → kSending → kSent (and
// back to kSending when it goes back N); the completer (completer.cc) writes its response
// fields and moves it to kDone with a status. Everything else of `Requester` is written only
// in requester.cc, everything of `Completer` only in completer.cc: the completer reports to the
// requester through a CompleterResult (rewind, progress, READ/ATOMICs finished) that
// Engine::apply_completer_result applies, and the requester tells the completer a request went
// out through Engine::request_sent. (Setting up at modify time and flushing in ERR reset both.)
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <infiniband/verbs.h>

#include "net/address.h"
#include "net/clock.h"
#include "provider/qp.h"
#include "provider/work_queue.h"
#include "wire/opcode.h"

namespace urdma::engine {

// IBA 9.7.6.1.1 (Local ACK Timeout): 4.096 us × 2^timeout; 0 means "infinite" (no timer).
inline constexpr uint64_t kAckTimeoutBaseNs = 4096;
inline constexpr uint64_t ack_timeout_ns(uint8_t timeout) {
  return timeout == 0 ? net::kNever : kAckTimeoutBaseNs << (timeout & 0x1F);
}
// IBA 9.7.2: the largest message, 2^31 bytes (the RETH DMA length is 32 bits).
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;
// IBA 9.7.5.2.8 / ibv_modify_qp(3): rnr_retry 7 means "retry forever".
inline constexpr uint8_t kRnrRetryInfinite = 7;
// RoCEv2 UDP source ports carry flow entropy (annex A17.4.1): 0xC000 | 14 bits of the QPN,
// the range Linux rxe uses. This is the port a QP asks for; the packet I/O names the one it
// really sends from (net::PacketIo::source_port: a socket's pool, udp_socket_io.h), and
// Engine::send_packet seals the ICRC with that one.
inline constexpr uint16_t kRoceSrcPortBase = 0xC000;
inline constexpr uint16_t roce_src_port(uint32_t qpn) {
  return static_cast<uint16_t>(kRoceSrcPortBase | (qpn & 0x3FFF));
}

// A GID as an address: RoCEv2 GIDs are IPv6 addresses or IPv4-mapped ones (annex A17.4.5.1).
inline net::Address gid_address(const ibv_gid& gid) {
  return net::Address::from_v6(std::span<const uint8_t, 16>(gid.raw, 16));
}

// Where a packet goes and what its ICRC pseudo-header holds.
struct Route {
  net::Address src;
  net::Address dst;
  uint16_t src_port = kRoceSrcPortBase;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
};

enum class WqeStage : uint8_t {
  kNew,      // not started: no PSNs assigned
  kSending,  // PSNs assigned, packets (re)being sent
  kSent,     // every packet sent; waiting for ACK / response (RC)
  kDone,     // finished: `status` says how; the completer retires it in order
};

// Trivial (no member initialisers): the ring of them is allocated untouched, and a WQE's state
// is set to WqeState{} (all zero: kNew, SUCCESS) when the requester starts it.
struct WqeState {
  WqeStage stage;
  ibv_wc_status status;
  uint32_t first_psn;
  uint32_t npkts;       // PSNs consumed (READ: response packets expected); 0 for local ops
  bool rd_atomic;       // READ or ATOMIC: counts against max_rd_atomic until done
  uint32_t resp_psn;    // READ/ATOMIC: the next response PSN expected
  uint64_t resp_bytes;  // READ: bytes of response data placed so far
  uint32_t last_psn() const { return (first_psn + npkts - 1) & 0xFFFFFF; }
};

struct Requester {
  uint32_t next_psn = 0;    // PSN of the next packet to send
  uint32_t cur = 0;         // SQ offset (from the head) of the WQE being sent
  uint64_t cur_offset = 0;  // bytes of it already sent (READ: response bytes requested before)
  uint32_t started = 0;     // WQEs from the head whose WqeState is initialised
  uint32_t rd_atomic_outstanding = 0;
  uint64_t head_seq = 0;  // WQEs retired so far: the head's sequence number
  bool blocked = false;   // stopped by fence / max_rd_atomic / SQD until the completer moves
  // Ring of sq capacity + 1 entries, indexed by sequence number; only the `started` ones from
  // the head hold a state. Allocated untouched: a 2^20-WR QP costs its pages as WQEs use them.
  std::unique_ptr<WqeState[]> wqe;
  size_t wqe_slots = 0;
  WqeState& at(uint32_t offset) { return wqe[(head_seq + offset) % wqe_slots]; }
  const WqeState& at(uint32_t offset) const { return wqe[(head_seq + offset) % wqe_slots]; }
};

// What the completer asks of the requester (instead of reaching into it — rxe's completer sets
// req.need_retry / wait_psn / need_rd_atomic itself).
struct CompleterResult {
  std::optional<uint32_t> rewind_to;  // go back N: resend from this PSN
  bool progress = false;              // comp.psn advanced: the window opened
  uint32_t rd_atomic_done = 0;        // READ/ATOMIC WQEs finished: max_rd_atomic slots freed
};

struct Completer {
  uint32_t psn = 0;  // oldest PSN not yet acknowledged
  uint8_t retry_left = 0;
  uint8_t rnr_retry_left = 0;
  uint64_t retry_deadline_ns = net::kNever;  // local ACK timeout
  uint64_t rnr_deadline_ns = net::kNever;    // RNR wait: no sending until then
  uint32_t rnr_psn = 0;
  // A go-back-N from psn is under way (started by a PSN Sequence Error NAK or a local ACK
  // timeout) and nothing was acknowledged since: a further NAK for psn — a responder that NAKs
  // each out-of-order packet it saw, a duplicated NAK — names the gap already being resent, so
  // it starts no second resend and spends no retry (rxe_comp.c started_retry). Progress clears it.
  bool retry_started = false;
  // A READ response arrived beyond a lost one: the READ was re-requested from this PSN (once per
  // gap, so a burst of later responses does not trigger a burst of requests).
  bool read_gap_pending = false;
  uint32_t read_gap_psn = 0;
};

// One READ or ATOMIC the responder executed, kept for duplicates (IBA 9.7.5.2.2: a duplicate
// READ is answered again; a duplicate ATOMIC is answered with the saved result, never
// re-executed).
struct RdAtomicResource {
  bool valid = false;
  bool atomic = false;
  uint32_t first_psn = 0;
  uint32_t npkts = 0;
  uint64_t orig = 0;  // ATOMIC: the value before the operation
};

// Where the responder is in the incoming message sequence (IBA 9.7.5.2.x opcode sequence
// checks; rxe keeps the last opcode instead).
enum class MsgState : uint8_t {
  kIdle,      // between messages: a First/Only, READ or ATOMIC may come
  kInSend,    // inside a multi-packet SEND: Middle/Last SEND packets continue it
  kInWrite,   // inside a multi-packet RDMA WRITE: Middle/Last WRITE packets continue it
  kDropping,  // UC: the rest of the current message is dropped until a First/Only (9.8.3.x)
};

// An RDMA READ response being generated a few packets per poll (Engine::run_responder, at most
// Engine::kMaxPacketsPerTurn per turn), so one 2 GiB READ neither starves other QPs nor floods a
// socket buffer. The RETH range was checked when the request arrived; each packet's piece is
// looked up again before it is sent (the region may be deregistered between turns).
struct ReadReply {
  bool active = false;
  // XRC target: the XRC SRQ of the READ request, whose PD the memory is checked against (null:
  // the QP's own PD). Engine::srq_destroyed ends the response before the SRQ goes.
  provider::Srq* xrc_srq = nullptr;
  uint32_t rkey = 0;
  uint64_t va = 0;             // next byte to send
  uint64_t resid = 0;          // bytes still to send
  uint32_t psn = 0;            // PSN of the next response packet
  bool first_sent = false;     // its First was sent: the next is Middle or Last
  uint32_t res_first_psn = 0;  // the responder resource (READ request) it answers
  uint32_t res_npkts = 0;
};

// Request packets that arrive while a READ response is still being generated wait, in arrival
// order, and are processed once it is finished (rxe's responder works through its packet queue
// in order the same way): ACKs and responses leave in PSN order, and a later WRITE or ATOMIC
// never changes memory the READ has not read yet. More than any conforming requester keeps
// outstanding (rxe 128, ours EngineConfig::max_unacked_pkts); beyond it a packet is dropped
// (EngineCounters::drop_request_queue_full) and the requester's go-back-N resends it.
inline constexpr size_t kMaxWaitingRequests = 256;

// A SEND arriving on a tag-matching SRQ (provider/srq.h), as its first packet classified it
// (responder.cc tm_classify): delivered whole to an ordinary SRQ WQE (no tag, unexpected) or
// matched to a tagged buffer (eager: the payload after the TMH lands there; rendezvous: the
// SEND's payload is discarded and the engine READs the data the RVH names).
enum class TmKind : uint8_t { kNone, kNoTag, kUnexpected, kEager, kRndv };
struct TmRecv {
  TmKind kind = TmKind::kNone;
  bool sync_req = false;  // unexpected: its completion asks for a sync
  uint32_t skip = 0;      // bytes at the start of the next packet not placed (the TMH)
  uint32_t handle = 0;    // matched: the tag's handle
  uint64_t tag = 0;       // matched: the TMH's tag and user data
  uint32_t priv = 0;
  uint64_t rndv_va = 0;   // rendezvous: the RVH
  uint32_t rndv_rkey = 0;
  uint32_t rndv_len = 0;
  bool matched() const { return kind == TmKind::kEager || kind == TmKind::kRndv; }
};

// A rendezvous the engine carries out for a matched tag (Documentation/tag_matching.md): an
// RDMA READ of the sender's data into the tagged buffer, then a SEND of a FIN TMH back to the
// sender, as WQEs of the engine's own on the QP's send queue (provider::kSendFlagEngine; their
// completions reach rndv_wqe_done, never the application's CQ); the tagged buffer's second
// completion (IBV_WC_TM_DATA_VALID) when the READ is done.
struct Rendezvous {
  bool active = false;
  bool read_done = false;
  uint32_t handle = 0;
  uint64_t wr_id = 0;  // the tag's recv_wr_id
  uint64_t tag = 0;
  uint32_t priv = 0;
  uint32_t length = 0;
};
// Rendezvous in progress per QP; beyond it a rendezvous request is answered RNR NAK.
inline constexpr uint32_t kMaxRendezvous = 4;

struct Responder {
  uint32_t epsn = 0;  // expected PSN
  // The PSN of the last SEND/WRITE packet received in sequence: what the ACK of a duplicate
  // names (never a READ's or ATOMIC's PSN: ResponderSteps::duplicate in responder.cc).
  uint32_t ackable_psn = 0;
  uint32_t msn = 0;  // messages completed (24 bits)
  MsgState msg = MsgState::kIdle;
  // RC: a PSN sequence error NAK was sent for the current gap. Separate from `msg`: a gap can
  // open inside a message or between messages (and UC never NAKs).
  bool nak_sent = false;
  // RC: an ACK owed but not yet sent (Engine::defer_ack): requests that ask for one within one
  // received batch are acknowledged together by the last one's ACK (IBA 9.7.5.1.1: an ACK
  // acknowledges every request up to its PSN). ack_msn is the MSN as of ack_psn.
  bool ack_pending = false;
  uint32_t ack_psn = 0;
  uint32_t ack_msn = 0;
  // Delayed ACKs are for QPs in a conversation (Engine::defer_ack): `converse` once this QP
  // started a request of its own within ack_delay_ns of owing an ACK (a reply), until a held
  // ACK had to leave on its deadline. `ack_held`: the owed ACK waits for a reply to carry it
  // (it leaves in the turn the QP starts a request) or for its deadline (Engine::ack_due_ns).
  // `ack_owed_ns`: when the last ACK became owed (with ack_delay_ns > 0).
  bool converse = false;
  bool ack_held = false;
  uint64_t ack_owed_ns = 0;
  uint64_t reply_turn = 0;  // the last turn this QP started a request in
  // The receive WQE being filled (multi-packet SEND) or kept (a UD datagram too long for it
  // leaves it for the next one). Separate from `msg`: a WRITE with immediate takes one while
  // kInWrite, and UD keeps one between datagrams.
  bool has_recv = false;
  provider::RecvWork recv;
  // XRC target: the XRC SRQ `recv` came from, whose CQ its completion goes to (null otherwise).
  // Engine::srq_destroyed clears it, and the WQE with it, before the SRQ goes.
  provider::Srq* recv_srq = nullptr;
  uint64_t recv_offset = 0;
  TmRecv tm;  // the SEND in progress on a tag-matching SRQ
  std::array<Rendezvous, kMaxRendezvous> rndv{};
  // The RDMA WRITE being placed: its R_Key and VA, checked again for every packet, so a region
  // deregistered or a window invalidated mid-message is never written through.
  uint32_t write_rkey = 0;
  uint64_t write_va = 0;
  uint64_t write_length = 0;  // RETH DMA length
  uint64_t write_offset = 0;
  std::vector<RdAtomicResource> resources;  // max_dest_rd_atomic entries (at least 1)
  uint32_t res_next = 0;
  ReadReply read_reply;
  std::deque<std::vector<uint8_t>> waiting;  // request packets behind read_reply (<= kMax...)
};

struct QpContext {
  provider::Qp* qp = nullptr;
  uint32_t qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;
  // RC and both XRC types: acknowledged, retried, NAKed; an XRC QP is an RC connection whose
  // requests carry an XRCETH (IBA 9.2, XRC), one requester (XRC_SEND) or responder (XRC_RECV).
  bool reliable() const {
    return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV;
  }
  bool xrc() const { return type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV; }
  // The opcode of this QP's transport for an RC opcode (`op::kRcAck` → XRC Acknowledge on an
  // XRC QP, RC Send First → UC Send First on UC): IBA 9.2, the same operation bits.
  uint8_t opcode(uint8_t rc_opcode) const {
    const uint8_t prefix = type == IBV_QPT_UC ? wire::op::kUcPrefix
                           : xrc()            ? wire::op::kXrcPrefix
                                              : wire::op::kRcPrefix;
    return static_cast<uint8_t>(prefix | wire::op::operation(rc_opcode));
  }
  ibv_qp_attr attr = {};  // snapshot taken at each modify
  uint32_t mtu = 256;     // path MTU in bytes (UD: the port's active MTU)
  Route route;            // RC/UC: to the connected peer
  Requester req;
  Completer comp;
  Responder resp;
  bool last_wqe_event_raised = false;  // SRQ: IBV_EVENT_QP_LAST_WQE_REACHED sent once
  bool active = false;                 // on the engine's active list (served by poll)
  // The state of the last modify the engine applied (Engine::apply_modify). The provider's state
  // changes when ibv_modify_qp returns; the engine takes the transition's attributes (expected
  // and send PSNs, path MTU, destination QP) only when it runs the queued command: see
  // Engine::qp_state.
  ibv_qp_state applied_state = IBV_QPS_RESET;
};

}  // namespace urdma::engine
