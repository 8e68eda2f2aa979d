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

// Replays are bit-identical down to the keys: MR and MW keys come from the seeded key source
// (DeviceConfig::key_seed), the hash covers every datagram's bytes (RETH rkeys included) and
// every completion field (invalidated rkeys included).
TEST(Cluster, ReplayRepeatsKeysAndPacketBytes) {
  ScenarioConfig c;
  c.errors_percent = 50;
  c.faults.loss_ppm = 10'000;
  for (uint64_t seed : {5, 6, 7}) {
    const Scenario s = generate(c, seed);
    const RunResult a = run_scenario(s);
    const RunResult b = run_scenario(s);
    EXPECT_EQ(a.trace_hash, b.trace_hash) << "seed " << seed;
    EXPECT_EQ(a.record.window_rkey, b.record.window_rkey) << "seed " << seed;
    ASSERT_EQ(a.record.completions.size(), b.record.completions.size());
    for (size_t k = 0; k < a.record.completions.size(); ++k)
      EXPECT_EQ(a.record.completions[k].wc.invalidated_rkey,
                b.record.completions[k].wc.invalidated_rkey);
    EXPECT_EQ(a.record.datagrams.size(), a.network.sent) << "every datagram is in the trace";
    EXPECT_EQ(a.record.memory, b.record.memory);
  }
}

// Injected errors on real engines: every fault gets the outcome the oracle predicts (or a
// retry exhaustion the trace justifies), and the runs pass.
TEST(Cluster, InjectedErrorsPassOnRealEngines) {
  ScenarioConfig c;
  c.errors_percent = 100;
  size_t faults = 0, failed = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    const Scenario s = generate(c, seed);
    const RunResult r = run_scenario(s);
    EXPECT_EQ(dump(r.violations), "") << "seed " << seed;
    for (size_t i = 0; i < s.sends.size(); ++i) {
      if (s.sends[i].fault == Fault::kNone || !r.record.send_posted_ns[i]) continue;
      ++faults;
      for (const ObservedCompletion& o : r.record.completions)
        if (o.wc.wr_id == (kWrIdSend | i) && o.wc.status != IBV_WC_SUCCESS) ++failed;
    }
  }
  EXPECT_GT(faults, 30u);
  EXPECT_GT(failed, faults / 2);
}

// The UC/UD delivery bound on a real trace: on a lossy network a device that dropped every UC
// and UD message would be allowed by "a subsequence", but the trace shows what arrived whole.
TEST(Cluster, DroppingEveryUnreliableMessageIsCaught) {
  ScenarioConfig c;
  c.faults.loss_ppm = 10'000;
  c.uc_pairs = 2;
  c.ud_per_host = 2;
  const Scenario s = generate(c, 11);
  RunResult r = run_scenario(s);
  ASSERT_EQ(dump(r.violations), "");
  size_t dropped = 0;
  for (ObservedCompletion& o : r.record.completions) {
    if (!o.recv_cq || o.wc.status != IBV_WC_SUCCESS) continue;
    const RecvSpec& v = s.recvs[o.wc.wr_id & ~kWrIdKindMask];
    if (v.qp == kNone || s.qps[v.qp].type == IBV_QPT_RC) continue;
    o.wc.status = IBV_WC_WR_FLUSH_ERR;  // as if never received, flushed at the drain
    o.time_ns = r.record.drain_ns;
    ++dropped;
  }
  ASSERT_GT(dropped, 0u);
  const std::vector<Violation> v = check(s, r.record);
  EXPECT_NE(dump(v).find("delivery: "), std::string::npos) << dump(v);
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
