/*
 * register.c: gwCommRegister / gwCommDeregister through the C ABI, under
 * gwrun -n N.
 *
 * Each rank registers one buffer, runs ROUNDS all-reduces (out of place
 * and in place) and a ring gwSendRecv on parts of it at several offsets,
 * checking every element; deregisters it after an all-reduce it has not
 * waited for (deregistering waits for it); then the misuse paths: a NULL
 * handle pointer, a NULL or empty range, deregistering twice, a NULL and
 * an unknown handle (gwInvalidArgument / gwInvalidUsage, with messages).
 *
 * Prints "register.c: rank R ok" on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradwire.h"
#include "expect.h"

#define ROUNDS 12
#define LEN (1 << 20)

/* Rank r's element i in round k: small integers, so sums are exact. */
static float input(int r, int k, int i) { return (float)((r * 7 + i * 3 + k * 5) % 11); }

int main(void) {
  gwComm_t comm = NULL;
  gwRequest_t req = NULL;
  void* h = NULL;
  void* h2 = NULL;
  float* buf = malloc(sizeof(float) * LEN);
  int rank = -1, n = 0, k, i, r;
  if (!buf) return 2;
  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  if (!comm) return 1;
  EXPECT(gwCommRank(comm, &rank), gwSuccess);
  EXPECT(gwCommCount(comm, &n), gwSuccess);
  EXPECT(gwCommRegister(comm, buf, sizeof(float) * LEN, &h), gwSuccess);
  if (!h) {
    fprintf(stderr, "register.c: no handle\n");
    failures++;
  }

  for (k = 0; k < ROUNDS; k++) {
    /* Offsets and counts move every round; all inside the registration. */
    int count = 1000 + k * 20011;
    int src = (k * 4099) % (LEN / 2 - count);
    int dst = LEN / 2 + (k * 7919) % (LEN / 2 - count);
    int out = (k % 2) ? src : dst;
    for (i = 0; i < count; i++) buf[src + i] = input(rank, k, i);
    EXPECT(gwAllReduce(buf + src, buf + out, (size_t)count, gwFloat32, gwSum, comm), gwSuccess);
    for (i = 0; i < count; i++) {
      float want = 0;
      for (r = 0; r < n; r++) want += input(r, k, i);
      if (buf[out + i] != want) {
        fprintf(stderr, "register.c: rank %d round %d [%d] = %g, want %g\n", rank, k, i,
                buf[out + i], want);
        failures++;
        break;
      }
    }
    if (n > 1) {
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      for (i = 0; i < count; i++) buf[src + i] = input(rank, k, i);
      EXPECT(gwSendRecv(buf + src, (size_t)count, next, buf + dst, (size_t)count, prev, gwFloat32,
                        comm),
             gwSuccess);
      for (i = 0; i < count; i++)
        if (buf[dst + i] != input(prev, k, i)) {
          fprintf(stderr, "register.c: rank %d round %d: message from %d wrong at %d\n", rank, k,
                  prev, i);
          failures++;
          break;
        }
    }
  }

  /* Deregistering waits for an earlier call on the range not waited for. */
  for (i = 0; i < 5000; i++) buf[i] = 1.0f;
  EXPECT(gwAllReduceAsync(buf, buf, 5000, gwFloat32, gwSum, comm, &req), gwSuccess);
  EXPECT(gwCommDeregister(comm, h), gwSuccess);
  EXPECT(gwWait(req, -1), gwSuccess);
  for (i = 0; i < 5000; i++)
    if (buf[i] != (float)n) {
      fprintf(stderr, "register.c: rank %d: the call before deregistering gave %g\n", rank,
              buf[i]);
      failures++;
      break;
    }

  /* Misuse. */
  EXPECT(gwCommDeregister(comm, h), gwInvalidUsage);
  EXPECT_MSG(comm, "deregistered or never made");
  EXPECT(gwCommDeregister(comm, NULL), gwInvalidArgument);
  EXPECT(gwCommDeregister(comm, (void*)(uintptr_t)0x1230), gwInvalidUsage);
  EXPECT(gwCommRegister(comm, buf, 16, NULL), gwInvalidArgument);
  EXPECT(gwCommRegister(comm, NULL, 16, &h2), gwInvalidArgument);
  EXPECT_MSG(comm, "non-null pointer and at least one byte");
  EXPECT(gwCommRegister(comm, buf, 0, &h2), gwInvalidArgument);
  if (h2) {
    fprintf(stderr, "register.c: a refused registration left a handle\n");
    failures++;
  }
  EXPECT(gwCommRegister(NULL, buf, 16, &h2), gwInvalidArgument);
  /* A registration outlived by its communicator's destruction is fine. */
  EXPECT(gwCommRegister(comm, buf, 4096, &h2), gwSuccess);
  EXPECT(gwCommDestroy(comm), gwSuccess);
  EXPECT(gwCommDeregister(comm, h2), gwInvalidUsage);
  free(buf);
  if (failures) return 1;
  printf("register.c: rank %d ok\n", rank);
  return 0;
}
