// Completion channels and the async event fd as ibv_get_cq_event(3) / ibv_get_async_event(3)
// describe them: real fds for poll(2) and blocking reads; no event lost across the arm/poll
// race while the engine thread completes work concurrently.
#include "runtime/completion_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>

#include <atomic>
#include <thread>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

void expect_success(const std::vector<ibv_wc>& wcs) {
  ASSERT_FALSE(wcs.empty());
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr_id " << wc.wr_id;
}

// Waits (bounded by the hang guard) until fd is readable.
bool wait_readable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  const int n = ::poll(&pfd, 1, static_cast<int>(kHangGuard / std::chrono::milliseconds(1)));
  return n == 1 && (pfd.revents & POLLIN);
}

// One thread posts WRITEs in bursts; another consumes their completions only through the
// channel, in the loop ibv_get_cq_event(3) prescribes (get event, ack, re-arm, then poll until
// empty). A completion that lands between its last poll and its re-arming must still produce
// an event, or the consumer would sleep forever (caught by the hang guard).
TEST(CompletionChannel, NoEventLostAcrossArmAndPoll) {
  auto [a, b] = make_hosts();
  CompletionChannel channel;
  provider::Cq* cqa = a.make_cq();
  channel.attach(*cqa);
  RcPair p = connect_rc(a, cqa, b, b.make_cq());
  std::vector<uint8_t> src(64), dst(64 * 1024);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());

  constexpr uint64_t kWrites = 3000;
  constexpr uint64_t kWindow = 64;
  std::atomic<uint64_t> completed{0};
  std::atomic<bool> hung{false};
  std::thread consumer([&] {
    // Arm, then poll until empty: what completed before the arming is polled, what completes
    // after it fires the channel.
    cqa->req_notify(false);
    uint64_t events = 0;
    for (;;) {
      ibv_wc wc[16];
      for (int n; (n = cqa->poll(16, wc)) > 0;) {
        for (int i = 0; i < n; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
        completed.fetch_add(static_cast<uint64_t>(n));
      }
      if (completed.load() >= kWrites) break;
      if (!wait_readable(channel.fd())) {
        hung.store(true);
        return;
      }
      auto cq = channel.get_event();
      ASSERT_TRUE(cq.ok());
      ASSERT_EQ(cq.value(), cqa);
      ++events;
      channel.ack_events(*cqa, 1);
      cqa->req_notify(false);
    }
    EXPECT_GT(events, 0u);
    EXPECT_EQ(channel.unacked(*cqa), 0u);
  });
  uint64_t posted = 0;
  const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
  while (posted < kWrites && !hung.load() && std::chrono::steady_clock::now() < deadline) {
    if (posted - completed.load() >= kWindow) {
      std::this_thread::yield();
      continue;
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 64, ms->lkey()};
    ibv_send_wr wr =
        rdma_wr(IBV_WR_RDMA_WRITE, &sge,
                reinterpret_cast<uintptr_t>(dst.data()) + (posted % 1024) * 64, md->rkey(), posted);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    ++posted;
    if (posted % 7 == 0) std::this_thread::yield();  // vary the bursts
  }
  consumer.join();
  EXPECT_FALSE(hung.load()) << "an event was lost: " << completed.load() << " of " << kWrites;
  EXPECT_EQ(completed.load(), kWrites);
  channel.detach(*cqa);
}

// A channel made with the runtime as its waiter (as ibv_create_comp_channel makes it): the
// thread blocked in get_event watches the socket and takes the turn of the datagram it waits
// for (Runtime::wait_readable). A sends 200 SENDs one at a time; B's consumer gets an event for
// each, and some of them came from turns its own thread took, which handed it the event in
// memory; B's engine thread is not woken for them. Then, with nobody waiting, the engine thread
// again takes what arrives.
TEST(CompletionChannel, AWaitingThreadTakesTheTurnOfItsDatagram) {
  auto [a, b] = make_hosts();
  CompletionChannel channel(b.rt.get());
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  channel.attach(*cqb);
  RcPair p = connect_rc(a, cqa, b, cqb);
  constexpr size_t kSends = 200;
  std::vector<uint8_t> src(64 * kSends), dst(64 * kSends, 0), last(4096), last_dst(4096, 0);
  fill_pattern(src, 9);
  fill_pattern(last, 10);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* ml = a.reg(last.data(), last.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  provider::Mr* mld = b.reg(last_dst.data(), last_dst.size());
  for (size_t i = 0; i < kSends; ++i) {
    ASSERT_TRUE(post_one_recv(*p.qb, dst.data() + i * 64, 64, md->lkey(), i).ok());
  }
  const uint64_t waits0 = b.rt->inline_turns();
  const uint64_t engine_turns0 = b.rt->engine_thread_turns();
  std::atomic<size_t> received{0};
  std::thread consumer([&] {
    cqb->req_notify(false);
    while (received.load() < kSends) {
      ibv_wc wc[16];
      for (int n; (n = cqb->poll(16, wc)) > 0;) {
        for (int i = 0; i < n; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
        received.fetch_add(static_cast<size_t>(n));
      }
      if (received.load() >= kSends) break;
      auto cq = channel.get_event();  // blocks: the runtime is the waiter
      ASSERT_TRUE(cq.ok()) << cq.error();
      ASSERT_EQ(cq.value(), cqb);
      channel.ack_events(*cqb, 1);
      cqb->req_notify(false);
    }
  });
  for (size_t i = 0; i < kSends; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + i * 64), 64, ms->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    expect_success(wait_cqes(*a.rt, cqa, 1, false));
    // Let B's consumer get back to its wait before the next one.
    const auto until = std::chrono::steady_clock::now() + kHangGuard;
    while (received.load() <= i && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  consumer.join();
  EXPECT_EQ(received.load(), kSends);
  EXPECT_GT(b.rt->inline_turns() - waits0, 0u) << "no turn taken by the waiting thread";
  // The datagrams woke the waiting thread, not B's engine thread (the socket is out of its
  // epoll set while a thread waits). A margin for a loaded host, where the consumer is not
  // always back in its wait within the millisecond.
  EXPECT_LT(b.rt->engine_thread_turns() - engine_turns0, kSends / 10)
      << "B's engine thread was woken for the datagrams";
  EXPECT_GT(channel.direct_events(), 0u) << "no event handed over by the waiting thread's turn";
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  // Nobody waits now: B's engine thread must place this WRITE and ACK it.
  ASSERT_TRUE(post_write_all(*p.qa, last, ml, last_dst, mld).ok());
  expect_success(wait_cqes(*a.rt, cqa, 1, false));
  b.settle();
  EXPECT_EQ(fnv1a(last_dst.data(), last_dst.size()), fnv1a(last.data(), last.size()));
  channel.detach(*cqb);  // as ibv_destroy_cq before ibv_destroy_comp_channel
}

// Ping-pong with a thread that sleeps on its channel, as qperf rc_lat and ibv_rc_pingpong -e
// answer: A SENDs, B's thread is woken for the receive, reposts it and SENDs the answer. The
// answer's post takes the turn on B's thread (Runtime::send_posted) instead of waking B's
// engine thread for it; every answer arrives with its bytes.
TEST(CompletionChannel, TheAnswerToAnEventLeavesFromTheThreadThatWaited) {
  auto [a, b] = make_hosts();
  CompletionChannel channel(b.rt.get());
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  channel.attach(*cqb);
  RcPair p = connect_rc(a, cqa, b, cqb);
  constexpr size_t kRounds = 200;
  std::vector<uint8_t> ping(64), pong(64 * kRounds, 0), got(64), answers(64 * kRounds);
  fill_pattern(ping, 12);
  fill_pattern(answers, 13);
  provider::Mr* m_ping = a.reg(ping.data(), ping.size());
  provider::Mr* m_pong = a.reg(pong.data(), pong.size());
  provider::Mr* m_got = b.reg(got.data(), got.size());
  provider::Mr* m_answers = b.reg(answers.data(), answers.size());
  ASSERT_TRUE(post_one_recv(*p.qb, got.data(), 64, m_got->lkey(), 0).ok());
  const uint64_t reply_turns0 = b.rt->reply_turns();
  std::thread answerer([&] {
    cqb->req_notify(false);
    // Until every answer has its send completion too: no completion, so no event, comes after.
    for (size_t round = 0, answered = 0; answered < kRounds;) {
      ibv_wc wc[4];
      const int n = cqb->poll(4, wc);
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
        if (wc[i].opcode != IBV_WC_RECV) {
          ++answered;
          continue;
        }
        ASSERT_TRUE(post_one_recv(*p.qb, got.data(), 64, m_got->lkey(), round + 1).ok());
        ibv_sge sge{reinterpret_cast<uintptr_t>(answers.data() + round * 64), 64,
                    m_answers->lkey()};
        ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, round);
        ibv_send_wr* bad = nullptr;
        ASSERT_TRUE(p.qb->post_send(&wr, &bad).ok());
        ++round;
      }
      if (n > 0) continue;
      auto cq = channel.get_event();  // blocks: the runtime is the waiter
      ASSERT_TRUE(cq.ok()) << cq.error();
      channel.ack_events(*cqb, 1);
      cqb->req_notify(false);
    }
  });
  for (size_t round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(post_one_recv(*p.qa, pong.data() + round * 64, 64, m_pong->lkey(), round).ok());
    ibv_sge sge{reinterpret_cast<uintptr_t>(ping.data()), 64, m_ping->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, round);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
    // The SEND's completion and the answer's receive.
    expect_success(wait_cqes(*a.rt, cqa, 2, false));
  }
  answerer.join();
  EXPECT_EQ(fnv1a(pong.data(), pong.size()), fnv1a(answers.data(), answers.size()));
  EXPECT_GT(b.rt->reply_turns() - reply_turns0, 0u) << "no answer left from the waiting thread";
  channel.detach(*cqb);  // as ibv_destroy_cq before ibv_destroy_comp_channel
}

// rping cancels its CQ thread while it is blocked in ibv_get_cq_event. A thread cancelled in the
// runtime's wait gives the socket back to the engine thread as it unwinds: a WRITE that arrives
// afterwards is placed and ACKed.
TEST(CompletionChannel, AThreadCancelledInItsWaitGivesTheSocketBack) {
  auto [a, b] = make_hosts();
  CompletionChannel channel(b.rt.get());
  provider::Cq* cqa = a.make_cq();
  provider::Cq* cqb = b.make_cq();
  channel.attach(*cqb);
  RcPair p = connect_rc(a, cqa, b, cqb);
  std::vector<uint8_t> src(4096), dst(4096, 0);
  fill_pattern(src, 11);
  provider::Mr* ms = a.reg(src.data(), src.size());
  provider::Mr* md = b.reg(dst.data(), dst.size());
  pthread_t waiter;
  auto body = [](void* ch) -> void* {
    (void)static_cast<CompletionChannel*>(ch)->get_event();  // blocks: nothing will come
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&waiter, nullptr, body, &channel), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // into its poll
  ASSERT_EQ(pthread_cancel(waiter), 0);
  void* result = nullptr;
  ASSERT_EQ(pthread_join(waiter, &result), 0);
  EXPECT_EQ(result, PTHREAD_CANCELED);
  ASSERT_TRUE(post_write_all(*p.qa, src, ms, dst, md).ok());
  expect_success(wait_cqes(*a.rt, cqa, 1, false));
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  channel.detach(*cqb);  // as ibv_destroy_cq before ibv_destroy_comp_channel
}

// A waiter whose wait is a turn on the waiting thread that completes work on two CQs of the
// channel, as Runtime::wait_readable's turn does when one datagram batch fires both.
class TurnOnTheWaitingThread final : public EventWaiter {
 public:
  TurnOnTheWaitingThread(provider::Cq& first, provider::Cq& second)
      : first_(first), second_(second) {}
  int wait_readable(int /*fd*/, const bool& delivered) override {
    ++waits;
    ibv_wc wc{};
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    const provider::EngineTurnMark turn;  // this stands in for a turn of the engine
    EXPECT_TRUE(first_.push_st(wc, false));
    EXPECT_TRUE(second_.push_st(wc, false));
    EXPECT_TRUE(delivered) << "the turn's event was not handed to the waiting thread";
    return 0;
  }
  int waits = 0;

 private:
  provider::Cq& first_;
  provider::Cq& second_;
};

// The event a waiting thread's own turn produces is handed to it in memory (no eventfd write
// and read); when the turn fires two CQs of the channel, the second event goes to the fd, where
// poll(2) and another get_event see it.
TEST(CompletionChannel, EventsOfTheWaitersOwnTurnAreHandedOverAndTheRestGoToTheFd) {
  provider::Cq first(1, 16, nullptr);
  provider::Cq second(2, 16, nullptr);
  TurnOnTheWaitingThread waiter(first, second);
  CompletionChannel channel(&waiter);
  channel.attach(first);
  channel.attach(second);
  first.req_notify(false);
  second.req_notify(false);

  auto e1 = channel.get_event();
  ASSERT_TRUE(e1.ok()) << e1.error();
  EXPECT_EQ(e1.value(), &first);
  EXPECT_EQ(waiter.waits, 1);
  EXPECT_EQ(channel.direct_events(), 2u);
  pollfd pfd{channel.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 0), 1) << "the second event is not on the fd";
  auto e2 = channel.get_event();
  ASSERT_TRUE(e2.ok()) << e2.error();
  EXPECT_EQ(e2.value(), &second);
  EXPECT_EQ(waiter.waits, 1) << "the second event was not taken from the fd";
  EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "the fd is readable with no event waiting";
  channel.ack_events(first, 1);
  channel.ack_events(second, 1);
  channel.detach(first);
  channel.detach(second);
}

TEST(CompletionChannel, NonBlockingFdSaysEagainWhenEmpty) {
  CompletionChannel channel;
  const int flags = fcntl(channel.fd(), F_GETFL);
  ASSERT_EQ(fcntl(channel.fd(), F_SETFL, flags | O_NONBLOCK), 0);
  auto e = channel.get_event();
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().error(), EAGAIN);
}

// A CQ too small for what arrives overflows on the engine thread: IBV_EVENT_CQ_ERR and the
// QP's IBV_EVENT_QP_FATAL (IBA 11.4.2.1) reach the async fd, which poll(2) sees readable.
TEST(AsyncEventFd, ReportsCqOverflowFromTheEngineThread) {
  // The buffers outlive the runtimes: A's requester retransmits the SENDs a QP in ERR never
  // acknowledges until its runtime stops.
  std::vector<uint8_t> buf(64 * 16);
  std::vector<uint8_t> rbuf(64 * 16);
  auto [a, b] = make_hosts();
  AsyncEventFd async_fd(b.dev().async_events());
  provider::Cq* small = b.make_cq(1);
  RcPair p = connect_rc(a, a.make_cq(), b, small);
  provider::Mr* ma = a.reg(buf.data(), buf.size());
  provider::Mr* mb = b.reg(rbuf.data(), rbuf.size());
  const uint32_t capacity = small->cqe();
  const uint32_t sends = capacity + 2;
  for (uint32_t i = 0; i < sends; ++i) {
    ASSERT_TRUE(post_one_recv(*p.qb, rbuf.data() + i * 64 % rbuf.size(), 64, mb->lkey(), i).ok());
  }
  for (uint32_t i = 0; i < sends; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, ma->lkey()};
    ibv_send_wr wr = rdma_wr(IBV_WR_SEND, &sge, 0, 0, i);
    ibv_send_wr* bad = nullptr;
    ASSERT_TRUE(p.qa->post_send(&wr, &bad).ok());
  }
  bool cq_err = false, qp_fatal = false;
  while (!(cq_err && qp_fatal)) {
    ASSERT_TRUE(wait_readable(async_fd.fd())) << "no async event";
    auto e = async_fd.get_event();
    ASSERT_TRUE(e.ok());
    if (e.value().type == IBV_EVENT_CQ_ERR) {
      EXPECT_EQ(e.value().cq, small);
      cq_err = true;
    }
    if (e.value().type == IBV_EVENT_QP_FATAL) {
      EXPECT_EQ(e.value().qp, p.qb);
      qp_fatal = true;
    }
  }
}

}  // namespace
}  // namespace urdma::runtime::testing
