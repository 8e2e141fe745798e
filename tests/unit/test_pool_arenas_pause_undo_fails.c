/* A pause of a pool with arenas that fails in the second arena (no
 * page-locked memory left for its content) and whose undo cannot resume
 * the first (another tenant took the memory that arena gave back): the
 * first arena stays paused, its content kept, while the pool runs (pause.c,
 * mp__arenas_pause; pool.h, Arenas: "it stays paused ... until
 * mp_pool_resume"). The threads of the running arena go on, those of the
 * paused one get MP_EBUSY, and mp_pool_resume brings that arena back with
 * its content once the device has room: nothing is lost. The state the
 * shim's process-wide resume must take for paused
 * (test_preload_pause_arena_left_paused). White-box: it looks at the
 * arenas. A guard of the pool's own path, which no test reached. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

static unsigned host_allocs;

/* The second page-locked allocation (the second arena's copy of its
 * content) fails, and then the device has no room left: another tenant
 * took what the first arena gave back. */
static mp_status_t second_host_alloc_fails(mp_device_t *d, size_t bytes,
                                           void **out) {
  if (++host_allocs == 2) {
    fake_of(d)->capacity = fake_of(d)->used;
    return mp__fail(MP_ENOMEM, "fake host_alloc #2 of %zu bytes fails", bytes);
  }
  return flaky_host_alloc(d, bytes, out);
}

Test(pool_arenas_pause_undo_fails, the_arena_left_paused_resumes_whole) {
  mp_device_t *fdev = flaky_open(0);
  flaky_backend.host_alloc = second_host_alloc_fails;
  host_allocs = 0;
  mp_pool_t *pool = make_pool(fdev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0xa0, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0xb0, .count = 1};
  two_arenas(pool, &a, &b);
  mp_pool_t *a0 = mp__arena_at(pool, 0), *a1 = mp__arena_at(pool, 1);
  size_t capacity = fake_of(fdev)->capacity;

  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_ENOMEM, "%s",
               mp_last_error());
  cr_expect(strstr(mp_last_error(), "could not be resumed") != NULL, "%s",
            mp_last_error());
  cr_assert(mp__pool_is_paused(a0), "the arena the undo could not resume");
  cr_assert(!mp__pool_is_paused(a1), "the arena whose pause failed runs");
  cr_assert(!mp__pool_is_paused(pool), "the pool runs");
  cr_expect_not_null(a0->pause_copy, "its content kept");

  /* The other tenant leaves. The running arena's thread goes on; the
   * paused one's is refused until the resume. */
  fake_of(fdev)->capacity = capacity;
  worker_t *w0 = arena_holding(pool, a.ptrs[0]) == 0 ? &wa : &wb;
  worker_t *w1 = w0 == &wa ? &wb : &wa;
  job_t *j0 = w0 == &wa ? &a : &b, *j1 = w0 == &wa ? &b : &a;
  job_t c = {.pool = pool, .bytes = 4096, .tag = 0xc0, .count = 1};
  cr_expect_eq(on_worker(w1, &c, ALLOC), MP_OK, "%s", c.why);
  cr_expect_eq(on_worker(w1, &c, FREE), MP_OK, "%s", c.why);
  job_t d = {.pool = pool, .bytes = 4096, .tag = 0xd0, .count = 1};
  cr_expect_eq(on_worker(w0, &d, ALLOC), MP_EBUSY, "%s", d.why);

  /* mp_pool_resume brings it back whole. */
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect(!mp__pool_is_paused(a0));
  cr_expect_null(a0->pause_copy, "the host copy went with the resume");
  expect_kept(j0);
  expect_kept(j1);
  cr_expect_eq(mp_pool_resume(pool), MP_EINVAL, "nothing left to resume");
  cr_expect_eq(on_worker(w0, j0, FREE), MP_OK, "%s", j0->why);
  cr_expect_eq(on_worker(w1, j1, FREE), MP_OK, "%s", j1->why);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}
