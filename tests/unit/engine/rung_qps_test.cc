// The doorbell bitmap: bits set from several threads while the engine thread drains are all
// seen (at least once), and a drain with nothing rung reports nothing.
#include "engine/rung_qps.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace urdma::engine {
namespace {

TEST(RungQps, DrainReportsEachSetHandleOnceAndClears) {
  RungQps rung;
  const uint32_t handles[] = {0, 1, 63, 64, 200, 4095};
  for (uint32_t h : handles) rung.set(h);
  rung.set(64);  // twice before a drain: reported once
  std::vector<uint32_t> seen;
  rung.drain([&](uint32_t h) { seen.push_back(h); });
  EXPECT_EQ(seen, std::vector<uint32_t>(std::begin(handles), std::end(handles)));
  seen.clear();
  rung.drain([&](uint32_t h) { seen.push_back(h); });
  EXPECT_TRUE(seen.empty());
}

// Setters on several threads while the drainer drains: after the setters finish and one last
// drain, every handle set was reported by some drain.
TEST(RungQps, ConcurrentSettersAreNeverLost) {
  constexpr uint32_t kThreads = 3;
  constexpr uint32_t kRounds = 20;
  RungQps rung;
  std::vector<uint8_t> seen(RungQps::kCapacity, 0);  // drainer thread only, then main
  std::atomic<bool> done{false};
  std::thread drainer([&] {
    while (!done.load(std::memory_order_acquire)) rung.drain([&](uint32_t h) { seen[h] = 1; });
  });
  std::vector<std::thread> setters;
  for (uint32_t t = 0; t < kThreads; ++t) {
    setters.emplace_back([&, t] {
      for (uint32_t r = 0; r < kRounds; ++r)
        for (uint32_t h = t; h < RungQps::kCapacity; h += kThreads) rung.set(h);
    });
  }
  for (auto& s : setters) s.join();
  done.store(true, std::memory_order_release);
  drainer.join();
  rung.drain([&](uint32_t h) { seen[h] = 1; });
  for (uint32_t h = 0; h < RungQps::kCapacity; ++h) ASSERT_EQ(seen[h], 1) << "handle " << h;
}

}  // namespace
}  // namespace urdma::engine
