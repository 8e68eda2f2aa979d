#include "net/clock.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace urdma::net {

void check_failed(const char* what, const std::source_location& where) {
  std::fprintf(stderr, "%s:%u: %s: check failed: %s\n", where.file_name(),
               static_cast<unsigned>(where.line()), where.function_name(), what);
  std::abort();
}

uint64_t MonotonicClock::now_ns() const {
  timespec ts{};
  // CLOCK_MONOTONIC cannot fail with a valid timespec pointer (clock_gettime(2)).
  clock_gettime(CLOCK_MONOTONIC, &ts);
  constexpr uint64_t kNsPerSecond = 1'000'000'000;
  return static_cast<uint64_t>(ts.tv_sec) * kNsPerSecond + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace urdma::net
