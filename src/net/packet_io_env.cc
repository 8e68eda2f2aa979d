#include "net/packet_io_env.h"

#include <unistd.h>

#include <cstdlib>
#include <string_view>

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

std::unique_ptr<PacketIo> make_packet_io_from_env(int fd, const Clock& clock, std::string* error) {
  UdpSocketIoOptions options{.source_ports = kDefaultSourcePorts};
  if (const char* gso = std::getenv(kUdpGsoEnvVar); gso != nullptr && *gso != '\0') {
    const std::string_view v(gso);
    if (v != "0" && v != "1") {
      *error = std::string(kUdpGsoEnvVar) + "=" + gso + ": must be 0 or 1";
      close(fd);
      return nullptr;
    }
    options.gso = v == "1";
  }
  std::unique_ptr<PacketIo> io = UdpSocketIo::adopt(fd, error, options);
  if (!io) return nullptr;
  return wrap_with_faults(std::move(io), clock, std::getenv(kFaultsEnvVar), error);
}

}  // namespace urdma::net
