// The property checker; see checker.h for the properties.
#include "sim/checker.h"

#include <algorithm>
#include <cstring>
#include <map>
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
  Checker(const Scenario& s, const RunRecord& r) : s_(s), r_(r) {}

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
    check_atomics();
    check_retry_bound();
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
  bool has_partition() const { return s_.config.faults.any_partition(); }

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
    for (size_t i = 0; i < s_.sends.size(); ++i) by_qp[s_.sends[i].qp].push_back(i);
    for (uint32_t q = 0; q < s_.qps.size(); ++q) check_send_queue(q, by_qp[q]);
  }

  void check_send_queue(uint32_t q, const std::vector<size_t>& sends) {
    const QpSpec& qp = s_.qps[q];
    // Order: the completions of this QP's sends, by poll order, are in posting order.
    std::vector<std::pair<const ObservedCompletion*, size_t>> seen;
    for (size_t i : sends)
      for (const ObservedCompletion* c : send_cqe_[i]) seen.push_back({c, i});
    std::sort(seen.begin(), seen.end(), [](auto& a, auto& b) { return a.first < b.first; });
    for (size_t k = 1; k < seen.size(); ++k)
      if (seen[k].second < seen[k - 1].second)
        add("order", describe_send(seen[k].second) + " completed after the later " +
                         describe_send(seen[k - 1].second));

    // Outcomes, and the flush rule: after the first unsuccessful completion every later
    // posted WR completes, with WR_FLUSH_ERR.
    bool failed = false;
    size_t last_seen = 0;
    bool any_seen = false;
    for (size_t k = 0; k < sends.size(); ++k)
      if (!send_cqe_[sends[k]].empty()) {
        last_seen = k;
        any_seen = true;
      }
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
        check_send_fields(i, c);
        continue;
      }
      outcome_[i] = Outcome::kFailed;
      if (!failed) {
        failed = true;
        qp_failed_[q] = true;
        first_error_[q] = &c;
        // Which first errors may happen at all.
        const bool drain_flush = wc.status == IBV_WC_WR_FLUSH_ERR && c.time_ns >= r_.drain_ns;
        const bool allowed_retry =
            has_partition() && qp.type == IBV_QPT_RC && wc.status == IBV_WC_RETRY_EXC_ERR;
        if (!allowed_retry && !drain_flush)
          add("status", describe_send(i) + " failed " + describe_wc(c) +
                            (has_partition() ? " (only RETRY_EXC_ERR is expected)"
                                             : " (no failure is expected without a partition)"));
        if (drain_flush && !has_partition())
          add("status", describe_send(i) +
                            " was still outstanding at the end of the run and "
                            "flushed " +
                            describe_wc(c));
      } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        add("status", describe_send(i) + " after the QP's first error must be WR_FLUSH_ERR, got " +
                          describe_wc(c));
      }
      (void)w;
    }
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
      const bool landed =
          outcome_[i] == Outcome::kSuccess &&
          (q.type == IBV_QPT_RC || s_.config.faults.clean());  // UC: when sent; a gap drops it
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
    // Which QPs' messages may have been cut short (for the expectations of unmatched buffers).
    bool any_failed = false;
    for (bool f : qp_failed_) any_failed |= f;

    // Successful receive completions per receiving QP, in poll order.
    std::vector<std::vector<std::pair<const ObservedCompletion*, size_t>>> got(s_.qps.size());
    // QPNs are per device: a completion names its QP by (host, qp_num).
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> by_qpn;
    for (uint32_t q = 0; q < s_.qps.size(); ++q) by_qpn[{s_.qps[q].host, r_.qp_num[q]}] = q;
    std::vector<bool> matched(s_.recvs.size(), false);
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
        add("status", describe_recv(i) + " failed " + describe_wc(c));
      }
    }

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

    // Unmatched receive buffers: untouched, unless a message may have been cut short in them.
    for (size_t i = 0; i < s_.recvs.size(); ++i) {
      if (matched[i]) continue;
      const RecvSpec& v = s_.recvs[i];
      const bool uc_or_ud_lossy =
          v.qp != kNone && s_.qps[v.qp].type == IBV_QPT_UC && !s_.config.faults.clean();
      if (any_failed || uc_or_ud_lossy)
        for (const Sge& g : v.sges) set_any(g.region, g.offset, g.length);
    }
  }

  void match_messages(uint32_t q,
                      const std::vector<std::pair<const ObservedCompletion*, size_t>>& recvs,
                      std::vector<bool>& matched) {
    const QpSpec& qp = s_.qps[q];
    const std::vector<size_t> msgs = messages_to(q);
    const FaultProfile& f = s_.config.faults;
    enum class Mode { kStrict, kSubsequence, kAny } mode = Mode::kStrict;
    if (qp.type != IBV_QPT_RC && !f.clean()) mode = f.reorders() ? Mode::kAny : Mode::kSubsequence;
    std::vector<bool> used(msgs.size(), false);
    size_t next = 0;
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
        const size_t from = mode == Mode::kSubsequence ? next : 0;
        for (size_t k = from; k < msgs.size(); ++k) {
          if (mode == Mode::kAny && used[k] && !f.duplicate_ppm) continue;
          std::string w = mismatch(msgs[k], recv, *c);
          if (w.empty()) {
            found = k;
            break;
          }
          if (k == from) why = w;
        }
        if (found < msgs.size() && mode == Mode::kSubsequence) next = found + 1;
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
    // Nothing may go missing on RC; nothing at all on a clean network.
    size_t must = 0;
    if (qp.type == IBV_QPT_RC) {
      // Every message the requester saw succeed was delivered (RC executes in order).
      for (size_t k = 0; k < msgs.size(); ++k)
        if (outcome_[msgs[k]] == Outcome::kSuccess) must = k + 1;
    } else if (f.clean()) {
      must = msgs.size();
    }
    if (recvs.size() < must)
      add("delivery", "qp " + std::to_string(q) + " " + type_name(qp.type) + " received " +
                          std::to_string(recvs.size()) + " messages, expected at least " +
                          std::to_string(must) + "; first missing " +
                          describe_send(msgs[recvs.size()]));
  }

  void expect_receive(size_t m, size_t recv, const ObservedCompletion& c) {
    const SendSpec& w = s_.sends[m];
    const RecvSpec& v = s_.recvs[recv];
    const bool ud = s_.qps[w.qp].type == IBV_QPT_UD;
    const bool uc_lossy = s_.qps[w.qp].type == IBV_QPT_UC && !s_.config.faults.clean();
    if (uc_lossy)  // a message cut short earlier may have left bytes anywhere in the buffer
      for (const Sge& g : v.sges) set_any(g.region, g.offset, g.length);
    if (w.op == Op::kWriteImm) return;  // the data went to the RETH's address
    // (Sized up front and copied: GCC 12 warns falsely on vector::insert of bytes.)
    const size_t head = ud ? kGrhBytes : 0;
    std::vector<uint8_t> stream(head + payload_[m].size());
    if (!payload_[m].empty())
      std::memcpy(stream.data() + head, payload_[m].data(), payload_[m].size());
    scatter(v.sges, stream, payload_certain_[m] ? Expect::kExact : Expect::kAny);
    if (ud) {  // the GRH: its 40 bytes are the device's to fill
      uint64_t pos = 0;
      for (const Sge& g : v.sges) {
        if (pos >= kGrhBytes) break;
        const uint64_t n = std::min<uint64_t>(g.length, kGrhBytes - pos);
        set_any(g.region, g.offset, n);
        pos += n;
      }
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
      if (s_.sends[ops[0].send].op == Op::kFetchAdd)
        check_fetch_add(name, initial, final_value, ops);
      else
        check_cmp_swp(name, initial, final_value, ops);
    }
  }

  // FETCH_ADD: sorted by result, the successful ops must form the prefix sums of their adds
  // starting at the initial value (plus adds of ops whose outcome is unknown), each QP's ops in
  // posting order, ending at the final value.
  void check_fetch_add(const std::string& name, uint64_t initial, uint64_t final_value,
                       const std::vector<AtomicOp>& ops) {
    std::vector<AtomicOp> done;
    uint64_t uncertain_sum = 0;
    for (const AtomicOp& a : ops) {
      if (a.outcome == Outcome::kSuccess)
        done.push_back(a);
      else
        uncertain_sum += s_.sends[a.send].compare_add;
    }
    std::sort(done.begin(), done.end(),
              [](const AtomicOp& a, const AtomicOp& b) { return a.result < b.result; });
    uint64_t value = initial;
    std::map<uint32_t, size_t> last_of_qp;
    for (const AtomicOp& a : done) {
      const uint64_t add = s_.sends[a.send].compare_add;
      if (a.result < value || a.result - value > uncertain_sum) {
        add_violation_atomic(name, describe_send(a.send) + " returned " + hex(a.result) +
                                       ", but the counter could only hold " + hex(value) +
                                       (uncertain_sum ? " (plus failed adds)" : "") +
                                       " at that point of any linearization");
        return;
      }
      auto [it, fresh] = last_of_qp.try_emplace(a.qp, a.send);
      if (!fresh) {
        if (it->second > a.send)
          add_violation_atomic(name, describe_send(a.send) + " took effect before the earlier " +
                                         describe_send(it->second) + " of the same QP");
        it->second = a.send;
      }
      value = a.result + add;
    }
    if (final_value < value || final_value - value > uncertain_sum)
      add_violation_atomic(name, "final value is not the sum of the successful adds " + hex(value) +
                                     (uncertain_sum ? " plus some failed ones" : "") +
                                     " (an add was lost or executed twice)");
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
    for (const PartitionSpec& p : s_.config.faults.partitions) {
      const uint64_t heal = p.start_ns + p.duration_ns;
      for (uint32_t q = 0; q < s_.qps.size(); ++q) {
        const QpSpec& qp = s_.qps[q];
        if (qp.type != IBV_QPT_RC) continue;
        const bool cut = (qp.host == 0) != (s_.qps[qp.peer].host == 0);
        if (!cut) continue;
        const uint64_t bound = retry_bound_ns(qp, s_.config.faults);
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
  std::vector<Violation> out_;
  std::vector<std::vector<const ObservedCompletion*>> send_cqe_, recv_cqe_;
  std::vector<Outcome> outcome_;
  std::vector<bool> qp_failed_;
  std::map<uint32_t, const ObservedCompletion*> first_error_;
  std::vector<Image> images_;
  std::vector<std::vector<uint8_t>> payload_;
  std::vector<bool> payload_certain_;
};

}  // namespace

uint64_t retry_bound_ns(const QpSpec& qp, const FaultProfile& faults) {
  const uint64_t t = ack_timeout_ns(qp.timeout);
  return t * (uint64_t{qp.retry_cnt} + 2) + 2 * faults.delay_max_ns + kRetrySlackNs;
}

std::vector<Violation> check(const Scenario& scenario, const RunRecord& run) {
  return Checker(scenario, run).run();
}

}  // namespace urdma::sim
