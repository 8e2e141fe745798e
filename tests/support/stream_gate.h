/* stream_gate.h - a gate for stream tests: a host function (gate_wait,
 * queued with mp_stream_launch_host) that blocks its stream until the test
 * opens the gate, so that work queued behind it is observably held back and
 * ordering is checked, not assumed. */
#ifndef MEMPOOL_TEST_STREAM_GATE_H
#define MEMPOOL_TEST_STREAM_GATE_H

#include <pthread.h>
#include <stdbool.h>

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

/* Only once nothing can still be waiting on it. */
static inline void gate_destroy(gate_t *g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

#endif /* MEMPOOL_TEST_STREAM_GATE_H */
