// The shared-memory rings two urdma processes of one host exchange RoCEv2 datagrams through
// (net/shm_packet_io.h routes to them; urdmad sets them up: daemon/protocol.h, kShmConnect).
//
// A REGION is one sealed memfd that urdmad makes for a pair of slots: two rings, one per
// direction. Side 0 (the slot that asked) writes ring 0 and reads ring 1; side 1 the other way.
//
//   [ring 0 header, 4 KiB][ring 0 data, kShmRingDataBytes][ring 1 header][ring 1 data]
//
// Each ring is single-producer, single-consumer (liburing's SQ/CQ rings are the model): the
// producer owns `head`, the consumer owns `tail`, both count bytes since the start and only
// grow; (position & (kShmRingDataBytes - 1)) is where a byte lives. A record is a ShmRecord
// header followed by the UDP payload, padded to 8 bytes; a record never wraps: when it does not
// fit before the end of the data area, the producer writes kShmWrap there and the record starts
// at the beginning.
//
// A RECORD SAYS IT IS THERE. Its first word (ShmRecord::length) is 0 until the record is whole,
// then kShmWritten | payload bytes (or kShmWrap), stored last with release. The producer zeroes
// the word after a record before it marks that record written, so the word where the consumer
// looks next is 0 until the producer finishes what goes there; the first word of a run of
// records waits for publish(), so the consumer takes the run whole. The consumer polls that
// word, on the line the record's bytes share, and never the producer's index: a record crosses
// from core to core as one cache line, not as the index's line and then the record's. `head` is
// published for the wake-up handshake's order and for observers only.
//
// NOTHING IN THE REGION IS TRUSTED. The peer maps the same pages and may write any byte at any
// time (a bug, a dying process, a hostile one of the same user). So:
//  * each side keeps its own index in private memory and only publishes it; the producer reads
//    the consumer's when it needs room and checks it (0 <= head - tail <= capacity) before use,
//    and the consumer reads no index of the producer's: a scribbled `head` changes nothing;
//  * a record header is copied out before it is checked, and the payload copied out before the
//    engine parses it: a scribble can only make a bad packet, dropped and counted as any;
//  * every write stays inside this process's mapping of the data area, by construction;
//  * a ring whose indices or records make no sense is broken: it is not used again (counted),
//    and the RC timers end the peer's connections as a vanished wire peer's.
// The memfd is sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
// before either side maps it, so no peer can truncate it under the other's feet (SIGBUS).
//
// WAKE-UP: the consumer, about to sleep, stores `wake` = 1 (seq_cst) and reads the word where its
// next record goes; the producer marks its records written, the run's first word last (seq_cst),
// and, if it then reads `wake` == 1, swaps it to 0 and writes the consumer's doorbell (an eventfd
// urdmad made for the consumer's slot). One side sees the other:
// a datagram is never left unnoticed by a sleeping consumer, and a polling one costs the
// producer no syscall (the runtime's own doorbell is the same handshake: runtime.h). A request
// the producer took is a `wake` of 0 that the consumer still counts armed (settle_taken): only
// then was the doorbell written, and only then need the consumer read it.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace urdma::net {

inline constexpr size_t kShmRingHeaderBytes = 4096;
inline constexpr size_t kShmRingDataBytes = size_t{4} << 20;  // a power of two
inline constexpr size_t kShmRingBytes = kShmRingHeaderBytes + kShmRingDataBytes;
// The memfd's size: two rings.
inline constexpr size_t kShmRegionBytes = 2 * kShmRingBytes;
static_assert((kShmRingDataBytes & (kShmRingDataBytes - 1)) == 0);

// The header page of one ring; the three fields on cache lines of their own.
struct ShmRingHeader {
  alignas(64) std::atomic<uint64_t> head;  // producer: bytes published
  alignas(64) std::atomic<uint64_t> tail;  // consumer: bytes consumed
  alignas(64) std::atomic<uint32_t> wake;  // consumer: 1 = asleep, write the doorbell
};
static_assert(sizeof(ShmRingHeader) <= kShmRingHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// One record's header, 8-byte aligned in the data area. Addresses as net::Address stores them
// (16 bytes, IPv4 as IPv4-mapped).
struct ShmRecord {
  // 0: not written yet; kShmWritten | the UDP payload bytes that follow; kShmWrap: the rest of
  // the area is unused. put() sets it; get() hands back the payload bytes alone.
  uint32_t length;
  uint16_t src_port;
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint8_t src[16];
  uint8_t dst[16];
};
static_assert(sizeof(ShmRecord) == 40);
inline constexpr uint32_t kShmWrap = 0xFFFFFFFF;
inline constexpr uint32_t kShmWritten = 0x80000000;
inline constexpr size_t kShmRecordAlign = 8;
// The largest payload a record carries (a UDP payload's limit, packet_io.h's
// kMaxUdpPayloadBytes); a record claiming more is a scribble.
inline constexpr size_t kShmMaxPayloadBytes = 65'507;

// Ring `i` of a region mapped at `base`.
inline ShmRingHeader* shm_ring_header(void* base, unsigned i) {
  return static_cast<ShmRingHeader*>(
      static_cast<void*>(static_cast<uint8_t*>(base) + i * kShmRingBytes));
}
inline uint8_t* shm_ring_data(void* base, unsigned i) {
  return static_cast<uint8_t*>(base) + i * kShmRingBytes + kShmRingHeaderBytes;
}

// The producer's view of one ring. Not thread-safe: one thread at a time (the engine's).
class ShmProducer {
 public:
  ShmProducer(ShmRingHeader* header, uint8_t* data);

  enum class Put : uint8_t {
    kOk,      // written; visible to the consumer after publish()
    kFull,    // no room now (the consumer is behind); nothing written
    kBroken,  // the consumer's index makes no sense: the ring is not used again
  };
  // Writes one record: `record` (its length field is set here) and `length` payload bytes
  // gathered from `payload`; the consumer takes it after the next publish().
  // length <= kShmMaxPayloadBytes.
  Put put(const ShmRecord& record, std::span<const iovec> payload, size_t length);
  // Lets the consumer take what put() wrote since the last publish. True when the consumer
  // sleeps and its doorbell must be written (the flag is taken: one write per sleep).
  bool publish();
  bool broken() const { return broken_; }

 private:
  std::atomic_ref<uint32_t> word_at(size_t offset);
  void mark(size_t offset, uint32_t word);

  ShmRingHeader* const h_;
  uint8_t* const data_;
  uint64_t head_;        // private; published to h_->head
  uint64_t tail_seen_;   // the consumer's tail when last read
  bool dirty_ = false;   // written since the last publish
  // The first word of the run since the last publish, stored by the next (mark).
  size_t held_at_ = 0;
  uint32_t held_word_ = 0;
  bool broken_ = false;
};

// The consumer's view of one ring. get() and release() are one thread's at a time (the
// engine's); arm(), disarm() and settle_taken() touch the shared header and armed_, and may run
// on any thread, one at a time (ShmPacketIo calls them under its lock).
class ShmConsumer {
 public:
  ShmConsumer(ShmRingHeader* header, const uint8_t* data);

  enum class Get : uint8_t { kEmpty, kOk, kBroken };
  // Copies the next record out: its header into *record, its payload into `into` (at most
  // into.size() bytes; *length is the payload's full length, so a longer one is truncated).
  Get get(ShmRecord* record, std::span<uint8_t> into, size_t* length);
  // Gives what get() copied out back to the producer.
  void release();
  bool broken() const { return broken_; }

  // Before the consumer sleeps: asks for the doorbell. False when records wait already (the
  // request is withdrawn — the producer may have taken it already and write the doorbell
  // anyway: do not sleep).
  bool arm();
  // Awake again: the producer need not write the doorbell. Whether it had taken the request
  // (the doorbell was written, or is about to be).
  bool disarm();
  // The request stands no more because the producer took it: its doorbell write came or comes.
  // Counted once: the ring is unarmed from then on, until arm().
  bool settle_taken();
  bool armed() const { return armed_; }
  // Whether a record waits (any thread): the word where the next one goes. A ring that broke
  // may say so for ever: its user stops asking (ShmPacketIo's `dropping`).
  bool pending() const;

 private:
  uint32_t word_at(uint64_t position, std::memory_order order) const;

  ShmRingHeader* const h_;
  const uint8_t* const data_;
  uint64_t tail_;  // private; published to h_->tail by release()
  // tail_ for other threads (pending, arm): private memory, not the peer's to scribble.
  std::atomic<uint64_t> next_;
  bool dirty_ = false;
  bool broken_ = false;
  bool armed_ = false;  // arm() asked for the doorbell and nothing took the request back since
};

}  // namespace urdma::net
