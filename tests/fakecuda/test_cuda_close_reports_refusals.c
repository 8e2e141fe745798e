/* mp_device_close gives back what the caller left on a cuda device:
 * streams, events, allocations, page-locked buffers, mappings and
 * reservations, each with its own driver call. cuda.h lists failures for
 * every one of them (cuStreamDestroy, cuMemFree, cuMemUnmap, cuMemRelease,
 * cuMemAddressFree: CUDA_ERROR_INVALID_VALUE, _DEINITIALIZED,
 * _NOT_PERMITTED, ...). Where the driver refuses one, the close still
 * asks for every other release, closes the device, and
 * mp_device_close_checked reports the first refusal (MP_EDRIVER, the
 * driver's code, the call named, the refusals counted) with the device
 * closed; mp_device_close_ex says MP_OK (closed) and leaves the caller's
 * last error as it was. Before, every refusal was ignored: the close said
 * nothing, and what the driver kept was lost without a word. The refusals
 * are the fake's (cuFakeRefuse): no GPU twin. */
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

/* The thread has seen no failure (mp_last_status() is MP_OK). */
static void clear_last_error(void) {
  mp_error_state_t none = {.version = MP_ERROR_STATE_VERSION};
  mp_error_restore(&none);
  cr_assert_eq(mp_last_status(), MP_OK);
}

/* A device with one object of each kind left to its close: a stream, an
 * event, an allocation, page-locked host memory. */
static mp_device_t *open_with_leftovers(void) {
  if (fk_is_real())
    cr_skip_test("the refusals are the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s;
  mp_event_t e;
  void *p, *h;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_create(dev, &e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_host_alloc(dev, 4096, &h), MP_OK, "%s",
               mp_last_error());
  return dev;
}

Test(cuda_close_refusals, the_first_refusal_is_reported_the_rest_released) {
  mp_device_t *dev = open_with_leftovers();
  const char *calls[] = {"cuStreamDestroy_v2", "cuEventDestroy_v2",
                         "cuMemFree_v2", "cuMemFreeHost"};
  long long before[4];
  for (int i = 0; i < 4; i++)
    before[i] = fk_calls(calls[i]);
  clear_last_error();
  fk_refuse("cuStreamDestroy_v2", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuMemFree_v2", CUDA_ERROR_UNKNOWN, 1);
  int closed = 0;
  mp_status_t st = mp_device_close_checked(dev, &closed);
  fk_refuse("cuStreamDestroy_v2", CUDA_SUCCESS, 0);
  fk_refuse("cuMemFree_v2", CUDA_SUCCESS, 0);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(fk_calls(calls[i]) - before[i], 1,
                 "%s: not asked once by the close", calls[i]);
  cr_expect_eq(closed, 1, "the device was closed, but not said so");
  cr_expect_eq(st, MP_EDRIVER, "the refused releases went unreported: '%s'",
               mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EDRIVER);
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_UNKNOWN);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "mp_device_close") != NULL, "%s", msg);
  cr_expect(strstr(msg, "cuStreamDestroy") != NULL,
            "the first refusal is not named: %s", msg);
  cr_expect(strstr(msg, "2 refusals") != NULL,
            "the refusals are not counted: %s", msg);
}

/* A refused unmap of a pool's chunk at close: reported too, and its
 * handle and reservation still asked for. */
Test(cuda_close_refusals, a_refused_unmap_is_reported) {
  if (fk_is_real())
    cr_skip_test("the refusals are the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool;
  void *p;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  long long unmaps = fk_calls("cuMemUnmap");
  /* The pool's destroy unmaps its chunks itself: refused there, they are
   * the device's to give back at close. */
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  (void)mp_pool_destroy(pool);
  fk_refuse("cuMemUnmap", CUDA_SUCCESS, 0);
  if (fk_calls("cuMemUnmap") == unmaps)
    cr_skip_test("the pool mapped no chunk (no virtual memory)");
  long long releases = fk_calls("cuMemRelease");
  long long frees = fk_calls("cuMemAddressFree");
  clear_last_error();
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  int closed = 0;
  mp_status_t st = mp_device_close_checked(dev, &closed);
  fk_refuse("cuMemUnmap", CUDA_SUCCESS, 0);
  cr_expect_eq(closed, 1);
  cr_expect_eq(st, MP_EDRIVER, "the refused unmap went unreported: '%s'",
               mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuMemUnmap") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(fk_calls("cuMemRelease") - releases, 1,
               "the chunk's handle was not released");
  cr_expect_geq(fk_calls("cuMemAddressFree") - frees, 1,
                "the reservation was not freed");
}

Test(cuda_close_refusals, a_close_nothing_refused_reports_nothing) {
  mp_device_t *dev = open_with_leftovers();
  clear_last_error();
  int closed = 0;
  cr_expect_eq(mp_device_close_checked(dev, &closed), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(closed, 1);
  cr_expect_eq(mp_last_status(), MP_OK, "%s", mp_last_error());
}

/* mp_device_close_ex (and mp_device_close) say MP_OK for a device closed
 * with refusals (device.h: MP_OK when closed), and a success leaves the
 * caller's last error as it was. */
Test(cuda_close_refusals, close_ex_says_closed_and_keeps_the_last_error) {
  mp_device_t *dev = open_with_leftovers();
  mp_error_state_t mine = {.version = MP_ERROR_STATE_VERSION,
                           .status = MP_EBUSY,
                           .message = "the caller's own failure"};
  mp_error_restore(&mine);
  fk_refuse("cuMemFree_v2", CUDA_ERROR_UNKNOWN, 1);
  mp_status_t st = mp_device_close_ex(dev);
  fk_refuse("cuMemFree_v2", CUDA_SUCCESS, 0);
  cr_expect_eq(st, MP_OK, "closed, but said %s: %s", mp_status_name(st),
               mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EBUSY, "%s", mp_last_error());
  cr_expect_str_eq(mp_last_error(), "the caller's own failure");
}

/* NULL: nothing to close, closed. */
Test(cuda_close_refusals, null_is_closed) {
  int closed = 0;
  cr_expect_eq(mp_device_close_checked(NULL, &closed), MP_OK);
  cr_expect_eq(closed, 1);
  cr_expect_eq(mp_device_close_checked(NULL, NULL), MP_OK);
}
