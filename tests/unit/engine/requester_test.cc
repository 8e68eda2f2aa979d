// Requester and completer steps with hand-built responses (eRPC protocol-test style): the
// packets a posted WR produces, and what each ACK / NAK / response / timeout does to them.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "protocol_test_util.h"
#include "wire/psn.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;
constexpr uint32_t kSqPsn = 0x100;  // QpParams default sq_psn: our first request PSN

class RequesterTest : public ProtocolTest {
 protected:
  void SetUp() override { make_qp(); }
  void setup_buffers() {
    buf_.assign(8192, 0);
    for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = static_cast<uint8_t>(i * 7);
    mr_ = reg(buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  void post(ibv_send_wr wr) {
    ASSERT_EQ(post_send(qp_, wr), 0);
    engine_.poll();
  }
  void post_send_len(uint64_t wr_id, uint32_t len, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_sge s = sge(buf_.data(), len, mr_);
    post(send_wr(wr_id, IBV_WR_SEND, &s, 1, flags));
  }
  void post_read(uint64_t wr_id, uint32_t len, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_sge s = sge(buf_.data(), len, mr_);
    ibv_send_wr wr = send_wr(wr_id, IBV_WR_RDMA_READ, &s, 1, flags);
    wr.wr.rdma.remote_addr = 0x1000;
    wr.wr.rdma.rkey = 0x77;
    post(wr);
  }
  void ack(uint32_t psn, uint8_t syndrome = wire::make_ack(wire::kAethCreditsInvalid)) {
    inject(op::kRcAck, psn, {},
           [=](const wire::PacketHeaders& h) { h.aeth()->set_syndrome(syndrome); });
  }
  uint64_t timeout_ns() const { return kAckTimeoutBaseNs << params_.timeout; }

  std::vector<uint8_t> buf_;
  provider::Mr* mr_ = nullptr;
};

// IBA 9.5 / 9.7.1: a 2500-byte SEND at PMTU 1024 is First/Middle/Last with consecutive PSNs
// from sq_psn; AckReq only on the last packet; payloads straight from the SGE.
TEST_F(RequesterTest, SendIsSegmentedByPmtu) {
  setup_buffers();
  post_send_len(1, 2500);
  ASSERT_EQ(sent_count(), 3u);
  const uint8_t ops[] = {op::kRcSendFirst, op::kRcSendMiddle, op::kRcSendLast};
  for (uint32_t i = 0; i < 3; ++i) {
    const wire::PacketView p = sent(i);
    EXPECT_EQ(p.opcode(), ops[i]);
    EXPECT_EQ(p.bth().psn(), kSqPsn + i);
    EXPECT_EQ(p.bth().dest_qp(), kPeerQpn);
    EXPECT_EQ(p.bth().ack_req(), i == 2);
  }
  EXPECT_EQ(sent(0).payload().size(), 1024u);
  EXPECT_EQ(sent(2).payload().size(), 452u);
  EXPECT_EQ(0, std::memcmp(sent(1).payload().data(), buf_.data() + 1024, 1024));
  EXPECT_EQ(io_.sent[0].dst.address, kPeer);
  EXPECT_EQ(io_.sent[0].dst.port, net::kRoceV2UdpPort);
  EXPECT_TRUE(cqes().empty());  // not acknowledged yet
  ack(kSqPsn + 2);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

// IBA 9.7.5.1.x: an ACK is cumulative; an ACK of an earlier PSN completes only what it covers.
TEST_F(RequesterTest, AckIsCumulativeAndCompletesInOrder) {
  setup_buffers();
  post_send_len(1, 10);
  post_send_len(2, 10);
  post_send_len(3, 10);
  ASSERT_EQ(sent_count(), 3u);
  ack(kSqPsn + 1);
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  ack(kSqPsn + 2);
  wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 3u);
}

// Unsignaled WRs complete silently; a signaled one after them still completes.
TEST_F(RequesterTest, UnsignaledWrMakesNoCompletion) {
  setup_buffers();
  post_send_len(1, 10, 0);
  post_send_len(2, 10);
  ack(kSqPsn + 1);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
}

// IBA 9.7.6.1.1: no ACK within 4.096 us << timeout → go back to the oldest unacknowledged PSN
// and resend everything from there; next_deadline_ns() names the timer.
TEST_F(RequesterTest, LocalAckTimeoutResendsFromOldestUnacked) {
  setup_buffers();
  post_send_len(1, 2500);
  ack(kSqPsn);  // the first packet arrived
  clear_sent();
  EXPECT_EQ(engine_.next_deadline_ns(), clock_.now_ns() + timeout_ns());
  advance(timeout_ns() - 1);
  EXPECT_EQ(sent_count(), 0u);
  advance(1);
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(0).opcode(), op::kRcSendMiddle);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn + 1);
  EXPECT_EQ(sent(1).bth().psn(), kSqPsn + 2);
  EXPECT_EQ(engine_.counters().completer_retry_err, 1u);
}

// An ACK that arrives in time, but after this turn read the socket (the engine was preempted
// between reading and checking its timers), is no timeout: the timer is judged at the time
// the socket was read, and the next turn takes the ACK. Here the responder's own ACK, sent
// after the receive, is the moment the clock passes the deadline and the peer's ACK arrives.
TEST_F(RequesterTest, AckArrivingAfterTheReceiveOfATurnIsNoTimeout) {
  setup_buffers();
  std::vector<uint8_t> rbuf(64);
  provider::Mr* rmr = reg(rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qp_, 9, sge(rbuf.data(), 64, rmr)), 0);
  post_send_len(1, 100);
  ASSERT_EQ(sent_count(), 1u);
  advance(timeout_ns() - 1);
  clear_sent();
  std::vector<uint8_t> peer_ack(kMaxPacketBytes);
  auto built = wire::build_packet(peer_ack, op::kRcAck, {});
  ASSERT_TRUE(built.has_value());
  built->headers.bth().set_dest_qp(qp_->qp_num());
  built->headers.bth().set_psn(kSqPsn);
  built->headers.bth().set_pkey(0xFFFF);
  built->headers.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  peer_ack.resize(built->layout.total_length());
  const net::Endpoint from{kPeer, kPeerPort};
  const net::Endpoint to{kLocal, net::kRoceV2UdpPort};
  net::seal_icrc(peer_ack, from, to);
  bool arrived = false;
  io_.on_send = [&](const net::TxDatagram&, std::span<const uint8_t>) {
    if (arrived) return;
    arrived = true;
    clock_.advance(2);
    io_.deliver(peer_ack, from, to);
  };
  const uint8_t payload[8] = {};
  inject(op::kRcSendOnly, params_.rq_psn, payload);  // its ACK goes out after the receive
  ASSERT_TRUE(arrived);
  io_.on_send = nullptr;
  engine_.poll();  // takes the peer's ACK
  EXPECT_EQ(engine_.counters().completer_retry_err, 0u);
  for (size_t i = 0; i < sent_count(); ++i) EXPECT_NE(sent(i).opcode(), op::kRcSendOnly);
  bool sent_done = false;
  for (const ibv_wc& wc : cqes())
    if (wc.wr_id == 1) sent_done = wc.status == IBV_WC_SUCCESS;
  EXPECT_TRUE(sent_done);
}

// A request posted before a turn leaves before that turn reads the socket: a thread that posts
// and then polls (every hop of a ping-pong) does not pay a receive first. What waits in the
// socket (here the ACK of the first request) is read in the same turn, after.
TEST_F(RequesterTest, APostedRequestLeavesBeforeTheTurnReadsTheSocket) {
  setup_buffers();
  post_send_len(1, 16);
  ASSERT_EQ(sent_count(), 1u);
  deliver(build_ack(kSqPsn));
  ibv_sge s = sge(buf_.data(), 16, mr_);
  post(send_wr(2, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED));
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(1).opcode(), op::kRcSendOnly);
  EXPECT_EQ(sent(1).bth().psn(), kSqPsn + 1);
  EXPECT_EQ(io_.sent[1].unread, 1u);  // the ACK was still in the socket
  EXPECT_EQ(io_.pending(), 0u);       // and the same turn read it
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
}

// IBA 9.7.6.1.1: retry_cnt exhausted → RETRY_EXC_ERR, QP → ERR, later WRs flush.
TEST_F(RequesterTest, RetryCountExhausted) {
  QpParams p;
  p.retry_cnt = 1;
  make_qp(p);
  setup_buffers();
  post_send_len(1, 10);
  post_send_len(2, 10);
  advance(timeout_ns());  // retry 1
  EXPECT_TRUE(cqes().empty());
  advance(timeout_ns());  // exhausted
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(engine_.counters().retry_exceeded_err, 1u);
}

// IBA 9.7.5.1.3: NAK PSN Sequence Error at PSN p acknowledges everything before p and resends
// from p.
TEST_F(RequesterTest, SequenceNakResendsFromNakedPsn) {
  setup_buffers();
  post_send_len(1, 10);
  post_send_len(2, 10);
  post_send_len(3, 10);
  clear_sent();
  ack(kSqPsn + 1, wire::make_nak(wire::NakCode::kPsnSequenceError));
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn + 1);
  EXPECT_EQ(sent(1).bth().psn(), kSqPsn + 2);
  EXPECT_EQ(engine_.counters().rcvd_seq_err, 1u);
}

// IBA 9.7.5.1.3 with rxe_comp.c's started_retry: more PSN Sequence Error NAKs for the PSN a
// resend already started from (a responder that NAKs each out-of-order packet it saw, or a
// duplicated NAK) start no second resend and spend no retry, so a link that only reorders
// cannot exhaust retry_cnt 1; a NAK after progress starts a new resend with a fresh budget.
TEST_F(RequesterTest, RepeatedSequenceNaksForOnePsnResendOnce) {
  QpParams p;
  p.retry_cnt = 1;
  make_qp(p);
  setup_buffers();
  for (uint64_t id = 1; id <= 4; ++id) post_send_len(id, 10);  // PSNs kSqPsn .. kSqPsn + 3
  clear_sent();
  const uint8_t seq_nak = wire::make_nak(wire::NakCode::kPsnSequenceError);
  ack(kSqPsn + 1, seq_nak);  // the responder saw kSqPsn + 2 before kSqPsn + 1
  ASSERT_EQ(sent_count(), 3u);
  ack(kSqPsn + 1, seq_nak);  // ... and kSqPsn + 3
  ack(kSqPsn + 1, seq_nak);  // a copy of the first NAK
  EXPECT_EQ(sent_count(), 3u);
  EXPECT_EQ(engine_.counters().rcvd_seq_err, 3u);
  EXPECT_EQ(engine_.counters().completer_retry_err, 1u);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);

  clear_sent();
  ack(kSqPsn + 2, seq_nak);  // kSqPsn + 1 arrived: progress, then a new gap
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn + 2);
  EXPECT_EQ(engine_.counters().completer_retry_err, 2u);
  ack(kSqPsn + 3);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 4u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  EXPECT_EQ(engine_.counters().retry_exceeded_err, 0u);
}

// A local ACK timeout during a NAK's resend still retries, and is charged: retry_cnt 1 is one
// NAK resend, then the timeout finds the budget spent (IBA 9.7.6.1.1).
TEST_F(RequesterTest, TimeoutDuringANakResendIsStillCharged) {
  QpParams p;
  p.retry_cnt = 1;
  make_qp(p);
  setup_buffers();
  post_send_len(1, 10);
  post_send_len(2, 10);
  ack(kSqPsn, wire::make_nak(wire::NakCode::kPsnSequenceError));
  EXPECT_EQ(engine_.counters().completer_retry_err, 1u);
  advance(timeout_ns());
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
}

// IBA 9.7.5.1.5: RNR NAK → nothing is resent before the RNR timer (table 45), then the
// NAK'ed request is resent.
TEST_F(RequesterTest, RnrNakWaitsTheRnrTimer) {
  setup_buffers();
  post_send_len(1, 10);
  clear_sent();
  constexpr uint8_t kCode = 14;  // 1.28 ms
  ack(kSqPsn, wire::make_rnr_nak(kCode));
  EXPECT_EQ(engine_.next_deadline_ns(), clock_.now_ns() + wire::rnr_timer_ns(kCode));
  advance(wire::rnr_timer_ns(kCode) - 1);
  EXPECT_EQ(sent_count(), 0u);
  advance(1);
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn);
  EXPECT_EQ(engine_.counters().rcvd_rnr_err, 1u);
}

// IBA 9.7.5.1.4: NAK Remote Access Error → REM_ACCESS_ERR for that WR, QP → ERR; the rest
// flush. NAK Invalid Request → REM_INV_REQ_ERR; Remote Operational → REM_OP_ERR.
TEST_F(RequesterTest, FatalNaksMapToCompletionStatus) {
  const std::pair<wire::NakCode, ibv_wc_status> cases[] = {
      {wire::NakCode::kRemoteAccessError, IBV_WC_REM_ACCESS_ERR},
      {wire::NakCode::kInvalidRequest, IBV_WC_REM_INV_REQ_ERR},
      {wire::NakCode::kRemoteOperationalError, IBV_WC_REM_OP_ERR},
  };
  setup_buffers();
  for (const auto& [code, status] : cases) {
    make_qp();
    post_send_len(1, 10);
    post_send_len(2, 10);
    ack(kSqPsn, wire::make_nak(code));
    const auto wcs = cqes();
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].status, status);
    EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  }
}

// IBA 9.7.4.1.3 / 9.7.5.1.2: a READ takes one request PSN per expected response packet; its
// responses are placed in the local SGE and implicitly acknowledge the earlier SEND.
TEST_F(RequesterTest, ReadResponsesArePlacedAndImplyAck) {
  setup_buffers();
  post_send_len(1, 10);
  post_read(2, 1500);
  ASSERT_EQ(sent_count(), 2u);
  const wire::PacketView req = sent(1);
  EXPECT_EQ(req.opcode(), op::kRcReadRequest);
  EXPECT_EQ(req.bth().psn(), kSqPsn + 1);
  EXPECT_EQ(req.reth()->dma_length(), 1500u);
  std::vector<uint8_t> first(1024, 0x11), last(476, 0x22);
  auto aeth = [](const wire::PacketHeaders& h) {
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  };
  inject(op::kRcReadResponseFirst, kSqPsn + 1, first, aeth);
  EXPECT_EQ(cqes().size(), 1u);  // the SEND, acknowledged implicitly
  inject(op::kRcReadResponseLast, kSqPsn + 2, last, aeth);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(buf_[0], 0x11);
  EXPECT_EQ(buf_[1499], 0x22);
  EXPECT_NE(buf_[1500], 0x22);  // nothing past the SGE
}

// A READ response beyond a lost one re-requests the rest of the READ at once (once per gap),
// from the first missing PSN, with RETH VA and length moved past what already arrived.
TEST_F(RequesterTest, ReadResponseGapReRequestsOncePerGap) {
  setup_buffers();
  post_read(1, 3000);
  auto aeth = [](const wire::PacketHeaders& h) {
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  };
  inject(op::kRcReadResponseFirst, kSqPsn, std::vector<uint8_t>(1024, 1), aeth);
  clear_sent();
  // PSN kSqPsn + 1 is lost; the Last arrives.
  inject(op::kRcReadResponseLast, kSqPsn + 2, std::vector<uint8_t>(952, 3), aeth);
  ASSERT_EQ(sent_count(), 1u);
  const wire::PacketView req = sent(0);
  EXPECT_EQ(req.opcode(), op::kRcReadRequest);
  EXPECT_EQ(req.bth().psn(), kSqPsn + 1);
  EXPECT_EQ(req.reth()->va(), 0x1000u + 1024);
  EXPECT_EQ(req.reth()->dma_length(), 3000u - 1024);
  inject(op::kRcReadResponseLast, kSqPsn + 2, std::vector<uint8_t>(952, 3), aeth);
  EXPECT_EQ(sent_count(), 1u);  // the same gap: no second request
  inject(op::kRcReadResponseFirst, kSqPsn + 1, std::vector<uint8_t>(1024, 2), aeth);
  inject(op::kRcReadResponseLast, kSqPsn + 2, std::vector<uint8_t>(952, 3), aeth);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[1024], 2);
  EXPECT_EQ(buf_[2999], 3);
}

// Responses with a wrong length (a Middle shorter than PMTU, a Last that overruns the WQE) are
// dropped and counted; nothing is written.
TEST_F(RequesterTest, MalformedReadResponseIsDropped) {
  setup_buffers();
  post_read(2, 100);
  inject(op::kRcReadResponseOnly, kSqPsn, std::vector<uint8_t>(200, 0x33),
         [](const wire::PacketHeaders& h) {
           h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
         });
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(engine_.counters().drop_bad_response, 1u);
  EXPECT_NE(buf_[0], 0x33);
}

// A response for a PSN never sent is dropped (never trust the peer).
TEST_F(RequesterTest, AckForUnsentPsnIsDropped) {
  setup_buffers();
  post_send_len(1, 10);
  ack(kSqPsn + 5);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(engine_.counters().drop_bad_response, 1u);
}

// IBA 10.8.3.3 (fence): a fenced WR waits until every earlier READ/ATOMIC has completed.
TEST_F(RequesterTest, FenceWaitsForPriorRead) {
  setup_buffers();
  post_read(1, 8);
  post_send_len(2, 8, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  ASSERT_EQ(sent_count(), 1u);  // only the READ
  inject(op::kRcReadResponseOnly, kSqPsn, std::vector<uint8_t>(8, 1),
         [](const wire::PacketHeaders& h) {
           h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
         });
  engine_.poll();
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(1).opcode(), op::kRcSendOnly);
  EXPECT_EQ(sent(1).bth().psn(), kSqPsn + 1);
}

// IBA 11.2.4.2 (max_rd_atomic): with max_rd_atomic 1 a second READ waits for the first.
TEST_F(RequesterTest, MaxRdAtomicLimitsOutstandingReads) {
  QpParams p;
  p.max_rd_atomic = 1;
  make_qp(p);
  setup_buffers();
  post_read(1, 8);
  post_read(2, 8);
  ASSERT_EQ(sent_count(), 1u);
  inject(op::kRcReadResponseOnly, kSqPsn, std::vector<uint8_t>(8, 1),
         [](const wire::PacketHeaders& h) {
           h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
         });
  engine_.poll();
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(1).opcode(), op::kRcReadRequest);
}

// IBA 10.6.3.x: a send SGE whose L_Key fails the check → LOC_PROT_ERR, no packet.
TEST_F(RequesterTest, BadLkeyIsLocalProtectionError) {
  setup_buffers();
  ibv_sge s = sge(buf_.data(), 16, mr_);
  s.lkey ^= 0xFF;
  post(send_wr(1, IBV_WR_SEND, &s));
  EXPECT_EQ(sent_count(), 0u);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// Inline data and immediate data go into the packet as posted; SOLICITED sets BTH.SE.
TEST_F(RequesterTest, InlineImmSolicited) {
  const char msg[] = "hello";
  ibv_sge s{reinterpret_cast<uint64_t>(msg), 5, 0};
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND_WITH_IMM, &s, 1,
                           IBV_SEND_SIGNALED | IBV_SEND_INLINE | IBV_SEND_SOLICITED);
  wr.imm_data = htonl(0x01020304);
  post(wr);
  ASSERT_EQ(sent_count(), 1u);
  const wire::PacketView p = sent(0);
  EXPECT_EQ(p.opcode(), op::kRcSendOnlyImm);
  EXPECT_TRUE(p.bth().se());
  EXPECT_EQ(p.immdt()->imm(), 0x01020304u);
  EXPECT_EQ(0, std::memcmp(p.payload().data(), msg, 5));
}

// LOCAL_INV and BIND_MW (type 2) execute in order with no packet (IBA 10.6.7.2.x).
TEST_F(RequesterTest, BindAndLocalInvalidateWindow) {
  setup_buffers();
  auto* mr = dev_.reg_mr(pd_, buf_.data(), buf_.size(), reinterpret_cast<uint64_t>(buf_.data()),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND)
                 .value();
  auto* mw = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
  ibv_mw verbs_mw = {};
  verbs_mw.handle = mw->handle();
  ibv_mr verbs_mr = {};
  verbs_mr.handle = mr->handle();
  ibv_send_wr bind = send_wr(1, IBV_WR_BIND_MW, nullptr, 0);
  bind.bind_mw.mw = &verbs_mw;
  bind.bind_mw.rkey = (mw->rkey() & ~0xFFu) | 0x5A;
  bind.bind_mw.bind_info.mr = &verbs_mr;
  bind.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(buf_.data());
  bind.bind_mw.bind_info.length = 64;
  bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  post(bind);
  EXPECT_EQ(sent_count(), 0u);
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_BIND_MW);
  EXPECT_TRUE(mw->bound());
  ibv_send_wr inv = send_wr(2, IBV_WR_LOCAL_INV, nullptr, 0);
  inv.invalidate_rkey = mw->rkey();
  post(inv);
  wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_FALSE(mw->bound());
}

// ibv_modify_qp changes the provider's state at once and queues a command for the engine, which
// a turn already running applies only in its next turn. An application thread can bring a QP to
// RTS and post a SEND in that gap (ibv_rc_pingpong does both right after connecting): the turn
// must leave the WQE alone until it has applied RTS — sent before, it went out with INIT's
// attributes (PSN 0, destination QP 0, a 256-byte MTU), and once RTS was applied its PSNs lay
// outside the WQE (a 64 KiB message aborted the process: "requester PSN outside its WQE";
// a small one was resent to nobody until RETRY_EXC_ERR).
TEST_F(RequesterTest, WorkPostedBeforeTheEngineAppliedRtsWaitsForIt) {
  setup_buffers();
  provider::Cq* late_cq = dev_.create_cq(16).value();
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd_;
  init.send_cq = late_cq;
  init.recv_cq = late_cq;
  init.cap = cap_;
  provider::Qp* late = dev_.create_qp(init).value();
  constexpr uint32_t kLateSqPsn = 0x345678;
  constexpr uint32_t kLatePeerQpn = 0x77;
  ibv_qp_attr a = {};
  a.port_num = provider::kPortNum;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = provider::kPortNum;
  a.ah_attr.grh.dgid = gid_of(kPeer);
  a.ah_attr.grh.hop_limit = 64;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = kLatePeerQpn;
  a.rq_psn = 0x10;
  a.sq_psn = kLateSqPsn;
  a.max_dest_rd_atomic = 1;
  a.max_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.timeout = 10;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  const auto modify = [&](ibv_qp_state from, ibv_qp_state to) {
    a.qp_state = to;
    return late->modify(a, mask_for(from, to, IBV_QPT_RC)).error();
  };
  // INIT, applied at once (no turn runs): the engine knows the QP, with INIT's attributes.
  ASSERT_EQ(modify(IBV_QPS_RESET, IBV_QPS_INIT), 0);

  // The next turn takes a SEND for the other QP; its completion wakes "the application", whose
  // thread moves the late QP to RTR and RTS and posts 2500 bytes while the turn holds the engine.
  std::vector<uint8_t> in(64, 0);
  ASSERT_EQ(post_recv(qp_, 9, sge(in.data(), 64, reg(in.data(), in.size(), IBV_ACCESS_LOCAL_WRITE))),
            0);
  std::vector<int> app_results;
  cq_->set_notify([&](provider::Cq&) {
    std::thread app([&] {
      app_results.push_back(modify(IBV_QPS_INIT, IBV_QPS_RTR));
      app_results.push_back(modify(IBV_QPS_RTR, IBV_QPS_RTS));
      ibv_sge s = sge(buf_.data(), 2500, mr_);
      app_results.push_back(post_send(late, send_wr(5, IBV_WR_SEND, &s)));
    });
    app.join();
  });
  cq_->req_notify(false);
  clear_sent();
  const std::vector<uint8_t> payload(16, 0xAB);
  inject(op::kRcSendOnly, 0x200, payload);
  ASSERT_EQ(app_results, (std::vector<int>{0, 0, 0}));
  engine_.poll();  // the commands, then the requester

  // Three packets at the path MTU of RTR, from RTS's sq_psn, to RTS's destination.
  std::vector<wire::PacketView> requests;
  for (size_t i = 0; i < sent_count(); ++i)
    if (sent(i).opcode() != op::kRcAck) requests.push_back(sent(i));
  ASSERT_EQ(requests.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(requests[i].bth().dest_qp(), kLatePeerQpn);
    EXPECT_EQ(requests[i].bth().psn(), kLateSqPsn + i);
  }
  EXPECT_EQ(requests[0].opcode(), op::kRcSendFirst);
  EXPECT_EQ(requests[2].opcode(), op::kRcSendLast);
  // The peer's ACK of the last PSN completes it.
  inject(op::kRcAck, kLateSqPsn + 2, {}, [&](const wire::PacketHeaders& h) {
    h.bth().set_dest_qp(late->qp_num());
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  });
  ibv_wc wc = {};
  ASSERT_EQ(late_cq->poll(1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// UD: a message longer than the PMTU → LOC_LEN_ERR and the send queue enters SQE
// (IBA 10.3.1.5).
TEST_F(ProtocolTest, UdMessageLongerThanPmtuIsLocalLengthError) {
  QpParams p;
  p.type = IBV_QPT_UD;
  make_qp(p);
  std::vector<uint8_t> big(5000);
  auto* mr = reg(big.data(), big.size(), 0);
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = gid_of(kPeer);
  auto* ah = dev_.create_ah(pd_, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();
  ibv_sge s = sge(big.data(), 5000, mr);
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, &s);
  wr.wr.ud.ah = &verbs_ah;
  wr.wr.ud.remote_qpn = 5;
  wr.wr.ud.remote_qkey = 1;
  ASSERT_EQ(post_send(qp_, wr), 0);
  engine_.poll();
  EXPECT_EQ(io_.sent.size(), 0u);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(qp_->state(), IBV_QPS_SQE);
}

// UD Q_Key high-bit rule (IBA 10.2.5): a WR Q_Key with bit 31 set sends the QP's Q_Key.
TEST_F(ProtocolTest, UdControlledQkeyUsesQpQkey) {
  QpParams p;
  p.type = IBV_QPT_UD;
  p.qkey = 0x1234;
  make_qp(p);
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = gid_of(kPeer);
  auto* ah = dev_.create_ah(pd_, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, nullptr, 0);
  wr.wr.ud.ah = &verbs_ah;
  wr.wr.ud.remote_qpn = 5;
  wr.wr.ud.remote_qkey = 0x80000001;
  ASSERT_EQ(post_send(qp_, wr), 0);
  engine_.poll();
  ASSERT_EQ(io_.sent.size(), 1u);
  const wire::PacketView pkt = sent(0);
  EXPECT_EQ(pkt.opcode(), op::kUdSendOnly);
  EXPECT_EQ(pkt.deth()->qkey(), 0x1234u);
  EXPECT_EQ(pkt.deth()->src_qp(), qp_->qp_num());
  EXPECT_EQ(pkt.bth().dest_qp(), 5u);
  EXPECT_EQ(cqes().size(), 1u);  // UD completes when sent
}

}  // namespace
}  // namespace urdma::engine::testing
