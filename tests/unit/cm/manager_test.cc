// The CM state machine between two managers on an in-memory link (cm_link.h): establishment,
// release, rejection, retransmission, MRA, duplicates, stale connections, SIDR, limits.
#include "cm/manager.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <numeric>

#include "cm/timing.h"
#include "cm_link.h"
#include "daemon/mad_router.h"
#include "wire/cm.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::cm {
namespace {

using test::kMs;
using test::Link;
using wire::CmAttr;

constexpr uint16_t kPort = 7174;
const uint64_t kSid = wire::rdma_service_id(wire::RdmaPortSpace::kTcp, kPort);
const Gid kGidA = test::ipv4_gid(10, 0, 0, 1);
const Gid kGidB = test::ipv4_gid(10, 0, 0, 2);
const Gid kGidNobody = test::ipv4_gid(10, 0, 0, 99);

ManagerConfig config(unsigned slot, uint64_t guid, uint64_t seed) {
  ManagerConfig c;
  c.slot = slot;
  c.local_ca_guid = guid;
  c.seed = seed;
  return c;
}

struct Pair {
  explicit Pair(test::LinkFaults f = {}) : link(f) {
    a = link.add_host(kGidA, config(3, 0x0200'00ff'fe00'0001ULL, f.seed));
    b = link.add_host(kGidB, config(7, 0x0200'00ff'fe00'0002ULL, f.seed * 31 + 7));
  }
  Link link;
  size_t a, b;
};

wire::CmaAddress ip_of(const Gid& src, const Gid& dst, uint16_t src_port) {
  wire::CmaAddress ip;
  ip.ip_version = wire::kCmaIpVersion4;
  ip.src_port = src_port;
  ip.src_addr = src;
  ip.dst_addr = dst;
  return ip;
}

ConnectParams connect_params(const Gid& from, const Gid& to,
                             std::span<const uint8_t> private_data = {}) {
  ConnectParams p;
  p.path.local_gid = from;
  p.path.remote_gid = to;
  p.service_id = kSid;
  p.qpn = 0x3017;
  p.starting_psn = 0xabcdef;
  p.responder_resources = 4;
  p.initiator_depth = 4;
  p.ip = ip_of(from, to, 40000);
  p.private_data = private_data;
  return p;
}

std::vector<uint8_t> bytes(size_t n, uint8_t first) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The area's first n bytes equal `want` and the rest is zero.
void expect_prefix(const std::vector<uint8_t>& area, const std::vector<uint8_t>& want) {
  ASSERT_GE(area.size(), want.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), area.begin()));
  EXPECT_TRUE(std::all_of(area.begin() + static_cast<ptrdiff_t>(want.size()), area.end(),
                          [](uint8_t x) { return x == 0; }));
}

TEST(CmManager, ConnectAcceptEstablishDisconnectTimewait) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  const auto req_data = bytes(56, 1);
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB, req_data));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(daemon::slot_of_comm_id(*id), 3u);  // urdmad routes replies by this
  p.link.run_for(1 * kMs);

  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  EXPECT_EQ(daemon::slot_of_comm_id(req->id), 7u);
  EXPECT_EQ(req->service_id, kSid);
  ASSERT_TRUE(req->ip.has_value());
  EXPECT_EQ(*req->ip, ip_of(kGidA, kGidB, 40000));
  EXPECT_EQ(req->private_data.size(), kRdmaReqPrivateDataMax);
  expect_prefix(req->private_data, req_data);
  EXPECT_EQ(req->remote_qpn, 0x3017u);
  EXPECT_EQ(req->remote_gid, kGidA);
  EXPECT_EQ(req->local_gid, kGidB);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kReqRcvd);

  const auto rep_data = bytes(196, 9);
  AcceptParams ap;
  ap.qpn = 0x7021;
  ap.private_data = rep_data;
  // rdma_init_qp_attr before rdma_accept: the RTR already expects the REP's Starting PSN.
  auto early_rtr = p.link.m(p.b).qp_attrs(req->id, IBV_QPS_RTR);
  ASSERT_TRUE(early_rtr.ok());
  auto acc = p.link.m(p.b).accept(req->id, ap);
  ASSERT_TRUE(acc.ok());
  // The passive QP (Linux cm.c; rxe NAKs any other choice): it sends from the REQ's Starting
  // PSN and expects the REP's.
  EXPECT_EQ(acc->rtr.attr.rq_psn, early_rtr->attr.rq_psn);
  EXPECT_EQ(acc->rtr.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(acc->rtr.attr.dest_qp_num, 0x3017u);
  EXPECT_EQ(acc->rtr.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(acc->rtr.attr.max_dest_rd_atomic, 4);
  EXPECT_EQ(acc->rtr.attr.min_rnr_timer, 0);
  EXPECT_TRUE(std::equal(kGidA.begin(), kGidA.end(), acc->rtr.attr.ah_attr.grh.dgid.raw));
  EXPECT_EQ(acc->rtr.attr.ah_attr.grh.hop_limit, 64);
  EXPECT_EQ(acc->rtr.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(acc->rts.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(acc->rts.attr.sq_psn, 0xabcdefu);
  EXPECT_EQ(acc->rts.attr.timeout, 19);  // the REQ's local ACK timeout
  EXPECT_EQ(acc->rts.attr.retry_cnt, 7);
  EXPECT_EQ(acc->rts.attr.rnr_retry, 7);
  EXPECT_EQ(acc->rts.attr.max_rd_atomic, 4);
  EXPECT_EQ(acc->rts.mask, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  p.link.run_for(1 * kMs);

  auto est_a = p.link.find(p.a, EventType::kEstablished, *id);
  ASSERT_TRUE(est_a.has_value());
  expect_prefix(est_a->private_data, rep_data);
  EXPECT_EQ(est_a->remote_qpn, 0x7021u);
  ASSERT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kEstablished);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kEstablished);
  // The active QP, mirrored.
  auto rtr = p.link.m(p.a).qp_attrs(*id, IBV_QPS_RTR);
  auto rts = p.link.m(p.a).qp_attrs(*id, IBV_QPS_RTS);
  ASSERT_TRUE(rtr.ok() && rts.ok());
  EXPECT_EQ(rtr->attr.dest_qp_num, 0x7021u);
  EXPECT_EQ(rtr->attr.rq_psn, 0xabcdefu);
  EXPECT_EQ(rts->attr.sq_psn, acc->rtr.attr.rq_psn);
  const auto rep = std::find_if(p.link.sent().begin(), p.link.sent().end(), [](const test::Sent& s) {
    return s.attr() == static_cast<uint16_t>(wire::CmAttr::kRep);
  });
  ASSERT_NE(rep, p.link.sent().end());
  EXPECT_EQ(wire::CmRepView(rep->out.mad).starting_psn(), acc->rtr.attr.rq_psn);
  EXPECT_EQ(rts->attr.timeout, 19);  // cm_ack_timeout(15, 19 - 1)
  // A late duplicate of the REQ changes nothing on an established connection (Linux
  // cm_dup_req_handler drops it).
  const auto reqs = p.link.sent_of(p.a, CmAttr::kReq);
  ASSERT_EQ(reqs.size(), 1u);
  p.link.m(p.b).receive(kGidA, 1, reqs[0].out.mad);
  EXPECT_TRUE(p.link.m(p.b).take_outgoing().empty());
  EXPECT_TRUE(p.link.m(p.b).take_events().empty());
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kEstablished);
  EXPECT_EQ(p.link.m(p.b).counters().duplicates, 1u);
  auto init = p.link.m(p.a).qp_attrs(*id, IBV_QPS_INIT);
  ASSERT_TRUE(init.ok());
  EXPECT_EQ(init->attr.qp_access_flags,
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);

  // Release: DREQ → DREP; both report DISCONNECTED, then TIMEWAIT_EXIT after the local ACK
  // timeout (2^(19-8) ms = 2048 ms).
  ASSERT_TRUE(p.link.m(p.a).disconnect(*id).ok());
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.find(p.b, EventType::kDisconnected, req->id).has_value());
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kDreqRcvd);
  EXPECT_FALSE(p.link.find(p.a, EventType::kDisconnected, *id).has_value());  // waits for the DREP
  ASSERT_TRUE(p.link.m(p.b).disconnect(req->id).ok());
  const uint64_t drep_at = p.link.clock().now_ns();
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.find(p.a, EventType::kDisconnected, *id).has_value());
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kTimewait);
  p.link.run_until(drep_at + 2040 * kMs);
  EXPECT_FALSE(p.link.find(p.b, EventType::kTimewaitExit).has_value());
  p.link.run_until(drep_at + 2060 * kMs);
  EXPECT_TRUE(p.link.find(p.a, EventType::kTimewaitExit, *id).has_value());
  EXPECT_TRUE(p.link.find(p.b, EventType::kTimewaitExit, req->id).has_value());
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
  // Nothing was retransmitted on a clean link.
  EXPECT_EQ(p.link.m(p.a).counters().retransmitted, 0u);
  EXPECT_EQ(p.link.m(p.b).counters().retransmitted, 0u);
  test::EventOrder order;
  p.link.check_order(order, p.a);
  p.link.check_order(order, p.b);
}

TEST(CmManager, RejectCarriesReasonAriAndPrivateData) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  const auto ari = bytes(72, 100);
  const auto data = bytes(148, 7);
  RejectParams rp;
  rp.ari = ari;
  rp.private_data = data;
  ASSERT_TRUE(p.link.m(p.b).reject(req->id, rp).ok());
  EXPECT_FALSE(p.link.m(p.b).state(req->id).has_value());
  p.link.run_for(1 * kMs);
  auto rej = p.link.find(p.a, EventType::kRejected, *id);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(rej->reason, static_cast<uint16_t>(wire::CmRejReason::kConsumerDefined));
  EXPECT_EQ(rej->ari, ari);
  EXPECT_EQ(rej->private_data, data);
  EXPECT_FALSE(p.link.m(p.a).state(*id).has_value());
  const auto rejs = p.link.sent_of(p.b, CmAttr::kRej);
  ASSERT_EQ(rejs.size(), 1u);
  const wire::CmRejView v(rejs[0].out.mad);
  EXPECT_EQ(v.message_rejected(), static_cast<uint8_t>(wire::CmRejMessage::kReq));
  EXPECT_EQ(v.remote_comm_id(), *id);
  // No retransmission after the REJ.
  p.link.run_for(60'000 * kMs);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kReq).size(), 1u);
}

TEST(CmManager, NoListenerRejectsWithInvalidServiceId) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid + 1).ok());  // another port
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  EXPECT_FALSE(p.link.find(p.b, EventType::kConnectRequest).has_value());
  auto rej = p.link.find(p.a, EventType::kRejected, *id);
  ASSERT_TRUE(rej.has_value());
  // IBA 12.6.7 reason 8; Linux's cm_match_req sends the same.
  EXPECT_EQ(rej->reason, static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
}

// A REQ for an ID that is bound but not listened on yet (rdma_bind_addr, then rdma_listen a
// moment later: perftest -R, qperf) waits for the listen and is served by it.
TEST(CmManager, ARequestForAClaimedIdWaitsForTheListenAndIsServed) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).claim(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(300 * kMs);
  EXPECT_TRUE(p.link.sent_of(p.b, CmAttr::kRej).empty());
  EXPECT_TRUE(p.link.events(p.b).empty());
  EXPECT_EQ(p.link.m(p.b).waiting_count(), 1u);
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kReqSent);
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  EXPECT_EQ(p.link.m(p.b).waiting_count(), 0u);
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  EXPECT_EQ(req->service_id, kSid);
  AcceptParams ap;
  ap.qpn = 0x55;
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, ap).ok());
  p.link.run_for(1 * kMs);
  EXPECT_EQ(p.link.sent_of(p.b, CmAttr::kRep).size(), 1u);
  EXPECT_TRUE(p.link.find(p.a, EventType::kEstablished, *id).has_value());
  EXPECT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
  EXPECT_EQ(p.link.m(p.b).counters().waited_for_listen, 1u);
  EXPECT_EQ(p.link.m(p.b).counters().wait_expired, 0u);
}

// No listen within the bound: the REQ is refused as for nobody (REJ 8), at the bound.
TEST(CmManager, ARequestForAClaimedIdThatNeverListensIsRefusedWhenTheWaitEnds) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).claim(kSid).ok());
  EXPECT_EQ(p.link.m(p.b).claim(kSid).error(), EADDRINUSE);
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  const uint64_t arrived = p.link.clock().now_ns() + 100'000;  // the link's one-way delay
  p.link.run_until(arrived + kListenWaitMs * kMs - 1);
  EXPECT_TRUE(p.link.sent_of(p.b, CmAttr::kRej).empty());
  p.link.run_until(arrived + kListenWaitMs * kMs);
  const auto rejs = p.link.sent_of(p.b, CmAttr::kRej);
  ASSERT_EQ(rejs.size(), 1u);
  EXPECT_EQ(rejs[0].at_ns, arrived + kListenWaitMs * kMs);
  const wire::CmRejView rej(rejs[0].out.mad);
  EXPECT_EQ(rej.reason(), static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
  EXPECT_EQ(rej.local_comm_id(), 0u);
  EXPECT_EQ(rej.remote_comm_id(), *id);
  p.link.run_for(1 * kMs);
  auto r = p.link.find(p.a, EventType::kRejected, *id);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
  EXPECT_EQ(p.link.m(p.b).waiting_count(), 0u);
  EXPECT_EQ(p.link.m(p.b).counters().wait_expired, 1u);
  EXPECT_EQ(p.link.m(p.b).next_deadline_ns(), net::kNever);
  // A listen after the wait serves nothing old.
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  p.link.run_for(1 * kMs);
  EXPECT_FALSE(p.link.find(p.b, EventType::kConnectRequest).has_value());
}

// The id gives its claim back (destroyed, or it connects instead): refused at once.
TEST(CmManager, AGivenBackClaimRefusesWhatWaitedAtOnce) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).claim(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(10 * kMs);
  EXPECT_EQ(p.link.m(p.b).waiting_count(), 1u);
  ASSERT_TRUE(p.link.m(p.b).unclaim(kSid).ok());
  EXPECT_EQ(p.link.m(p.b).unclaim(kSid).error(), EINVAL);
  p.link.run_for(1 * kMs);
  auto r = p.link.find(p.a, EventType::kRejected, *id);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId));
  // Unclaimed, a REQ is refused at once as before.
  auto id2 = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id2.ok());
  p.link.run_for(1 * kMs);
  EXPECT_TRUE(p.link.find(p.a, EventType::kRejected, *id2).has_value());
}

// A wait longer than the requester's response timeout: its retransmission is answered with an
// MRA for the rest of the wait (IBA 12.6.6), which keeps it waiting instead of giving up; the
// listen then serves the REQ.
TEST(CmManager, ARetransmittedWaitingReqIsAnsweredWithAnMraForTheRestOfTheWait) {
  test::Link link;
  ManagerConfig cb = config(7, 0x0200'00ff'fe00'0002ULL, 2);
  cb.listen_wait_ns = 10'000 * kMs;  // beyond A's 6144 ms
  const size_t a = link.add_host(kGidA, config(3, 0x0200'00ff'fe00'0001ULL, 1));
  const size_t b = link.add_host(kGidB, cb);
  ASSERT_TRUE(link.m(b).claim(kSid).ok());
  auto id = link.m(a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  const uint64_t t0 = link.clock().now_ns();
  link.run_until(t0 + 6144 * kMs + 1 * kMs);
  ASSERT_EQ(link.sent_of(a, CmAttr::kReq).size(), 2u);
  const auto mras = link.sent_of(b, CmAttr::kMra);
  ASSERT_EQ(mras.size(), 1u);
  const wire::CmMraView mra(mras[0].out.mad);
  EXPECT_EQ(mra.message_mraed(), static_cast<uint8_t>(wire::CmMraMessage::kReq));
  EXPECT_EQ(mra.remote_comm_id(), *id);
  EXPECT_EQ(mra.local_comm_id(), 0u);
  // 10000 - 6144 ms left, rounded up to 2^(20-8) ms.
  EXPECT_EQ(mra.service_timeout(), 20);
  EXPECT_EQ(link.m(a).state(*id), State::kMraReqRcvd);
  EXPECT_EQ(link.m(b).waiting_count(), 1u) << "the retransmission does not wait twice";
  link.run_until(t0 + 9000 * kMs);
  ASSERT_TRUE(link.m(b).listen(kSid).ok());
  link.run_for(1 * kMs);
  auto req = link.find(b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(link.m(b).accept(req->id, AcceptParams{.qpn = 0x55}).ok());
  link.run_for(1 * kMs);
  EXPECT_TRUE(link.find(a, EventType::kEstablished, *id).has_value());
  EXPECT_EQ(link.events(b).size(), 2u) << "one request, then established";
}

// Bounded: max_waiting_per_service for one ID, max_waiting in all; beyond, refused at once.
TEST(CmManager, WaitingRequestsAreBounded) {
  test::Link link;
  ManagerConfig cb = config(7, 0x0200'00ff'fe00'0002ULL, 2);
  cb.max_waiting = 3;
  cb.max_waiting_per_service = 2;
  const size_t a = link.add_host(kGidA, config(3, 0x0200'00ff'fe00'0001ULL, 1));
  const size_t b = link.add_host(kGidB, cb);
  const uint64_t other = kSid + 1;
  ASSERT_TRUE(link.m(b).claim(kSid).ok());
  ASSERT_TRUE(link.m(b).claim(other).ok());
  std::vector<ConnId> ids;
  for (uint32_t i = 0; i < 3; ++i) {
    ConnectParams cp = connect_params(kGidA, kGidB);
    cp.qpn += i;  // one QP each: the same QP twice is a stale connection (IBA 12.9.8.3.1)
    auto id = link.m(a).connect(cp);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  link.run_for(1 * kMs);
  EXPECT_EQ(link.m(b).waiting_count(), 2u);
  EXPECT_TRUE(link.find(a, EventType::kRejected, ids[2]).has_value()) << "the third, at once";
  EXPECT_FALSE(link.find(a, EventType::kRejected, ids[0]).has_value());
  ConnectParams po = connect_params(kGidA, kGidB);
  po.service_id = other;
  po.qpn += 3;
  auto o1 = link.m(a).connect(po);
  po.qpn += 1;
  auto o2 = link.m(a).connect(po);
  ASSERT_TRUE(o1.ok() && o2.ok());
  link.run_for(1 * kMs);
  EXPECT_EQ(link.m(b).waiting_count(), 3u);
  EXPECT_FALSE(link.find(a, EventType::kRejected, *o1).has_value());
  EXPECT_TRUE(link.find(a, EventType::kRejected, *o2).has_value()) << "max_waiting in all";
  EXPECT_EQ(link.m(b).counters().wait_full, 2u);
  ASSERT_TRUE(link.m(b).listen(kSid).ok());
  link.run_for(1 * kMs);
  size_t requests = 0;
  for (const Event& e : link.events(b)) requests += e.type == EventType::kConnectRequest;
  EXPECT_EQ(requests, 2u);
}

// SIDR too: a SIDR_REQ waits for the listen; unanswered, it gets SIDR_REP status 1.
TEST(CmManager, ASidrRequestForAClaimedIdWaitsThenIsServedOrRefused) {
  Pair p;
  const uint64_t udp_sid = wire::rdma_service_id(wire::RdmaPortSpace::kUdp, kPort);
  ASSERT_TRUE(p.link.m(p.b).claim(udp_sid).ok());
  ASSERT_TRUE(p.link.m(p.b).claim(udp_sid + 1).ok());
  SidrQueryParams q;
  q.path.local_gid = kGidA;
  q.path.remote_gid = kGidB;
  q.service_id = udp_sid;
  q.ip = ip_of(kGidA, kGidB, 5555);
  auto served = p.link.m(p.a).sidr_query(q);
  q.service_id = udp_sid + 1;
  auto refused = p.link.m(p.a).sidr_query(q);
  ASSERT_TRUE(served.ok() && refused.ok());
  p.link.run_for(500 * kMs);
  EXPECT_EQ(p.link.m(p.b).waiting_count(), 2u);
  ASSERT_TRUE(p.link.m(p.b).listen(udp_sid).ok());
  p.link.run_for(1 * kMs);
  auto r = p.link.find(p.b, EventType::kSidrRequest);
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(p.link.m(p.b).sidr_answer(r->id, SidrAnswerParams{.qpn = 0x1234, .qkey = 7}).ok());
  p.link.run_for(1 * kMs);
  auto s = p.link.find(p.a, EventType::kSidrResponse, *served);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->sidr_status, 0);
  EXPECT_EQ(s->remote_qpn, 0x1234u);
  p.link.run_for(kListenWaitMs * kMs);
  auto s2 = p.link.find(p.a, EventType::kSidrResponse, *refused);
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(s2->sidr_status, static_cast<uint8_t>(wire::CmSidrStatus::kUnsupported));
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
}

TEST(CmManager, UnansweredReqRetransmitsOnScheduleThenRejTimeoutAndUnreachable) {
  Pair p;
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidNobody));
  ASSERT_TRUE(id.ok());
  const uint64_t t0 = p.link.clock().now_ns();
  // 2 × 2^(18-8) + 2^(20-8) ms between sends; 15 retries; the REJ at the 16th timeout.
  constexpr uint64_t kTimeout = 6144 * kMs;
  p.link.run_until(t0 + 16 * kTimeout - 1);
  EXPECT_FALSE(p.link.find(p.a, EventType::kUnreachable).has_value());
  p.link.run_until(t0 + 16 * kTimeout);
  const auto reqs = p.link.sent_of(p.a, CmAttr::kReq);
  ASSERT_EQ(reqs.size(), 16u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].at_ns, t0 + i * kTimeout) << "send " << i;
    EXPECT_EQ(reqs[i].out.mad, reqs[0].out.mad);  // a retransmission is the same MAD
    EXPECT_EQ(reqs[i].out.dest_gid, kGidNobody);
  }
  const auto rejs = p.link.sent_of(p.a, CmAttr::kRej);
  ASSERT_EQ(rejs.size(), 1u);
  EXPECT_EQ(rejs[0].at_ns, t0 + 16 * kTimeout);
  const wire::CmRejView rej(rejs[0].out.mad);
  EXPECT_EQ(rej.reason(), static_cast<uint16_t>(wire::CmRejReason::kTimeout));
  EXPECT_EQ(rej.local_comm_id(), *id);
  EXPECT_EQ(rej.remote_comm_id(), 0u);
  const std::vector<uint8_t> guid = {0x02, 0x00, 0x00, 0xff, 0xfe, 0x00, 0x00, 0x01};
  EXPECT_EQ(std::vector<uint8_t>(rej.ari().begin(), rej.ari().end()), guid);
  auto un = p.link.find(p.a, EventType::kUnreachable, *id);
  ASSERT_TRUE(un.has_value());
  EXPECT_EQ(un->status, ETIMEDOUT);
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
  EXPECT_EQ(p.link.m(p.a).counters().retransmitted, 15u);
}

TEST(CmManager, MraForADuplicateReqStretchesTheActiveSidesWait) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  const uint64_t t0 = p.link.clock().now_ns();
  // The application on B does not answer; A's REQ retransmission reaches B, which answers it
  // with rdma_cm's delayed MRA (service timeout 24).
  p.link.run_until(t0 + 6144 * kMs + 1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  EXPECT_EQ(p.link.events(p.b).size(), 1u);  // the duplicate is no second request
  const auto mras = p.link.sent_of(p.b, CmAttr::kMra);
  ASSERT_EQ(mras.size(), 1u);
  const wire::CmMraView mra(mras[0].out.mad);
  EXPECT_EQ(mra.message_mraed(), static_cast<uint8_t>(wire::CmMraMessage::kReq));
  EXPECT_EQ(mra.service_timeout(), kCmaMraServiceTimeout);
  EXPECT_EQ(mra.remote_comm_id(), *id);
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kMraReqRcvd);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kMraReqSent);
  // A waits 2^(24-8) + 2^(19-8) ms from the MRA before sending again.
  const uint64_t mra_rx = mras[0].at_ns + 100'000;  // the link's one-way delay
  p.link.run_until(mra_rx + (65536 + 2048) * kMs - 1);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kReq).size(), 2u);
  p.link.run_until(mra_rx + (65536 + 2048) * kMs);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kReq).size(), 3u);
  p.link.run_for(1 * kMs);
  EXPECT_EQ(p.link.sent_of(p.b, CmAttr::kMra).size(), 2u);  // answered again
  // The application finally accepts.
  AcceptParams ap;
  ap.qpn = 0x55;
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, ap).ok());
  p.link.run_for(1 * kMs);
  EXPECT_TRUE(p.link.find(p.a, EventType::kEstablished, *id).has_value());
  EXPECT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
}

TEST(CmManager, DuplicateReqInRepSentResendsTheRep) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  // The REP and its first retransmission (4096 ms later: the REQ's Local CM Response
  // Timeout) are lost; A's REQ retransmission at 6144 ms makes B send the REP a third time,
  // before its own next retransmission at 8192 ms.
  int reps_dropped = 0;
  p.link.filter = [&](const test::Sent& s) {
    if (s.attr() == static_cast<uint16_t>(CmAttr::kRep) && reps_dropped < 2) {
      ++reps_dropped;
      return false;
    }
    return true;
  };
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  AcceptParams ap;
  ap.qpn = 0x99;
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, ap).ok());
  p.link.run_for(1 * kMs);
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kReqSent);  // the REP was lost
  p.link.run_for(6144 * kMs);
  const auto reps = p.link.sent_of(p.b, CmAttr::kRep);
  ASSERT_EQ(reps.size(), 3u);
  EXPECT_EQ(reps[2].out.mad, reps[0].out.mad);
  const auto reqs = p.link.sent_of(p.a, CmAttr::kReq);
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reps[2].at_ns, reqs[1].at_ns + 100'000);  // an answer to the duplicate REQ
  EXPECT_TRUE(p.link.find(p.a, EventType::kEstablished, *id).has_value());
  EXPECT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
  EXPECT_EQ(p.link.m(p.b).counters().duplicates, 1u);
}

TEST(CmManager, DuplicateRepAfterEstablishedResendsTheRtu) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  int rtus = 0;
  p.link.filter = [&](const test::Sent& s) {
    return !(s.attr() == static_cast<uint16_t>(CmAttr::kRtu) && rtus++ == 0);
  };
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kRepSent);
  // The REP timeout is the REQ's Local CM Response Timeout: 2^(20-8) ms.
  p.link.run_for(4096 * kMs);
  EXPECT_EQ(p.link.sent_of(p.b, CmAttr::kRep).size(), 2u);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kRtu).size(), 2u);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kEstablished);
  EXPECT_EQ(p.link.m(p.a).counters().duplicates, 1u);
}

TEST(CmManager, TrafficBeforeTheRtuEstablishesThePassiveSide) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  p.link.filter = [](const test::Sent& s) {
    return s.attr() != static_cast<uint16_t>(CmAttr::kRtu);
  };
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.m(p.b).notify_established(req->id).ok());
  p.link.run_for(1 * kMs);
  EXPECT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
  p.link.run_for(20'000 * kMs);
  EXPECT_EQ(p.link.sent_of(p.b, CmAttr::kRep).size(), 1u);  // no more REP retransmissions
}

TEST(CmManager, StaleReqFromAConnectedQpIsRejectedAndTheOldConnectionReleased) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  const ConnId b_id = req->id;
  ASSERT_TRUE(p.link.m(p.b).accept(b_id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  ASSERT_EQ(p.link.m(p.b).state(b_id), State::kEstablished);

  // A third manager with A's CA GUID (A restarted, its old connection forgotten) connects
  // again from the same QPN: B's connection to that QP is stale.
  const size_t a2 =
      p.link.add_host(test::ipv4_gid(10, 0, 0, 3), config(4, 0x0200'00ff'fe00'0001ULL, 99));
  auto id2 = p.link.m(a2).connect(connect_params(test::ipv4_gid(10, 0, 0, 3), kGidB));
  ASSERT_TRUE(id2.ok());
  p.link.run_for(1 * kMs);
  auto rej = p.link.find(a2, EventType::kRejected, *id2);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(rej->reason, static_cast<uint16_t>(wire::CmRejReason::kStaleConn));
  EXPECT_EQ(p.link.m(p.b).counters().stale_rejected, 1u);
  // B released the old connection: a DREQ to A, whose application is told.
  EXPECT_EQ(p.link.sent_of(p.b, CmAttr::kDreq).size(), 1u);
  EXPECT_TRUE(p.link.find(p.a, EventType::kDisconnected, *id).has_value());
  EXPECT_EQ(p.link.m(p.b).state(b_id), State::kDreqSent);
  // A REJ "stale" leaves the rejected side in timewait (Linux cm_rej_handler).
  EXPECT_EQ(p.link.m(a2).state(*id2), State::kTimewait);
  ASSERT_TRUE(p.link.m(p.a).disconnect(*id).ok());  // A's DREP
  p.link.run_for(1 * kMs);
  EXPECT_TRUE(p.link.find(p.b, EventType::kDisconnected, b_id).has_value());
  EXPECT_EQ(p.link.m(p.b).state(b_id), State::kTimewait);
  test::EventOrder order;
  p.link.check_order(order, p.a);
  p.link.check_order(order, p.b);
  p.link.check_order(order, a2);
}

TEST(CmManager, DuplicateReqInTimewaitIsAnsweredStale) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.m(p.b).disconnect(req->id).ok());
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.m(p.a).disconnect(*id).ok());
  p.link.run_for(1 * kMs);
  ASSERT_EQ(p.link.m(p.b).state(req->id), State::kTimewait);
  // Replay A's original REQ into B.
  const auto reqs = p.link.sent_of(p.a, CmAttr::kReq);
  ASSERT_EQ(reqs.size(), 1u);
  p.link.m(p.b).receive(kGidA, 1, reqs[0].out.mad);
  const auto out = p.link.m(p.b).take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  const wire::CmRejView rej(out[0].mad);
  EXPECT_EQ(rej.header().attribute_id(), static_cast<uint16_t>(CmAttr::kRej));
  EXPECT_EQ(rej.reason(), static_cast<uint16_t>(wire::CmRejReason::kStaleConn));
  EXPECT_TRUE(p.link.m(p.b).take_events().empty());
}

TEST(CmManager, UnansweredDreqStillReachesTimewaitExit) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  // B vanishes: every MAD to B is lost from now on.
  p.link.filter = [](const test::Sent& s) { return s.out.dest_gid != kGidB; };
  ASSERT_TRUE(p.link.m(p.a).disconnect(*id).ok());
  const uint64_t t0 = p.link.clock().now_ns();
  constexpr uint64_t kTimeout = 6144 * kMs;
  p.link.run_until(t0 + 16 * kTimeout);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kDreq).size(), 16u);
  auto d = p.link.find(p.a, EventType::kDisconnected, *id);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->status, ETIMEDOUT);
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kTimewait);
  p.link.run_for(2048 * kMs);
  EXPECT_TRUE(p.link.find(p.a, EventType::kTimewaitExit, *id).has_value());
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
}

TEST(CmManager, DestroyWhileReqPendingSendsRejTimeoutThePassiveSideSees) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  p.link.m(p.a).destroy(*id);
  p.link.run_for(1 * kMs);
  // B finds its connection by A's CA GUID in the ARI and A's comm ID (it never learnt B's).
  auto rej = p.link.find(p.b, EventType::kRejected, req->id);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(rej->reason, static_cast<uint16_t>(wire::CmRejReason::kTimeout));
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
  EXPECT_TRUE(p.link.events(p.a).empty());  // a destroyed id reports nothing
}

TEST(CmManager, DestroyEstablishedDisconnectsThePeer) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  const ConnId b_id = req->id;
  ASSERT_TRUE(p.link.m(p.b).accept(b_id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  p.link.m(p.b).destroy(b_id);  // the process died; urdmad tears its connections down
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.find(p.a, EventType::kDisconnected, *id).has_value());
  ASSERT_TRUE(p.link.m(p.a).disconnect(*id).ok());  // A's application answers
  p.link.run_for(3000 * kMs);
  EXPECT_TRUE(p.link.find(p.a, EventType::kTimewaitExit, *id).has_value());
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
  EXPECT_FALSE(p.link.find(p.b, EventType::kDisconnected, b_id).has_value());
}

TEST(CmManager, ManualRtuReportsTheRepThenEstablishes) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  ConnectParams cp = connect_params(kGidA, kGidB);
  cp.manual_rtu = true;
  auto id = p.link.m(p.a).connect(cp);
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 0x42}).ok());
  p.link.run_for(1 * kMs);
  ASSERT_TRUE(p.link.find(p.a, EventType::kConnectResponse, *id).has_value());
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kRepRcvd);
  EXPECT_TRUE(p.link.m(p.a).qp_attrs(*id, IBV_QPS_RTS).ok());
  // B's REP times out while A's application is slow: A answers the duplicate with an MRA.
  p.link.run_for(4096 * kMs);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kMra).size(), 1u);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kMraRepRcvd);
  ASSERT_TRUE(p.link.m(p.a).establish(*id).ok());
  p.link.run_for(1 * kMs);
  EXPECT_EQ(p.link.m(p.a).state(*id), State::kEstablished);
  EXPECT_TRUE(p.link.find(p.b, EventType::kEstablished, req->id).has_value());
}

TEST(CmManager, SidrQueryAnswerAndNoListener) {
  Pair p;
  const uint64_t udp_sid = wire::rdma_service_id(wire::RdmaPortSpace::kUdp, kPort);
  ASSERT_TRUE(p.link.m(p.b).listen(udp_sid).ok());
  SidrQueryParams q;
  q.path.local_gid = kGidA;
  q.path.remote_gid = kGidB;
  q.service_id = udp_sid;
  q.ip = ip_of(kGidA, kGidB, 5555);
  const auto data = bytes(180, 3);
  q.private_data = data;
  auto id = p.link.m(p.a).sidr_query(q);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(daemon::slot_of_comm_id(*id), 3u);  // the SIDR_REP is routed by RequestID
  p.link.run_for(1 * kMs);
  auto r = p.link.find(p.b, EventType::kSidrRequest);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r->ip, ip_of(kGidA, kGidB, 5555));
  EXPECT_EQ(r->private_data, data);
  const auto answer = bytes(136, 50);
  ASSERT_TRUE(
      p.link.m(p.b)
          .sidr_answer(r->id,
                       SidrAnswerParams{.qpn = 0x1234, .qkey = 0x01234567, .private_data = answer})
          .ok());
  p.link.run_for(1 * kMs);
  auto s = p.link.find(p.a, EventType::kSidrResponse, *id);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->sidr_status, 0);
  EXPECT_EQ(s->remote_qpn, 0x1234u);
  EXPECT_EQ(s->qkey, 0x01234567u);
  EXPECT_EQ(s->private_data, answer);

  q.service_id = udp_sid + 1;  // nobody listens
  auto id2 = p.link.m(p.a).sidr_query(q);
  ASSERT_TRUE(id2.ok());
  p.link.run_for(1 * kMs);
  auto s2 = p.link.find(p.a, EventType::kSidrResponse, *id2);
  ASSERT_TRUE(s2.has_value());
  EXPECT_EQ(s2->sidr_status, static_cast<uint8_t>(wire::CmSidrStatus::kUnsupported));
  EXPECT_EQ(p.link.m(p.a).connection_count(), 0u);
  EXPECT_EQ(p.link.m(p.b).connection_count(), 0u);
}

TEST(CmManager, UnansweredSidrQueryIsUnreachable) {
  Pair p;
  SidrQueryParams q;
  q.path.local_gid = kGidA;
  q.path.remote_gid = kGidNobody;
  q.service_id = wire::rdma_service_id(wire::RdmaPortSpace::kUdp, kPort);
  auto id = p.link.m(p.a).sidr_query(q);
  ASSERT_TRUE(id.ok());
  p.link.run_for(16 * 4096 * kMs);
  EXPECT_EQ(p.link.sent_of(p.a, CmAttr::kSidrReq).size(), 16u);
  auto u = p.link.find(p.a, EventType::kUnreachable, *id);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->status, ETIMEDOUT);
}

TEST(CmManager, PrivateDataAndResourceLimitsAreEinval) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  EXPECT_EQ(p.link.m(p.b).listen(kSid).error(), EADDRINUSE);
  Manager& a = p.link.m(p.a);
  const auto big = bytes(300, 0);
  auto sub = [&](size_t n) { return std::span<const uint8_t>(big.data(), n); };
  EXPECT_EQ(a.connect(connect_params(kGidA, kGidB, sub(57))).error(), EINVAL);
  ConnectParams no_ip = connect_params(kGidA, kGidB, sub(93));
  no_ip.ip.reset();
  EXPECT_EQ(a.connect(no_ip).error(), EINVAL);
  no_ip.private_data = sub(92);
  EXPECT_TRUE(a.connect(no_ip).ok());
  ConnectParams too_deep = connect_params(kGidA, kGidB);
  too_deep.initiator_depth = 129;  // beyond the device's 128
  EXPECT_EQ(a.connect(too_deep).error(), EINVAL);
  auto id = a.connect(connect_params(kGidA, kGidB, sub(56)));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  Manager& b = p.link.m(p.b);
  EXPECT_EQ(b.accept(req->id, AcceptParams{.private_data = sub(197)}).error(), EINVAL);
  EXPECT_EQ(b.reject(req->id, RejectParams{.private_data = sub(149)}).error(), EINVAL);
  EXPECT_EQ(b.reject(req->id, RejectParams{.ari = sub(73)}).error(), EINVAL);
  EXPECT_EQ(b.disconnect(req->id).error(), EINVAL);  // not established
  EXPECT_EQ(b.establish(req->id).error(), EINVAL);
  ASSERT_TRUE(b.accept(req->id, AcceptParams{.private_data = sub(196)}).ok());
  EXPECT_EQ(b.accept(req->id, AcceptParams{}).error(), EINVAL);  // twice
  p.link.run_for(1 * kMs);
  EXPECT_EQ(a.disconnect(*id, sub(221)).error(), EINVAL);
  EXPECT_TRUE(a.disconnect(*id, sub(220)).ok());
  p.link.run_for(1 * kMs);
  EXPECT_EQ(b.disconnect(req->id, sub(225)).error(), EINVAL);
  EXPECT_TRUE(b.disconnect(req->id, sub(224)).ok());
  SidrQueryParams q;
  q.path.remote_gid = kGidB;
  q.ip = ip_of(kGidA, kGidB, 1);
  q.private_data = sub(181);
  EXPECT_EQ(a.sidr_query(q).error(), EINVAL);
  q.ip.reset();
  q.private_data = sub(217);
  EXPECT_EQ(a.sidr_query(q).error(), EINVAL);
  EXPECT_EQ(a.accept(0x12345, AcceptParams{}).error(), EINVAL);  // unknown id
  EXPECT_EQ(a.qp_attrs(0x12345, IBV_QPS_RTR).error(), EINVAL);
}

TEST(CmManager, ResourcesNegotiatedAndClampedToTheDevice) {
  test::Link link;
  ManagerConfig small = config(2, 0xb, 5);
  small.max_initiator_depth = 4;
  small.max_responder_resources = 2;
  const size_t a = link.add_host(kGidA, config(1, 0xa, 4));
  const size_t b = link.add_host(kGidB, small);
  ASSERT_TRUE(link.m(b).listen(kSid).ok());
  ConnectParams cp = connect_params(kGidA, kGidB);
  cp.initiator_depth = 16;
  cp.responder_resources = 8;
  auto id = link.m(a).connect(cp);
  ASSERT_TRUE(id.ok());
  link.run_for(1 * kMs);
  auto req = link.find(b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  // As rdma_cm reports them to the passive side: its responder resources are the active's
  // initiator depth.
  EXPECT_EQ(req->responder_resources, 16);
  EXPECT_EQ(req->initiator_depth, 8);
  auto acc = link.m(b).accept(req->id, AcceptParams{});  // RDMA_MAX_*: clamp to the device
  ASSERT_TRUE(acc.ok());
  EXPECT_EQ(acc->rtr.attr.max_dest_rd_atomic, 2);
  EXPECT_EQ(acc->rts.attr.max_rd_atomic, 4);
  link.run_for(1 * kMs);
  auto rtr = link.m(a).qp_attrs(*id, IBV_QPS_RTR);
  auto rts = link.m(a).qp_attrs(*id, IBV_QPS_RTS);
  ASSERT_TRUE(rtr.ok() && rts.ok());
  EXPECT_EQ(rts->attr.max_rd_atomic, 2);       // B answers 2 responder resources
  EXPECT_EQ(rtr->attr.max_dest_rd_atomic, 4);  // B's initiator depth 4
}

// Connect, accept, disconnect over a link that loses, duplicates and reorders MADs: every
// seed ends with both sides established then released, or with the active side told why not,
// and every event in order.
// Counts in `established` the seeds on which the connection was established.
void run_lossy_seeds(uint64_t seeds, uint32_t loss_ppm, int& established) {
  established = 0;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    test::LinkFaults f;
    f.seed = seed;
    f.loss_ppm = loss_ppm;
    f.dup_ppm = 150'000;
    f.reorder_ppm = 200'000;
    f.delay_ns = 2 * kMs;
    Pair p(f);
    ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
    auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
    ASSERT_TRUE(id.ok());
    // The passive application accepts whatever request it sees.
    for (int step = 0; step < 1000; ++step) {
      p.link.run_for(500 * kMs);
      for (const Event& e : p.link.events(p.b)) {
        const auto st = p.link.m(p.b).state(e.id);
        if (e.type == EventType::kConnectRequest &&
            (st == State::kReqRcvd || st == State::kMraReqSent)) {
          ASSERT_TRUE(p.link.m(p.b).accept(e.id, AcceptParams{.qpn = 0x77}).ok());
        }
      }
      // Both applications disconnect once established / told of a disconnection.
      for (size_t h : {p.a, p.b}) {
        for (const Event& e : p.link.events(h)) {
          if ((e.type == EventType::kEstablished || e.type == EventType::kDisconnected) &&
              (p.link.m(h).state(e.id) == State::kEstablished ||
               p.link.m(h).state(e.id) == State::kDreqRcvd)) {
            ASSERT_TRUE(p.link.m(h).disconnect(e.id).ok());
          }
        }
      }
      if (p.link.m(p.a).connection_count() == 0 && p.link.m(p.b).connection_count() == 0) break;
    }
    if (p.link.m(p.a).connection_count() || p.link.m(p.b).connection_count()) {
      for (size_t h : {p.a, p.b}) {
        for (const Event& e : p.link.events(h)) {
          auto st = p.link.m(h).state(e.id);
          ADD_FAILURE() << "host " << h << " id " << e.id << " " << event_name(e.type) << " now "
                        << (st ? state_name(*st) : "gone");
        }
      }
      for (const test::Sent& s : p.link.sent())
        ADD_FAILURE() << s.at_ns / 1000000 << "ms host " << s.from << " "
                      << wire::cm_message_name(s.attr());
    }
    EXPECT_EQ(p.link.m(p.a).connection_count(), 0u) << "seed " << seed;
    EXPECT_EQ(p.link.m(p.b).connection_count(), 0u) << "seed " << seed;
    test::EventOrder order;
    p.link.check_order(order, p.a);
    p.link.check_order(order, p.b);
    const bool a_up = p.link.find(p.a, EventType::kEstablished, *id).has_value();
    if (a_up) {
      ++established;
      EXPECT_TRUE(p.link.find(p.a, EventType::kTimewaitExit, *id).has_value()) << "seed " << seed;
    } else {
      EXPECT_TRUE(p.link.find(p.a, EventType::kUnreachable, *id).has_value() ||
                  p.link.find(p.a, EventType::kRejected, *id).has_value())
          << "seed " << seed;
      // The passive side establishes only on the RTU, which follows the active's ESTABLISHED.
      EXPECT_FALSE(p.link.find(p.b, EventType::kEstablished).has_value()) << "seed " << seed;
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "replay: seed " << seed << " loss " << loss_ppm << " ppm";
      return;
    }
  }
}

TEST(CmManager, LossyLinkSeedsEstablishAndReleaseCleanly) {
  // 16 tries of each message at 25% loss: every seed connects.
  int established = 0;
  run_lossy_seeds(500, 250'000, established);
  std::printf("25%% loss: established on %d of 500 seeds\n", established);
  EXPECT_GE(established, 495);
}

TEST(CmManager, VeryLossyLinkSeedsEndConsistentlyEitherWay) {
  // At 75% loss some handshakes run out of retries: both outcomes occur, each cleanly.
  int established = 0;
  run_lossy_seeds(300, 750'000, established);
  std::printf("75%% loss: established on %d of 300 seeds\n", established);
  EXPECT_GT(established, 0);
  EXPECT_LT(established, 300);
}

}  // namespace
}  // namespace urdma::cm

namespace urdma::cm {
namespace {

// The order oracle of these tests can fail: sequences the state machine forbids are refused.
TEST(CmEventOrder, RefusesWhatTheStateMachineForbids) {
  auto run = [](std::initializer_list<EventType> types) {
    test::EventOrder order;
    std::string err;
    for (EventType t : types) {
      err = order.add(Event{.type = t, .id = 1});
      if (!err.empty()) break;
    }
    return err;
  };
  EXPECT_EQ(run({EventType::kConnectRequest, EventType::kEstablished, EventType::kDisconnected,
                 EventType::kTimewaitExit}),
            "");
  EXPECT_EQ(run({EventType::kConnectResponse, EventType::kDisconnected}), "");
  EXPECT_NE(run({EventType::kEstablished, EventType::kEstablished}), "");
  EXPECT_NE(run({EventType::kDisconnected, EventType::kEstablished}), "");
  EXPECT_NE(run({EventType::kRejected, EventType::kTimewaitExit}), "");
  EXPECT_NE(run({EventType::kUnreachable, EventType::kDisconnected}), "");
  EXPECT_NE(run({EventType::kEstablished, EventType::kConnectRequest}), "");
  EXPECT_NE(run({EventType::kTimewaitExit, EventType::kDisconnected}), "");
}

}  // namespace
}  // namespace urdma::cm

namespace urdma::cm {
namespace {

using test::kMs;
using wire::CmAttr;

// The passive side resends its REP as often as the REQ's Max CM Retries says (IBA 12.7.26),
// every Local CM Response Timeout of the REQ, then gives up with REJ timeout + UNREACHABLE.
TEST(CmManager, RepRetriesFollowTheReqsMaxCmRetries) {
  Link link;
  ManagerConfig ca = config(1, 0xa, 1);
  ca.max_cm_retries = 3;
  ca.cm_response_timeout = 16;  // 2^(16-8) = 256 ms
  const size_t a = link.add_host(kGidA, ca);
  const size_t b = link.add_host(kGidB, config(2, 0xb, 2));
  link.filter = [](const test::Sent& s) { return s.attr() != static_cast<uint16_t>(CmAttr::kRep); };
  ASSERT_TRUE(link.m(b).listen(kSid).ok());
  auto id = link.m(a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  link.run_for(1 * kMs);
  auto req = link.find(b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(link.m(b).accept(req->id, AcceptParams{.qpn = 9}).ok());
  const uint64_t t_rep = link.clock().now_ns();
  link.run_until(t_rep + 4 * 256 * kMs - 1);
  EXPECT_FALSE(link.find(b, EventType::kUnreachable).has_value());
  link.run_until(t_rep + 4 * 256 * kMs + 1 * kMs);
  auto un = link.find(b, EventType::kUnreachable, req->id);
  ASSERT_TRUE(un.has_value());
  EXPECT_EQ(un->status, ETIMEDOUT);
  EXPECT_EQ(link.m(b).counters().retransmitted, 3u);
  auto rej = link.find(a, EventType::kRejected, *id);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(rej->reason, static_cast<uint16_t>(wire::CmRejReason::kTimeout));
  EXPECT_EQ(link.m(a).connection_count(), 0u);
  EXPECT_EQ(link.m(b).connection_count(), 0u);
}

TEST(CmManager, LapIsAnsweredWithAprUnsupported) {
  Pair p;
  ASSERT_TRUE(p.link.m(p.b).listen(kSid).ok());
  auto id = p.link.m(p.a).connect(connect_params(kGidA, kGidB));
  ASSERT_TRUE(id.ok());
  p.link.run_for(1 * kMs);
  auto req = p.link.find(p.b, EventType::kConnectRequest);
  ASSERT_TRUE(req.has_value());
  ASSERT_TRUE(p.link.m(p.b).accept(req->id, AcceptParams{.qpn = 9}).ok());
  p.link.run_for(1 * kMs);
  Mad lap{};
  auto v = wire::init_cm_message<wire::CmLap>(std::span<uint8_t, wire::kMadSize>(lap), 0x77);
  v.set_local_comm_id(*id);
  v.set_remote_comm_id(req->id);
  p.link.m(p.b).receive(kGidA, 1, lap);
  const auto out = p.link.m(p.b).take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  const wire::CmAprView apr(out[0].mad);
  EXPECT_EQ(apr.header().attribute_id(), static_cast<uint16_t>(CmAttr::kApr));
  EXPECT_EQ(apr.header().transaction_id(), 0x77u);
  EXPECT_EQ(apr.ap_status(), static_cast<uint8_t>(wire::CmAprStatus::kUnsupported));
  EXPECT_EQ(apr.remote_comm_id(), *id);
  EXPECT_EQ(p.link.m(p.b).state(req->id), State::kEstablished);
}

}  // namespace
}  // namespace urdma::cm
