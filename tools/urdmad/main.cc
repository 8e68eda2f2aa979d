// urdmad: the urdma host agent of one network namespace. Started on demand by the library as the
// user's own daemon (and exits when idle), or as the namespace's system daemon for every user
// (--system, or systemd's urdmad.socket). See src/daemon/supervisor.h and daemon.h.
#include <CLI/CLI.hpp>

#include <net/if.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <iostream>

#include "daemon/client.h"
#include "daemon/paths.h"
#include "daemon/supervisor.h"

namespace {

using namespace urdma::daemon;

// `urdmad --status`: what the namespace's daemon reports, without starting one.
int print_status(const ClientOptions& o) {
  Client client;
  std::string detail;
  if (Client::connect_or_spawn(o, &client, &detail) != 0) {
    std::cerr << "urdmad: " << detail << '\n';
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
  const HelloInfo& h = client.daemon_info();
  std::cout << "urdmad pid " << st.pid << " (keeper " << h.keeper_pid << ", "
            << (h.mode == kModeSystem ? "system daemon" : "daemon of " + owner_text(h.uid))
            << ") on " << client.socket_path() << ": UDP port " << st.udp_port
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

// A number from the environment (secure_getenv), or `fallback`.
template <class T>
T env_or(const char* name, T fallback) {
  const char* v = secure_getenv(name);
  return v && *v ? static_cast<T>(std::strtoul(v, nullptr, 10)) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "urdmad: the urdma host agent. Owns the RoCEv2 UDP port through a group of steered slot "
      "sockets, hands one to each process, keeps the GID table. One per network namespace."};
  SupervisorOptions so;
  DaemonOptions& options = so.daemon;
  options.udp_port = udp_port_from_env();
  options.slot_count = env_or<unsigned>("URDMA_SLOTS", options.slot_count);
  options.takeover_grace_ms =
      env_or<uint32_t>("URDMA_TAKEOVER_GRACE_MS", options.takeover_grace_ms);
  options.hello_timeout_ms = env_or<uint32_t>("URDMA_HELLO_TIMEOUT_MS", options.hello_timeout_ms);
  options.listen_wait_ms = env_or<uint32_t>("URDMA_LISTEN_WAIT_MS", options.listen_wait_ms);
  uint32_t idle_timeout_ms = env_or<uint32_t>("URDMA_IDLE_TIMEOUT_MS", 30000);
  bool foreground = false;
  bool ipv4_only = false;
  std::string runtime_dir;
  app.add_flag("--foreground", foreground,
               "run as a service: log to stderr, no idle exit unless --idle-timeout-ms is given");
  app.add_flag("--system", options.system,
               "serve every user of the namespace (root, or systemd's urdmad.socket); each user "
               "sees and reaches only their own processes");
  app.add_option("--runtime-dir", runtime_dir,
                 "the per-user daemon's directory (default: the one the library would choose)");
  auto* idle = app.add_option("--idle-timeout-ms", idle_timeout_ms,
                              "exit after this long without clients (0: never; "
                              "default 30000 or $URDMA_IDLE_TIMEOUT_MS)");
  app.add_option("--port", options.udp_port, "UDP port of RoCEv2 (default 4791 or $URDMA_UDP_PORT)")
      ->default_val(options.udp_port);
  app.add_option("--slots", options.slot_count,
                 "slot sockets in the group, slot 0 included (default 64 or $URDMA_SLOTS)")
      ->default_val(options.slot_count)
      ->check(CLI::Range(kMinSlots, kMaxSlots));
  app.add_flag("--ipv4-only", ipv4_only, "bind 0.0.0.0 instead of dual-stack [::]");
  app.add_option("--takeover-grace-ms", options.takeover_grace_ms,
                 "after a restart, hold new leases this long for the survivors to reattach "
                 "(default 500 or $URDMA_TAKEOVER_GRACE_MS)")
      ->default_val(options.takeover_grace_ms);
  app.add_option("--listen-wait-ms", options.listen_wait_ms,
                 "how long a connection request for a port nobody holds waits for a listener "
                 "before it is refused (0: at once; default 1000 or $URDMA_LISTEN_WAIT_MS)")
      ->default_val(options.listen_wait_ms)
      ->check(CLI::Range(0u, 60000u));
  app.add_option("--hello-timeout-ms", options.hello_timeout_ms,
                 "close a connection that has not greeted within this (default 2000)")
      ->default_val(options.hello_timeout_ms);
  app.add_option("--max-clients-per-user", options.max_clients_per_user,
                 "connections one user may have open (default 256)")
      ->default_val(options.max_clients_per_user);
  app.add_option("--max-clients-per-process", options.max_clients_per_process,
                 "connections one process may have open (default 16)")
      ->default_val(options.max_clients_per_process);
  unsigned max_slots_per_user = 0;
  auto* slots_per_user = app.add_option(
      "--max-slots-per-user", max_slots_per_user,
      "slots one user may hold at once on a system daemon (default: three quarters of them)");
  app.add_flag("-v,--verbose", options.verbose, "log clients and slots to stderr");
  bool status = false;
  app.add_flag("--status", status,
               "print the running daemon's slots, counters and GID table (starts none)");
  app.add_option("--status-fd", so.status_fd,
                 "write the start-up result here (used by the library)");
  CLI11_PARSE(app, argc, argv);

  if (status) {
    ClientOptions o;
    o.spawn = false;
    o.runtime_dir = runtime_dir;
    return print_status(o);
  }
  options.allow_ipv6 = !ipv4_only;
  options.idle_timeout_ms = foreground && idle->count() == 0 ? 0 : idle_timeout_ms;
  if (foreground) options.verbose = true;
  options.max_slots_per_user = slots_per_user->count() ? max_slots_per_user
                               : options.system        ? (options.slot_count - 1) * 3 / 4
                                                       : 0;

  const uint64_t netns = netns_inode();
  std::string why;
  if (options.system) {
    so.endpoint = system_endpoint(netns);
    // The system directory is root's: made here when root starts the first system daemon.
    if (mkdir(so.endpoint.dir.c_str(), 0755) != 0 && errno != EEXIST) why = so.endpoint.dir;
    if (why.empty() && !trusted_path(so.endpoint.dir, 0, &why)) why = "refusing it: " + why;
  } else if (!runtime_dir.empty()) {
    so.endpoint = endpoint_in(runtime_dir, netns, false);
    if (!trusted_path(runtime_dir, geteuid(), &why)) why = "refusing it: " + why;
  } else if (user_endpoint(geteuid(), netns, &so.endpoint, &why) == 0) {
    why.clear();
  }
  // Under systemd the socket is systemd's: no directory of ours is needed.
  if (!why.empty() && !std::getenv("LISTEN_FDS")) {
    std::cerr << "urdmad: no usable directory for the socket: " << why << '\n';
    if (so.status_fd >= 0) {
      SpawnStatus st{kSpawnStarted, EACCES, {}};
      std::strncpy(st.reason, why.c_str(), sizeof st.reason - 1);
      (void)!write(so.status_fd, &st, sizeof st);
    }
    return 1;
  }
  return run_supervisor(std::move(so));
}
