// libFuzzer target for the RoCEv2 packet parser: any input either parses or is rejected with a
// reason, and a parsed packet's every accessor and payload byte stays inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "wire/packet.h"

namespace {

using namespace urdma::wire;

// Folds values into a sink the optimizer cannot drop.
volatile uint64_t g_sink;

void touch(const PacketView& p, std::span<const uint8_t> input) {
  uint64_t acc = 0;
  const BthView bth = p.bth();
  acc += bth.opcode() + bth.se() + bth.m() + bth.pad_count() + bth.tver() + bth.pkey() +
         bth.fecn() + bth.becn() + bth.resv6() + bth.dest_qp() + bth.ack_req() + bth.resv7() +
         bth.psn();
  if (auto r = p.reth()) acc += r->va() + r->rkey() + r->dma_length();
  if (auto a = p.aeth()) {
    acc += a->syndrome() + a->msn() + static_cast<uint8_t>(a->type()) + a->syndrome_value();
    if (a->is_rnr_nak()) acc += rnr_timer_ns(a->rnr_timer_code());
    if (a->is_ack()) acc += aeth_credit_count(a->credit_code()).value_or(0);
  }
  if (auto d = p.deth()) acc += d->qkey() + d->resv8() + d->src_qp();
  if (auto i = p.immdt()) acc += i->imm();
  if (auto i = p.ieth()) acc += i->rkey();
  if (auto a = p.atomic_eth()) acc += a->va() + a->rkey() + a->swap_add() + a->compare();
  if (auto a = p.atomic_ack_eth()) acc += a->orig_data();
  if (auto f = p.feth()) acc += f->resv() + f->selectivity_level() + f->placement_type();
  for (uint8_t b : p.payload()) acc += b;
  for (uint8_t b : p.icrc_bytes()) acc += b;
  acc += p.icrc();
  g_sink = acc;

  // Every region the view hands out lies inside the input, and they tile it exactly.
  const uint8_t* begin = input.data();
  const uint8_t* end = input.data() + input.size();
  const auto inside = [&](const uint8_t* ptr, size_t len) {
    return ptr >= begin && ptr + len <= end;
  };
  const size_t hdr = p.header_length();
  if (!inside(p.payload().data(), p.payload().size()) || p.payload().data() != begin + hdr ||
      hdr + p.payload().size() + p.pad_count() + kIcrcSize != input.size() ||
      p.icrc_bytes().data() != end - kIcrcSize) {
    std::abort();
  }
  for (size_t e = 0; e < kExtCount; ++e) {
    const Ext ext = static_cast<Ext>(e);
    if (p.info().has(ext) && !inside(begin + p.info().offset_of(ext), kExtSize[e])) std::abort();
  }

  // Rebuilding the same opcode and payload gives a packet that parses to the same layout.
  std::vector<uint8_t> rebuilt(input.size());
  const auto built = build_packet(rebuilt, p.opcode(), p.payload());
  if (!built || built->datagram.size() != input.size()) std::abort();
  const ParseResult again = parse_packet(built->datagram);
  if (!again.ok() || again->payload().size() != p.payload().size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly-sized heap buffer so ASan sees any read past the end.
  std::vector<uint8_t> input(data, data + size);
  const std::span<const uint8_t> span(input);
  for (bool strict : {false, true}) {
    const ParseResult r = parse_packet(span, ParseOptions{.strict_reserved = strict});
    if (r.ok()) {
      touch(r.packet(), span);
    } else if (r.error() == ParseError::kNone || parse_error_name(r.error()) == nullptr) {
      std::abort();
    }
  }
  return 0;
}
