/* mp_pool_dump on a pool with arenas (arenas=N, src/pool/arena.c): every
 * arena's segments and blocks (each segment naming its arena), the stats
 * as mp_pool_get_stats sums them, the free lists of every arena; in text,
 * JSON and torch's names, also while paused. Was MP_EINVAL. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/dump_json.h"
#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_arenas_dump, "host:capacity=64M");

/* Whether text holds "<key><value>". */
static bool says(const char *text, const char *key, size_t value) {
  char want[128];
  snprintf(want, sizeof want, "%s%zu", key, value);
  return strstr(text, want) != NULL;
}

static bool names_block(const char *text, const char *fmt, void *p) {
  char want[64];
  snprintf(want, sizeof want, fmt, p);
  return strstr(text, want) != NULL;
}

Test(pool_arenas_dump, every_arenas_blocks_and_the_summed_stats) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 64 * 1024, .tag = 1, .count = 3};
  job_t b = {.pool = pool, .bytes = 3 << 20, .tag = 2, .count = 2};
  two_arenas(pool, &a, &b);
  int ia = arena_holding(pool, a.ptrs[0]), ib = arena_holding(pool, b.ptrs[0]);
  mp_stats_t s = stats(pool);
  char tag[32];

  char *text = dump_of(pool, "text");
  cr_expect(says(text, "  reserved ", s.reserved_bytes), "%s", text);
  cr_expect(says(text, "allocated ", s.allocated_bytes), "%s", text);
  snprintf(tag, sizeof tag, " arena %d\n", ia);
  cr_expect(strstr(text, tag) != NULL, "no segment of arena %d: %s", ia, text);
  snprintf(tag, sizeof tag, " arena %d\n", ib);
  cr_expect(strstr(text, tag) != NULL, "no segment of arena %d: %s", ib, text);
  for (int i = 0; i < a.count; i++)
    cr_expect(names_block(text, "block %p size", a.ptrs[i]), "%s", text);
  for (int i = 0; i < b.count; i++)
    cr_expect(names_block(text, "block %p size", b.ptrs[i]), "%s", text);
  cr_expect(strstr(text, "free lists by class:\n    class ") != NULL,
            "both arenas' free remainders: %s", text);
  free(text);

  char *json = dump_of(pool, "json");
  cr_expect(says(json, "\"reserved_bytes\":", s.reserved_bytes), "%s", json);
  cr_expect(says(json, "\"live_blocks\":", 5), "%s", json);
  cr_expect(says(json, "\"arena\":", (size_t)ia), "%s", json);
  cr_expect(says(json, "\"arena\":", (size_t)ib), "%s", json);
  for (int i = 0; i < a.count; i++)
    cr_expect(names_block(json, "\"addr\":\"%p\"", a.ptrs[i]), "%s", json);
  for (int i = 0; i < b.count; i++)
    cr_expect(names_block(json, "\"addr\":\"%p\"", b.ptrs[i]), "%s", json);
  size_t n = strlen(json);
  cr_expect(n > 3 && json[0] == '{' && strcmp(json + n - 3, "]}\n") == 0, "%s",
            json);
  free(json);

  char *torch = dump_of(pool, "torch");
  cr_expect(says(torch, "\"reserved_bytes.all.current\":", s.reserved_bytes),
            "%s", torch);
  cr_expect(says(torch, "\"allocation.all.current\":", 5), "%s", torch);
  cr_expect(says(torch, "\"segment.all.current\":", s.segment_count), "%s",
            torch);
  free(torch);

  /* Paused: still dumped (pool.h), nothing reserved. */
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  torch = dump_of(pool, "torch");
  cr_expect(says(torch, "\"reserved_bytes.all.current\":", 0), "%s", torch);
  cr_expect(says(torch, "\"allocation.all.current\":", 5), "%s", torch);
  free(torch);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());

  cr_expect_eq(mp_pool_dump(pool, stdout, "xml"), MP_EINVAL);
  cr_expect_eq(mp_pool_dump(pool, NULL, "text"), MP_EINVAL);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
