/* mpbench's figures on a tiny trace, computed by hand.
 *
 * The allocator is a toy made here (through mp_allocator_wrap) whose
 * behaviour is simple enough to follow on paper: every block is its own
 * device allocation, a freed block is cached and reused only for a request
 * of exactly its size, and nothing is ever given back until the end. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)

typedef struct toy {
  mp_device_t *dev;
  struct {
    void *p;
    size_t size;
    bool live;
  } b[32];
  int n;
  uint64_t device_allocs;
} toy_t;

static mp_status_t toy_alloc(void *self, size_t bytes, mp_stream_t s,
                             void **out) {
  (void)s;
  toy_t *t = self;
  for (int i = 0; i < t->n; i++)
    if (!t->b[i].live && t->b[i].size == bytes) {
      t->b[i].live = true;
      *out = t->b[i].p;
      return MP_OK;
    }
  if (t->n == 32)
    return MP_ENOMEM;
  mp_status_t st = mp_device_alloc(t->dev, bytes, &t->b[t->n].p);
  if (st != MP_OK)
    return st;
  t->device_allocs++;
  t->b[t->n].size = bytes;
  t->b[t->n].live = true;
  *out = t->b[t->n++].p;
  return MP_OK;
}

static mp_status_t toy_free(void *self, void *ptr) {
  toy_t *t = self;
  for (int i = 0; i < t->n; i++)
    if (t->b[i].p == ptr && t->b[i].live) {
      t->b[i].live = false;
      return MP_OK;
    }
  return MP_EINVAL;
}

static mp_status_t toy_stats(void *self, mp_stats_t *out) {
  toy_t *t = self;
  memset(out, 0, sizeof *out);
  for (int i = 0; i < t->n; i++) {
    out->reserved_bytes += t->b[i].size;
    if (t->b[i].live)
      out->allocated_bytes += t->b[i].size;
    else if (t->b[i].size > out->largest_free_bytes)
      out->largest_free_bytes = t->b[i].size;
  }
  out->peak_reserved_bytes = out->reserved_bytes; /* it never shrinks */
  out->device_alloc_count = t->device_allocs;
  return MP_OK;
}

static mp_status_t toy_release(void *self) {
  (void)self;
  return MP_OK;
}

static mp_status_t toy_destroy(void *self) {
  toy_t *t = self;
  for (int i = 0; i < t->n; i++)
    mp_device_free(t->dev, t->b[i].p);
  free(t);
  return MP_OK;
}

static const mp_allocator_ops_t toy_ops = {
    .kind = "pool",
    .alloc = toy_alloc,
    .free = toy_free,
    .get_stats = toy_stats,
    .release = toy_release,
    .destroy = toy_destroy,
};

static mp_status_t make_toy(mp_device_t *dev, const char *name,
                            mp_allocator_t **out) {
  toy_t *t = calloc(1, sizeof *t);
  t->dev = dev;
  mp_status_t st = mp_allocator_wrap(&toy_ops, t, name, out);
  if (st != MP_OK)
    free(t);
  return st;
}

/* The trace, in MiB:                live   toy reserved   toy free blocks
 *   1 allocate A 4                   4      4
 *   2 allocate B 2                   6      6
 *   3 allocate C 2                   8      8
 *   4 free A                         4      8              {4}
 *   5 free B                         2      8              {4, 2}
 *   6 allocate D 8 (no 8 cached)    10     16              {4, 2}
 *   7 free C                         8     16              {4, 2, 2}
 *   8 free D                         0     16              {4, 2, 2, 8}
 * peak live 10, peak reserved 16: ratio 1.6, utilization 0.625.
 * (reserved - live) / reserved per event: 0, 0, 0, 4/8, 6/8, 6/16, 8/16,
 * 16/16; the sum is 3.125, the mean 0.390625.
 * At peak live (event 6): free = 16 - 10 = 6, largest free 4:
 * external fragmentation 1 - 4/6 = 1/3.
 * Device calls: 4 allocations (A, B, C, D), no frees. */
static const char *tiny_trace =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,00:00:00.000001,allocate,0xa000000,4194304,0\n"
    "1,00:00:00.000002,allocate,0xb000000,2097152,0\n"
    "1,00:00:00.000003,allocate,0xc000000,2097152,0\n"
    "1,00:00:00.000004,free,0xa000000,4194304,0\n"
    "1,00:00:00.000005,free,0xb000000,2097152,0\n"
    "1,00:00:00.000006,allocate,0xd000000,8388608,0\n"
    "1,00:00:00.000007,free,0xc000000,2097152,0\n"
    "1,00:00:00.000008,free,0xd000000,8388608,0\n";

static mpb_workload_t load_tiny(void) {
  mpb_workload_t w;
  cr_assert_eq(
      mpb_trace_parse(tiny_trace, strlen(tiny_trace), "tiny.csv", "tiny", &w),
      MP_OK, "%s", mp_last_error());
  return w;
}

Test(replay_figures, tiny_trace_gives_the_figures_computed_by_hand) {
  mpb_workload_t w = load_tiny();
  mpb_replay_opts_t o = {.device_spec = "host", .make = make_toy};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "toy", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect(r->completed);
  cr_expect_eq(r->events, 8);
  cr_expect_eq(r->peak_live, 10 * MiB);
  cr_expect_eq(r->peak_reserved, 16 * MiB);
  cr_expect_float_eq(r->ratio, 1.6, 1e-12);
  cr_expect_float_eq(r->utilization, 0.625, 1e-12);
  cr_expect_float_eq(r->avg_waste, 0.390625, 1e-12);
  cr_expect(r->has_ext_frag);
  cr_expect_float_eq(r->ext_frag, 1.0 / 3.0, 1e-12);
  cr_expect_eq(r->device_calls, 4);
  /* The clock's own cost is measured and taken out of the call times. */
  cr_expect_gt(r->timer_overhead_ns, 0);
  cr_expect_geq(r->ns_p99, r->ns_p50);
  cr_expect_eq(r->capacity_state, MPB_CAP_NONE);
  /* The plot series: every event is its own point here. */
  cr_assert_eq(r->npoints, 8);
  cr_expect_eq(r->point_live[5], 10 * MiB);
  cr_expect_eq(r->point_reserved[5], 16 * MiB);
  cr_expect_eq(r->point_event[7], 8);
  free(r);
  mpb_workload_free(&w);
}

/* The same trace through mempool's direct allocator, freed per free: each
 * request is one device allocation and each free one device free, so the
 * reserved bytes follow the live bytes (sizes are multiples of 2 MiB, so no
 * rounding): peak reserved 10 MiB, ratio 1, 4 + 4 device calls, and no
 * cached memory ever (avg waste 0). */
Test(replay_figures, direct_allocator_reserves_what_is_live) {
  mpb_workload_t w = load_tiny();
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "direct", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect(r->completed);
  cr_expect_eq(r->peak_live, 10 * MiB);
  cr_expect_eq(r->peak_reserved, 10 * MiB);
  cr_expect_float_eq(r->ratio, 1.0, 1e-12);
  cr_expect_float_eq(r->avg_waste, 0.0, 1e-12);
  cr_expect_eq(r->device_calls, 8);
  cr_expect_not(r->has_ext_frag);
  free(r);
  mpb_workload_free(&w);
}

Test(replay_figures, out_of_memory_is_a_result_not_an_error) {
  mpb_workload_t w = load_tiny();
  /* 12 MiB: A, B, C (8) fit, D needs 8 more. */
  mpb_replay_opts_t o = {.device_spec = "host:capacity=12M", .make = make_toy};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "toy", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect_not(r->completed);
  cr_expect(strstr(r->error, "event 6") != NULL, "%s", r->error);
  cr_expect_eq(r->events, 5);
  free(r);
  mpb_workload_free(&w);
}

/* Eight 16 MiB blocks live together through the jemalloc arena. jemalloc
 * needs 128 MiB, a page of padding per block and a little metadata; with
 * its default "retain" it would reserve address space ahead in growing
 * runs that the device hooks must back in full (about 1.5x here). */
Test(replay_figures, jemalloc_reserves_what_it_uses_not_address_space_ahead) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK);
  char why[160];
  bool have = mpb_allocator_available("jemalloc", dev, why, sizeof why);
  mp_device_close(dev);
  if (!have)
    cr_skip_test("%s", why);
  mpb_workload_t w;
  mpb_workload_init(&w, "eight");
  uint32_t slot;
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mpb_workload_alloc(&w, 16 * MiB, 0, &slot), MP_OK);
  cr_assert_eq(mpb_workload_drain(&w), MP_OK);
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "jemalloc", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect(r->completed, "%s", r->error);
  cr_expect_eq(r->peak_live, 128 * MiB);
  cr_expect_lt(r->peak_reserved, 128 * MiB + 128 * MiB / 8,
               "jemalloc reserved %zu bytes for 128 MiB", r->peak_reserved);
  free(r);
  mpb_workload_free(&w);
}

/* The 10-stream select_n llama trace of ../shared/traces. */
static void load_llama(mpb_workload_t *w) {
  const char *dir = getenv("MEMPOOL_TEST_TRACES");
  cr_assert_not_null(dir, "MEMPOOL_TEST_TRACES is not set");
  char path[4096];
  snprintf(path, sizeof path, "%s/pytorch/select_n_04d383c_llama.csv", dir);
  cr_assert_eq(mpb_trace_load(path, "llama", w), MP_OK, "%s", mp_last_error());
}

/* select_n llama (several streams, blocks freed on one stream and asked
 * for on another) through the pool, again and again: the same figures each
 * time. Before the device was let catch up after each free, whether a
 * block was reusable from another stream at the next event depended on when
 * the emulated device's stream threads ran, and the peak reserved bytes
 * ranged over 7.2 to 8.2 GiB from run to run. */
Test(replay_figures, several_streams_give_the_same_figures_every_run) {
  mpb_workload_t w;
  load_llama(&w);
  cr_assert_gt(w.nstreams, 1);
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t *first = calloc(1, sizeof *first), *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "pool", &o, first), MP_OK, "%s", mp_last_error());
  for (int run = 1; run < 12; run++) {
    cr_assert_eq(mpb_replay(&w, "pool", &o, r), MP_OK, "%s", mp_last_error());
    cr_expect_eq(r->peak_reserved, first->peak_reserved, "run %d: %zu vs %zu",
                 run, r->peak_reserved, first->peak_reserved);
    cr_expect_eq(r->device_calls, first->device_calls, "run %d", run);
  }
  free(first);
  free(r);
  mpb_workload_free(&w);
}

/* Keeps a core busy until *stop: the host device's stream threads then run
 * late, as on a loaded machine. */
static void *spin(void *arg) {
  atomic_bool *stop = arg;
  volatile unsigned long n = 0;
  while (!atomic_load(stop))
    n++;
  return NULL;
}

/* The built-in graph workload (captures on a second stream, then the
 * graphs released) through the pool, again and again with both cores kept
 * busy: the same figures each time. Before the device was let catch up
 * after the release too (as after a free), the graph pool's memory came
 * back to the pool once the capture stream's thread had run, and on a
 * loaded machine the peak moved (1.014, 1.022 or 1.030 times the live
 * bytes). */
Test(replay_figures, graph_workload_gives_the_same_figures_every_run) {
  mpb_workload_t w;
  cr_assert_eq(mpb_workload_generate("graph", &w), MP_OK, "%s",
               mp_last_error());
  cr_assert(w.has_graph && w.nstreams > 1);
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t *first = calloc(1, sizeof *first), *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "pool", &o, first), MP_OK, "%s", mp_last_error());
  atomic_bool stop = false;
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, spin, &stop), 0);
  int differ = 0;
  for (int run = 1; run < 12; run++) {
    cr_assert_eq(mpb_replay(&w, "pool", &o, r), MP_OK, "%s", mp_last_error());
    differ += r->peak_reserved != first->peak_reserved ||
              r->device_calls != first->device_calls;
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(differ, 0, "%d of 11 runs differ from the first (%zu bytes)",
               differ, first->peak_reserved);
  free(first);
  free(r);
  mpb_workload_free(&w);
}

/* The same trace with streams that run behind the host (stream_work_us:
 * work queued on each event's stream, no catching up after frees): with
 * stream_waits=1 the pool's choices no longer depend on how far behind
 * they are, so the figures equal those of a device that caught up after
 * every free. (The default pool's figure moves with the lag: 2.3 to 4.2
 * times the live bytes over 5 us to 1 ms per event, README.) */
Test(replay_figures, with_stream_waits_streams_running_behind_change_nothing) {
  mpb_workload_t w;
  load_llama(&w);
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t *caught_up = calloc(1, sizeof *caught_up);
  mpb_result_t *r = calloc(1, sizeof *r);
  const char *a = "pool:stream_waits=1";
  cr_assert_eq(mpb_replay(&w, a, &o, caught_up), MP_OK, "%s", mp_last_error());
  const unsigned lag_us[] = {10, 100};
  for (int i = 0; i < 2; i++) {
    o.stream_work_us = lag_us[i];
    cr_assert_eq(mpb_replay(&w, a, &o, r), MP_OK, "%s", mp_last_error());
    cr_expect(r->completed);
    cr_expect_eq(r->peak_reserved, caught_up->peak_reserved,
                 "%u us behind: %zu vs %zu", lag_us[i], r->peak_reserved,
                 caught_up->peak_reserved);
    cr_expect_eq(r->peak_live, caught_up->peak_live);
  }
  free(caught_up);
  free(r);
  mpb_workload_free(&w);
}
