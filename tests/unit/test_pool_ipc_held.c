/* A free of an exported block also closes the leases importers let go
 * (export.c's reap), which frees the blocks those held: it removes them
 * from the live map, whose backward-shift deletion moves the entries after
 * each one (and with release_threshold it may drop the lock for an unmap,
 * while other threads change the map). The freed block's own entry may
 * move so: the free must settle its own block (out of the map, or held in
 * it) before the reap, not remove it at a slot its lookup found before. */
#include <criterion/criterion.h>
#include <pthread.h>

#include "../support/pool_helpers.h"
#include "device/backend.h"
#include "pool/pool_internal.h"

#define NBLOCKS 512

/* Where addr's entry sits past its home slot in pool's live map. */
static size_t probe_distance(mp_pool_t *pool, void *addr) {
  mp__slot_t *slot = NULL;
  mp__pool_lock(pool);
  cr_assert_not_null(mp__map_lookup(pool, (uintptr_t)addr, &slot));
  size_t d = (size_t)(slot - pool->map) - mp__map_slot(pool, (uintptr_t)addr);
  mp__pool_unlock(pool);
  return d;
}

static size_t home_slot(mp_pool_t *pool, void *addr) {
  mp__pool_lock(pool);
  size_t home = mp__map_slot(pool, (uintptr_t)addr);
  mp__pool_unlock(pool);
  return home;
}

Test(pool_ipc_held, a_free_that_reaps_held_blocks_removes_its_own_entry) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = make_pool(dev, NULL);
  /* Blocks until two share a home slot in the live map: removing the one
   * nearer its home moves the other. Sizes of 1 to 61 units of 512 bytes,
   * in no simple order: the multiplicative hash spreads the addresses of
   * equal blocks (an arithmetic series) without a shared slot over far
   * more blocks (none of 512 shared one in a map at most 1/8 full). */
  void *blk[NBLOCKS], *near = NULL, *far = NULL;
  size_t n = 0;
  for (; n < NBLOCKS && far == NULL; n++) {
    cr_assert_eq(mp_pool_alloc(pool, 512 * (1 + n * 37 % 61), NULL, &blk[n]),
                 MP_OK);
    for (size_t j = 0; j < n && far == NULL; j++)
      if (home_slot(pool, blk[j]) == home_slot(pool, blk[n])) {
        bool first =
            probe_distance(pool, blk[j]) < probe_distance(pool, blk[n]);
        near = first ? blk[j] : blk[n];
        far = first ? blk[n] : blk[j];
      }
  }
  cr_assert_not_null(far, "no two of %d blocks share a home slot", NBLOCKS);
  mp_ipc_handle_t hn, hf;
  cr_assert_eq(mp_pool_ipc_export(pool, near, &hn), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_ipc_export(pool, far, &hf), MP_OK, "%s",
               mp_last_error());
  /* Held: its lease is open. */
  cr_assert_eq(mp_pool_free(pool, near), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&hn), MP_OK);
  cr_assert_eq(mp_ipc_handle_close(&hf), MP_OK);
  /* Its reap frees near, whose removal moves far's entry. */
  cr_assert_eq(mp_pool_free(pool, far), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_expect_eq(mp_pool_free(pool, far), MP_EINVAL, "a second free of %p", far);
  for (size_t i = 0; i < n; i++)
    if (blk[i] != near && blk[i] != far)
      cr_assert_eq(mp_pool_free(pool, blk[i]), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_expect_eq(stats(pool).live_blocks, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* An export reaps the leases importers let go before it makes its own; the
 * reap may drop the lock for an unmap (release_threshold), and another
 * thread may free the very block being exported meanwhile. The export must
 * then refuse (the block is no longer live) or the free must: never both
 * succeed with the pool naming a free block as exported. The host backend
 * here frees the block from another thread during the unmap. */
static mp__backend_t unmap_hook;
static mp_pool_t *race_pool;
static void *race_ptr;
static mp_status_t race_free_st = (mp_status_t)-1;
static bool race_armed;

static void *free_race_ptr(void *arg) {
  (void)arg;
  race_free_st = mp_pool_free(race_pool, race_ptr);
  return NULL;
}

/* What the other thread does during the unmap (free_race_ptr unless a
 * test says otherwise). */
static void *(*race_fn)(void *) = free_race_ptr;

static mp_status_t unmap_and_free(mp_device_t *dev, void *addr, size_t n) {
  if (race_armed) {
    race_armed = false;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, race_fn, NULL), 0);
    pthread_join(t, NULL);
  }
  return mp__host_backend.vm_unmap(dev, addr, n);
}

/* A pool with release_threshold=3M on the host device whose unmaps free
 * race_ptr from another thread once armed; two blocks (4 MiB, 512 B)
 * exported, freed (held) and let go by their importers, so that the next
 * reap releases them and unmaps; x: a third, live 512-byte block,
 * exported before that when xh is set. */
static mp_pool_t *reap_ready(mp_device_t **dev, void **x, mp_ipc_handle_t *xh) {
  cr_assert_eq(mp_device_open("host:capacity=256M", dev), MP_OK);
  unmap_hook = mp__host_backend;
  unmap_hook.vm_unmap = unmap_and_free;
  (*dev)->ops = &unmap_hook;
  mp_pool_t *pool = make_pool(*dev, "release_threshold=3M");
  void *big, *small;
  cr_assert_eq(mp_pool_alloc(pool, 4 << 20, NULL, &big), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 512, NULL, &small), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 512, NULL, x), MP_OK);
  mp_ipc_handle_t a, b;
  cr_assert_eq(mp_pool_ipc_export(pool, big, &a), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(pool, small, &b), MP_OK);
  if (xh != NULL)
    cr_assert_eq(mp_pool_ipc_export(pool, *x, xh), MP_OK);
  /* Both held by their importers, who then let go. */
  cr_assert_eq(mp_pool_free(pool, big), MP_OK);
  cr_assert_eq(mp_pool_free(pool, small), MP_OK);
  cr_assert_eq(mp_ipc_handle_close(&a), MP_OK);
  cr_assert_eq(mp_ipc_handle_close(&b), MP_OK);
  race_pool = pool;
  race_ptr = *x;
  race_free_st = (mp_status_t)-1;
  return pool;
}

Test(pool_ipc_held, an_export_whose_reap_drops_the_lock_sees_a_free_meanwhile) {
  mp_device_t *dev;
  void *x;
  mp_pool_t *pool = reap_ready(&dev, &x, NULL);
  mp_ipc_handle_t c;
  race_armed = true;
  mp_status_t st = mp_pool_ipc_export(pool, x, &c);
  cr_assert(!race_armed, "the reap never unmapped (set-up)");
  cr_assert_eq(race_free_st, MP_OK, "%s", mp_last_error());
  cr_expect_neq(st, MP_OK, "the export of %p succeeded after its free", x);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  if (st == MP_OK)
    mp_ipc_handle_close(&c);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* reap_ready with x exported (its handle in *c), then x freed (*st) while
 * fn runs on another thread during the reap's unmap. */
static mp_pool_t *free_racing(mp_device_t **dev, void **x, mp_ipc_handle_t *c,
                              void *(*fn)(void *), mp_status_t *st) {
  mp_pool_t *pool = reap_ready(dev, x, c);
  race_fn = fn;
  race_armed = true;
  *st = mp_pool_free(pool, *x);
  cr_assert(!race_armed, "the reap never unmapped (set-up)");
  return pool;
}

/* A free of an exported block reaps the leases importers let go; the reap
 * may drop the lock for an unmap (release_threshold). A second free of the
 * same pointer from another thread then must not succeed with the first (and
 * mp_pool_check, which waits for the unmap, sees the pool whole after).
 * The host backend runs the second free from another thread during the
 * unmap. */
Test(pool_ipc_held, a_second_free_during_the_reap_of_the_first_fails) {
  mp_device_t *dev;
  void *x;
  mp_ipc_handle_t c;
  mp_status_t st;
  mp_pool_t *pool = free_racing(&dev, &x, &c, free_race_ptr, &st);
  cr_expect((st == MP_OK) != (race_free_st == MP_OK),
            "frees of %p: %s and %s, one must fail", x, mp_status_string(st),
            mp_status_string(race_free_st));
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&c), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  cr_expect_eq(stats(pool).live_blocks, 0);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* What race_fill saw and got during the unmap. */
static bool race_ptr_live;
static mp_status_t race_alloc_st = MP_OK;
static void *race_fill[NBLOCKS];
static size_t race_nfill;

static size_t map_room(mp_pool_t *pool) {
  mp__pool_lock(pool);
  size_t room = pool->map_room;
  mp__pool_unlock(pool);
  return room;
}

/* Whether race_ptr is in the live map; then allocations from the cache
 * (free memory is there: no growth, which would wait for the unmap) until
 * the live map has no room left. */
static void *race_fill_map(void *arg) {
  (void)arg;
  mp__pool_lock(race_pool);
  race_ptr_live = mp__map_find(race_pool, (uintptr_t)race_ptr) != NULL;
  mp__pool_unlock(race_pool);
  while (race_alloc_st == MP_OK && race_nfill < NBLOCKS &&
         map_room(race_pool) > 0)
    race_alloc_st =
        mp_pool_alloc(race_pool, 512, NULL, &race_fill[race_nfill++]);
  return NULL;
}

/* A free of an exported block that is still imported keeps it in the live
 * map (held). Its reap of the leases importers let go may drop the lock
 * for an unmap (release_threshold): the block must be in the live map all
 * the while, not taken out and put back after the unmap. Out of it
 * meanwhile, it was missing to every other thread, and the room its
 * removal left in the map went to allocations there, so that putting it
 * back overfilled the map (its room wrapped below zero, and the map never
 * grew again). The other thread fills the map during the unmap. */
Test(pool_ipc_held, a_held_block_stays_in_the_live_map_while_the_reap_unmaps) {
  mp_device_t *dev;
  void *x;
  mp_ipc_handle_t c;
  mp_status_t st;
  mp_pool_t *pool = free_racing(&dev, &x, &c, race_fill_map, &st);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect(race_ptr_live, "the held block %p left the live map", x);
  cr_assert_eq(race_alloc_st, MP_OK, "%s", mp_last_error());
  cr_assert_lt(race_nfill, NBLOCKS, "the map never filled (set-up)");
  mp__pool_lock(pool);
  size_t room = pool->map_room, most = pool->map_cap / MP__MAP_LOAD;
  mp__pool_unlock(pool);
  cr_expect_leq(room, most, "the live map's room is %zu of at most %zu", room,
                most);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, x), MP_EINVAL, "a held block freed again");
  cr_assert_eq(mp_ipc_handle_close(&c), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  for (size_t i = 0; i < race_nfill; i++)
    cr_assert_eq(mp_pool_free(pool, race_fill[i]), MP_OK);
  check(pool);
  cr_expect_eq(stats(pool).live_blocks, 0);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
