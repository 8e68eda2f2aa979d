// Property test: managers driven by random API calls and random MADs — messages they sent,
// mutated (other comm IDs, another attribute, flipped bytes), replayed, truncated, or made up —
// never crash, never send a MAD parse_cm refuses, stay within their connection bound, and never
// report a connection's events out of the order the state machine allows (cm_link.h
// EventOrder). Every failure names its seed.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cm/manager.h"
#include "cm_link.h"
#include "net/prng.h"
#include "wire/cm.h"
#include "wire/rdma_cm_ip.h"

namespace urdma::cm {
namespace {

using test::kMs;

constexpr uint64_t kSids[] = {
    wire::rdma_service_id(wire::RdmaPortSpace::kTcp, 1),
    wire::rdma_service_id(wire::RdmaPortSpace::kTcp, 2),
    wire::rdma_service_id(wire::RdmaPortSpace::kUdp, 1),
    wire::rdma_service_id(wire::RdmaPortSpace::kIb, 1),
    0x1234,  // a native IB service ID
};

class Fuzzer {
 public:
  explicit Fuzzer(uint64_t seed)
      : rng_(seed),
        link_(test::LinkFaults{.seed = seed,
                               .loss_ppm = 100'000,
                               .dup_ppm = 100'000,
                               .reorder_ppm = 100'000,
                               .delay_ns = 1 * kMs}) {
    for (unsigned h = 0; h < 2; ++h) {
      ManagerConfig c;
      c.slot = 3 + h;
      c.local_ca_guid = 0x100 + h;
      c.seed = seed + h;
      c.max_connections = 24;
      c.max_initiator_depth = 8;
      c.max_responder_resources = 8;
      gids_[h] = test::ipv4_gid(10, 1, 0, static_cast<uint8_t>(h + 1));
      link_.add_host(gids_[h], c);
      for (uint64_t sid : kSids)
        if (pick(2)) (void)link_.m(h).listen(sid);
    }
  }

  void step() {
    switch (pick(8)) {
      case 0:
      case 1:
        api_call();
        break;
      case 2:
      case 3:
        inject_mutated();
        break;
      case 4:
        inject_made_up();
        break;
      case 5:
        link_.run_for(pick(2) ? pick(20) * kMs : pick(20'000) * kMs);
        break;
      default:
        answer_events();
        break;
    }
    link_.settle();
    check();
  }

  // What the run reached, summed over seeds (so the test shows it explored the machine).
  struct Reach {
    std::map<EventType, int> events;
    uint64_t duplicates = 0, stale = 0, malformed = 0, unmatched = 0, retransmitted = 0;
  };
  void add_reach(Reach& r) const {
    for (size_t h = 0; h < 2; ++h) {
      const Counters& c = const_cast<test::Link&>(link_).m(h).counters();
      r.duplicates += c.duplicates;
      r.stale += c.stale_rejected;
      r.malformed += c.malformed;
      r.unmatched += c.unmatched;
      r.retransmitted += c.retransmitted;
    }
  }

  void check() {
    for (size_t h = 0; h < 2; ++h) {
      auto& evs = link_.events(h);
      for (size_t i = checked_[h]; i < evs.size(); ++i) {
        ++reach_events_[evs[i].type];
        const std::string err = order_.add(evs[i]);
        EXPECT_EQ(err, "") << "host " << h;
        ids_[h].push_back(evs[i].id);
      }
      checked_[h] = evs.size();
      EXPECT_LE(link_.m(h).connection_count(), 24u);
    }
  }

 private:
  uint64_t pick(uint64_t n) { return n ? rng_.next() % n : 0; }
  size_t host() { return pick(2); }
  ConnId some_id(size_t h) {
    if (ids_[h].empty() || pick(8) == 0) return static_cast<ConnId>(rng_.next());
    return ids_[h][pick(ids_[h].size())];
  }
  std::vector<uint8_t> data(size_t max) {
    std::vector<uint8_t> d(pick(max + 8));  // sometimes beyond the limit: EINVAL
    for (auto& b : d) b = static_cast<uint8_t>(rng_.next());
    return d;
  }
  uint8_t resources() { return pick(4) == 0 ? kMaxResources : static_cast<uint8_t>(pick(12)); }

  void api_call() {
    const size_t h = host();
    Manager& m = link_.m(h);
    const ConnId id = some_id(h);
    const auto pd = data(230);
    switch (pick(12)) {
      case 0: {
        ConnectParams p;
        p.path.local_gid = gids_[h];
        p.path.remote_gid = pick(5) ? gids_[1 - h] : test::ipv4_gid(10, 1, 0, 9);
        p.path.mtu = static_cast<uint8_t>(pick(7));
        p.service_id = kSids[pick(std::size(kSids))];
        p.qpn = static_cast<uint32_t>(pick(4)) + 0x40;  // few QPNs: stale connections happen
        p.starting_psn = static_cast<uint32_t>(rng_.next());
        p.responder_resources = resources();
        p.initiator_depth = resources();
        p.manual_rtu = pick(4) == 0;
        p.unreliable = pick(6) == 0;
        if (pick(3)) p.ip = wire::CmaAddress{.src_port = 7, .src_addr = gids_[h]};
        p.private_data = pd;
        if (auto r = m.connect(p); r.ok()) ids_[h].push_back(*r);
        break;
      }
      case 1:
        (void)m.accept(id, AcceptParams{.qpn = static_cast<uint32_t>(pick(4)) + 0x80,
                                        .responder_resources = resources(),
                                        .initiator_depth = resources(),
                                        .private_data = pd});
        break;
      case 2: {
        const auto ari = data(72);
        (void)m.reject(
            id, RejectParams{
                    .reason = static_cast<uint16_t>(pick(40)), .ari = ari, .private_data = pd});
        break;
      }
      case 3:
        (void)m.establish(id);
        break;
      case 4:
        (void)m.notify_established(id);
        break;
      case 5:
        (void)m.disconnect(id, pd);
        break;
      case 6:
        m.destroy(id);
        break;
      case 7: {
        SidrQueryParams q;
        q.path.local_gid = gids_[h];
        q.path.remote_gid = gids_[1 - h];
        q.service_id = kSids[pick(std::size(kSids))];
        q.private_data = pd;
        if (auto r = m.sidr_query(q); r.ok()) ids_[h].push_back(*r);
        break;
      }
      case 8:
        (void)m.sidr_answer(
            id, SidrAnswerParams{
                    .status = static_cast<uint8_t>(pick(6)), .qpn = 0x99, .private_data = pd});
        break;
      case 9:
        (void)m.qp_attrs(id, static_cast<ibv_qp_state>(pick(7)));
        break;
      case 10:
        (void)m.listen(kSids[pick(std::size(kSids))]);
        break;
      default:
        (void)m.stop_listening(kSids[pick(std::size(kSids))]);
        break;
    }
  }

  // Applications that answer what they are told, so connections get far.
  void answer_events() {
    for (size_t h = 0; h < 2; ++h) {
      for (const Event& e : link_.events(h)) {
        Manager& m = link_.m(h);
        switch (e.type) {
          case EventType::kConnectRequest:
            if (pick(4))
              (void)m.accept(e.id, AcceptParams{.qpn = 0x80});
            else
              (void)m.reject(e.id, RejectParams{});
            break;
          case EventType::kConnectResponse:
            (void)m.establish(e.id);
            break;
          case EventType::kEstablished:
          case EventType::kDisconnected:
            if (pick(2)) (void)m.disconnect(e.id);
            break;
          case EventType::kSidrRequest:
            (void)m.sidr_answer(e.id, SidrAnswerParams{});
            break;
          default:
            break;
        }
      }
    }
  }

  void inject_mutated() {
    const auto& sent = link_.sent();
    if (sent.empty()) return inject_made_up();
    Mad mad = sent[pick(sent.size())].out.mad;
    const int mutations = static_cast<int>(pick(4));
    for (int i = 0; i < mutations; ++i) {
      switch (pick(4)) {
        case 0: {  // another comm ID in the local or remote field
          const ConnId id = some_id(host());
          wire::store_be32(mad.data() + wire::kCm + 4 * pick(2), id);
          break;
        }
        case 1:  // another message
          wire::store_be16(mad.data() + 16, static_cast<uint16_t>(0x10 + pick(11)));
          break;
        case 2:
          mad[wire::kCm + pick(wire::kMadDataSize)] ^= static_cast<uint8_t>(1u << pick(8));
          break;
        default:
          mad[pick(wire::kMadSize)] = static_cast<uint8_t>(rng_.next());
          break;
      }
    }
    deliver(mad, pick(10) == 0 ? pick(wire::kMadSize) : wire::kMadSize);
  }

  void inject_made_up() {
    Mad mad{};
    wire::init_cm_mad(std::span<uint8_t, wire::kMadSize>(mad), wire::MadMethod::kSend,
                      static_cast<uint16_t>(0x10 + pick(11)), rng_.next());
    for (size_t i = wire::kCm; i < wire::kMadSize; ++i)
      mad[i] = pick(3) ? 0 : static_cast<uint8_t>(rng_.next());
    wire::store_be32(mad.data() + wire::kCm, some_id(host()));
    wire::store_be32(mad.data() + wire::kCm + 4, some_id(host()));
    if (pick(2)) wire::store_be64(mad.data() + wire::kCm + 8, kSids[pick(std::size(kSids))]);
    deliver(mad, wire::kMadSize);
  }

  void deliver(const Mad& mad, size_t len) {
    const size_t to = host();
    link_.m(to).receive(gids_[pick(3) ? 1 - to : to], wire::kMadGsiQpn,
                        std::span<const uint8_t>(mad.data(), len));
  }

  net::Xoshiro256 rng_;
  test::Link link_;
  Gid gids_[2];
  std::vector<ConnId> ids_[2];
  size_t checked_[2] = {0, 0};
  test::EventOrder order_;

 public:
  std::map<EventType, int> reach_events_;
};

TEST(CmRandom, RandomMadsAndCallsKeepEveryConnectionsEventsInOrder) {
  Fuzzer::Reach reach;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Fuzzer f(seed);
    for (int i = 0; i < 300; ++i) f.step();
    f.add_reach(reach);
    for (const auto& [type, n] : f.reach_events_) reach.events[type] += n;
    if (HasFailure()) {
      ADD_FAILURE() << "replay: seed " << seed;
      return;
    }
  }
  // The runs went everywhere: every event, duplicates, stale connections, garbage.
  for (EventType t :
       {EventType::kConnectRequest, EventType::kConnectResponse, EventType::kEstablished,
        EventType::kRejected, EventType::kUnreachable, EventType::kDisconnected,
        EventType::kTimewaitExit, EventType::kSidrRequest, EventType::kSidrResponse}) {
    EXPECT_GT(reach.events[t], 0) << event_name(t);
  }
  EXPECT_GT(reach.duplicates, 0u);
  EXPECT_GT(reach.stale, 0u);
  EXPECT_GT(reach.malformed, 0u);
  EXPECT_GT(reach.unmatched, 0u);
  EXPECT_GT(reach.retransmitted, 0u);
  std::string summary;
  for (const auto& [type, n] : reach.events)
    summary += std::string(event_name(type)) + " " + std::to_string(n) + ", ";
  RecordProperty("reach", summary);
  std::printf(
      "reach: %sduplicates %llu, stale %llu, malformed %llu, unmatched %llu, "
      "retransmitted %llu\n",
      summary.c_str(), static_cast<unsigned long long>(reach.duplicates),
      static_cast<unsigned long long>(reach.stale),
      static_cast<unsigned long long>(reach.malformed),
      static_cast<unsigned long long>(reach.unmatched),
      static_cast<unsigned long long>(reach.retransmitted));
}

}  // namespace
}  // namespace urdma::cm
