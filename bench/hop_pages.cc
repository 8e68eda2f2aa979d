// urdma_hop_pages: how many distinct 4 KiB pages of code and of data a ping-pong hop touches
// between its two syscalls, read from a Valgrind trace (docs/PERFORMANCE.md, "Pages after a
// syscall"). On a machine whose syscalls flush the TLB, each of those pages costs a page walk.
//
//   valgrind --tool=lackey --trace-mem=yes --trace-syscalls=yes --log-file=/tmp/hop.%p
//            build-bench/bench/urdma_loopback_bench --seconds 0.001 --rounds 100   (one line)
//   build-bench/bench/urdma_hop_pages /tmp/hop.<pid>     # once per process
//
// A hop's user-space part starts when a recvmmsg or recvmsg returns datagrams and ends when the
// next syscall is a sendmmsg or sendmsg: the answer leaves (UdpSocketIo reads one datagram by
// recvmsg after a read that found at most one, and sends one message by sendmsg). Such segments
// are grouped by the thread and by the socket the send wrote to (urdma_loopback_bench's RC
// socket, and those of its "raw UDP shaped as RC's datagrams" and "RC's least work" rows), and
// the median pages and instructions of each group are printed. Valgrind runs clock_gettime as a
// syscall, where the vDSO would not enter the kernel: those do not end a segment.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace {

constexpr int kClockGettime = 228;
constexpr int kSendmsg = 46;
constexpr int kRecvmsg = 47;
constexpr int kRecvmmsg = 299;
constexpr int kSendmmsg = 307;

struct Segment {
  size_t code_pages;
  size_t data_pages;
  long instructions;
};

size_t median(std::vector<size_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LACKEY_LOG\n", argv[0]);
    return 2;
  }
  FILE* f = std::fopen(argv[1], "r");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 2;
  }
  static char line[8192];
  std::set<unsigned long> code, data;
  long instructions = 0;
  bool after_data = false;  // the segment began where a recvmmsg returned datagrams
  std::map<std::pair<int, int>, std::vector<Segment>> groups;  // (thread, sendmmsg fd)
  while (std::fgets(line, sizeof line, f) != nullptr) {
    // Lackey: "I  addr,size" (an instruction), " L|S|M addr,size" (a data access).
    if (line[0] == 'I' || (line[0] == ' ' && std::strchr("LSM", line[1]) != nullptr)) {
      const unsigned long page = std::strtoul(line + 3, nullptr, 16) >> 12;
      if (line[0] == 'I') {
        code.insert(page);
        ++instructions;
      } else {
        data.insert(page);
      }
      continue;
    }
    // "SYSCALL[pid,tid](nr) sys_x ( args ) --> [async] ..." when a syscall enters, and
    // "SYSCALL[pid,tid](nr) ... [async] --> Success(0xN)" when it returns; or one line,
    // "... [sync] --> ...", for one that Valgrind runs itself.
    if (std::strncmp(line, "SYSCALL[", 8) != 0) continue;
    int pid = 0, tid = 0, nr = 0;
    if (std::sscanf(line, "SYSCALL[%d,%d](%d)", &pid, &tid, &nr) != 3) continue;
    if (nr == kClockGettime) continue;
    const bool returned = std::strstr(line, "... [async] -->") != nullptr;
    if (!returned && after_data && (nr == kSendmmsg || nr == kSendmsg)) {
      const char* args = std::strstr(line, nr == kSendmmsg ? "sys_sendmmsg ( " : "sys_sendmsg ( ");
      const int fd = args != nullptr ? std::atoi(std::strchr(args, '(') + 2) : -1;
      groups[{tid, fd}].push_back({code.size(), data.size(), instructions});
    }
    // A recvmmsg returns the datagrams it read, a recvmsg their bytes: either way not 0.
    after_data = returned && (nr == kRecvmmsg || nr == kRecvmsg) &&
                 std::strstr(line, "Success(0x") != nullptr &&
                 std::strstr(line, "Success(0x0)") == nullptr;
    code.clear();
    data.clear();
    instructions = 0;
  }
  std::printf("%-8s %-4s %9s %11s %11s %13s\n", "thread", "fd", "hops", "code pages", "data pages",
              "instructions");
  for (const auto& [key, segs] : groups) {
    std::vector<size_t> c, d, n;
    for (const Segment& s : segs) {
      c.push_back(s.code_pages);
      d.push_back(s.data_pages);
      n.push_back(static_cast<size_t>(s.instructions));
    }
    std::printf("%-8d %-4d %9zu %11zu %11zu %13zu   (medians)\n", key.first, key.second,
                segs.size(), median(c), median(d), median(n));
  }
  return 0;
}
