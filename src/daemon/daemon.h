// urdmad: the host agent of one network namespace (see docs/ARCHITECTURE.md, "urdmad").
//
// One thread, one epoll loop over: the abstract unix listener and its client connections, the
// rtnetlink address socket (GID table), a signalfd (SIGTERM/SIGINT/SIGHUP: clean exit), a
// timerfd (idle exit), slot 0 (CM MADs, routed to their process: mad_router.h) and the free slot
// sockets (drained: their datagrams name QPNs nobody owns). Nothing polls; an idle daemon sleeps
// in epoll_wait.
//
// Start-up order matters: the unix socket is bound first, so a second daemon in the namespace
// fails there (EADDRINUSE) before it could join the first one's SO_REUSEPORT group and shift
// its socket indices. At exit the UDP sockets close before the unix listener.
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
#include "daemon/gid_table.h"
#include "daemon/mad_backlog.h"
#include "daemon/mad_router.h"
#include "daemon/protocol.h"
#include "daemon/slot_table.h"
#include "daemon/steering.h"
#include "daemon/unique_fd.h"
#include "net/udp_socket_io.h"

namespace urdma::daemon {

struct DaemonOptions {
  std::string socket_name = kDefaultSocketName;
  uint16_t udp_port = wire::kRoceV2UdpPort;
  unsigned slot_count = kDefaultSlots;
  bool allow_ipv6 = true;
  // Exit after this long without clients; 0 = never.
  uint32_t idle_timeout_ms = 30000;
  // Most client connections at once (each may lease one slot).
  unsigned max_clients = 1024;
  // Log to stderr.
  bool verbose = false;
  // Takeover (protocol.h): how long a daemon that finds the port held waits for the first
  // surviving process to hand its group over before acquiring fails with EADDRNOTAVAIL, and
  // how long after that first reattach new leases wait for the other survivors.
  uint32_t takeover_wait_ms = 3000;
  uint32_t takeover_grace_ms = 500;
};

struct DaemonCounters {
  uint64_t clients_accepted = 0;
  uint64_t clients_refused = 0;  // another uid, or too many
  uint64_t slots_leased = 0;
  uint64_t slots_reclaimed = 0;
  uint64_t drained_datagrams = 0;  // read from free slots
  uint64_t mads_forwarded = 0;
  std::array<uint64_t, kMadDropCount> mads_dropped{};
  // What the daemon answered on QP1 itself (cm_agent.h).
  uint64_t cm_rejects_sent = 0;  // REJ / SIDR_REP to a service nobody listens on
  uint64_t cm_dreqs_sent = 0;    // for the connections of processes that died
  uint64_t cm_dreps_sent = 0;    // to DREQs for connections nobody holds
  uint64_t cm_dreq_retries = 0;  // DREQs of cm_dreqs_sent sent again (no DREP yet)
};

class Daemon {
 public:
  // Binds everything. On failure returns null with an errno in *err (EADDRINUSE: another
  // daemon owns the namespace's socket) and a sentence in *error.
  static std::unique_ptr<Daemon> create(const DaemonOptions& options, int* err, std::string* error);
  ~Daemon();

  // Runs until a signal, the idle timeout or a fatal error. Returns the process exit code.
  int run();

  uint16_t udp_port() const { return group_.port; }
  const DaemonCounters& counters() const { return counters_; }

 private:
  struct Client {
    UniqueFd fd;
    uid_t uid = 0;
    pid_t pid = 0;
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
  };

  explicit Daemon(const DaemonOptions& options);
  bool setup(int* err, std::string* error);
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
  std::vector<uint8_t> clients_page(std::span<const uint8_t> rec, int* err) const;
  // The group is ours: slot 0 routed, free slots drained.
  bool start_group(std::string* error);
  void takeover_timer_fired();
  void arm_takeover_timer(uint32_t ms);
  void drain(unsigned slot);
  void publish_gids();
  void route_mads();
  // A DREP for one of releases_' DREQs: taken (true), not routed.
  bool take_release_drep(std::span<const uint8_t> datagram, const net::RxDatagram& rx);
  // A MAD dropped for `drop` that the host's CM answers (REJ, SIDR_REP, DREP).
  void answer_for_host(MadDrop drop, std::span<const uint8_t> datagram, const net::RxDatagram& rx);
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
  // Declared first, destroyed last: the namespace stays claimed until the UDP group is gone.
  UniqueFd listener_;
  UniqueFd epoll_;
  UniqueFd signal_fd_;
  UniqueFd timer_fd_;
  UniqueFd takeover_timer_fd_;
  UniqueFd release_timer_fd_;  // DREQ retransmission (releases_)
  AddressMonitor addresses_;
  GidTable gids_;
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
  // Slot 0 through the engine's own UDP I/O (batches, IP_PKTINFO for the destination address).
  std::unique_ptr<net::UdpSocketIo> gsi_io_;
  std::map<uint64_t, unsigned> listeners_;  // service ID -> slot
  std::map<unsigned, uint64_t> channels_;   // slot -> the client id of its MAD channel
  ConnTable conns_;                         // each slot's established connections
  RequesterTable requesters_;               // where a REJ with RemoteCommID 0 goes
  Releases releases_;                       // DREQs of dead processes awaiting their DREP
  uint32_t gmp_psn_ = 0;
  uint64_t next_dreq_tid_ = 1;
  uint64_t next_client_id_ = 1;
  int64_t start_ms_ = 0;
  uint32_t takeover_ = kTakeoverNone;
  bool takeover_expired_ = false;  // waited takeover_wait_ms for a survivor, none came
  uint32_t survivors_ = 0;
  std::vector<uint64_t> pending_;  // clients whose kAcquireSlot waits for the takeover
  DaemonCounters counters_;
  bool stop_ = false;
  int exit_code_ = 0;
};

// The socket name clients and the daemon use: $URDMA_SOCKET, else kDefaultSocketName.
std::string socket_name_from_env();
// The UDP port: $URDMA_UDP_PORT, else 4791.
uint16_t udp_port_from_env();

}  // namespace urdma::daemon
