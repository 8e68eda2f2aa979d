// The extended CQ API: ibv_create_cq_ex and the ibv_cq_ex polling interface
// (ibv_start_poll / ibv_next_poll / ibv_end_poll and the ibv_wc_read_* accessors).
//
// Not implemented yet: create_cq_ex (verbs_context.create_cq_ex) fails with EOPNOTSUPP, which
// ibv_create_cq_ex(3) callers treat as "the device has no extended CQs". The layouts and helpers
// this will build on are in internal.h (Cq, CqExState, create_cq_common).
#include <cerrno>

#include "verbs/internal.h"

namespace urdma::verbs {

ibv_cq_ex* create_cq_ex(ibv_context* /*context*/, ibv_cq_init_attr_ex* /*attr*/) {
  return fail<ibv_cq_ex>(EOPNOTSUPP);
}

}  // namespace urdma::verbs
