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

// ---- error scenarios, lossy networks, the network trace: each legal outcome accepted, each
// injected bug (a hand-mutated RunRecord) caught ----

TEST(CheckerOracle, PerfectRunsPassWithInjectedErrors) {
  ScenarioConfig c;
  c.errors_percent = 60;
  size_t faults = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const Scenario s = generate(c, seed);
    for (const SendSpec& w : s.sends) faults += w.fault != Fault::kNone;
    const std::vector<Violation> v = check(s, oracle_run(s));
    ASSERT_TRUE(v.empty()) << "seed " << seed << "\n" << dump(v);
  }
  EXPECT_GT(faults, 300u);
}

TEST(CheckerOracle, PerfectRunsPassOnLossyNetworks) {
  ScenarioConfig c;
  c.errors_percent = 30;
  c.faults.loss_ppm = 10'000;
  c.faults.reorder_ppm = 10'000;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const Scenario s = generate(c, seed);
    const std::vector<Violation> v = check(s, oracle_run(s));
    ASSERT_TRUE(v.empty()) << "seed " << seed << "\n" << dump(v);
  }
}

class MutationTest : public CheckerTest {
 protected:
  // A scenario (first seed from `seed`) whose send `pred` picks was posted in the oracle's run.
  size_t pick(ScenarioConfig c, const std::function<bool(const Scenario&, size_t)>& pred) {
    for (uint64_t seed = 1; seed < 2000; ++seed) {
      s_ = generate(c, seed);
      run_ = oracle_run(s_);
      for (size_t i = 0; i < s_.sends.size(); ++i)
        if (run_.send_posted_ns[i] && pred(s_, i)) return i;
    }
    ADD_FAILURE() << "no scenario with such a send";
    return 0;
  }
  size_t pick_fault(Fault f, const std::function<bool(const Scenario&, size_t)>& more = {}) {
    ScenarioConfig c;
    c.errors_percent = 100;
    return pick(c, [&](const Scenario& s, size_t i) {
      return s.sends[i].fault == f && (!more || more(s, i));
    });
  }
  // Later posted sends of i's QP.
  std::vector<size_t> later_on_qp(size_t i) const {
    std::vector<size_t> out;
    for (size_t j = i + 1; j < s_.sends.size(); ++j)
      if (s_.sends[j].qp == s_.sends[i].qp && run_.send_posted_ns[j]) out.push_back(j);
    return out;
  }
  // Turns send i into `status` at its completion time and flushes every later WR of its QP.
  void fail_send(size_t i, ibv_wc_status status) {
    ObservedCompletion* c = completion_of(kWrIdSend | i);
    if (c == nullptr) {  // unsignaled: give it its error completion
      ibv_wc wc = {};
      wc.wr_id = kWrIdSend | i;
      wc.qp_num = run_.qp_num[s_.sends[i].qp];
      run_.completions.push_back({*run_.send_posted_ns[i], s_.qps[s_.sends[i].qp].host, false, wc});
      c = &run_.completions.back();
    }
    c->wc.status = status;
    const uint64_t failed_ns = c->time_ns;  // (c dangles once completions grow below)
    for (size_t j : later_on_qp(i)) {
      ObservedCompletion* l = completion_of(kWrIdSend | j);
      if (l == nullptr) {
        ibv_wc wc = {};
        wc.wr_id = kWrIdSend | j;
        wc.qp_num = run_.qp_num[s_.sends[j].qp];
        run_.completions.push_back(
            {*run_.send_posted_ns[j], s_.qps[s_.sends[j].qp].host, false, wc});
        l = &run_.completions.back();
      }
      l->wc.status = IBV_WC_WR_FLUSH_ERR;
    }
    // The QP is in ERR from then on: its receives left over flush at once, not at the drain.
    const uint32_t q = s_.sends[i].qp;
    for (ObservedCompletion& r : run_.completions)
      if (r.recv_cq && r.wc.status == IBV_WC_WR_FLUSH_ERR && r.wc.qp_num == run_.qp_num[q] &&
          r.host == s_.qps[q].host)
        r.time_ns = failed_ns;
  }
  // What the trace shows of a request nobody answered: `tries` sends of one PSN of QP q.
  void unanswered(uint32_t q, uint32_t psn, uint32_t tries, uint64_t t) {
    for (uint32_t k = 0; k < tries; ++k) {
      TracedDatagram d;
      d.src_host = s_.qps[q].host;
      d.dst_host = s_.qps[s_.qps[q].peer].host;
      d.sent_ns = t;
      d.opcode = 0x04;  // RC SEND Only
      d.dest_qpn = run_.qp_num[s_.qps[q].peer];
      d.psn = psn;
      run_.datagrams.push_back(d);
    }
  }
  uint64_t time_of(size_t i) { return completion_of(kWrIdSend | i)->time_ns; }
};

TEST_F(MutationTest, FaultWithTheWrongStatus) {
  const size_t i = pick_fault(Fault::kBadRkey);
  ASSERT_EQ(completion_of(kWrIdSend | i)->wc.status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(dump(check_run()), "");
  completion_of(kWrIdSend | i)->wc.status = IBV_WC_REM_OP_ERR;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, FaultThatSucceeds) {
  const size_t i = pick_fault(Fault::kOutOfRange);
  completion_of(kWrIdSend | i)->wc.status = IBV_WC_SUCCESS;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, NoFlushAfterTheFaultOnTheRequester) {
  const size_t i = pick_fault(Fault::kNoAccess, [](const Scenario& s, size_t k) {
    for (size_t j = k + 1; j < s.sends.size(); ++j)
      if (s.sends[j].qp == s.sends[k].qp && s.sends[j].signaled) return true;
    return false;
  });
  const std::vector<size_t> later = later_on_qp(i);
  ASSERT_FALSE(later.empty());
  completion_of(kWrIdSend | later.back())->wc.status = IBV_WC_SUCCESS;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, NoFlushOnTheResponderAfterItsError) {
  // The responder of a fault enters ERR: a send it posts afterwards must not succeed.
  size_t b_send = 0;
  const size_t i = pick_fault(Fault::kShortRecv, [&](const Scenario& s, size_t k) {
    const uint32_t b = s.qps[s.sends[k].qp].peer;
    for (size_t j = 0; j < s.sends.size(); ++j)
      if (s.sends[j].qp == b && s.sends[j].post_ns > s.sends[k].post_ns + 1000 &&
          !op_info(s.sends[j].op).local) {
        b_send = j;
        return true;
      }
    return false;
  });
  ASSERT_EQ(dump(check_run()), "");
  ObservedCompletion* c = completion_of(kWrIdSend | b_send);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->wc.status, IBV_WC_WR_FLUSH_ERR);
  (void)i;
  c->wc.status = IBV_WC_SUCCESS;
  c->wc.opcode = op_info(s_.sends[b_send].op).wc;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, ResponderReceivesFlushWhenItEntersErr) {
  // The responder of a bad-rkey WRITE enters ERR: its pending receives flush then. A device
  // that kept the QP alive flushes them only at the final drain.
  const size_t i = pick_fault(Fault::kBadRkey, [](const Scenario& s, size_t k) {
    const uint32_t b = s.qps[s.sends[k].qp].peer;
    if (s.qps[b].use_srq) return false;
    size_t msgs = 0, recvs = 0;
    for (const SendSpec& w : s.sends) msgs += w.qp == s.qps[b].peer && op_info(w.op).consumes_recv;
    for (const RecvSpec& v : s.recvs) recvs += v.qp == b;
    return recvs > msgs;  // some receive is left to flush
  });
  EXPECT_EQ(dump(check_run()), "");
  const uint32_t b = s_.qps[s_.sends[i].qp].peer;
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && c.wc.status == IBV_WC_WR_FLUSH_ERR && c.wc.qp_num == run_.qp_num[b] &&
        c.host == s_.qps[b].host)
      c.time_ns = run_.drain_ns;
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, ReceiveQueueFlushesInOrder) {
  // The responder's receive queue after its error: flushes in posting order.
  const size_t i = pick_fault(Fault::kShortRecv, [](const Scenario& s, size_t k) {
    const uint32_t b = s.qps[s.sends[k].qp].peer;
    size_t n = 0;
    for (const RecvSpec& v : s.recvs) n += v.qp == b;
    return n >= 3;
  });
  const uint32_t b = s_.qps[s_.sends[i].qp].peer;
  std::vector<size_t> flushed;
  for (size_t k = 0; k < run_.completions.size(); ++k) {
    const ObservedCompletion& c = run_.completions[k];
    if (c.recv_cq && c.wc.status == IBV_WC_WR_FLUSH_ERR && c.wc.qp_num == run_.qp_num[b] &&
        c.host == s_.qps[b].host)
      flushed.push_back(k);
  }
  if (flushed.size() < 2) GTEST_SKIP() << "fewer than two flushed receives";
  EXPECT_EQ(dump(check_run()), "");
  std::swap(run_.completions[flushed[0]], run_.completions[flushed[1]]);
  EXPECT_TRUE(reports(check_run(), "order"));
}

TEST_F(MutationTest, ShortReceiveWithoutItsLengthError) {
  const size_t i = pick_fault(Fault::kShortRecv);
  ObservedCompletion* r = nullptr;
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && c.wc.status == IBV_WC_LOC_LEN_ERR) r = &c;
  ASSERT_NE(r, nullptr);
  r->wc.status = IBV_WC_LOC_PROT_ERR;  // the wrong error
  EXPECT_TRUE(reports(check_run(), "status"));
  r->wc.status = IBV_WC_WR_FLUSH_ERR;  // no error at all, though the requester got its NAK
  EXPECT_TRUE(reports(check_run(), "status"));
  (void)i;
}

TEST_F(MutationTest, BadInvalidateSucceedsAtTheRequesterOnly) {
  const size_t i = pick_fault(Fault::kBadInvalidate);
  EXPECT_EQ(dump(check_run()), "");  // rxe class J: the SEND succeeds, the receive fails
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && c.wc.status == IBV_WC_REM_INV_REQ_ERR) c.wc.status = IBV_WC_SUCCESS;
  EXPECT_FALSE(check_run().empty());
  (void)i;
}

TEST_F(MutationTest, RetryExceededNeedsEvidence) {
  // A clean RC send turned into RETRY_EXC_ERR: without a trace it was not earned; with
  // retry_cnt + 1 unanswered tries of its PSN it was; an ACK of that PSN delivered in the
  // window takes the evidence away again, and so do too few tries.
  ScenarioConfig c;
  const size_t i = pick(c, [](const Scenario& s, size_t k) {
    const SendSpec& w = s.sends[k];
    return s.qps[w.qp].type == IBV_QPT_RC && w.signaled && w.op == Op::kWrite;
  });
  fail_send(i, IBV_WC_RETRY_EXC_ERR);
  const uint32_t q = s_.sends[i].qp;
  EXPECT_TRUE(reports(check_run(), "status")) << "no evidence";
  const uint64_t timeout = ack_timeout_ns(s_.qps[q].timeout);
  // Late enough for the tries below to fit before it.
  const uint64_t t = completion_of(kWrIdSend | i)->time_ns += (s_.qps[q].retry_cnt + 2u) * timeout;
  // All the tries at once, just before the failure: too fast for retry_cnt + 1 timeouts.
  unanswered(q, 0x1234, s_.qps[q].retry_cnt + 1u, t - 1);
  EXPECT_TRUE(reports(check_run(), "status")) << "too early";
  run_.datagrams.clear();
  for (uint32_t k = 0; k < s_.qps[q].retry_cnt; ++k)
    unanswered(q, 0x1234, 1, t - (s_.qps[q].retry_cnt + 1u - k) * timeout);
  EXPECT_TRUE(reports(check_run(), "status")) << "one try short";
  unanswered(q, 0x1234, 1, t - timeout);
  EXPECT_FALSE(reports(check_run(), "status")) << dump(check_run());
  TracedDatagram ack;
  ack.src_host = s_.qps[s_.qps[q].peer].host;
  ack.dst_host = s_.qps[q].host;
  ack.opcode = 0x11;
  ack.has_aeth = true;
  ack.syndrome = 0x1f;  // ACK
  ack.dest_qpn = run_.qp_num[q];
  ack.psn = 0x1234;
  ack.delivered_ns = {t - 1};
  run_.datagrams.push_back(ack);
  EXPECT_TRUE(reports(check_run(), "status")) << "acknowledged in the window";
}

TEST_F(CheckerTest, AckNamingAReadOrAtomicPsn) {
  // A plain ACK whose PSN is one of a READ's response PSNs, or an ATOMIC's, is reported; one just
  // before or after them, a NAK, and an ACK to another QP are not.
  uint32_t q = 0;
  while (q < s_.qps.size() && s_.qps[q].type != IBV_QPT_RC) ++q;
  ASSERT_LT(q, s_.qps.size());
  const QpSpec& qp = s_.qps[q];
  const auto datagram = [&](bool request, uint8_t opcode, uint32_t psn) {
    TracedDatagram d;
    d.src_host = request ? qp.host : s_.qps[qp.peer].host;
    d.dst_host = request ? s_.qps[qp.peer].host : qp.host;
    d.dest_qpn = request ? run_.qp_num[qp.peer] : run_.qp_num[q];
    d.opcode = opcode;
    d.psn = psn;
    d.has_aeth = opcode == 0x11;
    d.syndrome = 0x1f;  // ACK
    d.delivered_ns = {1};
    return d;
  };
  TracedDatagram read = datagram(true, 0x0c, 0x500);
  read.dma_length = 2 * 4096 + 1;  // at least three responses at any MTU
  run_.datagrams = {read, datagram(true, 0x14, 0x600)};
  run_.datagrams.push_back(datagram(false, 0x11, 0x4ff));
  run_.datagrams.push_back(datagram(false, 0x11, 0x601));
  TracedDatagram nak = datagram(false, 0x11, 0x500);
  nak.syndrome = 0x60;  // PSN sequence error
  run_.datagrams.push_back(nak);
  EXPECT_FALSE(reports(check_run(), "ack-psn")) << dump(check_run());
  run_.datagrams.push_back(datagram(false, 0x11, 0x501));
  EXPECT_TRUE(reports(check_run(), "ack-psn"));
  run_.datagrams.pop_back();
  run_.datagrams.push_back(datagram(false, 0x11, 0x600));
  EXPECT_TRUE(reports(check_run(), "ack-psn"));
}

TEST_F(MutationTest, RetryExceededIsNoFreePassWithAPartition) {
  // A partition is configured, but this QP's path never crosses it (neither end is host 0):
  // without the trace's evidence its RETRY_EXC_ERR is still reported.
  ScenarioConfig c;
  c.hosts = 3;
  c.faults.partitions = {{10'000'000'000, 1'000}};  // (after the run: no retry-bound demands)
  const size_t i = pick(c, [](const Scenario& s, size_t k) {
    const SendSpec& w = s.sends[k];
    const QpSpec& q = s.qps[w.qp];
    return q.type == IBV_QPT_RC && w.signaled && !op_info(w.op).local && q.host != 0 &&
           s.qps[q.peer].host != 0;
  });
  EXPECT_EQ(dump(check_run()), "");
  fail_send(i, IBV_WC_RETRY_EXC_ERR);
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, RetryExceededOnAnotherQpsTraceIsNoEvidence) {
  ScenarioConfig c;
  const size_t i = pick(c, [](const Scenario& s, size_t k) {
    const SendSpec& w = s.sends[k];
    return s.qps[w.qp].type == IBV_QPT_RC && w.signaled && !op_info(w.op).local;
  });
  fail_send(i, IBV_WC_RETRY_EXC_ERR);
  const uint32_t q = s_.sends[i].qp;
  unanswered(s_.qps[q].peer, 0x77, 8, time_of(i) - 1);  // the peer's tries, not q's
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, RnrRetryExceededNeedsRnrNaks) {
  const size_t i = pick_fault(Fault::kRnr);
  ASSERT_EQ(completion_of(kWrIdSend | i)->wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(dump(check_run()), "");
  // One RNR NAK fewer than rnr_retry + 1.
  for (size_t k = 0; k < run_.datagrams.size(); ++k)
    if (run_.datagrams[k].has_aeth && (run_.datagrams[k].syndrome >> 5) == 1) {
      run_.datagrams.erase(run_.datagrams.begin() + static_cast<ptrdiff_t>(k));
      break;
    }
  EXPECT_TRUE(reports(check_run(), "status"));
}

TEST_F(MutationTest, DeadPeerFailsWithEvidence) {
  const size_t i = pick_fault(Fault::kDeadPeer);
  ASSERT_EQ(completion_of(kWrIdSend | i)->wc.status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(dump(check_run()), "");
  run_.datagrams.clear();
  EXPECT_TRUE(reports(check_run(), "status"));
}

// Turns a successful receive of QP type `type` into a flush (the message lost), and says
// whether the checker objects; `trace` adds the datagrams the network delivered to it.
class DeliveryBoundTest : public MutationTest {
 protected:
  bool lose_one(ibv_qp_type type, bool trace, uint32_t loss_ppm = 10'000,
                uint64_t overflow_drops = 0) {
    ScenarioConfig c;
    c.faults.loss_ppm = loss_ppm;
    const size_t m = pick(c, [&](const Scenario& s, size_t k) {
      const SendSpec& w = s.sends[k];
      return s.qps[w.qp].type == type && op_info(w.op).consumes_recv && w.op != Op::kWriteImm;
    });
    const SendSpec& w = s_.sends[m];
    const uint32_t dst = type == IBV_QPT_UD ? w.ud_dest : s_.qps[w.qp].peer;
    if (trace) {
      // Every message to dst as one intact datagram (the test's messages fit one packet).
      uint64_t t = 1000;
      for (size_t k = 0; k < s_.sends.size(); ++k) {
        const SendSpec& x = s_.sends[k];
        const bool to_dst = type == IBV_QPT_UD ? x.ud_dest == dst : s_.qps[x.qp].peer == dst;
        if (!to_dst || !op_info(x.op).consumes_recv || s_.qps[x.qp].type != type) continue;
        TracedDatagram d;
        d.src_host = s_.qps[x.qp].host;
        d.dst_host = s_.qps[dst].host;
        d.opcode = type == IBV_QPT_UD ? 0x64 : 0x24;  // UD SEND Only, UC SEND Only
        d.dest_qpn = run_.qp_num[dst];
        d.psn = static_cast<uint32_t>(k);
        d.delivered_ns = {t += 1000};
        run_.datagrams.push_back(d);
      }
    }
    run_.overflow_drops = overflow_drops;
    for (ObservedCompletion& r : run_.completions)
      if (r.recv_cq && r.wc.status == IBV_WC_SUCCESS && r.wc.qp_num == run_.qp_num[dst] &&
          r.host == s_.qps[dst].host) {
        r.wc.status = IBV_WC_WR_FLUSH_ERR;
        r.time_ns = run_.drain_ns;
        break;
      }
    return reports(check_run(), "delivery");
  }
};

TEST_F(DeliveryBoundTest, UcLossIsLegalWithoutEvidence) {
  EXPECT_FALSE(lose_one(IBV_QPT_UC, false)) << dump(check_run());
}
TEST_F(DeliveryBoundTest, UcMessageDroppedThoughDelivered) {
  EXPECT_TRUE(lose_one(IBV_QPT_UC, true));
}
// A clean profile loses nothing — unless the network's trace shows queue-overflow drops (a
// receiver's queue full under a UC flood, as a socket buffer overflows): then a lost UC
// message is legal again.
TEST_F(DeliveryBoundTest, UcLossOnACleanNetworkIsCaught) {
  EXPECT_TRUE(lose_one(IBV_QPT_UC, false, 0));
}
TEST_F(DeliveryBoundTest, UcLossAfterQueueOverflowIsLegal) {
  EXPECT_FALSE(lose_one(IBV_QPT_UC, false, 0, 1)) << dump(check_run());
}
TEST_F(DeliveryBoundTest, UdLossIsLegalWithoutEvidence) {
  EXPECT_FALSE(lose_one(IBV_QPT_UD, false)) << dump(check_run());
}
TEST_F(DeliveryBoundTest, UdMessageDroppedThoughDelivered) {
  EXPECT_TRUE(lose_one(IBV_QPT_UD, true));
}

TEST_F(MutationTest, UdTooLongIsDroppedAndTheQpGoesOn) {
  const size_t i = pick_fault(Fault::kUdTooLong, [](const Scenario& s, size_t k) {
    for (size_t j = k + 1; j < s.sends.size(); ++j)
      if (s.sends[j].ud_dest == s.sends[k].ud_dest && s.sends[j].fault == Fault::kNone) return true;
    return false;
  });
  const SendSpec& w = s_.sends[i];
  // The datagram arrived, intact: still no receive may take it, and the bound does not count it.
  TracedDatagram d;
  d.src_host = s_.qps[w.qp].host;
  d.dst_host = s_.qps[w.ud_dest].host;
  d.opcode = 0x64;
  d.dest_qpn = run_.qp_num[w.ud_dest];
  d.ud_payload = static_cast<uint32_t>(w.length());
  d.delivered_ns = {1};
  run_.datagrams.push_back(d);
  EXPECT_EQ(dump(check_run()), "");
  // A device that moved the QP to ERR instead: its later receives flush.
  for (ObservedCompletion& c : run_.completions)
    if (c.recv_cq && c.wc.qp_num == run_.qp_num[w.ud_dest] && c.host == s_.qps[w.ud_dest].host &&
        c.wc.status == IBV_WC_SUCCESS && c.time_ns >= *run_.send_posted_ns[i]) {
      c.wc.status = IBV_WC_WR_FLUSH_ERR;
      EXPECT_TRUE(reports(check_run(), "delivery"));
      return;
    }
  GTEST_SKIP() << "nothing received after the long datagram";
}

TEST_F(MutationTest, UdGrhBytes) {
  for (const ObservedCompletion& c : run_.completions) {
    if (!c.recv_cq || !(c.wc.wc_flags & IBV_WC_GRH)) continue;
    const RecvSpec& v = s_.recvs[c.wc.wr_id & ~kWrIdKindMask];
    const Sge& g = v.sges.front();
    if (g.length < 30) continue;
    byte(g.region, g.offset + 29) ^= 1;  // the IPv4 TTL
    const std::vector<Violation> vs = check_run();
    EXPECT_TRUE(reports(vs, "data") || reports(vs, "delivery")) << dump(vs);
    return;
  }
  GTEST_SKIP() << "no UD receive with a long first SGE";
}

// A FETCH_ADD whose outcome is unknown (flushed at the drain) may or may not have added: the
// counter's jumps must be sums of such adds, each at most once.
class FetchAddUncertainTest : public MutationTest {
 protected:
  void SetUp() override {
    ScenarioConfig c;
    c.faults.partitions = {{10'000'000'000, 1'000}};  // after the run: drain flushes are legal
    x_ = pick(c, [](const Scenario& s, size_t k) {
      const SendSpec& w = s.sends[k];
      if (w.op != Op::kFetchAdd || !w.signaled) return false;
      for (size_t j = k + 1; j < s.sends.size(); ++j)
        if (s.sends[j].qp == w.qp) return false;  // the last WR of its QP
      return true;
    });
    ObservedCompletion* done = completion_of(kWrIdSend | x_);
    done->wc.status = IBV_WC_WR_FLUSH_ERR;
    done->time_ns = run_.drain_ns;
  }
  // Adds `delta` (mod 2^64) to the counter's final value in the run's memory.
  void bump_counter(uint64_t delta) {
    const SendSpec& w = s_.sends[x_];
    std::vector<uint8_t>& mem = run_.memory[w.remote_region];
    store(mem, w.remote_offset, load(mem, w.remote_offset) + delta);
  }
  size_t x_ = 0;
};

TEST_F(FetchAddUncertainTest, AnAddThatMayHaveHappenedIsAccepted) {
  EXPECT_FALSE(reports(check_run(), "atomic")) << dump(check_run());
  bump_counter(0 - s_.sends[x_].compare_add);  // ... or not happened
  EXPECT_FALSE(reports(check_run(), "atomic")) << dump(check_run());
}

TEST_F(FetchAddUncertainTest, AJumpThatIsNoSubsetSumIsReported) {
  bump_counter(1);  // within the old slack of "plus failed adds", but no sum of them
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(FetchAddUncertainTest, AnUncertainAddUsedTwiceIsReported) {
  bump_counter(s_.sends[x_].compare_add);
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(MutationTest, AtomicsRespectRealTimeAcrossQps) {
  // a precedes b in the run; b is made to complete before a was posted: b must then be first.
  ScenarioConfig c;
  size_t b = 0;
  const size_t a = pick(c, [&](const Scenario& s, size_t k) {
    const SendSpec& w = s.sends[k];
    if (w.op != Op::kFetchAdd) return false;
    for (size_t j = k + 1; j < s.sends.size(); ++j) {
      const SendSpec& x = s.sends[j];
      if (x.op == Op::kFetchAdd && x.qp != w.qp && x.signaled &&
          x.remote_region == w.remote_region && x.remote_offset == w.remote_offset) {
        b = j;
        return true;
      }
    }
    return false;
  });
  EXPECT_EQ(dump(check_run()), "");
  run_.send_posted_ns[a] = completion_of(kWrIdSend | b)->time_ns + 1;
  EXPECT_TRUE(reports(check_run(), "atomic"));
}

TEST_F(MutationTest, AFailureElsewhereLeavesOtherBuffersChecked) {
  // A faulted pair in the run; a spare receive buffer of a QP of another, healthy RC pair (never
  // consumed, flushed at the drain) is written: still reported.
  ScenarioConfig c;
  c.errors_percent = 50;
  size_t recv = 0;
  pick(c, [&](const Scenario& s, size_t k) {
    if (s.sends[k].fault == Fault::kNone) return false;
    const uint32_t fq = s.sends[k].qp, fp = s.qps[fq].peer;
    for (size_t r = 0; r < s.recvs.size(); ++r) {
      const uint32_t q = s.recvs[r].qp;
      if (q == kNone || q == fq || q == fp || s.qps[q].type != IBV_QPT_RC) continue;
      if (s.qps[q].dead || s.qps[s.qps[q].peer].dead) continue;
      bool faulted = false;
      for (const SendSpec& w : s.sends)
        faulted |= w.fault != Fault::kNone && (w.qp == q || w.qp == s.qps[q].peer);
      if (faulted || s.recvs[r].length() == 0) continue;
      recv = r;
      // A spare: the last receive of q, beyond the messages sent to it.
      size_t msgs = 0, posted = 0;
      for (const SendSpec& w : s.sends)
        msgs += w.qp == s.qps[q].peer && op_info(w.op).consumes_recv;
      for (const RecvSpec& v : s.recvs) posted += v.qp == q;
      if (posted > msgs) {
        for (size_t r2 = s.recvs.size(); r2-- > 0;)
          if (s.recvs[r2].qp == q && s.recvs[r2].length() > 0) {
            recv = r2;
            return true;
          }
      }
    }
    return false;
  });
  ASSERT_EQ(dump(check_run()), "");
  ASSERT_EQ(completion_of(kWrIdRecv | recv)->wc.status, IBV_WC_WR_FLUSH_ERR);
  for (const Sge& g : s_.recvs[recv].sges)
    if (g.length) {
      byte(g.region, g.offset) ^= 0x10;
      break;
    }
  const std::vector<Violation> v = check_run();
  EXPECT_TRUE(reports(v, "data") || reports(v, "guard")) << dump(v);
}

}  // namespace
}  // namespace urdma::sim
