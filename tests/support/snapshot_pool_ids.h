/* snapshot_pool_ids.h - for tests of mp_pool_snapshot's segment_pool_id:
 * read from the pickle without a pickle reader. */
#ifndef MEMPOOL_TESTS_SNAPSHOT_POOL_IDS_H
#define MEMPOOL_TESTS_SNAPSHOT_POOL_IDS_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

/* The segment_pool_id of each segment of pool's snapshot, in ids[] (at
 * most max; returns how many): the key, then two BININTs and TUPLE2, as
 * snapshot.c writes them. */
static inline size_t snapshot_pool_ids(mp_pool_t *pool, uint64_t ids[][2],
                                       size_t max) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_snapshot_file(pool, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  static const char key[] = "X\x0f\0\0\0segment_pool_id";
  size_t n = 0;
  for (char *at = buf; (at = memmem(at, len - (size_t)(at - buf), key,
                                    sizeof key - 1)) != NULL;) {
    const unsigned char *v = (const unsigned char *)at + sizeof key - 1;
    cr_assert(v[0] == 'J' && v[5] == 'J' && v[10] == 0x86,
              "segment_pool_id is no tuple of two BININTs");
    cr_assert_lt(n, max);
    for (int k = 0; k < 2; k++)
      ids[n][k] = (uint64_t)v[1 + 5 * k] | (uint64_t)v[2 + 5 * k] << 8 |
                  (uint64_t)v[3 + 5 * k] << 16 | (uint64_t)v[4 + 5 * k] << 24;
    n++;
    at = (char *)v;
  }
  free(buf);
  return n;
}

#endif
