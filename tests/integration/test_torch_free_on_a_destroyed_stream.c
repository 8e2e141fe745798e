/* test_torch_free_on_a_destroyed_stream.c - mp_torch_free with the stream
 * the block was allocated on, destroyed since: PyTorch's
 * CUDAPluggableAllocator passes the allocation's stream to the free hook,
 * and the stream may be destroyed (mp_stream_destroy) before the tensor
 * goes. The hook cannot fail and PyTorch forgets the pointer, so a free
 * refused for the stream lost the block for good; it is freed on its own
 * stream. A pointer refused for itself still changes nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/default_pool_host.h"
#include "../support/torch_dead_stream.h"

TestSuite(torch_free_dead_stream, .init = on_host);

Test(torch_free_dead_stream, the_block_is_freed_and_reused) {
  mp_stream_t s = NULL;
  void *p = block_of_a_dead_stream(&s);
  cr_assert_eq(stats().live_blocks, 1);
  mp_torch_free(p, 1 << 20, 0, s);
  mp_stats_t after = stats();
  cr_assert_eq(after.live_blocks, 0, "the block was kept: %s", mp_last_error());
  cr_assert_eq(after.allocated_bytes, 0);
  cr_assert(strstr(mp_last_error(), "freed on its own stream") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK);
  void *q = mp_torch_malloc(1 << 20, 0, NULL);
  cr_assert_not_null(q, "%s", mp_last_error());
  mp_torch_free(q, 1 << 20, 0, NULL);
  cr_assert_eq(stats().live_blocks, 0);
}

Test(torch_free_dead_stream, a_pointer_inside_the_block_changes_nothing) {
  mp_stream_t s = NULL;
  char *p = block_of_a_dead_stream(&s);
  mp_torch_free(p + 512, 1 << 20, 0, s);
  cr_assert_eq(stats().live_blocks, 1);
  cr_assert(strstr(mp_last_error(), "inside the block") != NULL, "%s",
            mp_last_error());
  mp_torch_free(p, 1 << 20, 0, NULL);
  cr_assert_eq(stats().live_blocks, 0);
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK);
}
