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

// The first word of the record at `offset`, which says whether it is there (shm_ring.h).
std::atomic_ref<uint32_t> ShmProducer::word_at(size_t offset) {
  return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(data_ + offset));
}

ShmProducer::Put ShmProducer::put(const ShmRecord& record, std::span<const iovec> payload,
                                  size_t length) {
  if (broken_) return Put::kBroken;
  const size_t need = record_bytes(length);
  const size_t offset = head_ & kMask;
  const size_t to_end = kShmRingDataBytes - offset;
  // A record that does not fit before the end starts at the beginning: the rest is skipped.
  // Room too for the word after it, zeroed below.
  const size_t take = (need <= to_end ? need : to_end + need) + kShmRecordAlign;
  if (head_ + take - tail_seen_ > kShmRingDataBytes) {
    const uint64_t tail = h_->tail.load(std::memory_order_acquire);
    // The consumer's tail may only have moved forward, and never past what was written.
    if (tail - tail_seen_ > head_ - tail_seen_ || tail % kShmRecordAlign != 0) {
      broken_ = true;
      return Put::kBroken;
    }
    tail_seen_ = tail;
    if (head_ + take - tail_seen_ > kShmRingDataBytes) return Put::kFull;
  }
  size_t at = offset;
  if (need > to_end) {
    word_at(0).store(0, std::memory_order_relaxed);  // where the consumer looks after the marker
    mark(at, kShmWrap);  // to_end >= 8: room for it
    head_ += to_end;
    at = 0;
  }
  // The header after its first word, then the payload; the word stays 0 meanwhile (zeroed
  // when the record before was written, or by the region's creation).
  uint8_t* const base = data_ + at;
  std::memcpy(base + sizeof(uint32_t), reinterpret_cast<const uint8_t*>(&record) + sizeof(uint32_t),
              sizeof(ShmRecord) - sizeof(uint32_t));
  uint8_t* into = base + sizeof(ShmRecord);
  size_t left = length;
  for (const iovec& v : payload) {
    const size_t n = v.iov_len < left ? v.iov_len : left;
    std::memcpy(into, v.iov_base, n);
    into += n;
    left -= n;
  }
  head_ += need;
  word_at(head_ & kMask).store(0, std::memory_order_relaxed);
  mark(at, kShmWritten | static_cast<uint32_t>(length));
  return Put::kOk;
}

// The first word of a run of put()s waits for publish(): the consumer, stopped there, takes the
// run whole, as a batch, instead of chasing the producer record by record (lines that both
// write and read at once, and a turn a record). The run's later words cannot be reached before
// it, so they are stored at once.
void ShmProducer::mark(size_t offset, uint32_t word) {
  if (dirty_) {
    word_at(offset).store(word, std::memory_order_release);
    return;
  }
  held_at_ = offset;
  held_word_ = word;
  dirty_ = true;
}

bool ShmProducer::publish() {
  if (!dirty_) return false;
  dirty_ = false;
  // The run's first word (seq_cst), then `wake` (seq_cst): the consumer's side is the mirror
  // image (ShmConsumer::arm stores `wake`, then reads that word), so one of the two sees the
  // other. The run's later words cannot be seen before the first.
  word_at(held_at_).store(held_word_, std::memory_order_seq_cst);
  h_->head.store(head_, std::memory_order_release);
  if (h_->wake.load(std::memory_order_seq_cst) == 0) return false;
  return h_->wake.exchange(0, std::memory_order_seq_cst) != 0;
}

ShmConsumer::ShmConsumer(ShmRingHeader* header, const uint8_t* data)
    : h_(header),
      data_(data),
      tail_(header->tail.load(std::memory_order_relaxed)),
      next_(tail_) {
  if (tail_ % kShmRecordAlign != 0) broken_ = true;
}

uint32_t ShmConsumer::word_at(uint64_t position, std::memory_order order) const {
  // Read through an atomic_ref: the producer writes the word from another process.
  const auto* w = reinterpret_cast<const uint32_t*>(data_ + (position & kMask));
  return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(w)).load(order);
}

ShmConsumer::Get ShmConsumer::get(ShmRecord* record, std::span<uint8_t> into, size_t* length) {
  if (broken_) return Get::kBroken;
  // The line after the word's, asked for with it: a run's second record (a reply's ACK) then
  // crosses from the producer's core beside the first instead of after it.
  __builtin_prefetch(data_ + (((tail_ | 63) + 1) & kMask));
  for (int wraps = 0; wraps < 2; ++wraps) {
    const size_t offset = tail_ & kMask;
    const size_t to_end = kShmRingDataBytes - offset;
    // The word is read once and only that copy is looked at, as the header and payload copied
    // out after it: the peer may change the ring's bytes while this runs.
    const uint32_t word = word_at(tail_, std::memory_order_acquire);
    if (word == 0) return Get::kEmpty;
    if (word == kShmWrap) {
      tail_ += to_end;
      next_.store(tail_, std::memory_order_relaxed);
      dirty_ = true;
      continue;
    }
    const uint32_t payload = word & ~kShmWritten;
    if ((word & kShmWritten) == 0 || payload > kShmMaxPayloadBytes) break;
    const size_t need = record_bytes(payload);
    if (need > to_end) break;
    ShmRecord r;
    std::memcpy(&r, data_ + offset, sizeof r);
    r.length = payload;
    const size_t n = payload < into.size() ? payload : into.size();
    std::memcpy(into.data(), data_ + offset + sizeof r, n);
    *record = r;
    *length = payload;
    tail_ += need;
    next_.store(tail_, std::memory_order_relaxed);
    dirty_ = true;
    return Get::kOk;
  }
  broken_ = true;
  return Get::kBroken;
}

bool ShmConsumer::pending() const {
  return word_at(next_.load(std::memory_order_relaxed), std::memory_order_acquire) != 0;
}

void ShmConsumer::release() {
  if (!dirty_) return;
  dirty_ = false;
  h_->tail.store(tail_, std::memory_order_release);
}

bool ShmConsumer::arm() {
  h_->wake.store(1, std::memory_order_seq_cst);
  armed_ = true;
  // seq_cst, after the seq_cst store: the producer's publish() is the mirror image.
  if (word_at(next_.load(std::memory_order_relaxed), std::memory_order_seq_cst) == 0) return true;
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
