/* test_preload_refused_reset.c - a cuDevicePrimaryCtxReset the driver
 * refuses destroys nothing, so the shim forgets nothing of the memory the
 * driver handed out (cuda.h, cuDevicePrimaryCtxReset: CUDA_ERROR_INVALID_DEVICE
 * among its errors); nor does a reset of no device (-1, the ordinal of
 * memory of no primary context). The shim's sources run in this process
 * (no LD_PRELOAD: the test reaches the shim's table), on the host device. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "preload/hooks.h"

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
}

/* Addresses nothing hands out: the entries are only the table's. */
#define MP_DEV_PTR  ((uintptr_t)0x7f0000100000u)
#define MP_HOST_PTR ((uintptr_t)0x7f0000200000u)

static void expect_kept(uintptr_t ptr, mp__pl_kind_t kind) {
  mp__pl_block_t b;
  cr_assert(mp__pl_table_take(ptr, &b), "%#lx was forgotten",
            (unsigned long)ptr);
  cr_expect_eq(b.kind, kind);
  cr_expect_eq(b.size, 4096u);
}

/* Failed before: the write-combined entry of the device was forgotten
 * before the driver was asked, and stayed forgotten when it refused. */
Test(preload_refused_reset, a_refused_reset_forgets_nothing,
     .init = host_mode) {
  cr_assert_not_null(mp__pl_get());
  int dev = MP__PL_MAX_DEVICES - 1; /* no driver, fake or real, has it */
  mp__pl_table_put_real(MP_DEV_PTR, 4096, 0, MP__PL_FROM_REAL, dev);
  mp__pl_table_put_real(MP_HOST_PTR, 4096, 0, MP__PL_FROM_REAL_HOST, dev);
  cr_assert_neq(cuDevicePrimaryCtxReset_v2(dev), 0, "the reset went through");
  cr_assert_neq(cuDevicePrimaryCtxReset(dev), 0, "the reset went through");
  expect_kept(MP_DEV_PTR, MP__PL_FROM_REAL);
  expect_kept(MP_HOST_PTR, MP__PL_FROM_REAL_HOST);
}

/* -1 marks memory of no primary context (a context the program made, a
 * stream-ordered allocation): no reset forgets it. */
Test(preload_refused_reset, no_device_forgets_nothing, .init = host_mode) {
  cr_assert_not_null(mp__pl_get());
  mp__pl_table_put_real(MP_DEV_PTR, 4096, 0, MP__PL_FROM_REAL, -1);
  mp__pl_table_put_real(MP_HOST_PTR, 4096, 0, MP__PL_FROM_REAL_HOST, -1);
  cr_expect_eq(mp__pl_table_forget_real(-1), 0u);
  cr_assert_neq(cuDevicePrimaryCtxReset_v2(-1), 0, "the reset went through");
  expect_kept(MP_DEV_PTR, MP__PL_FROM_REAL);
  expect_kept(MP_HOST_PTR, MP__PL_FROM_REAL_HOST);
}
