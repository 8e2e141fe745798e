/* gated_streams_fixture.h - the host-device fixture of the stream tests
 * whose scenarios hold one stream behind a gate (stream_merges.h,
 * stream_markers.h): a default pool on the host device, two streams and a
 * closed gate; the teardown opens the gate, lets both streams finish and
 * checks the pool before destroying it. Include once per test file. */
#ifndef MEMPOOL_TEST_GATED_STREAMS_FIXTURE_H
#define MEMPOOL_TEST_GATED_STREAMS_FIXTURE_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

static gate_t gate;
static mp_device_t *dev;
static mp_pool_t *pool;
static mp_stream_t s1, s2;

static void setup(void) {
  gate_init(&gate);
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
}

static void teardown(void) {
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
  gate_destroy(&gate);
}

#endif /* MEMPOOL_TEST_GATED_STREAMS_FIXTURE_H */
