/* Destroying a host device stream with work queued returns at once, as
 * cuda.h says of cuStreamDestroy ("in case the device is still doing work
 * in the stream hStream when cuStreamDestroy() is called, the function
 * will return immediately and the resources associated with hStream will
 * be released automatically once the device has completed all work in
 * hStream"); the work still runs, events recorded before the destroy
 * complete, and a device synchronize and close wait for it. The host
 * device used to wait for the stream's work in mp_stream_destroy, which
 * hid any caller that took a destroyed stream's work for done. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "../support/device_helpers.h"

#define KiB ((size_t)1 << 10)

/* A host function that holds its stream until opened, or 30 s at most (a
 * stall of the test's thread on a loaded machine must not open it: 2 s
 * did, a destroy then seemed to have waited). */
typedef struct slow_gate {
  atomic_bool open, ran, timed_out;
} slow_gate_t;

static void slow_gate_wait(void *arg) {
  slow_gate_t *g = arg;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!atomic_load(&g->open)) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 30) {
      atomic_store(&g->timed_out, true);
      break;
    }
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  atomic_store(&g->ran, true);
}

/* A host function that takes 50 ms, then says it ran. */
static void slow_work(void *arg) {
  struct timespec nap = {0, 50000000};
  nanosleep(&nap, NULL);
  atomic_store((atomic_bool *)arg, true);
}

Test(host_stream_destroy, returns_at_once_and_the_work_still_runs) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *m = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&m), MP_OK);
  memset(m, 0, 64 * KiB);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  slow_gate_t g = {0};
  cr_assert_eq(mp_stream_launch_host(dev, s, slow_gate_wait, &g), MP_OK);
  cr_assert_eq(mp_memset_async(dev, m, 0x3c, 64 * KiB, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_expect_not(atomic_load(&g.ran), "destroy waited for the stream's work");
  /* The handle is dead at once. */
  cr_expect_eq(mp_stream_query(dev, s), MP_EINVAL);
  cr_expect_eq(mp_memset_async(dev, m, 0, 64 * KiB, s), MP_EINVAL);
  atomic_store(&g.open, true);
  /* The queued work still runs; a device synchronize waits for it. */
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect(atomic_load(&g.ran));
  cr_expect_not(atomic_load(&g.timed_out), "the gate was never opened");
  cr_expect_eq(m[0], 0x3c);
  cr_expect_eq(m[64 * KiB - 1], 0x3c);
  cr_expect_eq(mp_device_free(dev, m), MP_OK);
  mp_device_close(dev);
}

/* An event recorded on the stream before the destroy is still pending
 * after it, and completes when the stream's work does. */
Test(host_stream_destroy, events_recorded_before_the_destroy_complete) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  mp_stream_t s;
  mp_event_t e;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  slow_gate_t g = {0};
  cr_assert_eq(mp_stream_launch_host(dev, s, slow_gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_EBUSY,
               "destroy waited for the stream's work");
  atomic_store(&g.open, true);
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_OK);
  cr_expect(atomic_load(&g.ran));
  cr_expect_not(atomic_load(&g.timed_out), "the gate was never opened");
  cr_expect_eq(mp_event_destroy(dev, e), MP_OK);
  mp_device_close(dev);
}

/* Close waits for destroyed streams' queued work before the memory it
 * uses goes: the memsets (each stream its own slice) land, no fault, and
 * the slow work has run when close returns. Streams destroyed idle and
 * busy are mixed. */
Test(host_stream_destroy, close_waits_for_destroyed_streams_work) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *m = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&m), MP_OK);
  atomic_bool ran[4] = {false, false, false, false};
  for (int i = 0; i < 8; i++) {
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
    if (i % 2 == 0)
      cr_assert_eq(mp_stream_launch_host(dev, s, slow_work, &ran[i / 2]),
                   MP_OK);
    cr_assert_eq(mp_memset_async(dev, m + i * 8 * KiB, i, 8 * KiB, s), MP_OK);
    if (i % 2 == 1)
      cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  }
  mp_device_close(dev);
  for (int i = 0; i < 4; i++)
    cr_expect(atomic_load(&ran[i]), "close did not wait for stream %d's work",
              2 * i);
}

/* Streams destroyed with work queued, again and again, are freed as they
 * finish (the next create or destroy reaps them), the device goes on
 * serving new ones, and every stream's work (a memset of its own slice)
 * lands. */
Test(host_stream_destroy, many_busy_destroys_in_a_row) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *m = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&m), MP_OK);
  for (int i = 0; i < 200; i++) {
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_memset_async(dev, m + i * 256, i + 1, 256, s), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
    if (i % 50 == 49)
      cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  }
  for (int i = 0; i < 200; i++)
    cr_expect_eq(m[i * 256 + 255], i + 1, "stream %d's memset", i);
  cr_expect_eq(mp_device_free(dev, m), MP_OK);
  mp_device_close(dev);
}

/* The threads of this process now. */
static int thread_count(void) {
  DIR *d = opendir("/proc/self/task");
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Waits (30 s at most) until the process has n threads; returns the last
 * count. A joined thread can stay listed in /proc/self/task a moment after
 * pthread_join returns: the kernel wakes the joiner when it clears the
 * thread's tid (do_exit, exit_mm) and unlists the thread later
 * (exit_notify), so a count right after a join is one too many now and
 * then on a loaded machine. Whether the library joined is told by
 * `exited` below, not by the count. */
static int thread_count_settles_to(int n) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int got;
  while ((got = thread_count()) != n) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 30)
      break;
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  return got;
}

/* A thread-exit destructor that takes 100 ms: set from a host function, it
 * runs on the stream's worker after the worker has handed its stream in
 * and is leaving, which is the window a detached worker left open. exited:
 * it has run to its end, which a call that joined the worker waited for. */
static pthread_key_t slow_exit_key;
static atomic_bool exiting, exited;

static void slow_exit(void *arg) {
  (void)arg;
  atomic_store(&exiting, true);
  struct timespec nap = {0, 100000000};
  nanosleep(&nap, NULL);
  atomic_store(&exited, true);
}

static void set_slow_exit(void *arg) {
  pthread_setspecific(slow_exit_key, arg);
}

/* Makes a stream, queues g's gate and then the slow thread exit on it,
 * and destroys it: its worker is orphaned, held until g opens. */
static void destroy_held_stream(mp_device_t *dev, slow_gate_t *g) {
  static int mark;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, slow_gate_wait, g), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, set_slow_exit, &mark), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

/* A stream destroyed with work queued leaves no thread behind once its
 * device is closed (the Python binding's dropped-device test saw one, now
 * and then): close joins the orphaned worker rather than only waiting for
 * it to hand its stream in. */
Test(host_stream_destroy, close_leaves_no_worker_thread) {
  cr_assert_eq(pthread_key_create(&slow_exit_key, slow_exit), 0);
  int before = thread_count();
  mp_device_t *dev = open_dev("host:capacity=16M");
  slow_gate_t g = {0};
  destroy_held_stream(dev, &g);
  cr_expect_gt(thread_count(), before);
  atomic_store(&g.open, true);
  mp_device_close(dev);
  cr_expect(atomic_load(&exited),
            "close returned while a worker of the device was still leaving");
  cr_expect_eq(thread_count_settles_to(before), before,
               "a worker of the closed device is still running");
}

/* The next stream create joins a worker that finished its destroyed
 * stream's work: only the default stream's and the new stream's workers
 * are left. */
Test(host_stream_destroy, create_joins_a_finished_orphaned_worker) {
  cr_assert_eq(pthread_key_create(&slow_exit_key, slow_exit), 0);
  int before = thread_count();
  mp_device_t *dev = open_dev("host:capacity=16M");
  int with_device = thread_count();
  mp_stream_t s2;
  slow_gate_t g = {0};
  destroy_held_stream(dev, &g);
  atomic_store(&g.open, true);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  /* Its worker has handed the stream in once its exit has begun (30 s at
   * most: 2 s was short for a loaded machine). */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!atomic_load(&exiting)) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 30)
      break;
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  cr_assert(atomic_load(&exiting), "the orphaned worker never left");
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
  cr_expect(atomic_load(&exited),
            "the create did not join the finished orphaned worker");
  cr_expect_eq(thread_count_settles_to(with_device + 1), with_device + 1);
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK);
  mp_device_close(dev);
  cr_expect_eq(thread_count_settles_to(before), before);
}
