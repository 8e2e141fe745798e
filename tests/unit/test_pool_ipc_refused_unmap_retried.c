/* test_pool_ipc_refused_unmap_retried.c - what a refused unmap of an
 * imported mapping leaves, and that a later unmap takes it back.
 *
 * mp_ipc_close whose unmap the device refuses changes nothing: the import
 * stays mapped and leased (the exporter must not reuse a block still
 * mapped here), and closing it again, once the device unmaps, closes it
 * and its lease, once.
 *
 * An import refused after the device mapped the handle's memory (a stale
 * copy whose lease is another export's) unmaps what it mapped; when the
 * device refuses that unmap, the mapping stays, and the refusal says so.
 * It stays tracked by the device (no lease of its own: the handle's lease
 * is not its export's, and the handle keeps it), so that mp_device_close
 * unmaps it, as it unmaps the imports left open: before, it was in no
 * list, and nothing ever unmapped it. White-box: the importing host
 * device's ipc_close refuses while ipc_wb_refuse is set (ipc_white_box.h). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "../support/ipc_white_box.h"

#define MiB ((size_t)1 << 20)

static ipc_white_box_t w;

static bool fd_open(int fd) {
  return fcntl(fd, F_GETFD) != -1;
}

static size_t held(void) {
  size_t n = 99;
  cr_assert_eq(mp_pool_ipc_poll(w.pool, &n), MP_OK, "%s", mp_last_error());
  return n;
}

static void setup(void) {
  ipc_white_box_open(&w);
  ipc_wb_host_ops = w.host_ops;
  w.ops.ipc_close = ipc_white_box_flaky_close;
}

TestSuite(pool_ipc_refused_unmap_retried, .init = setup);

Test(pool_ipc_refused_unmap_retried,
     a_refused_close_keeps_the_import_for_a_retry) {
  void *p, *q = NULL;
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(w.pool, MiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(w.pool, p, &h), MP_OK, "%s", mp_last_error());
  int lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(w.imp, &h, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(w.pool, p), MP_OK);
  cr_expect_eq(held(), 1);
  ipc_wb_refuse = true;
  for (int i = 0; i < 2; i++) {
    mp_status_t st = mp_ipc_close(w.imp, q);
    cr_expect_eq(st, MP_EDRIVER, "%s", mp_last_error());
    cr_expect_not_null(strstr(mp_last_error(), "close it again"), "%s",
                       mp_last_error());
    cr_expect(fd_open(lease), "a refused close closed the lease");
    cr_expect_eq(held(), 1, "a refused close let the exporter reuse the block");
  }
  ipc_wb_refuse = false;
  cr_expect_eq(mp_ipc_close(w.imp, q), MP_OK, "%s", mp_last_error());
  cr_expect_eq(ipc_wb_closes, 3);
  cr_expect_eq(ipc_wb_nunmapped, 1);
  cr_expect(!fd_open(lease), "the close kept the lease");
  cr_expect_eq(held(), 0);
  cr_expect_eq(mp_ipc_close(w.imp, q), MP_EINVAL, "closed twice");
  ipc_white_box_close(&w);
}

Test(pool_ipc_refused_unmap_retried,
     a_refused_imports_mapping_goes_at_device_close) {
  void *p[2], *q = NULL;
  mp_ipc_handle_t h[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_alloc(w.pool, MiB, NULL, &p[i]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(w.pool, p[i], &h[i]), MP_OK, "%s",
                 mp_last_error());
  }
  /* A stale copy of the first handle, its lease number now the second's. */
  mp_ipc_handle_t stale = h[0];
  stale.lease_fd = h[1].lease_fd;
  ipc_wb_refuse = true;
  mp_status_t st = mp_ipc_import(w.imp, &stale, &q);
  ipc_wb_refuse = false;
  cr_expect_eq(st, MP_EDRIVER, "%s", mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), "stays mapped"), "%s",
                     mp_last_error());
  cr_expect_null(q);
  cr_expect_eq(ipc_wb_closes, 1);
  cr_expect_eq(ipc_wb_nunmapped, 0);
  /* What the message names as mapped is no import to close. */
  const char *at = strstr(mp_last_error(), "for the handle (");
  cr_assert_not_null(at, "%s", mp_last_error());
  void *base = NULL;
  size_t bytes = 0;
  cr_assert_eq(sscanf(at, "for the handle (%zu bytes at %p)", &bytes, &base), 2,
               "%s", at);
  cr_expect_eq(mp_ipc_close(w.imp, base), MP_EINVAL);
  cr_expect_eq(mp_ipc_close(w.imp, (char *)base + stale.offset), MP_EINVAL);
  /* The handles as they were: both import and close once each. */
  void *got[2];
  for (int i = 0; i < 2; i++) {
    cr_expect(fd_open(h[i].fd) && fd_open(h[i].lease_fd));
    cr_assert_eq(mp_ipc_import(w.imp, &h[i], &got[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_ipc_close(w.imp, got[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_free(w.pool, p[i]), MP_OK);
  }
  cr_expect_eq(held(), 0);
  cr_expect_eq(ipc_wb_nunmapped, 2);
  /* The device's close unmaps what the refused import left mapped. */
  check(w.pool);
  cr_assert_eq(mp_pool_destroy(w.pool), MP_OK, "%s", mp_last_error());
  mp_device_close(w.imp);
  cr_expect_eq(ipc_wb_nunmapped, 3,
               "the refused import's mapping was never unmapped");
  cr_expect_eq(ipc_wb_unmapped[2], base, "unmapped at %p, not %p",
               ipc_wb_unmapped[2], base);
  mp_device_close(w.exp);
}
