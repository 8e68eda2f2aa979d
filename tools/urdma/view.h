// The device view `urdma run` gives a program: urdma0 where sysfs readers and UCX look for an
// RDMA device (docs/ARCHITECTURE.md, "The device view"), in a mount namespace of the program's
// own that every child inherits.
//
//   /sys/class/infiniband/urdma0/…          static files from a private tmpfs (overlay on
//                                           /sys/class), the port's GID files bound read-only
//                                           from urdmad's live directory (daemon/device_view.h)
//   /sys/class/infiniband_verbs/uverbsN/…   ibdev, abi_version, dev
//   /dev/infiniband/uverbsN                 /dev/null bound onto it: a character device
//
// N is the first index no real device uses (0 on a host without RDMA devices); the library
// finds it again by ibdev (src/verbs/device.cc) and names it in ibv_device's dev_name,
// dev_path and ibdev_path.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace urdma::tools {

struct ViewSource {
  std::string gid_dir;  // the live GID directory urdmad keeps (gid_view_dir)
  uid_t daemon_uid = 0;  // whose it is: root or the caller (checked with trusted_path)
};

// The files of the view's static part in the kernel's formats, as (path, content) pairs with
// paths relative to /sys/class; `uverbs` is the uverbs entry's name, `dev` its "major:minor".
struct ViewFile {
  std::string path;
  std::string content;  // empty: a directory
};
std::vector<ViewFile> static_view_files(const std::string& uverbs, const std::string& dev);

// Gives this process (and everything it execs or forks later) the view: a private mount
// namespace, unprivileged in a user namespace of its own uid and gid. 0, or an errno with a
// sentence in *why; EEXIST when this process sees a view already (a nested `urdma run`). On an
// error after the namespace was made the process may see part of the view.
int enter_device_view(const ViewSource& source, std::string* why);

}  // namespace urdma::tools
