// Two (or more) cm::Managers joined by an in-memory link under one virtual clock: every MAD a
// manager queues is delivered to the manager owning its destination GID after a delay, with
// seeded loss, duplication and reordering: net::FaultModel's, the model of URDMA_FAULTS and of the
// simulated network.
// MADs to a GID nobody owns vanish — a peer that never answers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cm/manager.h"
#include "event_order.h"
#include "net/clock.h"
#include "net/fault_model.h"
#include "wire/cm.h"

namespace urdma::cm::test {

inline Gid ipv4_gid(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  const std::array<uint8_t, 4> ip = {a, b, c, d};
  return wire::ipv4_mapped(ip);
}

inline constexpr uint64_t kMs = 1'000'000;

struct LinkFaults {
  uint64_t seed = 1;
  uint32_t loss_ppm = 0;
  uint32_t dup_ppm = 0;
  uint32_t reorder_ppm = 0;     // such a MAD takes up to 4 × the delay
  uint64_t delay_ns = 100'000;  // one way

  net::FaultRates rates() const {
    net::FaultRates r;
    r.loss_ppm = loss_ppm;
    r.duplicate_ppm = dup_ppm;
    r.reorder_ppm = reorder_ppm;
    r.delay_min_ns = delay_ns;
    r.delay_max_ns = delay_ns;
    return r;
  }
};

struct Sent {
  uint64_t at_ns;
  size_t from;  // host index
  OutgoingMad out;
  uint16_t attr() const { return static_cast<uint16_t>(out.mad[16] << 8 | out.mad[17]); }
};

class Link {
 public:
  struct Host {
    Gid gid;
    std::unique_ptr<Manager> m;
    std::vector<Event> events;
  };

  explicit Link(LinkFaults faults = {})
      : model_(faults.seed, faults.rates(), std::max<uint64_t>(3 * faults.delay_ns, 1)) {}

  size_t add_host(const Gid& gid, ManagerConfig cfg) {
    hosts_.push_back(Host{gid, std::make_unique<Manager>(cfg, clock_), {}});
    return hosts_.size() - 1;
  }
  Manager& m(size_t h) { return *hosts_[h].m; }
  std::vector<Event>& events(size_t h) { return hosts_[h].events; }
  net::VirtualClock& clock() { return clock_; }
  const std::vector<Sent>& sent() const { return sent_; }
  // Called for every MAD before the link decides its fate; return false to drop it.
  std::function<bool(const Sent&)> filter;

  // Collects what the managers queued; delivers what is due; fires timers. Repeats until
  // nothing is due at the current time.
  void settle() {
    for (int guard = 0; guard < 100000; ++guard) {
      bool progress = collect();
      const uint64_t now = clock_.now_ns();
      for (size_t i = 0; i < flight_.size();) {
        if (flight_[i].deliver_ns <= now) {
          Flight f = flight_[i];
          flight_.erase(flight_.begin() + static_cast<ptrdiff_t>(i));
          deliver(f);
          progress = true;
        } else {
          ++i;
        }
      }
      for (size_t h = 0; h < hosts_.size(); ++h) {
        if (hosts_[h].m->next_deadline_ns() <= now) {
          hosts_[h].m->run_timers();
          progress = true;
        }
      }
      progress |= collect();
      if (!progress) return;
    }
    ADD_FAILURE() << "link: no quiescence";
  }

  // Runs the world until `t_ns` (absolute), stepping from one due moment to the next.
  void run_until(uint64_t t_ns) {
    settle();
    for (;;) {
      uint64_t next = net::kNever;
      for (const Flight& f : flight_) next = std::min(next, f.deliver_ns);
      for (auto& h : hosts_) next = std::min(next, h.m->next_deadline_ns());
      if (next > t_ns) break;
      if (next > clock_.now_ns()) clock_.set(next);
      settle();
    }
    if (t_ns > clock_.now_ns()) clock_.set(t_ns);
    settle();
  }
  void run_for(uint64_t d_ns) { run_until(clock_.now_ns() + d_ns); }

  // Hands every host's events to `order` (failing the test on a violation).
  void check_order(EventOrder& order, size_t h) {
    for (const Event& e : hosts_[h].events) {
      const std::string err = order.add(e);
      EXPECT_EQ(err, "") << "host " << h;
    }
  }

  // A copy of the first event of `type` on host h (optionally for `id`).
  std::optional<Event> find(size_t h, EventType type,
                            std::optional<ConnId> id = std::nullopt) const {
    for (const Event& e : hosts_[h].events)
      if (e.type == type && (!id || e.id == *id)) return e;
    return std::nullopt;
  }
  std::vector<Sent> sent_of(size_t from, wire::CmAttr attr) const {
    std::vector<Sent> r;
    for (const Sent& s : sent_)
      if (s.from == from && s.attr() == static_cast<uint16_t>(attr)) r.push_back(s);
    return r;
  }

 private:
  struct Flight {
    uint64_t deliver_ns;
    size_t from;
    OutgoingMad out;
  };

  bool collect() {
    bool any = false;
    for (size_t h = 0; h < hosts_.size(); ++h) {
      for (OutgoingMad& o : hosts_[h].m->take_outgoing()) {
        any = true;
        Sent s{clock_.now_ns(), h, o};
        // Everything a manager sends must be a well-formed CM MAD.
        EXPECT_TRUE(wire::parse_cm(o.mad).ok()) << "host " << h << " sent a malformed MAD";
        sent_.push_back(s);
        if (filter && !filter(s)) continue;
        const net::DatagramFaults f = model_.next(o.mad.size());
        for (size_t i = 0; i < f.copies(); ++i) {
          const uint64_t delay = f.copy[i].delay_ns + f.copy[i].reorder;
          flight_.push_back(Flight{clock_.now_ns() + delay, h, o});
        }
      }
      for (Event& e : hosts_[h].m->take_events()) {
        any = true;
        hosts_[h].events.push_back(std::move(e));
      }
    }
    return any;
  }

  void deliver(const Flight& f) {
    for (auto& h : hosts_) {
      if (h.gid == f.out.dest_gid) {
        h.m->receive(hosts_[f.from].gid, wire::kMadGsiQpn, f.out.mad);
        return;
      }
    }
  }

  net::FaultModel model_;
  net::VirtualClock clock_;
  std::vector<Host> hosts_;
  std::vector<Flight> flight_;
  std::vector<Sent> sent_;
};

}  // namespace urdma::cm::test
