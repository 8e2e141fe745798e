/* Child pools: a fixed range of the parent, managed with the same best fit,
 * never growing, given back on destroy. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *parent;

static void setup(void) {
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create(dev, NULL, &parent), MP_OK);
}
static void teardown(void) {
  mp_pool_destroy(parent);
  mp_device_close(dev);
}

Test(pool_child, range_is_allocated_in_parent_and_reserved_in_child,
     .init = setup, .fini = teardown) {
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, 8 * MiB, &child), MP_OK, "%s",
               mp_last_error());
  mp_stats_t ps = stats(parent), cs = stats(child);
  cr_expect_eq(ps.allocated_bytes, 8 * MiB);
  cr_expect_eq(cs.reserved_bytes, 8 * MiB);
  cr_expect_eq(cs.allocated_bytes, 0);
  cr_expect_eq(mp_pool_device(child), dev);
  void *a;
  cr_assert_eq(mp_pool_alloc(child, MiB, NULL, &a), MP_OK);
  cs = stats(child);
  cr_expect_eq(cs.device_alloc_count, 0, "a child makes no device calls");
  cr_expect_eq(cs.allocated_bytes, MiB);
  cr_expect_eq(mp_pool_check(child), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(child, a), MP_OK);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  ps = stats(parent);
  cr_expect_eq(ps.allocated_bytes, 0, "the range went back");
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

Test(pool_child, child_never_grows_and_full_is_elimit, .init = setup,
     .fini = teardown) {
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, 4 * MiB, &child), MP_OK);
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(child, 3 * MiB, NULL, &a), MP_OK);
  cr_expect_eq(mp_pool_alloc(child, 2 * MiB, NULL, &b), MP_ELIMIT);
  cr_expect(strstr(mp_last_error(), "child"), "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(child, MiB, NULL, &b), MP_OK);
  cr_expect_eq(mp_pool_alloc(child, 512, NULL, &c), MP_ELIMIT);
  mp_stats_t cs = stats(child);
  cr_expect_eq(cs.reserved_bytes, 4 * MiB);
  cr_expect_eq(cs.oom_count, 2);
  /* Every block lies inside the range the parent handed out. */
  uintptr_t lo = (uintptr_t)a < (uintptr_t)b ? (uintptr_t)a : (uintptr_t)b;
  uintptr_t hi =
      (uintptr_t)a < (uintptr_t)b ? (uintptr_t)b + MiB : (uintptr_t)a + 3 * MiB;
  cr_expect_eq(hi - lo, 4 * MiB);
  cr_expect_eq(mp_pool_trim(child, 0), MP_OK);
  cr_expect_eq(stats(child).reserved_bytes, 4 * MiB, "trim keeps the range");
  mp_pool_free(child, a);
  mp_pool_free(child, b);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
}

Test(pool_child, parent_with_live_child_refuses_destroy, .init = setup,
     .fini = teardown) {
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, MiB, &child), MP_OK);
  mp_stats_t before = stats(parent);
  cr_expect_eq(mp_pool_destroy(parent), MP_EBUSY);
  mp_stats_t after = stats(parent);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
}

Test(pool_child, child_pointer_freed_through_parent_is_einval, .init = setup,
     .fini = teardown) {
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, 2 * MiB, &child), MP_OK);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(child, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(child, 4096, NULL, &b), MP_OK);
  cr_expect_eq(mp_pool_free(parent, a), MP_EINVAL, "the range's base");
  cr_expect_eq(mp_pool_free(parent, b), MP_EINVAL, "inside the range");
  cr_expect_eq(mp_pool_free(child, a), MP_OK);
  cr_expect_eq(mp_pool_free(child, b), MP_OK);
  void *pa;
  cr_assert_eq(mp_pool_alloc(parent, 4096, NULL, &pa), MP_OK);
  cr_expect_eq(mp_pool_free(child, pa), MP_EINVAL, "parent's block");
  mp_pool_free(parent, pa);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
}

Test(pool_child, children_can_have_children, .init = setup, .fini = teardown) {
  mp_pool_t *child, *grand;
  cr_assert_eq(mp_pool_create_child(parent, 8 * MiB, &child), MP_OK);
  cr_assert_eq(mp_pool_create_child(child, 2 * MiB, &grand), MP_OK);
  cr_expect_eq(stats(child).allocated_bytes, 2 * MiB);
  cr_expect_eq(mp_pool_destroy(child), MP_EBUSY);
  void *a;
  cr_assert_eq(mp_pool_alloc(grand, 2 * MiB, NULL, &a), MP_OK);
  cr_expect_eq(mp_pool_alloc(grand, 512, NULL, &a), MP_ELIMIT);
  cr_expect_eq(mp_pool_destroy(grand), MP_OK);
  cr_expect_eq(stats(child).allocated_bytes, 0);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

Test(pool_child, child_larger_than_the_parent_can_hold_fails_cleanly,
     .init = setup, .fini = teardown) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.max_bytes = 16 * MiB;
  mp_pool_t *capped, *child = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &capped), MP_OK);
  cr_expect_eq(mp_pool_create_child(capped, 32 * MiB, &child), MP_ELIMIT);
  cr_expect_null(child);
  cr_expect_eq(mp_pool_destroy(capped), MP_OK, "no child was left behind");
}

/* max_split keeps big free blocks of a growing pool whole; a child's range
 * is fixed, so the limit must not stop it from carving small blocks. */
Test(pool_child, child_of_a_pool_with_max_split_serves_small_blocks) {
  mp_device_t *d;
  cr_assert_eq(mp_device_open("host", &d), MP_OK, "%s", mp_last_error());
  const char *opts[] = {"max_split=1M", "max_split=1M,virtual=0"};
  for (int i = 0; i < 2; i++) {
    mp_pool_t *p = make_pool(d, opts[i]), *child;
    cr_assert_eq(mp_pool_create_child(p, 8 * MiB, &child), MP_OK, "%s",
                 mp_last_error());
    void *a, *b;
    cr_expect_eq(mp_pool_alloc(child, 4096, NULL, &a), MP_OK, "%s: %s", opts[i],
                 mp_last_error());
    cr_expect_eq(mp_pool_alloc(child, 3 * MiB, NULL, &b), MP_OK, "%s: %s",
                 opts[i], mp_last_error());
    check(child);
    cr_expect_eq(mp_pool_destroy(child), MP_OK);
    check(p);
    cr_expect_eq(mp_pool_destroy(p), MP_OK);
  }
  mp_device_close(d);
}

static void *open_gate_later(void *arg) {
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  gate_open((gate_t *)arg);
  return NULL;
}

static bool gate_is_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  bool o = g->open;
  pthread_mutex_unlock(&g->mu);
  return o;
}

static bool overlaps(const void *a, const void *b, size_t n) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + n && y < x + n;
}

/* The parent takes a child's range on the NULL stream, so it may hand over
 * a block freed there whose work is still running. The child must not give
 * that memory to another stream before the work is done (the host
 * device's NULL stream orders no other stream, as with
 * cudaStreamNonBlocking streams): here the child's only block is that one,
 * so the allocation on s waits for the work (the out-of-memory ladder's
 * synchronization) instead of handing it out at once. */
Test(pool_child, range_is_not_used_on_another_stream_before_the_parents_work,
     .init = setup, .fini = teardown) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  gate_t gate;
  gate_init(&gate);
  void *a;
  cr_assert_eq(mp_pool_alloc(parent, 8 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, NULL, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, 8 * MiB, &child), MP_OK, "%s",
               mp_last_error());
  pthread_t opener;
  cr_assert_eq(pthread_create(&opener, NULL, open_gate_later, &gate), 0);
  void *c;
  cr_assert_eq(mp_pool_alloc(child, 8 * MiB, s, &c), MP_OK, "%s",
               mp_last_error());
  bool open = gate_is_open(&gate);
  cr_expect(!overlaps(a, c, 8 * MiB) || open,
            "the child gave another stream memory whose work on the NULL "
            "stream was still running");
  pthread_join(opener, NULL);
  cr_expect_eq(mp_pool_free(child, c), MP_OK);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  check(parent);
}

/* Where the parent's stream is idle the range serves another stream at
 * once: no synchronization, no out-of-memory rung. */
Test(pool_child, range_serves_another_stream_at_once_when_the_parent_is_idle,
     .init = setup, .fini = teardown) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a, *c;
  cr_assert_eq(mp_pool_alloc(parent, 8 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  mp_pool_t *child;
  cr_assert_eq(mp_pool_create_child(parent, 8 * MiB, &child), MP_OK);
  cr_assert_eq(mp_pool_alloc(child, 8 * MiB, s, &c), MP_OK, "%s",
               mp_last_error());
  mp_stats_t cs = stats(child);
  cr_expect_eq(cs.alloc_retry_count, 0, "the ladder ran");
  cr_expect_eq(cs.oom_count, 0);
  cr_expect_eq(mp_pool_free(child, c), MP_OK);
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
}
