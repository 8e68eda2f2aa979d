// libFuzzer target: arbitrary bytes as a MAD received on QP1.
//
// Parses with parse_mad / parse_cm, reads every accessor of whatever message comes out, decodes
// the rdma_cm IP header of REQ / SIDR_REQ private data, and checks two properties:
//  * writing back every field value just read leaves the MAD byte-for-byte unchanged (the
//    setters and getters agree on every field's bits, and no field spills into another);
//  * a cma_hdr that parses re-encodes to one that parses to the same address.
// Any violation traps, so libFuzzer reports it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <variant>

#include "wire/cm.h"
#include "wire/mad.h"
#include "wire/rdma_cm_ip.h"

namespace {

using namespace urdma::wire;

uint64_t sink = 0;
using Mad = std::array<uint8_t, kMadSize>;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

template <typename Span>
void touch_bytes(Span s) {
  for (uint8_t b : s) sink += b;
}

// Scalar fields of each view, as X-macro lists (getter name = setter suffix).
#define PATH_FIELDS(X)                                                             \
  X(local_port_lid)                                                                \
  X(remote_port_lid)                                                               \
  X(flow_label) X(packet_rate) X(traffic_class) X(hop_limit) X(sl) X(subnet_local) \
      X(local_ack_timeout)
#define REQ_FIELDS(X)                                                                            \
  X(local_comm_id)                                                                               \
  X(service_id)                                                                                  \
  X(local_ca_guid) X(local_q_key) X(local_qpn) X(responder_resources) X(local_eecn)              \
      X(initiator_depth) X(remote_eecn) X(remote_cm_response_timeout) X(transport_service_type)  \
          X(end_to_end_flow_control) X(starting_psn) X(local_cm_response_timeout) X(retry_count) \
              X(partition_key) X(path_packet_payload_mtu) X(rdc_exists) X(rnr_retry_count)       \
                  X(max_cm_retries) X(srq) X(extended_transport_type) X(sap_supported)
#define MRA_FIELDS(X) X(local_comm_id) X(remote_comm_id) X(message_mraed) X(service_timeout)
#define REJ_FIELDS(X) \
  X(local_comm_id) X(remote_comm_id) X(message_rejected) X(reject_info_length) X(reason)
#define REP_FIELDS(X)                                                                        \
  X(local_comm_id)                                                                           \
  X(remote_comm_id)                                                                          \
  X(local_q_key) X(local_qpn) X(local_eecn) X(starting_psn) X(responder_resources)           \
      X(initiator_depth) X(target_ack_delay) X(failover_accepted) X(end_to_end_flow_control) \
          X(rnr_retry_count) X(srq) X(local_ca_guid)
#define RTU_FIELDS(X) X(local_comm_id) X(remote_comm_id)
#define DREQ_FIELDS(X) X(local_comm_id) X(remote_comm_id) X(remote_qpn_eecn)
#define DREP_FIELDS(X) X(local_comm_id) X(remote_comm_id)
#define SIDR_REQ_FIELDS(X) X(request_id) X(partition_key) X(service_id)
#define SIDR_REP_FIELDS(X) \
  X(request_id) X(status) X(additional_information_length) X(qpn) X(service_id) X(q_key)
#define LAP_FIELDS(X)                                                                 \
  X(local_comm_id)                                                                    \
  X(remote_comm_id)                                                                   \
  X(remote_qpn_eecn) X(remote_cm_response_timeout) X(alternate_local_port_lid)        \
      X(alternate_remote_port_lid) X(alternate_flow_label) X(alternate_traffic_class) \
          X(alternate_hop_limit) X(alternate_packet_rate) X(alternate_sl)             \
              X(alternate_subnet_local) X(alternate_local_ack_timeout)
#define APR_FIELDS(X) \
  X(local_comm_id) X(remote_comm_id) X(additional_information_length) X(ap_status)
#define CPI_FIELDS(X)                                                                              \
  X(base_version)                                                                                  \
  X(class_version)                                                                                 \
  X(capability_mask) X(capability_mask2) X(resp_time_value) X(redirect_tc) X(redirect_sl)          \
      X(redirect_fl) X(redirect_lid) X(redirect_p_key) X(redirect_qp) X(redirect_q_key) X(trap_tc) \
          X(trap_sl) X(trap_fl) X(trap_lid) X(trap_p_key) X(trap_hl) X(trap_qp) X(trap_q_key)
#define HEADER_FIELDS(X)                                                                        \
  X(base_version)                                                                               \
  X(mgmt_class)                                                                                 \
  X(class_version) X(method) X(r) X(status) X(class_specific) X(transaction_id) X(attribute_id) \
      X(reserved) X(attribute_modifier)

// Reads every listed field of `r` and writes it back through `w` (same bytes).
#define READ_WRITE(f) \
  sink += r.f();      \
  w.set_##f(r.f());

void touch_cma(std::span<const uint8_t> private_data) {
  const CmaHdrParse h = parse_cma_hdr(private_data);
  sink += static_cast<uint64_t>(h.error) + cma_hdr_error_name(h.error).size();
  if (!h.ok()) return;
  sink += h.address.ip_version + h.address.src_port;
  touch_bytes(std::span<const uint8_t>(h.address.src_addr));
  std::array<uint8_t, kCmaHdrSize> again{};
  write_cma_hdr(again, h.address);
  const CmaHdrParse back = parse_cma_hdr(again);
  require(back.ok() && back.address == h.address);
}

void touch_service_id(uint64_t sid) {
  if (const auto d = decode_rdma_service_id(sid)) {
    require(rdma_service_id(d->port_space, d->port) == sid);
    sink += d->port;
  }
}

// One overload per message: `r` reads the parsed MAD, `w` writes a copy of it.
void write_back_cpi(ClassPortInfoView r, ClassPortInfo w) {
  CPI_FIELDS(READ_WRITE)
  touch_bytes(r.redirect_gid());
  touch_bytes(r.trap_gid());
  w.set_redirect_gid(r.redirect_gid());
  w.set_trap_gid(r.trap_gid());
}

void visit(CmClassPortInfoView r, Mad& copy) {
  write_back_cpi(r.info(), CmClassPortInfo(copy).info());
}

void write_back_path(CmReqPathView r, CmReqPath w) {
  PATH_FIELDS(READ_WRITE)
  touch_bytes(r.local_port_gid());
  touch_bytes(r.remote_port_gid());
  w.set_local_port_gid(r.local_port_gid());
  w.set_remote_port_gid(r.remote_port_gid());
}

void visit(CmReqView r, Mad& copy) {
  const CmReq w(copy);
  REQ_FIELDS(READ_WRITE)
  write_back_path(r.primary_path(), w.primary_path());
  write_back_path(r.alternate_path(), w.alternate_path());
  touch_service_id(r.service_id());
  touch_cma(r.private_data());
}

void visit(CmMraView r, Mad& copy) {
  const CmMra w(copy);
  MRA_FIELDS(READ_WRITE)
}

void visit(CmRejView r, Mad& copy) {
  const CmRej w(copy);
  REJ_FIELDS(READ_WRITE)
  require(r.ari().size() == r.reject_info_length());  // parse_cm checked the length
  touch_bytes(r.ari());
  sink += cm_rej_reason_name(r.reason()).size();
  // Rewriting the ARI through its setter reproduces the same bytes and length.
  std::array<uint8_t, 72> area;
  std::copy(r.ari_area().begin(), r.ari_area().end(), area.begin());
  require(w.set_ari(std::span<const uint8_t>(area).first(r.reject_info_length())) == MadError::kOk);
  std::copy(area.begin(), area.end(), w.ari_area().begin());
}

void visit(CmRepView r, Mad& copy) {
  const CmRep w(copy);
  REP_FIELDS(READ_WRITE)
}
void visit(CmRtuView r, Mad& copy) {
  const CmRtu w(copy);
  RTU_FIELDS(READ_WRITE)
}
void visit(CmDreqView r, Mad& copy) {
  const CmDreq w(copy);
  DREQ_FIELDS(READ_WRITE)
}
void visit(CmDrepView r, Mad& copy) {
  const CmDrep w(copy);
  DREP_FIELDS(READ_WRITE)
}

void visit(CmSidrReqView r, Mad& copy) {
  const CmSidrReq w(copy);
  SIDR_REQ_FIELDS(READ_WRITE)
  touch_service_id(r.service_id());
  touch_cma(r.private_data());
}

void visit(CmSidrRepView r, Mad& copy) {
  const CmSidrRep w(copy);
  SIDR_REP_FIELDS(READ_WRITE)
  touch_bytes(r.additional_information());
  sink += cm_sidr_status_name(r.status()).size();
  write_back_cpi(r.class_port_info(), w.class_port_info());
}

void visit(CmLapView r, Mad& copy) {
  const CmLap w(copy);
  LAP_FIELDS(READ_WRITE)
  touch_bytes(r.alternate_local_port_gid());
  touch_bytes(r.alternate_remote_port_gid());
  w.set_alternate_local_port_gid(r.alternate_local_port_gid());
  w.set_alternate_remote_port_gid(r.alternate_remote_port_gid());
}

void visit(CmAprView r, Mad& copy) {
  const CmApr w(copy);
  APR_FIELDS(READ_WRITE)
  require(r.additional_information().size() == r.additional_information_length());
  touch_bytes(r.additional_information());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);

  const MadParse m = parse_mad(in);
  sink += mad_error_name(m.error).size() + mad_error_status(m.error);
  if (size >= kMadHeaderSize) {
    // The header is readable on any 24 bytes, parsed or not (a GSI answers with its status).
    const MadHeaderView h(in.first<kMadHeaderSize>());
    sink += mad_class_name(h.mgmt_class()).size() + mad_method_name(h.method()).size();
    sink += cm_message_name(h.attribute_id()).size() + cm_private_data_size(h.attribute_id());
  }

  const CmParse p = parse_cm(in);
  if (m.ok() == false) require(!p.ok() && p.error == m.error);
  if (!p.ok()) return 0;
  require(size == kMadSize);

  std::array<uint8_t, kMadSize> copy;
  std::memcpy(copy.data(), data, kMadSize);
  {
    const MadHeaderView r = p.message.header;
    const MadHeader w(std::span<uint8_t, kMadHeaderSize>(copy.data(), kMadHeaderSize));
    HEADER_FIELDS(READ_WRITE)
  }
  std::visit(
      [&](auto r) {
        require(r.data() == data && r.header().attribute_id() == static_cast<uint16_t>(r.kAttr));
        if constexpr (requires { r.private_data(); }) touch_bytes(r.private_data());
        visit(r, copy);
      },
      p.message.view);
  // Writing back every value read must reproduce the MAD exactly.
  require(std::memcmp(copy.data(), data, kMadSize) == 0);
  return 0;
}
