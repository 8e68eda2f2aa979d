// Two engines end to end over net::SimNetwork and a VirtualClock: every operation, multi-MTU
// messages, UD, UC, RNR, loss and partitions. The assertions are on completions and on the
// bytes in the peer's memory.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "support/sim_world.h"

namespace urdma::engine::testing {
namespace {

constexpr uint64_t kDeadlineNs = 10'000'000'000;  // 10 s of virtual time

class EngineE2eTest : public ::testing::Test {
 protected:
  explicit EngineE2eTest(net::SimOptions options = {}) : world_(std::move(options)) {}

  void make_hosts(ibv_mtu mtu = IBV_MTU_4096) {
    a_ = std::make_unique<SimHost>(world_, net::Address::from_v4(10, 0, 0, 1), mtu);
    b_ = std::make_unique<SimHost>(world_, net::Address::from_v4(10, 0, 0, 2), mtu);
  }

  // A connected pair of QPs of type p.type (the PSNs of the two directions are swapped).
  void make_pair(QpParams p = {}) {
    if (!a_) make_hosts();
    qa_ = a_->create_qp(p);
    qb_ = b_->create_qp(p);
    QpParams pb = p;
    std::swap(pb.sq_psn, pb.rq_psn);
    connect(qa_, b_->addr, qb_->qp_num(), p);
    connect(qb_, a_->addr, qa_->qp_num(), pb);
  }

  // Runs until `host` has `n` completions, then returns them.
  std::vector<ibv_wc> wait_cqes(SimHost& host, size_t n) {
    std::vector<ibv_wc> got;
    const net::RunOutcome outcome = world_.run_until(
        [&] {
          for (const ibv_wc& wc : host.poll_cq()) got.push_back(wc);
          return got.size() >= n;
        },
        world_.clock().now_ns() + kDeadlineNs);
    EXPECT_EQ(outcome, net::RunOutcome::kDone) << net::to_string(outcome);
    return got;
  }

  net::SimWorld world_;
  std::unique_ptr<SimHost> a_;
  std::unique_ptr<SimHost> b_;
  provider::Qp* qa_ = nullptr;
  provider::Qp* qb_ = nullptr;
};

TEST_F(EngineE2eTest, SendRecvSmall) {
  make_pair();
  std::vector<uint8_t> src(100), dst(256, 0);
  fill_pattern(src, 1);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 77, sge(dst.data(), 256, mr_b)), 0);
  ibv_sge s = sge(src.data(), 100, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);

  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(rb[0].wr_id, 77u);
  EXPECT_EQ(rb[0].byte_len, 100u);
  EXPECT_EQ(rb[0].qp_num, qb_->qp_num());
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 100));
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(ra[0].wr_id, 1u);
  EXPECT_EQ(a_->engine.counters().drops(), 0u);
  EXPECT_EQ(b_->engine.counters().drops(), 0u);
}

TEST_F(EngineE2eTest, MultiMtuSendWithImmAndScatter) {
  make_hosts();
  QpParams p;
  p.mtu = IBV_MTU_1024;
  make_pair(p);
  std::vector<uint8_t> src(10'000), dst1(3000, 0), dst2(8000, 0);
  fill_pattern(src, 2);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b1 = b_->reg(dst1.data(), dst1.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_b2 = b_->reg(dst2.data(), dst2.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge rs[2] = {sge(dst1.data(), 3000, mr_b1), sge(dst2.data(), 8000, mr_b2)};
  ibv_recv_wr rwr = {};
  rwr.wr_id = 5;
  rwr.sg_list = rs;
  rwr.num_sge = 2;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(qb_->post_recv(&rwr, &bad).error(), 0);
  // Two send SGEs.
  ibv_sge ss[2] = {sge(src.data(), 4000, mr_a), sge(src.data() + 4000, 6000, mr_a)};
  ibv_send_wr wr = send_wr(2, IBV_WR_SEND_WITH_IMM, ss, 2);
  wr.imm_data = htonl(0xCAFEF00D);
  ASSERT_EQ(post_send(qa_, wr), 0);

  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].byte_len, 10'000u);
  EXPECT_TRUE(rb[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(rb[0].imm_data), 0xCAFEF00Du);
  EXPECT_EQ(0, std::memcmp(src.data(), dst1.data(), 3000));
  EXPECT_EQ(0, std::memcmp(src.data() + 3000, dst2.data(), 7000));
  EXPECT_EQ(b_->engine.counters().rdma_recvs, 10u);  // ceil(10000 / 1024)
  auto ra = wait_cqes(*a_, 1);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
}

// XRC (IBA 9.2, XRC): an initiator (XRC_SEND) on host a, a target (XRC_RECV) in an XRC domain
// on host b; each request names an XRC SRQ of that domain, whose WQEs it takes, whose CQ its
// receive completion goes to and whose PD its memory accesses are checked against.
class XrcE2eTest : public EngineE2eTest {
 protected:
  void make_xrc(ibv_mtu mtu = IBV_MTU_1024) {
    make_hosts();
    xrcd_ = b_->dev.alloc_xrcd().value();
    srq_cq_ = b_->dev.create_cq(256).value();
    srq_ = b_->dev.create_srq(b_->pd, {64, 4, 0}, nullptr, xrcd_, srq_cq_).value();
    provider::QpInitAttr ini;
    ini.qp_type = IBV_QPT_XRC_SEND;
    ini.pd = a_->pd;
    ini.send_cq = a_->cq;
    ini.cap = {64, 0, 4, 0, 64};
    qa_ = a_->dev.create_qp(ini).value();
    provider::QpInitAttr tgt;
    tgt.qp_type = IBV_QPT_XRC_RECV;
    tgt.xrcd = xrcd_;
    qb_ = b_->dev.create_qp(tgt).value();
    QpParams p;
    p.mtu = mtu;
    p.type = IBV_QPT_XRC_SEND;
    QpParams pb = p;
    pb.type = IBV_QPT_XRC_RECV;
    std::swap(pb.sq_psn, pb.rq_psn);
    connect(qa_, b_->addr, qb_->qp_num(), p);
    connect(qb_, a_->addr, qa_->qp_num(), pb);
  }

  std::vector<ibv_wc> wait_srq_cqes(size_t n) {
    std::vector<ibv_wc> got;
    const net::RunOutcome outcome = world_.run_until(
        [&] {
          std::vector<ibv_wc> out(64);
          const int k = srq_cq_->poll(static_cast<int>(out.size()), out.data());
          for (int i = 0; i < k; ++i) got.push_back(out[static_cast<size_t>(i)]);
          return got.size() >= n;
        },
        world_.clock().now_ns() + kDeadlineNs);
    EXPECT_EQ(outcome, net::RunOutcome::kDone) << net::to_string(outcome);
    return got;
  }

  provider::Xrcd* xrcd_ = nullptr;
  provider::Cq* srq_cq_ = nullptr;
  provider::Srq* srq_ = nullptr;
};

TEST_F(XrcE2eTest, SendIntoTheSrqAndWriteReadAtomicThroughItsPd) {
  make_xrc();
  std::vector<uint8_t> src(3000), dst(4096, 0), mem(4096, 0), back(4096, 0);
  fill_pattern(src, 11);
  fill_pattern(mem, 12);
  auto* mr_src = a_->reg(src.data(), src.size(), 0);
  auto* mr_back = a_->reg(back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_dst = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_mem = b_->reg(mem.data(), mem.size(),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  // A receive WQE in the XRC SRQ; the SEND (three packets at a 1024-byte MTU, each with the
  // XRCETH) lands in it.
  ibv_sge rs = sge(dst.data(), 4096, mr_dst);
  ibv_recv_wr rwr = {};
  rwr.wr_id = 42;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(srq_->post_recv(&rwr, &rbad).error(), 0);
  ibv_sge s = sge(src.data(), 3000, mr_src);
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND_WITH_IMM, &s);
  wr.imm_data = htonl(0x5EC0DE);
  wr.qp_type.xrc.remote_srqn = srq_->srq_num();
  ASSERT_EQ(post_send(qa_, wr), 0);
  const auto rb = wait_srq_cqes(1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(rb[0].wr_id, 42u);
  EXPECT_EQ(rb[0].byte_len, 3000u);
  EXPECT_EQ(rb[0].qp_num, qb_->qp_num());
  EXPECT_EQ(ntohl(rb[0].imm_data), 0x5EC0DEu);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 3000));
  EXPECT_TRUE(b_->poll_cq().empty());  // nothing on the host's other CQ
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_SEND);

  // RDMA WRITE, READ back, FETCH_ADD: keys of the SRQ's PD.
  ibv_sge ws = sge(src.data(), 2000, mr_src);
  ibv_send_wr w = send_wr(2, IBV_WR_RDMA_WRITE, &ws);
  w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(mem.data()) + 8;
  w.wr.rdma.rkey = mr_mem->rkey();
  w.qp_type.xrc.remote_srqn = srq_->srq_num();
  ASSERT_EQ(post_send(qa_, w), 0);
  ibv_sge bs = sge(back.data(), 2000, mr_back);
  ibv_send_wr r = send_wr(3, IBV_WR_RDMA_READ, &bs);
  r.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(mem.data()) + 8;
  r.wr.rdma.rkey = mr_mem->rkey();
  r.qp_type.xrc.remote_srqn = srq_->srq_num();
  ASSERT_EQ(post_send(qa_, r), 0);
  uint64_t before = 0;
  std::memcpy(&before, mem.data() + 4088, 8);
  ibv_sge as = sge(back.data() + 4088, 8, mr_back);
  ibv_send_wr at = send_wr(4, IBV_WR_ATOMIC_FETCH_AND_ADD, &as);
  at.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(mem.data()) + 4088;
  at.wr.atomic.rkey = mr_mem->rkey();
  at.wr.atomic.compare_add = 5;
  at.qp_type.xrc.remote_srqn = srq_->srq_num();
  ASSERT_EQ(post_send(qa_, at), 0);
  ra = wait_cqes(*a_, 3);
  ASSERT_EQ(ra.size(), 3u);
  for (const ibv_wc& wc : ra) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  EXPECT_EQ(ra[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(ra[2].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(0, std::memcmp(src.data(), mem.data() + 8, 2000));
  EXPECT_EQ(0, std::memcmp(src.data(), back.data(), 2000));
  uint64_t orig = 0, after = 0;
  std::memcpy(&orig, back.data() + 4088, 8);
  std::memcpy(&after, mem.data() + 4088, 8);
  EXPECT_EQ(orig, before);
  EXPECT_EQ(after, before + 5);
  EXPECT_EQ(a_->engine.counters().drops(), 0u);
  EXPECT_EQ(b_->engine.counters().drops(), 0u);
  EXPECT_EQ(b_->engine.counters().xrc_srq_invalid, 0u);
}

// IBA 9.7.5.2 (XRC): a request naming no XRC SRQ of the target's domain — a number nobody has,
// a basic SRQ's, or an XRC SRQ of another domain — is an Invalid Request: NAKed, counted, and
// the initiator's WR completes with REM_INV_REQ_ERR; nothing lands in any SRQ.
class XrcInvalidSrqTest : public XrcE2eTest {
 protected:
  void expect_invalid_request(int variant) {
    make_xrc();
    uint32_t srqn = 0xABCDE;  // no such SRQ
    if (variant == 1) srqn = b_->dev.create_srq(b_->pd, {8, 1, 0}).value()->srq_num();
    if (variant == 2) {
      provider::Xrcd* other = b_->dev.alloc_xrcd().value();
      provider::Srq* foreign =
          b_->dev.create_srq(b_->pd, {8, 1, 0}, nullptr, other, srq_cq_).value();
      srqn = foreign->srq_num();
      auto* mr = b_->reg(landing_.data(), landing_.size(), IBV_ACCESS_LOCAL_WRITE);
      ibv_sge rs = sge(landing_.data(), 64, mr);
      ibv_recv_wr rwr = {};
      rwr.sg_list = &rs;
      rwr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_EQ(foreign->post_recv(&rwr, &bad).error(), 0);
    }
    std::vector<uint8_t> src(64, 7);
    auto* mr_src = a_->reg(src.data(), src.size(), 0);
    ibv_sge s = sge(src.data(), 64, mr_src);
    ibv_send_wr wr = send_wr(9, IBV_WR_SEND, &s);
    wr.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(post_send(qa_, wr), 0);
    const auto ra = wait_cqes(*a_, 1);
    ASSERT_EQ(ra.size(), 1u);
    EXPECT_EQ(ra[0].status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_EQ(b_->engine.counters().xrc_srq_invalid, 1u);
    EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
    std::vector<ibv_wc> none(8);
    EXPECT_EQ(srq_cq_->poll(8, none.data()), 0);
    EXPECT_EQ(landing_, std::vector<uint8_t>(64, 0));
  }
  std::vector<uint8_t> landing_ = std::vector<uint8_t>(64, 0);
};

// IBA 9.7.5.2 (XRC): a request naming no XRC SRQ of the target's domain — a number nobody has,
// a basic SRQ's, or an XRC SRQ of another domain — is an Invalid Request: NAKed, counted, and
// the initiator's WR completes with REM_INV_REQ_ERR; nothing lands in any SRQ.
TEST_F(XrcInvalidSrqTest, NoSuchSrqIsAnInvalidRequest) { expect_invalid_request(0); }
TEST_F(XrcInvalidSrqTest, ABasicSrqIsAnInvalidRequest) { expect_invalid_request(1); }
TEST_F(XrcInvalidSrqTest, AnXrcSrqOfAnotherDomainIsAnInvalidRequest) {
  expect_invalid_request(2);
}

// The XRC halves at the verbs: a target has no send queue, an initiator no receive queue, and
// ATOMIC WRITE is RC's alone (IBA 1.5).
TEST_F(XrcE2eTest, AnInitiatorTakesNoRequestsAndATargetSendsNone) {
  make_xrc();
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, nullptr, 0);
  EXPECT_EQ(post_send(qb_, wr), EINVAL);  // a target has no send queue
  ibv_recv_wr rwr = {};
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(qa_->post_recv(&rwr, &bad).error(), EINVAL);  // nor an initiator a receive queue
  wr.opcode = IBV_WR_ATOMIC_WRITE;
  EXPECT_EQ(post_send(qa_, wr), EINVAL);  // ATOMIC WRITE is RC only
}

TEST_F(EngineE2eTest, RdmaWriteMultiMtu) {
  make_hosts();
  QpParams p;
  p.mtu = IBV_MTU_1024;
  make_pair(p);
  std::vector<uint8_t> src(5000), dst(6000, 0xEE);
  fill_pattern(src, 3);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s = sge(src.data(), 5000, mr_a);
  ibv_send_wr wr = send_wr(3, IBV_WR_RDMA_WRITE, &s);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data()) + 500;
  wr.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, wr), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 500, 5000));
  // Nothing outside the target range was touched.
  for (size_t i = 0; i < 500; ++i) ASSERT_EQ(dst[i], 0xEE);
  for (size_t i = 5500; i < 6000; ++i) ASSERT_EQ(dst[i], 0xEE);
  EXPECT_TRUE(b_->poll_cq().empty());  // a WRITE without immediate consumes no receive
}

TEST_F(EngineE2eTest, RdmaWriteWithImm) {
  make_pair();
  std::vector<uint8_t> src(64), dst(64, 0);
  fill_pattern(src, 4);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(post_recv(qb_, 9, sge(nullptr, 0, mr_b)), 0);
  ibv_sge s = sge(src.data(), 64, mr_a);
  ibv_send_wr wr = send_wr(4, IBV_WR_RDMA_WRITE_WITH_IMM, &s);
  wr.imm_data = htonl(42);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  wr.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, wr), 0);
  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(rb[0].wr_id, 9u);
  EXPECT_EQ(rb[0].byte_len, 64u);
  EXPECT_EQ(ntohl(rb[0].imm_data), 42u);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), 64));
}

TEST_F(EngineE2eTest, RdmaReadMultiMtu) {
  make_hosts();
  QpParams p;
  p.mtu = IBV_MTU_1024;
  make_pair(p);
  std::vector<uint8_t> remote(9000), local(9000, 0);
  fill_pattern(remote, 5);
  auto* mr_a = a_->reg(local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_b = b_->reg(remote.data(), remote.size(), IBV_ACCESS_REMOTE_READ);
  ibv_sge s = sge(local.data(), 9000, mr_a);
  ibv_send_wr wr = send_wr(5, IBV_WR_RDMA_READ, &s);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
  wr.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, wr), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(ra[0].byte_len, 9000u);
  EXPECT_EQ(local, remote);
}

TEST_F(EngineE2eTest, AtomicsCompareSwapAndFetchAdd) {
  make_pair();
  alignas(8) uint64_t target[2] = {100, 7};
  alignas(8) uint64_t result[2] = {0, 0};
  auto* mr_a = a_->reg(result, sizeof(result), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_b = b_->reg(target, sizeof(target), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_sge s0 = sge(&result[0], 8, mr_a);
  ibv_send_wr cas = send_wr(6, IBV_WR_ATOMIC_CMP_AND_SWP, &s0);
  cas.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&target[0]);
  cas.wr.atomic.rkey = mr_b->rkey();
  cas.wr.atomic.compare_add = 100;
  cas.wr.atomic.swap = 555;
  ibv_sge s1 = sge(&result[1], 8, mr_a);
  ibv_send_wr fa = send_wr(7, IBV_WR_ATOMIC_FETCH_AND_ADD, &s1);
  fa.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&target[1]);
  fa.wr.atomic.rkey = mr_b->rkey();
  fa.wr.atomic.compare_add = 5;
  ASSERT_EQ(post_send(qa_, cas), 0);
  ASSERT_EQ(post_send(qa_, fa), 0);
  auto ra = wait_cqes(*a_, 2);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(ra[0].wr_id, 6u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_COMP_SWAP);
  EXPECT_EQ(ra[1].wr_id, 7u);
  EXPECT_EQ(ra[1].opcode, IBV_WC_FETCH_ADD);
  EXPECT_EQ(result[0], 100u);
  EXPECT_EQ(target[0], 555u);
  EXPECT_EQ(result[1], 7u);
  EXPECT_EQ(target[1], 12u);
}

// IBA 1.5 ATOMIC WRITE: 8 bytes from an SGE (classic API) or inline, stored in one access and
// answered as rxe answers it (a zero-length RDMA READ Response Only).
TEST_F(EngineE2eTest, AtomicWriteStoresEightBytes) {
  make_pair();
  alignas(8) uint64_t target[2] = {1, 2};
  alignas(8) uint64_t value = 0x1122334455667788;
  auto* mr_a = a_->reg(&value, sizeof(value), 0);
  auto* mr_b = b_->reg(target, sizeof(target), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s0 = sge(&value, 8, mr_a);
  ibv_send_wr aw = send_wr(8, IBV_WR_ATOMIC_WRITE, &s0);
  aw.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&target[0]);
  aw.wr.rdma.rkey = mr_b->rkey();
  alignas(8) uint64_t inline_value = 0xA5A5A5A5DEADBEEF;
  ibv_sge s1 = {reinterpret_cast<uint64_t>(&inline_value), 8, 0};
  ibv_send_wr inl = send_wr(9, IBV_WR_ATOMIC_WRITE, &s1);
  inl.send_flags |= IBV_SEND_INLINE;
  inl.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&target[1]);
  inl.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, aw), 0);
  ASSERT_EQ(post_send(qa_, inl), 0);
  inline_value = 0;  // taken at post
  auto ra = wait_cqes(*a_, 2);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(ra[0].wr_id, 8u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(ra[1].wr_id, 9u);
  EXPECT_EQ(ra[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[1].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(target[0], 0x1122334455667788u);
  EXPECT_EQ(target[1], 0xA5A5A5A5DEADBEEFu);
  EXPECT_TRUE(b_->poll_cq().empty());  // no receive completion at the responder
}

// rxe_resp.c: the target must allow remote writes (else Remote Access Error) and be 8-byte
// aligned (else Invalid Request: RESPST_ERR_MISALIGNED_ATOMIC).
TEST_F(EngineE2eTest, AtomicWriteBadRkeyIsRemoteAccessError) {
  make_pair();
  alignas(8) uint64_t target = 5;
  alignas(8) uint64_t value = 6;
  auto* mr_a = a_->reg(&value, sizeof(value), 0);
  auto* mr_b = b_->reg(&target, sizeof(target), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_sge s = sge(&value, 8, mr_a);
  ibv_send_wr aw = send_wr(1, IBV_WR_ATOMIC_WRITE, &s);
  aw.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&target);
  aw.wr.rdma.rkey = mr_b->rkey();  // no REMOTE_WRITE
  ASSERT_EQ(post_send(qa_, aw), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(target, 5u);
  EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
}

TEST_F(EngineE2eTest, AtomicWriteMisalignedIsInvalidRequest) {
  make_pair();
  alignas(8) uint8_t target[16] = {};
  alignas(8) uint64_t value = ~uint64_t{0};
  auto* mr_a = a_->reg(&value, sizeof(value), 0);
  auto* mr_b = b_->reg(target, sizeof(target), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s = sge(&value, 8, mr_a);
  ibv_send_wr aw = send_wr(1, IBV_WR_ATOMIC_WRITE, &s);
  aw.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&target[4]);
  aw.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, aw), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_REM_INV_REQ_ERR);
  for (uint8_t byte : target) EXPECT_EQ(byte, 0);
  EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
}

// An ATOMIC WRITE on a QP without remote write access is refused (rxe check_op_valid).
TEST_F(EngineE2eTest, AtomicWriteNeedsQpRemoteWrite) {
  QpParams p;
  p.access = IBV_ACCESS_REMOTE_READ;
  make_pair(p);
  alignas(8) uint64_t target = 5;
  alignas(8) uint64_t value = 6;
  auto* mr_a = a_->reg(&value, sizeof(value), 0);
  auto* mr_b = b_->reg(&target, sizeof(target), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s = sge(&value, 8, mr_a);
  ibv_send_wr aw = send_wr(1, IBV_WR_ATOMIC_WRITE, &s);
  aw.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&target);
  aw.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, aw), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(target, 5u);
}

TEST_F(EngineE2eTest, UdSendRecvWithGrh) {
  make_hosts();
  QpParams p;
  p.type = IBV_QPT_UD;
  qa_ = a_->create_qp(p);
  qb_ = b_->create_qp(p);
  connect(qa_, b_->addr, 0, p);
  connect(qb_, a_->addr, 0, p);
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = gid_of(b_->addr);
  ah_attr.grh.hop_limit = 64;
  auto* ah = a_->dev.create_ah(a_->pd, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();

  std::vector<uint8_t> src(200), dst(40 + 256, 0);
  fill_pattern(src, 6);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 11, sge(dst.data(), static_cast<uint32_t>(dst.size()), mr_b)), 0);
  ibv_sge s = sge(src.data(), 200, mr_a);
  ibv_send_wr wr = send_wr(10, IBV_WR_SEND, &s);
  wr.wr.ud.ah = &verbs_ah;
  wr.wr.ud.remote_qpn = qb_->qp_num();
  wr.wr.ud.remote_qkey = p.qkey;
  ASSERT_EQ(post_send(qa_, wr), 0);

  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].byte_len, 240u);
  EXPECT_EQ(rb[0].src_qp, qa_->qp_num());
  EXPECT_TRUE(rb[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data() + 40, 200));
  // The GRH area holds the IPv4 form with the sender's address.
  EXPECT_EQ(wire::grh_ip_version(std::span<const uint8_t, 40>(dst.data(), 40)), 4);
  wire::Ipv4HeaderView ip(dst.data() + wire::kGrhIpv4Offset);
  EXPECT_EQ(ip.saddr(), a_->addr.v4());
  // The SL says which form (mlx5's convention, which UCX's ud_verbs reads): UDP + IPv4.
  EXPECT_EQ(rb[0].sl, 0xa);
  auto ra = wait_cqes(*a_, 1);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
}

TEST_F(EngineE2eTest, UdWrongQkeyIsDropped) {
  make_hosts();
  QpParams p;
  p.type = IBV_QPT_UD;
  qa_ = a_->create_qp(p);
  qb_ = b_->create_qp(p);
  connect(qa_, b_->addr, 0, p);
  connect(qb_, a_->addr, 0, p);
  ibv_ah_attr ah_attr = {};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.dgid = gid_of(b_->addr);
  auto* ah = a_->dev.create_ah(a_->pd, ah_attr).value();
  ibv_ah verbs_ah = {};
  verbs_ah.handle = ah->handle();
  std::vector<uint8_t> dst(300);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 11, sge(dst.data(), 300, mr_b)), 0);
  ibv_send_wr wr = send_wr(10, IBV_WR_SEND, nullptr, 0);
  wr.wr.ud.ah = &verbs_ah;
  wr.wr.ud.remote_qpn = qb_->qp_num();
  wr.wr.ud.remote_qkey = 0x22222222;  // IBA 10.2.5: not the receiver's Q_Key
  ASSERT_EQ(post_send(qa_, wr), 0);
  wait_cqes(*a_, 1);
  world_.run_until_idle(world_.clock().now_ns() + 1'000'000);
  EXPECT_EQ(b_->engine.counters().drop_qkey, 1u);
  EXPECT_TRUE(b_->poll_cq().empty());
}

TEST_F(EngineE2eTest, UcSendAndWrite) {
  make_hosts();
  QpParams p;
  p.type = IBV_QPT_UC;
  p.mtu = IBV_MTU_1024;
  make_pair(p);
  std::vector<uint8_t> src(3000), dst(3000, 0), wdst(3000, 0);
  fill_pattern(src, 7);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_w = b_->reg(wdst.data(), wdst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(post_recv(qb_, 1, sge(dst.data(), 3000, mr_b)), 0);
  ibv_sge s = sge(src.data(), 3000, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);
  ibv_send_wr w = send_wr(2, IBV_WR_RDMA_WRITE, &s);
  w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(wdst.data());
  w.wr.rdma.rkey = mr_w->rkey();
  ASSERT_EQ(post_send(qa_, w), 0);
  auto ra = wait_cqes(*a_, 2);  // UC completes when sent
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(ra[1].status, IBV_WC_SUCCESS);
  auto rb = wait_cqes(*b_, 1);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[0].byte_len, 3000u);
  world_.run_until_idle(world_.clock().now_ns() + 1'000'000);
  EXPECT_EQ(src, dst);
  EXPECT_EQ(src, wdst);
  EXPECT_EQ(a_->engine.counters().rcvd_pkts, 0u);  // UC: no ACKs
}

TEST_F(EngineE2eTest, RnrThenSuccess) {
  make_pair();
  std::vector<uint8_t> src(32), dst(32, 0);
  fill_pattern(src, 8);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s = sge(src.data(), 32, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);
  // No receive posted: B answers RNR NAK; A waits min_rnr_timer and retries (rnr_retry 7).
  world_.run_until([&] { return a_->engine.counters().rcvd_rnr_err >= 3; },
                   world_.clock().now_ns() + kDeadlineNs);
  EXPECT_GE(b_->engine.counters().send_rnr_err, 3u);
  EXPECT_TRUE(a_->poll_cq().empty());
  ASSERT_EQ(post_recv(qb_, 2, sge(dst.data(), 32, mr_b)), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(src, dst);
}

// Many RNR cycles of a multi-packet SEND cost no transport retries: with retry_cnt 0 the
// message still succeeds once a receive is posted (rnr_retry 7 = infinite).
TEST_F(EngineE2eTest, ManyRnrCyclesOfMultiPacketSendDoNotExhaustRetryCount) {
  make_hosts();
  QpParams p;
  p.mtu = IBV_MTU_1024;
  p.retry_cnt = 0;
  make_pair(p);
  std::vector<uint8_t> src(5000), dst(5000, 0);
  fill_pattern(src, 13);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s = sge(src.data(), 5000, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);
  world_.run_until([&] { return a_->engine.counters().rcvd_rnr_err >= 10; },
                   world_.clock().now_ns() + kDeadlineNs);
  EXPECT_TRUE(a_->poll_cq().empty());
  ASSERT_EQ(post_recv(qb_, 2, sge(dst.data(), 5000, mr_b)), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(src, dst);
}

TEST_F(EngineE2eTest, RnrRetryExceeded) {
  QpParams p;
  p.rnr_retry = 2;
  make_pair(p);
  ibv_send_wr wr = send_wr(1, IBV_WR_SEND, nullptr, 0);
  ASSERT_EQ(post_send(qa_, wr), 0);
  ASSERT_EQ(post_send(qa_, send_wr(2, IBV_WR_SEND, nullptr, 0)), 0);
  auto ra = wait_cqes(*a_, 2);
  ASSERT_EQ(ra.size(), 2u);
  // IBA 9.7.5.1.5: rnr_retry exhausted → RNR_RETRY_EXC_ERR, then the QP is in ERR and
  // every later WR flushes.
  EXPECT_EQ(ra[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(ra[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(a_->engine.counters().rcvd_rnr_err, 3u);  // the first try and two retries
  EXPECT_EQ(qa_->state(), IBV_QPS_ERR);
}

struct LossProfile {
  uint64_t seed;
  uint32_t loss_ppm;
  uint32_t duplicate_ppm;
  uint32_t reorder_ppm;
  uint32_t corrupt_ppm;
  size_t message_bytes;
};

class EngineLossTest : public EngineE2eTest, public ::testing::WithParamInterface<LossProfile> {
 protected:
  static net::SimOptions lossy() {
    const LossProfile& p = GetParam();
    net::SimOptions o;
    o.seed = p.seed;
    o.loss_ppm = p.loss_ppm;
    o.duplicate_ppm = p.duplicate_ppm;
    o.reorder_ppm = p.reorder_ppm;
    o.corrupt_ppm = p.corrupt_ppm;
    return o;
  }
  EngineLossTest() : EngineE2eTest(lossy()) {}
};

TEST_P(EngineLossTest, EveryOperationSurvivesLossDuplicationReorderAndCorruption) {
  make_hosts();
  QpParams p;
  p.mtu = IBV_MTU_1024;
  p.timeout = 8;
  make_pair(p);
  constexpr int kMessages = 40;
  const size_t kLen = GetParam().message_bytes;
  std::vector<uint8_t> src(kLen * kMessages), rbuf(kLen * kMessages, 0), wbuf(kLen, 0), rsrc(kLen),
      rdst(kLen * kMessages, 0);
  fill_pattern(src, 9);
  fill_pattern(rsrc, 10);
  auto* mr_src = a_->reg(src.data(), src.size(), 0);
  auto* mr_rdst = a_->reg(rdst.data(), rdst.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_rbuf = b_->reg(rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_w = b_->reg(wbuf.data(), wbuf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto* mr_r = b_->reg(rsrc.data(), rsrc.size(), IBV_ACCESS_REMOTE_READ);
  alignas(8) static uint64_t counter = 0;
  alignas(8) static uint64_t fetched[kMessages] = {};
  counter = 0;
  alignas(8) static uint64_t stored = 0;
  stored = 0;
  auto* mr_s = b_->reg(&stored, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto* mr_c = b_->reg(&counter, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  auto* mr_f = a_->reg(fetched, sizeof(fetched), IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < kMessages; ++i)
    ASSERT_EQ(post_recv(qb_, 100 + i, sge(rbuf.data() + i * kLen, kLen, mr_rbuf)), 0);
  int posted = 0;
  for (int i = 0; i < kMessages; ++i) {
    ibv_sge s = sge(src.data() + i * kLen, kLen, mr_src);
    ibv_sge rs = sge(rdst.data() + i * kLen, kLen, mr_rdst);
    ibv_sge fs = sge(&fetched[i], 8, mr_f);
    const uint64_t value = static_cast<uint64_t>(i);
    ibv_sge vs = {reinterpret_cast<uint64_t>(&value), 8, 0};
    ibv_send_wr wr;
    switch (i % 4) {
      case 0:
      case 1:
        wr = send_wr(i, IBV_WR_SEND, &s);
        break;
      case 2:
        wr = send_wr(i, IBV_WR_RDMA_WRITE, &s);
        wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(wbuf.data());
        wr.wr.rdma.rkey = mr_w->rkey();
        ASSERT_EQ(post_send(qa_, wr), 0);
        ++posted;
        // An ATOMIC WRITE of i, inline: a duplicate must never store an older value again.
        wr = send_wr(2000 + i, IBV_WR_ATOMIC_WRITE, &vs);
        wr.send_flags |= IBV_SEND_INLINE;
        wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(&stored);
        wr.wr.rdma.rkey = mr_s->rkey();
        break;
      default: {
        wr = send_wr(i, IBV_WR_RDMA_READ, &rs);
        wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(rsrc.data());
        wr.wr.rdma.rkey = mr_r->rkey();
        ASSERT_EQ(post_send(qa_, wr), 0);
        ++posted;
        wr = send_wr(1000 + i, IBV_WR_ATOMIC_FETCH_AND_ADD, &fs);
        wr.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&counter);
        wr.wr.atomic.rkey = mr_c->rkey();
        wr.wr.atomic.compare_add = 1;
        break;
      }
    }
    ASSERT_EQ(post_send(qa_, wr), 0);
    ++posted;
    if (posted > 48) {  // keep within the SQ size: wait for some completions
      auto done = wait_cqes(*a_, static_cast<size_t>(posted));
      for (const ibv_wc& wc : done) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
      posted = 0;
    }
  }
  auto ra = wait_cqes(*a_, static_cast<size_t>(posted));
  for (const ibv_wc& wc : ra) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  world_.run_until_idle(world_.clock().now_ns() + 100'000'000);
  std::vector<ibv_wc> rb = b_->poll_cq();
  size_t sends = 0;
  for (const ibv_wc& wc : rb) {
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ++sends;
  }
  EXPECT_EQ(sends, size_t{kMessages / 2});
  for (int i = 0; i < kMessages; ++i) {
    if (i % 4 < 2) {
      const int slot = (i / 4) * 2 + (i % 4);
      EXPECT_EQ(0, std::memcmp(rbuf.data() + slot * kLen, src.data() + i * kLen, kLen)) << i;
    } else if (i % 4 == 3) {
      EXPECT_EQ(0, std::memcmp(rdst.data() + i * kLen, rsrc.data(), kLen)) << i;
    }
  }
  // The atomic ran exactly once per WR (IBA 9.7.5.2.2: never re-executed on a duplicate).
  EXPECT_EQ(counter, uint64_t{kMessages / 4});
  EXPECT_EQ(stored, uint64_t{kMessages - 2});  // the last ATOMIC WRITE's value
  if (GetParam().loss_ppm >= 100'000) {
    EXPECT_GT(a_->engine.counters().completer_retry_err, 0u);
  }
}

std::vector<LossProfile> loss_profiles() {
  std::vector<LossProfile> out;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    out.push_back({seed, 100'000, 20'000, 20'000, 10'000, 5000});     // 10% loss, 5 KB messages
    out.push_back({seed, 100'000, 50'000, 100'000, 20'000, 20'000});  // 20 KB, more reorder
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Profiles, EngineLossTest, ::testing::ValuesIn(loss_profiles()));

TEST_F(EngineE2eTest, PartitionRetryExceededThenFlush) {
  make_hosts();
  QpParams p;
  p.retry_cnt = 3;
  p.timeout = 5;  // 131 us
  make_pair(p);
  world_.network().partition(net::HostSet{a_->id}, net::HostSet{b_->id});
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, nullptr, 0)), 0);
  ASSERT_EQ(post_send(qa_, send_wr(2, IBV_WR_SEND, nullptr, 0, 0)), 0);  // unsignaled
  ibv_sge none{};
  ASSERT_EQ(post_recv(qa_, 3, none), 0);
  auto ra = wait_cqes(*a_, 3);
  ASSERT_EQ(ra.size(), 3u);
  EXPECT_EQ(ra[0].wr_id, 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(ra[1].wr_id, 2u);
  EXPECT_EQ(ra[1].status, IBV_WC_WR_FLUSH_ERR);  // flushed WRs complete even when unsignaled
  EXPECT_EQ(ra[2].wr_id, 3u);
  EXPECT_EQ(ra[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(a_->engine.counters().completer_retry_err, 3u);
  EXPECT_EQ(a_->engine.counters().retry_exceeded_err, 1u);
  EXPECT_EQ(qa_->state(), IBV_QPS_ERR);
  // The failure came within the retry budget: (retry_cnt + 1) timeouts of 4.096 us << 5.
  EXPECT_LE(world_.clock().now_ns(), 4 * (kAckTimeoutBaseNs << 5) + 1'000'000);
  // Posting in ERR flushes at once.
  ASSERT_EQ(post_send(qa_, send_wr(4, IBV_WR_SEND, nullptr, 0)), 0);
  auto more = wait_cqes(*a_, 1);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(EngineE2eTest, RemoteAccessErrorOnBadRkey) {
  make_pair();
  std::vector<uint8_t> src(16), dst(16);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);  // no REMOTE_WRITE
  ibv_sge s = sge(src.data(), 16, mr_a);
  ibv_send_wr wr = send_wr(1, IBV_WR_RDMA_WRITE, &s);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  wr.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, wr), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  // IBA 9.7.5.2.8: access violation → NAK Remote Access Error → REM_ACCESS_ERR; both QPs ERR.
  EXPECT_EQ(ra[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(qa_->state(), IBV_QPS_ERR);
  EXPECT_EQ(qb_->state(), IBV_QPS_ERR);
}

TEST_F(EngineE2eTest, ZeroLengthOperations) {
  make_pair();
  std::vector<uint8_t> dst(16, 0x5A);
  auto* mr_b = b_->reg(dst.data(), dst.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_EQ(post_recv(qb_, 1, sge(dst.data(), 16, mr_b)), 0);
  // IBA 9.5: zero-length SEND, WRITE and READ are single packets with no payload.
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, nullptr, 0)), 0);
  ibv_send_wr w = send_wr(2, IBV_WR_RDMA_WRITE, nullptr, 0);
  w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  w.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, w), 0);
  ibv_send_wr r = send_wr(3, IBV_WR_RDMA_READ, nullptr, 0);
  r.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  r.wr.rdma.rkey = mr_b->rkey();
  ASSERT_EQ(post_send(qa_, r), 0);
  auto ra = wait_cqes(*a_, 3);
  ASSERT_EQ(ra.size(), 3u);
  for (const ibv_wc& wc : ra) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  auto rb = wait_cqes(*b_, 1);
  EXPECT_EQ(rb[0].byte_len, 0u);
  for (uint8_t v : dst) EXPECT_EQ(v, 0x5A);
}

TEST_F(EngineE2eTest, SharedReceiveQueueServesTwoQps) {
  make_hosts();
  ibv_srq_attr sattr = {};
  sattr.max_wr = 16;
  sattr.max_sge = 1;
  provider::Srq* srq = b_->dev.create_srq(b_->pd, sattr).value();
  QpParams pa;
  QpParams pb;
  pb.srq = srq;
  provider::Qp* a1 = a_->create_qp(pa);
  provider::Qp* a2 = a_->create_qp(pa);
  provider::Qp* b1 = b_->create_qp(pb);
  provider::Qp* b2 = b_->create_qp(pb);
  QpParams rev = pa;
  std::swap(rev.sq_psn, rev.rq_psn);
  QpParams rev_b = pb;
  std::swap(rev_b.sq_psn, rev_b.rq_psn);
  connect(a1, b_->addr, b1->qp_num(), pa);
  connect(a2, b_->addr, b2->qp_num(), pa);
  connect(b1, a_->addr, a1->qp_num(), rev_b);
  connect(b2, a_->addr, a2->qp_num(), rev_b);
  std::vector<uint8_t> dst(256, 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  for (int i = 0; i < 2; ++i) {
    ibv_sge s = sge(dst.data() + 128 * i, 128, mr_b);
    ibv_recv_wr wr = {};
    wr.wr_id = 50 + i;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(srq->post_recv(&wr, &bad).error(), 0);
  }
  const char msg[] = "x";
  ibv_sge s{reinterpret_cast<uint64_t>(msg), 1, 0};
  ASSERT_EQ(post_send(a1, send_wr(1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE)), 0);
  ASSERT_EQ(post_send(a2, send_wr(2, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE)), 0);
  auto rb = wait_cqes(*b_, 2);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_NE(rb[0].qp_num, rb[1].qp_num);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rb[1].status, IBV_WC_SUCCESS);
  // A QP on an SRQ entering ERR raises LAST_WQE_REACHED and leaves the SRQ's WQEs alone.
  ibv_qp_attr err = {};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(b1->modify(err, IBV_QP_STATE).error(), 0);
  bool last_wqe = false;
  while (auto ev = b_->dev.async_events().try_pop())
    last_wqe |= ev->type == IBV_EVENT_QP_LAST_WQE_REACHED && ev->qp == b1;
  EXPECT_TRUE(last_wqe);
}

TEST_F(EngineE2eTest, ModifyToErrorFlushesReceiveQueue) {
  make_pair();
  std::vector<uint8_t> dst(16);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 1, sge(dst.data(), 16, mr_b)), 0);
  ASSERT_EQ(post_recv(qb_, 2, sge(dst.data(), 16, mr_b)), 0);
  ibv_qp_attr err = {};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(qb_->modify(err, IBV_QP_STATE).error(), 0);
  auto rb = b_->poll_cq();
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wr_id, 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(rb[1].wr_id, 2u);
  // Receives posted in ERR flush too (IBA 10.3.1.6).
  ASSERT_EQ(post_recv(qb_, 3, sge(dst.data(), 16, mr_b)), 0);
  auto more = wait_cqes(*b_, 1);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(EngineE2eTest, SqdDrainsThenResumes) {
  make_pair();
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, nullptr, 0)), 0);
  ibv_qp_attr sqd = {};
  sqd.qp_state = IBV_QPS_SQD;
  sqd.en_sqd_async_notify = 1;
  // The first WR is already on the wire when the drain starts only if the engine ran; here
  // the engine has not polled yet, so nothing new may start.
  ASSERT_EQ(qa_->modify(sqd, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY).error(), 0);
  world_.run_until_idle(world_.clock().now_ns() + 1'000'000);
  EXPECT_EQ(a_->engine.counters().sent_pkts, 0u);
  bool drained = false;
  while (auto ev = a_->dev.async_events().try_pop()) drained |= ev->type == IBV_EVENT_SQ_DRAINED;
  EXPECT_TRUE(drained);
  ibv_qp_attr rts = {};
  rts.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(qa_->modify(rts, IBV_QP_STATE).error(), 0);
  std::vector<uint8_t> dst(4);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 9, sge(dst.data(), 4, mr_b)), 0);
  auto ra = wait_cqes(*a_, 1);
  ASSERT_EQ(ra.size(), 1u);
  EXPECT_EQ(ra[0].status, IBV_WC_SUCCESS);
}

TEST_F(EngineE2eTest, Ipv6Hosts) {
  a_ = std::make_unique<SimHost>(world_, *net::Address::parse("fd00::1"));
  b_ = std::make_unique<SimHost>(world_, *net::Address::parse("fd00::2"));
  make_pair();
  std::vector<uint8_t> src(3000), dst(3000, 0);
  fill_pattern(src, 11);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 1, sge(dst.data(), 3000, mr_b)), 0);
  ibv_sge s = sge(src.data(), 3000, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);
  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(src, dst);
  EXPECT_EQ(b_->engine.counters().drop_icrc, 0u);
}

// UC (IBA 9.8.3): a lost packet abandons the rest of its message; the next message is
// delivered into the same receive WQE.
TEST_F(EngineE2eTest, UcGapDropsTheMessage) {
  make_hosts();
  QpParams p;
  p.type = IBV_QPT_UC;
  p.mtu = IBV_MTU_1024;
  make_pair(p);
  std::vector<uint8_t> src(3000), dst(3000, 0);
  fill_pattern(src, 12);
  auto* mr_a = a_->reg(src.data(), src.size(), 0);
  auto* mr_b = b_->reg(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(post_recv(qb_, 1, sge(dst.data(), 3000, mr_b)), 0);
  // Drop the second packet (the Middle) of the first message.
  uint64_t seen = 0;
  world_.network().set_trace([&](const net::SimEvent& e) {
    if (e.kind == net::SimEventKind::kSend && e.src == a_->id && ++seen == 2)
      world_.network().partition(net::HostSet{a_->id}, net::HostSet{b_->id});
    if (e.kind == net::SimEventKind::kDropPartition) world_.network().heal_all();
  });
  ibv_sge s = sge(src.data(), 3000, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(1, IBV_WR_SEND, &s)), 0);
  wait_cqes(*a_, 1);
  world_.run_until_idle(world_.clock().now_ns() + 1'000'000);
  EXPECT_TRUE(b_->poll_cq().empty());
  world_.network().set_trace({});
  ibv_sge s2 = sge(src.data(), 100, mr_a);
  ASSERT_EQ(post_send(qa_, send_wr(2, IBV_WR_SEND, &s2)), 0);
  auto rb = wait_cqes(*b_, 1);
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].wr_id, 1u);
  EXPECT_EQ(rb[0].byte_len, 100u);
  EXPECT_GE(b_->engine.counters().drop_uc_message + b_->engine.counters().out_of_seq_request, 1u);
}

// An application that sees a send completion may post again at once, so the WQE's send-queue
// slot must be free by then: with max_send_wr 1, a READ posted from inside the completion
// notification of the previous one is accepted (qperf's rc_rdma_read_lat posts its next READ
// right after polling the last one's completion; it failed with ENOMEM when the completion was
// pushed before the WQE left the queue).
TEST_F(EngineE2eTest, SendQueueSlotIsFreeWhenTheCompletionIsVisible) {
  make_hosts();
  QpParams p;
  provider::QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = a_->pd;
  init.send_cq = a_->cq;
  init.recv_cq = a_->cq;
  init.cap = {1, 1, 1, 1, 0};
  qa_ = a_->dev.create_qp(init).value();
  qb_ = b_->create_qp(p);
  QpParams pb = p;
  std::swap(pb.sq_psn, pb.rq_psn);
  connect(qa_, b_->addr, qb_->qp_num(), p);
  connect(qb_, a_->addr, qa_->qp_num(), pb);
  std::vector<uint8_t> remote(64), local(64, 0);
  fill_pattern(remote, 9);
  auto* mr_a = a_->reg(local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  auto* mr_b = b_->reg(remote.data(), remote.size(), IBV_ACCESS_REMOTE_READ);
  ibv_sge s = sge(local.data(), 64, mr_a);
  auto read_wr = [&](uint64_t id) {
    ibv_send_wr wr = send_wr(id, IBV_WR_RDMA_READ, &s);
    wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(remote.data());
    wr.wr.rdma.rkey = mr_b->rkey();
    return wr;
  };
  std::vector<int> posted_from_the_notification;
  a_->cq->set_notify([&](provider::Cq&) {
    if (posted_from_the_notification.empty())
      posted_from_the_notification.push_back(post_send(qa_, read_wr(2)));
  });
  a_->cq->req_notify(false);
  ASSERT_EQ(post_send(qa_, read_wr(1)), 0);
  auto ra = wait_cqes(*a_, 2);
  EXPECT_EQ(posted_from_the_notification, std::vector<int>{0});
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(ra[0].wr_id, 1u);
  EXPECT_EQ(ra[1].wr_id, 2u);
  EXPECT_EQ(ra[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(local, remote);
}

}  // namespace
}  // namespace urdma::engine::testing
