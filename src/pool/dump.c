/* dump.c - mp_pool_dump: a pool's state as text or JSON.
 *
 * Stats, then every segment with its blocks in address order, then the
 * non-empty size classes (count, bytes, size range), then external
 * fragmentation = 1 - largest free / total free (0 with no free memory).
 * A segment's size is the bytes it holds on the device now; while the pool
 * is paused that is what the pause left mapped (0, or the chunks an undo
 * that failed left: pause.c), as reserved_bytes says, and the segment is
 * marked paused (" paused" in text, "paused":true in JSON) with every
 * block record it keeps for the resume, live ones as live (allocated_bytes
 * and live_blocks still count them), and no free class (free is 0).
 * Read-only; holds the lock for the walk. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "pool_internal.h"

/* The dump's stream and the first failure of its own writes (an errno, 0
 * while none): the stream's error flag is sticky, and one the caller's
 * earlier writes left set is no failure of the dump's. */
typedef struct mp__dump_out {
  FILE *f;
  int err;
} mp__dump_out_t;

__attribute__((format(printf, 2, 3))) static void
mp__out(mp__dump_out_t *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int errno_was = errno;
  errno = 0;
  if (vfprintf(out->f, fmt, ap) < 0 && out->err == 0)
    out->err = errno != 0 ? errno : EIO;
  errno = errno_was;
  va_end(ap);
}

static const char *mp__seg_kind(int k) {
  return k == MP__SEG_VIRTUAL ? "virtual"
         : k == MP__SEG_RANGE ? "range"
                              : "plain";
}

/* The sizes class (fl, sl) holds: its 512-byte units (index.c, mp__cls),
 * as multiples of the pool's alignment. */
static void mp__class_range(const mp_pool_t *pool, unsigned fl, unsigned sl,
                            size_t *lo, size_t *hi) {
  size_t a = pool->cfg.align;
  size_t u = fl == 0 ? sl : ((size_t)MP__SL_COUNT + sl) << (fl - 1);
  size_t n = fl == 0 ? 1 : (size_t)1 << (fl - 1); /* units in the class */
  size_t first = u << MP__CLS_UNIT_LOG2;
  size_t last = first + (n << MP__CLS_UNIT_LOG2) - 1;
  *lo = mp__round_up(first, a);
  *hi = last / a * a;
  if (*hi < *lo)
    *hi = *lo;
}

static void mp__class_totals(const mp__block_t *t, size_t *n, size_t *b) {
  if (t == NULL)
    return;
  (*n)++;
  *b += t->size;
  mp__class_totals(t->left, n, b);
  mp__class_totals(t->right, n, b);
}

/* A block's requested bytes as the dumps show them: 0 but for a live
 * block (a free or unmapped record's word is not kept). */
static size_t mp__dump_requested(const mp__block_t *b) {
  return (b->flags & (MP__B_FREE | MP__B_HOLE)) ? 0 : b->requested;
}

/* The free lists by class, summed over the pools a dump walks (the pool,
 * or each arena made). */
typedef struct mp__class_sums {
  size_t n[MP__FL_COUNT * MP__SL_COUNT];
  size_t bytes[MP__FL_COUNT * MP__SL_COUNT];
} mp__class_sums_t;

/* Under pool's lock: adds its free lists to c. */
static void mp__class_add(const mp_pool_t *pool, mp__class_sums_t *c) {
  for (size_t k = 0; k < MP__FL_COUNT * MP__SL_COUNT; k++)
    mp__class_totals(pool->bins[k], &c->n[k], &c->bytes[k]);
}

/* What a dump says of the pool as a whole: its stats (an arena's sums for
 * a pool with arenas), live and destroyed streams. */
typedef struct mp__dump_head {
  mp_stats_t s;
  size_t largest;
  double frag;
  unsigned live, gone;
} mp__dump_head_t;

static void mp__dump_text_head(const mp_pool_t *pool, mp__dump_out_t *out,
                               const mp__dump_head_t *h) {
  const mp_stats_t *s = &h->s;
  char frag[32]; /* "0.5000" under any locale, as the JSON dump writes it */
  mp__out(out,
          "pool %p (%s)\n"
          "  reserved %zu (peak %zu)  allocated %zu (peak %zu)  requested %zu "
          "(peak %zu)\n"
          "  free %zu  largest free %zu  external fragmentation %s\n"
          "  allocs %llu  frees %llu  device allocs %llu  device frees %llu  "
          "oom %llu\n",
          (void *)pool, pool->parent ? "child" : "device", s->reserved_bytes,
          s->peak_reserved_bytes, s->allocated_bytes, s->peak_allocated_bytes,
          s->requested_bytes, s->peak_requested_bytes, s->free_bytes,
          h->largest, mp__fmt_fixed(frag, sizeof frag, h->frag, 4),
          (unsigned long long)s->alloc_count, (unsigned long long)s->free_count,
          (unsigned long long)s->device_alloc_count,
          (unsigned long long)s->device_free_count,
          (unsigned long long)s->oom_count);
  mp__out(out, "  streams %u (%u destroyed, kept until their work is done)\n",
          h->live, h->gone);
}

/* Under pool's lock: the bytes segment g holds on the device now: its
 * size, or in a paused pool the chunks still mapped (a paused pool holds
 * only its virtual segment: pause.c refuses plain ones). */
static size_t mp__seg_held(const mp_pool_t *pool, const mp__segment_t *g) {
  if (!pool->paused || g->kind != MP__SEG_VIRTUAL)
    return g->size;
  size_t held = 0, m = mp__pool_chunks_mapped(pool, g);
  for (size_t i = 0; i < m; i++)
    held += g->chunks[i].size;
  return held;
}

/* Under pool's lock: its segments and blocks; arena: its number in the
 * pool with arenas, or -1. */
static void mp__dump_text_segs(const mp_pool_t *pool, mp__dump_out_t *out,
                               long arena) {
  for (mp__segment_t *g = pool->segs; g != NULL; g = g->next) {
    mp__out(out, "  segment %p %s size %zu%s", (void *)g->base,
            mp__seg_kind(g->kind), mp__seg_held(pool, g),
            pool->paused ? " paused" : "");
    if (arena >= 0)
      mp__out(out, " arena %ld", arena);
    mp__out(out, "\n");
    for (mp__block_t *b = g->first; b != NULL; b = b->next)
      mp__out(out, "    block %p size %zu %s requested %zu\n", (void *)b->addr,
              b->size,
              (b->flags & MP__B_FREE)   ? "free"
              : (b->flags & MP__B_HOLE) ? "unmapped"
                                        : "live",
              mp__dump_requested(b));
  }
}

static void mp__dump_text_classes(const mp_pool_t *pool, mp__dump_out_t *out,
                                  const mp__class_sums_t *c) {
  mp__out(out, "  free lists by class:\n");
  for (unsigned fl = 0; fl < MP__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < MP__SL_COUNT; sl++) {
      size_t k = fl * MP__SL_COUNT + sl, lo, hi;
      if (c->n[k] == 0)
        continue;
      mp__class_range(pool, fl, sl, &lo, &hi);
      mp__out(out, "    class %u.%u [%zu, %zu]: %zu blocks, %zu bytes\n", fl,
              sl, lo, hi, c->n[k], c->bytes[k]);
    }
}

static void mp__dump_json_head(const mp_pool_t *pool, mp__dump_out_t *out,
                               const mp__dump_head_t *h) {
  const mp_stats_t *s = &h->s;
  char frag[32]; /* a JSON number under any locale */
  mp__fmt_fixed(frag, sizeof frag, h->frag, 6);
  mp__out(out,
          "{\"kind\":\"%s\",\"stats\":{\"reserved_bytes\":%zu,"
          "\"peak_reserved_bytes\":%zu,\"allocated_bytes\":%zu,"
          "\"peak_allocated_bytes\":%zu,\"requested_bytes\":%zu,"
          "\"peak_requested_bytes\":%zu,\"largest_free_bytes\":%zu,"
          "\"free_bytes\":%zu,\"alloc_count\":%llu,\"free_count\":%llu,"
          "\"device_alloc_count\":%llu,\"device_free_count\":%llu,"
          "\"oom_count\":%llu,\"segment_count\":%zu,\"live_blocks\":%llu,"
          "\"free_blocks\":%llu},\"external_fragmentation\":%s,"
          "\"streams\":{\"live\":%u,\"destroyed\":%u},\"segments\":[",
          pool->parent ? "child" : "pool", s->reserved_bytes,
          s->peak_reserved_bytes, s->allocated_bytes, s->peak_allocated_bytes,
          s->requested_bytes, s->peak_requested_bytes, h->largest,
          s->free_bytes, (unsigned long long)s->alloc_count,
          (unsigned long long)s->free_count,
          (unsigned long long)s->device_alloc_count,
          (unsigned long long)s->device_free_count,
          (unsigned long long)s->oom_count, s->segment_count,
          (unsigned long long)s->live_blocks,
          (unsigned long long)s->free_blocks, frag, h->live, h->gone);
}

/* Under pool's lock: its segments, each after a comma unless *first (then
 * cleared); arena as mp__dump_text_segs's. */
static void mp__dump_json_segs(const mp_pool_t *pool, mp__dump_out_t *out,
                               long arena, bool *first) {
  for (mp__segment_t *g = pool->segs; g != NULL; g = g->next) {
    mp__out(out, "%s{\"base\":\"%p\",\"kind\":\"%s\",\"size\":%zu,%s",
            *first ? "" : ",", (void *)g->base, mp__seg_kind(g->kind),
            mp__seg_held(pool, g), pool->paused ? "\"paused\":true," : "");
    *first = false;
    if (arena >= 0)
      mp__out(out, "\"arena\":%ld,", arena);
    mp__out(out, "\"blocks\":[");
    for (mp__block_t *b = g->first; b != NULL; b = b->next)
      mp__out(out,
              "%s{\"addr\":\"%p\",\"size\":%zu,\"free\":%s,"
              "\"requested\":%zu%s}",
              b == g->first ? "" : ",", (void *)b->addr, b->size,
              (b->flags & MP__B_FREE) ? "true" : "false", mp__dump_requested(b),
              (b->flags & MP__B_HOLE) ? ",\"unmapped\":true" : "");
    mp__out(out, "]}");
  }
}

static void mp__dump_json_classes(const mp_pool_t *pool, mp__dump_out_t *out,
                                  const mp__class_sums_t *c) {
  mp__out(out, "],\"free_classes\":[");
  bool first = true;
  for (unsigned fl = 0; fl < MP__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < MP__SL_COUNT; sl++) {
      size_t k = fl * MP__SL_COUNT + sl, lo, hi;
      if (c->n[k] == 0)
        continue;
      mp__class_range(pool, fl, sl, &lo, &hi);
      mp__out(out,
              "%s{\"fl\":%u,\"sl\":%u,\"min_size\":%zu,\"max_size\":%zu,"
              "\"blocks\":%zu,\"bytes\":%zu}",
              first ? "" : ",", fl, sl, lo, hi, c->n[k], c->bytes[k]);
      first = false;
    }
  mp__out(out, "]}\n");
}

/* Bytes of free block b that cannot go back to the device while its
 * neighbours live: all of it in a plain segment that holds a live block,
 * in the virtual range what is not whole chunks (PyTorch's "inactive
 * split": cached, free, and not releasable). */
static size_t mp__inactive_split(const mp__block_t *b) {
  const mp__segment_t *g = b->seg;
  if (g->kind != MP__SEG_VIRTUAL)
    return g->first == b && g->last == b ? 0 : b->size;
  size_t whole = 0;
  for (size_t i = 0; i < g->nchunks; i++)
    if (g->chunks[i].addr >= b->addr &&
        g->chunks[i].addr + g->chunks[i].size <= b->addr + b->size)
      whole += g->chunks[i].size;
  return b->size - whole;
}

/* Under pool's lock: adds its inactive split bytes and blocks. */
static void mp__inactive_add(const mp_pool_t *pool, size_t *bytes,
                             size_t *blocks) {
  for (mp__segment_t *g = pool->paused ? NULL : pool->segs; g != NULL;
       g = g->next)
    for (mp__block_t *b = g->first; b != NULL; b = b->next)
      if ((b->flags & MP__B_FREE) && !mp__deps_pending(pool, b)) {
        size_t n = mp__inactive_split(b);
        *bytes += n;
        *blocks += n > 0;
      }
}

/* torch.cuda.memory_stats()'s key names, where they mean the same here
 * (python/mempool/_stats.py's TORCH_KEYS, which a test compares). */
static void mp__dump_torch(const mp_stats_t *s, mp__dump_out_t *out,
                           size_t split_bytes, size_t split_blocks) {
  mp__out(out,
          "{\"allocated_bytes.all.current\":%zu,"
          "\"allocated_bytes.all.peak\":%zu,"
          "\"reserved_bytes.all.current\":%zu,"
          "\"reserved_bytes.all.peak\":%zu,"
          "\"requested_bytes.all.current\":%zu,"
          "\"requested_bytes.all.peak\":%zu,"
          "\"allocation.all.current\":%llu,"
          "\"allocation.all.allocated\":%llu,"
          "\"allocation.all.freed\":%llu,"
          "\"segment.all.current\":%zu,"
          "\"inactive_split_bytes.all.current\":%zu,"
          "\"inactive_split.all.current\":%zu,"
          "\"num_device_alloc\":%llu,\"num_device_free\":%llu,"
          "\"num_ooms\":%llu,\"num_alloc_retries\":%llu}\n",
          s->allocated_bytes, s->peak_allocated_bytes, s->reserved_bytes,
          s->peak_reserved_bytes, s->requested_bytes, s->peak_requested_bytes,
          (unsigned long long)s->live_blocks,
          (unsigned long long)s->alloc_count, (unsigned long long)s->free_count,
          s->segment_count, split_bytes, split_blocks,
          (unsigned long long)s->device_alloc_count,
          (unsigned long long)s->device_free_count,
          (unsigned long long)s->oom_count,
          (unsigned long long)s->alloc_retry_count);
}

mp_status_t mp_pool_dump(mp_pool_t *pool, FILE *file, const char *format) {
  if (pool == NULL || file == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_dump: %s is NULL",
                    pool == NULL ? "pool" : "out");
  int kind; /* 0 text, 1 json, 2 torch */
  if (format == NULL || strcmp(format, "text") == 0)
    kind = 0;
  else if (strcmp(format, "json") == 0)
    kind = 1;
  else if (strcmp(format, "torch") == 0)
    kind = 2;
  else {
    char shown[MP__CLIP]; /* a long one leaves room for the reason */
    return mp__fail(MP_EINVAL,
                    "mp_pool_dump: unknown format '%s' (expected text, json "
                    "or torch)",
                    mp__clip(format, strlen(format), shown, sizeof shown));
  }
  mp__dump_out_t o = {.f = file, .err = 0}, *out = &o;
  mp__dump_head_t h = {.live = 0};
  mp__class_sums_t c = {.n = {0}};
  size_t split_bytes = 0, split_blocks = 0;
  mp_pool_t *part[MP_POOL_MAX_ARENAS];
  long part_no[MP_POOL_MAX_ARENAS]; /* its arena number, or -1 */
  size_t nparts = 0;
  /* From a host function a device call in flight is not waited for
   * (pool_internal.h, mp__pool_wait_for): MP_EBUSY before anything is
   * written, and after (an arena's call begun meanwhile) its segments as
   * they are under its lock. */
  bool host_fn = mp__pool_in_host_fn(pool);
  if (pool->arenas == NULL) {
    /* Under the lock throughout: one pool's state at one moment. */
    mp__pool_lock(pool);
    mp_status_t st = mp__pool_wait_for(pool, "mp_pool_dump", false);
    if (st != MP_OK) {
      mp__pool_unlock(pool);
      return st;
    }
    mp__stats_copy(pool, &h.s);
    /* As mp_pool_get_stats says it: 0 while paused (nothing is served). */
    h.largest = h.s.largest_free_bytes =
        pool->paused ? 0 : mp__stats_largest_free(pool);
    part_no[nparts] = -1;
    part[nparts++] = pool;
  } else {
    /* The pool with arenas (arena.c) holds nothing itself: the stats are
     * the arenas' sums (as mp_pool_get_stats), then each arena made is
     * walked under its own lock, one at a time (the pool's is not held
     * across an arena's wait for a map in flight). */
    mp__stats_read(pool, &h.s);
    h.largest = h.s.largest_free_bytes;
    for (size_t i = 0; i < pool->cfg.arenas; i++)
      if ((part[nparts] = mp__arena_at(pool, i)) != NULL)
        part_no[nparts++] = (long)i;
  }
  h.frag =
      h.s.free_bytes ? 1.0 - (double)h.largest / (double)h.s.free_bytes : 0.0;
  /* The streams and free lists first: they come before the segments. */
  for (size_t k = 0; k < nparts; k++) {
    mp_pool_t *a = part[k];
    if (a != pool) {
      mp__pool_lock(a);
      mp_status_t st = mp__pool_wait_for(a, "mp_pool_dump", false);
      if (st != MP_OK) {
        mp__pool_unlock(a);
        return st;
      }
    }
    h.live += a->nstreams - a->ngone;
    h.gone += a->ngone;
    /* Paused, it serves nothing (free 0, as the stats say): the free
     * blocks it keeps for the resume are no free lists now. */
    if (!a->paused)
      mp__class_add(a, &c);
    mp__inactive_add(a, &split_bytes, &split_blocks);
    if (a != pool)
      mp__pool_unlock(a);
  }
  bool first = true;
  if (kind == 2)
    mp__dump_torch(&h.s, out, split_bytes, split_blocks);
  else if (kind == 1)
    mp__dump_json_head(pool, out, &h);
  else
    mp__dump_text_head(pool, out, &h);
  for (size_t k = 0; kind != 2 && k < nparts; k++) {
    mp_pool_t *a = part[k];
    if (a != pool) {
      mp__pool_lock(a);
      if (!host_fn)
        mp__pool_wait_idle(a);
    }
    if (kind == 1)
      mp__dump_json_segs(a, out, part_no[k], &first);
    else
      mp__dump_text_segs(a, out, part_no[k]);
    if (a != pool)
      mp__pool_unlock(a);
  }
  if (kind == 1)
    mp__dump_json_classes(pool, out, &c);
  else if (kind == 0)
    mp__dump_text_classes(pool, out, &c);
  if (pool->arenas == NULL)
    mp__pool_unlock(pool);
  /* A full disk or a closed pipe must not pass for a dump: its own
   * writes and the flush are judged, not the stream's sticky error flag
   * (an error the caller's earlier writes left set failed every dump). */
  if (o.err == 0 && fflush(file) != 0)
    o.err = errno != 0 ? errno : EIO;
  if (o.err != 0)
    return mp__fail(MP_EIO, "mp_pool_dump: writing the dump failed: %s",
                    strerror(o.err));
  return MP_OK;
}
