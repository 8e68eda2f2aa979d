#include "net/packet_io_env.h"

#include <unistd.h>

#include <cstdlib>

#include "base/env.h"
#include "net/capture_tap.h"
#include "net/faulty_packet_io.h"
#include "net/shm_packet_io.h"
#include "net/udp_socket_io.h"

namespace urdma::net {

std::unique_ptr<PacketIo> wrap_with_faults(std::unique_ptr<PacketIo> io, const Clock& clock,
                                           const char* faults, std::string* error) {
  if (faults == nullptr || *faults == '\0') return io;
  const std::optional<FaultProfile> profile = parse_fault_profile(faults, error);
  if (!profile) return nullptr;
  return std::make_unique<FaultyPacketIo>(std::move(io), clock, *profile);
}

namespace {

// A 0/1 setting (base::env_number, as the verbs layer checks it): unset or empty leaves *on
// alone; false with the reason for anything else.
bool env_switch(const char* name, bool* on, std::string* error) {
  uint64_t n = *on ? 1 : 0;
  if (base::env_number(name, 0, 1, &n, error) != 0) return false;
  *on = n == 1;
  return true;
}

}  // namespace

bool shm_enabled_from_env(bool* on, std::string* error) {
  *on = true;
  return env_switch(kShmEnvVar, on, error);
}

std::unique_ptr<PacketIo> make_packet_io_from_env(int fd, const Clock& clock, std::string* error,
                                                  CaptureTap** tap, ShmSetup* shm) {
  // The engine offers receive buffers of rx_buffer_bytes(), so the runtime's I/O may coalesce.
  UdpSocketIoOptions options{.source_ports = kDefaultSourcePorts, .gro = true};
  if (!env_switch(kUdpGsoEnvVar, &options.gso, error) ||
      !env_switch(kUdpGroEnvVar, &options.gro, error)) {
    close(fd);
    if (shm != nullptr && shm->doorbell >= 0) close(shm->doorbell);
    return nullptr;
  }
  std::unique_ptr<PacketIo> io = UdpSocketIo::adopt(fd, error, options);
  if (!io) {
    if (shm != nullptr && shm->doorbell >= 0) close(shm->doorbell);
    return nullptr;
  }
  if (shm != nullptr && shm->doorbell >= 0) {
    auto owned = std::make_unique<ShmPacketIo>(std::move(io), clock, shm->own_range,
                                               shm->doorbell, std::move(shm->want),
                                               std::move(shm->is_local));
    shm->io = owned.get();
    io = std::move(owned);
  }
  CaptureTap* tapped = nullptr;
  if (tap != nullptr) {
    auto owned = std::make_unique<CaptureTap>(std::move(io), static_cast<uint32_t>(getpid()));
    tapped = owned.get();
    io = std::move(owned);
  }
  io = wrap_with_faults(std::move(io), clock, std::getenv(kFaultsEnvVar), error);
  if (io && tap != nullptr) *tap = tapped;
  if (!io && shm != nullptr) shm->io = nullptr;
  return io;
}

}  // namespace urdma::net
