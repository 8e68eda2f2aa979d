// Multicast attachments: which UD QPs of the device are attached to which multicast group.
//
// Design: ibv_attach_mcast(3) attaches a UD QP to a multicast GID (RoCEv2: the group's IP
// address, IPv4-mapped ::ffff:224.0.0.0/100 or IPv6 ff00::/8); a datagram sent to that group
// with DestQP 0xFFFFFF (IBA 9.6.1.2: the multicast QPN) is delivered to every QP attached to
// it. The engine asks `members` for a received multicast datagram's destination GID; the verbs
// attach and detach. Bounds are rxe's (limits.h): groups per device, QPs per group, and
// attachments in all. The table has its own lock: the verbs call from application threads,
// the engine reads it once per multicast datagram.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include <infiniband/verbs.h>

#include "provider/status.h"

namespace urdma::provider {

// The multicast QPN (IBA 9.6.1.2, C9-xx: DestQP 0xFFFFFF addresses a multicast group).
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// Is `gid` a RoCEv2 multicast GID: an IPv4-mapped 224.0.0.0/4 address or IPv6 ff00::/8?
bool gid_is_multicast(const ibv_gid& gid);

class McastTable {
 public:
  using Key = std::array<uint8_t, 16>;

  // EINVAL: not a multicast GID. ENOMEM: max_mcast_grp groups exist already, the group has
  // max_mcast_qp_attach QPs, or max_total_mcast_qp_attach attachments exist. Attaching a QP to
  // a group it is attached to already succeeds and changes nothing (rxe_attach_mcast).
  // *added says whether this call attached it.
  Status attach(uint32_t qpn, const ibv_gid& gid, bool* added = nullptr);
  // EINVAL: the QP is not attached to that group (rxe_detach_mcast).
  Status detach(uint32_t qpn, const ibv_gid& gid);
  // The groups `qpn` is attached to.
  std::vector<ibv_gid> groups_of(uint32_t qpn) const;
  bool attached(uint32_t qpn) const;
  // The QPs attached to `gid`, in attach order, copied into `out` (at most out.size(), which
  // max_mcast_qp_attach bounds); returns how many.
  size_t members(std::span<const uint8_t, 16> gid, std::span<uint32_t> out) const;
  // Attachments in all.
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<Key, std::vector<uint32_t>> groups_;
  size_t total_ = 0;
};

}  // namespace urdma::provider
