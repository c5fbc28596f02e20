/*
 * step.c: the step protocol (gwStepBegin / gwStepEnd) from C.
 *
 *   step errors   GW_JOB_SERVER unset: bad arguments, and a clear
 *                 gwInvalidUsage naming GW_JOB_SERVER.
 *   step down     GW_JOB_SERVER points at a closed port: gwStepBegin gives
 *                 up after GW_JOB_RETRY_S with gwTimeout naming the server.
 *   step run [N]  a job server is there: steps until it says stop (or N
 *                 steps were done), printing "step.c: step S local B ..."
 *                 for each.
 *   step stopped  the job was stopped: gwStepBegin returns gwAborted.
 *
 * A one-rank communicator is made with gwGetUniqueId (no launcher needed).
 * Prints "step.c: <mode> ok" on success.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradwire.h"
#include "expect.h"

static gwComm_t one_rank(void) {
  gwUniqueId id;
  gwComm_t comm = NULL;
  EXPECT(gwGetUniqueId(&id), gwSuccess);
  EXPECT(gwCommInitRank(&comm, 1, id, 0), gwSuccess);
  return comm;
}

static int errors_mode(void) {
  gwComm_t comm = one_rank();
  gwStepInfo info;
  gwStepReport rep = {16, 0.5, 0.1, 0.7, NAN, NAN};
  int stop = -1;
  if (!comm) return 1;
  EXPECT(gwStepBegin(NULL, &info), gwInvalidArgument);
  EXPECT(gwStepBegin(comm, NULL), gwInvalidArgument);
  EXPECT_MSG(comm, "info is NULL");
  EXPECT(gwStepEnd(comm, NULL, &stop), gwInvalidArgument);
  EXPECT(gwStepBegin(comm, &info), gwInvalidUsage);
  EXPECT_MSG(comm, "GW_JOB_SERVER is not set");
  EXPECT_MSG(comm, "gwjob agent");
  EXPECT(gwStepEnd(comm, &rep, &stop), gwInvalidUsage);
  EXPECT(gwCommDestroy(comm), gwSuccess);
  EXPECT(gwStepBegin(comm, &info), gwInvalidUsage);
  EXPECT_MSG(comm, "destroyed");
  return failures;
}

static int down_mode(void) {
  gwComm_t comm = one_rank();
  gwStepInfo info;
  if (!comm) return 1;
  EXPECT(gwStepBegin(comm, &info), gwTimeout);
  EXPECT_MSG(comm, "gone for");
  EXPECT(gwCommDestroy(comm), gwSuccess);
  return failures;
}

static int run_mode(int max_steps) {
  gwComm_t comm = one_rank();
  gwStepInfo info, again;
  int stop = 0, steps = 0;
  if (!comm) return 1;
  while (!stop && steps < max_steps) {
    gwStepReport rep;
    EXPECT(gwStepBegin(comm, &info), gwSuccess);
    if (failures) break;
    /* Asking again before the end is the same step. */
    EXPECT(gwStepBegin(comm, &again), gwSuccess);
    if (again.step != info.step) {
      fprintf(stderr, "step.c: second begin gave step %llu, want %llu\n",
              (unsigned long long)again.step, (unsigned long long)info.step);
      failures++;
    }
    printf("step.c: step %llu local %llu offset %llu global %llu weight %.3f algo %s predicted %s\n",
           (unsigned long long)info.step, (unsigned long long)info.local_batch,
           (unsigned long long)info.offset, (unsigned long long)info.global_batch, info.weight,
           info.algo, isnan(info.predicted_step_s) ? "nan" : "set");
    rep.samples = info.local_batch;
    rep.compute_s = 0.25;
    rep.comm_s = 0.05;
    rep.step_s = 0.5;
    rep.local_grad_sq = (double)info.step + 1.0;
    rep.global_grad_sq = NAN;
    EXPECT(gwStepEnd(comm, &rep, &stop), gwSuccess);
    if (failures) break;
    steps++;
  }
  /* The last step was ended: ending again is a usage error. */
  {
    gwStepReport rep = {1, 0, 0, 0, NAN, NAN};
    EXPECT(gwStepEnd(comm, &rep, NULL), gwInvalidUsage);
    EXPECT_MSG(comm, "without step begin");
  }
  printf("step.c: %s after %d steps\n", stop ? "stopped" : "done", steps);
  EXPECT(gwCommDestroy(comm), gwSuccess);
  return failures;
}

static int stopped_mode(void) {
  gwComm_t comm = one_rank();
  gwStepInfo info;
  if (!comm) return 1;
  EXPECT(gwStepBegin(comm, &info), gwAborted);
  printf("step.c: begin of a stopped job: %s\n", gwGetLastError(comm));
  EXPECT(gwCommDestroy(comm), gwSuccess);
  return failures;
}

int main(int argc, char** argv) {
  int rc;
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "errors"))
    rc = errors_mode();
  else if (!strcmp(mode, "down"))
    rc = down_mode();
  else if (!strcmp(mode, "run"))
    rc = run_mode(argc > 2 ? atoi(argv[2]) : 100);
  else if (!strcmp(mode, "stopped"))
    rc = stopped_mode();
  else {
    fprintf(stderr, "usage: step errors|down|run [N]|stopped\n");
    return 2;
  }
  if (rc == 0) printf("step.c: %s ok\n", mode);
  fflush(stdout);
  return rc ? 1 : 0;
}
