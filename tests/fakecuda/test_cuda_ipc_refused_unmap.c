/* An imported mapping whose unmap the driver refuses is never forgotten.
 * mp_device_close unmaps the imports left open (ipc.c, mp__ipc_close_all),
 * closing each one's lease, which tells the exporter the block is free to
 * reuse. Where the driver refuses the unmap, the memory stays mapped in
 * this process, device closed or not: the lease must stay open, or the
 * exporter reuses a block the importer still sees. Before, the forced close
 * closed the lease whatever the unmap said. And an import the driver
 * refuses after it mapped (cuMemSetAccess), whose undoing cuMemUnmap is
 * refused too, leaves the mapping to mp_device_close (cuda.c,
 * mp__cuda_import_left); before, it was forgotten, mapped. So is a
 * reservation whose cuMemAddressFree is refused (at an import's close, or
 * undoing a refused import): mp_device_close releases it. The refusals
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
  int closed = 0;
  mp_status_t st = mp_device_close_checked(importer, &closed);
  fk_refuse("cuMemUnmap", CUDA_SUCCESS, 0);
  cr_assert_eq(fk_calls("cuMemUnmap") - unmaps, 1, "the close did not unmap");
  /* Closed, and the refused unmap said (ipc.c, mp__ipc_close_all). */
  cr_expect_eq(closed, 1);
  cr_expect_neq(st, MP_OK, "the import left mapped went unreported");
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
            mp_last_error());
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

/* An import refused at its step `first`, whose undoing step `undo` the
 * driver refuses too: the import fails (h keeps its descriptors), and
 * mp_device_close of the importer gives back what it left (`undo` called
 * again); stays: the failure must say the memory stays mapped. */
static void refused_import_undone_at_close(const char *first, const char *undo,
                                           bool stays) {
  mp_device_t *exporter, *importer;
  void *p, *q = NULL;
  mp_ipc_handle_t h;
  mp_pool_t *pool = export_one(&exporter, &importer, &p, &h);
  fk_refuse(first, CUDA_ERROR_UNKNOWN, 1);
  fk_refuse(undo, CUDA_ERROR_UNKNOWN, 1);
  long long undone = fk_calls(undo);
  mp_status_t st = mp_ipc_import(importer, &h, &q);
  fk_refuse(first, CUDA_SUCCESS, 0);
  fk_refuse(undo, CUDA_SUCCESS, 0);
  cr_assert_neq(st, MP_OK, "the refused import succeeded");
  if (stays)
    cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
              mp_last_error());
  cr_assert_eq(fk_calls(undo) - undone, 1);
  cr_expect_neq(fcntl(h.fd, F_GETFD), -1, "the refusal closed the descriptor");
  mp_device_close(importer);
  cr_expect_eq(fk_calls(undo) - undone, 2,
               "what the refused import left (%s refused) was forgotten", undo);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(exporter);
}

Test(cuda_ipc_refused_unmap,
     a_refused_import_left_mapped_is_unmapped_at_close) {
  refused_import_undone_at_close("cuMemSetAccess", "cuMemUnmap", true);
}

/* A block imported and closed again, the driver refusing once the call
 * `call` (at the import if at_import, else at its close): the import still
 * succeeds, its close answers close_st, the import is closed either way,
 * and mp_device_close of the importer gives back what the refusal left
 * (`call` asked again; what: what was left, for the message). */
static void refused_once_given_back_at_close(const char *call, bool at_import,
                                             mp_status_t close_st,
                                             const char *what) {
  mp_device_t *exporter, *importer;
  void *p, *q;
  mp_ipc_handle_t h;
  mp_pool_t *pool = export_one(&exporter, &importer, &p, &h);
  long long calls = fk_calls(call);
  if (at_import)
    fk_refuse(call, CUDA_ERROR_UNKNOWN, 1);
  cr_expect_eq(mp_ipc_import(importer, &h, &q), MP_OK, "%s", mp_last_error());
  fk_refuse(call, CUDA_ERROR_UNKNOWN, at_import ? 0 : 1);
  cr_expect_eq(mp_ipc_close(importer, q), close_st, "%s", mp_last_error());
  fk_refuse(call, CUDA_SUCCESS, 0);
  cr_assert_eq(fk_calls(call) - calls, 1);
  cr_expect_eq(mp_ipc_close(importer, q), MP_EINVAL,
               "the import stayed open after its memory was unmapped");
  mp_device_close(importer);
  cr_expect_eq(fk_calls(call) - calls, 2, "%s was forgotten", what);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(exporter);
}

/* An import's close unmaps, then frees the reservation it mapped at: where
 * the driver refuses that cuMemAddressFree, the memory is gone (the close
 * reports the refusal, the import closed) but the reservation stays, which
 * mp_device_close releases. Before, it was forgotten. */
Test(cuda_ipc_refused_unmap, a_refused_address_free_is_given_back_at_close) {
  refused_once_given_back_at_close("cuMemAddressFree", false, MP_EDRIVER,
                                   "the reservation left by the refused free");
}

/* The same for an import refused at its cuMemMap whose reservation the
 * driver then refuses to free: mp_device_close releases it. */
Test(cuda_ipc_refused_unmap, a_refused_imports_reservation_is_given_back) {
  refused_import_undone_at_close("cuMemMap", "cuMemAddressFree", false);
}

/* An import releases its imported handle once mapped (the mapping keeps
 * the memory): where the driver refuses that cuMemRelease, the handle
 * still holds the exporter's memory (cuda.h, cuMemRelease: "Each time a
 * recipient process imports a shareable handle, it needs to pair it with
 * cuMemRelease for the handle to be freed"), and mp_device_close releases
 * it. Before, it was forgotten. */
Test(cuda_ipc_refused_unmap, a_refused_release_of_an_import_is_given_back) {
  refused_once_given_back_at_close("cuMemRelease", true, MP_OK,
                                   "the imported handle whose release was "
                                   "refused");
}
