/* mapped_bytes.h - for tests that check memory is given back to the OS:
 * how many bytes of address space the test process has mapped now. */
#ifndef MEMPOOL_TESTS_MAPPED_BYTES_H
#define MEMPOOL_TESTS_MAPPED_BYTES_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

static inline size_t mapped_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  cr_assert_not_null(f);
  size_t pages = 0;
  cr_assert_eq(fscanf(f, "%zu", &pages), 1);
  fclose(f);
  return pages * (size_t)sysconf(_SC_PAGESIZE);
}

#endif
