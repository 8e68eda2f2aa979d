// Device limits as large as Linux rxe's (6.1) where the device can honour them, and honoured:
// the numbers ibv_query_device reports are the ones the issue quotes from rxe (written out
// here, not read back from limits.h), tables past their old preallocated sizes hand out
// working objects, and a QP, SRQ or CQ at the largest depth is created without touching memory
// it has not used yet.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <new>
#include <set>
#include <vector>

#include "provider/device.h"
#include "provider/object_table.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

class LimitsTest : public ProviderTest {};

TEST_F(LimitsTest, DeviceReportsRxesLimitsExceptMaxQpAndMaxCqe) {
  const ibv_device_attr& a = dev_.attr();
  EXPECT_EQ(a.max_qp_wr, 1 << 20);
  EXPECT_EQ(a.max_srq_wr, 1 << 20);
  EXPECT_EQ(a.max_mr, 524287);
  EXPECT_EQ(a.max_pd, 1 << 20);
  EXPECT_EQ(a.max_ah, 32767);
  EXPECT_EQ(a.max_sge, 32);
  EXPECT_EQ(a.max_srq_sge, 27);
  // ConnectX's (mlx5), not rxe's 32767: libfabric's ofi_rxm asks for 262144 by default.
  EXPECT_EQ(a.max_cqe, 4194303);
  EXPECT_EQ(a.max_qp_rd_atom, 128);
  EXPECT_GE(a.max_cq, 1 << 20);
  EXPECT_GE(a.max_srq, 1 << 20);
  EXPECT_GE(a.max_mw, 524287);
  // The one smaller number: a process's share of the host's QPN space (docs/COMPATIBILITY.md).
  EXPECT_EQ(a.max_qp, 4096);
  ibv_port_attr port = {};
  ASSERT_EQ(dev_.query_port(1, &port), kOk);
  EXPECT_EQ(port.gid_tbl_len, 1024);
  ibv_gid gid = {};
  EXPECT_EQ(dev_.query_gid(1, 1023, &gid), kOk);  // the last index exists (empty: all zero)
  EXPECT_EQ(dev_.query_gid(1, 1024, &gid).error(), EINVAL);
}

TEST_F(LimitsTest, MorePdsAhsAndMrsThanAFixedTableWouldHoldAllWork) {
  // One past 4096 PDs and AHs and 16384 MRs, the sizes of fixed tables, all live at once.
  std::vector<Pd*> pds;
  for (int i = 0; i < 4097; ++i) {
    Result<Pd*> pd = dev_.alloc_pd();
    ASSERT_TRUE(pd.ok()) << i << ": " << pd.error();
    pds.push_back(pd.value());
  }
  std::set<uint32_t> handles;
  for (Pd* pd : pds) handles.insert(pd->handle());
  EXPECT_EQ(handles.size(), pds.size());

  std::vector<Ah*> ahs;
  for (int i = 0; i < 4097; ++i) {
    Result<Ah*> ah = dev_.create_ah(pd(), global_ah_attr(ipv4_gid(10, 0, i >> 8, i & 0xff)));
    ASSERT_TRUE(ah.ok()) << i << ": " << ah.error();
    ahs.push_back(ah.value());
  }
  for (Ah* ah : ahs) ASSERT_EQ(dev_.destroy_ah(ah), kOk);

  // MRs: each one names its own 8 bytes; the first one's pointer and key stay good while the
  // table grows chunk after chunk (Mr* must never move: the engine holds them).
  constexpr uint32_t kMrs = 16385;
  std::vector<uint64_t> memory(kMrs);
  std::vector<Mr*> mrs;
  std::set<uint32_t> keys;
  for (uint32_t i = 0; i < kMrs; ++i) {
    Result<Mr*> mr = dev_.reg_mr(pd(), &memory[i], 8, reinterpret_cast<uintptr_t>(&memory[i]),
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_TRUE(mr.ok()) << i << ": " << mr.error();
    mrs.push_back(mr.value());
    keys.insert(mr.value()->rkey());
  }
  EXPECT_EQ(keys.size(), kMrs) << "every live MR has its own key";
  for (uint32_t i = 0; i < kMrs; i += 997) {
    const MemRef ref =
        dev_.mr_table().lookup_remote(mrs[i]->rkey(), pd(), 0, IBV_ACCESS_REMOTE_WRITE,
                                      reinterpret_cast<uintptr_t>(&memory[i]), 8);
    ASSERT_TRUE(ref.ok()) << i << ": " << mem_error_name(ref.error);
    EXPECT_EQ(ref.addr, reinterpret_cast<uint8_t*>(&memory[i]));
    EXPECT_EQ(dev_.mr_table().mr_by_handle(mrs[i]->handle()), mrs[i]);
  }
  for (Mr* mr : mrs) ASSERT_EQ(dev_.dereg_mr(mr), kOk);
}

// Resident memory of this process, bytes.
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST_F(LimitsTest, QueuesOfTheLargestDepthCostOnlyWhatTheyUse) {
  const uint64_t before = resident_bytes();
  // Send queue: 2^21 slots of a SendWqe plus its 16-byte side area; receive queue and SRQ:
  // 2^21 slots each. Touched, that is hundreds of MiB.
  Qp* qp = make_qp(IBV_QPT_RC, nullptr, {1u << 20, 1u << 20, 1, 1, 0});
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->cap().max_send_wr, (1u << 21) - 1);  // rings of 2^k - 1, as rxe rounds
  EXPECT_EQ(qp->cap().max_recv_wr, (1u << 21) - 1);
  Result<Srq*> srq = dev_.create_srq(pd(), {1u << 20, 1, 0});
  ASSERT_TRUE(srq.ok()) << srq.error();
  // CQ: 2^22 slots of a 48-byte ibv_wc (192 MiB touched), resized to the largest size again.
  Result<Cq*> cq = dev_.create_cq(static_cast<int>(kLimits.max_cqe));
  ASSERT_TRUE(cq.ok()) << cq.error();
  EXPECT_EQ(cq.value()->cqe(), (1u << 22) - 1);
  ASSERT_EQ(cq.value()->resize(kLimits.max_cqe), kOk);
  const uint64_t grown = resident_bytes() - before;
  EXPECT_LT(grown, uint64_t{32} << 20) << "resident memory grew by " << (grown >> 20) << " MiB";

  // And they work: WRs posted to both queues are held.
  drive(qp, IBV_QPS_INIT);
  std::vector<uint8_t> buf(4096);
  Mr* mr = dev_.reg_mr(pd(), buf.data(), buf.size(), reinterpret_cast<uintptr_t>(buf.data()),
                       IBV_ACCESS_LOCAL_WRITE)
               .value();
  ibv_sge sge = {reinterpret_cast<uintptr_t>(buf.data()), 64, mr->lkey()};
  for (uint64_t id = 1; id <= 1000; ++id) {
    ibv_recv_wr wr = {};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(qp->post_recv(&wr, &bad), kOk);
    ASSERT_EQ(srq.value()->post_recv(&wr, &bad), kOk);
  }
  EXPECT_EQ(qp->rq_size(), 1000u);
  EXPECT_EQ(srq.value()->size(), 1000u);
  // The CQ holds completions, in order.
  for (uint64_t id = 1; id <= 1000; ++id) {
    ibv_wc wc = {};
    wc.wr_id = id;
    ASSERT_TRUE(cq.value()->push_st(wc, false));
  }
  std::vector<ibv_wc> wcs(2000);
  ASSERT_EQ(cq.value()->poll(2000, wcs.data()), 1000);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[999].wr_id, 1000u);
}

// ObjectTable on its own: handle order, the bound, and memory running out.
struct Obj {
  Obj(uint32_t h, bool fail) : handle_(h) {
    if (fail) throw std::bad_alloc();
  }
  uint32_t handle() const { return handle_; }
  uint32_t handle_;
};

TEST(ObjectTable, FreshHandlesFirstThenTheFreedOnesOldestFirstUpToTheBound) {
  ObjectTable<Obj> table(4);
  std::vector<Obj*> objs;
  for (uint32_t i = 0; i < 4; ++i) {
    objs.push_back(table.create(false).value());
    EXPECT_EQ(objs.back()->handle(), i);
  }
  EXPECT_EQ(table.create(false).error(), ENOMEM);
  table.destroy(objs[2]);
  table.destroy(objs[0]);
  EXPECT_EQ(table.get(2), nullptr);
  EXPECT_EQ(table.create(false).value()->handle(), 2u);
  EXPECT_EQ(table.create(false).value()->handle(), 0u);
  EXPECT_EQ(table.live_count(), 4u);

  ObjectTable<Obj> lazy(3);
  Obj* a = lazy.create(false).value();
  lazy.destroy(a);
  // Handle 0 was freed, but 1 and 2 were never used: they come first.
  EXPECT_EQ(lazy.create(false).value()->handle(), 1u);
  EXPECT_EQ(lazy.create(false).value()->handle(), 2u);
  EXPECT_EQ(lazy.create(false).value()->handle(), 0u);
}

TEST(ObjectTable, OutOfMemoryIsEnomemAndLosesNoHandle) {
  ObjectTable<Obj> table(2);
  EXPECT_EQ(table.create(true).error(), ENOMEM);
  EXPECT_EQ(table.live_count(), 0u);
  EXPECT_EQ(table.create(false).value()->handle(), 0u);
  EXPECT_EQ(table.create(false).value()->handle(), 1u);
  table.destroy(table.get(0));
  EXPECT_EQ(table.create(true).error(), ENOMEM);
  EXPECT_EQ(table.create(false).value()->handle(), 0u) << "the freed handle is still free";
}

}  // namespace
}  // namespace urdma::provider::testing
