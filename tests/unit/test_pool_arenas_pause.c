/* Pause and resume of a pool with arenas (arenas=N, src/pool/arena.c and
 * pause.c): every arena made pauses and resumes, the content of each kept;
 * every call pool.h refuses while paused is MP_EBUSY from any thread, one
 * whose arena is not made yet included (no arena is made while paused); a
 * pause failing in one arena resumes the others, and a resume failing in
 * one unmaps the others, so the pool is paused wholly or not at all.
 * White-box: it looks at the arenas. */
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

static bool arena_paused(mp_pool_t *pool, size_t i) {
  return mp__pool_is_paused(mp__arena_at(pool, i));
}

/* ---- on the host device ------------------------------------------------ */
MP_DEVICE_SUITE(pool_arenas_pause, "host:capacity=64M");

Test(pool_arenas_pause, every_arena_pauses_and_resumes_with_its_content) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 3 * MiB, .tag = 0x10, .count = 2};
  job_t b = {.pool = pool, .bytes = 100000, .tag = 0x20, .count = 3};
  two_arenas(pool, &a, &b);
  mp_stats_t held = stats(pool);
  size_t free_before = free_bytes(dev);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      cr_expect(arena_paused(pool, i), "arena %zu is not paused", i);
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.free_bytes, 0);
  cr_expect_eq(s.allocated_bytes, held.allocated_bytes);
  cr_expect_eq(free_bytes(dev), free_before + held.reserved_bytes,
               "every arena's memory went back to the device");
  /* Another tenant uses what the pause gave back. */
  void *big;
  size_t room = free_bytes(dev);
  cr_assert_eq(mp_device_alloc(dev, room, &big), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_memset_async(dev, big, 0x5a, room, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mp_device_free(dev, big), MP_OK);

  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  s = stats(pool);
  cr_expect_eq(s.reserved_bytes, held.reserved_bytes);
  cr_expect_eq(s.free_bytes, held.free_bytes);
  expect_kept(&a);
  expect_kept(&b);
  check(pool);
  /* Running again: each thread frees the other's blocks. */
  cr_expect_eq(on_worker(&wa, &b, FREE), MP_OK, "%s", b.why);
  cr_expect_eq(on_worker(&wb, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
}

Test(pool_arenas_pause, every_call_is_ebusy_while_paused_from_any_thread) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 4096, .tag = 0x30, .count = 4};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x40, .count = 2};
  two_arenas(pool, &a, &b);
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t before = stats(pool);
  /* The threads holding arenas: allocation and every kind of free. */
  job_t more = a;
  cr_expect_eq(on_worker(&wa, &more, ALLOC), MP_EBUSY);
  cr_expect(strstr(more.why, "paused") != NULL, "%s", more.why);
  job_t big = b; /* a large request would borrow another arena's block */
  cr_expect_eq(on_worker(&wb, &big, ALLOC), MP_EBUSY);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_EBUSY);
  cr_expect_eq(on_worker(&wb, &b, FREE_ASYNC), MP_EBUSY);
  cr_expect_eq(on_worker(&wa, &b, RECORD), MP_EBUSY);
  /* A thread whose arena is not made yet: refused, and no arena made. */
  job_t fresh = {.pool = pool, .bytes = 4096, .tag = 0x50, .count = 1};
  cr_expect_eq(on_thread(&fresh, ALLOC), MP_EBUSY);
  cr_expect_eq(arenas_made(pool), 2, "an arena was made while paused");
  /* The pool as a whole. */
  int word;
  cr_expect_eq(mp_pool_free(pool, &word), MP_EBUSY);
  cr_expect_eq(mp_pool_trim(pool, 0), MP_EBUSY);
  cr_expect_eq(mp_pool_add_stream(pool, NULL), MP_EBUSY);
  cr_expect_eq(mp_pool_check(pool), MP_EBUSY);
  cr_expect_eq(mp_pool_pause(pool, 0), MP_EBUSY);
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0,
               "a refused call changed the stats");
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_EINVAL);
  /* Now the new thread gets an arena, and the frees go through. */
  cr_expect_eq(on_thread(&fresh, ALLOC), MP_OK, "%s", fresh.why);
  cr_expect_eq(arenas_made(pool), 3);
  cr_expect_eq(on_thread(&fresh, FREE), MP_OK, "%s", fresh.why);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* Resume maps arena 0, then finds no room for arena 1 (another tenant holds
 * it): arena 0 is unmapped again and the pool stays paused with every
 * content kept; once the tenant is gone the resume goes through. */
Test(pool_arenas_pause, a_resume_failing_in_one_arena_unmaps_the_others) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 3 * MiB, .tag = 0x60, .count = 1};
  job_t b = {.pool = pool, .bytes = 5 * MiB, .tag = 0x70, .count = 1};
  two_arenas(pool, &a, &b);
  size_t r0 = stats(mp__arena_at(pool, 0)).reserved_bytes;
  size_t r1 = stats(mp__arena_at(pool, 1)).reserved_bytes;
  cr_assert(r0 > 0 && r1 >= 2 * 4096, "%zu, %zu", r0, r1);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  /* The tenant leaves room for arena 0 and half of arena 1. */
  void *tenant;
  size_t leave = r0 + r1 / 2;
  cr_assert_eq(mp_device_alloc(dev, free_bytes(dev) - leave, &tenant), MP_OK,
               "%s", mp_last_error());
  size_t free_paused = free_bytes(dev);
  cr_expect_eq(mp_pool_resume(pool), MP_ENOMEM);
  cr_expect_eq(free_bytes(dev), free_paused, "arena 0 stayed mapped");
  cr_expect(arena_paused(pool, 0) && arena_paused(pool, 1));
  cr_expect_eq(stats(pool).reserved_bytes, 0);
  job_t x = {.pool = pool, .bytes = 4096, .count = 1};
  cr_expect_eq(on_worker(&wa, &x, ALLOC), MP_EBUSY, "still paused");
  cr_expect_eq(mp_pool_trim(pool, 0), MP_EBUSY, "still paused");
  cr_assert_eq(mp_device_free(dev, tenant), MP_OK);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, r0 + r1);
  expect_kept(&a);
  expect_kept(&b);
  check(pool);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
}

/* A pause that one arena would refuse (plain segments: virtual=0) changes
 * nothing in any arena. */
Test(pool_arenas_pause, a_refused_pause_changes_no_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,virtual=0");
  job_t a = {.pool = pool, .bytes = MiB, .tag = 0x80, .count = 1};
  job_t b = {.pool = pool, .bytes = MiB, .tag = 0x90, .count = 1};
  two_arenas(pool, &a, &b);
  mp_stats_t before = stats(pool);
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_ENOTSUP);
  cr_expect(!arena_paused(pool, 0) && !arena_paused(pool, 1));
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(mp_pool_resume(pool), MP_EINVAL);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "not paused");
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "not paused");
  cr_expect_eq(mp_pool_pause(NULL, 0), MP_EINVAL);
  cr_expect_eq(mp_pool_pause(pool, 0x80), MP_EINVAL);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A pool with arenas that can hold only plain segments (virtual=0, or a
 * device without virtual memory) is refused before any arena is made too,
 * as a pool without arenas is: the pause was MP_OK, every allocation then
 * MP_EBUSY until the resume, and its next pause, once an arena held
 * memory, MP_ENOTSUP. */
Test(pool_arenas_pause, a_pool_of_plain_segments_is_refused_while_empty) {
  mp_device_t *plain_dev = open_dev("host:capacity=64M,vmm=0");
  const char *opts[] = {"arenas=2,virtual=0", "arenas=2,arenas_auto=1"};
  for (size_t k = 0; k < 2; k++) {
    mp_pool_t *pool = make_pool(k == 0 ? dev : plain_dev, opts[k]);
    cr_expect_eq(mp_pool_pause(pool, 0), MP_ENOTSUP, "%s", opts[k]);
    cr_expect(strstr(mp_last_error(), "virtual") != NULL, "%s",
              mp_last_error());
    void *p = NULL;
    cr_expect_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK, "not paused: %s",
                 mp_last_error());
    cr_expect_eq(mp_pool_free(pool, p), MP_OK);
    cr_expect_eq(mp_pool_resume(pool), MP_EINVAL);
    check(pool);
    cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  }
  mp_device_close(plain_dev);
}

/* ---- on the fake device: an unmap that fails --------------------------- */

/* Arena 0 pauses (unmap #1), arena 1's unmap (#2) fails: arena 0 is resumed
 * with its content, and the pool runs as before. */
Test(pool_arenas_pause, a_pause_failing_in_one_arena_resumes_the_others) {
  mp_device_t *fdev = flaky_open(2);
  mp_pool_t *pool = make_pool(fdev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0xa0, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0xb0, .count = 1};
  two_arenas(pool, &a, &b);
  cr_assert_eq(mp__arena_at(pool, 0)->vseg->nchunks, 1, "one chunk each");
  cr_assert_eq(mp__arena_at(pool, 1)->vseg->nchunks, 1, "one chunk each");
  mp_stats_t before = stats(pool);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_unmap #2") != NULL, "%s",
            mp_last_error());
  cr_expect(!arena_paused(pool, 0) && !arena_paused(pool, 1));
  cr_expect(!mp__pool_is_paused(pool));
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(fake_of(fdev)->used, before.reserved_bytes);
  expect_kept(&a);
  expect_kept(&b);
  cr_expect_eq(mp_pool_resume(pool), MP_EINVAL, "not paused");
  job_t c = {.pool = pool, .bytes = 4096, .tag = 0xc0, .count = 1};
  cr_expect_eq(on_worker(&wa, &c, ALLOC), MP_OK, "%s", c.why);
  cr_expect_eq(on_worker(&wa, &c, FREE), MP_OK);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}

/* While arena 0 gives its memory back (its first unmap), the thread of the
 * arena paused after it asks for a block its cache lacks: no growth then,
 * MP_EBUSY, or the pool would hold more than the device could map again
 * at the resume (a pause racing three threads on arenas ended with arenas
 * holding 547 MiB of a 512 MiB device and every resume failing). */
static worker_t *hook_worker;
static job_t hook_job;

/* A pool of opts on fdev whose two arenas each hold a block of 2 MiB (a's,
 * tagged tag, and b's, tag + 0x10), hook_worker the worker of arena
 * `arena`. */
static mp_pool_t *hooked_arenas(mp_device_t *fdev, const char *opts, job_t *a,
                                job_t *b, unsigned tag, int arena) {
  mp_pool_t *pool = make_pool(fdev, opts);
  *a = (job_t){.pool = pool, .bytes = 2 * MiB, .tag = tag, .count = 1};
  *b = (job_t){.pool = pool, .bytes = 2 * MiB, .tag = tag + 0x10, .count = 1};
  two_arenas(pool, a, b);
  hook_worker = arena_holding(pool, a->ptrs[0]) == arena ? &wa : &wb;
  return pool;
}

/* Frees hook_job's block (if it got one), a's and b's, stops the workers
 * and destroys the pool. */
static void hooked_finish(mp_pool_t *pool, mp_device_t *fdev, job_t *a,
                          job_t *b) {
  if (hook_job.st == MP_OK)
    cr_expect_eq(on_worker(hook_worker, &hook_job, FREE), MP_OK);
  cr_expect_eq(on_worker(&wa, a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, b, FREE), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}

static void alloc_in_the_unmap(void *ctx) {
  (void)ctx;
  on_worker(hook_worker, &hook_job, ALLOC);
}

Test(pool_arenas_pause, no_arena_grows_while_the_pool_is_being_paused) {
  mp_device_t *fdev = flaky_open(0);
  job_t a, b;
  /* The worker whose arena pauses second. */
  mp_pool_t *pool = hooked_arenas(fdev, "arenas=2", &a, &b, 0xd0, 1);
  hook_job = (job_t){.pool = pool, .bytes = 4 * MiB, .tag = 0xf0, .count = 1};
  mp_stats_t before = stats(pool);
  fake_of(fdev)->on_unmap = alloc_in_the_unmap;
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(hook_job.st, MP_EBUSY, "arena 1 grew while arena 0 paused: %s",
               hook_job.why);
  cr_expect_eq(stats(pool).allocated_bytes, before.allocated_bytes);
  cr_expect_eq(fake_of(fdev)->used, 0, "memory left mapped while paused");
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, before.reserved_bytes);
  expect_kept(&a);
  expect_kept(&b);
  /* Running again: the same request grows. */
  cr_expect_eq(on_worker(hook_worker, &hook_job, ALLOC), MP_OK, "%s",
               hook_job.why);
  hooked_finish(pool, fdev, &a, &b);
}

/* A capped pool: arena 1 has a share larger than what it reserved (its
 * first request got half of the room). While the resume frees arena 1's
 * kept content (every arena mapped again, arena 0 running, arena 1 still
 * paused), arena 0's thread asks for more than its own share: arena 1 will
 * hold only what it maps back, so the room is there. It was MP_ELIMIT: a
 * paused arena kept its whole share "for its resume", which maps back only
 * what it reserved. */
static mp_pool_t *resume_pool;
static void *resume_last_copy; /* the kept content freed last */

static void alloc_in_the_last_copy_free(void *ptr) {
  if (ptr != resume_last_copy)
    return;
  host_free_hook = NULL;
  cr_expect(!arena_paused(resume_pool, 0) && arena_paused(resume_pool, 1),
            "arena 0 runs, arena 1 is still paused");
  on_worker(hook_worker, &hook_job, ALLOC);
}

Test(pool_arenas_pause,
     a_paused_arena_keeps_only_what_it_maps_back_of_the_cap) {
  mp_device_t *fdev = flaky_open(0);
  job_t a, b;
  /* The worker of arena 0 (resumed first), and arena 1's figures. */
  mp_pool_t *pool =
      hooked_arenas(fdev, "arenas=2,max_bytes=32M", &a, &b, 0x61, 0);
  mp_pool_t *a0 = mp__arena_at(pool, 0), *a1 = mp__arena_at(pool, 1);
  size_t r0 = stats(a0).reserved_bytes, r1 = stats(a1).reserved_bytes;
  mp__pool_lock(a1);
  size_t share1 = a1->cap;
  mp__pool_unlock(a1);
  cr_assert(share1 > r1, "arena 1's share %zu, reserved %zu", share1, r1);
  /* Above what the cap leaves beside arena 1's share, within what it
   * leaves beside what arena 1 reserved. */
  size_t want = 32 * MiB - r1 - r0;
  cr_assert(r0 + want > 32 * MiB - share1);
  hook_job = (job_t){.pool = pool, .bytes = want, .tag = 0x81, .count = 1};
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  resume_pool = pool;
  resume_last_copy = a1->pause_copy;
  cr_assert_not_null(resume_last_copy);
  host_free_hook = alloc_in_the_last_copy_free;
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_assert_null(host_free_hook, "the resume freed arena 1's copy");
  cr_expect_eq(hook_job.st, MP_OK,
               "an allocation within the cap failed during the resume: %s",
               hook_job.why);
  cr_expect_eq(stats(pool).reserved_bytes, 32 * MiB, "up to the cap");
  expect_kept(&a);
  expect_kept(&b);
  check(pool);
  hooked_finish(pool, fdev, &a, &b);
}

/* A resume failing in the third arena (no room) whose undo cannot unmap the
 * first arena again (a second failure): that arena runs, mapped in full, and
 * only it; the others stay paused, and the next resume brings them back. */
Test(pool_arenas_pause,
     a_failed_undo_of_a_resume_leaves_only_that_arena_running) {
  mp_device_t *fdev = flaky_open(4); /* the pause's 3 unmaps, then the undo's */
  mp_pool_t *pool = make_pool(fdev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0x11, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x21, .count = 1};
  job_t c = {.pool = pool, .bytes = 2 * MiB, .tag = 0x31, .count = 1};
  two_arenas(pool, &a, &b);
  cr_assert_eq(on_thread(&c, ALLOC), MP_OK, "%s", c.why);
  cr_assert_eq(arenas_made(pool), 3);
  size_t made[3], k = 0;
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL) {
      cr_assert_eq(mp__arena_at(pool, i)->vseg->nchunks, 1, "one chunk each");
      made[k++] = i;
    }
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(fake_of(fdev)->used, 0);
  size_t capacity = fake_of(fdev)->capacity;
  fake_of(fdev)->capacity = 4 * MiB; /* room for two arenas' chunks */
  cr_expect_eq(mp_pool_resume(pool), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "could not be unmapped") != NULL, "%s",
            mp_last_error());
  cr_expect(!arena_paused(pool, made[0]), "the arena mapped in full runs");
  cr_expect(arena_paused(pool, made[1]), "an arena unmapped again runs");
  cr_expect(arena_paused(pool, made[2]));
  cr_expect(mp__pool_is_paused(pool));
  cr_expect_eq(fake_of(fdev)->used, 2 * MiB, "only the running arena mapped");
  fake_of(fdev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect(!mp__pool_is_paused(pool));
  expect_kept(&a);
  expect_kept(&b);
  expect_kept(&c);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK);
  cr_expect_eq(mp_pool_free(pool, c.ptrs[0]), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}

/* As above, but the arena mapped again holds two chunks and its undo fails
 * at the second: the first was unmapped, and mapped back empty by the
 * undo's own undo. Its kept content goes back in before the host copy goes:
 * it ran with that chunk's blocks zeroed before. */
Test(pool_arenas_pause, a_failed_undo_of_a_resume_keeps_the_content) {
  mp_device_t *fdev = flaky_open(5); /* the pause's 3 unmaps, then the undo's */
  mp_pool_t *pool = make_pool(fdev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0x41, .count = 2};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x51, .count = 1};
  two_arenas(pool, &a, &b);
  cr_assert_eq(mp__arena_at(pool, 0)->vseg->nchunks, 2);
  cr_assert_eq(mp__arena_at(pool, 1)->vseg->nchunks, 1);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  size_t capacity = fake_of(fdev)->capacity;
  fake_of(fdev)->capacity = 4 * MiB; /* room for arena 0's chunks only */
  cr_expect_eq(mp_pool_resume(pool), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "could not be unmapped") != NULL, "%s",
            mp_last_error());
  cr_expect(!arena_paused(pool, 0), "the arena mapped in full runs");
  expect_kept(&a);
  fake_of(fdev)->capacity = capacity;
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  expect_kept(&a);
  expect_kept(&b);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}
