// Exported calls librdmacm.so.1 has but urdma does not build, each with rdma-core's error for an
// unsupported operation: ECE (EOPNOTSUPP), rsockets (-1, errno ENOSYS).

#include "cm/librdmacm/process.h"

#include <rdma/rdma_cma.h>

#include <cerrno>

using namespace urdma::rdmacm;

URDMA_EXPORT int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}

URDMA_EXPORT int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}

// rsockets (rdma/rsocket.h): not built. Each sets errno ENOSYS and returns -1.
#define URDMA_RSOCKET_STUB(name) \
  URDMA_EXPORT long name(...) {  \
    return fail(ENOSYS);         \
  }

extern "C" {

URDMA_RSOCKET_STUB(rsocket)

URDMA_RSOCKET_STUB(rbind)

URDMA_RSOCKET_STUB(rlisten)

URDMA_RSOCKET_STUB(raccept)

URDMA_RSOCKET_STUB(rconnect)

URDMA_RSOCKET_STUB(rshutdown)

URDMA_RSOCKET_STUB(rclose)

URDMA_RSOCKET_STUB(rrecv)

URDMA_RSOCKET_STUB(rrecvfrom)

URDMA_RSOCKET_STUB(rrecvmsg)

URDMA_RSOCKET_STUB(rsend)

URDMA_RSOCKET_STUB(rsendto)

URDMA_RSOCKET_STUB(rsendmsg)

URDMA_RSOCKET_STUB(rread)

URDMA_RSOCKET_STUB(rreadv)

URDMA_RSOCKET_STUB(rwrite)

URDMA_RSOCKET_STUB(rwritev)

URDMA_RSOCKET_STUB(rpoll)

URDMA_RSOCKET_STUB(rselect)

URDMA_RSOCKET_STUB(rgetpeername)

URDMA_RSOCKET_STUB(rgetsockname)

URDMA_RSOCKET_STUB(rsetsockopt)

URDMA_RSOCKET_STUB(rgetsockopt)

URDMA_RSOCKET_STUB(rfcntl)

URDMA_RSOCKET_STUB(riomap)

URDMA_RSOCKET_STUB(riounmap)

URDMA_RSOCKET_STUB(riowrite)
}
