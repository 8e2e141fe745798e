/* snapshot.c - mp_pool_snapshot: the pool as PyTorch's memory snapshot.
 *
 * The format is the dictionary torch.cuda.memory._snapshot() returns and
 * _dump_snapshot() pickles, as documented by the TypedDicts of
 * torch/cuda/memory.py (Segment, Block, Frame, TraceEntry) and read by
 * torch/cuda/_memory_viz.py and the memory_viz page:
 *   {"segments": [{device, address, total_size, allocated_size,
 *                  active_size, requested_size, stream, segment_type,
 *                  segment_pool_id, is_expandable, frames,
 *                  blocks: [{address, size, requested_size, state,
 *                            frames}]}],
 *    "device_traces": [[{action, addr, size, stream, time_us,
 *                        frames: [{filename, line, name}]}]]}
 * (an oom entry has device_free in addr's place, as PyTorch's: there
 * what cudaMemGetInfo said was free, here what the history recorded, the
 * bytes the pool could still reserve under its cap at the failure, which
 * is not the device's free memory where other tenants hold some).
 * No PyTorch code is used; the pickle (protocol 2: dict, list, tuple, str,
 * int, bool) is written here.
 *
 * Segments: each plain segment, and each run of mapped memory of the
 * virtual range between two holes (is_expandable True, as PyTorch's
 * expandable segments); segment_type "small" for a plain segment made for
 * a request of at most segment_bytes/2 (by default 2 MiB for requests up
 * to 1 MiB), the kind such requests share, as PyTorch's small pool packs
 * requests up to 1 MiB into 2 MiB segments (CUDACachingAllocator.cpp,
 * kSmallSize, kSmallBuffer; its snapshot says "small" for a segment of
 * that pool), else "large" (one free index serves every size here, so a
 * small segment wholly free may later hold a larger block, which
 * PyTorch's never does); while the pool is paused, only what it still
 * maps: nothing, or after an undo that failed (pause.c) the chunks left
 * mapped, the blocks cut at their top, so that the segments' total_size
 * is reserved_bytes as the stats say it, less the strays (vrange.c:
 * mappings the device would not take back, which hold no block).
 * segment_pool_id is (0, 0), or for a graph pool (0, n), its own id
 * (graph.c), as PyTorch gives a private pool's segments its MempoolId_t,
 * and for one made by PyTorch's hooks that very MempoolId_t (torch.c)
 * (a parent's snapshot shows the ranges it lent as live blocks). A
 * block's state is PyTorch's (torch/csrc/cuda/memory_snapshot.cpp:
 * allocated, else active, else inactive, where CUDACachingAllocator.cpp's
 * snapshot() calls a block active while it is allocated or its reuse
 * waits for events or stream uses): "active_allocated" when the program
 * holds it; "active_pending_free" when it is no caller's but not yet
 * reusable: freed while another process imports it (MP__B_HELD, until its
 * leases close) or held by the out-of-memory ladder while it waits for
 * the streams (MP__B_LADDER), or free but waiting, as far as the pool
 * knows without asking the device, for work on two streams or more, or
 * for a device sync (mp__deps_pending: no stream could take it now
 * without waiting for another's work, as a PyTorch block freed with
 * stream uses waits for its events); "inactive" when free otherwise. The
 * dump's inactive_split figures leave the pending ones out too. A segment's
 * allocated_size sums the first kind, active_size and requested_size the
 * first two, as PyTorch's do, so allocated_size leaves out the pending
 * blocks that the stats' allocated_bytes counts. A pending block in the
 * free index is written as the frees inside it that the history holds and
 * that nothing took since, each its own pending block with its request,
 * the bytes around them inactive, as PyTorch's blocks would be (it merges
 * none whose events are pending); none held: the block whole, requested
 * 0 (the pool keeps no request for a free block: mp__snap_link_freed). A
 * segment's
 * stream is a cudaStream_t's value, as PyTorch's (its segment is one
 * stream's): that of its lowest active block whose stream the pool knows,
 * else the one its memory was made for, kept with the plain segment or
 * the chunk at its head (the request's that grew it; 0: taken for every
 * stream).
 * An active block's
 * frames are those of the last alloc event of its address still in the
 * history. Frames are symbolized with dladdr():
 * filename is the object file, name the nearest dynamic symbol ("??" when
 * none) with the offset, line 0.
 *
 * The pool lock is held only while the state is copied, once no growth or
 * release is in flight (mp__pool_wait_idle); symbolizing and writing
 * happen after. One snapshot may hold several pools, one per CUDA
 * device (mp__pool_snapshot_many, for the shim): each segment says its
 * device, and device_traces has one list per ordinal up to the highest,
 * empty for a device without a pool. Each pool is copied under its own
 * lock in turn, so the pools are not caught at one instant. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pool_internal.h"

/* ---- a protocol-2 pickle writer ----------------------------------------- */

/* Lists are written as Python's pickler writes them: APPENDS in batches
 * of at most MP__PK_BATCH items (its _BATCHSIZE). The memory_viz page's
 * own unpickler (torch/utils/viz/MemoryViz.js) spreads a batch into one
 * push() call, which V8 refuses above about 125 000 arguments: a long
 * trace in one batch would not open there. Every list item here is a dict
 * or a list, so a container's end counts an item of the list around it. */
#define MP__PK_BATCH 1000
#define MP__PK_DEPTH 8

typedef struct {
  FILE *f;
  bool bad;
  int err;                      /* the first failed write's errno */
  unsigned depth;               /* open containers */
  bool list[MP__PK_DEPTH];      /* each one a list (else a dict) */
  uint32_t items[MP__PK_DEPTH]; /* a list's items since its last MARK */
} mp__pk_t;

static void mp__pk_bytes(mp__pk_t *w, const void *p, size_t n) {
  if (!w->bad && fwrite(p, 1, n, w->f) != n) {
    w->bad = true;
    w->err = errno != 0 ? errno : EIO;
  }
}
static void mp__pk_op(mp__pk_t *w, unsigned char op) {
  mp__pk_bytes(w, &op, 1);
}

static void mp__pk_int(mp__pk_t *w, uint64_t v) {
  unsigned char b[10];
  if (v < 0x80000000u) { /* BININT: 4 bytes, signed, little-endian */
    b[0] = 'J';
    for (int i = 0; i < 4; i++)
      b[1 + i] = (unsigned char)(v >> (8 * i));
    mp__pk_bytes(w, b, 5);
    return;
  }
  /* LONG1: n bytes of two's complement, little-endian, at most 8: the
   * value as PyTorch's int64 fields hold it (memory_snapshot.cpp casts
   * each to int64_t), so one of 2^63 or more (a forgotten stream's
   * handle, MP__STREAM_GONE; the size of an oom for SIZE_MAX bytes) reads
   * back negative, as that cast gives it. A ninth byte, which kept it
   * positive, made the memory_viz page's unpickler (MemoryViz.js) throw
   * ("Unsupported number bigger than 8 bytes"): the file did not open. A
   * zero byte still keeps a shorter value with its top bit set positive. */
  unsigned n = 0;
  while (n < 8 && (v >> (8 * n)) != 0)
    n++;
  b[0] = 0x8a;
  for (unsigned i = 0; i < n; i++)
    b[2 + i] = (unsigned char)(v >> (8 * i));
  if (n < 8 && (b[1 + n] & 0x80))
    b[2 + n++] = 0;
  b[1] = (unsigned char)n;
  mp__pk_bytes(w, b, 2 + n);
}

/* BINUNICODE; bytes outside ASCII become '?', so the text is valid UTF-8
 * whatever a file name holds. */
static void mp__pk_str(mp__pk_t *w, const char *s) {
  size_t n = strlen(s);
  unsigned char h[5] = {'X', (unsigned char)n, (unsigned char)(n >> 8),
                        (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
  mp__pk_bytes(w, h, 5);
  for (size_t i = 0; i < n; i++)
    mp__pk_op(w, (unsigned char)s[i] < 0x80 ? (unsigned char)s[i] : '?');
}

static void mp__pk_bool(mp__pk_t *w, bool v) {
  mp__pk_op(w, v ? 0x88 : 0x89);
}
/* EMPTY_DICT/EMPTY_LIST then MARK; the items follow; then SETITEMS/APPENDS
 * (a list's every MP__PK_BATCH items, then MARK again). The writer nests
 * at most 7 deep (the snapshot, segments, a segment, blocks, a block,
 * frames, a frame): deeper would be a bug here, marked bad. */
static void mp__pk_open(mp__pk_t *w, unsigned char op, bool list) {
  mp__pk_op(w, op);
  mp__pk_op(w, '(');
  if (w->depth == MP__PK_DEPTH) {
    w->bad = true;
    return;
  }
  w->list[w->depth] = list;
  w->items[w->depth++] = 0;
}
static void mp__pk_close(mp__pk_t *w, unsigned char op) {
  mp__pk_op(w, op);
  if (w->depth == 0) {
    w->bad = true;
    return;
  }
  unsigned up = --w->depth;
  if (up > 0 && w->list[up - 1] && ++w->items[up - 1] == MP__PK_BATCH) {
    mp__pk_op(w, 'e');
    mp__pk_op(w, '(');
    w->items[up - 1] = 0;
  }
}
static void mp__pk_dict(mp__pk_t *w) {
  mp__pk_open(w, '}', false);
}
static void mp__pk_list(mp__pk_t *w) {
  mp__pk_open(w, ']', true);
}
static void mp__pk_dict_end(mp__pk_t *w) {
  mp__pk_close(w, 'u');
}
static void mp__pk_list_end(mp__pk_t *w) {
  mp__pk_close(w, 'e');
}
static void mp__pk_kint(mp__pk_t *w, const char *k, uint64_t v) {
  mp__pk_str(w, k);
  mp__pk_int(w, v);
}
static void mp__pk_kstr(mp__pk_t *w, const char *k, const char *v) {
  mp__pk_str(w, k);
  mp__pk_str(w, v);
}

/* ---- the copy taken under the lock ----------------------------------- */

typedef struct {
  uintptr_t addr;
  size_t size, requested;
  bool live;    /* active_allocated: the program's */
  bool pending; /* active_pending_free: freed, its reuse waiting */
  bool hole;
  size_t ev; /* last alloc event of this address, or SIZE_MAX */
  /* The stream it was allocated on (its cudaStream_t's value), where known
   * (has_stream): a live or held block's own; a pending free block's, that
   * of its alloc event (mp__snap_link_events). */
  uintptr_t stream;
  bool has_stream;
  bool freed; /* pending and in the free index: written as the pending
                 frees the history shows inside it (mp__snap_link_freed) */
  /* The stream handle its memory was made for (mp__segment_t's, or for
   * the virtual range its chunk's), set on the blocks that start a
   * snapshot segment (and the pieces cut from them), for a segment with
   * no active block (mp__write_segment). */
  uintptr_t made_for;
} mp__sblock_t;

typedef struct {
  size_t first, nblocks; /* into blocks[] */
  int kind;              /* MP__SEG_* */
  bool small;            /* mp__segment_t's */
} mp__sseg_t;

typedef struct {
  mp__sblock_t *blocks;
  size_t nblocks;
  mp__sseg_t *segs;
  size_t nsegs;
  mp__hevent_t *ev; /* oldest first */
  void **frames;    /* MP__HIST_FRAMES per event, or NULL */
  size_t nev;
  size_t next;         /* the next event the trace writes (mp__write_trace) */
  uint64_t pool_id[2]; /* segment_pool_id (graph_id) */
  int device;          /* the CUDA ordinal it is written as */
  size_t align_add, align_mask; /* the pool's rounding (mp__pool_round) */
} mp__snap_t;

static void mp__snap_free(mp__snap_t *s) {
  free(s->blocks);
  free(s->segs);
  free(s->ev);
  free(s->frames);
}

static int mp__sblock_cmp(const void *a, const void *b) {
  const mp__sblock_t *x = *(mp__sblock_t *const *)a,
                     *y = *(mp__sblock_t *const *)b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The first of the n blocks by (sorted by address, mp__sblock_cmp) at or
 * above a; n where none is. */
static size_t mp__sblock_at(mp__sblock_t *const *by, size_t n, uintptr_t a) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (by[mid]->addr < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Whether b is active in PyTorch's sense: allocated or pending free. */
static bool mp__sblock_active(const mp__sblock_t *b) {
  return b->live || b->pending;
}

/* An event of the ring by its address: sorted by address, then age. */
typedef struct mp__salloc {
  uintptr_t addr;
  size_t e;
} mp__salloc_t;

static int mp__salloc_cmp(const void *a, const void *b) {
  const mp__salloc_t *x = a, *y = b;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->e < y->e ? -1 : x->e > y->e;
}

/* The index in al[0, n) (sorted) of the newest event at addr older than
 * event before, or SIZE_MAX. */
static size_t mp__salloc_last(const mp__salloc_t *al, size_t n, uintptr_t addr,
                              size_t before) {
  mp__salloc_t key = {addr, before};
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (mp__salloc_cmp(&al[mid], &key) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo > 0 && al[lo - 1].addr == addr ? lo - 1 : SIZE_MAX;
}

/* A pending free block in the free index keeps no request nor stream of its
 * own in the pool (its record's request is read only while live), and it
 * may be several frees merged, with free bytes around them: PyTorch merges
 * no block whose events are pending (free_block runs once they are done),
 * so each of those frees is its own block there, with its own size and
 * requested_size (CUDACachingAllocator.cpp, snapshot(): block_info.size,
 * requested_size), and the bytes around them are the inactive blocks they
 * merged into. It is written so, as far as the history tells (its events
 * hold requests, and a free's block size past it, but no stream uses): the
 * newest free inside it whose bytes no later event there took
 * (mp__snap_pieces) is an active_pending_free block from the free's
 * address, its size the freed block's (mp__snap_span), cut at the block's
 * top; its requested_size, stream and frames those of the free and of
 * the alloc before it at that address (a resume's, restored, gives way to
 * an earlier one); the bytes between them inactive. None in the history:
 * the block whole, 0, no stream, no frames. */

/* The bytes free event e's block held from its address: its request
 * rounded as the pool rounds, and what it held past that (over: a block
 * handed out whole, which PyTorch's snapshot writes whole, block_info.size
 * = block->size: it was written as its request, the rest inactive), at
 * least 1 (an unroundable one, or one past UINT32_MAX units: to the top). */
static size_t mp__snap_span(const mp__snap_t *s, size_t e) {
  size_t up, over;
  if (__builtin_add_overflow(s->ev[e].size, s->align_add, &up) ||
      s->ev[e].over == UINT32_MAX ||
      __builtin_mul_overflow((size_t)s->ev[e].over, s->align_add + 1, &over) ||
      __builtin_add_overflow(up & s->align_mask, over, &up))
    return SIZE_MAX;
  return up == 0 ? 1 : up;
}

/* Of evs[0, n) (one freed block's events, oldest first), the free that
 * left it pending, kept in evs[0]: 1, or 0 when none. Which of its frees
 * still waited when the next merged is no event's (the ring records no
 * stream use): the newest, whose bytes no later event took (the block is
 * free whole: an alloc inside it since was freed since), is; an older one,
 * as far as the history tells, had become reusable (a free on one stream
 * is reusable on it at once), its bytes inactive. */
static size_t mp__snap_pieces(const mp__snap_t *s, mp__salloc_t *evs,
                              size_t n) {
  for (size_t i = n; i-- > 0;)
    if (s->ev[evs[i].e].action == MP__H_FREE_COMPLETED) {
      evs[0] = evs[i];
      return 1;
    }
  return 0;
}

static mp_status_t mp__snap_link_freed(mp__snap_t *s) {
  size_t nfreed = 0, nalloc = 0, nin = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    nfreed += s->blocks[i].freed;
  if (nfreed == 0)
    return MP_OK;
  for (size_t e = 0; e < s->nev; e++)
    nalloc += s->ev[e].action == MP__H_ALLOC;
  mp__sblock_t **by = mp__host_alloc(nfreed * sizeof *by);
  mp__salloc_t *al = mp__host_alloc((nalloc ? nalloc : 1) * sizeof *al);
  /* The events inside the freed blocks: addr is the block's index in
   * by[], so that they sort by block, then age. */
  mp__salloc_t *in = mp__host_alloc((s->nev ? s->nev : 1) * sizeof *in);
  mp__sblock_t *nb = NULL;
  mp_status_t st = MP_OK;
  if (by == NULL || al == NULL || in == NULL)
    goto oom;
  nfreed = nalloc = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].freed)
      by[nfreed++] = &s->blocks[i];
  qsort(by, nfreed, sizeof *by, mp__sblock_cmp);
  for (size_t e = 0; e < s->nev; e++) {
    const mp__hevent_t *ev = &s->ev[e];
    if (ev->action == MP__H_ALLOC)
      al[nalloc++] = (mp__salloc_t){ev->addr, e};
    if (ev->action != MP__H_ALLOC && ev->action != MP__H_FREE_COMPLETED)
      continue;
    /* The last freed block starting at or below the address (the first
     * above it, less one). */
    size_t lo = mp__sblock_at(by, nfreed, ev->addr + 1);
    if (lo > 0 && ev->addr - by[lo - 1]->addr < by[lo - 1]->size)
      in[nin++] = (mp__salloc_t){lo - 1, e};
  }
  qsort(al, nalloc, sizeof *al, mp__salloc_cmp);
  qsort(in, nin, sizeof *in, mp__salloc_cmp);
  /* Each freed block's pieces, kept at the front of its run of in[];
   * at[k], np[k]: where and how many. The new block count: each piece
   * and the bytes before it, and the bytes after the last. */
  size_t *at = mp__host_alloc(nfreed * 2 * sizeof *at), *np = NULL;
  if (at == NULL)
    goto oom;
  np = at + nfreed;
  size_t total = s->nblocks;
  for (size_t k = 0, i = 0; k < nfreed; k++) {
    size_t j = i;
    while (j < nin && in[j].addr == k)
      j++;
    at[k] = i;
    np[k] = mp__snap_pieces(s, in + i, j - i);
    total += 2 * np[k];
    i = j;
  }
  nb = mp__host_alloc(total * sizeof *nb);
  if (nb == NULL) {
    free(at);
    goto oom;
  }
  size_t n = 0;
  for (size_t g = 0; g < s->nsegs; g++) {
    mp__sseg_t *ss = &s->segs[g];
    size_t first = n;
    for (size_t i = ss->first; i < ss->first + ss->nblocks; i++) {
      const mp__sblock_t *b = &s->blocks[i];
      size_t k = 0;
      if (b->freed) {
        /* Its index in by[]: the block at its address. */
        k = mp__sblock_at(by, nfreed, b->addr);
      }
      if (!b->freed || np[k] == 0) {
        nb[n] = *b;
        if (b->freed) {
          nb[n].ev = SIZE_MAX;
          nb[n].requested = 0;
          nb[n].has_stream = false;
          nb[n].stream = 0;
        }
        n++;
        continue;
      }
      uintptr_t cur = b->addr, end = b->addr + b->size;
      const mp__sblock_t gap = {.ev = SIZE_MAX, .made_for = b->made_for};
      for (size_t p = 0; p < np[k]; p++) {
        size_t e = in[at[k] + p].e;
        const mp__hevent_t *fe = &s->ev[e];
        uintptr_t top = p + 1 < np[k] ? s->ev[in[at[k] + p + 1].e].addr : end;
        if (fe->addr > cur) {
          nb[n] = gap;
          nb[n].addr = cur;
          nb[n++].size = fe->addr - cur;
        }
        size_t span = mp__snap_span(s, e);
        mp__sblock_t *pb = &nb[n++];
        *pb = *b;
        pb->addr = fe->addr;
        pb->size = span < top - fe->addr ? span : top - fe->addr;
        pb->requested = fe->size < pb->size ? fe->size : pb->size;
        pb->has_stream = fe->stream != (uintptr_t)MP__STREAM_GONE;
        pb->stream = pb->has_stream ? fe->stream : 0;
        pb->ev = SIZE_MAX;
        size_t a = mp__salloc_last(al, nalloc, fe->addr, e);
        if (a != SIZE_MAX) {
          if (s->ev[al[a].e].restored && a > 0 && al[a - 1].addr == fe->addr)
            a--;
          pb->ev = al[a].e;
        }
        cur = pb->addr + pb->size;
      }
      if (cur < end) {
        nb[n] = gap;
        nb[n].addr = cur;
        nb[n++].size = end - cur;
      }
    }
    ss->first = first;
    ss->nblocks = n - first;
  }
  free(at);
  free(s->blocks);
  s->blocks = nb;
  s->nblocks = n;
  nb = NULL;
  goto out;
oom:
  st = mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
out:
  free(by);
  free(al);
  free(in);
  free(nb);
  return st;
}

/* Gives each active block the index of its last alloc event in the ring. */
static mp_status_t mp__snap_link_events(mp__snap_t *s) {
  size_t nlive = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    nlive += mp__sblock_active(&s->blocks[i]);
  if (nlive == 0 || s->nev == 0)
    return MP_OK;
  mp__sblock_t **by = mp__host_alloc(nlive * sizeof *by);
  if (by == NULL)
    return mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
  nlive = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    if (mp__sblock_active(&s->blocks[i]))
      by[nlive++] = &s->blocks[i];
  qsort(by, nlive, sizeof *by, mp__sblock_cmp);
  for (size_t e = 0; e < s->nev; e++) {
    if (s->ev[e].action != MP__H_ALLOC)
      continue;
    size_t lo = mp__sblock_at(by, nlive, s->ev[e].addr);
    /* A resume's alloc (restored) gives the block the frames of its own
     * earlier alloc where the ring still holds that: the ring drops the
     * oldest first, so an earlier alloc of the address still held is the
     * block's own, or one of a block freed before it, which the block's
     * own later alloc then replaces. */
    if (lo < nlive && by[lo]->addr == s->ev[e].addr &&
        !(s->ev[e].restored && by[lo]->ev != SIZE_MAX))
      by[lo]->ev = e;
  }
  free(by);
  return mp__snap_link_freed(s);
}

/* Under the lock: the top of what a paused pool still maps, its virtual
 * segment's chunks [0, pause_mapped) (chunks are mapped upwards, so those
 * mapped are the first ones; the gaps between them are hole blocks);
 * 0 when it maps nothing. */
static uintptr_t mp__snap_paused_top(const mp_pool_t *pool) {
  const mp__segment_t *v = pool->vseg;
  size_t m = mp__pool_chunks_mapped(pool, v);
  return m == 0 ? 0 : v->chunks[m - 1].addr + v->chunks[m - 1].size;
}

static mp_status_t mp__snap_take(mp_pool_t *pool, mp__snap_t *s) {
  memset(s, 0, sizeof *s);
  s->pool_id[0] = pool->graph_id[0];
  s->pool_id[1] = pool->graph_id[1];
  s->align_add = pool->align_add;
  s->align_mask = pool->align_mask;
  size_t nb = 0, ns = 0;
  /* Paused, the pool maps nothing, as stats say 0 reserved (the trace's
   * segment_unmap events say where the memory went): no segment; or,
   * left part-mapped by an undo that failed, its virtual segment's blocks
   * below the top of the chunks still mapped (a paused pool holds no
   * other segment: pause.c refuses plain ones). */
  uintptr_t top = UINTPTR_MAX;
  mp__segment_t *segs = pool->segs;
  if (pool->paused) {
    top = mp__snap_paused_top(pool);
    segs = top != 0 ? pool->vseg : NULL;
  }
  for (mp__segment_t *g = segs; g != NULL; g = pool->paused ? NULL : g->next) {
    ns++;
    for (mp__block_t *b = g->first; b != NULL && b->addr < top; b = b->next)
      nb++;
  }
  const mp__history_t *h = &pool->hist;
  size_t nev = h->total < h->cap ? (size_t)h->total : h->cap;
  s->blocks = mp__host_alloc((nb ? nb : 1) * sizeof *s->blocks);
  s->segs = mp__host_alloc((ns ? ns : 1) * sizeof *s->segs);
  s->ev = mp__host_alloc((nev ? nev : 1) * sizeof *s->ev);
  if (h->frames != NULL)
    s->frames =
        mp__host_alloc((nev ? nev : 1) * MP__HIST_FRAMES * sizeof(void *));
  if (s->blocks == NULL || s->segs == NULL || s->ev == NULL ||
      (h->frames != NULL && s->frames == NULL)) {
    /* The caller frees what was taken (mp__snaps_free): none twice. */
    return mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
  }
  /* Segments oldest first (the list is newest first); paused, the one. */
  mp__segment_t *last = segs;
  while (!pool->paused && last != NULL && last->next != NULL)
    last = last->next;
  for (mp__segment_t *g = last; g != NULL; g = pool->paused ? NULL : g->prev) {
    mp__sseg_t *ss = &s->segs[s->nsegs++];
    ss->first = s->nblocks;
    ss->kind = g->kind;
    ss->small = g->small;
    for (mp__block_t *b = g->first; b != NULL && b->addr < top; b = b->next) {
      mp__sblock_t *sb = &s->blocks[s->nblocks++];
      sb->addr = b->addr;
      /* Cut at a paused pool's top: a block may run over several chunks. */
      sb->size = b->size < top - b->addr ? b->size : top - b->addr;
      sb->hole = (b->flags & MP__B_HOLE) != 0;
      /* A block freed while imported (held until its leases close), the
       * one the out-of-memory ladder holds while it waits for the streams,
       * and a free one that every stream would have to wait for
       * (mp__deps_pending) are no caller's: PyTorch's active_pending_free. */
      sb->pending = (b->flags & (MP__B_HELD | MP__B_LADDER)) != 0 ||
                    ((b->flags & MP__B_FREE) && mp__deps_pending(pool, b));
      sb->live = !sb->hole && !(b->flags & MP__B_FREE) && !sb->pending;
      /* A free block's record keeps no request of its own (merges): a
       * pending one's comes from the history (mp__snap_link_events). */
      sb->freed = sb->pending && (b->flags & MP__B_FREE);
      sb->requested = !mp__sblock_active(sb) || (b->flags & MP__B_FREE) ? 0
                      : b->requested > sb->size ? sb->size
                                                : b->requested;
      sb->ev = SIZE_MAX;
      /* A live block's stream (a held one keeps it too; the ladder's has
       * none yet), unless its slot was forgotten since. */
      sb->has_stream = (sb->live || (b->flags & MP__B_HELD)) &&
                       b->sidx < pool->nstreams &&
                       pool->streams[b->sidx].s != MP__STREAM_GONE;
      sb->stream = sb->has_stream ? MP__HIST_STREAM(pool, b->sidx) : 0;
      /* A snapshot segment starts at the segment's first block and after
       * each hole (mp__write_segments). */
      sb->made_for = 0;
      mp__chunk_t c;
      if (!sb->hole && (b->prev == NULL || (b->prev->flags & MP__B_HOLE)))
        sb->made_for = g->kind != MP__SEG_VIRTUAL            ? g->made_for
                       : mp__vrange_chunk_of(g, b->addr, &c) ? c.made_for
                                                             : 0;
    }
    ss->nblocks = s->nblocks - ss->first;
  }
  /* Events oldest first: the ring from next when it has wrapped. */
  size_t start = h->total > h->cap ? h->next : 0;
  for (size_t k = 0; k < nev; k++) {
    size_t i = (start + k) % h->cap;
    s->ev[k] = h->ev[i];
    if (s->frames != NULL)
      memcpy(&s->frames[k * MP__HIST_FRAMES], &h->frames[i * MP__HIST_FRAMES],
             MP__HIST_FRAMES * sizeof(void *));
  }
  s->nev = nev;
  return MP_OK;
}

/* ---- writing ---------------------------------------------------------- */

static void mp__write_frames(mp__pk_t *w, const mp__snap_t *s, size_t e) {
  mp__pk_str(w, "frames");
  mp__pk_list(w);
  if (s->frames != NULL && e != SIZE_MAX) {
    for (unsigned k = 0; k < s->ev[e].nframes; k++) {
      void *pc = s->frames[e * MP__HIST_FRAMES + k];
      Dl_info di;
      char name[512];
      const char *file = "??";
      if (dladdr(pc, &di) != 0) {
        if (di.dli_fname != NULL)
          file = di.dli_fname;
        /* A name longer than the buffer (C++ templates) is shortened in
         * its middle, so its end and the offset stay. */
        char sym[sizeof name - 32];
        if (di.dli_sname != NULL)
          snprintf(
              name, sizeof name, "%s+0x%zx",
              mp__clip(di.dli_sname, strlen(di.dli_sname), sym, sizeof sym),
              (size_t)((uintptr_t)pc - (uintptr_t)di.dli_saddr));
        else
          snprintf(name, sizeof name, "?? (%p)", pc);
      } else {
        snprintf(name, sizeof name, "?? (%p)", pc);
      }
      mp__pk_dict(w);
      mp__pk_kstr(w, "filename", file);
      mp__pk_kint(w, "line", 0);
      mp__pk_kstr(w, "name", name);
      mp__pk_dict_end(w);
    }
  }
  mp__pk_list_end(w);
}

/* One block's dict: its frames those of event e (SIZE_MAX: none). */
static void mp__write_block(mp__pk_t *w, const mp__snap_t *s, uintptr_t addr,
                            size_t size, size_t requested, const char *state,
                            size_t e) {
  mp__pk_dict(w);
  mp__pk_kint(w, "address", addr);
  mp__pk_kint(w, "size", size);
  mp__pk_kint(w, "requested_size", requested);
  mp__pk_kstr(w, "state", state);
  mp__write_frames(w, s, e);
  mp__pk_dict_end(w);
}

/* One PyTorch segment: blocks [b0, b1) of s, none a hole. */
static void mp__write_segment(mp__pk_t *w, const mp__snap_t *s, size_t b0,
                              size_t b1, int kind, bool small) {
  size_t total = 0, allocated = 0, active = 0, requested = 0;
  /* Its stream: PyTorch's segment is one stream's, its head block's
   * (CUDACachingAllocator.cpp, snapshot(): segment_info.stream =
   * head_block->stream; memory_snapshot.cpp writes int64_t(stream)). Here
   * every stream shares the segments: the stream of its lowest active
   * block whose stream the pool knows, else (below) its making's. */
  uint64_t stream = 0;
  bool has_stream = false;
  for (size_t i = b0; i < b1; i++) {
    if (!has_stream && mp__sblock_active(&s->blocks[i]) &&
        s->blocks[i].has_stream) {
      stream = s->blocks[i].stream;
      has_stream = true;
    }
    total += s->blocks[i].size;
    if (s->blocks[i].live)
      allocated += s->blocks[i].size;
    if (mp__sblock_active(&s->blocks[i])) {
      active += s->blocks[i].size;
      requested += s->blocks[i].requested;
    }
  }
  /* None active: the stream its memory was made for, as PyTorch's segment
   * keeps its stream while wholly free (CUDACachingAllocator.cpp,
   * alloc_block: the segment's head block is made on p.stream()): the one
   * the pool keeps with the segment or its head's chunk. It was that of the
   * newest segment_alloc or segment_map event at its address in the ring:
   * 0 once the ring had dropped it, and without history. */
  if (!has_stream && s->blocks[b0].made_for != (uintptr_t)MP__STREAM_GONE)
    stream = s->blocks[b0].made_for;
  mp__pk_dict(w);
  mp__pk_kint(w, "device", (uint64_t)s->device);
  mp__pk_kint(w, "address", s->blocks[b0].addr);
  mp__pk_kint(w, "total_size", total);
  mp__pk_kint(w, "allocated_size", allocated);
  mp__pk_kint(w, "active_size", active);
  mp__pk_kint(w, "requested_size", requested);
  mp__pk_kint(w, "stream", stream);
  mp__pk_kstr(w, "segment_type", small ? "small" : "large");
  mp__pk_str(w, "segment_pool_id");
  mp__pk_int(w, s->pool_id[0]);
  mp__pk_int(w, s->pool_id[1]);
  mp__pk_op(w, 0x86); /* TUPLE2 */
  mp__pk_str(w, "is_expandable");
  mp__pk_bool(w, kind == MP__SEG_VIRTUAL);
  mp__write_frames(w, s, SIZE_MAX);
  mp__pk_str(w, "blocks");
  mp__pk_list(w);
  for (size_t i = b0; i < b1; i++) {
    const mp__sblock_t *b = &s->blocks[i];
    mp__write_block(w, s, b->addr, b->size, b->requested,
                    b->live      ? "active_allocated"
                    : b->pending ? "active_pending_free"
                                 : "inactive",
                    mp__sblock_active(b) ? b->ev : SIZE_MAX);
  }
  mp__pk_list_end(w);
  mp__pk_dict_end(w);
}

static const char *const mp__hist_names[MP__H_NACTIONS] = {
    [MP__H_ALLOC] = "alloc",
    [MP__H_FREE_REQUESTED] = "free_requested",
    [MP__H_FREE_COMPLETED] = "free_completed",
    [MP__H_SEGMENT_MAP] = "segment_map",
    [MP__H_SEGMENT_UNMAP] = "segment_unmap",
    [MP__H_SEGMENT_ALLOC] = "segment_alloc",
    [MP__H_SEGMENT_FREE] = "segment_free",
    [MP__H_OOM] = "oom",
};

/* Segments: runs of blocks between holes. */
static void mp__write_segments(mp__pk_t *w, const mp__snap_t *s) {
  for (size_t g = 0; g < s->nsegs; g++) {
    size_t i = s->segs[g].first, end = i + s->segs[g].nblocks;
    while (i < end) {
      while (i < end && s->blocks[i].hole)
        i++;
      size_t j = i;
      while (j < end && !s->blocks[j].hole)
        j++;
      if (j > i)
        mp__write_segment(w, s, i, j, s->segs[g].kind, s->segs[g].small);
      i = j;
    }
  }
}

static void mp__write_event(mp__pk_t *w, const mp__snap_t *s, size_t e) {
  const mp__hevent_t *ev = &s->ev[e];
  mp__pk_dict(w);
  mp__pk_kstr(w, "action", mp__hist_names[ev->action]);
  /* An oom entry has device_free in addr's place, as PyTorch writes it
   * (torch/csrc/cuda/memory_snapshot.cpp: device_free for an OOM, else
   * addr; memory.py's TraceEntry: addr "not present for OOM"), which
   * _memory_viz.py's trace() and MemoryViz.js's formatEvent read. */
  mp__pk_kint(w, ev->action == MP__H_OOM ? "device_free" : "addr", ev->addr);
  mp__pk_kint(w, "size", ev->size);
  mp__pk_kint(w, "stream", ev->stream);
  mp__pk_kint(w, "time_us", ev->time_us);
  mp__write_frames(w, s, e);
  mp__pk_dict_end(w);
}

/* Device d's trace: the events of every snapshot on d (a pool, or each
 * arena of a pool with arenas, each its own ring, oldest first), merged
 * oldest first by time; a tie goes to the earlier snapshot. */
static void mp__write_trace(mp__pk_t *w, mp__snap_t *snaps, size_t n, int d) {
  for (;;) {
    mp__snap_t *best = NULL;
    for (size_t k = 0; k < n; k++) {
      mp__snap_t *s = &snaps[k];
      if (s->device == d && s->next < s->nev &&
          (best == NULL ||
           s->ev[s->next].time_us < best->ev[best->next].time_us))
        best = s;
    }
    if (best == NULL)
      return;
    mp__write_event(w, best, best->next++);
  }
}

static void mp__write_snapshot(mp__pk_t *w, mp__snap_t *snaps, size_t n) {
  mp__pk_op(w, 0x80); /* PROTO 2 */
  mp__pk_op(w, 2);
  mp__pk_dict(w);
  mp__pk_str(w, "segments");
  mp__pk_list(w);
  int top = 0;
  for (size_t k = 0; k < n; k++) {
    mp__write_segments(w, &snaps[k]);
    top = snaps[k].device > top ? snaps[k].device : top;
  }
  mp__pk_list_end(w);
  /* device_traces[d] is device d's (PyTorch indexes it by ordinal). */
  mp__pk_str(w, "device_traces");
  mp__pk_list(w);
  for (int d = 0; d <= top; d++) {
    mp__pk_list(w);
    mp__write_trace(w, snaps, n, d);
    mp__pk_list_end(w);
  }
  mp__pk_list_end(w);
  mp__pk_dict_end(w);
  mp__pk_op(w, '.'); /* STOP */
}

static void mp__snaps_free(mp__snap_t *snaps, size_t n) {
  for (size_t k = 0; k < n; k++)
    mp__snap_free(&snaps[k]);
  free(snaps);
}

static mp_status_t mp__snapshot_write(mp_pool_t *const *pools,
                                      const int *devices, size_t n, FILE *out) {
  mp__snap_t *snaps = mp__host_calloc(n ? n : 1, sizeof *snaps);
  if (snaps == NULL)
    return mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
  mp_status_t st = MP_OK;
  size_t got = 0;
  for (; st == MP_OK && got < n; got++) {
    mp__pool_lock(pools[got]);
    /* A growth or release in flight has the lock dropped halfway (a
     * segment unlinked but still counted, or not there yet): wait for it,
     * as mp_pool_check and mp_pool_dump do (mp__pool_wait_for): not for
     * a graph pool's growth that this thread runs (its parent's
     * out-of-memory handler takes the snapshot), copied as it is; from a
     * host function, MP_EBUSY instead of the wait. */
    st = mp__pool_wait_for(pools[got], "mp_pool_snapshot", false);
    if (st == MP_OK)
      st = mp__snap_take(pools[got], &snaps[got]);
    mp__pool_unlock(pools[got]);
    if (st != MP_OK)
      break;
    snaps[got].device = devices[got];
    st = mp__snap_link_events(&snaps[got]);
  }
  if (st == MP_OK) {
    mp__pk_t w = {.f = out};
    errno = 0;
    mp__write_snapshot(&w, snaps, n);
    if (!w.bad && fflush(out) != 0)
      w.err = errno != 0 ? errno : EIO;
    /* A writer bug (nesting past its depth) is no errno of the file's. */
    if (w.bad && w.err == 0)
      st = mp__fail(MP_EIO, "mp_pool_snapshot: write error: the pickle's "
                            "containers nest too deep");
    else if (w.bad || w.err != 0)
      st = mp__fail(MP_EIO, "mp_pool_snapshot: write error: %s",
                    strerror(w.err));
  }
  mp__snaps_free(snaps, n);
  return st;
}

/* mp__snapshot_write over what the pools hold: a pool with arenas holds
 * nothing itself, so each arena made so far stands in for it (its
 * segments, with the pool's device ordinal); room for the arenas, or for
 * the pool itself when none is made. */
static mp_status_t mp__snapshot_write_all(mp_pool_t *const *pools,
                                          const int *devices, size_t n,
                                          FILE *out) {
  size_t m = 0;
  for (size_t k = 0; k < n; k++)
    m += pools[k]->arenas != NULL ? pools[k]->cfg.arenas : 1;
  mp_pool_t **xp = mp__host_calloc(m, sizeof *xp);
  int *xd = mp__host_calloc(m, sizeof *xd);
  mp_status_t st = MP_OK;
  if (xp == NULL || xd == NULL) {
    st = mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
  } else {
    size_t x = 0;
    for (size_t k = 0; k < n; k++) {
      if (pools[k]->arenas == NULL) {
        xd[x] = devices[k];
        xp[x++] = pools[k];
        continue;
      }
      size_t first = x;
      for (size_t i = 0; i < pools[k]->cfg.arenas; i++)
        if ((xp[x] = mp__arena_at(pools[k], i)) != NULL)
          xd[x++] = devices[k];
      /* No arena yet: the pool itself (no segment, no event), so that its
       * device still has its list of traces. */
      if (x == first) {
        xd[x] = devices[k];
        xp[x++] = pools[k];
      }
    }
    st = mp__snapshot_write(xp, xd, x, out);
  }
  free(xp);
  free(xd);
  return st;
}

mp_status_t mp_pool_snapshot_file(mp_pool_t *pool, FILE *out) {
  if (pool == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_snapshot: %s is NULL",
                    pool == NULL ? "pool" : "out");
  /* Its device's ordinal (cuda:N is N, the host device 0). */
  int device = mp__device_ordinal(pool->dev);
  return mp__snapshot_write_all(&pool, &device, 1, out);
}

/* A new temporary in the folder dirfd, beside its file base, its name in
 * tmp (tn bytes), created as open(2) creates any file: mode 0666 less the
 * umask (default ACLs applied), not mkstemp's 0600, which the renamed
 * snapshot kept; exclusive and never through a link, so never a file that
 * was there, and named with the clock's nanoseconds too, so that names made
 * ahead in a shared directory do not block it. Its name is base's own with
 * the suffix, base cut to leave the suffix room where the two would pass
 * NAME_MAX (the open's ENAMETOOLONG refused a path that can be written).
 * tn: at least strlen(base) + 64. The descriptor, or -1 (errno set). */
static int mp__snap_tmp_open(int dirfd, const char *base, char *tmp,
                             size_t tn) {
  static atomic_uint seq;
  size_t base_len = strlen(base);
  for (int tries = 0; tries < 64; tries++) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char suffix[64];
    size_t sl = (size_t)snprintf(suffix, sizeof suffix, ".tmp.%ld.%u.%lx",
                                 (long)getpid(), atomic_fetch_add(&seq, 1),
                                 (unsigned long)ts.tv_nsec);
    size_t keep = base_len + sl > NAME_MAX ? NAME_MAX - sl : base_len;
    snprintf(tmp, tn, "%.*s%s", (int)keep, base, suffix);
    int fd = openat(dirfd, tmp,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST)
      return fd;
  }
  return -1;
}

/* A failed write through the link base (in dirfd) to nothing: the file
 * its open made, ob, is removed, so that the snapshot is written whole or
 * not at all (it was left cut short). Only that file: the one the link
 * names now, if it still is ob. */
static void mp__snap_unmake(int dirfd, const char *base,
                            const struct stat *ob) {
  char to[PATH_MAX];
  ssize_t k = readlinkat(dirfd, base, to, sizeof to - 1);
  if (k <= 0)
    return;
  to[k] = '\0';
  struct stat now;
  if (fstatat(dirfd, to, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
      now.st_dev == ob->st_dev && now.st_ino == ob->st_ino)
    (void)unlinkat(dirfd, to, 0);
}

/* The folder that holds path's last component, opened (O_PATH) so that
 * what is checked there and what is written or renamed there are in the
 * same folder whatever becomes of the path's other components meanwhile;
 * *base: that component, in path. -1 (errno set) when it cannot be. */
static int mp__snap_dir_open(const char *path, const char **base) {
  const char *slash = strrchr(path, '/');
  *base = slash != NULL ? slash + 1 : path;
  if (slash == NULL)
    return open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  size_t dl = slash == path ? 1 : (size_t)(slash - path);
  char *dir = mp__host_alloc(dl + 1);
  if (dir == NULL) {
    errno = ENOMEM;
    return -1;
  }
  memcpy(dir, path, dl);
  dir[dl] = '\0';
  int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  return fd;
}

mp_status_t mp__pool_snapshot_many(mp_pool_t *const *pools, const int *devices,
                                   size_t n, const char *path) {
  if (n == 0 || pools == NULL || devices == NULL || path == NULL ||
      path[0] == '\0')
    return mp__fail(MP_EINVAL, "mp_pool_snapshot: %s",
                    path == NULL || path[0] == '\0' ? "path is NULL or empty"
                                                    : "no pool");
  for (size_t k = 0; k < n; k++)
    if (pools[k] == NULL || devices[k] < 0 || devices[k] >= 1 << 16)
      return mp__fail(MP_EINVAL,
                      "mp_pool_snapshot: pool %zu is NULL or its "
                      "device ordinal is out of range",
                      k);
  /* A path that is there and is no regular file (a device such as
   * /dev/null, a FIFO) is written in place: renamed over, it would be
   * replaced by a regular file (with root's rights, the device node
   * itself). A symbolic link to a regular file is followed: the file it
   * names is replaced as a regular path is (written in place, a failed
   * snapshot left it truncated), and the link stays a link; a link to
   * anything else is written through in place.
   *
   * What is checked is what is written: the path's folder is opened once
   * and everything after is relative to it (a folder swapped for a link
   * meanwhile changes nothing), and a file written in place is opened
   * without following a link and without truncating, then fstat'ed: one
   * swapped meanwhile for a link or a regular file (which the check would
   * have replaced whole, not written into) is refused untouched. */
  char shown[MP__CLIP]; /* path as messages quote it, the reason after */
  mp__clip(path, strlen(path), shown, sizeof shown);
  struct stat sb;
  char *target = NULL; /* the file a link names, from realpath */
  bool is_link = lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
  bool dangling = false; /* a link to nothing */
  if (is_link && (target = realpath(path, NULL)) == NULL)
    dangling = errno == ENOENT;
  if (target != NULL) {
    /* The check is of the path that will be replaced, resolved first: a
     * stat of the link, before, could pass for a file that the link no
     * longer named when it was resolved (a FIFO renamed over). */
    struct stat tb;
    if (lstat(target, &tb) == 0 && S_ISREG(tb.st_mode)) {
      path = target;
      is_link = false;
    } else {
      free(target);
      target = NULL;
    }
  }
  const char *base;
  int dirfd = mp__snap_dir_open(path, &base);
  if (dirfd < 0 || base[0] == '\0') {
    int err = dirfd < 0 ? errno : EISDIR;
    mp_status_t st =
        err == ENOMEM
            ? mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory")
            : mp__fail(MP_EIO, "mp_pool_snapshot: cannot write '%s': %s", shown,
                       strerror(err));
    if (dirfd >= 0)
      close(dirfd);
    free(target);
    return st;
  }
  bool there = fstatat(dirfd, base, &sb, AT_SYMLINK_NOFOLLOW) == 0;
  if (there && !S_ISREG(sb.st_mode)) {
    /* In place. A link (to no regular file) is followed, as documented;
     * one that names nothing yet gets its file made, as a write through it
     * makes one, never truncated: a file there by the open, not empty, is
     * one the link was pointed at meanwhile. */
    int fd = openat(dirfd, base,
                    O_WRONLY | O_CLOEXEC | O_NOCTTY |
                        (is_link ? 0 : O_NOFOLLOW) | (dangling ? O_CREAT : 0),
                    0666);
    struct stat ob;
    bool known = fd >= 0 && fstat(fd, &ob) == 0; /* ob is read only so */
    bool swapped =
        known && S_ISREG(ob.st_mode) && !(dangling && ob.st_size == 0);
    FILE *f = fd >= 0 && !swapped ? fdopen(fd, "wb") : NULL;
    if (f == NULL) {
      mp_status_t st =
          fd < 0 && errno == ELOOP && !is_link
              ? mp__fail(MP_EIO,
                         "mp_pool_snapshot: '%s' became a symbolic link "
                         "while it was written: not written",
                         shown)
          : swapped
              ? mp__fail(MP_EIO,
                         "mp_pool_snapshot: '%s' became a regular file "
                         "while it was written: not written",
                         shown)
              : mp__fail(MP_EIO, "mp_pool_snapshot: cannot write '%s': %s",
                         shown, strerror(errno));
      if (fd >= 0)
        close(fd);
      close(dirfd);
      free(target);
      return st;
    }
    free(target);
    mp_status_t st = mp__snapshot_write_all(pools, devices, n, f);
    if (fclose(f) != 0 && st == MP_OK)
      st = mp__fail(MP_EIO, "mp_pool_snapshot: write error on '%s'", shown);
    if (st != MP_OK && dangling && known)
      mp__snap_unmake(dirfd, base, &ob);
    close(dirfd);
    return st;
  }
  /* Otherwise a temporary beside path, renamed over it once complete: a
   * failed snapshot leaves whatever was at path untouched. A file it
   * replaces keeps its mode, owner and group, as a write in place would leave
   * it. The rename follows no link: whatever was put at path meanwhile is
   * replaced (a folder refuses it), never written through. A file there that
   * the caller may not write is refused untouched, as fopen(path, "wb") or
   * PyTorch's _dump_snapshot refuse it: the folder's rights alone let the
   * rename replace it. */
  if (there && faccessat(dirfd, base, W_OK, AT_EACCESS) != 0 &&
      (errno == EACCES || errno == EPERM || errno == EROFS)) {
    mp_status_t st = mp__fail(MP_EIO, "mp_pool_snapshot: cannot write '%s': %s",
                              shown, strerror(errno));
    close(dirfd);
    free(target);
    return st;
  }
  size_t tn = strlen(base) + 64;
  char *tmp = mp__host_alloc(tn);
  if (tmp == NULL) {
    close(dirfd);
    free(target);
    return mp__fail(MP_ENOMEM, "mp_pool_snapshot: out of host memory");
  }
  int fd = mp__snap_tmp_open(dirfd, base, tmp, tn);
  /* Its owner and group too (as far as the caller may give them: root
   * any, another user the groups it is in), then its mode (a chown may
   * clear bits of it). */
  if (fd >= 0 && there) {
    if (fchown(fd, sb.st_uid, sb.st_gid) != 0)
      (void)fchown(fd, (uid_t)-1, sb.st_gid);
    (void)fchmod(fd, sb.st_mode & 0777);
  }
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (f == NULL) {
    mp_status_t st = mp__fail(MP_EIO, "mp_pool_snapshot: cannot write '%s': %s",
                              shown, strerror(errno));
    if (fd >= 0) {
      close(fd);
      unlinkat(dirfd, tmp, 0);
    }
    close(dirfd);
    free(tmp);
    free(target);
    return st;
  }
  mp_status_t st = mp__snapshot_write_all(pools, devices, n, f);
  if (fclose(f) != 0 && st == MP_OK)
    st = mp__fail(MP_EIO, "mp_pool_snapshot: write error on '%s'", shown);
  if (st == MP_OK && renameat(dirfd, tmp, dirfd, base) != 0)
    st = mp__fail(MP_EIO, "mp_pool_snapshot: cannot rename onto '%s': %s",
                  shown, strerror(errno));
  if (st != MP_OK)
    unlinkat(dirfd, tmp, 0);
  close(dirfd);
  free(tmp);
  free(target);
  return st;
}

mp_status_t mp_pool_snapshot(mp_pool_t *pool, const char *path) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_snapshot: pool is NULL");
  /* Its device's ordinal (cuda:N is N, the host device 0). */
  int device = mp__device_ordinal(pool->dev);
  return mp__pool_snapshot_many(&pool, &device, 1, path);
}
