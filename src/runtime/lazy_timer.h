// A timerfd set lazily. A syscall can cost over a microsecond on a VM, and the runtime's
// timers move at nearly every turn of a conversation: a turn that sends a request starts its
// retransmission timer, the next turn's ACK stops it; a timer that followed each move would
// cost two timerfd_settime per message. A timer only has to fire no later than its deadline, so:
//
//   * a deadline earlier than what is armed (or nothing armed, or what was armed has passed):
//     armed now;
//   * a later deadline, or none, while what is armed lies further ahead than kLazyHorizonNs:
//     left as it is. It fires early, once; the thread it wakes finds nothing due and sets the
//     timer to what is then due. A retransmission timer (milliseconds) costs one early wake-up
//     per timeout instead of two syscalls per message;
//   * a later deadline, or none, while what is armed is due within kLazyHorizonNs (an ACK held
//     for a reply, tens of microseconds): moved, so that a thread is not woken for nothing
//     that soon, as the application timer always was moved (runtime.cc, set_app_timer).
#pragma once

#include <cstdint>

#include "net/clock.h"

namespace urdma::runtime {

class LazyTimer {
 public:
  static constexpr uint64_t kLazyHorizonNs = 1'000'000;

  // Whether a timer armed for `armed` (net::kNever: disarmed) must be set again for a thread to
  // be woken at `want` (kNever: not at all), at time `now`.
  static constexpr bool must_set(uint64_t armed, uint64_t want, uint64_t now) {
    if (want == armed) return false;
    const bool pending = armed != net::kNever && armed > now;
    if (!pending) return want != net::kNever;  // disarmed, or it fired: harmless either way
    if (want < armed) return true;
    return armed - now < kLazyHorizonNs;
  }
};

}  // namespace urdma::runtime
