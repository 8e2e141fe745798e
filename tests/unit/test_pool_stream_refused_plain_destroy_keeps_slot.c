/* mp_stream_destroy that the device refuses changes nothing (status.h): the
 * stream lives on, and every pool still knows it by the slot it had, its
 * epochs as they were, so that a free on it waits for its work as before.
 * The pools forgot it before the destroy and never met it again: the
 * stream lived on unknown (a call naming it made a new slot, the old one's
 * marks gone). A call that names the stream while the driver is asked
 * (another thread's) makes a slot of its own, which the refusal forgets in
 * favour of the stream's own slot. The refusal's why stays the last
 * error. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

static mp__backend_t backend;
static mp_pool_t *pool;
static bool call_between;
static unsigned destroys;

static mp_status_t refuse_destroy(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  destroys++;
  if (call_between) {
    void *v = NULL;
    cr_assert_eq(mp_pool_alloc(pool, 4096, s, &v), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_free(pool, v), MP_OK, "%s", mp_last_error());
  }
  return mp__fail(MP_EDRIVER, "fake device: stream destroy refused");
}

/* The slot a call naming s uses, or UINT32_MAX where none is live. */
static uint32_t slot_of(mp_stream_t s) {
  mp__pool_lock(pool);
  uint32_t i = UINT32_MAX;
  if (!mp__stream_known(pool, s) || mp__stream_lookup(pool, s, &i) != MP_OK ||
      pool->streams[i].gone)
    i = UINT32_MAX;
  mp__pool_unlock(pool);
  return i;
}

static void run(bool between) {
  mp_device_t *dev = fake_open(64u << 20, 0);
  backend = fake_backend;
  backend.stream_destroy = refuse_destroy;
  dev->ops = &backend;
  pool = make_pool(dev, NULL);
  call_between = between;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  uint32_t before = slot_of(s);
  cr_assert_neq(before, UINT32_MAX);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_EDRIVER);
  cr_assert_eq(destroys, 1);
  cr_expect(strstr(mp_last_error(), "stream destroy refused") != NULL,
            "the refusal's why was replaced: %s", mp_last_error());
  check(pool);
  cr_expect_eq(slot_of(s), before,
               "after a refused destroy the stream's slot is %u, not %u",
               slot_of(s), before);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  backend.stream_destroy = fake_stream_x;
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(slot_of(s), UINT32_MAX);
  fake_pool_finish(pool, dev);
}

Test(pool_stream_refused_plain_destroy, keeps_the_streams_slot) {
  run(false);
}

Test(pool_stream_refused_plain_destroy,
     keeps_the_streams_slot_over_one_made_meanwhile) {
  run(true);
}
