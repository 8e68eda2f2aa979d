#include "daemon/cm_agent.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "daemon/mad_router.h"
#include "gsi/gmp.h"
#include "wire/cm.h"
#include "wire/mad.h"
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

TEST(ConnTable, AReportedConnectionIsReleasedWithADreqNamingThePeer) {
  ConnTable t;
  const PeerConn c{kOwnId, kPeerId, kPeerQpn, kLocal, kPeer};
  ASSERT_EQ(t.add(3, c), 0);
  ASSERT_EQ(t.established(3), 1u);
  const auto conns = t.reclaim(3);
  ASSERT_EQ(conns.size(), 1u);
  EXPECT_EQ(conns[0], c);
  expect_dreq_for(conns[0], kOwnId, kPeerId, kPeerQpn);
  EXPECT_TRUE(t.reclaim(3).empty()) << "a slot is reclaimed once";
}

TEST(ConnTable, OnlyTheSlotsOwnCommIdsAndAtMostTheBound) {
  ConnTable t;
  EXPECT_EQ(t.add(4, PeerConn{kOwnId, kPeerId, kPeerQpn, kLocal, kPeer}), EINVAL)
      << "slot 3's comm ID reported on slot 4";
  EXPECT_EQ(t.established(4), 0u);
  for (uint32_t i = 0; i < ConnTable::kMaxConnsPerSlot; ++i)
    ASSERT_EQ(t.add(3, PeerConn{comm_id_for_slot(3, i + 1), i, 1, kLocal, kPeer}), 0) << i;
  EXPECT_EQ(t.add(3, PeerConn{comm_id_for_slot(3, 0xFFFFF), 1, 1, kLocal, kPeer}), ENOSPC);
  EXPECT_EQ(t.add(3, PeerConn{comm_id_for_slot(3, 1), 7, 1, kLocal, kPeer}), 0)
      << "a known connection may be reported again";
  EXPECT_EQ(t.established(3), ConnTable::kMaxConnsPerSlot);
}

TEST(ConnTable, ADownConnectionIsNotReleased) {
  ConnTable t;
  const uint32_t a = comm_id_for_slot(3, 1), b = comm_id_for_slot(3, 2);
  ASSERT_EQ(t.add(3, PeerConn{a, 11, 0x21, kLocal, kPeer}), 0);
  ASSERT_EQ(t.add(3, PeerConn{b, 12, 0x22, kLocal, kPeer}), 0);
  EXPECT_EQ(t.remove(3, a), 0);
  EXPECT_EQ(t.remove(3, a), ENOENT);
  EXPECT_EQ(t.remove(4, b), ENOENT) << "another slot's";
  const auto conns = t.reclaim(3);
  ASSERT_EQ(conns.size(), 1u);
  EXPECT_EQ(conns[0].local_comm_id, b);
}

TEST(ConnTable, SlotsAreApart) {
  ConnTable t;
  ASSERT_EQ(t.add(3, PeerConn{kOwnId, kPeerId, 1, kLocal, kPeer}), 0);
  ASSERT_EQ(t.add(4, PeerConn{comm_id_for_slot(4, 1), kPeerId + 1, 2, kLocal, kPeer}), 0);
  EXPECT_EQ(t.reclaim(4).size(), 1u);
  EXPECT_EQ(t.established(3), 1u);
}

CmMad drep(uint32_t from, uint32_t to) {
  return mad<wire::CmDrep>([&](wire::CmDrep r) {
    r.set_local_comm_id(from);
    r.set_remote_comm_id(to);
  });
}

const Releases::Dreq kDreq{.conn = {kOwnId, kPeerId, kPeerQpn, kLocal, kPeer}, .transaction_id = 5};

TEST(Releases, ADreqIsSentThenRepeatedUntilItsRetriesRunOut) {
  Releases r;
  ASSERT_TRUE(r.add(kDreq, 1000));
  EXPECT_EQ(r.next_deadline_ms(), 1000) << "due at once";
  int64_t now = 1000;
  for (int i = 0; i <= Releases::kRetries; ++i) {
    const auto out = r.due(now);
    ASSERT_EQ(out.size(), 1u) << i;
    EXPECT_EQ(out[0].conn, kDreq.conn);
    EXPECT_EQ(out[0].transaction_id, 5u) << "a retransmission keeps its TID";
    EXPECT_EQ(out[0].sends, i + 1);
    EXPECT_TRUE(r.due(now + Releases::kTimeoutMs - 1).empty());
    now += Releases::kTimeoutMs;
  }
  EXPECT_TRUE(r.due(now).empty());
  EXPECT_EQ(r.size(), 0u) << "forgotten once out of retries";
  EXPECT_FALSE(r.next_deadline_ms());
}

TEST(Releases, DreqsArePacedAndBounded) {
  // Many connections of dead processes: at most kBurst at once, then kPerSecond.
  Releases r;
  const int64_t n = 3 * Releases::kBurst;
  for (int64_t i = 0; i < n; ++i) {
    Releases::Dreq d = kDreq;
    d.conn.local_comm_id = comm_id_for_slot(3, static_cast<uint32_t>(i + 1));
    ASSERT_TRUE(r.add(d, 0));
  }
  EXPECT_EQ(static_cast<int64_t>(r.due(0).size()), Releases::kBurst);
  EXPECT_TRUE(r.due(0).empty()) << "no token left";
  const auto next = r.next_deadline_ms();
  ASSERT_TRUE(next);
  EXPECT_GT(*next, 0) << "the timer waits for the next token";
  const int64_t later = 100;  // ms: kPerSecond / 10 more
  EXPECT_EQ(static_cast<int64_t>(r.due(later).size()), later * Releases::kPerSecond / 1000);
  Releases full;
  for (size_t i = 0; i < Releases::kMax; ++i) {
    Releases::Dreq d = kDreq;
    d.conn.local_comm_id = static_cast<uint32_t>(i + 1);
    ASSERT_TRUE(full.add(d, 0));
  }
  Releases::Dreq extra = kDreq;
  extra.conn.local_comm_id = 0xFFFFFFF0;
  EXPECT_FALSE(full.add(extra, 0)) << "beyond kMax";
}

TEST(Releases, ItsDrepEndsIt) {
  Releases r;
  ASSERT_TRUE(r.add(kDreq, 0));
  ASSERT_EQ(r.due(0).size(), 1u);
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

namespace urdma::daemon {
namespace {

// ---- ListenWaits: requests for a service ID nobody holds, waiting for a listener ----

constexpr uint64_t kSid = 0x0000000001064e20;  // req()'s: RDMA_PS_TCP port 20000
constexpr int64_t kWaitMs = 1000;
const net::Endpoint kFrom{kPeer, 4791};
const net::Endpoint kTo{kLocal, 4791};

// A datagram carrying `m` (what the daemon keeps and forwards: its bytes, unchanged).
std::vector<uint8_t> datagram_of(const CmMad& m, uint8_t tag = 0) {
  std::array<uint8_t, gsi::kGmpBytes> buf{};
  const size_t n = gsi::build_gmp(buf, m, tag, {kPeer, 4791}, {kLocal, 4791});
  return {buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n)};
}

ListenWaits::Added add(ListenWaits& w, const CmMad& m, int64_t now_ms,
                       const net::Endpoint& from = kFrom, std::optional<CmMad>* mra = nullptr,
                       uint64_t sid = kSid) {
  const auto d = datagram_of(m);
  return w.add(sid, d, m, from, kTo, now_ms, mra);
}

TEST(ListenWaits, ARequestWaitsUntilItsListenerComesAndGoesToItUnchanged) {
  ListenWaits w(kWaitMs);
  const CmMad first = req(kPeerId), second = req(kPeerId + 1), other = req(kPeerId + 2);
  EXPECT_EQ(add(w, first, 100), ListenWaits::Added::kWaiting);
  EXPECT_EQ(add(w, other, 150, kFrom, nullptr, kSid + 1), ListenWaits::Added::kWaiting);
  EXPECT_EQ(add(w, second, 200), ListenWaits::Added::kWaiting);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.next_deadline_ms(), 100 + kWaitMs);
  const auto served = w.take(kSid);
  ASSERT_EQ(served.size(), 2u);
  EXPECT_EQ(served[0].datagram, datagram_of(first)) << "oldest first, bytes as they came";
  EXPECT_EQ(served[1].datagram, datagram_of(second));
  EXPECT_EQ(served[0].src, kFrom);
  EXPECT_EQ(served[0].dst, kTo);
  EXPECT_EQ(served[0].service_id, kSid);
  EXPECT_EQ(w.size(), 1u) << "another service's request still waits";
  EXPECT_TRUE(w.take(kSid).empty());
  EXPECT_EQ(w.next_deadline_ms(), 150 + kWaitMs);
}

TEST(ListenWaits, WithoutAListenerTheRequestIsRefusedWhenTheWaitEnds) {
  ListenWaits w(kWaitMs);
  EXPECT_FALSE(w.next_deadline_ms());
  ASSERT_EQ(add(w, req(kPeerId), 100), ListenWaits::Added::kWaiting);
  ASSERT_EQ(add(w, req(kPeerId + 1), 300), ListenWaits::Added::kWaiting);
  EXPECT_TRUE(w.expired(100 + kWaitMs - 1).empty());
  const auto done = w.expired(100 + kWaitMs);
  ASSERT_EQ(done.size(), 1u);
  // What the daemon then sends: REJ 8 for that REQ.
  const auto p = wire::parse_packet(done[0].datagram);
  ASSERT_TRUE(p);
  const auto rej = no_listener_reply(p->payload());
  ASSERT_TRUE(rej);
  EXPECT_EQ(std::get<wire::CmRejView>(parsed(*rej).view).remote_comm_id(), kPeerId);
  EXPECT_EQ(w.next_deadline_ms(), 300 + kWaitMs);
  EXPECT_EQ(w.expired(300 + kWaitMs).size(), 1u);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_FALSE(w.next_deadline_ms());
}

TEST(ListenWaits, ARetransmissionDoesNotWaitTwiceAndAReqOneGetsAnMraForTheRest) {
  ListenWaits w(kWaitMs);
  ASSERT_EQ(add(w, req(kPeerId), 0), ListenWaits::Added::kWaiting);
  std::optional<CmMad> mra;
  EXPECT_EQ(add(w, req(kPeerId), 400, kFrom, &mra), ListenWaits::Added::kDuplicate);
  EXPECT_EQ(w.size(), 1u);
  ASSERT_TRUE(mra);
  const auto m = parsed(*mra);
  ASSERT_EQ(m.attr, wire::CmAttr::kMra);
  EXPECT_EQ(m.header.transaction_id(), kTid);
  const auto v = std::get<wire::CmMraView>(m.view);
  EXPECT_EQ(v.local_comm_id(), 0u);
  EXPECT_EQ(v.remote_comm_id(), kPeerId);
  EXPECT_EQ(v.message_mraed(), static_cast<uint8_t>(wire::CmMraMessage::kReq));
  EXPECT_EQ(v.service_timeout(), 18) << "600 ms left: 2^(18-8) ms covers it";
  // The same ID from another address is another request.
  EXPECT_EQ(add(w, req(kPeerId), 400, {kLocal, 4791}), ListenWaits::Added::kWaiting);
  // A SIDR_REQ's retransmission: no MRA exists for it.
  const auto sidr = mad<wire::CmSidrReq>([](wire::CmSidrReq r) {
    r.set_request_id(kPeerId);
    r.set_service_id(kSid);
  });
  ASSERT_EQ(add(w, sidr, 500), ListenWaits::Added::kWaiting) << "a SIDR_REQ is not a REQ";
  mra.reset();
  EXPECT_EQ(add(w, sidr, 600, kFrom, &mra), ListenWaits::Added::kDuplicate);
  EXPECT_FALSE(mra);
  // Anything but a request does not wait.
  EXPECT_EQ(add(w, mad<wire::CmRtu>([](wire::CmRtu r) { r.set_local_comm_id(1); }), 600),
            ListenWaits::Added::kNotRequest);
  EXPECT_EQ(w.size(), 3u);
}

TEST(ListenWaits, AFloodWaitsOnlyUpToTheCaps) {
  ListenWaits w(kWaitMs);
  // One requester: kMaxPerRequester.
  for (uint32_t i = 0; i < ListenWaits::kMaxPerRequester; ++i)
    ASSERT_EQ(add(w, req(i + 1), 0), ListenWaits::Added::kWaiting) << i;
  EXPECT_EQ(add(w, req(0xFFFF), 0), ListenWaits::Added::kFull);
  // In all: kMax, whatever the addresses.
  uint32_t host = 0;
  while (w.size() < ListenWaits::kMax) {
    const net::Endpoint from{
        net::Address::from_v4(10, 1, static_cast<uint8_t>(host >> 8), static_cast<uint8_t>(host)),
        4791};
    ++host;
    for (uint32_t i = 0; i < ListenWaits::kMaxPerRequester && w.size() < ListenWaits::kMax; ++i)
      ASSERT_EQ(add(w, req(i + 1), 10, from), ListenWaits::Added::kWaiting);
  }
  EXPECT_EQ(add(w, req(1), 10, {net::Address::from_v4(10, 2, 0, 1), 4791}),
            ListenWaits::Added::kFull);
  // Room again once the first requester's wait ended.
  EXPECT_EQ(w.expired(kWaitMs).size(), ListenWaits::kMaxPerRequester);
  EXPECT_EQ(add(w, req(0xFFFF), kWaitMs), ListenWaits::Added::kWaiting);
}

TEST(ListenWaits, TheMraCoversTheWaitAsLinuxReckonsIt) {
  const auto timeout_of = [](int64_t ms) {
    return std::get<wire::CmMraView>(parsed(*wait_mra(req(), ms)).view).service_timeout();
  };
  EXPECT_EQ(timeout_of(1), 8);
  EXPECT_EQ(timeout_of(1024), 18);
  EXPECT_EQ(timeout_of(1025), 19);
  EXPECT_EQ(timeout_of(int64_t{1} << 40), 31) << "the 5-bit field's largest";
  EXPECT_FALSE(wait_mra(dreq(1, 2), 10)) << "only a REQ is MRAed";
}

}  // namespace
}  // namespace urdma::daemon
