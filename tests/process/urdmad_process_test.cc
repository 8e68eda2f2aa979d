// urdmad with real processes: the real binary, spawned by the client library, inside a fresh
// network namespace per test (netns_harness.h). Datagrams are sent to the group's port over
// loopback (or a veth pair between two namespaces, 10.88.0.0/24) with a hand-made BTH whose
// DestQP names the receiving process's QPN range.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "daemon/client.h"
#include "daemon/mad_router.h"
#include "daemon/paths.h"
#include "daemon/steering.h"
#include "gsi/gmp.h"
#include "net/shm_ring.h"
#include "net/udp_socket_io.h"
#include "netns_harness.h"
#include "support/datagram.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/mad.h"
#include "wire/opcode.h"

namespace urdma::process_test {
namespace {

using daemon::Client;
using daemon::ClientOptions;
using daemon::Slot;
using daemon::SlotInfo;
using daemon::UniqueFd;

constexpr uint16_t kPort = 4791;  // each test has its own namespace: the real port

class UrdmadProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    use_daemon(URDMA_DAEMON_PATH, "10000");
  }
};

// The daemon proper, and its keeper (the keeper holds the listening socket: SO_PEERCRED names
// it), as the daemon's hello said.
pid_t daemon_pid(const Client& c) {
  return static_cast<pid_t>(c.daemon_info().pid);
}
pid_t keeper_pid(const Client& c) {
  return static_cast<pid_t>(c.daemon_info().keeper_pid);
}

bool alive(pid_t pid) {
  // A zombie (a dead keeper we have not reaped, as subreaper) is not alive.
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// utime + stime of a process, in clock ticks.
long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// Sends a 12-byte BTH (RC SEND Only) with DestQP `qpn` plus a 4-byte tag to addr:port.
void send_to_qpn(const char* addr, uint32_t qpn, uint32_t tag, int from_fd = -1) {
  UniqueFd own;
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(kPort);
  std::string mapped = std::string(std::strchr(addr, ':') ? "" : "::ffff:") + addr;
  ASSERT_EQ(inet_pton(AF_INET6, mapped.c_str(), &sin6.sin6_addr), 1) << addr;
  if (from_fd < 0) {
    own.reset(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    from_fd = own.get();
  }
  uint8_t d[16] = {0x04,
                   0,
                   0xff,
                   0xff,
                   0,
                   static_cast<uint8_t>(qpn >> 16),
                   static_cast<uint8_t>(qpn >> 8),
                   static_cast<uint8_t>(qpn)};
  std::memcpy(d + 12, &tag, sizeof tag);
  ASSERT_EQ(sendto(from_fd, d, sizeof d, 0, reinterpret_cast<sockaddr*>(&sin6), sizeof sin6),
            static_cast<ssize_t>(sizeof d))
      << std::strerror(errno);
}

struct Received {
  uint32_t qpn = 0;
  uint32_t tag = 0;
  std::string from;
};

// One datagram from a slot socket within `timeout_ms`.
std::optional<Received> receive(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return std::nullopt;
  uint8_t d[64];
  sockaddr_in6 from{};
  socklen_t len = sizeof from;
  const ssize_t n =
      recvfrom(fd, d, sizeof d, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
  if (n != 16) return std::nullopt;
  Received r;
  r.qpn = uint32_t{d[5]} << 16 | uint32_t{d[6]} << 8 | d[7];
  std::memcpy(&r.tag, d + 12, sizeof r.tag);
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, &from.sin6_addr, text, sizeof text);
  r.from = text;
  return r;
}

int connect_client(Client* c, bool spawn = true) {
  std::string detail;
  ClientOptions o;
  o.spawn = spawn;
  o.timeout_ms = 5000;
  const int err = Client::connect_or_spawn(o, c, &detail);
  if (err) std::fprintf(stderr, "connect_or_spawn: %s\n", detail.c_str());
  return err;
}

// Stops urdmad through its keeper (we are its subreaper); true if it exited cleanly.
bool stop_keeper(pid_t keeper) {
  kill(keeper, SIGTERM);
  const auto status = wait_exit(keeper, 3000);
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}
bool stop_daemon(const Client& c) {
  return stop_keeper(keeper_pid(c));
}
// The same for a daemon known by its pid: its keeper is its parent.
bool stop_daemon(pid_t daemon) {
  std::ifstream f("/proc/" + std::to_string(daemon) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto paren = line.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream rest(line.substr(paren + 2));
  std::string state;
  pid_t parent = 0;
  rest >> state >> parent;
  return parent > 1 && stop_keeper(parent);
}

TEST_F(UrdmadProcess, ClientSpawnsTheDaemonWhenAbsent) {
  in_fresh_netns([] {
    Client c;
    EXPECT_EQ(connect_client(&c, /*spawn=*/false), ECONNREFUSED) << "no daemon yet";
    ASSERT_EQ(connect_client(&c), 0);
    const pid_t d = daemon_pid(c);
    ASSERT_GT(d, 0);
    EXPECT_TRUE(alive(d));
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    EXPECT_NE(slot.info.slot, 0u);
    EXPECT_EQ(slot.info.udp_port, kPort);
    EXPECT_EQ(daemon::slot_of_qpn(slot.info.qpn_base, slot.info.slot_count), slot.info.slot);
    EXPECT_EQ(c.acquire_slot(&slot), EALREADY) << "one slot per connection";
    // The GID table has loopback, IPv4-mapped and IPv6.
    std::vector<daemon::GidEntry> gids;
    ASSERT_EQ(c.query_gids(&gids), 0);
    std::set<std::string> text;
    for (const auto& g : gids) text.insert(g.gid.to_string());
    EXPECT_TRUE(text.contains("127.0.0.1"));
    EXPECT_TRUE(text.contains("::1"));
    // Idle, the daemon sleeps in epoll: no CPU time over 300 ms (in clock ticks, 10 ms each).
    const long before = cpu_ticks(d);
    usleep(300 * 1000);
    EXPECT_LE(cpu_ticks(d) - before, 1) << "an idle daemon uses no CPU";
    // A second client of the same process connects to the same daemon.
    Client c2;
    ASSERT_EQ(connect_client(&c2), 0);
    EXPECT_EQ(daemon_pid(c2), d);
    EXPECT_TRUE(stop_daemon(d));
  });
}

// The slot as the engine will use it: adopted by net::UdpSocketIo (IP_PKTINFO, DF), sending to
// and receiving from its own QPNs over IPv4 and IPv6 loopback.
TEST_F(UrdmadProcess, SlotSocketServesAsTheEnginesPacketIo) {
  in_fresh_netns([] {
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    std::string error;
    auto io = net::UdpSocketIo::adopt(slot.fd.release(), &error);
    ASSERT_TRUE(io) << error;
    EXPECT_EQ(io->local().port, kPort);
    for (const char* to : {"127.0.0.1", "::1"}) {
      uint8_t bth[12] = {0x04, 0, 0xff, 0xff};
      const uint32_t qpn = slot.info.qpn_base + 77;
      bth[5] = static_cast<uint8_t>(qpn >> 16);
      bth[6] = static_cast<uint8_t>(qpn >> 8);
      bth[7] = static_cast<uint8_t>(qpn);
      const iovec iov{bth, sizeof bth};
      net::TxDatagram tx;
      tx.iov = std::span(&iov, 1);
      tx.dst = net::Endpoint{*net::Address::parse(to), kPort};
      ASSERT_EQ(io->send(tx), net::TxStatus::kSent) << to;
      std::array<uint8_t, 256> buf;
      std::array<net::RxDatagram, 1> rx{};
      rx[0].buffer = buf;
      size_t got = 0;
      for (int i = 0; i < 100 && got == 0; ++i) {
        got = io->recv_batch(rx);
        if (got == 0) usleep(2000);
      }
      ASSERT_EQ(got, 1u) << to;
      EXPECT_EQ(rx[0].length, sizeof bth);
      EXPECT_EQ(rx[0].dst, tx.dst) << "IP_PKTINFO reports the destination";
      EXPECT_EQ(rx[0].src.port, kPort) << "sent from the slot socket itself";
    }
    EXPECT_TRUE(stop_daemon(c));
  });
}

TEST_F(UrdmadProcess, ConcurrentSpawnsEndWithOneDaemonAndDistinctSlotsGetTheirOwnPackets) {
  in_fresh_netns([] {
    constexpr int kClients = 4;
    struct Report {
      pid_t daemon;
      SlotInfo info;
    };
    Pipe go, reports[kClients], results[kClients], done;
    pid_t pids[kClients];
    for (int i = 0; i < kClients; ++i) {
      pids[i] = fork_process([&, i] {
        go.close_wr();  // only the test's copies: their closing is the signal
        done.close_wr();
        char start;
        go.get(&start, 5000);  // EOF releases everyone at once: a spawn race
        Client c;
        if (connect_client(&c) != 0) return 11;
        Slot slot;
        if (c.acquire_slot(&slot) != 0) return 12;
        reports[i].put(Report{daemon_pid(c), slot.info});
        // Expect exactly the datagrams for our QPNs, tagged with our index.
        int good = 0, bad = 0;
        while (auto r = receive(slot.fd.get(), 1500)) {
          const bool mine = r->qpn >= slot.info.qpn_base &&
                            r->qpn < slot.info.qpn_base + slot.info.qpn_count &&
                            r->tag == static_cast<uint32_t>(i);
          (mine ? good : bad)++;
          if (good == 2) break;
        }
        results[i].put(good * 100 + bad);
        char end;
        done.get(&end, 5000);  // keep the slot until everyone has checked
        return 0;
      });
    }
    go.close_wr();  // releases every client at once
    std::set<pid_t> daemons;
    std::set<unsigned> slots;
    Report r[kClients];
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(reports[i].get(&r[i])) << "client " << i << " reported no slot";
      daemons.insert(r[i].daemon);
      slots.insert(r[i].info.slot);
    }
    EXPECT_EQ(daemons.size(), 1u) << "concurrent spawns end with one daemon";
    EXPECT_EQ(slots.size(), static_cast<size_t>(kClients)) << "distinct slots";
    // Two datagrams per client, to its first and last QPN, over IPv4 and IPv6 loopback.
    for (int i = 0; i < kClients; ++i) {
      send_to_qpn("127.0.0.1", r[i].info.qpn_base, static_cast<uint32_t>(i));
      send_to_qpn("::1", r[i].info.qpn_base + r[i].info.qpn_count - 1, static_cast<uint32_t>(i));
    }
    for (int i = 0; i < kClients; ++i) {
      int result = -1;
      ASSERT_TRUE(results[i].get(&result));
      EXPECT_EQ(result, 200) << "client " << i << ": 2 own datagrams, none of another's";
    }
    done.close_wr();
    for (int i = 0; i < kClients; ++i) {
      const auto status = wait_exit(pids[i], 3000);
      ASSERT_TRUE(status);
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    }
    EXPECT_TRUE(stop_daemon(*daemons.begin()));
  });
}

TEST_F(UrdmadProcess, KilledClientsSlotIsReclaimedAndAFullTableIsAnError) {
  in_fresh_netns([] {
    setenv("URDMA_SLOTS", "3", 1);  // slot 0 + two client slots
    struct Report {
      pid_t daemon;
      SlotInfo info;
    };
    auto holder = [](Pipe* report) {
      return fork_process([report] {
        Client c;
        Slot slot;
        if (connect_client(&c) != 0 || c.acquire_slot(&slot) != 0) return 1;
        // Misuse the slot the way a buggy process could: a socket filter of its own that drops
        // every datagram. The daemon must undo that before the next owner gets the socket.
        // (connect() is no test of it: the kernel takes a wildcard-bound UDP socket that connects
        // out of its reuseport group, which nothing can undo — the engine never connects.)
        sock_filter drop_all[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
        sock_fprog prog{1, drop_all};
        if (setsockopt(slot.fd.get(), SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0)
          return 2;
        report->put(Report{daemon_pid(c), slot.info});
        pause();  // hold the slot until killed
        return 0;
      });
    };
    Pipe ra, rb;
    const pid_t a = holder(&ra);
    Report a_info;
    ASSERT_TRUE(ra.get(&a_info));
    const pid_t b = holder(&rb);
    Report b_info;
    ASSERT_TRUE(rb.get(&b_info));
    EXPECT_NE(a_info.info.slot, b_info.info.slot);

    // Full: a clear error, not a hang.
    Client full;
    ASSERT_EQ(connect_client(&full), 0);
    Slot none;
    EXPECT_EQ(full.acquire_slot(&none), EBUSY);

    // kill -9 a: its connection closes, the daemon drains and frees the slot.
    ASSERT_EQ(kill(a, SIGKILL), 0);
    ASSERT_TRUE(wait_exit(a, 2000));
    // A datagram for a's dead QPN range, sent before anyone takes the slot again.
    send_to_qpn("127.0.0.1", a_info.info.qpn_base + 7, 0xdead);
    Slot again;
    int err = EBUSY;
    for (int i = 0; i < 200 && err == EBUSY; ++i) {
      err = full.acquire_slot(&again);
      if (err == EBUSY) usleep(10000);
    }
    ASSERT_EQ(err, 0) << "the dead client's slot was reclaimed";
    EXPECT_EQ(again.info.slot, a_info.info.slot);
    EXPECT_NE(again.info.qpn_base, a_info.info.qpn_base) << "not the QPN range just freed";
    EXPECT_GT(again.info.generation, a_info.info.generation);
    EXPECT_FALSE(receive(again.fd.get(), 50)) << "the stale datagram was drained";
    // The new slot works: the dead owner's filter was detached.
    send_to_qpn("127.0.0.1", again.info.qpn_base + 1, 42);
    const auto got = receive(again.fd.get(), 1000);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->qpn, again.info.qpn_base + 1);
    EXPECT_EQ(got->tag, 42u);
    kill(b, SIGKILL);
    wait_exit(b, 2000);
    EXPECT_TRUE(stop_daemon(a_info.daemon));
  });
}

// A client speaking nonsense gets an errno per record and never takes the daemon down.
TEST_F(UrdmadProcess, MalformedRequestsGetErrorsAndTheDaemonCarriesOn) {
  in_fresh_netns([] {
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    const pid_t d = daemon_pid(c);
    sockaddr_un sun;
    socklen_t len;
    ASSERT_TRUE(daemon::unix_address(c.socket_path(), &sun, &len));
    UniqueFd raw;
    auto reconnect = [&] {
      raw.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      return connect(raw.get(), reinterpret_cast<sockaddr*>(&sun), len) == 0;
    };
    // The errno a record gets (or -1: no answer in time, -2: the daemon hung up); a reply that
    // is no error counts as 0.
    auto reply_errno = [&](std::vector<uint8_t> rec, int pass_fd = -1) {
      EXPECT_EQ(daemon::send_record(
                    raw.get(), rec,
                    pass_fd >= 0 ? std::span<const int>(&pass_fd, 1) : std::span<const int>()),
                0);
      std::vector<uint8_t> buf(daemon::kMaxMessageBytes);
      pollfd p{raw.get(), POLLIN, 0};
      if (poll(&p, 1, 2000) != 1) return -1;
      const ssize_t n = daemon::recv_record(raw.get(), buf, nullptr);
      if (n <= 0) return -2;
      daemon::MsgHeader h;
      if (const int err = daemon::decode_header(std::span(buf).first(static_cast<size_t>(n)), &h))
        return err;
      return h.type == static_cast<uint16_t>(daemon::MsgType::kError) ? h.status : 0;
    };
    const UniqueFd ns(open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    auto greet = [&] {
      return reply_errno(daemon::encode_request(daemon::MsgType::kHello), ns.get());
    };
    auto good = daemon::encode_request(daemon::MsgType::kAcquireSlot);
    // Nothing before the hello: the request is refused and the connection closed.
    ASSERT_TRUE(reconnect());
    EXPECT_EQ(reply_errno(good), EPROTO);
    {
      pollfd p{raw.get(), POLLIN, 0};
      char byte;
      EXPECT_TRUE(poll(&p, 1, 2000) == 1 && recv(raw.get(), &byte, 1, MSG_DONTWAIT) == 0)
          << "closed after a request before the hello";
    }
    // A hello without the namespace, or with a file that is no namespace.
    ASSERT_TRUE(reconnect());
    EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kHello)), EPROTO);
    ASSERT_TRUE(reconnect());
    const UniqueFd not_ns(open("/proc/self/stat", O_RDONLY | O_CLOEXEC));
    EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kHello), not_ns.get()), EPROTO);
    // Another namespace's (the one this test started in, whose file /proc/1's is when we are
    // root): the daemon serves its own only.
    const UniqueFd other_ns(open("/proc/1/ns/net", O_RDONLY | O_CLOEXEC));
    if (other_ns.valid()) {
      ASSERT_TRUE(reconnect());
      EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kHello), other_ns.get()),
                EXDEV);
    }
    // Greeted, nonsense gets an errno per record.
    ASSERT_TRUE(reconnect());
    ASSERT_EQ(greet(), 0);
    EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kHello)), EALREADY);
    auto bad_magic = good;
    bad_magic[0] ^= 0xff;
    EXPECT_EQ(reply_errno(bad_magic), EPROTO);
    auto future = good;
    future[4] = 9;  // version 9
    EXPECT_EQ(reply_errno(future), EPROTONOSUPPORT);
    EXPECT_EQ(reply_errno({1, 2, 3}), EPROTO);
    EXPECT_EQ(reply_errno(daemon::encode_request(static_cast<daemon::MsgType>(77))), EPROTO);
    EXPECT_EQ(reply_errno(good, /*pass_fd=*/1), EPROTO) << "an fd with a request that takes none";
    // A record too big for the daemon's buffer ends the connection.
    EXPECT_EQ(reply_errno(std::vector<uint8_t>(daemon::kMaxMessageBytes + 100, 0)), -2);
    // The status and restart requests: bodies of the wrong size, a reattach without its fd (or
    // with a slot out of range), a counter report that is a byte short.
    ASSERT_TRUE(reconnect());
    ASSERT_EQ(greet(), 0);
    EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kQueryClients)), EPROTO);
    EXPECT_EQ(reply_errno(daemon::encode_request(daemon::MsgType::kReattach)), EPROTO);
    EXPECT_EQ(reply_errno(daemon::encode_reattach(daemon::SlotInfo{.slot = 1, .slot_count = 64})),
              EINVAL);
    EXPECT_EQ(
        reply_errno(daemon::encode_reattach(daemon::SlotInfo{.slot = 900, .slot_count = 9000}),
                    /*pass_fd=*/1),
        EINVAL);
    EXPECT_EQ(reply_errno(daemon::encode_conn_up(daemon::ConnRecord{})), EINVAL) << "no slot";
    auto report = daemon::encode_counter_report(daemon::CounterReport{});
    report.pop_back();
    const uint32_t short_size = static_cast<uint32_t>(report.size());
    std::memcpy(report.data() + 8, &short_size, sizeof short_size);
    EXPECT_EQ(reply_errno(report), EPROTO);
    // A good report gets no reply: the next reply is the next request's.
    ASSERT_EQ(
        daemon::send_record(raw.get(), daemon::encode_counter_report(daemon::CounterReport{})), 0);
    EXPECT_EQ(reply_errno(good), 0);
    // A connection that never greets is closed after the hello timeout (2 s).
    ASSERT_TRUE(reconnect());
    pollfd p{raw.get(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 5000), 1) << "a silent connection was kept";
    char byte;
    EXPECT_EQ(recv(raw.get(), &byte, 1, MSG_DONTWAIT), 0) << "closed";
    // The daemon still serves everyone.
    Slot slot;
    EXPECT_EQ(c.acquire_slot(&slot), 0);
    EXPECT_TRUE(alive(d));
    EXPECT_TRUE(stop_daemon(c));
  });
}

// The number of memberships of IPv4 group `hex` (as /proc/net/igmp prints it: 230.95.0.5 is
// "05005FE6") on every interface of this namespace.
int igmp_users(const std::string& hex) {
  std::ifstream f("/proc/net/igmp");
  std::string line;
  int users = 0;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string group;
    int n = 0;
    if (in >> group >> n && group == hex) users += n;
  }
  return users;
}

// Multicast membership requests (kMcastAttach/kMcastDetach) are another process's input: only
// the slot's own QPNs, only multicast addresses; the daemon joins the group on the slot's socket
// for the first QP and leaves it after the last, and when the slot is reclaimed.
// `urdma capture`'s request (protocol.h, kCapture): only a unix SEQPACKET socket on a
// connection that holds nothing; urdmad hands it to the holders there are (counted in the reply)
// and, ahead of its lease reply, to each that leases later; the holder's keeper gives it to its
// sink. What the holder writes there, the capturer reads.
TEST_F(UrdmadProcess, ACaptureSocketReachesEveryHolderNowAndLater) {
  in_fresh_netns([] {
    Client early;
    ASSERT_EQ(connect_client(&early), 0);
    Slot early_slot;
    ASSERT_EQ(early.acquire_slot(&early_slot), 0);
    const unsigned early_index = early_slot.info.slot;
    std::mutex mu;
    std::vector<std::pair<int, uint32_t>> got;  // (fd, slot) per push, per holder
    auto sink_for = [&](int holder) {
      return [&, holder](UniqueFd socket, uint32_t at) {
        std::lock_guard lock(mu);
        got.emplace_back(holder, at);
        // The holder writes one record; the test reads it at the capturer's end.
        const uint32_t word = 0xC0FFEE00u | static_cast<uint32_t>(holder);
        (void)send(socket.get(), &word, sizeof word, MSG_DONTWAIT | MSG_NOSIGNAL);
      };
    };
    ASSERT_EQ(early.keep(std::move(early_slot), nullptr, sink_for(1)), 0);

    Client cap;
    ASSERT_EQ(connect_client(&cap), 0);
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    uint32_t n = 99;
    EXPECT_EQ(cap.capture(daemon::kCaptureAll, udp, &n), EINVAL) << "not a unix SEQPACKET socket";
    close(udp);
    {
      // A SEQPACKET socket connected to another process's listener: urdmad would write into
      // that process with its own credentials.
      const std::string path = "/tmp/urdma_capture_victim_" + std::to_string(getpid());
      unlink(path.c_str());
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
      int ready[2];
      ASSERT_EQ(pipe(ready), 0);
      // The victim makes and listens on the socket itself: its peer credentials are its own.
      const pid_t victim = fork_process([&] {
        const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
            listen(listener, 1) != 0)
          return 1;
        (void)!write(ready[1], "r", 1);
        const int conn = accept(listener, nullptr, nullptr);
        char b;
        return conn >= 0 && recv(conn, &b, 1, 0) >= 0 ? 0 : 1;
      });
      char r;
      ASSERT_EQ(read(ready[0], &r, 1), 1);
      close(ready[0]);
      close(ready[1]);
      const int to_victim = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      ASSERT_EQ(connect(to_victim, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
      EXPECT_EQ(cap.capture(daemon::kCaptureAll, to_victim, &n), EINVAL)
          << "a socket whose peer is another process";
      close(to_victim);
      EXPECT_TRUE(wait_exit(victim, 2000));
      unlink(path.c_str());
    }
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    EXPECT_EQ(early.capture(daemon::kCaptureAll, sv[1], &n), EINVAL) << "a slot holder cannot capture";
    ASSERT_EQ(cap.capture(daemon::kCaptureAll, sv[1], &n), 0);
    EXPECT_EQ(n, 1u) << "the one holder there is";
    EXPECT_EQ(cap.capture(daemon::kCaptureAll, sv[1], &n), EALREADY);
    close(sv[1]);

    // A process that leases now has the socket before its slot.
    Client late;
    ASSERT_EQ(connect_client(&late), 0);
    Slot late_slot;
    ASSERT_EQ(late.acquire_slot(&late_slot), 0);
    const unsigned late_index = late_slot.info.slot;
    ASSERT_EQ(late.keep(std::move(late_slot), nullptr, sink_for(2)), 0);
    {
      std::lock_guard lock(mu);
      EXPECT_TRUE(std::ranges::count(got, std::pair<int, uint32_t>{2, late_index}) == 1)
          << "the late holder's push came before its keeper started";
    }
    for (int i = 0; i < 100; ++i) {
      {
        std::lock_guard lock(mu);
        if (got.size() >= 2) break;
      }
      usleep(20000);
    }
    {
      std::lock_guard lock(mu);
      EXPECT_EQ(got.size(), 2u);
      EXPECT_EQ(std::ranges::count(got, std::pair<int, uint32_t>{1, early_index}), 1);
    }
    std::set<uint32_t> words;
    for (int i = 0; i < 2; ++i) {
      uint32_t w = 0;
      pollfd p{sv[0], POLLIN, 0};
      ASSERT_EQ(poll(&p, 1, 2000), 1);
      ASSERT_EQ(recv(sv[0], &w, sizeof w, 0), 4);
      words.insert(w);
    }
    EXPECT_EQ(words, (std::set<uint32_t>{0xC0FFEE01u, 0xC0FFEE02u}));
    close(sv[0]);

    // A filter names holders by slot or by pid (both holders are this process's); anything
    // else matches nobody.
    for (const auto& [filter, expected] :
         std::vector<std::pair<uint32_t, uint32_t>>{{early_index, 1},
                                                    {static_cast<uint32_t>(getpid()), 2},
                                                    {early_index + 1000, 0}}) {
      Client other;
      ASSERT_EQ(connect_client(&other), 0);
      int pair[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
      uint32_t matched = 99;
      EXPECT_EQ(other.capture(filter, pair[1], &matched), 0);
      EXPECT_EQ(matched, expected) << "filter " << filter;
      close(pair[0]);
      close(pair[1]);
    }

    early.stop_keeping();
    late.stop_keeping();
    EXPECT_TRUE(stop_daemon(cap));
  });
}

// What a Client's ShmSink was handed, for a test to wait on.
struct ShmPushes {
  std::mutex mu;
  std::vector<daemon::ShmPush> got;
  daemon::Client::ShmSink sink() {
    return [this](daemon::ShmPush push) {
      std::lock_guard lock(mu);
      got.push_back(std::move(push));
    };
  }
  // The first push not taken yet, within 2 s.
  std::optional<daemon::ShmPush> next() {
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lock(mu);
        if (!got.empty()) {
          daemon::ShmPush p = std::move(got.front());
          got.erase(got.begin());
          return p;
        }
      }
      usleep(10000);
    }
    return std::nullopt;
  }
  size_t size() {
    std::lock_guard lock(mu);
    return got.size();
  }
};

std::string fd_link(int fd) {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec).string();
}
ino_t inode_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// Shared-memory ring pairs (protocol.h, kShmAccept / kShmConnect): urdmad makes one sealed
// region per pair of slots whose holders both accept it, for an address of its own namespace;
// the slot that asks gets it in the reply, its peer by a kShmOn push, each with the other's
// doorbell; asked again, it is the same region; when a lease ends the peer hears kShmOff.
TEST_F(UrdmadProcess, ShmPairsAreMadeForLocalSlotsOfOneUser) {
  in_fresh_netns([] {
    auto a = std::make_unique<Client>();
    Client b, never;  // `never` holds a slot and never accepts
    Slot sa, sb, sn;
    for (auto [c, s] : {std::pair{a.get(), &sa}, {&b, &sb}, {&never, &sn}}) {
      ASSERT_EQ(connect_client(c), 0);
      ASSERT_EQ(c->acquire_slot(s), 0);
    }
    const uint32_t range_a = daemon::range_of_qpn(sa.info.qpn_base);
    const uint32_t range_b = daemon::range_of_qpn(sb.info.qpn_base);
    const uint32_t qpn_a = sa.info.qpn_base + 1, qpn_b = sb.info.qpn_base + 7;
    const net::Address lo = net::Address::from_v4(127, 0, 0, 1);
    daemon::ShmPair pair;
    UniqueFd bell_a, bell_b, unused;
    EXPECT_EQ(a->shm_connect(lo, qpn_b, &pair), EINVAL) << "before its own kShmAccept";
    {
      Client holds_nothing;
      ASSERT_EQ(connect_client(&holds_nothing), 0);
      EXPECT_EQ(holds_nothing.shm_accept(&unused), EINVAL) << "no slot on the connection";
    }
    ASSERT_EQ(a->shm_accept(&bell_a), 0);
    EXPECT_EQ(fd_link(bell_a.get()), "anon_inode:[eventfd]");
    EXPECT_EQ(a->shm_accept(&unused), EALREADY);
    // B accepts from under its keeper, whose sink takes the pushes.
    ShmPushes at_a, at_b;
    ASSERT_EQ(a->keep(std::move(sa), nullptr, nullptr, at_a.sink()), 0);
    ASSERT_EQ(b.keep(std::move(sb), nullptr, nullptr, at_b.sink()), 0);
    ASSERT_EQ(b.shm_accept(&bell_b), 0);
    EXPECT_EQ(fd_link(bell_b.get()), "anon_inode:[eventfd]");

    EXPECT_EQ(a->shm_connect(net::Address::from_v4(192, 0, 2, 1), qpn_b, &pair), EADDRNOTAVAIL)
        << "not an address of this namespace";
    const uint32_t next_lease_of_b = sb.info.qpn_base + (sb.info.slot_count << daemon::kSlotShift);
    EXPECT_EQ(a->shm_connect(lo, next_lease_of_b, &pair), ENOENT) << "B's slot, not its range";
    EXPECT_EQ(a->shm_connect(lo, sn.info.qpn_base, &pair), EOPNOTSUPP)
        << "a holder that did not accept";
    EXPECT_EQ(never.shm_connect(lo, qpn_a, &pair), EINVAL) << "a caller that did not accept";
    EXPECT_EQ(a->shm_connect(lo, qpn_a, &pair), EINVAL) << "its own range";
    EXPECT_EQ(a->shm_connect(lo, 0xFFFFFF, &pair), EINVAL) << "the multicast QPN";
    EXPECT_EQ(a->shm_connect(lo, 1, &pair), EINVAL) << "QP1's range";
    EXPECT_EQ(at_b.size(), 0u) << "nothing pushed for a refused request";

    // A asks for B (reached at 127.0.0.1, IPv4-mapped): side 0, B's range, a sealed region.
    ASSERT_EQ(a->shm_connect(lo, qpn_b, &pair), 0);
    EXPECT_EQ(pair.side, 0u);
    EXPECT_EQ(pair.peer_range, range_b);
    EXPECT_EQ(pair.peer_slot, b.kept_slot()->info.slot);
    EXPECT_EQ(pair.peer_pid, static_cast<uint32_t>(getpid()));
    struct stat st {};
    ASSERT_EQ(fstat(pair.region.get(), &st), 0);
    EXPECT_EQ(static_cast<size_t>(st.st_size), net::kShmRegionBytes);
    const int seals = fcntl(pair.region.get(), F_GET_SEALS);
    EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    // B was handed the same region, side 1, with A's doorbell.
    std::optional<daemon::ShmPush> on = at_b.next();
    ASSERT_TRUE(on) << "no kShmOn at B";
    EXPECT_TRUE(on->on);
    EXPECT_EQ(on->pair.side, 1u);
    EXPECT_EQ(on->pair.peer_range, range_a);
    EXPECT_EQ(on->pair.peer_slot, a->kept_slot()->info.slot);
    EXPECT_EQ(inode_of(on->pair.region.get()), inode_of(pair.region.get())) << "one region";
    const uint64_t one = 1, two = 2;
    uint64_t rang = 0;
    ASSERT_EQ(write(on->pair.peer_doorbell.get(), &one, sizeof one), 8);
    EXPECT_EQ(read(bell_a.get(), &rang, sizeof rang), 8);
    EXPECT_EQ(rang, one) << "B's peer doorbell is A's";
    ASSERT_EQ(write(pair.peer_doorbell.get(), &two, sizeof two), 8);
    EXPECT_EQ(read(bell_b.get(), &rang, sizeof rang), 8);
    EXPECT_EQ(rang, two) << "A's peer doorbell is B's";
    // Both map it: what one writes, the other reads.
    void* map_a = mmap(nullptr, net::kShmRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       pair.region.get(), 0);
    void* map_b = mmap(nullptr, net::kShmRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       on->pair.region.get(), 0);
    ASSERT_NE(map_a, MAP_FAILED);
    ASSERT_NE(map_b, MAP_FAILED);
    static_cast<volatile uint8_t*>(map_a)[net::kShmRegionBytes - 1] = 0x5A;
    EXPECT_EQ(static_cast<volatile uint8_t*>(map_b)[net::kShmRegionBytes - 1], 0x5A);
    static_cast<volatile uint8_t*>(map_b)[0] = 0xA5;
    EXPECT_EQ(static_cast<volatile uint8_t*>(map_a)[0], 0xA5);
    munmap(map_a, net::kShmRegionBytes);
    munmap(map_b, net::kShmRegionBytes);
    EXPECT_NE(ftruncate(pair.region.get(), 4096), 0) << "sealed against shrinking";

    // Asked again from either side: the same region, each its own side, and no push. (A push to
    // A would come before B's reply, so A's next call reads it first.)
    daemon::ShmPair again;
    ASSERT_EQ(b.shm_connect(lo, qpn_a, &again), 0);
    EXPECT_EQ(again.side, 1u);
    EXPECT_EQ(again.peer_range, range_a);
    EXPECT_EQ(inode_of(again.region.get()), inode_of(pair.region.get()));
    ASSERT_EQ(a->shm_connect(lo, qpn_b, &again), 0);
    EXPECT_EQ(again.side, 0u);
    EXPECT_EQ(inode_of(again.region.get()), inode_of(pair.region.get()));
    EXPECT_EQ(at_a.size(), 0u) << "a region made once is pushed once";
    EXPECT_EQ(at_b.size(), 0u);

    // A's lease ends: B hears kShmOff with A's range, and A's range is nobody's.
    a.reset();
    std::optional<daemon::ShmPush> off = at_b.next();
    ASSERT_TRUE(off) << "no kShmOff at B";
    EXPECT_FALSE(off->on);
    EXPECT_EQ(off->pair.peer_range, range_a);
    EXPECT_FALSE(off->pair.region.valid());
    EXPECT_EQ(b.shm_connect(lo, qpn_a, &again), ENOENT);
    b.stop_keeping();
    EXPECT_TRUE(stop_daemon(never));
  });
}

TEST_F(UrdmadProcess, MulticastMembershipsAreTheSlotsOwnAndGoWithIt) {
  in_fresh_netns([] {
    ASSERT_TRUE(add_local_veth("mc", "10.95.0.1/24"));
    const std::string kHex = "05005FE6";  // 230.95.0.5
    const net::Address group = net::Address::from_v4(230, 95, 0, 5);
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    EXPECT_EQ(c.mcast_attach(0x1000, group), EINVAL) << "no slot yet";
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    const uint32_t q = slot.info.qpn_base + 1;
    EXPECT_EQ(c.mcast_attach(slot.info.qpn_base + slot.info.qpn_count, group), EINVAL)
        << "a QPN of another slot";
    EXPECT_EQ(c.mcast_attach(q, net::Address::from_v4(10, 95, 0, 1)), EINVAL) << "not a group";
    EXPECT_EQ(c.mcast_detach(q, group), ENOENT);
    EXPECT_EQ(igmp_users(kHex), 0);
    ASSERT_EQ(c.mcast_attach(q, group), 0);
    ASSERT_EQ(c.mcast_attach(q + 1, group), 0);
    ASSERT_EQ(c.mcast_attach(q + 1, group), 0) << "again: nothing changes";
    EXPECT_EQ(igmp_users(kHex), 1) << "joined once, on mc0 (loopback has no IPv4 GID besides "
                                      "127.0.0.1, which is not joined while mc0 exists)";
    ASSERT_EQ(c.mcast_detach(q, group), 0);
    EXPECT_EQ(igmp_users(kHex), 1) << "q + 1 is still attached";
    ASSERT_EQ(c.mcast_detach(q + 1, group), 0);
    EXPECT_EQ(igmp_users(kHex), 0) << "the last QP left";
    // A second process's slot joins on its own socket; a slot's groups go when it is reclaimed.
    ASSERT_EQ(c.mcast_attach(q, group), 0);
    Pipe done;
    const pid_t other = fork_process([&] {
      Client o;
      Slot s;
      if (connect_client(&o) != 0 || o.acquire_slot(&s) != 0) return 1;
      if (o.mcast_attach(s.info.qpn_base + 1, group) != 0) return 2;
      done.put('j');
      pause();  // killed below
      return 0;
    });
    char ch;
    ASSERT_TRUE(done.get(&ch, 10000));
    EXPECT_EQ(igmp_users(kHex), 2);
    kill(other, SIGKILL);
    wait_exit(other, 2000);
    bool left = false;
    for (int i = 0; i < 100 && !left; ++i) {
      left = igmp_users(kHex) == 1;
      if (!left) usleep(20000);
    }
    EXPECT_TRUE(left) << "the killed process's membership went with its slot";
    const pid_t d = daemon_pid(c);
    EXPECT_TRUE(alive(d));
    EXPECT_TRUE(stop_daemon(c));
  });
}

// The UDP sockets of this process bound to `port` (its slot sockets).
int sockets_on_port(uint16_t port) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_DGRAM) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    const uint16_t p = ss.ss_family == AF_INET6
                           ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    n += p == port;
  }
  return n;
}

// If urdmad dies, established data paths keep working (DESIGN.md): the kernel compacts a
// reuseport group when a socket closes (the last one moves into the hole), so the group must
// outlive the daemon — its keeper holds it, and no client ever does: a lease is one socket.
TEST_F(UrdmadProcess, SteeringSurvivesTheDaemonsDeathAndARestartedDaemonTakesOver) {
  in_fresh_netns([] {
    setenv("URDMA_SLOTS", "8", 1);
    setenv("URDMA_TAKEOVER_GRACE_MS", "300", 1);
    constexpr int kClients = 3;
    Client c[kClients];
    Slot slot[kClients];
    for (int i = 0; i < kClients; ++i) {
      ASSERT_EQ(connect_client(&c[i]), 0);
      ASSERT_EQ(c[i].acquire_slot(&slot[i]), 0);
    }
    EXPECT_EQ(sockets_on_port(kPort), kClients) << "each lease is its slot's socket alone";
    const pid_t d = daemon_pid(c[0]);
    const pid_t keeper = keeper_pid(c[0]);
    ASSERT_EQ(kill(d, SIGKILL), 0);
    ASSERT_TRUE(wait_exit(d, 2000));
    auto check_steering = [&](const char* when) {
      // From several source ports (a hash fallback would scatter them) to every client.
      for (int round = 0; round < 8; ++round) {
        for (int i = 0; i < kClients; ++i) {
          send_to_qpn("127.0.0.1", slot[i].info.qpn_base + round, static_cast<uint32_t>(i));
          const auto got = receive(slot[i].fd.get(), 500);
          ASSERT_TRUE(got) << "slot " << slot[i].info.slot << " lost its QPNs (round " << round
                           << ", " << when << ")";
          EXPECT_EQ(got->tag, static_cast<uint32_t>(i));
        }
      }
    };
    check_steering("the daemon killed");
    // The keeper started another daemon; connections made meanwhile wait for it. A new client's
    // lease waits for the survivors.
    Client late;
    ASSERT_EQ(connect_client(&late), 0);
    const pid_t d2 = daemon_pid(late);
    ASSERT_NE(d2, d);
    EXPECT_EQ(keeper_pid(late), keeper) << "the same keeper";
    Slot late_slot;
    const pid_t leaser = fork_process([&] { return late.acquire_slot(&late_slot) == 0 ? 0 : 1; });
    // A slot is proved by its own socket: another slot's socket, or a socket of no group, is
    // refused.
    {
      Client bad;
      ASSERT_EQ(connect_client(&bad), 0);
      Slot wrong;
      wrong.info = slot[0].info;
      wrong.fd.reset(dup(slot[1].fd.get()));
      EXPECT_EQ(bad.reattach(wrong), EINVAL) << "slot 1's socket named as slot 0's";
      wrong.fd.reset(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      EXPECT_EQ(bad.reattach(wrong), EINVAL) << "a socket of no group";
    }
    // The survivors hand their slots back, each on a new connection (what Client::keep does).
    Client again[kClients];
    for (int i = 0; i < kClients; ++i) {
      ASSERT_EQ(connect_client(&again[i]), 0);
      EXPECT_EQ(again[i].reattach(slot[i]), 0) << "survivor " << i;
    }
    EXPECT_EQ(again[0].reattach(slot[0]), EALREADY);
    {
      Client dup_owner;
      ASSERT_EQ(connect_client(&dup_owner), 0);
      EXPECT_EQ(dup_owner.reattach(slot[1]), EBUSY) << "slot 1 is reattached already";
    }
    const auto leased = wait_exit(leaser, 6000);
    ASSERT_TRUE(leased);
    EXPECT_TRUE(WIFEXITED(*leased) && WEXITSTATUS(*leased) == 0) << "the late lease failed";
    // The daemon lists the survivors as reattached, with their slots and ranges.
    daemon::ClientsPage page{};
    std::vector<daemon::ClientEntry> clients;
    ASSERT_EQ(late.query_clients(&page, &clients), 0);
    EXPECT_EQ(page.survivors, static_cast<uint32_t>(kClients));
    EXPECT_EQ(page.takeover, daemon::kTakeoverDone);
    EXPECT_EQ(page.restarts, 1u);
    EXPECT_EQ(page.keeper_pid, static_cast<uint32_t>(keeper));
    int reattached = 0;
    for (const auto& e : clients) {
      if (!(e.flags & daemon::kClientReattached)) continue;
      ++reattached;
      bool known = false;
      for (int i = 0; i < kClients; ++i)
        known |= e.slot == slot[i].info.slot && e.qpn_base == slot[i].info.qpn_base;
      EXPECT_TRUE(known) << "slot " << e.slot;
    }
    EXPECT_EQ(reattached, kClients);
    // The steering is still right, and a new process gets a slot of its own that works.
    check_steering("after the takeover");
    Client fresh;
    ASSERT_EQ(connect_client(&fresh), 0);
    Slot fresh_slot;
    ASSERT_EQ(fresh.acquire_slot(&fresh_slot), 0);
    for (int i = 0; i < kClients; ++i) EXPECT_NE(fresh_slot.info.slot, slot[i].info.slot);
    send_to_qpn("127.0.0.1", fresh_slot.info.qpn_base + 1, 42);
    const auto got = receive(fresh_slot.fd.get(), 1000);
    ASSERT_TRUE(got) << "the new slot " << fresh_slot.info.slot << " receives nothing";
    EXPECT_EQ(got->tag, 42u);
    EXPECT_TRUE(stop_daemon(late));
  });
}

TEST_F(UrdmadProcess, AKeptSlotIsReattachedWithItsListensWhenTheDaemonIsKilled) {
  in_fresh_netns([] {
    setenv("URDMA_TAKEOVER_GRACE_MS", "200", 1);
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    const unsigned my_slot = slot.info.slot;
    const uint32_t my_qpn = slot.info.qpn_base + 3;
    constexpr uint64_t kService = 0x0106000000004242ull;
    ASSERT_EQ(c.listen(kService), 0);
    const int fd = dup(slot.fd.get());
    ASSERT_EQ(c.keep(std::move(slot),
                     [] {
                       daemon::CounterReport r{};
                       r.counters[0] = 5;
                       return r;
                     }),
              0);
    const pid_t d = daemon_pid(c);
    ASSERT_EQ(kill(d, SIGKILL), 0);
    ASSERT_TRUE(wait_exit(d, 2000));
    // urdmad's keeper starts a daemon; the client's keeper thread reattaches (bounded wait).
    for (int i = 0; i < 200 && c.reattachments() == 0; ++i) usleep(20000);
    ASSERT_EQ(c.reattachments(), 1u) << "the keeper did not reattach the slot";
    const pid_t d2 = daemon_pid(c);
    EXPECT_NE(d2, d);
    // The slot, its QPNs and its listen are the process's again: another process cannot take
    // the service, a new lease gets another slot, and the slot's QPNs still arrive.
    Client other;
    ASSERT_EQ(connect_client(&other), 0);
    Slot other_slot;
    ASSERT_EQ(other.acquire_slot(&other_slot), 0);
    EXPECT_NE(other_slot.info.slot, my_slot);
    EXPECT_EQ(other.listen(kService), EADDRINUSE) << "the listen was registered again";
    send_to_qpn("127.0.0.1", my_qpn, 9);
    const auto got = receive(fd, 1000);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->tag, 9u);
    // Calls on the kept connection go to the new daemon; the counters come (about 1/s).
    daemon::ClientsPage page{};
    std::vector<daemon::ClientEntry> clients;
    bool reported = false;
    for (int i = 0; i < 40 && !reported; ++i) {
      ASSERT_EQ(c.query_clients(&page, &clients), 0);
      for (const auto& e : clients)
        reported |= e.slot == my_slot && (e.flags & daemon::kClientReattached) &&
                    (e.flags & daemon::kClientReported) && e.report.counters[0] == 5;
      if (!reported) usleep(100000);
    }
    EXPECT_TRUE(reported) << "no counter report from the kept slot";
    close(fd);
    c.stop_keeping();
    EXPECT_TRUE(stop_daemon(other));
  });
}

// Runs `urdmad ARGS...`, returns (exit status, stdout + stderr).
std::pair<int, std::string> run_urdmad(std::vector<const char*> args) {
  Pipe out;
  const pid_t pid = fork_process([&] {
    dup2(out.wr, 1);
    dup2(out.wr, 2);
    args.insert(args.begin(), "urdmad");
    args.push_back(nullptr);
    execv(URDMA_DAEMON_PATH, const_cast<char* const*>(args.data()));
    return 127;
  });
  out.close_wr();
  std::string text;
  char ch;
  while (out.get(&ch, 1, 3000)) text += ch;
  const auto status = wait_exit(pid, 3000);
  return {status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, text};
}

TEST_F(UrdmadProcess, StatusShowsLeasesAndTheGidTable) {
  in_fresh_netns([] {
    auto [rc, text] = run_urdmad({"--status"});
    EXPECT_EQ(rc, 1);
    EXPECT_NE(text.find("not running in this network namespace"), std::string::npos) << text;
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    std::tie(rc, text) = run_urdmad({"--status"});
    EXPECT_EQ(rc, 0) << text;
    EXPECT_NE(text.find("slots: 1 of 63 leased"), std::string::npos) << text;
    EXPECT_NE(text.find("UDP port 4791"), std::string::npos) << text;
    EXPECT_NE(text.find("127.0.0.1/8  lo"), std::string::npos) << text;
    EXPECT_TRUE(stop_daemon(c));
  });
}

TEST_F(UrdmadProcess, SecondDaemonExitsWithAClearError) {
  in_fresh_netns([] {
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    const pid_t d = daemon_pid(c);
    Pipe err;
    const pid_t second = fork_process([&] {
      dup2(err.wr, 2);
      execl(URDMA_DAEMON_PATH, "urdmad", "--foreground", static_cast<char*>(nullptr));
      return 127;
    });
    err.close_wr();
    const auto status = wait_exit(second, 3000);
    ASSERT_TRUE(status) << "the second daemon did not exit";
    EXPECT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 3);
    std::string text;
    char ch;
    while (err.get(&ch, 1, 100)) text += ch;
    EXPECT_NE(text.find("another urdmad already serves this network namespace"), std::string::npos)
        << text;
    EXPECT_TRUE(alive(d)) << "the first daemon is unaffected";
    Slot slot;
    EXPECT_EQ(c.acquire_slot(&slot), 0);
    EXPECT_TRUE(stop_daemon(d));
  });
}

TEST_F(UrdmadProcess, DaemonRefusesAPortSharedWithAnEarlierGroup) {
  in_fresh_netns([] {
    // A process still holding a slot socket of an earlier urdmad whose keeper died too: same
    // uid, SO_REUSEPORT, the port. A new group would join it and every steering index would
    // shift by one.
    UniqueFd stale(socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    const int one = 1, zero = 0;
    ASSERT_EQ(setsockopt(stale.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one), 0);
    ASSERT_EQ(setsockopt(stale.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero), 0);
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(kPort);
    ASSERT_EQ(bind(stale.get(), reinterpret_cast<sockaddr*>(&sin6), sizeof sin6), 0);
    // The daemon does not start, and says who holds the port.
    Client c;
    std::string detail;
    EXPECT_EQ(Client::connect_or_spawn({}, &c, &detail), EADDRNOTAVAIL)
        << "a clear error, not a silently shifted group: " << detail;
    EXPECT_NE(detail.find("UDP port 4791 of this network namespace is held by uid "),
              std::string::npos)
        << detail;
    // Once the port is free, a daemon opens a group of its own.
    stale.reset();
    ASSERT_EQ(connect_client(&c), 0);
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    send_to_qpn("127.0.0.1", slot.info.qpn_base + 5, 7);
    const auto got = receive(slot.fd.get(), 1000);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->tag, 7u);
    EXPECT_TRUE(stop_daemon(c));
  });
}

// Without a system daemon, one user's urdmad serves a namespace. Another user does not reach it
// (its socket is in root's own directory), and their own daemon cannot start: the error says
// whose daemon holds the port and how to serve every user.
TEST_F(UrdmadProcess, ASecondUserIsToldWhoseDaemonHoldsThePort) {
  in_fresh_netns([] {
    if (!real_root()) skip_test("not root (a user namespace maps one uid): no other uid to try");
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    const pid_t d = daemon_pid(c);
    Pipe why;
    const pid_t other = fork_process([&] {
      if (setgid(65534) != 0 || setuid(65534) != 0) return 10;
      unsetenv("XDG_RUNTIME_DIR");
      Client n;
      std::string detail;
      const int err = Client::connect_or_spawn({}, &n, &detail);
      why.put(detail.data(), std::min<size_t>(detail.size(), 512));
      return err == EADDRNOTAVAIL ? 0 : 12;
    });
    why.close_wr();
    const auto status = wait_exit(other, 10000);
    ASSERT_TRUE(status) << "the other user's client hung";
    std::string text;
    char ch;
    while (why.get(&ch, 1, 100)) text += ch;
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << text;
    EXPECT_NE(text.find("held by uid 0 (root)"), std::string::npos) << text;
    EXPECT_NE(text.find("systemctl enable --now urdmad.socket"), std::string::npos) << text;
    EXPECT_TRUE(alive(d)) << "root's daemon is unaffected";
    Slot slot;
    EXPECT_EQ(c.acquire_slot(&slot), 0);
    EXPECT_TRUE(stop_daemon(c));
  });
}

TEST_F(UrdmadProcess, DaemonExitsWhenIdle) {
  in_fresh_netns([] {
    setenv("URDMA_IDLE_TIMEOUT_MS", "300", 1);
    pid_t d, keeper;
    {
      Client c;
      ASSERT_EQ(connect_client(&c), 0);
      d = daemon_pid(c);
      keeper = keeper_pid(c);
      usleep(600 * 1000);
      EXPECT_TRUE(alive(d)) << "no idle exit while a client is connected";
    }
    // The daemon idles out, and its keeper with it (no restart).
    const auto status = wait_exit(keeper, 3000);
    ASSERT_TRUE(status) << "urdmad did not exit after 300 ms without clients";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_FALSE(alive(d));
    // And the next client starts a new one.
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    EXPECT_NE(daemon_pid(c), d);
  });
}

// Clients that arrive just as the daemon idles out: each one still ends up with a daemon (the
// exiting one, or a new one it starts), never with an error.
TEST_F(UrdmadProcess, ClientsArrivingAsTheDaemonIdlesOutAlwaysGetOne) {
  in_fresh_netns([] {
    setenv("URDMA_IDLE_TIMEOUT_MS", "20", 1);
    std::set<pid_t> daemons;
    for (int i = 0; i < 40; ++i) {
      {
        Client c;
        ASSERT_EQ(connect_client(&c), 0) << "round " << i;
        Slot slot;
        ASSERT_EQ(c.acquire_slot(&slot), 0) << "round " << i;
        daemons.insert(daemon_pid(c));
      }
      usleep(static_cast<useconds_t>(15000 + (i * 7919) % 10000));  // 15-25 ms: around 20
    }
    EXPECT_GT(daemons.size(), 1u) << "the daemon idled out at least once";
  });
}

// A GMP with one CM MAD (send_datagram seals its ICRC again for the flow it leaves on).
template <class View, class Fill>
std::vector<uint8_t> cm_datagram(Fill fill) {
  std::array<uint8_t, wire::kMadSize> mad{};
  fill(wire::init_cm_message<View>(mad, 0x77));
  std::vector<uint8_t> d(gsi::kGmpBytes);
  const net::Endpoint lo{net::Address::from_v4(127, 0, 0, 1), kPort};
  gsi::build_gmp(std::span<uint8_t, gsi::kGmpBytes>(d), mad, 0, lo, lo);
  return d;
}

// Sends `d` from 127.0.0.1 to addr:4791 with its ICRC sealed for that flow (urdmad checks it
// before anything else), or, with `break_icrc`, with one bit of it flipped.
void send_datagram(const char* addr, std::span<const uint8_t> d, bool break_icrc = false) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(kPort);
  ASSERT_EQ(inet_pton(AF_INET, addr, &sin.sin_addr), 1);
  UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof from;
  ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  ASSERT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&from), &len), 0);
  std::vector<uint8_t> sealed(d.begin(), d.end());
  const auto v4 = [](const sockaddr_in& a) {
    const uint32_t h = ntohl(a.sin_addr.s_addr);
    return net::Address::from_v4(static_cast<uint8_t>(h >> 24), static_cast<uint8_t>(h >> 16),
                                 static_cast<uint8_t>(h >> 8), static_cast<uint8_t>(h));
  };
  net::seal_icrc(sealed, {v4(from), ntohs(from.sin_port)}, {v4(sin), kPort});
  if (break_icrc) sealed.back() ^= 1;
  ASSERT_EQ(sendto(fd.get(), sealed.data(), sealed.size(), 0, reinterpret_cast<sockaddr*>(&sin),
                   sizeof sin),
            static_cast<ssize_t>(sealed.size()));
}

std::optional<std::vector<uint8_t>> next_mad_within(Client& channel, daemon::MadDelivery* info,
                                                    int timeout_ms) {
  pollfd p{channel.fd(), POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return std::nullopt;
  std::vector<uint8_t> d;
  if (channel.next_mad(info, &d) != 0) return std::nullopt;
  return d;
}

// Slot 0 receives every datagram to QP1; the daemon hands each CM MAD to its process.
TEST_F(UrdmadProcess, CmMadsReachTheProcessTheyBelongTo) {
  in_fresh_netns([] {
    Client c, channel;
    ASSERT_EQ(connect_client(&c), 0);
    Slot slot;
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    ASSERT_EQ(connect_client(&channel), 0);
    EXPECT_EQ(channel.open_mad_channel(slot.info.slot), 0);
    EXPECT_EQ(c.listen(0x1234), 0);
    // Another process can neither take the service nor our channel.
    const unsigned ours = slot.info.slot;
    const pid_t other = fork_process([ours] {
      Client o, ch;
      Slot s;
      if (connect_client(&o) != 0 || o.acquire_slot(&s) != 0) return 1;
      if (o.listen(0x1234) != EADDRINUSE) return 2;
      if (connect_client(&ch) != 0 || ch.open_mad_channel(ours) != EPERM) return 3;
      return 0;
    });
    const auto status = wait_exit(other, 5000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << WEXITSTATUS(*status);

    daemon::MadDelivery info;
    const auto req = cm_datagram<wire::CmReq>([](wire::CmReq m) {
      m.set_service_id(0x1234);
      m.set_local_comm_id(0xAB000001);
    });
    // The same bytes but for the ICRC, which send_datagram sealed.
    const auto same = [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
      return a.size() == b.size() && a.size() > 4 && std::equal(a.begin(), a.end() - 4, b.begin());
    };
    // A REQ whose ICRC does not hold has no effect at all: not forwarded, not remembered.
    send_datagram("127.0.0.1", req, /*break_icrc=*/true);
    EXPECT_FALSE(next_mad_within(channel, &info, 200)) << "a REQ with a bad ICRC was forwarded";
    send_datagram("127.0.0.1", req);
    auto got = next_mad_within(channel, &info, 2000);
    ASSERT_TRUE(got) << "the REQ for our service";
    EXPECT_TRUE(same(*got, req));
    EXPECT_EQ(info.dst_port, kPort);
    EXPECT_EQ(net::Address(std::to_array(info.dst_address)), net::Address::from_v4(127, 0, 0, 1));

    const auto rep = cm_datagram<wire::CmRep>([&](wire::CmRep m) {
      m.set_local_comm_id(0xAB000002);
      m.set_remote_comm_id(daemon::comm_id_for_slot(slot.info.slot, 5));
    });
    send_datagram("127.0.0.1", rep);
    got = next_mad_within(channel, &info, 2000);
    ASSERT_TRUE(got) << "the REP to our communication ID";
    EXPECT_TRUE(same(*got, rep));

    // The requester gives up before hearing our ID: its REJ (timeout, RemoteCommID 0) names
    // only its own, and goes where its REQ went — once; another of its IDs goes nowhere.
    const auto rej_of = [](uint32_t requester_id) {
      return cm_datagram<wire::CmRej>([requester_id](wire::CmRej m) {
        m.set_local_comm_id(requester_id);
        m.set_remote_comm_id(0);
        m.set_reason(static_cast<uint16_t>(wire::CmRejReason::kTimeout));
      });
    };
    send_datagram("127.0.0.1", rej_of(0xAB000001));
    got = next_mad_within(channel, &info, 2000);
    ASSERT_TRUE(got) << "the REJ of the requester whose REQ we got";
    EXPECT_TRUE(same(*got, rej_of(0xAB000001)));
    send_datagram("127.0.0.1", rej_of(0xAB000001));
    send_datagram("127.0.0.1", rej_of(0xAB0000FF));

    // Nobody's: a REQ for an unknown service waits for a listener (the listen wait, counted;
    // nobody binds it here), an RTU for a slot nobody holds is dropped and counted.
    send_datagram("127.0.0.1",
                  cm_datagram<wire::CmReq>([](wire::CmReq m) { m.set_service_id(0x9999); }));
    send_datagram("127.0.0.1", cm_datagram<wire::CmRtu>([](wire::CmRtu m) {
                    m.set_remote_comm_id(daemon::comm_id_for_slot(60, 1));
                  }));
    EXPECT_FALSE(next_mad_within(channel, &info, 100));
    Client q;
    ASSERT_EQ(connect_client(&q), 0);
    daemon::StatusInfo st;
    ASSERT_EQ(q.query_status(&st), 0);
    EXPECT_EQ(st.mads_forwarded, 3u);
    EXPECT_GE(st.mads_dropped, 4u);  // the bad ICRC, the repeated REJ, the stray REJ, the RTU
    EXPECT_EQ(st.cm_requests_waited, 1u);
    // Unlisten frees the service (so does the end of the process's connection).
    EXPECT_EQ(c.unlisten(0x1234), 0);
    EXPECT_EQ(c.unlisten(0x1234), ENOENT);
    EXPECT_TRUE(stop_daemon(c));
  });
}

TEST_F(UrdmadProcess, GidTableFollowsAddressChanges) {
  in_fresh_netns([] {
    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    const pid_t d = daemon_pid(c);
    auto has = [&](const char* addr) {
      std::vector<daemon::GidEntry> gids;
      EXPECT_EQ(c.query_gids(&gids), 0);
      for (const auto& g : gids)
        if (g.gid.to_string() == addr) return true;
      return false;
    };
    auto eventually = [&](const char* addr, bool present) {
      for (int i = 0; i < 200; ++i) {
        if (has(addr) == present) return true;
        usleep(10000);
      }
      return false;
    };
    ASSERT_FALSE(has("10.77.0.1"));
    // A watcher (its own connection) is told of every change without asking.
    Client watcher;
    ASSERT_EQ(connect_client(&watcher), 0);
    std::vector<daemon::GidEntry> watched;
    ASSERT_EQ(watcher.watch_gids(&watched), 0);
    EXPECT_FALSE(watched.empty());
    EXPECT_EQ(watcher.next_gid_update(&watched), EAGAIN) << "no change yet";
    Slot unused;
    EXPECT_EQ(watcher.acquire_slot(&unused), EBUSY) << "a watching connection only watches";
    auto watched_has = [&](const char* addr) {
      // Updates arrive as the kernel reports each address; take them until `addr` shows.
      for (int i = 0; i < 50; ++i) {
        pollfd p{watcher.fd(), POLLIN, 0};
        if (poll(&p, 1, 100) == 1 && watcher.next_gid_update(&watched) == 0) {
          for (const auto& g : watched)
            if (g.gid.to_string() == addr) return true;
        }
      }
      return false;
    };
    // A veth interface where the kernel has veth; loopback otherwise (same netlink messages).
    const bool veth = std::system("ip link add va type veth peer name vb 2>/dev/null") == 0;
    const std::string dev = veth ? "va" : "lo";
    ASSERT_TRUE(sh("ip addr add 10.77.0.1/24 dev " + dev));
    EXPECT_TRUE(eventually("10.77.0.1", true));
    EXPECT_TRUE(watched_has("10.77.0.1")) << "the watcher was told";
    ASSERT_TRUE(sh("ip addr del 10.77.0.1/24 dev " + dev));
    EXPECT_TRUE(eventually("10.77.0.1", false));
    // IPv6 without choosing an address (the tests use 10.x only): the link-local address the
    // kernel gives va when it comes up (DAD off, so it is usable at once), gone with the link.
    if (veth && std::ofstream("/proc/sys/net/ipv6/conf/va/accept_dad") << "0") {
      const unsigned va = if_nametoindex("va");
      auto link_local_on_va = [&] {
        std::vector<daemon::GidEntry> gids;
        EXPECT_EQ(c.query_gids(&gids), 0);
        for (const auto& g : gids)
          if (g.ifindex == va && g.gid.to_string().starts_with("fe80:")) return true;
        return false;
      };
      auto eventually_ll = [&](bool present) {
        for (int i = 0; i < 200; ++i) {
          if (link_local_on_va() == present) return true;
          usleep(10000);
        }
        return false;
      };
      ASSERT_TRUE(sh("ip link set vb up && ip link set va up"));
      EXPECT_TRUE(eventually_ll(true)) << "va's IPv6 link-local GID appears";
      ASSERT_TRUE(sh("ip link del va"));
      EXPECT_TRUE(eventually_ll(false)) << "and goes with the interface";
    } else {
      std::printf("no veth or no IPv6 here: IPv6 GID updates not exercised\n");
    }
    EXPECT_TRUE(has("127.0.0.1"));
    EXPECT_TRUE(stop_daemon(d));
  });
}

struct SeenAtB {
  uint32_t qpn;
  uint32_t tag;
  char from[INET6_ADDRSTRLEN];
};

TEST_F(UrdmadProcess, TwoNamespacesOverAVethPair) {
  in_fresh_netns([] {
    // Host A is this namespace; host B is a child in a namespace of its own. A sends to a QPN of
    // B's process over 10.88.0.0/24 (IPv6 across namespaces is left out: the tests use 10.x
    // addresses only); B answers from its slot socket to the QPN A named in the tag.
    Pipe a_done, b_slot, b_got;
    const pid_t b = start_second_host("va", "vb", "10.88.0", [&] {
      a_done.close_wr();  // only A's copy: its closing means A is done
      Client c;
      Slot slot;
      if (connect_client(&c) != 0 || c.acquire_slot(&slot) != 0) return 13;
      b_slot.put(slot.info);
      const auto r = receive(slot.fd.get(), 5000);
      if (!r) return 14;
      SeenAtB seen{r->qpn, r->tag, {}};
      std::strncpy(seen.from, r->from.c_str(), sizeof seen.from - 1);
      b_got.put(seen);
      send_to_qpn(r->from.c_str(), r->tag, 0xB0B, slot.fd.get());
      char end;
      a_done.get(&end, 5000);  // until A is done
      return ::testing::Test::HasFailure() ? 15 : 0;
    });
    Client c;
    Slot slot;
    ASSERT_EQ(connect_client(&c), 0);
    ASSERT_EQ(c.acquire_slot(&slot), 0);
    SlotInfo b_info;
    ASSERT_TRUE(b_slot.get(&b_info));
    // The first packet may wait for ARP; the veth is up on both ends.
    send_to_qpn("10.88.0.2", b_info.qpn_base + 9, slot.info.qpn_base + 3, slot.fd.get());
    SeenAtB at_b;
    ASSERT_TRUE(b_got.get(&at_b)) << "B received nothing";
    EXPECT_EQ(at_b.qpn, b_info.qpn_base + 9);
    EXPECT_STREQ(at_b.from, "::ffff:10.88.0.1");
    const auto at_a = receive(slot.fd.get(), 3000);
    ASSERT_TRUE(at_a) << "A received nothing back";
    EXPECT_EQ(at_a->qpn, slot.info.qpn_base + 3);
    EXPECT_EQ(at_a->tag, 0xB0Bu);
    EXPECT_EQ(at_a->from, "::ffff:10.88.0.2");
    a_done.close_wr();
    const auto status = wait_exit(b, 3000);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "host B exit " << WEXITSTATUS(*status);
    EXPECT_TRUE(stop_daemon(c));
  });
}


// What dead network namespaces left in the runtime directory (daemon/view_sweep.h): the keeper
// removes it when it starts, keeps a namespace a process still holds, leaves a planted link and
// another user's directory alone, writes a few files for its own view, and removes its own
// view when it ends with nothing else in its namespace.
TEST_F(UrdmadProcess, TheKeeperRemovesWhatDeadNamespacesLeftAndKeepsTheRest) {
  in_fresh_netns([] {
    namespace fs = std::filesystem;
    char tmpl[] = "/tmp/urdma_sweep_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const fs::path dir = tmpl;
    setenv("URDMA_RUNTIME_DIR", tmpl, 1);
    auto view = [&](uint64_t ns) { return dir / ("view-" + std::to_string(ns)); };
    auto plant = [&](uint64_t ns) {
      for (const char* sub : {"gids", "types", "ndevs"}) fs::create_directories(view(ns) / sub);
      for (int i = 0; i < 1024; ++i)
        std::ofstream(view(ns) / "gids" / std::to_string(i)) << "0000:0000:0000:0000:0000:0000:0000:0000\n";
      std::ofstream(dir / ("net-" + std::to_string(ns) + ".lock"));
    };
    // A namespace held by a process; two that no longer exist (nsfs numbers start at 2^32 - 2^28).
    Pipe held, release;
    const pid_t holder = fork_process([&] {
      release.close_wr();
      struct stat st;
      if (unshare(CLONE_NEWNET) != 0 || stat("/proc/self/ns/net", &st) != 0) return 1;
      held.put(uint64_t{st.st_ino});
      char c;
      release.get(&c, 20000);
      return 0;
    });
    release.close_rd();
    uint64_t live = 0;
    ASSERT_TRUE(held.get(&live));
    plant(live);
    plant(12345);
    plant(12346);
    const fs::path precious = dir / "elsewhere";
    fs::create_directories(precious / "gids");
    std::ofstream(precious / "gids/0") << "precious\n";
    fs::create_directory_symlink(precious, view(12347));
    if (real_root()) {
      fs::create_directories(view(12348) / "gids");
      ASSERT_EQ(chown(view(12348).c_str(), 65534, 65534), 0);
    }

    Client c;
    ASSERT_EQ(connect_client(&c), 0);
    // The keeper sweeps while its daemon serves: the lock file goes last.
    for (int i = 0; i < 100 && fs::exists(dir / "net-12346.lock"); ++i) usleep(50 * 1000);
    for (uint64_t dead : {12345, 12346}) {
      EXPECT_FALSE(fs::exists(view(dead))) << dead;
      EXPECT_FALSE(fs::exists(dir / ("net-" + std::to_string(dead) + ".lock"))) << dead;
    }
    EXPECT_EQ(std::distance(fs::directory_iterator(view(live) / "gids"), {}), 1024)
        << "a namespace a process is in keeps its view";
    EXPECT_TRUE(fs::is_symlink(view(12347)));
    EXPECT_TRUE(fs::exists(precious / "gids/0")) << "the link was followed";
    if (real_root()) {
      EXPECT_TRUE(fs::exists(view(12348) / "gids"));
    }
    // Our own view: a file per GID and its type and netdev, not one per index.
    std::vector<daemon::GidEntry> gids;
    ASSERT_EQ(c.query_gids(&gids), 0);
    uint32_t top = 0;
    for (const auto& g : gids) top = std::max(top, g.index + 1);
    const fs::path own = view(daemon::netns_inode());
    auto files = [](const fs::path& p) { return std::distance(fs::directory_iterator(p), {}); };
    EXPECT_EQ(files(own / "gids"), static_cast<long>(top));
    EXPECT_EQ(files(own / "types"), static_cast<long>(gids.size()));
    EXPECT_EQ(files(own / "ndevs"), static_cast<long>(gids.size()));
    EXPECT_TRUE(stop_daemon(c));
    EXPECT_TRUE(fs::exists(own / "gids")) << "this namespace still has processes";

    // A keeper that ends with nothing else in its namespace takes its view with it.
    Pipe spawned;
    const pid_t starter = fork_process([&] {
      Client other;
      if (unshare(CLONE_NEWNET) != 0 || !link_up("lo") || connect_client(&other) != 0) return 1;
      spawned.put(std::pair<uint64_t, pid_t>(daemon::netns_inode(), keeper_pid(other)));
      return 0;
    });
    std::pair<uint64_t, pid_t> other{};
    ASSERT_TRUE(spawned.get(&other));
    ASSERT_TRUE(wait_exit(starter, 5000));
    EXPECT_TRUE(fs::exists(view(other.first) / "gids"));
    EXPECT_TRUE(stop_keeper(other.second));
    EXPECT_FALSE(fs::exists(view(other.first)));
    EXPECT_FALSE(fs::exists(dir / ("net-" + std::to_string(other.first) + ".sock")));
    EXPECT_FALSE(fs::exists(dir / ("net-" + std::to_string(other.first) + ".lock")));

    release.close_wr();
    wait_exit(holder, 5000);
    fs::remove_all(dir);
  }, 60);
}

}  // namespace
}  // namespace urdma::process_test
