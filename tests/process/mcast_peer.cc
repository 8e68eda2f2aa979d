// One side of the multicast process tests (multicast_test.cc), built like any verbs program
// (Debian's headers and libibverbs; run on ours through LD_LIBRARY_PATH):
//
//   mcast_peer recv GROUP LOCAL COUNT SEED [detach]
//       a UD QP attached to the IPv4 group GROUP (detached again before "ready" with `detach`),
//       COUNT receives posted; prints "ready", then waits up to 5 s for COUNT datagrams and
//       prints "received N checked M" (M: payload and GRH as the sender made them) and exits 0.
//   mcast_peer send GROUP LOCAL COUNT SEED
//       COUNT datagrams to GROUP, DestQP 0xFFFFFF, from the GID of address LOCAL; prints
//       "sent N" once every send completed.
//
// Datagram i carries i (4 bytes) then kBytes - 4 bytes of a pattern seeded by SEED and i, so a
// receiver checks each one without the sender's help.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr size_t kBytes = 1000;
constexpr size_t kGrh = 40;

void fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
}

int die(const char* what) {
  std::fprintf(stderr, "mcast_peer: %s: %s\n", what, std::strerror(errno));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: mcast_peer recv|send GROUP LOCAL COUNT SEED [detach]\n");
    return 2;
  }
  const std::string mode = argv[1];
  in_addr group{}, local{};
  if (inet_pton(AF_INET, argv[2], &group) != 1 || inet_pton(AF_INET, argv[3], &local) != 1)
    return 2;
  const int count = std::atoi(argv[4]);
  const uint64_t seed = std::strtoull(argv[5], nullptr, 0);
  const bool detach = argc > 6 && std::string(argv[6]) == "detach";
  setvbuf(stdout, nullptr, _IOLBF, 0);

  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return die("no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (!ctx) return die("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 2 * count + 2, nullptr, nullptr, 0);
  if (!pd || !cq) return die("pd/cq");
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = static_cast<uint32_t>(count + 1);
  ia.cap.max_recv_wr = static_cast<uint32_t>(count + 1);
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) return die("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kQkey;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return die("INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return die("RTR");
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return die("RTS");

  ibv_gid gid{};
  gid.raw[10] = gid.raw[11] = 0xff;
  std::memcpy(gid.raw + 12, &group, 4);
  std::vector<uint8_t> buf(static_cast<size_t>(count) * (kGrh + kBytes));
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return die("ibv_reg_mr");

  if (mode == "recv") {
    if (ibv_attach_mcast(qp, &gid, 0)) return die("ibv_attach_mcast");
    if (detach && ibv_detach_mcast(qp, &gid, 0)) return die("ibv_detach_mcast");
    for (int i = 0; i < count; ++i) {
      ibv_sge s{reinterpret_cast<uintptr_t>(buf.data() + static_cast<size_t>(i) * (kGrh + kBytes)),
                static_cast<uint32_t>(kGrh + kBytes), mr->lkey};
      ibv_recv_wr w{}, *bad = nullptr;
      w.wr_id = static_cast<uint64_t>(i);
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_recv(qp, &w, &bad)) return die("ibv_post_recv");
    }
    std::printf("ready\n");
    int received = 0, checked = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    std::vector<uint8_t> want(kBytes - 4);
    while (received < count && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) != 1) continue;
      ++received;
      if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != kGrh + kBytes ||
          !(wc.wc_flags & IBV_WC_GRH))
        continue;
      const uint8_t* m = buf.data() + wc.wr_id * (kGrh + kBytes);
      uint32_t index;
      std::memcpy(&index, m + kGrh, 4);
      fill(want.data(), want.size(), seed + index);
      // The IPv4 header in the GRH area (bytes 20..39): destination = the group.
      if (std::memcmp(m + kGrh + 4, want.data(), want.size()) == 0 &&
          std::memcmp(m + 20 + 16, &group, 4) == 0)
        ++checked;
    }
    std::printf("received %d checked %d\n", received, checked);
    if (!detach) ibv_detach_mcast(qp, &gid, 0);
  } else {
    int sgid_index = -1;
    for (int i = 0; i < 1024 && sgid_index < 0; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(ctx, 1, i, &g) == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff &&
          std::memcmp(g.raw + 12, &local, 4) == 0)
        sgid_index = i;
    }
    if (sgid_index < 0) return die("no GID for LOCAL");
    ibv_ah_attr ah_attr{};
    ah_attr.is_global = 1;
    ah_attr.port_num = 1;
    ah_attr.grh.dgid = gid;
    ah_attr.grh.sgid_index = static_cast<uint8_t>(sgid_index);
    ah_attr.grh.hop_limit = 1;
    ibv_ah* ah = ibv_create_ah(pd, &ah_attr);
    if (!ah) return die("ibv_create_ah");
    for (int i = 0; i < count; ++i) {
      uint8_t* m = buf.data() + static_cast<size_t>(i) * kBytes;
      const uint32_t index = static_cast<uint32_t>(i);
      std::memcpy(m, &index, 4);
      fill(m + 4, kBytes - 4, seed + index);
      ibv_sge s{reinterpret_cast<uintptr_t>(m), static_cast<uint32_t>(kBytes), mr->lkey};
      ibv_send_wr w{}, *bad = nullptr;
      w.wr_id = index;
      w.opcode = IBV_WR_SEND;
      w.sg_list = &s;
      w.num_sge = 1;
      w.send_flags = IBV_SEND_SIGNALED;
      w.wr.ud.ah = ah;
      w.wr.ud.remote_qpn = 0xFFFFFF;
      w.wr.ud.remote_qkey = kQkey;
      if (ibv_post_send(qp, &w, &bad)) return die("ibv_post_send");
    }
    int done = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (done < count && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc;
      if (ibv_poll_cq(cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS) ++done;
    }
    std::printf("sent %d\n", done);
    ibv_destroy_ah(ah);
  }
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
