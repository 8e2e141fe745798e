/* test_cuda_driver_error_code.c - a failure of the driver that has no
 * status of its own (MP_EDRIVER) keeps the driver's code for
 * mp_last_driver_error(), so that a program or a shim standing in for the
 * driver can answer with it: CUDA_ERROR_ILLEGAL_ADDRESS (700) after a
 * kernel's fault, which cuda.h says leaves "the process in an
 * inconsistent state", is not an error to retry. Run on the fake driver
 * with its sticky error (cuFakeSetStickyError). */
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static mp_pool_t *cuda_pool(mp_device_t **dev) {
  *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(*dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  return pool;
}

Test(cuda_driver_error_code, a_refused_growth_keeps_the_drivers_code) {
  mp_device_t *dev;
  mp_pool_t *pool = cuda_pool(&dev);
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1 << 20, NULL, &a), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_status_t st = mp_pool_alloc(pool, 256u << 20, NULL, &b);
  fk_sticky_error(0);
  cr_assert_eq(st, MP_EDRIVER, "%s", mp_status_name(st));
  cr_expect_eq(mp_last_status(), MP_EDRIVER);
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_ILLEGAL_ADDRESS, "%d",
               mp_last_driver_error());
  cr_expect(strstr(mp_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL, "%s",
            mp_last_error());
  cr_expect_null(b, "written on failure");
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  /* Another failure, not the driver's: no code. */
  cr_assert_eq(mp_pool_free(pool, (char *)a + 1), MP_EINVAL);
  cr_expect_eq(mp_last_driver_error(), 0, "%d", mp_last_driver_error());
  /* The driver answers again (the fake's sticky error cleared): nothing
   * was left half done. */
  cr_assert_eq(mp_pool_alloc(pool, 256u << 20, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, b), MP_OK);
  cr_expect_eq(mp_pool_free(pool, a), MP_OK);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A driver error the library has a status for is that status, and no
 * driver code: CUDA_ERROR_OUT_OF_MEMORY is MP_ENOMEM. */
Test(cuda_driver_error_code, a_known_error_is_its_status_without_a_code) {
  mp_device_t *dev;
  mp_pool_t *pool = cuda_pool(&dev);
  void *b = NULL;
  fk_sticky_error(CUDA_ERROR_OUT_OF_MEMORY);
  mp_status_t st = mp_pool_alloc(pool, 64u << 20, NULL, &b);
  fk_sticky_error(0);
  cr_assert_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(mp_last_driver_error(), 0, "%d", mp_last_driver_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* After a kernel's fault a trim and a destroy say the driver's error: the
 * question whether a stream is captured, asked before their waits, fails
 * with it, and it was taken for a capture (MP_EBUSY, "captured without
 * the pool's knowledge"). Nothing is released; once the driver answers
 * again the destroy goes through. */
Test(cuda_driver_error_code, a_trim_and_a_destroy_say_the_drivers_error) {
  mp_device_t *dev;
  mp_pool_t *pool = cuda_pool(&dev);
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_status_t trim = mp_pool_trim(pool, 0);
  int trim_cu = mp_last_driver_error();
  mp_status_t destroy = mp_pool_destroy(pool);
  int destroy_cu = mp_last_driver_error();
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  fk_sticky_error(0);
  cr_expect_eq(trim, MP_EDRIVER, "trim: %s", mp_status_name(trim));
  cr_expect_eq(trim_cu, CUDA_ERROR_ILLEGAL_ADDRESS);
  cr_assert_eq(destroy, MP_EDRIVER, "destroy: %s: %s", mp_status_name(destroy),
               msg);
  cr_expect_eq(destroy_cu, CUDA_ERROR_ILLEGAL_ADDRESS);
  cr_expect(strstr(msg, "mp_pool_destroy") != NULL &&
                strstr(msg, "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL,
            "%s", msg);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A pool asked for while the driver fails every call (a kernel's fault)
 * is refused with the driver's error: created, it had sized itself for no
 * device (cuMemGetInfo failed) and left that failure as the thread's last
 * error after a success. The driver answering again, the pool is made
 * and the thread's last failure is still the one it saw. */
Test(cuda_driver_error_code, a_pool_is_not_made_without_the_devices_size) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_status_t st = mp_pool_create(dev, NULL, &pool);
  int cu = mp_last_driver_error();
  fk_sticky_error(0);
  cr_expect_eq(st, MP_EDRIVER, "%s", mp_status_name(st));
  cr_expect_eq(cu, CUDA_ERROR_ILLEGAL_ADDRESS, "%d", cu);
  cr_expect(strstr(mp_last_error(), "cuMemGetInfo") != NULL, "%s",
            mp_last_error());
  cr_expect_null(pool, "written on failure");
  if (pool != NULL)
    mp_pool_destroy(pool);
  mp_pool_t *p2 = NULL;
  cr_assert_eq(mp_pool_free(NULL, NULL), MP_EINVAL);
  cr_assert_eq(mp_pool_create(dev, NULL, &p2), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EINVAL, "%s",
               mp_status_name(mp_last_status()));
  cr_expect_eq(mp_pool_destroy(p2), MP_OK);
  mp_device_close(dev);
}

/* mp_ipc_close_after after a kernel's fault: the question whether its
 * stream joins a capture fails with the driver's error, which is the
 * answer (MP_EDRIVER, 700), not "cannot tell" (MP_EBUSY, code 0). */
Test(cuda_driver_error_code, an_ipc_close_after_says_the_drivers_error) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  int never_opened;
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_status_t legacy = mp_ipc_close_after(dev, &never_opened, NULL);
  int legacy_code = mp_last_driver_error();
  mp_status_t own = mp_ipc_close_after(dev, &never_opened, s);
  int own_code = mp_last_driver_error();
  fk_sticky_error(0);
  cr_expect_eq(legacy, MP_EDRIVER, "%s", mp_status_name(legacy));
  cr_expect_eq(legacy_code, CUDA_ERROR_ILLEGAL_ADDRESS, "%d", legacy_code);
  cr_expect_eq(own, MP_EDRIVER, "%s", mp_status_name(own));
  cr_expect_eq(own_code, CUDA_ERROR_ILLEGAL_ADDRESS, "%d", own_code);
  /* The driver answering, the pointer is what is wrong. */
  cr_expect_eq(mp_ipc_close_after(dev, &never_opened, s), MP_EINVAL);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}
