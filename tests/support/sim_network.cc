#include "support/sim_network.h"

#include "base/check.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>

namespace urdma::net {
namespace {

// Recycled payload buffers kept for reuse; beyond this they are freed.
constexpr size_t kPoolMax = 1024;
// Delays are bounded so that now + delay + extra delay can never overflow virtual time.
constexpr uint64_t kMaxDelayNs = uint64_t{1} << 60;

struct EventName {
  SimEventKind kind;
  const char* name;
};
constexpr std::array<EventName, kSimEventKinds> kEventNames = {{
    {SimEventKind::kSend, "send"},
    {SimEventKind::kDropNoRoute, "drop-no-route"},
    {SimEventKind::kDropPartition, "drop-partition"},
    {SimEventKind::kDropLoss, "drop-loss"},
    {SimEventKind::kDuplicate, "duplicate"},
    {SimEventKind::kReorder, "reorder"},
    {SimEventKind::kCorrupt, "corrupt"},
    {SimEventKind::kDropQueueFull, "drop-queue-full"},
    {SimEventKind::kSchedule, "schedule"},
    {SimEventKind::kDropRxFull, "drop-rx-full"},
    {SimEventKind::kDeliver, "deliver"},
}};
static_assert([] {
  for (size_t i = 0; i < kEventNames.size(); ++i)
    if (static_cast<size_t>(kEventNames[i].kind) != i) return false;
  return true;
}());

// The simulated network's bounds; FaultModel checks the rates.
const SimOptions& check_options(const SimOptions& o) {
  base::check(o.delay_max_ns <= kMaxDelayNs, "delay_max_ns too large");
  base::check(o.reorder_delay_max_ns >= 1 && o.reorder_delay_max_ns <= kMaxDelayNs,
              "reorder_delay_max_ns out of [1, 2^60]");
  base::check(o.in_flight_max > 0 && o.rx_queue_max > 0, "queue bounds must be positive");
  base::check(o.partitions.size() <= kMaxSimPartitions, "too many partitions");
  for (const auto& p : o.partitions)
    base::check(p.start_ns <= p.end_ns, "partition ends before start");
  return o;
}

// Heap order for in-flight datagrams: earliest delivery first, then scheduling order.
template <typename F>
bool later(const F& x, const F& y) {
  return x.deliver_ns != y.deliver_ns ? x.deliver_ns > y.deliver_ns : x.order > y.order;
}

}  // namespace

const char* to_string(SimEventKind kind) {
  return kEventNames[static_cast<size_t>(kind)].name;
}

std::string to_string(const SimEvent& e) {
  auto host = [](HostId h) { return h == kNoHost ? std::string("?") : "h" + std::to_string(h); };
  std::string s = "t=" + std::to_string(e.time_ns) + " " + to_string(e.kind) + " #" +
                  std::to_string(e.packet_id) + "." + std::to_string(e.copy) + " " + host(e.src) +
                  "->" + host(e.dst) + " len=" + std::to_string(e.length);
  switch (e.kind) {
    case SimEventKind::kReorder:
      return s + " extra_ns=" + std::to_string(e.detail);
    case SimEventKind::kCorrupt:
      return s + " bit=" + std::to_string(e.detail);
    case SimEventKind::kSchedule:
      return s + " at=" + std::to_string(e.detail);
    default:
      return s;
  }
}

// One host's PacketIo: sends go into the network, reads come from its receive queue.
class SimNetwork::Host final : public PacketIo {
 public:
  struct Received {
    Endpoint src;
    Endpoint dst;
    std::vector<uint8_t> bytes;
  };

  Host(SimNetwork& net, HostId id, const Address& address)
      : net_(net), id_(id), address_(address) {}

  TxStatus send(const TxDatagram& d) override { return net_.transmit(id_, d); }

  size_t send_batch(std::span<const TxDatagram> batch) override {
    base::check(batch.size() <= kMaxBatch, "send_batch larger than kMaxBatch");
    for (const TxDatagram& d : batch) net_.transmit(id_, d);  // the simulation never blocks
    return batch.size();
  }

  size_t recv_batch(std::span<RxDatagram> batch) override {
    base::check(batch.size() <= kMaxBatch, "recv_batch larger than kMaxBatch");
    size_t n = 0;
    for (; n < batch.size() && !rx_.empty(); ++n) {
      Received& r = rx_.front();
      RxDatagram& out = batch[n];
      out.length = std::min(r.bytes.size(), out.buffer.size());
      out.truncated = out.length < r.bytes.size();
      if (out.length > 0) std::memcpy(out.buffer.data(), r.bytes.data(), out.length);
      out.src = r.src;
      out.dst = r.dst;
      io_.rx_datagrams++;
      io_.rx_bytes += out.length;
      if (out.truncated) io_.rx_truncated++;
      net_.recycle(std::move(r.bytes));
      rx_.pop_front();
    }
    return n;
  }

  int readable_fd() const override { return -1; }
  IoCounters counters() const override { return io_; }

  SimNetwork& net_;
  HostId id_;
  Address address_;
  std::deque<Received> rx_;
  IoCounters io_;
};

SimNetwork::SimNetwork(VirtualClock& clock, SimOptions options)
    : clock_(clock),
      options_(std::move(options)),
      model_(options_.seed, check_options(options_), options_.reorder_delay_max_ns) {
  partitions_ = options_.partitions;
}

SimNetwork::~SimNetwork() = default;

HostId SimNetwork::add_host(const Address& address) {
  base::check(hosts_.size() < kMaxSimHosts, "too many simulated hosts");
  base::check(!by_address_.contains(address), "duplicate host address");
  const auto id = static_cast<HostId>(hosts_.size());
  hosts_.push_back(std::make_unique<Host>(*this, id, address));
  per_host_.emplace_back();
  by_address_.emplace(address, id);
  return id;
}

PacketIo& SimNetwork::io(HostId host) {
  base::check(host < hosts_.size(), "unknown host");
  return *hosts_[host];
}

const Address& SimNetwork::address(HostId host) const {
  base::check(host < hosts_.size(), "unknown host");
  return hosts_[host]->address_;
}

std::optional<HostId> SimNetwork::find_host(const Address& address) const {
  auto it = by_address_.find(address);
  if (it == by_address_.end()) return std::nullopt;
  return it->second;
}

size_t SimNetwork::rx_pending(HostId host) const {
  base::check(host < hosts_.size(), "unknown host");
  return hosts_[host]->rx_.size();
}

const SimCounters& SimNetwork::host_counters(HostId host) const {
  base::check(host < hosts_.size(), "unknown host");
  return per_host_[host];
}

void SimNetwork::count(HostId host, uint64_t SimCounters::*field) {
  total_.*field += 1;
  if (host != kNoHost) per_host_[host].*field += 1;
}

void SimNetwork::emit(SimEventKind kind, const Flight& f, uint64_t detail) {
  if (!trace_) return;
  trace_(SimEvent{clock_.now_ns(), kind, f.packet_id, f.copy, f.src, f.dst,
                  static_cast<uint32_t>(f.bytes.size()), detail});
}

std::vector<uint8_t> SimNetwork::take_buffer() {
  if (pool_.empty()) return {};
  std::vector<uint8_t> b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

void SimNetwork::recycle(std::vector<uint8_t>&& buf) {
  if (pool_.size() < kPoolMax) pool_.push_back(std::move(buf));
}

bool SimNetwork::is_partitioned(HostId x, HostId y, uint64_t t_ns) const {
  return std::any_of(partitions_.begin(), partitions_.end(),
                     [&](const SimPartition& p) { return p.cuts(x, y, t_ns); });
}

size_t SimNetwork::partition(HostSet a, HostSet b) {
  base::check(partitions_.size() < kMaxSimPartitions, "too many partitions");
  partitions_.push_back(SimPartition{clock_.now_ns(), kNever, a, b});
  return partitions_.size() - 1;
}

void SimNetwork::heal(size_t id) {
  base::check(id < partitions_.size(), "unknown partition");
  SimPartition& p = partitions_[id];
  p.end_ns = std::max(p.start_ns, std::min(p.end_ns, clock_.now_ns()));
}

void SimNetwork::heal_all() {
  for (size_t id = 0; id < partitions_.size(); ++id) heal(id);
}

TxStatus SimNetwork::transmit(HostId from, const TxDatagram& d) {
  Host& host = *hosts_[from];
  const size_t length = d.size_bytes();
  if (d.iov.size() > kMaxTxIov || length > kMaxUdpPayloadBytes ||
      (!d.src.is_unspecified() && d.src != host.address_)) {
    host.io_.tx_rejected++;
    return TxStatus::kRejected;
  }
  host.io_.tx_datagrams++;
  host.io_.tx_bytes += length;

  const uint64_t now = clock_.now_ns();
  Flight f;
  f.packet_id = next_packet_id_++;
  f.src = from;
  f.from = Endpoint{host.address_, d.src_port};
  f.to = d.dst;
  f.bytes = take_buffer();
  f.bytes.resize(length);
  size_t at = 0;
  for (const iovec& v : d.iov) {
    if (v.iov_len > 0) std::memcpy(f.bytes.data() + at, v.iov_base, v.iov_len);
    at += v.iov_len;
  }
  count(from, &SimCounters::sent);
  const std::optional<HostId> dst = find_host(d.dst.address);
  f.dst = dst.value_or(kNoHost);
  emit(SimEventKind::kSend, f);

  auto drop = [&](SimEventKind why, uint64_t SimCounters::*field) {
    count(from, field);
    emit(why, f);
    recycle(std::move(f.bytes));
    return TxStatus::kSent;  // it left the host; the network lost it
  };
  if (!dst) return drop(SimEventKind::kDropNoRoute, &SimCounters::dropped_no_route);
  if (is_partitioned(from, *dst, now))
    return drop(SimEventKind::kDropPartition, &SimCounters::dropped_partition);
  const DatagramFaults faults = model_.next(length);
  if (faults.lost) return drop(SimEventKind::kDropLoss, &SimCounters::dropped_loss);

  std::array<Flight, 2> copies;
  if (faults.duplicated) {
    copies[1] = f;  // same header fields; its own buffer below
    copies[1].copy = 1;
    copies[1].bytes = take_buffer();
    copies[1].bytes.assign(f.bytes.begin(), f.bytes.end());
    count(from, &SimCounters::duplicated);
    emit(SimEventKind::kDuplicate, copies[1]);
  }
  copies[0] = std::move(f);

  for (size_t i = 0; i < faults.copies(); ++i) {
    Flight& c = copies[i];
    const CopyFaults& fault = faults.copy[i];
    uint64_t delay = fault.delay_ns;
    if (fault.reorder > 0) {
      delay += fault.reorder;  // extra nanoseconds
      count(from, &SimCounters::reordered);
      emit(SimEventKind::kReorder, c, fault.reorder);
    }
    if (fault.corrupt) {
      FaultModel::flip_bit(c.bytes, fault.corrupt_bit);
      count(from, &SimCounters::corrupted);
      emit(SimEventKind::kCorrupt, c, fault.corrupt_bit);
    }
    if (in_flight_.size() >= options_.in_flight_max) {
      count(from, &SimCounters::dropped_queue_full);
      emit(SimEventKind::kDropQueueFull, c);
      recycle(std::move(c.bytes));
      continue;
    }
    base::check(now <= kNever - 4 * kMaxDelayNs, "virtual time too close to overflow");
    c.deliver_ns = now + delay;
    c.order = next_order_++;
    emit(SimEventKind::kSchedule, c, c.deliver_ns);
    in_flight_.push_back(std::move(c));
    std::push_heap(in_flight_.begin(), in_flight_.end(), later<Flight>);
  }
  return TxStatus::kSent;
}

uint64_t SimNetwork::next_event_ns() const {
  return in_flight_.empty() ? kNever : in_flight_.front().deliver_ns;
}

size_t SimNetwork::deliver_due() {
  const uint64_t now = clock_.now_ns();
  size_t delivered = 0;
  while (!in_flight_.empty() && in_flight_.front().deliver_ns <= now) {
    std::pop_heap(in_flight_.begin(), in_flight_.end(), later<Flight>);
    Flight f = std::move(in_flight_.back());
    in_flight_.pop_back();
    Host& dst = *hosts_[f.dst];
    if (is_partitioned(f.src, f.dst, now)) {
      count(f.dst, &SimCounters::dropped_partition);
      emit(SimEventKind::kDropPartition, f);
      recycle(std::move(f.bytes));
      continue;
    }
    if (dst.rx_.size() >= options_.rx_queue_max) {
      count(f.dst, &SimCounters::dropped_rx_full);
      emit(SimEventKind::kDropRxFull, f);
      recycle(std::move(f.bytes));
      continue;
    }
    count(f.dst, &SimCounters::delivered);
    emit(SimEventKind::kDeliver, f);
    dst.rx_.push_back(Host::Received{f.from, f.to, std::move(f.bytes)});
    ++delivered;
  }
  return delivered;
}

}  // namespace urdma::net
