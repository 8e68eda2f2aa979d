#include "tool_run.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "netns_harness.h"

namespace urdma::process_test {

bool have_tool(const char* name) {
  return std::system(("command -v " + std::string(name) + " >/dev/null 2>&1").c_str()) == 0;
}

std::string tool_env() {
  std::string env = std::string("env LD_LIBRARY_PATH=") + URDMA_LIB_DIR +
                    " URDMA_DAEMON=" + URDMA_DAEMON_PATH +
                    " URDMA_IDLE_TIMEOUT_MS=2000 LD_BIND_NOW=1";
#ifdef URDMA_PRELOAD
  env += std::string(" LD_PRELOAD=") + URDMA_PRELOAD + " ASAN_OPTIONS=detect_leaks=0";
#endif
  return env + " ";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Started start(const std::string& command) {
  static int counter = 0;
  Started s;
  s.out_path = "/tmp/urdma_tool_" + std::to_string(getpid()) + "_" + std::to_string(counter++) +
               ".out";
  const std::string line = tool_env() + command + " >" + s.out_path + " 2>&1";
  s.pid = fork_process([line] {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    return 127;
  });
  return s;
}

namespace {

// The output of a shell command line (stdout and stderr), at most `limit` bytes.
std::string capture(const std::string& command, size_t limit = 64 * 1024) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return "(popen failed)\n";
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    if (out.size() < limit) out.append(buf, std::min(n, limit - out.size()));
  pclose(p);
  return out;
}

// What a program that did not exit in time was doing, for the failure message: urdmad's view
// of every process of this namespace (`urdma status --json`: per-process engine counters,
// pushed once a second by a thread of their own, so a stuck engine still shows what it sent,
// received and dropped) and each thread's stack (gdb, when installed). A killed tool loses its
// buffered stdout, so without this a hang says nothing.
std::string hang_report(pid_t pid) {
  std::string report = "\n--- did not exit in time; urdma status --json:\n" +
                       capture(std::string(URDMA_TOOL_PATH) + " status --json");
  // The tool is the shell's child, or the shell itself when it exec'd the last command.
  const std::string pids = std::to_string(pid) + " " +
                           capture("cat /proc/" + std::to_string(pid) + "/task/*/children");
  report += "--- threads of " + pids + ":\n";
  const bool gdb = have_tool("gdb");
  std::istringstream in(pids);
  for (std::string p; in >> p;) {
    if (read_file("/proc/" + p + "/comm") == "sh\n") continue;
    if (gdb) {
      report += capture("timeout 30 gdb -p " + p +
                        " -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 "
                        "| grep -E '^(Thread|#)'");
    } else {  // each thread's name and where it sleeps in the kernel
      report += capture("for t in /proc/" + p + "/task/*; do echo \"$t $(cat $t/comm) " +
                        "$(cat $t/wchan)\"; done");
    }
  }
  return report;
}

}  // namespace

ToolRun finish(const Started& s, int timeout_ms) {
  ToolRun r;
  const std::optional<int> status = wait_exit(s.pid, timeout_ms);
  std::string hang;
  if (!status) {
    hang = hang_report(s.pid);
    kill(s.pid, SIGKILL);
    waitpid(s.pid, nullptr, 0);
  } else if (WIFEXITED(*status)) {
    r.exit_code = WEXITSTATUS(*status);
  }
  r.output = read_file(s.out_path) + hang;
  unlink(s.out_path.c_str());
  return r;
}

ToolRun run(const std::string& command, int timeout_ms) {
  return finish(start(command), timeout_ms);
}

bool wait_output(const Started& s, const std::string& text, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    if (read_file(s.out_path).find(text) != std::string::npos) return true;
    usleep(20000);
  }
  return false;
}

bool tcp_listening(unsigned port) {
  char hex[8];
  std::snprintf(hex, sizeof hex, ":%04X", port);
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, state;
      in >> sl >> local >> remote >> state;
      if (local.size() > 5 && local.ends_with(hex) && state == "0A") return true;
    }
  }
  return false;
}

bool wait_listening(unsigned port, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (tcp_listening(port)) return true;
    usleep(10000);
  }
  return false;
}

// Parsed by hand: <regex> trips GCC 12's -Wmaybe-uninitialized under ASan.
int gid_index_of(const std::string& devinfo, const std::string& ipv4) {
  std::istringstream in(devinfo);
  std::string line;
  const std::string want = "::ffff:" + ipv4 + ", RoCE v2";
  while (std::getline(in, line)) {
    const size_t g = line.find("GID[");
    const size_t close = line.find("]:", g == std::string::npos ? 0 : g);
    if (g == std::string::npos || close == std::string::npos) continue;
    size_t v = close + 2;
    while (v < line.size() && (line[v] == ' ' || line[v] == '\t')) ++v;
    if (line.compare(v, std::string::npos, want) != 0) continue;
    return std::atoi(line.substr(g + 4, close - g - 4).c_str());
  }
  return -1;
}

long long number_before(const std::string& out, const std::string& marker) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    const size_t end = line.find_last_not_of(" \t", at == 0 ? 0 : at - 1);
    if (at == 0 || end == std::string::npos) return -1;
    const size_t sp = line.find_last_of(" \t", end);
    const std::string num = line.substr(sp == std::string::npos ? 0 : sp + 1,
                                        end - (sp == std::string::npos ? 0 : sp + 1) + 1);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(num);
  }
  return -1;
}

std::vector<double> result_row(const std::string& out) {
  std::istringstream in(out);
  bool header = false;
  for (std::string line; std::getline(in, line);) {
    if (line.find("#bytes") != std::string::npos) {
      header = true;
      continue;
    }
    if (!header) continue;
    std::istringstream row(line);
    std::vector<double> v;
    for (double d; row >> d;) v.push_back(d);
    if (!v.empty()) return v;
  }
  return {};
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string perftest_command(const std::string& tool, int size, int iters, unsigned port,
                             int gid) {
  std::string a = tool + " -d urdma0 -x " + std::to_string(gid) + " -p " + std::to_string(port) +
                  " -n " + std::to_string(iters) + " -F -u 16";
  if (!tool.starts_with("ib_atomic")) a += " -s " + std::to_string(size);
  if (!tool.ends_with("_lat")) a += " --report_gbits";
  return a;
}

void expect_no_qperf_failure(const ToolRun& r) {
  for (const char* bad : {"failed", "error", "mismatch", "timed out"})
    EXPECT_EQ(r.output.find(bad), std::string::npos) << bad << " in:\n" << r.output;
}

void expect_qperf_ran(const ToolRun& r, const std::vector<std::string>& tests, int latencies,
                      int bandwidths, int rates) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& t : tests)
    EXPECT_NE(r.output.find(t + ":\n"), std::string::npos) << t << r.output;
  EXPECT_EQ(count(r.output, "latency  ="), latencies) << r.output;
  EXPECT_EQ(count(r.output, "bw  ="), bandwidths) << r.output;
  EXPECT_EQ(count(r.output, "msg_rate  ="), rates) << r.output;
  expect_no_qperf_failure(r);
}

}  // namespace urdma::process_test
