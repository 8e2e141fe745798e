/* A per-thread default stream whose slot cannot be made (host memory for
 * the stream table runs out) leaves the pool as it was: has_pt says that
 * a per-thread slot exists, and with it set every later call takes the
 * rare path (pool->rare). A refused add set it before the slot was made,
 * and kept it. White-box: a fake device with one per-thread handle, and
 * the host-memory fault injection (fault.c). */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"
#include "pt_device.h"

/* Enough shared streams that the next one needs the stream table and its
 * hash to grow (host memory). */
#define SHARED 8

Test(pool_per_thread_add_refused, leaves_no_per_thread_mark) {
  mp_device_t *d = pt_device();
  /* Another pool's per-thread slot first: the faults below land in this
   * pool's table. */
  mp_pool_t *p0 = pt_pool_first(d);
  void *x;

  mp_pool_t *pool = make_pool(d, NULL);
  void *b[SHARED];
  for (uintptr_t k = 0; k < SHARED; k++)
    cr_assert_eq(
        mp_pool_alloc(pool, 4096, (mp_stream_t)(0x1000 + 0x100 * k), &b[k]),
        MP_OK, "%s", mp_last_error());
  mp__pool_lock(pool);
  uint32_t rare = pool->rare;
  cr_assert(!pool->has_pt);
  mp__pool_unlock(pool);

  int refused = 0;
  mp_status_t st = MP_ENOMEM;
  for (long k = 0; k < 100 && st != MP_OK; k++) {
    mp__fault_host_after(k);
    st = mp_pool_alloc(pool, 4096, PT_STREAM, &x);
    bool fired = !mp__fault_host_pending();
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    refused++;
    cr_assert(fired, "k=%ld: status %d without the fault: %s", k, st,
              mp_last_error());
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    check(pool);
    mp__pool_lock(pool);
    bool has_pt = pool->has_pt, known = mp__stream_known(pool, PT_STREAM);
    uint32_t now = pool->rare;
    mp__pool_unlock(pool);
    cr_expect(!known, "k=%ld: a slot for the refused stream", k);
    cr_expect(!has_pt,
              "k=%ld: the refused add left has_pt set with no "
              "per-thread slot",
              k);
    cr_expect_eq(now, rare, "k=%ld: the refused add left the rare path on", k);
  }
  cr_assert(refused > 0, "no host allocation of the add could be refused");
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  /* Once made, the slot is a per-thread one. */
  mp__pool_lock(pool);
  cr_expect(pool->has_pt);
  mp__pool_unlock(pool);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  for (int k = 0; k < SHARED; k++)
    cr_assert_eq(mp_pool_free(pool, b[k]), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p0, d);
}
