#include "daemon/steering.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/check.h"
#include "daemon/mcast_members.h"

namespace urdma::daemon {

unsigned steer(std::span<const uint8_t> udp_payload, unsigned slot_count) {
  if (udp_payload.size() < kMinSteeredBytes) return 0;
  const wire::BthView bth(udp_payload.data());
  return slot_of_qpn(bth.dest_qp(), slot_count);
}

std::vector<sock_filter> steering_program(unsigned slot_count) {
  base::check(slot_count >= kMinSlots && slot_count <= kMaxSlots, "slot count in range");
  // Absolute loads in classic BPF are big-endian, as the BTH is.
  return {
      BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),                        // A = payload length
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, kMinSteeredBytes, 1, 0),  // short: slot 0
      BPF_STMT(BPF_RET | BPF_K, 0),                                 //
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kDestQpWordOffset),        // A = bytes 4..7
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, wire::kQpnMask),          // A = DestQP
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, kSlotShift),              // A = range
      BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, slot_count),              // A = slot
      BPF_STMT(BPF_RET | BPF_A, 0),
  };
}

namespace {

int bind_one(int family, uint16_t port, bool reuseport, UniqueFd* out, uint16_t* bound_port,
             std::string* error) {
  UniqueFd fd(socket(family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_UDP));
  if (!fd.valid()) {
    *error = errno_text("socket");
    return errno;
  }
  const int one = 1;
  if (reuseport && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    *error = errno_text("SO_REUSEPORT");
    return errno;
  }
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET6) {
    const int zero = 0;
    if (setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0) {
      *error = errno_text("IPV6_V6ONLY=0");
      return errno;
    }
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_addr = in6addr_any;
    sin6->sin6_port = htons(port);
    len = sizeof *sin6;
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_ANY);
    sin->sin_port = htons(port);
    len = sizeof *sin;
  }
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    const int err = errno;
    *error = errno_text(("bind UDP port " + std::to_string(port)).c_str(), err);
    return err;
  }
  len = sizeof ss;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    *error = errno_text("getsockname");
    return errno;
  }
  *bound_port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  *out = std::move(fd);
  return 0;
}

}  // namespace

int open_slot_group(const SlotGroupOptions& options, SlotGroup* group, std::string* error) {
  if (options.slot_count < kMinSlots || options.slot_count > kMaxSlots) {
    *error = "slot count must be in [" + std::to_string(kMinSlots) + ", " +
             std::to_string(kMaxSlots) + "]";
    return EINVAL;
  }
  SlotGroup g;
  g.family = AF_INET;
  if (options.allow_ipv6) {
    UniqueFd probe(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
    if (probe.valid()) g.family = AF_INET6;
  }
  g.port = options.port;
  if (options.require_free_port && g.port != 0) {
    // Anything already on the port would share it with the group: an SO_REUSEPORT socket of
    // ours left from an earlier daemon (held by running processes) would even join the group and
    // shift every index. A plain bind finds any of them.
    UniqueFd probe;
    uint16_t bound = 0;
    const int err = bind_one(g.family, g.port, /*reuseport=*/false, &probe, &bound, error);
    if (err == EADDRINUSE) {
      *error = "UDP port " + std::to_string(g.port) +
               " is already bound: sockets of an earlier group (a previous urdmad's, still held "
               "by running processes) or another program";
      return EADDRNOTAVAIL;
    }
    if (err != 0) return err;
  }
  for (unsigned i = 0; i < options.slot_count; ++i) {
    UniqueFd fd;
    uint16_t bound = 0;
    if (const int err = bind_one(g.family, g.port, /*reuseport=*/true, &fd, &bound, error))
      return err;
    // Multicast: each socket hears only the groups joined on it (mcast_members.h).
    if (const int err = accept_only_joined_groups(fd.get(), g.family)) {
      *error = errno_text("IP_MULTICAST_ALL=0", err);
      return err;
    }
    g.port = bound;
    g.sockets.push_back(std::move(fd));
  }
  auto program = steering_program(options.slot_count);
  const sock_fprog fprog{static_cast<unsigned short>(program.size()), program.data()};
  if (setsockopt(g.sockets[0].get(), SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fprog, sizeof fprog) !=
      0) {
    *error = errno_text("SO_ATTACH_REUSEPORT_CBPF");
    return errno;
  }
  *group = std::move(g);
  return 0;
}

bool verify_steering(const SlotGroup& group, std::string* error, bool* skipped) {
  *skipped = false;
  const unsigned n = static_cast<unsigned>(group.sockets.size());
  UniqueFd tx(socket(group.family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
  if (!tx.valid()) {
    *error = errno_text("probe socket");
    return false;
  }
  sockaddr_storage ss{};
  socklen_t len;
  if (group.family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(group.port);
    // ::ffff:127.0.0.1: also proves the dual-stack group receives IPv4.
    sin6->sin6_addr.s6_addr[10] = 0xff;
    sin6->sin6_addr.s6_addr[11] = 0xff;
    sin6->sin6_addr.s6_addr[12] = 127;
    sin6->sin6_addr.s6_addr[15] = 1;
    len = sizeof *sin6;
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(group.port);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *sin;
  }
  // A probe: a BTH whose DestQP is QPN 2 of range s (never a QP0/QP1 MAD), then a marker.
  constexpr uint8_t kMarker[8] = {'u', 'r', 'd', 'm', 'a', 'd', '?', '!'};
  for (unsigned s = 0; s < n; ++s) {
    uint8_t d[wire::Bth::kSize + sizeof kMarker + 4] = {};
    wire::Bth bth(d);
    bth.set_dest_qp(first_qpn_of_range(s) + 2);
    std::memcpy(d + wire::Bth::kSize, kMarker, sizeof kMarker);
    std::memcpy(d + wire::Bth::kSize + sizeof kMarker, &s, 4);
    if (sendto(tx.get(), d, sizeof d, 0, reinterpret_cast<const sockaddr*>(&ss), len) !=
        static_cast<ssize_t>(sizeof d)) {
      *skipped = true;  // loopback down or absent: nothing to verify with
      return true;
    }
  }
  // Loopback delivers before sendto returns in practice; wait a little (200 ms in all) in case
  // it did not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  unsigned found = 0;
  for (unsigned s = 0; s < n; ++s) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{group.sockets[s].get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) continue;
    uint8_t d[64];
    for (;;) {
      const ssize_t r = recv(group.sockets[s].get(), d, sizeof d, MSG_DONTWAIT);
      if (r < 0) break;
      if (r != static_cast<ssize_t>(wire::Bth::kSize + sizeof kMarker + 4) ||
          std::memcmp(d + wire::Bth::kSize, kMarker, sizeof kMarker) != 0)
        continue;  // someone else's datagram
      unsigned probe;
      std::memcpy(&probe, d + wire::Bth::kSize + sizeof kMarker, 4);
      if (probe != s) {
        *error = "UDP port " + std::to_string(group.port) + ": socket " + std::to_string(s) +
                 " of the group received the probe for slot " + std::to_string(probe) +
                 " -- sockets of an earlier group (a previous urdmad's, still held by running "
                 "processes) share the port and shift the steering";
        return false;
      }
      ++found;
    }
  }
  if (found == 0) {
    // Nothing came back at all (a packet filter on loopback?): nothing was proved either way.
    *skipped = true;
    return true;
  }
  if (found != n) {
    *error = "UDP port " + std::to_string(group.port) + ": only " + std::to_string(found) + " of " +
             std::to_string(n) +
             " steering probes arrived on their own slot -- another group shares the port";
    return false;
  }
  return true;
}

std::optional<uid_t> udp_port_owner(uint16_t port) {
  // "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ..."
  for (const char* table : {"/proc/net/udp6", "/proc/net/udp"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // the heading
    while (std::getline(f, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, st, queues, timer, retransmits;
      unsigned long uid = 0;
      if (!(fields >> sl >> local >> remote >> st >> queues >> timer >> retransmits >> uid))
        continue;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) == port)
        return static_cast<uid_t>(uid);
    }
  }
  return std::nullopt;
}

}  // namespace urdma::daemon
