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
class MonotonicClock final : public Clock {
 public:
  uint64_t now_ns() const override;
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
