// One ibv_context of the process: a view on the process's one Device.
//
// Why a view: a process has one slot socket (urdmad steers a QPN range to it) and one engine,
// so the QPN range and the MR/MW key space belong to the process, not to an ibv_context. Two
// contexts — librdmacm's and the application's, both from ibv_open_device — must never hand
// out the same QPN or rkey on that socket. So the Runtime owns the one provider::Device (its
// tables allocate QPNs from the slot's range and keys from one random key space), and each
// Context only records which objects it created: verbs on a Context check that the objects
// they are given belong to it (EINVAL otherwise, as a verbs object from another ibv_context
// is), and closing the context (ibv_close_device) destroys what it still owns, QPs first.
// The verbs layer gives one Context to every ibv_context of one device context (the original
// and those imported from its command fd: verbs/internal.h, DeviceContext) and deletes it with
// the last of them.
#pragma once

#include <mutex>
#include <set>

#include "provider/device.h"
#include "runtime/runtime.h"

namespace urdma::runtime {

class Context {
 public:
  explicit Context(Runtime& runtime) : runtime_(runtime) {}
  ~Context();  // ibv_close_device: destroys every object still owned, dependents first
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Runtime& runtime() { return runtime_; }

  provider::Result<provider::Pd*> alloc_pd();
  provider::Status dealloc_pd(provider::Pd* pd);
  provider::Result<provider::Cq*> create_cq(int cqe, provider::CqOptions options = {});
  provider::Status destroy_cq(provider::Cq* cq);
  provider::Result<provider::Qp*> create_qp(const provider::QpInitAttr& init);
  // ibv_modify_qp. A move to ERR first takes in what has arrived (as destroy_qp does).
  provider::Status modify_qp(provider::Qp* qp, const ibv_qp_attr& attr, int mask);
  // ibv_destroy_qp: after one engine turn on this thread, so the QP's posted sends have left
  // and the packets that arrived for it (the ACK of its last send) are taken in.
  provider::Status destroy_qp(provider::Qp* qp);
  // ibv_attach_mcast / ibv_detach_mcast: the Device's table (provider/mcast_table.h), and
  // urdmad's membership of the group on the process's slot socket (daemon/mcast_members.h).
  provider::Status attach_mcast(provider::Qp* qp, const ibv_gid& gid);
  provider::Status detach_mcast(provider::Qp* qp, const ibv_gid& gid);
  provider::Result<provider::Mr*> reg_mr(provider::Pd* pd, void* addr, uint64_t length,
                                         uint64_t iova, int access);
  provider::Status dereg_mr(provider::Mr* mr);
  provider::Result<provider::Dm*> alloc_dm(uint64_t length, uint32_t log_align);
  provider::Status free_dm(provider::Dm* dm);
  provider::Result<provider::Mr*> reg_dm_mr(provider::Pd* pd, provider::Dm* dm, uint64_t offset,
                                            uint64_t length, int access);
  provider::Result<provider::Mw*> alloc_mw(provider::Pd* pd, ibv_mw_type type);
  provider::Status dealloc_mw(provider::Mw* mw);
  // An XRC SRQ names its XRC domain and CQ (both of this context).
  provider::Result<provider::Srq*> create_srq(
      provider::Pd* pd, const ibv_srq_attr& attr,
      std::shared_ptr<provider::QueueAllocator> allocator = nullptr,
      provider::Xrcd* xrcd = nullptr, provider::Cq* cq = nullptr,
      std::optional<provider::SrqTmAttr> tm = std::nullopt);
  provider::Status destroy_srq(provider::Srq* srq);
  provider::Result<provider::Ah*> create_ah(provider::Pd* pd, const ibv_ah_attr& attr);
  provider::Status destroy_ah(provider::Ah* ah);
  provider::Result<provider::Xrcd*> alloc_xrcd();
  provider::Status dealloc_xrcd(provider::Xrcd* xrcd);

  size_t objects() const;

  // ibv_import_pd/mr/dm: this context's object of that handle, or null.
  provider::Pd* find_pd(uint32_t handle) const;
  provider::Mr* find_mr(uint32_t handle) const;
  provider::Dm* find_dm(uint32_t handle) const;

 private:
  provider::Device& dev() { return runtime_.device(); }
  void take_in_before_the_qp_stops();

  Runtime& runtime_;
  mutable std::mutex mutex_;
  std::set<provider::Pd*> pds_;
  std::set<provider::Cq*> cqs_;
  std::set<provider::Qp*> qps_;
  std::set<provider::Mr*> mrs_;
  std::set<provider::Mw*> mws_;
  std::set<provider::Srq*> srqs_;
  std::set<provider::Ah*> ahs_;
  std::set<provider::Dm*> dms_;
  std::set<provider::Xrcd*> xrcds_;
};

}  // namespace urdma::runtime
