// libFuzzer target: urdmad's request handling (daemon/daemon.h, daemon/protocol.h) driven by
// hostile records from its clients, and by datagrams on its slot group.
//
// THE WORLD: ONE Daemon per process, made on the first input and driven in-process with
// Daemon::step(0): a listening SOCK_SEQPACKET unix socket in a fresh temp dir, a slot group of
// kSlots sockets on an ephemeral UDP port (open_slot_group with port 0: no privilege, and
// parallel runs cannot collide), a socketpair as the keeper, no idle exit, a short hello
// timeout. Everything this process sends it comes from this process: one pid, one uid.
//
// THE INPUT: a flags byte, then records, each ctl(1) length(2, little-endian) bytes(length)
// (lengths clipped to what is left and to kMaxMessageBytes; at most kMaxRecords):
//   flags bit 0  connection A starts with a proper kHello (with /proc/self/ns/net)
//         bit 1  there is a connection B too; bit 2: B starts with a proper kHello
//   ctl   bits 6-7 what the record is: 0, 1: a record on connection A (ctl bit 0 clear) or B;
//                  2: that connection is closed and opened again (greeted if bytes[0] is odd);
//                  3: a datagram to the slot group's port from 127.0.0.1
//         bits 1-3 fds sent with a record: none, the netns (/proc/self/ns/net), a regular file,
//                  a UDP socket, the newest slot socket a kSlot reply passed, a UTS namespace,
//                  two (netns and file), none
//         bit 4    records: fix the header (magic, version, size over the first 12 bytes; type
//                  and status kept), and let 0 in a slot field mean the slot a kSlot reply
//                  leased last (kMadChannel's slot, the top 8 bits of kConnUp / kConnDown's
//                  comm ID; a kReattach naming slot 0 becomes that kSlot's SlotInfo; a
//                  kShmConnect's QPN of range 0 becomes one of that slot's range, its address
//                  127.0.0.1 when it is all zero)
//                  datagrams: the first 256 bytes are a MAD, sent as a GMP (a UD SEND Only to
//                  QP1, sealed); else the bytes as they are, sealed when ctl bit 0 is set
//         bit 5    the daemon steps (and replies are read) right after this record
// A kConnUp's peer address is put in 127/8, so that the DREQs the daemon sends when the
// connection's slot is reclaimed stay on this host. After the records: the daemon steps until
// nothing is ready, every reply is read, the connections close, it steps again; then a fresh
// connection greets it and asks for its status.
//
// THE ORACLE (a violation prints it and aborts):
//  * the daemon never stops and step() never fails, and it settles (nothing ready) within
//    kMaxRounds steps;
//  * every reply decodes with decode_header and with its type's decoder (kHello, kSlot, kGids,
//    kStatus, kOk, kMad, kClients; kError with a positive errno), and is of no other type;
//    only a kSlot and a kShmAccepted pass an fd, exactly one, and kShmReady and kShmOn two
//    (recv_record's count); none is cut short;
//  * after the connections closed: the status connection sees slots_leased == 0 and itself
//    the only client (every slot leased during the input was released with its connection);
//  * this process holds exactly the fds it held before the input (the slot sockets replies
//    passed were closed by the harness): the daemon leaks none.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/cm_agent.h"
#include "daemon/daemon.h"
#include "daemon/mad_router.h"
#include "daemon/protocol.h"
#include "daemon/steering.h"
#include "daemon/unique_fd.h"
#include "fuzz_check.h"
#include "gsi/gmp.h"
#include "net/icrc_flow.h"
#include "net/shm_ring.h"

namespace {

using namespace urdma;
using namespace urdma::daemon;

constexpr unsigned kSlots = 4;
constexpr size_t kMaxRecords = 32;
constexpr int kMaxRounds = 1000;
constexpr uint32_t kHelloTimeoutMs = 50;

using fuzz::open_fds;

std::vector<int> fds_of_kind(const char* link) {
  std::vector<int> out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), target, sizeof target - 1) > 0 && std::strcmp(target, link) == 0)
      out.push_back(std::atoi(e->d_name));
  }
  closedir(d);
  return out;
}

// ---- the daemon, once per process ----------------------------------------------------------

struct World {
  std::string dir, socket_path, file_path;
  UniqueFd keeper_end;
  std::unique_ptr<Daemon> daemon;
  int epoll_fd = -1;  // the daemon's: readable while anything is ready for step()
  uint16_t port = 0;  // the group's
  UniqueFd udp;       // sends datagrams to the group from 127.0.0.1
  uint16_t udp_port = 0;
};

World* make_world() {
  auto* w = new World;  // never freed: the daemon lives as long as the process
  std::error_code ec;
  std::string tmpl =
      std::filesystem::temp_directory_path(ec).string() + "/urdma-daemon-fuzz-XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr, "mkdtemp");
  w->dir = tmpl;
  w->socket_path = w->dir + "/urdmad.sock";
  w->file_path = w->dir + "/file";
  UniqueFd(open(w->file_path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));

  DaemonHandoff h;
  h.listener.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un sun;
  socklen_t len;
  REQUIRE(h.listener.valid() && unix_address(w->socket_path, &sun, &len), "listener");
  REQUIRE(bind(h.listener.get(), reinterpret_cast<const sockaddr*>(&sun), len) == 0 &&
              listen(h.listener.get(), 64) == 0,
          "bind / listen " + w->socket_path);
  std::string error;
  const int gerr =
      open_slot_group(SlotGroupOptions{.slot_count = kSlots, .port = 0}, &h.group, &error);
  REQUIRE(gerr == 0, "open_slot_group: " + error);
  w->port = h.group.port;
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0, "socketpair");
  w->keeper_end.reset(pair[0]);
  h.keeper.reset(pair[1]);
  h.keeper_pid = getpid();

  DaemonOptions o;
  o.udp_port = w->port;
  o.slot_count = kSlots;
  o.idle_timeout_ms = 0;
  o.hello_timeout_ms = kHelloTimeoutMs;
  o.verbose = false;
  o.socket_path = w->socket_path;
  const auto before = fds_of_kind("anon_inode:[eventpoll]");
  int err = 0;
  w->daemon = Daemon::create(o, std::move(h), &err, &error);
  REQUIRE(w->daemon != nullptr, "Daemon::create: " + error);
  for (int fd : fds_of_kind("anon_inode:[eventpoll]"))
    if (std::find(before.begin(), before.end(), fd) == before.end()) w->epoll_fd = fd;

  w->udp.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const int pmtu = IP_PMTUDISC_DO;  // DF set, IP ID 0: what the ICRC is sealed for
  setsockopt(w->udp.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  REQUIRE(bind(w->udp.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 &&
              getsockname(w->udp.get(), reinterpret_cast<sockaddr*>(&a), &alen) == 0,
          "datagram socket");
  w->udp_port = ntohs(a.sin_port);
  return w;
}

World& world() {
  static World* w = [] {
    World* made = make_world();
    std::atexit([] {
      World& x = world();
      unlink(x.socket_path.c_str());
      unlink(x.file_path.c_str());
      rmdir(x.dir.c_str());
    });
    return made;
  }();
  return *w;
}

// ---- one input -----------------------------------------------------------------------------

struct Record {
  uint8_t ctl = 0;
  std::vector<uint8_t> bytes;
};

class Run {
 public:
  explicit Run(World& w) : w_(w) {}

  void input(const uint8_t* data, size_t size) {
    size_t pos = 0;
    auto u8 = [&]() -> uint8_t { return pos < size ? data[pos++] : 0; };
    const uint8_t flags = u8();
    std::vector<Record> records;
    while (pos < size && records.size() < kMaxRecords) {
      Record r;
      r.ctl = u8();
      const uint16_t lo = u8();
      size_t len = static_cast<size_t>(lo | u8() << 8);
      len = std::min({len, size - std::min(pos, size), kMaxMessageBytes});
      r.bytes.assign(data + pos, data + pos + len);
      pos += len;
      records.push_back(std::move(r));
    }

    open(0, flags & 1);
    if (flags & 2) open(1, flags & 4);
    for (const Record& r : records) {
      const int conn = r.ctl & 1;
      switch (r.ctl >> 6) {
        case 2:
          close(conn);
          settle();
          open(conn, !r.bytes.empty() && (r.bytes[0] & 1));
          break;
        case 3:
          datagram(r);
          break;
        default:
          send(conn, r);
          break;
      }
      if (r.ctl & 0x20) settle();
    }
    settle();
    close(0);
    close(1);
    settle();
    slot_fds_.clear();
    check_released();
  }

 private:
  // A connection to the daemon, greeted (a proper kHello with our namespace) or not.
  void open(int i, bool greet) {
    UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_un sun;
    socklen_t len;
    REQUIRE(fd.valid() && unix_address(w_.socket_path, &sun, &len), "client socket");
    REQUIRE(connect(fd.get(), reinterpret_cast<const sockaddr*>(&sun), len) == 0,
            "connect to the daemon: " + std::string(std::strerror(errno)));
    conns_[i] = std::move(fd);
    if (greet) {
      UniqueFd ns(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
      const int fds[] = {ns.get()};
      (void)send_record(conns_[i].get(), encode_request(MsgType::kHello), fds);
      settle();
    }
  }

  void close(int i) { conns_[i].reset(); }

  // An fd to pass (ctl bits 1-3), opened for the record and closed after it.
  std::vector<UniqueFd> fds_for(uint8_t ctl) {
    std::vector<UniqueFd> out;
    switch ((ctl >> 1) & 7) {
      case 1:
        out.emplace_back(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
        break;
      case 2:
        out.emplace_back(::open(w_.file_path.c_str(), O_RDONLY | O_CLOEXEC));
        break;
      case 3:
        out.emplace_back(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        break;
      case 4:
        if (!slot_fds_.empty()) out.emplace_back(fcntl(slot_fds_.back().get(), F_DUPFD_CLOEXEC, 0));
        break;
      case 5:
        out.emplace_back(::open("/proc/self/ns/uts", O_RDONLY | O_CLOEXEC));
        break;
      case 6:
        out.emplace_back(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
        out.emplace_back(::open(w_.file_path.c_str(), O_RDONLY | O_CLOEXEC));
        break;
      default:
        break;
    }
    std::erase_if(out, [](const UniqueFd& f) { return !f.valid(); });
    return out;
  }

  // The harness's help (ctl bit 4): a valid header, and slot 0 meaning the slot leased last.
  void fix(std::vector<uint8_t>& rec) {
    if (rec.size() < sizeof(MsgHeader)) rec.resize(sizeof(MsgHeader));
    MsgHeader h;
    std::memcpy(&h, rec.data(), sizeof h);
    h.magic = kProtocolMagic;
    h.version = kProtocolVersion;
    h.size = static_cast<uint32_t>(rec.size());
    std::memcpy(rec.data(), &h, sizeof h);
    if (!leased_) return;
    uint8_t* body = rec.data() + sizeof h;
    const size_t body_size = rec.size() - sizeof h;
    const auto type = static_cast<MsgType>(h.type);
    if (type == MsgType::kMadChannel && body_size == sizeof(SlotBody)) {
      SlotBody b;
      std::memcpy(&b, body, sizeof b);
      if (b.slot == 0) b.slot = leased_->slot;
      std::memcpy(body, &b, sizeof b);
    } else if ((type == MsgType::kConnUp && body_size == sizeof(ConnRecord)) ||
               (type == MsgType::kConnDown && body_size == sizeof(CommIdBody))) {
      uint32_t id;
      std::memcpy(&id, body, sizeof id);  // both bodies start with the local comm ID
      if (slot_of_comm_id(id) == 0) id = comm_id_for_slot(leased_->slot, id);
      std::memcpy(body, &id, sizeof id);
    } else if (type == MsgType::kReattach && body_size == sizeof(SlotInfo)) {
      SlotInfo s;
      std::memcpy(&s, body, sizeof s);
      if (s.slot == 0) std::memcpy(body, &*leased_, sizeof s);
    } else if (type == MsgType::kShmConnect && body_size == sizeof(ShmConnectBody)) {
      ShmConnectBody b;
      std::memcpy(&b, body, sizeof b);
      if (range_of_qpn(b.qpn) == 0) b.qpn = leased_->qpn_base | (b.qpn & (kQpnsPerRange - 1));
      if (std::all_of(std::begin(b.address), std::end(b.address), [](uint8_t x) { return x == 0; }))
        std::memcpy(b.address, net::Address::from_v4(127, 0, 0, 1).bytes().data(), 16);
      std::memcpy(body, &b, sizeof b);
    }
  }

  // A kConnUp's peer goes into 127/8: the DREQs of a reclaimed slot stay on this host.
  static void keep_local(std::vector<uint8_t>& rec) {
    MsgHeader h;
    if (rec.size() != sizeof h + sizeof(ConnRecord)) return;
    std::memcpy(&h, rec.data(), sizeof h);
    if (h.type != static_cast<uint16_t>(MsgType::kConnUp)) return;
    uint8_t* peer = rec.data() + sizeof h + offsetof(ConnRecord, peer_address);
    std::memset(peer, 0, 10);
    peer[10] = peer[11] = 0xff;
    peer[12] = 127;
  }

  void send(int i, const Record& r) {
    if (!conns_[i].valid()) return;
    std::vector<uint8_t> rec = r.bytes;
    if (r.ctl & 0x10) fix(rec);
    keep_local(rec);
    const std::vector<UniqueFd> fds = fds_for(r.ctl);
    int raw[2] = {-1, -1};
    for (size_t k = 0; k < fds.size(); ++k) raw[k] = fds[k].get();
    for (int attempt = 0; attempt < 2; ++attempt) {
      const int err = send_raw(conns_[i].get(), rec, raw, fds.size());
      if (err != EAGAIN) return;  // sent, or the daemon hung up
      settle();                   // its queue is full: let the daemon read
    }
  }

  // sendmsg with up to two fds (send_record refuses more than kMaxPassedFds).
  static int send_raw(int sock, const std::vector<uint8_t>& rec, const int* fds, size_t nfds) {
    iovec iov{const_cast<uint8_t*>(rec.data()), rec.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    if (nfds > 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    for (;;) {
      if (sendmsg(sock, &msg, MSG_NOSIGNAL) >= 0) return 0;
      if (errno != EINTR) return errno;
    }
  }

  void datagram(const Record& r) {
    std::vector<uint8_t> d;
    const net::Address lo = net::Address::from_v4(127, 0, 0, 1);
    if (r.ctl & 0x10) {
      CmMad mad{};
      std::copy_n(r.bytes.begin(), std::min(r.bytes.size(), mad.size()), mad.begin());
      d.resize(gsi::kGmpBytes);
      const size_t n = gsi::build_gmp(std::span<uint8_t, gsi::kGmpBytes>(d.data(), d.size()), mad,
                                      gmp_psn_++, {lo, w_.udp_port}, {lo, w_.port});
      REQUIRE(n == d.size(), "harness: build_gmp");
    } else {
      d = r.bytes;
      if (r.ctl & 1) (void)net::seal_icrc(d, {lo, w_.udp_port}, {lo, w_.port});
    }
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(w_.port);
    (void)sendto(w_.udp.get(), d.data(), d.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                 sizeof to);
  }

  // Steps the daemon until nothing is ready, reading every reply as it comes.
  void settle() {
    for (int round = 0;; ++round) {
      REQUIRE(w_.daemon->step(0), "Daemon::step failed");
      REQUIRE(!w_.daemon->stopped(), "the daemon stopped");
      for (int i = 0; i < 3; ++i) read_replies(i);
      if (w_.epoll_fd >= 0) {
        pollfd p{w_.epoll_fd, POLLIN, 0};
        if (poll(&p, 1, 0) == 0) return;
      } else if (round >= 8) {
        return;
      }
      REQUIRE(round < kMaxRounds, "the daemon does not settle");
    }
  }

  void read_replies(int i) {
    if (!conns_[i].valid()) return;
    std::vector<uint8_t> buffer(kMaxMessageBytes);
    for (;;) {
      std::vector<UniqueFd> fds;
      const ssize_t n = recv_record(conns_[i].get(), buffer, &fds, MSG_DONTWAIT, kShmPairFds);
      if (n == -EAGAIN) return;
      if (n == 0 || n == -ECONNRESET) {  // the daemon hung up
        conns_[i].reset();
        return;
      }
      REQUIRE(n != -EMSGSIZE, "a reply with more fds than its type carries, or cut short");
      REQUIRE(n > 0, "recv_record on a reply: " + std::string(std::strerror(static_cast<int>(-n))));
      check_reply({buffer.data(), static_cast<size_t>(n)}, fds, i);
    }
  }

  void check_reply(std::span<const uint8_t> rec, std::vector<UniqueFd>& fds, int conn) {
    MsgHeader h;
    REQUIRE(decode_header(rec, &h) == 0, "a reply decode_header refuses");
    const auto type = static_cast<MsgType>(h.type);
    const size_t fds_of_type = type == MsgType::kSlot || type == MsgType::kShmAccepted ? 1
                               : type == MsgType::kShmReady || type == MsgType::kShmOn ? 2
                                                                                       : 0;
    REQUIRE(fds.size() == fds_of_type, "a reply of type " + std::to_string(h.type) + " with " +
                                           std::to_string(fds.size()) + " fds");
    switch (type) {
      case MsgType::kHello: {
        HelloInfo info;
        REQUIRE(decode_hello(rec, &info) == 0 && info.pid == static_cast<uint32_t>(getpid()),
                "kHello reply");
        break;
      }
      case MsgType::kSlot: {
        SlotInfo info;
        REQUIRE(decode_slot(rec, &info) == 0, "kSlot reply");
        REQUIRE(info.slot >= 1 && info.slot < kSlots && info.slot_count == kSlots &&
                    info.udp_port == w_.port && info.qpn_count == kQpnsPerRange &&
                    slot_of_qpn(info.qpn_base, kSlots) == info.slot,
                "kSlot reply: not a slot of the group");
        leased_ = info;
        slot_fds_.push_back(std::move(fds.front()));
        break;
      }
      case MsgType::kGids: {
        std::vector<GidEntry> gids;
        REQUIRE(decode_gids(rec, &gids) == 0, "kGids reply");
        break;
      }
      case MsgType::kStatus: {
        StatusInfo info;
        REQUIRE(decode_status(rec, &info) == 0, "kStatus reply");
        if (conn == 2) status_ = info;
        break;
      }
      case MsgType::kOk:
        REQUIRE(decode_ok(rec) == 0, "kOk reply");
        break;
      case MsgType::kError:
        REQUIRE(h.status > 0 && rec.size() == sizeof h, "kError reply without an errno");
        break;
      case MsgType::kMad: {
        MadDelivery info;
        std::vector<uint8_t> datagram;
        REQUIRE(decode_mad(rec, &info, &datagram) == 0, "kMad push");
        break;
      }
      case MsgType::kClients: {
        ClientsPage page;
        std::vector<ClientEntry> entries;
        REQUIRE(decode_clients(rec, &page, &entries) == 0, "kClients reply");
        break;
      }
      case MsgType::kShmAccepted:
        REQUIRE(decode_shm_accepted(rec) == 0, "kShmAccepted reply");
        break;
      case MsgType::kShmReady:
      case MsgType::kShmOn: {
        // A region sealed at its size, and a doorbell.
        ShmPairBody body;
        REQUIRE((type == MsgType::kShmOn ? decode_shm_on(rec, &body)
                                         : decode_shm_ready(rec, &body)) == 0,
                "kShmReady reply or kShmOn push");
        struct stat st {};
        const int seals = fcntl(fds[0].get(), F_GET_SEALS);
        REQUIRE(fstat(fds[0].get(), &st) == 0 && S_ISREG(st.st_mode) &&
                    static_cast<size_t>(st.st_size) == net::kShmRegionBytes && seals >= 0 &&
                    (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
                        (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                "a region not sealed at kShmRegionBytes");
        break;
      }
      case MsgType::kShmOff: {
        uint32_t range;
        REQUIRE(decode_shm_off(rec, &range) == 0, "kShmOff push");
        break;
      }
      default:
        fuzz::invariant_broken(__FILE__, "a reply of type " + std::to_string(h.type));
    }
  }

  // Every slot this input leased came back: a fresh connection sees none leased, and itself
  // the only client.
  void check_released() {
    open(2, true);
    REQUIRE(conns_[2].valid(), "the daemon refused a greeted connection");
    REQUIRE(send_record(conns_[2].get(), encode_request(MsgType::kQueryStatus)) == 0,
            "kQueryStatus");
    settle();
    REQUIRE(status_.has_value(), "no kStatus reply");
    REQUIRE(status_->slots_leased == 0, "a slot stays leased after its connection closed (" +
                                            std::to_string(status_->slots_leased) + " leased)");
    REQUIRE(status_->clients == 1,
            "closed connections stay clients (" + std::to_string(status_->clients) + ")");
    close(2);
    settle();
  }

  World& w_;
  std::array<UniqueFd, 3> conns_;  // A, B, and the status connection
  std::vector<UniqueFd> slot_fds_;
  std::optional<SlotInfo> leased_;
  std::optional<StatusInfo> status_;
  uint32_t gmp_psn_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = world();
  const size_t before = open_fds();
  {
    Run run(w);
    run.input(data, size);
  }
  const size_t after = open_fds();
  REQUIRE(after == before, "fds before the input " + std::to_string(before) + ", after " +
                               std::to_string(after) + ": the daemon leaks");
  return 0;
}
