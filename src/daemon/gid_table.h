// The host's GID table: one GID per interface address (IPv4 as IPv4-mapped, IPv6 as is;
// loopback included so two processes on one host can reach each other), kept current from
// rtnetlink (RTM_NEWADDR / RTM_DELADDR).
//
// Indices are stable: a new address takes the lowest free index and keeps it until it goes
// away, as a GID index must (an AH or QP attribute names a GID by index).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/unique_fd.h"
#include "net/address.h"

namespace urdma::daemon {

inline constexpr unsigned kMaxGids = 1024;  // as many as the device reports (rxe's 1024)

struct GidEntry {
  uint32_t index = 0;
  net::Address gid;
  uint32_t ifindex = 0;
  uint8_t family = 0;  // AF_INET / AF_INET6: the address family the interface reported
  uint8_t prefix_len = 0;
  uint8_t scope = 0;  // RT_SCOPE_*
  friend bool operator==(const GidEntry&, const GidEntry&) = default;
};

class GidTable {
 public:
  // Adds or refreshes the address of (ifindex, gid); false if unchanged or the table is full.
  bool add(const GidEntry& entry);
  // False if there was no such entry.
  bool remove(uint32_t ifindex, const net::Address& gid);
  // The valid entries in index order.
  std::vector<GidEntry> entries() const;
  size_t size() const;

  // Resync after a lost netlink message: mark, re-add everything, sweep the unmarked.
  void mark_all_stale();
  void sweep_stale();

 private:
  struct Slot {
    std::optional<GidEntry> entry;
    bool stale = false;
  };
  std::vector<Slot> slots_;
};

// Applies every RTM_NEWADDR / RTM_DELADDR in a buffer of netlink messages to `table`.
// Returns true if the buffer held NLMSG_DONE (the end of a dump); sets *changed if any entry
// changed. Malformed messages are skipped, never read past `buffer`.
bool apply_netlink_addr_messages(std::span<const uint8_t> buffer, GidTable* table, bool* changed);

// The rtnetlink socket: subscribed to IPv4 and IPv6 address changes, then a full dump.
class AddressMonitor {
 public:
  bool open(std::string* error);
  int fd() const { return fd_.get(); }
  // Reads every pending message into `table` (non-blocking); *changed is set if an entry
  // changed. Returns false on a fatal socket error (reason in *error). A receive-buffer overflow
  // (ENOBUFS) starts a resync dump.
  bool handle_readable(GidTable* table, std::string* error, bool* changed = nullptr);
  // The first dump has been read whole: the table holds every address.
  bool dumped() const { return dumped_; }

 private:
  bool request_dump(std::string* error);

  UniqueFd fd_;
  uint32_t seq_ = 0;
  bool resync_ = false;
  bool dumped_ = false;
};

}  // namespace urdma::daemon
