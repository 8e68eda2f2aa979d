#include "net/clock.h"

#include <time.h>

namespace urdma::net {

namespace {
// The time of the TurnTime the thread is inside; 0: none.
thread_local uint64_t tls_turn_ns = 0;

uint64_t read_monotonic() {
  timespec ts{};
  // CLOCK_MONOTONIC cannot fail with a valid timespec pointer (clock_gettime(2)).
  clock_gettime(CLOCK_MONOTONIC, &ts);
  constexpr uint64_t kNsPerSecond = 1'000'000'000;
  return static_cast<uint64_t>(ts.tv_sec) * kNsPerSecond + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace

uint64_t MonotonicClock::now_ns() const {
  return tls_turn_ns != 0 ? tls_turn_ns : read_monotonic();
}

TurnTime::TurnTime() : outer_(tls_turn_ns), ns_(outer_ != 0 ? outer_ : read_monotonic()) {
  tls_turn_ns = ns_;
}

TurnTime::~TurnTime() { tls_turn_ns = outer_; }

}  // namespace urdma::net
