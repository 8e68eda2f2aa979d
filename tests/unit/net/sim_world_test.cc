#include "support/sim_world.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace urdma::net {
namespace {

Address host_address(size_t i) {
  return Address::from_v4(10, 0, 0, static_cast<uint8_t>(i + 1));
}

// Sends `count` pings to `peer`, one every `period_ns`; each carries its send time, and the
// round-trip time of each reply is recorded.
class Pinger final : public SimParticipant {
 public:
  Pinger(PacketIo& io, Address peer, uint64_t period_ns, int count)
      : io_(io), peer_(peer), period_ns_(period_ns), left_(count) {}

  uint64_t next_deadline_ns() const override { return left_ > 0 ? next_send_ns_ : kNever; }

  void poll(uint64_t now_ns) override {
    ++polls;
    uint8_t buf[64];
    RxDatagram slot{buf};
    while (io_.recv_batch(std::span<RxDatagram>(&slot, 1)) == 1) {
      uint64_t sent;
      std::memcpy(&sent, buf, sizeof sent);
      rtts.push_back(now_ns - sent);
      log.push_back("t=" + std::to_string(now_ns) + " reply " + std::to_string(sent));
    }
    if (left_ > 0 && now_ns >= next_send_ns_) {
      const iovec v{&now_ns, sizeof now_ns};
      TxDatagram d;
      d.iov = std::span<const iovec>(&v, 1);
      d.dst = Endpoint{peer_, kRoceV2UdpPort};
      EXPECT_EQ(io_.send(d), TxStatus::kSent);
      log.push_back("t=" + std::to_string(now_ns) + " ping");
      --left_;
      next_send_ns_ = now_ns + period_ns_;
    }
  }

  std::vector<uint64_t> rtts;
  std::vector<std::string> log;
  int polls = 0;

 private:
  PacketIo& io_;
  Address peer_;
  uint64_t period_ns_;
  int left_;
  uint64_t next_send_ns_ = 0;
};

// Sends every datagram it receives back to where it came from. Only packets wake it.
class Echo final : public SimParticipant {
 public:
  explicit Echo(PacketIo& io) : io_(io) {}
  uint64_t next_deadline_ns() const override { return kNever; }
  void poll(uint64_t) override {
    ++polls;
    uint8_t bufs[4][64];
    RxDatagram slots[4] = {{bufs[0]}, {bufs[1]}, {bufs[2]}, {bufs[3]}};
    const size_t n = io_.recv_batch(slots);  // at most 4 per poll: the world polls again
    for (size_t i = 0; i < n; ++i) {
      const iovec v{bufs[i], slots[i].length};
      TxDatagram d;
      d.iov = std::span<const iovec>(&v, 1);
      d.dst = Endpoint{slots[i].src.address, kRoceV2UdpPort};
      io_.send(d);
      ++echoed;
    }
  }
  int polls = 0;
  int echoed = 0;

 private:
  PacketIo& io_;
};

// Always wants to run: a livelock the step limit must stop.
class Spinner final : public SimParticipant {
 public:
  uint64_t next_deadline_ns() const override { return 0; }
  void poll(uint64_t) override { ++polls; }
  int polls = 0;
};

SimOptions fixed_delay(uint64_t delay_ns) {
  SimOptions o;
  o.delay_min_ns = o.delay_max_ns = delay_ns;
  return o;
}

struct PingPong {
  explicit PingPong(SimOptions o, int pings = 10)
      : world(std::move(o)),
        a(world.network().add_host(host_address(0))),
        b(world.network().add_host(host_address(1))),
        pinger(world.network().io(a), host_address(1), 10'000, pings),
        echo(world.network().io(b)) {
    world.add_participant(pinger, a);
    world.add_participant(echo, b);
  }
  SimWorld world;
  HostId a, b;
  Pinger pinger;
  Echo echo;
};

TEST(SimWorldTest, RunsPingPongInVirtualTime) {
  PingPong p(fixed_delay(3'000));
  const RunOutcome r = p.world.run_until([&] { return p.pinger.rtts.size() == 10; }, 1'000'000'000);
  EXPECT_EQ(r, RunOutcome::kDone);
  ASSERT_EQ(p.pinger.rtts.size(), 10u);
  for (uint64_t rtt : p.pinger.rtts) EXPECT_EQ(rtt, 6'000u);  // exactly two one-way delays
  EXPECT_EQ(p.world.clock().now_ns(), 9 * 10'000u + 6'000u);  // the last reply, no later
  EXPECT_EQ(p.echo.echoed, 10);
  // Events: 10 ping times, 10 deliveries each way; nothing else moves the clock.
  EXPECT_EQ(p.world.steps(), 30u);
  EXPECT_EQ(p.echo.polls, 10);  // the echo is woken only by datagrams
}

TEST(SimWorldTest, StopsAtTheDeadline) {
  PingPong p(fixed_delay(3'000));
  EXPECT_EQ(p.world.run_until([] { return false; }, 25'000), RunOutcome::kDeadline);
  EXPECT_EQ(p.world.clock().now_ns(), 25'000u);
  EXPECT_EQ(p.pinger.rtts.size(), 2u);  // pings of 0 and 10,000 are back; 20,000 returns at 26,000
  // Runs continue from there.
  EXPECT_EQ(p.world.run_until([&] { return p.pinger.rtts.size() == 10; }, 1'000'000),
            RunOutcome::kDone);
}

TEST(SimWorldTest, ReportsIdleWhenNothingCanHappen) {
  SimOptions o = fixed_delay(3'000);
  o.loss_ppm = 1'000'000;
  PingPong p(o);
  EXPECT_EQ(p.world.run_until([&] { return p.pinger.rtts.size() == 10; }, 1'000'000'000),
            RunOutcome::kIdle);
  EXPECT_TRUE(p.pinger.rtts.empty());
  EXPECT_EQ(p.world.clock().now_ns(), 90'000u);  // the last ping; the idle time is not skipped
  EXPECT_EQ(p.world.network().counters().dropped_loss, 10u);
  EXPECT_EQ(p.echo.polls, 0);
}

TEST(SimWorldTest, StepLimitStopsALivelock) {
  SimWorld world(SimOptions{});
  Spinner s;
  world.add_participant(s);
  EXPECT_EQ(world.run_until([] { return false; }, kNever - 1, 100), RunOutcome::kStepLimit);
  EXPECT_EQ(s.polls, 100);
  EXPECT_EQ(world.clock().now_ns(), 0u);
  EXPECT_STREQ(to_string(RunOutcome::kStepLimit), "step-limit");
}

TEST(SimWorldTest, PollsAgainWhileDatagramsWait) {
  // 12 pings in flight at once reach the echo together; it reads 4 per poll, so it is polled
  // three times at the same virtual time.
  SimWorld world(fixed_delay(1'000));
  const HostId a = world.network().add_host(host_address(0));
  const HostId b = world.network().add_host(host_address(1));
  Echo echo(world.network().io(b));
  world.add_participant(echo, b);
  uint8_t byte = 0;
  const iovec v{&byte, 1};
  TxDatagram d;
  d.iov = std::span<const iovec>(&v, 1);
  d.dst = Endpoint{host_address(1), kRoceV2UdpPort};
  for (int i = 0; i < 12; ++i) world.network().io(a).send(d);
  EXPECT_EQ(world.run_until_idle(1'000'000), RunOutcome::kIdle);
  EXPECT_EQ(echo.echoed, 12);
  EXPECT_EQ(echo.polls, 3);
  EXPECT_EQ(world.network().rx_pending(a), 12u);  // host a has no participant reading
  EXPECT_EQ(world.clock().now_ns(), 2'000u);
}

std::vector<std::string> faulty_ping_log(uint64_t seed) {
  SimOptions o;
  o.seed = seed;
  o.delay_min_ns = 1'000;
  o.delay_max_ns = 30'000;  // wider than the ping period: replies overtake each other
  o.loss_ppm = 100'000;
  o.duplicate_ppm = 100'000;
  o.reorder_ppm = 100'000;
  PingPong p(o, 200);
  p.world.run_until_idle(1'000'000'000);
  return p.pinger.log;
}

TEST(SimWorldTest, SameSeedReplaysIdentically) {
  const auto a = faulty_ping_log(3);
  EXPECT_GT(a.size(), 300u);
  EXPECT_EQ(a, faulty_ping_log(3));
  EXPECT_NE(a, faulty_ping_log(4));
}

}  // namespace
}  // namespace urdma::net
