// When a timerfd must be set again (runtime/lazy_timer.h): never later than a deadline asks,
// and not again for a later deadline while what is armed lies far ahead.
#include "runtime/lazy_timer.h"

#include <gtest/gtest.h>

namespace urdma::runtime {
namespace {

constexpr uint64_t kNow = 5'000'000'000;
constexpr uint64_t kFar = kNow + 67'000'000;  // a retransmission timer (timeout 14)
constexpr uint64_t kSoon = kNow + 50'000;     // an ACK held for a reply

TEST(LazyTimer, AnEarlierDeadlineIsSetAtOnce) {
  EXPECT_TRUE(LazyTimer::must_set(net::kNever, kFar, kNow));
  EXPECT_TRUE(LazyTimer::must_set(kFar, kSoon, kNow));
  EXPECT_TRUE(LazyTimer::must_set(kFar, kFar - 1, kNow));
}

TEST(LazyTimer, ATimerThatFiredCountsAsDisarmed) {
  // Armed for a time now past: it fired (one-shot), so a later deadline must be set.
  EXPECT_TRUE(LazyTimer::must_set(kNow - 1, kFar, kNow));
  EXPECT_TRUE(LazyTimer::must_set(kNow, kFar, kNow));
  // Nothing wanted: a timer that fired needs no disarming.
  EXPECT_FALSE(LazyTimer::must_set(kNow - 1, net::kNever, kNow));
}

TEST(LazyTimer, ALaterDeadlineLeavesAFarTimerAlone) {
  EXPECT_FALSE(LazyTimer::must_set(kFar, kFar + 1'000'000, kNow));
  EXPECT_FALSE(LazyTimer::must_set(kFar, net::kNever, kNow));
  EXPECT_FALSE(LazyTimer::must_set(kFar, kFar, kNow));
  EXPECT_FALSE(LazyTimer::must_set(net::kNever, net::kNever, kNow));
}

TEST(LazyTimer, ALaterDeadlineMovesATimerDueSoon) {
  // Due within the horizon: moved (or disarmed) rather than waking a thread for nothing.
  EXPECT_TRUE(LazyTimer::must_set(kSoon, kFar, kNow));
  EXPECT_TRUE(LazyTimer::must_set(kSoon, net::kNever, kNow));
  EXPECT_TRUE(
      LazyTimer::must_set(kNow + LazyTimer::kLazyHorizonNs - 1, net::kNever, kNow));
  EXPECT_FALSE(LazyTimer::must_set(kNow + LazyTimer::kLazyHorizonNs, net::kNever, kNow));
}

}  // namespace
}  // namespace urdma::runtime
