// The checksum and the data pattern the tests and benchmarks put in what they move: FNV-1a
// (64-bit) over a whole transfer, compared end to end, and a seeded xorshift fill. Header-only,
// so that a test that links none of tests/support (the verbs tests, linked against our
// libibverbs.so.1 only) can include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace urdma::test_support {

// FNV-1a, 64-bit: sensitive to every byte and to their order.
inline uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Fills `v` from a xorshift64 stream seeded by `seed` (two seeds give unrelated contents).
inline void fill_pattern(std::vector<uint8_t>& v, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint8_t& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
}

}  // namespace urdma::test_support
