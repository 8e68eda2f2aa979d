// CRC-32 candidates against each other and against zlib's GF(2) operators (independent oracles).
#include "wire/crc32.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

namespace urdma::wire {
namespace {

using Crc32Fn = uint32_t (*)(uint32_t, std::span<const uint8_t>);

struct Candidate {
  const char* name;
  Crc32Fn fn;
};
constexpr Candidate kCandidates[] = {
    {"crc32", crc32},
    {"isal", crc32_isal},
    {"zlib", crc32_zlib},
    {"slicing_by_8", crc32_slicing_by_8},
};

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Crc32, CheckValueOfEveryCandidate) {
  // The CRC-32/ISO-HDLC check value: CRC of the ASCII string "123456789".
  for (const Candidate& c : kCandidates) {
    EXPECT_EQ(c.fn(0, bytes_of("123456789")), 0xCBF43926u) << c.name;
    EXPECT_EQ(c.fn(0, {}), 0u) << c.name;
  }
}

// (e) the hand loop, zlib and isa-l agree on random inputs of every length 0..300, from every
// alignment and from a random chained start value.
TEST(Crc32, CandidatesAgreeOnEveryLengthTo300) {
  std::mt19937 rng(2);
  std::vector<uint8_t> buf(300 + 8);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  size_t checked = 0;
  for (size_t len = 0; len <= 300; ++len) {
    for (size_t align = 0; align < 8; ++align) {
      const std::span<const uint8_t> data(buf.data() + align, len);
      const uint32_t start = align == 0 ? 0 : static_cast<uint32_t>(rng());
      const uint32_t want = crc32_zlib(start, data);
      for (const Candidate& c : kCandidates) {
        ASSERT_EQ(c.fn(start, data), want) << c.name << " len " << len << " align " << align;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 301u * 8);
}

TEST(Crc32, ChainsLikeOneCall) {
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(1000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const std::span<const uint8_t> all(buf);
  for (size_t cut : {0u, 1u, 7u, 64u, 999u, 1000u}) {
    for (const Candidate& c : kCandidates) {
      EXPECT_EQ(c.fn(c.fn(0, all.first(cut)), all.subspan(cut)), c.fn(0, all)) << c.name;
    }
  }
}

TEST(Gf2, MultiplicationMatchesZlibCombineOp) {
  // zlib >= 1.2.12: crc32_combine_op(a, 0, op) = op(x) * a(x) mod P, same representation.
  std::mt19937 rng(4);
  for (int i = 0; i < 2000; ++i) {
    const uint32_t a = static_cast<uint32_t>(rng());
    const uint32_t b = static_cast<uint32_t>(rng());
    ASSERT_EQ(gf2_mul_mod_p(a, b), static_cast<uint32_t>(crc32_combine_op(a, 0, b)));
    ASSERT_EQ(gf2_mul_mod_p(a, b), gf2_mul_mod_p(b, a));
    ASSERT_EQ(gf2_mul_mod_p(a, kGf2One), a);
  }
}

// The run-time product (carry-less multiply and Barrett reduction on x86-64 with PCLMULQDQ)
// against the compile-time loop and zlib, on random words and on edge words (one bit, all bits,
// P itself). On a CPU without PCLMULQDQ both sides of the first comparison are the loop; the zlib
// comparison still holds the product to an independent implementation.
TEST(Gf2, FastMultiplicationMatchesTheLoopAndZlib) {
  std::vector<uint32_t> edges = {0, 0xFFFFFFFF, kCrc32PolyReflected, 0x80000001};
  for (int bit = 0; bit < 32; ++bit) edges.push_back(uint32_t{1} << bit);
  for (uint32_t a : edges) {
    for (uint32_t b : edges) {
      ASSERT_EQ(gf2_mul_mod_p_fast(a, b), gf2_mul_mod_p(a, b)) << a << " * " << b;
    }
  }
  std::mt19937 rng(8);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t a = static_cast<uint32_t>(rng());
    const uint32_t b = static_cast<uint32_t>(rng());
    ASSERT_EQ(gf2_mul_mod_p_fast(a, b), gf2_mul_mod_p(a, b)) << a << " * " << b;
    if (i % 50 == 0) {
      ASSERT_EQ(gf2_mul_mod_p_fast(a, b), static_cast<uint32_t>(crc32_combine_op(a, 0, b)));
    }
  }
}

TEST(Gf2, PowersOfXMatchZlibCombineGen) {
  // zlib's crc32_combine_gen(n) (z_off_t is 64-bit here) is x^(8n) mod P: the operator appending n
  // zero bytes.
  std::mt19937_64 rng(5);
  std::vector<uint64_t> ns = {0, 1, 2, 3, 4, 1023, 1024, 65535, 1ull << 40};
  for (int i = 0; i < 200; ++i) ns.push_back(rng() >> 20);
  for (uint64_t n : ns) {
    ASSERT_EQ(gf2_x8n_mod_p(n), static_cast<uint32_t>(crc32_combine_gen(static_cast<z_off_t>(n))))
        << n;
  }
  EXPECT_EQ(gf2_x_pow_mod_p(0), kGf2One);
  EXPECT_EQ(gf2_x_pow_mod_p(1), kGf2X);
}

TEST(Gf2, InversePowersUndoPowers) {
  std::mt19937_64 rng(6);
  for (int i = 0; i < 500; ++i) {
    const uint64_t k = i < 64 ? static_cast<uint64_t>(i) : rng();
    ASSERT_EQ(gf2_mul_mod_p(gf2_x_pow_mod_p(k), gf2_x_inv_pow_mod_p(k)), kGf2One) << k;
  }
}

// The property icrc.cc relies on: for equal-length messages, the CRC difference is the change
// times x^(8m + 32), m the number of bytes after the change — checked against the real CRC.
TEST(Gf2, CrcDifferenceIsTheShiftedChange) {
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> a(1 + rng() % 400);
    for (auto& b : a) b = static_cast<uint8_t>(rng());
    const size_t at = rng() % a.size();
    const uint8_t change = static_cast<uint8_t>(1 + rng() % 255);
    std::vector<uint8_t> b = a;
    b[at] ^= change;
    // One byte c in the reflected representation: bit j has degree 7 - j -> word bit 24 + j.
    const uint32_t poly = uint32_t{change} << 24;
    const uint64_t after = a.size() - at - 1;
    ASSERT_EQ(crc32(0, a) ^ crc32(0, b), gf2_mul_mod_p(poly, gf2_x_pow_mod_p(8 * after + 32)));
  }
}

}  // namespace
}  // namespace urdma::wire
