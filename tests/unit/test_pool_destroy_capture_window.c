/* test_pool_destroy_capture_window.c - mp_pool_destroy of a pool with
 * arenas while another thread begins a capture of a stream the pool knows
 * (without the pool's knowledge). Destroy refuses (MP_EBUSY, nothing
 * changed) while such a capture runs, as an event there would go into the
 * graph; with arenas it asks every arena first, so that a refusal changes
 * nothing, and then frees them in turn. A capture begun on a later arena's
 * stream after it was asked, while an earlier arena is being freed, must
 * not make the later arena refuse once the earlier one (and its live
 * blocks) went: the destroy goes on (the later arena's streams were waited
 * for before the capture began) and records nothing on the captured stream.
 * White-box: the host device is made to report the capture (it has none of
 * its own) from its first free on, as if another thread had begun it there.
 * Failed before: the destroy said MP_EBUSY, "nothing changed", with the
 * first arena gone (destroyed 0). */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static const mp__backend_t *host_ops;
static mp__backend_t ops; /* host_ops' with free and capture hooked */
static mp_stream_t streams[2];
static bool arm_at_free; /* the next device free begins the captures */
static bool captured;    /* streams[] are being captured */
static unsigned frees;
static unsigned recorded_in_capture; /* events recorded on streams[] since */

static bool is_ours(mp_stream_t s) {
  return s != NULL && (s == streams[0] || s == streams[1]);
}

static int capturing(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  return captured && is_ours(s) ? 1 : 0;
}

static mp_status_t free_capturing(mp_device_t *dev, void *ptr) {
  frees++;
  if (arm_at_free) {
    arm_at_free = false;
    captured = true;
  }
  return host_ops->free(dev, ptr);
}

static mp_status_t record_watched(mp_device_t *dev, mp_event_t e,
                                  mp_stream_t s) {
  if (captured && is_ours(s))
    recorded_in_capture++;
  return host_ops->event_record(dev, e, s);
}

/* A hooked host device with a pool (arenas=2, plain segments) whose two
 * arenas each hold an 8 MiB block allocated on a stream of their own. */
static mp_pool_t *two_arenas_on_streams(mp_device_t **out, job_t j[2]) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open("host:capacity=64M", &dev);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  /* The host backend's operations, three of them hooked. */
  host_ops = dev->ops;
  memcpy(&ops, host_ops, sizeof ops);
  ops.stream_capturing = capturing;
  ops.event_record = record_watched;
  ops.free = free_capturing;
  dev->ops = &ops;
  arm_at_free = captured = false;
  frees = recorded_in_capture = 0;
  mp_pool_t *pool = make_pool(dev, "arenas=2,virtual=0");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_create(dev, &streams[i]), MP_OK, "%s",
                 mp_last_error());
    j[i] = (job_t){.pool = pool,
                   .bytes = 8 * MiB,
                   .tag = 1u + (unsigned)i,
                   .count = 1,
                   .s = streams[i]};
  }
  two_arenas(pool, &j[0], &j[1]);
  *out = dev;
  return pool;
}

static void close_all(mp_device_t *dev) {
  worker_stop(&wa);
  worker_stop(&wb);
  captured = false;
  for (int i = 0; i < 2; i++)
    cr_expect_eq(mp_stream_destroy(dev, streams[i]), MP_OK, "%s",
                 mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}

Test(pool_destroy_capture_window, a_capture_begun_while_an_arena_is_freed) {
  mp_device_t *dev;
  job_t j[2];
  mp_pool_t *pool = two_arenas_on_streams(&dev, j);
  arm_at_free = true;
  int destroyed = -1;
  mp_status_t st = mp_pool_destroy_ex(pool, &destroyed);
  cr_assert(!arm_at_free, "the destroy freed nothing");
  cr_expect_eq(st, MP_OK, "the destroy refused (%s), destroyed %d",
               st == MP_OK ? "" : mp_last_error(), destroyed);
  cr_expect_eq(destroyed, 1);
  cr_expect_eq(recorded_in_capture, 0,
               "%u events recorded on a captured stream: into its graph",
               recorded_in_capture);
  if (destroyed == 0) {
    captured = false;
    cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  }
  close_all(dev);
}

/* A capture begun before the destroy, on either arena's stream, refuses
 * it with nothing freed; the pool is as it was (both blocks and their
 * content), and destroys once the capture ended. */
static void refused_before_anything_went(int which) {
  mp_device_t *dev;
  job_t j[2];
  mp_pool_t *pool = two_arenas_on_streams(&dev, j);
  mp_stream_t keep = streams[!which];
  streams[!which] = streams[which]; /* only streams[which] captures */
  captured = true;
  int destroyed = -1;
  cr_expect_eq(mp_pool_destroy_ex(pool, &destroyed), MP_EBUSY, "%s",
               mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), "captured"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(destroyed, 0);
  cr_expect_eq(frees, 0, "%u device frees before the refusal", frees);
  captured = false;
  streams[!which] = keep;
  check(pool);
  expect_kept(&j[0]);
  expect_kept(&j[1]);
  cr_expect_eq(stats(pool).live_blocks, 2);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(frees, 2);
  close_all(dev);
}

Test(pool_destroy_capture_window, a_capture_of_the_first_arena_refuses) {
  refused_before_anything_went(0);
}

Test(pool_destroy_capture_window, a_capture_of_the_second_arena_refuses) {
  refused_before_anything_went(1);
}
