#include "net/udp_socket_io.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "wire/icrc.h"

namespace urdma::net {
namespace {

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

bool set_int(int fd, int level, int name, int value) {
  return setsockopt(fd, level, name, &value, sizeof value) == 0;
}

// Adds one cmsg at `*c` (which must have room) and advances `*c`.
cmsghdr* add_cmsg(msghdr& m, cmsghdr* c, int level, int type, const void* data, size_t len) {
  c->cmsg_level = level;
  c->cmsg_type = type;
  c->cmsg_len = CMSG_LEN(len);
  std::memcpy(CMSG_DATA(c), data, len);
  m.msg_controllen += CMSG_SPACE(len);
  return reinterpret_cast<cmsghdr*>(reinterpret_cast<uint8_t*>(c) + CMSG_SPACE(len));
}

// Socket buffer sizes, best effort (udp_socket_io.h, socket_buffer_bytes): a smaller buffer is
// slower under bursts, not wrong. The *FORCE option passes net.core.[rw]mem_max when permitted.
void set_buffer(int fd, int force_name, int name, size_t bytes) {
  if (bytes == 0) return;
  const int n = static_cast<int>(std::min<size_t>(bytes, INT32_MAX / 2));
  if (!set_int(fd, SOL_SOCKET, force_name, n)) (void)set_int(fd, SOL_SOCKET, name, n);
}

// Candidate ports tried per pool slot before the slot falls back to the main socket's port.
constexpr size_t kPoolPortProbes = 16;

// Two datagrams of one flow: they may share one segmented send.
bool same_flow(const TxDatagram& a, const TxDatagram& b) {
  return a.src_port == b.src_port && a.dst == b.dst && a.src == b.src &&
         a.traffic_class == b.traffic_class && a.hop_limit == b.hop_limit;
}

// Copies the last `n` bytes of a gather list into `out`. Precondition: it holds at least `n`.
void copy_tail(std::span<const iovec> iov, uint8_t* out, size_t n) {
  for (size_t i = iov.size(); i-- > 0 && n > 0;) {
    const size_t take = std::min(n, iov[i].iov_len);
    n -= take;
    std::memcpy(out + n, static_cast<const uint8_t*>(iov[i].iov_base) + iov[i].iov_len - take,
                take);
  }
}

}  // namespace

std::optional<Address> route_source(const Address& dst) {
  const int family = dst.is_v4() ? AF_INET : AF_INET6;
  sockaddr_storage to{};
  const socklen_t to_len = Endpoint{dst, kRoceV2UdpPort}.to_sockaddr(family, to);
  const int probe = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return std::nullopt;
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  const bool routed = connect(probe, reinterpret_cast<const sockaddr*>(&to), to_len) == 0 &&
                      getsockname(probe, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  close(probe);
  if (!routed) return std::nullopt;
  const auto ep = Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&local), len);
  if (!ep) return std::nullopt;
  return ep->address;
}

int UdpSocketIo::bind_udp(const Endpoint& local, std::string* error) {
  const int family = local.address.is_v4() ? AF_INET : AF_INET6;
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP);
  if (fd < 0) {
    *error = errno_text("socket");
    return -1;
  }
  sockaddr_storage ss;
  const socklen_t len = local.to_sockaddr(family, ss);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    *error = errno_text("bind");
    close(fd);
    return -1;
  }
  return fd;
}

std::unique_ptr<UdpSocketIo> UdpSocketIo::adopt(int fd, std::string* error,
                                                const UdpSocketIoOptions& options) {
  auto fail = [&](const char* what) {
    *error = errno_text(what);
    close(fd);
    return nullptr;
  };
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return fail("getsockname");
  const auto local = Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&ss), len);
  if (!local || local->port == 0) {
    errno = EINVAL;
    return fail("not a bound IPv4/IPv6 socket");
  }
  const int family = ss.ss_family;
  int type = 0;
  len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) return fail("SO_TYPE");
  if (type != SOCK_DGRAM) {
    errno = EINVAL;
    return fail("not a datagram socket");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return fail("O_NONBLOCK");
  // DF on, never fragment: IPv4 also gets IP ID 0 on an unconnected socket. A dual-stack AF_INET6
  // socket sends IPv4 too, so it gets both settings.
  if (!set_int(fd, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)) return fail("IP_MTU_DISCOVER");
  if (family == AF_INET) {
    if (!set_int(fd, IPPROTO_IP, IP_PKTINFO, 1)) return fail("IP_PKTINFO");
  } else {
    if (!set_int(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO))
      return fail("IPV6_MTU_DISCOVER");
    // Also reports IPv4 destinations (as mapped addresses) on a dual-stack socket.
    if (!set_int(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)) return fail("IPV6_RECVPKTINFO");
  }
  set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, options.socket_buffer_bytes);
  set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, options.socket_buffer_bytes);
  if (options.source_ports > kMaxSourcePorts ||
      (options.source_ports != 0 && !std::has_single_bit(options.source_ports))) {
    errno = EINVAL;
    return fail("source_ports must be 0 or a power of two <= 64");
  }
  auto io = std::unique_ptr<UdpSocketIo>(new UdpSocketIo(fd, family, *local));
  // A kernel without UDP_SEGMENT (before 4.18) refuses the option: no offload then.
  io->gso_ = options.gso && set_int(fd, SOL_UDP, UDP_SEGMENT, 0);
  io->gro_ = options.gro && set_int(fd, SOL_UDP, UDP_GRO, 1);
  if (options.source_ports > 0 && !io->open_pool(options.source_ports, options.socket_buffer_bytes, error)) return nullptr;
  return io;
}

UdpSocketIo::UdpSocketIo(int fd, int family, const Endpoint& local)
    : fd_(fd), family_(family), local_(local) {}

UdpSocketIo::~UdpSocketIo() {
  for (int fd : pool_fds_)
    if (fd != fd_) close(fd);
  close(fd_);
}

bool UdpSocketIo::open_pool(size_t count, size_t sndbuf_bytes, std::string* error) {
  int v6only = 0;
  socklen_t len = sizeof v6only;
  if (family_ == AF_INET6 && getsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &len) != 0) {
    *error = errno_text("IPV6_V6ONLY");
    return false;
  }
  // Whatever reaches a pool socket is dropped before it is queued: BPF "ret #0".
  static sock_filter drop_all[] = {{BPF_RET | BPF_K, 0, 0, 0}};
  const sock_fprog prog{1, drop_all};
  for (size_t slot = 0; slot < count; ++slot) {
    int bound = -1;
    uint16_t port = 0;
    for (size_t probe = 0; probe < kPoolPortProbes && bound < 0; ++probe) {
      port = static_cast<uint16_t>(kFlowPortBase + slot + count * probe);
      const int s = socket(family_, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_UDP);
      if (s < 0) {
        *error = errno_text("source-port socket");
        return false;
      }
      const char* what = nullptr;
      if (!set_int(s, SOL_SOCKET, SO_REUSEPORT, 1)) what = "SO_REUSEPORT";
      if (!what && family_ == AF_INET6 && !set_int(s, IPPROTO_IPV6, IPV6_V6ONLY, v6only))
        what = "IPV6_V6ONLY";
      if (!what && !set_int(s, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO))
        what = "IP_MTU_DISCOVER";
      if (!what && family_ == AF_INET6 &&
          !set_int(s, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO))
        what = "IPV6_MTU_DISCOVER";
      if (!what && !set_int(s, SOL_SOCKET, SO_RCVBUF, 1)) what = "SO_RCVBUF";
      if (!what && setsockopt(s, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0)
        what = "SO_ATTACH_FILTER";
      if (!what) set_buffer(s, SO_SNDBUFFORCE, SO_SNDBUF, sndbuf_bytes);
      if (what) {
        *error = errno_text(what);
        close(s);
        return false;
      }
      sockaddr_storage ss;
      const socklen_t n = Endpoint{local_.address, port}.to_sockaddr(family_, ss);
      if (bind(s, reinterpret_cast<const sockaddr*>(&ss), n) == 0) {
        bound = s;
      } else if (errno == EADDRINUSE || errno == EACCES) {
        close(s);  // held by another user or without SO_REUSEPORT: the next candidate
      } else {
        *error = errno_text("bind source port");
        close(s);
        return false;
      }
    }
    pool_ports_.push_back(bound >= 0 ? port : local_.port);
    pool_fds_.push_back(bound >= 0 ? bound : fd_);
  }
  return true;
}

uint16_t UdpSocketIo::source_port(uint16_t wanted) const {
  if (pool_ports_.empty() || wanted == local_.port) return local_.port;
  return pool_ports_[(wanted & kFlowPortMask) & (pool_ports_.size() - 1)];
}

int UdpSocketIo::fd_for_port(uint16_t port) const {
  if (port == local_.port) return fd_;
  if (pool_ports_.empty() || (port & ~kFlowPortMask) != kFlowPortBase) return -1;
  const size_t slot = (port & kFlowPortMask) & (pool_ports_.size() - 1);
  return pool_ports_[slot] == port ? pool_fds_[slot] : -1;
}

bool UdpSocketIo::prepare_tx(size_t i, const TxDatagram& d) {
  if (d.iov.size() > kMaxTxIov || d.size_bytes() > kMaxUdpPayloadBytes) return false;
  msghdr& m = msgs_[i].msg_hdr;
  m = msghdr{};
  m.msg_namelen = d.dst.to_sockaddr(family_, names_[i]);
  if (m.msg_namelen == 0) return false;  // an IPv6 destination on an AF_INET socket
  const bool v4 = d.dst.address.is_v4();
  if (!d.src.is_unspecified() && d.src.is_v4() != v4) return false;
  m.msg_name = &names_[i];
  // sendmsg does not write through msg_iov; msghdr just is not const-correct.
  m.msg_iov = const_cast<iovec*>(d.iov.data());
  m.msg_iovlen = d.iov.size();
  m.msg_control = cmsg_[i].bytes;
  m.msg_controllen = 0;
  auto* c = reinterpret_cast<cmsghdr*>(cmsg_[i].bytes);
  // IPv4 destinations (also IPv4-mapped ones on an AF_INET6 socket) take SOL_IP cmsgs.
  if (!d.src.is_unspecified()) {
    if (v4) {
      in_pktinfo pi{};
      std::memcpy(&pi.ipi_spec_dst, d.src.v4_bytes().data(), 4);
      c = add_cmsg(m, c, IPPROTO_IP, IP_PKTINFO, &pi, sizeof pi);
    } else {
      in6_pktinfo pi{};
      std::memcpy(&pi.ipi6_addr, d.src.bytes().data(), Address::kSize);
      c = add_cmsg(m, c, IPPROTO_IPV6, IPV6_PKTINFO, &pi, sizeof pi);
    }
  }
  if (d.traffic_class != 0) {
    const int tc = d.traffic_class;
    c = v4 ? add_cmsg(m, c, IPPROTO_IP, IP_TOS, &tc, sizeof tc)
           : add_cmsg(m, c, IPPROTO_IPV6, IPV6_TCLASS, &tc, sizeof tc);
  }
  if (d.hop_limit != 0) {
    const int hl = d.hop_limit;
    c = v4 ? add_cmsg(m, c, IPPROTO_IP, IP_TTL, &hl, sizeof hl)
           : add_cmsg(m, c, IPPROTO_IPV6, IPV6_HOPLIMIT, &hl, sizeof hl);
  }
  if (m.msg_controllen == 0) m.msg_control = nullptr;
  return true;
}

TxStatus UdpSocketIo::send(const TxDatagram& d) {
  const size_t sent_before = io_.tx_datagrams;
  if (send_batch(std::span<const TxDatagram>(&d, 1)) == 0) return TxStatus::kWouldBlock;
  return io_.tx_datagrams > sent_before ? TxStatus::kSent : TxStatus::kRejected;
}

size_t UdpSocketIo::gso_run(std::span<const TxDatagram> batch) const {
  if (!gso_) return 1;
  const TxDatagram& first = batch[0];
  // Multicast goes out one datagram per send: the local members of a group get the sender's
  // looped-back copy (IP_MULTICAST_LOOP), and a looped-back GSO super-packet reached each of two
  // receiving processes as its first segment only (mckey, 5 datagrams: 1 arrived).
  if (first.dst.address.is_multicast()) return 1;
  const size_t segment = first.size_bytes();
  size_t total = segment;
  size_t iovs = first.iov.size() + 1;
  size_t n = 1;
  while (n < batch.size() && n < kMaxGsoSegments) {
    const TxDatagram& d = batch[n];
    const size_t size = d.size_bytes();
    if (!same_flow(first, d) || size > segment || size < wire::kIcrcBytes ||
        d.iov.size() > kMaxTxIov || total + size > kMaxUdpPayloadBytes ||
        iovs + d.iov.size() + 1 > kMaxMsgIov)
      break;
    total += size;
    iovs += d.iov.size() + 1;
    ++n;
    if (size < segment) break;  // only the last segment may be short
  }
  return n;
}

void UdpSocketIo::gather_run(size_t i, std::span<const TxDatagram> run, size_t first,
                             size_t* iov_used) {
  msghdr& m = msgs_[i].msg_hdr;
  iovec* const begin = &tx_iov_[*iov_used];
  iovec* out = begin;
  const bool v4 = run[0].dst.address.is_v4();
  for (size_t k = 0; k < run.size(); ++k) {
    const std::span<const iovec> iov = run[k].iov;
    if (k == 0 || !v4) {
      out = std::copy(iov.begin(), iov.end(), out);
      continue;
    }
    // Segment k leaves with IPv4 ID k: the same packet, with the ICRC for that ID in place of
    // the caller's (sealed for ID 0) — the last kIcrcBytes of its gather list.
    const size_t size = run[k].size_bytes();  // >= kIcrcBytes (gso_run)
    std::array<uint8_t, wire::kIcrcBytes>& icrc = icrc_[first + k];
    copy_tail(iov, icrc.data(), icrc.size());
    wire::store_icrc(icrc, wire::icrc_of(icrc) ^
                               wire::ipv4_id_icrc_delta(static_cast<uint16_t>(k), size));
    size_t keep = size - wire::kIcrcBytes;
    for (const iovec& v : iov) {
      if (keep == 0) break;
      const size_t len = std::min(keep, v.iov_len);
      *out++ = iovec{v.iov_base, len};
      keep -= len;
    }
    *out++ = iovec{icrc.data(), icrc.size()};
  }
  m.msg_iov = begin;
  m.msg_iovlen = static_cast<size_t>(out - begin);
  *iov_used += m.msg_iovlen;
  // The segment size: every datagram but the last has exactly the first one's size.
  if (m.msg_control == nullptr) m.msg_control = cmsg_[i].bytes;
  auto* c = reinterpret_cast<cmsghdr*>(cmsg_[i].bytes + m.msg_controllen);
  const uint16_t segment = static_cast<uint16_t>(run[0].size_bytes());
  add_cmsg(m, c, SOL_UDP, UDP_SEGMENT, &segment, sizeof segment);
}

size_t UdpSocketIo::send_batch(std::span<const TxDatagram> batch) {
  base::check(batch.size() <= kMaxBatch, "send_batch larger than kMaxBatch");
  size_t done = 0;
  bool single = false;  // the last segmented send failed: send its datagrams one by one
  while (done < batch.size()) {
    // Prepare a run of valid datagrams from one source port (one socket), consecutive ones of
    // one flow in one message when the offload is on; an invalid one — or one asking for a port
    // this I/O has no socket for, whose ICRC would be wrong — is rejected without a syscall.
    const int fd = fd_for_port(batch[done].src_port);
    size_t n = 0;       // messages
    size_t covered = 0;  // datagrams in them
    size_t iov_used = 0;
    if (fd >= 0) {
      while (done + covered < batch.size() &&
             fd_for_port(batch[done + covered].src_port) == fd &&
             prepare_tx(n, batch[done + covered])) {
        const std::span<const TxDatagram> rest = batch.subspan(done + covered);
        const size_t run = single ? 1 : gso_run(rest);
        if (run > 1) gather_run(n, rest.first(run), done + covered, &iov_used);
        run_length_[n] = static_cast<uint8_t>(run);
        covered += run;
        ++n;
      }
    }
    if (n == 0) {
      io_.tx_rejected++;
      ++done;
      continue;
    }
    // One message goes by sendmsg: sendmmsg's loop around it costs more (udp_socket_io.h).
    const int r = n == 1 ? (sendmsg(fd, &msgs_[0].msg_hdr, MSG_DONTWAIT) >= 0 ? 1 : -1)
                         : sendmmsg(fd, msgs_.data(), static_cast<unsigned>(n), MSG_DONTWAIT);
    if (r > 0) {
      for (int i = 0; i < r; ++i) {
        const size_t run = run_length_[static_cast<size_t>(i)];
        for (size_t k = 0; k < run; ++k) io_.tx_bytes += batch[done + k].size_bytes();
        io_.tx_datagrams += run;
        if (run > 1) {
          io_.tx_gso_sends++;
          io_.tx_gso_datagrams += run;
        }
        done += run;
      }
      single = false;
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      io_.tx_would_block++;
      break;
    }
    if (run_length_[0] > 1) {
      // The segmented send failed as a whole (a segment above the path MTU: EINVAL; a device
      // without checksum offload: EIO): its datagrams go again one by one, each with its own
      // fate. Without the offload on this path at all, stop asking for it.
      if (errno == EIO || errno == ENOPROTOOPT || errno == EOPNOTSUPP) gso_ = false;
      single = true;
      continue;
    }
    // The first datagram of the run failed for good (EMSGSIZE above the path MTU, no route, ...):
    // like a datagram lost on the wire.
    io_.tx_rejected++;
    ++done;
  }
  return done;
}

size_t UdpSocketIo::recv_batch(std::span<RxDatagram> batch) {
  base::check(batch.size() <= kMaxBatch, "recv_batch larger than kMaxBatch");
  if (batch.empty()) return 0;
  // A conversation's read: the last read found at most one datagram, so this one reads one, by
  // recvmsg (udp_socket_io.h). A one-datagram read that found one is followed by a batch read.
  if (rx_one_ && batch.size() > 1) {
    io_.rx_one_reads++;
    batch = batch.first(1);
  }
  const bool one = batch.size() == 1;
  for (size_t i = 0; i < batch.size(); ++i) {
    rx_iov_[i] = iovec{batch[i].buffer.data(), batch[i].buffer.size()};
    msghdr& m = msgs_[i].msg_hdr;
    m = msghdr{};
    m.msg_name = &names_[i];
    m.msg_namelen = sizeof names_[i];
    m.msg_iov = &rx_iov_[i];
    m.msg_iovlen = 1;
    m.msg_control = cmsg_[i].bytes;
    m.msg_controllen = kCmsgBytes;
  }
  int r;
  do {
    if (one) {
      const ssize_t k = recvmsg(fd_, &msgs_[0].msg_hdr, MSG_DONTWAIT);
      if (k >= 0) msgs_[0].msg_len = static_cast<unsigned>(k);
      r = k >= 0 ? 1 : -1;
    } else {
      r = recvmmsg(fd_, msgs_.data(), static_cast<unsigned>(batch.size()), MSG_DONTWAIT, nullptr);
    }
  } while (r < 0 && errno == EINTR);
  rx_one_ = one ? r <= 0 : r <= 1;
  if (r <= 0) return 0;  // EAGAIN: nothing waiting
  for (size_t i = 0; i < static_cast<size_t>(r); ++i) {
    const msghdr& m = msgs_[i].msg_hdr;
    RxDatagram& out = batch[i];
    out.length = msgs_[i].msg_len;
    out.truncated = (m.msg_flags & MSG_TRUNC) != 0;
    out.src = Endpoint::from_sockaddr(reinterpret_cast<const sockaddr*>(&names_[i]), m.msg_namelen)
                  .value_or(Endpoint{});
    out.dst = local_;
    out.segment_bytes = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr;
         c = CMSG_NXTHDR(const_cast<msghdr*>(&m), c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
        uint8_t b[4];
        std::memcpy(b, &pi.ipi_addr, 4);  // the header's destination address
        out.dst.address = Address::from_v4(std::span<const uint8_t, 4>(b));
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
        in6_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
        Address::Bytes b{};
        std::memcpy(b.data(), &pi.ipi6_addr, Address::kSize);
        out.dst.address = Address(b);
      } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
        int segment = 0;
        std::memcpy(&segment, CMSG_DATA(c), sizeof segment);
        if (segment > 0 && static_cast<size_t>(segment) < out.length) out.segment_bytes = segment;
      }
    }
    if (out.segment_bytes != 0) {
      const size_t n = (out.length + out.segment_bytes - 1) / out.segment_bytes;
      io_.rx_gro_receives++;
      io_.rx_gro_datagrams += n;
      io_.rx_datagrams += n - 1;  // and the one every receive counts, below
    }
    io_.rx_datagrams++;
    io_.rx_bytes += out.length;
    if (out.truncated) io_.rx_truncated++;
  }
  return static_cast<size_t>(r);
}

}  // namespace urdma::net
