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
// Header fields of the trace the oracle makes up (IBA 9.2 table 35, 9.3.5 table 45).
constexpr uint8_t kOracleRequestOpcode = 0x04;   // RC SEND Only
constexpr uint8_t kOracleAckOpcode = 0x11;       // RC Acknowledge
constexpr uint8_t kOracleRnrNakSyndrome = 0x21;  // RNR NAK, timer code 1

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
    qp_err_.assign(s_.qps.size(), false);
    blocked_.assign(s_.qps.size(), false);
    ok_.assign(s_.sends.size(), false);
    next_psn_.clear();
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      next_psn_.push_back(s_.qps[q].sq_psn);
      if (s_.qps[q].dead) enter_err(q, 0);  // moved to ERR before anything was posted
    }
    uint64_t now = 0;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      now = std::max(now, w.post_ns);
      // As the runner: a WR whose dependency did not succeed is never posted, nor anything
      // after it on its QP.
      if (w.after != kNone && !ok_[w.after]) blocked_[w.qp] = true;
      if (blocked_[w.qp]) continue;
      run_.send_posted_ns[i] = w.post_ns;
      execute(i, now);
    }
    run_.finished = true;
    for (const RecvSpec& v : s_.recvs) now = std::max(now, v.post_ns);
    run_.drain_ns = std::max(now, latest_ns_) + 1;
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
    latest_ns_ = std::max(latest_ns_, time);
  }

  // A send completion with an error status: the QP enters ERR and flushes from now on.
  void fail(size_t i, uint64_t now, ibv_wc_status status) {
    const SendSpec& w = s_.sends[i];
    ibv_wc wc = {};
    wc.wr_id = kWrIdSend | i;
    wc.status = status;
    wc.qp_num = run_.qp_num[w.qp];
    complete(now, s_.qps[w.qp].host, false, wc);
    enter_err(w.qp, now);
  }

  // An RC QP in ERR flushes its receive queue at once (IBA 10.3.1.6).
  void enter_err(uint32_t q, uint64_t now) {
    qp_err_[q] = true;
    if (s_.qps[q].type != IBV_QPT_RC) return;
    for (size_t r : own_rq_[q]) {
      ibv_wc wc = {};
      wc.wr_id = kWrIdRecv | r;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.qp_num = run_.qp_num[q];
      complete(std::max(now, s_.recvs[r].post_ns), s_.qps[q].host, true, wc);
    }
    own_rq_[q].clear();
  }

  // The trace a perfect network shows for a request nobody answers: retry_cnt + 1
  // transmissions of its first PSN, none delivered (the checker's evidence rule).
  void unanswered(size_t i, uint64_t now) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    for (uint32_t k = 0; k <= q.retry_cnt; ++k) {
      TracedDatagram d;
      d.src_host = q.host;
      d.dst_host = s_.qps[q.peer].host;
      d.sent_ns = now;
      d.opcode = kOracleRequestOpcode;
      d.dest_qpn = run_.qp_num[q.peer];
      d.psn = next_psn_[w.qp];
      run_.datagrams.push_back(d);
    }
  }
  // ... and for a SEND that finds no receive: rnr_retry + 1 RNR NAKs, each delivered.
  void receiver_not_ready(size_t i, uint64_t now) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    for (uint32_t k = 0; k <= q.rnr_retry; ++k) {
      TracedDatagram d;
      d.src_host = s_.qps[q.peer].host;
      d.dst_host = q.host;
      d.sent_ns = now;
      d.opcode = kOracleAckOpcode;
      d.dest_qpn = run_.qp_num[w.qp];
      d.psn = next_psn_[w.qp];
      d.has_aeth = true;
      d.syndrome = kOracleRnrNakSyndrome;
      d.delivered_ns = {now};
      run_.datagrams.push_back(d);
    }
  }

  uint32_t packets(const SendSpec& w) const {
    const QpSpec& q = s_.qps[w.qp];
    if (op_info(w.op).local) return 0;
    if (op_info(w.op).atomic || q.type == IBV_QPT_UD || w.length() == 0) return 1;
    static constexpr uint32_t kMtu[] = {0, 256, 512, 1024, 2048, 4096};
    return static_cast<uint32_t>((w.length() + kMtu[q.mtu] - 1) / kMtu[q.mtu]);
  }

  void execute(size_t i, uint64_t now) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    const OpInfo& info = op_info(w.op);
    if (qp_err_[w.qp]) {
      fail(i, now, IBV_WC_WR_FLUSH_ERR);
      return;
    }
    const bool peer_err = q.type == IBV_QPT_RC && !info.local && qp_err_[q.peer];
    if (w.fault != Fault::kNone || peer_err) {
      const FaultOutcome o = peer_err ? fault_outcome(Fault::kDeadPeer) : fault_outcome(w.fault);
      if (o.requester == IBV_WC_RETRY_EXC_ERR) unanswered(i, now);
      if (o.requester == IBV_WC_RNR_RETRY_EXC_ERR) receiver_not_ready(i, now);
      if (o.receive) {
        const QpSpec& dst = s_.qps[q.peer];
        std::deque<size_t>& queue = dst.use_srq ? srq_[dst.host] : own_rq_[q.peer];
        base::check(!queue.empty(), "oracle: no receive for a faulted message");
        ibv_wc wc = {};
        wc.wr_id = kWrIdRecv | queue.front();
        wc.status = *o.receive;
        wc.qp_num = run_.qp_num[q.peer];
        queue.pop_front();
        complete(now, dst.host, true, wc);
      }
      if (o.responder_err) enter_err(q.peer, now);
      if (o.requester != IBV_WC_SUCCESS) {
        // Retries take their time: retry_cnt + 1 local ACK timeouts after the first try.
        const uint64_t t = o.requester == IBV_WC_RETRY_EXC_ERR
                               ? now + (uint64_t{q.retry_cnt} + 1) * ack_timeout_ns(q.timeout)
                               : now;
        fail(i, t, o.requester);
        return;
      }
      if (w.fault != Fault::kNone) {  // succeeds at the requester, delivered nowhere
        next_psn_[w.qp] = (next_psn_[w.qp] + packets(w)) & 0xffffff;
        ok_[i] = true;
        if (w.signaled || q.sq_sig_all) {
          ibv_wc wc = {};
          wc.wr_id = kWrIdSend | i;
          wc.status = IBV_WC_SUCCESS;
          wc.opcode = info.wc;
          wc.qp_num = run_.qp_num[w.qp];
          wc.byte_len = static_cast<uint32_t>(w.length());
          complete(now, q.host, false, wc);
        }
        return;
      }
    }
    next_psn_[w.qp] = (next_psn_[w.qp] + packets(w)) & 0xffffff;
    ok_[i] = true;
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
      if (w.window != kNone) wc.invalidated_rkey = run_.window_rkey[w.window];
    }
    if (src.type == IBV_QPT_UD) {
      wc.wc_flags |= IBV_WC_GRH;
      wc.src_qp = run_.qp_num[w.qp];
      wc.byte_len += kGrhBytes;
      const auto grh = ud_grh(src.host, q.host, data.size(), w.op == Op::kSendImm);
      std::vector<uint8_t> stream(grh.begin(), grh.end());
      stream.resize(kGrhBytes + data.size());
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
  std::vector<bool> qp_err_;   // per QP: in ERR (dead, or failed, or a responder that failed)
  std::vector<bool> blocked_;  // per QP: a dependency failed; nothing more is posted
  std::vector<bool> ok_;       // per send: completed successfully
  std::vector<uint32_t> next_psn_;
  uint64_t latest_ns_ = 0;  // the latest completion so far
  std::vector<std::deque<size_t>> own_rq_;
  std::vector<std::deque<size_t>> srq_;
};

}  // namespace

RunRecord oracle_run(const Scenario& scenario) {
  return Oracle(scenario).run();
}

}  // namespace urdma::sim
