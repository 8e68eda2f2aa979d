// 24-bit PSN arithmetic: wrap at 0xFFFFFF and the half-window boundary, exhaustively around
// the edges.
#include "wire/psn.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace urdma::wire {
namespace {

constexpr uint32_t kMax = 0xFFFFFF;

TEST(Psn, Constants) {
  EXPECT_EQ(kPsnMask, 0xFFFFFFu);
  EXPECT_EQ(kPsnModulus, 1u << 24);
  EXPECT_EQ(kPsnHalfWindow, 1u << 23);
}

TEST(Psn, AddSubWrap) {
  EXPECT_EQ(psn_add(kMax, 1), 0u);
  EXPECT_EQ(psn_add(kMax, 2), 1u);
  EXPECT_EQ(psn_next(kMax), 0u);
  EXPECT_EQ(psn_add(5, kPsnModulus), 5u);
  EXPECT_EQ(psn_sub(0, 1), kMax);
  EXPECT_EQ(psn_sub(3, 5), kMax - 1);
  EXPECT_EQ(psn_add(0x123456, 0), 0x123456u);
  for (uint32_t base : {0u, 1u, kMax, kMax - 1, kPsnHalfWindow, kPsnHalfWindow - 1}) {
    for (uint32_t n : {0u, 1u, 2u, kPsnHalfWindow, kMax}) {
      EXPECT_EQ(psn_sub(psn_add(base, n), n), base) << base << " " << n;
      EXPECT_LE(psn_add(base, n), kMax);
    }
  }
}

TEST(Psn, DiffRangeAndWrap) {
  EXPECT_EQ(psn_diff(0, kMax), 1);
  EXPECT_EQ(psn_diff(kMax, 0), -1);
  EXPECT_EQ(psn_diff(2, kMax - 1), 4);
  EXPECT_EQ(psn_diff(7, 7), 0);
  // The half-window boundary: exactly 2^23 apart is −2^23 ("behind") in both directions, as
  // rxe's psn_compare ((int32_t)((a − b) << 8)).
  EXPECT_EQ(psn_diff(kPsnHalfWindow, 0), -static_cast<int32_t>(kPsnHalfWindow));
  EXPECT_EQ(psn_diff(0, kPsnHalfWindow), -static_cast<int32_t>(kPsnHalfWindow));
  EXPECT_EQ(psn_diff(kPsnHalfWindow + 1, 0), -static_cast<int32_t>(kPsnHalfWindow) + 1);
  EXPECT_EQ(psn_diff(kPsnHalfWindow - 1, 0), static_cast<int32_t>(kPsnHalfWindow) - 1);
}

// Around every interesting base, every distance near 0 and near ±2^23: psn_diff is in
// [-2^23, 2^23), consistent with add, and the comparisons agree with it.
TEST(Psn, ExhaustiveEdges) {
  const int32_t half = static_cast<int32_t>(kPsnHalfWindow);
  for (uint32_t base : {0u, 1u, 2u, kMax, kMax - 1, kPsnHalfWindow, kPsnHalfWindow - 1,
                        kPsnHalfWindow + 1, 0x123456u}) {
    for (int32_t center : {0, half, -half}) {
      for (int32_t delta = center - 300; delta <= center + 300; ++delta) {
        const uint32_t b = psn_add(base, static_cast<uint32_t>(delta));
        const int32_t d = psn_diff(b, base);
        ASSERT_GE(d, -half);
        ASSERT_LT(d, half);
        // The distance is delta reduced into the range.
        int32_t want = delta;
        while (want >= half) want -= static_cast<int32_t>(kPsnModulus);
        while (want < -half) want += static_cast<int32_t>(kPsnModulus);
        // rxe's psn_compare: the sign of the 24-bit difference shifted into the top bits.
        const int32_t rxe = static_cast<int32_t>((b - base) << 8);
        ASSERT_EQ(d < 0, rxe < 0) << base << " " << delta;
        ASSERT_EQ(d, want) << base << " " << delta;
        ASSERT_EQ(psn_gt(b, base), d > 0);
        ASSERT_EQ(psn_ge(b, base), d >= 0);
        ASSERT_EQ(psn_lt(b, base), d < 0);
        ASSERT_EQ(psn_le(b, base), d <= 0);
        // Antisymmetry, except at the half-window where both directions are "behind".
        if (d != -half) {
          ASSERT_EQ(psn_diff(base, b), -d);
        }
      }
    }
  }
}

TEST(Psn, ComparisonsAcrossTheWrap) {
  EXPECT_TRUE(psn_lt(kMax, 0));
  EXPECT_TRUE(psn_gt(0, kMax));
  EXPECT_TRUE(psn_le(kMax, kMax));
  EXPECT_TRUE(psn_ge(0, 0));
  EXPECT_TRUE(psn_lt(kMax - 10, 5));
  EXPECT_FALSE(psn_lt(5, kMax - 10));
  // One past the half window behind is "ahead" again.
  EXPECT_TRUE(psn_lt(0, kPsnHalfWindow - 1));
  EXPECT_TRUE(psn_gt(0, kPsnHalfWindow + 1));
  // Exactly the half window: behind both ways (a duplicate at the responder, IBA 9.7.5.2.1).
  EXPECT_TRUE(psn_lt(0, kPsnHalfWindow));
  EXPECT_TRUE(psn_lt(kPsnHalfWindow, 0));
  EXPECT_TRUE(psn_lt(kMax, kPsnHalfWindow - 1));
  EXPECT_FALSE(psn_ge(0, kPsnHalfWindow));
}

TEST(Psn, InWindow) {
  EXPECT_TRUE(in_window(10, 10, 1));
  EXPECT_FALSE(in_window(11, 10, 1));
  EXPECT_FALSE(in_window(9, 10, 1));
  EXPECT_FALSE(in_window(10, 10, 0));
  // A window across the wrap: kMax-1, kMax, 0, 1.
  EXPECT_FALSE(in_window(kMax - 2, kMax - 1, 4));
  EXPECT_TRUE(in_window(kMax - 1, kMax - 1, 4));
  EXPECT_TRUE(in_window(kMax, kMax - 1, 4));
  EXPECT_TRUE(in_window(0, kMax - 1, 4));
  EXPECT_TRUE(in_window(1, kMax - 1, 4));
  EXPECT_FALSE(in_window(2, kMax - 1, 4));
  // The widest windows.
  EXPECT_TRUE(in_window(kPsnHalfWindow - 1, 0, kPsnHalfWindow));
  EXPECT_FALSE(in_window(kPsnHalfWindow, 0, kPsnHalfWindow));
  EXPECT_FALSE(in_window(kMax, 0, kPsnModulus - 1));
  EXPECT_TRUE(in_window(kMax, 0, kPsnModulus));
  EXPECT_TRUE(in_window(12345, 777, kPsnModulus));
  // Exhaustive around the wrap for a small window.
  for (uint32_t start = kMax - 8; start != 9; start = psn_next(start)) {
    for (uint32_t p = kMax - 16; p != 17; p = psn_next(p)) {
      const int32_t d = psn_diff(p, start);
      ASSERT_EQ(in_window(p, start, 5), d >= 0 && d < 5) << p << " " << start;
    }
  }
}

TEST(Psn, Constexpr) {
  static_assert(psn_add(kMax, 1) == 0);
  static_assert(psn_diff(0, kMax) == 1);
  static_assert(psn_lt(kMax, 0));
  static_assert(in_window(0, kMax, 2));
}

}  // namespace
}  // namespace urdma::wire
