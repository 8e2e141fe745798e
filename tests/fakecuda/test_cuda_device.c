/* The cuda backend's device, memory and error paths, run on the fake driver
 * (tests/fakecuda), whose knobs are set per test before the first open:
 * Criterion runs every test in a process of its own. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>
#include <mempool/torch.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

Test(cuda_device, name_is_index_and_driver_name) {
  setenv("FAKECUDA_NAME", "Test GPU 80GB", 1);
  mp_device_t *dev = open_dev("cuda");
  cr_assert_str_eq(mp_device_name(dev), "cuda:0 Test GPU 80GB");
  mp_device_close(dev);
}

Test(cuda_device, second_device_by_index) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  mp_device_t *dev = open_dev("cuda:1");
  cr_assert(strncmp(mp_device_name(dev), "cuda:1 ", 7) == 0, "%s",
            mp_device_name(dev));
  mp_device_close(dev);
}

/* FAKECUDA_DEVICE_<N> gives device N options of its own (machines mix
 * GPUs); the others keep FAKECUDA_DEVICE's. */
Test(cuda_device, a_device_may_have_options_of_its_own) {
  setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
  setenv("FAKECUDA_DEVICE", "capacity=256M", 1);
  setenv("FAKECUDA_DEVICE_1", "capacity=64M", 1);
  size_t want[3] = {256 << 20, 64 << 20, 256 << 20};
  for (int i = 0; i < 3; i++) {
    char spec[16];
    snprintf(spec, sizeof spec, "cuda:%d", i);
    mp_device_t *dev = open_dev(spec);
    size_t total = 0;
    cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq(total, want[i], "%s: %zu bytes", spec, total);
    mp_device_close(dev);
  }
}

Test(cuda_device, index_out_of_range_is_enodev) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  mp_device_t *dev = (mp_device_t *)&dev;
  cr_assert_eq(mp_device_open("cuda:2", &dev), MP_ENODEV);
  cr_assert(strstr(mp_last_error(), "cuda:2") != NULL, "%s", mp_last_error());
  cr_assert_eq(dev, (mp_device_t *)&dev, "output written on failure");
}

Test(cuda_device, malformed_index_is_einval) {
  const char *bad[] = {"cuda:x",  "cuda:-1", "cuda:1x",
                       "cuda: 1", "cuda:",   "cuda:99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_device_t *dev = NULL;
    mp_status_t st = mp_device_open(bad[i], &dev);
    cr_assert_eq(st, MP_EINVAL, "'%s' gave %s", bad[i], mp_status_name(st));
    cr_assert_null(dev);
    cr_assert(strstr(mp_last_error(), bad[i]) != NULL, "%s", mp_last_error());
  }
}

Test(cuda_device, no_device_is_enodev) {
  setenv("FAKECUDA_NO_DEVICE", "1", 1);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_ENODEV);
  cr_assert_null(dev);
  cr_assert(strstr(mp_last_error(), "no CUDA-capable device") != NULL, "%s",
            mp_last_error());
  /* The outcome of cuInit is kept: a second open says the same. */
  cr_assert_eq(mp_device_open("cuda:0", &dev), MP_ENODEV);
}

Test(cuda_device, failing_driver_init_is_edriver_with_its_name) {
  setenv("FAKECUDA_INIT_ERROR", "999", 1); /* CUDA_ERROR_UNKNOWN */
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_EDRIVER);
  cr_assert(strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL, "%s",
            mp_last_error());
}

Test(cuda_device, default_open_prefers_cuda) {
  unsetenv("MEMPOOL_DEVICE");
  mp_device_t *dev = open_dev(NULL);
  cr_assert(strncmp(mp_device_name(dev), "cuda:0", 6) == 0, "%s",
            mp_device_name(dev));
  mp_device_close(dev);
}

Test(cuda_device, default_open_falls_back_without_device) {
  unsetenv("MEMPOOL_DEVICE");
  setenv("FAKECUDA_NO_DEVICE", "1", 1);
  mp_device_t *dev = open_dev(NULL);
  cr_assert(strncmp(mp_device_name(dev), "cuda", 4) != 0, "%s",
            mp_device_name(dev));
  mp_device_close(dev);
}

Test(cuda_device, default_open_does_not_hide_a_failing_driver) {
  unsetenv("MEMPOOL_DEVICE");
  setenv("FAKECUDA_INIT_ERROR", "999", 1); /* CUDA_ERROR_UNKNOWN */
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(NULL, &dev), MP_EDRIVER, "%s",
               dev ? mp_device_name(dev) : mp_last_error());
  cr_assert_null(dev);
  cr_assert(strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL, "%s",
            mp_last_error());
}

/* The default pool, mp_malloc and PyTorch's entry point ask for the GPU
 * when MEMPOOL_DEVICE is unset: a failing driver is their failure, with
 * its reason, never memory of the emulated host device. */
Test(cuda_device, default_pool_and_torch_do_not_hide_a_failing_driver) {
  unsetenv("MEMPOOL_DEVICE");
  setenv("FAKECUDA_INIT_ERROR", "999", 1); /* CUDA_ERROR_UNKNOWN */
  cr_assert_null(mp_torch_malloc(4096, 0, NULL));
  cr_assert(strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL, "%s",
            mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 4096), MP_EDRIVER, "%s", mp_last_error());
  cr_assert_null(p);
  cr_assert_null(mp_default_pool());
  cr_assert(strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL, "%s",
            mp_last_error());
}

Test(cuda_device, entry_points_come_from_cuGetProcAddress) {
  mp_device_t *dev = open_dev("cuda");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_assert_gt(fk_calls("cuGetProcAddress_v2"), 0);
  /* Base names at version >= 3020 resolve to the _v2 ABIs. */
  cr_assert_eq(fk_calls("cuMemAlloc_v2"), 1);
  cr_assert_eq(fk_calls("cuMemFree_v2"), 1);
  cr_assert_eq(fk_calls("cuInit"), 1);
  mp_device_close(dev);
}

Test(cuda_device, close_releases_the_primary_context) {
  mp_device_t *a = open_dev("cuda");
  mp_device_t *b = open_dev("cuda:0");
  cr_assert_eq(fk_calls("cuDevicePrimaryCtxRetain"), 2);
  mp_device_close(a);
  mp_device_close(b);
  cr_assert_eq(fk_calls("cuDevicePrimaryCtxRelease_v2"), 2);
  /* Every push was popped: no context is left on this thread. */
  cr_assert_eq(fk_calls("cuCtxPushCurrent_v2"), fk_calls("cuCtxPopCurrent_v2"));
  CUresult (*get_current)(CUcontext *);
  FK_LOAD(get_current, "cuCtxGetCurrent");
  CUcontext cur = (CUcontext)&cur;
  cr_assert_eq(get_current(&cur), CUDA_SUCCESS);
  cr_assert_null(cur);
}

/* Another device's context current on the calling thread does not redirect
 * the calls: each targets the device its handle was opened on. */
Test(cuda_device, calls_target_the_opened_device_whatever_is_current) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1);
  mp_device_t *d0 = open_dev("cuda:0");
  mp_device_t *d1 = open_dev("cuda:1");

  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*push)(CUcontext);
  CUresult (*pop)(CUcontext *);
  CUresult (*release)(CUdevice);
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(push, "cuCtxPushCurrent_v2");
  FK_LOAD(pop, "cuCtxPopCurrent_v2");
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  CUcontext ctx1;
  cr_assert_eq(retain(&ctx1, 1), CUDA_SUCCESS);
  cr_assert_eq(push(ctx1), CUDA_SUCCESS);

  size_t f0, f1, f0_after, f1_after, total;
  cr_assert_eq(mp_device_mem_info(d0, &f0, &total), MP_OK);
  cr_assert_eq(mp_device_mem_info(d1, &f1, NULL), MP_OK);
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(d0, 16 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_mem_info(d0, &f0_after, NULL), MP_OK);
  cr_assert_eq(mp_device_mem_info(d1, &f1_after, NULL), MP_OK);
  cr_assert_leq(f0_after + (16 << 20), f0, "cuda:0 did not pay for it");
  cr_assert_eq(f1_after, f1, "cuda:1 paid for cuda:0's allocation");

  /* The thread's own context is still on top. */
  CUcontext top = NULL;
  cr_assert_eq(pop(&top), CUDA_SUCCESS);
  cr_assert_eq(top, ctx1);
  cr_assert_eq(mp_device_free(d0, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(release(1), CUDA_SUCCESS);
  mp_device_close(d1);
  mp_device_close(d0);
}

Test(cuda_device, mem_info_reports_the_driver_figures) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1);
  mp_device_t *dev = open_dev("cuda");
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_device_mem_info(dev, &free_b, &total), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(total, (size_t)64 << 20);
  cr_assert_leq(free_b, total);
  cr_assert_eq(fk_calls("cuMemGetInfo_v2"), 1);
  mp_device_close(dev);
}

Test(cuda_device, alloc_then_free) {
  mp_device_t *dev = open_dev("cuda");
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1000, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &b), MP_OK, "%s", mp_last_error());
  cr_assert_not_null(a);
  cr_assert_not_null(b);
  cr_assert_neq(a, b);
  cr_assert_eq(mp_device_free(dev, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, b), MP_OK, "%s", mp_last_error());
  /* device.h's promise, synchronized first: cuda.h promises only that
   * cuMemFree "may perform implicit synchronization" (the pools' own
   * frees, of memory no queued work uses, add no synchronize). */
  cr_assert_eq(fk_calls("cuMemFree_v2"), 2);
  cr_assert_eq(fk_calls("cuCtxSynchronize"), 2);
  mp_device_close(dev);
}

Test(cuda_device, beyond_capacity_is_enomem) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1);
  mp_device_t *dev = open_dev("cuda");
  void *p = (void *)&p;
  cr_assert_eq(mp_device_alloc(dev, (size_t)128 << 20, &p), MP_ENOMEM);
  cr_assert_eq(p, (void *)&p, "output written on failure");
  cr_assert(strstr(mp_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL, "%s",
            mp_last_error());
  /* The device is still usable. */
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

Test(cuda_device, free_of_foreign_or_freed_pointer_is_einval) {
  mp_device_t *dev = open_dev("cuda");
  int local;
  cr_assert_eq(mp_device_free(dev, &local), MP_EINVAL);
  cr_assert_neq(mp_last_error()[0], '\0');
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK);
  cr_assert_eq(mp_device_free(dev, (char *)p + 16), MP_EINVAL);
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  long long frees = fk_calls("cuMemFree_v2");
  cr_assert_eq(mp_device_free(dev, p), MP_EINVAL);
  cr_assert_eq(fk_calls("cuMemFree_v2"), frees, "reached the driver");
  mp_device_close(dev);
}

Test(cuda_device, host_alloc_is_writable_and_freed_once) {
  mp_device_t *dev = open_dev("cuda");
  unsigned char *h = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 8192, (void **)&h), MP_OK, "%s",
               mp_last_error());
  memset(h, 0x5a, 8192);
  cr_assert_eq(h[8191], 0x5a);
  cr_assert_eq(fk_calls("cuMemHostAlloc"), 1);
  cr_assert_eq(mp_device_host_free(dev, h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_host_free(dev, h), MP_EINVAL);
  cr_assert_eq(fk_calls("cuMemFreeHost"), 1);
  mp_device_close(dev);
}

/* A device on "cuda" holding one allocation, one page-locked buffer, one
 * stream and one event, each made by the device. */
typedef struct {
  mp_device_t *dev;
  void *p, *h;
  mp_stream_t s;
  mp_event_t e;
} one_of_each_t;

static one_of_each_t one_of_each(void) {
  one_of_each_t o = {.dev = open_dev("cuda")};
  cr_assert_eq(mp_device_alloc(o.dev, 4096, &o.p), MP_OK);
  cr_assert_eq(mp_device_host_alloc(o.dev, 4096, &o.h), MP_OK);
  cr_assert_eq(mp_stream_create(o.dev, &o.s), MP_OK);
  cr_assert_eq(mp_event_create(o.dev, &o.e), MP_OK);
  return o;
}

Test(cuda_device, close_releases_what_was_left) {
  mp_device_close(one_of_each().dev);
  cr_assert_eq(fk_calls("cuMemFree_v2"), 1);
  cr_assert_eq(fk_calls("cuMemFreeHost"), 1);
  cr_assert_eq(fk_calls("cuStreamDestroy_v2"), 1);
  cr_assert_eq(fk_calls("cuEventDestroy_v2"), 1);
  cr_assert_eq(fk_calls("cuDevicePrimaryCtxRelease_v2"), 1);
}

Test(cuda_device, reopen_after_close) {
  for (int i = 0; i < 3; i++) {
    mp_device_t *dev = open_dev("cuda");
    void *p = NULL;
    cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_device_free(dev, p), MP_OK);
    mp_device_close(dev);
  }
  cr_assert_eq(fk_calls("cuInit"), 1);
}

/* ---- a close that cannot wait for the device ---------------------------- */

typedef struct {
  mp_device_t *dev;
  mp_status_t st;
  char msg[512];
  long long torn; /* driver calls of the teardown the close made */
} close_call_t;

/* The teardown's driver calls so far (fake only). */
static long long teardown_calls(void) {
  return fk_calls("cuStreamDestroy_v2") + fk_calls("cuEventDestroy_v2") +
         fk_calls("cuMemFree_v2") + fk_calls("cuMemFreeHost") +
         fk_calls("cuDevicePrimaryCtxRelease_v2");
}

static void close_in_host_fn(void *p) {
  close_call_t *c = p;
  long long before = teardown_calls();
  mp_device_close(c->dev);
  c->torn = teardown_calls() - before;
  c->st = mp_last_status();
  snprintf(c->msg, sizeof c->msg, "%s", mp_last_error());
}

/* A close from a host function, where cuCtxSynchronize is a call CUDA
 * forbids (cuda.h, cuLaunchHostFunc: "must not make any CUDA API calls";
 * the fake answers CUDA_ERROR_NOT_PERMITTED): refused, it closes nothing
 * and says why; the device, its memory, stream and event stay usable and
 * a later close releases them. Failed before: the close went on after the
 * refused wait, called the driver to tear everything down (refused too)
 * and freed the device under its caller. Not on a GPU, where the
 * forbidden call may hang. */
Test(cuda_device, a_close_that_cannot_wait_closes_nothing_and_says_why) {
  if (fk_is_real())
    cr_skip_test("a driver call from a host function may hang a GPU");
  one_of_each_t o = one_of_each();
  mp_device_t *dev = o.dev;
  close_call_t c = {.dev = dev, .st = MP_OK, .torn = -1};
  run_in_host_fn(dev, close_in_host_fn, &c);
  cr_assert_eq(c.torn, 0, "the refused close tore the device down (%lld calls)",
               c.torn);
  cr_expect_eq(c.st, MP_EINVAL, "%s", c.msg);
  cr_expect(strstr(c.msg, "mp_device_close") != NULL &&
                strstr(c.msg, "CUDA_ERROR_NOT_PERMITTED") != NULL &&
                strstr(c.msg, "nothing was closed") != NULL,
            "%s", c.msg);
  cr_assert_eq(mp_memset_async(dev, o.p, 7, 4096, o.s), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_event_record(dev, o.e, o.s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_synchronize(dev, o.e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, o.p), MP_OK, "%s", mp_last_error());
  long long released = fk_calls("cuDevicePrimaryCtxRelease_v2");
  mp_device_close(dev);
  cr_expect_eq(fk_calls("cuDevicePrimaryCtxRelease_v2"), released + 1);
  cr_expect_eq(fk_calls("cuMemFreeHost"), 1);
  cr_expect_eq(fk_calls("cuEventDestroy_v2"), 1);
}

/* A context the driver has given up on (a sticky error, as after a
 * kernel's fault: cuda.h, "any further CUDA work will return the same
 * error") refuses every wait for ever, and runs nothing: its close is not
 * refused (it could never close), it releases what was left and the
 * primary context. */
Test(cuda_device, a_close_after_a_sticky_error_still_closes) {
  if (fk_is_real())
    cr_skip_test("the sticky error is the fake's knob");
  one_of_each_t o = one_of_each();
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_device_close(o.dev);
  fk_sticky_error(0);
  cr_expect_eq(fk_calls("cuDevicePrimaryCtxRelease_v2"), 1,
               "the close was refused: %s", mp_last_error());
  cr_expect_eq(fk_calls("cuStreamDestroy_v2"), 1);
  cr_expect_eq(fk_calls("cuEventDestroy_v2"), 1);
}

static void close_ex_in_host_fn(void *p) {
  close_call_t *c = p;
  c->st = mp_device_close_ex(c->dev);
  snprintf(c->msg, sizeof c->msg, "%s", mp_last_error());
}

/* mp_device_close returns nothing and mp_last_status() keeps an earlier
 * failure, so a refused close could not be told from one that closed: a
 * caller dropped the device, and with it everything it held and the
 * primary context's retain. mp_device_close_ex says which. */
Test(cuda_device, a_refused_close_says_so_in_its_status) {
  if (fk_is_real())
    cr_skip_test("a driver call from a host function may hang a GPU");
  cr_assert_eq(mp_device_close_ex(NULL), MP_OK);
  one_of_each_t o = one_of_each();
  close_call_t c = {.dev = o.dev, .st = MP_OK};
  run_in_host_fn(o.dev, close_ex_in_host_fn, &c);
  cr_expect_eq(c.st, MP_EINVAL, "%s: %s", mp_status_name(c.st), c.msg);
  /* An earlier failure stays mp_last_status()'s after a close that
   * closed: only the status tells. */
  cr_assert_eq(mp_device_free(o.dev, (void *)(uintptr_t)1), MP_EINVAL);
  cr_expect_eq(mp_device_close_ex(o.dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_eq(fk_calls("cuDevicePrimaryCtxRelease_v2"), 1);
}
