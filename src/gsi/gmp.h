// QP1's datagrams: a GMP (General Services Management Packet, IBA 13.5.1) is one MAD in a UD
// SEND Only to QP1 — BTH, DETH, the 256-byte MAD, ICRC (RoCEv2: IBA annex A17). This is the one
// place GMPs are built, sealed, checked and sent; urdmad (its router and CM agent), librdmacm and
// the tests use it, and none of them lays out a GMP's headers or its ICRC's pseudo-header itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "net/address.h"
#include "net/packet_io.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/mad.h"

namespace urdma::gsi {

// A GMP's UDP payload: BTH, DETH, the MAD, ICRC.
inline constexpr size_t kGmpBytes =
    wire::Bth::kSize + wire::Deth::kSize + wire::kMadSize + wire::kIcrcBytes;
static_assert(kGmpBytes == 280);

// The GMP carrying `mad` to QP `dest_qpn` as rxe lays out its MADs (P_Key 0xFFFF, AckReq set,
// Q_Key 0x80010000, SrcQP 1), with `psn` (its low 24 bits), the ICRC sealed for the UDP flow from
// `src` to `dst` (net::seal_icrc: IPv4 with ID 0 and DF set, what the kernel sends from an
// unconnected socket). Returns kGmpBytes, or 0 (nothing sealed) when `src` and `dst` are of two
// families.
size_t build_gmp(std::span<uint8_t, kGmpBytes> out, std::span<const uint8_t, wire::kMadSize> mad,
                 uint32_t psn, const net::Endpoint& src, const net::Endpoint& dst,
                 uint32_t dest_qpn = wire::kMadGsiQpn);

// Why a datagram is not a GMP, in the order parse_gmp looks.
enum class GmpError : uint8_t {
  kNone = 0,
  kNotRoce,    // wire::parse_packet rejected it
  kNotQp1,     // not to QP1
  kNotUdSend,  // to QP1 but not a UD SEND Only (IBA 13.5.1: MADs travel as UD SENDs)
  kShort,      // its payload is shorter than a MAD
};

// What a datagram says as a GMP, from its bytes alone (the ICRC is not looked at).
struct GmpView {
  GmpError error = GmpError::kNone;
  uint32_t src_qp = 0;  // DETH
  uint32_t qkey = 0;    // DETH
  std::span<const uint8_t> mad;  // the payload's first kMadSize bytes; empty on an error
  bool ok() const { return error == GmpError::kNone; }
};
GmpView parse_gmp(std::span<const uint8_t> datagram);

// Whether a datagram's ICRC holds for the flow it came on (from `src` to `dst`), as a receiver
// that does not see the IP header checks it: any IPv4 ID, DF set (net::icrc_ok).
bool icrc_ok(std::span<const uint8_t> datagram, const net::Endpoint& src,
             const net::Endpoint& dst);

// A received GMP a CM takes: parse_gmp finds no error, the GSI Q_Key, its ICRC right for the
// flow it came on. nullopt otherwise.
std::optional<GmpView> check_gmp(std::span<const uint8_t> datagram, const net::Endpoint& src,
                                 const net::Endpoint& dst);

// One sender of GMPs on a PacketIo (urdmad's slot 0, a process's slot socket): each GMP takes the
// next PSN and leaves from the I/O's own port (PacketIo::source_port), its ICRC sealed for that
// port. Not thread-safe: one owner, or one lock, per sender.
class Sender {
 public:
  Sender(net::PacketIo& io, uint32_t first_psn) : io_(io), psn_(first_psn) {}

  // Sends the GMP carrying `mad` from `src` to QP `dest_qpn` at `dst`; an unspecified `src` is
  // the address the kernel routes from toward `dst` (net::route_source). kRejected when the two
  // addresses are of two families or no route leads to `dst`; a GMP lost to a full socket is
  // retransmitted by the CM that sent it.
  net::TxStatus send(std::span<const uint8_t, wire::kMadSize> mad, net::Address src,
                     const net::Endpoint& dst, uint32_t dest_qpn = wire::kMadGsiQpn);

 private:
  net::PacketIo& io_;
  uint32_t psn_;
};

}  // namespace urdma::gsi
