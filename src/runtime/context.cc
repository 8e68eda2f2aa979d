// One ibv_context as a view on the process's Device; see context.h.
#include "runtime/context.h"

#include <cerrno>
#include <cstring>
#include <vector>

namespace urdma::runtime {

using provider::Status;

Context::~Context() {
  // Dependents first: QPs use PDs, CQs and SRQs; MWs use MRs; MRs, SRQs and AHs use PDs (the
  // Device refuses EBUSY otherwise).
  std::vector<provider::Qp*> qps(qps_.begin(), qps_.end());
  for (provider::Qp* qp : qps) {
    // A QP attached to a multicast group is in use (EBUSY): detach it first, as the kernel
    // does for a closed uverbs file.
    for (const ibv_gid& gid : dev().mcast().groups_of(qp->qp_num())) (void)detach_mcast(qp, gid);
    (void)destroy_qp(qp);
  }
  std::vector<provider::Mw*> mws(mws_.begin(), mws_.end());
  for (provider::Mw* mw : mws) (void)dealloc_mw(mw);
  std::vector<provider::Mr*> mrs(mrs_.begin(), mrs_.end());
  for (provider::Mr* mr : mrs) (void)dereg_mr(mr);
  std::vector<provider::Dm*> dms(dms_.begin(), dms_.end());
  for (provider::Dm* dm : dms) (void)free_dm(dm);
  std::vector<provider::Srq*> srqs(srqs_.begin(), srqs_.end());
  for (provider::Srq* srq : srqs) (void)destroy_srq(srq);
  std::vector<provider::Xrcd*> xrcds(xrcds_.begin(), xrcds_.end());
  for (provider::Xrcd* xrcd : xrcds) (void)dealloc_xrcd(xrcd);
  std::vector<provider::Ah*> ahs(ahs_.begin(), ahs_.end());
  for (provider::Ah* ah : ahs) (void)destroy_ah(ah);
  std::vector<provider::Cq*> cqs(cqs_.begin(), cqs_.end());
  for (provider::Cq* cq : cqs) (void)destroy_cq(cq);
  std::vector<provider::Pd*> pds(pds_.begin(), pds_.end());
  for (provider::Pd* pd : pds) (void)dealloc_pd(pd);
}

size_t Context::objects() const {
  std::lock_guard lock(mutex_);
  return pds_.size() + cqs_.size() + qps_.size() + mrs_.size() + mws_.size() + srqs_.size() +
         ahs_.size() + dms_.size() + xrcds_.size();
}

namespace {
template <class T>
T* find_handle(const std::set<T*>& objects, uint32_t handle) {
  for (T* o : objects)
    if (o->handle() == handle) return o;
  return nullptr;
}
}  // namespace

provider::Pd* Context::find_pd(uint32_t handle) const {
  std::lock_guard lock(mutex_);
  return find_handle(pds_, handle);
}
provider::Mr* Context::find_mr(uint32_t handle) const {
  std::lock_guard lock(mutex_);
  return find_handle(mrs_, handle);
}
provider::Dm* Context::find_dm(uint32_t handle) const {
  std::lock_guard lock(mutex_);
  return find_handle(dms_, handle);
}

provider::Result<provider::Pd*> Context::alloc_pd() {
  provider::Result<provider::Pd*> pd = dev().alloc_pd();
  if (pd.ok()) {
    std::lock_guard lock(mutex_);
    pds_.insert(pd.value());
  }
  return pd;
}

Status Context::dealloc_pd(provider::Pd* pd) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd)) return Status(EINVAL);
  Status s = dev().dealloc_pd(pd);
  if (s.ok()) pds_.erase(pd);
  return s;
}

provider::Result<provider::Cq*> Context::create_cq(int cqe, provider::CqOptions options) {
  provider::Result<provider::Cq*> cq = dev().create_cq(cqe, std::move(options));
  if (cq.ok()) {
    std::lock_guard lock(mutex_);
    cqs_.insert(cq.value());
  }
  return cq;
}

Status Context::destroy_cq(provider::Cq* cq) {
  std::lock_guard lock(mutex_);
  if (!cqs_.contains(cq)) return Status(EINVAL);
  Status s = dev().destroy_cq(cq);
  if (s.ok()) cqs_.erase(cq);
  return s;
}

provider::Result<provider::Qp*> Context::create_qp(const provider::QpInitAttr& init) {
  std::lock_guard lock(mutex_);
  // Objects of another context are not this context's to use. An XRC target has only its
  // XRC domain; an XRC initiator has no receive CQ.
  if (init.qp_type == IBV_QPT_XRC_RECV) {
    if (!xrcds_.contains(init.xrcd)) return Status(EINVAL);
  } else if (!pds_.contains(init.pd) || !cqs_.contains(init.send_cq) ||
             (init.recv_cq != nullptr && !cqs_.contains(init.recv_cq)) ||
             (init.recv_cq == nullptr && init.qp_type != IBV_QPT_XRC_SEND) ||
             (init.srq != nullptr && !srqs_.contains(init.srq))) {
    return Status(EINVAL);
  }
  provider::Result<provider::Qp*> qp = dev().create_qp(init);
  if (qp.ok()) qps_.insert(qp.value());
  return qp;
}

// A device works on its own: by the time a verb changes a QP, a NIC has sent what was posted
// and processed what had arrived. Here that takes an engine turn, which a busy host's engine
// thread may not have run yet, so the verbs that end a QP's traffic run one first:
// * an unreliable QP's posted sends leave, as they do on rxe, whose ibv_post_send transmits
//   before it returns (mckey's sender posts its datagrams, leaves its group and exits);
// * the ACKs already in the socket's queue complete their sends. A peer that got its last
//   message disconnects at once, and the application here tears down on the DISCONNECTED
//   event: left unread, the ACK that went out ahead of that DREQ is lost with the QP, or comes
//   after the flush, and a delivered send completes as flushed (libfabric's ofi_rxm then
//   reports WR_FLUSH_ERR, or worse, for the last message of a run).
void Context::take_in_before_the_qp_stops() {
  runtime_.progress_now();
}

Status Context::modify_qp(provider::Qp* qp, const ibv_qp_attr& attr, int mask) {
  if ((mask & IBV_QP_STATE) && attr.qp_state == IBV_QPS_ERR) take_in_before_the_qp_stops();
  return qp->modify(attr, mask);
}

Status Context::destroy_qp(provider::Qp* qp) {
  std::lock_guard lock(mutex_);
  if (!qps_.contains(qp)) return Status(EINVAL);
  take_in_before_the_qp_stops();
  Status s = dev().destroy_qp(qp);
  if (s.ok()) qps_.erase(qp);
  return s;
}

Status Context::attach_mcast(provider::Qp* qp, const ibv_gid& gid) {
  std::lock_guard lock(mutex_);
  if (!qps_.contains(qp)) return Status(EINVAL);
  bool added = false;
  if (Status s = dev().attach_mcast(qp, gid, &added); !s.ok() || !added) return s;
  // The process's slot socket must hear the group: urdmad joins it there (mcast_members.h). A
  // runtime without urdmad (tests on an in-memory PacketIo) has no socket to join on.
  if (daemon::Client* client = runtime_.daemon_client()) {
    net::Address::Bytes b;
    std::memcpy(b.data(), gid.raw, b.size());
    if (const int err = client->mcast_attach(qp->qp_num(), net::Address(b))) {
      (void)dev().detach_mcast(qp, gid);
      return Status(err);
    }
  }
  return provider::kOk;
}

Status Context::detach_mcast(provider::Qp* qp, const ibv_gid& gid) {
  std::lock_guard lock(mutex_);
  if (!qps_.contains(qp)) return Status(EINVAL);
  if (Status s = dev().detach_mcast(qp, gid); !s.ok()) return s;
  if (daemon::Client* client = runtime_.daemon_client()) {
    net::Address::Bytes b;
    std::memcpy(b.data(), gid.raw, b.size());
    // The QP no longer receives the group whatever urdmad answers (the engine asks the table);
    // a daemon that is away learns it from the keeper's list when it comes back.
    (void)client->mcast_detach(qp->qp_num(), net::Address(b));
  }
  return provider::kOk;
}

provider::Result<provider::Mr*> Context::reg_mr(provider::Pd* pd, void* addr, uint64_t length,
                                                uint64_t iova, int access) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd)) return Status(EINVAL);
  provider::Result<provider::Mr*> mr = dev().reg_mr(pd, addr, length, iova, access);
  if (mr.ok()) mrs_.insert(mr.value());
  return mr;
}

Status Context::dereg_mr(provider::Mr* mr) {
  std::lock_guard lock(mutex_);
  if (!mrs_.contains(mr)) return Status(EINVAL);
  Status s = dev().dereg_mr(mr);
  if (s.ok()) mrs_.erase(mr);
  return s;
}

provider::Result<provider::Dm*> Context::alloc_dm(uint64_t length, uint32_t log_align) {
  provider::Result<provider::Dm*> dm = dev().alloc_dm(length, log_align);
  if (dm.ok()) {
    std::lock_guard lock(mutex_);
    dms_.insert(dm.value());
  }
  return dm;
}

Status Context::free_dm(provider::Dm* dm) {
  std::lock_guard lock(mutex_);
  if (!dms_.contains(dm)) return Status(EINVAL);
  Status s = dev().free_dm(dm);
  if (s.ok()) dms_.erase(dm);
  return s;
}

provider::Result<provider::Mr*> Context::reg_dm_mr(provider::Pd* pd, provider::Dm* dm,
                                                   uint64_t offset, uint64_t length, int access) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd) || !dms_.contains(dm)) return Status(EINVAL);
  provider::Result<provider::Mr*> mr = dev().reg_dm_mr(pd, dm, offset, length, access);
  if (mr.ok()) mrs_.insert(mr.value());
  return mr;
}

provider::Result<provider::Mw*> Context::alloc_mw(provider::Pd* pd, ibv_mw_type type) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd)) return Status(EINVAL);
  provider::Result<provider::Mw*> mw = dev().alloc_mw(pd, type);
  if (mw.ok()) mws_.insert(mw.value());
  return mw;
}

Status Context::dealloc_mw(provider::Mw* mw) {
  std::lock_guard lock(mutex_);
  if (!mws_.contains(mw)) return Status(EINVAL);
  Status s = dev().dealloc_mw(mw);
  if (s.ok()) mws_.erase(mw);
  return s;
}

provider::Result<provider::Srq*> Context::create_srq(
    provider::Pd* pd, const ibv_srq_attr& attr, std::shared_ptr<provider::QueueAllocator> allocator,
    provider::Xrcd* xrcd, provider::Cq* cq, std::optional<provider::SrqTmAttr> tm) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd)) return Status(EINVAL);
  if ((xrcd != nullptr && !xrcds_.contains(xrcd)) || (cq != nullptr && !cqs_.contains(cq)))
    return Status(EINVAL);
  if (tm && !cqs_.contains(tm->cq)) return Status(EINVAL);
  provider::Result<provider::Srq*> srq =
      dev().create_srq(pd, attr, std::move(allocator), xrcd, cq, tm);
  if (srq.ok()) srqs_.insert(srq.value());
  return srq;
}

provider::Result<provider::Xrcd*> Context::alloc_xrcd() {
  std::lock_guard lock(mutex_);
  provider::Result<provider::Xrcd*> xrcd = dev().alloc_xrcd();
  if (xrcd.ok()) xrcds_.insert(xrcd.value());
  return xrcd;
}

Status Context::dealloc_xrcd(provider::Xrcd* xrcd) {
  std::lock_guard lock(mutex_);
  if (!xrcds_.contains(xrcd)) return Status(EINVAL);
  Status s = dev().dealloc_xrcd(xrcd);
  if (s.ok()) xrcds_.erase(xrcd);
  return s;
}

Status Context::destroy_srq(provider::Srq* srq) {
  std::lock_guard lock(mutex_);
  if (!srqs_.contains(srq)) return Status(EINVAL);
  Status s = dev().destroy_srq(srq);
  if (s.ok()) srqs_.erase(srq);
  return s;
}

provider::Result<provider::Ah*> Context::create_ah(provider::Pd* pd, const ibv_ah_attr& attr) {
  std::lock_guard lock(mutex_);
  if (!pds_.contains(pd)) return Status(EINVAL);
  provider::Result<provider::Ah*> ah = dev().create_ah(pd, attr);
  if (ah.ok()) ahs_.insert(ah.value());
  return ah;
}

Status Context::destroy_ah(provider::Ah* ah) {
  std::lock_guard lock(mutex_);
  if (!ahs_.contains(ah)) return Status(EINVAL);
  Status s = dev().destroy_ah(ah);
  if (s.ok()) ahs_.erase(ah);
  return s;
}

}  // namespace urdma::runtime
