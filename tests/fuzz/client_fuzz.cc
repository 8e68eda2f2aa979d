// libFuzzer target: the client's side of the urdmad protocol (daemon/protocol.h,
// daemon/client.h) fed hostile daemon replies.
//
// THE INPUT: a flags byte, then records, each ctl(1) length(2, little-endian) bytes(length)
// (lengths clipped to what is left; at most kMaxRecords records, missing bytes read as 0).
//   flags bit 0  the first record is preceded by a proper kHello reply (so the Client gets
//                past its greeting and its calls are reached)
//         bits 1-3, 4-6  the Client's first two calls (stage 3: 0 acquire_slot, 1 query_gids,
//                2 query_status, 3 query_clients, 4 report_counters, 5 listen and unlisten,
//                6 conn_up and conn_down, 7 reattach the newest slot, 8 open_mad_channel and
//                next_mad, 9-15 watch_gids and next_gid_update); record i's ctl bits 4-7 name
//                call i + 2
//   ctl   bit 0    fix the record's header: magic, version and size written over its first
//                  12 bytes (type and status kept; a record shorter than a header is padded)
//         bits 1-2 fds sent with it: none, one (a UDP socket), one (a regular file), two
//         bit 3    unsolicited: sent right after the record before it, not in answer to a
//                  request
//         bit 4    stage 2 keeps the fds recv_record passes (else it is given none to fill)
//         bits 5-6 stage 2's buffer: the record's size, or 1, 8 or 64 bytes less
// Three stages, each over every record:
//  1. the decoders: decode_header and every reply decoder (decode_slot, decode_gids,
//     decode_status, decode_ok, decode_hello, decode_mad, decode_clients, decode_shm_accepted,
//     decode_shm_ready), the shared-memory pushes' (decode_shm_on, decode_shm_off) and
//     request-body decoder, on an exactly-sized copy (ASan: no read outside the record);
//  2. recv_record over a socketpair, the record sent with its fds, into a buffer of the
//     record's size or smaller;
//  3. a real Client (Client::connect_or_spawn, spawn off, in a fresh trusted directory) talking
//     to a fake daemon thread that answers each request with the next record (with its fds)
//     and hangs up when they run out; the Client makes the calls the input names.
//
// THE ORACLE (a violation prints it and aborts):
//  * every decoder returns 0, a positive errno, never anything else; a record decode_header
//    refuses is refused by every decoder with the same errno; a kError record gives its status
//    (EPROTO for a status <= 0) from every reply decoder, EPROTO from a push's; a decoder
//    accepts only its own type; a shared-memory pair has side 0 or 1 and a range of the QPNs;
//  * every accepted record re-encodes (encode_slot, encode_gids, ...) to a record that decodes
//    to the same values; decode_clients' entries' comm are NUL-terminated, count within
//    kClientsPerPage; decode_mad's datagram is exactly `length` bytes, at most
//    kMaxMadDatagramBytes;
//  * recv_record returns the record's size with at most kMaxPassedFds fds, every one of them
//    open and close-on-exec, or -EMSGSIZE (more fds than that, or a record cut short); with
//    fds = null nothing stays open;
//  * the Client's calls return 0 or a positive errno; a slot it accepts has an open socket, its
//    client pages NUL-terminated names; and after the Client, its slots and the fake daemon
//    are gone, this process holds exactly the fds it held before the input (nothing a reply
//    passed is leaked).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "daemon/client.h"
#include "daemon/paths.h"
#include "daemon/protocol.h"
#include "daemon/unique_fd.h"
#include "fuzz_check.h"

namespace {

using namespace urdma::daemon;

constexpr size_t kMaxRecords = 32;
constexpr int kClientTimeoutMs = 2000;  // never reached: the fake daemon answers or hangs up

struct Record {
  std::vector<uint8_t> bytes;
  int fds = 0;  // 0, 1 or 2
  bool file_fd = false;
  bool unsolicited = false;
  uint8_t recv_mode = 0;  // ctl bits 4-6
  uint8_t call = 0;       // ctl bits 4-7
};

std::vector<Record> split(const uint8_t* data, size_t size, uint8_t* flags) {
  std::vector<Record> out;
  size_t pos = 0;
  auto u8 = [&]() -> uint8_t { return pos < size ? data[pos++] : 0; };
  *flags = u8();
  while (pos < size && out.size() < kMaxRecords) {
    const uint8_t ctl = u8();
    const uint16_t lo = u8();
    size_t len = static_cast<size_t>(lo | u8() << 8);
    len = std::min({len, size - std::min(pos, size), kMaxMessageBytes});
    Record r;
    r.bytes.assign(data + pos, data + pos + len);
    pos += len;
    if (ctl & 1) {
      if (r.bytes.size() < sizeof(MsgHeader)) r.bytes.resize(sizeof(MsgHeader));
      MsgHeader h;
      std::memcpy(&h, r.bytes.data(), sizeof h);
      h.magic = kProtocolMagic;
      h.version = kProtocolVersion;
      h.size = static_cast<uint32_t>(r.bytes.size());
      std::memcpy(r.bytes.data(), &h, sizeof h);
    }
    switch ((ctl >> 1) & 3) {
      case 1:
        r.fds = 1;
        break;
      case 2:
        r.fds = 1;
        r.file_fd = true;
        break;
      case 3:
        r.fds = 2;
        break;
      default:
        break;
    }
    r.unsolicited = ctl & 8;
    r.recv_mode = static_cast<uint8_t>((ctl >> 4) & 7);
    r.call = static_cast<uint8_t>(ctl >> 4);
    out.push_back(std::move(r));
  }
  return out;
}

using urdma::fuzz::open_fds;

// A fresh fd to pass: a UDP socket, or a regular file (this binary).
int make_fd(bool file) {
  return file ? open("/proc/self/exe", O_RDONLY | O_CLOEXEC)
              : socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
}

// Sends `rec` with its fds (send_record takes at most one: two go by hand). 0 or an errno.
int send_with_fds(int sock, const Record& rec) {
  std::vector<UniqueFd> fds;
  for (int i = 0; i < rec.fds; ++i) fds.emplace_back(make_fd(rec.file_fd || i == 1));
  int raw[2] = {-1, -1};
  for (size_t i = 0; i < fds.size(); ++i) raw[i] = fds[i].get();
  iovec iov{const_cast<uint8_t*>(rec.bytes.data()), rec.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), raw, fds.size() * sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

bool is_errno(int r) {
  return r >= 0;  // 0, or a positive errno (a kError's status may be any positive value)
}

// ---- stage 1: the decoders ----------------------------------------------------------------

void same_slot(const SlotInfo& a, const SlotInfo& b) {
  REQUIRE(std::memcmp(&a, &b, sizeof a) == 0, "kSlot re-encoded decodes to other values");
}

void check_decoders(std::span<const uint8_t> rec) {
  MsgHeader h{};
  const int herr = decode_header(rec, &h);
  REQUIRE(herr == 0 || herr == EPROTO || herr == EPROTONOSUPPORT, "decode_header's errno");
  // What every reply decoder must say when the record is not of its type.
  const bool is_error = herr == 0 && h.type == static_cast<uint16_t>(MsgType::kError);
  const int error_status = is_error ? (h.status > 0 ? h.status : EPROTO) : 0;
  auto check_refusal = [&](int r, MsgType own, const char* name) {
    REQUIRE(is_errno(r), std::string(name) + " returned a negative value");
    if (herr != 0) {
      REQUIRE(r == herr, std::string(name) + " accepted or misjudged a bad header");
    } else if (is_error) {
      REQUIRE(r == error_status, std::string(name) + ": a kError's status not returned");
    } else if (h.type != static_cast<uint16_t>(own) || h.status != 0) {
      REQUIRE(r == EPROTO, std::string(name) + " accepted another type");
    }
    return r == 0;
  };

  SlotInfo slot{};
  if (check_refusal(decode_slot(rec, &slot), MsgType::kSlot, "decode_slot")) {
    SlotInfo again{};
    REQUIRE(decode_slot(encode_slot(slot), &again) == 0, "encode_slot: undecodable");
    same_slot(slot, again);
  }
  std::vector<GidEntry> gids;
  if (check_refusal(decode_gids(rec, &gids), MsgType::kGids, "decode_gids")) {
    REQUIRE(gids.size() <= kMaxGids, "decode_gids: more than kMaxGids");
    std::vector<GidEntry> again;
    REQUIRE(decode_gids(encode_gids(gids), &again) == 0, "encode_gids: undecodable");
    REQUIRE(again == gids, "kGids re-encoded decodes to other values");
  }
  StatusInfo status{};
  if (check_refusal(decode_status(rec, &status), MsgType::kStatus, "decode_status")) {
    StatusInfo again{};
    REQUIRE(decode_status(encode_status(status), &again) == 0, "encode_status: undecodable");
    REQUIRE(std::memcmp(&status, &again, sizeof status) == 0,
            "kStatus re-encoded decodes to other values");
  }
  if (check_refusal(decode_ok(rec), MsgType::kOk, "decode_ok")) {
    REQUIRE(rec.size() == sizeof(MsgHeader), "decode_ok accepted a body");
    REQUIRE(decode_ok(encode_request(MsgType::kOk)) == 0, "encode_request(kOk): undecodable");
  }
  HelloInfo hello{};
  if (check_refusal(decode_hello(rec, &hello), MsgType::kHello, "decode_hello")) {
    HelloInfo again{};
    REQUIRE(decode_hello(encode_hello(hello), &again) == 0, "encode_hello: undecodable");
    REQUIRE(std::memcmp(&hello, &again, sizeof hello) == 0,
            "kHello re-encoded decodes to other values");
  }
  MadDelivery mad{};
  std::vector<uint8_t> datagram;
  if (check_refusal(decode_mad(rec, &mad, &datagram), MsgType::kMad, "decode_mad")) {
    REQUIRE(datagram.size() == mad.length && mad.length <= kMaxMadDatagramBytes,
            "decode_mad: the datagram is not `length` bytes");
    MadDelivery again{};
    std::vector<uint8_t> again_datagram;
    REQUIRE(decode_mad(encode_mad(mad, datagram), &again, &again_datagram) == 0,
            "encode_mad: undecodable");
    REQUIRE(std::memcmp(&mad, &again, sizeof mad) == 0 && again_datagram == datagram,
            "kMad re-encoded decodes to other values");
  }
  ClientsPage page{};
  std::vector<ClientEntry> entries;
  if (check_refusal(decode_clients(rec, &page, &entries), MsgType::kClients, "decode_clients")) {
    REQUIRE(page.count <= kClientsPerPage && entries.size() == page.count, "decode_clients: count");
    for (const ClientEntry& e : entries)
      REQUIRE(std::memchr(e.comm, 0, sizeof e.comm) != nullptr,
              "decode_clients: comm not NUL-terminated");
    ClientsPage again{};
    std::vector<ClientEntry> again_entries;
    REQUIRE(decode_clients(encode_clients(page, entries), &again, &again_entries) == 0,
            "encode_clients: undecodable");
    // Field by field: ClientsPage has tail padding.
    REQUIRE(page.uptime_ms == again.uptime_ms && page.netns_inode == again.netns_inode &&
                page.total == again.total && page.first == again.first &&
                page.count == again.count && page.takeover == again.takeover &&
                page.survivors == again.survivors && page.keeper_pid == again.keeper_pid &&
                page.restarts == again.restarts && page.mode == again.mode &&
                page.reserved16 == again.reserved16 && page.daemon_uid == again.daemon_uid &&
                page.viewer_uid == again.viewer_uid && page.reserved == again.reserved,
            "kClients page re-encoded decodes to other values");
    REQUIRE(again_entries.size() == entries.size() &&
                (entries.empty() || std::memcmp(entries.data(), again_entries.data(),
                                                entries.size() * sizeof(ClientEntry)) == 0),
            "kClients entries re-encoded decode to other values");
  }
  if (check_refusal(decode_shm_accepted(rec), MsgType::kShmAccepted, "decode_shm_accepted"))
    REQUIRE(rec.size() == sizeof(MsgHeader), "decode_shm_accepted accepted a body");
  auto same_pair = [](const ShmPairBody& a, std::vector<uint8_t> again_rec, bool push) {
    REQUIRE(a.side <= 1 && a.peer_range < kRangeCount, "a shared-memory pair out of range");
    ShmPairBody again{};
    REQUIRE((push ? decode_shm_on(again_rec, &again) : decode_shm_ready(again_rec, &again)) == 0 &&
                std::memcmp(&a, &again, sizeof a) == 0,
            "ShmPairBody re-encoded decodes to other values");
  };
  ShmPairBody pair{};
  if (check_refusal(decode_shm_ready(rec, &pair), MsgType::kShmReady, "decode_shm_ready"))
    same_pair(pair, encode_shm_pair(MsgType::kShmReady, pair), false);
  // The pushes: a kError is no push either.
  auto check_push = [&](int r, MsgType own, const char* name) {
    REQUIRE(is_errno(r), std::string(name) + " returned a negative value");
    if (herr != 0) {
      REQUIRE(r == herr, std::string(name) + " accepted or misjudged a bad header");
    } else if (h.type != static_cast<uint16_t>(own) || h.status != 0) {
      REQUIRE(r == EPROTO, std::string(name) + " accepted another type");
    }
    return r == 0;
  };
  if (check_push(decode_shm_on(rec, &pair), MsgType::kShmOn, "decode_shm_on"))
    same_pair(pair, encode_shm_pair(MsgType::kShmOn, pair), true);
  uint32_t off_range = 0;
  if (check_push(decode_shm_off(rec, &off_range), MsgType::kShmOff, "decode_shm_off")) {
    uint32_t again = 0;
    REQUIRE(off_range < kRangeCount && decode_shm_off(encode_shm_off(off_range), &again) == 0 &&
                again == off_range,
            "kShmOff round trip");
  }

  // The request bodies urdmad decodes (type unchecked: the daemon dispatches on it first).
  auto body_ok = [&](int r) {
    REQUIRE(r == 0 || r == EPROTO || r == EPROTONOSUPPORT, "decode_request_body's errno");
    if (herr != 0) REQUIRE(r == herr, "decode_request_body accepted a bad header");
    return r == 0;
  };
  ServiceIdBody sid{};
  if (body_ok(decode_request_body(rec, &sid))) {
    ServiceIdBody again{};
    REQUIRE(decode_request_body(encode_service_request(MsgType::kListen, sid.service_id), &again) ==
                    0 &&
                again.service_id == sid.service_id,
            "ServiceIdBody round trip");
  }
  SlotBody sb{};
  if (body_ok(decode_request_body(rec, &sb))) {
    SlotBody again{};
    REQUIRE(decode_request_body(encode_mad_channel(sb.slot), &again) == 0 && again.slot == sb.slot,
            "SlotBody round trip");
  }
  ClientsQuery q{};
  if (body_ok(decode_request_body(rec, &q))) {
    ClientsQuery again{};
    REQUIRE(
        decode_request_body(encode_clients_query(q.first), &again) == 0 && again.first == q.first,
        "ClientsQuery round trip");
  }
  CounterReport report{};
  if (body_ok(decode_request_body(rec, &report))) {
    CounterReport again{};
    REQUIRE(decode_request_body(encode_counter_report(report), &again) == 0 && again == report,
            "CounterReport round trip");
  }
  SlotInfo reattach{};
  if (body_ok(decode_request_body(rec, &reattach))) {
    SlotInfo again{};
    REQUIRE(decode_request_body(encode_reattach(reattach), &again) == 0, "SlotInfo round trip");
    same_slot(reattach, again);
  }
  ConnRecord conn{};
  if (body_ok(decode_request_body(rec, &conn))) {
    ConnRecord again{};
    REQUIRE(decode_request_body(encode_conn_up(conn), &again) == 0 &&
                std::memcmp(&conn, &again, sizeof conn) == 0,
            "ConnRecord round trip");
  }
  CommIdBody down{};
  if (body_ok(decode_request_body(rec, &down))) {
    CommIdBody again{};
    REQUIRE(decode_request_body(encode_conn_down(down.local_comm_id), &again) == 0 &&
                again.local_comm_id == down.local_comm_id,
            "CommIdBody round trip");
  }
  ShmConnectBody shm{};
  if (body_ok(decode_request_body(rec, &shm))) {
    ShmConnectBody again{};
    const urdma::net::Address address(std::to_array(shm.address));
    REQUIRE(decode_request_body(encode_shm_connect(address, shm.qpn), &again) == 0 &&
                again.qpn == shm.qpn &&
                std::memcmp(again.address, shm.address, sizeof shm.address) == 0,
            "ShmConnectBody round trip");
  }
}

// ---- stage 2: recv_record ----------------------------------------------------------------

void check_recv_record(const Record& rec) {
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0, "socketpair");
  UniqueFd tx(pair[0]), rx(pair[1]);
  if (send_with_fds(tx.get(), rec) != 0) return;  // too large for the socket: nothing to read
  // A buffer of the record's size, or (sometimes) smaller: the record is cut short.
  static constexpr size_t kShort[] = {0, 1, 8, 64};
  const size_t room = rec.bytes.size() - std::min(rec.bytes.size(), kShort[rec.recv_mode >> 1]);
  std::vector<uint8_t> buffer(room);
  const bool keep = rec.recv_mode & 1;
  std::vector<UniqueFd> fds;
  const size_t before = open_fds();
  const ssize_t n = recv_record(rx.get(), buffer, keep ? &fds : nullptr, MSG_DONTWAIT);
  const bool cut = room < rec.bytes.size();
  if (n == -EMSGSIZE) {
    REQUIRE(cut || rec.fds > static_cast<int>(kMaxPassedFds),
            "recv_record: -EMSGSIZE for a whole record");
  } else {
    REQUIRE(rec.fds <= static_cast<int>(kMaxPassedFds),
            "recv_record accepted a record with " + std::to_string(rec.fds) + " fds (" +
                std::to_string(fds.size()) + " passed on), not -EMSGSIZE");
    REQUIRE(n == static_cast<ssize_t>(rec.bytes.size()) && !cut,
            "recv_record: not the record's size");
    REQUIRE(std::equal(buffer.begin(), buffer.end(), rec.bytes.begin()), "recv_record: bytes");
  }
  REQUIRE(fds.size() <= kMaxPassedFds, "recv_record: more fds than kMaxPassedFds");
  for (const UniqueFd& fd : fds) {
    const int flags = fcntl(fd.get(), F_GETFD);
    REQUIRE(flags >= 0 && (flags & FD_CLOEXEC), "recv_record: a passed fd not close-on-exec");
  }
  REQUIRE(open_fds() == before + fds.size(), "recv_record: fds leaked");
}

// ---- stage 3: a Client against a fake daemon ----------------------------------------------

struct Place {
  std::string dir;     // trusted, ours
  std::string socket;  // the endpoint Client::connect_or_spawn tries
  bool usable = false;
};

// Never freed: the atexit handler that removes the directory runs after static destructors.
Place& place() {
  static Place* const p = [] {
    auto* out_ptr = new Place;
    Place& out = *out_ptr;
    std::error_code ec;
    for (const std::string& parent :
         {std::filesystem::temp_directory_path(ec).string(), std::string("/tmp")}) {
      std::string tmpl = parent + "/urdma-client-fuzz-XXXXXX";
      if (!mkdtemp(tmpl.data())) continue;
      std::string why;
      if (!trusted_path(tmpl, geteuid(), &why)) {
        rmdir(tmpl.c_str());
        continue;
      }
      out.dir = tmpl;
      out.socket = endpoint_in(tmpl, netns_inode(), false).socket;
      out.usable = true;
      std::atexit([] { rmdir(place().dir.c_str()); });
      break;
    }
    if (!out.usable) std::fprintf(stderr, "client_fuzz: no trusted temp dir: stage 3 skipped\n");
    return out_ptr;
  }();
  return *p;
}

// Answers each request with the next record and hangs up when they run out (or when told to
// stop). Every request is read with its fds (the hello's netns), which are closed. `idle` is
// readable while it waits for a request with everything before sent: what the Client reads
// without waiting (next_mad, next_gid_update) is then the same on every run.
void fake_daemon(int listener, int stop, int idle, const std::vector<Record>* records) {
  pollfd p[2] = {{listener, POLLIN, 0}, {stop, POLLIN, 0}};
  if (poll(p, 2, -1) <= 0 || p[1].revents) return;
  UniqueFd conn(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn.valid()) return;
  std::vector<uint8_t> buffer(kMaxMessageBytes);
  const uint64_t one = 1;
  uint64_t drained;
  for (const Record& r : *records) {
    if (!r.unsolicited) {
      (void)!write(idle, &one, sizeof one);
      pollfd q[2] = {{conn.get(), POLLIN, 0}, {stop, POLLIN, 0}};
      const int n = poll(q, 2, -1);
      (void)!read(idle, &drained, sizeof drained);
      if (n <= 0 || q[1].revents) return;
      std::vector<UniqueFd> fds;
      if (recv_record(conn.get(), buffer, &fds, MSG_DONTWAIT) == 0) return;  // hung up
    }
    if (send_with_fds(conn.get(), r) != 0) return;
  }
}

// Before a read that does not wait: until a record is there, the fake daemon hung up, or it
// waits for a request (so nothing more comes).
void wait_for_push(const Client& client, int idle) {
  pollfd p[2] = {{client.fd(), POLLIN, 0}, {idle, POLLIN, 0}};
  (void)poll(p, 2, kClientTimeoutMs);
}

void check_call(int r, const char* what) {
  REQUIRE(is_errno(r), std::string("Client::") + what + " returned a negative value");
}

void run_client(uint8_t flags, const std::vector<Record>& records) {
  Place& pl = place();
  if (!pl.usable) return;
  UniqueFd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sun;
  socklen_t len;
  REQUIRE(listener.valid() && unix_address(pl.socket, &sun, &len), "listener");
  unlink(pl.socket.c_str());
  REQUIRE(bind(listener.get(), reinterpret_cast<const sockaddr*>(&sun), len) == 0 &&
              listen(listener.get(), 4) == 0,
          "bind the fake daemon");
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  UniqueFd idle(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  REQUIRE(stop.valid() && idle.valid(), "eventfd");

  std::vector<Record> script;
  if (flags & 1) {
    Record hello;
    hello.bytes = encode_hello(HelloInfo{.pid = 1,
                                         .keeper_pid = 1,
                                         .uid = geteuid(),
                                         .mode = kModeUser,
                                         .reserved = 0,
                                         .netns_inode = netns_inode()});
    script.push_back(std::move(hello));
  }
  script.insert(script.end(), records.begin(), records.end());
  std::thread daemon(fake_daemon, listener.get(), stop.get(), idle.get(), &script);

  {
    std::vector<Slot> slots;
    Client client;
    std::string detail;
    const int err = Client::connect_or_spawn(
        ClientOptions{
            .runtime_dir = pl.dir, .system = false, .spawn = false, .timeout_ms = kClientTimeoutMs},
        &client, &detail);
    check_call(err, "connect_or_spawn");
    // The calls: two from the flags, then one per record.
    const unsigned ops = flags >> 1;
    for (size_t i = 0; err == 0 && i < records.size() + 2; ++i) {
      const unsigned op = i < 2 ? (ops >> (3 * i)) & 7 : records[i - 2].call;
      switch (op) {
        case 0: {
          Slot s;
          const int r = client.acquire_slot(&s);
          check_call(r, "acquire_slot");
          if (r == 0) {
            REQUIRE(s.fd.valid() && fcntl(s.fd.get(), F_GETFD) >= 0, "a slot without its socket");
            slots.push_back(std::move(s));
          }
          break;
        }
        case 1: {
          std::vector<GidEntry> gids;
          const int r = client.query_gids(&gids);
          check_call(r, "query_gids");
          if (r == 0) REQUIRE(gids.size() <= kMaxGids, "query_gids: more than kMaxGids");
          break;
        }
        case 2: {
          StatusInfo st;
          check_call(client.query_status(&st), "query_status");
          break;
        }
        case 3: {
          ClientsPage page;
          std::vector<ClientEntry> entries;
          const int r = client.query_clients(&page, &entries);
          check_call(r, "query_clients");
          if (r == 0) {
            REQUIRE(page.count == entries.size(), "query_clients: count");
            for (const ClientEntry& e : entries)
              REQUIRE(std::memchr(e.comm, 0, sizeof e.comm) != nullptr,
                      "query_clients: comm not NUL-terminated");
          }
          break;
        }
        case 4:
          check_call(client.report_counters(CounterReport{}), "report_counters");
          break;
        case 5:
          check_call(client.listen(0x0106000000001234ULL + i), "listen");
          check_call(client.unlisten(0x0106000000001234ULL), "unlisten");
          break;
        case 6:
          check_call(
              client.conn_up(ConnRecord{.local_comm_id = 0x01000000u + static_cast<uint32_t>(i)}),
              "conn_up");
          check_call(client.conn_down(0x01000000u), "conn_down");
          break;
        case 7:
          if (!slots.empty()) check_call(client.reattach(slots.back()), "reattach");
          break;
        case 8: {
          check_call(client.open_mad_channel(1), "open_mad_channel");
          MadDelivery info;
          std::vector<uint8_t> datagram;
          wait_for_push(client, idle.get());
          const int r = client.next_mad(&info, &datagram);
          check_call(r, "next_mad");
          if (r == 0)
            REQUIRE(datagram.size() == info.length && info.length <= kMaxMadDatagramBytes,
                    "next_mad: the datagram is not `length` bytes");
          break;
        }
        default: {
          std::vector<GidEntry> gids;
          check_call(client.watch_gids(&gids), "watch_gids");
          wait_for_push(client, idle.get());
          check_call(client.next_gid_update(&gids), "next_gid_update");
          break;
        }
      }
      if (!client.connected()) break;
    }
  }  // the Client and its slots close here
  const uint64_t one = 1;
  (void)!write(stop.get(), &one, sizeof one);
  daemon.join();
  unlink(pl.socket.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t flags = 0;
  const std::vector<Record> records = split(data, size, &flags);
  const size_t fds_before = open_fds();
  for (size_t i = 0; i < records.size(); ++i) {
    // An exactly-sized copy: ASan sees any read outside the record.
    const std::vector<uint8_t> exact(records[i].bytes);
    check_decoders(exact);
    check_recv_record(records[i]);
  }
  run_client(flags, records);
  REQUIRE(open_fds() == fds_before, "the Client or the decoders leaked an fd");
  return 0;
}
