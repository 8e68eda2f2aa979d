// Runtime::open end to end: in a fresh network namespace (its own urdmad, UDP 4791 and abstract
// unix socket, loopback up), two runtimes of one process each lease a slot from a urdmad they
// start themselves and run RC WRITE and READ between their QPs over the real steered slot
// sockets (urdmad's BPF picks each datagram's socket by DestQP), data checked by checksum.
// Skipped where network namespaces cannot be made (no CAP_SYS_ADMIN).
#include <dirent.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "runtime_test_util.h"

namespace urdma::runtime::testing {
namespace {

bool loopback_up() {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP;
  ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  close(fd);
  return ok;
}

// Distinct sockets (by inode) among this process's descriptors that are UDP, bound to `port`,
// with a receive buffer of at least `min_bytes` (as SO_RCVBUF reports it: twice what was set).
size_t udp_sockets_with_rcvbuf(uint16_t port, int min_bytes) {
  std::set<ino_t> found;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    struct stat st;
    if (e->d_name[0] == '.' || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0, rcvbuf = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM) continue;
    sockaddr_storage ss{};
    len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    const uint16_t bound = ss.ss_family == AF_INET6
                               ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                               : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    len = sizeof rcvbuf;
    if (bound == port && getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len) == 0 &&
        rcvbuf >= min_bytes)
      found.insert(st.st_ino);
  }
  closedir(d);
  return found.size();
}

// The child's body: 0 on success, else a failure code (after printing why).
int two_runtimes_over_urdmad() {
  const net::Address lo = net::Address::from_v4(127, 0, 0, 1);
  auto open = [&](std::unique_ptr<Runtime>* out) {
    RuntimeConfig c;
    c.device = test::device_config(nullptr, lo, IBV_MTU_4096);
    c.engine.local_address = lo;
    int err = 0;
    std::string why;
    *out = Runtime::open({}, c, &err, &why);
    if (!*out) std::fprintf(stderr, "Runtime::open: %s (%s)\n", std::strerror(err), why.c_str());
    return *out != nullptr;
  };
  Host a{lo, nullptr, nullptr};
  Host b{lo, nullptr, nullptr};
  if (!open(&a.rt) || !open(&b.rt)) return 2;
  // Each runtime's slot socket has a receive buffer for a window of full-MTU packets, as far as
  // net.core.rmem_max allows: the default (208 KiB) dropped bursts on loopback and RC crawled
  // through ACK timeouts. The kernel reports twice what was set. The process holds its two slot
  // sockets and nothing else of urdmad's group (slot 0, sized for CM MADs, is the daemon's).
  long rmem_max = 0;
  std::ifstream("/proc/sys/net/core/rmem_max") >> rmem_max;
  const long want = std::min<long>(rmem_max, 4 << 20);
  if (want > 212992) {
    const size_t big = udp_sockets_with_rcvbuf(4791, static_cast<int>(2 * want));
    EXPECT_EQ(big, 2u) << "slot sockets with SO_RCVBUF >= " << 2 * want;
  } else {
    std::fprintf(stderr, "net.core.rmem_max %ld: the slot socket buffers cannot grow here\n",
                 rmem_max);
  }
  a.pd = a.dev().alloc_pd().value();
  b.pd = b.dev().alloc_pd().value();
  provider::Cq* cqa = a.make_cq();
  RcPair p = connect_rc(a, cqa, b, b.make_cq());
  std::fprintf(stderr, "QPNs %#x and %#x\n", p.qa->qp_num(), p.qb->qp_num());
  constexpr size_t kBytes = 1 << 20;
  constexpr size_t kChunk = 64 * 1024;
  std::vector<uint8_t> src(kBytes), dst(kBytes), back(kBytes);
  fill_pattern(src, 99);
  provider::Mr* ms = a.reg(src.data(), kBytes);
  provider::Mr* mb = a.reg(back.data(), kBytes);
  provider::Mr* md = b.reg(dst.data(), kBytes);
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
    provider::Mr* local = op == IBV_WR_RDMA_WRITE ? ms : mb;
    uint8_t* base = op == IBV_WR_RDMA_WRITE ? src.data() : back.data();
    for (size_t i = 0; i < kBytes / kChunk; ++i) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(base + i * kChunk), kChunk, local->lkey()};
      ibv_send_wr wr =
          rdma_wr(op, &sge, reinterpret_cast<uintptr_t>(dst.data() + i * kChunk), md->rkey(), i);
      ibv_send_wr* bad = nullptr;
      if (!p.qa->post_send(&wr, &bad).ok()) return 3;
    }
    for (const ibv_wc& wc : wait_cqes(*a.rt, cqa, kBytes / kChunk, true)) {
      if (wc.status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "wr %llu: %s\n", static_cast<unsigned long long>(wc.wr_id),
                     ibv_wc_status_str(wc.status));
        return 4;
      }
    }
  }
  b.settle();
  if (fnv1a(dst.data(), kBytes) != fnv1a(src.data(), kBytes)) return 5;
  if (fnv1a(back.data(), kBytes) != fnv1a(src.data(), kBytes)) return 6;
  return 0;
}

constexpr const char* kChildEnv = "URDMA_RUNTIME_NETNS_CHILD";

TEST(RuntimeDaemon, TwoProcessRuntimesLeaseSlotsAndTalkOverSteeredSockets) {
  if (std::getenv(kChildEnv) != nullptr) {
    // The re-executed child: its own network namespace, then the runtimes.
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    if (!loopback_up()) _exit(78);
    EXPECT_EQ(two_runtimes_over_urdmad(), 0);
    return;
  }
  // Fork and exec this test alone (a fresh process: no threads of earlier tests, and no
  // thread creation after a fork, which TSan refuses).
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv(kChildEnv, "1", 1);
    execl("/proc/self/exe", "/proc/self/exe",
          "--gtest_filter=RuntimeDaemon.TwoProcessRuntimesLeaseSlotsAndTalkOverSteeredSockets",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the child hung";
  }
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77 || WEXITSTATUS(status) == 78)
    GTEST_SKIP() << "no network namespace here (needs CAP_SYS_ADMIN)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace urdma::runtime::testing
