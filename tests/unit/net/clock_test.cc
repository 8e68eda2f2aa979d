#include "net/clock.h"

#include <gtest/gtest.h>

namespace urdma::net {
namespace {

TEST(ClockTest, VirtualClockMovesOnlyWhenTold) {
  VirtualClock c(100);
  const Clock& base = c;
  EXPECT_EQ(base.now_ns(), 100u);
  EXPECT_EQ(base.now_ns(), 100u);
  c.advance(50);
  EXPECT_EQ(base.now_ns(), 150u);
  c.set(150);  // setting to now is allowed
  c.set(1'000);
  EXPECT_EQ(c.now_ns(), 1'000u);
}

TEST(ClockDeathTest, VirtualClockNeverGoesBackwards) {
  VirtualClock c(1'000);
  EXPECT_DEATH(c.set(999), "backwards");
  EXPECT_DEATH(c.advance(kNever), "overflow");
}

TEST(ClockTest, MonotonicClockDoesNotDecrease) {
  MonotonicClock c;
  uint64_t prev = c.now_ns();
  EXPECT_GT(prev, 0u);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t t = c.now_ns();
    ASSERT_GE(t, prev);
    prev = t;
  }
}

}  // namespace
}  // namespace urdma::net
