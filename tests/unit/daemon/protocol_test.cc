#include "daemon/protocol.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace urdma::daemon {
namespace {

TEST(Protocol, SlotReplyRoundTrips) {
  const SlotInfo in{.slot = 5,
                    .slot_count = 64,
                    .qpn_base = 5 << 12,
                    .qpn_count = 4096,
                    .generation = 0,
                    .udp_port = 4791,
                    .family = AF_INET6};
  const auto rec = encode_slot(in);
  EXPECT_EQ(rec.size(), sizeof(MsgHeader) + sizeof(SlotInfo));
  SlotInfo out{};
  ASSERT_EQ(decode_slot(rec, &out), 0);
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
}

TEST(Protocol, GidsRoundTrip) {
  std::vector<GidEntry> in;
  in.push_back({.index = 0,
                .gid = net::Address::from_v4(127, 0, 0, 1),
                .ifindex = 1,
                .family = AF_INET,
                .prefix_len = 8,
                .scope = 254});
  in.push_back({.index = 3,
                .gid = *net::Address::parse("fd00::1"),
                .ifindex = 2,
                .family = AF_INET6,
                .prefix_len = 64,
                .scope = 0});
  std::vector<GidEntry> out;
  ASSERT_EQ(decode_gids(encode_gids(in), &out), 0);
  EXPECT_EQ(out, in);
  ASSERT_EQ(decode_gids(encode_gids({}), &out), 0);
  EXPECT_TRUE(out.empty());
  // The largest reply fits a record.
  std::vector<GidEntry> many(kMaxGids);
  EXPECT_LE(encode_gids(many).size(), kMaxMessageBytes);
}

TEST(Protocol, StatusRoundTrips) {
  const StatusInfo in{.pid = 7, .slot_count = 64, .slots_leased = 3, .leases = 9, .udp_port = 4791};
  StatusInfo out{};
  ASSERT_EQ(decode_status(encode_status(in), &out), 0);
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
  EXPECT_EQ(decode_status(encode_slot(SlotInfo{}), &out), EPROTO);
}

// StatusInfo grows by appending: the record of a daemon from before the wait counters decodes
// with them zero; any other length is refused.
TEST(Protocol, StatusOfTheFirstLayoutDecodesWithTheNewFieldsZero) {
  StatusInfo in{.pid = 7, .cm_dreq_retries = 5};
  in.cm_mras_sent = 9;
  std::vector<uint8_t> rec = encode_status(in);
  ASSERT_GT(rec.size(), sizeof(StatusInfo) - kStatusInfoFirstSize);
  rec.erase(rec.end() - static_cast<std::ptrdiff_t>(sizeof(StatusInfo) - kStatusInfoFirstSize),
            rec.end());
  MsgHeader h;
  std::memcpy(&h, rec.data(), sizeof h);
  h.size = static_cast<uint32_t>(rec.size());
  std::memcpy(rec.data(), &h, sizeof h);
  StatusInfo out{};
  out.cm_requests_waited = 3;
  ASSERT_EQ(decode_status(rec, &out), 0);
  EXPECT_EQ(out.pid, 7u);
  EXPECT_EQ(out.cm_dreq_retries, 5u);
  EXPECT_EQ(out.cm_requests_waited, 0u);
  EXPECT_EQ(out.cm_mras_sent, 0u);
  rec.pop_back();
  h.size = static_cast<uint32_t>(rec.size());
  std::memcpy(rec.data(), &h, sizeof h);
  EXPECT_EQ(decode_status(rec, &out), EPROTO);
}

TEST(Protocol, MadPushAndServiceRequestsRoundTrip) {
  MadDelivery in{};
  in.src_port = 4791;
  in.dst_port = 4791;
  in.src_address[15] = 1;
  const std::vector<uint8_t> datagram(280, 0xAB);
  MadDelivery out{};
  std::vector<uint8_t> got;
  ASSERT_EQ(decode_mad(encode_mad(in, datagram), &out, &got), 0);
  EXPECT_EQ(got, datagram);
  EXPECT_EQ(out.length, datagram.size());
  EXPECT_EQ(out.src_address[15], 1);
  // A length that disagrees with the record, or beyond the limit.
  auto rec = encode_mad(in, datagram);
  rec.pop_back();
  uint32_t size = static_cast<uint32_t>(rec.size());
  std::memcpy(rec.data() + 8, &size, sizeof size);
  EXPECT_EQ(decode_mad(rec, &out, &got), EPROTO);
  EXPECT_EQ(decode_mad(encode_mad(in, std::vector<uint8_t>(kMaxMadDatagramBytes + 4)), &out, &got),
            EPROTO);

  ServiceIdBody service{};
  ASSERT_EQ(decode_request_body(encode_service_request(MsgType::kListen, 0x1234), &service), 0);
  EXPECT_EQ(service.service_id, 0x1234u);
  SlotBody slot{};
  ASSERT_EQ(decode_request_body(encode_mad_channel(7), &slot), 0);
  EXPECT_EQ(slot.slot, 7u);
  EXPECT_EQ(decode_request_body(encode_request(MsgType::kListen), &service), EPROTO);
  EXPECT_EQ(decode_ok(encode_request(MsgType::kOk)), 0);
  EXPECT_EQ(decode_ok(encode_error(EADDRINUSE)), EADDRINUSE);
  EXPECT_EQ(decode_ok(encode_request(MsgType::kHello)), EPROTO);
}

TEST(Protocol, ErrorReplyCarriesItsErrno) {
  SlotInfo info;
  EXPECT_EQ(decode_slot(encode_error(EBUSY), &info), EBUSY);
  EXPECT_EQ(decode_slot(encode_error(EACCES), &info), EACCES);
  std::vector<GidEntry> gids;
  EXPECT_EQ(decode_gids(encode_error(EACCES), &gids), EACCES);
}

TEST(Protocol, RejectsMalformedRecords) {
  MsgHeader h;
  auto rec = encode_request(MsgType::kAcquireSlot);
  ASSERT_EQ(decode_header(rec, &h), 0);
  EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kAcquireSlot));
  // Short.
  EXPECT_EQ(decode_header(std::span(rec).first(15), &h), EPROTO);
  // Bad magic.
  auto bad = rec;
  bad[0] ^= 1;
  EXPECT_EQ(decode_header(bad, &h), EPROTO);
  // Another version.
  bad = rec;
  bad[4] = static_cast<uint8_t>(kProtocolVersion + 1);
  EXPECT_EQ(decode_header(bad, &h), EPROTONOSUPPORT);
  // Size field disagrees with the record.
  bad = rec;
  bad.push_back(0);
  EXPECT_EQ(decode_header(bad, &h), EPROTO);
  // A reply of the wrong type, or with a body of the wrong size.
  SlotInfo info;
  EXPECT_EQ(decode_slot(encode_gids({}), &info), EPROTO);
  auto slot = encode_slot(SlotInfo{});
  slot.pop_back();
  uint32_t size = static_cast<uint32_t>(slot.size());
  std::memcpy(slot.data() + 8, &size, sizeof size);
  EXPECT_EQ(decode_slot(slot, &info), EPROTO);
  // A GID count larger than the record.
  auto gids = encode_gids({});
  gids[sizeof(MsgHeader)] = 3;
  std::vector<GidEntry> out;
  EXPECT_EQ(decode_gids(gids, &out), EPROTO);
}

TEST(Protocol, HelloAndConnectionRecordsRoundTrip) {
  const HelloInfo hello{.pid = 7,
                        .keeper_pid = 6,
                        .uid = 1000,
                        .mode = kModeSystem,
                        .reserved = 0,
                        .netns_inode = 4026531840u};
  HelloInfo got{};
  ASSERT_EQ(decode_hello(encode_hello(hello), &got), 0);
  EXPECT_EQ(got.pid, 7u);
  EXPECT_EQ(got.keeper_pid, 6u);
  EXPECT_EQ(got.uid, 1000u);
  EXPECT_EQ(got.mode, kModeSystem);
  EXPECT_EQ(got.netns_inode, 4026531840u);
  EXPECT_EQ(decode_hello(encode_error(EXDEV), &got), EXDEV);
  EXPECT_EQ(decode_hello(encode_request(MsgType::kHello), &got), EPROTO) << "a hello without body";
  ConnRecord conn{.local_comm_id = 0x03000001, .remote_comm_id = 9, .remote_qpn = 0x1234};
  conn.peer_address[15] = 1;
  ConnRecord body{};
  ASSERT_EQ(decode_request_body(encode_conn_up(conn), &body), 0);
  EXPECT_EQ(body.local_comm_id, 0x03000001u);
  EXPECT_EQ(body.remote_qpn, 0x1234u);
  EXPECT_EQ(body.peer_address[15], 1);
  CommIdBody down{};
  ASSERT_EQ(decode_request_body(encode_conn_down(0x03000001), &down), 0);
  EXPECT_EQ(down.local_comm_id, 0x03000001u);
  EXPECT_EQ(decode_request_body(encode_conn_up(conn), &down), EPROTO) << "the wrong body size";
}

TEST(Protocol, RecordsAndFdsCrossASeqpacketSocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  // As many fds as a record may carry: a slot's socket.
  std::vector<UniqueFd> in;
  std::vector<int> raw;
  for (size_t i = 0; i < kMaxPassedFds; ++i) {
    in.emplace_back(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    raw.push_back(in.back().get());
  }
  const auto rec = encode_slot(SlotInfo{.slot = 2});
  ASSERT_EQ(send_record(a.get(), rec, raw), 0);
  std::vector<uint8_t> buf(kMaxMessageBytes);
  std::vector<UniqueFd> out;
  const ssize_t n = recv_record(b.get(), buf, &out);
  ASSERT_EQ(n, static_cast<ssize_t>(rec.size()));
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    struct stat s1, s2;
    ASSERT_EQ(fstat(in[i].get(), &s1), 0);
    ASSERT_EQ(fstat(out[i].get(), &s2), 0);
    EXPECT_EQ(s1.st_ino, s2.st_ino) << "the same socket, in order";
  }
  raw.push_back(raw.front());
  EXPECT_EQ(send_record(a.get(), rec, raw), EINVAL) << "more than kMaxPassedFds";
  // A peer that passes more (sendmsg by hand) gets its record refused, and none of its fds stays
  // open here: the kernel closes what did not fit, recv_record what did.
  {
    auto count_fds = [] {
      size_t open_fds = 0;
      for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
        open_fds += !e.path().empty();
      return open_fds;
    };
    std::vector<UniqueFd> many;
    std::vector<int> many_raw;
    for (int i = 0; i < 10; ++i) {
      many.emplace_back(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      many_raw.push_back(many.back().get());
    }
    const size_t before = count_fds();
    iovec iov{const_cast<uint8_t*>(rec.data()), rec.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(10 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(10 * sizeof(int));
    std::memcpy(CMSG_DATA(c), many_raw.data(), 10 * sizeof(int));
    ASSERT_EQ(sendmsg(a.get(), &msg, 0), static_cast<ssize_t>(rec.size()));
    std::vector<UniqueFd> got;
    EXPECT_EQ(recv_record(b.get(), buf, &got), -EMSGSIZE);
    got.clear();
    EXPECT_EQ(count_fds(), before) << "every passed fd closed";
  }
  // A record larger than the buffer is an error, not a silent truncation.
  ASSERT_EQ(send_record(a.get(), encode_gids(std::vector<GidEntry>(4))), 0);
  EXPECT_EQ(recv_record(b.get(), std::span(buf).first(20), nullptr), -EMSGSIZE);
  // EOF, and a send to a closed peer is an errno (no SIGPIPE).
  a.reset();
  EXPECT_EQ(recv_record(b.get(), buf, nullptr), 0);
  EXPECT_EQ(send_record(b.get(), rec), EPIPE);
}

// ---- `urdma status` and takeover records ----

ClientEntry entry(uint32_t pid, const char* comm) {
  ClientEntry e{};
  e.pid = pid;
  e.uid = 1000;
  e.slot = pid % 7;
  e.qpn_base = (pid % 7) << 12;
  e.qpn_count = 4096;
  e.role = static_cast<uint16_t>(ClientRole::kSlotHolder);
  e.flags = kClientReported;
  std::snprintf(e.comm, sizeof e.comm, "%s", comm);
  e.report.qp_count = 3;
  for (size_t i = 0; i < kCounterCount; ++i) e.report.counters[i] = pid * 100 + i;
  return e;
}

TEST(Protocol, ClientsPageRoundTrips) {
  const ClientsPage page{.uptime_ms = 1234,
                         .netns_inode = 4026531840,
                         .total = 40,
                         .first = 32,
                         .takeover = kTakeoverDone,
                         .survivors = 2};
  std::vector<ClientEntry> in{entry(10, "ibv_rc_pingpong"), entry(11, "qperf")};
  ClientsPage out_page{};
  std::vector<ClientEntry> out;
  ASSERT_EQ(decode_clients(encode_clients(page, in), &out_page, &out), 0);
  EXPECT_EQ(out_page.count, 2u) << "the encoder counts the entries";
  EXPECT_EQ(out_page.total, 40u);
  EXPECT_EQ(out_page.first, 32u);
  EXPECT_EQ(out_page.netns_inode, 4026531840u);
  EXPECT_EQ(out_page.takeover, kTakeoverDone);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_STREQ(out[0].comm, "ibv_rc_pingpong");
  EXPECT_EQ(out[1].report, in[1].report);
  EXPECT_EQ(std::memcmp(&out[0], &in[0], sizeof in[0]), 0);
  // A full page fits a record; more entries than a page holds are cut to a page.
  const std::vector<ClientEntry> many(kClientsPerPage + 5, entry(1, "x"));
  const auto rec = encode_clients(page, many);
  EXPECT_LE(rec.size(), kMaxMessageBytes);
  ASSERT_EQ(decode_clients(rec, &out_page, &out), 0);
  EXPECT_EQ(out.size(), size_t{kClientsPerPage});
}

TEST(Protocol, MalformedClientsPagesAreEPROTO) {
  const ClientsPage page{.total = 1};
  std::vector<ClientEntry> in{entry(10, "a")};
  ClientsPage out_page{};
  std::vector<ClientEntry> out;
  // One byte short (the header's size patched to agree): the count no longer matches.
  auto rec = encode_clients(page, in);
  rec.pop_back();
  uint32_t size = static_cast<uint32_t>(rec.size());
  std::memcpy(rec.data() + 8, &size, sizeof size);
  EXPECT_EQ(decode_clients(rec, &out_page, &out), EPROTO);
  // A count beyond a page, even with bytes to match it, is refused before anything is read.
  rec = encode_clients(page, in);
  const uint32_t huge = kClientsPerPage + 1;
  std::memcpy(rec.data() + sizeof(MsgHeader) + offsetof(ClientsPage, count), &huge, sizeof huge);
  EXPECT_EQ(decode_clients(rec, &out_page, &out), EPROTO);
  // Shorter than the page header.
  rec.resize(sizeof(MsgHeader) + 8);
  size = static_cast<uint32_t>(rec.size());
  std::memcpy(rec.data() + 8, &size, sizeof size);
  EXPECT_EQ(decode_clients(rec, &out_page, &out), EPROTO);
  // Another record type, and a kError carrying its errno.
  EXPECT_EQ(decode_clients(encode_slot(SlotInfo{}), &out_page, &out), EPROTO);
  EXPECT_EQ(decode_clients(encode_error(EACCES), &out_page, &out), EACCES);
  // A comm without its NUL comes out terminated.
  ClientEntry e = entry(1, "");
  std::memset(e.comm, 'A', sizeof e.comm);
  rec = encode_clients(page, std::vector<ClientEntry>{e});
  ASSERT_EQ(decode_clients(rec, &out_page, &out), 0);
  EXPECT_EQ(std::strlen(out[0].comm), sizeof e.comm - 1);
}

TEST(Protocol, RequestBodiesOfStatusAndTakeoverRoundTripAndRefuseWrongSizes) {
  ClientsQuery q{};
  ASSERT_EQ(decode_request_body(encode_clients_query(64), &q), 0);
  EXPECT_EQ(q.first, 64u);
  CounterReport r{};
  r.qp_count = 9;
  r.counters[0] = 77;
  r.counters[kCounterCount - 1] = 88;
  CounterReport got{};
  ASSERT_EQ(decode_request_body(encode_counter_report(r), &got), 0);
  EXPECT_EQ(got, r);
  const SlotInfo slot{.slot = 3, .slot_count = 8, .qpn_base = 11 << 12, .qpn_count = 4096};
  SlotInfo s{};
  ASSERT_EQ(decode_request_body(encode_reattach(slot), &s), 0);
  EXPECT_EQ(std::memcmp(&s, &slot, sizeof s), 0);
  // The wrong body for the type's size: EPROTO, never a read past the record.
  EXPECT_EQ(decode_request_body(encode_clients_query(1), &got), EPROTO);
  EXPECT_EQ(decode_request_body(encode_request(MsgType::kReportCounters), &got), EPROTO);
  EXPECT_EQ(decode_request_body(encode_counter_report(r), &s), EPROTO);
  // Names: rxe's first, every one distinct.
  EXPECT_STREQ(kCounterNames[0], "sent_pkts");
  EXPECT_STREQ(kCounterNames[kRxeCounterCount - 1], "rdma_recvs");
  for (size_t i = 0; i < kCounterCount; ++i)
    for (size_t j = i + 1; j < kCounterCount; ++j) EXPECT_STRNE(kCounterNames[i], kCounterNames[j]);
}

TEST(Protocol, CaptureRequestPushAndReplyRoundTrip) {
  CaptureBody body{};
  ASSERT_EQ(decode_request_body(encode_capture(1234), &body), 0);
  EXPECT_EQ(body.filter, 1234u);
  uint32_t slot = 0;
  ASSERT_EQ(decode_capture_on(encode_capture_on(7), &slot), 0);
  EXPECT_EQ(slot, 7u);
  EXPECT_EQ(decode_capture_on(encode_capturing(7), &slot), EPROTO) << "not a push";
  EXPECT_EQ(decode_capture_on(encode_request(MsgType::kOk), &slot), EPROTO);
  uint32_t processes = 0;
  ASSERT_EQ(decode_capturing(encode_capturing(3), &processes), 0);
  EXPECT_EQ(processes, 3u);
  EXPECT_EQ(decode_capturing(encode_error(EALREADY), &processes), EALREADY);
  EXPECT_EQ(decode_capturing(encode_capture_on(3), &processes), EPROTO);
  auto cut = encode_capture_on(3);
  cut.pop_back();
  EXPECT_EQ(decode_capture_on(cut, &slot), EPROTO) << "short";
}

// A record with its size field patched to what it is now (cut or grown by a test).
std::vector<uint8_t> resized(std::vector<uint8_t> rec, size_t size) {
  rec.resize(size);
  const uint32_t n = static_cast<uint32_t>(size);
  std::memcpy(rec.data() + offsetof(MsgHeader, size), &n, sizeof n);
  return rec;
}

TEST(Protocol, ShmRequestsRepliesAndPushesRoundTrip) {
  const net::Address address = net::Address::from_v4(127, 0, 0, 1);
  ShmConnectBody connect{};
  ASSERT_EQ(decode_request_body(encode_shm_connect(address, 0x123456), &connect), 0);
  EXPECT_EQ(connect.qpn, 0x123456u);
  EXPECT_EQ(net::Address(std::to_array(connect.address)), address);
  EXPECT_EQ(decode_request_body(encode_request(MsgType::kShmConnect), &connect), EPROTO)
      << "no body";
  EXPECT_EQ(decode_request_body(encode_shm_off(3), &connect), EPROTO) << "another body's size";

  EXPECT_EQ(decode_shm_accepted(encode_request(MsgType::kShmAccepted)), 0);
  EXPECT_EQ(decode_shm_accepted(encode_error(EALREADY)), EALREADY);
  EXPECT_EQ(decode_shm_accepted(encode_request(MsgType::kOk)), EPROTO);
  EXPECT_EQ(decode_shm_accepted(resized(encode_request(MsgType::kShmAccepted), 20)), EPROTO)
      << "a body where none goes";

  const ShmPairBody pair{.peer_range = 77, .side = 1, .peer_pid = 4242, .peer_slot = 13};
  ShmPairBody got{};
  ASSERT_EQ(decode_shm_ready(encode_shm_pair(MsgType::kShmReady, pair), &got), 0);
  EXPECT_EQ(std::memcmp(&got, &pair, sizeof got), 0);
  got = {};
  ASSERT_EQ(decode_shm_on(encode_shm_pair(MsgType::kShmOn, pair), &got), 0);
  EXPECT_EQ(std::memcmp(&got, &pair, sizeof got), 0);
  // Each decoder its own type: a reply is no push, a push no reply; a kError is the reply's.
  EXPECT_EQ(decode_shm_ready(encode_shm_pair(MsgType::kShmOn, pair), &got), EPROTO);
  EXPECT_EQ(decode_shm_on(encode_shm_pair(MsgType::kShmReady, pair), &got), EPROTO);
  EXPECT_EQ(decode_shm_ready(encode_error(EPERM), &got), EPERM);
  EXPECT_EQ(decode_shm_on(encode_error(EPERM), &got), EPROTO);
  // Malformed bodies: a side but 0 or 1, a range beyond the QPN space, a byte short or long.
  for (const ShmPairBody& bad : {ShmPairBody{.peer_range = 77, .side = 2},
                                 ShmPairBody{.peer_range = kRangeCount, .side = 0}}) {
    EXPECT_EQ(decode_shm_ready(encode_shm_pair(MsgType::kShmReady, bad), &got), EPROTO);
    EXPECT_EQ(decode_shm_on(encode_shm_pair(MsgType::kShmOn, bad), &got), EPROTO);
  }
  const auto ready = encode_shm_pair(MsgType::kShmReady, pair);
  EXPECT_EQ(decode_shm_ready(resized(ready, ready.size() - 1), &got), EPROTO);
  EXPECT_EQ(decode_shm_ready(resized(ready, ready.size() + 4), &got), EPROTO);
  auto cut = ready;
  cut.pop_back();  // the header's size left as it was
  EXPECT_EQ(decode_shm_ready(cut, &got), EPROTO);

  uint32_t range = 0;
  ASSERT_EQ(decode_shm_off(encode_shm_off(4095), &range), 0);
  EXPECT_EQ(range, 4095u);
  EXPECT_EQ(decode_shm_off(encode_shm_off(kRangeCount), &range), EPROTO) << "beyond the QPNs";
  EXPECT_EQ(decode_shm_off(encode_shm_pair(MsgType::kShmOn, pair), &range), EPROTO);
  const auto off = encode_shm_off(5);
  EXPECT_EQ(decode_shm_off(resized(off, off.size() - 1), &range), EPROTO);
}

TEST(Protocol, OnlyKShmReadyAndKShmOnCarryTwoFds) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  UniqueFd f1(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  UniqueFd f2(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const int two[] = {f1.get(), f2.get()};
  const int three[] = {f1.get(), f2.get(), f1.get()};
  const auto on = encode_shm_pair(MsgType::kShmOn, ShmPairBody{.peer_range = 9});
  const auto slot = encode_slot(SlotInfo{.slot = 2});
  EXPECT_EQ(max_fds_of(static_cast<uint16_t>(MsgType::kShmReady)), kShmPairFds);
  EXPECT_EQ(max_fds_of(static_cast<uint16_t>(MsgType::kSlot)), kMaxPassedFds);
  EXPECT_EQ(send_record(a.get(), slot, two), EINVAL) << "two fds with a kSlot";
  EXPECT_EQ(send_record(a.get(), on, three), EINVAL) << "three with a kShmOn";
  std::vector<uint8_t> buf(kMaxMessageBytes);
  // A client takes the two, in order.
  ASSERT_EQ(send_record(a.get(), on, two), 0);
  std::vector<UniqueFd> got;
  ASSERT_EQ(recv_record(b.get(), buf, &got, 0, kShmPairFds), static_cast<ssize_t>(on.size()));
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    struct stat s1, s2;
    ASSERT_EQ(fstat(two[i], &s1), 0);
    ASSERT_EQ(fstat(got[i].get(), &s2), 0);
    EXPECT_EQ(s1.st_ino, s2.st_ino) << "fd " << i;
  }
  got.clear();
  auto count_fds = [] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
      n += !e.path().empty();
    return n;
  };
  const size_t before = count_fds();
  // The daemon's side takes one: the same record is refused there, both fds closed.
  ASSERT_EQ(send_record(a.get(), on, two), 0);
  EXPECT_EQ(recv_record(b.get(), buf, &got), -EMSGSIZE);
  // Any other record with two (sent by hand) is refused even by a client.
  iovec iov{const_cast<uint8_t*>(slot.data()), slot.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  std::memcpy(CMSG_DATA(c), two, sizeof two);
  ASSERT_EQ(sendmsg(a.get(), &msg, 0), static_cast<ssize_t>(slot.size()));
  EXPECT_EQ(recv_record(b.get(), buf, &got, 0, kShmPairFds), -EMSGSIZE);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(count_fds(), before) << "every refused fd closed";
}

}  // namespace
}  // namespace urdma::daemon
