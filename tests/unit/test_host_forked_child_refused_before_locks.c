/* test_host_forked_child_refused_before_locks.c - a child forked from a
 * process using a host device is refused the calls it may not make on the
 * device it inherited (allocations, maps, copies, memsets, host functions,
 * event records and waits: MP_ENODEV, src/device/host.c, host_inherited)
 * before any lock of that device is taken. A thread of the parent that held
 * one at the fork did not come along, so the lock stays held in the child
 * for good: the refusal came only after the device's memory lock (a copy's
 * or memset's range check, an allocation's charge) or its registry lock
 * (queueing on a stream), and the child hung in the call instead.
 *
 * This executable is linked with --wrap for calloc and realloc
 * (tests/CMakeLists.txt), so that a thread of the test stops inside the
 * library's growth of a table, with the lock it is made under held, while
 * the test forks. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);

/* The call that stops: the holder thread's first calloc of k * n bytes
 * (want_k, want_n), or its first realloc (want_realloc). It waits in it
 * (entered posted) until released is posted. */
static pthread_t holder;
static atomic_bool armed;
static bool want_realloc;
static size_t want_k, want_n;
static sem_t entered, released;

static void maybe_stop(bool is_realloc, size_t k, size_t n) {
  if (!atomic_load(&armed) || !pthread_equal(pthread_self(), holder) ||
      is_realloc != want_realloc ||
      (!is_realloc && (k != want_k || n != want_n)))
    return;
  atomic_store(&armed, false);
  sem_post(&entered);
  while (sem_wait(&released) != 0) {
  }
}

void *__wrap_calloc(size_t k, size_t n) {
  maybe_stop(false, k, n);
  return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n) {
  maybe_stop(true, 0, n);
  return __real_realloc(p, n);
}

typedef struct {
  mp_device_t *dev;
  void (*call)(mp_device_t *dev);
} holder_arg_t;

static void *holder_main(void *arg) {
  holder_arg_t *a = arg;
  a->call(a->dev);
  return NULL;
}

/* Starts the holder on call(dev), waits until it stops holding the lock,
 * forks a child that runs in_child(dev) (its exit status: 0 when every
 * call was refused as it should be, else the failing call's number), and
 * lets the holder go. The child hung (SIGALRM) before the fix. */
static void fork_while_held(mp_device_t *dev, void (*call)(mp_device_t *),
                            int (*in_child)(mp_device_t *)) {
  cr_assert_eq(sem_init(&entered, 0, 0), 0);
  cr_assert_eq(sem_init(&released, 0, 0), 0);
  holder_arg_t a = {dev, call};
  atomic_store(&armed, true);
  cr_assert_eq(pthread_create(&holder, NULL, holder_main, &a), 0);
  while (sem_wait(&entered) != 0) {
  }
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    alarm(10);
    _exit(in_child(dev));
  }
  int status = 0;
  pid_t waited = waitpid(child, &status, 0);
  sem_post(&released);
  pthread_join(holder, NULL);
  cr_assert_eq(waited, child);
  cr_expect(!WIFSIGNALED(status), "the child hung in a call (signal %d)",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child's call #%d was not refused with MP_ENODEV",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  sem_destroy(&entered);
  sem_destroy(&released);
}

/* Refused as a forked child's, not answered otherwise. */
static bool refused(mp_status_t st) {
  return st == MP_ENODEV && strstr(mp_last_error(), "forked child") != NULL;
}

static void noop(void *arg) {
  (void)arg;
}

/* ---- the device's memory lock ----------------------------------------- */

/* The device's first allocation grows its table of allocations under the
 * memory lock: the holder stops there. */
static void alloc_first(mp_device_t *dev) {
  void *p = NULL;
  if (mp_device_alloc(dev, 1 << 20, &p) == MP_OK)
    (void)mp_device_free(dev, p);
}

static int child_with_memory_lock_held(mp_device_t *dev) {
  static char a[4096], b[4096];
  void *p = NULL;
  if (!refused(mp_memcpy_async(dev, a, b, sizeof a, NULL)))
    return 1;
  if (!refused(mp_memset_async(dev, a, 0, sizeof a, NULL)))
    return 2;
  if (!refused(mp_device_alloc(dev, 1 << 20, &p)))
    return 3;
  return 0;
}

Test(host_forked_child_refused_before_locks, with_the_memory_lock_held) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  want_realloc = true;
  fork_while_held(dev, alloc_first, child_with_memory_lock_held);
  /* The parent's device is as it was. */
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_memset_async(dev, p, 7, 1 << 20, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(((unsigned char *)p)[(1 << 20) - 1], 7);
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

/* Virtual memory: the first reservation grows the table of reservations
 * under the memory lock. */
static void reserve_first(mp_device_t *dev) {
  void *base = NULL;
  if (mp__device_vm_reserve(dev, 4 << 20, &base) == MP_OK)
    (void)mp__device_vm_release(dev, base, 4 << 20);
}

static void *child_base; /* a reservation of the parent's, in the child */

static int child_maps_with_memory_lock_held(mp_device_t *dev) {
  return refused(mp__device_vm_map(dev, child_base, 2 << 20)) ? 0 : 1;
}

Test(host_forked_child_refused_before_locks, a_map_with_the_memory_lock_held) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  /* A reservation made before (the one the child maps in), and the table
   * full, so that the holder's reservation grows it. */
  void *bases[16];
  for (int i = 0; i < 16; i++)
    cr_assert_eq(mp__device_vm_reserve(dev, 2 << 20, &bases[i]), MP_OK, "%s",
                 mp_last_error());
  child_base = bases[0];
  want_realloc = true;
  fork_while_held(dev, reserve_first, child_maps_with_memory_lock_held);
  cr_assert_eq(mp__device_vm_map(dev, child_base, 2 << 20), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_unmap(dev, child_base, 2 << 20), MP_OK);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(mp__device_vm_release(dev, bases[i], 2 << 20), MP_OK);
  mp_device_close(dev);
}

/* ---- the device's registry lock --------------------------------------- */

/* The device's first event grows the registry of events under the
 * registry's write lock (a table of 64 entries of 32 bytes). */
static void event_first(mp_device_t *dev) {
  mp_event_t e;
  if (mp_event_create(dev, &e) == MP_OK)
    (void)mp_event_destroy(dev, e);
}

static int child_with_registry_held(mp_device_t *dev) {
  static char a[4096], b[4096];
  mp_event_t none = (mp_event_t)(uintptr_t)0x1000; /* no event: refused first */
  if (!refused(mp_stream_launch_host(dev, NULL, noop, NULL)))
    return 1;
  if (!refused(mp_memcpy_async(dev, a, b, sizeof a, NULL)))
    return 2;
  if (!refused(mp_event_record(dev, none, NULL)))
    return 3;
  if (!refused(mp_stream_wait_event(dev, NULL, none)))
    return 4;
  return 0;
}

Test(host_forked_child_refused_before_locks, with_the_registry_held) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  want_realloc = false;
  want_k = 64;
  want_n = 32;
  fork_while_held(dev, event_first, child_with_registry_held);
  mp_event_t e;
  cr_assert_eq(mp_event_create(dev, &e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_record(dev, e, NULL), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_assert_eq(mp_event_destroy(dev, e), MP_OK);
  mp_device_close(dev);
}
