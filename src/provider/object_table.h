// Bounded handle tables for provider objects (PD, CQ, QP, SRQ, AH).
//
// Design: at most max_objects slots; an object's handle is its slot index, which the verbs
// layer stores in the `handle` field of the matching ibv_* struct (ibv_pd.handle,
// ibv_ah.handle, ...) the way rdma-core's kernel providers store the kernel's object handle.
// Slots are made as objects need them, so a bound as large as rxe's (2^20 PDs) costs nothing
// until used. Creating past the bound, or when memory runs out, fails with ENOMEM, as a
// device's full table does. Lookups by handle take a shared lock so the posting fast path
// never contends with another reader; create/destroy take it exclusively. Handles never used
// are taken first, in order; freed ones wait in a FIFO after them, so a handle (and the QPN
// derived from it) is reused as late as possible: stray packets for a destroyed QP do not
// reach its successor at once (rxe allocates QPNs cyclically too).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <vector>

#include "provider/status.h"

namespace urdma::provider {

template <class T>
class ObjectTable {
 public:
  explicit ObjectTable(uint32_t max_objects) : max_objects_(max_objects) {}

  // Constructs T(handle, args...) in a free slot.
  template <class... Args>
  Result<T*> create(Args&&... args) {
    std::unique_lock lock(mutex_);
    const bool fresh = slots_.size() < max_objects_;
    if (!fresh && free_.empty()) return Status(ENOMEM);
    const auto handle = fresh ? static_cast<uint32_t>(slots_.size()) : free_.front();
    try {
      auto object = std::make_unique<T>(handle, std::forward<Args>(args)...);
      if (fresh) {
        slots_.push_back(std::move(object));
      } else {
        slots_[handle] = std::move(object);
        free_.pop_front();
      }
    } catch (const std::bad_alloc&) {
      return Status(ENOMEM);
    }
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
  const uint32_t max_objects_;
  mutable std::shared_mutex mutex_;
  std::vector<std::unique_ptr<T>> slots_;
  std::deque<uint32_t> free_;
};

}  // namespace urdma::provider
