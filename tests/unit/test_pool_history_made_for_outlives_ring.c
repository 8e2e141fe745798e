/* A segment's segment_free and a chunk's segment_unmap say the stream the
 * memory was made for after the ring dropped the segment_alloc or
 * segment_map event that said it: the pool keeps the stream with the
 * segment and the chunk. It was looked up in the ring (a walk of every
 * event under the pool lock for each segment freed), and said 0 once the
 * event was gone. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/history_events.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_history_made_for_outlives_ring, "host:capacity=64M");

/* A pool of opts (its ring 4 events) on a new stream *s, holding a block of
 * size made for *s, and alloc/free pairs on *s after it, until the ring
 * holds no event of action. */
static mp_pool_t *wrapped(const char *opts, size_t size, mp_stream_t *s,
                          unsigned action, void **held) {
  cr_assert_eq(mp_stream_create(dev, s), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, opts);
  cr_assert_eq(mp_pool_alloc(pool, size, *s, held), MP_OK, "%s",
               mp_last_error());
  for (int k = 0; k < 8; k++) {
    void *p;
    cr_assert_eq(mp_pool_alloc(pool, 4096, *s, &p), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  }
  uintptr_t got[4];
  cr_assert_eq(history_events_of(pool, action, got, 4), 0,
               "the test needs the ring past the segment's event");
  return pool;
}

static void trim_and_close(mp_pool_t *pool, mp_stream_t s, void *held,
                           unsigned action, const char *what) {
  if (held != NULL)
    cr_assert_eq(mp_pool_free(pool, held), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  history_events_say(pool, action, 0, (uintptr_t)s, what);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(pool_history_made_for_outlives_ring, a_trims_segment_free) {
  mp_stream_t s1;
  void *a;
  mp_pool_t *pool =
      wrapped("virtual=0,history=4", 4096, &s1, MP__H_SEGMENT_ALLOC, &a);
  cr_assert_eq(stats(pool).segment_count, 1, "the test needs one segment");
  trim_and_close(pool, s1, a, MP__H_SEGMENT_FREE, "segment_free");
}

Test(pool_history_made_for_outlives_ring, a_trims_segment_unmap) {
  mp_stream_t s1;
  void *a;
  mp_pool_t *pool =
      wrapped("virtual=1,history=4", 8 * MiB, &s1, MP__H_SEGMENT_MAP, &a);
  trim_and_close(pool, s1, a, MP__H_SEGMENT_UNMAP, "segment_unmap");
}

Test(pool_history_made_for_outlives_ring, a_pauses_unmap) {
  mp_stream_t s1;
  void *a;
  mp_pool_t *pool = wrapped("virtual=1,pausable=1,history=4", 8 * MiB, &s1,
                            MP__H_SEGMENT_MAP, &a);
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  history_events_say(pool, MP__H_SEGMENT_UNMAP, 0, (uintptr_t)s1,
                     "the pause's segment_unmap");
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  trim_and_close(pool, s1, a, MP__H_SEGMENT_UNMAP, "a later segment_unmap");
}
