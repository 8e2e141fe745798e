/* pool_handoff - memory one thread frees, another thread's next allocations:
 * a training step's shape, with the backward pass on a thread of its own
 * (as PyTorch's autograd engine runs it). Each step, thread F (forward)
 * allocates the activations, then thread B (backward) frees them in
 * reverse order, allocating a gradient before each free, and frees the
 * gradients at the end of the step. Peak reserved / peak live for one pool
 * shared by the two threads, without arenas, with arenas=2 (each thread
 * its own arena: without borrowing, B's arena grows to hold everything B
 * allocates while F's arena keeps the activations' memory cached), and
 * with arenas=2,arenas_auto=1 (the threads take turns, never contending:
 * the pool stays solo on F's arena).
 *
 *   bench_pool_handoff [steps=40] [blocks=48] [device=host:capacity=64G]
 *
 * Sizes are log-uniform in [256 KiB, 64 MiB], drawn once (the same plan for
 * every row); the device's pages are never touched. Memory, not time: the
 * figures are the same on a busy machine. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <mempool/mempool.h>

#include "../core/xorshift.h"
#include "args.h"

typedef struct plan {
  size_t steps, blocks;
  size_t *act, *grad; /* per step and block */
} plan_t;

typedef struct run {
  const plan_t *plan;
  mp_pool_t *pool;
  pthread_barrier_t turn;
  void **act, **grad;
  size_t live, peak_live, peak_reserved;
  pthread_mutex_t mu; /* live and the peaks: both threads update them */
  int failed;
} run_t;

static void account(run_t *r, long delta) {
  mp_stats_t st;
  pthread_mutex_lock(&r->mu);
  r->live = (size_t)((long)r->live + delta);
  if (r->live > r->peak_live)
    r->peak_live = r->live;
  if (mp_pool_get_stats(r->pool, &st) == MP_OK &&
      st.reserved_bytes > r->peak_reserved)
    r->peak_reserved = st.reserved_bytes;
  pthread_mutex_unlock(&r->mu);
}

static void take(run_t *r, size_t bytes, void **out) {
  if (mp_pool_alloc(r->pool, bytes, NULL, out) != MP_OK) {
    fprintf(stderr, "pool_handoff: %s\n", mp_last_error());
    pthread_mutex_lock(&r->mu); /* both threads take */
    r->failed = 1;
    pthread_mutex_unlock(&r->mu);
    *out = NULL;
    return;
  }
  account(r, (long)bytes);
}

static void give(run_t *r, void *p, size_t bytes) {
  if (p != NULL && mp_pool_free(r->pool, p) == MP_OK)
    account(r, -(long)bytes);
}

static void *forward(void *arg) {
  run_t *r = arg;
  const plan_t *p = r->plan;
  for (size_t s = 0; s < p->steps; s++) {
    for (size_t i = 0; i < p->blocks; i++)
      take(r, p->act[s * p->blocks + i], &r->act[i]);
    pthread_barrier_wait(&r->turn); /* backward's turn */
    pthread_barrier_wait(&r->turn); /* the step is over */
  }
  return NULL;
}

static void *backward(void *arg) {
  run_t *r = arg;
  const plan_t *p = r->plan;
  for (size_t s = 0; s < p->steps; s++) {
    pthread_barrier_wait(&r->turn);
    for (size_t i = p->blocks; i-- > 0;) {
      take(r, p->grad[s * p->blocks + i], &r->grad[i]);
      give(r, r->act[i], p->act[s * p->blocks + i]);
    }
    for (size_t i = 0; i < p->blocks; i++)
      give(r, r->grad[i], p->grad[s * p->blocks + i]);
    pthread_barrier_wait(&r->turn);
  }
  return NULL;
}

static size_t draw(uint64_t *rng) {
  double lo = log(256.0 * 1024), hi = log(64.0 * 1024 * 1024);
  double u = (double)(xorshift64(rng) >> 11) / (double)(1ull << 53);
  return (size_t)exp(lo + u * (hi - lo));
}

static int run_row(mp_device_t *dev, const plan_t *p, const char *opts) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  mp_pool_t *pool;
  if ((opts[0] != '\0' && mp_pool_config_parse(&cfg, opts) != MP_OK) ||
      mp_pool_create(dev, &cfg, &pool) != MP_OK) {
    fprintf(stderr, "pool_handoff: %s\n", mp_last_error());
    return 1;
  }
  run_t r = {.plan = p, .pool = pool};
  r.act = calloc(p->blocks, sizeof *r.act);
  r.grad = calloc(p->blocks, sizeof *r.grad);
  pthread_mutex_init(&r.mu, NULL);
  pthread_barrier_init(&r.turn, NULL, 2);
  pthread_t f, b;
  pthread_create(&f, NULL, forward, &r);
  pthread_create(&b, NULL, backward, &r);
  pthread_join(f, NULL);
  pthread_join(b, NULL);
  mp_stats_t st;
  mp_pool_get_stats(pool, &st);
  /* A run that could not allocate everything has no figures of the plan:
   * its row says so (it showed a partial run's ratio as the row's). */
  printf("%-22s %12.1f %14.1f %10.3f %8zu%s\n", opts[0] ? opts : "(default)",
         (double)r.peak_live / (1 << 20), (double)r.peak_reserved / (1 << 20),
         r.peak_live ? (double)r.peak_reserved / (double)r.peak_live : 0.0,
         (size_t)st.device_alloc_count, r.failed ? " FAILED" : "");
  pthread_barrier_destroy(&r.turn);
  pthread_mutex_destroy(&r.mu);
  free(r.act);
  free(r.grad);
  mp_pool_destroy(pool);
  return r.failed;
}

int main(int argc, char **argv) {
  uint64_t steps, blocks;
  if (!micro_count(argc, argv, 1, 40, 1, 100000, "steps", &steps) ||
      !micro_count(argc, argv, 2, 48, 1, 100000, "blocks", &blocks)) {
    fprintf(stderr, "usage: bench_pool_handoff [steps] [blocks] [device]\n");
    return 2;
  }
  plan_t p = {(size_t)steps, (size_t)blocks, NULL, NULL};
  const char *spec = argc > 3 ? argv[3] : "host:capacity=64G";
  p.act = malloc(p.steps * p.blocks * sizeof *p.act);
  p.grad = malloc(p.steps * p.blocks * sizeof *p.grad);
  if (p.act == NULL || p.grad == NULL) {
    fprintf(stderr, "pool_handoff: out of host memory for the plan\n");
    return 1;
  }
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < p.steps * p.blocks; i++) {
    p.act[i] = draw(&rng);
    p.grad[i] = draw(&rng);
  }
  mp_device_t *dev;
  if (mp_device_open(spec, &dev) != MP_OK) {
    fprintf(stderr, "pool_handoff: %s\n", mp_last_error());
    return 1;
  }
  printf("%zu steps of %zu activations and %zu gradients, 2 threads\n", p.steps,
         p.blocks, p.blocks);
  printf("%-22s %12s %14s %10s %8s\n", "pool", "peak live MiB",
         "peak reserved MiB", "ratio", "dev allocs");
  int bad = run_row(dev, &p, "") | run_row(dev, &p, "arenas=2") |
            run_row(dev, &p, "arenas=2,arenas_auto=1");
  mp_device_close(dev);
  free(p.act);
  free(p.grad);
  return bad;
}
