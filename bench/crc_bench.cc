// CRC-32 candidates beside memcpy of the same sizes, the full RoCEv2 ICRC, and the IPv4 ID
// solve. Results and the command that produced them: docs/PERFORMANCE.md.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "wire/crc32.h"
#include "wire/icrc.h"

// isa-l's own variants of crc32_gzip_refl, which its dispatcher chooses between at run time by
// CPU features (libisal2 exports them; its headers do not declare them): by8 folds with 128-bit
// PCLMULQDQ (SSE), by16_10 with 512-bit VPCLMULQDQ (AVX-512) — the one the dispatcher picks on
// AVX-512 CPUs, and the one issue 7's Intel profile shows. Called directly to compare the two
// on the ICRC's short buffers.
extern "C" uint32_t crc32_gzip_refl_by8(uint32_t crc, const unsigned char* buf, uint64_t len);
extern "C" uint32_t crc32_gzip_refl_by16_10(uint32_t crc, const unsigned char* buf, uint64_t len);

namespace urdma::wire {
namespace {

uint32_t crc32_isal_by8(uint32_t crc, std::span<const uint8_t> d) {
  return crc32_gzip_refl_by8(crc, d.data(), d.size());
}
uint32_t crc32_isal_by16_10(uint32_t crc, std::span<const uint8_t> d) {
  return crc32_gzip_refl_by16_10(crc, d.data(), d.size());
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::mt19937 rng(1);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

template <uint32_t (*Fn)(uint32_t, std::span<const uint8_t>)>
void BM_Crc(benchmark::State& state) {
  const std::vector<uint8_t> data = random_bytes(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    uint32_t c = Fn(0, data);
    benchmark::DoNotOptimize(c);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<uint8_t> src = random_bytes(static_cast<size_t>(state.range(0)));
  std::vector<uint8_t> dst(src.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(dst.data());
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

#define URDMA_CRC_SIZES Arg(64)->Arg(1024)->Arg(4096)
BENCHMARK(BM_Memcpy)->URDMA_CRC_SIZES;
BENCHMARK(BM_Crc<crc32_isal>)->Name("BM_Crc/isal_crc32_gzip_refl")->URDMA_CRC_SIZES;
BENCHMARK(BM_Crc<crc32_zlib>)->Name("BM_Crc/zlib_crc32")->URDMA_CRC_SIZES;
BENCHMARK(BM_Crc<crc32_slicing_by_8>)->Name("BM_Crc/slicing_by_8")->URDMA_CRC_SIZES;
// The ICRC's pieces: the 48-byte masked pseudo-header, a 96-byte WRITE Only of 64 B, and the
// sizes between that and a 4 KiB packet, where by8 and by16_10 cross over.
#define URDMA_CRC_CROSSOVER_SIZES \
  Arg(48)->Arg(96)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->Arg(4096)
BENCHMARK(BM_Crc<crc32_isal_by8>)->Name("BM_Crc/isal_by8_sse")->URDMA_CRC_CROSSOVER_SIZES;
BENCHMARK(BM_Crc<crc32_isal_by16_10>)
    ->Name("BM_Crc/isal_by16_10_avx512")
    ->URDMA_CRC_CROSSOVER_SIZES;
BENCHMARK(BM_Crc<crc32_isal>)->Name("BM_Crc/isal_dispatched")->URDMA_CRC_CROSSOVER_SIZES;

// A whole packet: UDP payload of BTH + `range(0)` bytes + ICRC.
std::vector<uint8_t> packet(benchmark::State& state) {
  return random_bytes(BthView::kSize + static_cast<size_t>(state.range(0)) + kIcrcBytes);
}

const IcrcIpv4Flow kFlow{
    .src_addr = {10, 0, 0, 1}, .dst_addr = {10, 0, 0, 2}, .udp_src_port = 49152};

void BM_IcrcComputeIpv4(benchmark::State& state) {
  std::vector<uint8_t> p = packet(state);
  for (auto _ : state) {
    uint32_t c = compute_icrc(IcrcIpv4{.flow = kFlow}, p);
    benchmark::DoNotOptimize(c);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.size()));
}
BENCHMARK(BM_IcrcComputeIpv4)->Arg(8)->Arg(1024)->Arg(4096);

// Receive side, urdma peer: ICRC at {ID 0, DF} matches on the first try.
void BM_IcrcVerifyIpv4Id0(benchmark::State& state) {
  std::vector<uint8_t> p = packet(state);
  seal_icrc(IcrcIpv4{.flow = kFlow}, p);
  for (auto _ : state) {
    Ipv4IcrcMatch m = verify_icrc_ipv4(kFlow, p, Ipv4DfSearch::kSetOnly);
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.size()));
}
BENCHMARK(BM_IcrcVerifyIpv4Id0)->Arg(8)->Arg(1024)->Arg(4096);

// Receive side, Linux rxe peer: non-zero ID, recovered by the solve.
void BM_IcrcVerifyIpv4SolvedId(benchmark::State& state) {
  std::vector<uint8_t> p = packet(state);
  seal_icrc(IcrcIpv4{.flow = kFlow, .ip_id = 0x32cc}, p);
  for (auto _ : state) {
    Ipv4IcrcMatch m = verify_icrc_ipv4(kFlow, p, Ipv4DfSearch::kSetOnly);
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * p.size()));
}
BENCHMARK(BM_IcrcVerifyIpv4SolvedId)->Arg(8)->Arg(1024)->Arg(4096);

// The solve alone, per packet (independent of the CRC pass).
void BM_Ipv4IdSolve(benchmark::State& state) {
  std::vector<uint8_t> p = packet(state);
  const uint32_t at_id0 = compute_icrc(IcrcIpv4{.flow = kFlow}, p);
  const uint32_t received = compute_icrc(IcrcIpv4{.flow = kFlow, .ip_id = 0x32cc}, p);
  for (auto _ : state) {
    Ipv4IcrcMatch m = solve_ipv4_id(received, at_id0, p.size(), Ipv4DfSearch::kSetOnly);
    benchmark::DoNotOptimize(m);
  }
}
BENCHMARK(BM_Ipv4IdSolve)->Arg(1024)->Arg(4096);

// What the solve costs the first time a thread meets a packet length (the per-length factor
// x^-(8m + 32) mod P, O(log n) multiplications; cached afterwards).
void BM_Ipv4IdSolveFactorUncached(benchmark::State& state) {
  const uint64_t bytes_after = BthView::kSize + static_cast<uint64_t>(state.range(0)) + 17;
  for (auto _ : state) {
    uint32_t f = gf2_x_inv_pow_mod_p(8 * bytes_after + 32);
    benchmark::DoNotOptimize(f);
  }
}
BENCHMARK(BM_Ipv4IdSolveFactorUncached)->Arg(1024)->Arg(4096);

}  // namespace
}  // namespace urdma::wire
