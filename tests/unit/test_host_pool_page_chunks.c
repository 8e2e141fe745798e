/* test_host_pool_page_chunks.c - every chunk the host pool asks the device
 * for is whole pages, and reserved_bytes counts what is page-locked.
 * Page-locking works on whole pages (mlock(2): "all pages that contain a
 * part of the specified address range"; cuMemHostAlloc memory is
 * page-locked), so a chunk of 5120 bytes pins 8192: the tail was pinned
 * but neither counted in reserved_bytes (nor against max_bytes) nor ever
 * handed out. A segment_bytes that is not a multiple of the page made such
 * chunks. The test wraps the host device's host_alloc and host_free to see
 * the sizes asked. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "device/backend.h"
#include <mempool/mempool.h>

static mp__backend_t wrapped;
static const mp__backend_t *real;
static _Atomic size_t asked, odd_chunks;

static mp_status_t counting_host_alloc(mp_device_t *d, size_t bytes,
                                       void **out) {
  mp_status_t st = real->host_alloc(d, bytes, out);
  if (st == MP_OK) {
    atomic_fetch_add(&asked, bytes);
    if (bytes % (size_t)sysconf(_SC_PAGESIZE) != 0)
      atomic_fetch_add(&odd_chunks, 1);
  }
  return st;
}

static mp_device_t *dev;

static void setup(void) {
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  real = dev->ops;
  wrapped = *real;
  wrapped.host_alloc = counting_host_alloc;
  dev->ops = &wrapped;
}

static void teardown(void) {
  dev->ops = real;
  mp_device_close(dev);
}

TestSuite(host_pool_page_chunks, .init = setup, .fini = teardown);

/* segment_bytes below, above and between pages: chunks are rounded up to
 * the page, and reserved_bytes is what the device was asked for. */
Test(host_pool_page_chunks, segment_bytes_off_the_page_makes_whole_pages) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t segs[] = {1000, page + 1, 5000, 3 * page - 512};
  for (size_t i = 0; i < sizeof segs / sizeof *segs; i++) {
    mp_pool_config_t c;
    mp_pool_config_init(&c);
    c.segment_bytes = segs[i];
    mp_host_pool_t *hp = NULL;
    cr_assert_eq(mp_host_pool_create(dev, &c, &hp), MP_OK, "%s",
                 mp_last_error());
    atomic_store(&asked, 0);
    atomic_store(&odd_chunks, 0);
    void *p[4];
    for (int k = 0; k < 4; k++)
      cr_assert_eq(mp_host_pool_alloc(hp, 100, NULL, &p[k]), MP_OK, "%s",
                   mp_last_error());
    mp_stats_t st;
    cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
    cr_expect_eq(atomic_load(&odd_chunks), 0,
                 "segment_bytes %zu: %zu chunks not whole pages", segs[i],
                 atomic_load(&odd_chunks));
    cr_expect_eq(st.reserved_bytes % page, 0,
                 "segment_bytes %zu: reserved %zu is not whole pages", segs[i],
                 (size_t)st.reserved_bytes);
    cr_expect_eq(st.reserved_bytes, atomic_load(&asked),
                 "segment_bytes %zu: reserved %zu, asked of the device %zu",
                 segs[i], (size_t)st.reserved_bytes, atomic_load(&asked));
    for (int k = 0; k < 4; k++)
      cr_expect_eq(mp_host_pool_free(hp, p[k]), MP_OK);
    cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
    cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  }
}

/* Near a cap, where a whole segment no longer fits, a small request's
 * chunk is still whole pages, and the next small requests share it. It
 * was the request rounded to the pool's alignment: each 1000-byte request
 * pinned a page of its own, one device call each, counted as 1 KiB. */
Test(host_pool_page_chunks, small_requests_near_the_cap_share_whole_pages) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  c.segment_bytes = (size_t)2 << 20;
  c.max_bytes = c.segment_bytes + 16 * page;
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, &c, &hp), MP_OK, "%s", mp_last_error());
  void *big, *p[3];
  cr_assert_eq(mp_host_pool_alloc(hp, c.segment_bytes, NULL, &big), MP_OK, "%s",
               mp_last_error());
  atomic_store(&asked, 0);
  atomic_store(&odd_chunks, 0);
  for (int k = 0; k < 3; k++)
    cr_assert_eq(mp_host_pool_alloc(hp, 1000, NULL, &p[k]), MP_OK, "%s",
                 mp_last_error());
  cr_expect_eq(atomic_load(&odd_chunks), 0, "%zu chunks not whole pages",
               atomic_load(&odd_chunks));
  cr_expect_eq(atomic_load(&asked), page,
               "three 1000-byte requests asked the device for %zu bytes",
               atomic_load(&asked));
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  cr_expect_eq(st.reserved_bytes, c.segment_bytes + page);
  for (int k = 0; k < 3; k++)
    cr_expect_eq(mp_host_pool_free(hp, p[k]), MP_OK);
  cr_expect_eq(mp_host_pool_free(hp, big), MP_OK);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
}

/* segment_bytes at the pool's limit (SIZE_MAX / 2, not a multiple of the
 * page): the host pool judges it as a pool on the device does, and any
 * refusal quotes the size given. Rounding it up first carried it past the
 * limit: refused, quoting 9223372036854775808, a size never given. */
Test(host_pool_page_chunks, segment_bytes_at_the_limit_is_judged_as_given) {
  mp_device_t *d;
  cr_assert_eq(mp_device_open("host", &d), MP_OK, "%s", mp_last_error());
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  c.segment_bytes = SIZE_MAX / 2;
  mp_pool_t *p;
  mp_status_t on_device = mp_pool_create(d, &c, &p);
  if (on_device == MP_OK)
    cr_expect_eq(mp_pool_destroy(p), MP_OK);
  mp_host_pool_t *hp;
  mp_status_t st = mp_host_pool_create(d, &c, &hp);
  cr_expect_eq(st, on_device, "%s", mp_last_error());
  if (st == MP_OK)
    cr_expect_eq(mp_host_pool_destroy(hp), MP_OK);
  else
    cr_expect(strstr(mp_last_error(), "9223372036854775807") != NULL, "%s",
              mp_last_error());
  mp_device_close(d);
}
