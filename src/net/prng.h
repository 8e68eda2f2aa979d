// The simulation's pseudo-random numbers: xoshiro256** seeded through splitmix64
// (Blackman & Vigna, "Scrambled linear pseudorandom number generators", 2018; reference code at
// prng.di.unimi.it). Implemented here rather than taken from <random>: the std:: distributions
// are not specified bit-for-bit and differ across library versions, and a failing simulation seed
// must replay identically everywhere. Every draw below is defined exactly.
#pragma once

#include <array>
#include <cstdint>

#include "base/check.h"

namespace urdma::net {

// splitmix64: a 64-bit counter through a bijective mixer; used to expand one seed into state.
class SplitMix64 {
 public:
  explicit constexpr SplitMix64(uint64_t seed) : x_(seed) {}
  constexpr uint64_t next() {
    uint64_t z = (x_ += 0x9e3779b97f4a7c15);  // 2^64 / golden ratio
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  }

 private:
  uint64_t x_;
};

class Xoshiro256 {
 public:
  // Parts per million: the unit of every fault probability.
  static constexpr uint32_t kPpmOne = 1'000'000;

  explicit constexpr Xoshiro256(uint64_t seed) {
    SplitMix64 sm(seed);
    for (auto& w : s_) w = sm.next();  // never all zero: splitmix64 is a bijection of a counter
  }

  // A generator in a given raw state (not all zero), e.g. to check the published test vectors.
  static constexpr Xoshiro256 from_state(const std::array<uint64_t, 4>& state) {
    base::check(state[0] | state[1] | state[2] | state[3], "xoshiro256 state all zero");
    Xoshiro256 g(0);
    g.s_ = state;
    return g;
  }

  // xoshiro256**.
  constexpr uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), n > 0, without modulo bias (Lemire's multiply-shift with rejection,
  // "Fast Random Integer Generation in an Interval", 2019).
  constexpr uint64_t below(uint64_t n) {
    base::check(n > 0, "below(0)");
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform in [lo, hi] (inclusive). Draws once even when lo == hi, so the sequence of draws does
  // not depend on the configured range.
  constexpr uint64_t between(uint64_t lo, uint64_t hi) {
    base::check(lo <= hi, "between(lo > hi)");
    const uint64_t span = hi - lo;
    if (span == ~uint64_t{0}) return next();
    return lo + below(span + 1);
  }

  // True with probability ppm / 1e6. Always draws exactly once (0 and 1e6 included), so that
  // changing one fault's rate does not shift the random stream of the others in a single decision.
  constexpr bool chance_ppm(uint32_t ppm) {
    base::check(ppm <= kPpmOne, "probability above 1,000,000 ppm");
    return below(kPpmOne) < ppm;
  }

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_{};
};

}  // namespace urdma::net
