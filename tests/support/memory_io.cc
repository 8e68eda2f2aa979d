// The in-memory PacketIo; see memory_io.h.
#include "support/memory_io.h"

#include <algorithm>
#include <cstring>

namespace urdma::test {

MemoryIo::Frame& MemoryIo::push_frame(size_t length) {
  if (count_ == ring_.size()) grow_ring();
  Frame* f;
  if (free_.empty()) {
    pool_.push_back(std::make_unique<Frame>());
    f = pool_.back().get();
  } else {
    f = free_.back();
    free_.pop_back();
  }
  if (f->storage.size() < length) f->storage.resize(length);
  f->length = length;
  ring_[(head_ + count_) & (ring_.size() - 1)] = f;
  ++count_;
  return *f;
}

void MemoryIo::grow_ring() {
  std::vector<Frame*> bigger(ring_.empty() ? 256 : ring_.size() * 2);
  for (size_t i = 0; i < count_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
  ring_ = std::move(bigger);
  head_ = 0;
}

void MemoryIo::deliver(std::span<const uint8_t> bytes, const net::Endpoint& src,
                       const net::Endpoint& dst) {
  Frame& f = push_frame(bytes.size());
  if (!bytes.empty()) std::memcpy(f.storage.data(), bytes.data(), bytes.size());
  f.src = src;
  f.dst = dst;
}

net::TxStatus MemoryIo::send(const net::TxDatagram& d) {
  ++calls_;
  return send_one(d);
}

net::TxStatus MemoryIo::send_one(const net::TxDatagram& d) {
  const size_t n = d.size_bytes();
  if (n > net::kMaxUdpPayloadBytes || d.iov.size() > net::kMaxTxIov) {
    ++counters_.tx_rejected;
    return net::TxStatus::kRejected;
  }
  ++counters_.tx_datagrams;
  counters_.tx_bytes += n;
  if (peer_ != nullptr) {
    // The copy sendmsg makes. The engine always names its source address (the ICRC covers it).
    Frame& f = peer_->push_frame(n);
    size_t at = 0;
    for (const iovec& v : d.iov) {
      if (v.iov_len != 0) std::memcpy(f.storage.data() + at, v.iov_base, v.iov_len);
      at += v.iov_len;
    }
    f.src = net::Endpoint{d.src, d.src_port};
    f.dst = d.dst;
    if (on_send) on_send(d, {f.storage.data(), n});
    return net::TxStatus::kSent;
  }
  if (!record_ && !on_send) return net::TxStatus::kSent;
  Sent s;
  s.bytes.reserve(n);
  for (const iovec& v : d.iov) {
    const auto* p = static_cast<const uint8_t*>(v.iov_base);
    s.bytes.insert(s.bytes.end(), p, p + v.iov_len);
  }
  if (on_send) on_send(d, s.bytes);
  if (record_) {
    s.iov.assign(d.iov.begin(), d.iov.end());
    s.dst = d.dst;
    s.src = d.src;
    s.src_port = d.src_port;
    s.unread = count_;
    s.call = calls_;
    sent.push_back(std::move(s));
  }
  return net::TxStatus::kSent;
}

size_t MemoryIo::send_batch(std::span<const net::TxDatagram> batch) {
  ++calls_;
  for (const net::TxDatagram& d : batch) send_one(d);
  return batch.size();
}

size_t MemoryIo::recv_batch(std::span<net::RxDatagram> batch) {
  size_t n = 0;
  for (; n < batch.size() && count_ > 0; ++n) {
    Frame* f = ring_[head_];
    net::RxDatagram& slot = batch[n];
    // The copy recvmsg makes; the excess of a datagram longer than the buffer is lost.
    const size_t len = std::min(f->length, slot.buffer.size());
    if (len != 0) std::memcpy(slot.buffer.data(), f->storage.data(), len);
    slot.length = len;
    slot.truncated = len < f->length;
    slot.src = f->src;
    slot.dst = f->dst;
    slot.via_ring = as_ring;
    ++counters_.rx_datagrams;
    counters_.rx_bytes += len;
    if (slot.truncated) ++counters_.rx_truncated;
    free_.push_back(f);
    head_ = (head_ + 1) & (ring_.size() - 1);
    --count_;
  }
  return n;
}

}  // namespace urdma::test
