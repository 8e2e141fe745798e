/* mp_pool_destroy when the device refuses an unmap of the pool's virtual
 * range (pool.h: a free refused at destroy is reported, the pool destroyed
 * all the same, that memory lost to it): the status and message say so,
 * as for a plain segment. Before, the refusal was dropped and the destroy
 * said MP_OK with a chunk still mapped on the device (and counted it as a
 * device free). */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

static void destroy_refused(size_t chunks, unsigned fail_at) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, "segment_bytes=2M");
  void *b[4];
  for (size_t i = 0; i < chunks; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &b[i]), MP_OK, "%s",
                 mp_last_error());
  for (size_t i = 0; i < chunks; i++)
    cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  check(p);
  unmap_calls = 0;
  unmap_fail_at = fail_at;
  cr_expect_eq(mp_pool_destroy(p), MP_EDRIVER, "the refusal went unsaid");
  cr_expect(strstr(mp_last_error(), "mp_pool_destroy") != NULL &&
                strstr(mp_last_error(), "unmap") != NULL &&
                strstr(mp_last_error(), "fake vm_unmap") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 2 * MiB, "one chunk stays mapped");
  unmap_fail_at = 0;
  fake_close(dev);
}

Test(pool_destroy_unmap_refused, the_only_chunk_is_reported) {
  destroy_refused(1, 1);
}

Test(pool_destroy_unmap_refused, a_chunk_among_others_is_reported) {
  destroy_refused(3, 2);
}
