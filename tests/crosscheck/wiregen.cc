// urdma_wiregen OUT — writes OUT.pcap and OUT.json: RoCEv2 packets built by OUR wire codec, for
// wire_crosscheck_test.py to decode with code we did not write (scapy's RoCE layer, tshark's
// InfiniBand dissector).
//
// OUT.pcap holds Ethernet II + IPv4 or IPv6 + UDP (destination port 4791) + RoCEv2 frames:
//   1. every valid opcode of kOpcodeTable, with each payload length its payload rule allows out of
//      {0, 1, 3, 4, 255, 1024} (ATOMIC WRITE: its exact 8), every AETH syndrome kind on the RC
//      ACK, every header field set to a distinctive value; once over IPv4, once over IPv6;
//   2. every CM message (REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ, SIDR_REP, ClassPortInfo)
//      as a UD SEND ONLY to QP1 (DETH Q_Key 0x80010000, SrcQP 1, P_Key 0xFFFF) over IPv4, plus a
//      REQ and a SIDR_REQ over IPv6; the REQ shaped like Linux rdma_cm's on RoCEv2.
// Every ICRC is sealed with wire/icrc.h.
//
// The IP and UDP headers are what the kernel puts on urdma's datagrams: IPv4 with ID 0, DF set,
// TTL 64, TOS 0 and a UDP checksum of 0 (icrc.h explains ID 0 / DF); IPv6 with hop limit 64 and a
// real UDP checksum (RFC 8200 8.1: a UDP/IPv6 sender must compute it, and a Linux UDPv6 socket
// does unless told otherwise; tshark flags a zero one as an error).
//
// OUT.json: {"frames": [{"frame": N, "ip": 4|6, ..., "bth": {...}, "reth": {...}, ...}]}, one
// object per frame with the value we set for every header field, keyed by our accessor names
// (bth.dest_qp, reth.dma_length, ...). Byte strings (GIDs, payloads) are lowercase hex.
#include <pcap/pcap.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "wire/cm.h"
#include "wire/grh.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/mad.h"
#include "wire/opcode.h"
#include "wire/packet.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::wire {
namespace {

// Test programs keep their checks on in every build type (assert vanishes under NDEBUG).
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "urdma_wiregen: internal error: %s\n", what);
    std::abort();
  }
}

// ---------------------------------------------------------------------------------------------
// The record of one frame in OUT.json (nlohmann::json does the encoding).
class JsonObject {
 public:
  JsonObject& num(std::string_view key, uint64_t v) {
    json_[std::string(key)] = v;
    return *this;
  }
  JsonObject& str(std::string_view key, std::string_view v) {
    json_[std::string(key)] = std::string(v);
    return *this;
  }
  JsonObject& hex(std::string_view key, std::span<const uint8_t> bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s;
    for (uint8_t b : bytes) {
      s += kDigits[b >> 4];
      s += kDigits[b & 0xF];
    }
    return str(key, s);
  }
  JsonObject& obj(std::string_view key, const JsonObject& o) {
    json_[std::string(key)] = o.json_;
    return *this;
  }
  std::string text() const { return json_.dump(); }

 private:
  nlohmann::json json_ = nlohmann::json::object();
};

// Sets `field` through `view`'s setter and records the value set under the field's name.
#define WIREGEN_SET(view, json, field, value)                                                  \
  do {                                                                                         \
    const uint64_t v_ = (value);                                                               \
    (view).set_##field(                                                                        \
        static_cast<typename std::remove_cvref_t<decltype(view)>::field##_field::Value>(v_));  \
    require(uint64_t{(view).field()} == v_, #field " fits its field"); /* nothing truncated */ \
    (json).num(#field, v_);                                                                    \
  } while (0)

// Distinctive field values: a splitmix64 stream, masked to the field width, never 0.
class Values {
 public:
  explicit Values(uint64_t seed) : state_(seed) {}
  uint64_t next(unsigned bits) {
    for (;;) {
      uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      z ^= z >> 31;
      const uint64_t v = bits == 64 ? z : z & ((uint64_t{1} << bits) - 1);
      if (v != 0) return v;
    }
  }

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------------------------
// Addresses and the Ethernet / IP / UDP envelope.

constexpr std::array<uint8_t, 6> kDstMac = {0x02, 0x00, 0x5E, 0x00, 0x00, 0x02};
constexpr std::array<uint8_t, 6> kSrcMac = {0x02, 0x00, 0x5E, 0x00, 0x00, 0x01};
constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeIpv6 = 0x86DD;
constexpr size_t kEthernetHeaderBytes = 14;
constexpr size_t kUdpHeaderBytes = 8;
constexpr size_t kIpv6HeaderBytes = 40;  // the GRH layout is the IPv6 fixed header (grh.h)
constexpr uint8_t kTtl = 64;             // Linux ip_default_ttl / IPv6 hop limit default
// IPv4 documentation addresses (RFC 5737) and IPv6 ones (RFC 3849).
constexpr std::array<uint8_t, 4> kSrcIpv4 = {192, 0, 2, 1};
constexpr std::array<uint8_t, 4> kDstIpv4 = {192, 0, 2, 2};
constexpr std::array<uint8_t, 16> kSrcIpv6 = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
                                              0,    0,    0,    0,    0, 0, 0, 0x01};
constexpr std::array<uint8_t, 16> kDstIpv6 = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
                                              0,    0,    0,    0,    0, 0, 0, 0x02};
// The flow label a Linux UDPv6 socket derives from the flow hash (net.ipv6.auto_flowlabels);
// masked out of the ICRC, so any value must verify.
constexpr uint32_t kIpv6FlowLabel = 0x5A3C1;

enum class Ip { k4 = 4, k6 = 6 };

// RFC 1071 one's-complement sum of `bytes` (big-endian 16-bit words, odd tail zero-padded).
uint32_t ones_sum(std::span<const uint8_t> bytes, uint32_t sum = 0) {
  size_t i = 0;
  for (; i + 1 < bytes.size(); i += 2) sum += load_be16(bytes.data() + i);
  if (i < bytes.size()) sum += uint32_t{bytes[i]} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return sum;
}

// The UDP checksum over IPv6 (RFC 8200 8.1 pseudo-header; RFC 768: a computed 0 is sent as
// 0xFFFF). `udp` is the UDP header (checksum field 0) and payload.
uint16_t udp6_checksum(std::span<const uint8_t> udp) {
  std::array<uint8_t, 40> pseudo{};
  std::copy(kSrcIpv6.begin(), kSrcIpv6.end(), pseudo.begin());
  std::copy(kDstIpv6.begin(), kDstIpv6.end(), pseudo.begin() + 16);
  store_be32(pseudo.data() + 32, static_cast<uint32_t>(udp.size()));
  pseudo[39] = kIpProtoUdp;
  const uint16_t sum = static_cast<uint16_t>(~ones_sum(udp, ones_sum(pseudo)));
  return sum == 0 ? 0xFFFF : sum;
}

// Seals the ICRC of `udp_payload` for the datagram it will travel in and returns the whole
// Ethernet frame. Records the envelope in `rec`.
std::vector<uint8_t> encapsulate(Ip ip, uint16_t udp_src_port, std::span<uint8_t> udp_payload,
                                 JsonObject& rec) {
  if (ip == Ip::k4) {
    IcrcIpv4 icrc;  // ID 0, DF: what the kernel emits for urdma (icrc.h)
    icrc.flow.src_addr = kSrcIpv4;
    icrc.flow.dst_addr = kDstIpv4;
    icrc.flow.udp_src_port = udp_src_port;
    seal_icrc(icrc, udp_payload);
  } else {
    IcrcIpv6 icrc;
    icrc.src_addr = kSrcIpv6;
    icrc.dst_addr = kDstIpv6;
    icrc.udp_src_port = udp_src_port;
    seal_icrc(icrc, udp_payload);
  }

  const size_t ip_bytes = ip == Ip::k4 ? Ipv4Header::kSize : kIpv6HeaderBytes;
  const size_t udp_bytes = kUdpHeaderBytes + udp_payload.size();
  std::vector<uint8_t> frame(kEthernetHeaderBytes + ip_bytes + udp_bytes);
  std::copy(kDstMac.begin(), kDstMac.end(), frame.begin());
  std::copy(kSrcMac.begin(), kSrcMac.end(), frame.begin() + 6);
  store_be16(frame.data() + 12, ip == Ip::k4 ? kEtherTypeIpv4 : kEtherTypeIpv6);

  uint8_t* l3 = frame.data() + kEthernetHeaderBytes;
  uint8_t* udp = l3 + ip_bytes;
  store_be16(udp + 0, udp_src_port);
  store_be16(udp + 2, kRoceV2UdpPort);
  store_be16(udp + 4, static_cast<uint16_t>(udp_bytes));
  std::copy(udp_payload.begin(), udp_payload.end(), udp + kUdpHeaderBytes);

  uint16_t udp_checksum = 0;  // IPv4: none (RFC 768), as Linux rxe and urdma send
  if (ip == Ip::k4) {
    const Ipv4Header h(l3);
    h.set_version(4);
    h.set_ihl(5);
    h.set_total_length(static_cast<uint16_t>(ip_bytes + udp_bytes));
    h.set_id(0);
    h.set_flags(kIpv4FlagDontFragment);
    h.set_ttl(kTtl);
    h.set_protocol(kIpProtoUdp);
    h.set_saddr(load_be32(kSrcIpv4.data()));
    h.set_daddr(load_be32(kDstIpv4.data()));
    h.set_checksum(ipv4_header_checksum(std::span<const uint8_t, 20>(l3, 20)));
  } else {
    const Grh h(l3);
    h.set_ip_ver(6);
    h.set_tclass(0);
    h.set_flow_label(kIpv6FlowLabel);
    h.set_paylen(static_cast<uint16_t>(udp_bytes));
    h.set_next_hdr(kIpProtoUdp);
    h.set_hop_limit(kTtl);
    h.set_sgid(kSrcIpv6);
    h.set_dgid(kDstIpv6);
    udp_checksum = udp6_checksum(std::span<const uint8_t>(udp, udp_bytes));
    store_be16(udp + 6, udp_checksum);
  }

  rec.num("ip", static_cast<uint64_t>(ip));
  JsonObject l3json;
  if (ip == Ip::k4) {
    l3json.num("id", 0).num("df", 1).num("ttl", kTtl).num("tos", 0);
  } else {
    l3json.num("hop_limit", kTtl).num("tclass", 0).num("flow_label", kIpv6FlowLabel);
  }
  rec.obj("ip_header", l3json);
  rec.obj("udp", JsonObject()
                     .num("src_port", udp_src_port)
                     .num("dst_port", kRoceV2UdpPort)
                     .num("length", udp_bytes)
                     .num("checksum", udp_checksum));
  // The ICRC as its four wire bytes read big-endian, as tshark and scapy print it (icrc.h: the
  // CRC-32 value goes on the wire least significant byte first).
  rec.num("icrc", load_be32(udp_payload.data() + udp_payload.size() - kIcrcBytes));
  return frame;
}

// ---------------------------------------------------------------------------------------------
// Transport packets: every opcode.

// The AETH syndromes every RC ACK is sent with: ACK with a credit count and with the "invalid"
// credit code, RNR NAK, and each NAK code (IBA 9.3.5).
struct AethCase {
  uint8_t syndrome;
  const char* what;
};
constexpr AethCase kAckSyndromes[] = {
    {make_ack(0x0A), "ACK, 48 credits"},
    {make_ack(kAethCreditsInvalid), "ACK, credits invalid"},
    {make_rnr_nak(0x12), "RNR NAK, 5.12 ms"},
    {make_nak(NakCode::kPsnSequenceError), "NAK PSN sequence error"},
    {make_nak(NakCode::kInvalidRequest), "NAK invalid request"},
    {make_nak(NakCode::kRemoteAccessError), "NAK remote access error"},
    {make_nak(NakCode::kRemoteOperationalError), "NAK remote operational error"},
    {make_nak(NakCode::kInvalidRdRequest), "NAK invalid RD request"},
};
// Read responses and atomic ACKs carry an ACK syndrome (IBA 9.7.5.1.x): a few credit codes.
constexpr uint8_t kResponseCreditCodes[] = {0x01, 0x0E, 0x1E, kAethCreditsInvalid};

// PSNs at the edges of the 24-bit space go first; the rest are drawn from `Values`.
constexpr uint32_t kEdgePsns[] = {0xFFFFFF, 0x000001, 0x800000, 0x7FFFFF};

constexpr size_t kPayloadLengths[] = {0, 1, 3, 4, 255, 1024};

struct Generator {
  pcap_dumper_t* dumper = nullptr;
  std::string frames_json;
  uint32_t frame_count = 0;
  Values values{0x75726D612D776972ULL};  // "urma-wir"
  uint32_t psn_index = 0;

  void emit(Ip ip, std::span<uint8_t> udp_payload, JsonObject& rec) {
    rec.num("frame", frame_count + 1);
    const uint16_t src_port = static_cast<uint16_t>(0xC000 | values.next(14));
    const std::vector<uint8_t> frame = encapsulate(ip, src_port, udp_payload, rec);
    pcap_pkthdr hdr{};
    hdr.ts.tv_sec = 1700000000 + frame_count / 1000;
    hdr.ts.tv_usec = (frame_count % 1000) * 1000;
    hdr.caplen = hdr.len = static_cast<bpf_u_int32>(frame.size());
    pcap_dump(reinterpret_cast<u_char*>(dumper), &hdr, frame.data());
    if (frame_count != 0) frames_json += ",\n";
    frames_json += "  " + rec.text();
    ++frame_count;
  }

  uint32_t next_psn() {
    const uint32_t i = psn_index++;
    return i < std::size(kEdgePsns) ? kEdgePsns[i] : static_cast<uint32_t>(values.next(24));
  }

  // Sets the BTH fields the builder leaves at 0 (SE, M, P_Key, FECN/BECN, DestQP, AckReq, PSN).
  void fill_bth(const Bth& bth, JsonObject& rec) {
    JsonObject j;
    j.num("opcode", bth.opcode());
    const unsigned n = frame_count;
    WIREGEN_SET(bth, j, se, n % 2);
    WIREGEN_SET(bth, j, m, (n / 2) % 2);
    j.num("pad_count", bth.pad_count());
    j.num("tver", bth.tver());
    WIREGEN_SET(bth, j, pkey, n % 5 == 0 ? kDefaultPkey : values.next(16));
    // FECN/BECN are masked out of the ICRC: setting them checks scapy agrees on the mask.
    WIREGEN_SET(bth, j, fecn, (n / 3) % 2);
    WIREGEN_SET(bth, j, becn, (n / 5) % 2);
    WIREGEN_SET(bth, j, dest_qp, values.next(24));
    WIREGEN_SET(bth, j, ack_req, (n + 1) % 2);
    WIREGEN_SET(bth, j, psn, next_psn());
    rec.obj("bth", j);
  }

  void fill_ext(const PacketHeaders& h, uint8_t syndrome, JsonObject& rec) {
    if (auto xrceth = h.xrceth()) {
      JsonObject j;
      WIREGEN_SET(*xrceth, j, xrc_srq, values.next(24));
      rec.obj("xrceth", j);
    }
    if (auto reth = h.reth()) {
      JsonObject j;
      WIREGEN_SET(*reth, j, va, values.next(64));
      WIREGEN_SET(*reth, j, rkey, values.next(32));
      WIREGEN_SET(*reth, j, dma_length, values.next(32));
      rec.obj("reth", j);
    }
    if (auto aeth = h.aeth()) {
      JsonObject j;
      WIREGEN_SET(*aeth, j, syndrome, syndrome);
      j.num("type", static_cast<uint8_t>(aeth->type())).num("value", aeth->syndrome_value());
      WIREGEN_SET(*aeth, j, msn, values.next(24));
      rec.obj("aeth", j);
    }
    if (auto deth = h.deth()) {
      JsonObject j;
      WIREGEN_SET(*deth, j, qkey, values.next(32));
      WIREGEN_SET(*deth, j, src_qp, values.next(24));
      rec.obj("deth", j);
    }
    if (auto immdt = h.immdt()) {
      JsonObject j;
      WIREGEN_SET(*immdt, j, imm, values.next(32));
      rec.obj("immdt", j);
    }
    if (auto ieth = h.ieth()) {
      JsonObject j;
      WIREGEN_SET(*ieth, j, rkey, values.next(32));
      rec.obj("ieth", j);
    }
    if (auto atomic = h.atomic_eth()) {
      JsonObject j;
      WIREGEN_SET(*atomic, j, va, values.next(61) << 3);  // IBA 9.4.5: 8-byte aligned
      WIREGEN_SET(*atomic, j, rkey, values.next(32));
      WIREGEN_SET(*atomic, j, swap_add, values.next(64));
      WIREGEN_SET(*atomic, j, compare, values.next(64));
      rec.obj("atomiceth", j);
    }
    if (auto ack = h.atomic_ack_eth()) {
      JsonObject j;
      WIREGEN_SET(*ack, j, orig_data, values.next(64));
      rec.obj("atomicacketh", j);
    }
    if (auto feth = h.feth()) {
      JsonObject j;
      WIREGEN_SET(*feth, j, selectivity_level,
                  static_cast<uint8_t>(FlushSelectivity::kMemoryRegion));
      WIREGEN_SET(*feth, j, placement_type,
                  kFlushPlacementGlobalVisibility | kFlushPlacementPersistence);
      rec.obj("feth", j);
    }
  }

  void transport_packet(Ip ip, uint8_t opcode, size_t payload_len, uint8_t syndrome) {
    std::vector<uint8_t> payload(payload_len);
    for (size_t i = 0; i < payload_len; ++i)
      payload[i] = static_cast<uint8_t>(0x3C + i * 0x1D + frame_count);
    std::vector<uint8_t> buf(2048);
    const std::optional<BuiltPacket> built = build_packet(buf, opcode, payload);
    require(built.has_value(), "build_packet accepts the opcode and length");
    JsonObject rec;
    rec.str("kind", "transport").str("name", opcode_info(opcode).name);
    rec.num("payload_length", payload_len).hex("payload", payload);
    const Bth bth = built->headers.bth();
    if (opcode == op::kCnp) {
      // RoCEv2 annex A17.9.2: a CNP sets BECN and carries only the P_Key and DestQP; the rest of
      // the BTH and its 16 trailing bytes are reserved (0).
      JsonObject j;
      j.num("opcode", opcode);
      WIREGEN_SET(bth, j, pkey, values.next(16));
      WIREGEN_SET(bth, j, becn, 1);
      WIREGEN_SET(bth, j, dest_qp, values.next(24));
      j.num("se", 0).num("m", 0).num("pad_count", 0).num("tver", 0).num("fecn", 0);
      j.num("ack_req", 0).num("psn", 0);
      rec.obj("bth", j);
    } else {
      fill_bth(bth, rec);
      fill_ext(built->headers, syndrome, rec);
    }
    emit(ip, built->datagram, rec);
  }

  void all_opcodes(Ip ip) {
    for (const OpcodeInfo& info : kOpcodeTable) {
      if (!info.valid) continue;
      if (info.is(kAck)) {
        for (const AethCase& c : kAckSyndromes) transport_packet(ip, info.opcode, 0, c.syndrome);
        continue;
      }
      std::vector<size_t> lengths;
      if (info.exact_payload != 0) {
        lengths.push_back(info.exact_payload);
      } else {
        for (size_t n : kPayloadLengths)
          if (packet_layout(info.opcode, n)) lengths.push_back(n);
      }
      require(!lengths.empty(), "every opcode has a permitted payload length");
      for (size_t i = 0; i < lengths.size(); ++i) {
        const uint8_t syndrome =
            make_ack(kResponseCreditCodes[i % std::size(kResponseCreditCodes)]);
        transport_packet(ip, info.opcode, lengths[i], syndrome);
      }
    }
  }

  // -------------------------------------------------------------------------------------------
  // CM MADs on QP1.

  void mad_packet(Ip ip, std::span<const uint8_t, kMadSize> mad, JsonObject& cm) {
    std::vector<uint8_t> buf(2048);
    const std::optional<BuiltPacket> built = build_packet(buf, op::kUdSendOnly, mad);
    require(built.has_value(), "build_packet accepts the opcode and length");
    const Bth bth = built->headers.bth();
    JsonObject j;
    j.num("opcode", op::kUdSendOnly);
    // Linux ib_mad on rxe: SE 0, M 0, AckReq 1 (rxe sets it on every UD packet), P_Key default.
    WIREGEN_SET(bth, j, se, 0);
    WIREGEN_SET(bth, j, m, 0);
    j.num("pad_count", 0).num("tver", 0);
    WIREGEN_SET(bth, j, pkey, kDefaultPkey);
    WIREGEN_SET(bth, j, fecn, 0);
    WIREGEN_SET(bth, j, becn, 0);
    WIREGEN_SET(bth, j, dest_qp, kMadGsiQpn);
    WIREGEN_SET(bth, j, ack_req, 1);
    WIREGEN_SET(bth, j, psn, values.next(24));
    JsonObject d;
    const Deth deth = *built->headers.deth();
    WIREGEN_SET(deth, d, qkey, kMadGsiQKey);
    WIREGEN_SET(deth, d, src_qp, kMadGsiQpn);
    JsonObject rec;
    rec.str("kind", "cm").str("name", "UD Send Only").num("payload_length", kMadSize);
    rec.obj("bth", j).obj("deth", d).obj("cm", cm);
    emit(ip, built->datagram, rec);
  }

  // Records the common MAD header of `view`'s message.
  template <typename View>
  JsonObject mad_header(const View& view, std::string_view message) {
    const MadHeaderView h = view.header();
    JsonObject j;
    j.str("message", message)
        .num("base_version", h.base_version())
        .num("mgmt_class", h.mgmt_class())
        .num("class_version", h.class_version())
        .num("method", h.method())
        .num("status", h.status())
        .num("transaction_id", h.transaction_id())
        .num("attribute_id", h.attribute_id())
        .num("attribute_modifier", h.attribute_modifier());
    return j;
  }

  uint64_t next_tid() { return values.next(64); }

  // A private-data area: `prefix` (e.g. a cma_hdr), then a distinctive pattern up to `used`
  // bytes, zero after (IBA 12.6: unused private data is zero).
  template <typename View>
  void fill_private_data(const View& view, JsonObject& j, size_t used,
                         std::span<const uint8_t> prefix = {}) {
    std::vector<uint8_t> data(prefix.begin(), prefix.end());
    while (data.size() < used) data.push_back(static_cast<uint8_t>(0xD0 ^ (data.size() * 3)));
    const MadError e = view.set_private_data(data);
    require(e == MadError::kOk, "CM field fits its area");
    j.hex("private_data", view.private_data());
  }

  void fill_path(const CmReqPath& path, JsonObject& j, const Gid& local, const Gid& remote,
                 bool linux_like) {
    WIREGEN_SET(path, j, local_port_lid, linux_like ? kCmPermissiveLid : values.next(16));
    WIREGEN_SET(path, j, remote_port_lid, linux_like ? kCmPermissiveLid : values.next(16));
    path.set_local_port_gid(local);
    path.set_remote_port_gid(remote);
    j.hex("local_port_gid", local).hex("remote_port_gid", remote);
    WIREGEN_SET(path, j, flow_label, values.next(20));
    WIREGEN_SET(path, j, packet_rate, values.next(6));
    WIREGEN_SET(path, j, traffic_class, values.next(8));
    WIREGEN_SET(path, j, hop_limit, linux_like ? kTtl : values.next(8));
    WIREGEN_SET(path, j, sl, values.next(4));
    WIREGEN_SET(path, j, subnet_local, 1);
    WIREGEN_SET(path, j, local_ack_timeout, linux_like ? 19 : values.next(5));
  }

  void fill_class_port_info(const ClassPortInfo& info, JsonObject& j) {
    WIREGEN_SET(info, j, base_version, kMadBaseVersion);
    WIREGEN_SET(info, j, class_version, kCmClassVersion);
    WIREGEN_SET(info, j, capability_mask, values.next(16));
    WIREGEN_SET(info, j, capability_mask2, values.next(27));
    WIREGEN_SET(info, j, resp_time_value, values.next(5));
    Gid gid;
    for (uint8_t& b : gid) b = static_cast<uint8_t>(values.next(8));
    info.set_redirect_gid(gid);
    j.hex("redirect_gid", gid);
    WIREGEN_SET(info, j, redirect_tc, values.next(8));
    WIREGEN_SET(info, j, redirect_sl, values.next(4));
    WIREGEN_SET(info, j, redirect_fl, values.next(20));
    WIREGEN_SET(info, j, redirect_lid, values.next(16));
    WIREGEN_SET(info, j, redirect_p_key, values.next(16));
    WIREGEN_SET(info, j, redirect_qp, values.next(24));
    WIREGEN_SET(info, j, redirect_q_key, values.next(32));
    for (uint8_t& b : gid) b = static_cast<uint8_t>(values.next(8));
    info.set_trap_gid(gid);
    j.hex("trap_gid", gid);
    WIREGEN_SET(info, j, trap_tc, values.next(8));
    WIREGEN_SET(info, j, trap_sl, values.next(4));
    WIREGEN_SET(info, j, trap_fl, values.next(20));
    WIREGEN_SET(info, j, trap_lid, values.next(16));
    WIREGEN_SET(info, j, trap_p_key, values.next(16));
    WIREGEN_SET(info, j, trap_hl, values.next(8));
    WIREGEN_SET(info, j, trap_qp, values.next(24));
    WIREGEN_SET(info, j, trap_q_key, values.next(32));
  }

  // The rdma_cm IP header for the REQ / SIDR_REQ private data.
  static CmaAddress cma_address(Ip ip, uint16_t src_port) {
    CmaAddress a;
    a.src_port = src_port;
    if (ip == Ip::k4) {
      a.ip_version = kCmaIpVersion4;
      a.src_addr = ipv4_mapped(kSrcIpv4);
      a.dst_addr = ipv4_mapped(kDstIpv4);
    } else {
      a.ip_version = kCmaIpVersion6;
      a.src_addr = kSrcIpv6;
      a.dst_addr = kDstIpv6;
    }
    return a;
  }
  static JsonObject cma_json(const CmaAddress& a) {
    JsonObject j;
    j.num("ip_version", a.ip_version).num("src_port", a.src_port);
    j.hex("src_addr", a.src_addr).hex("dst_addr", a.dst_addr);
    return j;
  }

  void cm_req(Ip ip) {
    std::array<uint8_t, kMadSize> mad{};
    const CmReq m = init_cm_message<CmReq>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, service_id,
                rdma_service_id(RdmaPortSpace::kTcp, static_cast<uint16_t>(values.next(16))));
    WIREGEN_SET(m, f, local_ca_guid, values.next(64));
    WIREGEN_SET(m, f, local_q_key, values.next(32));
    WIREGEN_SET(m, f, local_qpn, values.next(24));
    WIREGEN_SET(m, f, responder_resources, values.next(8));
    WIREGEN_SET(m, f, local_eecn, values.next(24));
    WIREGEN_SET(m, f, initiator_depth, values.next(8));
    WIREGEN_SET(m, f, remote_eecn, values.next(24));
    WIREGEN_SET(m, f, remote_cm_response_timeout, values.next(5));
    WIREGEN_SET(m, f, transport_service_type, static_cast<uint8_t>(CmTransportType::kUc));
    WIREGEN_SET(m, f, end_to_end_flow_control, 1);
    WIREGEN_SET(m, f, starting_psn, values.next(24));
    WIREGEN_SET(m, f, local_cm_response_timeout, values.next(5));
    WIREGEN_SET(m, f, retry_count, values.next(3));
    WIREGEN_SET(m, f, partition_key, kDefaultPkey);
    WIREGEN_SET(m, f, path_packet_payload_mtu, 3);  // IBA 9.7.6.2: 3 = 1024 bytes
    WIREGEN_SET(m, f, rdc_exists, 1);
    WIREGEN_SET(m, f, rnr_retry_count, values.next(3));
    WIREGEN_SET(m, f, max_cm_retries, values.next(4));
    WIREGEN_SET(m, f, srq, 1);
    WIREGEN_SET(m, f, extended_transport_type, 0);  // non-zero only with service type Extended
    WIREGEN_SET(m, f, sap_supported, 1);
    // The primary path as Linux rdma_cm fills it on RoCE: LIDs 0xFFFF, GIDs = IP addresses
    // (IPv4-mapped), hop limit 64, local ACK timeout 19. The alternate path gets other values.
    JsonObject primary;
    JsonObject alternate;
    const Gid local = ip == Ip::k4 ? ipv4_mapped(kSrcIpv4) : kSrcIpv6;
    const Gid remote = ip == Ip::k4 ? ipv4_mapped(kDstIpv4) : kDstIpv6;
    fill_path(m.primary_path(), primary, local, remote, true);
    fill_path(m.alternate_path(), alternate, kDstIpv6, kSrcIpv6, false);
    const CmaAddress cma = cma_address(ip, static_cast<uint16_t>(values.next(16)));
    std::array<uint8_t, kCmaHdrSize> hdr{};
    write_cma_hdr(hdr, cma);
    fill_private_data(m, f, 56, hdr);
    JsonObject cm = mad_header(m, "REQ");
    cm.obj("fields", f).obj("primary_path", primary).obj("alternate_path", alternate);
    cm.obj("cma", cma_json(cma));
    mad_packet(ip, mad, cm);
  }

  void cm_rep() {
    std::array<uint8_t, kMadSize> mad{};
    const CmRep m = init_cm_message<CmRep>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_comm_id, values.next(32));
    WIREGEN_SET(m, f, local_q_key, values.next(32));
    WIREGEN_SET(m, f, local_qpn, values.next(24));
    WIREGEN_SET(m, f, local_eecn, values.next(24));
    WIREGEN_SET(m, f, starting_psn, values.next(24));
    WIREGEN_SET(m, f, responder_resources, values.next(8));
    WIREGEN_SET(m, f, initiator_depth, values.next(8));
    WIREGEN_SET(m, f, target_ack_delay, values.next(5));
    WIREGEN_SET(m, f, failover_accepted, static_cast<uint8_t>(CmFailover::kNotSupported));
    WIREGEN_SET(m, f, end_to_end_flow_control, 1);
    WIREGEN_SET(m, f, rnr_retry_count, values.next(3));
    WIREGEN_SET(m, f, srq, 1);
    WIREGEN_SET(m, f, local_ca_guid, values.next(64));
    fill_private_data(m, f, 40);
    JsonObject cm = mad_header(m, "REP");
    mad_packet(Ip::k4, mad, cm.obj("fields", f));
  }

  // RTU, DREP: the two communication IDs and private data.
  template <typename View>
  void cm_ids_only(std::string_view name) {
    std::array<uint8_t, kMadSize> mad{};
    const View m = init_cm_message<View>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_comm_id, values.next(32));
    fill_private_data(m, f, 24);
    JsonObject cm = mad_header(m, name);
    mad_packet(Ip::k4, mad, cm.obj("fields", f));
  }

  void cm_rej() {
    std::array<uint8_t, kMadSize> mad{};
    const CmRej m = init_cm_message<CmRej>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_comm_id, values.next(32));
    WIREGEN_SET(m, f, message_rejected, static_cast<uint8_t>(CmRejMessage::kRep));
    WIREGEN_SET(m, f, reason, static_cast<uint16_t>(CmRejReason::kConsumerDefined));
    const std::array<uint8_t, 5> ari = {0xA1, 0xA2, 0xA3, 0xA4, 0xA5};
    const MadError e = m.set_ari(ari);
    require(e == MadError::kOk, "CM field fits its area");
    f.num("reject_info_length", m.reject_info_length()).hex("ari", ari);
    fill_private_data(m, f, 32);
    JsonObject cm = mad_header(m, "REJ");
    mad_packet(Ip::k4, mad, cm.obj("fields", f));
  }

  void cm_mra() {
    std::array<uint8_t, kMadSize> mad{};
    const CmMra m = init_cm_message<CmMra>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_comm_id, values.next(32));
    WIREGEN_SET(m, f, message_mraed, static_cast<uint8_t>(CmMraMessage::kLap));
    WIREGEN_SET(m, f, service_timeout, values.next(5));
    fill_private_data(m, f, 20);
    JsonObject cm = mad_header(m, "MRA");
    mad_packet(Ip::k4, mad, cm.obj("fields", f));
  }

  void cm_dreq() {
    std::array<uint8_t, kMadSize> mad{};
    const CmDreq m = init_cm_message<CmDreq>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, local_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_comm_id, values.next(32));
    WIREGEN_SET(m, f, remote_qpn_eecn, values.next(24));
    fill_private_data(m, f, 16);
    JsonObject cm = mad_header(m, "DREQ");
    mad_packet(Ip::k4, mad, cm.obj("fields", f));
  }

  void cm_sidr_req(Ip ip) {
    std::array<uint8_t, kMadSize> mad{};
    const CmSidrReq m = init_cm_message<CmSidrReq>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, request_id, values.next(32));
    WIREGEN_SET(m, f, partition_key, kDefaultPkey);
    WIREGEN_SET(m, f, service_id,
                rdma_service_id(RdmaPortSpace::kUdp, static_cast<uint16_t>(values.next(16))));
    const CmaAddress cma = cma_address(ip, static_cast<uint16_t>(values.next(16)));
    std::array<uint8_t, kCmaHdrSize> hdr{};
    write_cma_hdr(hdr, cma);
    fill_private_data(m, f, 48, hdr);
    JsonObject cm = mad_header(m, "SIDR_REQ");
    cm.obj("fields", f).obj("cma", cma_json(cma));
    mad_packet(ip, mad, cm);
  }

  void cm_sidr_rep() {
    std::array<uint8_t, kMadSize> mad{};
    const CmSidrRep m = init_cm_message<CmSidrRep>(mad, next_tid());
    JsonObject f;
    WIREGEN_SET(m, f, request_id, values.next(32));
    WIREGEN_SET(m, f, status, static_cast<uint8_t>(CmSidrStatus::kRedirect));
    WIREGEN_SET(m, f, qpn, values.next(24));
    WIREGEN_SET(m, f, service_id,
                rdma_service_id(RdmaPortSpace::kUdp, static_cast<uint16_t>(values.next(16))));
    WIREGEN_SET(m, f, q_key, values.next(32));
    // Status Redirect: the additional information is a ClassPortInfo (IBA 12.11).
    const MadError e = m.set_additional_information(std::array<uint8_t, ClassPortInfo::kSize>{});
    require(e == MadError::kOk, "CM field fits its area");
    f.num("additional_information_length", m.additional_information_length());
    JsonObject cpi;
    fill_class_port_info(m.class_port_info(), cpi);
    fill_private_data(m, f, 28);
    JsonObject cm = mad_header(m, "SIDR_REP");
    mad_packet(Ip::k4, mad, cm.obj("fields", f).obj("class_port_info", cpi));
  }

  void cm_class_port_info() {
    std::array<uint8_t, kMadSize> mad{};
    const CmClassPortInfo m = init_cm_message<CmClassPortInfo>(mad, next_tid());
    // The answer to a Get (IBA 13.4.8.1): method GetResp carries the attribute.
    m.header().set_method(static_cast<uint8_t>(MadMethod::kGetResp));
    JsonObject cpi;
    fill_class_port_info(m.info(), cpi);
    JsonObject cm = mad_header(m, "ClassPortInfo");
    mad_packet(Ip::k4, mad, cm.obj("class_port_info", cpi));
  }

  void all_cm() {
    cm_req(Ip::k4);
    cm_rep();
    cm_ids_only<CmRtu>("RTU");
    cm_rej();
    cm_mra();
    cm_dreq();
    cm_ids_only<CmDrep>("DREP");
    cm_sidr_req(Ip::k4);
    cm_sidr_rep();
    cm_class_port_info();
    cm_req(Ip::k6);
    cm_sidr_req(Ip::k6);
  }
};

#undef WIREGEN_SET

}  // namespace
}  // namespace urdma::wire

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: urdma_wiregen OUT   (writes OUT.pcap and OUT.json)\n");
    return 2;
  }
  const std::string out = argv[1];
  constexpr int kSnapLen = 65535;
  pcap_t* dead = pcap_open_dead(DLT_EN10MB, kSnapLen);
  pcap_dumper_t* dumper = dead ? pcap_dump_open(dead, (out + ".pcap").c_str()) : nullptr;
  if (!dumper) {
    std::fprintf(stderr, "urdma_wiregen: cannot write %s.pcap: %s\n", out.c_str(),
                 dead ? pcap_geterr(dead) : "pcap_open_dead failed");
    return 1;
  }
  urdma::wire::Generator gen;
  gen.dumper = dumper;
  gen.all_opcodes(urdma::wire::Ip::k4);
  gen.all_opcodes(urdma::wire::Ip::k6);
  gen.all_cm();
  pcap_dump_close(dumper);
  pcap_close(dead);

  std::ofstream json(out + ".json");
  json << "{\"frames\": [\n" << gen.frames_json << "\n]}\n";
  if (!json.flush()) {
    std::fprintf(stderr, "urdma_wiregen: cannot write %s.json\n", out.c_str());
    return 1;
  }
  std::printf("urdma_wiregen: %u frames\n", gen.frame_count);
  return 0;
}
