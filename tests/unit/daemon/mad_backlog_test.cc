#include "daemon/mad_backlog.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/protocol.h"
#include "daemon/unique_fd.h"

namespace urdma::daemon {
namespace {

// A MAD channel as urdmad holds it: a non-blocking SEQPACKET pair, the process's end unread.
struct Channel {
  UniqueFd daemon_end, process_end;
  Channel() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, fds), 0);
    daemon_end.reset(fds[0]);
    process_end.reset(fds[1]);
  }
};

// Record i: 300 bytes (a MAD record's size) tagged with i.
std::vector<uint8_t> numbered(uint32_t i) {
  std::vector<uint8_t> r(300, 0);
  std::memcpy(r.data(), &i, sizeof i);
  return r;
}

// Reads every record the process end holds; their numbers, in order.
std::vector<uint32_t> read_all(int fd) {
  std::vector<uint32_t> got;
  uint8_t buf[512];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return got;
    uint32_t i;
    std::memcpy(&i, buf, sizeof i);
    got.push_back(i);
  }
}

TEST(MadBacklog, SendsAtOnceWhileTheChannelHasRoom) {
  Channel ch;
  MadBacklog b;
  EXPECT_EQ(b.send(ch.daemon_end.get(), numbered(7)), MadBacklog::Sent::kNow);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(read_all(ch.process_end.get()), std::vector<uint32_t>{7});
}

// What the kernel buffer cannot take waits, and reaches the process in order once it reads:
// nothing of a burst larger than the socket buffer is lost.
TEST(MadBacklog, ABurstBeyondTheSocketBufferArrivesWholeAndInOrder) {
  Channel ch;
  MadBacklog b;
  constexpr uint32_t kBurst = 2000;
  uint32_t queued = 0;
  for (uint32_t i = 0; i < kBurst; ++i) {
    const MadBacklog::Sent s = b.send(ch.daemon_end.get(), numbered(i));
    ASSERT_NE(s, MadBacklog::Sent::kDropped) << i;
    queued += s == MadBacklog::Sent::kQueued;
  }
  ASSERT_GT(queued, 0u) << "the socket took the whole burst: the test proves nothing";
  EXPECT_EQ(b.size(), queued);
  std::vector<uint32_t> got;
  while (got.size() < kBurst) {
    const std::vector<uint32_t> more = read_all(ch.process_end.get());
    ASSERT_FALSE(more.empty()) << "stalled after " << got.size();
    got.insert(got.end(), more.begin(), more.end());
    ASSERT_EQ(b.flush(ch.daemon_end.get()), 0);
  }
  EXPECT_TRUE(b.empty());
  for (uint32_t i = 0; i < kBurst; ++i) ASSERT_EQ(got[i], i);
}

// A MAD arriving while older ones wait goes behind them, even if the socket has room by then.
TEST(MadBacklog, ANewMadNeverOvertakesTheBacklog) {
  Channel ch;
  MadBacklog b;
  uint32_t i = 0;
  while (b.send(ch.daemon_end.get(), numbered(i)) == MadBacklog::Sent::kNow) ++i;
  const uint32_t first_queued = i++;
  uint8_t buf[512];
  ASSERT_GT(recv(ch.process_end.get(), buf, sizeof buf, 0), 0);  // room for one
  EXPECT_NE(b.send(ch.daemon_end.get(), numbered(i)), MadBacklog::Sent::kDropped);
  std::vector<uint32_t> got = read_all(ch.process_end.get());
  ASSERT_EQ(b.flush(ch.daemon_end.get()), 0);
  const std::vector<uint32_t> rest = read_all(ch.process_end.get());
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[got.size() - 2], first_queued);
  EXPECT_EQ(got.back(), i);
}

// Bounded: past kMaxRecords waiting, a MAD is dropped (the caller counts it; the CM resends).
TEST(MadBacklog, DropsBeyondItsBound) {
  Channel ch;
  MadBacklog b;
  uint32_t i = 0;
  while (b.send(ch.daemon_end.get(), numbered(i)) == MadBacklog::Sent::kNow) ++i;
  while (b.size() < MadBacklog::kMaxRecords)
    ASSERT_EQ(b.send(ch.daemon_end.get(), numbered(++i)), MadBacklog::Sent::kQueued);
  EXPECT_EQ(b.send(ch.daemon_end.get(), numbered(++i)), MadBacklog::Sent::kDropped);
  EXPECT_EQ(b.size(), MadBacklog::kMaxRecords);
}

// A channel the process closed: nothing queues for it, the flush reports the error.
TEST(MadBacklog, AClosedChannelDropsAndReportsTheError) {
  Channel ch;
  MadBacklog b;
  while (b.send(ch.daemon_end.get(), numbered(0)) == MadBacklog::Sent::kNow) {
  }
  ch.process_end.reset();
  const int err = b.flush(ch.daemon_end.get());
  EXPECT_TRUE(err == EPIPE || err == ECONNRESET) << err;  // ECONNRESET: it left MADs unread
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.send(ch.daemon_end.get(), numbered(1)), MadBacklog::Sent::kDropped);
}

}  // namespace
}  // namespace urdma::daemon
