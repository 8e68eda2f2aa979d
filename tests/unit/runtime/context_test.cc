// Two ibv_contexts in one process (librdmacm's and the application's) are views on the one
// Device of the process's runtime: their QPNs come from the slot's one range and their keys
// from one key space, so nothing collides on the shared slot socket; each context uses only
// its own objects and destroys them when it closes.
#include "runtime/context.h"

#include <gtest/gtest.h>

#include <set>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

// An RC QP of 4 send and 4 receive WRs of one SGE each, both queues on `cq`.
provider::QpInitAttr small_rc(provider::Pd* pd, provider::Cq* cq) {
  provider::QpInitAttr init;
  init.pd = pd;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap.max_send_wr = 4;
  init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  return init;
}

TEST(RuntimeContext, TwoContextsShareOneQpnRangeAndKeySpace) {
  std::vector<uint8_t> mem(64 * 4096);
  auto [a, b] = make_hosts();
  auto cm = std::make_unique<Context>(*a.rt);  // librdmacm's
  auto app = std::make_unique<Context>(*a.rt);
  std::set<uint32_t> qpns;
  std::set<uint32_t> keys;
  for (Context* c : {cm.get(), app.get()}) {
    provider::Pd* pd = c->alloc_pd().value();
    provider::Cq* cq = c->create_cq(16).value();
    for (int i = 0; i < 16; ++i) {
      auto qp = c->create_qp(small_rc(pd, cq));
      ASSERT_TRUE(qp.ok());
      EXPECT_TRUE(qpns.insert(qp.value()->qp_num()).second) << "QPN handed out twice";
      auto mr = c->reg_mr(pd, mem.data() + i * 4096, 4096, 0, IBV_ACCESS_LOCAL_WRITE);
      ASSERT_TRUE(mr.ok());
      EXPECT_TRUE(keys.insert(mr.value()->rkey()).second) << "rkey handed out twice";
    }
  }
  EXPECT_EQ(qpns.size(), 32u);
  EXPECT_EQ(keys.size(), 32u);
  EXPECT_EQ(cm->objects(), 2u + 32u);

  // A context refuses another's objects (EINVAL).
  provider::Pd* app_pd = app->alloc_pd().value();
  EXPECT_EQ(cm->reg_mr(app_pd, mem.data(), 64, 0, 0).status().error(), EINVAL);
  EXPECT_EQ(cm->dealloc_pd(app_pd).error(), EINVAL);

  // Closing one context destroys its objects, and only its.
  cm.reset();
  EXPECT_EQ(app->objects(), 3u + 32u);
  app.reset();
  EXPECT_EQ(a.dev().qp_by_num(*qpns.begin()), nullptr);
}

// The ACK of a QP's last SEND is in its socket's queue, unread (no engine thread, no poll),
// when the application ends the QP, as one does on the DISCONNECTED event of a peer that
// answered and left: a device has processed that ACK on arrival, so the SEND completes
// successfully, on its CQ, after the verb — and is not flushed or lost with the QP.
enum class Ending { kModifyToErr, kDestroy };

void the_last_sends_ack_completes_it(Ending ending) {
  auto [a, b] = make_hosts({.engine_thread = false});
  Context ctx(*a.rt);
  provider::Pd* pd = ctx.alloc_pd().value();
  provider::Cq* cqa = ctx.create_cq(16).value();
  provider::Qp* qa = ctx.create_qp(small_rc(pd, cqa)).value();
  provider::Cq* cqb = b.make_cq();
  provider::Qp* qb = b.dev().create_qp(small_rc(b.pd, cqb)).value();
  test::QpParams p;
  p.timeout = 16;
  test::QpParams pb = p;
  std::swap(pb.sq_psn, pb.rq_psn);
  ASSERT_TRUE(test::bring_up(*qa, p, b.addr, qb->qp_num()).ok());
  ASSERT_TRUE(test::bring_up(*qb, pb, a.addr, qa->qp_num()).ok());

  std::vector<uint8_t> src(64), dst(64);
  fill_pattern(src, 1);
  provider::Mr* ms = ctx.reg_mr(pd, src.data(), src.size(), reinterpret_cast<uintptr_t>(src.data()),
                                IBV_ACCESS_LOCAL_WRITE)
                         .value();
  provider::Mr* md = b.reg(dst.data(), dst.size());
  ASSERT_TRUE(post_one_recv(*qb, dst.data(), 64, md->lkey(), 2).ok());
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 64, ms->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_TRUE(qa->post_send(&wr, &bad).ok());
  // The SEND leaves; B's turns receive it and send its ACK (a QP that only receives ACKs at
  // once), which waits in A's socket.
  ASSERT_TRUE(a.rt->try_progress());
  const std::vector<ibv_wc> got = wait_cqes(*b.rt, cqb, 1, /*drive=*/true);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].status, IBV_WC_SUCCESS);
  b.settle();
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  ibv_wc wc[4];
  ASSERT_EQ(cqa->poll(4, wc), 0) << "A took a turn before the QP ended";

  if (ending == Ending::kModifyToErr) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ASSERT_TRUE(ctx.modify_qp(qa, attr, IBV_QP_STATE).ok());
    ASSERT_TRUE(a.rt->try_progress());  // the flush, if anything were left to flush
  } else {
    ASSERT_TRUE(ctx.destroy_qp(qa).ok());
  }
  ASSERT_EQ(cqa->poll(4, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[0].status);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
}

TEST(RuntimeContext, AModifyToErrTakesInTheAckOfTheLastSendBeforeItFlushes) {
  the_last_sends_ack_completes_it(Ending::kModifyToErr);
}

TEST(RuntimeContext, ADestroyTakesInTheAckOfTheLastSendBeforeTheQpGoes) {
  the_last_sends_ack_completes_it(Ending::kDestroy);
}

}  // namespace
}  // namespace urdma::runtime::testing
