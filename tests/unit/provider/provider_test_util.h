// Shared helpers for the provider tests: a device with one IPv4-mapped GID, and QPs driven
// through the real state machine.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "provider/device.h"

namespace urdma::provider::testing {

// ::ffff:192.0.2.1 (TEST-NET-1).
inline ibv_gid ipv4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  ibv_gid gid = {};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  gid.raw[12] = a;
  gid.raw[13] = b;
  gid.raw[14] = c;
  gid.raw[15] = d;
  return gid;
}

inline DeviceConfig test_config(Doorbell* doorbell = nullptr) {
  DeviceConfig c;
  c.gids = {ipv4_gid(192, 0, 2, 1)};
  c.active_mtu = IBV_MTU_4096;
  c.doorbell = doorbell;
  return c;
}

inline ibv_ah_attr global_ah_attr(const ibv_gid& dgid) {
  ibv_ah_attr a = {};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.dgid = dgid;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 64;
  a.grh.traffic_class = 0x28;
  a.grh.flow_label = 0x12345;
  a.sl = 3;
  return a;
}

// Attribute values valid for every mask bit of every transition.
inline ibv_qp_attr valid_attr(ibv_qp_state cur, ibv_qp_state next) {
  ibv_qp_attr a = {};
  a.qp_state = next;
  a.cur_qp_state = cur;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qkey = 0x11111111;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  a.ah_attr = global_ah_attr(ipv4_gid(192, 0, 2, 2));
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x1234;
  a.rq_psn = 0x100;
  a.sq_psn = 0x200;
  a.max_dest_rd_atomic = 4;
  a.max_rd_atomic = 4;
  a.min_rnr_timer = 12;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.path_mig_state = IBV_MIG_MIGRATED;
  a.en_sqd_async_notify = 1;
  return a;
}

class ProviderTest : public ::testing::Test {
 protected:
  explicit ProviderTest(Doorbell* doorbell = nullptr) : dev_(test_config(doorbell)) {}

  Pd* pd() {
    if (pd_ == nullptr) pd_ = dev_.alloc_pd().value();
    return pd_;
  }
  Cq* cq() {
    if (cq_ == nullptr) cq_ = dev_.create_cq(64).value();
    return cq_;
  }

  Qp* make_qp(ibv_qp_type type, Srq* srq = nullptr, ibv_qp_cap cap = {16, 16, 4, 4, 64}) {
    QpInitAttr init;
    init.qp_type = type;
    init.pd = pd();
    init.send_cq = cq();
    init.recv_cq = cq();
    init.srq = srq;
    init.cap = cap;
    Result<Qp*> qp = dev_.create_qp(init);
    EXPECT_TRUE(qp.ok()) << qp.error();
    return qp.value();
  }

  // The minimal mask of the transition (required bits | STATE).
  static int required_mask(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type) {
    return qp_transition_masks(cur, next, type).required | IBV_QP_STATE;
  }

  // Drives qp through RESET → INIT → RTR → RTS → SQD as far as `target` (SQE via the engine
  // interface, ERR by modify).
  void drive(Qp* qp, ibv_qp_state target) {
    static constexpr ibv_qp_state kPath[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
    if (target == IBV_QPS_ERR) {
      drive(qp, IBV_QPS_INIT);  // RESET → ERR is not a transition (kernel table)
      ASSERT_EQ(qp->modify(valid_attr(qp->state(), IBV_QPS_ERR), IBV_QP_STATE), kOk);
      return;
    }
    const ibv_qp_state last =
        (target == IBV_QPS_SQD || target == IBV_QPS_SQE) ? IBV_QPS_RTS : target;
    for (size_t i = 1; i < std::size(kPath) && kPath[i - 1] != last; ++i) {
      const ibv_qp_state cur = kPath[i - 1];
      const ibv_qp_state next = kPath[i];
      ASSERT_EQ(qp->modify(valid_attr(cur, next), required_mask(cur, next, qp->type())), kOk)
          << "driving to " << next;
    }
    if (target == IBV_QPS_SQD) {
      ASSERT_EQ(qp->modify(valid_attr(IBV_QPS_RTS, IBV_QPS_SQD), IBV_QP_STATE), kOk);
    }
    if (target == IBV_QPS_SQE) {
      ASSERT_TRUE(qp->enter_error_st(IBV_QPS_SQE));
    }
    ASSERT_EQ(qp->state(), target);
  }

  Device dev_;
  Pd* pd_ = nullptr;
  Cq* cq_ = nullptr;
};

}  // namespace urdma::provider::testing
