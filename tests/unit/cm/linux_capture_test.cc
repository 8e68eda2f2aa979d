// The CM against Linux: the MADs of real rping connections (tests/data, Debian 12 kernel 6.1
// rdma_cm over rxe) fed into a Manager playing the other side, and what it sends compared with
// what Linux sent in the same place — byte for byte once the communication IDs (and our own
// transaction IDs, and the REP's Starting PSN) are set to Linux's, since those are the only
// values each CM picks itself.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "capture/capture.h"
#include "cm/manager.h"
#include "cm/timing.h"
#include "cm_link.h"
#include "wire/byte_order.h"
#include "wire/cm.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::cm {
namespace {

using test::kMs;
using wire::CmAttr;

struct CapturedMad {
  uint64_t timestamp_ns;
  Mad mad;
};

// The CM MADs of a capture by frame number: UD SEND Only (0x64) to QP1; the MAD follows the
// BTH (12 bytes) and DETH (8) and precedes the ICRC (4).
std::map<uint64_t, CapturedMad> capture_mads(const std::string& file) {
  std::map<uint64_t, CapturedMad> mads;
  const std::string err = capture::for_each_udp(
      std::string(URDMA_REFERENCE_DIR) + "/" + file, [&](const capture::UdpDatagram& d) {
        constexpr size_t kBth = 12, kDeth = 8, kIcrc = 4;
        if (d.dst_port != 4791 || d.payload.size() != kBth + kDeth + wire::kMadSize + kIcrc) return;
        const uint32_t dest_qp = wire::load_be24(d.payload.data() + 5);
        if (d.payload[0] != 0x64 || dest_qp != wire::kMadGsiQpn) return;
        CapturedMad m{d.timestamp_ns, {}};
        std::copy_n(d.payload.begin() + kBth + kDeth, wire::kMadSize, m.mad.begin());
        mads[d.index] = m;
      });
  EXPECT_EQ(err, "");
  return mads;
}

uint64_t tid_of(const Mad& m) {
  return wire::MadHeaderView(std::span<const uint8_t, wire::kMadHeaderSize>(m.data(), 24))
      .transaction_id();
}
void set_tid(Mad& m, uint64_t tid) {
  wire::MadHeader(std::span<uint8_t, wire::kMadHeaderSize>(m.data(), 24)).set_transaction_id(tid);
}

// Field offsets are the IBA's; byte-equal MADs are the strongest comparison, and a failure
// names the first differing byte.
void expect_same_mad(const Mad& ours, const Mad& linux_mad, const char* what) {
  for (size_t i = 0; i < wire::kMadSize; ++i) {
    if (ours[i] != linux_mad[i]) {
      ADD_FAILURE() << what << ": byte " << i << " (CM offset " << int(i) - 24 << ") is 0x"
                    << std::hex << int(ours[i]) << ", Linux sent 0x" << int(linux_mad[i]);
      return;
    }
  }
}

const Gid k99_1 = test::ipv4_gid(10, 99, 0, 1);
const Gid k99_2 = test::ipv4_gid(10, 99, 0, 2);
const Gid k99_3 = test::ipv4_gid(10, 99, 0, 3);
constexpr uint64_t kRpingSid = 0x0000000001061c06ULL;  // RDMA_PS_TCP port 7174 (rping's)

ManagerConfig linux_like(uint64_t guid) {
  ManagerConfig c;
  c.slot = 5;
  c.local_ca_guid = guid;
  c.local_ca_ack_delay = 15;  // rxe
  return c;
}

// rxe-to-rxe.pcap, 10.99.0.3 (active) → 10.99.0.2 (passive): we are 10.99.0.2.
TEST(CmLinux, PassiveSideAnswersLinuxsReqAsLinuxDid) {
  const auto mads = capture_mads("rxe-to-rxe.pcap");
  ASSERT_EQ(mads.size(), 5u);
  const Mad& req = mads.at(1).mad;
  const Mad& linux_rep = mads.at(2).mad;
  const uint32_t linux_active_id = wire::CmReqView(req).local_comm_id();
  const uint32_t linux_passive_id = wire::CmRepView(linux_rep).local_comm_id();

  net::VirtualClock clock;
  Manager m(linux_like(0x505400fffe990002ULL), clock);
  ASSERT_TRUE(m.listen(kRpingSid).ok());
  m.receive(k99_3, 1, req);
  auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  const Event e = events[0];  // a copy: `events` is reused below
  ASSERT_EQ(e.type, EventType::kConnectRequest);
  ASSERT_TRUE(e.ip.has_value());
  EXPECT_EQ(e.ip->src_port, 0xac67);
  EXPECT_EQ(e.ip->src_addr, k99_3);
  EXPECT_EQ(e.ip->dst_addr, k99_2);
  EXPECT_EQ(e.remote_qpn, 0x11u);
  EXPECT_EQ(e.private_data.size(), 56u);
  EXPECT_EQ(e.responder_resources, 1);
  EXPECT_EQ(e.initiator_depth, 1);
  EXPECT_EQ(e.local_gid, k99_2);

  // rping's server: rdma_accept with responder resources 1, initiator depth 1; rdma_cm picks
  // the QPN (here the one Linux used) and the REP's PSN (set to Linux's below).
  auto acc = m.accept(e.id, AcceptParams{.qpn = 0x11,
                                         .responder_resources = 1,
                                         .initiator_depth = 1,
                                         .rnr_retry_count = 7});
  ASSERT_TRUE(acc.ok());
  EXPECT_EQ(acc->rtr.attr.dest_qp_num, 0x11u);
  // The PSNs the capture's data packets carry: the active side sent from the REP's Starting
  // PSN (0x23758c), we (passive) from the REQ's (0x1997da).
  EXPECT_EQ(acc->rts.attr.sq_psn, 0x1997dau);
  EXPECT_EQ(acc->rtr.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(acc->rtr.attr.ah_attr.grh.flow_label, 0x4fc7fu);
  EXPECT_EQ(acc->rts.attr.timeout, 19);
  EXPECT_EQ(acc->rts.attr.retry_cnt, 7);
  EXPECT_EQ(acc->rts.attr.rnr_retry, 7);
  auto out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dest_gid, k99_3);
  Mad rep = out[0].mad;
  EXPECT_EQ(tid_of(rep), tid_of(req));  // the REP answers in the REQ's transaction
  const uint32_t our_id = wire::CmRepView(rep).local_comm_id();
  EXPECT_EQ(our_id, e.id);
  EXPECT_EQ(wire::CmRepView(rep).starting_psn(), acc->rtr.attr.rq_psn);
  wire::CmRep(rep).set_local_comm_id(linux_passive_id);
  wire::CmRep(rep).set_starting_psn(0x23758c);
  expect_same_mad(rep, linux_rep, "REP");

  // Linux's RTU (addressed to our comm ID) establishes the connection.
  Mad rtu = mads.at(3).mad;
  wire::CmRtu(rtu).set_remote_comm_id(our_id);
  m.receive(k99_3, 1, rtu);
  events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kEstablished);
  EXPECT_EQ(m.state(e.id), State::kEstablished);

  // Linux's DREQ; our DREP is Linux's.
  Mad dreq = mads.at(28).mad;
  wire::CmDreq(dreq).set_remote_comm_id(our_id);
  m.receive(k99_3, 1, dreq);
  events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kDisconnected);
  ASSERT_TRUE(m.disconnect(e.id).ok());
  out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  Mad drep = out[0].mad;
  EXPECT_EQ(wire::CmDrepView(drep).remote_comm_id(), linux_active_id);
  wire::CmDrep(drep).set_local_comm_id(linux_passive_id);
  expect_same_mad(drep, mads.at(29).mad, "DREP");
  EXPECT_EQ(m.state(e.id), State::kTimewait);
  // Timewait: the local ACK timeout of the REQ, 2^(19-8) ms.
  EXPECT_EQ(m.next_deadline_ns(), clock.now_ns() + 2048 * kMs);
}

ConnectParams rping_connect(const Mad& linux_req, const Gid& from, const Gid& to) {
  const wire::CmReqView req(linux_req);
  ConnectParams p;
  p.path.local_gid = from;
  p.path.remote_gid = to;
  const wire::CmaHdrParse ip = wire::parse_cma_hdr(req.private_data());
  EXPECT_TRUE(ip.ok());
  p.ip = ip.address;
  // rdma_cm's route: its flow label is derived from the ports, as Linux derived it.
  p.path.flow_label = roce_flow_label(ip.address.src_port, 7174);
  EXPECT_EQ(p.path.flow_label, req.primary_path().flow_label());
  p.path.hop_limit = 64;
  p.path.packet_life_time = kCmaIboePacketLifetime;
  p.path.mtu = IBV_MTU_1024;
  p.service_id = kRpingSid;
  p.qpn = req.local_qpn();
  p.starting_psn = req.starting_psn();
  p.responder_resources = 1;  // rping: conn_param.responder_resources = 1
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

// rxe-to-rxe.pcap: we are 10.99.0.3, the active side.
TEST(CmLinux, ActiveSideSendsLinuxsReqRtuAndDreq) {
  const auto mads = capture_mads("rxe-to-rxe.pcap");
  ASSERT_EQ(mads.size(), 5u);
  const Mad& linux_req = mads.at(1).mad;
  const uint32_t linux_active_id = wire::CmReqView(linux_req).local_comm_id();
  const uint64_t linux_tid = tid_of(linux_req);

  net::VirtualClock clock;
  Manager m(linux_like(0x505400fffe990003ULL), clock);
  auto id = m.connect(rping_connect(linux_req, k99_3, k99_2));
  ASSERT_TRUE(id.ok());
  auto out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dest_gid, k99_2);
  Mad req = out[0].mad;
  wire::CmReq(req).set_local_comm_id(linux_active_id);
  set_tid(req, linux_tid);
  expect_same_mad(req, linux_req, "REQ");

  // Linux's REP for it.
  Mad rep = mads.at(2).mad;
  wire::CmRep(rep).set_remote_comm_id(*id);
  m.receive(k99_2, 1, rep);
  auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kEstablished);
  EXPECT_EQ(events[0].remote_qpn, 0x11u);
  auto rtr = m.qp_attrs(*id, IBV_QPS_RTR);
  auto rts = m.qp_attrs(*id, IBV_QPS_RTS);
  ASSERT_TRUE(rtr.ok() && rts.ok());
  // As the capture's data packets show: Linux's passive side sent from the REQ's Starting PSN
  // (0x1997da), its active side (us here) from the REP's (0x23758c).
  EXPECT_EQ(rtr->attr.rq_psn, 0x1997dau);
  EXPECT_EQ(rtr->attr.max_dest_rd_atomic, 1);
  EXPECT_EQ(rts->attr.sq_psn, 0x23758cu);
  EXPECT_EQ(rts->attr.max_rd_atomic, 1);
  EXPECT_EQ(rts->attr.timeout, 19);  // cm_ack_timeout(REP target ACK delay 15, 18)
  out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  Mad rtu = out[0].mad;
  wire::CmRtu(rtu).set_local_comm_id(linux_active_id);
  set_tid(rtu, linux_tid);
  expect_same_mad(rtu, mads.at(3).mad, "RTU");

  ASSERT_TRUE(m.disconnect(*id).ok());
  out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  Mad dreq = out[0].mad;
  wire::CmDreq(dreq).set_local_comm_id(linux_active_id);
  set_tid(dreq, linux_tid);
  expect_same_mad(dreq, mads.at(28).mad, "DREQ");

  Mad drep = mads.at(29).mad;
  wire::CmDrep(drep).set_remote_comm_id(*id);
  m.receive(k99_2, 1, drep);
  events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kDisconnected);
  EXPECT_EQ(m.state(*id), State::kTimewait);
}

// rxe-guest-to-host.pcap: rping -c from 10.99.0.2 to 10.99.0.1, which never answers. Linux
// retransmits its REQ once and, when rping gives up, sends REJ "timeout". We replay that.
TEST(CmLinux, UnansweredReqRetransmitsAndRejectsLikeLinux) {
  const auto mads = capture_mads("rxe-guest-to-host.pcap");
  ASSERT_EQ(mads.size(), 3u);
  const CapturedMad& first = mads.at(27);
  const CapturedMad& again = mads.at(28);
  const CapturedMad& rej = mads.at(29);
  const uint32_t linux_id = wire::CmReqView(first.mad).local_comm_id();
  const uint64_t linux_tid = tid_of(first.mad);
  EXPECT_EQ(again.mad, first.mad);  // Linux's retransmission is the same MAD

  net::VirtualClock clock(1'000 * kMs);
  Manager m(linux_like(0x505400fffe990002ULL), clock);
  auto id = m.connect(rping_connect(first.mad, k99_2, k99_1));
  ASSERT_TRUE(id.ok());
  const uint64_t t0 = clock.now_ns();
  auto out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  Mad req = out[0].mad;
  wire::CmReq(req).set_local_comm_id(linux_id);
  set_tid(req, linux_tid);
  expect_same_mad(req, first.mad, "REQ");

  // The retransmission: ours after 2 × 2^(18-8) + 2^(20-8) = 6144 ms; Linux's came 6239 ms
  // after its first (the same timer plus its MAD agent's scheduling). Within 2 %.
  const uint64_t linux_gap = again.timestamp_ns - first.timestamp_ns;
  EXPECT_EQ(m.next_deadline_ns(), t0 + 6144 * kMs);
  EXPECT_LE(6144 * kMs, linux_gap);
  EXPECT_LT(linux_gap - 6144 * kMs, 6144 * kMs / 50) << "Linux's gap " << linux_gap / kMs << " ms";
  clock.set(m.next_deadline_ns());
  m.run_timers();
  out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  Mad req2 = out[0].mad;
  wire::CmReq(req2).set_local_comm_id(linux_id);
  set_tid(req2, linux_tid);
  expect_same_mad(req2, first.mad, "REQ retransmission");

  // rping gives up at the moment Linux's REJ went out: our REJ is Linux's.
  clock.set(t0 + (rej.timestamp_ns - first.timestamp_ns));
  m.run_timers();
  EXPECT_TRUE(m.take_outgoing().empty());  // no retransmission due before then
  m.destroy(*id);
  out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dest_gid, k99_1);
  Mad our_rej = out[0].mad;
  wire::CmRej(our_rej).set_local_comm_id(linux_id);
  set_tid(our_rej, linux_tid);
  expect_same_mad(our_rej, rej.mad, "REJ (destroy)");
  EXPECT_TRUE(m.take_events().empty());
  EXPECT_EQ(m.connection_count(), 0u);

  // Left alone, the REQ goes out Max CM Retries + 1 = 16 times and ends in the same REJ
  // (and an UNREACHABLE event).
  auto id2 = m.connect(rping_connect(first.mad, k99_2, k99_1));
  ASSERT_TRUE(id2.ok());
  int reqs = 0;
  Mad last{};
  for (;;) {
    for (const OutgoingMad& o : m.take_outgoing()) {
      if (wire::parse_cm(o.mad).message.attr == CmAttr::kReq) ++reqs;
      last = o.mad;
    }
    if (m.next_deadline_ns() == net::kNever) break;
    clock.set(m.next_deadline_ns());
    m.run_timers();
  }
  EXPECT_EQ(reqs, 16);
  wire::CmRej(last).set_local_comm_id(linux_id);
  set_tid(last, linux_tid);
  expect_same_mad(last, rej.mad, "REJ (retries exhausted)");
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kUnreachable);
}

// Linux's REJ "timeout" from that capture, fed to a passive side holding the REQ, names the
// connection by the ARI (the active CA GUID) and the active comm ID — its Remote CommID is 0.
TEST(CmLinux, PassiveSideFindsTheConnectionALinuxRejTimeoutNames) {
  const auto mads = capture_mads("rxe-guest-to-host.pcap");
  ASSERT_EQ(mads.size(), 3u);
  net::VirtualClock clock;
  Manager m(linux_like(0x1111), clock);
  ASSERT_TRUE(m.listen(kRpingSid).ok());
  m.receive(k99_2, 1, mads.at(27).mad);
  auto events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  m.receive(k99_2, 1, mads.at(28).mad);  // the retransmission: a delayed MRA answers it
  auto out = m.take_outgoing();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(wire::parse_cm(out[0].mad).message.attr, CmAttr::kMra);
  m.receive(k99_2, 1, mads.at(29).mad);
  events = m.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kRejected);
  EXPECT_EQ(events[0].reason, static_cast<uint16_t>(wire::CmRejReason::kTimeout));
  EXPECT_EQ(m.connection_count(), 0u);
}

}  // namespace
}  // namespace urdma::cm
