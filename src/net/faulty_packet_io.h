// Faults on real sockets: a PacketIo decorator that loses, duplicates, reorders, delays and
// corrupts the datagrams sent through it, seeded, so process tests can prove RC recovery over
// real UDP (and a developer can reproduce a lossy network on a laptop). Set by URDMA_FAULTS
// (packet_io_env.h; README "Faults on real sockets").
//
// The faults are FaultModel's (fault_model.h, the model the simulated network uses too): for a
// seed the same sequence of sends meets the same faults. A reordered copy is held back until
// 1..reorder_depth later datagrams have been sent, or reorder_max_ns, whichever comes first.
// Faults apply on the send side only; received datagrams pass untouched (run both peers with a
// profile for both ways).
//
// Held-back datagrams (delayed or reordered) are copies in a bounded queue (held_max; when it
// is full the earliest due is sent early — lost if the inner I/O would block — and counted), sent
// by the next send/send_batch/recv_batch call at or after their time — the engine polls regularly;
// a thread that sleeps wakes by next_deadline_ns() (PacketIo's, so the runtime needs no cast) —
// or, at the latest, when the decorator is destroyed (the device closed: what was in flight on a
// link still arrives after its sender is gone). A
// datagram that passes with no fault goes to the inner I/O as it came (its iovecs, no copy). With
// faults on, send_batch sends one datagram per inner send: this is a testing tool, not the fast
// path (URDMA_FAULTS unset means no decorator at all).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/clock.h"
#include "net/fault_model.h"
#include "net/packet_io.h"

namespace urdma::net {

// Bounds of a profile: delays up to 10 s, a held queue up to 65536 datagrams.
inline constexpr uint64_t kMaxFaultDelayNs = 10'000'000'000;
inline constexpr size_t kMaxFaultHeld = 65'536;
inline constexpr uint32_t kMaxReorderDepth = 1'024;

// The fault rates (fault_model.h) and what FaultyPacketIo needs besides.
struct FaultProfile : FaultRates {
  uint64_t seed = 0;
  // A reordered copy waits until uniform [1, reorder_depth] later datagrams have been sent, or
  // until reorder_max_ns after its delay, whichever comes first.
  uint32_t reorder_depth = 3;
  uint64_t reorder_max_ns = 1'000'000;
  // Most datagrams held back at once.
  size_t held_max = 1'024;

  friend bool operator==(const FaultProfile&, const FaultProfile&) = default;
};

// Parses the URDMA_FAULTS syntax: comma-separated key=value, every key optional, e.g.
//   "seed=1,loss=10000,dup=1000,reorder=10000,delay_us=0-200,corrupt=100"
// Keys: seed (u64); loss, dup, reorder, corrupt (ppm, 0..1000000); delay_us (N or MIN-MAX);
// reorder_depth (1..1024); reorder_max_us; held_max (1..65536). Anything else — an unknown or
// repeated key, a missing '=', a number that does not parse or is out of range — is an error:
// nullopt with a message naming the offending item in *error.
std::optional<FaultProfile> parse_fault_profile(std::string_view text, std::string* error);
// The profile in the syntax above (every key), for logs.
std::string to_string(const FaultProfile& p);

struct FaultCounters {
  uint64_t offered = 0;  // datagrams given to send/send_batch and accepted
  uint64_t dropped_loss = 0;
  uint64_t duplicated = 0;
  uint64_t delayed = 0;  // copies held back for a delay > 0 (reordered ones not included)
  uint64_t reordered = 0;
  uint64_t corrupted = 0;
  uint64_t held_overflow = 0;   // held copies sent early because the queue was full
  uint64_t release_failed = 0;  // held copies the inner I/O rejected, or a duplicate that would
                                // have blocked (lost, like on a wire)

  friend bool operator==(const FaultCounters&, const FaultCounters&) = default;
};

class FaultyPacketIo final : public PacketIo {
 public:
  // The profile is checked (probabilities <= 1e6 ppm, delay_min <= delay_max, bounds).
  FaultyPacketIo(std::unique_ptr<PacketIo> inner, const Clock& clock, const FaultProfile& profile);
  ~FaultyPacketIo() override;
  FaultyPacketIo(const FaultyPacketIo&) = delete;
  FaultyPacketIo& operator=(const FaultyPacketIo&) = delete;

  TxStatus send(const TxDatagram& d) override;
  size_t send_batch(std::span<const TxDatagram> batch) override;
  size_t recv_batch(std::span<RxDatagram> batch) override;
  int readable_fd() const override { return inner_->readable_fd(); }
  size_t rx_buffer_bytes() const override { return inner_->rx_buffer_bytes(); }
  // What really left: the inner I/O's counters.
  IoCounters counters() const override { return inner_->counters(); }
  uint16_t source_port(uint16_t wanted) const override { return inner_->source_port(wanted); }
  // A profile that corrupts needs every ICRC: the receiver finds the flipped bit by it.
  bool icrc_needed(const Endpoint& dst, uint32_t dest_qp) override {
    return profile_.corrupt_ppm != 0 || inner_->icrc_needed(dst, dest_qp);
  }

  // Sends every held-back datagram whose time has come (also done by every call above).
  void release_due();
  // When the earliest held-back datagram is due by time (or the inner I/O's deadline; kNever if
  // none).
  uint64_t next_deadline_ns() const override;
  bool arm_wakeup() override { return inner_->arm_wakeup(); }
  void disarm_wakeup(bool readable) override { inner_->disarm_wakeup(readable); }
  void rearm_wakeup() override { inner_->rearm_wakeup(); }
  bool rx_pending() override { return inner_->rx_pending(); }
  void watch_writable(bool on) override { inner_->watch_writable(on); }
  size_t held() const { return held_.size(); }
  const FaultCounters& fault_counters() const { return faults_; }
  const FaultProfile& profile() const { return profile_; }
  PacketIo& inner() { return *inner_; }

 private:
  struct Held {
    uint64_t release_ns = kNever;
    uint64_t release_seq = ~uint64_t{0};  // released once this many datagrams were offered
    uint64_t order = 0;
    Endpoint dst;
    uint16_t src_port = 0;
    Address src;
    uint8_t traffic_class = 0;
    uint8_t hop_limit = 0;
    std::vector<uint8_t> bytes;
    // Release order: by due time, then by the order they were held.
    static bool due_before(const Held& a, const Held& b) {
      return a.release_ns != b.release_ns ? a.release_ns < b.release_ns : a.order < b.order;
    }
  };

  // Sends one held copy; false if the inner I/O would block (it stays held).
  bool send_held(Held& h);
  // Releases held copies due at `now`; with `all`, the earliest one whatever its time.
  void release(uint64_t now, bool earliest_only);
  void hold(Held&& h);

  std::unique_ptr<PacketIo> inner_;
  const Clock& clock_;
  FaultProfile profile_;
  FaultModel model_;
  std::vector<Held> held_;  // unordered; bounded by profile_.held_max
  uint64_t seq_ = 0;        // datagrams offered so far
  uint64_t next_order_ = 0;
  FaultCounters faults_;
};

}  // namespace urdma::net
