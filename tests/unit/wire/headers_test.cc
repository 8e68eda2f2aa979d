// Header views: every field lands on the bits the spec's layout gives it (hand-written byte
// arrays from IBA 9.2/9.3), round trips, boundary values, AETH syndrome helpers, GRH forms.
#include "wire/headers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "wire/grh.h"

namespace urdma::wire {
namespace {

using ::testing::ElementsAreArray;

// Sets one field to all ones in an otherwise zero header and returns the bytes.
template <typename View, size_t N = View::kSize, typename Fn>
std::array<uint8_t, N> ones(Fn set) {
  std::array<uint8_t, N> buf{};
  set(View(buf.data()));
  return buf;
}

// ----- BTH -------------------------------------------------------------------------------------

TEST(Bth, EachFieldLandsOnItsBits) {
  using A = std::array<uint8_t, 12>;
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_opcode(0xFF); }),
            (A{0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_se(true); }), (A{0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_m(true); }), (A{0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_pad_count(3); }),
            (A{0, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_tver(0xF); }), (A{0, 0x0F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_pkey(0xFFFF); }),
            (A{0, 0, 0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_fecn(true); }), (A{0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_becn(true); }), (A{0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_resv6(0x3F); }),
            (A{0, 0, 0, 0, 0x3F, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_dest_qp(0xFFFFFF); }),
            (A{0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_ack_req(true); }),
            (A{0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_resv7(0x7F); }),
            (A{0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 0, 0, 0}));
  EXPECT_EQ(ones<Bth>([](Bth b) { b.set_psn(0xFFFFFF); }),
            (A{0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF}));
}

TEST(Bth, SetterMasksOversizedValues) {
  std::array<uint8_t, 12> buf{};
  Bth b(buf.data());
  b.set_dest_qp(0x01ABCDEF);  // only 24 bits fit
  b.set_psn(0xFF000001);
  EXPECT_EQ(b.dest_qp(), 0xABCDEFu);
  EXPECT_EQ(b.psn(), 0x000001u);
  EXPECT_EQ(buf[4], 0);  // nothing spilled into the byte before DestQP
  EXPECT_EQ(buf[8], 0);  // nor before the PSN
}

TEST(Bth, ReadsAHandWrittenHeader) {
  // RC RDMA WRITE Only, SE, PadCnt 2, P_Key 0xFFFF, FECN, DestQP 0x123456, AckReq, PSN 0xABCDEF.
  const std::array<uint8_t, 12> wire = {0x0A, 0xA0, 0xFF, 0xFF, 0x80, 0x12,
                                        0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF};
  const BthView b(wire.data());
  EXPECT_EQ(b.opcode(), 0x0A);
  EXPECT_TRUE(b.se());
  EXPECT_FALSE(b.m());
  EXPECT_EQ(b.pad_count(), 2);
  EXPECT_EQ(b.tver(), 0);
  EXPECT_EQ(b.pkey(), 0xFFFF);
  EXPECT_TRUE(b.fecn());
  EXPECT_FALSE(b.becn());
  EXPECT_EQ(b.resv6(), 0);
  EXPECT_EQ(b.dest_qp(), 0x123456u);
  EXPECT_TRUE(b.ack_req());
  EXPECT_EQ(b.resv7(), 0);
  EXPECT_EQ(b.psn(), 0xABCDEFu);

  // Writing the same values into a zero buffer reproduces the bytes.
  std::array<uint8_t, 12> out{};
  Bth w(out.data());
  w.set_opcode(0x0A);
  w.set_se(true);
  w.set_pad_count(2);
  w.set_pkey(0xFFFF);
  w.set_fecn(true);
  w.set_dest_qp(0x123456);
  w.set_ack_req(true);
  w.set_psn(0xABCDEF);
  EXPECT_EQ(out, wire);
}

TEST(Bth, AllOnesAndFieldsAreIndependent) {
  std::array<uint8_t, 12> buf;
  buf.fill(0xFF);
  Bth b(buf.data());
  EXPECT_EQ(b.opcode(), 0xFF);
  EXPECT_TRUE(b.se());
  EXPECT_TRUE(b.m());
  EXPECT_EQ(b.pad_count(), 3);
  EXPECT_EQ(b.tver(), 0xF);
  EXPECT_EQ(b.resv6(), 0x3F);
  EXPECT_EQ(b.resv7(), 0x7F);
  EXPECT_EQ(b.psn(), 0xFFFFFFu);
  // Clearing one sub-byte field leaves its neighbours alone.
  b.set_pad_count(0);
  EXPECT_EQ(buf[1], 0xCF);
  b.set_ack_req(false);
  EXPECT_EQ(buf[8], 0x7F);
  b.set_becn(false);
  EXPECT_EQ(buf[4], 0xBF);
}

TEST(Bth, WritableViewConvertsToReadOnly) {
  std::array<uint8_t, 12> buf{};
  Bth w(buf.data());
  w.set_psn(77);
  BthView r = w;
  EXPECT_EQ(r.psn(), 77u);
  EXPECT_EQ(r.data(), buf.data());
}

// ----- RETH / DETH / ImmDt / IETH / AtomicETH / AtomicAckETH / FETH -------------------------

TEST(Reth, LayoutAndRoundTrip) {
  const std::array<uint8_t, 16> wire = {0x00, 0x00, 0x55, 0xD9, 0xFE, 0x86, 0x31, 0x70,  // VA
                                        0x00, 0x00, 0x04, 0x6D,                          // R_Key
                                        0x00, 0x00, 0x00, 0x40};                         // DMALen
  const RethView r(wire.data());
  EXPECT_EQ(r.va(), 0x000055D9FE863170u);
  EXPECT_EQ(r.rkey(), 0x46Du);
  EXPECT_EQ(r.dma_length(), 64u);
  std::array<uint8_t, 16> out{};
  Reth w(out.data());
  w.set_va(0x000055D9FE863170);
  w.set_rkey(0x46D);
  w.set_dma_length(64);
  EXPECT_EQ(out, wire);

  out.fill(0xFF);
  EXPECT_EQ(w.va(), ~uint64_t{0});
  EXPECT_EQ(w.rkey(), 0xFFFFFFFFu);
  EXPECT_EQ(w.dma_length(), 0xFFFFFFFFu);
}

TEST(Deth, Layout) {
  using A = std::array<uint8_t, 8>;
  EXPECT_EQ(ones<Deth>([](Deth d) { d.set_qkey(0xFFFFFFFF); }),
            (A{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0}));
  EXPECT_EQ(ones<Deth>([](Deth d) { d.set_resv8(0xFF); }), (A{0, 0, 0, 0, 0xFF, 0, 0, 0}));
  EXPECT_EQ(ones<Deth>([](Deth d) { d.set_src_qp(0xFFFFFF); }),
            (A{0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF}));
  const A wire = {0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01};  // CM MAD: GSI Q_Key, QP1
  const DethView d(wire.data());
  EXPECT_EQ(d.qkey(), kGsiQkey);
  EXPECT_EQ(d.src_qp(), 1u);
}

TEST(ImmDtIeth, Layout) {
  std::array<uint8_t, 4> buf{};
  ImmDt(buf.data()).set_imm(0x01020304);
  EXPECT_THAT(buf, ElementsAreArray({1, 2, 3, 4}));
  Ieth(buf.data()).set_rkey(0xDEADBEEF);
  EXPECT_THAT(buf, ElementsAreArray({0xDE, 0xAD, 0xBE, 0xEF}));
  EXPECT_EQ(ImmDtView(buf.data()).imm(), 0xDEADBEEFu);
}

TEST(AtomicEth, Layout) {
  std::array<uint8_t, 28> buf{};
  AtomicEth a(buf.data());
  a.set_va(0x0102030405060708);
  a.set_rkey(0x090A0B0C);
  a.set_swap_add(0x1112131415161718);
  a.set_compare(0x2122232425262728);
  const std::array<uint8_t, 28> want = {1,    2,    3,    4,    5,    6,    7,    8,    9,    10,
                                        11,   12,   0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
                                        0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28};
  EXPECT_EQ(buf, want);
  const AtomicEthView r(want.data());
  EXPECT_EQ(r.swap_add(), 0x1112131415161718u);
  EXPECT_EQ(r.compare(), 0x2122232425262728u);
}

TEST(AtomicAckEth, Layout) {
  std::array<uint8_t, 8> buf{};
  AtomicAckEth(buf.data()).set_orig_data(0xFEDCBA9876543210);
  EXPECT_THAT(buf, ElementsAreArray({0xFE, 0xDC, 0xBA, 0x98, 0x76, 0x54, 0x32, 0x10}));
}

TEST(Feth, Layout) {
  using A = std::array<uint8_t, 4>;
  // rxe_hdr.h: bits 3-0 placement type, 5-4 selectivity level, 31-6 reserved.
  EXPECT_EQ(ones<Feth>([](Feth f) { f.set_placement_type(0xF); }), (A{0, 0, 0, 0x0F}));
  EXPECT_EQ(ones<Feth>([](Feth f) { f.set_selectivity_level(3); }), (A{0, 0, 0, 0x30}));
  EXPECT_EQ(ones<Feth>([](Feth f) { f.set_resv(0x3FFFFFF); }), (A{0xFF, 0xFF, 0xFF, 0xC0}));
  std::array<uint8_t, 4> buf{};
  Feth f(buf.data());
  f.set_selectivity_level(static_cast<uint8_t>(FlushSelectivity::kMemoryRegion));
  f.set_placement_type(kFlushPlacementGlobalVisibility | kFlushPlacementPersistence);
  EXPECT_EQ(buf, (A{0, 0, 0, 0x13}));
}

// ----- AETH ------------------------------------------------------------------------------------

TEST(Aeth, Layout) {
  using A = std::array<uint8_t, 4>;
  EXPECT_EQ(ones<Aeth>([](Aeth a) { a.set_syndrome_resv(true); }), (A{0x80, 0, 0, 0}));
  EXPECT_EQ(ones<Aeth>([](Aeth a) { a.set_syndrome_type(3); }), (A{0x60, 0, 0, 0}));
  EXPECT_EQ(ones<Aeth>([](Aeth a) { a.set_syndrome_value(0x1F); }), (A{0x1F, 0, 0, 0}));
  EXPECT_EQ(ones<Aeth>([](Aeth a) { a.set_msn(0xFFFFFF); }), (A{0, 0xFF, 0xFF, 0xFF}));
  // Linux rxe's ACK: syndrome 0x1F (ACK, credits invalid), MSN 1.
  const A wire = {0x1F, 0x00, 0x00, 0x01};
  const AethView a(wire.data());
  EXPECT_TRUE(a.is_ack());
  EXPECT_EQ(a.credit_code(), kAethCreditsInvalid);
  EXPECT_EQ(a.msn(), 1u);
}

TEST(Aeth, SyndromeConstructorsMatchTheSpecEncoding) {
  // IBA 9.3.5: 0tt vvvvv — ACK 000, RNR NAK 001, NAK 011.
  EXPECT_EQ(make_ack(0), 0x00);
  EXPECT_EQ(make_ack(kAethCreditsInvalid), 0x1F);
  EXPECT_EQ(make_rnr_nak(0), 0x20);
  EXPECT_EQ(make_rnr_nak(14), 0x2E);
  EXPECT_EQ(make_nak(NakCode::kPsnSequenceError), 0x60);
  EXPECT_EQ(make_nak(NakCode::kInvalidRequest), 0x61);
  EXPECT_EQ(make_nak(NakCode::kRemoteAccessError), 0x62);
  EXPECT_EQ(make_nak(NakCode::kRemoteOperationalError), 0x63);
  EXPECT_EQ(make_nak(NakCode::kInvalidRdRequest), 0x64);
  EXPECT_EQ(make_ack(0xFF), 0x1F);  // the value is masked to 5 bits

  for (unsigned s = 0; s < 0x80; ++s) {
    const auto syn = static_cast<uint8_t>(s);
    EXPECT_EQ(aeth_syndrome(aeth_type(syn), aeth_value(syn)), syn);
  }
  std::array<uint8_t, 4> buf{};
  Aeth a(buf.data());
  a.set_syndrome(make_rnr_nak(5));
  EXPECT_TRUE(a.is_rnr_nak());
  EXPECT_FALSE(a.is_ack());
  EXPECT_EQ(a.rnr_timer_code(), 5);
  a.set_syndrome(make_nak(NakCode::kRemoteAccessError));
  EXPECT_TRUE(a.is_nak());
  EXPECT_EQ(a.nak_code(), 2);
  a.set_syndrome(0x40);
  EXPECT_EQ(a.type(), AethType::kReserved);
}

TEST(Aeth, Names) {
  EXPECT_STREQ(aeth_type_name(AethType::kRnrNak), "RNR NAK");
  EXPECT_STREQ(nak_code_name(0), "PSN sequence error");
  EXPECT_STREQ(nak_code_name(4), "invalid RD request");
  EXPECT_STREQ(nak_code_name(5), "reserved");
  EXPECT_STREQ(nak_code_name(31), "reserved");
}

TEST(Aeth, CreditTable) {
  EXPECT_EQ(aeth_credit_count(0), 0u);
  EXPECT_EQ(aeth_credit_count(4), 4u);
  EXPECT_EQ(aeth_credit_count(5), 6u);
  EXPECT_EQ(aeth_credit_count(30), 32768u);
  EXPECT_EQ(aeth_credit_count(kAethCreditsInvalid), std::nullopt);
  // Codes 2k and 2k+1 (k >= 1) are 2^k and 1.5 * 2^k.
  for (uint8_t k = 1; k < 15; ++k) {
    EXPECT_EQ(aeth_credit_count(2 * k), 1u << k);
    EXPECT_EQ(aeth_credit_count(2 * k + 1), 3u << (k - 1));
  }
}

TEST(Aeth, RnrTimerTable) {
  EXPECT_EQ(rnr_timer_ns(0), 655'360'000u);  // 655.36 ms
  EXPECT_EQ(rnr_timer_ns(1), 10'000u);       // 0.01 ms
  EXPECT_EQ(rnr_timer_ns(14), 1'280'000u);   // 1.28 ms
  EXPECT_EQ(rnr_timer_ns(31), 491'520'000u);
  // Codes 1..31 grow strictly; code 0 is the longest of all.
  for (uint8_t c = 2; c < kRnrTimerCodeCount; ++c) EXPECT_GT(rnr_timer_ns(c), rnr_timer_ns(c - 1));
  for (uint8_t c = 1; c < kRnrTimerCodeCount; ++c) EXPECT_LT(rnr_timer_ns(c), rnr_timer_ns(0));
}

// ----- GRH and the IPv4 form ------------------------------------------------------------------

TEST(Grh, Layout) {
  std::array<uint8_t, 40> buf{};
  Grh g(buf.data());
  g.set_ip_ver(6);
  g.set_tclass(0xAB);
  g.set_flow_label(0xCDEF1);
  g.set_paylen(0x1234);
  g.set_next_hdr(kIpProtoUdp);
  g.set_hop_limit(64);
  Gid s{}, d{};
  for (size_t i = 0; i < 16; ++i) {
    s[i] = static_cast<uint8_t>(i);
    d[i] = static_cast<uint8_t>(0xF0 + i);
  }
  g.set_sgid(s);
  g.set_dgid(d);
  EXPECT_THAT(std::vector<uint8_t>(buf.begin(), buf.begin() + 8),
              ElementsAreArray({0x6A, 0xBC, 0xDE, 0xF1, 0x12, 0x34, 17, 64}));
  EXPECT_EQ(buf[8], 0);
  EXPECT_EQ(buf[23], 15);
  EXPECT_EQ(buf[24], 0xF0);
  EXPECT_EQ(buf[39], 0xFF);
  const GrhView r(buf.data());
  EXPECT_EQ(r.ip_ver(), 6);
  EXPECT_EQ(r.tclass(), 0xAB);
  EXPECT_EQ(r.flow_label(), 0xCDEF1u);
  EXPECT_EQ(r.sgid(), s);
  EXPECT_EQ(r.dgid(), d);
}

// A real IPv4 header from the reference capture (rxe-to-rxe.pcap frame 12).
constexpr std::array<uint8_t, 20> kIpv4Frame12 = {0x45, 0x00, 0x00, 0x7C, 0xAF, 0xA5, 0x40,
                                                  0x00, 0x40, 0x11, 0x76, 0x01, 0x0A, 0x63,
                                                  0x00, 0x02, 0x0A, 0x63, 0x00, 0x03};

TEST(Ipv4, HeaderFieldsAndChecksum) {
  const Ipv4HeaderView h(kIpv4Frame12.data());
  EXPECT_EQ(h.version(), 4);
  EXPECT_EQ(h.ihl(), 5);
  EXPECT_EQ(h.total_length(), 124);
  EXPECT_EQ(h.id(), 0xAFA5);
  EXPECT_EQ(h.flags(), kIpv4FlagDontFragment);
  EXPECT_EQ(h.ttl(), 64);
  EXPECT_EQ(h.protocol(), kIpProtoUdp);
  EXPECT_EQ(h.checksum(), 0x7601);
  EXPECT_EQ(h.saddr(), 0x0A630002u);
  EXPECT_EQ(h.daddr(), 0x0A630003u);
  EXPECT_EQ(ipv4_header_checksum(kIpv4Frame12), 0);  // a correct header sums to zero

  auto copy = kIpv4Frame12;
  Ipv4Header w(copy.data());
  w.set_checksum(0);
  EXPECT_EQ(ipv4_header_checksum(copy), 0x7601);
}

TEST(Grh, Ipv4FormAsRdmaCoreReadsIt) {
  std::array<uint8_t, 40> area;
  area.fill(0xEE);
  write_ipv4_grh(area, kIpv4Frame12);
  for (size_t i = 0; i < kGrhIpv4Offset; ++i) EXPECT_EQ(area[i], 0) << i;
  EXPECT_EQ(area[20], 0x45);
  EXPECT_EQ(grh_ip_version(area), 4);
  EXPECT_EQ(Ipv4HeaderView(area.data() + kGrhIpv4Offset).saddr(), 0x0A630002u);

  // A real IPv6 GRH.
  std::array<uint8_t, 40> v6{};
  Grh(v6.data()).set_ip_ver(6);
  EXPECT_EQ(grh_ip_version(v6), 6);
  // IPVer 6 whose last 20 bytes happen to look like IPv4 but with a bad checksum: IPv6.
  std::copy(kIpv4Frame12.begin(), kIpv4Frame12.end(), v6.begin() + kGrhIpv4Offset);
  v6[kGrhIpv4Offset + 11] ^= 1;
  EXPECT_EQ(grh_ip_version(v6), 6);
  // Neither form.
  std::array<uint8_t, 40> junk{};
  EXPECT_EQ(grh_ip_version(junk), 0);
}

TEST(Gid, Ipv4Mapped) {
  const Gid g = ipv4_mapped_gid(0x0A630002);  // 10.99.0.2
  const Gid want = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 99, 0, 2};
  EXPECT_EQ(g, want);
  EXPECT_TRUE(is_ipv4_mapped(g));
  EXPECT_EQ(gid_ipv4(g), 0x0A630002u);
  Gid v6 = want;
  v6[0] = 0xFE;
  EXPECT_FALSE(is_ipv4_mapped(v6));
  v6 = want;
  v6[11] = 0;
  EXPECT_FALSE(is_ipv4_mapped(v6));
}

}  // namespace
}  // namespace urdma::wire
