// Shared helpers for the provider tests: a device with one IPv4-mapped GID, and QPs driven
// through the real state machine.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "provider/device.h"
#include "provider/engine_turn.h"

namespace urdma::provider::testing {

// The provider tests play the engine: the `_st` methods they call assert that their thread holds
// the engine's turn (provider/engine_turn.h). The main thread holds one for the whole run; a
// test's own engine thread takes its own.
inline const EngineTurnMark kMainThreadIsTheEngine;

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

// Checks that the tags (upper 24 bits) of at least 10,000 keys look like uniform draws from the
// whole 24-bit space: every one of the 256 top bytes occurs, the largest key is above 0xF0000000
// and the smallest below 0x10000000, and each of the 24 tag bits is set in 45% to 55% of the
// keys. A scheme with 20 random bits (slot indices below 2^20, or any tag bit fixed) fails: its
// top byte is 0, or a bit is set in 0% or 100% of the keys. Uniform draws pass but with
// probability below 2^-47: a given top byte is missed with probability (255/256)^10000 < e^-39,
// and 5% of 10,000 is 10 standard deviations of a bit's count.
inline void expect_uniform_tags(const std::vector<uint32_t>& keys) {
  ASSERT_GE(keys.size(), 10'000u);
  std::array<size_t, 256> top{};
  std::array<size_t, 24> ones{};
  for (uint32_t key : keys) {
    ++top[key >> 24];
    for (unsigned b = 0; b < ones.size(); ++b) ones[b] += (key >> (8 + b)) & 1;
  }
  for (size_t i = 0; i < top.size(); ++i) EXPECT_GT(top[i], 0u) << "no key with top byte " << i;
  EXPECT_GT(*std::max_element(keys.begin(), keys.end()), 0xF0000000u);
  EXPECT_LT(*std::min_element(keys.begin(), keys.end()), 0x10000000u);
  for (unsigned b = 0; b < ones.size(); ++b) {
    EXPECT_GE(ones[b] * 100, keys.size() * 45) << "tag bit " << b;
    EXPECT_LE(ones[b] * 100, keys.size() * 55) << "tag bit " << b;
  }
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
