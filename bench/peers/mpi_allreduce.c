/*
 * mpi_allreduce: float32 sum all-reduce timed as nccl-tests (and gwbench) do,
 * for scripts/compare-peers.sh.
 *
 *   mpirun -n N ./mpi_allreduce SIZE:ITERS:WARMUP [SIZE:ITERS:WARMUP ...]
 *
 * SIZE is in bytes (a multiple of 4, or 4 is used for smaller sizes). For
 * each size: fill the buffers, run WARMUP untimed calls, barrier, run ITERS
 * timed calls out of place (separate send and receive buffers, as gwbench's
 * out-of-place column); the time is the mean per call, the largest over
 * ranks. One check call afterwards compares the result with the exact sum.
 * Rank 0 prints one line per size:
 *
 *   mpi size=BYTES ranks=N iters=I time_us=T algbw=GB/s busbw=GB/s wrong=W
 *
 * with GB = 1e9 bytes, algbw = size / time, busbw = algbw * 2(n-1)/n.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg) {
    fprintf(stderr, "mpi_allreduce: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 2) die("usage: mpi_allreduce SIZE:ITERS:WARMUP ...");

    size_t max_count = 1;
    for (int a = 1; a < argc; a++) {
        unsigned long long size = 0;
        long iters = 0, warmup = 0;
        if (sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup) != 3 || iters < 1 || warmup < 0)
            die("bad argument (want SIZE:ITERS:WARMUP)");
        size_t count = size / sizeof(float) ? size / sizeof(float) : 1;
        if (count > max_count) max_count = count;
    }
    float *send = malloc(max_count * sizeof(float));
    float *recv = malloc(max_count * sizeof(float));
    if (!send || !recv) die("cannot allocate the buffers");
    /* Touch every page once, as gwbench does, so page faults are not timed. */
    memset(send, 0, max_count * sizeof(float));
    memset(recv, 0, max_count * sizeof(float));

    for (int a = 1; a < argc; a++) {
        unsigned long long size;
        long iters, warmup;
        sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup);
        size_t count = size / sizeof(float) ? size / sizeof(float) : 1;
        size_t bytes = count * sizeof(float);
        /* Small integers: every partial sum is exact in float32. */
        for (size_t i = 0; i < count; i++) send[i] = (float)((rank + 1) + (int)(i % 7));

        for (long i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / (double)iters, slowest = 0;
        MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

        memset(recv, 0xff, bytes);
        MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long wrong = 0, total = 0;
        for (size_t i = 0; i < count; i++) {
            float want = (float)(n * (n + 1) / 2 + n * (int)(i % 7));
            if (recv[i] != want) wrong++;
        }
        MPI_Reduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            double algbw = (double)bytes / slowest / 1e9;
            double busbw = algbw * 2.0 * (n - 1) / n;
            printf("mpi size=%zu ranks=%d iters=%ld time_us=%.3f algbw=%.6g busbw=%.6g wrong=%ld\n",
                   bytes, n, iters, slowest * 1e6, algbw, busbw, total);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
