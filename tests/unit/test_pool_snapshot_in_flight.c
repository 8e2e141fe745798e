/* A snapshot taken while another thread's growth is in flight (the pool's
 * lock dropped around the device call, lock.c) waits for that growth, as
 * mp_pool_check and mp_pool_dump do: it shows the segment the growth made,
 * never the state between. The fake device holds the growth's allocation
 * until the snapshot is seen asleep on the pool (or done, which is the
 * failure). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

static mp_pool_t *pool;
static FILE *snap;
static pthread_t snapper;
static atomic_bool snapped;
static bool waited; /* the snapshot was asleep while the growth was held */
static mp_status_t snap_st;

static void *take_snapshot(void *arg) {
  (void)arg;
  snap_st = mp_pool_snapshot_file(pool, snap);
  atomic_store(&snapped, true);
  return NULL;
}

static void nap(void) {
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
}

/* The growth's device allocation, with the pool's lock dropped and the
 * growth marked in flight: starts the snapshot and waits until it either
 * sleeps on the pool or finishes. */
static mp_status_t held_alloc(mp_device_t *dev, size_t bytes, void **out) {
  static bool once;
  if (once)
    return fake_alloc(dev, bytes, out);
  once = true;
  cr_assert_eq(pthread_create(&snapper, NULL, take_snapshot, NULL), 0);
  for (;;) {
    mp__pool_lock(pool);
    bool asleep = pool->idle_waiters > 0;
    mp__pool_unlock(pool);
    if (asleep || atomic_load(&snapped)) {
      waited = asleep;
      break;
    }
    nap();
  }
  return fake_alloc(dev, bytes, out);
}

static bool contains(FILE *f, const char *needle) {
  static char buf[1 << 16];
  rewind(f);
  size_t n = fread(buf, 1, sizeof buf, f), k = strlen(needle);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(buf + i, needle, k) == 0)
      return true;
  return false;
}

Test(pool_snapshot_in_flight, a_snapshot_waits_for_the_growth_in_flight) {
  mp__backend_t held = fake_backend;
  held.alloc = held_alloc;
  mp_device_t *dev = fake_open((size_t)1 << 30, 0); /* plain segments */
  dev->ops = &held;
  pool = make_pool(dev, NULL);
  snap = tmpfile();
  cr_assert_not_null(snap);

  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(pthread_join(snapper, NULL), 0);
  cr_assert_eq(snap_st, MP_OK);
  cr_expect(waited, "the snapshot was taken while the growth was in flight");
  cr_expect(contains(snap, "segment_type"),
            "the snapshot lacks the segment of the growth it waited for");

  fclose(snap);
  dev->ops = &fake_backend;
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  fake_pool_finish(pool, dev);
}
