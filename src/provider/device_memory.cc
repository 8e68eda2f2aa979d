// Device memory; see device_memory.h.
#include "provider/device_memory.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "provider/mr_table.h"

namespace urdma::provider {

uint8_t* allocate_dm_memory(uint64_t length, uint32_t log_align) {
  const uint64_t align = uint64_t{1} << std::max(log_align, kDmMinLogAlign);
  // aligned_alloc wants a size that is a multiple of the alignment.
  const uint64_t size = (length + align - 1) & ~(align - 1);
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) return nullptr;
  std::memset(p, 0, size);
  return static_cast<uint8_t*>(p);
}

Dm::Dm(uint32_t handle, uint8_t* host, uint64_t length)
    : handle_(handle), host_(host), length_(length) {}

Dm::~Dm() { std::free(host_); }

Status Dm::check_range(uint64_t offset, uint64_t length) const {
  // mlx5_access_dm: the range first (EFAULT), then the 4-byte granularity (EINVAL).
  if (!range_inside(offset, length, 0, length_)) return Status(EFAULT);
  if (offset % kDmAccessUnitBytes != 0 || length % kDmAccessUnitBytes != 0) return Status(EINVAL);
  return kOk;
}

Status Dm::copy_to(uint64_t offset, const void* src, uint64_t length) {
  if (Status s = check_range(offset, length); !s.ok()) return s;
  if (length != 0) std::memcpy(host_ + offset, src, length);
  return kOk;
}

Status Dm::copy_from(void* dst, uint64_t offset, uint64_t length) const {
  if (Status s = check_range(offset, length); !s.ok()) return s;
  if (length != 0) std::memcpy(dst, host_ + offset, length);
  return kOk;
}

}  // namespace urdma::provider
