// The PacketIo a real process runs its engine on, as the environment configures it: the runtime
// layer calls make_packet_io_from_env with its slot socket.
//
//   URDMA_FAULTS  unset or empty: no faults (no decorator, the fast path as is). Otherwise a
//                 fault profile (faulty_packet_io.h: "seed=1,loss=10000,dup=1000,reorder=10000,
//                 delay_us=0-200,corrupt=100", probabilities in ppm) applied to every datagram
//                 this process sends. A malformed value is an error, never ignored.
//   URDMA_UDP_GSO  unset or 1: runs of one message's packets leave as one segmented send (UDP
//                 GSO, udp_socket_io.h); 0: every packet is a send of its own. Anything else
//                 is an error.
//   URDMA_UDP_GRO  unset or 1: the socket takes UDP_GRO, so such a segmented send that arrives
//                 whole stays one receive (udp_socket_io.h); 0: one receive per datagram.
//   URDMA_SHM     unset or 1: datagrams for another urdma process of this host go through shared
//                 memory (shm_packet_io.h); 0: every datagram is a UDP one. The runtime reads it
//                 (shm_enabled_from_env) before it asks urdmad for a doorbell.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "net/clock.h"
#include "net/packet_io.h"

namespace urdma::net {

inline constexpr const char* kFaultsEnvVar = "URDMA_FAULTS";
inline constexpr const char* kUdpGsoEnvVar = "URDMA_UDP_GSO";
inline constexpr const char* kUdpGroEnvVar = "URDMA_UDP_GRO";
inline constexpr const char* kShmEnvVar = "URDMA_SHM";

// URDMA_SHM: true unless it is 0; false with the reason in *error for a value other than 0/1.
bool shm_enabled_from_env(bool* on, std::string* error);

// Wraps `io` in a FaultyPacketIo for the profile `faults` (the variable's value; null or empty =
// none: `io` is returned as is). A malformed profile: null, with the reason in *error (`io` is
// released). `clock` must outlive the result.
std::unique_ptr<PacketIo> wrap_with_faults(std::unique_ptr<PacketIo> io, const Clock& clock,
                                           const char* faults, std::string* error);

// Adopts the bound UDP socket `fd` (a urdmad slot socket) as a UdpSocketIo with
// kDefaultSourcePorts per-flow source ports, UDP GSO and GRO per URDMA_UDP_GSO and
// URDMA_UDP_GRO, wrapped per
// URDMA_FAULTS from the environment. With `tap`, the socket I/O is wrapped in a CaptureTap
// (capture_tap.h: `urdma capture`), under the fault profile, and *tap points at it.
// Null with the reason in *error when either fails (the fd is closed).
// With `shm` (its doorbell valid), the socket I/O is wrapped in a ShmPacketIo first (under the
// capture tap: a capture records both paths), and shm->io points at it.
class CaptureTap;
class ShmPacketIo;
struct ShmSetup {
  uint32_t own_range = 0;
  int doorbell = -1;  // adopted
  std::function<void(const Address&, uint32_t)> want;
  std::function<bool(const Address&)> is_local;
  ShmPacketIo* io = nullptr;  // out
};
std::unique_ptr<PacketIo> make_packet_io_from_env(int fd, const Clock& clock, std::string* error,
                                                  CaptureTap** tap = nullptr,
                                                  ShmSetup* shm = nullptr);

}  // namespace urdma::net
