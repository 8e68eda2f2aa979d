// One engine on the in-memory wire; see memory_host.h.
#include "support/memory_host.h"

#include <utility>

#include "base/check.h"

namespace urdma::test {

MemoryHost::MemoryHost(provider::DeviceConfig device, engine::EngineConfig engine_config,
                       int cq_entries)
    : dev(wired(std::move(device), &relay)), engine(dev, io, clock, engine_config) {
  auto p = dev.alloc_pd();
  base::check(p.ok(), "alloc_pd");
  pd = p.value();
  auto c = dev.create_cq(cq_entries);
  base::check(c.ok(), "create_cq");
  cq = c.value();
}

}  // namespace urdma::test
