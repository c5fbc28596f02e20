/*
 * expect.h: the checks every C test of the ABI makes. EXPECT(call, want)
 * compares a call's gwResult_t; EXPECT_MSG(comm, needle) looks for a text
 * in gwGetLastError(comm). A failed check is printed with its line and
 * counted in `failures`, which the test turns into its exit status.
 */
#ifndef GW_TEST_EXPECT_H
#define GW_TEST_EXPECT_H

#include <stdio.h>
#include <string.h>

#include "gradwire.h"

static int failures = 0;

#define EXPECT(call, want)                                                                         \
  do {                                                                                             \
    gwResult_t r_ = (call);                                                                        \
    if (r_ != (want)) {                                                                            \
      fprintf(stderr, "%s:%d: %s returned %d (%s), want %d: %s\n", __FILE__, __LINE__, #call, r_,  \
              gwGetErrorString(r_), (int)(want), gwGetLastError(NULL));                            \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

#define EXPECT_MSG(comm, needle)                                                                   \
  do {                                                                                             \
    const char* m_ = gwGetLastError(comm);                                                         \
    if (!m_ || !strstr(m_, (needle))) {                                                            \
      fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__, __LINE__,               \
              m_ ? m_ : "(null)", (needle));                                                       \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

#endif
