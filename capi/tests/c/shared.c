/*
 * shared.c: persistent all-reduce on buffers the library allocates
 * (gwAllReduceInitShared), under gwrun -n N, over whatever transport the
 * environment picks (on one host: shared memory, where every rank's buffers
 * lie in one region; over tcp: private buffers on the engine).
 *
 * Each rank plans two requests once (float32 sum out of place, 5003
 * elements; int32 max in place, 9 elements), checks the buffers start
 * zeroed, and runs ROUNDS rounds of each with gwStart, writing new inputs
 * into the library's send buffers every round and finishing with gwWait or
 * by polling gwTest; every element of every round is checked exactly. Then
 * the misuse paths: gwStart on a running round (gwInvalidUsage),
 * gwRequestFree of a running round (waits for it), calls after
 * gwRequestFree, and the argument errors; count 0.
 *
 * Prints "shared.c: rank R ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradwire.h"
#include "expect.h"

#define ROUNDS 30

static void sleep_ms(int ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (long)(ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

/* Rank r's element i in round k: 0..4, so sums are exact in every type. */
static int input(int r, int k, int i) { return (r * 7 + i * 3 + k) % 5; }

static int sum_of(int n, int k, int i) {
  int s = 0, r;
  for (r = 0; r < n; r++) s += input(r, k, i);
  return s;
}

static int max_of(int n, int k, int i) {
  int m = 0, r;
  for (r = 0; r < n; r++)
    if (input(r, k, i) > m) m = input(r, k, i);
  return m;
}

int main(void) {
  enum { NA = 5003, NB = 9 };
  gwComm_t comm = NULL;
  gwRequest_t a = NULL, b = NULL, z = NULL;
  void *as = NULL, *ar = NULL, *bs = NULL, *br = NULL, *zs = NULL, *zr = NULL;
  float *a_send, *a_recv;
  int32_t *b_buf;
  int rank = -1, n = 0, k, i, done;

  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  EXPECT(gwCommRank(comm, &rank), gwSuccess);
  EXPECT(gwCommCount(comm, &n), gwSuccess);
  if (!comm || n < 1) {
    fprintf(stderr, "shared.c: no communicator\n");
    return 1;
  }

  EXPECT(gwAllReduceInitShared(NA, gwFloat32, gwSum, 0, comm, &as, &ar, &a), gwSuccess);
  EXPECT(gwAllReduceInitShared(NB, gwInt32, gwMax, 1, comm, &bs, &br, &b), gwSuccess);
  if (!a || !b || !as || !ar || !bs || bs != br || as == ar) {
    fprintf(stderr, "shared.c: gwAllReduceInitShared failed: %s\n", gwGetLastError(comm));
    return 1;
  }
  a_send = as;
  a_recv = ar;
  b_buf = bs;
  if ((uintptr_t)as % 64 || (uintptr_t)ar % 64 || (uintptr_t)bs % 64) {
    fprintf(stderr, "shared.c: buffers not aligned to a cache line\n");
    failures++;
  }
  for (i = 0; i < NA; i++)
    if (a_send[i] != 0.0f || a_recv[i] != 0.0f) {
      fprintf(stderr, "shared.c: a new buffer is not zeroed\n");
      failures++;
      break;
    }

  for (k = 0; k < ROUNDS; k++) {
    for (i = 0; i < NA; i++) a_send[i] = (float)input(rank, k, i);
    for (i = 0; i < NB; i++) b_buf[i] = input(rank, k, i);
    EXPECT(gwStart(a), gwSuccess);
    EXPECT(gwStart(b), gwSuccess);
    if (k % 2) {
      do {
        EXPECT(gwTest(a, &done), gwSuccess);
      } while (!done);
      EXPECT(gwWait(a, 0), gwSuccess); /* nothing running: at once */
    } else {
      EXPECT(gwWait(a, 20000), gwSuccess);
    }
    EXPECT(gwWait(b, -1), gwSuccess);
    for (i = 0; i < NA; i++) {
      if (a_recv[i] != (float)sum_of(n, k, i) || a_send[i] != (float)input(rank, k, i)) {
        fprintf(stderr, "shared.c: rank %d round %d: a[%d] = %g, want %d\n", rank, k, i,
                a_recv[i], sum_of(n, k, i));
        failures++;
        break;
      }
    }
    for (i = 0; i < NB; i++) {
      if (b_buf[i] != max_of(n, k, i)) {
        fprintf(stderr, "shared.c: rank %d round %d: b[%d] = %d, want %d\n", rank, k, i,
                b_buf[i], max_of(n, k, i));
        failures++;
        break;
      }
    }
    /* One rank dawdles now and then after a round: the others are already
     * in the next one, and must wait for its start. */
    if (k % 7 == 3 && rank == n - 1) sleep_ms(5);
  }

  /* gwStart on a running round: rank 0 starts at once, the others late. */
  if (n > 1) {
    for (i = 0; i < NA; i++) a_send[i] = (float)input(rank, ROUNDS, i);
    if (rank == 0) {
      EXPECT(gwStart(a), gwSuccess);
      EXPECT(gwStart(a), gwInvalidUsage);
      EXPECT_MSG(comm, "still running");
      EXPECT(gwWait(a, 10), gwTimeout); /* still valid after */
    } else {
      sleep_ms(300);
      EXPECT(gwStart(a), gwSuccess);
    }
    EXPECT(gwWait(a, -1), gwSuccess);
    if (a_recv[NA - 1] != (float)sum_of(n, ROUNDS, NA - 1)) failures++;
  }

  /* gwRequestFree of a running round waits for it (the others start late);
   * the buffers go with the request. */
  for (i = 0; i < NB; i++) b_buf[i] = input(rank, ROUNDS + 1, i);
  if (rank != 0) sleep_ms(200);
  EXPECT(gwStart(b), gwSuccess);
  EXPECT(gwRequestFree(b), gwSuccess);
  EXPECT(gwStart(b), gwInvalidUsage);
  EXPECT(gwWait(b, 0), gwInvalidUsage);
  EXPECT(gwRequestFree(b), gwInvalidUsage);

  /* Argument errors; every output given is NULL after each. */
  zs = zr = (void *)1;
  EXPECT(gwAllReduceInitShared(4, gwFloat32, gwSum, 0, comm, &zs, &zr, NULL), gwInvalidArgument);
  if (zs != NULL || zr != NULL) failures++;
  zs = zr = (void *)1;
  z = (gwRequest_t)1;
  EXPECT(gwAllReduceInitShared(4, gwFloat32, gwSum, 0, comm, NULL, &zr, &z), gwInvalidArgument);
  EXPECT(gwAllReduceInitShared(4, gwFloat32, gwSum, 0, NULL, &zs, &zr, &z), gwInvalidArgument);
  EXPECT_MSG(NULL, "comm is NULL");
  EXPECT(gwAllReduceInitShared(4, (gwDataType_t)99, gwSum, 0, comm, &zs, &zr, &z),
         gwInvalidArgument);
  EXPECT_MSG(comm, "datatype 99");
  EXPECT(gwAllReduceInitShared(4, gwInt32, gwAvg, 0, comm, &zs, &zr, &z), gwInvalidArgument);
  EXPECT_MSG(comm, "int32");
  EXPECT(gwAllReduceInitShared(SIZE_MAX, gwFloat32, gwSum, 0, comm, &zs, &zr, &z),
         gwInvalidArgument);
  EXPECT_MSG(comm, "overflow");
  if (z != NULL || zs != NULL || zr != NULL) failures++; /* NULL on failure */

  /* Count 0: rounds move nothing. */
  EXPECT(gwAllReduceInitShared(0, gwFloat64, gwSum, 1, comm, &zs, &zr, &z), gwSuccess);
  for (k = 0; k < 3; k++) {
    EXPECT(gwStart(z), gwSuccess);
    EXPECT(gwWait(z, -1), gwSuccess);
  }
  EXPECT(gwRequestFree(z), gwSuccess);
  EXPECT(gwRequestFree(a), gwSuccess);
  EXPECT(gwCommDestroy(comm), gwSuccess);
  if (failures) return 1;
  printf("shared.c: rank %d ok\n", rank);
  return 0;
}
