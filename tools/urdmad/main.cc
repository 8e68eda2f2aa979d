// urdmad: the urdma host agent of one network namespace. Started on demand by the library
// (and exits when idle), or as a service with --foreground. See src/daemon/daemon.h.
#include <CLI/CLI.hpp>

#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iostream>

#include "daemon/client.h"
#include "daemon/daemon.h"

namespace {

// Tells the process that spawned us (src/daemon/client.cc) how start-up went.
void report_status(int fd, int err, const std::string& reason) {
  if (fd < 0) return;
  urdma::daemon::SpawnStatus st{urdma::daemon::kSpawnStarted, err, {}};
  std::strncpy(st.reason, reason.c_str(), sizeof st.reason - 1);
  (void)!write(fd, &st, sizeof st);
  close(fd);
}

// `urdmad --status`: what the namespace's daemon reports, without starting one.
int print_status(const std::string& socket_name) {
  using namespace urdma::daemon;
  Client client;
  std::string detail;
  ClientOptions o;
  o.socket_name = socket_name;
  o.spawn = false;
  if (const int err = Client::connect_or_spawn(o, &client, &detail)) {
    std::cerr << "urdmad: "
              << (err == ECONNREFUSED
                      ? "not running in this network namespace (@" + socket_name + ")"
                      : detail)
              << '\n';
    return 1;
  }
  StatusInfo st{};
  std::vector<GidEntry> gids;
  int err = client.query_status(&st);
  if (err == 0) err = client.query_gids(&gids);
  if (err != 0) {
    std::cerr << "urdmad: " << std::strerror(err) << '\n';
    return 1;
  }
  std::cout << "urdmad pid " << st.pid << " on @" << socket_name << ": UDP port " << st.udp_port
            << (st.family == AF_INET6 ? " (IPv6 dual-stack)" : " (IPv4)") << ", "
            << (st.idle_timeout_ms ? "idle exit after " + std::to_string(st.idle_timeout_ms) + " ms"
                                   : std::string("no idle exit"))
            << '\n'
            << "slots: " << st.slots_leased << " of " << st.slot_count - 1 << " leased ("
            << st.slot_count << " sockets, slot 0 is the daemon's); clients: " << st.clients
            << " (at most " << st.max_clients << ")\n"
            << "since start: " << st.clients_accepted << " clients accepted, " << st.clients_refused
            << " refused, " << st.leases << " leases, " << st.reclaims << " reclaimed, "
            << st.drained_datagrams << " datagrams drained, " << st.mads_forwarded
            << " CM MADs forwarded, " << st.mads_dropped << " dropped\n"
            << "GID table (" << gids.size() << "):\n";
  for (const auto& g : gids) {
    char name[IF_NAMESIZE] = "?";
    if_indextoname(g.ifindex, name);
    std::cout << "  " << g.index << "  " << g.gid.to_string() << "/"
              << static_cast<int>(g.prefix_len) << "  " << name << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using urdma::daemon::DaemonOptions;
  CLI::App app{
      "urdmad: the urdma host agent. Owns the RoCEv2 UDP port through a group of steered slot "
      "sockets, hands one to each process, keeps the GID table. One per network namespace."};
  DaemonOptions options;
  options.socket_name = urdma::daemon::socket_name_from_env();
  options.udp_port = urdma::daemon::udp_port_from_env();
  bool foreground = false;
  bool ipv4_only = false;
  int status_fd = -1;
  uint32_t idle_timeout_ms = 30000;
  if (const char* env = std::getenv("URDMA_IDLE_TIMEOUT_MS"); env && *env)
    idle_timeout_ms = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  if (const char* env = std::getenv("URDMA_SLOTS"); env && *env)
    options.slot_count = static_cast<unsigned>(std::strtoul(env, nullptr, 10));
  if (const char* env = std::getenv("URDMA_TAKEOVER_WAIT_MS"); env && *env)
    options.takeover_wait_ms = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  if (const char* env = std::getenv("URDMA_TAKEOVER_GRACE_MS"); env && *env)
    options.takeover_grace_ms = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  app.add_flag("--foreground", foreground,
               "run as a service: log to stderr, no idle exit unless --idle-timeout-ms is given");
  auto* idle = app.add_option("--idle-timeout-ms", idle_timeout_ms,
                              "exit after this long without clients (0: never; "
                              "default 30000 or $URDMA_IDLE_TIMEOUT_MS)");
  app.add_option("--port", options.udp_port, "UDP port of RoCEv2 (default 4791 or $URDMA_UDP_PORT)")
      ->default_val(options.udp_port);
  app.add_option("--socket-name", options.socket_name,
                 "abstract unix socket name (default urdma/v1 or $URDMA_SOCKET)")
      ->default_val(options.socket_name);
  app.add_option("--slots", options.slot_count,
                 "slot sockets in the group, slot 0 included (default 64 or $URDMA_SLOTS)")
      ->default_val(options.slot_count)
      ->check(CLI::Range(urdma::daemon::kMinSlots, urdma::daemon::kMaxSlots));
  app.add_flag("--ipv4-only", ipv4_only, "bind 0.0.0.0 instead of dual-stack [::]");
  app.add_option("--takeover-wait-ms", options.takeover_wait_ms,
                 "when the port is held by the group of an earlier urdmad, wait this long for a "
                 "running process to hand it over (default 3000 or $URDMA_TAKEOVER_WAIT_MS)")
      ->default_val(options.takeover_wait_ms);
  app.add_option("--takeover-grace-ms", options.takeover_grace_ms,
                 "after the first process handed the group over, hold new leases this long for "
                 "the others (default 500 or $URDMA_TAKEOVER_GRACE_MS)")
      ->default_val(options.takeover_grace_ms);
  app.add_flag("-v,--verbose", options.verbose, "log clients and slots to stderr");
  bool status = false;
  app.add_flag("--status", status,
               "print the running daemon's slots, counters and GID table (starts none)");
  app.add_option("--status-fd", status_fd, "write the start-up result here (used by the library)");
  CLI11_PARSE(app, argc, argv);

  if (status) return print_status(options.socket_name);
  options.allow_ipv6 = !ipv4_only;
  options.idle_timeout_ms = foreground && idle->count() == 0 ? 0 : idle_timeout_ms;
  if (foreground) options.verbose = true;

  int err = 0;
  std::string error;
  auto daemon = urdma::daemon::Daemon::create(options, &err, &error);
  if (!daemon) {
    std::cerr << "urdmad: " << error << '\n';
    report_status(status_fd, err, error);
    return err == EADDRINUSE ? 3 : 1;
  }
  report_status(status_fd, 0, "");
  return daemon->run();
}
