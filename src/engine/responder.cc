// The responder: request packets → memory writes, receive completions, ACKs, READ responses
// and ATOMIC results (rxe_resp.c as the model: a loop over named states, each a function
// returning the next state, each error its own state).
//
//   CHECK_PSN → CHECK_OP_SEQ → CHECK_OP_VALID → CHECK_RESOURCE → CHECK_LENGTH → CHECK_RKEY
//   → EXECUTE → COMPLETE → ACKNOWLEDGE → DONE
//   side exits: DUPLICATE, NAK_PSN_SEQ, RNR_NAK, ERR_* (NAK + QP error on RC, drop on UC), DROP
//
// An XRC target is an RC responder whose requests each name an XRC SRQ (XRCETH): CHECK_PSN
// resolves it (ERR_XRC_SRQ when it does not exist or is of another XRC domain); its receive
// WQEs come from that SRQ, its receive completions go to that SRQ's CQ, and every memory access
// is checked against that SRQ's PD (the target QP has none).
//
// Nothing from the peer is trusted: every RETH/AtomicETH goes through the MR table (key, PD,
// access, bounds with overflow-safe arithmetic), every payload byte lands inside a checked SGE
// or a checked remote range, lengths are checked against the PMTU and the message.
#include <arpa/inet.h>

#include <array>
#include <atomic>
#include <cstring>

#include "base/check.h"
#include "engine/engine.h"
#include "engine/sge_copy.h"
#include "wire/grh.h"
#include "wire/psn.h"
#include "wire/tm.h"

namespace urdma::engine {

namespace {
constexpr uint8_t kRoceSlUdp = 0x8;
constexpr uint8_t kRoceSlIpv4 = kRoceSlUdp | 0x2;
constexpr uint8_t kRoceSlIpv6 = kRoceSlUdp | 0x1;
}  // namespace

enum class RespState : uint8_t {
  kCheckPsn,
  kCheckOpSeq,
  kCheckOpValid,
  kCheckResource,
  kCheckLength,
  kCheckRkey,
  kExecute,
  kComplete,
  kAcknowledge,
  kDuplicate,
  kNakPsnSeq,
  kRnrNak,
  kErrInvalidRequest,
  kErrRemoteAccess,
  kErrRemoteOperational,
  kErrLocalLength,
  kErrTooManyRdAtomic,
  kErrInvalidateRkey,
  kErrCqOverflow,
  kErrXrcSrq,
  kErrTmHeader,
  kDrop,
  kDone,
  kCount,
};
constexpr std::array<const char*, static_cast<size_t>(RespState::kCount)> kRespStateNames = {
    "CHECK_PSN",
    "CHECK_OP_SEQ",
    "CHECK_OP_VALID",
    "CHECK_RESOURCE",
    "CHECK_LENGTH",
    "CHECK_RKEY",
    "EXECUTE",
    "COMPLETE",
    "ACKNOWLEDGE",
    "DUPLICATE",
    "NAK_PSN_SEQ",
    "RNR_NAK",
    "ERR_INVALID_REQUEST",
    "ERR_REMOTE_ACCESS",
    "ERR_REMOTE_OPERATIONAL",
    "ERR_LOCAL_LENGTH",
    "ERR_TOO_MANY_RDMA_ATM_REQ",
    "ERR_INVALIDATE_RKEY",
    "ERR_CQ_OVERFLOW",
    "ERR_XRC_SRQ",
    "ERR_TM_HEADER",
    "DROP",
    "DONE",
};

const char* resp_state_name(RespState s) {
  return kRespStateNames[static_cast<size_t>(s)];
}

// One request packet going through the states.
struct ResponderSteps {
  Engine& e;
  QpContext& ctx;
  const wire::PacketView& pkt;
  const wire::OpcodeInfo& info;
  Responder& resp;
  const uint32_t psn;
  const bool rc;
  // The PD memory accesses are checked against: the QP's, or on an XRC target the PD of the
  // XRC SRQ the request names (`xrc_srq`, resolved by CHECK_PSN).
  const provider::Pd* pd;
  provider::Srq* xrc_srq = nullptr;
  provider::MemRef target;  // CHECK_RKEY result: this packet's WRITE piece, READ or ATOMIC
  ibv_wc_status recv_status = IBV_WC_SUCCESS;

  ResponderSteps(Engine& engine, QpContext& c, const wire::PacketView& p)
      : e(engine),
        ctx(c),
        pkt(p),
        info(p.info()),
        resp(c.resp),
        psn(p.bth().psn()),
        rc(c.reliable()),
        pd(c.qp->pd()) {}

  bool is_send() const { return info.is(wire::kSend); }
  bool is_write() const { return info.is(wire::kWrite); }
  bool is_read() const { return info.is(wire::kReadRequest); }
  bool is_atomic() const { return info.is(wire::kAtomic); }
  bool is_atomic_write() const { return info.is(wire::kAtomicWrite); }
  bool first() const { return info.is(wire::kFirst); }
  bool last() const { return info.is(wire::kLast); }
  // An error on UC: drop the rest of the message, no NAK (IBA 9.8.3.x).
  RespState uc_drop() {
    resp.msg = MsgState::kDropping;
    resp.recv_offset = 0;
    return RespState::kDrop;
  }
  // A UC request a check refused (the RC path NAKs it instead): dropped and counted.
  RespState uc_reject() {
    ++e.counters_.drop_uc_invalid;
    return uc_drop();
  }
  // A UC request whose R_Key check failed (the RC path NAKs Remote Access Error): dropped
  // silently as any UC error, but counted apart, since UC gives a peer guessing keys no NAK to
  // pay for a wrong guess.
  RespState uc_access_reject() {
    ++e.counters_.drop_uc_access;
    return uc_drop();
  }

  RespState run() {
    RespState s = RespState::kCheckPsn;
    for (int guard = 0; s != RespState::kDone; ++guard) {
      base::check(guard < 32, "responder state machine does not terminate");
      s = step(s);
    }
    return s;
  }

  RespState step(RespState s) {
    switch (s) {
      case RespState::kCheckPsn:
        return check_psn();
      case RespState::kCheckOpSeq:
        return check_op_seq();
      case RespState::kCheckOpValid:
        return check_op_valid();
      case RespState::kCheckResource:
        return check_resource();
      case RespState::kCheckLength:
        return check_length();
      case RespState::kCheckRkey:
        return check_rkey();
      case RespState::kExecute:
        return execute();
      case RespState::kComplete:
        return complete();
      case RespState::kAcknowledge:
        return acknowledge();
      case RespState::kDuplicate:
        return duplicate();
      case RespState::kNakPsnSeq:
        return nak_psn_seq();
      case RespState::kRnrNak:
        return rnr_nak();
      case RespState::kErrInvalidRequest:
        return err_invalid_request();
      case RespState::kErrRemoteAccess:
        return err_remote_access();
      case RespState::kErrRemoteOperational:
        return err_remote_operational();
      case RespState::kErrLocalLength:
        return err_local_length();
      case RespState::kErrTooManyRdAtomic:
        return err_too_many_rd_atomic();
      case RespState::kErrInvalidateRkey:
        return err_invalidate_rkey();
      case RespState::kErrCqOverflow:
        return err_cq_overflow();
      case RespState::kErrXrcSrq:
        return err_xrc_srq();
      case RespState::kErrTmHeader:
        return err_tm_header();
      case RespState::kDrop:
        return RespState::kDone;
      default:
        return RespState::kDone;
    }
  }

  // ---- CHECK_PSN: IBA 9.7.5.2.1 (RC): expected → go on; earlier (within the half window of
  // psn.h) → duplicate; later → PSN sequence error NAK, once per gap. UC (IBA 9.8.3.x):
  // a gap abandons the message in progress; only a First/Only packet restarts.
  RespState check_psn() {
    const int32_t diff = wire::psn_diff(psn, resp.epsn);
    if (ctx.type == IBV_QPT_XRC_RECV) {
      // IBA 9.3 / 9.7.5.2 (XRC): the XRCETH must name an XRC SRQ of the target QP's XRC
      // domain; a request in sequence that does not is an Invalid Request. A duplicate naming
      // none is dropped (its original was answered, or NAKed, when it came in sequence).
      xrc_srq = e.device_.xrc_srq_by_num(pkt.xrceth()->xrc_srq());
      if (xrc_srq != nullptr && xrc_srq->xrcd() != ctx.qp->xrcd()) xrc_srq = nullptr;
      if (xrc_srq == nullptr) {
        if (diff == 0) return RespState::kErrXrcSrq;
        ++e.counters_.xrc_srq_invalid;
        return RespState::kDrop;
      }
      pd = xrc_srq->pd();
    }
    if (!rc) {
      if (diff != 0) {
        ++e.counters_.out_of_seq_request;
        uc_drop();
        resp.epsn = psn;
      }
      if (resp.msg == MsgState::kDropping) {
        if (!first()) {
          resp.epsn = wire::psn_next(psn);
          ++e.counters_.drop_uc_message;
          return RespState::kDone;
        }
        resp.msg = MsgState::kIdle;
      }
      return RespState::kCheckOpSeq;
    }
    if (diff > 0) {
      ++e.counters_.out_of_seq_request;
      return resp.nak_sent ? RespState::kDrop : RespState::kNakPsnSeq;
    }
    if (diff < 0) {
      ++e.counters_.duplicate_request;
      return RespState::kDuplicate;
    }
    return RespState::kCheckOpSeq;
  }

  // ---- CHECK_OP_SEQ: IBA 9.7.5.2.x: Middle/Last continue the message in progress of
  // the same kind; First/Only, READ and ATOMIC may not interrupt one.
  RespState check_op_seq() {
    bool ok;
    if (info.is(wire::kMiddle) || (last() && !first())) {
      ok = resp.msg == (is_send() ? MsgState::kInSend : MsgState::kInWrite);
    } else {
      ok = resp.msg == MsgState::kIdle;
    }
    if (!ok) return rc ? RespState::kErrInvalidRequest : uc_reject();
    return RespState::kCheckOpValid;
  }

  // ---- CHECK_OP_VALID: IBA 9.7.5.2.x / 10.2.3: the QP's access flags must allow remote
  // writes (RDMA WRITE and ATOMIC WRITE, as rxe_resp.c check_op_valid), reads or atomics;
  // FLUSH is not supported here.
  RespState check_op_valid() {
    const int access = ctx.attr.qp_access_flags;
    bool ok = true;
    if (is_write() || is_atomic_write()) ok = (access & IBV_ACCESS_REMOTE_WRITE) != 0;
    if (is_read()) ok = (access & IBV_ACCESS_REMOTE_READ) != 0;
    if (is_atomic()) ok = (access & IBV_ACCESS_REMOTE_ATOMIC) != 0;
    if (info.is(wire::kFlush)) ok = false;
    if (!ok) return rc ? RespState::kErrInvalidRequest : uc_reject();
    return RespState::kCheckResource;
  }

  // ---- CHECK_RESOURCE: a READ or ATOMIC needs a responder resource: with max_dest_rd_atomic
  // 0 there is none (IBA 9.7.5.2.x, C9-xx; rxe_resp.c check_resource →
  // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). A SEND (First/Only) or a WRITE with immediate
  // (Last/Only) needs a receive WQE; none → RNR NAK (IBA 9.7.5.2.8), UC: the message is dropped.
  // An ATOMIC WRITE takes a responder resource too (rxe_resp.c check_resource).
  RespState check_resource() {
    if ((is_read() || is_atomic() || is_atomic_write()) && ctx.attr.max_dest_rd_atomic == 0)
      return RespState::kErrTooManyRdAtomic;
    // The opcode table says which packets take a WQE (SEND First/Only, WRITE with immediate).
    // A SEND to a tag-matching SRQ is matched first (tm_classify).
    if (info.is(wire::kConsumesRecv) && !resp.has_recv && rc && is_send() &&
        ctx.qp->srq() != nullptr && ctx.qp->srq()->tm())
      return tm_classify(*ctx.qp->srq());
    if (info.is(wire::kConsumesRecv) && !resp.has_recv) {
      const bool taken =
          xrc_srq != nullptr ? xrc_srq->take_st(resp.recv) : ctx.qp->take_recv_st(resp.recv);
      if (!taken) {
        if (rc) return RespState::kRnrNak;
        ++e.counters_.drop_no_recv_wqe;
        return uc_drop();
      }
      resp.has_recv = true;
      resp.recv_srq = xrc_srq;
      resp.recv_offset = 0;
    }
    return RespState::kCheckLength;
  }

  // ---- tag matching (Documentation/tag_matching.md, provider/srq.h): the first packet of a
  // SEND to a TM-SRQ opens with a TMH. NO_TAG and FIN messages go whole to an ordinary SRQ WQE
  // (IBV_WC_TM_NO_TAG; a FIN is the answer to a rendezvous this side sent, as mlx5 reports it).
  // EAGER and RNDV messages are matched against the tag list: an eager message matched lands
  // in the tagged buffer without its TMH, a rendezvous request matched starts the engine's
  // READ of the data (Engine::start_rendezvous); unmatched, either goes whole to an ordinary
  // WQE and counts as unexpected. A payload too short for its headers or an unknown operation
  // is a completion error (ERR_TM_HEADER). Matching takes a tag only when it finds one, so an
  // RNR NAK for want of an ordinary WQE leaves the list as it was for the resent SEND.
  RespState tm_classify(provider::Srq& srq) {
    const std::span<const uint8_t> data = pkt.payload();
    resp.tm = TmRecv{};
    if (data.size() < wire::Tmh::kSize) return tm_take_ordinary(TmKind::kNone);
    const wire::TmhView tmh(data.data());
    const auto op = static_cast<wire::TmOp>(tmh.opcode());
    if (op == wire::TmOp::kNoTag || op == wire::TmOp::kFin) return tm_take_ordinary(TmKind::kNoTag);
    if (op != wire::TmOp::kEager && op != wire::TmOp::kRndv) return tm_take_ordinary(TmKind::kNone);
    const bool rndv = op == wire::TmOp::kRndv;
    if (rndv && data.size() < wire::Tmh::kSize + wire::Rvh::kSize)
      return tm_take_ordinary(TmKind::kNone);
    // A rendezvous needs a slot for the engine's READ and FIN; none free: the sender retries
    // (asked before matching, which would take the tag).
    if (rndv && !e.rendezvous_slot_free(ctx)) return RespState::kRnrNak;
    std::optional<provider::TagMatch> m = srq.match_st(tmh.tag());
    if (!m) {
      const RespState next = tm_take_ordinary(TmKind::kUnexpected);
      if (resp.has_recv) resp.tm.sync_req = srq.count_unexpected_st();
      return next;
    }
    resp.recv = m->buffer;
    resp.has_recv = true;
    resp.recv_offset = 0;
    resp.tm.kind = rndv ? TmKind::kRndv : TmKind::kEager;
    resp.tm.handle = m->handle;
    resp.tm.tag = tmh.tag();
    resp.tm.priv = tmh.app_ctx();
    resp.tm.skip = wire::Tmh::kSize;
    if (rndv) {
      const wire::RvhView rvh(data.data() + wire::Tmh::kSize);
      resp.tm.rndv_va = rvh.va();
      resp.tm.rndv_rkey = rvh.rkey();
      resp.tm.rndv_len = rvh.len();
    }
    return RespState::kCheckLength;
  }
  // An ordinary SRQ WQE for the whole message; kNone: a malformed one, completed in error.
  RespState tm_take_ordinary(TmKind kind) {
    if (!ctx.qp->take_recv_st(resp.recv)) return RespState::kRnrNak;
    resp.has_recv = true;
    resp.recv_offset = 0;
    resp.tm.kind = kind;
    if (kind == TmKind::kNone) {
      resp.tm.kind = TmKind::kUnexpected;  // its completion is the TM-SRQ's
      ++e.counters_.tm_header_err;
      return RespState::kErrTmHeader;
    }
    return RespState::kCheckLength;
  }
  // Bytes of this packet placed in the receive buffer: a matched message skips its TMH (the
  // first packet's) and a rendezvous request places nothing of its own.
  std::span<const uint8_t> placed_payload() const {
    const std::span<const uint8_t> data = pkt.payload();
    if (resp.tm.kind == TmKind::kRndv) return {};
    return data.subspan(std::min<size_t>(resp.tm.skip, data.size()));
  }

  // ---- CHECK_LENGTH: IBA 9.5 / 9.7.5.2.x: First/Middle carry exactly PMTU bytes, Last/Only at
  // most PMTU; a SEND may not overflow its receive WQE (too long → Invalid Request NAK and a
  // Local Length Error completion); an RDMA WRITE carries exactly its RETH DMA length.
  RespState check_length() {
    const uint64_t len = pkt.payload().size();
    if (info.is(wire::kPayload)) {
      const bool pmtu_ok = (first() && last()) || last() ? len <= ctx.mtu : len == ctx.mtu;
      if (!pmtu_ok) return rc ? RespState::kErrInvalidRequest : uc_reject();
    }
    if (is_send()) {
      if (placed_payload().size() > resp.recv.length - std::min(resp.recv_offset, resp.recv.length))
        return rc ? RespState::kErrLocalLength : uc_reject();
    }
    if (is_write()) {
      const uint64_t total = first() ? pkt.reth()->dma_length() : resp.write_length;
      const uint64_t done = first() ? 0 : resp.write_offset;
      const bool ok = last() ? done + len == total : done + len < total;
      if (!ok) return rc ? RespState::kErrInvalidRequest : uc_reject();
    }
    // IBA 1.5 ATOMIC WRITE: the RETH names exactly the 8 bytes it carries (rxe_resp.c
    // check_rkey: a payload other than the DMA length → RESPST_ERR_LENGTH, class C).
    if (is_atomic_write() && pkt.reth()->dma_length() != len) return RespState::kErrInvalidRequest;
    return RespState::kCheckRkey;
  }

  // ---- CHECK_RKEY: IBA 9.7.5.2.8 / 10.6.7.x: R_Key, PD, access right and bounds of
  // every RDMA and ATOMIC request; failure → Remote Access Error NAK. A zero-length RDMA
  // operation checks no key (IBA 9.4.x).
  RespState check_rkey() {
    provider::MrTable& mrs = e.device_.mr_table();
    if (is_write() && first()) {
      const wire::RethView reth = *pkt.reth();
      // IBA 9.7.2: a message is at most 2^31 bytes.
      if (reth.dma_length() > kMaxMessageBytes)
        return rc ? RespState::kErrInvalidRequest : uc_reject();
      // The whole message's range is checked on its first packet.
      if (reth.dma_length() > 0 &&
          !mrs.lookup_remote(reth.rkey(), pd, ctx.qpn, IBV_ACCESS_REMOTE_WRITE, reth.va(),
                             reth.dma_length())
               .ok())
        return rc ? RespState::kErrRemoteAccess : uc_access_reject();
      resp.write_rkey = reth.rkey();
      resp.write_va = reth.va();
      resp.write_length = reth.dma_length();
      resp.write_offset = 0;
    }
    if (is_write() && !pkt.payload().empty()) {
      // Every packet's own piece, again: the region may have been deregistered (or the window
      // invalidated) since the first packet; a stale pointer is never written through.
      target = mrs.lookup_remote(resp.write_rkey, pd, ctx.qpn, IBV_ACCESS_REMOTE_WRITE,
                                 resp.write_va + resp.write_offset, pkt.payload().size());
      if (!target.ok()) return rc ? RespState::kErrRemoteAccess : uc_access_reject();
    }
    if (is_read()) {
      const wire::RethView reth = *pkt.reth();
      // IBA 9.7.2: a message is at most 2^31 bytes.
      if (reth.dma_length() > kMaxMessageBytes) return RespState::kErrInvalidRequest;
      if (reth.dma_length() > 0) {
        target = mrs.lookup_remote(reth.rkey(), pd, ctx.qpn, IBV_ACCESS_REMOTE_READ, reth.va(),
                                   reth.dma_length());
        if (!target.ok()) return RespState::kErrRemoteAccess;
      }
    }
    if (is_atomic()) {
      const wire::AtomicEthView a = *pkt.atomic_eth();
      // IBA 9.4.5: the address must be 8-byte aligned, else Invalid Request.
      if (a.va() % wire::kAtomicOperandBytes != 0) return RespState::kErrInvalidRequest;
      target = mrs.lookup_remote(a.rkey(), pd, ctx.qpn, IBV_ACCESS_REMOTE_ATOMIC, a.va(),
                                 wire::kAtomicOperandBytes);
      if (!target.ok()) return RespState::kErrRemoteAccess;
      // The host address must be aligned too for a real CPU atomic (a zero-based region
      // could place an aligned IOVA on an unaligned host address).
      if (reinterpret_cast<uintptr_t>(target.addr) % alignof(uint64_t) != 0)
        return RespState::kErrInvalidRequest;
    }
    if (is_atomic_write()) {
      const wire::RethView reth = *pkt.reth();
      target = mrs.lookup_remote(reth.rkey(), pd, ctx.qpn, IBV_ACCESS_REMOTE_WRITE, reth.va(),
                                 wire::kAtomicOperandBytes);
      if (!target.ok()) return RespState::kErrRemoteAccess;
      // The 8-byte store must be one aligned access: an unaligned target is an Invalid Request
      // (rxe_resp.c atomic_write_reply → RESPST_ERR_MISALIGNED_ATOMIC, class C). Both the IOVA
      // and the host address are checked, as for the other atomics.
      if (reth.va() % wire::kAtomicOperandBytes != 0 ||
          reinterpret_cast<uintptr_t>(target.addr) % alignof(uint64_t) != 0)
        return RespState::kErrInvalidRequest;
    }
    return RespState::kExecute;
  }

  // ---- EXECUTE
  RespState execute() {
    const std::span<const uint8_t> data = pkt.payload();
    if (!is_read()) e.flush_tx_before_placement();
    if (is_send()) {
      const std::span<const uint8_t> placed = placed_payload();
      resp.tm.skip = 0;
      if (resp.tm.kind != TmKind::kRndv &&
          !copy_sges(e.device_.mr_table(), recv_pd(), resp.recv.sges(), resp.recv_offset,
                     std::span<uint8_t>(const_cast<uint8_t*>(placed.data()), placed.size()),
                     SgeDirection::kToSges)) {
        recv_status = IBV_WC_LOC_PROT_ERR;
        return rc ? RespState::kErrRemoteOperational : uc_reject();
      }
      resp.recv_offset += placed.size();
      resp.msg = last() ? MsgState::kIdle : MsgState::kInSend;
      return last() ? RespState::kComplete : RespState::kAcknowledge;
    }
    if (is_write()) {
      if (!data.empty()) std::memcpy(target.addr, data.data(), data.size());
      resp.write_offset += data.size();
      resp.msg = last() ? MsgState::kIdle : MsgState::kInWrite;
      return last() ? RespState::kComplete : RespState::kAcknowledge;
    }
    if (is_read()) {
      const wire::RethView reth = *pkt.reth();
      const uint32_t npkts = packets(reth.dma_length());
      remember(false, npkts, 0);
      // IBA 9.7.5.2.x (C9-148): the MSN counts the READ before its responses carry it, so the
      // first response already holds the new MSN (rxe_resp.c execute: "For RDMA Read we can
      // increment the msn now"; tests/data/rxe-to-rxe.pcap: ACK MSN 4, then READ response MSN 5).
      resp.msn = (resp.msn + 1) & wire::kPsnMask;
      start_read_reply(reth, npkts);          // sent from poll(), paced (Engine::run_responder)
      resp.epsn = wire::psn_add(psn, npkts);  // IBA 9.7.4.1.3: one PSN per response packet
      resp.nak_sent = false;
      ++e.counters_.rdma_recvs;
      return RespState::kDone;
    }
    if (is_atomic()) {
      const wire::AtomicEthView a = *pkt.atomic_eth();
      // IBA 9.4.5: a real CPU atomic, so other CPU and device accesses see it atomically
      // (the basis of IBV_ATOMIC_GLOB).
      std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(target.addr));
      uint64_t orig;
      if (wire::op::operation(pkt.opcode()) == wire::op::kRcCompareSwap) {
        orig = a.compare();
        word.compare_exchange_strong(orig, a.swap_add());
      } else {
        orig = word.fetch_add(a.swap_add());
      }
      remember(true, 1, orig);
      resp.msn = (resp.msn + 1) & wire::kPsnMask;
      resp.epsn = wire::psn_next(psn);
      resp.nak_sent = false;
      ++e.counters_.rdma_recvs;
      e.send_atomic_ack(ctx, psn, orig);
      return RespState::kDone;
    }
    if (is_atomic_write()) {
      // One 8-byte store, ordered after every earlier placement (rxe: smp_store_release), so
      // no CPU or device reader sees half of it.
      uint64_t value;
      std::memcpy(&value, data.data(), sizeof(value));
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(target.addr))
          .store(value, std::memory_order_release);
      resp.msn = (resp.msn + 1) & wire::kPsnMask;
      resp.epsn = wire::psn_next(psn);
      resp.ackable_psn = psn;
      resp.nak_sent = false;
      ++e.counters_.rdma_recvs;
      // Answered at once, as rxe answers it: an RDMA READ Response Only of no data
      // (rxe_resp.c acknowledge → send_read_response_ack).
      e.send_empty_read_response(ctx, psn);
      return RespState::kDone;
    }
    return RespState::kDrop;
  }

  // ---- COMPLETE: the last packet of a SEND or of a WRITE with immediate → a receive
  // completion; SEND with invalidate invalidates its R_Key first (IBA 10.6.7.2.x, o10-37.2.x).
  RespState complete() {
    // The opcode table says which packets complete a WQE (SEND Last/Only, WRITE with imm).
    if (!info.is(wire::kCompletesRecv)) {
      resp.msn = (resp.msn + 1) & wire::kPsnMask;  // IBA 9.7.5.2.x: MSN counts messages
      return RespState::kAcknowledge;
    }
    ibv_wc wc = {};
    wc.wr_id = resp.recv.wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = is_write() ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    wc.byte_len = static_cast<uint32_t>(is_write() ? resp.write_length : resp.recv_offset);
    wc.qp_num = ctx.qpn;
    if (auto imm = pkt.immdt()) {
      wc.imm_data = htonl(imm->imm());
      wc.wc_flags |= IBV_WC_WITH_IMM;
    }
    if (auto ieth = pkt.ieth()) {
      if (!e.device_.mr_table().invalidate_st(ieth->rkey(), pd, ctx.qpn, true).ok())
        return RespState::kErrInvalidateRkey;
      wc.invalidated_rkey = ieth->rkey();
      wc.wc_flags |= IBV_WC_WITH_INV;
    }
    resp.msn = (resp.msn + 1) & wire::kPsnMask;  // IBA 9.7.5.2.x: MSN counts messages
    resp.has_recv = false;
    resp.recv_offset = 0;
    const TmRecv tm = resp.tm;
    resp.tm = TmRecv{};
    if (tm.kind != TmKind::kNone) tm_completion(tm, wc);
    const bool pushed = e.push_recv_cqe(ctx, wc, pkt.bth().se());
    resp.recv_srq = nullptr;
    if (!pushed) return RespState::kErrCqOverflow;
    if (tm.kind == TmKind::kEager) ctx.qp->srq()->release_tag_st(tm.handle);
    if (tm.kind == TmKind::kRndv) e.start_rendezvous(ctx, tm, resp.recv);
    return RespState::kAcknowledge;
  }

  // The completion of a SEND to a TM-SRQ (ibv_create_cq_ex(3), ibv_wc_read_tm_info): a matched
  // eager message IBV_WC_TM_RECV with TM_MATCH | TM_DATA_VALID, a matched rendezvous request
  // TM_RECV with TM_MATCH (its DATA_VALID completion follows the READ), an unexpected message
  // TM_RECV without them (TM_SYNC_REQ when a sync is due), a NO_TAG or FIN message
  // IBV_WC_TM_NO_TAG. Matched ones carry the tag's recv_wr_id, tag and user data.
  static void tm_completion(const TmRecv& tm, ibv_wc& wc) {
    wc.opcode = tm.kind == TmKind::kNoTag ? IBV_WC_TM_NO_TAG : IBV_WC_TM_RECV;
    if (tm.kind == TmKind::kEager) wc.wc_flags |= IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
    if (tm.kind == TmKind::kRndv) wc.wc_flags |= IBV_WC_TM_MATCH;
    if (tm.kind == TmKind::kUnexpected && tm.sync_req) wc.wc_flags |= IBV_WC_TM_SYNC_REQ;
    if (tm.matched() && wc.status == IBV_WC_SUCCESS)
      provider::set_tm_info(wc, {.tag = tm.tag, .priv = tm.priv});
  }

  // ---- ACKNOWLEDGE: advance the expected PSN; RC acknowledges when the requester asked
  // (AckReq, IBA 9.7.5.2.x ACK coalescing), with the MSN and "credits invalid" (no end-to-end
  // flow control, as Linux rxe).
  RespState acknowledge() {
    resp.epsn = wire::psn_next(psn);
    resp.ackable_psn = psn;
    resp.nak_sent = false;
    ++e.counters_.rdma_recvs;
    if (!rc) return RespState::kDone;
    if (pkt.bth().ack_req())
      e.defer_ack(ctx, psn);  // sent at the end of the batch, or replaced by a later one
    else
      ++e.counters_.ack_deferred;
    return RespState::kDone;
  }

  // ---- DUPLICATE (IBA 9.7.5.2.2): SEND/WRITE → acknowledge again, whether or not the
  // duplicate asks for it (C9-105: the ACK of the original may have been lost, or coalesced
  // away; rxe_resp.c duplicate_request acks every duplicate SEND/WRITE); READ → answer again
  // from the (re-checked) RETH; ATOMIC → resend the saved result, never execute it twice.
  RespState duplicate() {
    if (is_send() || is_write() || is_atomic_write()) {
      // An ATOMIC WRITE is never stored twice: its duplicate is acknowledged as a WRITE's.
      // The ACK names the last SEND/WRITE packet received, never epsn − 1 when that is a READ's
      // or ATOMIC's. A plain ACK does not answer those — only their response does (IBA
      // 9.7.5.1.2) — and the requester that resends the duplicate resends them behind it, so it
      // may lack their response. rxe's completer takes an ACK that names a READ's PSN as that
      // READ's completion, without its data (rxe_comp.c check_psn and check_ack; seen under
      // loss: rping -V urdma->rxe, "data mismatch!"). An ACK past them is an implied NAK
      // (rxe_comp.c check_psn → COMPST_ERROR_RETRY): the requester asks again. rxe's own
      // duplicate ACK is the same (resp.ack_psn, moved only by SEND/WRITE).
      e.send_ack(ctx, wire::make_ack(wire::kAethCreditsInvalid), resp.ackable_psn);
      return RespState::kDone;
    }
    for (const RdAtomicResource& r : resp.resources) {
      if (!r.valid || !wire::in_window(psn, r.first_psn, r.npkts)) continue;
      if (is_atomic()) {
        if (r.atomic && r.first_psn == psn) e.send_atomic_ack(ctx, psn, r.orig);
        return RespState::kDone;
      }
      if (r.atomic) return RespState::kDone;
      const wire::RethView reth = *pkt.reth();
      const uint32_t left = (r.first_psn + r.npkts - psn) & wire::kPsnMask;
      if (packets(reth.dma_length()) > left) return RespState::kDrop;
      // A replay from inside the original response continues with Middle ... Last, which carry
      // at least one byte (IBA 9.5), and must end where the original ended: a duplicate asking
      // for nothing, or for fewer packets than are left, is no resend a requester makes — it
      // is dropped (found by engine_fuzz: a zero-length one built an empty READ Response Last).
      if (psn != r.first_psn && (reth.dma_length() == 0 || packets(reth.dma_length()) != left))
        return RespState::kDrop;
      if (reth.dma_length() > 0 &&
          !e.device_.mr_table()
               .lookup_remote(reth.rkey(), pd, ctx.qpn, IBV_ACCESS_REMOTE_READ, reth.va(),
                              reth.dma_length())
               .ok())
        return RespState::kDrop;
      // Answered again from its PSN, replacing the response in progress if it is this one's
      // (rxe_resp.c duplicate_request: "Replay the RDMA read reply" from the duplicate's PSN).
      start_read_reply(reth, r.npkts);
      resp.read_reply.res_first_psn = r.first_psn;
      // A replay from inside the original response continues its opcode sequence (Middle ...
      // Last), as rxe's read_reply does for rdatm_res_state_replay: an rxe requester that has
      // taken the First refuses another First at a later PSN (rxe_comp.c check_ack).
      resp.read_reply.first_sent = psn != r.first_psn;
      return RespState::kDone;
    }
    return RespState::kDrop;  // too old: no longer in the resources
  }

  RespState nak_psn_seq() {
    // One NAK per gap, carrying the expected PSN (IBA 9.7.5.2.1).
    resp.nak_sent = true;
    e.send_ack(ctx, wire::make_nak(wire::NakCode::kPsnSequenceError), resp.epsn);
    return RespState::kDone;
  }

  RespState rnr_nak() {
    ++e.counters_.send_rnr_err;
    e.send_ack(ctx, wire::make_rnr_nak(ctx.attr.min_rnr_timer), psn);
    return RespState::kDone;
  }

  // RC responder errors: NAK, affiliated async event, QP → ERR (IBA 9.9.3.1, 10.3.1.6).
  RespState fatal(wire::NakCode code, ibv_event_type event) {
    e.send_ack(ctx, wire::make_nak(code), psn);
    ctx.qp->raise_event(event);
    e.qp_error(ctx, IBV_QPS_ERR);
    return RespState::kDone;
  }
  RespState err_invalid_request() {
    return fatal(wire::NakCode::kInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }
  RespState err_remote_access() {
    return fatal(wire::NakCode::kRemoteAccessError, IBV_EVENT_QP_ACCESS_ERR);
  }
  RespState err_remote_operational() {
    complete_recv_with_error(recv_status);
    return fatal(wire::NakCode::kRemoteOperationalError, IBV_EVENT_QP_FATAL);
  }
  RespState err_local_length() {
    // IBA 9.7.5.2.x: a SEND longer than the receive WQE: the WQE completes with Local
    // Length Error, the requester gets an Invalid Request NAK.
    complete_recv_with_error(IBV_WC_LOC_LEN_ERR);
    return fatal(wire::NakCode::kInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }

  // rxe_resp.c RESPST_ERR_TOO_MANY_RDMA_ATM_REQ (class C): a READ or ATOMIC to a QP with
  // max_dest_rd_atomic 0 is an Invalid Request, never executed.
  RespState err_too_many_rd_atomic() {
    return fatal(wire::NakCode::kInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }
  // rxe_resp.c RESPST_ERR_INVALIDATE_RKEY (class J): the SEND with Invalidate was placed but its
  // R_Key cannot be invalidated. The receive WQE completes with REM_INV_REQ_ERR and the QP
  // enters ERR. What the requester sees is rxe's: no NAK — the ordinary ACKNOWLEDGE step runs
  // (an ACK of the request's PSN when AckReq asks for one), with the MSN not advanced, since
  // rxe's execute() fails before counting the message. (IBA 10.6.7.2.x leaves the reply to the
  // requester open; an ACK here means the requester's SEND completes successfully.)
  RespState err_invalidate_rkey() {
    complete_recv_with_error(IBV_WC_REM_INV_REQ_ERR);
    if (pkt.bth().ack_req()) e.send_ack(ctx, wire::make_ack(wire::kAethCreditsInvalid), psn);
    ctx.qp->raise_event(IBV_EVENT_QP_REQ_ERR);
    e.qp_error(ctx, IBV_QPS_ERR);
    return RespState::kDone;
  }

  // The receive completion was lost to a full CQ and the QP is in ERR (Engine::cq_overflow):
  // no ACK, so the requester never takes the message as delivered (rxe RESPST_ERR_CQ_OVERFLOW).
  RespState err_cq_overflow() { return RespState::kDone; }

  // An XRC request in sequence whose XRCETH names no XRC SRQ of the target's XRC domain: an
  // Invalid Request NAK (the initiator's WR completes with IBV_WC_REM_INV_REQ_ERR) and the
  // target QP enters ERR, as for every Invalid Request; counted.
  RespState err_xrc_srq() {
    ++e.counters_.xrc_srq_invalid;
    return err_invalid_request();
  }

  // The PD of the receive WQE being filled: that of the XRC SRQ it came from, else the QP's.
  const provider::Pd* recv_pd() const {
    return resp.recv_srq != nullptr ? resp.recv_srq->pd() : ctx.qp->pd();
  }

  // A SEND to a TM-SRQ whose TMH is cut short or names no known operation: the ordinary WQE it
  // took completes with Remote Invalid Request Error, the requester gets an Invalid Request NAK
  // and the QP enters ERR, as for any request this responder cannot execute (IBA 9.7.5.2.x).
  RespState err_tm_header() {
    complete_recv_with_error(IBV_WC_REM_INV_REQ_ERR);
    return fatal(wire::NakCode::kInvalidRequest, IBV_EVENT_QP_REQ_ERR);
  }

  void complete_recv_with_error(ibv_wc_status status) {
    if (!resp.has_recv) return;
    ibv_wc wc = {};
    wc.wr_id = resp.recv.wr_id;
    wc.status = status;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = ctx.qpn;
    resp.has_recv = false;
    const TmRecv tm = resp.tm;
    resp.tm = TmRecv{};
    if (tm.kind != TmKind::kNone) tm_completion(tm, wc);
    e.push_recv_cqe(ctx, wc, false);
    if (tm.matched()) ctx.qp->srq()->release_tag_st(tm.handle);
  }

  uint32_t packets(uint64_t length) const {
    return length == 0 ? 1 : static_cast<uint32_t>((length + ctx.mtu - 1) / ctx.mtu);
  }
  // The response is generated from poll() (Engine::run_responder), paced; `npkts` are the
  // responder resource's (the original READ's) PSNs, `psn` is this request's.
  void start_read_reply(const wire::RethView& reth, uint32_t res_npkts) {
    ReadReply& rr = resp.read_reply;
    rr.active = true;
    rr.rkey = reth.rkey();
    rr.va = reth.va();
    rr.resid = reth.dma_length();
    rr.psn = psn;
    rr.first_sent = false;
    rr.res_first_psn = psn;
    rr.res_npkts = res_npkts;
    rr.xrc_srq = xrc_srq;
  }
  void remember(bool atomic, uint32_t npkts, uint64_t orig) {
    RdAtomicResource& r = resp.resources[resp.res_next];
    resp.res_next = (resp.res_next + 1) % resp.resources.size();
    r = RdAtomicResource{true, atomic, psn, npkts, orig};
  }
};

void Engine::handle_request(QpContext& ctx, const wire::PacketView& pkt, const net::RxDatagram& d) {
  Responder& resp = ctx.resp;
  if (resp.read_reply.active || !resp.waiting.empty()) {
    // A READ response is still being generated. A duplicate of that READ restarts it from its
    // PSN now (the requester lost part of it; the rest of the old run would be dropped there);
    // every other request waits behind it, so ACKs and responses leave in PSN order and later
    // requests see memory only after the READ has read it (rxe processes its request queue in
    // order the same way).
    const ReadReply& rr = resp.read_reply;
    const bool restart = rr.active && pkt.info().is(wire::kReadRequest) &&
                         wire::in_window(pkt.bth().psn(), rr.res_first_psn, rr.res_npkts);
    if (!restart) {
      if (resp.waiting.size() >= kMaxWaitingRequests) {
        ++counters_.drop_request_queue_full;
        return;
      }
      resp.waiting.emplace_back(d.buffer.begin(), d.buffer.begin() + d.length);
      return;
    }
  }
  ResponderSteps(*this, ctx, pkt).run();
}

bool Engine::responder_busy(const QpContext& ctx) const {
  return ctx.resp.read_reply.active || !ctx.resp.waiting.empty();
}

void Engine::run_responder(QpContext& ctx) {
  Responder& resp = ctx.resp;
  for (int i = 0; i < kMaxPacketsPerTurn && responder_busy(ctx); ++i) {
    if (qp_state(ctx) == IBV_QPS_ERR) return;  // flushed: nothing more to answer
    if (resp.read_reply.active) {
      send_read_response(ctx);
      continue;
    }
    // The READ is answered: the requests that waited behind it, in arrival order. They passed
    // the receive pipeline when they arrived.
    const std::vector<uint8_t> bytes = std::move(resp.waiting.front());
    resp.waiting.pop_front();
    const wire::ParseResult parsed = wire::parse_packet(bytes);
    base::check(parsed.ok(), "a queued request no longer parses");
    ResponderSteps(*this, ctx, *parsed).run();
  }
}

// One packet of the READ response in progress (IBA 9.7.4.1.3 / 9.5): First (AETH) / Middle /
// Last (AETH), or one Only (AETH); each but the last exactly one PMTU, straight from the
// registered range (zero-copy).
void Engine::send_read_response(QpContext& ctx) {
  namespace op = wire::op;
  ReadReply& rr = ctx.resp.read_reply;
  const uint64_t len = std::min<uint64_t>(ctx.mtu, rr.resid);
  const bool last = rr.resid <= ctx.mtu;
  const uint8_t opcode = !rr.first_sent
                             ? (last ? op::kRcReadResponseOnly : op::kRcReadResponseFirst)
                         : last ? op::kRcReadResponseLast
                                : op::kRcReadResponseMiddle;
  const provider::Pd* pd = rr.xrc_srq != nullptr ? rr.xrc_srq->pd() : ctx.qp->pd();
  const uint8_t* src = nullptr;
  if (len > 0) {
    // rxe_resp.c read_reply → rxe_recheck_mr: the region may have been deregistered (or the
    // window invalidated) since the request was checked; this packet's piece is looked up
    // again. A failure ends the response: NAK Remote Access Error at this response's PSN (rxe
    // RESPST_ERR_RKEY_VIOLATION, class C; rxe NAKs the request's PSN, which our completer — and
    // any requester that has taken the earlier responses — already counts as answered), and
    // the QP enters ERR.
    const provider::MemRef ref = device_.mr_table().lookup_remote(
        rr.rkey, pd, ctx.qpn, IBV_ACCESS_REMOTE_READ, rr.va, len);
    if (!ref.ok()) {
      rr.active = false;
      send_ack(ctx, wire::make_nak(wire::NakCode::kRemoteAccessError), rr.psn);
      ctx.qp->raise_event(IBV_EVENT_QP_ACCESS_ERR);
      qp_error(ctx, IBV_QPS_ERR);
      return;
    }
    src = ref.addr;
  }
  send_pending_ack(ctx);  // responses leave in PSN order
  wire::PacketHeaders h = begin_packet(ctx.opcode(opcode), static_cast<size_t>(len));
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(rr.psn);
  if (auto aeth = h.aeth()) {
    aeth->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
    aeth->set_msn(ctx.resp.msn & wire::kPsnMask);
  }
  if (len > 0) tx_add_payload({src, static_cast<size_t>(len)});
  send_packet(ctx.route);
  rr.va += len;
  rr.resid -= len;
  rr.psn = wire::psn_next(rr.psn);
  rr.first_sent = true;
  if (last) rr.active = false;
}

void Engine::send_empty_read_response(QpContext& ctx, uint32_t psn) {
  send_pending_ack(ctx);  // responses leave in PSN order
  wire::PacketHeaders h = begin_packet(ctx.opcode(wire::op::kRcReadResponseOnly), 0);
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(psn);
  h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  h.aeth()->set_msn(ctx.resp.msn & wire::kPsnMask);
  send_packet(ctx.route);
}

void Engine::send_atomic_ack(QpContext& ctx, uint32_t psn, uint64_t orig) {
  send_pending_ack(ctx);  // responses leave in PSN order
  wire::PacketHeaders h = begin_packet(ctx.opcode(wire::op::kRcAtomicAck), 0);
  h.bth().set_dest_qp(ctx.attr.dest_qp_num & wire::kQpnMask);
  h.bth().set_psn(psn);
  h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  h.aeth()->set_msn(ctx.resp.msn & wire::kPsnMask);
  h.atomic_ack_eth()->set_orig_data(orig);
  send_packet(ctx.route);
}

// ---------------------------------------------------------------------------------------------
// Tag-matching rendezvous (Documentation/tag_matching.md): for a matched rendezvous request the
// receiver READs the sender's data into the tagged buffer and then SENDs it a FIN TMH (its tag
// and user data), ordinary RC packets of this QP. They are WQEs of the engine's own on the
// QP's send queue (provider::Qp::post_engine_st, in slots the application's max_send_wr does
// not count), so the requester and completer give them PSNs, retries and ordering like any
// other; their completions come to engine_wqe_done instead of a CQ, by the WQE's
// kSendFlagEngine, its wr_id naming the Rendezvous.

bool Engine::rendezvous_slot_free(const QpContext& ctx) const {
  for (const Rendezvous& r : ctx.resp.rndv)
    if (!r.active) return ctx.qp->engine_wqes() + 2 <= ctx.qp->engine_wqe_slots();
  return false;
}

void Engine::start_rendezvous(QpContext& ctx, const TmRecv& tm, const provider::RecvWork& buffer) {
  Rendezvous* r = nullptr;
  uint64_t index = 0;
  for (; index < ctx.resp.rndv.size(); ++index) {
    if (!ctx.resp.rndv[index].active) {
      r = &ctx.resp.rndv[index];
      break;
    }
  }
  base::check(r != nullptr, "rendezvous started without a free slot");
  *r = Rendezvous{.active = true,
                  .read_done = false,
                  .handle = tm.handle,
                  .wr_id = buffer.wr_id,
                  .tag = tm.tag,
                  .priv = tm.priv,
                  .length = tm.rndv_len};
  // More than the tagged buffer holds: nothing is read; the tag completes with Local Length
  // Error and the sender still gets its FIN (its buffer is free either way).
  if (tm.rndv_len > buffer.length) {
    finish_rendezvous_read(ctx, *r, IBV_WC_LOC_LEN_ERR);
    return;
  }
  if (tm.rndv_len == 0) {
    finish_rendezvous_read(ctx, *r, IBV_WC_SUCCESS);
    return;
  }
  provider::SendWqe read = {};
  read.wr_id = index;
  read.opcode = IBV_WR_RDMA_READ;
  read.length = tm.rndv_len;
  read.remote_addr = tm.rndv_va;
  read.rkey = tm.rndv_rkey;
  const bool posted = ctx.qp->post_engine_st(read, buffer.sges(), {});
  base::check(posted, "rendezvous READ without a send queue slot");
  activate(ctx);
}

void Engine::finish_rendezvous_read(QpContext& ctx, Rendezvous& r, ibv_wc_status status) {
  r.read_done = true;
  // The tagged buffer's second completion: the data is in place (IBV_WC_TM_DATA_VALID), or
  // the READ failed with `status`.
  ibv_wc wc = {};
  wc.wr_id = r.wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_TM_RECV;
  wc.qp_num = ctx.qpn;
  if (status == IBV_WC_SUCCESS) {
    wc.byte_len = r.length;
    wc.wc_flags = IBV_WC_TM_DATA_VALID;
  }
  ctx.qp->srq()->release_tag_st(r.handle);
  push_recv_cqe(ctx, wc, false);
  // A failed READ put the QP in ERR (or it is there already): no FIN can follow.
  if ((status != IBV_WC_SUCCESS && status != IBV_WC_LOC_LEN_ERR) || !post_rendezvous_fin(ctx, r))
    r.active = false;
}

bool Engine::post_rendezvous_fin(QpContext& ctx, Rendezvous& r) {
  std::array<uint8_t, wire::Tmh::kSize> fin{};
  wire::Tmh tmh(fin.data());
  tmh.set_opcode(static_cast<uint8_t>(wire::TmOp::kFin));
  tmh.set_app_ctx(r.priv);
  tmh.set_tag(r.tag);
  provider::SendWqe send = {};
  send.wr_id = static_cast<uint64_t>(&r - ctx.resp.rndv.data());
  send.opcode = IBV_WR_SEND;
  if (!ctx.qp->post_engine_st(send, {}, fin)) return false;
  activate(ctx);
  return true;
}

void Engine::engine_wqe_done(QpContext& ctx, const provider::SendWqe& wqe, ibv_wc_status status) {
  if (wqe.wr_id >= ctx.resp.rndv.size()) return;
  Rendezvous& r = ctx.resp.rndv[wqe.wr_id];
  if (!r.active) return;
  if (wqe.opcode == IBV_WR_RDMA_READ && !r.read_done) {
    finish_rendezvous_read(ctx, r, status);
    return;
  }
  r.active = false;  // the FIN was sent (or flushed)
}

// ---------------------------------------------------------------------------------------------
// UD (IBA 9.8.4 / 10.2.5): one-packet messages, Q_Key checked, the GRH (or its IPv4 form)
// placed in the first 40 bytes of the receive buffer.

void Engine::handle_ud_request(QpContext& ctx, const wire::PacketView& pkt,
                               const net::RxDatagram& d) {
  const wire::DethView deth = *pkt.deth();
  // IBA 10.2.5: the packet's Q_Key must equal the QP's Q_Key.
  if (deth.qkey() != ctx.attr.qkey) {
    ++counters_.drop_qkey;
    return;
  }
  const std::span<const uint8_t> data = pkt.payload();
  if (data.size() > ctx.mtu) {  // IBA 9.6 / C10-x: a UD message is one packet of <= PMTU
    ++counters_.drop_ud_length;
    return;
  }
  // The receive WQE: one kept back by an earlier oversized datagram (below), else the next one.
  Responder& resp = ctx.resp;
  if (!resp.has_recv) {
    // IBA 9.8.4: no receive WQE → the datagram is silently dropped.
    if (!ctx.qp->take_recv_st(resp.recv)) {
      ++counters_.drop_no_recv_wqe;
      return;
    }
    resp.has_recv = true;
  }
  const provider::RecvWork recv = resp.recv;
  if (data.size() + wire::Grh::kSize > recv.length) {
    // A datagram longer than the receive buffer is dropped and counted; the QP goes on (IBA
    // 11.4.2 lets a UD QP drop it; rxe_resp.c check_length → RESPST_ERR_LENGTH, class D for UD).
    // Nothing is written and nothing completes: the WQE is not consumed — it stays reserved
    // and takes the next datagram, as rxe leaves it at the head of the receive queue. A WQE
    // taken from an SRQ cannot be handed back, so (rxe class E) it completes with Remote
    // Invalid Request Error instead of being held by this QP.
    ++counters_.drop_ud_recv_length;
    if (ctx.qp->srq() != nullptr) {
      resp.has_recv = false;
      ibv_wc wc = {};
      wc.wr_id = recv.wr_id;
      wc.status = IBV_WC_REM_INV_REQ_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = ctx.qpn;
      push_recv_cqe(ctx, wc, false);
    }
    return;
  }
  resp.has_recv = false;  // consumed by this datagram
  ++counters_.rdma_recvs;
  ibv_wc wc = {};
  wc.wr_id = recv.wr_id;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = ctx.qpn;
  wc.src_qp = deth.src_qp();
  wc.pkey_index = 0;
  // The 40-byte GRH area: the IPv6 header, or 20 zero bytes and the IPv4 header (rdma-core's
  // convention, wire/grh.h). The IP ID, TTL and TOS are not visible to a UDP socket: 0 / 64.
  std::array<uint8_t, wire::Grh::kSize> grh{};
  const size_t udp_len = 8 + d.length;
  const bool ipv4 = d.src.address.is_v4() && d.dst.address.is_v4();
  // RoCEv2 carries no SL. For a UD receive on a RoCE port, mlx5 reports the frame's headers in
  // the SL instead (bit 3: a UDP, routable frame; bits 2:0: 1 IPv6, 2 IPv4), and UCX's
  // ud_verbs reads it to find the destination GID in the GRH area (rxe's 0 reads as IPv6, so
  // UCX drops every IPv4 datagram as addressed to another GID).
  wc.sl = ipv4 ? kRoceSlIpv4 : kRoceSlIpv6;
  if (ipv4) {
    std::array<uint8_t, wire::Ipv4Header::kSize> ip4{};
    wire::Ipv4Header h(ip4.data());
    h.set_version(4);
    h.set_ihl(5);
    h.set_total_length(static_cast<uint16_t>(wire::Ipv4Header::kSize + udp_len));
    h.set_flags(wire::kIpv4FlagDontFragment);
    h.set_ttl(64);
    h.set_protocol(wire::kIpProtoUdp);
    h.set_saddr(d.src.address.v4());
    h.set_daddr(d.dst.address.v4());
    h.set_checksum(wire::ipv4_header_checksum(ip4));
    wire::write_ipv4_grh(grh, ip4);
  } else {
    wire::Grh h(grh.data());
    h.set_ip_ver(6);
    h.set_paylen(static_cast<uint16_t>(udp_len));
    h.set_next_hdr(wire::kIpProtoUdp);
    h.set_hop_limit(64);
    h.set_sgid(d.src.address.bytes());
    h.set_dgid(d.dst.address.bytes());
  }
  const provider::MrTable& mrs = device_.mr_table();
  flush_tx_before_placement();
  if (!copy_sges(mrs, ctx.qp->pd(), recv.sges(), 0, grh, SgeDirection::kToSges) ||
      !copy_sges(mrs, ctx.qp->pd(), recv.sges(), wire::Grh::kSize,
                 std::span<uint8_t>(const_cast<uint8_t*>(data.data()), data.size()),
                 SgeDirection::kToSges)) {
    wc.status = IBV_WC_LOC_PROT_ERR;
    push_recv_cqe(ctx, wc, false);
    qp_error(ctx, IBV_QPS_ERR);
    return;
  }
  wc.status = IBV_WC_SUCCESS;
  wc.byte_len = static_cast<uint32_t>(wire::Grh::kSize + data.size());
  wc.wc_flags = IBV_WC_GRH;
  if (auto imm = pkt.immdt()) {
    wc.imm_data = htonl(imm->imm());
    wc.wc_flags |= IBV_WC_WITH_IMM;
  }
  push_recv_cqe(ctx, wc, pkt.bth().se());
}

}  // namespace urdma::engine
