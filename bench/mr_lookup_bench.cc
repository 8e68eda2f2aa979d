// The MR table's access check as the engine calls it for every RETH, AtomicETH and SGE:
// lookup_remote and lookup_local hits in tables of 1, 64, 4096 and 65536 live MRs, and misses.
//
// What one iteration is: one lookup of the next key of a precomputed sequence, including the
// table's shared lock. The hit sequences are kOrderLength keys drawn uniformly from the live MRs
// (a shuffled permutation of them when there are at least as many), so the order defeats a
// prefetcher that walks the table and a table of 65536 MRs runs from the caches as a busy
// device's would. A miss names no live MR: keys drawn uniformly from the 32-bit space, every one
// refused as kBadKey. Every lookup's result is checked after the timed loop (SkipWithError).
//
// The keys come from a fixed key_seed, so every run looks up the same table.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "provider/limits.h"
#include "provider/mr_table.h"
#include "provider/pd.h"

namespace urdma::provider {
namespace {

constexpr size_t kOrderLength = size_t{1} << 16;  // keys per sequence; a power of two
constexpr uint64_t kKeySeed = 0x6b657973;
constexpr uint64_t kRegionBytes = 4096;

class LookupFixture {
 public:
  explicit LookupFixture(size_t live) : table_(kLimits.max_mr, kLimits.max_mw, kKeySeed) {
    std::vector<uint32_t> keys;
    for (size_t i = 0; i < live; ++i) {
      Result<Mr*> mr = table_.reg(&pd_, buf_.data(), kRegionBytes, va(),
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
      if (!mr.ok()) return;
      keys.push_back(mr.value()->rkey());
    }
    std::mt19937_64 rng(live);
    if (keys.size() >= kOrderLength) {
      std::shuffle(keys.begin(), keys.end(), rng);
      hits_.assign(keys.begin(), keys.begin() + kOrderLength);
    } else {
      std::uniform_int_distribution<size_t> pick(0, keys.size() - 1);
      for (size_t i = 0; i < kOrderLength; ++i) hits_.push_back(keys[pick(rng)]);
    }
    std::sort(keys.begin(), keys.end());
    while (misses_.size() < kOrderLength) {
      const uint32_t key = static_cast<uint32_t>(rng());
      if (!std::binary_search(keys.begin(), keys.end(), key)) misses_.push_back(key);
    }
    ready_ = true;
  }

  bool ready() const { return ready_; }
  uint64_t va() const { return reinterpret_cast<uintptr_t>(buf_.data()); }
  const Pd* pd() const { return &pd_; }
  const MrTable& table() const { return table_; }
  const std::vector<uint32_t>& hits() const { return hits_; }
  const std::vector<uint32_t>& misses() const { return misses_; }

 private:
  Pd pd_{1};
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(kRegionBytes);
  MrTable table_;
  std::vector<uint32_t> hits_;
  std::vector<uint32_t> misses_;
  bool ready_ = false;
};

// Runs `lookup` over `keys` in order, kOrderLength at a time, and checks every result once the
// timing is over: `granted` says whether every lookup had to succeed or every one fail.
template <class Lookup>
void run(benchmark::State& state, const std::vector<uint32_t>& keys, bool granted, Lookup lookup) {
  size_t i = 0;
  size_t wrong = 0;
  for (auto _ : state) {
    const MemRef ref = lookup(keys[i++ & (kOrderLength - 1)]);
    wrong += ref.ok() != granted;
    benchmark::DoNotOptimize(ref);
  }
  if (wrong != 0) state.SkipWithError(granted ? "a live key was refused" : "a miss was granted");
}

void BM_LookupRemoteHit(benchmark::State& state) {
  const LookupFixture f(static_cast<size_t>(state.range(0)));
  if (!f.ready()) return state.SkipWithError("registration failed");
  run(state, f.hits(), true, [&](uint32_t rkey) {
    return f.table().lookup_remote(rkey, f.pd(), 0, IBV_ACCESS_REMOTE_READ, f.va() + 64, 512);
  });
}

void BM_LookupLocalHit(benchmark::State& state) {
  const LookupFixture f(static_cast<size_t>(state.range(0)));
  if (!f.ready()) return state.SkipWithError("registration failed");
  run(state, f.hits(), true, [&](uint32_t lkey) {
    return f.table().lookup_local(lkey, f.pd(), IBV_ACCESS_LOCAL_WRITE, f.va() + 64, 512);
  });
}

void BM_LookupRemoteMiss(benchmark::State& state) {
  const LookupFixture f(static_cast<size_t>(state.range(0)));
  if (!f.ready()) return state.SkipWithError("registration failed");
  run(state, f.misses(), false, [&](uint32_t rkey) {
    return f.table().lookup_remote(rkey, f.pd(), 0, IBV_ACCESS_REMOTE_READ, f.va() + 64, 512);
  });
}

// A peer's WRITE of state.range(0) bytes into resident memory, checked through an implicit ODP
// MR (every lookup asks the kernel whether the pages are mapped and writable: one madvise) and
// through an ordinary MR over the same bytes.
void BM_LookupRemoteWriteImplicit(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> buf(bytes, 1);
  Pd pd{1};
  MrTable table(kLimits.max_mr, kLimits.max_mw, kKeySeed);
  Result<Mr*> mr = table.reg(&pd, nullptr, ~uint64_t{0}, 0,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND);
  if (!mr.ok()) return state.SkipWithError("no implicit ODP here");
  const std::vector<uint32_t> keys(kOrderLength, mr.value()->rkey());
  const uint64_t va = reinterpret_cast<uintptr_t>(buf.data());
  run(state, keys, true, [&](uint32_t rkey) {
    return table.lookup_remote(rkey, &pd, 0, IBV_ACCESS_REMOTE_WRITE, va, bytes);
  });
}

void BM_LookupRemoteWriteExplicit(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  std::vector<uint8_t> buf(bytes, 1);
  Pd pd{1};
  MrTable table(kLimits.max_mr, kLimits.max_mw, kKeySeed);
  const uint64_t va = reinterpret_cast<uintptr_t>(buf.data());
  Result<Mr*> mr = table.reg(&pd, buf.data(), bytes, va,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND);
  if (!mr.ok()) return state.SkipWithError("registration failed");
  const std::vector<uint32_t> keys(kOrderLength, mr.value()->rkey());
  run(state, keys, true, [&](uint32_t rkey) {
    return table.lookup_remote(rkey, &pd, 0, IBV_ACCESS_REMOTE_WRITE, va, bytes);
  });
}

BENCHMARK(BM_LookupRemoteWriteImplicit)->Arg(64)->Arg(4096)->Arg(65536);
BENCHMARK(BM_LookupRemoteWriteExplicit)->Arg(64)->Arg(4096)->Arg(65536);
BENCHMARK(BM_LookupRemoteHit)->Arg(1)->Arg(64)->Arg(4096)->Arg(65536);
BENCHMARK(BM_LookupLocalHit)->Arg(1)->Arg(64)->Arg(4096)->Arg(65536);
BENCHMARK(BM_LookupRemoteMiss)->Arg(64)->Arg(65536);

}  // namespace
}  // namespace urdma::provider
