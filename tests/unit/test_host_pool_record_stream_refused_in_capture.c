/* test_host_pool_record_stream_refused_in_capture.c - an
 * mp_host_pool_record_stream that names a stream being captured holds the
 * buffer for the graph (host_pool.c, Graphs), and the hold needs host
 * memory. Without it the call is refused and changes nothing. It recorded
 * the stream's use first and was refused after: the buffer kept a use it
 * was told had been refused, and its free while the capture ran then held
 * it for good (capture_on_release unknown here), where a buffer no
 * captured stream used goes back to the pool at once. White-box: the host
 * backend's stream_capturing answers 1 for one stream while `captured` is
 * set; fault.c fails host allocations. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/host_pool.h>

#include "../support/device_helpers.h"
#include "device/backend.h"
#include "internal.h"

static const mp__backend_t *host_ops;
static mp__backend_t ops; /* host_ops' but stream_capturing */
static mp_stream_t cap;
static bool captured;

static int capturing(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  return captured && s != NULL && s == cap ? 1 : 0;
}

Test(host_pool_record_stream_refused_in_capture, the_refusal_records_no_use) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.stream_capturing = capturing;
  dev->ops = &ops;
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &cap), MP_OK, "%s", mp_last_error());
  /* cap known to the pool (its slot made) before the capture. */
  void *q = NULL, *p = NULL;
  mp_stats_t only_q, before, after;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, cap, &q), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_get_stats(hp, &only_q), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_get_stats(hp, &before), MP_OK);
  captured = true;
  mp__fault_host_every(true);
  mp_status_t st = mp_host_pool_record_stream(hp, p, cap);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_ENOMEM, "%s", mp_status_name(st));
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_record_stream: ", 28) == 0,
            "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_get_stats(hp, &after), MP_OK);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0, "stats changed");
  /* No captured stream used p: its free gives it back at once, while the
   * capture still runs. */
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_get_stats(hp, &after), MP_OK);
  cr_expect_eq(after.allocated_bytes, only_q.allocated_bytes,
               "p is held for a graph: %zu bytes allocated, %zu with q only",
               after.allocated_bytes, only_q.allocated_bytes);
  captured = false;
  cr_assert_eq(mp_host_pool_free(hp, q), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, cap), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}
