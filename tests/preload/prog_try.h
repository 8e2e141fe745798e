/* prog_try.h - the preload test programs' MP_TRY(call): a driver call that
 * must succeed, or the program says which failed and returns 1. */
#ifndef MEMPOOL_TEST_PROG_TRY_H
#define MEMPOOL_TEST_PROG_TRY_H

#include <stdio.h>

#define MP_TRY(call)                                                           \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      printf("%s: error %d\n", #call, (int)r_);                                \
      return 1;                                                                \
    }                                                                          \
  } while (0)

#endif /* MEMPOOL_TEST_PROG_TRY_H */
