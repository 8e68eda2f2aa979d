#include "gsi/gmp.h"

#include <sys/uio.h>

#include "net/icrc_flow.h"
#include "net/udp_socket_io.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace urdma::gsi {

size_t build_gmp(std::span<uint8_t, kGmpBytes> out, std::span<const uint8_t, wire::kMadSize> mad,
                 uint32_t psn, const net::Endpoint& src, const net::Endpoint& dst,
                 uint32_t dest_qpn) {
  auto built = wire::build_packet(out, wire::op::kUdSendOnly, mad);
  if (!built || built->datagram.size() != kGmpBytes) return 0;
  auto bth = built->headers.bth();
  bth.set_pkey(wire::kDefaultPkey);
  bth.set_dest_qp(dest_qpn);
  bth.set_ack_req(1);  // rxe sets it on every UD packet, its MADs included
  bth.set_psn(psn & wire::kQpnMask);
  auto deth = *built->headers.deth();
  deth.set_qkey(wire::kMadGsiQKey);
  deth.set_src_qp(wire::kMadGsiQpn);
  return net::seal_icrc(built->datagram, src, dst) ? kGmpBytes : 0;
}

GmpView parse_gmp(std::span<const uint8_t> datagram) {
  const auto parsed = wire::parse_packet(datagram);
  if (!parsed) return {.error = GmpError::kNotRoce};
  if (parsed->bth().dest_qp() != wire::kMadGsiQpn) return {.error = GmpError::kNotQp1};
  if (parsed->opcode() != wire::op::kUdSendOnly || !parsed->deth())
    return {.error = GmpError::kNotUdSend};
  const auto payload = parsed->payload();
  if (payload.size() < wire::kMadSize) return {.error = GmpError::kShort};
  return {.src_qp = parsed->deth()->src_qp(),
          .qkey = parsed->deth()->qkey(),
          .mad = payload.first(wire::kMadSize)};
}

bool icrc_ok(std::span<const uint8_t> datagram, const net::Endpoint& src,
             const net::Endpoint& dst) {
  return net::icrc_ok(datagram, src, dst, wire::Ipv4DfSearch::kSetOnly);
}

std::optional<GmpView> check_gmp(std::span<const uint8_t> datagram, const net::Endpoint& src,
                                 const net::Endpoint& dst) {
  const GmpView gmp = parse_gmp(datagram);
  if (!gmp.ok() || gmp.qkey != wire::kMadGsiQKey || !icrc_ok(datagram, src, dst))
    return std::nullopt;
  return gmp;
}

net::TxStatus Sender::send(std::span<const uint8_t, wire::kMadSize> mad, net::Address src,
                           const net::Endpoint& dst, uint32_t dest_qpn) {
  if (src.is_unspecified()) {
    const auto routed = net::route_source(dst.address);
    if (!routed) return net::TxStatus::kRejected;
    src = *routed;
  }
  const uint16_t src_port = io_.source_port(net::kRoceV2UdpPort);
  std::array<uint8_t, kGmpBytes> gmp{};
  const size_t n = build_gmp(gmp, mad, psn_++, {src, src_port}, dst, dest_qpn);
  if (n == 0) return net::TxStatus::kRejected;
  const iovec iov{gmp.data(), n};
  return io_.send(net::TxDatagram{.iov = {&iov, 1}, .dst = dst, .src_port = src_port, .src = src});
}

}  // namespace urdma::gsi
