/* mp_pool_check reports a free index node whose link names the node itself
 * (a cycle in a class's treap) as MP_ECORRUPT: neither the in-order walk
 * (which recursed down a left self-link until the stack ran out) nor the
 * search for a free block's node (which went round a self-link on its path
 * for ever) may follow it. White-box: the link is set through
 * pool_internal.h. */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "pool/pool_internal.h"
#include "pool_fakedev.h"

static mp_device_t *dev;
static mp_pool_t *pool;
static mp__block_t *root, *child; /* the two free blocks of one class */

/* Five blocks of one size, the second and fourth freed: two free blocks of
 * one class, live blocks between them, so neither coalesces. */
static void setup(void) {
  dev = fake_open((size_t)1 << 30, 0);
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  void *v[5];
  for (int i = 0; i < 5; i++)
    cr_assert_eq(mp_pool_alloc(pool, 8192, NULL, &v[i]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, v[1]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, v[3]), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  unsigned fl, sl;
  mp__class_of(pool, 8192, &fl, &sl);
  root = pool->bins[fl * MP__SL_COUNT + sl];
  cr_assert_not_null(root);
  child = root->left != NULL ? root->left : root->right;
  cr_assert(child != NULL && child->size == 8192 && root->size == 8192,
            "the class holds both freed blocks");
  /* A check that followed the cycle would never return: ended here
   * instead (the default action of SIGALRM), which fails the test. */
  alarm(60);
}

static void teardown(void) {
  alarm(0);
  mp_pool_destroy(pool);
  fake_close(dev);
}

/* *link pointed at to while the pool is checked, then restored: the check
 * answers MP_ECORRUPT, and MP_OK again once the link is back. */
static void check_with_link(mp__block_t **link, mp__block_t *to,
                            const char *what) {
  mp__block_t *keep = *link;
  *link = to;
  mp_status_t st = mp_pool_check(pool);
  const char *why = mp_last_error();
  *link = keep;
  cr_expect_eq(st, MP_ECORRUPT, "%s went unnoticed", what);
  cr_expect(strstr(why, "pool check"), "%s", why);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, reports_a_left_link_to_the_node_itself, .init = setup,
     .fini = teardown) {
  check_with_link(&root->left, root, "a left link from the root to itself");
  check_with_link(&child->left, child,
                  "a left link from a lower node to itself");
}

Test(pool_check, reports_a_self_link_on_a_free_blocks_search_path,
     .init = setup, .fini = teardown) {
  /* The link toward the other block, pointed back at the root: the search
   * for that block's node meets the root again at each step. */
  check_with_link(root->left == child ? &root->left : &root->right, root,
                  "a self-link on the path to a free block");
}
