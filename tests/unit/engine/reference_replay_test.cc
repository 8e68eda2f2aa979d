// The reference captures (tests/data: Linux rxe on both ends, see its README.md) replayed into
// an Engine playing the responder: every request of every RC and UD conversation in a capture
// goes into an engine set up as the capture's responder was, and each response we send is
// compared, field by field, with the response rxe sent for the same request.
//
// HOW THE RESPONDER MIRRORS RXE'S
//  * Conversations are found in the capture: the requests from one address to one QPN (RC or UD;
//    MADs to QP1 belong to the CM, not to the engine), and, for RC, the responses that answer
//    them (same addresses reversed, PSN inside a request's PSN range, later in the file). The
//    requester's QPN is read off those responses (an RC request does not carry it).
//  * Our QP gets the responder's QPN (DeviceConfig::qpn_base: the first QP of a device is
//    qpn_base), the address of the responder, the first request's PSN as its expected PSN, the
//    captures' path MTU (1024) and, for UD, the Q_Key the requests carry.
//  * Memory: one MR per R_Key the requests use, spanning every VA they name. The MR table
//    chooses its keys (randomly), so each request's RETH / AtomicETH R_Key is TRANSLATED to the
//    key of our MR and the ICRC resealed (as urdma would seal it: IPv4 ID 0, DF). Requests
//    without a key (SENDs, UD) go in exactly as captured, ICRC and all: the engine must accept
//    rxe's non-zero IPv4 IDs (docs/ARCHITECTURE.md, "The ICRC and the IPv4 identification").
//  * Before a READ, the bytes rxe returned are stored at the VA it read; before an atomic, the
//    original value rxe returned (in host order, as the CPU held it). What we send must then be
//    the same bytes, from the right place, in the right packets.
//  * Receive WQEs (16 KiB each) for every SEND, so no request meets RNR.
//
// WHAT IS COMPARED, per response (ours against rxe's, in order): opcode; BTH DestQP, PSN,
// AckReq, SE, MigReq, PadCnt, TVer, P_Key, FECN/BECN; AETH syndrome and MSN; AtomicAckETH
// original data; the payload of READ responses; then all header bytes at once (anything not
// named above); the datagram's destination. Not compared: the ICRC (it covers the IPv4 ID,
// which differs), and the UDP source port (rxe hashes the QPN, we use 0xC000 | QPN; both are
// flow entropy, IBA annex A17.4.1). Also checked: our ICRC is right for our flow, WRITEs and
// atomics left the memory as the request says, SENDs and UD SENDs completed with the captured
// bytes, a UD receive's GRH area holds the IPv4 header rxe's receiver would have put there (but
// for the IPv4 ID and checksum, which a UDP socket never sees), and nothing was dropped.
//
// rxe-guest-to-host.pcap has requests but no responses (its peer never answered): there the
// responses are checked against IBA instead (a retransmitted SEND is acknowledged again).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "capture/capture.h"
#include "engine/engine.h"
#include "net/clock.h"
#include "provider/device.h"
#include "support/datagram.h"
#include "support/memory_host.h"
#include "support/memory_io.h"
#include "support/qp_setup.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/psn.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;

// The captures' link (tests/data/README.md): 1500-byte Ethernet MTU, active path MTU 1024.
constexpr ibv_mtu kCapturePathMtu = IBV_MTU_1024;
// QP1 is the CM's (urdmad's), not the engine's: MADs are not replayed.
constexpr uint32_t kCmQpn = 1;
// A UD receive buffer starts with the 40-byte GRH area (ibv_post_recv(3)).
constexpr size_t kGrhBytes = 40;
constexpr size_t kRecvBufferBytes = 16 * 1024;
constexpr uint8_t kMaxDestRdAtomic = 16;
constexpr int kRemoteAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// One RoCEv2 datagram of a capture.
struct Datagram {
  uint64_t frame = 0;  // 1-based, as tshark and `urdma decode` number frames
  net::Endpoint src;
  net::Endpoint dst;
  std::vector<uint8_t> bytes;      // the UDP payload: BTH .. ICRC
  std::vector<uint8_t> ip_header;  // as captured
  wire::PacketView view() const { return *wire::parse_packet(bytes); }
};

net::Address ip_address(const capture::UdpDatagram& u, bool source) {
  if (u.ip_version == 4)
    return net::Address::from_v4(
        std::span<const uint8_t, 4>(u.ip_header.data() + (source ? 12 : 16), 4));
  return net::Address::from_v6(
      std::span<const uint8_t, 16>(u.ip_header.data() + (source ? 8 : 24), 16));
}

std::vector<Datagram> load(const std::string& file) {
  std::vector<Datagram> out;
  const std::string error = capture::for_each_udp(
      std::string(URDMA_REFERENCE_DIR) + "/" + file, [&](const capture::UdpDatagram& u) {
        if (u.dst_port != net::kRoceV2UdpPort || u.truncated) return;
        Datagram d;
        d.frame = u.index;
        d.src = {ip_address(u, true), u.src_port};
        d.dst = {ip_address(u, false), u.dst_port};
        d.bytes.assign(u.payload.begin(), u.payload.end());
        d.ip_header.assign(u.ip_header.begin(), u.ip_header.end());
        EXPECT_TRUE(wire::parse_packet(d.bytes).ok()) << file << " frame " << u.index;
        out.push_back(std::move(d));
      });
  EXPECT_EQ(error, "") << file;
  return out;
}

// PSNs a request occupies: one per response packet for a READ (IBA 9.7.4.1.4), else one.
uint32_t psn_span(const wire::PacketView& p) {
  if (!p.info().is(wire::kReadRequest)) return 1;
  const uint32_t mtu = mtu_bytes(kCapturePathMtu);
  return std::max<uint32_t>(1, (p.reth()->dma_length() + mtu - 1) / mtu);
}

bool psn_in(uint32_t psn, uint32_t first, uint32_t count) {
  const int32_t d = wire::psn_diff(psn, first);
  return d >= 0 && static_cast<uint32_t>(d) < count;
}

// The requests to one QP, and rxe's responses to them.
struct Conversation {
  wire::Transport transport = wire::Transport::kNone;
  net::Address requester;
  net::Address responder;
  uint32_t responder_qpn = 0;
  std::optional<uint32_t> requester_qpn;  // from rxe's responses
  std::vector<const Datagram*> requests;  // capture order
  std::vector<const Datagram*> responses;

  std::string name() const {
    std::ostringstream os;
    os << (transport == wire::Transport::kRc ? "RC " : "UD ") << requester << " -> " << responder
       << " QP 0x" << std::hex << responder_qpn << std::dec << " (frames "
       << requests.front()->frame << "-"
       << std::max(requests.back()->frame, responses.empty() ? 0 : responses.back()->frame) << ")";
    return os.str();
  }
};

std::vector<Conversation> conversations(const std::vector<Datagram>& all) {
  std::vector<Conversation> out;
  for (const Datagram& d : all) {
    const wire::PacketView p = d.view();
    const wire::Transport t = p.info().transport;
    if (!p.info().is(wire::kRequest) || p.bth().dest_qp() == kCmQpn) continue;
    if (t != wire::Transport::kRc && t != wire::Transport::kUd) continue;  // none of UC in them
    auto it = std::find_if(out.begin(), out.end(), [&](const Conversation& c) {
      return c.transport == t && c.requester == d.src.address && c.responder == d.dst.address &&
             c.responder_qpn == p.bth().dest_qp();
    });
    if (it == out.end()) {
      Conversation c;
      c.transport = t;
      c.requester = d.src.address;
      c.responder = d.dst.address;
      c.responder_qpn = p.bth().dest_qp();
      it = out.insert(out.end(), c);
    }
    it->requests.push_back(&d);
  }
  for (const Datagram& d : all) {
    const wire::PacketView p = d.view();
    if (!p.info().is(wire::kResponse)) continue;
    bool matched = false;
    for (Conversation& c : out) {
      if (c.transport != wire::Transport::kRc || c.responder != d.src.address ||
          c.requester != d.dst.address)
        continue;
      const bool answers = std::any_of(c.requests.begin(), c.requests.end(), [&](const auto* r) {
        const wire::PacketView q = r->view();
        return r->frame < d.frame && psn_in(p.bth().psn(), q.bth().psn(), psn_span(q));
      });
      if (!answers) continue;
      if (c.requester_qpn) {
        EXPECT_EQ(*c.requester_qpn, p.bth().dest_qp()) << "frame " << d.frame;
      }
      c.requester_qpn = p.bth().dest_qp();
      c.responses.push_back(&d);
      matched = true;
      break;
    }
    EXPECT_TRUE(matched) << "response in frame " << d.frame << " answers no request";
  }
  return out;
}

// rxe's READ response payloads for a request at `psn` spanning `span` PSNs, concatenated.
std::vector<uint8_t> read_data(const Conversation& c, uint32_t psn, uint32_t span) {
  std::vector<uint8_t> out;
  for (const Datagram* r : c.responses) {
    const wire::PacketView p = r->view();
    if (p.info().is(wire::kReadResponse) && psn_in(p.bth().psn(), psn, span))
      out.insert(out.end(), p.payload().begin(), p.payload().end());
  }
  return out;
}

std::optional<uint64_t> atomic_orig(const Conversation& c, uint32_t psn) {
  for (const Datagram* r : c.responses) {
    const wire::PacketView p = r->view();
    if (p.info().is(wire::kAtomicAck) && p.bth().psn() == psn)
      return p.atomic_ack_eth()->orig_data();
  }
  return std::nullopt;
}

// One conversation's responder: a device and engine set up as the capture's responder was.
class Responder {
 public:
  explicit Responder(const Conversation& c) : c_(c), h_(config(c), {}, 1024) {
    const wire::PacketView first = c.requests.front()->view();
    provider::QpInitAttr init;
    init.qp_type = c.transport == wire::Transport::kUd ? IBV_QPT_UD : IBV_QPT_RC;
    init.pd = h_.pd;
    init.send_cq = h_.cq;
    init.recv_cq = h_.cq;
    init.cap = {16, static_cast<uint32_t>(c.requests.size() + 1), 1, 1, 0};
    qp_ = h_.dev.create_qp(init).value();
    EXPECT_EQ(qp_->qp_num(), c.responder_qpn) << "the first QP of a device is qpn_base";
    test::QpParams p;
    p.type = init.qp_type;
    p.mtu = kCapturePathMtu;
    p.rq_psn = first.bth().psn();
    p.sq_psn = 0;  // we send no requests
    p.max_dest_rd_atomic = kMaxDestRdAtomic;
    p.access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (auto deth = first.deth()) p.qkey = deth->qkey();
    // Without rxe's responses the requester's QPN is unknown (and unused but as DestQP).
    const test::BringUp up = test::bring_up(*qp_, p, c.requester, c.requester_qpn.value_or(0x11));
    EXPECT_TRUE(up.ok()) << "to state " << up.failed_to << ": errno " << up.status.error();
    register_memory();
    post_receives();
  }

  // Every request, in capture order; checks what each one did to memory.
  void replay() {
    std::optional<uint32_t> epsn;  // our own account of the responder's expected PSN
    uint64_t write_va = 0;         // where the next WRITE payload goes
    std::vector<uint8_t> message;  // SEND payload so far
    for (const Datagram* d : c_.requests) {
      SCOPED_TRACE("request in frame " + std::to_string(d->frame));
      const wire::PacketView p = d->view();
      const uint32_t psn = p.bth().psn();
      bool fresh = true;  // not a retransmission of a request already executed
      if (c_.transport == wire::Transport::kRc) {
        if (!epsn) epsn = psn;
        fresh = psn == *epsn;
        if (fresh)
          epsn = wire::psn_add(*epsn, psn_span(p));
        else
          EXPECT_TRUE(wire::psn_lt(psn, *epsn)) << "the captures hold no out-of-order request";
      }
      if (fresh) prepare(p);
      inject(*d);
      if (!fresh) continue;
      if (p.info().is(wire::kWrite)) {
        if (p.info().is(wire::kFirst)) write_va = p.reth()->va();
        EXPECT_EQ(bytes_at(write_va, p.payload().size()),
                  std::vector<uint8_t>(p.payload().begin(), p.payload().end()))
            << "WRITE payload not placed at 0x" << std::hex << write_va;
        write_va += p.payload().size();
      }
      if (p.info().is(wire::kAtomic)) check_atomic(p);
      if (p.info().is(wire::kSend)) {
        message.insert(message.end(), p.payload().begin(), p.payload().end());
        if (p.info().is(wire::kLast)) {
          expected_recv_.push_back(
              {std::move(message), p.deth() ? p.deth()->src_qp() : 0, d->ip_header});
          message.clear();
        }
      }
    }
  }

  // Receive completions, as the SENDs above say they must be.
  void check_receives() {
    std::vector<ibv_wc> wc(1024);
    wc.resize(
        static_cast<size_t>(std::max(h_.cq->poll(static_cast<int>(wc.size()), wc.data()), 0)));
    ASSERT_EQ(wc.size(), expected_recv_.size());
    const bool ud = c_.transport == wire::Transport::kUd;
    for (size_t i = 0; i < wc.size(); ++i) {
      SCOPED_TRACE("receive completion " + std::to_string(i));
      const std::vector<uint8_t>& data = expected_recv_[i].data;
      EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc[i].status);
      EXPECT_EQ(wc[i].opcode, IBV_WC_RECV);
      EXPECT_EQ(wc[i].wr_id, i);
      EXPECT_EQ(wc[i].qp_num, c_.responder_qpn);
      const size_t offset = ud ? kGrhBytes : 0;
      EXPECT_EQ(wc[i].byte_len, offset + data.size());
      if (ud) {
        EXPECT_EQ(wc[i].src_qp, expected_recv_[i].src_qp);
        EXPECT_TRUE(wc[i].wc_flags & IBV_WC_GRH);
        expect_grh(recv_bufs_.at(wc[i].wr_id).get(), expected_recv_[i].ip_header);
      }
      const uint8_t* buf = recv_bufs_.at(wc[i].wr_id).get() + offset;
      EXPECT_EQ(std::vector<uint8_t>(buf, buf + data.size()), data);
    }
  }

  // The GRH area of a UD receive: for IPv4, 20 zero bytes and the IPv4 header the datagram came
  // under (rdma-core's convention; rxe copies the skb's header). A UDP socket does not see the
  // IPv4 ID, so the ID and, with it, the header checksum are not compared; every other byte is.
  static void expect_grh(const uint8_t* area, const std::vector<uint8_t>& ip_header) {
    if (ip_header.size() != 20) return;  // IPv6, or IPv4 with options: none in the captures
    std::vector<uint8_t> want(kGrhBytes - ip_header.size(), 0);
    want.insert(want.end(), ip_header.begin(), ip_header.end());
    std::vector<uint8_t> got(area, area + kGrhBytes);
    for (const size_t unseen : {4, 5, 10, 11}) {  // IPv4 identification, header checksum
      want[kGrhBytes - 20 + unseen] = 0;
      got[kGrhBytes - 20 + unseen] = 0;
    }
    EXPECT_EQ(got, want) << "GRH area (IPv4 ID and checksum masked)";
  }

  // What we sent, each checked for a correct ICRC on our flow.
  std::vector<wire::PacketView> responses() const {
    std::vector<wire::PacketView> out;
    for (const test::MemoryIo::Sent& s : h_.io.sent) {
      EXPECT_TRUE(net::icrc_exact(s.bytes, {s.src, s.src_port}, s.dst));
      EXPECT_EQ(s.src, c_.responder);
      EXPECT_EQ(s.dst, (net::Endpoint{c_.requester, net::kRoceV2UdpPort}));
      auto r = wire::parse_packet(s.bytes);
      EXPECT_TRUE(r.ok()) << wire::parse_error_name(r.error());
      if (r.ok()) out.push_back(*r);
    }
    return out;
  }

  const EngineCounters& counters() const { return h_.engine.counters(); }

 private:
  struct Region {
    uint32_t capture_rkey = 0;
    uint64_t iova = 0;
    std::vector<uint64_t> storage;  // 8-byte aligned, and iova is too: atomics line up
    provider::Mr* mr = nullptr;
    uint8_t* host(uint64_t va) { return reinterpret_cast<uint8_t*>(storage.data()) + (va - iova); }
  };
  struct ExpectedRecv {
    std::vector<uint8_t> data;
    uint32_t src_qp = 0;             // UD
    std::vector<uint8_t> ip_header;  // UD: what rxe's receiver puts in the GRH area
  };

  static provider::DeviceConfig config(const Conversation& c) {
    provider::DeviceConfig cfg = test::device_config(nullptr, c.responder, kCapturePathMtu);
    cfg.qpn_base = c.responder_qpn;
    return cfg;
  }

  // One MR per captured R_Key, from the lowest VA its requests name to the highest end.
  void register_memory() {
    struct Span {
      uint32_t rkey;
      uint64_t lo;
      uint64_t hi;
    };
    std::vector<Span> spans;
    for (const Datagram* d : c_.requests) {
      const wire::PacketView p = d->view();
      std::optional<Span> s;
      if (auto reth = p.reth()) s = Span{reth->rkey(), reth->va(), reth->va() + reth->dma_length()};
      if (auto a = p.atomic_eth()) s = Span{a->rkey(), a->va(), a->va() + sizeof(uint64_t)};
      if (!s) continue;
      auto it = std::find_if(spans.begin(), spans.end(),
                             [&](const Span& x) { return x.rkey == s->rkey; });
      if (it == spans.end()) {
        spans.push_back(*s);
      } else {
        it->lo = std::min(it->lo, s->lo);
        it->hi = std::max(it->hi, s->hi);
      }
    }
    for (const Span& s : spans) {
      auto r = std::make_unique<Region>();
      r->capture_rkey = s.rkey;
      r->iova = s.lo & ~uint64_t{7};
      r->storage.assign((s.hi - r->iova + 7) / 8 + 1, 0);
      auto mr = h_.dev.reg_mr(h_.pd, r->storage.data(), r->storage.size() * sizeof(uint64_t),
                              r->iova, kRemoteAccess);
      ASSERT_TRUE(mr.ok()) << mr.error();
      r->mr = mr.value();
      regions_.push_back(std::move(r));
    }
  }

  void post_receives() {
    const size_t n = c_.transport == wire::Transport::kUd
                         ? c_.requests.size()
                         : static_cast<size_t>(std::count_if(
                               c_.requests.begin(), c_.requests.end(), [](const Datagram* d) {
                                 return d->view().info().is(wire::kConsumesRecv);
                               }));
    for (size_t i = 0; i < n; ++i) {
      recv_bufs_.push_back(std::make_unique<uint8_t[]>(kRecvBufferBytes));
      auto mr = h_.dev.reg_mr(h_.pd, recv_bufs_.back().get(), kRecvBufferBytes,
                              reinterpret_cast<uint64_t>(recv_bufs_.back().get()),
                              IBV_ACCESS_LOCAL_WRITE);
      ASSERT_TRUE(mr.ok()) << mr.error();
      ibv_sge sge = {reinterpret_cast<uint64_t>(recv_bufs_.back().get()),
                     static_cast<uint32_t>(kRecvBufferBytes), mr.value()->lkey()};
      ibv_recv_wr wr = {};
      wr.wr_id = i;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      ASSERT_TRUE(qp_->post_recv(&wr, &bad).ok());
    }
  }

  Region* region(uint32_t capture_rkey) {
    for (auto& r : regions_)
      if (r->capture_rkey == capture_rkey) return r.get();
    return nullptr;
  }
  Region* region_at(uint64_t va) {
    for (auto& r : regions_)
      if (va >= r->iova && va - r->iova < r->storage.size() * sizeof(uint64_t)) return r.get();
    return nullptr;
  }
  std::vector<uint8_t> bytes_at(uint64_t va, size_t n) {
    Region* r = region_at(va);
    if (r == nullptr) return {};
    return std::vector<uint8_t>(r->host(va), r->host(va) + n);
  }

  // Memory as rxe's responder held it when the request arrived.
  void prepare(const wire::PacketView& p) {
    if (p.info().is(wire::kReadRequest)) {
      const std::vector<uint8_t> data = read_data(c_, p.bth().psn(), psn_span(p));
      Region* r = region(p.reth()->rkey());
      if (r != nullptr && data.size() == p.reth()->dma_length() && !data.empty())
        std::memcpy(r->host(p.reth()->va()), data.data(), data.size());
    }
    if (p.info().is(wire::kAtomic)) {
      Region* r = region(p.atomic_eth()->rkey());
      if (r == nullptr) return;
      const uint64_t orig = atomic_orig(c_, p.bth().psn()).value_or(0x0123456789abcdef);
      std::memcpy(r->host(p.atomic_eth()->va()), &orig, sizeof orig);
      atomic_before_ = orig;
    }
  }

  // IBA 9.4.5: FetchAdd adds, CmpSwap swaps when equal; the 64-bit value in host order.
  void check_atomic(const wire::PacketView& p) {
    const wire::AtomicEthView a = *p.atomic_eth();
    const std::vector<uint8_t> now = bytes_at(a.va(), sizeof(uint64_t));
    ASSERT_EQ(now.size(), sizeof(uint64_t));
    uint64_t value;
    std::memcpy(&value, now.data(), sizeof value);
    const uint64_t expect = p.opcode() == op::kRcFetchAdd
                                ? atomic_before_ + a.swap_add()
                                : (atomic_before_ == a.compare() ? a.swap_add() : atomic_before_);
    EXPECT_EQ(value, expect) << "memory after the atomic";
  }

  // Delivers the captured request; a key is translated to our MR's and the ICRC resealed.
  void inject(const Datagram& d) {
    std::vector<uint8_t> bytes = d.bytes;
    const wire::ParseResult parsed = wire::parse_packet(bytes);
    ASSERT_TRUE(parsed.ok());
    const wire::PacketHeaders h(&parsed->info(), bytes.data());
    bool rewritten = false;
    if (auto reth = h.reth()) {
      if (Region* r = region(reth->rkey())) reth->set_rkey(r->mr->rkey());
      rewritten = true;
    }
    if (auto a = h.atomic_eth()) {
      if (Region* r = region(a->rkey())) a->set_rkey(r->mr->rkey());
      rewritten = true;
    }
    if (rewritten) net::seal_icrc(bytes, d.src, d.dst);
    h_.io.deliver(bytes, d.src, d.dst);
    h_.engine.poll();
  }

  const Conversation& c_;
  test::MemoryHost h_;
  provider::Qp* qp_ = nullptr;
  std::vector<std::unique_ptr<Region>> regions_;
  std::vector<std::unique_ptr<uint8_t[]>> recv_bufs_;
  std::vector<ExpectedRecv> expected_recv_;
  uint64_t atomic_before_ = 0;
};

std::string opcode_name(uint8_t opcode) {
  const char* n = wire::kOpcodeTable[opcode].name;
  return n != nullptr ? n : "opcode " + std::to_string(opcode);
}

// Ours against rxe's, field by field.
void expect_same_response(const wire::PacketView& ours, const Datagram& rxe_datagram) {
  SCOPED_TRACE("rxe's response in frame " + std::to_string(rxe_datagram.frame));
  const wire::PacketView rxe = rxe_datagram.view();
  ASSERT_EQ(opcode_name(ours.opcode()), opcode_name(rxe.opcode()));
  const wire::BthView a = ours.bth();
  const wire::BthView b = rxe.bth();
  EXPECT_EQ(a.dest_qp(), b.dest_qp()) << "BTH DestQP";
  EXPECT_EQ(a.psn(), b.psn()) << "BTH PSN";
  EXPECT_EQ(a.ack_req(), b.ack_req()) << "BTH AckReq";
  EXPECT_EQ(a.se(), b.se()) << "BTH SE";
  EXPECT_EQ(a.m(), b.m()) << "BTH MigReq";
  EXPECT_EQ(a.pad_count(), b.pad_count()) << "BTH PadCnt";
  EXPECT_EQ(a.tver(), b.tver()) << "BTH TVer";
  EXPECT_EQ(a.pkey(), b.pkey()) << "BTH P_Key";
  EXPECT_EQ(a.fecn(), b.fecn()) << "BTH FECN";
  EXPECT_EQ(a.becn(), b.becn()) << "BTH BECN";
  ASSERT_EQ(ours.aeth().has_value(), rxe.aeth().has_value());
  if (rxe.aeth()) {
    EXPECT_EQ(ours.aeth()->syndrome(), rxe.aeth()->syndrome()) << "AETH syndrome";
    EXPECT_EQ(ours.aeth()->msn(), rxe.aeth()->msn()) << "AETH MSN";
  }
  ASSERT_EQ(ours.atomic_ack_eth().has_value(), rxe.atomic_ack_eth().has_value());
  if (rxe.atomic_ack_eth()) {
    EXPECT_EQ(ours.atomic_ack_eth()->orig_data(), rxe.atomic_ack_eth()->orig_data())
        << "AtomicAckETH original data";
  }
  EXPECT_EQ(std::vector<uint8_t>(ours.payload().begin(), ours.payload().end()),
            std::vector<uint8_t>(rxe.payload().begin(), rxe.payload().end()))
      << "payload";
  // Everything else the headers hold (reserved bits included), all at once.
  const auto head = [](const wire::PacketView& p) {
    return std::vector<uint8_t>(p.datagram().begin(), p.datagram().begin() + p.header_length());
  };
  EXPECT_EQ(head(ours), head(rxe)) << "header bytes";
  EXPECT_EQ(ours.datagram().size(), rxe.datagram().size()) << "datagram length";
}

size_t count(const std::vector<Conversation>& cs, wire::Transport t) {
  return static_cast<size_t>(
      std::count_if(cs.begin(), cs.end(), [&](const Conversation& c) { return c.transport == t; }));
}

// rxe-to-rxe.pcap: rping (SEND, READ, WRITE both ways on one RC QP pair), ibv_rc_pingpong,
// ibv_ud_pingpong, then WRITE, READ and FETCH_ADD streams. Every response rxe sent is one we
// must send too, byte for byte up to the ICRC.
TEST(ReferenceReplay, RxeToRxeResponsesMatchRxe) {
  const std::vector<Datagram> all = load("rxe-to-rxe.pcap");
  ASSERT_EQ(all.size(), 71u);
  const std::vector<Conversation> cs = conversations(all);
  // rping's QP pair answers both ways (2), rc_pingpong both ways (2), WRITE, READ, FETCH_ADD;
  // ud_pingpong both ways.
  EXPECT_EQ(count(cs, wire::Transport::kRc), 7u);
  EXPECT_EQ(count(cs, wire::Transport::kUd), 2u);
  size_t compared = 0;
  for (const Conversation& c : cs) {
    SCOPED_TRACE(c.name());
    Responder r(c);
    r.replay();
    r.check_receives();
    const std::vector<wire::PacketView> ours = r.responses();
    if (c.transport == wire::Transport::kUd) {
      EXPECT_TRUE(ours.empty()) << "UD is not answered";
    } else {
      ASSERT_TRUE(c.requester_qpn.has_value()) << "rxe answered every RC conversation";
      ASSERT_EQ(ours.size(), c.responses.size());
      for (size_t i = 0; i < ours.size(); ++i) expect_same_response(ours[i], *c.responses[i]);
      compared += ours.size();
    }
    EXPECT_EQ(r.counters().drops(), 0u);
    EXPECT_EQ(r.counters().duplicate_request, 0u);
  }
  // 8 + 4 (rping), 2 + 2 (rc_pingpong), 5 ACKs, 5 READ responses, 5 ATOMIC ACKs.
  EXPECT_EQ(compared, 31u);
}

// rxe-guest-to-host.pcap: an RC SEND retransmitted 24 times (the peer never answered) and a UD
// SEND. No rxe response to compare with, so IBA is the reference: the first SEND is executed
// and acknowledged; each retransmission is a duplicate, acknowledged again with the same PSN
// and MSN and not executed again (IBA 9.7.5.1.1, C9-105).
TEST(ReferenceReplay, RxeGuestToHostRetransmittedSendIsAckedEveryTime) {
  const std::vector<Datagram> all = load("rxe-guest-to-host.pcap");
  ASSERT_EQ(all.size(), 29u);
  const std::vector<Conversation> cs = conversations(all);
  ASSERT_EQ(cs.size(), 2u);
  for (const Conversation& c : cs) {
    SCOPED_TRACE(c.name());
    EXPECT_TRUE(c.responses.empty());
    Responder r(c);
    r.replay();
    r.check_receives();  // one completion for the RC SEND (not 25), one for the UD SEND
    const std::vector<wire::PacketView> ours = r.responses();
    EXPECT_EQ(r.counters().drops(), 0u);
    if (c.transport == wire::Transport::kUd) {
      EXPECT_TRUE(ours.empty());
      continue;
    }
    ASSERT_EQ(c.requests.size(), 25u);
    EXPECT_EQ(r.counters().duplicate_request, 24u);
    ASSERT_EQ(ours.size(), 25u);
    const uint32_t psn = c.requests.front()->view().bth().psn();
    for (size_t i = 0; i < ours.size(); ++i) {
      SCOPED_TRACE("our response " + std::to_string(i));
      EXPECT_EQ(ours[i].opcode(), op::kRcAck);
      EXPECT_EQ(ours[i].bth().psn(), psn);
      EXPECT_EQ(ours[i].aeth()->syndrome(), wire::make_ack(wire::kAethCreditsInvalid));
      EXPECT_EQ(ours[i].aeth()->msn(), 1u);
    }
  }
}

}  // namespace
}  // namespace urdma::engine::testing
