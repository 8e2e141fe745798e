/* The virtual range with holes, on the synchronous fake device: free chunks
 * are unmapped anywhere in the range (trim, and reclaim before growing past
 * the peak), blocks never span a hole, growth maps into a hole where that
 * completes a free block, and max_split holds in both modes; an unmap the
 * device refuses leaves no event in the history. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

static size_t holes_of(mp_pool_t *p) {
  return p->vseg ? p->vseg->nholes : 0;
}

/* A pool on a fake device with a 2 MiB granule, holding four 2 MiB blocks,
 * each exactly one 2 MiB chunk. */
static mp_pool_t *four_chunks(mp_device_t **dev, void *v[4]) {
  *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(*dev, NULL);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  for (int i = 1; i < 4; i++)
    cr_assert_eq((uintptr_t)v[i], (uintptr_t)v[i - 1] + 2 * MiB);
  cr_assert_eq(stats(p).reserved_bytes, 8 * MiB);
  return p;
}

Test(pool_holes, trim_unmaps_a_free_chunk_in_the_middle) {
  mp_device_t *dev;
  void *v[4];
  mp_pool_t *p = four_chunks(&dev, v);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 6 * MiB);
  cr_expect_eq(fake_of(dev)->unmaps, 1);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0);
  cr_expect_eq(fake_of(dev)->used, 6 * MiB);
  cr_expect_eq(holes_of(p), 1);
  check(p);
  /* The unmapped block is neither live nor free: its pointer is refused. */
  cr_expect_eq(mp_pool_free(p, v[1]), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "unmapped"), NULL, "%s",
                mp_last_error());
  fake_pool_finish(p, dev);
}

/* What another thread does while trim has the lock dropped for an unmap
 * (here the fake device's hook, on the same thread): L is freed, and P,
 * free below it, takes it in (L's record goes back to the pool), then a
 * 512 KiB request splits Z, the remainder getting that record. */
typedef struct {
  mp_pool_t *p;
  void *l, *small;
} window_t;

static void free_l_and_split_z(void *ctx) {
  window_t *w = ctx;
  cr_assert_eq(mp_pool_free(w->p, w->l), MP_OK);
  cr_assert_eq(mp_pool_alloc(w->p, MiB / 2, NULL, &w->small), MP_OK);
}

/* Trim walks down the range unmapping free chunks, dropping the lock for
 * each device call. Layout, 2 MiB chunks: [Z 1 MiB free | Y live] [Q free]
 * [X live] [P free] [L live] [F free] [T live]. While F's chunk is
 * unmapped, L is freed into P and Z is split (free_l_and_split_z). The walk
 * used to go on from L's old record, by then the remainder of Z elsewhere
 * in the range, and stop there; Q was reached only because trim walks the
 * range again while free memory is left (so this test passed then too).
 * It goes on from below F's hole now: past P (which L's free, still
 * pending, holds back) to Q, reading no record that was given back. */
Test(pool_holes, trim_goes_on_below_its_hole_whatever_changed_meanwhile) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  enum { Z, Y, Q, X, P, L, F, T, N };
  const size_t size[N] = {MiB,     MiB,     2 * MiB, 2 * MiB,
                          2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB};
  void *b[N];
  for (int i = 0; i < N; i++) {
    cr_assert_eq(mp_pool_alloc(p, size[i], NULL, &b[i]), MP_OK);
    if (i > 0)
      cr_assert_eq((char *)b[i], (char *)b[i - 1] + size[i - 1]);
  }
  cr_assert_eq(mp_pool_free(p, b[Z]), MP_OK);
  cr_assert_eq(mp_pool_free(p, b[Q]), MP_OK);
  cr_assert_eq(mp_pool_free(p, b[P]), MP_OK);
  cr_assert_eq(mp_pool_free(p, b[F]), MP_OK);
  window_t w = {p, b[L], NULL};
  fake_of(dev)->on_unmap = free_l_and_split_z;
  fake_of(dev)->on_unmap_ctx = &w;
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(w.small, b[Z], "the 512 KiB request did not split Z");
  cr_expect_eq(fake_of(dev)->unmaps, 2, "unmapped %u chunks",
               fake_of(dev)->unmaps);
  cr_expect_eq(stats(p).reserved_bytes, 10 * MiB);
  check(p);
  cr_assert_eq(mp_pool_free(p, w.small), MP_OK);
  for (int i = Y; i < N; i++)
    if (i != Q && i != P && i != L && i != F)
      cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_holes, free_blocks_never_coalesce_across_a_hole) {
  mp_device_t *dev;
  void *v[4];
  mp_pool_t *p = four_chunks(&dev, v);
  mp_pool_free(p, v[1]);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[2]);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.free_blocks, 2, "the hole keeps the two free blocks apart");
  cr_expect_eq(s.largest_free_bytes, 2 * MiB);
  check(p);
  /* Nothing free can serve 6 MiB without mapping: the blocks around the
   * hole are 2 and 4 MiB. Filling the hole completes one 8 MiB block. */
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, &x), MP_OK);
  cr_expect_eq(x, v[0]);
  cr_expect_eq(stats(p).reserved_bytes, 8 * MiB, "the hole was filled");
  cr_expect_eq(holes_of(p), 0);
  check(p);
  mp_pool_free(p, x);
  mp_pool_free(p, v[3]);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0);
  fake_pool_finish(p, dev);
}

Test(pool_holes, growth_maps_into_a_hole_next_to_a_free_block) {
  mp_device_t *dev;
  void *v[4];
  mp_pool_t *p = four_chunks(&dev, v);
  mp_pool_free(p, v[1]);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  mp_pool_free(p, v[2]); /* free, just above the hole */
  unsigned maps = fake_of(dev)->maps;
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK);
  cr_expect_eq(x, v[1], "2 MiB mapped at the hole's top completes v[2]");
  cr_expect_eq(fake_of(dev)->maps, maps + 1);
  cr_expect_eq(stats(p).reserved_bytes, 8 * MiB,
               "growing at the top would have needed 4 MiB more");
  check(p);
  mp_pool_free(p, x);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[3]);
  fake_pool_finish(p, dev);
}

/* The end of a four-block case whose v[1] went back and x came: checked,
 * the rest freed, the pool and device gone. */
static void finish_without_v1(mp_pool_t *p, mp_device_t *dev, void *v[4],
                              void *x) {
  check(p);
  for (int i = 0; i < 4; i++)
    if (i != 1)
      mp_pool_free(p, v[i]);
  mp_pool_free(p, x);
  fake_pool_finish(p, dev);
}

Test(pool_holes, growth_past_the_peak_reclaims_free_chunks_first) {
  mp_device_t *dev;
  void *v[4];
  mp_pool_t *p = four_chunks(&dev, v);
  mp_pool_free(p, v[1]);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(fake_of(dev)->unmaps, 1, "v[1]'s free chunk went back first");
  cr_expect_eq(s.reserved_bytes, 10 * MiB);
  cr_expect_eq(s.peak_reserved_bytes, 10 * MiB,
               "without the reclaim the peak would be 12 MiB");
  finish_without_v1(p, dev, v, x);
}

/* Growth maps a step (here segment_bytes, 4 MiB) where a request lacks
 * less, so that small requests do not map a granule each; but past the peak
 * while the pool holds a step's worth of free memory that is scattered
 * (at least a step, under an eighth of what it reserves), it maps only what
 * the request lacks: the step's slack would lift the peak by memory no
 * request asked for. Before, e's growth mapped 4 MiB (46 MiB reserved). */
Test(pool_holes,
     growth_past_the_peak_maps_no_step_while_free_memory_is_scattered) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "segment_bytes=4M");
  void *big, *a, *b, *c, *e;
  cr_assert_eq(mp_pool_alloc(p, 34 * MiB, NULL, &big), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 38 * MiB, "a's growth: the step");
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &b), MP_OK);
  cr_assert_eq((uintptr_t)b, (uintptr_t)a + 3 * MiB, "b fills a's chunk");
  cr_assert_eq(mp_pool_alloc(p, 5 * MiB / 2, NULL, &c), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 42 * MiB,
               "no free memory: growth for demand maps the step");
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* Free: a's 3 MiB between big and b, 1.5 MiB above c at the top; neither
   * holds 3.25 MiB, and the top block lacks 1.75 MiB of it. */
  unsigned maps = fake_of(dev)->maps;
  cr_assert_eq(mp_pool_alloc(p, 13 * MiB / 4, NULL, &e), MP_OK);
  cr_expect_eq((uintptr_t)e, (uintptr_t)c + 5 * MiB / 2, "at the top");
  cr_expect_eq(fake_of(dev)->maps, maps + 1);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 44 * MiB, "one granule, not the 4 MiB step");
  cr_expect_eq(s.peak_reserved_bytes, 44 * MiB);
  check(p);
  mp_pool_free(p, big);
  mp_pool_free(p, b);
  mp_pool_free(p, c);
  mp_pool_free(p, e);
  fake_pool_finish(p, dev);
}

/* The reclaim leaves a hole below and growth maps at the top, so a range
 * of the cap's size ran out before the memory did: on a 10 MiB device, v[1]'s
 * chunk went back and the 4 MiB growth found no room at the top of an
 * 10 MiB range (span 8 MiB). The range is twice the cap. */
Test(pool_holes, the_range_outlasts_the_holes_reclaim_leaves) {
  mp_device_t *dev = fake_open(10 * MiB, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  cr_expect_eq(p->cap, 10 * MiB);
  void *v[4], *x;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq((uintptr_t)x, (uintptr_t)v[3] + 2 * MiB, "mapped at the top");
  cr_expect_eq(p->vseg->va_size, 20 * MiB);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 10 * MiB);
  cr_expect_eq(p->vseg->size, 10 * MiB, "all of it in the range");
  finish_without_v1(p, dev, v, x);
}

/* On a 9 MiB device four 2 MiB chunks leave 1 MiB: a 1 MiB request needs
 * a whole 2 MiB granule of the range, more than the device has left, but
 * fits a plain segment of its own size. Before, the growth failed and so
 * did the allocation (MP_ENOMEM), with 1 MiB of the device unused. */
Test(pool_holes, a_request_whole_granules_cannot_fit_goes_plain) {
  mp_device_t *dev = fake_open(9 * MiB, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[4], *x;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 8 * MiB);
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->nplain, 1, "a plain segment");
  cr_expect_eq(fake_of(dev)->used, 9 * MiB);
  cr_expect_eq(stats(p).reserved_bytes, 9 * MiB);
  cr_expect_eq(p->vseg->size, 8 * MiB, "the range as it was");
  check(p);
  for (int i = 0; i < 4; i++)
    mp_pool_free(p, v[i]);
  mp_pool_free(p, x);
  fake_pool_finish(p, dev);
}

Test(pool_holes, trim_keeps_what_it_is_asked_to_keep_in_the_range) {
  mp_device_t *dev;
  void *v[4];
  mp_pool_t *p = four_chunks(&dev, v);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[2]);
  cr_assert_eq(mp_pool_trim(p, 2 * MiB), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.free_bytes, 2 * MiB);
  cr_expect_eq(s.reserved_bytes, 6 * MiB);
  check(p);
  mp_pool_free(p, v[1]);
  mp_pool_free(p, v[3]);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_expect_eq(holes_of(p), 0, "a range with nothing mapped has no hole");
  fake_pool_finish(p, dev);
}

static void max_split_holds(const char *opts, size_t granule) {
  mp_device_t *dev = fake_open((size_t)1 << 30, granule);
  mp_pool_t *p = make_pool(dev, opts);
  void *big, *small;
  cr_assert_eq(mp_pool_alloc(p, 16 * MiB, NULL, &big), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 1 * MiB, NULL, &small), MP_OK);
  cr_assert_eq(mp_pool_free(p, big), MP_OK);
  for (int i = 0; i < 8; i++) {
    void *x;
    cr_assert_eq(mp_pool_alloc(p, (size_t)3 * MiB / 2, NULL, &x), MP_OK);
    cr_expect(!((uintptr_t)x >= (uintptr_t)big &&
                (uintptr_t)x < (uintptr_t)big + 16 * MiB),
              "%s: a 1.5 MiB request split the free 16 MiB block", opts);
  }
  /* A request above max_split may take a block above it. */
  void *y;
  cr_assert_eq(mp_pool_alloc(p, 15 * MiB, NULL, &y), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_holes, max_split_is_honoured_in_the_virtual_range) {
  max_split_holds("max_split=4M", 2 * MiB);
}

Test(pool_holes, max_split_is_honoured_in_plain_segments) {
  max_split_holds("virtual=0,max_split=4M", 0);
}

/* The fake device, but its next vm_unmap fails (the chunk stays mapped):
 * fail_unmap counts the failures still to come. */
static unsigned fail_unmap;
static mp_status_t failing_vm_unmap(mp_device_t *dev, void *addr, size_t n) {
  if (fail_unmap > 0) {
    fail_unmap--;
    return MP_EDRIVER;
  }
  return fake_vm_unmap(dev, addr, n);
}

/* The fake device, calling on_map (then cleared) at its next vm_map: the
 * pool's lock is dropped there, so it may call the pool as another thread
 * would. */
static void (*on_map)(void *ctx);
static void *on_map_ctx;
static mp_status_t hooked_vm_map(mp_device_t *dev, void *addr, size_t n) {
  if (on_map != NULL) {
    void (*fn)(void *) = on_map;
    on_map = NULL;
    fn(on_map_ctx);
  }
  return fake_vm_map(dev, addr, n);
}

/* A fake device (2 MiB granule) with both hooks above. */
static mp_device_t *hooked_open(void) {
  static mp__backend_t ops;
  ops = fake_backend;
  ops.vm_map = hooked_vm_map;
  ops.vm_unmap = failing_vm_unmap;
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  dev->ops = &ops;
  return dev;
}

/* Growth past the peak places the new memory first (here in the hole H
 * above free block F, not joined to F: F is above max_split), then
 * reclaims, dropping the lock for each unmap. F's chunk, unmapped, took H
 * in and H's record went back to the pool; the unmap failed, and the chunk
 * came back as a free block in a record taken from the pool. The
 * reclaim gave nothing back, and growth went on with the placement it made
 * before, mapping into H through H's stale record: the pool's blocks no
 * longer tiled the range. Layout, cap 8 MiB, the range ended at its span
 * by hand (nothing fits above the top; the range is twice the cap):
 * [F free 4 MiB, one chunk] [H hole 2 MiB] [T live 2 MiB]. */
Test(pool_holes, growth_places_again_after_a_reclaim_that_failed) {
  mp_device_t *dev = hooked_open();
  mp_pool_t *p = make_pool(dev, "max_split=2M,segment_bytes=2M,max_bytes=8M");
  void *f, *h, *t, *x;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &f), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &h), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &t), MP_OK);
  cr_assert_eq((char *)h, (char *)f + 4 * MiB);
  cr_assert_eq((char *)t, (char *)h + 2 * MiB);
  cr_assert_eq(fake_of(dev)->maps, 3, "one chunk per block");
  cr_assert_eq(mp_pool_free(p, h), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(holes_of(p), 1);
  cr_assert_eq(mp_pool_free(p, f), MP_OK);
  cr_assert_eq(mp_pool_reset_peaks(p), MP_OK);
  cr_assert_eq(stats(p).peak_reserved_bytes, 6 * MiB);
  size_t va = p->vseg->va_size;
  p->vseg->va_size = p->vseg->span;
  fail_unmap = 1;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(fail_unmap, 0, "the reclaim tried to unmap F's chunk");
  cr_expect_eq(x, h, "mapped into the hole");
  check(p);
  p->vseg->va_size = va;
  cr_expect_eq(holes_of(p), 0);
  cr_expect_eq(stats(p).reserved_bytes, 8 * MiB);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_free(p, t), MP_OK);
  fake_pool_finish(p, dev);
}

/* Replays the history's segment events against the chunks they name: a
 * segment_map of a range not mapped, a segment_unmap of one mapped whole;
 * at the end the chunks the history leaves mapped are the device's. */
static void expect_segment_history_replays(const mp_pool_t *p,
                                           mp_device_t *dev) {
  struct {
    uintptr_t addr;
    size_t size;
  } m[16];
  size_t n = 0, bytes = 0;
  const mp__history_t *h = &p->hist;
  cr_assert_leq(h->total, h->cap, "the test reads a ring that did not wrap");
  for (size_t i = 0; i < h->total; i++) {
    const mp__hevent_t *e = &h->ev[i];
    if (e->action == MP__H_SEGMENT_MAP) {
      for (size_t k = 0; k < n; k++)
        cr_assert(
            e->addr + e->size <= m[k].addr || m[k].addr + m[k].size <= e->addr,
            "event %zu maps %#lx, mapped already", i, (unsigned long)e->addr);
      cr_assert_lt(n, 16);
      m[n].addr = e->addr;
      m[n++].size = e->size;
      bytes += e->size;
    } else if (e->action == MP__H_SEGMENT_UNMAP) {
      size_t k = 0;
      while (k < n && !(m[k].addr == e->addr && m[k].size == e->size))
        k++;
      cr_assert_lt(k, n, "event %zu unmaps %#lx, not mapped", i,
                   (unsigned long)e->addr);
      bytes -= e->size;
      m[k] = m[--n];
    }
  }
  cr_expect_eq(n, fake_of(dev)->nmap, "chunks: history %zu, device %zu", n,
               fake_of(dev)->nmap);
  cr_expect_eq(bytes, fake_of(dev)->used, "bytes: history %zu, device %zu",
               bytes, fake_of(dev)->used);
}

/* An unmap the device refuses is undone: the chunk stays where it was, a
 * free block again. The undo went through the bookkeeping of a map, which
 * recorded a segment_map event: the history (a snapshot's trace) mapped
 * the chunk twice, with no unmap between, so a replay of it held a chunk
 * more than the pool (and, once trim did unmap it, one chunk all the
 * same). No event now: nothing happened on the device. */
Test(pool_holes, an_unmap_that_failed_is_no_history_event) {
  mp_device_t *dev = hooked_open();
  mp_pool_t *p = make_pool(dev, "segment_bytes=2M,history=64");
  void *x, *y;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &y), MP_OK);
  cr_assert_eq(fake_of(dev)->maps, 2, "one chunk per block");
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  uint64_t events = p->hist.total;
  fail_unmap = 1;
  (void)mp_pool_trim(p, 0);
  cr_assert_eq(fail_unmap, 0, "trim tried to unmap X's chunk");
  cr_assert_eq(fake_of(dev)->used, 4 * MiB, "the chunk stays mapped");
  check(p);
  cr_expect_eq(p->hist.total, events, "%u events for a failed unmap",
               (unsigned)(p->hist.total - events));
  expect_segment_history_replays(p, dev);
  /* Unmapped at the next trim: one segment_unmap. */
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(fake_of(dev)->used, 2 * MiB);
  expect_segment_history_replays(p, dev);
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  fake_pool_finish(p, dev);
}

typedef struct {
  mp_pool_t *p;
  void *l;
} freeing_t;

static void free_l(void *ctx) {
  freeing_t *w = ctx;
  cr_assert_eq(mp_pool_free(w->p, w->l), MP_OK);
}

/* Growth joins the new memory to the free block it completes (K, 2 MiB, at
 * the top) when the sum stays splittable under max_split (4 MiB): here
 * 2 + 2 MiB for a 3 MiB request. While the lock is dropped for the map, L,
 * live below K, is freed and takes K in (4 MiB, which holds the request by
 * itself). The join was made with whatever lay below the new memory then:
 * a 6 MiB block above max_split, which no 3 MiB request may split, so the
 * pool grew again past what it had just mapped. Now the new memory stays
 * apart from a neighbour that is not the block the placement counted on,
 * and the request takes L + K. */
Test(pool_holes, growth_joins_only_the_block_it_placed_against) {
  mp_device_t *dev = hooked_open();
  mp_pool_t *p = make_pool(dev, "max_split=4M,segment_bytes=2M");
  void *l, *k, *x;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &l), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &k), MP_OK);
  cr_assert_eq((char *)k, (char *)l + 2 * MiB);
  cr_assert_eq(fake_of(dev)->maps, 2, "one chunk per block");
  cr_assert_eq(mp_pool_free(p, k), MP_OK);
  freeing_t w = {p, l};
  on_map = free_l;
  on_map_ctx = &w;
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_null(on_map, "no map with the hook set");
  check(p);
  cr_expect_eq(x, l, "served from L + K");
  cr_expect_eq(fake_of(dev)->maps, 3, "mapped %u chunks", fake_of(dev)->maps);
  cr_expect_eq(stats(p).reserved_bytes, 6 * MiB, "reserved %zu",
               stats(p).reserved_bytes);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  fake_pool_finish(p, dev);
}
