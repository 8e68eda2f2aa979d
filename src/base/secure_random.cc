#include "base/secure_random.h"

#include <sys/random.h>

#include <cerrno>

#include "base/check.h"

namespace urdma::base {

SecureRandom::result_type SecureRandom::operator()() {
  if (next_ == buffer_.size()) {
    auto* bytes = reinterpret_cast<char*>(buffer_.data());
    size_t have = 0;
    while (have < sizeof buffer_) {
      // Up to 256 bytes never come back short once the pool is initialised; EINTR may.
      const ssize_t n = getrandom(bytes + have, sizeof buffer_ - have, 0);
      if (n < 0 && errno == EINTR) continue;
      check(n > 0, "getrandom");
      have += static_cast<size_t>(n);
    }
    next_ = 0;
  }
  return buffer_[next_++];
}

}  // namespace urdma::base
