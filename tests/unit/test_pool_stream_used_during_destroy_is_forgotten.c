/* A capturing stream the program destroys has its slot set aside around
 * the driver's destroy (the preload shim: mp__stream_set_aside, then
 * mp__stream_set_aside_end); a call that names the stream meanwhile (from
 * another thread) gets a slot of its own. Once the destroy succeeded that
 * slot's handle is dead too: it must match the handle no more. It stayed
 * matched, so that a stream the driver later gave the same handle
 * inherited it: a block freed on the dead stream went to the new one at
 * once, as if the same stream's, while the dead stream's work on it could
 * still run (cuStreamDestroy returns before that work is done, cuda.h).
 * White-box: calls the shim's set-aside entry points itself (stream.c). */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_stream_used_during_destroy, "host:capacity=64M");

static void run(bool over) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL, *c = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  /* Work of the stream still queued when it is destroyed. */
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK, "%s",
               mp_last_error());
  mp__stream_set_aside(dev, s);
  /* Another thread's use of the stream during its destroy: a block
   * allocated on it and freed there (its work may use it). */
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  /* The driver destroyed it. */
  mp__stream_set_aside_end(dev, s, true, over);
  check(pool);
  mp__pool_lock(pool);
  bool known = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  cr_expect(!known, "a slot stays matched to the destroyed stream's handle");
  /* A new stream with that handle (here the same host stream, which the
   * pool must take for a new one): the block freed on the dead stream is
   * not its own. */
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &c), MP_OK, "%s", mp_last_error());
  cr_expect_neq(c, b,
                "a new stream with the dead one's handle got the block freed "
                "on it at once, its work still queued");
  check(pool);
  cr_assert_eq(mp_pool_free(pool, c), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  gate_open(&g);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gate_destroy(&g);
}

Test(pool_stream_used_during_destroy, its_slot_is_forgotten_with_the_stream) {
  run(false);
}

Test(pool_stream_used_during_destroy,
     its_slot_is_forgotten_with_the_stream_and_its_capture) {
  run(true);
}
