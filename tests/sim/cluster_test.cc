// The simulated cluster on real engines: a clean run passes, and the same seed replays
// bit-identically (same trace hash), while another seed does not.
#include "sim/cluster.h"

#include <gtest/gtest.h>

namespace urdma::sim {
namespace {

std::string dump(const std::vector<Violation>& v) {
  std::string out;
  for (const Violation& x : v) out += x.property + ": " + x.detail + "\n";
  return out;
}

TEST(Cluster, SameSeedSameTraceHash) {
  ScenarioConfig c;
  c.faults.loss_ppm = 20'000;
  c.faults.reorder_ppm = 20'000;
  c.faults.duplicate_ppm = 10'000;
  c.faults.corrupt_ppm = 10'000;
  const Scenario s = generate(c, 77);
  const RunResult a = run_scenario(s);
  const RunResult b = run_scenario(generate(c, 77));
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.network, b.network);
  EXPECT_NE(a.trace_hash, run_scenario(generate(c, 78)).trace_hash);
}

TEST(Cluster, ConnectsAndRunsASmallCleanScenario) {
  ScenarioConfig c;
  c.ops = *parse_ops("send,write,read");
  c.rc_pairs = 1;
  c.uc_pairs = 0;
  c.ud_per_host = 0;
  c.late_recv_percent = 0;
  const Scenario s = generate(c, 1);
  const RunResult r = run_scenario(s);
  EXPECT_TRUE(r.record.finished) << r.record.stall;
  EXPECT_GT(r.network.delivered, 0u);
  EXPECT_EQ(dump(r.violations), "");
}

}  // namespace
}  // namespace urdma::sim
