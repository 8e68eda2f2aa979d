// mpi_pingpong: MPI point-to-point latency and bandwidth between ranks 0 and 1, for
// bench/mpi_side_by_side.sh (the same program over each transport in one run).
//   latency   half the round trip of a blocking Send/Recv ping-pong, median of 7 batches
//   bandwidth rank 0 sends a window of 16 Isends of the size to rank 1, which answers each
//             window with 1 byte; bytes moved / time, median of 5 batches
// Prints one line per size: "size=<bytes> lat_us=<median> bw_MBps=<median>" (bw only for
// sizes >= 4 KiB). Sizes are fixed: 8 B, 1 KiB, 4 KiB, 64 KiB, 1 MiB.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static double latency_us(char* buf, int size, int rank, int iters) {
  double batch[7];
  for (int b = 0; b < 7; ++b) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      if (rank == 0) {
        MPI_Send(buf, size, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(buf, size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf, size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, size, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
      }
    }
    batch[b] = (MPI_Wtime() - t0) * 1e6 / iters / 2;
  }
  return median(batch, 7);
}

static double bandwidth_mbps(char* buf, int size, int rank, int windows) {
  enum { kWindow = 16 };
  MPI_Request req[kWindow];
  double batch[5];
  char ack = 0;
  for (int b = 0; b < 5; ++b) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int w = 0; w < windows; ++w) {
      if (rank == 0) {
        for (int i = 0; i < kWindow; ++i)
          MPI_Isend(buf + (size_t)i * size, size, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &req[i]);
        MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
        MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        for (int i = 0; i < kWindow; ++i)
          MPI_Irecv(buf + (size_t)i * size, size, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &req[i]);
        MPI_Waitall(kWindow, req, MPI_STATUSES_IGNORE);
        MPI_Send(&ack, 1, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
      }
    }
    const double s = MPI_Wtime() - t0;
    batch[b] = (double)size * kWindow * windows / s / 1e6;
  }
  return median(batch, 5);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "mpi_pingpong: run with 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  static const int kSizes[] = {8, 1024, 4096, 65536, 1 << 20};
  char* buf = malloc((size_t)16 << 20);
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 2);
  memset(buf, 1, (size_t)16 << 20);
  for (size_t k = 0; k < sizeof kSizes / sizeof kSizes[0]; ++k) {
    const int s = kSizes[k];
    const int iters = s >= 65536 ? 50 : 500;
    latency_us(buf, s, rank, iters / 10);  // warm-up: connections, registrations
    const double lat = latency_us(buf, s, rank, iters);
    double bw = 0;
    if (s >= 4096) bw = bandwidth_mbps(buf, s, rank, s >= 65536 ? 8 : 64);
    if (rank == 0) {
      if (s >= 4096) printf("size=%d lat_us=%.2f bw_MBps=%.1f\n", s, lat, bw);
      else printf("size=%d lat_us=%.2f\n", s, lat);
      fflush(stdout);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
