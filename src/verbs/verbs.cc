// The object verbs: PD, MR, MW, CQ and completion channels, SRQ, QP, AH, and the data path
// (post_send / post_recv / post_srq_recv / poll_cq / req_notify_cq) reached through
// ibv_context.ops by verbs.h's inline functions.
//
// Conventions (rdma-core, the man pages): int verbs return 0 or the errno; pointer verbs set
// errno and return NULL; a failed post names the first WR not posted in *bad_wr. Every verb
// validates its arguments before the provider sees them; the provider's Status is already
// rdma-core's errno (provider/status.h).
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "provider/completion_clock.h"
#include "provider/limits.h"
#include "verbs/internal.h"
#include "verbs/process.h"

// verbs.h defines these names as macros over inline helpers; the library defines the symbols.
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

namespace urdma::verbs {

// Every wrapper a context handed out and the application has not destroyed, with how to free it.
struct LiveObjects {
  std::mutex mutex;
  std::unordered_map<void*, void (*)(void*)> objects;
};

namespace {

void init_sync(pthread_mutex_t* m, pthread_cond_t* cv) {
  pthread_mutex_init(m, nullptr);
  pthread_cond_init(cv, nullptr);
}
// Waits until every async event reported for an object was acknowledged (ibv_destroy_qp(3): an
// event must be acknowledged before its object is destroyed; destroy waits for it).
void wait_for_acks(pthread_mutex_t* m, pthread_cond_t* cv, const uint32_t* completed,
                   const uint32_t* reported) {
  pthread_mutex_lock(m);
  while (*completed != *reported) pthread_cond_wait(cv, m);
  pthread_mutex_unlock(m);
}

void destroy_sync(pthread_mutex_t* m, pthread_cond_t* cv) {
  pthread_cond_destroy(cv);
  pthread_mutex_destroy(m);
}

// Frees a wrapper whose provider object is gone (a closed context's leftovers).
template <class W>
void free_wrapper(void* p) {
  W* w = static_cast<W*>(p);
  if constexpr (std::is_same_v<W, Cq>) {
    // Detached already (release_channels): the channel can go now.
    if (w->channel) __atomic_sub_fetch(&w->channel->channel.refcnt, 1, __ATOMIC_SEQ_CST);
    if (w->destroy_ex) w->destroy_ex(w);
    destroy_sync(&w->cq.mutex, &w->cq.cond);
  } else if constexpr (std::is_same_v<W, Qp>) {
    if (w->destroy_ex) w->destroy_ex(w);
    destroy_sync(&w->qp.mutex, &w->qp.cond);
  } else if constexpr (std::is_same_v<W, Srq>) {
    destroy_sync(&w->srq.mutex, &w->srq.cond);
  } else if constexpr (std::is_same_v<W, Pd>) {
    if (w->domain) free_parent_domain(w);
  }
  delete w;
}

template <class W>
void remember(Context* c, W* w) {
  std::lock_guard lock(c->live->mutex);
  c->live->objects.emplace(w, &free_wrapper<W>);
}

void forget(Context* c, void* w) {
  std::lock_guard lock(c->live->mutex);
  c->live->objects.erase(w);
}

// ---- the data path (ibv_context.ops) ----

int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  ibv_send_wr* dummy = nullptr;
  return Qp::from(qp)->p->post_send(wr, bad_wr ? bad_wr : &dummy).error();
}

int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  ibv_recv_wr* dummy = nullptr;
  return Qp::from(qp)->p->post_recv(wr, bad_wr ? bad_wr : &dummy).error();
}

int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  ibv_recv_wr* dummy = nullptr;
  return Srq::from(srq)->p->post_recv(wr, bad_wr ? bad_wr : &dummy).error();
}

int op_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  if (num_entries < 0) return -1;  // ibv_poll_cq(3): negative on failure
  if (num_entries == 0) return 0;
  Cq* c = Cq::from(cq);
  int n = c->p->poll(num_entries, wc);
  // Whoever polls drives the engine (DESIGN.md): an empty CQ runs one engine turn here, unless
  // the engine thread is in one already, and looks again.
  if (n == 0 && c->ctx->rt->runtime().try_progress()) n = c->p->poll(num_entries, wc);
  return n;
}

int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  Cq* c = Cq::from(cq);
  c->ctx->rt->runtime().req_notify(*c->p, solicited_only != 0);
  return 0;
}

ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  if (!pd) return fail<ibv_mw>(EINVAL);
  Pd* p = Pd::from(pd);
  provider::Result<provider::Mw*> r = p->ctx->rt->alloc_mw(p->p, type);
  if (!r.ok()) return fail<ibv_mw>(r.error());
  auto* w = new Mw{};
  w->p = r.value();
  w->ctx = p->ctx;
  w->mw.context = pd->context;
  w->mw.pd = pd;
  w->mw.rkey = w->p->rkey();
  w->mw.handle = w->p->handle();
  w->mw.type = type;
  w->p->user_context = &w->mw;
  remember(w->ctx, w);
  return &w->mw;
}

int op_dealloc_mw(ibv_mw* mw) {
  Mw* w = Mw::from(mw);
  provider::Status s = w->ctx->rt->dealloc_mw(w->p);
  if (!s.ok()) return s.error();
  forget(w->ctx, w);
  delete w;
  return 0;
}

int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  if (!qp || !mw || !bind) return EINVAL;
  Mw* w = Mw::from(mw);
  Qp* q = Qp::from(qp);
  if (w->ctx->shared != q->ctx->shared) return EINVAL;
  uint32_t new_rkey = 0;
  provider::Status s = q->p->bind_mw(w->p, *bind, &new_rkey);
  if (!s.ok()) return s.error();
  mw->rkey = new_rkey;  // ibv_bind_mw(3): the window's rkey once the bind completes
  return 0;
}

// ---- device memory (ibv_alloc_dm(3); provider/device_memory.h) ----

int dm_memcpy_to(ibv_dm* dm, uint64_t dm_offset, const void* host_addr, size_t length) {
  return Dm::from(dm)->p->copy_to(dm_offset, host_addr, length).error();
}

int dm_memcpy_from(void* host_addr, ibv_dm* dm, uint64_t dm_offset, size_t length) {
  return Dm::from(dm)->p->copy_from(host_addr, dm_offset, length).error();
}

ibv_dm* op_alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  if (!context || !attr) return fail<ibv_dm>(EINVAL);
  // mlx5_alloc_dm: no comp_mask bit is defined for the request.
  if (attr->comp_mask != 0) return fail<ibv_dm>(EINVAL);
  Context* c = Context::from(context);
  provider::Result<provider::Dm*> r = c->rt->alloc_dm(attr->length, attr->log_align_req);
  if (!r.ok()) return fail<ibv_dm>(r.error());
  auto* w = new Dm{};
  w->p = r.value();
  w->ctx = c;
  w->dm.context = context;
  w->dm.memcpy_to_dm = dm_memcpy_to;
  w->dm.memcpy_from_dm = dm_memcpy_from;
  w->dm.comp_mask = IBV_DM_MASK_HANDLE;
  w->dm.handle = w->p->handle();
  w->p->user_context = &w->dm;
  remember(c, w);
  return &w->dm;
}

int op_free_dm(ibv_dm* dm) {
  if (!dm) return EINVAL;
  Dm* w = Dm::from(dm);
  provider::Status s = w->ctx->rt->free_dm(w->p);
  if (!s.ok()) return s.error();
  forget(w->ctx, w);
  delete w;
  return 0;
}

ibv_mr* op_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length,
                     unsigned int access) {
  if (!pd || !dm) return fail<ibv_mr>(EINVAL);
  Pd* p = Pd::from(pd);
  Dm* d = Dm::from(dm);
  if (d->ctx->shared != p->ctx->shared) return fail<ibv_mr>(EINVAL);
  const int acc = static_cast<int>(access) & ~IBV_ACCESS_OPTIONAL_RANGE;
  provider::Result<provider::Mr*> r = p->ctx->rt->reg_dm_mr(p->p, d->p, dm_offset, length, acc);
  if (!r.ok()) return fail<ibv_mr>(r.error());
  auto* w = new Mr{};
  w->p = r.value();
  w->ctx = p->ctx;
  w->mr.context = pd->context;
  w->mr.pd = pd;
  w->mr.addr = nullptr;  // zero based: the DM's address is the device's (ibv_cmd_reg_dm_mr)
  w->mr.length = length;
  w->mr.handle = w->p->handle();
  w->mr.lkey = w->p->lkey();
  w->mr.rkey = w->p->rkey();
  w->p->user_context = &w->mr;
  remember(w->ctx, w);
  return &w->mr;
}

// ---- the extended context ops ----

int op_query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input,
                       ibv_device_attr_ex* attr, size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  full.orig_attr = Context::from(context)->dev().attr();
  // The kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE (uapi ib_user_verbs.h, 1 << 40; not in this
  // rdma-core's headers): IBA 1.5 ATOMIC WRITE on RC, as rxe offers it.
  constexpr uint64_t kDeviceAtomicWrite = uint64_t{1} << 40;
  full.device_cap_flags_ex =
      static_cast<uint64_t>(full.orig_attr.device_cap_flags) | kDeviceAtomicWrite;
  full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
  // On-demand paging: every MR is (the engine touches registered memory from inside the
  // process, where the CPU faults pages in), on every transport and operation; and implicit
  // ODP (address 0, SIZE_MAX bytes) where the kernel can fault a range in on request: every
  // access through such an MR is checked page by page first, so an address the process has
  // not mapped is a remote access error, not a crash (provider/mr_table.h). No TSO, RSS,
  // packet pacing or CQ moderation: zeros.
  full.odp_caps.general_caps = IBV_ODP_SUPPORT;
  // Completion timestamps: a 64-bit counter of the device clock at 1 GHz (one tick = 1 ns;
  // provider/completion_clock.h).
  full.completion_timestamp_mask = provider::kDeviceClockMask;
  full.hca_core_clock = provider::kDeviceClockKhz;
  if (provider::implicit_odp_supported()) full.odp_caps.general_caps |= IBV_ODP_SUPPORT_IMPLICIT;
  full.max_dm_size = provider::kMaxDmBytes;
  // Tag matching on RC (IBV_SRQT_TM, provider/srq.h).
  full.tm_caps.max_rndv_hdr_size = provider::kTmMaxRndvHdrBytes;
  full.tm_caps.max_num_tags = provider::kTmMaxNumTags;
  full.tm_caps.flags = IBV_TM_CAP_RC;
  full.tm_caps.max_ops = provider::kTmMaxOps;
  full.tm_caps.max_sge = provider::kTmMaxSge;
  full.odp_caps.per_transport_caps.rc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
      IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
      IBV_ODP_SUPPORT_SRQ_RECV;
  full.odp_caps.per_transport_caps.ud_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  // XRC is RC with an XRCETH: the same operations on the same memory.
  full.xrc_odp_caps = full.odp_caps.per_transport_caps.rc_odp_caps;
  std::memcpy(attr, &full, std::min(attr_size, sizeof full));
  if (attr_size > sizeof full)
    std::memset(reinterpret_cast<char*>(attr) + sizeof full, 0, attr_size - sizeof full);
  return 0;
}

// ibv_query_rt_values_ex(3): the device clock now (IBV_VALUES_MASK_RAW_CLOCK), the counter
// completion timestamps read (provider/completion_clock.h), as a timespec of its nanoseconds.
// comp_mask in names what is asked, out what is given.
int op_query_rt_values(ibv_context* context, ibv_values_ex* values) {
  if (!context || !values) return EINVAL;
  if (values->comp_mask & ~uint32_t{IBV_VALUES_MASK_RAW_CLOCK}) return EINVAL;
  uint32_t given = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    const uint64_t ns = provider::completion_clock_ns();
    values->raw_clock.tv_sec = static_cast<time_t>(ns / 1'000'000'000u);
    values->raw_clock.tv_nsec = static_cast<long>(ns % 1'000'000'000u);
    given |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = given;
  return 0;
}

// ibv_advise_mr(3). The engine reads and writes registered memory from inside the process, so
// every MR is "on demand": a page the device touches is faulted in by the CPU then, never
// pinned. A prefetch makes the range's pages present now (madvise MADV_POPULATE_READ/_WRITE)
// so the first access does not fault; NO_FAULT has nothing to do (a present page is already
// the device's). Done before the call returns, with or without IBV_ADVISE_MR_FLAG_FLUSH.
int op_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list,
                 uint32_t num_sge) {
  if (!pd || (flags & ~uint32_t{IBV_ADVISE_MR_FLAG_FLUSH}) != 0) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (num_sge == 0 || !sg_list) return EINVAL;
  Pd* p = Pd::from(pd);
  const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  std::vector<std::span<uint8_t>> ranges;
  provider::Status s = p->ctx->dev().mr_table().advise_ranges(
      p->p, write, std::span<const ibv_sge>(sg_list, num_sge), &ranges);
  if (!s.ok()) return s.error();
  if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const std::span<uint8_t> r : ranges) {
    if (r.empty()) continue;
    const uintptr_t first = reinterpret_cast<uintptr_t>(r.data()) & ~(page - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(r.data()) + r.size();
    if (madvise(reinterpret_cast<void*>(first), end - first,
                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
      continue;
    // A kernel before 5.14 knows no MADV_POPULATE_*: the prefetch is best effort (the man
    // page), so a hint it is. Memory outside the process's mappings is EFAULT.
    if (errno == EINVAL) {
      (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_WILLNEED);
      continue;
    }
    return errno == ENOMEM || errno == EFAULT ? EFAULT : errno;
  }
  return 0;
}

int op_query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t size) {
  return query_port(context, port_num, attr, size);
}

}  // namespace

// ---- SRQ ----

ibv_srq* create_srq_common(ibv_pd* pd, ibv_srq_attr& attr, void* srq_context,
                           provider::Xrcd* xrcd, provider::Cq* cq,
                           std::optional<provider::SrqTmAttr> tm) {
  Pd* p = Pd::from(pd);
  provider::Result<provider::Srq*> r =
      p->ctx->rt->create_srq(p->p, attr, queue_allocator(pd), xrcd, cq, tm);
  if (!r.ok()) return fail<ibv_srq>(r.error());
  auto* w = new Srq{};
  w->p = r.value();
  w->ctx = p->ctx;
  w->srq.context = pd->context;
  w->srq.srq_context = srq_context;
  w->srq.pd = pd;
  w->srq.handle = w->p->handle();
  init_sync(&w->srq.mutex, &w->srq.cond);
  w->p->user_context = &w->srq;
  // ibv_create_srq(3): attr.max_wr and max_sge come back as created (at least as requested).
  const ibv_srq_attr got = w->p->query();
  attr.max_wr = got.max_wr;
  attr.max_sge = got.max_sge;
  remember(w->ctx, w);
  return &w->srq;
}

namespace {

// ibv_post_srq_ops(3): list operations of a tag-matching SRQ (EOPNOTSUPP on a basic one).
int op_post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad_wr) {
  if (!srq) return EINVAL;
  ibv_ops_wr* dummy = nullptr;
  return Srq::from(srq)->p->post_ops(wr, bad_wr ? bad_wr : &dummy).error();
}

}  // namespace

void remember_object(Context* c, void* w, void (*free_fn)(void*)) {
  std::lock_guard lock(c->live->mutex);
  c->live->objects.emplace(w, free_fn);
}
void forget_object(Context* c, void* w) { forget(c, w); }
void remember_pd(Context* c, Pd* w) { remember(c, w); }

int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_size) {
  if (!context || !attr) return EINVAL;
  ibv_port_attr full{};
  provider::Status s = Context::from(context)->dev().query_port(port_num, &full);
  if (!s.ok()) return s.error();
  std::memcpy(attr, &full, std::min(attr_size, sizeof full));
  if (attr_size > sizeof full)
    std::memset(reinterpret_cast<char*>(attr) + sizeof full, 0, attr_size - sizeof full);
  return 0;
}

void fill_context(Context& c, ibv_device* device, int async_fd, int cmd_fd) {
  ibv_context& ctx = c.vctx.context;
  ctx.device = device;
  ctx.ops.poll_cq = op_poll_cq;
  ctx.ops.req_notify_cq = op_req_notify_cq;
  ctx.ops.post_send = op_post_send;
  ctx.ops.post_recv = op_post_recv;
  ctx.ops.post_srq_recv = op_post_srq_recv;
  ctx.ops.alloc_mw = op_alloc_mw;
  ctx.ops.dealloc_mw = op_dealloc_mw;
  ctx.ops.bind_mw = op_bind_mw;
  // No kernel uverbs file is behind urdma, but programs treat cmd_fd as a real descriptor: the
  // context owns its device context's command fd (a memfd, device.cc), closed with it; a copy
  // of it names that device context to ibv_import_device. Any ioctl on it fails (ENOTTY).
  ctx.cmd_fd = cmd_fd;
  ctx.async_fd = async_fd;
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  // Extended ops; those left null make verbs.h's inlines fail with EOPNOTSUPP (WQ/RSS, flows,
  // counters, open_qp).
  c.vctx.sz = sizeof(verbs_context);
  c.vctx.query_port = op_query_port;
  c.vctx.query_device_ex = op_query_device_ex;
  c.vctx.advise_mr = op_advise_mr;
  c.vctx.alloc_dm = op_alloc_dm;
  c.vctx.free_dm = op_free_dm;
  c.vctx.reg_dm_mr = op_reg_dm_mr;
  c.vctx.create_cq_ex = create_cq_ex;
  c.vctx.create_qp_ex = create_qp_ex;
  fill_xrc_ops(c.vctx);  // create_srq_ex among them
  c.vctx.post_srq_ops = op_post_srq_ops;
  c.vctx.query_rt_values = op_query_rt_values;
  fill_domain_ops(c.vctx);
}

void init_live_objects(Context& c) { c.live = new LiveObjects; }

void release_channels(Context& c) {
  std::lock_guard lock(c.live->mutex);
  for (auto& [object, free_fn] : c.live->objects) {
    if (free_fn != &free_wrapper<Cq>) continue;
    Cq* cq = static_cast<Cq*>(object);
    if (cq->channel) cq->channel->impl->detach(*cq->p);
  }
}

void release_parent_domains(Context& c) {
  std::lock_guard lock(c.live->mutex);
  for (auto& [object, free_fn] : c.live->objects) {
    if (free_fn != &free_wrapper<Pd>) continue;
    Pd* pd = static_cast<Pd*>(object);
    if (pd->domain) pd->p->remove_user();
  }
}

void free_live_objects(Context& c) {
  std::unordered_map<void*, void (*)(void*)> left;
  {
    std::lock_guard lock(c.live->mutex);
    left.swap(c.live->objects);
  }
  for (auto& [object, free_fn] : left) free_fn(object);
  delete c.live;
  c.live = nullptr;
}

// ---- CQ ----

Cq* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector, provider::CqOptions options) {
  if (!context) return fail<Cq>(EINVAL);
  if (comp_vector < 0 || comp_vector >= context->num_comp_vectors) return fail<Cq>(EINVAL);
  if (channel && !same_device(channel->context, context)) return fail<Cq>(EINVAL);
  Context* c = Context::from(context);
  provider::Result<provider::Cq*> r = c->rt->create_cq(cqe, std::move(options));
  if (!r.ok()) return fail<Cq>(r.error());
  auto* w = new Cq{};
  w->p = r.value();
  w->ctx = c;
  w->cq.context = context;
  w->cq.channel = channel;
  w->cq.cq_context = cq_context;
  w->cq.handle = w->p->handle();
  w->cq.cqe = static_cast<int>(w->p->cqe());
  init_sync(&w->cq.mutex, &w->cq.cond);
  w->p->user_context = &w->cq;
  if (channel) {
    w->channel = CompChannel::from(channel);
    w->channel->impl->attach(*w->p);
    // The channel's count of CQs, atomic: it never needs its context (which may be closed
    // before the channel is destroyed).
    __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
  }
  remember(c, w);
  return w;
}

}  // namespace urdma::verbs

using namespace urdma;
using verbs::fail;

extern "C" {

// ---- PD ----

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!context) return fail<ibv_pd>(EINVAL);
  verbs::Context* c = verbs::Context::from(context);
  provider::Result<provider::Pd*> r = c->rt->alloc_pd();
  if (!r.ok()) return fail<ibv_pd>(r.error());
  auto* w = new verbs::Pd{};
  w->p = r.value();
  w->ctx = c;
  w->pd.context = context;
  w->pd.handle = w->p->handle();
  w->p->user_context = &w->pd;
  verbs::remember(c, w);
  return &w->pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  verbs::Pd* w = verbs::Pd::from(pd);
  if (w->domain) return verbs::dealloc_parent_domain(w);
  provider::Status s = w->ctx->rt->dealloc_pd(w->p);
  if (!s.ok()) return s.error();
  verbs::forget(w->ctx, w);
  delete w;
  return 0;
}

// ---- MR ----

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                         unsigned int access) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  // ibv_reg_mr(3): optional access flags a device does not support are ignored.
  const int acc = static_cast<int>(access) & ~IBV_ACCESS_OPTIONAL_RANGE;
  verbs::Pd* p = verbs::Pd::from(pd);
  provider::Result<provider::Mr*> r = p->ctx->rt->reg_mr(p->p, addr, length, iova, acc);
  if (!r.ok()) return fail<ibv_mr>(r.error());
  auto* w = new verbs::Mr{};
  w->p = r.value();
  w->ctx = p->ctx;
  w->mr.context = pd->context;
  w->mr.pd = pd;
  w->mr.addr = addr;
  w->mr.length = length;
  w->mr.handle = w->p->handle();
  w->mr.lkey = w->p->lkey();
  w->mr.rkey = w->p->rkey();
  w->p->user_context = &w->mr;
  verbs::remember(w->ctx, w);
  return &w->mr;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  return fail<ibv_mr>(EOPNOTSUPP);  // no device memory behind a software device
}

int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  // ibv_rereg_mr(3): 0, or an ibv_rereg_mr_err_code with errno saying why.
  if (!mr || flags <= 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  // rdma-core's own input checks: a new translation needs an address and a length, and
  // access flags only come with IBV_REREG_MR_CHANGE_ACCESS.
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  verbs::Mr* w = verbs::Mr::from(mr);
  verbs::Pd* new_pd = nullptr;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    if (!pd || !verbs::same_device(pd->context, mr->context)) {
      errno = EINVAL;
      return IBV_REREG_MR_ERR_INPUT;
    }
    new_pd = verbs::Pd::from(pd);
  }
  const int acc = access & ~IBV_ACCESS_OPTIONAL_RANGE;
  provider::Status s = w->ctx->dev().rereg_mr(w->p, flags, new_pd ? new_pd->p : nullptr, addr,
                                              length, reinterpret_cast<uintptr_t>(addr), acc);
  if (!s.ok()) {
    errno = s.error();
    return IBV_REREG_MR_ERR_CMD;
  }
  if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->addr = addr;
    mr->length = length;
  }
  mr->lkey = w->p->lkey();
  mr->rkey = w->p->rkey();
  return 0;
}

int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  verbs::Mr* w = verbs::Mr::from(mr);
  provider::Status s = w->ctx->rt->dereg_mr(w->p);
  if (!s.ok()) return s.error();
  verbs::forget(w->ctx, w);
  delete w;
  return 0;
}

// ---- completion channels ----

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!context) return fail<ibv_comp_channel>(EINVAL);
  auto* ch = new verbs::CompChannel{};
  ch->impl =
      new runtime::CompletionChannel(verbs::Context::from(context)->rt->runtime().event_waiter());
  ch->channel.context = context;
  ch->channel.fd = ch->impl->fd();
  ch->channel.refcnt = 0;
  return &ch->channel;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return EINVAL;
  if (__atomic_load_n(&channel->refcnt, __ATOMIC_SEQ_CST) != 0)
    return EBUSY;  // CQs still use it (rdma-core's rule)
  verbs::CompChannel* ch = verbs::CompChannel::from(channel);
  delete ch->impl;
  delete ch;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) {
    errno = EINVAL;
    return -1;
  }
  provider::Result<provider::Cq*> r = verbs::CompChannel::from(channel)->impl->get_event();
  if (!r.ok()) {
    errno = r.error();
    return -1;  // ibv_get_cq_event(3): -1 on error (EAGAIN on a non-blocking fd)
  }
  auto* c = static_cast<ibv_cq*>(r.value()->user_context);
  *cq = c;
  *cq_context = c->cq_context;
  return 0;
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq) return;
  verbs::Cq* w = verbs::Cq::from(cq);
  if (w->channel) w->channel->impl->ack_events(*w->p, nevents);
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- CQ ----

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  verbs::Cq* w = verbs::create_cq_common(context, cqe, cq_context, channel, comp_vector);
  return w ? &w->cq : nullptr;
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq) return EINVAL;
  if (cqe < 1) return EINVAL;
  verbs::Cq* w = verbs::Cq::from(cq);
  // ibv_resize_cq(3): EINVAL below the entries the CQ holds. A kernel device (rxe) executes a
  // post before it returns, so a UD send posted before the resize has its completion in the CQ
  // by then; one engine turn on this thread makes that true here too before the count.
  w->ctx->rt->runtime().progress_now();
  provider::Status s = w->p->resize(static_cast<uint32_t>(cqe));
  if (!s.ok()) return s.error();
  cq->cqe = static_cast<int>(w->p->cqe());
  return 0;
}

int ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return EINVAL;
  verbs::Cq* w = verbs::Cq::from(cq);
  // A CQ with QPs is busy; checked before the channel lets go of it.
  if (w->p->users() != 0) return EBUSY;
  if (w->channel) w->channel->impl->detach(*w->p);
  provider::Status s = w->ctx->rt->destroy_cq(w->p);
  if (!s.ok()) {
    if (w->channel) w->channel->impl->attach(*w->p);
    return s.error();
  }
  if (w->channel) __atomic_sub_fetch(&w->channel->channel.refcnt, 1, __ATOMIC_SEQ_CST);
  verbs::wait_for_acks(&cq->mutex, &cq->cond, &cq->async_events_completed, &w->events_reported);
  verbs::forget(w->ctx, w);
  if (w->destroy_ex) w->destroy_ex(w);
  verbs::destroy_sync(&cq->mutex, &cq->cond);
  delete w;
  return 0;
}

// ---- SRQ ----

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
  if (!pd || !init) return fail<ibv_srq>(EINVAL);
  return verbs::create_srq_common(pd, init->attr, init->srq_context, nullptr, nullptr,
                                   std::nullopt);
}

}  // extern "C"

namespace urdma::verbs {

ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  if (!context || !attr) return fail<ibv_srq>(EINVAL);
  constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                              IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                              IBV_SRQ_INIT_ATTR_TM;
  const uint32_t mask = attr->comp_mask;
  if (mask & ~kKnown) return fail<ibv_srq>(EINVAL);
  const ibv_srq_type type = (mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM)
    return fail<ibv_srq>(EINVAL);
  // ibv_create_srq_ex(3): every SRQ is on a PD; an XRC SRQ also names its XRC domain and the CQ
  // its completions go to; a tag-matching one its CQ and tm_cap (EINVAL without them or beyond
  // tm_caps). A basic SRQ ignores the CQ and TM bits, as mlx5 does.
  if (!(mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) return fail<ibv_srq>(EINVAL);
  if (!same_device(attr->pd->context, context)) return fail<ibv_srq>(EINVAL);
  if (type == IBV_SRQT_BASIC)
    return create_srq_common(attr->pd, attr->attr, attr->srq_context, nullptr, nullptr,
                             std::nullopt);
  if (!(mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq || !same_device(attr->cq->context, context))
    return fail<ibv_srq>(EINVAL);
  if (type == IBV_SRQT_TM) {
    if (!(mask & IBV_SRQ_INIT_ATTR_TM)) return fail<ibv_srq>(EINVAL);
    return create_srq_common(attr->pd, attr->attr, attr->srq_context, nullptr, nullptr,
                             provider::SrqTmAttr{.max_num_tags = attr->tm_cap.max_num_tags,
                                                 .max_ops = attr->tm_cap.max_ops,
                                                 .cq = Cq::from(attr->cq)->p});
  }
  if (!(mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd ||
      !same_device(attr->xrcd->context, context))
    return fail<ibv_srq>(EINVAL);
  return create_srq_common(attr->pd, attr->attr, attr->srq_context,
                           Xrcd::from(attr->xrcd)->share->p, Cq::from(attr->cq)->p,
                           std::nullopt);
}

}  // namespace urdma::verbs

extern "C" {

int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  if (!srq || !attr) return EINVAL;
  return verbs::Srq::from(srq)->p->modify(*attr, mask).error();
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (!srq || !attr) return EINVAL;
  *attr = verbs::Srq::from(srq)->p->query();
  return 0;
}

int ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return EINVAL;
  verbs::Srq* w = verbs::Srq::from(srq);
  provider::Status s = w->ctx->rt->destroy_srq(w->p);
  if (!s.ok()) return s.error();
  verbs::wait_for_acks(&srq->mutex, &srq->cond, &srq->events_completed, &w->events_reported);
  verbs::forget(w->ctx, w);
  verbs::destroy_sync(&srq->mutex, &srq->cond);
  delete w;
  return 0;
}

// ---- QP ----

}  // extern "C"

namespace urdma::verbs {

Qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr* attr, uint32_t create_flags) {
  if (!pd || !attr) return fail<Qp>(EINVAL);
  // An XRC initiator has no receive side: its receive CQ and SRQ are ignored (ib_create_qp
  // clears them for XRC_INI).
  const bool xrc_send = attr->qp_type == IBV_QPT_XRC_SEND;
  if (xrc_send) {
    attr->recv_cq = nullptr;
    attr->srq = nullptr;
  }
  if (!attr->send_cq || (!attr->recv_cq && !xrc_send)) return fail<Qp>(EINVAL);
  Pd* p = Pd::from(pd);
  if (!same_device(attr->send_cq->context, pd->context) ||
      (attr->recv_cq && !same_device(attr->recv_cq->context, pd->context)) ||
      (attr->srq && !same_device(attr->srq->context, pd->context)))
    return fail<Qp>(EINVAL);
  provider::QpInitAttr init;
  init.qp_type = attr->qp_type;
  init.pd = p->p;
  init.send_cq = Cq::from(attr->send_cq)->p;
  init.recv_cq = attr->recv_cq ? Cq::from(attr->recv_cq)->p : nullptr;
  init.srq = attr->srq ? Srq::from(attr->srq)->p : nullptr;
  init.cap = attr->cap;
  init.sq_sig_all = attr->sq_sig_all != 0;
  init.block_self_mcast_lb = (create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) != 0;
  init.allocator = queue_allocator(pd);
  provider::Result<provider::Qp*> r = p->ctx->rt->create_qp(init);
  if (!r.ok()) return fail<Qp>(r.error());
  auto* w = new Qp{};
  w->p = r.value();
  w->ctx = p->ctx;
  ibv_qp& q = w->qp;
  q.context = pd->context;
  q.qp_context = attr->qp_context;
  q.pd = pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.srq = attr->srq;
  q.handle = w->p->handle();
  q.qp_num = w->p->qp_num();
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  init_sync(&q.mutex, &q.cond);
  w->p->user_context = &w->qp;
  attr->cap = w->p->cap();  // ibv_create_qp(3): the capacities as created
  remember(w->ctx, w);
  return w;
}

ibv_qp* create_xrc_target(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  Context* c = Context::from(context);
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_XRC_RECV;
  init.xrcd = Xrcd::from(attr->xrcd)->share->p;
  provider::Result<provider::Qp*> r = c->rt->create_qp(init);
  if (!r.ok()) return fail<ibv_qp>(r.error());
  auto* w = new Qp{};
  w->p = r.value();
  w->ctx = c;
  ibv_qp& q = w->qp;
  q.context = context;
  q.qp_context = attr->qp_context;
  q.handle = w->p->handle();
  q.qp_num = w->p->qp_num();
  q.state = IBV_QPS_RESET;
  q.qp_type = IBV_QPT_XRC_RECV;
  init_sync(&q.mutex, &q.cond);
  w->p->user_context = &w->qp;
  attr->cap = w->p->cap();  // no queues: all zero
  remember(w->ctx, w);
  return &w->qp;
}

}  // namespace urdma::verbs

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  verbs::Qp* w = verbs::create_qp_common(pd, attr);
  return w ? &w->qp : nullptr;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (!qp || !attr) return EINVAL;
  verbs::Qp* w = verbs::Qp::from(qp);
  provider::Status s = w->ctx->rt->modify_qp(w->p, *attr, mask);
  // rdma-core returns the errno of the failed command, which also left it in errno; callers
  // print either (UCX: "%m").
  if (!s.ok()) return errno = s.error();
  if (mask & IBV_QP_STATE) qp->state = attr->qp_state;
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) {
  if (!qp || !attr || !init_attr) return EINVAL;
  provider::Status s = verbs::Qp::from(qp)->p->query(attr, mask, init_attr);
  if (!s.ok()) return s.error();
  init_attr->qp_context = qp->qp_context;
  qp->state = attr->qp_state;  // the engine may have moved it to SQE/ERR
  return 0;
}

int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) {
  return 0;  // no in-order placement guarantee is promised (0: "not in order")
}

int ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return EINVAL;
  verbs::Qp* w = verbs::Qp::from(qp);
  provider::Status s = w->ctx->rt->destroy_qp(w->p);
  if (!s.ok()) return s.error();
  verbs::wait_for_acks(&qp->mutex, &qp->cond, &qp->events_completed, &w->events_reported);
  verbs::forget(w->ctx, w);
  if (w->destroy_ex) w->destroy_ex(w);
  verbs::destroy_sync(&qp->mutex, &qp->cond);
  delete w;
  return 0;
}

// ---- multicast (ibv_attach_mcast(3)) ----
// RoCE has no LIDs: the LID is ignored, as rxe ignores it. EINVAL: not a UD QP, not a multicast
// GID, or (detach) not attached to it; ENOMEM: a limit of ibv_query_device's max_mcast_*, or
// the host's (the kernel refused the group membership).

int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (!qp || !gid) return EINVAL;
  verbs::Qp* w = verbs::Qp::from(qp);
  return w->ctx->rt->attach_mcast(w->p, *gid).error();
}

int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (!qp || !gid) return EINVAL;
  verbs::Qp* w = verbs::Qp::from(qp);
  return w->ctx->rt->detach_mcast(w->p, *gid).error();
}

// ---- AH ----

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return fail<ibv_ah>(EINVAL);
  verbs::Pd* p = verbs::Pd::from(pd);
  provider::Result<provider::Ah*> r = p->ctx->rt->create_ah(p->p, *attr);
  if (!r.ok()) return fail<ibv_ah>(r.error());
  auto* w = new verbs::Ah{};
  w->p = r.value();
  w->ctx = p->ctx;
  w->ah.context = pd->context;
  w->ah.pd = pd;
  w->ah.handle = w->p->handle();
  w->p->user_context = &w->ah;
  verbs::remember(w->ctx, w);
  return &w->ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  verbs::Ah* w = verbs::Ah::from(ah);
  provider::Status s = w->ctx->rt->destroy_ah(w->p);
  if (!s.ok()) return s.error();
  verbs::forget(w->ctx, w);
  delete w;
  return 0;
}

// RoCE: the 40 bytes before a UD receive's payload hold the IPv6 header, or 20 zero bytes and
// the IPv4 header (rdma-core's convention); the reply goes to the packet's source, from the
// local GID the packet was sent to.
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                        ibv_ah_attr* ah_attr) {
  if (!context || !wc || !grh || !ah_attr || port_num != provider::kPortNum) {
    errno = EINVAL;
    return -1;
  }
  if (!(wc->wc_flags & IBV_WC_GRH)) {
    errno = EINVAL;  // every RoCE packet has an IP header: a wc without one is not ours
    return -1;
  }
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  ibv_gid src{}, dst{};
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  if ((raw[20] >> 4) == 4) {  // IPv4 header at offset 20
    src.raw[10] = src.raw[11] = dst.raw[10] = dst.raw[11] = 0xff;
    std::memcpy(src.raw + 12, raw + 20 + 12, 4);
    std::memcpy(dst.raw + 12, raw + 20 + 16, 4);
    traffic_class = raw[20 + 1];
  } else if ((raw[0] >> 4) == 6) {
    const uint32_t vtf = be32toh(grh->version_tclass_flow);
    traffic_class = static_cast<uint8_t>(vtf >> 20);
    flow_label = vtf & 0xfffff;
    src = grh->sgid;
    dst = grh->dgid;
  } else {
    errno = EINVAL;
    return -1;
  }
  provider::Device& dev = verbs::Context::from(context)->dev();
  int sgid_index = -1;
  for (uint32_t i = 0; i < provider::kLimits.gid_table_len && sgid_index < 0; ++i) {
    ibv_gid g;
    if (dev.query_gid(port_num, static_cast<int>(i), &g).ok() &&
        std::memcmp(&g, &dst, sizeof g) == 0)
      sgid_index = static_cast<int>(i);
  }
  if (sgid_index < 0) {
    errno = ENOENT;  // the packet's destination is none of our GIDs
    return -1;
  }
  *ah_attr = {};
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  ah_attr->is_global = 1;
  ah_attr->grh.dgid = src;
  ah_attr->grh.flow_label = flow_label;
  ah_attr->grh.sgid_index = static_cast<uint8_t>(sgid_index);
  ah_attr->grh.hop_limit = 0xff;
  ah_attr->grh.traffic_class = traffic_class;
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) return fail<ibv_ah>(EINVAL);
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0) return nullptr;
  return ibv_create_ah(pd, &attr);
}

// ---- what urdma does not offer: the errno the man pages give ----

int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
// ---- imported objects (ibv_import_pd(3), ibv_import_mr(3), ibv_import_dm(3)) ----
// A new wrapper for an object of the context's device context (any context opened or imported
// on it made it), ENOENT for a handle it has none of — the kernel's answer for a handle its
// file does not hold. The wrapper is the device context's like any other (freed at its close,
// if not before): ibv_dealloc_pd/ibv_dereg_mr/ibv_free_dm through it destroy the object, as
// through the original's; ibv_unimport_* frees the wrapper only.
// (ibv_import_device is device.cc's.)

ibv_pd* ibv_import_pd(ibv_context* context, uint32_t pd_handle) {
  if (!context) return fail<ibv_pd>(EINVAL);
  verbs::Context* c = verbs::Context::from(context);
  provider::Pd* pd = c->rt->find_pd(pd_handle);
  if (!pd) return fail<ibv_pd>(ENOENT);
  auto* w = new verbs::Pd{};
  w->p = pd;
  w->ctx = c;
  w->pd.context = context;
  w->pd.handle = pd_handle;
  verbs::remember_pd(c, w);
  return &w->pd;
}

void ibv_unimport_pd(ibv_pd* pd) {
  if (!pd) return;
  verbs::Pd* w = verbs::Pd::from(pd);
  verbs::forget(w->ctx, w);
  verbs::free_wrapper<verbs::Pd>(w);
}

// addr is NULL (ibv_import_mr(3): "not applicable"); length, keys and handle are the MR's.
ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  verbs::Context* c = verbs::Context::from(pd->context);
  provider::Mr* mr = c->rt->find_mr(mr_handle);
  if (!mr) return fail<ibv_mr>(ENOENT);
  auto* w = new verbs::Mr{};
  w->p = mr;
  w->ctx = c;
  w->mr.context = pd->context;
  w->mr.pd = pd;
  w->mr.addr = nullptr;
  w->mr.length = mr->length();
  w->mr.handle = mr_handle;
  w->mr.lkey = mr->lkey();
  w->mr.rkey = mr->rkey();
  verbs::remember(c, w);
  return &w->mr;
}

void ibv_unimport_mr(ibv_mr* mr) {
  if (!mr) return;
  verbs::Mr* w = verbs::Mr::from(mr);
  verbs::forget(w->ctx, w);
  delete w;
}

ibv_dm* ibv_import_dm(ibv_context* context, uint32_t dm_handle) {
  if (!context) return fail<ibv_dm>(EINVAL);
  verbs::Context* c = verbs::Context::from(context);
  provider::Dm* dm = c->rt->find_dm(dm_handle);
  if (!dm) return fail<ibv_dm>(ENOENT);
  auto* w = new verbs::Dm{};
  w->p = dm;
  w->ctx = c;
  w->dm.context = context;
  w->dm.memcpy_to_dm = verbs::dm_memcpy_to;
  w->dm.memcpy_from_dm = verbs::dm_memcpy_from;
  w->dm.comp_mask = IBV_DM_MASK_HANDLE;
  w->dm.handle = dm_handle;
  verbs::remember(c, w);
  return &w->dm;
}

void ibv_unimport_dm(ibv_dm* dm) {
  if (!dm) return;
  verbs::Dm* w = verbs::Dm::from(dm);
  verbs::forget(w->ctx, w);
  delete w;
}

}  // extern "C"
