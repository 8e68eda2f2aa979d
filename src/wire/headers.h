// RoCEv2 transport headers: the BTH and every extended transport header (IBA Vol. 1, 9.2-9.3;
// FETH from IBA 1.5 / Linux rxe_hdr.h), as views over byte buffers.
//
// Each header is `template <WireByte Byte> class BasicX` with `kSize`, with the aliases
// `X = BasicX<uint8_t>` (read/write) and `XView = BasicX<const uint8_t>` (read-only):
//
//   BthView bth(datagram.data());
//   if (bth.ack_req()) ...
//
// A view never checks bounds: the caller (parse_packet, the builder) guarantees that `kSize`
// bytes are readable. Byte order lives only in byte_order.h; the fields below name the spec's
// bit positions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "wire/byte_order.h"

namespace urdma::wire {

// ---------------------------------------------------------------------------------------------
// BTH — Base Transport Header, 12 bytes (IBA 9.2, figure "BTH").
//   byte 0      OpCode
//   byte 1      SE(7) M(6) PadCnt(5:4) TVer(3:0)
//   bytes 2-3   P_Key
//   byte 4      FECN(7) BECN(6) Resv6(5:0)   (RoCEv2: FECN/BECN; IB: Resv8a)
//   bytes 5-7   DestQP
//   byte 8      AckReq(7) Resv7(6:0)
//   bytes 9-11  PSN
template <WireByte Byte>
class BasicBth {
  URDMA_WIRE_VIEW(BasicBth, 12)
  URDMA_WIRE_FIELD(opcode, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(se, 1, 1, 7, 1)
  URDMA_WIRE_FIELD(m, 1, 1, 6, 1)  // MigReq
  URDMA_WIRE_FIELD(pad_count, 1, 1, 4, 2)
  URDMA_WIRE_FIELD(tver, 1, 1, 0, 4)
  URDMA_WIRE_FIELD(pkey, 2, 2, 0, 16)
  URDMA_WIRE_FIELD(fecn, 4, 1, 7, 1)
  URDMA_WIRE_FIELD(becn, 4, 1, 6, 1)
  URDMA_WIRE_FIELD(resv6, 4, 1, 0, 6)
  URDMA_WIRE_FIELD(dest_qp, 5, 3, 0, 24)
  URDMA_WIRE_FIELD(ack_req, 8, 1, 7, 1)
  URDMA_WIRE_FIELD(resv7, 8, 1, 0, 7)
  URDMA_WIRE_FIELD(psn, 9, 3, 0, 24)
  static_assert(psn_field::kEnd == kSize);
};
using Bth = BasicBth<uint8_t>;
using BthView = BasicBth<const uint8_t>;
static_assert(Bth::kSize == 12);

// IBA 9.2: the only transport header version defined is 0.
inline constexpr uint8_t kBthTransportVersion = 0;
// IBA 10.9.1: the default partition key (full membership).
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
// DestQP / SrcQP / PSN / MSN are 24-bit quantities.
inline constexpr uint32_t kQpnMask = 0xFFFFFF;

// ---------------------------------------------------------------------------------------------
// RETH — RDMA Extended Transport Header, 16 bytes (IBA 9.3.3).
template <WireByte Byte>
class BasicReth {
  URDMA_WIRE_VIEW(BasicReth, 16)
  URDMA_WIRE_FIELD(va, 0, 8, 0, 64)
  URDMA_WIRE_FIELD(rkey, 8, 4, 0, 32)
  URDMA_WIRE_FIELD(dma_length, 12, 4, 0, 32)
  static_assert(dma_length_field::kEnd == kSize);
};
using Reth = BasicReth<uint8_t>;
using RethView = BasicReth<const uint8_t>;
static_assert(Reth::kSize == 16);

// ---------------------------------------------------------------------------------------------
// AETH — ACK Extended Transport Header, 4 bytes (IBA 9.3.5).
//   byte 0      Syndrome: Resv(7) Type(6:5) Value(4:0)
//   bytes 1-3   MSN
// Syndrome type 00 = ACK (value: credit count), 01 = RNR NAK (value: RNR timer code),
// 10 = reserved, 11 = NAK (value: NAK code).
enum class AethType : uint8_t {
  kAck = 0,
  kRnrNak = 1,
  kReserved = 2,
  kNak = 3,
};

// NAK codes carried in the syndrome value when the type is NAK (IBA 9.3.5, AETH syndrome table).
enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};
inline constexpr uint8_t kNakCodeCount = 5;  // codes 5..31 are reserved

inline constexpr const char* aeth_type_name(AethType type) {
  constexpr const char* kNames[] = {"ACK", "RNR NAK", "reserved", "NAK"};
  return kNames[static_cast<uint8_t>(type) & 0x3];
}
// "reserved" for the codes the spec does not define.
inline constexpr const char* nak_code_name(uint8_t code) {
  constexpr const char* kNames[kNakCodeCount] = {"PSN sequence error", "invalid request",
                                                 "remote access error", "remote operational error",
                                                 "invalid RD request"};
  return code < kNakCodeCount ? kNames[code] : "reserved";
}

inline constexpr uint8_t kAethValueMask = 0x1F;
// IBA 9.7.5.1.x: credit count code 0x1F means "invalid" — the responder does not report
// end-to-end credits (no limit; Linux rxe always sends it).
inline constexpr uint8_t kAethCreditsInvalid = 0x1F;

// Syndrome constructors.
inline constexpr uint8_t aeth_syndrome(AethType type, uint8_t value) {
  return static_cast<uint8_t>((static_cast<uint8_t>(type) << 5) | (value & kAethValueMask));
}
inline constexpr uint8_t make_ack(uint8_t credit_code) {
  return aeth_syndrome(AethType::kAck, credit_code);
}
inline constexpr uint8_t make_rnr_nak(uint8_t timer_code) {
  return aeth_syndrome(AethType::kRnrNak, timer_code);
}
inline constexpr uint8_t make_nak(NakCode code) {
  return aeth_syndrome(AethType::kNak, static_cast<uint8_t>(code));
}
inline constexpr AethType aeth_type(uint8_t syndrome) {
  return static_cast<AethType>((syndrome >> 5) & 0x3);
}
inline constexpr uint8_t aeth_value(uint8_t syndrome) {
  return syndrome & kAethValueMask;
}

// Decodes a 5-bit end-to-end credit code into a credit count (IBA 9.7.7, the credit table:
// 0,1,2,3,4,6,8,12,...,32768 — each pair of codes doubles). Code 0x1F ("invalid") → nullopt.
inline constexpr std::array<uint32_t, kAethCreditsInvalid> kAethCreditCount = {
    0,   1,   2,   3,   4,    6,    8,    12,   16,   24,   32,   48,    64,    96,    128,   192,
    256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
};
inline constexpr std::optional<uint32_t> aeth_credit_count(uint8_t credit_code) {
  credit_code &= kAethValueMask;
  if (credit_code == kAethCreditsInvalid) return std::nullopt;
  return kAethCreditCount[credit_code];
}

template <WireByte Byte>
class BasicAeth {
  URDMA_WIRE_VIEW(BasicAeth, 4)
  URDMA_WIRE_FIELD(syndrome, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(syndrome_resv, 0, 1, 7, 1)
  URDMA_WIRE_FIELD(syndrome_type, 0, 1, 5, 2)
  URDMA_WIRE_FIELD(syndrome_value, 0, 1, 0, 5)
  URDMA_WIRE_FIELD(msn, 1, 3, 0, 24)
  static_assert(msn_field::kEnd == kSize);

  constexpr AethType type() const { return aeth_type(syndrome()); }
  constexpr bool is_ack() const { return type() == AethType::kAck; }
  constexpr bool is_rnr_nak() const { return type() == AethType::kRnrNak; }
  constexpr bool is_nak() const { return type() == AethType::kNak; }
  // Meaningful only for the matching type.
  constexpr uint8_t credit_code() const { return syndrome_value(); }
  constexpr uint8_t rnr_timer_code() const { return syndrome_value(); }
  constexpr uint8_t nak_code() const { return syndrome_value(); }
};
using Aeth = BasicAeth<uint8_t>;
using AethView = BasicAeth<const uint8_t>;
static_assert(Aeth::kSize == 4);

// RNR NAK timer (IBA table 45, "Encoding for RNR NAK timer field"): the minimum time
// the requester waits before retrying. Code 0 is the longest, 655.36 ms; 1..31 grow roughly by
// 1.5x / 1.33x from 0.01 ms to 491.52 ms.
inline constexpr uint8_t kRnrTimerCodeCount = 32;
inline constexpr std::array<uint32_t, kRnrTimerCodeCount> kRnrTimerUs = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,    320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240,  15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};
inline constexpr uint64_t rnr_timer_ns(uint8_t code) {
  return uint64_t{kRnrTimerUs[code & kAethValueMask]} * 1000;
}

// ---------------------------------------------------------------------------------------------
// DETH — Datagram Extended Transport Header, 8 bytes (IBA 9.3.2).
template <WireByte Byte>
class BasicDeth {
  URDMA_WIRE_VIEW(BasicDeth, 8)
  URDMA_WIRE_FIELD(qkey, 0, 4, 0, 32)
  URDMA_WIRE_FIELD(resv8, 4, 1, 0, 8)
  URDMA_WIRE_FIELD(src_qp, 5, 3, 0, 24)
  static_assert(src_qp_field::kEnd == kSize);
};
using Deth = BasicDeth<uint8_t>;
using DethView = BasicDeth<const uint8_t>;
static_assert(Deth::kSize == 8);

// IBA 10.2.5 / 13.5.1: the well-known Q_Key of QP1 (GSI), used by CM MADs.
inline constexpr uint32_t kGsiQkey = 0x80010000;
// IBA 10.2.5: a Q_Key with the high-order bit set is "controlled": a UD send WR cannot use it
// directly, the QP's own Q_Key is sent instead.
inline constexpr uint32_t kQkeyControlledBit = 0x80000000;

// ---------------------------------------------------------------------------------------------
// ImmDt — Immediate Data Extended Transport Header, 4 bytes (IBA 9.3.7).
template <WireByte Byte>
class BasicImmDt {
  URDMA_WIRE_VIEW(BasicImmDt, 4)
  URDMA_WIRE_FIELD(imm, 0, 4, 0, 32)
  static_assert(imm_field::kEnd == kSize);
};
using ImmDt = BasicImmDt<uint8_t>;
using ImmDtView = BasicImmDt<const uint8_t>;
static_assert(ImmDt::kSize == 4);

// ---------------------------------------------------------------------------------------------
// IETH — Invalidate Extended Transport Header, 4 bytes (IBA 9.3.8): the R_Key to invalidate.
template <WireByte Byte>
class BasicIeth {
  URDMA_WIRE_VIEW(BasicIeth, 4)
  URDMA_WIRE_FIELD(rkey, 0, 4, 0, 32)
  static_assert(rkey_field::kEnd == kSize);
};
using Ieth = BasicIeth<uint8_t>;
using IethView = BasicIeth<const uint8_t>;
static_assert(Ieth::kSize == 4);

// ---------------------------------------------------------------------------------------------
// XRCETH — XRC Extended Transport Header, 4 bytes (IBA 9.3.x, XRC annex): 8 reserved bits and
// the XRC SRQ number the request is for. Every XRC request carries it right after the BTH;
// responses (ACK, READ response, ATOMIC acknowledge) do not.
template <WireByte Byte>
class BasicXrceth {
  URDMA_WIRE_VIEW(BasicXrceth, 4)
  URDMA_WIRE_FIELD(resv8, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(xrc_srq, 1, 3, 0, 24)
  static_assert(xrc_srq_field::kEnd == kSize);
};
using Xrceth = BasicXrceth<uint8_t>;
using XrcethView = BasicXrceth<const uint8_t>;
static_assert(Xrceth::kSize == 4);
inline constexpr uint32_t kXrcSrqMask = 0xFFFFFF;  // the XRC SRQ number is 24 bits

// ---------------------------------------------------------------------------------------------
// AtomicETH — Atomic Extended Transport Header, 28 bytes (IBA 9.3.4).
template <WireByte Byte>
class BasicAtomicEth {
  URDMA_WIRE_VIEW(BasicAtomicEth, 28)
  URDMA_WIRE_FIELD(va, 0, 8, 0, 64)
  URDMA_WIRE_FIELD(rkey, 8, 4, 0, 32)
  URDMA_WIRE_FIELD(swap_add, 12, 8, 0, 64)  // swap data (CmpSwap) or add data (FetchAdd)
  URDMA_WIRE_FIELD(compare, 20, 8, 0, 64)
  static_assert(compare_field::kEnd == kSize);
};
using AtomicEth = BasicAtomicEth<uint8_t>;
using AtomicEthView = BasicAtomicEth<const uint8_t>;
static_assert(AtomicEth::kSize == 28);

// IBA 9.4.5: atomic operations act on naturally aligned 8-byte words.
inline constexpr size_t kAtomicOperandBytes = 8;

// ---------------------------------------------------------------------------------------------
// AtomicAckETH — Atomic Acknowledge Extended Transport Header, 8 bytes (IBA 9.3.6).
template <WireByte Byte>
class BasicAtomicAckEth {
  URDMA_WIRE_VIEW(BasicAtomicAckEth, 8)
  URDMA_WIRE_FIELD(orig_data, 0, 8, 0, 64)
  static_assert(orig_data_field::kEnd == kSize);
};
using AtomicAckEth = BasicAtomicAckEth<uint8_t>;
using AtomicAckEthView = BasicAtomicAckEth<const uint8_t>;
static_assert(AtomicAckEth::kSize == 8);

// ---------------------------------------------------------------------------------------------
// FETH — FLUSH Extended Transport Header, 4 bytes (IBA 1.5 Memory Placement Extensions; layout
// as Linux rxe_hdr.h): bits 31-6 reserved, 5-4 selectivity level, 3-0 placement type.
enum class FlushSelectivity : uint8_t {
  kMemoryRange = 0,   // flush RETH VA..VA+DMALen of RETH.R_Key
  kMemoryRegion = 1,  // flush everything written to RETH.R_Key; VA and DMALen ignored
};
inline constexpr uint8_t kFlushPlacementGlobalVisibility = 1 << 0;
inline constexpr uint8_t kFlushPlacementPersistence = 1 << 1;

template <WireByte Byte>
class BasicFeth {
  URDMA_WIRE_VIEW(BasicFeth, 4)
  URDMA_WIRE_FIELD(resv, 0, 4, 6, 26)
  URDMA_WIRE_FIELD(selectivity_level, 0, 4, 4, 2)
  URDMA_WIRE_FIELD(placement_type, 0, 4, 0, 4)
  static_assert(placement_type_field::kEnd == kSize);
};
using Feth = BasicFeth<uint8_t>;
using FethView = BasicFeth<const uint8_t>;
static_assert(Feth::kSize == 4);

// ---------------------------------------------------------------------------------------------
// The 16 reserved bytes that follow the BTH of a RoCEv2 CNP (RoCEv2 annex A17.9.2).
inline constexpr size_t kCnpReservedBytes = 16;

// The ICRC that ends every RoCEv2 UDP payload (IBA 7.8.1; RoCEv2 annex A17.4.3.1).
inline constexpr size_t kIcrcSize = 4;

}  // namespace urdma::wire
