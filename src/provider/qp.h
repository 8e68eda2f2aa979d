// Queue pair: the IBTA state machine, attributes, and the send/receive work queues.
//
// Design
// * State machine (IBA 10.3.1, 11.2.5): the legal transitions and, for each transition and QP
//   type, the required and optional ibv_qp_attr_mask bits are one table (qp_state_table.cc),
//   transcribed from the Linux kernel's qp_state_table (drivers/infiniband/core/verbs.c), which
//   is what ib_modify_qp_is_ok — and so every real device — enforces. A wrong mask is EINVAL.
// * Attributes are validated per mask bit before anything changes (rxe_qp_chk_attr and the
//   uverbs checks); a failed modify leaves the QP untouched.
// * Send queue: an SpscRing<SendWqe> plus a side area of wqe_size bytes per slot holding the
//   SGE list or the inline data (wqe_size = max(max_send_sge * 16, max_inline_data), as rxe
//   sizes its WQEs, which is also what ibv_create_qp reports back in cap). Posting threads are
//   serialised by `sq_mutex_`; the engine thread is the only consumer: the requester reads
//   ahead with sq_peek_st(i), the completer retires with sq_pop_st().
// * Receive queue: a RecvQueue (or the SRQ), posting under `rq_mutex_`, engine takes copies.
// * Thread ownership: methods ending in _st are engine-thread only. The engine may move a QP
//   to SQE/ERR (enter_error_st) and raise affiliated async events; everything else about a
//   QP's state is the application's, through modify().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include <infiniband/verbs.h>

#include "provider/ah.h"
#include "provider/cq.h"
#include "provider/queue_memory.h"
#include "provider/engine_turn.h"
#include "provider/pd.h"
#include "provider/srq.h"
#include "provider/status.h"
#include "provider/work_queue.h"
#include "provider/engine_turn.h"

namespace urdma::provider {

class Device;

// The attribute masks of one transition for one QP type.
struct QpTransitionMasks {
  bool valid = false;
  int required = 0;
  int optional = 0;
};
// IBA 11.2.5.2 / kernel ib_modify_qp_is_ok. Types other than RC, UC, UD, XRC_SEND (the
// kernel's XRC_INI) and XRC_RECV (XRC_TGT) are never valid.
QpTransitionMasks qp_transition_masks(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type);
bool modify_qp_is_ok(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type, int mask);

// Send flags a WR may carry (IBV_SEND_IP_CSUM is accepted and ignored).
inline constexpr unsigned kSendFlagsKnown =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE | IBV_SEND_IP_CSUM;
// A WQE the engine posted for itself (post_engine_st): no posted WR can carry it (post_send
// refuses flags beyond kSendFlagsKnown), and its completion goes to the engine, not to a CQ.
inline constexpr unsigned kSendFlagEngine = 1u << 31;
static_assert((kSendFlagsKnown & kSendFlagEngine) == 0);
// Send queue slots kept for the engine's own WQEs on an RC QP of a tag-matching SRQ: each
// rendezvous takes a READ and then a FIN (engine/qp_context.h kMaxRendezvous).
inline constexpr uint32_t kEngineSendWqes = 8;
// Inline bytes an engine WQE may carry: a FIN's TMH.
inline constexpr uint32_t kEngineInlineBytes = 16;

// What each send opcode is, for validation here and for the engine.
// Rows are written with designated initializers naming the properties that hold; the rest are
// false.
struct SendOpcodeInfo {
  bool rc = false, uc = false, ud = false;  // allowed on this QP type (IBA 9.2 / 9.8.3,
                                            // rxe_wr_opcode_info)
  bool xrc = false;  // allowed on an XRC initiator (XRC_SEND): RC's, without ATOMIC WRITE
  bool sge_list = false;     // has a local SGE list (data source, or READ/atomic result target)
  bool inline_ok = false;    // IBV_SEND_INLINE applies (SEND*, RDMA_WRITE*)
  bool remote_rdma = false;  // RDMA WRITE/READ: remote_addr + rkey
  bool atomic = false;       // 8-byte aligned remote_addr, one 8-byte local SGE
  bool atomic_write = false;  // ATOMIC WRITE (IBA 1.5): exactly 8 bytes (SGEs or inline) to
                              // remote_addr + rkey, stored by the responder in one access
  bool local = false;        // LOCAL_INV, BIND_MW: no packet
  ibv_wc_opcode wc_opcode = IBV_WC_SEND;
};
// nullptr for opcodes the device does not implement (TSO, DRIVER1, FLUSH, unknown).
const SendOpcodeInfo* send_opcode_info(ibv_wr_opcode opcode);

struct QpInitAttr {
  ibv_qp_type qp_type = IBV_QPT_RC;
  Pd* pd = nullptr;        // null for an XRC target (XRC_RECV)
  Xrcd* xrcd = nullptr;    // XRC_RECV only
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  ibv_qp_cap cap = {};
  bool sq_sig_all = false;
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (UD): a multicast datagram this QP sent is not delivered
  // back to it, though it is attached to the group.
  bool block_self_mcast_lb = false;
  // Where the send queue and the QP's own receive queue come from (queue_memory.h); null:
  // malloc. A parent domain's allocators (ibv_alloc_parent_domain(3)).
  std::shared_ptr<QueueAllocator> allocator;
};

class Qp {
 public:
  // Use Device::create_qp, which validates and rounds `init.cap` first.
  Qp(uint32_t handle, const QpInitAttr& init, Device& device);
  ~Qp();

  uint32_t handle() const { return handle_; }
  uint32_t qp_num() const { return qp_num_; }
  ibv_qp_type type() const { return init_.qp_type; }
  bool block_self_mcast_lb() const { return init_.block_self_mcast_lb; }
  Pd* pd() const { return init_.pd; }
  Xrcd* xrcd() const { return init_.xrcd; }
  Cq* send_cq() const { return init_.send_cq; }
  Cq* recv_cq() const { return init_.recv_cq; }
  Srq* srq() const { return init_.srq; }
  bool sq_sig_all() const { return init_.sq_sig_all; }
  // The capacities as reported to the application (rounded up).
  const ibv_qp_cap& cap() const { return init_.cap; }
  ibv_qp_state state() const { return state_.load(std::memory_order_acquire); }
  // Where the queues are (tests: which memory the QP uses). rq_ring is null with an SRQ.
  const void* sq_ring_data() const { return sq_ring_.data(); }
  const void* sq_side_data() const { return sq_side_.get(); }
  const void* rq_ring_data() const { return rq_ ? rq_->ring_data() : nullptr; }

  // ibv_modify_qp. EINVAL for an illegal transition, wrong mask or bad attribute value,
  // EOPNOTSUPP for mask bits beyond the standard ones.
  Status modify(const ibv_qp_attr& attr, int mask);
  // ibv_query_qp: every attribute as last set (the mask is a hint, as on rxe).
  Status query(ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) const;
  // A consistent copy of the attributes, for the engine after qp_modified().
  ibv_qp_attr attr_snapshot() const;
  // The primary path resolved from IBV_QP_AV (RC/UC).
  AddressVector path_snapshot() const;

  // ibv_post_send / ibv_post_recv: validation as a device does it; *bad_wr names the failing
  // WR and nothing from it on is posted.
  Status post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr);
  Status post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  // ibv_bind_mw (type 1): posts a BIND_MW WQE; *new_rkey is the rkey the window will have
  // (the verbs layer stores it in ibv_mw.rkey, as rdma-core providers do).
  // `bind.bind_info.mr` is resolved through its handle field, like every ibv_* pointer in a WR.
  Status bind_mw(Mw* mw, const ibv_mw_bind& bind, uint32_t* new_rkey);

  // ---- engine thread ----
  // Send queue: `offset` WQEs after the oldest unretired one, or nullptr.
  const SendWqe* sq_peek_st(uint32_t offset) const {
    URDMA_ASSERT_ENGINE_TURN();
    return sq_ring_.peek_at(offset);
  }
  std::span<const ibv_sge> sq_sges_st(const SendWqe& wqe) const;
  std::span<const uint8_t> sq_inline_st(const SendWqe& wqe) const;
  void sq_pop_st() {
    URDMA_ASSERT_ENGINE_TURN();
    const SendWqe* wqe = sq_ring_.peek();
    if (wqe != nullptr && (wqe->send_flags & kSendFlagEngine))
      engine_wqes_.fetch_sub(1, std::memory_order_relaxed);
    sq_ring_.pop();
  }
  uint32_t sq_size() const { return sq_ring_.size(); }
  // Entries the send queue holds: the application's cap().max_send_wr and the engine's slots.
  uint32_t sq_capacity() const { return sq_ring_.capacity(); }
  // Appends a WQE of the engine's own (kSendFlagEngine is added) behind those posted so far,
  // with its SGE list or inline data in the side area (at most engine_wqe_bytes()). False when
  // the engine's slots are taken. Posting threads are held off by the send queue's lock.
  bool post_engine_st(const SendWqe& wqe, std::span<const ibv_sge> sges,
                      std::span<const uint8_t> inline_data);
  uint32_t engine_wqe_slots() const { return engine_slots_; }
  uint32_t engine_wqes() const { return engine_wqes_.load(std::memory_order_relaxed); }
  // Receive queue (the SRQ's when attached; none on XRC QPs: false).
  bool take_recv_st(RecvWork& out);
  // Called after the QP entered ERR, before its receive queue is flushed: orders the state
  // change against post_recv, whose doorbell wakes the engine only for a QP it sees in ERR
  // (engine::DoorbellRelay::ring_rq). A post that held the queue's lock before this call is
  // visible to the flush; one that takes it after reads ERR.
  void sync_with_recv_posters_st() {
    URDMA_ASSERT_ENGINE_TURN();
    std::lock_guard lock(rq_mutex_);
  }
  uint32_t rq_size() const;
  // Flushing (IBA 10.3.1.7 Error state: every outstanding and newly posted WR completes with
  // "flushed in error"; rxe completes unsignaled WRs too when flushing): pops every WQE still
  // in the send queue and, unless an SRQ is attached, the receive queue, pushing one
  // IBV_WC_WR_FLUSH_ERR completion each to the send/receive CQ. The engine completes the WQEs
  // it has in flight with their own status first, then calls this; and again after a post to
  // a QP in ERR. (With an SRQ the engine raises IBV_EVENT_QP_LAST_WQE_REACHED instead.)
  // Returns the number of completions generated.
  uint32_t flush_st();
  // The engine moves the QP to IBV_QPS_SQE (UC/UD send error, IBA 10.3.1.5) or IBV_QPS_ERR.
  // Returns false if the QP is in RESET or already in ERR (nothing changes then).
  bool enter_error_st(ibv_qp_state to);
  // SQD: the engine reports the send queue drained; raises IBV_EVENT_SQ_DRAINED when the
  // application asked for it (IBV_QP_EN_SQD_ASYNC_NOTIFY).
  void sq_drained_st();
  // Raises an affiliated async event for this QP (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR,
  // COMM_EST, LAST_WQE_REACHED, ...).
  void raise_event(ibv_event_type type);

  void* user_context = nullptr;  // the verbs layer's ibv_qp

 private:
  Status check_attr(const ibv_qp_attr& attr, int mask, ibv_qp_state cur, ibv_qp_state next,
                    AddressVector* av) const;
  struct Resolved {
    const SendOpcodeInfo* info = nullptr;
    uint64_t length = 0;
    bool inline_data = false;
    AddressVector av;
    MwBindOp bind;
  };
  Status validate_send(const ibv_send_wr& wr, Resolved& out) const;
  void fill_send_wqe(const ibv_send_wr& wr, const Resolved& r, SendWqe& wqe, uint32_t slot);
  uint8_t* side_area(uint32_t slot) const { return sq_side_.get() + size_t{slot} * wqe_size_; }
  void empty_queues();

  const uint32_t handle_;
  const uint32_t qp_num_;
  const QpInitAttr init_;
  Device& device_;
  std::atomic<ibv_qp_state> state_{IBV_QPS_RESET};

  mutable std::mutex attr_mutex_;  // attr_, av_, sq_draining_
  ibv_qp_attr attr_ = {};
  AddressVector av_ = {};
  bool sq_draining_ = false;

  const uint32_t engine_slots_;  // kEngineSendWqes on an RC QP of a TM-SRQ, else 0
  std::atomic<uint32_t> engine_wqes_{0};  // engine WQEs in the ring (engine writes, posters read)
  const uint32_t wqe_size_;  // side-area bytes per send slot
  std::mutex sq_mutex_;
  SpscRing<SendWqe> sq_ring_;
  QueueArray<uint8_t> sq_side_;

  std::mutex rq_mutex_;
  std::unique_ptr<RecvQueue> rq_;  // null when an SRQ is attached
};

// Validates ibv_qp_init_attr-style creation attributes and rounds `cap` up to what the queues
// will hold (EINVAL over the device limits or without what the type needs, EOPNOTSUPP for QP
// types other than RC/UC/UD/XRC_SEND/XRC_RECV). An XRC_SEND QP has a send queue only (its
// receive CQ, SRQ and receive caps are ignored, as the kernel ignores them for XRC_INI); an
// XRC_RECV QP has no queue at all, only its XRC domain.
Status check_and_round_qp_init(QpInitAttr& init);

}  // namespace urdma::provider
