#include "gsi/gmp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <utility>

#include "net/icrc_flow.h"
#include "support/memory_io.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/mad.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace urdma::gsi {
namespace {

using Mad = std::array<uint8_t, wire::kMadSize>;

const net::Address kPeer = net::Address::from_v4(10, 99, 0, 3);
const net::Address kLocal = net::Address::from_v4(10, 99, 0, 2);

// A REJ, as urdmad answers a REQ nobody listens for.
Mad rej() {
  Mad m{};
  auto r = wire::init_cm_message<wire::CmRej>(std::span<uint8_t, wire::kMadSize>(m),
                                               0x00000002edc7dc65);
  r.set_remote_comm_id(0x65dcc7ed);
  r.set_message_rejected(static_cast<uint8_t>(wire::CmRejMessage::kReq));
  r.set_reason(static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
  return m;
}

// The datagram around a MAD, laid out as the rxe capture's REJ (frame 29): UD SEND Only,
// P_Key 0xFFFF, DestQP 1, AckReq, Q_Key 0x80010000, SrcQP 1; the ICRC sealed with IP ID 0, DF.
TEST(Gmp, GmpDatagramIsAUdSendToQp1) {
  const Mad reply = rej();
  std::array<uint8_t, kGmpBytes> buf{};
  const size_t n = build_gmp(buf, reply, 7, {kLocal, 4791}, {kPeer, 4791});
  ASSERT_EQ(n, kGmpBytes);
  const auto p = wire::parse_packet(std::span<const uint8_t>(buf.data(), n));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->opcode(), wire::op::kUdSendOnly);
  EXPECT_EQ(p->bth().pkey(), 0xFFFF);
  EXPECT_EQ(p->bth().dest_qp(), 1u);
  EXPECT_EQ(p->bth().ack_req(), 1);
  EXPECT_EQ(p->bth().psn(), 7u);
  ASSERT_TRUE(p->deth());
  EXPECT_EQ(p->deth()->qkey(), 0x80010000u);
  EXPECT_EQ(p->deth()->src_qp(), 1u);
  ASSERT_EQ(p->payload().size(), wire::kMadSize);
  EXPECT_TRUE(std::equal(reply.begin(), reply.end(), p->payload().begin()));

  wire::IcrcIpv4Flow flow;
  flow.src_addr = {10, 99, 0, 2};
  flow.dst_addr = {10, 99, 0, 3};
  flow.udp_src_port = 4791;
  flow.udp_dst_port = 4791;
  const auto match = wire::verify_icrc_ipv4(flow, std::span<const uint8_t>(buf.data(), n),
                                            wire::Ipv4DfSearch::kSetOnly);
  EXPECT_TRUE(match.ok);
  EXPECT_EQ(match.ip_id, 0);
  flow.udp_src_port = 4792;
  EXPECT_FALSE(wire::verify_icrc_ipv4(flow, std::span<const uint8_t>(buf.data(), n),
                                      wire::Ipv4DfSearch::kSetOnly)
                   .ok)
      << "the ICRC covers the ports it was sealed for";
}

TEST(Gmp, IcrcOkChecksTheFlowAndTheBytes) {
  const Mad reply = rej();
  for (const auto& [from, to] :
       {std::pair{kLocal, kPeer},
        std::pair{*net::Address::parse("fd00::2"), *net::Address::parse("fd00::3")}}) {
    std::array<uint8_t, kGmpBytes> buf{};
    ASSERT_EQ(build_gmp(buf, reply, 1, {from, 4791}, {to, 4791}), buf.size());
    EXPECT_TRUE(icrc_ok(buf, {from, 4791}, {to, 4791}));
    EXPECT_FALSE(icrc_ok(buf, {to, 4791}, {from, 4791})) << "another flow";
    buf[40] ^= 1;
    EXPECT_FALSE(icrc_ok(buf, {from, 4791}, {to, 4791})) << "a flipped bit";
  }
}

TEST(Gmp, TwoFamiliesNameNoFlow) {
  std::array<uint8_t, kGmpBytes> buf{};
  EXPECT_EQ(build_gmp(buf, rej(), 1, {kLocal, 4791}, {*net::Address::parse("fd00::3"), 4791}),
            0u);
}

TEST(Gmp, ThePsnKeepsItsLow24BitsAndTheDestinationQpIsTheCallers) {
  std::array<uint8_t, kGmpBytes> buf{};
  ASSERT_EQ(build_gmp(buf, rej(), 0x01ABCDEF, {kLocal, 4791}, {kPeer, 4791}, 0x12), kGmpBytes);
  const auto p = wire::parse_packet(buf);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->bth().psn(), 0xABCDEFu);
  EXPECT_EQ(p->bth().dest_qp(), 0x12u);
}

TEST(Gmp, ParseNamesWhatIsNotAGmp) {
  std::array<uint8_t, kGmpBytes> buf{};
  ASSERT_EQ(build_gmp(buf, rej(), 1, {kLocal, 4791}, {kPeer, 4791}), kGmpBytes);
  const GmpView ok = parse_gmp(buf);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.src_qp, wire::kMadGsiQpn);
  EXPECT_EQ(ok.qkey, wire::kMadGsiQKey);
  EXPECT_EQ(ok.mad.size(), wire::kMadSize);
  EXPECT_EQ(ok.mad.data(), buf.data() + wire::Bth::kSize + wire::Deth::kSize);

  EXPECT_EQ(parse_gmp(std::span<const uint8_t>(buf).first(8)).error, GmpError::kNotRoce);
  auto to_qp = buf;
  wire::Bth(to_qp.data()).set_dest_qp(5);
  EXPECT_EQ(parse_gmp(to_qp).error, GmpError::kNotQp1);
  auto rc = buf;
  wire::Bth(rc.data()).set_opcode(wire::op::kRcSendOnly);
  EXPECT_EQ(parse_gmp(rc).error, GmpError::kNotUdSend);
  const auto cut = std::span<const uint8_t>(buf).first(kGmpBytes - 16);
  EXPECT_EQ(parse_gmp(cut).error, GmpError::kShort);
  EXPECT_TRUE(parse_gmp(cut).mad.empty());
}

TEST(Gmp, CheckTakesTheGsiQkeyAndARightIcrcOnly) {
  const net::Endpoint from{kPeer, 4791}, to{kLocal, 4791};
  std::array<uint8_t, kGmpBytes> buf{};
  ASSERT_EQ(build_gmp(buf, rej(), 1, from, to), kGmpBytes);
  ASSERT_TRUE(check_gmp(buf, from, to));
  EXPECT_FALSE(check_gmp(buf, to, from)) << "another flow";
  auto qkey = buf;
  wire::Deth(qkey.data() + wire::Bth::kSize).set_qkey(0x1234);
  ASSERT_TRUE(net::seal_icrc(qkey, from, to));
  EXPECT_FALSE(check_gmp(qkey, from, to)) << "not the GSI's Q_Key";
}

TEST(Gmp, SenderSealsForTheIosPortAndNumbersItsGmps) {
  test::MemoryIo io;
  Sender sender(io, 0xFFFFFF);
  const net::Endpoint to{kPeer, 4791};
  EXPECT_EQ(sender.send(rej(), kLocal, to), net::TxStatus::kSent);
  EXPECT_EQ(sender.send(rej(), kLocal, to, 0x12), net::TxStatus::kSent);
  ASSERT_EQ(io.sent.size(), 2u);
  for (const auto& s : io.sent) {
    EXPECT_EQ(s.dst, to);
    EXPECT_EQ(s.src, kLocal);
    EXPECT_EQ(s.src_port, io.source_port(net::kRoceV2UdpPort));
    EXPECT_TRUE(icrc_ok(s.bytes, {kLocal, s.src_port}, to));
  }
  EXPECT_TRUE(check_gmp(io.sent[0].bytes, {kLocal, io.sent[0].src_port}, to));
  EXPECT_EQ(wire::parse_packet(io.sent[0].bytes)->bth().psn(), 0xFFFFFFu);
  EXPECT_EQ(wire::parse_packet(io.sent[1].bytes)->bth().psn(), 0u) << "24 bits, wrapping";
  EXPECT_EQ(wire::parse_packet(io.sent[1].bytes)->bth().dest_qp(), 0x12u);
  EXPECT_EQ(sender.send(rej(), kLocal, {*net::Address::parse("fd00::3"), 4791}),
            net::TxStatus::kRejected)
      << "two families";
  EXPECT_EQ(io.sent.size(), 2u);
}

}  // namespace
}  // namespace urdma::gsi
