// Multicast group memberships of the slots; see mcast_members.h.
#include "daemon/mcast_members.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace urdma::daemon {

McastMembers::Change McastMembers::attach(unsigned slot, uint32_t qpn_base, uint32_t qpn_count,
                                          uint32_t qpn, const net::Address& group) {
  Change c;
  if (!group.is_multicast() || qpn < qpn_base || qpn - qpn_base >= qpn_count) {
    c.err = EINVAL;
    return c;
  }
  Slot& s = slots_[slot];
  auto it = s.groups.find(group);
  if (it != s.groups.end() && it->second.qpns.contains(qpn)) return c;  // attached already
  if ((it == s.groups.end() && s.groups.size() >= kMaxMcastGroupsPerSlot) ||
      s.attachments >= kMaxMcastAttachPerSlot) {
    if (s.groups.empty()) slots_.erase(slot);
    c.err = ENOSPC;
    return c;
  }
  if (it == s.groups.end()) {
    it = s.groups.emplace(group, Group{}).first;
    c.first = true;
  }
  it->second.qpns.insert(qpn);
  ++s.attachments;
  return c;
}

McastMembers::Change McastMembers::detach(unsigned slot, uint32_t qpn, const net::Address& group) {
  Change c;
  const auto s = slots_.find(slot);
  if (s == slots_.end()) {
    c.err = ENOENT;
    return c;
  }
  const auto g = s->second.groups.find(group);
  if (g == s->second.groups.end() || g->second.qpns.erase(qpn) == 0) {
    c.err = ENOENT;
    return c;
  }
  --s->second.attachments;
  if (g->second.qpns.empty()) {
    c.last = true;
    s->second.groups.erase(g);
    if (s->second.groups.empty()) slots_.erase(s);
  }
  return c;
}

void McastMembers::set_interfaces(unsigned slot, const net::Address& group,
                                  std::vector<uint32_t> ifindexes) {
  const auto s = slots_.find(slot);
  if (s == slots_.end()) return;
  const auto g = s->second.groups.find(group);
  if (g != s->second.groups.end()) g->second.ifindexes = std::move(ifindexes);
}

std::vector<uint32_t> McastMembers::interfaces(unsigned slot, const net::Address& group) const {
  const auto s = slots_.find(slot);
  if (s == slots_.end()) return {};
  const auto g = s->second.groups.find(group);
  return g == s->second.groups.end() ? std::vector<uint32_t>{} : g->second.ifindexes;
}

std::vector<std::pair<net::Address, std::vector<uint32_t>>> McastMembers::reclaim(unsigned slot) {
  std::vector<std::pair<net::Address, std::vector<uint32_t>>> out;
  const auto s = slots_.find(slot);
  if (s == slots_.end()) return out;
  for (auto& [group, g] : s->second.groups) out.emplace_back(group, std::move(g.ifindexes));
  slots_.erase(s);
  return out;
}

size_t McastMembers::groups(unsigned slot) const {
  const auto s = slots_.find(slot);
  return s == slots_.end() ? 0 : s->second.groups.size();
}

size_t McastMembers::attachments(unsigned slot) const {
  const auto s = slots_.find(slot);
  return s == slots_.end() ? 0 : s->second.attachments;
}

int set_group_membership(int fd, int socket_family, const net::Address& group, uint32_t ifindex,
                         bool join) {
  int r;
  if (group.is_v4()) {
    // SOL_IP options work on a dual-stack AF_INET6 socket too: IPv4 datagrams reach it, and
    // its IPv4 membership list filters them (ip_mc_sf_allow).
    ip_mreqn m{};
    std::memcpy(&m.imr_multiaddr, group.v4_bytes().data(), 4);
    m.imr_ifindex = static_cast<int>(ifindex);
    r = setsockopt(fd, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof m);
  } else {
    if (socket_family != AF_INET6) return EAFNOSUPPORT;
    ipv6_mreq m{};
    std::memcpy(&m.ipv6mr_multiaddr, group.bytes().data(), 16);
    m.ipv6mr_interface = ifindex;
    r = setsockopt(fd, IPPROTO_IPV6, join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &m, sizeof m);
  }
  if (r == 0) return 0;
  // A restarted daemon joins again what the socket still holds (the keeper kept it).
  if (join && errno == EADDRINUSE) return 0;
  return errno;
}

int accept_only_joined_groups(int fd, int socket_family) {
  const int zero = 0;
  if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) != 0) return errno;
  // IPV6_MULTICAST_ALL is Linux 4.20's; before it an IPv6 group's datagrams reach every slot
  // socket of the port, whose engines drop what no QP of theirs is attached to.
  if (socket_family == AF_INET6 &&
      setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &zero, sizeof zero) != 0 &&
      errno != ENOPROTOOPT)
    return errno;
  return 0;
}

}  // namespace urdma::daemon
