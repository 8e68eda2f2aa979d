#include "net/shm_ring.h"

#include <cstring>

namespace urdma::net {
namespace {

constexpr uint64_t kMask = kShmRingDataBytes - 1;

constexpr size_t record_bytes(size_t payload) {
  return (sizeof(ShmRecord) + payload + kShmRecordAlign - 1) & ~(kShmRecordAlign - 1);
}

}  // namespace

ShmProducer::ShmProducer(ShmRingHeader* header, uint8_t* data)
    : h_(header),
      data_(data),
      head_(header->head.load(std::memory_order_relaxed)),
      tail_seen_(header->tail.load(std::memory_order_acquire)) {
  // A region is new (zeroed) when a side maps it; anything else was written by a peer that
  // could not wait: check it as any index the peer publishes.
  if (head_ - tail_seen_ > kShmRingDataBytes || head_ % kShmRecordAlign != 0) broken_ = true;
}

ShmProducer::Put ShmProducer::put(const ShmRecord& record, std::span<const iovec> payload,
                                  size_t length) {
  if (broken_) return Put::kBroken;
  const size_t need = record_bytes(length);
  const size_t offset = head_ & kMask;
  const size_t to_end = kShmRingDataBytes - offset;
  // A record that does not fit before the end starts at the beginning: the rest is skipped.
  const size_t take = need <= to_end ? need : to_end + need;
  if (head_ + take - tail_seen_ > kShmRingDataBytes) {
    const uint64_t tail = h_->tail.load(std::memory_order_acquire);
    // The consumer's tail may only have moved forward, and never past what was published.
    if (tail - tail_seen_ > head_ - tail_seen_ || tail % kShmRecordAlign != 0) {
      broken_ = true;
      return Put::kBroken;
    }
    tail_seen_ = tail;
    if (head_ + take - tail_seen_ > kShmRingDataBytes) return Put::kFull;
  }
  uint8_t* at = data_ + offset;
  if (need > to_end) {
    const uint32_t wrap = kShmWrap;
    std::memcpy(at, &wrap, sizeof wrap);  // to_end >= kShmRecordAlign: room for the marker
    head_ += to_end;
    at = data_;
  }
  ShmRecord r = record;
  r.length = static_cast<uint32_t>(length);
  std::memcpy(at, &r, sizeof r);
  at += sizeof r;
  size_t left = length;
  for (const iovec& v : payload) {
    const size_t n = v.iov_len < left ? v.iov_len : left;
    std::memcpy(at, v.iov_base, n);
    at += n;
    left -= n;
  }
  head_ += need;
  dirty_ = true;
  return Put::kOk;
}

bool ShmProducer::publish() {
  if (!dirty_) return false;
  dirty_ = false;
  // seq_cst store, then seq_cst load of `wake`: the consumer's side is the mirror image
  // (ShmConsumer::arm), so one of the two sees the other.
  h_->head.store(head_, std::memory_order_seq_cst);
  if (h_->wake.load(std::memory_order_seq_cst) == 0) return false;
  return h_->wake.exchange(0, std::memory_order_seq_cst) != 0;
}

ShmConsumer::ShmConsumer(ShmRingHeader* header, const uint8_t* data)
    : h_(header),
      data_(data),
      tail_(header->tail.load(std::memory_order_relaxed)),
      head_seen_(tail_) {
  if (tail_ % kShmRecordAlign != 0) broken_ = true;
}

ShmConsumer::Get ShmConsumer::get(ShmRecord* record, std::span<uint8_t> into, size_t* length) {
  if (broken_) return Get::kBroken;
  for (int wraps = 0; wraps < 2; ++wraps) {
    if (tail_ == head_seen_) {
      const uint64_t head = h_->head.load(std::memory_order_acquire);
      // The producer's head may only have moved forward, by at most the ring's size.
      if (head - tail_ > kShmRingDataBytes || head % kShmRecordAlign != 0 ||
          head - head_seen_ > kShmRingDataBytes) {
        broken_ = true;
        return Get::kBroken;
      }
      head_seen_ = head;
      if (tail_ == head_seen_) return Get::kEmpty;
    }
    const size_t offset = tail_ & kMask;
    const size_t to_end = kShmRingDataBytes - offset;
    const uint64_t avail = head_seen_ - tail_;
    // The header is copied out once and only the copy is looked at: the peer may change the
    // ring's bytes while this runs.
    uint32_t first = 0;
    std::memcpy(&first, data_ + offset, sizeof first);
    if (first == kShmWrap) {
      if (avail < to_end) break;
      tail_ += to_end;
      dirty_ = true;
      continue;
    }
    if (to_end < sizeof(ShmRecord) || avail < sizeof(ShmRecord)) break;
    ShmRecord r;
    std::memcpy(&r, data_ + offset, sizeof r);
    if (r.length > kShmMaxPayloadBytes) break;
    const size_t need = record_bytes(r.length);
    if (need > to_end || need > avail) break;
    const size_t n = r.length < into.size() ? r.length : into.size();
    std::memcpy(into.data(), data_ + offset + sizeof r, n);
    *record = r;
    *length = r.length;
    tail_ += need;
    dirty_ = true;
    return Get::kOk;
  }
  broken_ = true;
  return Get::kBroken;
}

void ShmConsumer::release() {
  if (!dirty_) return;
  dirty_ = false;
  h_->tail.store(tail_, std::memory_order_release);
}

bool ShmConsumer::arm() {
  h_->wake.store(1, std::memory_order_seq_cst);
  armed_ = true;
  if (h_->head.load(std::memory_order_seq_cst) == h_->tail.load(std::memory_order_relaxed))
    return true;
  h_->wake.store(0, std::memory_order_relaxed);
  armed_ = false;
  return false;
}

bool ShmConsumer::disarm() {
  if (!armed_) return false;
  armed_ = false;
  return h_->wake.exchange(0, std::memory_order_acq_rel) == 0;
}

bool ShmConsumer::settle_taken() {
  if (!armed_ || h_->wake.load(std::memory_order_acquire) != 0) return false;
  armed_ = false;
  return true;
}

}  // namespace urdma::net
