#include "daemon/paths.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace urdma::daemon {
namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char templ[] = "/tmp/urdma-paths-test-XXXXXX";
    path = mkdtemp(templ);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(Paths, TrustedPathsBelongToRootOrTheUserAndNobodyElseWrites) {
  const uid_t me = geteuid();
  std::string why;
  EXPECT_TRUE(trusted_path("/", me, &why)) << why;
  EXPECT_FALSE(trusted_path("relative/dir", me, &why));
  TempDir d;
  // Beneath /tmp (sticky, written by all) an entry of the user's is theirs.
  EXPECT_TRUE(trusted_path(d.path, me, &why)) << why;
  ASSERT_EQ(chmod(d.path.c_str(), 0775), 0);
  EXPECT_FALSE(trusted_path(d.path, me, &why)) << "group-writable";
  ASSERT_EQ(chmod(d.path.c_str(), 0700), 0);
  const std::string inner = d.path + "/inner";
  ASSERT_EQ(mkdir(inner.c_str(), 0700), 0);
  EXPECT_TRUE(trusted_path(inner, me, &why)) << why;
  ASSERT_EQ(chmod(d.path.c_str(), 01777), 0);
  EXPECT_TRUE(trusted_path(inner, me, &why)) << "a sticky parent: " << why;
  ASSERT_EQ(chmod(d.path.c_str(), 0777), 0);
  EXPECT_FALSE(trusted_path(inner, me, &why)) << "a parent anyone may rename entries of";
  ASSERT_EQ(chmod(d.path.c_str(), 0700), 0);
  EXPECT_FALSE(trusted_path(d.path + "/missing", me, &why));
  if (me != 0) GTEST_SKIP() << "the other-user cases need root (chown)";
  // Another user's directory, and a link of another user's pointing at ours.
  ASSERT_EQ(chown(inner.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(trusted_path(inner, me, &why));
  EXPECT_NE(why.find("65534"), std::string::npos) << why;
  ASSERT_EQ(chown(inner.c_str(), 0, 0), 0);
  const std::string link = d.path + "/link";
  ASSERT_EQ(symlink(inner.c_str(), link.c_str()), 0);
  EXPECT_TRUE(trusted_path(link, me, &why)) << why;
  ASSERT_EQ(lchown(link.c_str(), 65534, 65534), 0);
  EXPECT_FALSE(trusted_path(link, me, &why));
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
}

TEST(Paths, AUserDirectoryAnotherUserMadeFirstIsRefusedNamingTheOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as two users";
  // The squatter made /tmp/urdma-<uid> of a user who has no XDG_RUNTIME_DIR.
  const uid_t victim = 4242;
  const std::string squatted = "/tmp/urdma-4242";
  std::filesystem::remove_all(squatted);
  ASSERT_EQ(mkdir(squatted.c_str(), 0777), 0);
  ASSERT_EQ(chown(squatted.c_str(), 65534, 65534), 0);
  unsetenv("URDMA_RUNTIME_DIR");
  unsetenv("XDG_RUNTIME_DIR");
  Endpoint ep;
  std::string why;
  EXPECT_EQ(user_endpoint(victim, 77, &ep, &why), EACCES);
  EXPECT_NE(why.find("65534"), std::string::npos) << why;
  std::filesystem::remove_all(squatted);
  // Made by the library itself, it is used: mode 0700, the socket named for the namespace.
  ASSERT_EQ(user_endpoint(victim, 77, &ep, &why), 0) << why;
  EXPECT_EQ(ep.dir, squatted);
  EXPECT_EQ(ep.socket, squatted + "/net-77.sock");
  EXPECT_FALSE(ep.system);
  struct stat st;
  ASSERT_EQ(stat(squatted.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  std::filesystem::remove_all(squatted);
}

TEST(Paths, AnExplicitRuntimeDirectoryIsUsedOrRefusedNeverPassedOver) {
  TempDir d;
  setenv("URDMA_RUNTIME_DIR", d.path.c_str(), 1);
  Endpoint ep;
  std::string why;
  ASSERT_EQ(user_endpoint(geteuid(), 5, &ep, &why), 0) << why;
  EXPECT_EQ(ep.socket, d.path + "/net-5.sock");
  ASSERT_EQ(chmod(d.path.c_str(), 0777), 0);
  EXPECT_EQ(user_endpoint(geteuid(), 5, &ep, &why), EACCES);
  unsetenv("URDMA_RUNTIME_DIR");
}

TEST(Paths, TheLockIsHeldByOneAndRemovedWithItsHolder) {
  TempDir d;
  const std::string lock = d.path + "/net-1.lock";
  int first = -1, second = -1;
  ASSERT_EQ(take_lock(lock, &first), 0);
  EXPECT_EQ(take_lock(lock, &second), EADDRINUSE);
  release_lock(lock, first);
  EXPECT_FALSE(std::filesystem::exists(lock));
  ASSERT_EQ(take_lock(lock, &second), 0);
  release_lock(lock, second);
  // A link planted in the lock's place is not followed.
  ASSERT_EQ(symlink("/etc/passwd", lock.c_str()), 0);
  EXPECT_EQ(take_lock(lock, &first), ELOOP);
}

TEST(Paths, TheNamespaceIsTheInodeOfNsNet) {
  struct stat st;
  ASSERT_EQ(stat("/proc/self/ns/net", &st), 0);
  EXPECT_EQ(netns_inode(), st.st_ino);
  EXPECT_EQ(system_endpoint(9).socket, system_dir() + "/net-9.sock");
  EXPECT_TRUE(system_endpoint(9).system);
  EXPECT_EQ(systemd_endpoint().socket, system_dir() + "/urdmad.sock");
}

}  // namespace
}  // namespace urdma::daemon
