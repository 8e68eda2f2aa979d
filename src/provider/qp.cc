// Queue pair; see qp.h for the design. The transition table is in qp_state_table.cc.
#include "provider/qp.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>

#include "provider/device.h"
#include "provider/limits.h"
#include "wire/headers.h"
#include "wire/psn.h"
#include "provider/engine_turn.h"

namespace urdma::provider {
namespace {

// ibv_qp_attr_mask bits 0..20: IB_QP_ATTR_STANDARD_BITS. The rest (SMAC, VID, RATE_LIMIT)
// are not for this device (rxe_modify_qp returns EOPNOTSUPP the same way).
constexpr int kStandardMaskBits = (IBV_QP_DEST_QPN << 1) - 1;
// qp_access_flags: the remote rights are what the responder checks; the kernel takes the MR
// flags beside them (uverbs copies qp_access_flags unchecked), and rdma-core's tests pass
// ON_DEMAND there (test_odp.py), so those are accepted and mean nothing for a QP. FLUSH and
// unknown bits are EINVAL.
constexpr int kQpAccessKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                               IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                               IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;
constexpr uint32_t kSgeBytes = sizeof(ibv_sge);
static_assert(kSgeBytes == 16);

// One row per ibv_wr_opcode (IBA 9.2 opcode tables; SEND with invalidate exists only for RC),
// naming what holds; every property left out is false.
constexpr SendOpcodeInfo kRdmaWrite = {.rc = true,
                                       .uc = true,
                                       .xrc = true,
                                       .sge_list = true,
                                       .inline_ok = true,
                                       .remote_rdma = true,
                                       .wc_opcode = IBV_WC_RDMA_WRITE};
constexpr SendOpcodeInfo kSend = {.rc = true,
                                  .uc = true,
                                  .ud = true,
                                  .xrc = true,
                                  .sge_list = true,
                                  .inline_ok = true,
                                  .wc_opcode = IBV_WC_SEND};
constexpr SendOpcodeInfo kSendInv = {
    .rc = true, .xrc = true, .sge_list = true, .inline_ok = true, .wc_opcode = IBV_WC_SEND};
constexpr SendOpcodeInfo kRdmaRead = {.rc = true,
                                      .xrc = true,
                                      .sge_list = true,
                                      .remote_rdma = true,
                                      .wc_opcode = IBV_WC_RDMA_READ};
constexpr SendOpcodeInfo kCmpSwap = {
    .rc = true, .xrc = true, .sge_list = true, .atomic = true, .wc_opcode = IBV_WC_COMP_SWAP};
constexpr SendOpcodeInfo kFetchAdd = {
    .rc = true, .xrc = true, .sge_list = true, .atomic = true, .wc_opcode = IBV_WC_FETCH_ADD};
// IBA 1.5 ATOMIC WRITE, RC only (rxe_wr_opcode_info): the 8 bytes come from the WR's data
// (an SGE list or inline data; ibv_wr_atomic_write gives them inline), the target from
// wr.rdma. The responder checks the target's alignment (rxe_resp.c atomic_write_reply).
constexpr SendOpcodeInfo kAtomicWrite = {.rc = true,
                                         .sge_list = true,
                                         .inline_ok = true,
                                         .remote_rdma = true,
                                         .atomic_write = true,
                                         .wc_opcode = IBV_WC_ATOMIC_WRITE};
constexpr SendOpcodeInfo kLocalInv = {
    .rc = true, .uc = true, .xrc = true, .local = true, .wc_opcode = IBV_WC_LOCAL_INV};
constexpr SendOpcodeInfo kBindMw = {
    .rc = true, .uc = true, .xrc = true, .local = true, .wc_opcode = IBV_WC_BIND_MW};

constexpr std::array<const SendOpcodeInfo*, IBV_WR_ATOMIC_WRITE + 1> kOpcodes = [] {
  std::array<const SendOpcodeInfo*, IBV_WR_ATOMIC_WRITE + 1> t{};
  t[IBV_WR_RDMA_WRITE] = &kRdmaWrite;
  t[IBV_WR_RDMA_WRITE_WITH_IMM] = &kRdmaWrite;
  t[IBV_WR_SEND] = &kSend;
  t[IBV_WR_SEND_WITH_IMM] = &kSend;
  t[IBV_WR_RDMA_READ] = &kRdmaRead;
  t[IBV_WR_ATOMIC_CMP_AND_SWP] = &kCmpSwap;
  t[IBV_WR_ATOMIC_FETCH_AND_ADD] = &kFetchAdd;
  t[IBV_WR_LOCAL_INV] = &kLocalInv;
  t[IBV_WR_BIND_MW] = &kBindMw;
  t[IBV_WR_SEND_WITH_INV] = &kSendInv;
  t[IBV_WR_ATOMIC_WRITE] = &kAtomicWrite;
  return t;  // TSO, DRIVER1, FLUSH: not implemented
}();

bool allowed_on(const SendOpcodeInfo& info, ibv_qp_type type) {
  return (type == IBV_QPT_RC && info.rc) || (type == IBV_QPT_UC && info.uc) ||
         (type == IBV_QPT_UD && info.ud) || (type == IBV_QPT_XRC_SEND && info.xrc);
}

ibv_qp_attr default_attr() {
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_RESET;
  a.cur_qp_state = IBV_QPS_RESET;
  a.path_mtu = IBV_MTU_256;
  a.path_mig_state = IBV_MIG_MIGRATED;
  a.port_num = kPortNum;
  return a;
}

}  // namespace

const SendOpcodeInfo* send_opcode_info(ibv_wr_opcode opcode) {
  const auto i = static_cast<size_t>(opcode);
  return i < kOpcodes.size() ? kOpcodes[i] : nullptr;
}

Status check_and_round_qp_init(QpInitAttr& init) {
  // rxe_qp_chk_init / rxe_qp_chk_cap.
  if (init.qp_type == IBV_QPT_XRC_RECV) {
    // ibv_create_qp_ex(3): an XRC target is created in an XRC domain, without PD or queues
    // (the kernel's create_xrc_qp_user); what it receives goes to the XRC SRQs of its domain.
    if (init.xrcd == nullptr) return Status(EINVAL);
    init.pd = nullptr;
    init.send_cq = nullptr;
    init.recv_cq = nullptr;
    init.srq = nullptr;
    init.cap = {};
    return kOk;
  }
  if (init.qp_type == IBV_QPT_XRC_SEND) {
    // An XRC initiator: a send queue on a PD; no receive side (ib_create_qp clears recv_cq and
    // srq for XRC_INI).
    init.recv_cq = nullptr;
    init.srq = nullptr;
    init.xrcd = nullptr;
    init.cap.max_recv_wr = 0;
    init.cap.max_recv_sge = 0;
    if (init.pd == nullptr || init.send_cq == nullptr) return Status(EINVAL);
  } else if (init.qp_type != IBV_QPT_RC && init.qp_type != IBV_QPT_UC &&
             init.qp_type != IBV_QPT_UD) {
    return Status(EOPNOTSUPP);
  } else if (init.pd == nullptr || init.send_cq == nullptr || init.recv_cq == nullptr) {
    return Status(EINVAL);
  }
  init.xrcd = nullptr;
  if (init.srq != nullptr && init.srq->type() == IBV_SRQT_XRC) return Status(EINVAL);
  if (init.srq != nullptr && init.srq->pd() == nullptr) return Status(EINVAL);
  // Tag matching is defined for RC (Documentation/tag_matching.md; IBV_TM_CAP_RC is the only
  // transport ibv_query_device_ex reports).
  if (init.srq != nullptr && init.srq->tm() && init.qp_type != IBV_QPT_RC)
    return Status(EOPNOTSUPP);
  ibv_qp_cap& cap = init.cap;
  if (cap.max_send_wr > kLimits.max_qp_wr || cap.max_send_sge > kLimits.max_sge ||
      cap.max_inline_data > kLimits.max_inline_data_bytes)
    return Status(EINVAL);
  if (init.srq == nullptr &&
      (cap.max_recv_wr > kLimits.max_qp_wr || cap.max_recv_sge > kLimits.max_sge))
    return Status(EINVAL);

  // Report what the queues really hold (rxe_qp_init_req / rxe_qp_init_resp): rings of
  // 2^k - 1 entries, and send WQEs big enough for max(SGE list, inline data).
  cap.max_send_wr = ring_capacity_for(std::max(cap.max_send_wr, 1u));
  const uint32_t wqe_size = std::max(cap.max_send_sge * kSgeBytes, cap.max_inline_data);
  cap.max_send_sge = std::min(wqe_size / kSgeBytes, kLimits.max_sge);
  cap.max_inline_data = wqe_size;
  if (init.srq != nullptr || init.qp_type == IBV_QPT_XRC_SEND) {
    cap.max_recv_wr = 0;
    cap.max_recv_sge = 0;
  } else {
    cap.max_recv_wr = ring_capacity_for(std::max(cap.max_recv_wr, 1u));
  }
  return kOk;
}

Qp::Qp(uint32_t handle, const QpInitAttr& init, Device& device)
    : handle_(handle),
      qp_num_(device.qpn_base() + handle),
      init_(init),
      device_(device),
      attr_(default_attr()),
      engine_slots_(init.srq != nullptr && init.srq->tm() ? kEngineSendWqes : 0),
      // The engine's WQEs need room for a tagged buffer's SGEs or a TMH inline.
      wqe_size_(engine_slots_ == 0 ? init.cap.max_inline_data
                                   : std::max({init.cap.max_inline_data,
                                               uint32_t{kTmMaxSge * sizeof(ibv_sge)},
                                               uint32_t{kEngineInlineBytes}})),
      sq_ring_(init.cap.max_send_wr + engine_slots_, QueueBuffer::kQp, init.allocator),
      sq_side_(make_queue_array<uint8_t>(size_t{sq_ring_.slots()} * wqe_size_ + 1, init.allocator,
                                         QueueBuffer::kQp)) {
  assert(qp_num_ <= wire::kQpnMask);
  if (init.srq == nullptr && init.qp_type != IBV_QPT_XRC_SEND && init.qp_type != IBV_QPT_XRC_RECV)
    rq_ = std::make_unique<RecvQueue>(init.cap.max_recv_wr, init.cap.max_recv_sge,
                                      QueueBuffer::kRq, init.allocator);
}

Qp::~Qp() = default;

Status Qp::check_attr(const ibv_qp_attr& attr, int mask, ibv_qp_state cur, ibv_qp_state next,
                      AddressVector* av) const {
  (void)cur;
  (void)next;
  // Each rule below is rxe_qp_chk_attr's or the uverbs layer's for the same bit.
  if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index >= kLimits.pkey_table_len)
    return Status(EINVAL);
  if ((mask & IBV_QP_PORT) && attr.port_num != kPortNum) return Status(EINVAL);
  // The kernel bans alternate paths on RoCE ports (_ib_modify_qp).
  if (mask & IBV_QP_ALT_PATH) return Status(EINVAL);
  if (mask & IBV_QP_AV) {
    Result<AddressVector> r =
        make_address_vector(attr.ah_attr, [this](uint32_t i) { return device_.sgid_present(i); });
    if (!r.ok()) return r.status();
    *av = r.value();
  }
  if ((mask & IBV_QP_PATH_MTU) &&
      (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > device_.active_mtu()))
    return Status(EINVAL);
  if ((mask & IBV_QP_TIMEOUT) && attr.timeout > kMaxTimeout) return Status(EINVAL);
  if ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > kMaxRetryCnt) return Status(EINVAL);
  if ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > kMaxRnrRetry) return Status(EINVAL);
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > kMaxMinRnrTimer) return Status(EINVAL);
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kLimits.max_qp_rd_atom)
    return Status(EINVAL);
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kLimits.max_qp_init_rd_atom)
    return Status(EINVAL);
  if ((mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~kQpAccessKnown))
    return Status(EINVAL);
  if ((mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > wire::kQpnMask) return Status(EINVAL);
  if ((mask & IBV_QP_PATH_MIG_STATE) && attr.path_mig_state != IBV_MIG_MIGRATED &&
      attr.path_mig_state != IBV_MIG_REARM && attr.path_mig_state != IBV_MIG_ARMED)
    return Status(EINVAL);
  return kOk;
}

Status Qp::modify(const ibv_qp_attr& attr, int mask) {
  if (mask & ~kStandardMaskBits) return Status(EOPNOTSUPP);
  ibv_qp_state cur;
  ibv_qp_state next;
  {
    std::lock_guard lock(attr_mutex_);
    cur = state_.load(std::memory_order_relaxed);
    // uverbs: state values beyond ERR are EINVAL; a stated current state must be the real one.
    if ((mask & IBV_QP_CUR_STATE) && (attr.cur_qp_state < IBV_QPS_RESET ||
                                      attr.cur_qp_state > IBV_QPS_ERR || attr.cur_qp_state != cur))
      return Status(EINVAL);
    next = (mask & IBV_QP_STATE) ? attr.qp_state : cur;
    if (next < IBV_QPS_RESET || next > IBV_QPS_ERR) return Status(EINVAL);
    // IBA 11.2.5.2: illegal transition or mask → the modify fails, nothing changes.
    if (!modify_qp_is_ok(cur, next, init_.qp_type, mask)) return Status(EINVAL);
    AddressVector av;
    if (Status s = check_attr(attr, mask, cur, next, &av); !s.ok()) return s;

    if (next == IBV_QPS_RESET) {
      attr_ = default_attr();
      av_ = {};
    }
    if (mask & IBV_QP_PKEY_INDEX) attr_.pkey_index = attr.pkey_index;
    if (mask & IBV_QP_PORT) attr_.port_num = attr.port_num;
    if (mask & IBV_QP_QKEY) attr_.qkey = attr.qkey;
    if (mask & IBV_QP_AV) {
      attr_.ah_attr = attr.ah_attr;
      av_ = av;
    }
    if (mask & IBV_QP_PATH_MTU) attr_.path_mtu = attr.path_mtu;
    if (mask & IBV_QP_TIMEOUT) attr_.timeout = attr.timeout;
    if (mask & IBV_QP_RETRY_CNT) attr_.retry_cnt = attr.retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) attr_.rnr_retry = attr.rnr_retry;
    // PSNs are 24 bits; the kernel masks wider values (with a warning) rather than failing.
    if (mask & IBV_QP_RQ_PSN) attr_.rq_psn = attr.rq_psn & wire::kPsnMask;
    if (mask & IBV_QP_SQ_PSN) attr_.sq_psn = attr.sq_psn & wire::kPsnMask;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) attr_.max_rd_atomic = attr.max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) attr_.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER) attr_.min_rnr_timer = attr.min_rnr_timer;
    if (mask & IBV_QP_ACCESS_FLAGS) attr_.qp_access_flags = attr.qp_access_flags;
    if (mask & IBV_QP_DEST_QPN) attr_.dest_qp_num = attr.dest_qp_num;
    if (mask & IBV_QP_PATH_MIG_STATE) attr_.path_mig_state = attr.path_mig_state;
    if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) attr_.en_sqd_async_notify = attr.en_sqd_async_notify;
    // SQD: the send queue drains until the engine reports it empty (sq_drained_st).
    sq_draining_ = next == IBV_QPS_SQD && (cur != IBV_QPS_SQD || sq_draining_);
    state_.store(next, std::memory_order_release);
  }
  device_.doorbell().qp_modified(*this, cur, next);
  if (next == IBV_QPS_RESET) {
    empty_queues();
    // The engine has forgotten the QP (qp_modified waited for its turn): no completion of it
    // follows. Those nobody polled go with its queues, as mlx5_modify_qp's mlx5_cq_clean does,
    // so a QP taken from ERR through RESET back to RTS does not return old flushes first.
    if (init_.send_cq != nullptr) init_.send_cq->discard_qp(qp_num());
    if (init_.recv_cq != nullptr && init_.recv_cq != init_.send_cq)
      init_.recv_cq->discard_qp(qp_num());
  }
  return kOk;
}

void Qp::empty_queues() {
  {
    std::lock_guard lock(sq_mutex_);
    sq_ring_.clear();
    engine_wqes_.store(0, std::memory_order_relaxed);
  }
  if (rq_ != nullptr) {
    std::lock_guard lock(rq_mutex_);
    rq_->clear();
  }
}

Status Qp::query(ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) const {
  (void)mask;  // everything is cheap to return; rxe_query_qp ignores the mask too
  if (attr == nullptr || init_attr == nullptr) return Status(EINVAL);
  {
    std::lock_guard lock(attr_mutex_);
    *attr = attr_;
    attr->sq_draining = sq_draining_ ? 1 : 0;
  }
  attr->qp_state = state();
  attr->cur_qp_state = attr->qp_state;
  attr->cap = init_.cap;
  *init_attr = {};
  init_attr->qp_type = init_.qp_type;
  init_attr->send_cq =
      init_.send_cq ? static_cast<ibv_cq*>(init_.send_cq->user_context) : nullptr;
  init_attr->recv_cq =
      init_.recv_cq ? static_cast<ibv_cq*>(init_.recv_cq->user_context) : nullptr;
  init_attr->srq = init_.srq ? static_cast<ibv_srq*>(init_.srq->user_context) : nullptr;
  init_attr->cap = init_.cap;
  init_attr->sq_sig_all = init_.sq_sig_all ? 1 : 0;
  return kOk;
}

ibv_qp_attr Qp::attr_snapshot() const {
  std::lock_guard lock(attr_mutex_);
  ibv_qp_attr a = attr_;
  a.qp_state = state();
  a.sq_draining = sq_draining_ ? 1 : 0;
  return a;
}

AddressVector Qp::path_snapshot() const {
  std::lock_guard lock(attr_mutex_);
  return av_;
}

Status Qp::validate_send(const ibv_send_wr& wr, Resolved& r) const {
  // Each EINVAL here is one of rxe's validate_send_wr / post_one_send rules.
  // The opcode is read as raw bytes: an application may store any value in the enum field.
  uint32_t raw_opcode;
  static_assert(sizeof(wr.opcode) == sizeof(raw_opcode));
  std::memcpy(&raw_opcode, &wr.opcode, sizeof raw_opcode);
  r.info = raw_opcode < kOpcodes.size() ? kOpcodes[raw_opcode] : nullptr;
  if (r.info == nullptr || !allowed_on(*r.info, init_.qp_type)) return Status(EINVAL);
  if (wr.send_flags & ~kSendFlagsKnown) return Status(EINVAL);
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > init_.cap.max_send_sge)
    return Status(EINVAL);
  r.length = 0;
  if (r.info->sge_list) {
    for (int i = 0; i < wr.num_sge; ++i) r.length += wr.sg_list[i].length;
  }
  r.inline_data = (wr.send_flags & IBV_SEND_INLINE) && r.info->inline_ok;
  // ATOMIC WRITE's 8 inline bytes travel in the WQE itself, whatever max_inline_data is.
  if (r.inline_data && r.length > init_.cap.max_inline_data && !r.info->atomic_write)
    return Status(EINVAL);
  if (r.info->atomic) {
    // IBA 9.4.5: atomics operate on 8 bytes at an 8-byte aligned virtual address.
    if (wr.num_sge != 1 || r.length != sizeof(uint64_t)) return Status(EINVAL);
    if (wr.wr.atomic.remote_addr % sizeof(uint64_t) != 0) return Status(EINVAL);
  }
  // IBA 1.5 (ATOMIC WRITE): the payload is exactly 8 bytes.
  if (r.info->atomic_write && r.length != sizeof(uint64_t)) return Status(EINVAL);
  // ibv_post_send(3): an XRC initiator names the XRC SRQ each WR is for; it is 24 bits on the
  // wire (the XRCETH).
  if (init_.qp_type == IBV_QPT_XRC_SEND && !r.info->local &&
      wr.qp_type.xrc.remote_srqn > wire::kXrcSrqMask)
    return Status(EINVAL);
  if (init_.qp_type == IBV_QPT_UD) {
    if (wr.wr.ud.ah == nullptr) return Status(EINVAL);
    const Ah* ah = device_.ah_by_handle(wr.wr.ud.ah->handle);
    // IBA 10.2.3 (PDs): the AH must belong to the QP's PD; refused at post time here.
    if (ah == nullptr || ah->pd() != init_.pd) return Status(EINVAL);
    r.av = ah->av();
  }
  if (wr.opcode == IBV_WR_BIND_MW) {
    if (wr.bind_mw.mw == nullptr) return Status(EINVAL);
    const Mw* mw = device_.mr_table().mw_by_handle(wr.bind_mw.mw->handle);
    // Type 1 windows are bound with ibv_bind_mw, never by a BIND_MW WR (IBA 10.6.7.2.1).
    if (mw == nullptr || mw->type() != IBV_MW_TYPE_2) return Status(EINVAL);
    const ibv_mw_bind_info& info = wr.bind_mw.bind_info;
    uint32_t mr_handle = 0;
    if (info.mr != nullptr) {
      const Mr* mr = device_.mr_table().mr_by_handle(info.mr->handle);
      if (mr == nullptr) return Status(EINVAL);
      mr_handle = mr->handle();
    }
    r.bind = {.mw_handle = mw->handle(),
              .new_rkey = wr.bind_mw.rkey,
              .mr_handle = mr_handle,
              .addr = info.addr,
              .length = info.length,
              .access = static_cast<int>(info.mw_access_flags)};
  }
  return kOk;
}

void Qp::fill_send_wqe(const ibv_send_wr& wr, const Resolved& r, SendWqe& wqe, uint32_t slot) {
  wqe = {};
  wqe.wr_id = wr.wr_id;
  wqe.length = r.length;
  wqe.opcode = wr.opcode;
  wqe.send_flags = wr.send_flags & ~IBV_SEND_INLINE;
  wqe.slot = slot;
  uint8_t* side = side_area(slot);
  if (r.inline_data && r.info->atomic_write) {
    wqe.send_flags |= IBV_SEND_INLINE;
    size_t off = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const ibv_sge& sge = wr.sg_list[i];
      if (sge.length == 0) continue;
      std::memcpy(reinterpret_cast<uint8_t*>(&wqe.compare_add) + off,
                  reinterpret_cast<const void*>(sge.addr), sge.length);
      off += sge.length;
    }
  } else if (r.inline_data) {
    // Inline data is copied now: the application may reuse its buffers once post returns.
    wqe.send_flags |= IBV_SEND_INLINE;
    size_t off = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const ibv_sge& sge = wr.sg_list[i];
      if (sge.length == 0) continue;
      std::memcpy(side + off, reinterpret_cast<const void*>(sge.addr), sge.length);
      off += sge.length;
    }
  } else if (r.info->sge_list) {
    wqe.num_sge = static_cast<uint32_t>(wr.num_sge);
    if (wr.num_sge > 0) std::memcpy(side, wr.sg_list, size_t{wqe.num_sge} * kSgeBytes);
  }
  switch (wr.opcode) {
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      wqe.imm_data = wr.imm_data;
      break;
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_LOCAL_INV:
      wqe.invalidate_rkey = wr.invalidate_rkey;
      break;
    default:
      break;
  }
  if (r.info->remote_rdma) {
    wqe.remote_addr = wr.wr.rdma.remote_addr;
    wqe.rkey = wr.wr.rdma.rkey;
  }
  if (r.info->atomic) {
    wqe.remote_addr = wr.wr.atomic.remote_addr;
    wqe.rkey = wr.wr.atomic.rkey;
    wqe.compare_add = wr.wr.atomic.compare_add;
    wqe.swap = wr.wr.atomic.swap;
  }
  if (init_.qp_type == IBV_QPT_XRC_SEND) wqe.xrc_remote_srqn = wr.qp_type.xrc.remote_srqn;
  if (init_.qp_type == IBV_QPT_UD) {
    wqe.remote_qpn = wr.wr.ud.remote_qpn & wire::kQpnMask;
    wqe.remote_qkey = wr.wr.ud.remote_qkey;
    wqe.av = r.av;
  }
  if (wr.opcode == IBV_WR_BIND_MW) wqe.bind = r.bind;
}

Status Qp::post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Status status;
  bool posted = false;
  {
    std::lock_guard lock(sq_mutex_);
    // Posting before RTS is EINVAL (rxe_post_send); in SQD/SQE/ERR WRs queue (and flush).
    const ibv_qp_state st = state();
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) {
      status = Status(EINVAL);
    } else {
      for (; wr != nullptr; wr = wr->next) {
        Resolved r;
        status = validate_send(*wr, r);
        if (!status.ok()) break;
        SendWqe* wqe = sq_ring_.producer_slot();
        // The application's WQEs fill cap().max_send_wr; the rest of the ring is the engine's.
        if (wqe == nullptr ||
            sq_ring_.size() - engine_wqes_.load(std::memory_order_relaxed) >=
                init_.cap.max_send_wr) {
          status = Status(ENOMEM);
          break;
        }
        fill_send_wqe(*wr, r, *wqe, sq_ring_.producer_slot_index());
        sq_ring_.publish();
        posted = true;
      }
    }
  }
  if (!status.ok() && bad_wr != nullptr) *bad_wr = wr;
  if (posted) device_.doorbell().ring_sq(*this);
  return status;
}

Status Qp::bind_mw(Mw* mw, const ibv_mw_bind& bind, uint32_t* new_rkey) {
  // ibv_bind_mw(3) / the inline checks in verbs.h, repeated for callers that skip them.
  if (mw == nullptr || mw->type() != IBV_MW_TYPE_1) return Status(EINVAL);
  if (init_.qp_type != IBV_QPT_RC && init_.qp_type != IBV_QPT_UC) return Status(EINVAL);
  const ibv_mw_bind_info& info = bind.bind_info;
  if (info.mr == nullptr && (info.addr != 0 || info.length != 0)) return Status(EINVAL);
  const Mr* mr = nullptr;
  if (info.mr != nullptr) {
    mr = device_.mr_table().mr_by_handle(info.mr->handle);
    if (mr == nullptr) return Status(EINVAL);
    if (mr->pd() != mw->pd()) return Status(EPERM);
  }
  if (bind.send_flags & ~kSendFlagsKnown) return Status(EINVAL);
  Status status;
  {
    std::lock_guard lock(sq_mutex_);
    const ibv_qp_state st = state();
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) return Status(EINVAL);
    SendWqe* wqe = sq_ring_.producer_slot();
    if (wqe == nullptr) return Status(ENOMEM);
    const uint32_t rkey = device_.mr_table().next_mw_rkey(mw);
    *wqe = {};
    wqe->wr_id = bind.wr_id;
    wqe->opcode = IBV_WR_BIND_MW;
    wqe->send_flags = bind.send_flags & ~IBV_SEND_INLINE;
    wqe->slot = sq_ring_.producer_slot_index();
    wqe->bind = {.mw_handle = mw->handle(),
                 .new_rkey = rkey,
                 .mr_handle = mr != nullptr ? mr->handle() : 0,
                 .addr = info.addr,
                 .length = info.length,
                 .access = static_cast<int>(info.mw_access_flags)};
    sq_ring_.publish();
    if (new_rkey != nullptr) *new_rkey = rkey;
  }
  device_.doorbell().ring_sq(*this);
  return status;
}

Status Qp::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Status status;
  bool posted = false;
  if (rq_ == nullptr) {
    // A QP attached to an SRQ has no receive queue of its own (ibv_post_recv(3)).
    status = Status(EINVAL);
  } else {
    std::lock_guard lock(rq_mutex_);
    if (state() == IBV_QPS_RESET) {
      status = Status(EINVAL);  // rxe_post_recv: not before INIT
    } else {
      for (; wr != nullptr; wr = wr->next) {
        status = rq_->post(*wr);
        if (!status.ok()) break;
        posted = true;
      }
    }
  }
  if (!status.ok() && bad_wr != nullptr) *bad_wr = wr;
  if (posted) device_.doorbell().ring_rq(*this);
  return status;
}

bool Qp::post_engine_st(const SendWqe& wqe, std::span<const ibv_sge> sges,
                        std::span<const uint8_t> inline_data) {
  URDMA_ASSERT_ENGINE_TURN();
  assert(sges.size_bytes() <= wqe_size_ && inline_data.size() <= wqe_size_);
  std::lock_guard lock(sq_mutex_);
  if (engine_wqes_.load(std::memory_order_relaxed) >= engine_slots_) return false;
  SendWqe* slot = sq_ring_.producer_slot();
  if (slot == nullptr) return false;
  const uint32_t index = sq_ring_.producer_slot_index();
  *slot = wqe;
  slot->slot = index;
  slot->send_flags |= kSendFlagEngine;
  slot->num_sge = static_cast<uint32_t>(sges.size());
  if (!sges.empty()) std::memcpy(side_area(index), sges.data(), sges.size_bytes());
  if (!inline_data.empty()) {
    std::memcpy(side_area(index), inline_data.data(), inline_data.size());
    slot->send_flags |= IBV_SEND_INLINE;
    slot->length = inline_data.size();
  }
  engine_wqes_.fetch_add(1, std::memory_order_relaxed);
  sq_ring_.publish();
  return true;
}

std::span<const ibv_sge> Qp::sq_sges_st(const SendWqe& wqe) const {
  URDMA_ASSERT_ENGINE_TURN();
  return {reinterpret_cast<const ibv_sge*>(side_area(wqe.slot)), wqe.num_sge};
}

std::span<const uint8_t> Qp::sq_inline_st(const SendWqe& wqe) const {
  URDMA_ASSERT_ENGINE_TURN();
  if (!(wqe.send_flags & IBV_SEND_INLINE)) return {};
  return {side_area(wqe.slot), static_cast<size_t>(wqe.length)};
}

bool Qp::take_recv_st(RecvWork& out) {
  URDMA_ASSERT_ENGINE_TURN();
  assert(device_.on_engine_thread());
  if (init_.srq != nullptr) return init_.srq->take_st(out);
  return rq_ != nullptr && rq_->take(out);
}

uint32_t Qp::rq_size() const {
  if (init_.srq != nullptr) return init_.srq->size();
  return rq_ != nullptr ? rq_->size() : 0;
}

uint32_t Qp::flush_st() {
  URDMA_ASSERT_ENGINE_TURN();
  assert(device_.on_engine_thread());
  uint32_t flushed = 0;
  ibv_wc wc = {};
  wc.status = IBV_WC_WR_FLUSH_ERR;
  wc.qp_num = qp_num_;
  for (const SendWqe* wqe; (wqe = sq_ring_.peek()) != nullptr; sq_pop_st()) {
    if (wqe->send_flags & kSendFlagEngine) continue;  // the engine's own: no CQ entry
    wc.wr_id = wqe->wr_id;
    wc.opcode = kOpcodes[wqe->opcode]->wc_opcode;
    (void)init_.send_cq->push_st(wc, false);  // an overflow is the CQ's own error
    ++flushed;
  }
  if (rq_ != nullptr) {
    RecvWork work;
    wc.opcode = IBV_WC_RECV;
    while (rq_->take(work)) {
      wc.wr_id = work.wr_id;
      (void)init_.recv_cq->push_st(wc, false);
      ++flushed;
    }
  }
  return flushed;
}

bool Qp::enter_error_st(ibv_qp_state to) {
  URDMA_ASSERT_ENGINE_TURN();
  assert(to == IBV_QPS_SQE || to == IBV_QPS_ERR);
  assert(device_.on_engine_thread());
  std::lock_guard lock(attr_mutex_);
  const ibv_qp_state cur = state_.load(std::memory_order_relaxed);
  if (cur == IBV_QPS_RESET || cur == IBV_QPS_ERR) return false;
  // IBA 10.3.1.5: only UC and UD have the SQ error state; an RC send error is a QP error.
  if (to == IBV_QPS_SQE && init_.qp_type == IBV_QPT_RC) to = IBV_QPS_ERR;
  if (cur == to) return false;
  state_.store(to, std::memory_order_release);
  sq_draining_ = false;
  return true;
}

void Qp::sq_drained_st() {
  URDMA_ASSERT_ENGINE_TURN();
  bool notify = false;
  {
    std::lock_guard lock(attr_mutex_);
    if (state_.load(std::memory_order_relaxed) != IBV_QPS_SQD || !sq_draining_) return;
    sq_draining_ = false;
    notify = attr_.en_sqd_async_notify != 0;
  }
  if (notify) raise_event(IBV_EVENT_SQ_DRAINED);
}

void Qp::raise_event(ibv_event_type type) {
  device_.async_events().push({.type = type, .qp = this});
}

}  // namespace urdma::provider
