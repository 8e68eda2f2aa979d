// Exported calls on an id's connection: connect and accept (SIDR for the UD port spaces), reject,
// establish, disconnect, and the QP attributes the connection gives.

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

static int rdma_connect_async(rdma_cm_id* id, rdma_conn_param* p);

static int rdma_accept_async(rdma_cm_id* id, rdma_conn_param* p);

URDMA_EXPORT int rdma_connect(rdma_cm_id* id, rdma_conn_param* p) {
  if (rdma_connect_async(id, p) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

URDMA_EXPORT int rdma_accept(rdma_cm_id* id, rdma_conn_param* p) {
  ack_request_event(id);
  if (rdma_accept_async(id, p) != 0) return -1;
  if (is_ud_ps(id->ps)) return 0;  // SIDR: the answer is the whole exchange
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

namespace {

// The id waits for the answer to the REQ or SIDR_REQ of the Manager's new connection `conn`.
int connecting(Cma& c, Id* x, ConnId conn) {
  x->conn = conn;
  x->has_conn = true;
  c.by_conn[x->conn] = x;
  x->state = IdState::kConnecting;
  c.pump_locked();
  c.wake();  // the CM thread arms the request's retransmission timer
  return 0;
}

}  // namespace

static int rdma_connect_async(rdma_cm_id* id, rdma_conn_param* p) {
  auto [c, lock, x] = lock_id(id, {IdState::kRouteResolved});
  if (!x) return fail(EINVAL);
  if (is_ud_ps(x->id.ps)) {
    // SIDR: ask the listener for its QPN and Q_Key (ESTABLISHED carries them).
    if (p && p->private_data_len > urdma::cm::kRdmaSidrReqPrivateDataMax) return fail(EINVAL);
    urdma::cm::SidrQueryParams sp;
    sp.path.local_gid = x->sgid;
    sp.path.remote_gid = x->dgid;
    sp.service_id =
        urdma::wire::rdma_service_id(port_space(x->id.ps), port_of(&x->id.route.addr.dst_addr));
    sp.ip = cma_address(*x);
    if (p && p->private_data)
      sp.private_data = {static_cast<const uint8_t*>(p->private_data), p->private_data_len};
    auto r = c.manager->sidr_query(sp);
    if (!r.ok()) return fail(r.error());
    return connecting(c, x, *r);
  }
  if (p && p->private_data_len > urdma::cm::kRdmaReqPrivateDataMax) return fail(EINVAL);
  if (!x->id.qp && !p) return fail(EINVAL);
  urdma::cm::ConnectParams cp;
  cp.path.local_gid = x->sgid;
  cp.path.remote_gid = x->dgid;
  cp.path.flow_label = active_flow_label(*x);
  cp.path.traffic_class = x->path.traffic_class;
  cp.service_id =
      urdma::wire::rdma_service_id(port_space(x->id.ps), port_of(&x->id.route.addr.dst_addr));
  cp.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
  cp.starting_psn = c.random_psn();
  if (p) {
    cp.responder_resources = p->responder_resources;
    cp.initiator_depth = p->initiator_depth;
    cp.retry_count = std::min<uint8_t>(p->retry_count, 7);
    cp.rnr_retry_count = std::min<uint8_t>(p->rnr_retry_count, 7);
    cp.flow_control = p->flow_control;
    cp.srq = x->id.qp ? x->id.qp->srq != nullptr : p->srq;
    cp.private_data = {static_cast<const uint8_t*>(p->private_data),
                       p->private_data ? p->private_data_len : size_t{0}};
  } else {
    cp.responder_resources = 0;
    cp.initiator_depth = 0;
  }
  cp.ip = cma_address(*x);
  // The RTU always waits: for rdma_establish without a QP, and with one until the CM thread
  // has moved it (kConnectResponse in pump_locked).
  cp.manual_rtu = true;
  auto r = c.manager->connect(cp);
  if (!r.ok()) return fail(r.error());
  return connecting(c, x, *r);
}

static int rdma_accept_async(rdma_cm_id* id, rdma_conn_param* p) {
  auto [c, lock, x] = lock_id(id, {IdState::kRequest});
  if (!x || !x->has_conn) return fail(EINVAL);
  if (is_ud_ps(x->id.ps)) {
    if (p && p->private_data_len > urdma::cm::kSidrRepPrivateDataMax) return fail(EINVAL);
    if (!x->id.qp && !p) return fail(EINVAL);
    urdma::cm::SidrAnswerParams sa;
    sa.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
    sa.qkey = kUdpQkey;
    if (p && p->private_data)
      sa.private_data = {static_cast<const uint8_t*>(p->private_data), p->private_data_len};
    if (auto st = c.manager->sidr_answer(x->conn, sa); !st.ok()) return fail(st.error());
    x->state = IdState::kConnected;
    c.pump_locked();
    return 0;
  }
  if (p && p->private_data_len > urdma::cm::kRepPrivateDataMax) return fail(EINVAL);
  if (!x->id.qp && !p) return fail(EINVAL);
  urdma::cm::AcceptParams ap;
  ap.qpn = x->id.qp ? x->id.qp->qp_num : p->qp_num;
  if (p) {
    ap.responder_resources = p->responder_resources;
    ap.initiator_depth = p->initiator_depth;
    ap.rnr_retry_count = std::min<uint8_t>(p->rnr_retry_count, 7);
    ap.flow_control = p->flow_control;
    ap.srq = x->id.qp ? x->id.qp->srq != nullptr : p->srq;
    ap.private_data = {static_cast<const uint8_t*>(p->private_data),
                       p->private_data ? p->private_data_len : size_t{0}};
  }
  auto r = c.manager->accept(x->conn, ap);
  if (!r.ok()) return fail(r.error());
  if (x->id.qp) {
    if (c.apply_qp_locked(x, r->rtr) != 0 || c.apply_qp_locked(x, r->rts) != 0) {
      const int e = errno ? errno : EINVAL;
      urdma::cm::RejectParams rp;
      (void)c.manager->reject(x->conn, rp);
      c.pump_locked();
      return fail(e);
    }
  }
  x->state = IdState::kConnected;
  c.pump_locked();
  c.wake();
  return 0;
}

URDMA_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  ack_request_event(id);
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->has_conn) return fail(EINVAL);
  if (private_data_len > urdma::cm::kRejPrivateDataMax) return fail(EINVAL);
  urdma::cm::RejectParams rp;
  rp.private_data = {static_cast<const uint8_t*>(private_data),
                     private_data ? private_data_len : size_t{0}};
  if (auto s = c.manager->reject(x->conn, rp); !s.ok()) return fail(s.error());
  x->state = IdState::kDisconnected;
  c.pump_locked();
  return 0;
}

URDMA_EXPORT int rdma_reject_ece(rdma_cm_id* id, const void* private_data,
                                 uint8_t private_data_len) {
  return rdma_reject(id, private_data, private_data_len);
}

URDMA_EXPORT int rdma_establish(rdma_cm_id* id) {
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->has_conn || x->id.qp) return fail(EINVAL);
  if (auto s = c.manager->establish(x->conn); !s.ok()) return fail(s.error());
  x->state = IdState::kConnected;
  c.pump_locked();
  c.wake();
  return 0;
}

URDMA_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  auto [c, lock, x] = lock_id(id);
  if (!x || !x->has_conn) return fail(EINVAL);
  if (x->id.qp) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(x->id.qp, &attr, IBV_QP_STATE);
  }
  auto s = c.manager->disconnect(x->conn);
  c.pump_locked();
  c.wake();
  if (!s.ok()) return fail(s.error());
  return 0;
}

URDMA_EXPORT int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!qp_attr || !qp_attr_mask) return fail(EINVAL);
  auto [c, lock, x] = lock_id(id);
  if (!x) return fail(EINVAL);
  if (qp_attr->qp_state == IBV_QPS_INIT && !x->has_conn) {
    *qp_attr = {};
    qp_attr->qp_state = IBV_QPS_INIT;
    qp_attr->port_num = 1;
    qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    *qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return 0;
  }
  if (!x->has_conn) return fail(EINVAL);
  auto q = c.manager->qp_attrs(x->conn, qp_attr->qp_state);
  if (!q.ok()) return fail(q.error());
  *qp_attr = q->attr;
  if (q->mask & IBV_QP_AV) {
    uint8_t index = x->sgid_index;
    c.find_gid_index(q->sgid, &index);
    qp_attr->ah_attr.grh.sgid_index = index;
  }
  apply_ack_timeout(*x, qp_attr, q->mask);
  *qp_attr_mask = q->mask;
  return 0;
}

URDMA_EXPORT int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  auto [c, lock, x] = lock_id(id);
  if (!x) return fail(EINVAL);
  if (event != IBV_EVENT_COMM_EST || !x->has_conn) return 0;
  (void)c.manager->notify_established(x->conn);
  c.pump_locked();
  return 0;
}
