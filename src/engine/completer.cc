// The completer: ACKs, NAKs and responses → finished WQEs → completions in posting order
// (rxe_comp.c as the model of the steps). Also the local ACK timeout and the retry counters.
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

void Engine::handle_response(QpContext& ctx, const wire::PacketView& pkt) {
  CompleterResult r;
  complete_response(ctx, pkt, r);
  apply_completer_result(ctx, r);
}

void Engine::complete_response(QpContext& ctx, const wire::PacketView& pkt, CompleterResult& r) {
  if (ctx.type != IBV_QPT_RC) {
    ++counters_.drop_qp_type;
    return;
  }
  const uint32_t psn = pkt.bth().psn();
  // A response must name a PSN we sent and have not seen acknowledged: [comp.psn − 1 (a
  // repeated ACK), next_psn). Anything else is stale or forged.
  if (!wire::psn_lt(psn, ctx.req.next_psn)) {
    ++counters_.drop_bad_response;
    return;
  }
  if (wire::psn_lt(psn, wire::psn_sub(ctx.comp.psn, 1))) {
    ++counters_.duplicate_response;  // a copy of one already processed (network duplicate)
    return;
  }
  const uint8_t opcode = pkt.opcode();
  if (opcode == wire::op::kRcAck) {
    const wire::AethView aeth = *pkt.aeth();
    if (aeth.is_ack()) {
      process_ack(ctx, psn, r);
    } else if (aeth.is_nak() || aeth.is_rnr_nak()) {
      handle_nak(ctx, pkt, r);
    } else {
      ++counters_.drop_bad_response;  // reserved syndrome type
    }
  } else if (pkt.info().is(wire::kReadResponse)) {
    handle_read_response(ctx, pkt, r);
  } else if (opcode == wire::op::kRcAtomicAck) {
    handle_atomic_ack(ctx, pkt, r);
  } else {
    ++counters_.drop_bad_response;
  }
}

void Engine::process_ack(QpContext& ctx, uint32_t psn, CompleterResult& r) {
  Requester& req = ctx.req;
  uint32_t acked_to = wire::psn_next(psn);  // first PSN this ACK does not cover
  for (uint32_t i = 0; i < req.started; ++i) {
    WqeState& w = req.at(i);
    if (w.stage == WqeStage::kDone || w.npkts == 0) continue;
    if (w.stage == WqeStage::kNew) break;
    if (w.rd_atomic) {
      // A READ/ATOMIC finishes only with its response; the ACK covers nothing past it.
      if (wire::psn_gt(acked_to, w.resp_psn)) acked_to = w.resp_psn;
      progress(ctx, acked_to, r);
      // An ACK of a request after it means the responder has answered it already (it answers
      // in PSN order): the response from resp_psn on was lost. Ask again now rather than after
      // the local ACK timeout (rxe_comp.c check_psn: a response past an unanswered READ or
      // ATOMIC → COMPST_ERROR_RETRY; IBA 9.7.5.1.x). Once per gap, as a lost READ response
      // below: no retry is charged, so reordering costs a resend, never the QP.
      if (wire::psn_gt(psn, w.last_psn())) request_again(ctx, w.resp_psn, r);
      return;
    }
    if (wire::psn_lt(psn, w.last_psn())) break;
    w.stage = WqeStage::kDone;
  }
  progress(ctx, acked_to, r);
}

// Resend a READ/ATOMIC from `psn` at once, once per gap (a burst of later responses or ACKs
// does not trigger a burst of requests). Only progress opens a new gap, so it costs no retry.
void Engine::request_again(QpContext& ctx, uint32_t psn, CompleterResult& r) {
  Completer& comp = ctx.comp;
  if (comp.read_gap_pending && comp.read_gap_psn == psn) return;
  comp.read_gap_pending = true;
  comp.read_gap_psn = psn;
  ++counters_.completer_retry_err;
  r.rewind_to = psn;
}

// A READ response or ATOMIC ACK with `psn` past the response `w` waits for: the responder
// answers in PSN order, so w's response (the rest of a READ, or an ATOMIC's ACK) was lost. rxe
// does the same (rxe_comp.c check_psn: a response past an unanswered READ or ATOMIC →
// COMPST_ERROR_RETRY); without it each lost ATOMIC ACK in a pipeline waited a whole ACK timeout.
void Engine::ask_again_if_past(QpContext& ctx, const WqeState& w, uint32_t psn,
                               CompleterResult& r) {
  if (wire::psn_gt(psn, w.resp_psn)) request_again(ctx, w.resp_psn, r);
}

void Engine::progress(QpContext& ctx, uint32_t next_unacked_psn, CompleterResult& r) {
  Completer& comp = ctx.comp;
  if (wire::psn_gt(next_unacked_psn, comp.psn)) {
    comp.psn = next_unacked_psn;
    // Forward progress restores the retry budgets (rxe resets them per completed WQE).
    comp.retry_left = ctx.attr.retry_cnt;
    comp.rnr_retry_left = ctx.attr.rnr_retry;
    comp.retry_started = false;
    r.progress = true;
    const uint64_t now = clock_.now_ns();
    comp.retry_deadline_ns =
        wire::psn_lt(comp.psn, ctx.req.next_psn) && comp.rnr_deadline_ns == net::kNever
            ? now + std::min(ack_timeout_ns(ctx.attr.timeout), net::kNever - now)
            : net::kNever;
  }
}

void Engine::handle_nak(QpContext& ctx, const wire::PacketView& pkt, CompleterResult& r) {
  const uint32_t psn = pkt.bth().psn();
  const wire::AethView aeth = *pkt.aeth();
  // Everything before the NAK'ed PSN was received (IBA 9.7.5.1.3).
  if (wire::psn_gt(psn, ctx.comp.psn)) process_ack(ctx, wire::psn_sub(psn, 1), r);
  const std::optional<uint32_t> oldest = oldest_outstanding(ctx);
  if (!oldest) {
    ++counters_.drop_bad_response;
    return;
  }
  Completer& comp = ctx.comp;
  if (aeth.is_rnr_nak()) {
    // IBA 9.7.5.1.5 (RNR NAK): wait the RNR timer, resend; rnr_retry 7 never runs out.
    ++counters_.rcvd_rnr_err;
    if (comp.rnr_retry_left == 0) {
      ++counters_.retry_rnr_exceeded_err;
      fail_wqe_at(ctx, *oldest, IBV_WC_RNR_RETRY_EXC_ERR);
      return;
    }
    if (comp.rnr_retry_left != kRnrRetryInfinite) --comp.rnr_retry_left;
    comp.rnr_psn = comp.psn;
    comp.rnr_deadline_ns = clock_.now_ns() + wire::rnr_timer_ns(aeth.rnr_timer_code());
    comp.retry_deadline_ns = net::kNever;
    return;
  }
  if (aeth.nak_code() == static_cast<uint8_t>(wire::NakCode::kPsnSequenceError)) {
    // IBA 9.7.5.1.3: PSN sequence error NAK → resend from the NAK'ed PSN. It counts
    // against retry_cnt, so a peer that NAKs forever cannot keep us busy forever — once per
    // resend: more NAKs for the PSN a resend already started from change nothing.
    ++counters_.rcvd_seq_err;
    if (psn != comp.psn) return;  // a NAK for a PSN already re-covered
    if (comp.retry_started) return;
    // After an RNR NAK the rest of that message arrives out of sequence at the responder and
    // draws this NAK; the RNR timer resends, so it costs no retry.
    if (comp.rnr_deadline_ns != net::kNever) return;
    if (spend_retry(ctx, *oldest, r)) comp.retry_deadline_ns = net::kNever;  // re-armed by the resend
    return;
  }
  // IBA 9.7.5.1.4: invalid request / remote access / remote operational error NAKs are fatal
  // for the WQE holding the PSN, and the QP enters ERR (IBA 10.3.1.6).
  uint32_t target = *oldest;
  for (uint32_t i = *oldest; i < ctx.req.started; ++i) {
    const WqeState& w = ctx.req.at(i);
    if (w.npkts > 0 && w.stage != WqeStage::kNew && wire::in_window(psn, w.first_psn, w.npkts)) {
      target = i;
      break;
    }
  }
  fail_wqe_at(ctx, target, nak_status(aeth.nak_code()));
}

// The outstanding READ or ATOMIC a response with `psn` answers. SEND/WRITEs before it are
// implicitly acknowledged on the way (IBA 9.7.5.1.2: a response acknowledges every earlier
// request). nullopt (counted as a bad response) when the response matches nothing outstanding.
std::optional<uint32_t> Engine::find_rd_atomic_answered(QpContext& ctx, uint32_t psn) {
  Requester& req = ctx.req;
  for (uint32_t i = 0; i < req.started; ++i) {
    WqeState& w = req.at(i);
    if (w.stage == WqeStage::kDone || w.npkts == 0) continue;
    if (w.stage == WqeStage::kNew) break;  // never sent: nothing can answer it
    if (w.rd_atomic) return i;
    if (!wire::psn_gt(psn, w.last_psn())) break;
    w.stage = WqeStage::kDone;  // implied ACK
  }
  ++counters_.drop_bad_response;
  return std::nullopt;
}

void Engine::handle_read_response(QpContext& ctx, const wire::PacketView& pkt, CompleterResult& r) {
  Requester& req = ctx.req;
  const uint32_t psn = pkt.bth().psn();
  const std::optional<uint32_t> found = find_rd_atomic_answered(ctx, psn);
  if (!found) return;
  const uint32_t i = *found;
  WqeState& w = req.at(i);
  const provider::SendWqe* wqe = ctx.qp->sq_peek_st(i);
  base::check(wqe != nullptr, "started WQE missing from the send queue");
  if (wqe->opcode != IBV_WR_RDMA_READ || psn != w.resp_psn) {
    // Not the response we wait for: an ATOMIC ACK is owed first, or a duplicate / a gap.
    progress(ctx, w.resp_psn, r);
    // A response past the one we wait for: that one was lost (the responder answers in PSN
    // order), ask again for it at once instead of waiting for the ACK timeout.
    ask_again_if_past(ctx, w, psn, r);
    return;
  }
  // IBA 9.5 / 9.7.5.1.x: First and Middle responses carry exactly one PMTU, Last/Only at most
  // one and exactly what is left.
  const std::span<const uint8_t> data = pkt.payload();
  const uint32_t flags = pkt.info().flags;
  const bool last = (flags & wire::kLast) != 0;
  const uint64_t left = wqe->length - w.resp_bytes;
  const bool length_ok = last ? data.size() == left && data.size() <= ctx.mtu
                              : data.size() == ctx.mtu && data.size() < left;
  if (!length_ok) {
    ++counters_.drop_bad_response;
    return;
  }
  flush_tx_before_placement();
  if (!copy_sges(device_.mr_table(), ctx.qp->pd(), ctx.qp->sq_sges_st(*wqe), w.resp_bytes,
                 std::span<uint8_t>(const_cast<uint8_t*>(data.data()), data.size()),
                 SgeDirection::kToSges)) {
    fail_wqe_at(ctx, i, IBV_WC_LOC_PROT_ERR);
    return;
  }
  w.resp_bytes += data.size();
  w.resp_psn = wire::psn_next(psn);
  if (last) {
    w.stage = WqeStage::kDone;
    ++r.rd_atomic_done;
  }
  progress(ctx, wire::psn_next(psn), r);
}

void Engine::handle_atomic_ack(QpContext& ctx, const wire::PacketView& pkt, CompleterResult& r) {
  Requester& req = ctx.req;
  const uint32_t psn = pkt.bth().psn();
  const std::optional<uint32_t> found = find_rd_atomic_answered(ctx, psn);
  if (!found) return;
  const uint32_t i = *found;
  WqeState& w = req.at(i);
  const provider::SendWqe* wqe = ctx.qp->sq_peek_st(i);
  base::check(wqe != nullptr, "started WQE missing from the send queue");
  const bool atomic =
      wqe->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (!atomic || psn != w.first_psn) {
    progress(ctx, w.resp_psn, r);
    ask_again_if_past(ctx, w, psn, r);
    return;
  }
  // The original value, in host order, into the 8-byte local SGE (IBA 9.4.5).
  uint8_t orig[sizeof(uint64_t)];
  const uint64_t value = pkt.atomic_ack_eth()->orig_data();
  std::memcpy(orig, &value, sizeof(value));
  flush_tx_before_placement();
  if (!copy_sges(device_.mr_table(), ctx.qp->pd(), ctx.qp->sq_sges_st(*wqe), 0, orig,
                 SgeDirection::kToSges)) {
    fail_wqe_at(ctx, i, IBV_WC_LOC_PROT_ERR);
    return;
  }
  w.stage = WqeStage::kDone;
  w.resp_psn = wire::psn_next(psn);
  ++r.rd_atomic_done;
  progress(ctx, wire::psn_next(psn), r);
}

void Engine::fire_completer_timers(QpContext& ctx, uint64_t now_ns) {
  Completer& comp = ctx.comp;
  CompleterResult r;
  if (comp.rnr_deadline_ns <= now_ns) {
    // IBA 9.7.5.1.5 (RNR NAK): after the RNR timer the requester resends from the NAK'ed PSN.
    comp.rnr_deadline_ns = net::kNever;
    r.rewind_to = comp.rnr_psn;
  }
  if (comp.retry_deadline_ns <= now_ns) retry_timeout(ctx, r);
  apply_completer_result(ctx, r);
}

void Engine::retry_timeout(QpContext& ctx, CompleterResult& r) {
  Completer& comp = ctx.comp;
  comp.retry_deadline_ns = net::kNever;
  if (comp.rnr_deadline_ns != net::kNever) return;  // the RNR timer resends
  const std::optional<uint32_t> oldest = oldest_outstanding(ctx);
  if (!oldest) return;
  // IBA 9.7.6.1.1 (local ACK timeout): retry_cnt retries, then Transport Retry Counter
  // Exceeded.
  spend_retry(ctx, *oldest, r);
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
  qp_error(ctx, ctx.type == IBV_QPT_RC ? IBV_QPS_ERR : IBV_QPS_SQE);
}

}  // namespace urdma::engine
