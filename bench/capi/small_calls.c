/*
 * small_calls: the per-call cost of small collectives through gradwire's
 * C ABI, the path C programs, the numpy binding and the PyTorch backend
 * take (gwbench times the Rust API, which skips it). Its twin for MPI is
 * bench/peers/mpi_small_calls.c; scripts/small-calls.sh runs both.
 *
 *   gwrun -n N ./small_calls [-T SECONDS]
 *
 * For each of a barrier, an 8-byte float32 sum all-reduce and an 8-byte
 * broadcast from rank 0: 1000 untimed calls, then calls sized by time (a
 * trial of 1000, scaled to SECONDS, at least 1000, the slowest rank's
 * count), the time being the slowest rank's mean per call. The last
 * all-reduce and broadcast are checked. Rank 0 prints, per call:
 *
 *   gradwire coll=C bytes=B ranks=N iters=I time_us=T wrong=W
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradwire.h"

enum coll { BARRIER, ALLREDUCE, BROADCAST };
static const char *NAMES[] = {"barrier", "allreduce", "broadcast"};

static gwComm_t comm;
static int rank, size;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(gwResult_t r, const char *what) {
    if (r != gwSuccess) {
        fprintf(stderr, "small_calls: rank %d: %s failed: %s\n", rank, what,
                gwGetLastError(comm));
        exit(1);
    }
}

static void call(enum coll c, float *send, float *recv) {
    switch (c) {
    case BARRIER:
        check(gwBarrier(comm), "gwBarrier");
        break;
    case ALLREDUCE:
        check(gwAllReduce(send, recv, 2, gwFloat32, gwSum, comm), "gwAllReduce");
        break;
    case BROADCAST:
        check(gwBroadcast(send, recv, 2, gwFloat32, 0, comm), "gwBroadcast");
        break;
    }
}

static double slowest(double x) {
    check(gwAllReduce(&x, &x, 1, gwFloat64, gwMax, comm), "gwAllReduce (max)");
    return x;
}

/* Mean seconds per call over `iters` calls, the slowest rank's. */
static double timed(enum coll c, long iters, float *send, float *recv) {
    check(gwBarrier(comm), "gwBarrier");
    double t0 = now();
    for (long i = 0; i < iters; i++)
        call(c, send, recv);
    return slowest((now() - t0) / (double)iters);
}

int main(int argc, char **argv) {
    double seconds = 0.2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-T") == 0 && i + 1 < argc && atof(argv[i + 1]) > 0)
            seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: gwrun -n N %s [-T SECONDS]\n", argv[0]);
            return 2;
        }
    }
    check(gwCommInitFromEnv(&comm), "gwCommInitFromEnv");
    check(gwCommRank(comm, &rank), "gwCommRank");
    check(gwCommCount(comm, &size), "gwCommCount");
    for (enum coll c = BARRIER; c <= BROADCAST; c++) {
        float send[2] = {(float)rank + 1, 2.0f * (float)rank}, recv[2] = {0, 0};
        for (int i = 0; i < 1000; i++)
            call(c, send, recv);
        double trial = timed(c, 1000, send, recv);
        long iters = (long)(seconds / (trial > 0 ? trial : 1e-9));
        if (iters < 1000)
            iters = 1000;
        double us = timed(c, iters, send, recv) * 1e6;
        int wrong = 0;
        if (c == ALLREDUCE) {
            /* Sums of small integers: exact in float32. */
            float want0 = (float)size * (size + 1) / 2, want1 = (float)size * (size - 1);
            wrong = recv[0] != want0 || recv[1] != want1;
        } else if (c == BROADCAST) {
            wrong = rank == 0 ? 0 : recv[0] != 1.0f || recv[1] != 0.0f;
        }
        double w = slowest((double)wrong);
        if (rank == 0)
            printf("gradwire coll=%s bytes=%d ranks=%d iters=%ld time_us=%.3f wrong=%d\n", NAMES[c],
                   c == BARRIER ? 0 : 8, size, iters, us, (int)w);
    }
    check(gwCommDestroy(comm), "gwCommDestroy");
    return 0;
}
