// What happens after an error: the flush rule of IBA 10.3.1.6 (every WQE after a failed one
// completes with WR_FLUSH_ERR, even a local operation the requester already executed ahead of
// the failure), CQ overflow as a QP error (IBA 11.4.2.1), and the engine's active list (a QP
// with nothing to do is not served).
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "protocol_test_util.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;
constexpr uint32_t kSqPsn = 0x100;  // QpParams default sq_psn
constexpr uint32_t kRqPsn = 0x200;  // QpParams default rq_psn

class ErrorFlushTest : public ProtocolTest {
 protected:
  void post(ibv_send_wr wr) {
    ASSERT_EQ(post_send(qp_, wr), 0);
    engine_.poll();
  }
  void ack(uint32_t psn, uint8_t syndrome = wire::make_ack(wire::kAethCreditsInvalid)) {
    inject(op::kRcAck, psn, {},
           [=](const wire::PacketHeaders& h) { h.aeth()->set_syndrome(syndrome); });
  }
  // A type 2 window over `buf`, and a BIND_MW WR for it.
  ibv_send_wr bind_wr(uint64_t wr_id, std::vector<uint8_t>& buf) {
    mr_ = reg(buf.data(), buf.size(),
              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
    mw_ = dev_.alloc_mw(pd_, IBV_MW_TYPE_2).value();
    verbs_mw_.handle = mw_->handle();
    verbs_mr_.handle = mr_->handle();
    ibv_send_wr wr = send_wr(wr_id, IBV_WR_BIND_MW, nullptr, 0);
    wr.bind_mw.mw = &verbs_mw_;
    wr.bind_mw.rkey = (mw_->rkey() & ~0xFFu) | 0x5A;
    wr.bind_mw.bind_info.mr = &verbs_mr_;
    wr.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(buf.data());
    wr.bind_mw.bind_info.length = 64;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    return wr;
  }
  // Posts SEND (on the wire, unacknowledged), then BIND_MW and LOCAL_INV of that window, which
  // the requester executes at once, ahead of the SEND's outcome.
  void send_then_local_ops(std::vector<uint8_t>& buf) {
    post(send_wr(1, IBV_WR_SEND, nullptr, 0));
    ASSERT_EQ(sent_count(), 1u);
    post(bind_wr(2, buf));
    EXPECT_TRUE(mw_->bound());  // executed...
    ibv_send_wr inv = send_wr(3, IBV_WR_LOCAL_INV, nullptr, 0);
    inv.invalidate_rkey = mw_->rkey();
    post(inv);
    EXPECT_FALSE(mw_->bound());
    post(send_wr(4, IBV_WR_SEND, nullptr, 0, 0));  // unsignaled, never sent before the error
    EXPECT_TRUE(cqes().empty());                   // ...but nothing completes before the SEND
  }
  void expect_failed_then_flushed(ibv_wc_status first) {
    const auto wcs = cqes();
    ASSERT_EQ(wcs.size(), 4u);
    EXPECT_EQ(wcs[0].wr_id, 1u);
    EXPECT_EQ(wcs[0].status, first);
    // IBA 10.3.1.6 (Error state): every WR after the failed one completes with a flush error,
    // BIND_MW and LOCAL_INV included although they already took effect, unsignaled WRs too.
    for (size_t i = 1; i < 4; ++i) {
      EXPECT_EQ(wcs[i].wr_id, i + 1);
      EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << "wr_id " << wcs[i].wr_id;
    }
    EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  }
  std::vector<provider::AsyncEvent> events() {
    std::vector<provider::AsyncEvent> out;
    while (auto e = dev_.async_events().try_pop()) out.push_back(*e);
    return out;
  }
  size_t count_events(const std::vector<provider::AsyncEvent>& evs, ibv_event_type type,
                      const provider::Qp* qp) {
    size_t n = 0;
    for (const auto& e : evs) n += e.type == type && (qp == nullptr || e.qp == qp);
    return n;
  }

  provider::Mr* mr_ = nullptr;
  provider::Mw* mw_ = nullptr;
  ibv_mw verbs_mw_ = {};
  ibv_mr verbs_mr_ = {};
};

TEST_F(ErrorFlushTest, LocalOpsExecutedAheadOfARemoteAccessErrorAreFlushed) {
  make_qp();
  std::vector<uint8_t> buf(64);
  send_then_local_ops(buf);
  ack(kSqPsn, wire::make_nak(wire::NakCode::kRemoteAccessError));
  expect_failed_then_flushed(IBV_WC_REM_ACCESS_ERR);
}

TEST_F(ErrorFlushTest, LocalOpsExecutedAheadOfRetryExceededAreFlushed) {
  QpParams p;
  p.retry_cnt = 0;
  make_qp(p);
  std::vector<uint8_t> buf(64);
  send_then_local_ops(buf);
  clock_.advance(kAckTimeoutBaseNs << p.timeout);  // no ACK: the partition case
  engine_.poll();
  expect_failed_then_flushed(IBV_WC_RETRY_EXC_ERR);
}

// IBA 11.4.2.1 (CQ overrun) on the send side: the completion that does not fit is lost, its QP
// enters ERR with IBV_EVENT_QP_FATAL (the CQ raises CQ_ERR), and the QP's receive queue is
// flushed to its (roomy) receive CQ.
TEST_F(ErrorFlushTest, SendCqOverflowMovesTheQpToError) {
  send_cq_ = dev_.create_cq(2).value();
  make_qp();
  const uint32_t room = send_cq_->cqe();
  for (uint32_t i = 0; i <= room; ++i) post(send_wr(i, IBV_WR_SEND, nullptr, 0));
  ibv_sge none{};
  ASSERT_EQ(post_recv(qp_, 100, none), 0);
  engine_.poll();
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  ack(kSqPsn + room);  // every SEND done: room + 1 completions for `room` slots
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(engine_.counters().cqe_overflow, 1u);
  const auto evs = events();
  EXPECT_EQ(count_events(evs, IBV_EVENT_QP_FATAL, qp_), 1u);
  EXPECT_EQ(count_events(evs, IBV_EVENT_CQ_ERR, nullptr), 1u);
  std::vector<ibv_wc> sent_wcs(room + 1);
  ASSERT_EQ(send_cq_->poll(static_cast<int>(room + 1), sent_wcs.data()), static_cast<int>(room));
  const auto recv_wcs = cqes();
  ASSERT_EQ(recv_wcs.size(), 1u);
  EXPECT_EQ(recv_wcs[0].wr_id, 100u);
  EXPECT_EQ(recv_wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(engine_.next_deadline_ns(), net::kNever);  // nothing left to do
}

// The responder side: the receive completion that does not fit is lost, the QP enters ERR with
// QP_FATAL, and that SEND is NOT acknowledged (the requester must not take it as delivered).
TEST_F(ErrorFlushTest, ReceiveCqOverflowMovesTheQpToErrorWithoutAck) {
  recv_cq_ = dev_.create_cq(2).value();
  make_qp();
  const uint32_t room = recv_cq_->cqe();
  std::vector<uint8_t> buf(64);
  auto* mr = reg(buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  for (uint32_t i = 0; i <= room; ++i) ASSERT_EQ(post_recv(qp_, i, sge(buf.data(), 64, mr)), 0);
  const uint8_t msg[4] = {1, 2, 3, 4};
  for (uint32_t i = 0; i < room; ++i) inject(op::kRcSendOnly, kRqPsn + i, msg);
  ASSERT_EQ(sent_count(), room);  // one ACK each
  EXPECT_EQ(qp_->state(), IBV_QPS_RTS);
  inject(op::kRcSendOnly, kRqPsn + room, msg);
  EXPECT_EQ(sent_count(), room);  // no ACK for the lost one
  EXPECT_EQ(qp_->state(), IBV_QPS_ERR);
  EXPECT_EQ(count_events(events(), IBV_EVENT_QP_FATAL, qp_), 1u);
  EXPECT_EQ(engine_.counters().cqe_overflow, 1u);
}

// The active list: after a QP's work is done and no timer is armed, poll() no longer serves it;
// a doorbell, a packet or an armed timer puts it back.
TEST_F(ErrorFlushTest, IdleQpLeavesTheActiveList) {
  make_qp();
  const QpContext* ctx = engine_.context(qp_->qp_num());
  ASSERT_NE(ctx, nullptr);
  engine_.poll();
  EXPECT_FALSE(ctx->active);  // connected, nothing posted
  EXPECT_EQ(engine_.next_deadline_ns(), net::kNever);
  ASSERT_EQ(post_send(qp_, send_wr(1, IBV_WR_SEND, nullptr, 0)), 0);
  EXPECT_EQ(engine_.next_deadline_ns(), 0u);  // the doorbell
  engine_.poll();
  EXPECT_EQ(sent_count(), 1u);
  EXPECT_TRUE(ctx->active);  // waits for the ACK: its retry timer is armed
  EXPECT_EQ(engine_.next_deadline_ns(), clock_.now_ns() + (kAckTimeoutBaseNs << params_.timeout));
  ack(kSqPsn);
  EXPECT_FALSE(ctx->active);
  EXPECT_EQ(cqes().size(), 1u);
  EXPECT_EQ(engine_.next_deadline_ns(), net::kNever);
  // A request from the peer is handled whether or not the QP is on the list.
  std::vector<uint8_t> buf(16);
  auto* mr = reg(buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qp_, 9, sge(buf.data(), 16, mr)), 0);
  engine_.poll();
  EXPECT_FALSE(ctx->active);  // a posted receive gives the requester nothing to do
  const uint8_t msg[3] = {7, 8, 9};
  inject(op::kRcSendOnly, kRqPsn, msg);
  EXPECT_EQ(sent_count(), 2u);  // its ACK
  EXPECT_FALSE(ctx->active);
  EXPECT_EQ(buf[2], 9u);
}

}  // namespace
}  // namespace urdma::engine::testing
