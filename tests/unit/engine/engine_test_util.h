// Shared helpers for the engine tests: simulated hosts (Device + Engine on a SimNetwork host),
// QP connection through the real provider state machine (tests/support/qp_setup.h), posting and
// polling shortcuts.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "support/sim_world.h"
#include "provider/device.h"
#include "support/engine_participant.h"
#include "support/qp_setup.h"
#include "wire/grh.h"

namespace urdma::engine::testing {

// Device configuration, QP parameters and bring-up live in tests/support (qp_setup.h), shared
// with the fuzz target and the benchmark; these names stay for the engine tests.
using test::device_config;
using test::gid_of;
using test::QpParams;

// One host: address, device (doorbell relay wired), engine, a PD and a CQ.
struct SimHost {
  SimHost(net::SimWorld& world, const net::Address& address, ibv_mtu mtu = IBV_MTU_4096,
          EngineConfig config = {})
      : addr(address),
        id(world.network().add_host(address)),
        dev(device_config(&relay, address, mtu)),
        engine(dev, world.network().io(id), world.clock(), config),
        driver(engine) {
    pd = dev.alloc_pd().value();
    cq = dev.create_cq(1024).value();
    world.add_participant(driver, id);
  }

  provider::Qp* create_qp(const QpParams& p) {
    provider::QpInitAttr init;
    init.qp_type = p.type;
    init.pd = pd;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.srq = p.srq;
    init.cap = {64, 64, 4, 4, 64};
    init.sq_sig_all = p.sq_sig_all;
    auto r = dev.create_qp(init);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.value();
  }

  provider::Mr* reg(void* buf, size_t len, int access) {
    auto r = dev.reg_mr(pd, buf, len, reinterpret_cast<uint64_t>(buf), access);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.value();
  }

  std::vector<ibv_wc> poll_cq() {
    std::vector<ibv_wc> out(1024);
    const int n = cq->poll(static_cast<int>(out.size()), out.data());
    out.resize(static_cast<size_t>(std::max(n, 0)));
    return out;
  }

  net::Address addr;
  net::HostId id;
  DoorbellRelay relay;
  provider::Device dev;
  Engine engine;
  test::EngineParticipant driver;  // how the world polls the engine
  provider::Pd* pd = nullptr;
  provider::Cq* cq = nullptr;
};

inline int mask_for(ibv_qp_state cur, ibv_qp_state next, ibv_qp_type type) {
  return provider::qp_transition_masks(cur, next, type).required | IBV_QP_STATE;
}

// Drives `qp` RESET → INIT → RTR → RTS towards (peer address, peer QPN): test::bring_up.
inline void connect(provider::Qp* qp, const net::Address& peer, uint32_t peer_qpn,
                    const QpParams& p) {
  const test::BringUp r = test::bring_up(*qp, p, peer, peer_qpn);
  ASSERT_TRUE(r.ok()) << "to state " << r.failed_to << ": errno " << r.status.error();
}

inline ibv_sge sge(const void* addr, uint32_t len, const provider::Mr* mr) {
  return ibv_sge{reinterpret_cast<uint64_t>(addr), len, mr->lkey()};
}

inline int post_recv(provider::Qp* qp, uint64_t wr_id, ibv_sge s) {
  ibv_recv_wr wr = {};
  wr.wr_id = wr_id;
  wr.sg_list = &s;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return qp->post_recv(&wr, &bad).error();
}

inline int post_send(provider::Qp* qp, ibv_send_wr wr) {
  ibv_send_wr* bad = nullptr;
  return qp->post_send(&wr, &bad).error();
}

inline ibv_send_wr send_wr(uint64_t wr_id, ibv_wr_opcode opcode, ibv_sge* s, int num_sge = 1,
                           unsigned flags = IBV_SEND_SIGNALED) {
  ibv_send_wr wr = {};
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.sg_list = s;
  wr.num_sge = num_sge;
  wr.send_flags = flags;
  return wr;
}

// A byte pattern that differs per seed and position.
inline void fill_pattern(std::vector<uint8_t>& buf, uint32_t seed) {
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF);
}

}  // namespace urdma::engine::testing
