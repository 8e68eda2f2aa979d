// Shared receive queue.
//
// Design: a RecvQueue shared by several QPs. Application threads post under `post_mutex_`;
// the engine thread takes WQEs under `take_mutex_` (uncontended except against a resize,
// which holds both). Limit arming (IBA 10.2.9.2 / 11.5.2.2, ibv_modify_srq(3)): when a take
// leaves fewer WQEs than the armed limit, one IBV_EVENT_SRQ_LIMIT_REACHED is raised and the
// SRQ disarms; the application re-arms with ibv_modify_srq(IBV_SRQ_LIMIT).
//
// XRC SRQs (IBV_SRQT_XRC, ibv_create_srq_ex(3)) also name an XRC domain and a CQ: no QP is
// attached to them; an XRC target QP of the same domain takes their WQEs for the requests whose
// XRCETH names their SRQ number (srq_num(), ibv_get_srq_num(3)), and the completions go to the
// SRQ's CQ. Their memory accesses are checked against the SRQ's PD (IBA 11.2.x, XRC).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include <infiniband/verbs.h>

#include "provider/async_event.h"
#include "provider/cq.h"
#include "provider/pd.h"
#include "provider/queue_memory.h"
#include "provider/work_queue.h"
#include "provider/xrcd.h"

namespace urdma::provider {

class Doorbell;

class Srq {
 public:
  // Use Device::create_srq, which validates the attributes.
  // Its queue (and the queue a resize makes) from `allocator` (queue_memory.h; null: malloc).
  // `xrcd` and `cq` are set for an XRC SRQ and null for a basic one.
  Srq(uint32_t handle, Pd* pd, const ibv_srq_attr& attr, AsyncEventQueue* events,
      Doorbell* doorbell, std::shared_ptr<QueueAllocator> allocator = nullptr,
      Xrcd* xrcd = nullptr, Cq* cq = nullptr);

  uint32_t handle() const { return handle_; }
  Pd* pd() const { return pd_; }
  ibv_srq_type type() const { return xrcd_ != nullptr ? IBV_SRQT_XRC : IBV_SRQT_BASIC; }
  Xrcd* xrcd() const { return xrcd_; }
  Cq* cq() const { return cq_; }
  // The 24-bit number an XRCETH names this SRQ by: its handle (below 2^20, kLimits.max_srq).
  uint32_t srq_num() const { return handle_; }
  // Device::destroy_srq marks an XRC SRQ before it waits for the engine: from then on the
  // engine's lookup by number (Device::xrc_srq_by_num) no longer finds it.
  bool dying() const { return dying_.load(std::memory_order_acquire); }
  void mark_dying() { dying_.store(true, std::memory_order_release); }
  uint32_t users() const { return users_.load(std::memory_order_relaxed); }
  void add_user() { users_.fetch_add(1, std::memory_order_relaxed); }
  void remove_user() { users_.fetch_sub(1, std::memory_order_relaxed); }

  // Where the queue is (tests: which memory the SRQ uses).
  const void* ring_data() const { return queue_->ring_data(); }

  // ibv_post_srq_recv: EINVAL (too many SGEs) or ENOMEM (full); *bad_wr names the failing WR.
  Status post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  // ibv_modify_srq: IBV_SRQ_MAX_WR resizes (EINVAL below the WQEs present or above the
  // device limit; ENOMEM when the new queue cannot be allocated), IBV_SRQ_LIMIT arms (EINVAL
  // above max_wr; 0 disarms).
  Status modify(const ibv_srq_attr& attr, int mask);
  // ibv_query_srq.
  ibv_srq_attr query() const;

  // ---- engine thread ----
  bool take_st(RecvWork& out);
  uint32_t size() const;

  void* user_context = nullptr;  // the verbs layer's ibv_srq

 private:
  const uint32_t handle_;
  Pd* const pd_;
  AsyncEventQueue* const events_;
  Doorbell* const doorbell_;
  const std::shared_ptr<QueueAllocator> allocator_;
  Xrcd* const xrcd_;
  Cq* const cq_;
  std::atomic<bool> dying_{false};
  mutable std::mutex post_mutex_;
  mutable std::mutex take_mutex_;
  std::unique_ptr<RecvQueue> queue_;  // replaced only under both locks
  uint32_t limit_ = 0;                // guarded by take_mutex_; 0 = disarmed
  std::atomic<uint32_t> users_{0};
};

// Validates ibv_create_srq attributes against the device limits (EINVAL).
Status check_srq_init_attr(const ibv_srq_attr& attr);

}  // namespace urdma::provider
