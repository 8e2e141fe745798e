/* Stream watchers (src/device/device.c): mp_stream_forget tells every
 * watcher, in the order they were added, also after one in the middle
 * left. Pools rely on it: a pool with arenas watches before its arenas,
 * so that a forget reaches the pool before an arena made meanwhile can
 * copy the forgotten stream's capture mark from it (arena.c). Swapping
 * the last watcher into a leaver's place put arenas before their pool. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "device/backend.h"

static int order[8], n;

static void told(void *ctx, mp_stream_t s) {
  (void)s;
  order[n++] = (int)(intptr_t)ctx;
}

Test(device_stream_watchers, a_forget_tells_watchers_in_the_order_they_came) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  for (intptr_t k = 1; k <= 5; k++)
    cr_assert_eq(mp__device_watch(dev, told, (void *)k), MP_OK);
  mp__device_unwatch(dev, told, (void *)2);
  n = 0;
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK);
  int want[] = {1, 3, 4, 5};
  cr_assert_eq(n, 4);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(order[i], want[i], "watcher %d told %d-th, not %d", order[i],
                 i + 1, want[i]);
  for (intptr_t k = 1; k <= 5; k++)
    mp__device_unwatch(dev, told, (void *)k);
  mp_stream_destroy(dev, s);
  mp_device_close(dev);
}
