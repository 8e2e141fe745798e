/* Every driver call of the cuda backend is made with the device's context
 * pushed (cuCtxPushCurrent). Where the push was refused, the message named
 * the call that was to follow ("cuMemAlloc(1.0 MiB) on cuda:0 ...:
 * CUDA_ERROR_INVALID_CONTEXT"), as if that call had failed. Now it names
 * cuCtxPushCurrent, with the driver's code, after what it was for. The
 * refused push is the fake driver's: no GPU twin. */
#include <string.h>

#include "../../support/device_helpers.h"
#include "fakecuda_test.h"

static void expect_push_named(mp_status_t st, const char *what) {
  cr_expect_neq(st, MP_OK, "%s succeeded with the push refused", what);
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_INVALID_CONTEXT, "%s: %d",
               what, mp_last_driver_error());
  cr_expect(strstr(mp_last_error(),
                   "cuCtxPushCurrent: CUDA_ERROR_INVALID_CONTEXT") != NULL,
            "%s: %s", what, mp_last_error());
  cr_expect(strstr(mp_last_error(), what) != NULL, "%s: %s", what,
            mp_last_error());
}

static void refuse_push(void) {
  fk_refuse("cuCtxPushCurrent_v2", CUDA_ERROR_INVALID_CONTEXT, 1);
}

Test(cuda_refused_push, the_message_names_cuCtxPushCurrent) {
  if (fk_is_real())
    cr_skip_test("the refused push is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  void *p = NULL;
  refuse_push();
  expect_push_named(mp_device_alloc(dev, 1 << 20, &p), "cuMemAlloc");
  cr_expect_null(p);
  size_t f = 0, t = 0;
  refuse_push();
  expect_push_named(mp_device_mem_info(dev, &f, &t), "cuMemGetInfo");
  refuse_push();
  expect_push_named(mp_device_synchronize(dev), "cuCtxSynchronize");
  mp_stream_t s = NULL;
  refuse_push();
  expect_push_named(mp_stream_create(dev, &s), "cuStreamCreate");
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  refuse_push();
  expect_push_named(mp_stream_synchronize(dev, s), "cuStreamSynchronize");
  mp_event_t e = NULL;
  refuse_push();
  expect_push_named(mp_event_create(dev, &e), "cuEventCreate");
  void *h = NULL;
  refuse_push();
  expect_push_named(mp_device_host_alloc(dev, 4096, &h), "cuMemHostAlloc");
  fk_refuse("cuCtxPushCurrent_v2", CUDA_SUCCESS, 0);
  /* The next failure, no push refused, names its own call only. */
  fk_refuse("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 1);
  cr_expect_eq(mp_device_alloc(dev, 1 << 20, &p), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "cuCtxPushCurrent") == NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* The open names it once, as before (the message already named the push
 * there; mp__cuda_fail must not name it twice). */
Test(cuda_refused_push, the_open_names_it_once) {
  if (fk_is_real())
    cr_skip_test("the refused push is the fake driver's");
  mp_device_t *dev = NULL;
  refuse_push();
  mp_status_t st = mp_device_open("cuda", &dev);
  fk_refuse("cuCtxPushCurrent_v2", CUDA_SUCCESS, 0);
  expect_push_named(st, "device 'cuda:0'");
  cr_expect_null(dev);
  const char *first = strstr(mp_last_error(), "cuCtxPushCurrent");
  cr_expect(first != NULL && strstr(first + 1, "cuCtxPushCurrent") == NULL,
            "%s", mp_last_error());
}
