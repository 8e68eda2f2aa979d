// The receive pipeline (rxe_recv.c as the model): each check drops and counts, and a dropped
// packet changes nothing.
#include <gtest/gtest.h>

#include <vector>

#include "protocol_test_util.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;

class PipelineTest : public ProtocolTest {
 protected:
  void SetUp() override {
    make_qp();
    buf_.assign(64, 0);
    mr_ = reg(buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_EQ(post_recv(qp_, 1, sge(buf_.data(), 64, mr_)), 0);
  }
  std::vector<uint8_t> send_only(uint32_t dest_qp, uint16_t pkey = 0xFFFF,
                                 uint8_t opcode = op::kRcSendOnly) {
    std::vector<uint8_t> buf(64);
    const std::vector<uint8_t> payload = {1, 2, 3, 4};
    auto built = wire::build_packet(buf, opcode, payload);
    built->headers.bth().set_dest_qp(dest_qp);
    built->headers.bth().set_psn(0x200);
    built->headers.bth().set_pkey(pkey);
    buf.resize(built->layout.total_length());
    return buf;
  }
  void expect_nothing_happened() {
    EXPECT_EQ(sent_count(), 0u);
    EXPECT_TRUE(cqes().empty());
    EXPECT_EQ(buf_[0], 0);
  }
  std::vector<uint8_t> buf_;
  provider::Mr* mr_ = nullptr;
};

TEST_F(PipelineTest, ValidPacketIsAccepted) {
  inject_raw(send_only(qp_->qp_num()));
  EXPECT_EQ(cqes().size(), 1u);
  EXPECT_EQ(engine_.counters().drops(), 0u);
}

// IBA 9.6: a packet failing header validation (here: shorter than a BTH) is dropped.
TEST_F(PipelineTest, MalformedIsDroppedPerParseError) {
  inject_raw(std::vector<uint8_t>(8, 0), false);
  EXPECT_EQ(engine_.counters().drop_parse[static_cast<size_t>(wire::ParseError::kTooShortForBth)],
            1u);
  auto bad_version = send_only(qp_->qp_num());
  bad_version[1] |= 0x1;  // TVer 1
  inject_raw(bad_version);
  EXPECT_EQ(
      engine_.counters().drop_parse[static_cast<size_t>(wire::ParseError::kBadTransportVersion)],
      1u);
  expect_nothing_happened();
}

// IBA 7.8.1 / annex A17.4.3.1: a wrong ICRC → dropped.
TEST_F(PipelineTest, BadIcrcIsDropped) {
  auto pkt = send_only(qp_->qp_num());
  inject_raw(pkt, false);  // ICRC slot left zero
  EXPECT_EQ(engine_.counters().drop_icrc, 1u);
  expect_nothing_happened();
  inject_raw(send_only(qp_->qp_num()));  // the same packet with its ICRC is accepted
  EXPECT_EQ(cqes().size(), 1u);
}

// A datagram that crosses a shared-memory ring goes unsealed (ICRC zero: net/packet_io.h,
// icrc_needed), and one that came through a ring may be unsealed; from a socket, a zero ICRC
// is a bad one. A ring's datagram with a wrong non-zero ICRC is still dropped (a fault
// profile's flipped bit), and what the engine sends to a socket is sealed.
TEST_F(PipelineTest, AnUnsealedDatagramIsAcceptedOnlyFromARingAndSentOnlyToOne) {
  const auto send_psn = [&](uint32_t psn) {
    auto pkt = send_only(qp_->qp_num());
    wire::Bth(pkt.data()).set_psn(psn);
    wire::Bth(pkt.data()).set_ack_req(1);
    return pkt;
  };
  inject_raw(send_psn(0x200), false);  // from a socket
  EXPECT_EQ(engine_.counters().drop_icrc, 1u);
  expect_nothing_happened();
  io_.as_ring = true;
  auto flipped = send_psn(0x200);
  net::seal_icrc(flipped, {kPeer, kPeerPort}, {kLocal, net::kRoceV2UdpPort});
  flipped[12] ^= 0x01;  // the first payload byte: the ICRC no longer matches
  inject_raw(flipped, false);
  EXPECT_EQ(engine_.counters().drop_icrc, 2u);
  expect_nothing_happened();
  inject_raw(send_psn(0x200), false);  // unsealed, through a ring: accepted and ACKed unsealed
  EXPECT_EQ(cqes().size(), 1u);
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(wire::icrc_of(io_.sent[0].bytes), 0u);
  io_.as_ring = false;
  inject_raw(send_psn(0x201));  // sealed, from a socket: ACKed sealed
  EXPECT_EQ(engine_.counters().drop_icrc, 2u);
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(1).opcode(), wire::op::kRcAck);  // sent() checks the ICRC against the flow
}

// IBA 10.9.3: a P_Key whose low 15 bits differ from the port's → dropped; 0x7FFF (limited
// member of the default partition) matches our full-member 0xFFFF.
TEST_F(PipelineTest, PkeyMismatchIsDropped) {
  inject_raw(send_only(qp_->qp_num(), 0x8001));
  EXPECT_EQ(engine_.counters().drop_pkey, 1u);
  expect_nothing_happened();
  inject_raw(send_only(qp_->qp_num(), 0x7FFF));
  EXPECT_EQ(cqes().size(), 1u);
}

// IBA 9.6.1.2: an unknown DestQP → dropped.
TEST_F(PipelineTest, UnknownQpnIsDropped) {
  inject_raw(send_only(qp_->qp_num() + 100));
  EXPECT_EQ(engine_.counters().drop_unknown_qpn, 1u);
  expect_nothing_happened();
}

// IBA 9.6.1.2: a UC opcode to an RC QP → dropped.
TEST_F(PipelineTest, WrongTransportIsDropped) {
  inject_raw(send_only(qp_->qp_num(), 0xFFFF, op::kUcSendOnly));
  EXPECT_EQ(engine_.counters().drop_qp_type, 1u);
  expect_nothing_happened();
}

// rxe check_addr: a connected QP ignores packets from anyone but its peer.
TEST_F(PipelineTest, WrongSourceAddressIsDropped) {
  inject_raw(send_only(qp_->qp_num()), true, net::Address::from_v4(10, 0, 0, 99));
  EXPECT_EQ(engine_.counters().drop_address, 1u);
  expect_nothing_happened();
}

// A datagram larger than any valid packet is seen truncated and dropped.
TEST_F(PipelineTest, OversizedDatagramIsDropped) {
  inject_raw(std::vector<uint8_t>(kRxBufferBytes + 100, 0), false);
  EXPECT_EQ(engine_.counters().drop_truncated, 1u);
  expect_nothing_happened();
}

// IBA 10.3.1: a QP in INIT does not receive. It has no path yet, so the state check must come
// before the address check (rxe_recv.c: check_type_state, then check_addr) for the packet to be
// dropped for its state — counted under drop_qp_state alone.
TEST_F(ProtocolTest, QpNotYetRtrDropsRequests) {
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd_;
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap = {4, 4, 1, 1, 0};
  qp_ = dev_.create_qp(init).value();
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = 0;
  ASSERT_EQ(qp_->modify(a, mask_for(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RC)).error(), 0);
  inject(op::kRcSendOnly, 0, std::vector<uint8_t>{1});
  EXPECT_EQ(engine_.counters().drop_qp_state, 1u);
  EXPECT_EQ(engine_.counters().drop_address, 0u);
  EXPECT_EQ(engine_.counters().drops(), 1u);
}

// A response to a QP that is only RTR (no requester yet) is dropped for its state, although it
// comes from the right peer.
TEST_F(ProtocolTest, ResponseToRtrQpIsDroppedForItsState) {
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd_;
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap = {4, 4, 1, 1, 0};
  qp_ = dev_.create_qp(init).value();
  QpParams p;
  ibv_qp_attr a = {};
  a.port_num = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.dgid = gid_of(kPeer);
  a.ah_attr.grh.hop_limit = 64;
  a.path_mtu = p.mtu;
  a.dest_qp_num = kPeerQpn;
  a.rq_psn = p.rq_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.qp_state = IBV_QPS_INIT;
  ASSERT_EQ(qp_->modify(a, mask_for(IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPT_RC)).error(), 0);
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(qp_->modify(a, mask_for(IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPT_RC)).error(), 0);
  inject(op::kRcAck, 0, {}, [](const wire::PacketHeaders& h) {
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  });
  EXPECT_EQ(engine_.counters().drop_qp_state, 1u);
  EXPECT_EQ(engine_.counters().drops(), 1u);
}

}  // namespace
}  // namespace urdma::engine::testing
