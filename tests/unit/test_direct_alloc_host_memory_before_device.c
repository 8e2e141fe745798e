/* test_direct_alloc_host_memory_before_device.c - mp_direct_alloc takes
 * the block map's room for the block before it asks the device, so that
 * a host out of memory refuses the call with nothing allocated. It asked
 * after: the block the device gave was freed again, unchecked, and a
 * device that refused that free left it allocated and tracked nowhere:
 * neither a session nor destroy would ever give it back. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "internal.h"
#include "pool_fakedev.h"

Test(direct_alloc_host_memory_before_device,
     a_host_failure_allocates_nothing_on_the_device) {
  mp_device_t *dev = fake_open((size_t)64 << 20, 0);
  fake_dev_t *f = fake_of(dev);
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
  mp_stats_t before, after;
  cr_assert_eq(mp_direct_get_stats(d, &before), MP_OK);
  unsigned allocs = f->allocs;
  /* The map is empty, without room: the block's entry needs host memory.
   * Should the device be asked first, its free of the block is refused. */
  f->refuse_frees = 1;
  void *p = (void *)0x1;
  mp__fault_host_every(true);
  mp_status_t st = mp_direct_alloc(d, (size_t)1 << 20, NULL, &p);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_ENOMEM, "%s", mp_status_name(st));
  cr_expect_str_eq(mp_last_error(), "mp_direct_alloc: out of host memory");
  cr_expect_eq(p, (void *)0x1, "*out changed");
  cr_expect_eq(f->allocs, allocs, "the device was asked");
  cr_expect_eq(f->used, 0, "%zu bytes allocated on the device", f->used);
  cr_assert_eq(mp_direct_get_stats(d, &after), MP_OK);
  cr_expect_eq(after.alloc_count, before.alloc_count);
  cr_expect_eq(after.device_alloc_count, before.device_alloc_count);
  cr_expect_eq(after.oom_count, before.oom_count);
  f->refuse_frees = 0;
  /* With host memory back, the allocator serves and gives back as ever. */
  cr_assert_eq(mp_direct_alloc(d, (size_t)1 << 20, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0, "%zu bytes lost to the allocator", f->used);
  fake_close(dev);
}
