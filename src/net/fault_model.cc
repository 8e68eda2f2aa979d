#include "net/fault_model.h"

#include "base/check.h"

namespace urdma::net {

FaultModel::FaultModel(uint64_t seed, const FaultRates& rates, uint64_t reorder_span)
    : rates_(rates), reorder_span_(reorder_span), rng_(seed) {
  for (uint32_t ppm : {rates.loss_ppm, rates.duplicate_ppm, rates.reorder_ppm, rates.corrupt_ppm})
    base::check(ppm <= Xoshiro256::kPpmOne, "fault probability above 1,000,000 ppm");
  base::check(rates.delay_min_ns <= rates.delay_max_ns, "delay_min_ns > delay_max_ns");
  base::check(reorder_span >= 1, "reorder span below 1");
}

DatagramFaults FaultModel::next(size_t payload_bytes) {
  DatagramFaults f;
  // The draws happen in this fixed order per datagram so a seed replays exactly.
  f.lost = rng_.chance_ppm(rates_.loss_ppm);
  if (f.lost) return f;
  f.duplicated = rng_.chance_ppm(rates_.duplicate_ppm);
  for (size_t i = 0; i < f.copies(); ++i) {
    CopyFaults& c = f.copy[i];
    c.delay_ns = rng_.between(rates_.delay_min_ns, rates_.delay_max_ns);
    if (rng_.chance_ppm(rates_.reorder_ppm)) c.reorder = rng_.between(1, reorder_span_);
    c.corrupt = rng_.chance_ppm(rates_.corrupt_ppm) && payload_bytes > 0;
    if (c.corrupt) c.corrupt_bit = rng_.below(uint64_t{payload_bytes} * 8);
  }
  return f;
}

void FaultModel::flip_bit(std::span<uint8_t> bytes, uint64_t bit) {
  base::check(bit / 8 < bytes.size(), "bit to flip outside the payload");
  bytes[bit / 8] ^= static_cast<uint8_t>(0x80u >> (bit % 8));
}

}  // namespace urdma::net
