// The steering program against the kernel: a real SO_REUSEPORT group on an ephemeral port,
// datagrams with chosen DestQPs sent over loopback (IPv4 and IPv6), and the socket each lands on.
#include "daemon/steering.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <vector>

namespace urdma::daemon {
namespace {

std::vector<uint8_t> bth_with_dest_qp(uint32_t qpn, size_t size = 12) {
  std::vector<uint8_t> d(size, 0);
  if (size >= 8) {
    d[0] = 0x04;  // RC SEND Only
    d[4] = 0xC0;  // FECN/BECN set: must not affect the slot
    d[5] = static_cast<uint8_t>(qpn >> 16);
    d[6] = static_cast<uint8_t>(qpn >> 8);
    d[7] = static_cast<uint8_t>(qpn);
  }
  return d;
}

TEST(Steering, MappingDefinition) {
  constexpr unsigned n = 64;
  EXPECT_EQ(slot_of_qpn(0, n), 0u);
  EXPECT_EQ(slot_of_qpn(1, n), 0u);
  EXPECT_EQ(slot_of_qpn(kQpnsPerRange - 1, n), 0u);
  EXPECT_EQ(slot_of_qpn(kQpnsPerRange, n), 1u);
  EXPECT_EQ(slot_of_qpn(5 * kQpnsPerRange + 17, n), 5u);
  EXPECT_EQ(slot_of_qpn((n + 5) * kQpnsPerRange, n), 5u);  // generation 1 of slot 5
  EXPECT_EQ(slot_of_qpn(n * kQpnsPerRange, n), 0u);        // multiples of n: the daemon's
  EXPECT_EQ(slot_of_qpn(0xFFFFFF, n), (kRangeCount - 1) % n);
  EXPECT_EQ(steer(bth_with_dest_qp(7 * kQpnsPerRange), n), 7u);
  EXPECT_EQ(steer(bth_with_dest_qp(7 * kQpnsPerRange, 7), n), 0u);  // short: slot 0
  EXPECT_EQ(steer(bth_with_dest_qp(7 * kQpnsPerRange, 8), n), 7u);  // DestQP complete at 8
}

TEST(Steering, ProgramIsValidClassicBpf) {
  const auto program = steering_program(16);
  ASSERT_FALSE(program.empty());
  EXPECT_EQ(program.back().code, BPF_RET | BPF_A);
  EXPECT_DEATH(steering_program(1), "slot count");
}

// Sends each datagram to the group and returns the slot each one arrived at (-1: nowhere).
std::vector<int> deliver(const SlotGroup& group, int family,
                         const std::vector<std::vector<uint8_t>>& datagrams) {
  UniqueFd tx(socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  EXPECT_TRUE(tx.valid());
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(group.port);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *sin;
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(group.port);
    sin6->sin6_addr = in6addr_loopback;
    len = sizeof *sin6;
  }
  std::vector<int> where(datagrams.size(), -1);
  for (size_t i = 0; i < datagrams.size(); ++i) {
    // Tag each datagram with its index in a trailing byte the program never reads.
    std::vector<uint8_t> d = datagrams[i];
    d.push_back(static_cast<uint8_t>(i));
    EXPECT_EQ(sendto(tx.get(), d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&ss), len),
              static_cast<ssize_t>(d.size()));
    // Loopback delivery is synchronous with sendto; still wait (bounded) for the socket.
    bool found = false;
    for (int attempt = 0; attempt < 100 && !found; ++attempt) {
      std::vector<pollfd> pfds;
      for (const auto& s : group.sockets) pfds.push_back({s.get(), POLLIN, 0});
      if (poll(pfds.data(), pfds.size(), 20) <= 0) continue;
      for (size_t s = 0; s < pfds.size(); ++s) {
        if (!(pfds[s].revents & POLLIN)) continue;
        uint8_t buf[256];
        const ssize_t n = recv(pfds[s].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) continue;
        const size_t tagged = buf[n - 1];
        EXPECT_EQ(tagged, i) << "datagrams arrive in order";
        if (tagged < where.size()) where[tagged] = static_cast<int>(s);
        found = true;
      }
    }
  }
  return where;
}

void check_group_steers(const SlotGroupOptions& options, int tx_family) {
  SlotGroup group;
  std::string error;
  ASSERT_EQ(open_slot_group(options, &group, &error), 0) << error;
  ASSERT_EQ(group.sockets.size(), options.slot_count);
  ASSERT_NE(group.port, 0);
  const unsigned n = options.slot_count;
  std::vector<std::vector<uint8_t>> datagrams;
  std::vector<int> expected;
  auto add = [&](std::vector<uint8_t> d, int slot) {
    datagrams.push_back(std::move(d));
    expected.push_back(slot);
  };
  for (unsigned s = 0; s < n; ++s) {
    add(bth_with_dest_qp(s * kQpnsPerRange + 3), static_cast<int>(s));           // generation 0
    add(bth_with_dest_qp((s + n) * kQpnsPerRange + 4095), static_cast<int>(s));  // generation 1
  }
  add(bth_with_dest_qp(1), 0);                     // QP1: CM
  add(bth_with_dest_qp(0), 0);                     // QP0
  add(bth_with_dest_qp(3 * kQpnsPerRange, 7), 0);  // 7 bytes: no DestQP
  add({}, 0);                                      // only the tag byte
  add(bth_with_dest_qp(0xFFFFFF), static_cast<int>((kRangeCount - 1) % n));
  EXPECT_EQ(deliver(group, tx_family, datagrams), expected);
}

TEST(Steering, DualStackGroupSteersIpv4) {
  check_group_steers({.slot_count = 8, .port = 0, .allow_ipv6 = true}, AF_INET);
}

TEST(Steering, DualStackGroupSteersIpv6) {
  SlotGroup probe;
  std::string error;
  ASSERT_EQ(open_slot_group({.slot_count = 2, .port = 0, .allow_ipv6 = true}, &probe, &error), 0);
  if (probe.family != AF_INET6) GTEST_SKIP() << "no IPv6 on this host";
  check_group_steers({.slot_count = 8, .port = 0, .allow_ipv6 = true}, AF_INET6);
}

TEST(Steering, Ipv4OnlyGroupSteers) {
  check_group_steers({.slot_count = 5, .port = 0, .allow_ipv6 = false}, AF_INET);
}

TEST(Steering, VerifiesAFreshGroup) {
  SlotGroup group;
  std::string error;
  ASSERT_EQ(open_slot_group({.slot_count = 16, .port = 0}, &group, &error), 0) << error;
  bool skipped = true;
  EXPECT_TRUE(verify_steering(group, &error, &skipped)) << error;
  EXPECT_FALSE(skipped) << "loopback is up here";
}

TEST(Steering, DetectsAStaleSocketInTheGroup) {
  // A socket of an "earlier daemon", still open, on the port: the new group joins its group.
  SlotGroup earlier;
  std::string error;
  ASSERT_EQ(open_slot_group({.slot_count = 2, .port = 0}, &earlier, &error), 0) << error;
  earlier.sockets.pop_back();  // only socket 0 stays open
  SlotGroup group;
  EXPECT_EQ(open_slot_group({.slot_count = 4, .port = earlier.port}, &group, &error), EADDRNOTAVAIL)
      << "the port is taken: refused before binding";
  EXPECT_NE(error.find("already bound"), std::string::npos) << error;
  // Bound anyway (as a kernel without the check would), the probes catch it.
  ASSERT_EQ(open_slot_group({.slot_count = 4, .port = earlier.port, .require_free_port = false},
                            &group, &error),
            0)
      << error;
  bool skipped = false;
  EXPECT_FALSE(verify_steering(group, &error, &skipped));
  EXPECT_FALSE(skipped);
  EXPECT_NE(error.find("earlier group"), std::string::npos) << error;
}

TEST(Steering, RejectsBadSlotCounts) {
  SlotGroup group;
  std::string error;
  EXPECT_EQ(open_slot_group({.slot_count = 1, .port = 0}, &group, &error), EINVAL);
  EXPECT_EQ(open_slot_group({.slot_count = kMaxSlots + 1, .port = 0}, &group, &error), EINVAL);
}

}  // namespace
}  // namespace urdma::daemon
