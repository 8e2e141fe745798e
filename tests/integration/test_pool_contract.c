/* Bad input to every pool call: a clear MP_EINVAL (or MP_EBUSY, or an
 * out-of-memory status for sizes no device holds) and nothing else changes:
 * the stats are the same field for field (oom_count aside, where the call
 * is an allocation that failed for its size) and mp_pool_check passes. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_contract, "host:capacity=1G");

static void expect_same(const mp_stats_t *a, const mp_stats_t *b,
                        const char *what) {
  cr_expect_eq(memcmp(a, b, sizeof *a), 0, "%s changed the stats", what);
}

Test(pool_contract, contiguous_with_a_zero_size_is_einval_before_any_sum) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stats_t before = stats(p);
  size_t sizes[3] = {SIZE_MAX, 4096, 0};
  void *out[3];
  cr_expect_eq(mp_pool_alloc_contiguous(p, 3, sizes, NULL, out), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "sizes[2] is 0"), "%s", mp_last_error());
  mp_stats_t after = stats(p);
  expect_same(&before, &after, "a contiguous alloc with a 0 size");
  check(p);
  mp_pool_destroy(p);
}

Test(pool_contract, sizes_that_overflow_are_elimit_under_max_bytes_everywhere) {
  mp_pool_t *p = make_pool(dev, "max_bytes=64M");
  void *x;
  cr_expect_eq(mp_pool_alloc(p, SIZE_MAX, NULL, &x), MP_ELIMIT);
  cr_expect_eq(mp_pool_alloc(p, SIZE_MAX - 511, NULL, &x), MP_ELIMIT);
  size_t two[2] = {SIZE_MAX / 2, SIZE_MAX / 2 + 2};
  void *out[2];
  cr_expect_eq(mp_pool_alloc_contiguous(p, 2, two, NULL, out), MP_ELIMIT, "%s",
               mp_last_error());
  size_t one[1] = {SIZE_MAX};
  cr_expect_eq(mp_pool_alloc_contiguous(p, 1, one, NULL, out), MP_ELIMIT, "%s",
               mp_last_error());
  mp_handle_t *h;
  cr_expect_eq(mp_pool_alloc_movable(p, SIZE_MAX, NULL, &h), MP_ELIMIT);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.oom_count, 5);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.alloc_count, 0);
  check(p);
  mp_pool_destroy(p);
}

static void bad_input_changes_nothing(const char *opts) {
  mp_pool_t *p = make_pool(dev, opts), *child;
  void *raw, *out[2], *in_child;
  size_t two[2] = {4096, 8192};
  mp_handle_t *h, *gone;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 10000, s, &raw), MP_OK);
  cr_assert_eq(mp_pool_alloc_contiguous(p, 2, two, NULL, out), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, 5000, NULL, &h), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, 5000, NULL, &gone), MP_OK);
  cr_assert_eq(mp_handle_free(gone), MP_OK);
  cr_assert_eq(mp_pool_create_child(p, 4 * MiB, &child), MP_OK);
  cr_assert_eq(mp_pool_alloc(child, 3000, NULL, &in_child), MP_OK);
  void *freed;
  cr_assert_eq(mp_pool_alloc(p, 700, NULL, &freed), MP_OK);
  cr_assert_eq(mp_pool_free(p, freed), MP_OK);
  mp_stats_t before = stats(p), cbefore = stats(child), after;
  int local;
  size_t zero[2] = {512, 0};
  struct {
    const char *what;
    mp_status_t got, want;
  } calls[] = {
      {"free of a stack address", mp_pool_free(p, &local), MP_EINVAL},
      {"free of an interior pointer", mp_pool_free(p, (char *)raw + 512),
       MP_EINVAL},
      {"free of a piece's interior", mp_pool_free(p, (char *)out[1] + 512),
       MP_EINVAL},
      {"double free", mp_pool_free(p, freed), MP_EINVAL},
      {"free of a movable block's pointer", mp_pool_free(p, mp_handle_ptr(h)),
       MP_EINVAL},
      {"free of a child's range through the parent", mp_pool_free(p, in_child),
       MP_EINVAL},
      {"free of a child's block through the parent",
       mp_pool_free(p, (char *)in_child + 4096), MP_EINVAL},
      {"free of a parent's block through the child", mp_pool_free(child, raw),
       MP_EINVAL},
      {"record_stream of an interior pointer",
       mp_pool_record_stream(p, (char *)raw + 8, s), MP_EINVAL},
      {"record_stream of a freed pointer", mp_pool_record_stream(p, freed, s),
       MP_EINVAL},
      {"record_stream of a child's range",
       mp_pool_record_stream(p, in_child, s), MP_EINVAL},
      {"second free of a handle", mp_handle_free(gone), MP_EINVAL},
      {"destroy of a parent with a child", mp_pool_destroy(p), MP_EBUSY},
      {"contiguous of 0 pieces", mp_pool_alloc_contiguous(p, 0, two, s, out),
       MP_EINVAL},
      {"contiguous with a 0 size", mp_pool_alloc_contiguous(p, 2, zero, s, out),
       MP_EINVAL},
      {"contiguous without sizes", mp_pool_alloc_contiguous(p, 2, NULL, s, out),
       MP_EINVAL},
      {"contiguous without out", mp_pool_alloc_contiguous(p, 2, two, s, NULL),
       MP_EINVAL},
      {"child of 0 bytes", mp_pool_create_child(p, 0, &child), MP_EINVAL},
      {"child without out", mp_pool_create_child(p, MiB, NULL), MP_EINVAL},
      {"dump in an unknown format", mp_pool_dump(p, stderr, "xml"), MP_EINVAL},
  };
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
    cr_expect_eq(calls[i].got, calls[i].want, "%s (%s): %d", calls[i].what,
                 opts ? opts : "defaults", calls[i].got);
  after = stats(p);
  expect_same(&before, &after, "bad input to the parent");
  after = stats(child);
  expect_same(&cbefore, &after, "bad input to the child");
  check(p);
  check(child);
  cr_expect_eq(mp_pool_free(child, in_child), MP_OK);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  cr_expect_eq(mp_handle_free(h), MP_OK);
  cr_expect_eq(mp_pool_free(p, raw), MP_OK);
  cr_expect_eq(mp_pool_free(p, out[0]), MP_OK);
  cr_expect_eq(mp_pool_free(p, out[1]), MP_OK);
  check(p);
  cr_expect_eq(stats(p).live_blocks, 0);
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  mp_stream_destroy(dev, s);
}

Test(pool_contract, bad_input_changes_nothing_virtual) {
  bad_input_changes_nothing(NULL);
}

Test(pool_contract, bad_input_changes_nothing_plain) {
  bad_input_changes_nothing("virtual=0");
}

Test(pool_contract, bad_input_changes_nothing_under_max_split) {
  bad_input_changes_nothing("max_split=1M,segment_bytes=1M");
}

typedef struct {
  mp_pool_t *pool;
  mp_status_t st;
  char why[256];
} destroy_call_t;

static void destroy_call(void *arg) {
  destroy_call_t *c = arg;
  c->st = mp_pool_destroy(c->pool);
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
}

/* A destroy that cannot wait for the device (from a host function) fails
 * with the pool as it was: it answered MP_OK and freed the pool, and the
 * memory the device then refused to free there was lost for good. */
Test(pool_contract, destroy_that_cannot_wait_changes_nothing) {
  static const char *const opts[] = {NULL, "virtual=0", "arenas=2"};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    const char *o = opts[i] ? opts[i] : "defaults";
    size_t before = free_bytes(dev);
    mp_pool_t *p = make_pool(dev, opts[i]);
    void *x;
    cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &x), MP_OK);
    mp_stats_t was = stats(p);
    destroy_call_t c = {.pool = p};
    run_in_host_fn(dev, destroy_call, &c);
    cr_assert_eq(c.st, MP_EINVAL, "%s: %s", o, c.why);
    mp_stats_t now = stats(p);
    expect_same(&was, &now, "a destroy that cannot wait");
    cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s: %s", o, mp_last_error());
    cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s: %s", o, mp_last_error());
    cr_expect_eq(free_bytes(dev), before, "%s: device memory lost", o);
  }
}

/* The same where no stream is left to wait for: every stream the pool knew
 * was destroyed, and a trim saw their work done. The destroy made no wait
 * then, and the device's refusal to free the memory from a host function
 * went unheard: MP_OK, the pool gone and its memory lost for good. */
Test(pool_contract,
     destroy_that_cannot_wait_after_its_streams_went_changes_nothing) {
  static const char *const opts[] = {"virtual=0", NULL};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    const char *o = opts[i] ? opts[i] : "defaults";
    size_t before = free_bytes(dev);
    mp_pool_t *p = make_pool(dev, opts[i]);
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
    void *x, *y;
    cr_assert_eq(mp_pool_alloc(p, 3 * MiB, s, &x), MP_OK);
    cr_assert_eq(mp_pool_alloc(p, 5 * MiB, s, &y), MP_OK);
    cr_assert_eq(mp_pool_free(p, y), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s: %s", o, mp_last_error());
    mp_stats_t was = stats(p);
    cr_assert_gt(was.reserved_bytes, 0, "%s", o);
    destroy_call_t c = {.pool = p};
    run_in_host_fn(dev, destroy_call, &c);
    cr_assert_eq(c.st, MP_EINVAL, "%s: %s: %s", o, mp_status_name(c.st), c.why);
    cr_expect(strstr(c.why, "host function") != NULL, "%s: %s", o, c.why);
    mp_stats_t now = stats(p);
    expect_same(&was, &now, "a destroy that cannot wait, its streams gone");
    check(p);
    cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s: %s", o, mp_last_error());
    cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s: %s", o, mp_last_error());
    cr_expect_eq(free_bytes(dev), before, "%s: device memory lost", o);
  }
}
