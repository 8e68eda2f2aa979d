#include "daemon/mad_router.h"

#include <variant>

#include "gsi/gmp.h"
#include "wire/cm.h"

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
    case MadDrop::kBadIcrc:
      return "bad_icrc";
    case MadDrop::kCount:
      break;
  }
  return "?";
}

MadRoute route_mad(std::span<const uint8_t> udp_payload) {
  const auto drop = [](MadDrop why) { return MadRoute{.by = MadRoute::By::kDrop, .drop = why}; };
  const gsi::GmpView gmp = gsi::parse_gmp(udp_payload);
  switch (gmp.error) {
    case gsi::GmpError::kNone:
      break;
    case gsi::GmpError::kNotRoce:
      return drop(MadDrop::kNotRoce);
    case gsi::GmpError::kNotQp1:
      return drop(MadDrop::kNotQp1);
    case gsi::GmpError::kNotUdSend:
      return drop(MadDrop::kNotUdSend);
    case gsi::GmpError::kShort:
      return drop(MadDrop::kNotCm);
  }
  const wire::CmParse cm = wire::parse_cm(gmp.mad);
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
        } else if constexpr (std::is_same_v<M, wire::CmReqView>) {
          MadRoute r = by_service(m.service_id());
          r.sender_comm_id = m.local_comm_id();
          return r;
        } else if constexpr (std::is_same_v<M, wire::CmSidrReqView>) {
          return by_service(m.service_id());
        } else if constexpr (std::is_same_v<M, wire::CmSidrRepView>) {
          return by_id(m.request_id());
        } else if constexpr (std::is_same_v<M, wire::CmRejView>) {
          if (m.remote_comm_id() != 0) return by_id(m.remote_comm_id());
          return MadRoute{.by = MadRoute::By::kRequester, .sender_comm_id = m.local_comm_id()};
        } else {
          return by_id(m.remote_comm_id());
        }
      },
      cm.message.view);
}

void RequesterTable::remember(const net::Address& requester, uint32_t comm_id, unsigned slot) {
  const Key key{requester, comm_id};
  const uint64_t seq = next_seq_++;
  slots_[key] = Entry{slot, seq};
  order_.emplace_back(key, seq);
  while (order_.size() > kCapacity) {
    const auto& [old_key, old_seq] = order_.front();
    const auto it = slots_.find(old_key);
    if (it != slots_.end() && it->second.seq == old_seq) slots_.erase(it);
    order_.pop_front();
  }
}

std::optional<unsigned> RequesterTable::take(const net::Address& requester, uint32_t comm_id) {
  const auto it = slots_.find(Key{requester, comm_id});
  if (it == slots_.end()) return std::nullopt;
  const unsigned slot = it->second.slot;
  slots_.erase(it);
  return slot;
}

void RequesterTable::forget_slot(unsigned slot) {
  std::erase_if(slots_, [slot](const auto& kv) { return kv.second.slot == slot; });
}

}  // namespace urdma::daemon
