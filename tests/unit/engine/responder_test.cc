// Responder steps, one test per step and per error path, with hand-built request packets
// (eRPC protocol-test style). Each test names the IBA rule it checks.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "protocol_test_util.h"
#include "wire/psn.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;
constexpr uint32_t kRqPsn = 0x200;  // QpParams default rq_psn: the first PSN we expect
constexpr uint32_t kSqPsn = 0x100;  // QpParams default sq_psn: our first request PSN

class ResponderTest : public ProtocolTest {
 protected:
  ResponderTest() = default;
  explicit ResponderTest(engine::EngineConfig config) : ProtocolTest(config) {}
  void SetUp() override {
    make_qp();
    recv_buf_.assign(4096, 0);
    recv_mr_ = reg(recv_buf_.data(), recv_buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    mem_.assign(8192, 0xAA);
    mem_mr_ = reg(mem_.data(), mem_.size(),
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
  }
  void post_recv_buf(uint64_t wr_id, uint32_t len = 4096) {
    ASSERT_EQ(post_recv(qp_, wr_id, sge(recv_buf_.data(), len, recv_mr_)), 0);
  }
  uint64_t mem_va(size_t off = 0) { return reinterpret_cast<uint64_t>(mem_.data()) + off; }

  std::vector<uint8_t> recv_buf_;
  std::vector<uint8_t> mem_;
  provider::Mr* recv_mr_ = nullptr;
  provider::Mr* mem_mr_ = nullptr;
};

// IBA 9.7.5.2.x: an expected SEND Only is placed, completed, and acknowledged (AckReq) with
// the request's PSN and the new MSN.
TEST_F(ResponderTest, SendOnlyIsPlacedCompletedAndAcked) {
  post_recv_buf(5);
  const std::vector<uint8_t> data = {1, 2, 3, 4, 5};
  inject(op::kRcSendOnly, kRqPsn, data);
  ASSERT_EQ(sent_count(), 1u);
  const wire::PacketView ack = sent(0);
  EXPECT_EQ(ack.opcode(), op::kRcAck);
  EXPECT_TRUE(ack.aeth()->is_ack());
  EXPECT_EQ(ack.bth().psn(), kRqPsn);
  EXPECT_EQ(ack.aeth()->msn(), 1u);
  EXPECT_EQ(ack.aeth()->credit_code(), wire::kAethCreditsInvalid);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  EXPECT_EQ(wcs[0].byte_len, 5u);
  EXPECT_EQ(0, std::memcmp(recv_buf_.data(), data.data(), 5));
}

// IBA 9.7.5.2.x (ACK coalescing): without AckReq no ACK is sent.
TEST_F(ResponderTest, NoAckWithoutAckReq) {
  post_recv_buf(5);
  inject(op::kRcSendOnly, kRqPsn, {}, {}, /*ack_req=*/false);
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_EQ(engine_.counters().ack_deferred, 1u);
  EXPECT_EQ(cqes().size(), 1u);
}

// IBA 9.7.5.1.1 (coalesced acknowledgements): requests asking for an ACK that arrive in one
// received batch are acknowledged by one ACK of the last one's PSN and MSN; an ACK the
// responder owes leaves before a NAK of the same batch (responses stay in PSN order).
TEST_F(ResponderTest, OneBatchOfRequestsIsAcknowledgedOnceAndBeforeANak) {
  for (uint64_t i = 0; i < 4; ++i) post_recv_buf(i, 16);
  const std::vector<uint8_t> payload = {1, 2, 3};
  auto send_only = [&](uint32_t psn) { deliver(build(op::kRcSendOnly, psn, payload)); };
  send_only(kRqPsn);
  send_only(kRqPsn + 1);
  send_only(kRqPsn + 2);
  engine_.poll();
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_TRUE(sent(0).aeth()->is_ack());
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 2);
  EXPECT_EQ(sent(0).aeth()->msn(), 3u);
  EXPECT_EQ(cqes().size(), 3u);

  clear_sent();
  send_only(kRqPsn + 3);
  send_only(kRqPsn + 7);  // a gap: PSN Sequence Error NAK carrying kRqPsn + 4
  engine_.poll();
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_TRUE(sent(0).aeth()->is_ack());
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 3);
  EXPECT_EQ(sent(0).aeth()->msn(), 4u);
  expect_nak(1, wire::NakCode::kPsnSequenceError, kRqPsn + 4);
}

// EngineConfig::tx_batch > 1: a READ response is queued, its payload gathered from registered
// memory by iovec, and sent at the end of the turn. A WRITE behind the READ in the same received
// batch must not change what the READ response carries (IBA 9.5: the responder executes
// requests in PSN order), nor the bytes its ICRC was sealed over (the peer would drop it).
class BatchedTxResponderTest : public ResponderTest {
 protected:
  static engine::EngineConfig batched() {
    engine::EngineConfig c;
    c.tx_batch = 64;
    return c;
  }
  BatchedTxResponderTest() : ResponderTest(batched()) {}
};

TEST_F(BatchedTxResponderTest, AWriteBehindAReadDoesNotChangeTheQueuedReadResponse) {
  constexpr uint32_t kLen = 64;
  const std::vector<uint8_t> fresh(kLen, 0x55);
  const HeaderFill at_mem = reth(mem_va(), mem_mr_->rkey(), kLen);
  deliver(build(op::kRcReadRequest, kRqPsn, {}, at_mem));
  deliver(build(op::kRcWriteOnly, kRqPsn + 1, fresh, at_mem));
  engine_.poll();
  ASSERT_EQ(sent_count(), 2u);
  const wire::PacketView response = sent(0);  // sent() checks the ICRC
  EXPECT_EQ(response.opcode(), op::kRcReadResponseOnly);
  EXPECT_EQ(response.payload().size(), kLen);
  EXPECT_EQ(std::vector<uint8_t>(response.payload().begin(), response.payload().end()),
            std::vector<uint8_t>(kLen, 0xAA));
  EXPECT_TRUE(sent(1).aeth()->is_ack());
  EXPECT_EQ(std::vector<uint8_t>(mem_.begin(), mem_.begin() + kLen), fresh);
}

// EngineConfig::ack_delay_ns: on a QP in a conversation (it answered a request within the
// delay), an owed ACK waits for the reply the application posts after its completion and
// leaves behind it; the engine asks for a turn within the delay. A QP that only receives (a
// one-way stream, whose sender waits for its window) is acknowledged at the end of each batch.
class DelayedAckTest : public ProtocolTest {
 protected:
  static constexpr uint64_t kDelayNs = 20'000;
  static engine::EngineConfig delayed() {
    engine::EngineConfig c;
    c.ack_delay_ns = kDelayNs;
    c.tx_batch = 64;  // as processes run: what one turn sends shares a sendmmsg
    return c;
  }
  DelayedAckTest() : ProtocolTest(delayed()) {}

  void SetUp() override {
    make_qp();
    mr_ = reg(buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  // The peer's SEND number `n` (PSN kRqPsn + n) into a fresh receive WQE.
  void peer_sends(uint32_t n) {
    ASSERT_EQ(post_recv(qp_, n, sge(buf_.data(), 32, mr_)), 0);
    inject(op::kRcSendOnly, kRqPsn + n, std::vector<uint8_t>{static_cast<uint8_t>(n)});
  }
  // The application's reply: a SEND, and the turn its post asks for.
  void reply(uint64_t wr_id) {
    ibv_sge s = sge(buf_.data() + 32, 8, mr_);
    ASSERT_EQ(post_send(qp_, send_wr(wr_id, IBV_WR_SEND, &s)), 0);
    engine_.poll();
  }
  void expect_ack(size_t i, uint32_t n) {
    const wire::PacketView p = sent(i);
    EXPECT_EQ(p.opcode(), op::kRcAck);
    EXPECT_TRUE(p.aeth()->is_ack());
    EXPECT_EQ(p.bth().psn(), kRqPsn + n);
    EXPECT_EQ(p.aeth()->msn(), n + 1);
  }
  // Into a conversation: SEND 0 is acknowledged at once, and the reply comes in time.
  void start_conversation() {
    peer_sends(0);
    ASSERT_EQ(sent_count(), 1u);
    expect_ack(0, 0);
    reply(100);
    ASSERT_EQ(sent_count(), 2u);
    EXPECT_EQ(sent(1).opcode(), op::kRcSendOnly);
    clear_sent();
  }

  std::vector<uint8_t> buf_ = std::vector<uint8_t>(64, 7);
  provider::Mr* mr_ = nullptr;
};

TEST_F(DelayedAckTest, AQpThatOnlyReceivesIsAckedAtTheEndOfEachBatch) {
  for (uint32_t n = 0; n < 3; ++n) {
    peer_sends(n);
    ASSERT_EQ(sent_count(), n + 1);
    expect_ack(n, n);
  }
  // A request this QP starts later than the delay after its last ACK is no reply.
  clock_.advance(2 * kDelayNs);
  reply(100);
  clear_sent();
  peer_sends(3);
  ASSERT_EQ(sent_count(), 1u);
  expect_ack(0, 3);
}

TEST_F(DelayedAckTest, InAConversationTheReplyLeavesFirstAndTheAckBehindIt) {
  start_conversation();
  peer_sends(1);
  EXPECT_EQ(sent_count(), 0u);  // owed, held for the reply
  EXPECT_EQ(cqes().size(), 2u);
  const uint64_t now = clock_.now_ns();
  EXPECT_GT(engine_.next_deadline_ns(), now);
  EXPECT_LE(engine_.next_deadline_ns(), now + kDelayNs);
  engine_.poll();  // a turn with no reply (the engine thread woken by something else)
  EXPECT_EQ(sent_count(), 0u);
  // The peer's ACK of reply 100 waits in the socket when the application posts reply 101.
  deliver(build_ack(kSqPsn));
  reply(101);
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(sent(0).opcode(), op::kRcSendOnly);
  expect_ack(1, 1);
  // One send for both, before the turn read the socket: the held ACK does not leave after a
  // receive, just as the peer's next request may come in.
  EXPECT_EQ(io_.sent[0].call, io_.sent[1].call);
  EXPECT_EQ(io_.sent[1].unread, 1u);
  EXPECT_EQ(io_.pending(), 0u);  // and the same turn read it
}

TEST_F(DelayedAckTest, WithoutAReplyTheAckLeavesAtTheDeadlineAndTheConversationEnds) {
  start_conversation();
  peer_sends(1);
  EXPECT_EQ(sent_count(), 0u);
  clock_.advance(kDelayNs - 1);
  engine_.poll();
  EXPECT_EQ(sent_count(), 0u);
  advance(1);
  ASSERT_EQ(sent_count(), 1u);
  expect_ack(0, 1);
  // No longer in a conversation: the next SEND is acknowledged at once.
  peer_sends(2);
  ASSERT_EQ(sent_count(), 2u);
  expect_ack(1, 2);
}

// A requester whose ACK timeout is shorter than the hold resends: the duplicate is answered at
// once (the held ACK, then the duplicate's), so the hold never costs it its retries.
TEST_F(DelayedAckTest, ARetransmittedRequestIsAcknowledgedAtOnce) {
  start_conversation();
  peer_sends(1);
  EXPECT_EQ(sent_count(), 0u);
  inject(op::kRcSendOnly, kRqPsn + 1, std::vector<uint8_t>{1});  // the peer's resend
  ASSERT_GE(sent_count(), 1u);
  for (size_t i = 0; i < sent_count(); ++i) expect_ack(i, 1);
  EXPECT_EQ(cqes().size(), 2u);  // SEND 0 and SEND 1, each once
}

// An ACK still owed when the QP goes — to ERR (rdma_disconnect), or destroyed (a program that
// exits right after its last receive completion: ibv_rc_pingpong's end) — acknowledges a SEND
// this side completed: it leaves before the call returns, not never (the peer would retry into
// nothing and fail with RETRY_EXC_ERR) nor at the next turn (rdma_disconnect's DREQ, sent as
// the modify returns, would overtake it, and the peer's disconnect flush that SEND).
TEST_F(DelayedAckTest, AnAckOwedWhenTheQpGoesStillLeaves) {
  start_conversation();
  peer_sends(1);
  EXPECT_EQ(sent_count(), 0u);  // owed
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(qp_->modify(a, IBV_QP_STATE).error(), 0);
  ASSERT_EQ(sent_count(), 1u);
  expect_ack(0, 1);

  clear_sent();
  make_qp();  // a second QP, destroyed with its ACK owed
  start_conversation();
  peer_sends(1);
  EXPECT_EQ(sent_count(), 0u);
  ASSERT_EQ(dev_.destroy_qp(qp_).error(), 0);
  qp_ = nullptr;
  ASSERT_EQ(sent_count(), 1u);
  expect_ack(0, 1);
}

// The same when another thread's turn runs as the modify comes: ibv_modify_qp waits for that
// turn, and returns with the owed ACK sent. Here this thread's turn sends a second QP's SEND,
// and while that turn runs, another thread moves the first QP (which owes an ACK) to ERR.
TEST_F(DelayedAckTest, AModifyToErrDuringAnotherThreadsTurnReturnsWithTheOwedAckSent) {
  start_conversation();
  peer_sends(1);
  ASSERT_EQ(sent_count(), 0u);  // owed
  provider::Qp* owing = qp_;
  make_qp();
  std::atomic<bool> started{false};
  std::atomic<bool> returned{false};
  std::optional<std::thread> modifier;
  size_t sent_when_it_returned = 0;
  io_.on_send = [&](const net::TxDatagram&, std::span<const uint8_t>) {
    if (started.exchange(true)) return;  // the modifier's own sends
    modifier.emplace([&] {
      ibv_qp_attr a = {};
      a.qp_state = IBV_QPS_ERR;
      EXPECT_EQ(owing->modify(a, IBV_QP_STATE).error(), 0);
      sent_when_it_returned = io_.sent.size();
      returned.store(true);
    });
    // Time for a modify that does not wait to return while this turn still runs.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (!returned.load() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  ibv_sge s = sge(buf_.data() + 32, 8, mr_);
  ASSERT_EQ(post_send(qp_, send_wr(7, IBV_WR_SEND, &s)), 0);
  engine_.poll();
  ASSERT_TRUE(modifier.has_value());
  modifier->join();
  io_.on_send = nullptr;
  ASSERT_EQ(sent_when_it_returned, 2u);  // the second QP's SEND, then the owed ACK
  EXPECT_EQ(sent(0).opcode(), op::kRcSendOnly);
  EXPECT_EQ(sent(0).bth().dest_qp(), kPeerQpn);
  expect_ack(1, 1);
}

// IBA 9.7.5.2.2: a duplicate SEND is acknowledged again and not delivered twice.
TEST_F(ResponderTest, DuplicateSendIsReackedNotRedelivered) {
  post_recv_buf(5);
  post_recv_buf(6);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{9});
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{9});
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_TRUE(sent(1).aeth()->is_ack());
  EXPECT_EQ(sent(1).bth().psn(), kRqPsn);
  EXPECT_EQ(cqes().size(), 1u);
  EXPECT_EQ(engine_.counters().duplicate_request, 1u);
}

// IBA 9.7.5.2.2 + 9.7.5.1.2: the ACK of a duplicate SEND names the last SEND/WRITE received,
// never a READ's or ATOMIC's PSN: the requester resends those behind the duplicate and may lack
// their response, and rxe completes a READ named by a plain ACK without its data (rping -V under
// loss, urdma->rxe: "data mismatch!"). Past them it is an implied NAK: they are asked again.
TEST_F(ResponderTest, DuplicateSendIsAckedWithTheLastSendOrWritePsn) {
  post_recv_buf(5);
  post_recv_buf(6);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{9});
  inject(op::kRcReadRequest, kRqPsn + 1, {}, reth(mem_va(), mem_mr_->rkey(), 2048));  // 2 PSNs
  inject(op::kRcFetchAdd, kRqPsn + 3, {}, [&](const wire::PacketHeaders& h) {
    h.atomic_eth()->set_va(mem_va());
    h.atomic_eth()->set_rkey(mem_mr_->rkey());
    h.atomic_eth()->set_swap_add(1);
  });
  clear_sent();
  // The requester resends from kRqPsn: everything up to the ATOMIC was received, but the ACK
  // names the SEND.
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{9});
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).opcode(), op::kRcAck);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn);
  // After a later SEND the ACK of the same duplicate names that SEND.
  inject(op::kRcSendOnly, kRqPsn + 4, std::vector<uint8_t>{8});
  clear_sent();
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{9});
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 4);
  EXPECT_EQ(cqes().size(), 2u);
}

// IBA 9.7.5.2.2 on a QP of an SRQ (ibv_srq_pingpong's case): a multi-packet SEND resent whole
// after its ACK was lost — every packet a duplicate — is acknowledged again up to the last PSN
// received, delivered once, and takes no second WQE from the SRQ: the next SEND gets the next one.
TEST_F(ProtocolTest, DuplicateSendToAnSrqQpIsReackedAndTakesNoWqe) {
  ibv_srq_attr srq_attr = {};
  srq_attr.max_wr = 4;
  srq_attr.max_sge = 1;
  provider::Srq* srq = dev_.create_srq(pd_, srq_attr).value();
  QpParams p;
  p.srq = srq;
  make_qp(p);
  std::vector<uint8_t> bufs(2 * 4096, 0);
  provider::Mr* mr = reg(bufs.data(), bufs.size(), IBV_ACCESS_LOCAL_WRITE);
  for (uint64_t id : {1, 2}) {
    ibv_sge s = sge(bufs.data() + (id - 1) * 4096, 4096, mr);
    ibv_recv_wr wr = {};
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(srq->post_recv(&wr, &bad).error(), 0);
  }
  constexpr uint32_t kPsn = 0x200;  // QpParams' rq_psn
  std::vector<uint8_t> msg(2500);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 13);
  const std::span<const uint8_t> m(msg);
  const auto send_message = [&] {
    inject(op::kRcSendFirst, kPsn, m.subspan(0, 1024), {}, false);
    inject(op::kRcSendMiddle, kPsn + 1, m.subspan(1024, 1024), {}, false);
    inject(op::kRcSendLast, kPsn + 2, m.subspan(2048));
  };
  send_message();
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).bth().psn(), kPsn + 2);
  clear_sent();
  send_message();  // the go-back-N resend: three duplicates, three ACKs of the last PSN
  ASSERT_EQ(sent_count(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(sent(i).aeth()->is_ack());
    EXPECT_EQ(sent(i).bth().psn(), kPsn + 2);
  }
  EXPECT_EQ(engine_.counters().duplicate_request, 3u);
  inject(op::kRcSendOnly, kPsn + 3, std::vector<uint8_t>{7});
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].byte_len, 2500u);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].byte_len, 1u);
  EXPECT_EQ(0, std::memcmp(bufs.data(), msg.data(), msg.size()));
}

// IBA 9.7.5.2.1: a PSN beyond the expected one → one PSN Sequence Error NAK carrying the
// expected PSN, and no second NAK for the same gap.
TEST_F(ResponderTest, OutOfSequenceNakOncePerGap) {
  post_recv_buf(5);
  inject(op::kRcSendOnly, kRqPsn + 2, std::vector<uint8_t>{1});
  inject(op::kRcSendOnly, kRqPsn + 3, std::vector<uint8_t>{1});
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kPsnSequenceError, kRqPsn);
  EXPECT_EQ(engine_.counters().out_of_seq_request, 2u);
  EXPECT_TRUE(cqes().empty());
  // The expected packet closes the gap; a new gap NAKs again.
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{1});
  inject(op::kRcSendOnly, kRqPsn + 5, std::vector<uint8_t>{1});
  ASSERT_EQ(sent_count(), 3u);
  expect_nak(2, wire::NakCode::kPsnSequenceError, kRqPsn + 1);
}

// IBA 9.7.5.2.8 (RNR): no receive WQE → RNR NAK with the QP's min_rnr_timer; the PSN is not
// consumed, so the retried packet is accepted once a WQE is posted.
TEST_F(ResponderTest, NoReceiveWqeSendsRnrNak) {
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{7});
  ASSERT_EQ(sent_count(), 1u);
  const wire::PacketView nak = sent(0);
  EXPECT_TRUE(nak.aeth()->is_rnr_nak());
  EXPECT_EQ(nak.aeth()->rnr_timer_code(), params_.min_rnr_timer);
  EXPECT_EQ(nak.bth().psn(), kRqPsn);
  EXPECT_EQ(engine_.counters().send_rnr_err, 1u);
  post_recv_buf(5);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{7});
  EXPECT_TRUE(sent(1).aeth()->is_ack());
  EXPECT_EQ(cqes().size(), 1u);
}

// IBA 9.7.5.2.x: a SEND longer than the receive WQE → NAK Invalid Request, the WQE
// completes with LOC_LEN_ERR and the QP enters ERR.
TEST_F(ResponderTest, SendTooLongForReceiveWqe) {
  post_recv_buf(5, 4);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>(8, 1));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(recv_buf_[i], 0) << "nothing placed";
}

// IBA 9.7.5.2.x (opcode sequence): a Middle packet with no message in progress → NAK Invalid
// Request, QP → ERR.
TEST_F(ResponderTest, MiddleWithoutFirstIsInvalidRequest) {
  post_recv_buf(5);
  inject(op::kRcSendMiddle, kRqPsn, std::vector<uint8_t>(4096, 1));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// IBA 9.5: a First packet must carry exactly one PMTU (1024 here) → otherwise Invalid Request.
TEST_F(ResponderTest, FirstPacketShorterThanPmtuIsInvalidRequest) {
  post_recv_buf(5);
  inject(op::kRcSendFirst, kRqPsn, std::vector<uint8_t>(100, 1));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
}

// Multi-packet SEND: First + Middle + Last land contiguously in one receive WQE.
TEST_F(ResponderTest, MultiPacketSendFillsOneWqe) {
  post_recv_buf(5);
  std::vector<uint8_t> a(1024, 1), b(1024, 2), c(10, 3);
  inject(op::kRcSendFirst, kRqPsn, a, {}, false);
  inject(op::kRcSendMiddle, kRqPsn + 1, b, {}, false);
  inject(op::kRcSendLast, kRqPsn + 2, c);
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 2);
  EXPECT_EQ(sent(0).aeth()->msn(), 1u);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].byte_len, 2058u);
  EXPECT_EQ(recv_buf_[0], 1);
  EXPECT_EQ(recv_buf_[1024], 2);
  EXPECT_EQ(recv_buf_[2048], 3);
  EXPECT_EQ(recv_buf_[2058], 0);
}

// IBA 9.7.5.2.8 / 10.6.x: an RDMA WRITE with an unknown R_Key → NAK Remote Access Error,
// nothing written, QP → ERR, affiliated access error event.
TEST_F(ResponderTest, WriteWithBadRkeyIsRemoteAccessError) {
  inject(op::kRcWriteOnly, kRqPsn, std::vector<uint8_t>(16, 0x55),
         reth(mem_va(), mem_mr_->rkey() ^ 0xFF, 16));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kRemoteAccessError, kRqPsn);
  EXPECT_EQ(mem_[0], 0xAA);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  auto ev = dev_.async_events().try_pop();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, IBV_EVENT_QP_ACCESS_ERR);
}

// Bounds arithmetic never wraps: VA near 2^64 with a length that would wrap is refused.
TEST_F(ResponderTest, WriteWhoseRangeWrapsIsRefused) {
  inject(op::kRcWriteOnly, kRqPsn, std::vector<uint8_t>(16, 0x55),
         reth(~uint64_t{0} - 7, mem_mr_->rkey(), 16));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kRemoteAccessError, kRqPsn);
}

// A WRITE one byte past the end of the region is refused and writes nothing.
TEST_F(ResponderTest, WritePastRegionEndIsRefused) {
  inject(op::kRcWriteOnly, kRqPsn, std::vector<uint8_t>(16, 0x55),
         reth(mem_va(mem_.size() - 15), mem_mr_->rkey(), 16));
  expect_nak(0, wire::NakCode::kRemoteAccessError, kRqPsn);
  EXPECT_EQ(mem_[mem_.size() - 1], 0xAA);
}

// A region deregistered between two packets of one RDMA WRITE is never written through: each
// packet's piece is looked up again (IBA 10.6.7: a deregistered region's R_Key is invalid).
TEST_F(ResponderTest, WriteIsCheckedAgainForEveryPacket) {
  std::vector<uint8_t> a(1024, 1), b(1024, 2);
  inject(op::kRcWriteFirst, kRqPsn, a, reth(mem_va(), mem_mr_->rkey(), 2048), false);
  EXPECT_EQ(mem_[0], 1);
  ASSERT_EQ(sent_count(), 0u);
  ASSERT_EQ(dev_.dereg_mr(mem_mr_).error(), 0);
  inject(op::kRcWriteLast, kRqPsn + 1, b);
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kRemoteAccessError, kRqPsn + 1);
  EXPECT_EQ(mem_[1024], 0xAA);
  EXPECT_EQ(mem_[2047], 0xAA);
}

// RETH DMA length must equal the payload of a WRITE Only (IBA 9.7.5.2.x) → Invalid Request.
TEST_F(ResponderTest, WriteOnlyLengthMismatchIsInvalidRequest) {
  inject(op::kRcWriteOnly, kRqPsn, std::vector<uint8_t>(16, 0x55),
         reth(mem_va(), mem_mr_->rkey(), 32));
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
  EXPECT_EQ(mem_[0], 0xAA);
}

// IBA 9.7.5.2.x (CHECK_OP_VALID): a READ on a QP without REMOTE_READ → Invalid Request.
TEST_F(ResponderTest, ReadWithoutQpRemoteReadIsInvalidRequest) {
  ibv_qp_attr a = {};
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(qp_->modify(a, IBV_QP_ACCESS_FLAGS).error(), 0);
  inject(op::kRcReadRequest, kRqPsn, {}, reth(mem_va(), mem_mr_->rkey(), 8));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
}

// IBA 9.7.4.1.3: a READ of 2.5 PMTUs → First/Middle/Last with consecutive PSNs, AETH on First
// and Last; the expected PSN advances by three.
TEST_F(ResponderTest, ReadIsAnsweredWithSegmentedResponses) {
  for (size_t i = 0; i < mem_.size(); ++i) mem_[i] = static_cast<uint8_t>(i);
  inject(op::kRcReadRequest, kRqPsn, {}, reth(mem_va(10), mem_mr_->rkey(), 2600));
  ASSERT_EQ(sent_count(), 3u);
  EXPECT_EQ(sent(0).opcode(), op::kRcReadResponseFirst);
  EXPECT_EQ(sent(1).opcode(), op::kRcReadResponseMiddle);
  EXPECT_EQ(sent(2).opcode(), op::kRcReadResponseLast);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn);
  EXPECT_EQ(sent(2).bth().psn(), kRqPsn + 2);
  EXPECT_EQ(sent(0).payload().size(), 1024u);
  EXPECT_EQ(sent(2).payload().size(), 552u);
  EXPECT_EQ(sent(1).payload()[0], static_cast<uint8_t>(10 + 1024));
  EXPECT_FALSE(sent(1).aeth().has_value());
  EXPECT_EQ(engine_.context(qp_->qp_num())->resp.epsn, kRqPsn + 3);
}

// IBA 9.7.5.2.2: a duplicate READ (retransmitted from its second packet) is answered again
// from that PSN, continuing the original's opcode sequence (rxe: Middle/Last for a replay).
TEST_F(ResponderTest, DuplicateReadIsReplayedFromItsPsn) {
  inject(op::kRcReadRequest, kRqPsn, {}, reth(mem_va(), mem_mr_->rkey(), 2048));
  clear_sent();
  inject(op::kRcReadRequest, kRqPsn + 1, {}, reth(mem_va(1024), mem_mr_->rkey(), 1024));
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).opcode(), op::kRcReadResponseLast);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 1);
  EXPECT_EQ(engine_.counters().duplicate_request, 1u);
}

// IBA 9.4.5 + 9.7.5.2.2: FETCH_ADD executes once with a real atomic; its duplicate is answered
// from the saved result and NOT executed again.
TEST_F(ResponderTest, DuplicateAtomicIsNeverReexecuted) {
  uint64_t* word = reinterpret_cast<uint64_t*>(mem_.data());
  *word = 40;
  auto fill = [&](const wire::PacketHeaders& h) {
    h.atomic_eth()->set_va(mem_va());
    h.atomic_eth()->set_rkey(mem_mr_->rkey());
    h.atomic_eth()->set_swap_add(2);
  };
  inject(op::kRcFetchAdd, kRqPsn, {}, fill);
  inject(op::kRcFetchAdd, kRqPsn, {}, fill);
  EXPECT_EQ(*word, 42u);
  ASSERT_EQ(sent_count(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(sent(i).opcode(), op::kRcAtomicAck);
    EXPECT_EQ(sent(i).atomic_ack_eth()->orig_data(), 40u);
    EXPECT_EQ(sent(i).bth().psn(), kRqPsn);
  }
}

// IBA 9.4.5: COMPARE_SWAP swaps only on equality and returns the original value.
TEST_F(ResponderTest, CompareSwapSwapsOnlyOnEquality) {
  uint64_t* word = reinterpret_cast<uint64_t*>(mem_.data());
  *word = 7;
  auto cas = [&](uint64_t compare, uint64_t swap) {
    return [=, this](const wire::PacketHeaders& h) {
      h.atomic_eth()->set_va(mem_va());
      h.atomic_eth()->set_rkey(mem_mr_->rkey());
      h.atomic_eth()->set_compare(compare);
      h.atomic_eth()->set_swap_add(swap);
    };
  };
  inject(op::kRcCompareSwap, kRqPsn, {}, cas(8, 100));
  EXPECT_EQ(*word, 7u);
  inject(op::kRcCompareSwap, kRqPsn + 1, {}, cas(7, 100));
  EXPECT_EQ(*word, 100u);
  EXPECT_EQ(sent(0).atomic_ack_eth()->orig_data(), 7u);
  EXPECT_EQ(sent(1).atomic_ack_eth()->orig_data(), 7u);
}

// IBA 9.4.5: an atomic at an address that is not 8-byte aligned → Invalid Request.
TEST_F(ResponderTest, MisalignedAtomicIsInvalidRequest) {
  inject(op::kRcFetchAdd, kRqPsn, {}, [&](const wire::PacketHeaders& h) {
    h.atomic_eth()->set_va(mem_va(4));
    h.atomic_eth()->set_rkey(mem_mr_->rkey());
    h.atomic_eth()->set_swap_add(1);
  });
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
}

// SEND with Invalidate (IBA 10.6.7.2.x): a bound type 2 window named by the IETH is
// invalidated and the completion reports it.
TEST_F(ResponderTest, SendWithInvalidateInvalidatesWindow) {
  auto* mw = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
  provider::MwBindOp bind{.mw_handle = mw->handle(),
                          .new_rkey = 0x42,
                          .mr_handle = mem_mr_->handle(),
                          .addr = mem_va(),
                          .length = 64,
                          .access = IBV_ACCESS_REMOTE_WRITE};
  {
    const provider::EngineTurnMark turn;  // the bind a requester's turn would make
    ASSERT_EQ(dev_.mr_table().bind_mw_st(pd_, qp_->qp_num(), bind).error(), 0);
  }
  const uint32_t rkey = mw->rkey();
  post_recv_buf(5);
  inject(op::kRcSendOnlyInv, kRqPsn, std::vector<uint8_t>{1},
         [&](const wire::PacketHeaders& h) { h.ieth()->set_rkey(rkey); });
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(wcs[0].invalidated_rkey, rkey);
  EXPECT_FALSE(mw->bound());
  // The window no longer grants access.
  inject(op::kRcWriteOnly, kRqPsn + 1, std::vector<uint8_t>(4, 1), reth(mem_va(), rkey, 4));
  expect_nak(1, wire::NakCode::kRemoteAccessError, kRqPsn + 1);
}

// A UC QP (IBA 9.8.3): a request the responder refuses is dropped without a NAK. Those the
// R_Key check refuses (IBA 9.7.5.2.8 / 10.6.7: key, PD, right, bounds, window state, QP) are
// counted in drop_uc_access, apart from the other refusals (drop_uc_invalid): UC gives a peer
// guessing keys no NAK to pay for a wrong guess, so the counter is where guessing shows.
class UcResponderTest : public ProtocolTest {
 protected:
  void SetUp() override {
    QpParams p;
    p.type = IBV_QPT_UC;
    make_qp(p);
    mem_.assign(8192, 0xAA);
    mem_mr_ = reg(mem_.data(), mem_.size(),
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
  }
  uint64_t mem_va(size_t off = 0) { return reinterpret_cast<uint64_t>(mem_.data()) + off; }
  bool untouched(size_t from = 0) const {
    return std::all_of(mem_.begin() + static_cast<ptrdiff_t>(from), mem_.end(),
                       [](uint8_t b) { return b == 0xAA; });
  }
  // A WRITE Only of 16 bytes of 0x55 at the next PSN.
  void write_only(uint64_t va, uint32_t rkey) {
    inject(op::kUcWriteOnly, psn_++, std::vector<uint8_t>(16, 0x55), reth(va, rkey, 16));
  }

  std::vector<uint8_t> mem_;
  provider::Mr* mem_mr_ = nullptr;
  uint32_t psn_ = kRqPsn;
};

// Wrong keys — another key byte, two other tags, the key 0 — write nothing, send nothing,
// complete nothing, leave the QP in RTS and count in drop_uc_access alone; a WRITE with the
// right key then lands.
TEST_F(UcResponderTest, WritesWithWrongRkeysAreDroppedAndCounted) {
  const uint32_t rkey = mem_mr_->rkey();
  for (uint32_t bad : {rkey ^ 0x01u, rkey ^ 0x100u, rkey ^ 0x80000000u, 0u})
    write_only(mem_va(), bad);
  EXPECT_EQ(engine_.counters().drop_uc_access, 4u);
  EXPECT_EQ(engine_.counters().drop_uc_invalid, 0u);
  EXPECT_EQ(engine_.counters().drops(), 4u);
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_TRUE(untouched());
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  write_only(mem_va(), rkey);
  EXPECT_EQ(mem_[0], 0x55);
  EXPECT_TRUE(untouched(16));
  EXPECT_EQ(engine_.counters().drop_uc_access, 4u);
  EXPECT_EQ(sent_count(), 0u);
}

// Every kind of R_Key refusal counts as an access error: another PD's region, a region without
// REMOTE_WRITE, a range past the region's end, an unbound window, a type 2B window bound to
// another QP (IBA 10.6.7.2.2), and a region deregistered between two packets of one WRITE. A
// refusal that is not the R_Key's (a DMA length the payload does not match) stays in
// drop_uc_invalid.
TEST_F(UcResponderTest, EveryKindOfRkeyRefusalIsAnAccessError) {
  provider::Pd* other_pd = dev_.alloc_pd().value();
  std::vector<uint8_t> foreign(64, 0xAA);
  provider::Mr* foreign_mr = dev_.reg_mr(other_pd, foreign.data(), foreign.size(),
                                         reinterpret_cast<uint64_t>(foreign.data()),
                                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                                 .value();
  write_only(reinterpret_cast<uint64_t>(foreign.data()), foreign_mr->rkey());  // wrong PD
  std::vector<uint8_t> read_only(64, 0xAA);
  provider::Mr* ro_mr = reg(read_only.data(), read_only.size(), IBV_ACCESS_REMOTE_READ);
  write_only(reinterpret_cast<uint64_t>(read_only.data()), ro_mr->rkey());  // no REMOTE_WRITE
  write_only(mem_va(mem_.size() - 8), mem_mr_->rkey());                     // out of bounds
  provider::Mw* unbound = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
  write_only(mem_va(), unbound->rkey());  // a window not bound
  provider::Mw* elsewhere = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
  const provider::MwBindOp bind{.mw_handle = elsewhere->handle(),
                                .new_rkey = elsewhere->rkey() + 1,
                                .mr_handle = mem_mr_->handle(),
                                .addr = mem_va(),
                                .length = 64,
                                .access = IBV_ACCESS_REMOTE_WRITE};
  {
    const provider::EngineTurnMark turn;  // the bind a requester's turn would make
    ASSERT_EQ(dev_.mr_table().bind_mw_st(pd_, qp_->qp_num() + 1, bind).error(), 0);
  }
  write_only(mem_va(), elsewhere->rkey());  // a 2B window of another QP
  EXPECT_EQ(engine_.counters().drop_uc_access, 5u);
  EXPECT_TRUE(untouched());
  EXPECT_TRUE(std::all_of(foreign.begin(), foreign.end(), [](uint8_t b) { return b == 0xAA; }));
  EXPECT_TRUE(std::all_of(read_only.begin(), read_only.end(), [](uint8_t b) { return b == 0xAA; }));

  // A DMA length the WRITE Only's payload does not match is no R_Key refusal.
  inject(op::kUcWriteOnly, psn_++, std::vector<uint8_t>(16, 0x55),
         reth(mem_va(), mem_mr_->rkey(), 32));
  EXPECT_EQ(engine_.counters().drop_uc_invalid, 1u);
  EXPECT_EQ(engine_.counters().drop_uc_access, 5u);

  // Each packet's piece is checked again (IBA 10.6.7): after the deregistration the Last is
  // refused and writes nothing.
  ASSERT_EQ(dev_.dealloc_mw(elsewhere).error(), 0);
  const uint32_t mtu = 1024;  // QpParams' path MTU
  inject(op::kUcWriteFirst, psn_++, std::vector<uint8_t>(mtu, 1),
         reth(mem_va(), mem_mr_->rkey(), 2 * mtu));
  EXPECT_EQ(mem_[0], 1);
  ASSERT_EQ(dev_.dereg_mr(mem_mr_).error(), 0);
  inject(op::kUcWriteLast, psn_++, std::vector<uint8_t>(mtu, 2));
  EXPECT_EQ(engine_.counters().drop_uc_access, 6u);
  EXPECT_TRUE(untouched(mtu));
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

}  // namespace
}  // namespace urdma::engine::testing
