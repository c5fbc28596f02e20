/*
 * memcpy_bw: one thread's memcpy bandwidth, the shared-memory ceiling of
 * scripts/compare-peers.sh.
 *
 *   memcpy_bw [MIB [REPS [HUGE]]]      (defaults: 256 MiB, 9 repetitions, 0)
 *
 * Copies a MIB-MiB buffer into another (both prefaulted) after one warm-up
 * copy, REPS samples of at least 5 ms of copies each, and prints their
 * median:  memcpy bytes=B reps=R gbps=X
 * With HUGE 1 both buffers are advised onto transparent huge pages, as
 * `gwbench --hugepages 1` advises its own, so that a one-sided write and
 * this copy are compared on the same kind of memory.
 * GB = 1e9 bytes; the rate counts the bytes copied (each read once and
 * written once), as a copy-based transport moves them.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    int huge = argc > 3 ? atoi(argv[3]) : 0;
    if (mib == 0 || mib > 65536 || reps < 1 || reps > 1000 || (huge != 0 && huge != 1)) {
        fprintf(stderr, "usage: memcpy_bw [MIB [REPS [HUGE 0|1]]]\n");
        return 2;
    }
    size_t bytes = mib << 20;
    char *src = NULL, *dst = NULL;
    if (huge) {
        /* Whole aligned 2 MiB units, as gwbench --hugepages 1 allocates: a
         * 1 MiB buffer could otherwise get no huge page at all. */
        size_t two_mib = (size_t)2 << 20, whole = (bytes + two_mib - 1) / two_mib * two_mib;
        if (posix_memalign((void **)&src, two_mib, whole) || posix_memalign((void **)&dst, two_mib, whole))
            src = dst = NULL;
        else if (madvise(src, whole, MADV_HUGEPAGE) || madvise(dst, whole, MADV_HUGEPAGE)) {
            perror("memcpy_bw: madvise(MADV_HUGEPAGE)");
            return 1;
        }
    } else {
        src = malloc(bytes);
        dst = malloc(bytes);
    }
    if (!src || !dst) {
        fprintf(stderr, "memcpy_bw: cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
    memset(src, 1, bytes); /* prefault both */
    memset(dst, 2, bytes);
    memcpy(dst, src, bytes); /* warm-up */
    double *rate = malloc(sizeof(double) * (size_t)reps);
    unsigned sink = 0;
    /* Each sample copies for at least 5 ms: a single 1 MiB copy takes
     * about 25 us, too short to time alone on a shared machine (its
     * median moved 1.6x between runs). */
    for (int r = 0; r < reps; r++) {
        long k = 0;
        double t0 = now(), dt;
        do {
            src[(size_t)(r + k) * 4096 % bytes] = (char)(r + k);
            memcpy(dst, src, bytes);
            sink += (unsigned char)dst[(size_t)(r + k) * 4096 % bytes];
            k++;
            dt = now() - t0;
        } while (dt < 5e-3);
        rate[r] = (double)bytes * (double)k / dt / 1e9;
    }
    qsort(rate, (size_t)reps, sizeof(double), cmp);
    printf("memcpy bytes=%zu reps=%d gbps=%.4f min=%.4f max=%.4f sink=%u huge=%d\n", bytes, reps,
           rate[reps / 2], rate[0], rate[reps - 1], sink, huge);
    return 0;
}
