/* A stream named to a pool while the preload shim has its slot set aside
 * (around the real cuStreamDestroy of a capturing stream, another thread
 * still using it): the set-aside slot is matched by no handle, so the call
 * gets a slot of its own, found by the hash, and never records on the
 * set-aside one, even when that slot was the pool's last. White-box: it
 * calls the shim's set-aside entry points itself (stream.c). */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_stream_named_while_set_aside, "host:capacity=64M");

/* Under the lock: the slot a call naming s uses is not a set-aside one,
 * and the table knows s by its hash. */
static void slot_is_live(mp_pool_t *pool, mp_stream_t s, const char *when) {
  mp__pool_lock(pool);
  uint32_t i = UINT32_MAX;
  mp_status_t st = mp__stream_lookup(pool, s, &i);
  bool gone = st == MP_OK && pool->streams[i].gone;
  bool known = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  cr_assert_eq(st, MP_OK, "%s: %s", when, mp_last_error());
  cr_assert(!gone, "%s: the call used the set-aside slot %u", when, i);
  cr_assert(known, "%s: the stream has no slot the hash finds", when);
}

static void run(bool destroyed) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  /* The set-aside slot was the pool's last one. */
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &b), MP_OK, "%s", mp_last_error());
  slot_is_live(pool, s, "while the old slot is set aside");
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside_end(dev, s, destroyed, false);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  slot_is_live(pool, s, "after the set-aside ended");
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_stream_named_while_set_aside, gets_a_slot_of_its_own_then_kept) {
  run(false);
}

Test(pool_stream_named_while_set_aside, gets_a_slot_of_its_own_then_dropped) {
  run(true);
}
