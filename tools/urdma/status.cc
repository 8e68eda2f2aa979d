// `urdma status` and `urdma devices`: what this network namespace's urdmad reports (the queries
// kQueryStatus, kQueryClients and kQueryGids of daemon/protocol.h), as text or JSON. A system
// daemon lists a user's own processes only (root: everyone's).
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "daemon/client.h"
#include "daemon/daemon.h"
#include "daemon/paths.h"
#include "tools/urdma/commands.h"
#include "tools/urdma/json.h"

namespace urdma::tools {
namespace {

using daemon::ClientEntry;
using daemon::ClientRole;
using daemon::ClientsPage;
using daemon::GidEntry;
using daemon::StatusInfo;

// The device name: one urdma device per network namespace (its urdmad).
constexpr char kDeviceName[] = "urdma0";

struct Snapshot {
  std::string socket;
  daemon::HelloInfo hello{};
  StatusInfo status{};
  ClientsPage page{};
  std::vector<ClientEntry> clients;
  std::vector<GidEntry> gids;
};

// 0, or 1 after printing why.
int query(bool spawn, bool want_clients, Snapshot* s, const char* who) {
  daemon::Client client;
  daemon::ClientOptions o;
  o.spawn = spawn;
  std::string detail;
  if (daemon::Client::connect_or_spawn(o, &client, &detail) != 0) {
    std::cerr << who << ": " << detail << '\n';
    // Another user's daemon may serve the namespace: say whose, not only that ours is absent.
    const uint16_t port = daemon::udp_port_from_env();
    if (const auto owner = daemon::udp_port_owner(port); owner && *owner != geteuid())
      std::cerr << who << ": UDP port " << port << " of this network namespace is held by "
                << daemon::owner_text(*owner)
                << "; a system daemon (`systemctl enable --now urdmad.socket`, or `urdmad "
                   "--system` as root) serves every user\n";
    return 1;
  }
  s->socket = client.socket_path();
  s->hello = client.daemon_info();
  int err = client.query_status(&s->status);
  if (err == 0 && want_clients) {
    err = client.query_clients(&s->page, &s->clients);
    if (err == EPROTO) {  // an urdmad older than kQueryClients: show the rest
      std::cerr << who << ": this urdmad does not list its clients (an older version)\n";
      s->clients.clear();
      err = 0;
    }
  }
  if (err == 0) err = client.query_gids(&s->gids);
  if (err != 0) {
    std::cerr << who << ": urdmad did not answer: " << std::strerror(err) << '\n';
    return 1;
  }
  return 0;
}

// A GID as sysfs and ibv_devinfo write it: eight groups of four hex digits.
std::string gid_text(const net::Address& a) {
  const auto& b = a.bytes();
  char text[40];
  std::snprintf(text, sizeof text,
                "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

std::string netdev(uint32_t ifindex) {
  char name[IF_NAMESIZE] = {};
  return if_indextoname(ifindex, name) ? std::string(name) : "if" + std::to_string(ifindex);
}

const char* role_name(uint16_t role) {
  switch (static_cast<ClientRole>(role)) {
    case ClientRole::kSlotHolder:
      return "slot";
    case ClientRole::kGidWatcher:
      return "gid-watcher";
    case ClientRole::kMadChannel:
      return "mad-channel";
    case ClientRole::kDeparted:
      return "departed";
    case ClientRole::kConnection:
      break;
  }
  return "connection";
}

const char* takeover_name(uint32_t t) {
  switch (t) {
    case daemon::kTakeoverGrace:
      return "took over, grace period";
    case daemon::kTakeoverDone:
      return "took over";
    default:
      return "none";
  }
}

std::string duration(uint64_t ms) {
  std::ostringstream o;
  const uint64_t s = ms / 1000;
  if (s >= 3600) o << s / 3600 << "h";
  if (s >= 60) o << (s / 60) % 60 << "m";
  o << s % 60 << "." << (ms % 1000) / 100 << "s";
  return o.str();
}

std::string netns_text(uint64_t inode) {
  return "net:[" + std::to_string(inode) + "]";
}

bool is_slot(const ClientEntry& c) {
  return c.role == static_cast<uint16_t>(ClientRole::kSlotHolder);
}
bool reported(const ClientEntry& c) {
  return (c.flags & daemon::kClientReported) != 0;
}

void json_gids(JsonWriter& j, const std::vector<GidEntry>& gids) {
  j.begin_array("gids");
  for (const auto& g : gids) {
    j.begin_object();
    j.value("index", g.index);
    j.value("gid", gid_text(g.gid));
    j.value("address", g.gid.to_string());
    j.value("prefix_len", uint32_t{g.prefix_len});
    j.value("type", "RoCE v2");
    j.value("netdev", netdev(g.ifindex));
    j.value("ifindex", g.ifindex);
    j.end_object();
  }
  j.end_array();
}

void json_counters(JsonWriter& j, const daemon::CounterReport& r) {
  j.begin_object("counters");
  for (size_t i = 0; i < daemon::kCounterCount; ++i)
    j.value(daemon::kCounterNames[i], r.counters[i]);
  j.end_object();
}

void print_gid_table(const std::vector<GidEntry>& gids, const char* indent) {
  std::cout << indent
            << "GID  type     netdev      gid                                      "
               "address\n";
  for (const auto& g : gids) {
    std::cout << indent << std::left << std::setw(5) << g.index << std::setw(9) << "RoCE v2"
              << std::setw(12) << netdev(g.ifindex) << std::setw(41) << gid_text(g.gid)
              << g.gid.to_string() << "/" << static_cast<int>(g.prefix_len) << '\n';
  }
}

}  // namespace

int print_status(const StatusOptions& options) {
  Snapshot s;
  if (query(/*spawn=*/false, /*want_clients=*/true, &s, "urdma status")) {
    if (options.json) {
      JsonWriter j(std::cout);
      j.begin_object();
      j.value("running", false);
      j.end_object();
      j.finish();
    }
    return 1;
  }
  const StatusInfo& st = s.status;
  // Totals over the processes that reported.
  daemon::CounterReport total{};
  for (const auto& c : s.clients)
    if (reported(c))
      for (size_t i = 0; i < daemon::kCounterCount; ++i) total.counters[i] += c.report.counters[i];

  if (options.json) {
    JsonWriter j(std::cout);
    j.begin_object();
    j.value("running", true);
    j.begin_object("daemon");
    j.value("pid", st.pid);
    j.value("keeper_pid", s.page.keeper_pid);
    j.value("restarts", s.page.restarts);
    j.value("mode", s.page.mode == daemon::kModeSystem ? "system" : "user");
    j.value("uid", s.page.daemon_uid);
    if (s.page.viewer_uid == daemon::kAllUsers) {
      j.value("shows", "all users");
    } else {
      j.value("shows", "uid " + std::to_string(s.page.viewer_uid));
    }
    j.value("uptime_ms", s.page.uptime_ms);
    j.value("netns", netns_text(s.page.netns_inode));
    j.value("socket", s.socket);
    j.value("udp_port", uint32_t{st.udp_port});
    j.value("family", st.family == AF_INET6 ? "ipv6-dual-stack" : "ipv4");
    j.value("idle_timeout_ms", st.idle_timeout_ms);
    j.value("takeover", takeover_name(s.page.takeover));
    j.value("survivors", s.page.survivors);
    j.value("clients_accepted", st.clients_accepted);
    j.value("clients_refused", st.clients_refused);
    j.value("leases", st.leases);
    j.value("reclaims", st.reclaims);
    j.value("drained_datagrams", st.drained_datagrams);
    j.value("mads_forwarded", st.mads_forwarded);
    j.value("mads_dropped", st.mads_dropped);
    j.value("cm_rejects_sent", st.cm_rejects_sent);
    j.value("cm_dreqs_sent", st.cm_dreqs_sent);
    j.value("cm_dreps_sent", st.cm_dreps_sent);
    j.value("cm_dreq_retries", st.cm_dreq_retries);
    j.value("cm_requests_waited", st.cm_requests_waited);
    j.value("cm_requests_served", st.cm_requests_served);
    j.value("cm_requests_unwaited", st.cm_requests_unwaited);
    j.value("cm_mras_sent", st.cm_mras_sent);
    j.end_object();
    j.begin_object("device");
    j.value("name", kDeviceName);
    j.end_object();
    j.value("slot_count", st.slot_count);
    j.value("slots_leased", st.slots_leased);
    j.begin_array("slots");
    j.begin_object();
    j.value("index", 0);
    j.value("state", "daemon");
    j.value("qpn_first", 0);
    j.value("qpn_count", daemon::kQpnsPerRange);
    j.end_object();
    for (const auto& c : s.clients) {
      if (!is_slot(c)) continue;
      j.begin_object();
      j.value("index", c.slot);
      j.value("state", "leased");
      j.value("pid", c.pid);
      j.value("uid", c.uid);
      j.value("qpn_first", c.qpn_base);
      j.value("qpn_count", c.qpn_count);
      j.value("reattached", (c.flags & daemon::kClientReattached) != 0);
      j.end_object();
    }
    j.end_array();
    j.begin_array("clients");
    for (const auto& c : s.clients) {
      j.begin_object();
      j.value("pid", c.pid);
      j.value("uid", c.uid);
      j.value("comm", c.comm);
      j.value("role", role_name(c.role));
      if (c.slot == daemon::kNotASlot) {
        j.null("slot");
      } else {
        j.value("slot", c.slot);
      }
      j.value("connected_ms", c.connected_ms);
      j.value("reattached", (c.flags & daemon::kClientReattached) != 0);
      if (reported(c)) {
        if (c.report.qp_count == daemon::kQpCountUnknown) {
          j.null("qps");
        } else {
          j.value("qps", c.report.qp_count);
        }
        j.value("report_age_ms", c.report_age_ms);
        json_counters(j, c.report);
      }
      j.end_object();
    }
    j.end_array();
    json_gids(j, s.gids);
    json_counters(j, total);
    j.end_object();
    j.finish();
    return 0;
  }

  std::cout << "urdmad: pid " << st.pid << " (keeper " << s.page.keeper_pid << ", "
            << s.page.restarts << " restarts), "
            << (s.page.mode == daemon::kModeSystem
                    ? std::string("system daemon")
                    : "daemon of " + daemon::owner_text(s.page.daemon_uid))
            << ", up " << duration(s.page.uptime_ms) << ", network namespace "
            << netns_text(s.page.netns_inode) << ", socket " << s.socket << '\n';
  if (s.page.viewer_uid != daemon::kAllUsers && s.page.mode == daemon::kModeSystem)
    std::cout << "  showing the processes of " << daemon::owner_text(s.page.viewer_uid)
              << " only (root sees every user's)\n";
  std::cout << "  UDP port " << st.udp_port
            << (st.family == AF_INET6 ? " (IPv6 dual-stack)" : " (IPv4)") << ", "
            << (st.idle_timeout_ms ? "idle exit after " + duration(st.idle_timeout_ms)
                                   : std::string("no idle exit"))
            << ", takeover: " << takeover_name(s.page.takeover);
  if (s.page.survivors) std::cout << " (" << s.page.survivors << " processes reattached)";
  std::cout << '\n'
            << "  since start: " << st.clients_accepted << " clients accepted, "
            << st.clients_refused << " refused, " << st.leases << " leases, " << st.reclaims
            << " reclaimed, " << st.drained_datagrams << " datagrams drained, " << st.mads_forwarded
            << " CM MADs forwarded, " << st.mads_dropped << " dropped\n"
            << "CM answered by urdmad: " << st.cm_rejects_sent << " REJ/SIDR_REP (no listener), "
            << st.cm_dreqs_sent << " DREQ (process died; " << st.cm_dreq_retries << " repeated), "
            << st.cm_dreps_sent << " DREP (no holder)\n"
            << "requests for a port nobody held: " << st.cm_requests_waited
            << " waited for a listener (" << st.cm_requests_served << " served, " << st.cm_mras_sent
            << " MRA), " << st.cm_requests_unwaited << " refused at once\n\n"
            << "slots: " << st.slots_leased << " of " << st.slot_count - 1 << " leased ("
            << st.slot_count << " sockets)\n"
            << "  SLOT  STATE   PID      UID    QPNs\n"
            << "  0     daemon  " << std::left << std::setw(9) << st.pid << std::setw(7) << "-"
            << "0x000000-0x000fff (QP0, QP1, unknown QPNs)\n";
  for (const auto& c : s.clients) {
    if (!is_slot(c)) continue;
    char range[40];
    std::snprintf(range, sizeof range, "%#08x-%#08x", c.qpn_base, c.qpn_base + c.qpn_count - 1);
    std::cout << "  " << std::left << std::setw(6) << c.slot << std::setw(8) << "leased"
              << std::setw(9) << c.pid << std::setw(7) << c.uid << range
              << ((c.flags & daemon::kClientReattached) ? "  (reattached)" : "") << '\n';
  }
  std::cout << "\nclients: " << s.clients.size()
            << (s.clients.size() == 1 ? " connection\n" : " connections\n")
            << "  PID      COMMAND          ROLE         SLOT  QPs   CONNECTED\n";
  for (const auto& c : s.clients) {
    std::cout << "  " << std::left << std::setw(9) << c.pid << std::setw(17) << c.comm
              << std::setw(13) << role_name(c.role) << std::setw(6)
              << (c.slot == daemon::kNotASlot ? std::string("-") : std::to_string(c.slot))
              << std::setw(6)
              << (reported(c) && c.report.qp_count != daemon::kQpCountUnknown
                      ? std::to_string(c.report.qp_count)
                      : std::string("-"))
              << duration(c.connected_ms) << '\n';
  }
  std::cout << "\nGIDs of " << kDeviceName << " (port 1):\n";
  print_gid_table(s.gids, "  ");
  std::cout << "\ncounters (rdma statistic names; per process as last reported, about once a "
               "second):\n";
  std::cout << "  " << std::left << std::setw(24) << "COUNTER" << std::setw(14) << "TOTAL";
  for (const auto& c : s.clients)
    if (reported(c)) std::cout << std::setw(14) << ("pid " + std::to_string(c.pid));
  std::cout << '\n';
  for (size_t i = 0; i < daemon::kCounterCount; ++i) {
    std::cout << "  " << std::left << std::setw(24) << daemon::kCounterNames[i] << std::setw(14)
              << total.counters[i];
    for (const auto& c : s.clients)
      if (reported(c)) std::cout << std::setw(14) << c.report.counters[i];
    std::cout << '\n';
  }
  return 0;
}

int print_devices(const DevicesOptions& options) {
  Snapshot s;
  if (query(options.start_daemon, /*want_clients=*/false, &s, "urdma devices")) return 1;
  if (options.json) {
    JsonWriter j(std::cout);
    j.begin_object();
    j.begin_array("devices");
    j.begin_object();
    j.value("name", kDeviceName);
    j.value("transport", "RoCE v2 (UDP port " + std::to_string(s.status.udp_port) + ")");
    j.value("daemon_pid", s.status.pid);
    j.value("socket", s.socket);
    j.value("port", 1);
    json_gids(j, s.gids);
    j.end_object();
    j.end_array();
    j.end_object();
    j.finish();
    return 0;
  }
  std::cout << kDeviceName << ": RoCE v2 over UDP port " << s.status.udp_port << ", urdmad pid "
            << s.status.pid << " (" << s.socket << ")\n"
            << "  port 1, " << s.gids.size() << " GIDs (pass the index to -g of ibv_*_pingpong, "
            << "-x of perftest):\n";
  print_gid_table(s.gids, "    ");
  return 0;
}

}  // namespace urdma::tools
