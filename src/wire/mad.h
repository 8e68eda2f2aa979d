// Management datagrams (MADs) as the Communication Manager uses them (IBA Vol. 1, chapter 13.4).
//
// A MAD is the 256-byte payload of a UD SEND to QP1 (the GSI): a 24-byte common MAD header
// followed by 232 bytes of class data. urdma speaks one management class on QP1, the CM
// (class 0x07, class version 2); its messages live in cm.h. This file holds the common header,
// the method / class / status vocabularies and the one error type of the MAD and CM parsers.
//
// Views follow byte_order.h: `template <WireByte Byte> class BasicX` with the aliases
// `X = BasicX<uint8_t>` (read/write) and `XView = BasicX<const uint8_t>` (read-only). A view
// never checks bounds; parse_mad / parse_cm (or a fixed-extent span) guarantee its size.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "wire/byte_order.h"

namespace urdma::wire {

// IBA 13.4.1: every MAD the GSI carries is exactly 256 bytes.
inline constexpr size_t kMadSize = 256;
// IBA 13.4.2 (MAD format): the common MAD header is 24 bytes.
inline constexpr size_t kMadHeaderSize = 24;
// The class data that follows the common header (CM messages: IBA 12.6).
inline constexpr size_t kMadDataSize = kMadSize - kMadHeaderSize;
static_assert(kMadDataSize == 232);

// IBA 13.4.2: BaseVersion of every MAD format this spec defines.
inline constexpr uint8_t kMadBaseVersion = 1;
// IBA 13.4.4 (management classes): the Communication Manager's class.
inline constexpr uint8_t kMgmtClassCm = 0x07;
// CM class version: 2 is what the IBA 1.2+ CM and Linux ib_cm (IB_CM_CLASS_VERSION) speak.
inline constexpr uint8_t kCmClassVersion = 2;
// IBA 13.5.1: the GSI is QP1, addressed with the well-known GSI Q_Key 0x80010000.
inline constexpr uint32_t kMadGsiQpn = 1;
inline constexpr uint32_t kMadGsiQKey = 0x80010000;

// IBA 13.4.5 (common MAD methods). Bit 7 is the R (response) bit.
enum class MadMethod : uint8_t {
  kGet = 0x01,
  kSet = 0x02,
  kSend = 0x03,
  kTrap = 0x05,
  kReport = 0x06,
  kTrapRepress = 0x07,
  kGetResp = 0x81,
  kReportResp = 0x86,
};
inline constexpr uint8_t kMadMethodResponseBit = 0x80;

// IBA 13.4.7 (MAD common status field; Linux IB_MGMT_MAD_STATUS_*). Bits 2-4 hold the
// invalid-field code; bits 8-15 are class specific.
inline constexpr uint16_t kMadStatusSuccess = 0x0000;
inline constexpr uint16_t kMadStatusBusy = 0x0001;
inline constexpr uint16_t kMadStatusRedirectRequired = 0x0002;
inline constexpr uint16_t kMadStatusBadVersion = 1 << 2;             // base or class version
inline constexpr uint16_t kMadStatusUnsupportedMethod = 2 << 2;      // method not supported
inline constexpr uint16_t kMadStatusUnsupportedMethodAttr = 3 << 2;  // method/attribute combination
inline constexpr uint16_t kMadStatusInvalidAttrValue = 7 << 2;       // field of attribute/modifier

// Why a MAD or CM message was not accepted (and, for the setters, why a value did not fit).
enum class MadError : uint8_t {
  kOk = 0,
  kWrongLength,              // IBA 13.4.1: a MAD is exactly kMadSize bytes
  kBadBaseVersion,           // IBA 13.4.2: BaseVersion != 1
  kUnknownClass,             // a management class urdma does not implement (only the CM)
  kUnsupportedClassVersion,  // IBA 13.4.2: ClassVersion this class does not speak
  kUnknownAttribute,         // attribute ID not defined for the class
  kUnsupportedMethod,        // method not allowed with this attribute (IBA 12.6.1: CM uses Send)
  kInfoLengthTooLong,        // REJ ARI / APR / SIDR_REP additional information length > 72
  kPrivateDataTooLong,       // setter: more private data than the message carries (IBA 12.6)
};

// "wrong length", ... for logs; and the MAD status a responder would report for it (IBA 13.4.7).
std::string_view mad_error_name(MadError e);
uint16_t mad_error_status(MadError e);

// Name of a management class ("CM", "SubnAdm", ...) or "unknown".
std::string_view mad_class_name(uint8_t mgmt_class);
// Name of a method ("Get", "GetResp", "Send", ...) or "unknown".
std::string_view mad_method_name(uint8_t method);

// IBA 13.4.2 — the 24-byte common MAD header.
//   byte 0      BaseVersion
//   byte 1      MgmtClass
//   byte 2      ClassVersion
//   byte 3      R(7) Method(6:0)        (method() returns the whole byte: GetResp = 0x81)
//   bytes 4-5   Status
//   bytes 6-7   ClassSpecific
//   bytes 8-15  TransactionID
//   bytes 16-17 AttributeID
//   bytes 18-19 Reserved
//   bytes 20-23 AttributeModifier
template <WireByte Byte>
class BasicMadHeader {
  URDMA_WIRE_VIEW(BasicMadHeader, kMadHeaderSize)
  URDMA_WIRE_FIELD(base_version, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(mgmt_class, 1, 1, 0, 8)
  URDMA_WIRE_FIELD(class_version, 2, 1, 0, 8)
  URDMA_WIRE_FIELD(method, 3, 1, 0, 8)
  URDMA_WIRE_FIELD(r, 3, 1, 7, 1)
  URDMA_WIRE_FIELD(status, 4, 2, 0, 16)
  URDMA_WIRE_FIELD(class_specific, 6, 2, 0, 16)
  URDMA_WIRE_FIELD(transaction_id, 8, 8, 0, 64)
  URDMA_WIRE_FIELD(attribute_id, 16, 2, 0, 16)
  URDMA_WIRE_FIELD(reserved, 18, 2, 0, 16)
  URDMA_WIRE_FIELD(attribute_modifier, 20, 4, 0, 32)
};
using MadHeader = BasicMadHeader<uint8_t>;
using MadHeaderView = BasicMadHeader<const uint8_t>;
static_assert(MadHeader::attribute_modifier_field::kEnd == kMadHeaderSize);

// Result of parse_mad: on success `header` views the first 24 bytes of the MAD; on error it
// is null.
struct MadParse {
  MadError error = MadError::kOk;
  MadHeaderView header;
  constexpr bool ok() const { return error == MadError::kOk; }
};

// Checks what the common header alone decides: length, base version, class (the CM), class
// version. The attribute is the class's business (parse_cm).
MadParse parse_mad(std::span<const uint8_t> mad);

// Zeroes `mad` and writes a common header: base version 1, the CM class and class version,
// `method`, status 0, `attribute_id`, `transaction_id`, attribute modifier 0.
MadHeader init_cm_mad(std::span<uint8_t, kMadSize> mad, MadMethod method, uint16_t attribute_id,
                      uint64_t transaction_id);

}  // namespace urdma::wire
