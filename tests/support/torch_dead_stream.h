/* torch_dead_stream.h - for the tests of mp_torch_free on a stream
 * destroyed since (the host device's and the cuda backend's): a block of
 * the default pool allocated through the hook on a new stream, which is
 * then destroyed (mp_stream_destroy: the pools forget it first). */
#ifndef MEMPOOL_TESTS_TORCH_DEAD_STREAM_H
#define MEMPOOL_TESTS_TORCH_DEAD_STREAM_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

static inline void *block_of_a_dead_stream(mp_stream_t *out) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  cr_assert_eq(mp_stream_create(dev, out), MP_OK, "%s", mp_last_error());
  void *p = mp_torch_malloc(1 << 20, 0, *out);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, *out), MP_OK, "%s", mp_last_error());
  return p;
}

#endif
