/* stream_destroy_check.h - a check shared by the fake-driver test
 * (test_cuda_streams.c) and its GPU twin (tests/gpu/test_cuda_gpu.c):
 * mp_stream_destroy returns while the stream's work is held back by a gate,
 * as cuStreamDestroy does (cuda.h: "the function will return immediately"),
 * and that work still runs; a device synchronize waits for it. */
#ifndef MEMPOOL_TEST_STREAM_DESTROY_CHECK_H
#define MEMPOOL_TEST_STREAM_DESTROY_CHECK_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

static inline void check_stream_destroy_returns_at_once(mp_device_t *dev) {
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 4096, (void **)&h), MP_OK);
  h[0] = 0;
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_memset_async(dev, d, 9, 4096, s), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, h, d, 4096, s), MP_OK);
  gate_timer_t t; /* opens the gate in 2 s if the destroy waits for it */
  cr_assert_eq(gate_timer_start(&t, &g, 2000000), 0);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(atomic_load(&t.opened), 0,
               "mp_stream_destroy waited for the stream's queued work");
  gate_open(&g);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(h[0], 9, "the destroyed stream's queued work did not run");
  gate_timer_join(&t);
  gate_destroy(&g);
  cr_assert_eq(mp_device_host_free(dev, h), MP_OK);
  cr_assert_eq(mp_device_free(dev, d), MP_OK);
}

#endif /* MEMPOOL_TEST_STREAM_DESTROY_CHECK_H */
