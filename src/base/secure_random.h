// Random numbers a peer must not be able to predict (PSNs, communication IDs, transaction IDs,
// keys), straight from the kernel's generator: getrandom(2), read 256 bytes at a time. A seeded
// PRNG would give its state away through the values a peer sees; this has no state to give.
// Not thread-safe: one per owner, used under its owner's lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace urdma::base {

class SecureRandom {
 public:
  using result_type = uint64_t;
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()();

 private:
  std::array<uint64_t, 32> buffer_{};
  size_t next_ = buffer_.size();
};

}  // namespace urdma::base
