// One simulated run of a scenario on real engines.
//
// N hosts on one net::SimNetwork driven by a net::SimWorld under virtual time; each host has
// its own provider::Device, engine::Engine (a SimWorld participant), PD, a send CQ and a
// receive CQ shared by all its QPs, an SRQ when the scenario gives it one, and its regions
// (each registered with ibv_reg_mr_iova2-style IOVAs and surrounded by guard bytes). QPs are
// connected exactly as an application does after a CM exchange — RESET→INIT→RTR→RTS through
// provider::Qp::modify with the attribute masks ibv_modify_qp(3) requires — and every WR is
// posted and every completion polled through the provider API, as an application would.
//
// The application's loop: post what is due (by virtual time, and by dependency on an earlier
// WR's successful completion), let the world run until the next thing to post or until a
// completion makes something postable, poll the CQs after every world step (so every
// completion carries the virtual time it appeared), until every posted signaled WR completed;
// then let the network settle, move every QP to ERR (the final drain: every leftover WR must
// flush), snapshot memory and hand everything to the checker.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "engine/engine_counters.h"
#include "support/sim_network.h"
#include "sim/checker.h"
#include "sim/scenario.h"

namespace urdma::sim {

struct RunOptions {
  // Virtual time by which the run must have finished (livelock guard), and world steps.
  uint64_t deadline_ns = 20'000'000'000;
  uint64_t max_steps = 4'000'000;
  // Print every network event and completion (very verbose) to `trace_out`.
  std::ostream* trace_out = nullptr;
};

struct RunResult {
  RunRecord record;
  std::vector<Violation> violations;
  // Hash of everything observable about the run: every network event, every completion with its
  // virtual time, and the final memory. Same seed and options → same hash, in any process.
  uint64_t trace_hash = 0;
  net::SimCounters network;
  std::vector<engine::EngineCounters> engines;
  uint64_t end_ns = 0;
  uint64_t steps = 0;
};

RunResult run_scenario(const Scenario& scenario, const RunOptions& options = {});

// The SimOptions a fault profile maps to (the network's seed is derived from the scenario's).
net::SimOptions sim_options(const Scenario& scenario);

}  // namespace urdma::sim
