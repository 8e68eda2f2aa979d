// The shared-memory ring in a region mapped between PROT_NONE guard pages: records come out as
// they went in (fields, bytes, order) across many wraps; a run of records is taken by its first
// word once published, never what an earlier lap left beyond it; a full ring says so and takes
// more once the consumer gives room back; the wake-up handshake asks for exactly one doorbell
// per sleep; and a peer that scribbles on the consumer's index or on records breaks the ring —
// never a read or write outside the region (the guard pages would fault).
#include "net/shm_ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

namespace urdma::net {
namespace {

// kShmRegionBytes with a PROT_NONE page before and after it.
class GuardedRegion {
 public:
  GuardedRegion() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    total_ = kShmRegionBytes + 2 * page;
    void* all = mmap(nullptr, total_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(all, MAP_FAILED);
    all_ = static_cast<uint8_t*>(all);
    base_ = all_ + page;
    EXPECT_EQ(mprotect(base_, kShmRegionBytes, PROT_READ | PROT_WRITE), 0);
  }
  ~GuardedRegion() { munmap(all_, total_); }
  uint8_t* base() { return base_; }

 private:
  uint8_t* all_ = nullptr;
  uint8_t* base_ = nullptr;
  size_t total_ = 0;
};

ShmRecord record_for(uint16_t port) {
  ShmRecord r{};
  r.src_port = port;
  r.traffic_class = 0x28;
  r.hop_limit = 64;
  for (int i = 0; i < 16; ++i) {
    r.src[i] = static_cast<uint8_t>(i);
    r.dst[i] = static_cast<uint8_t>(0xF0 | i);
  }
  return r;
}

uint32_t fnv(std::span<const uint8_t> b, uint32_t h = 2166136261u) {
  for (uint8_t c : b) h = (h ^ c) * 16777619u;
  return h;
}

TEST(ShmRingTest, RecordsComeOutAsTheyWentInAcrossManyWraps) {
  GuardedRegion region;
  ShmProducer tx(shm_ring_header(region.base(), 0), shm_ring_data(region.base(), 0));
  ShmConsumer rx(shm_ring_header(region.base(), 0), shm_ring_data(region.base(), 0));
  std::mt19937 rng(7);
  std::vector<uint8_t> out(kShmMaxPayloadBytes);
  uint32_t sent_sum = 2166136261u, got_sum = 2166136261u;
  uint64_t sent_bytes = 0, got = 0, sent = 0;
  // Over 4 times the ring's size, in records of 0 .. 9000 bytes gathered from three pieces.
  while (sent_bytes < 4 * kShmRingDataBytes) {
    std::vector<uint8_t> payload(rng() % 9001);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    const size_t cut1 = payload.size() / 3, cut2 = payload.size() * 2 / 3;
    const iovec iov[3] = {{payload.data(), cut1},
                          {payload.data() + cut1, cut2 - cut1},
                          {payload.data() + cut2, payload.size() - cut2}};
    ShmProducer::Put put;
    while ((put = tx.put(record_for(static_cast<uint16_t>(sent)), iov, payload.size())) ==
           ShmProducer::Put::kFull) {
      tx.publish();
      ShmRecord r;
      size_t len = 0;
      ASSERT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kOk);
      EXPECT_EQ(r.src_port, static_cast<uint16_t>(got));
      EXPECT_EQ(r.hop_limit, 64);
      EXPECT_EQ(r.dst[3], 0xF3);
      got_sum = fnv({out.data(), len}, got_sum);
      ++got;
      rx.release();
    }
    ASSERT_EQ(put, ShmProducer::Put::kOk);
    sent_sum = fnv(payload, sent_sum);
    sent_bytes += payload.size();
    ++sent;
  }
  tx.publish();
  for (;;) {
    ShmRecord r;
    size_t len = 0;
    const ShmConsumer::Get g = rx.get(&r, out, &len);
    if (g == ShmConsumer::Get::kEmpty) break;
    ASSERT_EQ(g, ShmConsumer::Get::kOk);
    EXPECT_EQ(r.src_port, static_cast<uint16_t>(got));
    got_sum = fnv({out.data(), len}, got_sum);
    ++got;
  }
  rx.release();
  EXPECT_EQ(got, sent);
  EXPECT_EQ(got_sum, sent_sum);
  EXPECT_FALSE(tx.broken());
  EXPECT_FALSE(rx.broken());
}

TEST(ShmRingTest, AFullRingTakesMoreOnceTheConsumerGivesRoomBack) {
  GuardedRegion region;
  ShmProducer tx(shm_ring_header(region.base(), 1), shm_ring_data(region.base(), 1));
  ShmConsumer rx(shm_ring_header(region.base(), 1), shm_ring_data(region.base(), 1));
  // 4056 + 40 bytes of header: 4096 bytes a record.
  std::vector<uint8_t> payload(4056, 0xAB);
  const iovec iov{payload.data(), payload.size()};
  size_t n = 0;
  while (tx.put(record_for(1), {&iov, 1}, payload.size()) == ShmProducer::Put::kOk) ++n;
  // One fewer than the area holds: the word after the last record needs room too.
  EXPECT_EQ(n, kShmRingDataBytes / 4096 - 1);
  EXPECT_EQ(tx.put(record_for(1), {&iov, 1}, payload.size()), ShmProducer::Put::kFull);
  tx.publish();
  std::vector<uint8_t> out(100);  // shorter than the payload: truncated, length told
  ShmRecord r;
  size_t len = 0;
  ASSERT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kOk);
  EXPECT_EQ(len, 4056u);
  EXPECT_EQ(out[99], 0xAB);
  // Not given back yet: still full.
  EXPECT_EQ(tx.put(record_for(1), {&iov, 1}, payload.size()), ShmProducer::Put::kFull);
  rx.release();
  EXPECT_EQ(tx.put(record_for(1), {&iov, 1}, payload.size()), ShmProducer::Put::kOk);
}

TEST(ShmRingTest, ASleepingConsumerIsRungOncePerSleepAndAPollingOneNever) {
  GuardedRegion region;
  ShmProducer tx(shm_ring_header(region.base(), 0), shm_ring_data(region.base(), 0));
  ShmConsumer rx(shm_ring_header(region.base(), 0), shm_ring_data(region.base(), 0));
  const uint8_t byte = 1;
  const iovec iov{const_cast<uint8_t*>(&byte), 1};
  // Polling (never armed): no doorbell.
  ASSERT_EQ(tx.put(record_for(1), {&iov, 1}, 1), ShmProducer::Put::kOk);
  EXPECT_FALSE(tx.publish());
  EXPECT_TRUE(rx.pending());
  // Records wait: arming says do not sleep.
  EXPECT_FALSE(rx.arm());
  std::vector<uint8_t> out(16);
  ShmRecord r;
  size_t len = 0;
  ASSERT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kOk);
  rx.release();
  EXPECT_FALSE(rx.pending());
  // Asleep: the first publish rings, the second does not (the flag was taken).
  EXPECT_TRUE(rx.arm());
  ASSERT_EQ(tx.put(record_for(2), {&iov, 1}, 1), ShmProducer::Put::kOk);
  EXPECT_TRUE(tx.publish());
  ASSERT_EQ(tx.put(record_for(3), {&iov, 1}, 1), ShmProducer::Put::kOk);
  EXPECT_FALSE(tx.publish());
  // Disarmed: none.
  EXPECT_FALSE(rx.arm());  // two records wait
  rx.disarm();
  ASSERT_EQ(tx.put(record_for(4), {&iov, 1}, 1), ShmProducer::Put::kOk);
  EXPECT_FALSE(tx.publish());
  // Nothing new since the last publish: nothing to ring.
  EXPECT_FALSE(tx.publish());
}

TEST(ShmRingTest, ARunIsTakenByItsFirstWordAfterPublishAndNothingBeyondItsLast) {
  GuardedRegion region;
  ShmRingHeader* h = shm_ring_header(region.base(), 0);
  uint8_t* data = shm_ring_data(region.base(), 0);
  // What an earlier lap left past the first record: words that read as written records.
  for (size_t at = 8; at < kShmRingDataBytes; at += 8) {
    const uint32_t stale = kShmWritten | 8;
    std::memcpy(data + at, &stale, sizeof stale);
  }
  ShmProducer tx(h, data);
  ShmConsumer rx(h, data);
  std::vector<uint8_t> out(64);
  ShmRecord r;
  size_t len = 0;
  EXPECT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kEmpty);
  EXPECT_FALSE(rx.pending());
  for (uint8_t i = 1; i <= 3; ++i) {
    const iovec iov{&i, 1};
    ASSERT_EQ(tx.put(record_for(i), {&iov, 1}, 1), ShmProducer::Put::kOk);
  }
  // Not published: the run's first word still waits, so nothing is taken.
  EXPECT_FALSE(rx.pending());
  EXPECT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kEmpty);
  EXPECT_FALSE(tx.publish());
  // The producer's index scribbled back to 0: the consumer does not read it.
  h->head.store(0);
  EXPECT_TRUE(rx.pending());
  for (uint8_t i = 1; i <= 3; ++i) {
    ASSERT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kOk);
    EXPECT_EQ(r.src_port, i);
    EXPECT_EQ(len, 1u);
    EXPECT_EQ(out[0], i);
  }
  EXPECT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kEmpty);
  EXPECT_FALSE(rx.pending());
  EXPECT_FALSE(rx.broken());
}

TEST(ShmRingTest, ScribblesBreakTheRingOnBothSidesAndAScribbledHeadIsNotRead) {
  {
    GuardedRegion region;
    ShmRingHeader* h = shm_ring_header(region.base(), 0);
    ShmConsumer rx(h, shm_ring_data(region.base(), 0));
    h->head.store(kShmRingDataBytes + 8);  // more than the ring holds: nobody reads it
    std::vector<uint8_t> out(16);
    ShmRecord r;
    size_t len = 0;
    EXPECT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kEmpty);
    EXPECT_FALSE(rx.pending());
    EXPECT_FALSE(rx.broken());
  }
  {
    GuardedRegion region;
    ShmRingHeader* h = shm_ring_header(region.base(), 0);
    ShmProducer tx(h, shm_ring_data(region.base(), 0));
    std::vector<uint8_t> payload(60000);
    const iovec iov{payload.data(), payload.size()};
    while (tx.put(record_for(1), {&iov, 1}, payload.size()) == ShmProducer::Put::kOk) {
    }
    h->tail.store(uint64_t{1} << 40);  // past everything written
    EXPECT_EQ(tx.put(record_for(1), {&iov, 1}, payload.size()), ShmProducer::Put::kBroken);
    EXPECT_TRUE(tx.broken());
  }
  // Records no producer writes: a word without kShmWritten, more than a UDP payload, more than
  // fits before the end of the area (a consumer whose next record is the area's last 64 bytes).
  const uint32_t words[] = {1000, kShmWritten | 70000, kShmWritten | 1000};
  for (const uint32_t word : words) {
    GuardedRegion region;
    ShmRingHeader* h = shm_ring_header(region.base(), 0);
    uint8_t* data = shm_ring_data(region.base(), 0);
    const size_t at = word == (kShmWritten | 1000) ? kShmRingDataBytes - 64 : 0;
    h->tail.store(at);
    ShmConsumer rx(h, data);
    ShmRecord big = record_for(1);
    std::memcpy(data + at, &big, sizeof big);
    std::memcpy(data + at, &word, sizeof word);
    std::vector<uint8_t> out(2000);
    ShmRecord r;
    size_t len = 0;
    EXPECT_EQ(rx.get(&r, out, &len), ShmConsumer::Get::kBroken) << std::hex << word;
    EXPECT_TRUE(rx.broken());
  }
}

// Random bytes over the header and the data while records flow: the consumer returns records
// of at most a UDP payload, breaks at worst, and never touches a guard page.
TEST(ShmRingTest, RandomScribblesNeverReachOutsideTheRegion) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    GuardedRegion region;
    ShmRingHeader* h = shm_ring_header(region.base(), 0);
    uint8_t* data = shm_ring_data(region.base(), 0);
    ShmProducer tx(h, data);
    ShmConsumer rx(h, data);
    std::vector<uint8_t> payload(rng() % 5000);
    const iovec iov{payload.data(), payload.size()};
    std::vector<uint8_t> out(kShmMaxPayloadBytes);
    for (int step = 0; step < 200 && !rx.broken(); ++step) {
      tx.put(record_for(1), {&iov, 1}, payload.size());
      tx.publish();
      switch (rng() % 4) {
        case 0:
          h->head.store(h->head.load() + (rng() % 64) * 8);
          break;
        case 1:
          h->tail.store(rng() % 3 == 0 ? rng() : h->tail.load() + 8);
          break;
        default:
          for (int i = 0; i < 8; ++i) data[rng() % kShmRingDataBytes] = static_cast<uint8_t>(rng());
      }
      ShmRecord r;
      size_t len = 0;
      const ShmConsumer::Get g = rx.get(&r, out, &len);
      if (g == ShmConsumer::Get::kOk) {
        EXPECT_LE(len, kShmMaxPayloadBytes);
      }
      rx.release();
    }
  }
}

}  // namespace
}  // namespace urdma::net
