// The device as sysfs shows it: urdma0's files in the kernel's formats, and the live part of the
// view — the GID table — that urdmad keeps current (docs/ARCHITECTURE.md, "The device view").
//
// urdmad owns the GID table, so it writes the port's GID files into its runtime directory:
//
//   <daemon dir>/view-<netns inode>/gids/<i>    each index up to the highest valid one,
//                                               "0000:…" for an empty one below it (as the kernel)
//                                   types/<i>   "RoCE v2", valid entries only (the kernel's read
//                                   ndevs/<i>   fails for an empty one; here the file is absent)
//                                   device/numa_node  "-1": no bus device, no NUMA node
//                                   device/net/<ifname>/  one empty directory per interface
//                                               other than loopback that holds a valid GID
//                                               (rxe's device/net names its netdev, never lo);
//                                               net/ itself only while there is one, since
//                                               readers take an existing net/ to name a netdev
//
// The kernel shows a file for each of the 1024 indexes; the readers (UCX, libfabric, rdma-core's
// tests, scripts) ask the verbs for the GIDs and read types/<i> and ndevs/<i> of the indexes they
// consider, so the empty indexes above the highest valid one get no file: a namespace with a few
// addresses costs a few files, not a thousand.
//
// Each file is written whole into `.staging/` and renamed into place, so a reader sees the old
// or the new content, never a mix. The directories are never replaced while in use: `urdma run`
// binds them into a program's mount namespace, and a bind names the directory itself, so a
// daemon that starts again later writes into the same directories its predecessor made. A
// namespace's view goes only when nothing uses it any more (view_sweep.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/gid_table.h"
#include "daemon/unique_fd.h"

namespace urdma::daemon {

// "fe80:0000:0000:0000:0000:0000:0000:0001": the kernel's "%pI6" of a GID.
std::string sysfs_gid_text(const uint8_t gid[16]);
// "0002:c9ff:fe00:0001": the kernel's node_guid / sys_image_guid format, of a GUID held in
// network byte order.
std::string sysfs_guid_text(uint64_t guid_be);

// The node GUID of the device in this network namespace, in network byte order: the EUI-64 of
// the namespace's first interface with a MAC (lowest ifindex, loopback excluded), as rxe derives
// its node GUID from its netdev; without one, a hash of the machine id and the namespace, so
// two namespaces of one host still differ. The library and `urdma run` both report it.
uint64_t host_node_guid_be();

// The subdirectories of a view directory, as `urdma run` binds them.
inline constexpr const char* kGidViewSubdirs[] = {"gids", "types", "ndevs", "device"};

// The live part's directory for a daemon whose socket lives in `daemon_dir`.
std::string gid_view_dir(const std::string& daemon_dir, uint64_t netns);

// The GID files of one namespace's view, kept equal to a table.
class GidView {
 public:
  // Makes (or reuses) `dir` and its subdirectories, mode 0755, and writes every file of
  // `entries`. False with a sentence in *error when the directory cannot be used.
  bool open(const std::string& dir, const std::vector<GidEntry>& entries, std::string* error);
  bool is_open() const { return root_.valid(); }
  // Rewrites the files whose content changed since the last update.
  void update(const std::vector<GidEntry>& entries);

 private:
  struct Files {
    std::string gid, type, ndev;  // empty: no file
  };
  // An empty index below the highest valid one has a zero GID file, as the kernel's; above it,
  // none.
  static Files files_for(const GidEntry* entry, bool below_top);
  // Marks the files an earlier daemon left in `subdir` as unknown, so update rewrites or
  // removes them.
  void mark_existing(const char* subdir, std::string Files::*field);
  void write(const char* subdir, uint32_t index, const std::string& text);
  void write(const char* subdir, const std::string& name, const std::string& text);
  void remove(const char* subdir, uint32_t index);
  // Makes device/net/ hold one directory per name in `want` and nothing else, and exist only
  // when `want` is not empty.
  void update_nets(const std::vector<std::string>& want);

  UniqueFd root_;
  std::vector<Files> current_;
  std::vector<std::string> nets_;  // device/net/'s entries, sorted
};

}  // namespace urdma::daemon
