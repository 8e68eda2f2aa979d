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
//
// Tag matching (IBV_SRQT_TM: ibv_create_srq_ex(3), ibv_post_srq_ops(3), rdma-core's
// Documentation/tag_matching.md): a TM-SRQ also holds a matching list of tagged buffers, added
// and removed by list operations, and the unexpected-message counter its phase synchronization
// runs on. Operations are validated and queued by the posting thread (post_ops: handles are
// given out there, under `tm_mutex_`), then run by the engine (run_ops_st), which is also the
// only one to match incoming messages against the list (match_st) and to count unexpected ones.
// Every list operation and every tag consumed completes on the TM-SRQ's CQ.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <infiniband/verbs.h>

#include "provider/async_event.h"
#include "provider/cq.h"
#include "provider/pd.h"
#include "provider/queue_memory.h"
#include "provider/work_queue.h"
#include "provider/xrcd.h"

namespace urdma::provider {

class Doorbell;
class Cq;

// The device's tag-matching capabilities (ibv_query_device_ex(3) tm_caps).
// max_rndv_hdr_size: a rendezvous request's TMH + RVH and up to 32 bytes of the sender's own.
inline constexpr uint32_t kTmMaxRndvHdrBytes = 64;
inline constexpr uint32_t kTmMaxNumTags = 1024;
inline constexpr uint32_t kTmMaxOps = 1024;
inline constexpr uint32_t kTmMaxSge = 1;
// The unexpected messages a TM-SRQ takes before an unexpected completion asks for a sync
// (IBV_WC_TM_SYNC_REQ), as mlx5 asks at its counter's 0x3fff.
inline constexpr uint32_t kTmMaxSyncDiff = 0x3fff;

// ibv_create_srq_ex with IBV_SRQT_TM.
struct SrqTmAttr {
  uint32_t max_num_tags = 0;
  uint32_t max_ops = 0;
  Cq* cq = nullptr;  // where list operations and matched messages complete
};

// A tagged buffer the engine matched (match_st): where the message goes and what its
// completions carry.
struct TagMatch {
  uint32_t handle = 0;
  uint64_t wr_id = 0;  // the ADD's recv_wr_id
  RecvWork buffer;     // the tagged buffer's SGEs
};

class Srq {
 public:
  // Use Device::create_srq, which validates the attributes.
  // Its queue (and the queue a resize makes) from `allocator` (queue_memory.h; null: malloc).
  // `xrcd` and `cq` are set for an XRC SRQ and null otherwise; `tm` for a tag-matching SRQ.
  Srq(uint32_t handle, Pd* pd, const ibv_srq_attr& attr, AsyncEventQueue* events,
      Doorbell* doorbell, std::shared_ptr<QueueAllocator> allocator = nullptr,
      Xrcd* xrcd = nullptr, Cq* cq = nullptr, std::optional<SrqTmAttr> tm = std::nullopt);

  uint32_t handle() const { return handle_; }
  Pd* pd() const { return pd_; }
  ibv_srq_type type() const {
    return xrcd_ != nullptr ? IBV_SRQT_XRC : tm_ ? IBV_SRQT_TM : IBV_SRQT_BASIC;
  }
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

  // ---- tag matching (a TM-SRQ; tm() false for a basic one) ----
  bool tm() const { return tm_.has_value(); }
  Cq* tm_cq() const { return tm_ ? tm_->cq : nullptr; }
  uint32_t max_num_tags() const { return tm_ ? tm_->max_num_tags : 0; }
  // ibv_post_srq_ops: each WR is validated (EINVAL: unknown opcode or flags, more SGEs than
  // kTmMaxSge, a DEL of a handle beyond max_num_tags; ENOMEM: no free handle
  // for an ADD, or more than max_ops operations waiting), an ADD gets its handle
  // (wr->tm.handle), and the operations are queued for the engine, which runs them before
  // this returns when an engine is attached (Doorbell::srq_ops_posted). EOPNOTSUPP on a basic
  // SRQ. *bad_wr names the failing WR; those before it are posted.
  Status post_ops(ibv_ops_wr* wr, ibv_ops_wr** bad_wr);

  // ---- engine thread ----
  bool take_st(RecvWork& out);
  uint32_t size() const;
  // Runs the queued list operations in order, each completing on the TM-SRQ's CQ when
  // signaled (IBV_OPS_SIGNALED) or failed: IBV_WC_TM_ADD / TM_DEL / TM_SYNC, with
  // IBV_WC_TM_SYNC_REQ when the operation's unexpected count is not the SRQ's. A DEL of a
  // handle whose tag is not on the list — consumed by a message meanwhile — completes with
  // IBV_WC_TM_ERR (ibv_post_srq_ops(3)).
  void run_ops_st();
  // Matching (Documentation/tag_matching.md): the earliest added tag that is enabled and whose
  // mask selects the same bits, (tag & mask) == (entry.tag & entry.mask), is taken off the list
  // and returned; its handle stays reserved until release_tag_st. nullopt: unexpected.
  std::optional<TagMatch> match_st(uint64_t tag);
  // The consumed tag's last completion was generated: its handle may be given out again.
  void release_tag_st(uint32_t handle);
  // An unexpected message arrived (delivered to an ordinary WQE): counts it. Returns true when
  // its completion should ask for a sync (IBV_WC_TM_SYNC_REQ).
  bool count_unexpected_st();
  uint32_t unexpected_count() const;

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

  // Tag matching. `slots_` is indexed by handle; the matching list runs through next/prev in
  // the order tags were added. A handle is kFree, reserved by a queued ADD (kPosted), on the
  // list (kListed), or consumed by a message whose completions are not all generated
  // (kConsumed).
  enum class TagState : uint8_t { kFree, kPosted, kListed, kConsumed };
  struct TagSlot {
    TagState state = TagState::kFree;
    bool enabled = false;  // matches messages (false: added while out of sync)
    uint64_t tag = 0;
    uint64_t mask = 0;
    uint64_t wr_id = 0;
    uint32_t num_sge = 0;
    ibv_sge sge[kTmMaxSge] = {};
    uint32_t prev = kNone;
    uint32_t next = kNone;
  };
  struct PendingOp {
    uint64_t wr_id;
    ibv_ops_wr_opcode opcode;
    int flags;
    uint32_t unexpected_cnt;
    uint32_t handle;
  };
  static constexpr uint32_t kNone = UINT32_MAX;
  void unlink(uint32_t handle);
  const std::optional<SrqTmAttr> tm_;
  mutable std::mutex tm_mutex_;          // slots_' states and free list, ops_
  std::vector<TagSlot> slots_;           // max_num_tags
  // Oldest freed first, so a handle comes back as late as possible: a DEL racing the
  // consumption of its tag finds it still unused (IBV_WC_TM_ERR), not someone's new tag.
  std::deque<uint32_t> free_handles_;
  std::vector<PendingOp> ops_;           // queued by post_ops, run by run_ops_st
  std::vector<PendingOp> running_ops_;   // engine: the batch run_ops_st took
  uint32_t list_head_ = kNone;           // engine (with tm_mutex_ for the states)
  uint32_t list_tail_ = kNone;
  uint32_t hw_unexpected_ = 0;           // engine: unexpected messages counted
  uint32_t sw_unexpected_ = 0;           // engine: the count the last IBV_OPS_TM_SYNC op gave
};

// Validates ibv_create_srq attributes against the device limits (EINVAL).
Status check_srq_init_attr(const ibv_srq_attr& attr);
// Validates a TM-SRQ's attributes: max_num_tags and max_ops in 1 .. the device's, a CQ (EINVAL).
Status check_srq_tm_attr(const SrqTmAttr& attr);

}  // namespace urdma::provider
