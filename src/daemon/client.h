// The client side of urdmad, what a process's runtime calls once at start:
//
//   Client client;
//   if (int err = Client::connect_or_spawn({}, &client, &why)) ...   // an errno
//   Slot slot;
//   if (int err = client.acquire_slot(&slot)) ...                    // EBUSY: table full
//
// connect_or_spawn connects to the namespace's abstract socket; when nobody listens it starts
// urdmad (detached: its own session, reparented away from the caller, stdio on /dev/null or
// $URDMA_DAEMON_LOG) and waits, bounded, until it serves. Two processes spawning at once end with
// one daemon: the loser's bind fails (EADDRINUSE) and both connect to the winner.
// The connection must stay open while the slot is in use: the daemon reclaims the slot when it
// closes (process exit or death).
//
// A process's runtime then hands the slot to keep(): a thread of the Client that sleeps in poll
// on the connection. Every second it reports the engine's counters when they changed (the
// daemon shows them in `urdma status`); when the daemon dies it reconnects — starting a new
// daemon if none runs — and reattaches the slot and the group (protocol.h, TAKEOVER). The
// slot's socket is never touched: the process's QPs keep working throughout. A daemon that
// refuses the slot for good (EINVAL: another group; EBUSY: leased again meanwhile; EACCES) ends
// the retries; the slot keeps working, unknown to the daemon.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/gid_table.h"
#include "daemon/protocol.h"
#include "daemon/unique_fd.h"

namespace urdma::daemon {

struct ClientOptions {
  // Empty: $URDMA_SOCKET, else kDefaultSocketName.
  std::string socket_name;
  // The urdmad to start. Empty: $URDMA_DAEMON, else "urdmad" next to the running executable,
  // else next to the library holding this code, else $PATH, else the urdmad built with this
  // library (running from the build tree).
  std::string daemon_path;
  bool spawn = true;
  // How long to wait for a spawned daemon, and for any reply.
  int timeout_ms = 5000;
};

struct Slot {
  UniqueFd fd;  // the slot's UDP socket (bound, unconnected, non-blocking)
  SlotInfo info{};
  // Copies of every socket of the group, held and never read: while they are open no socket of
  // the group closes, so the steering of this slot survives the daemon's death (protocol.h).
  std::vector<UniqueFd> group;
};

class Client {
 public:
  // 0 or an errno: ECONNREFUSED (no daemon and spawn off), EACCES (the namespace's daemon runs
  // as another user), ENOENT (no urdmad to start), ETIMEDOUT (none came up in time), or the
  // daemon's own start-up error. *detail says what happened in a sentence. Connected means
  // greeted: the daemon has accepted this process.
  static int connect_or_spawn(const ClientOptions& options, Client* out, std::string* detail);

  // 0 or an errno: EBUSY (every slot leased), EALREADY, EACCES (another uid's daemon), ...
  int acquire_slot(Slot* slot);
  int query_gids(std::vector<GidEntry>* gids);
  int query_status(StatusInfo* status);
  // Every connection of the daemon (all pages) and the daemon's page header (total, uptime...).
  int query_clients(ClientsPage* page, std::vector<ClientEntry>* entries);
  // One-way: the daemon keeps the latest report of the connection holding the slot.
  int report_counters(const CounterReport& report);
  // Hands a slot leased from an earlier daemon to this one (protocol.h, TAKEOVER).
  int reattach(const Slot& slot);

  // Keeps `slot` (leased on this connection) through daemon restarts, and reports `counters`
  // (when set; called on the keeper thread about once a second, it must be thread-safe) while
  // they change. Calls on this Client from other threads stay allowed (one mutex). Returns 0 or
  // an errno (EALREADY: keeping already).
  using CounterSource = std::function<CounterReport()>;
  int keep(Slot slot, CounterSource counters);
  // Stops the keeper thread (the destructor does too). Call it before whatever the counter
  // source reads goes away.
  void stop_keeping();
  // How many times the keeper reattached the slot to a new daemon.
  uint64_t reattachments() const;
  const Slot* kept_slot() const;

  Client();
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;

  // Turns this connection into a GID watcher: *gids gets the table now, and fd() becomes
  // readable whenever a new table is queued; next_gid_update() takes it without blocking
  // (EAGAIN: none yet). A watching connection makes no other calls (EBUSY): use a Client of its
  // own for it.
  int watch_gids(std::vector<GidEntry>* gids);
  int next_gid_update(std::vector<GidEntry>* gids);

  // CM MADs (mad_router.h). On the connection holding the slot: listen on a service ID (REQ and
  // SIDR_REQ for it come to this process), or stop. EADDRINUSE: another process listens.
  int listen(uint64_t service_id);
  int unlisten(uint64_t service_id);
  // On a second connection of the same process: turns it into the slot's MAD channel; fd() is
  // readable when a MAD is queued and next_mad() takes it without blocking (EAGAIN: none).
  // Every MAD routed to the slot comes here: REQs for its services, and messages whose
  // communication ID carries the slot (comm_id_for_slot).
  int open_mad_channel(unsigned slot);
  int next_mad(MadDelivery* info, std::vector<uint8_t>* datagram);

  int fd() const { return fd_.get(); }
  bool connected() const { return fd_.valid(); }

 private:
  int call(MsgType request, std::vector<uint8_t>* reply, std::vector<UniqueFd>* passed);
  int call_record(std::span<const uint8_t> request, std::vector<uint8_t>* reply,
                  std::vector<UniqueFd>* passed);
  int call_record_locked(std::span<const uint8_t> request, std::vector<uint8_t>* reply,
                         std::vector<UniqueFd>* passed, std::span<const int> fds = {});
  int next_push(std::vector<uint8_t>* record);
  int service_request(MsgType type, uint64_t service_id);

  struct Keeper;
  void keep_loop();
  bool wait_stop(int timeout_ms);

  UniqueFd fd_;
  bool push_only_ = false;
  ClientOptions options_;
  std::set<uint64_t> listening_;  // service IDs this connection listens on
  std::unique_ptr<Keeper> keeper_;
};

// Where connect_or_spawn looks for urdmad (exposed for tests and diagnostics).
std::string find_daemon_binary(const ClientOptions& options);

}  // namespace urdma::daemon
