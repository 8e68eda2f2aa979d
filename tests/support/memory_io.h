// An in-memory net::PacketIo: the one fake wire of the engine tests, the engine fuzz target and
// the engine benchmark.
//
// What a test, the fuzzer and the benchmark each need of it, all in one class:
//  * inbound: a FIFO of datagrams (deliver()) that recv_batch() copies into the engine's
//    buffers, as recvmsg does — with the truncation a too-small buffer causes;
//  * outbound, one of two ways:
//      - recorded (the default): every datagram kept whole in `sent`, with the gather list as
//        the engine handed it over (the pointers are valid only during send(); they are kept to
//        compare against registered memory, as tests/unit/engine/zero_copy_test.cc does);
//      - linked to a peer MemoryIo (link()): the datagram is copied into the peer's inbound FIFO,
//        the copy a socket's sendmsg makes, and recv_batch() makes the second copy on the other
//        side — two engines back to back, as the benchmark runs them;
//  * an observer (on_send) called while the iovecs are still valid, e.g. for a fuzz oracle;
//  * the IoCounters every PacketIo keeps.
// Frames are recycled (LIFO) with their storage, so in the linked mode a steady flow allocates
// nothing per packet: the benchmark measures the engine, not the fake.
//
// No delay, loss, duplication or reordering: that is net::SimNetwork's job. Not thread-safe
// (like every PacketIo, it belongs to the engine thread).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "net/packet_io.h"

namespace urdma::test {

class MemoryIo final : public net::PacketIo {
 public:
  // One datagram the engine sent, as recorded.
  struct Sent {
    std::vector<uint8_t> bytes;  // the UDP payload, gathered
    net::Endpoint dst;
    net::Address src;
    uint16_t src_port = 0;
    // The gather list as handed over: its pointers were valid only during send(); kept to
    // compare addresses (zero-copy checks), never to read through.
    std::vector<iovec> iov;
    size_t unread = 0;  // inbound datagrams queued and not yet read when this one left
    // Which call to send() or send_batch() carried it, counted from 1: datagrams with the same
    // number left in one syscall (one sendmmsg) on a real socket.
    size_t call = 0;
  };

  MemoryIo() = default;
  MemoryIo(const MemoryIo&) = delete;
  MemoryIo& operator=(const MemoryIo&) = delete;

  // From now on, what this side sends goes into `peer`'s inbound queue (not recorded). Link
  // both sides for a two-way wire.
  void link(MemoryIo& peer) { peer_ = &peer; }
  // Record outbound datagrams in `sent` (when not linked). On by default; the fuzzer, which
  // checks each datagram in on_send, turns it off so a long input does not pile them up.
  void set_recording(bool on) { record_ = on; }

  // Queues one inbound datagram: recv_batch() will hand it over as sent from `src` to `dst`.
  void deliver(std::span<const uint8_t> bytes, const net::Endpoint& src, const net::Endpoint& dst);
  size_t pending() const { return count_; }

  // net::PacketIo.
  // As a shared-memory ring (`as_ring`): what it sends goes unsealed, and what it receives is
  // marked via_ring (net/packet_io.h).
  bool icrc_needed(const net::Endpoint&, uint32_t) override { return !as_ring; }
  net::TxStatus send(const net::TxDatagram& d) override;
  size_t send_batch(std::span<const net::TxDatagram> batch) override;
  size_t recv_batch(std::span<net::RxDatagram> batch) override;
  int readable_fd() const override { return -1; }
  net::IoCounters counters() const override { return counters_; }

  bool as_ring = false;
  // What was sent (recording mode), oldest first. Tests may clear it.
  std::vector<Sent> sent;
  // Called for every datagram send() accepts, while its iovecs are valid, with its bytes.
  std::function<void(const net::TxDatagram&, std::span<const uint8_t>)> on_send;

  // Most frames ever held at once in the inbound queue (the benchmark reports it).
  size_t high_water() const { return pool_.size(); }

 private:
  struct Frame {
    net::Endpoint src;
    net::Endpoint dst;
    size_t length = 0;
    std::vector<uint8_t> storage;  // size() >= length; grows, never shrinks (recycled)
  };
  Frame& push_frame(size_t length);
  net::TxStatus send_one(const net::TxDatagram& d);
  void grow_ring();

  MemoryIo* peer_ = nullptr;
  bool record_ = true;
  net::IoCounters counters_;
  size_t calls_ = 0;  // send() and send_batch() calls so far (Sent::call)
  // The inbound FIFO: a power-of-two ring of frame pointers over a pool of frames, recycled
  // LIFO so a shallow queue reuses cache-hot memory; it grows (never drops) when a requester
  // bursts a long message.
  std::vector<Frame*> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
  std::vector<Frame*> free_;
  std::vector<std::unique_ptr<Frame>> pool_;
};

}  // namespace urdma::test
