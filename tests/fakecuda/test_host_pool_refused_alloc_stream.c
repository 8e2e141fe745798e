/* An allocation the host pool refuses for its size (one past the cap, or
 * that cannot be rounded) leaves its stream unknown to the pool: trim and
 * destroy wait only for the streams that used the pool (host_pool.h), and
 * a stream that never got a buffer did not. The slot was made before the
 * size was looked at, so trim and destroy then waited for it, and were
 * refused (MP_EBUSY) while it captured: waiting for a capturing stream
 * would put an event into its graph (cuda.h, cuStreamBeginCapture). */
#include <stdint.h>

#include "host_pool_capture.h"

/* A chunk cached (a buffer used on the default stream, freed) for trim to
 * give back, then refused sizes on a, and a capture of a begun. */
static void setup(void) {
  hpc_setup();
  hpc_used_on(NULL);
  void *p = &p;
  mp_status_t st = mp_host_pool_alloc(hp, SIZE_MAX - 1, a, &p);
  cr_assert_neq(st, MP_OK);
  cr_assert_eq(p, &p, "*out changed");
  st = mp_host_pool_alloc(hp, (size_t)1 << 62, a, &p);
  cr_assert_neq(st, MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, 0, a, &p), MP_OK);
  hpc_capture_begin();
}

TestSuite(host_pool_refused_alloc_stream, .init = setup, .fini = hpc_teardown);

Test(host_pool_refused_alloc_stream, trim_during_its_capture) {
  mp_status_t st = mp_host_pool_trim(hp, 0);
  hpc_capture_end();
  cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_host_pool_get_stats(hp, &s), MP_OK);
  cr_expect_eq(s.reserved_bytes, 0);
}

Test(host_pool_refused_alloc_stream, destroy_during_its_capture) {
  mp_status_t st = mp_host_pool_destroy(hp);
  hpc_capture_end();
  cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  if (st == MP_OK)
    hp = NULL;
}
