/* mpbench's graph workload (an engine capturing decode steps in CUDA
 * graphs): the pool gives the captures a graph pool, which pins less than
 * a pool without graph awareness ("pool-nograph", every capture-time
 * allocation straight from the device until the graphs go), and both give
 * the graphs' memory back when they are released. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

static mpb_workload_t w;

static void setup(void) {
  cr_assert_eq(mpb_workload_generate("graph:steps=200", &w), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  mpb_workload_free(&w);
}

static mpb_result_t run(const char *allocator) {
  mpb_replay_opts_t o = {.device_spec = "host"};
  mpb_result_t r;
  cr_assert_eq(mpb_replay(&w, allocator, &o, &r), MP_OK, "%s: %s", allocator,
               mp_last_error());
  cr_assert(r.completed, "%s: %s", allocator, r.error);
  return r;
}

/* Bytes allocated on a capturing stream, and of them those still live when
 * the last capture ends (the graphs' outputs), from the events. */
static void capture_bytes(size_t *all, size_t *kept) {
  bool capturing = false;
  size_t live = 0;
  *all = *kept = 0;
  size_t *slot = calloc(w.nslots, sizeof *slot);
  for (size_t i = 0; i < w.n; i++) {
    const mpb_event_t *e = &w.ev[i];
    if (e->op == MPB_GRAPH) {
      capturing = e->slot == MPB_CAPTURE_BEGIN;
      if (e->slot == MPB_CAPTURE_END)
        *kept = live;
    } else if (e->op == MPB_ALLOC && capturing) {
      *all += e->size;
      live += e->size;
      slot[e->slot] = e->size;
    } else if (e->op == MPB_FREE) {
      live -= slot[e->slot];
      slot[e->slot] = 0;
    }
  }
  free(slot);
}

TestSuite(graph_workload, .init = setup, .fini = teardown);

Test(graph_workload, has_captures_and_a_release) {
  unsigned begins = 0, ends = 0, releases = 0;
  for (size_t i = 0; i < w.n; i++)
    if (w.ev[i].op == MPB_GRAPH) {
      begins += w.ev[i].slot == MPB_CAPTURE_BEGIN;
      ends += w.ev[i].slot == MPB_CAPTURE_END;
      releases += w.ev[i].slot == MPB_GRAPH_RELEASE;
    }
  cr_expect_gt(begins, 1);
  cr_expect_eq(begins, ends);
  cr_expect_eq(releases, 1);
  cr_expect(w.has_graph);
}

Test(graph_workload, a_graph_pool_pins_less_than_no_graph_awareness) {
  size_t all, kept;
  capture_bytes(&all, &kept);
  mpb_result_t pool = run("pool"), nograph = run("pool-nograph");
  cr_expect_eq(nograph.graph_pinned, all,
               "without graph pools every capture-time allocation stays");
  cr_expect_geq(pool.graph_pinned, kept, "the outputs are in the graph pool");
  cr_expect_lt(pool.graph_pinned, nograph.graph_pinned,
               "pool %zu bytes, pool-nograph %zu", pool.graph_pinned,
               nograph.graph_pinned);
  cr_expect_leq(pool.peak_reserved, nograph.peak_reserved);
}

Test(graph_workload, allocators_without_graph_events_pin_nothing) {
  mpb_result_t direct = run("direct");
  cr_expect_eq(direct.graph_pinned, 0);
  cr_expect_eq(direct.peak_reserved, direct.peak_live);
}

/* "pool-nograph" serves every allocation on a capturing stream with a
 * device allocation of its own, given back to the device when the graphs
 * go: its device calls count those (they were left out, so the column
 * showed only the pool's own segment calls). */
Test(graph_workload, nograph_counts_its_capture_allocations_as_device_calls) {
  bool capturing = false;
  uint64_t captured = 0;
  for (size_t i = 0; i < w.n; i++) {
    const mpb_event_t *e = &w.ev[i];
    if (e->op == MPB_GRAPH)
      capturing = e->slot == MPB_CAPTURE_BEGIN;
    else if (e->op == MPB_ALLOC && capturing && e->size != 0)
      captured++;
  }
  cr_assert_gt(captured, 0);
  mpb_result_t pool = run("pool"), nograph = run("pool-nograph");
  cr_assert(nograph.has_device_calls);
  /* Each captured allocation is a device call; the pool's own calls for
   * everything else come on top. */
  cr_expect_geq(nograph.device_calls, captured,
                "%llu device calls, %llu "
                "captured allocations (pool: %llu)",
                (unsigned long long)nograph.device_calls,
                (unsigned long long)captured,
                (unsigned long long)pool.device_calls);
}
