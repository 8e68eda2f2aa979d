// A reference execution of a scenario: what a perfect RDMA device on a perfect network leaves
// behind — every WR executed at once, in posting order, every completion correct, every byte
// where it belongs, then the final drain flushing the receives left over.
//
// It is the checker's test oracle: check(scenario, oracle_run(scenario)) must report nothing
// for every seed (no false alarms), and each hand-made corruption of such a run must be
// reported as the property it breaks (checker_test.cc). It knows nothing about packets.
#pragma once

#include "sim/checker.h"
#include "sim/scenario.h"

namespace urdma::sim {

RunRecord oracle_run(const Scenario& scenario);

}  // namespace urdma::sim
