#include "daemon/gid_table.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#include <cstring>

namespace urdma::daemon {

bool GidTable::add(const GidEntry& entry) {
  std::optional<size_t> hole;
  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& s = slots_[i];
    if (!s.entry) {
      if (!hole) hole = i;
      continue;
    }
    if (s.entry->ifindex == entry.ifindex && s.entry->gid == entry.gid) {
      s.stale = false;
      GidEntry updated = entry;
      updated.index = static_cast<uint32_t>(i);
      if (*s.entry == updated) return false;
      s.entry = updated;
      return true;
    }
  }
  if (!hole) {
    if (slots_.size() >= kMaxGids) return false;
    hole = slots_.size();
    slots_.emplace_back();
  }
  GidEntry added = entry;
  added.index = static_cast<uint32_t>(*hole);
  slots_[*hole] = Slot{added, false};
  return true;
}

bool GidTable::remove(uint32_t ifindex, const net::Address& gid) {
  for (auto& s : slots_) {
    if (s.entry && s.entry->ifindex == ifindex && s.entry->gid == gid) {
      s.entry.reset();
      while (!slots_.empty() && !slots_.back().entry) slots_.pop_back();
      return true;
    }
  }
  return false;
}

std::vector<GidEntry> GidTable::entries() const {
  std::vector<GidEntry> out;
  for (const auto& s : slots_)
    if (s.entry) out.push_back(*s.entry);
  return out;
}

size_t GidTable::size() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s.entry.has_value();
  return n;
}

void GidTable::mark_all_stale() {
  for (auto& s : slots_) s.stale = true;
}

void GidTable::sweep_stale() {
  for (auto& s : slots_) {
    if (s.entry && s.stale) s.entry.reset();
    s.stale = false;
  }
  while (!slots_.empty() && !slots_.back().entry) slots_.pop_back();
}

namespace {

struct ParsedAddress {
  GidEntry entry;
  uint32_t flags = 0;  // IFA_F_*
};

// One RTM_NEWADDR/RTM_DELADDR payload (after the nlmsghdr); nullopt if it names no IPv4/IPv6
// address.
std::optional<ParsedAddress> parse_ifaddr(std::span<const uint8_t> payload) {
  if (payload.size() < NLMSG_ALIGN(sizeof(ifaddrmsg))) return std::nullopt;
  ifaddrmsg ifa;
  std::memcpy(&ifa, payload.data(), sizeof ifa);
  if (ifa.ifa_family != AF_INET && ifa.ifa_family != AF_INET6) return std::nullopt;
  const size_t addr_bytes = ifa.ifa_family == AF_INET ? 4 : 16;
  std::optional<net::Address> local, address;
  uint32_t flags = ifa.ifa_flags;
  size_t off = NLMSG_ALIGN(sizeof(ifaddrmsg));
  while (off + sizeof(rtattr) <= payload.size()) {
    rtattr rta;
    std::memcpy(&rta, payload.data() + off, sizeof rta);
    if (rta.rta_len < sizeof(rtattr) || off + rta.rta_len > payload.size()) break;
    const uint8_t* data = payload.data() + off + RTA_LENGTH(0);
    const size_t len = rta.rta_len - RTA_LENGTH(0);
    if ((rta.rta_type == IFA_LOCAL || rta.rta_type == IFA_ADDRESS) && len == addr_bytes) {
      const net::Address a = addr_bytes == 4
                                 ? net::Address::from_v4(std::span<const uint8_t, 4>(data, 4))
                                 : net::Address::from_v6(std::span<const uint8_t, 16>(data, 16));
      (rta.rta_type == IFA_LOCAL ? local : address) = a;
    } else if (rta.rta_type == IFA_FLAGS && len == sizeof(uint32_t)) {
      std::memcpy(&flags, data, sizeof flags);
    }
    off += RTA_ALIGN(rta.rta_len);
  }
  // IPv4: IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on point-to-point
  // links). IPv6 reports IFA_ADDRESS (and IFA_LOCAL only on point-to-point).
  const std::optional<net::Address> own = local ? local : address;
  if (!own) return std::nullopt;
  return ParsedAddress{GidEntry{.index = 0,
                                .gid = *own,
                                .ifindex = ifa.ifa_index,
                                .family = ifa.ifa_family,
                                .prefix_len = ifa.ifa_prefixlen,
                                .scope = ifa.ifa_scope},
                       flags};
}

}  // namespace

bool apply_netlink_addr_messages(std::span<const uint8_t> buffer, GidTable* table, bool* changed) {
  bool done = false;
  size_t off = 0;
  while (off + sizeof(nlmsghdr) <= buffer.size()) {
    nlmsghdr h;
    std::memcpy(&h, buffer.data() + off, sizeof h);
    if (h.nlmsg_len < sizeof(nlmsghdr) || off + h.nlmsg_len > buffer.size()) break;
    const auto payload = buffer.subspan(off + NLMSG_HDRLEN, h.nlmsg_len - NLMSG_HDRLEN);
    if (h.nlmsg_type == NLMSG_DONE) {
      done = true;
    } else if (h.nlmsg_type == RTM_NEWADDR || h.nlmsg_type == RTM_DELADDR) {
      if (const auto a = parse_ifaddr(payload)) {
        // A tentative (DAD in progress) or DAD-failed IPv6 address cannot be used; the kernel
        // sends RTM_NEWADDR again once DAD completes.
        const bool usable =
            h.nlmsg_type == RTM_NEWADDR && !(a->flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED));
        *changed |= usable ? table->add(a->entry) : table->remove(a->entry.ifindex, a->entry.gid);
      }
    }
    off += NLMSG_ALIGN(h.nlmsg_len);
  }
  return done;
}

bool AddressMonitor::open(std::string* error) {
  fd_.reset(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
  if (!fd_.valid()) {
    *error = errno_text("netlink socket");
    return false;
  }
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  sa.nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (bind(fd_.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    *error = errno_text("netlink bind");
    return false;
  }
  return request_dump(error);
}

bool AddressMonitor::request_dump(std::string* error) {
  struct {
    nlmsghdr h;
    ifaddrmsg ifa;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.h.nlmsg_type = RTM_GETADDR;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.h.nlmsg_seq = ++seq_;
  req.ifa.ifa_family = AF_UNSPEC;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_.get(), &req, sizeof req, 0, reinterpret_cast<const sockaddr*>(&kernel),
             sizeof kernel) != static_cast<ssize_t>(sizeof req)) {
    *error = errno_text("RTM_GETADDR");
    return false;
  }
  return true;
}

bool AddressMonitor::handle_readable(GidTable* table, std::string* error, bool* changed) {
  bool any = false;
  const auto report = [&] {
    if (changed) *changed = any;
  };
  // 32 KiB: the kernel fills dump messages up to the receive buffer size it expects (8 KiB+).
  alignas(nlmsghdr) static thread_local uint8_t buffer[32768];
  for (int i = 0; i < 64; ++i) {
    const ssize_t n = recv(fd_.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) {
        report();
        return true;
      }
      if (errno == ENOBUFS) {  // events were lost: resync from a fresh dump
        table->mark_all_stale();
        resync_ = true;
        if (!request_dump(error)) return false;
        continue;
      }
      *error = errno_text("netlink recv");
      return false;
    }
    const bool done = apply_netlink_addr_messages({buffer, static_cast<size_t>(n)}, table, &any);
    dumped_ |= done;
    if (done && resync_) {
      const size_t before = table->size();
      table->sweep_stale();
      any |= table->size() != before;
      resync_ = false;
    }
  }
  report();
  return true;
}

}  // namespace urdma::daemon
