#include "daemon/protocol.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

namespace urdma::daemon {

namespace {

MsgHeader header_for(MsgType type, size_t size, int status = 0) {
  return MsgHeader{.magic = kProtocolMagic,
                   .version = kProtocolVersion,
                   .type = static_cast<uint16_t>(type),
                   .size = static_cast<uint32_t>(size),
                   .status = status};
}

template <class Body>
std::vector<uint8_t> record(MsgType type, const Body& body) {
  std::vector<uint8_t> out(sizeof(MsgHeader) + sizeof(Body));
  const MsgHeader h = header_for(type, out.size());
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &body, sizeof body);
  return out;
}

// Common reply checks: a kError turns into its errno; otherwise the type must be `expected`.
int check_reply(std::span<const uint8_t> rec, MsgType expected, MsgHeader* h) {
  if (const int err = decode_header(rec, h)) return err;
  if (h->type == static_cast<uint16_t>(MsgType::kError)) return h->status > 0 ? h->status : EPROTO;
  if (h->type != static_cast<uint16_t>(expected) || h->status != 0) return EPROTO;
  return 0;
}

struct GidsBody {
  uint32_t count;
  uint32_t reserved;
};

// A ShmPairBody after its header has been checked: the size, a side, a range of the QPN space.
int shm_pair_body(std::span<const uint8_t> rec, ShmPairBody* body) {
  if (rec.size() != sizeof(MsgHeader) + sizeof *body) return EPROTO;
  std::memcpy(body, rec.data() + sizeof(MsgHeader), sizeof *body);
  return body->side <= 1 && body->peer_range < kRangeCount ? 0 : EPROTO;
}

// The type of a record, as far as it has one (0 when shorter than a header).
uint16_t type_of(std::span<const uint8_t> rec) {
  if (rec.size() < sizeof(MsgHeader)) return 0;
  MsgHeader h;
  std::memcpy(&h, rec.data(), sizeof h);
  return h.type;
}

}  // namespace

std::vector<uint8_t> encode_request(MsgType type) {
  std::vector<uint8_t> out(sizeof(MsgHeader));
  const MsgHeader h = header_for(type, out.size());
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

std::vector<uint8_t> encode_error(int err) {
  std::vector<uint8_t> out(sizeof(MsgHeader));
  const MsgHeader h = header_for(MsgType::kError, out.size(), err);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

std::vector<uint8_t> encode_slot(const SlotInfo& info) {
  return record(MsgType::kSlot, info);
}

std::vector<uint8_t> encode_service_request(MsgType type, uint64_t service_id) {
  return record(type, ServiceIdBody{service_id});
}

std::vector<uint8_t> encode_mad_channel(unsigned slot) {
  return record(MsgType::kMadChannel, SlotBody{slot, 0});
}

std::vector<uint8_t> encode_mad(const MadDelivery& info, std::span<const uint8_t> datagram) {
  std::vector<uint8_t> out(sizeof(MsgHeader) + sizeof info + datagram.size());
  const MsgHeader h = header_for(MsgType::kMad, out.size());
  MadDelivery d = info;
  d.length = static_cast<uint32_t>(datagram.size());
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &d, sizeof d);
  if (!datagram.empty())
    std::memcpy(out.data() + sizeof h + sizeof d, datagram.data(), datagram.size());
  return out;
}

template <class Body>
int decode_request_body(std::span<const uint8_t> rec, Body* body) {
  MsgHeader h;
  if (const int err = decode_header(rec, &h)) return err;
  if (rec.size() != sizeof h + sizeof *body) return EPROTO;
  std::memcpy(body, rec.data() + sizeof h, sizeof *body);
  return 0;
}
template int decode_request_body(std::span<const uint8_t>, ServiceIdBody*);
template int decode_request_body(std::span<const uint8_t>, SlotBody*);
template int decode_request_body(std::span<const uint8_t>, ClientsQuery*);
template int decode_request_body(std::span<const uint8_t>, CounterReport*);
template int decode_request_body(std::span<const uint8_t>, SlotInfo*);
template int decode_request_body(std::span<const uint8_t>, ConnRecord*);
template int decode_request_body(std::span<const uint8_t>, CommIdBody*);
template int decode_request_body(std::span<const uint8_t>, McastBody*);
template int decode_request_body(std::span<const uint8_t>, CaptureBody*);
template int decode_request_body(std::span<const uint8_t>, ShmConnectBody*);

std::vector<uint8_t> encode_hello(const HelloInfo& info) {
  return record(MsgType::kHello, info);
}

int decode_hello(std::span<const uint8_t> rec, HelloInfo* info) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kHello, &h)) return err;
  if (rec.size() != sizeof h + sizeof *info) return EPROTO;
  std::memcpy(info, rec.data() + sizeof h, sizeof *info);
  return 0;
}

std::vector<uint8_t> encode_conn_up(const ConnRecord& conn) {
  return record(MsgType::kConnUp, conn);
}

std::vector<uint8_t> encode_mcast(MsgType type, uint32_t qpn, const net::Address& group) {
  McastBody body{.qpn = qpn, .reserved = 0, .group = {}};
  std::memcpy(body.group, group.bytes().data(), sizeof body.group);
  return record(type, body);
}

std::vector<uint8_t> encode_capture(uint32_t filter) {
  return record(MsgType::kCapture, CaptureBody{filter, 0});
}

std::vector<uint8_t> encode_capture_on(uint32_t slot) {
  return record(MsgType::kCaptureOn, CaptureOnBody{slot, 0});
}

std::vector<uint8_t> encode_capturing(uint32_t processes) {
  return record(MsgType::kCapturing, CapturingBody{processes, 0});
}

int decode_capturing(std::span<const uint8_t> rec, uint32_t* processes) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kCapturing, &h)) return err;
  CapturingBody body;
  if (rec.size() != sizeof h + sizeof body) return EPROTO;
  std::memcpy(&body, rec.data() + sizeof h, sizeof body);
  *processes = body.processes;
  return 0;
}

int decode_capture_on(std::span<const uint8_t> rec, uint32_t* slot) {
  MsgHeader h;
  if (const int err = decode_header(rec, &h)) return err;
  CaptureOnBody body;
  if (h.type != static_cast<uint16_t>(MsgType::kCaptureOn) || h.status != 0 ||
      rec.size() != sizeof h + sizeof body)
    return EPROTO;
  std::memcpy(&body, rec.data() + sizeof h, sizeof body);
  *slot = body.slot;
  return 0;
}

std::vector<uint8_t> encode_shm_connect(const net::Address& address, uint32_t qpn) {
  ShmConnectBody body{.address = {}, .qpn = qpn, .reserved = 0};
  std::memcpy(body.address, address.bytes().data(), sizeof body.address);
  return record(MsgType::kShmConnect, body);
}

std::vector<uint8_t> encode_shm_pair(MsgType type, const ShmPairBody& body) {
  return record(type, body);
}

std::vector<uint8_t> encode_shm_off(uint32_t peer_range) {
  return record(MsgType::kShmOff, ShmOffBody{peer_range, 0});
}

int decode_shm_accepted(std::span<const uint8_t> rec) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kShmAccepted, &h)) return err;
  return rec.size() == sizeof h ? 0 : EPROTO;
}

int decode_shm_ready(std::span<const uint8_t> rec, ShmPairBody* body) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kShmReady, &h)) return err;
  return shm_pair_body(rec, body);
}

int decode_shm_on(std::span<const uint8_t> rec, ShmPairBody* body) {
  MsgHeader h;
  if (const int err = decode_header(rec, &h)) return err;
  if (h.type != static_cast<uint16_t>(MsgType::kShmOn) || h.status != 0) return EPROTO;
  return shm_pair_body(rec, body);
}

int decode_shm_off(std::span<const uint8_t> rec, uint32_t* peer_range) {
  MsgHeader h;
  if (const int err = decode_header(rec, &h)) return err;
  ShmOffBody body;
  if (h.type != static_cast<uint16_t>(MsgType::kShmOff) || h.status != 0 ||
      rec.size() != sizeof h + sizeof body)
    return EPROTO;
  std::memcpy(&body, rec.data() + sizeof h, sizeof body);
  if (body.peer_range >= kRangeCount) return EPROTO;
  *peer_range = body.peer_range;
  return 0;
}

std::vector<uint8_t> encode_conn_down(uint32_t local_comm_id) {
  return record(MsgType::kConnDown, CommIdBody{local_comm_id, 0});
}

std::vector<uint8_t> encode_clients_query(uint32_t first) {
  return record(MsgType::kQueryClients, ClientsQuery{first, 0});
}

std::vector<uint8_t> encode_counter_report(const CounterReport& report) {
  return record(MsgType::kReportCounters, report);
}

std::vector<uint8_t> encode_reattach(const SlotInfo& slot) {
  return record(MsgType::kReattach, slot);
}

std::vector<uint8_t> encode_clients(const ClientsPage& page, std::span<const ClientEntry> entries) {
  const size_t n = std::min<size_t>(entries.size(), kClientsPerPage);
  std::vector<uint8_t> out(sizeof(MsgHeader) + sizeof page + n * sizeof(ClientEntry));
  const MsgHeader h = header_for(MsgType::kClients, out.size());
  ClientsPage p = page;
  p.count = static_cast<uint32_t>(n);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, &p, sizeof p);
  if (n > 0) std::memcpy(out.data() + sizeof h + sizeof p, entries.data(), n * sizeof(ClientEntry));
  return out;
}

int decode_clients(std::span<const uint8_t> rec, ClientsPage* page,
                   std::vector<ClientEntry>* entries) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kClients, &h)) return err;
  if (rec.size() < sizeof h + sizeof *page) return EPROTO;
  std::memcpy(page, rec.data() + sizeof h, sizeof *page);
  if (page->count > kClientsPerPage ||
      rec.size() != sizeof h + sizeof *page + size_t{page->count} * sizeof(ClientEntry))
    return EPROTO;
  entries->resize(page->count);
  for (uint32_t i = 0; i < page->count; ++i) {
    std::memcpy(&(*entries)[i], rec.data() + sizeof h + sizeof *page + i * sizeof(ClientEntry),
                sizeof(ClientEntry));
    (*entries)[i].comm[sizeof(ClientEntry::comm) - 1] = 0;
  }
  return 0;
}

int decode_ok(std::span<const uint8_t> rec) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kOk, &h)) return err;
  return rec.size() == sizeof h ? 0 : EPROTO;
}

int decode_mad(std::span<const uint8_t> rec, MadDelivery* info, std::vector<uint8_t>* datagram) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kMad, &h)) return err;
  if (rec.size() < sizeof h + sizeof *info) return EPROTO;
  std::memcpy(info, rec.data() + sizeof h, sizeof *info);
  if (info->length > kMaxMadDatagramBytes || rec.size() != sizeof h + sizeof *info + info->length)
    return EPROTO;
  datagram->assign(rec.begin() + sizeof h + sizeof *info, rec.end());
  return 0;
}

std::vector<uint8_t> encode_status(const StatusInfo& info) {
  return record(MsgType::kStatus, info);
}

int decode_status(std::span<const uint8_t> rec, StatusInfo* info) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kStatus, &h)) return err;
  // Grown by appending: an older daemon's shorter record leaves the new fields zero.
  const size_t body = rec.size() - sizeof h;
  if (body != sizeof *info && body != kStatusInfoFirstSize) return EPROTO;
  *info = StatusInfo{};
  std::memcpy(info, rec.data() + sizeof h, body);
  return 0;
}

std::vector<uint8_t> encode_gids(std::span<const GidEntry> gids) {
  const size_t n = std::min<size_t>(gids.size(), kMaxGids);
  std::vector<uint8_t> out(sizeof(MsgHeader) + sizeof(GidsBody) + n * sizeof(WireGid));
  const MsgHeader h = header_for(MsgType::kGids, out.size());
  std::memcpy(out.data(), &h, sizeof h);
  const GidsBody body{static_cast<uint32_t>(n), 0};
  std::memcpy(out.data() + sizeof h, &body, sizeof body);
  for (size_t i = 0; i < n; ++i) {
    WireGid w{};
    std::memcpy(w.gid, gids[i].gid.bytes().data(), sizeof w.gid);
    w.index = gids[i].index;
    w.ifindex = gids[i].ifindex;
    w.family = gids[i].family;
    w.prefix_len = gids[i].prefix_len;
    w.scope = gids[i].scope;
    std::memcpy(out.data() + sizeof h + sizeof body + i * sizeof w, &w, sizeof w);
  }
  return out;
}

int decode_header(std::span<const uint8_t> rec, MsgHeader* h) {
  if (rec.size() < sizeof(MsgHeader)) return EPROTO;
  std::memcpy(h, rec.data(), sizeof *h);
  if (h->magic != kProtocolMagic) return EPROTO;
  if (h->version != kProtocolVersion) return EPROTONOSUPPORT;
  if (h->size != rec.size()) return EPROTO;
  return 0;
}

int decode_slot(std::span<const uint8_t> rec, SlotInfo* info) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kSlot, &h)) return err;
  if (rec.size() != sizeof h + sizeof *info) return EPROTO;
  std::memcpy(info, rec.data() + sizeof h, sizeof *info);
  return 0;
}

int decode_gids(std::span<const uint8_t> rec, std::vector<GidEntry>* gids) {
  MsgHeader h;
  if (const int err = check_reply(rec, MsgType::kGids, &h)) return err;
  GidsBody body;
  if (rec.size() < sizeof h + sizeof body) return EPROTO;
  std::memcpy(&body, rec.data() + sizeof h, sizeof body);
  if (body.count > kMaxGids || rec.size() != sizeof h + sizeof body + body.count * sizeof(WireGid))
    return EPROTO;
  gids->clear();
  for (uint32_t i = 0; i < body.count; ++i) {
    WireGid w;
    std::memcpy(&w, rec.data() + sizeof h + sizeof body + i * sizeof w, sizeof w);
    net::Address::Bytes b;
    std::memcpy(b.data(), w.gid, b.size());
    gids->push_back(GidEntry{.index = w.index,
                             .gid = net::Address(b),
                             .ifindex = w.ifindex,
                             .family = w.family,
                             .prefix_len = w.prefix_len,
                             .scope = w.scope});
  }
  return 0;
}

size_t max_fds_of(uint16_t type) {
  return type == static_cast<uint16_t>(MsgType::kShmReady) ||
                 type == static_cast<uint16_t>(MsgType::kShmOn)
             ? kShmPairFds
             : kMaxPassedFds;
}

int send_record(int sock, std::span<const uint8_t> rec, std::span<const int> fds) {
  if (fds.size() > max_fds_of(type_of(rec))) return EINVAL;
  iovec iov{const_cast<uint8_t*>(rec.data()), rec.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kShmPairFds * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(rec.size())) return 0;
    if (n >= 0) return EMSGSIZE;
    if (errno != EINTR) return errno;
  }
}

ssize_t recv_record(int sock, std::span<uint8_t> buffer, std::vector<UniqueFd>* fds, int flags,
                    size_t max_fds) {
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for one fd more than any record may carry, so that a record with too many is seen as
  // such (CMSG_SPACE rounds up: the kernel fills what fits and truncates the rest).
  alignas(cmsghdr) char control[CMSG_SPACE((kShmPairFds + 1) * sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  std::vector<UniqueFd> passed;  // closed here unless the record is good and wanted
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      passed.emplace_back(fd);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return -EMSGSIZE;
  // Whatever the caller takes, only the types that carry more may.
  const auto record = std::span<const uint8_t>(buffer.data(), static_cast<size_t>(n));
  if (passed.size() > std::min(max_fds, max_fds_of(type_of(record)))) return -EMSGSIZE;
  if (fds)
    for (auto& fd : passed) fds->push_back(std::move(fd));
  return n;
}

bool unix_address(const std::string& path, sockaddr_un* out, socklen_t* len) {
  std::memset(out, 0, sizeof *out);
  out->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof out->sun_path) return false;
  std::memcpy(out->sun_path, path.data(), path.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

}  // namespace urdma::daemon
