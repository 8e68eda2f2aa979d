// CRC-32 (the IEEE 802.3 / zlib polynomial) and the GF(2) arithmetic behind it.
//
// The RoCEv2 ICRC (icrc.h) is this CRC over a masked pseudo-header and the packet. Every caller
// uses `crc32()`; the other three entry points are the candidates it was chosen from, kept for
// the benchmark (bench/crc_bench.cc) and as test oracles.
//
// Convention (zlib's): start with 0, chain by passing the previous result back in;
// crc32(crc32(0, a), b) == crc32(0, a ++ b). Internally the register starts at all ones and the
// result is complemented, so the empty message has CRC 0.
//
// GF(2) helpers. A CRC register value is a polynomial of degree < 32 over GF(2) in zlib's
// reflected representation: bit 31 is the coefficient of x^0, bit 0 that of x^31. For two messages
// A and B of the same length n, crc(A) ^ crc(B) = (A(x) ^ B(x)) * x^32 mod P (the initial and
// final complements cancel), so the CRC is affine in the message bits, and a change confined to a
// few bytes followed by m bytes moves the CRC by (change) * x^(8m + 32) mod P. These helpers let
// icrc.cc fold a header field in or out — and solve for an unknown one — without a second pass
// over the payload (the crc32_combine idea, O(log n)).
#pragma once

#include <cstdint>
#include <span>

namespace urdma::wire {

// The generator polynomial x^32 + x^26 + ... + 1 (0x04C11DB7), bit-reversed: IEEE 802.3, zlib,
// gzip and the RoCEv2 ICRC (IBA Annex A17) all use it.
inline constexpr uint32_t kCrc32PolyReflected = 0xEDB88320;
// The polynomial 1 and the polynomial x in the reflected representation.
inline constexpr uint32_t kGf2One = 0x80000000;
inline constexpr uint32_t kGf2X = 0x40000000;

// The production CRC-32: zlib convention, chainable. Implemented with isa-l's
// crc32_gzip_refl, the measured winner (see crc32.cc).
uint32_t crc32(uint32_t crc, std::span<const uint8_t> data);

// The candidates, all with the same convention (benchmark and tests only).
uint32_t crc32_isal(uint32_t crc, std::span<const uint8_t> data);
uint32_t crc32_zlib(uint32_t crc, std::span<const uint8_t> data);
uint32_t crc32_slicing_by_8(uint32_t crc, std::span<const uint8_t> data);  // hand loop

// a(x) * b(x) mod P, reflected representation.
constexpr uint32_t gf2_mul_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    // Invariant: b holds (the original b) * x^i mod P; bit 31 - i of a is a's x^i coefficient.
    product ^= b & (0u - ((a >> (31 - i)) & 1u));
    b = (b >> 1) ^ (kCrc32PolyReflected & (0u - (b & 1u)));
  }
  return product;
}

// The same product at run time, for the per-packet paths (icrc.cc's IPv4 ID solve and GSO ID
// change): on x86-64 with PCLMULQDQ, three carry-less multiplications (the product, then a Barrett
// reduction; crc32.cc derives it); elsewhere gf2_mul_mod_p. The loop above ran ~490 instructions
// in a callgrind profile; this is a dozen (bench/crc_bench.cc BM_Ipv4IdSolve: 45 -> 15 ns).
uint32_t gf2_mul_mod_p_fast(uint32_t a, uint32_t b);

// x^k mod P and x^-k mod P (x is invertible because P's constant term is 1), for any k.
// O(log k) multiplications with compile-time tables of x^(±2^i).
uint32_t gf2_x_pow_mod_p(uint64_t k);
uint32_t gf2_x_inv_pow_mod_p(uint64_t k);

// x^(8n) mod P: the operator that appends n zero bytes to a message (zlib's crc32_combine_gen).
inline uint32_t gf2_x8n_mod_p(uint64_t n) {
  return gf2_x_pow_mod_p(8 * n);
}

}  // namespace urdma::wire
