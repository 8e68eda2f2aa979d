// `urdma capture FILE [-i SLOT|PID] [-c COUNT]`: asks this namespace's urdmad to hand a socket to
// every urdma process this user may see (daemon/protocol.h, kCapture); each process's capture
// tap (net/capture_tap.h) writes a record of every datagram it sends and receives to it, and
// this writes them as a raw-IP pcap (capture/pcap_writer.h). A datagram received over IPv4 comes
// without its IP ID (a socket never sees it): its ICRC says which ID the sender used, and that
// is the one written, so the file's ICRCs check as on the wire.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <iostream>
#include <vector>

#include "capture/pcap_writer.h"
#include "daemon/client.h"
#include "net/capture_tap.h"
#include "net/icrc_flow.h"
#include "tools/urdma/commands.h"

namespace urdma::tools {
namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) {
  g_stop.store(true);
}

// The socket buffer the processes write into: room for bursts while this process writes the
// file. Beyond net.core.wmem_max only root may go (SO_SNDBUFFORCE).
constexpr int kSinkBufferBytes = 8 << 20;

// One record as a pcap datagram; false for a record that is not one (ignored, counted).
bool to_datagram(std::span<const uint8_t> rec, capture::IpUdpDatagram* d, uint32_t* dropped) {
  net::CaptureRecord r;
  if (rec.size() < sizeof r) return false;
  std::memcpy(&r, rec.data(), sizeof r);
  if (r.magic != net::kCaptureRecordMagic || r.version != net::kCaptureRecordVersion ||
      r.length != rec.size() - sizeof r)
    return false;
  *dropped = r.dropped_before;
  const net::Endpoint src{net::Address(std::to_array(r.src_address)), r.src_port};
  const net::Endpoint dst{net::Address(std::to_array(r.dst_address)), r.dst_port};
  const bool v4 = src.address.is_v4() && dst.address.is_v4();
  d->timestamp_ns = r.timestamp_ns;
  d->ip_version = v4 ? 4 : 6;
  d->src_address = src.address.bytes();
  d->dst_address = dst.address.bytes();
  d->src_port = r.src_port;
  d->dst_port = r.dst_port;
  d->traffic_class = r.traffic_class;
  d->hop_limit = r.hop_limit != 0 ? r.hop_limit : 64;
  d->payload = rec.subspan(sizeof r);
  // Sent: as a socket sends it, ID 0 with DF set (unconnected: docs/ARCHITECTURE.md).
  d->ipv4_id = 0;
  d->dont_fragment = true;
  if (v4 && r.direction == static_cast<uint8_t>(net::CaptureDirection::kReceived)) {
    // The ICRC names the ID (and DF) the sender used; a datagram whose ICRC fails keeps ID 0,
    // and the file shows the failure as it was.
    const wire::Ipv4IcrcMatch m =
        net::ipv4_icrc_match(d->payload, src, dst, wire::Ipv4DfSearch::kSetOrClear);
    if (m.ok) {
      d->ipv4_id = m.ip_id;
      d->dont_fragment = m.dont_fragment;
    }
  }
  return true;
}

}  // namespace

int capture_packets(const CaptureOptions& options) {
  capture::PcapWriter writer;
  if (const std::string why = writer.open(options.path); !why.empty()) {
    std::cerr << "urdma capture: " << options.path << ": " << why << '\n';
    return 1;
  }
  daemon::Client client;
  std::string detail;
  if (const int err = daemon::Client::connect_or_spawn({}, &client, &detail)) {
    std::cerr << "urdma capture: no urdmad for this network namespace: " << detail << " ("
              << std::strerror(err) << ")\n";
    return 1;
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    std::cerr << "urdma capture: socketpair: " << std::strerror(errno) << '\n';
    return 1;
  }
  daemon::UniqueFd mine(pair[0]), theirs(pair[1]);
  if (setsockopt(theirs.get(), SOL_SOCKET, SO_SNDBUFFORCE, &kSinkBufferBytes,
                 sizeof kSinkBufferBytes) != 0)
    (void)setsockopt(theirs.get(), SOL_SOCKET, SO_SNDBUF, &kSinkBufferBytes,
                     sizeof kSinkBufferBytes);
  uint32_t processes = 0;
  if (const int err = client.capture(options.filter, theirs.get(), &processes)) {
    std::cerr << "urdma capture: urdmad refused: " << std::strerror(err) << '\n';
    return 1;
  }
  theirs.reset();

  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: poll returns EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // The line a script waits for: from here on, nothing the processes send is missed.
  std::cerr << "urdma capture: writing " << options.path << ": " << processes
            << " processes now, and those that start" << std::endl;

  std::vector<uint8_t> buffer(sizeof(net::CaptureRecord) + 65536);
  uint64_t written = 0, dropped = 0, invalid = 0;
  bool daemon_up = true;
  while (!g_stop.load() && (options.count == 0 || written < options.count)) {
    pollfd p[2] = {{mine.get(), POLLIN, 0}, {client.fd(), POLLRDHUP, 0}};
    const int r = poll(p, daemon_up ? 2 : 1, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    // urdmad went away (restarted): the processes keep writing to what they hold.
    if (daemon_up && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) daemon_up = false;
    if (!(p[0].revents & POLLIN)) continue;
    // Everything queued, then one flush: the file is readable after each burst.
    while (options.count == 0 || written < options.count) {
      const ssize_t n = recv(mine.get(), buffer.data(), buffer.size(), MSG_DONTWAIT | MSG_TRUNC);
      if (n < 0) break;
      capture::IpUdpDatagram d;
      uint32_t lost = 0;
      if (static_cast<size_t>(n) > buffer.size() ||
          !to_datagram({buffer.data(), static_cast<size_t>(n)}, &d, &lost) || !writer.write(d)) {
        ++invalid;
        continue;
      }
      dropped += lost;
      ++written;
    }
    if (const std::string why = writer.flush(); !why.empty()) {
      std::cerr << "urdma capture: " << options.path << ": " << why << '\n';
      return 1;
    }
    // At most one wake-up a millisecond: the records wait in the socket meanwhile. Woken for
    // every packet, this process took a core from the processes it watched (two busy-polling
    // perftest processes on 2 cores: docs/PERFORMANCE.md, "urdma capture").
    const timespec pause{0, 1'000'000};
    nanosleep(&pause, nullptr);
  }
  writer.close();
  std::cerr << "urdma capture: " << written << " packets written to " << options.path << "; "
            << dropped << " dropped (the processes found the capture socket full)";
  if (invalid != 0) std::cerr << "; " << invalid << " records not understood";
  std::cerr << '\n';
  return 0;
}

}  // namespace urdma::tools
