/* The host device used from several threads at once: frees that synchronize
 * the device while other threads queue work, streams destroyed while others
 * wait on them. Run under TSan and ASan, these are the race tests. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
typedef struct copier {
  mp_device_t *dev;
  int id;
  int errors, wrong;
} copier_t;

/* Round after round on its own stream: fill a fresh buffer, copy it, check
 * the copy, free both (each free synchronizes the whole device). */
static void *copier_main(void *arg) {
  copier_t *c = arg;
  enum { N = 64 << 10 };
  mp_stream_t s;
  mp_event_t e;
  if (mp_stream_create(c->dev, &s) != MP_OK ||
      mp_event_create(c->dev, &e) != MP_OK) {
    c->errors++;
    return NULL;
  }
  for (int round = 0; round < 40; round++) {
    unsigned char *a = NULL, *b = NULL;
    int v = (c->id * 41 + round) & 0xff;
    if (mp_device_alloc(c->dev, N, (void **)&a) != MP_OK ||
        mp_device_alloc(c->dev, N, (void **)&b) != MP_OK) {
      c->errors++;
      break;
    }
    if (mp_memset_async(c->dev, a, v, N, s) != MP_OK ||
        mp_event_record(c->dev, e, s) != MP_OK ||
        mp_stream_wait_event(c->dev, NULL, e) != MP_OK ||
        mp_memcpy_async(c->dev, b, a, N, NULL) != MP_OK ||
        mp_stream_synchronize(c->dev, NULL) != MP_OK)
      c->errors++;
    if (b[0] != v || b[N - 1] != v)
      c->wrong++;
    if (mp_device_free(c->dev, a) != MP_OK ||
        mp_device_free(c->dev, b) != MP_OK)
      c->errors++;
  }
  if (mp_event_destroy(c->dev, e) != MP_OK ||
      mp_stream_destroy(c->dev, s) != MP_OK)
    c->errors++;
  return NULL;
}

typedef struct churner {
  mp_device_t *dev;
  int errors;
} churner_t;

static void nothing(void *arg) {
  (void)arg;
}

/* Streams and events come and go while the copiers work. */
static void *churner_main(void *arg) {
  churner_t *c = arg;
  for (int i = 0; i < 60; i++) {
    mp_stream_t s;
    mp_event_t e;
    if (mp_stream_create(c->dev, &s) != MP_OK ||
        mp_event_create(c->dev, &e) != MP_OK) {
      c->errors++;
      return NULL;
    }
    if (mp_stream_launch_host(c->dev, s, nothing, NULL) != MP_OK ||
        mp_event_record(c->dev, e, s) != MP_OK ||
        mp_event_destroy(c->dev, e) != MP_OK ||
        mp_stream_destroy(c->dev, s) != MP_OK)
      c->errors++;
  }
  return NULL;
}

Test(device_concurrency, frees_synchronize_while_other_threads_queue_work) {
  mp_device_t *dev = open_dev("host:capacity=256M");
  enum { T = 3 };
  pthread_t th[T + 1];
  copier_t c[T];
  churner_t ch = {.dev = dev};
  for (int i = 0; i < T; i++) {
    c[i] = (copier_t){.dev = dev, .id = i};
    cr_assert_eq(pthread_create(&th[i], NULL, copier_main, &c[i]), 0);
  }
  cr_assert_eq(pthread_create(&th[T], NULL, churner_main, &ch), 0);
  for (int i = 0; i <= T; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) {
    cr_expect_eq(c[i].errors, 0, "copier %d had errors", i);
    cr_expect_eq(c[i].wrong, 0, "copier %d saw wrong data", i);
  }
  cr_expect_eq(ch.errors, 0);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  cr_expect_eq(f, t, "every allocation was freed");
  mp_device_close(dev);
}

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
} gate_t;

static void gate_wait(void *arg) {
  gate_t *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

typedef struct call {
  mp_device_t *dev;
  mp_stream_t s;
  mp_status_t st;
} call_t;

static void *sync_main(void *arg) {
  call_t *c = arg;
  c->st = mp_stream_synchronize(c->dev, c->s);
  return NULL;
}

static void *destroy_main(void *arg) {
  call_t *c = arg;
  c->st = mp_stream_destroy(c->dev, c->s);
  return NULL;
}

Test(device_concurrency, destroy_while_another_thread_synchronizes) {
  mp_device_t *dev = open_dev("host");
  for (int round = 0; round < 10; round++) {
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
    call_t waiter = {dev, s, MP_EDRIVER}, killer = {dev, s, MP_EDRIVER};
    pthread_t tw, tk;
    cr_assert_eq(pthread_create(&tw, NULL, sync_main, &waiter), 0);
    cr_assert_eq(pthread_create(&tk, NULL, destroy_main, &killer), 0);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g.mu);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(tw, NULL);
    pthread_join(tk, NULL);
    /* A destroyed stream's work still runs after the destroy returned (as
     * cuStreamDestroy's): g, on this round's stack, must outlive it. */
    cr_assert_eq(mp_device_synchronize(dev), MP_OK);
    cr_expect_eq(killer.st, MP_OK);
    /* Depending on who came first the stream was still there or gone. */
    cr_expect(waiter.st == MP_OK || waiter.st == MP_EINVAL, "sync: %s",
              mp_status_string(waiter.st));
  }
  mp_device_close(dev);
}
