/* Many threads on one pool: allocs, frees, contiguous allocs, record_stream
 * and trims race; contents stay intact and the invariants hold (run under
 * TSan in CI). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "../../bench/core/xorshift.h"
#include <mempool/mempool.h>

enum { THREADS = 4, OPS = 20000, LIVE = 64 };

static mp_device_t *dev;
static mp_pool_t *pool;
static mp_stream_t streams[THREADS];

typedef struct worker {
  int id;
  int failures;
} worker_t;

static void *work(void *arg) {
  worker_t *w = arg;
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
  void *live[LIVE] = {0};
  uint64_t tags[LIVE] = {0};
  for (int op = 0; op < OPS; op++) {
    xorshift64(&s);
    int slot = (int)(s % LIVE);
    mp_stream_t st = streams[(s >> 8) % THREADS];
    if (live[slot] != NULL) {
      if (*(uint64_t *)live[slot] != tags[slot])
        w->failures++;
      if ((s >> 20) % 5 == 0)
        mp_pool_record_stream(pool, live[slot], st);
      if (mp_pool_free(pool, live[slot]) != MP_OK)
        w->failures++;
      live[slot] = NULL;
    } else {
      size_t bytes = 8 + (size_t)((s >> 24) % (1u << (4 + (s >> 40) % 17)));
      if (mp_pool_alloc(pool, bytes, streams[w->id], &live[slot]) != MP_OK) {
        w->failures++;
        continue;
      }
      tags[slot] = s | 1;
      *(uint64_t *)live[slot] = tags[slot];
    }
    if (op % 5000 == 4999)
      mp_pool_trim(pool, (size_t)16 << 20);
  }
  for (int i = 0; i < LIVE; i++)
    if (live[i] != NULL) {
      if (*(uint64_t *)live[i] != tags[i])
        w->failures++;
      mp_pool_free(pool, live[i]);
    }
  return NULL;
}

/* Runs THREADS workers on a pool made on spec with cfg (NULL: defaults);
 * thread 0 runs first_worker. Afterwards nothing is live, the invariants
 * hold and trim gives every byte back. */
static void run_with(const char *spec, const mp_pool_config_t *cfg,
                     void *(*first_worker)(void *)) {
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create(dev, cfg, &pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(mp_stream_create(dev, &streams[i]), MP_OK);
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){i, 0};
    pthread_create(&t[i], NULL, i == 0 ? first_worker : work, &w[i]);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(w[i].failures, 0, "thread %d saw %d failures", i,
                 w[i].failures);
  }
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stats_t st;
  mp_pool_get_stats(pool, &st);
  cr_expect_eq(st.allocated_bytes, 0);
  cr_expect_eq(st.live_blocks, 0);
  cr_expect_eq(st.alloc_count, st.free_count);
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK);
  mp_pool_get_stats(pool, &st);
  cr_expect_eq(st.reserved_bytes, 0);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  for (int i = 0; i < THREADS; i++)
    mp_stream_destroy(dev, streams[i]);
  mp_device_close(dev);
}

static void run(const char *spec) {
  run_with(spec, NULL, work);
}

Test(pool_threads, concurrent_use_keeps_contents_and_invariants_virtual) {
  run("host");
}

Test(pool_threads, concurrent_use_keeps_contents_and_invariants_plain) {
  run("host:vmm=0");
}

/* Trim, defragmentation (of the movable blocks of one thread), checks and
 * child pools race with allocs and frees in a virtual range with a small
 * granule and max_split, where growth reclaims and maps into holes. */
static atomic_int housekeeping_done;

static void *housekeeper(void *arg) {
  worker_t *w = arg;
  enum { MOVABLES = 16 };
  mp_handle_t *h[MOVABLES] = {0};
  uint64_t s = 0xD1B54A32D192ED03ull;
  mp_stream_t own = streams[w->id];
  for (int round = 0; round < 200; round++) {
    for (int i = 0; i < MOVABLES; i++) {
      xorshift64(&s);
      if (h[i] != NULL && (s & 1)) {
        if (*(uint64_t *)mp_handle_ptr(h[i]) != (uint64_t)i * 77 + 1)
          w->failures++;
        if (mp_handle_free(h[i]) != MP_OK)
          w->failures++;
        h[i] = NULL;
      } else if (h[i] == NULL) {
        if (mp_pool_alloc_movable(pool, 4096 + (s >> 40) % 300000, own,
                                  &h[i]) != MP_OK) {
          w->failures++;
          continue;
        }
        *(uint64_t *)mp_handle_ptr(h[i]) = (uint64_t)i * 77 + 1;
      }
    }
    size_t moved = 0;
    if (mp_pool_defragment(pool, own, &moved) != MP_OK ||
        mp_stream_synchronize(dev, own) != MP_OK)
      w->failures++;
    if (mp_pool_trim(pool, round % 3 == 0 ? 0 : (size_t)4 << 20) != MP_OK)
      w->failures++;
    if (mp_pool_check(pool) != MP_OK)
      w->failures++;
    mp_pool_t *child;
    void *c;
    if (mp_pool_create_child(pool, (size_t)1 << 20, &child) == MP_OK) {
      if (mp_pool_alloc(child, 1000, own, &c) != MP_OK ||
          mp_pool_free(child, c) != MP_OK || mp_pool_destroy(child) != MP_OK)
        w->failures++;
    } else {
      w->failures++;
    }
  }
  for (int i = 0; i < MOVABLES; i++)
    if (h[i] != NULL)
      mp_handle_free(h[i]);
  atomic_store(&housekeeping_done, 1);
  return NULL;
}

Test(pool_threads, trim_defragment_and_children_race_with_alloc_and_free) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.max_split = (size_t)1 << 20;
  cfg.segment_bytes = (size_t)256 << 10;
  run_with("host:granularity=64K", &cfg, housekeeper);
  cr_expect_eq(atomic_load(&housekeeping_done), 1);
}

/* The same races with growth mapped in pieces (map_piece): trim and the
 * reclaim unmap pieces while other threads allocate and free. */
Test(pool_threads, the_same_races_with_growth_mapped_in_pieces) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.max_split = (size_t)1 << 20;
  cfg.segment_bytes = (size_t)1 << 20;
  cfg.map_piece = (size_t)64 << 10;
  run_with("host:granularity=64K", &cfg, housekeeper);
  cr_expect_eq(atomic_load(&housekeeping_done), 1);
}
