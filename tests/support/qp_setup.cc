// Device and QP bring-up; see qp_setup.h.
#include "support/qp_setup.h"

#include <cstring>

#include "provider/qp.h"

namespace urdma::test {

ibv_gid gid_of(const net::Address& a) {
  ibv_gid gid = {};
  std::memcpy(gid.raw, a.bytes().data(), sizeof gid.raw);
  return gid;
}

provider::DeviceConfig device_config(provider::Doorbell* doorbell, const net::Address& address,
                                     ibv_mtu active_mtu) {
  provider::DeviceConfig c;
  c.gids = {gid_of(address)};
  c.active_mtu = active_mtu;
  c.doorbell = doorbell;
  return c;
}

BringUp bring_up(provider::Qp& qp, const QpParams& p, const net::Address& peer, uint32_t peer_qpn) {
  ibv_qp_attr a = {};
  a.pkey_index = 0;
  a.port_num = provider::kPortNum;
  a.qkey = p.qkey;
  a.qp_access_flags = static_cast<unsigned>(p.access);
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = provider::kPortNum;
  a.ah_attr.grh.dgid = gid_of(peer);
  a.ah_attr.grh.sgid_index = p.sgid_index;
  a.ah_attr.grh.hop_limit = p.hop_limit;
  a.path_mtu = p.mtu;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = p.rq_psn;
  a.sq_psn = p.sq_psn;
  a.max_dest_rd_atomic = p.max_dest_rd_atomic;
  a.max_rd_atomic = p.max_rd_atomic;
  a.min_rnr_timer = p.min_rnr_timer;
  a.timeout = p.timeout;
  a.retry_cnt = p.retry_cnt;
  a.rnr_retry = p.rnr_retry;
  static constexpr ibv_qp_state kPath[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
  for (size_t i = 1; i < std::size(kPath); ++i) {
    a.qp_state = kPath[i];
    // Exactly the required attributes of this transition for this QP type (ibv_modify_qp(3)).
    const int mask =
        provider::qp_transition_masks(kPath[i - 1], kPath[i], qp.type()).required | IBV_QP_STATE;
    const provider::Status st = qp.modify(a, mask);
    if (!st.ok()) return {st, kPath[i]};
  }
  return {};
}

}  // namespace urdma::test
