// Removing what network namespaces that no longer exist left in a daemon's runtime directory
// (docs/ARCHITECTURE.md, "The device view"): each namespace's daemon leaves its device view,
// `view-<netns inode>/` (device_view.h), and a keeper killed by a signal its `net-<ino>.sock`
// and `net-<ino>.lock` (paths.h). Tests, CI jobs and containers make namespaces by the thousand,
// and the directory is often a tmpfs.
//
// A namespace's entries go only when nothing can use them:
//   * no keeper serves it: its lock is free, and the sweeper holds it while it judges and
//     removes, so no keeper starts meanwhile;
//   * no process the sweeper can see is in it (any thread's /proc/<pid>/task/<tid>/ns/net): a
//     daemon, or `urdma run` about to bind the view, is in the namespace it serves;
//   * no mount namespace the sweeper can see binds the view (/proc/<pid>/mountinfo, readable for
//     every process): a program that left the namespace's processes, or changed its uid, keeps
//     its view.
// The sweeper judges only when it can see every process that might use the directory: it runs
// in the initial PID namespace (a keeper in a container's cannot see processes outside it that
// share the directory), and every such process's namespaces can be read — a user's own (the
// directory is the user's), everyone's for a system daemon's shared directory. Otherwise it
// removes nothing and says why. Entries are opened relative to the directory's fd without
// following links; only the sweeper's own directories and files are entered or removed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace urdma::daemon {

struct SweepResult {
  std::vector<uint64_t> removed;  // namespaces whose entries were removed
  std::string skipped;            // why nothing was judged (empty: the sweep ran)
};

// At a keeper's start: removes the entries of every namespace but `own_netns` that nothing
// uses. `shared`: the directory serves every user (a system daemon's).
SweepResult remove_unused_namespaces(const std::string& dir, uint64_t own_netns, bool shared);

// At a keeper's end, while it still holds its namespace's lock: removes `own_netns`'s entries
// but the lock file (the caller's release_lock removes it) when no other process is in the
// namespace and no mount namespace binds its view.
SweepResult remove_own_namespace_if_unused(const std::string& dir, uint64_t own_netns,
                                           bool shared);

}  // namespace urdma::daemon
