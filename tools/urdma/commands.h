// The `urdma` subcommands other than decode (decode.h): run, status, devices, capture.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace urdma::tools {

struct RunOptions {
  std::vector<std::string> command;  // the program and its arguments
  bool start_daemon = true;
  bool view = true;  // give the program the device view (view.h)
};
// Execs the command on urdma (our libibverbs first, urdmad up); returns only on failure, with
// the exit status to use (127: not found, 126: not executable, 1: urdmad could not start).
int run_command(const RunOptions& options);

// The directories `urdma run` puts first on LD_LIBRARY_PATH, best first, that exist:
// $URDMA_LIBDIR; <dir of this executable>/../<libdir>/urdma (installed); the build tree's lib.
std::vector<std::string> library_dirs();

struct StatusOptions {
  bool json = false;
};
// `urdma status`: the daemon, its slots, its clients with their counters, the GID table.
// 0, or 1 when no urdmad serves this network namespace (or it does not answer).
int print_status(const StatusOptions& options);

struct DevicesOptions {
  bool json = false;
  bool start_daemon = true;
  bool view = true;  // give the program the device view (view.h)
};
// `urdma devices`: urdma0 (this namespace's urdmad) and its GID table.
int print_devices(const DevicesOptions& options);

struct CaptureOptions {
  std::string path;               // the pcap file to write
  uint32_t filter = 0xFFFFFFFF;   // a slot number or a pid; all ones: every process
  uint64_t count = 0;             // stop after this many packets; 0: when interrupted
};
// `urdma capture`: the RoCEv2 datagrams this namespace's urdma processes send and receive, as a
// raw-IP pcap (capture/pcap_writer.h), until `count` packets or SIGINT/SIGTERM. 0, or 1 (no
// daemon, a file that cannot be written).
int capture_packets(const CaptureOptions& options);

}  // namespace urdma::tools
