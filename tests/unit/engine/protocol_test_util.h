// The eRPC protocol-test harness for the engine: one Engine on an in-memory PacketIo. Tests
// hand-build packets (with a correct ICRC, from a fictitious peer), feed them in, poll, and
// assert on the packets and completions that come out.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "net/clock.h"
#include "support/datagram.h"
#include "support/memory_host.h"
#include "support/memory_io.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace urdma::engine::testing {

// Records what the engine sends; delivers what the test queues (tests/support/memory_io.h).
using FakeIo = test::MemoryIo;

using HeaderFill = std::function<void(const wire::PacketHeaders&)>;

class ProtocolTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kPeerQpn = 0x99;
  static constexpr uint16_t kPeerPort = 0xC123;

  ProtocolTest() : host_(device_config(nullptr, kLocal, IBV_MTU_4096)) {}
  explicit ProtocolTest(engine::EngineConfig config)
      : host_(device_config(nullptr, kLocal, IBV_MTU_4096), config) {}

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

  // A packet to our QP from the peer (ICRC not sealed yet); empty if it could not be built.
  std::vector<uint8_t> build(uint8_t opcode, uint32_t psn, std::span<const uint8_t> payload = {},
                             const HeaderFill& fill = {}, bool ack_req = true) {
    std::vector<uint8_t> buf(kMaxPacketBytes);
    auto built = wire::build_packet(buf, opcode, payload);
    EXPECT_TRUE(built.has_value());
    if (!built) return {};
    built->headers.bth().set_dest_qp(qp_->qp_num());
    built->headers.bth().set_psn(psn);
    built->headers.bth().set_pkey(0xFFFF);
    built->headers.bth().set_ack_req(ack_req);
    if (fill) fill(built->headers);
    buf.resize(built->layout.total_length());
    return buf;
  }

  // The peer's plain ACK of `psn` (credits invalid), built as build() builds.
  std::vector<uint8_t> build_ack(uint32_t psn) {
    return build(wire::op::kRcAck, psn, {}, [](const wire::PacketHeaders& h) {
      h.aeth()->set_syndrome(wire::make_ack(wire::kAethCreditsInvalid));
    });
  }

  // Builds a packet to our QP from the peer, seals its ICRC, queues it and polls the engine.
  void inject(uint8_t opcode, uint32_t psn, std::span<const uint8_t> payload = {},
              const HeaderFill& fill = {}, bool ack_req = true) {
    std::vector<uint8_t> bytes = build(opcode, psn, payload, fill, ack_req);
    ASSERT_FALSE(bytes.empty());
    inject_raw(std::move(bytes));
  }

  // Queues a datagram from the peer (its ICRC sealed unless `seal` is false), without polling:
  // several land in one receive batch.
  void deliver(std::vector<uint8_t> bytes, bool seal = true, net::Address src = kPeer) {
    const net::Endpoint from{src, kPeerPort};
    const net::Endpoint to{kLocal, net::kRoceV2UdpPort};
    if (seal) net::seal_icrc(bytes, from, to);
    io_.deliver(bytes, from, to);
  }

  void inject_raw(std::vector<uint8_t> bytes, bool seal = true, net::Address src = kPeer) {
    deliver(std::move(bytes), seal, src);
    engine_.poll();
  }

  // The i-th packet the engine sent, parsed (its ICRC checked against our flow).
  wire::PacketView sent(size_t i) {
    EXPECT_LT(i, io_.sent.size());
    const auto& s = io_.sent.at(i);
    EXPECT_TRUE(net::icrc_exact(s.bytes, {kLocal, s.src_port}, s.dst));
    auto r = wire::parse_packet(s.bytes);
    EXPECT_TRUE(r.ok()) << wire::parse_error_name(r.error());
    return *r;
  }
  size_t sent_count() const { return io_.sent.size(); }
  void clear_sent() { io_.sent.clear(); }
  // The i-th packet sent is a NAK with `code` for `psn`, to the peer.
  void expect_nak(size_t i, wire::NakCode code, uint32_t psn) {
    const wire::PacketView p = sent(i);
    EXPECT_EQ(p.opcode(), wire::op::kRcAck);
    ASSERT_TRUE(p.aeth()->is_nak());
    EXPECT_EQ(p.aeth()->nak_code(), static_cast<uint8_t>(code));
    EXPECT_EQ(p.bth().psn(), psn);
    EXPECT_EQ(p.bth().dest_qp(), kPeerQpn);
  }
  // A header fill for a RETH: VA, R_Key, DMA length.
  static HeaderFill reth(uint64_t va, uint32_t rkey, uint32_t len) {
    return [=](const wire::PacketHeaders& h) {
      h.reth()->set_va(va);
      h.reth()->set_rkey(rkey);
      h.reth()->set_dma_length(len);
    };
  }

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

  // The engine on the in-memory wire (tests/support/memory_host.h), and its parts by the names
  // the tests use.
  test::MemoryHost host_;
  net::VirtualClock& clock_ = host_.clock;
  FakeIo& io_ = host_.io;
  DoorbellRelay& relay_ = host_.relay;
  provider::Device& dev_ = host_.dev;
  Engine& engine_ = host_.engine;
  provider::Pd* pd_ = host_.pd;
  provider::Cq* cq_ = host_.cq;
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
