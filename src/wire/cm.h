// Communication Manager messages (IBA Vol. 1, chapter 12 "Communication Management").
//
// Every CM message is a MAD of class CM (0x07), class version 2, method Send, whose attribute ID
// names the message; its fields follow the 24-byte common MAD header. Each message has a view
// over the whole 256-byte MAD (`header()` gives the common header back). Field offsets below are
// written `kCm + N` with N the byte offset the IBA message table gives (relative to the end of
// the MAD header), so each line can be checked against the spec's table — and against Linux's
// include/rdma/ibta_vol1_c12.h, whose table numbers (IBA 1.4) are the ones quoted here.
//
// Private data: every message ends in a fixed-size private-data area (IBA 12.6; Linux
// IB_CM_*_PRIVATE_DATA_SIZE). The wire carries no length: a sender zero-fills what it does not
// use, so `set_private_data` refuses more than the area holds and zero-fills the rest.
//
// parse_cm() validates structure only (length, versions, attribute, method, info lengths);
// whether a value is acceptable (MTU, transport type, LID, ...) is the CM's decision, which it
// reports with a REJ reason.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <variant>

#include "wire/byte_order.h"
#include "wire/mad.h"

// The private-data area of a CM message: `private_data()`, `set_private_data(bytes)`.
#define URDMA_CM_PRIVATE_DATA(OFFSET, SIZE)                                        \
  static constexpr size_t kPrivateDataOffset = OFFSET;                             \
  static constexpr size_t kPrivateDataSize = SIZE;                                 \
  static_assert(kPrivateDataOffset + kPrivateDataSize == ::urdma::wire::kMadSize); \
  constexpr std::span<Byte, SIZE> private_data() const {                           \
    return std::span<Byte, SIZE>(p_ + (OFFSET), SIZE);                             \
  }                                                                                \
  constexpr ::urdma::wire::MadError set_private_data(std::span<const uint8_t> src) \
      const requires(!std::is_const_v<Byte>) {                                     \
    if (src.size() > (SIZE)) return ::urdma::wire::MadError::kPrivateDataTooLong;  \
    std::copy(src.begin(), src.end(), p_ + (OFFSET));                              \
    std::fill(p_ + (OFFSET) + src.size(), p_ + (OFFSET) + (SIZE), uint8_t{0});     \
    return ::urdma::wire::MadError::kOk;                                           \
  }

// A length-prefixed information area (REJ ARI, APR and SIDR_REP additional information):
// `name()` returns the used bytes (length clipped to the area), `name##_area()` the whole area,
// `set_name(bytes)` copies, zero-fills and sets the length field `length`.
#define URDMA_CM_INFO(name, LENGTH, OFFSET, SIZE)                                \
  static constexpr size_t name##_offset = OFFSET;                                \
  static constexpr size_t name##_max = SIZE;                                     \
  constexpr std::span<Byte, SIZE> name##_area() const {                          \
    return std::span<Byte, SIZE>(p_ + (OFFSET), SIZE);                           \
  }                                                                              \
  constexpr std::span<Byte> name() const {                                       \
    return std::span<Byte>(p_ + (OFFSET), std::min<size_t>(LENGTH(), SIZE));     \
  }                                                                              \
  constexpr bool name##_length_ok() const {                                      \
    return LENGTH() <= (SIZE);                                                   \
  }                                                                              \
  constexpr ::urdma::wire::MadError set_##name(std::span<const uint8_t> src)     \
      const requires(!std::is_const_v<Byte>) {                                   \
    if (src.size() > (SIZE)) return ::urdma::wire::MadError::kInfoLengthTooLong; \
    std::copy(src.begin(), src.end(), p_ + (OFFSET));                            \
    std::fill(p_ + (OFFSET) + src.size(), p_ + (OFFSET) + (SIZE), uint8_t{0});   \
    set_##LENGTH(static_cast<uint8_t>(src.size()));                              \
    return ::urdma::wire::MadError::kOk;                                         \
  }

// The common MAD header of a CM message view.
#define URDMA_CM_MESSAGE_VIEW(Class)                             \
  URDMA_WIRE_VIEW(Class, ::urdma::wire::kMadSize)                 \
  constexpr ::urdma::wire::BasicMadHeader<Byte> header() const { \
    return ::urdma::wire::BasicMadHeader<Byte>(p_);              \
  }

namespace urdma::wire {

// Offset of the CM message fields inside the MAD (the IBA message tables count from here).
inline constexpr size_t kCm = kMadHeaderSize;

// IBA 12.6 / Linux ib_cm.h CM_*_ATTR_ID: attribute IDs of the CM class.
enum class CmAttr : uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001A,
};

// "REQ", "SIDR_REP", "ClassPortInfo", ... or "unknown".
std::string_view cm_message_name(uint16_t attribute_id);
// Private-data bytes the message carries (0 for ClassPortInfo and unknown attributes).
size_t cm_private_data_size(uint16_t attribute_id);

// RoCE has no LIDs: Linux writes the permissive LID 0xFFFF into the CM path fields.
inline constexpr uint16_t kCmPermissiveLid = 0xFFFF;
// CM response timeouts, local ACK timeout, target ACK delay and MRA service timeout are all
// 4.096 µs × 2^value (IBA 12.7 field details; chapter 9 for the transport ACK timeout).
inline constexpr uint64_t kCmTimeoutBaseNs = 4096;

// REQ Transport Service Type (IBA 12.7, REQ field details).
enum class CmTransportType : uint8_t { kRc = 0, kUc = 1, kRd = 2, kExtended = 3 };
// REQ Extended Transport Type when the service type is kExtended (IBA Annex A14: XRC).
enum class CmExtendedTransportType : uint8_t { kNone = 0, kXrc = 1 };

// MRA "Message MRAed" and REJ "Message REJected" (Linux enum cm_msg_response).
enum class CmMraMessage : uint8_t { kReq = 0, kRep = 1, kLap = 2 };
enum class CmRejMessage : uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// REP Failover Accepted (IBA 12.7, REP field details).
enum class CmFailover : uint8_t { kAccepted = 0, kNotSupported = 1, kRejected = 2 };

// REJ reason codes (IBA 12.6, table "REJ Reason"; Linux enum ib_cm_rej_reason).
enum class CmRejReason : uint16_t {
  kNoQp = 1,
  kNoEec = 2,
  kNoResources = 3,
  kTimeout = 4,
  kUnsupported = 5,
  kInvalidCommId = 6,
  kInvalidCommInstance = 7,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConn = 10,
  kRdcNotExist = 11,
  kInvalidGid = 12,
  kInvalidLid = 13,
  kInvalidSl = 14,
  kInvalidTrafficClass = 15,
  kInvalidHopLimit = 16,
  kInvalidPacketRate = 17,
  kInvalidAltGid = 18,
  kInvalidAltLid = 19,
  kInvalidAltSl = 20,
  kInvalidAltTrafficClass = 21,
  kInvalidAltHopLimit = 22,
  kInvalidAltPacketRate = 23,
  kPortCmRedirect = 24,
  kPortRedirect = 25,
  kInvalidMtu = 26,
  kInsufficientRespResources = 27,
  kConsumerDefined = 28,
  kInvalidRnrRetry = 29,
  kDuplicateLocalCommId = 30,
  kInvalidClassVersion = 31,
  kInvalidFlowLabel = 32,
  kInvalidAltFlowLabel = 33,
  kVendorOptionNotSupported = 35,
};
// "timeout", "consumer defined", ... or "unknown".
std::string_view cm_rej_reason_name(uint16_t reason);

// SIDR_REP status (IBA 12.11; Linux enum ib_cm_sidr_status).
enum class CmSidrStatus : uint8_t {
  kSuccess = 0,
  kUnsupported = 1,  // service ID not supported
  kReject = 2,
  kNoQp = 3,
  kRedirect = 4,  // additional information holds a ClassPortInfo
  kUnsupportedVersion = 5,
};
std::string_view cm_sidr_status_name(uint8_t status);

// APR AP status (IBA 12.8; Linux enum ib_cm_apr_status).
enum class CmAprStatus : uint8_t {
  kSuccess = 0,
  kInvalidCommId = 1,
  kUnsupported = 2,
  kReject = 3,
  kRedirect = 4,
  kIsCurrent = 5,
  kInvalidQpnEecn = 6,
  kInvalidLid = 7,
  kInvalidGid = 8,
  kInvalidFlowLabel = 9,
  kInvalidTrafficClass = 10,
  kInvalidHopLimit = 11,
  kInvalidPacketRate = 12,
  kInvalidSl = 13,
};

// ClassPortInfo attribute (IBA 13.4.8.1), 72 bytes; the CM's attribute 0x0001 and the
// additional information of a SIDR_REP with status kRedirect.
//   0 BaseVersion  1 ClassVersion  2-3 CapabilityMask  4-7 CapabilityMask2(31:5) RespTimeValue(4:0)
//   8-23 RedirectGID  24-27 RedirectTC(31:24) RedirectSL(23:20) RedirectFL(19:0)
//   28-29 RedirectLID  30-31 RedirectP_Key  32-35 Reserved(31:24) RedirectQP(23:0)
//   36-39 RedirectQ_Key  40-55 TrapGID  56-59 TrapTC TrapSL TrapFL  60-61 TrapLID
//   62-63 TrapP_Key  64-67 TrapHL(31:24) TrapQP(23:0)  68-71 TrapQ_Key
template <WireByte Byte>
class BasicClassPortInfo {
  URDMA_WIRE_VIEW(BasicClassPortInfo, 72)
  URDMA_WIRE_FIELD(base_version, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(class_version, 1, 1, 0, 8)
  URDMA_WIRE_FIELD(capability_mask, 2, 2, 0, 16)
  URDMA_WIRE_FIELD(capability_mask2, 4, 4, 5, 27)
  URDMA_WIRE_FIELD(resp_time_value, 4, 4, 0, 5)
  URDMA_WIRE_BYTES(redirect_gid, 8, 16)
  URDMA_WIRE_FIELD(redirect_tc, 24, 4, 24, 8)
  URDMA_WIRE_FIELD(redirect_sl, 24, 4, 20, 4)
  URDMA_WIRE_FIELD(redirect_fl, 24, 4, 0, 20)
  URDMA_WIRE_FIELD(redirect_lid, 28, 2, 0, 16)
  URDMA_WIRE_FIELD(redirect_p_key, 30, 2, 0, 16)
  URDMA_WIRE_FIELD(redirect_qp, 32, 4, 0, 24)
  URDMA_WIRE_FIELD(redirect_q_key, 36, 4, 0, 32)
  URDMA_WIRE_BYTES(trap_gid, 40, 16)
  URDMA_WIRE_FIELD(trap_tc, 56, 4, 24, 8)
  URDMA_WIRE_FIELD(trap_sl, 56, 4, 20, 4)
  URDMA_WIRE_FIELD(trap_fl, 56, 4, 0, 20)
  URDMA_WIRE_FIELD(trap_lid, 60, 2, 0, 16)
  URDMA_WIRE_FIELD(trap_p_key, 62, 2, 0, 16)
  URDMA_WIRE_FIELD(trap_hl, 64, 1, 0, 8)
  URDMA_WIRE_FIELD(trap_qp, 64, 4, 0, 24)
  URDMA_WIRE_FIELD(trap_q_key, 68, 4, 0, 32)
};
using ClassPortInfo = BasicClassPortInfo<uint8_t>;
using ClassPortInfoView = BasicClassPortInfo<const uint8_t>;
static_assert(ClassPortInfo::trap_q_key_field::kEnd == ClassPortInfo::kSize);

// One path of a REQ (IBA 1.4 Table 106, primary at kCm+52, alternate at kCm+96), 44 bytes:
//   0-1 LocalPortLID  2-3 RemotePortLID  4-19 LocalPortGID  20-35 RemotePortGID
//   36-39 FlowLabel(31:12) Reserved(11:6) PacketRate(5:0)  40 TrafficClass  41 HopLimit
//   42 SL(7:4) SubnetLocal(3) Reserved(2:0)  43 LocalACKTimeout(7:3) ...
// RoCEv2 (IBA Annex A17): Linux writes LIDs 0xFFFF and GIDs = the (IPv4-mapped) IP addresses.
template <WireByte Byte>
class BasicCmReqPath {
  URDMA_WIRE_VIEW(BasicCmReqPath, 44)
  URDMA_WIRE_FIELD(local_port_lid, 0, 2, 0, 16)
  URDMA_WIRE_FIELD(remote_port_lid, 2, 2, 0, 16)
  URDMA_WIRE_BYTES(local_port_gid, 4, 16)
  URDMA_WIRE_BYTES(remote_port_gid, 20, 16)
  URDMA_WIRE_FIELD(flow_label, 36, 4, 12, 20)
  URDMA_WIRE_FIELD(packet_rate, 36, 4, 0, 6)
  URDMA_WIRE_FIELD(traffic_class, 40, 1, 0, 8)
  URDMA_WIRE_FIELD(hop_limit, 41, 1, 0, 8)
  URDMA_WIRE_FIELD(sl, 42, 1, 4, 4)
  URDMA_WIRE_FIELD(subnet_local, 42, 1, 3, 1)
  URDMA_WIRE_FIELD(local_ack_timeout, 43, 1, 3, 5)
};
using CmReqPath = BasicCmReqPath<uint8_t>;
using CmReqPathView = BasicCmReqPath<const uint8_t>;
static_assert(CmReqPath::local_ack_timeout_field::kEnd == CmReqPath::kSize);

// REQ — Connection Request (IBA 1.4 Table 106).
template <WireByte Byte>
class BasicCmReq {
  URDMA_CM_MESSAGE_VIEW(BasicCmReq)
  static constexpr CmAttr kAttr = CmAttr::kReq;
  static constexpr size_t kPrimaryPathOffset = kCm + 52;
  static constexpr size_t kAlternatePathOffset = kCm + 96;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(service_id, kCm + 8, 8, 0, 64)
  URDMA_WIRE_FIELD(local_ca_guid, kCm + 16, 8, 0, 64)
  URDMA_WIRE_FIELD(local_q_key, kCm + 28, 4, 0, 32)
  URDMA_WIRE_FIELD(local_qpn, kCm + 32, 3, 0, 24)
  URDMA_WIRE_FIELD(responder_resources, kCm + 35, 1, 0, 8)
  URDMA_WIRE_FIELD(local_eecn, kCm + 36, 3, 0, 24)
  URDMA_WIRE_FIELD(initiator_depth, kCm + 39, 1, 0, 8)
  URDMA_WIRE_FIELD(remote_eecn, kCm + 40, 3, 0, 24)
  URDMA_WIRE_FIELD(remote_cm_response_timeout, kCm + 43, 1, 3, 5)
  URDMA_WIRE_FIELD(transport_service_type, kCm + 43, 1, 1, 2)
  URDMA_WIRE_FIELD(end_to_end_flow_control, kCm + 43, 1, 0, 1)
  URDMA_WIRE_FIELD(starting_psn, kCm + 44, 3, 0, 24)
  URDMA_WIRE_FIELD(local_cm_response_timeout, kCm + 47, 1, 3, 5)
  URDMA_WIRE_FIELD(retry_count, kCm + 47, 1, 0, 3)
  URDMA_WIRE_FIELD(partition_key, kCm + 48, 2, 0, 16)
  URDMA_WIRE_FIELD(path_packet_payload_mtu, kCm + 50, 1, 4, 4)
  URDMA_WIRE_FIELD(rdc_exists, kCm + 50, 1, 3, 1)
  URDMA_WIRE_FIELD(rnr_retry_count, kCm + 50, 1, 0, 3)
  URDMA_WIRE_FIELD(max_cm_retries, kCm + 51, 1, 4, 4)
  URDMA_WIRE_FIELD(srq, kCm + 51, 1, 3, 1)
  URDMA_WIRE_FIELD(extended_transport_type, kCm + 51, 1, 0, 3)
  // Byte kCm+139 is shared with the alternate path's LocalACKTimeout(7:3).
  URDMA_WIRE_FIELD(sap_supported, kCm + 139, 1, 2, 1)
  URDMA_CM_PRIVATE_DATA(kCm + 140, 92)
  constexpr BasicCmReqPath<Byte> primary_path() const {
    return BasicCmReqPath<Byte>(p_ + kPrimaryPathOffset);
  }
  constexpr BasicCmReqPath<Byte> alternate_path() const {
    return BasicCmReqPath<Byte>(p_ + kAlternatePathOffset);
  }
};
using CmReq = BasicCmReq<uint8_t>;
using CmReqView = BasicCmReq<const uint8_t>;
static_assert(CmReq::kAlternatePathOffset + CmReqPath::kSize == CmReq::kPrivateDataOffset);

// MRA — Message Receipt Acknowledgement (IBA 1.4 Table 107).
template <WireByte Byte>
class BasicCmMra {
  URDMA_CM_MESSAGE_VIEW(BasicCmMra)
  static constexpr CmAttr kAttr = CmAttr::kMra;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(message_mraed, kCm + 8, 1, 6, 2)  // CmMraMessage
  URDMA_WIRE_FIELD(service_timeout, kCm + 9, 1, 3, 5)
  URDMA_CM_PRIVATE_DATA(kCm + 10, 222)
};
using CmMra = BasicCmMra<uint8_t>;
using CmMraView = BasicCmMra<const uint8_t>;

// REJ — Reject (IBA 1.4 Table 108).
template <WireByte Byte>
class BasicCmRej {
  URDMA_CM_MESSAGE_VIEW(BasicCmRej)
  static constexpr CmAttr kAttr = CmAttr::kRej;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(message_rejected, kCm + 8, 1, 6, 2)  // CmRejMessage
  URDMA_WIRE_FIELD(reject_info_length, kCm + 9, 1, 1, 7)
  URDMA_WIRE_FIELD(reason, kCm + 10, 2, 0, 16)  // CmRejReason
  URDMA_CM_INFO(ari, reject_info_length, kCm + 12, 72)
  URDMA_CM_PRIVATE_DATA(kCm + 84, 148)
  constexpr MadError check() const {
    return ari_length_ok() ? MadError::kOk : MadError::kInfoLengthTooLong;
  }
};
using CmRej = BasicCmRej<uint8_t>;
using CmRejView = BasicCmRej<const uint8_t>;

// REP — Reply to Request for Communication (IBA 1.4 Table 110).
template <WireByte Byte>
class BasicCmRep {
  URDMA_CM_MESSAGE_VIEW(BasicCmRep)
  static constexpr CmAttr kAttr = CmAttr::kRep;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(local_q_key, kCm + 8, 4, 0, 32)
  URDMA_WIRE_FIELD(local_qpn, kCm + 12, 3, 0, 24)
  URDMA_WIRE_FIELD(local_eecn, kCm + 16, 3, 0, 24)
  URDMA_WIRE_FIELD(starting_psn, kCm + 20, 3, 0, 24)
  URDMA_WIRE_FIELD(responder_resources, kCm + 24, 1, 0, 8)
  URDMA_WIRE_FIELD(initiator_depth, kCm + 25, 1, 0, 8)
  URDMA_WIRE_FIELD(target_ack_delay, kCm + 26, 1, 3, 5)
  URDMA_WIRE_FIELD(failover_accepted, kCm + 26, 1, 1, 2)  // CmFailover
  URDMA_WIRE_FIELD(end_to_end_flow_control, kCm + 26, 1, 0, 1)
  URDMA_WIRE_FIELD(rnr_retry_count, kCm + 27, 1, 5, 3)
  URDMA_WIRE_FIELD(srq, kCm + 27, 1, 4, 1)
  URDMA_WIRE_FIELD(local_ca_guid, kCm + 28, 8, 0, 64)
  URDMA_CM_PRIVATE_DATA(kCm + 36, 196)
};
using CmRep = BasicCmRep<uint8_t>;
using CmRepView = BasicCmRep<const uint8_t>;

// RTU — Ready To Use (IBA 1.4 Table 111).
template <WireByte Byte>
class BasicCmRtu {
  URDMA_CM_MESSAGE_VIEW(BasicCmRtu)
  static constexpr CmAttr kAttr = CmAttr::kRtu;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_CM_PRIVATE_DATA(kCm + 8, 224)
};
using CmRtu = BasicCmRtu<uint8_t>;
using CmRtuView = BasicCmRtu<const uint8_t>;

// DREQ — Request for Communication Release (IBA 1.4 Table 112).
template <WireByte Byte>
class BasicCmDreq {
  URDMA_CM_MESSAGE_VIEW(BasicCmDreq)
  static constexpr CmAttr kAttr = CmAttr::kDreq;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_qpn_eecn, kCm + 8, 3, 0, 24)
  URDMA_CM_PRIVATE_DATA(kCm + 12, 220)
};
using CmDreq = BasicCmDreq<uint8_t>;
using CmDreqView = BasicCmDreq<const uint8_t>;

// DREP — Reply to Request for Communication Release (IBA 1.4 Table 113).
template <WireByte Byte>
class BasicCmDrep {
  URDMA_CM_MESSAGE_VIEW(BasicCmDrep)
  static constexpr CmAttr kAttr = CmAttr::kDrep;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_CM_PRIVATE_DATA(kCm + 8, 224)
};
using CmDrep = BasicCmDrep<uint8_t>;
using CmDrepView = BasicCmDrep<const uint8_t>;

// SIDR_REQ — Service ID Resolution Request (IBA 1.4 Table 119).
template <WireByte Byte>
class BasicCmSidrReq {
  URDMA_CM_MESSAGE_VIEW(BasicCmSidrReq)
  static constexpr CmAttr kAttr = CmAttr::kSidrReq;
  URDMA_WIRE_FIELD(request_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(partition_key, kCm + 4, 2, 0, 16)
  URDMA_WIRE_FIELD(service_id, kCm + 8, 8, 0, 64)
  URDMA_CM_PRIVATE_DATA(kCm + 16, 216)
};
using CmSidrReq = BasicCmSidrReq<uint8_t>;
using CmSidrReqView = BasicCmSidrReq<const uint8_t>;

// SIDR_REP — Service ID Resolution Response (IBA 1.4 Table 120).
template <WireByte Byte>
class BasicCmSidrRep {
  URDMA_CM_MESSAGE_VIEW(BasicCmSidrRep)
  static constexpr CmAttr kAttr = CmAttr::kSidrRep;
  URDMA_WIRE_FIELD(request_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(status, kCm + 4, 1, 0, 8)  // CmSidrStatus
  URDMA_WIRE_FIELD(additional_information_length, kCm + 5, 1, 0, 8)
  URDMA_WIRE_FIELD(qpn, kCm + 8, 3, 0, 24)
  URDMA_WIRE_FIELD(service_id, kCm + 12, 8, 0, 64)
  URDMA_WIRE_FIELD(q_key, kCm + 20, 4, 0, 32)
  URDMA_CM_INFO(additional_information, additional_information_length, kCm + 24, 72)
  URDMA_CM_PRIVATE_DATA(kCm + 96, 136)
  // With status kRedirect the additional information is a ClassPortInfo (IBA 12.11).
  constexpr BasicClassPortInfo<Byte> class_port_info() const {
    return BasicClassPortInfo<Byte>(additional_information_area());
  }
  constexpr MadError check() const {
    return additional_information_length_ok() ? MadError::kOk : MadError::kInfoLengthTooLong;
  }
};
using CmSidrRep = BasicCmSidrRep<uint8_t>;
using CmSidrRepView = BasicCmSidrRep<const uint8_t>;

// LAP — Load Alternate Path (IBA 1.4 Table 115). Parsed only: urdma does not migrate
// paths and answers a LAP with an APR "unsupported".
//   The alternate path here is laid out differently from the REQ's: FlowLabel(31:12) of
//   kCm+56..59 then TrafficClass at 59, HopLimit 60, PacketRate(5:0) 61, SL/SubnetLocal 62.
template <WireByte Byte>
class BasicCmLap {
  URDMA_CM_MESSAGE_VIEW(BasicCmLap)
  static constexpr CmAttr kAttr = CmAttr::kLap;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_qpn_eecn, kCm + 12, 3, 0, 24)
  URDMA_WIRE_FIELD(remote_cm_response_timeout, kCm + 15, 1, 3, 5)
  URDMA_WIRE_FIELD(alternate_local_port_lid, kCm + 20, 2, 0, 16)
  URDMA_WIRE_FIELD(alternate_remote_port_lid, kCm + 22, 2, 0, 16)
  URDMA_WIRE_BYTES(alternate_local_port_gid, kCm + 24, 16)
  URDMA_WIRE_BYTES(alternate_remote_port_gid, kCm + 40, 16)
  URDMA_WIRE_FIELD(alternate_flow_label, kCm + 56, 4, 12, 20)
  URDMA_WIRE_FIELD(alternate_traffic_class, kCm + 59, 1, 0, 8)
  URDMA_WIRE_FIELD(alternate_hop_limit, kCm + 60, 1, 0, 8)
  URDMA_WIRE_FIELD(alternate_packet_rate, kCm + 61, 1, 0, 6)
  URDMA_WIRE_FIELD(alternate_sl, kCm + 62, 1, 4, 4)
  URDMA_WIRE_FIELD(alternate_subnet_local, kCm + 62, 1, 3, 1)
  URDMA_WIRE_FIELD(alternate_local_ack_timeout, kCm + 63, 1, 3, 5)
  URDMA_CM_PRIVATE_DATA(kCm + 64, 168)
};
using CmLap = BasicCmLap<uint8_t>;
using CmLapView = BasicCmLap<const uint8_t>;

// APR — Alternate Path Response (IBA 1.4 Table 116). Parsed, and built by the CM to
// answer a LAP with AP status kUnsupported.
template <WireByte Byte>
class BasicCmApr {
  URDMA_CM_MESSAGE_VIEW(BasicCmApr)
  static constexpr CmAttr kAttr = CmAttr::kApr;
  URDMA_WIRE_FIELD(local_comm_id, kCm + 0, 4, 0, 32)
  URDMA_WIRE_FIELD(remote_comm_id, kCm + 4, 4, 0, 32)
  URDMA_WIRE_FIELD(additional_information_length, kCm + 8, 1, 0, 8)
  URDMA_WIRE_FIELD(ap_status, kCm + 9, 1, 0, 8)  // CmAprStatus
  URDMA_CM_INFO(additional_information, additional_information_length, kCm + 12, 72)
  URDMA_CM_PRIVATE_DATA(kCm + 84, 148)
  constexpr MadError check() const {
    return additional_information_length_ok() ? MadError::kOk : MadError::kInfoLengthTooLong;
  }
};
using CmApr = BasicCmApr<uint8_t>;
using CmAprView = BasicCmApr<const uint8_t>;

// The CM's ClassPortInfo as a whole MAD (attribute 0x0001, method Get / Set / GetResp).
template <WireByte Byte>
class BasicCmClassPortInfo {
  URDMA_CM_MESSAGE_VIEW(BasicCmClassPortInfo)
  static constexpr CmAttr kAttr = CmAttr::kClassPortInfo;
  static constexpr size_t kPrivateDataSize = 0;
  constexpr BasicClassPortInfo<Byte> info() const { return BasicClassPortInfo<Byte>(p_ + kCm); }
};
using CmClassPortInfo = BasicCmClassPortInfo<uint8_t>;
using CmClassPortInfoView = BasicCmClassPortInfo<const uint8_t>;

// A parsed CM message: which one, and its read-only view.
using CmView =
    std::variant<CmClassPortInfoView, CmReqView, CmMraView, CmRejView, CmRepView, CmRtuView,
                 CmDreqView, CmDrepView, CmSidrReqView, CmSidrRepView, CmLapView, CmAprView>;
struct CmMessage {
  CmAttr attr = CmAttr::kClassPortInfo;
  MadHeaderView header;
  CmView view;
};

// `message` is meaningful only when ok(); on error its views are null.
struct CmParse {
  MadError error = MadError::kOk;
  CmMessage message;
  constexpr bool ok() const { return error == MadError::kOk; }
};

// Parses a MAD received on QP1 as a CM message: parse_mad's checks, then the attribute (one of
// CmAttr), the method (Send for messages; Get/Set/GetResp for ClassPortInfo) and the
// information length of REJ, APR and SIDR_REP (at most 72 bytes).
CmParse parse_cm(std::span<const uint8_t> mad);

// Starts a CM message in `mad`: zeroes it, writes the common header (method Send, or Get for
// ClassPortInfo) and returns the typed view. Fields are then set through the view.
template <typename View>
View init_cm_message(std::span<uint8_t, kMadSize> mad, uint64_t transaction_id) {
  const MadMethod method =
      View::kAttr == CmAttr::kClassPortInfo ? MadMethod::kGet : MadMethod::kSend;
  init_cm_mad(mad, method, static_cast<uint16_t>(View::kAttr), transaction_id);
  return View(mad);
}

}  // namespace urdma::wire
