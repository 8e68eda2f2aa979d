// XRC domain (ibv_open_xrcd(3), IBA 11.2.x "XRC Domain").
//
// Design: like a PD, an XRC domain is only an identity plus a count of what was created in it
// (XRC SRQs and XRC target QPs); closing it fails with EBUSY while that count is non-zero, as
// the kernel's uverbs does. An XRC target QP accepts a request only for an XRC SRQ of its own
// domain (the engine compares the two Xrcd pointers). Which file names which domain is the
// verbs layer's business (src/verbs/xrc.cc).
#pragma once

#include <atomic>
#include <cstdint>

namespace urdma::provider {

class Xrcd {
 public:
  explicit Xrcd(uint32_t handle) : handle_(handle) {}
  uint32_t handle() const { return handle_; }
  uint32_t users() const { return users_.load(std::memory_order_relaxed); }
  void add_user() { users_.fetch_add(1, std::memory_order_relaxed); }
  void remove_user() { users_.fetch_sub(1, std::memory_order_relaxed); }

  void* user_context = nullptr;  // the verbs layer's ibv_xrcd

 private:
  const uint32_t handle_;
  std::atomic<uint32_t> users_{0};
};

}  // namespace urdma::provider
