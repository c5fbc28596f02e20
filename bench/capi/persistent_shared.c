/*
 * persistent_shared: the ordinary all-reduce against the persistent one,
 * on the program's buffers and on buffers the library allocates, through
 * gradwire's C ABI. It is written apart from gwbench (allreduce -P 0,
 * -P 1 and -P 1 --shared 1, as scripts/persistent-vs-ordinary.sh runs it)
 * so that a claim made with gwbench can be checked by a second program
 * that shares none of its code. scripts/persistent-shared-capi.sh runs it
 * and summarises.
 *
 *   gwrun -n N ./persistent_shared [-b MIN] [-e MAX] [-T SECONDS] [-r ROUNDS]
 *                                  [-w 0|1]
 *   (defaults: 1K to 16M bytes by factors of 4, loops of 0.2 s, 5 rounds)
 *
 * With -w 1 every step first rewrites its send buffer (a memcpy from a
 * private copy of the input, inside the timed loop, for every mode), as a
 * backward pass rewrites the gradients each step: the peers then read
 * lines another core just wrote, not lines every cache already holds.
 *
 * Three modes all-reduce (float32 sum, out of place) the same buffer each
 * step:
 *   ord     gwAllReduce on posix_memalign'd buffers;
 *   pers    gwAllReduceInit on such buffers, then gwStart + gwWait;
 *   shared  gwAllReduceInitShared (the library's buffers), gwStart + gwWait.
 * For each round and size the modes run ord, pers, shared in odd rounds
 * and the reverse in even ones, so that a drift in the machine's speed
 * falls on every mode alike. Each mode makes its buffers and request, fills
 * the input with small integers (exact sums), runs 20 untimed steps, then
 * steps sized by time (a trial, scaled to SECONDS, at least 10, the
 * largest count of any rank so that all run the same), the time being the
 * slowest rank's mean per step; then it checks every element of the last
 * result and frees everything. Rank 0 prints, per round, size and mode:
 *
 *   gradwire mode=M bytes=B ranks=N round=R iters=I time_us=T wrong=W
 *
 * and every rank exits 1 if any element was wrong on any rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradwire.h"

enum mode { ORD, PERS, SHARED };
static const char *NAMES[] = {"ord", "pers", "shared"};

#define WARMUP 20
#define MIN_ITERS 10

static gwComm_t comm;
static int rank, size;
/* -w 1: each step rewrites its send buffer first. */
static int rewrite;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(gwResult_t r, const char *what) {
    if (r != gwSuccess) {
        fprintf(stderr, "persistent_shared: rank %d: %s failed: %s\n", rank, what,
                gwGetLastError(comm));
        exit(1);
    }
}

/* One all-reduce over doubles: how ranks agree on times, counts, errors. */
static double across(double x, gwRedOp_t op) {
    check(gwAllReduce(&x, &x, 1, gwFloat64, op, comm), "gwAllReduce (float64)");
    return x;
}

/* A mode's buffers and, for the persistent modes, its request. */
struct run {
    enum mode m;
    size_t count;
    float *send, *recv;
    /* The input, kept apart for -w 1's rewrites. */
    float *src;
    gwRequest_t req;
};

static void setup(struct run *r) {
    void *s = NULL, *d = NULL;
    r->req = NULL;
    if (r->m == SHARED) {
        check(gwAllReduceInitShared(r->count, gwFloat32, gwSum, 0, comm, &s, &d, &r->req),
              "gwAllReduceInitShared");
    } else {
        /* 64 bytes, as the shared mode's buffers are aligned: alignment
         * must not be what differs between the modes. */
        if (posix_memalign(&s, 64, r->count * sizeof(float)) != 0 ||
            posix_memalign(&d, 64, r->count * sizeof(float)) != 0) {
            fprintf(stderr, "persistent_shared: rank %d: out of memory\n", rank);
            exit(1);
        }
    }
    r->send = s;
    r->recv = d;
    void *c = NULL;
    if (posix_memalign(&c, 64, r->count * sizeof(float)) != 0) {
        fprintf(stderr, "persistent_shared: rank %d: out of memory\n", rank);
        exit(1);
    }
    r->src = c;
}

/* After the buffers are filled: the persistent request registers them. */
static void plan(struct run *r) {
    if (r->m == PERS)
        check(gwAllReduceInit(r->send, r->recv, r->count, gwFloat32, gwSum, comm, &r->req),
              "gwAllReduceInit");
}

static void teardown(struct run *r) {
    if (r->req)
        check(gwRequestFree(r->req), "gwRequestFree");
    free(r->src);
    /* The shared mode's buffers went with its request. */
    if (r->m != SHARED) {
        free(r->send);
        free(r->recv);
    }
}

static void step(struct run *r) {
    if (rewrite)
        memcpy(r->send, r->src, r->count * sizeof(float));
    if (r->m == ORD) {
        check(gwAllReduce(r->send, r->recv, r->count, gwFloat32, gwSum, comm), "gwAllReduce");
    } else {
        check(gwStart(r->req), "gwStart");
        check(gwWait(r->req, -1), "gwWait");
    }
}

/* This rank's seconds for `iters` steps, started together. */
static double loop(struct run *r, long iters) {
    check(gwBarrier(comm), "gwBarrier");
    double t0 = now();
    for (long i = 0; i < iters; i++)
        step(r);
    return now() - t0;
}

/* Element i's input on rank q: small integers, so that every sum is exact
 * in float32, that differ by rank (a rank counted twice or missed shows),
 * by element (a misplaced block shows) and by round (a stale result from an
 * earlier round shows). Its value depends on i only through (i*3+round)%5. */
static float input(int q, size_t i, int round) {
    return (float)(((long)q * 7 + (long)(i % 5) * 3 + round) % 5);
}

/* Steps, elements wrong (all ranks), mean seconds per step (slowest rank). */
static void measure(enum mode m, size_t count, int round, double seconds, long *iters_out,
                    double *wrong_out, double *secs_out) {
    struct run r = {.m = m, .count = count};
    setup(&r);
    /* Written once, before the warm-up, as for every mode: the shared
     * mode's send buffer is the library's, and each round reads it again. */
    for (size_t i = 0; i < count; i++) {
        r.send[i] = input(rank, i, round);
        r.src[i] = r.send[i];
        /* A result no sum gives, so that a step that writes nothing shows. */
        r.recv[i] = -1.0f;
    }
    plan(&r);
    for (int i = 0; i < WARMUP; i++)
        step(&r);

    /* Trial: from 10 steps, four times more while the slowest rank's trial
     * is under a tenth of the target, so that one preemption in a trial of
     * a few microseconds does not size the loop. The slowest rank's time
     * decides, so every rank takes the same branch. */
    long trial = MIN_ITERS;
    double took;
    for (;;) {
        took = loop(&r, trial);
        if (across(took, gwMax) >= seconds / 10 || trial >= (1L << 30))
            break;
        trial *= 4;
    }
    double per = took / (double)trial;
    double want = seconds / (per > 0 ? per : 1e-9);
    if (want < MIN_ITERS)
        want = MIN_ITERS;
    if (want > 1e12)
        want = 1e12;
    /* Every rank must run as many steps as the others (each is a
     * collective): the largest estimate wins. */
    long iters = (long)across((double)(long)want, gwMax);

    double secs = across(loop(&r, iters) / (double)iters, gwMax);

    /* The checked step gets an input no earlier step had (round + 1) and
     * a poisoned result, so a step that computes nothing, or repeats an
     * earlier result, shows; with -w 1 it goes through the rewrite. */
    round += 1;
    for (size_t i = 0; i < count; i++) {
        r.src[i] = input(rank, i, round);
        if (!rewrite)
            r.send[i] = r.src[i];
        r.recv[i] = -1.0f;
    }
    step(&r);

    /* The expected sum of element i depends on k = (i*3+round)%5 only. */
    float sum[5];
    for (int k = 0; k < 5; k++) {
        long s = 0;
        for (int q = 0; q < size; q++)
            s += ((long)q * 7 + k) % 5;
        sum[k] = (float)s;
    }
    long wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (r.recv[i] != sum[(i % 5 * 3 + round) % 5])
            wrong++;
    *wrong_out = across((double)wrong, gwSum);
    teardown(&r);
    *iters_out = iters;
    *secs_out = secs;
}

/* Bytes, with an optional K or M suffix (powers of 1024). */
static long bytes_arg(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v <= 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    return *end == '\0' ? v : -1;
}

int main(int argc, char **argv) {
    double seconds = 0.2;
    int rounds = 5;
    long min = 1L << 10, max = 16L << 20;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && strcmp(argv[i], "-T") == 0 && atof(v) > 0)
            seconds = atof(v);
        else if (v && strcmp(argv[i], "-r") == 0 && atoi(v) > 0)
            rounds = atoi(v);
        else if (v && strcmp(argv[i], "-b") == 0 && bytes_arg(v) >= 4)
            min = bytes_arg(v);
        else if (v && strcmp(argv[i], "-e") == 0 && bytes_arg(v) >= 4)
            max = bytes_arg(v);
        else if (v && strcmp(argv[i], "-w") == 0 && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0))
            rewrite = atoi(v);
        else {
            fprintf(stderr,
                    "usage: gwrun -n N %s [-b MIN] [-e MAX] [-T SECONDS] [-r ROUNDS] [-w 0|1]\n"
                    "  (bytes with K or M, defaults 1K and 16M; 0.2 s; 5 rounds; -w 1: each\n"
                    "  step rewrites its send buffer first)\n",
                    argv[0]);
            return 2;
        }
        i++;
    }
    check(gwCommInitFromEnv(&comm), "gwCommInitFromEnv");
    check(gwCommRank(comm, &rank), "gwCommRank");
    check(gwCommCount(comm, &size), "gwCommCount");
    static const enum mode ODD[] = {ORD, PERS, SHARED}, EVEN[] = {SHARED, PERS, ORD};
    double bad = 0;
    for (int round = 1; round <= rounds; round++) {
        for (long bytes = min; bytes <= max; bytes *= 4) {
            for (int j = 0; j < 3; j++) {
                enum mode m = round % 2 ? ODD[j] : EVEN[j];
                long iters;
                double wrong, secs;
                measure(m, (size_t)bytes / sizeof(float), round, seconds, &iters, &wrong, &secs);
                bad += wrong;
                if (rank == 0) {
                    printf("gradwire mode=%s bytes=%ld ranks=%d round=%d iters=%ld time_us=%.3f "
                           "wrong=%.0f\n",
                           NAMES[m], bytes, size, round, iters, secs * 1e6, wrong);
                    /* Lines go through gwrun's pipe: show each as it comes. */
                    fflush(stdout);
                }
            }
        }
    }
    check(gwCommDestroy(comm), "gwCommDestroy");
    return bad > 0;
}
