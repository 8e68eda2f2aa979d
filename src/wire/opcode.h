// The RoCEv2 opcode table: one entry per 8-bit BTH opcode (the Linux rxe_opcode.c idea).
//
// Each entry says which extension headers follow the BTH and at which offsets, how long the
// headers are, whether the packet carries payload, where it sits in a message, whether it is a
// request or a response and what operation it belongs to. Every other layer asks this table
// instead of switching on opcodes. Opcode values: IBA Vol. 1 table 35 "OpCode field" (9.2),
// IBA 1.5 for FLUSH and ATOMIC WRITE, RoCEv2 annex A17.9 for CNP. XRC (transport bits 101) has
// RC's operations at the same low bits: kXrcPrefix | (rc_opcode & kOperationMask), FLUSH and
// ATOMIC WRITE excepted (IBA 1.5 defines them for RC only).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "wire/headers.h"

namespace urdma::wire {

namespace op {
// OpCode bits 7-5 select the transport, bits 4-0 the operation (IBA 9.2).
enum Opcode : uint8_t {
  kRcSendFirst = 0x00,
  kRcSendMiddle = 0x01,
  kRcSendLast = 0x02,
  kRcSendLastImm = 0x03,
  kRcSendOnly = 0x04,
  kRcSendOnlyImm = 0x05,
  kRcWriteFirst = 0x06,
  kRcWriteMiddle = 0x07,
  kRcWriteLast = 0x08,
  kRcWriteLastImm = 0x09,
  kRcWriteOnly = 0x0A,
  kRcWriteOnlyImm = 0x0B,
  kRcReadRequest = 0x0C,
  kRcReadResponseFirst = 0x0D,
  kRcReadResponseMiddle = 0x0E,
  kRcReadResponseLast = 0x0F,
  kRcReadResponseOnly = 0x10,
  kRcAck = 0x11,
  kRcAtomicAck = 0x12,
  kRcCompareSwap = 0x13,
  kRcFetchAdd = 0x14,
  kRcSendLastInv = 0x16,
  kRcSendOnlyInv = 0x17,
  kRcFlush = 0x1C,        // IBA 1.5
  kRcAtomicWrite = 0x1D,  // IBA 1.5
  kUcSendFirst = 0x20,
  kUcSendMiddle = 0x21,
  kUcSendLast = 0x22,
  kUcSendLastImm = 0x23,
  kUcSendOnly = 0x24,
  kUcSendOnlyImm = 0x25,
  kUcWriteFirst = 0x26,
  kUcWriteMiddle = 0x27,
  kUcWriteLast = 0x28,
  kUcWriteLastImm = 0x29,
  kUcWriteOnly = 0x2A,
  kUcWriteOnlyImm = 0x2B,
  kUdSendOnly = 0x64,
  kUdSendOnlyImm = 0x65,
  kCnp = 0x81,  // RoCEv2 Congestion Notification Packet
  kXrcSendFirst = 0xA0,
  kXrcSendOnly = 0xA4,
  kXrcWriteOnly = 0xAA,
  kXrcReadRequest = 0xAC,
  kXrcReadResponseOnly = 0xB0,
  kXrcAck = 0xB1,
  kXrcAtomicAck = 0xB2,
  kXrcCompareSwap = 0xB3,
  kXrcFetchAdd = 0xB4,
  kXrcSendOnlyInv = 0xB7,
};
// The transport prefixes (bits 7-5), to turn an RC opcode into its UC twin: kUc | (rc & 0x1F).
inline constexpr uint8_t kRcPrefix = 0x00;
inline constexpr uint8_t kUcPrefix = 0x20;
inline constexpr uint8_t kUdPrefix = 0x60;
inline constexpr uint8_t kXrcPrefix = 0xA0;
inline constexpr uint8_t kOperationMask = 0x1F;
// The operation of an RC, UC or XRC opcode as its RC opcode (kRcPrefix is 0): what the engine
// compares with, whichever connected transport carried it.
inline constexpr uint8_t operation(uint8_t opcode) {
  return opcode & kOperationMask;
}
}  // namespace op
using op::Opcode;

// Transport service an opcode belongs to.
enum class Transport : uint8_t { kNone, kRc, kUc, kUd, kCnp, kXrc };
const char* transport_name(Transport t);

// Extension headers, in no particular order; the table gives each one's offset.
enum class Ext : uint8_t {
  kReth,
  kAeth,
  kDeth,
  kImmDt,
  kIeth,
  kAtomicEth,
  kAtomicAckEth,
  kFeth,
  kCnpResv,  // the 16 reserved bytes of a CNP
  kXrceth,
  kCount,
};
inline constexpr size_t kExtCount = static_cast<size_t>(Ext::kCount);
using ExtMask = uint16_t;
inline constexpr ExtMask ext_bit(Ext e) {
  return static_cast<ExtMask>(1u << static_cast<unsigned>(e));
}
inline constexpr std::array<uint8_t, kExtCount> kExtSize = {
    Reth::kSize,      Aeth::kSize,         Deth::kSize, ImmDt::kSize,      Ieth::kSize,
    AtomicEth::kSize, AtomicAckEth::kSize, Feth::kSize, kCnpReservedBytes, Xrceth::kSize,
};
const char* ext_name(Ext e);  // "RETH", "AETH", ...

// Per-opcode properties (bit flags).
enum OpFlag : uint32_t {
  kPayload = 1u << 0,          // may carry payload
  kPayloadRequired = 1u << 1,  // must carry at least one payload byte (first/middle packets)
  kFirst = 1u << 2,            // starts a message (First or Only)
  kMiddle = 1u << 3,
  kLast = 1u << 4,  // ends a message (Last or Only)
  kRequest = 1u << 5,
  kResponse = 1u << 6,  // sent by the responder (ACK, read response, atomic ACK)
  kImm = 1u << 7,       // carries ImmDt
  kInv = 1u << 8,       // carries IETH
  kSend = 1u << 9,
  kWrite = 1u << 10,
  kReadRequest = 1u << 11,
  kReadResponse = 1u << 12,
  kAtomic = 1u << 13,  // CmpSwap / FetchAdd request
  kAck = 1u << 14,     // RC Acknowledge
  kAtomicAck = 1u << 15,
  kFlush = 1u << 16,
  kAtomicWrite = 1u << 17,
  kCongestion = 1u << 18,     // CNP
  kConsumesRecv = 1u << 19,   // starts consuming a receive WQE (SEND First/Only, WRITE with imm)
  kCompletesRecv = 1u << 20,  // generates a receive completion (SEND Last/Only, WRITE with imm)
};
inline constexpr uint32_t kOnly = kFirst | kLast;

struct OpcodeInfo {
  const char* name = nullptr;  // as Wireshark's Info column prints it, e.g. "RC Send Only"
  uint8_t opcode = 0;
  bool valid = false;  // false: reserved / unsupported (RD, manufacturer-specific)
  Transport transport = Transport::kNone;
  ExtMask ext = 0;
  uint32_t flags = 0;
  // Offset of each present extension header from the start of the BTH (0 = absent: the BTH
  // itself sits at 0).
  std::array<uint8_t, kExtCount> offset{};
  uint8_t header_length = 0;  // BTH + extension headers = offset of the payload
  // When non-zero, the payload must be exactly this long (ATOMIC WRITE: 8 bytes).
  uint8_t exact_payload = 0;

  constexpr bool has(Ext e) const { return (ext & ext_bit(e)) != 0; }
  constexpr bool is(uint32_t flag) const { return (flags & flag) == flag; }
  constexpr bool any(uint32_t mask) const { return (flags & mask) != 0; }
  constexpr uint8_t offset_of(Ext e) const { return offset[static_cast<size_t>(e)]; }
};

inline constexpr size_t kOpcodeCount = 256;
extern const std::array<OpcodeInfo, kOpcodeCount> kOpcodeTable;

inline const OpcodeInfo& opcode_info(uint8_t opcode) {
  return kOpcodeTable[opcode];
}
inline const char* opcode_name(uint8_t opcode) {
  return kOpcodeTable[opcode].name;
}

}  // namespace urdma::wire
