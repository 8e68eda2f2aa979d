// The tag-matching headers rdma-core defines for RC SEND payloads (Documentation/tag_matching.md,
// <infiniband/tm_types.h>): a TMH opens every tag-matching message, an RVH follows it in a
// rendezvous request. They are application payload, not transport headers: a device that
// offers tag matching reads them at the receiver; nothing else on the wire changes.
//
//   TMH, 16 bytes          RVH, 16 bytes
//   byte 0     Operation   bytes 0-7    Virtual Address
//   bytes 1-3  reserved    bytes 8-11   Remote Key
//   bytes 4-7  User data   bytes 12-15  Length
//   bytes 8-15 Tag
//
// Views as headers.h's: they never check bounds; the caller guarantees kSize readable bytes.
#pragma once

#include <cstdint>

#include "wire/byte_order.h"

namespace urdma::wire {

// enum ibv_tmh_op.
enum class TmOp : uint8_t {
  kNoTag = 0,
  kRndv = 1,
  kFin = 2,
  kEager = 3,
};

template <WireByte Byte>
class BasicTmh {
  URDMA_WIRE_VIEW(BasicTmh, 16)
  URDMA_WIRE_FIELD(opcode, 0, 1, 0, 8)
  URDMA_WIRE_FIELD(reserved, 1, 3, 0, 24)
  URDMA_WIRE_FIELD(app_ctx, 4, 4, 0, 32)
  URDMA_WIRE_FIELD(tag, 8, 8, 0, 64)
  static_assert(tag_field::kEnd == kSize);
};
using Tmh = BasicTmh<uint8_t>;
using TmhView = BasicTmh<const uint8_t>;
static_assert(Tmh::kSize == 16);

template <WireByte Byte>
class BasicRvh {
  URDMA_WIRE_VIEW(BasicRvh, 16)
  URDMA_WIRE_FIELD(va, 0, 8, 0, 64)
  URDMA_WIRE_FIELD(rkey, 8, 4, 0, 32)
  URDMA_WIRE_FIELD(len, 12, 4, 0, 32)
  static_assert(len_field::kEnd == kSize);
};
using Rvh = BasicRvh<uint8_t>;
using RvhView = BasicRvh<const uint8_t>;
static_assert(Rvh::kSize == 16);

}  // namespace urdma::wire
