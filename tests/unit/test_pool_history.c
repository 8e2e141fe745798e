/* The pool's history ring (history=N, history_stacks=1),
 * mp_pool_snapshot's error paths and its segments' pool ids. The pickle's
 * content is checked by python/tests/test_snapshot.py (Python's own pickle, and
 * mpbench replay). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/snapshot_pool_ids.h"
#include "pool/pool_internal.h"

#define MiB_BYTES ((size_t)1 << 20)

static mp_device_t *dev;

static void open_host(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}

static void close_host(void) {
  mp_device_close(dev);
}

TestSuite(pool_history, .init = open_host, .fini = close_host);

static mp_pool_t *make_pool(const char *opts) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, opts), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s", mp_last_error());
  return p;
}

/* The i-th oldest event the ring holds. */
static const mp__hevent_t *oldest(const mp_pool_t *p, size_t i) {
  const mp__history_t *h = &p->hist;
  size_t start = h->total > h->cap ? h->next : 0;
  return &h->ev[(start + i) % h->cap];
}

Test(pool_history, off_by_default_records_nothing) {
  mp_pool_t *p = make_pool("max_bytes=16M");
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_expect_null(p->hist.ev);
  cr_expect_eq(p->hist.total, 0);
  mp_pool_destroy(p);
}

Test(pool_history, records_alloc_and_both_frees_in_order) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=64,virtual=0");
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* segment_alloc (first growth), alloc, free_requested, free_completed */
  cr_assert_eq(p->hist.total, 4);
  unsigned want[] = {MP__H_SEGMENT_ALLOC, MP__H_ALLOC, MP__H_FREE_REQUESTED,
                     MP__H_FREE_COMPLETED};
  for (size_t i = 0; i < 4; i++)
    cr_expect_eq(oldest(p, i)->action, want[i], "event %zu", i);
  cr_expect_eq(oldest(p, 1)->addr, (uintptr_t)a);
  /* The bytes asked for, as PyTorch's alloc event (its block is 1024):
   * it was the rounded size, which memory_viz's timeline mixed with the
   * blocks' requested sizes. */
  cr_expect_eq(oldest(p, 1)->size, 1000);
  cr_expect_eq(oldest(p, 2)->size, 1000);
  cr_expect_eq(oldest(p, 3)->size, 1000);
  cr_expect_eq(oldest(p, 3)->addr, (uintptr_t)a);
  cr_expect_eq(oldest(p, 0)->size, p->st.reserved_bytes);
  cr_expect_leq(oldest(p, 0)->time_us, oldest(p, 3)->time_us);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(oldest(p, 4)->action, MP__H_SEGMENT_FREE);
  mp_pool_destroy(p);
}

/* Replays the ring's block events: every free is of a block the history
 * has live, every alloc of an address it has free; returns the blocks
 * still live at the end (-1 on a free of one not live). */
static long replay_ring(const mp_pool_t *p) {
  uintptr_t live[64];
  size_t n = 0;
  size_t count = p->hist.total < p->hist.cap ? p->hist.total : p->hist.cap;
  for (size_t i = 0; i < count; i++) {
    const mp__hevent_t *e = oldest(p, i);
    if (e->action == MP__H_ALLOC) {
      for (size_t k = 0; k < n; k++)
        if (live[k] == e->addr)
          return -1; /* allocated while live */
      cr_assert_lt(n, 64);
      live[n++] = e->addr;
    } else if (e->action == MP__H_FREE_COMPLETED) {
      size_t k = 0;
      while (k < n && live[k] != e->addr)
        k++;
      if (k == n)
        return -1;
      live[k] = live[--n];
    }
  }
  return (long)n;
}

/* A block defragmentation moves is, in the history, freed at its old
 * address and allocated at its new one (PyTorch's view of a copy). Before,
 * nothing was recorded: the trace kept the block live at its old address
 * and its handle's free freed the new address, never allocated there; a
 * replay of the snapshot peaked above the pool. */
Test(pool_history, a_defragmentation_move_is_a_free_and_an_alloc) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=100,virtual=1");
  void *a;
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, 1 << 20, NULL, &h), MP_OK, "%s",
               mp_last_error());
  uintptr_t before = (uintptr_t)mp_handle_ptr(h);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(p, NULL, &moved), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(moved, (size_t)1 << 20, "the test needs the block moved");
  uintptr_t after = (uintptr_t)mp_handle_ptr(h);
  cr_assert_neq(after, before);
  cr_expect_eq(replay_ring(p), 1, "the moved block, live once");
  const mp__hevent_t *last = oldest(p, p->hist.total - 1);
  cr_expect_eq(last->action, MP__H_ALLOC);
  cr_expect_eq(last->addr, after);
  cr_expect_eq(oldest(p, p->hist.total - 2)->action, MP__H_FREE_COMPLETED);
  cr_expect_eq(oldest(p, p->hist.total - 2)->addr, before);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  cr_expect_eq(replay_ring(p), 0, "every block freed once");
  mp_pool_destroy(p);
}

Test(pool_history, ring_wraps_at_n_keeping_the_newest) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=7");
  void *last = NULL;
  for (int i = 0; i < 10; i++) {
    cr_assert_eq(mp_pool_alloc(p, 512 * (size_t)(i + 1), NULL, &last), MP_OK);
    cr_assert_eq(mp_pool_free(p, last), MP_OK);
  }
  cr_expect_gt(p->hist.total, 30); /* 30 block events and a segment_map */
  cr_expect_eq(p->hist.cap, 7);
  /* Newest last: the last pair's alloc, free_requested, free_completed. */
  cr_expect_eq(oldest(p, 6)->action, MP__H_FREE_COMPLETED);
  cr_expect_eq(oldest(p, 5)->action, MP__H_FREE_REQUESTED);
  cr_expect_eq(oldest(p, 4)->action, MP__H_ALLOC);
  cr_expect_eq(oldest(p, 4)->size, 5120);
  cr_expect_eq(oldest(p, 4)->addr, (uintptr_t)last);
  cr_expect_eq(oldest(p, 3)->action, MP__H_FREE_COMPLETED);
  cr_expect_eq(oldest(p, 1)->action, MP__H_ALLOC);
  cr_expect_eq(oldest(p, 1)->size, 4608);
  mp_pool_destroy(p);
}

Test(pool_history, stacks_only_with_history_stacks) {
  mp_pool_t *plain = make_pool("max_bytes=8M,history=16");
  mp_pool_t *deep = make_pool("max_bytes=8M,history=16,history_stacks=1");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(plain, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(deep, 4096, NULL, &b), MP_OK);
  cr_expect_null(plain->hist.frames);
  for (size_t i = 0; i < plain->hist.total; i++)
    cr_expect_eq(oldest(plain, i)->nframes, 0);
  cr_assert_not_null(deep->hist.frames);
  const mp__hevent_t *e = oldest(deep, deep->hist.total - 1);
  cr_assert_eq(e->action, MP__H_ALLOC);
  cr_expect_gt(e->nframes, 0);
  cr_expect_leq(e->nframes, MP__HIST_FRAMES);
  mp_pool_free(plain, a);
  mp_pool_free(deep, b);
  mp_pool_destroy(plain);
  mp_pool_destroy(deep);
}

/* The dynamic symbol a recorded return address lies in ("" when none). */
static const char *frame_symbol(const mp_pool_t *p, const mp__hevent_t *e,
                                unsigned k) {
  size_t i = (size_t)(e - p->hist.ev);
  Dl_info di;
  void *pc = p->hist.frames[i * MP__HIST_FRAMES + k];
  if (dladdr(pc, &di) == 0 || di.dli_sname == NULL)
    return "";
  return di.dli_sname;
}

/* Not static, and the executable exports its symbols (ENABLE_EXPORTS in
 * tests/CMakeLists.txt), so dladdr names them; the asserts after the calls
 * keep them from being tail calls. */
__attribute__((noinline)) void history_caller_allocates(mp_pool_t *p,
                                                        void **out) {
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, out), MP_OK);
}

__attribute__((noinline)) void history_caller_frees(mp_pool_t *p, void *ptr) {
  cr_assert_eq(mp_pool_free(p, ptr), MP_OK);
}

Test(pool_history, a_stack_starts_at_the_pools_caller) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=16,history_stacks=1");
  void *a;
  history_caller_allocates(p, &a);
  /* The first growth (segment_map or segment_alloc) and the alloc: both
   * made inside mp_pool_alloc, both start at its caller. */
  cr_assert_geq(p->hist.total, 2);
  for (size_t i = 0; i < p->hist.total; i++) {
    const mp__hevent_t *e = oldest(p, i);
    cr_assert_gt(e->nframes, 0);
    cr_expect_str_eq(frame_symbol(p, e, 0), "history_caller_allocates",
                     "event %zu (action %u)", i, e->action);
  }
  size_t before = p->hist.total;
  history_caller_frees(p, a);
  cr_assert_eq(p->hist.total, before + 2);
  const mp__hevent_t *e = oldest(p, before);
  cr_assert_eq(e->action, MP__H_FREE_REQUESTED);
  cr_expect_str_eq(frame_symbol(p, e, 0), "history_caller_frees");
  mp_pool_destroy(p);
}

__attribute__((noinline)) void history_caller_frees_a_handle(mp_handle_t *h) {
  cr_assert_eq(mp_handle_free(h), MP_OK);
}

/* mp_handle_free marks its caller as mp_pool_free does: the free of a
 * movable block starts its stack at the pool's caller. Failed before: the
 * entry point set no mark, the events kept the library's own frames
 * (mp_handle_free and the free under it) above the caller. */
Test(pool_history, a_handle_free_stack_starts_at_the_pools_caller) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=16,history_stacks=1");
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(p, 4096, NULL, &h), MP_OK, "%s",
               mp_last_error());
  /* Another caller's mark, left on this thread: not the one the free's
   * events may start at. */
  void *a;
  history_caller_allocates(p, &a);
  size_t before = p->hist.total;
  history_caller_frees_a_handle(h);
  cr_assert_eq(p->hist.total, before + 2);
  for (size_t i = before; i < before + 2; i++) {
    const mp__hevent_t *e = oldest(p, i);
    cr_assert_eq(e->action,
                 i == before ? MP__H_FREE_REQUESTED : MP__H_FREE_COMPLETED);
    cr_assert_gt(e->nframes, 0);
    cr_expect_str_eq(frame_symbol(p, e, 0), "history_caller_frees_a_handle",
                     "event %zu (action %u) starts at %s", i, e->action,
                     frame_symbol(p, e, 0));
  }
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  mp_pool_destroy(p);
}

__attribute__((noinline)) void history_caller_makes_a_child(mp_pool_t *p,
                                                            mp_pool_t **out) {
  cr_assert_eq(mp_pool_create_child(p, 4 << 20, out), MP_OK, "%s",
               mp_last_error());
}

__attribute__((noinline)) void history_caller_destroys_a_child(mp_pool_t *c) {
  cr_assert_eq(mp_pool_destroy(c), MP_OK, "%s", mp_last_error());
}

/* Expects event e of p to be (action, addr, size) with a stack starting at
 * the function named caller. */
static void expect_event(const mp_pool_t *p, const mp__hevent_t *e,
                         unsigned action, uintptr_t addr, size_t size,
                         const char *caller) {
  cr_expect_eq(e->action, action, "action %u, not %u", e->action, action);
  cr_expect_eq(e->addr, addr, "addr %#lx, not %#lx", (unsigned long)e->addr,
               (unsigned long)addr);
  cr_expect_eq(e->size, size, "size %zu, not %zu", e->size, size);
  cr_assert_gt(e->nframes, 0, "action %u: no stack", e->action);
  cr_expect_str_eq(frame_symbol(p, e, 0), caller,
                   "action %u starts at %s, not %s", e->action,
                   frame_symbol(p, e, 0), caller);
}

/* A child pool's trace starts with a segment_alloc of its range, as a
 * pool's starts with its first growth and a graph pool's with each range
 * it borrows: memory_viz's segment timeline and a reserved curve summed
 * from segment events see the child's memory appear. The parent's trace
 * allocates the range at create and frees it at destroy, each with the
 * stack of the call's caller. Failed before: the child's trace had no
 * segment event (its reserved memory came from nowhere), and the parent's
 * events kept the library's frames above the caller in a build where
 * they are not inlined. */
Test(pool_history, a_child_pools_trace_starts_with_its_segment) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=64,history_stacks=1");
  mp_pool_t *c = NULL;
  history_caller_makes_a_child(p, &c);
  mp_stats_t cs;
  cr_assert_eq(mp_pool_get_stats(c, &cs), MP_OK);
  uintptr_t base = c->segs->base;
  cr_assert_eq(c->hist.total, 1, "%llu events in the new child",
               (unsigned long long)c->hist.total);
  expect_event(c, oldest(c, 0), MP__H_SEGMENT_ALLOC, base, cs.reserved_bytes,
               "history_caller_makes_a_child");
  expect_event(p, oldest(p, p->hist.total - 1), MP__H_ALLOC, base,
               cs.reserved_bytes, "history_caller_makes_a_child");
  /* The child's own blocks come after, inside the segment. */
  void *a;
  cr_assert_eq(mp_pool_alloc(c, 4096, NULL, &a), MP_OK);
  cr_expect_eq(oldest(c, 1)->action, MP__H_ALLOC);
  cr_expect(oldest(c, 1)->addr >= base &&
                oldest(c, 1)->addr < base + cs.reserved_bytes,
            "the block lies outside the segment");
  cr_expect_leq(oldest(c, 0)->time_us, oldest(c, 1)->time_us);
  cr_assert_eq(mp_pool_free(c, a), MP_OK);
  /* Its snapshot: the one segment and its segment_alloc. */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_snapshot_file(c, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  cr_expect_not_null(memmem(buf, len, "segment_alloc", 13));
  free(buf);
  size_t before = p->hist.total;
  history_caller_destroys_a_child(c);
  cr_assert_eq(p->hist.total, before + 2);
  expect_event(p, oldest(p, before), MP__H_FREE_REQUESTED, base,
               cs.reserved_bytes, "history_caller_destroys_a_child");
  expect_event(p, oldest(p, before + 1), MP__H_FREE_COMPLETED, base,
               cs.reserved_bytes, "history_caller_destroys_a_child");
  mp_pool_destroy(p);
}

/* Without stacks too, and from a child of a child. */
Test(pool_history, a_grandchild_pools_trace_starts_with_its_segment) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=8");
  mp_pool_t *c, *g;
  cr_assert_eq(mp_pool_create_child(p, 8 << 20, &c), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_create_child(c, 2 << 20, &g), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(g->hist.total, 1);
  const mp__hevent_t *e = oldest(g, 0);
  cr_expect_eq(e->action, MP__H_SEGMENT_ALLOC);
  cr_expect_eq(e->addr, g->segs->base);
  cr_expect_eq(e->size, g->segs->size);
  cr_expect_eq(e->nframes, 0);
  /* In the middle child, the grandchild's range is a block. */
  cr_expect_eq(oldest(c, 0)->action, MP__H_SEGMENT_ALLOC);
  cr_expect_eq(oldest(c, 1)->action, MP__H_ALLOC);
  cr_expect_eq(oldest(c, 1)->addr, g->segs->base);
  cr_assert_eq(mp_pool_destroy(g), MP_OK);
  cr_assert_eq(mp_pool_destroy(c), MP_OK);
  mp_pool_destroy(p);
}

__attribute__((noinline)) void history_caller_defragments(mp_pool_t *p) {
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(p, NULL, &moved), MP_OK, "%s",
               mp_last_error());
  cr_assert_gt(moved, 0, "the test needs a block moved");
}

__attribute__((noinline)) void history_caller_pauses(mp_pool_t *p) {
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_resumes(mp_pool_t *p) {
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_releases_a_graph(mp_pool_t *g) {
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
}

/* A graph pool of p holding one range of p (its block allocated through
 * a capture on *s, made here, and freed): its release gives the range
 * back. */
static mp_pool_t *graph_with_a_range(mp_pool_t *p, mp_stream_t *s) {
  mp_pool_t *g;
  void *x;
  cr_assert_eq(mp_stream_create(dev, s), MP_OK);
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(p, g, *s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, *s, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(p, *s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s", mp_last_error());
  return g;
}

/* The other entry points that record events mark their caller too: a
 * defragmentation's moves (a free and an alloc each), a pause's
 * segment_unmap and a resume's segment_map events, and a graph pool's
 * release (its ranges freed in the parent). */
Test(pool_history, other_entry_points_mark_their_caller) {
  mp_pool_t *p =
      make_pool("max_bytes=16M,history=64,history_stacks=1,virtual=1");
  void *a;
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, 1 << 20, NULL, &h), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  struct {
    void (*call)(mp_pool_t *);
    const char *name;
  } calls[] = {{history_caller_defragments, "history_caller_defragments"},
               {history_caller_pauses, "history_caller_pauses"},
               {history_caller_resumes, "history_caller_resumes"}};
  for (size_t k = 0; k < 3; k++) {
    size_t before = p->hist.total;
    calls[k].call(p);
    cr_assert_gt(p->hist.total, before, "%s recorded nothing", calls[k].name);
    cr_assert_leq(p->hist.total, p->hist.cap, "the ring wrapped");
    for (size_t i = before; i < p->hist.total; i++) {
      const mp__hevent_t *e = oldest(p, i);
      cr_assert_gt(e->nframes, 0);
      cr_expect_str_eq(frame_symbol(p, e, 0), calls[k].name,
                       "event %zu (action %u) starts at %s", i, e->action,
                       frame_symbol(p, e, 0));
    }
  }
  mp_stream_t s;
  mp_pool_t *g = graph_with_a_range(p, &s);
  size_t before = p->hist.total;
  history_caller_releases_a_graph(g);
  cr_assert_gt(p->hist.total, before, "the release freed no range");
  cr_assert_leq(p->hist.total, p->hist.cap, "the ring wrapped");
  for (size_t i = before; i < p->hist.total; i++) {
    const mp__hevent_t *e = oldest(p, i);
    cr_expect(e->action == MP__H_FREE_REQUESTED ||
                  e->action == MP__H_FREE_COMPLETED,
              "action %u", e->action);
    cr_assert_gt(e->nframes, 0);
    cr_expect_str_eq(frame_symbol(p, e, 0), "history_caller_releases_a_graph",
                     "event %zu (action %u) starts at %s", i, e->action,
                     frame_symbol(p, e, 0));
  }
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  mp_pool_destroy(p);
}

/* Expects every event of p from the before-th oldest on to start its
 * stack at the function named caller; at least one there. */
static void expect_caller_since(const mp_pool_t *p, size_t before,
                                const char *caller) {
  cr_assert_gt(p->hist.total, before, "%s recorded nothing", caller);
  cr_assert_leq(p->hist.total, p->hist.cap, "the ring wrapped");
  for (size_t i = before; i < p->hist.total; i++) {
    const mp__hevent_t *e = oldest(p, i);
    cr_assert_gt(e->nframes, 0);
    cr_expect_str_eq(frame_symbol(p, e, 0), caller,
                     "event %zu (action %u) starts at %s, not %s", i, e->action,
                     frame_symbol(p, e, 0), caller);
  }
}

__attribute__((noinline)) void history_caller_destroys_a_graph(mp_pool_t *g) {
  cr_assert_eq(mp_pool_destroy(g), MP_OK, "%s", mp_last_error());
}

/* A graph pool destroyed without a release first: its ranges go back to
 * the parent with the stack of mp_pool_destroy's caller. Failed before:
 * the destroy's release went through the public mp_pool_graph_release,
 * whose mark (its own return address, inside mp_pool_destroy) replaced
 * the destroy's, so the frees started at the library's frame. */
Test(pool_history, destroying_a_graph_pool_marks_its_caller) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=64,history_stacks=1");
  mp_stream_t s;
  mp_pool_t *g = graph_with_a_range(p, &s);
  size_t before = p->hist.total;
  history_caller_destroys_a_graph(g);
  expect_caller_since(p, before, "history_caller_destroys_a_graph");
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_pool_destroy(p);
}

__attribute__((noinline)) void history_caller_exports(mp_pool_t *p, void *ptr,
                                                      mp_ipc_handle_t *h) {
  cr_assert_eq(mp_pool_ipc_export(p, ptr, h), MP_OK, "%s", mp_last_error());
}

/* An export that reaps a lease let go (mp_pool_ipc_export polls its
 * leases, since bfc34c4) and so frees a held block: its free events start
 * their stacks at the export's caller. Failed before: the export set no
 * mark, so they started where the last entry point's caller had (a stale
 * mark: a fixed count of frames dropped, the library's own frames kept). */
Test(pool_history, an_export_that_reaps_marks_its_caller) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=64,history_stacks=1");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, NULL, &b), MP_OK);
  mp_ipc_handle_t ha, hb;
  cr_assert_eq(mp_pool_ipc_export(p, a, &ha), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, a), MP_OK); /* held: ha's lease is open */
  cr_assert_eq(mp_ipc_handle_close(&ha), MP_OK);
  size_t before = p->hist.total;
  history_caller_exports(p, b, &hb);
  expect_caller_since(p, before, "history_caller_exports");
  cr_assert_eq(mp_ipc_handle_close(&hb), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  mp_pool_destroy(p);
}

/* The library's own entry points over the pools (the allocator interface,
 * PyTorch's hooks, mp_malloc and its kin) mark their caller, the user's
 * code, as the pool's entry points do: an event made under one starts its
 * stack there, not at the wrapper's frame. Failed before in a build
 * without tail calls (Debug): the wrapper called a public entry point,
 * whose mark (its own return address) named the wrapper; mp_torch_malloc,
 * mp_torch_release_pool and mp_torch_reset in every build, and
 * mp_free_async set no mark at all (its frees started inside the pool). */
__attribute__((noinline)) void
history_caller_allocates_through_an_allocator(mp_allocator_t *a, void **out) {
  cr_assert_eq(mp_allocator_alloc(a, 4096, NULL, out), MP_OK, "%s",
               mp_last_error());
}

__attribute__((noinline)) void
history_caller_frees_through_an_allocator(mp_allocator_t *a, void *ptr) {
  cr_assert_eq(mp_allocator_free(a, ptr), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void
history_caller_releases_an_allocator(mp_allocator_t *a) {
  cr_assert_eq(mp_allocator_release(a), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void
history_caller_makes_a_child_allocator(const char *spec, mp_allocator_t **a) {
  cr_assert_eq(mp_allocator_create(dev, spec, a), MP_OK, "%s", mp_last_error());
}

/* Allocates, frees and releases through a; every event of a's pool from
 * before on starts at the function that made it. */
static void allocator_calls_mark_their_caller(mp_allocator_t *a,
                                              size_t before) {
  const mp_pool_t *p = mp_allocator_pool(a);
  void *x;
  history_caller_allocates_through_an_allocator(a, &x);
  expect_caller_since(p, before,
                      "history_caller_allocates_through_an_allocator");
  before = p->hist.total;
  history_caller_frees_through_an_allocator(a, x);
  expect_caller_since(p, before, "history_caller_frees_through_an_allocator");
}

Test(pool_history, the_allocator_interface_marks_its_caller) {
  unsetenv("MEMPOOL_CONF");
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_create(
                   dev, "pool:max_bytes=16M,history=64,history_stacks=1", &a),
               MP_OK, "%s", mp_last_error());
  allocator_calls_mark_their_caller(a, 0);
  /* The trim's segment_free or segment_unmap events. */
  const mp_pool_t *p = mp_allocator_pool(a);
  size_t before = p->hist.total;
  history_caller_releases_an_allocator(a);
  expect_caller_since(p, before, "history_caller_releases_an_allocator");
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s", mp_last_error());
  /* A child allocator: its pool's trace starts with the range, made by
   * mp_allocator_create. */
  history_caller_makes_a_child_allocator(
      "child:bytes=8M,max_bytes=16M,history=64,history_stacks=1", &a);
  expect_caller_since(mp_allocator_pool(a), 0,
                      "history_caller_makes_a_child_allocator");
  allocator_calls_mark_their_caller(a, mp_allocator_pool(a)->hist.total);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s", mp_last_error());
}

/* The default pool on the host device, with stacks. */
static mp_pool_t *default_pool_with_stacks(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  setenv("MEMPOOL_CONF", "history=256,history_stacks=1", 1);
  mp_pool_t *p = mp_default_pool();
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_not_null(p->hist.frames);
  return p;
}

__attribute__((noinline)) void *history_caller_mallocs(size_t bytes) {
  void *x = NULL;
  cr_assert_eq(mp_malloc(&x, bytes), MP_OK, "%s", mp_last_error());
  return x;
}

__attribute__((noinline)) void *history_caller_mallocs_async(size_t bytes) {
  void *x = NULL;
  cr_assert_eq(mp_malloc_async(&x, bytes, NULL), MP_OK, "%s", mp_last_error());
  return x;
}

__attribute__((noinline)) void history_caller_frees_async(void *x) {
  cr_assert_eq(mp_free_async(x, NULL), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_frees_by_mp_free(void *x) {
  cr_assert_eq(mp_free(x), MP_OK, "%s", mp_last_error());
}

Test(pool_history, mp_malloc_and_its_kin_mark_their_caller) {
  mp_pool_t *p = default_pool_with_stacks();
  size_t before = p->hist.total;
  void *x = history_caller_mallocs(MiB_BYTES);
  expect_caller_since(p, before, "history_caller_mallocs");
  before = p->hist.total;
  void *y = history_caller_mallocs_async(MiB_BYTES);
  expect_caller_since(p, before, "history_caller_mallocs_async");
  before = p->hist.total;
  history_caller_frees_async(x);
  expect_caller_since(p, before, "history_caller_frees_async");
  before = p->hist.total;
  history_caller_frees_by_mp_free(y);
  expect_caller_since(p, before, "history_caller_frees_by_mp_free");
}

__attribute__((noinline)) void *history_caller_torch_mallocs(mp_stream_t s) {
  void *x = mp_torch_malloc((ssize_t)MiB_BYTES, 0, s);
  cr_assert_not_null(x, "%s", mp_last_error());
  return x;
}

__attribute__((noinline)) void history_caller_torch_frees(void *x,
                                                          mp_stream_t s) {
  mp_torch_free(x, (ssize_t)MiB_BYTES, 0, s);
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void
history_caller_torch_releases(mp_torch_pool_id_t id) {
  mp_torch_release_pool(0, id);
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_torch_resets(void) {
  mp_torch_reset();
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

static int the_captured_stream(mp_stream_t s, void *ctx) {
  return s == *(mp_stream_t *)ctx;
}

/* PyTorch's hooks: a tensor's allocation and free, in the pool and in a
 * capture's graph pool (the range it borrows is an allocation of the
 * pool's), the graph pool's release (its range freed in the pool) and the
 * reset's trim. */
Test(pool_history, the_torch_hooks_mark_their_caller) {
  mp_pool_t *p = default_pool_with_stacks();
  size_t before = p->hist.total;
  void *x = history_caller_torch_mallocs(NULL);
  expect_caller_since(p, before, "history_caller_torch_mallocs");
  before = p->hist.total;
  history_caller_torch_frees(x, NULL);
  expect_caller_since(p, before, "history_caller_torch_frees");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(mp_pool_device(p), &s), MP_OK);
  mp_torch_pool_id_t id = {0, 1};
  mp_torch_begin_allocate_to_pool(0, id, the_captured_stream, &s, NULL);
  before = p->hist.total;
  x = history_caller_torch_mallocs(s);
  mp_pool_t *g = mp_pool_graph_of(p, s);
  cr_assert_not_null(g);
  expect_caller_since(p, before, "history_caller_torch_mallocs");
  expect_caller_since(g, 0, "history_caller_torch_mallocs");
  size_t gbefore = g->hist.total;
  history_caller_torch_frees(x, s);
  expect_caller_since(g, gbefore, "history_caller_torch_frees");
  mp_torch_end_allocate_to_pool(0, id);
  before = p->hist.total;
  history_caller_torch_releases(id);
  expect_caller_since(p, before, "history_caller_torch_releases");
  before = p->hist.total;
  history_caller_torch_resets();
  expect_caller_since(p, before, "history_caller_torch_resets");
  cr_assert_eq(mp_stream_destroy(mp_pool_device(p), s), MP_OK);
}

/* A frame whose symbol is longer than the snapshot's name buffer (C++
 * template names often are): shortened in its middle, so the tail and the
 * offset after it stay. Failed before: the name was cut at 511 bytes and
 * lost its end and its "+0x" offset. */
__attribute__((noinline)) void
history_caller_with_a_name_longer_than_a_frame_name_buffer_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_whose_tail_stays(
    mp_pool_t *p, void **out) {
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, out), MP_OK);
}

Test(pool_history, a_long_frame_name_keeps_its_tail_and_offset) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=16,history_stacks=1");
  void *a;
  history_caller_with_a_name_longer_than_a_frame_name_buffer_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx_whose_tail_stays(
      p, &a);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_snapshot_file(p, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  const char want[] = "_whose_tail_stays+0x";
  cr_expect_not_null(memmem(buf, len, want, sizeof want - 1),
                     "no frame name ends in '%s'", want);
  cr_expect_not_null(memmem(buf, len, "history_caller_with_a_name", 26));
  free(buf);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  mp_pool_destroy(p);
}

/* A block live through a pause and resume: the resume records an alloc
 * of it (memory_viz needs one after the segment_map, pause.c), with the
 * resume's stack; the snapshot's block keeps the frames of its own alloc
 * (the segments come before device_traces in the pickle, every string
 * written out). Before: the block's frames were the resume's. */
Test(pool_history, a_resumed_block_keeps_the_frames_of_its_own_alloc) {
  mp_pool_t *p = make_pool("history=64,history_stacks=1");
  void *a;
  history_caller_allocates(p, &a);
  history_caller_pauses(p);
  history_caller_resumes(p);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_snapshot_file(p, f), MP_OK, "%s", mp_last_error());
  fclose(f);
  const char *traces = memmem(buf, len, "device_traces", 13);
  cr_assert_not_null(traces);
  size_t seglen = (size_t)(traces - buf);
  cr_expect_not_null(memmem(buf, seglen, "history_caller_allocates", 24),
                     "the block lost its own alloc's frames");
  cr_expect_null(memmem(buf, seglen, "history_caller_resumes", 22),
                 "the block has the resume's frames");
  /* The trace still says who mapped and allocated at the resume. */
  cr_expect_not_null(
      memmem(traces, len - seglen, "history_caller_resumes", 22));
  free(buf);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  mp_pool_destroy(p);
}

/* An event recorded where no entry point marked a caller (the library's
 * own paths): the stack drops only the history's own frames
 * (MP__HIST_SKIP) and starts at the code that recorded it. */
__attribute__((noinline)) void history_records_unmarked(mp_pool_t *p) {
  mp__pool_lock(p);
  mp__history_record(p, MP__H_ALLOC, 0x1000, 1, 0);
  mp__pool_unlock(p);
  cr_assert_eq(p->hist.total, 1); /* not a tail call */
}

Test(pool_history, an_unmarked_event_starts_below_the_historys_frames) {
  mp_pool_t *p = make_pool("history=4,history_stacks=1");
  mp__hist_caller = NULL;
  history_records_unmarked(p);
  const mp__hevent_t *e = oldest(p, 0);
  cr_assert_gt(e->nframes, 0);
  /* Failed with one frame too few dropped (the stamp's own, 2026-12-01):
   * the first frame was mp__history_record's, which dladdr cannot name. */
  cr_expect_str_eq(frame_symbol(p, e, 0), "history_records_unmarked");
  mp_pool_destroy(p);
}

Test(pool_history, an_oom_is_an_event) {
  mp_pool_t *p = make_pool("max_bytes=4M,history=8");
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(p, (size_t)64 << 20, NULL, &a), MP_ELIMIT);
  const mp__hevent_t *e = oldest(p, p->hist.total - 1);
  cr_expect_eq(e->action, MP__H_OOM);
  cr_expect_eq(e->size, (size_t)64 << 20);
  mp_pool_destroy(p);
}

/* On the stream the request named, as PyTorch's trace records an oom
 * (its TraceEntry carries the allocation's stream): the history recorded
 * 0 for every one. Past the cap, past what a size can round to, and a
 * contiguous request, each on its stream; then with a handler that
 * declines, whose answer the event waits for. */
static int decline(mp_pool_t *pool, size_t bytes, mp_status_t why, void *ctx) {
  (void)pool, (void)bytes, (void)why, (void)ctx;
  return 0;
}

Test(pool_history, an_oom_is_an_event_on_the_requests_stream) {
  mp_pool_t *p = make_pool("max_bytes=4M,history=16");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(p, (size_t)64 << 20, s, &a), MP_ELIMIT);
  cr_expect_eq(oldest(p, p->hist.total - 1)->stream, (uintptr_t)s);
  cr_assert_eq(mp_pool_alloc(p, SIZE_MAX, s, &a), MP_ELIMIT);
  cr_expect_eq(oldest(p, p->hist.total - 1)->stream, (uintptr_t)s);
  void *ptrs[2];
  size_t sizes[2] = {(size_t)3 << 20, (size_t)3 << 20};
  cr_assert_eq(mp_pool_alloc_contiguous(p, 2, sizes, s, ptrs), MP_ELIMIT);
  cr_expect_eq(oldest(p, p->hist.total - 1)->action, MP__H_OOM);
  cr_expect_eq(oldest(p, p->hist.total - 1)->stream, (uintptr_t)s);
  cr_assert_eq(mp_pool_set_oom_handler(p, decline, NULL), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, (size_t)64 << 20, s, &a), MP_ELIMIT);
  cr_expect_eq(oldest(p, p->hist.total - 1)->action, MP__H_OOM);
  cr_expect_eq(oldest(p, p->hist.total - 1)->stream, (uintptr_t)s);
  mp_pool_destroy(p);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(pool_history, bad_options_are_refused_and_change_nothing) {
  unsetenv("MEMPOOL_CONF");
  const char *bad[] = {"history=-1", "history=abc", "history=16777217",
                       "history=", "history_stacks=maybe"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_pool_config_t c, before;
    mp_pool_config_init(&c);
    before = c;
    cr_expect_eq(mp_pool_config_parse(&c, bad[i]), MP_EINVAL, "%s", bad[i]);
    cr_expect_not_null(strstr(mp_last_error(), "history"), "%s: %s", bad[i],
                       mp_last_error());
    cr_expect_eq(memcmp(&c, &before, sizeof c), 0, "%s", bad[i]);
  }
  /* Stacks without a history, or a history above the limit, at create. */
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "history_stacks=1"), MP_OK);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect_null(p);
  cr_expect_not_null(strstr(mp_last_error(), "history_stacks"));
  mp_pool_config_init(&c);
  c.history = MP__HIST_MAX + 1;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect_null(p);
}

Test(pool_history, snapshot_bad_paths_fail_and_leave_nothing) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=8");
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &a), MP_OK);
  uint64_t total = p->hist.total;
  cr_expect_eq(mp_pool_snapshot(p, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_snapshot(p, ""), MP_EINVAL);
  cr_expect_eq(mp_pool_snapshot(NULL, "/tmp/x.pickle"), MP_EINVAL);
  cr_expect_eq(mp_pool_snapshot_file(p, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_snapshot(p, "/nonexistent-dir/snap.pickle"), MP_EIO);
  cr_expect_not_null(strstr(mp_last_error(), "/nonexistent-dir/snap.pickle"),
                     "%s", mp_last_error());
  FILE *full = fopen("/dev/full", "wb");
  if (full != NULL) {
    cr_expect_eq(mp_pool_snapshot_file(p, full), MP_EIO);
    fclose(full);
  }
  /* The pool is as it was: same events, the block still live. */
  cr_expect_eq(p->hist.total, total);
  cr_expect_eq(mp__map_count(p), 1);
  cr_expect_eq(mp_pool_check(p), MP_OK);
  mp_pool_free(p, a);
  mp_pool_destroy(p);
}

Test(pool_history, snapshot_replaces_a_file_whole) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=8");
  char dir[] = "/tmp/mp_snap_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/s.pickle", dir);
  FILE *f = fopen(path, "wb");
  fputs("old", f);
  fclose(f);
  cr_assert_eq(mp_pool_snapshot(p, path), MP_OK, "%s", mp_last_error());
  f = fopen(path, "rb");
  unsigned char head[2] = {0};
  cr_assert_eq(fread(head, 1, 2, f), 2);
  fseek(f, -1, SEEK_END);
  int stop = fgetc(f);
  fclose(f);
  cr_expect_eq(head[0], 0x80); /* PROTO */
  cr_expect_eq(head[1], 2);
  cr_expect_eq(stop, '.'); /* STOP */
  unlink(path);
  cr_expect_eq(rmdir(dir), 0, "the temporary was left behind");
  mp_pool_destroy(p);
}

/* The file gets the mode any new file gets (0666 less the umask), and one
 * it replaces keeps its own, as a write with fopen or Python's open would
 * leave them: the temporary came from mkstemp, and its 0600 stayed, so a
 * snapshot written for another user or a viewer's server (or over a
 * shared file) was readable by its owner only. */
Test(pool_history, snapshot_file_gets_a_new_files_mode_or_keeps_the_old) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=8");
  char dir[] = "/tmp/mp_snap_XXXXXX", path[64];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.pickle", dir);
  mode_t was = umask(022);
  mp_status_t st = mp_pool_snapshot(p, path);
  umask(was);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_expect_eq(sb.st_mode & 0777, 0644, "a new snapshot has mode %o",
               (unsigned)(sb.st_mode & 0777));
  cr_assert_eq(chmod(path, 0640), 0);
  cr_assert_eq(mp_pool_snapshot(p, path), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stat(path, &sb), 0);
  cr_expect_eq(sb.st_mode & 0777, 0640, "the replaced file's mode became %o",
               (unsigned)(sb.st_mode & 0777));
  unlink(path);
  cr_expect_eq(rmdir(dir), 0, "the temporary was left behind");
  mp_pool_destroy(p);
}

/* Reads a FIFO to its end: the first bytes into head. */
static void *drain_fifo(void *arg) {
  const char *path = arg;
  static unsigned char head[2];
  FILE *f = fopen(path, "rb");
  if (f == NULL || fread(head, 1, 2, f) != 2)
    return NULL;
  while (fgetc(f) != EOF)
    ;
  fclose(f);
  return head;
}

/* A path that is no regular file is never replaced: the temporary renamed
 * over it replaced a symbolic link by a file (the file it named untouched)
 * and a FIFO (or, with root's rights, a device node such as /dev/null) by
 * a regular file. A link's file is replaced whole, beside it
 * (test_pool_snapshot_paths.c); a FIFO is written. */
Test(pool_history, snapshot_writes_through_a_link_or_fifo_and_keeps_it,
     .timeout = 30) {
  mp_pool_t *p = make_pool("max_bytes=8M,history=8");
  char dir[] = "/tmp/mp_snap_XXXXXX", real[64], link[64], fifo[64];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(real, sizeof real, "%s/real.pickle", dir);
  snprintf(link, sizeof link, "%s/link.pickle", dir);
  snprintf(fifo, sizeof fifo, "%s/fifo.pickle", dir);
  FILE *f = fopen(real, "wb");
  fputs("old", f);
  fclose(f);
  cr_assert_eq(symlink("real.pickle", link), 0);
  cr_assert_eq(mp_pool_snapshot(p, link), MP_OK, "%s", mp_last_error());
  struct stat sb;
  cr_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  f = fopen(real, "rb");
  unsigned char head[2] = {0};
  cr_assert_eq(fread(head, 1, 2, f), 2);
  fclose(f);
  cr_expect(head[0] == 0x80 && head[1] == 2, "the file the link names");

  cr_assert_eq(mkfifo(fifo, 0600), 0);
  pthread_t reader;
  cr_assert_eq(pthread_create(&reader, NULL, drain_fifo, fifo), 0);
  cr_assert_eq(mp_pool_snapshot(p, fifo), MP_OK, "%s", mp_last_error());
  cr_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode),
            "the FIFO was replaced");
  void *got = NULL;
  pthread_join(reader, &got);
  cr_assert_not_null(got, "nothing came through the FIFO");
  cr_expect_eq(((unsigned char *)got)[0], 0x80);
  unlink(link);
  unlink(real);
  unlink(fifo);
  cr_expect_eq(rmdir(dir), 0, "a temporary was left behind");
  mp_pool_destroy(p);
}

/* A graph pool's segments carry an id of their own, as PyTorch gives a
 * private pool's segments its MempoolId_t ((0, n) for graph_pool_handle()),
 * and the pool's own segments (0, 0). A graph pool's segments said (0, 0)
 * too: a reader selecting a graph's memory by its id (as PyTorch's
 * cudagraph_trees does) took it for the default pool's. */
Test(pool_history, a_graph_pools_segments_carry_its_pool_id) {
  mp_pool_t *p = make_pool("max_bytes=32M,history=16");
  mp_pool_t *g[2];
  mp_stream_t s[2];
  void *x[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    cr_assert_eq(mp_pool_graph_create(p, &g[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_begin(p, g[i], s[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_alloc(p, 1 << 20, s[i], &x[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_graph_end(p, s[i]), MP_OK, "%s", mp_last_error());
  }
  uint64_t ids[8][2], gid[2] = {0, 0};
  size_t n = snapshot_pool_ids(p, ids, 8);
  cr_assert_gt(n, 0);
  for (size_t k = 0; k < n; k++)
    cr_expect(ids[k][0] == 0 && ids[k][1] == 0,
              "the pool's segment %zu: (%llu, %llu)", k,
              (unsigned long long)ids[k][0], (unsigned long long)ids[k][1]);
  for (int i = 0; i < 2; i++) {
    n = snapshot_pool_ids(g[i], ids, 8);
    cr_assert_gt(n, 0);
    gid[i] = ids[0][1];
    for (size_t k = 0; k < n; k++)
      cr_expect(ids[k][0] == 0 && ids[k][1] == gid[i],
                "graph %d, segment %zu: (%llu, %llu)", i, k,
                (unsigned long long)ids[k][0], (unsigned long long)ids[k][1]);
    cr_expect_neq(gid[i], 0, "graph %d's segments say (0, 0)", i);
  }
  cr_expect_neq(gid[0], gid[1], "two graph pools, one id");
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_free(p, x[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_release(g[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  }
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
}

typedef struct {
  mp_pool_t *pool;
  int pairs;
} churn_t;

static void *churn(void *arg) {
  churn_t *c = arg;
  for (int i = 0; i < c->pairs; i++) {
    void *p = NULL;
    if (mp_pool_alloc(c->pool, 512 * (size_t)(1 + i % 64), NULL, &p) != MP_OK ||
        mp_pool_free(c->pool, p) != MP_OK)
      return (void *)1;
  }
  return NULL;
}

Test(pool_history, threads_record_while_snapshots_are_written) {
  mp_pool_t *p = make_pool("max_bytes=32M,history=512,history_stacks=1");
  enum { NT = 4, PAIRS = 2000 };
  pthread_t t[NT];
  churn_t c = {p, PAIRS};
  for (int i = 0; i < NT; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, churn, &c), 0);
  FILE *sink = fopen("/dev/null", "wb");
  cr_assert_not_null(sink);
  for (int i = 0; i < 20; i++)
    cr_expect_eq(mp_pool_snapshot_file(p, sink), MP_OK, "%s", mp_last_error());
  fclose(sink);
  for (int i = 0; i < NT; i++) {
    void *r;
    pthread_join(t[i], &r);
    cr_expect_null(r);
  }
  /* Every pair is three events; growth adds segment events. */
  uint64_t blocks = 0;
  for (size_t i = 0; i < p->hist.cap; i++)
    blocks += oldest(p, i)->action <= MP__H_FREE_COMPLETED;
  cr_expect_geq(p->hist.total, (uint64_t)NT * PAIRS * 3);
  cr_expect_leq(p->hist.total - (uint64_t)NT * PAIRS * 3,
                p->st.device_alloc_count + p->st.device_free_count);
  cr_expect_geq(blocks, p->hist.cap - (p->st.device_alloc_count +
                                       p->st.device_free_count));
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  mp_pool_destroy(p);
}

/* ---- arenas (arenas=N): each arena's ring, the pool's caller ------------ */

__attribute__((noinline)) void history_caller_allocs_movable(mp_pool_t *p,
                                                             mp_handle_t **h) {
  cr_assert_eq(mp_pool_alloc_movable(p, 4096, NULL, h), MP_OK, "%s",
               mp_last_error());
}

__attribute__((noinline)) void history_caller_freezes(mp_pool_t *p) {
  cr_assert_eq(mp_pool_freeze(p), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_trims(mp_pool_t *p) {
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
}

__attribute__((noinline)) void history_caller_allocs_pieces(mp_pool_t *p,
                                                            void **out) {
  const size_t sizes[2] = {4096, 8192};
  cr_assert_eq(mp_pool_alloc_contiguous(p, 2, sizes, NULL, out), MP_OK, "%s",
               mp_last_error());
}

__attribute__((noinline)) void
history_caller_frees_on_a_stream(mp_pool_t *p, void *ptr, mp_stream_t s) {
  cr_assert_eq(mp_pool_free_async(p, ptr, s), MP_OK, "%s", mp_last_error());
}

/* Calls fn(...) and expects every event ring records meanwhile to start
 * its stack at fn; at least one there. */
#define EXPECT_MARKED(ring, fn, ...)                                           \
  do {                                                                         \
    size_t before_ = (ring)->hist.total;                                       \
    fn(__VA_ARGS__);                                                           \
    expect_caller_since((ring), before_, #fn);                                 \
  } while (0)

/* A movable block of p with a free block of its size below it, for a
 * defragmentation or a freeze to move it down. */
static mp_handle_t *movable_above_a_hole(mp_pool_t *p) {
  void *a;
  mp_handle_t *h;
  history_caller_allocates(p, &a);
  history_caller_allocs_movable(p, &h);
  cr_assert_gt((uintptr_t)mp_handle_ptr(h), (uintptr_t)a);
  history_caller_frees(p, a);
  return h;
}

/* With arenas the pool records nothing itself: the thread's arena keeps
 * the events, and every entry point that records marks its caller, as
 * without arenas. Refused at create before (history_stacks=1 with
 * arenas=N was MP_EINVAL). */
Test(pool_history, arenas_start_stacks_at_the_pools_caller) {
  mp_pool_t *p = make_pool(
      "max_bytes=16M,history=256,history_stacks=1,virtual=1,arenas=1");
  cr_expect_null(p->hist.ev, "the pool itself records nothing");
  void *a;
  history_caller_allocates(p, &a);
  mp_pool_t *arena = mp__arena_at(p, 0);
  cr_assert_not_null(arena);
  expect_caller_since(arena, 0, "history_caller_allocates");
  mp_handle_t *h = movable_above_a_hole(p);
  EXPECT_MARKED(arena, history_caller_defragments, p);
  EXPECT_MARKED(arena, history_caller_frees_a_handle, h);
  h = movable_above_a_hole(p);
  EXPECT_MARKED(arena, history_caller_freezes, p);
  history_caller_frees_a_handle(h);
  void *pieces[2];
  EXPECT_MARKED(arena, history_caller_allocs_pieces, p, pieces);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  EXPECT_MARKED(arena, history_caller_frees_on_a_stream, p, pieces[0], s);
  history_caller_frees(p, pieces[1]);
  EXPECT_MARKED(arena, history_caller_pauses, p);
  EXPECT_MARKED(arena, history_caller_resumes, p);
  mp_pool_t *c;
  EXPECT_MARKED(arena, history_caller_makes_a_child, p, &c);
  EXPECT_MARKED(arena, history_caller_destroys_a_child, c);
  history_caller_frees(p, a);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  EXPECT_MARKED(arena, history_caller_trims, p);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_pool_destroy(p);
}

static void *allocates_on_a_thread(void *arg) {
  void **x = arg;
  history_caller_allocates(*(mp_pool_t **)x, &x[1]);
  return NULL;
}

/* Another thread's arena: its events start at that thread's caller. */
Test(pool_history, each_threads_arena_starts_stacks_at_its_caller) {
  mp_pool_t *p = make_pool("max_bytes=16M,history=64,history_stacks=1,"
                           "arenas=2");
  void *x[2] = {p, NULL};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, allocates_on_a_thread, x), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  void *a;
  history_caller_allocates(p, &a);
  for (size_t i = 0; i < 2; i++) {
    mp_pool_t *arena = mp__arena_at(p, i);
    cr_assert_not_null(arena, "arena %zu made", i);
    expect_caller_since(arena, 0, "history_caller_allocates");
  }
  cr_assert_neq(x[1], NULL);
  history_caller_frees(p, x[1]);
  history_caller_frees(p, a);
  mp_pool_destroy(p);
}

/* mp_malloc and PyTorch's hooks on a default pool with arenas: they mark
 * their caller and the arena keeps it. */
Test(pool_history, the_drop_in_calls_mark_their_caller_on_arenas) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  setenv("MEMPOOL_CONF", "history=256,history_stacks=1,arenas=1", 1);
  mp_pool_t *p = mp_default_pool();
  cr_assert_not_null(p, "%s", mp_last_error());
  void *x = history_caller_mallocs(MiB_BYTES);
  mp_pool_t *arena = mp__arena_at(p, 0);
  cr_assert_not_null(arena);
  expect_caller_since(arena, 0, "history_caller_mallocs");
  size_t before = arena->hist.total;
  void *y = history_caller_torch_mallocs(NULL);
  expect_caller_since(arena, before, "history_caller_torch_mallocs");
  EXPECT_MARKED(arena, history_caller_torch_frees, y, NULL);
  EXPECT_MARKED(arena, history_caller_frees_by_mp_free, x);
}
