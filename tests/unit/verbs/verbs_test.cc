// libibverbs.so.1 through its public header: this binary links OUR library (the urdma_verbs
// target), never rdma-core's, and calls it as any verbs program does — the inline functions of
// <infiniband/verbs.h> (ibv_post_send, ibv_poll_cq, ibv_query_port, ibv_query_device_ex, ...)
// reach it through ibv_context.ops and the verbs_context layout.
//
// Each test opens urdma0 for real: the library starts a urdmad in this binary's own network
// namespace (netns_main.cc) and leases a slot; traffic goes over real UDP sockets on loopback.
// Oracles are the test's own: expected bytes from a seeded generator, an FNV-1a checksum written
// here, the GID bytes of 127.0.0.1 built by hand, the errnos of the rdma-core man pages.
#include <arpa/inet.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "verbs_test_env.h"
#include "support/checksum.h"

namespace urdma::verbs_test {
namespace {

using test_support::fnv1a;

constexpr uint8_t kPort = 1;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

// ::ffff:127.0.0.1 as a GID (RoCEv2: an IPv4 address in its IPv4-mapped form).
ibv_gid loopback_v4_gid() {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = 127;
  g.raw[15] = 1;
  return g;
}

// Polls until `n` completions arrived (ibv_poll_cq drives the engine) or `timeout_ms` passed;
// never takes more than `n`.
std::vector<ibv_wc> poll_n(ibv_cq* cq, size_t n, int timeout_ms = 10000) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[16];
    const int got = ibv_poll_cq(cq, static_cast<int>(std::min<size_t>(16, n - out.size())), wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
  }
  return out;
}

class Verbs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!netns_failure().empty()) GTEST_SKIP() << "no fresh network namespace: " << netns_failure();
    int n = -1;
    list_ = ibv_get_device_list(&n);
    ASSERT_NE(list_, nullptr);
    ASSERT_EQ(n, 1);
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

  ibv_qp* make_qp(ibv_qp_type type, ibv_cq* scq, ibv_cq* rcq, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.srq = srq;
    a.qp_type = type;
    a.cap.max_send_wr = 64;
    a.cap.max_recv_wr = srq ? 0 : 64;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = srq ? 0 : 4;
    a.cap.max_inline_data = 64;
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    EXPECT_NE(qp, nullptr) << std::strerror(errno);
    return qp;
  }

  // RESET -> INIT -> RTR -> RTS towards `remote_qpn` at GID index 0 (127.0.0.1).
  // Overruns `cq` (IBA 11.4.2.1): one more signaled RDMA WRITE on `qp` (connected to itself)
  // than the CQ holds, within `buf`, and nobody polls.
  void overrun(ibv_qp* qp, ibv_cq* cq, ibv_mr* mr, std::vector<uint8_t>& buf) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 8, mr->lkey};
    for (int i = 0; i < cq->cqe + 1; ++i) {
      ibv_send_wr w{}, *bad = nullptr;
      w.wr_id = static_cast<uint64_t>(i);
      w.opcode = IBV_WR_RDMA_WRITE;
      w.sg_list = &sge;
      w.num_sge = 1;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data()) + 32;
      w.wr.rdma.rkey = mr->rkey;
      ASSERT_EQ(ibv_post_send(qp, &w, &bad), 0);
    }
  }

  void connect(ibv_qp* qp, uint32_t remote_qpn) {
    ibv_port_attr port{};
    ASSERT_EQ(ibv_query_port(ctx_, kPort, &port), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = kPort;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
    a.qkey = 0x11111111;
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (qp->qp_type == IBV_QPT_UD) {
      ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    } else {
      a.path_mtu = port.active_mtu;
      a.dest_qp_num = remote_qpn;
      a.rq_psn = 100;
      a.max_dest_rd_atomic = 16;
      a.min_rnr_timer = 12;
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = loopback_v4_gid();
      a.ah_attr.grh.sgid_index = 0;
      a.ah_attr.grh.hop_limit = 64;
      a.ah_attr.port_num = kPort;
      mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (qp->qp_type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
    }
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 100;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (qp->qp_type == IBV_QPT_RC)
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    ASSERT_EQ(ibv_modify_qp(qp, &a, mask), 0);
    EXPECT_EQ(qp->state, IBV_QPS_RTS);
  }

  // Back from ERR to RTS through RESET, as rdma-core's tests/test_mr.py restate_qps does.
  void restate(ibv_qp* qp, uint32_t remote_qpn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    connect(qp, remote_qpn);
  }

  int post_write(ibv_qp* qp, uint64_t wr_id, const ibv_sge& sge, uint64_t remote_addr,
                 uint32_t rkey) {
    ibv_sge s = sge;
    ibv_send_wr w{}, *bad = nullptr;
    w.wr_id = wr_id;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.sg_list = &s;
    w.num_sge = 1;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = remote_addr;
    w.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &w, &bad);
  }

  int post_send(ibv_qp* qp, uint64_t wr_id, const ibv_sge& sge) {
    ibv_sge s = sge;
    ibv_send_wr w{}, *bad = nullptr;
    w.wr_id = wr_id;
    w.opcode = IBV_WR_SEND;
    w.sg_list = &s;
    w.num_sge = 1;
    w.send_flags = IBV_SEND_SIGNALED;
    return ibv_post_send(qp, &w, &bad);
  }

  int post_recv(ibv_qp* qp, uint64_t wr_id, const ibv_sge& sge) {
    ibv_sge s = sge;
    ibv_recv_wr w{}, *bad = nullptr;
    w.wr_id = wr_id;
    w.sg_list = &s;
    w.num_sge = 1;
    return ibv_post_recv(qp, &w, &bad);
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
};

ibv_sge sge_of(const void* p, size_t n, uint32_t lkey) {
  return {reinterpret_cast<uintptr_t>(p), static_cast<uint32_t>(n), lkey};
}

// ---- device list and queries ----

TEST_F(Verbs, DeviceListNamesUrdma0WithAHostGuid) {
  EXPECT_STREQ(ibv_get_device_name(list_[0]), "urdma0");
  EXPECT_EQ(list_[1], nullptr);
  EXPECT_NE(ibv_get_device_guid(list_[0]), 0u);
  EXPECT_EQ(ibv_get_device_index(list_[0]), 0);
  EXPECT_EQ(list_[0]->node_type, IBV_NODE_CA);
  EXPECT_EQ(list_[0]->transport_type, IBV_TRANSPORT_IB);
  EXPECT_EQ(ctx_->device, list_[0]);
  int n = 0;
  ibv_device** again = ibv_get_device_list(nullptr);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again[0], list_[0]);  // one device object for the process
  ibv_free_device_list(again);
  (void)n;
}

TEST_F(Verbs, DeviceAttributesCoverRxeWhereHonoured) {
  ibv_device_attr a{};
  ASSERT_EQ(ibv_query_device(ctx_, &a), 0);
  EXPECT_EQ(a.node_guid, ibv_get_device_guid(list_[0]));
  EXPECT_EQ(a.phys_port_cnt, 1);
  // rxe's numbers (issue #8) that urdma honours at least as large.
  EXPECT_GE(a.max_sge, 32);
  EXPECT_GE(a.max_srq_sge, 27);
  EXPECT_GE(a.max_cqe, 32767);
  EXPECT_GE(a.max_qp_rd_atom, 128);
  EXPECT_EQ(a.atomic_cap, IBV_ATOMIC_GLOB);  // rxe reports ATOMIC_HCA; GLOB is stronger
  EXPECT_GT(a.max_qp, 0);
  EXPECT_GT(a.max_qp_wr, 0);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(std::memcmp(&ex.orig_attr, &a, sizeof a), 0);
  ibv_query_device_ex_input in{};
  in.comp_mask = 1;
  EXPECT_EQ(ibv_query_device_ex(ctx_, &in, &ex), EINVAL);
}

TEST_F(Verbs, PortIsAnActiveRoceV2EthernetPort) {
  ibv_port_attr p{};
  ASSERT_EQ(ibv_query_port(ctx_, kPort, &p), 0);  // verbs.h: the context's query_port op
  EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_LE(p.active_mtu, p.max_mtu);
  // lo's MTU is 65536: the largest IB MTU.
  EXPECT_EQ(p.active_mtu, IBV_MTU_4096);
  EXPECT_GE(p.gid_tbl_len, 2);
  EXPECT_GE(p.max_msg_sz, 8u << 20);
  EXPECT_EQ(ibv_query_port(ctx_, 2, &p), EINVAL);
  // The exported symbol itself (binaries built against the old, shorter struct call it).
  ibv_port_attr q{};
  ASSERT_EQ((ibv_query_port)(ctx_, kPort, reinterpret_cast<_compat_ibv_port_attr*>(&q)), 0);
  EXPECT_EQ(q.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(q.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_STREQ(ibv_port_state_str(p.state), "PORT_ACTIVE");
}

TEST_F(Verbs, GidTableHoldsTheNamespaceAddressesAsRoceV2) {
  ibv_gid g{};
  ASSERT_EQ(ibv_query_gid(ctx_, kPort, 0, &g), 0);
  const ibv_gid lo = loopback_v4_gid();
  EXPECT_EQ(std::memcmp(&g, &lo, sizeof g), 0);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, kPort, 0, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.ndev_ifindex, if_nametoindex("lo"));
  EXPECT_EQ(std::memcmp(&e.gid, &lo, sizeof lo), 0);
  std::vector<ibv_gid_entry> table(64);
  const ssize_t n = ibv_query_gid_table(ctx_, table.data(), table.size(), 0);
  ASSERT_GE(n, 2);  // 127.0.0.1 and ::1
  EXPECT_EQ(ibv_query_gid_table(ctx_, table.data(), 1, 0), -EINVAL);  // too small
  ibv_port_attr p{};
  ASSERT_EQ(ibv_query_port(ctx_, kPort, &p), 0);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, kPort, p.gid_tbl_len, &g), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, kPort, p.gid_tbl_len - 1, &e, 0), ENODATA);  // empty entry
  EXPECT_EQ(ibv_query_gid_ex(ctx_, kPort, 0, &e, 1), EINVAL);                   // flags
}

TEST_F(Verbs, PkeyTableHasTheDefaultPkey) {
  __be16 pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, kPort, 0, &pkey), 0);
  EXPECT_EQ(be16toh(pkey), 0xffff);
  EXPECT_EQ(ibv_query_pkey(ctx_, kPort, 1, &pkey), -1);
  EXPECT_EQ(ibv_get_pkey_index(ctx_, kPort, htobe16(0xffff)), 0);
  EXPECT_EQ(ibv_get_pkey_index(ctx_, kPort, htobe16(0x8001)), -1);
}

TEST_F(Verbs, HelpersAndForkSupport) {
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_SUCCESS), "success");
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
  EXPECT_STREQ(ibv_event_type_str(IBV_EVENT_CQ_ERR), "CQ error");
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_25_GBPS), 25781);
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_10_GBPS), 4);
  EXPECT_EQ(mult_to_ibv_rate(4), IBV_RATE_10_GBPS);
  EXPECT_EQ(ibv_fork_init(), 0);
  EXPECT_EQ(ibv_is_fork_initialized(), IBV_FORK_UNNEEDED);
}

// ---- object verbs: success and the documented errnos ----

TEST_F(Verbs, ProtectionDomainAndMemoryRegionErrors) {
  std::vector<uint8_t> buf(8192);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_EQ(mr->addr, buf.data());
  EXPECT_EQ(mr->length, buf.size());
  EXPECT_EQ(mr->pd, pd_);
  EXPECT_EQ(mr->context, ctx_);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);  // the MR uses it
  // IBA 10.6.3.1 / ibv_reg_mr(3): remote write needs local write.
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // An optional access flag a device lacks is ignored, not refused.
  ibv_mr* relaxed = ibv_reg_mr(pd_, buf.data(), 4096,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  ASSERT_NE(relaxed, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(relaxed), 0);
  ibv_mr* iova = ibv_reg_mr_iova(pd_, buf.data(), 4096, 0x10000, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(iova, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(iova), 0);
  errno = 0;
  EXPECT_EQ(ibv_reg_dmabuf_mr(pd_, 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // rereg: no flags is invalid input; a new translation keeps the keys.
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  const uint32_t lkey = mr->lkey;
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, buf.data() + 4096, 4096, 0),
            0);
  EXPECT_EQ(mr->addr, buf.data() + 4096);
  EXPECT_EQ(mr->length, 4096u);
  EXPECT_EQ(mr->lkey, lkey);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
}

TEST_F(Verbs, CompletionQueueErrors) {
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_device_attr a{};
  ASSERT_EQ(ibv_query_device(ctx_, &a), 0);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, a.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 16, nullptr, nullptr, ctx_->num_comp_vectors), nullptr);
  EXPECT_EQ(errno, EINVAL);
  int tag = 7;
  ibv_cq* cq = ibv_create_cq(ctx_, 100, &tag, nullptr, 0);
  ASSERT_NE(cq, nullptr) << std::strerror(errno);
  EXPECT_GE(cq->cqe, 100);
  EXPECT_EQ(cq->cq_context, &tag);
  ASSERT_EQ(ibv_resize_cq(cq, 1000), 0);
  EXPECT_GE(cq->cqe, 1000);
  EXPECT_EQ(ibv_resize_cq(cq, 0), EINVAL);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
  EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);  // the QP uses it
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(Verbs, QueuePairCreateModifyQueryAndErrors) {
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = nullptr;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 8;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &init), nullptr);  // no receive CQ
  EXPECT_EQ(errno, EINVAL);
  init.recv_cq = cq;
  init.cap.max_send_sge = 1000;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &init), nullptr);  // above max_sge
  EXPECT_EQ(errno, EINVAL);
  init.cap.max_send_sge = 1;
  init.qp_type = IBV_QPT_RAW_PACKET;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &init), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  init.qp_type = IBV_QPT_RC;
  int tag = 3;
  init.qp_context = &tag;
  init.cap.max_recv_wr = 8;
  init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd_, &init);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_GE(init.cap.max_send_wr, 8u);  // reported back as created
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_EQ(qp->qp_context, &tag);
  EXPECT_NE(qp->qp_num, 0u);
  // RESET -> RTR skips INIT: illegal (IBA 10.3.1).
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  // INIT without its required attributes: a wrong mask.
  a.qp_state = IBV_QPS_INIT;
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  connect(qp, qp->qp_num);  // to itself: a legal RC peer
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE | IBV_QP_CAP, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.sq_psn, 100u);
  EXPECT_EQ(q.dest_qp_num, qp->qp_num);
  EXPECT_EQ(qi.send_cq, cq);
  EXPECT_EQ(qi.recv_cq, cq);
  EXPECT_EQ(qi.qp_context, &tag);
  EXPECT_EQ(ibv_query_ece(qp, nullptr), EOPNOTSUPP);
  ibv_gid mgid{};
  mgid.raw[10] = mgid.raw[11] = 0xff;
  mgid.raw[12] = 230;
  mgid.raw[15] = 1;
  EXPECT_EQ(ibv_attach_mcast(qp, &mgid, 0), EINVAL);  // an RC QP: ibv_attach_mcast(3), UD only
  EXPECT_EQ(ibv_qp_to_qp_ex(qp), nullptr);  // not created with the extended interface
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// ibv_open_xrcd(3) / ibv_close_xrcd(3): the errnos of rdma-core's ibv_cmd_open_xrcd and the
// kernel's ib_uverbs_open_xrcd, one domain per file, EBUSY while an XRC SRQ or XRC_RECV QP is
// in it; XRC SRQs need PD, domain and CQ (ibv_create_srq_ex(3)); an XRC_RECV QP needs its
// domain and has no queues.
TEST_F(Verbs, XrcDomainsSrqsAndTargetQpsFollowTheManPages) {
  auto null_with = [](void* p, int err) { return p == nullptr && errno == err; };
  char path[] = "/tmp/urdma-xrcd-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ibv_xrcd_init_attr xa{};
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);  // FD and OFLAGS are required
  EXPECT_EQ(errno, EINVAL);
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS | IBV_XRCD_INIT_ATTR_RESERVED;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = fd;
  xa.oflags = 0;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);  // the file has no domain, no O_CREAT
  EXPECT_EQ(errno, ENOENT);
  xa.oflags = O_CREAT;
  ibv_xrcd* a = ibv_open_xrcd(ctx_, &xa);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  EXPECT_EQ(a->context, ctx_);
  xa.oflags = O_CREAT | O_EXCL;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);  // it has one now
  EXPECT_EQ(errno, EINVAL);
  xa.oflags = 0;
  ibv_xrcd* again = ibv_open_xrcd(ctx_, &xa);  // the same domain, opened again
  ASSERT_NE(again, nullptr);
  xa.fd = -1;
  ibv_xrcd* priv = ibv_open_xrcd(ctx_, &xa);  // a private one
  ASSERT_NE(priv, nullptr);
  xa.fd = 12345;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);
  EXPECT_EQ(errno, EBADF);

  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_srq_init_attr_ex sx{};
  sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
  sx.srq_type = IBV_SRQT_XRC;
  sx.pd = pd_;
  sx.xrcd = a;
  sx.cq = cq;
  sx.attr.max_wr = 4;
  sx.attr.max_sge = 1;
  EXPECT_TRUE(null_with(ibv_create_srq_ex(ctx_, &sx), EINVAL));  // no CQ named
  sx.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  ibv_srq* srq = ibv_create_srq_ex(ctx_, &sx);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  uint32_t srqn = 0xFFFFFFFF;
  EXPECT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  EXPECT_LE(srqn, 0xFFFFFFu);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);  // the SRQ's completions go there

  ibv_qp_init_attr_ex qx{};
  qx.qp_type = IBV_QPT_XRC_RECV;
  qx.comp_mask = IBV_QP_INIT_ATTR_PD;
  qx.pd = pd_;
  EXPECT_TRUE(null_with(ibv_create_qp_ex(ctx_, &qx), EINVAL));  // a target needs its domain
  qx.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  qx.xrcd = again;  // the same domain as `a`
  ibv_qp* tgt = ibv_create_qp_ex(ctx_, &qx);
  ASSERT_NE(tgt, nullptr) << std::strerror(errno);
  EXPECT_EQ(tgt->qp_type, IBV_QPT_XRC_RECV);
  EXPECT_EQ(tgt->pd, nullptr);
  EXPECT_EQ(qx.cap.max_send_wr, 0u);
  EXPECT_EQ(qx.cap.max_recv_wr, 0u);

  // Closing: one of two opens goes; the last is EBUSY while the SRQ and QP are in the domain.
  EXPECT_EQ(ibv_close_xrcd(again), 0);
  EXPECT_EQ(ibv_close_xrcd(a), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(tgt), 0);
  EXPECT_EQ(ibv_close_xrcd(a), EBUSY);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_close_xrcd(a), 0);
  EXPECT_EQ(ibv_close_xrcd(priv), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  // The file's domain is gone: without O_CREAT it is ENOENT again.
  xa.fd = fd;
  xa.oflags = 0;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx_, &xa), nullptr);
  EXPECT_EQ(errno, ENOENT);
  close(fd);
  // The device says it has XRC.
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  EXPECT_TRUE(da.device_cap_flags & IBV_DEVICE_XRC);
}

TEST_F(Verbs, PostErrorsNameTheFirstFailingWr) {
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey};
  // A receive in RESET is refused (IBA 10.8.2: RESET accepts no WRs).
  ibv_recv_wr r1{}, *bad_r = nullptr;
  r1.wr_id = 1;
  r1.sg_list = &sge;
  r1.num_sge = 1;
  EXPECT_NE(ibv_post_recv(qp, &r1, &bad_r), 0);
  EXPECT_EQ(bad_r, &r1);
  connect(qp, qp->qp_num);
  // Second WR has more SGEs than the QP was created with: it and what follows are not posted.
  std::vector<ibv_sge> many(8, sge);
  ibv_send_wr w1{}, w2{}, w3{}, *bad = nullptr;
  w1.wr_id = 1;
  w1.opcode = IBV_WR_SEND;
  w1.sg_list = &sge;
  w1.num_sge = 1;
  w1.send_flags = IBV_SEND_SIGNALED;
  w1.next = &w2;
  w2 = w1;
  w2.wr_id = 2;
  w2.sg_list = many.data();
  w2.num_sge = static_cast<int>(many.size());
  w2.next = &w3;
  w3 = w1;
  w3.wr_id = 3;
  w3.next = nullptr;
  // Receives for the send that goes (the QP talks to itself).
  bad_r = nullptr;
  r1.next = nullptr;
  ASSERT_EQ(ibv_post_recv(qp, &r1, &bad_r), 0);
  EXPECT_EQ(ibv_post_send(qp, &w1, &bad), EINVAL);
  EXPECT_EQ(bad, &w2);
  // Exactly w1 was posted: one send and one receive completion, nothing for w3.
  std::vector<ibv_wc> wcs = poll_n(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, 1u);
  }
  ibv_wc extra;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &extra), 0);
  // Inline data above max_inline_data.
  std::vector<uint8_t> big(4096);
  ibv_sge big_sge{reinterpret_cast<uintptr_t>(big.data()), 4096, 0};
  ibv_send_wr w4 = w1;
  w4.next = nullptr;
  w4.sg_list = &big_sge;
  w4.send_flags = IBV_SEND_INLINE;
  bad = nullptr;
  EXPECT_EQ(ibv_post_send(qp, &w4, &bad), EINVAL);
  EXPECT_EQ(bad, &w4);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// What urdma does not offer fails the way verbs.h and the man pages say: the inline verbs find
// no extended op (EOPNOTSUPP), the library's own entry points return or set EOPNOTSUPP.
TEST_F(Verbs, VerbsNotOfferedFailWithEopnotsupp) {
  auto null_with = [](void* p, int err) { return p == nullptr && errno == err; };
  errno = 0;
  ibv_counters_init_attr ca{};
  EXPECT_TRUE(null_with(ibv_create_counters(ctx_, &ca), EOPNOTSUPP));
  errno = 0;
  ibv_rwq_ind_table_init_attr ria{};
  EXPECT_TRUE(null_with(ibv_create_rwq_ind_table(ctx_, &ria), EOPNOTSUPP));
  errno = 0;
  ibv_qp_open_attr oa{};
  EXPECT_TRUE(null_with(ibv_open_qp(ctx_, &oa), EOPNOTSUPP));
  errno = 0;
  EXPECT_TRUE(null_with(ibv_alloc_null_mr(pd_), EOPNOTSUPP));
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_wq_init_attr wa{};
  wa.wq_type = IBV_WQT_RQ;
  wa.max_wr = 4;
  wa.max_sge = 1;
  wa.pd = pd_;
  wa.cq = cq;
  errno = 0;
  EXPECT_TRUE(null_with(ibv_create_wq(ctx_, &wa), EOPNOTSUPP));
  ibv_modify_cq_attr mc{};
  mc.attr_mask = IBV_CQ_ATTR_MODERATE;
  EXPECT_EQ(ibv_modify_cq(cq, &mc), EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq, nullptr);
  uint32_t srq_num = 0;
  EXPECT_EQ(ibv_get_srq_num(srq, &srq_num), 0);  // any SRQ has one, as on mlx5
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  // (Imports are offered: ImportsRefuseUnknownHandlesAndForeignDescriptors.)
}

// ibv_advise_mr(3) on ODP MRs: a prefetch leaves the bytes as they were; each wrong argument
// has the man page's errno.
TEST_F(Verbs, OnDemandMrsTakeAdviceWithTheManPagesErrnos) {
  const size_t kLen = 3 * 4096 + 100;
  std::vector<uint8_t> buf(kLen, 0x33);
  ibv_mr* odp = ibv_reg_mr(pd_, buf.data(), kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ibv_mr* ro = ibv_reg_mr(pd_, buf.data(), kLen, IBV_ACCESS_ON_DEMAND);
  ibv_mr* pinned = ibv_reg_mr(pd_, buf.data(), kLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(odp && ro && pinned) << std::strerror(errno);
  ibv_sge sge = sge_of(buf.data() + 10, kLen - 10, odp->lkey);
  for (auto advice : {IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                      IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT}) {
    EXPECT_EQ(ibv_advise_mr(pd_, advice, 0, &sge, 1), 0) << advice;
    EXPECT_EQ(ibv_advise_mr(pd_, advice, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), 0) << advice;
  }
  EXPECT_EQ(buf[10], 0x33);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1), EINVAL);  // flags
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0), EINVAL);
  ibv_sge past = sge_of(buf.data() + 8, kLen, odp->lkey);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &past, 1), EFAULT);
  ibv_sge stale = sge_of(buf.data(), 8, odp->lkey ^ 0x80);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &stale, 1), ENOENT);
  ibv_sge not_odp = sge_of(buf.data(), 8, pinned->lkey);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_odp, 1), EINVAL);
  ibv_sge read_only = sge_of(buf.data(), 8, ro->lkey);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &read_only, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &read_only, 1), EPERM);
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), EPERM);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  for (ibv_mr* m : {odp, ro, pinned}) EXPECT_EQ(ibv_dereg_mr(m), 0);
}

// ---- traffic ----

// Two RC QPs of one process over real UDP on loopback: WRITE, SEND with immediate, READ back.
TEST_F(Verbs, RcLoopbackWriteSendReadWithCqeChecks) {
  ibv_cq* cqa = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
  ibv_cq* cqb = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* a = make_qp(IBV_QPT_RC, cqa, cqa);
  ibv_qp* b = make_qp(IBV_QPT_RC, cqb, cqb);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> src = random_bytes(kBytes, 1), dst(kBytes), back(kBytes);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), kBytes, acc);
  ibv_mr* md = ibv_reg_mr(pd_, dst.data(), kBytes, acc);
  ibv_mr* mb = ibv_reg_mr(pd_, back.data(), kBytes, acc);
  ASSERT_TRUE(ms && md && mb);

  // WRITE the whole buffer A -> B in 64 KiB pieces.
  constexpr size_t kChunk = 64 * 1024;
  for (size_t i = 0; i < kBytes / kChunk; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data() + i * kChunk), kChunk, ms->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = 100 + i;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data() + i * kChunk);
    wr.wr.rdma.rkey = md->rkey;
    ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  }
  std::vector<ibv_wc> wcs = poll_n(cqa, kBytes / kChunk);
  ASSERT_EQ(wcs.size(), kBytes / kChunk);
  for (size_t i = 0; i < wcs.size(); ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[i].status);
    EXPECT_EQ(wcs[i].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wcs[i].wr_id, 100 + i);  // in posting order
    EXPECT_EQ(wcs[i].qp_num, a->qp_num);
  }

  // SEND with immediate: B receives the first 4 KiB of src; its completion says where from.
  std::vector<uint8_t> rbuf(4096);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(rbuf.data()), 4096, mr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.wr_id = 7;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(b, &rwr, &rbad), 0);
  ibv_sge ssge{reinterpret_cast<uintptr_t>(src.data()), 4096, ms->lkey};
  ibv_send_wr swr{}, *sbad = nullptr;
  swr.wr_id = 8;
  swr.opcode = IBV_WR_SEND_WITH_IMM;
  swr.imm_data = htonl(0x12345678);
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_post_send(a, &swr, &sbad), 0);
  wcs = poll_n(cqb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(wcs[0].byte_len, 4096u);
  EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wcs[0].imm_data), 0x12345678u);
  EXPECT_EQ(wcs[0].qp_num, b->qp_num);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wcs[0].wr_id, 8u);
  EXPECT_EQ(fnv1a(rbuf.data(), 4096), fnv1a(src.data(), 4096));

  // READ B's buffer back into A's third buffer.
  ibv_sge bsge{reinterpret_cast<uintptr_t>(back.data()), kBytes, mb->lkey};
  ibv_send_wr rd{}, *rdbad = nullptr;
  rd.wr_id = 9;
  rd.opcode = IBV_WR_RDMA_READ;
  rd.sg_list = &bsge;
  rd.num_sge = 1;
  rd.send_flags = IBV_SEND_SIGNALED;
  rd.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
  rd.wr.rdma.rkey = md->rkey;
  ASSERT_EQ(ibv_post_send(a, &rd, &rdbad), 0);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wcs[0].byte_len, kBytes);
  EXPECT_EQ(fnv1a(dst.data(), kBytes), fnv1a(src.data(), kBytes));
  EXPECT_EQ(fnv1a(back.data(), kBytes), fnv1a(src.data(), kBytes));

  // A bad rkey: the responder NAKs, A's WR completes with a remote access error.
  ibv_send_wr badw = rd;
  badw.wr_id = 10;
  badw.wr.rdma.rkey = md->rkey ^ 0xff;
  ASSERT_EQ(ibv_post_send(a, &badw, &rdbad), 0);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].wr_id, 10u);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {ms, md, mb, mr}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  for (ibv_cq* cq : {cqa, cqb}) EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Device memory (ibv_alloc_dm(3)): max_dm_size reported, the copies' errnos, a DM MR as the
// local SGE of a SEND and as the target of a peer's WRITE and READ (zero based: offsets into
// the MR), and a DM its MR holds.
TEST_F(Verbs, DeviceMemoryIsALocalSgeAndARemoteTarget) {
  ibv_device_attr_ex ax{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ax), 0);
  ASSERT_GT(ax.max_dm_size, 4096u);
  ibv_alloc_dm_attr da{};
  da.length = ax.max_dm_size + 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx_, &da), nullptr);
  EXPECT_EQ(errno, EINVAL);
  da.length = 4096;
  da.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx_, &da), nullptr);
  EXPECT_EQ(errno, EINVAL);
  da.comp_mask = 0;
  da.log_align_req = 6;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(dm, nullptr) << std::strerror(errno);
  EXPECT_EQ(dm->context, ctx_);
  EXPECT_EQ(dm->comp_mask, uint32_t{IBV_DM_MASK_HANDLE});

  const std::vector<uint8_t> src = random_bytes(4096, 7);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, src.data(), 4096), 0);
  uint8_t word[8] = {};
  EXPECT_EQ(ibv_memcpy_from_dm(word, dm, 2, 4), EINVAL);     // offset not in 4-byte words
  EXPECT_EQ(ibv_memcpy_from_dm(word, dm, 4096, 4), EFAULT);  // past the end
  EXPECT_EQ(ibv_memcpy_to_dm(dm, 0, word, 3), EINVAL);

  const int acc = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                  IBV_ACCESS_REMOTE_READ;
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, dm, 0, 4096, acc & ~IBV_ACCESS_ZERO_BASED), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(pd_, dm, 8, 4096, acc), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* dmr = ibv_reg_dm_mr(pd_, dm, 0, 4096, acc);
  ASSERT_NE(dmr, nullptr) << std::strerror(errno);
  EXPECT_EQ(dmr->addr, nullptr);
  EXPECT_EQ(dmr->length, 4096u);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);

  ibv_cq* cqa = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_cq* cqb = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* a = make_qp(IBV_QPT_RC, cqa, cqa);
  ibv_qp* b = make_qp(IBV_QPT_RC, cqb, cqb);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> host(4096);
  ibv_mr* hmr = ibv_reg_mr(pd_, host.data(), host.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(hmr, nullptr);

  // SEND from DM bytes [1024, 3072) (SGE address 1024 of the zero-based MR) into host memory.
  ASSERT_EQ(post_recv(b, 1, sge_of(host.data(), host.size(), hmr->lkey)), 0);
  ASSERT_EQ(post_send(a, 2, ibv_sge{1024, 2048, dmr->lkey}), 0);
  std::vector<ibv_wc> wcs = poll_n(cqb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].byte_len, 2048u);
  EXPECT_TRUE(std::equal(host.begin(), host.begin() + 2048, src.begin() + 1024));
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);

  // A peer WRITEs host bytes into the DM at MR offset 512 (remote address 512).
  const std::vector<uint8_t> payload = random_bytes(1000, 8);
  std::copy(payload.begin(), payload.end(), host.begin());
  ASSERT_EQ(post_write(b, 3, sge_of(host.data(), 1000, hmr->lkey), 512, dmr->rkey), 0);
  wcs = poll_n(cqb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  std::vector<uint8_t> in_dm(4096);
  ASSERT_EQ(ibv_memcpy_from_dm(in_dm.data(), dm, 0, 4096), 0);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), in_dm.begin() + 512));
  EXPECT_TRUE(std::equal(src.begin(), src.begin() + 512, in_dm.begin()));
  EXPECT_TRUE(std::equal(src.begin() + 1512, src.end(), in_dm.begin() + 1512));
  // A WRITE past the DM MR's end is a remote access error, as for any MR.
  ASSERT_EQ(post_write(b, 4, sge_of(host.data(), 8, hmr->lkey), 4092, dmr->rkey), 0);
  wcs = poll_n(cqb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {hmr, dmr}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
  for (ibv_cq* cq : {cqa, cqb}) EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Implicit ODP: an MR over the whole address space carries a peer's WRITE and READ to memory
// the process has mapped; a WRITE to an unmapped page (below vm.mmap_min_addr, where nothing is
// ever mapped: a page the test unmapped could be mapped again by another thread, or by ASan)
// or a READ of a PROT_NONE page ends in a remote access error at the requester (the
// responder's QP in ERR) and the process lives on.
// Without ON_DEMAND the whole address space is EINVAL.
TEST_F(Verbs, ImplicitOdpMrTurnsAnUnmappedAddressIntoARemoteAccessError) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                  IBV_ACCESS_ON_DEMAND;
  ibv_mr* all = ibv_reg_mr(pd_, nullptr, SIZE_MAX, acc);
  ASSERT_NE(all, nullptr) << std::strerror(errno);
  const long page = sysconf(_SC_PAGESIZE);
  auto* mem = static_cast<uint8_t*>(
      mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(mem, MAP_FAILED);
  uint8_t* none = mem + page;
  ASSERT_EQ(mprotect(none, page, PROT_NONE), 0);
  constexpr uint64_t kNeverMapped = 0x1008;

  ibv_cq* cqa = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_cq* cqb = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* a = make_qp(IBV_QPT_RC, cqa, cqa);
  ibv_qp* b = make_qp(IBV_QPT_RC, cqb, cqb);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = random_bytes(1000, 9), back(1000);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mb = ibv_reg_mr(pd_, back.data(), back.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(ms && mb);
  auto va = [](const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); };

  // Mapped memory: the WRITE lands, and the local SGE may name the implicit MR too.
  ASSERT_EQ(post_write(a, 1, sge_of(src.data(), 1000, ms->lkey), va(mem) + 100, all->rkey), 0);
  std::vector<ibv_wc> wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), mem + 100));
  ibv_sge rd_sge = sge_of(back.data(), 1000, all->lkey);
  ibv_send_wr rd{}, *bad = nullptr;
  rd.wr_id = 2;
  rd.opcode = IBV_WR_RDMA_READ;
  rd.sg_list = &rd_sge;
  rd.num_sge = 1;
  rd.send_flags = IBV_SEND_SIGNALED;
  rd.wr.rdma.remote_addr = va(mem) + 100;
  rd.wr.rdma.rkey = all->rkey;
  ASSERT_EQ(ibv_post_send(a, &rd, &bad), 0);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(back, src);

  // An unmapped page, then a PROT_NONE page: remote access errors, each after restating the
  // pair (the first error put both QPs in ERR).
  ASSERT_EQ(post_write(a, 3, sge_of(src.data(), 8, ms->lkey), kNeverMapped, all->rkey), 0);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);
  restate(a, b->qp_num);
  restate(b, a->qp_num);
  rd.wr_id = 4;
  rd.wr.rdma.remote_addr = va(none);
  rd_sge = sge_of(back.data(), 8, mb->lkey);
  ASSERT_EQ(ibv_post_send(a, &rd, &bad), 0);
  wcs = poll_n(cqa, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {all, ms, mb}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  for (ibv_cq* cq : {cqa, cqb}) EXPECT_EQ(ibv_destroy_cq(cq), 0);
  ASSERT_EQ(munmap(mem, 2 * page), 0);
}

// UD: an AH to 127.0.0.1, and the reply's AH built from the received completion and GRH.
TEST_F(Verbs, UdLoopbackWithAhFromWc) {
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = make_qp(IBV_QPT_UD, cq, cq);
  ibv_qp* b = make_qp(IBV_QPT_UD, cq, cq);
  ASSERT_TRUE(a && b);
  connect(a, 0);
  connect(b, 0);
  constexpr size_t kMsg = 512;
  std::vector<uint8_t> src = random_bytes(kMsg, 2);
  std::vector<uint8_t> rbuf(40 + kMsg);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr = ibv_reg_mr(pd_, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(ms && mr);
  ibv_sge rsge{reinterpret_cast<uintptr_t>(rbuf.data()), static_cast<uint32_t>(rbuf.size()),
               mr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.wr_id = 1;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(ibv_post_recv(b, &rwr, &rbad), 0);

  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 0;
  ah_attr.port_num = kPort;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd_, &ah_attr), nullptr);  // RoCE needs a GRH
  EXPECT_EQ(errno, EINVAL);
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = loopback_v4_gid();
  ah_attr.grh.sgid_index = 0;
  ah_attr.grh.hop_limit = 64;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);

  ibv_sge ssge{reinterpret_cast<uintptr_t>(src.data()), kMsg, ms->lkey};
  ibv_send_wr swr{}, *sbad = nullptr;
  swr.wr_id = 2;
  swr.opcode = IBV_WR_SEND;
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = b->qp_num;
  swr.wr.ud.remote_qkey = 0x11111111;
  ASSERT_EQ(ibv_post_send(a, &swr, &sbad), 0);
  std::vector<ibv_wc> wcs = poll_n(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  const ibv_wc* recv = wcs[0].opcode == IBV_WC_RECV ? &wcs[0] : &wcs[1];
  EXPECT_EQ(recv->status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv->byte_len, 40 + kMsg);
  EXPECT_EQ(recv->src_qp, a->qp_num);
  EXPECT_TRUE(recv->wc_flags & IBV_WC_GRH);
  EXPECT_EQ(fnv1a(rbuf.data() + 40, kMsg), fnv1a(src.data(), kMsg));

  ibv_ah_attr back{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, kPort, const_cast<ibv_wc*>(recv),
                                reinterpret_cast<ibv_grh*>(rbuf.data()), &back),
            0);
  EXPECT_EQ(back.is_global, 1);
  EXPECT_EQ(back.grh.sgid_index, 0);
  const ibv_gid lo = loopback_v4_gid();
  EXPECT_EQ(std::memcmp(&back.grh.dgid, &lo, sizeof lo), 0);
  ibv_ah* reply = ibv_create_ah_from_wc(pd_, const_cast<ibv_wc*>(recv),
                                        reinterpret_cast<ibv_grh*>(rbuf.data()), kPort);
  ASSERT_NE(reply, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_destroy_ah(reply), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {ms, mr}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// ibv_attach_mcast(3) on the real path: urdmad joins the group on the process's slot socket, the
// kernel loops the sender's datagram back to it, and the engine gives a copy to each attached
// QP (the sender's own included: no IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) and none to the others.
TEST_F(Verbs, MulticastReachesEveryAttachedQpAndNoOther) {
  ibv_device_attr dev{};
  ASSERT_EQ(ibv_query_device(ctx_, &dev), 0);
  EXPECT_GT(dev.max_mcast_grp, 0);
  EXPECT_GT(dev.max_mcast_qp_attach, 0);
  EXPECT_GE(dev.max_total_mcast_qp_attach, dev.max_mcast_qp_attach);
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = make_qp(IBV_QPT_UD, cq, cq);
  ibv_qp* b = make_qp(IBV_QPT_UD, cq, cq);
  ibv_qp* c = make_qp(IBV_QPT_UD, cq, cq);
  ASSERT_TRUE(a && b && c);
  for (ibv_qp* qp : {a, b, c}) connect(qp, 0);
  ibv_gid group{};
  group.raw[10] = group.raw[11] = 0xff;
  group.raw[12] = 230;
  group.raw[13] = 7;
  group.raw[15] = 9;
  ibv_gid unicast = loopback_v4_gid();
  EXPECT_EQ(ibv_attach_mcast(a, &unicast, 0), EINVAL);  // not a multicast GID
  ASSERT_EQ(ibv_attach_mcast(a, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(b, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(b, &group, 0), 0);       // again: nothing changes
  EXPECT_EQ(ibv_detach_mcast(c, &group, 0), EINVAL);  // not attached
  EXPECT_EQ(ibv_destroy_qp(b), EBUSY);                // attached: in use

  constexpr size_t kMsg = 300;
  std::vector<uint8_t> src = random_bytes(kMsg, 5);
  std::vector<std::vector<uint8_t>> rbuf(3, std::vector<uint8_t>(40 + kMsg));
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), 0);
  ASSERT_NE(ms, nullptr);
  std::vector<ibv_mr*> mrs;
  for (int i = 0; i < 3; ++i) {
    mrs.push_back(ibv_reg_mr(pd_, rbuf[i].data(), rbuf[i].size(), IBV_ACCESS_LOCAL_WRITE));
    ASSERT_NE(mrs.back(), nullptr);
  }
  ibv_qp* qps[3] = {a, b, c};
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(post_recv(qps[i], 100 + i, sge_of(rbuf[i].data(), rbuf[i].size(), mrs[i]->lkey)), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = kPort;
  ah_attr.grh.dgid = group;
  ah_attr.grh.sgid_index = 0;  // 127.0.0.1: the namespace has only loopback
  ah_attr.grh.hop_limit = 1;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr) << std::strerror(errno);
  auto send = [&](uint64_t wr_id) {
    ibv_sge ssge = sge_of(src.data(), kMsg, ms->lkey);
    ibv_send_wr swr{}, *sbad = nullptr;
    swr.wr_id = wr_id;
    swr.opcode = IBV_WR_SEND;
    swr.sg_list = &ssge;
    swr.num_sge = 1;
    swr.send_flags = IBV_SEND_SIGNALED;
    swr.wr.ud.ah = ah;
    swr.wr.ud.remote_qpn = 0xFFFFFF;
    swr.wr.ud.remote_qkey = 0x11111111;
    return ibv_post_send(a, &swr, &sbad);
  };
  ASSERT_EQ(send(1), 0);
  std::vector<ibv_wc> wcs = poll_n(cq, 3);  // the send and two receives
  ASSERT_EQ(wcs.size(), 3u);
  std::vector<uint64_t> ids;
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ids.push_back(wc.wr_id);
    if (wc.opcode != IBV_WC_RECV) continue;
    EXPECT_EQ(wc.byte_len, 40 + kMsg);
    EXPECT_EQ(wc.src_qp, a->qp_num);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 100, 101}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(fnv1a(rbuf[i].data() + 40, kMsg), fnv1a(src.data(), kMsg));
    EXPECT_EQ(std::memcmp(rbuf[i].data() + 20 + 16, group.raw + 12, 4), 0);  // IPv4 daddr
  }
  // Detached, b hears the group no more; a still does.
  ASSERT_EQ(ibv_detach_mcast(b, &group, 0), 0);
  ASSERT_EQ(post_recv(a, 103, sge_of(rbuf[0].data(), rbuf[0].size(), mrs[0]->lkey)), 0);
  ASSERT_EQ(send(2), 0);
  wcs = poll_n(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  ids.clear();
  for (const ibv_wc& wc : wcs) ids.push_back(wc.wr_id);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{2, 103}));
  EXPECT_TRUE(poll_n(cq, 1, 200).empty()) << "b (detached) and c (never attached) get nothing";
  // c's buffer was never written.
  EXPECT_TRUE(std::all_of(rbuf[2].begin(), rbuf[2].end(), [](uint8_t x) { return x == 0; }));
  ASSERT_EQ(ibv_detach_mcast(a, &group, 0), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (ibv_qp* qp : {a, b, c}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(ms), 0);
  for (ibv_mr* m : mrs) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB is accepted for UD QPs (rdma-core's tests may ask for it);
// other creation flags, or the flag on another QP type, are not offered.
TEST_F(Verbs, BlockSelfMulticastLoopbackIsAUdCreationFlag) {
  ibv_cq* cq = ibv_create_cq(ctx_, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr_ex a{};
  a.send_cq = a.recv_cq = cq;
  a.cap = {4, 4, 1, 1, 0};
  a.pd = pd_;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  a.qp_type = IBV_QPT_UD;
  ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  a.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(Verbs, SharedReceiveQueueFeedsTwoQps) {
  ibv_srq_init_attr si{};
  si.attr.max_wr = 16;
  si.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &si);
  ASSERT_NE(srq, nullptr) << std::strerror(errno);
  EXPECT_GE(si.attr.max_wr, 16u);
  ibv_srq_attr sa{};
  ASSERT_EQ(ibv_query_srq(srq, &sa), 0);
  EXPECT_GE(sa.max_wr, 16u);
  sa.srq_limit = sa.max_wr + 1;
  EXPECT_EQ(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL);  // above max_wr
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_qp* a = make_qp(IBV_QPT_RC, cq, cq);
  ibv_qp* b = make_qp(IBV_QPT_RC, cq, cq, srq);
  ASSERT_TRUE(cq && a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = random_bytes(256, 3), dst(4 * 256);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), 0);
  ibv_mr* md = ibv_reg_mr(pd_, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(ms && md);
  for (int i = 0; i < 4; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(dst.data() + i * 256), 256, md->lkey};
    ibv_recv_wr r{}, *bad = nullptr;
    r.wr_id = 50 + i;
    r.sg_list = &sge;
    r.num_sge = 1;
    ASSERT_EQ(ibv_post_srq_recv(srq, &r, &bad), 0);
  }
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);  // a QP uses it
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 256, ms->lkey};
  ibv_send_wr w{}, *bad = nullptr;
  w.wr_id = 60;
  w.opcode = IBV_WR_SEND;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_post_send(a, &w, &bad), 0);
  std::vector<ibv_wc> wcs = poll_n(cq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  const ibv_wc* recv = wcs[0].opcode == IBV_WC_RECV ? &wcs[0] : &wcs[1];
  EXPECT_EQ(recv->status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv->wr_id, 50u);  // the SRQ's oldest receive
  EXPECT_EQ(recv->qp_num, b->qp_num);
  EXPECT_EQ(fnv1a(dst.data(), 256), fnv1a(src.data(), 256));
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  for (ibv_mr* m : {ms, md}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(Verbs, MemoryWindowType1BindGrantsRemoteWrite) {
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_qp* a = make_qp(IBV_QPT_RC, cq, cq);
  ibv_qp* b = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_TRUE(cq && a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = random_bytes(1024, 4), dst(4096);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), 0);
  ibv_mr* md = ibv_reg_mr(pd_, dst.data(), dst.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ASSERT_TRUE(ms && md);
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr) << std::strerror(errno);
  ibv_mw_bind bind{};
  bind.wr_id = 70;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info.mr = md;
  bind.bind_info.addr = reinterpret_cast<uintptr_t>(dst.data()) + 1024;
  bind.bind_info.length = 1024;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  const uint32_t before = mw->rkey;
  ASSERT_EQ(ibv_bind_mw(b, mw, &bind), 0);
  EXPECT_NE(mw->rkey, before);
  std::vector<ibv_wc> wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_BIND_MW);
  EXPECT_EQ(wcs[0].wr_id, 70u);
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), 1024, ms->lkey};
  ibv_send_wr w{}, *bad = nullptr;
  w.wr_id = 71;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = bind.bind_info.addr;
  w.wr.rdma.rkey = mw->rkey;
  ASSERT_EQ(ibv_post_send(a, &w, &bad), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(fnv1a(dst.data() + 1024, 1024), fnv1a(src.data(), 1024));
  EXPECT_EQ(ibv_dereg_mr(md), EINVAL);  // a window is bound to it (IBA 10.6.7.2.6)
  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  for (ibv_mr* m : {ms, md}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// What rdma-core's tests/test_mr.py MWTest does: the bind's access carries LOCAL_WRITE next to
// REMOTE_WRITE; type 1 through ibv_bind_mw, then unbound by a zero-length bind naming the MR;
// type 2 through an IBV_WR_BIND_MW WR with ibv_inc_rkey, then LOCAL_INV.
TEST_F(Verbs, MemoryWindowsBoundAsRdmaCoresTestsBindThem) {
  ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_qp* a = make_qp(IBV_QPT_RC, cq, cq);
  ibv_qp* b = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_TRUE(cq && a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = random_bytes(256, 9), dst(256);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* md = ibv_reg_mr(pd_, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  ASSERT_TRUE(ms && md);
  const ibv_sge from = sge_of(src.data(), src.size(), ms->lkey);
  const uint64_t at = reinterpret_cast<uintptr_t>(dst.data());
  const unsigned access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;

  ibv_mw* mw1 = ibv_alloc_mw(pd_, IBV_MW_TYPE_1);
  ASSERT_NE(mw1, nullptr) << std::strerror(errno);
  ibv_mw_bind bind{};
  bind.wr_id = 1;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = {.mr = md, .addr = at, .length = dst.size(), .mw_access_flags = access};
  ASSERT_EQ(ibv_bind_mw(b, mw1, &bind), 0);
  std::vector<ibv_wc> wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_BIND_MW);
  ASSERT_EQ(post_write(a, 2, from, at, mw1->rkey), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  // Unbound by a zero-length bind that still names the MR: a WRITE through it is refused.
  bind.wr_id = 3;
  bind.bind_info = {.mr = md, .addr = at, .length = 0, .mw_access_flags = 0};
  ASSERT_EQ(ibv_bind_mw(b, mw1, &bind), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  ASSERT_EQ(post_write(a, 4, from, at, mw1->rkey), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(ibv_dealloc_mw(mw1), 0);
  restate(a, b->qp_num);  // both in ERR after the refused WRITE
  restate(b, a->qp_num);

  ibv_mw* mw2 = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(mw2, nullptr) << std::strerror(errno);
  ibv_send_wr w{}, *bad = nullptr;
  w.wr_id = 5;
  w.opcode = IBV_WR_BIND_MW;
  w.send_flags = IBV_SEND_SIGNALED;
  w.bind_mw.mw = mw2;
  w.bind_mw.rkey = ibv_inc_rkey(mw2->rkey);
  w.bind_mw.bind_info = {.mr = md, .addr = at, .length = dst.size(), .mw_access_flags = access};
  ASSERT_EQ(ibv_post_send(b, &w, &bad), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_EQ(post_write(a, 6, from, at, w.bind_mw.rkey), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));
  ibv_send_wr inv{};
  inv.wr_id = 7;
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.send_flags = IBV_SEND_SIGNALED;
  inv.invalidate_rkey = w.bind_mw.rkey;
  ASSERT_EQ(ibv_post_send(b, &inv, &bad), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_LOCAL_INV);
  ASSERT_EQ(post_write(a, 8, from, at, w.bind_mw.rkey), 0);
  wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wcs[0].status);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw2), 0);
  for (ibv_mr* m : {ms, md}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// rdma-core's test_mr_rereg_addr and test_mr_rereg_pd: a receive posted for the MR's old
// translation (or with the MR moved to another PD) fails — REM_OP_ERR for the sender,
// LOC_PROT_ERR for the receive —; the QPs come back from ERR through RESET and the next SEND
// succeeds: RESET took the flushes nobody polled with it, so they are not polled first.
TEST_F(Verbs, RereggedMrCarriesTrafficAfterTheQpsAreRestated) {
  ibv_cq* ca = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ibv_cq* cb = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(ca && cb);
  ibv_qp* a = make_qp(IBV_QPT_RC, ca, ca);
  ibv_qp* b = make_qp(IBV_QPT_RC, cb, cb);
  ASSERT_TRUE(a && b);
  connect(a, b->qp_num);
  connect(b, a->qp_num);
  std::vector<uint8_t> src = random_bytes(512, 11), old_buf(512), new_buf(512);
  ibv_mr* ms = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr = ibv_reg_mr(pd_, old_buf.data(), old_buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(ms && mr);
  const ibv_sge from = sge_of(src.data(), src.size(), ms->lkey);
  const uint32_t lkey = mr->lkey;

  // A receive for the old translation, then the MR moves.
  ASSERT_EQ(post_recv(b, 1, sge_of(old_buf.data(), old_buf.size(), mr->lkey)), 0);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, new_buf.data(),
                         new_buf.size(), 0),
            0);
  EXPECT_EQ(mr->addr, new_buf.data());
  EXPECT_EQ(mr->lkey, lkey);  // kept: a new translation does not need new keys
  ASSERT_EQ(post_recv(a, 2, from), 0);  // flushed when a enters ERR
  ASSERT_EQ(post_send(a, 3, from), 0);
  std::vector<ibv_wc> wcs = poll_n(ca, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(wcs[0].status);
  wcs = poll_n(cb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wcs[0].status);
  // The flush of a's receive, queued as a entered ERR, is not polled before the restate.
  restate(a, b->qp_num);
  restate(b, a->qp_num);
  ibv_wc none;
  EXPECT_EQ(ibv_poll_cq(ca, 1, &none), 0) << "RESET leaves no completion of the QP";
  EXPECT_EQ(ibv_poll_cq(cb, 1, &none), 0);

  ASSERT_EQ(post_recv(b, 4, sge_of(new_buf.data(), new_buf.size(), mr->lkey)), 0);
  ASSERT_EQ(post_send(a, 5, from), 0);
  wcs = poll_n(ca, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  wcs = poll_n(cb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].wr_id, 4u);
  EXPECT_EQ(fnv1a(new_buf.data(), new_buf.size()), fnv1a(src.data(), src.size()));

  // The MR moves to another PD: a receive through it fails the same way; back, it works.
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  EXPECT_EQ(mr->pd, other);
  ASSERT_EQ(post_recv(b, 6, sge_of(new_buf.data(), new_buf.size(), mr->lkey)), 0);
  ASSERT_EQ(post_send(a, 7, from), 0);
  wcs = poll_n(ca, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(wcs[0].status);
  restate(a, b->qp_num);
  restate(b, a->qp_num);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, 0), 0);
  std::fill(new_buf.begin(), new_buf.end(), 0);
  ASSERT_EQ(post_recv(b, 8, sge_of(new_buf.data(), new_buf.size(), mr->lkey)), 0);
  ASSERT_EQ(post_send(a, 9, from), 0);
  wcs = poll_n(ca, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  wcs = poll_n(cb, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(fnv1a(new_buf.data(), new_buf.size()), fnv1a(src.data(), src.size()));

  // rdma-core's input checks: a translation needs an address and a length; access flags
  // need IBV_REREG_MR_CHANGE_ACCESS.
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 64, 0),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);

  for (ibv_qp* qp : {a, b}) EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_mr* m : {ms, mr}) EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  for (ibv_cq* c : {ca, cb}) EXPECT_EQ(ibv_destroy_cq(c), 0);
}

// rdma-core's test_resize_cq: UD sends posted and not polled, then a resize below their
// number is EINVAL — at once, as on rxe, where the post executes the send: the resize lets
// the engine run what was posted before it counts.
TEST_F(Verbs, ResizeBelowTheUnpolledCompletionsIsEinval) {
  for (int round = 0; round < 20; ++round) {
    ibv_cq* cq = ibv_create_cq(ctx_, 3, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ASSERT_EQ(ibv_resize_cq(cq, 1), 0);
    EXPECT_GE(cq->cqe, 1);
    ASSERT_EQ(ibv_resize_cq(cq, 7), 0);
    ASSERT_GE(cq->cqe, 7);
    ibv_qp* qp = make_qp(IBV_QPT_UD, cq, cq);
    ASSERT_NE(qp, nullptr);
    connect(qp, 0);
    ibv_ah_attr ah_attr{};
    ah_attr.is_global = 1;
    ah_attr.grh.dgid = loopback_v4_gid();
    ah_attr.grh.hop_limit = 64;
    ah_attr.port_num = kPort;
    ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
    ASSERT_NE(ah, nullptr);
    std::vector<uint8_t> msg(64, 0x5a);
    ibv_mr* mr = ibv_reg_mr(pd_, msg.data(), msg.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    const int sends = cq->cqe - 1;
    for (int i = 0; i < sends; ++i) {
      ibv_sge sge = sge_of(msg.data(), msg.size(), mr->lkey);
      ibv_send_wr w{}, *bad = nullptr;
      w.wr_id = static_cast<uint64_t>(i);
      w.opcode = IBV_WR_SEND;
      w.sg_list = &sge;
      w.num_sge = 1;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.ud.ah = ah;
      w.wr.ud.remote_qpn = qp->qp_num;  // nobody receives: the datagrams are dropped
      w.wr.ud.remote_qkey = 0x11111111;
      ASSERT_EQ(ibv_post_send(qp, &w, &bad), 0);
    }
    ASSERT_EQ(ibv_resize_cq(cq, 1), EINVAL) << "round " << round;
    const std::vector<ibv_wc> wcs = poll_n(cq, static_cast<size_t>(sends));
    ASSERT_EQ(wcs.size(), static_cast<size_t>(sends));
    for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(ibv_resize_cq(cq, 1), 0);  // empty again
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    EXPECT_EQ(ibv_destroy_ah(ah), 0);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
}

// ---- ibv_import_device(3), ibv_import_pd/mr/dm(3) ----

// cmd_fd is a descriptor a program can dup(2); the copy imports a context that names the same
// objects: an imported PD and MR carry RC RDMA WRITEs from a QP and CQ made in the imported
// context to a QP of the original (rdma-core's test_imported_rc_ex_rdma_write).
TEST_F(Verbs, AnImportedContextCarriesTrafficThroughImportedObjects) {
  ASSERT_GE(ctx_->cmd_fd, 0);
  EXPECT_NE(fcntl(ctx_->cmd_fd, F_GETFD) & FD_CLOEXEC, 0);
  std::vector<uint8_t> src = random_bytes(4096, 71), dst(4096, 0);
  ibv_mr* src_mr = ibv_reg_mr(pd_, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = ibv_reg_mr(pd_, dst.data(), dst.size(),
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(src_mr, nullptr);
  ASSERT_NE(dst_mr, nullptr);
  ibv_context* imp = ibv_import_device(dup(ctx_->cmd_fd));
  ASSERT_NE(imp, nullptr) << std::strerror(errno);
  EXPECT_NE(imp, ctx_);
  EXPECT_NE(imp->cmd_fd, ctx_->cmd_fd);
  ibv_pd* ipd = ibv_import_pd(imp, pd_->handle);
  ASSERT_NE(ipd, nullptr) << std::strerror(errno);
  EXPECT_EQ(ipd->context, imp);
  EXPECT_EQ(ipd->handle, pd_->handle);
  ibv_mr* imr = ibv_import_mr(ipd, src_mr->handle);
  ASSERT_NE(imr, nullptr) << std::strerror(errno);
  EXPECT_EQ(imr->addr, nullptr);  // ibv_import_mr(3): "NULL value is expected"
  EXPECT_EQ(imr->length, src.size());
  EXPECT_EQ(imr->lkey, src_mr->lkey);
  EXPECT_EQ(imr->rkey, src_mr->rkey);
  EXPECT_EQ(imr->handle, src_mr->handle);
  EXPECT_EQ(imr->pd, ipd);

  ibv_cq* icq = ibv_create_cq(imp, 16, nullptr, nullptr, 0);
  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_NE(icq, nullptr);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = icq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ibv_qp* iqp = ibv_create_qp(ipd, &a);
  ASSERT_NE(iqp, nullptr) << std::strerror(errno);
  EXPECT_EQ(iqp->context, imp);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  connect(iqp, qp->qp_num);
  connect(qp, iqp->qp_num);
  for (int round = 0; round < 4; ++round) {
    const size_t off = static_cast<size_t>(round) * 1024;
    ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()) + off, 1024, imr->lkey};
    ibv_send_wr w{}, *bad = nullptr;
    w.wr_id = static_cast<uint64_t>(round);
    w.opcode = IBV_WR_RDMA_WRITE;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + off;
    w.wr.rdma.rkey = dst_mr->rkey;
    ASSERT_EQ(ibv_post_send(iqp, &w, &bad), 0);
    const std::vector<ibv_wc> wcs = poll_n(icq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[0].wr_id, static_cast<uint64_t>(round));
  }
  EXPECT_EQ(fnv1a(dst.data(), dst.size()), fnv1a(src.data(), src.size()));

  // Unimporting frees the user objects only: the MR and PD still work through the original.
  ibv_unimport_mr(imr);
  EXPECT_EQ(ibv_destroy_qp(iqp), 0);
  EXPECT_EQ(ibv_destroy_cq(icq), 0);
  ibv_unimport_pd(ipd);
  ibv_mr* again = ibv_reg_mr(pd_, dst.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_NE(again, nullptr);
  EXPECT_EQ(ibv_dereg_mr(again), 0);
  EXPECT_EQ(ibv_close_device(imp), 0);
  // Closing the imported context left the original's objects alone.
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dereg_mr(src_mr), 0);
  EXPECT_EQ(ibv_dereg_mr(dst_mr), 0);
}

// The objects of a device context live while any context naming it is open, as a uverbs
// file's do while one of its fds is: the original closes first and the imported context's
// objects (made in either) keep carrying traffic; the last close destroys them.
TEST_F(Verbs, ObjectsOutliveTheOriginalContextWhileAnImportIsOpen) {
  ibv_context* orig = ibv_open_device(list_[0]);
  ASSERT_NE(orig, nullptr);
  ibv_pd* pd = ibv_alloc_pd(orig);
  ASSERT_NE(pd, nullptr);
  std::vector<uint8_t> buf = random_bytes(2048, 72);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  const int copy = dup(orig->cmd_fd);
  ibv_context* imp = ibv_import_device(copy);
  ASSERT_NE(imp, nullptr) << std::strerror(errno);
  EXPECT_EQ(imp->cmd_fd, copy);  // the imported context owns the copy
  ibv_pd* ipd = ibv_import_pd(imp, pd->handle);
  ibv_mr* imr = ipd ? ibv_import_mr(ipd, mr->handle) : nullptr;
  ASSERT_NE(imr, nullptr);
  const uint32_t key = mr->lkey;
  EXPECT_EQ(ibv_close_device(orig), 0);

  ibv_cq* cq = ibv_create_cq(imp, 8, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 8;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(ipd, &a);
  ASSERT_NE(qp, nullptr) << std::strerror(errno);
  connect(qp, qp->qp_num);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 1024, imr->lkey};
  EXPECT_EQ(imr->lkey, key);
  ibv_send_wr w{}, *bad = nullptr;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data()) + 1024;
  w.wr.rdma.rkey = imr->rkey;
  ASSERT_EQ(ibv_post_send(qp, &w, &bad), 0);
  const std::vector<ibv_wc> wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf.data(), buf.data() + 1024, 1024), 0);
  // Destroying through the imported wrapper destroys the object: a second time is refused.
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
  EXPECT_EQ(ibv_import_mr(ipd, mr->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_close_device(imp), 0);  // frees the PD and the original's wrappers
}

// Device memory through an imported DM: bytes copied into the original read back through the
// import, and the other way (rdma-core's test_import_dm); unimport leaves the DM.
TEST_F(Verbs, AnImportedDmReadsAndWritesTheOriginalsBytes) {
  ibv_alloc_dm_attr da{};
  da.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(dm, nullptr) << std::strerror(errno);
  ibv_context* imp = ibv_import_device(dup(ctx_->cmd_fd));
  ASSERT_NE(imp, nullptr) << std::strerror(errno);
  ibv_dm* idm = ibv_import_dm(imp, dm->handle);
  ASSERT_NE(idm, nullptr) << std::strerror(errno);
  EXPECT_EQ(idm->context, imp);
  EXPECT_EQ(idm->handle, dm->handle);
  std::vector<uint8_t> in = random_bytes(4096, 73), out(4096, 0);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, in.data(), in.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), idm, 0, out.size()), 0);
  EXPECT_EQ(out, in);
  std::vector<uint8_t> in2 = random_bytes(256, 74), out2(256, 0);
  ASSERT_EQ(ibv_memcpy_to_dm(idm, 512, in2.data(), in2.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out2.data(), dm, 512, out2.size()), 0);
  EXPECT_EQ(out2, in2);
  ibv_unimport_dm(idm);
  EXPECT_EQ(ibv_close_device(imp), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), dm, 0, 64), 0);  // still there
  EXPECT_EQ(std::memcmp(out.data(), in.data(), 64), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

// Errnos: a handle the device context has no object of is ENOENT (the kernel's for a handle
// its file does not hold), a context opened separately shares nothing; a descriptor that is no
// command fd is EINVAL (rdma-core's for a descriptor that is no uverbs device), the command fd
// itself (not a copy) too; a command fd of no open context of this process — here, in a forked
// child — is EOPNOTSUPP.
TEST_F(Verbs, ImportsRefuseUnknownHandlesAndForeignDescriptors) {
  ibv_alloc_dm_attr da{};
  da.length = 64;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &da);
  ASSERT_NE(dm, nullptr);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(ctx_, pd_->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd_, mr->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(ctx_, dm->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);

  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(other, pd_->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(other, dm->handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_close_device(other), 0);

  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  errno = 0;
  EXPECT_EQ(ibv_import_device(null_fd), nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(null_fd);
  const int memfd = memfd_create("urdma-cmd", MFD_CLOEXEC);  // the name, not the seals
  errno = 0;
  EXPECT_EQ(ibv_import_device(memfd), nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(memfd);
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_device(ctx_->cmd_fd), nullptr);  // must be a copy
  EXPECT_EQ(errno, EINVAL);

  const int copy = dup(ctx_->cmd_fd);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    errno = 0;
    ibv_context* c = ibv_import_device(copy);
    _exit(c == nullptr && errno == EOPNOTSUPP ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(copy);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

// ---- events ----

TEST_F(Verbs, CompletionChannelFdWakesPollAndHandsBackTheCq) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  ASSERT_GE(ch->fd, 0);
  int tag = 11;
  ibv_cq* cq = ibv_create_cq(ctx_, 16, &tag, ch, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);  // the CQ uses it
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  connect(qp, qp->qp_num);
  pollfd pfd{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0);  // nothing yet
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 32, mr->lkey};
  ibv_send_wr w{}, *bad = nullptr;
  w.wr_id = 5;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data()) + 32;
  w.wr.rdma.rkey = mr->rkey;
  ASSERT_EQ(ibv_post_send(qp, &w, &bad), 0);
  // The engine thread completes the WR with nobody polling; the channel's fd becomes readable.
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  EXPECT_TRUE(pfd.revents & POLLIN);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, cq);
  EXPECT_EQ(ev_ctx, &tag);
  ibv_ack_cq_events(cq, 1);
  EXPECT_EQ(cq->comp_events_completed, 1u);
  std::vector<ibv_wc> wcs = poll_n(cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  // Disarmed after firing: another completion queues no event.
  ASSERT_EQ(ibv_post_send(qp, &w, &bad), 0);
  ASSERT_EQ(poll_n(cq, 1).size(), 1u);
  EXPECT_EQ(poll(&pfd, 1, 100), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// A forked child opens the device anew and gets a device of its own (a slot of its own from
// urdmad), as a child of an rdma-core program opens the uverbs device anew; the parent's
// context, still open, keeps working. (Python's multiprocessing forks rdma-core's rdmacm tests'
// players from a process that has the device open.)
TEST_F(Verbs, AForkedChildOpensADeviceOfItsOwn) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ibv_context* ctx = ibv_open_device(list_[0]);
    if (!ctx) _exit(10);
    ctx_ = ctx;  // the fixture's helpers work on the child's own context from here
    pd_ = ibv_alloc_pd(ctx);
    ibv_cq* cq = pd_ ? ibv_create_cq(ctx, 4, nullptr, nullptr, 0) : nullptr;
    if (!cq) _exit(11);
    ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
    if (!qp) _exit(12);
    connect(qp, qp->qp_num);
    std::vector<uint8_t> buf(8192);
    for (size_t i = 0; i < 4096; ++i) buf[i] = static_cast<uint8_t>(i * 13 + 5);
    ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) _exit(13);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 4096, mr->lkey};
    ibv_send_wr w{}, *bad = nullptr;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf.data()) + 4096;
    w.wr.rdma.rkey = mr->rkey;
    if (ibv_post_send(qp, &w, &bad) != 0) _exit(14);
    ibv_wc wc{};
    int n = 0;
    for (int i = 0; i < 5000 && n == 0; ++i) {
      n = ibv_poll_cq(cq, 1, &wc);
      if (n == 0) usleep(1000);
    }
    if (n != 1 || wc.status != IBV_WC_SUCCESS) _exit(15);
    if (fnv1a(buf.data(), 4096) != fnv1a(buf.data() + 4096, 4096)) _exit(16);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's step that failed (10 open ... 16 bytes)";
  // The parent's context still works.
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// CQ overrun (IBA 11.4.2.1): the async fd becomes readable with IBV_EVENT_CQ_ERR for that CQ.
TEST_F(Verbs, AsyncFdReportsCqOverrun) {
  ASSERT_GE(ctx_->async_fd, 0);
  pollfd pfd{ctx_->async_fd, POLLIN, 0};
  ibv_cq* cq = ibv_create_cq(ctx_, 1, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  connect(qp, qp->qp_num);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  overrun(qp, cq, mr, buf);
  ASSERT_EQ(poll(&pfd, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, cq);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(cq->async_events_completed, 1u);
  // A non-blocking async fd with no event: EAGAIN, as ibv_get_async_event(3) describes.
  const int flags = fcntl(ctx_->async_fd, F_GETFL);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  errno = 0;
  // Events for the QP may follow the CQ's (it can go to ERR); drain whatever is queued.
  while (ibv_get_async_event(ctx_, &ev) == 0) ibv_ack_async_event(&ev);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Each context has an async fd of its own, as each open of a uverbs device has (UCX registers
// every context's fd with its event loop): an object's event reaches the context that made the
// object, a port event reaches every context.
TEST_F(Verbs, EachContextHasItsOwnAsyncFdAndItsOwnObjectsEvents) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr);
  ASSERT_GE(other->async_fd, 0);
  EXPECT_NE(other->async_fd, ctx_->async_fd);
  // A CQ overrun of this context's CQ (as in AsyncFdReportsCqOverrun).
  ibv_cq* cq = ibv_create_cq(ctx_, 1, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_NE(qp, nullptr);
  connect(qp, qp->qp_num);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  overrun(qp, cq, mr, buf);
  pollfd mine{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&mine, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, cq);
  ibv_ack_async_event(&ev);
  pollfd theirs{other->async_fd, POLLIN, 0};
  EXPECT_EQ(poll(&theirs, 1, 200), 0) << "the other context got this context's CQ event";
  // A port event: both contexts see it.
  ASSERT_EQ(std::system("ip addr add 10.56.0.1/32 dev lo"), 0);
  auto gid_change_on = [](ibv_context* c) {
    pollfd pfd{c->async_fd, POLLIN, 0};
    for (int i = 0; i < 50; ++i) {
      if (poll(&pfd, 1, 100) != 1) continue;
      ibv_async_event e{};
      if (ibv_get_async_event(c, &e) != 0) return false;
      const bool match = e.event_type == IBV_EVENT_GID_CHANGE;
      ibv_ack_async_event(&e);
      if (match) return true;
    }
    return false;
  };
  EXPECT_TRUE(gid_change_on(other));
  EXPECT_TRUE(gid_change_on(ctx_));
  ASSERT_EQ(std::system("ip addr del 10.56.0.1/32 dev lo"), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_close_device(other), 0);
}

// The GID table follows the namespace's addresses while the device is open (urdmad watches
// rtnetlink; the library applies its updates) and says so with IBV_EVENT_GID_CHANGE.
TEST_F(Verbs, GidTableFollowsAddressChangesWithAGidChangeEvent) {
  ibv_gid want{};
  want.raw[10] = want.raw[11] = 0xff;
  want.raw[12] = 10;
  want.raw[13] = 55;
  want.raw[15] = 1;
  auto present = [&] {
    std::vector<ibv_gid_entry> table(64);
    const ssize_t n = ibv_query_gid_table(ctx_, table.data(), table.size(), 0);
    for (ssize_t i = 0; i < n; ++i)
      if (std::memcmp(&table[i].gid, &want, sizeof want) == 0) return true;
    return false;
  };
  auto eventually = [&](bool value) {
    for (int i = 0; i < 500; ++i) {
      if (present() == value) return true;
      usleep(10000);
    }
    return false;
  };
  // A GID_CHANGE event for port 1 arrives within 5 s (other events are passed over).
  auto gid_change_event = [&] {
    pollfd pfd{ctx_->async_fd, POLLIN, 0};
    for (int i = 0; i < 50; ++i) {
      if (poll(&pfd, 1, 100) != 1) continue;
      ibv_async_event ev{};
      if (ibv_get_async_event(ctx_, &ev) != 0) return false;
      const bool match = ev.event_type == IBV_EVENT_GID_CHANGE && ev.element.port_num == kPort;
      ibv_ack_async_event(&ev);
      if (match) return true;
    }
    return false;
  };
  ASSERT_FALSE(present());
  ASSERT_EQ(std::system("ip addr add 10.55.0.1/32 dev lo"), 0);
  EXPECT_TRUE(eventually(true)) << "10.55.0.1 never appeared in the GID table";
  EXPECT_TRUE(gid_change_event());
  ASSERT_EQ(std::system("ip addr del 10.55.0.1/32 dev lo"), 0);
  EXPECT_TRUE(eventually(false)) << "10.55.0.1 stayed in the GID table";
  EXPECT_TRUE(gid_change_event());
}

// ---- contexts ----

TEST_F(Verbs, ContextsRefuseEachOthersObjectsAndCloseCleansUp) {
  ibv_context* other = ibv_open_device(list_[0]);
  ASSERT_NE(other, nullptr) << std::strerror(errno);
  ibv_pd* opd = ibv_alloc_pd(other);
  ibv_cq* ocq = ibv_create_cq(other, 16, nullptr, nullptr, 0);
  ibv_cq* cq = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(opd && ocq && cq);
  // A CQ of another context: EINVAL.
  ibv_qp_init_attr init{};
  init.send_cq = ocq;
  init.recv_cq = ocq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &init), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // Two contexts never share a QPN (one slot, one QPN range for the process).
  init.send_cq = init.recv_cq = ocq;
  ibv_qp* oqp = ibv_create_qp(opd, &init);
  ibv_qp* qp = make_qp(IBV_QPT_RC, cq, cq);
  ASSERT_TRUE(oqp && qp);
  EXPECT_NE(oqp->qp_num, qp->qp_num);
  // Closing a context with objects left destroys them (and frees what the library allocated
  // for them: ASan's leak check); this context is untouched. A completion channel whose CQ was
  // left can be destroyed afterwards (rdma-core leaves that order undefined; urdma allows it).
  std::vector<uint8_t> buf(4096);
  ASSERT_NE(ibv_reg_mr(opd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE), nullptr);
  ibv_comp_channel* och = ibv_create_comp_channel(other);
  ASSERT_NE(och, nullptr);
  ASSERT_NE(ibv_create_cq(other, 4, nullptr, och, 0), nullptr);
  ibv_srq_init_attr si{};
  si.attr.max_wr = 4;
  si.attr.max_sge = 1;
  ASSERT_NE(ibv_create_srq(opd, &si), nullptr);
  ASSERT_NE(ibv_alloc_mw(opd, IBV_MW_TYPE_2), nullptr);
  EXPECT_EQ(ibv_close_device(other), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(och), 0);
  ibv_qp_attr a{};
  ibv_qp_init_attr qi{};
  EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

}  // namespace
}  // namespace urdma::verbs_test
