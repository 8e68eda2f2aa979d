// A deterministic simulated network for the engine's simulation tests.
//
// N hosts, each with one Address and its own PacketIo, joined by one network driven by a
// VirtualClock. Every datagram a host sends is copied into the network (the sender's buffers are
// free when send returns), runs through the fault model, and waits in a bounded in-flight queue
// ordered by delivery time; deliver_due() moves the datagrams whose time has come into their
// destination host's receive queue (also bounded, like a socket receive buffer), from which that
// host's PacketIo::recv_batch reads them. Nothing here reads real time or global state: the same
// options, seed and sequence of calls give bit-identical results.
//
// The faults are FaultModel's (src/net/fault_model.h, the model URDMA_FAULTS uses on real
// sockets): a plain options struct with a seed and probabilities in parts per million. Per
// datagram: partition (at send and again at delivery), then FaultModel's loss → duplication →
// for each copy one-way delay, reordering, corruption. A reordered copy is delayed by its
// reorder draw, [1, reorder_delay_max_ns] more nanoseconds, so later datagrams overtake it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/check.h"
#include "net/address.h"
#include "net/clock.h"
#include "net/fault_model.h"
#include "net/packet_io.h"

namespace urdma::net {

using HostId = uint32_t;

// Bounds: hosts fit one 64-bit HostSet; partitions (scheduled + made at run time) are a list
// scanned per datagram.
inline constexpr size_t kMaxSimHosts = 64;
inline constexpr size_t kMaxSimPartitions = 1024;

class HostSet {
 public:
  constexpr HostSet() = default;
  constexpr HostSet(std::initializer_list<HostId> ids) {
    for (HostId id : ids) insert(id);
  }
  constexpr void insert(HostId id) {
    base::check(id < kMaxSimHosts, "host id out of range");
    bits_ |= uint64_t{1} << id;
  }
  constexpr bool contains(HostId id) const { return id < kMaxSimHosts && (bits_ >> id) & 1; }
  constexpr uint64_t bits() const { return bits_; }

 private:
  uint64_t bits_ = 0;
};

// While start_ns <= t < end_ns, no datagram passes between a host of `a` and a host of `b`
// (either direction). Hosts in neither set, and pairs inside one set, are unaffected.
struct SimPartition {
  uint64_t start_ns = 0;
  uint64_t end_ns = kNever;
  HostSet a;
  HostSet b;

  bool cuts(HostId x, HostId y, uint64_t t_ns) const {
    if (t_ns < start_ns || t_ns >= end_ns) return false;
    return (a.contains(x) && b.contains(y)) || (a.contains(y) && b.contains(x));
  }
};

// The one-way delay of a simulated link unless the options say otherwise.
inline constexpr uint64_t kSimDelayNs = 2'000;

// The fault rates (FaultRates: loss, duplication, reordering, corruption, the one-way delay —
// kSimDelayNs unless set) and what the simulated network needs besides.
struct SimOptions : FaultRates {
  SimOptions() {
    delay_min_ns = kSimDelayNs;
    delay_max_ns = kSimDelayNs;
  }

  uint64_t seed = 0;
  // Extra delay of a reordered copy, uniform in [1, reorder_delay_max_ns].
  uint64_t reorder_delay_max_ns = 20'000;
  // Datagrams in flight in the whole network; beyond it a datagram is dropped and counted.
  size_t in_flight_max = 16'384;
  // Datagrams delivered but not yet read, per host (a socket receive buffer); beyond it dropped.
  size_t rx_queue_max = 4'096;
  // Scheduled partitions; more can be made at run time with SimNetwork::partition().
  std::vector<SimPartition> partitions;
};

struct SimCounters {
  uint64_t sent = 0;  // datagrams accepted by send, before any fault
  uint64_t delivered = 0;
  uint64_t dropped_loss = 0;
  uint64_t dropped_partition = 0;
  uint64_t dropped_queue_full = 0;  // the in-flight queue was full
  uint64_t dropped_rx_full = 0;     // the destination's receive queue was full
  uint64_t dropped_no_route = 0;    // no host has the destination address
  uint64_t duplicated = 0;
  uint64_t reordered = 0;
  uint64_t corrupted = 0;

  friend bool operator==(const SimCounters&, const SimCounters&) = default;
};

// One thing that happened to one datagram, for the trace hook.
enum class SimEventKind : uint8_t {
  kSend,  // accepted from the sender
  kDropNoRoute,
  kDropPartition,  // at send or at delivery
  kDropLoss,
  kDuplicate,  // a second copy was made (copy 1)
  kReorder,    // detail = the extra delay in ns
  kCorrupt,    // detail = index of the flipped bit in the payload (bit 7 of byte 0 is 0)
  kDropQueueFull,
  kSchedule,  // entered the in-flight queue; detail = delivery time in ns
  kDropRxFull,
  kDeliver,  // now readable at the destination
};
inline constexpr size_t kSimEventKinds = 11;
const char* to_string(SimEventKind kind);

inline constexpr HostId kNoHost = ~HostId{0};

struct SimEvent {
  uint64_t time_ns = 0;
  SimEventKind kind = SimEventKind::kSend;
  uint64_t packet_id = 0;  // numbered from 1 in send order; copies share it
  uint8_t copy = 0;        // 0 = original, 1 = duplicate
  HostId src = kNoHost;
  HostId dst = kNoHost;  // kNoHost when there is no route
  uint32_t length = 0;   // UDP payload bytes
  uint64_t detail = 0;   // see SimEventKind
};
// One line: "t=2000 deliver #7.0 h0->h1 len=64".
std::string to_string(const SimEvent& e);

using SimTraceFn = std::function<void(const SimEvent&)>;

class SimNetwork {
 public:
  // Options are checked (probabilities <= 1e6 ppm, delay_min <= delay_max, bounds > 0).
  SimNetwork(VirtualClock& clock, SimOptions options);
  ~SimNetwork();
  SimNetwork(const SimNetwork&) = delete;
  SimNetwork& operator=(const SimNetwork&) = delete;

  // Adds a host with a unique address; ids are 0, 1, 2, ... in order of addition.
  HostId add_host(const Address& address);
  size_t host_count() const { return hosts_.size(); }
  PacketIo& io(HostId host);
  const Address& address(HostId host) const;
  std::optional<HostId> find_host(const Address& address) const;

  // When the next in-flight datagram is due (kNever if none).
  uint64_t next_event_ns() const;
  // Delivers every datagram due at or before the clock's now; returns how many became readable.
  size_t deliver_due();
  size_t in_flight() const { return in_flight_.size(); }
  // Datagrams delivered to `host` and not yet read.
  size_t rx_pending(HostId host) const;

  // Cuts a from b from now until healed; returns the partition's id.
  size_t partition(HostSet a, HostSet b);
  // Ends partition `id` now (a no-op if it has already ended).
  void heal(size_t id);
  // Ends every partition active now and cancels those scheduled later.
  void heal_all();
  bool is_partitioned(HostId x, HostId y, uint64_t t_ns) const;

  const SimCounters& counters() const { return total_; }
  // Per host: send-side events (sent, loss, partition at send, duplicate, reorder, corrupt,
  // queue full, no route) count at the sender; delivery-side ones (delivered, rx full, partition
  // at delivery) at the receiver.
  const SimCounters& host_counters(HostId host) const;

  // Called for every SimEvent, synchronously, in order. Empty = no tracing.
  void set_trace(SimTraceFn fn) { trace_ = std::move(fn); }

  const SimOptions& options() const { return options_; }
  uint64_t now_ns() const { return clock_.now_ns(); }

 private:
  class Host;
  friend class Host;

  // One copy of one datagram in flight.
  struct Flight {
    uint64_t deliver_ns = 0;
    uint64_t order = 0;
    uint64_t packet_id = 0;
    uint8_t copy = 0;
    HostId src = kNoHost;
    HostId dst = kNoHost;
    Endpoint from;
    Endpoint to;
    std::vector<uint8_t> bytes;
  };

  TxStatus transmit(HostId from, const TxDatagram& d);
  void emit(SimEventKind kind, const Flight& f, uint64_t detail = 0);
  void count(HostId host, uint64_t SimCounters::*field);
  std::vector<uint8_t> take_buffer();
  void recycle(std::vector<uint8_t>&& buf);

  VirtualClock& clock_;
  SimOptions options_;
  FaultModel model_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::unordered_map<Address, HostId> by_address_;
  std::vector<Flight> in_flight_;           // binary min-heap on (deliver_ns, order)
  std::vector<std::vector<uint8_t>> pool_;  // recycled payload buffers, bounded
  std::vector<SimPartition> partitions_;
  SimCounters total_;
  std::vector<SimCounters> per_host_;
  uint64_t next_packet_id_ = 1;
  uint64_t next_order_ = 0;  // tie-break: equal delivery times deliver in scheduling order
  SimTraceFn trace_;
};

}  // namespace urdma::net
