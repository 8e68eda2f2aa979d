// The `urdma` command line. Subcommands:
//   decode FILE   print every RoCEv2 packet of a pcap/pcapng capture; exit 1 if any is
//                 malformed or fails its ICRC, 2 if the file cannot be read.
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/urdma/decode.h"

int main(int argc, char** argv) {
  CLI::App app{"urdma: a software RoCEv2 device in user space"};
  app.require_subcommand(1);

  urdma::tools::DecodeOptions decode;
  CLI::App* cmd = app.add_subcommand(
      "decode", "Decode every RoCEv2 packet of a pcap/pcapng capture (exit 1 if any is bad)");
  cmd->add_option("file", decode.path, "capture file (pcap or pcapng)")->required();
  cmd->add_flag("-v,--verbose", decode.verbose, "print every field of every header");
  cmd->add_option("--port", decode.udp_port, "UDP destination port of RoCEv2")
      ->default_val(decode.udp_port);

  CLI11_PARSE(app, argc, argv);

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
