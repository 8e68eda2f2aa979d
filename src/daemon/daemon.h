// urdmad: the host agent of one network namespace (see docs/ARCHITECTURE.md, "urdmad"). This
// is the daemon proper, the child its keeper starts (supervisor.h), which hands it the listening
// socket and the slot group.
//
// One thread, one epoll loop over: the unix listener and its client connections, the rtnetlink
// address socket (GID table), a signalfd (SIGTERM/SIGINT/SIGHUP: clean exit), timerfds (idle
// exit, hello deadlines, the restart grace, DREQ pacing), slot 0 (CM MADs, routed to their
// process: mad_router.h) and the free slot sockets (drained: their datagrams name QPNs nobody
// owns). Nothing polls; an idle daemon sleeps in epoll_wait.
//
// Who it serves: a per-user daemon only its own euid (SO_PEERCRED at accept); a system daemon
// (--system) every user of the namespace, each with their own slots, each seeing only their own
// processes in `urdma status` (root sees all). Every connection must greet it (kHello, with its
// network namespace) within the hello timeout; connections are capped per process, per user and
// in all, slots per user (system daemon).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/cm_agent.h"
#include "daemon/device_view.h"
#include "daemon/gid_table.h"
#include "daemon/mad_backlog.h"
#include "daemon/mad_router.h"
#include "daemon/mcast_members.h"
#include "daemon/paths.h"
#include "daemon/protocol.h"
#include "daemon/slot_table.h"
#include "daemon/steering.h"
#include "daemon/unique_fd.h"
#include "gsi/gmp.h"
#include "net/capture_tap.h"
#include "net/udp_socket_io.h"

namespace urdma::daemon {

// The default of DaemonOptions::listen_wait_ms. A scheduler delay of a server under load is
// tens of milliseconds; a requester's own response timeout is seconds (rdma_cm: 4096 ms).
inline constexpr uint32_t kDefaultListenWaitMs = 1000;

struct DaemonOptions {
  uint16_t udp_port = wire::kRoceV2UdpPort;
  unsigned slot_count = kDefaultSlots;
  bool allow_ipv6 = true;
  // Exit after this long without clients; 0 = never.
  uint32_t idle_timeout_ms = 30000;
  // Serve every user of the namespace (a system daemon), not only the daemon's own euid.
  bool system = false;
  // Connections at once: in all, per user (a system daemon), per process. Each process of urdma
  // uses up to three (its slot, its MAD channel, its GID watcher) and `urdma status` one more.
  unsigned max_clients = 1024;
  unsigned max_clients_per_user = 256;
  unsigned max_clients_per_process = 16;
  // Slots one user may hold at once (a system daemon; 0: no cap beyond the table).
  unsigned max_slots_per_user = 0;
  // A connection that has not greeted (kHello) within this is closed.
  uint32_t hello_timeout_ms = 2000;
  // Log to stderr.
  bool verbose = false;
  // After a restart, how long new leases wait for the survivors to reattach (protocol.h).
  uint32_t takeover_grace_ms = 500;
  // How long a REQ / SIDR_REQ for a service ID nobody holds waits for a listener before the
  // daemon refuses it (ListenWaits, cm_agent.h); 0: refused at once, as Linux does.
  uint32_t listen_wait_ms = kDefaultListenWaitMs;
  // The socket clients connect to (for logs).
  std::string socket_path;
  // Where the device view's GID files are kept (device_view.h); empty: none.
  std::string view_dir;
};

// What the keeper hands the daemon it starts (supervisor.h).
struct DaemonHandoff {
  UniqueFd listener;  // listening, non-blocking
  SlotGroup group;    // opened and proved
  UniqueFd keeper;    // the control socket to the keeper: kKeeperReady, kKeeperIdle
  pid_t keeper_pid = 0;
  uint32_t restarts = 0;  // 0: the keeper's first daemon; else survivors may be waiting
};
// The one-byte records the daemon sends its keeper.
inline constexpr char kKeeperReady = 'R';  // serving
inline constexpr char kKeeperIdle = 'I';   // exiting idle: the keeper exits too

struct DaemonCounters {
  uint64_t clients_accepted = 0;
  uint64_t clients_refused = 0;  // another uid or namespace, too many, no hello in time
  uint64_t slots_leased = 0;
  uint64_t slots_reclaimed = 0;
  uint64_t drained_datagrams = 0;  // read from free slots
  uint64_t mads_forwarded = 0;
  std::array<uint64_t, kMadDropCount> mads_dropped{};
  // What the daemon answered on QP1 itself (cm_agent.h).
  uint64_t cm_rejects_sent = 0;   // REJ / SIDR_REP to a service nobody listens on
  uint64_t cm_dreqs_sent = 0;     // for the connections of processes that died
  uint64_t cm_dreps_sent = 0;     // to DREQs for connections nobody holds
  uint64_t cm_dreq_retries = 0;   // DREQs of cm_dreqs_sent sent again (no DREP yet)
  uint64_t cm_dreqs_dropped = 0;  // beyond Releases::kMax: never sent
  // Requests for a service ID nobody held (ListenWaits).
  uint64_t cm_requests_waited = 0;    // waited for a listener
  uint64_t cm_requests_served = 0;    // of those, delivered to the listener that came (the others:
                                      // refused when the wait ended, in cm_rejects_sent)
  uint64_t cm_requests_unwaited = 0;  // refused at once: ListenWaits' caps were reached
  uint64_t cm_mras_sent = 0;          // to the retransmission of a waiting REQ
};

class Daemon {
 public:
  // Sets up everything around what the keeper handed over. On failure returns null with an
  // errno in *err and a sentence in *error.
  static std::unique_ptr<Daemon> create(const DaemonOptions& options, DaemonHandoff handoff,
                                        int* err, std::string* error);
  ~Daemon();

  // Runs until a signal, the idle timeout or a fatal error. Returns the process exit code.
  int run();
  // One round of the loop: waits up to timeout_ms (-1: no bound) and handles what came. False
  // on a fatal error. For tests and fuzzers that drive a daemon in their own process.
  bool step(int timeout_ms);
  // Stopped: a signal, the idle timeout or a fatal error (run() returns).
  bool stopped() const { return stop_; }

  uint16_t udp_port() const { return group_.port; }
  const DaemonCounters& counters() const { return counters_; }

 private:
  struct Client {
    UniqueFd fd;
    uid_t uid = 0;
    pid_t pid = 0;
    bool greeted = false;  // its kHello was accepted; nothing else is answered before
    int64_t hello_deadline_ms = 0;
    std::optional<unsigned> slot;
    bool watches_gids = false;
    std::optional<unsigned> channel_slot;  // a MAD channel for this slot
    MadBacklog backlog;                    // MADs for the channel that did not fit yet
    bool watching_out = false;             // EPOLLOUT asked for: the backlog is not empty
    std::string comm;                      // /proc/<pid>/comm at accept
    int64_t connected_ms = 0;
    uint32_t qpn_base = 0, qpn_count = 0;  // the slot's range
    bool reattached = false;               // the slot came back through kReattach
    std::optional<CounterReport> report;   // the latest kReportCounters
    int64_t report_ms = 0;
    UniqueFd capture_sink;        // a capturer's socket (kCapture): pushed to matching holders
    uint32_t capture_filter = 0;  // CaptureBody::filter
    UniqueFd doorbell;            // the slot's eventfd once it sent kShmAccept; goes with the lease
  };
  // A shared-memory region of two slots (kShmConnect), kept while both leases live.
  struct ShmRegion {
    UniqueFd memfd;
    unsigned first_slot = 0;  // the slot that asked: side 0
  };

  Daemon(const DaemonOptions& options, DaemonHandoff handoff);
  bool setup(int* err, std::string* error);
  // kHello: the client's namespace (the fd it passed) must be ours.
  int hello_request(Client& c, std::vector<UniqueFd>& fds);
  // Closes connections that did not greet in time; arms the timer for the next deadline.
  void hello_timer_fired();
  void arm_hello_timer();
  // Why a new connection of `cred` is refused (an errno), or 0.
  int refusal(uid_t uid, pid_t pid) const;
  int conn_request(Client& c, MsgType type, std::span<const uint8_t> rec);
  // kCapture: the connection becomes a capturer; *processes: the holders that got its socket.
  int capture_request(Client& c, std::span<const uint8_t> rec, std::vector<UniqueFd>& fds,
                      uint32_t* processes);
  // Whether `capturer` may capture `holder`'s slot and asked for it.
  static bool captures(const Client& capturer, const Client& holder);
  // Whether `capturer` captures the host's own QP1 datagrams (gsi_io_'s tap): asked for every
  // slot, slot 0 or this daemon's pid, by root or by the user this daemon runs as — what the
  // host sends and what arrives for nobody are nobody else's traffic.
  static bool captures_host(const Client& capturer);
  // Pushes every matching capturer's socket to a holder that just leased or reattached a slot.
  void push_captures_to(Client& holder);
  // A MAD delivered to `slot`'s process, recorded for the captures of that process that do not
  // capture the host (those have it from gsi_io_'s tap already): the MADs a process receives
  // come through here, not through its engine's socket.
  void capture_received(unsigned slot, std::span<const uint8_t> datagram,
                        const net::Endpoint& src, const net::Endpoint& dst);
  // kShmAccept: the slot's doorbell, made and kept; *doorbell: the fd to pass.
  int shm_accept_request(Client& c, int* doorbell);
  // kShmConnect: the region to the slot the QPN names (made, and pushed to its holder, the first
  // time); *reply and *pass_fds: the kShmReady and its fds.
  int shm_connect_request(Client& c, std::span<const uint8_t> rec, std::vector<uint8_t>* reply,
                          std::vector<int>* pass_fds);
  // A lease ended: kShmOff to the holder of every slot that shared a region with it.
  void end_shm_regions(const Client& c);
  // The connection holding `slot`, or null.
  Client* holder_of(unsigned slot);
  // kMcastAttach / kMcastDetach (mcast_members.h); leave_groups: every group of a reclaimed slot.
  int mcast_request(Client& c, MsgType type, std::span<const uint8_t> rec);
  void leave_groups(unsigned slot);
  // The interfaces an IPv4 (or IPv6) group is joined on: those with a GID of that family,
  // loopback only when nothing else has one.
  std::vector<uint32_t> mcast_interfaces(bool v4) const;
  bool watch(int fd, uint64_t tag, uint32_t events);
  void unwatch(int fd);
  void accept_clients();
  void serve(uint64_t id);
  // Delivers a routed MAD on its process's channel, now or from the backlog; false if dropped.
  bool deliver_mad(uint64_t id, Client& c, std::vector<uint8_t> record);
  // The channel has room again (EPOLLOUT): the backlog goes out.
  void flush_backlog(uint64_t id);
  // Asks for EPOLLOUT on a client's socket exactly while its backlog is not empty.
  void watch_backlog(uint64_t id, Client& c);
  void drop_client(uint64_t id);
  void handle_request(uint64_t id, Client& c, std::span<const uint8_t> rec,
                      std::vector<UniqueFd>& fds);
  // Leases a slot to `c`: the kSlot reply and the fds to pass, or an errno. EAGAIN: the lease
  // must wait for the takeover (the request is queued).
  int lease(Client& c, std::vector<uint8_t>* reply, std::vector<int>* pass_fds);
  void answer_pending();
  int reattach_request(Client& c, std::span<const uint8_t> rec, std::vector<UniqueFd>& fds);
  std::vector<uint8_t> clients_page(const Client& viewer, std::span<const uint8_t> rec,
                                    int* err) const;
  // Slot 0 routed; free slots drained (after a restart, once the grace period is over).
  bool start_group(std::string* error);
  void takeover_timer_fired();
  void tell_keeper(char what);
  void arm_takeover_timer(uint32_t ms);
  void drain(unsigned slot);
  void publish_gids();
  void route_mads();
  // A DREP for one of releases_' DREQs: taken (true), not routed.
  bool take_release_drep(std::span<const uint8_t> datagram, const net::RxDatagram& rx);
  // Forwards a datagram to `slot`'s process on its MAD channel: kNone, or why not.
  MadDrop forward(unsigned slot, std::span<const uint8_t> datagram, const net::Endpoint& src,
                  const net::Endpoint& dst);
  // A REQ / SIDR_REQ nobody holds the service ID of: waits for a listener (true), or not.
  bool wait_for_listener(const MadRoute& route, std::span<const uint8_t> datagram,
                         const net::RxDatagram& rx);
  // `slot` now holds `service_id`: the requests that waited for it go to its process.
  void serve_waiting(uint64_t service_id, unsigned slot);
  // Refuses the requests whose wait ended; arms the timer for the next.
  void listen_wait_timer_fired();
  void arm_listen_wait_timer();
  // A MAD dropped for `drop` that the host's CM answers (REJ, SIDR_REP, DREP).
  void answer_for_host(MadDrop drop, std::span<const uint8_t> datagram, const net::Endpoint& src,
                       const net::Endpoint& dst);
  // Answers on slot 0 for the host: `mad` to `to` (QP1), from `from`.
  void send_gmp(const CmMad& mad, const net::Address& from, const net::Address& to);
  // The dead process of `slot`: a DREQ to each peer of its established connections.
  void release_connections(unsigned slot);
  void send_dreq(const Releases::Dreq& d);
  // Repeats the DREQs whose DREP is late; arms the timer for the next.
  void release_timer_fired();
  void arm_release_timer();
  int listen_request(Client& c, MsgType type, std::span<const uint8_t> rec);
  int channel_request(uint64_t id, Client& c, std::span<const uint8_t> rec);
  void reset_socket(int fd) const;
  void update_idle_timer();
  // The MADs dropped, by reason (mad_router.h), at exit: what `urdma status` sums.
  void log_mad_drops() const;
  void log(const std::string& line) const;

  DaemonOptions options_;
  uid_t uid_;
  uint64_t netns_;  // the namespace it serves (paths.h)
  UniqueFd listener_;
  UniqueFd keeper_;
  pid_t keeper_pid_ = 0;
  uint32_t restarts_ = 0;
  UniqueFd epoll_;
  UniqueFd signal_fd_;
  UniqueFd timer_fd_;
  UniqueFd takeover_timer_fd_;
  UniqueFd release_timer_fd_;      // DREQ pacing and retransmission (releases_)
  UniqueFd listen_wait_timer_fd_;  // the end of a request's wait (listen_waits_)
  UniqueFd hello_timer_fd_;
  AddressMonitor addresses_;
  GidTable gids_;
  GidView view_;  // the GID files of the device view, equal to gids_
  SlotGroup group_;
  SlotTable slots_;
  std::map<uint64_t, Client> clients_;
  // Slot holders that left with a counter report (ClientRole::kDeparted), oldest first.
  struct Departed {
    pid_t pid = 0;
    uid_t uid = 0;
    std::string comm;
    unsigned slot = 0;
    CounterReport report{};
    int64_t report_ms = 0;
    int64_t left_ms = 0;
  };
  static constexpr size_t kDepartedKept = 64;
  std::deque<Departed> departed_;
  // Slot 0 through the engine's own UDP I/O (batches, IP_PKTINFO for the destination address),
  // under a capture tap: every QP1 datagram this daemon reads or sends is recorded for the
  // captures of the host (captures_host).
  std::unique_ptr<net::CaptureTap> gsi_io_;
  std::map<uint64_t, unsigned> listeners_;  // service ID -> slot
  std::map<unsigned, uint64_t> channels_;   // slot -> the client id of its MAD channel
  McastMembers mcast_;                      // each slot's multicast groups
  // The regions, by their two slots (the lower first), and how many may be open at once: what
  // fds the clients leave (setup), at most one per pair of slots.
  std::map<std::pair<unsigned, unsigned>, ShmRegion> shm_regions_;
  size_t shm_regions_max_ = 0;
  ConnTable conns_;                         // each slot's connections, as its process reports
  RequesterTable requesters_;               // where a REJ with RemoteCommID 0 goes
  Releases releases_;                       // DREQs of dead processes awaiting their DREP
  ListenWaits listen_waits_;                // requests waiting for a listener
  std::optional<gsi::Sender> gmp_sender_;  // on gsi_io_, once it is open
  uint64_t next_dreq_tid_ = 1;
  uint64_t next_client_id_ = 1;
  int64_t start_ms_ = 0;
  uint32_t takeover_ = kTakeoverNone;
  uint32_t survivors_ = 0;
  std::vector<uint64_t> pending_;  // clients whose kAcquireSlot waits for the takeover
  DaemonCounters counters_;
  bool stop_ = false;
  int exit_code_ = 0;
};

// The UDP port: $URDMA_UDP_PORT, else 4791.
uint16_t udp_port_from_env();

}  // namespace urdma::daemon
