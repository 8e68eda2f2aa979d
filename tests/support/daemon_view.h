// The namespace's urdmad as its client API shows it, for tests that kill it and watch a new one
// take over (README "Takeover after a restart"): its pid, how it came by its UDP group, and every
// connection's pid and role. Header-only: the tests that use it link urdma_daemon themselves
// (urdma_test_support does not).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/client.h"

namespace urdma::test {

struct DaemonView {
  pid_t pid = 0;
  uint32_t takeover = daemon::kTakeoverNone;
  std::vector<daemon::ClientEntry> clients;

  bool has(pid_t client_pid, daemon::ClientRole role) const {
    for (const daemon::ClientEntry& c : clients)
      if (static_cast<pid_t>(c.pid) == client_pid && c.role == static_cast<uint16_t>(role))
        return true;
    return false;
  }
  // The pid of the first connection holding a slot, or 0.
  pid_t slot_holder() const {
    for (const daemon::ClientEntry& c : clients)
      if (c.role == static_cast<uint16_t>(daemon::ClientRole::kSlotHolder))
        return static_cast<pid_t>(c.pid);
    return 0;
  }
};

// Asks the running daemon (never starts one); nullopt when none answers.
inline std::optional<DaemonView> view_daemon() {
  daemon::ClientOptions options;
  options.spawn = false;
  daemon::Client c;
  std::string why;
  if (daemon::Client::connect_or_spawn(options, &c, &why) != 0) return std::nullopt;
  daemon::StatusInfo status{};
  daemon::ClientsPage page{};
  DaemonView v;
  if (c.query_status(&status) != 0 || c.query_clients(&page, &v.clients) != 0)
    return std::nullopt;
  v.pid = static_cast<pid_t>(status.pid);
  v.takeover = page.takeover;
  return v;
}

// Polls view_daemon() every 20 ms until `ok` holds: that view, or nullopt when time ran out.
inline std::optional<DaemonView> wait_daemon(const std::function<bool(const DaemonView&)>& ok,
                                             int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::optional<DaemonView> v;
  for (;;) {
    v = view_daemon();
    if (v && ok(*v)) return v;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    usleep(20 * 1000);
  }
}

}  // namespace urdma::test
