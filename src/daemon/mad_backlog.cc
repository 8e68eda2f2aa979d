#include "daemon/mad_backlog.h"

#include <cerrno>
#include <utility>

#include "daemon/protocol.h"

namespace urdma::daemon {

MadBacklog::Sent MadBacklog::send(int fd, std::vector<uint8_t> record) {
  if (flush(fd) != 0) return Sent::kDropped;
  if (records_.empty()) {
    const int err = send_record(fd, record);
    if (err == 0) return Sent::kNow;
    if (err != EAGAIN) return Sent::kDropped;
  }
  if (records_.size() >= kMaxRecords) return Sent::kDropped;
  records_.push_back(std::move(record));
  return Sent::kQueued;
}

int MadBacklog::flush(int fd) {
  while (!records_.empty()) {
    const int err = send_record(fd, records_.front());
    if (err == EAGAIN) return 0;
    if (err != 0) {
      records_.clear();
      return err;
    }
    records_.pop_front();
  }
  return 0;
}

}  // namespace urdma::daemon
