/* A new stream given a handle (the preload shim's cuStreamCreate hook,
 * mp__stream_born) is news for the pools' stream slots only. It was told
 * through mp_stream_forget, as a forget, so the torch hooks' watcher took
 * every stream the program made for a destroyed one: mp_torch_free on it
 * freed the block on the block's own stream (MP_EINVAL "was destroyed"),
 * and another stream got the block back at once while work queued on the
 * new stream could still use it. White-box: calls mp__stream_born itself
 * (stream.c), on the default pool's host device. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/default_pool_host.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

TestSuite(pool_stream_born_tells_only_the_pools, .init = on_host);

Test(pool_stream_born_tells_only_the_pools, a_torch_free_on_it_waits) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  void *p = mp_torch_malloc(1 << 20, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp__stream_born(dev, s);
  /* Work on the new stream uses the block; PyTorch frees it there. */
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK, "%s",
               mp_last_error());
  mp_torch_free(p, 1 << 20, 0, s);
  cr_expect(strstr(mp_last_error(), "was destroyed") == NULL,
            "the new stream was taken for a destroyed one: %s",
            mp_last_error());
  void *q = mp_torch_malloc(1 << 20, 0, NULL);
  cr_assert_not_null(q, "%s", mp_last_error());
  cr_expect_neq(q, p,
                "another stream got the block back while the new stream's "
                "work could still use it");
  gate_open(&g);
  mp_torch_free(q, 1 << 20, 0, NULL);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  gate_destroy(&g);
}
