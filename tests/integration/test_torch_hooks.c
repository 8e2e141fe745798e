/* test_torch_hooks.c - the hooks CUDAPluggableAllocator's C++ setters take
 * (init, reset, memory fraction, base allocation, record_stream, and the
 * graph-capture trio), each called through a pointer of PyTorch's C
 * signature (torch/csrc/cuda/CUDAPluggableAllocator.h, cudaStream_t as
 * mp_stream_t), on the emulated device through the default pool. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/snapshot_pool_ids.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

/* PyTorch's signatures: set_init_fn, set_reset_fn, set_memory_fraction_fn,
 * set_base_alloc_fn, set_record_stream_fn. */
static void (*const init_fn)(int) = mp_torch_init;
static void (*const reset_fn)(void) = mp_torch_reset;
static void (*const fraction_fn)(double, int) = mp_torch_memory_fraction;
static void *(*const base_alloc_fn)(void *, size_t *) = mp_torch_base_alloc;
static void (*const record_stream_fn)(void *,
                                      mp_stream_t) = mp_torch_record_stream;
static void *(*const alloc_fn)(ssize_t, int, mp_stream_t) = mp_torch_malloc;
static void (*const free_fn)(void *, ssize_t, int, mp_stream_t) = mp_torch_free;

static mp_device_t *dev;

static void on_host(void) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  init_fn(1);
  cr_assert_not_null(mp_default_pool(), "%s", mp_last_error());
  dev = mp_pool_device(mp_default_pool());
}

static mp_stats_t stats(mp_pool_t *p) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(p, &s), MP_OK);
  return s;
}

TestSuite(torch_hooks, .init = on_host);

Test(torch_hooks, init_makes_the_default_pool) {
  cr_expect_eq(stats(mp_default_pool()).live_blocks, 0);
}

Test(torch_hooks, reset_gives_idle_memory_back) {
  void *p = alloc_fn(8 * MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  free_fn(p, 8 * MiB, 0, NULL);
  cr_assert_geq(stats(mp_default_pool()).reserved_bytes, 8 * MiB);
  reset_fn();
  cr_expect_eq(stats(mp_default_pool()).reserved_bytes, 0);
}

Test(torch_hooks, memory_fraction_caps_the_pool_and_one_lifts_it) {
  size_t total = 0;
  cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK);
  double f = (double)(16 * MiB) / (double)total;
  fraction_fn(f, 0);
  void *p = alloc_fn(32 * MiB, 0, NULL);
  cr_expect_null(p, "32 MiB past a 16 MiB cap");
  fraction_fn(1.0, 0);
  p = alloc_fn(32 * MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  free_fn(p, 32 * MiB, 0, NULL);
  fraction_fn(2.0, 0); /* refused, nothing changed */
  cr_expect(strstr(mp_last_error(), "not in [0, 1]") != NULL, "%s",
            mp_last_error());
  p = alloc_fn(32 * MiB, 0, NULL);
  cr_expect_not_null(p);
  free_fn(p, 32 * MiB, 0, NULL);
}

/* PyTorch's setMemoryFraction (CUDACachingAllocator.cpp) allows
 * fraction x the device's memory, 0 bytes for 0: an allocation then
 * fails as out of memory. mp_pool_set_max_fraction's 0 ("no cap") had
 * lifted the cap instead. The pool's C callers keep their meaning. */
Test(torch_hooks, memory_fraction_zero_allows_nothing_as_pytorchs) {
  size_t total = 0;
  cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK);
  fraction_fn((double)(16 * MiB) / (double)total, 0);
  void *cached = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(cached, "%s", mp_last_error());
  free_fn(cached, MiB, 0, NULL);
  fraction_fn(0, 0);
  cr_expect_null(alloc_fn(MiB, 0, NULL), "fraction 0 allows no byte");
  cr_expect_eq(mp_last_status(), MP_ELIMIT, "%s", mp_last_error());
  cr_expect_null(alloc_fn(64 * MiB, 0, NULL), "nor past the old cap");
  /* Refused calls change nothing: still 0. */
  cr_expect_eq(mp_torch_memory_fraction_ex(2.0, 0), MP_EINVAL);
  cr_expect_eq(mp_torch_memory_fraction_ex(0.5, 1), MP_ENODEV);
  cr_expect_null(alloc_fn(MiB, 0, NULL));
  /* The default pool itself (mp_malloc's) is not PyTorch's setting. */
  void *own = NULL;
  cr_expect_eq(mp_pool_alloc(mp_default_pool(), MiB, NULL, &own), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(mp_default_pool(), own), MP_OK);
  fraction_fn(0.5, 0);
  void *p = alloc_fn(32 * MiB, 0, NULL);
  cr_expect_not_null(p, "a fraction above 0 allows again: %s", mp_last_error());
  free_fn(p, 32 * MiB, 0, NULL);
}

/* A fraction whose share is under the pool's alignment: PyTorch takes it
 * (a cap of a few bytes, which no allocation fits); the pool's refusal of
 * such a cap, dropped by the void hook, had left the pool uncapped. */
Test(torch_hooks, memory_fraction_under_one_block_allows_nothing) {
  cr_expect_eq(mp_torch_memory_fraction_ex(1e-15, 0), MP_OK, "%s",
               mp_last_error());
  fraction_fn(1e-15, 0);
  cr_expect_null(alloc_fn(MiB, 0, NULL), "a share of bytes fits no block");
  cr_expect_eq(mp_last_status(), MP_ELIMIT, "%s", mp_last_error());
  fraction_fn(0.5, 0);
  void *p = alloc_fn(MiB, 0, NULL);
  cr_expect_not_null(p, "%s", mp_last_error());
  free_fn(p, MiB, 0, NULL);
}

/* A refused fraction is said as the hook PyTorch calls (the C++
 * set_per_process_memory_fraction's, mempool.torch.set_memory_fraction's),
 * with the fraction and the device, and the pool's own reason after it: it
 * named mp_pool_set_max_fraction, which the program never called. */
Test(torch_hooks, a_refused_fraction_names_the_hook_and_the_pools_reason) {
  mp_pool_t *pool = mp_default_pool();
  void *p = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_torch_memory_fraction_ex(0.5, 0), MP_EBUSY);
  static const char hook[] = "mp_torch_memory_fraction: fraction 0.5 on "
                             "device 0: ";
  const char *e = mp_last_error();
  cr_expect(strncmp(e, hook, sizeof hook - 1) == 0, "%s", e);
  cr_expect(strstr(e, "paused") != NULL, "the pool's reason: %s", e);
  cr_expect(strstr(e, "(mp_pool_set_max_fraction") != NULL,
            "the call that refused, after: %s", e);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  fraction_fn(2.0, 0);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_str_eq(mp_last_error(),
                   "mp_torch_memory_fraction: fraction 2 is not in [0, 1]");
  free_fn(p, MiB, 0, NULL);
}

Test(torch_hooks, base_alloc_is_the_block_holding_the_pointer) {
  char *p = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(p);
  size_t size = 0;
  cr_expect_eq(base_alloc_fn(p + 1000, &size), p);
  cr_expect_geq(size, MiB);
  int local;
  size = 7;
  cr_expect_eq(base_alloc_fn(&local, &size), &local, "not a pool's: as is");
  cr_expect_eq(size, 7);
  free_fn(p, MiB, 0, NULL);
}

/* The default pool made with arenas ($MEMPOOL_CONF=arenas=2): its blocks
 * are in the arenas, not the pool itself; base_alloc still finds them. */
static void on_host_arenas(void) {
  setenv("MEMPOOL_CONF", "arenas=2", 1);
  on_host();
}
TestSuite(torch_hooks_arenas, .init = on_host_arenas);

Test(torch_hooks_arenas, base_alloc_finds_the_block_in_an_arena) {
  char *p = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  size_t size = 0;
  cr_expect_eq(base_alloc_fn(p + 1000, &size), p, "%s", mp_last_error());
  cr_expect_geq(size, MiB);
  free_fn(p, MiB, 0, NULL);
  size = 7;
  cr_expect_eq(base_alloc_fn(p, &size), p, "freed: as is");
  cr_expect_eq(size, 7);
}

/* The hooks return nothing, as PyTorch's take; their _ex twins say a
 * refusal as a status and change nothing (mempool.torch raises it). */
Test(torch_hooks, the_ex_twins_return_what_the_hooks_drop) {
  cr_expect_eq(mp_torch_memory_fraction_ex(0.5, 1), MP_ENODEV,
               "a device the host backend does not serve: %s", mp_last_error());
  cr_expect_eq(mp_torch_memory_fraction_ex(2.0, 0), MP_EINVAL);
  cr_expect_eq(mp_torch_memory_fraction_ex(0, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_torch_memory_fraction_ex(1, 0), MP_OK, "%s", mp_last_error());
  void *p = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(p);
  cr_expect_eq(mp_torch_record_stream_ex(p, NULL), MP_OK, "%s",
               mp_last_error());
  /* A view's data pointer inside the block: PyTorch passes the storage's
   * start; the refusal is said, not swallowed. */
  cr_expect_eq(mp_torch_record_stream_ex((char *)p + 64, NULL), MP_EINVAL);
  cr_expect_eq(mp_torch_record_stream_ex(NULL, NULL), MP_OK,
               "an empty tensor's storage: nothing to record");
  int local;
  cr_expect_eq(mp_torch_record_stream_ex(&local, NULL), MP_EINVAL);
  free_fn(p, MiB, 0, NULL);
}

/* record_stream: the block waits for the recorded stream's work before
 * another stream reuses it. */
Test(torch_hooks, record_stream_holds_the_block_for_the_streams_work) {
  mp_stream_t a, b, c;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &c), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, b, gate_wait, &g), MP_OK);
  void *p = alloc_fn(MiB, 0, a);
  cr_assert_not_null(p);
  record_stream_fn(p, b);
  free_fn(p, MiB, 0, a);
  /* p's 2 MiB segment is one free block now, waiting for a and b. */
  void *q = alloc_fn(2 * MiB, 0, c);
  cr_expect_neq(q, p, "reused while b's work is still queued");
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, a), MP_OK);
  void *r = alloc_fn(2 * MiB, 0, c);
  cr_expect_eq(r, p, "reusable once b's work is done");
  free_fn(q, 2 * MiB, 0, c);
  free_fn(r, 2 * MiB, 0, c);
  int local;
  record_stream_fn(&local, a); /* no pool's: refused, a message only */
  cr_expect_eq(mp_torch_record_stream_ex(&local, a), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not allocated from this pool") != NULL,
            "%s", mp_last_error());
  gate_destroy(&g);
  mp_stream_destroy(dev, a);
  mp_stream_destroy(dev, b);
  mp_stream_destroy(dev, c);
}

/* ---- graph capture: begin / end / release ----------------------------- */

static mp_stream_t captured;
static int drops;
static int capture_filter(mp_stream_t s, void *ctx) {
  return s == *(mp_stream_t *)ctx;
}
static void drop(void *ctx) {
  (void)ctx;
  drops++;
}

Test(torch_hooks, a_private_pool_serves_its_capture_until_released) {
  mp_pool_t *pool = mp_default_pool();
  mp_stream_t other;
  cr_assert_eq(mp_stream_create(dev, &captured), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  mp_torch_pool_id_t id = {1, 7};
  drops = 0;
  mp_torch_begin_allocate_to_pool(0, id, capture_filter, &captured, drop);
  void *a = alloc_fn(MiB, 0, captured);
  cr_assert_not_null(a, "%s", mp_last_error());
  cr_assert_not_null(mp_pool_graph_of(pool, captured));
  free_fn(a, MiB, 0, captured); /* freed inside the capture */
  void *o = alloc_fn(MiB, 0, other);
  cr_expect_neq(o, a, "the other stream is not the capture's");
  mp_torch_end_allocate_to_pool(0, id);
  cr_expect_eq(drops, 1, "the filter is dropped at the end");
  cr_expect_null(mp_pool_graph_of(pool, captured));
  void *after = alloc_fn(MiB, 0, captured);
  cr_expect_neq(after, a, "graph memory outside the capture");
  free_fn(after, MiB, 0, captured);
  free_fn(o, MiB, 0, other);
  /* A second capture into the same pool (pool=) gets the same memory. */
  mp_torch_begin_allocate_to_pool(0, id, capture_filter, &captured, drop);
  void *again = alloc_fn(MiB, 0, captured);
  cr_expect_eq(again, a);
  free_fn(again, MiB, 0, captured);
  mp_torch_end_allocate_to_pool(0, id);
  size_t lent = stats(pool).allocated_bytes;
  cr_expect_geq(lent, MiB, "the private pool's range is lent");
  mp_torch_release_pool(0, id); /* one graph of two */
  cr_expect_eq(stats(pool).allocated_bytes, lent);
  mp_torch_release_pool(0, id);
  cr_expect_eq(stats(pool).allocated_bytes, 0, "back to the device's pool");
  mp_torch_release_pool(0, id);
  cr_expect(strstr(mp_last_error(), "no pool (1, 7)") != NULL, "%s",
            mp_last_error());
  mp_torch_end_allocate_to_pool(0, id);
  cr_expect(strstr(mp_last_error(), "not being allocated to") != NULL);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, captured);
  mp_stream_destroy(dev, other);
}

/* PyTorch's MemPool (torch.cuda.use_mem_pool) begins allocating to a pool
 * with a filter that takes the current thread's allocations outside any
 * capture, on whatever stream is current: the default (legacy) one too,
 * which mp_pool_graph_begin refuses (no capture can use it) but this
 * routing does not. */
static int every_stream(mp_stream_t s, void *ctx) {
  (void)s;
  (void)ctx;
  return 1;
}

Test(torch_hooks, a_mem_pool_serves_the_default_stream) {
  mp_pool_t *pool = mp_default_pool();
  mp_torch_pool_id_t id = {0, 9};
  mp_torch_begin_allocate_to_pool(0, id, every_stream, NULL, NULL);
  void *a = alloc_fn(MiB, 0, NULL);
  cr_assert_not_null(a, "%s", mp_last_error());
  cr_expect_not_null(mp_pool_graph_of(pool, NULL), "routed to the pool");
  free_fn(a, MiB, 0, NULL);
  mp_torch_end_allocate_to_pool(0, id);
  cr_expect_null(mp_pool_graph_of(pool, NULL));
  void *b = alloc_fn(MiB, 0, NULL);
  cr_expect_neq(b, a, "the pool's memory stays its own");
  free_fn(b, MiB, 0, NULL);
  mp_torch_release_pool(0, id);
  cr_expect_eq(stats(pool).allocated_bytes, 0, "back to the device's pool");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

/* A release (CUDAGraph::reset) of a pool whose capture is still open: as
 * PyTorch's releasePool, which only lowers the pool's use count (the
 * capture keeps allocating to it until endAllocateToPool), the capture
 * keeps its pool and its filter, and the pool is released at the end.
 * Before, the release ended the capture's routes and released the pool
 * under it: the capture's next allocation came from the device's pool and
 * the end was refused ("not being allocated to"). */
Test(torch_hooks, a_release_during_its_capture_waits_for_the_end) {
  mp_pool_t *pool = mp_default_pool();
  cr_assert_eq(mp_stream_create(dev, &captured), MP_OK);
  mp_torch_pool_id_t id = {4, 2};
  drops = 0;
  mp_torch_begin_allocate_to_pool(0, id, capture_filter, &captured, drop);
  void *a = alloc_fn(MiB, 0, captured);
  cr_assert_not_null(a, "%s", mp_last_error());
  mp_pool_t *g = mp_pool_graph_of(pool, captured);
  cr_assert_not_null(g);
  mp_torch_release_pool(0, id); /* its last use, the capture still open */
  cr_expect_eq(drops, 0, "the open capture's filter is kept");
  mp_torch_release_pool(0, id); /* one release too many: refused */
  cr_expect(strstr(mp_last_error(), "capture is still open") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_graph_of(pool, captured), g, "still routed");
  free_fn(a, MiB, 0, captured);
  void *b = alloc_fn(MiB, 0, captured);
  cr_assert_not_null(b, "%s", mp_last_error());
  cr_expect_eq(b, a, "served by the capture's pool");
  free_fn(b, MiB, 0, captured);
  mp_torch_end_allocate_to_pool(0, id);
  cr_expect(strstr(mp_last_error(), "not being allocated to") == NULL, "%s",
            mp_last_error());
  cr_expect_eq(drops, 1);
  cr_expect_null(mp_pool_graph_of(pool, captured));
  cr_expect_eq(stats(pool).allocated_bytes, 0, "released at the end");
  mp_torch_release_pool(0, id);
  cr_expect(strstr(mp_last_error(), "no pool (4, 2)") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, captured);
}

/* The pool is the one PyTorch's MempoolId_t names, as PyTorch's
 * graph_pools map keys its private pools by it: two ids are two pools, an
 * id begun again shares its pool until its last release, and an id
 * released and begun again names a new pool. The graph pool's snapshot
 * names its segments by that id (PyTorch's segment_pool_id, which
 * cudagraph_trees selects a graph's memory by); it said (0, n), an id of
 * mempool's own. */
Test(torch_hooks, a_pool_is_the_one_its_mempool_id_names) {
  mp_pool_t *pool = mp_default_pool();
  mp_stream_t sa, sb;
  cr_assert_eq(mp_stream_create(dev, &sa), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &sb), MP_OK);
  mp_torch_pool_id_t ida = {0, 9}, idb = {3, 0};
  mp_torch_begin_allocate_to_pool(0, ida, capture_filter, &sa, NULL);
  mp_torch_begin_allocate_to_pool(0, idb, capture_filter, &sb, NULL);
  void *a = alloc_fn(MiB, 0, sa), *b = alloc_fn(MiB, 0, sb);
  cr_assert_not_null(a, "%s", mp_last_error());
  cr_assert_not_null(b, "%s", mp_last_error());
  mp_pool_t *ga = mp_pool_graph_of(pool, sa), *gb = mp_pool_graph_of(pool, sb);
  cr_assert_not_null(ga);
  cr_assert_not_null(gb);
  cr_expect_neq(ga, gb, "two ids, one pool");
  const mp_torch_pool_id_t ids[2] = {ida, idb};
  mp_pool_t *const graphs[2] = {ga, gb};
  for (int i = 0; i < 2; i++) {
    uint64_t seg[8][2];
    size_t n = snapshot_pool_ids(graphs[i], seg, 8);
    cr_assert_gt(n, 0);
    for (size_t k = 0; k < n; k++)
      cr_expect(seg[k][0] == ids[i].first && seg[k][1] == ids[i].second,
                "pool (%llu, %llu), segment %zu: (%llu, %llu)", ids[i].first,
                ids[i].second, k, (unsigned long long)seg[k][0],
                (unsigned long long)seg[k][1]);
  }
  free_fn(b, MiB, 0, sb);
  mp_torch_end_allocate_to_pool(0, idb);
  /* Begun again, idb is the same pool: its memory comes back. */
  mp_torch_begin_allocate_to_pool(0, idb, capture_filter, &sb, NULL);
  void *b2 = alloc_fn(MiB, 0, sb);
  cr_expect_eq(mp_pool_graph_of(pool, sb), gb);
  cr_expect_eq(b2, b);
  free_fn(b2, MiB, 0, sb);
  mp_torch_end_allocate_to_pool(0, idb);
  free_fn(a, MiB, 0, sa);
  mp_torch_end_allocate_to_pool(0, ida);
  /* Released by its two uses, then begun again: a new pool, one use. */
  mp_torch_release_pool(0, idb);
  mp_torch_release_pool(0, idb);
  mp_torch_begin_allocate_to_pool(0, idb, capture_filter, &sb, NULL);
  void *b3 = alloc_fn(MiB, 0, sb);
  cr_assert_not_null(b3, "%s", mp_last_error());
  uint64_t seg[8][2];
  cr_assert_gt(snapshot_pool_ids(mp_pool_graph_of(pool, sb), seg, 8), 0);
  cr_expect(seg[0][0] == 3 && seg[0][1] == 0, "(%llu, %llu)",
            (unsigned long long)seg[0][0], (unsigned long long)seg[0][1]);
  free_fn(b3, MiB, 0, sb);
  mp_torch_end_allocate_to_pool(0, idb);
  mp_torch_release_pool(0, idb);
  mp_torch_release_pool(0, idb);
  cr_expect(strstr(mp_last_error(), "no pool (3, 0)") != NULL, "%s",
            mp_last_error());
  mp_torch_release_pool(0, ida);
  cr_expect_eq(stats(pool).allocated_bytes, 0, "back to the device's pool");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, sa);
  mp_stream_destroy(dev, sb);
}

Test(torch_hooks, a_begin_without_a_filter_is_refused_and_dropped) {
  drops = 0;
  mp_torch_pool_id_t id = {2, 0};
  mp_torch_begin_allocate_to_pool(0, id, NULL, NULL, drop);
  cr_expect_eq(drops, 1);
  cr_expect(strstr(mp_last_error(), "filter is NULL") != NULL);
  mp_torch_begin_allocate_to_pool(5, id, capture_filter, &captured, drop);
  cr_expect_eq(drops, 2, "device 5 does not exist here");
}

/* The refusals as statuses (_ex): a NULL filter, an id being allocated to
 * already (a second capture into it before the first ends). */
static mp_stream_t new_stream(void);

Test(torch_hooks, a_refused_begin_says_why_as_a_status) {
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  mp_torch_pool_id_t id = {3, 1};
  drops = 0;
  cr_expect_eq(mp_torch_begin_allocate_to_pool_ex(0, id, NULL, NULL, drop),
               MP_EINVAL);
  cr_expect_eq(
      mp_torch_begin_allocate_to_pool_ex(0, id, capture_filter, &s1, drop),
      MP_OK, "%s", mp_last_error());
  cr_expect_eq(
      mp_torch_begin_allocate_to_pool_ex(0, id, capture_filter, &s2, drop),
      MP_EBUSY);
  cr_expect_eq(drops, 2, "each refused filter dropped");
  mp_torch_end_allocate_to_pool(0, id);
  mp_torch_release_pool(0, id);
  cr_expect_eq(stats(mp_default_pool()).allocated_bytes, 0);
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
}

/* More private pools alive than the 64 the table once held (a program
 * capturing graphs without a shared pool= makes one per graph): each
 * capture gets a pool of its own. The 65th begin was refused, in silence
 * through the void hook, and its capture's allocations came from the
 * device's pool: what it freed went to other streams while its replays
 * still wrote there. */
static mp_stream_t new_stream(void) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  return s;
}

Test(torch_hooks, a_hundred_graphs_each_get_a_private_pool) {
  enum { GRAPHS = 100 };
  mp_stream_t s = new_stream(), other = new_stream();
  mp_pool_t *pool = mp_default_pool();
  for (unsigned long long i = 1; i <= GRAPHS; i++) {
    mp_torch_pool_id_t id = {4, i};
    cr_assert_eq(
        mp_torch_begin_allocate_to_pool_ex(0, id, capture_filter, &s, NULL),
        MP_OK, "graph %llu: %s", i, mp_last_error());
    void *t = alloc_fn(MiB, 0, s);
    cr_assert_not_null(t, "graph %llu: %s", i, mp_last_error());
    cr_assert_not_null(mp_pool_graph_of(pool, s), "graph %llu", i);
    free_fn(t, MiB, 0, s); /* the graph's temporary, freed in its capture */
    mp_torch_end_allocate_to_pool(0, id);
    cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
    void *o = alloc_fn(MiB, 0, other);
    cr_assert_neq(o, t, "graph %llu: another stream got its memory", i);
    free_fn(o, MiB, 0, other);
  }
  for (unsigned long long i = 1; i <= GRAPHS; i++)
    mp_torch_release_pool(0, (mp_torch_pool_id_t){4, i});
  cr_assert_eq(mp_stream_synchronize(dev, other), MP_OK);
  cr_expect_eq(stats(pool).allocated_bytes, 0, "every pool released");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s);
  mp_stream_destroy(dev, other);
}

static int any_of(mp_stream_t s, void *ctx) {
  const mp_stream_t *set = ctx;
  for (int i = 0; set[i] != NULL; i++)
    if (set[i] == s)
      return 1;
  return 0;
}

/* One capture over more streams than the 8 an entry once held (PyTorch's
 * own allocator has no such limit): each stream allocates from the
 * capture's private pool. The ninth stream's allocation failed, a NULL
 * that PyTorch's pluggable allocator takes for the tensor's memory. */
Test(torch_hooks, a_capture_over_twelve_streams_routes_them_all) {
  enum { N = 12 };
  mp_stream_t s[N + 1] = {NULL};
  void *p[N];
  for (int i = 0; i < N; i++)
    s[i] = new_stream();
  mp_torch_pool_id_t id = {5, 1};
  cr_assert_eq(mp_torch_begin_allocate_to_pool_ex(0, id, any_of, s, NULL),
               MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = mp_default_pool();
  for (int i = 0; i < N; i++) {
    p[i] = alloc_fn(MiB, 0, s[i]);
    cr_assert_not_null(p[i], "stream %d: %s", i, mp_last_error());
    cr_expect_not_null(mp_pool_graph_of(pool, s[i]), "stream %d", i);
  }
  for (int i = 0; i < N; i++)
    free_fn(p[i], MiB, 0, s[i]);
  mp_torch_end_allocate_to_pool(0, id);
  for (int i = 0; i < N; i++)
    cr_expect_null(mp_pool_graph_of(pool, s[i]), "stream %d still routed", i);
  mp_torch_release_pool(0, id);
  for (int i = 0; i < N; i++)
    mp_stream_destroy(dev, s[i]);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}
