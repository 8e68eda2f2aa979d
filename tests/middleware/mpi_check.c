// mpi_check: an MPI program that checks what it moves, for running Open MPI and MPICH over
// urdma. Every rank runs three parts; any wrong byte ends the job through MPI_Abort with a line
// that names the part, the size and the ranks:
//
//   p2p         every ordered pair of ranks exchanges one message of each size from 1 byte to
//               4 MiB (doubling, plus odd sizes), filled from a seeded pattern the receiver
//               recomputes; each message's CRC-32 is compared as well as every byte.
//   collectives Barrier, Bcast, Reduce, Allreduce (sum of known values), Gather, Allgather,
//               Alltoall and Scatter, each result compared with what it must be.
//   one-sided   a window per rank: Put and Get between every pair under MPI_Win_fence, and
//               Accumulate (MPI_SUM) from every rank under MPI_Win_lock/unlock, then read back.
//
// Rank 0 prints "mpi_check: ok ranks=N namespaces=M bytes=B" at the end (M: how many network
// namespaces the ranks ran in, from /proc/self/ns/net; B: p2p bytes each rank sent).
// Written in C with the MPI standard's API only, so one source builds with mpicc.openmpi and
// mpicc.mpich. The checks use zlib's crc32, not anything of urdma's.
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static int rank, size;

static void fail(const char* part, const char* what, long a, long b) {
  fprintf(stderr, "mpi_check: rank %d: %s: %s (%ld, %ld)\n", rank, part, what, a, b);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// The byte at offset i of the message from `src` to `dst` of `len` bytes: a 64-bit LCG step of
// a seed made from the three, so every message and every offset differs.
static void fill(unsigned char* buf, size_t len, int src, int dst) {
  uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)src << 40) ^ ((uint64_t)dst << 20) ^ len;
  for (size_t i = 0; i < len; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    buf[i] = (unsigned char)(x >> 56);
  }
}

static unsigned long crc_of(const unsigned char* buf, size_t len) {
  return crc32(crc32(0L, Z_NULL, 0), buf, (uInt)len);
}

static long p2p(void) {
  static const size_t kMax = 4u << 20;
  unsigned char* out = malloc(kMax);
  unsigned char* in = malloc(kMax);
  unsigned char* want = malloc(kMax);
  long sent = 0;
  if (!out || !in || !want) fail("p2p", "malloc", 0, 0);
  size_t sizes[64];
  int n = 0;
  for (size_t s = 1; s <= kMax; s *= 2) {
    sizes[n++] = s;
    if (s > 2 && s < kMax) sizes[n++] = s + s / 2 + 1;  // not a power of two
  }
  for (int k = 0; k < n; ++k) {
    const size_t len = sizes[k];
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      fill(out, len, rank, peer);
      unsigned long crc_out = crc_of(out, len), crc_in = 0;
      MPI_Request req[4];
      MPI_Irecv(in, (int)len, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &req[0]);
      MPI_Irecv(&crc_in, 1, MPI_UNSIGNED_LONG, peer, 2, MPI_COMM_WORLD, &req[1]);
      MPI_Isend(out, (int)len, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &req[2]);
      MPI_Isend(&crc_out, 1, MPI_UNSIGNED_LONG, peer, 2, MPI_COMM_WORLD, &req[3]);
      MPI_Status st[4];
      MPI_Waitall(4, req, st);
      int got = 0;
      MPI_Get_count(&st[0], MPI_BYTE, &got);
      if ((size_t)got != len) fail("p2p", "received count", got, (long)len);
      fill(want, len, peer, rank);
      if (crc_of(in, len) != crc_in) fail("p2p", "CRC-32 differs from the sender's", (long)len, peer);
      if (memcmp(in, want, len) != 0) fail("p2p", "bytes differ", (long)len, peer);
      sent += (long)len;
    }
  }
  free(out);
  free(in);
  free(want);
  return sent;
}

static void collectives(void) {
  MPI_Barrier(MPI_COMM_WORLD);

  // Bcast of 1 MiB from each root in turn.
  const int kBcast = 1 << 20;
  unsigned char* buf = malloc(kBcast);
  unsigned char* want = malloc(kBcast);
  for (int root = 0; root < size; ++root) {
    if (rank == root) fill(buf, kBcast, root, -1);
    else memset(buf, 0, kBcast);
    MPI_Bcast(buf, kBcast, MPI_BYTE, root, MPI_COMM_WORLD);
    fill(want, kBcast, root, -1);
    if (memcmp(buf, want, kBcast) != 0) fail("collectives", "Bcast bytes differ", root, kBcast);
  }
  free(buf);
  free(want);

  // Reduce and Allreduce: element i of rank r is r * 1000 + i; the sum over ranks is known.
  enum { kN = 4096 };
  long* v = malloc(sizeof(long) * kN);
  long* sum = malloc(sizeof(long) * kN);
  for (int i = 0; i < kN; ++i) v[i] = (long)rank * 1000 + i;
  const long ranks_sum = (long)size * (size - 1) / 2;
  MPI_Allreduce(v, sum, kN, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < kN; ++i)
    if (sum[i] != ranks_sum * 1000 + (long)size * i) fail("collectives", "Allreduce", i, sum[i]);
  memset(sum, 0, sizeof(long) * kN);
  MPI_Reduce(v, sum, kN, MPI_LONG, MPI_SUM, size - 1, MPI_COMM_WORLD);
  if (rank == size - 1)
    for (int i = 0; i < kN; ++i)
      if (sum[i] != ranks_sum * 1000 + (long)size * i) fail("collectives", "Reduce", i, sum[i]);
  free(v);
  free(sum);

  // Gather, Allgather, Scatter, Alltoall of ints: the value sent from r to d is r * 65536 + d.
  int* send = malloc(sizeof(int) * size);
  int* recv = malloc(sizeof(int) * size);
  int mine = rank * 65536 + 7, one = -1;
  MPI_Gather(&mine, 1, MPI_INT, recv, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0)
    for (int r = 0; r < size; ++r)
      if (recv[r] != r * 65536 + 7) fail("collectives", "Gather", r, recv[r]);
  MPI_Allgather(&mine, 1, MPI_INT, recv, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r)
    if (recv[r] != r * 65536 + 7) fail("collectives", "Allgather", r, recv[r]);
  for (int d = 0; d < size; ++d) send[d] = rank * 65536 + d;
  MPI_Scatter(send, 1, MPI_INT, &one, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (one != rank) fail("collectives", "Scatter", rank, one);
  MPI_Alltoall(send, 1, MPI_INT, recv, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r)
    if (recv[r] != r * 65536 + rank) fail("collectives", "Alltoall", r, recv[r]);
  free(send);
  free(recv);
}

static void one_sided(void) {
  // Each rank's window: one 64 KiB block per rank (Put lands in block [origin]) and one counter
  // per rank for Accumulate.
  const int kBlock = 64 * 1024;
  const MPI_Aint bytes = (MPI_Aint)kBlock * size + (MPI_Aint)sizeof(long) * size;
  unsigned char* base = NULL;
  MPI_Win win;
  MPI_Win_allocate(bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  memset(base, 0, (size_t)bytes);
  MPI_Barrier(MPI_COMM_WORLD);

  // Put: rank r writes fill(r -> t) into block r of every target t.
  unsigned char* out = malloc((size_t)kBlock * size);
  unsigned char* want = malloc(kBlock);
  MPI_Win_fence(0, win);
  for (int t = 0; t < size; ++t) {
    fill(out + (size_t)t * kBlock, kBlock, rank, t);
    MPI_Put(out + (size_t)t * kBlock, kBlock, MPI_BYTE, t, (MPI_Aint)rank * kBlock, kBlock, MPI_BYTE,
            win);
  }
  MPI_Win_fence(0, win);
  for (int o = 0; o < size; ++o) {
    fill(want, kBlock, o, rank);
    if (memcmp(base + (size_t)o * kBlock, want, kBlock) != 0) fail("one-sided", "Put bytes", o, kBlock);
  }

  // Get: read block `rank` back from every target; it must be what this rank put there.
  unsigned char* in = malloc((size_t)kBlock * size);
  MPI_Win_fence(0, win);
  for (int t = 0; t < size; ++t)
    MPI_Get(in + (size_t)t * kBlock, kBlock, MPI_BYTE, t, (MPI_Aint)rank * kBlock, kBlock, MPI_BYTE,
            win);
  MPI_Win_fence(0, win);
  for (int t = 0; t < size; ++t) {
    fill(want, kBlock, rank, t);
    if (memcmp(in + (size_t)t * kBlock, want, kBlock) != 0) fail("one-sided", "Get bytes", t, kBlock);
  }

  // Accumulate: every rank adds (rank + 1) * 3 to counter [c] of every target, 10 times, each
  // under an exclusive lock; the sum is known.
  const MPI_Aint counters = (MPI_Aint)kBlock * size;
  for (int round = 0; round < 10; ++round)
    for (int t = 0; t < size; ++t) {
      long add[64];
      for (int c = 0; c < size; ++c) add[c] = (long)(rank + 1) * 3;
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, t, 0, win);
      MPI_Accumulate(add, size, MPI_LONG, t, counters, size, MPI_LONG, MPI_SUM, win);
      MPI_Win_unlock(t, win);
    }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
  const long want_sum = 10L * 3 * ((long)size * (size + 1) / 2);
  for (int c = 0; c < size; ++c) {
    long got;
    memcpy(&got, base + counters + (MPI_Aint)sizeof(long) * c, sizeof got);
    if (got != want_sum) fail("one-sided", "Accumulate sum", c, got);
  }
  MPI_Win_unlock(rank, win);
  MPI_Win_free(&win);
  free(out);
  free(in);
  free(want);
}

// How many distinct network namespaces the ranks run in.
static int namespaces(void) {
  struct stat st;
  unsigned long long mine = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
  unsigned long long all[64];
  MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  int distinct = 0;
  for (int i = 0; i < size; ++i) {
    int seen = 0;
    for (int j = 0; j < i; ++j) seen |= all[j] == all[i];
    distinct += !seen;
  }
  return distinct;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 64) fail("setup", "at most 64 ranks", size, 64);
  const int nets = namespaces();
  const long sent = p2p();
  collectives();
  one_sided();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_check: ok ranks=%d namespaces=%d bytes=%ld\n", size, nets, sent);
  MPI_Finalize();
  return 0;
}
