#include "daemon/mad_router.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "gsi/gmp.h"
#include "wire/cm.h"
#include "wire/headers.h"
#include "wire/mad.h"
#include "wire/opcode.h"

namespace urdma::daemon {
namespace {

// A GMP carrying one CM MAD, as a peer's CM sends it (the router does not look at the ICRC).
template <class View, class Fill>
std::vector<uint8_t> cm_datagram(Fill fill, uint32_t dest_qp = wire::kMadGsiQpn) {
  std::array<uint8_t, wire::kMadSize> mad{};
  fill(wire::init_cm_message<View>(mad, /*transaction_id=*/0x1234));
  std::vector<uint8_t> d(gsi::kGmpBytes);
  const net::Endpoint peer{net::Address::from_v4(10, 0, 0, 2), 4791};
  const net::Endpoint host{net::Address::from_v4(10, 0, 0, 1), 4791};
  gsi::build_gmp(std::span<uint8_t, gsi::kGmpBytes>(d), mad, 0, peer, host, dest_qp);
  return d;
}

TEST(MadRouter, CommIdsCarryTheSlot) {
  EXPECT_EQ(comm_id_for_slot(5, 0x123456), 0x05123456u);
  EXPECT_EQ(comm_id_for_slot(5, 0xFF123456), 0x05123456u) << "the low bits cannot change the slot";
  EXPECT_EQ(slot_of_comm_id(comm_id_for_slot(127, 9)), 127u);
}

TEST(MadRouter, RequestsGoByServiceId) {
  const auto req = cm_datagram<wire::CmReq>([](wire::CmReq m) {
    m.set_service_id(0x0106000000001234ull);
    m.set_local_comm_id(0xAABBCCDD);  // the peer's: says nothing about us
  });
  auto r = route_mad(req);
  EXPECT_EQ(r.by, MadRoute::By::kServiceId);
  EXPECT_EQ(r.service_id, 0x0106000000001234ull);
  const auto sidr = cm_datagram<wire::CmSidrReq>([](wire::CmSidrReq m) {
    m.set_service_id(77);
    m.set_request_id(0xAABBCCDD);
  });
  r = route_mad(sidr);
  EXPECT_EQ(r.by, MadRoute::By::kServiceId);
  EXPECT_EQ(r.service_id, 77u);
}

TEST(MadRouter, EverythingElseGoesByTheReceiversId) {
  const uint32_t ours = comm_id_for_slot(9, 42);
  auto expect_slot9 = [](const std::vector<uint8_t>& d) {
    const auto r = route_mad(d);
    EXPECT_EQ(r.by, MadRoute::By::kSlot);
    EXPECT_EQ(r.slot, 9u);
  };
  expect_slot9(cm_datagram<wire::CmRep>([&](wire::CmRep m) {
    m.set_local_comm_id(0x11000001);
    m.set_remote_comm_id(ours);
  }));
  expect_slot9(cm_datagram<wire::CmRtu>([&](wire::CmRtu m) { m.set_remote_comm_id(ours); }));
  expect_slot9(cm_datagram<wire::CmRej>([&](wire::CmRej m) { m.set_remote_comm_id(ours); }));
  expect_slot9(cm_datagram<wire::CmMra>([&](wire::CmMra m) { m.set_remote_comm_id(ours); }));
  expect_slot9(cm_datagram<wire::CmDreq>([&](wire::CmDreq m) { m.set_remote_comm_id(ours); }));
  expect_slot9(cm_datagram<wire::CmDrep>([&](wire::CmDrep m) { m.set_remote_comm_id(ours); }));
  expect_slot9(cm_datagram<wire::CmSidrRep>([&](wire::CmSidrRep m) { m.set_request_id(ours); }));
}

// A REJ with RemoteCommID 0 (an active side that gave up before it heard ours: REJ "timeout"
// from Linux cm_destroy_id) cannot name our slot; it goes by its sender's comm ID, the one the
// REQ carried.
TEST(MadRouter, ARejWithoutOurIdGoesByTheRequestersId) {
  const auto req = route_mad(cm_datagram<wire::CmReq>([](wire::CmReq m) {
    m.set_service_id(5);
    m.set_local_comm_id(0xAABBCCDD);
  }));
  EXPECT_EQ(req.sender_comm_id, 0xAABBCCDDu);
  const auto rej = route_mad(cm_datagram<wire::CmRej>([](wire::CmRej m) {
    m.set_local_comm_id(0xAABBCCDD);
    m.set_remote_comm_id(0);
    m.set_reason(static_cast<uint16_t>(wire::CmRejReason::kTimeout));
  }));
  EXPECT_EQ(rej.by, MadRoute::By::kRequester);
  EXPECT_EQ(rej.sender_comm_id, 0xAABBCCDDu);
}

TEST(RequesterTable, FindsTheSlotOnceAndForgetsTheOldestAndADeadSlots) {
  const net::Address a = net::Address::from_v4(10, 0, 0, 1);
  const net::Address b = net::Address::from_v4(10, 0, 0, 2);
  RequesterTable t;
  t.remember(a, 7, 3);
  t.remember(b, 7, 4);
  EXPECT_EQ(t.take(b, 7), 4u) << "the same comm ID from another host is another request";
  EXPECT_EQ(t.take(b, 7), std::nullopt) << "one REJ ends the request";
  EXPECT_EQ(t.take(a, 8), std::nullopt);
  t.forget_slot(3);
  EXPECT_EQ(t.take(a, 7), std::nullopt) << "the slot's process is gone";
  // Bounded: the oldest go first; a key remembered again is as new as its last REQ.
  for (uint32_t id = 0; id < RequesterTable::kCapacity; ++id) t.remember(a, id, 5);
  t.remember(a, 0, 6);  // a retransmitted REQ, routed again
  t.remember(b, 1, 5);  // one more: the oldest still-current entry (a, 1) goes
  EXPECT_EQ(t.size(), RequesterTable::kCapacity);
  EXPECT_EQ(t.take(a, 1), std::nullopt);
  EXPECT_EQ(t.take(a, 0), 6u);
  EXPECT_EQ(t.take(a, 2), 5u);
  EXPECT_EQ(t.take(b, 1), 5u);
}

TEST(MadRouter, DropsWhatIsNotACmMadForQp1) {
  EXPECT_EQ(route_mad(std::vector<uint8_t>(7)).drop, MadDrop::kNotRoce);
  const auto rtu = cm_datagram<wire::CmRtu>([](wire::CmRtu) {}, /*dest_qp=*/2);
  EXPECT_EQ(route_mad(rtu).drop, MadDrop::kNotQp1);
  auto not_cm = cm_datagram<wire::CmRtu>([](wire::CmRtu) {});
  not_cm[wire::Bth::kSize + wire::Deth::kSize + 1] = 0x04;  // management class: not the CM
  EXPECT_EQ(route_mad(not_cm).drop, MadDrop::kNotCm);
  auto rc = cm_datagram<wire::CmRtu>([](wire::CmRtu) {});
  rc[0] = wire::op::kRcSendOnly;  // an RC SEND to QP1
  EXPECT_NE(route_mad(rc).by, MadRoute::By::kSlot);
  const auto cpi = cm_datagram<wire::CmClassPortInfo>([](wire::CmClassPortInfo) {});
  EXPECT_EQ(route_mad(cpi).drop, MadDrop::kClassPortInfo);
  for (size_t i = 0; i < kMadDropCount; ++i)
    EXPECT_STRNE(mad_drop_name(static_cast<MadDrop>(i)), "?");
}

}  // namespace
}  // namespace urdma::daemon
