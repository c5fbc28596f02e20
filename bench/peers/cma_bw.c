/*
 * cma_bw: cross-memory attach bandwidth (process_vm_writev into another
 * process) beside one thread's memcpy, by the kind of page on each side.
 *
 *   cma_bw MIB PAGES      MIB 1-1024; PAGES: 0 both on 4 KiB pages, 1 huge source,
 *                                2 huge target, 3 both huge
 *
 * Single-copy transports (gradwire's shm, libfabric's shm provider, MPI's
 * vader) move large messages this way; the kernel pins the target's pages
 * one by one, which is what huge pages make cheaper (docs/performance.md,
 * "One-sided rounds and writes"). Each side is timed for about 0.5 s and
 * printed as: cma bytes=B pages=P cma_gbps=X memcpy_gbps=Y
 * GB = 1e9 bytes; the rate counts the bytes copied.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* MIB MiB in whole aligned 2 MiB units, advised onto huge pages if asked. */
static char *buffer(size_t bytes, int huge) {
    size_t unit = (size_t)2 << 20, len = (bytes + unit - 1) / unit * unit;
    void *p = NULL;
    if (posix_memalign(&p, unit, len)) return NULL;
    if (huge && madvise(p, len, MADV_HUGEPAGE)) {
        perror("cma_bw: madvise(MADV_HUGEPAGE)");
        exit(1);
    }
    return p;
}

/* A whole number in [lo, hi], or -1. */
static long number(const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= lo && v <= hi) ? v : -1;
}

int main(int argc, char **argv) {
    /* process_vm_writev moves at most about 2 GiB per call. */
    long mib = argc == 3 ? number(argv[1], 1, 1024) : -1;
    long pages = argc == 3 ? number(argv[2], 0, 3) : -1;
    if (mib < 0 || pages < 0) {
        fprintf(stderr, "usage: cma_bw MIB(1-1024) PAGES(0-3)\n");
        return 2;
    }
    size_t bytes = (size_t)mib << 20;
    char *src = buffer(bytes, pages & 1), *dst = buffer(bytes, pages & 2);
    char *local = buffer(bytes, pages & 2);
    if (!src || !dst || !local) {
        fprintf(stderr, "cma_bw: cannot allocate 3 x %zu bytes\n", bytes);
        return 1;
    }
    memset(src, 1, bytes);
    memset(local, 3, bytes);
    int ready[2];
    if (pipe(ready)) {
        perror("cma_bw: pipe");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("cma_bw: fork");
        return 1;
    }
    if (child == 0) {
        /* The target: fault its own copy of dst in, then wait to be killed
         * (also if the parent dies first). */
        close(ready[0]);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() == 1) _exit(1);
        memset(dst, 2, bytes);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]); /* so that a target that dies early ends the read */
    char c;
    if (read(ready[0], &c, 1) != 1) {
        fprintf(stderr, "cma_bw: the target process died\n");
        return 1;
    }
    struct iovec from = {src, bytes}, to = {dst, bytes};
    double spent = 0, t0 = now();
    long n = 0;
    while (now() - t0 < 0.5) {
        double a = now();
        ssize_t moved = process_vm_writev(child, &from, 1, &to, 1, 0);
        if (moved != (ssize_t)bytes) {
            if (moved < 0)
                perror("cma_bw: process_vm_writev");
            else
                fprintf(stderr, "cma_bw: process_vm_writev moved %zd of %zu bytes\n", moved, bytes);
            kill(child, SIGKILL);
            return 1;
        }
        spent += now() - a;
        n++;
    }
    double m_spent = 0;
    long m = 0;
    t0 = now();
    while (now() - t0 < 0.5) {
        double a = now();
        memcpy(local, src, bytes);
        m_spent += now() - a;
        m++;
        src[(size_t)m * 4096 % bytes] = (char)m;
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    printf("cma bytes=%zu pages=%ld cma_gbps=%.3f memcpy_gbps=%.3f sink=%d\n", bytes, pages,
           (double)bytes * (double)n / spent / 1e9, (double)bytes * (double)m / m_spent / 1e9,
           local[bytes / 2]);
    return 0;
}
