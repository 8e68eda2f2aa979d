// libFuzzer target: the CM Manager's state machine (src/cm/manager.h), IBA 12.9.
//
// THE WORLD (rebuilt for every input): two Managers, hosts 0 and 1 (urdmad slots 3 and 4), on
// one virtual clock, with a small connection bound (kMaxConnections) so that it is reached. What
// each sends waits in a list of MADs in flight (at most kMaxInFlight, the oldest dropped) until
// the input delivers it; a MAD to any other GID (a peer that never answers) is lost.
//
// THE INPUT: a config byte (Max CM Retries, CM response timeout), then operations, each an
// opcode byte and its operands (missing bytes read as 0). Connections are named from a pool of
// the IDs each host reported (connect, SIDR query, events) or by any 32-bit value:
//   0 connect      1 accept        2 reject       3 establish     4 notify_established
//   5 disconnect   6 destroy       7 sidr_query   8 sidr_answer   9 listen / stop_listening
//   10 qp_attrs    11 deliver one MAD in flight, maybe kept (a duplicate) or changed (a comm ID
//                  from the pools, another attribute, a flipped byte, cut short)
//   12 deliver everything in flight (what comes of it too, a few rounds)
//   13 raw bytes as a received MAD
//   14 a CM message built with wire::init_cm_message from input fields (REQ, MRA, REJ, REP,
//      RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP, APR, ClassPortInfo), its comm IDs taken from
//      the pools and from what peer() says of them, so that it names live connections
//   15 time passes (a few ms to minutes): run_timers while anything is due
// Parameters are in the range the API's callers give (rdma_cm: packet lifetime within the 5-bit
// timeout fields; private data and ARI sometimes too long, which is EINVAL).
//
// THE ORACLE (a violation prints it and aborts), after every operation, for both hosts:
//  * every MAD take_outgoing() gives parses with parse_cm;
//  * take_events() never reports an event for a connection destroy() was called on while it
//    existed, and each connection's events come in an order the state machine allows
//    (request → response → established → rejected / unreachable / disconnected → timewait
//    exit, tests/unit/cm/event_order.h);
//  * connection_count() never exceeds ManagerConfig::max_connections;
//  * state(id) of every ID ever named is one of the IBA 12.9 states (or the SIDR pair);
//  * run_timers() settles: after at most kMaxTimerRounds calls nothing is due at the time.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cm/manager.h"
#include "fuzz_check.h"
#include "net/clock.h"
#include "unit/cm/event_order.h"
#include "wire/byte_order.h"
#include "wire/cm.h"
#include "wire/mad.h"
#include "wire/rdma_cm_ip.h"

namespace {

using namespace urdma;
using namespace urdma::cm;

using fuzz::Input;

constexpr size_t kHosts = 2;
constexpr size_t kMaxConnections = 6;
constexpr size_t kMaxInFlight = 64;
constexpr int kMaxOps = 200;
constexpr int kMaxTimerRounds = 10000;
constexpr uint64_t kMs = 1'000'000;

Gid gid_v4(uint8_t last) {
  const std::array<uint8_t, 4> ip = {10, 1, 0, last};
  return wire::ipv4_mapped(ip);
}

constexpr uint64_t kSids[] = {
    wire::rdma_service_id(wire::RdmaPortSpace::kTcp, 1),
    wire::rdma_service_id(wire::RdmaPortSpace::kTcp, 2),
    wire::rdma_service_id(wire::RdmaPortSpace::kUdp, 1),
    wire::rdma_service_id(wire::RdmaPortSpace::kIb, 1),
    0x1234,  // a native IB service ID
};

using cm::test::EventOrder;

struct Flight {
  size_t from;
  OutgoingMad out;
};

class World {
 public:
  explicit World(Input& in) : in_(in) {
    const uint8_t cfg = in.u8();
    for (size_t h = 0; h < kHosts; ++h) {
      ManagerConfig c;
      c.slot = static_cast<unsigned>(3 + h);
      c.local_ca_guid = 0x100 + h;
      c.seed = 7 + h;
      c.max_connections = kMaxConnections;
      c.max_initiator_depth = 8;
      c.max_responder_resources = 8;
      // Short timeouts and few retries, or rdma_cm's (15 retries of ~4 s).
      if (cfg & 1) {
        c.max_cm_retries = static_cast<uint8_t>((cfg >> 1) & 15);
        c.cm_response_timeout = static_cast<uint8_t>(8 + ((cfg >> 5) & 7) * 2);
      }
      gids_[h] = gid_v4(static_cast<uint8_t>(h + 1));
      managers_[h] = std::make_unique<Manager>(c, clock_);
    }
  }

  void run() {
    for (int ops = 0; !in_.done() && ops < kMaxOps; ++ops) {
      const uint8_t op = in_.u8();
      const size_t h = op >> 7;  // the host it acts on
      switch (op % 16) {
        case 0:
          connect(h);
          break;
        case 1:
          accept(h);
          break;
        case 2:
          reject(h);
          break;
        case 3:
          (void)m(h).establish(some_id(h));
          break;
        case 4:
          (void)m(h).notify_established(some_id(h));
          break;
        case 5: {
          const ConnId id = some_id(h);
          const auto pd = data(kDreqPrivateDataMax + 8);
          (void)m(h).disconnect(id, pd);
          break;
        }
        case 6:
          destroy(h);
          break;
        case 7:
          sidr_query(h);
          break;
        case 8:
          sidr_answer(h);
          break;
        case 9: {
          const uint64_t sid = kSids[in_.u8() % std::size(kSids)];
          if (in_.u8() & 1)
            (void)m(h).stop_listening(sid);
          else
            (void)m(h).listen(sid);
          break;
        }
        case 10:
          (void)m(h).qp_attrs(some_id(h), static_cast<ibv_qp_state>(in_.u8() % 8));
          break;
        case 11:
          deliver_one();
          break;
        case 12:
          deliver_all();
          break;
        case 13:
          raw(h);
          break;
        case 14:
          built(h);
          break;
        default:
          advance();
          break;
      }
      collect();
    }
  }

 private:
  Manager& m(size_t h) { return *managers_[h]; }

  std::span<const uint8_t> data(size_t max) {
    // Sometimes beyond what the message carries: EINVAL.
    return in_.bytes(in_.u8() % (max + 9));
  }

  // A connection ID of host h: one it reported, or any.
  ConnId some_id(size_t h) {
    const uint8_t pick = in_.u8();
    if (ids_[h].empty() || pick >= 240) return pick >= 248 ? in_.u32() : 0;
    return ids_[h][pick % ids_[h].size()];
  }
  void note_id(size_t h, ConnId id) {
    if (named_[h].insert(id).second) ids_[h].push_back(id);
  }

  uint8_t resources() {
    const uint8_t r = in_.u8();
    return r >= 200 ? kMaxResources : static_cast<uint8_t>(r % 12);
  }

  Path path(size_t h) {
    Path p;
    p.local_gid = gids_[h];
    p.remote_gid = (in_.u8() % 5) ? gids_[1 - h] : gid_v4(9);  // sometimes nobody
    p.mtu = static_cast<uint8_t>(in_.u8() % 7);                // 0 and 6: EINVAL
    p.packet_life_time = static_cast<uint8_t>(in_.u8() % 32);
    p.flow_label = in_.u32() & 0xFFFFF;
    return p;
  }

  std::optional<wire::CmaAddress> ip(size_t h) {
    const uint8_t how = in_.u8() % 4;
    if (how == 0) return std::nullopt;
    wire::CmaAddress a{.src_port = in_.u16(), .src_addr = gids_[h]};
    if (how == 2) a.ip_version = wire::kCmaIpVersion6;
    if (how == 3) a.ip_version = in_.u8();  // EINVAL but for 4 and 6
    return a;
  }

  void connect(size_t h) {
    ConnectParams p;
    p.path = path(h);
    p.service_id = kSids[in_.u8() % std::size(kSids)];
    p.qpn = 0x40 + in_.u8() % 4;  // few QPNs: stale connections happen
    p.starting_psn = in_.u32();
    const uint8_t flags = in_.u8();
    p.unreliable = flags & 1;
    p.manual_rtu = flags & 2;
    p.flow_control = flags & 4;
    p.srq = flags & 8;
    p.retry_count = in_.u8() % 9;
    p.rnr_retry_count = in_.u8() % 9;
    p.responder_resources = resources();
    p.initiator_depth = resources();
    p.ip = ip(h);
    const auto pd = data(kReqPrivateDataMax);
    p.private_data = pd;
    if (auto r = m(h).connect(p); r.ok()) note_id(h, *r);
  }

  void accept(size_t h) {
    const ConnId id = some_id(h);
    AcceptParams p;
    p.qpn = 0x80 + in_.u8() % 4;
    p.responder_resources = resources();
    p.initiator_depth = resources();
    p.rnr_retry_count = in_.u8() % 9;
    const uint8_t flags = in_.u8();
    p.flow_control = flags & 1;
    p.srq = flags & 2;
    const auto pd = data(kRepPrivateDataMax);
    p.private_data = pd;
    (void)m(h).accept(id, p);
  }

  void reject(size_t h) {
    const ConnId id = some_id(h);
    RejectParams p;
    p.reason = in_.u8() < 128 ? static_cast<uint16_t>(in_.u8() % 40) : in_.u16();
    const auto ari = data(kRejAriMax);
    const auto pd = data(kRejPrivateDataMax);
    p.ari = ari;
    p.private_data = pd;
    (void)m(h).reject(id, p);
  }

  void destroy(size_t h) {
    const ConnId id = some_id(h);
    // Only a connection that exists now is destroyed: its ID is never given again (a later
    // connection could get an ID that was never in use).
    if (m(h).state(id)) destroyed_[h].insert(id);
    m(h).destroy(id);
  }

  void sidr_query(size_t h) {
    SidrQueryParams q;
    q.path = path(h);
    q.service_id = kSids[in_.u8() % std::size(kSids)];
    q.ip = ip(h);
    const auto pd = data(kSidrReqPrivateDataMax);
    q.private_data = pd;
    if (auto r = m(h).sidr_query(q); r.ok()) note_id(h, *r);
  }

  void sidr_answer(size_t h) {
    const ConnId id = some_id(h);
    SidrAnswerParams a;
    a.status = static_cast<uint8_t>(in_.u8() % 8);
    a.qpn = in_.u32();
    a.qkey = in_.u32();
    const auto pd = data(kSidrRepPrivateDataMax);
    a.private_data = pd;
    (void)m(h).sidr_answer(id, a);
  }

  // Where a MAD from the input comes from: the other host (mostly), itself, or a stranger.
  Gid source(size_t h) {
    const uint8_t s = in_.u8() % 8;
    return s < 6 ? gids_[1 - h] : s == 6 ? gids_[h] : gid_v4(9);
  }

  void receive(size_t h, const Gid& src, std::span<const uint8_t> mad) {
    // An exactly-sized copy, so ASan sees a read past the end.
    const std::vector<uint8_t> copy(mad.begin(), mad.end());
    m(h).receive(src, wire::kMadGsiQpn, copy);
  }

  // A comm ID for a message to host h: one of h's (the receiver's), what h's peer calls itself
  // (peer()), 0, or any.
  uint32_t receiver_id(size_t h) { return some_id(h); }
  uint32_t sender_id(size_t h) {
    const uint8_t how = in_.u8() % 8;
    if (how < 5 && !ids_[h].empty()) {
      if (const auto p = m(h).peer(ids_[h][in_.u8() % ids_[h].size()])) return p->remote_comm_id;
    }
    if (how == 5 && !ids_[1 - h].empty()) return ids_[1 - h][in_.u8() % ids_[1 - h].size()];
    return how == 6 ? 0 : in_.u32();
  }

  void deliver(const Flight& f, std::span<const uint8_t> mad) {
    for (size_t h = 0; h < kHosts; ++h) {
      if (gids_[h] == f.out.dest_gid) {
        receive(h, gids_[f.from], mad);
        return;
      }
    }
  }

  void deliver_one() {
    if (flight_.empty()) return;
    const size_t i = in_.u8() % flight_.size();
    const Flight f = flight_[i];
    const uint8_t how = in_.u8();
    if (!(how & 0x80)) flight_.erase(flight_.begin() + static_cast<ptrdiff_t>(i));  // else a dup
    Mad mad = f.out.mad;
    size_t len = mad.size();
    const size_t to = gids_[0] == f.out.dest_gid ? 0 : 1;
    switch (how & 7) {
      case 0:  // a comm ID from the pools
        wire::store_be32(mad.data() + wire::kCm + 4 * (in_.u8() & 1),
                         (in_.u8() & 1) ? receiver_id(to) : sender_id(to));
        break;
      case 1:  // another message
        wire::store_be16(mad.data() + 16, static_cast<uint16_t>(0x10 + in_.u8() % 11));
        break;
      case 2:
        mad[in_.u8() % mad.size()] ^= static_cast<uint8_t>(1u << (in_.u8() & 7));
        break;
      case 3:
        len = in_.u8() % mad.size();
        break;
      default:
        break;
    }
    deliver(f, std::span<const uint8_t>(mad.data(), len));
  }

  void deliver_all() {
    for (int round = 0; round < 8 && !flight_.empty(); ++round) {
      std::deque<Flight> now;
      now.swap(flight_);
      for (const Flight& f : now) deliver(f, f.out.mad);
      collect();
    }
  }

  void raw(size_t h) {
    const Gid src = source(h);
    const size_t len = in_.u8() < 224 ? wire::kMadSize : in_.u16() % (wire::kMadSize + 64);
    receive(h, src, in_.bytes(len));
  }

  template <typename View>
  View start(Mad& mad) {
    return wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(mad), in_.u64());
  }

  // A well-formed CM message for host h: its body from the input, its IDs from the pools.
  void built(size_t h) {
    Mad mad{};
    const uint8_t kind = in_.u8() % 12;
    const uint32_t to = receiver_id(h);
    const uint32_t from = sender_id(h);
    const auto body = in_.bytes(in_.u8() % (wire::kMadDataSize + 1));
    const auto fill = [&] { std::copy(body.begin(), body.end(), mad.begin() + wire::kCm); };
    switch (kind) {
      case 0: {
        start<wire::CmReq>(mad);
        fill();
        const wire::CmReq r(mad);
        r.set_local_comm_id(from);
        r.set_service_id(kSids[in_.u8() % std::size(kSids)]);
        r.primary_path().set_local_port_gid(gids_[1 - h]);
        r.primary_path().set_remote_port_gid(gids_[h]);
        r.set_path_packet_payload_mtu(1 + in_.u8() % 5);
        r.set_transport_service_type(in_.u8() % 2);
        r.set_remote_eecn(0);
        if (in_.u8() & 1) {
          // rdma_cm's IP header in the private data, so that it is a connection request.
          wire::CmaAddress a{.src_port = in_.u16(), .src_addr = gids_[1 - h]};
          wire::write_cma_hdr(r.private_data().first<wire::kCmaHdrSize>(), a);
        }
        break;
      }
      case 1: {
        start<wire::CmMra>(mad);
        fill();
        const wire::CmMra r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        r.set_message_mraed(in_.u8() % 3);
        break;
      }
      case 2: {
        start<wire::CmRej>(mad);
        fill();
        const wire::CmRej r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(in_.u8() < 32 ? 0 : to);
        r.set_message_rejected(in_.u8() % 3);
        r.set_reject_info_length(r.reject_info_length() % 73);
        break;
      }
      case 3: {
        start<wire::CmRep>(mad);
        fill();
        const wire::CmRep r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        break;
      }
      case 4: {
        start<wire::CmRtu>(mad);
        fill();
        const wire::CmRtu r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        break;
      }
      case 5: {
        start<wire::CmDreq>(mad);
        fill();
        const wire::CmDreq r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        const uint8_t qpn = in_.u8();  // one of the QPNs connect and accept give
        r.set_remote_qpn_eecn(((qpn & 4) ? 0x80u : 0x40u) + (qpn & 3));
        break;
      }
      case 6: {
        start<wire::CmDrep>(mad);
        fill();
        const wire::CmDrep r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        break;
      }
      case 7: {
        start<wire::CmSidrReq>(mad);
        fill();
        const wire::CmSidrReq r(mad);
        r.set_request_id(from);
        r.set_service_id(kSids[in_.u8() % std::size(kSids)]);
        break;
      }
      case 8: {
        start<wire::CmSidrRep>(mad);
        fill();
        const wire::CmSidrRep r(mad);
        r.set_request_id(to);
        r.set_additional_information_length(r.additional_information_length() % 73);
        break;
      }
      case 9: {
        start<wire::CmLap>(mad);
        fill();
        const wire::CmLap r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        break;
      }
      case 10: {
        start<wire::CmApr>(mad);
        fill();
        const wire::CmApr r(mad);
        r.set_local_comm_id(from);
        r.set_remote_comm_id(to);
        r.set_additional_information_length(r.additional_information_length() % 73);
        break;
      }
      default:
        start<wire::CmClassPortInfo>(mad);
        fill();
        break;
    }
    REQUIRE(wire::parse_cm(mad).ok(), "harness: a built message does not parse");
    receive(h, source(h), mad);
  }

  void advance() {
    const uint8_t scale = in_.u8();
    uint64_t ns = scale < 96    ? in_.u8() * kMs                   // up to 1/4 s
                  : scale < 200 ? uint64_t{in_.u16()} * kMs        // up to a minute
                                : uint64_t{in_.u32()} * kMs / 16;  // up to ~3 days
    clock_.advance(ns);
    for (size_t h = 0; h < kHosts; ++h) {
      int rounds = 0;
      while (m(h).next_deadline_ns() <= clock_.now_ns()) {
        REQUIRE(++rounds <= kMaxTimerRounds, "run_timers never settles");
        m(h).run_timers();
      }
    }
  }

  // Takes what both hosts produced and checks the oracle.
  void collect() {
    for (size_t h = 0; h < kHosts; ++h) {
      for (OutgoingMad& o : m(h).take_outgoing()) {
        const wire::CmParse p = wire::parse_cm(o.mad);
        REQUIRE(p.ok(), "host " + std::to_string(h) + " sent a MAD parse_cm refuses (" +
                            std::string(wire::mad_error_name(p.error)) + ")");
        flight_.push_back(Flight{h, o});
        if (flight_.size() > kMaxInFlight) flight_.pop_front();
      }
      for (const Event& e : m(h).take_events()) {
        REQUIRE(!destroyed_[h].contains(e.id),
                "host " + std::to_string(h) + " reported " + std::string(event_name(e.type)) +
                    " for destroyed connection " + std::to_string(e.id));
        const std::string err = order_[h].add(e);
        REQUIRE(err.empty(), "host " + std::to_string(h) + ": " + err);
        note_id(h, e.id);
      }
      REQUIRE(m(h).connection_count() <= kMaxConnections,
              "host " + std::to_string(h) + " holds more than max_connections");
      for (const ConnId id : ids_[h]) {
        if (const auto s = m(h).state(id)) {
          REQUIRE(static_cast<uint8_t>(*s) <= static_cast<uint8_t>(State::kSidrReqRcvd),
                  "a state outside IBA 12.9's");
        }
      }
    }
  }

  Input& in_;
  net::VirtualClock clock_{1'000'000'000};
  std::array<std::unique_ptr<Manager>, kHosts> managers_;
  std::array<Gid, kHosts> gids_;
  std::array<std::vector<ConnId>, kHosts> ids_;
  std::array<std::set<ConnId>, kHosts> named_;
  std::array<std::set<ConnId>, kHosts> destroyed_;
  std::array<EventOrder, kHosts> order_;
  std::deque<Flight> flight_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  World world(in);
  world.run();
  return 0;
}
