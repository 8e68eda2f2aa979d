#include "net/packet_io_env.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "net/faulty_packet_io.h"
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

// A 0/1 setting: unset or empty leaves *on alone; false with the reason for anything else. The
// same rule as the verbs layer's check of the engine settings (a decimal number in 0..1).
bool env_switch(const char* name, bool* on, std::string* error) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return true;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0' || v[0] == '-' || n > 1) {
    *error = std::string(name) + "=" + v + ": must be 0 or 1";
    return false;
  }
  *on = n == 1;
  return true;
}

}  // namespace

std::unique_ptr<PacketIo> make_packet_io_from_env(int fd, const Clock& clock, std::string* error) {
  // The engine offers receive buffers of rx_buffer_bytes(), so the runtime's I/O may coalesce.
  UdpSocketIoOptions options{.source_ports = kDefaultSourcePorts, .gro = true};
  if (!env_switch(kUdpGsoEnvVar, &options.gso, error) ||
      !env_switch(kUdpGroEnvVar, &options.gro, error)) {
    close(fd);
    return nullptr;
  }
  std::unique_ptr<PacketIo> io = UdpSocketIo::adopt(fd, error, options);
  if (!io) return nullptr;
  return wrap_with_faults(std::move(io), clock, std::getenv(kFaultsEnvVar), error);
}

}  // namespace urdma::net
