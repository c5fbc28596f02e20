/*
 * p2p.c: point-to-point through the C ABI, under gwrun -n N (N >= 2).
 *
 * A ring: each rank exchanges messages of growing sizes (1 element to
 * 1 Mi elements, float32 and int64) with gwSendRecv, sending to rank+1 and
 * receiving from rank-1; every element checked. Then gwSendAsync and
 * gwRecvAsync between ranks 0 and 1 (1 Mi elements, rank 1 posting its
 * receive first), blocking gwSend/gwRecv between them both ways, count 0,
 * and the argument errors: a peer that is not a rank, a NULL buffer with a
 * count, a NULL request. Then gwAllToAll (equal blocks) and gwAllToAllv
 * (uneven), every element checked, and their argument errors.
 *
 * Prints "p2p.c: rank R ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gradwire.h"
#include "expect.h"

static float fval(int rank, size_t i, int round) { return (float)((rank * 7 + (int)i * 3 + round) % 1000); }

int main(void) {
  gwComm_t comm = NULL;
  int rank = -1, n = 0;
  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  EXPECT(gwCommRank(comm, &rank), gwSuccess);
  EXPECT(gwCommCount(comm, &n), gwSuccess);
  if (!comm || n < 2) {
    fprintf(stderr, "p2p.c: need at least 2 ranks\n");
    return 1;
  }
  int right = (rank + 1) % n, left = (rank + n - 1) % n;

  size_t max = (size_t)1 << 20;
  float *out = malloc(max * sizeof(float)), *in = malloc(max * sizeof(float));
  int64_t *out64 = malloc(max * sizeof(int64_t)), *in64 = malloc(max * sizeof(int64_t));
  if (!out || !in || !out64 || !in64) return 1;
  int round = 0;
  for (size_t count = 1; count <= max; count *= 8, round++) {
    for (size_t i = 0; i < count; i++) {
      out[i] = fval(rank, i, round);
      out64[i] = ((int64_t)rank << 40) + (int64_t)i + round;
    }
    EXPECT(gwSendRecv(out, count, right, in, count, left, gwFloat32, comm), gwSuccess);
    EXPECT(gwSendRecv(out64, count, right, in64, count, left, gwInt64, comm), gwSuccess);
    for (size_t i = 0; i < count; i++) {
      if (in[i] != fval(left, i, round) || in64[i] != ((int64_t)left << 40) + (int64_t)i + round) {
        fprintf(stderr, "p2p.c: rank %d count %zu element %zu wrong\n", rank, count, i);
        failures++;
        break;
      }
    }
  }

  /* Async between 0 and 1: rank 1 posts its receive first (requests run in
   * posting order), 1 Mi elements. */
  if (rank < 2) {
    gwRequest_t a = NULL, b = NULL;
    for (size_t i = 0; i < max; i++) out[i] = fval(rank, i, 99);
    if (rank == 0) {
      EXPECT(gwSendAsync(out, max, gwFloat32, 1, comm, &a), gwSuccess);
      EXPECT(gwRecvAsync(in, max, gwFloat32, 1, comm, &b), gwSuccess);
    } else {
      EXPECT(gwRecvAsync(in, max, gwFloat32, 0, comm, &b), gwSuccess);
      EXPECT(gwSendAsync(out, max, gwFloat32, 0, comm, &a), gwSuccess);
    }
    EXPECT(gwWait(a, -1), gwSuccess);
    EXPECT(gwWait(b, -1), gwSuccess);
    for (size_t i = 0; i < max; i++) {
      if (in[i] != fval(1 - rank, i, 99)) {
        fprintf(stderr, "p2p.c: rank %d async element %zu wrong\n", rank, i);
        failures++;
        break;
      }
    }
  }

  /* Blocking both ways between 0 and 1 (small), and count 0. */
  double d = 0;
  if (rank == 0) {
    double v = 3.5;
    EXPECT(gwSend(&v, 1, gwFloat64, 1, comm), gwSuccess);
    EXPECT(gwRecv(&d, 1, gwFloat64, 1, comm), gwSuccess);
    if (d != 7.0) failures++;
    EXPECT(gwSend(NULL, 0, gwFloat64, 1, comm), gwSuccess);
  } else if (rank == 1) {
    EXPECT(gwRecv(&d, 1, gwFloat64, 0, comm), gwSuccess);
    double v = d * 2;
    EXPECT(gwSend(&v, 1, gwFloat64, 0, comm), gwSuccess);
    EXPECT(gwRecv(NULL, 0, gwFloat64, 0, comm), gwSuccess);
  }

  /* All-to-all: equal blocks of 1000 int64, then uneven ones (rank p sends
   * rank q p+q+1 elements) with gwAllToAllv. */
  {
    size_t c = 1000;
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < c; i++) out64[(size_t)q * c + i] = ((int64_t)rank << 32) + q * 10000 + (int64_t)i;
    EXPECT(gwAllToAll(out64, in64, c, gwInt64, comm), gwSuccess);
    for (int q = 0; q < n && failures == 0; q++)
      for (size_t i = 0; i < c; i++)
        if (in64[(size_t)q * c + i] != ((int64_t)q << 32) + rank * 10000 + (int64_t)i) {
          fprintf(stderr, "p2p.c: rank %d all-to-all block %d element %zu wrong\n", rank, q, i);
          failures++;
          break;
        }
    size_t sc[64], sd[64], rc[64], rd[64], at = 0, rat = 0;
    for (int q = 0; q < n; q++) {
      sc[q] = (size_t)(rank + q + 1);
      sd[q] = at;
      at += sc[q];
      rc[q] = (size_t)(q + rank + 1);
      rd[q] = rat;
      rat += rc[q];
      for (size_t i = 0; i < sc[q]; i++) out[sd[q] + i] = (float)(rank * 100 + q);
    }
    EXPECT(gwAllToAllv(out, sc, sd, in, rc, rd, gwFloat32, comm), gwSuccess);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < rc[q]; i++)
        if (in[rd[q] + i] != (float)(q * 100 + rank)) {
          fprintf(stderr, "p2p.c: rank %d all-to-allv from %d wrong\n", rank, q);
          failures++;
          q = n;
          break;
        }
    EXPECT(gwAllToAll(out, out, 4, gwFloat32, comm), gwInvalidArgument); /* in place */
    EXPECT(gwAllToAllv(out, NULL, sd, in, rc, rd, gwFloat32, comm), gwInvalidArgument);
  }

  /* Bad arguments: nothing is sent, every rank sees the same errors. */
  gwRequest_t r = NULL;
  EXPECT(gwSend(out, 1, gwFloat32, n, comm), gwInvalidArgument);
  EXPECT(gwRecv(in, 1, gwFloat32, -1, comm), gwInvalidArgument);
  EXPECT(gwSend(NULL, 4, gwFloat32, right, comm), gwInvalidArgument);
  EXPECT(gwRecvAsync(in, 1, gwFloat32, left, comm, NULL), gwInvalidArgument);
  EXPECT(gwSendAsync(out, 1, (gwDataType_t)99, right, comm, &r), gwInvalidArgument);

  EXPECT(gwCommDestroy(comm), gwSuccess);
  free(out);
  free(in);
  free(out64);
  free(in64);
  if (failures == 0) printf("p2p.c: rank %d ok\n", rank);
  return failures == 0 ? 0 : 1;
}
