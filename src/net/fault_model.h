// The one fault model of urdma's fault injectors: FaultyPacketIo (URDMA_FAULTS on real sockets,
// faulty_packet_io.h), the simulation's network (tests/support/sim_network.h) and the CM tests'
// MAD link (tests/unit/cm/cm_link.h).
//
// A plain set of rates with a seed, probabilities in parts per million (the idea of TigerBeetle's
// src/testing/packet_simulator.zig). FaultModel decides what happens to each datagram, drawing
// from one Xoshiro256 in a fixed order per datagram, so a seed and a sequence of datagrams meet
// the same faults every time:
//   loss → duplication (a second, independent copy) → for each copy: delay in
//   [delay_min_ns, delay_max_ns], reordering (a draw in [1, reorder_span]), corruption (one
//   random bit of the UDP payload, flipped after the sender sealed its ICRC, so the receiver's
//   ICRC check must catch it; never for an empty payload).
// What a reorder draw counts is the injector's: FaultyPacketIo holds the copy back until that
// many later datagrams have been sent, the simulated network and the CM link delay it by that
// many more nanoseconds. The injector carries the decisions out; FaultModel touches no datagram.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "net/prng.h"

namespace urdma::net {

struct FaultRates {
  // Per datagram (loss, duplicate) or per copy (reorder, corrupt), in parts per million.
  uint32_t loss_ppm = 0;
  uint32_t duplicate_ppm = 0;
  uint32_t reorder_ppm = 0;
  uint32_t corrupt_ppm = 0;
  // Delay of every copy, uniform in [min, max]; a spread also reorders.
  uint64_t delay_min_ns = 0;
  uint64_t delay_max_ns = 0;

  friend bool operator==(const FaultRates&, const FaultRates&) = default;
};

// What happens to one copy of a datagram.
struct CopyFaults {
  uint64_t delay_ns = 0;
  uint64_t reorder = 0;  // 0: in order; else the draw in [1, reorder_span]
  bool corrupt = false;
  uint64_t corrupt_bit = 0;  // the bit to flip, numbered from bit 7 of byte 0 (see flip_bit)
};

// What happens to one datagram: lost, or one copy, or two (duplicated).
struct DatagramFaults {
  bool lost = false;
  bool duplicated = false;
  std::array<CopyFaults, 2> copy{};  // copy[1] only when duplicated

  size_t copies() const { return lost ? 0 : duplicated ? 2 : 1; }
};

class FaultModel {
 public:
  // The rates are checked (probabilities <= 1e6 ppm, delay_min <= delay_max, reorder_span >= 1);
  // bounds of their own (how long a delay may be) are the injectors'.
  FaultModel(uint64_t seed, const FaultRates& rates, uint64_t reorder_span);

  // The faults of the next datagram, `payload_bytes` long.
  DatagramFaults next(size_t payload_bytes);

  const FaultRates& rates() const { return rates_; }

  // Flips bit `bit` of `bytes` (bit 0 is the most significant bit of byte 0).
  static void flip_bit(std::span<uint8_t> bytes, uint64_t bit);

 private:
  FaultRates rates_;
  uint64_t reorder_span_;
  Xoshiro256 rng_;
};

}  // namespace urdma::net
