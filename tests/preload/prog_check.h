/* prog_check.h - what the preload test programs (drv_prog, lookup_prog)
 * share: a check that counts its failures and names each one, and the test
 * of whether a function pointer lives in the shim. Header-only: each
 * program is one executable. */
#ifndef MEMPOOL_TEST_PROG_CHECK_H
#define MEMPOOL_TEST_PROG_CHECK_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures;

static inline void expect(int ok, const char *what) {
  if (!ok) {
    printf("FAILED %s\n", what);
    failures++;
  }
}

/* The file name of the object that defines p ("" when none). */
static inline const char *owner(void *p) {
  Dl_info info;
  if (p == NULL || dladdr(p, &info) == 0 || info.dli_fname == NULL)
    return "";
  return info.dli_fname;
}

static inline int in_shim(void *p) {
  return strstr(owner(p), "libmempool_preload") != NULL;
}

#endif /* MEMPOOL_TEST_PROG_CHECK_H */
