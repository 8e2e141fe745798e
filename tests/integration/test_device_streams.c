/* Streams and events of the host device: in-order execution, cross-stream
 * waits, event completion, and handle checks, through the public API. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_gate.h"

/* An append-only log of the order in which host functions ran. */
typedef struct order_log {
  pthread_mutex_t mu;
  int n;
  int items[256];
} order_log_t;

typedef struct entry {
  order_log_t *log;
  int id;
} entry_t;

static void log_append(void *arg) {
  entry_t *e = arg;
  pthread_mutex_lock(&e->log->mu);
  e->log->items[e->log->n++] = e->id;
  pthread_mutex_unlock(&e->log->mu);
}

static int log_count(order_log_t *log) {
  pthread_mutex_lock(&log->mu);
  int n = log->n;
  pthread_mutex_unlock(&log->mu);
  return n;
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void check_in_order(mp_stream_t s_or_null, bool create) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s = s_or_null;
  if (create)
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  order_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
  entry_t e[200];
  for (int i = 0; i < 200; i++) {
    e[i] = (entry_t){.log = &log, .id = i};
    cr_assert_eq(mp_stream_launch_host(dev, s, log_append, &e[i]), MP_OK);
  }
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(log.n, 200);
  for (int i = 0; i < 200; i++)
    cr_expect_eq(log.items[i], i, "item %d ran as %d", log.items[i], i);
  if (create)
    cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}

Test(device_streams, work_on_one_stream_runs_in_order) {
  check_in_order(NULL, true);
}

Test(device_streams, default_stream_runs_in_order) {
  check_in_order(NULL, false);
}

Test(device_streams, copies_see_earlier_work_on_the_stream) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  unsigned char *a, *b;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&a), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&b), MP_OK);
  /* Each step reads what the previous one wrote. */
  for (int round = 1; round <= 20; round++) {
    cr_assert_eq(mp_memset_async(dev, a, round, 4096, s), MP_OK);
    cr_assert_eq(mp_memcpy_async(dev, b, a, 4096, s), MP_OK);
    cr_assert_eq(mp_memcpy_async(dev, a + 1, b, 1, s), MP_OK);
  }
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(b[4095], 20);
  cr_expect_eq(a[1], 20);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev); /* releases a and b */
}

/* A device from spec with one stream and one event on it. */
static mp_device_t *open_with_event(const char *spec, mp_stream_t *s,
                                    mp_event_t *e) {
  mp_device_t *dev = open_dev(spec);
  cr_assert_eq(mp_stream_create(dev, s), MP_OK);
  cr_assert_eq(mp_event_create(dev, e), MP_OK);
  return dev;
}

static void close_with_event(mp_device_t *dev, mp_stream_t s, mp_event_t e) {
  cr_expect_eq(mp_event_destroy(dev, e), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}

Test(device_streams, event_query_is_busy_until_the_stream_reaches_it) {
  mp_stream_t s;
  mp_event_t e;
  mp_device_t *dev = open_with_event("host", &s, &e);
  cr_expect_eq(mp_event_query(dev, e), MP_OK, "never recorded: done");
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  sleep_ms(10);
  cr_expect_eq(mp_event_query(dev, e), MP_EBUSY);
  gate_open(&g);
  cr_expect_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_OK);
  close_with_event(dev, s, e);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* stream_latency_us: an idle stream reaches a record only that long after
 * it was queued; meanwhile the event and the stream are busy, and a
 * synchronize waits for it (not before the latency has passed). "Meanwhile"
 * is told by the clock: a query that returned later than 0.2 s after t0
 * (this thread stalled, on a loaded machine) may find the record done. */
Test(device_streams, stream_latency_keeps_a_record_on_an_idle_stream_pending) {
  mp_stream_t s;
  mp_event_t e;
  mp_device_t *dev = open_with_event("host:stream_latency_us=200000", &s, &e);
  cr_expect_eq(mp_stream_query(dev, s), MP_OK, "nothing queued: idle");
  double t0 = now_s();
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  mp_status_t event_q = mp_event_query(dev, e);
  mp_status_t stream_q = mp_stream_query(dev, s);
  if (now_s() - t0 < 0.2) {
    cr_expect_eq(event_q, MP_EBUSY);
    cr_expect_eq(stream_q, MP_EBUSY);
  }
  cr_expect_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_expect_geq(now_s() - t0, 0.19, "the record ran before its latency");
  cr_expect_eq(mp_event_query(dev, e), MP_OK);
  /* The stream counts the record finished just after the event is done
   * (host device), so its own synchronize comes first. */
  cr_expect_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(mp_stream_query(dev, s), MP_OK);
  close_with_event(dev, s, e);
}

Test(device_streams, re_recording_an_event_re_arms_it) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s;
  mp_event_t e;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_EBUSY);
  gate_open(&g);
  cr_expect_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_OK);
  cr_expect_eq(mp_event_destroy(dev, e), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}

Test(device_streams, cross_stream_wait_enforces_order) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s1, s2;
  mp_event_t e, done2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  cr_assert_eq(mp_event_create(dev, &done2), MP_OK);
  order_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
  entry_t first = {&log, 1}, second = {&log, 2};
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, log_append, &first), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s1), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, s2, e), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s2, log_append, &second), MP_OK);
  cr_assert_eq(mp_event_record(dev, done2, s2), MP_OK);
  sleep_ms(20);
  cr_expect_eq(log_count(&log), 0, "s2 ran past its wait");
  cr_expect_eq(mp_event_query(dev, done2), MP_EBUSY);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(log.n, 2);
  cr_expect_eq(log.items[0], 1);
  cr_expect_eq(log.items[1], 2);
  mp_event_destroy(dev, e);
  mp_event_destroy(dev, done2);
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
}

Test(device_streams, wait_refers_to_the_record_current_at_the_wait) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s1, s2, s3;
  mp_event_t e;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s3), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  order_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
  entry_t on_s1 = {&log, 1}, on_s3 = {&log, 3};
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, log_append, &on_s1), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s1), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, s3, e), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s3, log_append, &on_s3), MP_OK);
  /* A later record on an idle stream completes at once; the earlier wait
   * must still hold s3 until s1 gets there. */
  cr_assert_eq(mp_event_record(dev, e, s2), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_expect_eq(mp_event_query(dev, e), MP_OK, "latest record is done");
  sleep_ms(20);
  cr_expect_eq(log_count(&log), 0, "s3 ran past its wait");
  gate_open(&g);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(log.n, 2);
  cr_expect_eq(log.items[0], 1);
  cr_expect_eq(log.items[1], 3);
  mp_device_close(dev); /* also destroys the streams and the event */
}

Test(device_streams, wait_on_a_never_recorded_event_does_not_block) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s;
  mp_event_t e;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, s, e), MP_OK);
  cr_expect_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(mp_event_synchronize(dev, e), MP_OK);
  mp_device_close(dev);
}

static void slow_increment(void *arg) {
  sleep_ms(2);
  atomic_fetch_add((atomic_int *)arg, 1);
}

Test(device_streams, synchronize_waits_for_queued_work) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s[3];
  atomic_int count = 0;
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(mp_stream_launch_host(dev, s[0], slow_increment, &count),
                 MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s[0]), MP_OK);
  cr_expect_eq(atomic_load(&count), 5);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++)
      cr_assert_eq(mp_stream_launch_host(dev, s[i], slow_increment, &count),
                   MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, NULL, slow_increment, &count), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(atomic_load(&count), 5 + 12 + 1);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_launch_host(dev, s[i], slow_increment, &count),
                 MP_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  /* Destroy returns at once (cuda.h, cuStreamDestroy); the queued work
   * still runs, and a device synchronize waits for it. */
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(atomic_load(&count), 5 + 12 + 1 + 3,
               "a destroyed stream's queued work did not run");
  mp_device_close(dev);
}

Test(device_streams, foreign_and_stale_handles_are_einval) {
  mp_device_t *a = open_dev("host"), *b = open_dev("host");
  mp_stream_t sa, sb, gone;
  mp_event_t ea, eb, egone;
  cr_assert_eq(mp_stream_create(a, &sa), MP_OK);
  cr_assert_eq(mp_stream_create(b, &sb), MP_OK);
  cr_assert_eq(mp_stream_create(a, &gone), MP_OK);
  cr_assert_eq(mp_stream_destroy(a, gone), MP_OK);
  cr_assert_eq(mp_event_create(a, &ea), MP_OK);
  cr_assert_eq(mp_event_create(b, &eb), MP_OK);
  cr_assert_eq(mp_event_create(a, &egone), MP_OK);
  cr_assert_eq(mp_event_destroy(a, egone), MP_OK);
  char buf[16];
  int x = 0;
  cr_expect_eq(mp_stream_synchronize(a, sb), MP_EINVAL);
  cr_expect_eq(mp_stream_synchronize(a, gone), MP_EINVAL);
  /* The message names the call that was made (query named synchronize). */
  cr_expect_eq(mp_stream_query(a, gone), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "mp_stream_query") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_stream_destroy(a, sb), MP_EINVAL);
  cr_expect_eq(mp_stream_destroy(a, gone), MP_EINVAL);
  cr_expect_eq(mp_memset_async(a, buf, 0, sizeof buf, sb), MP_EINVAL);
  cr_expect_eq(mp_memcpy_async(a, buf, buf + 8, 8, gone), MP_EINVAL);
  cr_expect_eq(mp_stream_launch_host(a, sb, slow_increment, &x), MP_EINVAL);
  cr_expect_eq(mp_event_record(a, eb, sa), MP_EINVAL);
  cr_expect_eq(mp_event_record(a, ea, sb), MP_EINVAL);
  cr_expect_eq(mp_event_record(a, egone, sa), MP_EINVAL);
  cr_expect_eq(mp_event_query(a, eb), MP_EINVAL);
  cr_expect_eq(mp_event_query(a, egone), MP_EINVAL);
  cr_expect_eq(mp_event_synchronize(a, eb), MP_EINVAL);
  cr_expect_eq(mp_event_destroy(a, eb), MP_EINVAL);
  cr_expect_eq(mp_event_destroy(a, egone), MP_EINVAL);
  cr_expect_eq(mp_stream_wait_event(a, sa, eb), MP_EINVAL);
  cr_expect_eq(mp_stream_wait_event(a, sb, ea), MP_EINVAL);
  cr_expect_eq(mp_stream_destroy(a, NULL), MP_EINVAL);
  cr_expect_eq(mp_device_synchronize(a), MP_OK);
  cr_expect_eq(x, 0, "nothing ran from a rejected call");
  mp_device_close(a);
  mp_device_close(b);
}

Test(device_streams, destroying_an_event_with_a_record_queued_is_safe) {
  mp_device_t *dev = open_dev("host");
  mp_stream_t s, t;
  mp_event_t e;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &t), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, t, e), MP_OK);
  cr_assert_eq(mp_event_destroy(dev, e), MP_OK);
  gate_open(&g);
  cr_expect_eq(mp_device_synchronize(dev), MP_OK);
  mp_device_close(dev);
}

typedef struct worker {
  mp_device_t *dev;
  atomic_int *count;
  int errors;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  mp_stream_t s;
  mp_event_t e;
  if (mp_stream_create(w->dev, &s) != MP_OK ||
      mp_event_create(w->dev, &e) != MP_OK) {
    w->errors++;
    return NULL;
  }
  for (int i = 0; i < 100; i++) {
    if (mp_stream_launch_host(w->dev, s, slow_increment, w->count) != MP_OK ||
        mp_event_record(w->dev, e, s) != MP_OK ||
        mp_stream_wait_event(w->dev, NULL, e) != MP_OK)
      w->errors++;
    if (i % 10 == 0 && mp_event_synchronize(w->dev, e) != MP_OK)
      w->errors++;
  }
  if (mp_stream_destroy(w->dev, s) != MP_OK ||
      mp_event_destroy(w->dev, e) != MP_OK)
    w->errors++;
  return NULL;
}

Test(device_streams, many_threads_use_their_own_streams) {
  mp_device_t *dev = open_dev("host");
  atomic_int count = 0;
  enum { T = 4 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){.dev = dev, .count = &count};
    cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(w[i].errors, 0);
  }
  cr_expect_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(atomic_load(&count), T * 100);
  mp_device_close(dev);
}

/* What a host function saw when it called back into its own device. */
typedef struct reentry {
  mp_device_t *dev;
  mp_stream_t own;
  mp_event_t ev;
  mp_status_t sync_device, sync_own, sync_event, destroy_own;
  char why[256];
} reentry_t;

static void call_back_into_the_device(void *arg) {
  reentry_t *r = arg;
  r->sync_device = mp_device_synchronize(r->dev);
  snprintf(r->why, sizeof r->why, "%s", mp_last_error());
  r->sync_own = mp_stream_synchronize(r->dev, r->own);
  r->sync_event = mp_event_synchronize(r->dev, r->ev);
  r->destroy_own = mp_stream_destroy(r->dev, r->own);
}

/* Such a call would wait for the host function's own stream, which cannot
 * move on until the function returns: it is refused instead of hanging. */
Test(device_streams, host_function_waiting_on_its_device_is_einval) {
  mp_device_t *dev = open_dev("host");
  reentry_t r = {.dev = dev};
  cr_assert_eq(mp_stream_create(dev, &r.own), MP_OK);
  cr_assert_eq(mp_event_create(dev, &r.ev), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, r.own, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, r.ev, r.own), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, r.own, call_back_into_the_device, &r),
               MP_OK);
  cr_assert_eq(mp_event_record(dev, r.ev, r.own), MP_OK);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, r.own), MP_OK);
  cr_expect_eq(r.sync_device, MP_EINVAL);
  cr_expect(strstr(r.why, "host function") != NULL, "%s", r.why);
  cr_expect_eq(r.sync_own, MP_EINVAL);
  cr_expect_eq(r.sync_event, MP_EINVAL);
  cr_expect_eq(r.destroy_own, MP_EINVAL);
  /* Nothing was changed: the stream and the event still work. */
  cr_expect_eq(mp_event_query(dev, r.ev), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, r.own), MP_OK);
  cr_expect_eq(mp_event_destroy(dev, r.ev), MP_OK);
  gate_destroy(&g);
  mp_device_close(dev);
}
