/* host_pool_graph.h - what the host pool's tests of captured copies share
 * beside host_pool_capture.h: dst, N page-locked bytes that a copy
 * captured from a pool's buffer writes, made after the host pool's set-up
 * and freed after the host pool (which may hold a copy's reads of it). */
#ifndef MEMPOOL_TEST_HOST_POOL_GRAPH_H
#define MEMPOOL_TEST_HOST_POOL_GRAPH_H

#include "host_pool_capture.h"

#define N 4096

static unsigned char *dst;

static void hpg_setup(void) {
  hpc_setup();
  void *d = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, N, &d), MP_OK, "%s", mp_last_error());
  dst = d;
}

/* The pool first: it may hold a copy's reads of dst. */
static void hpg_teardown(void) {
  if (hp != NULL)
    cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  hp = NULL;
  cr_expect_eq(mp_device_host_free(dev, dst), MP_OK, "%s", mp_last_error());
  hpc_teardown();
}

#endif /* MEMPOOL_TEST_HOST_POOL_GRAPH_H */
