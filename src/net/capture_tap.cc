#include "net/capture_tap.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "net/icrc_flow.h"
#include "wire/icrc.h"

namespace urdma::net {
namespace {

// Whether the last kIcrcBytes of `payload` are zero: an unsealed datagram (packet_io.h).
bool unsealed(std::span<const iovec> payload, size_t length) {
  if (length < wire::kIcrcBytes) return false;
  size_t skip = length - wire::kIcrcBytes;
  for (const iovec& v : payload) {
    const auto* b = static_cast<const uint8_t*>(v.iov_base);
    for (size_t i = 0; i < v.iov_len; ++i) {
      if (skip > 0) {
        --skip;
        continue;
      }
      if (b[i] != 0) return false;
    }
  }
  return true;
}

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

CaptureTap::CaptureTap(std::unique_ptr<PacketIo> inner, uint32_t pid)
    : inner_(std::move(inner)), pid_(pid) {}

CaptureTap::~CaptureTap() {
  for (const Sink& k : added_) close(k.fd);
  for (const Sink& k : sinks_) close(k.fd);
}

void CaptureTap::add_sink(int fd, uint32_t slot) {
  if (fd < 0) return;
  std::lock_guard lock(mu_);
  added_.push_back({fd, slot, 0});
  changed_.store(true, std::memory_order_release);
}

void CaptureTap::take_changes() {
  std::lock_guard lock(mu_);
  changed_.store(false, std::memory_order_relaxed);
  // Sinks whose capturer has gone, found without a write (an I/O with no traffic meanwhile
  // would keep them, and their places, until its next datagram): their socket hangs up.
  std::erase_if(sinks_, [this](const Sink& k) {
    pollfd p{.fd = k.fd, .events = 0, .revents = 0};
    if (poll(&p, 1, 0) != 1 || (p.revents & (POLLHUP | POLLERR | POLLNVAL)) == 0) return false;
    close(k.fd);
    ++tap_.ended;
    return true;
  });
  for (const Sink& k : added_) {
    if (sinks_.size() < kMaxCaptureSinks) {
      sinks_.push_back(k);
      ++tap_.sinks;
    } else {
      close(k.fd);
      ++tap_.refused;
    }
  }
  added_.clear();
}

void CaptureTap::count_dropped(size_t n) {
  tap_.dropped += n * sinks_.size();
  for (Sink& k : sinks_) k.dropped_since += static_cast<uint32_t>(n);
}

CaptureRecord make_capture_record(CaptureDirection direction, const Endpoint& src,
                                  const Endpoint& dst, uint8_t traffic_class, uint8_t hop_limit,
                                  uint32_t pid, size_t length, bool truncated) {
  CaptureRecord r{};
  r.magic = kCaptureRecordMagic;
  r.version = kCaptureRecordVersion;
  r.direction = static_cast<uint8_t>(direction);
  r.timestamp_ns = realtime_ns();
  std::memcpy(r.src_address, src.address.bytes().data(), sizeof r.src_address);
  std::memcpy(r.dst_address, dst.address.bytes().data(), sizeof r.dst_address);
  r.src_port = src.port;
  r.dst_port = dst.port;
  r.traffic_class = traffic_class;
  r.hop_limit = hop_limit;
  r.pid = pid;
  r.length = static_cast<uint32_t>(length);
  r.truncated = truncated;
  return r;
}

int write_capture_record(int fd, const CaptureRecord& header, std::span<const iovec> payload) {
  iovec iov[kMaxTxIov + 1];
  iov[0] = {const_cast<CaptureRecord*>(&header), sizeof header};
  const size_t n = std::min(payload.size(), kMaxTxIov);
  std::copy_n(payload.begin(), n, iov + 1);
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = n + 1;
  return sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0 ? 0 : errno;
}

void CaptureTap::write(CaptureDirection direction, const Endpoint& src, const Endpoint& dst,
                       uint8_t traffic_class, uint8_t hop_limit, std::span<const iovec> payload,
                       bool truncated) {
  size_t length = 0;
  for (const iovec& v : payload) length += v.iov_len;
  // An unsealed datagram (it crossed or crosses a shared-memory ring) is recorded with the ICRC
  // it would have had on a wire: a capture reads as one.
  iovec sealed{};
  if (!truncated && unsealed(payload, length)) {
    sealed_.resize(length);
    size_t at = 0;
    for (const iovec& v : payload) {
      std::memcpy(sealed_.data() + at, v.iov_base, v.iov_len);
      at += v.iov_len;
    }
    if (seal_icrc(sealed_, src, dst)) {
      sealed = iovec{sealed_.data(), sealed_.size()};
      payload = std::span<const iovec>(&sealed, 1);
    }
  }
  CaptureRecord r = make_capture_record(direction, src, dst, traffic_class, hop_limit, pid_,
                                        length, truncated);
  for (size_t i = 0; i < sinks_.size();) {
    Sink& k = sinks_[i];
    r.slot = k.slot;
    r.dropped_before = k.dropped_since;
    const int err = write_capture_record(k.fd, r, payload);
    if (err == 0) {
      ++tap_.records;
      k.dropped_since = 0;
    } else if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == EINTR) {
      ++tap_.dropped;
      ++k.dropped_since;
    } else {
      // The capturer is gone (EPIPE, ECONNRESET) or the socket is not one.
      close(k.fd);
      sinks_.erase(sinks_.begin() + static_cast<std::ptrdiff_t>(i));
      ++tap_.ended;
      continue;
    }
    ++i;
  }
}

void CaptureTap::record_sent(std::span<const TxDatagram> sent) {
  for (const TxDatagram& d : sent) {
    if (sinks_.empty()) return;
    write(CaptureDirection::kSent, Endpoint{d.src, d.src_port}, d.dst, d.traffic_class,
          d.hop_limit, d.iov, false);
  }
}

TxStatus CaptureTap::send(const TxDatagram& d) {
  if (!on()) [[likely]]
    return inner_->send(d);
  const TxStatus status = inner_->send(d);
  if (status == TxStatus::kSent) record_sent({&d, 1});
  return status;
}

size_t CaptureTap::send_batch(std::span<const TxDatagram> batch) {
  if (!on()) [[likely]]
    return inner_->send_batch(batch);
  // What the inner I/O consumed was sent, or rejected (never left: not recorded). Which ones
  // were rejected only the counter says; a batch with a rejection records none of its datagrams
  // (they count as dropped): rejections are a bug's or a bad route's, rare.
  const uint64_t rejected = inner_->counters().tx_rejected;
  const size_t n = inner_->send_batch(batch);
  if (inner_->counters().tx_rejected == rejected) {
    record_sent(batch.first(n));
  } else {
    count_dropped(n);
  }
  return n;
}

size_t CaptureTap::recv_batch(std::span<RxDatagram> batch) {
  const size_t n = inner_->recv_batch(batch);
  if (n == 0 || !on()) [[likely]]
    return n;
  for (const RxDatagram& d : batch.first(n)) {
    // A coalesced receive (UDP GRO) is several datagrams: one record each.
    const size_t step = d.segment_bytes == 0 ? d.length : d.segment_bytes;
    for (size_t at = 0; at < d.length && !sinks_.empty(); at += step) {
      const iovec v{d.buffer.data() + at, std::min(step, d.length - at)};
      write(CaptureDirection::kReceived, d.src, d.dst, 0, 0, {&v, 1}, d.truncated);
    }
  }
  return n;
}

}  // namespace urdma::net
