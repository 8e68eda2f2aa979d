#include "daemon/view_sweep.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "daemon/paths.h"

namespace urdma::daemon {
namespace {

namespace fs = std::filesystem;

// Inodes no namespace has: nsfs numbers start at 0xF0000000 (the kernel's PROC_DYNAMIC_FIRST).
constexpr uint64_t kDead = 12345, kDeadToo = 12346, kLink = 12347, kForeign = 12348,
                   kLocked = 12349, kBound = 12350;

// A process in a network namespace of its own (and, with `then`, doing that there first); it
// lives until the object goes.
class NamespaceHolder {
 public:
  explicit NamespaceHolder(int flags = CLONE_NEWNET) {
    int ready[2], hold[2];
    if (pipe(ready) != 0 || pipe(hold) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      close(hold[1]);
      struct stat st{};
      const bool ok = unshare(flags) == 0 && stat("/proc/self/ns/net", &st) == 0;
      uint64_t ino = ok ? st.st_ino : 0;
      (void)!write(ready[1], &ino, sizeof ino);
      char c;
      (void)!read(hold[0], &c, 1);  // until the parent closes its end
      _exit(0);
    }
    close(ready[1]);
    close(hold[0]);
    hold_ = hold[1];
    if (read(ready[0], &netns_, sizeof netns_) != sizeof netns_) netns_ = 0;
    close(ready[0]);
  }
  ~NamespaceHolder() {
    if (hold_ >= 0) close(hold_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  uint64_t netns() const { return netns_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  uint64_t netns_ = 0;
};

bool in_initial_pid_namespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 && st.st_ino == 0xEFFFFFFCu;
}

class ViewSweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for namespaces and another user's files";
    if (!in_initial_pid_namespace())
      GTEST_SKIP() << "the sweep judges only from the initial PID namespace";
    char tmpl[] = "/tmp/urdma_view_sweep_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A view as a daemon leaves it, with its socket and lock files.
  void plant(uint64_t netns) {
    const fs::path v = dir_ / ("view-" + std::to_string(netns));
    for (const char* sub : {"gids", "types", "ndevs", ".staging"}) fs::create_directories(v / sub);
    std::ofstream(v / "gids/0") << "0000:0000:0000:0000:0000:ffff:7f00:0001\n";
    std::ofstream(v / "types/0") << "RoCE v2\n";
    std::ofstream(v / "ndevs/0") << "lo\n";
    const std::string base = (dir_ / ("net-" + std::to_string(netns))).string();
    ASSERT_EQ(mknod((base + ".sock").c_str(), S_IFSOCK | 0600, 0), 0);
    std::ofstream(base + ".lock");
  }
  bool has_view(uint64_t netns) const {
    return fs::exists(fs::symlink_status(dir_ / ("view-" + std::to_string(netns))));
  }
  bool has_any(uint64_t netns) const {
    const std::string n = std::to_string(netns);
    return has_view(netns) || fs::exists(fs::symlink_status(dir_ / ("net-" + n + ".sock"))) ||
           fs::exists(fs::symlink_status(dir_ / ("net-" + n + ".lock")));
  }
  fs::path dir_;
};

TEST_F(ViewSweepTest, DeadNamespacesGoLiveOnesAndOursStay) {
  NamespaceHolder live;
  ASSERT_NE(live.netns(), 0u);
  const uint64_t own = netns_inode();
  plant(kDead);
  plant(kDeadToo);
  plant(live.netns());
  plant(own);
  // What an interrupted sweep left goes too.
  fs::create_directories(dir_ / ".removing-view-999/gids");
  const SweepResult r = remove_unused_namespaces(dir_.string(), own, false);
  EXPECT_EQ(r.skipped, "");
  EXPECT_FALSE(has_any(kDead));
  EXPECT_FALSE(has_any(kDeadToo));
  EXPECT_FALSE(fs::exists(dir_ / ".removing-view-999"));
  EXPECT_EQ(r.removed.size(), 2u);
  EXPECT_TRUE(has_view(live.netns())) << "a namespace a process is in keeps its view";
  EXPECT_TRUE(fs::exists(dir_ / ("view-" + std::to_string(live.netns())) / "gids/0"));
  EXPECT_TRUE(has_view(own));
  // Only what was there: nothing else in the directory.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 6u);  // the live and own namespaces' view, socket and lock
}

// A link among the views is neither followed nor removed; another user's view stays, and so
// does one whose namespace a keeper serves (its lock is held).
TEST_F(ViewSweepTest, LinksOtherUsersEntriesAndServedNamespacesAreLeftAlone) {
  const fs::path elsewhere = dir_ / "elsewhere";
  fs::create_directories(elsewhere / "gids");
  std::ofstream(elsewhere / "gids/0") << "precious\n";
  fs::create_directory_symlink(elsewhere, dir_ / ("view-" + std::to_string(kLink)));
  const fs::path foreign = dir_ / ("view-" + std::to_string(kForeign));
  fs::create_directories(foreign / "gids");
  std::ofstream(foreign / "gids/0") << "theirs\n";
  ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chown((foreign / "gids").c_str(), 65534, 65534), 0);
  plant(kLocked);
  const std::string lock = (dir_ / ("net-" + std::to_string(kLocked) + ".lock")).string();
  const int held = open(lock.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);

  const SweepResult r = remove_unused_namespaces(dir_.string(), netns_inode(), false);
  close(held);
  EXPECT_EQ(r.skipped, "");
  EXPECT_TRUE(r.removed.empty());
  EXPECT_TRUE(fs::is_symlink(dir_ / ("view-" + std::to_string(kLink))));
  EXPECT_TRUE(fs::exists(elsewhere / "gids/0")) << "the link was followed";
  EXPECT_TRUE(fs::exists(foreign / "gids/0"));
  EXPECT_TRUE(has_view(kLocked));
  EXPECT_TRUE(fs::exists(lock));
}

// A program that left the namespace's processes (or changed its uid) but keeps the view bound
// in its mount namespace keeps it: mountinfo names the view.
TEST_F(ViewSweepTest, AViewBoundInAMountNamespaceStays) {
  plant(kBound);
  const fs::path target = dir_ / "mnt";
  fs::create_directories(target);
  int ready[2], hold[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(hold), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(ready[0]);
    close(hold[1]);
    const std::string from = (dir_ / ("view-" + std::to_string(kBound)) / "gids").string();
    const char ok = unshare(CLONE_NEWNS) == 0 &&
                    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                    mount(from.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) == 0;
    (void)!write(ready[1], &ok, 1);
    char c;
    (void)!read(hold[0], &c, 1);
    _exit(0);
  }
  close(ready[1]);
  close(hold[0]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  ASSERT_TRUE(ok) << "could not bind the view in a mount namespace";
  const SweepResult bound = remove_unused_namespaces(dir_.string(), netns_inode(), false);
  close(hold[1]);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(bound.skipped, "");
  EXPECT_TRUE(has_view(kBound));
  // Unbound (the mount namespace went with its last process), it goes.
  const SweepResult unbound = remove_unused_namespaces(dir_.string(), netns_inode(), false);
  EXPECT_EQ(unbound.skipped, "");
  EXPECT_FALSE(has_any(kBound));
}

// At a keeper's end: its own view goes when no other process is in its namespace, and stays
// while one is.
TEST_F(ViewSweepTest, AKeepersOwnViewGoesAtItsEndOnlyWhenNothingElseIsInItsNamespace) {
  auto run_in_new_namespace = [&](bool with_companion) -> int {
    const pid_t child = fork();
    if (child == 0) {
      if (unshare(CLONE_NEWNET) != 0) _exit(10);
      const uint64_t own = netns_inode();
      plant(own);
      pid_t companion = -1;
      if (with_companion) {
        companion = fork();
        if (companion == 0) {
          pause();
          _exit(0);
        }
      }
      // The caller holds its own lock.
      const std::string lock = (dir_ / ("net-" + std::to_string(own) + ".lock")).string();
      const int held = open(lock.c_str(), O_RDWR | O_CLOEXEC);
      if (held < 0 || flock(held, LOCK_EX | LOCK_NB) != 0) _exit(11);
      const SweepResult r = remove_own_namespace_if_unused(dir_.string(), own, false);
      if (companion > 0) {
        kill(companion, SIGKILL);
        waitpid(companion, nullptr, 0);
      }
      if (!r.skipped.empty()) _exit(12);
      const bool gone = !has_view(own);
      const bool lock_kept = fs::exists(lock);  // the caller's release_lock removes it
      const bool sock_gone = !fs::exists(fs::symlink_status(
          dir_ / ("net-" + std::to_string(own) + ".sock")));
      if (!lock_kept) _exit(13);
      if (gone != sock_gone) _exit(14);
      _exit(gone ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(run_in_new_namespace(false), 0) << "alone in its namespace: its view goes";
  EXPECT_EQ(run_in_new_namespace(true), 1) << "another process in its namespace: it stays";
}

}  // namespace
}  // namespace urdma::daemon
