/* A per-thread default stream whose slot cannot be made (host memory for
 * the stream table runs out) leaves the pool as it was (status.h): it is
 * not put in the process's list of pools whose threads retire their
 * per-thread slots at exit (stream.c, mp__pt_register). The refused add
 * registered the pool first, then the table refused: every thread's exit
 * visited a pool that had no per-thread slot. White-box: a fake device
 * with one per-thread handle, and the host-memory fault injection
 * (fault.c). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"
#include "pt_device.h"

Test(pool_per_thread_add_refused_leaves_unregistered, not_in_the_list) {
  mp_device_t *d = pt_device();
  /* Another pool's per-thread slot first: registering this one then takes
   * no host memory of its own. */
  mp_pool_t *p0 = pt_pool_first(d);
  void *x;
  mp_pool_t *pool = make_pool(d, NULL);
  /* No host memory at all: the table (a fresh pool's hash) refuses. */
  mp__fault_host_every(true);
  mp_status_t st = mp_pool_alloc(pool, 4096, PT_STREAM, &x);
  mp__fault_host_every(false);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  cr_assert(strstr(mp_last_error(), "stream table") != NULL,
            "the test needs the add refused: %s", mp_last_error());
  mp__pool_lock(pool);
  bool registered = pool->pt_registered;
  bool known = mp__stream_known(pool, PT_STREAM);
  mp__pool_unlock(pool);
  cr_expect(!known, "a slot for the refused stream");
  cr_expect(!registered, "the refused add put the pool in the list of pools "
                         "with per-thread slots");

  cr_assert_eq(mp_pool_alloc(pool, 4096, PT_STREAM, &x), MP_OK, "%s",
               mp_last_error());
  mp__pool_lock(pool);
  cr_expect(pool->pt_registered, "the slot made registers the pool");
  mp__pool_unlock(pool);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p0, d);
}
