/* test_pool_destroy_refused.c - mp_pool_destroy when the device refuses to
 * free a plain segment (pool_fakedev.h's refuse_frees). The first free
 * comes before anything else is given up: refused, destroy fails with the
 * device's status and a message naming the segment, and the pool is as it
 * was (it checks, allocates and frees, and a later destroy releases
 * everything). A free refused after others went is still reported (the
 * segment named, the others counted); the pool is destroyed, the others
 * freed, nothing freed twice. Before, destroy ignored every refusal and
 * returned MP_OK, the memory silently lost. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A plain pool with three segments of 4 MiB, one live block each. */
static mp_pool_t *three_segments(mp_device_t *dev, void *p[3]) {
  mp_pool_t *pool = make_pool(dev, NULL);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &p[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 3);
  return pool;
}

Test(pool_destroy_refused, a_refused_first_free_leaves_the_pool_as_it_was) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  mp_pool_t *pool = three_segments(dev, p);
  cr_assert_eq(mp_pool_free(pool, p[1]), MP_OK);
  mp_stats_t before = stats(pool);
  size_t used = f->used;
  f->refuse_frees = 1;
  cr_assert_eq(mp_pool_destroy(pool), MP_EDRIVER);
  /* The newest segment is the first on the list: p[2] starts it. */
  char addr[32];
  snprintf(addr, sizeof addr, "%p", p[2]);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, addr) != NULL && strstr(msg, "as it was") != NULL,
            "the message should name segment %s and say nothing changed: "
            "'%s'",
            addr, msg);
  cr_expect_eq(f->frees, 0);
  cr_expect_eq(f->used, used);
  check(pool);
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  cr_expect_eq(after.segment_count, before.segment_count);
  cr_expect_eq(after.device_free_count, before.device_free_count);
  /* Still a pool: the free segment serves a request again. */
  void *q;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(q, p[1]);
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[0]), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->frees, 3);
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}

/* on_free hooks: the first free goes, the next `refuse` are refused. */
static unsigned refuse;
static void refuse_next(void *ctx) {
  ((fake_dev_t *)ctx)->refuse_frees = refuse;
}
static void arm_after_one(void *ctx) {
  fake_dev_t *f = ctx;
  f->on_free = refuse_next;
  f->on_free_ctx = f;
}

static void refused_after_one(unsigned n, const char *more) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  mp_pool_t *pool = three_segments(dev, p);
  refuse = n;
  f->on_free = arm_after_one;
  f->on_free_ctx = f;
  cr_assert_eq(mp_pool_destroy(pool), MP_EDRIVER);
  /* The second on the list (p[1]'s) is the first refused. */
  char addr[32];
  snprintf(addr, sizeof addr, "%p", p[1]);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, addr) != NULL && strstr(msg, "lost") != NULL,
            "the message should name segment %s and say it is lost: '%s'", addr,
            msg);
  if (more != NULL)
    cr_expect(strstr(msg, more) != NULL, "'%s' should say '%s'", msg, more);
  else
    cr_expect(strstr(msg, "more") == NULL, "'%s' counts no other", msg);
  /* Every other segment was freed once; the refused stay the device's
   * (fake_close frees them: no host memory leaks). */
  cr_expect_eq(f->frees, 3 - n);
  cr_expect_eq(f->used, n * 4 * MiB);
  cr_expect_eq(f->nplain, n);
  fake_close(dev);
}

Test(pool_destroy_refused, a_free_refused_after_others_went_is_reported) {
  refused_after_one(1, NULL);
}

Test(pool_destroy_refused, every_refused_free_is_counted) {
  refused_after_one(2, "and 1 more");
}

/* mp_pool_destroy_ex says which of the two failures above it was: a caller
 * (the Python binding) must drop its handle when the pool is gone, and keep
 * it when the pool stays as it was. */
Test(pool_destroy_refused,
     destroy_ex_says_the_pool_stays_after_a_first_refusal) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  mp_pool_t *pool = three_segments(dev, p);
  f->refuse_frees = 1;
  int destroyed = -1;
  cr_assert_eq(mp_pool_destroy_ex(pool, &destroyed), MP_EDRIVER);
  cr_expect_eq(destroyed, 0);
  check(pool); /* still a pool */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  destroyed = -1;
  cr_assert_eq(mp_pool_destroy_ex(pool, &destroyed), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(destroyed, 1);
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}

Test(pool_destroy_refused,
     destroy_ex_says_the_pool_is_gone_after_a_later_refusal) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  mp_pool_t *pool = three_segments(dev, p);
  refuse = 1;
  f->on_free = arm_after_one;
  f->on_free_ctx = f;
  int destroyed = -1;
  cr_assert_eq(mp_pool_destroy_ex(pool, &destroyed), MP_EDRIVER);
  cr_expect_eq(destroyed, 1, "the pool was freed: its handle is gone");
  cr_expect_eq(f->nplain, 1);
  fake_close(dev);
}

Test(pool_destroy_refused, destroy_ex_on_null_says_nothing_was_destroyed) {
  int destroyed = -1;
  cr_expect_eq(mp_pool_destroy_ex(NULL, &destroyed), MP_EINVAL);
  cr_expect_eq(destroyed, 0);
  cr_expect_eq(mp_pool_destroy_ex(NULL, NULL), MP_EINVAL);
}

Test(pool_destroy_refused, destroy_ex_of_a_graph_pool_says_released_or_busy) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *parent = make_pool(dev, NULL), *graph = NULL;
  cr_assert_eq(mp_pool_graph_create(parent, &graph), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, graph, s), MP_OK, "%s",
               mp_last_error());
  int destroyed = -1;
  cr_expect_eq(mp_pool_destroy_ex(graph, &destroyed), MP_EBUSY);
  cr_expect_eq(destroyed, 0, "a graph pool still allocated to stays");
  cr_assert_eq(mp_pool_graph_end(parent, s), MP_OK);
  cr_expect_eq(mp_pool_destroy_ex(graph, &destroyed), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(destroyed, 1);
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  fake_close(dev);
}

/* mp_allocator_destroy over pools the device refuses to free: a built-in
 * allocator stays after any failure, for a later destroy, and names no
 * pool that went with the failure. A "child" allocator whose parent's
 * destroy failed still named its child pool, already freed, through
 * mp_allocator_pool; where the parent went too (a refusal after others
 * went, see mp_pool_destroy_ex), the next destroy freed the parent again.
 * A "pool" allocator kept its freed pool the same way. */
static mp_allocator_t *child_allocator(mp_device_t *dev, mp_pool_t **parent) {
  mp_allocator_t *a = NULL;
  cr_assert_eq(mp_allocator_create(dev, "child:bytes=4M", &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_not_null(mp_allocator_pool(a));
  *parent = mp_allocator_pool(a)->parent;
  cr_assert_not_null(*parent);
  return a;
}

/* A "pool" allocator with n live blocks p[] of 4 MiB, a segment each. */
static mp_allocator_t *pool_allocator(mp_device_t *dev, int n, void **p) {
  mp_allocator_t *a = NULL;
  cr_assert_eq(mp_allocator_create(dev, "pool", &a), MP_OK, "%s",
               mp_last_error());
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_allocator_alloc(a, 4 * MiB, NULL, &p[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(mp_allocator_pool(a)).segment_count, (size_t)n);
  return a;
}

/* Nothing but destroy is left of a: every other call says so. */
static void only_destroy_is_left(mp_allocator_t *a) {
  cr_assert_null(mp_allocator_pool(a), "a pool that is gone is still named");
  void *q = NULL;
  cr_expect_eq(mp_allocator_alloc(a, 4096, NULL, &q), MP_EINVAL);
  cr_expect_null(q);
  cr_expect(strstr(mp_last_error(), "destroy it again") != NULL, "%s",
            mp_last_error());
  mp_stats_t s;
  cr_expect_eq(mp_allocator_get_stats(a, &s), MP_EINVAL);
  cr_expect_eq(mp_allocator_release(a), MP_EINVAL);
  cr_expect_eq(mp_allocator_free(a, NULL), MP_EINVAL);
}

/* a's pool has three plain segments: the device frees the first and
 * refuses the second, the pool is gone; the next destroy ends a with no
 * second free of anything, and closes dev. */
static void destroy_half_way(mp_device_t *dev, mp_allocator_t *a) {
  fake_dev_t *f = fake_of(dev);
  refuse = 1;
  f->on_free = arm_after_one;
  f->on_free_ctx = f;
  cr_assert_eq(mp_allocator_destroy(a), MP_EDRIVER);
  cr_expect(strstr(mp_last_error(), "lost") != NULL, "%s", mp_last_error());
  only_destroy_is_left(a);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->frees, 2);
  cr_expect_eq(f->nplain, 1); /* the refused segment stays the device's */
  fake_close(dev);
}

Test(pool_destroy_refused, a_child_allocator_whose_parent_stays_names_no_pool) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *parent;
  mp_allocator_t *a = child_allocator(dev, &parent);
  void *p;
  cr_assert_eq(mp_allocator_alloc(a, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_allocator_free(a, p), MP_OK);
  f->refuse_frees = 1;
  cr_assert_eq(mp_allocator_destroy(a), MP_EDRIVER);
  check(parent); /* the parent stays as it was, its child gone */
  cr_expect_eq(stats(parent).allocated_bytes, 0);
  only_destroy_is_left(a);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0);
  cr_expect_eq(f->nplain, 0);
  fake_close(dev);
}

Test(pool_destroy_refused,
     a_child_allocator_whose_parent_went_half_way_frees_nothing_twice) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *parent;
  mp_allocator_t *a = child_allocator(dev, &parent);
  void *p[2]; /* two more segments in the parent */
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc(parent, 4 * MiB, NULL, &p[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(parent).segment_count, 3);
  destroy_half_way(dev, a);
}

Test(pool_destroy_refused,
     a_pool_allocator_whose_pool_went_half_way_frees_nothing_twice) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  void *p[3];
  destroy_half_way(dev, pool_allocator(dev, 3, p));
}

/* A first refusal leaves a "pool" allocator as it was, usable. */
Test(pool_destroy_refused,
     a_pool_allocator_stays_usable_after_a_first_refusal) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  void *p;
  mp_allocator_t *a = pool_allocator(dev, 1, &p);
  f->refuse_frees = 1;
  cr_assert_eq(mp_allocator_destroy(a), MP_EDRIVER);
  cr_assert_not_null(mp_allocator_pool(a));
  check(mp_allocator_pool(a));
  cr_assert_eq(mp_allocator_free(a, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}
