#include "daemon/cm_agent.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "daemon/mad_router.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/mad.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace urdma::daemon {
namespace {

constexpr uint64_t kTid = 0x00000002edc7dc65;  // the REQ's in tests/data/rxe-guest-to-host.pcap
const net::Address kPeer = net::Address::from_v4(10, 99, 0, 3);
const net::Address kLocal = net::Address::from_v4(10, 99, 0, 2);
constexpr uint32_t kPeerId = 0x65dcc7ed;
constexpr uint32_t kOwnId = comm_id_for_slot(3, 0x1234);  // slot 3's process
constexpr uint32_t kPeerQpn = 0x11;

template <class View, class Fill>
CmMad mad(Fill fill, uint64_t tid = kTid) {
  CmMad m{};
  fill(wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(m), tid));
  return m;
}

CmMad req(uint32_t comm_id = kPeerId, uint32_t qpn = kPeerQpn) {
  return mad<wire::CmReq>([&](wire::CmReq r) {
    r.set_local_comm_id(comm_id);
    r.set_service_id(0x0000000001064e20);  // RDMA_PS_TCP port 20000
    r.set_local_qpn(qpn);
  });
}

// Views into `m`: keep it alive.
wire::CmMessage parsed(const CmMad& m) {
  const wire::CmParse p = wire::parse_cm(m);
  EXPECT_TRUE(p.ok()) << wire::mad_error_name(p.error);
  return p.message;
}

TEST(CmAgent, NoListenerRejectsAReqWithInvalidServiceId) {
  const auto reply = no_listener_reply(req());
  ASSERT_TRUE(reply);
  const auto m = parsed(*reply);
  EXPECT_EQ(m.attr, wire::CmAttr::kRej);
  EXPECT_EQ(m.header.method(), static_cast<uint8_t>(wire::MadMethod::kSend));
  EXPECT_EQ(m.header.status(), 0);
  EXPECT_EQ(m.header.transaction_id(), kTid) << "the REQ's TID, echoed";
  const auto rej = std::get<wire::CmRejView>(m.view);
  EXPECT_EQ(rej.local_comm_id(), 0u) << "Linux cm_issue_rej: the REQ's (reserved) remote ID";
  EXPECT_EQ(rej.remote_comm_id(), kPeerId);
  EXPECT_EQ(rej.message_rejected(), static_cast<uint8_t>(wire::CmRejMessage::kReq));
  EXPECT_EQ(rej.reason(), 8) << "IBA 12.6.7.2: invalid service ID";
  EXPECT_EQ(rej.reject_info_length(), 0);
  for (uint8_t b : rej.private_data()) ASSERT_EQ(b, 0);
}

TEST(CmAgent, NoListenerAnswersASidrReqWithServiceIdNotSupported) {
  const auto sidr = mad<wire::CmSidrReq>([](wire::CmSidrReq r) {
    r.set_request_id(kPeerId);
    r.set_partition_key(0xFFFF);
    r.set_service_id(0x0000000002064e20);
  });
  const auto reply = no_listener_reply(sidr);
  ASSERT_TRUE(reply);
  const auto m = parsed(*reply);
  EXPECT_EQ(m.header.transaction_id(), kTid);
  const auto rep = std::get<wire::CmSidrRepView>(m.view);
  EXPECT_EQ(rep.request_id(), kPeerId);
  EXPECT_EQ(rep.status(), 1) << "IBA 12.11: service ID not supported";
  EXPECT_EQ(rep.service_id(), 0x0000000002064e20u);
  EXPECT_EQ(rep.qpn(), 0u);
  EXPECT_EQ(rep.q_key(), 0u);
}

TEST(CmAgent, NoListenerAnswersOnlyRequests) {
  const auto rtu = mad<wire::CmRtu>([](wire::CmRtu r) { r.set_local_comm_id(1); });
  EXPECT_FALSE(no_listener_reply(rtu));
  CmMad garbage{};
  EXPECT_FALSE(no_listener_reply(garbage));
  EXPECT_FALSE(no_listener_reply(std::span<const uint8_t>(req()).first(100))) << "short";
}

TEST(CmAgent, DreqForNobodyGetsADrep) {
  const auto dreq = mad<wire::CmDreq>([](wire::CmDreq d) {
    d.set_local_comm_id(kPeerId);
    d.set_remote_comm_id(kOwnId);
    d.set_remote_qpn_eecn(0x123);
  });
  const auto reply = orphan_drep(dreq);
  ASSERT_TRUE(reply);
  const auto m = parsed(*reply);
  EXPECT_EQ(m.header.transaction_id(), kTid);
  const auto drep = std::get<wire::CmDrepView>(m.view);
  EXPECT_EQ(drep.local_comm_id(), kOwnId);
  EXPECT_EQ(drep.remote_comm_id(), kPeerId);
  EXPECT_FALSE(orphan_drep(req()));
}

// The datagram around a MAD, laid out as the rxe capture's REJ (frame 29): UD SEND Only,
// P_Key 0xFFFF, DestQP 1, AckReq, Q_Key 0x80010000, SrcQP 1; the ICRC sealed with IP ID 0, DF.
TEST(CmAgent, GmpDatagramIsAUdSendToQp1) {
  const auto reply = no_listener_reply(req());
  ASSERT_TRUE(reply);
  std::array<uint8_t, kGmpDatagramSize> buf{};
  const size_t n = build_gmp(buf, *reply, 7, kLocal, 4791, kPeer, 4791);
  ASSERT_EQ(n, kGmpDatagramSize);
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
  EXPECT_TRUE(std::equal(reply->begin(), reply->end(), p->payload().begin()));

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

TEST(CmAgent, IcrcOkChecksTheFlowAndTheBytes) {
  const auto reply = no_listener_reply(req());
  ASSERT_TRUE(reply);
  for (const auto& [from, to] :
       {std::pair{kLocal, kPeer},
        std::pair{*net::Address::parse("fd00::2"), *net::Address::parse("fd00::3")}}) {
    std::array<uint8_t, kGmpDatagramSize> buf{};
    ASSERT_EQ(build_gmp(buf, *reply, 1, from, 4791, to, 4791), buf.size());
    EXPECT_TRUE(icrc_ok(buf, {from, 4791}, {to, 4791}));
    EXPECT_FALSE(icrc_ok(buf, {to, 4791}, {from, 4791})) << "another flow";
    buf[40] ^= 1;
    EXPECT_FALSE(icrc_ok(buf, {from, 4791}, {to, 4791})) << "a flipped bit";
  }
}

CmMad rtu(uint32_t from, uint32_t to) {
  return mad<wire::CmRtu>([&](wire::CmRtu r) {
    r.set_local_comm_id(from);
    r.set_remote_comm_id(to);
  });
}

CmMad rep(uint32_t from, uint32_t to, uint32_t qpn) {
  return mad<wire::CmRep>([&](wire::CmRep r) {
    r.set_local_comm_id(from);
    r.set_remote_comm_id(to);
    r.set_local_qpn(qpn);
  });
}

CmMad dreq(uint32_t from, uint32_t to) {
  return mad<wire::CmDreq>([&](wire::CmDreq d) {
    d.set_local_comm_id(from);
    d.set_remote_comm_id(to);
  });
}

// The DREQ a reclaim sends for `c`, decoded.
void expect_dreq_for(const PeerConn& c, uint32_t own, uint32_t peer, uint32_t peer_qpn) {
  const CmMad out = build_dreq(c, 0x77);
  const auto m = parsed(out);
  ASSERT_EQ(m.attr, wire::CmAttr::kDreq);
  EXPECT_EQ(m.header.transaction_id(), 0x77u);
  const auto d = std::get<wire::CmDreqView>(m.view);
  EXPECT_EQ(d.local_comm_id(), own);
  EXPECT_EQ(d.remote_comm_id(), peer);
  EXPECT_EQ(d.remote_qpn_eecn(), peer_qpn)
      << "Linux cm_dreq_handler drops a DREQ naming another QP";
  for (uint8_t b : d.private_data()) ASSERT_EQ(b, 0);
}

TEST(ConnTable, PassiveSideLearnsFromReqThenRtu) {
  ConnTable t;
  t.observe(3, kPeer, kLocal, req());
  EXPECT_EQ(t.established(3), 0u) << "a REQ alone is no connection";
  t.observe(3, kPeer, kLocal, rtu(kPeerId, kOwnId));
  ASSERT_EQ(t.established(3), 1u);
  const auto conns = t.reclaim(3);
  ASSERT_EQ(conns.size(), 1u);
  EXPECT_EQ(conns[0], (PeerConn{kOwnId, kPeerId, kPeerQpn, kLocal, kPeer}));
  expect_dreq_for(conns[0], kOwnId, kPeerId, kPeerQpn);
  EXPECT_TRUE(t.reclaim(3).empty()) << "a slot is reclaimed once";
}

TEST(ConnTable, RtuFromAnotherPeerOrWithoutReqIsIgnored) {
  ConnTable t;
  t.observe(3, kPeer, kLocal, rtu(kPeerId, kOwnId));
  t.observe(3, kPeer, kLocal, req());
  t.observe(3, net::Address::from_v4(10, 99, 0, 9), kLocal, rtu(kPeerId, kOwnId));
  EXPECT_EQ(t.established(3), 0u);
}

TEST(ConnTable, ActiveSideLearnsFromRep) {
  ConnTable t;
  t.observe(3, kPeer, kLocal, rep(kPeerId, kOwnId, 0x99));
  const auto conns = t.reclaim(3);
  ASSERT_EQ(conns.size(), 1u);
  expect_dreq_for(conns[0], kOwnId, kPeerId, 0x99);
  EXPECT_EQ(conns[0].peer, kPeer);
  EXPECT_EQ(conns[0].local, kLocal);
}

TEST(ConnTable, DreqDrepAndRejEndAConnection) {
  ConnTable t;
  const uint32_t a = comm_id_for_slot(3, 1), b = comm_id_for_slot(3, 2), c = comm_id_for_slot(3, 3),
                 d = comm_id_for_slot(3, 4);
  t.observe(3, kPeer, kLocal, rep(11, a, 0x21));
  t.observe(3, kPeer, kLocal, rep(12, b, 0x22));
  t.observe(3, kPeer, kLocal, rep(13, c, 0x23));
  t.observe(3, kPeer, kLocal, rep(14, d, 0x24));
  ASSERT_EQ(t.established(3), 4u);
  t.observe(3, kPeer, kLocal, dreq(11, a));  // the peer disconnects
  t.observe(3, kPeer, kLocal, mad<wire::CmDrep>([&](wire::CmDrep r) {
              r.set_local_comm_id(12);  // the peer answers the process's DREQ
              r.set_remote_comm_id(b);
            }));
  t.observe(3, kPeer, kLocal, mad<wire::CmRej>([&](wire::CmRej r) {
              r.set_local_comm_id(13);
              r.set_remote_comm_id(c);
            }));
  t.observe(3, kPeer, kLocal, dreq(99, d));  // another peer's ID: not this connection's
  const auto conns = t.reclaim(3);
  ASSERT_EQ(conns.size(), 1u);
  EXPECT_EQ(conns[0].local_comm_id, d);
}

TEST(ConnTable, SlotsAreApart) {
  ConnTable t;
  t.observe(3, kPeer, kLocal, rep(kPeerId, kOwnId, 1));
  t.observe(4, kPeer, kLocal, rep(kPeerId + 1, comm_id_for_slot(4, 1), 2));
  EXPECT_EQ(t.reclaim(4).size(), 1u);
  EXPECT_EQ(t.established(3), 1u);
}

TEST(ConnTable, PendingReqsAreBounded) {
  ConnTable t;
  for (uint32_t i = 0; i <= ConnTable::kMaxPendingReqs; ++i)
    t.observe(3, kPeer, kLocal, req(i + 1));
  // The first REQ was forgotten; the last is still awaited.
  t.observe(3, kPeer, kLocal, rtu(1, kOwnId));
  EXPECT_EQ(t.established(3), 0u);
  t.observe(3, kPeer, kLocal, rtu(ConnTable::kMaxPendingReqs + 1, kOwnId));
  EXPECT_EQ(t.established(3), 1u);
}

TEST(ConnTable, GarbageIsIgnored) {
  ConnTable t;
  CmMad garbage{};
  garbage.fill(0xAB);
  t.observe(3, kPeer, kLocal, garbage);
  t.observe(3, kPeer, kLocal, std::span<const uint8_t>());
  EXPECT_EQ(t.established(3), 0u);
}

CmMad drep(uint32_t from, uint32_t to) {
  return mad<wire::CmDrep>([&](wire::CmDrep r) {
    r.set_local_comm_id(from);
    r.set_remote_comm_id(to);
  });
}

const Releases::Dreq kDreq{.conn = {kOwnId, kPeerId, kPeerQpn, kLocal, kPeer}, .transaction_id = 5};

TEST(Releases, ADreqIsRepeatedUntilItsRetriesRunOut) {
  Releases r;
  r.sent(kDreq, 1000);
  EXPECT_EQ(r.next_deadline_ms(), 1000 + Releases::kTimeoutMs);
  EXPECT_TRUE(r.due(1000 + Releases::kTimeoutMs - 1).empty());
  int64_t now = 1000;
  for (int i = 0; i < Releases::kRetries; ++i) {
    now += Releases::kTimeoutMs;
    const auto again = r.due(now);
    ASSERT_EQ(again.size(), 1u) << i;
    EXPECT_EQ(again[0].conn, kDreq.conn);
    EXPECT_EQ(again[0].transaction_id, 5u) << "a retransmission keeps its TID";
  }
  EXPECT_TRUE(r.due(now + Releases::kTimeoutMs).empty());
  EXPECT_EQ(r.size(), 0u) << "forgotten once out of retries";
  EXPECT_FALSE(r.next_deadline_ms());
}

TEST(Releases, ItsDrepEndsIt) {
  Releases r;
  r.sent(kDreq, 0);
  EXPECT_FALSE(r.take_drep(kPeer, drep(kPeerId + 1, kOwnId))) << "another peer comm ID";
  EXPECT_FALSE(r.take_drep(kLocal, drep(kPeerId, kOwnId))) << "from another address";
  EXPECT_FALSE(r.take_drep(kPeer, drep(kPeerId, kOwnId + 1))) << "another connection";
  EXPECT_FALSE(r.take_drep(kPeer, dreq(kPeerId, kOwnId))) << "not a DREP";
  EXPECT_TRUE(r.take_drep(kPeer, drep(kPeerId, kOwnId)));
  EXPECT_EQ(r.size(), 0u);
  EXPECT_TRUE(r.due(10 * Releases::kTimeoutMs).empty());
  EXPECT_FALSE(r.take_drep(kPeer, drep(kPeerId, kOwnId))) << "a duplicate DREP is a process's";
}

}  // namespace
}  // namespace urdma::daemon
