// The extended QP API: ibv_create_qp_ex with send_ops_flags, ibv_qp_to_qp_ex and the ibv_wr_*
// builders (ibv_wr_start / ibv_wr_rdma_write / ibv_wr_set_sge / ... / ibv_wr_complete).
//
// Design
// * An extended QP is an ordinary Qp (create_qp_common), so ibv_post_send/ibv_post_recv,
//   modify/query/destroy work on it unchanged. With IBV_QP_INIT_ATTR_SEND_OPS_FLAGS its
//   ibv_qp_ex function pointers are filled and ibv_qp_to_qp_ex returns &qp_ex (rdma-core's
//   VERBS_QP_EX). Without it the QP has no extended interface (ibv_qp_to_qp_ex: NULL).
//   (ibv_create_qp_ex() with comp_mask == IBV_QP_INIT_ATTR_PD never reaches create_qp_ex:
//   verbs.h's inline sends it to ibv_create_qp.)
// * The builders write ibv_send_wr records into QpExState's batch; SGE lists and inline data
//   are copied there at the call (ibv_wr_post(3): the caller's buffers and lists may be reused
//   as soon as the setter returns). ibv_wr_complete links the batch and posts it with the
//   provider's post_send, which copies inline data and SGE lists into its WQEs.
// * Errors (ibv_wr_post(3)): builders cannot fail; the first problem is kept and returned by
//   ibv_wr_complete, and nothing of a failed batch is posted. To keep that promise the whole
//   batch is checked here first with the rules the provider's post_send applies (opcode for
//   the QP type and in send_ops_flags, SGE count, inline size, atomic shape, UD address, MW
//   type, room in the send queue); the provider's own checks then find nothing. The QP state
//   (no posting before RTS) fails the provider's post_send on the first WR, so nothing posts.
// * Not thread-safe per QP, as ibv_wr_post(3) says (one batch at a time per QP).
#include <cerrno>
#include <cstring>
#include <vector>

#include "provider/qp.h"
#include "verbs/internal.h"

namespace urdma::verbs {

struct QpExState {
  uint64_t send_ops_flags = 0;
  bool open = false;  // between wr_start and wr_complete/wr_abort
  int err = 0;        // the first error of the batch
  struct Pending {
    ibv_send_wr wr;
    size_t sge_off = 0, sge_cnt = 0;  // into sges
    size_t inl_off = 0, inl_len = 0;  // into inline_bytes, when wr.send_flags has INLINE
  };
  std::vector<Pending> batch;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_bytes;
  std::vector<ibv_send_wr> linked;  // built at wr_complete
  std::vector<ibv_sge> linked_sges;
};

namespace {

constexpr uint32_t kKnownQpCompMask =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH |
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

// send_ops_flags bit -> the WR opcode it enables (those the provider implements).
struct OpFlag {
  uint64_t flag;
  ibv_wr_opcode opcode;
};
constexpr OpFlag kOpFlags[] = {
    {IBV_QP_EX_WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE},
    {IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM},
    {IBV_QP_EX_WITH_SEND, IBV_WR_SEND},
    {IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_WR_SEND_WITH_IMM},
    {IBV_QP_EX_WITH_RDMA_READ, IBV_WR_RDMA_READ},
    {IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_CMP_AND_SWP},
    {IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_FETCH_AND_ADD},
    {IBV_QP_EX_WITH_LOCAL_INV, IBV_WR_LOCAL_INV},
    {IBV_QP_EX_WITH_BIND_MW, IBV_WR_BIND_MW},
    {IBV_QP_EX_WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV},
    {IBV_QP_EX_WITH_ATOMIC_WRITE, IBV_WR_ATOMIC_WRITE},
};

bool allowed_on(const provider::SendOpcodeInfo& info, ibv_qp_type type) {
  return (type == IBV_QPT_RC && info.rc) || (type == IBV_QPT_UC && info.uc) ||
         (type == IBV_QPT_UD && info.ud) || (type == IBV_QPT_XRC_SEND && info.xrc);
}

uint64_t flag_of(ibv_wr_opcode opcode) {
  for (const OpFlag& f : kOpFlags)
    if (f.opcode == opcode) return f.flag;
  return 0;
}

Qp* qp_of(ibv_qp_ex* x) { return Qp::from(x); }
QpExState& st(ibv_qp_ex* x) { return *qp_of(x)->ex; }

void set_err(QpExState& s, int err) {
  if (s.err == 0) s.err = err;
}

// The WR the setters apply to: the last one started, or null (EINVAL kept) if none.
QpExState::Pending* current(ibv_qp_ex* x) {
  QpExState& s = st(x);
  if (!s.open || s.batch.empty()) {
    set_err(s, EINVAL);
    return nullptr;
  }
  return &s.batch.back();
}

// Starts a WR of `opcode`, taking wr_id and wr_flags as they are now (ibv_wr_post(3)).
ibv_send_wr* begin(ibv_qp_ex* x, ibv_wr_opcode opcode) {
  QpExState& s = st(x);
  if (!s.open) {
    set_err(s, EINVAL);
    return nullptr;
  }
  QpExState::Pending& p = s.batch.emplace_back();
  p.wr = {};
  p.wr.wr_id = x->wr_id;
  p.wr.opcode = opcode;
  // INLINE is chosen with wr_set_inline_data*; a flag given in wr_flags alone means nothing.
  p.wr.send_flags = x->wr_flags & ~static_cast<unsigned>(IBV_SEND_INLINE);
  p.sge_off = s.sges.size();
  p.inl_off = s.inline_bytes.size();
  return &p.wr;
}

// ---- operations ----

void wr_send(ibv_qp_ex* x) { begin(x, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* x, __be32 imm) {
  if (ibv_send_wr* w = begin(x, IBV_WR_SEND_WITH_IMM)) w->imm_data = imm;
}

void wr_send_inv(ibv_qp_ex* x, uint32_t invalidate_rkey) {
  if (ibv_send_wr* w = begin(x, IBV_WR_SEND_WITH_INV)) w->invalidate_rkey = invalidate_rkey;
}

void wr_rdma_write(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* w = begin(x, IBV_WR_RDMA_WRITE)) w->wr.rdma = {remote_addr, rkey};
}

void wr_rdma_write_imm(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, __be32 imm) {
  if (ibv_send_wr* w = begin(x, IBV_WR_RDMA_WRITE_WITH_IMM)) {
    w->wr.rdma = {remote_addr, rkey};
    w->imm_data = imm;
  }
}

void wr_rdma_read(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* w = begin(x, IBV_WR_RDMA_READ)) w->wr.rdma = {remote_addr, rkey};
}

void wr_atomic_cmp_swp(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
                       uint64_t swap) {
  if (ibv_send_wr* w = begin(x, IBV_WR_ATOMIC_CMP_AND_SWP))
    w->wr.atomic = {remote_addr, compare, swap, rkey};
}

void wr_atomic_fetch_add(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (ibv_send_wr* w = begin(x, IBV_WR_ATOMIC_FETCH_AND_ADD))
    w->wr.atomic = {remote_addr, add, 0, rkey};
}

// ibv_wr_post(3): the 8 bytes at atomic_wr are taken now, as inline data.
void wr_atomic_write(ibv_qp_ex* x, uint32_t rkey, uint64_t remote_addr, const void* atomic_wr) {
  ibv_send_wr* w = begin(x, IBV_WR_ATOMIC_WRITE);
  if (!w) return;
  QpExState& s = st(x);
  if (!atomic_wr) {
    set_err(s, EINVAL);
    return;
  }
  w->wr.rdma = {remote_addr, rkey};
  QpExState::Pending& p = s.batch.back();
  const auto* b = static_cast<const uint8_t*>(atomic_wr);
  s.inline_bytes.insert(s.inline_bytes.end(), b, b + sizeof(uint64_t));
  p.inl_len = sizeof(uint64_t);
  w->send_flags |= IBV_SEND_INLINE;
}

void wr_local_inv(ibv_qp_ex* x, uint32_t invalidate_rkey) {
  if (ibv_send_wr* w = begin(x, IBV_WR_LOCAL_INV)) w->invalidate_rkey = invalidate_rkey;
}

void wr_bind_mw(ibv_qp_ex* x, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  ibv_send_wr* w = begin(x, IBV_WR_BIND_MW);
  if (!w) return;
  if (!mw || !info) {
    set_err(st(x), EINVAL);
    return;
  }
  w->bind_mw.mw = mw;
  w->bind_mw.rkey = rkey;
  w->bind_mw.bind_info = *info;
}

// Not implemented by the provider; reachable only through a pointer a caller fetched anyway.
void wr_unsupported_tso(ibv_qp_ex* x, void*, uint16_t, uint16_t) { set_err(st(x), EOPNOTSUPP); }
// ibv_wr_set_xrc_srqn(3): the XRC SRQ the current WR is for (XRC_SEND QPs only).
void wr_set_xrc_srqn(ibv_qp_ex* x, uint32_t remote_srqn) {
  QpExState::Pending* p = current(x);
  if (!p) return;
  if (qp_of(x)->qp.qp_type != IBV_QPT_XRC_SEND) {
    set_err(st(x), EINVAL);
    return;
  }
  p->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

// ---- setters ----

void wr_set_ud_addr(ibv_qp_ex* x, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  QpExState::Pending* p = current(x);
  if (!p) return;
  p->wr.wr.ud.ah = ah;
  p->wr.wr.ud.remote_qpn = remote_qpn;
  p->wr.wr.ud.remote_qkey = remote_qkey;
}

// Replaces the data of the current WR (a second setter call wins, as on rdma-core's providers).
void reset_data(QpExState& s, QpExState::Pending& p) {
  s.sges.resize(p.sge_off);
  s.inline_bytes.resize(p.inl_off);
  p.sge_cnt = 0;
  p.inl_len = 0;
  p.wr.send_flags &= ~static_cast<unsigned>(IBV_SEND_INLINE);
}

void wr_set_sge_list(ibv_qp_ex* x, size_t num_sge, const ibv_sge* sg_list) {
  QpExState::Pending* p = current(x);
  if (!p) return;
  QpExState& s = st(x);
  reset_data(s, *p);
  if (num_sge > 0 && !sg_list) {
    set_err(s, EINVAL);
    return;
  }
  s.sges.insert(s.sges.end(), sg_list, sg_list + num_sge);
  p->sge_cnt = num_sge;
}

void wr_set_sge(ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge sge{addr, length, lkey};
  wr_set_sge_list(x, 1, &sge);
}

void wr_set_inline_data_list(ibv_qp_ex* x, size_t num_buf, const ibv_data_buf* buf_list) {
  QpExState::Pending* p = current(x);
  if (!p) return;
  QpExState& s = st(x);
  reset_data(s, *p);
  if (num_buf > 0 && !buf_list) {
    set_err(s, EINVAL);
    return;
  }
  const uint32_t max_inline = qp_of(x)->p->cap().max_inline_data;
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (buf_list[i].length > max_inline || total + buf_list[i].length > max_inline) {
      set_err(s, EINVAL);  // more than the QP's max_inline_data: refused at wr_complete
      return;
    }
    total += buf_list[i].length;
    if (buf_list[i].length && !buf_list[i].addr) {
      set_err(s, EINVAL);
      return;
    }
  }
  for (size_t i = 0; i < num_buf; ++i) {
    const auto* b = static_cast<const uint8_t*>(buf_list[i].addr);
    s.inline_bytes.insert(s.inline_bytes.end(), b, b + buf_list[i].length);
  }
  p->inl_len = total;
  p->wr.send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex* x, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  wr_set_inline_data_list(x, 1, &buf);
}

// ---- the batch ----

void wr_start(ibv_qp_ex* x) {
  QpExState& s = st(x);
  s.open = true;
  s.err = 0;
  s.batch.clear();
  s.sges.clear();
  s.inline_bytes.clear();
}

void wr_abort(ibv_qp_ex* x) {
  QpExState& s = st(x);
  s.open = false;
  s.err = 0;
  s.batch.clear();
  s.sges.clear();
  s.inline_bytes.clear();
}

uint64_t sge_bytes(const QpExState& s, const QpExState::Pending& p) {
  uint64_t n = 0;
  for (size_t i = 0; i < p.sge_cnt; ++i) n += s.sges[p.sge_off + i].length;
  return n;
}

// provider::Qp::validate_send's rules (and the send_ops_flags chosen at creation), applied to
// the whole batch before anything is posted.
int check(Qp& q, const QpExState& s, const QpExState::Pending& p) {
  const ibv_send_wr& wr = p.wr;
  const ibv_qp_cap& cap = q.p->cap();
  const provider::SendOpcodeInfo* info = provider::send_opcode_info(wr.opcode);
  if (!info || !allowed_on(*info, q.qp.qp_type)) return EINVAL;
  if (!(s.send_ops_flags & flag_of(wr.opcode))) return EINVAL;  // not asked for at creation
  if (wr.send_flags & ~provider::kSendFlagsKnown) return EINVAL;
  const bool inl = (wr.send_flags & IBV_SEND_INLINE) != 0;
  if (inl && !info->inline_ok) return EINVAL;
  // ATOMIC WRITE's 8 bytes are inline whatever max_inline_data is (wr_atomic_write).
  if (inl && p.inl_len > cap.max_inline_data && !info->atomic_write) return EINVAL;
  if (!inl && p.sge_cnt > cap.max_send_sge) return EINVAL;
  if (info->atomic) {
    if (inl || p.sge_cnt != 1 || s.sges[p.sge_off].length != sizeof(uint64_t)) return EINVAL;
    if (wr.wr.atomic.remote_addr % sizeof(uint64_t) != 0) return EINVAL;
  }
  if (info->atomic_write) {
    const uint64_t len = inl ? p.inl_len : sge_bytes(s, p);
    if (len != sizeof(uint64_t)) return EINVAL;
  }
  if (q.qp.qp_type == IBV_QPT_UD) {
    // The same PD: the same provider PD (an imported ibv_pd names its original's).
    if (!wr.wr.ud.ah || Pd::from(wr.wr.ud.ah->pd)->p != Pd::from(q.qp.pd)->p) return EINVAL;
  }
  if (wr.opcode == IBV_WR_BIND_MW) {
    if (!wr.bind_mw.mw || wr.bind_mw.mw->type != IBV_MW_TYPE_2 ||
        !same_device(wr.bind_mw.mw->context, q.qp.context))
      return EINVAL;
    const ibv_mr* mr = wr.bind_mw.bind_info.mr;
    if (mr && !same_device(mr->context, q.qp.context)) return EINVAL;
  }
  return 0;
}

int wr_complete(ibv_qp_ex* x) {
  Qp& q = *qp_of(x);
  QpExState& s = *q.ex;
  if (!s.open) return EINVAL;
  s.open = false;
  int err = s.err;
  for (size_t i = 0; err == 0 && i < s.batch.size(); ++i) err = check(q, s, s.batch[i]);
  // Room for the whole batch (a snapshot: the engine only ever frees slots meanwhile).
  if (err == 0 && s.batch.size() > q.p->cap().max_send_wr - q.p->sq_size()) err = ENOMEM;
  if (err != 0 || s.batch.empty()) {
    wr_abort(x);
    return err;
  }
  // Link the batch: inline data becomes one SGE per WR over inline_bytes (the provider copies
  // it into the WQE at post).
  s.linked.resize(s.batch.size());
  s.linked_sges.clear();
  s.linked_sges.reserve(s.batch.size() + s.sges.size());
  for (size_t i = 0; i < s.batch.size(); ++i) {
    const QpExState::Pending& p = s.batch[i];
    ibv_send_wr& w = s.linked[i];
    w = p.wr;
    w.next = i + 1 < s.batch.size() ? &s.linked[i + 1] : nullptr;
    const size_t first = s.linked_sges.size();
    if (w.send_flags & IBV_SEND_INLINE) {
      if (p.inl_len) {
        s.linked_sges.push_back(
            {reinterpret_cast<uintptr_t>(s.inline_bytes.data() + p.inl_off),
             static_cast<uint32_t>(p.inl_len), 0});
      }
    } else {
      s.linked_sges.insert(s.linked_sges.end(), s.sges.begin() + static_cast<long>(p.sge_off),
                           s.sges.begin() + static_cast<long>(p.sge_off + p.sge_cnt));
    }
    w.num_sge = static_cast<int>(s.linked_sges.size() - first);
    w.sg_list = w.num_sge ? s.linked_sges.data() + first : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  err = q.p->post_send(s.linked.data(), &bad).error();
  wr_abort(x);
  return err;
}

void destroy_state(Qp* q) {
  delete q->ex;
  q->ex = nullptr;
}

}  // namespace

ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  if (!context || !attr) return fail<ibv_qp>(EINVAL);
  const uint32_t mask = attr->comp_mask;
  if (mask & ~kKnownQpCompMask) return fail<ibv_qp>(EINVAL);
  // RSS (indirection tables, hashing): not offered.
  if (mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH))
    return fail<ibv_qp>(EOPNOTSUPP);
  // ibv_create_qp_ex(3): an XRC target (XRC_RECV) is created in an XRC domain, without a PD;
  // every other type needs a PD. An XRC domain given to another type is EINVAL.
  if (attr->qp_type == IBV_QPT_XRC_RECV) {
    if (!(mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd) return fail<ibv_qp>(EINVAL);
    if (!same_device(attr->xrcd->context, context)) return fail<ibv_qp>(EINVAL);
    if (mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) return fail<ibv_qp>(EINVAL);  // no send queue
    return create_xrc_target(context, attr);
  }
  if (mask & IBV_QP_INIT_ATTR_XRCD) return fail<ibv_qp>(EINVAL);
  if (!(mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) return fail<ibv_qp>(EINVAL);
  if (!same_device(attr->pd->context, context)) return fail<ibv_qp>(EINVAL);
  // Creation flags other than blocking a UD QP's own multicast loopback: not offered.
  const uint32_t create_flags = (mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) ? attr->create_flags : 0;
  if (create_flags & ~uint32_t{IBV_QP_CREATE_BLOCK_SELF_MCAST_LB}) return fail<ibv_qp>(EOPNOTSUPP);
  if (create_flags != 0 && attr->qp_type != IBV_QPT_UD) return fail<ibv_qp>(EOPNOTSUPP);
  if ((mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr->max_tso_header)
    return fail<ibv_qp>(EOPNOTSUPP);
  uint64_t ops = 0;
  if (mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
    ops = attr->send_ops_flags;
    uint64_t supported = 0;
    for (const OpFlag& f : kOpFlags) {
      const provider::SendOpcodeInfo* info = provider::send_opcode_info(f.opcode);
      if (info && allowed_on(*info, attr->qp_type)) supported |= f.flag;
    }
    // TSO, and operations the QP type cannot carry (e.g. RDMA on UD, ATOMIC WRITE on UC).
    if (ops & ~supported) return fail<ibv_qp>(EOPNOTSUPP);
  }
  // ibv_qp_init_attr_ex begins with ibv_qp_init_attr's fields, in order.
  static_assert(offsetof(ibv_qp_init_attr_ex, sq_sig_all) == offsetof(ibv_qp_init_attr, sq_sig_all));
  Qp* q = create_qp_common(attr->pd, reinterpret_cast<ibv_qp_init_attr*>(attr), create_flags);
  if (!q) return nullptr;
  if (!(mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) return &q->qp;
  q->ex = new QpExState{};
  q->ex->send_ops_flags = ops;
  q->destroy_ex = destroy_state;
  ibv_qp_ex& x = q->qp_ex;
  x.comp_mask = 0;
  x.wr_id = 0;
  x.wr_flags = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_unsupported_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  q->has_qp_ex = true;
  return &q->qp;
}

}  // namespace urdma::verbs

extern "C" ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  urdma::verbs::Qp* q = urdma::verbs::Qp::from(qp);
  return q->has_qp_ex ? &q->qp_ex : nullptr;
}
