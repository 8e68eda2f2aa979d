// librdmacm.so.1 over urdma: rdma_cm's API on cm::Manager, with CM MADs over the process's
// urdmad slot.
//
// THE PROCESS: one `Cma` (below), made at the first call that needs the device. It opens urdma0
// through OUR libibverbs (so the application's own ibv_open_device and ours view the same
// runtime: one slot, one QPN range, one key space), and from that runtime's urdmad connection
// (runtime::Runtime::daemon_client) takes the slot number and a dup of the slot's UDP socket.
//  * Receiving: a second urdmad connection is the slot's MAD channel (daemon::Client::
//    open_mad_channel): REQ/SIDR_REQ for our listened service IDs and every MAD whose
//    communication ID carries our slot arrive there as GMPs, which gsi::check_gmp checks.
//  * Sending: gsi::Sender on a UdpSocketIo of its own over a dup of the slot socket (in a
//    net::CaptureTap, which the runtime gives `urdma capture`'s sockets), from any thread
//    holding the lock. One UDP datagram per sendmsg is atomic in the kernel, so it needs
//    nothing from the engine thread (which owns its PacketIo and sends on the same socket); the
//    source address is the one the kernel routes from toward the peer.
//  * The CM thread: polls the MAD channel and a wake-up eventfd, with the Manager's next timer
//    as timeout; feeds MADs and time to the Manager, applies QP attributes, queues events.
// Everything the Manager and the ids hold is under one mutex (`Cma::mu`).
//
// EVENT CHANNELS: an eventfd in semaphore mode counts the queued events; rdma_get_cm_event
// reads it (blocking unless the application made the fd non-blocking: EAGAIN) then pops one.
// Synchronous mode (a NULL channel): the id gets a channel of its own and resolve_addr,
// resolve_route, connect and accept wait for their event on it (rdma-core's ucma_complete).
//
// Port spaces: RDMA_PS_TCP and RDMA_PS_IB are RC connections (REQ/REP/RTU), RDMA_PS_UDP and
// RDMA_PS_IPOIB UD QPs found by SIDR; the UD port spaces join multicast groups
// (api_multicast.cc). Not built, with rdma-core's error for an unsupported operation: ECE
// (EOPNOTSUPP), rdma_create_qp_ex beyond a PD (ENOSYS), rsockets (every r* call: -1, errno
// ENOSYS). rdma_set_option: TOS and ACK_TIMEOUT take effect, REUSEADDR and AFONLY are accepted
// without effect; other options are ENOSYS.
//
// FILES: this header is what they share (the process object, ids, channels, events, helpers);
// process.cc and cm_thread.cc are the process object and its CM thread, api_*.cc the exported
// calls, inert.cc the exports not built.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "base/secure_random.h"
#include "cm/manager.h"
#include "daemon/client.h"
#include "gsi/gmp.h"
#include "net/clock.h"
#include "net/udp_socket_io.h"
#include "wire/cm.h"
#include "wire/rdma_cm_ip.h"

// Every call of librdmacm.so.1's ABI (librdmacm.map); the rest of the library is hidden.
#define URDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace urdma::rdmacm {

using urdma::cm::ConnId;

using urdma::cm::Gid;

inline int fail(int err) {
  errno = err;
  return -1;
}

struct Channel {
  rdma_event_channel ch;  // first: the application's pointer
  std::deque<rdma_cm_event*> queue;
};

enum class IdState {
  kIdle,
  kBound,
  kAddrResolved,
  kRouteResolved,
  kListening,
  kConnecting,
  kRequest,
  kConnected,
  kDisconnected
};

// One multicast group an id joined (rdma_join_multicast[_ex]).
struct McJoin {
  Gid group{};              // the group's address as a GID: its multicast GID on RoCEv2
  sockaddr_storage addr{};  // as the application named it (rdma_leave_multicast finds it)
  void* context = nullptr;  // the join's context: the event's param.ud.private_data
  uint32_t join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  ibv_qp* attached = nullptr;  // the id's QP, attached to the group (not for send-only joins)
};

struct Id {
  rdma_cm_id id;  // first
  Channel* chan = nullptr;
  IdState state = IdState::kIdle;
  bool has_conn = false;
  ConnId conn = 0;
  bool reported_up = false;  // urdmad knows the connection (report_up_locked)
  uint64_t listen_sid = 0;
  bool listening = false;
  bool claimed = false;  // listen_sid is registered with urdmad (rdma_bind_addr or rdma_listen)
  Gid sgid{};
  Gid dgid{};
  uint8_t sgid_index = 0;
  uint16_t local_port = 0;  // host order
  bool owns_port = false;   // local_port is in ports_in_use for this id (not a request's child)
  int pending_events = 0;
  // Synchronous mode (created with a NULL channel): a channel of its own, waited on by the calls.
  bool sync = false;
  // rdma_create_ep on a passive endpoint: the QP every rdma_get_request creates.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  bool own_cqs = false;    // rdma_create_qp made the CQs and their channels
  ibv_sa_path_rec path{};  // id.route.path_rec once the route is resolved (or the REQ arrived)
  // rdma_set_option: the route's traffic class (taken at rdma_resolve_route, as Linux's
  // cma_resolve_iboe_route takes id_priv->tos) and the QP's local ACK timeout, which replaces
  // the path's in every RTS attribute set (Linux rdma_init_qp_attr, cma_modify_qp_rts).
  uint8_t tos = 0;
  bool ack_timeout_set = false;
  uint8_t ack_timeout = 0;
  std::vector<McJoin> mc;  // multicast groups joined, at most kMaxMcJoinsPerId
  static Id* from(rdma_cm_id* x) { return reinterpret_cast<Id*>(x); }
};

// RDMA_OPTION_ID_ACK_TIMEOUT replaces the timeout the path gave an RTS attribute set.
inline void apply_ack_timeout(const Id& x, ibv_qp_attr* attr, int mask) {
  if (x.ack_timeout_set && (mask & IBV_QP_TIMEOUT)) attr->timeout = x.ack_timeout;
}

// An event with the storage its private data points into.
struct Event {
  rdma_cm_event ev;  // first
  std::vector<uint8_t> private_data;
  Id* owner = nullptr;
};

// Multicast groups one id may join (Linux bounds them only by memory; the device's
// max_mcast_grp bounds the process).
constexpr size_t kMaxMcJoinsPerId = 1024;
// Under mu: the id's QP leaves every group the id attached it to (rdma_leave_multicast for all,
// at rdma_destroy_id and rdma_destroy_qp); the joins themselves stay with the id.
void detach_mc_locked(Id* x);

// rdma_cma.h RDMA_UDP_QKEY: the Q_Key of every RDMA_PS_UDP QP.
constexpr uint32_t kUdpQkey = 0x01234567;

inline bool is_ud_ps(rdma_port_space ps) {
  return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB;
}

class Cma {
 public:
  std::mutex mu;
  std::condition_variable acked;  // an event was acked (rdma_destroy_id waits for its own)
  ibv_context* verbs = nullptr;
  ibv_pd* default_pd = nullptr;
  int open_errno = 0;
  bool opened = false;

  int open_locked();
  // Under mu: the device's PD, made on first use, which every id with a device names as its
  // pd (rdma-core's ucma_get_device): rdma_create_qp and rdma_create_srq default to it, and
  // applications build their own QPs and AHs on id->pd.
  ibv_pd* device_pd() {
    if (!default_pd && verbs) default_pd = ibv_alloc_pd(verbs);
    return default_pd;
  }
  void wake();
  uint32_t random_psn() { return static_cast<uint32_t>(rng_()) & 0xFFFFFF; }
  uint16_t ephemeral_port();
  int find_gid_index(const Gid& g, uint8_t* index);
  void set_route_path(Id* x, uint32_t flow_label);

  // Under mu: after any Manager call, apply what it produced.
  void pump_locked();
  // Under mu: the id's connection and listen are forgotten, and the peer hears what it must.
  void release_locked(Id* x);
  // urdmad releases (DREQ) the connections a process established if it dies, and learns them
  // from the process only (daemon/cm_agent.h): up when established, down when it ends.
  void report_up_locked(Id* id);
  void report_down_locked(Id* id);
  // Under mu: the service ID of a bound id is registered with urdmad and claimed in the
  // Manager, so a REQ that comes before rdma_listen waits for it, a bounded time
  // (cm::Manager::claim; Linux answers it REJ 8; qperf 0.4.11 sends its port to the client
  // before calling rdma_listen, and about one first connection in ten lost that race).
  int claim_locked(Id* x, uint64_t sid);
  // Under mu: a bound id that will not listen gives its service ID back; what waited for it is
  // answered as Linux answers it (REJ 8, SIDR_REP status 1).
  void unclaim_locked(Id* x);
  // What the kernel does when an rdma_cm fd closes (ucma_close destroys every id of the file):
  // for the ids of one channel, or of the whole process at exit.
  void release_channel_locked(Channel* ch);
  void release_all();
  void queue_event(Id* id, rdma_cm_event_type type, int status,
                   const urdma::cm::Event* src = nullptr, Id* listen = nullptr);
  // Under mu: moves the id's QP (if it has one) as the Manager says, from the id's source GID
  // and with its ACK timeout option; ibv_modify_qp's result.
  int apply_qp_locked(Id* id, const urdma::cm::QpAttrs& q);

  std::unique_ptr<urdma::cm::Manager> manager;
  std::map<ConnId, Id*> by_conn;
  std::map<uint64_t, Id*> listeners;  // service ID -> listening id
  std::set<Id*> live;
  std::set<uint16_t> ports_in_use;
  urdma::daemon::Client* slot_client = nullptr;

 private:
  void loop();
  bool reopen_mad_channel();
  void receive_locked(const urdma::daemon::MadDelivery& info, const std::vector<uint8_t>& dgram);
  void send_mad_locked(const urdma::cm::OutgoingMad& m);
  void to_error_locked(Id* id);

  urdma::net::MonotonicClock clock_;
  // PSNs, the comm ID and TID bases and ports: what a peer could guess comes from getrandom(2).
  urdma::base::SecureRandom rng_;
  urdma::daemon::Client mad_channel_;  // the CM thread's alone once it runs
  unsigned slot_ = 0;
  // The CM's GMPs, under mu: the slot socket's through an I/O of their own, tapped for `urdma
  // capture` (the runtime hands it the capture sockets; urdmad records the MADs it delivers).
  std::unique_ptr<urdma::net::PacketIo> gmp_io_;
  std::optional<urdma::gsi::Sender> gmp_sender_;
  int wake_fd_ = -1;
  std::thread thread_;
  pid_t opener_pid_ = 0;  // a forked child's exit closes only its copy of the fd: nothing to do
};

// The preamble of every call on an id: Cma::mu, held until the call returns, and the id's Id
// when it is live and — if the call names any — in one of `states`; null otherwise, which the
// call answers with EINVAL. `auto [c, lock, x] = lock_id(id, {IdState::kBound});`
struct LockedId {
  Cma& c;
  std::unique_lock<std::mutex> lock;
  Id* x;
};
LockedId lock_id(rdma_cm_id* id, std::initializer_list<IdState> states = {});

// The process's one Cma, made at the first call that needs it (a forked child makes its own).
Cma& cma();
// Whole-library entry: the device and the CM thread; 0 or an errno.
int ensure_open(Cma& c);
// The Id behind `x` while it is live (not destroyed), under mu; null otherwise.
Id* live_id(Cma& c, rdma_cm_id* x);

// Addresses: GIDs are IPv6 or IPv4-mapped addresses; ports in host order.
// The wildcard (0.0.0.0, ::) or a loopback address (127/8, ::1), as GIDs (IPv4-mapped for
// IPv4): Linux cma.c's cma_any_addr.
bool is_any_or_loopback(const Gid& g);
Gid gid_of(const sockaddr* sa);
bool gid_is_v4(const Gid& g);
void set_sockaddr(sockaddr_storage* out, const Gid& g, uint16_t port_host);
uint16_t port_of(const sockaddr* sa);
size_t sockaddr_size(const sockaddr* sa);
urdma::wire::RdmaPortSpace port_space(rdma_port_space ps);

// One count from a channel's eventfd, or false when none is left, without blocking.
bool take_count_nowait(int fd);

// The rdma_cm IP header an active side puts at the start of its REQ / SIDR_REQ private data.
urdma::wire::CmaAddress cma_address(const Id& x);
// The flow label of an active side's route.
uint32_t active_flow_label(const Id& x);

// Synchronous mode (api_events.cc): the outcome of a call is the next event on the id's own
// channel; the request event rdma_get_request left on the id is acked by the id's next call.
int sync_wait(rdma_cm_id* id, rdma_cm_event_type want);
bool is_sync(rdma_cm_id* id);
void ack_request_event(rdma_cm_id* id);

}  // namespace urdma::rdmacm
