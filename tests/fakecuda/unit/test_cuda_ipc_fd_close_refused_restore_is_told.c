/* The close of a descriptor import (ipc_close of MP_IPC_FD: cuMemUnmap,
 * then cuMemAddressFree of its reservation) made each call in a relaxed
 * section of its own. Where the restore of the thread's capture mode after
 * the unmap was refused, its note was the thread's last error, and the
 * address free's refusal that followed replaced it: the close failed
 * without a word of the thread being left relaxed. Now both calls are one
 * relaxed section, and the refused restore is told with the address free's
 * refusal. The refusals are the fake's (cuFakeRefuse): no GPU twin. */
#include <string.h>
#include <unistd.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

Test(cuda_ipc_fd_close_refused_restore, is_told_with_the_address_free) {
  mp_device_t *dev = open_dev("cuda"), *importer = open_dev("cuda");
  size_t g = 0;
  void *base = NULL, *q = NULL;
  mp_status_t st = dev->ops->vm_granularity(dev, &g);
  if (st == MP_ENOTSUP)
    cr_skip_test("no virtual memory: %s", mp_last_error());
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(dev->ops->vm_reserve(dev, g, &base), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(dev->ops->vm_map(dev, base, g), MP_OK, "%s", mp_last_error());
  mp_ipc_handle_t h = {0};
  st = dev->ops->ipc_export(dev, base, g, true, &h);
  if (st == MP_ENOTSUP)
    cr_skip_test("no shareable virtual memory: %s", mp_last_error());
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  h.mem_bytes = g;
  cr_assert_eq(importer->ops->ipc_open(importer, &h, &q), MP_OK, "%s",
               mp_last_error());

  /* The unmap works, the restore after it (before, in a section of its
   * own) is refused, and the address free is refused. */
  fk_before_call("cuMemUnmap", fk_refuse_next_exchange, NULL);
  fk_refuse("cuMemAddressFree", CUDA_ERROR_UNKNOWN, 1);
  bool unmapped = false;
  st = importer->ops->ipc_close(importer, q, g, MP_IPC_FD, &unmapped);
  const char *msg = mp_last_error();
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), msg);
  cr_expect(unmapped, "the unmap worked");
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_UNKNOWN, "%d (%s)",
               mp_last_driver_error(), msg);
  const char *at = strstr(msg, "mp_ipc_close");
  cr_expect(at != NULL && strstr(at, "CUDA_ERROR_UNKNOWN") != NULL,
            "the address free's refusal is not said: %s", msg);
  cr_expect(at != NULL &&
                strstr(at, "cuThreadExchangeStreamCaptureMode") != NULL,
            "the refused restore is lost: %s", msg);
  cr_expect_eq(fk_exchange_capture_mode(CU_STREAM_CAPTURE_MODE_GLOBAL),
               CU_STREAM_CAPTURE_MODE_RELAXED);

  close(h.fd);
  mp_device_close(importer); /* frees the reservation left */
  cr_expect_eq(dev->ops->vm_unmap(dev, base, g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(dev->ops->vm_release(dev, base, g), MP_OK, "%s",
               mp_last_error());
  mp_device_close(dev);
}
