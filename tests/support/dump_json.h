/* dump_json.h - a pool's mp_pool_dump as a string, and the segments of a
 * JSON dump, for the tests of what a dump says (test_pool_pause.c, unit
 * and integration). */
#ifndef MEMPOOL_TEST_DUMP_JSON_H
#define MEMPOOL_TEST_DUMP_JSON_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

/* pool's dump in format as a string (the caller frees it). Not inlined:
 * inlined into a test at -O3, gcc took the dump for a pointer to the
 * stream's local and stopped the Release build (-Wdangling-pointer). */
__attribute__((noinline, unused)) static char *dump_of(mp_pool_t *p,
                                                       const char *format) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_dump(p, f, format), MP_OK, "%s", mp_last_error());
  fclose(f);
  return text;
}

/* The sum of the segments' sizes in a JSON dump (a segment's kind is
 * followed by its size; the pool's by its stats), their count in *n, and
 * in *paused how many say "paused":true. */
static inline size_t json_segments(const char *text, size_t *n,
                                   size_t *paused) {
  size_t sum = 0;
  *n = *paused = 0;
  for (const char *at = text; (at = strstr(at, "\"kind\":\"")) != NULL;) {
    at = strchr(at + 8, '"') + 1;
    size_t v;
    int used = 0;
    if (sscanf(at, ",\"size\":%zu,%n", &v, &used) == 1 && used > 0) {
      sum += v;
      (*n)++;
      *paused += strncmp(at + used, "\"paused\":true,", 14) == 0;
    }
  }
  return sum;
}

/* json_segments of pool's JSON dump. */
static inline size_t json_dump_segments(mp_pool_t *p, size_t *n,
                                        size_t *paused) {
  char *text = dump_of(p, "json");
  size_t sum = json_segments(text, n, paused);
  free(text);
  return sum;
}

#endif /* MEMPOOL_TEST_DUMP_JSON_H */
