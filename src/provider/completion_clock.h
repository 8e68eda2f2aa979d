// The device's clock: what completion timestamps and ibv_query_rt_values_ex read.
//
// A NIC stamps CQEs from a free-running counter of its own and reports the counter's frequency
// (ibv_query_device_ex: hca_core_clock, kHz) and its current value (ibv_query_rt_values_ex,
// IBV_VALUES_MASK_RAW_CLOCK). urdma's "hardware" is the engine in the process, and its counter is
// CLOCK_MONOTONIC in nanoseconds (a 1 GHz clock, hca_core_clock = 1,000,000 kHz):
// * it never steps (settimeofday and NTP steps move CLOCK_REALTIME, not it), so completion
//   times of one CQ never go backwards and differences are durations, as with a NIC's counter;
// * it is the clock the engine's timers and the runtime's timerfd run on (net::MonotonicClock),
//   and one clock for every process of the host, as a NIC's counter is for all its contexts:
//   timestamps of two processes' completions compare;
// * clock_gettime reads it through the vDSO, without a system call.
// The wall-clock timestamp (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) is CLOCK_REALTIME in
// nanoseconds since the epoch, read at the same moment.
#pragma once

#include <cstdint>
#include <ctime>

namespace urdma::provider {

// hca_core_clock: ticks of the device clock per millisecond (kHz). One tick is 1 ns.
inline constexpr uint64_t kDeviceClockKhz = 1'000'000;
// completion_timestamp_mask: the counter's valid bits (a 64-bit nanosecond count).
inline constexpr uint64_t kDeviceClockMask = ~uint64_t{0};

inline uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  // Cannot fail for these clocks with a valid pointer (clock_gettime(2)).
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}
inline uint64_t completion_clock_ns() {
  return clock_ns(CLOCK_MONOTONIC);
}
inline uint64_t wallclock_ns() {
  return clock_ns(CLOCK_REALTIME);
}

}  // namespace urdma::provider
