/* mp_torch_free on a stream whose destroy the driver refused: the stream
 * lives on, and the free waits for its work as for any live stream's. The
 * LD_PRELOAD shim sets a capturing stream's slots aside around its
 * cuStreamDestroy (mp__stream_set_aside, then mp__stream_set_aside_end),
 * each a forget told to the device's watchers; the torch hooks' watcher
 * kept the stream as destroyed (torch.c, mp__td), so a free naming it was
 * made on the block's own stream instead, its work on the named stream
 * not waited for, and mp_last_error() said the stream was destroyed.
 * White-box: calls the shim's set-aside entry points itself (stream.c).
 * The default pool on the host device. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static void on_host(void) {
  setenv("MEMPOOL_DEVICE", "host", 1);
}

TestSuite(torch_free_refused_destroy, .init = on_host);

static size_t pending_blocks(void) {
  size_t len;
  char *s = (char *)snapshot_bytes(mp_default_pool(), &len);
  size_t n = snapshot_str_count(s, len, "active_pending_free");
  free(s);
  return n;
}

Test(torch_free_refused_destroy, the_free_waits_for_the_stream) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  /* s1 and s2, each held back by its gate. */
  mp_stream_t st[2];
  gate_t g[2];
  for (int i = 0; i < 2; i++) {
    gate_init(&g[i]);
    cr_assert_eq(mp_stream_create(dev, &st[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_stream_launch_host(dev, st[i], gate_wait, &g[i]), MP_OK);
  }
  void *p = mp_torch_malloc(MiB, 0, st[0]);
  cr_assert_not_null(p, "%s", mp_last_error());
  /* s2's destroy, refused: it lives on. */
  mp__stream_set_aside(dev, st[1]);
  mp__stream_set_aside_end(dev, st[1], false, false);
  /* p freed on s2 after its work: it waits for s1's and s2's. */
  mp_torch_free(p, MiB, 0, st[1]);
  cr_expect_null(strstr(mp_last_error(), "destroyed"), "%s", mp_last_error());
  cr_expect_eq(pending_blocks(), 1,
               "the free did not wait for the work on the stream it named");
  for (int i = 0; i < 2; i++)
    gate_open(&g[i]);
  cr_assert_eq(mp_pool_trim(mp_default_pool(), 0), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(pending_blocks(), 0);
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_destroy(dev, st[i]), MP_OK, "%s", mp_last_error());
    gate_destroy(&g[i]);
  }
}

/* A destroy that succeeds after the set-aside (told by the shim after the
 * driver's destroy, which the test leaves out: the host device's own
 * mp_stream_destroy forgets the stream first): the stream is dead, and a
 * free naming it is made on the block's own stream, as before. */
Test(torch_free_refused_destroy, a_destroy_that_succeeds_still_counts) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *p = mp_torch_malloc(MiB, 0, s);
  cr_assert_not_null(p, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  mp__stream_set_aside_end(dev, s, true, false);
  mp_torch_free(p, MiB, 0, s);
  cr_expect_not_null(strstr(mp_last_error(), "destroyed"), "%s",
                     mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.live_blocks, 0, "%s", mp_last_error());
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}
