#include "net/clock.h"

#include <time.h>

namespace urdma::net {

uint64_t MonotonicClock::now_ns() const {
  timespec ts{};
  // CLOCK_MONOTONIC cannot fail with a valid timespec pointer (clock_gettime(2)).
  clock_gettime(CLOCK_MONOTONIC, &ts);
  constexpr uint64_t kNsPerSecond = 1'000'000'000;
  return static_cast<uint64_t>(ts.tv_sec) * kNsPerSecond + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace urdma::net
