// The process-wide state of the library: the one runtime every ibv_context views, and the
// context set-up shared by ibv_open_device.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/client.h"

#include "runtime/completion_channel.h"
#include "runtime/runtime.h"
#include "verbs/internal.h"

namespace urdma::verbs {

// Keeps the device's GID table equal to urdmad's: a thread of the library reads the daemon's
// table updates (a watching connection, daemon::Client::watch_gids) and applies each one to the
// provider's table (Device::set_gid), then raises IBV_EVENT_GID_CHANGE, as a kernel device does
// when an interface address comes or goes.
class GidWatcher {
 public:
  // Connects (starting urdmad if absent) and reads the current table into *entries.
  int start(std::vector<daemon::GidEntry>* entries, std::string* why);
  // From then on updates go to `device` (whose table was built from *entries).
  void run_for(provider::Device* device);
  ~GidWatcher();  // stops and joins the thread

  // The interface of a GID index (ibv_gid_entry.ndev_ifindex); 0 if unknown.
  uint32_t ifindex_of(uint32_t index) const;
  void set_ifindexes(const std::vector<daemon::GidEntry>& entries);

 private:
  void loop(provider::Device* device);
  bool reconnect(std::vector<daemon::GidEntry>* entries);  // false: asked to stop

  daemon::Client client_;
  int stop_fd_ = -1;
  std::thread thread_;
  mutable std::mutex mutex_;  // ifindex_
  std::vector<uint32_t> ifindex_;
};

struct Process {
  std::mutex mutex;  // runtime, gids, contexts
  std::unique_ptr<runtime::Runtime> runtime;
  std::unique_ptr<GidWatcher> gids;
  int contexts = 0;
  // Async events: the device has one queue (the engine and the provider push into it); each
  // event is moved at once into the queue of the context it concerns — the one that made the
  // QP, CQ or SRQ — or, for a port event, into every context's queue (route_async_events).
  // Each context has an async fd of its own, as each open of a uverbs device has.
  std::mutex async_mutex;             // open_contexts; taken inside the device queue's lock
  std::vector<Context*> open_contexts;
  int open_errno = 0;
};

Process& process();

// Command fds (ibv_import_device(3)): a memfd of this name, empty and sealed so.
inline constexpr const char kCmdFdName[] = "urdma-cmd";
inline constexpr int kCmdFdSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
bool is_cmd_fd_name(int fd);

// A new context on `shared` (opened, or imported: its `members` counts it already), owning
// cmd_fd; registered with the process (open_contexts, contexts). Under p.mutex.
ibv_context* add_context(Process& p, DeviceContext* shared, int cmd_fd);
// The last context closed: the GID watcher, the device's event hooks, the runtime go. Under
// p.mutex.
void close_runtime(Process& p);

// Fills a new context: the ops the inline verbs call, the extended ops, the fds (the context
// owns cmd_fd).
void fill_context(Context& c, ibv_device* device, int async_fd, int cmd_fd);

// The verbs_context query_port op (attr_size: the caller's struct size, for ABI growth).
int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_size);

}  // namespace urdma::verbs
