#include "daemon/device_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netpacket/packet.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace urdma::daemon {

namespace {

constexpr const char* kStaging = ".staging";

bool is_loopback(const char* ifname) {
  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ifreq req{};
  std::memcpy(req.ifr_name, ifname, strnlen(ifname, IF_NAMESIZE - 1));
  return sock.valid() && ioctl(sock.get(), SIOCGIFFLAGS, &req) == 0 &&
         (req.ifr_flags & IFF_LOOPBACK) != 0;
}

// EUI-64 from a MAC (RFC 4291 appendix A).
uint64_t eui64_be(const uint8_t mac[6]) {
  const uint8_t b[8] = {static_cast<uint8_t>(mac[0] ^ 2), mac[1], mac[2], 0xff, 0xfe,
                        mac[3], mac[4], mac[5]};
  uint64_t v;
  std::memcpy(&v, b, sizeof v);
  return v;  // already in network order in memory
}

}  // namespace

std::string sysfs_gid_text(const uint8_t gid[16]) {
  char buf[40];
  for (int i = 0; i < 8; ++i)
    std::snprintf(buf + 5 * i, 6, "%02x%02x%s", gid[2 * i], gid[2 * i + 1], i < 7 ? ":" : "");
  return buf;
}

std::string sysfs_guid_text(uint64_t guid_be) {
  uint8_t b[8];
  std::memcpy(b, &guid_be, sizeof b);
  char buf[20];
  std::snprintf(buf, sizeof buf, "%02x%02x:%02x%02x:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3],
                b[4], b[5], b[6], b[7]);
  return buf;
}

uint64_t host_node_guid_be() {
  ifaddrs* list = nullptr;
  uint64_t guid = 0;
  unsigned best_index = ~0u;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_PACKET || (a->ifa_flags & IFF_LOOPBACK))
        continue;
      const auto* ll = reinterpret_cast<const sockaddr_ll*>(a->ifa_addr);
      if (ll->sll_halen != 6) continue;
      static constexpr uint8_t kZero[6] = {};
      if (std::memcmp(ll->sll_addr, kZero, 6) == 0) continue;
      const unsigned index = static_cast<unsigned>(ll->sll_ifindex);
      if (index < best_index) {
        best_index = index;
        guid = eui64_be(ll->sll_addr);
      }
    }
    freeifaddrs(list);
  }
  if (guid != 0) return guid;
  std::string seed;
  if (FILE* f = std::fopen("/etc/machine-id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) seed = buf;
    std::fclose(f);
  }
  struct stat st{};
  if (stat("/proc/self/ns/net", &st) == 0) seed += std::to_string(st.st_ino);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : seed) h = (h ^ c) * 0x100000001b3ull;
  // A locally administered EUI-64 (U/L bit set in the first byte, RFC 4291 2.5.1).
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(h >> (56 - 8 * i));
  b[0] = static_cast<uint8_t>((b[0] & ~1u) | 2u);
  std::memcpy(&guid, b, sizeof guid);
  return guid;
}

std::string gid_view_dir(const std::string& daemon_dir, uint64_t netns) {
  return daemon_dir + "/view-" + std::to_string(netns);
}

GidView::Files GidView::files_for(const GidEntry* entry, bool below_top) {
  Files f;
  if (!entry) {
    static constexpr uint8_t kZero[16] = {};
    if (below_top) f.gid = sysfs_gid_text(kZero) + "\n";
    return f;
  }
  f.gid = sysfs_gid_text(entry->gid.bytes().data()) + "\n";
  f.type = "RoCE v2\n";
  char name[IF_NAMESIZE] = {};
  // An interface that went away between the netlink message and now: its entry goes soon too.
  f.ndev = if_indextoname(entry->ifindex, name) ? std::string(name) + "\n" : "";
  return f;
}

bool GidView::open(const std::string& dir, const std::vector<GidEntry>& entries,
                   std::string* error) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = errno_text(("mkdir " + dir).c_str());
    return false;
  }
  UniqueFd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!root.valid() || fstat(root.get(), &st) != 0) {
    *error = errno_text(dir.c_str());
    return false;
  }
  if (st.st_uid != geteuid()) {
    *error = dir + " is not ours";
    return false;
  }
  for (const char* sub : kGidViewSubdirs) {
    if (mkdirat(root.get(), sub, 0755) != 0 && errno != EEXIST) {
      *error = errno_text(("mkdir " + dir + "/" + sub).c_str());
      return false;
    }
  }
  if (mkdirat(root.get(), kStaging, 0700) != 0 && errno != EEXIST) {
    *error = errno_text(("mkdir " + dir + "/" + kStaging).c_str());
    return false;
  }
  root_ = std::move(root);
  // Whatever an earlier daemon left is rewritten or removed: the table may have changed
  // meanwhile.
  current_.assign(kMaxGids, Files{});
  mark_existing("gids", &Files::gid);
  mark_existing("types", &Files::type);
  mark_existing("ndevs", &Files::ndev);
  nets_.clear();
  if (DIR* list = fdopendir(openat(root_.get(), "device/net",
                                   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC))) {
    while (const dirent* e = readdir(list))
      if (e->d_name[0] != '.') nets_.emplace_back(e->d_name);
    closedir(list);
    std::sort(nets_.begin(), nets_.end());
  }
  write("device", "numa_node", "-1\n");
  update(entries);
  return true;
}

void GidView::mark_existing(const char* subdir, std::string Files::*field) {
  const int fd = openat(root_.get(), subdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR* list = fdopendir(fd);
  if (!list) {
    close(fd);
    return;
  }
  while (const dirent* e = readdir(list)) {
    char* end = nullptr;
    errno = 0;
    const unsigned long i = std::strtoul(e->d_name, &end, 10);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end != '\0' || errno != 0 || i >= kMaxGids)
      continue;
    current_[i].*field = "?";  // unknown content: rewritten, or removed when not wanted
  }
  closedir(list);
}

void GidView::write(const char* subdir, uint32_t index, const std::string& text) {
  write(subdir, std::to_string(index), text);
}

void GidView::write(const char* subdir, const std::string& name, const std::string& text) {
  const std::string staged = std::string(kStaging) + "/" + subdir + "-" + name;
  const int fd = openat(root_.get(), staged.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  const std::string target = std::string(subdir) + "/" + name;
  if (!ok || renameat(root_.get(), staged.c_str(), root_.get(), target.c_str()) != 0)
    unlinkat(root_.get(), staged.c_str(), 0);
}

void GidView::remove(const char* subdir, uint32_t index) {
  const std::string target = std::string(subdir) + "/" + std::to_string(index);
  unlinkat(root_.get(), target.c_str(), 0);
}

void GidView::update(const std::vector<GidEntry>& entries) {
  if (!root_.valid()) return;
  std::vector<const GidEntry*> by_index(current_.size(), nullptr);
  uint32_t top = 0;  // one past the highest valid index
  for (const GidEntry& e : entries) {
    if (e.index >= by_index.size()) continue;
    by_index[e.index] = &e;
    top = std::max(top, e.index + 1);
  }
  for (uint32_t i = 0; i < current_.size(); ++i) {
    Files want = files_for(by_index[i], i < top);
    Files& have = current_[i];
    auto apply = [&](const char* sub, const std::string& w, const std::string& h) {
      if (w == h) return;
      if (w.empty()) {
        remove(sub, i);
      } else {
        write(sub, i, w);
      }
    };
    // A GID's attributes appear after it and go before it is cleared.
    const bool clearing = by_index[i] == nullptr;
    if (!clearing) apply("gids", want.gid, have.gid);
    apply("types", want.type, have.type);
    apply("ndevs", want.ndev, have.ndev);
    if (clearing) apply("gids", want.gid, have.gid);
    have = std::move(want);
  }
  std::vector<std::string> nets;
  for (const GidEntry& e : entries) {
    char name[IF_NAMESIZE] = {};
    if (!if_indextoname(e.ifindex, name) || is_loopback(name)) continue;
    if (name[0] != '.' && std::strchr(name, '/') == nullptr) nets.emplace_back(name);
  }
  std::sort(nets.begin(), nets.end());
  nets.erase(std::unique(nets.begin(), nets.end()), nets.end());
  update_nets(nets);
}

void GidView::update_nets(const std::vector<std::string>& want) {
  for (const std::string& name : nets_)
    if (!std::binary_search(want.begin(), want.end(), name))
      unlinkat(root_.get(), ("device/net/" + name).c_str(), AT_REMOVEDIR);
  if (want.empty()) {
    unlinkat(root_.get(), "device/net", AT_REMOVEDIR);
  } else {
    mkdirat(root_.get(), "device/net", 0755);
    for (const std::string& name : want)
      if (!std::binary_search(nets_.begin(), nets_.end(), name))
        mkdirat(root_.get(), ("device/net/" + name).c_str(), 0755);
  }
  nets_ = want;
}

}  // namespace urdma::daemon
