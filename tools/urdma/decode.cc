// `urdma decode`: capture → capture::for_each_udp → wire::parse_packet → ICRC against the
// captured IP header (verify_icrc_raw: the exact check, since the capture shows the IP ID) →
// for MADs on QP1, wire::parse_cm. One line per packet; -v prints every field.
#include "tools/urdma/decode.h"

#include <arpa/inet.h>

#include <cinttypes>
#include <cstdio>
#include <ostream>
#include <string_view>
#include <variant>

#include "capture/capture.h"
#include "wire/cm.h"
#include "wire/icrc.h"
#include "wire/mad.h"
#include "wire/packet.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::tools {
namespace {

using namespace urdma::wire;

constexpr uint32_t kGsiQpn = 1;  // QP1: the General Services Interface, where CM MADs go

// Accumulates one output line (or, verbose, one block) of text.
class Line {
 public:
  explicit Line(bool verbose) : verbose_(verbose) {}

  // A field that appears in the one-line form and in the verbose form.
  Line& key(std::string_view name, const std::string& value) {
    if (verbose_) {
      field(name, value);
    } else {
      text_ += ' ';
      text_ += name;
      text_ += '=';
      text_ += value;
    }
    return *this;
  }
  // A field that only the verbose form shows.
  Line& field(std::string_view name, const std::string& value) {
    if (!verbose_) return *this;
    text_ += "\n    ";
    text_ += section_;
    text_ += name;
    text_ += ": ";
    text_ += value;
    return *this;
  }
  // A word of the one-line form only (the verbose form has a field for it).
  Line& word(std::string_view w) {
    if (verbose_) return *this;
    text_ += ' ';
    text_ += w;
    return *this;
  }
  // Text both forms show: the opcode name, and what is wrong with a packet.
  Line& note(std::string_view w) {
    text_ += verbose_ && !text_.empty() ? "\n    " : " ";
    text_ += w;
    return *this;
  }
  Line& section(std::string_view header_name) {
    section_ = std::string(header_name) + '.';  // prefixes the verbose field names
    return *this;
  }
  const std::string& str() const { return text_; }

 private:
  bool verbose_;
  std::string section_;
  std::string text_;
};

std::string hex(uint64_t v, int width = 0) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIx64, width, v);
  return buf;
}
std::string dec(uint64_t v) { return std::to_string(v); }

std::string gid_text(std::span<const uint8_t> gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  const bool mapped = std::all_of(gid.begin(), gid.begin() + 10, [](uint8_t b) { return b == 0; }) &&
                      gid[10] == 0xFF && gid[11] == 0xFF;
  if (mapped) {
    inet_ntop(AF_INET, gid.data() + 12, buf, sizeof buf);
    return std::string("::ffff:") + buf;
  }
  inet_ntop(AF_INET6, gid.data(), buf, sizeof buf);
  return buf;
}

std::string ip_text(int version, const uint8_t* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(version == 4 ? AF_INET : AF_INET6, addr, buf, sizeof buf);
  return buf;
}

std::string hexdump(std::span<const uint8_t> bytes) {
  std::string s;
  for (uint8_t b : bytes) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", b);
    s += buf;
  }
  return s.empty() ? "(none)" : s;
}

// The private data with trailing zero bytes left off (the wire carries no length).
std::span<const uint8_t> used_private_data(std::span<const uint8_t> pd) {
  size_t n = pd.size();
  while (n > 0 && pd[n - 1] == 0) --n;
  return pd.first(n);
}

void describe_aeth(Line& line, AethView aeth) {
  line.section("AETH");
  switch (aeth_type(aeth.syndrome())) {
    case AethType::kAck: {
      const auto credits = aeth_credit_count(aeth.credit_code());
      line.key("ack", credits ? "credits " + dec(*credits) : std::string("credits invalid"));
      break;
    }
    case AethType::kRnrNak:
      line.key("rnr_nak", "timer " + dec(aeth.rnr_timer_code()) + " (" +
                              dec(rnr_timer_ns(aeth.rnr_timer_code()) / 1000) + " us)");
      break;
    case AethType::kNak:
      line.key("nak", nak_code_name(aeth.nak_code()));
      break;
    default:
      line.key("syndrome", hex(aeth.syndrome(), 2) + " (reserved)");
      break;
  }
  line.key("msn", dec(aeth.msn())).field("syndrome", hex(aeth.syndrome(), 2));
}

void describe_headers(Line& line, const PacketView& p) {
  const BthView bth = p.bth();
  line.section("BTH");
  line.key("QP", hex(bth.dest_qp(), 6)).key("PSN", dec(bth.psn()));
  if (bth.se()) line.word("SE");
  if (bth.ack_req()) line.word("AckReq");
  line.field("opcode", hex(bth.opcode(), 2))
      .field("se", dec(bth.se()))
      .field("m", dec(bth.m()))
      .field("pad_count", dec(bth.pad_count()))
      .field("tver", dec(bth.tver()))
      .field("pkey", hex(bth.pkey(), 4))
      .field("fecn", dec(bth.fecn()))
      .field("becn", dec(bth.becn()))
      .field("ack_req", dec(bth.ack_req()));
  if (auto reth = p.reth()) {
    line.section("RETH")
        .key("va", hex(reth->va()))
        .key("rkey", hex(reth->rkey(), 8))
        .key("dma_len", dec(reth->dma_length()));
  }
  if (auto aeth = p.aeth()) describe_aeth(line, *aeth);
  if (auto deth = p.deth()) {
    line.section("DETH").key("qkey", hex(deth->qkey(), 8)).key("src_qp", hex(deth->src_qp(), 6));
  }
  if (auto imm = p.immdt()) line.section("ImmDt").key("imm", hex(imm->imm(), 8));
  if (auto ieth = p.ieth()) line.section("IETH").key("rkey", hex(ieth->rkey(), 8));
  if (auto atomic = p.atomic_eth()) {
    line.section("AtomicETH")
        .key("va", hex(atomic->va()))
        .key("rkey", hex(atomic->rkey(), 8))
        .key("swap_add", hex(atomic->swap_add()))
        .key("compare", hex(atomic->compare()));
  }
  if (auto ack = p.atomic_ack_eth()) {
    line.section("AtomicAckETH").key("orig", hex(ack->orig_data()));
  }
  if (auto feth = p.feth()) {
    line.section("FETH")
        .key("selectivity", dec(feth->selectivity_level()))
        .key("placement", dec(feth->placement_type()));
  }
}

void describe_req_path(Line& line, std::string_view name, CmReqPathView path) {
  line.section(name)
      .field("local_port_lid", hex(path.local_port_lid(), 4))
      .field("remote_port_lid", hex(path.remote_port_lid(), 4))
      .field("local_port_gid", gid_text(path.local_port_gid()))
      .field("remote_port_gid", gid_text(path.remote_port_gid()))
      .field("flow_label", hex(path.flow_label()))
      .field("packet_rate", dec(path.packet_rate()))
      .field("traffic_class", dec(path.traffic_class()))
      .field("hop_limit", dec(path.hop_limit()))
      .field("sl", dec(path.sl()))
      .field("subnet_local", dec(path.subnet_local()))
      .field("local_ack_timeout", dec(path.local_ack_timeout()));
}

void describe_service_id(Line& line, uint64_t sid) {
  std::string text = hex(sid, 16);
  if (auto rdma = decode_rdma_service_id(sid)) {
    std::string_view ps = "IB";
    if (rdma->port_space == RdmaPortSpace::kTcp) ps = "TCP";
    if (rdma->port_space == RdmaPortSpace::kUdp) ps = "UDP";
    if (rdma->port_space == RdmaPortSpace::kIpoib) ps = "IPoIB";
    text += " (rdma_cm " + std::string(ps) + " port " + dec(rdma->port) + ")";
  }
  line.key("sid", text);
}

void describe_cma_hdr(Line& line, std::span<const uint8_t> private_data) {
  const CmaHdrParse cma = parse_cma_hdr(private_data);
  if (!cma.ok()) {
    // Not every REQ comes from rdma_cm (native IB service IDs carry no cma_hdr).
    line.field("cma_hdr", std::string("none (") + std::string(cma_hdr_error_name(cma.error)) + ")");
    return;
  }
  const auto& a = cma.address;
  const int v = a.ip_version;
  const uint8_t* src = v == 4 ? a.src_addr.data() + 12 : a.src_addr.data();
  const uint8_t* dst = v == 4 ? a.dst_addr.data() + 12 : a.dst_addr.data();
  line.section("cma_hdr").key("ip", ip_text(v, src) + ":" + dec(a.src_port) + ">" + ip_text(v, dst));
}

// One CM message: the one-line summary keys and, verbose, every field.
struct CmDescriber {
  Line& line;

  void ids(uint32_t local, uint32_t remote) {
    line.key("lcid", hex(local, 8)).key("rcid", hex(remote, 8));
  }
  void private_data(std::span<const uint8_t> pd) {
    line.section("CM").field("private_data", hexdump(used_private_data(pd)));
  }

  void operator()(const CmClassPortInfoView& v) {
    line.field("base_version", dec(v.info().base_version()))
        .field("class_version", dec(v.info().class_version()))
        .field("resp_time_value", dec(v.info().resp_time_value()));
  }
  void operator()(const CmReqView& v) {
    line.key("lcid", hex(v.local_comm_id(), 8));
    describe_service_id(line, v.service_id());
    line.key("qpn", hex(v.local_qpn(), 6))
        .key("psn", dec(v.starting_psn()))
        .key("type", dec(v.transport_service_type()))
        .field("local_ca_guid", hex(v.local_ca_guid(), 16))
        .field("local_q_key", hex(v.local_q_key(), 8))
        .field("responder_resources", dec(v.responder_resources()))
        .field("initiator_depth", dec(v.initiator_depth()))
        .field("remote_cm_response_timeout", dec(v.remote_cm_response_timeout()))
        .field("end_to_end_flow_control", dec(v.end_to_end_flow_control()))
        .field("local_cm_response_timeout", dec(v.local_cm_response_timeout()))
        .field("retry_count", dec(v.retry_count()))
        .field("partition_key", hex(v.partition_key(), 4))
        .field("path_mtu", dec(v.path_packet_payload_mtu()))
        .field("rdc_exists", dec(v.rdc_exists()))
        .field("rnr_retry_count", dec(v.rnr_retry_count()))
        .field("max_cm_retries", dec(v.max_cm_retries()))
        .field("srq", dec(v.srq()))
        .field("extended_transport_type", dec(v.extended_transport_type()));
    describe_req_path(line, "primary_path", v.primary_path());
    describe_cma_hdr(line, v.private_data());
    private_data(v.private_data());
  }
  void operator()(const CmMraView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.key("mraed", dec(v.message_mraed())).key("timeout", dec(v.service_timeout()));
    private_data(v.private_data());
  }
  void operator()(const CmRejView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.key("reason", dec(v.reason()) + " (" + std::string(cm_rej_reason_name(v.reason())) + ")")
        .field("message_rejected", dec(v.message_rejected()))
        .field("ari", hexdump(v.ari()));
    private_data(v.private_data());
  }
  void operator()(const CmRepView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.key("qpn", hex(v.local_qpn(), 6))
        .key("psn", dec(v.starting_psn()))
        .field("local_q_key", hex(v.local_q_key(), 8))
        .field("responder_resources", dec(v.responder_resources()))
        .field("initiator_depth", dec(v.initiator_depth()))
        .field("target_ack_delay", dec(v.target_ack_delay()))
        .field("failover_accepted", dec(v.failover_accepted()))
        .field("end_to_end_flow_control", dec(v.end_to_end_flow_control()))
        .field("rnr_retry_count", dec(v.rnr_retry_count()))
        .field("srq", dec(v.srq()))
        .field("local_ca_guid", hex(v.local_ca_guid(), 16));
    private_data(v.private_data());
  }
  void operator()(const CmRtuView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    private_data(v.private_data());
  }
  void operator()(const CmDreqView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.key("remote_qpn", hex(v.remote_qpn_eecn(), 6));
    private_data(v.private_data());
  }
  void operator()(const CmDrepView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    private_data(v.private_data());
  }
  void operator()(const CmSidrReqView& v) {
    line.key("request_id", hex(v.request_id(), 8)).field("partition_key", hex(v.partition_key(), 4));
    describe_service_id(line, v.service_id());
    describe_cma_hdr(line, v.private_data());
    private_data(v.private_data());
  }
  void operator()(const CmSidrRepView& v) {
    line.key("request_id", hex(v.request_id(), 8))
        .key("status", dec(v.status()) + " (" + std::string(cm_sidr_status_name(v.status())) + ")")
        .key("qpn", hex(v.qpn(), 6))
        .key("qkey", hex(v.q_key(), 8));
    describe_service_id(line, v.service_id());
    private_data(v.private_data());
  }
  void operator()(const CmLapView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.note("(LAP: unsupported by urdma)");
    private_data(v.private_data());
  }
  void operator()(const CmAprView& v) {
    ids(v.local_comm_id(), v.remote_comm_id());
    line.key("ap_status", dec(v.ap_status()));
    private_data(v.private_data());
  }
};

// A MAD on QP1: the common header and, for the CM class, the message. Returns false when the
// MAD is malformed.
bool describe_mad(Line& line, std::span<const uint8_t> mad) {
  const MadParse m = parse_mad(mad);
  if (!m.ok() && m.error == MadError::kUnknownClass) {
    line.note("MAD class " + hex(mad[1], 2) + " (not decoded)");
    return true;
  }
  if (!m.ok()) {
    line.note("MALFORMED MAD: " + std::string(mad_error_name(m.error)));
    return false;
  }
  const CmParse cm = parse_cm(mad);
  if (!cm.ok()) {
    line.note("MALFORMED CM: " + std::string(mad_error_name(cm.error)));
    return false;
  }
  const MadHeaderView h = cm.message.header;
  line.section("CM").word("CM").word(cm_message_name(h.attribute_id()));
  line.field("message", std::string(cm_message_name(h.attribute_id())))
      .field("method", std::string(mad_method_name(h.method())))
      .field("class_version", dec(h.class_version()))
      .field("status", hex(h.status(), 4))
      .field("transaction_id", hex(h.transaction_id(), 16))
      .field("attribute_id", hex(h.attribute_id(), 4));
  std::visit(CmDescriber{line}, cm.message.view);
  return true;
}

}  // namespace

DecodeSummary decode_capture(const DecodeOptions& options, std::ostream& out, std::string& error) {
  DecodeSummary summary;
  error = capture::for_each_udp(options.path, [&](const capture::UdpDatagram& d) {
    if (d.dst_port != options.udp_port) return;
    ++summary.roce_packets;
    Line line(options.verbose);
    char head[160];
    const std::string src = ip_text(d.ip_version, d.ip_header.data() + (d.ip_version == 4 ? 12 : 8));
    const std::string dst =
        ip_text(d.ip_version, d.ip_header.data() + (d.ip_version == 4 ? 16 : 24));
    std::snprintf(head, sizeof head, "%5" PRIu64 "  %s:%u > %s:%u", d.index, src.c_str(),
                  unsigned{d.src_port}, dst.c_str(), unsigned{d.dst_port});
    bool bad = false;
    if (d.truncated) {
      line.note("TRUNCATED by the capture (snap length): not checked");
      ++summary.malformed;
      out << head << line.str() << '\n';
      return;
    }
    const ParseResult parsed = parse_packet(d.payload);
    if (!parsed.ok()) {
      line.note(std::string("MALFORMED: ") + parse_error_name(parsed.error()) + " (" +
                dec(d.payload.size()) + " bytes)");
      ++summary.malformed;
      out << head << line.str() << '\n';
      return;
    }
    const PacketView& p = *parsed;
    line.note(p.info().name);
    describe_headers(line, p);
    line.section("payload").key("len", dec(p.payload().size()));
    if (p.bth().dest_qp() == kGsiQpn && p.deth() && p.payload().size() == kMadSize) {
      bad |= !describe_mad(line, p.payload());
      if (bad) ++summary.malformed;
    }
    const auto want = compute_icrc(IcrcRawHeaders{d.ip_header, d.src_port, d.dst_port}, d.payload);
    const uint32_t got = icrc_of(d.payload);
    line.section("ICRC");
    if (want && *want == got) {
      line.key("icrc", "ok");
    } else {
      line.key("icrc", "BAD (carried " + hex(got, 8) + ", computed " +
                           (want ? hex(*want, 8) : std::string("none: bad IP header")) + ")");
      ++summary.icrc_failed;
    }
    out << head << line.str() << '\n';
  });
  return summary;
}

}  // namespace urdma::tools
