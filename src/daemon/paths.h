// Where urdmad listens, and what a process checks before it believes a path.
//
// A daemon listens on a unix socket in a directory that only its users can write, never on a
// name that another user could bind first (an abstract name belongs to whoever binds it):
//
//   system  /run/urdma/net-<ino>.sock     urdmad --system started by hand (root) in a namespace
//           /run/urdma/urdmad.sock        urdmad.socket (systemd socket activation)
//   user    <user dir>/net-<ino>.sock     the per-user daemon the library starts on demand
//
// <ino> is the inode of /proc/self/ns/net: each network namespace is a host with its own daemon.
// The user dir is the first of $URDMA_RUNTIME_DIR, /run/urdma/uid-0 (root), $XDG_RUNTIME_DIR/urdma,
// /run/user/<uid>/urdma and /tmp/urdma-<uid> whose parent exists and can be trusted; it is made
// with mode 0700. A path is trusted by a uid when it and every directory above it belong to root
// or that uid and no one else may write them — except a sticky directory such as /tmp, whose
// entries only their owners may rename or remove. A directory in the user's place that fails the
// check (another user made /tmp/urdma-1000 first) is an error naming its owner, never used.
// Environment variables are read with secure_getenv: a setuid program ignores them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace urdma::daemon {

// The network namespace this process is in (the inode of /proc/self/ns/net); 0 if unreadable.
uint64_t netns_inode();

// True when `path` may be trusted by `uid` (above). *why says which component fails and why.
// With `to_create_in`, `path` is a directory the caller is about to make an entry in: it may be
// a sticky directory that others write too (/tmp), since that entry will be the caller's.
bool trusted_path(const std::string& path, uid_t uid, std::string* why, bool to_create_in = false);

struct Endpoint {
  std::string dir;      // the trusted directory
  std::string socket;   // the unix socket a daemon listens on
  std::string lock;     // the lock a daemon holds while it serves (empty: systemd holds the socket)
  bool system = false;  // served by a system daemon (every user), not by the caller's own
};

// The system daemons' directory: /run/urdma ($URDMA_SYSTEM_DIR for tests).
std::string system_dir();
// A hand-started system daemon's endpoint for namespace `netns`.
Endpoint system_endpoint(uint64_t netns);
// The endpoint systemd's urdmad.socket listens on (the namespace systemd runs in).
Endpoint systemd_endpoint();

// The per-user endpoint of `uid` for namespace `netns` (the directory is made if missing). 0, or
// an errno with a sentence in *why: EACCES when a candidate directory exists but cannot be
// trusted, ENOENT when no candidate could be made.
int user_endpoint(uid_t uid, uint64_t netns, Endpoint* out, std::string* why);
// The endpoint for namespace `netns` in an explicit directory (urdmad --runtime-dir).
Endpoint endpoint_in(const std::string& dir, uint64_t netns, bool system);

// Exclusive, non-blocking lock of a lock file that can be removed while held: 0 with the open,
// locked file in *fd; EADDRINUSE when another process holds it; else an errno. The file is
// opened without following links. release_lock removes it, then closes it.
int take_lock(const std::string& path, int* fd);
void release_lock(const std::string& path, int fd);

// The owner of a path, for messages ("uid 65534 (nobody)").
std::string owner_text(uid_t uid);

}  // namespace urdma::daemon
