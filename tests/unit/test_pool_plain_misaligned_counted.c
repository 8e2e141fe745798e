/* test_pool_plain_misaligned_counted.c - a virtual pool whose align (1 MiB
 * here) is above what plain memory promises falls back to plain segments
 * when its range cannot be reserved; memory the device returns at an
 * address off that align is freed again and the growth fails (MP_ENOTSUP).
 * Both device calls are counted (stats.h: device_alloc_count and
 * device_free_count are calls into the driver), so that the two counters
 * still differ by the allocations the pool holds. Before, neither was. A
 * device that refuses to take such memory back says so, the memory lost to
 * the pool. On the synchronous fake device, whose allocations here come
 * back 4 KiB past a 1 MiB boundary. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* The fake device's allocations, each handed out 4 KiB past its start. */
static struct { void *out, *real; } given[16];
static size_t ngiven;

static mp_status_t off_alloc(mp_device_t *dev, size_t bytes, void **out) {
  void *real;
  mp_status_t st = fake_alloc(dev, bytes + 2 * MiB, &real);
  if (st != MP_OK)
    return st;
  uintptr_t a = ((uintptr_t)real + MiB - 1) / MiB * MiB + 4096;
  given[ngiven].out = (void *)a;
  given[ngiven++].real = real;
  *out = (void *)a;
  return MP_OK;
}

static mp_status_t off_free(mp_device_t *dev, void *ptr) {
  for (size_t i = 0; i < ngiven; i++)
    if (given[i].out == ptr) {
      mp_status_t st = fake_free(dev, given[i].real);
      if (st == MP_OK)
        given[i] = given[--ngiven];
      return st;
    }
  return MP_EINVAL;
}

static mp__backend_t off_backend;

/* A 1 GiB device with 2 MiB granules whose address space holds no range,
 * its plain memory off 1 MiB. */
static mp_device_t *off_open(void) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  off_backend = fake_backend;
  off_backend.alloc = off_alloc;
  off_backend.free = off_free;
  dev->ops = &off_backend;
  fake_of(dev)->max_reserve = 4096;
  return dev;
}

Test(pool_plain_misaligned_counted, both_device_calls_are_counted) {
  mp_device_t *dev = off_open();
  mp_pool_t *p = make_pool(dev, "align=1M");
  void *a = NULL;
  mp_status_t st = mp_pool_alloc(p, MiB, NULL, &a);
  cr_expect_eq(st, MP_ENOTSUP, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(a, NULL);
  cr_expect(strstr(mp_last_error(), "not aligned to the pool's align") != NULL,
            "%s", mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_gt(s.device_alloc_count, 0, "the allocation is counted");
  cr_expect_eq(s.device_free_count, s.device_alloc_count,
               "%llu allocations, %llu frees",
               (unsigned long long)s.device_alloc_count,
               (unsigned long long)s.device_free_count);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.segment_count, 0);
  cr_expect_eq(fake_of(dev)->used, 0, "nothing held on the device");
  cr_expect_eq(ngiven, 0);
  fake_pool_finish(p, dev);
}

/* The free refused: the allocation counted, no free, and the message says
 * the memory stayed on the device. */
Test(pool_plain_misaligned_counted, a_refused_free_says_the_memory_is_lost) {
  mp_device_t *dev = off_open();
  mp_pool_t *p = make_pool(dev, "align=1M");
  fake_of(dev)->refuse_frees = 1000;
  void *a = NULL;
  mp_status_t st = mp_pool_alloc(p, MiB, NULL, &a);
  fake_of(dev)->refuse_frees = 0;
  cr_expect_eq(st, MP_ENOTSUP, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "refused to take it back") != NULL, "%s",
            mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_gt(s.device_alloc_count, 0, "the allocation is counted");
  cr_expect_eq(s.device_free_count, 0);
  cr_expect_eq(s.reserved_bytes, 0);
  check(p);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  while (ngiven > 0)
    cr_assert_eq(off_free(dev, given[0].out), MP_OK);
  fake_close(dev);
}
