// The MADs urdmad routed to a process that its MAD channel had no room for yet (daemon.h).
//
// A channel is a non-blocking SOCK_SEQPACKET socket whose send buffer (net.core.wmem_default,
// ~208 KiB) holds fewer than 200 MAD records: a burst of 200 DREQs for one process overflowed
// it and the MADs that did not fit were lost. Those that do not fit now wait here, oldest
// first, and go out in order as the process reads (the daemon watches the channel for EPOLLOUT
// while any wait).
// The backlog is bounded: beyond kMaxRecords a MAD is dropped — the caller counts it — and the
// CM's retransmissions recover it, as they recover a MAD lost on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace urdma::daemon {

class MadBacklog {
 public:
  // Far above one burst (a process's every connection at once), far below memory trouble
  // (~300 bytes each).
  static constexpr size_t kMaxRecords = 8192;

  enum class Sent { kNow, kQueued, kDropped };

  // Sends `record` on `fd` after whatever waits, or queues it when the socket is full (EAGAIN);
  // kDropped when the backlog is full or the socket failed otherwise (a closed channel: its
  // client is dropped when the loop reads the hang-up).
  Sent send(int fd, std::vector<uint8_t> record);
  // Sends what waits until the socket is full again. Returns 0, or the errno of a failed send
  // other than EAGAIN (the rest is then discarded).
  int flush(int fd);

  bool empty() const { return records_.empty(); }
  size_t size() const { return records_.size(); }

 private:
  std::deque<std::vector<uint8_t>> records_;
};

}  // namespace urdma::daemon
