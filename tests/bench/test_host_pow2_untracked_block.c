/* host-pow2 with no host memory left to track a new block: before, it
 * asked the driver for the block first, then, unable to record it, gave it
 * back and counted that free as a device call even when the driver refused
 * it, so device_calls said two calls where one was made, and the refused
 * block, tracked nowhere, was never freed. Room in the block table is
 * taken before the driver is asked, as the free list's is: the request is
 * MP_ENOMEM with no driver call. The host device never refuses a free, so
 * the test wraps its operations table, counting what the driver did. */
#include <criterion/criterion.h>

#include "device/backend.h"
#include "internal.h"
#include "mpbench.h"

static mp__backend_t wrapped;
static const mp__backend_t *real;
static bool refuse_frees, bookkeeping_fails;
static int pins_made, pins_freed;

/* The driver's own bookkeeping is not mempool's heap: the injected
 * failure leaves it alone. */
static mp_status_t counted_host_alloc(mp_device_t *d, size_t bytes,
                                      void **out) {
  mp__fault_host_every(false);
  mp_status_t st = real->host_alloc(d, bytes, out);
  mp__fault_host_every(bookkeeping_fails);
  pins_made += st == MP_OK;
  return st;
}

static mp_status_t refusing_host_free(mp_device_t *d, void *p) {
  if (refuse_frees)
    return mp__fail(MP_EDRIVER, "test: the device refused this host free");
  mp_status_t st = real->host_free(d, p);
  pins_freed += st == MP_OK;
  return st;
}

/* dev's page-locked allocations counted, its frees refusable. */
static void wrap(mp_device_t *dev) {
  wrapped = *(real = dev->ops);
  wrapped.host_alloc = counted_host_alloc;
  wrapped.host_free = refusing_host_free;
  dev->ops = &wrapped;
}

Test(host_pow2, a_block_it_cannot_track_costs_no_driver_call) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  wrap(dev);
  mpb_allocator_t *a = NULL;
  cr_assert_eq(mpb_allocator_open("host-pow2", dev, NULL, &a), MP_OK, "%s",
               mp_last_error());

  void *p = NULL;
  refuse_frees = bookkeeping_fails = true;
  mp__fault_host_every(true);
  mp_status_t st = mpb_allocator_alloc(a, 3000, NULL, &p);
  mp__fault_host_every(false);
  refuse_frees = bookkeeping_fails = false;
  cr_expect_eq(st, MP_ENOMEM, "%s", mp_last_error());
  cr_expect_null(p);
  mpb_sample_t s;
  mpb_allocator_sample(a, &s);
  cr_expect_eq(s.device_calls, (uint64_t)(pins_made + pins_freed),
               "%llu device calls counted, the driver made %d pins and "
               "freed %d",
               (unsigned long long)s.device_calls, pins_made, pins_freed);
  cr_expect_eq(s.reserved, 0);

  /* Still usable, and the count stays the driver's. */
  cr_expect_eq(mpb_allocator_alloc(a, 3000, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  mpb_allocator_sample(a, &s);
  cr_expect_eq(s.device_calls, (uint64_t)(pins_made + pins_freed));
  cr_expect_eq(s.reserved, 4096);
  mpb_allocator_close(a);
  cr_expect_eq(pins_made, pins_freed,
               "%d page-locked blocks made, %d freed by the close", pins_made,
               pins_freed);
  dev->ops = real;
  mp_device_close(dev);
}
