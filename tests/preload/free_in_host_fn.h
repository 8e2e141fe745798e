/* free_in_host_fn.h - a free made from a host function on the host device
 * (MEMPOOL_DEVICE=host), which the shim refuses as the driver does (cuda.h,
 * cuLaunchHostFunc: "the host function must not make any CUDA API
 * calls"). For the tests of the shim's sources in the test process. */
#ifndef MP_TESTS_PRELOAD_FREE_IN_HOST_FN_H
#define MP_TESTS_PRELOAD_FREE_IN_HOST_FN_H

#include <criterion/criterion.h>

#include "preload/hooks.h"

typedef struct {
  void *p;
  bool driver;
  unsigned r;
} free_arg_t;

static void free_in_host_fn(void *arg) {
  free_arg_t *a = arg;
  a->r = a->driver ? cuMemFree_v2((mp__cuptr)(uintptr_t)a->p) : cudaFree(a->p);
}

/* The answer of a free of p (cuMemFree_v2 when driver, else cudaFree) from
 * a host function on pl's device's NULL stream, run to its end. */
static inline unsigned free_from_host_fn(const mp__pl_t *pl, void *p,
                                         bool driver) {
  free_arg_t a = {.p = p, .driver = driver, .r = 0};
  cr_assert_eq(mp_stream_launch_host(pl->dev, NULL, free_in_host_fn, &a), MP_OK,
               "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(pl->dev, NULL), MP_OK);
  return a.r;
}

#endif
