// Zero-copy transmit: the engine hands each datagram to the PacketIo as a gather list whose
// payload iovecs point straight into registered memory (or the provider's inline area), with
// headers before and pad + ICRC after them from engine buffers — and the ICRC computed over
// that gather list still verifies on the bytes a receiver sees.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "protocol_test_util.h"
#include "wire/icrc.h"

namespace urdma::engine::testing {
namespace {

namespace op = wire::op;
constexpr uint32_t kRqPsn = 0x200;  // QpParams default rq_psn

class ZeroCopyTest : public ProtocolTest {
 protected:
  static const uint8_t* base(const iovec& v) { return static_cast<const uint8_t*>(v.iov_base); }
  const FakeIo::Sent& raw(size_t i) const { return io_.sent.at(i); }
  // The ICRC of the gathered bytes, checked directly (sent() checks it too).
  bool icrc_ok(size_t i) const {
    const auto& s = raw(i);
    wire::IcrcIpv4Flow flow;
    const auto s4 = kLocal.v4_bytes();
    const auto d4 = kPeer.v4_bytes();
    std::copy(s4.begin(), s4.end(), flow.src_addr.begin());
    std::copy(d4.begin(), d4.end(), flow.dst_addr.begin());
    flow.udp_src_port = s.src_port;
    return wire::verify_icrc_ipv4(flow, s.bytes, wire::Ipv4DfSearch::kSetOnly).ok;
  }
  void post(ibv_send_wr wr) {
    ASSERT_EQ(post_send(qp_, wr), 0);
    engine_.poll();
  }
};

// Three SGEs in two registered buffers → headers, three payload iovecs at exactly the SGE
// addresses, pad + ICRC; nothing copied.
TEST_F(ZeroCopyTest, SendPayloadIovecsPointIntoRegisteredMemory) {
  make_qp();
  std::vector<uint8_t> a(512), b(128);
  fill_pattern(a, 1);
  fill_pattern(b, 2);
  auto* mr_a = reg(a.data(), a.size(), 0);
  auto* mr_b = reg(b.data(), b.size(), 0);
  ibv_sge sges[3] = {sge(a.data(), 100, mr_a), sge(b.data(), 50, mr_b),
                     sge(a.data() + 200, 101, mr_a)};
  post(send_wr(1, IBV_WR_SEND, sges, 3));
  ASSERT_EQ(sent_count(), 1u);
  const auto& s = raw(0);
  ASSERT_EQ(s.iov.size(), 5u);  // headers, 3 × payload, trailer
  EXPECT_EQ(base(s.iov[1]), a.data());
  EXPECT_EQ(s.iov[1].iov_len, 100u);
  EXPECT_EQ(base(s.iov[2]), b.data());
  EXPECT_EQ(s.iov[2].iov_len, 50u);
  EXPECT_EQ(base(s.iov[3]), a.data() + 200);
  EXPECT_EQ(s.iov[3].iov_len, 101u);
  EXPECT_EQ(s.iov[4].iov_len, 1u + wire::kIcrcBytes);  // 251 payload bytes: 1 pad byte
  EXPECT_TRUE(icrc_ok(0));
  const wire::PacketView p = sent(0);
  EXPECT_EQ(p.opcode(), op::kRcSendOnly);
  ASSERT_EQ(p.payload().size(), 251u);
  EXPECT_EQ(0, std::memcmp(p.payload().data(), a.data(), 100));
  EXPECT_EQ(0, std::memcmp(p.payload().data() + 100, b.data(), 50));
  EXPECT_EQ(0, std::memcmp(p.payload().data() + 150, a.data() + 200, 101));
  EXPECT_EQ(engine_.counters().tx_payload_copies, 0u);
}

// A multi-packet RDMA WRITE: each packet's payload iovec is the next PMTU of the source SGE.
TEST_F(ZeroCopyTest, WriteSegmentsPointAtSuccessiveMtusOfTheSge) {
  make_qp();  // PMTU 1024
  std::vector<uint8_t> src(2500);
  fill_pattern(src, 3);
  auto* mr = reg(src.data(), src.size(), 0);
  ibv_sge s = sge(src.data(), 2500, mr);
  ibv_send_wr wr = send_wr(1, IBV_WR_RDMA_WRITE, &s);
  wr.wr.rdma.remote_addr = 0x10000;
  wr.wr.rdma.rkey = 0x1234;
  post(wr);
  ASSERT_EQ(sent_count(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& d = raw(i);
    ASSERT_EQ(d.iov.size(), 3u) << i;
    EXPECT_EQ(base(d.iov[1]), src.data() + 1024 * i) << i;
    EXPECT_EQ(d.iov[1].iov_len, i < 2 ? 1024u : 452u) << i;
    EXPECT_TRUE(icrc_ok(i)) << i;
    EXPECT_EQ(0, std::memcmp(sent(i).payload().data(), src.data() + 1024 * i, d.iov[1].iov_len));
  }
}

// Inline data is sent from the provider's copy of it (taken at post time), not from the
// caller's buffer and not through a staging copy.
TEST_F(ZeroCopyTest, InlinePayloadPointsAtTheProviderInlineArea) {
  make_qp();
  char msg[] = "inline payload";
  ibv_sge s{reinterpret_cast<uint64_t>(msg), sizeof(msg), 0};
  post(send_wr(1, IBV_WR_SEND, &s, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE));
  ASSERT_EQ(sent_count(), 1u);
  const provider::EngineTurnMark turn;  // looking into the SQ as the engine does
  const provider::SendWqe* wqe = qp_->sq_peek_st(0);  // unacknowledged: still in the SQ
  ASSERT_NE(wqe, nullptr);
  const auto& d = raw(0);
  ASSERT_EQ(d.iov.size(), 3u);
  EXPECT_EQ(base(d.iov[1]), qp_->sq_inline_st(*wqe).data());
  EXPECT_NE(base(d.iov[1]), reinterpret_cast<const uint8_t*>(msg));
  EXPECT_TRUE(icrc_ok(0));
  EXPECT_EQ(0, std::memcmp(sent(0).payload().data(), msg, sizeof(msg)));
}

// READ responses are gathered from the responder's registered (and R_Key-checked) memory.
TEST_F(ZeroCopyTest, ReadResponsesPointIntoTheReadRegion) {
  make_qp();
  std::vector<uint8_t> mem(4096);
  fill_pattern(mem, 4);
  auto* mr = reg(mem.data(), mem.size(), IBV_ACCESS_REMOTE_READ);
  inject(op::kRcReadRequest, kRqPsn, {}, [&](const wire::PacketHeaders& h) {
    h.reth()->set_va(reinterpret_cast<uint64_t>(mem.data()) + 7);
    h.reth()->set_rkey(mr->rkey());
    h.reth()->set_dma_length(2000);
  });
  ASSERT_EQ(sent_count(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& d = raw(i);
    ASSERT_EQ(d.iov.size(), 3u) << i;
    EXPECT_EQ(base(d.iov[1]), mem.data() + 7 + 1024 * i) << i;
    EXPECT_TRUE(icrc_ok(i)) << i;
  }
  EXPECT_EQ(0, std::memcmp(sent(1).payload().data(), mem.data() + 7 + 1024, 976));
}

// Packets without payload (ACKs, READ requests, atomics) are one contiguous iovec.
TEST_F(ZeroCopyTest, HeaderOnlyPacketsAreOneIovec) {
  make_qp();
  std::vector<uint8_t> local(8);
  auto* mr = reg(local.data(), local.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s = sge(local.data(), 8, mr);
  ibv_send_wr wr = send_wr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, &s);
  wr.wr.atomic.remote_addr = 0x1000;
  wr.wr.atomic.rkey = 0x77;
  wr.wr.atomic.compare_add = 5;
  post(wr);
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(raw(0).iov.size(), 1u);
  EXPECT_TRUE(icrc_ok(0));
  EXPECT_EQ(sent(0).opcode(), op::kRcFetchAdd);
}

// net::kMaxTxIov bounds the gather list: 14 payload pieces still go zero-copy (16 iovecs);
// 15 do not fit, so that packet's payload is copied into the engine buffer (counted) and it
// goes out as one iovec — with the same bytes and a valid ICRC.
TEST_F(ZeroCopyTest, MoreSgesThanIovecsFallBackToOneCountedCopy) {
  cap_.max_send_sge = 16;
  make_qp();
  std::vector<uint8_t> buf(64);
  fill_pattern(buf, 5);
  auto* mr = reg(buf.data(), buf.size(), 0);
  std::vector<ibv_sge> sges;
  for (uint32_t i = 0; i < 15; ++i) sges.push_back(sge(buf.data() + 4 * i, 3, mr));  // disjoint
  post(send_wr(1, IBV_WR_SEND, sges.data(), 14));
  ASSERT_EQ(sent_count(), 1u);
  EXPECT_EQ(raw(0).iov.size(), net::kMaxTxIov);
  EXPECT_EQ(engine_.counters().tx_payload_copies, 0u);
  post(send_wr(2, IBV_WR_SEND, sges.data(), 15));
  ASSERT_EQ(sent_count(), 2u);
  EXPECT_EQ(raw(1).iov.size(), 1u);
  EXPECT_EQ(engine_.counters().tx_payload_copies, 1u);
  for (size_t pkt = 0; pkt < 2; ++pkt) {
    EXPECT_TRUE(icrc_ok(pkt)) << pkt;
    const wire::PacketView p = sent(pkt);
    const size_t n = pkt == 0 ? 14 : 15;
    ASSERT_EQ(p.payload().size(), 3 * n);
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(0, std::memcmp(p.payload().data() + 3 * i, buf.data() + 4 * i, 3)) << pkt << i;
  }
}

// The local access check stays per SGE: a bad L_Key in the second SGE is a Local Protection
// Error and nothing is sent.
TEST_F(ZeroCopyTest, BadLkeyInALaterSgeSendsNothing) {
  make_qp();
  std::vector<uint8_t> buf(64);
  auto* mr = reg(buf.data(), buf.size(), 0);
  ibv_sge sges[2] = {sge(buf.data(), 8, mr),
                     ibv_sge{reinterpret_cast<uint64_t>(buf.data()), 8, mr->lkey() ^ 0x100}};
  post(send_wr(1, IBV_WR_SEND, sges, 2));
  EXPECT_EQ(sent_count(), 0u);
  auto wcs = cqes();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
}

}  // namespace
}  // namespace urdma::engine::testing
