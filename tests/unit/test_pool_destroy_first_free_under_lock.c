/* test_pool_destroy_first_free_under_lock.c - destroy's first device free
 * (mp__plain_release_first, segment.c) may be refused, and then the pool
 * stays as it was, for the calls other threads made meanwhile: a trim
 * there must not reach the plain segment being freed. It did: the free ran
 * with no lock and nothing marked in flight, so another thread's
 * mp_pool_trim found the same free plain segment, freed it on the device
 * while destroy's free of it was under way (a double free), unlinked it
 * and freed its record, which destroy then read for its message. Now the
 * free is marked in flight (the lock dropped around it, as any release's),
 * and the trim waits for it. White-box: the device's free is wrapped; the
 * destroy's is refused after it gave the trim a second to run. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "device/backend.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static const mp__backend_t *host_ops;
static mp__backend_t ops;
static pthread_t main_thread;
static atomic_bool armed, go, trim_done;
static _Atomic(void *) destroying; /* the pointer destroy's free is freeing */
static atomic_int overlaps, destroy_frees;

/* The destroy's free (the main thread's, armed): lets the trim go, gives it
 * a second, then refuses. Another thread's free of the same pointer while
 * this one runs is an overlap. */
static mp_status_t wrapped_free(mp_device_t *d, void *ptr) {
  if (!pthread_equal(pthread_self(), main_thread)) {
    if (atomic_load(&destroying) == ptr)
      atomic_fetch_add(&overlaps, 1);
    return host_ops->free(d, ptr);
  }
  if (!atomic_load(&armed))
    return host_ops->free(d, ptr);
  atomic_store(&armed, false);
  atomic_fetch_add(&destroy_frees, 1);
  atomic_store(&destroying, ptr);
  atomic_store(&go, true);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    nanosleep(&(struct timespec){0, 1000000}, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (!atomic_load(&trim_done) && t.tv_sec - t0.tv_sec < 1);
  atomic_store(&destroying, NULL);
  return MP_EDRIVER;
}

static void *trim_thread(void *v) {
  mp_pool_t *pool = v;
  while (!atomic_load(&go))
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  (void)mp_pool_trim(pool, 0);
  atomic_store(&trim_done, true);
  return NULL;
}

Test(pool_destroy_first_free_under_lock,
     a_trim_while_the_refused_first_free_runs_waits_for_it, .timeout = 20) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.free = wrapped_free;
  dev->ops = &ops;
  main_thread = pthread_self();
  mp_pool_t *pool = make_pool(dev, "virtual=0");
  void *v;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &v), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, v), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 1,
               "the test needs a free plain "
               "segment");
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, trim_thread, pool), 0);
  atomic_store(&armed, true);
  mp_status_t st = mp_pool_destroy(pool);
  pthread_join(th, NULL);
  cr_assert_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(atomic_load(&destroy_frees), 1);
  cr_expect_eq(atomic_load(&overlaps), 0,
               "the trim freed the plain segment while destroy's free of it "
               "was under way");
  /* Refused: the pool runs (the trim gave the segment back after). */
  check(pool);
  cr_expect_eq(stats(pool).segment_count, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}
