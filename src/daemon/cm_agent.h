// What urdmad itself says on QP1, where a kernel CM would answer for the host:
//  * a REQ for a service ID nobody listens on gets REJ "invalid service ID" (IBA 12.6.7.2,
//    reason 8; Linux cm_match_req → cm_issue_rej), a SIDR_REQ gets SIDR_REP "service ID not
//    supported" (status 1; Linux cm_sidr_req_handler) — at once, instead of the client
//    retrying until it gives up;
//  * a DREQ for a communication ID no process holds gets a DREP (Linux cm_issue_drep), so the
//    peer of a process that died finishes its disconnect;
//  * when a process dies, every connection it had established gets a DREQ, so its peers see
//    DISCONNECTED (the kernel sends DREQ for each connected cm_id of a dying process).
// Unlike Linux, the REJ / SIDR_REP for a service ID nobody holds comes only after a short,
// bounded wait for a listener (ListenWaits, below), so a client that is quicker than its
// server's rdma_bind_addr is served instead of refused.
//
// The daemon learns a process's connections from the process itself (kConnUp when it becomes
// established, kConnDown when it ends: protocol.h), never from the MADs it routes, which a peer
// could forge: a REP with a good ICRC proves nothing about what the process started. The DREQs
// are bounded (kMaxConnsPerSlot per process), paced (Releases::kPerSecond, shared by every dead
// process) and repeated until their DREP comes, a few times at most.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "net/address.h"
#include "wire/mad.h"

namespace urdma::daemon {

using CmMad = std::array<uint8_t, wire::kMadSize>;

// The answer to a REQ or SIDR_REQ nobody listens for (REJ reason 8, Message REJected REQ,
// Local Comm ID 0, Remote Comm ID = the REQ's, the REQ's transaction ID; or SIDR_REP status 1
// with the request's ID, service ID and transaction ID). nullopt for any other message or a MAD
// that is not a CM message.
std::optional<CmMad> no_listener_reply(std::span<const uint8_t> mad);

// The MRA for a REQ that waits for a listener (ListenWaits): Message MRAed REQ, Local Comm ID 0
// (the passive side has no ID yet; Linux's cm_mra_handler finds the requester by the Remote Comm
// ID alone), the REQ's transaction ID, and the smallest Service Timeout 4.096 µs × 2^t that
// covers `wait_ms` as Linux reckons it (cm_convert_to_ms: 2^(t-8) ms). nullopt for anything but
// a REQ.
std::optional<CmMad> wait_mra(std::span<const uint8_t> mad, int64_t wait_ms);

// The DREP answering a DREQ for a connection nobody holds (comm IDs swapped, transaction ID
// echoed); nullopt for anything but a DREQ.
std::optional<CmMad> orphan_drep(std::span<const uint8_t> mad);

// One established connection of a process, as its peer names it.
struct PeerConn {
  uint32_t local_comm_id = 0;   // the process's
  uint32_t remote_comm_id = 0;  // the peer's
  uint32_t remote_qpn = 0;      // the peer's QP (a DREQ names it: IBA 12.6.10)
  net::Address local;           // the address the peer sent to
  net::Address peer;
  friend bool operator==(const PeerConn&, const PeerConn&) = default;
};

// The DREQ that releases `c` on behalf of its dead process.
CmMad build_dreq(const PeerConn& c, uint64_t transaction_id);

// REQs and SIDR_REQs for a service ID nobody holds, waiting a short, bounded time for a listener
// before the daemon answers them (no_listener_reply). A server that binds after its client's REQ
// left — perftest 4.5's -R tools bind and listen only after their out-of-band handshake, and a
// prompt client's REQ comes first — is served instead of refused; perftest's retry after a REJ
// crashes (tests/interop/NOTES-cm.md). The IBA lets the passive side take up to the requester's
// response timeout before it answers (IBA 12.6.5, REQ "Remote CM Response Timeout"; rdma_cm
// waits 4096 ms); a requester whose retransmission comes while its REQ still waits is told to
// wait longer with an MRA (IBA 12.6.6; Linux answers a duplicate REQ it is still deciding on the
// same way, cm_dup_req_handler), so the wait may be longer than a requester's timeout without
// the requester giving up.
// Bounded against a peer that floods REQs: kMax in all and kMaxPerRequester from one address
// wait at once; beyond, a request is answered at once, as without the wait. A retransmission of
// a waiting request (same address, same communication or request ID) does not wait twice.
class ListenWaits {
 public:
  static constexpr size_t kMax = 1024;
  static constexpr size_t kMaxPerRequester = 64;

  struct Request {
    uint64_t service_id = 0;
    net::Endpoint src;              // the requester
    net::Endpoint dst;              // the address it sent to (the host's)
    std::vector<uint8_t> datagram;  // as received: BTH .. ICRC
    int64_t deadline_ms = 0;
  };
  enum class Added : uint8_t {
    kWaiting,     // until now + wait_ms
    kDuplicate,   // the same request waits already (*mra: the MRA to answer it with)
    kFull,        // a cap: answer it now
    kNotRequest,  // not a REQ or SIDR_REQ
  };

  explicit ListenWaits(int64_t wait_ms) : wait_ms_(wait_ms) {}
  int64_t wait_ms() const { return wait_ms_; }

  // A request for `service_id`, which nobody holds; `mad` is the datagram's MAD.
  Added add(uint64_t service_id, std::span<const uint8_t> datagram, std::span<const uint8_t> mad,
            const net::Endpoint& src, const net::Endpoint& dst, int64_t now_ms,
            std::optional<CmMad>* mra);
  // A listener for `service_id` came: its waiting requests, oldest first, forgotten here.
  std::vector<Request> take(uint64_t service_id);
  // The requests whose wait ended by `now_ms`, oldest first, forgotten here.
  std::vector<Request> expired(int64_t now_ms);
  // When expired() next has something; nullopt when nothing waits.
  std::optional<int64_t> next_deadline_ms() const;
  size_t size() const { return by_key_.size(); }

 private:
  // A request names itself by its sender's address, its kind and its ID (a REQ's Local Comm ID,
  // a SIDR_REQ's Request ID).
  struct Key {
    net::Address requester;
    bool sidr = false;
    uint32_t id = 0;
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  struct Entry {
    Key key;
    Request request;
  };
  void forget(const Key& k);  // by_key_ and per_requester_; the caller erases the entry

  int64_t wait_ms_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Entry> entries_;  // by arrival: every wait is wait_ms_, so by deadline too
  std::map<Key, uint64_t> by_key_;     // -> entries_
  std::map<net::Address, size_t> per_requester_;
};

// Per slot, the connections its process reported established.
class ConnTable {
 public:
  static constexpr size_t kMaxConnsPerSlot = 4096;

  // kConnUp from `slot`'s process: 0, or EINVAL (the local comm ID is not the slot's: its top
  // bits name the slot, comm_id_for_slot), ENOSPC (kMaxConnsPerSlot). The same local comm ID
  // again replaces the record.
  int add(unsigned slot, const PeerConn& c);
  // kConnDown: 0 or ENOENT.
  int remove(unsigned slot, uint32_t local_comm_id);
  // The slot's process is gone: its established connections, and the slot forgotten.
  std::vector<PeerConn> reclaim(unsigned slot);
  size_t established(unsigned slot) const;

 private:
  std::map<unsigned, std::map<uint32_t, PeerConn>> slots_;  // slot -> local comm ID -> conn
};

// The DREQs for dead processes' connections: sent at most kPerSecond (a burst of kBurst), and
// repeated until their DREP comes or the retries run out (as a CM retransmits its DREQ: IBA
// 12.9.7; the peer answers a repeated DREQ with another DREP). The DREPs are the daemon's: they
// are not forwarded to whichever process holds the slot by then.
class Releases {
 public:
  static constexpr int64_t kTimeoutMs = 1000;
  static constexpr int kRetries = 3;
  static constexpr size_t kMax = 65536;  // beyond: not sent (counted by the caller)
  static constexpr int64_t kPerSecond = 1000;
  static constexpr int64_t kBurst = 256;

  struct Dreq {
    PeerConn conn;
    uint64_t transaction_id = 0;
    int sends = 0;  // as due() returns it: how many times it is sent, this time included
  };
  // Queues `d` to be sent as soon as the pace allows; false when kMax are tracked already.
  bool add(const Dreq& d, int64_t now_ms);
  // A DREP from `peer`: true when it answers one of ours (then forgotten).
  bool take_drep(const net::Address& peer, std::span<const uint8_t> mad);
  // The DREQs to send at `now_ms` (first sends and repeats), within the pace; those out of
  // retries are forgotten.
  std::vector<Dreq> due(int64_t now_ms);
  // When due() next has something; nullopt when nothing is tracked.
  std::optional<int64_t> next_deadline_ms() const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Dreq dreq;
    int64_t deadline_ms = 0;
    int sends_left = 0;
  };
  std::map<uint32_t, Entry> entries_;  // by the dead process's comm ID
  // The pace: a bucket of kBurst tokens refilled at kPerSecond.
  int64_t tokens_ = kBurst;
  int64_t refilled_ms_ = 0;
};

}  // namespace urdma::daemon
