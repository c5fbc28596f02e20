/*
 * Does a loopback TCP socket that has carried big bursts run later
 * mid-size messages slower, and which socket buffer decides it?
 *
 * Two processes, two sets of L connected sockets. Every exchange sends a
 * message each way, split evenly over one set's sockets (as gradwire
 * stripes a message over its lanes). Set A only ever carries SMALL-byte
 * exchanges; set B also carries twenty BIG-byte exchanges first. Then A
 * and B are timed alternately, ITERS exchanges each, ROUNDS times, and the
 * parent prints B/A per round and the median: above 1, the sockets that
 * carried bulk are slower. Side by side in one run, so the VM's speed
 * switches hit both sets alike.
 *
 * SNDBUF and RCVBUF in the environment set SO_SNDBUF / SO_RCVBUF on every
 * socket (the kernel doubles them); unset, the kernel autotunes.
 *
 *   cc -O2 -o /tmp/send_buffer_state bench/sockets/send_buffer_state.c
 *   /tmp/send_buffer_state 262144 8388608 4 600 7
 *   SNDBUF=262144 RCVBUF=2097152 /tmp/send_buffer_state 262144 8388608 4 600 7
 *
 * Both processes check that the bytes they received last are the ones
 * sent; the parent prints "data ok" when both did. bench/tests/sockets.rs
 * builds and runs it. docs/performance.md ("TCP send buffers") has the
 * figures.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LANES 16
#define MAX_ROUNDS 64
#define BULK_EXCHANGES 20

static int lanes;
static char *sbuf, *rbuf;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Sends m bytes and receives m bytes over the set's sockets, both at once. */
static void exchange(const int *fd, size_t m) {
    size_t per = m / lanes, soff[MAX_LANES] = {0}, roff[MAX_LANES] = {0};
    for (;;) {
        struct pollfd p[MAX_LANES];
        int pending = 0;
        for (int i = 0; i < lanes; i++) {
            p[i].fd = fd[i];
            p[i].events = (soff[i] < per ? POLLOUT : 0) | (roff[i] < per ? POLLIN : 0);
            p[i].revents = 0;
            pending |= p[i].events;
        }
        if (!pending)
            return;
        if (poll(p, lanes, -1) < 0)
            die("poll");
        for (int i = 0; i < lanes; i++) {
            if (p[i].revents & POLLOUT) {
                ssize_t w = send(fd[i], sbuf + i * per + soff[i], per - soff[i], MSG_DONTWAIT);
                if (w > 0)
                    soff[i] += w;
            }
            if (p[i].revents & POLLIN) {
                ssize_t r = recv(fd[i], rbuf + i * per + roff[i], per - roff[i], MSG_DONTWAIT);
                if (r > 0)
                    roff[i] += r;
                else if (r == 0) {
                    fprintf(stderr, "peer closed a socket\n");
                    exit(3);
                }
            }
        }
    }
}

/* Microseconds per exchange over `iters` exchanges (a fixed count, so that
 * both processes run the same schedule). */
static double timed(const int *fd, size_t m, int iters) {
    double t0 = now();
    for (int i = 0; i < iters; i++)
        exchange(fd, m);
    return (now() - t0) / iters * 1e6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void size_buffers(int fd) {
    const char *names[2] = {"SNDBUF", "RCVBUF"};
    int opts[2] = {SO_SNDBUF, SO_RCVBUF};
    for (int k = 0; k < 2; k++) {
        const char *v = getenv(names[k]);
        if (!v)
            continue;
        int bytes = atoi(v);
        if (setsockopt(fd, SOL_SOCKET, opts[k], &bytes, sizeof bytes) < 0)
            die(names[k]);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s SMALL BIG LANES ITERS ROUNDS\n", argv[0]);
        return 1;
    }
    size_t small = strtoul(argv[1], 0, 10), big = strtoul(argv[2], 0, 10);
    lanes = atoi(argv[3]);
    int iters = atoi(argv[4]), rounds = atoi(argv[5]);
    if (lanes < 1 || lanes > MAX_LANES || rounds < 1 || rounds > MAX_ROUNDS || iters < 1 ||
        small < (size_t)lanes || big < small || big > (64u << 20) || small % lanes || big % lanes) {
        fprintf(stderr, "need 1..16 lanes, 1..64 rounds, ITERS >= 1, LANES <= SMALL <= BIG <= 64 MiB, "
                        "SMALL and BIG multiples of LANES\n");
        return 1;
    }
    sbuf = malloc(big);
    rbuf = malloc(big);
    if (!sbuf || !rbuf)
        die("malloc");
    for (size_t i = 0; i < big; i++)
        sbuf[i] = (char)(i * 31 + 7);
    memset(rbuf, 0, big);

    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0)
        die("socket");
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) < 0 || listen(ls, 2 * MAX_LANES) < 0 ||
        getsockname(ls, (void *)&a, &al) < 0)
        die("bind/listen");

    int fd[2 * MAX_LANES];
    pid_t child = fork();
    if (child < 0)
        die("fork");
    for (int i = 0; i < 2 * lanes; i++) {
        if (child == 0) {
            fd[i] = socket(AF_INET, SOCK_STREAM, 0);
            if (fd[i] < 0)
                die("socket");
            size_buffers(fd[i]);
            if (connect(fd[i], (void *)&a, sizeof a) < 0)
                die("connect");
        } else {
            fd[i] = accept(ls, 0, 0);
            if (fd[i] < 0)
                die("accept");
            size_buffers(fd[i]);
        }
        if (setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
            die("TCP_NODELAY");
    }
    int *set_a = fd, *set_b = fd + lanes;

    timed(set_a, small, 200);
    timed(set_b, small, 200);
    double bulk = now();
    for (int k = 0; k < BULK_EXCHANGES; k++)
        exchange(set_b, big);
    bulk = now() - bulk;

    double ta[MAX_ROUNDS], tb[MAX_ROUNDS], ratio[MAX_ROUNDS];
    for (int k = 0; k < rounds; k++) {
        ta[k] = timed(set_a, small, iters);
        tb[k] = timed(set_b, small, iters);
        ratio[k] = tb[k] / ta[k];
    }
    /* Both sides send the same pattern, so what each received last must
     * equal its own send buffer: a timing of corrupted streams is no timing. */
    if (memcmp(sbuf, rbuf, small) != 0) {
        fprintf(stderr, "%s: received bytes differ from those sent\n", child == 0 ? "child" : "parent");
        return 4;
    }
    if (child == 0)
        return 0;
    for (int k = 0; k < rounds; k++)
        printf("  round %d: A %.1f us, B %.1f us, B/A %.2f\n", k + 1, ta[k], tb[k], ratio[k]);
    qsort(ratio, rounds, sizeof(double), by_value);
    qsort(ta, rounds, sizeof(double), by_value);
    qsort(tb, rounds, sizeof(double), by_value);
    printf("median B/A %.2f [%.2f-%.2f]; A %.0f us, B %.0f us; bulk exchanges %.2f GB/s each way\n",
           ratio[rounds / 2], ratio[0], ratio[rounds - 1], ta[rounds / 2], tb[rounds / 2],
           BULK_EXCHANGES * (double)big / bulk / 1e9);
    int status;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child process failed\n");
        return 5;
    }
    printf("data ok\n");
    return 0;
}
