// main() of urdma_verbs_tests: the whole binary runs in a fresh network namespace of its own
// (loopback up), so the urdmad that ibv_open_device starts, its abstract socket and UDP 4791
// clash with nothing else on the machine. The namespace is made before any thread exists, so
// every thread (gtest's, the runtime's engine thread, the spawned daemon) lives in it. The
// daemon leaves 1 s after the last test process closed its device (URDMA_IDLE_TIMEOUT_MS), and
// the namespace with it.
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "verbs_test_env.h"

namespace urdma::verbs_test {

std::string& netns_failure() {
  static std::string why;
  return why;
}

namespace {

bool enter_fresh_netns(std::string* why) {
  if (unshare(CLONE_NEWNET) != 0) {
    *why = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno);
    return false;
  }
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  bool ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  ifr.ifr_flags |= IFF_UP;
  ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  if (fd >= 0) close(fd);
  if (!ok) *why = "could not bring lo up in the new namespace";
  return ok;
}

}  // namespace
}  // namespace urdma::verbs_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!::testing::GTEST_FLAG(list_tests)) {
    std::string why;
    if (!urdma::verbs_test::enter_fresh_netns(&why)) urdma::verbs_test::netns_failure() = why;
    setenv("URDMA_IDLE_TIMEOUT_MS", "1000", 1);
    unsetenv("URDMA_SOCKET");
    unsetenv("URDMA_UDP_PORT");
    unsetenv("URDMA_FAULTS");
  }
  return RUN_ALL_TESTS();
}
