// Connection rate: how many connect → ESTABLISHED → disconnect → DISCONNECTED cycles per second
// two processes on one host make through librdmacm, beside the same cycle over TCP
// (connect/accept, then a FIN each way) in the same run.
//
// Built against Debian's librdmacm and libibverbs like any application; run it on urdma's with
//   urdma run build/bench/urdma_conn_rate [-n COUNT] [-a ADDR] [-p PORT]
// (or LD_LIBRARY_PATH=build/lib). The process forks a server before touching RDMA; the client
// times COUNT cycles, each with an RC QP on both sides (as rping and most applications make
// them). It prints connections/s for both and their ratio.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Options {
  int count = 1000;
  std::string addr = "127.0.0.1";
  int port = 7471;
};

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

sockaddr_in address(const Options& o, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, o.addr.c_str(), &a.sin_addr) != 1) die("inet_pton");
  return a;
}

// The next event on `ec`, which must be `want` (anything else ends the run).
void expect_event(rdma_event_channel* ec, rdma_cm_event_type want, rdma_cm_id** id = nullptr) {
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(ec, &e) != 0) die("rdma_get_cm_event");
  if (e->event != want) {
    std::fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(e->event), e->status,
                 rdma_event_str(want));
    std::exit(1);
  }
  if (id) *id = e->id;
  rdma_ack_cm_event(e);
}

ibv_qp_init_attr qp_attr(ibv_cq* cq) {
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  return a;
}

// --- rdma_cm ---------------------------------------------------------------------------------

// Accepts `count` connections one after another; each ends when the client disconnects.
int rdma_server(const Options& o, int ready_fd) {
  rdma_event_channel* ec = rdma_create_event_channel();
  rdma_cm_id* listener = nullptr;
  if (!ec || rdma_create_id(ec, &listener, nullptr, RDMA_PS_TCP) != 0) die("rdma_create_id");
  sockaddr_in a = address(o, o.port);
  if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&a)) != 0) die("rdma_bind_addr");
  if (rdma_listen(listener, 16) != 0) die("rdma_listen");
  if (write(ready_fd, "r", 1) != 1) die("write");
  ibv_cq* cq = nullptr;
  for (int i = 0; i < o.count; ++i) {
    rdma_cm_id* id = nullptr;
    expect_event(ec, RDMA_CM_EVENT_CONNECT_REQUEST, &id);
    if (!cq && !(cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0))) die("ibv_create_cq");
    ibv_qp_init_attr attr = qp_attr(cq);
    if (rdma_create_qp(id, nullptr, &attr) != 0) die("rdma_create_qp");
    rdma_conn_param param{};
    if (rdma_accept(id, &param) != 0) die("rdma_accept");
    expect_event(ec, RDMA_CM_EVENT_ESTABLISHED);
    expect_event(ec, RDMA_CM_EVENT_DISCONNECTED);
    rdma_disconnect(id);  // the DREP
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
  rdma_destroy_id(listener);
  if (cq) ibv_destroy_cq(cq);
  rdma_destroy_event_channel(ec);
  return 0;
}

void rdma_client_once(const Options& o, rdma_event_channel* ec, ibv_cq** cq) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) != 0) die("rdma_create_id");
  sockaddr_in a = address(o, o.port);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000) != 0)
    die("rdma_resolve_addr");
  expect_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (rdma_resolve_route(id, 2000) != 0) die("rdma_resolve_route");
  expect_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED);
  if (!*cq && !(*cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0))) die("ibv_create_cq");
  ibv_qp_init_attr attr = qp_attr(*cq);
  if (rdma_create_qp(id, nullptr, &attr) != 0) die("rdma_create_qp");
  rdma_conn_param param{};
  param.retry_count = 7;
  if (rdma_connect(id, &param) != 0) die("rdma_connect");
  expect_event(ec, RDMA_CM_EVENT_ESTABLISHED);
  if (rdma_disconnect(id) != 0) die("rdma_disconnect");
  expect_event(ec, RDMA_CM_EVENT_DISCONNECTED);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
}

// --- TCP -------------------------------------------------------------------------------------

int tcp_server(const Options& o, int ready_fd) {
  const int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = address(o, o.port);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 16) != 0)
    die("tcp listen");
  if (write(ready_fd, "t", 1) != 1) die("write");
  for (int i = 0; i < o.count; ++i) {
    const int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) die("accept");
    char b;
    while (read(c, &b, 1) > 0) {
    }
    close(c);  // our FIN: the client's "DISCONNECTED"
  }
  close(l);
  return 0;
}

void tcp_client_once(const Options& o) {
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = address(o, o.port);
  if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  shutdown(s, SHUT_WR);
  char b;
  while (read(s, &b, 1) > 0) {
  }
  close(s);
}

// --- the run ---------------------------------------------------------------------------------

// Forks `server`, waits until it listens, times `count` client cycles. Returns cycles/s.
template <class Server, class Once>
double measure(const char* name, const Options& o, Server server, Once once) {
  int ready[2];
  if (pipe(ready) != 0) die("pipe");
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    close(ready[0]);
    std::_Exit(server(o, ready[1]));
  }
  close(ready[1]);
  char b;
  if (read(ready[0], &b, 1) != 1) {
    std::fprintf(stderr, "%s: the server did not start\n", name);
    std::exit(1);
  }
  close(ready[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.count; ++i) once();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "%s: the server failed\n", name);
    std::exit(1);
  }
  const double rate = o.count / s;
  std::printf("%-8s %6d connections in %7.3f s: %9.1f connections/s (%.1f us each)\n", name,
              o.count, s, rate, 1e6 * s / o.count);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int c;
  while ((c = getopt(argc, argv, "n:a:p:")) != -1) {
    if (c == 'n') {
      o.count = std::atoi(optarg);
    } else if (c == 'a') {
      o.addr = optarg;
    } else if (c == 'p') {
      o.port = std::atoi(optarg);
    } else {
      std::fprintf(stderr, "usage: %s [-n COUNT] [-a IPV4] [-p PORT]\n", argv[0]);
      return 2;
    }
  }
  if (o.count <= 0) return 2;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // TCP first: its children fork before this process has opened any RDMA device.
  const double tcp = measure("tcp", o, tcp_server, [&] { tcp_client_once(o); });
  rdma_event_channel* ec = nullptr;
  ibv_cq* cq = nullptr;
  const double rdma = measure("rdma_cm", o, rdma_server, [&] {
    if (!ec && !(ec = rdma_create_event_channel())) die("rdma_create_event_channel");
    rdma_client_once(o, ec, &cq);
  });
  std::printf("rdma_cm / tcp: %.3f\n", rdma / tcp);
  if (cq) ibv_destroy_cq(cq);
  if (ec) rdma_destroy_event_channel(ec);
  return 0;
}
