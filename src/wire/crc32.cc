#include "wire/crc32.h"

#include <isa-l/crc.h>
#include <zlib.h>

#include <array>
#include <cassert>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace urdma::wire {

// Why isa-l: its crc32_gzip_refl (PCLMULQDQ folding, dispatched at run time) is faster than
// zlib's crc32 and a slicing-by-8 table loop at every size we send, and reaches memcpy speed at
// 4 KiB (bench/crc_bench.cc compares the three), so it is the one on the data path. crc32_gzip_refl already uses zlib's convention (it complements on
// entry and exit; the tests check it), so crc32_isal needs no adjustment.
uint32_t crc32(uint32_t crc, std::span<const uint8_t> data) {
  return crc32_isal(crc, data);
}

namespace {

// isa-l 2.30 (Debian 12) returns from its AVX-512 variant, crc32_gzip_refl_by16_10, without a
// vzeroupper: the upper halves of zmm0-15 stay dirty, and on Intel cores every legacy-SSE
// instruction after it (ours are built for baseline x86-64, which is SSE) pays an SSE/AVX
// transition (on an Intel Xeon it more than doubles the engine's cost per small packet). A
// vzeroupper after each call clears the state. It only exists
// with AVX; without AVX isa-l never dirtied anything.
const bool kCpuHasAvx = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") != 0;
}();

}  // namespace

uint32_t crc32_isal(uint32_t crc, std::span<const uint8_t> data) {
  const auto result = static_cast<uint32_t>(crc32_gzip_refl(crc, data.data(), data.size()));
  // Only the upper halves of ymm/zmm0-15 change, which code built without AVX never holds.
  if (kCpuHasAvx) asm volatile("vzeroupper");
  return result;
}

uint32_t crc32_zlib(uint32_t crc, std::span<const uint8_t> data) {
  return static_cast<uint32_t>(::crc32_z(crc, data.data(), data.size()));
}

namespace {

// Slicing-by-8 tables: kSlice[0] is the classic byte-at-a-time table (the CRC of one byte);
// kSlice[k][b] is the CRC of byte b followed by k zero bytes.
using SliceTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr SliceTables make_slice_tables() {
  SliceTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kCrc32PolyReflected & (0u - (c & 1u)));
    t[0][b] = c;
  }
  for (size_t k = 1; k < t.size(); ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
  return t;
}

constexpr SliceTables kSlice = make_slice_tables();
static_assert(kSlice[0][1] == 0x77073096);  // the well-known second entry of the CRC-32 table

}  // namespace

uint32_t crc32_slicing_by_8(uint32_t crc, std::span<const uint8_t> data) {
  uint32_t c = ~crc;
  const uint8_t* p = data.data();
  size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    // Little-endian composition of the bytes, written out so it holds on any host.
    const uint32_t lo =
        c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = kSlice[7][lo & 0xFF] ^ kSlice[6][(lo >> 8) & 0xFF] ^ kSlice[5][(lo >> 16) & 0xFF] ^
        kSlice[4][lo >> 24] ^ kSlice[3][p[4]] ^ kSlice[2][p[5]] ^ kSlice[1][p[6]] ^ kSlice[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kSlice[0][(c ^ *p) & 0xFF];
  return ~c;
}

namespace {

// x^-1 mod P. P = x^32 + Q with Q = 1 + x R, so x (R + x^31) = x^32 + Q + 1 = 1 (mod P). In the
// reflected representation dividing by x is a left shift, and x^31 is bit 0.
constexpr uint32_t kGf2XInverse = ((kCrc32PolyReflected & ~kGf2One) << 1) | 1u;
static_assert(gf2_mul_mod_p(kGf2X, kGf2XInverse) == kGf2One);

constexpr size_t kPowerTableSize = 64;  // covers every uint64_t exponent
using PowerTable = std::array<uint32_t, kPowerTableSize>;

// table[i] = base^(2^i) mod P.
constexpr PowerTable make_power_table(uint32_t base) {
  PowerTable t{};
  t[0] = base;
  for (size_t i = 1; i < t.size(); ++i) t[i] = gf2_mul_mod_p(t[i - 1], t[i - 1]);
  return t;
}

constexpr PowerTable kXPow2 = make_power_table(kGf2X);
constexpr PowerTable kXInvPow2 = make_power_table(kGf2XInverse);
static_assert(kXPow2[5] == kCrc32PolyReflected);  // x^32 = P - x^32 (mod P)
static_assert(gf2_mul_mod_p(kXPow2[7], kXInvPow2[7]) == kGf2One);

uint32_t pow_by_table(const PowerTable& table, uint64_t k) {
  uint32_t r = kGf2One;
  for (size_t i = 0; k != 0; ++i, k >>= 1) {
    assert(i < table.size());
    if (k & 1) r = gf2_mul_mod_p_fast(r, table[i]);
  }
  return r;
}

#if defined(__x86_64__)

// Carry-less multiplication and Barrett reduction in the reflected representation.
//
// A W-bit reflected word holds the coefficient of x^d in bit W - 1 - d. A carry-less product of
// two such words of W1 and W2 bits is the (W1 + W2 - 1)-bit reflected word of the polynomial
// product (bit m of the product collects the bit pairs whose degrees add to W1 + W2 - 2 - m).
//  1. C = A * B, degree <= 62: clmul(a, b) << 1 is its 64-bit reflected word. Split C = H x^32 + L:
//     the upper 32 bits are L's 32-bit reflected word, the lower 32 bits H's.
//  2. H x^32 mod P by Barrett: with mu = floor(x^64 / P) (degree 32), the quotient is
//     T = floor(H * mu / x^32); clmul(H, mu as a 33-bit reflected word) is the 64-bit reflected
//     word of H * mu, whose lower 32 bits are T's 32-bit reflected word.
//  3. H x^32 - T P has degree < 32, and H x^32 and T x^32 have no terms below x^32, so it is the
//     low 32 coefficients of T * P: the upper 32 bits of clmul(T, P as a 33-bit reflected word).
//  The result is L + (H x^32 mod P). The Barrett quotient is exact because deg(H x^32) <= 63 < 2
//  deg P. Tests check it against the loop and against zlib's crc32_combine_op.

// The w-bit word v with its bits in the opposite order.
constexpr uint64_t reflect_bits(uint64_t v, int w) {
  uint64_t r = 0;
  for (int i = 0; i < w; ++i) r |= ((v >> i) & 1u) << (w - 1 - i);
  return r;
}

// P in the usual (not reflected) representation, x^32 as bit 32: 0x104C11DB7.
constexpr uint64_t kPolyNormal = uint64_t{1} << 32 | reflect_bits(kCrc32PolyReflected, 32);

// floor(x^64 / P) by long division, in the usual representation (degree 32, bit 32 set).
constexpr uint64_t barrett_mu_normal() {
  uint64_t rem = 0;  // the 33-bit window of the dividend x^64 being divided
  uint64_t quotient = 0;
  for (int d = 64; d >= 0; --d) {
    rem = rem << 1 | (d == 64 ? 1u : 0u);
    if ((rem >> 32) & 1) {
      rem ^= kPolyNormal;
      quotient |= uint64_t{1} << d;  // only ever d <= 32: bit 32 first appears at d = 32
    }
  }
  return quotient;
}

constexpr uint64_t kPolyReflected33 = reflect_bits(kPolyNormal, 33);
constexpr uint64_t kMuReflected33 = reflect_bits(barrett_mu_normal(), 33);
// The constants of Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"
// white paper and Linux's crc32-pclmul for this polynomial (P' and mu'), as a cross-check.
static_assert(kPolyReflected33 == 0x1DB710641);
static_assert(kMuReflected33 == 0x1F7011641);

// The low 64 bits of the carry-less product of x and y (both below 2^33 here, so nothing is lost).
__attribute__((target("pclmul"))) inline uint64_t clmul(uint64_t x, uint64_t y) {
  const __m128i product = _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<long long>(x)),
                                               _mm_cvtsi64_si128(static_cast<long long>(y)), 0x00);
  return static_cast<uint64_t>(_mm_cvtsi128_si64(product));
}

__attribute__((target("pclmul"))) uint32_t gf2_mul_mod_p_clmul(uint32_t a, uint32_t b) {
  const uint64_t c = clmul(a, b) << 1;
  const auto low = static_cast<uint32_t>(c >> 32);
  const uint64_t t = clmul(c & 0xFFFFFFFFu, kMuReflected33) & 0xFFFFFFFFu;
  return low ^ static_cast<uint32_t>(clmul(t, kPolyReflected33) >> 32);
}

const bool kCpuHasPclmul = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul") != 0;
}();

#endif

}  // namespace

uint32_t gf2_mul_mod_p_fast(uint32_t a, uint32_t b) {
#if defined(__x86_64__)
  if (kCpuHasPclmul) return gf2_mul_mod_p_clmul(a, b);
#endif
  return gf2_mul_mod_p(a, b);
}

uint32_t gf2_x_pow_mod_p(uint64_t k) {
  return pow_by_table(kXPow2, k);
}
uint32_t gf2_x_inv_pow_mod_p(uint64_t k) {
  return pow_by_table(kXInvPow2, k);
}

}  // namespace urdma::wire
