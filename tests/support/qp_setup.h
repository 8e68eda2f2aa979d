// Bringing a device and its QPs up the way an application does, for every program that runs an
// engine without the verbs layer: the engine tests, the engine fuzz target and the benchmark.
//
//   provider::DeviceConfig cfg = test::device_config(&relay, address, IBV_MTU_4096);
//   test::QpParams p;  p.type = IBV_QPT_RC;  p.sq_psn = ...;  p.rq_psn = ...;
//   test::BringUp r = test::bring_up(*qp, p, peer_address, peer_qpn);  // RESET → … → RTS
//   if (!r.ok()) ... r.status.error() (an errno), r.failed_to (the state it could not enter)
//
// bring_up() passes exactly the attribute mask ibv_modify_qp(3) requires for the QP's type at
// each step (provider::qp_transition_masks: IBA 11.2.5.2, the kernel's table), so the provider's
// state machine is exercised as a real application exercises it. No GoogleTest here: the fuzz
// target and the benchmark use it too.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "net/address.h"
#include "provider/device.h"
#include "provider/status.h"

namespace urdma::test {

// The RoCEv2 GID of an address: IPv4-mapped for IPv4, the address itself for IPv6.
ibv_gid gid_of(const net::Address& a);

// A device whose GID table holds `address` at index 0, with the doorbell wired (pass the
// engine::DoorbellRelay the Engine will attach to).
provider::DeviceConfig device_config(provider::Doorbell* doorbell, const net::Address& address,
                                     ibv_mtu active_mtu = IBV_MTU_1024);

// What bring_up() sets. Defaults: an RC QP with every remote right, retries on, PSNs that differ
// per direction.
struct QpParams {
  ibv_qp_type type = IBV_QPT_RC;
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t sq_psn = 0x100;
  uint32_t rq_psn = 0x200;  // the peer's sq_psn must equal this
  uint8_t timeout = 10;     // local ACK timeout code: 4.096 us << 10 = 4.2 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;      // 7: infinite
  uint8_t min_rnr_timer = 1;  // IBA table 45 code: 0.01 ms
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
  int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  uint32_t qkey = 0x11111111;  // UD
  uint8_t hop_limit = 64;
  uint8_t sgid_index = 0;
  // Used by the create_qp helpers of the fixtures, not by bring_up().
  bool sq_sig_all = false;
  provider::Srq* srq = nullptr;
};

struct BringUp {
  provider::Status status;                 // the first failing modify's errno, or ok
  ibv_qp_state failed_to = IBV_QPS_RESET;  // the state it could not enter (when !ok())
  bool ok() const { return status.ok(); }
};

// Drives `qp` RESET → INIT → RTR → RTS towards (peer, peer_qpn); for UD the peer is not used.
BringUp bring_up(provider::Qp& qp, const QpParams& p, const net::Address& peer, uint32_t peer_qpn);

}  // namespace urdma::test
