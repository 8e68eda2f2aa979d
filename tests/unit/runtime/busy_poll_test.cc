// The engine thread's busy-poll window (runtime/busy_poll.h): grows while work comes soon after
// the window ran out, stays while the window catches it, halves after a gap longer than the
// longest window, and closes for a while after a spin that lost its core.
#include "runtime/busy_poll.h"

#include <gtest/gtest.h>

namespace urdma::runtime {
namespace {

constexpr uint64_t kUs = 1000;

TEST(BusyPollWindow, StartsClosedAndGrowsByDoublingUpToItsMaximum) {
  BusyPollWindow w(50 * kUs, true);
  EXPECT_EQ(w.ns(), 0u);
  // Replies 30 us apart: each one came after the window, within 50 us.
  const uint64_t expected[] = {10 * kUs, 20 * kUs, 40 * kUs};
  for (uint64_t e : expected) {
    w.work_came_after(30 * kUs, 0);
    EXPECT_EQ(w.ns(), e);
  }
  // 40 us catches a 30 us gap: no change.
  w.work_came_after(30 * kUs, 0);
  EXPECT_EQ(w.ns(), 40 * kUs);
  // A 45 us gap is missed by 40 us: grows, capped at 50.
  w.work_came_after(45 * kUs, 0);
  EXPECT_EQ(w.ns(), 50 * kUs);
  w.work_came_after(50 * kUs, 0);
  EXPECT_EQ(w.ns(), 50 * kUs);
}

TEST(BusyPollWindow, AGapLongerThanTheMaximumHalvesItAndBelowTheFirstStepClosesIt) {
  BusyPollWindow w(50 * kUs, true);
  for (int i = 0; i < 4; ++i) w.work_came_after(45 * kUs, 0);
  ASSERT_EQ(w.ns(), 50 * kUs);
  w.work_came_after(50 * kUs + 1, 0);
  EXPECT_EQ(w.ns(), 25 * kUs);
  w.work_came_after(1'000'000 * kUs, 0);
  EXPECT_EQ(w.ns(), 12'500u);
  w.work_came_after(1'000'000 * kUs, 0);  // 6.25 us: below the first step
  EXPECT_EQ(w.ns(), 0u);
  // And opens again from the start.
  w.work_came_after(1 * kUs, 0);
  EXPECT_EQ(w.ns(), BusyPollWindow::kGrowStartNs);
}

// A spin that took much longer than its window in wall time: the thread was off its core in
// the middle of it. The window closes, and does not grow again for a while.
TEST(BusyPollWindow, ASpinThatLostItsCoreClosesTheWindowForAWhile) {
  BusyPollWindow w(50 * kUs, true);
  for (int i = 0; i < 3; ++i) w.work_came_after(30 * kUs, 0);
  ASSERT_EQ(w.ns(), 40 * kUs);
  // Off the core for less than kDescheduledNs beyond the window (our own application thread
  // ran in between): nothing changes.
  w.spun(40 * kUs + BusyPollWindow::kDescheduledNs, 1'000'000);
  EXPECT_EQ(w.ns(), 40 * kUs);
  const uint64_t now = 2'000'000;
  w.spun(40 * kUs + BusyPollWindow::kDescheduledNs + 1, now);
  EXPECT_EQ(w.ns(), 0u);
  w.work_came_after(30 * kUs, now + BusyPollWindow::kClosedNs - 1);
  EXPECT_EQ(w.ns(), 0u);
  w.work_came_after(30 * kUs, now + BusyPollWindow::kClosedNs);
  EXPECT_EQ(w.ns(), BusyPollWindow::kGrowStartNs);
}

TEST(BusyPollWindow, AMaximumBelowTheFirstStepIsTheWindow) {
  BusyPollWindow w(3 * kUs, true);
  w.work_came_after(2 * kUs, 0);
  EXPECT_EQ(w.ns(), 3 * kUs);
}

TEST(BusyPollWindow, ZeroNeverPolls) {
  BusyPollWindow w(0, true);
  for (uint64_t gap : {0u, 1u, 1000u, 1'000'000u}) {
    w.work_came_after(gap, 0);
    EXPECT_EQ(w.ns(), 0u);
  }
}

TEST(BusyPollWindow, AFixedWindowNeverMoves) {
  BusyPollWindow w(50 * kUs, false);
  EXPECT_EQ(w.ns(), 50 * kUs);
  w.work_came_after(1'000'000 * kUs, 0);
  EXPECT_EQ(w.ns(), 50 * kUs);
  w.work_came_after(60 * kUs, 0);
  w.spun(10'000 * kUs, 0);
  EXPECT_EQ(w.ns(), 50 * kUs);
}

}  // namespace
}  // namespace urdma::runtime
