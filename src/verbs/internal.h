// The libibverbs.so.1 ABI surface: how our objects wrap the ibv_* structs an application sees.
//
// Layout (what rdma-core's libibverbs does, so that the inline functions of <infiniband/verbs.h>
// and Debian's binaries find what they expect):
// * Every ibv_* object the application gets is the FIRST member of one of our structs below, so
//   a pointer to it converts back with `from()` (a static_cast of the enclosing struct's address;
//   the structs are standard-layout and the ibv_* member is at offset 0).
// * An ibv_context is the last member of a `struct verbs_context` (ops ... sz, context), and
//   context.abi_compat == __VERBS_ABI_IS_EXTENDED, so verbs_get_ctx() / verbs_get_ctx_op() reach
//   the extended ops we fill (query_port, query_device_ex, create_cq_ex, create_qp_ex, ...).
//   Context::from() open-codes container_of from the ibv_context.
// * ibv_qp and ibv_qp_ex share storage (union, as rdma-core's struct verbs_qp): ibv_qp_ex begins
//   with `struct ibv_qp qp_base`, so ibv_qp_to_qp_ex can hand out &qp_ex of the same object.
//   Likewise ibv_cq and ibv_cq_ex (ibv_cq_ex starts with the same fields as ibv_cq; verbs_cq).
// * Each wrapper points at its provider object (src/provider), and the provider object's
//   `user_context` points back at the wrapper (async events and completion channels go from
//   provider::Cq/Qp/Srq to the ibv_* the application knows).
// * ibv_*.handle is the provider object's handle (ObjectTable slot); a WR names an AH or MW by
//   its ibv_ah.handle / ibv_mw.handle, which the provider resolves (provider/qp.h).
//
// The process: ONE runtime::Runtime (one urdmad slot, one engine thread, one provider::Device)
// shared by all contexts (runtime/context.h says why); opened at the first ibv_open_device and
// closed when the last context closes. Each ibv_context is a runtime::Context view.
//
// For the extended API (src/verbs/cq_ex.cc, src/verbs/qp_ex.cc):
// * Cq::ex / Qp::ex are owned by those files (CqExState / QpExState are defined there; null for
//   objects created by the plain verbs). Cq::destroy_ex / Qp::destroy_ex, when set, are called
//   by ibv_destroy_cq / ibv_destroy_qp before the wrapper is freed, to free that state.
// * To create objects they call create_cq_common() / create_qp_common() below, which do
//   everything ibv_create_cq / ibv_create_qp do (validation, the provider object, the channel,
//   ownership by the context), then fill the ibv_cq_ex / ibv_qp_ex function pointers.
// * A Cq's completions come from `cq->p->poll(n, wc)` (provider::Cq: ibv_wc records); when it
//   is empty, `cq->ctx->rt->runtime().try_progress()` drives the engine on the polling thread.
// * A Qp's WRs go through `qp->p->post_send(ibv_send_wr*, bad)` (provider::Qp), which validates
//   and rings the doorbell; an ibv_wr_* builder can build ibv_send_wr lists and post them at
//   ibv_wr_complete.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include <sys/types.h>

#include "provider/device.h"
#include "runtime/completion_channel.h"
#include "runtime/context.h"
#include "runtime/runtime.h"

namespace urdma::verbs {

// The one device of a network namespace's urdmad.
inline constexpr const char kDeviceName[] = "urdma0";

// The ibv_device of urdma0. rdma-core lays out `struct verbs_device` as an ibv_device followed
// by the provider's ops pointer; Debian's provider libraries compare that pointer with their own
// (never equal here: it is null), so a urdma device is never mistaken for theirs.
struct Device {
  ibv_device device;  // first
  const void* verbs_device_ops;
  uint64_t node_guid_be;  // ibv_get_device_guid: the host's, derived at ibv_get_device_list
};

struct Context;
struct ParentDomain;  // defined in domain.cc

// A PD, or a parent domain (ibv_alloc_parent_domain(3)): a parent domain is interchangeable
// with a PD, so its `p` is the provider PD of the protection domain it extends and every verb
// that takes an ibv_pd works on it unchanged. Only what differs is in `domain`.
struct Pd {
  ibv_pd pd;  // first
  provider::Pd* p;
  Context* ctx;
  ParentDomain* domain;  // null for a PD from ibv_alloc_pd
  static Pd* from(ibv_pd* x) { return reinterpret_cast<Pd*>(x); }
};

// ibv_alloc_td(3). Objects under a thread domain keep their locks (the man page allows it:
// "by default all verbs objects are safe for multi-threaded access, whether or not a thread
// domain is specified"); the TD is counted by the parent domains that name it.
struct Td {
  ibv_td td;  // first
  Context* ctx;
  std::atomic<uint32_t> parent_domains;
  static Td* from(ibv_td* x) { return reinterpret_cast<Td*>(x); }
};

struct Mr {
  ibv_mr mr;  // first
  provider::Mr* p;
  Context* ctx;
  static Mr* from(ibv_mr* x) { return reinterpret_cast<Mr*>(x); }
};

struct Mw {
  ibv_mw mw;  // first
  provider::Mw* p;
  Context* ctx;
  static Mw* from(ibv_mw* x) { return reinterpret_cast<Mw*>(x); }
};

// ibv_alloc_dm(3): rdma-core's struct verbs_dm is the ibv_dm and the handle; ours points at
// the provider's DM instead.
struct Dm {
  ibv_dm dm;  // first
  provider::Dm* p;
  Context* ctx;
  static Dm* from(ibv_dm* x) { return reinterpret_cast<Dm*>(x); }
};

struct CompChannel {
  ibv_comp_channel channel;  // first; channel.fd is impl->fd()
  runtime::CompletionChannel* impl;
  static CompChannel* from(ibv_comp_channel* x) { return reinterpret_cast<CompChannel*>(x); }
};

struct CqExState;  // defined in cq_ex.cc
struct Cq {
  union {
    ibv_cq cq;  // first
    ibv_cq_ex cq_ex;
  };
  provider::Cq* p;
  Context* ctx;
  CompChannel* channel;  // null without a completion channel
  CqExState* ex;         // cq_ex.cc's, null for ibv_create_cq
  void (*destroy_ex)(Cq*);
  // Async events handed out for this object (under cq.mutex); destroy waits until as many were
  // acknowledged (async_events_completed), as rdma-core's destroy does with the kernel's count.
  uint32_t events_reported;
  static Cq* from(ibv_cq* x) { return reinterpret_cast<Cq*>(x); }
  static Cq* from(ibv_cq_ex* x) { return reinterpret_cast<Cq*>(x); }
};

// ibv_open_xrcd(3): one XRC domain and the opens that name it (several for a file opened again;
// one for a private domain, fd -1). Kept by the device context, by the file's inode.
struct XrcdShare {
  provider::Xrcd* p;
  bool has_file;
  dev_t dev;
  ino_t ino;
  int opens;  // ibv_xrcd wrappers naming it, under the device context's xrcd lock (xrc.cc)
};

// One ibv_open_xrcd: the ibv_xrcd the application holds (rdma-core's verbs_xrcd is the same
// shape: the ibv_xrcd first).
struct Xrcd {
  ibv_xrcd xrcd;  // first
  XrcdShare* share;
  Context* ctx;
  static Xrcd* from(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x); }
};

struct Srq {
  ibv_srq srq;  // first
  provider::Srq* p;
  Context* ctx;
  uint32_t events_reported;  // as Cq's (under srq.mutex)
  static Srq* from(ibv_srq* x) { return reinterpret_cast<Srq*>(x); }
};

struct QpExState;  // defined in qp_ex.cc
struct Qp {
  union {
    ibv_qp qp;  // first
    ibv_qp_ex qp_ex;
  };
  // rdma-core's VERBS_QP_EX: set when qp_ex's function pointers are filled (ibv_qp_to_qp_ex
  // returns &qp_ex only then).
  bool has_qp_ex;
  provider::Qp* p;
  Context* ctx;
  QpExState* ex;  // qp_ex.cc's, null for ibv_create_qp
  void (*destroy_ex)(Qp*);
  uint32_t events_reported;  // as Cq's (under qp.mutex)
  static Qp* from(ibv_qp* x) { return reinterpret_cast<Qp*>(x); }
  static Qp* from(ibv_qp_ex* x) { return reinterpret_cast<Qp*>(x); }
};

struct Ah {
  ibv_ah ah;  // first
  provider::Ah* p;
  Context* ctx;
  static Ah* from(ibv_ah* x) { return reinterpret_cast<Ah*>(x); }
};

// The wrappers a context still owns (verbs.cc): ibv_close_device frees those the application
// left, after runtime::Context destroyed their provider objects.
struct LiveObjects;

// What ibv_import_device(3) shares: the device context behind one command fd — the objects
// (runtime::Context) and their wrappers (LiveObjects) — named by every ibv_context opened or
// imported on it. A uverbs file's objects live while any of its fds is open; likewise these
// live until the last of the contexts naming them closes (`members`, under Process::mutex).
// A context closed before the others stays allocated (in `closed`), because the wrappers it
// made point at it, and is freed with the device context.
struct DeviceContext {
  runtime::Context* rt;
  LiveObjects* live;
  int members;
  std::vector<Context*> closed;
  // The command fd's file (a memfd of this device context; fstat), what an import looks for.
  dev_t cmd_dev;
  ino_t cmd_ino;
  // The XRC domains opened on a file (ibv_open_xrcd(3): the same inode gives the same domain),
  // under xrc.cc's lock.
  std::map<std::pair<dev_t, ino_t>, XrcdShare*> xrcd_files;
};

// One ibv_context: `vctx.context` is what the application holds.
struct Context {
  verbs_context vctx;    // first; its last member is the ibv_context
  runtime::Context* rt;  // shared->rt
  LiveObjects* live;     // shared->live
  DeviceContext* shared;
  pid_t pid;                               // the process that opened it (fork: process())
  provider::AsyncEventQueue* async_queue;  // this context's events (Process::open_contexts)
  runtime::AsyncEventFd* async;            // its async_fd
  static Context* from(ibv_context* c) {
    return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) -
                                      offsetof(verbs_context, context));
  }
  provider::Device& dev() { return rt->runtime().device(); }
};

static_assert(std::is_standard_layout_v<Pd> && std::is_standard_layout_v<Mr> &&
              std::is_standard_layout_v<Mw> && std::is_standard_layout_v<Cq> &&
              std::is_standard_layout_v<Dm> && std::is_standard_layout_v<Td> &&
              std::is_standard_layout_v<Srq> && std::is_standard_layout_v<Qp> &&
              std::is_standard_layout_v<Ah> && std::is_standard_layout_v<Context> &&
              std::is_standard_layout_v<Xrcd> &&
              std::is_standard_layout_v<CompChannel> && std::is_standard_layout_v<Device>);
static_assert(offsetof(ibv_qp_ex, qp_base) == 0);
static_assert(offsetof(ibv_cq_ex, context) == offsetof(ibv_cq, context) &&
              offsetof(ibv_cq_ex, cqe) == offsetof(ibv_cq, cqe) &&
              offsetof(ibv_cq_ex, async_events_completed) ==
                  offsetof(ibv_cq, async_events_completed));

// ---- shared by the plain and the extended verbs (verbs.cc) ----

// Context bookkeeping (ibv_open_device / ibv_close_device).
void init_live_objects(Context& c);
// Before the provider objects go: the completion channels of the CQs left let go of them.
void release_channels(Context& c);
// Frees every wrapper still registered (their provider objects are gone already).
void free_live_objects(Context& c);
// Registers a wrapper with the function that frees it at ibv_close_device, and forgets it.
void remember_object(Context* c, void* w, void (*free_fn)(void*));
void forget_object(Context* c, void* w);
// A Pd wrapper (a parent domain too: its free function frees `domain`).
void remember_pd(Context* c, Pd* w);

// ibv_create_cq's work: validates (EINVAL: cqe, comp_vector, a channel of another context),
// creates the provider CQ, attaches the channel. errno set and null on failure.
// `options`: the provider CQ's timestamps and allocator (ibv_create_cq_ex).
Cq* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector, provider::CqOptions options = {});
// ibv_create_qp's work for `pd` and `attr` (attr->cap is updated to the rounded capacities).
// errno set and null on failure.
// create_flags: IBV_QP_CREATE_* (ibv_create_qp_ex), checked by the caller.
Qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr* attr, uint32_t create_flags = 0);

// ---- XRC (xrc.cc; the SRQ and QP parts in verbs.cc) ----

// Fills the verbs_context ops of XRC: open_xrcd, close_xrcd, create_srq_ex, get_srq_num.
void fill_xrc_ops(verbs_context& v);
// ibv_create_srq_ex(3) for what verbs.h's inline does not send to ibv_create_srq: XRC SRQs
// (IBV_SRQT_XRC with PD, XRC domain and CQ), tag-matching SRQs (IBV_SRQT_TM with PD, CQ and
// tm_cap), a basic SRQ named with extra mask bits.
ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr);
// An XRC target QP (IBV_QPT_XRC_RECV) in attr->xrcd, for create_qp_ex.
ibv_qp* create_xrc_target(ibv_context* context, ibv_qp_init_attr_ex* attr);

// ---- parent and thread domains (domain.cc) ----

// The queue allocator objects created under `pd` use: a parent domain's (its callbacks, or
// malloc where it has none or they decline), null for a plain PD (malloc).
std::shared_ptr<provider::QueueAllocator> queue_allocator(ibv_pd* pd);
// ibv_dealloc_pd of a parent domain: EBUSY while a CQ, QP or SRQ created under it lives.
int dealloc_parent_domain(Pd* w);
// Frees a parent domain's own part (its wrapper's `domain`).
void free_parent_domain(Pd* w);
// At ibv_close_device, before the provider objects go: the parent domains left release their
// protection domains (so those can be deallocated).
void release_parent_domains(Context& c);
// Fills the verbs_context ops of domain.cc.
void fill_domain_ops(verbs_context& v);

// ---- the extended entry points (cq_ex.cc / qp_ex.cc) ----
ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr);
// ibv_create_srq and ibv_create_srq_ex: `attr` comes back as created; `xrcd` and `cq` for
// IBV_SRQT_XRC, `tm` for IBV_SRQT_TM.
ibv_srq* create_srq_common(ibv_pd* pd, ibv_srq_attr& attr, void* srq_context,
                           provider::Xrcd* xrcd, provider::Cq* cq,
                           std::optional<provider::SrqTmAttr> tm);
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);

// Whether two contexts name the same device context (one opened, the others imported from its
// command fd): their objects may be used together.
inline bool same_device(const ibv_context* a, const ibv_context* b) {
  if (a == b) return true;
  if (!a || !b) return false;
  return Context::from(const_cast<ibv_context*>(a))->shared ==
         Context::from(const_cast<ibv_context*>(b))->shared;
}

// Errors at the ibv_* boundary: pointer verbs set errno and return null.
template <class T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

}  // namespace urdma::verbs
