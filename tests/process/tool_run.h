// Running unmodified programs (Debian's ibverbs-utils, perftest, rdmacm-utils, the examples) on
// urdma from a process test: each runs under /bin/sh with LD_LIBRARY_PATH naming the build's
// lib/ directory, so the loader gives it OUR libibverbs.so.1 and librdmacm.so.1, which start a
// urdmad in the test's namespace by themselves.
//
// tool_run.cc is the library urdma_tool_run (tests/process/CMakeLists.txt), compiled once with
// URDMA_LIB_DIR, URDMA_DAEMON_PATH, URDMA_TOOL_PATH and (under ASan) URDMA_PRELOAD, which every
// test program linking it sees too.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace urdma::process_test {

// True when `name` is a command on PATH.
bool have_tool(const char* name);

// The `env ...` prefix a program runs under: our libraries first, the test's urdmad binary, a
// short daemon idle timeout. Under ASan the runtime is preloaded (the binaries are not
// instrumented) and their own leaks are not reported.
std::string tool_env();

std::string read_file(const std::string& path);

// A program started with its stdout and stderr to a file; wait for it with finish().
struct Started {
  pid_t pid = -1;
  std::string out_path;
};

struct ToolRun {
  int exit_code = -1;  // -1: did not exit in time (then killed) or died of a signal
  std::string output;  // stdout and stderr
};

// Starts a shell command line under tool_env().
Started start(const std::string& command);
// Waits up to `timeout_ms` (kills it after), collects its output and removes the output file.
ToolRun finish(const Started& s, int timeout_ms);
ToolRun run(const std::string& command, int timeout_ms = 10000);

// Waits until the program's output so far contains `text`.
bool wait_output(const Started& s, const std::string& text, int timeout_ms);

// Is a TCP socket of this namespace listening on `port`? (/proc/net/tcp{,6}: state 0A)
bool tcp_listening(unsigned port);
bool wait_listening(unsigned port, int timeout_ms);

// The GID index `ibv_devinfo -v` shows for an IPv4 address ("GID[  2]:\t\t::ffff:10.89.1.1,
// RoCE v2"), or -1.
int gid_index_of(const std::string& devinfo, const std::string& ipv4);

// The whole number just before `marker` on the first line holding it ("819200 bytes in 0.14
// seconds", "100 iters in 0.14 seconds": ibv_*_pingpong's report), or -1.
long long number_before(const std::string& out, const std::string& marker);

// The numbers of perftest's result row (the first line of numbers after the "#bytes" header).
std::vector<double> result_row(const std::string& out);

// How many times `what` occurs in `text`.
int count(const std::string& text, const std::string& what);

// A perftest command line for urdma0: GID index `gid` (-x), TCP `port`, `iters` iterations, -F
// (no CPU-frequency warning), -u 16 (a 268 ms local ACK timeout: perftest's default 67 ms × 8
// tries is less than a loaded 2-core machine may keep a spinning peer off the CPU), -s `size`
// except for the atomics (8 bytes by definition), --report_gbits for the bandwidth tools.
std::string perftest_command(const std::string& tool, int size, int iters, unsigned port,
                             int gid);

// A qperf client's run of `tests` (gtest expectations): exit 0, a "<test>:" block for each, as
// many "latency =", "bw =" and "msg_rate =" results as given, and no line naming a failure.
void expect_qperf_ran(const ToolRun& r, const std::vector<std::string>& tests, int latencies,
                      int bandwidths, int rates);
// No failure named in a qperf process's output (its server's too).
void expect_no_qperf_failure(const ToolRun& r);

}  // namespace urdma::process_test
