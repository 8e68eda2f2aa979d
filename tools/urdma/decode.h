// `urdma decode FILE`: every RoCEv2 packet of a capture, decoded by urdma's own wire codec.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace urdma::tools {

struct DecodeOptions {
  std::string path;
  bool verbose = false;      // every field of every header, not one line per packet
  uint16_t udp_port = 4791;  // RoCEv2's IANA port; a datagram to this port is RoCEv2
};

struct DecodeSummary {
  uint64_t roce_packets = 0;
  uint64_t malformed = 0;    // rejected by the packet parser, a MAD/CM parser, or truncated
  uint64_t icrc_failed = 0;  // parsed, but the ICRC does not match the captured headers
  bool ok() const { return malformed == 0 && icrc_failed == 0; }
};

// Decodes `options.path` to `out`; problems with single packets go to `out` too, on the line of
// the packet they concern. Returns the summary, or sets `error` when the file cannot be read.
DecodeSummary decode_capture(const DecodeOptions& options, std::ostream& out, std::string& error);

}  // namespace urdma::tools
