/* The host pool aligns blocks to the page when asked (align = 4096: the
 * buffers O_DIRECT reads and GPUDirect Storage bounces through); it
 * refused any alignment past 512, the default for device memory, though
 * page-locked memory is whole pages. The cuda twin is in
 * tests/fakecuda/test_cuda_pool_rules.c. */
#include <criterion/criterion.h>

#include "../support/host_pool_alignment.h"

Test(host_pool_alignment, blocks_start_on_a_page_when_asked) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  expect_host_pool_page_alignment(dev);
  mp_device_close(dev);
}
