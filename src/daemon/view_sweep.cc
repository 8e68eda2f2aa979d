#include "daemon/view_sweep.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "daemon/paths.h"
#include "daemon/unique_fd.h"

namespace urdma::daemon {

namespace {

// The initial PID namespace's inode, fixed by the kernel (PROC_PID_INIT_INO,
// include/linux/proc_ns.h).
constexpr uint64_t kInitialPidNamespaceInode = 0xEFFFFFFCu;
// A view is view/<subdir>/<file>, and view/device/net/<ifname>/: nothing deeper is entered.
constexpr int kViewDepth = 3;
constexpr const char* kRemovingPrefix = ".removing-";

// The number in `name` after `prefix` and before `suffix`, written as std::to_string writes it
// (no sign, no leading zero): 0 when `name` is not of that form.
uint64_t number_in(const char* name, const char* prefix, const char* suffix) {
  const size_t lp = std::strlen(prefix), ls = std::strlen(suffix), ln = std::strlen(name);
  if (ln <= lp + ls || std::strncmp(name, prefix, lp) != 0 ||
      std::strcmp(name + ln - ls, suffix) != 0)
    return 0;
  const std::string digits(name + lp, ln - lp - ls);
  if (digits.size() > 20 || digits[0] < '1' || digits[0] > '9') return 0;
  for (char c : digits)
    if (c < '0' || c > '9') return 0;
  errno = 0;
  const uint64_t n = std::strtoull(digits.c_str(), nullptr, 10);
  return errno == 0 ? n : 0;
}

std::vector<std::string> list_dir(int dirfd) {
  std::vector<std::string> names;
  const int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return names;
  }
  while (const dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.emplace_back(e->d_name);
  closedir(d);
  return names;
}

// Removes directory `name` of `dirfd` and what it holds, `depth` levels below it at most,
// entering only directories of ours and never following a link (a link is removed itself, as
// an entry). False when something stays (another user's entry, a deeper tree).
bool remove_tree(int dirfd, const std::string& name, int depth) {
  UniqueFd fd(openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || st.st_uid != geteuid()) return false;
  bool all = true;
  for (const std::string& entry : list_dir(fd.get())) {
    struct stat est;
    if (fstatat(fd.get(), entry.c_str(), &est, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone
    if (est.st_uid != geteuid()) {
      all = false;
    } else if (S_ISDIR(est.st_mode)) {
      all = depth > 0 && remove_tree(fd.get(), entry, depth - 1) && all;
    } else if (unlinkat(fd.get(), entry.c_str(), 0) != 0 && errno != ENOENT) {
      all = false;
    }
  }
  return all && (unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT);
}

// Whether `name` in `dirfd` is ours and of the type `mode` names, not following a link.
bool ours(int dirfd, const char* name, mode_t type) {
  struct stat st;
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && (st.st_mode & S_IFMT) == type &&
         st.st_uid == geteuid();
}

// A namespace's lock, as take_lock takes it but relative to the directory's fd: the open,
// locked file, or -1 when a keeper holds it or it is not ours.
int lock_namespace(int dirfd, uint64_t netns) {
  const std::string name = "net-" + std::to_string(netns) + ".lock";
  UniqueFd fd(openat(dirfd, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                     0600));
  struct stat held, named;
  if (!fd.valid() || fstat(fd.get(), &held) != 0 || !S_ISREG(held.st_mode) ||
      held.st_uid != geteuid() || flock(fd.get(), LOCK_EX | LOCK_NB) != 0)
    return -1;
  // The file a keeper's release_lock removed meanwhile is no lock anyone else takes.
  if (fstatat(dirfd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 ||
      named.st_ino != held.st_ino || named.st_dev != held.st_dev)
    return -1;
  return fd.release();
}

// The uids (real, effective, saved, file system) of process `pid` (its status file).
std::vector<uid_t> process_uids(int procfd, const std::string& pid) {
  std::vector<uid_t> uids;
  UniqueFd fd(openat(procfd, (pid + "/status").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return uids;
  char buf[4096];
  const ssize_t n = read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return uids;
  buf[n] = '\0';
  const char* line = std::strstr(buf, "\nUid:");
  if (!line) return uids;
  std::istringstream in(std::string(line + 5, std::strcspn(line + 5, "\n")));
  for (unsigned long u; in >> u;) uids.push_back(static_cast<uid_t>(u));
  return uids;
}

// The identity of the network namespace /proc/<pid>/task/<tid>/net shows: its "dev" entry's
// inode, which each namespace registers anew. Unlike ns/net it needs no ptrace access.
bool proc_net_id(int tasks, const std::string& tid, uint64_t* id) {
  struct stat st;
  if (fstatat(tasks, (tid + "/net/dev").c_str(), &st, 0) != 0) return false;
  *id = st.st_ino;
  return true;
}

// What the processes in /proc use of the candidates: namespaces some thread is in, views some
// mount namespace binds (any mount whose root names a view-<ino> directory: a view of another
// directory by that name only keeps ours a while longer). A thread whose ns/net the sweeper may
// not read is named by its /proc net entries: in the namespace of a thread it could read, it
// changes nothing; in no namespace it can name, it stops the sweep when it may use the
// directory (ours, or anyone's when the directory is shared or the sweeper is root). False with
// *why then.
bool scan_processes(bool shared, pid_t ignore, std::set<uint64_t>* candidates,
                    std::string* why) {
  UniqueFd procfd(open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!procfd.valid()) {
    *why = errno_text("/proc");
    return false;
  }
  const uid_t me = geteuid();
  std::set<uint64_t> named;  // proc net ids of namespaces a readable thread is in
  struct Unnamed {
    std::string pid;
    uint64_t id;
  };
  std::vector<Unnamed> unnamed;  // threads that may use the directory, by proc net id
  std::set<std::string> mountinfos_seen;  // one read per mount namespace we can name
  for (const std::string& pid : list_dir(procfd.get())) {
    if (candidates->empty()) return true;  // everything is in use: nothing left to judge
    if (pid[0] < '1' || pid[0] > '9' || std::to_string(ignore) == pid) continue;
    // Every thread: a thread may unshare a network namespace of its own.
    UniqueFd tasks(openat(procfd.get(), (pid + "/task").c_str(),
                          O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!tasks.valid()) continue;  // exited
    int may_use = -1;  // unknown until a thread cannot be read
    for (const std::string& tid : list_dir(tasks.get())) {
      struct stat st;
      uint64_t id = 0;
      if (fstatat(tasks.get(), (tid + "/ns/net").c_str(), &st, 0) == 0) {
        candidates->erase(st.st_ino);
        if (proc_net_id(tasks.get(), tid, &id)) named.insert(id);
        continue;
      }
      if (errno != EACCES && errno != EPERM) continue;  // exited, or a zombie
      if (may_use < 0) {
        may_use = shared || me == 0;
        for (uid_t u : process_uids(procfd.get(), pid)) may_use |= u == me;
      }
      if (!may_use) break;  // another user's, of a directory only we use
      if (!proc_net_id(tasks.get(), tid, &id)) {
        if (errno == ENOENT) continue;  // exited
        *why = "the network namespace of process " + pid + " cannot be read";
        return false;
      }
      unnamed.push_back({pid, id});
    }
    // Its mount namespace's binds: lines "<id> <parent> <major:minor> <root> <mount point> …".
    struct stat mnt;
    if (fstatat(procfd.get(), (pid + "/ns/mnt").c_str(), &mnt, 0) == 0 &&
        !mountinfos_seen.insert(std::to_string(mnt.st_ino)).second)
      continue;
    std::ifstream info("/proc/" + pid + "/mountinfo");
    for (std::string line; std::getline(info, line);) {
      std::istringstream fields(line);
      std::string id, parent, devno, root;
      if (!(fields >> id >> parent >> devno >> root)) continue;
      for (size_t at = root.find("/view-"); at != std::string::npos;
           at = root.find("/view-", at + 1)) {
        const size_t end = root.find('/', at + 1);
        const std::string part = root.substr(at + 1, end == std::string::npos ? end : end - at - 1);
        if (const uint64_t n = number_in(part.c_str(), "view-", "")) candidates->erase(n);
      }
    }
  }
  for (const Unnamed& u : unnamed) {
    if (!named.contains(u.id)) {
      *why = "process " + u.pid + " is in a network namespace no readable process is in";
      return false;
    }
  }
  return true;
}

// Whether this process sees every process that might use the directory.
bool sees_every_process(std::string* why) {
  struct stat st;
  char self[32] = {};
  if (stat("/proc/self/ns/pid", &st) != 0 || readlink("/proc/self", self, sizeof self - 1) <= 0 ||
      std::to_string(getpid()) != self) {
    *why = "/proc is not this PID namespace's";
    return false;
  }
  if (st.st_ino != kInitialPidNamespaceInode) {
    *why = "in a PID namespace of its own, processes outside it are not seen";
    return false;
  }
  return true;
}

// Removes namespace `netns`'s entries (its lock file only when `lock_fd` is ours to release).
void remove_namespace(int dirfd, uint64_t netns, int lock_fd) {
  const std::string n = std::to_string(netns);
  const std::string sock = "net-" + n + ".sock";
  if (ours(dirfd, sock.c_str(), S_IFSOCK)) unlinkat(dirfd, sock.c_str(), 0);
  const std::string view = "view-" + n;
  if (ours(dirfd, view.c_str(), S_IFDIR)) {
    // Out of the way first: a view made again under the name is a new directory, never one
    // half removed.
    const std::string removing = kRemovingPrefix + view;
    if (renameat2(dirfd, view.c_str(), dirfd, removing.c_str(), RENAME_NOREPLACE) == 0)
      remove_tree(dirfd, removing, kViewDepth);
    else
      remove_tree(dirfd, view, kViewDepth);
  }
  if (lock_fd >= 0) {
    unlinkat(dirfd, ("net-" + n + ".lock").c_str(), 0);
    close(lock_fd);
  }
}

SweepResult sweep(const std::string& dir, uint64_t own_netns, bool own_only, bool shared) {
  SweepResult result;
  if (!trusted_path(dir, geteuid(), &result.skipped)) return result;
  UniqueFd dirfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat dst;
  if (!dirfd.valid() || fstat(dirfd.get(), &dst) != 0 || dst.st_uid != geteuid()) {
    result.skipped = dir + " is not ours";
    return result;
  }
  std::set<uint64_t> candidates;
  if (own_only) {
    candidates.insert(own_netns);
  } else {
    for (const std::string& name : list_dir(dirfd.get())) {
      const char* s = name.c_str();
      if (name.starts_with(kRemovingPrefix)) {
        // What an interrupted sweep left: nobody can use it any more.
        if (ours(dirfd.get(), s, S_IFDIR)) remove_tree(dirfd.get(), name, kViewDepth);
        continue;
      }
      uint64_t n = 0;
      if (ours(dirfd.get(), s, S_IFDIR)) n = number_in(s, "view-", "");
      else if (ours(dirfd.get(), s, S_IFSOCK)) n = number_in(s, "net-", ".sock");
      else if (ours(dirfd.get(), s, S_IFREG)) n = number_in(s, "net-", ".lock");
      if (n != 0 && n != own_netns) candidates.insert(n);
    }
  }
  if (candidates.empty()) return result;
  if (!sees_every_process(&result.skipped)) return result;
  if (!scan_processes(shared, own_only ? getpid() : 0, &candidates, &result.skipped))
    return result;
  for (uint64_t netns : candidates) {
    // The caller holds its own namespace's lock; any other is taken, or a keeper serves it.
    const int lock_fd = own_only ? -1 : lock_namespace(dirfd.get(), netns);
    if (!own_only && lock_fd < 0) continue;
    remove_namespace(dirfd.get(), netns, lock_fd);
    result.removed.push_back(netns);
  }
  return result;
}

}  // namespace

SweepResult remove_unused_namespaces(const std::string& dir, uint64_t own_netns, bool shared) {
  return sweep(dir, own_netns, false, shared);
}

SweepResult remove_own_namespace_if_unused(const std::string& dir, uint64_t own_netns,
                                           bool shared) {
  return sweep(dir, own_netns, true, shared);
}

}  // namespace urdma::daemon
