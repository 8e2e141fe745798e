/* movable_fixture.h - the fixture shared by the movable-block tests
 * (test_defragment.c, test_freeze.c): one host device, one pool, one
 * stream, and blocks filled with a byte pattern derived from a tag so that
 * any byte a move loses or misplaces is caught. Public API only. */
#ifndef MEMPOOL_TEST_MOVABLE_FIXTURE_H
#define MEMPOOL_TEST_MOVABLE_FIXTURE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include <mempool/mempool.h>

static mp_device_t *dev;
static mp_pool_t *pool;
static mp_stream_t stream;

/* options: pool options on top of the defaults, or NULL. */
static inline void open_pool(const char *device, const char *options) {
  cr_assert_eq(mp_device_open(device, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (options != NULL)
    cr_assert_eq(mp_pool_config_parse(&cfg, options), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &stream), MP_OK);
}

static inline void close_pool(void) {
  if (stream != NULL)
    cr_expect_eq(mp_stream_destroy(dev, stream), MP_OK);
  stream = NULL;
  if (pool != NULL)
    cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  pool = NULL;
  mp_device_close(dev);
  dev = NULL;
}

static inline void check(void) {
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

static inline mp_stats_t stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  return s;
}

static inline unsigned char pattern(unsigned tag, size_t i) {
  return (unsigned char)(tag * 131u + i * 7u + (i >> 9));
}

static inline void fill(void *dptr, size_t n, unsigned tag) {
  unsigned char *h = malloc(n);
  for (size_t i = 0; i < n; i++)
    h[i] = pattern(tag, i);
  cr_assert_eq(mp_memcpy_async(dev, dptr, h, n, stream), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  free(h);
}

static inline void expect_pattern(const void *dptr, size_t n, unsigned tag) {
  unsigned char *h = malloc(n);
  cr_assert_eq(mp_memcpy_async(dev, h, dptr, n, stream), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  for (size_t i = 0; i < n; i++)
    if (h[i] != pattern(tag, i))
      cr_assert_fail("block %u differs at byte %zu of %zu", tag, i, n);
  free(h);
}

/* A movable block of n bytes filled with tag's pattern. */
static inline mp_handle_t *movable(size_t n, unsigned tag) {
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(pool, n, stream, &h), MP_OK, "%s",
               mp_last_error());
  cr_assert_neq(h, NULL);
  cr_assert_neq(mp_handle_ptr(h), NULL);
  fill(mp_handle_ptr(h), n, tag);
  return h;
}

/* Frees h[i] for every i < n with i % k != keep, leaving NULL behind. */
static inline void free_all_but(mp_handle_t **h, unsigned n, unsigned k,
                                unsigned keep) {
  for (unsigned i = 0; i < n; i++)
    if (i % k != keep && h[i] != NULL) {
      cr_assert_eq(mp_handle_free(h[i]), MP_OK);
      h[i] = NULL;
    }
}

/* Defragments on the stream, waits for the copies, checks the pool. */
static inline size_t defragment(void) {
  size_t moved = SIZE_MAX;
  cr_assert_eq(mp_pool_defragment(pool, stream, &moved), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  check();
  return moved;
}

#endif /* MEMPOOL_TEST_MOVABLE_FIXTURE_H */
