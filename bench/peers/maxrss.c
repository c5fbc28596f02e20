/*
 * maxrss: runs a program and reports its peak resident set size, for the
 * memory check of scripts/compare-peers.sh (gwrun starts one per rank).
 *
 *   maxrss PROGRAM [ARGS...]
 *
 * After PROGRAM exits, prints to stderr
 *   maxrss rank=R kib=K
 * with R from GW_RANK (gwrun), OMPI_COMM_WORLD_RANK (mpirun) or -1, and K the child's ru_maxrss (peak RSS, KiB),
 * and exits with the child's status.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: maxrss PROGRAM [ARGS...]\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("maxrss: fork");
        return 1;
    }
    if (pid == 0) {
        execvp(argv[1], argv + 1);
        perror("maxrss: exec");
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("maxrss: wait4");
        return 1;
    }
    const char *rank = getenv("GW_RANK");
    if (!rank) rank = getenv("OMPI_COMM_WORLD_RANK");
    fprintf(stderr, "maxrss rank=%s kib=%ld\n", rank ? rank : "-1", ru.ru_maxrss);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
