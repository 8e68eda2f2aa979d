// The driver of a simulation: one VirtualClock, one SimNetwork, and the participants (engines,
// test hosts) that run on them. Time only moves here, always straight to the next event, so a
// simulated second of an idle network costs nothing and no test ever waits on real time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "net/clock.h"
#include "support/sim_network.h"

namespace urdma::net {

// Anything that runs under the simulation: an engine, or a test host.
class SimParticipant {
 public:
  virtual ~SimParticipant() = default;
  // The next virtual time at which it must be polled even if no datagram arrives (a timer);
  // kNever if only arriving datagrams can wake it. A time <= now means "poll again at once".
  virtual uint64_t next_deadline_ns() const = 0;
  // Does its work at `now_ns`: read datagrams, send, fire timers. Must not block.
  virtual void poll(uint64_t now_ns) = 0;
};

enum class RunOutcome : uint8_t {
  kDone,       // the predicate became true
  kDeadline,   // the next event lies beyond the deadline; the clock now reads the deadline
  kIdle,       // nothing is in flight and no participant has a deadline: nothing can ever happen
  kStepLimit,  // max_steps events ran without the predicate becoming true (a livelock guard)
};
const char* to_string(RunOutcome outcome);

class SimWorld {
 public:
  static constexpr uint64_t kDefaultMaxSteps = 10'000'000;

  explicit SimWorld(SimOptions options, uint64_t start_ns = 0);

  VirtualClock& clock() { return clock_; }
  SimNetwork& network() { return network_; }

  // Registers a participant (not owned; it must outlive the world's runs). With `host`, it is
  // also polled whenever that host has datagrams waiting. Participants are polled in the order
  // they were added.
  void add_participant(SimParticipant& participant, std::optional<HostId> host = std::nullopt);

  // Repeats: if done() → kDone; find the earliest event (an in-flight delivery, a participant's
  // deadline, or datagrams already waiting for a participant's host); move the clock to it;
  // deliver what is due; poll each participant whose deadline has come or whose host has
  // datagrams waiting. See RunOutcome for how it ends.
  RunOutcome run_until(const std::function<bool()>& done, uint64_t deadline_ns,
                       uint64_t max_steps = kDefaultMaxSteps);

  // Runs until nothing is left to do or until `deadline_ns`.
  RunOutcome run_until_idle(uint64_t deadline_ns, uint64_t max_steps = kDefaultMaxSteps) {
    return run_until([] { return false; }, deadline_ns, max_steps);
  }

  uint64_t steps() const { return steps_; }

 private:
  struct Entry {
    SimParticipant* participant;
    std::optional<HostId> host;
  };
  bool wants_poll(const Entry& e, uint64_t now_ns) const;
  uint64_t next_event_ns() const;

  VirtualClock clock_;
  SimNetwork network_;
  std::vector<Entry> participants_;
  uint64_t steps_ = 0;
};

}  // namespace urdma::net
