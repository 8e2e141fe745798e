/* stream_ordinal of a stream of another context asks cuCtxGetDevice with
 * that context pushed. Where the push was refused, it asked anyway, and
 * cuCtxGetDevice answered the calling thread's current context: device 0
 * for a stream of device 1, so the drop-in would have taken the stream
 * for device 0's. Now the answer is MP_ENODEV (cannot tell; backend.h).
 * The refused push is the fake driver's: no GPU twin. */
#include <stdlib.h>

#include <mempool/mempool.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
}

static void refuse_next_push(void *arg) {
  (void)arg;
  fk_refuse("cuCtxPushCurrent_v2", CUDA_ERROR_INVALID_CONTEXT, 1);
}

Test(cuda_stream_ordinal_refused_push, no_other_contexts_device_is_answered,
     .init = two_devices) {
  if (fk_is_real())
    cr_skip_test("the refused push is the fake driver's");
  mp_device_t *d0 = NULL, *d1 = NULL;
  cr_assert_eq(mp_device_open("cuda:0", &d0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_open("cuda:1", &d1), MP_OK, "%s", mp_last_error());
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(d1, &s), MP_OK, "%s", mp_last_error());
  /* The calling thread works on device 0. */
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*release)(CUdevice);
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(set, "cuCtxSetCurrent");
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  CUcontext c0 = NULL;
  cr_assert_eq(retain(&c0, 0), CUDA_SUCCESS);
  cr_assert_eq(set(c0), CUDA_SUCCESS);
  int on = -1;
  cr_assert_eq(mp__device_stream_ordinal(d0, s, &on), MP_OK);
  cr_expect_eq(on, 1, "stream of device 1 answered %d", on);
  /* The push of the stream's context (the one after cuStreamGetCtx)
   * refused. */
  on = -1;
  fk_before_call("cuStreamGetCtx", refuse_next_push, NULL);
  mp_status_t st = mp__device_stream_ordinal(d0, s, &on);
  fk_refuse("cuCtxPushCurrent_v2", CUDA_SUCCESS, 0);
  cr_expect(st != MP_OK || on == 1, "%s, device %d for a stream of device 1",
            mp_status_name(st), on);
  cr_expect_eq(st, MP_ENODEV, "%s", mp_status_name(st));
  cr_assert_eq(set(NULL), CUDA_SUCCESS);
  cr_assert_eq(release(0), CUDA_SUCCESS);
  cr_assert_eq(mp_stream_destroy(d1, s), MP_OK, "%s", mp_last_error());
  mp_device_close(d1);
  mp_device_close(d0);
}
