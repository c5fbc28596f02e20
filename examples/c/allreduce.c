/*
 * allreduce.c: a gradwire C example, written only from gradwire.h.
 *
 *   cc -std=c99 -I capi/include examples/c/allreduce.c -L target/debug -lgradwire -o allreduce
 *   LD_LIBRARY_PATH=target/debug gwrun -n 3 ./allreduce
 *
 * Each rank checks every result exactly and prints "allreduce.c: rank R ok".
 */
#include <stdio.h>
#include <stdlib.h>

#include "gradwire.h"

#define N 1000

static gwComm_t comm = NULL;

static int check(gwResult_t r, const char* what) {
  if (r != gwSuccess) {
    fprintf(stderr, "allreduce.c: %s failed: %s: %s\n", what, gwGetErrorString(r),
            gwGetLastError(comm));
    return 1;
  }
  return 0;
}

#define CHECK(call)                 \
  do {                              \
    if (check((call), #call)) {     \
      if (comm) gwCommDestroy(comm); \
      return 1;                     \
    }                               \
  } while (0)

static int fail(int rank, const char* what, size_t i, double got, double want) {
  fprintf(stderr, "allreduce.c: rank %d: %s[%lu] = %g, want %g\n", rank, what, (unsigned long)i,
          got, want);
  gwCommDestroy(comm);
  return 1;
}

int main(void) {
  int version = 0, rank = -1, n = 0, done = 0;
  size_t i;
  float* send;
  float* recv;
  gwRequest_t req = NULL;

  CHECK(gwGetVersion(&version));
  CHECK(gwCommInitFromEnv(&comm));
  CHECK(gwCommRank(comm, &rank));
  CHECK(gwCommCount(comm, &n));

  send = malloc(N * sizeof(float));
  recv = malloc(N * sizeof(float));
  if (!send || !recv) return 1;

  /* Sum: rank r contributes r + i; the total is n*i + n(n-1)/2, exact in float. */
  for (i = 0; i < N; i++) send[i] = (float)(rank + (int)i);
  CHECK(gwAllReduce(send, recv, N, gwFloat32, gwSum, comm));
  for (i = 0; i < N; i++) {
    float want = (float)(n * (int)i + n * (n - 1) / 2);
    if (recv[i] != want) return fail(rank, "sum", i, recv[i], want);
  }

  /* In place max. */
  for (i = 0; i < N; i++) recv[i] = (float)(rank * 10 + (int)(i % 7));
  CHECK(gwAllReduce(recv, recv, N, gwFloat32, gwMax, comm));
  for (i = 0; i < N; i++) {
    float want = (float)((n - 1) * 10 + (int)(i % 7));
    if (recv[i] != want) return fail(rank, "max", i, recv[i], want);
  }

  /* Weighted: rank r sends 4 with weight (r+1)/4: the sum is n(n+1)/2. */
  for (i = 0; i < N; i++) send[i] = 4.0f;
  CHECK(gwAllReduceWeighted(send, recv, N, gwFloat32, (rank + 1) / 4.0, comm));
  for (i = 0; i < N; i++) {
    float want = (float)(n * (n + 1) / 2);
    if (recv[i] != want) return fail(rank, "weighted", i, recv[i], want);
  }

  /* Async sum with gwTest, then gwWait. */
  for (i = 0; i < N; i++) send[i] = 1.0f;
  CHECK(gwAllReduceAsync(send, recv, N, gwFloat32, gwSum, comm, &req));
  CHECK(gwTest(req, &done));
  CHECK(gwWait(req, -1));
  for (i = 0; i < N; i++) {
    if (recv[i] != (float)n) return fail(rank, "async", i, recv[i], n);
  }

  /* Broadcast from the last rank. */
  for (i = 0; i < N; i++) recv[i] = (rank == n - 1) ? (float)(i * 3) : -1.0f;
  CHECK(gwBroadcast(recv, recv, N, gwFloat32, n - 1, comm));
  for (i = 0; i < N; i++) {
    if (recv[i] != (float)(i * 3)) return fail(rank, "broadcast", i, recv[i], i * 3.0);
  }

  /* In-place reduce-scatter (NCCL layout: recvbuff = sendbuff + rank * C). */
  {
    const size_t C = N / 4;
    float* buf = malloc((size_t)n * C * sizeof(float));
    if (!buf) return 1;
    for (i = 0; i < (size_t)n * C; i++) buf[i] = (float)(rank + (int)i);
    CHECK(gwReduceScatter(buf, buf + (size_t)rank * C, C, gwFloat32, gwSum, comm));
    for (i = 0; i < C; i++) {
      float want = (float)(n * (rank * (int)C + (int)i) + n * (n - 1) / 2);
      if (buf[(size_t)rank * C + i] != want) return fail(rank, "reduce_scatter", i, buf[rank * C + i], want);
    }
    /* In-place all-gather (sendbuff = recvbuff + rank * C). */
    for (i = 0; i < C; i++) buf[(size_t)rank * C + i] = (float)(rank * 100 + (int)i);
    CHECK(gwAllGather(buf + (size_t)rank * C, buf, C, gwFloat32, comm));
    for (i = 0; i < (size_t)n * C; i++) {
      float want = (float)((int)(i / C) * 100 + (int)(i % C));
      if (buf[i] != want) return fail(rank, "all_gather", i, buf[i], want);
    }
    free(buf);
  }

  /* Reduce to rank 0. */
  for (i = 0; i < N; i++) send[i] = (float)(rank + 1);
  CHECK(gwReduce(send, recv, N, gwFloat32, gwSum, 0, comm));
  if (rank == 0) {
    for (i = 0; i < N; i++) {
      float want = (float)(n * (n + 1) / 2);
      if (recv[i] != want) return fail(rank, "reduce", i, recv[i], want);
    }
  }

  /* Non-blocking reduce to the last rank, in place. */
  {
    gwRequest_t req = NULL;
    for (i = 0; i < N; i++) send[i] = (float)(rank * 2);
    CHECK(gwReduceAsync(send, send, N, gwFloat32, gwMax, n - 1, comm, &req));
    CHECK(gwWait(req, -1));
    if (rank == n - 1) {
      for (i = 0; i < N; i++) {
        float want = (float)((n - 1) * 2);
        if (send[i] != want) return fail(rank, "reduce_async", i, send[i], want);
      }
    }
  }

  CHECK(gwBarrier(comm));
  CHECK(gwCommDestroy(comm));
  free(send);
  free(recv);
  printf("allreduce.c: rank %d ok\n", rank);
  return 0;
}
