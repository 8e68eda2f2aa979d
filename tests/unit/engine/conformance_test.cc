// Transport conformance (issue 6, "engine behaviour"): each test pins one rule of the IBA or of
// Linux rxe's behaviour where the engine used to differ, with hand-built packets (eRPC
// protocol-test style). Each names the rule and, where the spec leaves room, the rxe state.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "protocol_test_util.h"
#include "wire/grh.h"
#include "wire/psn.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;
constexpr uint32_t kSqPsn = 0x100;  // QpParams default sq_psn: our first request PSN
constexpr uint32_t kRqPsn = 0x200;  // QpParams default rq_psn: the first PSN we expect

class ConformanceTest : public ProtocolTest {
 protected:
  void setup_memory(size_t bytes = 8192) {
    recv_buf_.assign(4096, 0);
    recv_mr_ = reg(recv_buf_.data(), recv_buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    mem_.assign(bytes, 0);
    for (size_t i = 0; i < mem_.size(); ++i) mem_[i] = static_cast<uint8_t>(i * 7 + (i >> 10));
    mem_mr_ = reg(mem_.data(), mem_.size(),
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
  }
  void post_recv_buf(uint64_t wr_id, uint32_t len = 4096) {
    ASSERT_EQ(post_recv(qp_, wr_id, sge(recv_buf_.data(), len, recv_mr_)), 0);
  }
  HeaderFill fetch_add(uint64_t va, uint32_t rkey, uint64_t add) {
    return [=](const wire::PacketHeaders& h) {
      h.atomic_eth()->set_va(va);
      h.atomic_eth()->set_rkey(rkey);
      h.atomic_eth()->set_swap_add(add);
    };
  }
  uint64_t mem_va(size_t off = 0) { return reinterpret_cast<uint64_t>(mem_.data()) + off; }
  void post(ibv_send_wr wr) {
    ASSERT_EQ(post_send(qp_, wr), 0);
    engine_.poll();
  }
  void post_read(uint64_t wr_id, uint32_t len) {
    ibv_sge s = sge(mem_.data(), len, mem_mr_);
    ibv_send_wr wr = send_wr(wr_id, IBV_WR_RDMA_READ, &s);
    wr.wr.rdma.remote_addr = 0x1000;
    wr.wr.rdma.rkey = 0x77;
    post(wr);
  }
  void post_send_len(uint64_t wr_id, uint32_t len) {
    ibv_sge s = sge(mem_.data(), len, mem_mr_);
    post(send_wr(wr_id, IBV_WR_SEND, &s));
  }
  void ack(uint32_t psn) {
    inject(op::kRcAck, psn, {}, [](const wire::PacketHeaders& h) {
      h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
    });
  }

  std::vector<uint8_t> recv_buf_;
  std::vector<uint8_t> mem_;
  provider::Mr* recv_mr_ = nullptr;
  provider::Mr* mem_mr_ = nullptr;
};

// ---- Responder ------------------------------------------------------------------------------

// IBA 9.7.5.2.x (C9-148): the MSN counts an RDMA READ before its responses are sent, so the
// first response carries the new MSN — rxe does the same, and tests/data/rxe-to-rxe.pcap shows
// it (ACK MSN 4, then the READ response MSN 5).
TEST_F(ConformanceTest, ReadResponseCarriesTheIncrementedMsn) {
  make_qp();
  setup_memory();
  post_recv_buf(1);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{1});
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(sent(0).aeth()->msn(), 1u);
  inject(op::kRcReadRequest, kRqPsn + 1, {}, reth(mem_va(), mem_mr_->rkey(), 2048));
  ASSERT_EQ(sent_count(), 3u);
  EXPECT_EQ(sent(1).opcode(), op::kRcReadResponseFirst);
  EXPECT_EQ(sent(1).aeth()->msn(), 2u);
  EXPECT_EQ(sent(2).opcode(), op::kRcReadResponseLast);
  EXPECT_EQ(sent(2).aeth()->msn(), 2u);
  // The next message counts on from there.
  post_recv_buf(2);
  inject(op::kRcSendOnly, kRqPsn + 3, std::vector<uint8_t>{1});
  EXPECT_EQ(sent(3).aeth()->msn(), 3u);
}

// IBA 9.7.5.2.2 (C9-105): a duplicate SEND or WRITE is acknowledged whether or not it asks for
// an ACK — the first ACK may have been coalesced away or lost (rxe_resp.c duplicate_request).
TEST_F(ConformanceTest, DuplicateSendAndWriteAreAckedWithoutAckReq) {
  make_qp();
  setup_memory();
  post_recv_buf(1);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{1}, {}, /*ack_req=*/false);
  inject(op::kRcWriteOnly, kRqPsn + 1, std::vector<uint8_t>(8, 2),
         reth(mem_va(), mem_mr_->rkey(), 8),
         /*ack_req=*/false);
  ASSERT_EQ(sent_count(), 0u);
  inject(op::kRcSendOnly, kRqPsn, std::vector<uint8_t>{1}, {}, /*ack_req=*/false);
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_TRUE(sent(0).aeth()->is_ack());
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + 1);  // the last PSN received, as rxe (ack_psn − 1)
  inject(op::kRcWriteOnly, kRqPsn + 1, std::vector<uint8_t>(8, 2),
         reth(mem_va(), mem_mr_->rkey(), 8), /*ack_req=*/false);
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_TRUE(sent(1).aeth()->is_ack());
  EXPECT_EQ(engine_.counters().duplicate_request, 2u);
  EXPECT_EQ(cqes().size(), 1u);  // delivered once
}

// rxe_resp.c RESPST_ERR_INVALIDATE_RKEY (class J): a SEND with Invalidate whose R_Key cannot be
// invalidated completes its receive WQE with REM_INV_REQ_ERR at once (not a later flush), the
// QP enters ERR, and the requester gets what rxe sends it: an ACK (AckReq set), no NAK.
TEST_F(ConformanceTest, SendWithInvalidateFailureCompletesWithRemInvReqErr) {
  make_qp();
  setup_memory();
  post_recv_buf(7);
  post_recv_buf(8);
  inject(op::kRcSendOnlyInv, kRqPsn, std::vector<uint8_t>{1, 2, 3},
         [](const wire::PacketHeaders& h) { h.ieth()->set_rkey(0x12345678); });
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_TRUE(sent(0).aeth()->is_ack());
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn);
  EXPECT_EQ(sent(0).aeth()->msn(), 0u);  // the message was not counted (rxe execute())
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(wcs[1].wr_id, 8u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
}

// rxe_resp.c check_resource → RESPST_ERR_TOO_MANY_RDMA_ATM_REQ (class C): with
// max_dest_rd_atomic 0 the responder has no resource for a READ or ATOMIC — NAK Invalid
// Request, nothing executed, QP → ERR.
TEST_F(ConformanceTest, ZeroMaxDestRdAtomicNaksRead) {
  QpParams p;
  p.max_dest_rd_atomic = 0;
  make_qp(p);
  setup_memory();
  inject(op::kRcReadRequest, kRqPsn, {}, reth(mem_va(), mem_mr_->rkey(), 64));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

TEST_F(ConformanceTest, ZeroMaxDestRdAtomicNaksAtomic) {
  QpParams p;
  p.max_dest_rd_atomic = 0;
  make_qp(p);
  setup_memory();
  uint64_t* word = reinterpret_cast<uint64_t*>(mem_.data());
  *word = 40;
  inject(op::kRcFetchAdd, kRqPsn, {}, fetch_add(mem_va(), mem_mr_->rkey(), 2));
  ASSERT_EQ(sent_count(), 1u);
  expect_nak(0, wire::NakCode::kInvalidRequest, kRqPsn);
  EXPECT_EQ(*word, 40u);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
}

// IBA 11.4.2 (a UD QP may drop what it cannot place); rxe_resp.c check_length →
// RESPST_ERR_LENGTH, class D for UD without an SRQ: a datagram longer than the receive buffer
// is dropped and counted, nothing is written or completed, the receive WQE is not consumed —
// the next datagram that fits takes it — and the QP keeps working.
TEST_F(ConformanceTest, UdDatagramLongerThanReceiveBufferIsDroppedAndTheWqeKept) {
  QpParams p;
  p.type = IBV_QPT_UD;
  make_qp(p);
  setup_memory();
  constexpr uint32_t kRecvBytes = wire::Grh::kSize + 16;
  post_recv_buf(1, kRecvBytes);
  post_recv_buf(2, kRecvBytes);
  auto ud = [&](size_t len) {
    inject(op::kUdSendOnly, 0, std::vector<uint8_t>(len, 0x5A), [&](const wire::PacketHeaders& h) {
      h.deth()->set_qkey(params_.qkey);
      h.deth()->set_src_qp(kPeerQpn);
    });
  };
  ud(17);
  EXPECT_EQ(engine_.counters().drop_ud_recv_length, 1u);
  EXPECT_TRUE(cqes().empty());
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  for (uint8_t b : recv_buf_) ASSERT_EQ(b, 0) << "nothing placed";
  ud(16);
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 1u);  // the WQE the oversized datagram did not consume
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, kRecvBytes);
  EXPECT_EQ(recv_buf_[wire::Grh::kSize], 0x5A);
  ud(16);
  wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
}

// The same on an SRQ: a WQE taken from a shared queue cannot be handed back, so it completes
// with REM_INV_REQ_ERR (rxe class E) and the QP keeps working.
TEST_F(ConformanceTest, UdDatagramLongerThanSrqBufferCompletesTheWqeInError) {
  setup_memory();
  ibv_srq_attr srq_attr = {};
  srq_attr.max_wr = 8;
  srq_attr.max_sge = 1;
  auto* srq = dev_.create_srq(pd_, srq_attr).value();
  QpParams p;
  p.type = IBV_QPT_UD;
  p.srq = srq;
  make_qp(p);
  ibv_sge s = sge(recv_buf_.data(), wire::Grh::kSize + 16, recv_mr_);
  ibv_recv_wr wr = {};
  wr.wr_id = 9;
  wr.sg_list = &s;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(srq->post_recv(&wr, &bad).error(), 0);
  inject(op::kUdSendOnly, 0, std::vector<uint8_t>(64, 1), [&](const wire::PacketHeaders& h) {
    h.deth()->set_qkey(params_.qkey);
    h.deth()->set_src_qp(kPeerQpn);
  });
  EXPECT_EQ(engine_.counters().drop_ud_recv_length, 1u);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

// ---- Requester -----------------------------------------------------------------------------

// max_rd_atomic 0 is not silently 1: as in rxe (rxe_req.c check_init_depth with an initiator
// depth of 0) a READ never gets a slot, so it — and the send queue behind it — waits, sending
// nothing and arming no timer, until the QP is flushed.
TEST_F(ConformanceTest, ZeroMaxRdAtomicHoldsTheRead) {
  QpParams p;
  p.max_rd_atomic = 0;
  make_qp(p);
  setup_memory();
  post_read(1, 64);
  post_send_len(2, 16);
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_EQ(engine_.next_deadline_ns(), net::kNever);
  advance(uint64_t{1} << 40);
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_TRUE(cqes().empty());
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(qp_->modify(a, IBV_QP_STATE).error(), 0);
  engine_.poll();
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wcs[1].wr_id, 2u);
}

// RC flow control (EngineConfig::max_unacked_pkts = 128, rxe's RXE_MAX_UNACKED_PSNS): a deep
// send queue never has more than 128 PSNs unacknowledged — here across the 24-bit wrap — and
// each ACK opens the window by what it acknowledges.
TEST_F(ConformanceTest, UnackedPacketsAreCappedAcrossThePsnWrap) {
  QpParams p;
  p.sq_psn = 0xFFFFC0;  // 64 PSNs before the wrap
  make_qp(p);
  setup_memory(60 * 1024);
  for (uint64_t id = 1; id <= 3; ++id) post_send_len(id, 60 * 1024);  // 3 × 60 packets
  const uint32_t cap = EngineConfig{}.max_unacked_pkts;
  ASSERT_EQ(cap, 128u);
  ASSERT_EQ(sent_count(), cap);
  for (uint32_t i = 0; i < cap; ++i)
    ASSERT_EQ(sent(i).bth().psn(), wire::psn_add(p.sq_psn, i)) << i;
  EXPECT_EQ(sent(cap - 1).bth().psn(), 0x3Fu);             // wrapped
  EXPECT_GT(engine_.next_deadline_ns(), clock_.now_ns());  // waiting, not busy
  advance(1000);
  EXPECT_EQ(sent_count(), cap);
  // ACK the first 10 PSNs: 10 more go out, the window stays full.
  ack(wire::psn_add(p.sq_psn, 9));
  ASSERT_EQ(sent_count(), cap + 10);
  EXPECT_EQ(sent(cap + 9).bth().psn(), wire::psn_add(p.sq_psn, cap + 9));
  const QpContext* ctx = engine_.context(qp_->qp_num());
  EXPECT_EQ(wire::psn_diff(ctx->req.next_psn, ctx->comp.psn), static_cast<int32_t>(cap));
  // ACK everything sent: the rest (42 packets) goes.
  ack(wire::psn_add(p.sq_psn, cap + 9));
  ASSERT_EQ(sent_count(), 180u);
  ack(wire::psn_add(p.sq_psn, 179));
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 3u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// A READ takes all its response PSNs at once; one that would push the window past the cap
// waits until it is under the cap, then goes whole.
TEST_F(ConformanceTest, ReadCountsItsResponsePsnsAgainstTheWindow) {
  make_qp();
  setup_memory(200 * 1024);
  post_send_len(1, 100 * 1024);  // 100 PSNs
  post_read(2, 200 * 1024);      // 200 response PSNs
  post_send_len(3, 1);
  ASSERT_EQ(sent_count(), 101u);  // the SEND, then the READ (100 < 128 outstanding)
  EXPECT_EQ(sent(100).opcode(), op::kRcReadRequest);
  EXPECT_EQ(sent(100).bth().psn(), kSqPsn + 100);
  // 300 PSNs outstanding: the SEND behind the READ waits for the window.
  advance(1000);
  EXPECT_EQ(sent_count(), 101u);
}

// rxe_comp.c check_psn → COMPST_ERROR_RETRY: an ACK for a request after an outstanding READ
// means the responder has answered the READ (it answers in PSN order), so the response was
// lost: the READ is requested again at once, not after the local ACK timeout — once per gap.
TEST_F(ConformanceTest, AckBeyondAnUnansweredReadRequestsItAgainAtOnce) {
  make_qp();
  setup_memory();
  post_read(1, 2048);    // PSNs kSqPsn, kSqPsn + 1
  post_send_len(2, 16);  // PSN kSqPsn + 2
  ASSERT_EQ(sent_count(), 2u);
  clear_sent();
  ack(kSqPsn + 2);
  ASSERT_EQ(sent_count(), 2u) << "READ and SEND resent without waiting for the timer";
  EXPECT_EQ(sent(0).opcode(), op::kRcReadRequest);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn);
  EXPECT_EQ(sent(0).reth()->dma_length(), 2048u);
  EXPECT_EQ(engine_.counters().completer_retry_err, 1u);
  EXPECT_TRUE(cqes().empty());  // the SEND completes only after the READ
  ack(kSqPsn + 2);              // the same gap: no second request
  EXPECT_EQ(sent_count(), 2u);
  const std::vector<uint8_t> a(1024, 1), b(1024, 2);
  inject(op::kRcReadResponseFirst, kSqPsn, a, [](const wire::PacketHeaders& h) {
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  });
  inject(op::kRcReadResponseLast, kSqPsn + 1, b, [](const wire::PacketHeaders& h) {
    h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
  });
  ack(kSqPsn + 2);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(mem_[1024], 2);
}

// The same for an ATOMIC whose ATOMIC ACK was lost: it is sent again (the responder answers the
// duplicate from its saved result).
TEST_F(ConformanceTest, AckBeyondAnUnansweredAtomicRequestsItAgainAtOnce) {
  make_qp();
  setup_memory();
  ibv_sge s = sge(mem_.data(), 8, mem_mr_);
  ibv_send_wr wr = send_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &s);
  wr.wr.atomic.remote_addr = 0x1000;
  wr.wr.atomic.rkey = 0x77;
  wr.wr.atomic.compare_add = 1;
  post(wr);
  post_send_len(2, 16);
  ASSERT_EQ(sent_count(), 2u);
  clear_sent();
  ack(kSqPsn + 1);
  ASSERT_GE(sent_count(), 1u);
  EXPECT_EQ(sent(0).opcode(), op::kRcFetchAdd);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn);
}

// Two ATOMICs in flight and the first one's ATOMIC ACK lost: the second one's ACK proves the
// responder answered the first (it answers in PSN order), so the first is sent again at once —
// not one local ACK timeout later, which under 1% loss made ib_atomic_bw crawl (~150 ops/s with
// a 268 ms timeout). Each ATOMIC then completes once with its own original value.
TEST_F(ConformanceTest, AtomicAckBeyondAnUnansweredAtomicRequestsItAgainAtOnce) {
  make_qp();
  setup_memory();
  ibv_sge s1 = sge(mem_.data(), 8, mem_mr_);
  ibv_sge s2 = sge(mem_.data() + 8, 8, mem_mr_);
  for (uint64_t id : {1u, 2u}) {
    ibv_send_wr wr = send_wr(id, IBV_WR_ATOMIC_FETCH_AND_ADD, id == 1 ? &s1 : &s2);
    wr.wr.atomic.remote_addr = 0x1000;
    wr.wr.atomic.rkey = 0x77;
    wr.wr.atomic.compare_add = 1;
    post(wr);
  }
  ASSERT_EQ(sent_count(), 2u);
  clear_sent();
  const auto atomic_ack = [&](uint32_t psn, uint64_t orig) {
    inject(op::kRcAtomicAck, psn, {}, [=](const wire::PacketHeaders& h) {
      h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
      h.atomic_ack_eth()->set_orig_data(orig);
    });
  };
  atomic_ack(kSqPsn + 1, 41);  // the second's; the first's was lost
  ASSERT_GE(sent_count(), 1u) << "the first ATOMIC waits for the ACK timeout";
  EXPECT_EQ(sent(0).opcode(), op::kRcFetchAdd);
  EXPECT_EQ(sent(0).bth().psn(), kSqPsn);
  EXPECT_EQ(engine_.counters().completer_retry_err, 1u);
  EXPECT_TRUE(cqes().empty());
  const size_t after_first_gap = sent_count();
  atomic_ack(kSqPsn + 1, 41);  // the same gap again: no second request
  EXPECT_EQ(sent_count(), after_first_gap);
  // The responder answers the resent PSN from its saved result, then the second again.
  atomic_ack(kSqPsn, 40);
  atomic_ack(kSqPsn + 1, 41);
  const auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
  uint64_t v1, v2;
  std::memcpy(&v1, mem_.data(), 8);
  std::memcpy(&v2, mem_.data() + 8, 8);
  EXPECT_EQ(v1, 40u);
  EXPECT_EQ(v2, 41u);
}

// ---- Paced READ responses ------------------------------------------------------------------

class PacedReadTest : public ConformanceTest {
 protected:
  static constexpr uint32_t kPkts = 1024;  // a 1 MiB READ at PMTU 1024
  static constexpr uint32_t kTurn = 256;   // Engine::kMaxPacketsPerTurn
  void SetUp() override {
    make_qp();
    setup_memory(size_t{kPkts} * 1024);
  }
  void read_all() {
    inject(op::kRcReadRequest, kRqPsn, {}, reth(mem_va(), mem_mr_->rkey(), kPkts * 1024));
  }
  // Polls until the engine has nothing left to do now.
  void drain() {
    for (int i = 0; i < 100 && engine_.next_deadline_ns() <= clock_.now_ns(); ++i) engine_.poll();
  }
};

// A READ's responses are generated at most kMaxPacketsPerTurn per poll, with next_deadline_ns()
// at "now" while some are left; the expected PSN moves past the READ at once.
TEST_F(PacedReadTest, ResponsesArePacedPerTurn) {
  read_all();
  ASSERT_EQ(sent_count(), kTurn);
  EXPECT_EQ(sent(0).opcode(), op::kRcReadResponseFirst);
  EXPECT_EQ(engine_.context(qp_->qp_num())->resp.epsn, kRqPsn + kPkts);
  EXPECT_LE(engine_.next_deadline_ns(), clock_.now_ns());
  engine_.poll();
  EXPECT_EQ(sent_count(), 2 * kTurn);
  drain();
  ASSERT_EQ(sent_count(), kPkts);
  for (uint32_t i = 0; i < kPkts; ++i) ASSERT_EQ(sent(i).bth().psn(), kRqPsn + i);
  EXPECT_EQ(sent(kPkts - 1).opcode(), op::kRcReadResponseLast);
  EXPECT_EQ(0,
            std::memcmp(sent(kPkts - 1).payload().data(), mem_.data() + (kPkts - 1) * 1024, 1024));
  EXPECT_EQ(engine_.next_deadline_ns(), net::kNever);
}

// Requests after the READ wait until its last response is out: the ACK of a later SEND never
// overtakes READ responses (PSN order), and a later WRITE to the memory being read does not
// change what the READ returns (IBA 9.5 ordering; rxe works through its request queue in order).
TEST_F(PacedReadTest, LaterRequestsWaitBehindTheResponse) {
  post_recv_buf(1);
  read_all();
  inject(op::kRcWriteOnly, kRqPsn + kPkts, std::vector<uint8_t>(16, 0xEE),
         reth(mem_va(kPkts * 1024 - 16), mem_mr_->rkey(), 16), /*ack_req=*/false);
  inject(op::kRcSendOnly, kRqPsn + kPkts + 1, std::vector<uint8_t>{1});
  EXPECT_NE(mem_[kPkts * 1024 - 1], 0xEE) << "the WRITE waits for the READ";
  drain();
  ASSERT_EQ(sent_count(), kPkts + 1);
  for (uint32_t i = 0; i < kPkts; ++i) ASSERT_EQ(sent(i).bth().psn(), kRqPsn + i);
  const wire::PacketView last = sent(kPkts - 1);
  EXPECT_NE(last.payload()[1023], 0xEE) << "the READ returned the memory before the WRITE";
  EXPECT_EQ(mem_[kPkts * 1024 - 1], 0xEE);
  const wire::PacketView ack = sent(kPkts);
  EXPECT_EQ(ack.opcode(), op::kRcAck);
  EXPECT_EQ(ack.bth().psn(), kRqPsn + kPkts + 1);
  EXPECT_EQ(ack.aeth()->msn(), 3u);  // READ, WRITE, SEND
  EXPECT_EQ(cqes().size(), 1u);
}

// rxe_resp.c read_reply → rxe_recheck_mr: the region is looked up again for every packet sent
// later; once it is deregistered the response stops with NAK Remote Access Error (at the PSN
// it could not answer) and the QP enters ERR.
TEST_F(PacedReadTest, RegionDeregisteredMidResponseStopsIt) {
  read_all();
  ASSERT_EQ(sent_count(), kTurn);
  ASSERT_EQ(dev_.dereg_mr(mem_mr_).error(), 0);
  engine_.poll();
  ASSERT_EQ(sent_count(), kTurn + 1);
  expect_nak(kTurn, wire::NakCode::kRemoteAccessError, kRqPsn + kTurn);
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  drain();
  EXPECT_EQ(sent_count(), kTurn + 1);
}

// A duplicate of the READ being answered (the requester lost a response and asks again from
// there) restarts the response from the duplicate's PSN at once, instead of finishing the old
// run first (rxe replays from the duplicate's PSN, IBA 9.7.5.2.2).
TEST_F(PacedReadTest, DuplicateOfTheReadInProgressRestartsIt) {
  read_all();
  ASSERT_EQ(sent_count(), kTurn);
  clear_sent();
  constexpr uint32_t kFrom = 100;
  inject(op::kRcReadRequest, kRqPsn + kFrom, {},
         reth(mem_va(kFrom * 1024), mem_mr_->rkey(), (kPkts - kFrom) * 1024));
  ASSERT_EQ(sent_count(), kTurn);
  EXPECT_EQ(sent(0).bth().psn(), kRqPsn + kFrom);
  EXPECT_EQ(sent(0).opcode(), op::kRcReadResponseMiddle);  // continues the original's sequence
  EXPECT_EQ(0, std::memcmp(sent(0).payload().data(), mem_.data() + kFrom * 1024, 1024));
  drain();
  ASSERT_EQ(sent_count(), kPkts - kFrom);
  EXPECT_EQ(sent(kPkts - kFrom - 1).bth().psn(), kRqPsn + kPkts - 1);
  EXPECT_EQ(engine_.counters().duplicate_request, 1u);
}

// A duplicate READ from inside the original response that asks for nothing, or for fewer
// packets than are left, is no requester's resend: dropped (counted as a duplicate), nothing
// sent. (engine_fuzz found the zero-length one building an empty READ Response Last.)
TEST_F(PacedReadTest, MidResponseDuplicateOfTheWrongLengthIsDropped) {
  read_all();
  drain();
  ASSERT_EQ(sent_count(), kPkts);
  clear_sent();
  constexpr uint32_t kFrom = 100;
  inject(op::kRcReadRequest, kRqPsn + kFrom, {}, reth(mem_va(kFrom * 1024), mem_mr_->rkey(), 0));
  inject(op::kRcReadRequest, kRqPsn + kFrom, {},
         reth(mem_va(kFrom * 1024), mem_mr_->rkey(), (kPkts - kFrom - 1) * 1024));
  drain();
  EXPECT_EQ(sent_count(), 0u);
  EXPECT_EQ(engine_.counters().duplicate_request, 2u);
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
}

// One large READ does not starve another QP: while QP A's response is generated, QP B's send
// goes out in the very next poll, each QP served within its per-turn budget.
TEST_F(PacedReadTest, AnotherQpIsServedWhileAReadIsAnswered) {
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd_;
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.cap = cap_;
  provider::Qp* b = dev_.create_qp(init).value();
  connect(b, kPeer, kPeerQpn + 1, params_);
  read_all();
  ASSERT_EQ(sent_count(), kTurn);
  ibv_sge s = sge(mem_.data(), 16, mem_mr_);
  ASSERT_EQ(post_send(b, send_wr(1, IBV_WR_SEND, &s)), 0);
  engine_.poll();
  ASSERT_EQ(sent_count(), 2 * kTurn + 1);
  size_t sends = 0;
  for (size_t i = kTurn; i < sent_count(); ++i) {
    const wire::PacketView pkt = sent(i);
    if (pkt.opcode() == op::kRcSendOnly) {
      ++sends;
      EXPECT_EQ(pkt.bth().dest_qp(), kPeerQpn + 1);
    }
  }
  EXPECT_EQ(sends, 1u);
  EXPECT_LE(engine_.next_deadline_ns(), clock_.now_ns());  // A is not finished
}

}  // namespace
}  // namespace urdma::engine::testing
