/* test_host_forked_child_held_lock_calls_say_why.c - in a child forked
 * while a thread of the parent held a lock of a host device (which stays
 * held in the child for good), the calls that need that lock say so, and
 * those that do not need it do their work (src/device/host.c,
 * host_fork_held):
 *  - the registry's lock: mp_stream_destroy is refused as a forked
 *    child's call (MP_ENODEV), as the other stream calls are there. Failed
 *    before: MP_EINVAL, "was not made by mp_stream_create on this device",
 *    of a stream the parent made there.
 *  - the memory lock: mp_ipc_close of an import still unmaps the child's
 *    view (the table of imports, under that lock, is read by no call of
 *    the child again). Failed before: refused, and the import stayed
 *    mapped in the child for good.
 * The child starts no thread (TSan refuses one after a multi-threaded
 * fork).
 *
 * This executable is linked with --wrap for calloc and realloc
 * (tests/CMakeLists.txt): the parent's "holder" thread stops in the
 * library's first such call made under the lock, while the test forks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "../support/device_helpers.h"
#include "../support/fork_child.h"

void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);

static pthread_t holder;
static atomic_bool holding; /* the holder's next calloc or realloc stops */
static sem_t stopped, go_on;

/* The holder stops here, in the library's call, until go_on. */
static void hold_here(void) {
  if (!atomic_load(&holding) || !pthread_equal(pthread_self(), holder))
    return;
  atomic_store(&holding, false);
  sem_post(&stopped);
  while (sem_wait(&go_on) != 0) {
  }
}

void *__wrap_calloc(size_t k, size_t n) {
  /* Not the event itself, made before the lock is taken: the registry's
   * first table (64 entries of 32 bytes). */
  if (k * n >= 64 * 32)
    hold_here();
  return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n) {
  hold_here();
  return __real_realloc(p, n);
}

static void (*holder_call)(void);

static void *holder_main(void *arg) {
  (void)arg;
  holder_call();
  return NULL;
}

/* Runs call on the holder thread until it stops under the lock, runs
 * in_child in a forked child (fork_child.h), and lets the holder finish. */
static void fork_while_held(void (*call)(void), int (*in_child)(void)) {
  cr_assert_eq(sem_init(&stopped, 0, 0), 0);
  cr_assert_eq(sem_init(&go_on, 0, 0), 0);
  holder_call = call;
  atomic_store(&holding, true);
  cr_assert_eq(pthread_create(&holder, NULL, holder_main, NULL), 0);
  while (sem_wait(&stopped) != 0) {
  }
  expect_child_passes(in_child);
  sem_post(&go_on);
  pthread_join(holder, NULL);
  sem_destroy(&stopped);
  sem_destroy(&go_on);
}

static mp_device_t *dev, *imp;
static mp_stream_t stream;

/* ---- the registry's lock ----------------------------------------------- */

/* The device's first event grows the registry of events under the
 * registry's write lock (calloc). */
static void create_first_event(void) {
  mp_event_t e;
  if (mp_event_create(dev, &e) == MP_OK)
    (void)mp_event_destroy(dev, e);
}

static bool refused_as_forked(mp_status_t st) {
  return st == MP_ENODEV && strstr(mp_last_error(), "forked child") != NULL &&
         strstr(mp_last_error(), "not made by") == NULL;
}

static int child_stream_destroy(void) {
  if (!refused_as_forked(mp_stream_destroy(dev, stream)))
    return 1;
  /* A handle it cannot tell from a stream: refused the same way. */
  if (!refused_as_forked(mp_stream_destroy(dev, (mp_stream_t)&dev)))
    return 2;
  if (!refused_as_forked(mp_stream_query(dev, stream)))
    return 3;
  return 0;
}

Test(host_forked_child_held_lock_calls_say_why,
     stream_destroy_with_the_registry_held_is_refused_as_a_forked_childs) {
  dev = open_dev("host:capacity=64M");
  cr_assert_eq(mp_stream_create(dev, &stream), MP_OK);
  fork_while_held(create_first_event, child_stream_destroy);
  /* The parent's stream is as it was. */
  cr_expect_eq(mp_stream_query(dev, stream), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, stream), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, stream), MP_EINVAL, "destroyed");
  mp_device_close(dev);
}

/* ---- the memory lock --------------------------------------------------- */

#define MiB  ((size_t)1 << 20)
#define FILL 16 /* allocations that fill imp's first table of them */

static void *imported;
static void *fill[FILL];

/* imp's next allocation grows its full table under the memory lock. */
static void alloc_past_the_table(void) {
  void *p = NULL;
  if (mp_device_alloc(imp, 4096, &p) == MP_OK)
    (void)mp_device_free(imp, p);
}

static bool mapped(const void *p) {
  return msync((void *)p, 4096, MS_ASYNC) == 0 || errno != ENOMEM;
}

static int child_ipc_close(void) {
  if (!mapped(imported))
    return 1;
  /* What needs the memory lock is refused. */
  if (!refused_as_forked(mp_device_free(imp, fill[0])))
    return 2;
  if (mp_ipc_close(imp, imported) != MP_OK)
    return 3;
  if (mapped(imported))
    return 4;
  if (mp_ipc_close(imp, imported) != MP_EINVAL)
    return 5; /* closed */
  return 0;
}

Test(host_forked_child_held_lock_calls_say_why,
     ipc_close_with_the_memory_lock_held_unmaps_the_import) {
  dev = open_dev("host:capacity=64M");
  imp = open_dev("host:capacity=64M");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK);
  memset(p, 0x3c, MiB);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_import(imp, &h, &imported), MP_OK, "%s", mp_last_error());
  cr_assert_eq(((unsigned char *)imported)[MiB - 1], 0x3c);
  size_t n = 0;
  for (; n < FILL; n++)
    cr_assert_eq(mp_device_alloc(imp, 4096, &fill[n]), MP_OK);
  fork_while_held(alloc_past_the_table, child_ipc_close);
  /* The parent's import is its own still. */
  cr_expect_eq(((unsigned char *)imported)[0], 0x3c);
  cr_expect_eq(mp_ipc_close(imp, imported), MP_OK, "%s", mp_last_error());
  for (size_t i = 0; i < n; i++)
    cr_expect_eq(mp_device_free(imp, fill[i]), MP_OK);
  cr_expect_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(imp);
  mp_device_close(dev);
}
