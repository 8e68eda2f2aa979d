// The device; see device.h.
#include "provider/device.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "wire/headers.h"

namespace urdma::provider {

void fill_device_attr(ibv_device_attr& a, uint64_t node_guid_be) {
  a = {};
  std::strncpy(a.fw_ver, "0.1.0", sizeof(a.fw_ver) - 1);
  a.node_guid = node_guid_be;
  a.sys_image_guid = node_guid_be;
  a.max_mr_size = kLimits.max_mr_size_bytes;
  a.page_size_cap = kLimits.page_size_cap;
  a.vendor_id = 0xffffff;  // as rxe: no IEEE OUI
  a.max_qp = static_cast<int>(kLimits.max_qp);
  a.max_qp_wr = static_cast<int>(kLimits.max_qp_wr);
  a.device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR |
                       IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
                       IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_PORT_ACTIVE_EVENT |
                       IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
  a.max_sge = static_cast<int>(kLimits.max_sge);
  a.max_sge_rd = static_cast<int>(kLimits.max_sge_rd);
  a.max_cq = static_cast<int>(kLimits.max_cq);
  a.max_cqe = static_cast<int>(kLimits.max_cqe);
  a.max_mr = static_cast<int>(kLimits.max_mr);
  a.max_pd = static_cast<int>(kLimits.max_pd);
  a.max_qp_rd_atom = static_cast<int>(kLimits.max_qp_rd_atom);
  a.max_res_rd_atom = static_cast<int>(kLimits.max_res_rd_atom);
  a.max_qp_init_rd_atom = static_cast<int>(kLimits.max_qp_init_rd_atom);
  // Atomics are real CPU atomics on the target memory, so they are atomic against every
  // other access to it, CPU or device: IBA 11.2.1.2 "global".
  a.atomic_cap = IBV_ATOMIC_GLOB;
  a.max_mw = static_cast<int>(kLimits.max_mw);
  a.max_ah = static_cast<int>(kLimits.max_ah);
  a.max_mcast_grp = static_cast<int>(kLimits.max_mcast_grp);
  a.max_mcast_qp_attach = static_cast<int>(kLimits.max_mcast_qp_attach);
  a.max_total_mcast_qp_attach = static_cast<int>(kLimits.max_total_mcast_qp_attach);
  a.max_srq = static_cast<int>(kLimits.max_srq);
  a.max_srq_wr = static_cast<int>(kLimits.max_srq_wr);
  a.max_srq_sge = static_cast<int>(kLimits.max_srq_sge);
  a.max_pkeys = kLimits.pkey_table_len;
  a.local_ca_ack_delay = kLimits.local_ca_ack_delay;
  a.phys_port_cnt = 1;
}

void fill_port_attr(ibv_port_attr& a, ibv_mtu max_mtu, ibv_mtu active_mtu) {
  a = {};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = max_mtu;
  a.active_mtu = active_mtu;
  a.gid_tbl_len = static_cast<int>(kLimits.gid_table_len);
  a.port_cap_flags = IBV_PORT_CM_SUP;
  a.max_msg_sz = kLimits.max_msg_size_bytes;
  a.bad_pkey_cntr = 0;
  a.qkey_viol_cntr = 0;
  a.pkey_tbl_len = kLimits.pkey_table_len;
  a.lid = 0;
  a.sm_lid = 0;
  a.lmc = 0;
  a.max_vl_num = 1;
  a.sm_sl = 0;
  a.subnet_timeout = 0;
  a.init_type_reply = 0;
  a.active_width = 1;     // 1X (IBV_WIDTH_1X)
  a.active_speed = 0x20;  // EDR, as rxe reports for a fast link
  a.phys_state = 5;       // LinkUp (IBA 14.2.5.6)
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
}

namespace {
bool gid_is_zero(const ibv_gid& gid) {
  static constexpr ibv_gid kZero = {};
  return std::memcmp(&gid, &kZero, sizeof gid) == 0;
}
}  // namespace

Device::Device(DeviceConfig config)
    : config_(std::move(config)),
      doorbell_(config_.doorbell != nullptr ? config_.doorbell : &default_doorbell_),
      gids_(kLimits.gid_table_len),
      mr_table_(kLimits.max_mr, kLimits.max_mw, config_.key_seed),
      pds_(kLimits.max_pd),
      cqs_(kLimits.max_cq),
      srqs_(kLimits.max_srq),
      xrcds_(kLimits.max_xrcd),
      qps_(kLimits.max_qp),
      ahs_(kLimits.max_ah),
      dms_(kLimits.max_dm) {
  assert(config_.qpn_base >= 2 && config_.qpn_base + kLimits.max_qp <= (1u << 24));
  assert(config_.gids.size() <= kLimits.gid_table_len);
  for (size_t i = 0; i < config_.gids.size(); ++i) gids_[i] = config_.gids[i];
  fill_device_attr(attr_, config_.node_guid_be);
}

Device::~Device() = default;

Status Device::query_port(uint8_t port_num, ibv_port_attr* out) const {
  if (port_num != kPortNum || out == nullptr) return Status(EINVAL);
  fill_port_attr(*out, config_.max_mtu, config_.active_mtu);
  return kOk;
}

Status Device::query_gid(uint8_t port_num, int index, ibv_gid* out) const {
  if (port_num != kPortNum || index < 0 || static_cast<uint32_t>(index) >= kLimits.gid_table_len)
    return Status(EINVAL);
  std::shared_lock lock(gid_mutex_);
  *out = gids_[index];
  return kOk;
}

Status Device::query_pkey(uint8_t port_num, int index, uint16_t* out) const {
  if (port_num != kPortNum || index < 0 || index >= kLimits.pkey_table_len) return Status(EINVAL);
  *out = wire::kDefaultPkey;  // host order; the verbs layer returns it big-endian
  return kOk;
}

Status Device::set_gid(uint32_t index, const ibv_gid& gid) {
  if (index >= kLimits.gid_table_len) return Status(EINVAL);
  std::unique_lock lock(gid_mutex_);
  gids_[index] = gid;
  return kOk;
}

bool Device::sgid_present(uint32_t index) const {
  if (index >= kLimits.gid_table_len) return false;
  std::shared_lock lock(gid_mutex_);
  return !gid_is_zero(gids_[index]);
}

bool Device::has_gid(std::span<const uint8_t, 16> gid) const {
  std::shared_lock lock(gid_mutex_);
  for (const ibv_gid& g : gids_)
    if (std::memcmp(g.raw, gid.data(), sizeof g.raw) == 0 && !gid_is_zero(g)) return true;
  return false;
}

Result<Pd*> Device::alloc_pd() {
  return pds_.create();
}

Status Device::dealloc_pd(Pd* pd) {
  if (pd == nullptr) return Status(EINVAL);
  if (pd->users() != 0) return Status(EBUSY);
  pds_.destroy(pd);
  return kOk;
}

Status Device::dereg_mr(Mr* mr) {
  if (mr == nullptr) return Status(EINVAL);
  const std::optional<uint32_t> dm = mr->dm_handle();
  Status s = released(mr_table_.dereg(mr));
  if (s.ok() && dm) dms_.get(*dm)->remove_user();
  return s;
}

Result<Dm*> Device::alloc_dm(uint64_t length, uint32_t log_align) {
  if (length == 0 || length > kMaxDmBytes || log_align > kDmMaxLogAlign) return Status(EINVAL);
  std::lock_guard lock(dm_mutex_);
  if (length > kMaxDmBytes - dm_bytes_) return Status(ENOMEM);
  uint8_t* host = allocate_dm_memory(length, log_align);
  if (host == nullptr) return Status(ENOMEM);
  Result<Dm*> dm = dms_.create(host, length);
  if (!dm.ok()) {
    std::free(host);
    return dm;
  }
  dm_bytes_ += length;
  return dm;
}

Status Device::free_dm(Dm* dm) {
  if (dm == nullptr) return Status(EINVAL);
  // The kernel's uverbs_free_dm: not while MRs use it.
  if (dm->users() != 0) return Status(EBUSY);
  std::lock_guard lock(dm_mutex_);
  dm_bytes_ -= dm->length();
  dms_.destroy(dm);
  return kOk;
}

uint64_t Device::dm_bytes_in_use() const {
  std::lock_guard lock(dm_mutex_);
  return dm_bytes_;
}

Result<Mr*> Device::reg_dm_mr(Pd* pd, Dm* dm, uint64_t offset, uint64_t length, int access) {
  if (pd == nullptr || dm == nullptr) return Status(EINVAL);
  // libibverbs' ibv_cmd_reg_dm_mr and the kernel: DM MRs are zero based.
  if ((access & IBV_ACCESS_ZERO_BASED) == 0) return Status(EINVAL);
  constexpr int kDmMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                              IBV_ACCESS_ZERO_BASED;
  if ((access & ~kDmMrAccess) != 0) return Status(EINVAL);
  // UVERBS_METHOD_DM_MR_REG: the range inside the DM.
  if (!range_inside(offset, length, 0, dm->length())) return Status(EINVAL);
  Result<Mr*> mr = mr_table_.reg(pd, dm->host() + offset, length, 0, access, dm->handle());
  if (mr.ok()) dm->add_user();
  return mr;
}

Result<Cq*> Device::create_cq(int cqe, CqOptions options) {
  // ibv_create_cq(3): cqe must be at least 1 and at most the device's max_cqe.
  if (cqe < 1 || static_cast<uint32_t>(cqe) > kLimits.max_cqe) return Status(EINVAL);
  options.armed_count = &armed_cqs_;
  return cqs_.create(static_cast<uint32_t>(cqe), &events_, std::move(options));
}

Status Device::destroy_cq(Cq* cq) {
  if (cq == nullptr) return Status(EINVAL);
  if (cq->users() != 0) return Status(EBUSY);
  events_.discard(cq);
  cqs_.destroy(cq);
  return kOk;
}

Status Device::dealloc_xrcd(Xrcd* xrcd) {
  if (xrcd == nullptr) return Status(EINVAL);
  if (xrcd->users() != 0) return Status(EBUSY);
  xrcds_.destroy(xrcd);
  return kOk;
}

Result<Srq*> Device::create_srq(Pd* pd, const ibv_srq_attr& attr,
                                std::shared_ptr<QueueAllocator> allocator, Xrcd* xrcd, Cq* cq,
                                std::optional<SrqTmAttr> tm) {
  if (pd == nullptr) return Status(EINVAL);
  if ((xrcd == nullptr) != (cq == nullptr)) return Status(EINVAL);
  if (Status s = check_srq_init_attr(attr); !s.ok()) return s;
  if (tm) {
    if (xrcd != nullptr) return Status(EINVAL);
    if (Status s = check_srq_tm_attr(*tm); !s.ok()) return s;
  }
  Result<Srq*> srq =
      srqs_.create(pd, attr, &events_, doorbell_, std::move(allocator), xrcd, cq, tm);
  if (!srq.ok()) return srq;
  pd->add_user();
  if (xrcd != nullptr) {
    xrcd->add_user();
    cq->add_user();
  }
  if (tm) tm->cq->add_user();
  return srq;
}

Status Device::destroy_srq(Srq* srq) {
  if (srq == nullptr) return Status(EINVAL);
  if (srq->users() != 0) return Status(EBUSY);
  Pd* pd = srq->pd();
  Xrcd* xrcd = srq->xrcd();
  Cq* cq = srq->cq();
  Cq* tm_cq = srq->tm_cq();
  if (xrcd != nullptr) {
    // No QP holds an XRC SRQ; the engine finds it by number for each request. Once marked, no
    // lookup finds it; srq_destroyed waits for a turn that found it before and drops the WQEs
    // the engine took from it.
    srq->mark_dying();
    doorbell_->srq_destroyed(*srq);
  }
  events_.discard(srq);
  srqs_.destroy(srq);
  pd->remove_user();
  if (xrcd != nullptr) {
    xrcd->remove_user();
    cq->remove_user();
  }
  if (tm_cq != nullptr) tm_cq->remove_user();
  return kOk;
}

Srq* Device::xrc_srq_by_num(uint32_t srq_num) const {
  Srq* srq = srqs_.get(srq_num);
  if (srq == nullptr || srq->type() != IBV_SRQT_XRC || srq->dying()) return nullptr;
  return srq;
}

Result<Qp*> Device::create_qp(const QpInitAttr& init) {
  QpInitAttr rounded = init;
  if (Status s = check_and_round_qp_init(rounded); !s.ok()) return s;
  Result<Qp*> qp = qps_.create(rounded, *this);
  if (!qp.ok()) return qp;
  // An XRC initiator has no receive side, an XRC target no PD and no CQ (its completions go to
  // the CQs of the XRC SRQs it receives into): what a QP does not have it does not count.
  if (rounded.pd != nullptr) rounded.pd->add_user();
  if (rounded.send_cq != nullptr) rounded.send_cq->add_user();
  if (rounded.recv_cq != nullptr) rounded.recv_cq->add_user();
  if (rounded.srq != nullptr) rounded.srq->add_user();
  if (rounded.xrcd != nullptr) rounded.xrcd->add_user();
  return qp;
}

Status Device::destroy_qp(Qp* qp) {
  if (qp == nullptr) return Status(EINVAL);
  // The kernel's uverbs rule (ib_destroy_qp_user: the QP's usecnt, which ib_attach_mcast
  // raises): a QP still attached to a multicast group is in use.
  if (qp->type() == IBV_QPT_UD && mcast_.attached(qp->qp_num())) return Status(EBUSY);
  doorbell_->qp_destroyed(*qp);
  mr_table_.unbind_qp_windows(qp->qp_num());
  Pd* pd = qp->pd();
  Cq* send_cq = qp->send_cq();
  Cq* recv_cq = qp->recv_cq();
  Srq* srq = qp->srq();
  Xrcd* xrcd = qp->xrcd();
  events_.discard(qp);  // after qp_destroyed: the engine raises no more of its events
  qps_.destroy(qp);
  if (pd != nullptr) pd->remove_user();
  if (send_cq != nullptr) send_cq->remove_user();
  if (recv_cq != nullptr) recv_cq->remove_user();
  if (srq != nullptr) srq->remove_user();
  if (xrcd != nullptr) xrcd->remove_user();
  return kOk;
}

Status Device::attach_mcast(Qp* qp, const ibv_gid& gid, bool* added) {
  if (added) *added = false;
  if (qp == nullptr) return Status(EINVAL);
  // ibv_attach_mcast(3): only UD QPs attach (the kernel's ib_attach_mcast: EINVAL).
  if (qp->type() != IBV_QPT_UD) return Status(EINVAL);
  return mcast_.attach(qp->qp_num(), gid, added);
}

Status Device::detach_mcast(Qp* qp, const ibv_gid& gid) {
  if (qp == nullptr) return Status(EINVAL);
  if (qp->type() != IBV_QPT_UD) return Status(EINVAL);
  if (!gid_is_multicast(gid)) return Status(EINVAL);
  return mcast_.detach(qp->qp_num(), gid);
}

Qp* Device::qp_by_num(uint32_t qp_num) const {
  if (qp_num < config_.qpn_base) return nullptr;
  return qps_.get(qp_num - config_.qpn_base);
}

Result<Ah*> Device::create_ah(Pd* pd, const ibv_ah_attr& attr) {
  if (pd == nullptr) return Status(EINVAL);
  Result<AddressVector> av =
      make_address_vector(attr, [this](uint32_t i) { return sgid_present(i); });
  if (!av.ok()) return av.status();
  Result<Ah*> ah = ahs_.create(pd, attr, av.value());
  if (ah.ok()) pd->add_user();
  return ah;
}

Status Device::destroy_ah(Ah* ah) {
  if (ah == nullptr) return Status(EINVAL);
  Pd* pd = ah->pd();
  ahs_.destroy(ah);
  pd->remove_user();
  return kOk;
}

}  // namespace urdma::provider
