// UD multicast in the engine (IBA 10.5, 9.6.1.2; RoCEv2: the group is the destination IP): a
// datagram with DestQP 0xFFFFFF sent to a group's address reaches every QP attached to that
// group (provider::McastTable) whose state and Q_Key accept it, and no other; a multicast send
// leaves for the group's address with DestQP 0xFFFFFF and a correct ICRC.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "protocol_test_util.h"
#include "wire/grh.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;

const net::Address kGroup = net::Address::from_v4(230, 1, 2, 3);

ibv_gid gid_of_address(const net::Address& a) {
  ibv_gid g;
  std::memcpy(g.raw, a.bytes().data(), sizeof g.raw);
  return g;
}

class MulticastTest : public ProtocolTest {
 protected:
  struct Receiver {
    provider::Qp* qp = nullptr;
    std::vector<uint8_t> buf;
    provider::Mr* mr = nullptr;
  };

  Receiver make_receiver(uint32_t qkey = 0x11111111, bool block_self = false) {
    Receiver r;
    provider::QpInitAttr init;
    init.qp_type = IBV_QPT_UD;
    init.pd = pd_;
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.cap = cap_;
    init.block_self_mcast_lb = block_self;
    r.qp = dev_.create_qp(init).value();
    QpParams p;
    p.type = IBV_QPT_UD;
    p.qkey = qkey;
    connect(r.qp, kPeer, kPeerQpn, p);
    r.buf.assign(wire::Grh::kSize + 256, 0);
    r.mr = reg(r.buf.data(), r.buf.size(), IBV_ACCESS_LOCAL_WRITE);
    EXPECT_EQ(post_recv(r.qp, r.qp->qp_num(),
                        sge(r.buf.data(), static_cast<uint32_t>(r.buf.size()), r.mr)),
              0);
    return r;
  }

  // A UD SEND Only from (src, src_qp) to `to` with DestQP `dqp`, sealed and polled.
  void send_to(const net::Address& to, uint32_t dqp, std::vector<uint8_t> payload,
               uint32_t qkey = 0x11111111, uint8_t opcode = op::kUdSendOnly,
               net::Address src = kPeer, uint32_t src_qp = kPeerQpn) {
    std::vector<uint8_t> buf(kMaxPacketBytes);
    auto built = wire::build_packet(buf, opcode, payload);
    ASSERT_TRUE(built.has_value());
    built->headers.bth().set_dest_qp(dqp);
    built->headers.bth().set_pkey(0xFFFF);
    if (auto deth = built->headers.deth()) {
      deth->set_qkey(qkey);
      deth->set_src_qp(src_qp);
    }
    buf.resize(built->layout.total_length());
    const net::Endpoint from{src, kPeerPort};
    const net::Endpoint dst{to, net::kRoceV2UdpPort};
    net::seal_icrc(buf, from, dst);
    io_.deliver(buf, from, dst);
    engine_.poll();
  }

  const std::vector<uint8_t> payload_ = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
};

TEST_F(MulticastTest, EveryAttachedQpGetsACopyAndNoOtherQpDoes) {
  Receiver a = make_receiver(), b = make_receiver(), c = make_receiver();
  ASSERT_TRUE(dev_.attach_mcast(a.qp, gid_of_address(kGroup)).ok());
  ASSERT_TRUE(dev_.attach_mcast(b.qp, gid_of_address(kGroup)).ok());
  send_to(kGroup, provider::kMulticastQpn, payload_);
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  std::vector<uint64_t> got = {wcs[0].wr_id, wcs[1].wr_id};
  std::sort(got.begin(), got.end());
  std::vector<uint64_t> want = {a.qp->qp_num(), b.qp->qp_num()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, wire::Grh::kSize + payload_.size());
    EXPECT_EQ(wc.src_qp, kPeerQpn);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  }
  for (Receiver* r : {&a, &b}) {
    EXPECT_EQ(0, std::memcmp(r->buf.data() + wire::Grh::kSize, payload_.data(), payload_.size()));
    // The GRH area's IPv4 header names the group as destination.
    wire::Ipv4HeaderView ip(r->buf.data() + wire::kGrhIpv4Offset);
    EXPECT_EQ(ip.daddr(), kGroup.v4());
    EXPECT_EQ(ip.saddr(), kPeer.v4());
  }
  for (uint8_t byte : c.buf) ASSERT_EQ(byte, 0) << "the unattached QP got nothing";
  EXPECT_EQ(engine_.counters().drop_mcast_unattached, 0u);
}

TEST_F(MulticastTest, EachAttachedQpChecksItsOwnQkey) {
  Receiver a = make_receiver(0x11111111), b = make_receiver(0x22222222);
  ASSERT_TRUE(dev_.attach_mcast(a.qp, gid_of_address(kGroup)).ok());
  ASSERT_TRUE(dev_.attach_mcast(b.qp, gid_of_address(kGroup)).ok());
  send_to(kGroup, provider::kMulticastQpn, payload_, 0x22222222);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, b.qp->qp_num());
  EXPECT_EQ(engine_.counters().drop_qkey, 1u);
}

TEST_F(MulticastTest, ADetachedQpAndAnotherGroupGetNothing) {
  Receiver a = make_receiver();
  ASSERT_TRUE(dev_.attach_mcast(a.qp, gid_of_address(kGroup)).ok());
  ASSERT_TRUE(dev_.detach_mcast(a.qp, gid_of_address(kGroup)).ok());
  send_to(kGroup, provider::kMulticastQpn, payload_);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(engine_.counters().drop_mcast_unattached, 1u);
  ASSERT_TRUE(dev_.attach_mcast(a.qp, gid_of_address(kGroup)).ok());
  send_to(net::Address::from_v4(230, 1, 2, 4), provider::kMulticastQpn, payload_);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(engine_.counters().drop_mcast_unattached, 2u);
  for (uint8_t byte : a.buf) ASSERT_EQ(byte, 0);
}

TEST_F(MulticastTest, MulticastQpnOnAUnicastAddressOrANonUdOpcodeIsDropped) {
  Receiver a = make_receiver();
  ASSERT_TRUE(dev_.attach_mcast(a.qp, gid_of_address(kGroup)).ok());
  send_to(kLocal, provider::kMulticastQpn, payload_);  // our own address: not a group
  EXPECT_EQ(engine_.counters().drop_mcast_invalid, 1u);
  send_to(kGroup, provider::kMulticastQpn, payload_, 0, op::kRcSendOnly);  // RC cannot multicast
  EXPECT_EQ(engine_.counters().drop_mcast_invalid, 2u);
  EXPECT_TRUE(cqes().empty());
  for (uint8_t byte : a.buf) ASSERT_EQ(byte, 0);
}

TEST_F(MulticastTest, ANotReadyQpIsSkipped) {
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_UD;
  init.pd = pd_;
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap = cap_;
  provider::Qp* reset_qp = dev_.create_qp(init).value();  // RESET: cannot receive
  ASSERT_TRUE(dev_.attach_mcast(reset_qp, gid_of_address(kGroup)).ok());
  send_to(kGroup, provider::kMulticastQpn, payload_);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(engine_.counters().drop_mcast_unattached, 1u);
  ASSERT_TRUE(dev_.detach_mcast(reset_qp, gid_of_address(kGroup)).ok());
  EXPECT_TRUE(dev_.destroy_qp(reset_qp).ok());
}

TEST_F(MulticastTest, BlockSelfMulticastLoopbackSkipsOnlyTheSendersOwnQp) {
  Receiver self = make_receiver(0x11111111, /*block_self=*/true);
  Receiver other = make_receiver();
  ASSERT_TRUE(dev_.attach_mcast(self.qp, gid_of_address(kGroup)).ok());
  ASSERT_TRUE(dev_.attach_mcast(other.qp, gid_of_address(kGroup)).ok());
  // Our own datagram looped back: from our address, from the blocking QP.
  send_to(kGroup, provider::kMulticastQpn, payload_, 0x11111111, op::kUdSendOnly, kLocal,
          self.qp->qp_num());
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, other.qp->qp_num());
  // The same QPN from another host is somebody else's QP: delivered.
  send_to(kGroup, provider::kMulticastQpn, payload_, 0x11111111, op::kUdSendOnly, kPeer,
          self.qp->qp_num());
  wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, self.qp->qp_num());
}

TEST_F(MulticastTest, WithoutTheFlagTheSendersOwnAttachedQpGetsItsDatagram) {
  Receiver self = make_receiver();
  ASSERT_TRUE(dev_.attach_mcast(self.qp, gid_of_address(kGroup)).ok());
  send_to(kGroup, provider::kMulticastQpn, payload_, 0x11111111, op::kUdSendOnly, kLocal,
          self.qp->qp_num());
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, self.qp->qp_num());
}

TEST_F(MulticastTest, ASendToAGroupLeavesForItsAddressWithTheMulticastQpn) {
  QpParams p;
  p.type = IBV_QPT_UD;
  make_qp(p);
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = gid_of_address(kGroup);
  ah_attr.grh.hop_limit = 64;
  auto* ah = dev_.create_ah(pd_, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();
  std::vector<uint8_t> src(100, 0x3C);
  auto* mr = reg(src.data(), src.size(), 0);
  ibv_sge s = sge(src.data(), 100, mr);
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, &s);
  wr.wr.ud.ah = &verbs_ah;
  wr.wr.ud.remote_qpn = provider::kMulticastQpn;
  wr.wr.ud.remote_qkey = 0x01234567;
  ASSERT_EQ(post_send(qp_, wr), 0);
  engine_.poll();
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(io_.sent[0].dst.address, kGroup);
  EXPECT_EQ(io_.sent[0].dst.port, net::kRoceV2UdpPort);
  const wire::PacketView pkt = sent(0);  // checks the ICRC for the group's flow
  EXPECT_EQ(pkt.opcode(), op::kUdSendOnly);
  EXPECT_EQ(pkt.bth().dest_qp(), provider::kMulticastQpn);
  EXPECT_EQ(pkt.deth()->qkey(), 0x01234567u);
  EXPECT_EQ(pkt.deth()->src_qp(), qp_->qp_num());
}

// ibv_attach_mcast(3) / the kernel's ib_attach_mcast and rxe: the errors.
TEST_F(MulticastTest, AttachAndDetachErrors) {
  Receiver a = make_receiver();
  make_qp();                                                                  // RC
  EXPECT_EQ(dev_.attach_mcast(qp_, gid_of_address(kGroup)).error(), EINVAL);  // not UD
  EXPECT_EQ(dev_.attach_mcast(a.qp, gid_of_address(kPeer)).error(), EINVAL);  // not a group
  ibv_gid v6 = {};
  v6.raw[0] = 0xff;
  v6.raw[1] = 0x0e;
  v6.raw[15] = 1;
  EXPECT_TRUE(dev_.attach_mcast(a.qp, v6).ok());  // an IPv6 group
  bool added = true;
  EXPECT_TRUE(dev_.attach_mcast(a.qp, v6, &added).ok());  // again: nothing changes
  EXPECT_FALSE(added);
  EXPECT_EQ(dev_.mcast().size(), 1u);
  EXPECT_EQ(dev_.detach_mcast(a.qp, gid_of_address(kGroup)).error(), EINVAL);  // not attached
  EXPECT_EQ(dev_.destroy_qp(a.qp).error(), EBUSY);  // still attached (uverbs usecnt)
  EXPECT_TRUE(dev_.detach_mcast(a.qp, v6).ok());
  EXPECT_EQ(dev_.detach_mcast(a.qp, v6).error(), EINVAL);
  EXPECT_TRUE(dev_.destroy_qp(a.qp).ok());
}

TEST_F(MulticastTest, AGroupHoldsAtMostMaxMcastQpAttachQps) {
  ibv_device_attr attr = dev_.attr();
  ASSERT_EQ(static_cast<uint32_t>(attr.max_mcast_qp_attach), provider::kLimits.max_mcast_qp_attach);
  ASSERT_GT(attr.max_mcast_grp, 0);
  ASSERT_GE(attr.max_total_mcast_qp_attach, attr.max_mcast_qp_attach);
  std::vector<provider::Qp*> qps;
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_UD;
  init.pd = pd_;
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap = {1, 1, 1, 1, 0};
  for (int i = 0; i <= attr.max_mcast_qp_attach; ++i) qps.push_back(dev_.create_qp(init).value());
  for (int i = 0; i < attr.max_mcast_qp_attach; ++i)
    ASSERT_TRUE(dev_.attach_mcast(qps[static_cast<size_t>(i)], gid_of_address(kGroup)).ok());
  EXPECT_EQ(dev_.attach_mcast(qps.back(), gid_of_address(kGroup)).error(), ENOMEM);
  EXPECT_TRUE(
      dev_.attach_mcast(qps.back(), gid_of_address(net::Address::from_v4(239, 0, 0, 1))).ok());
}

}  // namespace
}  // namespace urdma::engine::testing
