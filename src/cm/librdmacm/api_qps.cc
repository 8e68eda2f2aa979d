// Exported calls: an id's SRQ and QP.

#include "cm/librdmacm/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

using namespace urdma::rdmacm;

// rdma_create_srq(3): the id's SRQ, on the given PD or the id's (the device's default PD when the
// id has none yet, which rdma_create_qp then uses too); rdma_create_qp gives it to the id's QP.
// The type must be named, as rdma-core asks; XRC SRQs fail in ibv_create_srq_ex (no XRC), so
// the CQ rdma-core creates for an XRC SRQ is never needed.
URDMA_EXPORT int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (!attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return fail(EINVAL);
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->id.verbs || x->id.srq) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->pd = x->id.pd ? x->id.pd : c.device_pd();
    if (!attr->pd) return -1;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  if (attr->pd->context != x->id.verbs) return fail(EINVAL);
  ibv_srq* srq = ibv_create_srq_ex(x->id.verbs, attr);
  if (!srq) return -1;
  if (!x->id.pd) x->id.pd = attr->pd;
  x->id.srq = srq;
  return 0;
}

URDMA_EXPORT int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!attr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ex.srq_type = IBV_SRQT_BASIC;
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.pd = pd;
  const int r = rdma_create_srq_ex(id, &ex);
  attr->attr = ex.attr;
  return r;
}

// The QP on the SRQ goes first (rdma_destroy_srq(3)); ibv_destroy_srq's EBUSY otherwise keeps it.
URDMA_EXPORT void rdma_destroy_srq(rdma_cm_id* id) {
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->id.srq) return;
  if (ibv_destroy_srq(x->id.srq) == 0) x->id.srq = nullptr;
}

URDMA_EXPORT int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!qp_init_attr) return fail(EINVAL);
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->id.verbs || x->id.qp) return fail(EINVAL);
  const bool ud = is_ud_ps(x->id.ps);
  if (qp_init_attr->qp_type != (ud ? IBV_QPT_UD : IBV_QPT_RC)) return fail(ENOSYS);
  if (!pd) pd = x->id.pd;  // rdma_create_srq's
  if (!pd && !(pd = c.device_pd())) return -1;
  if (pd->context != x->id.verbs) return fail(EINVAL);
  if (!qp_init_attr->srq) qp_init_attr->srq = x->id.srq;
  // No CQs given: one per direction with a completion channel each (rdma_verbs.h's
  // rdma_get_send_comp / rdma_get_recv_comp wait on them).
  bool own_cqs = false;
  if (!qp_init_attr->send_cq || !qp_init_attr->recv_cq) {
    if (qp_init_attr->send_cq || qp_init_attr->recv_cq) return fail(EINVAL);
    ibv_comp_channel* sch = ibv_create_comp_channel(x->id.verbs);
    ibv_comp_channel* rch = ibv_create_comp_channel(x->id.verbs);
    ibv_cq* scq = sch ? ibv_create_cq(x->id.verbs, std::max<int>(qp_init_attr->cap.max_send_wr, 1),
                                      &x->id, sch, 0)
                      : nullptr;
    ibv_cq* rcq = rch ? ibv_create_cq(x->id.verbs, std::max<int>(qp_init_attr->cap.max_recv_wr, 1),
                                      &x->id, rch, 0)
                      : nullptr;
    if (!scq || !rcq) {
      const int e = errno ? errno : ENOMEM;
      if (scq) ibv_destroy_cq(scq);
      if (rcq) ibv_destroy_cq(rcq);
      if (sch) ibv_destroy_comp_channel(sch);
      if (rch) ibv_destroy_comp_channel(rch);
      return fail(e);
    }
    x->id.send_cq_channel = sch;
    x->id.recv_cq_channel = rch;
    qp_init_attr->send_cq = scq;
    qp_init_attr->recv_cq = rcq;
    own_cqs = true;
  }
  auto drop_cqs = [&, x = x] {
    if (!own_cqs) return;
    ibv_destroy_cq(qp_init_attr->send_cq);
    ibv_destroy_cq(qp_init_attr->recv_cq);
    ibv_destroy_comp_channel(x->id.send_cq_channel);
    ibv_destroy_comp_channel(x->id.recv_cq_channel);
    x->id.send_cq_channel = x->id.recv_cq_channel = nullptr;
    qp_init_attr->send_cq = qp_init_attr->recv_cq = nullptr;
  };
  ibv_qp* qp = ibv_create_qp(pd, qp_init_attr);
  if (!qp) {
    const int e = errno;
    drop_cqs();
    return fail(e);
  }
  x->own_cqs = own_cqs;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  attr.qp_access_flags =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  attr.qkey = kUdpQkey;
  // A UD QP is ready to send and receive at once (rdma_create_qp(3)): INIT, RTR, RTS.
  ibv_qp_attr rtr{}, rts{};
  rtr.qp_state = IBV_QPS_RTR;
  rts.qp_state = IBV_QPS_RTS;
  rts.sq_psn = c.random_psn();
  if (ud ? (ibv_modify_qp(qp, &attr,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0 ||
            ibv_modify_qp(qp, &rtr, IBV_QP_STATE) != 0 ||
            ibv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0)
         : ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
               0) {
    const int e = errno;
    ibv_destroy_qp(qp);
    drop_cqs();
    return fail(e);
  }
  x->id.qp = qp;
  x->id.pd = pd;
  x->id.send_cq = qp_init_attr->send_cq;
  x->id.recv_cq = qp_init_attr->recv_cq;
  x->id.qp_type = ud ? IBV_QPT_UD : IBV_QPT_RC;
  return 0;
}

URDMA_EXPORT int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!attr) return fail(EINVAL);
  if ((attr->comp_mask & ~IBV_QP_INIT_ATTR_PD) != 0) return fail(ENOSYS);
  ibv_qp_init_attr a{};
  a.qp_context = attr->qp_context;
  a.send_cq = attr->send_cq;
  a.recv_cq = attr->recv_cq;
  a.srq = attr->srq;
  a.cap = attr->cap;
  a.qp_type = attr->qp_type;
  a.sq_sig_all = attr->sq_sig_all;
  const int r =
      rdma_create_qp(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr, &a);
  attr->cap = a.cap;
  return r;
}

URDMA_EXPORT void rdma_destroy_qp(rdma_cm_id* id) {
  ibv_qp* qp;
  bool own_cqs;
  {
    auto [c, lock, x] = lock_id(id);
    if (!x || !x->id.qp) return;
    // A QP attached to a group cannot be destroyed (EBUSY); the QP the id made leaves its
    // groups with it.
    detach_mc_locked(x);
    qp = x->id.qp;
    x->id.qp = nullptr;
    own_cqs = x->own_cqs;
    x->own_cqs = false;
  }
  ibv_destroy_qp(qp);
  if (own_cqs) {
    ibv_destroy_cq(id->send_cq);
    ibv_destroy_cq(id->recv_cq);
    ibv_destroy_comp_channel(id->send_cq_channel);
    ibv_destroy_comp_channel(id->recv_cq_channel);
    id->send_cq = id->recv_cq = nullptr;
    id->send_cq_channel = id->recv_cq_channel = nullptr;
  }
}
