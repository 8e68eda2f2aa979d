// The reference execution; see oracle.h.
#include "sim/oracle.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "base/check.h"

namespace urdma::sim {
namespace {

constexpr uint32_t kOracleQpnBase = 0x100;
constexpr uint32_t kOracleRkeyBase = 0xab00'0000;

class Oracle {
 public:
  explicit Oracle(const Scenario& s) : s_(s) {}

  RunRecord run() {
    for (uint32_t r = 0; r < s_.regions.size(); ++r) run_.memory.push_back(s_.initial_image(r));
    for (uint32_t q = 0; q < s_.qps.size(); ++q) run_.qp_num.push_back(kOracleQpnBase + q);
    run_.window_rkey.assign(s_.windows.size(), 0);
    run_.send_posted_ns.resize(s_.sends.size());
    run_.recv_posted_ns.resize(s_.recvs.size());
    own_rq_.resize(s_.qps.size());
    srq_.resize(s_.config.hosts);
    for (size_t i = 0; i < s_.recvs.size(); ++i) {
      const RecvSpec& v = s_.recvs[i];
      run_.recv_posted_ns[i] = v.post_ns;
      (v.qp != kNone ? own_rq_[v.qp] : srq_[v.srq_host]).push_back(i);
    }
    uint64_t now = 0;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      now = std::max(now, s_.sends[i].post_ns);
      run_.send_posted_ns[i] = s_.sends[i].post_ns;
      execute(i, now);
    }
    run_.finished = true;
    run_.drain_ns = now + 1;
    for (uint32_t q = 0; q < s_.qps.size(); ++q) flush(own_rq_[q], s_.qps[q].host, q);
    // SRQ WQEs stay posted: they belong to the SRQ, not to any QP that failed.
    return std::move(run_);
  }

 private:
  uint8_t* at(uint32_t region, uint64_t offset) {
    return run_.memory[region].data() + kGuardBytes + offset;
  }

  std::vector<uint8_t> gather(const std::vector<Sge>& sges) {
    std::vector<uint8_t> out;
    for (const Sge& g : sges)
      out.insert(out.end(), at(g.region, g.offset), at(g.region, g.offset) + g.length);
    return out;
  }
  void scatter(const std::vector<Sge>& sges, const std::vector<uint8_t>& data) {
    uint64_t pos = 0;
    for (const Sge& g : sges) {
      const uint64_t n = std::min<uint64_t>(g.length, data.size() - pos);
      if (n == 0) continue;  // data.data() may be null for an empty message
      std::memcpy(at(g.region, g.offset), data.data() + pos, n);
      pos += n;
    }
    base::check(pos == data.size(), "oracle: receive buffer too small");
  }

  void complete(uint64_t time, uint32_t host, bool recv, ibv_wc wc) {
    run_.completions.push_back(ObservedCompletion{time, host, recv, wc});
  }

  void execute(size_t i, uint64_t now) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    const OpInfo& info = op_info(w.op);
    std::vector<uint8_t> data;
    switch (w.op) {
      case Op::kRead: {
        const uint8_t* src = at(w.remote_region, w.remote_offset);
        scatter(w.sges, std::vector<uint8_t>(src, src + w.length()));
        break;
      }
      case Op::kFetchAdd:
      case Op::kCmpSwp: {
        uint64_t v;
        std::memcpy(&v, at(w.remote_region, w.remote_offset), 8);
        std::memcpy(at(w.sges[0].region, w.sges[0].offset), &v, 8);
        const uint64_t next =
            w.op == Op::kFetchAdd ? v + w.compare_add : (v == w.compare_add ? w.swap : v);
        std::memcpy(at(w.remote_region, w.remote_offset), &next, 8);
        break;
      }
      case Op::kBindMw:
        run_.window_rkey[w.window] = kOracleRkeyBase + w.window;
        break;
      case Op::kLocalInv:
        break;
      default:
        data = gather(w.sges);
        if (info.remote && !data.empty())
          std::memcpy(at(w.remote_region, w.remote_offset), data.data(), data.size());
        if (info.consumes_recv) deliver(i, data, now);
        break;
    }
    if (w.signaled || q.sq_sig_all) {
      ibv_wc wc = {};
      wc.wr_id = kWrIdSend | i;
      wc.status = IBV_WC_SUCCESS;
      wc.opcode = info.wc;
      wc.qp_num = run_.qp_num[w.qp];
      wc.byte_len = info.atomic ? 8 : static_cast<uint32_t>(w.length());
      complete(now, q.host, false, wc);
    }
  }

  void deliver(size_t i, const std::vector<uint8_t>& data, uint64_t now) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& src = s_.qps[w.qp];
    const uint32_t dst = src.type == IBV_QPT_UD ? w.ud_dest : src.peer;
    const QpSpec& q = s_.qps[dst];
    std::deque<size_t>& queue = q.use_srq ? srq_[q.host] : own_rq_[dst];
    base::check(!queue.empty(), "oracle: no receive for a message");
    const size_t r = queue.front();
    queue.pop_front();
    ibv_wc wc = {};
    wc.wr_id = kWrIdRecv | r;
    wc.status = IBV_WC_SUCCESS;
    wc.qp_num = run_.qp_num[dst];
    wc.opcode = w.op == Op::kWriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    wc.byte_len = static_cast<uint32_t>(data.size());
    if (w.op == Op::kSendImm || w.op == Op::kWriteImm) {
      wc.wc_flags |= IBV_WC_WITH_IMM;
      wc.imm_data = w.imm;
    }
    if (w.op == Op::kSendInv) {
      wc.wc_flags |= IBV_WC_WITH_INV;
      wc.invalidated_rkey = run_.window_rkey[w.window];
    }
    if (src.type == IBV_QPT_UD) {
      wc.wc_flags |= IBV_WC_GRH;
      wc.src_qp = run_.qp_num[w.qp];
      wc.byte_len += kGrhBytes;
      std::vector<uint8_t> stream(kGrhBytes + data.size(), 0x45);  // GRH: any content
      if (!data.empty()) std::memcpy(stream.data() + kGrhBytes, data.data(), data.size());
      scatter(s_.recvs[r].sges, stream);
    } else if (w.op != Op::kWriteImm) {
      scatter(s_.recvs[r].sges, data);
    }
    complete(now, q.host, true, wc);
  }

  void flush(std::deque<size_t>& queue, uint32_t host, uint32_t q) {
    for (size_t r : queue) {
      ibv_wc wc = {};
      wc.wr_id = kWrIdRecv | r;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.qp_num = run_.qp_num[q];
      complete(run_.drain_ns, host, true, wc);
    }
    queue.clear();
  }

  const Scenario& s_;
  RunRecord run_;
  std::vector<std::deque<size_t>> own_rq_;
  std::vector<std::deque<size_t>> srq_;
};

}  // namespace

RunRecord oracle_run(const Scenario& scenario) {
  return Oracle(scenario).run();
}

}  // namespace urdma::sim
