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
#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
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

  ibv_qp* make_qp_ex(ibv_qp_type type, ibv_cq* cq, uint64_t ops, uint32_t max_send_wr = 64) {
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
    a.pd = pd_;
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
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

// ---- the extended CQ ----

TEST_F(VerbsEx, CreateCqExRefusesWhatItCannotDo) {
  ibv_cq_init_attr_ex a{};
  a.cqe = 16;
  a.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
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
  a.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;
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
  EXPECT_EQ(ax.completion_timestamp_mask, 0u);  // hence IBV_WC_EX_WITH_COMPLETION_TIMESTAMP off
  EXPECT_EQ(ax.hca_core_clock, 0u);
  EXPECT_EQ(ax.tso_caps.max_tso, 0u);
  EXPECT_EQ(ax.rss_caps.max_rwq_indirection_tables, 0u);
  EXPECT_EQ(ax.max_wq_type_rq, 0u);
  EXPECT_EQ(ax.tm_caps.max_num_tags, 0u);
  EXPECT_EQ(ax.max_dm_size, 256u * 1024);  // device memory: host memory the device owns
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx_, &v), EOPNOTSUPP);
}

}  // namespace
}  // namespace urdma::verbs_test
