#include "net/prng.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace urdma::net {
namespace {

// Outputs of the reference C code (prng.di.unimi.it/splitmix64.c) from seed 0.
TEST(PrngTest, SplitMix64MatchesReference) {
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xe220a8397b1dcdafu);
  EXPECT_EQ(g.next(), 0x6e789e6aa1b965f4u);
  EXPECT_EQ(g.next(), 0x06c45d188009454fu);
}

// xoshiro256** from the raw state {1, 2, 3, 4}: the vector the reference code produces and that
// other ports (e.g. Rust's rand_xoshiro) test against.
TEST(PrngTest, Xoshiro256StarStarMatchesReference) {
  auto g = Xoshiro256::from_state({1, 2, 3, 4});
  EXPECT_EQ(g.next(), 11520u);
  EXPECT_EQ(g.next(), 0u);
  EXPECT_EQ(g.next(), 1509978240u);
  EXPECT_EQ(g.next(), 1215971899390074240u);
}

TEST(PrngTest, SameSeedSameStreamDifferentSeedDifferentStream) {
  Xoshiro256 a(42), b(42), c(43);
  std::vector<uint64_t> va, vb, vc;
  for (int i = 0; i < 100; ++i) {
    va.push_back(a.next());
    vb.push_back(b.next());
    vc.push_back(c.next());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
}

TEST(PrngTest, BelowStaysInRangeAndCoversIt) {
  Xoshiro256 g(7);
  std::array<int, 6> hits{};
  for (int i = 0; i < 6000; ++i) {
    const uint64_t v = g.below(6);
    ASSERT_LT(v, 6u);
    hits[v]++;
  }
  for (int h : hits) EXPECT_GT(h, 800);  // expected 1000 each
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(g.below(1), 0u);
}

TEST(PrngTest, BetweenIsInclusive) {
  Xoshiro256 g(9);
  bool saw_lo = false, saw_hi = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = g.between(10, 13);
    ASSERT_GE(v, 10u);
    ASSERT_LE(v, 13u);
    saw_lo |= v == 10;
    saw_hi |= v == 13;
  }
  EXPECT_TRUE(saw_lo);
  EXPECT_TRUE(saw_hi);
  EXPECT_EQ(g.between(5, 5), 5u);
  (void)g.between(0, ~uint64_t{0});  // the full range does not overflow
}

TEST(PrngTest, ChancePpmExtremesAndRate) {
  Xoshiro256 g(1);
  int zero = 0, one = 0, tenth = 0;
  for (int i = 0; i < 10000; ++i) {
    zero += g.chance_ppm(0);
    one += g.chance_ppm(1'000'000);
    tenth += g.chance_ppm(100'000);
  }
  EXPECT_EQ(zero, 0);
  EXPECT_EQ(one, 10000);
  EXPECT_GT(tenth, 800);
  EXPECT_LT(tenth, 1200);
}

// Each decision draws exactly once, whatever the probability, so streams stay aligned.
TEST(PrngTest, ChancePpmAlwaysDrawsOnce) {
  Xoshiro256 a(5), b(5);
  (void)a.chance_ppm(0);
  (void)b.chance_ppm(1'000'000);
  EXPECT_EQ(a.next(), b.next());
}

}  // namespace
}  // namespace urdma::net
