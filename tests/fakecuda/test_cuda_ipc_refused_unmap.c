/* An imported mapping whose unmap the driver refuses is never forgotten.
 * mp_device_close unmaps the imports left open (ipc.c, mp__ipc_close_all),
 * closing each one's lease, which tells the exporter the block is free to
 * reuse. Where the driver refuses the unmap, the memory stays mapped in
 * this process, device closed or not: the lease must stay open, or the
 * exporter reuses a block the importer still sees. Before, the forced close
 * closed the lease whatever the unmap said. And an import the driver
 * refuses after it mapped (cuMemSetAccess), whose undoing cuMemUnmap is
 * refused too, leaves the mapping to mp_device_close (cuda.c,
 * mp__cuda_import_left); before, it was forgotten, mapped. The refusals
 * are the fake's (cuFakeRefuse): not run on a real driver. */
#include <fcntl.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

/* A pool on *exporter with one block *p, exported into *h (a virtual
 * chunk's, by descriptor), and a second device *importer (the same fake
 * GPU) for its import. */
static mp_pool_t *export_one(mp_device_t **exporter, mp_device_t **importer,
                             void **p, mp_ipc_handle_t *h) {
  if (fk_is_real())
    cr_skip_test("the refusal is the fake driver's");
  *exporter = open_dev("cuda");
  *importer = open_dev("cuda");
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(*exporter, NULL, &pool), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, p), MP_OK);
  mp_status_t st = mp_pool_ipc_export(pool, *p, h);
  if (st == MP_ENOTSUP)
    cr_skip_test("no shareable virtual memory: %s", mp_last_error());
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(h->kind, MP_IPC_FD);
  return pool;
}

Test(cuda_ipc_refused_unmap,
     a_device_close_keeps_the_lease_of_what_stays_mapped) {
  mp_device_t *exporter, *importer;
  void *p, *q;
  mp_ipc_handle_t h;
  mp_pool_t *pool = export_one(&exporter, &importer, &p, &h);
  int lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(importer, &h, &q), MP_OK, "%s", mp_last_error());

  long long unmaps = fk_calls("cuMemUnmap");
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, -1);
  mp_device_close(importer);
  fk_refuse("cuMemUnmap", CUDA_SUCCESS, 0);
  cr_assert_eq(fk_calls("cuMemUnmap") - unmaps, 1, "the close did not unmap");
  cr_expect_neq(fcntl(lease, F_GETFD), -1,
                "the lease of an import still mapped was closed: the "
                "exporter may reuse the block under it");
  /* The exporter still sees the block held. */
  size_t held = 0;
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held, 1, "the block was given back while mapped elsewhere");
  (void)mp_pool_destroy(pool);
  mp_device_close(exporter);
}

Test(cuda_ipc_refused_unmap,
     a_refused_import_left_mapped_is_unmapped_at_close) {
  mp_device_t *exporter, *importer;
  void *p, *q = NULL;
  mp_ipc_handle_t h;
  mp_pool_t *pool = export_one(&exporter, &importer, &p, &h);
  fk_refuse("cuMemSetAccess", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  long long unmaps = fk_calls("cuMemUnmap");
  mp_status_t st = mp_ipc_import(importer, &h, &q);
  fk_refuse("cuMemSetAccess", CUDA_SUCCESS, 0);
  fk_refuse("cuMemUnmap", CUDA_SUCCESS, 0);
  cr_assert_neq(st, MP_OK, "the refused import succeeded");
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(fk_calls("cuMemUnmap") - unmaps, 1);
  cr_expect_neq(fcntl(h.fd, F_GETFD), -1, "the refusal closed the descriptor");
  mp_device_close(importer);
  cr_expect_eq(fk_calls("cuMemUnmap") - unmaps, 2,
               "what the refused import left mapped was never unmapped");
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(exporter);
}
