// The urdmad protocol: fixed-layout request/response records over a SOCK_SEQPACKET unix socket
// in a trusted directory (paths.h: one socket per network namespace, so each namespace is a host
// with its own daemon).
//
// Every record starts with a MsgHeader {magic, version, type, size, status}; `size` is the whole
// record and must equal what one recv returned (SEQPACKET keeps record boundaries). Both ends
// run on the same host, so fields are host-endian. Before anything else each side checks the
// other by the kernel's word (SO_PEERCRED): a client believes only a daemon of its own euid or
// root, a per-user daemon serves only its own euid, a system daemon serves every user and keeps
// them apart. A record carries at most one fd (SCM_RIGHTS), but the daemon's kShmReady and
// kShmOn carry two; any other record with more is refused, its fds closed unread, and the daemon
// closes the connection. A request:
//   kHello (+ the client's /proc/self/ns/net) -> kHello{HelloInfo}, or kError: EXDEV (the daemon
//                    serves another network namespace), EACCES (another user's daemon), EMFILE
//                    (too many connections of this process, this user or in all). The first
//                    request of every connection, within the hello timeout; nothing else is
//                    answered before it.
//   kAcquireSlot  -> kSlot (+ SCM_RIGHTS: the slot's UDP socket) or kError
//   kQueryGids    -> kGids or kError
//   kQueryStatus  -> kStatus (counters and occupancy, for `urdmad --status`) or kError
//   kListen{service ID}    -> kOk, or EADDRINUSE (another process listens), EINVAL (no slot)
//   kUnlisten{service ID}  -> kOk, or ENOENT
//   kMadChannel{slot}      -> kOk, or EPERM (the slot is not this process's); from then on the
//                    connection carries only kMad pushes: every CM MAD routed to the slot
//                    (mad_router.h), the datagram with its source and destination endpoints
//   kWatchGids    -> kGids now, then an unsolicited kGids whenever the table changes (the
//                    connection does nothing else; a watcher that stops reading until its
//                    socket buffer is full is disconnected)
//   kQueryClients{first}  -> kClients: the daemon (uptime, namespace) and one page of the
//                    connections the caller may see from index `first` (`urdma status`): its
//                    own user's, or every user's for root
//   kReportCounters{...}  -> no reply when well-formed: the process's engine counters and QP
//                    count, pushed by the connection holding the slot (Client::keep); a
//                    malformed one gets kError EPROTO
//   kReattach{SlotInfo}   (+ SCM_RIGHTS: the slot's socket)
//                 -> kOk, or kError: a process hands its slot back to a restarted daemon
//                    (RESTART below), proving it holds the slot by the socket itself
//   kConnUp{ConnRecord}   -> kOk, or EINVAL (no slot; a comm ID that is not the slot's), ENOSPC
//                    (kMaxConnsPerSlot): a connection the process established, released with
//                    a DREQ from the daemon if the process dies (cm_agent.h)
//   kConnDown{local comm ID} -> kOk, or ENOENT
//   kMcastAttach{McastBody}  -> kOk, or EINVAL (no slot; a QPN that is not the slot's; not a
//                    multicast address), ENOSPC (kMaxMcastGroupsPerSlot groups or
//                    kMaxMcastAttachPerSlot attachments), ENOMEM (the kernel refused the group
//                    membership: net.ipv4.igmp_max_memberships), ENODEV (no interface to join
//                    on): a UD QP of the caller's slot attached to a multicast group. The daemon
//                    joins the group (IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP) on the slot's own
//                    socket, so the kernel delivers the group's datagrams to that socket only
//                    (mcast_members.h); the memberships go when the slot is reclaimed
//   kMcastDetach{McastBody}  -> kOk, or ENOENT (not attached)
//   kCapture{CaptureBody} (+ SCM_RIGHTS: one end of the capturer's SOCK_SEQPACKET socket pair)
//                 -> kCapturing{how many processes got it}, or kError: EINVAL (no fd, not a
//                    unix SEQPACKET socket whose peer is the caller itself — one end of a pair
//                    it made; a connection that holds a slot or is a channel),
//                    EALREADY (captures already): `urdma capture`. The daemon pushes the socket
//                    to every slot holder that matches the filter (a slot number, a pid, or
//                    kCaptureAll) and whose user the capturer may see (its own, or every user's
//                    for root), and to each such holder that leases a slot while the connection
//                    stays open; the connection does nothing else. The holders write a record
//                    of every datagram they send and receive to it (net/capture_tap.h) until
//                    writing fails — the capturer closed its end
//   kCaptureOn{CaptureOnBody} (+ SCM_RIGHTS: that socket): a push on the connection holding a
//                    slot, never a reply; Client takes it wherever it reads (a call's reply may
//                    come after one) and hands it to the runtime (Client::keep's CaptureSink)
//   kShmAccept    -> kShmAccepted (+ SCM_RIGHTS: the slot's DOORBELL, an eventfd), or kError:
//                    EINVAL (the connection holds no slot), EALREADY (accepted already on this
//                    lease): "my engine reads shared-memory rings" (net/shm_ring.h). The daemon
//                    makes the doorbell and keeps a copy for as long as the lease lives; it hands
//                    that copy to every slot that shares a region with this one, whose engine
//                    writes it to wake this process
//   kShmConnect{ShmConnectBody} -> kShmReady{ShmPairBody} (+ SCM_RIGHTS: the region's memfd,
//                    then the peer's doorbell), or kError: EINVAL (the connection holds no slot
//                    or has not sent kShmAccept; a QPN of its own range, of range 0, 0xFFFFFF or
//                    beyond 24 bits), EADDRNOTAVAIL (the address is not in the GID table: not
//                    one of this namespace), ENOENT (no lease holds that QPN's range now), EPERM
//                    (the holder is another user; checked before EOPNOTSUPP, so whether another
//                    user's process accepts is not told), EOPNOTSUPP (the holder has not sent
//                    kShmAccept), EMFILE, ENOMEM (no region: the daemon's fds or the kernel's
//                    memory), EAGAIN (the holder's connection is full: kShmOn could not go). The
//                    ring pair to the slot holding the QPN, which the caller reaches at the
//                    address. The daemon makes one REGION per pair of slots for as long as both
//                    leases live: a memfd of net::kShmRegionBytes, sealed against shrinking and
//                    growing (and against new seals) before anyone maps it, never mapped by the
//                    daemon. The slot that asked first is side 0; the peer gets the region by
//                    kShmOn before the caller's reply goes out. Asked again, from either side,
//                    it answers the same region with that side and pushes nothing
//   kShmOn{ShmPairBody} (+ SCM_RIGHTS: the region's memfd, then the asking slot's doorbell): a
//                    push on the connection holding the peer slot, side 1, never a reply; Client
//                    takes it wherever it reads and hands it to Client::keep's ShmSink
//   kShmOff{ShmOffBody}: a push, no fd, to the holder of every slot that shared a region with a
//                    lease that ended (its connection closed: the process exited or died): the
//                    daemon forgot the region; the doorbell went with the lease. What the
//                    processes mapped stays theirs: each unmaps when it sees kShmOff
// kError carries an errno in `status`: EBUSY (every slot is leased, or the user's share),
// EALREADY (this connection holds a slot already), EPROTONOSUPPORT (version), EPROTO (malformed).
// A slot belongs to its connection: when the connection closes (the process exited or died) the
// daemon drains the slot's socket and frees it.
// RESTART. The daemon runs as two processes (supervisor.h): a keeper that holds the namespace's
// lock, the listening socket and every socket of the slot group, and the daemon proper, its
// child. Only the keeper and the daemon ever hold the group: a client holds its own slot socket
// and nothing else. When the daemon dies, the keeper starts another; connections wait in the
// listening socket's backlog meanwhile. Each process's Client::keep thread sees its connection
// hang up, reconnects, checks the new daemon's credentials and hands its slot back (kReattach);
// new leases wait a grace period for the survivors, so nobody else is given a slot in use.
// Shared-memory regions live in the processes, not in the daemon: those made before a restart
// stay mapped and working, but the new daemon knows neither them nor any kShmAccept. It sends
// no kShmOff for them (a peer that dies is a vanished peer to the other's RC timers), and it
// makes new regions for a slot only after its process sends kShmAccept again (Client::keep does
// not: the new doorbell would be a second one for the engine to watch), with a new doorbell;
// until then a kShmConnect to it is EOPNOTSUPP and the pair goes over UDP. Two processes that
// both accept again get a new region even if they share one from before.
// Growth: a new request type or a longer record with a higher version; the daemon answers a
// version it does not know with EPROTONOSUPPORT and its own version in the header.
#pragma once

#include <sys/un.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "daemon/gid_table.h"
#include "daemon/steering.h"
#include "daemon/unique_fd.h"
#include "net/address.h"

namespace urdma::daemon {

inline constexpr uint32_t kProtocolMagic = 0x75724d44;  // "urMD"
inline constexpr uint16_t kProtocolVersion = 7;
// Room for the largest record (kGids with kMaxGids entries).
inline constexpr size_t kMaxMessageBytes = 32768;

enum class MsgType : uint16_t {
  kAcquireSlot = 1,
  kSlot = 2,
  kQueryGids = 3,
  kGids = 4,
  kError = 5,
  kQueryStatus = 6,
  kStatus = 7,
  kWatchGids = 8,
  kHello = 9,
  kOk = 10,
  kListen = 11,
  kUnlisten = 12,
  kMadChannel = 13,
  kMad = 14,
  kQueryClients = 15,
  kClients = 16,
  kReportCounters = 17,
  kReattach = 18,
  kConnUp = 19,
  kConnDown = 20,
  kMcastAttach = 21,
  kMcastDetach = 22,
  kCapture = 23,
  kCaptureOn = 24,
  kCapturing = 25,
  kShmAccept = 26,
  kShmAccepted = 27,
  kShmConnect = 28,
  kShmReady = 29,
  kShmOn = 30,
  kShmOff = 31,
};

// How a daemon serves (HelloInfo::mode, ClientsPage::mode).
inline constexpr uint16_t kModeUser = 1;    // one user's own daemon
inline constexpr uint16_t kModeSystem = 2;  // every user of the namespace

// The kHello reply's body.
struct HelloInfo {
  uint32_t pid;         // the daemon
  uint32_t keeper_pid;  // its keeper (supervisor.h)
  uint32_t uid;         // the daemon's euid
  uint16_t mode;        // kMode*
  uint16_t reserved;
  uint64_t netns_inode;  // the namespace it serves
};
static_assert(sizeof(HelloInfo) == 24);

// The body of kConnUp: one established CM connection of the caller's slot, as its peer names it.
struct ConnRecord {
  uint32_t local_comm_id;   // the process's (comm_id_for_slot of its slot)
  uint32_t remote_comm_id;  // the peer's
  uint32_t remote_qpn;      // the peer's QP
  uint32_t reserved;
  uint8_t local_address[16];  // IPv6 or IPv4-mapped, as net::Address
  uint8_t peer_address[16];
};
static_assert(sizeof(ConnRecord) == 48);
// The body of kConnDown.
struct CommIdBody {
  uint32_t local_comm_id;
  uint32_t reserved;
};

// The body of kMcastAttach / kMcastDetach: one QP of the caller's slot and a group.
struct McastBody {
  uint32_t qpn;
  uint32_t reserved;
  uint8_t group[16];  // IPv6 or IPv4-mapped, as net::Address
};
static_assert(sizeof(McastBody) == 24);

// The body of kCapture: which slot holders to capture.
inline constexpr uint32_t kCaptureAll = 0xFFFFFFFF;
struct CaptureBody {
  uint32_t filter;  // kCaptureAll, or a slot number or a pid: the holders that match either
  uint32_t reserved;
};
// The body of a kCaptureOn push: the slot it is for.
struct CaptureOnBody {
  uint32_t slot;
  uint32_t reserved;
};
// The body of the kCapturing reply.
struct CapturingBody {
  uint32_t processes;  // slot holders that got the socket now
  uint32_t reserved;
};

// The body of kShmConnect: the slot to share rings with, by a QPN of its range, and the address
// the caller reaches it at.
struct ShmConnectBody {
  uint8_t address[16];  // IPv6 or IPv4-mapped, as net::Address
  uint32_t qpn;
  uint32_t reserved;
};
static_assert(sizeof(ShmConnectBody) == 24);
// The body of kShmReady (to the slot that asked) and kShmOn (to its peer): the other slot.
struct ShmPairBody {
  uint32_t peer_range;  // its QPN range: QPNs [peer_range << kSlotShift, +kQpnsPerRange)
  uint32_t side;        // 0: this process writes ring 0 and reads ring 1 (net/shm_ring.h); or 1
  uint32_t peer_pid;
  uint32_t peer_slot;
};
static_assert(sizeof(ShmPairBody) == 16);
// The body of kShmOff: the slot whose lease ended, by its range.
struct ShmOffBody {
  uint32_t peer_range;
  uint32_t reserved;
};

// The body of kListen / kUnlisten and of kMadChannel.
struct ServiceIdBody {
  uint64_t service_id;
};
struct SlotBody {
  uint32_t slot;
  uint32_t reserved;
};

// A kMad push: this header, then the UDP payload (BTH through ICRC) exactly as received.
struct MadDelivery {
  uint8_t src_address[16];  // IPv6 or IPv4-mapped, as net::Address
  uint8_t dst_address[16];  // the local address it was sent to (IP_PKTINFO)
  uint16_t src_port;
  uint16_t dst_port;
  uint32_t length;
};
static_assert(sizeof(MadDelivery) == 40);
// The flow a delivered MAD came on, which its ICRC covers: its sender, and the local address and
// port it was sent to.
inline net::Endpoint mad_source(const MadDelivery& d) {
  return {net::Address(std::to_array(d.src_address)), d.src_port};
}
inline net::Endpoint mad_destination(const MadDelivery& d) {
  return {net::Address(std::to_array(d.dst_address)), d.dst_port};
}
inline constexpr size_t kMaxMadDatagramBytes = 1024;

struct MsgHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t type;   // MsgType
  uint32_t size;   // bytes of the whole record
  int32_t status;  // 0, or an errno in kError
};
static_assert(sizeof(MsgHeader) == 16);

// The kSlot record's body; the socket travels beside it.
struct SlotInfo {
  uint32_t slot;
  uint32_t slot_count;
  uint32_t qpn_base;  // the QPNs [qpn_base, qpn_base + qpn_count) steer to this slot
  uint32_t qpn_count;
  uint32_t generation;
  uint16_t udp_port;  // the port the group is bound to (4791 unless configured)
  uint16_t family;    // AF_INET6 (dual-stack) or AF_INET
};
static_assert(sizeof(SlotInfo) == 24);

// The kStatus record's body.
struct StatusInfo {
  uint32_t pid;
  uint32_t slot_count;
  uint32_t slots_leased;  // now
  uint32_t clients;       // connections now
  uint32_t max_clients;
  uint32_t gid_count;
  uint64_t clients_accepted;
  uint64_t clients_refused;
  uint64_t leases;  // ever
  uint64_t reclaims;
  uint64_t drained_datagrams;
  uint16_t udp_port;
  uint16_t family;
  uint32_t idle_timeout_ms;  // 0: no idle exit
  uint64_t mads_forwarded;
  uint64_t mads_dropped;  // by reason: `urdmad --verbose` logs them
  // Answered by the daemon itself (cm_agent.h).
  uint64_t cm_rejects_sent;
  uint64_t cm_dreqs_sent;
  uint64_t cm_dreps_sent;
  uint64_t cm_dreq_retries;
  // Requests for a service ID nobody held, waiting for a listener (cm_agent.h ListenWaits).
  // A daemon of the first layout sends none of these (decode_status: zero).
  uint64_t cm_requests_waited;
  uint64_t cm_requests_served;
  uint64_t cm_requests_unwaited;
  uint64_t cm_mras_sent;
};
static_assert(sizeof(StatusInfo) == 152);
inline constexpr size_t kStatusInfoFirstSize = 120;  // up to cm_dreq_retries

// ---- `urdma status`: the connections and what their processes report ----

// The engine counters a process reports, in this order; the names are rxe's (`rdma statistic`)
// where ours map onto them, then our own.
inline constexpr const char* kCounterNames[] = {
    "sent_pkts",           "rcvd_pkts",
    "duplicate_request",   "out_of_seq_request",
    "rcvd_rnr_err",        "send_rnr_err",
    "rcvd_seq_err",        "ack_deferred",
    "retry_exceeded_err",  "retry_rnr_exceeded_err",
    "completer_retry_err", "send_err",
    "link_downed",         "rdma_sends",
    "rdma_recvs",          "dropped_pkts",
    "uc_access_err",  // UC requests whose R_Key check failed (dropped: UC has no NAK)
};
inline constexpr size_t kCounterCount = std::size(kCounterNames);
// The first kRxeCounterCount names are rxe's.
inline constexpr size_t kRxeCounterCount = 15;

// The body of kReportCounters.
inline constexpr uint32_t kQpCountUnknown = 0xFFFFFFFF;
struct CounterReport {
  uint32_t qp_count;  // QPs the process has now, or kQpCountUnknown
  uint32_t reserved;
  uint64_t counters[kCounterCount];
  friend bool operator==(const CounterReport&, const CounterReport&) = default;
};
static_assert(sizeof(CounterReport) == 8 + 8 * kCounterCount);

// The body of kQueryClients.
struct ClientsQuery {
  uint32_t first;  // index of the first connection wanted
  uint32_t reserved;
};

// The kClients record: this, then `count` ClientEntry.
struct ClientsPage {
  uint64_t uptime_ms;
  uint64_t netns_inode;  // of /proc/self/ns/net: which namespace this daemon serves
  uint32_t total;        // connections now
  uint32_t first;
  uint32_t count;       // entries in this record, at most kClientsPerPage
  uint32_t takeover;    // kTakeover*: whether this daemon took over from one that died
  uint32_t survivors;   // processes that reattached their slot to this daemon
  uint32_t keeper_pid;  // the keeper holding the group (supervisor.h)
  uint32_t restarts;    // daemons the keeper started after the first
  uint16_t mode;        // kMode*
  uint16_t reserved16;
  uint32_t daemon_uid;
  uint32_t viewer_uid;  // whose connections this page lists (kAllUsers: everyone's)
  uint32_t reserved;
};
static_assert(sizeof(ClientsPage) == 64);
inline constexpr uint32_t kAllUsers = 0xFFFFFFFF;
inline constexpr uint32_t kTakeoverNone = 0;   // the keeper's first daemon
inline constexpr uint32_t kTakeoverGrace = 2;  // restarted; new leases wait for the survivors
inline constexpr uint32_t kTakeoverDone = 3;   // restarted and serving

enum class ClientRole : uint16_t {
  kConnection = 0,  // greeted, holds nothing
  kSlotHolder = 1,
  kGidWatcher = 2,
  kMadChannel = 3,
  // A slot holder that has left: its last counter report, kept (the newest 64) so that what a
  // finished process counted stays visible, as rxe's port counters outlive the processes that
  // moved them. connected_ms is then how long ago it left.
  kDeparted = 4,
};
inline constexpr uint32_t kNotASlot = 0xFFFFFFFF;
inline constexpr uint16_t kClientReattached = 1;  // its slot came back through kReattach
inline constexpr uint16_t kClientReported = 2;    // counters and qp_count are valid

struct ClientEntry {
  uint32_t pid;
  uint32_t uid;
  uint32_t slot;  // kNotASlot, or the slot this connection holds (or the MAD channel's slot)
  uint32_t qpn_base;
  uint32_t qpn_count;
  uint16_t role;           // ClientRole
  uint16_t flags;          // kClient*
  char comm[16];           // /proc/<pid>/comm, NUL-terminated
  uint64_t connected_ms;   // how long ago it connected
  uint64_t report_age_ms;  // how long ago its last kReportCounters came
  CounterReport report;
};
static_assert(sizeof(ClientEntry) == 56 + sizeof(CounterReport));
inline constexpr uint32_t kClientsPerPage = 32;

struct WireGid {
  uint8_t gid[16];
  uint32_t index;
  uint32_t ifindex;
  uint8_t family;
  uint8_t prefix_len;
  uint8_t scope;
  uint8_t reserved;
};
static_assert(sizeof(WireGid) == 28);

// What a urdmad started by the library reports on its --status-fd pipe, in one write
// (< PIPE_BUF): err 0 = serving; EADDRINUSE = another daemon serves the namespace (connect to
// it); else why it could not start.
struct SpawnStatus {
  int32_t stage;  // kSpawnExecFailed or kSpawnStarted
  int32_t err;
  char reason[248];  // NUL-terminated
};
inline constexpr int32_t kSpawnExecFailed = 1;
inline constexpr int32_t kSpawnStarted = 2;
static_assert(sizeof(SpawnStatus) == 256);

std::vector<uint8_t> encode_request(MsgType type);
std::vector<uint8_t> encode_error(int err);
std::vector<uint8_t> encode_slot(const SlotInfo& info);
std::vector<uint8_t> encode_gids(std::span<const GidEntry> gids);
std::vector<uint8_t> encode_status(const StatusInfo& info);
std::vector<uint8_t> encode_service_request(MsgType type, uint64_t service_id);
std::vector<uint8_t> encode_mad_channel(unsigned slot);
std::vector<uint8_t> encode_mad(const MadDelivery& info, std::span<const uint8_t> datagram);
std::vector<uint8_t> encode_clients_query(uint32_t first);
std::vector<uint8_t> encode_clients(const ClientsPage& page, std::span<const ClientEntry> entries);
std::vector<uint8_t> encode_counter_report(const CounterReport& report);
std::vector<uint8_t> encode_reattach(const SlotInfo& slot);
std::vector<uint8_t> encode_hello(const HelloInfo& info);
std::vector<uint8_t> encode_conn_up(const ConnRecord& conn);
std::vector<uint8_t> encode_conn_down(uint32_t local_comm_id);
std::vector<uint8_t> encode_mcast(MsgType type, uint32_t qpn, const net::Address& group);
std::vector<uint8_t> encode_capture(uint32_t filter);
std::vector<uint8_t> encode_capture_on(uint32_t slot);
std::vector<uint8_t> encode_capturing(uint32_t processes);
// kCapturing: 0 with *processes; kError: its errno; anything else EPROTO.
int decode_capturing(std::span<const uint8_t> record, uint32_t* processes);
// A kCaptureOn push: 0 with *slot, or EPROTO (another type, malformed).
int decode_capture_on(std::span<const uint8_t> record, uint32_t* slot);
std::vector<uint8_t> encode_shm_connect(const net::Address& address, uint32_t qpn);
// kShmReady (the reply) or kShmOn (the push).
std::vector<uint8_t> encode_shm_pair(MsgType type, const ShmPairBody& body);
std::vector<uint8_t> encode_shm_off(uint32_t peer_range);
// kShmAccepted: 0; kError: its errno; anything else EPROTO.
int decode_shm_accepted(std::span<const uint8_t> record);
// kShmReady: 0 with *body; kError: its errno; anything else, a side other than 0 or 1 or a
// range beyond the QPN space: EPROTO.
int decode_shm_ready(std::span<const uint8_t> record, ShmPairBody* body);
// The pushes: 0 with the body, or EPROTO (another type, malformed; kShmOn checked as kShmReady).
int decode_shm_on(std::span<const uint8_t> record, ShmPairBody* body);
int decode_shm_off(std::span<const uint8_t> record, uint32_t* peer_range);
// A request's fixed body (kListen, kUnlisten: ServiceIdBody; kMadChannel: SlotBody;
// kQueryClients: ClientsQuery; kReportCounters: CounterReport; kReattach: SlotInfo; kConnUp:
// ConnRecord; kConnDown: CommIdBody; kMcastAttach, kMcastDetach: McastBody; kCapture:
// CaptureBody; kShmConnect: ShmConnectBody): 0 or EPROTO.
template <class Body>
int decode_request_body(std::span<const uint8_t> record, Body* body);

// Validates a received record's header: 0, EPROTO (short, bad magic, size mismatch) or
// EPROTONOSUPPORT (another version).
int decode_header(std::span<const uint8_t> record, MsgHeader* header);
// Decode a whole reply: 0 with the body filled, the errno of a kError reply, or EPROTO.
int decode_slot(std::span<const uint8_t> record, SlotInfo* info);
int decode_gids(std::span<const uint8_t> record, std::vector<GidEntry>* gids);
int decode_status(std::span<const uint8_t> record, StatusInfo* info);
// kOk: 0; kError: its errno; anything else EPROTO.
int decode_ok(std::span<const uint8_t> record);
int decode_hello(std::span<const uint8_t> record, HelloInfo* info);
int decode_mad(std::span<const uint8_t> record, MadDelivery* info, std::vector<uint8_t>* datagram);
// page->count must be at most kClientsPerPage and the record exactly that long; every comm comes
// out NUL-terminated.
int decode_clients(std::span<const uint8_t> record, ClientsPage* page,
                   std::vector<ClientEntry>* entries);

// Most fds one record carries: a slot's socket, the netns of a hello, a capture socket, a
// doorbell.
inline constexpr size_t kMaxPassedFds = 1;
// What kShmReady and kShmOn carry, and no other record: a region and a doorbell.
inline constexpr size_t kShmPairFds = 2;
// The fds a record of `type` may carry: kShmPairFds for kShmReady and kShmOn, else
// kMaxPassedFds.
size_t max_fds_of(uint16_t type);

// One record (and its fds) on a SEQPACKET socket. send_record returns 0 or an errno (never
// raises SIGPIPE); EINVAL for more fds than max_fds_of the record's type. recv_record returns the
// record size, 0 at EOF, or -errno; passed fds are appended to *fds (close-on-exec), or closed
// when fds is null. `max_fds` is what the caller takes: kMaxPassedFds (what the daemon reads),
// or kShmPairFds (a client reading the daemon), and then still kMaxPassedFds for every type but
// kShmReady and kShmOn. A record that came with more fds than that or was cut short is -EMSGSIZE,
// every fd it carried closed.
int send_record(int sock, std::span<const uint8_t> record, std::span<const int> fds = {});
ssize_t recv_record(int sock, std::span<uint8_t> buffer, std::vector<UniqueFd>* fds, int flags = 0,
                    size_t max_fds = kMaxPassedFds);

// The address of a socket file: false when the path does not fit sun_path.
bool unix_address(const std::string& path, sockaddr_un* out, socklen_t* len);

}  // namespace urdma::daemon
