// The opcode table: every defined opcode's entry, the header lengths Wireshark decodes, and the
// invariants that tie headers to flags.
#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace urdma::wire {
namespace {

struct Expected {
  uint8_t opcode;
  const char* name;
  Transport transport;
  std::vector<Ext> ext;  // wire order
  uint8_t header_length;
};

// IBA 9.2 table 35 / 9.3, IBA 1.5 (FLUSH, ATOMIC WRITE), RoCEv2 annex A17 (CNP), XRC (transport
// bits 101: XRCETH right after the BTH on requests, none on responses). The names are
// those of Wireshark's Info column; the header lengths what tshark decodes (BTH = 12).
const std::vector<Expected>& expected_table() {
  using enum Ext;
  constexpr Transport RC = Transport::kRc, UC = Transport::kUc, UD = Transport::kUd,
                      XRC = Transport::kXrc;
  static const std::vector<Expected> kTable = {
      {0x00, "RC Send First", RC, {}, 12},
      {0x01, "RC Send Middle", RC, {}, 12},
      {0x02, "RC Send Last", RC, {}, 12},
      {0x03, "RC Send Last Immediate", RC, {kImmDt}, 16},
      {0x04, "RC Send Only", RC, {}, 12},
      {0x05, "RC Send Only Immediate", RC, {kImmDt}, 16},
      {0x06, "RC RDMA Write First", RC, {kReth}, 28},
      {0x07, "RC RDMA Write Middle", RC, {}, 12},
      {0x08, "RC RDMA Write Last", RC, {}, 12},
      {0x09, "RC RDMA Write Last Immediate", RC, {kImmDt}, 16},
      {0x0A, "RC RDMA Write Only", RC, {kReth}, 28},
      {0x0B, "RC RDMA Write Only Immediate", RC, {kReth, kImmDt}, 32},
      {0x0C, "RC RDMA Read Request", RC, {kReth}, 28},
      {0x0D, "RC RDMA Read Response First", RC, {kAeth}, 16},
      {0x0E, "RC RDMA Read Response Middle", RC, {}, 12},
      {0x0F, "RC RDMA Read Response Last", RC, {kAeth}, 16},
      {0x10, "RC RDMA Read Response Only", RC, {kAeth}, 16},
      {0x11, "RC Acknowledge", RC, {kAeth}, 16},
      {0x12, "RC Atomic Acknowledge", RC, {kAeth, kAtomicAckEth}, 24},
      {0x13, "RC Compare Swap", RC, {kAtomicEth}, 40},
      {0x14, "RC Fetch Add", RC, {kAtomicEth}, 40},
      {0x16, "RC Send Last Invalidate", RC, {kIeth}, 16},
      {0x17, "RC Send Only Invalidate", RC, {kIeth}, 16},
      {0x1C, "RC Flush", RC, {kFeth, kReth}, 32},
      {0x1D, "RC Atomic Write", RC, {kReth}, 28},
      {0x20, "UC Send First", UC, {}, 12},
      {0x21, "UC Send Middle", UC, {}, 12},
      {0x22, "UC Send Last", UC, {}, 12},
      {0x23, "UC Send Last Immediate", UC, {kImmDt}, 16},
      {0x24, "UC Send Only", UC, {}, 12},
      {0x25, "UC Send Only Immediate", UC, {kImmDt}, 16},
      {0x26, "UC RDMA Write First", UC, {kReth}, 28},
      {0x27, "UC RDMA Write Middle", UC, {}, 12},
      {0x28, "UC RDMA Write Last", UC, {}, 12},
      {0x29, "UC RDMA Write Last Immediate", UC, {kImmDt}, 16},
      {0x2A, "UC RDMA Write Only", UC, {kReth}, 28},
      {0x2B, "UC RDMA Write Only Immediate", UC, {kReth, kImmDt}, 32},
      {0x64, "UD Send Only", UD, {kDeth}, 20},
      {0x65, "UD Send Only Immediate", UD, {kDeth, kImmDt}, 24},
      {0x81, "CNP", Transport::kCnp, {kCnpResv}, 28},
      {0xA0, "XRC Send First", XRC, {kXrceth}, 16},
      {0xA1, "XRC Send Middle", XRC, {kXrceth}, 16},
      {0xA2, "XRC Send Last", XRC, {kXrceth}, 16},
      {0xA3, "XRC Send Last Immediate", XRC, {kXrceth, kImmDt}, 20},
      {0xA4, "XRC Send Only", XRC, {kXrceth}, 16},
      {0xA5, "XRC Send Only Immediate", XRC, {kXrceth, kImmDt}, 20},
      {0xA6, "XRC RDMA Write First", XRC, {kXrceth, kReth}, 32},
      {0xA7, "XRC RDMA Write Middle", XRC, {kXrceth}, 16},
      {0xA8, "XRC RDMA Write Last", XRC, {kXrceth}, 16},
      {0xA9, "XRC RDMA Write Last Immediate", XRC, {kXrceth, kImmDt}, 20},
      {0xAA, "XRC RDMA Write Only", XRC, {kXrceth, kReth}, 32},
      {0xAB, "XRC RDMA Write Only Immediate", XRC, {kXrceth, kReth, kImmDt}, 36},
      {0xAC, "XRC RDMA Read Request", XRC, {kXrceth, kReth}, 32},
      {0xAD, "XRC RDMA Read Response First", XRC, {kAeth}, 16},
      {0xAE, "XRC RDMA Read Response Middle", XRC, {}, 12},
      {0xAF, "XRC RDMA Read Response Last", XRC, {kAeth}, 16},
      {0xB0, "XRC RDMA Read Response Only", XRC, {kAeth}, 16},
      {0xB1, "XRC Acknowledge", XRC, {kAeth}, 16},
      {0xB2, "XRC Atomic Acknowledge", XRC, {kAeth, kAtomicAckEth}, 24},
      {0xB3, "XRC Compare Swap", XRC, {kXrceth, kAtomicEth}, 44},
      {0xB4, "XRC Fetch Add", XRC, {kXrceth, kAtomicEth}, 44},
      {0xB6, "XRC Send Last Invalidate", XRC, {kXrceth, kIeth}, 20},
      {0xB7, "XRC Send Only Invalidate", XRC, {kXrceth, kIeth}, 20},
  };
  return kTable;
}

TEST(OpcodeTable, EveryDefinedOpcodeMatchesTheSpec) {
  for (const Expected& e : expected_table()) {
    SCOPED_TRACE(e.name);
    const OpcodeInfo& info = opcode_info(e.opcode);
    EXPECT_TRUE(info.valid);
    EXPECT_EQ(info.opcode, e.opcode);
    EXPECT_STREQ(info.name, e.name);
    EXPECT_STREQ(opcode_name(e.opcode), e.name);
    EXPECT_EQ(info.transport, e.transport);
    EXPECT_EQ(info.header_length, e.header_length);
    // Headers follow the BTH back to back in the listed order.
    size_t offset = 12;
    ExtMask mask = 0;
    for (Ext x : e.ext) {
      EXPECT_TRUE(info.has(x)) << ext_name(x);
      EXPECT_EQ(info.offset_of(x), offset) << ext_name(x);
      offset += kExtSize[static_cast<size_t>(x)];
      mask |= ext_bit(x);
    }
    EXPECT_EQ(info.ext, mask);
    EXPECT_EQ(offset, info.header_length);
  }
}

TEST(OpcodeTable, EverythingElseIsInvalid) {
  std::set<uint8_t> defined;
  for (const Expected& e : expected_table()) defined.insert(e.opcode);
  int valid = 0;
  for (unsigned i = 0; i < kOpcodeCount; ++i) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(i));
    EXPECT_EQ(info.opcode, i);
    EXPECT_NE(info.name, nullptr);
    if (info.valid) ++valid;
    EXPECT_EQ(info.valid, defined.count(static_cast<uint8_t>(i)) == 1) << i;
    if (!info.valid) {
      EXPECT_EQ(info.ext, 0);
      EXPECT_EQ(info.flags, 0u);
      EXPECT_EQ(info.header_length, 0);
    }
  }
  EXPECT_EQ(valid, 63);
  // Reserved RC 0x15 (RESYNC is RD-only), RD (0x40..), XRC's reserved 0xB5 and its missing
  // FLUSH / ATOMIC WRITE (RC only in IBA 1.5), and CNP 0x80 are not ours.
  EXPECT_FALSE(opcode_info(0x15).valid);
  EXPECT_FALSE(opcode_info(0x44).valid);
  EXPECT_FALSE(opcode_info(0xB5).valid);
  EXPECT_FALSE(opcode_info(0xBC).valid);
  EXPECT_FALSE(opcode_info(0xBD).valid);
  EXPECT_FALSE(opcode_info(0xFF).valid);
}

TEST(OpcodeTable, WiresharkHeaderLengths) {
  EXPECT_EQ(opcode_info(op::kRcSendOnly).header_length, 12 + 0);
  EXPECT_EQ(opcode_info(op::kRcWriteOnly).header_length, 12 + 16);
  EXPECT_EQ(opcode_info(op::kRcReadRequest).header_length, 28);
  EXPECT_EQ(opcode_info(op::kRcAck).header_length, 16);
  EXPECT_EQ(opcode_info(op::kRcAtomicAck).header_length, 12 + 4 + 8);
  EXPECT_EQ(opcode_info(op::kRcFetchAdd).header_length, 12 + 28);
  EXPECT_EQ(opcode_info(op::kUdSendOnly).header_length, 12 + 8);
  EXPECT_EQ(opcode_info(op::kUdSendOnlyImm).header_length, 12 + 8 + 4);
  EXPECT_EQ(opcode_info(op::kRcWriteOnlyImm).offset_of(Ext::kImmDt), 28);
  EXPECT_EQ(opcode_info(op::kRcAtomicAck).offset_of(Ext::kAtomicAckEth), 16);
  EXPECT_EQ(opcode_info(op::kRcFlush).offset_of(Ext::kReth), 16);
}

TEST(OpcodeTable, FlagsAgreeWithHeaders) {
  for (const Expected& e : expected_table()) {
    SCOPED_TRACE(e.name);
    const OpcodeInfo& i = opcode_info(e.opcode);
    // Transport is bits 7-5 of the opcode (IBA 9.2).
    if (i.transport == Transport::kRc) {
      EXPECT_EQ(e.opcode >> 5, 0);
    }
    if (i.transport == Transport::kUc) {
      EXPECT_EQ(e.opcode >> 5, 1);
    }
    if (i.transport == Transport::kUd) {
      EXPECT_EQ(e.opcode >> 5, 3);
    }
    if (i.transport == Transport::kXrc) {
      EXPECT_EQ(e.opcode >> 5, 5);
    }
    // XRCETH iff an XRC request, and then first after the BTH.
    EXPECT_EQ(i.has(Ext::kXrceth), i.transport == Transport::kXrc && i.is(kRequest));
    if (i.has(Ext::kXrceth)) {
      EXPECT_EQ(i.offset_of(Ext::kXrceth), 12);
    }
    // ImmDt iff "with immediate"; IETH iff "with invalidate"; DETH iff UD.
    EXPECT_EQ(i.is(kImm), i.has(Ext::kImmDt));
    EXPECT_EQ(i.is(kInv), i.has(Ext::kIeth));
    EXPECT_EQ(i.transport == Transport::kUd, i.has(Ext::kDeth));
    EXPECT_EQ(std::string(i.name).find("Immediate") != std::string::npos, i.is(kImm));
    // RETH in the first packet of a WRITE, READ requests, FLUSH, ATOMIC WRITE.
    EXPECT_EQ(i.has(Ext::kReth), (i.is(kWrite) && i.is(kFirst)) || i.is(kReadRequest) ||
                                     i.is(kFlush) || i.is(kAtomicWrite));
    // AETH in every response except the READ response middle.
    EXPECT_EQ(i.has(Ext::kAeth), i.is(kResponse) && !i.is(kMiddle));
    EXPECT_EQ(i.has(Ext::kAtomicEth), i.is(kAtomic));
    EXPECT_EQ(i.has(Ext::kAtomicAckEth), i.is(kAtomicAck));
    // Position: exactly one of First/Middle/Last, or Only (= First|Last).
    const bool first = i.is(kFirst), middle = i.is(kMiddle), last = i.is(kLast);
    EXPECT_TRUE((middle && !first && !last) || (!middle && (first || last)));
    EXPECT_EQ(std::string(i.name).find("Only") != std::string::npos,
              first && last && i.any(kSend | kWrite | kReadResponse));
    // Request xor response, except CNP which is neither.
    if (i.transport == Transport::kCnp) {
      EXPECT_FALSE(i.any(kRequest | kResponse));
    } else {
      EXPECT_NE(i.is(kRequest), i.is(kResponse));
    }
    // Payload rules.
    if (i.is(kPayloadRequired)) {
      EXPECT_TRUE(i.is(kPayload));
    }
    EXPECT_EQ(i.is(kPayload), i.any(kSend | kWrite | kReadResponse | kAtomicWrite));
    if (i.is(kPayload) && !(first && last)) {
      EXPECT_TRUE(i.is(kPayloadRequired));
    }
    EXPECT_EQ(i.exact_payload, i.is(kAtomicWrite) ? 8 : 0);
    // Receive WQEs: SEND First/Only and WRITE with immediate consume one; SEND Last/Only and
    // WRITE with immediate complete it.
    EXPECT_EQ(i.is(kConsumesRecv), (i.is(kSend) && first) || (i.is(kWrite) && i.is(kImm)));
    EXPECT_EQ(i.is(kCompletesRecv), (i.is(kSend) && last) || (i.is(kWrite) && i.is(kImm)));
    // Exactly one operation class.
    int classes = 0;
    for (uint32_t f : {kSend, kWrite, kReadRequest, kReadResponse, kAtomic, kAck, kAtomicAck,
                       kFlush, kAtomicWrite, kCongestion})
      classes += i.is(f) ? 1 : 0;
    EXPECT_EQ(classes, 1);
  }
}

TEST(OpcodeTable, UcOpcodesMirrorRc) {
  for (uint8_t rc = op::kRcSendFirst; rc <= op::kRcWriteOnlyImm; ++rc) {
    const OpcodeInfo& r = opcode_info(rc);
    const OpcodeInfo& u = opcode_info(op::kUcPrefix | (rc & op::kOperationMask));
    EXPECT_TRUE(u.valid);
    EXPECT_EQ(u.ext, r.ext);
    EXPECT_EQ(u.flags, r.flags);
    EXPECT_EQ(u.header_length, r.header_length);
    EXPECT_EQ(std::string(u.name).substr(3), std::string(r.name).substr(3));
  }
}

TEST(OpcodeTable, XrcOpcodesMirrorRcWithAnXrcethOnRequests) {
  int mirrored = 0;
  for (unsigned rc = op::kRcSendFirst; rc <= op::kRcSendOnlyInv; ++rc) {
    const OpcodeInfo& r = opcode_info(static_cast<uint8_t>(rc));
    const OpcodeInfo& x = opcode_info(static_cast<uint8_t>(op::kXrcPrefix | rc));
    EXPECT_EQ(x.valid, r.valid) << rc;
    if (!r.valid) continue;
    ++mirrored;
    EXPECT_EQ(op::operation(x.opcode), rc);
    EXPECT_EQ(x.flags, r.flags);
    const bool request = r.is(kRequest);
    EXPECT_EQ(x.ext, r.ext | (request ? ext_bit(Ext::kXrceth) : 0));
    EXPECT_EQ(x.header_length, r.header_length + (request ? Xrceth::kSize : 0));
    // Every RC header sits 4 bytes later on a request: behind the XRCETH.
    for (size_t e = 0; e < kExtCount; ++e)
      if (r.has(static_cast<Ext>(e))) {
        EXPECT_EQ(x.offset[e], r.offset[e] + (request ? 4 : 0)) << ext_name(static_cast<Ext>(e));
      }
    EXPECT_EQ(std::string(x.name).substr(4), std::string(r.name).substr(3));
  }
  EXPECT_EQ(mirrored, 23);
}

TEST(OpcodeTable, NamesAreUnique) {
  std::set<std::string> names;
  for (const Expected& e : expected_table())
    EXPECT_TRUE(names.insert(opcode_name(e.opcode)).second);
}

TEST(OpcodeTable, ExtAndTransportNames) {
  EXPECT_STREQ(ext_name(Ext::kReth), "RETH");
  EXPECT_STREQ(ext_name(Ext::kAtomicAckEth), "AtomicAckETH");
  EXPECT_STREQ(ext_name(Ext::kCnpResv), "CNP reserved");
  EXPECT_STREQ(ext_name(Ext::kXrceth), "XRCETH");
  EXPECT_STREQ(transport_name(Transport::kXrc), "XRC");
  EXPECT_STREQ(transport_name(Transport::kUd), "UD");
  EXPECT_EQ(kExtSize[static_cast<size_t>(Ext::kAtomicEth)], 28);
}

}  // namespace
}  // namespace urdma::wire
