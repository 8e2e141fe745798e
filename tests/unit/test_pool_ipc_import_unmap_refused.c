/* test_pool_ipc_import_unmap_refused.c - an import refused after the
 * device mapped the handle's memory (here: a stale copy whose lease is
 * another export's, which only the lease's stamp tells) unmaps what it
 * mapped; when the device refuses that unmap, the mapping stays in the
 * process, and the import says so: the unmap's status, with a message
 * naming the refusal and what stays mapped. White-box: the importing host
 * device's ipc_close refuses while ipc_wb_refuse is set. Failed before:
 * MP_EINVAL for the stale lease alone, the mapping left unsaid. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/ipc_white_box.h"

#define MiB ((size_t)1 << 20)

static ipc_white_box_t w;

Test(pool_ipc_import_unmap_refused,
     a_refused_unmap_of_a_refused_import_says_so) {
  ipc_white_box_open(&w);
  ipc_wb_host_ops = w.host_ops;
  w.ops.ipc_close = ipc_white_box_flaky_close;
  mp_pool_t *pool = w.pool;
  mp_device_t *imp = w.imp;
  void *p[2];
  mp_ipc_handle_t h[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p[i]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(pool, p[i], &h[i]), MP_OK, "%s",
                 mp_last_error());
  }
  /* A stale copy of the first handle, its lease number now the second's. */
  mp_ipc_handle_t stale = h[0];
  stale.lease_fd = h[1].lease_fd;
  void *q = NULL;
  cr_expect_eq(mp_ipc_import(imp, &stale, &q), MP_EINVAL);
  cr_expect_eq(ipc_wb_closes, 1, "the refused import unmapped what it mapped");
  ipc_wb_refuse = true;
  mp_status_t st = mp_ipc_import(imp, &stale, &q);
  const char *msg = mp_last_error();
  cr_expect_eq(st, MP_EDRIVER, "the unmap's status: %s", msg);
  cr_expect_eq(ipc_wb_closes, 2);
  cr_expect_not_null(strstr(msg, "is not the one its export made"), "%s", msg);
  cr_expect_not_null(strstr(msg, "stays mapped"), "%s", msg);
  cr_expect_not_null(strstr(msg, "fake ipc_close refuses"), "%s", msg);
  cr_expect_null(q, "no import made");
  ipc_wb_refuse = false;
  /* The handles as they were: both import once each. */
  cr_expect_eq(stale.lease_fd, h[1].lease_fd);
  void *got[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_ipc_import(imp, &h[i], &got[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_ipc_close(imp, got[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  }
  ipc_white_box_close(&w);
}
