#include "daemon/client.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace urdma::daemon {
namespace {

// A fresh directory of this user's, mode 0700, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char templ[] = "/tmp/urdma-client-test-XXXXXX";
    path = mkdtemp(templ);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(Client, RunsOnlyATrustedDaemonBinary) {
  std::string why;
  ClientOptions o;
  o.daemon_path = "/nonexistent/urdmad";
  EXPECT_EQ(find_daemon_binary(o, &why), "");
  EXPECT_NE(why.find("/nonexistent/urdmad"), std::string::npos) << why;
  setenv("URDMA_DAEMON", "/from/env/urdmad", 1);
  EXPECT_EQ(find_daemon_binary({}), "") << "a named binary that is not there is not replaced";
  unsetenv("URDMA_DAEMON");
  // This test runs from the build tree: the urdmad built with the library.
  ASSERT_TRUE(running_from_build_tree());
  const std::string built = find_daemon_binary({}, &why);
  ASSERT_FALSE(built.empty()) << why;
  EXPECT_EQ(built.substr(built.rfind('/')), "/urdmad");

  // A copy in a directory others may write is refused, wherever it is named from.
  TempDir dir;
  const std::string copy = dir.path + "/urdmad";
  std::filesystem::copy_file(built, copy);
  ASSERT_EQ(chmod(copy.c_str(), 0755), 0);
  o.daemon_path = copy;
  EXPECT_EQ(find_daemon_binary(o, &why), copy) << why;
  ASSERT_EQ(chmod(dir.path.c_str(), 0777), 0);
  EXPECT_EQ(find_daemon_binary(o, &why), "");
  EXPECT_NE(why.find("may be written by others"), std::string::npos) << why;
  setenv("URDMA_DAEMON", copy.c_str(), 1);
  EXPECT_EQ(find_daemon_binary({}, &why), "");
  unsetenv("URDMA_DAEMON");
  ASSERT_EQ(chmod(dir.path.c_str(), 0700), 0);
  // A file others may write, or (as root) another user's.
  ASSERT_EQ(chmod(copy.c_str(), 0757), 0);
  EXPECT_EQ(find_daemon_binary(o, &why), "");
  ASSERT_EQ(chmod(copy.c_str(), 0755), 0);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(copy.c_str(), 65534, 65534), 0);
    EXPECT_EQ(find_daemon_binary(o, &why), "");
    EXPECT_NE(why.find("65534"), std::string::npos) << why;
  }
}

TEST(Client, WithoutADaemonAndWithoutSpawningIsRefusedAtOnce) {
  TempDir dir;
  Client c;
  std::string detail;
  ClientOptions o;
  o.runtime_dir = dir.path;
  o.spawn = false;
  EXPECT_EQ(Client::connect_or_spawn(o, &c, &detail), ECONNREFUSED);
  EXPECT_NE(detail.find(dir.path), std::string::npos) << detail;
  Slot slot;
  EXPECT_EQ(c.acquire_slot(&slot), ENOTCONN);
}

TEST(Client, AMissingBinaryIsENOENTNotATimeout) {
  TempDir dir;
  Client c;
  std::string detail;
  ClientOptions o;
  o.runtime_dir = dir.path;
  o.daemon_path = "/nonexistent/urdmad";
  EXPECT_EQ(Client::connect_or_spawn(o, &c, &detail), ENOENT);
  EXPECT_NE(detail.find("/nonexistent/urdmad"), std::string::npos) << detail;
}

TEST(Client, ARuntimeDirectoryOthersMayWriteIsRefused) {
  TempDir dir;
  ASSERT_EQ(chmod(dir.path.c_str(), 0777), 0);
  Client c;
  std::string detail;
  ClientOptions o;
  o.runtime_dir = dir.path;
  o.spawn = false;
  EXPECT_EQ(Client::connect_or_spawn(o, &c, &detail), EACCES);
  EXPECT_NE(detail.find("may be written by others"), std::string::npos) << detail;
}

}  // namespace
}  // namespace urdma::daemon
