#include "daemon/device_view.h"

#include <gtest/gtest.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace urdma::daemon {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

GidEntry entry(uint32_t index, const char* addr, uint32_t ifindex) {
  GidEntry e;
  e.index = index;
  e.gid = *net::Address::parse(addr);
  e.ifindex = ifindex;
  return e;
}

// The kernel's formats: "%pI6" for a GID, four groups of four hex digits for a GUID.
TEST(DeviceView, TextsAreTheKernels) {
  const uint8_t gid[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  EXPECT_EQ(sysfs_gid_text(gid), "fe80:0000:0000:0000:0211:22ff:fe33:4455");
  const uint8_t guid[8] = {0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  uint64_t be;
  std::memcpy(&be, guid, 8);
  EXPECT_EQ(sysfs_guid_text(be), "0211:22ff:fe33:4455");
  EXPECT_EQ(gid_view_dir("/run/urdma", 4026531840), "/run/urdma/view-4026531840");
}

class GidViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/urdma_gid_view_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

size_t count_files(const fs::path& dir) {
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.is_regular_file();
  return files;
}

// gids/<i> up to the highest valid index (zero below it, as the kernel's), types and ndevs of
// valid entries only: a few files per namespace, not one per index of 1024.
TEST_F(GidViewTest, GidFilesGoUpToTheHighestValidIndexAndValidOnesHaveATypeAndANetdev) {
  const unsigned lo = if_nametoindex("lo");
  GidView view;
  std::string why;
  ASSERT_TRUE(view.open((root_ / "view").string(),
                        {entry(0, "127.0.0.1", lo), entry(2, "::1", lo)}, &why))
      << why;
  const fs::path v = root_ / "view";
  EXPECT_EQ(count_files(v / "gids"), 3u);
  EXPECT_EQ(count_files(v / "types"), 2u);
  EXPECT_EQ(count_files(v / "ndevs"), 2u);
  EXPECT_EQ(slurp(v / "gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0001\n");
  EXPECT_EQ(slurp(v / "gids/1"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(slurp(v / "gids/2"), "0000:0000:0000:0000:0000:0000:0000:0001\n");
  EXPECT_FALSE(fs::exists(v / "gids/3"));
  EXPECT_EQ(slurp(v / "types/0"), "RoCE v2\n");
  EXPECT_EQ(slurp(v / "ndevs/0"), "lo\n");
  EXPECT_FALSE(fs::exists(v / "types/1"));
  EXPECT_FALSE(fs::exists(v / "ndevs/1"));
  // The staging directory holds nothing once an update is done.
  EXPECT_TRUE(fs::is_empty(v / ".staging"));
  // The highest entry going takes the zero files below it too.
  view.update({entry(0, "127.0.0.1", lo)});
  EXPECT_EQ(count_files(v / "gids"), 1u);
  EXPECT_EQ(count_files(v / "types"), 1u);
  EXPECT_EQ(count_files(v / "ndevs"), 1u);
}

// A daemon that wrote a file for every index (or a larger table) before: its files beyond the
// table go when the next one opens the view.
TEST_F(GidViewTest, AnEarlierDaemonsFilesBeyondTheTableAreRemovedAtOpen) {
  const fs::path v = root_ / "view";
  for (const char* sub : {"gids", "types", "ndevs"}) fs::create_directories(v / sub);
  for (unsigned i = 0; i < kMaxGids; ++i)
    std::ofstream(v / "gids" / std::to_string(i)) << "0000:0000:0000:0000:0000:0000:0000:0000\n";
  std::ofstream(v / "types/7") << "RoCE v2\n";
  std::ofstream(v / "ndevs/7") << "lo\n";
  std::ofstream(v / "gids/not-an-index") << "kept\n";
  GidView view;
  std::string why;
  ASSERT_TRUE(view.open(v.string(), {entry(0, "127.0.0.1", if_nametoindex("lo"))}, &why)) << why;
  EXPECT_EQ(count_files(v / "gids"), 2u);  // 0, and the name that is no index of ours
  EXPECT_EQ(slurp(v / "gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0001\n");
  EXPECT_FALSE(fs::exists(v / "gids/1"));
  EXPECT_FALSE(fs::exists(v / "types/7"));
  EXPECT_FALSE(fs::exists(v / "ndevs/7"));
}

TEST_F(GidViewTest, UpdatesChangeFilesInPlaceAndKeepTheDirectories) {
  const unsigned lo = if_nametoindex("lo");
  GidView view;
  std::string why;
  const fs::path v = root_ / "view";
  ASSERT_TRUE(view.open(v.string(), {entry(0, "127.0.0.1", lo)}, &why)) << why;
  struct stat before;
  ASSERT_EQ(stat((v / "gids").c_str(), &before), 0);
  view.update({entry(1, "::1", lo)});
  EXPECT_EQ(slurp(v / "gids/0"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_FALSE(fs::exists(v / "types/0"));
  EXPECT_EQ(slurp(v / "gids/1"), "0000:0000:0000:0000:0000:0000:0000:0001\n");
  EXPECT_EQ(slurp(v / "types/1"), "RoCE v2\n");
  struct stat after;
  ASSERT_EQ(stat((v / "gids").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // a bind of the directory sees the change
  // A daemon started again later reuses the directories and rewrites every file.
  GidView again;
  ASSERT_TRUE(again.open(v.string(), {entry(3, "10.1.2.3", lo)}, &why)) << why;
  EXPECT_EQ(slurp(v / "gids/1"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(slurp(v / "gids/3"), "0000:0000:0000:0000:0000:ffff:0a01:0203\n");
  ASSERT_EQ(stat((v / "gids").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
}

// The first interface other than loopback (its name, "" when there is none).
std::string first_non_loopback() {
  std::string name;
  if (struct if_nameindex* all = if_nameindex()) {
    for (struct if_nameindex* i = all; i->if_index != 0 && name.empty(); ++i) {
      std::ifstream flags("/sys/class/net/" + std::string(i->if_name) + "/flags");
      unsigned long f = 0;
      if (flags >> std::hex >> f && !(f & IFF_LOOPBACK)) name = i->if_name;
    }
    if_freenameindex(all);
  }
  return name;
}

// device/numa_node always; device/net/<ifname>/ for each interface but loopback that holds a
// GID, and no net/ at all when there is none.
TEST_F(GidViewTest, DeviceNetNamesTheInterfacesButLoopbackAndGoesWhenTheyGo) {
  const unsigned lo = if_nametoindex("lo");
  const fs::path v = root_ / "view";
  GidView view;
  std::string why;
  ASSERT_TRUE(view.open(v.string(), {entry(0, "127.0.0.1", lo)}, &why)) << why;
  EXPECT_EQ(slurp(v / "device/numa_node"), "-1\n");
  EXPECT_FALSE(fs::exists(v / "device/net"));
  const std::string other = first_non_loopback();
  if (other.empty()) GTEST_SKIP() << "no interface but loopback here";
  const unsigned idx = if_nametoindex(other.c_str());
  view.update({entry(0, "127.0.0.1", lo), entry(1, "10.1.2.3", idx), entry(2, "10.1.2.4", idx)});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(v / "device/net")) {
    EXPECT_TRUE(e.is_directory());
    names.push_back(e.path().filename());
  }
  EXPECT_EQ(names, std::vector<std::string>{other});
  // A daemon started again later finds the entry and removes it with the GIDs.
  GidView again;
  ASSERT_TRUE(again.open(v.string(), {entry(0, "127.0.0.1", lo)}, &why)) << why;
  EXPECT_FALSE(fs::exists(v / "device/net"));
  EXPECT_EQ(slurp(v / "device/numa_node"), "-1\n");
}

TEST_F(GidViewTest, ADirectoryOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make another user's directory";
  const fs::path v = root_ / "view";
  ASSERT_EQ(mkdir(v.c_str(), 0755), 0);
  ASSERT_EQ(chown(v.c_str(), 65534, 65534), 0);
  GidView view;
  std::string why;
  EXPECT_FALSE(view.open(v.string(), {}, &why));
  EXPECT_NE(why.find("not ours"), std::string::npos) << why;
}

}  // namespace
}  // namespace urdma::daemon
