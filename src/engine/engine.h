// The transport engine: the "hardware" of urdma. It turns posted send WQEs into RoCEv2 packets
// and received packets into memory writes and completions, for RC, UC and UD QPs.
//
// PUBLIC SHAPE (what the simulation runner, the verbs layer and the tests code against):
//
//   provider::Device& dev = ...;     // created with DeviceConfig::doorbell = &relay (below)
//   net::PacketIo& io = ...;         // a UDP slot socket, or SimNetwork::io(host)
//   const net::Clock& clock = ...;   // MonotonicClock, or SimWorld::clock()
//   engine::Engine engine(dev, io, clock, engine::EngineConfig{});
//   engine.poll();                   // one turn: receive a batch, fire due timers, send;
//                                    // returns next_deadline_ns() as the turn left it
//   engine.next_deadline_ns();       // when poll() must run again without traffic (net::kNever:
//                                    // only a datagram or a doorbell can create work; <= now:
//                                    // work is waiting, poll again at once)
//   engine.counters();               // rxe `rdma statistic` names + drop counters
//
// Wiring the doorbell: the Device takes its Doorbell at construction, before the Engine exists,
// so create a DoorbellRelay first and pass it in DeviceConfig::doorbell; the Engine attaches
// itself to it (and detaches in its destructor):
//
//   engine::DoorbellRelay relay;
//   provider::DeviceConfig cfg; cfg.doorbell = &relay; cfg.gids = {...};
//   provider::Device dev(cfg);
//   engine::Engine engine(dev, io, clock, {});
//
// The engine knows nothing of the simulator: tests/support/engine_participant.h adapts it to a
// net::SimWorld participant.
//
// THREADING. poll(), next_deadline_ns(), counters() and context() are for the engine thread.
// The Doorbell callbacks may come from application threads: ring_sq / ring_rq / ring_srq only
// set atomic bits (rung_qps.h). qp_modified queues a command (MPSC, a short lock) that the
// engine executes — inline at once when no poll() turn runs, else by the running turn before
// its next doorbell drain or received batch — so ibv_modify_qp never waits for a turn (the
// flush of a modify to ERR completes later, as on hardware). A modify to RESET and
// qp_destroyed take the engine's (recursive) mutex, which poll() holds, so they return only
// once the engine no longer touches the QP (the contract of provider/doorbell.h). In the
// simulation there is one thread: every command runs inline, in the order it was issued.
//
// COST PER POLL. poll() serves only the QPs on its active list: those whose doorbell rang, that
// received a packet, were modified, or still have requester work, READ responses to send (or
// requests waiting behind them), a flush pending or a timer armed. An idle QP costs nothing per
// poll; a busy one sends at most kMaxPacketsPerTurn packets from its requester and as many from
// its responder per poll, so a 2 GiB READ or a deep send queue cannot starve the other QPs.
//
// RC FLOW CONTROL. At most EngineConfig::max_unacked_pkts request PSNs are unacknowledged per
// QP (requester.cc window_open), so the PSN window always fits the 24-bit half window.
//
// TRANSMIT IS ZERO-COPY. A datagram goes to the PacketIo as iovecs: the headers from an engine
// buffer, the payload straight from registered memory (one iovec per SGE piece, after the MR
// access check) or from the provider's inline area, then pad + ICRC from an engine buffer; the
// ICRC is computed over the gather list. The packets a turn builds are queued and handed over
// in batches (PacketIo::send_batch: one sendmmsg for up to net::kMaxBatch datagrams), always
// before the turn ends and before a completion returns their memory to the application. Only
// a packet needing more than net::kMaxTxIov iovecs
// is copied (EngineCounters::tx_payload_copies).
//
// What it reads: the source address of a QP's packets is the GID at the path's (or the AH's)
// sgid_index in the Device's GID table, or EngineConfig::local_address when that entry is empty.
// The ICRC covers it, so it must be the address the peer sees.
//
// Files (one per step, as Linux rxe): engine.cc (poll loop, the one receive pipeline / demux,
// timers, packet transmission, completions, flush), requester.cc, responder.cc, completer.cc,
// qp_context.h (all per-QP engine state), engine_counters.h.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine/engine_counters.h"
#include "engine/qp_context.h"
#include "engine/rung_qps.h"
#include "net/clock.h"
#include "net/packet_io.h"
#include "provider/device.h"
#include "provider/doorbell.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace urdma::engine {

struct EngineConfig {
  // Source address used when a QP's GID table entry is empty (tests, single-address hosts).
  net::Address local_address;
  // Datagrams read per poll (<= net::kMaxBatch).
  size_t rx_batch = 32;
  // Datagrams queued before they go to the PacketIo in one send_batch (sendmmsg), 1 ..
  // net::kMaxBatch; the queue is also flushed at the end of every poll() and before a send
  // completion. 1 (the default here) sends every packet as it is built; processes run with 64
  // (verbs/device.cc, URDMA_TX_BATCH). The loopback benchmark measures both (--tx-batch).
  size_t tx_batch = 1;
  // Delayed ACKs: 0 (the default here) sends an owed ACK at the end of the received batch.
  // > 0 holds it on a QP in a conversation — one that started a request of its own within this
  // many ns of owing an ACK — until the QP starts its next request (the reply the application
  // posts after seeing the completion: the ACK leaves behind it, in the same send, off the
  // latency path) but never longer than this many ns (next_deadline_ns() asks for a turn
  // then); an ACK that had to wait that long ends the conversation. A QP that only receives
  // (a one-way stream, whose sender waits for its window) is acknowledged as with 0. An owed
  // ACK still leaves before any other response of its QP. Processes run with 50 us
  // (verbs/device.cc, URDMA_ACK_DELAY_US).
  uint64_t ack_delay_ns = 0;
  // The requester sets AckReq on the last packet of every message and, inside long messages,
  // every `ack_req_interval_pkts` packets so the responder's ACKs keep the window moving.
  uint32_t ack_req_interval_pkts = 64;
  // RC flow control: at most this many request PSNs sent and not yet acknowledged per QP (rxe's
  // RXE_MAX_UNACKED_PSNS is 128). A READ takes as many PSNs as it has response packets; one
  // is sent only while fewer than this many PSNs are outstanding and never if it would leave
  // more than 2^23 outstanding, so every PSN the completer compares lies inside the 24-bit
  // half window (wire/psn.h). 1 .. 2^23.
  uint32_t max_unacked_pkts = 128;
  // Check the ICRC of every received packet (IBA 7.8.1 / annex A17.4.3.1). Off only for
  // hand-built test packets that do not carry one.
  bool verify_icrc = true;
  wire::Ipv4DfSearch df_search = wire::Ipv4DfSearch::kSetOnly;
};

class Engine;

// Told after every doorbell call has reached the engine: the runtime's engine thread wakes up
// (src/runtime/runtime.h) when it sleeps. Called from application threads; must be cheap.
class Waker {
 public:
  virtual ~Waker() = default;
  // The engine must take a turn soon: a modify, a receive WQE on a QP in ERR.
  virtual void wake() = 0;
  // Send WQEs were posted (the waker may run the turn on the posting thread instead).
  virtual void send_posted() { wake(); }
};

// Forwards the provider's doorbell calls to the Engine attached to it (nothing before that),
// then tells the Waker, if one is set (none in the simulation and the one-thread tests).
class DoorbellRelay final : public provider::Doorbell {
 public:
  void attach(provider::Doorbell* target) { target_ = target; }
  void set_waker(Waker* waker) { waker_ = waker; }
  void ring_sq(provider::Qp& qp) override {
    if (target_) target_->ring_sq(qp);
    if (waker_) waker_->send_posted();
  }
  // A receive WQE matters to a turn only on a QP in ERR, where it is flushed at once
  // (Engine::ring_rq); in any other state the turn that receives a request takes it, so a
  // sleeping engine thread is not woken for it (an application that reposts its receive before
  // it answers would otherwise wake it for nothing, ahead of the answer). Called after the
  // post released the queue's lock, which Engine::flush takes between entering ERR and reading
  // the queue (Qp::sync_with_recv_posters_st): either this reads ERR, or that flush sees the WQE.
  void ring_rq(provider::Qp& qp) override {
    if (target_) target_->ring_rq(qp);
    if (qp.state() == IBV_QPS_ERR) wake();
  }
  // SRQ WQEs are taken when requests arrive and are never flushed (IBA 10.2.9.5): no wake.
  void ring_srq(provider::Srq& srq) override {
    if (target_) target_->ring_srq(srq);
  }
  void srq_ops_posted(provider::Srq& srq) override {
    if (target_) target_->srq_ops_posted(srq);
  }
  void qp_modified(provider::Qp& qp, ibv_qp_state from, ibv_qp_state to) override {
    if (target_) target_->qp_modified(qp, from, to);
    wake();
  }
  void qp_destroyed(provider::Qp& qp) override {
    if (target_) target_->qp_destroyed(qp);
  }
  void srq_destroyed(provider::Srq& srq) override {
    if (target_) target_->srq_destroyed(srq);
  }
  void memory_released() override {
    if (target_) target_->memory_released();
  }

 private:
  void wake() {
    if (waker_) waker_->wake();
  }

  provider::Doorbell* target_ = nullptr;
  Waker* waker_ = nullptr;
};

// Largest packet the engine builds or accepts: 4096-byte path MTU + the longest header set
// (BTH + RETH + ImmDt = 32; AtomicETH 28 + BTH) + pad + ICRC, rounded up.
inline constexpr size_t kMaxMtuBytes = 4096;
inline constexpr size_t kMaxPacketBytes = kMaxMtuBytes + 128;
// Receive buffers are larger than any valid packet so an oversized one is seen (and dropped)
// whole rather than truncated into something that parses.
inline constexpr size_t kRxBufferBytes = kMaxPacketBytes + 512;

class Engine final : public provider::Doorbell {
 public:
  Engine(provider::Device& device, net::PacketIo& io, const net::Clock& clock,
         EngineConfig config = {});
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One turn: send what was posted since the last turn, receive and process a batch, fire due
  // timers, run requesters with work, flush QPs in the error state.
  // hold_acks false: ACKs this turn owes are not held for replies (ack_delay_ns), whatever the
  // QP's conversation — the turn of a thread that waits on a completion channel (Runtime).
  // receive false: the socket is not read this turn (it only sends what was posted): the
  // caller knows that what arrived is somebody else's to take (Runtime::send_posted).
  // Returns next_deadline_ns() as the turn left it (one lock for both).
  uint64_t poll(bool hold_acks = true, bool receive = true);
  // Earliest time poll() must run without new traffic; <= now when work is waiting.
  uint64_t next_deadline_ns() const;
  // The engine thread's counters (poll()'s thread). Other threads: counters_snapshot().
  const EngineCounters& counters() const { return counters_; }
  // A copy made between two turns: safe from any thread.
  EngineCounters counters_snapshot() const;

  // provider::Doorbell.
  void ring_sq(provider::Qp& qp) override;
  void ring_rq(provider::Qp& qp) override;
  void ring_srq(provider::Srq& srq) override;
  // Runs the TM-SRQ's list operations now, under the engine's mutex (waiting for a running
  // turn): an operation and the messages matched are ordered, and the operation's completion
  // is in the CQ when ibv_post_srq_ops returns.
  void srq_ops_posted(provider::Srq& srq) override;
  void qp_modified(provider::Qp& qp, ibv_qp_state from, ibv_qp_state to) override;
  void qp_destroyed(provider::Qp& qp) override;
  // An XRC SRQ goes: waits for the running turn, then drops the receive WQEs taken from it and
  // the READ responses checked against its PD.
  void srq_destroyed(provider::Srq& srq) override;
  // Waits until every poll() turn that was running when it was called has ended (the turn
  // epoch moved past it): no pointer a turn took from the MR table before the caller changed
  // the table is used after this returns. Returns at once between turns and inside a turn of
  // the calling thread.
  void memory_released() override;

  // Back-pressure: datagrams the PacketIo refused with kWouldBlock (a full socket buffer) wait
  // in a bounded backlog, in order, and go out first in the next poll(). While it is not empty
  // the requesters and responders send nothing new and local ACK / RNR timers do not fire (a
  // packet still in our own buffer is not lost: no retry_cnt is spent on it); the driver should
  // poll again when the I/O becomes writable (EPOLLOUT), not at once. Engine thread.
  bool tx_blocked() const { return !tx_backlog_.empty(); }

  // Test and tool access: the engine's view of a QP (nullptr if it has none).
  const QpContext* context(uint32_t qp_num) const;

 private:
  // Packets one QP may send per poll, from its requester and from its responder each: what is
  // left keeps next_deadline_ns() at "now", so one busy QP cannot starve the others.
  static constexpr int kMaxPacketsPerTurn = 256;

  // ---- engine.cc: control commands ----
  void run_commands();
  void apply_modify(provider::Qp& qp, ibv_qp_state from, ibv_qp_state to);

  // ---- engine.cc: pipeline, transmission, completions ----
  void send_posted_first(bool receive);
  void receive_batch();
  void sort_active();
  void handle_datagram(const net::RxDatagram& d);
  // DestQP 0xFFFFFF: a copy to every attached QP (provider::McastTable) that can receive it.
  void handle_multicast(const wire::PacketView& pkt, const net::RxDatagram& d);
  void fire_timers(uint64_t now_ns);
  QpContext* find(uint32_t qp_num);
  void forget(uint32_t qp_num);
  void refresh(QpContext& ctx);
  // The QP's state as the engine acts on it: the provider's, except that RTR and RTS count only
  // once the engine has applied the modify that entered them (QpContext::applied_state). An
  // application thread's modify to RTS and post_send can both land while a turn runs; that turn
  // must not send the WQE with the PSNs, MTU and destination of INIT. SQD, SQE and ERR only stop
  // work and take effect at once.
  ibv_qp_state qp_state(const QpContext& ctx) const;
  // The active list: QPs poll() serves.
  void activate(QpContext& ctx);
  void serve(QpContext& ctx);
  bool needs_service(const QpContext& ctx) const;
  // Packet building: begin_packet lays out and writes the headers into a TxSlot and returns
  // views of them; the payload is then added piece by piece (exactly payload_len bytes), as
  // iovecs into memory that stays valid until the packet is flushed (flush_tx); send_packet
  // seals and queues it.
  wire::PacketHeaders begin_packet(uint8_t opcode, size_t payload_len);
  void tx_add_payload(std::span<const uint8_t> piece);
  // Adds bytes [offset, offset + length) of the WQE's SGE list, straight from registered
  // memory; false on an SGE that fails the local access check (LOC_PROT_ERR).
  bool tx_gather(QpContext& ctx, const provider::SendWqe& wqe, uint64_t offset, uint64_t length);
  // Seals the packet and queues it for the next flush_tx().
  void send_packet(const Route& route);
  // The packet begun is not sent (its payload failed the local access check).
  void tx_abandon() { tx_building_ = false; }
  // Hands the queued packets to the PacketIo in one send_batch; what it refuses goes to the
  // backlog, copied. Must run before the turn ends and before a send completion or a popped WQE
  // lets the application reuse memory a queued packet's iovecs point into.
  void flush_tx();
  // Before the engine writes memory a queued packet may gather its payload from (a WRITE, SEND
  // or atomic placed, a READ response or atomic result stored): the queue leaves first, so each
  // packet carries the bytes its ICRC was sealed over — and a READ answered before a WRITE
  // behind it (IBA 9.5, requests execute in PSN order) the bytes from before that WRITE.
  void flush_tx_before_placement() {
    if (tx_gathered_) flush_tx();
  }
  // Copies a datagram the I/O would not take into tx_backlog_ (or drops it when that is full).
  void backlog(const net::TxDatagram& tx);
  // Sends what waits in tx_backlog_, oldest first, until the I/O blocks again.
  void flush_backlog();
  // Sends an ACK/NAK now, after the QP's deferred ACK if it owes one (order on the wire).
  void send_ack(QpContext& ctx, uint8_t syndrome, uint32_t psn);
  // ACK coalescing: the responder owes an ACK of `psn` (with the current MSN); it is sent by
  // send_pending_acks() at the end of the received batch (and of the turn), or before any other
  // response of the QP, whichever is first, and replaced by a later one of the same batch.
  void defer_ack(QpContext& ctx, uint32_t psn);
  void send_pending_ack(QpContext& ctx);
  void send_pending_acks();
  // ack_delay_ns > 0. At the end of a received batch (held_too false): the owed ACKs not held
  // for a reply. At the end of a turn: those too, and the held ones whose QP started a request
  // this turn or that are due by now.
  void send_delayed_acks(bool held_too);
  // When the QP's owed ACK must leave: when it became owed, plus ack_delay_ns if it is held.
  uint64_t ack_due_ns(const QpContext& ctx) const;
  uint64_t deadline_locked() const;
  // ack_delay_ns > 0: the QP starts a request; within ack_delay_ns of owing an ACK it is a
  // reply, and the QP's ACKs are held for replies from now on (Responder::converse).
  void note_request_start(QpContext& ctx);
  // Completions. False when the CQ overflowed: the completion is lost and the QP is in ERR.
  // A send completion is made from its WQE (send_wc) while the WQE is still queued, and pushed
  // (push_send_cqe) only after the WQE left the send queue: an application that sees the
  // completion may post again at once, and its slot must be free (a max_send_wr 1 QP).
  ibv_wc send_wc(const QpContext& ctx, const provider::SendWqe& wqe, ibv_wc_status status) const;
  bool push_send_cqe(QpContext& ctx, const ibv_wc& wc);
  // To the QP's receive CQ, or, on an XRC target, to the CQ of the XRC SRQ the WQE came from.
  bool push_recv_cqe(QpContext& ctx, const ibv_wc& wc, bool solicited);
  void cq_overflow(QpContext& ctx);
  // Moves the QP to ERR (RC, or any QP for a receive-side error) or SQE (UC/UD send error)
  // and flushes what must be flushed.
  void qp_error(QpContext& ctx, ibv_qp_state to);
  void flush(QpContext& ctx);

  // ---- requester.cc ----
  void run_requester(QpContext& ctx);
  bool has_send_work(const QpContext& ctx) const;
  // kIdle: nothing posted beyond the cursor; kBlocked: a posted WQE must wait (see run_requester).
  enum class ReqStep : uint8_t { kSent, kIdle, kBlocked, kDone, kError };
  ReqStep start_or_continue(QpContext& ctx);
  ReqStep send_rc_uc_packet(QpContext& ctx, const provider::SendWqe& wqe, WqeState& w);
  ReqStep send_ud(QpContext& ctx, const provider::SendWqe& wqe, WqeState& w);
  ReqStep execute_local(QpContext& ctx, const provider::SendWqe& wqe, WqeState& w);
  // Begins a request packet of the QP's transport for an RC opcode: DestQP and PSN set, and on
  // an XRC initiator the XRCETH naming the WQE's remote XRC SRQ.
  wire::PacketHeaders begin_request(QpContext& ctx, const provider::SendWqe& wqe,
                                    uint8_t rc_opcode, size_t payload_len, uint32_t psn);
  bool window_open(const QpContext& ctx, const provider::SendWqe& wqe, const WqeState& w) const;
  // What the completer found, applied to the requester's state (its only writer).
  void apply_completer_result(QpContext& ctx, const CompleterResult& r);
  void retire(QpContext& ctx);
  void rewind(QpContext& ctx, uint32_t psn);

  // ---- completer.cc ----
  // A response (ACK, NAK, READ response, ATOMIC ACK) and the QP's timers, each through the
  // completer's states (CompleterSteps); what they found is applied to the requester.
  void handle_response(QpContext& ctx, const wire::PacketView& pkt);
  void fire_completer_timers(QpContext& ctx, uint64_t now_ns);
  // One of retry_cnt's retries (a local ACK timeout, a PSN sequence error NAK): resend from the
  // oldest unacknowledged PSN and true; with none left, the WQE at `oldest` completes with
  // RETRY_EXC_ERR (the QP enters ERR) and false.
  bool spend_retry(QpContext& ctx, uint32_t oldest, CompleterResult& r);
  // The requester sent a request packet: the local ACK timer runs (if it did not already).
  void request_sent(QpContext& ctx);
  // The transmit backlog drained after holding packets back for paused_ns: the local ACK and
  // RNR timers are pushed back by as much.
  void pause_timers(QpContext& ctx, uint64_t paused_ns);
  void fail_wqe_at(QpContext& ctx, uint32_t offset, ibv_wc_status status);
  // The SQ offset of the oldest WQE that still waits for the network, or nullopt.
  std::optional<uint32_t> oldest_outstanding(const QpContext& ctx) const;
  friend struct CompleterSteps;

  // ---- responder.cc ----
  void handle_request(QpContext& ctx, const wire::PacketView& pkt, const net::RxDatagram& d);
  void handle_ud_request(QpContext& ctx, const wire::PacketView& pkt, const net::RxDatagram& d);
  // READ responses are paced: run_responder sends at most kMaxPacketsPerTurn per turn, then
  // the requests that waited behind them (qp_context.h ReadReply, Responder::waiting).
  bool responder_busy(const QpContext& ctx) const;
  void run_responder(QpContext& ctx);
  void send_read_response(QpContext& ctx);
  void send_atomic_ack(QpContext& ctx, uint32_t psn, uint64_t orig);
  // The answer to an ATOMIC WRITE (rxe's): an RDMA READ Response Only without data.
  void send_empty_read_response(QpContext& ctx, uint32_t psn);
  // Tag-matching rendezvous (qp_context.h Rendezvous): whether a matched rendezvous request
  // could start now, starting it once its SEND completed (the READ into `buffer`, or at once
  // the completion and FIN when there is nothing to read or the RVH names more than the
  // buffer holds), and the engine's WQEs finishing (retire, flush; the WQE is off the queue).
  bool rendezvous_slot_free(const QpContext& ctx) const;
  void start_rendezvous(QpContext& ctx, const TmRecv& tm, const provider::RecvWork& buffer);
  void engine_wqe_done(QpContext& ctx, const provider::SendWqe& wqe, ibv_wc_status status);
  void finish_rendezvous_read(QpContext& ctx, Rendezvous& r, ibv_wc_status status);
  bool post_rendezvous_fin(QpContext& ctx, Rendezvous& r);
  friend struct ResponderSteps;

  provider::Device& device_;
  net::PacketIo& io_;
  const net::Clock& clock_;
  const EngineConfig config_;
  EngineCounters counters_;
  DoorbellRelay* relay_ = nullptr;
  std::atomic<bool> doorbell_rung_{false};
  RungQps rung_;                        // which QPs' doorbells rang (by handle)
  mutable std::recursive_mutex mutex_;  // poll() vs RESET / qp_destroyed from other threads
  // Control commands (qp_modified): queued by any thread under commands_mutex_, executed under
  // mutex_ by run_commands (the swap keeps the lock short).
  struct Command {
    provider::Qp* qp;
    ibv_qp_state from;
    ibv_qp_state to;
  };
  std::mutex commands_mutex_;
  std::vector<Command> commands_;
  std::vector<Command> running_commands_;  // under mutex_
  std::atomic<bool> commands_pending_{false};
  // Memory lifetime (memory_released): odd while a poll() turn runs, even between turns; bumped
  // (seq_cst) as a turn starts and ends. waiters_ counts threads inside memory_released, so a
  // turn's end makes a futex wake only when somebody waits.
  std::atomic<uint32_t> turn_epoch_{0};
  std::atomic<uint32_t> epoch_waiters_{0};
  std::map<uint32_t, std::unique_ptr<QpContext>> contexts_;
  std::vector<QpContext*> by_handle_;  // provider::Qp::handle() → context (kLimits.max_qp)
  // QPs poll() serves, in QPN order while it serves them (deterministic, as the simulation's
  // replay needs); QpContext::active says who is on it.
  std::vector<QpContext*> active_;
  std::vector<QpContext*> rung_now_;  // QPs whose doorbell this turn drained (send_posted_first)
  std::vector<QpContext*> acks_pending_;  // QPs with Responder::ack_pending (defer_ack)
  uint64_t turn_ = 0;                     // poll() turns so far (delayed ACKs)
  bool hold_acks_ = true;                 // this turn's poll(hold_acks)

  // Transmit: packets are built one at a time, each in its own TxSlot, and queued; the queue
  // goes to the PacketIo in one send_batch (sendmmsg on a socket) when it is full, at the end
  // of poll(), and before anything that hands memory a queued packet points into back to the
  // application (flush_tx). A slot's buf holds the headers (and, only when a packet needs more
  // iovecs than net::kMaxTxIov allows, a copy of the payload, then pad and ICRC); the payload
  // iovecs point into registered memory; trailer holds pad + ICRC after them.
  static constexpr size_t kMaxTxPayloadIov = net::kMaxTxIov - 2;  // less headers and trailer
  static constexpr size_t kMaxPadBytes = 3;  // IBA 9.2: PadCnt is 2 bits
  struct TxSlot {
    alignas(64) std::array<uint8_t, kMaxPacketBytes> buf{};
    std::array<uint8_t, kMaxPadBytes + wire::kIcrcBytes> trailer{};
    std::array<iovec, net::kMaxTxIov> iov{};
  };
  static constexpr size_t kTxBatch = net::kMaxBatch;
  std::vector<TxSlot> tx_slots_;                  // kTxBatch; [tx_queued_] is being built
  std::array<net::TxDatagram, kTxBatch> tx_queue_{};  // [0, tx_queued_): built, not yet sent
  size_t tx_queued_ = 0;
  bool tx_gathered_ = false;        // a queued packet's payload iovecs point outside its slot
  bool tx_building_ = false;        // between begin_packet and send_packet / tx_abandon
  TxSlot& tx_slot() { return tx_slots_[tx_queued_]; }
  size_t tx_payload_iov_ = 0;       // payload iovecs, at tx_slot().iov[1 ..]
  size_t tx_payload_added_ = 0;     // payload bytes added so far
  bool tx_payload_copied_ = false;  // the payload is in tx_slot().buf (the over-kMaxTxIov fallback)
  wire::PacketLayout tx_layout_;
  // The transmit backlog (tx_blocked()): whole datagrams, copied, since their iovecs pointed
  // into registered memory that must not be read after this turn (memory_released). Bounded:
  // beyond kMaxTxBacklog a datagram is dropped and counted in send_err, as a loss.
  struct Backlogged {
    std::vector<uint8_t> bytes;
    net::Endpoint dst;
    net::Address src;
    uint16_t src_port = 0;
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 0;
  };
  static constexpr size_t kMaxTxBacklog = 4096;
  std::deque<Backlogged> tx_backlog_;
  uint64_t tx_blocked_since_ns_ = 0;  // when the backlog last became non-empty
  // Receive buffers and slots for one batch.
  // rx_batch buffers of the size the I/O needs (at least kRxBufferBytes), allocated untouched.
  std::unique_ptr<uint8_t[]> rx_storage_;
  std::vector<net::RxDatagram> rx_slots_;
};

// Path MTU in bytes of an ibv_mtu (IBA 9.7.2: 256 << (code - 1)).
inline constexpr uint32_t mtu_bytes(ibv_mtu mtu) {
  return 256u << (static_cast<unsigned>(mtu) - 1);
}

}  // namespace urdma::engine
