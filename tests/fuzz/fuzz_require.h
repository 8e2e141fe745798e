/* fuzz_require.h - the harnesses' check: a broken expectation traps, so
 * that libFuzzer (and the ctest replay) report the input that broke it,
 * with the condition, the place and the library's last error. */
#ifndef MEMPOOL_FUZZ_REQUIRE_H
#define MEMPOOL_FUZZ_REQUIRE_H

#include <stdio.h>

#include <mempool/status.h>

#define FZ_REQUIRE(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond,    \
              mp_last_error());                                                \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

#endif /* MEMPOOL_FUZZ_REQUIRE_H */
