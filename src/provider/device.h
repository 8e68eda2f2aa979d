// The device: owner of every provider object, its limits and its port.
//
// Design: one `Device` per opened ibv_context. It owns bounded tables of PDs, CQs, SRQs, QPs
// and AHs (ObjectTable: handle = slot) and the MR/MW key table, the port's GID table, the
// async event queue, and the doorbell to the engine. Every verb of the ops table maps 1:1 to a
// method here or on the object (post_send on Qp, poll on Cq, ...), returning Status/Result
// with rdma-core's errno. Destroying an object still in use fails with EBUSY (the kernel's
// uverbs usecnt rule): a PD with MRs/MWs/QPs/SRQs/AHs, a CQ or SRQ with QPs. An MR with bound
// windows is the exception: EINVAL, as rxe (IBA 10.6.7.2.6).
//
// The engine thread registers itself (set_engine_thread) so that `_st` methods can assert
// they run on it in debug builds.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <thread>
#include <vector>

#include <infiniband/verbs.h>

#include "provider/ah.h"
#include "provider/async_event.h"
#include "provider/cq.h"
#include "provider/device_memory.h"
#include "provider/doorbell.h"
#include "provider/limits.h"
#include "provider/mcast_table.h"
#include "provider/mr_table.h"
#include "provider/object_table.h"
#include "provider/pd.h"
#include "provider/qp.h"
#include "provider/srq.h"
#include "provider/xrcd.h"

namespace urdma::provider {

struct DeviceConfig {
  // QPNs are qpn_base + handle; urdmad hands each process a QPN range that steers to its
  // socket. QP0/QP1 are never allocated here (the CM owns QP1).
  uint32_t qpn_base = 0x11;
  // Largest MTU the device supports and the one the interface allows (an Ethernet MTU of 1500
  // gives IBV_MTU_1024, as rxe computes it); path_mtu above active_mtu is EINVAL.
  ibv_mtu max_mtu = IBV_MTU_4096;
  ibv_mtu active_mtu = IBV_MTU_1024;
  uint64_t node_guid_be = 0;
  std::vector<ibv_gid> gids;     // port 1 GID table, index = sgid_index
  Doorbell* doorbell = nullptr;  // nullptr: a do-nothing doorbell
  // Seeds MR/MW key generation (MrTable) so a deterministic simulation replays the same keys.
  // nullopt (every real device): keys drawn from std::random_device, unguessable by a peer.
  std::optional<uint64_t> key_seed;
};

class Device {
 public:
  explicit Device(DeviceConfig config = {});
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // ---- device and port ----
  const ibv_device_attr& attr() const { return attr_; }
  Status query_port(uint8_t port_num, ibv_port_attr* out) const;
  Status query_gid(uint8_t port_num, int index, ibv_gid* out) const;
  Status query_pkey(uint8_t port_num, int index, uint16_t* out) const;
  // urdmad updates the GID table as interface addresses come and go. An all-zero GID clears.
  Status set_gid(uint32_t index, const ibv_gid& gid);
  bool sgid_present(uint32_t index) const;
  // Is `gid` in the port's GID table (an address of this host)?
  bool has_gid(std::span<const uint8_t, 16> gid) const;
  ibv_mtu active_mtu() const { return config_.active_mtu; }
  uint32_t qpn_base() const { return config_.qpn_base; }
  AsyncEventQueue& async_events() { return events_; }
  Doorbell& doorbell() { return *doorbell_; }
  MrTable& mr_table() { return mr_table_; }

  // ---- PD ----
  Result<Pd*> alloc_pd();
  Status dealloc_pd(Pd* pd);
  Pd* pd_by_handle(uint32_t handle) const { return pds_.get(handle); }

  // ---- MR / MW (ibv_reg_mr passes iova = addr) ----
  Result<Mr*> reg_mr(Pd* pd, void* addr, uint64_t length, uint64_t iova, int access) {
    return mr_table_.reg(pd, addr, length, iova, access);
  }
  Status rereg_mr(Mr* mr, int flags, Pd* pd, void* addr, uint64_t length, uint64_t iova,
                  int access) {
    return released(mr_table_.rereg(mr, flags, pd, addr, length, iova, access));
  }
  // An MR over device memory lets go of its DM once deregistered.
  Status dereg_mr(Mr* mr);
  Result<Mw*> alloc_mw(Pd* pd, ibv_mw_type type) { return mr_table_.alloc_mw(pd, type); }
  Status dealloc_mw(Mw* mw) { return released(mr_table_.dealloc_mw(mw)); }

  // ---- device memory (ibv_alloc_dm(3); device_memory.h) ----
  // EINVAL: length 0 or above kMaxDmBytes, log_align above kDmMaxLogAlign; ENOMEM: the rest of
  // the device's DM budget is too small, or no memory.
  Result<Dm*> alloc_dm(uint64_t length, uint32_t log_align);
  // EBUSY while MRs are registered over it.
  Status free_dm(Dm* dm);
  Dm* dm_by_handle(uint32_t handle) const { return dms_.get(handle); }
  // ibv_reg_dm_mr: a zero-based MR over [offset, offset + length) of the DM. EINVAL: access
  // without IBV_ACCESS_ZERO_BASED or with rights a DM MR cannot have (MW_BIND, ON_DEMAND,
  // HUGETLB: mlx5's MLX5_DM_ALLOWED_ACCESS), the range outside the DM (the kernel's check).
  Result<Mr*> reg_dm_mr(Pd* pd, Dm* dm, uint64_t offset, uint64_t length, int access);
  uint64_t dm_bytes_in_use() const;

  // ---- CQ ----
  // EINVAL for cqe < 1 or above max_cqe (ibv_create_cq(3)), ENOMEM when the table is full or
  // the ring cannot be allocated.
  Result<Cq*> create_cq(int cqe, CqOptions options = {});
  Status destroy_cq(Cq* cq);
  Cq* cq_by_handle(uint32_t handle) const { return cqs_.get(handle); }
  // CQs armed for an event and not yet fired (Cq::req_notify).
  uint32_t armed_cqs() const { return armed_cqs_.load(std::memory_order_seq_cst); }

  // ---- XRC domain ----
  Result<Xrcd*> alloc_xrcd() { return xrcds_.create(); }
  // EBUSY while an XRC SRQ or XRC target QP uses it.
  Status dealloc_xrcd(Xrcd* xrcd);
  Xrcd* xrcd_by_handle(uint32_t handle) const { return xrcds_.get(handle); }

  // ---- SRQ ----
  // The queue from `allocator` (queue_memory.h; null: malloc). An XRC SRQ names its XRC domain
  // and CQ (both or neither: EINVAL). `tm`: a tag-matching SRQ (IBV_SRQT_TM), its attributes
  // checked by check_srq_tm_attr; its CQ is in use while it lives.
  Result<Srq*> create_srq(Pd* pd, const ibv_srq_attr& attr,
                          std::shared_ptr<QueueAllocator> allocator = nullptr,
                          Xrcd* xrcd = nullptr, Cq* cq = nullptr,
                          std::optional<SrqTmAttr> tm = std::nullopt);
  Status destroy_srq(Srq* srq);
  Srq* srq_by_handle(uint32_t handle) const { return srqs_.get(handle); }
  // The engine's lookup of an XRCETH's SRQ number: a live XRC SRQ, or nullptr.
  Srq* xrc_srq_by_num(uint32_t srq_num) const;

  // ---- QP ----
  // `init.cap` is rounded; the result's cap() is what ibv_create_qp reports back.
  Result<Qp*> create_qp(const QpInitAttr& init);
  Status destroy_qp(Qp* qp);
  Qp* qp_by_handle(uint32_t handle) const { return qps_.get(handle); }
  // QPs alive now (created, not destroyed): `urdma status`. Any thread.
  uint32_t qp_count() const { return qps_.live_count(); }
  // The engine's demux: the QP with this number, or nullptr.
  Qp* qp_by_num(uint32_t qp_num) const;

  // ---- multicast (ibv_attach_mcast(3), mcast_table.h) ----
  // EINVAL: not a UD QP, not a multicast GID, or (detach) not attached to it; ENOMEM: a bound.
  // *added: this call attached it (false when it was attached already). A QP attached to a
  // group cannot be destroyed (EBUSY) until it is detached.
  Status attach_mcast(Qp* qp, const ibv_gid& gid, bool* added = nullptr);
  Status detach_mcast(Qp* qp, const ibv_gid& gid);
  const McastTable& mcast() const { return mcast_; }

  // ---- AH ----
  Result<Ah*> create_ah(Pd* pd, const ibv_ah_attr& attr);
  Status destroy_ah(Ah* ah);
  Ah* ah_by_handle(uint32_t handle) const { return ahs_.get(handle); }

  // ---- engine thread identity ----
  void set_engine_thread() { engine_thread_.store(std::this_thread::get_id()); }
  // True when no engine thread is registered (tests) or when called on it.
  bool on_engine_thread() const {
    const std::thread::id id = engine_thread_.load();
    return id == std::thread::id() || id == std::this_thread::get_id();
  }

 private:
  // After a successful dereg/rereg/dealloc: the verb returns only once the engine can no longer
  // touch the memory the old entry named (Doorbell::memory_released).
  Status released(Status s) {
    if (s.ok()) doorbell_->memory_released();
    return s;
  }

  DeviceConfig config_;
  ibv_device_attr attr_ = {};
  Doorbell default_doorbell_;
  Doorbell* doorbell_;
  AsyncEventQueue events_;
  std::atomic<uint32_t> armed_cqs_{0};  // before cqs_: a CQ destroyed with the device counts down
  mutable std::shared_mutex gid_mutex_;
  std::vector<ibv_gid> gids_;
  MrTable mr_table_;
  ObjectTable<Pd> pds_;
  ObjectTable<Cq> cqs_;
  ObjectTable<Srq> srqs_;
  ObjectTable<Xrcd> xrcds_;
  ObjectTable<Qp> qps_;
  ObjectTable<Ah> ahs_;
  ObjectTable<Dm> dms_;
  McastTable mcast_;
  mutable std::mutex dm_mutex_;
  uint64_t dm_bytes_ = 0;  // allocated of kMaxDmBytes, under dm_mutex_
  std::atomic<std::thread::id> engine_thread_{};
};

}  // namespace urdma::provider
