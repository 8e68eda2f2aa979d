// Parsing and building RoCEv2 packets: the UDP payload BTH | ext headers | payload | pad | ICRC.
//
// parse_packet() validates a received datagram against the opcode table and returns either a
// PacketView (typed views of every header, the payload without pad, the ICRC bytes) or the one
// reason it was rejected. It never reads outside the span it is given, whatever the bytes say.
// It does not check the ICRC (icrc.h) nor anything that needs QP state (PSN, opcode sequence,
// P_Key, Q_Key): those belong to the receive pipeline.
//
// The builder lays out a packet for an opcode and a payload length and writes the BTH and the
// (zeroed) extension headers into a caller's buffer, without allocating; the caller fills the
// fields through the returned views. The payload may be placed after the headers or sent from
// another buffer (iovec): the layout gives every offset.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace urdma::wire {

// Why parse_packet rejected a datagram. The receive pipeline counts and drops these silently
// (IBA 9.6: packets failing transport header validation are discarded).
enum class ParseError : uint8_t {
  kNone = 0,
  kTooShortForBth,       // fewer than 12 + 4 (ICRC) bytes
  kBadTransportVersion,  // BTH.TVer != 0 (IBA 9.2, 9.6)
  kUnknownOpcode,        // reserved, RD or manufacturer-specific opcode (IBA 9.2 table 35)
  kTooShortForHeaders,   // shorter than the opcode's headers + ICRC
  kMisaligned,  // UDP payload not a multiple of 4 bytes (IBA 9.2: headers, payload+pad are words)
  kPadWithoutPayload,     // PadCnt != 0 on an opcode that carries no payload
  kPadExceedsPayload,     // PadCnt larger than the bytes between the headers and the ICRC
  kPayloadNotAllowed,     // bytes beyond the headers on an opcode without payload (ACK, READ req)
  kPayloadMissing,        // no payload on a First/Middle/Last packet (IBA 9.5)
  kPayloadLengthInvalid,  // ATOMIC WRITE payload other than 8 bytes (IBA 1.5)
  kReservedBitsSet,       // only with ParseOptions::strict_reserved: BTH Resv7 or AETH Resv
  kCount,
};
inline constexpr size_t kParseErrorCount = static_cast<size_t>(ParseError::kCount);
const char* parse_error_name(ParseError e);

struct ParseOptions {
  // IBA 9.2: reserved fields are sent as 0 and ignored on receipt (they are covered by the
  // ICRC). Strict mode rejects packets that set them, for tools and tests.
  bool strict_reserved = false;
};

// Typed access to the headers of one packet (read-only or writable). Accessors for headers the
// opcode does not carry return nullopt.
template <WireByte Byte>
class BasicPacketHeaders {
 public:
  constexpr BasicPacketHeaders() = default;
  constexpr BasicPacketHeaders(const OpcodeInfo* info, Byte* bth) : info_(info), bth_(bth) {}
  template <WireByte Other>
  requires(std::is_const_v<Byte>&& std::is_same_v<
           Other,
           std::remove_const_t<Byte>>) constexpr BasicPacketHeaders(const BasicPacketHeaders<Other>&
                                                                        other)
      : info_(&other.info()), bth_(other.bth().data()) {}

  const OpcodeInfo& info() const { return *info_; }
  uint8_t opcode() const { return info_->opcode; }
  bool has(Ext e) const { return info_->has(e); }
  // Start of the header of `e` (must be present).
  Byte* ext_data(Ext e) const {
    assert(has(e));
    return bth_ + info_->offset_of(e);
  }

  BasicBth<Byte> bth() const { return BasicBth<Byte>(bth_); }
  std::optional<BasicReth<Byte>> reth() const { return get<BasicReth<Byte>>(Ext::kReth); }
  std::optional<BasicAeth<Byte>> aeth() const { return get<BasicAeth<Byte>>(Ext::kAeth); }
  std::optional<BasicDeth<Byte>> deth() const { return get<BasicDeth<Byte>>(Ext::kDeth); }
  std::optional<BasicImmDt<Byte>> immdt() const { return get<BasicImmDt<Byte>>(Ext::kImmDt); }
  std::optional<BasicIeth<Byte>> ieth() const { return get<BasicIeth<Byte>>(Ext::kIeth); }
  std::optional<BasicAtomicEth<Byte>> atomic_eth() const {
    return get<BasicAtomicEth<Byte>>(Ext::kAtomicEth);
  }
  std::optional<BasicAtomicAckEth<Byte>> atomic_ack_eth() const {
    return get<BasicAtomicAckEth<Byte>>(Ext::kAtomicAckEth);
  }
  std::optional<BasicFeth<Byte>> feth() const { return get<BasicFeth<Byte>>(Ext::kFeth); }
  std::optional<BasicXrceth<Byte>> xrceth() const {
    return get<BasicXrceth<Byte>>(Ext::kXrceth);
  }

 private:
  template <typename View>
  std::optional<View> get(Ext e) const {
    if (!has(e)) return std::nullopt;
    return View(bth_ + info_->offset_of(e));
  }

  const OpcodeInfo* info_ = nullptr;
  Byte* bth_ = nullptr;
};
using PacketHeaders = BasicPacketHeaders<uint8_t>;
using PacketHeadersView = BasicPacketHeaders<const uint8_t>;

// A validated received packet. Holds pointers into the datagram; valid while it lives.
class PacketView {
 public:
  PacketView() = default;
  PacketView(PacketHeadersView headers, std::span<const uint8_t> datagram, size_t payload_len,
             uint8_t pad)
      : headers_(headers), datagram_(datagram), payload_len_(payload_len), pad_(pad) {}

  const PacketHeadersView& headers() const { return headers_; }
  const OpcodeInfo& info() const { return headers_.info(); }
  uint8_t opcode() const { return headers_.opcode(); }
  BthView bth() const { return headers_.bth(); }
  std::optional<RethView> reth() const { return headers_.reth(); }
  std::optional<AethView> aeth() const { return headers_.aeth(); }
  std::optional<DethView> deth() const { return headers_.deth(); }
  std::optional<ImmDtView> immdt() const { return headers_.immdt(); }
  std::optional<IethView> ieth() const { return headers_.ieth(); }
  std::optional<AtomicEthView> atomic_eth() const { return headers_.atomic_eth(); }
  std::optional<AtomicAckEthView> atomic_ack_eth() const { return headers_.atomic_ack_eth(); }
  std::optional<FethView> feth() const { return headers_.feth(); }
  std::optional<XrcethView> xrceth() const { return headers_.xrceth(); }

  // The whole UDP payload, BTH through ICRC.
  std::span<const uint8_t> datagram() const { return datagram_; }
  size_t header_length() const { return info().header_length; }
  // The payload without its pad bytes.
  std::span<const uint8_t> payload() const {
    return datagram_.subspan(info().header_length, payload_len_);
  }
  uint8_t pad_count() const { return pad_; }
  std::span<const uint8_t, kIcrcSize> icrc_bytes() const { return datagram_.last<kIcrcSize>(); }
  // The ICRC as Wireshark prints it (the four wire bytes read big-endian).
  uint32_t icrc() const { return load_be32(icrc_bytes().data()); }

 private:
  PacketHeadersView headers_;
  std::span<const uint8_t> datagram_;
  size_t payload_len_ = 0;
  uint8_t pad_ = 0;
};

// Either a PacketView or the reason for rejection.
class ParseResult {
 public:
  ParseResult(ParseError error) : error_(error) { assert(error != ParseError::kNone); }
  ParseResult(const PacketView& packet) : packet_(packet) {}

  bool ok() const { return error_ == ParseError::kNone; }
  explicit operator bool() const { return ok(); }
  ParseError error() const { return error_; }
  const PacketView& packet() const {
    assert(ok());
    return packet_;
  }
  const PacketView* operator->() const { return &packet(); }
  const PacketView& operator*() const { return packet(); }

 private:
  ParseError error_ = ParseError::kNone;
  PacketView packet_;
};

ParseResult parse_packet(std::span<const uint8_t> udp_payload, const ParseOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Building.

// Pad bytes that bring a payload to a 4-byte boundary (IBA 9.2: BTH.PadCnt).
inline constexpr uint8_t pad_for(size_t payload_len) {
  return static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
}

// Where everything goes in one datagram. Offsets are from the start of the BTH (= start of the
// UDP payload).
struct PacketLayout {
  const OpcodeInfo* info = nullptr;
  size_t header_length = 0;  // BTH + extension headers
  size_t payload_length = 0;
  uint8_t pad = 0;

  size_t payload_offset() const { return header_length; }
  size_t pad_offset() const { return header_length + payload_length; }
  size_t icrc_offset() const { return pad_offset() + pad; }
  size_t total_length() const { return icrc_offset() + kIcrcSize; }  // the UDP payload length
  size_t trailer_length() const { return pad + kIcrcSize; }          // pad + ICRC slot
};

// The layout of an `opcode` packet carrying `payload_len` bytes, or nullopt when the opcode is
// unknown or the length breaks its payload rule (none allowed, required, exact).
std::optional<PacketLayout> packet_layout(uint8_t opcode, size_t payload_len);

// Writes the BTH (opcode, PadCnt, TVer 0, everything else 0) and zeroed extension headers at
// `buf`, which must hold layout.header_length bytes. Returns writable views of them.
PacketHeaders write_headers(std::span<uint8_t> buf, const PacketLayout& layout);

// Writes the pad bytes and the zero ICRC slot (layout.trailer_length() bytes).
void write_trailer(std::span<uint8_t> buf, const PacketLayout& layout);

// A packet built in one contiguous buffer.
struct BuiltPacket {
  PacketLayout layout;
  PacketHeaders headers;
  std::span<uint8_t> datagram;  // layout.total_length() bytes
  std::span<uint8_t> payload() const {
    return datagram.subspan(layout.payload_offset(), layout.payload_length);
  }
  std::span<uint8_t, kIcrcSize> icrc_slot() const { return datagram.last<kIcrcSize>(); }
};

// Lays out and writes a whole packet (headers, copy of `payload`, pad, zero ICRC slot) into
// `buf`. Returns nullopt when the opcode/length is invalid or `buf` is too small.
std::optional<BuiltPacket> build_packet(std::span<uint8_t> buf, uint8_t opcode,
                                        std::span<const uint8_t> payload);

}  // namespace urdma::wire
