// The engine's only notion of time. Real runs use MonotonicClock; the deterministic simulation
// uses VirtualClock, which moves only when its driver (SimWorld) moves it.
#pragma once

#include <cstdint>
#include <limits>

#include "base/check.h"

namespace urdma::net {

// "No deadline": a time that never comes.
inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds since an arbitrary origin; never decreases.
  virtual uint64_t now_ns() const = 0;
};

// CLOCK_MONOTONIC: not affected by wall-clock steps; stops during suspend like Linux's timers.
// Inside a TurnTime on the calling thread, the time that TurnTime took.
class MonotonicClock final : public Clock {
 public:
  uint64_t now_ns() const override;
};

// One clock reading for one engine turn. A turn reads the time many times over (the engine's
// timers and held ACKs, the shared-memory I/O's socket interval, the runtime's timerfds), and
// with kvm-clock as the clocksource each reading costs 25 ns or more: a third of an idle busy-
// poll turn (docs/PERFORMANCE.md). While one lives, MonotonicClock::now_ns() on its thread
// returns the time it was made; a TurnTime made inside another keeps the outer one's time. A
// turn never waits for the clock to move, so nothing inside one can spin on it.
class TurnTime {
 public:
  TurnTime();
  ~TurnTime();
  TurnTime(const TurnTime&) = delete;
  TurnTime& operator=(const TurnTime&) = delete;

  uint64_t ns() const { return ns_; }

 private:
  uint64_t outer_;
  uint64_t ns_;
};

// Virtual time for the simulation: set or advanced explicitly, never backwards.
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(uint64_t start_ns = 0) : now_ns_(start_ns) {}

  uint64_t now_ns() const override { return now_ns_; }

  void set(uint64_t t_ns) {
    base::check(t_ns >= now_ns_, "virtual clock set backwards");
    base::check(t_ns != kNever, "virtual clock set to kNever");
    now_ns_ = t_ns;
  }
  void advance(uint64_t delta_ns) {
    base::check(delta_ns < kNever - now_ns_, "virtual clock overflow");
    now_ns_ += delta_ns;
  }

 private:
  uint64_t now_ns_;
};

}  // namespace urdma::net
