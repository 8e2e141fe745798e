/* Free neighbours kept apart because one of them waits for a device sync
 * and the other does not (block.c, mp__sync_apart): here the waiting one
 * is a block used on more streams than its record names (MP__B_SYNC at
 * its free). Once the sync it waits for has passed, the pair joins for the
 * next request that needs both halves, before the pool grows or fails.
 * White-box: one test synchronizes the pool as its out-of-memory ladder,
 * defragmentation and that ladder's last wait do, without a trim after. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)
/* Uses on more streams than a block's record holds (MP__MAX_DEPS). */
#define NUSES (MP__MAX_DEPS + 1)

MP_DEVICE_SUITE(pool_sync_apart, "host");

static mp_stream_t s[NUSES + 1];

static void streams_make(void) {
  for (int i = 0; i <= NUSES; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK, "%s", mp_last_error());
}

static void streams_destroy(void) {
  for (int i = 0; i <= NUSES; i++)
    mp_stream_destroy(dev, s[i]);
}

/* Allocates n blocks of the sizes given on s[0], each just above the one
 * before. */
static void alloc_row(mp_pool_t *pool, void **p, const size_t *size, int n) {
  for (int i = 0; i < n; i++) {
    cr_assert_eq(mp_pool_alloc(pool, size[i], s[0], &p[i]), MP_OK, "%s",
                 mp_last_error());
    if (i > 0)
      cr_assert_eq((char *)p[i], (char *)p[i - 1] + size[i - 1]);
  }
}

/* Frees p after uses on streams s[1..NUSES]: it waits for a device sync. */
static void free_used_everywhere(mp_pool_t *pool, void *p) {
  for (int i = 1; i <= NUSES; i++)
    cr_assert_eq(mp_pool_record_stream(pool, p, s[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
}

/* A child never grows: its ladder synchronizes, and its trim (which walks
 * the pairs kept apart elsewhere) gives nothing back. The request the
 * pair holds once joined failed with MP_ELIMIT at the first try (the
 * search after the sync did not join the pair), and served at the
 * second. */
Test(pool_sync_apart, a_child_serves_from_a_pair_once_its_ladder_synced) {
  streams_make();
  mp_pool_t *parent = make_pool(dev, NULL), *child;
  cr_assert_eq(mp_pool_create_child(parent, 4 * MiB, &child), MP_OK, "%s",
               mp_last_error());
  void *p[3];
  const size_t size[3] = {MiB, MiB, 2 * MiB};
  alloc_row(child, p, size, 3);
  cr_assert_eq(mp_pool_free(child, p[1]), MP_OK);
  free_used_everywhere(child, p[0]); /* apart from p[1] until the sync */
  void *q = NULL;
  cr_expect_eq(mp_pool_alloc(child, 2 * MiB, s[0], &q), MP_OK,
               "the pair was not joined after the sync: %s", mp_last_error());
  cr_expect_eq(q, p[0]);
  cr_expect_eq(stats(child).oom_count, 0);
  check(child);
  if (q != NULL)
    cr_assert_eq(mp_pool_free(child, q), MP_OK);
  cr_assert_eq(mp_pool_free(child, p[2]), MP_OK);
  cr_assert_eq(mp_pool_destroy(child), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  streams_destroy();
}

/* Pair A's sync has passed (a sync with no walk after it), then pair B is
 * kept apart for a later one. A request that A holds joined must find it,
 * not grow the pool: the record of the pairs owed a walk named B's sync
 * alone, the later one, and hid A's until then. */
Test(pool_sync_apart, a_later_pair_does_not_keep_an_earlier_one_apart) {
  streams_make();
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p[6];
  const size_t size[6] = {MiB, MiB, 2 * MiB, MiB, MiB, 2 * MiB};
  alloc_row(pool, p, size, 6);
  size_t reserved = stats(pool).reserved_bytes;
  cr_assert_eq(mp_pool_free(pool, p[1]), MP_OK);
  free_used_everywhere(pool, p[0]); /* A: p[0] waits, p[1] beside it */
  mp__pool_lock(pool);
  cr_assert_eq(mp__pool_sync(pool), MP_OK, "%s", mp_last_error());
  mp__pool_unlock(pool);
  cr_assert_eq(mp_pool_free(pool, p[4]), MP_OK);
  free_used_everywhere(pool, p[3]); /* B: p[3] waits for the next sync */
  void *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s[0], &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(q, p[0], "A was not joined");
  cr_expect_eq(stats(pool).reserved_bytes, reserved, "the pool grew");
  check(pool);
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[2]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[5]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  streams_destroy();
}
