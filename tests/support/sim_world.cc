#include "support/sim_world.h"

#include "base/check.h"

#include <algorithm>
#include <array>

namespace urdma::net {
namespace {

constexpr std::array<const char*, 4> kOutcomeNames = {"done", "deadline", "idle", "step-limit"};
constexpr size_t kMaxParticipants = 1024;

}  // namespace

const char* to_string(RunOutcome outcome) {
  return kOutcomeNames[static_cast<size_t>(outcome)];
}

SimWorld::SimWorld(SimOptions options, uint64_t start_ns)
    : clock_(start_ns), network_(clock_, std::move(options)) {}

void SimWorld::add_participant(SimParticipant& participant, std::optional<HostId> host) {
  base::check(participants_.size() < kMaxParticipants, "too many participants");
  base::check(!host || *host < network_.host_count(), "participant on an unknown host");
  participants_.push_back(Entry{&participant, host});
}

bool SimWorld::wants_poll(const Entry& e, uint64_t now_ns) const {
  return e.participant->next_deadline_ns() <= now_ns ||
         (e.host && network_.rx_pending(*e.host) > 0);
}

uint64_t SimWorld::next_event_ns() const {
  uint64_t t = network_.next_event_ns();
  for (const Entry& e : participants_) {
    t = std::min(t, e.participant->next_deadline_ns());
    if (e.host && network_.rx_pending(*e.host) > 0) t = std::min(t, clock_.now_ns());
  }
  return t;
}

RunOutcome SimWorld::run_until(const std::function<bool()>& done, uint64_t deadline_ns,
                               uint64_t max_steps) {
  for (uint64_t step = 0;; ++step) {
    if (done()) return RunOutcome::kDone;
    if (step >= max_steps) return RunOutcome::kStepLimit;
    const uint64_t now = clock_.now_ns();
    const uint64_t next = next_event_ns();
    if (next == kNever) return RunOutcome::kIdle;
    if (next > deadline_ns) {
      if (deadline_ns > now) clock_.set(deadline_ns);
      return RunOutcome::kDeadline;
    }
    if (next > now) clock_.set(next);
    ++steps_;
    network_.deliver_due();
    const uint64_t at = clock_.now_ns();
    for (const Entry& e : participants_)
      if (wants_poll(e, at)) e.participant->poll(at);
  }
}

}  // namespace urdma::net
