// Device memory (ibv_alloc_dm(3)): buffers the device owns, reached by the application only
// through ibv_memcpy_to_dm / ibv_memcpy_from_dm and by the device through zero-based MRs
// (ibv_reg_dm_mr).
//
// Design
// * A software device's "device memory" is host memory the device allocates and never shows the
//   application: the DM's address stays hidden (rdma-core's DM MRs are zero based for that
//   reason), so the only ways in are the copies and the MRs, as on hardware. The engine reaches
//   it like any registered memory, through the MR table.
// * Budget: kMaxDmBytes for the whole device (the process), what ibv_query_device_ex reports as
//   max_dm_size; an allocation that does not fit in what is left fails with ENOMEM, a request
//   above the budget with EINVAL (mlx5's provider checks the size against max_dm_size first).
// * Alignment: the buffer starts at a multiple of 2^log_align_req, at least 64 bytes (so an
//   atomic on a DM MR is as aligned as its offset); log_align_req above 12 (a page) is EINVAL,
//   as mlx5 refuses an alignment beyond its limit.
// * Copies follow mlx5 (providers/mlx5/verbs.c, mlx5_access_dm): a range outside the DM is
//   EFAULT, an offset or a length not a multiple of 4 is EINVAL (device memory is accessed in
//   4-byte words); the check is overflow-safe.
// * An MR over a DM holds it: ibv_free_dm while MRs use it is EBUSY (the kernel's usecnt rule).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "provider/status.h"

namespace urdma::provider {

// The device's device memory: ConnectX-6's MEMIC size.
inline constexpr uint64_t kMaxDmBytes = 256 * 1024;
inline constexpr uint32_t kDmMinLogAlign = 6;   // 64 bytes
inline constexpr uint32_t kDmMaxLogAlign = 12;  // a page
inline constexpr uint64_t kDmAccessUnitBytes = 4;

class Dm {
 public:
  // `host` was allocated with the alignment asked for; the Dm frees it.
  Dm(uint32_t handle, uint8_t* host, uint64_t length);
  ~Dm();
  Dm(const Dm&) = delete;
  Dm& operator=(const Dm&) = delete;

  uint32_t handle() const { return handle_; }
  uint64_t length() const { return length_; }
  uint8_t* host() const { return host_; }

  // ibv_memcpy_to_dm / ibv_memcpy_from_dm: EFAULT outside the DM, EINVAL unaligned.
  Status copy_to(uint64_t offset, const void* src, uint64_t length);
  Status copy_from(void* dst, uint64_t offset, uint64_t length) const;

  // MRs registered over this DM.
  uint32_t users() const { return users_.load(std::memory_order_relaxed); }
  void add_user() { users_.fetch_add(1, std::memory_order_relaxed); }
  void remove_user() { users_.fetch_sub(1, std::memory_order_relaxed); }

  void* user_context = nullptr;  // the verbs layer's ibv_dm

 private:
  Status check_range(uint64_t offset, uint64_t length) const;

  const uint32_t handle_;
  uint8_t* const host_;
  const uint64_t length_;
  std::atomic<uint32_t> users_{0};
};

// Rounds `length` up to whole allocation units and allocates it zeroed, aligned to
// 2^max(log_align, kDmMinLogAlign); nullptr when memory ran out.
uint8_t* allocate_dm_memory(uint64_t length, uint32_t log_align);

}  // namespace urdma::provider
