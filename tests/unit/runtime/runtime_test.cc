// Two runtimes, each with its engine thread, over real UDP sockets on loopback: RC SEND, WRITE,
// READ and atomics with whole transfers checked by checksums; an idle engine thread costs no
// CPU; posting from several application threads; the progress token.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

constexpr size_t kMiB = 1 << 20;

void expect_success(const std::vector<ibv_wc>& wcs) {
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr_id " << wc.wr_id;
}

class RuntimeTest : public ::testing::TestWithParam<bool> {};  // param: drive from poll_cq

TEST_P(RuntimeTest, RcSendWriteReadAtomicsArriveWhole) {
  const bool drive = GetParam();
  auto [a, b] = make_hosts();
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);

  constexpr size_t kBytes = 4 * kMiB;
  constexpr size_t kChunk = 256 * 1024;
  constexpr size_t kChunks = kBytes / kChunk;
  std::vector<uint8_t> src(kBytes), dst(kBytes, 0), back(kBytes, 0);
  fill_pattern(src, 7);
  alignas(8) uint64_t counter = 0;
  alignas(8) uint64_t result[2] = {};
  provider::Mr* msrc = a.reg(src.data(), kBytes);
  provider::Mr* mback = a.reg(back.data(), kBytes);
  provider::Mr* mres = a.reg(result, sizeof result);
  provider::Mr* mdst = b.reg(dst.data(), kBytes);
  provider::Mr* mctr = b.reg(&counter, sizeof counter);

  // SEND: kChunks messages into kChunks receives.
  for (size_t i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(post_one_recv(*p.qb, dst.data() + i * kChunk, kChunk, mdst->lkey(), i).ok());
  }
  for (size_t i = 0; i < kChunks; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + i * kChunk), kChunk, msrc->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  expect_success(wait_cqes(*a.rt, cqa, kChunks, drive));
  {
    const auto wb = wait_cqes(*b.rt, cqb, kChunks, drive);
    for (const ibv_wc& wc : wb)
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "B wr_id " << wc.wr_id << " op " << wc.opcode;
  }
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), kBytes), fnv1a(src.data(), kBytes));

  // WRITE: the whole buffer again, a new pattern, into B.
  fill_pattern(src, 8);
  std::fill(dst.begin(), dst.end(), 0);
  for (size_t i = 0; i < kChunks; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + i * kChunk), kChunk, msrc->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE, &sge,
                             reinterpret_cast<uintptr_t>(dst.data() + i * kChunk), mdst->rkey(), i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  expect_success(wait_cqes(*a.rt, cqa, kChunks, drive));
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), kBytes), fnv1a(src.data(), kBytes));

  // READ it back from B.
  for (size_t i = 0; i < kChunks; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(back.data() + i * kChunk), kChunk, mback->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_READ, &sge,
                             reinterpret_cast<uintptr_t>(dst.data() + i * kChunk), mdst->rkey(), i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  expect_success(wait_cqes(*a.rt, cqa, kChunks, drive));
  EXPECT_EQ(fnv1a(back.data(), kBytes), fnv1a(src.data(), kBytes));

  // Atomics: 200 FETCH_ADDs of i, then a CMP_SWP of the known sum.
  constexpr uint64_t kAdds = 200;
  uint64_t sum = 0;
  for (uint64_t i = 0; i < kAdds; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&result[0]), 8, mres->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = i;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(&counter);
    wr.wr.atomic.rkey = mctr->rkey();
    wr.wr.atomic.compare_add = i;
    sum += i;
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    if (i % 64 == 63) expect_success(wait_cqes(*a.rt, cqa, 64, drive));
  }
  expect_success(wait_cqes(*a.rt, cqa, kAdds % 64, drive));
  {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&result[1]), 8, mres->lkey()};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(&counter);
    wr.wr.atomic.rkey = mctr->rkey();
    wr.wr.atomic.compare_add = sum;
    wr.wr.atomic.swap = 0xABCDEF;
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    expect_success(wait_cqes(*a.rt, cqa, 1, drive));
  }
  EXPECT_EQ(result[1], sum);
  EXPECT_EQ(std::atomic_ref<uint64_t>(counter).load(), 0xABCDEFu);
  const engine::EngineCounters ca = a.rt->counters();
  EXPECT_GT(ca.sent_pkts, 0u);
}

INSTANTIATE_TEST_SUITE_P(EngineThreadOnlyOrPollCqToo, RuntimeTest, ::testing::Bool());

// utime + stime of one thread, in clock ticks (/proc/self/task/<tid>/stat fields 14 and 15).
uint64_t thread_cpu_ticks(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(f, line);
  // The command name (field 2) may hold spaces: fields after it start after the last ')'.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return utime + stime;
}

// How many times the kernel thread `tid` gave up its core (each sleep it woke from is one).
uint64_t voluntary_switches(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
      return std::stoull(line.substr(line.find(':') + 1));
  ADD_FAILURE() << "no voluntary_ctxt_switches for thread " << tid;
  return 0;
}

// Param: the busy-poll window (RuntimeConfig::busy_poll_ns): 0, or 1 ms of spinning after the
// last work before the thread sleeps — either way an idle thread ends up asleep.
class RuntimeIdle : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RuntimeIdle, AnIdleEngineThreadSleeps) {
  auto [a, b] = make_hosts({.busy_poll_ns = GetParam()});
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  std::vector<uint8_t> src(64 * 1024), dst(64 * 1024);
  fill_pattern(src, 1);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  expect_success(wait_cqes(*a.rt, cqa, 1, false));
  // Let the last ACKs settle, then watch one idle second.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t tid = a.rt->engine_tid();
  ASSERT_NE(tid, 0);
  const uint64_t turns0 = a.rt->engine_thread_turns() + b.rt->engine_thread_turns();
  const uint64_t ticks0 = thread_cpu_ticks(tid) + thread_cpu_ticks(b.rt->engine_tid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t turns1 = a.rt->engine_thread_turns() + b.rt->engine_thread_turns();
  const uint64_t ticks1 = thread_cpu_ticks(tid) + thread_cpu_ticks(b.rt->engine_tid());
  // Idle: no traffic, no timer armed — the engine threads sleep in epoll_wait. Not a timing
  // bound: a busy loop would take ~100 ticks per thread and thousands of turns.
  EXPECT_LE(turns1 - turns0, 4u);
  EXPECT_LE(ticks1 - ticks0, 10u);
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
}

INSTANTIATE_TEST_SUITE_P(BusyPollWindow, RuntimeIdle, ::testing::Values(0u, 1'000'000u));

// NAPPING (runtime.h): while an application thread busy-polls, the engine thread naps 1 ms at a
// time, and each nap's end is a wake-up on a core the poller may need (~10 us of its time on
// these VMs). A second of polling an idle connection wakes the engine thread about a thousand
// times: not the five thousand that 200 us naps cost, which held 5-15% of the shared-memory
// ping-pong's rounds up by ~10 us each (docs/PERFORMANCE.md).
TEST(RuntimeNap, APollingThreadCostsTheEngineThreadAWakeUpPerMillisecond) {
  auto [a, b] = make_hosts();
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t tid = a.rt->engine_tid();
  ASSERT_NE(tid, 0);
  const uint64_t switches0 = voluntary_switches(tid);
  const uint64_t naps0 = a.rt->naps();
  const uint64_t turns0 = a.rt->inline_turns();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  a.rt->try_progress();
  a.rt->wake();  // the engine thread takes a turn, finds the poller, and naps from then on
  while (std::chrono::steady_clock::now() < end) a.rt->try_progress();
  const uint64_t wakes = voluntary_switches(tid) - switches0;
  const uint64_t naps = a.rt->naps() - naps0;
  EXPECT_GT(a.rt->inline_turns() - turns0, 1000u) << "the application thread did not poll";
  // At least one. Idle, it naps ~1,000 times; with both cores taken by other work (a compile,
  // a sanitizer test run) it may get its core only a few times in the second, once at worst.
  EXPECT_GE(naps, 1u) << "the engine thread did not nap beside the poller";
  EXPECT_LE(naps, 1500u);
  EXPECT_LE(wakes, 1500u);
  // The connection still works once the poller stops: the engine threads take it over.
  std::vector<uint8_t> src(4096), dst(4096);
  fill_pattern(src, 9);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  expect_success(wait_cqes(*a.rt, cqa, 1, false));
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
}

// NAPPING: a poller reads the socket on every turn, so the engine thread that naps beside it
// keeps the socket out of its epoll set. 2,000 round trips of 8-byte SENDs, driven by this
// thread's polls of both hosts, wake each engine thread about once per millisecond (its nap's
// timer), not for the 4,000 datagrams: with the socket in the set, every datagram that found
// the thread napping woke it, a context switch on a core the poller needs.
TEST(RuntimeNap, DatagramsForAPollingThreadDoNotWakeTheEngineThread) {
  auto hosts = make_hosts();
  Host& a = hosts.first;
  Host& b = hosts.second;
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  alignas(8) uint64_t buf_a[2] = {}, buf_b[2] = {};  // [0] is sent, [1] received
  provider::Mr* ma = a.reg(buf_a, sizeof buf_a);
  provider::Mr* mb = b.reg(buf_b, sizeof buf_b);
  const auto await_recv = [&](provider::Cq* cq) {
    const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
    ibv_wc wc[8];
    for (;;) {
      a.rt->try_progress();
      b.rt->try_progress();
      const int k = cq->poll(8, wc);
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << "wr_id " << wc[i].wr_id;
        if (wc[i].opcode == IBV_WC_RECV) return true;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
  };
  const auto send = [](provider::Qp& qp, uint64_t* from, const provider::Mr* mr, uint64_t id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(from), sizeof *from, mr->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, id);
    ibv_send_wr* bad = nullptr;
    return qp.post_send(&wr, &bad).ok();
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t ta = a.rt->engine_tid(), tb = b.rt->engine_tid();
  ASSERT_NE(ta, 0);
  ASSERT_NE(tb, 0);
  const uint64_t switches_a = voluntary_switches(ta), switches_b = voluntary_switches(tb);
  const uint64_t naps0 = a.rt->naps() + b.rt->naps();
  const auto start = std::chrono::steady_clock::now();
  constexpr uint64_t kRounds = 2000;
  for (uint64_t r = 1; r <= kRounds; ++r) {
    ASSERT_TRUE(post_one_recv(*p.qb, &buf_b[1], 8, mb->lkey(), r).ok());
    ASSERT_TRUE(post_one_recv(*p.qa, &buf_a[1], 8, ma->lkey(), r).ok());
    buf_a[0] = r;
    ASSERT_TRUE(send(*p.qa, &buf_a[0], ma, r));
    ASSERT_TRUE(await_recv(cqb)) << "round " << r;
    b.settle();
    ASSERT_EQ(buf_b[1], r);
    buf_b[0] = ~r;
    ASSERT_TRUE(send(*p.qb, &buf_b[0], mb, r));
    ASSERT_TRUE(await_recv(cqa)) << "round " << r;
    a.settle();
    ASSERT_EQ(buf_a[1], ~r);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  const uint64_t wakes_a = voluntary_switches(ta) - switches_a;
  const uint64_t wakes_b = voluntary_switches(tb) - switches_b;
  EXPECT_GT(a.rt->naps() + b.rt->naps(), naps0) << "the engine threads did not nap";
  // A nap's timer wakes a thread once per millisecond; twice that, and 20, are slack.
  const uint64_t bound = 2 * static_cast<uint64_t>(ms) + 20;
  EXPECT_LE(wakes_a, bound) << kRounds << " round trips in " << ms << " ms";
  EXPECT_LE(wakes_b, bound) << kRounds << " round trips in " << ms << " ms";
}

// Whether `fd` is a target of an epoll set of this process (an eventpoll fd's fdinfo lists
// each target as "tfd: N").
bool in_an_epoll_set(int fd) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string() != "anon_inode:[eventpoll]") continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    for (std::string line; std::getline(info, line);) {
      std::istringstream in(line);
      std::string key;
      int target = -1;
      if (in >> key >> target && key == "tfd:" && target == fd) return true;
    }
  }
  return false;
}

// Until `want` is what in_an_epoll_set(fd) says, for at most 2 s; `nudge` (if any) runs before
// each look.
bool becomes(int fd, bool want, const std::function<void()>& nudge = {}) {
  for (int i = 0; i < 2000; ++i) {
    if (nudge) nudge();
    if (in_an_epoll_set(fd) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// NAPPING: the socket is out of the napping engine thread's epoll set only while no CQ is armed
// for an event. After ibv_req_notify_cq a thread may sleep on the channel's fd, where no poll
// turn sees it: a datagram must wake the engine thread then, not wait for the nap's end. The
// arming puts the socket back before it returns; the event that fires takes the arming away.
TEST(RuntimeNap, AnArmedCqKeepsTheSocketWatchedBesideAPoller) {
  LinkIo* io_a = nullptr;
  auto hosts = make_hosts({.io_a = &io_a});
  Host& a = hosts.first;
  Host& b = hosts.second;
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  const int sock = io_a->readable_fd();
  ASSERT_TRUE(becomes(sock, true)) << "the engine thread does not sleep on the socket";
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop.load(std::memory_order_relaxed)) a.rt->try_progress();
  });
  // Woken, the engine thread takes a turn, finds the poller, and naps from then on. (A thread
  // that went to sleep while the poller was off its core sleeps until something wakes it.)
  const auto wake_a = [&] { a.rt->wake(); };
  EXPECT_TRUE(becomes(sock, false, wake_a))
      << "the engine thread naps beside a poller with the socket in";
  a.rt->req_notify(*cqa, false);
  EXPECT_EQ(a.dev().armed_cqs(), 1u);
  EXPECT_TRUE(in_an_epoll_set(sock)) << "the arming left the socket out";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // naps come and go
  EXPECT_TRUE(in_an_epoll_set(sock)) << "a nap took the socket out with a CQ armed";
  // B's SEND completes A's receive: the CQ fires and is armed no more.
  alignas(8) uint64_t word = 42, got = 0;
  provider::Mr* mw = b.reg(&word, sizeof word);
  provider::Mr* mg = a.reg(&got, sizeof got);
  ASSERT_TRUE(post_one_recv(*p.qa, &got, sizeof got, mg->lkey(), 7).ok());
  ibv_sge sge{reinterpret_cast<uintptr_t>(&word), sizeof word, mw->lkey()};
  ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, 8);
  ibv_send_wr* bad = nullptr;
  ASSERT_TRUE(p.qb->post_send(&wr, &bad).ok());
  const std::vector<ibv_wc> wcs = wait_cqes(*a.rt, cqa, 1, false);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  a.settle();
  EXPECT_EQ(got, 42u);
  EXPECT_EQ(a.dev().armed_cqs(), 0u);
  EXPECT_TRUE(becomes(sock, false, wake_a)) << "the socket stayed in after the CQ fired";
  stop.store(true);
  poller.join();
  // The poller stopped: the engine thread's next sleep is not a nap, and watches the socket.
  EXPECT_TRUE(becomes(sock, true)) << "the engine thread sleeps without the socket";
  expect_success(wait_cqes(*b.rt, cqb, 1, false));
}

// A datagram ends the busy-poll window at once: with a window of 3 s on both sides, a WRITE
// posted while B's engine thread spins (its last turn 200 ms ago) completes on A — which needs
// B to place it and send the ACK — long before B's window would run out. (The window used to
// watch only the doorbell and the timers: B took the datagram when the 3 s were over.)
TEST(RuntimeBusyPoll, ADatagramEndsTheWindow) {
  constexpr uint64_t kWindowNs = 3'000'000'000;
  auto [a, b] = make_hosts({.busy_poll_ns = kWindowNs});
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  std::vector<uint8_t> src(4096), dst(4096);
  fill_pattern(src, 3);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  expect_success(wait_cqes(*a.rt, cqa, 1, false));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::nanoseconds(kWindowNs / 2))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
}

// An application thread that busy-polls its CQ drives the engine itself (try_progress): the
// engine thread's busy-poll window ends then, instead of spinning on the other core. With a
// window of 30 s, the engine thread spins after a turn until the application polls a few
// times, then sleeps.
TEST(RuntimeBusyPoll, AnApplicationThreadThatPollsEndsTheWindow) {
  constexpr uint64_t kWindowNs = 30'000'000'000;
  auto [a, b] = make_hosts({.busy_poll_ns = kWindowNs});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t tid = a.rt->engine_tid();
  ASSERT_NE(tid, 0);
  a.rt->wake();  // a turn; the window starts after it
  const uint64_t spin0 = thread_cpu_ticks(tid);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Spinning (a core's worth would be ~30 ticks): the window is open.
  EXPECT_GE(thread_cpu_ticks(tid) - spin0, 5u);
  for (int i = 0; i < 16; ++i) a.rt->try_progress();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t ticks0 = thread_cpu_ticks(tid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LE(thread_cpu_ticks(tid) - ticks0, 10u);  // asleep, not ~100 ticks of spinning
}

// The adaptive window (busy_poll.h) opens for a conversation and closes when it stops: WRITEs
// posted ~300 us apart reach B's engine thread, which sleeps at first (window 0) and, as the
// window doubles past the gap, catches a later one while it spins. (A spin that loses its core
// closes the window for 100 ms — a loaded host, a sanitizer build — so the WRITEs go on until
// one is caught, for up to 10 s.) Once the traffic stops the thread sleeps (at most one window
// of spinning after the last turn).
TEST(RuntimeBusyPoll, AnAdaptiveWindowOpensForAConversationAndSleepsWhenIdle) {
  auto [a, b] = make_hosts({.busy_poll_ns = 2'000'000, .busy_poll_adaptive = true});
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  constexpr size_t kSlots = 200;
  std::vector<uint8_t> src(64), dst(64 * kSlots);
  fill_pattern(src, 5);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  const uint64_t hits0 = b.rt->busy_poll_hits();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t writes = 0;
  while (b.rt->busy_poll_hits() == hits0 && std::chrono::steady_clock::now() < give_up) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 64, ms->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE, &sge,
                             reinterpret_cast<uintptr_t>(dst.data() + (writes % kSlots) * 64),
                             md->rkey(), writes);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    expect_success(wait_cqes(*a.rt, cqa, 1, false));
    ++writes;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  // B's engine thread caught a WRITE in its window (with the window closed it catches none:
  // each one wakes it from epoll).
  EXPECT_GT(b.rt->busy_poll_hits() - hits0, 0u) << "after " << writes << " WRITEs";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t tid = b.rt->engine_tid();
  const uint64_t ticks0 = thread_cpu_ticks(tid);
  const uint64_t hits1 = b.rt->busy_poll_hits();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LE(thread_cpu_ticks(tid) - ticks0, 10u);  // asleep, not ~100 ticks of spinning
  EXPECT_EQ(b.rt->busy_poll_hits(), hits1);
  b.settle();
  for (size_t i = 0; i < std::min(writes, kSlots); ++i)
    EXPECT_EQ(fnv1a(dst.data() + i * 64, 64), fnv1a(src.data(), 64)) << "WRITE " << i;
}

// Several application threads, each with its own QP pair and CQ on the same two runtimes,
// post WRITEs concurrently (half of them also driving the engine from their poll loop);
// every byte arrives.
TEST(RuntimeThreads, PostingFromSeveralThreads) {
  auto hosts = make_hosts();
  Host& a = hosts.first;
  Host& b = hosts.second;
  constexpr int kThreads = 4;
  constexpr size_t kSlice = 512 * 1024;
  constexpr size_t kWrite = 8 * 1024;
  std::vector<uint8_t> src(kThreads * kSlice), dst(kThreads * kSlice, 0);
  fill_pattern(src, 3);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  std::vector<provider::Cq*> cqs;
  std::vector<RcPair> pairs;
  for (int t = 0; t < kThreads; ++t) {
    cqs.push_back(a.make_cq());
    pairs.push_back(connect_rc(a, cqs.back(), b, b.make_cq()));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const size_t base = t * kSlice;
      constexpr size_t kWindow = 32;
      size_t posted = 0, done = 0;
      while (done < kSlice / kWrite) {
        while (posted < kSlice / kWrite && posted - done < kWindow) {
          const size_t off = base + posted * kWrite;
          ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + off), kWrite, ms->lkey()};
          ibv_send_wr wr = rdma_wr(IBV_WR_RDMA_WRITE, &sge,
                                   reinterpret_cast<uintptr_t>(dst.data() + off), md->rkey(), off);
          ibv_send_wr* bad = nullptr;
          ASSERT_TRUE(pairs[t].qa->post_send(&wr, &bad).ok());
          ++posted;
        }
        const auto wcs = wait_cqes(*a.rt, cqs[t], 1, t % 2 == 0);
        ASSERT_FALSE(wcs.empty());
        expect_success(wcs);
        done += wcs.size();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
}

// Without an engine thread nothing moves unless somebody polls: try_progress() is the engine.
TEST(RuntimeProgress, PollCqDrivesTheEngineWithoutAThread) {
  auto hosts = make_hosts({.engine_thread = false});
  Host& a = hosts.first;
  Host& b = hosts.second;
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  RcPair p = connect_rc(a, cqa, b, cqb);
  std::vector<uint8_t> src(256 * 1024), dst(256 * 1024);
  fill_pattern(src, 5);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  std::atomic<bool> done{false};
  std::thread responder([&] {  // B's application polls too (it has no engine thread)
    while (!done.load()) {
      if (!b.rt->try_progress()) std::this_thread::yield();
    }
  });
  expect_success(wait_cqes(*a.rt, cqa, 1, true));
  done.store(true);
  responder.join();
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  EXPECT_GT(a.rt->inline_turns(), 0u);
  EXPECT_EQ(a.rt->engine_thread_turns(), 0u);
}

}  // namespace
}  // namespace urdma::runtime::testing
