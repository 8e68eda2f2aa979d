// XRC domains at the libibverbs boundary: ibv_open_xrcd(3), ibv_close_xrcd(3) and
// ibv_get_srq_num(3), reached through verbs_context's ops as rdma-core's inlines call them.
//
// Design
// * A domain opened on a file is found again by the file's inode: ibv_open_xrcd on the same
//   file (any fd of it) in the same device context gives the same provider::Xrcd, whose opens
//   are counted (XrcdShare::opens); O_CREAT creates a domain for a file that has none, O_EXCL
//   refuses one that has (EINVAL), and without O_CREAT a file with none is ENOENT, as the
//   kernel's ib_uverbs_open_xrcd does. fd -1 gives a private domain every time.
// * Sharing is per device context (one process), not across processes: the kernel keeps its
//   inode table per device, so two processes opening one file share a domain there; here each
//   process's engine is its own device, and each process gets its own domain for the file
//   (docs/COMPATIBILITY.md).
// * ibv_close_xrcd: an open that is not the domain's last one just goes; the last one frees the
//   domain, EBUSY while an XRC SRQ or XRC target QP is in it (the kernel's
//   ib_dealloc_xrcd_user), the open then staying valid.
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <mutex>

#include "verbs/internal.h"

namespace urdma::verbs {
namespace {

// Guards every DeviceContext::xrcd_files and XrcdShare::opens (opens and closes are rare).
std::mutex xrcd_mutex;

// Frees what ibv_close_device leaves of an open (its provider domain is gone with the
// runtime::Context by then).
void free_xrcd(void* p) {
  Xrcd* w = static_cast<Xrcd*>(p);
  {
    std::lock_guard lock(xrcd_mutex);
    XrcdShare* share = w->share;
    if (--share->opens == 0) {
      if (share->has_file) w->ctx->shared->xrcd_files.erase({share->dev, share->ino});
      delete share;
    }
  }
  delete w;
}

ibv_xrcd* open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  if (!context || !attr) return fail<ibv_xrcd>(EINVAL);
  // rdma-core's ibv_cmd_open_xrcd: unknown mask bits are EOPNOTSUPP, FD and OFLAGS required.
  if (attr->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED) return fail<ibv_xrcd>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return fail<ibv_xrcd>(EINVAL);
  Context* c = Context::from(context);
  std::lock_guard lock(xrcd_mutex);
  XrcdShare* share = nullptr;
  struct stat st {};
  const bool has_file = attr->fd != -1;
  if (has_file) {
    if (fstat(attr->fd, &st) != 0) return fail<ibv_xrcd>(EBADF);
    auto it = c->shared->xrcd_files.find({st.st_dev, st.st_ino});
    if (it != c->shared->xrcd_files.end()) {
      if (attr->oflags & O_EXCL) return fail<ibv_xrcd>(EINVAL);
      share = it->second;
    } else if (!(attr->oflags & O_CREAT)) {
      return fail<ibv_xrcd>(ENOENT);
    }
  }
  bool created = false;
  if (share == nullptr) {
    provider::Result<provider::Xrcd*> r = c->rt->alloc_xrcd();
    if (!r.ok()) return fail<ibv_xrcd>(r.error());
    share = new XrcdShare{r.value(), has_file, st.st_dev, st.st_ino, 0};
    if (has_file) c->shared->xrcd_files[{st.st_dev, st.st_ino}] = share;
    created = true;
  }
  auto* w = new Xrcd{};
  w->xrcd.context = context;
  w->share = share;
  w->ctx = c;
  ++share->opens;
  if (created) share->p->user_context = &w->xrcd;
  remember_object(c, w, free_xrcd);
  return &w->xrcd;
}

int close_xrcd(ibv_xrcd* xrcd) {
  if (!xrcd) return EINVAL;
  Xrcd* w = Xrcd::from(xrcd);
  std::lock_guard lock(xrcd_mutex);
  XrcdShare* share = w->share;
  if (share->opens == 1) {
    const provider::Status s = w->ctx->rt->dealloc_xrcd(share->p);
    if (!s.ok()) return s.error();
    if (share->has_file) w->ctx->shared->xrcd_files.erase({share->dev, share->ino});
    delete share;
  } else {
    --share->opens;
    // The provider domain names an ibv_xrcd in its user_context: another open of it.
    if (share->p->user_context == &w->xrcd) share->p->user_context = nullptr;
  }
  forget_object(w->ctx, w);
  delete w;
  return 0;
}

// ibv_get_srq_num(3): the number an XRCETH names the SRQ by (any SRQ has one, as on mlx5; only
// an XRC SRQ is ever found by it).
int get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  if (!srq || !srq_num) return EINVAL;
  *srq_num = Srq::from(srq)->p->srq_num();
  return 0;
}

}  // namespace

void fill_xrc_ops(verbs_context& v) {
  v.open_xrcd = open_xrcd;
  v.close_xrcd = close_xrcd;
  v.create_srq_ex = create_srq_ex;
  v.get_srq_num = get_srq_num;
}

}  // namespace urdma::verbs
