#include "daemon/mad_router.h"

#include <variant>

#include "wire/cm.h"
#include "wire/mad.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace urdma::daemon {

const char* mad_drop_name(MadDrop d) {
  switch (d) {
    case MadDrop::kNone:
      return "none";
    case MadDrop::kNotRoce:
      return "not_roce";
    case MadDrop::kNotQp1:
      return "not_qp1";
    case MadDrop::kNotUdSend:
      return "not_ud_send";
    case MadDrop::kNotCm:
      return "not_cm";
    case MadDrop::kClassPortInfo:
      return "class_port_info";
    case MadDrop::kNoListener:
      return "no_listener";
    case MadDrop::kNoSlot:
      return "no_slot";
    case MadDrop::kNoChannel:
      return "no_channel";
    case MadDrop::kChannelFull:
      return "channel_full";
    case MadDrop::kTruncated:
      return "truncated";
    case MadDrop::kCount:
      break;
  }
  return "?";
}

MadRoute route_mad(std::span<const uint8_t> udp_payload) {
  const auto drop = [](MadDrop why) { return MadRoute{.by = MadRoute::By::kDrop, .drop = why}; };
  const auto parsed = wire::parse_packet(udp_payload);
  if (!parsed) return drop(MadDrop::kNotRoce);
  if (parsed->bth().dest_qp() != wire::kMadGsiQpn) return drop(MadDrop::kNotQp1);
  // IBA 13.5.1: MADs travel as UD SENDs to QP1.
  if (parsed->opcode() != wire::op::kUdSendOnly) return drop(MadDrop::kNotUdSend);
  const auto payload = parsed->payload();
  if (payload.size() < wire::kMadSize) return drop(MadDrop::kNotCm);
  const wire::CmParse cm = wire::parse_cm(payload.first(wire::kMadSize));
  if (!cm.ok()) return drop(MadDrop::kNotCm);
  const auto by_service = [](uint64_t id) {
    return MadRoute{.by = MadRoute::By::kServiceId, .service_id = id};
  };
  const auto by_id = [](uint32_t receiver_id) {
    return MadRoute{.by = MadRoute::By::kSlot, .slot = slot_of_comm_id(receiver_id)};
  };
  return std::visit(
      [&](const auto& m) -> MadRoute {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, wire::CmClassPortInfoView>) {
          return drop(MadDrop::kClassPortInfo);
        } else if constexpr (std::is_same_v<M, wire::CmReqView> ||
                             std::is_same_v<M, wire::CmSidrReqView>) {
          return by_service(m.service_id());
        } else if constexpr (std::is_same_v<M, wire::CmSidrRepView>) {
          return by_id(m.request_id());
        } else {
          return by_id(m.remote_comm_id());
        }
      },
      cm.message.view);
}

}  // namespace urdma::daemon
