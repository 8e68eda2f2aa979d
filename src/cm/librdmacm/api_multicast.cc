// Multicast: rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast.
//
// RoCEv2 multicast as Linux's rdma_cm does it (cma_iboe_join_multicast): the group's GID is its
// IP address (IPv4-mapped for IPv4), there is no SA to ask, so the join completes at once with
// RDMA_CM_EVENT_MULTICAST_JOIN, whose param.ud names the group — ah_attr (dgid = the group,
// global, the id's source GID index, hop limit 1), qp_num 0xFFFFFF and the port space's Q_Key
// (RDMA_UDP_QKEY) — and carries the join's context in private_data. As rdma-core's librdmacm
// (ucma_process_join) the id's QP, if it has one, is attached to the group (ibv_attach_mcast:
// urdmad joins the group on the process's slot socket), except for a send-only join; a failed
// attach turns the event into RDMA_CM_EVENT_MULTICAST_ERROR with the errno as status.
// rdma_leave_multicast detaches the QP. Only the UD port spaces multicast (the kernel's
// rdma_join_multicast: EINVAL for another QP type).
#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cm/librdmacm/process.h"

namespace urdma::rdmacm {

namespace {

constexpr uint32_t kMulticastQpn = 0xFFFFFF;  // IBA 9.6.1.2
constexpr uint8_t kMcHopLimit = 1;            // Linux cma_iboe_join_multicast

bool gid_is_multicast(const Gid& g) {
  return gid_is_v4(g) ? (g[12] & 0xf0) == 0xe0 : g[0] == 0xff;
}

bool same_addr(const sockaddr_storage& a, const sockaddr* b) {
  return gid_of(reinterpret_cast<const sockaddr*>(&a)) == gid_of(b);
}

// Under mu: the join's event on the id's channel (Cma::queue_event's bookkeeping).
void queue_join_event(Id* x, const McJoin& m, int status) {
  if (!x->chan) return;
  auto* e = new Event();
  e->ev.id = &x->id;
  e->ev.event = status == 0 ? RDMA_CM_EVENT_MULTICAST_JOIN : RDMA_CM_EVENT_MULTICAST_ERROR;
  e->ev.status = status;
  e->owner = x;
  rdma_ud_param& u = e->ev.param.ud;
  u.private_data = m.context;  // librdmacm: the join's context
  u.private_data_len = 0;
  u.ah_attr.is_global = 1;
  u.ah_attr.port_num = 1;
  std::memcpy(u.ah_attr.grh.dgid.raw, m.group.data(), 16);
  u.ah_attr.grh.sgid_index = x->sgid_index;
  u.ah_attr.grh.hop_limit = kMcHopLimit;
  u.ah_attr.grh.traffic_class = x->tos;
  u.qp_num = kMulticastQpn;
  u.qkey = kUdpQkey;
  ++x->pending_events;
  x->chan->queue.push_back(&e->ev);
  uint64_t one = 1;
  (void)!write(x->chan->ch.fd, &one, sizeof one);
}

int join_async(rdma_cm_id* id, const sockaddr* addr, uint32_t join_flags, void* context) {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return fail(EINVAL);
  // rdma_join_multicast_ex(3): a full member, or a send-only full member (RoCE sends without
  // joining); the other IB join states have no meaning on RoCE.
  if (join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
      join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    return fail(EINVAL);
  // The kernel's rdma_join_multicast: an id whose address is bound or resolved, of a UD QP type.
  auto [c, lock, x] = lock_id(id, {IdState::kBound, IdState::kAddrResolved});
  if (!x || !is_ud_ps(x->id.ps)) return fail(EINVAL);
  if (!x->id.verbs) return fail(ENODEV);  // bound to no device (a wildcard or loopback address)
  const Gid group = gid_of(addr);
  if (!gid_is_multicast(group)) return fail(EINVAL);
  if (std::ranges::any_of(x->mc, [&](const McJoin& m) { return m.group == group; }))
    return fail(EADDRINUSE);
  if (x->mc.size() >= kMaxMcJoinsPerId) return fail(ENOMEM);
  McJoin m;
  m.group = group;
  std::memcpy(&m.addr, addr, sockaddr_size(addr));
  m.context = context;
  m.join_flags = join_flags;
  int status = 0;
  if (x->id.qp && join_flags == RDMA_MC_JOIN_FLAG_FULLMEMBER) {
    ibv_gid gid;
    std::memcpy(gid.raw, group.data(), 16);
    if (const int err = ibv_attach_mcast(x->id.qp, &gid, 0))
      status = -err;
    else
      m.attached = x->id.qp;
  }
  if (status == 0) x->mc.push_back(m);
  queue_join_event(x, m, status);
  return 0;
}

int join(rdma_cm_id* id, const sockaddr* addr, uint32_t join_flags, void* context) {
  if (join_async(id, addr, join_flags, context) != 0) return -1;
  return is_sync(id) ? sync_wait(id, RDMA_CM_EVENT_MULTICAST_JOIN) : 0;
}

}  // namespace

void detach_mc_locked(Id* x) {
  for (McJoin& m : x->mc) {
    if (!m.attached) continue;
    ibv_gid gid;
    std::memcpy(gid.raw, m.group.data(), 16);
    (void)ibv_detach_mcast(m.attached, &gid, 0);
    m.attached = nullptr;
  }
}

}  // namespace urdma::rdmacm

using namespace urdma::rdmacm;

URDMA_EXPORT int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  return join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
}

URDMA_EXPORT int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr,
                                        void* context) {
  // rdma-core: the address and the join flags must both be given.
  if (!mc_join_attr || !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
      !(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      (mc_join_attr->comp_mask &
       ~uint32_t{RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS}))
    return fail(EINVAL);
  return join(id, mc_join_attr->addr, mc_join_attr->join_flags, context);
}

URDMA_EXPORT int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (!addr) return fail(EINVAL);
  auto [c, lock, x] = lock_id(id);
  if (!x) return fail(EINVAL);
  const auto it =
      std::ranges::find_if(x->mc, [&](const McJoin& m) { return same_addr(m.addr, addr); });
  if (it == x->mc.end()) return fail(EADDRNOTAVAIL);  // rdma-core: no such join
  if (it->attached) {
    ibv_gid gid;
    std::memcpy(gid.raw, it->group.data(), 16);
    (void)ibv_detach_mcast(it->attached, &gid, 0);
  }
  x->mc.erase(it);
  return 0;
}
