// How long the engine thread keeps polling after a turn before it sleeps: a window that follows
// how soon work has been coming, in the manner of KVM's halt polling (virt/kvm/kvm_main.c,
// kvm_vcpu_halt; Documentation/virt/kvm/halt-polling.rst):
//
//   * work came within the window: the spin caught it, nothing changes;
//   * work came after the window but within the longest one (`max_ns`): a longer window would
//     have caught it — the window grows (0 → kGrowStartNs, then doubles, up to max_ns);
//   * work came later than max_ns: no window would have caught it — the window halves (and
//     closes below kGrowStartNs). Halving, not closing: in a conversation one late reply among
//     prompt ones would otherwise start the growth over, and the latency would flip between
//     two levels from run to run;
//   * a spin that lost its core (spun()) closes the window for kClosedNs.
//
// "Work" is a datagram or a post (the doorbell); a timer that fires is the engine's own and says
// nothing about when the next datagram comes, so it leaves the window alone (Runtime::run).
// A process that sleeps on a completion channel in a conversation (qperf rc_lat, rping) gets a
// window as long as the gap between its messages, up to max_ns; an idle process spins at most
// one window after its last turn. Engine thread only; no locking.
#pragma once

#include <algorithm>
#include <cstdint>

namespace urdma::runtime {

class BusyPollWindow {
 public:
  // KVM's halt_poll_ns_grow_start (10 us) and halt_poll_ns_grow (2).
  static constexpr uint64_t kGrowStartNs = 10'000;
  static constexpr uint64_t kDescheduledNs = 100'000;
  static constexpr uint64_t kClosedNs = 100'000'000;

  // adaptive false: always max_ns (a fixed window; tests and benchmarks).
  BusyPollWindow(uint64_t max_ns, bool adaptive)
      : max_ns_(max_ns), adaptive_(adaptive), window_ns_(adaptive ? 0 : max_ns) {}

  uint64_t ns() const { return window_ns_; }
  uint64_t max_ns() const { return max_ns_; }

  // Work came `idle_ns` after the engine thread's last turn ended (its spin plus its sleep);
  // `now_ns` is when (MonotonicClock).
  void work_came_after(uint64_t idle_ns, uint64_t now_ns) {
    if (!adaptive_ || idle_ns <= window_ns_) return;
    if (idle_ns > max_ns_) {
      window_ns_ /= 2;
      if (window_ns_ < kGrowStartNs) window_ns_ = 0;
    } else if (now_ns >= closed_until_ns_) {
      window_ns_ = std::min(max_ns_, window_ns_ == 0 ? kGrowStartNs : window_ns_ * 2);
    }
  }

  // A spin took `spun_ns` of wall time. Longer than the window by kDescheduledNs means the
  // thread was off its core that long in the middle of it: another thread wanted the core for
  // longer than a wake-up of our own application thread takes. Spinning then takes the core from
  // it, and costs this thread the scheduler's favour as a sleeper, so its wake-ups come later:
  // the window closes, and stays closed for kClosedNs.
  void spun(uint64_t spun_ns, uint64_t now_ns) {
    if (!adaptive_ || spun_ns <= window_ns_ + kDescheduledNs) return;
    window_ns_ = 0;
    closed_until_ns_ = now_ns + kClosedNs;
  }

 private:
  const uint64_t max_ns_;
  const bool adaptive_;
  uint64_t window_ns_;
  uint64_t closed_until_ns_ = 0;
};

}  // namespace urdma::runtime
