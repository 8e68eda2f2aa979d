// Process-test harness: every test body runs in a forked child inside its own fresh network
// namespace (loopback up), so its urdmad, its abstract unix socket and UDP port 4791 cannot
// clash with anything else on the machine — another test, a developer's daemon.
//
// The child is a child subreaper, so a daemon spawned by any process of the test is reparented
// to it and can be reaped; when the body returns, every process left in the namespace is killed.
// Needs root (CLONE_NEWNET) or unprivileged user namespaces (then uid 0 inside is the caller);
// with neither the test is skipped with the reason.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace urdma::process_test {

// Runs `body` in a fresh network namespace in a forked child; fails the calling test if the
// body failed, died or outlived `timeout_s`; skips it if no namespace could be made.
void in_fresh_netns(const std::function<void()>& body, int timeout_s = 20);

// True when the fresh namespace was made with plain root (not a user namespace): setuid tests.
bool real_root();

// Ends the test body as skipped, with the reason (call from the body's process only).
[[noreturn]] void skip_test(const std::string& why);

// For a test that starts the urdmad built here: URDMA_DAEMON names `daemon`, which exits after
// `idle_timeout_ms` without clients (URDMA_IDLE_TIMEOUT_MS), and URDMA_SOCKET, URDMA_UDP_PORT
// and URDMA_SLOTS are cleared, so nothing in the caller's environment moves it from its
// defaults.
void use_daemon(const char* daemon, const char* idle_timeout_ms);

// Forks a process that runs `fn` and exits with its return value.
pid_t fork_process(const std::function<int()>& fn);
// Waits (bounded) for a child; its exit status in the waitpid form, or nullopt on timeout. For a
// process that is not our child (urdmad's daemon proper is its keeper's) only its end is seen:
// status 0 once it is gone.
std::optional<int> wait_exit(pid_t pid, int timeout_ms);

// A second host for a test body: a forked child in a network namespace of its own (loopback
// up), joined to the body's namespace by a veth pair — `here` with <subnet>.1/24 in the body's
// namespace, `there` with <subnet>.2/24 in the child's ("10.89.3": 10.89.3.1 and 10.89.3.2),
// both up. The child runs `host_b` once its address is up and exits with its return value.
// Returns the child's pid (wait for it with wait_exit); ends the test as skipped when the
// kernel makes no veth pair.
pid_t start_second_host(const std::string& here, const std::string& there,
                        const std::string& subnet, const std::function<int()>& host_b);

// The two halves of start_second_host, for a second host made another way (a peer process that
// enters its own namespace in a set-up hook; a process that only holds a namespace):
// veth_into makes the pair from this namespace into `pid`'s, with <subnet>.1/24 on `here`, up
// (false and a test failure if the address fails; the test ends as skipped, and `pid` is
// killed, when the kernel makes no veth pair); address_there, run inside the other namespace,
// puts <subnet>.2/24 on `there` and brings it up.
bool veth_into(pid_t pid, const std::string& here, const std::string& there,
               const std::string& subnet);
bool address_there(const std::string& there, const std::string& subnet);
// Runs a shell command (iproute2); false and a message on failure.
bool sh(const std::string& command);
// An interface besides lo in this namespace, as a host has (multicast, the device's netdev in
// device/net/, libfabric need one): a veth pair <name>0 and <name>1, both up, <name>0 with
// `address` ("10.92.0.1/24", or IPv6 "fd00:97::1/64", then without duplicate address
// detection). False and a test failure if a command fails.
bool add_local_veth(const std::string& name, const std::string& address);

// Brings an interface up with ioctls (no iproute2 needed for lo).
bool link_up(const char* ifname);

// The kernel's count of UDP datagrams delivered in this network namespace (/proc/net/snmp,
// "Udp: InDatagrams"; IPv4) plus its IPv6 counterpart (/proc/net/snmp6, Udp6InDatagrams):
// the oracle for which path a transfer took, kept by code that is not ours.
uint64_t udp_datagrams_received();

// A pipe carrying fixed-size records between the test's processes (bounded reads).
struct Pipe {
  int rd = -1, wr = -1;
  Pipe();
  ~Pipe();
  void close_rd();
  void close_wr();
  bool put(const void* data, size_t size);
  bool get(void* data, size_t size, int timeout_ms);
  template <class T>
  bool put(const T& v) {
    return put(&v, sizeof v);
  }
  template <class T>
  bool get(T* v, int timeout_ms = 5000) {
    return get(v, sizeof *v, timeout_ms);
  }
};

}  // namespace urdma::process_test
