// Tag matching on a TM-SRQ end to end (rdma-core's Documentation/tag_matching.md,
// ibv_post_srq_ops(3)): two engines over the simulated network, the sender an ordinary RC QP
// that puts TMH (and RVH) headers in its SENDs, the receiver an RC QP of a tag-matching SRQ.
// The assertions are on the receiver's completions (opcode, flags, wr_id, tag), on the bytes in
// its buffers (checksums) and on what reaches the sender (the rendezvous READ and FIN).
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "engine_test_util.h"
#include "support/checksum.h"
#include "wire/tm.h"

namespace urdma::engine::testing {
namespace {

constexpr uint64_t kDeadlineNs = 10'000'000'000;  // 10 s of virtual time
constexpr size_t kTmh = wire::Tmh::kSize;

class TagMatchingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<SimHost>(world_, net::Address::from_v4(10, 0, 0, 1));
    b_ = std::make_unique<SimHost>(world_, net::Address::from_v4(10, 0, 0, 2));
    ibv_srq_attr sattr = {};
    sattr.max_wr = 16;
    sattr.max_sge = 1;
    srq_ = b_->dev.create_srq(b_->pd, sattr, nullptr, nullptr, nullptr,
                              provider::SrqTmAttr{.max_num_tags = 8, .max_ops = 16, .cq = b_->cq})
               .value();
    QpParams pa;
    QpParams pb;
    pb.srq = srq_;
    std::swap(pb.sq_psn, pb.rq_psn);
    qa_ = a_->create_qp(pa);
    // The receiver posts no sends of its own (as rdma-core's test): the rendezvous READ and FIN
    // are the engine's.
    provider::QpInitAttr init;
    init.qp_type = IBV_QPT_RC;
    init.pd = b_->pd;
    init.send_cq = b_->cq;
    init.recv_cq = b_->cq;
    init.srq = srq_;
    init.cap = {0, 0, 0, 0, 0};
    qb_ = b_->dev.create_qp(init).value();
    connect(qa_, b_->addr, qb_->qp_num(), pa);
    connect(qb_, a_->addr, qa_->qp_num(), pb);
    send_buf_.resize(64 * 1024);
    recv_buf_.resize(64 * 1024);
    mr_a_ = a_->reg(send_buf_.data(), send_buf_.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    mr_b_ = b_->reg(recv_buf_.data(), recv_buf_.size(), IBV_ACCESS_LOCAL_WRITE);
  }

  // Every completion of `host` with its TM information, until there are `n`.
  std::vector<provider::Completion> wait(SimHost& host, size_t n) {
    std::vector<provider::Completion> got;
    const net::RunOutcome outcome = world_.run_until(
        [&] {
          provider::Completion c[16];
          const int k = host.cq->poll(16, c);
          got.insert(got.end(), c, c + k);
          return got.size() >= n;
        },
        world_.clock().now_ns() + kDeadlineNs);
    EXPECT_EQ(outcome, net::RunOutcome::kDone) << net::to_string(outcome);
    return got;
  }
  // Runs the world a while and returns what arrived (for "nothing more").
  std::vector<provider::Completion> settle(SimHost& host) {
    world_.run_until([] { return false; }, world_.clock().now_ns() + 50'000'000);
    std::vector<provider::Completion> got(64);
    got.resize(static_cast<size_t>(host.cq->poll(64, got.data())));
    return got;
  }

  int post_op(ibv_ops_wr wr) {
    ibv_ops_wr* bad = nullptr;
    return srq_->post_ops(&wr, &bad).error();
  }
  // TAG_ADD of recv_buf_[offset, offset + len), signaled, in sync with `unexpected`.
  uint32_t add_tag(uint64_t wr_id, uint64_t tag, uint64_t mask, size_t offset, uint32_t len,
                   uint32_t unexpected = 0, int flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC) {
    ibv_sge s = sge(recv_buf_.data() + offset, len, mr_b_);
    ibv_ops_wr wr = {};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_TAG_ADD;
    wr.flags = flags;
    wr.tm.unexpected_cnt = unexpected;
    wr.tm.add.recv_wr_id = wr_id;
    wr.tm.add.sg_list = &s;
    wr.tm.add.num_sge = 1;
    wr.tm.add.tag = tag;
    wr.tm.add.mask = mask;
    ibv_ops_wr* bad = nullptr;
    EXPECT_EQ(srq_->post_ops(&wr, &bad).error(), 0);
    return wr.tm.handle;
  }
  void post_unexpected_buffer(uint64_t wr_id, size_t offset, uint32_t len) {
    ibv_sge s = sge(recv_buf_.data() + offset, len, mr_b_);
    ibv_recv_wr wr = {};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(srq_->post_recv(&wr, &bad).error(), 0);
  }
  // A SEND of send_buf_[0, len) with a TMH at its start.
  void send_tm(uint64_t wr_id, wire::TmOp op, uint64_t tag, uint32_t app_ctx, uint32_t len) {
    wire::Tmh tmh(send_buf_.data());
    tmh.set_opcode(static_cast<uint8_t>(op));
    tmh.set_reserved(0);
    tmh.set_app_ctx(app_ctx);
    tmh.set_tag(tag);
    send_raw(wr_id, len);
  }
  void send_raw(uint64_t wr_id, uint32_t len) {
    ibv_sge s = sge(send_buf_.data(), len, mr_a_);
    ASSERT_EQ(post_send(qa_, send_wr(wr_id, IBV_WR_SEND, &s)), 0);
  }

  net::SimWorld world_{net::SimOptions{}};
  std::unique_ptr<SimHost> a_;
  std::unique_ptr<SimHost> b_;
  provider::Srq* srq_ = nullptr;
  provider::Qp* qa_ = nullptr;
  provider::Qp* qb_ = nullptr;
  std::vector<uint8_t> send_buf_;
  std::vector<uint8_t> recv_buf_;
  provider::Mr* mr_a_ = nullptr;
  provider::Mr* mr_b_ = nullptr;
};

// A matched eager message lands in its tagged buffer without the TMH, across several packets
// (the TMH is only in the first); the earliest added tag whose mask selects the message's tag
// takes it, and the completion names it.
TEST_F(TagMatchingTest, EagerMessageMatchesTheEarliestTagUnderItsMaskAndLandsWithoutTheTmh) {
  add_tag(1, 0x20, 0xFF, 0, 8192);          // not this message's
  add_tag(2, 0x10, 0xF0, 8192, 8192);       // 0x15 & 0xF0 == 0x10: the earliest that matches
  add_tag(3, 0x15, ~uint64_t{0}, 16384, 8192);
  auto adds = wait(*b_, 3);
  ASSERT_EQ(adds.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(adds[i].wc.opcode, IBV_WC_TM_ADD);
    EXPECT_EQ(adds[i].wc.wr_id, i + 1);
    EXPECT_EQ(adds[i].wc.wc_flags, 0u);
    EXPECT_EQ(provider::tm_info(adds[i].wc).tag, 0u);
  }
  test_support::fill_pattern(send_buf_, 7);
  const uint32_t len = 5000;  // five packets at the 1024-byte MTU
  send_tm(100, wire::TmOp::kEager, 0x15, 0xABCD, len);
  auto rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[0].wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(rb[0].wc.wr_id, 2u);
  EXPECT_EQ(rb[0].wc.byte_len, len - kTmh);
  EXPECT_EQ(provider::tm_info(rb[0].wc).tag, 0x15u);
  EXPECT_EQ(provider::tm_info(rb[0].wc).priv, 0xABCDu);
  EXPECT_EQ(test_support::fnv1a(recv_buf_.data() + 8192, len - kTmh),
            test_support::fnv1a(send_buf_.data() + kTmh, len - kTmh));
  // The consumed tag is off the list: the same tag now matches the third entry.
  send_tm(101, wire::TmOp::kEager, 0x15, 0, 100);
  rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 3u);
  // A plain ibv_poll_cq reader sees no tag bits in the UD-only fields.
  send_tm(102, wire::TmOp::kEager, 0x20, 0x77, 100);
  world_.run_until([&] { return b_->cq->size() > 0; }, world_.clock().now_ns() + kDeadlineNs);
  std::vector<ibv_wc> plain = b_->poll_cq();
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].wr_id, 1u);
  EXPECT_EQ(plain[0].src_qp, 0u);
  EXPECT_EQ(plain[0].vendor_err, 0u);
}

// An unexpected message goes whole, TMH included, to an ordinary SRQ WQE (TM_RECV without
// MATCH); a tag added afterwards with the old unexpected count completes with SYNC_REQ and does
// not match until a SYNC with the new count (Documentation/tag_matching.md's m1/m2/b1 race).
TEST_F(TagMatchingTest, UnexpectedMessageDisablesNewTagsUntilSync) {
  post_unexpected_buffer(50, 0, 4096);
  post_unexpected_buffer(51, 4096, 4096);
  test_support::fill_pattern(send_buf_, 3);
  send_tm(1, wire::TmOp::kEager, 0x99, 0, 300);
  auto rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[0].wc.wc_flags, 0u);
  EXPECT_EQ(rb[0].wc.wr_id, 50u);
  EXPECT_EQ(rb[0].wc.byte_len, 300u);
  EXPECT_EQ(provider::tm_info(rb[0].wc).tag, 0u);
  EXPECT_EQ(test_support::fnv1a(recv_buf_.data(), 300), test_support::fnv1a(send_buf_.data(), 300));
  EXPECT_EQ(srq_->unexpected_count(), 1u);

  // Software has not seen the unexpected message yet: its ADD says 0.
  add_tag(7, 0x99, ~uint64_t{0}, 16384, 4096, /*unexpected=*/0);
  auto add = wait(*b_, 1);
  ASSERT_EQ(add.size(), 1u);
  EXPECT_EQ(add[0].wc.opcode, IBV_WC_TM_ADD);
  EXPECT_EQ(add[0].wc.wc_flags, unsigned{IBV_WC_TM_SYNC_REQ});
  send_tm(2, wire::TmOp::kEager, 0x99, 0, 200);
  rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 51u) << "a tag added out of sync must not match";
  EXPECT_EQ(srq_->unexpected_count(), 2u);

  // SYNC with the count software has handled: the tag matches again.
  ibv_ops_wr sync = {};
  sync.wr_id = 27;
  sync.opcode = IBV_WR_TAG_SYNC;
  sync.flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
  sync.tm.unexpected_cnt = 2;
  ASSERT_EQ(post_op(sync), 0);
  auto s = wait(*b_, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wc.opcode, IBV_WC_TM_SYNC);
  EXPECT_EQ(s[0].wc.wr_id, 27u);
  EXPECT_EQ(s[0].wc.wc_flags, 0u);
  send_tm(3, wire::TmOp::kEager, 0x99, 0, 200);
  rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 7u);
  EXPECT_EQ(rb[0].wc.wc_flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
}

// NO_TAG (and a FIN, the answer to a rendezvous of this side) is never matched: whole, to an
// ordinary WQE, IBV_WC_TM_NO_TAG, and not counted as unexpected.
TEST_F(TagMatchingTest, NoTagAndFinMessagesGoWholeToOrdinaryWqes) {
  add_tag(9, 0x5, ~uint64_t{0}, 16384, 4096);
  ASSERT_EQ(wait(*b_, 1).size(), 1u);
  post_unexpected_buffer(60, 0, 4096);
  post_unexpected_buffer(61, 4096, 4096);
  test_support::fill_pattern(send_buf_, 11);
  send_tm(1, wire::TmOp::kNoTag, 0x5, 0, 400);
  send_tm(2, wire::TmOp::kFin, 0x5, 0, 16);
  auto rb = wait(*b_, 2);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wc.opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(rb[0].wc.wr_id, 60u);
  EXPECT_EQ(rb[0].wc.wc_flags, 0u);
  EXPECT_EQ(rb[0].wc.byte_len, 400u);
  EXPECT_EQ(rb[1].wc.opcode, IBV_WC_TM_NO_TAG);
  EXPECT_EQ(rb[1].wc.wr_id, 61u);
  EXPECT_EQ(test_support::fnv1a(recv_buf_.data() + 4096, 16),
            test_support::fnv1a(send_buf_.data(), 16));
  EXPECT_EQ(srq_->unexpected_count(), 0u);
}

// ibv_post_srq_ops(3): DEL of a listed tag succeeds; DEL of a tag a message consumed completes
// with IBV_WC_TM_ERR; the arguments a device refuses at post time are errnos.
TEST_F(TagMatchingTest, ListOperationErrors) {
  const uint32_t h1 = add_tag(1, 0x1, ~uint64_t{0}, 0, 4096);
  const uint32_t h2 = add_tag(2, 0x2, ~uint64_t{0}, 4096, 4096);
  ASSERT_EQ(wait(*b_, 2).size(), 2u);
  ibv_ops_wr del = {};
  del.wr_id = 11;
  del.opcode = IBV_WR_TAG_DEL;
  del.flags = IBV_OPS_SIGNALED;
  del.tm.handle = h1;
  ASSERT_EQ(post_op(del), 0);
  auto d = wait(*b_, 1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].wc.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(d[0].wc.status, IBV_WC_SUCCESS);
  // The deleted tag matches nothing: the message is unexpected.
  post_unexpected_buffer(70, 8192, 4096);
  send_tm(1, wire::TmOp::kEager, 0x1, 0, 64);
  auto rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 70u);
  // Consumed, then deleted: the race the completion reports.
  send_tm(2, wire::TmOp::kEager, 0x2, 0, 64);
  rb = wait(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 2u);
  del.wr_id = 12;
  del.tm.handle = h2;
  ASSERT_EQ(post_op(del), 0);
  d = wait(*b_, 1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].wc.opcode, IBV_WC_TM_DEL);
  EXPECT_EQ(d[0].wc.wr_id, 12u);
  EXPECT_EQ(d[0].wc.status, IBV_WC_TM_ERR);
  // Consumed but its last completion not yet generated: a rendezvous waiting for its READ.
  const uint32_t h3 = add_tag(3, 0x3, ~uint64_t{0}, 0, 4096, 1);
  ASSERT_EQ(wait(*b_, 1).size(), 1u);
  {
    wire::Rvh rvh(send_buf_.data() + kTmh);
    rvh.set_va(reinterpret_cast<uint64_t>(send_buf_.data()) + 1024);
    rvh.set_rkey(mr_a_->rkey());
    rvh.set_len(1024);
  }
  send_tm(3, wire::TmOp::kRndv, 0x3, 0, 64);
  world_.run_until([&] { return b_->cq->size() > 0; }, world_.clock().now_ns() + kDeadlineNs);
  del.wr_id = 13;
  del.tm.handle = h3;
  ASSERT_EQ(post_op(del), 0);
  auto all = wait(*b_, 3);
  bool del_err = false;
  for (const provider::Completion& c : all)
    if (c.wc.opcode == IBV_WC_TM_DEL) del_err = c.wc.status == IBV_WC_TM_ERR && c.wc.wr_id == 13;
  EXPECT_TRUE(del_err);

  ibv_ops_wr bad = {};
  bad.opcode = IBV_WR_TAG_DEL;
  bad.tm.handle = 8;  // max_num_tags is 8
  EXPECT_EQ(post_op(bad), EINVAL);
  const int unknown_opcode = 77;  // stored as a caller may store it: no such enumerator
  std::memcpy(&bad.opcode, &unknown_opcode, sizeof unknown_opcode);
  EXPECT_EQ(post_op(bad), EINVAL);
  bad.opcode = IBV_WR_TAG_SYNC;
  bad.flags = 1 << 7;
  EXPECT_EQ(post_op(bad), EINVAL);
  std::array<ibv_sge, 2> two = {sge(recv_buf_.data(), 8, mr_b_), sge(recv_buf_.data(), 8, mr_b_)};
  ibv_ops_wr add = {};
  add.opcode = IBV_WR_TAG_ADD;
  add.tm.add.sg_list = two.data();
  add.tm.add.num_sge = 2;  // tm_caps.max_sge is 1
  EXPECT_EQ(post_op(add), EINVAL);
  // The list holds max_num_tags: the next ADD has no handle.
  add.tm.add.num_sge = 1;
  int added = 0;
  while (post_op(add) == 0) ++added;
  EXPECT_EQ(post_op(add), ENOMEM);
  EXPECT_EQ(added, 8);
  // A basic SRQ has no list.
  ibv_srq_attr sattr = {};
  sattr.max_wr = 4;
  provider::Srq* basic = b_->dev.create_srq(b_->pd, sattr).value();
  ibv_ops_wr sync = {};
  sync.opcode = IBV_WR_TAG_SYNC;
  ibv_ops_wr* badp = nullptr;
  EXPECT_EQ(basic->post_ops(&sync, &badp).error(), EOPNOTSUPP);
  EXPECT_EQ(badp, &sync);
}

// A matched rendezvous request: TM_RECV with MATCH at once; the engine READs the sender's data
// into the tagged buffer and SENDs the sender a FIN TMH (its tag and user data); then TM_RECV
// with DATA_VALID. The receiver's QP has no send queue of the application's: nothing of the
// READ or FIN reaches its CQ.
TEST_F(TagMatchingTest, RendezvousReadsTheDataAndSendsAFin) {
  std::vector<uint8_t> fin_buf(64, 0);
  auto* mr_fin = a_->reg(fin_buf.data(), fin_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qa_, 500, sge(fin_buf.data(), 64, mr_fin)), 0);
  add_tag(42, 0x4242, ~uint64_t{0}, 0, 40000);
  ASSERT_EQ(wait(*b_, 1).size(), 1u);
  test_support::fill_pattern(send_buf_, 21);
  const uint32_t data_len = 33333;  // 33 READ response packets at the 1024-byte MTU
  const uint64_t data_va = reinterpret_cast<uint64_t>(send_buf_.data()) + 4096;
  wire::Rvh rvh(send_buf_.data() + kTmh);
  rvh.set_va(data_va);
  rvh.set_rkey(mr_a_->rkey());
  rvh.set_len(data_len);
  send_tm(1, wire::TmOp::kRndv, 0x4242, 0x600D, 64);
  auto rb = wait(*b_, 2);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[0].wc.wc_flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(rb[0].wc.wr_id, 42u);
  EXPECT_EQ(provider::tm_info(rb[0].wc).tag, 0x4242u);
  EXPECT_EQ(provider::tm_info(rb[0].wc).priv, 0x600Du);
  EXPECT_EQ(rb[1].wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[1].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[1].wc.wc_flags, unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(rb[1].wc.wr_id, 42u);
  EXPECT_EQ(rb[1].wc.byte_len, data_len);
  EXPECT_EQ(test_support::fnv1a(recv_buf_.data(), data_len),
            test_support::fnv1a(send_buf_.data() + 4096, data_len));
  // The sender: its SEND's completion and the FIN.
  auto ra = wait(*a_, 2);
  ASSERT_EQ(ra.size(), 2u);
  const provider::Completion& fin = ra[0].wc.opcode == IBV_WC_RECV ? ra[0] : ra[1];
  EXPECT_EQ(fin.wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(fin.wc.wr_id, 500u);
  EXPECT_EQ(fin.wc.byte_len, kTmh);
  const wire::TmhView tmh(fin_buf.data());
  EXPECT_EQ(tmh.opcode(), static_cast<uint8_t>(wire::TmOp::kFin));
  EXPECT_EQ(tmh.tag(), 0x4242u);
  EXPECT_EQ(tmh.app_ctx(), 0x600Du);
  EXPECT_TRUE(settle(*b_).empty()) << "an engine WQE completed on the application's CQ";
  EXPECT_EQ(qb_->engine_wqes(), 0u);
  EXPECT_EQ(qb_->state(), IBV_QPS_RTS);
}

// An RVH naming more than the tagged buffer holds: nothing is read (no write past the buffer),
// the tag's second completion is Local Length Error, and the sender still gets its FIN.
TEST_F(TagMatchingTest, RendezvousLongerThanTheTaggedBufferCompletesInError) {
  std::vector<uint8_t> fin_buf(64, 0);
  auto* mr_fin = a_->reg(fin_buf.data(), fin_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qa_, 500, sge(fin_buf.data(), 64, mr_fin)), 0);
  add_tag(5, 0x5, ~uint64_t{0}, 0, 1000);
  ASSERT_EQ(wait(*b_, 1).size(), 1u);
  std::fill(recv_buf_.begin(), recv_buf_.end(), 0xEE);
  test_support::fill_pattern(send_buf_, 5);
  wire::Rvh rvh(send_buf_.data() + kTmh);
  rvh.set_va(reinterpret_cast<uint64_t>(send_buf_.data()));
  rvh.set_rkey(mr_a_->rkey());
  rvh.set_len(1001);
  send_tm(1, wire::TmOp::kRndv, 0x5, 0, 32);
  auto rb = wait(*b_, 2);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wc.wc_flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(rb[1].wc.status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(rb[1].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[1].wc.wr_id, 5u);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(recv_buf_[i], 0xEE) << i;
  auto ra = wait(*a_, 2);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(wire::TmhView(fin_buf.data()).opcode(), static_cast<uint8_t>(wire::TmOp::kFin));
  EXPECT_EQ(qb_->state(), IBV_QPS_RTS);
}

// An RVH whose key the sender never gave: the READ is NAKed (Remote Access Error), nothing lands
// in the tagged buffer, the tag's second completion carries the READ's error, and no FIN goes.
TEST_F(TagMatchingTest, RendezvousWithABadRkeyCompletesTheTagInError) {
  add_tag(6, 0x6, ~uint64_t{0}, 0, 8192);
  ASSERT_EQ(wait(*b_, 1).size(), 1u);
  std::fill(recv_buf_.begin(), recv_buf_.end(), 0xEE);
  wire::Rvh rvh(send_buf_.data() + kTmh);
  rvh.set_va(reinterpret_cast<uint64_t>(send_buf_.data()));
  rvh.set_rkey(mr_a_->rkey() ^ 0x5A5A00);
  rvh.set_len(4096);
  send_tm(1, wire::TmOp::kRndv, 0x6, 0, 32);
  auto rb = wait(*b_, 2);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wc.wc_flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(rb[1].wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(rb[1].wc.wr_id, 6u);
  EXPECT_EQ(rb[1].wc.status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(rb[1].wc.wc_flags & IBV_WC_TM_DATA_VALID, 0u);
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(recv_buf_[i], 0xEE) << i;
  EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
  EXPECT_EQ(qb_->engine_wqes(), 0u);
}

// A SEND too short for its TMH, an unknown TMH operation, a rendezvous request too short for
// its RVH: the ordinary WQE completes with Remote Invalid Request Error, the sender gets an
// Invalid Request NAK, the receiver's QP enters ERR; nothing else is written.
class TagMatchingHeaderTest : public TagMatchingTest,
                              public ::testing::WithParamInterface<std::pair<int, uint32_t>> {};

TEST_P(TagMatchingHeaderTest, MalformedHeaderIsACompletionError) {
  const auto [op, len] = GetParam();
  post_unexpected_buffer(80, 0, 4096);
  std::fill(recv_buf_.begin(), recv_buf_.end(), 0xEE);
  std::fill(send_buf_.begin(), send_buf_.end(), 0);
  send_buf_[0] = static_cast<uint8_t>(op);
  send_raw(1, len);
  auto rb = wait(*b_, 1);
  ASSERT_GE(rb.size(), 1u);
  EXPECT_EQ(rb[0].wc.wr_id, 80u);
  EXPECT_EQ(rb[0].wc.status, IBV_WC_REM_INV_REQ_ERR);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(recv_buf_[i], 0xEE) << i;
  auto ra = wait(*a_, 1);
  ASSERT_GE(ra.size(), 1u);
  EXPECT_EQ(ra[0].wc.status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
  EXPECT_EQ(b_->engine.counters().tm_header_err, 1u);
}

INSTANTIATE_TEST_SUITE_P(Headers, TagMatchingHeaderTest,
                         ::testing::Values(std::pair{3, 8u},    // EAGER cut short
                                           std::pair{0, 0u},    // empty
                                           std::pair{9, 64u},   // unknown operation
                                           std::pair{1, 24u}));  // RNDV without a whole RVH

// Tag matching is RC only.
TEST(TagMatchingQpTest, TmSrqRefusesOtherTransports) {
  net::SimWorld world{net::SimOptions{}};
  SimHost host(world, net::Address::from_v4(10, 0, 0, 1));
  ibv_srq_attr sattr = {};
  sattr.max_wr = 4;
  sattr.max_sge = 1;
  provider::Srq* srq =
      host.dev.create_srq(host.pd, sattr, nullptr, nullptr, nullptr, provider::SrqTmAttr{4, 4, host.cq}).value();
  for (ibv_qp_type type : {IBV_QPT_UC, IBV_QPT_UD}) {
    provider::QpInitAttr init;
    init.qp_type = type;
    init.pd = host.pd;
    init.send_cq = host.cq;
    init.recv_cq = host.cq;
    init.srq = srq;
    init.cap = {4, 0, 1, 0, 0};
    EXPECT_EQ(host.dev.create_qp(init).error(), EOPNOTSUPP);
  }
  // Attributes beyond tm_caps, or no CQ.
  EXPECT_EQ(host.dev.create_srq(host.pd, sattr, nullptr, nullptr, nullptr, provider::SrqTmAttr{0, 4, host.cq}).error(),
            EINVAL);
  EXPECT_EQ(host.dev
                .create_srq(host.pd, sattr, nullptr, nullptr, nullptr,
                            provider::SrqTmAttr{provider::kTmMaxNumTags + 1, 4, host.cq})
                .error(),
            EINVAL);
  EXPECT_EQ(host.dev.create_srq(host.pd, sattr, nullptr, nullptr, nullptr, provider::SrqTmAttr{4, 4, nullptr}).error(),
            EINVAL);
  // The TM-SRQ's CQ is in use while the SRQ lives.
  EXPECT_EQ(host.dev.destroy_cq(host.cq).error(), EBUSY);
  EXPECT_TRUE(host.dev.destroy_srq(srq).ok());
}

}  // namespace
}  // namespace urdma::engine::testing
