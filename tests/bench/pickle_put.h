/* pickle_put.h - pickle bytes written by hand in mpbench's snapshot tests. */
#ifndef MPBENCH_TEST_PICKLE_PUT_H
#define MPBENCH_TEST_PICKLE_PUT_H

#include <string.h>

/* Appends s (under 256 bytes) as a SHORT_BINUNICODE str to the pickle at
 * p; returns the end. */
static inline char *pk_put_str(char *p, const char *s) {
  size_t n = strlen(s);
  *p++ = (char)0x8c;
  *p++ = (char)n;
  memcpy(p, s, n);
  return p + n;
}

#endif /* MPBENCH_TEST_PICKLE_PUT_H */
