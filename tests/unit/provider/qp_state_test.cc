// QP state machine: every (current state, next state, QP type) against an independent
// transcription of the kernel's qp_state_table (drivers/infiniband/core/verbs.c), exercised
// through Qp::modify on real QPs driven into each state.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "provider/device.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

constexpr ibv_qp_state R = IBV_QPS_RESET, I = IBV_QPS_INIT, RTR = IBV_QPS_RTR, RTS = IBV_QPS_RTS,
                       SQD = IBV_QPS_SQD, SQE = IBV_QPS_SQE, E = IBV_QPS_ERR;
constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
constexpr ibv_qp_state kStates[] = {R, I, RTR, RTS, SQD, SQE, E};

struct Row {
  ibv_qp_state cur, next;
  ibv_qp_type type;
  int required, optional;
};

// Transcribed row by row from the kernel table (one row per type; "any → RESET/ERR" rows are
// generated below).
const std::vector<Row>& rows() {
  static const std::vector<Row> r = [] {
    std::vector<Row> v;
    const int kPkPortAcc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const int kPkPortQkey = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    v.push_back({R, I, IBV_QPT_RC, kPkPortAcc, 0});
    v.push_back({R, I, IBV_QPT_UC, kPkPortAcc, 0});
    v.push_back({R, I, IBV_QPT_UD, kPkPortQkey, 0});
    v.push_back({I, I, IBV_QPT_RC, 0, kPkPortAcc});
    v.push_back({I, I, IBV_QPT_UC, 0, kPkPortAcc});
    v.push_back({I, I, IBV_QPT_UD, 0, kPkPortQkey});
    v.push_back({I, RTR, IBV_QPT_RC,
                 IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                 IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX});
    v.push_back({I, RTR, IBV_QPT_UC, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
                 IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX});
    v.push_back({I, RTR, IBV_QPT_UD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY});
    v.push_back({RTR, RTS, IBV_QPT_RC,
                 IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                     IBV_QP_MAX_QP_RD_ATOMIC,
                 IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                     IBV_QP_PATH_MIG_STATE});
    v.push_back({RTR, RTS, IBV_QPT_UC, IBV_QP_SQ_PSN,
                 IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE});
    v.push_back({RTR, RTS, IBV_QPT_UD, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY});
    for (ibv_qp_state from : {RTS, SQD}) {
      v.push_back({from, RTS, IBV_QPT_RC, 0,
                   IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                       IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER});
      v.push_back(
          {from, RTS, IBV_QPT_UC, 0,
           IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE});
      v.push_back({from, RTS, IBV_QPT_UD, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY});
    }
    for (ibv_qp_type t : kTypes) v.push_back({RTS, SQD, t, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY});
    v.push_back({SQD, SQD, IBV_QPT_RC, 0,
                 IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                     IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
                     IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
                     IBV_QP_PATH_MIG_STATE});
    v.push_back({SQD, SQD, IBV_QPT_UC, 0,
                 IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                     IBV_QP_PATH_MIG_STATE});
    v.push_back({SQD, SQD, IBV_QPT_UD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY});
    v.push_back({SQE, RTS, IBV_QPT_RC, 0, 0});
    v.push_back({SQE, RTS, IBV_QPT_UC, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS});
    v.push_back({SQE, RTS, IBV_QPT_UD, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY});
    for (ibv_qp_state s : kStates) {
      for (ibv_qp_type t : kTypes) {
        v.push_back({s, R, t, 0, 0});
        if (s != R) v.push_back({s, E, t, 0, 0});
      }
    }
    return v;
  }();
  return r;
}

std::optional<Row> find_row(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type) {
  for (const Row& row : rows())
    if (row.cur == cur && row.next == next && row.type == type) return row;
  return std::nullopt;
}

constexpr int kStandardBits = (IBV_QP_DEST_QPN << 1) - 1;

std::string name(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type) {
  static constexpr const char* kTypeNames[] = {"", "", "RC", "UC", "UD"};
  return std::string(kTypeNames[type]) + " " + std::to_string(cur) + "->" + std::to_string(next);
}

TEST(QpStateTable, MatchesKernelTableForEveryTransition) {
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state cur : kStates) {
      for (ibv_qp_state next : kStates) {
        const std::optional<Row> row = find_row(cur, next, type);
        const QpTransitionMasks m = qp_transition_masks(cur, next, type);
        SCOPED_TRACE(name(cur, next, type));
        ASSERT_EQ(m.valid, row.has_value());
        if (!row) continue;
        EXPECT_EQ(m.required, row->required);
        EXPECT_EQ(m.optional, row->optional);
      }
    }
  }
}

TEST(QpStateTable, OtherQpTypesAreNeverValid) {
  EXPECT_FALSE(qp_transition_masks(R, I, IBV_QPT_RAW_PACKET).valid);
  EXPECT_FALSE(qp_transition_masks(R, I, IBV_QPT_DRIVER).valid);
}

// The kernel's qp_state_table for XRC_INI (IBV_QPT_XRC_SEND) and XRC_TGT (IBV_QPT_XRC_RECV):
// the initiator needs RC's requester attributes and none of its responder's, the target the
// reverse; neither has an SQE → RTS.
TEST(QpStateTable, XrcInitiatorAndTargetMasksAreTheKernels) {
  constexpr int kInit = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  constexpr int kRtrCommon = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  EXPECT_EQ(qp_transition_masks(R, I, IBV_QPT_XRC_SEND).required, kInit);
  EXPECT_EQ(qp_transition_masks(R, I, IBV_QPT_XRC_RECV).required, kInit);
  EXPECT_EQ(qp_transition_masks(I, RTR, IBV_QPT_XRC_SEND).required, kRtrCommon);
  EXPECT_EQ(qp_transition_masks(I, RTR, IBV_QPT_XRC_RECV).required,
            kRtrCommon | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(qp_transition_masks(RTR, RTS, IBV_QPT_XRC_SEND).required,
            IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                IBV_QP_MAX_QP_RD_ATOMIC);
  EXPECT_EQ(qp_transition_masks(RTR, RTS, IBV_QPT_XRC_RECV).required,
            IBV_QP_TIMEOUT | IBV_QP_SQ_PSN);
  // The initiator has no responder: MAX_DEST_RD_ATOMIC on its INIT → RTR is EINVAL.
  EXPECT_FALSE(modify_qp_is_ok(I, RTR, IBV_QPT_XRC_SEND,
                               IBV_QP_STATE | kRtrCommon | IBV_QP_MAX_DEST_RD_ATOMIC));
  EXPECT_TRUE(modify_qp_is_ok(RTR, RTS, IBV_QPT_XRC_RECV,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN |
                                  IBV_QP_MIN_RNR_TIMER));
  EXPECT_FALSE(qp_transition_masks(IBV_QPS_SQE, RTS, IBV_QPT_XRC_SEND).optional);
}

TEST(QpStateTable, CurStateOnlyFromRtrRtsSqdSqe) {
  // IBA 11.2.5.2 / ib_modify_qp_is_ok: IBV_QP_CUR_STATE is refused from RESET, INIT and ERR
  // even where the transition itself is valid.
  EXPECT_FALSE(modify_qp_is_ok(I, E, IBV_QPT_RC, IBV_QP_STATE | IBV_QP_CUR_STATE));
  EXPECT_TRUE(modify_qp_is_ok(RTS, RTS, IBV_QPT_RC, IBV_QP_STATE | IBV_QP_CUR_STATE));
}

class QpTransitionTest : public ProviderTest {};

// Every reachable (cur, next, type) through Qp::modify: the required mask succeeds, each
// missing required bit is EINVAL, each bit outside required|optional is EINVAL, each optional
// bit is accepted, and a failed modify leaves the state unchanged.
TEST_F(QpTransitionTest, EveryTransitionThroughModify) {
  int checked = 0;
  for (ibv_qp_type type : kTypes) {
    for (ibv_qp_state cur : kStates) {
      if (cur == SQE && type == IBV_QPT_RC) continue;  // RC never enters SQE (IBA 10.3.1.5)
      for (ibv_qp_state next : kStates) {
        SCOPED_TRACE(name(cur, next, type));
        const std::optional<Row> row = find_row(cur, next, type);
        const ibv_qp_attr attr = valid_attr(cur, next);
        auto fresh = [&] {
          Qp* qp = make_qp(type);
          drive(qp, cur);
          return qp;
        };
        auto expect_fail = [&](int mask) {
          Qp* qp = fresh();
          EXPECT_EQ(qp->modify(attr, mask).error(), EINVAL) << "mask " << std::hex << mask;
          EXPECT_EQ(qp->state(), cur);
          EXPECT_EQ(dev_.destroy_qp(qp), kOk);
          ++checked;
        };
        auto expect_ok = [&](int mask) {
          Qp* qp = fresh();
          EXPECT_EQ(qp->modify(attr, mask), kOk) << "mask " << std::hex << mask;
          EXPECT_EQ(qp->state(), next);
          EXPECT_EQ(dev_.destroy_qp(qp), kOk);
          ++checked;
        };
        if (!row) {
          expect_fail(IBV_QP_STATE);
          continue;
        }
        const int base = row->required | IBV_QP_STATE;
        expect_ok(base);
        for (int bit = 1; bit <= kStandardBits; bit <<= 1) {
          if (bit == IBV_QP_STATE) continue;
          if (row->required & bit) {
            expect_fail(base & ~bit);
          } else if (row->optional & bit) {
            // RoCE has no alternate path: the kernel refuses IB_QP_ALT_PATH on RoCE ports.
            if (bit == IBV_QP_ALT_PATH)
              expect_fail(base | bit);
            else
              expect_ok(base | bit);
          } else {
            expect_fail(base | bit);
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST_F(QpTransitionTest, SameStateModifyWithoutStateBit) {
  Qp* qp = make_qp(IBV_QPT_RC);
  drive(qp, RTS);
  ibv_qp_attr attr = valid_attr(RTS, RTS);
  attr.min_rnr_timer = 20;
  ASSERT_EQ(qp->modify(attr, IBV_QP_MIN_RNR_TIMER), kOk);
  EXPECT_EQ(qp->attr_snapshot().min_rnr_timer, 20);
  // Not allowed from RTS without STATE either.
  EXPECT_EQ(qp->modify(attr, IBV_QP_PATH_MTU).error(), EINVAL);
}

TEST_F(QpTransitionTest, StatedCurrentStateMustBeTheRealOne) {
  Qp* qp = make_qp(IBV_QPT_RC);
  drive(qp, RTS);
  ibv_qp_attr attr = valid_attr(RTR, RTS);  // claims RTR
  EXPECT_EQ(qp->modify(attr, IBV_QP_STATE | IBV_QP_CUR_STATE).error(), EINVAL);
  attr.cur_qp_state = RTS;
  EXPECT_EQ(qp->modify(attr, IBV_QP_STATE | IBV_QP_CUR_STATE), kOk);
}

TEST_F(QpTransitionTest, NonStandardMaskBitsAreNotSupported) {
  Qp* qp = make_qp(IBV_QPT_RC);
  EXPECT_EQ(
      qp->modify(valid_attr(R, I), required_mask(R, I, IBV_QPT_RC) | IBV_QP_RATE_LIMIT).error(),
      EOPNOTSUPP);
  ibv_qp_attr attr = valid_attr(R, I);
  attr.qp_state = static_cast<ibv_qp_state>(IBV_QPS_ERR + 1);
  EXPECT_EQ(qp->modify(attr, required_mask(R, I, IBV_QPT_RC)).error(), EINVAL);
}

struct BadValue {
  const char* what;
  ibv_qp_state cur, next;
  int bit;
  void (*spoil)(ibv_qp_attr&);
};

TEST_F(QpTransitionTest, AttributeValuesAreValidated) {
  const BadValue kCases[] = {
      {"pkey index 1", R, I, IBV_QP_PKEY_INDEX, [](ibv_qp_attr& a) { a.pkey_index = 1; }},
      {"port 2", R, I, IBV_QP_PORT, [](ibv_qp_attr& a) { a.port_num = 2; }},
      {"access bit FLUSH_GLOBAL", R, I, IBV_QP_ACCESS_FLAGS,
       [](ibv_qp_attr& a) { a.qp_access_flags = 1 << 8; }},
      {"access bit 15", R, I, IBV_QP_ACCESS_FLAGS,
       [](ibv_qp_attr& a) { a.qp_access_flags = 1 << 15; }},
      {"mtu 0", I, RTR, IBV_QP_PATH_MTU, [](ibv_qp_attr& a) { a.path_mtu = ibv_mtu(0); }},
      {"mtu 6", I, RTR, IBV_QP_PATH_MTU, [](ibv_qp_attr& a) { a.path_mtu = ibv_mtu(6); }},
      {"dest qpn 25 bits", I, RTR, IBV_QP_DEST_QPN,
       [](ibv_qp_attr& a) { a.dest_qp_num = 1u << 24; }},
      {"max_dest_rd_atomic 129", I, RTR, IBV_QP_MAX_DEST_RD_ATOMIC,
       [](ibv_qp_attr& a) { a.max_dest_rd_atomic = 129; }},
      {"min_rnr_timer 32", I, RTR, IBV_QP_MIN_RNR_TIMER,
       [](ibv_qp_attr& a) { a.min_rnr_timer = 32; }},
      {"AV not global", I, RTR, IBV_QP_AV, [](ibv_qp_attr& a) { a.ah_attr.is_global = 0; }},
      {"AV port 2", I, RTR, IBV_QP_AV, [](ibv_qp_attr& a) { a.ah_attr.port_num = 2; }},
      {"AV empty sgid", I, RTR, IBV_QP_AV, [](ibv_qp_attr& a) { a.ah_attr.grh.sgid_index = 1; }},
      {"timeout 32", RTR, RTS, IBV_QP_TIMEOUT, [](ibv_qp_attr& a) { a.timeout = 32; }},
      {"retry_cnt 8", RTR, RTS, IBV_QP_RETRY_CNT, [](ibv_qp_attr& a) { a.retry_cnt = 8; }},
      {"rnr_retry 8", RTR, RTS, IBV_QP_RNR_RETRY, [](ibv_qp_attr& a) { a.rnr_retry = 8; }},
      {"max_rd_atomic 129", RTR, RTS, IBV_QP_MAX_QP_RD_ATOMIC,
       [](ibv_qp_attr& a) { a.max_rd_atomic = 129; }},
      {"path mig state 3", RTR, RTS, IBV_QP_PATH_MIG_STATE,
       [](ibv_qp_attr& a) { a.path_mig_state = ibv_mig_state(3); }},
  };
  for (const BadValue& c : kCases) {
    SCOPED_TRACE(c.what);
    Qp* qp = make_qp(IBV_QPT_RC);
    drive(qp, c.cur);
    ibv_qp_attr attr = valid_attr(c.cur, c.next);
    const int mask = required_mask(c.cur, c.next, IBV_QPT_RC) | c.bit;
    ASSERT_EQ(qp->modify(attr, mask), kOk) << "the unspoiled attributes must pass";
    Qp* qp2 = make_qp(IBV_QPT_RC);
    drive(qp2, c.cur);
    c.spoil(attr);
    EXPECT_EQ(qp2->modify(attr, mask).error(), EINVAL);
    EXPECT_EQ(qp2->state(), c.cur);
  }
}

TEST_F(QpTransitionTest, PathMtuAboveTheActiveMtuIsRefused) {
  DeviceConfig config = test_config();
  config.active_mtu = IBV_MTU_1024;
  Device dev(config);
  Pd* pd = dev.alloc_pd().value();
  Cq* cq = dev.create_cq(8).value();
  Qp* qp = dev.create_qp({.qp_type = IBV_QPT_RC, .pd = pd, .send_cq = cq, .recv_cq = cq}).value();
  ASSERT_EQ(qp->modify(valid_attr(R, I), required_mask(R, I, IBV_QPT_RC)), kOk);
  ibv_qp_attr attr = valid_attr(I, RTR);
  attr.path_mtu = IBV_MTU_2048;
  EXPECT_EQ(qp->modify(attr, required_mask(I, RTR, IBV_QPT_RC)).error(), EINVAL);
  attr.path_mtu = IBV_MTU_1024;
  EXPECT_EQ(qp->modify(attr, required_mask(I, RTR, IBV_QPT_RC)), kOk);
}

TEST_F(QpTransitionTest, QueryReturnsWhatWasSet) {
  Qp* qp = make_qp(IBV_QPT_RC);
  drive(qp, RTS);
  ibv_qp_attr attr = {};
  ibv_qp_init_attr init = {};
  ASSERT_EQ(qp->query(&attr, ~0, &init), kOk);
  const ibv_qp_attr want = valid_attr(RTR, RTS);
  EXPECT_EQ(attr.qp_state, RTS);
  EXPECT_EQ(attr.cur_qp_state, RTS);
  EXPECT_EQ(attr.pkey_index, want.pkey_index);
  EXPECT_EQ(attr.port_num, 1);
  EXPECT_EQ(attr.qp_access_flags, want.qp_access_flags);
  EXPECT_EQ(attr.path_mtu, want.path_mtu);
  EXPECT_EQ(attr.dest_qp_num, want.dest_qp_num);
  EXPECT_EQ(attr.rq_psn, want.rq_psn);
  EXPECT_EQ(attr.sq_psn, want.sq_psn);
  EXPECT_EQ(attr.max_dest_rd_atomic, want.max_dest_rd_atomic);
  EXPECT_EQ(attr.max_rd_atomic, want.max_rd_atomic);
  EXPECT_EQ(attr.min_rnr_timer, want.min_rnr_timer);
  EXPECT_EQ(attr.timeout, want.timeout);
  EXPECT_EQ(attr.retry_cnt, want.retry_cnt);
  EXPECT_EQ(attr.rnr_retry, want.rnr_retry);
  EXPECT_EQ(0, std::memcmp(&attr.ah_attr.grh.dgid, &want.ah_attr.grh.dgid, sizeof(ibv_gid)));
  EXPECT_EQ(attr.ah_attr.grh.flow_label, want.ah_attr.grh.flow_label);
  EXPECT_EQ(attr.cap.max_send_wr, qp->cap().max_send_wr);
  EXPECT_EQ(init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(init.cap.max_recv_wr, qp->cap().max_recv_wr);
  EXPECT_EQ(init.sq_sig_all, 0);
  // The resolved primary path is the IPv4 address of the destination GID.
  const AddressVector av = qp->path_snapshot();
  EXPECT_EQ(av.family, AddressVector::Family::kIpv4);
  EXPECT_EQ(av.dest_ip[3], 2);
}

TEST_F(QpTransitionTest, PsnsAreMaskedTo24Bits) {
  // The kernel masks wider PSNs to 24 bits (with a warning) instead of failing.
  Qp* qp = make_qp(IBV_QPT_UC);
  drive(qp, I);
  ibv_qp_attr attr = valid_attr(I, RTR);
  attr.rq_psn = 0x12abcdef;
  ASSERT_EQ(qp->modify(attr, required_mask(I, RTR, IBV_QPT_UC)), kOk);
  attr = valid_attr(RTR, RTS);
  attr.sq_psn = 0xff000001;
  ASSERT_EQ(qp->modify(attr, required_mask(RTR, RTS, IBV_QPT_UC)), kOk);
  EXPECT_EQ(qp->attr_snapshot().rq_psn, 0xabcdefu);
  EXPECT_EQ(qp->attr_snapshot().sq_psn, 0x000001u);
}

TEST_F(QpTransitionTest, ResetClearsAttributesAndEngineErrorStates) {
  Qp* qp = make_qp(IBV_QPT_UD);
  drive(qp, RTS);
  // The engine's error transitions: SQE for UD, and an RC send error becomes ERR.
  EXPECT_TRUE(qp->enter_error_st(SQE));
  EXPECT_EQ(qp->state(), SQE);
  EXPECT_EQ(qp->modify(valid_attr(SQE, RTS), IBV_QP_STATE), kOk);
  EXPECT_EQ(qp->state(), RTS);
  EXPECT_TRUE(qp->enter_error_st(E));
  EXPECT_FALSE(qp->enter_error_st(E));
  EXPECT_EQ(qp->modify(valid_attr(E, R), IBV_QP_STATE), kOk);
  EXPECT_EQ(qp->attr_snapshot().qkey, 0u);
  EXPECT_FALSE(qp->enter_error_st(E)) << "RESET is left only by modify";

  Qp* rc = make_qp(IBV_QPT_RC);
  drive(rc, RTS);
  EXPECT_TRUE(rc->enter_error_st(SQE));
  EXPECT_EQ(rc->state(), E);
}

TEST_F(QpTransitionTest, SqdDrainNotification) {
  Qp* qp = make_qp(IBV_QPT_RC);
  drive(qp, RTS);
  ibv_qp_attr attr = valid_attr(RTS, SQD);
  ASSERT_EQ(qp->modify(attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), kOk);
  EXPECT_EQ(qp->attr_snapshot().sq_draining, 1);
  qp->sq_drained_st();
  EXPECT_EQ(qp->attr_snapshot().sq_draining, 0);
  std::optional<AsyncEvent> ev = dev_.async_events().try_pop();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(ev->qp, qp);
  qp->sq_drained_st();  // once only
  EXPECT_FALSE(dev_.async_events().try_pop().has_value());
}

}  // namespace
}  // namespace urdma::provider::testing
