// Single-producer / single-consumer ring, liburing style.
//
// Design: a power-of-two array of trivially copyable entries with two free-running 32-bit
// indices (`tail_` written only by the producer, `head_` written only by the consumer),
// masked on access, so `tail_ - head_` is the fill level even across wrap-around. The two
// indices live on separate cache lines so producer and consumer never false-share. The
// usable capacity is slots - 1, which is what the provider reports back to the consumer
// (rxe reports 2^k - 1 the same way).
//
// Who is the producer / consumer is the owner's business: SQ/RQ/SRQ rings are produced by a
// posting thread (serialised by the owner's mutex) and consumed by the engine thread; the CQ
// ring is produced by the engine thread and consumed by the polling thread.
#pragma once

#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>

#include "provider/queue_memory.h"

namespace urdma::provider {

inline constexpr size_t kCacheLineBytes = 64;

// The usable capacity of a ring that must hold at least `n` entries: 2^k - 1 >= n.
inline constexpr uint32_t ring_capacity_for(uint32_t n) {
  return std::bit_ceil(n + 1u) - 1u;
}

template <class T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // A ring with at least `min_capacity` usable entries, its entries from `allocator` (null:
  // malloc; queue_memory.h). Nothing is written until entries are pushed. Throws
  // std::bad_alloc.
  explicit SpscRing(uint32_t min_capacity, QueueBuffer type = QueueBuffer::kCq,
                    const std::shared_ptr<QueueAllocator>& allocator = nullptr)
      : slots_(std::bit_ceil(min_capacity + 1u)),
        mask_(slots_ - 1),
        entries_(make_queue_array<T>(slots_, allocator, type)) {}

  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  uint32_t capacity() const { return slots_ - 1; }
  uint32_t slots() const { return slots_; }

  // Fill level. Exact from either side for its own purposes; a snapshot for anyone else.
  uint32_t size() const {
    return tail_.load(std::memory_order_acquire) - head_.load(std::memory_order_acquire);
  }
  bool empty() const { return size() == 0; }

  // ---- producer side ----
  // The slot the next entry goes to, or nullptr when the ring is full.
  T* producer_slot() {
    const uint32_t tail = tail_.load(std::memory_order_relaxed);  // our own index
    // Acquire pairs with the consumer's release in pop(): the consumer has finished reading
    // every slot below `head` before we may overwrite it.
    const uint32_t head = head_.load(std::memory_order_acquire);
    if (tail - head >= capacity()) return nullptr;
    return &entries_[tail & mask_];
  }
  // Slot number (0..slots-1) of producer_slot(); owners index side arrays with it.
  uint32_t producer_slot_index() const { return tail_.load(std::memory_order_relaxed) & mask_; }
  // Publishes the entry written into producer_slot().
  void publish() {
    const uint32_t tail = tail_.load(std::memory_order_relaxed);
    assert(tail - head_.load(std::memory_order_relaxed) < capacity());
    // Release orders the entry's contents before the new tail: a consumer that sees the new
    // tail (acquire in peek) sees the whole entry.
    tail_.store(tail + 1, std::memory_order_release);
  }
  bool push(const T& entry) {
    T* slot = producer_slot();
    if (slot == nullptr) return false;
    *slot = entry;
    publish();
    return true;
  }

  // ---- consumer side ----
  // The oldest entry, or nullptr when the ring is empty.
  const T* peek() const { return peek_at(0); }
  // The entry `offset` places after the oldest one, or nullptr.
  const T* peek_at(uint32_t offset) const {
    const uint32_t head = head_.load(std::memory_order_relaxed);  // our own index
    // Acquire pairs with publish(): everything written into the entry is visible.
    const uint32_t tail = tail_.load(std::memory_order_acquire);
    if (tail - head <= offset) return nullptr;
    return &entries_[(head + offset) & mask_];
  }
  // Where the entries are (tests: which memory a ring uses).
  const T* data() const { return entries_.get(); }
  uint32_t consumer_slot_index() const { return head_.load(std::memory_order_relaxed) & mask_; }
  // Releases the oldest entry back to the producer.
  void pop() {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    assert(tail_.load(std::memory_order_relaxed) != head);
    // Release orders our reads of the entry before handing its slot back to the producer.
    head_.store(head + 1, std::memory_order_release);
  }

  // Empties the ring. Only when neither side runs concurrently (owner holds both sides).
  void clear() { head_.store(tail_.load(std::memory_order_relaxed), std::memory_order_relaxed); }
  // Removes the entries `drop` selects and keeps the others in their order; returns how many
  // went. The kept entries move towards the tail and the head advances past the gap, so only
  // the consumer's index changes. Only when neither side runs concurrently (owner holds both).
  template <class Pred>
  uint32_t remove_if(Pred drop) {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    const uint32_t n = tail_.load(std::memory_order_relaxed) - head;
    uint32_t kept_from = n;  // the kept entries end up at offsets [kept_from, n)
    for (uint32_t i = n; i-- > 0;) {
      const T& entry = entries_[(head + i) & mask_];
      if (drop(entry)) continue;
      --kept_from;
      if (kept_from != i) entries_[(head + kept_from) & mask_] = entry;
    }
    head_.store(head + kept_from, std::memory_order_relaxed);
    return kept_from;
  }

 private:
  const uint32_t slots_;
  const uint32_t mask_;
  QueueArray<T> entries_;
  alignas(kCacheLineBytes) std::atomic<uint32_t> head_{0};  // consumer-owned
  alignas(kCacheLineBytes) std::atomic<uint32_t> tail_{0};  // producer-owned
};

}  // namespace urdma::provider
