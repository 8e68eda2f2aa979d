// Drives an engine::Engine from a net::SimWorld: the engine knows nothing of the simulator, and
// this adapter (test machinery, beside the simulator) is the only place the two meet.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "support/sim_world.h"

namespace urdma::test {

class EngineParticipant final : public net::SimParticipant {
 public:
  explicit EngineParticipant(engine::Engine& engine) : engine_(engine) {}
  uint64_t next_deadline_ns() const override { return engine_.next_deadline_ns(); }
  void poll(uint64_t /*now_ns*/) override { engine_.poll(); }

 private:
  engine::Engine& engine_;
};

}  // namespace urdma::test
