// The provider → engine interface.
//
// Design: the provider never runs the transport; it tells the engine about new work and about
// QP lifecycle changes through this interface. The default implementation does nothing, so the
// provider can be used and tested alone. Ring calls are made after the WQEs are published and
// outside every provider lock; they are cheap (a store and, only if the engine sleeps, a
// wakeup — liburing's need-wakeup handshake is the engine's business), except that the runtime
// may run one engine turn inside ring_sq: the first send after a completion event, when the
// engine thread sleeps (runtime::Runtime::send_posted).
#pragma once

#include <infiniband/verbs.h>

namespace urdma::provider {

class Qp;
class Srq;

class Doorbell {
 public:
  virtual ~Doorbell() = default;
  // New send WQEs were posted to qp (or a type 1 bind).
  virtual void ring_sq(Qp& /*qp*/) {}
  // New receive WQEs were posted to qp's own receive queue.
  virtual void ring_rq(Qp& /*qp*/) {}
  // New receive WQEs were posted to srq.
  virtual void ring_srq(Srq& /*srq*/) {}
  // Tag-matching list operations were queued on srq (Srq::post_ops): the engine runs them
  // (Srq::run_ops_st) before this returns, ordered against the messages it matches.
  virtual void srq_ops_posted(Srq& /*srq*/) {}
  // ibv_modify_qp changed the QP's state or attributes (from == to for a same-state modify).
  // Called after the new attributes are visible and outside the QP's locks. When `to` is
  // IBV_QPS_RESET or the QP is about to be destroyed (qp_destroyed), the call must not return
  // before the engine has stopped touching the QP's queues; the provider empties them after.
  // Entering IBV_QPS_ERR is the engine's cue to flush every posted WR with IBV_WC_WR_FLUSH_ERR;
  // the ACK the QP owes leaves before the call returns (a DREQ follows it in rdma_disconnect).
  virtual void qp_modified(Qp& /*qp*/, ibv_qp_state /*from*/, ibv_qp_state /*to*/) {}
  virtual void qp_destroyed(Qp& /*qp*/) {}
  // An XRC SRQ is about to be destroyed (it is marked dying, so no new lookup finds it): the
  // call must not return while the engine may still touch it, and the engine lets go of every
  // receive WQE it took from it (a message being received into one is lost with the SRQ).
  virtual void srq_destroyed(Srq& /*srq*/) {}
  // dereg_mr, rereg_mr or dealloc_mw changed the MR table: the application may free or reuse
  // the memory the old entry named as soon as the verb returns. An engine that looked the entry
  // up earlier may still hold a pointer into that memory (the copy or the sendmsg comes after
  // the lookup), so this must not return while such an access can still happen.
  virtual void memory_released() {}
};

}  // namespace urdma::provider
