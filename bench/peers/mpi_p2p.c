/*
 * mpi_p2p: the point-to-point figures `gwbench p2p` prints, measured the
 * same way over any MPI, for scripts/compare-collectives.py. Built with
 * any MPI (OpenMPI's mpicc.openmpi, MPICH's mpicc.mpich); exactly 2 ranks.
 *
 *   mpirun -n 2 ./mpi_p2p [-T SECONDS] SIZE:ITERS:WARMUP [...]
 *
 * Per size, as gwbench p2p does:
 * - latency: ping-pong (rank 0 sends, rank 1 echoes, MPI_Send/MPI_Recv),
 *   half the mean round trip as rank 0 measures it;
 * - one-way bandwidth: after a one-byte round trip, rank 0 sends ITERS
 *   messages in windows of WINDOW (MPI_Isend each, then MPI_Waitall),
 *   rank 1 receives them likewise and answers with one byte; rank 0's time
 *   from the start to that byte;
 * - bidirectional bandwidth: both ranks send and receive ITERS messages at
 *   once, in windows of WINDOW; bytes both ways over the slower rank's time.
 * Each loop first runs WARMUP times untimed. With -T each loop's count is
 * sized by time as gwbench -T does: 1, 2, 4, ... until a loop lasts a tenth
 * of SECONDS on the slower rank, scaled to SECONDS, at least ITERS. Then one
 * exchange of a known pattern is checked byte by byte on both ranks. Rank 0
 * prints:
 *
 *   mpi coll=p2p size=BYTES ranks=2 lat_us=T bw=GB/s bibw=GB/s iters=L,B,D wrong=W
 *
 * with GB = 1e9 bytes and L, B, D the three loops' counts.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages in flight at once in the bandwidth loops (osu_bw's window). */
#define WINDOW 64

static void die(const char *msg) {
    fprintf(stderr, "mpi_p2p: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* gwbench's pattern (bench/src/p2p.rs): never 0xff, different per rank. */
static unsigned char pattern(int src, size_t size, size_t i) {
    return (unsigned char)(((size_t)src * 131 + i * 7 + size) % 251);
}

struct pair {
    int me, peer;
    unsigned char *send, *recv;
    MPI_Request req[2 * WINDOW];
};

static double slowest(double mine) {
    double max = 0;
    MPI_Allreduce(&mine, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return max;
}

/* A one-byte round trip, so that both ranks start the next loop together. */
static void sync_pair(struct pair *p) {
    unsigned char one = 1, got = 0;
    if (p->me == 0) {
        MPI_Send(&one, 1, MPI_BYTE, p->peer, 1, MPI_COMM_WORLD);
        MPI_Recv(&got, 1, MPI_BYTE, p->peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&got, 1, MPI_BYTE, p->peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(&one, 1, MPI_BYTE, p->peer, 1, MPI_COMM_WORLD);
    }
}

/* Seconds this rank spent on `k` round trips of `size` bytes. */
static double pingpong(struct pair *p, size_t size, long k) {
    sync_pair(p);
    double t0 = MPI_Wtime();
    for (long i = 0; i < k; i++) {
        if (p->me == 0) {
            MPI_Send(p->send, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD);
            MPI_Recv(p->recv, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(p->recv, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(p->send, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

/* Posts `k` messages in windows: sends (`out`), receives (`in`), or both. */
static void windows(struct pair *p, size_t size, long k, int out, int in) {
    for (long done = 0; done < k;) {
        int w = (k - done) < WINDOW ? (int)(k - done) : WINDOW, r = 0;
        for (int i = 0; i < w; i++) {
            if (in) MPI_Irecv(p->recv, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, &p->req[r++]);
            if (out) MPI_Isend(p->send, (int)size, MPI_BYTE, p->peer, 0, MPI_COMM_WORLD, &p->req[r++]);
        }
        MPI_Waitall(r, p->req, MPI_STATUSES_IGNORE);
        done += w;
    }
}

/* Rank 0's seconds for `k` one-way messages and the one-byte answer. */
static double stream(struct pair *p, size_t size, long k) {
    unsigned char one = 1, got = 0;
    sync_pair(p);
    double t0 = MPI_Wtime();
    if (p->me == 0) {
        windows(p, size, k, 1, 0);
        MPI_Recv(&got, 1, MPI_BYTE, p->peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        windows(p, size, k, 0, 1);
        MPI_Send(&one, 1, MPI_BYTE, p->peer, 2, MPI_COMM_WORLD);
    }
    return MPI_Wtime() - t0;
}

static double both_ways(struct pair *p, size_t size, long k) {
    sync_pair(p);
    double t0 = MPI_Wtime();
    windows(p, size, k, 1, 1);
    return MPI_Wtime() - t0;
}

typedef double (*loop_fn)(struct pair *, size_t, long);

/* -T: the count whose loop lasts about `target` s on the slower rank. */
static long iters_for(loop_fn f, struct pair *p, size_t size, double target, long least) {
    const long most = 1L << 27;
    for (long k = 1;; k *= 2) {
        double t = slowest(f(p, size, k));
        if (t >= target / 10.0 || k >= most) {
            double want = ceil((double)k * target / (t > 1e-9 ? t : 1e-9));
            long got = want > (double)most ? most : (long)want;
            return got < least ? least : got;
        }
    }
}

static long check(struct pair *p, size_t size) {
    for (size_t i = 0; i < size; i++) p->send[i] = pattern(p->me, size, i);
    memset(p->recv, 0xff, size);
    MPI_Sendrecv(p->send, (int)size, MPI_BYTE, p->peer, 3, p->recv, (int)size, MPI_BYTE, p->peer, 3,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    long w = 0;
    for (size_t i = 0; i < size; i++) w += p->recv[i] != pattern(p->peer, size, i);
    return w;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int n;
    struct pair p;
    MPI_Comm_rank(MPI_COMM_WORLD, &p.me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n != 2) die("run it on exactly 2 ranks");
    p.peer = 1 - p.me;
    if (argc < 2) die("usage: mpi_p2p [-T SECONDS] SIZE:ITERS:WARMUP ...");
    int first = 1;
    double target = 0;
    if (strcmp(argv[1], "-T") == 0) {
        char *end = NULL;
        if (argc < 4) die("-T needs SECONDS and at least one SIZE:ITERS:WARMUP");
        target = strtod(argv[2], &end);
        if (end == argv[2] || *end || !(target > 0) || target > 3600) die("-T SECONDS must be in (0, 3600]");
        first = 3;
    }
    size_t max = 1;
    for (int a = first; a < argc; a++) {
        unsigned long long size = 0;
        long iters = 0, warmup = 0;
        if (sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup) != 3 || iters < 1 || warmup < 0 ||
            size > (1ULL << 30))
            die("bad argument (want SIZE:ITERS:WARMUP, SIZE at most 1 GiB)");
        if (size > max) max = size;
    }
    p.send = malloc(max);
    p.recv = malloc(max);
    if (!p.send || !p.recv) die("cannot allocate the buffers");
    /* Touch every page once, as gwbench does, so page faults are not timed. */
    memset(p.recv, 0, max);
    for (int a = first; a < argc; a++) {
        unsigned long long size;
        long iters, warmup;
        sscanf(argv[a], "%llu:%ld:%ld", &size, &iters, &warmup);
        size_t s = (size_t)size;
        for (size_t i = 0; i < s; i++) p.send[i] = pattern(p.me, s, i);
        loop_fn loops[3] = {pingpong, stream, both_ways};
        long count[3];
        double secs[3];
        for (int l = 0; l < 3; l++) {
            if (warmup > 0) loops[l](&p, s, warmup);
            count[l] = target > 0 ? iters_for(loops[l], &p, s, target, iters) : iters;
            secs[l] = loops[l](&p, s, count[l]);
        }
        /* Rank 0's latency and one-way time, as gwbench reports them; the
         * slower rank's time both ways. */
        double bidir = slowest(secs[2]);
        long mine = check(&p, s), wrong = 0;
        MPI_Reduce(&mine, &wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (p.me == 0) {
            double lat = secs[0] / (double)count[0] / 2.0;
            double bw = (double)s * (double)count[1] / secs[1] / 1e9;
            double bibw = 2.0 * (double)s * (double)count[2] / bidir / 1e9;
            printf("mpi coll=p2p size=%zu ranks=2 lat_us=%.3f bw=%.6g bibw=%.6g iters=%ld,%ld,%ld wrong=%ld\n", s,
                   lat * 1e6, bw, bibw, count[0], count[1], count[2], wrong);
            fflush(stdout);
        }
    }
    free(p.send);
    free(p.recv);
    MPI_Finalize();
    return 0;
}
