// The requester: send WQEs → request packets (rxe_req.c as the model of the steps).
//
// Per WQE: wait for fence / max_rd_atomic, assign PSNs, segment by path MTU, build headers,
// gather the payload through the MR table (local access check on every SGE), send. Local
// operations (LOCAL_INV, BIND_MW) execute here, in send-queue order, and send nothing.
// Retransmission rewinds the requester to a PSN (go-back-N, IBA 9.7.5.1.x) and it resends from
// there; PSNs and segmentation are a pure function of the WQE, so a resent packet is the same
// packet.
#include <arpa/inet.h>

#include <algorithm>

#include "base/check.h"
#include "engine/engine.h"
#include "engine/sge_copy.h"
#include "wire/psn.h"

namespace urdma::engine {
namespace {

namespace op = wire::op;

// RC opcodes of SEND and RDMA WRITE by position in the message and by variant; the UC and XRC
// twins of each are kUcPrefix / kXrcPrefix | (opcode & kOperationMask) (IBA 9.2, table 35):
// QpContext::opcode.
enum Position : uint8_t { kFirstPkt, kMiddlePkt, kLastPkt, kOnlyPkt };
enum Variant : uint8_t { kPlain, kWithImm, kWithInv };
constexpr uint8_t kNoOpcode = 0xFF;
constexpr uint8_t kSendOpcodes[4][3] = {
    {op::kRcSendFirst, op::kRcSendFirst, op::kRcSendFirst},
    {op::kRcSendMiddle, op::kRcSendMiddle, op::kRcSendMiddle},
    {op::kRcSendLast, op::kRcSendLastImm, op::kRcSendLastInv},
    {op::kRcSendOnly, op::kRcSendOnlyImm, op::kRcSendOnlyInv},
};
constexpr uint8_t kWriteOpcodes[4][3] = {
    {op::kRcWriteFirst, op::kRcWriteFirst, kNoOpcode},
    {op::kRcWriteMiddle, op::kRcWriteMiddle, kNoOpcode},
    {op::kRcWriteLast, op::kRcWriteLastImm, kNoOpcode},
    {op::kRcWriteOnly, op::kRcWriteOnlyImm, kNoOpcode},
};

bool is_rd_atomic(ibv_wr_opcode opcode) {
  return opcode == IBV_WR_RDMA_READ || opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
         opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
bool is_write(ibv_wr_opcode opcode) {
  return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// Packets a message of `length` bytes takes at `mtu` (IBA 9.5: a zero-length message is one
// packet).
uint32_t packets_for(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : static_cast<uint32_t>((length + mtu - 1) / mtu);
}

}  // namespace

bool Engine::has_send_work(const QpContext& ctx) const {
  const ibv_qp_state st = qp_state(ctx);
  if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) return false;
  if (ctx.req.blocked || ctx.comp.rnr_deadline_ns != net::kNever) return false;
  if (ctx.req.started > 0 && ctx.req.at(0).stage == WqeStage::kDone) return true;  // to retire
  return ctx.qp->sq_peek_st(ctx.req.cur) != nullptr;
}

void Engine::run_requester(QpContext& ctx) {
  // Bounded turn per QP (kMaxPacketsPerTurn) so one busy QP cannot starve the rest of the
  // loop; what is left keeps next_deadline_ns() at "now".
  retire(ctx);
  for (int i = 0; i < kMaxPacketsPerTurn; ++i) {
    const ibv_qp_state st = qp_state(ctx);
    if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) break;
    if (ctx.req.blocked || ctx.comp.rnr_deadline_ns != net::kNever) break;
    const ReqStep step = start_or_continue(ctx);
    // Blocked only for a reason that holds a WQE back (SQD, fence, max_rd_atomic, the send
    // window), never for an empty queue: a WR posted by another thread after the queue was seen
    // empty rings the doorbell, and a `blocked` set then would hide it for good (only progress,
    // a rewind or SQD → RTS clear it) — the hung ibv_rc_pingpong -e pair.
    if (step == ReqStep::kBlocked) ctx.req.blocked = true;
    if (step == ReqStep::kIdle || step == ReqStep::kBlocked || step == ReqStep::kError) break;
  }
  retire(ctx);
}

Engine::ReqStep Engine::start_or_continue(QpContext& ctx) {
  Requester& req = ctx.req;
  const provider::SendWqe* wqe = ctx.qp->sq_peek_st(req.cur);
  if (wqe == nullptr) return ReqStep::kIdle;
  if (req.cur >= req.started) {
    req.at(req.cur) = WqeState{};
    req.started = req.cur + 1;
  }
  WqeState& w = req.at(req.cur);
  if (w.stage == WqeStage::kDone || w.stage == WqeStage::kSent) {
    // Finished (or fully sent and waiting): step over it; its PSNs stay behind us.
    if (w.npkts > 0 && wire::psn_le(req.next_psn, w.last_psn()))
      req.next_psn = wire::psn_next(w.last_psn());
    ++req.cur;
    req.cur_offset = 0;
    return ReqStep::kDone;
  }
  if (w.stage == WqeStage::kNew) {
    // SQD (IBA 10.3.1.3): no new WQE starts; the drained event comes when nothing is in flight.
    if (qp_state(ctx) == IBV_QPS_SQD) {
      if (!oldest_outstanding(ctx)) ctx.qp->sq_drained_st();
      return ReqStep::kBlocked;
    }
    // IBA 10.8.3.3 (fence): a fenced WQE waits for every prior RDMA READ and ATOMIC.
    if ((wqe->send_flags & IBV_SEND_FENCE) && req.rd_atomic_outstanding > 0)
      return ReqStep::kBlocked;
    const provider::SendOpcodeInfo* info = provider::send_opcode_info(wqe->opcode);
    base::check(info != nullptr, "provider posted an unknown send opcode");
    if (info->local) return execute_local(ctx, *wqe, w);
    // IBA 9.7.2: a message is at most 2^31 bytes (the RETH DMA length is 32 bits).
    if (wqe->length > kMaxMessageBytes) {
      w.first_psn = req.next_psn;
      w.npkts = 0;
      fail_wqe_at(ctx, req.cur, IBV_WC_LOC_LEN_ERR);
      return ReqStep::kError;
    }
    const bool rd_atomic = is_rd_atomic(wqe->opcode);
    // IBA 9.5 / 11.2.4.2 (max_rd_atomic, "ORA"): at most that many READ/ATOMIC outstanding.
    // max_rd_atomic 0 is taken at its word, as rxe does (rxe_req.c check_init_depth: the
    // initiator depth is 0, so a READ or ATOMIC never gets a slot): the WQE waits — and the
    // send queue behind it, in order — until a modify (SQD → RTS) raises the limit or the QP
    // is flushed. Nothing is sent and no timer runs meanwhile.
    if (rd_atomic && req.rd_atomic_outstanding >= ctx.attr.max_rd_atomic) return ReqStep::kBlocked;
    w.first_psn = req.next_psn;
    w.npkts = ctx.type == IBV_QPT_UD || info->atomic ? 1 : packets_for(wqe->length, ctx.mtu);
    w.resp_psn = w.first_psn;
    w.rd_atomic = rd_atomic;
    w.stage = WqeStage::kSending;
    if (rd_atomic) ++req.rd_atomic_outstanding;
    if (ctx.reliable() && config_.ack_delay_ns != 0) note_request_start(ctx);
    req.cur_offset = 0;
  }
  if (ctx.reliable() && !window_open(ctx, *wqe, w)) return ReqStep::kBlocked;
  return ctx.type == IBV_QPT_UD ? send_ud(ctx, *wqe, w) : send_rc_uc_packet(ctx, *wqe, w);
}

// RC flow control (EngineConfig::max_unacked_pkts; rxe_req.c stops at RXE_MAX_UNACKED_PSNS):
// the next packet goes out only while fewer than max_unacked_pkts PSNs are unacknowledged, and
// only if afterwards at most 2^23 are — the window [comp.psn, next_psn) then always fits the
// half window in which PSN comparisons are exact (wire/psn.h). A READ request takes all its
// response PSNs at once; alone it takes at most 2^23 (2^31 bytes at a 256-byte MTU), so one
// can always go once everything before it is acknowledged. The completer's progress unblocks.
bool Engine::window_open(const QpContext& ctx, const provider::SendWqe& wqe,
                         const WqeState& w) const {
  // Unsigned 24-bit distances: both may be exactly 2^23, which psn_diff calls "behind".
  const uint32_t next = ctx.req.next_psn;
  const uint32_t unacked = (next - ctx.comp.psn) & wire::kPsnMask;
  const uint32_t outstanding = unacked <= wire::kPsnHalfWindow ? unacked : 0;
  const uint32_t psns =
      wqe.opcode == IBV_WR_RDMA_READ ? (w.first_psn + w.npkts - next) & wire::kPsnMask : 1;
  return outstanding < config_.max_unacked_pkts &&
         uint64_t{outstanding} + psns <= wire::kPsnHalfWindow;
}

wire::PacketHeaders Engine::begin_request(QpContext& ctx, const provider::SendWqe& wqe,
                                          uint8_t rc_opcode, size_t payload_len, uint32_t psn) {
  wire::PacketHeaders h = begin_packet(ctx.opcode(rc_opcode), payload_len);
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(psn);
  // IBA 9.3 (XRC): every XRC request names the XRC SRQ it is for, right after the BTH.
  if (auto x = h.xrceth()) x->set_xrc_srq(wqe.xrc_remote_srqn & wire::kXrcSrqMask);
  return h;
}

// RC, UC and XRC (an RC connection whose requests carry an XRCETH).
Engine::ReqStep Engine::send_rc_uc_packet(QpContext& ctx, const provider::SendWqe& wqe,
                                          WqeState& w) {
  Requester& req = ctx.req;
  const bool rc = ctx.reliable();
  const uint32_t psn = req.next_psn;
  const uint32_t index = (psn - w.first_psn) & wire::kPsnMask;  // packet index in the WQE
  base::check(index < w.npkts, "requester PSN outside its WQE");
  const auto finish_wqe = [&] {
    w.stage = rc ? WqeStage::kSent : WqeStage::kDone;  // UC: complete once sent (IBA 9.8)
    ++req.cur;
    req.cur_offset = 0;
  };

  if (wqe.opcode == IBV_WR_RDMA_READ) {
    // One request for everything not yet received; the responder answers with
    // npkts - index response packets, PSNs psn..last_psn (IBA 9.7.4.1.3, 9.7.5.1.x resend).
    const uint64_t offset = uint64_t{index} * ctx.mtu;
    wire::PacketHeaders h = begin_request(ctx, wqe, op::kRcReadRequest, 0, psn);
    h.bth().set_ack_req(true);
    h.reth()->set_va(wqe.remote_addr + offset);
    h.reth()->set_rkey(wqe.rkey);
    h.reth()->set_dma_length(static_cast<uint32_t>(wqe.length - std::min(offset, wqe.length)));
    send_packet(ctx.route);
    req.next_psn = wire::psn_add(w.first_psn, w.npkts);
    finish_wqe();
  } else if (wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wqe.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    const bool cas = wqe.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
    wire::PacketHeaders h =
        begin_request(ctx, wqe, cas ? op::kRcCompareSwap : op::kRcFetchAdd, 0, psn);
    h.bth().set_ack_req(true);
    auto a = *h.atomic_eth();
    a.set_va(wqe.remote_addr);
    a.set_rkey(wqe.rkey);
    // IBA 9.3.4: CmpSwap carries swap + compare; FetchAdd carries the add value.
    a.set_swap_add(cas ? wqe.swap : wqe.compare_add);
    a.set_compare(cas ? wqe.compare_add : 0);
    send_packet(ctx.route);
    req.next_psn = wire::psn_next(psn);
    finish_wqe();
  } else if (wqe.opcode == IBV_WR_ATOMIC_WRITE) {
    // IBA 1.5 ATOMIC WRITE: one packet, RETH (DMA length 8) and the 8 bytes, acknowledged as
    // rxe answers it (a zero-length RDMA READ Response Only, or an ACK after it).
    wire::PacketHeaders h =
        begin_request(ctx, wqe, op::kRcAtomicWrite, wire::kAtomicOperandBytes, psn);
    h.bth().set_ack_req(true);
    h.reth()->set_va(wqe.remote_addr);
    h.reth()->set_rkey(wqe.rkey);
    h.reth()->set_dma_length(static_cast<uint32_t>(wire::kAtomicOperandBytes));
    if (wqe.send_flags & IBV_SEND_INLINE) {
      // Posted inline: the bytes are in the WQE (provider::Qp::fill_send_wqe).
      tx_add_payload({reinterpret_cast<const uint8_t*>(&wqe.compare_add), sizeof(wqe.compare_add)});
    } else if (!tx_gather(ctx, wqe, 0, wire::kAtomicOperandBytes)) {
      tx_abandon();
      fail_wqe_at(ctx, req.cur, IBV_WC_LOC_PROT_ERR);
      return ReqStep::kError;
    }
    send_packet(ctx.route);
    req.next_psn = wire::psn_next(psn);
    finish_wqe();
  } else {
    // SEND or RDMA WRITE: one packet of up to one path MTU (IBA 9.5: First/Middle carry
    // exactly PMTU bytes, Last/Only 0..PMTU).
    const uint64_t offset = req.cur_offset;
    const uint64_t n = std::min<uint64_t>(ctx.mtu, wqe.length - offset);
    const bool first = offset == 0;
    const bool last = offset + n == wqe.length;
    const Position pos = first && last ? kOnlyPkt
                         : first       ? kFirstPkt
                         : last        ? kLastPkt
                                       : kMiddlePkt;
    const Variant var =
        (wqe.opcode == IBV_WR_SEND_WITH_IMM || wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) ? kWithImm
        : wqe.opcode == IBV_WR_SEND_WITH_INV                                             ? kWithInv
                                                                                         : kPlain;
    const uint8_t opcode =
        is_write(wqe.opcode) ? kWriteOpcodes[pos][var] : kSendOpcodes[pos][var];
    base::check(opcode != kNoOpcode, "no opcode for this send variant");
    wire::PacketHeaders h = begin_request(ctx, wqe, opcode, static_cast<size_t>(n), psn);
    // IBA 9.4.1 / 9.7.2: SE on the last packet of a solicited message.
    h.bth().set_se(last && (wqe.send_flags & IBV_SEND_SOLICITED));
    h.bth().set_ack_req(rc && (last || (index + 1) % config_.ack_req_interval_pkts == 0));
    if (auto reth = h.reth()) {
      reth->set_va(wqe.remote_addr);
      reth->set_rkey(wqe.rkey);
      reth->set_dma_length(static_cast<uint32_t>(wqe.length));
    }
    if (auto imm = h.immdt()) imm->set_imm(ntohl(wqe.imm_data));  // posted in network order
    if (auto ieth = h.ieth()) ieth->set_rkey(wqe.invalidate_rkey);
    // Zero-copy: the payload iovecs point at the provider's inline area or, after the access
    // check of each SGE, straight into registered memory.
    if (wqe.send_flags & IBV_SEND_INLINE) {
      tx_add_payload(
          ctx.qp->sq_inline_st(wqe).subspan(static_cast<size_t>(offset), static_cast<size_t>(n)));
    } else if (!tx_gather(ctx, wqe, offset, n)) {
      // IBA 10.7.2.x: a local SGE failing its access check → Local Protection Error.
      tx_abandon();
      fail_wqe_at(ctx, req.cur, IBV_WC_LOC_PROT_ERR);
      return ReqStep::kError;
    }
    send_packet(ctx.route);
    req.next_psn = wire::psn_next(psn);
    req.cur_offset = offset + n;
    if (last) finish_wqe();
  }
  ++counters_.rdma_sends;
  if (rc) request_sent(ctx);  // the completer arms its local ACK timer
  return ReqStep::kSent;
}

Engine::ReqStep Engine::send_ud(QpContext& ctx, const provider::SendWqe& wqe, WqeState& w) {
  Requester& req = ctx.req;
  // IBA 9.8.2: a UD message is one packet of at most the path MTU; a longer one
  // completes with a Local Length Error and the send queue enters SQE (IBA 10.3.1.5).
  if (wqe.length > ctx.mtu) {
    fail_wqe_at(ctx, req.cur, IBV_WC_LOC_LEN_ERR);
    return ReqStep::kError;
  }
  const bool imm = wqe.opcode == IBV_WR_SEND_WITH_IMM;
  wire::PacketHeaders h =
      begin_packet(imm ? op::kUdSendOnlyImm : op::kUdSendOnly, static_cast<size_t>(wqe.length));
  h.bth().set_dest_qp(wqe.remote_qpn & wire::kQpnMask);
  h.bth().set_psn(req.next_psn);
  h.bth().set_se((wqe.send_flags & IBV_SEND_SOLICITED) != 0);
  // IBA 10.2.5: a Q_Key with the high-order bit set is not sent; the QP's own Q_Key
  // is used instead.
  const uint32_t qkey =
      (wqe.remote_qkey & wire::kQkeyControlledBit) ? ctx.attr.qkey : wqe.remote_qkey;
  h.deth()->set_qkey(qkey);
  h.deth()->set_src_qp(ctx.qpn & wire::kQpnMask);
  if (auto immdt = h.immdt()) immdt->set_imm(ntohl(wqe.imm_data));
  if (wqe.send_flags & IBV_SEND_INLINE) {
    tx_add_payload(ctx.qp->sq_inline_st(wqe).first(static_cast<size_t>(wqe.length)));
  } else if (!tx_gather(ctx, wqe, 0, wqe.length)) {
    tx_abandon();
    fail_wqe_at(ctx, req.cur, IBV_WC_LOC_PROT_ERR);
    return ReqStep::kError;
  }
  Route route;
  route.dst = gid_address(wqe.av.dgid);
  route.src = config_.local_address;
  ibv_gid sgid = {};
  if (device_.query_gid(provider::kPortNum, wqe.av.sgid_index, &sgid).ok()) {
    const net::Address a = gid_address(sgid);
    if (!a.is_unspecified()) route.src = a;
  }
  route.src_port = roce_src_port(ctx.qpn);
  route.traffic_class = wqe.av.traffic_class;
  route.hop_limit = wqe.av.hop_limit;
  send_packet(route);
  ++counters_.rdma_sends;
  req.next_psn = wire::psn_next(req.next_psn);
  w.stage = WqeStage::kDone;  // IBA 9.8: an unreliable send completes when it is sent
  ++req.cur;
  req.cur_offset = 0;
  return ReqStep::kSent;
}

Engine::ReqStep Engine::execute_local(QpContext& ctx, const provider::SendWqe& wqe, WqeState& w) {
  Requester& req = ctx.req;
  provider::MrTable& mrs = device_.mr_table();
  ibv_wc_status status = IBV_WC_SUCCESS;
  if (wqe.opcode == IBV_WR_LOCAL_INV) {
    // IBA 10.6.7.2.x (o10-37.2.x): LOCAL_INV of a window that is not a bound type 2 window of
    // this QP's PD fails the WR.
    if (!mrs.invalidate_st(wqe.invalidate_rkey, ctx.qp->pd(), ctx.qpn, false).ok())
      status = IBV_WC_LOC_QP_OP_ERR;
  } else {
    // IBA 10.6.7.2.x: a failed bind completes with a Memory Window Bind Error.
    if (!mrs.bind_mw_st(ctx.qp->pd(), ctx.qpn, wqe.bind).ok()) status = IBV_WC_MW_BIND_ERR;
  }
  w.first_psn = req.next_psn;
  w.npkts = 0;
  if (status != IBV_WC_SUCCESS) {
    fail_wqe_at(ctx, req.cur, status);
    return ReqStep::kError;
  }
  w.stage = WqeStage::kDone;
  ++req.cur;
  req.cur_offset = 0;
  return ReqStep::kDone;
}

// The one place the completer's findings reach the requester (its cursor, blocked flag and
// max_rd_atomic count are written only in this file).
void Engine::apply_completer_result(QpContext& ctx, const CompleterResult& r) {
  Requester& req = ctx.req;
  req.rd_atomic_outstanding -= std::min(req.rd_atomic_outstanding, r.rd_atomic_done);
  // Progress opens the window, a finished READ/ATOMIC frees a fence or a max_rd_atomic slot:
  // whatever blocked the requester may be over (it blocks again if not).
  if (r.progress || r.rd_atomic_done > 0) req.blocked = false;
  if (r.rewind_to) rewind(ctx, *r.rewind_to);
  retire(ctx);
}

// Finished WQEs leave the send queue in posting order, with their completions.
void Engine::retire(QpContext& ctx) {
  Requester& req = ctx.req;
  const auto head_done = [&] { return req.started > 0 && req.at(0).stage == WqeStage::kDone; };
  // Queued packets may point into the WQEs popped below (their inline data): they leave first.
  // Only then: a request and the ACK its QP held for it share one send (send_posted_first).
  if (head_done()) flush_tx();
  while (head_done()) {
    const WqeState w = req.at(0);
    const provider::SendWqe* wqe = ctx.qp->sq_peek_st(0);
    base::check(wqe != nullptr, "done WQE missing from the send queue");
    // IBA 10.7.1 / ibv_post_send(3): a successful unsignaled WR makes no completion.
    const bool signaled =
        w.status != IBV_WC_SUCCESS || ctx.qp->sq_sig_all() || (wqe->send_flags & IBV_SEND_SIGNALED);
    const ibv_wc wc = send_wc(ctx, *wqe, w.status);
    const provider::SendWqe done = *wqe;
    ctx.qp->sq_pop_st();
    if (done.send_flags & provider::kSendFlagEngine)
      engine_wqe_done(ctx, done, w.status);  // the engine's own: no CQ entry
    else if (signaled)
      push_send_cqe(ctx, wc);
    ++req.head_seq;
    --req.started;
    if (req.cur > 0) {
      --req.cur;
    } else {
      req.cur_offset = 0;
      if (w.npkts > 0 && wire::psn_le(req.next_psn, w.last_psn()))
        req.next_psn = wire::psn_next(w.last_psn());
    }
  }
  if (qp_state(ctx) == IBV_QPS_SQD && !oldest_outstanding(ctx)) ctx.qp->sq_drained_st();
}

void Engine::rewind(QpContext& ctx, uint32_t psn) {
  // Go-back-N (IBA 9.7.5.1.x): resend from `psn`, the oldest PSN not acknowledged. Every WQE
  // from the one holding it onwards is resent; finished ones (acknowledged meanwhile, or local
  // operations) are stepped over by the requester.
  Requester& req = ctx.req;
  req.blocked = false;
  for (uint32_t i = 0; i < req.started; ++i) {
    WqeState& w = req.at(i);
    if (w.stage == WqeStage::kDone || w.npkts == 0) continue;
    if (w.stage == WqeStage::kNew) break;
    uint32_t from = psn;
    if (!wire::in_window(psn, w.first_psn, w.npkts)) {
      if (wire::psn_gt(psn, w.last_psn())) continue;  // entirely before psn: not to resend
      from = w.first_psn;
    }
    // Later started WQEs are resent too: back to "sending" from their first packet.
    for (uint32_t j = i; j < req.started; ++j) {
      WqeState& later = req.at(j);
      if (later.stage == WqeStage::kSent) later.stage = WqeStage::kSending;
    }
    const uint32_t index = (from - w.first_psn) & wire::kPsnMask;
    req.cur = i;
    req.cur_offset = uint64_t{index} * ctx.mtu;
    req.next_psn = from;
    return;
  }
}

}  // namespace urdma::engine
