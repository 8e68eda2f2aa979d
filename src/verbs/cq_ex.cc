// The extended CQ API: ibv_create_cq_ex and the ibv_cq_ex polling interface
// (ibv_start_poll / ibv_next_poll / ibv_end_poll and the ibv_wc_read_* accessors).
//
// Design
// * An extended CQ is an ordinary Cq (create_cq_common: the same provider CQ, channel and
//   ownership), so ibv_cq_ex_to_cq(), ibv_poll_cq, ibv_req_notify_cq, ibv_get_cq_event and
//   ibv_destroy_cq work on it unchanged. Its ibv_cq_ex function pointers are filled here.
// * The polling interface takes ONE completion at a time out of the provider CQ into
//   CqExState::cur; the read_* accessors read that record. Nothing is read ahead, so a
//   completion not reached by next_poll stays in the CQ for the next start_poll or ibv_poll_cq
//   (ibv_create_cq_ex(3): end_poll leaves the rest where it is).
// * start_poll takes the CQ's poll lock and end_poll releases it (as rdma-core's providers do
//   unless IBV_CREATE_CQ_ATTR_SINGLE_THREADED): `cur` belongs to the thread between the two.
//   A start_poll that finds nothing returns ENOENT and holds no lock (end_poll must not follow).
// * An empty CQ drives the engine once on the polling thread (try_progress), as op_poll_cq does.
// * wc_flags: the standard fields (IBV_WC_STANDARD_FLAGS) and the completion timestamps
//   (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: the device clock, 1 tick = 1 ns;
//   IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: CLOCK_REALTIME ns), stamped by the provider
//   CQ when the engine generates the completion (provider/cq.h, completion_clock.h), and the
//   tag-matching information of a TM-SRQ's completions (IBV_WC_EX_WITH_TM_INFO,
//   ibv_wc_read_tm_info: the TMH's tag and user data, provider/cq.h TmInfo; zero on other
//   completions and on those that matched no tag). CVLAN and flow tags are not produced:
//   asking for them is EOPNOTSUPP (ibv_create_cq_ex(3)).
// * IBV_CQ_INIT_ATTR_MASK_PD names a parent domain (ibv_alloc_parent_domain(3); any other PD is
//   EINVAL, as in mlx5): the CQ's ring comes from its allocators (domain.cc).
#include <cerrno>
#include <mutex>
#include <utility>

#include "verbs/internal.h"

namespace urdma::verbs {

struct CqExState {
  std::mutex poll_lock;  // held from a successful start_poll to end_poll
  provider::Completion cur{};  // the completion the read_* accessors describe
  uint64_t wc_flags = 0;
};

namespace {

constexpr uint64_t kSupportedWcFlags =
    uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
    uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
constexpr uint32_t kKnownCompMask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
// SINGLE_THREADED is a hint (the lock stays); IGNORE_OVERRUN changes semantics we don't offer.
constexpr uint32_t kSupportedCreateFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;

CqExState& state(ibv_cq_ex* cq) { return *Cq::from(cq)->ex; }

// One completion into `cur`, driving the engine once when the CQ is empty. false if none.
bool take_one(ibv_cq_ex* cq) {
  Cq* c = Cq::from(cq);
  CqExState& s = *c->ex;
  int n = c->p->poll(1, &s.cur);
  if (n == 0 && c->ctx->rt->runtime().try_progress()) n = c->p->poll(1, &s.cur);
  if (n == 0) return false;
  cq->status = s.cur.wc.status;
  cq->wr_id = s.cur.wc.wr_id;
  return true;
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask != 0) return EINVAL;  // no poll attributes are defined
  CqExState& s = state(cq);
  s.poll_lock.lock();
  if (!take_one(cq)) {
    s.poll_lock.unlock();
    return ENOENT;
  }
  return 0;
}

int next_poll(ibv_cq_ex* cq) { return take_one(cq) ? 0 : ENOENT; }

void end_poll(ibv_cq_ex* cq) { state(cq).poll_lock.unlock(); }

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) { return state(cq).cur.wc.opcode; }
// A tag-matching completion's vendor_err, src_qp, slid and pkey_index hold its TmInfo
// (provider/cq.h): they read as zero, as on any RC completion.
uint32_t read_vendor_err(ibv_cq_ex* cq) {
  const ibv_wc& wc = state(cq).cur.wc;
  return provider::is_tm_opcode(wc.opcode) ? 0 : wc.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* cq) { return state(cq).cur.wc.byte_len; }
// IBV_WC_WITH_INV completions carry the invalidated rkey in the same field (ibv_wc's union).
__be32 read_imm_data(ibv_cq_ex* cq) { return state(cq).cur.wc.imm_data; }
uint32_t read_qp_num(ibv_cq_ex* cq) { return state(cq).cur.wc.qp_num; }
uint32_t read_src_qp(ibv_cq_ex* cq) {
  const ibv_wc& wc = state(cq).cur.wc;
  return provider::is_tm_opcode(wc.opcode) ? 0 : wc.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* cq) { return state(cq).cur.wc.wc_flags; }
uint32_t read_slid(ibv_cq_ex* cq) {
  const ibv_wc& wc = state(cq).cur.wc;
  return provider::is_tm_opcode(wc.opcode) ? 0 : wc.slid;
}
void read_tm_info(ibv_cq_ex* cq, ibv_wc_tm_info* info) {
  const provider::TmInfo tm = provider::tm_info(state(cq).cur.wc);
  info->tag = tm.tag;
  info->priv = tm.priv;
}
uint8_t read_sl(ibv_cq_ex* cq) { return state(cq).cur.wc.sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* cq) { return state(cq).cur.wc.dlid_path_bits; }
uint64_t read_completion_ts(ibv_cq_ex* cq) { return state(cq).cur.completion_ts; }
uint64_t read_completion_wallclock_ns(ibv_cq_ex* cq) { return state(cq).cur.wallclock_ns; }

void destroy_state(Cq* c) {
  delete c->ex;
  c->ex = nullptr;
}

}  // namespace

ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (!context || !attr) return fail<ibv_cq_ex>(EINVAL);
  if (attr->comp_mask & ~kKnownCompMask) return fail<ibv_cq_ex>(EINVAL);
  if (attr->wc_flags & ~kSupportedWcFlags) return fail<ibv_cq_ex>(EOPNOTSUPP);
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~kSupportedCreateFlags))
    return fail<ibv_cq_ex>(EOPNOTSUPP);
  provider::CqOptions options;
  options.completion_timestamp = attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  options.wallclock_timestamp = attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    // A parent domain of this context is the only PD a CQ may name.
    ibv_pd* pd = attr->parent_domain;
    if (!pd || !same_device(pd->context, context) || !Pd::from(pd)->domain) return fail<ibv_cq_ex>(EINVAL);
    options.allocator = queue_allocator(pd);
  }
  if (attr->cqe > static_cast<uint32_t>(INT32_MAX) || attr->comp_vector > INT32_MAX)
    return fail<ibv_cq_ex>(EINVAL);
  Cq* c = create_cq_common(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                           static_cast<int>(attr->comp_vector), std::move(options));
  if (!c) return nullptr;
  c->ex = new CqExState{};
  c->ex->wc_flags = attr->wc_flags;
  c->destroy_ex = destroy_state;
  ibv_cq_ex& x = c->cq_ex;
  x.comp_mask = 0;
  x.start_poll = start_poll;
  x.next_poll = next_poll;
  x.end_poll = end_poll;
  x.read_opcode = read_opcode;
  x.read_vendor_err = read_vendor_err;
  // Every accessor is filled, also those for fields not asked for in wc_flags (ibv_create_cq_ex(3)
  // says not to call them; a program that does reads the field instead of a null pointer).
  x.read_byte_len = read_byte_len;
  x.read_imm_data = read_imm_data;
  x.read_qp_num = read_qp_num;
  x.read_src_qp = read_src_qp;
  x.read_wc_flags = read_wc_flags;
  x.read_slid = read_slid;
  x.read_sl = read_sl;
  x.read_dlid_path_bits = read_dlid_path_bits;
  x.read_completion_ts = read_completion_ts;
  x.read_completion_wallclock_ns = read_completion_wallclock_ns;
  x.read_tm_info = read_tm_info;
  return &c->cq_ex;
}

}  // namespace urdma::verbs
