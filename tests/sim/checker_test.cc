// The property checker on hand-made histories: a perfect run (the oracle) passes for every
// seed, and each corruption of it is reported as the property it breaks.
#include "sim/checker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "sim/oracle.h"

namespace urdma::sim {
namespace {

std::string dump(const std::vector<Violation>& v) {
  std::string out;
  for (const Violation& x : v) out += x.property + ": " + x.detail + "\n";
  return out;
}

bool reports(const std::vector<Violation>& v, const std::string& property) {
  return std::any_of(v.begin(), v.end(),
                     [&](const Violation& x) { return x.property == property; });
}

class CheckerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = generate(ScenarioConfig{}, 12345);
    run_ = oracle_run(s_);
  }
  // The first send (by index) that satisfies `pred`.
  size_t find_send(const std::function<bool(const SendSpec&)>& pred) const {
    for (size_t i = 0; i < s_.sends.size(); ++i)
      if (pred(s_.sends[i])) return i;
    ADD_FAILURE() << "scenario has no such send";
    return 0;
  }
  ObservedCompletion* completion_of(uint64_t wr_id) {
    for (ObservedCompletion& c : run_.completions)
      if (c.wc.wr_id == wr_id) return &c;
    return nullptr;
  }
  uint8_t& byte(uint32_t region, uint64_t offset) {
    return run_.memory[region][kGuardBytes + offset];
  }
  std::vector<Violation> check_run() { return check(s_, run_); }

  Scenario s_;
  RunRecord run_;
};

TEST(CheckerOracle, PerfectRunsPassForManySeeds) {
  ScenarioConfig c;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Scenario s = generate(c, seed);
    const std::vector<Violation> v = check(s, oracle_run(s));
    ASSERT_TRUE(v.empty()) << "seed " << seed << "\n" << dump(v);
  }
}

TEST(CheckerOracle, PerfectRunsPassWithLargeMessages) {
  ScenarioConfig c;
  c.max_size_bytes = 4 << 20;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Scenario s = generate(c, seed);
    const std::vector<Violation> v = check(s, oracle_run(s));
    ASSERT_TRUE(v.empty()) << "seed " << seed << "\n" << dump(v);
  }
}

TEST_F(CheckerTest, PerfectRunPasses) {
  EXPECT_EQ(dump(check_run()), "");
}

TEST_F(CheckerTest, Progress) {
  run_.finished = false;
  run_.stall = "virtual deadline";
  EXPECT_TRUE(reports(check_run(), "progress"));
}

TEST_F(CheckerTest, DuplicateCompletion) {
  run_.completions.push_back(run_.completions.front());
  EXPECT_TRUE(reports(check_run(), "exactly-once"));
}

TEST_F(CheckerTest, MissingCompletion) {
  const size_t i = find_send([](const SendSpec& w) { return w.signaled; });
  std::erase_if(run_.completions,
                [&](const ObservedCompletion& c) { return c.wc.wr_id == (kWrIdSend | i); });
  EXPECT_TRUE(reports(check_run(), "exactly-once"));
}

TEST_F(CheckerTest, UnsignaledSuccessCompletion) {
  const size_t i = find_send([&](const SendSpec& w) {
    return !w.signaled && !s_.qps[w.qp].sq_sig_all && !op_info(w.op).local;
  });
  ibv_wc wc = {};
  wc.wr_id = kWrIdSend | i;
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = op_info(s_.sends[i].op).wc;
  wc.qp_num = run_.qp_num[s_.sends[i].qp];
  run_.completions.push_back({0, s_.qps[s_.sends[i].qp].host, false, wc});
  EXPECT_TRUE(reports(check_run(), "exactly-once"));
}

TEST_F(CheckerTest, MissingReceiveFlush) {
  // The last completion is a flushed receive from the final drain.
  ASSERT_EQ(run_.completions.back().wc.status, IBV_WC_WR_FLUSH_ERR);
  run_.completions.pop_back();
  EXPECT_TRUE(reports(check_run(), "exactly-once"));
}

TEST_F(CheckerTest, UnknownWrId) {
  run_.completions.front().wc.wr_id = 0xdead;
  EXPECT_TRUE(reports(check_run(), "exactly-once"));
}

TEST_F(CheckerTest, OutOfOrderSendCompletions) {
  // Two successive signaled completions of one QP, swapped.
  for (size_t a = 0; a < run_.completions.size(); ++a) {
    const ObservedCompletion& x = run_.completions[a];
    if (x.recv_cq) continue;
    for (size_t b = a + 1; b < run_.completions.size(); ++b) {
      const ObservedCompletion& y = run_.completions[b];
      if (!y.recv_cq && y.wc.qp_num == x.wc.qp_num) {
        std::swap(run_.completions[a], run_.completions[b]);
        EXPECT_TRUE(reports(check_run(), "order"));
        return;
      }
    }
  }
  FAIL() << "no QP with two send completions";
}

TEST_F(CheckerTest, FailureWithoutPartition) {
  const size_t i = find_send([](const SendSpec& w) { return w.signaled; });
  completion_of(kWrIdSend | i)->wc.status = IBV_WC_REM_ACCESS_ERR;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(CheckerTest, NoFlushAfterError) {
  // With a partition, RETRY_EXC_ERR is allowed — but then every later WR must flush.
  s_.config.faults.partitions = {{0, 1'000'000'000}};
  const size_t i = find_send([&](const SendSpec& w) {
    if (s_.qps[w.qp].type != IBV_QPT_RC || !w.signaled) return false;
    for (size_t j = &w - s_.sends.data() + 1; j < s_.sends.size(); ++j)
      if (s_.sends[j].qp == w.qp && s_.sends[j].signaled) return true;
    return false;
  });
  completion_of(kWrIdSend | i)->wc.status = IBV_WC_RETRY_EXC_ERR;
  const std::vector<Violation> v = check_run();
  EXPECT_TRUE(reports(v, "status")) << dump(v);
}

TEST_F(CheckerTest, WrongSendOpcode) {
  const size_t i = find_send([](const SendSpec& w) { return w.signaled && w.op == Op::kWrite; });
  completion_of(kWrIdSend | i)->wc.opcode = IBV_WC_SEND;
  EXPECT_TRUE(reports(check_run(), "fields"));
}

TEST_F(CheckerTest, WrongQpNum) {
  const size_t i = find_send([](const SendSpec& w) { return w.signaled; });
  completion_of(kWrIdSend | i)->wc.qp_num ^= 1;
  EXPECT_TRUE(reports(check_run(), "fields"));
}

TEST_F(CheckerTest, WrongReadByteLen) {
  const size_t i = find_send([](const SendSpec& w) { return w.signaled && w.op == Op::kRead; });
  completion_of(kWrIdSend | i)->wc.byte_len += 1;
  EXPECT_TRUE(reports(check_run(), "fields"));
}

TEST_F(CheckerTest, WrongImmediate) {
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && (c.wc.wc_flags & IBV_WC_WITH_IMM)) {
      c.wc.imm_data ^= 0x100;
      EXPECT_TRUE(reports(check_run(), "delivery"));
      return;
    }
  FAIL() << "no receive with immediate data";
}

TEST_F(CheckerTest, WrongReceiveLength) {
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && c.wc.status == IBV_WC_SUCCESS) {
      c.wc.byte_len += 1;
      EXPECT_TRUE(reports(check_run(), "delivery"));
      return;
    }
}

TEST_F(CheckerTest, WrongUdSourceQp) {
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && (c.wc.wc_flags & IBV_WC_GRH)) {
      c.wc.src_qp ^= 1;
      EXPECT_TRUE(reports(check_run(), "delivery"));
      return;
    }
  FAIL() << "no UD receive";
}

TEST_F(CheckerTest, LostRcMessage) {
  // Drop an RC receive completion: the message is missing, and the buffer keeps its data.
  for (size_t k = 0; k < run_.completions.size(); ++k) {
    const ObservedCompletion& c = run_.completions[k];
    if (!c.recv_cq || c.wc.status != IBV_WC_SUCCESS) continue;
    const size_t r = c.wc.wr_id & ~kWrIdKindMask;
    const RecvSpec& v = s_.recvs[r];
    const uint32_t q = v.qp != kNone ? v.qp : kNone;
    if (q == kNone || s_.qps[q].type != IBV_QPT_RC) continue;
    run_.completions.erase(run_.completions.begin() + static_cast<ptrdiff_t>(k));
    EXPECT_TRUE(reports(check_run(), "delivery") || reports(check_run(), "exactly-once"));
    return;
  }
}

TEST_F(CheckerTest, WrongPayloadByte) {
  const size_t i = find_send([](const SendSpec& w) { return w.op == Op::kWrite && w.length(); });
  const SendSpec& w = s_.sends[i];
  byte(w.remote_region, w.remote_offset + w.length() - 1) ^= 0x80;
  EXPECT_TRUE(reports(check_run(), "data"));
}

TEST_F(CheckerTest, WrongReadResult) {
  const size_t i = find_send([](const SendSpec& w) { return w.op == Op::kRead && w.length(); });
  for (const Sge& g : s_.sends[i].sges)
    if (g.length) {
      byte(g.region, g.offset) ^= 1;
      break;
    }
  EXPECT_TRUE(reports(check_run(), "data"));
}

TEST_F(CheckerTest, WrongReceivedByte) {
  for (const ObservedCompletion& c : run_.completions) {
    if (!c.recv_cq || c.wc.status != IBV_WC_SUCCESS || c.wc.opcode != IBV_WC_RECV) continue;
    if (c.wc.byte_len <= ((c.wc.wc_flags & IBV_WC_GRH) ? kGrhBytes : 0)) continue;
    const RecvSpec& v = s_.recvs[c.wc.wr_id & ~kWrIdKindMask];
    const Sge& g = v.sges.back();  // the message's last bytes, or the untouched rest
    if (!g.length) continue;
    byte(g.region, g.offset + g.length - 1) ^= 0x55;
    const std::vector<Violation> vs = check_run();
    EXPECT_TRUE(reports(vs, "data") || reports(vs, "delivery") || reports(vs, "guard")) << dump(vs);
    return;
  }
}

TEST_F(CheckerTest, GuardBytes) {
  run_.memory[0][0] ^= 1;  // before the first registration
  EXPECT_TRUE(reports(check_run(), "guard"));
  run_.memory[0][0] ^= 1;
  run_.memory[2].back() ^= 1;  // after a target region
  EXPECT_TRUE(reports(check_run(), "guard"));
}

TEST_F(CheckerTest, WriteIntoGapBetweenBuffers) {
  // Gaps between bump-allocated ranges are untouched; the last bytes of a target region are a
  // gap.
  for (uint32_t r = 0; r < s_.regions.size(); ++r)
    if (s_.regions[r].kind == RegionSpec::Kind::kTarget) {
      byte(r, s_.regions[r].size - 1) ^= 1;
      EXPECT_TRUE(reports(check_run(), "guard"));
      return;
    }
}

TEST_F(CheckerTest, SourceRegionWritten) {
  byte(0, 17) ^= 1;  // region 0 is host 0's first source region
  ASSERT_EQ(s_.regions[0].kind, RegionSpec::Kind::kSource);
  EXPECT_TRUE(reports(check_run(), "guard"));
}

uint64_t load(const std::vector<uint8_t>& mem, uint64_t offset) {
  uint64_t v;
  std::memcpy(&v, mem.data() + kGuardBytes + offset, 8);
  return v;
}
void store(std::vector<uint8_t>& mem, uint64_t offset, uint64_t v) {
  std::memcpy(mem.data() + kGuardBytes + offset, &v, 8);
}

TEST_F(CheckerTest, FetchAddExecutedTwice) {
  const size_t i = find_send([](const SendSpec& w) { return w.op == Op::kFetchAdd; });
  const SendSpec& w = s_.sends[i];
  std::vector<uint8_t>& mem = run_.memory[w.remote_region];
  store(mem, w.remote_offset, load(mem, w.remote_offset) + w.compare_add);
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(CheckerTest, FetchAddWrongResult) {
  const size_t i = find_send([](const SendSpec& w) { return w.op == Op::kFetchAdd; });
  const Sge& g = s_.sends[i].sges[0];
  std::vector<uint8_t>& mem = run_.memory[g.region];
  store(mem, g.offset, load(mem, g.offset) + 1);
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(CheckerTest, CmpSwpValueNeverHeld) {
  const size_t i = find_send([](const SendSpec& w) { return w.op == Op::kCmpSwp; });
  const Sge& g = s_.sends[i].sges[0];
  store(run_.memory[g.region], g.offset, 0x1234'5678);
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(CheckerTest, CmpSwpSwapLost) {
  // A winning CMP_SWP whose swap never reached the counter.
  for (size_t i = 0; i < s_.sends.size(); ++i) {
    const SendSpec& w = s_.sends[i];
    if (w.op != Op::kCmpSwp) continue;
    if (load(run_.memory[w.sges[0].region], w.sges[0].offset) != w.compare_add) continue;
    std::vector<uint8_t>& mem = run_.memory[w.remote_region];
    if (load(mem, w.remote_offset) != w.swap) continue;  // only the last winner
    store(mem, w.remote_offset, w.compare_add);
    EXPECT_TRUE(reports(check_run(), "atomic"));
    return;
  }
  GTEST_SKIP() << "no final winning CMP_SWP in this seed";
}

// A partition scenario: the oracle's run has every send succeed, which across a long
// partition is itself a violation (nothing can be acknowledged while the peer is cut off).
class RetryBoundTest : public CheckerTest {
 protected:
  void SetUp() override {
    ScenarioConfig c;
    c.faults.partitions = {{kStart, 1'000'000'000}};
    for (uint64_t seed = 1; seed < 200; ++seed) {
      s_ = generate(c, seed);
      for (size_t i = 0; i < s_.sends.size(); ++i) {
        const SendSpec& w = s_.sends[i];
        const QpSpec& q = s_.qps[w.qp];
        if (q.type == IBV_QPT_RC && w.post_ns > kStart && w.signaled && !op_info(w.op).local &&
            (q.host == 0) != (s_.qps[q.peer].host == 0)) {
          pending_ = i;
          run_ = oracle_run(s_);
          return;
        }
      }
    }
    FAIL() << "no scenario with RC work across the cut";
  }
  // Turns the pending send's completion into RETRY_EXC_ERR at `t` and flushes the rest of its
  // QP.
  void fail_at(uint64_t t) {
    const uint32_t q = s_.sends[pending_].qp;
    bool after = false;
    for (ObservedCompletion& c : run_.completions) {
      if (c.recv_cq || c.wc.qp_num != run_.qp_num[q]) continue;
      if (c.wc.wr_id == (kWrIdSend | pending_)) {
        c.wc.status = IBV_WC_RETRY_EXC_ERR;
        c.time_ns = t;
        after = true;
      } else if (after) {
        c.wc.status = IBV_WC_WR_FLUSH_ERR;
      }
    }
  }
  static constexpr uint64_t kStart = 100'000;
  size_t pending_ = 0;
};

TEST_F(RetryBoundTest, SuccessAcrossPartitionIsReported) {
  EXPECT_TRUE(reports(check_run(), "retry-bound"));
}

TEST_F(RetryBoundTest, LateFailureIsReported) {
  const QpSpec& q = s_.qps[s_.sends[pending_].qp];
  const uint64_t from = std::max(kStart, s_.sends[pending_].post_ns);
  fail_at(from + retry_bound_ns(q, s_.config.faults) + 1);
  const std::vector<Violation> v = check_run();
  EXPECT_TRUE(reports(v, "retry-bound")) << dump(v);
}

TEST_F(RetryBoundTest, TimelyFailureIsNotReported) {
  const QpSpec& q = s_.qps[s_.sends[pending_].qp];
  const uint64_t from = std::max(kStart, s_.sends[pending_].post_ns);
  fail_at(from + ack_timeout_ns(q.timeout) * (q.retry_cnt + 1u));
  const std::vector<Violation> v = check_run();
  // Only this QP's check is about the bound; other QPs across the cut still "succeeded".
  for (const Violation& x : v)
    if (x.property == "retry-bound") {
      EXPECT_EQ(x.detail.find("qp " + std::to_string(s_.sends[pending_].qp) + " "),
                std::string::npos)
          << x.detail;
    }
}

}  // namespace
}  // namespace urdma::sim
