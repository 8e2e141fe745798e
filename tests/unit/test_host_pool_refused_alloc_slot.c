/* test_host_pool_refused_alloc_slot.c - an mp_host_pool_alloc that gets no
 * buffer because the device refuses the page-locked memory (or the pool's
 * own bookkeeping runs out of host memory) leaves the pool's stream table
 * as it was: the stream it named is still unknown to the pool, which it
 * never used. mp_host_pool_alloc makes the stream's slot before the buffer
 * (host_pool.c says why); a refusal after that kept the slot, so every
 * distinct stream refused once stayed in the table, and trim and destroy
 * waited for it (refused while it captures), until the table was full
 * (65535 streams) and no new stream could allocate at all. White-box: the
 * device's host_alloc refuses while `refuse` is set (a copy of the host
 * backend's operations), and fault.c fails host allocations. Failed
 * before: the stream count rose by one with each refused stream. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/host_pool.h>

#include "../support/device_helpers.h"
#include "../support/host_pool_streams.h"
#include "device/backend.h"

#define NS ((int)24)

static mp_device_t *dev;
static const mp__backend_t *host_ops;
static mp__backend_t ops; /* dev's: host_ops' but host_alloc */
static mp_host_pool_t *hp;
static mp_stream_t s[NS];
static bool refuse;
static unsigned refused;

static mp_status_t refusing_host_alloc(mp_device_t *d, size_t bytes,
                                       void **out) {
  if (refuse) {
    refused++;
    return mp__fail(MP_ENOMEM, "fake host_alloc refuses %zu bytes", bytes);
  }
  return host_ops->host_alloc(d, bytes, out);
}

static void setup(void) {
  dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.host_alloc = refusing_host_alloc;
  dev->ops = &ops;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  refuse = false;
  mp__fault_host_every(false);
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < NS; i++)
    cr_expect_eq(mp_stream_destroy(dev, s[i]), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}

TestSuite(host_pool_refused_alloc_slot, .init = setup, .fini = teardown);

/* The streams the pool knows now. */
static unsigned streams_known(void) {
  return host_pool_streams_known(hp);
}

/* A 4 KiB buffer for stream t, freed: it works. */
static void alloc_works_on(mp_stream_t t) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, t, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

/* A refused allocation on stream t: the device's refusal, the stream
 * still unknown, nothing reserved, *out untouched. */
static void refused_on(mp_stream_t t, const char *what) {
  unsigned before = streams_known();
  unsigned calls = refused;
  mp_stats_t st_before;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st_before), MP_OK);
  void *sentinel = &before, *p = sentinel;
  refuse = true;
  mp_status_t st = mp_host_pool_alloc(hp, (size_t)8 << 20, t, &p);
  refuse = false;
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", what, mp_last_error());
  cr_expect_gt(refused, calls, "%s: the device was not asked", what);
  cr_expect_not_null(strstr(mp_last_error(), "out of page-locked host memory"),
                     "%s: %s", what, mp_last_error());
  cr_expect_eq(p, sentinel, "%s: *out written", what);
  cr_expect_eq(streams_known(), before,
               "%s: the refused allocation left its stream in the pool", what);
  mp_stats_t st_after;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st_after), MP_OK);
  cr_expect_leq(st_after.reserved_bytes, st_before.reserved_bytes,
                "%s: the refusal kept page-locked memory", what);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
}

/* The pool's own stream for every buffer (host_pool.c, hp->host) gets its
 * slot at the first allocation, refused or not: the count starts after
 * one. */
static unsigned after_first_refusal(void) {
  void *p = NULL;
  refuse = true;
  cr_assert_neq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK);
  refuse = false;
  return streams_known();
}

Test(host_pool_refused_alloc_slot, a_device_refusal_leaves_its_stream_unknown) {
  unsigned base = after_first_refusal();
  refused_on(NULL, "the default stream");
  char what[32];
  for (int i = 0; i < NS; i++) {
    snprintf(what, sizeof what, "stream %d", i);
    refused_on(s[i], what);
  }
  cr_expect_eq(streams_known(), base, "%u streams refused are known",
               streams_known() - base);
  /* Every stream allocates once the device gives memory again, the
   * default stream too (its slot made then, not skipped as made). */
  alloc_works_on(NULL);
  cr_expect_eq(streams_known(), base + 1, "the default stream's slot");
  for (int i = 0; i < NS; i++)
    alloc_works_on(s[i]);
  cr_expect_eq(streams_known(), base + 1 + NS);
  /* Known streams stay known through a refusal. */
  refused_on(s[0], "a known stream");
  refused_on(NULL, "the known default stream");
  cr_expect_eq(streams_known(), base + 1 + NS);
}

/* Refused for want of host memory for the pool's records, stream after
 * stream: the table does not grow with them, and each stream allocates
 * once the memory is back. */
Test(host_pool_refused_alloc_slot,
     streams_refused_one_after_another_take_no_slots) {
  alloc_works_on(NULL);
  unsigned before = streams_known();
  for (int i = 0; i < NS; i++) {
    void *p = NULL;
    mp__fault_host_every(true);
    mp_status_t st = mp_host_pool_alloc(hp, (size_t)8 << 20, s[i], &p);
    mp__fault_host_every(false);
    cr_expect_neq(st, MP_OK, "stream %d", i);
    if (st == MP_OK)
      cr_assert_eq(mp_host_pool_free(hp, p), MP_OK);
  }
  cr_expect_eq(streams_known(), before,
               "%u streams refused an allocation are known to the pool",
               streams_known() - before);
  for (int i = 0; i < NS; i++)
    alloc_works_on(s[i]);
  cr_expect_eq(streams_known(), before + NS);
}
