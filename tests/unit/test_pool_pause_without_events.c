/* A pause waits for the pool's streams by an event on each, never by a
 * device synchronize (pool.h: on CUDA a cuCtxSynchronize beside another
 * thread's capture invalidates it). Where no event can be had (out of host
 * memory for the set, or the device refuses to record one) the pause is
 * refused, MP_ENOMEM with a clear message, and changes nothing: the pool
 * runs on with its blocks and their content, and a later pause works. It
 * used to fall back to a device synchronize and pause anyway. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* The fake device, whose event records fail while refuse_records is set. */
static bool refuse_records;
static mp_status_t record_or_refuse(mp_device_t *dev, mp_event_t e,
                                    mp_stream_t s) {
  return refuse_records ? MP_EDRIVER : fake_event_record(dev, e, s);
}
/* flaky_unmap.h's device (page-locked host memory for the kept content),
 * no unmap failing. */
static mp_device_t *open_dev(void) {
  mp_device_t *dev = flaky_open(0);
  flaky_backend.event_record = record_or_refuse;
  return dev;
}

typedef struct used {
  mp_stream_t s;
  void *v[2];
} used_t;

/* Two blocks, one on a stream of the pool's, each filled with its byte. */
static used_t use_pool(mp_pool_t *p, mp_device_t *dev) {
  used_t u;
  cr_assert_eq(mp_stream_create(dev, &u.s), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, u.s, &u.v[0]), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &u.v[1]), MP_OK);
  for (int i = 0; i < 2; i++)
    memset(u.v[i], 0x40 + i, 2 * MiB);
  return u;
}

static void expect_content(const used_t *u) {
  for (int i = 0; i < 2; i++) {
    const unsigned char *c = u->v[i];
    size_t at = 0;
    while (at < 2 * MiB && c[at] == 0x40 + i)
      at++;
    cr_expect_eq(at, 2 * MiB, "block %d lost its content from byte %zu", i, at);
  }
}

/* After a refused pause: running, as before. */
static void expect_running(mp_pool_t *p, const used_t *u, mp_stats_t before) {
  check(p);
  mp_stats_t now = stats(p);
  cr_expect_eq(now.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(now.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(now.live_blocks, before.live_blocks);
  expect_content(u);
  void *q = NULL;
  cr_assert_eq(mp_pool_alloc(p, 4096, u->s, &q), MP_OK,
               "the pool refused an allocation after the refused pause: %s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, q), MP_OK);
}

/* Resumes a paused pool and lets everything go. */
static void finish(mp_pool_t *p, mp_device_t *dev, used_t *u) {
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_content(u);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_free(p, u->v[i]), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, u->s), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_pause_without_events, no_host_memory_refuses_without_a_device_sync) {
  mp_device_t *dev = open_dev();
  mp_pool_t *p = make_pool(dev, NULL);
  used_t u = use_pool(p, dev);
  bool refused = false;
  for (long k = 0; k < 1000; k++) {
    mp_stats_t before = stats(p);
    fake_of(dev)->syncs = 0;
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT);
    mp__fault_host_after(-1);
    cr_assert_eq(fake_of(dev)->syncs, 0,
                 "k=%ld: the pause synchronized the device (status %d)", k, st);
    if (st == MP_OK)
      break;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: status %d: %s", k, st, mp_last_error());
    cr_assert(strstr(mp_last_error(), "host memory") != NULL,
              "k=%ld: unclear message '%s'", k, mp_last_error());
    refused |= strstr(mp_last_error(), "no device synchronize") != NULL;
    expect_running(p, &u, before);
  }
  cr_expect(refused, "no try failed for want of the streams' events");
  finish(p, dev, &u);
}

Test(pool_pause_without_events, refused_event_refuses_without_a_device_sync) {
  mp_device_t *dev = open_dev();
  mp_pool_t *p = make_pool(dev, NULL);
  used_t u = use_pool(p, dev);
  mp_stats_t before = stats(p);
  fake_of(dev)->syncs = 0;
  refuse_records = true;
  mp_status_t st = mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT);
  refuse_records = false;
  cr_assert_eq(fake_of(dev)->syncs, 0,
               "the pause synchronized the device (status %d)", st);
  cr_assert_eq(st, MP_ENOMEM, "status %d: %s", st, mp_last_error());
  cr_expect(strstr(mp_last_error(), "no device synchronize") != NULL,
            "unclear message '%s'", mp_last_error());
  expect_running(p, &u, before);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(fake_of(dev)->syncs, 0);
  finish(p, dev, &u);
}
