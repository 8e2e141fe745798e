/* offline.c - the offline reference: how little memory an allocator could
 * hold for a workload if it knew the whole event list in advance.
 *
 * Every allocation becomes an item: its size (rounded up to the pool's
 * alignment, as the pool rounds every block) and the events during which it
 * is on the device, [t0, t1) in event indices: from its MPB_ALLOC to its
 * MPB_FREE, cut where its tenant pauses (a paused tenant's blocks are not on
 * the device, as mpb_workload_peak_live counts them) and begun again where
 * it resumes. Graph events and streams are ignored: the placement is the
 * caught-up case, where a freed block is reusable by anyone at the next
 * event. The sizes live after an event add up to the live bytes mpb_replay
 * counts (rounded), so no placement ends below peak live.
 *
 * Placing items at fixed offsets of one flat range so that no two that live
 * at the same time overlap, with the highest end as low as possible, is
 * offline dynamic storage allocation, NP-complete as a decision problem
 * (Garey and Johnson, problem SR2). The heuristic here is greedy: items in
 * one order, each at the lowest offset that is free over its whole
 * lifetime (first fit among the placed items that overlap it in time). The
 * orders, best end kept: largest size first (the "greedy by size" offset
 * assignment of Pisarchyk and Lee, "Efficient Memory Management for Deep
 * Neural Net Inference", 2020), longest lifetime first, largest size x
 * lifetime first, earliest start first (an online first fit on the same
 * range: the reference is never worse than it), then rounds of largest
 * size first with each size scaled by a random 1 +- 5..20% (a randomized
 * restart of the same greedy), bounded by MPB_OFFLINE_ROUNDS and by the
 * work of MPB_OFFLINE_WORK, with a fixed seed. No round runs once the
 * range is down to the granule bound. A heuristic: the optimum may lie
 * lower; it never lies below peak live.
 *
 * Each placement also gives the most granules its live items touch at
 * once: what an allocator with virtual memory maps if it unmaps a granule
 * as soon as nothing lives in it (mpb_mapped_peak); the lowest over all
 * placements is reported beside the range's end.
 *
 * Items that overlap in time are found through time buckets of
 * MPB_OFFLINE_BUCKET events: a placed item is listed, by offset, in every
 * bucket its lifetime touches; a query reads the buckets of its own
 * lifetime, taking each item only in the first bucket both share, and
 * merges their runs into offset order. */
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* mp__fail */
#include "mpbench.h"
#include "xorshift.h"

enum { MPB_OFFLINE_BUCKET = 256 };
/* The jittered rounds: at most this many, and none begun once the
 * placements so far read this many bucket entries (a count, not a clock,
 * so that the figures are the same on every machine). */
enum { MPB_OFFLINE_ROUNDS = 64 };
#define MPB_OFFLINE_WORK ((uint64_t)200 * 1000 * 1000)

typedef struct mpb_item {
  size_t size;   /* rounded up to the alignment */
  size_t t0, t1; /* on the device from event t0 up to, not including, t1 */
  double area;   /* size x lifetime, for the third order */
  double key;    /* size, jittered: for the rounds of mpb_by_key */
  uint32_t id;   /* index in start order */
} mpb_item_t;

const char *const mpb_offline_orders[MPB_OFFLINE_ORDERS] = {
    "size", "lifetime", "area", "start", "jittered size"};

/* ---- items ------------------------------------------------------------ */

/* Ties: earlier start, then start order, so every order is total and the
 * placement the same on every machine. */
static int mpb_tie(const mpb_item_t *a, const mpb_item_t *b) {
  if (a->t0 != b->t0)
    return a->t0 < b->t0 ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

typedef struct mpb_items {
  mpb_item_t *v;
  size_t n, cap;
} mpb_items_t;

static bool mpb_items_push(mpb_items_t *it, size_t size, size_t t0, size_t t1) {
  if (t1 <= t0 || size == 0)
    return true; /* never on the device at an event's end */
  if (!mpb_grow(&it->v, &it->cap, it->n, sizeof *it->v))
    return false;
  it->v[it->n] = (mpb_item_t){.size = size,
                              .t0 = t0,
                              .t1 = t1,
                              .area = (double)size * (double)(t1 - t0),
                              .id = (uint32_t)it->n};
  it->n++;
  return true;
}

static int mpb_tie_cmp(const void *a, const void *b) {
  return mpb_tie(a, b);
}

/* The items of w, in the order their lifetimes begin (pieces that begin
 * at one event, a resume: in the order they end). Sizes are rounded up to
 * align. */
static mp_status_t mpb_items_of(const mpb_workload_t *w, size_t align,
                                mpb_items_t *it) {
  uint32_t ns = w->nslots ? w->nslots : 1;
  size_t *start = malloc(ns * sizeof *start); /* SIZE_MAX: not on device */
  size_t *size = calloc(ns, sizeof *size);    /* 0: not live */
  uint8_t *owner = calloc(ns, 1);
  bool paused[MPB_MAX_TENANTS] = {false};
  mp_status_t st = MP_OK;
  if (start == NULL || size == NULL || owner == NULL) {
    st = mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
    goto out;
  }
  bool ok = true;
  for (size_t i = 0; i < w->n && ok; i++) {
    const mpb_event_t *e = &w->ev[i];
    switch (e->op) {
    case MPB_ALLOC:
      if (e->size == 0) /* replayed as NULL: nothing on the device */
        break;
      if (e->size > SIZE_MAX - (align - 1)) {
        st = mp__fail(MP_EINVAL, "%s: event %zu: size %zu too large", w->name,
                      i + 1, e->size);
        goto out;
      }
      size[e->slot] = (e->size + align - 1) / align * align;
      owner[e->slot] = e->tenant;
      start[e->slot] = paused[e->tenant] ? SIZE_MAX : i;
      break;
    case MPB_FREE:
      if (size[e->slot] != 0 && start[e->slot] != SIZE_MAX)
        ok = mpb_items_push(it, size[e->slot], start[e->slot], i);
      size[e->slot] = 0;
      break;
    case MPB_PAUSE:
    case MPB_RESUME:
      if ((e->op == MPB_PAUSE) == paused[e->tenant])
        break; /* already so */
      paused[e->tenant] = e->op == MPB_PAUSE;
      for (uint32_t s = 0; s < w->nslots && ok; s++) {
        if (size[s] == 0 || owner[s] != e->tenant)
          continue;
        if (e->op == MPB_PAUSE)
          ok = mpb_items_push(it, size[s], start[s], i);
        start[s] = e->op == MPB_PAUSE ? SIZE_MAX : i;
      }
      break;
    default: break; /* graph events: the placement has no graph pools */
    }
  }
  /* A workload ends empty (trace.c and the generators drain it); anything
   * left lives to the end. */
  for (uint32_t s = 0; s < w->nslots && ok; s++)
    if (size[s] != 0 && start[s] != SIZE_MAX)
      ok = mpb_items_push(it, size[s], start[s], w->n);
  if (!ok) {
    st = mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
    goto out;
  }
  /* Pushed as they ended: into the order they begin (ids count ends, so
   * ties keep that order). */
  qsort(it->v, it->n, sizeof *it->v, mpb_tie_cmp);
  for (size_t i = 0; i < it->n; i++)
    it->v[i].id = (uint32_t)i;
out:
  free(start);
  free(size);
  free(owner);
  return st;
}

/* ---- orders ----------------------------------------------------------- */

static int mpb_by_size(const void *pa, const void *pb) {
  const mpb_item_t *a = pa, *b = pb;
  if (a->size != b->size)
    return a->size > b->size ? -1 : 1;
  if (a->t1 - a->t0 != b->t1 - b->t0)
    return a->t1 - a->t0 > b->t1 - b->t0 ? -1 : 1;
  return mpb_tie(a, b);
}

static int mpb_by_lifetime(const void *pa, const void *pb) {
  const mpb_item_t *a = pa, *b = pb;
  if (a->t1 - a->t0 != b->t1 - b->t0)
    return a->t1 - a->t0 > b->t1 - b->t0 ? -1 : 1;
  if (a->size != b->size)
    return a->size > b->size ? -1 : 1;
  return mpb_tie(a, b);
}

static int mpb_by_area(const void *pa, const void *pb) {
  const mpb_item_t *a = pa, *b = pb;
  if (a->area != b->area)
    return a->area > b->area ? -1 : 1;
  return mpb_by_size(pa, pb);
}

/* Largest jittered size first: the rounds after the fixed orders. */
static int mpb_by_key(const void *pa, const void *pb) {
  const mpb_item_t *a = pa, *b = pb;
  if (a->key != b->key)
    return a->key > b->key ? -1 : 1;
  return mpb_by_size(pa, pb);
}

/* Earliest start first (mpb_tie_cmp): a first-fit allocator that sees each
 * request as it comes, on the same flat range, so that the reference is
 * never worse than that online policy. */
static int (*const mpb_order_cmp[MPB_OFFLINE_ORDERS])(const void *,
                                                      const void *) = {
    mpb_by_size, mpb_by_lifetime, mpb_by_area, mpb_tie_cmp, mpb_by_key};

/* ---- placement -------------------------------------------------------- */

/* A placed item as its buckets list it: where it lies and when it lives. */
typedef struct mpb_entry {
  size_t lo, hi; /* offsets [lo, hi) */
  size_t t0, t1;
} mpb_entry_t;

/* One time bucket: the placed items whose lifetime touches it, by offset. */
typedef struct mpb_bucket {
  mpb_entry_t *e;
  size_t n, cap;
} mpb_bucket_t;

typedef struct mpb_span {
  size_t lo, hi; /* offsets an item occupies */
} mpb_span_t;

typedef struct mpb_layout {
  mpb_bucket_t *bucket;
  size_t nbuckets;
  /* Scratch: the spans overlapping the item being placed, a run in offset
   * order per bucket read (run[r] is where run r begins), and room to
   * merge them. */
  mpb_span_t *busy, *tmp;
  size_t nbusy, busy_cap, tmp_cap;
  size_t *run, nrun, run_cap;
  uint64_t visits; /* bucket entries read: the work done, for the caller */
} mpb_layout_t;

/* Merges the runs of l->busy pairwise until one is left, in offset order
 * (log2 of the buckets passes, where a sort would take log2 of the spans). */
static bool mpb_merge_runs(mpb_layout_t *l) {
  if (l->nrun <= 1)
    return true;
  if (l->tmp_cap < l->busy_cap) {
    mpb_span_t *t = realloc(l->tmp, l->busy_cap * sizeof *t);
    if (t == NULL)
      return false;
    l->tmp = t;
    l->tmp_cap = l->busy_cap;
  }
  l->run[l->nrun] = l->nbusy;
  while (l->nrun > 1) {
    size_t out = 0, nrun = 0;
    for (size_t r = 0; r < l->nrun; r += 2) {
      size_t a = l->run[r], ae = l->run[r + 1];
      size_t b = ae, be = r + 2 <= l->nrun ? l->run[r + 2] : ae;
      l->run[nrun++] = out;
      while (a < ae && b < be)
        l->tmp[out++] =
            l->busy[b].lo < l->busy[a].lo ? l->busy[b++] : l->busy[a++];
      while (a < ae)
        l->tmp[out++] = l->busy[a++];
      while (b < be)
        l->tmp[out++] = l->busy[b++];
    }
    l->run[nrun] = out;
    l->nrun = nrun;
    mpb_span_t *t = l->busy;
    l->busy = l->tmp;
    l->tmp = t;
    size_t c = l->busy_cap;
    l->busy_cap = l->tmp_cap;
    l->tmp_cap = c;
  }
  return true;
}

/* The spans of the placed items that live at some event of x's lifetime,
 * into l->busy by offset. */
static bool mpb_overlapping(mpb_layout_t *l, const mpb_item_t *x) {
  size_t b0 = x->t0 / MPB_OFFLINE_BUCKET, b1 = (x->t1 - 1) / MPB_OFFLINE_BUCKET;
  l->nbusy = 0;
  l->nrun = 0;
  for (size_t b = b0; b <= b1; b++) {
    const mpb_bucket_t *bk = &l->bucket[b];
    l->visits += bk->n;
    if (!mpb_grow(&l->run, &l->run_cap, l->nrun + 1, sizeof *l->run))
      return false;
    l->run[l->nrun++] = l->nbusy;
    for (size_t k = 0; k < bk->n; k++) {
      const mpb_entry_t *p = &bk->e[k];
      size_t first = p->t0 / MPB_OFFLINE_BUCKET;
      if (p->t0 >= x->t1 || x->t0 >= p->t1 || (first > b0 ? first : b0) != b)
        continue; /* apart in time, or taken in an earlier bucket */
      if (!mpb_grow(&l->busy, &l->busy_cap, l->nbusy, sizeof *l->busy))
        return false;
      l->busy[l->nbusy++] = (mpb_span_t){p->lo, p->hi};
    }
  }
  return mpb_merge_runs(l);
}

/* The lowest offset where an item of size fits between the spans of
 * l->busy (first fit). */
static size_t mpb_first_fit(const mpb_layout_t *l, size_t size) {
  size_t at = 0;
  for (size_t k = 0; k < l->nbusy; k++) {
    if (l->busy[k].lo >= at && l->busy[k].lo - at >= size)
      break; /* the gap below this span holds it */
    if (l->busy[k].hi > at)
      at = l->busy[k].hi;
  }
  return at;
}

/* Lists e in bucket bk, keeping it in offset order. */
static bool mpb_bucket_add(mpb_bucket_t *bk, const mpb_entry_t *e) {
  if (!mpb_grow(&bk->e, &bk->cap, bk->n, sizeof *bk->e))
    return false;
  size_t lo = 0, hi = bk->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (bk->e[mid].lo <= e->lo)
      lo = mid + 1;
    else
      hi = mid;
  }
  memmove(&bk->e[lo + 1], &bk->e[lo], (bk->n - lo) * sizeof *bk->e);
  bk->e[lo] = *e;
  bk->n++;
  return true;
}

/* Places every item in the order of cmp; the highest end in *high, each
 * item's offset in offset[id], and the bucket entries read in *visits. */
static mp_status_t mpb_place(const mpb_items_t *it, size_t events,
                             int (*cmp)(const void *, const void *),
                             size_t *offset, size_t *high, uint64_t *visits) {
  mpb_layout_t l = {0};
  mpb_item_t *order = malloc((it->n ? it->n : 1) * sizeof *order);
  l.nbuckets = events / MPB_OFFLINE_BUCKET + 1;
  l.bucket = calloc(l.nbuckets, sizeof *l.bucket);
  mp_status_t st = MP_OK;
  *high = 0;
  if (order == NULL || l.bucket == NULL)
    goto oom;
  memcpy(order, it->v, it->n * sizeof *order);
  qsort(order, it->n, sizeof *order, cmp);
  for (size_t i = 0; i < it->n; i++) {
    const mpb_item_t *x = &order[i];
    if (!mpb_overlapping(&l, x))
      goto oom;
    size_t at = mpb_first_fit(&l, x->size);
    if (at > SIZE_MAX - x->size) {
      st = mp__fail(MP_EINVAL,
                    "offline placement: a block of %zu bytes placed at "
                    "offset %zu would end past the address space",
                    x->size, at);
      goto out;
    }
    offset[x->id] = at;
    if (at + x->size > *high)
      *high = at + x->size;
    mpb_entry_t e = {at, at + x->size, x->t0, x->t1};
    for (size_t b = x->t0 / MPB_OFFLINE_BUCKET;
         b <= (x->t1 - 1) / MPB_OFFLINE_BUCKET; b++)
      if (!mpb_bucket_add(&l.bucket[b], &e))
        goto oom;
  }
  goto out;
oom:
  st = mp__fail(MP_ENOMEM, "offline placement: out of host memory");
out:
  for (size_t b = 0; l.bucket != NULL && b < l.nbuckets; b++)
    free(l.bucket[b].e);
  free(l.bucket);
  free(l.busy);
  free(l.tmp);
  free(l.run);
  free(order);
  *visits = l.visits;
  return st;
}

/* ---- granules mapped --------------------------------------------------- */

typedef struct mpb_change {
  size_t t;
  uint32_t id;
  uint8_t start; /* 0: the item ends at t, 1: it begins */
} mpb_change_t;

static int mpb_change_cmp(const void *pa, const void *pb) {
  const mpb_change_t *a = pa, *b = pb;
  if (a->t != b->t)
    return a->t < b->t ? -1 : 1;
  return (a->start > b->start) - (a->start < b->start);
}

static int mpb_size_cmp(const void *pa, const void *pb) {
  size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
  return (a > b) - (a < b);
}

/* The index of granule g in keys (m sorted, distinct; g among them). */
static size_t mpb_key_index(const size_t *keys, size_t m, size_t g) {
  const size_t *k = bsearch(&g, keys, m, sizeof *keys, mpb_size_cmp);
  return (size_t)(k - keys);
}

/* The first (*g0) and last (*g1) granule of a block of size bytes at off,
 * and the number of granules strictly between them: no other live block
 * lies there (live blocks never overlap), so only the first and last are
 * ever shared and counted one by one. */
static size_t mpb_span(size_t off, size_t size, size_t granule, size_t *g0,
                       size_t *g1) {
  *g0 = off / granule;
  *g1 = (off + size - 1) / granule;
  return *g1 > *g0 ? *g1 - *g0 - 1 : 0;
}

/* The most bytes of whole granules that live items touch at once, given
 * each item's offset: what an allocator with this placement maps if it
 * maps a granule when an item first needs it and unmaps it as soon as no
 * live item lies in it (virtual memory allows both, a granule at a time).
 * Live items never overlap, so a granule strictly inside an item's first
 * and last holds no other live item: only first and last granules can be
 * shared, and only they are counted one by one (users), so nothing is
 * walked per granule. users is indexed by granule where the range (up to
 * high) has no more granules than items have ends, else by the rank of
 * the granule among the distinct first and last granules (keys): memory
 * and time do not grow with the sizes. */
static mp_status_t mpb_mapped_peak(const mpb_items_t *it, const size_t *offset,
                                   size_t high, size_t granule, size_t *out) {
  size_t n = it->n, m = 0;
  bool dense = high / granule < 2 * n + 1;
  size_t *keys = dense ? NULL : malloc(2 * n * sizeof *keys);
  uint32_t *users = calloc(dense ? high / granule + 1 : 2 * n, sizeof *users);
  mpb_change_t *ch = malloc((2 * n + 1) * sizeof *ch);
  *out = 0;
  if ((!dense && keys == NULL) || users == NULL || ch == NULL) {
    free(keys);
    free(users);
    free(ch);
    return mp__fail(MP_ENOMEM, "offline placement: out of host memory");
  }
  /* Placed within the address space: offset + size does not wrap. */
  for (size_t i = 0; !dense && i < n; i++) {
    size_t off = offset[it->v[i].id];
    keys[2 * i] = off / granule;
    keys[2 * i + 1] = (off + it->v[i].size - 1) / granule;
  }
  if (!dense) {
    qsort(keys, 2 * n, sizeof *keys, mpb_size_cmp);
    for (size_t k = 0; k < 2 * n; k++)
      if (m == 0 || keys[k] != keys[m - 1])
        keys[m++] = keys[k];
  }
  for (size_t i = 0; i < n; i++) {
    ch[2 * i] = (mpb_change_t){it->v[i].t0, (uint32_t)i, 1};
    ch[2 * i + 1] = (mpb_change_t){it->v[i].t1, (uint32_t)i, 0};
  }
  qsort(ch, 2 * n, sizeof *ch, mpb_change_cmp);
  size_t touched = 0, peak = 0;
  for (size_t k = 0; k < 2 * n; k++) {
    const mpb_item_t *x = &it->v[ch[k].id];
    size_t g0, g1;
    size_t inner = mpb_span(offset[x->id], x->size, granule, &g0, &g1);
    size_t e0 = dense ? g0 : mpb_key_index(keys, m, g0);
    size_t e1 = dense ? g1 : mpb_key_index(keys, m, g1);
    if (ch[k].start) {
      touched += inner + (users[e0]++ == 0);
      if (e1 != e0)
        touched += users[e1]++ == 0;
    } else {
      touched -= inner + (--users[e0] == 0);
      if (e1 != e0)
        touched -= --users[e1] == 0;
    }
    /* The figure after each event: once every change at this t is in. */
    if ((k + 1 == 2 * n || ch[k + 1].t != ch[k].t) && touched > peak)
      peak = touched;
  }
  free(keys);
  free(users);
  free(ch);
  *out = peak > SIZE_MAX / granule ? SIZE_MAX : peak * granule;
  return MP_OK;
}

/* ---- figures ---------------------------------------------------------- */

/* Whole granules that hold bytes (no bytes + granule - 1: it wraps for
 * sizes near the address space's end). */
static size_t mpb_granules(size_t bytes, size_t granule) {
  return bytes / granule + (bytes % granule != 0);
}

/* bytes rounded up to whole granules, over peak live. */
static double mpb_granule_ratio(size_t bytes, size_t granule, size_t live) {
  if (live == 0)
    return 0;
  double g = (double)mpb_granules(bytes, granule);
  return g * (double)granule / (double)live;
}

mp_status_t mpb_offline_place(const mpb_workload_t *w, size_t align,
                              size_t granule, size_t *offset, size_t noffset,
                              mpb_offline_t *out) {
  memset(out, 0, sizeof *out);
  if (align == 0 || (align & (align - 1)) != 0 || granule == 0)
    return mp__fail(MP_EINVAL,
                    "offline placement: bad alignment %zu or granule %zu",
                    align, granule);
  snprintf(out->workload, sizeof out->workload, "%s", w->name);
  out->align = align;
  out->granule = granule;
  out->peak_live = mpb_workload_peak_live(w);
  mpb_items_t it = {0};
  mp_status_t st = mpb_items_of(w, align, &it);
  size_t *off = NULL, *best = NULL;
  if (st != MP_OK)
    goto out;
  off = malloc((it.n ? it.n : 1) * sizeof *off);
  best = malloc((it.n ? it.n : 1) * sizeof *best);
  if (off == NULL || best == NULL) {
    st = mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
    goto out;
  }
  out->items = it.n;
  uint64_t rng = 1, spent = 0;
  size_t floor = mpb_granules(out->peak_live, granule);
  for (unsigned k = 0, round = 0; k < MPB_OFFLINE_ORDERS; k += round == 0) {
    if (k == MPB_OFFLINE_ORDERS - 1) {
      /* A jittered round: sizes scaled by 1 +- up to 5 to 20%. */
      if (round == MPB_OFFLINE_ROUNDS || spent > MPB_OFFLINE_WORK ||
          mpb_granules(out->high, granule) <= floor)
        break;
      double j = 0.05 * (double)(round % 4 + 1);
      for (size_t i = 0; i < it.n; i++) {
        double u = (double)(xorshift64(&rng) >> 11) * 0x1p-53; /* [0,1) */
        it.v[i].key = (double)it.v[i].size * (1 + j * (2 * u - 1));
      }
      round++;
      out->rounds = round;
    }
    size_t mapped, high;
    uint64_t visits;
    if ((st = mpb_place(&it, w->n, mpb_order_cmp[k], off, &high, &visits)) !=
            MP_OK ||
        (st = mpb_mapped_peak(&it, off, high, granule, &mapped)) != MP_OK) {
      /* Said of the workload, as mpb_items_of says its own. */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", mp_last_error());
      st = mp__fail(st, "%s: %s", w->name, msg);
      goto out;
    }
    spent += visits;
    if (round <= 1 || high < out->high_by[k])
      out->high_by[k] = high;
    if (k == 0 || mapped < out->mapped) {
      out->mapped = mapped;
      out->mapped_order = k;
    }
    if (k == 0 || high < out->high) {
      out->high = high;
      out->order = k;
      memcpy(best, off, it.n * sizeof *best);
    }
  }
  for (size_t i = 0; i < noffset && i < it.n; i++)
    offset[i] = best[i];
  out->bound = mpb_granule_ratio(out->peak_live, granule, out->peak_live);
  out->ratio = mpb_granule_ratio(out->high, granule, out->peak_live);
  out->raw = out->peak_live ? (double)out->high / (double)out->peak_live : 0;
  out->mapped_ratio =
      out->peak_live ? (double)out->mapped / (double)out->peak_live : 0;
out:
  free(it.v);
  free(off);
  free(best);
  return st;
}

/* ---- granules an allocator's live blocks touch -------------------------- */

/* An entry of mpb_touched_t's map (mp__ptrmap: the key first). */
typedef struct mpb_granule {
  uintptr_t key; /* granule number + 1 (a key is never 0) */
  uint32_t users;
} mpb_granule_t;

void mpb_touched_init(mpb_touched_t *t, size_t granule) {
  memset(t, 0, sizeof *t);
  t->granule = granule;
}

/* Counts a block's edge granule g in or out; false without host memory. */
static bool mpb_touched_edge(mpb_touched_t *t, size_t g, bool alloc) {
  if (alloc) {
    mpb_granule_t *e = mp__ptrmap_put(t->map, (uintptr_t)g + 1);
    if (e == NULL)
      return false;
    t->now += e->users++ == 0;
  } else {
    mpb_granule_t *e = mp__ptrmap_find(t->map, (uintptr_t)g + 1);
    if (e != NULL && --e->users == 0) {
      t->now--;
      mp__ptrmap_remove(t->map, e);
    }
  }
  return true;
}

void mpb_touched_on_block(void *ctx, size_t event, const mpb_event_t *e,
                          void *ptr) {
  (void)event;
  mpb_touched_t *t = ctx;
  bool alloc = e->op == MPB_ALLOC;
  if (t->failed || ptr == NULL || e->size == 0 || (!alloc && e->op != MPB_FREE))
    return;
  if (t->map == NULL) {
    if ((t->map = malloc(sizeof *t->map)) == NULL) {
      t->failed = true;
      return;
    }
    mp__ptrmap_init(t->map, sizeof(mpb_granule_t));
  }
  size_t g0, g1;
  size_t inner = mpb_span((uintptr_t)ptr, e->size, t->granule, &g0, &g1);
  /* A free of a block never seen counts nothing. */
  if (!alloc && mp__ptrmap_find(t->map, (uintptr_t)g0 + 1) == NULL)
    return;
  if (!mpb_touched_edge(t, g0, alloc) ||
      (g1 != g0 && !mpb_touched_edge(t, g1, alloc))) {
    t->failed = true;
    return;
  }
  t->now = alloc ? t->now + inner : t->now - inner;
  if (t->now > t->peak)
    t->peak = t->now;
}

size_t mpb_touched_peak_bytes(const mpb_touched_t *t) {
  return t->failed ? 0 : t->peak * t->granule;
}

void mpb_touched_free(mpb_touched_t *t) {
  if (t->map != NULL)
    mp__ptrmap_destroy(t->map);
  free(t->map);
  memset(t, 0, sizeof *t);
}
