// Protection domain.
//
// Design: a PD is only an identity plus a count of the objects created in it (MR, MW, QP,
// SRQ, AH); ibv_dealloc_pd fails with EBUSY while that count is non-zero, as the kernel's
// uverbs does.
#pragma once

#include <atomic>
#include <cstdint>

namespace urdma::provider {

class Pd {
 public:
  explicit Pd(uint32_t handle) : handle_(handle) {}
  uint32_t handle() const { return handle_; }
  uint32_t users() const { return users_.load(std::memory_order_relaxed); }
  void add_user() { users_.fetch_add(1, std::memory_order_relaxed); }
  void remove_user() { users_.fetch_sub(1, std::memory_order_relaxed); }

  void* user_context = nullptr;  // the verbs layer's ibv_pd

 private:
  const uint32_t handle_;
  std::atomic<uint32_t> users_{0};
};

}  // namespace urdma::provider
