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

/* The same for page-locked host memory (mp_device_host_alloc): the driver
 * knows each such allocation's range as it knows a device allocation's
 * (cuda.h, cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
 * and CU_POINTER_ATTRIBUTE_RANGE_SIZE), so a copy or memset that runs
 * past its end is refused when queued, not run over what lies beyond. */
Test(host_copies, copies_past_a_pinned_allocations_end_are_einval) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  const size_t n = 60000;
  unsigned char *p = NULL, *d = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, n, (void **)&p), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&d), MP_OK);
  for (size_t i = 0; i < n; i++) {
    p[i] = (unsigned char)(i * 7);
    d[i] = (unsigned char)(i * 13);
  }
  unsigned char was_p[60000], was_d[60000];
  memcpy(was_p, p, n);
  memcpy(was_d, d, n);
  const struct {
    void *dst;
    const void *src;
    size_t n;
  } bad[] = {
      {p + n - 1000, d, 2000}, /* the destination runs past p's end */
      {d, p + n - 1000, 2000}, /* the source runs past p's end */
      {p + n - 1, d, 2},       /* one byte past */
      {d, p + n - 100, 200},   /* the page's rest past */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_status_t st =
        mp_memcpy_async(dev, bad[i].dst, bad[i].src, bad[i].n, NULL);
    cr_expect_eq(st, MP_EINVAL, "copy %zu: %s", i, mp_status_name(st));
    if (st == MP_EINVAL)
      cr_expect(strstr(mp_last_error(), "allocation") != NULL, "%s",
                mp_last_error());
  }
  mp_status_t st = mp_memset_async(dev, p + n - 10, 0, 11, NULL);
  cr_expect_eq(st, MP_EINVAL, "memset: %s", mp_status_name(st));
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_arr_eq(p, was_p, n, "a refused copy or memset wrote p");
  cr_expect_arr_eq(d, was_d, n, "a refused copy wrote d");
  /* Up to the last byte is inside: allowed. */
  cr_expect_eq(mp_memcpy_async(dev, p + n - 1000, d + n - 1000, 1000, NULL),
               MP_OK);
  cr_expect_eq(mp_memset_async(dev, p, 0, 10, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(p[n - 1], was_d[n - 1]);
  cr_expect_eq(p[9], 0);
  cr_expect_eq(mp_device_host_free(dev, p), MP_OK);
  /* What was freed is forgotten: a new allocation (perhaps at the freed
   * one's address) is whole again. */
  unsigned char *q = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 2 * n, (void **)&q), MP_OK);
  cr_expect_eq(mp_memset_async(dev, q, 1, 2 * n, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(q[2 * n - 1], 1);
  cr_expect_eq(mp_device_host_free(dev, q), MP_OK);
  cr_expect_eq(mp_device_free(dev, d), MP_OK);
  mp_device_close(dev);
}
