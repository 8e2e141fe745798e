/* mp_stream_destroy of a stream no capture holds: the pools forget it
 * around the driver's destroy (mp__stream_destroy_begin, then _end), not
 * before it. A call that names the stream before the driver answers (from
 * another thread) gets a slot of its own, and once the destroy succeeded
 * that slot's handle is dead too: it must match the handle no more. The
 * pools forgot the stream before the destroy, so the slot such a call made
 * stayed matched to the dead handle, and a stream the driver later gave
 * the same handle inherited it (a block freed on the dead stream went to
 * the new one at once, as if the same stream's). Here the fake device's
 * destroy makes that call, as another thread would between the forget and
 * the driver's answer. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

static mp__backend_t backend;
static mp_pool_t *pool;
static void *during; /* allocated and freed on the stream during its destroy */
static unsigned destroys;

static mp_status_t destroy_with_a_call_between(mp_device_t *dev,
                                               mp_stream_t s) {
  destroys++;
  if (pool != NULL) {
    cr_assert_eq(mp_pool_alloc(pool, 4096, s, &during), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_free(pool, during), MP_OK, "%s", mp_last_error());
  }
  return fake_stream_x(dev, s);
}

static bool known(mp_stream_t s) {
  mp__pool_lock(pool);
  bool k = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  return k;
}

Test(pool_stream_used_during_plain_destroy, its_slot_is_forgotten) {
  mp_device_t *dev = fake_open(64u << 20, 0);
  backend = fake_backend;
  backend.stream_destroy = destroy_with_a_call_between;
  dev->ops = &backend;
  pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  cr_assert(known(s));
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(destroys, 1);
  check(pool);
  cr_expect(!known(s),
            "a slot made during the destroy stays matched to the destroyed "
            "stream's handle");
  mp_pool_t *p = pool;
  pool = NULL;
  cr_assert_eq(mp_pool_free(p, a), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p, dev);
}
