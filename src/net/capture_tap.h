// What `urdma capture` sees: a PacketIo decorator that, while somebody captures, writes a record
// of every datagram the process sends and receives to the capturer's socket.
//
// The capturer (`urdma capture`) makes a SOCK_SEQPACKET socket pair and hands one end to urdmad,
// which passes it to every slot holder the capturer may see (daemon/protocol.h, kCapture); the
// process's daemon client gives it to set_sink(). From then on each datagram that leaves or
// arrives on the slot socket costs one sendmsg of a CaptureRecord and the datagram's bytes (no
// copy: the record and the datagram's own iovecs). Nobody capturing costs one load and a test
// per batch.
//
// Where it sits: directly on the socket I/O, under the fault profile (URDMA_FAULTS), so it
// records what crossed the socket — a datagram the profile dropped was never sent.
//
// Several captures may run at once (kMaxCaptureSinks): each record goes to every sink. A sink is
// its capturer's: a full socket (it reads too slowly) drops the record, counted in the next one
// that goes through (CaptureRecord::dropped_before); any other failure (the capturer closed its
// end) ends that capture in this process. Records are never retried and the I/O's own results
// never depend on the sinks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "net/packet_io.h"

namespace urdma::net {

inline constexpr uint32_t kCaptureRecordMagic = 0x75724350;  // "urCP"
inline constexpr uint16_t kCaptureRecordVersion = 1;

enum class CaptureDirection : uint8_t { kSent = 0, kReceived = 1 };

// One record on the capture socket: this header, then the UDP payload (BTH through ICRC), all in
// one SEQPACKET record. Host-endian: both ends run on the same host.
struct CaptureRecord {
  uint32_t magic;
  uint16_t version;
  uint8_t direction;  // CaptureDirection. A sent IPv4 datagram left with ID 0 (DF set); a
                      // received one's ID a socket never sees: the reader solves it from the ICRC
  uint8_t truncated;  // 1: the datagram was longer than the receive buffer
  uint64_t timestamp_ns;  // CLOCK_REALTIME
  uint8_t src_address[16];  // IPv6 or IPv4-mapped, as net::Address
  uint8_t dst_address[16];
  uint16_t src_port;
  uint16_t dst_port;
  uint8_t traffic_class;  // sent: what the datagram asked for (0: the socket's default)
  uint8_t hop_limit;      // sent: likewise; received: 0 (not reported by the socket)
  uint16_t reserved;
  uint32_t pid;             // the process
  uint32_t slot;            // its urdmad slot
  uint32_t dropped_before;  // records this process could not deliver since its previous one
  uint32_t length;          // UDP payload bytes that follow
};
static_assert(sizeof(CaptureRecord) == 72);

// A record's header for one datagram (magic, version, time now, the fields given; slot and
// dropped_before 0).
CaptureRecord make_capture_record(CaptureDirection direction, const Endpoint& src,
                                  const Endpoint& dst, uint8_t traffic_class, uint8_t hop_limit,
                                  uint32_t pid, size_t length, bool truncated);
// Writes `header` and the datagram (at most kMaxTxIov pieces) as one record, without blocking
// and without SIGPIPE: 0, or the errno (EAGAIN/ENOBUFS: the socket is full).
int write_capture_record(int fd, const CaptureRecord& header, std::span<const iovec> payload);

struct CaptureTapCounters {
  uint64_t records = 0;  // written to a sink
  uint64_t dropped = 0;  // a sink's socket was full, or the datagram was rejected
  uint64_t sinks = 0;    // sinks taken (add_sink)
  uint64_t ended = 0;    // sinks dropped because writing failed otherwise (capturer gone)
  uint64_t refused = 0;  // sinks beyond kMaxCaptureSinks, closed at once
};

// Captures of one process at once.
inline constexpr size_t kMaxCaptureSinks = 8;

class CaptureTap final : public PacketIo {
 public:
  CaptureTap(std::unique_ptr<PacketIo> inner, uint32_t pid);
  ~CaptureTap() override;
  CaptureTap(const CaptureTap&) = delete;
  CaptureTap& operator=(const CaptureTap&) = delete;

  // Any thread: from the next send or receive on, records also go to `fd` (a connected
  // SOCK_SEQPACKET socket, adopted: this I/O closes it), for slot `slot`. A sink ends when its
  // capturer closes the other end: at its next write, or when sinks are added (a hang-up frees
  // the place before the new sinks take theirs).
  void add_sink(int fd, uint32_t slot);

  uint16_t source_port(uint16_t wanted) const override { return inner_->source_port(wanted); }
  // Records carry the ICRC an unsealed datagram would have had (write()).
  bool icrc_needed(const Endpoint& dst, uint32_t dest_qp) override {
    return inner_->icrc_needed(dst, dest_qp);
  }
  TxStatus send(const TxDatagram& d) override;
  size_t send_batch(std::span<const TxDatagram> batch) override;
  size_t recv_batch(std::span<RxDatagram> batch) override;
  int readable_fd() const override { return inner_->readable_fd(); }
  size_t rx_buffer_bytes() const override { return inner_->rx_buffer_bytes(); }
  IoCounters counters() const override { return inner_->counters(); }
  uint64_t next_deadline_ns() const override { return inner_->next_deadline_ns(); }
  bool arm_wakeup() override { return inner_->arm_wakeup(); }
  void disarm_wakeup(bool readable) override { inner_->disarm_wakeup(readable); }
  void rearm_wakeup() override { inner_->rearm_wakeup(); }
  bool rx_pending() override { return inner_->rx_pending(); }
  void watch_writable(bool on) override { inner_->watch_writable(on); }

  // Read by the thread that sends and receives (tests).
  const CaptureTapCounters& tap_counters() const { return tap_; }
  size_t sinks() const { return sinks_.size(); }
  bool capturing() const { return !sinks_.empty(); }

 private:
  struct Sink {
    int fd;
    uint32_t slot;
    uint32_t dropped_since;  // records this sink missed since its last one
  };
  // True when records are to be written (takes the sinks add_sink handed over first).
  bool on() {
    if (changed_.load(std::memory_order_acquire)) [[unlikely]]
      take_changes();
    return !sinks_.empty();
  }
  void take_changes();
  // One datagram to every sink (a sink that fails for good is closed and removed).
  void write(CaptureDirection direction, const Endpoint& src, const Endpoint& dst,
             uint8_t traffic_class, uint8_t hop_limit, std::span<const iovec> payload,
             bool truncated);
  void record_sent(std::span<const TxDatagram> sent);
  void count_dropped(size_t n);

  std::unique_ptr<PacketIo> inner_;
  const uint32_t pid_;
  // Handed over by other threads, taken by the I/O's thread.
  std::atomic<bool> changed_{false};
  std::mutex mu_;
  std::vector<Sink> added_;  // under mu_
  // The I/O thread's.
  std::vector<Sink> sinks_;
  std::vector<uint8_t> sealed_;  // the I/O thread's: an unsealed datagram's record, sealed
  CaptureTapCounters tap_;
};

}  // namespace urdma::net
