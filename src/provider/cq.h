// Completion queue.
//
// Design: completions are `ibv_wc` records (every field the verbs consumer sees), each with the
// time it was generated when the CQ was created to carry one (`Completion`), in an SpscRing. The
// engine thread is the only producer (push_st); pollers are consumers, serialised by `poll_mutex_`
// because several application threads may call ibv_poll_cq on one CQ. Resize takes both the
// producer and the poll lock and moves the pending entries to a new ring. The producer lock is
// uncontended except during resize.
//
// Overflow (IBA 11.4.2.1, CQ overrun): a completion that does not fit is lost, the CQ enters the
// error state and one IBV_EVENT_CQ_ERR async event is raised; entries already present stay
// pollable.
//
// A QP moved to RESET takes its completions that nobody polled with it (discard_qp): a QP
// brought back from ERR through RESET does not hand its next poller the flushes of before.
//
// Timestamps (ibv_create_cq_ex(3): IBV_WC_EX_WITH_COMPLETION_TIMESTAMP[_WALLCLOCK]): a CQ asked
// for them stamps each completion as the engine pushes it, which is when a device writes its
// CQE. The device clock is CLOCK_MONOTONIC in nanoseconds (completion_clock.h says why); the
// wall clock is CLOCK_REALTIME in nanoseconds since the epoch. A CQ not asked for them reads no
// clock.
//
// The ring comes from the CQ's QueueAllocator (a parent domain's, queue_memory.h) or malloc.
//
// Notification (IBA 11.4.2.2, ibv_req_notify_cq(3)): req_notify arms the CQ for the next
// completion or for the next solicited (or unsuccessful) completion; the first matching push
// disarms it and calls the notify hook (the completion channel), once per arming. The device
// counts its armed CQs (Device::armed_cqs): an armed CQ means a thread may sleep on its channel's
// fd, out of the runtime's sight (runtime.h, NAPPING).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include <infiniband/verbs.h>

#include "provider/async_event.h"
#include "provider/queue_memory.h"
#include "provider/spsc_ring.h"
#include "provider/status.h"

namespace urdma::provider {

// A completion as the ring holds it: one cache line.
struct Completion {
  ibv_wc wc;
  uint64_t completion_ts;  // device clock (ns), when the CQ stamps completions, else 0
  uint64_t wallclock_ns;   // CLOCK_REALTIME (ns since the epoch), when stamped, else 0
};
static_assert(sizeof(Completion) == 64);

// Tag matching (ibv_wc_read_tm_info): a completion of a tag-matching SRQ (opcodes
// IBV_WC_TM_*) carries the TMH's tag and user data. The record keeps its 64 bytes: they travel in
// ibv_wc fields that have no meaning on such a completion — tag matching is RC only, and
// src_qp, slid and pkey_index are defined for UD and GSI QPs alone; vendor_err only for a
// failed completion, whose tag information is zero. src_qp holds the tag's high 32 bits, slid
// and pkey_index its low 32, vendor_err the user data. scrub_tm_info clears them again for a
// reader of plain ibv_wc records (ibv_poll_cq).
struct TmInfo {
  uint64_t tag = 0;
  uint32_t priv = 0;
};
inline bool is_tm_opcode(ibv_wc_opcode opcode) {
  return opcode == IBV_WC_TM_ADD || opcode == IBV_WC_TM_DEL || opcode == IBV_WC_TM_SYNC ||
         opcode == IBV_WC_TM_RECV || opcode == IBV_WC_TM_NO_TAG;
}
inline void set_tm_info(ibv_wc& wc, TmInfo info) {
  wc.src_qp = static_cast<uint32_t>(info.tag >> 32);
  wc.slid = static_cast<uint16_t>(info.tag >> 16);
  wc.pkey_index = static_cast<uint16_t>(info.tag);
  wc.vendor_err = info.priv;
}
inline TmInfo tm_info(const ibv_wc& wc) {
  if (!is_tm_opcode(wc.opcode) || wc.status != IBV_WC_SUCCESS) return {};
  return {.tag = (uint64_t{wc.src_qp} << 32) | (uint64_t{wc.slid} << 16) | wc.pkey_index,
          .priv = wc.vendor_err};
}
inline void scrub_tm_info(ibv_wc& wc) {
  if (!is_tm_opcode(wc.opcode)) return;
  wc.src_qp = 0;
  wc.slid = 0;
  wc.pkey_index = 0;
  wc.vendor_err = 0;
}

struct CqOptions {
  bool completion_timestamp = false;          // stamp completion_ts
  bool wallclock_timestamp = false;           // stamp wallclock_ns
  std::shared_ptr<QueueAllocator> allocator;  // null: the ring from malloc
  std::atomic<uint32_t>* armed_count = nullptr;  // the device's armed CQs (Device::create_cq)
};

class Cq {
 public:
  // Use Device::create_cq, which checks `cqe` against the device limits.
  Cq(uint32_t handle, uint32_t cqe, AsyncEventQueue* events, CqOptions options = {});
  ~Cq();
  Cq(const Cq&) = delete;
  Cq& operator=(const Cq&) = delete;

  uint32_t handle() const { return handle_; }
  // The usable size reported in ibv_cq.cqe (>= the requested size).
  uint32_t cqe() const;
  bool in_error() const { return error_.load(std::memory_order_acquire); }
  uint32_t users() const { return users_.load(std::memory_order_relaxed); }
  void add_user() { users_.fetch_add(1, std::memory_order_relaxed); }
  void remove_user() { users_.fetch_sub(1, std::memory_order_relaxed); }

  // ---- consumer (ibv_poll_cq) ----
  // Copies up to `max_entries` completions out, oldest first; returns how many.
  int poll(int max_entries, ibv_wc* out);
  // The same with the completions' timestamps (ibv_cq_ex).
  int poll(int max_entries, Completion* out);
  // ibv_req_notify_cq: arm for the next completion, or only a solicited/error one.
  void req_notify(bool solicited_only);
  bool armed() const { return arm_.load(std::memory_order_relaxed) != kDisarmed; }
  // The completion channel hook: called from the engine thread when an armed CQ fires.
  void set_notify(std::function<void(Cq&)> notify);
  // ibv_resize_cq: EINVAL if `cqe` is 0, above the device limit, or below the entries present;
  // ENOMEM when the new ring cannot be allocated.
  Status resize(uint32_t cqe);
  // A QP of this CQ moved to RESET: its completions not yet polled are removed, the others
  // stay in order (what mlx4, mlx5, mthca and hns do in their modify_qp). Returns how many.
  uint32_t discard_qp(uint32_t qp_num);

  // ---- engine thread ----
  // Appends a completion. `solicited` is the SE bit of the message that produced a receive
  // completion. Returns false (and the CQ is in error) on overflow.
  bool push_st(const ibv_wc& wc, bool solicited);
  // Entries present (a snapshot).
  uint32_t size() const;
  // Where the ring is (tests: which memory the CQ uses).
  const void* ring_data() const;

  void* user_context = nullptr;  // the verbs layer's ibv_cq

 private:
  enum Arm : uint8_t { kDisarmed, kArmedNext, kArmedSolicited };

  const uint32_t handle_;
  AsyncEventQueue* const events_;
  const CqOptions options_;
  mutable std::mutex producer_mutex_;
  mutable std::mutex poll_mutex_;
  std::unique_ptr<SpscRing<Completion>> ring_;  // replaced only under both locks
  std::atomic<bool> error_{false};
  std::atomic<uint8_t> arm_{kDisarmed};
  std::atomic<uint32_t> users_{0};
  std::mutex notify_mutex_;
  std::function<void(Cq&)> notify_;
};

}  // namespace urdma::provider
