// urdma-sim: runs a range of seeds of the deterministic simulation and checks every property.
//
//   urdma-sim --seeds 1000-1999 --loss-ppm 10000 --reorder-ppm 10000
//
// Every seed builds a scenario (scenario.h), runs it on real engines over the simulated network
// (cluster.h) and checks it (checker.h). A failing seed prints its violations and the exact
// command line that replays it alone; a replay is bit-identical (same trace hash). The last
// line of output is always "N passed, M failed".
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/scenario.h"

namespace {

using namespace urdma::sim;

// "1000-1999", "42", or "1,5,9-12".
bool parse_seeds(const std::string& text, std::vector<uint64_t>& out) {
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t dash = part.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoull(part));
      } else {
        const uint64_t a = std::stoull(part.substr(0, dash));
        const uint64_t b = std::stoull(part.substr(dash + 1));
        if (b < a) return false;
        for (uint64_t s = a; s <= b; ++s) out.push_back(s);
      }
    } catch (const std::exception&) {
      return false;
    }
  }
  return !out.empty();
}

// "START:DURATION" in ns (suffixes us, ms, s allowed on each).
bool parse_time(std::string t, uint64_t& out) {
  uint64_t mul = 1;
  auto ends = [&](const char* s) {
    const std::string suf(s);
    if (t.size() > suf.size() && t.compare(t.size() - suf.size(), suf.size(), suf) == 0) {
      t.resize(t.size() - suf.size());
      return true;
    }
    return false;
  };
  if (ends("ns"))
    mul = 1;
  else if (ends("us"))
    mul = 1'000;
  else if (ends("ms"))
    mul = 1'000'000;
  else if (ends("s"))
    mul = 1'000'000'000;
  try {
    size_t used = 0;
    out = std::stoull(t, &used) * mul;
    return used == t.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_size(std::string t, uint64_t& out) {
  uint64_t mul = 1;
  if (!t.empty() && (t.back() == 'K' || t.back() == 'k')) mul = 1024;
  if (!t.empty() && (t.back() == 'M' || t.back() == 'm')) mul = 1024 * 1024;
  if (mul != 1) t.pop_back();
  try {
    size_t used = 0;
    out = std::stoull(t, &used) * mul;
    return used == t.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_range(const std::string& t, uint64_t& lo, uint64_t& hi) {
  const size_t dash = t.find('-');
  try {
    lo = std::stoull(t.substr(0, dash));
    hi = dash == std::string::npos ? lo : std::stoull(t.substr(dash + 1));
  } catch (const std::exception&) {
    return false;
  }
  return lo <= hi;
}

// The command line with --seeds replaced by one seed (and -v added): what replays it.
std::string replay_command(int argc, char** argv, uint64_t seed) {
  std::string out = "urdma-sim";
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seeds" && i + 1 < argc) {
      ++i;
      a = "--seeds " + std::to_string(seed);
    } else if (a.rfind("--seeds=", 0) == 0) {
      a = "--seeds " + std::to_string(seed);
    }
    verbose |= a == "-v" || a == "--verbose";
    out += " " + a;
  }
  if (!verbose) out += " -v";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "urdma deterministic simulation: real engines on a simulated network, every "
      "property checked for every seed"};
  std::string seeds_text = "1-100";
  ScenarioConfig cfg;
  FaultProfile& f = cfg.faults;
  std::vector<std::string> partitions;
  std::string ops_text = "all";
  std::string qps_text;
  std::string wrs_text;
  std::string max_size_text = "64K";
  std::string budget_text = "24M";
  std::string timeout_text;
  std::string retry_text;
  uint64_t max_virtual_ms = 5'000;
  int verbose = 0;
  bool trace = false;
  bool stop_on_fail = false;
  bool dump_scenario = false;
  app.add_option("--seeds", seeds_text, "seeds: N, A-B or a comma list (default 1-100)");
  app.add_option("--loss-ppm", f.loss_ppm, "datagram loss, parts per million")
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--dup-ppm", f.duplicate_ppm, "datagram duplication, ppm")
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--reorder-ppm", f.reorder_ppm, "datagram reordering, ppm")
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--corrupt-ppm", f.corrupt_ppm, "one flipped bit per datagram, ppm")
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--delay-ns-min", f.delay_min_ns, "one-way delay minimum (ns)");
  app.add_option("--delay-ns-max", f.delay_max_ns, "one-way delay maximum (ns)");
  app.add_option("--partition", partitions,
                 "START:DURATION (ns, or with us/ms/s): host 0 cut from the others; repeatable");
  app.add_option("--ops", ops_text,
                 "operations: all, or a comma list of send,send_imm,send_inv,write,write_imm,"
                 "read,cmp_swp,fetch_add,local_inv,bind_mw");
  app.add_option("--qps", qps_text,
                 "RC,UC,UD: RC pairs, UC pairs, UD QPs per host (default 3,1,1)");
  app.add_option("--hosts", cfg.hosts, "hosts (2..16)")->check(CLI::Range(2, 16));
  app.add_option("--wrs", wrs_text, "send WRs per QP, MIN-MAX (default 4-14)");
  app.add_option("--max-size", max_size_text, "largest message, bytes (K/M suffix; default 64K)");
  app.add_option("--memory-budget", budget_text, "target memory per seed (default 24M)");
  app.add_option("--late-recv-percent", cfg.late_recv_percent,
                 "percent of RC receive queues posted partly late (RNR)")
      ->check(CLI::Range(0, 100));
  app.add_option("--timeout", timeout_text, "RC local ACK timeout exponent range (default 8-11)");
  app.add_option("--retry-cnt", retry_text, "RC retry_cnt range (default 7-7)");
  std::string rnr_text;
  app.add_option("--rnr-retry", rnr_text, "RC rnr_retry range (default 7-7; 7 = forever)");
  app.add_option("--errors-percent", cfg.errors_percent,
                 "percent of RC pairs that get one injected error (bad rkey, out of range, no "
                 "access, stale window, short receive, RNR, bad invalidate, MW misuse, no "
                 "READ/ATOMIC resources, dead "
                 "peer; half as many UD QPs send one datagram too long for its receiver); its "
                 "exact outcome is checked")
      ->check(CLI::Range(0, 100));
  app.add_option("--post-window-ns", cfg.post_window_ns, "sends are posted over [0, this]");
  app.add_option("--max-virtual-ms", max_virtual_ms, "livelock guard: virtual time per seed");
  app.add_flag("-v,--verbose", verbose, "one line per seed (twice: scenario and counters too)");
  app.add_flag("--trace", trace, "print every network event and completion");
  app.add_flag("--stop-on-fail", stop_on_fail, "stop at the first failing seed");
  app.add_flag("--dump-scenario", dump_scenario, "print every QP, send and receive of each seed");
  CLI11_PARSE(app, argc, argv);

  std::vector<uint64_t> seeds;
  if (!parse_seeds(seeds_text, seeds)) {
    std::cerr << "bad --seeds '" << seeds_text << "'\n";
    return 2;
  }
  const std::optional<OpSet> ops = parse_ops(ops_text);
  if (!ops) {
    std::cerr << "bad --ops '" << ops_text << "'\n";
    return 2;
  }
  cfg.ops = *ops;
  if (f.delay_min_ns > f.delay_max_ns) f.delay_max_ns = f.delay_min_ns;
  for (const std::string& p : partitions) {
    const size_t colon = p.find(':');
    PartitionSpec spec;
    if (colon == std::string::npos || !parse_time(p.substr(0, colon), spec.start_ns) ||
        !parse_time(p.substr(colon + 1), spec.duration_ns)) {
      std::cerr << "bad --partition '" << p << "' (START:DURATION)\n";
      return 2;
    }
    f.partitions.push_back(spec);
  }
  if (!qps_text.empty()) {
    unsigned rc, uc, ud;
    if (std::sscanf(qps_text.c_str(), "%u,%u,%u", &rc, &uc, &ud) != 3) {
      std::cerr << "bad --qps '" << qps_text << "' (RC,UC,UD)\n";
      return 2;
    }
    cfg.rc_pairs = rc;
    cfg.uc_pairs = uc;
    cfg.ud_per_host = ud;
  }
  uint64_t lo, hi;
  if (!wrs_text.empty()) {
    if (!parse_range(wrs_text, lo, hi)) return std::cerr << "bad --wrs\n", 2;
    cfg.wrs_min = static_cast<uint32_t>(lo);
    cfg.wrs_max = static_cast<uint32_t>(hi);
  }
  if (!timeout_text.empty()) {
    if (!parse_range(timeout_text, lo, hi) || hi > 31 || lo == 0)
      return std::cerr << "bad --timeout (1..31)\n", 2;
    cfg.timeout_min = static_cast<uint8_t>(lo);
    cfg.timeout_max = static_cast<uint8_t>(hi);
  }
  if (!retry_text.empty()) {
    if (!parse_range(retry_text, lo, hi) || hi > 7) return std::cerr << "bad --retry-cnt\n", 2;
    cfg.retry_cnt_min = static_cast<uint8_t>(lo);
    cfg.retry_cnt_max = static_cast<uint8_t>(hi);
  }
  if (!rnr_text.empty()) {
    if (!parse_range(rnr_text, lo, hi) || hi > 7) return std::cerr << "bad --rnr-retry\n", 2;
    cfg.rnr_retry_min = static_cast<uint8_t>(lo);
    cfg.rnr_retry_max = static_cast<uint8_t>(hi);
  }
  if (!parse_size(max_size_text, cfg.max_size_bytes) ||
      !parse_size(budget_text, cfg.memory_budget_bytes)) {
    std::cerr << "bad --max-size / --memory-budget\n";
    return 2;
  }

  RunOptions run_opts;
  run_opts.deadline_ns = max_virtual_ms * 1'000'000;
  if (trace) run_opts.trace_out = &std::cout;

  size_t passed = 0, failed = 0;
  for (uint64_t seed : seeds) {
    const Scenario s = generate(cfg, seed);
    if (dump_scenario) std::cout << dump(s);
    const RunResult r = run_scenario(s, run_opts);
    char hash[32];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(r.trace_hash));
    if (r.violations.empty()) {
      ++passed;
      if (verbose)
        std::cout << "ok   seed " << seed << " hash " << hash << " t=" << r.end_ns << "ns steps "
                  << r.steps << " datagrams " << r.network.sent << "\n";
    } else {
      ++failed;
      std::cout << "FAIL seed " << seed << " hash " << hash << ": " << r.violations.size()
                << " violation(s)\n";
      for (const Violation& v : r.violations)
        std::cout << "  " << v.property << ": " << v.detail << "\n";
      std::cout << "  replay: " << replay_command(argc, argv, seed) << "\n";
    }
    if (verbose > 1 || (!r.violations.empty() && verbose)) {
      std::cout << "  scenario: " << summary(s) << "\n";
      const auto& n = r.network;
      std::cout << "  network: sent " << n.sent << " delivered " << n.delivered << " lost "
                << n.dropped_loss << " partitioned " << n.dropped_partition << " dup "
                << n.duplicated << " reordered " << n.reordered << " corrupted " << n.corrupted
                << " rx-full " << n.dropped_rx_full << "\n";
      for (size_t h = 0; h < r.engines.size(); ++h) {
        const auto& e = r.engines[h];
        std::cout << "  engine " << h << ": sent_pkts " << e.sent_pkts << " rcvd_pkts "
                  << e.rcvd_pkts << " duplicate_request " << e.duplicate_request
                  << " out_of_seq_request " << e.out_of_seq_request << " rcvd_rnr_err "
                  << e.rcvd_rnr_err << " send_rnr_err " << e.send_rnr_err << " completer_retry_err "
                  << e.completer_retry_err << " retry_exceeded_err " << e.retry_exceeded_err
                  << " drops " << e.drops() << " (icrc " << e.drop_icrc << ")\n";
      }
    }
    std::cout.flush();
    if (failed && stop_on_fail) break;
  }
  std::cout << passed << " passed, " << failed << " failed" << std::endl;
  return failed ? 1 : 0;
}
