// COHORT_CHECK: aborts on programmer errors only. Never use it on input that
// came from a socket, a file or the command line; return a Status instead.
#ifndef COHORT_COMMON_CHECK_H_
#define COHORT_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define COHORT_CHECK(cond)                                                          \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#endif  // COHORT_COMMON_CHECK_H_
