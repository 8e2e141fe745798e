/* test_host_workers.c - mempool's own threads have started when their
 * creator goes on, and the host device's stream workers never call the
 * allocator: what they are done with (queued work, event markers) is freed
 * by the next call that comes by on another thread. A process that forks
 * while a worker is inside malloc keeps the allocator's lock held in the
 * child, where no thread will drop it; glibc's malloc guards against that
 * with fork handlers, GCC 12's AddressSanitizer runtime does not, and a
 * forked child hung at its first allocation (src/device/host.c,
 * host_on_worker).
 *
 * This executable is linked with --wrap for malloc, calloc, realloc and
 * free (tests/CMakeLists.txt), so every call the library makes reaches the
 * counters below; the count of calls from threads other than the test's
 * own must stay 0 while streams run copies, sets, records and waits. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"
#include "mempool/mempool.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

static pthread_t test_thread;
static atomic_bool counting;
static atomic_long foreign_calls, own_calls;

static void seen(void) {
  if (!atomic_load(&counting))
    return;
  if (pthread_equal(pthread_self(), test_thread))
    atomic_fetch_add(&own_calls, 1);
  else
    atomic_fetch_add(&foreign_calls, 1);
}

void *__wrap_malloc(size_t n) {
  seen();
  return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n) {
  seen();
  return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n) {
  seen();
  return __real_realloc(p, n);
}

void __wrap_free(void *p) {
  seen();
  __real_free(p);
}

Test(host_workers, stream_workers_never_call_the_allocator) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s[2];
  mp_event_t ev[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    cr_assert_eq(mp_event_create(dev, &ev[i]), MP_OK);
  }
  void *buf;
  cr_assert_eq(mp_device_alloc(dev, 1 << 16, &buf), MP_OK);
  test_thread = pthread_self();
  atomic_store(&counting, true);
  /* Each stream writes a region of its own: only the records and waits
   * tie the streams together. */
  char *region[3] = {buf, (char *)buf + (1 << 14), (char *)buf + (2 << 14)};
  for (int i = 0; i < 2000; i++) {
    int k = i % 2;
    mp_stream_t a = s[k], b = s[1 - k];
    cr_assert_eq(mp_memset_async(dev, region[k], i & 0xff, 1 << 14, a), MP_OK);
    cr_assert_eq(mp_event_record(dev, ev[0], a), MP_OK);
    cr_assert_eq(mp_stream_wait_event(dev, b, ev[0]), MP_OK);
    /* Recorded again at once: the worker running the first record then
     * drops that marker's last reference. */
    cr_assert_eq(mp_event_record(dev, ev[0], b), MP_OK);
    cr_assert_eq(mp_event_record(dev, ev[1], NULL), MP_OK);
    cr_assert_eq(mp_memcpy_async(dev, region[2], region[2] + 4096, 4096, NULL),
                 MP_OK);
  }
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  atomic_store(&counting, false);
  /* The wrapping works: the calls that queue work allocate it. */
  cr_assert_gt(atomic_load(&own_calls), 0, "no allocation was seen");
  cr_expect_eq(atomic_load(&foreign_calls), 0,
               "stream workers called the allocator %ld times",
               atomic_load(&foreign_calls));
  cr_assert_eq(mp_device_free(dev, buf), MP_OK);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_event_destroy(dev, ev[i]), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  }
  mp_device_close(dev);
}

static atomic_bool release_it;

static void *wait_for_release(void *arg) {
  (void)arg;
  while (!atomic_load(&release_it))
    sched_yield();
  return NULL;
}

/* A thread still starting when its creator forks may hold the allocator's
 * lock (a sanitizer's runtime allocates as a thread starts); mempool's
 * threads are past their start by the time mp__thread_start returns
 * (src/thread.c). */
Test(host_workers, a_thread_is_past_its_start_when_its_start_returns) {
  for (int i = 0; i < 200; i++) {
    atomic_store(&release_it, false);
    unsigned long before = mp__threads_started();
    pthread_t t;
    cr_assert_eq(mp__thread_start(&t, wait_for_release, NULL), 0);
    unsigned long after = mp__threads_started();
    atomic_store(&release_it, true);
    pthread_join(t, NULL);
    cr_assert_eq(after, before + 1, "start %d returned before the thread ran",
                 i);
  }
}

/* Streams that wait on each other's events in a ring, with the host
 * synchronizing on the same events: every stream worker waits on markers
 * while others complete them, all on the device's one marker condition
 * variable, so a lost wake-up would stop the ring. A watchdog turns such a
 * hang into a failure (a run takes about 1.3 s here). */
#define RING   4
#define ROUNDS 20000

typedef struct ring_run {
  mp_device_t *dev;
  mp_stream_t s[RING];
  mp_event_t ev[RING];
  atomic_int rounds;
  atomic_bool done;
} ring_run_t;

static void *ring_main(void *arg) {
  ring_run_t *r = arg;
  for (int k = 0; k < ROUNDS; k++) {
    for (int i = 0; i < RING; i++) {
      if (mp_event_record(r->dev, r->ev[i], r->s[i]) != MP_OK ||
          mp_stream_wait_event(r->dev, r->s[(i + 1) % RING], r->ev[i]) != MP_OK)
        return NULL;
    }
    if (k % 8 == 0 && mp_event_synchronize(r->dev, r->ev[k % RING]) != MP_OK)
      return NULL;
    atomic_store(&r->rounds, k + 1);
  }
  for (int i = 0; i < RING; i++)
    if (mp_stream_synchronize(r->dev, r->s[i]) != MP_OK)
      return NULL;
  atomic_store(&r->done, true);
  return NULL;
}

Test(host_workers, streams_waiting_on_each_others_events_all_finish) {
  ring_run_t r = {0};
  cr_assert_eq(mp_device_open("host:capacity=64M", &r.dev), MP_OK);
  for (int i = 0; i < RING; i++) {
    cr_assert_eq(mp_stream_create(r.dev, &r.s[i]), MP_OK);
    cr_assert_eq(mp_event_create(r.dev, &r.ev[i]), MP_OK);
  }
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, ring_main, &r), 0);
  /* 60 s without a round done is a hang (a run takes well under 10 s). */
  int last = -1;
  for (int idle = 0; !atomic_load(&r.done) && idle < 600;) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int now = atomic_load(&r.rounds);
    idle = now == last ? idle + 1 : 0;
    last = now;
  }
  cr_assert(atomic_load(&r.done),
            "the ring stopped at round %d of %d: a stream worker never woke",
            atomic_load(&r.rounds), ROUNDS);
  pthread_join(t, NULL);
  for (int i = 0; i < RING; i++) {
    cr_assert_eq(mp_event_destroy(r.dev, r.ev[i]), MP_OK);
    cr_assert_eq(mp_stream_destroy(r.dev, r.s[i]), MP_OK);
  }
  mp_device_close(r.dev);
}
