#include "net/clock.h"

#include <gtest/gtest.h>
#include <time.h>

#include <thread>

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

// One reading per turn: inside a TurnTime the thread's MonotonicClock stands still (a nested one
// keeps the outer time); outside, and on other threads, it runs.
TEST(ClockTest, ATurnReadsTheClockOnce) {
  MonotonicClock c;
  uint64_t turn_ns;
  {
    const TurnTime turn;
    turn_ns = turn.ns();
    EXPECT_EQ(c.now_ns(), turn_ns);
    timespec ts{0, 200'000};
    nanosleep(&ts, nullptr);
    EXPECT_EQ(c.now_ns(), turn_ns);
    {
      const TurnTime inner;
      EXPECT_EQ(inner.ns(), turn_ns);
    }
    EXPECT_EQ(c.now_ns(), turn_ns);
    uint64_t other = 0;
    std::thread([&] { other = c.now_ns(); }).join();
    EXPECT_GT(other, turn_ns + 100'000);  // another thread is in no turn
  }
  EXPECT_GT(c.now_ns(), turn_ns + 100'000);
}

}  // namespace
}  // namespace urdma::net
