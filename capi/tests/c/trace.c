/*
 * trace.c: a C program reports its own compute into the GW_TRACE timeline
 * with gwTraceSpan, under gwrun -n N with GW_TRACE set.
 *
 * Each rank "computes" for about 20 ms (a sleep), reports it as a span
 * named "forward" of step 7, then all-reduces once, so the timeline holds
 * both. Bad arguments are refused with gwInvalidArgument whether or not
 * tracing is on: a NULL name, an empty one, one with a quote, a negative,
 * NaN or infinite duration. The test reads the trace file back.
 *
 * Prints "trace.c: rank R ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "gradwire.h"
#include "expect.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
  gwComm_t comm = NULL;
  EXPECT(gwCommInitFromEnv(&comm), gwSuccess);
  if (comm == NULL) return 1;
  int rank = -1;
  EXPECT(gwCommRank(comm, &rank), gwSuccess);

  double t0 = now_s();
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  EXPECT(gwTraceSpan("forward", now_s() - t0, 7), gwSuccess);

  float x = 1.0f;
  EXPECT(gwAllReduce(&x, &x, 1, gwFloat32, gwSum, comm), gwSuccess);

  EXPECT(gwTraceSpan(NULL, 0.1, 0), gwInvalidArgument);
  EXPECT(gwTraceSpan("", 0.1, 0), gwInvalidArgument);
  EXPECT(gwTraceSpan("a\"b", 0.1, 0), gwInvalidArgument);
  EXPECT(gwTraceSpan("ok", -1.0, 0), gwInvalidArgument);
  EXPECT(gwTraceSpan("ok", NAN, 0), gwInvalidArgument);
  EXPECT(gwTraceSpan("ok", INFINITY, 0), gwInvalidArgument);

  EXPECT(gwCommDestroy(comm), gwSuccess);
  if (failures == 0) printf("trace.c: rank %d ok\n", rank);
  return failures == 0 ? 0 : 1;
}
