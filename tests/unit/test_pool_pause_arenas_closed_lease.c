/* A pause of a pool with arenas whose exported blocks' leases were closed
 * (mp_ipc_handle_close) and not yet let go: letting the second go gives the
 * first one's plain segment back at once (release_threshold), and that
 * device free waits for the host functions queued on the device's streams
 * (cuda.h, cuMemFree: "this API may perform implicit synchronization"; the
 * host device's free synchronizes the device, as drivers do). A host
 * function may be waiting for the pool's own lock (cuLaunchHostFunc runs it
 * "after currently enqueued work"; here mp_pool_add_stream, as a new
 * thread's first allocation, which makes its arena, would), so the pause
 * must not hold that lock while it lets such blocks go. It did
 * (mp__arenas_pause_check), and the pause hung: the free waited for the
 * host function, the host function for the lock. White-box: the device's
 * free is wrapped to tell when the pause reaches it. */
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
static atomic_bool armed, gate_open;
static atomic_int frees_armed;

/* The device free of the plain segment: opens the gate of the host
 * function queued before the pause, then frees (waiting for it). */
static mp_status_t free_opening_the_gate(mp_device_t *d, void *ptr) {
  if (atomic_load(&armed)) {
    atomic_fetch_add(&frees_armed, 1);
    atomic_store(&gate_open, true);
  }
  return host_ops->free(d, ptr);
}

typedef struct {
  mp_pool_t *pool;
  mp_stream_t other;
  bool gate_seen; /* false: the gate timed out (no free during the pause) */
  bool returned;
} host_fn_arg_t;

/* Waits (at most 30 s: 5 s was short for a loaded machine) for the
 * pause's device free, then adds a stream to
 * the pool, which takes the pool's lock (mp__arena_add_stream). Whether it
 * is added does not matter here (its device calls may be refused in a
 * host function); that it returns does. */
static void add_stream_after_the_gate(void *v) {
  host_fn_arg_t *a = v;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    if (atomic_load(&gate_open))
      break;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while (t.tv_sec - t0.tv_sec < 30);
  a->gate_seen = atomic_load(&gate_open);
  (void)mp_pool_add_stream(a->pool, a->other);
  a->returned = true;
}

/* max_bytes=21M is no whole number of 2 MiB granules: each 256 KiB block
 * past the 20 MiB one is a plain segment of its own (as in
 * test_pool_pause.c), freed while exported, so held. */
Test(pool_pause_arenas_closed_lease,
     a_plain_segment_freed_at_the_pause_does_not_wait_under_the_pool_lock,
     .timeout = 60) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.free = free_opening_the_gate;
  dev->ops = &ops;
  mp_pool_t *pool =
      make_pool(dev, "max_bytes=21M,arenas=2,release_threshold=1");
  void *big, *small[2];
  cr_assert_eq(mp_pool_alloc(pool, 20 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  mp_ipc_handle_t h[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_alloc(pool, 256 * 1024, NULL, &small[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_ipc_export(pool, small[i], &h[i]), MP_OK, "%s",
                 mp_last_error());
  }
  cr_assert_eq(stats(pool).segment_count, 3, "the test needs plain segments");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_free(pool, small[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_ipc_handle_close(&h[i]), MP_OK, "%s", mp_last_error());
  }
  cr_assert_eq(stats(pool).segment_count, 3, "held while not reaped");

  mp_stream_t s, other;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK, "%s", mp_last_error());
  host_fn_arg_t a = {.pool = pool, .other = other};
  atomic_store(&armed, true);
  cr_assert_eq(mp_stream_launch_host(dev, s, add_stream_after_the_gate, &a),
               MP_OK, "%s", mp_last_error());
  /* It hung here: Criterion's timeout fails the test. */
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  atomic_store(&armed, false);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect(a.gate_seen, "no device free during the pause: the test needs "
                         "the plain segment given back there");
  cr_expect(a.returned);
  cr_expect_geq(atomic_load(&frees_armed), 1);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, big), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}
