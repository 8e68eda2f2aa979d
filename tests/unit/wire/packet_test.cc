// Packet parsing and building: round trips for every opcode, every rejection reason, no read
// outside the datagram, and every RoCEv2 packet of the reference captures of Linux rxe traffic
// checked against the fields tshark decodes.
#include "wire/packet.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "capture/capture.h"
#include "wire/psn.h"

namespace urdma::wire {
namespace {

std::vector<uint8_t> make(uint8_t opcode, size_t payload_len, uint8_t fill = 0xA5) {
  std::vector<uint8_t> payload(payload_len, fill);
  const auto layout = packet_layout(opcode, payload_len);
  EXPECT_TRUE(layout.has_value()) << int{opcode} << " " << payload_len;
  std::vector<uint8_t> buf(layout ? layout->total_length() : 0);
  const auto built = build_packet(buf, opcode, payload);
  EXPECT_TRUE(built.has_value());
  return buf;
}

// A datagram of exactly `size` bytes whose BTH says `opcode` / `pad` (the rest zero).
std::vector<uint8_t> raw(uint8_t opcode, size_t size, uint8_t pad = 0) {
  std::vector<uint8_t> buf(size, 0);
  if (size >= Bth::kSize) {
    Bth b(buf.data());
    b.set_opcode(opcode);
    b.set_pad_count(pad);
  }
  return buf;
}

ParseError error_of(const std::vector<uint8_t>& d, const ParseOptions& o = {}) {
  return parse_packet(d, o).error();
}

// ----- building and parsing back ---------------------------------------------------------------

TEST(Packet, BuildThenParseEveryOpcode) {
  for (unsigned op = 0; op < kOpcodeCount; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (!info.valid) continue;
    SCOPED_TRACE(info.name);
    std::vector<size_t> lengths;
    if (info.exact_payload) {
      lengths = {info.exact_payload};
    } else if (info.is(kPayload)) {
      lengths = {1, 2, 3, 4, 5, 7, 8, 1024, 4096};
      if (!info.is(kPayloadRequired)) lengths.push_back(0);
    } else {
      lengths = {0};
    }
    for (size_t len : lengths) {
      SCOPED_TRACE(len);
      std::vector<uint8_t> payload(len);
      for (size_t i = 0; i < len; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
      std::vector<uint8_t> buf(len + 64, 0xEE);
      const auto built = build_packet(buf, info.opcode, payload);
      ASSERT_TRUE(built.has_value());
      const size_t total = info.header_length + len + pad_for(len) + kIcrcSize;
      ASSERT_EQ(built->datagram.size(), total);
      EXPECT_EQ(total % 4, 0u);
      EXPECT_EQ(built->layout.pad, pad_for(len));
      EXPECT_EQ(built->headers.bth().pad_count(), pad_for(len));
      EXPECT_EQ(built->headers.bth().opcode(), info.opcode);
      // Fill every header through the writable views.
      Bth bth = built->headers.bth();
      bth.set_dest_qp(0xABCDEF);
      bth.set_psn(0xFFFFFF);
      bth.set_pkey(kDefaultPkey);
      bth.set_ack_req(true);
      if (auto r = built->headers.reth()) {
        r->set_va(0x1122334455667788);
        r->set_rkey(0x99AABBCC);
        r->set_dma_length(static_cast<uint32_t>(len));
      }
      if (auto a = built->headers.aeth()) a->set_msn(0x123456);
      if (auto d = built->headers.deth()) d->set_qkey(0x11111111);
      if (auto i = built->headers.immdt()) i->set_imm(0xCAFEF00D);
      if (auto i = built->headers.ieth()) i->set_rkey(0x0BADF00D);
      if (auto a = built->headers.atomic_eth()) a->set_compare(42);
      if (auto a = built->headers.atomic_ack_eth()) a->set_orig_data(43);
      if (auto f = built->headers.feth()) f->set_placement_type(kFlushPlacementPersistence);
      if (auto x = built->headers.xrceth()) x->set_xrc_srq(0xFEDCBA);

      const std::vector<uint8_t> wire(built->datagram.begin(), built->datagram.end());
      const ParseResult p = parse_packet(wire, ParseOptions{.strict_reserved = true});
      ASSERT_TRUE(p.ok()) << parse_error_name(p.error());
      EXPECT_EQ(&p->info(), &info);
      EXPECT_EQ(p->opcode(), info.opcode);
      EXPECT_EQ(p->bth().dest_qp(), 0xABCDEFu);
      EXPECT_EQ(p->bth().psn(), 0xFFFFFFu);
      EXPECT_EQ(p->bth().tver(), 0);
      EXPECT_TRUE(p->bth().ack_req());
      EXPECT_EQ(p->pad_count(), pad_for(len));
      EXPECT_EQ(p->header_length(), info.header_length);
      EXPECT_THAT(std::vector<uint8_t>(p->payload().begin(), p->payload().end()),
                  ::testing::ElementsAreArray(payload));
      EXPECT_EQ(p->icrc(), 0u);  // the slot is left zero for the ICRC module
      EXPECT_EQ(p->reth().has_value(), info.has(Ext::kReth));
      EXPECT_EQ(p->aeth().has_value(), info.has(Ext::kAeth));
      EXPECT_EQ(p->deth().has_value(), info.has(Ext::kDeth));
      EXPECT_EQ(p->immdt().has_value(), info.has(Ext::kImmDt));
      EXPECT_EQ(p->ieth().has_value(), info.has(Ext::kIeth));
      EXPECT_EQ(p->atomic_eth().has_value(), info.has(Ext::kAtomicEth));
      EXPECT_EQ(p->atomic_ack_eth().has_value(), info.has(Ext::kAtomicAckEth));
      EXPECT_EQ(p->feth().has_value(), info.has(Ext::kFeth));
      EXPECT_EQ(p->xrceth().has_value(), info.has(Ext::kXrceth));
      if (p->xrceth()) {
        EXPECT_EQ(p->xrceth()->xrc_srq(), 0xFEDCBAu);
        EXPECT_EQ(p->xrceth()->resv8(), 0u);
        // The XRCETH is the 4 bytes after the BTH, the 24-bit SRQ number big-endian.
        EXPECT_EQ(wire[12], 0);
        EXPECT_EQ(wire[13], 0xFE);
        EXPECT_EQ(wire[14], 0xDC);
        EXPECT_EQ(wire[15], 0xBA);
      }
      if (p->reth()) {
        EXPECT_EQ(p->reth()->va(), 0x1122334455667788u);
        EXPECT_EQ(p->reth()->rkey(), 0x99AABBCCu);
        EXPECT_EQ(p->reth()->dma_length(), len);
      }
      if (p->aeth()) {
        EXPECT_EQ(p->aeth()->msn(), 0x123456u);
      }
      if (p->deth()) {
        EXPECT_EQ(p->deth()->qkey(), 0x11111111u);
      }
      if (p->immdt()) {
        EXPECT_EQ(p->immdt()->imm(), 0xCAFEF00Du);
      }
      if (p->ieth()) {
        EXPECT_EQ(p->ieth()->rkey(), 0x0BADF00Du);
      }
      if (p->atomic_eth()) {
        EXPECT_EQ(p->atomic_eth()->compare(), 42u);
      }
      if (p->atomic_ack_eth()) {
        EXPECT_EQ(p->atomic_ack_eth()->orig_data(), 43u);
      }
      if (p->feth()) {
        EXPECT_EQ(p->feth()->placement_type(), kFlushPlacementPersistence);
      }
      // Nothing was written past the datagram.
      for (size_t i = total; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE) << i;
    }
  }
}

TEST(Packet, XrcethReservedBitsAreRejectedOnlyInStrictMode) {
  std::vector<uint8_t> buf(64);
  auto built = build_packet(buf, op::kXrcSendOnly, std::vector<uint8_t>(4, 7));
  ASSERT_TRUE(built);
  built->headers.xrceth()->set_xrc_srq(5);
  built->headers.xrceth()->set_resv8(1);
  const std::vector<uint8_t> wire(built->datagram.begin(), built->datagram.end());
  const ParseResult lax = parse_packet(wire);
  ASSERT_TRUE(lax.ok());
  EXPECT_EQ(lax->xrceth()->xrc_srq(), 5u);
  EXPECT_EQ(parse_packet(wire, ParseOptions{.strict_reserved = true}).error(),
            ParseError::kReservedBitsSet);
  // An XRC request one word short of its XRCETH is refused, never read past.
  const std::vector<uint8_t> short_one(wire.begin(), wire.begin() + 12 + 4);
  EXPECT_EQ(parse_packet(short_one).error(), ParseError::kTooShortForHeaders);
}

TEST(Packet, BuilderRejectsWhatTheParserWould) {
  std::vector<uint8_t> buf(256);
  const std::vector<uint8_t> four(4, 1), eight(8, 1);
  EXPECT_FALSE(packet_layout(0x15, 0));                // unknown opcode
  EXPECT_FALSE(packet_layout(op::kRcAck, 4));          // no payload on an ACK
  EXPECT_FALSE(packet_layout(op::kRcSendMiddle, 0));   // middle packets carry payload
  EXPECT_FALSE(packet_layout(op::kRcAtomicWrite, 4));  // exactly 8 bytes
  EXPECT_TRUE(packet_layout(op::kRcAtomicWrite, 8));
  EXPECT_TRUE(packet_layout(op::kRcSendOnly, 0));  // zero-length SEND
  EXPECT_FALSE(build_packet(buf, op::kRcAck, four));
  EXPECT_FALSE(build_packet(buf, op::kRcAtomicWrite, four));
  EXPECT_TRUE(build_packet(buf, op::kRcAtomicWrite, eight));
  // A buffer one byte short.
  const auto layout = packet_layout(op::kRcWriteOnlyImm, 5);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->total_length(), 12u + 16 + 4 + 5 + 3 + 4);
  std::vector<uint8_t> small(layout->total_length() - 1);
  const std::vector<uint8_t> five(5, 9);
  EXPECT_FALSE(build_packet(small, op::kRcWriteOnlyImm, five));
  small.resize(layout->total_length());
  EXPECT_TRUE(build_packet(small, op::kRcWriteOnlyImm, five));
}

TEST(Packet, LayoutForScatterGatherSend) {
  // The engine writes headers into one buffer and sends the payload from the application's
  // memory: header | payload (iovec) | trailer.
  const auto layout = packet_layout(op::kRcSendOnlyImm, 13);
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->header_length, 16u);
  EXPECT_EQ(layout->payload_offset(), 16u);
  EXPECT_EQ(layout->pad, 3);
  EXPECT_EQ(layout->pad_offset(), 29u);
  EXPECT_EQ(layout->icrc_offset(), 32u);
  EXPECT_EQ(layout->trailer_length(), 7u);
  EXPECT_EQ(layout->total_length(), 36u);

  std::vector<uint8_t> hdr(layout->header_length, 0xEE), trailer(layout->trailer_length(), 0xEE);
  const PacketHeaders h = write_headers(hdr, *layout);
  h.immdt()->set_imm(7);
  h.bth().set_psn(100);
  write_trailer(trailer, *layout);
  EXPECT_THAT(trailer, ::testing::Each(0));
  std::vector<uint8_t> wire = hdr;
  for (int i = 0; i < 13; ++i) wire.push_back(static_cast<uint8_t>(i));
  wire.insert(wire.end(), trailer.begin(), trailer.end());
  const ParseResult p = parse_packet(wire);
  ASSERT_TRUE(p.ok()) << parse_error_name(p.error());
  EXPECT_EQ(p->payload().size(), 13u);
  EXPECT_EQ(p->payload()[12], 12);
  EXPECT_EQ(p->immdt()->imm(), 7u);
  EXPECT_EQ(p->bth().psn(), 100u);
  // Read-only headers from writable ones.
  const PacketHeadersView ro = h;
  EXPECT_EQ(ro.bth().psn(), 100u);
}

TEST(Packet, PadForLengths) {
  EXPECT_EQ(pad_for(0), 0);
  EXPECT_EQ(pad_for(1), 3);
  EXPECT_EQ(pad_for(2), 2);
  EXPECT_EQ(pad_for(3), 1);
  EXPECT_EQ(pad_for(4), 0);
  EXPECT_EQ(pad_for(4097), 3);
}

// ----- every rejection reason --------------------------------------------------------------------

TEST(ParseErrors, TooShortForBth) {
  for (size_t n = 0; n < Bth::kSize; ++n)
    EXPECT_EQ(error_of(raw(op::kRcSendOnly, n)), ParseError::kTooShortForBth) << n;
}

TEST(ParseErrors, BadTransportVersion) {
  auto d = make(op::kRcSendOnly, 4);
  for (uint8_t v = 1; v < 16; ++v) {
    Bth(d.data()).set_tver(v);
    EXPECT_EQ(error_of(d), ParseError::kBadTransportVersion);
  }
}

TEST(ParseErrors, UnknownOpcode) {
  for (unsigned op = 0; op < kOpcodeCount; ++op) {
    if (opcode_info(static_cast<uint8_t>(op)).valid) continue;
    EXPECT_EQ(error_of(raw(static_cast<uint8_t>(op), 64)), ParseError::kUnknownOpcode) << op;
  }
}

TEST(ParseErrors, TooShortForHeaders) {
  // Each opcode needs its headers and the ICRC; one word short is rejected.
  for (unsigned op = 0; op < kOpcodeCount; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (!info.valid) continue;
    for (size_t n = Bth::kSize; n < info.header_length + kIcrcSize; ++n)
      EXPECT_EQ(error_of(raw(info.opcode, n)), ParseError::kTooShortForHeaders) << info.name << n;
  }
}

TEST(ParseErrors, Misaligned) {
  auto d = make(op::kRcSendOnly, 8);
  d.push_back(0);
  EXPECT_EQ(error_of(d), ParseError::kMisaligned);
  EXPECT_EQ(error_of(raw(op::kRcAck, 22)), ParseError::kMisaligned);
}

TEST(ParseErrors, PadWithoutPayload) {
  for (uint8_t op : {op::kRcAck, op::kRcReadRequest, op::kRcCompareSwap, op::kRcAtomicAck,
                     op::kRcFlush, op::kCnp}) {
    auto d = make(op, 0);
    Bth(d.data()).set_pad_count(1);
    EXPECT_EQ(error_of(d), ParseError::kPadWithoutPayload) << opcode_name(op);
  }
}

TEST(ParseErrors, PadExceedsPayload) {
  // A zero-length SEND Only claiming 1..3 pad bytes.
  for (uint8_t pad = 1; pad <= 3; ++pad) {
    auto d = make(op::kRcSendOnly, 0);
    Bth(d.data()).set_pad_count(pad);
    EXPECT_EQ(error_of(d), ParseError::kPadExceedsPayload);
  }
}

TEST(ParseErrors, PayloadNotAllowed) {
  // An ACK with bytes beyond the AETH.
  EXPECT_EQ(error_of(raw(op::kRcAck, 16 + 4 + 4)), ParseError::kPayloadNotAllowed);
  EXPECT_EQ(error_of(raw(op::kRcReadRequest, 28 + 4 + 8)), ParseError::kPayloadNotAllowed);
  EXPECT_EQ(error_of(raw(op::kRcFetchAdd, 40 + 4 + 4)), ParseError::kPayloadNotAllowed);
  EXPECT_EQ(error_of(raw(op::kCnp, 28 + 4 + 4)), ParseError::kPayloadNotAllowed);
  EXPECT_TRUE(parse_packet(raw(op::kRcAck, 16 + 4)).ok());
}

TEST(ParseErrors, PayloadMissing) {
  for (uint8_t op : {op::kRcSendFirst, op::kRcSendMiddle, op::kRcSendLast, op::kRcWriteFirst,
                     op::kUcWriteMiddle, op::kRcReadResponseLast, op::kRcSendLastInv}) {
    const OpcodeInfo& info = opcode_info(op);
    EXPECT_EQ(error_of(raw(op, info.header_length + kIcrcSize)), ParseError::kPayloadMissing)
        << info.name;
    // A word of pad only is no payload either.
    auto d = raw(op, info.header_length + 4 + kIcrcSize, 3);
    EXPECT_TRUE(parse_packet(d).ok());  // 1 byte + 3 pad
  }
  // Only packets may be empty.
  EXPECT_TRUE(parse_packet(raw(op::kRcSendOnly, 16)).ok());
  EXPECT_TRUE(parse_packet(raw(op::kRcReadResponseOnly, 20)).ok());
  EXPECT_TRUE(parse_packet(raw(op::kUdSendOnly, 24)).ok());
}

TEST(ParseErrors, PayloadLengthInvalid) {
  EXPECT_EQ(error_of(raw(op::kRcAtomicWrite, 28 + 4 + 4)), ParseError::kPayloadLengthInvalid);
  EXPECT_EQ(error_of(raw(op::kRcAtomicWrite, 28 + 16 + 4)), ParseError::kPayloadLengthInvalid);
  EXPECT_EQ(error_of(raw(op::kRcAtomicWrite, 28 + 8 + 4, 1)), ParseError::kPayloadLengthInvalid);
  EXPECT_TRUE(parse_packet(raw(op::kRcAtomicWrite, 28 + 8 + 4)).ok());
}

TEST(ParseErrors, ReservedBitsOnlyInStrictMode) {
  const ParseOptions strict{.strict_reserved = true};
  auto d = make(op::kRcSendOnly, 4);
  EXPECT_TRUE(parse_packet(d, strict).ok());
  Bth(d.data()).set_resv7(1);
  EXPECT_TRUE(parse_packet(d).ok());  // ignored on receipt by default
  EXPECT_EQ(error_of(d, strict), ParseError::kReservedBitsSet);
  Bth(d.data()).set_resv7(0);
  Bth(d.data()).set_resv6(0x20);
  EXPECT_EQ(error_of(d, strict), ParseError::kReservedBitsSet);
  Bth(d.data()).set_resv6(0);
  Bth(d.data()).set_fecn(true);  // FECN/BECN are not reserved
  Bth(d.data()).set_becn(true);
  EXPECT_TRUE(parse_packet(d, strict).ok());

  auto ack = make(op::kRcAck, 0);
  Aeth(ack.data() + 12).set_syndrome_resv(true);
  EXPECT_TRUE(parse_packet(ack).ok());
  EXPECT_EQ(error_of(ack, strict), ParseError::kReservedBitsSet);
  auto ud = make(op::kUdSendOnly, 0);
  Deth(ud.data() + 12).set_resv8(1);
  EXPECT_EQ(error_of(ud, strict), ParseError::kReservedBitsSet);
  auto flush = make(op::kRcFlush, 0);
  Feth(flush.data() + 12).set_resv(1);
  EXPECT_EQ(error_of(flush, strict), ParseError::kReservedBitsSet);
}

TEST(ParseErrors, NamesAreDistinct) {
  std::set<std::string> names;
  for (size_t i = 0; i < kParseErrorCount; ++i) {
    const char* n = parse_error_name(static_cast<ParseError>(i));
    ASSERT_NE(n, nullptr);
    EXPECT_TRUE(names.insert(n).second) << n;
  }
  EXPECT_STREQ(parse_error_name(ParseError::kUnknownOpcode), "unknown opcode");
}

// Every prefix of every valid packet parses or fails cleanly, reading only the prefix (the
// vector is sized exactly, so ASan builds catch any over-read).
TEST(Packet, TruncationNeverReadsPastTheEnd) {
  for (unsigned op = 0; op < kOpcodeCount; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (!info.valid) continue;
    const auto full = make(info.opcode, info.exact_payload  ? info.exact_payload
                                        : info.is(kPayload) ? 9
                                                            : 0);
    for (size_t n = 0; n <= full.size(); ++n) {
      const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
      const ParseResult p = parse_packet(cut);
      if (p.ok()) {
        EXPECT_LE(p->header_length() + p->payload().size() + p->pad_count() + kIcrcSize, n);
        EXPECT_EQ(p->datagram().size(), n);
      }
    }
  }
}

// ----- the reference captures ------------------------------------------------------------------

// One RoCEv2 packet as tshark 4.0 decodes it (`tshark -T fields -e infiniband.bth.opcode ...`);
// 0 where tshark shows no such field, syndrome -1 where there is no AETH. For FetchAdd, va/rkey
// are the AtomicETH's (tshark reports them under the RETH field names).
struct CaptureRow {
  uint64_t frame;
  uint8_t opcode;
  uint32_t dest_qp;
  uint32_t psn;
  bool ack_req;
  uint8_t pad;
  uint64_t va;
  uint32_t rkey;
  uint32_t dma_length;
  int syndrome;
  uint32_t msn;
  uint32_t qkey;
  uint32_t src_qp;
  uint64_t swap_add;
  uint64_t compare;
  uint64_t orig_data;
  uint32_t icrc;
  uint32_t udp_length;  // UDP header + payload
};

// clang-format off
const std::vector<CaptureRow> kRxeToRxe = {
    {1, 0x64, 0x000001, 0, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0xe1785d7f, 288},
    {2, 0x64, 0x000001, 0, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0xc55865d5, 288},
    {3, 0x64, 0x000001, 1, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0xd5d6c11d, 288},
    {4, 0x04, 0x000011, 2323852, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xe9839d77, 40},
    {5, 0x11, 0x000011, 2323852, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0x9752427d, 28},
    {6, 0x0C, 0x000011, 1677274, true, 0, 0x000055d9fe8665f0, 0x000005f8, 64, -1, 0, 0, 0, 0, 0, 0, 0x54436c89, 40},
    {7, 0x10, 0x000011, 1677274, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0x10fd7062, 92},
    {8, 0x04, 0x000011, 1677275, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xd52b0389, 40},
    {9, 0x11, 0x000011, 1677275, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0xcd561c47, 28},
    {10, 0x04, 0x000011, 2323853, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x92a74e47, 40},
    {11, 0x11, 0x000011, 2323853, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0xd109f776, 28},
    {12, 0x0A, 0x000011, 1677276, true, 0, 0x000055d9fe863170, 0x0000046d, 64, -1, 0, 0, 0, 0, 0, 0, 0x551b7cfd, 104},
    {13, 0x11, 0x000011, 1677276, false, 0, 0, 0, 0, 31, 3, 0, 0, 0, 0, 0, 0x19ad291f, 28},
    {14, 0x04, 0x000011, 1677277, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x80ad107a, 40},
    {15, 0x11, 0x000011, 1677277, false, 0, 0, 0, 0, 31, 4, 0, 0, 0, 0, 0, 0x1425e38e, 28},
    {16, 0x04, 0x000011, 2323854, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x9471ef0b, 40},
    {17, 0x11, 0x000011, 2323854, false, 0, 0, 0, 0, 31, 3, 0, 0, 0, 0, 0, 0x6c5fcb95, 28},
    {18, 0x0C, 0x000011, 1677278, true, 0, 0x000055d9fe8665f0, 0x000005f8, 64, -1, 0, 0, 0, 0, 0, 0, 0x21062a52, 40},
    {19, 0x10, 0x000011, 1677278, false, 0, 0, 0, 0, 31, 5, 0, 0, 0, 0, 0, 0xfe60ca12, 92},
    {20, 0x04, 0x000011, 1677279, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xa06e4552, 40},
    {21, 0x11, 0x000011, 1677279, false, 0, 0, 0, 0, 31, 6, 0, 0, 0, 0, 0, 0xa30bb6c9, 28},
    {22, 0x04, 0x000011, 2323855, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xe2572005, 40},
    {23, 0x11, 0x000011, 2323855, false, 0, 0, 0, 0, 31, 4, 0, 0, 0, 0, 0, 0xb897c880, 28},
    {24, 0x0A, 0x000011, 1677280, true, 0, 0x000055d9fe863170, 0x0000046d, 64, -1, 0, 0, 0, 0, 0, 0, 0x2cb99f1c, 104},
    {25, 0x11, 0x000011, 1677280, false, 0, 0, 0, 0, 31, 7, 0, 0, 0, 0, 0, 0x648d87ac, 28},
    {26, 0x04, 0x000011, 1677281, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xec0cb47e, 40},
    {27, 0x11, 0x000011, 1677281, false, 0, 0, 0, 0, 31, 8, 0, 0, 0, 0, 0, 0xbea5c3d2, 28},
    {28, 0x64, 0x000001, 2, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0xecb34b66, 288},
    {29, 0x64, 0x000001, 1, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0x13f7280f, 288},
    {30, 0x04, 0x000012, 5564482, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x18cc0e88, 88},
    {31, 0x11, 0x000012, 5564482, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0x2dd6eedb, 28},
    {32, 0x04, 0x000012, 9673051, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x0125e1c8, 88},
    {33, 0x11, 0x000012, 9673051, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0xe16fe60f, 28},
    {34, 0x04, 0x000012, 5564483, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xb694f79e, 88},
    {35, 0x11, 0x000012, 5564483, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0xc286d29e, 28},
    {36, 0x04, 0x000012, 9673052, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xbb9ee29f, 88},
    {37, 0x11, 0x000012, 9673052, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0xfcdd8858, 28},
    {38, 0x64, 0x000013, 165184, false, 0, 0, 0, 0, -1, 0, 0x11111111, 0x00000013, 0, 0, 0, 0xa0dcae65, 96},
    {39, 0x64, 0x000013, 13930445, false, 0, 0, 0, 0, -1, 0, 0x11111111, 0x00000013, 0, 0, 0, 0xc6e5930c, 96},
    {40, 0x64, 0x000013, 165185, false, 0, 0, 0, 0, -1, 0, 0x11111111, 0x00000013, 0, 0, 0, 0xda94501e, 96},
    {41, 0x64, 0x000013, 13930446, false, 0, 0, 0, 0, -1, 0, 0x11111111, 0x00000013, 0, 0, 0, 0xdb199d05, 96},
    {42, 0x0A, 0x000014, 10393054, true, 0, 0x000055b198dc6000, 0x000007b6, 64, -1, 0, 0, 0, 0, 0, 0, 0xfadf21eb, 104},
    {43, 0x0A, 0x000014, 10393055, true, 0, 0x000055b198dc6040, 0x000007b6, 64, -1, 0, 0, 0, 0, 0, 0, 0x540132c1, 104},
    {44, 0x0A, 0x000014, 10393056, true, 0, 0x000055b198dc6080, 0x000007b6, 64, -1, 0, 0, 0, 0, 0, 0, 0xde37c914, 104},
    {45, 0x0A, 0x000014, 10393057, true, 0, 0x000055b198dc60c0, 0x000007b6, 64, -1, 0, 0, 0, 0, 0, 0, 0x2a156f4b, 104},
    {46, 0x0A, 0x000014, 10393058, true, 0, 0x000055b198dc6100, 0x000007b6, 64, -1, 0, 0, 0, 0, 0, 0, 0xa71f3509, 104},
    {47, 0x11, 0x000014, 10393054, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0xa226af97, 28},
    {48, 0x11, 0x000014, 10393055, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0x01554f7d, 28},
    {49, 0x11, 0x000014, 10393056, false, 0, 0, 0, 0, 31, 3, 0, 0, 0, 0, 0, 0x3b56a2fa, 28},
    {50, 0x11, 0x000014, 10393057, false, 0, 0, 0, 0, 31, 4, 0, 0, 0, 0, 0, 0x81e12f17, 28},
    {51, 0x11, 0x000014, 10393058, false, 0, 0, 0, 0, 31, 5, 0, 0, 0, 0, 0, 0xd99f4615, 28},
    {52, 0x0C, 0x000015, 12281551, true, 0, 0x00005646a8a77000, 0x00000899, 64, -1, 0, 0, 0, 0, 0, 0, 0x4e00dd7a, 40},
    {53, 0x10, 0x000015, 12281551, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 0, 0x260ba80d, 92},
    {54, 0x0C, 0x000015, 12281552, true, 0, 0x00005646a8a77000, 0x00000899, 64, -1, 0, 0, 0, 0, 0, 0, 0x0eeaa1c7, 40},
    {55, 0x10, 0x000015, 12281552, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 0, 0x39d7a211, 92},
    {56, 0x0C, 0x000015, 12281553, true, 0, 0x00005646a8a77000, 0x00000899, 64, -1, 0, 0, 0, 0, 0, 0, 0xded2398a, 40},
    {57, 0x10, 0x000015, 12281553, false, 0, 0, 0, 0, 31, 3, 0, 0, 0, 0, 0, 0x1b9d2675, 92},
    {58, 0x0C, 0x000015, 12281554, true, 0, 0x00005646a8a77000, 0x00000899, 64, -1, 0, 0, 0, 0, 0, 0, 0x605988c2, 40},
    {59, 0x10, 0x000015, 12281554, false, 0, 0, 0, 0, 31, 4, 0, 0, 0, 0, 0, 0x257af6ed, 92},
    {60, 0x0C, 0x000015, 12281555, true, 0, 0x00005646a8a77000, 0x00000899, 64, -1, 0, 0, 0, 0, 0, 0, 0xb061108f, 40},
    {61, 0x10, 0x000015, 12281555, false, 0, 0, 0, 0, 31, 5, 0, 0, 0, 0, 0, 0xe22a75a1, 92},
    {62, 0x14, 0x000016, 9042215, true, 0, 0x0000563cb5d31000, 0x0000091b, 0, -1, 0, 0, 0, 1u, 0u, 0, 0x1c03635b, 52},
    {63, 0x14, 0x000016, 9042216, true, 0, 0x0000563cb5d31040, 0x0000091b, 0, -1, 0, 0, 0, 1u, 0u, 0, 0x963ded02, 52},
    {64, 0x14, 0x000016, 9042217, true, 0, 0x0000563cb5d31080, 0x0000091b, 0, -1, 0, 0, 0, 1u, 0u, 0, 0x3c5e0bf7, 52},
    {65, 0x14, 0x000016, 9042218, true, 0, 0x0000563cb5d310c0, 0x0000091b, 0, -1, 0, 0, 0, 1u, 0u, 0, 0xdef4213b, 52},
    {66, 0x14, 0x000016, 9042219, true, 0, 0x0000563cb5d31100, 0x0000091b, 0, -1, 0, 0, 0, 1u, 0u, 0, 0xb4f3efd9, 52},
    {67, 0x12, 0x000016, 9042215, false, 0, 0, 0, 0, 31, 1, 0, 0, 0, 0, 5860911722318977235u, 0x09bc2eb5, 36},
    {68, 0x12, 0x000016, 9042216, false, 0, 0, 0, 0, 31, 2, 0, 0, 0, 0, 5184228574661725908u, 0x7b0692cf, 36},
    {69, 0x12, 0x000016, 9042217, false, 0, 0, 0, 0, 31, 3, 0, 0, 0, 0, 16281148814153742237u, 0xd7667c1e, 36},
    {70, 0x12, 0x000016, 9042218, false, 0, 0, 0, 0, 31, 4, 0, 0, 0, 0, 8702241970542710418u, 0x9be81a09, 36},
    {71, 0x12, 0x000016, 9042219, false, 0, 0, 0, 0, 31, 5, 0, 0, 0, 0, 18026142174732116307u, 0x9098b852, 36},
};
const std::vector<CaptureRow> kRxeGuestToHost = {
    {1, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x24aa5e35, 88},
    {2, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xc7898100, 88},
    {3, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x27e85b6f, 88},
    {4, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x4ec0f239, 88},
    {5, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x12dd0d69, 88},
    {6, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x98d67b0a, 88},
    {7, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x101fdc43, 88},
    {8, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x3639b847, 88},
    {9, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xa82522e2, 88},
    {10, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x9e5271be, 88},
    {11, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xab6727b8, 88},
    {12, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xf77ad8e8, 88},
    {13, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x7a2f080e, 88},
    {14, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xc215f6af, 88},
    {15, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x5b0db2ce, 88},
    {16, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x990cd73b, 88},
    {17, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x5c096c0a, 88},
    {18, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x6a7e3f56, 88},
    {19, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x1045a402, 88},
    {20, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x5f4b6950, 88},
    {21, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x8b9f3149, 88},
    {22, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0xd782ce19, 88},
    {23, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x33a5cfe8, 88},
    {24, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x88dd3413, 88},
    {25, 0x04, 0x000011, 11481186, true, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0x37e31476, 88},
    {26, 0x64, 0x000011, 6544166, false, 0, 0, 0, 0, -1, 0, 0x11111111, 0x00000012, 0, 0, 0, 0x203e020e, 96},
    {27, 0x64, 0x000001, 0, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0x762bde6a, 288},
    {28, 0x64, 0x000001, 1, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0x9c3c86f6, 288},
    {29, 0x64, 0x000001, 2, true, 0, 0, 0, 0, -1, 0, 0x80010000, 0x00000001, 0, 0, 0, 0x99377bf5, 288},
};
// clang-format on

constexpr uint16_t kRoceV2Port = 4791;
constexpr size_t kUdpHeaderBytes = 8;

void check_capture(const std::string& file, const std::vector<CaptureRow>& rows) {
  std::map<uint64_t, const CaptureRow*> by_frame;
  for (const CaptureRow& r : rows) by_frame[r.frame] = &r;
  size_t seen = 0;
  const std::string error = capture::for_each_udp(
      std::string(URDMA_REFERENCE_DIR) + "/" + file, [&](const capture::UdpDatagram& d) {
        if (d.dst_port != kRoceV2Port) return;
        ++seen;
        SCOPED_TRACE(file + " frame " + std::to_string(d.index));
        ASSERT_FALSE(d.truncated);
        const ParseResult p = parse_packet(d.payload, ParseOptions{.strict_reserved = true});
        ASSERT_TRUE(p.ok()) << parse_error_name(p.error());
        const auto it = by_frame.find(d.index);
        ASSERT_NE(it, by_frame.end());
        const CaptureRow& want = *it->second;
        EXPECT_EQ(d.payload.size(), want.udp_length - kUdpHeaderBytes);
        EXPECT_EQ(p->opcode(), want.opcode);
        EXPECT_EQ(p->bth().dest_qp(), want.dest_qp);
        EXPECT_EQ(p->bth().psn(), want.psn);
        EXPECT_EQ(p->bth().ack_req(), want.ack_req);
        EXPECT_EQ(p->pad_count(), want.pad);
        EXPECT_EQ(p->bth().pkey(), kDefaultPkey);
        EXPECT_EQ(p->bth().tver(), 0);
        EXPECT_EQ(p->icrc(), want.icrc);
        if (auto reth = p->reth()) {
          EXPECT_EQ(reth->va(), want.va);
          EXPECT_EQ(reth->rkey(), want.rkey);
          EXPECT_EQ(reth->dma_length(), want.dma_length);
        }
        if (auto a = p->atomic_eth()) {
          EXPECT_EQ(a->va(), want.va);
          EXPECT_EQ(a->rkey(), want.rkey);
          EXPECT_EQ(a->swap_add(), want.swap_add);
          EXPECT_EQ(a->compare(), want.compare);
        }
        EXPECT_EQ(p->aeth().has_value(), want.syndrome >= 0);
        if (auto aeth = p->aeth()) {
          EXPECT_EQ(aeth->syndrome(), want.syndrome);
          EXPECT_EQ(aeth->msn(), want.msn);
          EXPECT_TRUE(aeth->is_ack());  // Linux rxe: ACK, credits "invalid" (0x1F)
          EXPECT_EQ(aeth->credit_code(), kAethCreditsInvalid);
        }
        EXPECT_EQ(p->deth().has_value(), want.qkey != 0);
        if (auto deth = p->deth()) {
          EXPECT_EQ(deth->qkey(), want.qkey);
          EXPECT_EQ(deth->src_qp(), want.src_qp);
        }
        if (auto ack = p->atomic_ack_eth()) {
          EXPECT_EQ(ack->orig_data(), want.orig_data);
        }
        // Payload = everything between the headers and pad + ICRC.
        EXPECT_EQ(p->payload().size(),
                  d.payload.size() - p->header_length() - p->pad_count() - kIcrcSize);
        // A read or write moves exactly the RETH's DMA length in a single-packet message.
        if (p->info().is(kWrite | kOnly)) {
          EXPECT_EQ(p->payload().size(), want.dma_length);
        }
        // UD CM MADs are 256 bytes.
        if (want.qkey == kGsiQkey) {
          EXPECT_EQ(p->payload().size(), 256u);
        }
      });
  EXPECT_EQ(error, "");
  EXPECT_EQ(seen, rows.size());
}

TEST(ReferenceCaptures, RxeToRxeEveryPacketParses) {
  check_capture("rxe-to-rxe.pcap", kRxeToRxe);
}

TEST(ReferenceCaptures, RxeGuestToHostEveryPacketParses) {
  check_capture("rxe-guest-to-host.pcap", kRxeGuestToHost);
}

TEST(ReferenceCaptures, RdmaWritePayloadIsRpingText) {
  // rxe-to-rxe.pcap frame 12: rping's RDMA WRITE of "rdma-ping-0: ABC..." (64 bytes).
  bool found = false;
  capture::for_each_udp(std::string(URDMA_REFERENCE_DIR) + "/rxe-to-rxe.pcap",
                        [&](const capture::UdpDatagram& d) {
                          if (d.index != 12) return;
                          const ParseResult p = parse_packet(d.payload);
                          ASSERT_TRUE(p.ok());
                          const std::string text(p->payload().begin(), p->payload().begin() + 16);
                          EXPECT_EQ(text, "rdma-ping-0: ABC");
                          EXPECT_EQ(p->payload().size(), 64u);
                          found = true;
                        });
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace urdma::wire
