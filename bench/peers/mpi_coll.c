/*
 * mpi_coll: every collective gwbench measures, timed as nccl-tests (and
 * gwbench) do, for scripts/compare-collectives.sh. Built with any MPI
 * (OpenMPI's mpicc.openmpi, MPICH's mpicc.mpich).
 *
 *   mpirun -n N ./mpi_coll COLL [-T SECONDS] SIZE:ITERS:WARMUP [...]
 *
 * COLL is allreduce, reduce_scatter, allgather, broadcast or reduce, on
 * float32 with sum (root 0 where there is one). SIZE is nccl-tests' size in
 * bytes: the buffer of allreduce, broadcast and reduce, the whole (all
 * ranks') buffer of reduce_scatter and allgather, whose per-rank blocks are
 * rounded down to whole 16-byte units as gwbench's are. For each size: WARMUP untimed calls, a barrier, then
 * ITERS timed calls out of place; with -T the count is sized by time
 * instead, as gwbench -T does: 1, 2, 4, ... calls until a batch lasts a
 * tenth of SECONDS on the slowest rank, scaled to SECONDS, at least ITERS.
 * The time is the mean per call of the slowest rank. One more call is then
 * checked against the exact result on every rank. Rank 0 prints:
 *
 *   mpi coll=C size=BYTES ranks=N iters=I time_us=T algbw=GB/s busbw=GB/s wrong=W
 *
 * GB = 1e9 bytes, algbw = size / time, busbw = algbw * 2(n-1)/n for
 * allreduce, (n-1)/n for reduce_scatter and allgather, 1 for broadcast and
 * reduce (nccl-tests' definitions).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, REDUCE };

static const char *NAMES[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"};

static void die(const char *msg) {
    fprintf(stderr, "mpi_coll: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* Small integers: every partial sum is exact in float32. */
static float input(int rank, size_t i) { return (float)((rank + 1) + (int)(i % 7)); }

static float reduced(int n, size_t i) { return (float)(n * (n + 1) / 2 + n * (int)(i % 7)); }

struct bufs {
    float *send, *recv;
    size_t count; /* elements per rank's block (see the module comment) */
};

static void call(enum coll c, struct bufs *b, int n) {
    int k = (int)b->count;
    switch (c) {
    case ALLREDUCE: MPI_Allreduce(b->send, b->recv, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(b->send, b->recv, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(b->send, k, MPI_FLOAT, b->recv, k, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case BROADCAST: MPI_Bcast(b->send, k, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    case REDUCE: MPI_Reduce(b->send, b->recv, k, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    }
    (void)n;
}

/* The input of `rank` for collective `c`: what its send buffer holds. */
static void fill(enum coll c, struct bufs *b, int rank, int n) {
    size_t total = (c == REDUCE_SCATTER) ? b->count * (size_t)n : b->count;
    size_t at = (c == ALLGATHER) ? b->count * (size_t)rank : 0;
    for (size_t i = 0; i < total; i++) b->send[i] = input(rank, at + i);
}

/* Elements of this rank's result that differ from the exact one. */
static long wrong(enum coll c, struct bufs *b, int rank, int n) {
    long w = 0;
    size_t k = b->count;
    switch (c) {
    case ALLREDUCE:
    case REDUCE:
        if (c == REDUCE && rank != 0) return 0;
        for (size_t i = 0; i < k; i++) w += b->recv[i] != reduced(n, i);
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < k; i++) w += b->recv[i] != reduced(n, k * (size_t)rank + i);
        break;
    case ALLGATHER:
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < k; i++) w += b->recv[k * (size_t)r + i] != input(r, k * (size_t)r + i);
        break;
    case BROADCAST:
        for (size_t i = 0; i < k; i++) w += b->send[i] != input(0, i);
        break;
    }
    return w;
}

/* Elements per block for SIZE bytes: gwbench's layout (a rank's block of
 * reduce_scatter and allgather in whole 16-byte units), at least one. */
static size_t block(unsigned long long size, int per_rank, int n) {
    size_t elems = size / sizeof(float);
    size_t k = per_rank ? elems / (size_t)n / 4 * 4 : elems;
    return k ? k : 1;
}

static double slowest(double mine) {
    double max = 0;
    MPI_Allreduce(&mine, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return max;
}

static double timed(enum coll c, struct bufs *b, int n, long iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++) call(c, b, n);
    return slowest(MPI_Wtime() - t0);
}

/* -T: the count whose loop lasts about `target` s on the slowest rank. */
static long iters_for(enum coll c, struct bufs *b, int n, double target, long least) {
    const long most = 1L << 27;
    for (long k = 1;; k *= 2) {
        double t = timed(c, b, n, k);
        if (t >= target / 10.0 || k >= most) {
            double want = ceil((double)k * target / (t > 1e-9 ? t : 1e-9));
            long got = want > (double)most ? most : (long)want;
            return got < least ? least : got;
        }
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 3) die("usage: mpi_coll COLL [-T SECONDS] SIZE:ITERS:WARMUP ...");
    int c = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(argv[1], NAMES[i]) == 0) c = i;
    if (c < 0) die("COLL must be allreduce, reduce_scatter, allgather, broadcast or reduce");
    int first = 2;
    double target = 0;
    if (strcmp(argv[2], "-T") == 0) {
        char *end = NULL;
        if (argc < 5) die("-T needs SECONDS and at least one SIZE:ITERS:WARMUP");
        target = strtod(argv[3], &end);
        if (end == argv[3] || *end || !(target > 0) || target > 3600) die("-T SECONDS must be in (0, 3600]");
        first = 4;
    }
    /* Blocks are per rank for reduce_scatter and allgather. */
    int per_rank = (c == REDUCE_SCATTER || c == ALLGATHER);
    size_t max_total = 1;
    for (int a = first; a < argc; a++) {
        unsigned long long size = 0;
        long iters = 0, warmup = 0;
        if (sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup) != 3 || iters < 1 || warmup < 0)
            die("bad argument (want SIZE:ITERS:WARMUP)");
        size_t count = block(size, per_rank, n);
        size_t total = per_rank ? count * (size_t)n : count;
        if (total > max_total) max_total = total;
    }
    struct bufs b = {malloc(max_total * sizeof(float)), malloc(max_total * sizeof(float)), 0};
    if (!b.send || !b.recv) die("cannot allocate the buffers");
    /* Touch every page once, as gwbench does, so page faults are not timed. */
    memset(b.send, 0, max_total * sizeof(float));
    memset(b.recv, 0, max_total * sizeof(float));

    for (int a = first; a < argc; a++) {
        unsigned long long size;
        long iters, warmup;
        sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup);
        b.count = block(size, per_rank, n);
        size_t bytes = (per_rank ? b.count * (size_t)n : b.count) * sizeof(float);
        fill((enum coll)c, &b, rank, n);
        for (long i = 0; i < warmup; i++) call((enum coll)c, &b, n);
        if (target > 0) iters = iters_for((enum coll)c, &b, n, target, iters);
        double per_call = timed((enum coll)c, &b, n, iters) / (double)iters;

        fill((enum coll)c, &b, rank, n);
        if (c == BROADCAST && rank != 0) memset(b.send, 0xff, b.count * sizeof(float));
        memset(b.recv, 0xff, max_total * sizeof(float));
        call((enum coll)c, &b, n);
        long mine = wrong((enum coll)c, &b, rank, n), total = 0;
        MPI_Reduce(&mine, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            double algbw = (double)bytes / per_call / 1e9;
            double factor = c == ALLREDUCE ? 2.0 * (n - 1) / n : per_rank ? (double)(n - 1) / n : 1.0;
            printf("mpi coll=%s size=%zu ranks=%d iters=%ld time_us=%.3f algbw=%.6g busbw=%.6g wrong=%ld\n",
                   NAMES[c], bytes, n, iters, per_call * 1e6, algbw, algbw * factor, total);
            fflush(stdout);
        }
    }
    free(b.send);
    free(b.recv);
    MPI_Finalize();
    return 0;
}
