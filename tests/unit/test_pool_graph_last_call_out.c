/* A released graph pool goes with its last live block, but not while an
 * allocation is still inside it with the lock dropped: the pool's
 * out-of-memory handler, or a growth borrowing from the parent, may
 * release the pool and free that last block meanwhile (an allocation on a
 * pool already released is refused, pool.h). The allocation, the last call out,
 * then finishes the pool: freed under it, it would retake a freed lock (a use
 * after free, which the ASan build reports); skipped, the pool would never be
 * finished and its parent never destroyed. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct inside {
  mp_pool_t *parent, *graph;
  void *x;           /* the graph pool's last live block */
  mp_status_t freed; /* x's free, from inside the allocation */
  size_t lent;       /* the parent's allocated bytes right after it */
  unsigned calls;
} inside_t;

/* Releases the graph pool and frees its last block while the allocation
 * is inside it. */
static void free_last(inside_t *c) {
  c->calls++;
  cr_expect_eq(mp_pool_graph_release(c->graph), MP_OK, "%s", mp_last_error());
  c->freed = mp_pool_free(c->graph, c->x);
  c->lent = stats(c->parent).allocated_bytes;
}

static int free_last_handler(mp_pool_t *pool, size_t bytes, mp_status_t st,
                             void *ctx) {
  (void)pool;
  (void)bytes;
  (void)st;
  free_last(ctx);
  return 1; /* try again: the retry runs in the graph pool too */
}

/* A graph pool with one live block of 1 MiB. */
static void with_one_block(mp_device_t *dev, inside_t *c) {
  *c = (inside_t){.freed = MP_EINVAL};
  c->parent = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_graph_create(c->parent, &c->graph), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(c->graph, MiB, NULL, &c->x), MP_OK, "%s",
               mp_last_error());
  cr_assert_gt(stats(c->parent).allocated_bytes, 0, "x holds the range");
}

static void expect_finished(mp_device_t *dev, inside_t *c) {
  cr_expect_eq(c->calls, 1);
  cr_expect_eq(c->freed, MP_OK, "%s", mp_last_error());
  cr_expect_gt(c->lent, 0,
               "the graph pool went while the allocation was inside it");
  cr_expect_eq(stats(c->parent).allocated_bytes, 0,
               "the last call out did not finish the graph pool");
  cr_assert_eq(mp_pool_check(c->parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(c->parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_graph_last_call_out, the_oom_handler_frees_the_last_block) {
  mp_device_t *dev = fake_open(GiB, 0);
  inside_t c;
  with_one_block(dev, &c);
  cr_assert_eq(mp_pool_set_oom_handler(c.graph, free_last_handler, &c), MP_OK);
  void *big;
  /* The retry the handler asked for is refused: it released the pool. */
  cr_expect_eq(mp_pool_alloc(c.graph, 2 * GiB, NULL, &big), MP_EINVAL);
  expect_finished(dev, &c);
}

/* The device's allocation, which the parent's growth calls while the
 * graph pool's growth is in flight (both locks dropped): frees the graph
 * pool's last block first, as another thread could then; armed, every
 * device allocation fails. */
static inside_t *hooked;
static mp__backend_t hook_backend;

static mp_status_t hook_alloc(mp_device_t *dev, size_t bytes, void **out) {
  inside_t *c = hooked;
  hooked = NULL;
  if (c != NULL)
    free_last(c);
  return fake_alloc(dev, bytes, out);
}

static mp_device_t *hook_open(void) {
  hook_backend = fake_backend;
  hook_backend.alloc = hook_alloc;
  mp_device_t *dev = fake_open(GiB, 0);
  dev->ops = &hook_backend;
  return dev;
}

/* The growth fails after the release: MP_EINVAL naming the release (the
 * ladder stops there, test_pool_graph_parent_handler_release.c), not the
 * device's MP_ENOMEM. */
static void arm(mp_device_t *dev, inside_t *c) {
  hooked = c;
  fake_of(dev)->fail_after = fake_of(dev)->allocs + 1;
}

Test(pool_graph_last_call_out, a_free_during_a_growth_that_then_fails) {
  mp_device_t *dev = hook_open();
  inside_t c;
  with_one_block(dev, &c);
  arm(dev, &c);
  void *big;
  cr_expect_eq(mp_pool_alloc(c.graph, 256 * MiB, NULL, &big), MP_EINVAL);
  expect_finished(dev, &c);
}

Test(pool_graph_last_call_out, a_contiguous_allocation_whose_growth_fails) {
  mp_device_t *dev = hook_open();
  inside_t c;
  with_one_block(dev, &c);
  arm(dev, &c);
  size_t sizes[2] = {128 * MiB, 128 * MiB};
  void *two[2];
  cr_expect_eq(mp_pool_alloc_contiguous(c.graph, 2, sizes, NULL, two),
               MP_EINVAL);
  expect_finished(dev, &c);
}
