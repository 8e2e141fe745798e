/* mp_pool_set_max_fraction on a pool with arenas (arenas=N,
 * src/pool/arena.c, mp__arena_recap): the new cap bounds the sum of the
 * arenas' reserved bytes; lowered below what they hold, nothing grows
 * until enough goes back, and then they grow back to the new cap and no
 * further; lifted to the whole device, they grow again; mp_pool_check
 * holds throughout, also while other threads allocate. White-box: it
 * reads which arena holds a block. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

/* 64 MiB: a fraction of 0.5 is a cap of 32 MiB. */
MP_DEVICE_SUITE(pool_arenas_max_fraction, "host:capacity=64M");

static size_t total_of(mp_pool_t *pool) {
  size_t t = 0;
  cr_assert_eq(mp_pool_mem_info(pool, NULL, &t), MP_OK, "%s", mp_last_error());
  return t;
}

Test(pool_arenas_max_fraction, a_cap_below_what_arenas_hold_stops_growth) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 12 * MiB, .tag = 0x10, .count = 2};
  job_t b = {.pool = pool, .bytes = 12 * MiB, .tag = 0x20, .count = 2};
  two_arenas(pool, &a, &b);
  size_t held = stats(pool).reserved_bytes;
  cr_assert_geq(held, 48 * MiB);

  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(total_of(pool), 32 * MiB);
  /* Above the cap now, as a pool without arenas would read: not corrupt. */
  check(pool);
  cr_expect_eq(stats(pool).reserved_bytes, held, "nothing was given back");
  job_t more = {.pool = pool, .bytes = 4 * MiB, .tag = 0x30, .count = 1};
  cr_expect_eq(on_worker(&wa, &more, ALLOC), MP_ELIMIT, "%s", more.why);
  cr_expect_eq(on_worker(&wb, &more, ALLOC), MP_ELIMIT, "%s", more.why);
  cr_expect_neq(strstr(more.why, "max_fraction"), NULL, "%s", more.why);
  expect_kept(&a);
  expect_kept(&b);
  check(pool);

  /* b's memory goes back: a grows to the cap, and no further. */
  cr_assert_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_leq(stats(pool).reserved_bytes, 24 * MiB);
  job_t fill_up = {.pool = pool, .bytes = 8 * MiB, .tag = 0x40, .count = 1};
  cr_expect_eq(on_worker(&wa, &fill_up, ALLOC), MP_OK, "%s", fill_up.why);
  cr_expect_leq(stats(pool).reserved_bytes, 32 * MiB);
  cr_expect_eq(on_worker(&wb, &more, ALLOC), MP_ELIMIT, "%s", more.why);
  cr_expect_eq(on_worker(&wa, &more, ALLOC), MP_ELIMIT, "%s", more.why);
  cr_expect_leq(stats(pool).reserved_bytes, 32 * MiB);
  check(pool);

  /* The whole device again: both grow past 32 MiB. */
  cr_assert_eq(mp_pool_set_max_fraction(pool, 1.0), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(total_of(pool), 64 * MiB);
  cr_expect_eq(on_worker(&wb, &more, ALLOC), MP_OK, "%s", more.why);
  cr_expect_gt(stats(pool).reserved_bytes, 32 * MiB);
  check(pool);
  cr_expect_eq(on_worker(&wb, &more, FREE), MP_OK, "%s", more.why);
  cr_expect_eq(on_worker(&wa, &fill_up, FREE), MP_OK, "%s", fill_up.why);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  worker_stop(&wa);
  worker_stop(&wb);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A capped pool lowered below what its arenas hold: no growth while they
 * hold it (what is cached still serves, as in a pool without arenas),
 * and once it goes back the arenas grow to the new cap and no further. */
Test(pool_arenas_max_fraction, a_lowered_cap_takes_back_the_shares) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=48M");
  job_t a = {.pool = pool, .bytes = 30 * MiB, .tag = 0x10, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x20, .count = 1};
  two_arenas(pool, &a, &b);
  cr_assert_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  size_t reserved = stats(pool).reserved_bytes;

  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.25), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(total_of(pool), 16 * MiB);
  check(pool);
  /* Growth in either arena is refused: a holds 30 MiB live. */
  job_t other = {.pool = pool, .bytes = 8 * MiB, .tag = 0x30, .count = 1};
  cr_expect_eq(on_worker(&wb, &other, ALLOC), MP_ELIMIT, "%s", other.why);
  cr_expect_eq(on_worker(&wa, &other, ALLOC), MP_ELIMIT, "%s", other.why);
  /* (Their reclaim gave b's cached 2 MiB back.) */
  cr_expect_leq(stats(pool).reserved_bytes, reserved);
  check(pool);
  /* Cached memory still serves (b borrows from a's idle cache). */
  cr_assert_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &other, ALLOC), MP_OK, "%s", other.why);
  cr_expect_leq(stats(pool).reserved_bytes, reserved);
  cr_expect_eq(on_worker(&wb, &other, FREE), MP_OK, "%s", other.why);
  check(pool);
  /* Given back, the arenas grow to 16 MiB between them, and no further. */
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, 0);
  job_t twelve = {.pool = pool, .bytes = 12 * MiB, .tag = 0x40, .count = 1};
  cr_expect_eq(on_worker(&wb, &twelve, ALLOC), MP_OK, "%s", twelve.why);
  cr_expect_eq(on_worker(&wa, &other, ALLOC), MP_ELIMIT, "%s", other.why);
  job_t four = {.pool = pool, .bytes = 4 * MiB, .tag = 0x50, .count = 1};
  cr_expect_eq(on_worker(&wa, &four, ALLOC), MP_OK, "%s", four.why);
  cr_expect_leq(stats(pool).reserved_bytes, 16 * MiB);
  check(pool);
  cr_expect_eq(on_worker(&wa, &four, FREE), MP_OK, "%s", four.why);
  cr_expect_eq(on_worker(&wb, &twelve, FREE), MP_OK, "%s", twelve.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* Bad fractions change nothing on a pool with arenas either. */
Test(pool_arenas_max_fraction, a_bad_fraction_changes_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=24M");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK);
  cr_expect_eq(mp_pool_set_max_fraction(pool, 1.5), MP_EINVAL);
  cr_expect_eq(mp_pool_set_max_fraction(pool, -0.1), MP_EINVAL);
  cr_expect_eq(mp_pool_set_max_fraction(pool, 1e-300), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "max_fraction"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(total_of(pool), 24 * MiB);
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 20 * MiB, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, q), MP_OK);
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* ---- the cap moving while threads allocate ------------------------------ */
#define MOVERS 3

typedef struct moving {
  mp_pool_t *pool;
  atomic_bool stop;
  atomic_int bad;     /* failures other than the cap's */
  atomic_int served;  /* allocations that succeeded */
  atomic_int refused; /* MP_ELIMIT */
  char why[256];
} moving_t;

static void *moving_job(void *arg) {
  moving_t *m = arg;
  void *held[4] = {NULL};
  unsigned k = 0;
  while (!atomic_load(&m->stop)) {
    size_t i = k % 4;
    if (held[i] != NULL && mp_pool_free(m->pool, held[i]) != MP_OK &&
        atomic_fetch_add(&m->bad, 1) == 0)
      snprintf(m->why, sizeof m->why, "free: %s", mp_last_error());
    held[i] = NULL;
    size_t bytes = ((size_t)1 + k % 5) * MiB;
    mp_status_t st = mp_pool_alloc(m->pool, bytes, NULL, &held[i]);
    if (st == MP_OK)
      atomic_fetch_add(&m->served, 1);
    else if (st == MP_ELIMIT)
      atomic_fetch_add(&m->refused, 1);
    else if (atomic_fetch_add(&m->bad, 1) == 0)
      snprintf(m->why, sizeof m->why, "alloc: %s", mp_last_error());
    k++;
  }
  for (size_t i = 0; i < 4; i++)
    if (held[i] != NULL && mp_pool_free(m->pool, held[i]) != MP_OK)
      atomic_fetch_add(&m->bad, 1);
  return NULL;
}

Test(pool_arenas_max_fraction, the_cap_moves_while_threads_allocate,
     .timeout = 60) {
  moving_t m = {.pool = make_pool(dev, "arenas=2,max_bytes=40M")};
  pthread_t t[MOVERS];
  for (int i = 0; i < MOVERS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, moving_job, &m), 0);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0;; i++) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 3)
      break;
    double f = i % 3 == 0 ? 0.25 : i % 3 == 1 ? 1.0 : 0.5;
    cr_assert_eq(mp_pool_set_max_fraction(m.pool, f), MP_OK, "%s",
                 mp_last_error());
    check(m.pool);
    if (i % 4 == 0)
      cr_assert_eq(mp_pool_trim(m.pool, 0), MP_OK, "%s", mp_last_error());
  }
  /* The last cap, 16 MiB, with nothing above it left: after a trim the
   * arenas hold at most the cap, and grow back to it and no further. */
  cr_assert_eq(mp_pool_set_max_fraction(m.pool, 0.25), MP_OK);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 1)
      break;
    cr_assert_eq(mp_pool_trim(m.pool, 0), MP_OK, "%s", mp_last_error());
  }
  atomic_store(&m.stop, true);
  for (int i = 0; i < MOVERS; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(atomic_load(&m.bad), 0, "%s", m.why);
  cr_expect_gt(atomic_load(&m.served), 0);
  cr_assert_eq(mp_pool_trim(m.pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(m.pool).reserved_bytes, 0);
  check(m.pool);
  void *p[4];
  for (int i = 0; i < 4; i++)
    cr_expect_eq(mp_pool_alloc(m.pool, 4 * MiB, NULL, &p[i]), MP_OK, "%s",
                 mp_last_error());
  void *x;
  cr_expect_eq(mp_pool_alloc(m.pool, 2 * MiB, NULL, &x), MP_ELIMIT);
  cr_expect_leq(stats(m.pool).reserved_bytes, 16 * MiB);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(mp_pool_free(m.pool, p[i]), MP_OK);
  check(m.pool);
  cr_assert_eq(mp_pool_destroy(m.pool), MP_OK);
}

/* A pool with arenas=2 on workers wa and wb: wa's arena (*ab) holds a's
 * block of 2 MiB, wb's (*bb) holds nothing, trimmed. */
static mp_pool_t *one_busy_one_empty(job_t *a, mp_pool_t **ab, mp_pool_t **bb) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  *a = (job_t){.pool = pool, .bytes = 2 * MiB, .tag = a->tag, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x20, .count = 1};
  two_arenas(pool, a, &b);
  cr_assert_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  *ab = mp__arena_at(pool, (size_t)arena_holding(pool, a->ptrs[0]));
  *bb = *ab == mp__arena_at(pool, 0) ? mp__arena_at(pool, 1)
                                     : mp__arena_at(pool, 0);
  return pool;
}

/* A growth in flight when the cap is lowered was checked against the old
 * share: until it lands, the other arenas' shares count that share, or
 * the arenas could end above the new cap. White-box: the growth in
 * flight is arena b's flag and held share, set by hand (b holds nothing,
 * so no trim waits for it). */
Test(pool_arenas_max_fraction, a_growth_in_flight_counts_against_the_others) {
  job_t a = {.tag = 0x10};
  mp_pool_t *ab, *bb;
  mp_pool_t *pool = one_busy_one_empty(&a, &ab, &bb);
  cr_assert_eq(bb->st.reserved_bytes, 0);
  mp__pool_lock(bb);
  bb->inflight = true; /* a 24 MiB growth checked against a 24 MiB share */
  bb->grow_inflight = 24 * MiB;
  bb->cap = 24 * MiB;
  mp__pool_unlock(bb);
  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  cr_expect(bb->cap_cut && bb->cap_held == 24 * MiB, "cut %d, held %zu",
            bb->cap_cut, bb->cap_held);
  /* 32 MiB - 24 MiB leaves a 8 MiB, of which it holds 2. */
  job_t big = {.pool = pool, .bytes = 12 * MiB, .tag = 0x30, .count = 1};
  cr_expect_eq(on_worker(&wa, &big, ALLOC), MP_ELIMIT, "%s", big.why);
  job_t fits = {.pool = pool, .bytes = 4 * MiB, .tag = 0x40, .count = 1};
  cr_expect_eq(on_worker(&wa, &fits, ALLOC), MP_OK, "%s", fits.why);
  cr_expect_leq(ab->cap, 8 * MiB, "a's share %zu", ab->cap);
  /* Landed (nothing, here): the held share no longer counts. */
  mp__pool_lock(bb);
  bb->inflight = false;
  bb->grow_inflight = 0;
  mp__pool_unlock(bb);
  cr_expect_eq(on_worker(&wa, &big, ALLOC), MP_OK, "%s", big.why);
  cr_expect_eq(bb->cap_held, 0);
  cr_expect_leq(stats(pool).reserved_bytes, 32 * MiB);
  check(pool);
  cr_expect_eq(on_worker(&wa, &big, FREE), MP_OK, "%s", big.why);
  cr_expect_eq(on_worker(&wa, &fits, FREE), MP_OK, "%s", fits.why);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A growth in flight when a pool without a cap gets one was checked
 * against the device's size (its share then): the other arenas count only
 * what it holds once it lands, not that whole share. Before, they counted
 * the device's size, and none could grow at all until the growth landed
 * (MP_ELIMIT at any size). */
Test(pool_arenas_max_fraction, a_growth_in_flight_holds_only_its_own_bytes) {
  job_t a = {.tag = 0x10};
  mp_pool_t *ab, *bb;
  mp_pool_t *pool = one_busy_one_empty(&a, &ab, &bb);
  mp__pool_lock(bb);
  cr_assert_geq(bb->cap, 64 * MiB, "uncapped: the device's size");
  bb->inflight = true; /* a 4 MiB growth, checked against that */
  bb->grow_inflight = 4 * MiB;
  mp__pool_unlock(bb);
  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(bb->cap_held, 4 * MiB);
  /* 32 MiB, less bb's 4 in flight, leaves a 28 MiB, of which it holds 2. */
  job_t fits = {.pool = pool, .bytes = 20 * MiB, .tag = 0x30, .count = 1};
  cr_expect_eq(on_worker(&wa, &fits, ALLOC), MP_OK, "%s", fits.why);
  job_t over = {.pool = pool, .bytes = 8 * MiB, .tag = 0x40, .count = 1};
  cr_expect_eq(on_worker(&wa, &over, ALLOC), MP_ELIMIT, "%s", over.why);
  cr_expect_leq(ab->cap, 28 * MiB, "a's share %zu", ab->cap);
  mp__pool_lock(bb);
  bb->inflight = false;
  bb->grow_inflight = 0;
  bb->cap_held = 0;
  mp__pool_unlock(bb);
  check(pool);
  cr_expect_eq(on_worker(&wa, &fits, FREE), MP_OK, "%s", fits.why);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
