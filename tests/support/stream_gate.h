/* stream_gate.h - a gate for stream tests: a host function (gate_wait,
 * queued with mp_stream_launch_host) that blocks its stream until the test
 * opens the gate, so that work queued behind it is observably held back and
 * ordering is checked, not assumed. */
#ifndef MEMPOOL_TEST_STREAM_GATE_H
#define MEMPOOL_TEST_STREAM_GATE_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
} gate_t;

static inline void gate_init(gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = false;
}

/* The host function: returns once the gate is open. */
static inline void gate_wait(void *arg) {
  gate_t *g = (gate_t *)arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static inline void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Opens a gate from a thread of its own after delay_us, so that a call
 * that should not wait for the gated work, but does, comes back (opened
 * tells it waited) instead of hanging the test. */
typedef struct gate_timer {
  gate_t *gate;
  unsigned delay_us;
  atomic_int opened; /* 1: the timer opened the gate */
  pthread_t thread;
} gate_timer_t;

static inline void *gate_timer_main(void *arg) {
  gate_timer_t *t = (gate_timer_t *)arg;
  usleep(t->delay_us);
  atomic_store(&t->opened, 1);
  gate_open(t->gate);
  return NULL;
}

/* 0 when the timer (run by main) runs; join it with gate_timer_join. */
static inline int gate_timer_run(gate_timer_t *t, gate_t *g, unsigned delay_us,
                                 void *(*main)(void *)) {
  t->gate = g;
  t->delay_us = delay_us;
  atomic_init(&t->opened, 0);
  return pthread_create(&t->thread, NULL, main, t);
}

static inline int gate_timer_start(gate_timer_t *t, gate_t *g,
                                   unsigned delay_us) {
  return gate_timer_run(t, g, delay_us, gate_timer_main);
}

static inline void gate_timer_join(gate_timer_t *t) {
  pthread_join(t->thread, NULL);
}

/* A timer that opens the gate after delay_us unless it was opened before
 * (it then ends at once, so joining it never waits out the delay): the
 * stand-in for a thread that would open the gate but is held up, so that
 * a test of such a hang fails instead of hanging. opened: 1 when the
 * deadline opened the gate. Join it with gate_timer_join. */
static inline void *gate_deadline_main(void *arg) {
  gate_timer_t *t = (gate_timer_t *)arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += t->delay_us / 1000000;
  until.tv_nsec += (long)(t->delay_us % 1000000) * 1000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&t->gate->mu);
  while (!t->gate->open)
    if (pthread_cond_timedwait(&t->gate->cv, &t->gate->mu, &until) ==
        ETIMEDOUT) {
      atomic_store(&t->opened, 1);
      t->gate->open = true;
      pthread_cond_broadcast(&t->gate->cv);
    }
  pthread_mutex_unlock(&t->gate->mu);
  return NULL;
}

static inline int gate_deadline_start(gate_timer_t *t, gate_t *g,
                                      unsigned delay_us) {
  return gate_timer_run(t, g, delay_us, gate_deadline_main);
}

/* Only once nothing can still be waiting on it. */
static inline void gate_destroy(gate_t *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

#endif /* MEMPOOL_TEST_STREAM_GATE_H */
