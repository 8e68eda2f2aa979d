// 24-bit Packet Sequence Number arithmetic (IBA 9.7.1 PSNs; the responder half-window rule
// of 9.7.5).
//
// PSNs wrap modulo 2^24. Two PSNs are compared by their signed distance modulo 2^24: `b` is
// "after" `a` when b − a (mod 2^24) lies in (0, 2^23), "before" when it lies in [2^23, 2^24).
// This is the responder's rule (IBA 9.7.5.2.1): of the 2^24 PSNs, the 2^23 preceding the
// expected PSN — the one exactly 2^23 away included — are duplicates ("behind"), the 2^23 − 1
// after it lie ahead. So psn_diff is in [−2^23, 2^23): two PSNs exactly 2^23 apart are each
// *behind* the other, as Linux rxe's psn_compare, the sign of (int32_t)((a − b) << 8).
#pragma once

#include <cassert>
#include <cstdint>

namespace urdma::wire {

inline constexpr unsigned kPsnBits = 24;
inline constexpr uint32_t kPsnModulus = uint32_t{1} << kPsnBits;  // 16777216
inline constexpr uint32_t kPsnMask = kPsnModulus - 1;             // 0xFFFFFF
inline constexpr uint32_t kPsnHalfWindow = kPsnModulus / 2;       // 2^23

inline constexpr uint32_t psn_add(uint32_t psn, uint32_t n) {
  return (psn + n) & kPsnMask;
}
inline constexpr uint32_t psn_sub(uint32_t psn, uint32_t n) {
  return (psn - n) & kPsnMask;
}
inline constexpr uint32_t psn_next(uint32_t psn) {
  return psn_add(psn, 1);
}

// Signed distance a − b in [−2^23, 2^23): how far `a` is ahead of `b`.
inline constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  const uint32_t d = (a - b) & kPsnMask;
  return d >= kPsnHalfWindow ? static_cast<int32_t>(d) - static_cast<int32_t>(kPsnModulus)
                             : static_cast<int32_t>(d);
}

inline constexpr bool psn_lt(uint32_t a, uint32_t b) {
  return psn_diff(a, b) < 0;
}
inline constexpr bool psn_le(uint32_t a, uint32_t b) {
  return psn_diff(a, b) <= 0;
}
inline constexpr bool psn_gt(uint32_t a, uint32_t b) {
  return psn_diff(a, b) > 0;
}
inline constexpr bool psn_ge(uint32_t a, uint32_t b) {
  return psn_diff(a, b) >= 0;
}

// True when `psn` is one of the `count` PSNs start, start+1, ..., start+count−1 (mod 2^24).
// `count` may be at most 2^24 (every PSN).
inline constexpr bool in_window(uint32_t psn, uint32_t start, uint32_t count) {
  assert(count <= kPsnModulus);
  return ((psn - start) & kPsnMask) < count || count == kPsnModulus;
}

}  // namespace urdma::wire
