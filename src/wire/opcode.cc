#include "wire/opcode.h"

#include <initializer_list>

namespace urdma::wire {
namespace {

// One row per defined opcode: the extension headers in wire order and the flags. Offsets and
// lengths are computed from the header sizes, never written by hand.
struct Row {
  uint8_t opcode;
  const char* name;
  Transport transport;
  std::initializer_list<Ext> ext;  // in the order they follow the BTH
  uint32_t flags;
  uint8_t exact_payload = 0;
};

// Message position and payload rules (IBA 9.5, packet sequences): First and Middle packets carry
// exactly PMTU bytes and a Last packet 1..PMTU, so all three carry payload; only an Only
// packet may be empty.
constexpr uint32_t kSendFirst = kPayload | kPayloadRequired | kFirst | kRequest | kSend;
constexpr uint32_t kSendMiddle = kPayload | kPayloadRequired | kMiddle | kRequest | kSend;
constexpr uint32_t kSendLast = kPayload | kPayloadRequired | kLast | kRequest | kSend;
constexpr uint32_t kSendOnly = kPayload | kOnly | kRequest | kSend;
constexpr uint32_t kWriteFirst = kPayload | kPayloadRequired | kFirst | kRequest | kWrite;
constexpr uint32_t kWriteMiddle = kPayload | kPayloadRequired | kMiddle | kRequest | kWrite;
constexpr uint32_t kWriteLast = kPayload | kPayloadRequired | kLast | kRequest | kWrite;
constexpr uint32_t kWriteOnly = kPayload | kOnly | kRequest | kWrite;
constexpr uint32_t kRecvAll = kConsumesRecv | kCompletesRecv;

constexpr Transport RC = Transport::kRc;
constexpr Transport UC = Transport::kUc;
constexpr Transport UD = Transport::kUd;
using enum Ext;

// IBA 9.2 table 35 (OpCode field) and 9.3 (which headers each packet type carries).
// Names follow Wireshark's InfiniBand dissector (its Info column).
constexpr Row kRows[] = {
    // Reliable Connection.
    {op::kRcSendFirst, "RC Send First", RC, {}, kSendFirst | kConsumesRecv},
    {op::kRcSendMiddle, "RC Send Middle", RC, {}, kSendMiddle},
    {op::kRcSendLast, "RC Send Last", RC, {}, kSendLast | kCompletesRecv},
    {op::kRcSendLastImm, "RC Send Last Immediate", RC, {kImmDt}, kSendLast | kImm | kCompletesRecv},
    {op::kRcSendOnly, "RC Send Only", RC, {}, kSendOnly | kRecvAll},
    {op::kRcSendOnlyImm, "RC Send Only Immediate", RC, {kImmDt}, kSendOnly | kImm | kRecvAll},
    {op::kRcWriteFirst, "RC RDMA Write First", RC, {kReth}, kWriteFirst},
    {op::kRcWriteMiddle, "RC RDMA Write Middle", RC, {}, kWriteMiddle},
    {op::kRcWriteLast, "RC RDMA Write Last", RC, {}, kWriteLast},
    {op::kRcWriteLastImm,
     "RC RDMA Write Last Immediate",
     RC,
     {kImmDt},
     kWriteLast | kImm | kRecvAll},
    {op::kRcWriteOnly, "RC RDMA Write Only", RC, {kReth}, kWriteOnly},
    {op::kRcWriteOnlyImm,
     "RC RDMA Write Only Immediate",
     RC,
     {kReth, kImmDt},
     kWriteOnly | kImm | kRecvAll},
    {op::kRcReadRequest, "RC RDMA Read Request", RC, {kReth}, kOnly | kRequest | kReadRequest},
    {op::kRcReadResponseFirst,
     "RC RDMA Read Response First",
     RC,
     {kAeth},
     kPayload | kPayloadRequired | kFirst | kResponse | kReadResponse},
    {op::kRcReadResponseMiddle,
     "RC RDMA Read Response Middle",
     RC,
     {},
     kPayload | kPayloadRequired | kMiddle | kResponse | kReadResponse},
    {op::kRcReadResponseLast,
     "RC RDMA Read Response Last",
     RC,
     {kAeth},
     kPayload | kPayloadRequired | kLast | kResponse | kReadResponse},
    {op::kRcReadResponseOnly,
     "RC RDMA Read Response Only",
     RC,
     {kAeth},
     kPayload | kOnly | kResponse | kReadResponse},
    {op::kRcAck, "RC Acknowledge", RC, {kAeth}, kOnly | kResponse | kAck},
    {op::kRcAtomicAck,
     "RC Atomic Acknowledge",
     RC,
     {kAeth, kAtomicAckEth},
     kOnly | kResponse | kAtomicAck},
    {op::kRcCompareSwap, "RC Compare Swap", RC, {kAtomicEth}, kOnly | kRequest | kAtomic},
    {op::kRcFetchAdd, "RC Fetch Add", RC, {kAtomicEth}, kOnly | kRequest | kAtomic},
    {op::kRcSendLastInv, "RC Send Last Invalidate", RC, {kIeth}, kSendLast | kInv | kCompletesRecv},
    {op::kRcSendOnlyInv, "RC Send Only Invalidate", RC, {kIeth}, kSendOnly | kInv | kRecvAll},
    // IBA 1.5 memory placement extensions; FLUSH carries no payload (oA19-2), ATOMIC WRITE
    // exactly the 8-byte operand.
    {op::kRcFlush, "RC Flush", RC, {kFeth, kReth}, kOnly | kRequest | kFlush},
    {op::kRcAtomicWrite,
     "RC Atomic Write",
     RC,
     {kReth},
     kPayload | kPayloadRequired | kOnly | kRequest | kAtomicWrite,
     kAtomicOperandBytes},
    // Unreliable Connection: the SEND and RDMA WRITE subset of RC.
    {op::kUcSendFirst, "UC Send First", UC, {}, kSendFirst | kConsumesRecv},
    {op::kUcSendMiddle, "UC Send Middle", UC, {}, kSendMiddle},
    {op::kUcSendLast, "UC Send Last", UC, {}, kSendLast | kCompletesRecv},
    {op::kUcSendLastImm, "UC Send Last Immediate", UC, {kImmDt}, kSendLast | kImm | kCompletesRecv},
    {op::kUcSendOnly, "UC Send Only", UC, {}, kSendOnly | kRecvAll},
    {op::kUcSendOnlyImm, "UC Send Only Immediate", UC, {kImmDt}, kSendOnly | kImm | kRecvAll},
    {op::kUcWriteFirst, "UC RDMA Write First", UC, {kReth}, kWriteFirst},
    {op::kUcWriteMiddle, "UC RDMA Write Middle", UC, {}, kWriteMiddle},
    {op::kUcWriteLast, "UC RDMA Write Last", UC, {}, kWriteLast},
    {op::kUcWriteLastImm,
     "UC RDMA Write Last Immediate",
     UC,
     {kImmDt},
     kWriteLast | kImm | kRecvAll},
    {op::kUcWriteOnly, "UC RDMA Write Only", UC, {kReth}, kWriteOnly},
    {op::kUcWriteOnlyImm,
     "UC RDMA Write Only Immediate",
     UC,
     {kReth, kImmDt},
     kWriteOnly | kImm | kRecvAll},
    // Unreliable Datagram: single-packet SENDs with a DETH.
    {op::kUdSendOnly, "UD Send Only", UD, {kDeth}, kSendOnly | kRecvAll},
    {op::kUdSendOnlyImm,
     "UD Send Only Immediate",
     UD,
     {kDeth, kImmDt},
     kSendOnly | kImm | kRecvAll},
    // RoCEv2 annex A17.9.2: BTH + 16 reserved bytes + ICRC.
    {op::kCnp, "CNP", Transport::kCnp, {kCnpResv}, kOnly | kCongestion},
};

// XRC (IBA 9.2 table 35, transport bits 101): RC's operations, FLUSH and ATOMIC WRITE excepted;
// a request carries the XRCETH right after the BTH, before its RETH, AtomicETH, ImmDt or IETH
// (IBA 9.3, XRC annex); a response carries none. Names as Wireshark prints them, by operation.
constexpr const char* kXrcNames[op::kOperationMask + 1] = {
    "XRC Send First",
    "XRC Send Middle",
    "XRC Send Last",
    "XRC Send Last Immediate",
    "XRC Send Only",
    "XRC Send Only Immediate",
    "XRC RDMA Write First",
    "XRC RDMA Write Middle",
    "XRC RDMA Write Last",
    "XRC RDMA Write Last Immediate",
    "XRC RDMA Write Only",
    "XRC RDMA Write Only Immediate",
    "XRC RDMA Read Request",
    "XRC RDMA Read Response First",
    "XRC RDMA Read Response Middle",
    "XRC RDMA Read Response Last",
    "XRC RDMA Read Response Only",
    "XRC Acknowledge",
    "XRC Atomic Acknowledge",
    "XRC Compare Swap",
    "XRC Fetch Add",
    nullptr,
    "XRC Send Last Invalidate",
    "XRC Send Only Invalidate",
};

constexpr void fill(OpcodeInfo& info, const Row& row, uint8_t opcode, const char* name,
                    Transport transport, bool xrceth) {
  info.opcode = opcode;
  info.name = name;
  info.valid = true;
  info.transport = transport;
  info.flags = row.flags;
  info.exact_payload = row.exact_payload;
  size_t offset = Bth::kSize;
  const auto add = [&](Ext e) {
    info.ext |= ext_bit(e);
    info.offset[static_cast<size_t>(e)] = static_cast<uint8_t>(offset);
    offset += kExtSize[static_cast<size_t>(e)];
  };
  if (xrceth) add(kXrceth);
  for (Ext e : row.ext) add(e);
  info.header_length = static_cast<uint8_t>(offset);
}

constexpr std::array<OpcodeInfo, kOpcodeCount> build_table() {
  std::array<OpcodeInfo, kOpcodeCount> table{};
  for (size_t i = 0; i < kOpcodeCount; ++i) {
    table[i].name = "Unknown";
    table[i].opcode = static_cast<uint8_t>(i);
  }
  for (const Row& row : kRows) {
    fill(table[row.opcode], row, row.opcode, row.name, row.transport, false);
    if (row.transport != RC || row.opcode == op::kRcFlush || row.opcode == op::kRcAtomicWrite)
      continue;
    const uint8_t xrc = op::kXrcPrefix | op::operation(row.opcode);
    fill(table[xrc], row, xrc, kXrcNames[op::operation(row.opcode)], Transport::kXrc,
         (row.flags & kRequest) != 0);
  }
  return table;
}

}  // namespace

constinit const std::array<OpcodeInfo, kOpcodeCount> kOpcodeTable = build_table();

// Spot checks against the header lengths Wireshark decodes (BTH 12 + extension headers).
static_assert(build_table()[op::kRcSendOnly].header_length == 12);
static_assert(build_table()[op::kRcWriteOnly].header_length == 12 + 16);
static_assert(build_table()[op::kRcWriteOnlyImm].header_length == 12 + 16 + 4);
static_assert(build_table()[op::kRcReadRequest].header_length == 28);
static_assert(build_table()[op::kRcAck].header_length == 16);
static_assert(build_table()[op::kRcAtomicAck].header_length == 12 + 4 + 8);
static_assert(build_table()[op::kRcFetchAdd].header_length == 12 + 28);
static_assert(build_table()[op::kUdSendOnly].header_length == 12 + 8);
static_assert(build_table()[op::kUdSendOnlyImm].header_length == 12 + 8 + 4);
static_assert(build_table()[op::kRcFlush].header_length == 12 + 4 + 16);
static_assert(build_table()[op::kXrcSendOnly].header_length == 12 + 4);
static_assert(build_table()[op::kXrcWriteOnly].header_length == 12 + 4 + 16);
static_assert(build_table()[op::kXrcFetchAdd].header_length == 12 + 4 + 28);
static_assert(build_table()[op::kXrcAck].header_length == 12 + 4);
static_assert(build_table()[op::kXrcAtomicAck].header_length == 12 + 4 + 8);
static_assert(!build_table()[op::kXrcPrefix | op::kRcFlush].valid);
static_assert(!build_table()[op::kXrcPrefix | op::kRcAtomicWrite].valid);

const char* transport_name(Transport t) {
  constexpr const char* kNames[] = {"none", "RC", "UC", "UD", "CNP", "XRC"};
  return kNames[static_cast<size_t>(t)];
}

const char* ext_name(Ext e) {
  constexpr const char* kNames[kExtCount] = {
      "RETH", "AETH", "DETH", "ImmDt", "IETH", "AtomicETH", "AtomicAckETH", "FETH", "CNP reserved",
      "XRCETH"};
  return e < Ext::kCount ? kNames[static_cast<size_t>(e)] : "?";
}

}  // namespace urdma::wire
