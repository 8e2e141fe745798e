/* test_direct_interior_pointers.c - a pointer into the middle of a direct
 * allocator's block (a view at an offset, freed as if it were the block) is
 * refused with a message that says so and names the block it lies in, as
 * the pool's refusal does, rather than calling it memory this allocator
 * never handed out; and nothing changes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <mempool/mempool.h>

static mp_device_t *dev;
static mp_direct_t *d;

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  cr_expect_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

TestSuite(direct_interior_pointers, .init = setup, .fini = teardown);

/* "%p" of p, as the library prints it. */
static void addr_of(const void *p, char *buf, size_t n) {
  snprintf(buf, n, "%p", p);
}

Test(direct_interior_pointers, free_names_the_block_it_points_into) {
  void *a;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &a), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_direct_get_stats(d, &before), MP_OK);
  cr_assert_eq(mp_direct_free(d, (char *)a + 256), MP_EINVAL);
  char block[32];
  addr_of(a, block, sizeof block);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "inside") != NULL, "%s", msg);
  cr_expect(strstr(msg, block) != NULL, "no block %s in: %s", block, msg);
  cr_expect(strstr(msg, "not allocated") == NULL, "%s", msg);
  cr_assert_eq(mp_direct_get_stats(d, &after), MP_OK);
  cr_expect_eq(after.free_count, before.free_count);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  /* The block itself is still live and frees normally. */
  cr_expect_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
}

Test(direct_interior_pointers, record_stream_names_the_block_it_points_into) {
  void *a;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_record_stream(d, (char *)a + 4095, NULL), MP_EINVAL);
  char block[32];
  addr_of(a, block, sizeof block);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "inside") != NULL, "%s", msg);
  cr_expect(strstr(msg, block) != NULL, "no block %s in: %s", block, msg);
  cr_expect_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
}

Test(direct_interior_pointers,
     a_pointer_inside_a_freed_block_says_it_was_freed) {
  void *a;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_free(d, a), MP_OK);
  cr_assert_eq(mp_direct_free(d, (char *)a + 8), MP_EINVAL);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "inside") != NULL, "%s", msg);
  cr_expect(strstr(msg, "freed") != NULL, "%s", msg);
}

Test(direct_interior_pointers, one_past_the_end_is_not_inside) {
  void *a;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_free(d, (char *)a + 4096), MP_EINVAL);
  /* Past the block's bytes: not "inside" it (the device may have put
   * another allocation there, which this allocator did not make). */
  char block[32];
  addr_of(a, block, sizeof block);
  cr_expect(strstr(mp_last_error(), block) == NULL, "%s", mp_last_error());
  cr_expect_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
}
