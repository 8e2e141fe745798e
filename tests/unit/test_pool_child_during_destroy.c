/* test_pool_child_during_destroy.c - mp_pool_create_child while
 * mp_pool_destroy of its parent is under way. Destroy asks the children
 * under the pool's lock (refusing while one lives), seals the pool
 * (export_sealed) and then drops the lock to free its first plain segment
 * (mp__plain_release_first) before it frees the rest. A child made there
 * took a range of memory the destroy then freed, with the parent, under
 * the child. It must be refused (MP_EBUSY), and the destroy succeed. With
 * arenas the range would come from the calling thread's arena, sealed
 * there too. White-box: the host device's free runs the child's creation
 * first, as another thread would there (the pool's lock is not held).
 * Failed before: the child was made (MP_OK), with a range the destroy
 * then freed, and its parent with it. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static const mp__backend_t *host_ops;
static mp__backend_t ops; /* host_ops' with free hooked */
static mp_pool_t *the_pool;
static bool armed; /* the next device free makes a child first */
static mp_status_t child_st = MP_EINVAL;
static mp_pool_t *child;
static char child_why[256];

static mp_status_t free_making_child(mp_device_t *dev, void *ptr) {
  if (armed) {
    armed = false;
    child_st = mp_pool_create_child(the_pool, 1 * MiB, &child);
    snprintf(child_why, sizeof child_why, "%s", mp_last_error());
  }
  return host_ops->free(dev, ptr);
}

/* the_pool (opts) on a host device whose frees run free_making_child,
 * with two plain segments cached (two 8 MiB blocks, freed). */
static mp_device_t *open_cached(const char *opts) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open("host:capacity=64M", &dev);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  ops = *(host_ops = dev->ops);
  ops.free = free_making_child;
  dev->ops = &ops;
  the_pool = make_pool(dev, opts);
  void *p[2] = {NULL, NULL};
  for (int i = 0; i < 4; i++) {
    st = i < 2 ? mp_pool_alloc(the_pool, 8 * MiB, NULL, &p[i])
               : mp_pool_free(the_pool, p[i - 2]);
    cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  }
  return dev;
}

static void destroy_making_child(const char *opts) {
  mp_device_t *dev = open_cached(opts);
  armed = true;
  mp_status_t st = mp_pool_destroy(the_pool);
  cr_assert(!armed, "the destroy freed no plain segment");
  /* Made, the child's range and parent are gone: nothing more is asked
   * of it (the test has failed). */
  cr_expect_eq(child_st, MP_EBUSY,
               "a child made while its parent's destroy frees the memory "
               "(status %d: %s)",
               child_st, child_st == MP_OK ? "made" : child_why);
  cr_expect_neq(strstr(child_why, "being destroyed"), NULL, "%s", child_why);
  cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}

Test(pool_child_during_destroy, a_child_made_while_destroy_frees_is_refused) {
  destroy_making_child("virtual=0");
}

Test(pool_child_during_destroy, a_child_from_an_arena_being_freed_is_refused) {
  destroy_making_child("arenas=2,virtual=0");
}
