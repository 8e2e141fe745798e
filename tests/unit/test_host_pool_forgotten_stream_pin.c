/* test_host_pool_forgotten_stream_pin.c - an mp_host_pool_alloc whose
 * stream is forgotten (destroyed) while it is in flight ends its hold on
 * the slot it made, not on the slot the handle has by then.
 *
 * mp_host_pool_alloc on a stream the pool has not met makes the stream's
 * slot and pins it for the call (mp__stream_pin, host_pool.c's
 * mp__hp_enter), so that no other call's refusal takes it back under it;
 * the call's end unpins it (mp__stream_unpin), and the last call of a
 * fresh slot, refused, takes the slot back. The program may destroy the
 * stream meanwhile, from another thread: every pool forgets the handle
 * (mp_stream_forget), and a new stream may be given the same handle (the
 * CUDA driver reuses handles; mp_stream_forget's promise: "a new stream
 * given the same handle is a new stream to the pool"). A call on the new
 * stream makes a new slot and pins it. The unpin found its slot by the
 * handle: the first call's end took the second call's pin and, refused,
 * took the new slot back under the second call, whose record then made
 * it again (asking the device about the stream once more; refused where
 * host memory had run out meanwhile, the buffer freed and its chunk left
 * cached). Now each pin names the making of its slot (fresh_id), and a
 * call whose slot was forgotten leaves the new one alone.
 *
 * White-box, on the pool's own calls, in the order the threads would make
 * them: the window the race needs (the second call between its slot and
 * its record while the first one ends) has no device call outside the
 * pool's lock to hold a thread in, so the interleaving is written out
 * here rather than timed. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(host_pool_forgotten_stream_pin, "host:capacity=64M");

/* The slot of s made by a call of mp_host_pool_alloc, pinned for it (as
 * mp__hp_make): its pin. */
static uint64_t make_pinned(mp_pool_t *pool, mp_stream_t s) {
  uint64_t pin = 0;
  uint32_t i;
  mp__pool_lock(pool);
  cr_assert_eq(mp__stream_index(pool, s, &i), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__stream_pin(pool, s, true, &pin), 1);
  mp__pool_unlock(pool);
  cr_assert_neq(pin, 0);
  return pin;
}

/* The end of a call that pinned s's slot with pin: true when the slot went. */
static bool unpin(mp_pool_t *pool, mp_stream_t s, uint64_t pin, bool served) {
  mp__pool_lock(pool);
  bool went = mp__stream_unpin(pool, s, pin, served);
  mp__pool_unlock(pool);
  return went;
}

static bool known(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  bool k = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  return k;
}

/* Call A makes s's slot; s is forgotten (destroyed, its handle a new
 * stream's); call C makes the new stream's slot; then A ends. */
static void race(mp_pool_t *pool, mp_stream_t s, bool a_served) {
  uint64_t a = make_pinned(pool, s);
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_not(known(pool, s), "s not forgotten");
  uint64_t c = make_pinned(pool, s);
  cr_expect_neq(a, c, "two makings of a slot share a pin");
  cr_expect_not(unpin(pool, s, a, a_served),
                "A's end took back the slot C made for the new stream");
  cr_expect(known(pool, s), "C's slot went under C");
  /* C refused: its slot goes with it, as a single refused call's does
   * (kept, if A's end had taken C's pin or settled the slot). */
  cr_expect(unpin(pool, s, c, false),
            "C's refusal left the slot nothing used (A's end took its pin)");
  cr_expect_not(known(pool, s));
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

/* race() on a pool of its own and a stream of its own. */
static void race_on_new_pool(bool a_served) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  race(pool, s, a_served);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}

Test(host_pool_forgotten_stream_pin, a_refusal_leaves_the_new_slot_alone) {
  race_on_new_pool(false);
}

/* A served (its buffer uses the slot it made, forgotten since): its end
 * does not settle C's slot either. */
Test(host_pool_forgotten_stream_pin, a_served_call_leaves_the_new_slot_fresh) {
  race_on_new_pool(true);
}
