/* test_handle_misuse.c - movable-block handles under misuse: a stale handle
 * (its block freed, its record since reused) is MP_EINVAL and frees nothing;
 * a raw-pointer double free racing with mp_pool_alloc_movable is MP_EINVAL,
 * never a crash; mp_handle_ptr may be read while another thread
 * defragments (run under TSan in CI). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

static mp_device_t *dev;
static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=512M", &dev), MP_OK, "%s",
               mp_last_error());
}
static void teardown(void) {
  mp_device_close(dev);
}
TestSuite(handle_misuse, .init = setup, .fini = teardown);

Test(handle_misuse, stale_handle_is_einval_and_frees_nothing) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_handle_t *a, *b;
  cr_assert_eq(mp_pool_alloc_movable(p, 8192, NULL, &a), MP_OK);
  cr_assert_eq(mp_handle_free(a), MP_OK);
  /* The freed record is the first one reuse would pick. */
  cr_assert_eq(mp_pool_alloc_movable(p, 8192, NULL, &b), MP_OK);
  void *bp = mp_handle_ptr(b);
  cr_assert_not_null(bp);
  mp_stats_t before = stats(p);
  cr_expect_eq(mp_handle_free(a), MP_EINVAL, "a stale handle freed a block");
  mp_stats_t after = stats(p);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.free_count, before.free_count);
  cr_expect_eq(mp_handle_ptr(b), bp);
  check(p);
  cr_expect_eq(mp_handle_free(b), MP_OK);
  cr_expect_eq(mp_handle_free(b), MP_EINVAL);
  check(p);
  mp_pool_destroy(p);
}

/* One thread allocates movable blocks while another frees, as raw pointers,
 * the addresses the first one gets: each such free is MP_EINVAL. */
static mp_pool_t *race_pool;
static _Atomic(void *) last_ptr;
static atomic_bool stop;
static atomic_long bad_ok;

static void *raw_freer(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    void *p = atomic_load(&last_ptr);
    if (p && mp_pool_free(race_pool, p) == MP_OK)
      atomic_fetch_add(&bad_ok, 1);
  }
  return NULL;
}

Test(handle_misuse, raw_free_racing_movable_alloc_is_einval_not_a_crash) {
  race_pool = make_pool(dev, NULL);
  atomic_store(&stop, false);
  atomic_store(&bad_ok, 0);
  pthread_t t;
  pthread_create(&t, NULL, raw_freer, NULL);
  for (int i = 0; i < 20000; i++) {
    mp_handle_t *h = NULL;
    mp_status_t st = mp_pool_alloc_movable(race_pool, 4096, NULL, &h);
    cr_assert_eq(st, MP_OK, "%s", mp_last_error());
    atomic_store(&last_ptr, mp_handle_ptr(h));
    cr_assert_eq(mp_handle_free(h), MP_OK);
  }
  atomic_store(&stop, true);
  pthread_join(t, NULL);
  cr_expect_eq(atomic_load(&bad_ok), 0, "a raw free of a movable block passed");
  check(race_pool);
  mp_stats_t s = stats(race_pool);
  cr_expect_eq(s.allocated_bytes, 0);
  mp_pool_destroy(race_pool);
}

enum { ROUNDS = 4, PER_ROUND = 64 };
static mp_handle_t *kept[ROUNDS * PER_ROUND];
static atomic_int kept_n;
static void *reader(void *arg) {
  (void)arg;
  uintptr_t sum = 0;
  while (!atomic_load(&stop)) {
    int n = atomic_load(&kept_n);
    for (int i = 0; i < n; i++)
      sum += (uintptr_t)mp_handle_ptr(kept[i]);
  }
  return (void *)sum;
}

/* Each round lays out kept blocks between gaps, frees the gaps and
 * defragments, so the kept blocks move while the reader reads them. */
Test(handle_misuse, handle_ptr_is_safe_beside_defragment) {
  mp_pool_t *p = make_pool(dev, NULL);
  atomic_store(&stop, false);
  atomic_store(&kept_n, 0);
  pthread_t t;
  pthread_create(&t, NULL, reader, NULL);
  size_t total_moved = 0;
  for (int round = 0; round < ROUNDS; round++) {
    mp_handle_t *gaps[PER_ROUND];
    int base = atomic_load(&kept_n);
    for (int i = 0; i < PER_ROUND; i++) {
      cr_assert_eq(mp_pool_alloc_movable(p, 64 * 1024, NULL, &gaps[i]), MP_OK);
      cr_assert_eq(mp_pool_alloc_movable(p, 64 * 1024, NULL, &kept[base + i]),
                   MP_OK);
    }
    atomic_store(&kept_n, base + PER_ROUND);
    for (int i = 0; i < PER_ROUND; i++)
      cr_assert_eq(mp_handle_free(gaps[i]), MP_OK);
    size_t moved = 0;
    cr_assert_eq(mp_pool_defragment(p, NULL, &moved), MP_OK, "%s",
                 mp_last_error());
    total_moved += moved;
  }
  atomic_store(&stop, true);
  pthread_join(t, NULL);
  cr_expect_gt(total_moved, 0, "nothing moved: the test proves nothing");
  check(p);
  mp_pool_destroy(p);
}
