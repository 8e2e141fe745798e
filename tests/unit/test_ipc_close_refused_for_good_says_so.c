/* An mp_ipc_close that the device refuses for good does not tell the
 * caller to close the import again. In a child forked from the process
 * that opened the host device, with work queued on it at the fork, the
 * wait before the unmap is refused with MP_ENODEV (no thread of the child
 * runs that work): every later close is refused the same. Where a retry
 * can succeed (test_pool_ipc_refused_unmap_retried.c), the message still
 * says "close it again". */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/fork_child.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *imp;
static void *imported;

static int child_close(void) {
  for (int i = 0; i < 2; i++) {
    if (mp_ipc_close(imp, imported) != MP_ENODEV)
      return 1 + 2 * i;
    if (strstr(mp_last_error(), "close it again") != NULL ||
        strstr(mp_last_error(), "cannot close it") == NULL)
      return 2 + 2 * i;
  }
  return 0;
}

Test(ipc_close_refused_for_good, a_forked_child_is_not_told_to_close_again) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  imp = open_dev("host:capacity=64M");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_import(imp, &h, &imported), MP_OK, "%s", mp_last_error());
  /* Work queued on the importing device at the fork. */
  gate_t gate;
  gate_init(&gate);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(imp, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_launch_host(imp, s, gate_wait, &gate), MP_OK);
  expect_child_passes(child_close);
  gate_open(&gate);
  cr_expect_eq(mp_stream_synchronize(imp, s), MP_OK);
  cr_expect_eq(mp_stream_destroy(imp, s), MP_OK);
  /* The parent's import is its own still. */
  cr_expect_eq(mp_ipc_close(imp, imported), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(imp);
  mp_device_close(dev);
}
