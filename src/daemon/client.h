// The client side of urdmad, what a process's runtime calls once at start:
//
//   Client client;
//   if (int err = Client::connect_or_spawn({}, &client, &why)) ...   // an errno
//   Slot slot;
//   if (int err = client.acquire_slot(&slot)) ...                    // EBUSY: table full
//
// connect_or_spawn finds the namespace's daemon (paths.h): a system daemon first, then the
// caller's own per-user daemon, which it starts when none listens (detached: its own session,
// reparented away from the caller, stdio on /dev/null or $URDMA_DAEMON_LOG) and waits for,
// bounded. Before it sends anything it checks whose the socket is: its directory must be one the
// caller can trust, and the daemon (SO_PEERCRED) must run as root or as the caller's euid. Then
// it greets the daemon with its network namespace; a daemon of another namespace (EXDEV) is
// passed over. Two processes spawning at once end with one daemon: the loser finds the
// namespace's lock held (EADDRINUSE) and both connect to the winner. Only a trusted urdmad binary
// is started (find_daemon_binary).
// The connection must stay open while the slot is in use: the daemon reclaims the slot when it
// closes (process exit or death).
//
// A process's runtime then hands the slot to keep(): a thread of the Client that sleeps in poll
// on the connection. Every second it reports the engine's counters when they changed (the
// daemon shows them in `urdma status`); it takes the capture sockets urdmad pushes (kCaptureOn,
// `urdma capture`) and the shared-memory regions and their ends (kShmOn, kShmOff) to the
// runtime's sinks; when the daemon dies it reconnects — to the keeper's
// restarted daemon, or one it starts — checks the daemon as above and hands the slot back with
// its CM listens and connections (protocol.h, RESTART). The slot's socket is never touched: the
// process's QPs keep working throughout. A daemon that refuses the slot for good (EINVAL, EBUSY:
// leased again meanwhile, EACCES) ends the retries; the slot keeps working, unknown to it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
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
  // The per-user daemon's directory. Empty: paths.h's choice ($URDMA_RUNTIME_DIR first).
  std::string runtime_dir;
  // Try the system daemons (paths.h) before the per-user one.
  bool system = true;
  // The urdmad to start (find_daemon_binary). Empty: the trusted default.
  std::string daemon_path;
  bool spawn = true;
  // How long to wait for a spawned daemon, and for any reply.
  int timeout_ms = 5000;
};

struct Slot {
  UniqueFd fd;  // the slot's UDP socket (bound, unconnected, non-blocking)
  SlotInfo info{};
};

// A shared-memory ring pair to another slot of this host (protocol.h, kShmConnect; the layout:
// net/shm_ring.h).
struct ShmPair {
  uint32_t peer_range = 0;  // the other slot's QPN range
  uint32_t side = 0;        // 0: this process writes ring 0; 1: ring 1
  uint32_t peer_pid = 0;
  uint32_t peer_slot = 0;
  UniqueFd region;         // the sealed memfd, net::kShmRegionBytes long
  UniqueFd peer_doorbell;  // the other slot's eventfd: written to wake its engine
};
// What urdmad pushes about regions: one made by a peer that asked (on: the whole pair), or the
// end of a peer's lease (off: only pair.peer_range is set). Or, from the keeper after a daemon
// restart (own_doorbell valid; neither on nor a pair): the doorbell the new daemon gave this
// slot, which the peers of regions made from now on write.
struct ShmPush {
  bool on = false;
  ShmPair pair;
  UniqueFd own_doorbell;
};

class Client {
 public:
  // 0 or an errno: ECONNREFUSED (no daemon and spawn off), EACCES (a socket or daemon that
  // cannot be trusted, or a daemon that refused this user), ENOENT (no trusted urdmad to start),
  // ETIMEDOUT (none came up in time), or the daemon's own start-up error. *detail says what
  // happened in a sentence. Connected means greeted: the daemon has accepted this process.
  static int connect_or_spawn(const ClientOptions& options, Client* out, std::string* detail);

  // 0 or an errno: EBUSY (every slot leased), EALREADY, EACCES (another uid's daemon), ...
  int acquire_slot(Slot* slot);
  int query_gids(std::vector<GidEntry>* gids);
  int query_status(StatusInfo* status);
  // Every connection of the daemon (all pages) and the daemon's page header (total, uptime...).
  int query_clients(ClientsPage* page, std::vector<ClientEntry>* entries);
  // One-way: the daemon keeps the latest report of the connection holding the slot.
  int report_counters(const CounterReport& report);
  // Hands a slot leased from an earlier daemon to this one (protocol.h, RESTART).
  int reattach(const Slot& slot);
  // A CM connection of this process's slot became established / ended (cm_agent.h): the daemon
  // releases it with a DREQ if the process dies. Remembered, so the keeper reports them again
  // to a restarted daemon. 0 or an errno (EINVAL, ENOSPC, ENOENT).
  int conn_up(const ConnRecord& conn);
  int conn_down(uint32_t local_comm_id);
  // A UD QP of this process's slot attached to / detached from a multicast group (protocol.h,
  // kMcastAttach): the daemon joins the group on the slot's socket for the first and leaves it
  // after the last. Remembered, so the keeper attaches them again to a restarted daemon.
  // 0 or an errno (EINVAL, ENOSPC, ENOMEM, ENODEV; detach: ENOENT).
  int mcast_attach(uint32_t qpn, const net::Address& group);
  int mcast_detach(uint32_t qpn, const net::Address& group);
  // On the connection holding the slot: this process's engine reads shared-memory rings
  // (protocol.h, kShmAccept). *doorbell: the slot's eventfd, which peers write to wake it. 0 or
  // an errno (EINVAL: no slot; EALREADY). A keeper accepts again for a restarted daemon and
  // hands the new doorbell to its ShmSink (ShmPush::own_doorbell); regions made before keep
  // working with the old one.
  int shm_accept(UniqueFd* doorbell);
  // The ring pair to the slot holding `qpn`'s range, reached at `address` (kShmConnect): the
  // same region every time while both leases live. 0 or an errno (EINVAL, EADDRNOTAVAIL, ENOENT,
  // EPERM, EOPNOTSUPP, EMFILE, ENOMEM, EAGAIN: protocol.h), EPROTO when what came is not a
  // sealed region of net::kShmRegionBytes and a doorbell.
  int shm_connect(const net::Address& address, uint32_t qpn, ShmPair* pair);
  // The daemon this client greeted (pid, keeper, uid, mode, namespace).
  const HelloInfo& daemon_info() const { return hello_; }
  // The socket it connected to.
  const std::string& socket_path() const { return socket_path_; }

  // Keeps `slot` (leased on this connection) through daemon restarts, and reports `counters`
  // (when set; called on the keeper thread about once a second, it must be thread-safe) while
  // they change. Calls on this Client from other threads stay allowed (one mutex). Returns 0 or
  // an errno (EALREADY: keeping already).
  using CounterSource = std::function<CounterReport()>;
  // `capture` (when set) takes each capturer's socket urdmad pushes for the slot (kCaptureOn:
  // `urdma capture`), on whichever thread reads the push; one pushed before keep() is handed
  // over by keep() itself.
  using CaptureSink = std::function<void(UniqueFd socket, uint32_t slot)>;
  // `shm` (when set) takes the regions peers asked for (kShmOn) and the ends of peers' leases
  // (kShmOff), likewise on whichever thread reads them; those pushed before keep() are handed
  // over by keep() itself. A kShmOn whose fds are not a sealed region and a doorbell is dropped.
  using ShmSink = std::function<void(ShmPush push)>;
  int keep(Slot slot, CounterSource counters, CaptureSink capture = {}, ShmSink shm = {});
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
  // Turns this connection into a capturer (`urdma capture`): urdmad hands `socket` (one end of a
  // SOCK_SEQPACKET pair) to every slot holder that matches `filter` (kCaptureAll, a slot number
  // or a pid) and that this user may see, and to each that leases a slot while this connection
  // stays open. *processes: how many got it now. 0 or an errno (EINVAL, EALREADY).
  int capture(uint32_t filter, int socket, uint32_t* processes);
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
  // A record read where a reply was expected: true when it was a push, kCaptureOn, kShmOn or
  // kShmOff (taken, its fds with it: to the keeper's sink, or kept for keep()).
  bool take_push(std::span<const uint8_t> record, std::vector<UniqueFd>* fds);
  void take_shm_push(ShmPush push);
  int service_request(MsgType type, uint64_t service_id);
  int greet();

  struct Keeper;
  void keep_loop();
  bool wait_stop(int timeout_ms);

  UniqueFd fd_;
  bool push_only_ = false;
  ClientOptions options_;
  std::set<uint64_t> listening_;          // service IDs this connection listens on
  std::map<uint32_t, ConnRecord> conns_;  // connections reported up, by local comm ID
  std::set<std::pair<uint32_t, net::Address>> mcast_;  // (QPN, group) attached
  std::vector<std::pair<UniqueFd, uint32_t>> captures_;  // pushed before keep()
  bool shm_accepted_ = false;        // shm_accept succeeded: accepted again after a restart
  std::vector<ShmPush> shm_pushes_;  // pushed before keep()
  HelloInfo hello_{};
  std::string socket_path_;
  std::unique_ptr<Keeper> keeper_;
};

// The urdmad connect_or_spawn starts: options.daemon_path, else $URDMA_DAEMON (secure_getenv),
// else the installed one beside this code (<prefix>/bin/urdmad, from <prefix>/bin or
// <prefix>/<libdir>/urdma), else — only for code running from the build tree — the urdmad
// built with it. Whichever is named, it must be a regular executable file that it and every
// directory above it belong to root or the caller and no one else may write (trusted_path):
// otherwise "" and the reason in *why.
std::string find_daemon_binary(const ClientOptions& options, std::string* why = nullptr);
// True when the code calling it runs from this build tree (a build-tree binary or library).
bool running_from_build_tree();

}  // namespace urdma::daemon
