// The process-wide state of the library: the one runtime every ibv_context views, and the
// context set-up shared by ibv_open_device.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/completion_channel.h"
#include "runtime/runtime.h"
#include "verbs/internal.h"

namespace urdma::verbs {

struct Process {
  std::mutex mutex;  // runtime, async, contexts, gid_ifindex (written at open)
  std::unique_ptr<runtime::Runtime> runtime;
  // The async fd: one per process, because the process has one Device and one event queue.
  // Every context's async_fd is this fd (docs/COMPATIBILITY.md).
  std::unique_ptr<runtime::AsyncEventFd> async;
  int contexts = 0;
  int open_errno = 0;
  std::vector<uint32_t> gid_ifindex;  // the interface of each GID index (ibv_gid_entry)

  uint32_t gid_ifindex_of(uint32_t index) {
    std::lock_guard lock(mutex);
    return index < gid_ifindex.size() ? gid_ifindex[index] : 0;
  }
};

Process& process();

// Fills a new context: the ops the inline verbs call, the extended ops, the fds.
void fill_context(Context& c, ibv_device* device, int async_fd);

// The verbs_context query_port op (attr_size: the caller's struct size, for ABI growth).
int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_size);

}  // namespace urdma::verbs
