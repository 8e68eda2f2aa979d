// The extended verbs API of our libibverbs.so.1 through <infiniband/verbs.h>, as a program
// written for it calls it: ibv_create_cq_ex with ibv_start_poll / ibv_next_poll / ibv_end_poll
// and the ibv_wc_read_* accessors, ibv_create_qp_ex with send_ops_flags, ibv_qp_to_qp_ex and
// the ibv_wr_* builders, ibv_query_device_ex's extended fields.
//
// Real traffic: two RC (or UD) QPs of this process over UDP on loopback in this binary's fresh
// network namespace (netns_main.cc), a real urdmad. Oracles are this file's own: seeded bytes
// and an FNV-1a checksum, atomic results computed here, the errnos of ibv_create_cq_ex(3),
// ibv_create_qp_ex(3) and ibv_wr_post(3).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <ctime>
#include <random>
#include <thread>
#include <vector>

#include "verbs_test_env.h"
#include "support/checksum.h"

namespace urdma::verbs_test {
namespace {

using test_support::fnv1a;

constexpr uint8_t kPort = 1;
constexpr uint32_t kQkey = 0x11111111;

std::vector<uint8_t> seeded(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

ibv_gid loopback_v4_gid() {  // ::ffff:127.0.0.1
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = 127;
  g.raw[15] = 1;
  return g;
}

// One completion as the extended interface reports it.
struct ExWc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len, qp_num, src_qp;
  unsigned wc_flags;
  __be32 imm;
};

// Polls `cq` through start/next/end_poll until `n` completions came (10 s at most).
std::vector<ExWc> poll_ex(ibv_cq_ex* cq, size_t n) {
  std::vector<ExWc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_poll_cq_attr attr{};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == ENOENT) continue;
    EXPECT_EQ(rc, 0);
    if (rc != 0) break;
    do {
      out.push_back({cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq),
                     ibv_wc_read_qp_num(cq), ibv_wc_read_src_qp(cq), ibv_wc_read_wc_flags(cq),
                     ibv_wc_read_imm_data(cq)});
    } while (out.size() < n && (rc = ibv_next_poll(cq)) == 0);
    EXPECT_TRUE(rc == 0 || rc == ENOENT) << rc;
    ibv_end_poll(cq);
  }
  return out;
}

// Nothing completes on `cq` for 300 ms (the engine is driven by the polls meanwhile).
bool stays_empty(ibv_cq* cq) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < end) {
    ibv_wc wc;
    if (ibv_poll_cq(cq, 1, &wc) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class VerbsEx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!netns_failure().empty()) GTEST_SKIP() << "no fresh network namespace: " << netns_failure();
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ASSERT_NE(list_[0], nullptr);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr) << std::strerror(errno);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr) << std::strerror(errno);
  }
  void TearDown() override {
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_) ibv_free_device_list(list_);
  }

  ibv_cq_ex* make_cq_ex(uint64_t wc_flags = IBV_WC_STANDARD_FLAGS) {
    ibv_cq_init_attr_ex a{};
    a.cqe = 256;
    a.wc_flags = wc_flags;
    ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &a);
    EXPECT_NE(cq, nullptr) << std::strerror(errno);
    return cq;
  }

  ibv_qp* make_qp_ex(ibv_qp_type type, ibv_cq* cq, uint64_t ops, uint32_t max_send_wr = 64,
                     ibv_pd* pd = nullptr) {
    ibv_qp_init_attr_ex a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = type;
    a.cap.max_send_wr = max_send_wr;
    a.cap.max_recv_wr = 64;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 4;
    a.cap.max_inline_data = 64;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = pd ? pd : pd_;
    a.send_ops_flags = ops;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    EXPECT_NE(qp, nullptr) << std::strerror(errno);
    return qp;
  }

  void connect(ibv_qp* qp, uint32_t remote_qpn) {
    ibv_port_attr port{};
    ASSERT_EQ(ibv_query_port(ctx_, kPort, &port), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = kPort;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    a.qkey = kQkey;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    mask = IBV_QP_STATE;
    if (qp->qp_type == IBV_QPT_RC) {
      a.path_mtu = port.active_mtu;
      a.dest_qp_num = remote_qpn;
      a.rq_psn = 7;
      a.max_dest_rd_atomic = 16;
      a.min_rnr_timer = 12;
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = loopback_v4_gid();
      a.ah_attr.grh.hop_limit = 64;
      a.ah_attr.port_num = kPort;
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (qp->qp_type == IBV_QPT_RC)
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
  }

  void post_recv(ibv_qp* qp, uint64_t wr_id, void* buf, uint32_t len, uint32_t lkey) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), len, lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
};

constexpr uint64_t kRcOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE;

// ---- the extended CQ ----

TEST_F(VerbsEx, CreateCqExRefusesWhatItCannotDo) {
  ibv_cq_init_attr_ex a{};
  a.cqe = 16;
  a.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_CVLAN;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);  // ibv_create_cq_ex(3): unsupported wc_flags
  a.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  a.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  a.comp_mask = 1u << 7;  // no such attribute
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  a.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  a.comp_mask = 0;
  a.comp_vector = 5;  // one completion vector
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Accepted: SINGLE_THREADED (a hint) with the standard fields.
  a.comp_vector = 0;
  a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  a.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  a.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &a);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_GE(cq->cqe, 16);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cq, &pa), ENOENT);  // empty: no end_poll follows
  pa.comp_mask = 1;
  EXPECT_EQ(ibv_start_poll(cq, &pa), EINVAL);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// A completion the extended poll did not reach stays in the CQ: ibv_poll_cq and the next
// start_poll find them in order.
TEST_F(VerbsEx, CqExLeavesUnreadCompletionsForThePlainPoll) {
  ibv_cq_ex* cq = make_cq_ex();
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cq), kRcOps);
  ibv_qp* b = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cq), kRcOps);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE |
                                                           IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  ibv_wr_start(x);
  for (uint64_t id = 1; id <= 4; ++id) {
    x->wr_id = id;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, mr->rkey, reinterpret_cast<uintptr_t>(buf.data()) + 32);
    ibv_wr_set_sge(x, mr->lkey, reinterpret_cast<uintptr_t>(buf.data()), 8);
  }
  ASSERT_EQ(ibv_wr_complete(x), 0);
  // Wait until all four are in the CQ, through the plain interface's view of it? No: take one
  // with the extended poll first, then the rest with ibv_poll_cq.
  std::vector<ExWc> first = poll_ex(cq, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].wr_id, 1u);
  EXPECT_EQ(first[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(first[0].qp_num, a->qp_num);
  std::vector<uint64_t> rest;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (rest.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc;
    if (ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc) == 1) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      rest.push_back(wc.wr_id);
    }
  }
  EXPECT_EQ(rest, (std::vector<uint64_t>{2, 3}));
  std::vector<ExWc> last = poll_ex(cq, 1);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].wr_id, 4u);
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// A completion channel on an extended CQ: armed with ibv_req_notify_cq on ibv_cq_ex_to_cq,
// the event names that CQ.
TEST_F(VerbsEx, CqExWithACompletionChannel) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 32;
  ca.channel = ch;
  ca.cq_context = this;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  ibv_cq* plain = ibv_cq_ex_to_cq(cq);
  EXPECT_EQ(plain->channel, ch);
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, plain, IBV_QP_EX_WITH_SEND);
  ibv_qp* b = make_qp_ex(IBV_QPT_RC, plain, IBV_QP_EX_WITH_SEND);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> rbuf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  post_recv(b, 9, rbuf.data(), 64, mr->lkey);
  ASSERT_EQ(ibv_req_notify_cq(plain, 0), 0);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ibv_wr_start(x);
  x->wr_id = 10;
  x->wr_flags = 0;  // unsignaled: only the receive completes
  ibv_wr_send(x);
  char msg[] = "through the channel";
  ibv_wr_set_inline_data(x, msg, sizeof msg);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);  // blocking; the engine thread runs
  EXPECT_EQ(ev_cq, plain);
  EXPECT_EQ(ev_ctx, this);
  ibv_ack_cq_events(ev_cq, 1);
  std::vector<ExWc> wcs = poll_ex(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wcs[0].byte_len, sizeof msg);
  EXPECT_STREQ(reinterpret_cast<char*>(rbuf.data()), msg);
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(plain), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// ---- the extended QP and the ibv_wr_* builders ----

TEST_F(VerbsEx, CreateQpExRefusesWhatItCannotDo) {
  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr_ex a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap = {4, 4, 1, 1, 0};
  a.pd = pd_;
  auto refused = [&](int err) {
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    if (qp) ibv_destroy_qp(qp);
    return qp == nullptr && errno == err;
  };
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
  EXPECT_TRUE(refused(EOPNOTSUPP));
  a.qp_type = IBV_QPT_UC;
  a.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;  // RC only
  EXPECT_TRUE(refused(EOPNOTSUPP));
  a.qp_type = IBV_QPT_UD;
  a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;  // no RDMA on UD
  EXPECT_TRUE(refused(EOPNOTSUPP));
  a.qp_type = IBV_QPT_RC;
  a.send_ops_flags = IBV_QP_EX_WITH_SEND;
  a.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;  // no PD
  EXPECT_TRUE(refused(EINVAL));
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  EXPECT_TRUE(refused(EOPNOTSUPP));
  a.comp_mask = IBV_QP_INIT_ATTR_PD | (1u << 12);  // unknown attribute
  EXPECT_TRUE(refused(EINVAL));
  // Without SEND_OPS_FLAGS the QP has no extended interface (rdma-core: ibv_qp_to_qp_ex NULL).
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  a.create_flags = 0;
  ibv_qp* plain = ibv_create_qp_ex(ctx_, &a);
  ASSERT_NE(plain, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_qp_to_qp_ex(plain), nullptr);
  EXPECT_EQ(ibv_destroy_qp(plain), 0);
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = kRcOps;
  ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(qp), x);
  EXPECT_EQ(&x->qp_base, qp);
  EXPECT_GE(a.cap.max_send_wr, 4u);  // the capacities as created come back in attr
  // Posting before RTS: the batch fails at wr_complete (EINVAL) and nothing is posted.
  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, 0, 0, 0);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Every RC builder once, data checked at the far side; completions read with the extended CQ.
TEST_F(VerbsEx, RcBuildersMoveTheRightBytes) {
  ibv_cq_ex* cqa = make_cq_ex();
  ibv_cq_ex* cqb = make_cq_ex();
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cqa), kRcOps);
  ibv_qp* b = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cqb), kRcOps);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);

  constexpr size_t kBytes = 256 * 1024;
  std::vector<uint8_t> src = seeded(kBytes, 11);
  std::vector<uint8_t> dst(kBytes), back(kBytes), rbuf(4096);
  alignas(8) uint64_t remote_counter = 1000, atomic_result[2] = {0, 0};
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                  IBV_ACCESS_REMOTE_ATOMIC;
  ibv_mr* msrc = ibv_reg_mr(pd_, src.data(), kBytes, acc);
  ibv_mr* mdst = ibv_reg_mr(pd_, dst.data(), kBytes, acc);
  ibv_mr* mback = ibv_reg_mr(pd_, back.data(), kBytes, acc);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), acc);
  ibv_mr* mctr = ibv_reg_mr(pd_, &remote_counter, sizeof remote_counter, acc);
  ibv_mr* mres = ibv_reg_mr(pd_, atomic_result, sizeof atomic_result, acc);
  ASSERT_TRUE(msrc && mdst && mback && mr && mctr && mres);
  post_recv(b, 100, rbuf.data(), 2048, mr->lkey);
  post_recv(b, 101, rbuf.data() + 2048, 2048, mr->lkey);
  post_recv(b, 102, rbuf.data(), 16, mr->lkey);  // for WRITE_WITH_IMM

  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  ibv_wr_start(x);
  // 1: WRITE of the whole buffer as a two-SGE list (halves).
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, mdst->rkey, addr(dst.data()));
  ibv_sge halves[2] = {{addr(src.data()), kBytes / 2, msrc->lkey},
                       {addr(src.data() + kBytes / 2), kBytes / 2, msrc->lkey}};
  ibv_wr_set_sge_list(x, 2, halves);
  halves[0].length = halves[1].length = 1;  // the list was copied at the call
  // 2: SEND with immediate, inline data from two buffers (reused right after the call).
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(0xabcd0123));
  char part1[] = "inline-";
  char part2[] = "gathered";
  ibv_data_buf bufs[2] = {{part1, 7}, {part2, 8}};
  ibv_wr_set_inline_data_list(x, 2, bufs);
  std::memset(part1, 'X', sizeof part1);
  // 3: SEND of 1 KiB from src.
  x->wr_id = 3;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, msrc->lkey, addr(src.data() + 5000), 1024);
  // 4: FETCH_ADD 5 on the counter, old value into atomic_result[0].
  x->wr_id = 4;
  ibv_wr_atomic_fetch_add(x, mctr->rkey, addr(&remote_counter), 5);
  ibv_wr_set_sge(x, mres->lkey, addr(&atomic_result[0]), 8);
  // 5: CMP_SWP 1005 -> 77, old value into atomic_result[1].
  x->wr_id = 5;
  ibv_wr_atomic_cmp_swp(x, mctr->rkey, addr(&remote_counter), 1005, 77);
  ibv_wr_set_sge(x, mres->lkey, addr(&atomic_result[1]), 8);
  // 6: WRITE_WITH_IMM of 16 bytes (consumes receive 102... in posting order: 100, 101, 102).
  x->wr_id = 6;
  ibv_wr_rdma_write_imm(x, mdst->rkey, addr(dst.data()), htonl(66));
  ibv_wr_set_sge(x, msrc->lkey, addr(src.data()), 16);
  ASSERT_EQ(ibv_wr_complete(x), 0);

  std::vector<ExWc> sa = poll_ex(cqa, 6);
  ASSERT_EQ(sa.size(), 6u);
  const ibv_wc_opcode want_ops[6] = {IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_SEND,
                                     IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP, IBV_WC_RDMA_WRITE};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(sa[i].wr_id, i + 1);
    EXPECT_EQ(sa[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(sa[i].status);
    EXPECT_EQ(sa[i].opcode, want_ops[i]) << i;
    EXPECT_EQ(sa[i].qp_num, a->qp_num);
  }
  std::vector<ExWc> rb = poll_ex(cqb, 3);
  ASSERT_EQ(rb.size(), 3u);
  EXPECT_EQ(rb[0].wr_id, 100u);
  EXPECT_EQ(rb[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(rb[0].byte_len, 15u);
  EXPECT_TRUE(rb[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(rb[0].imm), 0xabcd0123u);
  EXPECT_EQ(std::memcmp(rbuf.data(), "inline-gathered", 15), 0);
  EXPECT_EQ(rb[1].wr_id, 101u);
  EXPECT_EQ(rb[1].byte_len, 1024u);
  EXPECT_FALSE(rb[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(fnv1a(rbuf.data() + 2048, 1024), fnv1a(src.data() + 5000, 1024));
  EXPECT_EQ(rb[2].wr_id, 102u);
  EXPECT_EQ(rb[2].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(rb[2].imm), 66u);
  for (const ExWc& w : rb) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_EQ(w.qp_num, b->qp_num);  // (src_qp is defined for UD only, ibv_poll_cq(3))
  }
  EXPECT_EQ(fnv1a(dst.data(), kBytes), fnv1a(src.data(), kBytes));
  EXPECT_EQ(atomic_result[0], 1000u);
  EXPECT_EQ(atomic_result[1], 1005u);
  EXPECT_EQ(remote_counter, 77u);

  // 7: READ the whole buffer back into `back`.
  ibv_wr_start(x);
  x->wr_id = 7;
  ibv_wr_rdma_read(x, mdst->rkey, addr(dst.data()));
  ibv_wr_set_sge(x, mback->lkey, addr(back.data()), kBytes);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  std::vector<ExWc> rd = poll_ex(cqa, 1);
  ASSERT_EQ(rd.size(), 1u);
  EXPECT_EQ(rd[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(rd[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rd[0].byte_len, kBytes);
  EXPECT_EQ(fnv1a(back.data(), kBytes), fnv1a(src.data(), kBytes));

  // 8: ATOMIC WRITE of 8 bytes to the counter, taken from the caller's buffer at the call.
  ibv_wr_start(x);
  x->wr_id = 8;
  alignas(8) uint64_t word = 0x0123456789abcdef;
  ibv_wr_atomic_write(x, mctr->rkey, addr(&remote_counter), &word);
  word = 0;
  ASSERT_EQ(ibv_wr_complete(x), 0);
  std::vector<ExWc> aw = poll_ex(cqa, 1);
  ASSERT_EQ(aw.size(), 1u);
  EXPECT_EQ(aw[0].wr_id, 8u);
  EXPECT_EQ(aw[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(aw[0].status);
  EXPECT_EQ(aw[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(remote_counter, 0x0123456789abcdefu);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {msrc, mdst, mback, mr, mctr, mres}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  for (ibv_cq_ex* cq : {cqa, cqb}) EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// ibv_wr_post(3): errors are reported by wr_complete and nothing of the failed batch is posted;
// wr_abort discards a batch.
TEST_F(VerbsEx, AFailedBatchPostsNothing) {
  ibv_cq_ex* cq = make_cq_ex();
  ASSERT_NE(cq, nullptr);
  ibv_cq* plain = ibv_cq_ex_to_cq(cq);
  // SEND and WRITE only; send queue of 8 (rounded to at least that).
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, plain, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE, 8);
  ibv_qp* b = make_qp_ex(IBV_QPT_RC, plain, IBV_QP_EX_WITH_SEND, 8);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = seeded(4096, 3), dst(4096, 0);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* md = ibv_reg_mr(pd_, dst.data(), dst.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_TRUE(ms && md);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  ibv_qp_attr qattr{};
  ibv_qp_init_attr qinit{};
  ASSERT_EQ(ibv_query_qp(a, &qattr, IBV_QP_CAP, &qinit), 0);
  const uint32_t max_inline = qinit.cap.max_inline_data;
  const uint32_t max_sge = qinit.cap.max_send_sge;
  const uint32_t max_wr = qinit.cap.max_send_wr;
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  // A good WRITE first in each batch: it must not land when a later WR is bad.
  auto good_write = [&](uint64_t id) {
    x->wr_id = id;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, md->rkey, addr(dst.data()));
    ibv_wr_set_sge(x, ms->lkey, addr(src.data()), 4096);
  };

  // (1) an operation not asked for in send_ops_flags (READ)
  ibv_wr_start(x);
  good_write(1);
  ibv_wr_rdma_read(x, md->rkey, addr(dst.data()));
  ibv_wr_set_sge(x, ms->lkey, addr(src.data()), 8);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  // (2) inline data over max_inline_data
  std::vector<uint8_t> big(max_inline + 1, 7);
  ibv_wr_start(x);
  good_write(2);
  ibv_wr_send(x);
  ibv_wr_set_inline_data(x, big.data(), big.size());
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  // (3) more SGEs than max_send_sge
  std::vector<ibv_sge> sges(max_sge + 1, ibv_sge{addr(src.data()), 1, ms->lkey});
  ibv_wr_start(x);
  good_write(3);
  ibv_wr_send(x);
  ibv_wr_set_sge_list(x, sges.size(), sges.data());
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  // (4) a setter with no operation started... after a good one it applies to that one; before
  //     any, it is an error.
  ibv_wr_start(x);
  ibv_wr_set_sge(x, ms->lkey, addr(src.data()), 8);
  good_write(4);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  // (5) more WRs than the send queue holds: ENOMEM, none posted
  ibv_wr_start(x);
  for (uint32_t i = 0; i <= max_wr; ++i) good_write(50 + i);
  EXPECT_EQ(ibv_wr_complete(x), ENOMEM);
  // (6) an aborted batch
  ibv_wr_start(x);
  good_write(6);
  ibv_wr_abort(x);
  // (7) complete without start
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);

  EXPECT_TRUE(stays_empty(plain));
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(std::vector<uint8_t>(4096, 0).data(), 4096));

  // The QP is still fine: a good batch goes through and is the first completion.
  ibv_wr_start(x);
  good_write(99);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  std::vector<ExWc> wcs = poll_ex(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 99u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  // A whole send queue in one batch is accepted.
  ibv_wr_start(x);
  for (uint32_t i = 0; i < max_wr; ++i) good_write(200 + i);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  wcs = poll_ex(cq, max_wr);
  ASSERT_EQ(wcs.size(), max_wr);
  for (uint32_t i = 0; i < max_wr; ++i) EXPECT_EQ(wcs[i].wr_id, 200 + i);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {ms, md}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(plain), 0);
}

// UD through the builders: wr_set_ud_addr names the AH and remote QP; the receive completion's
// src_qp and GRH flag come through the extended CQ.
TEST_F(VerbsEx, UdSendWithSetUdAddr) {
  ibv_cq_ex* cq = make_cq_ex();
  ASSERT_NE(cq, nullptr);
  ibv_cq* plain = ibv_cq_ex_to_cq(cq);
  ibv_qp* a = make_qp_ex(IBV_QPT_UD, plain, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
  ibv_qp* b = make_qp_ex(IBV_QPT_UD, plain, IBV_QP_EX_WITH_SEND);
  ASSERT_TRUE(a && b);
  connect(a, 0);
  connect(b, 0);
  constexpr size_t kMsg = 1000;
  std::vector<uint8_t> src = seeded(kMsg, 5), rbuf(40 + kMsg);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(ms && mr);
  post_recv(b, 1, rbuf.data(), static_cast<uint32_t>(rbuf.size()), mr->lkey);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = loopback_v4_gid();
  ah_attr.grh.hop_limit = 64;
  ah_attr.port_num = kPort;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  // Without an address a UD send is refused at wr_complete.
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, ms->lkey, reinterpret_cast<uintptr_t>(src.data()), kMsg);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  ibv_wr_start(x);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(7));
  ibv_wr_set_ud_addr(x, ah, b->qp_num, kQkey);
  ibv_wr_set_sge(x, ms->lkey, reinterpret_cast<uintptr_t>(src.data()), kMsg);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  std::vector<ExWc> wcs = poll_ex(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  const ExWc& recv = wcs[0].opcode == IBV_WC_RECV ? wcs[0] : wcs[1];
  const ExWc& send = wcs[0].opcode == IBV_WC_RECV ? wcs[1] : wcs[0];
  EXPECT_EQ(send.wr_id, 2u);
  EXPECT_EQ(send.opcode, IBV_WC_SEND);
  EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv.byte_len, 40 + kMsg);
  EXPECT_EQ(recv.src_qp, a->qp_num);
  EXPECT_EQ(recv.qp_num, b->qp_num);
  EXPECT_TRUE(recv.wc_flags & IBV_WC_GRH);
  EXPECT_TRUE(recv.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(recv.imm), 7u);
  EXPECT_EQ(fnv1a(rbuf.data() + 40, kMsg), fnv1a(src.data(), kMsg));
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {ms, mr}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(plain), 0);
}

// ibv_query_device_ex: nothing claimed that is not there.
TEST_F(VerbsEx, QueryDeviceExClaimsOnlyWhatIsThere) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  ibv_device_attr plain{};
  ASSERT_EQ(ibv_query_device(ctx_, &plain), 0);
  EXPECT_EQ(ax.orig_attr.max_qp, plain.max_qp);
  EXPECT_EQ(ax.orig_attr.max_qp_wr, plain.max_qp_wr);
  // ODP is real (every MR's pages are faulted in by the CPU when the engine touches them).
  EXPECT_EQ(ax.odp_caps.general_caps,
            uint64_t{IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT});  // Linux >= 5.14
  EXPECT_EQ(ax.odp_caps.per_transport_caps.rc_odp_caps,
            uint32_t{IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                     IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV});
  EXPECT_EQ(ax.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_READ, 0u);
  // Completion timestamps: a 64-bit nanosecond counter (1 GHz).
  EXPECT_EQ(ax.completion_timestamp_mask, ~uint64_t{0});
  EXPECT_EQ(ax.hca_core_clock, 1'000'000u);
  EXPECT_EQ(ax.tso_caps.max_tso, 0u);
  EXPECT_EQ(ax.rss_caps.max_rwq_indirection_tables, 0u);
  EXPECT_EQ(ax.max_wq_type_rq, 0u);
  // Tag matching on RC (provider/srq.h): the ones rdma-core's test_tag_matching reads.
  EXPECT_EQ(ax.tm_caps.flags, uint32_t{IBV_TM_CAP_RC});
  EXPECT_EQ(ax.tm_caps.max_num_tags, 1024u);
  EXPECT_EQ(ax.tm_caps.max_rndv_hdr_size, 64u);
  EXPECT_EQ(ax.tm_caps.max_sge, 1u);
  EXPECT_GT(ax.tm_caps.max_ops, 0u);
  EXPECT_EQ(ax.max_dm_size, 256u * 1024);  // device memory: host memory the device owns
}


// ---- tag matching (IBV_SRQT_TM) ----

struct TmWc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len;
  unsigned flags;
  ibv_wc_tm_info tm;
};

std::vector<TmWc> poll_tm(ibv_cq_ex* cq, size_t n) {
  std::vector<TmWc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_poll_cq_attr attr{};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == ENOENT) continue;
    if (rc != 0) break;
    do {
      TmWc w{cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq),
             ibv_wc_read_wc_flags(cq), {}};
      ibv_wc_read_tm_info(cq, &w.tm);
      out.push_back(w);
    } while (out.size() < n && (rc = ibv_next_poll(cq)) == 0);
    ibv_end_poll(cq);
  }
  return out;
}

// ibv_create_srq_ex(3) / ibv_post_srq_ops(3) / ibv_wc_read_tm_info through the ABI: an eager
// message matched by a tag lands without its TMH, a rendezvous request is READ from the sender
// by the receiver's engine (its QP has no send queue of its own) and answered with a FIN, and
// the completions carry the tag.
TEST_F(VerbsEx, TagMatchingSrqMatchesEagerAndRendezvousMessages) {
  ibv_cq_ex* cq = make_cq_ex(uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_TM_INFO);
  ASSERT_NE(cq, nullptr);
  ibv_srq_init_attr_ex sa{};
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                 IBV_SRQ_INIT_ATTR_TM;
  sa.srq_type = IBV_SRQT_TM;
  sa.pd = pd_;
  sa.cq = ibv_cq_ex_to_cq(cq);
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  sa.tm_cap.max_num_tags = 16;
  sa.tm_cap.max_ops = 8;
  ibv_srq* srq = ibv_create_srq_ex(ctx_, &sa);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  EXPECT_GE(sa.attr.max_wr, 8u);
  ibv_qp* sender = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cq), IBV_QP_EX_WITH_SEND);
  ibv_qp_init_attr ra{};
  ra.send_cq = ibv_cq_ex_to_cq(cq);
  ra.recv_cq = ibv_cq_ex_to_cq(cq);
  ra.srq = srq;
  ra.qp_type = IBV_QPT_RC;
  ibv_qp* receiver = ibv_create_qp(pd_, &ra);  // max_send_wr 0
  ASSERT_NE(receiver, nullptr) << std::strerror(errno);
  connect(sender, receiver->qp_num);
  connect(receiver, sender->qp_num);
  std::vector<uint8_t> src(64 * 1024), dst(64 * 1024, 0), fin(64, 0);
  urdma::test_support::fill_pattern(src, 4);
  ibv_mr* smr = ibv_reg_mr(pd_, src.data(), src.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr* dmr = ibv_reg_mr(pd_, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* fmr = ibv_reg_mr(pd_, fin.data(), fin.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(smr && dmr && fmr);
  post_recv(sender, 900, fin.data(), 64, fmr->lkey);

  auto add = [&](uint64_t wr_id, uint64_t tag, size_t offset, uint32_t len) {
    ibv_sge s{reinterpret_cast<uintptr_t>(dst.data() + offset), len, dmr->lkey};
    ibv_ops_wr op{}, *bad = nullptr;
    op.wr_id = wr_id;
    op.opcode = IBV_WR_TAG_ADD;
    op.flags = IBV_OPS_SIGNALED;
    op.tm.add.recv_wr_id = wr_id;
    op.tm.add.sg_list = &s;
    op.tm.add.num_sge = 1;
    op.tm.add.tag = tag;
    op.tm.add.mask = ~uint64_t{0};
    EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), 0);
    return op.tm.handle;
  };
  add(1, 0x1111, 0, 8192);
  add(2, 0x2222, 8192, 40000);
  auto w = poll_tm(cq, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].opcode, IBV_WC_TM_ADD);
  EXPECT_EQ(w[1].wr_id, 2u);

  auto send = [&](uint8_t op, uint64_t tag, uint32_t len) {
    auto* tmh = reinterpret_cast<ibv_tmh*>(src.data());
    tmh->opcode = op;
    std::memset(tmh->reserved, 0, sizeof tmh->reserved);
    tmh->app_ctx = htonl(0xC0FFEE);
    tmh->tag = htobe64(tag);
    ibv_sge s{reinterpret_cast<uintptr_t>(src.data()), len, smr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 77;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_post_send(sender, &wr, &bad), 0);
  };
  send(IBV_TMH_EAGER, 0x1111, 6000);
  w = poll_tm(cq, 2);
  ASSERT_EQ(w.size(), 2u);
  const TmWc& eager = w[0].opcode == IBV_WC_TM_RECV ? w[0] : w[1];
  EXPECT_EQ(eager.status, IBV_WC_SUCCESS);
  EXPECT_EQ(eager.wr_id, 1u);
  EXPECT_EQ(eager.flags, unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(eager.byte_len, 6000u - sizeof(ibv_tmh));
  EXPECT_EQ(eager.tm.tag, 0x1111u);
  EXPECT_EQ(eager.tm.priv, 0xC0FFEEu);
  EXPECT_EQ(urdma::test_support::fnv1a(dst.data(), 6000 - sizeof(ibv_tmh)),
            urdma::test_support::fnv1a(src.data() + sizeof(ibv_tmh), 6000 - sizeof(ibv_tmh)));

  // Rendezvous: the RVH names 33000 bytes of the sender's buffer.
  auto* rvh = reinterpret_cast<ibv_rvh*>(src.data() + sizeof(ibv_tmh));
  rvh->va = htobe64(reinterpret_cast<uintptr_t>(src.data()) + 16384);
  rvh->rkey = htonl(smr->rkey);
  rvh->len = htonl(33000);
  send(IBV_TMH_RNDV, 0x2222, 64);
  w = poll_tm(cq, 4);  // the SEND's completion, MATCH, the FIN received, DATA_VALID
  ASSERT_EQ(w.size(), 4u);
  std::vector<TmWc> tagged;
  bool fin_seen = false;
  for (const TmWc& c : w) {
    EXPECT_EQ(c.status, IBV_WC_SUCCESS) << c.wr_id;
    if (c.opcode == IBV_WC_TM_RECV) tagged.push_back(c);
    if (c.opcode == IBV_WC_RECV) fin_seen = c.wr_id == 900 && c.byte_len == sizeof(ibv_tmh);
  }
  ASSERT_EQ(tagged.size(), 2u);
  EXPECT_EQ(tagged[0].flags, unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(tagged[0].tm.tag, 0x2222u);
  EXPECT_EQ(tagged[1].flags, unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(tagged[1].wr_id, 2u);
  EXPECT_TRUE(fin_seen);
  EXPECT_EQ(reinterpret_cast<ibv_tmh*>(fin.data())->opcode, IBV_TMH_FIN);
  EXPECT_EQ(be64toh(reinterpret_cast<ibv_tmh*>(fin.data())->tag), 0x2222u);
  EXPECT_EQ(urdma::test_support::fnv1a(dst.data() + 8192, 33000),
            urdma::test_support::fnv1a(src.data() + 16384, 33000));
  EXPECT_TRUE(stays_empty(ibv_cq_ex_to_cq(cq)));

  // Errors a real device gives: a DEL beyond the list, an unknown operation, the ops of a
  // basic SRQ, an SRQ type or transport without tag matching.
  ibv_ops_wr op{}, *bad = nullptr;
  op.opcode = IBV_WR_TAG_DEL;
  op.tm.handle = 16;
  EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), EINVAL);
  EXPECT_EQ(bad, &op);
  const int unknown_opcode = 9;  // stored as a caller may store it: no such enumerator
  std::memcpy(&op.opcode, &unknown_opcode, sizeof unknown_opcode);
  EXPECT_EQ(ibv_post_srq_ops(srq, &op, &bad), EINVAL);
  ibv_srq_init_attr basic_attr{};
  basic_attr.attr.max_wr = 4;
  ibv_srq* basic = ibv_create_srq(pd_, &basic_attr);
  ASSERT_NE(basic, nullptr);
  op.opcode = IBV_WR_TAG_SYNC;
  EXPECT_EQ(ibv_post_srq_ops(basic, &op, &bad), EOPNOTSUPP);
  ibv_qp_init_attr ua = ra;
  ua.qp_type = IBV_QPT_UD;
  ua.cap.max_send_wr = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &ua), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_srq_init_attr_ex bad_attr = sa;
  bad_attr.comp_mask &= ~uint32_t{IBV_SRQ_INIT_ATTR_CQ};
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &bad_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  bad_attr = sa;
  bad_attr.tm_cap.max_num_tags = 1025;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &bad_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  bad_attr = sa;
  bad_attr.srq_type = IBV_SRQT_XRC;  // an XRC SRQ without its XRC domain
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &bad_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // The TM-SRQ's CQ is busy while the SRQ lives.
  EXPECT_EQ(ibv_destroy_qp(sender), 0);
  EXPECT_EQ(ibv_destroy_qp(receiver), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), EBUSY);
  EXPECT_EQ(ibv_destroy_srq(basic), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_dereg_mr(dmr), 0);
  EXPECT_EQ(ibv_dereg_mr(fmr), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// ---- completion timestamps and the device clock ----

uint64_t clock_now_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

uint64_t device_clock_now(ibv_context* ctx) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx, &v), 0);
  EXPECT_EQ(v.comp_mask, uint32_t{IBV_VALUES_MASK_RAW_CLOCK});
  return uint64_t(v.raw_clock.tv_sec) * 1'000'000'000u + uint64_t(v.raw_clock.tv_nsec);
}

struct Stamped {
  uint64_t wr_id;
  ibv_wc_status status;
  uint64_t ts, wallclock;
};

std::vector<Stamped> poll_stamped(ibv_cq_ex* cq, size_t n) {
  std::vector<Stamped> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_poll_cq_attr attr{};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == ENOENT) continue;
    EXPECT_EQ(rc, 0);
    if (rc != 0) break;
    do {
      out.push_back({cq->wr_id, cq->status, ibv_wc_read_completion_ts(cq),
                     ibv_wc_read_completion_wallclock_ns(cq)});
    } while (out.size() < n && (rc = ibv_next_poll(cq)) == 0);
    ibv_end_poll(cq);
  }
  return out;
}

// ibv_query_rt_values_ex(3): the device clock (CLOCK_MONOTONIC ns, provider/completion_clock.h)
// as a normalised timespec; comp_mask out says what was given.
TEST_F(VerbsEx, QueryRtValuesReadsTheDeviceClock) {
  const uint64_t before = clock_now_ns(CLOCK_MONOTONIC);
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  const uint64_t after = clock_now_ns(CLOCK_MONOTONIC);
  EXPECT_EQ(v.comp_mask, uint32_t{IBV_VALUES_MASK_RAW_CLOCK});
  EXPECT_LT(v.raw_clock.tv_nsec, 1'000'000'000);
  const uint64_t raw = uint64_t(v.raw_clock.tv_sec) * 1'000'000'000u + uint64_t(v.raw_clock.tv_nsec);
  EXPECT_GE(raw, before);
  EXPECT_LE(raw, after);
  EXPECT_LE(raw, device_clock_now(ctx_));  // never backwards
  v = {};
  v.comp_mask = 0;  // nothing asked, nothing given
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  EXPECT_EQ(v.comp_mask, 0u);
  v.comp_mask = IBV_VALUES_MASK_RESERVED;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), EINVAL);
}

// Every completion of a CQ asked for timestamps carries the device clock and the wall clock of
// its generation: inside the window of the operation, in order on each CQ, on the clock
// ibv_query_rt_values_ex reads.
TEST_F(VerbsEx, CompletionTimestampsFallInTheOperationAndKeepOrder) {
  const uint64_t flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                         IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  ibv_cq_ex* cqa = make_cq_ex(flags);
  ibv_cq_ex* cqb = make_cq_ex(flags);
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cqa), kRcOps);
  ibv_qp* b = make_qp_ex(IBV_QPT_RC, ibv_cq_ex_to_cq(cqb), kRcOps);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  constexpr int kMessages = 8;
  std::vector<uint8_t> rbuf(kMessages * 64);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  for (int i = 0; i < kMessages; ++i) post_recv(b, 100 + i, rbuf.data() + 64 * i, 64, mr->lkey);

  const uint64_t device0 = device_clock_now(ctx_);
  const uint64_t wall0 = clock_now_ns(CLOCK_REALTIME);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ibv_wr_start(x);
  char msg[] = "stamped";
  for (int i = 0; i < kMessages; ++i) {
    x->wr_id = i;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, msg, sizeof msg);
  }
  ASSERT_EQ(ibv_wr_complete(x), 0);
  std::vector<Stamped> sent = poll_stamped(cqa, kMessages);
  std::vector<Stamped> received = poll_stamped(cqb, kMessages);
  const uint64_t wall1 = clock_now_ns(CLOCK_REALTIME);
  const uint64_t device1 = device_clock_now(ctx_);
  ASSERT_EQ(sent.size(), size_t{kMessages});
  ASSERT_EQ(received.size(), size_t{kMessages});
  for (const std::vector<Stamped>* cq : {&sent, &received}) {
    uint64_t prev = 0;
    for (const Stamped& s : *cq) {
      EXPECT_EQ(s.status, IBV_WC_SUCCESS);
      EXPECT_GE(s.ts, device0);
      EXPECT_LE(s.ts, device1);
      EXPECT_GE(s.ts, prev);
      prev = s.ts;
      EXPECT_GE(s.wallclock, wall0);  // CLOCK_REALTIME: unless the clock was stepped meanwhile
      EXPECT_LE(s.wallclock, wall1);
    }
  }
  // A message is received before its ACK completes the send.
  for (int i = 0; i < kMessages; ++i) EXPECT_LE(received[i].ts, sent[i].ts) << i;
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  for (ibv_cq_ex* cq : {cqa, cqb}) EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// ---- parent domains and thread domains ----

// The application's allocator of the parent-domain tests: zeroed aligned_alloc buffers (the
// man page makes zeroing the callback's job), every call checked and remembered.
struct AppAllocator {
  struct Buffer {
    void* ptr;
    size_t size;
    uint64_t type;
  };
  bool decline = false;  // answer IBV_ALLOCATOR_USE_DEFAULT
  std::vector<Buffer> live;
  std::vector<uint64_t> types;  // of every allocation, in order
  std::vector<ibv_pd*> pds;     // the pd of every call
  int allocs = 0, frees = 0, bad = 0;

  static void* alloc(ibv_pd* pd, void* pd_context, size_t size, size_t alignment,
                     uint64_t type) {
    auto* a = static_cast<AppAllocator*>(pd_context);
    ++a->allocs;
    a->pds.push_back(pd);
    a->types.push_back(type);
    if (a->decline) return IBV_ALLOCATOR_USE_DEFAULT;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) ++a->bad;
    const size_t rounded = (size + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    std::memset(p, 0, rounded);
    a->live.push_back({p, size, type});
    return p;
  }
  static void release(ibv_pd* pd, void* pd_context, void* ptr, uint64_t type) {
    auto* a = static_cast<AppAllocator*>(pd_context);
    ++a->frees;
    a->pds.push_back(pd);
    auto it = std::find_if(a->live.begin(), a->live.end(),
                           [&](const Buffer& b) { return b.ptr == ptr; });
    if (it == a->live.end() || it->type != type) {
      ++a->bad;
      return;
    }
    std::free(ptr);
    a->live.erase(it);
  }
  // A buffer of `type` holds the 8 bytes of `value` (the device wrote it there).
  bool holds(uint64_t type, uint64_t value) const {
    for (const Buffer& b : live) {
      if (b.type != type) continue;
      const auto* p = static_cast<const uint8_t*>(b.ptr);
      for (size_t off = 0; off + 8 <= b.size; off += 8)
        if (std::memcmp(p + off, &value, 8) == 0) return true;
    }
    return false;
  }
};

// RDMA_DRIVER_UNKNOWN << 32 | code (src/verbs/domain.cc, docs/COMPATIBILITY.md).
constexpr uint64_t kResQp = 1, kResRq = 2, kResSrq = 4, kResCq = 5;

ibv_pd* alloc_domain(ibv_context* ctx, ibv_pd* pd, AppAllocator* app, ibv_td* td = nullptr) {
  ibv_parent_domain_init_attr a{};
  a.pd = pd;
  a.td = td;
  if (app) {
    a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    a.alloc = AppAllocator::alloc;
    a.free = AppAllocator::release;
    a.pd_context = app;
  }
  return ibv_alloc_parent_domain(ctx, &a);
}

// Everything created under a parent domain with allocators keeps its queues in the
// application's buffers: the CQ's completions, the SQ's WQEs, the RQ's and the SRQ's receive
// WQEs are found there, and RC traffic through them moves the right bytes. Each buffer goes
// back through free once, with its type and the parent domain.
TEST_F(VerbsEx, ParentDomainQueuesLiveInTheApplicationsBuffers) {
  AppAllocator app;
  ibv_pd* dom = alloc_domain(ctx_, pd_, &app);
  ASSERT_NE(dom, nullptr) << std::strerror(errno);
  EXPECT_EQ(dom->context, ctx_);
  EXPECT_EQ(app.allocs, 0);

  ibv_cq_init_attr_ex ca{};
  ca.cqe = 64;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = dom;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  ASSERT_EQ(app.types, std::vector<uint64_t>{kResCq});

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(dom, &sa);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  EXPECT_EQ(srq->pd, dom);
  ibv_qp* a = make_qp_ex(IBV_QPT_RC, cq, IBV_QP_EX_WITH_SEND, 64, dom);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->pd, dom);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.srq = srq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {16, 0, 1, 0, 0};
  ibv_qp* b = ibv_create_qp(dom, &qa);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  for (uint64_t t : app.types) {
    EXPECT_TRUE(t == kResQp || t == kResRq || t == kResSrq || t == kResCq) << t;
  }
  EXPECT_EQ(std::count(app.types.begin(), app.types.end(), kResSrq), 2);  // ring + SGEs
  EXPECT_EQ(std::count(app.types.begin(), app.types.end(), kResRq), 2);   // a's own RQ only
  EXPECT_EQ(std::count(app.types.begin(), app.types.end(), kResQp), 4);   // 2 SQs, 2 side areas
  connect(a, b->qp_num);
  connect(b, a->qp_num);

  std::vector<uint8_t> rbuf(64);
  ibv_mr* mr = ibv_reg_mr(dom, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);  // a PD
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(mr->pd, dom);
  constexpr uint64_t kSrqWr = 0x5151515151515151, kRqWr = 0x7272727272727272,
                     kSendWr = 0x3939393939393939;
  ibv_sge sge{reinterpret_cast<uintptr_t>(rbuf.data()), 64, mr->lkey};
  ibv_recv_wr rw{}, *bad = nullptr;
  rw.wr_id = kSrqWr;
  rw.sg_list = &sge;
  rw.num_sge = 1;
  ASSERT_EQ(ibv_post_srq_recv(srq, &rw, &bad), 0);
  post_recv(a, kRqWr, rbuf.data(), 8, mr->lkey);  // stays posted
  EXPECT_TRUE(app.holds(kResSrq, kSrqWr));
  EXPECT_TRUE(app.holds(kResRq, kRqWr));

  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ibv_wr_start(x);
  x->wr_id = kSendWr;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  char msg[] = "parent domain";
  ibv_wr_set_inline_data(x, msg, sizeof msg);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  EXPECT_TRUE(app.holds(kResQp, kSendWr));
  std::vector<ExWc> wcs = poll_ex(cqx, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ExWc& w : wcs) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_TRUE(w.wr_id == kSendWr || w.wr_id == kSrqWr) << w.wr_id;
  }
  EXPECT_STREQ(reinterpret_cast<char*>(rbuf.data()), msg);
  EXPECT_TRUE(app.holds(kResCq, kSendWr));  // the completions were written there
  EXPECT_TRUE(app.holds(kResCq, kSrqWr));

  // In use: neither the parent domain nor its protection domain can go.
  EXPECT_EQ(ibv_dealloc_pd(dom), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_TRUE(app.live.empty());
  EXPECT_EQ(app.frees, app.allocs);
  EXPECT_EQ(app.bad, 0);
  for (ibv_pd* p : app.pds) EXPECT_EQ(p, dom);
  EXPECT_EQ(ibv_dealloc_pd(dom), 0);
}

// Parent domains without allocators, or whose allocator answers IBV_ALLOCATOR_USE_DEFAULT, use
// the provider's own memory (nothing to free); a thread domain is counted by its parent
// domains; the man pages' EINVALs.
TEST_F(VerbsEx, ParentAndThreadDomainRules) {
  auto null_with = [](void* p, int err) { return p == nullptr && errno == err; };
  ibv_td_init_attr tda{};
  ibv_td* td = ibv_alloc_td(ctx_, &tda);
  ASSERT_NE(td, nullptr) << std::strerror(errno);
  EXPECT_EQ(td->context, ctx_);
  tda.comp_mask = 1;
  errno = 0;
  EXPECT_TRUE(null_with(ibv_alloc_td(ctx_, &tda), EINVAL));

  ibv_pd* dom = alloc_domain(ctx_, pd_, nullptr, td);
  ASSERT_NE(dom, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);
  errno = 0;
  EXPECT_TRUE(null_with(alloc_domain(ctx_, dom, nullptr), EINVAL));  // not a PD
  errno = 0;
  EXPECT_TRUE(null_with(alloc_domain(ctx_, nullptr, nullptr), EINVAL));
  ibv_parent_domain_init_attr odd{};
  odd.pd = pd_;
  odd.comp_mask = 1u << 5;
  errno = 0;
  EXPECT_TRUE(null_with(ibv_alloc_parent_domain(ctx_, &odd), EINVAL));
  // A CQ names a parent domain, not a PD.
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 8;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = pd_;
  errno = 0;
  EXPECT_TRUE(null_with(ibv_create_cq_ex(ctx_, &ca), EINVAL));
  ca.parent_domain = dom;
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  ibv_qp* qp = make_qp_ex(IBV_QPT_UD, ibv_cq_ex_to_cq(cq), IBV_QP_EX_WITH_SEND, 8, dom);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(dom), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_dealloc_pd(dom), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);

  AppAllocator declining;
  declining.decline = true;
  ibv_pd* dom2 = alloc_domain(ctx_, pd_, &declining);
  ASSERT_NE(dom2, nullptr);
  ibv_cq* plain = ibv_create_cq(ctx_, 8, nullptr, nullptr, 0);
  ibv_qp* qp2 = make_qp_ex(IBV_QPT_RC, plain, IBV_QP_EX_WITH_SEND, 8, dom2);
  ASSERT_NE(qp2, nullptr);
  EXPECT_EQ(declining.allocs, 4);  // asked for each buffer, declined each
  EXPECT_EQ(ibv_destroy_qp(qp2), 0);
  EXPECT_EQ(declining.frees, 0);
  EXPECT_EQ(ibv_destroy_cq(plain), 0);
  EXPECT_EQ(ibv_dealloc_pd(dom2), 0);
}

// A context closed with a parent domain and objects under it still in use gives every buffer
// back through the application's free.
TEST_F(VerbsEx, ClosingTheContextFreesTheParentDomainsBuffers) {
  ibv_context* ctx = ibv_open_device(list_[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  AppAllocator app;
  ibv_pd* dom = alloc_domain(ctx, pd, &app);
  ASSERT_NE(dom, nullptr);
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 8;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = dom;
  ibv_cq_ex* cq = ibv_create_cq_ex(ctx, &ca);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq);
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  ASSERT_NE(ibv_create_qp(dom, &qa), nullptr);
  EXPECT_EQ(app.allocs, 5);
  EXPECT_EQ(ibv_close_device(ctx), 0);
  EXPECT_EQ(app.frees, 5);
  EXPECT_TRUE(app.live.empty());
  EXPECT_EQ(app.bad, 0);
}

}  // namespace
}  // namespace urdma::verbs_test
