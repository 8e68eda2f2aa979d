// The QP state transition table (IBA 11.2.5.2, table 93 "QP state transition properties"),
// as the Linux kernel's qp_state_table in drivers/infiniband/core/verbs.c defines it for RC, UC,
// UD and the two XRC types (XRC_INI = IBV_QPT_XRC_SEND, XRC_TGT = IBV_QPT_XRC_RECV). `required` bits must all be in the modify mask; the mask may add only `optional`
// bits and IBV_QP_STATE. Transitions not listed are illegal.
#include "provider/qp.h"

#include <array>

namespace urdma::provider {
namespace {

constexpr int kStates = IBV_QPS_ERR + 1;

// Per QP type: RC, UC, UD, XRC initiator, XRC target.
struct TypeMasks {
  int rc = 0, uc = 0, ud = 0, xrc_ini = 0, xrc_tgt = 0;
};
struct Transition {
  bool valid = false;
  TypeMasks required;
  TypeMasks optional;
};
using Table = std::array<std::array<Transition, kStates>, kStates>;

constexpr TypeMasks same(int m) {
  return {m, m, m, m, m};
}

constexpr Table make_table() {
  Table t{};
  // Any state → RESET, and any state but RESET → ERR, with no attributes (IBA 10.3.1; the
  // kernel table has no RESET → ERR entry).
  for (int s = 0; s < kStates; ++s) {
    t[s][IBV_QPS_RESET].valid = true;
    if (s != IBV_QPS_RESET) t[s][IBV_QPS_ERR].valid = true;
  }
  // RESET → INIT.
  t[IBV_QPS_RESET][IBV_QPS_INIT] = {
      .valid = true,
      .required = {.rc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .uc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .ud = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                   .xrc_ini = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .xrc_tgt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS}};
  // INIT → INIT.
  t[IBV_QPS_INIT][IBV_QPS_INIT] = {
      .valid = true,
      .optional = {.rc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .uc = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .ud = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                   .xrc_ini = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                   .xrc_tgt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS}};
  // INIT → RTR.
  t[IBV_QPS_INIT][IBV_QPS_RTR] = {
      .valid = true,
      .required = {.rc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                   .uc = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
                   .ud = 0,
                   .xrc_ini = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
                   .xrc_tgt = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
      .optional = {.rc = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                   .uc = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                   .ud = IBV_QP_PKEY_INDEX | IBV_QP_QKEY,
                   .xrc_ini = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                   .xrc_tgt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX}};
  // RTR → RTS.
  t[IBV_QPS_RTR][IBV_QPS_RTS] = {
      .valid = true,
      .required = {.rc = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC,
                   .uc = IBV_QP_SQ_PSN,
                   .ud = IBV_QP_SQ_PSN,
                   .xrc_ini = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                   .xrc_tgt = IBV_QP_TIMEOUT | IBV_QP_SQ_PSN},
      .optional = {
          .rc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                IBV_QP_PATH_MIG_STATE,
          .uc = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE,
          .ud = IBV_QP_CUR_STATE | IBV_QP_QKEY,
          .xrc_ini =
              IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE,
          .xrc_tgt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                     IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE}};
  // RTS → RTS.
  t[IBV_QPS_RTS][IBV_QPS_RTS] = {
      .valid = true,
      .optional = {
          .rc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                IBV_QP_MIN_RNR_TIMER,
          .uc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE,
          .ud = IBV_QP_CUR_STATE | IBV_QP_QKEY,
          .xrc_ini =
              IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE,
          .xrc_tgt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                     IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER}};
  // RTS → SQD.
  t[IBV_QPS_RTS][IBV_QPS_SQD] = {.valid = true, .optional = same(IBV_QP_EN_SQD_ASYNC_NOTIFY)};
  // SQD → RTS.
  t[IBV_QPS_SQD][IBV_QPS_RTS] = t[IBV_QPS_RTS][IBV_QPS_RTS];  // the same optional bits
  // SQD → SQD.
  t[IBV_QPS_SQD][IBV_QPS_SQD] = {
      .valid = true,
      .optional = {.rc = IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                         IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                         IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE,
                   .uc = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
                         IBV_QP_PATH_MIG_STATE,
                   .ud = IBV_QP_PKEY_INDEX | IBV_QP_QKEY,
                   .xrc_ini = IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                              IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ALT_PATH |
                              IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE,
                   .xrc_tgt = IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                              IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE}};
  // SQE → RTS (IBA 10.3.1.5: UC/UD recover from a send queue error; RC and XRC never enter
  // SQE, and the kernel table gives them no optional attributes here).
  t[IBV_QPS_SQE][IBV_QPS_RTS] = {.valid = true,
                                 .optional = {.rc = 0,
                                              .uc = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS,
                                              .ud = IBV_QP_CUR_STATE | IBV_QP_QKEY}};
  return t;
}

constexpr Table kTable = make_table();

int pick(const TypeMasks& m, ibv_qp_type type) {
  switch (type) {
    case IBV_QPT_RC:
      return m.rc;
    case IBV_QPT_UC:
      return m.uc;
    case IBV_QPT_UD:
      return m.ud;
    case IBV_QPT_XRC_SEND:
      return m.xrc_ini;
    case IBV_QPT_XRC_RECV:
      return m.xrc_tgt;
    default:
      return 0;
  }
}

}  // namespace

QpTransitionMasks qp_transition_masks(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type) {
  if (cur < 0 || cur >= kStates || next < 0 || next >= kStates) return {};
  if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD &&
      type != IBV_QPT_XRC_SEND && type != IBV_QPT_XRC_RECV)
    return {};
  const Transition& t = kTable[cur][next];
  return {t.valid, pick(t.required, type), pick(t.optional, type)};
}

bool modify_qp_is_ok(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type, int mask) {
  // IBA 11.2.5.2: "current QP state" may only be given from RTR, RTS, SQD or SQE.
  if ((mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS && cur != IBV_QPS_SQD &&
      cur != IBV_QPS_SQE)
    return false;
  const QpTransitionMasks m = qp_transition_masks(cur, next, type);
  if (!m.valid) return false;
  if ((mask & m.required) != m.required) return false;
  return (mask & ~(m.required | m.optional | IBV_QP_STATE)) == 0;
}

}  // namespace urdma::provider
