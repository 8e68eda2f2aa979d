#include "wire/packet.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace urdma::wire {

const char* parse_error_name(ParseError e) {
  constexpr std::array<const char*, kParseErrorCount> kNames = {
      "ok",
      "too short for BTH",
      "bad transport header version",
      "unknown opcode",
      "too short for the opcode's headers and ICRC",
      "length not a multiple of 4",
      "pad count on an opcode without payload",
      "pad count exceeds payload",
      "payload on an opcode without payload",
      "payload missing",
      "payload length invalid for the opcode",
      "reserved bits set",
  };
  const auto i = static_cast<size_t>(e);
  return i < kNames.size() ? kNames[i] : "?";
}

namespace {

// Reserved fields of the headers present (strict mode only). FECN/BECN are not reserved (IBA
// annex A10 congestion control) — only BTH Resv6/Resv7, the AETH syndrome's high bit, DETH's
// and XRCETH's reserved bytes and FETH bits 31-6.
bool reserved_bits_set(const PacketHeadersView& h) {
  const BthView bth = h.bth();
  if (bth.resv6() != 0 || bth.resv7() != 0) return true;
  if (auto aeth = h.aeth(); aeth && aeth->syndrome_resv()) return true;
  if (auto deth = h.deth(); deth && deth->resv8() != 0) return true;
  if (auto feth = h.feth(); feth && feth->resv() != 0) return true;
  if (auto xrceth = h.xrceth(); xrceth && xrceth->resv8() != 0) return true;
  return false;
}

}  // namespace

ParseResult parse_packet(std::span<const uint8_t> udp_payload, const ParseOptions& options) {
  const size_t size = udp_payload.size();
  if (size < Bth::kSize) return ParseError::kTooShortForBth;
  const BthView bth(udp_payload.data());

  // IBA 9.2 / 9.6: only transport header version 0 is defined; others are dropped.
  if (bth.tver() != kBthTransportVersion) return ParseError::kBadTransportVersion;

  // IBA 9.6: an opcode the receiver does not support is dropped (RD is not).
  const OpcodeInfo& info = opcode_info(bth.opcode());
  if (!info.valid) return ParseError::kUnknownOpcode;

  // The opcode fixes the header length; the ICRC ends every packet (annex A17.4.3.1).
  if (size < size_t{info.header_length} + kIcrcSize) return ParseError::kTooShortForHeaders;

  // IBA 9.2 (PadCnt): headers are whole words and the pad brings the payload to a word
  // boundary, so a well-formed UDP payload is a multiple of 4 bytes.
  if (size % 4 != 0) return ParseError::kMisaligned;

  const size_t body = size - info.header_length - kIcrcSize;  // payload + pad
  const uint8_t pad = bth.pad_count();
  size_t payload_len = 0;
  if (!info.is(kPayload)) {
    // IBA 9.2 / 9.3: ACK, READ request, atomics, FLUSH and CNP end after their headers.
    if (pad != 0) return ParseError::kPadWithoutPayload;
    if (body != 0) return ParseError::kPayloadNotAllowed;
  } else {
    if (pad > body) return ParseError::kPadExceedsPayload;
    payload_len = body - pad;
    // IBA 9.5: First, Middle and Last packets carry 1..PMTU bytes; only Only may be empty.
    if (info.is(kPayloadRequired) && payload_len == 0) return ParseError::kPayloadMissing;
    // IBA 1.5: an ATOMIC WRITE carries exactly its 8-byte operand.
    if (info.exact_payload != 0 && payload_len != info.exact_payload)
      return ParseError::kPayloadLengthInvalid;
  }

  const PacketHeadersView headers(&info, udp_payload.data());
  if (options.strict_reserved && reserved_bits_set(headers)) return ParseError::kReservedBitsSet;
  return PacketView(headers, udp_payload, payload_len, pad);
}

std::optional<PacketLayout> packet_layout(uint8_t opcode, size_t payload_len) {
  const OpcodeInfo& info = opcode_info(opcode);
  if (!info.valid) return std::nullopt;
  if (!info.is(kPayload) && payload_len != 0) return std::nullopt;
  if (info.is(kPayloadRequired) && payload_len == 0) return std::nullopt;
  if (info.exact_payload != 0 && payload_len != info.exact_payload) return std::nullopt;
  PacketLayout layout;
  layout.info = &info;
  layout.header_length = info.header_length;
  layout.payload_length = payload_len;
  layout.pad = pad_for(payload_len);
  return layout;
}

PacketHeaders write_headers(std::span<uint8_t> buf, const PacketLayout& layout) {
  assert(layout.info != nullptr && layout.info->valid);
  assert(buf.size() >= layout.header_length);
  std::memset(buf.data(), 0, layout.header_length);
  const Bth bth(buf.data());
  bth.set_opcode(layout.info->opcode);
  bth.set_pad_count(layout.pad);
  bth.set_tver(kBthTransportVersion);
  return PacketHeaders(layout.info, buf.data());
}

void write_trailer(std::span<uint8_t> buf, const PacketLayout& layout) {
  assert(buf.size() >= layout.trailer_length());
  std::memset(buf.data(), 0, layout.trailer_length());
}

std::optional<BuiltPacket> build_packet(std::span<uint8_t> buf, uint8_t opcode,
                                        std::span<const uint8_t> payload) {
  const std::optional<PacketLayout> layout = packet_layout(opcode, payload.size());
  if (!layout || buf.size() < layout->total_length()) return std::nullopt;
  BuiltPacket built;
  built.layout = *layout;
  built.datagram = buf.first(layout->total_length());
  built.headers = write_headers(built.datagram, *layout);
  if (!payload.empty())
    std::memcpy(built.datagram.data() + layout->payload_offset(), payload.data(), payload.size());
  write_trailer(built.datagram.subspan(layout->pad_offset()), *layout);
  return built;
}

}  // namespace urdma::wire
