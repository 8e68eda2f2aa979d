// Queue buffers from a QueueAllocator (a parent domain's allocators, queue_memory.h): which
// buffers an object takes from it, with which type and alignment, that the object's rings are
// those buffers, that each goes back to it once, that "use the default" and "no memory" mean
// malloc and ENOMEM; and the CQ's completion timestamps (completion_clock.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <map>
#include <vector>

#include "provider/completion_clock.h"
#include "provider/device.h"
#include "provider/queue_memory.h"
#include "provider_test_util.h"

namespace urdma::provider::testing {
namespace {

// Hands out aligned_alloc memory and remembers every call.
class RecordingAllocator final : public QueueAllocator {
 public:
  enum Mode { kAllocate, kDecline, kFail };
  explicit RecordingAllocator(Mode mode = kAllocate) : mode_(mode) {}
  ~RecordingAllocator() override {
    for (auto& [p, type] : live) std::free(p);
  }

  struct Call {
    size_t bytes, alignment;
    QueueBuffer type;
    void* ptr;
  };
  std::vector<Call> allocations;
  std::map<void*, QueueBuffer> live;
  int releases = 0;
  int bad_releases = 0;  // of a pointer not handed out, or with another type

  Allocation allocate(size_t bytes, size_t alignment, QueueBuffer type) override {
    if (mode_ == kDecline) {
      allocations.push_back({bytes, alignment, type, nullptr});
      return {.ptr = nullptr, .use_default = true};
    }
    // Fail from the second call on: the first buffer of an object exists and must come back.
    if (mode_ == kFail && !allocations.empty()) return {};
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    allocations.push_back({bytes, alignment, type, p});
    live[p] = type;
    return {.ptr = p, .use_default = false};
  }
  void release(void* ptr, QueueBuffer type) override {
    ++releases;
    auto it = live.find(ptr);
    if (it == live.end() || it->second != type) {
      ++bad_releases;
      return;
    }
    std::free(ptr);
    live.erase(it);
  }

  bool handed_out(const void* p, QueueBuffer type) const {
    auto it = live.find(const_cast<void*>(p));
    return it != live.end() && it->second == type;
  }

 private:
  const Mode mode_;
};

class QueueMemoryTest : public ProviderTest {};

TEST_F(QueueMemoryTest, CqRingComesFromTheAllocatorAndGoesBackOnResizeAndDestroy) {
  auto alloc = std::make_shared<RecordingAllocator>();
  Cq* cq = dev_.create_cq(100, CqOptions{.allocator = alloc}).value();
  ASSERT_EQ(alloc->allocations.size(), 1u);
  EXPECT_EQ(alloc->allocations[0].type, QueueBuffer::kCq);
  EXPECT_EQ(alloc->allocations[0].alignment, kQueueBufferAlignment);
  EXPECT_EQ(alloc->allocations[0].bytes, 128 * sizeof(Completion));  // 2^7 slots for 100
  EXPECT_EQ(cq->ring_data(), alloc->allocations[0].ptr);
  // Completions live in that buffer: the wr_id is there after a push.
  ibv_wc wc{};
  wc.wr_id = 0x1122334455667788;
  ASSERT_TRUE(cq->push_st(wc, false));
  EXPECT_EQ(static_cast<const Completion*>(alloc->allocations[0].ptr)[0].wc.wr_id, wc.wr_id);

  ASSERT_TRUE(cq->resize(500).ok());
  ASSERT_EQ(alloc->allocations.size(), 2u);
  EXPECT_EQ(alloc->allocations[1].bytes, 512 * sizeof(Completion));
  EXPECT_EQ(cq->ring_data(), alloc->allocations[1].ptr);
  EXPECT_EQ(alloc->releases, 1);  // the old ring
  ibv_wc out{};
  ASSERT_EQ(cq->poll(1, &out), 1);  // moved over
  EXPECT_EQ(out.wr_id, wc.wr_id);

  ASSERT_TRUE(dev_.destroy_cq(cq).ok());
  EXPECT_EQ(alloc->releases, 2);
  EXPECT_EQ(alloc->bad_releases, 0);
  EXPECT_TRUE(alloc->live.empty());
}

TEST_F(QueueMemoryTest, QpTakesItsSendAndReceiveQueuesFromTheAllocator) {
  auto alloc = std::make_shared<RecordingAllocator>();
  QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd();
  init.send_cq = init.recv_cq = cq();
  init.cap = {16, 16, 4, 4, 64};
  init.allocator = alloc;
  Qp* qp = dev_.create_qp(init).value();
  ASSERT_EQ(alloc->allocations.size(), 4u);  // SQ ring + side area, RQ ring + SGE area
  EXPECT_TRUE(alloc->handed_out(qp->sq_ring_data(), QueueBuffer::kQp));
  EXPECT_TRUE(alloc->handed_out(qp->sq_side_data(), QueueBuffer::kQp));
  EXPECT_TRUE(alloc->handed_out(qp->rq_ring_data(), QueueBuffer::kRq));
  for (const auto& c : alloc->allocations) EXPECT_EQ(c.alignment, kQueueBufferAlignment);

  // A receive WQE is written into the allocator's buffer.
  drive(qp, IBV_QPS_INIT);
  uint8_t buf[8];
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), sizeof buf, 0};
  ibv_recv_wr wr{};
  wr.wr_id = 0xfeedfacecafebeef;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_TRUE(qp->post_recv(&wr, &bad).ok());
  EXPECT_EQ(static_cast<const RecvWqe*>(qp->rq_ring_data())[0].wr_id, wr.wr_id);

  ASSERT_TRUE(dev_.destroy_qp(qp).ok());
  EXPECT_EQ(alloc->releases, 4);
  EXPECT_EQ(alloc->bad_releases, 0);
  EXPECT_TRUE(alloc->live.empty());
}

TEST_F(QueueMemoryTest, SrqQueueComesFromTheAllocatorAlsoAfterAResize) {
  auto alloc = std::make_shared<RecordingAllocator>();
  ibv_srq_attr attr{.max_wr = 8, .max_sge = 2, .srq_limit = 0};
  Srq* srq = dev_.create_srq(pd(), attr, alloc).value();
  ASSERT_EQ(alloc->allocations.size(), 2u);  // ring + SGE area
  EXPECT_TRUE(alloc->handed_out(srq->ring_data(), QueueBuffer::kSrq));
  ibv_srq_attr grow{.max_wr = 100, .max_sge = 0, .srq_limit = 0};
  ASSERT_TRUE(srq->modify(grow, IBV_SRQ_MAX_WR).ok());
  EXPECT_EQ(alloc->allocations.size(), 4u);
  EXPECT_EQ(alloc->releases, 2);
  EXPECT_TRUE(alloc->handed_out(srq->ring_data(), QueueBuffer::kSrq));
  ASSERT_TRUE(dev_.destroy_srq(srq).ok());
  EXPECT_EQ(alloc->releases, 4);
  EXPECT_EQ(alloc->bad_releases, 0);
  EXPECT_TRUE(alloc->live.empty());
}

TEST_F(QueueMemoryTest, ADecliningAllocatorMeansMalloc) {
  auto alloc = std::make_shared<RecordingAllocator>(RecordingAllocator::kDecline);
  Cq* cq = dev_.create_cq(10, CqOptions{.allocator = alloc}).value();
  EXPECT_EQ(alloc->allocations.size(), 1u);  // asked, declined
  EXPECT_NE(cq->ring_data(), nullptr);
  ibv_wc wc{};
  wc.wr_id = 7;
  ASSERT_TRUE(cq->push_st(wc, false));
  ibv_wc out{};
  ASSERT_EQ(cq->poll(1, &out), 1);
  EXPECT_EQ(out.wr_id, 7u);
  ASSERT_TRUE(dev_.destroy_cq(cq).ok());
  EXPECT_EQ(alloc->releases, 0);  // malloc's memory is not the allocator's to free
}

TEST_F(QueueMemoryTest, AnAllocatorWithoutMemoryIsEnomemAndLeaksNothing) {
  auto alloc = std::make_shared<RecordingAllocator>(RecordingAllocator::kFail);
  QpInitAttr init;
  init.qp_type = IBV_QPT_RC;
  init.pd = pd();
  init.send_cq = init.recv_cq = cq();
  init.cap = {16, 16, 4, 4, 64};
  init.allocator = alloc;
  EXPECT_EQ(dev_.create_qp(init).error(), ENOMEM);
  EXPECT_EQ(alloc->allocations.size(), 1u);  // the SQ ring, given back
  EXPECT_EQ(alloc->releases, 1);
  EXPECT_TRUE(alloc->live.empty());
  EXPECT_EQ(pd()->users(), 0u);
  EXPECT_EQ(cq()->users(), 0u);

  auto cq_alloc = std::make_shared<RecordingAllocator>(RecordingAllocator::kFail);
  Cq* small = dev_.create_cq(4, CqOptions{.allocator = cq_alloc}).value();  // the first works
  EXPECT_EQ(small->resize(64).error(), ENOMEM);
  EXPECT_EQ(small->cqe(), 7u);  // unchanged
  ASSERT_TRUE(dev_.destroy_cq(small).ok());
  EXPECT_TRUE(cq_alloc->live.empty());
}

// ---- completion timestamps ----

uint64_t now_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

TEST_F(QueueMemoryTest, AStampingCqStampsEachCompletionWhenPushed) {
  Cq* cq = dev_.create_cq(64, CqOptions{.completion_timestamp = true, .wallclock_timestamp = true})
               .value();
  const uint64_t mono0 = now_ns(CLOCK_MONOTONIC), real0 = now_ns(CLOCK_REALTIME);
  for (uint64_t i = 0; i < 20; ++i) {
    ibv_wc wc{};
    wc.wr_id = i;
    ASSERT_TRUE(cq->push_st(wc, false));
  }
  const uint64_t mono1 = now_ns(CLOCK_MONOTONIC), real1 = now_ns(CLOCK_REALTIME);
  Completion out[20];
  ASSERT_EQ(cq->poll(20, out), 20);
  uint64_t prev = 0;
  for (const Completion& c : out) {
    EXPECT_GE(c.completion_ts, mono0);
    EXPECT_LE(c.completion_ts, mono1);
    EXPECT_GE(c.completion_ts, prev);  // the device clock never goes back
    prev = c.completion_ts;
    // CLOCK_REALTIME may be stepped meanwhile; within the window unless it was.
    EXPECT_GE(c.wallclock_ns, real0);
    EXPECT_LE(c.wallclock_ns, real1);
  }
  // The device clock is what ibv_query_rt_values_ex reads.
  const uint64_t before = now_ns(CLOCK_MONOTONIC);
  const uint64_t device = completion_clock_ns();
  EXPECT_GE(device, before);
  EXPECT_LE(device, now_ns(CLOCK_MONOTONIC));
}

TEST_F(QueueMemoryTest, APlainCqReadsNoClock) {
  Cq* cq = dev_.create_cq(4).value();
  ibv_wc wc{};
  ASSERT_TRUE(cq->push_st(wc, false));
  Completion out{};
  out.completion_ts = out.wallclock_ns = 99;
  ASSERT_EQ(cq->poll(1, &out), 1);
  EXPECT_EQ(out.completion_ts, 0u);
  EXPECT_EQ(out.wallclock_ns, 0u);
}

}  // namespace
}  // namespace urdma::provider::testing
