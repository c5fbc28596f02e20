/*
 * mpi_small_calls: bench/capi/small_calls.c for MPI, call for call (a
 * barrier, an 8-byte float32 sum all-reduce, an 8-byte broadcast from rank
 * 0), timed the same way, for scripts/small-calls.sh.
 *
 *   mpirun -n N ./mpi_small_calls [-T SECONDS]
 *
 * Rank 0 prints, per call:
 *
 *   mpi coll=C bytes=B ranks=N iters=I time_us=T wrong=W
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { BARRIER, ALLREDUCE, BROADCAST };
static const char *NAMES[] = {"barrier", "allreduce", "broadcast"};

static int rank, size;

static void call(enum coll c, float *send, float *recv) {
    switch (c) {
    case BARRIER:
        MPI_Barrier(MPI_COMM_WORLD);
        break;
    case ALLREDUCE:
        MPI_Allreduce(send, recv, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        /* MPI broadcasts in place: the root's buffer is its send buffer. */
        if (rank == 0)
            memcpy(recv, send, 2 * sizeof(float));
        MPI_Bcast(recv, 2, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
}

static double slowest(double x) {
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return x;
}

static double timed(enum coll c, long iters, float *send, float *recv) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++)
        call(c, send, recv);
    return slowest((MPI_Wtime() - t0) / (double)iters);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double seconds = 0.2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-T") == 0 && i + 1 < argc && atof(argv[i + 1]) > 0)
            seconds = atof(argv[++i]);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -n N %s [-T SECONDS]\n", argv[0]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
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
            float want0 = (float)size * (size + 1) / 2, want1 = (float)size * (size - 1);
            wrong = recv[0] != want0 || recv[1] != want1;
        } else if (c == BROADCAST) {
            wrong = recv[0] != 1.0f || recv[1] != 0.0f;
        }
        double w = slowest((double)wrong);
        if (rank == 0)
            printf("mpi coll=%s bytes=%d ranks=%d iters=%ld time_us=%.3f wrong=%d\n", NAMES[c],
                   c == BARRIER ? 0 : 8, size, iters, us, (int)w);
    }
    MPI_Finalize();
    return 0;
}
