// tshark as the process tests run it over a capture of urdma traffic.
#pragma once

#include <string>

namespace urdma::process_test {

// tshark's heuristic payload dissectors take arbitrary RDMA payload bytes for protocols they
// are not (tests/crosscheck/wire_crosscheck_test.py explains); the InfiniBand dissector stays.
inline constexpr const char* kPayloadHeuristics[] = {
    "rpcrdma_infiniband",    "mellanox_eoib",   "eth_over_ib",
    "iser_infiniband",       "iser_ib_private", "nvme_rdma",
    "nvme_rdma_cm_private",  "sdp_infiniband",  "sdp_ib_private",
    "smb_direct_infiniband", "smcr_infiniband", "lnet_ib",
    "lnet_ib_cm_private",    "fc_infiniband",
};

// "tshark -r PCAP" with IP checksums checked and those heuristics off.
inline std::string tshark_reading(const std::string& pcap) {
  std::string tshark = "tshark -r " + pcap + " -o ip.check_checksum:TRUE";
  for (const char* h : kPayloadHeuristics) tshark += std::string(" --disable-heuristic ") + h;
  return tshark;
}

}  // namespace urdma::process_test
