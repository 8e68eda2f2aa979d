// The scenario generator: deterministic, within its limits, and covering what it promises.
#include "sim/scenario.h"

#include <gtest/gtest.h>

#include <set>

namespace urdma::sim {
namespace {

bool same(const Scenario& a, const Scenario& b) {
  if (a.sends.size() != b.sends.size() || a.recvs.size() != b.recvs.size() ||
      a.qps.size() != b.qps.size() || a.regions.size() != b.regions.size())
    return false;
  for (size_t i = 0; i < a.sends.size(); ++i) {
    const SendSpec& x = a.sends[i];
    const SendSpec& y = b.sends[i];
    if (x.qp != y.qp || x.op != y.op || x.length() != y.length() || x.post_ns != y.post_ns ||
        x.remote_offset != y.remote_offset || x.imm != y.imm || x.swap != y.swap)
      return false;
  }
  for (size_t i = 0; i < a.regions.size(); ++i)
    if (a.regions[i].size != b.regions[i].size || a.regions[i].iova != b.regions[i].iova)
      return false;
  return true;
}

TEST(Scenario, SameSeedSameScenario) {
  const ScenarioConfig c;
  EXPECT_TRUE(same(generate(c, 42), generate(c, 42)));
  EXPECT_FALSE(same(generate(c, 42), generate(c, 43)));
  EXPECT_EQ(generate(c, 7).initial_image(3), generate(c, 7).initial_image(3));
}

TEST(Scenario, RespectsOpMixAndQpTypes) {
  ScenarioConfig c;
  c.ops = *parse_ops("send,write,read");
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const Scenario s = generate(c, seed);
    for (const SendSpec& w : s.sends) {
      EXPECT_TRUE(w.op == Op::kSend || w.op == Op::kWrite || w.op == Op::kRead)
          << op_info(w.op).name;
      const ibv_qp_type t = s.qps[w.qp].type;
      const OpInfo& info = op_info(w.op);
      EXPECT_TRUE(t == IBV_QPT_RC ? info.rc : t == IBV_QPT_UC ? info.uc : info.ud);
    }
  }
}

TEST(Scenario, SizesStayWithinLimits) {
  ScenarioConfig c;
  c.max_size_bytes = 3 << 20;
  c.memory_budget_bytes = 16 << 20;
  std::set<uint64_t> sizes;
  bool zero = false, large = false, mtu_edge = false;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const Scenario s = generate(c, seed);
    uint64_t target = 0;
    for (const RegionSpec& r : s.regions)
      if (r.kind == RegionSpec::Kind::kTarget) target += r.size;
    EXPECT_LE(target, c.memory_budget_bytes + (1 << 20));
    for (const SendSpec& w : s.sends) {
      const uint64_t n = w.length();
      EXPECT_LE(n, c.max_size_bytes);
      if (s.qps[w.qp].type == IBV_QPT_UD) {
        EXPECT_LE(n, kUdMaxPayloadBytes);
      }
      if (op_info(w.op).atomic) {
        EXPECT_EQ(n, 8u);
      }
      EXPECT_LE(w.sges.size(), kMaxSge);
      zero |= n == 0;
      large |= n > (1 << 20);
      mtu_edge |= n == 4097 || n == 1023 || n == 2048;
      if (w.inline_data) {
        EXPECT_LE(n, kMaxInlineBytes);
      }
    }
  }
  EXPECT_TRUE(zero);
  EXPECT_TRUE(large);
  EXPECT_TRUE(mtu_edge);
}

TEST(Scenario, UsesEveryOperationAndFeature) {
  const ScenarioConfig c;
  std::set<Op> ops;
  bool fence = false, unsignaled = false, late = false, srq = false, wrap = false;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const Scenario s = generate(c, seed);
    for (const SendSpec& w : s.sends) {
      ops.insert(w.op);
      fence |= w.fence;
      unsignaled |= !w.signaled;
    }
    for (const RecvSpec& r : s.recvs) late |= r.post_ns > 0;
    for (const QpSpec& q : s.qps) {
      srq |= q.use_srq;
      wrap |= q.sq_psn > 0xffff00;
    }
  }
  EXPECT_EQ(ops.size(), kOpCount);
  EXPECT_TRUE(fence);
  EXPECT_TRUE(unsignaled);
  EXPECT_TRUE(late);
  EXPECT_TRUE(srq);
  EXPECT_TRUE(wrap);
}

TEST(Scenario, LastSendOfEveryQpIsSignaled) {
  const Scenario s = generate(ScenarioConfig{}, 99);
  std::vector<int> last(s.qps.size(), -1);
  for (size_t i = 0; i < s.sends.size(); ++i) last[s.sends[i].qp] = static_cast<int>(i);
  for (int i : last)
    if (i >= 0) {
      EXPECT_TRUE(s.sends[i].signaled);
    }
}

TEST(Scenario, DependenciesPointBackwards) {
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const Scenario s = generate(ScenarioConfig{}, seed);
    for (size_t i = 0; i < s.sends.size(); ++i)
      if (s.sends[i].after != kNone) {
        EXPECT_LT(s.sends[i].after, i);
      }
  }
}

TEST(Scenario, InjectsEveryFaultAsAMinority) {
  ScenarioConfig c;
  c.errors_percent = 30;
  std::set<Fault> seen;
  size_t faulted_pairs = 0, pairs = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Scenario s = generate(c, seed);
    std::set<uint32_t> qps;
    for (const SendSpec& w : s.sends)
      if (w.fault != Fault::kNone) {
        seen.insert(w.fault);
        if (s.qps[w.qp].type == IBV_QPT_RC) qps.insert(std::min(w.qp, s.qps[w.qp].peer));
        const bool consumes = w.fault == Fault::kShortRecv || w.fault == Fault::kRnr ||
                              w.fault == Fault::kBadInvalidate;
        if (consumes) {
          EXPECT_FALSE(s.qps[s.qps[w.qp].peer].use_srq) << "faulted receives come from an RQ";
        }
      }
    for (const QpSpec& q : s.qps) seen.insert(q.dead ? Fault::kDeadPeer : Fault::kNone);
    faulted_pairs += qps.size();
    pairs += c.rc_pairs;
  }
  EXPECT_EQ(seen.size(), kFaultCount) << "every fault, and kNone";
  EXPECT_LT(faulted_pairs, pairs / 2) << "a minority of the pairs";
  EXPECT_GT(faulted_pairs, pairs / 10);
  // Without --errors-percent there are none.
  for (uint64_t seed = 1; seed <= 50; ++seed)
    for (const SendSpec& w : generate(ScenarioConfig{}, seed).sends)
      EXPECT_EQ(w.fault, Fault::kNone);
}

TEST(Scenario, ParseOps) {
  EXPECT_EQ(parse_ops("all"), all_ops());
  const std::optional<OpSet> s = parse_ops("send,fetch_add");
  ASSERT_TRUE(s);
  EXPECT_EQ(to_string(*s), "send,fetch_add");
  EXPECT_FALSE(parse_ops("send,teleport"));
}

}  // namespace
}  // namespace urdma::sim
