#include "daemon/paths.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace urdma::daemon {

namespace {

const char* env(const char* name) {
  const char* v = secure_getenv(name);
  return v && *v ? v : nullptr;
}

// Inside a user namespace, files of unmapped users (real root among them) show the overflow uid:
// they are trusted as root's would be. Outside one, the overflow uid is just another user.
bool in_user_namespace() {
  std::ifstream f("/proc/self/uid_map");
  uint64_t inside = 1, outside = 1, count = 0;
  if (!(f >> inside >> outside >> count)) return false;
  return !(inside == 0 && outside == 0 && count == 4294967295u);
}

uid_t overflow_uid() {
  std::ifstream f("/proc/sys/kernel/overflowuid");
  unsigned long uid = 65534;
  f >> uid;
  return static_cast<uid_t>(uid);
}

bool owned_by(const struct stat& st, uid_t uid) {
  if (st.st_uid == 0 || st.st_uid == uid) return true;
  static const bool userns = in_user_namespace();
  static const uid_t overflow = overflow_uid();
  return userns && st.st_uid == overflow;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Makes `dir` if missing with `mode` (not changing an existing one). False only when it is
// missing and could not be made.
bool make_dir(const std::string& dir, mode_t mode) {
  if (mkdir(dir.c_str(), mode) == 0) return true;
  return errno == EEXIST;
}

}  // namespace

uint64_t netns_inode() {
  struct stat st;
  return stat("/proc/self/ns/net", &st) == 0 ? st.st_ino : 0;
}

std::string owner_text(uid_t uid) {
  std::string text = "uid " + std::to_string(uid);
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
    text += " (" + std::string(found->pw_name) + ")";
  return text;
}

bool trusted_path(const std::string& path, uid_t uid, std::string* why, bool to_create_in) {
  if (path.empty() || path[0] != '/') {
    *why = path + " is not an absolute path";
    return false;
  }
  // Every symbolic link on the way must be the uid's or root's: another user's link could be
  // pointed elsewhere later.
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string prefix = path.substr(0, end);
    struct stat st;
    if (lstat(prefix.c_str(), &st) != 0) {
      *why = prefix + ": " + std::strerror(errno);
      return false;
    }
    if (S_ISLNK(st.st_mode) && !owned_by(st, uid)) {
      *why = prefix + " is a symbolic link of " + owner_text(st.st_uid);
      return false;
    }
    if (end == std::string::npos) break;
  }
  char resolved[PATH_MAX];
  if (!realpath(path.c_str(), resolved)) {
    *why = path + ": " + std::strerror(errno);
    return false;
  }
  // The resolved path, from its last component up to "/".
  std::string child;
  struct stat child_st {};
  for (std::string p = resolved;; p = parent_of(p)) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      *why = p + ": " + std::strerror(errno);
      return false;
    }
    if (!owned_by(st, uid)) {
      *why = p + " belongs to " + owner_text(st.st_uid);
      return false;
    }
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (others_write) {
      // Only a sticky directory above an entry of the uid's (or root's) may be shared.
      const bool sticky = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);
      const bool sticky_ok = sticky && (child.empty() ? to_create_in : owned_by(child_st, uid));
      if (!sticky_ok) {
        *why = p + " may be written by others (mode " + std::to_string(st.st_mode & 07777) + ")";
        return false;
      }
    }
    if (p == "/") return true;
    child = p;
    child_st = st;
  }
}

std::string system_dir() {
  const char* dir = env("URDMA_SYSTEM_DIR");
  return dir ? dir : "/run/urdma";
}

Endpoint endpoint_in(const std::string& dir, uint64_t netns, bool system) {
  const std::string base = dir + "/net-" + std::to_string(netns);
  return Endpoint{.dir = dir, .socket = base + ".sock", .lock = base + ".lock", .system = system};
}

Endpoint system_endpoint(uint64_t netns) {
  return endpoint_in(system_dir(), netns, true);
}

Endpoint systemd_endpoint() {
  const std::string dir = system_dir();
  return Endpoint{.dir = dir, .socket = dir + "/urdmad.sock", .lock = "", .system = true};
}

int user_endpoint(uid_t uid, uint64_t netns, Endpoint* out, std::string* why) {
  // An explicit directory is used or refused, never passed over.
  if (const char* dir = env("URDMA_RUNTIME_DIR")) {
    if (!make_dir(dir, 0700)) {
      *why = "URDMA_RUNTIME_DIR=" + std::string(dir) + ": " + std::strerror(errno);
      return ENOENT;
    }
    if (!trusted_path(dir, uid, why)) {
      *why = "URDMA_RUNTIME_DIR is not safe: " + *why;
      return EACCES;
    }
    *out = endpoint_in(dir, netns, false);
    return 0;
  }
  std::vector<std::string> candidates;
  if (uid == 0) candidates.push_back(system_dir() + "/uid-0");
  if (const char* xdg = env("XDG_RUNTIME_DIR")) candidates.push_back(std::string(xdg) + "/urdma");
  candidates.push_back("/run/user/" + std::to_string(uid) + "/urdma");
  candidates.push_back("/tmp/urdma-" + std::to_string(uid));
  std::string last = "no candidate directory";
  for (const std::string& dir : candidates) {
    const std::string parent = parent_of(dir);
    // root makes /run/urdma itself (the system directory, readable by all).
    if (uid == 0 && parent == system_dir()) (void)make_dir(parent, 0755);
    std::string parent_why;
    if (!trusted_path(parent, uid, &parent_why, /*to_create_in=*/true)) {
      last = parent_why;
      continue;
    }
    if (!make_dir(dir, 0700)) {
      last = dir + ": " + std::strerror(errno);
      continue;
    }
    if (!trusted_path(dir, uid, why)) {
      *why = "refusing " + dir + ": " + *why;
      return EACCES;
    }
    *out = endpoint_in(dir, netns, false);
    return 0;
  }
  *why = "no directory for urdmad's socket could be made (" + last + "); set URDMA_RUNTIME_DIR";
  return ENOENT;
}

int take_lock(const std::string& path, int* out) {
  // Another holder may remove the file between our open and our lock (release_lock): then the
  // lock we hold is on a file nobody else can find, so open it again.
  for (int tries = 0; tries < 16; ++tries) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      close(fd);
      return err == EWOULDBLOCK ? EADDRINUSE : err;
    }
    struct stat held, named;
    if (fstat(fd, &held) == 0 && stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      *out = fd;
      return 0;
    }
    close(fd);
  }
  return EAGAIN;
}

void release_lock(const std::string& path, int fd) {
  if (fd < 0) return;
  unlink(path.c_str());
  close(fd);
}

}  // namespace urdma::daemon
