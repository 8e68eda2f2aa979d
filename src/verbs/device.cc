// Device and context verbs: the device list, ibv_open_device/ibv_close_device over the
// process's one runtime, device/port/GID queries, async events, and the library helpers
// (ibv_*_str, rates, fork, sysfs).
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netpacket/packet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/env.h"
#include "daemon/client.h"
#include "daemon/device_view.h"
#include "net/packet_io_env.h"
#include "provider/limits.h"
#include "verbs/internal.h"
#include "verbs/process.h"

// verbs.h turns these names into inline wrappers; the library defines the real entry points.
#undef ibv_query_port

namespace urdma::verbs {
namespace {

// ---- the device ----

// The view `urdma run` gives a program (docs/ARCHITECTURE.md, "The device view"): the
// uverbs entry of /sys/class/infiniband_verbs whose ibdev names urdma0. Empty when there is none
// (a program started without `urdma run`, or where the view cannot be made).
std::string view_uverbs_name() {
  const std::string cls = "/sys/class/infiniband_verbs";
  for (int i = 0; i < 64; ++i) {
    const std::string name = "uverbs" + std::to_string(i);
    const int fd = open((cls + "/" + name + "/ibdev").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char ibdev[IBV_SYSFS_NAME_MAX] = {};
    const ssize_t n = read(fd, ibdev, sizeof ibdev - 1);
    close(fd);
    if (n > 0 && std::string(ibdev, static_cast<size_t>(n)) == std::string(kDeviceName) + "\n")
      return name;
  }
  return "";
}

Device& the_device() {
  static Device* dev = [] {
    auto* d = new Device{};
    d->device.node_type = IBV_NODE_CA;
    d->device.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d->device.name, sizeof d->device.name, "%s", kDeviceName);
    // Under `urdma run` the paths name the view's directories (UCX looks for
    // /dev/infiniband/<dev_name> and reads <ibdev_path>); without a view they name none.
    const std::string uverbs = view_uverbs_name();
    std::snprintf(d->device.dev_name, sizeof d->device.dev_name, "%s",
                  uverbs.empty() ? "uverbs0" : uverbs.c_str());
    if (uverbs.empty()) {
      d->device.dev_path[0] = '\0';
      d->device.ibdev_path[0] = '\0';
    } else {
      std::snprintf(d->device.dev_path, sizeof d->device.dev_path,
                    "/sys/class/infiniband_verbs/%s", uverbs.c_str());
      std::snprintf(d->device.ibdev_path, sizeof d->device.ibdev_path, "/sys/class/infiniband/%s",
                    kDeviceName);
    }
    d->verbs_device_ops = nullptr;
    return d;
  }();
  return *dev;
}

bool is_ours(ibv_device* device) { return device == &the_device().device; }

// ibv_mtu for an interface MTU: the largest IB MTU whose packet (payload plus the IP/UDP/BTH/
// extension headers and ICRC RoCEv2 adds, rxe's eth_mtu_int_to_enum) fits.
ibv_mtu ib_mtu_for(unsigned if_mtu) {
  constexpr unsigned kOverhead = 40 + 8 + 12 + 4 + 28 + 4;  // GRH/IPv6, UDP, BTH, XRC, AtomicETH, ICRC
  const unsigned payload = if_mtu > kOverhead ? if_mtu - kOverhead : 0;
  if (payload >= 4096) return IBV_MTU_4096;
  if (payload >= 2048) return IBV_MTU_2048;
  if (payload >= 1024) return IBV_MTU_1024;
  if (payload >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

unsigned interface_mtu(unsigned ifindex) {
  char name[IF_NAMESIZE] = {};
  if (!if_indextoname(ifindex, name)) return 0;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, name, std::min(sizeof ifr.ifr_name - 1, std::strlen(name)));
  const int rc = ioctl(fd, SIOCGIFMTU, &ifr);
  close(fd);
  return rc == 0 ? static_cast<unsigned>(ifr.ifr_mtu) : 0;
}

bool debug_enabled() {
  const char* v = std::getenv("URDMA_DEBUG");
  return v && *v && std::strcmp(v, "0") != 0;
}

// The engine settings a process runs with, each overridable by an environment variable (for
// measuring; the loopback and tools benchmarks compare the values):
//   URDMA_TX_BATCH       packets per sendmmsg, 1..net::kMaxBatch (default 64)
//   URDMA_ACK_DELAY_US   how long an owed ACK of a QP in a conversation may wait for the reply
//                        to carry it off the latency path, 0..1000 us (default 50; 0: every
//                        ACK leaves at the end of the received batch). engine.h, ack_delay_ns
//   URDMA_BUSY_POLL_US   the longest the engine thread spins after a turn before it sleeps,
//                        0..1000 us (default 0; RuntimeConfig::busy_poll_ns; the window adapts
//                        below it: runtime/busy_poll.h)
//   URDMA_WAIT_DRIVES    0 or 1 (default 1): a thread blocked in ibv_get_cq_event takes the
//                        turns of the datagrams that come meanwhile (Runtime::wait_readable)
//   URDMA_UDP_GSO        0 or 1 (default 1): UDP segmentation offload for the packets of one
//                        message (net/packet_io_env.h reads it)
//   URDMA_UDP_GRO        0 or 1 (default 1): UDP receive offload (the same)
//   URDMA_SHM            0 or 1 (default 1): the shared-memory path to processes of this host
//                        (the same; net/shm_packet_io.h)
// 0, or EINVAL with a sentence for a value that is not a number in range.
constexpr uint64_t kDefaultTxBatch = 64;
constexpr uint64_t kDefaultAckDelayUs = 50;  // longer than a reply's turnaround on one host
constexpr uint64_t kDefaultBusyPollUs = 0;

// base::env_number, and the refusal said on stderr: a setting the user made is always said.
int env_number(const char* name, uint64_t lo, uint64_t hi, uint64_t* value, std::string* why) {
  const int err = base::env_number(name, lo, hi, value, why);
  if (err != 0) std::fprintf(stderr, "urdma: %s\n", why->c_str());
  return err;
}

int engine_settings(runtime::RuntimeConfig* cfg, std::string* why) {
  uint64_t tx_batch = kDefaultTxBatch;
  uint64_t ack_delay_us = kDefaultAckDelayUs;
  uint64_t busy_poll_us = kDefaultBusyPollUs;
  if (int err = env_number("URDMA_TX_BATCH", 1, net::kMaxBatch, &tx_batch, why)) return err;
  if (int err = env_number("URDMA_ACK_DELAY_US", 0, 1000, &ack_delay_us, why)) return err;
  if (int err = env_number("URDMA_BUSY_POLL_US", 0, 1000, &busy_poll_us, why)) return err;
  uint64_t wait_drives = 1;
  if (int err = env_number("URDMA_WAIT_DRIVES", 0, 1, &wait_drives, why)) return err;
  // Read where the slot socket is adopted (net/packet_io_env.h); checked here so a bad value is
  // said like the others.
  uint64_t udp_offload = 1;
  if (int err = env_number(net::kUdpGsoEnvVar, 0, 1, &udp_offload, why)) return err;
  if (int err = env_number(net::kUdpGroEnvVar, 0, 1, &udp_offload, why)) return err;
  uint64_t shm = 1;
  if (int err = env_number(net::kShmEnvVar, 0, 1, &shm, why)) return err;
  cfg->engine.tx_batch = tx_batch;
  cfg->engine.ack_delay_ns = ack_delay_us * 1000;
  cfg->busy_poll_ns = busy_poll_us * 1000;
  cfg->waiting_thread_drives = wait_drives != 0;
  return 0;
}

// A GID table for the provider's port from urdmad's entries (indices beyond the port's table
// are left out).
std::vector<ibv_gid> port_gids(const std::vector<daemon::GidEntry>& entries) {
  std::vector<ibv_gid> gids(provider::kLimits.gid_table_len, ibv_gid{});
  for (const daemon::GidEntry& e : entries)
    if (e.index < gids.size()) std::memcpy(gids[e.index].raw, e.gid.bytes().data(), 16);
  return gids;
}

// The context that made the object an event concerns (nullptr for a port event).
Context* owner_of(const provider::AsyncEvent& e) {
  ibv_context* c = nullptr;
  if (e.qp) c = Qp::from(static_cast<ibv_qp*>(e.qp->user_context))->qp.context;
  if (e.cq) c = Cq::from(static_cast<ibv_cq*>(e.cq->user_context))->cq.context;
  if (e.srq) c = Srq::from(static_cast<ibv_srq*>(e.srq->user_context))->srq.context;
  return c ? Context::from(c) : nullptr;
}

// The device queue's notify hook (any thread that pushed an event): moves every queued event
// into its context's queue, a port event into each open context's. The owner is read while the
// object cannot be destroyed (AsyncEventQueue::try_pop's under_lock).
void route_async_events() {
  Process& p = process();
  provider::AsyncEventQueue& device_queue = p.runtime->device().async_events();
  while (device_queue.try_pop([&p](const provider::AsyncEvent& e) {
    Context* owner = owner_of(e);
    std::lock_guard lock(p.async_mutex);
    // The object of a context closed while its device context lives (ibv_import_device):
    // the device context's open contexts get it.
    const bool owner_closed = owner && !owner->async_queue;
    for (Context* c : p.open_contexts)
      if (!owner || c == owner || (owner_closed && c->shared == owner->shared))
        c->async_queue->push(e);
  })) {
  }
}

// The device queue's discard hook: an object about to be destroyed has no events anywhere.
void discard_async_events(const void* object) {
  Process& p = process();
  std::lock_guard lock(p.async_mutex);
  for (Context* c : p.open_contexts) c->async_queue->discard(object);
}

// Opens the process's runtime: the GID table from urdmad (which it starts if absent, and which
// keeps it current through the watcher), the active MTU from the interfaces carrying those GIDs,
// then a slot. 0 or an errno (+ a sentence).
int open_runtime(Process& p, std::string* why) {
  auto watcher = std::make_unique<GidWatcher>();
  std::vector<daemon::GidEntry> entries;
  if (int err = watcher->start(&entries, why)) return err;
  runtime::RuntimeConfig cfg;
  if (int err = engine_settings(&cfg, why)) return err;
  cfg.device.node_guid_be = the_device().node_guid_be;
  cfg.device.max_mtu = IBV_MTU_4096;
  cfg.device.gids = port_gids(entries);
  unsigned min_mtu = 0, lo_mtu = 0;
  for (const daemon::GidEntry& e : entries) {
    if (e.index >= provider::kLimits.gid_table_len) continue;
    const unsigned mtu = interface_mtu(e.ifindex);
    if (mtu == 0) continue;
    if (e.gid.is_loopback()) {
      lo_mtu = std::max(lo_mtu, mtu);
    } else if (min_mtu == 0 || mtu < min_mtu) {
      min_mtu = mtu;
    }
  }
  // The port's MTU is the smallest of the interfaces it sends on; loopback only counts alone.
  const unsigned if_mtu = min_mtu ? min_mtu : (lo_mtu ? lo_mtu : 1500);
  cfg.device.active_mtu = ib_mtu_for(if_mtu);
  p.runtime = runtime::Runtime::open({}, cfg, &p.open_errno, why);
  if (!p.runtime) return p.open_errno ? p.open_errno : EIO;
  provider::AsyncEventQueue& events = p.runtime->device().async_events();
  events.set_notify(route_async_events);
  events.set_discard_hook(discard_async_events);
  watcher->set_ifindexes(entries);
  watcher->run_for(&p.runtime->device());
  p.gids = std::move(watcher);
  return 0;
}

}  // namespace

int GidWatcher::start(std::vector<daemon::GidEntry>* entries, std::string* why) {
  if (int err = daemon::Client::connect_or_spawn({}, &client_, why)) return err;
  if (int err = client_.watch_gids(entries)) {
    *why = "urdmad did not send its GID table";
    return err;
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (stop_fd_ < 0) {
    *why = "eventfd failed";
    return errno;
  }
  return 0;
}

void GidWatcher::run_for(provider::Device* device) {
  thread_ = std::thread([this, device] { loop(device); });
}

GidWatcher::~GidWatcher() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t n = write(stop_fd_, &one, sizeof one);
    (void)n;
    thread_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
}

uint32_t GidWatcher::ifindex_of(uint32_t index) const {
  std::lock_guard lock(mutex_);
  return index < ifindex_.size() ? ifindex_[index] : 0;
}

void GidWatcher::set_ifindexes(const std::vector<daemon::GidEntry>& entries) {
  std::vector<uint32_t> v(provider::kLimits.gid_table_len, 0);
  for (const daemon::GidEntry& e : entries)
    if (e.index < v.size()) v[e.index] = e.ifindex;
  std::lock_guard lock(mutex_);
  ifindex_ = std::move(v);
}

// After a takeover (README "Takeover after a restart") the table comes again, whole, from the
// new urdmad: reconnect with back-off (the stop eventfd still ends the wait) and apply it as an
// update, so addresses that changed while no daemon ran are seen too.
bool GidWatcher::reconnect(std::vector<daemon::GidEntry>* entries) {
  for (int backoff_ms = 20;; backoff_ms = std::min(backoff_ms * 2, 1000)) {
    daemon::Client fresh;
    std::string why;
    if (daemon::Client::connect_or_spawn({}, &fresh, &why) == 0 && fresh.watch_gids(entries) == 0) {
      client_ = std::move(fresh);
      return true;
    }
    pollfd stop{stop_fd_, POLLIN, 0};
    if (poll(&stop, 1, backoff_ms) > 0) return false;
  }
}

void GidWatcher::loop(provider::Device* device) {
  for (;;) {
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {client_.fd(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    std::vector<daemon::GidEntry> entries;
    const int err = client_.next_gid_update(&entries);
    if (err == EAGAIN || err == EINTR) continue;
    if (err == ECONNRESET || (fds[1].revents & (POLLHUP | POLLERR | POLLNVAL))) {
      // The daemon went away (the table stays as it was meanwhile).
      if (!reconnect(&entries)) return;
    } else if (err != 0) {
      continue;  // a record we could not read: dropped
    }
    const std::vector<ibv_gid> gids = port_gids(entries);
    bool changed = false;
    for (uint32_t i = 0; i < gids.size(); ++i) {
      ibv_gid old{};
      (void)device->query_gid(provider::kPortNum, static_cast<int>(i), &old);
      if (std::memcmp(&old, &gids[i], sizeof old) == 0) continue;
      (void)device->set_gid(i, gids[i]);
      changed = true;
    }
    set_ifindexes(entries);
    if (changed) {
      provider::AsyncEvent ev{};
      ev.type = IBV_EVENT_GID_CHANGE;
      ev.port_num = provider::kPortNum;
      device->async_events().push(ev);
    }
  }
}

// The name memfd_create gives a command fd shows in /proc/self/fd as "/memfd:<name> (deleted)".
bool is_cmd_fd_name(int fd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  char target[128];
  const ssize_t n = readlink(path, target, sizeof target - 1);
  if (n < 0) return errno == ENOENT;  // no /proc: the seals and the size were the test
  target[n] = '\0';
  const std::string expected = std::string("/memfd:") + kCmdFdName;
  return std::strncmp(target, expected.c_str(), expected.size()) == 0 &&
         (target[expected.size()] == '\0' || target[expected.size()] == ' ');
}

ibv_context* add_context(Process& p, DeviceContext* shared, int cmd_fd) {
  auto* c = new Context{};
  c->pid = getpid();
  c->shared = shared;
  c->rt = shared->rt;
  if (shared->live) {
    c->live = shared->live;
  } else {
    init_live_objects(*c);
    shared->live = c->live;
  }
  c->async_queue = new provider::AsyncEventQueue;
  c->async = new runtime::AsyncEventFd(*c->async_queue);
  fill_context(*c, &the_device().device, c->async->fd(), cmd_fd);
  {
    std::lock_guard async_lock(p.async_mutex);
    p.open_contexts.push_back(c);
  }
  ++p.contexts;
  return &c->vctx.context;
}

void close_runtime(Process& p) {
  p.gids.reset();  // the watcher thread stops before the device it updates goes
  provider::AsyncEventQueue& events = p.runtime->device().async_events();
  events.set_notify(nullptr);
  events.set_discard_hook(nullptr);
  p.runtime.reset();  // the engine thread stops; the slot goes back to urdmad
}

namespace {

Process* g_process = nullptr;

// In a forked child: a device of its own. The parent's runtime, threads and slot lease stay the
// parent's (none of its threads exist here); the child's first ibv_open_device leases a slot of
// its own, as a child of an rdma-core program opens the uverbs device anew. What it inherited is
// never destroyed.
void forget_the_parents_device() { g_process = new Process; }

}  // namespace

Process& process() {
  // Never destroyed: a program may exit with contexts open (the daemon reclaims the slot when
  // the process's connection closes).
  static const bool made = [] {
    g_process = new Process;
    pthread_atfork(nullptr, nullptr, forget_the_parents_device);
    return true;
  }();
  (void)made;
  return *g_process;
}

}  // namespace urdma::verbs

using namespace urdma;
using verbs::fail;

extern "C" {

// ---- device list ----

ibv_device** ibv_get_device_list(int* num_devices) {
  // urdma0 is always listed, as a configured rxe device is: its daemon is started on demand by
  // ibv_open_device, which is where a missing urdmad is reported.
  verbs::Device& dev = verbs::the_device();
  {
    std::lock_guard lock(verbs::process().mutex);
    if (dev.node_guid_be == 0) dev.node_guid_be = daemon::host_node_guid_be();
  }
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) return fail<ibv_device*>(ENOMEM);
  list[0] = &dev.device;
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

__be64 ibv_get_device_guid(ibv_device* device) {
  if (!device || !verbs::is_ours(device)) return 0;
  verbs::Device& dev = verbs::the_device();
  std::lock_guard lock(verbs::process().mutex);
  if (dev.node_guid_be == 0) dev.node_guid_be = daemon::host_node_guid_be();
  return dev.node_guid_be;
}

int ibv_get_device_index(ibv_device* device) { return device && verbs::is_ours(device) ? 0 : -1; }

// ---- open / close ----

ibv_context* ibv_open_device(ibv_device* device) {
  if (!device || !verbs::is_ours(device)) return fail<ibv_context>(ENODEV);
  verbs::Process& p = verbs::process();
  std::lock_guard lock(p.mutex);
  verbs::Device& dev = verbs::the_device();
  if (dev.node_guid_be == 0) dev.node_guid_be = daemon::host_node_guid_be();
  if (!p.runtime) {
    std::string why;
    if (int err = verbs::open_runtime(p, &why)) {
      if (verbs::debug_enabled())
        std::fprintf(stderr, "urdma: ibv_open_device(%s): %s (%s)\n", verbs::kDeviceName,
                     std::strerror(err), why.c_str());
      return fail<ibv_context>(err);
    }
  }
  // The command fd: a memfd of its own, so that its file (fstat's st_dev/st_ino) names this
  // device context for ibv_import_device, through any copy (dup, SCM_RIGHTS). Sealed empty.
  const int cmd_fd = memfd_create(verbs::kCmdFdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  struct stat st {};
  if (cmd_fd < 0 || fstat(cmd_fd, &st) != 0 ||
      fcntl(cmd_fd, F_ADD_SEALS, verbs::kCmdFdSeals) != 0) {
    const int err = errno;
    if (cmd_fd >= 0) close(cmd_fd);
    if (p.contexts == 0) verbs::close_runtime(p);
    return fail<ibv_context>(err);
  }
  auto* shared = new verbs::DeviceContext{};
  shared->rt = new runtime::Context(*p.runtime);
  shared->members = 1;
  shared->cmd_dev = st.st_dev;
  shared->cmd_ino = st.st_ino;
  return verbs::add_context(p, shared, cmd_fd);
}

ibv_context* ibv_import_device(int cmd_fd) {
  // rdma-core answers EINVAL for a descriptor that is not a uverbs device's (fstat, then the
  // device of st_rdev); so does this for one that is no urdma command fd.
  struct stat st {};
  if (fstat(cmd_fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0 ||
      fcntl(cmd_fd, F_GET_SEALS) != verbs::kCmdFdSeals || !verbs::is_cmd_fd_name(cmd_fd))
    return fail<ibv_context>(EINVAL);
  verbs::Process& p = verbs::process();
  std::lock_guard lock(p.mutex);
  verbs::DeviceContext* shared = nullptr;
  {
    std::lock_guard async_lock(p.async_mutex);
    for (verbs::Context* c : p.open_contexts) {
      // The man page: the fd is a copy of a context's cmd_fd. The descriptor itself would be
      // closed twice (by both contexts).
      if (c->vctx.context.cmd_fd == cmd_fd) return fail<ibv_context>(EINVAL);
      if (c->pid == getpid() && c->shared->cmd_dev == st.st_dev &&
          c->shared->cmd_ino == st.st_ino)
        shared = c->shared;
    }
  }
  // A urdma command fd of no open context of this process: one passed from another process
  // (SCM_RIGHTS), inherited across fork, or whose contexts are all closed. Its objects are
  // another engine's, which this process cannot share.
  if (!shared) return fail<ibv_context>(EOPNOTSUPP);
  ++shared->members;
  return verbs::add_context(p, shared, cmd_fd);
}

int ibv_close_device(ibv_context* context) {
  verbs::Process& p = verbs::process();
  verbs::Context* c = verbs::Context::from(context);
  // A context a forked child inherited: its runtime is the parent's, whose threads do not run
  // here. Nothing of it is touched; the memory stays the child's copy.
  if (c->pid != getpid()) return 0;
  {
    std::lock_guard async_lock(p.async_mutex);  // no event is routed to it from now on
    std::erase(p.open_contexts, c);
    delete c->async;
    delete c->async_queue;
    c->async = nullptr;
    c->async_queue = nullptr;
  }
  pthread_mutex_destroy(&context->mutex);
  if (context->cmd_fd >= 0) close(context->cmd_fd);
  context->cmd_fd = -1;
  // The device context's objects live while another context names it (ibv_import_device); this
  // context stays allocated until then, for the wrappers it made point at it.
  verbs::DeviceContext* shared = c->shared;
  bool last = false;
  {
    std::lock_guard lock(p.mutex);
    last = --shared->members == 0;
    if (!last) shared->closed.push_back(c);
  }
  if (last) {
    verbs::release_channels(*c);
    verbs::release_parent_domains(*c);
    delete shared->rt;  // destroys the objects the application left, dependents first
    verbs::free_live_objects(*c);  // and their wrappers
    for (verbs::Context* closed : shared->closed) delete closed;
    delete shared;
    delete c;
  }
  std::lock_guard lock(p.mutex);
  if (--p.contexts == 0) verbs::close_runtime(p);
  return 0;
}

// ---- device and port ----

int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  if (!context || !attr) return EINVAL;
  *attr = verbs::Context::from(context)->dev().attr();
  return 0;
}

// The ABI-compat entry: verbs.h's ___ibv_query_port calls the context's query_port op; this
// symbol serves binaries that call it directly with the old, shorter struct, which ended before
// port_cap_flags2 (rdma-core's struct _compat_ibv_port_attr, opaque in verbs.h).
int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* attr) {
  return verbs::query_port(context, port_num, reinterpret_cast<ibv_port_attr*>(attr),
                           offsetof(ibv_port_attr, port_cap_flags2));
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid) return -1;
  provider::Status s = verbs::Context::from(context)->dev().query_gid(port_num, index, gid);
  if (!s.ok()) {
    errno = s.error();
    return -1;  // ibv_query_gid(3): -1 on error
  }
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!context || !pkey) return -1;
  uint16_t v = 0;
  provider::Status s = verbs::Context::from(context)->dev().query_pkey(port_num, index, &v);
  if (!s.ok()) {
    errno = s.error();
    return -1;
  }
  *pkey = htobe16(v);
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  for (int i = 0; i < static_cast<int>(urdma::provider::kLimits.pkey_table_len); ++i) {
    __be16 v;
    if (ibv_query_pkey(context, port_num, i, &v) == 0 && v == pkey) return i;
  }
  errno = ENOENT;
  return -1;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (!context || !entry || flags != 0 || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  if (port_num != urdma::provider::kPortNum) return EINVAL;
  if (gid_index >= urdma::provider::kLimits.gid_table_len) return EINVAL;
  ibv_gid gid;
  verbs::Context* c = verbs::Context::from(context);
  if (!c->dev().query_gid(static_cast<uint8_t>(port_num), static_cast<int>(gid_index), &gid).ok())
    return EINVAL;
  static constexpr ibv_gid kZero = {};
  if (std::memcmp(&gid, &kZero, sizeof gid) == 0) return ENODATA;  // an empty table entry
  *entry = {};
  entry->gid = gid;
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  verbs::Process& p = verbs::process();
  entry->ndev_ifindex = p.gids ? p.gids->ifindex_of(gid_index) : 0;
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
  if (!context || (max_entries && !entries) || flags != 0 || entry_size < sizeof(ibv_gid_entry))
    return -EINVAL;
  size_t n = 0;
  for (uint32_t i = 0; i < urdma::provider::kLimits.gid_table_len; ++i) {
    ibv_gid_entry e;
    const int rc = _ibv_query_gid_ex(context, urdma::provider::kPortNum, i, &e, 0, sizeof e);
    if (rc == ENODATA) continue;
    if (rc != 0) return -rc;
    if (n == max_entries) return -EINVAL;  // ibv_query_gid_table(3): the array is too small
    std::memcpy(reinterpret_cast<char*>(entries) + n * entry_size, &e, sizeof e);
    ++n;
  }
  return static_cast<ssize_t>(n);
}

// rdma-core's private helper (driver.h): the GID type as sysfs names it; every urdma GID is
// RoCE v2 (IBV_GID_TYPE_SYSFS_ROCE_V2 == 1).
int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                       unsigned int* type) {
  ibv_gid_entry e;
  const int rc = _ibv_query_gid_ex(context, port_num, index, &e, 0, sizeof e);
  if (rc != 0 && rc != ENODATA) {
    errno = rc;
    return -1;
  }
  *type = 1;
  return 0;
}

// ---- async events ----

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!context || !event) {
    errno = EINVAL;
    return -1;
  }
  *event = {};
  // The object is read while it cannot be destroyed (AsyncEventFd::get_event); the event is
  // counted on it, and its destroy waits for the acknowledgement.
  auto report = [event](const provider::AsyncEvent& e) {
    auto count = [](pthread_mutex_t* m, uint32_t* n) {
      pthread_mutex_lock(m);
      ++*n;
      pthread_mutex_unlock(m);
    };
    if (e.qp) {
      auto* w = verbs::Qp::from(static_cast<ibv_qp*>(e.qp->user_context));
      count(&w->qp.mutex, &w->events_reported);
      event->element.qp = &w->qp;
    } else if (e.cq) {
      auto* w = verbs::Cq::from(static_cast<ibv_cq*>(e.cq->user_context));
      count(&w->cq.mutex, &w->events_reported);
      event->element.cq = &w->cq;
    } else if (e.srq) {
      auto* w = verbs::Srq::from(static_cast<ibv_srq*>(e.srq->user_context));
      count(&w->srq.mutex, &w->events_reported);
      event->element.srq = &w->srq;
    }
  };
  provider::Result<provider::AsyncEvent> r = verbs::Context::from(context)->async->get_event(report);
  if (!r.ok()) {
    errno = r.error();
    return -1;
  }
  const provider::AsyncEvent& e = r.value();
  event->event_type = e.type;
  if (!e.qp && !e.cq && !e.srq) event->element.port_num = e.port_num;
  return 0;
}

void ibv_ack_async_event(ibv_async_event* event) {
  // rdma-core counts acknowledged events on the object (destroy waits for them there; here the
  // object never goes away under an unacknowledged event: the count is kept for the record).
  auto bump = [](pthread_mutex_t* m, pthread_cond_t* cv, uint32_t* n) {
    pthread_mutex_lock(m);
    ++*n;
    pthread_cond_signal(cv);
    pthread_mutex_unlock(m);
  };
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR:
      if (ibv_cq* cq = event->element.cq)
        bump(&cq->mutex, &cq->cond, &cq->async_events_completed);
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      if (ibv_srq* srq = event->element.srq) bump(&srq->mutex, &srq->cond, &srq->events_completed);
      break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      if (ibv_qp* qp = event->element.qp) bump(&qp->mutex, &qp->cond, &qp->events_completed);
      break;
    default:
      break;
  }
}

// ---- strings ----

const char* ibv_node_type_str(ibv_node_type node_type) {
  switch (node_type) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* ibv_port_state_str(ibv_port_state port_state) {
  switch (port_state) {
    case IBV_PORT_NOP: return "PORT_NOP";
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
    default: return "invalid state";
  }
}

const char* ibv_event_type_str(ibv_event_type event) {
  switch (event) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    case IBV_EVENT_WQ_FATAL: return "WQ fatal";
    default: return "unknown";
  }
}

const char* ibv_wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    case IBV_WC_TM_ERR: return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
    default: return "unknown";
  }
}

// ---- rates (IBA 9.4.5 static rate encodings) ----

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;  // of 2.5 Gb/s
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, 6, 14062},
    {IBV_RATE_56_GBPS, 22, 56250},      {IBV_RATE_112_GBPS, 45, 112500},
    {IBV_RATE_168_GBPS, 67, 168750},    {IBV_RATE_25_GBPS, 10, 25781},
    {IBV_RATE_100_GBPS, 40, 103125},    {IBV_RATE_200_GBPS, 80, 206250},
    {IBV_RATE_300_GBPS, 120, 309375},   {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},
};
}  // namespace

int ibv_rate_to_mult(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mult;
  return -1;
}

ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---- fork ----

// The engine reaches registered memory from inside the process, never by DMA, so fork(2) takes
// nothing from the parent's registrations: fork support is "unneeded", as on a kernel with
// copy-on-fork pinning. (A child cannot use the parent's verbs objects: no engine runs there.)
int ibv_fork_init(void) { return 0; }
ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

// ---- sysfs (rdma-core's helpers, driver.h; urdma0 lives there under `urdma run`) ----

// rdma-core's signature: the sysfs root, $SYSFS_PATH (not in setuid programs) without trailing
// slashes, else "/sys"; computed once and kept.
const char* ibv_get_sysfs_path(void) {
  static const std::string path = [] {
    const char* env = secure_getenv("SYSFS_PATH");
    std::string p = env && *env ? std::string(env).substr(0, IBV_SYSFS_PATH_MAX) : "/sys";
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
  }();
  return path.c_str();
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  const std::string path = std::string(dir) + "/" + file;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = read(fd, buf, size);
  close(fd);
  if (n <= 0) return -1;
  size_t len = static_cast<size_t>(n);
  if (len == size) --len;  // keep room for the terminator
  if (len > 0 && buf[len - 1] == '\n') --len;
  buf[len] = '\0';
  return static_cast<int>(len);
}

}  // extern "C"
