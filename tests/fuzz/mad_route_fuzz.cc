// libFuzzer target: urdmad's handling of slot 0's datagrams (the CM MADs a peer sends to QP1)
// and of the connections processes report, through the pure pieces the daemon is made of
// (mad_router.h, cm_agent.h): no sockets, no clock but the one the input drives.
//
// THE INPUT is a sequence of operations, each an opcode byte and its operands (missing bytes
// read as 0):
//   0 RAW        flow, length(2), bytes: a datagram as it arrives on slot 0
//   1 BUILT      flow, a CM message built from input fields (any of the twelve, body bytes
//                from the input, the comm IDs chosen), sent as build_gmp would; a flag may flip
//                one byte after the ICRC was sealed
//   2 CONN_UP    slot, a ConnRecord (kConnUp): ConnTable::add
//   3 CONN_DOWN  slot, local comm ID (kConnDown): ConnTable::remove
//   4 RECLAIM    slot: the process died — ConnTable::reclaim, each connection a Releases DREQ
//   5 ADVANCE    milliseconds: Releases::due at the new time, each DREQ built and sent
//   6 FORGET     slot: RequesterTable::forget_slot
//   7 BULK_CONNS slot, count(2): that many connections added (reaches kMaxConnsPerSlot)
//   8 BULK_REQS  slot, count(2): that many requesters remembered (reaches kCapacity)
//   9 DREP       a DREP for a DREQ the daemon sent (or a perturbed one): Releases::take_drep
// A datagram goes where urdmad sends it: ICRC first (icrc_ok); a DREP routed by comm ID may be
// the daemon's own (take_drep); a REQ / SIDR_REQ for a service (listened on or not, an input
// bit) is remembered or answered (no_listener_reply); a REJ without a remote ID takes its
// requester; an ID that names no live slot (an input bit) gets orphan_drep's answer.
//
// THE ORACLE (a violation traps):
//  * route_mad: a drop has a reason route_mad may give; a route names a well-formed CM MAD in a
//    UD SEND Only to QP1, by the field IBA says (REQ / SIDR_REQ: service ID, REJ with remote ID
//    0: its local ID, others: the receiver's comm ID, whose top 8 bits are the slot);
//  * every answer (REJ, SIDR_REP, DREP, DREQ) parses as the message it should be with the IDs
//    swapped as cm_agent.h says and the transaction ID echoed, and as a GMP: a UD SEND Only to
//    QP1 from QP1 with the GSI Q_Key, P_Key 0xFFFF, its ICRC right for its flow; routed back it
//    goes where its IDs say;
//  * ConnTable agrees with a model (EINVAL for a comm ID of another slot, ENOSPC at
//    kMaxConnsPerSlot, replace on a second add) and never holds more than kMaxConnsPerSlot;
//  * RequesterTable never holds more than kCapacity, and take() never gives a slot for a
//    requester not remembered (or already taken, or forgotten with its slot);
//  * Releases never tracks more than kMax (add refuses only then), due() never returns more
//    than the token bucket allows (kBurst at once, kPerSecond after), each DREQ at most
//    1 + kRetries times and counted one by one, and take_drep() takes exactly the DREP that
//    answers a tracked DREQ from its peer.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "daemon/cm_agent.h"
#include "daemon/mad_router.h"
#include "daemon/protocol.h"
#include "fuzz_check.h"
#include "gsi/gmp.h"
#include "net/address.h"
#include "wire/byte_order.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/mad.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace {

using namespace urdma;
using daemon::CmMad;
using daemon::ConnTable;
using daemon::MadDrop;
using daemon::MadRoute;
using daemon::PeerConn;
using daemon::Releases;
using daemon::RequesterTable;

using fuzz::Input;

constexpr unsigned kSlots = 9;  // slots the operations name: few, so they collide

// An address: a few fixed ones (so tables match), or any from the input.
net::Address address(Input& in) {
  switch (in.u8() % 6) {
    case 0:
      return net::Address::from_v4(10, 0, 0, 1);
    case 1:
      return net::Address::from_v4(10, 0, 0, 2);
    case 2:
      return *net::Address::parse("fd00::1");
    case 3:
      return net::Address::from_v4(in.u32());
    default: {
      net::Address::Bytes b{};
      const auto s = in.bytes(16);
      std::copy(s.begin(), s.end(), b.begin());
      return net::Address(b);
    }
  }
}

net::Endpoint endpoint(Input& in) {
  const net::Address a = address(in);
  const uint8_t p = in.u8();
  return net::Endpoint{a, p < 200 ? wire::kRoceV2UdpPort : static_cast<uint16_t>(in.u16())};
}

// A comm ID: of a slot (small, so it names one the tables hold), 0, or any.
uint32_t comm_id(Input& in) {
  const uint8_t how = in.u8();
  if (how < 160) return daemon::comm_id_for_slot(how % kSlots, in.u8() % 8);
  if (how < 176) return 0;
  return in.u32();
}

std::span<const uint8_t> mad_of(std::span<const uint8_t> datagram) {
  return gsi::parse_gmp(datagram).mad;
}

// ---- a CM message from input fields ---------------------------------------------------------
template <typename View>
View start(CmMad& mad, uint64_t tid) {
  return wire::init_cm_message<View>(std::span<uint8_t, wire::kMadSize>(mad), tid);
}

CmMad built_message(Input& in) {
  CmMad mad{};
  const uint8_t kind = in.u8() % 12;
  const uint64_t tid = in.u64();
  const uint32_t a = comm_id(in);
  const uint32_t b = comm_id(in);
  const uint64_t service_id = in.u8() < 128 ? 0x0106000000000000ULL + in.u8() : in.u64();
  switch (kind) {
    case 0:
      start<wire::CmReq>(mad, tid);
      break;
    case 1:
      start<wire::CmMra>(mad, tid);
      break;
    case 2:
      start<wire::CmRej>(mad, tid);
      break;
    case 3:
      start<wire::CmRep>(mad, tid);
      break;
    case 4:
      start<wire::CmRtu>(mad, tid);
      break;
    case 5:
      start<wire::CmDreq>(mad, tid);
      break;
    case 6:
      start<wire::CmDrep>(mad, tid);
      break;
    case 7:
      start<wire::CmSidrReq>(mad, tid);
      break;
    case 8:
      start<wire::CmSidrRep>(mad, tid);
      break;
    case 9:
      start<wire::CmLap>(mad, tid);
      break;
    case 10:
      start<wire::CmApr>(mad, tid);
      break;
    default:
      start<wire::CmClassPortInfo>(mad, tid);
      break;
  }
  // The body from the input, then the fields that decide the route and well-formedness.
  const auto body = in.bytes(in.u8() % (wire::kMadDataSize + 1));
  std::copy(body.begin(), body.end(), mad.begin() + wire::kCm);
  const auto span = std::span<uint8_t, wire::kMadSize>(mad);
  switch (kind) {
    case 0: {
      const wire::CmReq m(span);
      m.set_local_comm_id(a);
      m.set_service_id(service_id);
      break;
    }
    case 2: {
      const wire::CmRej m(span);
      m.set_local_comm_id(a);
      m.set_remote_comm_id(b);
      m.set_reject_info_length(m.reject_info_length() % 73);
      break;
    }
    case 7: {
      const wire::CmSidrReq m(span);
      m.set_request_id(a);
      m.set_service_id(service_id);
      break;
    }
    case 8: {
      const wire::CmSidrRep m(span);
      m.set_request_id(b);
      m.set_additional_information_length(m.additional_information_length() % 73);
      break;
    }
    case 10: {
      const wire::CmApr m(span);
      m.set_local_comm_id(a);
      m.set_remote_comm_id(b);
      m.set_additional_information_length(m.additional_information_length() % 73);
      break;
    }
    case 11:
      break;
    default:  // MRA, REP, RTU, DREQ, DREP, LAP: local then remote comm ID at kCm
      wire::store_be32(mad.data() + wire::kCm, a);
      wire::store_be32(mad.data() + wire::kCm + 4, b);
      break;
  }
  return mad;
}

// ---- the oracle for what the agent sends ----------------------------------------------------

// A GMP built by build_gmp: a UD SEND Only to QP1 carrying `mad`, its ICRC right for the flow,
// and routed back by its own IDs.
void check_gmp(std::span<const uint8_t> datagram, const CmMad& mad, uint32_t psn,
               const net::Endpoint& src, const net::Endpoint& dst) {
  REQUIRE(datagram.size() == gsi::kGmpBytes, "GMP size");
  const auto p = wire::parse_packet(datagram);
  REQUIRE(p.ok(), "the agent's GMP does not parse");
  REQUIRE(p->opcode() == wire::op::kUdSendOnly, "GMP opcode");
  REQUIRE(p->bth().dest_qp() == wire::kMadGsiQpn && p->bth().pkey() == wire::kDefaultPkey &&
              p->bth().psn() == (psn & wire::kQpnMask),
          "GMP BTH");
  REQUIRE(p->deth() && p->deth()->qkey() == wire::kMadGsiQKey &&
              p->deth()->src_qp() == wire::kMadGsiQpn,
          "GMP DETH");
  REQUIRE(p->payload().size() == wire::kMadSize &&
              std::equal(mad.begin(), mad.end(), p->payload().begin()),
          "GMP payload is not the MAD");
  REQUIRE(gsi::icrc_ok(datagram, src, dst), "GMP ICRC wrong for its flow");
  const MadRoute r = daemon::route_mad(datagram);
  REQUIRE(r.by != MadRoute::By::kDrop, "the agent's GMP is dropped by the router");
}

// An answer must parse as `View`'s message with `tid`; returns the view.
template <typename View>
View parsed_as(const CmMad& mad, uint64_t tid) {
  const wire::CmParse p = wire::parse_cm(mad);
  REQUIRE(p.ok(), "the agent's MAD does not parse");
  const View* v = std::get_if<View>(&p.message.view);
  REQUIRE(v != nullptr, "the agent's MAD is another message");
  REQUIRE(p.message.header.transaction_id() == tid, "transaction ID not echoed");
  return *v;
}

// ---- the world ------------------------------------------------------------------------------

struct ReleaseModel {
  PeerConn conn;
  uint64_t tid = 0;
  int sends = 0;  // due() returned it this often since its add
};

class World {
 public:
  void run(Input& in) {
    for (int ops = 0; !in.done() && ops < 256; ++ops) {
      switch (in.u8() % 10) {
        case 0:
          raw(in);
          break;
        case 1:
          built(in);
          break;
        case 2:
          conn_up(in);
          break;
        case 3:
          conn_down(in);
          break;
        case 4:
          reclaim(in.u8() % kSlots);
          break;
        case 5:
          advance(in);
          break;
        case 6:
          forget(in.u8() % kSlots);
          break;
        case 7:
          bulk_conns(in);
          break;
        case 8:
          bulk_requesters(in);
          break;
        default:
          drep(in);
          break;
      }
      check_bounds();
    }
  }

 private:
  void raw(Input& in) {
    const net::Endpoint src = endpoint(in), dst = endpoint(in);
    const size_t len = in.u16() % (daemon::kMaxMadDatagramBytes + 64);
    const auto bytes = in.bytes(len);
    const std::vector<uint8_t> datagram(bytes.begin(), bytes.end());  // exact size for ASan
    slot0(datagram, src, dst, in);
  }

  void built(Input& in) {
    const net::Endpoint src = endpoint(in), dst = endpoint(in);
    const CmMad mad = built_message(in);
    const uint32_t psn = in.u32();
    std::array<uint8_t, gsi::kGmpBytes> buf{};
    const size_t n = gsi::build_gmp(buf, mad, psn, src, dst);
    if (src.address.is_v4() != dst.address.is_v4()) {
      // Two families name no flow: no socket receives such a datagram.
      REQUIRE(n == 0, "build_gmp sealed a GMP for two families");
      return;
    }
    REQUIRE(n == buf.size(), "build_gmp failed on a MAD");
    REQUIRE(gsi::icrc_ok(buf, src, dst), "build_gmp's ICRC");
    const uint8_t flip = in.u8();
    if (flip >= 0xC0) buf[in.u16() % buf.size()] ^= static_cast<uint8_t>(1u << (flip & 7));
    const std::vector<uint8_t> datagram(buf.begin(), buf.end());
    slot0(datagram, src, dst, in);
  }

  // What route_mad says, checked against the datagram; then what urdmad does with it.
  void slot0(std::span<const uint8_t> datagram, const net::Endpoint& src, const net::Endpoint& dst,
             Input& in) {
    const uint8_t bits = in.u8();  // is a process listening, is the slot live
    const MadRoute route = daemon::route_mad(datagram);
    const auto mad = mad_of(datagram);
    check_route(route, datagram, mad);
    check_answers(mad);
    // urdmad: nothing has an effect before the ICRC holds.
    if (!gsi::icrc_ok(datagram, src, dst)) return;
    switch (route.by) {
      case MadRoute::By::kDrop:
        return;
      case MadRoute::By::kSlot: {
        if (take_drep(src.address, mad)) return;
        if (bits & 1) return;  // a live slot with a channel: forwarded
        answer_orphan(mad, src, dst);
        return;
      }
      case MadRoute::By::kServiceId: {
        if (bits & 1) {  // a process listens: forwarded, the requester remembered
          const unsigned slot = (bits >> 1) % kSlots;
          if (route.sender_comm_id != 0) remember(src.address, route.sender_comm_id, slot);
        } else {
          answer_no_listener(mad, src, dst);
        }
        return;
      }
      case MadRoute::By::kRequester: {
        const auto slot = requesters_.take(src.address, route.sender_comm_id);
        const auto it = requester_model_.find({src.address, route.sender_comm_id});
        if (slot) {
          REQUIRE(it != requester_model_.end() && it->second == *slot,
                  "RequesterTable::take gave a slot never remembered for that requester");
        }
        if (it != requester_model_.end()) requester_model_.erase(it);
        if (!slot && !(bits & 1)) answer_orphan(mad, src, dst);
        return;
      }
    }
  }

  void check_route(const MadRoute& r, std::span<const uint8_t> datagram,
                   std::span<const uint8_t> mad) {
    if (r.by == MadRoute::By::kDrop) {
      REQUIRE(r.drop == MadDrop::kNotRoce || r.drop == MadDrop::kNotQp1 ||
                  r.drop == MadDrop::kNotUdSend || r.drop == MadDrop::kNotCm ||
                  r.drop == MadDrop::kClassPortInfo,
              "route_mad dropped with a reason of the daemon's");
      REQUIRE(std::string(daemon::mad_drop_name(r.drop)) != "?", "drop without a name");
      return;
    }
    REQUIRE(r.drop == MadDrop::kNone, "a route with a drop reason");
    const auto p = wire::parse_packet(datagram);
    REQUIRE(
        p.ok() && p->bth().dest_qp() == wire::kMadGsiQpn && p->opcode() == wire::op::kUdSendOnly,
        "routed: not a UD SEND Only to QP1");
    REQUIRE(mad.size() == wire::kMadSize, "routed: no MAD");
    const wire::CmParse cm = wire::parse_cm(mad);
    REQUIRE(cm.ok(), "routed: not a well-formed CM MAD");
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<M, wire::CmReqView>) {
            REQUIRE(r.by == MadRoute::By::kServiceId && r.service_id == m.service_id() &&
                        r.sender_comm_id == m.local_comm_id(),
                    "REQ routed by another field");
          } else if constexpr (std::is_same_v<M, wire::CmSidrReqView>) {
            REQUIRE(r.by == MadRoute::By::kServiceId && r.service_id == m.service_id() &&
                        r.sender_comm_id == 0,
                    "SIDR_REQ routed by another field");
          } else if constexpr (std::is_same_v<M, wire::CmSidrRepView>) {
            REQUIRE(
                r.by == MadRoute::By::kSlot && r.slot == daemon::slot_of_comm_id(m.request_id()),
                "SIDR_REP routed by another field");
          } else if constexpr (std::is_same_v<M, wire::CmRejView>) {
            if (m.remote_comm_id() == 0) {
              REQUIRE(r.by == MadRoute::By::kRequester && r.sender_comm_id == m.local_comm_id(),
                      "REJ without remote ID routed by another field");
            } else {
              REQUIRE(r.by == MadRoute::By::kSlot &&
                          r.slot == daemon::slot_of_comm_id(m.remote_comm_id()),
                      "REJ routed by another field");
            }
          } else if constexpr (std::is_same_v<M, wire::CmClassPortInfoView>) {
            fuzz::invariant_broken(__FILE__, "ClassPortInfo routed");
          } else {
            REQUIRE(r.by == MadRoute::By::kSlot &&
                        r.slot == daemon::slot_of_comm_id(m.remote_comm_id()),
                    "message routed by another field than its remote comm ID");
          }
          REQUIRE(r.slot < 256, "slot beyond the comm ID's 8 bits");
        },
        cm.message.view);
  }

  // no_listener_reply and orphan_drep answer exactly REQ / SIDR_REQ and DREQ.
  void check_answers(std::span<const uint8_t> mad) {
    const wire::CmParse cm = wire::parse_cm(mad);
    const bool is_req = cm.ok() && (std::holds_alternative<wire::CmReqView>(cm.message.view) ||
                                    std::holds_alternative<wire::CmSidrReqView>(cm.message.view));
    const bool is_dreq = cm.ok() && std::holds_alternative<wire::CmDreqView>(cm.message.view);
    REQUIRE(daemon::no_listener_reply(mad).has_value() == is_req,
            "no_listener_reply answers exactly REQ and SIDR_REQ");
    REQUIRE(daemon::orphan_drep(mad).has_value() == is_dreq, "orphan_drep answers exactly DREQ");
  }

  void answer_no_listener(std::span<const uint8_t> mad, const net::Endpoint& src,
                          const net::Endpoint& dst) {
    const auto reply = daemon::no_listener_reply(mad);
    REQUIRE(reply.has_value(), "no answer to a REQ / SIDR_REQ nobody listens for");
    const wire::CmParse req = wire::parse_cm(mad);
    const uint64_t tid = req.message.header.transaction_id();
    if (const auto* r = std::get_if<wire::CmReqView>(&req.message.view)) {
      const auto rej = parsed_as<wire::CmRejView>(*reply, tid);
      REQUIRE(rej.local_comm_id() == 0 && rej.remote_comm_id() == r->local_comm_id(),
              "REJ: comm IDs not the REQ's swapped");
      REQUIRE(rej.message_rejected() == static_cast<uint8_t>(wire::CmRejMessage::kReq) &&
                  rej.reason() == static_cast<uint16_t>(wire::CmRejReason::kInvalidServiceId) &&
                  rej.reject_info_length() == 0,
              "REJ: not 'invalid service ID' for the REQ");
    } else {
      const auto& s = std::get<wire::CmSidrReqView>(req.message.view);
      const auto rep = parsed_as<wire::CmSidrRepView>(*reply, tid);
      REQUIRE(rep.request_id() == s.request_id() && rep.service_id() == s.service_id() &&
                  rep.status() == static_cast<uint8_t>(wire::CmSidrStatus::kUnsupported) &&
                  rep.qpn() == 0 && rep.q_key() == 0,
              "SIDR_REP: not 'unsupported' for the request");
    }
    send_gmp(*reply, dst, src);
  }

  void answer_orphan(std::span<const uint8_t> mad, const net::Endpoint& src,
                     const net::Endpoint& dst) {
    const auto reply = daemon::orphan_drep(mad);
    if (!reply) return;
    const wire::CmParse p = wire::parse_cm(mad);
    const auto& dreq = std::get<wire::CmDreqView>(p.message.view);
    const auto drep = parsed_as<wire::CmDrepView>(*reply, p.message.header.transaction_id());
    REQUIRE(drep.local_comm_id() == dreq.remote_comm_id() &&
                drep.remote_comm_id() == dreq.local_comm_id(),
            "DREP: comm IDs not the DREQ's swapped");
    send_gmp(*reply, dst, src);
  }

  // The daemon answers from the address the MAD came to, to the port of the group.
  void send_gmp(const CmMad& mad, const net::Endpoint& from, const net::Endpoint& to) {
    if (gmp_checks_ == 0) return;
    --gmp_checks_;
    std::array<uint8_t, gsi::kGmpBytes> buf{};
    const uint32_t psn = gmp_psn_++;
    const size_t n = gsi::build_gmp(buf, mad, psn, {from.address, kGroupPort}, {to.address, kGroupPort});
    if (from.address.is_v4() != to.address.is_v4()) {
      // A connection the input made between two families (no socket reports one): no GMP.
      REQUIRE(n == 0, "build_gmp sealed a GMP for two families");
      return;
    }
    REQUIRE(n == buf.size(), "build_gmp refused the agent's MAD");
    check_gmp(buf, mad, psn, {from.address, kGroupPort}, {to.address, kGroupPort});
  }

  void remember(const net::Address& requester, uint32_t id, unsigned slot) {
    requesters_.remember(requester, id, slot);
    requester_model_[{requester, id}] = slot;
  }

  void forget(unsigned slot) {
    requesters_.forget_slot(slot);
    std::erase_if(requester_model_, [&](const auto& kv) { return kv.second == slot; });
  }

  void bulk_requesters(Input& in) {
    const unsigned slot = in.u8() % kSlots;
    const net::Address a = address(in);
    const uint32_t base = in.u32();
    const unsigned n = in.u16() % (RequesterTable::kCapacity + 128);
    if (budget_ < n) return;
    budget_ -= n;
    for (unsigned i = 0; i < n; ++i) remember(a, base + i, slot);
  }

  // --- connections and their release --------------------------------------------------------
  static PeerConn conn_from(Input& in) {
    PeerConn c;
    c.local_comm_id = comm_id(in);
    c.remote_comm_id = in.u32();
    c.remote_qpn = in.u32() & wire::kQpnMask;  // as the daemon stores it
    c.local = address(in);
    c.peer = address(in);
    return c;
  }

  void add_conn(unsigned slot, const PeerConn& c) {
    auto& model = conn_model_[slot];
    int want = 0;
    if (daemon::slot_of_comm_id(c.local_comm_id) != slot) {
      want = EINVAL;
    } else if (model.size() >= ConnTable::kMaxConnsPerSlot && !model.contains(c.local_comm_id)) {
      want = ENOSPC;
    }
    REQUIRE(conns_.add(slot, c) == want, "ConnTable::add");
    if (want == 0) model[c.local_comm_id] = c;
  }

  void conn_up(Input& in) {
    const unsigned slot = in.u8() % kSlots;
    add_conn(slot, conn_from(in));
  }

  void conn_down(Input& in) {
    const unsigned slot = in.u8() % kSlots;
    const uint32_t id = comm_id(in);
    auto& model = conn_model_[slot];
    const int want = model.erase(id) ? 0 : ENOENT;
    REQUIRE(conns_.remove(slot, id) == want, "ConnTable::remove");
  }

  void bulk_conns(Input& in) {
    const unsigned slot = in.u8() % kSlots;
    PeerConn c = conn_from(in);
    const unsigned n = in.u16() % (ConnTable::kMaxConnsPerSlot + 128);
    if (budget_ < n) return;
    budget_ -= n;
    for (unsigned i = 0; i < n; ++i) {
      c.local_comm_id = daemon::comm_id_for_slot(slot, c.local_comm_id + 1);
      add_conn(slot, c);
    }
  }

  void reclaim(unsigned slot) {
    std::vector<PeerConn> got = conns_.reclaim(slot);
    auto& model = conn_model_[slot];
    REQUIRE(got.size() == model.size(), "ConnTable::reclaim lost or made up connections");
    for (const PeerConn& c : got) {
      const auto it = model.find(c.local_comm_id);
      REQUIRE(it != model.end() && it->second == c, "ConnTable::reclaim: not what was added");
    }
    model.clear();
    REQUIRE(conns_.established(slot) == 0, "a reclaimed slot keeps connections");
    // urdmad: each a DREQ, queued for the pace.
    for (const PeerConn& c : got) {
      const bool is_new = !releases_model_.contains(c.local_comm_id);
      const size_t before = releases_.size();
      const Releases::Dreq d{.conn = c, .transaction_id = next_tid_++};
      const bool added = releases_.add(d, now_ms_);
      if (!added) {
        REQUIRE(before >= Releases::kMax && is_new, "Releases::add refused below kMax");
        continue;
      }
      releases_model_[c.local_comm_id] = ReleaseModel{c, d.transaction_id, 0};
    }
    run_due();
  }

  void advance(Input& in) {
    const uint8_t scale = in.u8();
    const int64_t ms = scale < 128   ? in.u8()
                       : scale < 224 ? in.u16()
                                     : int64_t{in.u32() & 0xFFFFFF};
    now_ms_ += ms;
    run_due();
  }

  void run_due() {
    // The pace, as a bucket of kBurst tokens refilled at kPerSecond.
    tokens_ = std::min(Releases::kBurst,
                       tokens_ + (now_ms_ - refilled_ms_) * Releases::kPerSecond / 1000);
    refilled_ms_ = now_ms_;
    const std::vector<Releases::Dreq> due = releases_.due(now_ms_);
    REQUIRE(static_cast<int64_t>(due.size()) <= Releases::kBurst, "due(): more than kBurst");
    REQUIRE(static_cast<int64_t>(due.size()) <= std::max<int64_t>(tokens_, 0),
            "due(): more than the pace allows");
    tokens_ -= static_cast<int64_t>(due.size());
    std::set<uint32_t> seen;
    for (const Releases::Dreq& d : due) {
      REQUIRE(seen.insert(d.conn.local_comm_id).second, "due(): one DREQ twice at once");
      const auto it = releases_model_.find(d.conn.local_comm_id);
      REQUIRE(it != releases_model_.end(), "due(): a DREQ never added (or already answered)");
      REQUIRE(it->second.conn == d.conn && it->second.tid == d.transaction_id,
              "due(): not the DREQ that was added");
      REQUIRE(d.sends == it->second.sends + 1 && d.sends >= 1 && d.sends <= 1 + Releases::kRetries,
              "due(): sends not counted one by one, or beyond the retries");
      it->second.sends = d.sends;
      // urdmad sends it: a DREQ naming the connection as the peer knows it.
      const CmMad mad = daemon::build_dreq(d.conn, d.transaction_id);
      const auto dreq = parsed_as<wire::CmDreqView>(mad, d.transaction_id);
      REQUIRE(dreq.local_comm_id() == d.conn.local_comm_id &&
                  dreq.remote_comm_id() == d.conn.remote_comm_id &&
                  dreq.remote_qpn_eecn() == d.conn.remote_qpn,
              "build_dreq: not the connection's IDs and QPN");
      send_gmp(mad, {d.conn.local, kGroupPort}, {d.conn.peer, kGroupPort});
    }
    // Entries out of retries may be gone (forgotten by due()); others are all there.
    size_t maybe_gone = 0;
    for (const auto& [id, m] : releases_model_) maybe_gone += m.sends == 1 + Releases::kRetries;
    REQUIRE(releases_.size() <= releases_model_.size() &&
                releases_.size() + maybe_gone >= releases_model_.size(),
            "Releases lost or made up entries");
    REQUIRE(releases_.next_deadline_ms().has_value() == (releases_.size() > 0),
            "next_deadline_ms() disagrees with size()");
  }

  bool take_drep(const net::Address& peer, std::span<const uint8_t> mad) {
    const size_t before = releases_.size();
    const bool took = releases_.take_drep(peer, mad);
    // Which model entry it answers, if any.
    const wire::CmParse p = wire::parse_cm(mad);
    const auto* drep = p.ok() ? std::get_if<wire::CmDrepView>(&p.message.view) : nullptr;
    auto it = drep ? releases_model_.find(drep->remote_comm_id()) : releases_model_.end();
    const bool matches = it != releases_model_.end() &&
                         it->second.conn.remote_comm_id == drep->local_comm_id() &&
                         it->second.conn.peer == peer;
    if (took) {
      REQUIRE(matches, "take_drep took a DREP that answers no DREQ of ours");
      REQUIRE(releases_.size() + 1 == before, "take_drep did not forget the DREQ");
    } else if (matches) {
      REQUIRE(it->second.sends == 1 + Releases::kRetries,
              "take_drep refused the DREP of a tracked DREQ");
    }
    if (matches) releases_model_.erase(it);
    return took;
  }

  void drep(Input& in) {
    // A DREP from the peer of a DREQ we track (or one field off).
    if (releases_model_.empty()) return;
    auto it = releases_model_.begin();
    std::advance(it, in.u8() % releases_model_.size());
    const ReleaseModel m = it->second;
    CmMad mad{};
    auto d = start<wire::CmDrep>(mad, in.u64());
    d.set_local_comm_id(m.conn.remote_comm_id);
    d.set_remote_comm_id(m.conn.local_comm_id);
    net::Address from = m.conn.peer;
    switch (in.u8() % 6) {
      case 0:
        d.set_local_comm_id(in.u32());
        break;
      case 1:
        d.set_remote_comm_id(comm_id(in));
        break;
      case 2:
        from = address(in);
        break;
      default:
        break;
    }
    take_drep(from, mad);
  }

  void check_bounds() {
    REQUIRE(requesters_.size() <= RequesterTable::kCapacity, "RequesterTable beyond kCapacity");
    REQUIRE(releases_.size() <= Releases::kMax, "Releases beyond kMax");
    for (unsigned s = 0; s < kSlots; ++s) {
      REQUIRE(conns_.established(s) <= ConnTable::kMaxConnsPerSlot,
              "ConnTable beyond kMaxConnsPerSlot");
      REQUIRE(conns_.established(s) == conn_model_[s].size(), "ConnTable disagrees with its model");
    }
  }

  static constexpr uint16_t kGroupPort = wire::kRoceV2UdpPort;

  RequesterTable requesters_;
  ConnTable conns_;
  Releases releases_;
  std::map<std::pair<net::Address, uint32_t>, unsigned> requester_model_;
  std::map<unsigned, std::map<uint32_t, PeerConn>> conn_model_;
  std::map<uint32_t, ReleaseModel> releases_model_;
  int64_t now_ms_ = 1'000'000;  // the daemon's clock is CLOCK_MONOTONIC in ms
  int64_t tokens_ = Releases::kBurst;
  int64_t refilled_ms_ = 0;
  uint64_t next_tid_ = 1;
  uint32_t gmp_psn_ = 0;
  // Bulk additions per input: enough to fill a slot's ConnTable and the RequesterTable (and
  // keep an input fast; Releases::kMax is left to tests/unit/daemon/cm_agent_test.cc).
  size_t budget_ = 12'000;
  // GMPs checked whole (ICRC, route) per input; beyond, the MAD alone (a reclaimed full slot
  // sends kBurst DREQs at once).
  size_t gmp_checks_ = 64;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  World world;
  world.run(in);
  return 0;
}
