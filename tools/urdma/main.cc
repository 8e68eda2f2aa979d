// The `urdma` command line (README.md, "urdma(1)"). Subcommands:
//   run CMD ARGS...  run an unmodified verbs program on urdma (our libibverbs first, urdmad up)
//   status           this namespace's urdmad: slots, client processes, GIDs, counters
//   devices          urdma devices and their GID tables (the index for -g / -x)
//   decode FILE      print every RoCEv2 packet of a pcap/pcapng capture; exit 1 if any is
//                    malformed or fails its ICRC, 2 if the file cannot be read.
//   capture FILE     record what this namespace's urdma processes send and receive as a pcap
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/urdma/commands.h"
#include "tools/urdma/decode.h"

int main(int argc, char** argv) {
  CLI::App app{"urdma: a software RoCEv2 device in user space"};
  app.require_subcommand(1);

  urdma::tools::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand(
      "run",
      "Run an unmodified verbs program on urdma: our libibverbs.so.1 first on LD_LIBRARY_PATH, "
      "urdmad started if absent; the program's exit status is urdma's");
  bool no_daemon = false;
  run_cmd->add_flag("--no-daemon", no_daemon,
                    "do not start urdmad first (the library starts it when the program opens the "
                    "device)");
  bool no_view = false;
  run_cmd->add_flag("--no-view", no_view,
                    "do not give the program the device view (/sys/class/infiniband/urdma0, "
                    "/dev/infiniband/uverbsN) that UCX, libfabric and sysfs readers need");
  run_cmd->footer("Usage: urdma run [--no-daemon] [--no-view] [--] PROGRAM [ARGS...]");

  urdma::tools::StatusOptions status;
  CLI::App* status_cmd = app.add_subcommand(
      "status",
      "Show this network namespace's urdmad: pid, uptime, slots, client processes, GIDs and "
      "counters (rdma statistic names). Starts no daemon; exit 1 if none runs");
  status_cmd->add_flag("--json", status.json, "machine-readable output");

  urdma::tools::DevicesOptions devices;
  CLI::App* devices_cmd = app.add_subcommand(
      "devices",
      "List urdma devices (urdma0: this network namespace's urdmad) with their GID tables: the "
      "index to pass to -g (ibv_*_pingpong) or -x (perftest)");
  devices_cmd->add_flag("--json", devices.json, "machine-readable output");
  bool no_start = false;
  devices_cmd->add_flag("--no-start", no_start, "do not start urdmad when none runs (exit 1)");

  urdma::tools::CaptureOptions capture;
  CLI::App* capture_cmd = app.add_subcommand(
      "capture",
      "Record the RoCEv2 packets this network namespace's urdma processes send and receive "
      "(each packet once as sent, once as received when both ends are here) into a pcap file "
      "that tshark, Wireshark and `urdma decode` read; until -c packets or Ctrl-C");
  capture_cmd->add_option("file", capture.path, "the pcap file to write")->required();
  capture_cmd->add_option("-i,--interface", capture.filter,
                          "only the process holding this urdmad slot, or with this pid "
                          "(`urdma status` lists both); 0 or urdmad's pid: the host's own MADs");
  capture_cmd->add_option("-c,--count", capture.count, "stop after this many packets");

  urdma::tools::DecodeOptions decode;
  CLI::App* cmd = app.add_subcommand(
      "decode", "Decode every RoCEv2 packet of a pcap/pcapng capture (exit 1 if any is bad)");
  cmd->add_option("file", decode.path, "capture file (pcap or pcapng)")->required();
  cmd->add_flag("-v,--verbose", decode.verbose, "print every field of every header");
  cmd->add_option("--port", decode.udp_port, "UDP destination port of RoCEv2")
      ->default_val(decode.udp_port);

  // `run`: everything from the program on is the program's (its own options included), so
  // CLI11 sees only what comes before it: the first word after `run` that is not one of run's
  // options, or what follows `--`.
  int parsed_argc = argc;
  if (argc > 1 && std::string(argv[1]) == "run") {
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--") {
        parsed_argc = i;
        run.command.assign(argv + i + 1, argv + argc);
        break;
      }
      if (a.empty() || a[0] != '-') {
        parsed_argc = i;
        run.command.assign(argv + i, argv + argc);
        break;
      }
    }
  }
  CLI11_PARSE(app, parsed_argc, argv);

  if (run_cmd->parsed()) {
    if (run.command.empty()) {
      std::cerr << "urdma run: no program given\n" << run_cmd->help();
      return 2;
    }
    run.start_daemon = !no_daemon;
    run.view = !no_view;
    return urdma::tools::run_command(run);
  }
  if (status_cmd->parsed()) return urdma::tools::print_status(status);
  if (capture_cmd->parsed()) return urdma::tools::capture_packets(capture);
  if (devices_cmd->parsed()) {
    devices.start_daemon = !no_start;
    return urdma::tools::print_devices(devices);
  }
  if (cmd->parsed()) {
    std::string error;
    const auto summary = urdma::tools::decode_capture(decode, std::cout, error);
    if (!error.empty()) {
      std::cerr << "urdma decode: " << decode.path << ": " << error << '\n';
      return 2;
    }
    std::cout << summary.roce_packets << " RoCEv2 packets, " << summary.malformed
              << " malformed, " << summary.icrc_failed << " with a bad ICRC\n";
    return summary.ok() ? 0 : 1;
  }
  return 0;
}
