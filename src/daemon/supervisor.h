// urdmad's first process, the keeper: it owns what must outlive a daemon that crashes, and runs
// the daemon proper (daemon.h) as its child.
//
//   keeper (comm "urdma-keeper")            daemon (comm "urdmad", a fork of the keeper)
//   ├ the namespace's lock (paths.h)        ├ inherits the listener and the group
//   ├ the listening unix socket             ├ serves clients, routes MADs, keeps the GID table
//   ├ every socket of the slot group        └ tells the keeper "ready" and, when idle, "idle"
//   └ starts the daemon again when it dies
//
// Nothing the keeper holds is ever handed to a client: a client gets its own slot socket only.
// While the daemon restarts, connections wait in the listening socket's backlog, and the new
// daemon serves in takeover (protocol.h, RESTART): survivors reattach their slots before new
// leases are made. A daemon that idles out tells the keeper, which then exits (the socket file
// and the lock go with it). SIGTERM, SIGINT or SIGHUP to the keeper stop both.
//
// Under systemd socket activation the listening socket comes from systemd (LISTEN_FDS) and no
// lock is taken: systemd runs one instance.
#pragma once

#include <string>

#include "daemon/daemon.h"

namespace urdma::daemon {

struct SupervisorOptions {
  DaemonOptions daemon;
  // Where to listen (paths.h); ignored when systemd passes the listening socket.
  Endpoint endpoint;
  // The spawning library's status pipe (SpawnStatus), or -1.
  int status_fd = -1;
};

// Runs the keeper until the daemon idles out or a signal stops it; returns the exit code (3:
// another urdmad serves the namespace).
int run_supervisor(SupervisorOptions options);

}  // namespace urdma::daemon
