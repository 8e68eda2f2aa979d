// The completer: ACKs, NAKs and responses → finished WQEs → completions in posting order; also
// the local ACK and RNR timers and the retry counters (rxe_comp.c as the model: a loop over
// named states, each a function returning the next state, each error its own state).
//
//   a response:  GET_ACK → CHECK_PSN → CHECK_ACK → WRITE_SEND | READ | ATOMIC | NAK → DONE
//                NAK → RNR_RETRY | NAK_PSN_SEQ → ERROR_RETRY | ERROR
//                side exits: DUPLICATE, DROP_QP_TYPE, DROP_BAD_RESPONSE, ERR_LOCAL_PROTECTION
//   the timers:  RNR_TIMER → ACK_TIMER → ERROR_RETRY → DONE
//
// Rules enforced (IBA 9.7.5.1, requester side of the reliable service):
//  * ACKs are cumulative: an ACK of PSN p acknowledges every request packet up to p.
//  * A READ response or ATOMIC ACK implicitly acknowledges every earlier SEND/WRITE.
//  * Responses are accepted only in PSN order; anything else is dropped (the timer recovers).
//  * NAK PSN sequence error → resend from the NAK'ed PSN, once until something is acknowledged
//    (more NAKs of that PSN name the gap already being resent); RNR NAK → wait the RNR timer,
//    resend; other NAKs fail the WQE with the matching status and move the QP to ERR.
//  * Local ACK timeout → resend from the oldest unacknowledged PSN, retry_cnt times.
//  * An ACK beyond an outstanding READ/ATOMIC that got no response → its response was lost:
//    resend it from its next response PSN at once (rxe_comp.c check_psn → COMPST_ERROR_RETRY).
//
// Ownership. The completer writes only its own state (Completer: comp.psn, the retry budgets
// and timers) and the response side of the per-WQE records (stage kSent → kDone, status,
// resp_psn, resp_bytes). What the requester must do about it — go back N, go on after being
// blocked, free max_rd_atomic slots — is returned as a CompleterResult that
// Engine::apply_completer_result (requester.cc) applies; the completer never writes the
// requester's cursor, blocked flag or counts.
#include <array>
#include <atomic>
#include <cstring>

#include "base/check.h"
#include "engine/engine.h"
#include "engine/sge_copy.h"
#include "wire/psn.h"

namespace urdma::engine {
namespace {

// IBA 9.7.5.1.4 / table "NAK codes" → the requester's completion status (ibv_wc_status).
ibv_wc_status nak_status(uint8_t code) {
  switch (static_cast<wire::NakCode>(code)) {
    case wire::NakCode::kInvalidRequest:
      return IBV_WC_REM_INV_REQ_ERR;
    case wire::NakCode::kRemoteAccessError:
      return IBV_WC_REM_ACCESS_ERR;
    case wire::NakCode::kRemoteOperationalError:
      return IBV_WC_REM_OP_ERR;
    case wire::NakCode::kInvalidRdRequest:
      return IBV_WC_REM_INV_RD_REQ_ERR;
    default:
      return IBV_WC_REM_OP_ERR;
  }
}

}  // namespace

std::optional<uint32_t> Engine::oldest_outstanding(const QpContext& ctx) const {
  for (uint32_t i = 0; i < ctx.req.started; ++i) {
    const WqeStage s = ctx.req.at(i).stage;
    if (s == WqeStage::kSending || s == WqeStage::kSent) return i;
    if (s == WqeStage::kNew) break;
  }
  return std::nullopt;
}

enum class CompState : uint8_t {
  kGetAck,
  kCheckPsn,
  kCheckAck,
  kWriteSend,
  kRead,
  kAtomic,
  kNak,
  kRnrRetry,
  kNakPsnSeq,
  kErrorRetry,
  kError,
  kRnrTimer,
  kAckTimer,
  kDuplicate,
  kDropQpType,
  kDropBadResponse,
  kErrLocalProtection,
  kDone,
  kCount,
};
constexpr std::array<const char*, static_cast<size_t>(CompState::kCount)> kCompStateNames = {
    "GET_ACK",
    "CHECK_PSN",
    "CHECK_ACK",
    "WRITE_SEND",
    "READ",
    "ATOMIC",
    "NAK",
    "RNR_RETRY",
    "NAK_PSN_SEQ",
    "ERROR_RETRY",
    "ERROR",
    "RNR_TIMER",
    "ACK_TIMER",
    "DUPLICATE",
    "DROP_QP_TYPE",
    "DROP_BAD_RESPONSE",
    "ERR_LOCAL_PROTECTION",
    "DONE",
};

const char* comp_state_name(CompState s) {
  return kCompStateNames[static_cast<size_t>(s)];
}

// One response (pkt set) or one firing of the QP's timers (pkt null) going through the states.
struct CompleterSteps {
  Engine& e;
  QpContext& ctx;
  Completer& comp;
  Requester& req;
  CompleterResult& r;
  const wire::PacketView* const pkt;
  const uint32_t psn;              // the response's PSN
  uint64_t now_ns = 0;             // the timers: the time they are checked at
  std::optional<uint32_t> oldest;  // NAK, ACK_TIMER: the oldest WQE waiting for the network
  uint32_t wqe_at = 0;             // READ, ATOMIC: the WQE the response answers

  CompleterSteps(Engine& engine, QpContext& c, const wire::PacketView* p, CompleterResult& result)
      : e(engine),
        ctx(c),
        comp(c.comp),
        req(c.req),
        r(result),
        pkt(p),
        psn(p != nullptr ? p->bth().psn() : 0) {}

  void run(CompState s) {
    for (int guard = 0; s != CompState::kDone; ++guard) {
      base::check(guard < 16, "completer state machine does not terminate");
      s = step(s);
    }
  }

  CompState step(CompState s) {
    switch (s) {
      case CompState::kGetAck:
        return get_ack();
      case CompState::kCheckPsn:
        return check_psn();
      case CompState::kCheckAck:
        return check_ack();
      case CompState::kWriteSend:
        return write_send();
      case CompState::kRead:
        return read();
      case CompState::kAtomic:
        return atomic();
      case CompState::kNak:
        return nak();
      case CompState::kRnrRetry:
        return rnr_retry();
      case CompState::kNakPsnSeq:
        return nak_psn_seq();
      case CompState::kErrorRetry:
        return error_retry();
      case CompState::kError:
        return error();
      case CompState::kRnrTimer:
        return rnr_timer();
      case CompState::kAckTimer:
        return ack_timer();
      case CompState::kDuplicate:
        ++e.counters_.duplicate_response;  // a copy of one already processed (network duplicate)
        return CompState::kDone;
      case CompState::kDropQpType:
        ++e.counters_.drop_qp_type;
        return CompState::kDone;
      case CompState::kDropBadResponse:
        ++e.counters_.drop_bad_response;
        return CompState::kDone;
      case CompState::kErrLocalProtection:
        e.fail_wqe_at(ctx, wqe_at, IBV_WC_LOC_PROT_ERR);
        return CompState::kDone;
      default:
        return CompState::kDone;
    }
  }

  // ---- GET_ACK: only RC and the XRC initiator have responses.
  CompState get_ack() const {
    return ctx.type == IBV_QPT_RC || ctx.type == IBV_QPT_XRC_SEND ? CompState::kCheckPsn
                                                                  : CompState::kDropQpType;
  }

  // ---- CHECK_PSN: a response must name a PSN we sent and have not seen acknowledged:
  // [comp.psn − 1 (a repeated ACK), next_psn). Anything else is stale or forged.
  CompState check_psn() const {
    if (!wire::psn_lt(psn, req.next_psn)) return CompState::kDropBadResponse;
    if (wire::psn_lt(psn, wire::psn_sub(comp.psn, 1))) return CompState::kDuplicate;
    return CompState::kCheckAck;
  }

  // ---- CHECK_ACK: which response it is.
  CompState check_ack() const {
    // RC and XRC responses share their operation bits (IBA 9.2).
    const uint8_t opcode = wire::op::operation(pkt->opcode());
    if (opcode == wire::op::kRcAck) {
      const wire::AethView aeth = *pkt->aeth();
      if (aeth.is_ack()) return CompState::kWriteSend;
      if (aeth.is_nak() || aeth.is_rnr_nak()) return CompState::kNak;
      return CompState::kDropBadResponse;  // reserved syndrome type
    }
    // IBA 1.5: an ATOMIC WRITE is answered by an RDMA READ Response Only without data (rxe's
    // send_read_response_ack); it acknowledges the ATOMIC WRITE's PSN as an ACK would.
    if (opcode == wire::op::kRcReadResponseOnly && pkt->payload().empty() &&
        answers_atomic_write()) {
      return pkt->aeth()->is_ack() ? CompState::kWriteSend : CompState::kDropBadResponse;
    }
    if (pkt->info().is(wire::kReadResponse)) return CompState::kRead;
    if (opcode == wire::op::kRcAtomicAck) return CompState::kAtomic;
    return CompState::kDropBadResponse;
  }

  // Whether the response's PSN is that of a sent ATOMIC WRITE.
  bool answers_atomic_write() const {
    for (uint32_t i = 0; i < req.started; ++i) {
      const WqeState& w = req.at(i);
      if (w.stage == WqeStage::kNew) break;
      if (w.stage == WqeStage::kDone || w.npkts == 0 || !wire::in_window(psn, w.first_psn, w.npkts))
        continue;
      const provider::SendWqe* wqe = ctx.qp->sq_peek_st(i);
      return wqe != nullptr && wqe->opcode == IBV_WR_ATOMIC_WRITE;
    }
    return false;
  }

  // ---- WRITE_SEND: an ACK, cumulative (IBA 9.7.5.1.1).
  CompState write_send() {
    ack_through(psn);
    return CompState::kDone;
  }

  // Acknowledges every request packet up to `acked` (an ACK's PSN, or the PSN before a NAK's).
  void ack_through(uint32_t acked) {
    uint32_t acked_to = wire::psn_next(acked);  // first PSN this ACK does not cover
    for (uint32_t i = 0; i < req.started; ++i) {
      WqeState& w = req.at(i);
      if (w.stage == WqeStage::kDone || w.npkts == 0) continue;
      if (w.stage == WqeStage::kNew) break;
      if (w.rd_atomic) {
        // A READ/ATOMIC finishes only with its response; the ACK covers nothing past it.
        if (wire::psn_gt(acked_to, w.resp_psn)) acked_to = w.resp_psn;
        progress(acked_to);
        // An ACK of a request after it means the responder has answered it already (it answers
        // in PSN order): the response from resp_psn on was lost. Ask again now rather than after
        // the local ACK timeout (rxe_comp.c check_psn: a response past an unanswered READ or
        // ATOMIC → COMPST_ERROR_RETRY; IBA 9.7.5.1.x). Once per gap, as a lost READ response
        // below: no retry is charged, so reordering costs a resend, never the QP.
        if (wire::psn_gt(acked, w.last_psn())) request_again(w.resp_psn);
        return;
      }
      if (wire::psn_lt(acked, w.last_psn())) break;
      w.stage = WqeStage::kDone;
    }
    progress(acked_to);
  }

  // Resend a READ/ATOMIC from `from` at once, once per gap (a burst of later responses or ACKs
  // does not trigger a burst of requests). Only progress opens a new gap, so it costs no retry.
  void request_again(uint32_t from) {
    if (comp.read_gap_pending && comp.read_gap_psn == from) return;
    comp.read_gap_pending = true;
    comp.read_gap_psn = from;
    ++e.counters_.completer_retry_err;
    r.rewind_to = from;
  }

  void progress(uint32_t next_unacked_psn) {
    if (!wire::psn_gt(next_unacked_psn, comp.psn)) return;
    comp.psn = next_unacked_psn;
    // Forward progress restores the retry budgets (rxe resets them per completed WQE).
    comp.retry_left = ctx.attr.retry_cnt;
    comp.rnr_retry_left = ctx.attr.rnr_retry;
    comp.retry_started = false;
    r.progress = true;
    const uint64_t now = e.clock_.now_ns();
    comp.retry_deadline_ns =
        wire::psn_lt(comp.psn, req.next_psn) && comp.rnr_deadline_ns == net::kNever
            ? now + std::min(ack_timeout_ns(ctx.attr.timeout), net::kNever - now)
            : net::kNever;
  }

  // The outstanding READ or ATOMIC the response answers: its SQ offset in wqe_at, and its WQE.
  // SEND/WRITEs before it are implicitly acknowledged on the way (IBA 9.7.5.1.2: a response
  // acknowledges every earlier request). nullptr when the response matches nothing outstanding.
  const provider::SendWqe* find_rd_atomic_answered() {
    for (uint32_t i = 0; i < req.started; ++i) {
      WqeState& w = req.at(i);
      if (w.stage == WqeStage::kDone || w.npkts == 0) continue;
      if (w.stage == WqeStage::kNew) break;  // never sent: nothing can answer it
      if (w.rd_atomic) {
        wqe_at = i;
        const provider::SendWqe* wqe = ctx.qp->sq_peek_st(i);
        base::check(wqe != nullptr, "started WQE missing from the send queue");
        return wqe;
      }
      if (!wire::psn_gt(psn, w.last_psn())) break;
      w.stage = WqeStage::kDone;  // implied ACK
    }
    return nullptr;
  }

  // A READ response or ATOMIC ACK that is not the one `w` waits for (an ATOMIC ACK is owed
  // first, or a duplicate, or a gap): what w waits for is all that is acknowledged. If it is past
  // that, w's response (the rest of a READ, or an ATOMIC's ACK) was lost — the responder answers
  // in PSN order — so ask again for it at once rather than after the ACK timeout. rxe does the
  // same (rxe_comp.c check_psn: a response past an unanswered READ or ATOMIC →
  // COMPST_ERROR_RETRY); without it each lost ATOMIC ACK in a pipeline waited a whole ACK
  // timeout.
  CompState not_awaited(const WqeState& w) {
    progress(w.resp_psn);
    if (wire::psn_gt(psn, w.resp_psn)) request_again(w.resp_psn);
    return CompState::kDone;
  }

  // ---- READ: a READ response, placed into the WQE's SGEs in order.
  CompState read() {
    const provider::SendWqe* wqe = find_rd_atomic_answered();
    if (wqe == nullptr) return CompState::kDropBadResponse;
    WqeState& w = req.at(wqe_at);
    if (wqe->opcode != IBV_WR_RDMA_READ || psn != w.resp_psn) return not_awaited(w);
    // IBA 9.5 / 9.7.5.1.x: First and Middle responses carry exactly one PMTU, Last/Only at most
    // one and exactly what is left.
    const std::span<const uint8_t> data = pkt->payload();
    const bool last = (pkt->info().flags & wire::kLast) != 0;
    const uint64_t left = wqe->length - w.resp_bytes;
    const bool length_ok = last ? data.size() == left && data.size() <= ctx.mtu
                                : data.size() == ctx.mtu && data.size() < left;
    if (!length_ok) return CompState::kDropBadResponse;
    e.flush_tx_before_placement();
    if (!copy_sges(e.device_.mr_table(), ctx.qp->pd(), ctx.qp->sq_sges_st(*wqe), w.resp_bytes,
                   std::span<uint8_t>(const_cast<uint8_t*>(data.data()), data.size()),
                   SgeDirection::kToSges))
      return CompState::kErrLocalProtection;
    w.resp_bytes += data.size();
    w.resp_psn = wire::psn_next(psn);
    if (last) {
      w.stage = WqeStage::kDone;
      ++r.rd_atomic_done;
    }
    progress(wire::psn_next(psn));
    return CompState::kDone;
  }

  // ---- ATOMIC: an ATOMIC ACK, its original value into the WQE's 8-byte SGE.
  CompState atomic() {
    const provider::SendWqe* wqe = find_rd_atomic_answered();
    if (wqe == nullptr) return CompState::kDropBadResponse;
    WqeState& w = req.at(wqe_at);
    const bool is_atomic =
        wqe->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (!is_atomic || psn != w.first_psn) return not_awaited(w);
    // The original value, in host order, into the 8-byte local SGE (IBA 9.4.5).
    uint8_t orig[sizeof(uint64_t)];
    const uint64_t value = pkt->atomic_ack_eth()->orig_data();
    std::memcpy(orig, &value, sizeof(value));
    e.flush_tx_before_placement();
    if (!copy_sges(e.device_.mr_table(), ctx.qp->pd(), ctx.qp->sq_sges_st(*wqe), 0, orig,
                   SgeDirection::kToSges))
      return CompState::kErrLocalProtection;
    w.stage = WqeStage::kDone;
    w.resp_psn = wire::psn_next(psn);
    ++r.rd_atomic_done;
    progress(wire::psn_next(psn));
    return CompState::kDone;
  }

  // ---- NAK: everything before the NAK'ed PSN was received (IBA 9.7.5.1.3); then which NAK.
  CompState nak() {
    if (wire::psn_gt(psn, comp.psn)) ack_through(wire::psn_sub(psn, 1));
    oldest = e.oldest_outstanding(ctx);
    if (!oldest) return CompState::kDropBadResponse;
    const wire::AethView aeth = *pkt->aeth();
    if (aeth.is_rnr_nak()) return CompState::kRnrRetry;
    if (aeth.nak_code() == static_cast<uint8_t>(wire::NakCode::kPsnSequenceError))
      return CompState::kNakPsnSeq;
    return CompState::kError;
  }

  // ---- RNR_RETRY: IBA 9.7.5.1.5 (RNR NAK): wait the RNR timer, resend; rnr_retry 7 never runs
  // out.
  CompState rnr_retry() {
    ++e.counters_.rcvd_rnr_err;
    if (comp.rnr_retry_left == 0) {
      ++e.counters_.retry_rnr_exceeded_err;
      e.fail_wqe_at(ctx, *oldest, IBV_WC_RNR_RETRY_EXC_ERR);
      return CompState::kDone;
    }
    if (comp.rnr_retry_left != kRnrRetryInfinite) --comp.rnr_retry_left;
    comp.rnr_psn = comp.psn;
    comp.rnr_deadline_ns = e.clock_.now_ns() + wire::rnr_timer_ns(pkt->aeth()->rnr_timer_code());
    comp.retry_deadline_ns = net::kNever;
    return CompState::kDone;
  }

  // ---- NAK_PSN_SEQ: IBA 9.7.5.1.3: PSN sequence error NAK → resend from the NAK'ed PSN. It
  // counts against retry_cnt, so a peer that NAKs forever cannot keep us busy forever — once per
  // resend: more NAKs for the PSN a resend already started from change nothing.
  CompState nak_psn_seq() {
    ++e.counters_.rcvd_seq_err;
    if (psn != comp.psn) return CompState::kDone;  // a NAK for a PSN already re-covered
    if (comp.retry_started) return CompState::kDone;
    // After an RNR NAK the rest of that message arrives out of sequence at the responder and
    // draws this NAK; the RNR timer resends, so it costs no retry.
    if (comp.rnr_deadline_ns != net::kNever) return CompState::kDone;
    return CompState::kErrorRetry;
  }

  // ---- ERROR_RETRY: one of retry_cnt's retries (Engine::spend_retry); the resend re-arms the
  // local ACK timer.
  CompState error_retry() {
    if (e.spend_retry(ctx, *oldest, r)) comp.retry_deadline_ns = net::kNever;
    return CompState::kDone;
  }

  // ---- ERROR: IBA 9.7.5.1.4: invalid request / remote access / remote operational error NAKs
  // are fatal for the WQE holding the PSN, and the QP enters ERR (IBA 10.3.1.6).
  CompState error() {
    uint32_t target = *oldest;
    for (uint32_t i = *oldest; i < req.started; ++i) {
      const WqeState& w = req.at(i);
      if (w.npkts > 0 && w.stage != WqeStage::kNew && wire::in_window(psn, w.first_psn, w.npkts)) {
        target = i;
        break;
      }
    }
    e.fail_wqe_at(ctx, target, nak_status(pkt->aeth()->nak_code()));
    return CompState::kDone;
  }

  // ---- RNR_TIMER: IBA 9.7.5.1.5 (RNR NAK): after the RNR timer the requester resends from the
  // NAK'ed PSN.
  CompState rnr_timer() {
    if (comp.rnr_deadline_ns <= now_ns) {
      comp.rnr_deadline_ns = net::kNever;
      r.rewind_to = comp.rnr_psn;
    }
    return CompState::kAckTimer;
  }

  // ---- ACK_TIMER: IBA 9.7.6.1.1 (local ACK timeout): retry_cnt retries, then Transport Retry
  // Counter Exceeded.
  CompState ack_timer() {
    if (comp.retry_deadline_ns > now_ns) return CompState::kDone;
    comp.retry_deadline_ns = net::kNever;
    if (comp.rnr_deadline_ns != net::kNever) return CompState::kDone;  // the RNR timer resends
    oldest = e.oldest_outstanding(ctx);
    if (!oldest) return CompState::kDone;
    return CompState::kErrorRetry;
  }
};

void Engine::handle_response(QpContext& ctx, const wire::PacketView& pkt) {
  CompleterResult r;
  CompleterSteps(*this, ctx, &pkt, r).run(CompState::kGetAck);
  apply_completer_result(ctx, r);
}

void Engine::fire_completer_timers(QpContext& ctx, uint64_t now_ns) {
  CompleterResult r;
  CompleterSteps steps(*this, ctx, nullptr, r);
  steps.now_ns = now_ns;
  steps.run(CompState::kRnrTimer);
  apply_completer_result(ctx, r);
}

bool Engine::spend_retry(QpContext& ctx, uint32_t oldest, CompleterResult& r) {
  Completer& comp = ctx.comp;
  if (comp.retry_left == 0) {
    ++counters_.retry_exceeded_err;
    fail_wqe_at(ctx, oldest, IBV_WC_RETRY_EXC_ERR);
    return false;
  }
  --comp.retry_left;
  ++counters_.completer_retry_err;
  comp.retry_started = true;
  r.rewind_to = comp.psn;
  return true;
}

void Engine::request_sent(QpContext& ctx) {
  // IBA 9.7.6.1.1: the local ACK timer runs while requests are unacknowledged.
  Completer& comp = ctx.comp;
  if (comp.retry_deadline_ns != net::kNever) return;
  const uint64_t now = clock_.now_ns();
  comp.retry_deadline_ns = now + std::min(ack_timeout_ns(ctx.attr.timeout), net::kNever - now);
}

void Engine::pause_timers(QpContext& ctx, uint64_t paused_ns) {
  // The transmit backlog held the requests back for paused_ns: they left that much later than
  // the timers assumed, so the timers move with them (a local buffer is no lost packet).
  Completer& comp = ctx.comp;
  for (uint64_t* t : {&comp.retry_deadline_ns, &comp.rnr_deadline_ns})
    if (*t != net::kNever) *t += std::min(paused_ns, net::kNever - 1 - *t);
}

void Engine::fail_wqe_at(QpContext& ctx, uint32_t offset, ibv_wc_status status) {
  Requester& req = ctx.req;
  base::check(offset < req.started, "failing a WQE that was not started");
  // Completions stay in posting order: earlier unfinished WQEs are flushed first.
  for (uint32_t i = 0; i < offset; ++i) {
    WqeState& w = req.at(i);
    if (w.stage != WqeStage::kDone) {
      w.stage = WqeStage::kDone;
      w.status = IBV_WC_WR_FLUSH_ERR;
    }
  }
  WqeState& w = req.at(offset);
  w.stage = WqeStage::kDone;
  w.status = status;
  // IBA 10.3.1.5/10.3.1.6: an RC error is a QP error; UC and UD send errors stop only the send
  // queue (SQE).
  qp_error(ctx, ctx.reliable() ? IBV_QPS_ERR : IBV_QPS_SQE);
}

}  // namespace urdma::engine
