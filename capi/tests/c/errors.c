/*
 * errors.c: the error paths of the gradwire C ABI.
 *
 *   errors args        under gwrun -n 2: every bad-argument class, a bogus
 *                      and a destroyed communicator, and gwCommAbort from
 *                      another thread while gwBarrier blocks.
 *   errors kill        standalone: gwGetUniqueId, then this program spawns
 *                      itself as rank 1 ("errors child ID"); both init with
 *                      gwCommInitRankConfig, all-reduce once, rank 1 kills
 *                      itself, and rank 0's next all-reduce must return
 *                      gwRemoteError naming rank 1.
 *   errors nourandom   run where /dev/urandom gives no bytes: gwGetUniqueId
 *                      must fail with gwSystemError naming /dev/urandom,
 *                      never fall back to a token anyone could guess.
 *
 * Prints "errors.c: <mode> rank R ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gradwire.h"
#include "expect.h"

static void sleep_ms(int ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (long)(ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static void* abort_later(void* comm) {
  sleep_ms(500);
  if (gwCommAbort((gwComm_t)comm) != gwSuccess) fprintf(stderr, "gwCommAbort failed\n");
  return NULL;
}

static int args_mode(void) {
  gwComm_t comm = NULL, comm2 = NULL, dead = NULL;
  int rank = -1, n = 0, i;
  float a[4] = {1, 2, 3, 4}, b[4];
  int32_t ia[4] = {1, 2, 3, 4}, ib[4];
  gwRequest_t req = NULL;
  pthread_t th;
  const char* s;

  EXPECT(gwGetVersion(NULL), gwInvalidArgument);
  EXPECT(gwCommInitFromEnv(NULL), gwInvalidArgument);
  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  EXPECT(gwCommRank(comm, &rank), gwSuccess);
  EXPECT(gwCommCount(comm, &n), gwSuccess);
  if (!comm || n != 2) {
    fprintf(stderr, "errors.c: need a 2-rank communicator\n");
    return 1;
  }

  /* Null communicator, null out-pointers. */
  EXPECT(gwCommRank(NULL, &rank), gwInvalidArgument);
  EXPECT(gwCommRank(comm, NULL), gwInvalidArgument);
  EXPECT(gwAllReduce(a, b, 4, gwFloat32, gwSum, NULL), gwInvalidArgument);
  EXPECT_MSG(NULL, "comm is NULL");
  EXPECT(gwBarrier(NULL), gwInvalidArgument);
  EXPECT(gwAllReduceAsync(a, b, 4, gwFloat32, gwSum, comm, NULL), gwInvalidArgument);

  /* Null buffers with count > 0 (count 0 with NULL is fine). */
  EXPECT(gwAllReduce(NULL, b, 4, gwFloat32, gwSum, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "null buffer");
  EXPECT(gwAllReduce(a, NULL, 4, gwFloat32, gwSum, comm), gwInvalidArgument);
  EXPECT(gwAllGather(NULL, b, 2, gwFloat32, comm), gwInvalidArgument);

  /* Bad enum values. */
  EXPECT(gwAllReduce(a, b, 4, (gwDataType_t)99, gwSum, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "datatype 99");
  EXPECT(gwAllReduce(a, b, 4, (gwDataType_t)-1, gwSum, comm), gwInvalidArgument);
  EXPECT(gwAllReduce(a, b, 4, gwFloat32, (gwRedOp_t)42, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "op 42");
  EXPECT(gwReduceScatter(a, b, 2, gwFloat32, (gwRedOp_t)-7, comm), gwInvalidArgument);

  /* Counts that overflow. */
  EXPECT(gwAllReduce(a, b, SIZE_MAX, gwFloat32, gwSum, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "overflow");
  EXPECT(gwAllReduce(a, b, SIZE_MAX / 3, gwFloat32, gwSum, comm), gwInvalidArgument);
  EXPECT(gwAllGather(a, b, SIZE_MAX / 8, gwFloat64, comm), gwInvalidArgument);

  /* Root out of range. */
  EXPECT(gwBroadcast(a, a, 4, gwFloat32, 2, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "root 2");
  EXPECT(gwBroadcast(a, a, 4, gwFloat32, -1, comm), gwInvalidArgument);
  EXPECT(gwReduce(a, b, 4, gwFloat32, gwSum, 7, comm), gwInvalidArgument);

  /* Avg on an integer type. */
  EXPECT(gwAllReduce(ia, ib, 4, gwInt32, gwAvg, comm), gwInvalidArgument);
  EXPECT_MSG(comm, "int32");

  /* Bad requests, a bogus communicator, result strings. */
  EXPECT(gwWait(NULL, 0), gwInvalidArgument);
  EXPECT(gwTest((gwRequest_t)(uintptr_t)0x5000, &i), gwInvalidUsage);
  EXPECT(gwCommRank((gwComm_t)(uintptr_t)0x12345670, &rank), gwInvalidUsage);
  EXPECT_MSG(NULL, "destroyed or never created");
  for (i = -1; i < 10; i++) {
    s = gwGetErrorString((gwResult_t)i);
    if (!s || !*s) failures++;
  }

  /* The communicator still works after all that. */
  EXPECT(gwAllReduce(a, b, 4, gwFloat32, gwSum, comm), gwSuccess);
  for (i = 0; i < 4; i++)
    if (b[i] != 2 * a[i]) failures++;
  EXPECT(gwAllReduceAsync(a, b, 4, gwFloat32, gwSum, comm, &req), gwSuccess);
  EXPECT(gwWait(req, 10000), gwSuccess);
  EXPECT(gwWait(req, 0), gwInvalidUsage); /* freed by the successful wait */

  /* A destroyed communicator. */
  EXPECT(gwCommInitFromEnv(&dead), gwSuccess);
  EXPECT(gwCommDestroy(dead), gwSuccess);
  EXPECT(gwAllReduce(a, b, 4, gwFloat32, gwSum, dead), gwInvalidUsage);
  EXPECT_MSG(NULL, "destroyed");
  EXPECT(gwCommDestroy(dead), gwInvalidUsage);
  EXPECT(gwCommAbort(dead), gwInvalidUsage);

  /* Abort from another thread while a barrier blocks (rank 1 never enters it). */
  EXPECT(gwCommInitFromEnv(&comm2), gwSuccess);
  if (rank == 0) {
    pthread_create(&th, NULL, abort_later, comm2);
    EXPECT(gwBarrier(comm2), gwAborted);
    EXPECT_MSG(comm2, "abort");
    pthread_join(th, NULL);
    EXPECT(gwBarrier(comm2), gwAborted); /* later calls fail too */
  }
  /* Rank 1 waits here (on the first communicator) until rank 0 is done. */
  EXPECT(gwBarrier(comm), gwSuccess);
  EXPECT(gwCommDestroy(comm2), gwSuccess);
  EXPECT(gwCommDestroy(comm), gwSuccess);

  if (failures) {
    fprintf(stderr, "errors.c: args rank %d: %d failures\n", rank, failures);
    return 1;
  }
  printf("errors.c: args rank %d ok\n", rank);
  return 0;
}

static const char hexd[] = "0123456789abcdef";

static int kill_mode(const char* self, const char* hexid) {
  gwUniqueId id;
  gwComm_t comm = NULL;
  gwConfig_t cfg = GW_CONFIG_INITIALIZER;
  int rank = hexid ? 1 : 0, i, status = 0;
  float a[1024], b[1024];
  pid_t child = -1;
  gwResult_t r;

  memset(&id, 0, sizeof id);
  if (hexid) {
    for (i = 0; i < (int)sizeof id.internal && hexid[2 * i] && hexid[2 * i + 1]; i++) {
      int hi = (int)(strchr(hexd, hexid[2 * i]) - hexd), lo = (int)(strchr(hexd, hexid[2 * i + 1]) - hexd);
      id.internal[i] = (char)(hi * 16 + lo);
    }
  } else {
    char buf[2 * sizeof id.internal + 1];
    EXPECT(gwGetUniqueId(NULL), gwInvalidArgument);
    EXPECT(gwGetUniqueId(&id), gwSuccess);
    for (i = 0; i < (int)sizeof id.internal; i++) {
      buf[2 * i] = hexd[(unsigned char)id.internal[i] >> 4];
      buf[2 * i + 1] = hexd[(unsigned char)id.internal[i] & 15];
    }
    buf[2 * sizeof id.internal] = 0;
    child = fork();
    if (child == 0) {
      execl(self, self, "child", buf, (char*)NULL);
      _exit(127);
    }
  }
  cfg.timeout_ms = 5000;
  cfg.transport = gwTransportTcp;
  EXPECT(gwCommInitRank(&comm, 2, id, 2), gwInvalidArgument); /* rank out of range */
  r = gwCommInitRankConfig(&comm, 2, id, rank, &cfg);
  if (r != gwSuccess) {
    fprintf(stderr, "errors.c: kill rank %d: init failed: %s\n", rank, gwGetLastError(NULL));
    return 1;
  }
  for (i = 0; i < 1024; i++) a[i] = (float)i;
  EXPECT(gwAllReduce(a, b, 1024, gwFloat32, gwSum, comm), gwSuccess);
  for (i = 0; i < 1024; i++)
    if (b[i] != 2.0f * i) failures++;
  if (rank == 1) {
    fflush(NULL);
    raise(SIGKILL); /* dies while rank 0 is in its next all-reduce */
  }
  sleep_ms(200);
  r = gwAllReduce(a, b, 1024, gwFloat32, gwSum, comm);
  if (r != gwRemoteError) {
    fprintf(stderr, "errors.c: all-reduce with a killed peer returned %s: %s\n", gwGetErrorString(r),
            gwGetLastError(comm));
    failures++;
  }
  EXPECT_MSG(comm, "rank 1");
  fprintf(stderr, "errors.c: killed peer reported as: %s\n", gwGetLastError(comm));
  EXPECT(gwCommDestroy(comm), gwSuccess);
  waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    fprintf(stderr, "errors.c: rank 1 did not die by SIGKILL (status %d)\n", status);
    failures++;
  }
  if (failures) {
    fprintf(stderr, "errors.c: kill rank %d: %d failures\n", rank, failures);
    return 1;
  }
  printf("errors.c: kill rank %d ok\n", rank);
  return 0;
}

static int nourandom_mode(void) {
  gwUniqueId id;
  EXPECT(gwGetUniqueId(&id), gwSystemError);
  EXPECT_MSG(NULL, "/dev/urandom");
  if (failures) return 1;
  printf("errors.c: nourandom rank 0 ok\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "args")) return args_mode();
  if (argc >= 2 && !strcmp(argv[1], "kill")) return kill_mode(argv[0], NULL);
  if (argc >= 3 && !strcmp(argv[1], "child")) return kill_mode(argv[0], argv[2]);
  if (argc >= 2 && !strcmp(argv[1], "nourandom")) return nourandom_mode();
  fprintf(stderr, "usage: errors args|kill|nourandom\n");
  return 2;
}
