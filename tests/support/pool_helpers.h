/* pool_helpers.h - shared by the pool's tests: make a pool from an option
 * string on a device, read its stats, assert its invariants. */
#ifndef MEMPOOL_TEST_POOL_HELPERS_H
#define MEMPOOL_TEST_POOL_HELPERS_H

#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include <mempool/mempool.h>

/* opts: mp_pool_config_parse options on top of the defaults, or NULL. */
/* A suite whose tests share one device `dev`, opened from spec before each
 * test and closed after. */
#define MP_DEVICE_SUITE(suite, spec)                                           \
  static mp_device_t *dev;                                                     \
  static void suite##_open(void) {                                             \
    cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());    \
  }                                                                            \
  static void suite##_close(void) {                                            \
    mp_device_close(dev);                                                      \
  }                                                                            \
  TestSuite(suite, .init = suite##_open, .fini = suite##_close)

static inline mp_pool_t *make_pool(mp_device_t *dev, const char *opts) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (opts)
    cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK, "%s",
                 mp_last_error());
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &p), MP_OK, "%s", mp_last_error());
  return p;
}

/* opts parse, and mp_pool_create refuses them: MP_EINVAL, no pool, the
 * message holding `says`. */
static inline void expect_create_refused(mp_device_t *dev, const char *opts,
                                         const char *says) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &cfg, &p), MP_EINVAL, "%s", opts);
  cr_expect_null(p, "%s", opts);
  cr_expect_neq(strstr(mp_last_error(), says), NULL, "%s: %s", opts,
                mp_last_error());
}

static inline mp_stats_t stats(mp_pool_t *p) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(p, &s), MP_OK);
  return s;
}

static inline void check(mp_pool_t *p) {
  cr_assert_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
}

/* Small alloc/free pairs spaced as work would space them, each free's
 * marker event completed by the next (the pool never waits for one): a
 * free is when release_threshold looks, every 8th after a try that found
 * memory in use. */
static inline void release_pairs(mp_pool_t *p, mp_stream_t s) {
  for (int i = 0; i < 9; i++) {
    void *x;
    cr_assert_eq(mp_pool_alloc(p, 4096, s, &x), MP_OK);
    usleep(2000);
    cr_assert_eq(mp_pool_free(p, x), MP_OK);
  }
}

/* A graph pool of p that captured, on s, one block of bytes and freed it:
 * the capture has ended and s's work is done; the caller releases it. */
static inline mp_pool_t *graph_used_once(mp_pool_t *p, mp_stream_t s,
                                         size_t bytes) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(p, g, s), MP_OK, "%s", mp_last_error());
  void *x;
  cr_assert_eq(mp_pool_alloc(p, bytes, s, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(p, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(mp_pool_device(p), s), MP_OK);
  return g;
}

#endif /* MEMPOOL_TEST_POOL_HELPERS_H */
