// Queue buffers and who allocates them.
//
// Design: the rings a CQ, QP or SRQ is made of (and their per-slot side areas) are the
// provider's "queue buffers", what a hardware provider would hand to its device. By default
// they come from malloc, which writes nothing: a ring sized for 2^20 WRs costs pages only as
// entries are written. An object created under a parent domain with allocators
// (ibv_alloc_parent_domain(3)) takes them from the application instead, through a
// QueueAllocator the verbs layer builds over the application's alloc/free callbacks; the
// allocator may also answer "use the default", and then malloc it is. Every buffer remembers
// where it came from, so it goes back to the same place (the application's free only gets what
// its alloc returned).
//
// The buffers hold trivially copyable entries only (implicit-lifetime objects, C++20): the
// memory an allocator returns becomes the array without a constructor running.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace urdma::provider {

// What a buffer is for; the verbs layer turns it into the allocator's resource_type. The codes
// follow mlx5's MLX5DV_RES_TYPE_* numbering where the resource is the same.
enum class QueueBuffer : uint32_t {
  kQp = 1,   // a QP's send queue ring and its side area (SGE lists, inline data)
  kRq = 2,   // a QP's own receive queue ring and its SGE area
  kSrq = 4,  // an SRQ's receive queue ring and its SGE area
  kCq = 5,   // a CQ's completion ring
};

// Alignment asked of an application allocator: a cache line, so a ring shares no line with
// whatever the application put next to it (producer and consumer are different threads).
inline constexpr size_t kQueueBufferAlignment = 64;

class QueueAllocator {
 public:
  struct Allocation {
    void* ptr = nullptr;       // null (and !use_default): no memory
    bool use_default = false;  // the allocator declined: allocate with malloc
  };
  virtual ~QueueAllocator() = default;
  // `bytes` with the given alignment (a power of two). Never called with 0 bytes.
  virtual Allocation allocate(size_t bytes, size_t alignment, QueueBuffer type) = 0;
  // Gives back what allocate returned (not called for use_default buffers).
  virtual void release(void* ptr, QueueBuffer type) = 0;
};

// Frees a queue buffer where it came from: `allocator` null means malloc.
struct QueueBufferDeleter {
  std::shared_ptr<QueueAllocator> allocator;
  QueueBuffer type = QueueBuffer::kCq;
  void operator()(void* p) const {
    if (p == nullptr) return;
    if (allocator)
      allocator->release(p, type);
    else
      std::free(p);
  }
};

template <class T>
using QueueArray = std::unique_ptr<T[], QueueBufferDeleter>;

// n entries of T, from `allocator` when there is one (and it does not decline), else from
// malloc. Neither writes a byte. Throws std::bad_alloc when there is no memory.
template <class T>
QueueArray<T> make_queue_array(size_t n, const std::shared_ptr<QueueAllocator>& allocator,
                               QueueBuffer type) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(alignof(T) <= alignof(std::max_align_t) && alignof(T) <= kQueueBufferAlignment);
  const size_t bytes = n * sizeof(T);
  if (bytes == 0) return QueueArray<T>(nullptr, QueueBufferDeleter{nullptr, type});
  if (allocator) {
    QueueAllocator::Allocation a = allocator->allocate(bytes, kQueueBufferAlignment, type);
    if (!a.use_default) {
      if (a.ptr == nullptr) throw std::bad_alloc();
      return QueueArray<T>(static_cast<T*>(a.ptr), QueueBufferDeleter{allocator, type});
    }
  }
  T* p = static_cast<T*>(std::malloc(bytes));
  if (p == nullptr) throw std::bad_alloc();
  return QueueArray<T>(p, QueueBufferDeleter{nullptr, type});
}

}  // namespace urdma::provider
