// The eRPC protocol-test harness for the engine: one Engine on an in-memory PacketIo. Tests
// hand-build packets (with a correct ICRC, from a fictitious peer), feed them in, poll, and
// assert on the packets and completions that come out.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "net/clock.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace urdma::engine::testing {

// Records what the engine sends; delivers what the test queues.
class FakeIo final : public net::PacketIo {
 public:
  struct Sent {
    std::vector<uint8_t> bytes;
    net::Endpoint dst;
    net::Address src;
    uint16_t src_port;
    // The gather list as handed over (pointers only valid during send(); kept to compare).
    std::vector<iovec> iov;
  };

  net::TxStatus send(const net::TxDatagram& d) override {
    Sent s;
    s.iov.assign(d.iov.begin(), d.iov.end());
    for (const iovec& v : d.iov) {
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      s.bytes.insert(s.bytes.end(), p, p + v.iov_len);
    }
    s.dst = d.dst;
    s.src = d.src;
    s.src_port = d.src_port;
    sent.push_back(std::move(s));
    return net::TxStatus::kSent;
  }
  size_t send_batch(std::span<const net::TxDatagram> batch) override {
    for (const auto& d : batch) send(d);
    return batch.size();
  }
  size_t recv_batch(std::span<net::RxDatagram> batch) override {
    size_t n = 0;
    for (; n < batch.size() && !inbox.empty(); ++n) {
      const auto& in = inbox.front();
      const size_t len = std::min(in.bytes.size(), batch[n].buffer.size());
      std::copy_n(in.bytes.begin(), len, batch[n].buffer.begin());
      batch[n].length = len;
      batch[n].truncated = len < in.bytes.size();
      batch[n].src = net::Endpoint{in.src, in.src_port};
      batch[n].dst = net::Endpoint{in.dst, net::kRoceV2UdpPort};
      inbox.pop_front();
    }
    return n;
  }
  int readable_fd() const override { return -1; }
  net::IoCounters counters() const override { return {}; }

  struct Incoming {
    std::vector<uint8_t> bytes;
    net::Address src;
    net::Address dst;
    uint16_t src_port;
  };
  std::vector<Sent> sent;
  std::deque<Incoming> inbox;
};

using HeaderFill = std::function<void(const wire::PacketHeaders&)>;

class ProtocolTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kPeerQpn = 0x99;
  static constexpr uint16_t kPeerPort = 0xC123;

  ProtocolTest()
      : dev_(device_config(&relay_, kLocal, IBV_MTU_4096)), engine_(dev_, io_, clock_, {}) {
    pd_ = dev_.alloc_pd().value();
    cq_ = dev_.create_cq(256).value();
  }

  // An RC (or UC/UD) QP connected to the fictitious peer (kPeer, kPeerQpn).
  provider::Qp* make_qp(QpParams p = {}) {
    params_ = p;
    provider::QpInitAttr init;
    init.qp_type = p.type;
    init.pd = pd_;
    init.send_cq = send_cq_ != nullptr ? send_cq_ : cq_;
    init.recv_cq = recv_cq_ != nullptr ? recv_cq_ : cq_;
    init.srq = p.srq;
    init.cap = cap_;
    init.sq_sig_all = p.sq_sig_all;
    qp_ = dev_.create_qp(init).value();
    connect(qp_, kPeer, kPeerQpn, p);
    return qp_;
  }

  provider::Mr* reg(void* buf, size_t len, int access) {
    return dev_.reg_mr(pd_, buf, len, reinterpret_cast<uint64_t>(buf), access).value();
  }

  // Builds a packet to our QP from the peer, seals its ICRC, queues it and polls the engine.
  void inject(uint8_t opcode, uint32_t psn, std::span<const uint8_t> payload = {},
              const HeaderFill& fill = {}, bool ack_req = true) {
    std::vector<uint8_t> buf(kMaxPacketBytes);
    auto built = wire::build_packet(buf, opcode, payload);
    ASSERT_TRUE(built.has_value());
    built->headers.bth().set_dest_qp(qp_->qp_num());
    built->headers.bth().set_psn(psn);
    built->headers.bth().set_pkey(0xFFFF);
    built->headers.bth().set_ack_req(ack_req);
    if (fill) fill(built->headers);
    buf.resize(built->layout.total_length());
    inject_raw(std::move(buf));
  }

  void inject_raw(std::vector<uint8_t> bytes, bool seal = true, net::Address src = kPeer) {
    if (seal && bytes.size() >= wire::kIcrcMinUdpPayloadBytes) {
      wire::IcrcIpv4 h;
      const auto s4 = src.v4_bytes();
      const auto d4 = kLocal.v4_bytes();
      std::copy(s4.begin(), s4.end(), h.flow.src_addr.begin());
      std::copy(d4.begin(), d4.end(), h.flow.dst_addr.begin());
      h.flow.udp_src_port = kPeerPort;
      h.flow.udp_dst_port = net::kRoceV2UdpPort;
      wire::seal_icrc(h, bytes);
    }
    io_.inbox.push_back({std::move(bytes), src, kLocal, kPeerPort});
    engine_.poll();
  }

  // The i-th packet the engine sent, parsed (its ICRC checked against our flow).
  wire::PacketView sent(size_t i) {
    EXPECT_LT(i, io_.sent.size());
    const auto& s = io_.sent.at(i);
    wire::IcrcIpv4Flow flow;
    const auto s4 = kLocal.v4_bytes();
    const auto d4 = s.dst.address.v4_bytes();
    std::copy(s4.begin(), s4.end(), flow.src_addr.begin());
    std::copy(d4.begin(), d4.end(), flow.dst_addr.begin());
    flow.udp_src_port = s.src_port;
    flow.udp_dst_port = net::kRoceV2UdpPort;
    EXPECT_TRUE(wire::verify_icrc_ipv4(flow, s.bytes, wire::Ipv4DfSearch::kSetOnly).ok);
    auto r = wire::parse_packet(s.bytes);
    EXPECT_TRUE(r.ok()) << wire::parse_error_name(r.error());
    return *r;
  }
  size_t sent_count() const { return io_.sent.size(); }
  void clear_sent() { io_.sent.clear(); }

  std::vector<ibv_wc> cqes() {
    std::vector<ibv_wc> out(256);
    const int n = cq_->poll(256, out.data());
    out.resize(static_cast<size_t>(std::max(n, 0)));
    return out;
  }

  void advance(uint64_t ns) {
    clock_.advance(ns);
    engine_.poll();
  }

  static inline const net::Address kLocal = net::Address::from_v4(10, 0, 0, 1);
  static inline const net::Address kPeer = net::Address::from_v4(10, 0, 0, 2);

  net::VirtualClock clock_;
  FakeIo io_;
  DoorbellRelay relay_;
  provider::Device dev_;
  Engine engine_;
  provider::Pd* pd_ = nullptr;
  provider::Cq* cq_ = nullptr;
  provider::Qp* qp_ = nullptr;
  QpParams params_;
  // make_qp's capacities: max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline.
  ibv_qp_cap cap_ = {16, 16, 4, 4, 64};
  provider::Cq* send_cq_ = nullptr;  // make_qp's send CQ when set, else cq_
  provider::Cq* recv_cq_ = nullptr;  // make_qp's receive CQ when set, else cq_
};

// AETH helpers for assertions.
inline wire::AethType aeth_type_of(const wire::PacketView& p) {
  return p.aeth()->type();
}

}  // namespace urdma::engine::testing
