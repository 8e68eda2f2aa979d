// `urdma run`'s device view (view.h): the static tree, the namespaces, the mounts.
#include "tools/urdma/view.h"

#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/device_view.h"
#include "daemon/paths.h"
#include "daemon/unique_fd.h"
#include "provider/limits.h"

namespace urdma::tools {

using daemon::UniqueFd;

namespace {

constexpr const char* kDevice = "urdma0";  // src/verbs/internal.h, kDeviceName

// The kernel's port state and physical state names (drivers/infiniband/core/sysfs.c).
std::string port_state_text(ibv_port_state s) {
  static const char* const kNames[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  const unsigned i = static_cast<unsigned>(s);
  return std::to_string(i) + ": " + (i < 6 ? kNames[i] : "UNKNOWN");
}

std::string phys_state_text(uint8_t s) {
  static const char* const kNames[] = {"",         "Sleep",  "Polling", "Disabled",
                                       "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery",
                                       "Phy Test"};
  return std::to_string(s) + ": " + (s >= 1 && s < 8 ? kNames[s] : "<unknown>");
}

// "25 Gb/sec (1X EDR)": the kernel's rate_show from active_speed and active_width.
std::string rate_text(uint8_t speed, uint8_t width_code) {
  struct Speed {
    uint8_t code;
    int tenths;  // of a Gb/s per lane
    const char* name;
  };
  static constexpr Speed kSpeeds[] = {{1, 25, ""},        {2, 50, " DDR"},  {4, 100, " QDR"},
                                      {8, 100, " FDR10"}, {16, 140, " FDR"}, {32, 250, " EDR"},
                                      {64, 500, " HDR"},  {128, 1000, " NDR"}};
  int tenths = 25;
  const char* name = "";
  for (const Speed& s : kSpeeds)
    if (s.code == speed) tenths = s.tenths, name = s.name;
  int width = 1;
  switch (width_code) {
    case 1: width = 1; break;
    case 2: width = 4; break;
    case 4: width = 8; break;
    case 8: width = 12; break;
    case 16: width = 2; break;
    default: width = 0; break;
  }
  const int rate = tenths * width;
  return std::to_string(rate / 10) + (rate % 10 ? ".5" : "") + " Gb/sec (" +
         std::to_string(width) + "X" + name + ")";
}

std::string hex(uint64_t v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

bool exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// The uverbs name for urdma0: the first no real device uses.
std::string free_uverbs_name() {
  for (int i = 0;; ++i) {
    const std::string name = "uverbs" + std::to_string(i);
    if (!exists("/sys/class/infiniband_verbs/" + name) && !exists("/dev/infiniband/" + name))
      return name;
  }
}

int fail(std::string* why, const std::string& what, int err = errno) {
  *why = what + ": " + std::strerror(err);
  return err;
}

bool write_file(const std::string& path, const std::string& text) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd.valid() && write(fd.get(), text.data(), text.size()) == ssize_t(text.size());
}

// A private mount namespace; unprivileged (or root without CAP_SYS_ADMIN, as in a container)
// inside a user namespace that maps only the caller's own uid and gid, so the program keeps
// them. Capabilities in the new user namespace end at the program's exec (a non-zero uid).
int unshare_mounts(std::string* why) {
  if (geteuid() == 0 && unshare(CLONE_NEWNS) == 0) return 0;
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    const int err = errno;
    *why = std::string("no user namespace for it (unshare: ") + std::strerror(err) +
           "; user namespaces may be disabled: user.max_user_namespaces, or a seccomp filter "
           "such as Docker's default)";
    return err;
  }
  const std::string uid_map = std::to_string(uid) + " " + std::to_string(uid) + " 1";
  const std::string gid_map = std::to_string(gid) + " " + std::to_string(gid) + " 1";
  if (!write_file("/proc/self/setgroups", "deny") ||
      !write_file("/proc/self/uid_map", uid_map) || !write_file("/proc/self/gid_map", gid_map))
    return fail(why, "writing the user namespace's id maps");
  return 0;
}

// A tmpfs mounted nowhere yet (the new mount API), its root `mode`.
int detached_tmpfs(mode_t mode, UniqueFd* out, std::string* why) {
  UniqueFd fs(fsopen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs.valid()) return fail(why, "fsopen tmpfs");
  char text[8];
  std::snprintf(text, sizeof text, "%o", mode & 07777);
  if (fsconfig(fs.get(), FSCONFIG_SET_STRING, "mode", text, 0) != 0 ||
      fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", "1m", 0) != 0 ||
      fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    return fail(why, "tmpfs");
  out->reset(fsmount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!out->valid()) return fail(why, "fsmount tmpfs");
  return 0;
}

// Binds `from` (relative to `from_dir`) onto `to`, read-only when asked.
int bind(int from_dir, const std::string& from, const std::string& to, bool read_only,
         std::string* why) {
  UniqueFd tree(open_tree(from_dir, from.c_str(),
                          OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_SYMLINK_NOFOLLOW |
                              (from.empty() ? AT_EMPTY_PATH : 0)));
  if (!tree.valid()) return fail(why, "open_tree " + (from.empty() ? to : from));
  if (read_only) {
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    if (mount_setattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0)
      return fail(why, "read-only " + to);
  }
  if (move_mount(tree.get(), "", AT_FDCWD, to.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
    return fail(why, "bind onto " + to);
  return 0;
}

// Covers directory `dir` with a tmpfs holding every entry it had — each bound back (with the
// mounts under it), symbolic links copied — so entries can be added to it. Returns the clone of
// the original directory (for binding from it) in *original.
int cover_with_tmpfs(const std::string& dir, UniqueFd* original, std::string* why) {
  UniqueFd clone(open_tree(AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
  if (!clone.valid()) return fail(why, "open_tree " + dir);
  struct stat dir_st;
  if (fstat(clone.get(), &dir_st) != 0) return fail(why, dir);
  UniqueFd cover;
  if (int err = detached_tmpfs(dir_st.st_mode, &cover, why)) return err;
  // Placeholders first, while the tmpfs is reachable only by its fd.
  UniqueFd list_fd(openat(clone.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* list = list_fd.valid() ? fdopendir(list_fd.release()) : nullptr;
  if (!list) return fail(why, "read " + dir);
  std::vector<std::string> bound;
  while (dirent* e = readdir(list)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (fstatat(clone.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      const ssize_t n = readlinkat(clone.get(), name.c_str(), target, sizeof target - 1);
      if (n < 0) continue;
      target[n] = '\0';
      (void)!symlinkat(target, cover.get(), name.c_str());
      continue;
    }
    const int made = S_ISDIR(st.st_mode)
                         ? mkdirat(cover.get(), name.c_str(), 0755)
                         : UniqueFd(openat(cover.get(), name.c_str(),
                                           O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600))
                                   .valid()
                               ? 0
                               : -1;
    if (made == 0) bound.push_back(name);
  }
  closedir(list);
  if (move_mount(cover.get(), "", AT_FDCWD, dir.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
    return fail(why, "tmpfs over " + dir);
  for (const std::string& name : bound)
    if (int err = bind(clone.get(), name, dir + "/" + name, false, why)) return err;
  *original = std::move(clone);
  return 0;
}

// Writes the static tree under `root` (an fd of the staging tmpfs).
int write_static_tree(int root, const std::vector<ViewFile>& files, std::string* why) {
  if (mkdirat(root, "class", 0755) != 0) return fail(why, "staging tree");
  for (const ViewFile& f : files) {
    const std::string path = "class/" + f.path;
    if (f.content.empty()) {
      if (mkdirat(root, path.c_str(), 0755) != 0) return fail(why, "staging " + f.path);
      continue;
    }
    UniqueFd fd(openat(root, path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
    if (!fd.valid() || write(fd.get(), f.content.data(), f.content.size()) !=
                           static_cast<ssize_t>(f.content.size()))
      return fail(why, "staging " + f.path);
  }
  return 0;
}

}  // namespace

std::vector<ViewFile> static_view_files(const std::string& uverbs, const std::string& dev) {
  ibv_device_attr da;
  provider::fill_device_attr(da, daemon::host_node_guid_be());
  ibv_port_attr pa;
  provider::fill_port_attr(pa, IBV_MTU_4096, IBV_MTU_4096);
  const std::string d = std::string("infiniband/") + kDevice;
  const std::string port = d + "/ports/1";
  auto line = [](const std::string& s) { return s + "\n"; };
  std::vector<ViewFile> files = {
      {"infiniband", ""},
      {d, ""},
      {d + "/node_type", line(std::to_string(IBV_NODE_CA) + ": CA")},
      {d + "/node_guid", line(daemon::sysfs_guid_text(da.node_guid))},
      {d + "/sys_image_guid", line(daemon::sysfs_guid_text(da.sys_image_guid))},
      {d + "/fw_ver", line(da.fw_ver)},
      {d + "/hca_type", line("urdma")},
      {d + "/hw_rev", line(std::to_string(da.hw_ver))},
      {d + "/node_desc", line(std::string("urdma ") + kDevice)},
      {d + "/device", ""},
      // No bus device: like a virtual device, no NUMA node. urdmad's device/ (its numa_node
      // and the live device/net/) covers this one.
      {d + "/device/numa_node", line("-1")},
      {d + "/ports", ""},
      {port, ""},
      {port + "/state", line(port_state_text(pa.state))},
      {port + "/phys_state", line(phys_state_text(pa.phys_state))},
      {port + "/link_layer", line(pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                                                                          : "InfiniBand")},
      {port + "/rate", line(rate_text(pa.active_speed, pa.active_width))},
      {port + "/lid", line(hex(pa.lid, 0))},
      {port + "/sm_lid", line(hex(pa.sm_lid, 0))},
      {port + "/sm_sl", line(std::to_string(pa.sm_sl))},
      {port + "/lid_mask_count", line(std::to_string(pa.lmc))},
      {port + "/cap_mask", line(hex(pa.port_cap_flags, 8))},
      {port + "/pkeys", ""},
      {port + "/pkeys/0", line("0xffff")},
      // Mount points for urdmad's live GID directories.
      {port + "/gids", ""},
      {port + "/gid_attrs", ""},
      {port + "/gid_attrs/types", ""},
      {port + "/gid_attrs/ndevs", ""},
      {"infiniband_verbs", ""},
      {"infiniband_verbs/abi_version", line("6")},
      {"infiniband_verbs/" + uverbs, ""},
      {"infiniband_verbs/" + uverbs + "/ibdev", line(kDevice)},
      {"infiniband_verbs/" + uverbs + "/abi_version", line("1")},
      {"infiniband_verbs/" + uverbs + "/dev", line(dev)},
  };
  return files;
}

int enter_device_view(const ViewSource& source, std::string* why) {
  if (exists(std::string("/sys/class/infiniband/") + kDevice)) {
    *why = std::string("/sys/class/infiniband/") + kDevice + " exists already";
    return EEXIST;
  }
  // The live GID files are urdmad's: bound only from a directory nobody else may change.
  std::string untrusted;
  if (!daemon::trusted_path(source.gid_dir, source.daemon_uid, &untrusted)) {
    *why = "urdmad's GID directory is not usable: " + untrusted;
    return EACCES;
  }
  for (const char* sub : {"gids", "types", "ndevs"}) {
    struct stat st;
    const std::string path = source.gid_dir + "/" + sub;
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return fail(why, "urdmad's GID directory " + path, errno ? errno : ENOTDIR);
  }
  const std::string uverbs = free_uverbs_name();
  struct stat null_st;
  if (stat("/dev/null", &null_st) != 0 || !S_ISCHR(null_st.st_mode))
    return fail(why, "/dev/null is not a character device", ENODEV);
  const std::string dev =
      std::to_string(major(null_st.st_rdev)) + ":" + std::to_string(minor(null_st.st_rdev));
  const bool have_ib_dir = exists("/dev/infiniband");

  if (int err = unshare_mounts(why)) return err;
  // Nothing mounted from here on reaches the host, and the host's later mounts still reach us.
  if (mount(nullptr, "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0)
    return fail(why, "making / a slave mount");

  // 1. /sys/class: the static tree in a private tmpfs, merged over the real one read-only.
  UniqueFd staging;
  if (int err = detached_tmpfs(0755, &staging, why)) return err;
  if (int err = write_static_tree(staging.get(), static_view_files(uverbs, dev), why)) return err;
  const std::string options =
      "lowerdir=/proc/self/fd/" + std::to_string(staging.get()) + "/class:/sys/class";
  if (mount("overlay", "/sys/class", "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            options.c_str()) != 0)
    return fail(why, "overlay on /sys/class");

  // 2. The live GID directories over the overlay's (an overlay's lower layer must not change
  // under it; a bind shows urdmad's directory itself).
  const std::string port = std::string("/sys/class/infiniband/") + kDevice + "/ports/1";
  UniqueFd gid_dir(open(source.gid_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!gid_dir.valid()) return fail(why, source.gid_dir);
  if (int err = bind(gid_dir.get(), "gids", port + "/gids", true, why)) return err;
  if (int err = bind(gid_dir.get(), "types", port + "/gid_attrs/types", true, why)) return err;
  if (int err = bind(gid_dir.get(), "ndevs", port + "/gid_attrs/ndevs", true, why)) return err;
  // device/ is optional: without urdmad's, the static one (numa_node alone) stays.
  if (faccessat(gid_dir.get(), "device", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
    if (int err = bind(gid_dir.get(), "device",
                       std::string("/sys/class/infiniband/") + kDevice + "/device", true, why))
      return err;
  }

  // 3. /dev/infiniband/uverbsN: /dev/null bound onto an empty file in a tmpfs that covers
  // /dev/infiniband (when the host has one) or /dev, every original entry bound back.
  const std::string cover = have_ib_dir ? "/dev/infiniband" : "/dev";
  UniqueFd original;
  if (int err = cover_with_tmpfs(cover, &original, why)) return err;
  if (!have_ib_dir && mkdir("/dev/infiniband", 0755) != 0) return fail(why, "/dev/infiniband");
  const std::string node = "/dev/infiniband/" + uverbs;
  if (!UniqueFd(open(node.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)).valid())
    return fail(why, node);
  UniqueFd dev_dir(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (int err = bind(dev_dir.get(), "dev/null", node, false, why)) return err;
  // The covering tmpfs takes no new entries: /dev stays as the host made it.
  if (mount(nullptr, cover.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
            nullptr) != 0)
    return fail(why, "read-only " + cover);
  return 0;
}

}  // namespace urdma::tools
