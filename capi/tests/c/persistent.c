/*
 * persistent.c: persistent all-reduce through the C ABI, under gwrun -n N.
 *
 * Each rank plans three requests once with gwAllReduceInit (float32 sum out
 * of place, 4099 elements; int32 max in place, 7 elements; float64 sum in
 * place, 1 element) and runs ROUNDS rounds of each with gwStart, the inputs
 * changing every round, finishing them with gwWait or by polling gwTest;
 * every element of every round is checked exactly. Then the misuse paths:
 * gwStart on a running round, on a one-shot request, and after
 * gwRequestFree (all gwInvalidUsage); gwRequestFree of a running round
 * (waits for it); gwTest/gwWait/gwRequestFree of a freed request; the
 * argument errors of gwAllReduceInit; count 0.
 *
 * Prints "persistent.c: rank R ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradwire.h"
#include "expect.h"

#define ROUNDS 20

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
  enum { NA = 4099, NB = 7 };
  gwComm_t comm = NULL;
  gwRequest_t a = NULL, b = NULL, c = NULL, once = NULL, bad = (gwRequest_t)(uintptr_t)0x1234;
  static float a_send[NA], a_recv[NA];
  int32_t b_buf[NB];
  double c_buf[1], x[3] = {1, 2, 3}, y[3];
  int rank = -1, n = 0, k, i, done;

  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  EXPECT(gwCommRank(comm, &rank), gwSuccess);
  EXPECT(gwCommCount(comm, &n), gwSuccess);
  if (!comm || n < 2) {
    fprintf(stderr, "persistent.c: need at least 2 ranks\n");
    return 1;
  }

  /* Planned once... */
  EXPECT(gwAllReduceInit(a_send, a_recv, NA, gwFloat32, gwSum, comm, &a), gwSuccess);
  EXPECT(gwAllReduceInit(b_buf, b_buf, NB, gwInt32, gwMax, comm, &b), gwSuccess);
  EXPECT(gwAllReduceInit(c_buf, c_buf, 1, gwFloat64, gwSum, comm, &c), gwSuccess);
  if (!a || !b || !c) {
    fprintf(stderr, "persistent.c: gwAllReduceInit failed: %s\n", gwGetLastError(comm));
    return 1;
  }
  /* ...complete before the first start. */
  done = 0;
  EXPECT(gwTest(a, &done), gwSuccess);
  if (!done) failures++;
  EXPECT(gwWait(a, 0), gwSuccess);

  /* ...and started ROUNDS times with new inputs. */
  for (k = 0; k < ROUNDS; k++) {
    for (i = 0; i < NA; i++) a_send[i] = (float)input(rank, k, i);
    for (i = 0; i < NB; i++) b_buf[i] = input(rank, k, i);
    c_buf[0] = input(rank, k, 0);
    EXPECT(gwStart(a), gwSuccess);
    EXPECT(gwStart(b), gwSuccess);
    EXPECT(gwStart(c), gwSuccess);
    if (k % 2) {
      do {
        EXPECT(gwTest(a, &done), gwSuccess);
      } while (!done);
      EXPECT(gwWait(a, 0), gwSuccess); /* nothing running: at once */
    } else {
      EXPECT(gwWait(a, 20000), gwSuccess);
    }
    EXPECT(gwWait(b, -1), gwSuccess);
    EXPECT(gwWait(c, -1), gwSuccess);
    for (i = 0; i < NA; i++) {
      if (a_recv[i] != (float)sum_of(n, k, i) || a_send[i] != (float)input(rank, k, i)) {
        fprintf(stderr, "persistent.c: rank %d round %d: a[%d] = %g, want %d\n", rank, k, i,
                a_recv[i], sum_of(n, k, i));
        failures++;
        break;
      }
    }
    for (i = 0; i < NB; i++) {
      if (b_buf[i] != max_of(n, k, i)) {
        fprintf(stderr, "persistent.c: rank %d round %d: b[%d] = %d, want %d\n", rank, k, i,
                b_buf[i], max_of(n, k, i));
        failures++;
        break;
      }
    }
    if (c_buf[0] != sum_of(n, k, 0)) {
      fprintf(stderr, "persistent.c: rank %d round %d: c = %g\n", rank, k, c_buf[0]);
      failures++;
    }
    /* An ordinary call between rounds. */
    EXPECT(gwAllReduce(x, y, 3, gwFloat64, gwSum, comm), gwSuccess);
    if (y[2] != 3.0 * n) failures++;
  }

  /* gwStart on a running round: rank 0 starts at once, the others late, so
   * rank 0's round cannot have finished. */
  for (i = 0; i < NA; i++) a_send[i] = (float)input(rank, ROUNDS, i);
  if (rank == 0) {
    EXPECT(gwStart(a), gwSuccess);
    EXPECT(gwStart(a), gwInvalidUsage);
    EXPECT_MSG(comm, "still running");
    EXPECT(gwTest(a, &done), gwSuccess);
    if (done) {
      fprintf(stderr, "persistent.c: round finished before the other ranks started\n");
      failures++;
    }
    EXPECT(gwWait(a, 10), gwTimeout); /* still valid after */
  } else {
    sleep_ms(300);
    EXPECT(gwStart(a), gwSuccess);
  }
  EXPECT(gwWait(a, -1), gwSuccess);
  if (a_recv[NA - 1] != (float)sum_of(n, ROUNDS, NA - 1)) failures++;

  /* gwRequestFree of a running round waits for it (the others start late). */
  for (i = 0; i < NA; i++) a_send[i] = (float)input(rank, ROUNDS + 1, i);
  if (rank != 0) sleep_ms(200);
  EXPECT(gwStart(a), gwSuccess);
  EXPECT(gwRequestFree(a), gwSuccess);
  for (i = 0; i < NA; i++)
    if (a_recv[i] != (float)sum_of(n, ROUNDS + 1, i)) {
      fprintf(stderr, "persistent.c: rank %d: the round freed while running is wrong\n", rank);
      failures++;
      break;
    }

  /* A freed request is recognised, never touched. */
  EXPECT(gwStart(a), gwInvalidUsage);
  EXPECT_MSG(NULL, "freed");
  EXPECT(gwTest(a, &done), gwInvalidUsage);
  EXPECT(gwWait(a, 0), gwInvalidUsage);
  EXPECT(gwRequestFree(a), gwInvalidUsage);
  EXPECT(gwRequestFree(b), gwSuccess);
  EXPECT(gwStart(b), gwInvalidUsage);
  EXPECT(gwStart(bad), gwInvalidUsage);
  EXPECT(gwStart(NULL), gwInvalidArgument);
  EXPECT(gwRequestFree(NULL), gwInvalidArgument);

  /* A one-shot request cannot be started; gwRequestFree waits for it. */
  EXPECT(gwAllReduceAsync(x, y, 3, gwFloat64, gwSum, comm, &once), gwSuccess);
  EXPECT(gwStart(once), gwInvalidUsage);
  EXPECT_MSG(NULL, "not persistent");
  EXPECT(gwRequestFree(once), gwSuccess);
  EXPECT(gwWait(once, 0), gwInvalidUsage);

  /* Argument errors, as gwAllReduce's. */
  EXPECT(gwAllReduceInit(a_send, a_recv, 4, gwFloat32, gwSum, comm, NULL), gwInvalidArgument);
  EXPECT(gwAllReduceInit(a_send, a_recv, 4, gwFloat32, gwSum, NULL, &a), gwInvalidArgument);
  EXPECT_MSG(NULL, "comm is NULL");
  EXPECT(gwAllReduceInit(NULL, a_recv, 4, gwFloat32, gwSum, comm, &a), gwInvalidArgument);
  EXPECT_MSG(comm, "null buffer");
  if (a != NULL) failures++; /* NULL on failure */
  EXPECT(gwAllReduceInit(a_send, NULL, 4, gwFloat32, gwSum, comm, &a), gwInvalidArgument);
  EXPECT(gwAllReduceInit(a_send, a_recv, 4, (gwDataType_t)99, gwSum, comm, &a), gwInvalidArgument);
  EXPECT_MSG(comm, "datatype 99");
  EXPECT(gwAllReduceInit(a_send, a_recv, 4, gwFloat32, (gwRedOp_t)42, comm, &a), gwInvalidArgument);
  EXPECT(gwAllReduceInit(b_buf, b_buf, 4, gwInt32, gwAvg, comm, &a), gwInvalidArgument);
  EXPECT_MSG(comm, "int32");
  EXPECT(gwAllReduceInit(a_send, a_recv, SIZE_MAX, gwFloat32, gwSum, comm, &a), gwInvalidArgument);
  EXPECT_MSG(comm, "overflow");

  /* Count 0 (NULL buffers allowed, as for gwAllReduce): rounds move nothing. */
  EXPECT(gwAllReduceInit(NULL, NULL, 0, gwFloat32, gwSum, comm, &a), gwSuccess);
  for (k = 0; k < 3; k++) {
    EXPECT(gwStart(a), gwSuccess);
    EXPECT(gwWait(a, -1), gwSuccess);
  }
  EXPECT(gwRequestFree(a), gwSuccess);

  EXPECT(gwRequestFree(c), gwSuccess);
  EXPECT(gwBarrier(comm), gwSuccess);
  EXPECT(gwCommDestroy(comm), gwSuccess);
  if (failures) {
    fprintf(stderr, "persistent.c: rank %d: %d failures\n", rank, failures);
    return 1;
  }
  printf("persistent.c: rank %d ok\n", rank);
  return 0;
}
