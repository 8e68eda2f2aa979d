// A program that loads libibverbs.so.1 and librdmacm.so.1 with dlopen, as a plugin loads them
// (Open MPI's OFI MTL loads libfabric, which loads both, and unloads it all at MPI_Finalize):
// it opens the device, allocates a PD, creates and binds an rdma_cm id, releases everything,
// dlcloses both libraries and keeps running. It links neither library (the test runs it with
// LD_LIBRARY_PATH naming ours); only their headers, for the types.
//
// Prints, each on a line of its own:
//   opened <device name>
//   bound <rdma_bind_addr's result>
//   after dlclose: libibverbs <mapped|unmapped>, librdmacm <mapped|unmapped>
//   alive after 3 s
// and exits 0; exits 1 when a step fails. A library that is unmapped while threads of its own
// still run makes the process die of SIGSEGV before the last line (the keeper thread that
// reports counters to urdmad wakes every second).
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

template <class F>
F sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) std::printf("no symbol %s: %s\n", name, dlerror());
  return reinterpret_cast<F>(p);
}

bool mapped(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

int run() {
  void* verbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  void* cm = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_LOCAL);
  if (verbs == nullptr || cm == nullptr) {
    std::printf("dlopen: %s\n", dlerror());
    return 1;
  }
  auto get_list = sym<ibv_device** (*)(int*)>(verbs, "ibv_get_device_list");
  auto free_list = sym<void (*)(ibv_device**)>(verbs, "ibv_free_device_list");
  auto name_of = sym<const char* (*)(ibv_device*)>(verbs, "ibv_get_device_name");
  auto open_dev = sym<ibv_context* (*)(ibv_device*)>(verbs, "ibv_open_device");
  auto close_dev = sym<int (*)(ibv_context*)>(verbs, "ibv_close_device");
  auto alloc_pd = sym<ibv_pd* (*)(ibv_context*)>(verbs, "ibv_alloc_pd");
  auto dealloc_pd = sym<int (*)(ibv_pd*)>(verbs, "ibv_dealloc_pd");
  auto create_channel = sym<rdma_event_channel* (*)()>(cm, "rdma_create_event_channel");
  auto destroy_channel = sym<void (*)(rdma_event_channel*)>(cm, "rdma_destroy_event_channel");
  auto create_id =
      sym<int (*)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space)>(cm, "rdma_create_id");
  auto destroy_id = sym<int (*)(rdma_cm_id*)>(cm, "rdma_destroy_id");
  auto bind_addr = sym<int (*)(rdma_cm_id*, sockaddr*)>(cm, "rdma_bind_addr");
  if (!get_list || !free_list || !name_of || !open_dev || !close_dev || !alloc_pd || !dealloc_pd ||
      !create_channel || !destroy_channel || !create_id || !destroy_id || !bind_addr)
    return 1;

  int n = 0;
  ibv_device** list = get_list(&n);
  if (list == nullptr || n < 1) {
    std::printf("no device\n");
    return 1;
  }
  ibv_context* ctx = open_dev(list[0]);
  if (ctx == nullptr) {
    std::printf("ibv_open_device: %s\n", std::strerror(errno));
    return 1;
  }
  std::printf("opened %s\n", name_of(list[0]));
  ibv_pd* pd = alloc_pd(ctx);
  if (pd == nullptr) return 1;

  rdma_event_channel* ch = create_channel();
  rdma_cm_id* id = nullptr;
  if (ch == nullptr || create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return 1;
  sockaddr_in sin = {};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::printf("bound %d\n", bind_addr(id, reinterpret_cast<sockaddr*>(&sin)));

  destroy_id(id);
  destroy_channel(ch);
  dealloc_pd(pd);
  close_dev(ctx);
  free_list(list);
  dlclose(cm);
  dlclose(verbs);
  std::printf("after dlclose: libibverbs %s, librdmacm %s\n",
              mapped("libibverbs.so.1") ? "mapped" : "unmapped",
              mapped("librdmacm.so.1") ? "mapped" : "unmapped");
  std::fflush(stdout);
  sleep(3);  // the libraries' threads wake meanwhile (the daemon keeper reports every second)
  std::printf("alive after 3 s\n");
  return 0;
}

}  // namespace

int main() {
  return run();
}
