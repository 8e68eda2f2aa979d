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
      provider::QpInitAttr init;
      init.pd = pd;
      init.send_cq = cq;
      init.recv_cq = cq;
      init.cap.max_send_wr = 4;
      init.cap.max_recv_wr = 4;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      auto qp = c->create_qp(init);
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

}  // namespace
}  // namespace urdma::runtime::testing
