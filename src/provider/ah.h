// Address handles and address vectors.
//
// Design: RoCEv2 addresses a peer by GID, and a RoCEv2 GID is an IPv6 address; an IPv4
// address is carried as the IPv4-mapped GID ::ffff:a.b.c.d (RoCEv2 annex A17.4.5.1). An
// `AddressVector` is the resolved form both a UD AH and a connected QP's primary path
// (IBV_QP_AV) use: IP family and address plus the GRH fields (flow label, hop limit, traffic
// class, SGID index). A UD send copies the AV into its WQE at post time (as rxe does), so the
// engine never looks up an AH and destroying an AH cannot pull it from under a posted WR.
#pragma once

#include <array>
#include <cstdint>

#include <infiniband/verbs.h>

#include "provider/pd.h"
#include "provider/status.h"

namespace urdma::provider {

struct AddressVector {
  enum class Family : uint8_t { kIpv4, kIpv6 };
  Family family = Family::kIpv6;
  // Destination IP address in network byte order: 4 bytes for IPv4, 16 for IPv6.
  std::array<uint8_t, 16> dest_ip = {};
  ibv_gid dgid = {};
  uint32_t flow_label = 0;  // 20 bits (IBA 8.3.1)
  uint8_t hop_limit = 0;
  uint8_t traffic_class = 0;
  uint8_t sgid_index = 0;
  uint8_t sl = 0;
  uint8_t static_rate = 0;
};

// Is this GID an IPv4-mapped IPv6 address (::ffff:0:0/96)?
bool gid_is_ipv4_mapped(const ibv_gid& gid);

// Resolves an ibv_ah_attr against the port's GID table (`sgid_present(index)` says whether a
// GID exists at that index). EINVAL: no GRH (RoCE requires one), port other than 1, SGID index
// out of range or empty, flow label wider than 20 bits.
template <class SgidPresent>
Result<AddressVector> make_address_vector(const ibv_ah_attr& attr, SgidPresent sgid_present);

class Ah {
 public:
  Ah(uint32_t handle, Pd* pd, const ibv_ah_attr& attr, const AddressVector& av)
      : handle_(handle), pd_(pd), attr_(attr), av_(av) {}
  uint32_t handle() const { return handle_; }  // goes into ibv_ah.handle
  Pd* pd() const { return pd_; }
  const ibv_ah_attr& attr() const { return attr_; }  // as given (ibv_query_ah)
  const AddressVector& av() const { return av_; }

  void* user_context = nullptr;  // the verbs layer's ibv_ah

 private:
  const uint32_t handle_;
  Pd* const pd_;
  const ibv_ah_attr attr_;
  const AddressVector av_;
};

// ---- implementation ----

inline constexpr uint32_t kFlowLabelMask = 0xfffff;

template <class SgidPresent>
Result<AddressVector> make_address_vector(const ibv_ah_attr& attr, SgidPresent sgid_present) {
  // RoCE: every packet carries a GRH/IP header, so the AH must be global (rxe_av_chk_attr).
  if (!attr.is_global) return Status(EINVAL);
  if (attr.port_num != 1) return Status(EINVAL);
  if (!sgid_present(attr.grh.sgid_index)) return Status(EINVAL);
  AddressVector av;
  av.dgid = attr.grh.dgid;
  if (gid_is_ipv4_mapped(attr.grh.dgid)) {
    av.family = AddressVector::Family::kIpv4;
    for (int i = 0; i < 4; ++i) av.dest_ip[i] = attr.grh.dgid.raw[12 + i];
  } else {
    av.family = AddressVector::Family::kIpv6;
    for (int i = 0; i < 16; ++i) av.dest_ip[i] = attr.grh.dgid.raw[i];
  }
  // The field is 20 bits wide; neither uverbs nor rxe refuses more, and callers rely on it (UCX
  // passes ~(path factor * path index), ~0 for its first path): the bits above are ignored.
  av.flow_label = attr.grh.flow_label & kFlowLabelMask;
  av.hop_limit = attr.grh.hop_limit;
  av.traffic_class = attr.grh.traffic_class;
  av.sgid_index = attr.grh.sgid_index;
  av.sl = attr.sl;
  av.static_rate = attr.static_rate;
  return av;
}

}  // namespace urdma::provider
