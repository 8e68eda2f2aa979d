// The property checker; see checker.h for the properties.
#include "sim/checker.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "base/check.h"

namespace urdma::sim {
namespace {

// Cap on reported violations per run: the first few say what broke, the rest is noise.
constexpr size_t kMaxViolations = 40;
// Mismatching bytes reported per region.
constexpr size_t kMaxByteReports = 3;
// Retry-bound slack beyond the extra timeout: the path's delays and the engine's timer
// granularity.
constexpr uint64_t kRetrySlackNs = 200'000;

// What the checker expects of one byte of memory.
enum class Expect : uint8_t {
  kUntouched,  // must still hold its initial value (guards, gaps, sources, unused counters)
  kExact,      // must hold `expect`
  kOldOrNew,   // the initial value or `expect` (an operation that failed part-way)
  kAny,        // unconstrained (checked elsewhere, or a failed receive)
};

struct Image {
  std::vector<uint8_t> initial;
  std::vector<uint8_t> expect;
  std::vector<Expect> kind;
};

enum class Outcome : uint8_t { kNotPosted, kSuccess, kFailed, kUnknown };

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

const char* type_name(ibv_qp_type t) {
  return t == IBV_QPT_RC ? "RC" : t == IBV_QPT_UC ? "UC" : "UD";
}

class Checker {
 public:
  Checker(const Scenario& s, const RunRecord& r) : s_(s), r_(r), faults_(s.config.faults) {
    faults_.queue_overflow = r.overflow_drops > 0;
  }

  std::vector<Violation> run() {
    base::check(r_.qp_num.size() == s_.qps.size(), "run record: qp_num size");
    base::check(r_.send_posted_ns.size() == s_.sends.size(), "run record: send_posted_ns size");
    base::check(r_.recv_posted_ns.size() == s_.recvs.size(), "run record: recv_posted_ns size");
    base::check(r_.memory.size() == s_.regions.size(), "run record: memory size");
    if (!r_.finished) add("progress", "run did not finish: " + r_.stall);
    index_completions();
    check_send_queues();
    build_images();
    apply_sends();
    check_receives();
    check_responder_err();
    check_rq_flushed_at_error();
    check_atomics();
    check_retry_bound();
    check_ack_psns();
    compare_images();
    return std::move(out_);
  }

 private:
  void add(std::string property, std::string detail) {
    if (out_.size() < kMaxViolations) out_.push_back({std::move(property), std::move(detail)});
  }

  std::string describe_send(size_t i) const {
    const SendSpec& w = s_.sends[i];
    const QpSpec& q = s_.qps[w.qp];
    std::ostringstream os;
    os << "send #" << i << " (" << op_info(w.op).name << " len " << w.length() << " on qp " << w.qp
       << " " << type_name(q.type) << " host " << q.host;
    if (w.qp < r_.qp_num.size()) os << " qpn " << hex(r_.qp_num[w.qp]);
    os << (w.signaled ? "" : " unsignaled") << (w.fence ? " fence" : "")
       << (w.inline_data ? " inline" : "") << ")";
    return os.str();
  }
  std::string describe_recv(size_t i) const {
    const RecvSpec& v = s_.recvs[i];
    std::ostringstream os;
    os << "recv #" << i << " (";
    if (v.qp != kNone)
      os << "qp " << v.qp;
    else
      os << "srq of host " << v.srq_host;
    os << ", " << v.length() << " bytes in " << v.sges.size() << " sge)";
    return os.str();
  }
  static std::string describe_wc(const ObservedCompletion& c) {
    const ibv_wc& wc = c.wc;
    std::ostringstream os;
    os << "[t=" << c.time_ns << " host " << c.host << (c.recv_cq ? " rcq" : " scq") << " status "
       << ibv_wc_status_str(wc.status) << " opcode " << wc.opcode << " len " << wc.byte_len
       << " qpn " << hex(wc.qp_num) << " flags " << hex(wc.wc_flags) << "]";
    return os.str();
  }

  bool signaled(size_t i) const {
    const SendSpec& w = s_.sends[i];
    return w.signaled || s_.qps[w.qp].sq_sig_all;
  }
  bool has_partition() const { return faults_.any_partition(); }

  // ---- completions by WR ----
  void index_completions() {
    send_cqe_.assign(s_.sends.size(), {});
    recv_cqe_.assign(s_.recvs.size(), {});
    for (const ObservedCompletion& c : r_.completions) {
      const uint64_t kind = c.wc.wr_id & kWrIdKindMask;
      const uint64_t index = c.wc.wr_id & ~kWrIdKindMask;
      if (kind == kWrIdSend && index < s_.sends.size()) {
        const SendSpec& w = s_.sends[index];
        if (c.recv_cq || c.host != s_.qps[w.qp].host)
          add("fields", describe_send(index) + " completed on the wrong CQ " + describe_wc(c));
        if (!r_.send_posted_ns[index])
          add("exactly-once", describe_send(index) + " completed but was never posted");
        send_cqe_[index].push_back(&c);
      } else if (kind == kWrIdRecv && index < s_.recvs.size()) {
        const RecvSpec& v = s_.recvs[index];
        const uint32_t host = v.qp != kNone ? s_.qps[v.qp].host : v.srq_host;
        if (!c.recv_cq || c.host != host)
          add("fields", describe_recv(index) + " completed on the wrong CQ " + describe_wc(c));
        if (!r_.recv_posted_ns[index])
          add("exactly-once", describe_recv(index) + " completed but was never posted");
        recv_cqe_[index].push_back(&c);
      } else {
        add("exactly-once",
            "completion with unknown wr_id " + hex(c.wc.wr_id) + " " + describe_wc(c));
      }
    }
    for (size_t i = 0; i < s_.sends.size(); ++i)
      if (send_cqe_[i].size() > 1)
        add("exactly-once", describe_send(i) + " completed " + std::to_string(send_cqe_[i].size()) +
                                " times, first " + describe_wc(*send_cqe_[i][0]) + " then " +
                                describe_wc(*send_cqe_[i][1]));
    for (size_t i = 0; i < s_.recvs.size(); ++i)
      if (recv_cqe_[i].size() > 1)
        add("exactly-once",
            describe_recv(i) + " completed " + std::to_string(recv_cqe_[i].size()) + " times");
  }

  // ---- send queues: order, statuses, flushes, fields ----
  void check_send_queues() {
    outcome_.assign(s_.sends.size(), Outcome::kNotPosted);
    qp_failed_.assign(s_.qps.size(), false);
    std::vector<std::vector<size_t>> by_qp(s_.qps.size());
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      by_qp[s_.sends[i].qp].push_back(i);
      for (const ObservedCompletion* c : send_cqe_[i])
        if (c->wc.status != IBV_WC_SUCCESS) qp_failed_[s_.sends[i].qp] = true;
    }
    for (uint32_t q = 0; q < s_.qps.size(); ++q) check_send_queue(q, by_qp[q]);
  }

  void check_send_queue(uint32_t q, const std::vector<size_t>& sends) {
    const uint32_t peer = s_.qps[q].peer;
    // Order: the completions of this QP's sends, by poll order, are in posting order.
    std::vector<std::pair<const ObservedCompletion*, size_t>> seen;
    for (size_t i : sends)
      for (const ObservedCompletion* c : send_cqe_[i]) seen.push_back({c, i});
    std::sort(seen.begin(), seen.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (size_t k = 1; k < seen.size(); ++k)
      if (seen[k].second < seen[k - 1].second)
        add("order", describe_send(seen[k].second) + " completed after the later " +
                         describe_send(seen[k - 1].second));

    // Outcomes, and the flush rule: after the QP's error every later posted WR completes, with
    // WR_FLUSH_ERR. The error WR is the first whose status is neither SUCCESS nor FLUSH; on a
    // lossy network, WRs still unacknowledged when it struck may flush just before it (the
    // device completes in order, flushing them first).
    size_t last_seen = 0;
    bool any_seen = false;
    std::optional<size_t> error_at;  // position in `sends` of the error WR
    for (size_t k = 0; k < sends.size(); ++k) {
      if (send_cqe_[sends[k]].empty()) continue;
      last_seen = k;
      any_seen = true;
      const ibv_wc_status st = send_cqe_[sends[k]][0]->wc.status;
      if (!error_at && st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR) error_at = k;
    }
    bool failed = false;
    for (size_t k = 0; k < sends.size(); ++k) {
      const size_t i = sends[k];
      const SendSpec& w = s_.sends[i];
      if (!r_.send_posted_ns[i]) continue;
      if (send_cqe_[i].empty()) {
        if (failed) {
          if (r_.finished)
            add("exactly-once", describe_send(i) +
                                    " was posted after its QP failed but never "
                                    "flushed");
          outcome_[i] = Outcome::kFailed;
        } else if (any_seen && k < last_seen) {
          outcome_[i] = Outcome::kSuccess;  // a later WR completed: this one did, silently
          if (signaled(i))
            add("exactly-once", describe_send(i) +
                                    " is signaled but has no completion, while later WRs of "
                                    "its QP completed");
          if (w.fault != Fault::kNone && fault_outcome(w.fault).requester != IBV_WC_SUCCESS)
            add("status", describe_send(i) + " carries the injected fault " + fault_name(w.fault) +
                              " but completed silently (expected " +
                              ibv_wc_status_str(fault_outcome(w.fault).requester) + ")");
        } else {
          outcome_[i] = Outcome::kUnknown;
          if (signaled(i) && r_.finished)
            add("exactly-once", describe_send(i) + " is signaled but never completed");
        }
        continue;
      }
      const ObservedCompletion& c = *send_cqe_[i][0];
      const ibv_wc& wc = c.wc;
      if (wc.qp_num != r_.qp_num[q])
        add("fields",
            describe_send(i) + " completion has qp_num " + hex(wc.qp_num) + " " + describe_wc(c));
      if (wc.status == IBV_WC_SUCCESS) {
        outcome_[i] = Outcome::kSuccess;
        if (failed)
          add("status", describe_send(i) + " succeeded after an earlier WR of its QP failed " +
                            describe_wc(c));
        if (!signaled(i))
          add("exactly-once", describe_send(i) +
                                  " is unsignaled but produced a successful "
                                  "completion " +
                                  describe_wc(c));
        if (w.fault != Fault::kNone && fault_outcome(w.fault).requester != IBV_WC_SUCCESS)
          add("status", describe_send(i) + " carries the injected fault " + fault_name(w.fault) +
                            " but succeeded (expected " +
                            ibv_wc_status_str(fault_outcome(w.fault).requester) + ")");
        check_send_fields(i, c);
        continue;
      }
      outcome_[i] = Outcome::kFailed;
      if (failed) {
        if (wc.status != IBV_WC_WR_FLUSH_ERR && !(error_at && *error_at == k))
          add("status", describe_send(i) +
                            " after the QP's first error must be WR_FLUSH_ERR, got " +
                            describe_wc(c));
        if (error_at && *error_at == k) judge_error(q, i, c);
        continue;
      }
      failed = true;
      qp_failed_[q] = true;
      first_error_[q] = &c;
      if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        judge_error(q, i, c);
        continue;
      }
      // A flush first: the QP went to ERR without an error of its own WRs (a responder error,
      // a dead QP, the final drain), or this WR was outstanding when a later one failed.
      if (error_at && faults_.lossy()) continue;
      if (may_enter_err(q, c.time_ns)) continue;
      if (c.time_ns >= r_.drain_ns && has_partition()) continue;
      // The run waits only for signaled WRs: an unsignaled tail (its QP blocked behind a failed
      // dependency) may still be retrying at the drain if its peer is gone or packets are lost.
      if (c.time_ns >= r_.drain_ns && unsignaled_tail(sends, k) &&
          (faults_.lossy() ||
           (peer != kNone && (qp_failed_[peer] || may_enter_err(peer, c.time_ns)))))
        continue;
      if (c.time_ns >= r_.drain_ns)
        add("status", describe_send(i) +
                          " was still outstanding at the end of the run and "
                          "flushed " +
                          describe_wc(c));
      else
        add("status", describe_send(i) + " was flushed " + describe_wc(c) +
                          " but nothing moved its QP to ERR");
    }
    // The fault must show: a posted faulted WR on a QP that had not failed before it.
    for (size_t k = 0; k < sends.size(); ++k) {
      const size_t i = sends[k];
      const SendSpec& w = s_.sends[i];
      if (w.fault == Fault::kNone || !r_.send_posted_ns[i] || !r_.finished) continue;
      if (!send_cqe_[i].empty() || outcome_[i] == Outcome::kSuccess) continue;
      if (fault_outcome(w.fault).requester != IBV_WC_SUCCESS)
        add("status", describe_send(i) + " carries the injected fault " + fault_name(w.fault) +
                          " but never completed (expected " +
                          ibv_wc_status_str(fault_outcome(w.fault).requester) + ")");
    }
  }

  // Does either QP of q's pair carry an injected fault (or is dead)?
  bool pair_faulted(uint32_t q) const {
    const uint32_t peer = s_.qps[q].peer;
    if (s_.qps[q].dead || (peer != kNone && s_.qps[peer].dead)) return true;
    for (const SendSpec& w : s_.sends)
      if (w.fault != Fault::kNone && (w.qp == q || w.qp == peer)) return true;
    return false;
  }

  // Are the posted WRs of `sends` from position k on all unsignaled?
  bool unsignaled_tail(const std::vector<size_t>& sends, size_t k) const {
    for (; k < sends.size(); ++k)
      if (r_.send_posted_ns[sends[k]] && signaled(sends[k])) return false;
    return true;
  }

  // Can QP q be in ERR at time t without an error of its own send queue? Dead from the start,
  // or the responder of an injected fault that moves the responder to ERR, once it was sent.
  bool may_enter_err(uint32_t q, uint64_t t) const {
    const QpSpec& qp = s_.qps[q];
    if (qp.dead) return true;
    if (qp.peer == kNone) return false;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (w.qp == qp.peer && w.fault != Fault::kNone && fault_outcome(w.fault).responder_err &&
          r_.send_posted_ns[i] && *r_.send_posted_ns[i] <= t)
        return true;
    }
    return false;
  }

  // The error WR's status: the injected fault's outcome, or an exhausted retry budget that
  // the network trace shows was earned.
  void judge_error(uint32_t q, size_t i, const ObservedCompletion& c) {
    const SendSpec& w = s_.sends[i];
    const QpSpec& qp = s_.qps[w.qp];
    const ibv_wc_status st = c.wc.status;
    if (qp.type == IBV_QPT_RC && st == IBV_WC_RETRY_EXC_ERR) {
      const std::string why = retry_evidence(q, c.time_ns);
      if (!why.empty())
        add("status", describe_send(i) + " failed " + describe_wc(c) +
                          " without the evidence in the network trace: " + why);
      return;
    }
    if (qp.type == IBV_QPT_RC && st == IBV_WC_RNR_RETRY_EXC_ERR) {
      const std::string why = rnr_evidence(q, c.time_ns);
      if (!why.empty())
        add("status", describe_send(i) + " failed " + describe_wc(c) +
                          " without the evidence in the network trace: " + why);
      return;
    }
    if (w.fault != Fault::kNone && st == fault_outcome(w.fault).requester) return;
    add("status",
        describe_send(i) + " failed " + describe_wc(c) +
            (w.fault != Fault::kNone
                 ? std::string(" (injected fault ") + fault_name(w.fault) + ": expected " +
                       ibv_wc_status_str(fault_outcome(w.fault).requester) + ")"
                 : std::string(" (no error is expected of it)")));
  }

  // ---- the network trace as evidence ----
  // RC opcodes (IBA 9.2 table 35): requests below READ response First, responses 0x0D..0x12.
  static bool rc_request(uint8_t op) { return op < 0x20 && (op < 0x0D || op > 0x12); }
  static bool rc_response(uint8_t op) { return op >= 0x0D && op <= 0x12; }
  // A response that acknowledges its PSN: ACK syndrome, ATOMIC ACK, or READ response data.
  static bool positive(const TracedDatagram& d) {
    if (d.opcode == 0x11) return d.has_aeth && (d.syndrome >> 5) == 0;
    return rc_response(d.opcode);
  }
  static bool rnr_nak(const TracedDatagram& d) {
    return d.opcode == 0x11 && d.has_aeth && (d.syndrome >> 5) == 1;
  }
  static bool seq_nak(const TracedDatagram& d) {
    return d.opcode == 0x11 && d.has_aeth && d.syndrome == 0x60;
  }
  bool request_of(const TracedDatagram& d, uint32_t q) const {
    const QpSpec& qp = s_.qps[q];
    return d.src_host == qp.host && d.dst_host == s_.qps[qp.peer].host &&
           d.dest_qpn == r_.qp_num[qp.peer] && rc_request(d.opcode);
  }
  bool response_to(const TracedDatagram& d, uint32_t q) const {
    const QpSpec& qp = s_.qps[q];
    return d.dst_host == qp.host && d.src_host == s_.qps[qp.peer].host &&
           d.dest_qpn == r_.qp_num[q] && rc_response(d.opcode);
  }

  // READ (0x0C) and the two ATOMICs (0x13, 0x14): requests only their responses acknowledge.
  static bool rd_atomic_request(uint8_t op) { return op == 0x0c || op == 0x13 || op == 0x14; }
  // How many PSNs request d of QP q uses: an RDMA READ one per response packet (what is left of
  // the READ when it is a resend from inside it), any other request one.
  uint32_t request_span(const TracedDatagram& d, uint32_t q) const {
    static constexpr uint32_t kMtu[] = {0, 256, 512, 1024, 2048, 4096};
    const uint32_t mtu = kMtu[s_.qps[q].mtu];
    return d.opcode == 0x0c ? std::max<uint32_t>(1, (d.dma_length + mtu - 1) / mtu) : 1;
  }

  // ---- ack-psn: a plain ACK never names a READ or ATOMIC ----
  // IBA 9.7.5.1.2: a READ or ATOMIC is acknowledged by its response only. A responder whose
  // ACK (an ACK of a duplicate SEND, say) carries the PSN of one leads a requester like rxe to
  // complete that READ without its data. So no positive ACK to an RC QP may carry a PSN that one
  // of the QP's READ requests (any of its response PSNs) or ATOMIC requests used.
  void check_ack_psns() {
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (s_.qps[q].type != IBV_QPT_RC) continue;
      std::set<uint32_t> rd_atomic;
      for (const TracedDatagram& d : r_.datagrams) {
        if (!request_of(d, q) || !rd_atomic_request(d.opcode)) continue;
        for (uint32_t k = 0; k < request_span(d, q); ++k) rd_atomic.insert((d.psn + k) & 0xffffff);
      }
      for (const TracedDatagram& d : r_.datagrams) {
        if (d.opcode != 0x11 || !positive(d) || !response_to(d, q)) continue;
        if (rd_atomic.count(d.psn))
          add("ack-psn", "QP " + std::to_string(q) + " got an ACK with PSN " + hex(d.psn) +
                             " at t=" + std::to_string(d.sent_ns) +
                             ", a PSN of its READ or ATOMIC request");
      }
    }
  }

  // "" when the trace shows that QP q earned RETRY_EXC_ERR at time t, else why not. See
  // checker.h for the criterion and why it is sound.
  std::string retry_evidence(uint32_t q, uint64_t t) const {
    const QpSpec& qp = s_.qps[q];
    // PSN → its transmissions, in order. An RDMA READ request asks for every response PSN of
    // what is left of the READ: it is a try of each of them (a READ answered in part is resent
    // from its first missing response's PSN).
    std::map<uint32_t, std::vector<uint64_t>> sent;
    std::set<uint32_t> rd_atomic;  // PSNs of READs and ATOMICs: only their responses ack them
    for (const TracedDatagram& d : r_.datagrams) {
      if (d.sent_ns > t || !request_of(d, q)) continue;
      for (uint32_t k = 0; k < request_span(d, q); ++k) {
        sent[(d.psn + k) & 0xffffff].push_back(d.sent_ns);
        if (rd_atomic_request(d.opcode)) rd_atomic.insert((d.psn + k) & 0xffffff);
      }
    }
    size_t best = 0;
    bool early = false;  // a PSN with the tries, but they came too fast
    for (const auto& entry : sent) {
      const uint32_t psn = entry.first;
      const std::vector<uint64_t>& times = entry.second;
      // Responses for this PSN reaching q, by kind.
      std::vector<uint64_t> acks, rnrs;
      size_t dup_naks = 0;
      for (const TracedDatagram& d : r_.datagrams) {
        if (d.psn != psn || !response_to(d, q)) continue;
        for (size_t k = 0; k < d.delivered_ns.size(); ++k) {
          if (d.delivered_ns[k] > t) continue;
          // A plain ACK acknowledges no READ or ATOMIC (IBA 9.7.5.1.2: those end only with
          // their responses), so it is progress only for a SEND/WRITE PSN.
          if (positive(d) && !(d.opcode == 0x11 && rd_atomic.count(psn)))
            acks.push_back(d.delivered_ns[k]);
          if (rnr_nak(d)) rnrs.push_back(d.delivered_ns[k]);
          if (seq_nak(d) && k > 0) ++dup_naks;  // a network copy of a NAK is a retry of its own
        }
      }
      // Transmissions that follow an RNR NAK of this PSN resend after the RNR wait: no retry.
      std::vector<uint64_t> tries;
      for (size_t k = 0; k < times.size(); ++k) {
        const uint64_t prev = k ? times[k - 1] : 0;
        const bool after_rnr = std::any_of(rnrs.begin(), rnrs.end(), [&](uint64_t r) {
          return k > 0 && r >= prev && r <= times[k];
        });
        if (!after_rnr) tries.push_back(times[k]);
      }
      const size_t n = tries.size() + dup_naks;
      best = std::max(best, n);
      if (n < size_t{qp.retry_cnt} + 1 || tries.empty()) continue;
      // The window: from the first of the last retry_cnt tries to the failure; no response
      // acknowledging the PSN reached q in it. Those tries all follow the last progress (each
      // retry resends the PSN), so nothing in the window was ignored for an older WR still
      // unanswered. With retry_cnt 0 there is no retry to bound it: the window then starts
      // at the last try or at the last response to an older PSN, whichever is later (the last
      // progress was one of those responses).
      const size_t from =
          tries.size() > qp.retry_cnt ? tries.size() - std::max<size_t>(qp.retry_cnt, 1) : 0;
      uint64_t start = tries[from];
      if (qp.retry_cnt == 0)
        for (const TracedDatagram& d : r_.datagrams) {
          const uint32_t behind = (psn - d.psn) & 0xffffff;
          if (behind == 0 || behind >= (1u << 23) || !response_to(d, q) || !positive(d)) continue;
          for (uint64_t at : d.delivered_ns)
            if (at <= t) start = std::max(start, at);
        }
      const bool acked =
          std::any_of(acks.begin(), acks.end(), [&](uint64_t a) { return a >= start && a < t; });
      if (acked) continue;
      // Time: each retry a timeout waits one local ACK timeout from a send or progress at or
      // after the previous one, and the first timer started no earlier than the PSN's first
      // try. Unless a PSN-sequence NAK of p (a retry that does not wait) came in, the failure
      // is at least retry_cnt + 1 timeouts after that first try.
      const uint64_t first = times.front();
      const bool nak = std::any_of(r_.datagrams.begin(), r_.datagrams.end(), [&](const auto& d) {
        return d.psn == psn && seq_nak(d) && response_to(d, q) &&
               std::any_of(d.delivered_ns.begin(), d.delivered_ns.end(),
                           [&](uint64_t a) { return a >= first && a <= t; });
      });
      const uint64_t wait = (uint64_t{qp.retry_cnt} + 1) * ack_timeout_ns(qp.timeout);
      if (!nak && t - first < wait) {
        early = true;
        continue;
      }
      return "";
    }
    if (early)
      return "the tries of qp " + std::to_string(q) +
             " did not span retry_cnt + 1 = " + std::to_string(qp.retry_cnt + 1) +
             " local ACK timeouts of " + std::to_string(ack_timeout_ns(qp.timeout)) +
             " ns (and no sequence NAK came)";
    return "no PSN of qp " + std::to_string(q) +
           " was sent retry_cnt + 1 = " + std::to_string(qp.retry_cnt + 1) +
           " times without a response acknowledging it (most tries of one PSN: " +
           std::to_string(best) + ")";
  }

  // "" when the trace shows rnr_retry + 1 RNR NAKs of one PSN reaching QP q by time t. The
  // budget resets only on progress, and after the last progress every RNR NAK that counts names
  // the oldest unacknowledged PSN. (An ACK of that PSN seen earlier need not have been progress:
  // an ACK beyond an unanswered READ or ATOMIC acknowledges nothing past it, so a late RNR NAK
  // may still count — as in rxe.)
  std::string rnr_evidence(uint32_t q, uint64_t t) const {
    const QpSpec& qp = s_.qps[q];
    if (qp.rnr_retry == 7) return "rnr_retry is 7 (retry forever)";
    std::map<uint32_t, size_t> by_psn;  // PSN → RNR NAKs delivered
    for (const TracedDatagram& d : r_.datagrams) {
      if (!response_to(d, q) || !rnr_nak(d)) continue;
      for (uint64_t at : d.delivered_ns)
        if (at <= t) ++by_psn[d.psn];
    }
    size_t best = 0;
    for (const auto& [psn, n] : by_psn) {
      best = std::max(best, n);
      if (n >= size_t{qp.rnr_retry} + 1) return "";
    }
    return "no PSN of qp " + std::to_string(q) +
           " drew rnr_retry + 1 = " + std::to_string(qp.rnr_retry + 1) +
           " RNR NAKs (most: " + std::to_string(best) + ")";
  }

  void check_send_fields(size_t i, const ObservedCompletion& c) {
    const SendSpec& w = s_.sends[i];
    const OpInfo& info = op_info(w.op);
    const ibv_wc& wc = c.wc;
    if (wc.opcode != info.wc)
      add("fields", describe_send(i) + " completion opcode " + std::to_string(wc.opcode) +
                        ", expected " + std::to_string(info.wc) + " " + describe_wc(c));
    // rxe reports IBV_WC_WITH_IMM on the send completion of *_WITH_IMM; nothing else is valid.
    const unsigned allowed =
        (w.op == Op::kSendImm || w.op == Op::kWriteImm) ? unsigned{IBV_WC_WITH_IMM} : 0u;
    if (wc.wc_flags & ~allowed)
      add("fields",
          describe_send(i) + " completion wc_flags " + hex(wc.wc_flags) + " " + describe_wc(c));
    // byte_len is defined for READ and atomics (the bytes placed locally).
    if (w.op == Op::kRead && wc.byte_len != w.length())
      add("fields", describe_send(i) + " READ completion byte_len " + std::to_string(wc.byte_len) +
                        " " + describe_wc(c));
    if (info.atomic && wc.byte_len != 8)
      add("fields", describe_send(i) + " atomic completion byte_len " +
                        std::to_string(wc.byte_len) + ", expected 8");
  }

  // ---- expected memory ----
  void build_images() {
    images_.resize(s_.regions.size());
    for (uint32_t r = 0; r < s_.regions.size(); ++r) {
      Image& img = images_[r];
      img.initial = s_.initial_image(r);
      img.expect = img.initial;
      img.kind.assign(img.initial.size(), Expect::kUntouched);
      if (r_.memory[r].size() != img.initial.size()) {
        add("data", "region " + std::to_string(r) + " snapshot has " +
                        std::to_string(r_.memory[r].size()) + " bytes, expected " +
                        std::to_string(img.initial.size()));
      }
    }
  }

  // Sets bytes [offset, offset + n) of a region (offset within the registration).
  void set(uint32_t region, uint64_t offset, const uint8_t* data, uint64_t n, Expect kind) {
    Image& img = images_[region];
    base::check(kGuardBytes + offset + n <= img.kind.size() - kGuardBytes,
                "expectation out of range");
    for (uint64_t k = 0; k < n; ++k) {
      const size_t at = kGuardBytes + offset + k;
      img.expect[at] = data ? data[k] : img.expect[at];
      img.kind[at] = kind;
    }
  }
  void set_any(uint32_t region, uint64_t offset, uint64_t n) {
    set(region, offset, nullptr, n, Expect::kAny);
  }

  // The bytes a gather list reads now (per the expectations so far); false if any is not
  // known exactly.
  bool gather(const std::vector<Sge>& sges, std::vector<uint8_t>& out) const {
    out.clear();
    bool certain = true;
    for (const Sge& g : sges) {
      const Image& img = images_[g.region];
      for (uint64_t k = 0; k < g.length; ++k) {
        const size_t at = kGuardBytes + g.offset + k;
        out.push_back(img.expect[at]);
        certain &= img.kind[at] == Expect::kUntouched || img.kind[at] == Expect::kExact;
      }
    }
    return certain;
  }

  // Scatters `data` over a list of SGEs with one expectation.
  void scatter(const std::vector<Sge>& sges, const std::vector<uint8_t>& data, Expect kind) {
    uint64_t pos = 0;
    for (const Sge& g : sges) {
      if (pos >= data.size()) break;
      const uint64_t n = std::min<uint64_t>(g.length, data.size() - pos);
      set(g.region, g.offset, data.data() + pos, n, kind);
      pos += n;
    }
  }

  // In posting order: the payload each send carries, and what WRITEs and READs leave behind.
  void apply_sends() {
    payload_.assign(s_.sends.size(), {});
    payload_certain_.assign(s_.sends.size(), false);
    std::vector<uint8_t> data;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      const QpSpec& q = s_.qps[w.qp];
      const OpInfo& info = op_info(w.op);
      if (outcome_[i] == Outcome::kNotPosted) continue;
      // A faulted WR is refused before any byte moves (R_Key, bounds and access are checked on
      // the first packet); its message, if any, is judged with its receive.
      if (w.fault != Fault::kNone) {
        if (info.consumes_recv) gather(w.sges, payload_[i]);
        continue;
      }
      const bool landed =
          outcome_[i] == Outcome::kSuccess &&
          (q.type == IBV_QPT_RC || faults_.clean());  // UC: when sent; a gap drops it
      if (info.atomic) {
        set_any(w.sges[0].region, w.sges[0].offset, 8);  // checked by check_atomics
        set_any(w.remote_region, w.remote_offset, 8);
        continue;
      }
      if (w.op == Op::kRead) {
        Sge src{w.remote_region, w.remote_offset, static_cast<uint32_t>(w.length())};
        const bool certain = gather({src}, data);
        scatter(w.sges, data, landed && certain ? Expect::kExact : Expect::kOldOrNew);
        continue;
      }
      if (info.local) continue;
      payload_certain_[i] = gather(w.sges, data);
      if (info.consumes_recv) payload_[i] = data;
      if (info.remote) {
        Expect kind = landed ? Expect::kExact : Expect::kOldOrNew;
        if (!payload_certain_[i]) kind = Expect::kAny;
        set(w.remote_region, w.remote_offset, data.data(), data.size(), kind);
      }
    }
  }

  // ---- receives ----
  // Messages arriving at receiving QP q, in the sender's posting order.
  std::vector<size_t> messages_to(uint32_t q) const {
    std::vector<size_t> out;
    const QpSpec& qp = s_.qps[q];
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (outcome_[i] == Outcome::kNotPosted || !op_info(w.op).consumes_recv) continue;
      if (w.fault == Fault::kUdTooLong) continue;  // dropped by design: delivered nowhere
      if (qp.type == IBV_QPT_UD ? w.ud_dest == q : w.qp == qp.peer) out.push_back(i);
    }
    return out;
  }

  // The byte stream a receive WQE holds after receiving `n` bytes.
  std::vector<uint8_t> received_bytes(size_t recv, uint64_t n) const {
    std::vector<uint8_t> out;
    for (const Sge& g : s_.recvs[recv].sges) {
      const std::vector<uint8_t>& mem = r_.memory[g.region];
      for (uint64_t k = 0; k < g.length && out.size() < n; ++k) {
        const size_t at = kGuardBytes + g.offset + k;
        out.push_back(at < mem.size() ? mem[at] : 0);
      }
    }
    return out;
  }

  // Why message `m` cannot be what receive completion `c` (of receive `recv`) got, or "".
  std::string mismatch(size_t m, size_t recv, const ObservedCompletion& c) const {
    const SendSpec& w = s_.sends[m];
    const ibv_wc& wc = c.wc;
    const bool ud = s_.qps[w.qp].type == IBV_QPT_UD;
    const bool write_imm = w.op == Op::kWriteImm;
    const ibv_wc_opcode op = write_imm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    if (wc.opcode != op) return "opcode " + std::to_string(wc.opcode);
    const uint64_t len = w.length() + (ud ? kGrhBytes : 0);
    if (wc.byte_len != len)
      return "byte_len " + std::to_string(wc.byte_len) + " != " + std::to_string(len);
    unsigned flags = 0;
    if (w.op == Op::kSendImm || write_imm) flags |= IBV_WC_WITH_IMM;
    if (w.op == Op::kSendInv) flags |= IBV_WC_WITH_INV;
    if (ud) flags |= IBV_WC_GRH;
    const unsigned known = IBV_WC_WITH_IMM | IBV_WC_WITH_INV | IBV_WC_GRH;
    if ((wc.wc_flags & known) != flags) return "wc_flags " + hex(wc.wc_flags);
    if ((flags & IBV_WC_WITH_IMM) && wc.imm_data != w.imm)
      return "imm_data " + hex(wc.imm_data) + " != " + hex(w.imm);
    if (w.op == Op::kSendInv && w.window < r_.window_rkey.size() &&
        wc.invalidated_rkey != r_.window_rkey[w.window])
      return "invalidated_rkey " + hex(wc.invalidated_rkey) +
             " != " + hex(r_.window_rkey[w.window]);
    if (ud && wc.src_qp != r_.qp_num[w.qp])
      return "src_qp " + hex(wc.src_qp) + " != " + hex(r_.qp_num[w.qp]);
    if (ud) {  // the GRH names the sending host: it tells apart messages alike otherwise
      const auto grh =
          ud_grh(s_.qps[w.qp].host, s_.qps[w.ud_dest].host, w.length(), w.op == Op::kSendImm);
      const std::vector<uint8_t> got = received_bytes(recv, kGrhBytes);
      if (got.size() < kGrhBytes || !std::equal(grh.begin(), grh.end(), got.begin()))
        return "GRH differs from the one a datagram from host " +
               std::to_string(s_.qps[w.qp].host) + " carries";
    }
    if (!write_imm && payload_certain_[m]) {
      const std::vector<uint8_t> got = received_bytes(recv, len);
      const size_t skip = ud ? kGrhBytes : 0;
      for (size_t k = 0; k < payload_[m].size(); ++k)
        if (k + skip >= got.size() || got[k + skip] != payload_[m][k])
          return "payload byte " + std::to_string(k) + " differs";
    }
    return "";
  }

  void check_receives() {
    // Successful receive completions per receiving QP, in poll order.
    std::vector<std::vector<std::pair<const ObservedCompletion*, size_t>>> got(s_.qps.size());
    // QPNs are per device: a completion names its QP by (host, qp_num).
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_qpn;
    for (uint32_t q = 0; q < s_.qps.size(); ++q) by_qpn[{s_.qps[q].host, r_.qp_num[q]}] = q;
    std::vector<bool> matched(s_.recvs.size(), false);
    std::vector<std::vector<std::pair<const ObservedCompletion*, size_t>>> error_recvs(
        s_.qps.size());
    for (size_t i = 0; i < s_.recvs.size(); ++i) {
      const RecvSpec& v = s_.recvs[i];
      if (!r_.recv_posted_ns[i]) continue;
      if (recv_cqe_[i].empty()) {
        // An SRQ's WQEs belong to no QP: they stay posted when its QPs fail (IBA 10.2.9.5).
        if (r_.finished && v.qp != kNone)
          add("exactly-once", describe_recv(i) +
                                  " never completed, not even when its QP "
                                  "was moved to ERR at the end");
        continue;
      }
      const ObservedCompletion& c = *recv_cqe_[i][0];
      const auto it = by_qpn.find({c.host, c.wc.qp_num});
      if (it == by_qpn.end()) {
        add("fields", describe_recv(i) + " completed with unknown qp_num " + describe_wc(c));
        continue;
      }
      const uint32_t q = it->second;
      const bool right_queue =
          v.qp != kNone ? v.qp == q : (s_.qps[q].use_srq && s_.qps[q].host == v.srq_host);
      if (!right_queue) {
        add("fields", describe_recv(i) + " completed for qp " + std::to_string(q) +
                          ", which does not own it " + describe_wc(c));
        continue;
      }
      if (c.wc.status == IBV_WC_SUCCESS) {
        got[q].push_back({&c, i});
      } else if (c.wc.status != IBV_WC_WR_FLUSH_ERR) {
        error_recvs[q].push_back({&c, i});
      }
    }
    for (uint32_t q = 0; q < s_.qps.size(); ++q) check_error_receives(q, error_recvs[q], matched);

    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      auto& recvs = got[q];
      std::sort(recvs.begin(), recvs.end(), [](auto& a, auto& b) { return a.first < b.first; });
      const QpSpec& qp = s_.qps[q];
      // RC without SRQ: receive WQEs are consumed in posting order.
      if (qp.type == IBV_QPT_RC && !qp.use_srq)
        for (size_t k = 1; k < recvs.size(); ++k)
          if (recvs[k].second < recvs[k - 1].second)
            add("order", describe_recv(recvs[k].second) + " completed after the later " +
                             describe_recv(recvs[k - 1].second));
      match_messages(q, recvs, matched);
    }
    // A receive queue completes in order whatever the status: messages, the fault's error,
    // then the flush (IBA 10.8.3.1: a work queue's completions are returned in order).
    std::map<uint32_t, std::vector<std::pair<const ObservedCompletion*, size_t>>> all_of_rq;
    for (size_t i = 0; i < s_.recvs.size(); ++i)
      if (s_.recvs[i].qp != kNone && s_.qps[s_.recvs[i].qp].type == IBV_QPT_RC)
        for (const ObservedCompletion* c : recv_cqe_[i])
          all_of_rq[s_.recvs[i].qp].push_back({c, i});
    for (auto& [q, list] : all_of_rq) {
      std::sort(list.begin(), list.end(), [](auto& a, auto& b) { return a.first < b.first; });
      for (size_t k = 1; k < list.size(); ++k)
        if (list[k].second < list[k - 1].second) {
          add("order", describe_recv(list[k].second) + " " + describe_wc(*list[k].first) +
                           " completed after the later " + describe_recv(list[k - 1].second) + " " +
                           describe_wc(*list[k - 1].first));
          break;
        }
    }

    // Unmatched receive buffers: untouched, unless a message may have been cut short in them —
    // a message of a QP pair that failed (RC), or any message on a faulty network (UC).
    for (size_t i = 0; i < s_.recvs.size(); ++i) {
      if (matched[i]) continue;
      const RecvSpec& v = s_.recvs[i];
      const bool uc_lossy = v.qp != kNone && s_.qps[v.qp].type == IBV_QPT_UC && !faults_.clean();
      bool cut_short = uc_lossy;
      for (uint32_t q = 0; q < s_.qps.size() && !cut_short; ++q) {
        const QpSpec& qp = s_.qps[q];
        const bool owner = v.qp != kNone ? v.qp == q : qp.use_srq && qp.host == v.srq_host;
        if (owner && qp.type == IBV_QPT_RC)
          cut_short = qp_failed_[q] || qp_failed_[qp.peer] || may_enter_err(q, ~uint64_t{0});
      }
      if (cut_short)
        for (const Sge& g : v.sges) set_any(g.region, g.offset, g.length);
    }
  }

  // Receives that completed in error: only the receive an injected fault's message consumes,
  // with the status the fault predicts, and in receive order (every earlier receive of the
  // queue succeeded). Conversely, a faulted send that got its predicted status proves the
  // responder saw it: its receive must show the predicted status too.
  void check_error_receives(uint32_t q,
                            const std::vector<std::pair<const ObservedCompletion*, size_t>>& errs,
                            std::vector<bool>& matched) {
    std::vector<size_t> faults;  // sends to q whose fault consumes a receive
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (s_.qps[w.qp].peer == q && w.fault != Fault::kNone && fault_outcome(w.fault).receive &&
          r_.send_posted_ns[i])
        faults.push_back(i);
    }
    for (const auto& [c, recv] : errs) {
      matched[recv] = true;  // a message may have been written into it in part
      for (const Sge& g : s_.recvs[recv].sges) set_any(g.region, g.offset, g.length);
      bool expected = false;
      for (size_t i : faults) expected |= c->wc.status == *fault_outcome(s_.sends[i].fault).receive;
      if (!expected) {
        add("status", describe_recv(recv) + " failed " + describe_wc(*c) +
                          " (no injected fault consumes a receive of qp " + std::to_string(q) +
                          " with that status)");
        continue;
      }
      if (errs.size() > faults.size())
        add("status", "qp " + std::to_string(q) + " has " + std::to_string(errs.size()) +
                          " failed receives for " + std::to_string(faults.size()) + " faults");
      for (size_t j = 0; j < recv; ++j) {
        if (s_.recvs[j].qp != q || !r_.recv_posted_ns[j]) continue;
        if (recv_cqe_[j].empty() || recv_cqe_[j][0]->wc.status != IBV_WC_SUCCESS) {
          add("order", describe_recv(recv) + " failed " + describe_wc(*c) + " before the earlier " +
                           describe_recv(j) + " was consumed by a message");
          break;
        }
      }
    }
    for (size_t i : faults) {
      const FaultOutcome o = fault_outcome(s_.sends[i].fault);
      if (send_cqe_[i].empty() || send_cqe_[i][0]->wc.status != o.requester) continue;
      const bool seen = std::any_of(errs.begin(), errs.end(), [&](const auto& e) {
        return e.first->wc.status == *o.receive;
      });
      if (!seen)
        add("status", describe_send(i) + " completed with " + ibv_wc_status_str(o.requester) +
                          " but no receive of qp " + std::to_string(q) + " completed with " +
                          ibv_wc_status_str(*o.receive));
    }
  }

  // An RC QP that entered ERR before the final drain — its own error, a dead QP, or the
  // responder of a fault the requester saw — flushed its receive queue then, not at the drain.
  void check_rq_flushed_at_error() {
    std::vector<uint64_t> err_at(s_.qps.size(), ~uint64_t{0});
    for (uint32_t q = 0; q < s_.qps.size(); ++q) {
      if (s_.qps[q].dead) err_at[q] = 0;
      const auto it = first_error_.find(q);
      if (it != first_error_.end() && it->second->time_ns < r_.drain_ns)
        err_at[q] = std::min(err_at[q], it->second->time_ns);
    }
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (w.fault == Fault::kNone || send_cqe_[i].empty()) continue;
      const ObservedCompletion& c = *send_cqe_[i][0];
      if (fault_outcome(w.fault).responder_err && c.wc.status == fault_outcome(w.fault).requester &&
          c.time_ns < r_.drain_ns)
        err_at[s_.qps[w.qp].peer] = std::min(err_at[s_.qps[w.qp].peer], c.time_ns);
    }
    for (size_t r = 0; r < s_.recvs.size(); ++r) {
      const uint32_t q = s_.recvs[r].qp;
      if (q == kNone || s_.qps[q].type != IBV_QPT_RC || err_at[q] == ~uint64_t{0}) continue;
      // (One posted only at the drain flushes then, whatever the QP's state.)
      if (!r_.recv_posted_ns[r] || *r_.recv_posted_ns[r] >= r_.drain_ns) continue;
      for (const ObservedCompletion* c : recv_cqe_[r])
        if (c->wc.status == IBV_WC_WR_FLUSH_ERR && c->time_ns >= r_.drain_ns)
          add("status", describe_recv(r) + " was flushed only at the final drain " +
                            describe_wc(*c) + ", though qp " + std::to_string(q) +
                            " entered ERR at t=" + std::to_string(err_at[q]));
    }
  }

  // The responder of a fault that moves it to ERR: once the requester knew of the error, no
  // WR of the responder succeeds any more — its sends flush, its receives flush.
  void check_responder_err() {
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (w.fault == Fault::kNone || send_cqe_[i].empty()) continue;
      const FaultOutcome o = fault_outcome(w.fault);
      const ObservedCompletion& fc = *send_cqe_[i][0];
      if (!o.responder_err || fc.wc.status != o.requester) continue;
      const uint32_t b = s_.qps[w.qp].peer;
      for (size_t j = 0; j < s_.sends.size(); ++j)
        if (s_.sends[j].qp == b && r_.send_posted_ns[j] && *r_.send_posted_ns[j] > fc.time_ns)
          for (const ObservedCompletion* c : send_cqe_[j])
            if (c->wc.status == IBV_WC_SUCCESS)
              add("status", describe_send(j) + " succeeded " + describe_wc(*c) +
                                ", posted after its QP entered ERR for " + describe_send(i));
      for (size_t j = 0; j < s_.recvs.size(); ++j)
        if (s_.recvs[j].qp == b)
          for (const ObservedCompletion* c : recv_cqe_[j])
            if (c->wc.status == IBV_WC_SUCCESS && c->time_ns > fc.time_ns)
              add("status", describe_recv(j) + " succeeded " + describe_wc(*c) +
                                " after its QP entered ERR for " + describe_send(i));
    }
  }

  void match_messages(uint32_t q,
                      const std::vector<std::pair<const ObservedCompletion*, size_t>>& recvs,
                      std::vector<bool>& matched) {
    const QpSpec& qp = s_.qps[q];
    const std::vector<size_t> msgs = messages_to(q);
    const FaultProfile& f = faults_;
    enum class Mode { kStrict, kSubsequence, kAny } mode = Mode::kStrict;
    if (qp.type != IBV_QPT_RC && !f.clean()) mode = f.reorders() ? Mode::kAny : Mode::kSubsequence;
    // A UD QP hears from many QPs: only each sender's own messages keep their order.
    if (qp.type == IBV_QPT_UD && mode == Mode::kStrict) mode = Mode::kSubsequence;
    std::vector<bool> used(msgs.size(), false);
    size_t next = 0;
    std::map<uint32_t, size_t> next_of;  // sending QP → first message it may still deliver
    for (auto& [c, recv] : recvs) {
      size_t found = msgs.size();
      std::string why = "no message left";
      if (mode == Mode::kStrict) {
        if (next < msgs.size()) {
          why = mismatch(msgs[next], recv, *c);
          if (why.empty()) found = next;
        }
        ++next;
      } else {
        // Subsequence: per sending QP (a UD QP hears from many, interleaved in any way).
        bool first_try = true;
        for (size_t k = 0; k < msgs.size(); ++k) {
          const uint32_t sender = s_.sends[msgs[k]].qp;
          if (mode == Mode::kSubsequence && k < next_of[sender]) continue;
          if (mode == Mode::kAny && used[k] && !f.duplicate_ppm) continue;
          std::string w = mismatch(msgs[k], recv, *c);
          if (w.empty()) {
            found = k;
            break;
          }
          if (first_try) why = w;
          first_try = false;
        }
        if (found < msgs.size() && mode == Mode::kSubsequence)
          next_of[s_.sends[msgs[found]].qp] = found + 1;
      }
      if (found == msgs.size()) {
        add("delivery", describe_recv(recv) + " on qp " + std::to_string(q) + " " +
                            type_name(qp.type) + " " + describe_wc(*c) +
                            " matches no message sent to it (" +
                            (mode == Mode::kStrict && next - 1 < msgs.size()
                                 ? "expected " + describe_send(msgs[next - 1]) + ": "
                                 : std::string()) +
                            why + ")");
        for (const Sge& g : s_.recvs[recv].sges) set_any(g.region, g.offset, g.length);
        matched[recv] = true;
        continue;
      }
      used[found] = true;
      matched[recv] = true;
      expect_receive(msgs[found], recv, *c);
    }
    // Nothing may go missing on RC; nothing at all on a clean network; on UC and UD at least
    // what the network delivered in full.
    size_t must = 0;
    if (qp.type == IBV_QPT_RC) {
      // Every message the requester saw succeed was delivered (RC executes in order).
      // (A faulted message consumes its receive with an error: not a delivery.)
      size_t faulted = 0;
      for (size_t k = 0; k < msgs.size(); ++k) {
        if (s_.sends[msgs[k]].fault != Fault::kNone) ++faulted;
        if (outcome_[msgs[k]] == Outcome::kSuccess) must = k + 1 - faulted;
      }
    } else if (f.clean()) {
      must = msgs.size();
    }
    if (recvs.size() < must)
      add("delivery", "qp " + std::to_string(q) + " " + type_name(qp.type) + " received " +
                          std::to_string(recvs.size()) + " messages, expected at least " +
                          std::to_string(must) + "; first missing " +
                          describe_send(msgs[recvs.size()]));
    if (qp.type != IBV_QPT_RC) {
      const size_t bound = delivered_lower_bound(q);
      if (recvs.size() < bound)
        add("delivery", "qp " + std::to_string(q) + " " + type_name(qp.type) + " received " +
                            std::to_string(recvs.size()) + " messages, but the network delivered " +
                            std::to_string(bound) +
                            " whole messages to it while it had receives posted");
    }
  }

  // UC/UD: how many messages any correct device must have received, from the trace. UD: every
  // intact datagram delivered before the drain is one message. UC: a message is one run of
  // intact packets First..Last (or one Only) with consecutive PSNs and nothing else delivered
  // in between (IBA 9.8.3: a gap or duplicate abandons the message in progress, a First/Only
  // starts a new one). Messages that consume no receive (RDMA WRITE without immediate) are not
  // counted, and neither are more messages than receives were posted (less one per message
  // abandoned after its First, which may have taken a receive).
  size_t delivered_lower_bound(uint32_t q) const {
    const QpSpec& qp = s_.qps[q];
    size_t posted = 0;
    for (size_t i = 0; i < s_.recvs.size(); ++i)
      if (s_.recvs[i].qp == q && r_.recv_posted_ns[i]) ++posted;
    struct Arrival {
      uint64_t at;
      size_t index;
    };
    std::vector<Arrival> arrivals;
    for (size_t k = 0; k < r_.datagrams.size(); ++k) {
      const TracedDatagram& d = r_.datagrams[k];
      if (d.dst_host != qp.host || d.dest_qpn != r_.qp_num[q]) continue;
      const bool ours = qp.type == IBV_QPT_UD ? (d.opcode == 0x64 || d.opcode == 0x65)
                                              : (d.opcode >= 0x20 && d.opcode <= 0x2b);
      if (!ours) continue;
      for (uint64_t at : d.delivered_ns)
        if (at < r_.drain_ns) arrivals.push_back({at, k});
    }
    std::sort(arrivals.begin(), arrivals.end(), [](const Arrival& a, const Arrival& b) {
      return a.at != b.at ? a.at < b.at : a.index < b.index;
    });
    if (qp.type == IBV_QPT_UD) {
      // A datagram longer than the smallest receive buffer may be dropped (IBA 9.8.4).
      uint64_t smallest = ~uint64_t{0};
      for (size_t i = 0; i < s_.recvs.size(); ++i)
        if (s_.recvs[i].qp == q && r_.recv_posted_ns[i])
          smallest = std::min(smallest, s_.recvs[i].length());
      const size_t fit = std::count_if(arrivals.begin(), arrivals.end(), [&](const Arrival& a) {
        return r_.datagrams[a.index].ud_payload + kGrhBytes <= smallest;
      });
      return std::min(fit, posted);
    }
    // UC opcodes (IBA 9.2 table 35): SEND First 0x20 Middle 0x21 Last 0x22/0x23 Only
    // 0x24/0x25; WRITE First 0x26 Middle 0x27 Last 0x28/0x29 Only 0x2a/0x2b.
    size_t whole = 0, abandoned = 0;
    bool open = false, consumes = false;
    uint32_t next = 0;
    for (size_t k = 0; k < arrivals.size(); ++k) {
      const TracedDatagram& d = r_.datagrams[arrivals[k].index];
      // Two arrivals at one instant: their order at the receiver is not known; start over.
      const bool tie = (k > 0 && arrivals[k - 1].at == arrivals[k].at) ||
                       (k + 1 < arrivals.size() && arrivals[k + 1].at == arrivals[k].at);
      const uint8_t op = d.opcode;
      const bool first = op == 0x20 || op == 0x26;
      const bool only = op == 0x24 || op == 0x25 || op == 0x2a || op == 0x2b;
      const bool last = op == 0x22 || op == 0x23 || op == 0x28 || op == 0x29;
      const bool continues = open && d.psn == next && !tie;
      if (open && !continues && consumes) ++abandoned;
      if (tie) {
        open = false;
        continue;
      }
      if (only) {
        open = false;
        if (op != 0x2a) ++whole;  // WRITE Only without immediate consumes nothing
      } else if (first) {
        open = true;
        consumes = op == 0x20;  // a WRITE consumes a receive only if its Last has immediate
        next = (d.psn + 1) & 0xffffff;
      } else if (continues && last) {
        open = false;
        if (consumes || op == 0x29) ++whole;
      } else if (continues) {
        next = (next + 1) & 0xffffff;
      } else {
        open = false;
      }
    }
    if (open && consumes) ++abandoned;
    return std::min(whole, posted > abandoned ? posted - abandoned : 0);
  }

  void expect_receive(size_t m, size_t recv, const ObservedCompletion& c) {
    const SendSpec& w = s_.sends[m];
    const RecvSpec& v = s_.recvs[recv];
    const bool ud = s_.qps[w.qp].type == IBV_QPT_UD;
    const bool uc_lossy = s_.qps[w.qp].type == IBV_QPT_UC && !faults_.clean();
    if (uc_lossy)  // a message cut short earlier may have left bytes anywhere in the buffer
      for (const Sge& g : v.sges) set_any(g.region, g.offset, g.length);
    if (w.op == Op::kWriteImm) return;  // the data went to the RETH's address
    // (Sized up front and copied: GCC 12 warns falsely on vector::insert of bytes.)
    const size_t head = ud ? kGrhBytes : 0;
    std::vector<uint8_t> stream(head + payload_[m].size());  // (the GRH is set below)
    if (!payload_[m].empty())
      std::memcpy(stream.data() + head, payload_[m].data(), payload_[m].size());
    scatter(v.sges, stream, payload_certain_[m] ? Expect::kExact : Expect::kAny);
    if (ud) {  // the GRH, as a correct device writes it for IPv4 hosts
      const auto grh =
          ud_grh(s_.qps[w.qp].host, s_.qps[w.ud_dest].host, w.length(), w.op == Op::kSendImm);
      scatter(v.sges, std::vector<uint8_t>(grh.begin(), grh.end()), Expect::kExact);
    }
    (void)c;
  }

  // ---- atomics ----
  struct AtomicOp {
    size_t send;
    uint32_t qp;
    Outcome outcome;
    uint64_t result = 0;  // the value returned into the local buffer (kSuccess only)
  };

  // Real time: an atomic that completed before another was posted precedes it in every
  // linearization. `before(a, b)` says whether a's result may come before b's.
  void check_real_time(const std::string& name, const std::vector<AtomicOp>& ops,
                       const std::function<bool(const AtomicOp&, const AtomicOp&)>& before) {
    for (const AtomicOp& a : ops) {
      if (a.outcome != Outcome::kSuccess || send_cqe_[a.send].empty()) continue;
      const uint64_t done_ns = send_cqe_[a.send][0]->time_ns;
      for (const AtomicOp& b : ops) {
        if (b.outcome != Outcome::kSuccess || b.qp == a.qp) continue;  // same QP: order check
        if (*r_.send_posted_ns[b.send] <= done_ns) continue;
        if (!before(a, b))
          add_violation_atomic(
              name, describe_send(a.send) + " completed at t=" + std::to_string(done_ns) +
                        " before " + describe_send(b.send) +
                        " was posted at t=" + std::to_string(*r_.send_posted_ns[b.send]) +
                        ", yet their results order them the other way");
      }
    }
  }

  uint64_t read_u64(uint32_t region, uint64_t offset) const {
    uint64_t v = 0;
    const std::vector<uint8_t>& mem = r_.memory[region];
    if (kGuardBytes + offset + 8 <= mem.size())
      std::memcpy(&v, mem.data() + kGuardBytes + offset, 8);
    return v;
  }
  uint64_t initial_u64(uint32_t region, uint64_t offset) const {
    uint64_t v;
    std::memcpy(&v, images_[region].initial.data() + kGuardBytes + offset, 8);
    return v;
  }

  void check_atomics() {
    std::map<std::pair<uint32_t, uint64_t>, std::vector<AtomicOp>> counters;
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      if (!op_info(w.op).atomic || outcome_[i] == Outcome::kNotPosted) continue;
      AtomicOp a{i, w.qp, outcome_[i]};
      if (a.outcome == Outcome::kSuccess) a.result = read_u64(w.sges[0].region, w.sges[0].offset);
      counters[{w.remote_region, w.remote_offset}].push_back(a);
    }
    for (auto& [where, ops] : counters) {
      const uint64_t initial = initial_u64(where.first, where.second);
      const uint64_t final_value = read_u64(where.first, where.second);
      const std::string name = "counter at region " + std::to_string(where.first) + " +" +
                               std::to_string(where.second) + " (initial " + hex(initial) +
                               ", final " + hex(final_value) + ")";
      if (s_.sends[ops[0].send].op == Op::kFetchAdd) {
        check_fetch_add(name, initial, final_value, ops);
        check_real_time(name, ops,
                        [](const AtomicOp& a, const AtomicOp& b) { return a.result < b.result; });
      } else {
        check_cmp_swp(name, initial, final_value, ops);
        check_real_time(name, ops, [&](const AtomicOp& a, const AtomicOp& b) {
          const auto pa = chain_position_.find(a.result);
          const auto pb = chain_position_.find(b.result);
          if (pa == chain_position_.end() || pb == chain_position_.end()) return true;
          const bool won = a.result == s_.sends[a.send].compare_add;
          return pb->second >= pa->second + (won ? 1 : 0);
        });
      }
    }
  }

  // FETCH_ADD: adds are positive, so sorted by result the successful ops are their own
  // linearization. Between two consecutive ones (and from the last to the final value) the
  // counter may only have grown by the adds of ops whose outcome is unknown, each used at most
  // once in the whole history and never before an earlier success of its own QP: every gap
  // must be an exact subset sum of distinct uncertain adds (checked exactly by search).
  void check_fetch_add(const std::string& name, uint64_t initial, uint64_t final_value,
                       const std::vector<AtomicOp>& ops) {
    std::vector<AtomicOp> done, maybe;
    for (const AtomicOp& a : ops) (a.outcome == Outcome::kSuccess ? done : maybe).push_back(a);
    std::sort(done.begin(), done.end(),
              [](const AtomicOp& a, const AtomicOp& b) { return a.result < b.result; });
    // Gaps: before each success, and after the last.
    std::vector<uint64_t> gaps;
    uint64_t value = initial;
    std::map<uint32_t, size_t> last_of_qp;
    for (const AtomicOp& a : done) {
      if (a.result < value) {
        add_violation_atomic(name, describe_send(a.send) + " returned " + hex(a.result) +
                                       ", below the value " + hex(value) +
                                       " the counter held after the earlier adds");
        return;
      }
      gaps.push_back(a.result - value);
      auto [it, fresh] = last_of_qp.try_emplace(a.qp, a.send);
      if (!fresh) {
        if (it->second > a.send)
          add_violation_atomic(name, describe_send(a.send) + " took effect before the earlier " +
                                         describe_send(it->second) + " of the same QP");
        it->second = a.send;
      }
      value = a.result + s_.sends[a.send].compare_add;
    }
    if (final_value < value) {
      add_violation_atomic(name, "final value is below the sum of the successful adds " +
                                     hex(value) + " (an add was lost)");
      return;
    }
    gaps.push_back(final_value - value);
    // Earliest gap each uncertain op may fill: after every success of its own QP.
    std::vector<uint64_t> adds;
    std::vector<size_t> earliest;
    for (const AtomicOp& u : maybe) {
      size_t e = 0;
      for (size_t k = 0; k < done.size(); ++k)
        if (done[k].qp == u.qp && done[k].send < u.send) e = k + 1;
      adds.push_back(s_.sends[u.send].compare_add);
      earliest.push_back(e);
    }
    if (!subset_sums(gaps, adds, earliest)) {
      size_t bad = 0;
      while (bad < gaps.size() && gaps[bad] == 0) ++bad;
      const std::string where =
          bad < done.size() ? describe_send(done[bad].send) + " returned " + hex(done[bad].result)
                            : "the final value " + hex(final_value);
      add_violation_atomic(name, where + ": the counter's jumps (" + std::to_string(gaps.size()) +
                                     " gaps) are no sums of distinct adds of the " +
                                     std::to_string(adds.size()) +
                                     " ops whose outcome is unknown (an add was lost, executed "
                                     "twice, or a result is wrong)");
    }
  }

  // Can each gap be filled exactly by distinct adds, add k only in gaps >= earliest[k]?
  // Backtracking, largest adds first; a search-step cap keeps a pathological case bounded
  // (then it answers yes: never a false alarm).
  static bool subset_sums(std::vector<uint64_t> gaps, const std::vector<uint64_t>& adds,
                          const std::vector<size_t>& earliest) {
    uint64_t need = 0, have = 0;
    for (uint64_t g : gaps) need += g;
    for (uint64_t a : adds) have += a;
    if (need > have) return false;
    std::vector<size_t> order(adds.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return adds[a] > adds[b]; });
    std::vector<uint64_t> suffix(order.size() + 1, 0);  // sum of adds[order[k..]]
    for (size_t k = order.size(); k-- > 0;) suffix[k] = suffix[k + 1] + adds[order[k]];
    uint64_t steps = 0;
    constexpr uint64_t kMaxSteps = 2'000'000;
    // Place adds in order: each goes into one gap it fits, or nowhere (it never executed).
    std::function<bool(size_t, uint64_t)> place = [&](size_t k, uint64_t left) -> bool {
      if (left == 0) return true;
      if (suffix[k] < left) return false;
      if (++steps > kMaxSteps) return true;
      const size_t a = order[k];
      for (size_t g = earliest[a]; g < gaps.size(); ++g) {
        if (gaps[g] < adds[a]) continue;
        gaps[g] -= adds[a];
        if (place(k + 1, left - adds[a])) return true;
        gaps[g] += adds[a];
      }
      return place(k + 1, left);
    };
    return place(0, need);
  }

  // CMP_SWP: swap values are unique, so the counter's values form one chain from the initial
  // value through the winning swaps; every result is a value of the chain, a winner read its
  // compare value, and each QP reads the chain in posting order.
  void check_cmp_swp(const std::string& name, uint64_t initial, uint64_t final_value,
                     const std::vector<AtomicOp>& ops) {
    std::vector<uint64_t> chain = {initial};
    std::map<uint64_t, size_t> position = {{initial, 0}};
    std::vector<bool> used(ops.size(), false);
    for (;;) {
      const uint64_t cur = chain.back();
      size_t pick = ops.size();
      for (size_t k = 0; k < ops.size() && pick == ops.size(); ++k) {
        const SendSpec& w = s_.sends[ops[k].send];
        if (used[k] || w.compare_add != cur) continue;
        if (ops[k].outcome == Outcome::kSuccess && ops[k].result == cur) pick = k;
      }
      // An op whose outcome is unknown may have won too: follow it only if the chain must go on.
      if (pick == ops.size() && cur != final_value)
        for (size_t k = 0; k < ops.size() && pick == ops.size(); ++k)
          if (!used[k] && ops[k].outcome != Outcome::kSuccess &&
              s_.sends[ops[k].send].compare_add == cur)
            pick = k;
      if (pick == ops.size()) break;
      used[pick] = true;
      const uint64_t next = s_.sends[ops[pick].send].swap;
      position[next] = chain.size();
      chain.push_back(next);
    }
    chain_position_ = position;
    if (chain.back() != final_value)
      add_violation_atomic(
          name, "final value is not the end of the chain of successful swaps " + hex(chain.back()));
    // Read positions per QP must not go back.
    std::map<uint32_t, std::pair<size_t, size_t>> last;  // qp → (min next position, send)
    for (size_t k = 0; k < ops.size(); ++k) {
      const AtomicOp& a = ops[k];
      if (a.outcome != Outcome::kSuccess) continue;
      const SendSpec& w = s_.sends[a.send];
      const auto it = position.find(a.result);
      if (it == position.end()) {
        add_violation_atomic(name, describe_send(a.send) + " returned " + hex(a.result) +
                                       ", a value the counter never held");
        continue;
      }
      const bool won = a.result == w.compare_add;
      if (won && !used[k])
        add_violation_atomic(name, describe_send(a.send) + " read its compare value " +
                                       hex(a.result) + " but its swap never took effect");
      auto [l, fresh] = last.try_emplace(a.qp, std::pair<size_t, size_t>{0, a.send});
      if (!fresh && it->second < l->second.first)
        add_violation_atomic(name, describe_send(a.send) +
                                       " read an older value than the "
                                       "earlier " +
                                       describe_send(l->second.second) + " of its QP");
      l->second = {it->second + (won ? 1 : 0), a.send};
    }
  }

  void add_violation_atomic(const std::string& name, const std::string& what) {
    add("atomic", name + ": " + what);
  }

  // ---- partitions: RETRY_EXC_ERR within the bound ----
  void check_retry_bound() {
    for (const PartitionSpec& p : faults_.partitions) {
      const uint64_t heal = p.start_ns + p.duration_ns;
      for (uint32_t q = 0; q < s_.qps.size(); ++q) {
        const QpSpec& qp = s_.qps[q];
        if (qp.type != IBV_QPT_RC) continue;
        const bool cut = (qp.host == 0) != (s_.qps[qp.peer].host == 0);
        if (!cut || pair_faulted(q)) continue;
        // A QP that failed before the cut failed for another reason (judged by "status").
        const auto early = first_error_.find(q);
        if (early != first_error_.end() && early->second->time_ns < p.start_ns) continue;
        const uint64_t bound = retry_bound_ns(qp, faults_);
        // The first signaled send not known to have succeeded before the cut, posted in time
        // to fail before the partition heals.
        std::optional<size_t> pending;
        for (size_t i = 0; i < s_.sends.size() && !pending; ++i) {
          const SendSpec& w = s_.sends[i];
          // Unsignaled WRs are skipped: whether one was acknowledged before the cut is not
          // observable.
          if (w.qp != q || !r_.send_posted_ns[i] || op_info(w.op).local || !signaled(i)) continue;
          if (succeeded_before(i, p.start_ns)) continue;
          const uint64_t from = std::max(p.start_ns, *r_.send_posted_ns[i]);
          if (from + bound >= heal) break;  // the partition is too short to be sure
          pending = i;
        }
        if (!pending) continue;
        const uint64_t from = std::max(p.start_ns, *r_.send_posted_ns[*pending]);
        const auto it = first_error_.find(q);
        if (it == first_error_.end() || it->second->time_ns >= heal) {
          add("retry-bound", "qp " + std::to_string(q) + " had " + describe_send(*pending) +
                                 " pending across the partition [" + std::to_string(p.start_ns) +
                                 ", " + std::to_string(heal) +
                                 ") but did not fail before it healed");
          continue;
        }
        const ObservedCompletion& c = *it->second;
        if (c.wc.status != IBV_WC_RETRY_EXC_ERR)
          add("retry-bound", "qp " + std::to_string(q) + " failed with " +
                                 ibv_wc_status_str(c.wc.status) +
                                 " across the partition, expected RETRY_EXC_ERR " + describe_wc(c));
        if (c.time_ns > from + bound)
          add("retry-bound", "qp " + std::to_string(q) +
                                 " failed at t=" + std::to_string(c.time_ns) + ", later than " +
                                 std::to_string(from) + " + bound " + std::to_string(bound) +
                                 " (timeout " + std::to_string(qp.timeout) + ", retry_cnt " +
                                 std::to_string(qp.retry_cnt) + ")");
      }
    }
  }

  // Did send i (or a later send of its QP, which implies it) complete successfully before t?
  bool succeeded_before(size_t i, uint64_t t) const {
    const uint32_t q = s_.sends[i].qp;
    for (size_t j = i; j < s_.sends.size(); ++j) {
      if (s_.sends[j].qp != q) continue;
      for (const ObservedCompletion* c : send_cqe_[j])
        if (c->wc.status == IBV_WC_SUCCESS && c->time_ns < t) return true;
    }
    return false;
  }

  // ---- comparison ----
  std::string owner_of(uint32_t region, uint64_t offset) const {
    auto inside = [&](const Sge& g) {
      return g.region == region && offset >= g.offset && offset < g.offset + g.length;
    };
    for (size_t i = 0; i < s_.sends.size(); ++i) {
      const SendSpec& w = s_.sends[i];
      for (const Sge& g : w.sges)
        if (inside(g)) return describe_send(i) + " local buffer";
      const uint64_t rl = op_info(w.op).atomic  ? 8
                          : w.op == Op::kBindMw ? w.bind_length
                                                : w.length();
      if (w.remote_region == region && offset >= w.remote_offset && offset < w.remote_offset + rl)
        return describe_send(i) + " remote range";
    }
    for (size_t i = 0; i < s_.recvs.size(); ++i)
      for (const Sge& g : s_.recvs[i].sges)
        if (inside(g)) return describe_recv(i) + " buffer";
    return "no WR (a gap between buffers)";
  }

  void compare_images() {
    static constexpr const char* kKindNames[] = {"region kind source", "target", "atomic",
                                                 "window"};
    for (uint32_t r = 0; r < s_.regions.size(); ++r) {
      const Image& img = images_[r];
      const std::vector<uint8_t>& mem = r_.memory[r];
      if (mem.size() != img.initial.size()) continue;
      size_t reported = 0;
      for (size_t at = 0; at < mem.size() && reported < kMaxByteReports; ++at) {
        const uint8_t got = mem[at];
        bool ok = true;
        switch (img.kind[at]) {
          case Expect::kUntouched:
            ok = got == img.initial[at];
            break;
          case Expect::kExact:
            ok = got == img.expect[at];
            break;
          case Expect::kOldOrNew:
            ok = got == img.expect[at] || got == img.initial[at];
            break;
          case Expect::kAny:
            break;
        }
        if (ok) continue;
        ++reported;
        const RegionSpec& spec = s_.regions[r];
        const bool guard = at < kGuardBytes || at >= kGuardBytes + spec.size;
        std::ostringstream os;
        os << "region " << r << " (host " << spec.host << ", "
           << kKindNames[static_cast<size_t>(spec.kind)] << ", " << spec.size << " bytes) ";
        if (guard) {
          os << "guard byte " << (at < kGuardBytes ? "before" : "after") << " the registration"
             << " at " << static_cast<int64_t>(at) - static_cast<int64_t>(kGuardBytes);
        } else {
          os << "offset " << at - kGuardBytes << " (" << owner_of(r, at - kGuardBytes) << ")";
        }
        os << ": got " << hex(got) << ", expected " << hex(img.expect[at]);
        if (img.kind[at] == Expect::kOldOrNew) os << " or the old " << hex(img.initial[at]);
        if (img.kind[at] == Expect::kUntouched) os << " (untouched)";
        add(guard || img.kind[at] == Expect::kUntouched ? "guard" : "data", os.str());
      }
    }
  }

  const Scenario& s_;
  const RunRecord& r_;
  // The scenario's faults plus what the network's trace shows it did beyond them (queue
  // overflow drops): what every expectation is judged against.
  FaultProfile faults_;
  std::vector<Violation> out_;
  std::vector<std::vector<const ObservedCompletion*>> send_cqe_, recv_cqe_;
  std::vector<Outcome> outcome_;
  std::vector<bool> qp_failed_;
  std::map<uint32_t, const ObservedCompletion*> first_error_;
  std::vector<Image> images_;
  std::map<uint64_t, size_t> chain_position_;  // the CMP_SWP counter being checked
  std::vector<std::vector<uint8_t>> payload_;
  std::vector<bool> payload_certain_;
};

}  // namespace

bool decode_datagram(const uint8_t* p, size_t length, TracedDatagram& out) {
  // BTH (IBA 9.2): opcode, SE/M/pad/version, P_Key, reserved, DestQP[24], A + reserved,
  // PSN[24]. AETH (IBA 9.3.5) follows it on ACK (0x11), ATOMIC ACK (0x12) and READ response
  // First (0x0d), Last (0x0f) and Only (0x10): syndrome, MSN[24].
  constexpr size_t kBth = 12;
  if (length < kBth) return false;
  out.opcode = p[0];
  out.dest_qpn = uint32_t{p[5]} << 16 | uint32_t{p[6]} << 8 | p[7];
  out.psn = uint32_t{p[9]} << 16 | uint32_t{p[10]} << 8 | p[11];
  const uint8_t op = out.opcode;
  out.has_aeth = op == 0x11 || op == 0x12 || op == 0x0d || op == 0x0f || op == 0x10;
  if (out.has_aeth) {
    if (length < kBth + 4) return false;
    out.syndrome = p[kBth];
  }
  if (op == 0x64 || op == 0x65) {  // UD SEND Only (with immediate): BTH, DETH[8], ImmDt[4]
    const size_t headers = kBth + 8 + (op == 0x65 ? 4 : 0) + 4;  // + ICRC
    const size_t pad = (p[1] >> 4) & 3;
    if (length < headers + pad) return false;
    out.ud_payload = static_cast<uint32_t>(length - headers - pad);
  }
  if (op == 0x0c) {  // RDMA READ request: RETH (IBA 9.3.3) = VA[8], R_Key[4], DMA length[4]
    if (length < kBth + 16) return false;
    const uint8_t* d = p + kBth + 12;
    out.dma_length = uint32_t{d[0]} << 24 | uint32_t{d[1]} << 16 | uint32_t{d[2]} << 8 | d[3];
  }
  return true;
}

uint64_t retry_bound_ns(const QpSpec& qp, const FaultProfile& faults) {
  const uint64_t t = ack_timeout_ns(qp.timeout);
  return t * (uint64_t{qp.retry_cnt} + 2) + 2 * faults.delay_max_ns + kRetrySlackNs;
}

std::vector<Violation> check(const Scenario& scenario, const RunRecord& run) {
  return Checker(scenario, run).run();
}

}  // namespace urdma::sim
