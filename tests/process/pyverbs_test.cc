// Debian's python3-pyverbs (rdma-core's Python binding), unmodified, on urdma (issue #8): the
// script pyverbs_rc.py runs under /usr/bin/python3 (the interpreter Debian's package is built
// for) with LD_LIBRARY_PATH naming the build's lib/ directory (tool_run.h), so the
// libibverbs.so.1 and librdmacm.so.1 pyverbs links are ours; every test body runs in a fresh
// network namespace (netns_harness.h) where our library starts its urdmad.
//
// The script prints what pyverbs returned as `name=value` lines; the assertions are here:
// the device list, query_device(_ex)/query_port/query_gid(_ex), the device clock, the EOPNOTSUPP answers; an RC SEND with immediate, RDMA WRITE and
// WRITE with immediate of 64 KiB between two QPs of one process (CQE fields, CRC-32 of the
// buffers; the receiver waits on a completion channel); a pyverbs.cmid client and server exchanging a SEND each way; and tag matching
// between two processes (a TM-SRQ receiver without a send queue of its own: eager, unexpected
// and rendezvous messages, the FIN its engine sends). Skipped when
// /usr/bin/python3 cannot import pyverbs (scripts/deps.sh installs python3-pyverbs).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

const std::string kPython = "/usr/bin/python3";

std::string script(const std::string& args) {
  return kPython + " " + URDMA_PYVERBS_SCRIPT + " " + args;
}

void skip_without_pyverbs() {
  if (std::system((kPython + " -c 'import pyverbs.device' >/dev/null 2>&1").c_str()) != 0)
    skip_test("/usr/bin/python3 cannot import pyverbs (scripts/deps.sh installs python3-pyverbs)");
}

// The script's `name=value` lines.
std::map<std::string, std::string> fields_of(const std::string& out) {
  std::map<std::string, std::string> fields;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos && eq > 0) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

long long number(const std::map<std::string, std::string>& f, const std::string& name) {
  const auto it = f.find(name);
  return it == f.end() ? -1 : std::atoll(it->second.c_str());
}

std::string text(const std::map<std::string, std::string>& f, const std::string& name) {
  const auto it = f.find(name);
  return it == f.end() ? "(missing)" : it->second;
}

// A work completion the script printed as <prefix>_status, _opcode, _byte_len, _imm.
void expect_wc(const std::map<std::string, std::string>& f, const std::string& prefix,
               const std::string& opcode) {
  SCOPED_TRACE(prefix);
  EXPECT_EQ(number(f, prefix + "_status"), 0);  // IBV_WC_SUCCESS
  EXPECT_EQ(text(f, prefix + "_opcode"), opcode);
}

TEST(Pyverbs, ListsOpensAndQueriesUrdma0) {
  in_fresh_netns([] {
    skip_without_pyverbs();
    const ToolRun r = run(script("device"), 30000);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto f = fields_of(r.output);
    EXPECT_EQ(text(f, "devices"), "urdma0") << r.output;
    for (const char* positive : {"max_qp", "max_qp_wr", "max_cq", "max_cqe", "max_mr",
                                 "max_mr_size", "max_pd", "max_sge"}) {
      // max_mr_size is 2^64-1 (any size): atoll saturates, still positive.
      EXPECT_GT(number(f, positive), 0) << positive << "\n" << r.output;
    }
    EXPECT_EQ(number(f, "phys_port_cnt"), 1);
    EXPECT_EQ(text(f, "port_state"), "IBV_PORT_ACTIVE");
    EXPECT_EQ(number(f, "link_layer"), 2);  // IBV_LINK_LAYER_ETHERNET
    EXPECT_EQ(text(f, "active_mtu"), "IBV_MTU_4096");
    EXPECT_GT(number(f, "gid_tbl_len"), 0);
    EXPECT_EQ(text(f, "gid0"), "::ffff:127.0.0.1");
    EXPECT_EQ(text(f, "gid0_type"), "IBV_GID_TYPE_ROCE_V2");
    EXPECT_EQ(number(f, "ex_max_qp"), number(f, "max_qp"));
    // The device clock: 1 GHz, read by query_rt_values_ex before Python's time.monotonic_ns()
    // (both CLOCK_MONOTONIC: provider/completion_clock.h).
    EXPECT_EQ(number(f, "hca_core_clock"), 1'000'000);
    EXPECT_GT(number(f, "rt_values_ns"), 0);
    EXPECT_LE(number(f, "rt_values_ns"), number(f, "monotonic_ns"));
    // A private XRC domain and a parent domain are made.
    EXPECT_EQ(number(f, "xrcd_errno"), 0);
    EXPECT_EQ(number(f, "parent_domain_errno"), 0);
  }, 60);
}

TEST(Pyverbs, RcSendWithImmAndRdmaWrite64KiB) {
  in_fresh_netns([] {
    skip_without_pyverbs();
    const ToolRun r = run(script("rc"), 60000);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto f = fields_of(r.output);
    EXPECT_EQ(text(f, "qp_state"), "IBV_QPS_RTS") << r.output;

    expect_wc(f, "send_imm_sender", "IBV_WC_SEND");
    expect_wc(f, "send_imm_receiver", "IBV_WC_RECV");
    EXPECT_EQ(number(f, "send_imm_receiver_byte_len"), 65536);
    EXPECT_EQ(number(f, "send_imm_receiver_wr_id"), 101);
    EXPECT_EQ(text(f, "send_imm_receiver_imm"), "0x1234abcd");
    EXPECT_EQ(number(f, "send_imm_receiver_event"), 1);  // woken by its completion channel

    expect_wc(f, "write_sender", "IBV_WC_RDMA_WRITE");
    EXPECT_EQ(number(f, "write_sender_wr_id"), 2);
    EXPECT_EQ(f.count("write_receiver_status"), 0u);  // a plain WRITE takes no receive

    expect_wc(f, "write_imm_sender", "IBV_WC_RDMA_WRITE");
    expect_wc(f, "write_imm_receiver", "IBV_WC_RECV_RDMA_WITH_IMM");
    EXPECT_EQ(number(f, "write_imm_receiver_byte_len"), 65536);
    EXPECT_EQ(text(f, "write_imm_receiver_imm"), "0x1234abce");
    EXPECT_EQ(number(f, "write_imm_receiver_event"), 1);

    // Each step fills the sender's buffer with fresh random bytes and zeroes the receiver's.
    for (const std::string step : {"send_imm", "write", "write_imm"}) {
      EXPECT_NE(text(f, step + "_crc_sent"), "(missing)") << r.output;
      EXPECT_EQ(text(f, step + "_crc_received"), text(f, step + "_crc_sent")) << step;
    }
  }, 90);
}

TEST(Pyverbs, CmidClientAndServerSendEachWay) {
  in_fresh_netns([] {
    skip_without_pyverbs();
    const Started server = start(script("cm_server 7471"));
    ASSERT_TRUE(wait_output(server, "listening", 30000));
    const ToolRun client = run(script("cm_client 7471"), 30000);
    const ToolRun served = finish(server, 30000);
    ASSERT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << served.output;
    ASSERT_EQ(served.exit_code, 0) << served.output;
    const auto c = fields_of(client.output);
    const auto s = fields_of(served.output);
    EXPECT_EQ(text(s, "server_device"), "urdma0");
    for (const auto* side : {&c, &s}) {
      const std::string role = side == &c ? "client" : "server";
      expect_wc(*side, role + "_send", "IBV_WC_SEND");
      expect_wc(*side, role + "_recv", "IBV_WC_RECV");
      EXPECT_EQ(number(*side, role + "_recv_byte_len"), 4096) << role;
    }
    // What each side received is what the other sent, and the two messages differ.
    EXPECT_EQ(text(c, "client_received_crc"), text(s, "server_sent_crc"));
    EXPECT_EQ(text(s, "server_received_crc"), text(c, "client_sent_crc"));
    EXPECT_NE(text(c, "client_sent_crc"), text(s, "server_sent_crc"));
  }, 120);
}

// Tag matching between two processes (rdma-core's Documentation/tag_matching.md): the receiver's
// RC QP is on a TM-SRQ with max_send_wr 0. An eager message to a posted tag lands in the tagged
// buffer without its 16-byte TMH (TM_RECV, MATCH | DATA_VALID, the tag); one to a tag nobody
// posted lands whole in the ordinary SRQ buffer (TM_RECV, no flags, tag 0); a rendezvous request
// completes MATCH, the receiver's engine READs 30000 bytes from the sender and sends it a FIN
// TMH (the sender's ordinary receive), then DATA_VALID. Every byte is checked by CRC-32.
TEST(Pyverbs, TagMatchingEagerUnexpectedAndRendezvousBetweenTwoProcesses) {
  in_fresh_netns([] {
    skip_without_pyverbs();
    char dir[] = "/tmp/urdma-tm-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const Started server = start(script(std::string("tm_server ") + dir));
    const ToolRun client = run(script(std::string("tm_client ") + dir), 60000);
    const ToolRun served = finish(server, 60000);
    std::system((std::string("rm -rf ") + dir).c_str());
    ASSERT_EQ(client.exit_code, 0) << client.output << "\n--- server:\n" << served.output;
    ASSERT_EQ(served.exit_code, 0) << served.output;
    const auto c = fields_of(client.output);
    const auto s = fields_of(served.output);
    constexpr long long kMatch = IBV_WC_TM_MATCH, kDataValid = IBV_WC_TM_DATA_VALID;
    EXPECT_EQ(text(s, "add1_opcode"), "IBV_WC_TM_ADD");
    EXPECT_EQ(text(s, "eager_opcode"), "IBV_WC_TM_RECV");
    EXPECT_EQ(number(s, "eager_status"), 0);
    EXPECT_EQ(number(s, "eager_wr_id"), 1);
    EXPECT_EQ(number(s, "eager_flags"), kMatch | kDataValid);
    EXPECT_EQ(number(s, "eager_byte_len"), 6000 - 16);
    EXPECT_EQ(number(s, "eager_tag"), 0x1111);
    EXPECT_EQ(text(s, "unexpected_opcode"), "IBV_WC_TM_RECV");
    EXPECT_EQ(number(s, "unexpected_wr_id"), 500);
    EXPECT_EQ(number(s, "unexpected_flags"), 0);
    EXPECT_EQ(number(s, "unexpected_byte_len"), 3000);
    EXPECT_EQ(number(s, "unexpected_tag"), 0);
    EXPECT_EQ(number(s, "rndv_match_wr_id"), 2);
    EXPECT_EQ(number(s, "rndv_match_flags"), kMatch);
    EXPECT_EQ(number(s, "rndv_match_tag"), 0x2222);
    EXPECT_EQ(number(s, "rndv_data_status"), 0);
    EXPECT_EQ(number(s, "rndv_data_wr_id"), 2);
    EXPECT_EQ(number(s, "rndv_data_flags"), kDataValid);
    EXPECT_EQ(number(s, "rndv_data_byte_len"), 30000);
    for (const std::string what : {"eager", "unexpected", "rndv"}) {
      EXPECT_NE(text(c, what + "_crc"), "(missing)") << client.output;
      EXPECT_EQ(text(s, what + "_crc"), text(c, what + "_crc")) << what;
    }
    expect_wc(c, "fin", "IBV_WC_RECV");
    EXPECT_EQ(number(c, "fin_byte_len"), 16);
    EXPECT_EQ(number(c, "fin_tmh_opcode"), 2);  // IBV_TMH_FIN
    EXPECT_EQ(number(c, "fin_tmh_tag"), 0x2222);
  }, 120);
}

}  // namespace
}  // namespace urdma::process_test
