// Multicast group memberships of the slots: which QPs of which slot are attached to which group,
// and the kernel memberships that make the group's datagrams reach the slot's socket.
//
// Delivery design: a RoCEv2 multicast datagram goes to the group's IP address, port 4791. The
// kernel delivers a multicast UDP datagram to EVERY socket bound to the port that accepts it
// (__udp4_lib_mcast_deliver clones it; the reuseport steering program plays no part), so the
// kernel does the fan-out: every socket of the slot group takes IP_MULTICAST_ALL=0 (and
// IPV6_MULTICAST_ALL=0) when the group is opened (steering.cc), which makes a socket accept
// only the groups IT joined, and urdmad joins a group on a slot's own socket when a QP of that
// slot attaches to it (kMcastAttach). One copy of each datagram then reaches each process with a
// QP attached — on this host, sent from it (the sender's IP_MULTICAST_LOOP) or from others —
// and its engine hands it to every attached QP (engine.cc, handle_multicast). Nothing is copied
// through urdmad, and no socket hears a group its process did not ask for.
//
// The table here is the bookkeeping: per slot, group -> attached QPNs, and the interfaces the
// group was joined on (the first attachment joins, the last detachment leaves, reclaim leaves
// them all). Requests are another process's input: the QPN must be the slot's, the address a
// multicast one, and a slot holds at most kMaxMcastGroupsPerSlot groups and
// kMaxMcastAttachPerSlot attachments.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "net/address.h"

namespace urdma::daemon {

inline constexpr size_t kMaxMcastGroupsPerSlot = 256;
inline constexpr size_t kMaxMcastAttachPerSlot = 4096;

class McastMembers {
 public:
  struct Change {
    int err = 0;         // 0 or an errno (attach: EINVAL, ENOSPC; detach: ENOENT)
    bool first = false;  // attach: the slot's first QP in the group (join it)
    bool last = false;   // detach: the slot's last QP left the group (leave it)
  };
  // `qpn_base`/`qpn_count`: the slot's QPN range (the QPN must lie in it).
  Change attach(unsigned slot, uint32_t qpn_base, uint32_t qpn_count, uint32_t qpn,
                const net::Address& group);
  Change detach(unsigned slot, uint32_t qpn, const net::Address& group);
  // The interfaces a group was joined on (set after a successful join; leave uses them).
  void set_interfaces(unsigned slot, const net::Address& group, std::vector<uint32_t> ifindexes);
  std::vector<uint32_t> interfaces(unsigned slot, const net::Address& group) const;
  // Everything of the slot, forgotten: each group with the interfaces it was joined on.
  std::vector<std::pair<net::Address, std::vector<uint32_t>>> reclaim(unsigned slot);

  size_t groups(unsigned slot) const;
  size_t attachments(unsigned slot) const;

 private:
  struct Group {
    std::set<uint32_t> qpns;
    std::vector<uint32_t> ifindexes;
  };
  struct Slot {
    std::map<net::Address, Group> groups;
    size_t attachments = 0;
  };
  std::map<unsigned, Slot> slots_;
};

// Joins (or leaves) `group` on socket `fd` (of family `socket_family`: AF_INET6 dual-stack or
// AF_INET) on interface `ifindex`: IP_ADD_MEMBERSHIP for an IPv4 group, IPV6_JOIN_GROUP for an
// IPv6 one. 0 or an errno; joining a group the socket is a member of already is 0.
int set_group_membership(int fd, int socket_family, const net::Address& group, uint32_t ifindex,
                         bool join);
// Makes a slot socket accept only the multicast groups it joined itself (IP_MULTICAST_ALL=0, and
// IPV6_MULTICAST_ALL=0 on an IPv6 socket). 0 or an errno.
int accept_only_joined_groups(int fd, int socket_family);

}  // namespace urdma::daemon
