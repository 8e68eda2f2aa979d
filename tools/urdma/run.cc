// `urdma run CMD ARGS...`: our libibverbs.so.1 first on LD_LIBRARY_PATH, urdmad up, the device
// view (view.h) made, then exec.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "daemon/client.h"
#include "daemon/device_view.h"
#include "daemon/paths.h"
#include "tools/urdma/commands.h"
#include "tools/urdma/view.h"

namespace urdma::tools {
namespace {

bool is_dir(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string self_dir() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "";
  const std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// "a/b/../c" stays as is (the loader resolves it); only doubled slashes would be cosmetic.
std::string canonical(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) ? std::string(resolved) : path;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

// urdma run --no-daemon: the GID directory of the daemon the library will start for this user
// and namespace, made now (empty) so the view can bind it; that daemon fills it.
std::string prepare_user_gid_dir() {
  daemon::Endpoint ep;
  std::string why;
  if (daemon::user_endpoint(geteuid(), daemon::netns_inode(), &ep, &why) != 0) return "";
  const std::string dir = daemon::gid_view_dir(ep.dir, daemon::netns_inode());
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return "";
  for (const char* sub : daemon::kGidViewSubdirs)
    if (mkdir((dir + "/" + sub).c_str(), 0755) != 0 && errno != EEXIST) return "";
  return dir;
}

}  // namespace

std::vector<std::string> library_dirs() {
  std::vector<std::string> dirs;
  auto add = [&](const std::string& d) {
    if (!is_dir(d)) return;
    const std::string c = canonical(d);
    for (const auto& have : dirs)
      if (have == c) return;
    dirs.push_back(c);
  };
  if (const char* env = secure_getenv("URDMA_LIBDIR"); env && *env) add(env);
  const std::string bin = self_dir();
  if (!bin.empty()) {
    add(bin + "/../" URDMA_INSTALL_LIBDIR "/urdma");
    add(bin + "/../lib/urdma");
  }
  // The build tree's libraries only for the build tree's urdma: an installed copy never points
  // back into a directory it does not own.
  if (daemon::running_from_build_tree()) add(URDMA_BUILD_LIBDIR);
  return dirs;
}

int run_command(const RunOptions& options) {
  if (options.command.empty()) {
    std::cerr << "urdma run: no command given\n";
    return 2;
  }
  const auto dirs = library_dirs();
  if (dirs.empty()) {
    std::cerr << "urdma run: no urdma library directory found (set URDMA_LIBDIR)\n";
    return 1;
  }
  // Ours first, then whatever the caller had.
  std::string path = dirs.front();
  for (size_t i = 1; i < dirs.size(); ++i) path += ":" + dirs[i];
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old && *old) path += std::string(":") + old;
  setenv("LD_LIBRARY_PATH", path.c_str(), 1);

  // The library finds the urdmad installed beside it (daemon/client.h); the program's libraries
  // may come from elsewhere (URDMA_LIBDIR), so name the trusted daemon this command found.
  daemon::ClientOptions o;
  const std::string daemon_path = daemon::find_daemon_binary(o);
  if (!daemon_path.empty() && !secure_getenv("URDMA_DAEMON"))
    setenv("URDMA_DAEMON", canonical(daemon_path).c_str(), 1);
  ViewSource view;
  if (options.start_daemon) {
    // Up before the program starts, so it does not pay for it; our connection closes at exec.
    daemon::Client client;
    std::string detail;
    if (const int err = daemon::Client::connect_or_spawn(o, &client, &detail)) {
      std::cerr << "urdma run: " << detail << " (" << std::strerror(err) << ")\n";
      return 1;
    }
    view.gid_dir = daemon::gid_view_dir(dir_of(client.socket_path()), daemon::netns_inode());
    view.daemon_uid = client.daemon_info().uid;
  } else if (options.view) {
    // The daemon the library will start: its directory, made ready for the view now.
    view.gid_dir = prepare_user_gid_dir();
    view.daemon_uid = geteuid();
  }
  if (options.view) {
    std::string why;
    int err = view.gid_dir.empty() ? ENOENT : 0;
    // Without root the view needs a user namespace, and in one that maps only the caller's ids
    // another user's daemon (root's system daemon) shows as the overflow uid, which the library
    // cannot tell from an impostor's and refuses. With such a daemon the program runs unviewed.
    if (err == 0 && geteuid() != 0 && view.daemon_uid != geteuid()) {
      err = EPERM;
      why = "the daemon is another user's (uid " + std::to_string(view.daemon_uid) +
            "), and without root the view's user namespace would hide who it is";
    }
    if (err == 0) err = enter_device_view(view, &why);
    // Said once, here: the program runs anyway (plain verbs programs need no view).
    if (err != 0 && err != EEXIST)
      std::cerr << "urdma run: " << options.command.front()
                << " runs without the device view (/sys/class/infiniband/urdma0, "
                   "/dev/infiniband): "
                << (why.empty() ? std::strerror(err) : why)
                << ". Verbs programs run; UCX and libfabric do not find urdma0 "
                   "(docs/COMPATIBILITY.md, urdma run --no-view to silence this)\n";
  }
  std::vector<char*> argv;
  for (const auto& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int err = errno;
  std::cerr << "urdma run: " << options.command.front() << ": " << std::strerror(err) << '\n';
  return err == ENOENT ? 127 : 126;
}

}  // namespace urdma::tools
