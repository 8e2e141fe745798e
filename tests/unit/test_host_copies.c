/* The host device's copies follow CUDA's argument rules: the source and
 * the destination may not overlap (cuda_runtime_api.h, cudaMemcpyAsync:
 * "The memory areas may not overlap"). The host device copied them as
 * memmove does, so a caller that slid a block onto itself in one copy
 * (what defragmentation must not do) got the right bytes here and
 * garbage on a GPU. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"

#define KiB ((size_t)1 << 10)

Test(host_copies, overlapping_copies_are_einval_and_queue_nothing) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *m = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&m), MP_OK);
  for (size_t i = 0; i < 64 * KiB; i++)
    m[i] = (unsigned char)(i * 7);
  unsigned char was[64 * KiB];
  memcpy(was, m, sizeof was);
  const struct {
    size_t dst, src, n;
  } bad[] = {
      {0, 1, 16 * KiB},      /* down by one byte */
      {4 * KiB, 0, 8 * KiB}, /* up by less than n */
      {8 * KiB, 8 * KiB, 1}, /* onto itself */
      {0, 32 * KiB - 1, 32 * KiB},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_status_t st =
        mp_memcpy_async(dev, m + bad[i].dst, m + bad[i].src, bad[i].n, NULL);
    cr_expect_eq(st, MP_EINVAL, "copy %zu: %s", i, mp_status_name(st));
    if (st == MP_EINVAL)
      cr_expect(strstr(mp_last_error(), "overlap") != NULL, "%s",
                mp_last_error());
  }
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_arr_eq(m, was, sizeof was, "a refused copy ran");
  /* Ranges that only touch are not overlapping. */
  cr_expect_eq(mp_memcpy_async(dev, m, m + 32 * KiB, 32 * KiB, NULL), MP_OK);
  cr_expect_eq(mp_memcpy_async(dev, m + 16 * KiB, m, 16 * KiB, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(m[0], was[32 * KiB]);
  cr_expect_eq(m[16 * KiB], was[32 * KiB]);
  cr_expect_eq(mp_device_free(dev, m), MP_OK);
  mp_device_close(dev);
}

/* A copy or memset that runs past the end of a plain device allocation
 * (mp_device_alloc) is refused when queued, as a GPU refuses or faults on
 * a range that leaves its allocation, instead of reading or writing
 * whatever lies beyond. 60000 bytes leave the rest of the last page
 * mapped, so a copy the device let through would not fault here: it
 * would just run. */
Test(host_copies, copies_past_a_plain_allocations_end_are_einval) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  const size_t n = 60000;
  unsigned char *a = NULL, *b = NULL;
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&a), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&b), MP_OK);
  for (size_t i = 0; i < n; i++) {
    a[i] = (unsigned char)(i * 7);
    b[i] = (unsigned char)(i * 13);
  }
  unsigned char host[4096];
  memset(host, 0x5a, sizeof host);
  unsigned char was_a[60000], was_b[60000];
  memcpy(was_a, a, n);
  memcpy(was_b, b, n);
  const struct {
    void *dst;
    const void *src;
    size_t n;
  } bad[] = {
      {a + n - 1000, b, 2000},    /* the destination runs past a's end */
      {a, b + n - 1000, 2000},    /* the source runs past b's end */
      {a + n - 1, host, 2},       /* one byte past, from the host */
      {host, b + n - 100, 200},   /* to the host, one page's rest past */
      {a + n - 1000, host, 2000}, /* from the host, past a's end */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_status_t st =
        mp_memcpy_async(dev, bad[i].dst, bad[i].src, bad[i].n, NULL);
    cr_expect_eq(st, MP_EINVAL, "copy %zu: %s", i, mp_status_name(st));
    if (st == MP_EINVAL)
      cr_expect(strstr(mp_last_error(), "allocation") != NULL, "%s",
                mp_last_error());
  }
  mp_status_t st = mp_memset_async(dev, b + n - 10, 0, 11, NULL);
  cr_expect_eq(st, MP_EINVAL, "memset: %s", mp_status_name(st));
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_arr_eq(a, was_a, n, "a refused copy wrote a");
  cr_expect_arr_eq(b, was_b, n, "a refused memset wrote b");
  for (size_t i = 0; i < sizeof host; i++)
    cr_assert_eq(host[i], 0x5a, "a refused copy wrote the host buffer");
  /* Up to the last byte is inside: allowed. */
  cr_expect_eq(mp_memcpy_async(dev, a + n - 1000, b + n - 1000, 1000, NULL),
               MP_OK);
  cr_expect_eq(mp_memset_async(dev, b + n - 10, 0, 10, NULL), MP_OK);
  cr_expect_eq(mp_memcpy_async(dev, host, a + n - 16, 16, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(a[n - 1], was_b[n - 1]);
  cr_expect_eq(b[n - 1], 0);
  cr_expect_eq(host[15], was_b[n - 1]);
  cr_expect_eq(mp_device_free(dev, a), MP_OK);
  cr_expect_eq(mp_device_free(dev, b), MP_OK);
  /* What was freed is forgotten: a new allocation (perhaps at a freed
   * one's address) is whole again. */
  unsigned char *c = NULL;
  cr_assert_eq(mp_device_alloc(dev, 2 * n, (void **)&c), MP_OK);
  cr_expect_eq(mp_memset_async(dev, c, 1, 2 * n, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(c[2 * n - 1], 1);
  cr_expect_eq(mp_device_free(dev, c), MP_OK);
  mp_device_close(dev);
}
