/* test_host_forked_child_asks_without_held_locks.c - a child forked from a
 * process using a host device may still free and ask on the device it
 * inherited (src/device/host.c, host_inherited), but never waits for a
 * lock of that device that a thread of the parent held at the fork: that
 * thread did not come along, so the lock stays held in the child for good.
 * Such a call is refused (MP_ENODEV, HOST_CHILD_NEEDS); the calls that
 * need none of the locks held still answer. Before, a free or a memory
 * query waited for the memory lock, a stream or event query for the
 * registry's, a synchronize for the busy-streams list's or a stream's, an
 * event query for the event lock's, and the child hung.
 *
 * This executable is linked with --wrap for malloc, calloc, realloc and
 * free (tests/CMakeLists.txt), so that a thread of the test stops inside
 * the library's allocator call made under the lock, while the test forks. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

/* Where the stopper thread stops: its first call of kind stop_kind (with
 * stop_bytes bytes, for malloc and calloc's total), once armed. It posts
 * entered there and waits for released. */
typedef enum { AT_MALLOC, AT_CALLOC, AT_REALLOC, AT_FREE } at_t;

static pthread_t stopper;
static atomic_bool armed;
static at_t stop_kind;
static size_t stop_bytes;
static sem_t entered, released;

static void stop_if(at_t kind, size_t bytes) {
  if (!atomic_load(&armed) || !pthread_equal(pthread_self(), stopper) ||
      kind != stop_kind ||
      ((kind == AT_MALLOC || kind == AT_CALLOC) && bytes != stop_bytes))
    return;
  atomic_store(&armed, false);
  sem_post(&entered);
  while (sem_wait(&released) != 0) {
  }
}

void *__wrap_malloc(size_t n) {
  stop_if(AT_MALLOC, n);
  return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n) {
  stop_if(AT_CALLOC, k * n);
  return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n) {
  stop_if(AT_REALLOC, n);
  return __real_realloc(p, n);
}

void __wrap_free(void *p) {
  stop_if(AT_FREE, 0);
  __real_free(p);
}

/* The device and what the parent made on it before the fork. */
typedef struct {
  mp_device_t *dev;
  void *block;        /* a device allocation */
  mp_stream_t stream; /* an idle stream */
  mp_event_t event;   /* recorded, and reached */
} made_t;

static made_t made;

static void (*stopper_call)(void);

static void *stopper_main(void *arg) {
  (void)arg;
  stopper_call();
  return NULL;
}

/* In the child: the number of its first check that failed (0: none). A
 * check that waited for a lock held at the fork never ends instead. */
static int failed;

static void check(int n, bool ok) {
  if (!ok && failed == 0)
    failed = n;
}

/* Refused as a forked child's, not answered otherwise. */
static void check_refused(int n, mp_status_t st) {
  check(n, st == MP_ENODEV && strstr(mp_last_error(), "forked child") != NULL);
}

/* Starts the stopper on call, waits until it stops (holding the lock),
 * runs ready (NULL: nothing) and forks a child that runs in_child: its
 * exit status is 0, or the number of the check that failed. The child hung
 * (SIGALRM) before the fix. Then lets the stopper go and runs after (NULL:
 * nothing) before joining it. */
static void fork_while_stopped(at_t kind, size_t bytes, void (*call)(void),
                               void (*ready)(void), void (*in_child)(void),
                               void (*after)(void)) {
  cr_assert_eq(sem_init(&entered, 0, 0), 0);
  cr_assert_eq(sem_init(&released, 0, 0), 0);
  stop_kind = kind;
  stop_bytes = bytes;
  stopper_call = call;
  atomic_store(&armed, true);
  cr_assert_eq(pthread_create(&stopper, NULL, stopper_main, NULL), 0);
  while (sem_wait(&entered) != 0) {
  }
  if (ready != NULL)
    ready();
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    alarm(10);
    in_child();
    _exit(failed);
  }
  int status = 0;
  pid_t waited = waitpid(child, &status, 0);
  sem_post(&released);
  if (after != NULL)
    after();
  pthread_join(stopper, NULL);
  cr_assert_eq(waited, child);
  bool hung = WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  cr_expect(code == 0, "the child %s (status %#x, check #%d)",
            hung ? "hung in a call" : "failed a check", status, code);
  sem_destroy(&entered);
  sem_destroy(&released);
}

static void make(const char *spec) {
  made.dev = open_dev(spec);
  cr_assert_eq(mp_device_alloc(made.dev, 1 << 20, &made.block), MP_OK);
  cr_assert_eq(mp_stream_create(made.dev, &made.stream), MP_OK);
}

/* What the parent made still works, and goes. */
static void unmake(void) {
  mp_device_t *dev = made.dev;
  cr_assert_eq(mp_memset_async(dev, made.block, 7, 1 << 20, made.stream), MP_OK,
               "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, made.stream), MP_OK);
  cr_expect_eq(((unsigned char *)made.block)[(1 << 20) - 1], 7);
  cr_assert_eq(mp_stream_destroy(dev, made.stream), MP_OK);
  cr_assert_eq(mp_device_free(dev, made.block), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* ---- the memory lock --------------------------------------------------- */

/* Sixteen allocations fill the table of allocations (made.block and
 * these); the next one grows it under the memory lock. */
static void *fill[15];
static void *pinned, *resv, *mapped;

static void alloc_one_more(void) {
  void *p = NULL;
  if (mp_device_alloc(made.dev, 1 << 20, &p) == MP_OK)
    (void)mp_device_free(made.dev, p);
}

static void child_with_memory_lock_held(void) {
  mp_device_t *dev = made.dev;
  size_t f = 0, t = 0;
  check_refused(1, mp_device_free(dev, made.block));
  check_refused(2, mp_device_host_free(dev, pinned));
  check_refused(3, mp_device_mem_info(dev, &f, &t));
  check_refused(4, mp__device_vm_unmap(dev, mapped, 2 << 20));
  check_refused(5, mp__device_vm_release(dev, resv, 4 << 20));
  /* The registry and the streams' locks were free. */
  check(6, mp_stream_query(dev, made.stream) == MP_OK);
  check(7, mp_stream_synchronize(dev, NULL) == MP_OK);
}

Test(host_forked_child_asks_without_held_locks, with_the_memory_lock_held) {
  make("host:capacity=64M");
  for (int i = 0; i < 15; i++)
    cr_assert_eq(mp_device_alloc(made.dev, 4096, &fill[i]), MP_OK);
  cr_assert_eq(mp_device_host_alloc(made.dev, 4096, &pinned), MP_OK);
  cr_assert_eq(mp__device_vm_reserve(made.dev, 4 << 20, &resv), MP_OK);
  mapped = resv;
  cr_assert_eq(mp__device_vm_map(made.dev, mapped, 2 << 20), MP_OK);
  fork_while_stopped(AT_REALLOC, 0, alloc_one_more, NULL,
                     child_with_memory_lock_held, NULL);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_device_mem_info(made.dev, &f, &t), MP_OK);
  cr_assert_eq(mp__device_vm_unmap(made.dev, mapped, 2 << 20), MP_OK);
  cr_assert_eq(mp__device_vm_release(made.dev, resv, 4 << 20), MP_OK);
  cr_assert_eq(mp_device_host_free(made.dev, pinned), MP_OK);
  for (int i = 0; i < 15; i++)
    cr_assert_eq(mp_device_free(made.dev, fill[i]), MP_OK);
  unmake();
}

/* ---- the registry's lock ----------------------------------------------- */

/* The device's first event grows the registry of events under the
 * registry's write lock (a table of 64 entries of 32 bytes). */
static void event_first(void) {
  mp_event_t e;
  if (mp_event_create(made.dev, &e) == MP_OK)
    (void)mp_event_destroy(made.dev, e);
}

static void child_with_registry_held(void) {
  mp_device_t *dev = made.dev;
  mp_event_t none = (mp_event_t)(uintptr_t)0x1000;
  mp_event_t e = NULL;
  check_refused(1, mp_stream_query(dev, made.stream));
  check_refused(2, mp_stream_synchronize(dev, made.stream));
  /* Not known here (the registry cannot say): refused, as unknown. */
  check(3, mp_stream_destroy(dev, made.stream) != MP_OK);
  check_refused(4, mp_event_query(dev, none));
  check_refused(5, mp_event_synchronize(dev, none));
  check_refused(6, mp_event_destroy(dev, none));
  check_refused(7, mp_event_create(dev, &e));
  /* The memory lock and the busy list were free: the child lets go of its
   * view of the block (no stream has work queued). */
  size_t f = 0, t = 0;
  check(8, mp_device_mem_info(dev, &f, &t) == MP_OK);
  check(9, mp_device_free(dev, made.block) == MP_OK);
}

Test(host_forked_child_asks_without_held_locks, with_the_registry_held) {
  make("host:capacity=64M");
  fork_while_stopped(AT_CALLOC, 64 * 32, event_first, NULL,
                     child_with_registry_held, NULL);
  unmake();
}

/* ---- the event lock ---------------------------------------------------- */

/* A destroy lets go of the event's marker under the event lock: the
 * stopper's first free. */
static mp_event_t doomed;

static void destroy_doomed(void) {
  (void)mp_event_destroy(made.dev, doomed);
}

static void child_with_event_lock_held(void) {
  mp_device_t *dev = made.dev;
  check_refused(1, mp_event_query(dev, made.event));
  check_refused(2, mp_event_synchronize(dev, made.event));
  check_refused(3, mp_event_destroy(dev, made.event));
  check(4, mp_stream_query(dev, made.stream) == MP_OK);
}

Test(host_forked_child_asks_without_held_locks, with_the_event_lock_held) {
  make("host:capacity=64M");
  cr_assert_eq(mp_event_create(made.dev, &made.event), MP_OK);
  cr_assert_eq(mp_event_create(made.dev, &doomed), MP_OK);
  cr_assert_eq(mp_event_record(made.dev, made.event, made.stream), MP_OK);
  cr_assert_eq(mp_event_record(made.dev, doomed, made.stream), MP_OK);
  cr_assert_eq(mp_stream_synchronize(made.dev, made.stream), MP_OK);
  fork_while_stopped(AT_FREE, 0, destroy_doomed, NULL,
                     child_with_event_lock_held, NULL);
  cr_assert_eq(mp_event_query(made.dev, made.event), MP_OK);
  cr_assert_eq(mp_event_destroy(made.dev, made.event), MP_OK);
  unmake();
}

/* ---- the busy-streams list's lock and a stream's ----------------------- */

/* More busy streams than a synchronize lists on its stack (32): it
 * allocates the list under the busy list's lock. Those of busy[] run a
 * host function that waits for the gate, made.stream one that waits for
 * last_gate. */
#define BUSY 32
static mp_stream_t busy[BUSY];
static sem_t gate, last_gate;
static atomic_int last_tid; /* the thread of made.stream */

static void wait_gate(void *arg) {
  sem_t *g = arg;
  if (g == &last_gate)
    atomic_store(&last_tid, (int)syscall(SYS_gettid));
  while (sem_wait(g) != 0) {
  }
}

static void sync_device(void) {
  (void)mp_device_synchronize(made.dev);
}

/* The state letter of thread tid of this process ('S': sleeping). */
static char thread_state(int tid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* Lets made.stream's host function return: its thread then leaves the
 * busy list under the stream's mutex, and waits there for the busy list's
 * lock. Waits until it sleeps (on that lock, the only wait on its way)
 * for 100 ms in a row. */
static void finish_last(void) {
  int tid = 0;
  while ((tid = atomic_load(&last_tid)) == 0)
    sched_yield();
  sem_post(&last_gate);
  struct timespec ms = {0, 1000000};
  for (int asleep = 0; asleep < 100;) {
    asleep = thread_state(tid) == 'S' ? asleep + 1 : 0;
    nanosleep(&ms, NULL);
  }
}

static void open_gate(void) {
  for (int i = 0; i < BUSY; i++)
    sem_post(&gate);
}

static void child_with_busy_list_held(void) {
  mp_device_t *dev = made.dev;
  /* made.stream's thread holds the stream's mutex. */
  check_refused(1, mp_stream_query(dev, made.stream));
  check_refused(2, mp_stream_synchronize(dev, made.stream));
  check_refused(3, mp_device_synchronize(dev));
  check_refused(4, mp_device_free(dev, made.block));
  size_t f = 0, t = 0;
  check(5, mp_device_mem_info(dev, &f, &t) == MP_OK);
  check(6, mp_stream_query(dev, NULL) == MP_OK);
}

Test(host_forked_child_asks_without_held_locks,
     with_the_busy_list_and_a_stream_held) {
  make("host:capacity=64M");
  cr_assert_eq(sem_init(&gate, 0, 0), 0);
  cr_assert_eq(sem_init(&last_gate, 0, 0), 0);
  for (int i = 0; i < BUSY; i++) {
    cr_assert_eq(mp_stream_create(made.dev, &busy[i]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(made.dev, busy[i], wait_gate, &gate),
                 MP_OK);
  }
  cr_assert_eq(
      mp_stream_launch_host(made.dev, made.stream, wait_gate, &last_gate),
      MP_OK);
  fork_while_stopped(AT_MALLOC, (BUSY + 1) * sizeof(void *), sync_device,
                     finish_last, child_with_busy_list_held, open_gate);
  cr_assert_eq(mp_device_synchronize(made.dev), MP_OK);
  for (int i = 0; i < BUSY; i++)
    cr_assert_eq(mp_stream_destroy(made.dev, busy[i]), MP_OK);
  sem_destroy(&gate);
  sem_destroy(&last_gate);
  unmake();
}
