// One engine on the in-memory wire: a Device whose doorbell reaches the Engine, the Engine on a
// MemoryIo under a VirtualClock, a PD and a CQ. What every program that hand-feeds datagrams to
// an engine starts from: the protocol tests (tests/unit/engine/protocol_test_util.h), the
// reference replay, the engine fuzz target.
//
//   test::MemoryHost h(test::device_config(nullptr, address, IBV_MTU_4096));
//   h.io.deliver(bytes, from, to);  h.engine.poll();  h.io.sent ...  h.clock.advance(ns);
#pragma once

#include "engine/engine.h"
#include "net/clock.h"
#include "provider/device.h"
#include "support/memory_io.h"

namespace urdma::test {

struct MemoryHost {
  // `device`'s doorbell is replaced by the relay to the engine.
  explicit MemoryHost(provider::DeviceConfig device, engine::EngineConfig engine_config = {},
                      int cq_entries = 256);
  MemoryHost(const MemoryHost&) = delete;
  MemoryHost& operator=(const MemoryHost&) = delete;

  net::VirtualClock clock;
  MemoryIo io;
  engine::DoorbellRelay relay;
  provider::Device dev;
  engine::Engine engine;
  provider::Pd* pd = nullptr;
  provider::Cq* cq = nullptr;

 private:
  static provider::DeviceConfig wired(provider::DeviceConfig c, provider::Doorbell* doorbell) {
    c.doorbell = doorbell;
    return c;
  }
};

}  // namespace urdma::test
