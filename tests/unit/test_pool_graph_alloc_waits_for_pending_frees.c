/* An allocation during a capture (mp_pool_graph_begin), with the device
 * full and the memory it needs free but still used by queued stream work,
 * waits for that work instead of failing (core.c's ladder, stream.c's
 * mp__pool_sync_partial): the pool's synchronize is refused while a stream
 * of it is captured, so before this the ladder answered out of memory, and
 * a loop of captures whose given-back ranges waited on lagging streams
 * grew the device full and failed (unit_pool_arenas_graph's race, under a
 * loaded CI). Two kinds of work: on a stream that is not captured, and
 * queued on the captured stream before its capture began (waited for
 * through the marker recorded then, never by a record on or a query of
 * the captured stream). Each with and without arenas; and with arenas, the
 * memory in another thread's arena, which the capture's out-of-memory path
 * trims after the same wait. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_graph_alloc_waits_for_pending_frees, "host:capacity=256M");

static mp_stream_t new_stream(void) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  return s;
}

/* A capture of s1 on pool begins (its graph pool *g), and asks for 160
 * MiB while a timer opens gate 300 ms later: the allocation (*x) succeeds,
 * and only once the gate opened. */
static void capture_alloc_after_gate(mp_pool_t *pool, mp_stream_t s1,
                                     gate_t *gate, mp_pool_t **g, void **x) {
  cr_assert_eq(mp_pool_graph_create(pool, g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, *g, s1), MP_OK, "%s", mp_last_error());
  gate_timer_t timer;
  cr_assert_eq(gate_timer_start(&timer, gate, 300000), 0);
  mp_status_t st = mp_pool_alloc(pool, 160 * MiB, s1, x);
  bool opened = atomic_load(&timer.opened) == 1;
  gate_timer_join(&timer);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect(opened, "the allocation answered before the gate opened");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

/* x freed, the capture ended, g released; pool, s1, s2 and gate go. */
static void capture_finish(mp_pool_t *pool, mp_pool_t *g, void *x,
                           mp_stream_t s1, mp_stream_t s2, gate_t *gate) {
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK);
  gate_destroy(gate);
}

/* 192 MiB of the device's 256 freed on pool while stream busy's work (a
 * closed gate) may still use it (record: a use by busy of a block of
 * other's); then a capture of s1 asks for 160 MiB, which only that memory
 * can serve. The allocation answers once the gate opens (300 ms later),
 * with memory of the freed block. */
static void capture_waits(const char *opts, bool on_captured) {
  mp_pool_t *pool = make_pool(dev, opts);
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  mp_stream_t busy = on_captured ? s1 : s2;
  gate_t gate;
  gate_init(&gate);
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 192 * MiB, s2, &a), MP_OK, "%s",
               mp_last_error());
  if (on_captured)
    cr_assert_eq(mp_pool_record_stream(pool, a, s1), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, busy, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());

  mp_pool_t *g;
  void *x;
  capture_alloc_after_gate(pool, s1, &gate, &g, &x);
  cr_expect((uintptr_t)x >= (uintptr_t)a &&
                (uintptr_t)x + 160 * MiB <= (uintptr_t)a + 192 * MiB,
            "%p is not in the freed block at %p", x, a);
  capture_finish(pool, g, x, s1, s2, &gate);
}

Test(pool_graph_alloc_waits_for_pending_frees, work_of_a_stream_not_captured,
     .timeout = 60) {
  capture_waits(NULL, false);
}

Test(pool_graph_alloc_waits_for_pending_frees,
     work_queued_on_the_captured_stream_before_the_capture, .timeout = 60) {
  capture_waits(NULL, true);
}

Test(pool_graph_alloc_waits_for_pending_frees,
     arenas_work_of_a_stream_not_captured, .timeout = 60) {
  capture_waits("arenas=2", false);
}

Test(pool_graph_alloc_waits_for_pending_frees,
     arenas_work_queued_on_the_captured_stream_before_the_capture,
     .timeout = 60) {
  capture_waits("arenas=2", true);
}

/* Another thread's arena holds the memory: the capture's out-of-memory
 * path trims it (arena.c's reclaim), whose synchronize is refused there
 * too (the other arena used the captured stream, so it is marked
 * capturing with work of its own): the same wait, then the trim gives the
 * memory back to the device for the capture's growth. */
typedef struct other_arena {
  mp_pool_t *pool;
  mp_stream_t s1, s2;
  gate_t *gate;
  void *a;
  mp_status_t st;
} other_arena_t;

static void *other_arena_run(void *arg) {
  other_arena_t *o = arg;
  void *p;
  /* The captured stream used here first: a slot of this arena's own. */
  if ((o->st = mp_pool_alloc(o->pool, MiB, o->s1, &p)) != MP_OK ||
      (o->st = mp_pool_free(o->pool, p)) != MP_OK)
    return NULL;
  if ((o->st = mp_pool_alloc(o->pool, 192 * MiB, o->s2, &o->a)) != MP_OK ||
      (o->st = mp_stream_launch_host(mp_pool_device(o->pool), o->s2, gate_wait,
                                     o->gate)) != MP_OK)
    return NULL;
  o->st = mp_pool_free(o->pool, o->a);
  return NULL;
}

Test(pool_graph_alloc_waits_for_pending_frees,
     arenas_work_beside_another_arenas_memory, .timeout = 60) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  gate_t gate;
  gate_init(&gate);
  other_arena_t o = {pool, s1, s2, &gate, NULL, MP_OK};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, other_arena_run, &o), 0);
  pthread_join(t, NULL);
  cr_assert_eq(o.st, MP_OK, "the other thread's calls: %d", o.st);

  mp_pool_t *g;
  void *x;
  capture_alloc_after_gate(pool, s1, &gate, &g, &x);
  capture_finish(pool, g, x, s1, s2, &gate);
}
