// The extended QP API: ibv_create_qp_ex with send_ops_flags, ibv_qp_to_qp_ex and the ibv_wr_*
// builders (ibv_wr_start / ibv_wr_rdma_write / ibv_wr_set_sge / ... / ibv_wr_complete).
//
// Not implemented yet: create_qp_ex (verbs_context.create_qp_ex) fails with EOPNOTSUPP.
// ibv_create_qp_ex() with comp_mask == IBV_QP_INIT_ATTR_PD never reaches it: verbs.h's inline
// sends that to ibv_create_qp. ibv_qp_to_qp_ex returns NULL for a QP without the extended
// interface, as rdma-core does. The layouts and helpers this will build on are in internal.h
// (Qp, QpExState, create_qp_common).
#include <cerrno>

#include "verbs/internal.h"

namespace urdma::verbs {

ibv_qp* create_qp_ex(ibv_context* /*context*/, ibv_qp_init_attr_ex* /*attr*/) {
  return fail<ibv_qp>(EOPNOTSUPP);
}

}  // namespace urdma::verbs

extern "C" ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  urdma::verbs::Qp* q = urdma::verbs::Qp::from(qp);
  return q->has_qp_ex ? &q->qp_ex : nullptr;
}
