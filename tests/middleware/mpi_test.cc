// Open MPI 4.1 and MPICH 4.0 (Debian's, unmodified) over UCX on urdma: mpi_check.c — point to
// point of growing sizes, collectives and one-sided Put/Get/Accumulate, every byte checked by
// the program itself — with 2 and 4 ranks in one network namespace and 2+2 ranks across two
// namespaces joined by a veth pair, the second namespace's ranks started through
// netns_agent.sh (the launcher's rsh/ssh, entering the second host's namespaces). Everything runs
// under `urdma run`, as a user would run it: the launcher, its daemons and the ranks get our
// libraries and the device view.
//
// UCX is held to urdma's device (UCX_NET_DEVICES=urdma0:1) and to one verbs transport plus
// `self`: UCX_TLS=rc_verbs,ud_verbs:aux,self (UCP connects RC endpoints over an auxiliary UD
// transport, as on any RDMA device) or ud_verbs,self. Ranks on one host talk through urdma too,
// never through shared memory or TCP. Across namespaces every rank names the GID of its veth
// address (UCX_IB_GID_INDEX: UCX takes the first RoCE v2 IPv4 GID, which is loopback's on
// urdma). A run passes when the launcher exits 0 and rank 0 printed "mpi_check: ok ranks=N
// namespaces=M" (M: 1, or 2 across namespaces). Open MPI also runs it over its OFI MTL (pml
// cm, mtl ofi, osc pt2pt) on libfabric's verbs provider with ofi_rxm (FI_PROVIDER=verbs;ofi_rxm):
// RC QPs connected through our librdmacm, every rank's MTL naming urdma0 as its domain; libfabric
// passes over loopback interfaces, which the veth address gives it; ranks on one host talk
// through urdma there too (the MTL carries all of the cm PML's traffic, and ofi_rxm has no shared
// memory path). Skipped when the MPI packages are absent (scripts/deps.sh installs openmpi-bin,
// mpich and their compilers; CMake builds mpi_check when they are there).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "netns_harness.h"
#include "tool_run.h"

namespace urdma::process_test {
namespace {

const std::string kUrdma = URDMA_TOOL_PATH;
const std::string kAgent = URDMA_MPI_AGENT;

enum class Mpi { kOpenMpi, kMpich };

struct Case {
  Mpi mpi;
  const char* tls;  // UCX_TLS; nullptr: Open MPI's OFI MTL over libfabric's verbs provider
};

std::string program(Mpi mpi) {
  return mpi == Mpi::kOpenMpi ? URDMA_MPI_CHECK_OMPI : URDMA_MPI_CHECK_MPICH;
}

void skip_without(Mpi mpi) {
  const std::string p = program(mpi);
  if (p.empty())
    skip_test("mpi_check was not built (no mpicc.openmpi / mpicc.mpich at configure time)");
  if (!have_tool(mpi == Mpi::kOpenMpi ? "mpirun.openmpi" : "mpiexec.mpich"))
    skip_test("no MPI launcher (scripts/deps.sh installs openmpi-bin and mpich)");
  if (!have_tool("ucx_info")) skip_test("no UCX (scripts/deps.sh installs ucx-utils)");
}

// The launcher's command line: `ranks` ranks over `hosts` ("10.92.0.1:2,10.92.0.2:2"), UCX held
// to urdma0 and `tls`, the second host's ranks through the agent.
// `subnet`: where the launcher's own TCP traffic goes (Open MPI's out-of-band channel); `iface`:
// the interface hydra's control connections use.
// With no `tls`: Open MPI's cm PML over its OFI MTL, libfabric held to its verbs provider with
// ofi_rxm (FI_PROVIDER; its RDM endpoints are verbs RC QPs connected through rdma_cm), one-sided
// through osc pt2pt over that PML; the MTL's verbose output names the domain it opened.
std::string mpirun(Mpi mpi, const char* tls, int ranks, const std::string& hosts,
                   const std::string& subnet, const std::string& iface,
                   const std::string& gid_index = "") {
  if (tls == nullptr)
    return "env 'FI_PROVIDER=verbs;ofi_rxm' mpirun.openmpi --allow-run-as-root --oversubscribe "
           "-np " +
           std::to_string(ranks) + " --host " + hosts + " --mca plm_rsh_agent " + kAgent +
           " --mca pml cm --mca mtl ofi --mca osc pt2pt --mca btl self --mca mtl_base_verbose 1"
           " --mca oob_tcp_if_include " +
           subnet + " -x FI_PROVIDER " + program(mpi);
  const std::string ucx = "UCX_TLS=" + std::string(tls) +
                          " UCX_NET_DEVICES=urdma0:1 UCX_WARN_UNUSED_ENV_VARS=n" +
                          (gid_index.empty() ? "" : " UCX_IB_GID_INDEX=" + gid_index);
  if (mpi == Mpi::kOpenMpi)
    return "env " + ucx + " mpirun.openmpi --allow-run-as-root --oversubscribe -np " +
           std::to_string(ranks) + " --host " + hosts + " --mca plm_rsh_agent " + kAgent +
           " --mca pml ucx --mca osc ucx --mca btl self" + " --mca oob_tcp_if_include " + subnet +
           " -x UCX_TLS -x UCX_NET_DEVICES" + (gid_index.empty() ? "" : " -x UCX_IB_GID_INDEX") +
           " " + program(mpi);
  return "env " + ucx + " mpiexec.mpich -launcher ssh -launcher-exec " + kAgent + " -iface " +
         iface + " -hosts " + hosts + " -n " + std::to_string(ranks) + " -genv UCX_TLS " + tls +
         " -genv UCX_NET_DEVICES urdma0:1" +
         (gid_index.empty() ? "" : " -genv UCX_IB_GID_INDEX " + gid_index) + " " + program(mpi);
}

// The launcher exited 0 and rank 0 reported every check passed, with `ranks` ranks in
// `namespaces` network namespaces; over the OFI MTL, every rank's MTL opened urdma0.
void expect_ok(const Case& c, const ToolRun& r, int ranks, int namespaces) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string want = "mpi_check: ok ranks=" + std::to_string(ranks) +
                           " namespaces=" + std::to_string(namespaces) + " ";
  EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  if (c.tls == nullptr) {
    EXPECT_EQ(count(r.output, "mtl:ofi:provider: urdma0\n"), ranks) << r.output;
  }
}

void skip_without(const Case& c) {
  if (c.tls != nullptr) return skip_without(c.mpi);
  skip_without(Mpi::kOpenMpi);
  if (!have_tool("ompi_info") || std::system("ompi_info | grep -q 'MCA mtl: ofi'") != 0)
    skip_test("Open MPI has no OFI MTL (Debian's openmpi-bin 4.1 has one)");
}

// One namespace: an interface (one end of a veth pair) with a 10.x address besides loopback (UCX
// and libfabric prefer a real interface's GID), every rank on it.
void one_host(const Case& c, int ranks) {
  skip_without(c);
  in_fresh_netns(
      [&] {
        ASSERT_TRUE(add_local_veth("mpi", "10.92.1.1/24"));
        const ToolRun r = run(kUrdma + " run " +
                                  mpirun(c.mpi, c.tls, ranks, "10.92.1.1:" + std::to_string(ranks),
                                         "10.92.1.0/24", "mpi0"),
                              170'000);
        expect_ok(c, r, ranks, 1);
      },
      180);
}

// Two namespaces, 2 + 2 ranks: the launcher in this one, the agent entering the other's network
// and mount namespaces (those of a second-host process that waits until the run is over) and
// starting the launcher's daemon there under `urdma run`, which gives it that namespace's view.
void two_hosts(const Case& c) {
  skip_without(c);
  in_fresh_netns(
      [&] {
        Pipe done;
        const pid_t b = start_second_host("mpia", "mpib", "10.92.0", [&] {
          done.close_wr();
          char ch;
          done.get(&ch, 170'000);
          return 0;
        });
        done.close_rd();
        // The veth's GID has the same index on both sides (loopback's, then the veth's).
        const int gid = gid_index_of(run("ibv_devinfo -v").output, "10.92.0.1");
        ASSERT_GE(gid, 0);
        const ToolRun r = run("env URDMA_AGENT_PID_10_92_0_2=" + std::to_string(b) +
                                  " URDMA_AGENT_WRAP='" + kUrdma + " run' " + kUrdma + " run " +
                                  mpirun(c.mpi, c.tls, 4, "10.92.0.1:2,10.92.0.2:2", "10.92.0.0/24",
                                         "mpia", std::to_string(gid)),
                              170'000);
        expect_ok(c, r, 4, 2);
        done.close_wr();
        wait_exit(b, 5000);
      },
      180);
}

TEST(Mpi, OpenMpiUcxRcVerbsTwoRanksOneHost) {
  one_host({Mpi::kOpenMpi, "rc_verbs,ud_verbs:aux,self"}, 2);
}
TEST(Mpi, OpenMpiUcxRcVerbsFourRanksOneHost) {
  one_host({Mpi::kOpenMpi, "rc_verbs,ud_verbs:aux,self"}, 4);
}
TEST(Mpi, OpenMpiUcxUdVerbsTwoRanksOneHost) {
  one_host({Mpi::kOpenMpi, "ud_verbs,self"}, 2);
}
TEST(Mpi, OpenMpiUcxRcVerbsTwoPlusTwoRanksTwoNamespaces) {
  two_hosts({Mpi::kOpenMpi, "rc_verbs,ud_verbs:aux,self"});
}
TEST(Mpi, OpenMpiOfiMtlVerbsTwoRanksOneHost) {
  one_host({Mpi::kOpenMpi, nullptr}, 2);
}
TEST(Mpi, OpenMpiOfiMtlVerbsTwoPlusTwoRanksTwoNamespaces) {
  two_hosts({Mpi::kOpenMpi, nullptr});
}
TEST(Mpi, MpichUcxRcVerbsTwoRanksOneHost) {
  one_host({Mpi::kMpich, "rc_verbs,ud_verbs:aux,self"}, 2);
}
TEST(Mpi, MpichUcxRcVerbsFourRanksOneHost) {
  one_host({Mpi::kMpich, "rc_verbs,ud_verbs:aux,self"}, 4);
}
TEST(Mpi, MpichUcxUdVerbsTwoRanksOneHost) {
  one_host({Mpi::kMpich, "ud_verbs,self"}, 2);
}
TEST(Mpi, MpichUcxRcVerbsTwoPlusTwoRanksTwoNamespaces) {
  two_hosts({Mpi::kMpich, "rc_verbs,ud_verbs:aux,self"});
}

}  // namespace
}  // namespace urdma::process_test
