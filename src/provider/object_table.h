// Bounded handle tables for provider objects (PD, CQ, QP, SRQ, AH).
//
// Design: a fixed number of slots decided at device creation; an object's handle is its slot
// index, which the verbs layer stores in the `handle` field of the matching ibv_* struct
// (ibv_pd.handle, ibv_ah.handle, ...) the way rdma-core's kernel providers store the kernel's
// object handle. Creating past the bound fails with ENOMEM, as a device's full table does.
// Lookups by handle take a shared lock so the posting fast path never contends with another
// reader; create/destroy take it exclusively. Freed handles go to the back of a FIFO, so a
// handle (and the QPN derived from it) is reused as late as possible: stray packets for a
// destroyed QP do not reach its successor at once (rxe allocates QPNs cyclically too).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "provider/status.h"

namespace urdma::provider {

template <class T>
class ObjectTable {
 public:
  explicit ObjectTable(uint32_t max_objects) : slots_(max_objects) {
    for (uint32_t i = 0; i < max_objects; ++i) free_.push_back(i);
  }

  // Constructs T(handle, args...) in a free slot.
  template <class... Args>
  Result<T*> create(Args&&... args) {
    std::unique_lock lock(mutex_);
    if (free_.empty()) return Status(ENOMEM);
    const uint32_t handle = free_.front();
    free_.pop_front();
    slots_[handle] = std::make_unique<T>(handle, std::forward<Args>(args)...);
    return slots_[handle].get();
  }

  // Destroys the object; `object` must come from this table.
  void destroy(T* object) {
    std::unique_lock lock(mutex_);
    const uint32_t handle = object->handle();
    assert(handle < slots_.size() && slots_[handle].get() == object);
    slots_[handle].reset();
    free_.push_back(handle);
  }

  // The live object with this handle, or nullptr.
  T* get(uint32_t handle) const {
    std::shared_lock lock(mutex_);
    return handle < slots_.size() ? slots_[handle].get() : nullptr;
  }

  uint32_t live_count() const {
    std::shared_lock lock(mutex_);
    return static_cast<uint32_t>(slots_.size() - free_.size());
  }

 private:
  mutable std::shared_mutex mutex_;
  std::vector<std::unique_ptr<T>> slots_;
  std::deque<uint32_t> free_;
};

}  // namespace urdma::provider
