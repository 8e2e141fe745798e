/* mp_pool_set_access is all or nothing: a peer the device refuses for one
 * chunk, or in one arena (arenas=N), reaches no chunk and no arena, now or
 * later (the pool is as it was), and two threads giving a peer at once
 * leave every arena with the same access. White-box, on the fake device
 * whose vm_access call #access_fail_at fails (flaky_unmap.h). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* Whether every chunk mapped of every arena made (or of the pool itself)
 * is open to the peer (want true) or none is (want false). */
static void expect_all_open(mp_pool_t *pool, bool want) {
  size_t n = pool->arenas != NULL ? pool->cfg.arenas : 1;
  for (size_t a = 0; a < n; a++) {
    mp_pool_t *p = pool->arenas != NULL ? mp__arena_at(pool, a) : pool;
    if (p == NULL)
      continue;
    cr_expect_eq(atomic_load(&p->npeers), want ? 1u : 0u,
                 "arena %zu knows %u peers", a, atomic_load(&p->npeers));
    for (size_t i = 0; i < p->vseg->nchunks; i++)
      cr_expect_eq(open_to_peer((void *)p->vseg->chunks[i].addr), want,
                   "arena %zu chunk %zu is %s to the peer", a, i,
                   want ? "closed" : "open");
  }
}

/* Frees the blocks of the two workers' arenas (a, b) and of a third
 * thread's (c), stops the workers and destroys the pool. */
static void arenas_finish(mp_pool_t *pool, mp_device_t *dev, job_t *a, job_t *b,
                          job_t *c) {
  cr_expect_eq(on_worker(&wa, a, FREE), MP_OK);
  cr_expect_eq(on_worker(&wb, b, FREE), MP_OK);
  cr_expect_eq(on_thread(c, FREE), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, dev);
}

/* A pool without arenas: chunks 0 and 1 open, chunk 2 refused: 0 and 1
 * are closed again, and no later chunk opens. Failed before: chunks 0 and 1
 * stayed open to a peer the pool did not know. */
Test(pool_peer_access, a_peer_refused_at_one_chunk_reaches_no_chunk) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[5];
  for (unsigned i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  cr_assert_eq(p->vseg->nchunks, 4, "the test needs four chunks");
  access_fail_at = 3;
  cr_assert_eq(mp_pool_set_access(p, peer), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_access #3") != NULL, "%s",
            mp_last_error());
  expect_all_open(p, false);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[4]), MP_OK);
  expect_all_open(p, false);
  /* Given again, it reaches every chunk. */
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  expect_all_open(p, true);
  for (unsigned i = 0; i < 5; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

/* Two arenas of one chunk each; arena 1's is refused: arena 0's chunk is
 * closed again, and an arena made later does not get the peer. Failed
 * before: arena 0 kept the peer, the pool and later arenas did not. */
Test(pool_peer_access, a_peer_refused_in_one_arena_reaches_no_arena) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0xa0, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0xb0, .count = 1};
  two_arenas(pool, &a, &b);
  access_fail_at = 2;
  cr_assert_eq(mp_pool_set_access(pool, peer), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_access #2") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(atomic_load(&pool->npeers), 0);
  expect_all_open(pool, false);
  job_t c = {.pool = pool, .bytes = 2 * MiB, .tag = 0xc0, .count = 1};
  cr_assert_eq(on_thread(&c, ALLOC), MP_OK, "%s", c.why);
  cr_assert_eq(arenas_made(pool), 3);
  expect_all_open(pool, false);
  /* Given again, it reaches every arena. */
  cr_assert_eq(mp_pool_set_access(pool, peer), MP_OK, "%s", mp_last_error());
  expect_all_open(pool, true);
  arenas_finish(pool, dev, &a, &b, &c);
  fake_close(peer);
}

/* Thread A's call is refused in arena 1, after thread B's call for the
 * same peer has begun. Whatever each returns, the arenas agree with the
 * pool: B's MP_OK means every arena, and every arena made later, has the
 * peer. Failed before: B saw the peer A had put in the pool's list, gave
 * it to arena 1 after A's failure, and A then took it out of the list:
 * B's MP_OK, yet a later arena without the peer. */
static _Atomic bool b_started;

static void wait_for_b(void) {
  while (!atomic_load(&b_started))
    nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
  /* B's call runs on meanwhile, as far as it can. */
  nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
}

typedef struct {
  mp_pool_t *pool;
  mp_status_t st;
} give_t;

static void *give_a(void *arg) {
  give_t *g = arg;
  g->st = mp_pool_set_access(g->pool, flaky_peer);
  return NULL;
}

static void *give_b(void *arg) {
  give_t *g = arg;
  atomic_store(&b_started, true);
  g->st = mp_pool_set_access(g->pool, flaky_peer);
  return NULL;
}

Test(pool_peer_access, two_threads_giving_a_peer_leave_the_arenas_agreed) {
  mp_device_t *dev = flaky_open(0);
  (void)flaky_peer_open();
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0xa0, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0xb0, .count = 1};
  two_arenas(pool, &a, &b);
  access_fail_at = 2;
  access_hook = wait_for_b;
  give_t ga = {.pool = pool}, gb = {.pool = pool};
  pthread_t ta, tb;
  cr_assert_eq(pthread_create(&ta, NULL, give_a, &ga), 0);
  /* B starts once A is inside arena 1 (access call #1 was arena 0's). */
  while (access_calls < 1)
    nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
  cr_assert_eq(pthread_create(&tb, NULL, give_b, &gb), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  cr_expect_eq(ga.st, MP_EDRIVER, "A's call is refused");
  cr_assert_eq(gb.st, MP_OK, "B's call, after A's: %s", mp_last_error());
  cr_expect_eq(atomic_load(&pool->npeers), 1);
  expect_all_open(pool, true);
  job_t c = {.pool = pool, .bytes = 2 * MiB, .tag = 0xc0, .count = 1};
  cr_assert_eq(on_thread(&c, ALLOC), MP_OK, "%s", c.why);
  expect_all_open(pool, true);
  arenas_finish(pool, dev, &a, &b, &c);
  fake_close(flaky_peer);
}

/* Frees the n blocks v[i], then as fake_pool_finish, and closes the
 * peer. */
static void free_and_finish(mp_pool_t *p, mp_device_t *dev, mp_device_t *peer,
                            void *const *v, int n) {
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

/* A pool that has the peer, whose next growth's chunk the device refuses
 * to the peer and then refuses to unmap too: the chunk is still mapped, so
 * the pool keeps it (a stray), never serves it, and unmaps it before it
 * maps there again and at destroy. Before, it was forgotten: destroy left
 * it mapped (the device's memory short for good), and the next growth
 * mapped over it. */
static mp_pool_t *pool_with_a_stray(mp_device_t *dev, mp_device_t *peer,
                                    void **held) {
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, held), MP_OK);
  access_fail_at = access_calls + 1;
  unmap_fail_at = unmap_calls + 1;
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 2 * MiB, NULL, &x), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "vm_access") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 4 * MiB, "the stray is still mapped");
  return p;
}

Test(pool_peer_access, a_stray_mapping_is_unmapped_at_destroy) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  void *v;
  mp_pool_t *p = pool_with_a_stray(dev, peer, &v);
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

Test(pool_peer_access, a_stray_mapping_is_unmapped_before_a_map_over_it) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  void *v[2];
  mp_pool_t *p = pool_with_a_stray(dev, peer, &v[0]);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[1]), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used,
               "the device holds %zu bytes, the pool %zu", fake_of(dev)->used,
               stats(p).reserved_bytes);
  expect_all_open(p, true);
  free_and_finish(p, dev, peer, v, 2);
}

/* flaky_map_directly of a granule at a. */
static mp_status_t map_directly(mp_pool_t *p, uintptr_t a) {
  return flaky_map_directly(p, a, 2 * MiB);
}

/* Nine strays, each a granule above the top where a growth's map was
 * refused to the peer and then refused its unmap (made directly, as a
 * growth or resume makes them, a device call in flight): every one is
 * unmapped before the growth that maps over them and none is left after
 * destroy. Before, the table held eight: the ninth was forgotten, the
 * growth mapped over it (the device held 2 MiB more than the pool) and it
 * stayed mapped after destroy. */
Test(pool_peer_access, a_ninth_stray_mapping_is_not_forgotten) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  void *v[2];
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[0]), MP_OK);
  uintptr_t top = p->vseg->base + p->vseg->span;
  size_t held = stats(p).reserved_bytes;
  for (size_t k = 0; k < 9; k++) {
    access_fail_at = access_calls + 1;
    unmap_fail_at = unmap_calls + 1;
    mp_status_t st = map_directly(p, top + k * 2 * MiB);
    cr_assert_eq(st, MP_EDRIVER, "stray %zu: %s", k, mp_last_error());
  }
  cr_expect_eq(fake_of(dev)->used, held + 18 * MiB, "nine strays are mapped");
  cr_expect_eq(stats(p).reserved_bytes, held + 18 * MiB,
               "reserved counts them");
  cr_assert_eq(mp_pool_alloc(p, 18 * MiB, NULL, &v[1]), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used,
               "the device holds %zu bytes, the pool %zu", fake_of(dev)->used,
               stats(p).reserved_bytes);
  free_and_finish(p, dev, peer, v, 2);
}

/* A map that may leave a stray takes the room for its record first: with
 * no host memory for it, the map is refused before the device maps
 * anything, and the growth fails with MP__EHOST, the pool as it was. */
Test(pool_peer_access, no_host_room_for_a_stray_refuses_the_map_first) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[2];
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[0]), MP_OK);
  /* The peer after the first map: no record's room taken yet. */
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  size_t maps = fake_of(dev)->maps, used = fake_of(dev)->used;
  mp__fault_host_after(0);
  mp_status_t st = map_directly(p, p->vseg->base + p->vseg->span);
  mp__fault_host_after(-1);
  cr_expect_eq(st, MP__EHOST, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "host memory") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(fake_of(dev)->maps, maps, "nothing was mapped");
  cr_expect_eq(fake_of(dev)->used, used);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[1]), MP_OK, "%s",
               mp_last_error());
  expect_all_open(p, true);
  free_and_finish(p, dev, peer, v, 2);
}

/* A pool with a stray (pool_with_a_stray) whose next unmap the device
 * refuses too. */
static mp_pool_t *pool_with_a_stuck_stray(mp_device_t *dev, mp_device_t *peer,
                                          void **held) {
  mp_pool_t *p = pool_with_a_stray(dev, peer, held);
  unmap_fail_at = unmap_calls + 1;
  return p;
}

/* A trim unmaps the strays again: the first refused too (it stays, the
 * trim still gives back what else it can), the second succeeds. Before,
 * only a map over a stray or destroy tried again: the trim left it. */
Test(pool_peer_access, a_trim_unmaps_a_stray_mapping_again) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  void *v;
  mp_pool_t *p = pool_with_a_stuck_stray(dev, peer, &v);
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 4 * MiB, "refused again, still mapped");
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 2 * MiB, "the trim unmapped the stray");
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  free_and_finish(p, dev, peer, &v, 1);
}

/* A pause unmaps the strays before anything else: one the device refuses
 * again fails the pause, the pool running as it was; the next pause
 * unmaps it and gives everything back. Before, the pause left the stray
 * mapped and said it had given the pool's memory back (reserved 0, the
 * device 2 MiB short). */
Test(pool_peer_access, a_pause_gives_back_a_stray_mapping_or_fails) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  void *v;
  mp_pool_t *p = pool_with_a_stuck_stray(dev, peer, &v);
  cr_expect_eq(mp_pool_pause(p, 0), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "still mapped") != NULL &&
                strstr(mp_last_error(), "not paused") != NULL,
            "%s", mp_last_error());
  cr_expect(!mp__pool_is_paused(p));
  cr_expect_eq(fake_of(dev)->used, 4 * MiB);
  cr_expect_eq(stats(p).reserved_bytes, 4 * MiB,
               "nothing was unmapped, the stray still held");
  check(p);
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0, "the pause gave everything back");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  free_and_finish(p, dev, peer, &v, 1);
}

/* A resume of a pool with a peer takes the room for a stray's record
 * before each map (mp__pool_vm_map): with no host memory for it the
 * resume fails as a public call fails for want of host memory, MP_ENOMEM
 * (MP__EHOST is internal, never a caller's), the pool still paused with
 * nothing mapped; the next resume maps it back. Before, mp_pool_resume
 * returned MP__EHOST (0x4854), a status no caller knows. */
Test(pool_peer_access, no_host_room_for_a_stray_fails_a_resume_with_enomem) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *p = make_pool(dev, NULL);
  void *v;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v), MP_OK);
  /* The peer after the map: no record's room taken yet. */
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  mp__fault_host_after(0);
  mp_status_t st = mp_pool_resume(p);
  mp__fault_host_after(-1);
  cr_expect_eq(st, MP_ENOMEM, "status 0x%x: %s", (unsigned)st, mp_last_error());
  cr_expect(strstr(mp_last_error(), "host memory") != NULL, "%s",
            mp_last_error());
  cr_expect(mp__pool_is_paused(p));
  cr_expect_eq(fake_of(dev)->used, 0, "nothing was mapped");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 2 * MiB);
  expect_all_open(p, true);
  free_and_finish(p, dev, peer, &v, 1);
}
