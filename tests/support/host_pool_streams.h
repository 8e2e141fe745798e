/* host_pool_streams.h - how many streams a host pool knows now (its
 * dump's "streams N"), for the tests of which streams it keeps. */
#ifndef MEMPOOL_TEST_HOST_POOL_STREAMS_H
#define MEMPOOL_TEST_HOST_POOL_STREAMS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/host_pool.h>

static inline unsigned host_pool_streams_known(mp_host_pool_t *hp) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_host_pool_dump(hp, f, "text"), MP_OK, "%s", mp_last_error());
  cr_assert_eq(fclose(f), 0);
  const char *at = strstr(text, "  streams ");
  cr_assert_not_null(at, "no stream count in the dump: %s", text);
  unsigned n = 0;
  cr_assert_eq(sscanf(at, "  streams %u", &n), 1, "%s", at);
  free(text);
  return n;
}

#endif
