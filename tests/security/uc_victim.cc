// The victim of the UC key-guessing attack (security_test.cc): a verbs program written against
// Debian's <infiniband/verbs.h> and linked to Debian's libibverbs like any application, run with
// urdma's libraries first on LD_LIBRARY_PATH.
//
//   urdma_uc_victim LOCAL_IPV4 PEER_IPV4 PEER_QPN
//
// Registers a 4 KiB buffer holding a known pattern with IBV_ACCESS_REMOTE_WRITE and brings a UC
// QP up to PEER_QPN at PEER_IPV4 (from the GID of LOCAL_IPV4). Prints
//   "ready pid=P qpn=Q rkey=K addr=A"
// and waits for SIGUSR1; then prints what became of the buffer:
//   "buffer: changed=N first_changed=I control=0|1"
// N counts the bytes that differ from the pattern outside [kControlOffset, +8), where the test
// writes 8 bytes with the real rkey (the positive control: control=1 when they are there).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kBufferBytes = 4096;
constexpr size_t kControlOffset = 2048;
constexpr uint8_t kControl[8] = {0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7};

uint8_t pattern(size_t i) {
  return static_cast<uint8_t>(i * 7 + 3);
}

int fail(const char* what) {
  std::printf("error: %s: %s\n", what, std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LOCAL_IPV4 PEER_IPV4 PEER_QPN\n", argv[0]);
    return 2;
  }
  ibv_gid local{}, peer{};
  local.raw[10] = local.raw[11] = peer.raw[10] = peer.raw[11] = 0xff;
  if (inet_pton(AF_INET, argv[1], local.raw + 12) != 1 ||
      inet_pton(AF_INET, argv[2], peer.raw + 12) != 1)
    return 2;
  const uint32_t peer_qpn = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 0));

  // SIGUSR1 is taken by sigwait below; blocked before any thread of the library starts.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);

  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return fail("ibv_get_device_list");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (!ctx) return fail("ibv_open_device");
  int gid_index = -1;
  for (int i = 0; i < 16 && gid_index < 0; ++i) {
    ibv_gid g;
    if (ibv_query_gid(ctx, 1, i, &g) == 0 && std::memcmp(g.raw, local.raw, 16) == 0) gid_index = i;
  }
  if (gid_index < 0) return fail("no GID for the local address");

  ibv_pd* pd = ibv_alloc_pd(ctx);
  auto* buf = static_cast<uint8_t*>(aligned_alloc(4096, kBufferBytes));
  for (size_t i = 0; i < kBufferBytes; ++i) buf[i] = pattern(i);
  ibv_mr* mr = ibv_reg_mr(pd, buf, kBufferBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!pd || !mr) return fail("ibv_reg_mr");
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_UC;
  init.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1};
  ibv_qp* qp = cq ? ibv_create_qp(pd, &init) : nullptr;
  if (!qp) return fail("ibv_create_qp");

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return fail("INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer_qpn;
  a.rq_psn = 0;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
    return fail("RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return fail("RTS");

  std::printf("ready pid=%d qpn=%u rkey=%u addr=%llu\n", static_cast<int>(getpid()), qp->qp_num,
              mr->rkey, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buf)));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&usr1, &sig);

  size_t changed = 0, first_changed = kBufferBytes;
  for (size_t i = 0; i < kBufferBytes; ++i) {
    if (i >= kControlOffset && i < kControlOffset + sizeof kControl) continue;
    if (buf[i] != pattern(i)) {
      ++changed;
      if (first_changed == kBufferBytes) first_changed = i;
    }
  }
  const bool control = std::memcmp(buf + kControlOffset, kControl, sizeof kControl) == 0;
  std::printf("buffer: changed=%zu first_changed=%zu control=%d\n", changed, first_changed,
              control ? 1 : 0);
  std::fflush(stdout);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  free(buf);
  return 0;
}
