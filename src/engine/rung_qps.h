// Which QPs rang their doorbell since the engine last looked: a two-level bitmap of QP handles
// (provider::Qp::handle(), dense below kLimits.max_qp). Any thread sets a bit without a lock or
// an allocation (a doorbell must be cheap, provider/doorbell.h); the engine thread drains it and
// so learns which QPs to serve without scanning every QP.
//
// Why no set bit is lost: a producer sets its word bit, then the word's summary bit; the
// consumer takes the summary, then each word it names. A word bit set after the consumer took
// that word is followed by a summary bit the next drain sees. A bit can be seen twice (once
// early through another producer's summary bit, once more later) — harmless for a "look at this
// QP" hint.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "base/check.h"
#include "provider/limits.h"

namespace urdma::engine {

class RungQps {
 public:
  static constexpr size_t kWordBits = 64;
  static constexpr size_t kCapacity = kWordBits * kWordBits;  // QP handles
  static_assert(provider::kLimits.max_qp <= kCapacity, "QP handles beyond the doorbell bitmap");

  // Any thread.
  void set(uint32_t handle) {
    base::check(handle < kCapacity, "QP handle beyond the doorbell bitmap");
    const size_t word = handle / kWordBits;
    words_[word].fetch_or(bit(handle % kWordBits), std::memory_order_acq_rel);
    summary_.fetch_or(bit(word), std::memory_order_acq_rel);
  }

  // Engine thread: calls fn(handle) for each handle set since the last drain, lowest first
  // within a word, and clears them.
  template <typename Fn>
  void drain(Fn&& fn) {
    uint64_t summary = summary_.exchange(0, std::memory_order_acq_rel);
    while (summary != 0) {
      const auto word = static_cast<size_t>(std::countr_zero(summary));
      summary &= summary - 1;
      uint64_t bits = words_[word].exchange(0, std::memory_order_acq_rel);
      while (bits != 0) {
        fn(static_cast<uint32_t>(word * kWordBits + static_cast<size_t>(std::countr_zero(bits))));
        bits &= bits - 1;
      }
    }
  }

 private:
  static constexpr uint64_t bit(size_t i) { return uint64_t{1} << i; }

  std::array<std::atomic<uint64_t>, kWordBits> words_{};
  std::atomic<uint64_t> summary_{0};
};

}  // namespace urdma::engine
