#include "net/faulty_packet_io.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#include "base/check.h"

namespace urdma::net {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A whole decimal number in [lo, hi].
bool parse_u64(std::string_view s, uint64_t lo, uint64_t hi, uint64_t* out) {
  s = trim(s);
  if (s.empty()) return false;
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

constexpr uint64_t kNsPerUs = 1'000;
// Marks a held copy that has been sent, for the erase after a release pass.
constexpr uint64_t kReleased = ~uint64_t{0};

enum class Key : uint8_t {
  kSeed,
  kLoss,
  kDup,
  kReorder,
  kCorrupt,
  kDelayUs,
  kReorderDepth,
  kReorderMaxUs,
  kHeldMax,
};
struct KeyName {
  Key key;
  const char* name;
};
constexpr std::array<KeyName, 9> kKeys = {{
    {Key::kSeed, "seed"},
    {Key::kLoss, "loss"},
    {Key::kDup, "dup"},
    {Key::kReorder, "reorder"},
    {Key::kCorrupt, "corrupt"},
    {Key::kDelayUs, "delay_us"},
    {Key::kReorderDepth, "reorder_depth"},
    {Key::kReorderMaxUs, "reorder_max_us"},
    {Key::kHeldMax, "held_max"},
}};

std::string known_keys() {
  std::string s;
  for (const KeyName& k : kKeys) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

// FaultyPacketIo's bounds; FaultModel checks the rates.
const FaultProfile& check_profile(const FaultProfile& p) {
  base::check(p.delay_max_ns <= kMaxFaultDelayNs && p.reorder_max_ns <= kMaxFaultDelayNs,
              "fault delay above 10 s");
  base::check(p.reorder_depth >= 1 && p.reorder_depth <= kMaxReorderDepth,
              "reorder_depth out of [1, 1024]");
  base::check(p.held_max >= 1 && p.held_max <= kMaxFaultHeld, "held_max out of [1, 65536]");
  return p;
}

}  // namespace

std::optional<FaultProfile> parse_fault_profile(std::string_view text, std::string* error) {
  FaultProfile p;
  uint32_t seen = 0;  // bit per Key
  auto fail = [&](const std::string& why) -> std::optional<FaultProfile> {
    *error = "URDMA_FAULTS: " + why;
    return std::nullopt;
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;  // "a=1,,b=2" and a trailing comma are harmless
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return fail("'" + std::string(item) + "' is not key=value (keys: " + known_keys() + ")");
    const std::string_view name = trim(item.substr(0, eq));
    const std::string_view value = trim(item.substr(eq + 1));
    const auto k = std::find_if(kKeys.begin(), kKeys.end(),
                                [&](const KeyName& kn) { return name == kn.name; });
    if (k == kKeys.end())
      return fail("unknown key '" + std::string(name) + "' (keys: " + known_keys() + ")");
    const uint32_t bit = uint32_t{1} << static_cast<unsigned>(k->key);
    if (seen & bit) return fail("'" + std::string(name) + "' given twice");
    seen |= bit;
    auto bad = [&](const char* range) {
      return fail("'" + std::string(item) + "': " + std::string(name) + " must be " + range);
    };
    uint64_t v = 0;
    switch (k->key) {
      case Key::kSeed:
        if (!parse_u64(value, 0, ~uint64_t{0}, &v)) return bad("an unsigned 64-bit integer");
        p.seed = v;
        break;
      case Key::kLoss:
      case Key::kDup:
      case Key::kReorder:
      case Key::kCorrupt: {
        if (!parse_u64(value, 0, Xoshiro256::kPpmOne, &v))
          return bad("parts per million, 0..1000000 (10000 = 1%)");
        const auto ppm = static_cast<uint32_t>(v);
        if (k->key == Key::kLoss) p.loss_ppm = ppm;
        if (k->key == Key::kDup) p.duplicate_ppm = ppm;
        if (k->key == Key::kReorder) p.reorder_ppm = ppm;
        if (k->key == Key::kCorrupt) p.corrupt_ppm = ppm;
        break;
      }
      case Key::kDelayUs: {
        const size_t dash = value.find('-');
        uint64_t lo = 0, hi = 0;
        constexpr uint64_t kMaxUs = kMaxFaultDelayNs / kNsPerUs;
        const bool ok = dash == std::string_view::npos
                            ? parse_u64(value, 0, kMaxUs, &lo) && ((hi = lo), true)
                            : parse_u64(value.substr(0, dash), 0, kMaxUs, &lo) &&
                                  parse_u64(value.substr(dash + 1), 0, kMaxUs, &hi) && lo <= hi;
        if (!ok) return bad("microseconds N or MIN-MAX (MIN <= MAX <= 10000000)");
        p.delay_min_ns = lo * kNsPerUs;
        p.delay_max_ns = hi * kNsPerUs;
        break;
      }
      case Key::kReorderDepth:
        if (!parse_u64(value, 1, kMaxReorderDepth, &v)) return bad("1..1024");
        p.reorder_depth = static_cast<uint32_t>(v);
        break;
      case Key::kReorderMaxUs:
        if (!parse_u64(value, 0, kMaxFaultDelayNs / kNsPerUs, &v))
          return bad("microseconds, 0..10000000");
        p.reorder_max_ns = v * kNsPerUs;
        break;
      case Key::kHeldMax:
        if (!parse_u64(value, 1, kMaxFaultHeld, &v)) return bad("1..65536");
        p.held_max = static_cast<size_t>(v);
        break;
    }
  }
  return p;
}

std::string to_string(const FaultProfile& p) {
  return "seed=" + std::to_string(p.seed) + ",loss=" + std::to_string(p.loss_ppm) +
         ",dup=" + std::to_string(p.duplicate_ppm) + ",reorder=" + std::to_string(p.reorder_ppm) +
         ",corrupt=" + std::to_string(p.corrupt_ppm) +
         ",delay_us=" + std::to_string(p.delay_min_ns / kNsPerUs) + "-" +
         std::to_string(p.delay_max_ns / kNsPerUs) +
         ",reorder_depth=" + std::to_string(p.reorder_depth) +
         ",reorder_max_us=" + std::to_string(p.reorder_max_ns / kNsPerUs) +
         ",held_max=" + std::to_string(p.held_max);
}

FaultyPacketIo::FaultyPacketIo(std::unique_ptr<PacketIo> inner, const Clock& clock,
                               const FaultProfile& profile)
    : inner_(std::move(inner)),
      clock_(clock),
      profile_(check_profile(profile)),
      model_(profile.seed, profile, profile.reorder_depth) {
  base::check(inner_ != nullptr, "FaultyPacketIo needs an inner PacketIo");
  held_.reserve(profile_.held_max);
}

// What is in flight on a link still arrives after its sender is gone: the held copies go now,
// in the order they were due (a process that exits right after its last ACK must not take that
// ACK with it). Copies the inner I/O would block on are lost, as on a full link.
FaultyPacketIo::~FaultyPacketIo() {
  std::sort(held_.begin(), held_.end(), Held::due_before);
  for (Held& h : held_) send_held(h);
}

bool FaultyPacketIo::send_held(Held& h) {
  const iovec v{h.bytes.data(), h.bytes.size()};
  TxDatagram t;
  t.iov = std::span<const iovec>(&v, 1);
  t.dst = h.dst;
  t.src_port = h.src_port;
  t.src = h.src;
  t.traffic_class = h.traffic_class;
  t.hop_limit = h.hop_limit;
  const TxStatus st = inner_->send(t);
  if (st == TxStatus::kWouldBlock) return false;
  if (st == TxStatus::kRejected) ++faults_.release_failed;
  return true;
}

void FaultyPacketIo::release(uint64_t now, bool earliest_only) {
  if (held_.empty()) return;
  std::array<Held*, kMaxBatch> due;
  size_t n = 0;
  if (earliest_only) {
    due[n++] = &*std::min_element(held_.begin(), held_.end(), Held::due_before);
  } else {
    for (Held& h : held_)
      if ((h.release_ns <= now || seq_ >= h.release_seq) && n < due.size()) due[n++] = &h;
    if (n == 0) return;
    std::sort(due.begin(), due.begin() + static_cast<std::ptrdiff_t>(n),
              [](const Held* a, const Held* b) { return Held::due_before(*a, *b); });
  }
  size_t sent = 0;
  for (; sent < n; ++sent) {
    if (send_held(*due[sent])) continue;
    if (!earliest_only) break;  // would block: the rest stay held for a later call
    ++faults_.release_failed;   // the queue must shrink: lost, like on a full link
  }
  for (size_t i = 0; i < sent; ++i) due[i]->order = kReleased;
  std::erase_if(held_, [](const Held& h) { return h.order == kReleased; });
}

void FaultyPacketIo::release_due() {
  release(clock_.now_ns(), false);
}

uint64_t FaultyPacketIo::next_deadline_ns() const {
  uint64_t t = inner_->next_deadline_ns();
  for (const Held& h : held_) t = std::min(t, h.release_ns);
  return t;
}

void FaultyPacketIo::hold(Held&& h) {
  if (held_.size() >= profile_.held_max) {
    ++faults_.held_overflow;
    release(clock_.now_ns(), true);
  }
  held_.push_back(std::move(h));
}

TxStatus FaultyPacketIo::send(const TxDatagram& d) {
  const uint64_t now = clock_.now_ns();
  release(now, false);
  const uint64_t k = seq_ + 1;  // this datagram's number, once accepted
  const size_t length = d.size_bytes();
  const DatagramFaults faults = model_.next(length);
  if (faults.lost) {
    seq_ = k;
    ++faults_.offered;
    ++faults_.dropped_loss;
    release(now, false);
    return TxStatus::kSent;  // it left the host; the "network" lost it
  }
  TxStatus status = TxStatus::kSent;
  for (size_t copy = 0; copy < faults.copies(); ++copy) {
    const CopyFaults& f = faults.copy[copy];
    const uint64_t delay = f.delay_ns;
    const bool reorder = f.reorder > 0;
    if (delay == 0 && !reorder && !f.corrupt) {
      const TxStatus st = inner_->send(d);                      // as it came: no copy
      if (copy == 0 && st == TxStatus::kWouldBlock) return st;  // nothing accepted
      if (copy == 0) status = st;
      if (copy == 1 && st != TxStatus::kSent) ++faults_.release_failed;
      continue;
    }
    if (length > kMaxUdpPayloadBytes || d.iov.size() > kMaxTxIov) {
      // What the inner I/O would reject anyway; never copied.
      if (copy == 0) status = inner_->send(d);
      continue;
    }
    Held h;
    h.release_ns = now + delay + (reorder ? profile_.reorder_max_ns : 0);
    h.release_seq = reorder ? k + f.reorder : ~uint64_t{0};
    h.order = next_order_++;
    h.dst = d.dst;
    h.src_port = d.src_port;
    h.src = d.src;
    h.traffic_class = d.traffic_class;
    h.hop_limit = d.hop_limit;
    h.bytes.resize(length);
    size_t at = 0;
    for (const iovec& v : d.iov) {
      if (v.iov_len > 0) std::memcpy(h.bytes.data() + at, v.iov_base, v.iov_len);
      at += v.iov_len;
    }
    if (f.corrupt) {
      FaultModel::flip_bit(h.bytes, f.corrupt_bit);
      ++faults_.corrupted;
    }
    if (reorder) {
      ++faults_.reordered;
    } else if (delay > 0) {
      ++faults_.delayed;
    } else if (send_held(h)) {
      continue;  // corrupted only: sent now, from the copy
    } else {
      h.release_ns = now;  // would block: the next call retries it
    }
    hold(std::move(h));
  }
  if (faults.duplicated) ++faults_.duplicated;
  seq_ = k;
  ++faults_.offered;
  release(now, false);  // reordered copies overtaken by enough datagrams now
  return status;
}

size_t FaultyPacketIo::send_batch(std::span<const TxDatagram> batch) {
  base::check(batch.size() <= kMaxBatch, "send_batch larger than kMaxBatch");
  for (size_t i = 0; i < batch.size(); ++i)
    if (send(batch[i]) == TxStatus::kWouldBlock) return i;
  return batch.size();
}

size_t FaultyPacketIo::recv_batch(std::span<RxDatagram> batch) {
  release_due();
  return inner_->recv_batch(batch);
}

}  // namespace urdma::net
