// The engine's poll loop, its one receive pipeline (rxe_recv.c as the model of what to check),
// timers, packet transmission, completions and flushing.
#include "engine/engine.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/check.h"
#include "engine/sge_copy.h"
#include "net/icrc_flow.h"
#include "provider/limits.h"
#include "wire/psn.h"

namespace urdma::engine {
namespace {

// IBA 10.9.3 (P_Key matching): the low 15 bits must match; the device's only P_Key is the
// default full-membership 0xFFFF, which matches both 0xFFFF and the limited 0x7FFF.
constexpr uint16_t kPkeyBaseMask = 0x7FFF;

wire::Transport transport_of(ibv_qp_type type) {
  switch (type) {
    case IBV_QPT_RC:
      return wire::Transport::kRc;
    case IBV_QPT_UC:
      return wire::Transport::kUc;
    case IBV_QPT_UD:
      return wire::Transport::kUd;
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      return wire::Transport::kXrc;
    default:
      return wire::Transport::kNone;
  }
}

bool gid_is_zero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw)
    if (b != 0) return false;
  return true;
}


}  // namespace

Engine::Engine(provider::Device& device, net::PacketIo& io, const net::Clock& clock,
               EngineConfig config)
    : device_(device), io_(io), clock_(clock), config_(config) {
  base::check(config_.rx_batch >= 1 && config_.rx_batch <= net::kMaxBatch, "rx_batch out of range");
  base::check(config_.tx_batch >= 1 && config_.tx_batch <= kTxBatch, "tx_batch out of range");
  base::check(config_.ack_req_interval_pkts >= 1, "ack_req_interval_pkts must be >= 1");
  base::check(config_.max_unacked_pkts >= 1 && config_.max_unacked_pkts <= wire::kPsnHalfWindow,
              "max_unacked_pkts out of range");
  relay_ = dynamic_cast<DoorbellRelay*>(&device_.doorbell());
  base::check(relay_ != nullptr,
              "the Device must be created with DeviceConfig::doorbell = &an engine::DoorbellRelay");
  relay_->attach(this);
  by_handle_.assign(provider::kLimits.max_qp, nullptr);
  active_.reserve(provider::kLimits.max_qp);  // never reallocated while polling
  tx_slots_.resize(kTxBatch);
  // The I/O's need when it coalesces (UDP GRO: 64 KiB), else kRxBufferBytes.
  const size_t rx_buffer_bytes = std::max(kRxBufferBytes, io_.rx_buffer_bytes());
  rx_storage_ = std::make_unique_for_overwrite<uint8_t[]>(config_.rx_batch * rx_buffer_bytes);
  rx_slots_.resize(config_.rx_batch);
  for (size_t i = 0; i < config_.rx_batch; ++i)
    rx_slots_[i].buffer = {rx_storage_.get() + i * rx_buffer_bytes, rx_buffer_bytes};
}

Engine::~Engine() {
  if (relay_ != nullptr) relay_->attach(nullptr);
}

const QpContext* Engine::context(uint32_t qp_num) const {
  auto it = contexts_.find(qp_num);
  return it == contexts_.end() ? nullptr : it->second.get();
}

QpContext* Engine::find(uint32_t qp_num) {
  auto it = contexts_.find(qp_num);
  return it == contexts_.end() ? nullptr : it->second.get();
}

void Engine::forget(uint32_t qp_num) {
  auto it = contexts_.find(qp_num);
  if (it == contexts_.end()) return;
  QpContext* ctx = it->second.get();
  // An ACK still owed (EngineConfig::ack_delay_ns) acknowledges requests this side already
  // completed: it leaves now, or the peer retries into a QP that is gone (a program that
  // destroys its QP and exits right after its last receive completion).
  if (ctx->resp.ack_pending) {
    send_pending_ack(*ctx);
    flush_tx();
  }
  // A QP reset or destroyed while a tagged message or a rendezvous of a TM-SRQ was under way:
  // nothing completes for its tag any more, and its handle goes back to the list.
  if (provider::Srq* srq = ctx->qp->srq(); srq != nullptr && srq->tm()) {
    if (ctx->resp.has_recv && ctx->resp.tm.matched()) srq->release_tag_st(ctx->resp.tm.handle);
    for (const Rendezvous& r : ctx->resp.rndv)
      if (r.active && !r.read_done) srq->release_tag_st(r.handle);
  }
  std::erase(active_, ctx);
  std::erase(acks_pending_, ctx);
  by_handle_[ctx->qp->handle()] = nullptr;
  contexts_.erase(it);
}

// ---------------------------------------------------------------------------------------------
// Poll loop.

namespace {
// The engine whose poll() turn the calling thread is inside (memory_released from inside a
// turn — a CQ notify hook, a test callback — must not wait for itself).
thread_local const Engine* tls_turn_engine = nullptr;
}  // namespace

uint64_t Engine::poll(bool hold_acks, bool receive) {
  std::lock_guard lock(mutex_);
  const provider::EngineTurnMark turn;
  hold_acks_ = hold_acks;
  // Odd: a turn runs. seq_cst against memory_released's load (a Dekker pair with the MR
  // table's lock in between: a lookup in this turn precedes any table change that could have
  // invalidated it, so the changer's load sees this odd value or a later one).
  turn_epoch_.fetch_add(1, std::memory_order_seq_cst);
  const Engine* const outer = tls_turn_engine;
  tls_turn_engine = this;
  struct TurnEnd {
    Engine* e;
    const Engine* outer;
    ~TurnEnd() {
      tls_turn_engine = outer;
      e->turn_epoch_.fetch_add(1, std::memory_order_seq_cst);
      if (e->epoch_waiters_.load(std::memory_order_seq_cst) != 0) e->turn_epoch_.notify_all();
    }
  } turn_end{this, outer};
  // The turn's lookups share one hold of the MR table's lock (provider/mr_table.h).
  const provider::MrTable::TurnHold mr_hold(device_.mr_table());
  ++turn_;
  run_commands();
  // Read before it is taken: an idle busy-poll turn pays no locked instruction for it. A
  // seq_cst load, as the exchange was: the runtime's doorbell store before this turn and this
  // read are the two halves of its need-wakeup handshake (runtime.h).
  if (doorbell_rung_.load(std::memory_order_seq_cst) &&
      doorbell_rung_.exchange(false, std::memory_order_acq_rel)) {
    rung_.drain([this](uint32_t handle) {
      if (QpContext* ctx = by_handle_[handle]) {
        activate(*ctx);
        rung_now_.push_back(ctx);
      }
    });
  }
  flush_backlog();
  send_posted_first(receive);
  // The turn's time is taken before the socket is read: a timer fires only if it expired
  // before we last looked for its ACK. Read after, a turn preempted between the two (a loaded
  // host) judged an ACK that arrived in that gap, in time, as missing and resent the window.
  const uint64_t now_ns = clock_.now_ns();
  if (receive) receive_batch();
  sort_active();
  // Blocked on transmit: packets still in our backlog have not left, so no timer may count
  // them as lost; and nothing new is generated until the backlog drains.
  if (!tx_blocked()) fire_timers(now_ns);
  for (size_t i = 0; i < active_.size(); ++i) serve(*active_[i]);
  std::erase_if(active_, [this](QpContext* ctx) {
    if (needs_service(*ctx)) return false;
    ctx->active = false;
    return true;
  });
  // Nothing a turn built may wait past its end (memory_released: the turn's MR lookups).
  if (config_.ack_delay_ns == 0)
    send_pending_acks();
  else
    send_delayed_acks(/*held_too=*/true);
  flush_tx();
  return deadline_locked();
}

// What was just posted leaves before the socket is read. A thread that posts and then polls
// (ibv_post_send, then ibv_poll_cq: every hop of a ping-pong) would otherwise send its request
// only after a recvmmsg that usually finds nothing. Only the requesters of the QPs rung: a READ
// being answered on another QP keeps its one budget per turn. The ACK a QP held for its reply
// (ack_delay_ns) goes in the same send, right behind the request: sent after the socket was
// read, it would leave just as the peer's next request comes in, and delay it.
void Engine::send_posted_first(bool receive) {
  if (rung_now_.empty()) return;  // a busy poller's every empty turn
  if (receive && !tx_blocked()) {
    std::sort(rung_now_.begin(), rung_now_.end(),
              [](const QpContext* a, const QpContext* b) { return a->qpn < b->qpn; });
    for (QpContext* ctx : rung_now_) {
      const ibv_qp_state st = qp_state(*ctx);
      if (st == IBV_QPS_RTS || st == IBV_QPS_SQD) run_requester(*ctx);
    }
    if (config_.ack_delay_ns != 0) send_delayed_acks(/*held_too=*/true);
    flush_tx();
  }
  rung_now_.clear();
}

// QPN order, as a scan of every QP would have it: timers fire and QPs are served in a
// deterministic order (completions of QPs sharing a CQ interleave the same way every run).
void Engine::sort_active() {
  std::sort(active_.begin(), active_.end(),
            [](const QpContext* a, const QpContext* b) { return a->qpn < b->qpn; });
}

void Engine::activate(QpContext& ctx) {
  if (ctx.active) return;
  ctx.active = true;
  active_.push_back(&ctx);
}

void Engine::serve(QpContext& ctx) {
  // The receive side answers in RTR, RTS, SQD and SQE (IBA 10.3.1): paced READ responses and
  // the requests waiting behind them.
  if (qp_state(ctx) != IBV_QPS_ERR && !tx_blocked()) run_responder(ctx);
  const ibv_qp_state st = qp_state(ctx);
  if (st == IBV_QPS_ERR || st == IBV_QPS_SQE) {
    flush(ctx);  // SQE: the send queue only
    return;
  }
  if (tx_blocked()) return;  // stays active; served once the backlog drained
  run_requester(ctx);
  // A completion lost to a full CQ moved the QP to ERR without flushing (cq_overflow).
  const ibv_qp_state now = qp_state(ctx);
  if (now == IBV_QPS_ERR || now == IBV_QPS_SQE) flush(ctx);
}

// Whether poll() must keep serving the QP: what the doorbells, packets and modifies that put
// it on the active list do not cover any more.
bool Engine::needs_service(const QpContext& ctx) const {
  const ibv_qp_state st = qp_state(ctx);
  if (st == IBV_QPS_ERR || st == IBV_QPS_SQE) {
    const bool rq_waiting = st == IBV_QPS_ERR && ctx.qp->srq() == nullptr && ctx.qp->rq_size() > 0;
    return ctx.qp->sq_peek_st(0) != nullptr || rq_waiting ||
           (st == IBV_QPS_SQE && responder_busy(ctx));
  }
  return has_send_work(ctx) || responder_busy(ctx) || ctx.comp.retry_deadline_ns != net::kNever ||
         ctx.comp.rnr_deadline_ns != net::kNever;
}

uint64_t Engine::next_deadline_ns() const {
  if (doorbell_rung_.load(std::memory_order_acquire)) return 0;
  std::lock_guard lock(mutex_);
  const provider::EngineTurnMark turn;
  return deadline_locked();
}

// mutex_ held.
uint64_t Engine::deadline_locked() const {
  if (doorbell_rung_.load(std::memory_order_acquire)) return 0;
  uint64_t t = net::kNever;
  for (const QpContext* ctx : acks_pending_)
    if (ctx->resp.ack_pending) t = std::min(t, ack_due_ns(*ctx));
  for (const QpContext* ctx : active_) {
    const ibv_qp_state st = qp_state(*ctx);
    if (st == IBV_QPS_ERR || st == IBV_QPS_SQE) {
      if (needs_service(*ctx)) return 0;
      continue;
    }
    // Blocked on transmit: sending waits for the I/O (EPOLLOUT), and timers wait with it.
    if (tx_blocked()) continue;
    if (has_send_work(*ctx) || responder_busy(*ctx)) return 0;
    t = std::min({t, ctx->comp.retry_deadline_ns, ctx->comp.rnr_deadline_ns});
  }
  return t;
}

void Engine::fire_timers(uint64_t now_ns) {
  // Only QPs on the active list can have a timer armed (needs_service keeps them there).
  for (QpContext* ctx_ptr : active_) {
    QpContext& ctx = *ctx_ptr;
    const ibv_qp_state st = qp_state(ctx);
    if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) continue;
    fire_completer_timers(ctx, now_ns);
  }
}

// ---------------------------------------------------------------------------------------------
// Doorbell.

// Lock-free: the QP's bit, then the flag poll() and next_deadline_ns() look at.
void Engine::ring_sq(provider::Qp& qp) {
  rung_.set(qp.handle());
  doorbell_rung_.store(true, std::memory_order_release);
}
// A receive WQE matters to the engine's poll only in ERR, where it is flushed at once.
void Engine::ring_rq(provider::Qp& qp) {
  rung_.set(qp.handle());
  doorbell_rung_.store(true, std::memory_order_release);
}
// SRQ WQEs are taken when requests arrive; no QP needs serving for them.
void Engine::ring_srq(provider::Srq&) {
  doorbell_rung_.store(true, std::memory_order_release);
}

void Engine::srq_ops_posted(provider::Srq& srq) {
  std::lock_guard lock(mutex_);  // waits for the running turn
  const provider::EngineTurnMark turn;
  srq.run_ops_st();
}

// Control operations are commands the engine executes: a modify is queued and runs inline only
// when no turn is running (always so with one thread, so the simulation and the engine tests
// see every modify at the point of the call); otherwise the turn holder runs it before it next
// serves a doorbell or a received batch. RESET and destroy wait, because the provider empties
// the QP's queues (or frees them) as soon as they return (provider/doorbell.h); so does ERR,
// whose flush sends the ACK the QP still owes (flush): rdma_disconnect sends its DREQ as soon
// as the modify returns, and a DREQ that overtook that ACK would have the peer disconnect with
// the SEND it acknowledges unanswered — flushed, though it was delivered.
void Engine::qp_modified(provider::Qp& qp, ibv_qp_state from, ibv_qp_state to) {
  if (to == IBV_QPS_RESET) {
    std::lock_guard lock(mutex_);  // waits for the running turn
    const provider::EngineTurnMark turn;
    run_commands();
    forget(qp.qp_num());
    return;
  }
  {
    std::lock_guard lock(commands_mutex_);
    commands_.push_back(Command{&qp, from, to});
  }
  commands_pending_.store(true, std::memory_order_release);
  doorbell_rung_.store(true, std::memory_order_release);  // next_deadline_ns(): poll now
  std::unique_lock lock(mutex_, std::defer_lock);
  if (to == IBV_QPS_ERR)
    lock.lock();  // waits for the running turn
  else
    (void)lock.try_lock();
  if (lock.owns_lock()) {
    const provider::EngineTurnMark turn;
    run_commands();
  }
}

void Engine::run_commands() {
  if (!commands_pending_.load(std::memory_order_seq_cst) ||
      !commands_pending_.exchange(false, std::memory_order_acq_rel))
    return;
  {
    std::lock_guard lock(commands_mutex_);
    running_commands_.swap(commands_);
  }
  for (const Command& c : running_commands_) apply_modify(*c.qp, c.from, c.to);
  running_commands_.clear();
}

void Engine::apply_modify(provider::Qp& qp, ibv_qp_state from, ibv_qp_state to) {
  QpContext* ctx = find(qp.qp_num());
  if (ctx == nullptr) {
    auto owned = std::make_unique<QpContext>();
    ctx = owned.get();
    ctx->qp = &qp;
    ctx->qpn = qp.qp_num();
    ctx->type = qp.type();
    ctx->req.wqe_slots = size_t{qp.sq_capacity()} + 1;
    ctx->req.wqe = std::make_unique_for_overwrite<WqeState[]>(ctx->req.wqe_slots);
    base::check(qp.handle() < by_handle_.size(), "QP handle beyond the device's QP table");
    by_handle_[qp.handle()] = ctx;
    contexts_.emplace(qp.qp_num(), std::move(owned));
  }
  activate(*ctx);
  refresh(*ctx);
  ctx->applied_state = to;
  if (to == IBV_QPS_RTR && from != IBV_QPS_RTR) {
    ctx->resp = Responder{};
    ctx->resp.epsn = ctx->attr.rq_psn & wire::kPsnMask;
    ctx->resp.ackable_psn = wire::psn_sub(ctx->resp.epsn, 1);
    ctx->resp.resources.resize(std::max<size_t>(1, ctx->attr.max_dest_rd_atomic));
  }
  if (to == IBV_QPS_RTS && from == IBV_QPS_RTR) {
    ctx->req.next_psn = ctx->attr.sq_psn & wire::kPsnMask;
    ctx->comp = Completer{};
    ctx->comp.psn = ctx->req.next_psn;
    ctx->comp.retry_left = ctx->attr.retry_cnt;
    ctx->comp.rnr_retry_left = ctx->attr.rnr_retry;
  }
  if (to == IBV_QPS_RTS) ctx->req.blocked = false;  // SQD → RTS resumes
  if (to == IBV_QPS_ERR) {
    send_pending_ack(*ctx);  // as in forget(): the requests it acknowledges were completed
    flush(*ctx);
  }
  doorbell_rung_.store(true, std::memory_order_release);
}

void Engine::qp_destroyed(provider::Qp& qp) {
  std::lock_guard lock(mutex_);  // waits for the running turn
  const provider::EngineTurnMark turn;
  run_commands();                // none may name the QP after it is gone
  forget(qp.qp_num());
}

void Engine::srq_destroyed(provider::Srq& srq) {
  std::lock_guard lock(mutex_);  // waits for the running turn
  const provider::EngineTurnMark turn;
  for (auto& [qpn, owned] : contexts_) {
    Responder& resp = owned->resp;
    if (resp.recv_srq == &srq) {
      // The message being received into the SRQ's WQE is lost with it; its remaining packets
      // find no SRQ and are NAKed.
      resp.has_recv = false;
      resp.recv_srq = nullptr;
    }
    if (resp.read_reply.active && resp.read_reply.xrc_srq == &srq) resp.read_reply.active = false;
  }
}

void Engine::memory_released() {
  if (tls_turn_engine == this) return;
  epoch_waiters_.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t seen = turn_epoch_.load(std::memory_order_seq_cst);
  if (seen % 2 == 1) {
    // The turn `seen` may hold a pointer from before the caller's table change: wait until
    // the epoch moves (that turn ended; later turns look the table up afresh).
    uint32_t now = seen;
    while (now == seen) {
      turn_epoch_.wait(seen, std::memory_order_seq_cst);
      now = turn_epoch_.load(std::memory_order_seq_cst);
    }
  }
  epoch_waiters_.fetch_sub(1, std::memory_order_seq_cst);
}

EngineCounters Engine::counters_snapshot() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

ibv_qp_state Engine::qp_state(const QpContext& ctx) const {
  // RESET < INIT < RTR < the states of a QP that sends (RTS, SQD, SQE); ERR from anywhere.
  const auto rank = [](ibv_qp_state s) {
    return s == IBV_QPS_RESET ? 0 : s == IBV_QPS_INIT ? 1 : s == IBV_QPS_RTR ? 2 : 3;
  };
  const ibv_qp_state st = ctx.qp->state();
  if (st != IBV_QPS_ERR && rank(ctx.applied_state) < rank(st)) return ctx.applied_state;
  return st;
}

void Engine::refresh(QpContext& ctx) {
  ctx.attr = ctx.qp->attr_snapshot();
  const provider::AddressVector path = ctx.qp->path_snapshot();
  ctx.mtu = ctx.type == IBV_QPT_UD ? mtu_bytes(device_.active_mtu()) : mtu_bytes(ctx.attr.path_mtu);
  ctx.mtu = std::min<uint32_t>(ctx.mtu, kMaxMtuBytes);
  ctx.route.dst = gid_address(path.dgid);
  ctx.route.src = config_.local_address;
  ibv_gid sgid = {};
  if (device_.query_gid(provider::kPortNum, path.sgid_index, &sgid).ok() && !gid_is_zero(sgid))
    ctx.route.src = gid_address(sgid);
  ctx.route.src_port = roce_src_port(ctx.qpn);
  ctx.route.traffic_class = path.traffic_class;
  ctx.route.hop_limit = path.hop_limit;
}

// ---------------------------------------------------------------------------------------------
// Receive pipeline: the one demux point.

void Engine::receive_batch() {
  for (net::RxDatagram& slot : rx_slots_) {
    slot.length = 0;
    slot.truncated = false;
    slot.segment_bytes = 0;
  }
  const size_t n = io_.recv_batch(rx_slots_);
  // A modify queued during this turn (INIT → RTR, say) precedes the packets its peer sent
  // after learning of it: apply it before looking at them.
  if (n > 0) run_commands();
  for (size_t i = 0; i < n; ++i) {
    const net::RxDatagram& d = rx_slots_[i];
    if (d.segment_bytes == 0 || d.truncated) {
      handle_datagram(d);
      continue;
    }
    // Several datagrams of one flow in one receive (UDP GRO): each is a packet of its own.
    net::RxDatagram segment = d;
    segment.segment_bytes = 0;
    for (size_t at = 0; at < d.length; at += d.segment_bytes) {
      segment.length = std::min(d.segment_bytes, d.length - at);
      segment.buffer = d.buffer.subspan(at, segment.length);
      handle_datagram(segment);
    }
  }
  if (config_.ack_delay_ns == 0)
    send_pending_acks();
  else
    send_delayed_acks(/*held_too=*/false);
}

void Engine::handle_datagram(const net::RxDatagram& d) {
  ++counters_.rcvd_pkts;
  if (d.truncated) {
    ++counters_.drop_truncated;
    return;
  }
  const std::span<const uint8_t> bytes = d.buffer.first(d.length);

  // IBA 9.6 (packet header validation): malformed transport headers are silently dropped.
  const wire::ParseResult parsed = wire::parse_packet(bytes);
  if (!parsed.ok()) {
    ++counters_.drop_parse[static_cast<size_t>(parsed.error())];
    return;
  }
  const wire::PacketView& pkt = *parsed;

  // IBA 7.8.1 (C7-48) / annex A17.4.3.1: a packet whose ICRC does not check is dropped. One
  // that crossed no link may come unsealed (zero: net/packet_io.h, icrc_needed); its bytes are
  // the sender's, and the parser and the MR checks stand between them and memory as for any.
  const bool unsealed = d.via_ring && wire::icrc_of(bytes) == 0;
  if (config_.verify_icrc && !unsealed &&
      !net::icrc_ok(bytes, d.src, d.dst, config_.df_search)) {
    ++counters_.drop_icrc;
    return;
  }

  // IBA 9.6.1.1 / 10.9.3: P_Key check against the port's one P_Key (default, full member).
  if ((pkt.bth().pkey() & kPkeyBaseMask) != (wire::kDefaultPkey & kPkeyBaseMask)) {
    ++counters_.drop_pkey;
    return;
  }
  // RoCEv2 CNPs (annex A17.9.2): no congestion control yet; accepted and ignored.
  if (pkt.info().transport == wire::Transport::kCnp) return;

  // IBA 9.6.1.2: DestQP 0xFFFFFF is the multicast QPN: the packet goes to every QP attached
  // to its destination group.
  if (pkt.bth().dest_qp() == provider::kMulticastQpn) {
    handle_multicast(pkt, d);
    return;
  }
  // IBA 9.6.1.2: DestQP must name a QP of this CA.
  QpContext* ctx = find(pkt.bth().dest_qp());
  if (ctx == nullptr) {
    ++counters_.drop_unknown_qpn;
    return;
  }
  // Whatever the packet does (a response unblocking the requester, an error), poll() looks at
  // the QP this turn.
  activate(*ctx);
  // IBA 9.6.1.2: the opcode's transport must be the QP's service type.
  if (pkt.info().transport != transport_of(ctx->type)) {
    ++counters_.drop_qp_type;
    return;
  }
  // rxe check_type_state, before check_addr: a QP that has no path yet (RESET, INIT) fails
  // here, on its state.
  const bool request = pkt.info().is(wire::kRequest);
  // An XRC initiator only sends requests and an XRC target only answers them (IBA 9.2, XRC):
  // anything else names the wrong half of the connection.
  if ((ctx->type == IBV_QPT_XRC_SEND && request) || (ctx->type == IBV_QPT_XRC_RECV && !request)) {
    ++counters_.drop_qp_type;
    return;
  }
  const ibv_qp_state st = qp_state(*ctx);
  // IBA 10.3.1 (QP states): the receive side works in RTR, RTS, SQD and SQE; responses are
  // for a requester, which exists in RTS and SQD.
  const bool state_ok =
      request ? st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD || st == IBV_QPS_SQE
              : st == IBV_QPS_RTS || st == IBV_QPS_SQD;
  if (!state_ok) {
    ++counters_.drop_qp_state;
    return;
  }
  // rxe check_addr: a connected QP only accepts packets from its peer.
  if (ctx->type != IBV_QPT_UD && d.src.address != ctx->route.dst) {
    ++counters_.drop_address;
    return;
  }
  if (!request)
    handle_response(*ctx, pkt);
  else if (ctx->type == IBV_QPT_UD)
    handle_ud_request(*ctx, pkt, d);
  else
    handle_request(*ctx, pkt, d);
}

void Engine::handle_multicast(const wire::PacketView& pkt, const net::RxDatagram& d) {
  // IBA 10.5 (multicast) / 9.6.1.2: only UD carries multicast, and a RoCEv2 multicast packet
  // is addressed to the group's IP address (its GID), which the socket reports as the datagram's
  // destination. Anything else with DestQP 0xFFFFFF is dropped.
  ibv_gid dgid;
  std::memcpy(dgid.raw, d.dst.address.bytes().data(), sizeof dgid.raw);
  if (pkt.info().transport != wire::Transport::kUd || !pkt.info().is(wire::kRequest) ||
      !provider::gid_is_multicast(dgid)) {
    ++counters_.drop_mcast_invalid;
    return;
  }
  std::array<uint32_t, provider::kLimits.max_mcast_qp_attach> members;
  const size_t n = device_.mcast().members(d.dst.address.bytes(), members);
  // A sender's own QP gets its datagram back unless it was created with
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: the source is this host and the source QP is this one
  // (QPNs are unique on a host: urdmad hands out disjoint ranges).
  const uint32_t src_qp = pkt.deth()->src_qp();
  bool delivered = false;
  for (size_t i = 0; i < n; ++i) {
    QpContext* ctx = find(members[i]);
    if (ctx == nullptr || ctx->type != IBV_QPT_UD) continue;
    // As for a unicast request (handle_datagram): the receive side works in RTR..SQE.
    const ibv_qp_state st = qp_state(*ctx);
    if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) continue;
    if (ctx->qp->block_self_mcast_lb() && src_qp == ctx->qpn &&
        device_.has_gid(d.src.address.bytes()))
      continue;
    activate(*ctx);
    delivered = true;
    handle_ud_request(*ctx, pkt, d);  // the Q_Key check is per QP (IBA 10.2.5)
  }
  if (!delivered) ++counters_.drop_mcast_unattached;
}

// ---------------------------------------------------------------------------------------------
// Transmission.

wire::PacketHeaders Engine::begin_packet(uint8_t opcode, size_t payload_len) {
  const std::optional<wire::PacketLayout> layout = wire::packet_layout(opcode, payload_len);
  base::check(layout.has_value() && layout->total_length() <= kMaxPacketBytes,
              "engine built an invalid packet layout");
  tx_layout_ = *layout;
  tx_building_ = true;
  tx_payload_iov_ = 0;
  tx_payload_added_ = 0;
  tx_payload_copied_ = false;
  wire::PacketHeaders h = wire::write_headers(tx_slot().buf, tx_layout_);
  h.bth().set_pkey(wire::kDefaultPkey);
  return h;
}

void Engine::tx_add_payload(std::span<const uint8_t> piece) {
  if (piece.empty()) return;
  base::check(tx_payload_added_ + piece.size() <= tx_layout_.payload_length,
              "engine added more payload than the packet's layout holds");
  TxSlot& slot = tx_slot();
  uint8_t* const copy_at = slot.buf.data() + tx_layout_.payload_offset();
  if (!tx_payload_copied_ && tx_payload_iov_ == kMaxTxPayloadIov) {
    // More pieces than one datagram's iovecs (net::kMaxTxIov): copy what was gathered so far
    // into the slot's buf and the rest after it; the packet goes out as one contiguous iovec.
    size_t at = 0;
    for (size_t i = 1; i <= tx_payload_iov_; ++i) {
      std::memcpy(copy_at + at, slot.iov[i].iov_base, slot.iov[i].iov_len);
      at += slot.iov[i].iov_len;
    }
    tx_payload_iov_ = 0;
    tx_payload_copied_ = true;
    ++counters_.tx_payload_copies;
  }
  if (tx_payload_copied_) {
    std::memcpy(copy_at + tx_payload_added_, piece.data(), piece.size());
  } else {
    // The PacketIo only reads through iovecs (iovec's pointer is not const-qualified).
    slot.iov[1 + tx_payload_iov_++] = iovec{const_cast<uint8_t*>(piece.data()), piece.size()};
    tx_gathered_ = true;
  }
  tx_payload_added_ += piece.size();
}

bool Engine::tx_gather(QpContext& ctx, const provider::SendWqe& wqe, uint64_t offset,
                       uint64_t length) {
  return for_each_sge_piece(device_.mr_table(), ctx.qp->pd(), ctx.qp->sq_sges_st(wqe), offset,
                            length, SgeDirection::kFromSges,
                            [this](const uint8_t* mem, uint64_t n) {
                              tx_add_payload({mem, static_cast<size_t>(n)});
                            });
}

void Engine::send_packet(const Route& route) {
  base::check(tx_building_, "engine sent a packet it did not begin");
  base::check(tx_payload_added_ == tx_layout_.payload_length,
              "engine sent a packet whose payload was not filled in");
  TxSlot& slot = tx_slot();
  // The ICRC (IBA 7.8.1, annex A17.4.3.1) covers headers, payload and pad: the gather list
  // without the trailing ICRC slot.
  std::array<std::span<const uint8_t>, net::kMaxTxIov> pieces;
  size_t npieces = 0;
  size_t niov = 0;
  std::span<uint8_t> icrc_slot_owner;  // the span whose last kIcrcBytes are the ICRC
  if (tx_payload_iov_ == 0) {
    // Contiguous in the slot's buf: no payload, or the copy fallback.
    const std::span<uint8_t> datagram =
        std::span<uint8_t>(slot.buf).first(tx_layout_.total_length());
    wire::write_trailer(datagram.subspan(tx_layout_.pad_offset()), tx_layout_);
    pieces[npieces++] = datagram.first(tx_layout_.icrc_offset());
    slot.iov[niov++] = iovec{datagram.data(), datagram.size()};
    icrc_slot_owner = datagram;
  } else {
    const std::span<uint8_t> trailer =
        std::span<uint8_t>(slot.trailer).first(tx_layout_.trailer_length());
    wire::write_trailer(trailer, tx_layout_);
    pieces[npieces++] = std::span<const uint8_t>(slot.buf).first(tx_layout_.header_length);
    slot.iov[niov++] = iovec{slot.buf.data(), tx_layout_.header_length};
    for (size_t i = 0; i < tx_payload_iov_; ++i, ++niov)
      pieces[npieces++] = {static_cast<const uint8_t*>(slot.iov[niov].iov_base),
                           slot.iov[niov].iov_len};
    if (tx_layout_.pad > 0) pieces[npieces++] = trailer.first(tx_layout_.pad);
    slot.iov[niov++] = iovec{trailer.data(), trailer.size()};
    icrc_slot_owner = trailer;
  }
  const std::span<const std::span<const uint8_t>> gather(pieces.data(), npieces);
  // The ICRC covers the UDP source port the datagram really leaves from, which the I/O decides
  // (a socket sends only from ports it is bound to: net/udp_socket_io.h).
  const net::Endpoint src{route.src, io_.source_port(route.src_port)};
  const net::Endpoint dst{route.dst, net::kRoceV2UdpPort};
  // Addresses of mixed families (an IPv4 GID towards an IPv6 one) name no datagram the kernel
  // can send; such a packet keeps a zero ICRC and the send fails. A datagram that will cross no
  // link (a shared-memory ring) goes unsealed: zero (net/packet_io.h, icrc_needed).
  const uint32_t dest_qp = wire::BthView(slot.buf.data()).dest_qp();
  wire::store_icrc(icrc_slot_owner, io_.icrc_needed(dst, dest_qp)
                                        ? net::icrc_for(src, dst, gather).value_or(0)
                                        : 0);
  net::TxDatagram& tx = tx_queue_[tx_queued_];
  tx = net::TxDatagram{};
  tx.iov = {slot.iov.data(), niov};
  tx.dst = dst;
  tx.src_port = src.port;
  tx.src = route.src;
  tx.traffic_class = route.traffic_class;
  tx.hop_limit = route.hop_limit;
  ++counters_.sent_pkts;
  tx_building_ = false;
  ++tx_queued_;
  // Behind a backlog nothing may overtake it: flush_tx moves the queue behind it at once.
  if (tx_queued_ >= config_.tx_batch || !tx_backlog_.empty()) flush_tx();
}

void Engine::flush_tx() {
  if (tx_queued_ == 0) return;
  base::check(!tx_building_, "engine flushed its transmit queue in the middle of a packet");
  const std::span<const net::TxDatagram> batch(tx_queue_.data(), tx_queued_);
  size_t done = 0;
  if (tx_backlog_.empty()) {
    if (batch.size() == 1) {
      const net::TxStatus status = io_.send(batch[0]);
      if (status != net::TxStatus::kWouldBlock) done = 1;
      if (status == net::TxStatus::kRejected) ++counters_.send_err;
    } else {
      // Rejected datagrams (too big, no route) are consumed like sent ones and counted by the
      // I/O: lost like a dropped packet; retransmission recovers (RC).
      const uint64_t rejected_before = io_.counters().tx_rejected;
      done = io_.send_batch(batch);
      counters_.send_err += io_.counters().tx_rejected - rejected_before;
    }
  }
  // Refused for now: keep copies, in order (back-pressure: a full local socket buffer costs
  // neither a retransmission nor a lost UD datagram).
  for (size_t i = done; i < batch.size(); ++i) backlog(batch[i]);
  tx_queued_ = 0;
  tx_gathered_ = false;
}

void Engine::backlog(const net::TxDatagram& tx) {
  if (tx_backlog_.size() >= kMaxTxBacklog) {
    ++counters_.send_err;  // lost like a dropped packet; retransmission recovers (RC)
    return;
  }
  ++counters_.tx_blocked;
  if (tx_backlog_.empty()) tx_blocked_since_ns_ = clock_.now_ns();
  Backlogged& b = tx_backlog_.emplace_back();
  b.bytes.reserve(tx.size_bytes());
  for (const iovec& v : tx.iov) {
    const auto* p = static_cast<const uint8_t*>(v.iov_base);
    b.bytes.insert(b.bytes.end(), p, p + v.iov_len);
  }
  b.dst = tx.dst;
  b.src = tx.src;
  b.src_port = tx.src_port;
  b.traffic_class = tx.traffic_class;
  b.hop_limit = tx.hop_limit;
}

void Engine::flush_backlog() {
  if (tx_backlog_.empty()) return;
  while (!tx_backlog_.empty()) {
    const Backlogged& b = tx_backlog_.front();
    const iovec iov{const_cast<uint8_t*>(b.bytes.data()), b.bytes.size()};
    net::TxDatagram tx;
    tx.iov = {&iov, 1};
    tx.dst = b.dst;
    tx.src = b.src;
    tx.src_port = b.src_port;
    tx.traffic_class = b.traffic_class;
    tx.hop_limit = b.hop_limit;
    const net::TxStatus status = io_.send(tx);
    if (status == net::TxStatus::kWouldBlock) return;
    if (status == net::TxStatus::kRejected) ++counters_.send_err;
    tx_backlog_.pop_front();
  }
  // Drained: the timers did not run while packets waited here (poll() does not fire them then),
  // and the packets left only now — move the deadlines by the time they waited.
  const uint64_t now = clock_.now_ns();
  const uint64_t paused = now > tx_blocked_since_ns_ ? now - tx_blocked_since_ns_ : 0;
  for (QpContext* ctx : active_) pause_timers(*ctx, paused);
}

void Engine::defer_ack(QpContext& ctx, uint32_t psn) {
  if (!ctx.resp.ack_pending) {
    acks_pending_.push_back(&ctx);
    if (config_.ack_delay_ns != 0) {
      // Held only on a QP in a conversation; otherwise it leaves at the end of the batch, as
      // with no delay (a one-way stream's sender waits for its window).
      ctx.resp.ack_owed_ns = clock_.now_ns();
      ctx.resp.ack_held = ctx.resp.converse && hold_acks_;
    }
  }
  ctx.resp.ack_pending = true;
  ctx.resp.ack_psn = psn;
  ctx.resp.ack_msn = ctx.resp.msn;
}

uint64_t Engine::ack_due_ns(const QpContext& ctx) const {
  return ctx.resp.ack_owed_ns + (ctx.resp.ack_held ? config_.ack_delay_ns : 0);
}

void Engine::note_request_start(QpContext& ctx) {
  ctx.resp.reply_turn = turn_;
  if (ctx.resp.converse) return;
  if (clock_.now_ns() - ctx.resp.ack_owed_ns <= config_.ack_delay_ns) ctx.resp.converse = true;
}

void Engine::send_pending_ack(QpContext& ctx) {
  if (!ctx.resp.ack_pending) return;
  ctx.resp.ack_pending = false;
  ctx.resp.ack_held = false;
  wire::PacketHeaders h = begin_packet(ctx.opcode(wire::op::kRcAck), 0);
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(ctx.resp.ack_psn & wire::kPsnMask);
  h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  h.aeth()->set_msn(ctx.resp.ack_msn & wire::kPsnMask);
  send_packet(ctx.route);
}

void Engine::send_pending_acks() {
  for (QpContext* ctx : acks_pending_) send_pending_ack(*ctx);
  acks_pending_.clear();
}

void Engine::send_delayed_acks(bool held_too) {
  if (acks_pending_.empty()) return;
  const uint64_t now = clock_.now_ns();
  std::erase_if(acks_pending_, [&](QpContext* ctx) {
    if (!ctx->resp.ack_pending) return true;  // sent before another response
    // Not held: it leaves at the end of the batch that owed it. Held: at the end of the turn
    // in which its QP started a reply (behind the reply's packets), or when due.
    if (ctx->resp.ack_held) {
      if (!held_too) return false;
      if (ctx->resp.reply_turn != turn_) {
        if (now < ack_due_ns(*ctx)) return false;
        ctx->resp.converse = false;  // no reply came in time: ACK at once until one does
      }
    }
    send_pending_ack(*ctx);
    return true;
  });
}

void Engine::send_ack(QpContext& ctx, uint8_t syndrome, uint32_t psn) {
  send_pending_ack(ctx);
  wire::PacketHeaders h = begin_packet(ctx.opcode(wire::op::kRcAck), 0);
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(psn & wire::kPsnMask);
  h.aeth()->set_syndrome(syndrome);
  h.aeth()->set_msn(ctx.resp.msn & wire::kPsnMask);
  send_packet(ctx.route);
}

// ---------------------------------------------------------------------------------------------
// Completions, errors, flush.

ibv_wc Engine::send_wc(const QpContext& ctx, const provider::SendWqe& wqe,
                       ibv_wc_status status) const {
  ibv_wc wc = {};
  wc.wr_id = wqe.wr_id;
  wc.status = status;
  const provider::SendOpcodeInfo* info = provider::send_opcode_info(wqe.opcode);
  wc.opcode = info != nullptr ? info->wc_opcode : IBV_WC_SEND;
  wc.byte_len = static_cast<uint32_t>(wqe.length);
  wc.qp_num = ctx.qpn;
  return wc;
}

bool Engine::push_send_cqe(QpContext& ctx, const ibv_wc& wc) {
  // The application may reuse the WR's buffers once it sees the completion.
  flush_tx();
  if (ctx.qp->send_cq()->push_st(wc, false)) return true;
  cq_overflow(ctx);
  return false;
}

bool Engine::push_recv_cqe(QpContext& ctx, const ibv_wc& wc, bool solicited) {
  // An XRC target's completions go to the CQ of the XRC SRQ the message took its WQE from; a
  // tag-matching SRQ reports every completion of its WQEs and tags to its own CQ
  // (Documentation/tag_matching.md).
  provider::Cq* cq = nullptr;
  if (ctx.resp.recv_srq != nullptr) {
    cq = ctx.resp.recv_srq->cq();
  } else {
    const provider::Srq* srq = ctx.qp->srq();
    cq = srq != nullptr && srq->tm() ? srq->tm_cq() : ctx.qp->recv_cq();
  }
  if (cq == nullptr) return true;  // an XRC target whose SRQ went: nothing to complete into
  if (cq->push_st(wc, solicited)) return true;
  cq_overflow(ctx);
  return false;
}

void Engine::cq_overflow(QpContext& ctx) {
  ++counters_.cqe_overflow;
  // IBA 11.4.2.1 (CQ overrun; the CQ raised IBV_EVENT_CQ_ERR): the completion is lost, so the
  // QP it belonged to cannot go on — it enters ERR with an affiliated QP_FATAL event, as Linux
  // rxe's completer and responder move their QP to error when rxe_cq_post fails. Not flushed
  // here (a push may come from inside flush() itself): poll() flushes it when serving it.
  if (ctx.qp->enter_error_st(IBV_QPS_ERR)) ctx.qp->raise_event(IBV_EVENT_QP_FATAL);
  activate(ctx);
}

void Engine::qp_error(QpContext& ctx, ibv_qp_state to) {
  ctx.qp->enter_error_st(to);
  flush(ctx);
}

void Engine::flush(QpContext& ctx) {
  const ibv_qp_state st = qp_state(ctx);
  if (st != IBV_QPS_ERR && st != IBV_QPS_SQE) return;
  // Send queue: WQEs already finished complete with their own status, in order, up to the
  // first one that failed or had not finished; that one and every later one complete with
  // WR_FLUSH_ERR — even a local operation (BIND_MW, LOCAL_INV) the requester already executed
  // ahead of the failure (IBA 10.3.1.5 SQE, 10.3.1.6 Error: outstanding and newly posted WRs
  // complete with a flush error).
  Requester& req = ctx.req;
  send_pending_ack(ctx);  // what was acknowledged stays acknowledged
  flush_tx();  // queued packets may point into WQEs popped below (their inline data)
  bool flushing = false;
  while (const provider::SendWqe* wqe = ctx.qp->sq_peek_st(0)) {
    const bool started = req.started > 0;
    const WqeState w = started ? req.at(0) : WqeState{};
    std::optional<ibv_wc> wc;
    if (!flushing && started && w.stage == WqeStage::kDone) {
      flushing = w.status != IBV_WC_SUCCESS;
      const bool signaled = w.status != IBV_WC_SUCCESS || ctx.qp->sq_sig_all() ||
                            (wqe->send_flags & IBV_SEND_SIGNALED);
      if (signaled) wc = send_wc(ctx, *wqe, w.status);
    } else {
      flushing = true;
      wc = send_wc(ctx, *wqe, IBV_WC_WR_FLUSH_ERR);
    }
    const provider::SendWqe done = *wqe;
    ctx.qp->sq_pop_st();
    if (done.send_flags & provider::kSendFlagEngine)
      engine_wqe_done(ctx, done, wc ? wc->status : IBV_WC_SUCCESS);  // no CQ entry
    else if (wc)
      push_send_cqe(ctx, *wc);
    ++req.head_seq;
    if (req.started > 0) --req.started;
  }
  req.cur = 0;
  req.cur_offset = 0;
  req.started = 0;
  req.rd_atomic_outstanding = 0;
  ctx.comp.retry_deadline_ns = net::kNever;
  ctx.comp.rnr_deadline_ns = net::kNever;
  if (st != IBV_QPS_ERR) return;

  // Receive side (ERR only): the WQE being filled, then the QP's own receive queue. WQEs still
  // in an SRQ belong to the other QPs sharing it and are not flushed (IBA 10.2.9.5).
  Responder& resp = ctx.resp;
  auto flush_recv = [&](uint64_t wr_id) {
    ibv_wc wc = {};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = ctx.qpn;
    // A WQE or tagged buffer of a tag-matching SRQ flushes as the TM completion it was to be.
    if (resp.tm.kind == TmKind::kNoTag) wc.opcode = IBV_WC_TM_NO_TAG;
    if (resp.tm.kind != TmKind::kNoTag && resp.tm.kind != TmKind::kNone) wc.opcode = IBV_WC_TM_RECV;
    push_recv_cqe(ctx, wc, false);
  };
  if (resp.has_recv) {
    flush_recv(resp.recv.wr_id);
    if (resp.tm.matched()) ctx.qp->srq()->release_tag_st(resp.tm.handle);
    resp.has_recv = false;
  }
  resp.recv_srq = nullptr;
  resp.tm = TmRecv{};
  // No more READ responses, and nothing answers the requests that waited behind them.
  resp.read_reply.active = false;
  resp.waiting.clear();
  if (ctx.qp->srq() == nullptr) {
    // A receive posted from now on reads ERR and wakes the engine for its own flush
    // (DoorbellRelay::ring_rq); one posted before is taken here.
    ctx.qp->sync_with_recv_posters_st();
    provider::RecvWork work;
    while (ctx.qp->take_recv_st(work)) flush_recv(work.wr_id);
  } else if (ctx.qp->srq() != nullptr && !ctx.last_wqe_event_raised) {
    // IBA 11.6.3 / ibv_get_async_event(3): a QP on an SRQ that enters ERR reports that no
    // further WQE of the SRQ will be consumed by it.
    ctx.last_wqe_event_raised = true;
    ctx.qp->raise_event(IBV_EVENT_QP_LAST_WQE_REACHED);
  }
}

}  // namespace urdma::engine
