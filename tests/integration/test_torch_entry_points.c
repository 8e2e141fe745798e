/* test_torch_entry_points.c - mp_torch_malloc / mp_torch_free, the
 * functions PyTorch's CUDAPluggableAllocator loads from libmempool.so,
 * checked on the emulated device through the default pool. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

static void on_host(void) {
  setenv("MEMPOOL_DEVICE", "host", 1);
}

static size_t allocated(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &s), MP_OK);
  return s.allocated_bytes;
}

TestSuite(torch, .init = on_host);

Test(torch, malloc_serves_from_the_default_pool_and_free_returns_it) {
  void *p = mp_torch_malloc(1 << 20, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_geq(allocated(), (size_t)1 << 20);
  memset(p, 0x5a, 1 << 20); /* host device memory is host memory */
  mp_torch_free(p, 1 << 20, 0, NULL);
  cr_assert_eq(allocated(), 0);
}

Test(torch, free_on_another_stream_is_accepted) {
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(mp_pool_device(mp_default_pool()), &s), MP_OK);
  void *p = mp_torch_malloc(4096, 0, NULL);
  cr_assert_not_null(p);
  mp_torch_free(p, 4096, 0, s);
  cr_assert_eq(allocated(), 0);
  cr_assert_eq(mp_stream_destroy(mp_pool_device(mp_default_pool()), s), MP_OK);
}

Test(torch, non_positive_size_is_null_with_a_reason) {
  cr_assert_null(mp_torch_malloc(0, 0, NULL));
  cr_assert_null(mp_torch_malloc(-5, 0, NULL));
  cr_assert(strstr(mp_last_error(), "size -5") != NULL, "%s", mp_last_error());
}

Test(torch, another_device_is_null_with_a_reason) {
  cr_assert_null(mp_torch_malloc(4096, 3, NULL));
  cr_assert(strstr(mp_last_error(), "device 3") != NULL, "%s", mp_last_error());
  cr_assert_eq(allocated(), 0);
}

Test(torch, free_of_null_or_foreign_pointer_changes_nothing) {
  void *p = mp_torch_malloc(4096, 0, NULL);
  cr_assert_not_null(p);
  size_t before = allocated();
  int local;
  mp_torch_free(NULL, 0, 0, NULL);
  mp_torch_free(&local, 4, 0, NULL);
  cr_assert_eq(allocated(), before);
  mp_torch_free(p, 4096, 0, NULL);
}
