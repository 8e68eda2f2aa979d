#include "daemon/client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

namespace urdma::daemon {
namespace {

TEST(Client, FindsTheDaemonBinary) {
  ClientOptions o;
  o.daemon_path = "/explicit/urdmad";
  EXPECT_EQ(find_daemon_binary(o), "/explicit/urdmad");
  setenv("URDMA_DAEMON", "/from/env/urdmad", 1);
  EXPECT_EQ(find_daemon_binary({}), "/from/env/urdmad");
  unsetenv("URDMA_DAEMON");
  // Not next to this test, not on an empty PATH: the urdmad built with the library.
  const char* path = std::getenv("PATH");
  const std::string saved = path ? path : "";
  setenv("PATH", "", 1);
  const std::string found = find_daemon_binary({});
  setenv("PATH", saved.c_str(), 1);
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(found.substr(found.rfind('/')), "/urdmad");
  EXPECT_EQ(access(found.c_str(), X_OK), 0);
}

TEST(Client, WithoutADaemonAndWithoutSpawningIsRefusedAtOnce) {
  Client c;
  std::string detail;
  ClientOptions o;
  o.socket_name = "urdma/test-nobody-listens-" + std::to_string(getpid());
  o.spawn = false;
  EXPECT_EQ(Client::connect_or_spawn(o, &c, &detail), ECONNREFUSED);
  EXPECT_NE(detail.find(o.socket_name), std::string::npos) << detail;
  Slot slot;
  EXPECT_EQ(c.acquire_slot(&slot), ENOTCONN);
}

TEST(Client, AMissingBinaryIsENOENTNotATimeout) {
  Client c;
  std::string detail;
  ClientOptions o;
  o.socket_name = "urdma/test-nobody-listens-" + std::to_string(getpid());
  o.daemon_path = "/nonexistent/urdmad";
  EXPECT_EQ(Client::connect_or_spawn(o, &c, &detail), ENOENT);
  EXPECT_NE(detail.find("URDMA_DAEMON"), std::string::npos) << detail;
}

}  // namespace
}  // namespace urdma::daemon
