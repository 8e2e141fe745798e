/* test_pool_unmap_refusal_no_stale_reason.c - where the device refuses an
 * unmap, a peer's access or a free without recording why (the backend's
 * table promises no message: the fake device here answers a bare
 * MP_EDRIVER), the pool's message says the device gave no reason. Before,
 * it gave the thread's last error, an older failure of the caller's
 * ("mp_pool_trim: pool is NULL"), as the device's reason: mp_pool_destroy's
 * refused unmap of a chunk, of a stray, and of a kept staging buffer's
 * free; a growth whose map a peer's access refused; mp_pool_set_access
 * refused for a chunk mapped already; mp_pool_destroy's wait for the
 * streams refused. As test_pool_refusal_gives_no_stale_
 * reason.c for plain segments and the trim. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"
#include "kept_staging.h"

#define MiB ((size_t)1 << 20)

/* The next bare_unmaps unmaps, bare_accesses grants and bare_waits event
 * waits are refused without a message. */
static unsigned bare_unmaps, bare_accesses, bare_waits;
static mp__backend_t bare_backend;

static mp_status_t bare_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  if (bare_unmaps > 0) {
    bare_unmaps--;
    return MP_EDRIVER;
  }
  return flaky_vm_unmap(dev, addr, bytes);
}

static mp_status_t bare_vm_access(mp_device_t *dev, void *addr, size_t bytes,
                                  mp_device_t *peer, bool grant) {
  if (grant && bare_accesses > 0) {
    bare_accesses--;
    return MP_EDRIVER;
  }
  return flaky_vm_access(dev, addr, bytes, peer, grant);
}

static mp_status_t bare_event_sync(mp_device_t *dev, mp_event_t e) {
  if (bare_waits > 0) {
    bare_waits--;
    return MP_EDRIVER;
  }
  return fake_event_x(dev, e);
}

/* The flaky device (1 GiB, 2 MiB granules) refusing bare, and its peer. */
static mp_device_t *bare_open(mp_device_t **peer) {
  mp_device_t *dev = flaky_open(0);
  bare_backend = flaky_backend;
  bare_backend.vm_unmap = bare_vm_unmap;
  bare_backend.vm_access = bare_vm_access;
  bare_backend.event_synchronize = bare_event_sync;
  dev->ops = &bare_backend;
  *peer = flaky_peer_open();
  (*peer)->ops = &bare_backend; /* a device of the pool's kind */
  bare_unmaps = bare_accesses = bare_waits = 0;
  return dev;
}

/* A pool on dev with one 2 MiB block, *x. */
static mp_pool_t *pool_with_block(mp_device_t *dev, void **x) {
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, x), MP_OK, "%s",
               mp_last_error());
  return p;
}

/* The caller's own failure, the thread's last error before the call. */
static void caller_failure(void) {
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
}

/* st is MP_EDRIVER, its message holding what, saying the device gave no
 * reason, and holding no older failure. */
static void expect_no_reason(mp_status_t st, const char *what) {
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), e);
  cr_expect(strstr(e, what) != NULL, "no '%s': %s", what, e);
  cr_expect(strstr(e, "device driver error (the device gave no reason)") !=
                NULL,
            "%s", e);
  cr_expect(strstr(e, "pool is NULL") == NULL,
            "an older failure given as the device's reason: %s", e);
}

/* The destroy goes on past a refused unmap (the memory is lost to the
 * pool) and says why. */
Test(pool_unmap_refusal_no_stale_reason, a_refused_unmap_at_destroy) {
  mp_device_t *peer, *dev = bare_open(&peer);
  void *x;
  mp_pool_t *p = pool_with_block(dev, &x);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  caller_failure();
  bare_unmaps = 1;
  expect_no_reason(mp_pool_destroy(p), "refused to unmap the chunk");
  fake_close(dev);
  fake_close(peer);
}

/* A growth whose map the peer's access refuses, then its unmap too: a
 * stray. The growth's message, and the destroy's, whose unmap of the
 * stray is refused again. */
Test(pool_unmap_refusal_no_stale_reason, a_refused_access_and_stray) {
  mp_device_t *peer, *dev = bare_open(&peer);
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  void *x;
  caller_failure();
  bare_accesses = bare_unmaps = 1;
  expect_no_reason(mp_pool_alloc(p, 2 * MiB, NULL, &x), "device driver");
  cr_assert_eq(p->nstrays, 1, "no stray");
  caller_failure();
  bare_unmaps = 100;
  expect_no_reason(mp_pool_destroy(p),
                   "a refused peer access left is still mapped");
  fake_close(dev);
  fake_close(peer);
}

/* mp_pool_set_access refused for the chunk mapped already: the pool as
 * it was. */
Test(pool_unmap_refusal_no_stale_reason, a_refused_set_access) {
  mp_device_t *peer, *dev = bare_open(&peer);
  void *x;
  mp_pool_t *p = pool_with_block(dev, &x);
  caller_failure();
  bare_accesses = 1;
  expect_no_reason(mp_pool_set_access(p, peer), "device driver");
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

/* A staging buffer whose free the device refused is kept (defrag.c); the
 * destroy frees it first, and is refused again: the pool as it was. */
Test(pool_unmap_refusal_no_stale_reason, a_refused_staging_buffer_free) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *p = make_pool(dev, "virtual=0,segment_bytes=2M,align=512");
  cr_assert_eq(mp_handle_free(kept_staging_buffer(p, dev)), MP_OK);
  caller_failure();
  f->refuse_frees = 1;
  expect_no_reason(mp_pool_destroy(p), "staging buffer");
  fake_pool_finish(p, dev);
}

/* The device refuses the destroy's wait for the pool's streams: nothing
 * released, the pool as it was. */
Test(pool_unmap_refusal_no_stale_reason, a_refused_wait_at_destroy) {
  mp_device_t *peer, *dev = bare_open(&peer);
  void *v[2];
  mp_pool_t *p = pool_with_block(dev, &v[0]);
  mp_stream_t s; /* a stream of its own, which the destroy waits for */
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4096, s, &v[1]), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  caller_failure();
  bare_waits = 1;
  expect_no_reason(mp_pool_destroy(p), "cannot wait for the device here");
  fake_pool_finish(p, dev);
  fake_close(peer);
}
