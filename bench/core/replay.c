/* replay.c - one workload through one allocator, and the figures it gives.
 *
 * Every replay runs on a fresh device, so nothing one allocator cached can
 * help the next. Each allocate and free call is timed on its own with
 * CLOCK_MONOTONIC, less the clock's own cost (the median of back-to-back
 * reads, measured per replay and reported), which is otherwise a third of
 * a fast allocator's figure and the same for all; after each event the
 * allocator's reserved bytes are sampled (outside the timed region) for the
 * waste averaged over events and the plots. Live bytes are what the workload
 * asked for, tracked here, the same for every allocator. On a workload with
 * several streams the device is synchronized after each free (also outside the
 * timed region), so that cross-stream reuse does not depend on thread
 * scheduling.
 *
 * The smallest capacity is found by bisection on the host device's
 * capacity= option: a workload cannot complete below its peak live bytes,
 * and completed at the peak reserved bytes of the unconstrained run (checked,
 * and doubled while it does not). Each probe is a full replay on a fresh
 * device; the search stops at a granularity, or when its time budget is
 * spent, with the smallest capacity seen to work. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h" /* mp__fail, MP__UNLIKELY */
#include "mpbench.h"

uint64_t mpb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A device spec's options but capacity, copied: mp__kv_each's pairs, so a
 * key is what the device's own parser finds ("capacity=8G" or
 * "capacity:8G"), each pair kept as the user wrote it. */
typedef struct mpb_spec_copy {
  char *buf; /* NULL: only had_capacity is wanted */
  size_t n;
  char sep; /* before the next option: ':', then ',' */
  bool had_capacity;
} mpb_spec_copy_t;

static mp_status_t mpb_spec_copy_pair(void *ctx, const char *key,
                                      size_t key_len, const char *val,
                                      size_t val_len) {
  mpb_spec_copy_t *c = ctx;
  if (key_len == 8 && memcmp(key, "capacity", 8) == 0) {
    c->had_capacity = true;
    return MP_OK;
  }
  if (c->buf != NULL) { /* key, separator and value lie together */
    c->n += (size_t)sprintf(c->buf + c->n, "%c%.*s", c->sep,
                            (int)(val + val_len - key), key);
    c->sep = ',';
  }
  return MP_OK;
}

/* Walks base_spec's options (NULL or "" is "host"); with buf, of at least
 * strlen(spec) + 1 bytes, copies the device name and every option but
 * capacity into it. */
static mp_status_t mpb_spec_walk(const char *base_spec, char *buf,
                                 mpb_spec_copy_t *c) {
  if (base_spec == NULL || base_spec[0] == '\0')
    base_spec = "host";
  const char *colon = strchr(base_spec, ':');
  size_t head = colon ? (size_t)(colon - base_spec) : strlen(base_spec);
  *c = (mpb_spec_copy_t){.buf = buf, .sep = ':'};
  if (buf != NULL)
    c->n = (size_t)sprintf(buf, "%.*s", (int)head, base_spec);
  return mp__kv_each("device spec", colon ? colon + 1 : NULL,
                     mpb_spec_copy_pair, c);
}

mp_status_t mpb_spec_with_capacity(const char *base_spec, size_t capacity,
                                   char **out) {
  *out = NULL;
  /* The copy is no longer than the spec; then ",capacity=" and a size_t. */
  size_t len = (base_spec && base_spec[0] ? strlen(base_spec) : 4) +
               sizeof ",capacity=18446744073709551615";
  char *buf = malloc(len);
  if (buf == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory");
  mpb_spec_copy_t c;
  mp_status_t st = mpb_spec_walk(base_spec, buf, &c);
  if (st != MP_OK) {
    free(buf);
    return st;
  }
  sprintf(buf + c.n, "%ccapacity=%zu", c.sep, capacity);
  *out = buf;
  return MP_OK;
}

/* Live bytes on the device as events go: a paused tenant's blocks are not
 * on the device, so they leave the count at its pause and come back at its
 * resume. */
typedef struct mpb_live {
  size_t on_device;
  size_t tenant[MPB_MAX_TENANTS];
  bool paused[MPB_MAX_TENANTS];
} mpb_live_t;

/* tenant: whose block (an allocation's event tenant, a free's slot's). */
static void mpb_live_event(mpb_live_t *l, const mpb_event_t *e,
                           uint8_t tenant) {
  switch (e->op) {
  case MPB_ALLOC:
    l->tenant[tenant] += e->size;
    l->on_device += l->paused[tenant] ? 0 : e->size;
    break;
  case MPB_FREE:
    l->tenant[tenant] -= e->size;
    l->on_device -= l->paused[tenant] ? 0 : e->size;
    break;
  case MPB_PAUSE:
    if (!l->paused[e->tenant])
      l->on_device -= l->tenant[e->tenant];
    l->paused[e->tenant] = true;
    break;
  case MPB_RESUME:
    if (l->paused[e->tenant])
      l->on_device += l->tenant[e->tenant];
    l->paused[e->tenant] = false;
    break;
  }
}

size_t mpb_workload_peak_live(const mpb_workload_t *w) {
  size_t peak = 0;
  mpb_live_t l = {0};
  uint8_t *owner = calloc(w->nslots ? w->nslots : 1, 1);
  for (size_t i = 0; i < w->n && owner != NULL; i++) {
    const mpb_event_t *e = &w->ev[i];
    if (e->op == MPB_ALLOC)
      owner[e->slot] = e->tenant;
    mpb_live_event(&l, e, e->op == MPB_FREE ? owner[e->slot] : e->tenant);
    if (l.on_device > peak)
      peak = l.on_device;
  }
  free(owner);
  return peak;
}

/* A device from spec, with the workload's streams. */
typedef struct mpb_rig {
  mp_device_t *dev;
  mp_stream_t *streams;
  uint32_t nstreams;
  mpb_allocator_t *alloc; /* tenant 0's: every workload's but colocate's */
  mpb_allocator_t *tenant[MPB_MAX_TENANTS]; /* [0] is alloc */
  uint8_t ntenants;
  void **ptr;
  uint8_t *owner; /* per slot: the tenant it came from */
  bool settle;    /* let the device catch up after each free */
} mpb_rig_t;

static void mpb_rig_close(mpb_rig_t *g) {
  for (uint8_t t = 0; t < g->ntenants; t++)
    if (g->tenant[t] != NULL)
      mpb_allocator_close(g->tenant[t]);
  g->alloc = NULL;
  for (uint32_t i = 1; i < g->nstreams; i++)
    if (g->streams[i] != NULL)
      mp_stream_destroy(g->dev, g->streams[i]);
  free(g->streams);
  free(g->ptr);
  free(g->owner);
  mp_device_close(g->dev);
  memset(g, 0, sizeof *g);
}

static mp_status_t mpb_rig_open(const mpb_workload_t *w, const char *allocator,
                                const char *spec, mpb_make_fn make,
                                mpb_rig_t *g) {
  memset(g, 0, sizeof *g);
  mp_status_t st = mp_device_open(spec, &g->dev);
  if (st != MP_OK)
    return st;
  g->nstreams = w->nstreams ? w->nstreams : 1;
  g->streams = calloc(g->nstreams, sizeof *g->streams);
  g->ptr = calloc(w->nslots ? w->nslots : 1, sizeof *g->ptr);
  g->owner = calloc(w->nslots ? w->nslots : 1, 1);
  if (g->streams == NULL || g->ptr == NULL || g->owner == NULL)
    st = mp__fail(MP_ENOMEM, "out of host memory");
  for (uint32_t i = 1; i < g->nstreams && st == MP_OK; i++)
    st = mp_stream_create(g->dev, &g->streams[i]);
  g->ntenants = w->ntenants > 1 ? w->ntenants : 1;
  for (uint8_t t = 0; t < g->ntenants && st == MP_OK; t++)
    st = mpb_allocator_open(allocator, g->dev, make, &g->tenant[t]);
  g->alloc = g->tenant[0];
  g->settle = g->nstreams > 1 || mpb_allocator_is_pinned(allocator);
  if (st != MP_OK)
    mpb_rig_close(g);
  return st;
}

/* One allocation event: the block goes into its slot, remembered as its
 * tenant's. */
static mp_status_t mpb_rig_alloc(mpb_rig_t *g, const mpb_event_t *e) {
  g->owner[e->slot] = e->tenant;
  return mpb_allocator_alloc(g->tenant[e->tenant], e->size,
                             g->streams[e->stream], &g->ptr[e->slot]);
}

static void mpb_rig_free(mpb_rig_t *g, const mpb_event_t *e) {
  mpb_allocator_free(g->tenant[g->owner[e->slot]], g->ptr[e->slot]);
  g->ptr[e->slot] = NULL;
}

/* A pause (content kept) or resume event, timed; MP_ENOTSUP where the
 * tenant's allocator is not a pool that can pause. */
static mp_status_t mpb_rig_turn(mpb_rig_t *g, const mpb_event_t *e, double *ms,
                                size_t *bytes) {
  mp_allocator_t *mp = mpb_allocator_mempool(g->tenant[e->tenant]);
  mp_pool_t *pool = mp != NULL ? mp_allocator_pool(mp) : NULL;
  if (pool == NULL)
    return mp__fail(MP_ENOTSUP, "this allocator has no pool to pause");
  return e->op == MPB_PAUSE
             ? mpb_pool_pause_timed(pool, MP_PAUSE_KEEP_CONTENT, ms, bytes)
             : mpb_pool_resume_timed(pool, ms, bytes);
}

/* Every tenant's sample, added up. */
static void mpb_rig_sample(mpb_rig_t *g, mpb_sample_t *out) {
  mpb_allocator_sample(g->tenant[0], out);
  for (uint8_t t = 1; t < g->ntenants; t++) {
    mpb_sample_t s;
    mpb_allocator_sample(g->tenant[t], &s);
    out->reserved += s.reserved;
    out->free_bytes += s.free_bytes;
    if (s.largest_free > out->largest_free)
      out->largest_free = s.largest_free;
    out->device_calls += s.device_calls;
    out->no_device_calls |= s.no_device_calls;
    out->has_free_info &= s.has_free_info;
  }
}

/* After a free on a workload with several streams, or through a
 * page-locked allocator (whose freed buffer waits for its own stream too,
 * as the host writes it outside stream order): lets the device catch up
 * with every stream, so that what the free handed back is reusable from
 * any stream at the next event. A trace says nothing of how far behind the
 * device ran; without this, reuse would depend on when the emulated
 * device's stream threads got scheduled, and a pool's figures on such a
 * trace would change from run to run (by up to 14% on select_n llama; the
 * host pool's on staging:steps=400 1.254 to 1.371). Outside the timed
 * region. */
static void mpb_rig_settle(mpb_rig_t *g) {
  if (g->settle)
    mp_device_synchronize(g->dev);
}

/* mpb_replay_opts_t.stream_work_us: the stream's kernel, as a host
 * function that sleeps (a sleeping worker leaves the CPU to the replay). */
static void mpb_work(void *arg) {
  uintptr_t us = (uintptr_t)arg;
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* After an event on a workload with several streams: queue the event's
 * work on its stream (work_us > 0), or let the device catch up after a
 * free (work_us == 0). */
static void mpb_rig_after(mpb_rig_t *g, const mpb_event_t *e, bool freed,
                          unsigned work_us) {
  if (work_us == 0) {
    if (freed)
      mpb_rig_settle(g);
    return;
  }
  if (g->nstreams <= 1)
    return;
  (void)mp_stream_launch_host(g->dev, g->streams[e->stream], mpb_work,
                              (void *)(uintptr_t)work_us);
}

/* Frees whatever a failed replay left live, so the allocator can close
 * (a paused tenant refuses; its pool is destroyed with the blocks). */
static void mpb_rig_free_live(mpb_rig_t *g, const mpb_workload_t *w) {
  for (uint32_t s = 0; s < w->nslots; s++)
    if (g->ptr[s] != NULL) {
      mpb_allocator_free(g->tenant[g->owner[s]], g->ptr[s]);
      g->ptr[s] = NULL;
    }
}

mp_status_t mpb_replay_fits(const mpb_workload_t *w, const char *allocator,
                            const char *spec, mpb_make_fn make, bool *fits) {
  mpb_rig_t g;
  mp_status_t st = mpb_rig_open(w, allocator, spec, make, &g);
  /* Not even the allocator fits (a child's range), or its options ask
   * for more than this probe device has: a pool capped at a share of its
   * device (max_fraction) whose share is under its alignment is
   * MP_EINVAL. The options themselves were checked, and the run made, on
   * the user's device before any probe, and a probe's device differs from
   * it only in its capacity (host devices take any capacity above 0, and
   * a probe is never below the trace's peak live bytes): a refusal here
   * is the capacity's. */
  if (st == MP_ENOMEM || st == MP_ELIMIT || st == MP_EINVAL) {
    *fits = false;
    return MP_OK;
  }
  if (st != MP_OK)
    return st;
  *fits = true;
  for (size_t i = 0; i < w->n; i++) {
    const mpb_event_t *e = &w->ev[i];
    if (e->op == MPB_GRAPH) {
      if (mpb_allocator_graph(g.alloc, e->slot, g.streams[e->stream]) !=
          MP_OK) {
        *fits = false;
        break;
      }
      if (e->slot == MPB_GRAPH_RELEASE)
        mpb_rig_settle(&g); /* as after a free (mpb_replay) */
    } else if (e->op == MPB_ALLOC) {
      if (e->size != 0 && mpb_rig_alloc(&g, e) != MP_OK) {
        g.ptr[e->slot] = NULL;
        *fits = false;
        break;
      }
    } else if (e->op == MPB_PAUSE || e->op == MPB_RESUME) {
      double ms;
      size_t bytes;
      if (mpb_rig_turn(&g, e, &ms, &bytes) != MP_OK) {
        *fits = false;
        break;
      }
    } else if (g.ptr[e->slot] != NULL) {
      mpb_rig_free(&g, e);
      mpb_rig_settle(&g);
    }
  }
  mpb_rig_free_live(&g, w);
  mpb_rig_close(&g);
  return MP_OK;
}

/* One probe: does the workload fit base_spec's device at capacity? */
static mp_status_t mpb_capacity_probe(const mpb_workload_t *w,
                                      const char *allocator, mpb_make_fn make,
                                      const char *base_spec, size_t capacity,
                                      bool *fits) {
  char *spec;
  mp_status_t st = mpb_spec_with_capacity(base_spec, capacity, &spec);
  if (st == MP_OK)
    st = mpb_replay_fits(w, allocator, spec, make, fits);
  free(spec);
  return st;
}

mp_status_t mpb_capacity_search(const mpb_workload_t *w, const char *allocator,
                                mpb_make_fn make, const char *base_spec,
                                size_t lo, size_t hi, size_t gran,
                                double budget_s, size_t *out, bool *exact,
                                unsigned *probes) {
  uint64_t t0 = mpb_now_ns();
  bool fits = false;
  mp_status_t st;
  *out = 0;
  *exact = false;
  *probes = 0;
  if (gran == 0)
    gran = 1;
  if (hi < lo)
    hi = lo;
  /* hi must be seen to work; it did in the unconstrained run, but memory
   * the allocator got back late may need more when the device is tight. */
  for (int tries = 0; tries < 4; tries++) {
    if ((st = mpb_capacity_probe(w, allocator, make, base_spec, hi, &fits)) !=
        MP_OK)
      return st;
    (*probes)++;
    if (fits)
      break;
    hi *= 2;
  }
  if (!fits)
    return MP_OK; /* unknown */
  /* Below the peak live bytes nothing fits: fail is known not to work. */
  size_t fail = lo > 0 ? lo - 1 : 0;
  *exact = true;
  while (hi - fail > gran) {
    if (budget_s > 0 && (double)(mpb_now_ns() - t0) / 1e9 > budget_s) {
      *exact = false;
      break;
    }
    size_t mid = fail + (hi - fail) / 2;
    if ((st = mpb_capacity_probe(w, allocator, make, base_spec, mid, &fits)) !=
        MP_OK)
      return st;
    (*probes)++;
    if (fits)
      hi = mid;
    else
      fail = mid;
  }
  *out = hi;
  return MP_OK;
}

static int mpb_cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Median ns between two back-to-back clock reads: the part of every timed
 * call that is the clock itself. */
static uint32_t mpb_timer_overhead(void) {
  enum { N = 999 };
  uint32_t d[N];
  for (int i = 0; i < N; i++) {
    uint64_t t0 = mpb_now_ns();
    uint64_t t1 = mpb_now_ns();
    d[i] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
  }
  qsort(d, N, sizeof *d, mpb_cmp_u32);
  return d[N / 2];
}

/* ns of a timed call, less the clock's own cost. */
static uint32_t mpb_call_ns(uint64_t t0, uint64_t t1, uint32_t overhead) {
  uint64_t d = t1 - t0;
  d = d > overhead ? d - overhead : 0;
  return (uint32_t)(d > UINT32_MAX ? UINT32_MAX : d);
}

/* The device spec for the measured run into *owned (NULL: the user's own
 * serves): the user's, and on the host device without a capacity of its
 * own, one roomy enough that only the allocator decides what is reserved. */
static mp_status_t mpb_measure_spec(const char *user_spec, bool is_host,
                                    size_t peak_live, char **owned) {
  const char *base = user_spec ? user_spec : getenv("MEMPOOL_DEVICE");
  *owned = NULL;
  if (!is_host)
    return MP_OK;
  mpb_spec_copy_t c;
  mp_status_t st = mpb_spec_walk(base, NULL, &c);
  if (st != MP_OK || c.had_capacity)
    return st;
  size_t roomy = (size_t)16 << 30;
  if (peak_live < ((size_t)1 << 60) / 4 && peak_live * 4 + (1u << 30) > roomy)
    roomy = peak_live * 4 + (1u << 30);
  return mpb_spec_with_capacity(base, roomy, owned);
}

mp_status_t mpb_replay(const mpb_workload_t *w, const char *allocator,
                       const mpb_replay_opts_t *opts, mpb_result_t *r) {
  uint64_t t_start = mpb_now_ns();
  memset(r, 0, sizeof *r);
  snprintf(r->workload, sizeof r->workload, "%s", w->name);
  snprintf(r->allocator, sizeof r->allocator, "%s", allocator);
  r->unknown_frees = w->unknown_frees;
  r->failure_rows = w->failure_rows;
  r->implicit_frees = w->implicit_frees;
  r->zero_size_allocs = w->zero_size_allocs;
  r->double_frees = w->double_frees;
  snprintf(r->double_free_at, sizeof r->double_free_at, "%s",
           w->double_free_at);
  /* Which device: open the user's once to learn whether it is host. */
  mp_device_t *probe;
  mp_status_t st = mp_device_open(opts->device_spec, &probe);
  if (st != MP_OK)
    return st;
  snprintf(r->device, sizeof r->device, "%s", mp_device_name(probe));
  bool is_host = strncmp(r->device, "host", 4) == 0;
  mp_device_close(probe);

  size_t peak_live_w = mpb_workload_peak_live(w);
  char *spec;
  if ((st = mpb_measure_spec(opts->device_spec, is_host, peak_live_w, &spec)) !=
      MP_OK)
    return st;
  mpb_rig_t g;
  st = mpb_rig_open(w, allocator, spec ? spec : opts->device_spec, opts->make,
                    &g);
  free(spec);
  if (st == MP_ENOMEM || st == MP_ELIMIT) {
    /* The device cannot hold the allocator itself: a result. */
    snprintf(r->error, sizeof r->error, "%s making the allocator: %s",
             mp_status_name(st), mp_last_error());
    r->seconds = (double)(mpb_now_ns() - t_start) / 1e9;
    return MP_OK;
  }
  if (st != MP_OK)
    return st;
  uint32_t *ns = malloc((w->n ? w->n : 1) * sizeof *ns);
  if (ns == NULL) {
    mpb_rig_close(&g);
    return mp__fail(MP_ENOMEM, "out of host memory");
  }
  size_t nns = 0, peak_reserved = 0;
  mpb_live_t lv = {0};
  double *turn_ms[2] = {NULL, NULL}; /* pause, resume: ms per GiB */
  size_t nturn[2] = {0, 0};
  if (w->ntenants > 1) {
    turn_ms[0] = malloc((w->n ? w->n : 1) * sizeof(double));
    turn_ms[1] = malloc((w->n ? w->n : 1) * sizeof(double));
    if (turn_ms[0] == NULL || turn_ms[1] == NULL) {
      free(turn_ms[0]);
      free(turn_ms[1]);
      free(ns);
      mpb_rig_close(&g);
      return mp__fail(MP_ENOMEM, "out of host memory");
    }
  }
  uint32_t overhead = mpb_timer_overhead();
  r->timer_overhead_ns = overhead;
  double waste_sum = 0;
  size_t bucket = (w->n + MPB_SERIES_POINTS - 1) / MPB_SERIES_POINTS;
  if (bucket == 0)
    bucket = 1;
  r->completed = true;
  mpb_sample_t smp;
  size_t i;
  for (i = 0; i < w->n; i++) {
    const mpb_event_t *e = &w->ev[i];
    void **slot = &g.ptr[e->slot];
    if (e->op == MPB_GRAPH) {
      if ((st = mpb_allocator_graph(g.alloc, e->slot, g.streams[e->stream])) !=
          MP_OK) {
        r->completed = false;
        snprintf(r->error, sizeof r->error, "%s at event %zu (graph): %s",
                 mp_status_name(st), i + 1, mp_last_error());
        break;
      }
      /* Releasing the graphs frees their pool's memory: as after a free,
       * the device catches up (never during a capture, which a device
       * synchronization would break). */
      if (e->slot == MPB_GRAPH_RELEASE)
        mpb_rig_after(&g, e, true, opts->stream_work_us);
    } else if (e->op == MPB_PAUSE || e->op == MPB_RESUME) {
      double ms;
      size_t bytes;
      st = mpb_rig_turn(&g, e, &ms, &bytes);
      if (st != MP_OK) {
        r->completed = false;
        snprintf(r->error, sizeof r->error,
                 "%s at event %zu (%s tenant %u): %s", mp_status_name(st),
                 i + 1, e->op == MPB_PAUSE ? "pause" : "resume", e->tenant,
                 mp_last_error());
        break;
      }
      int k = e->op == MPB_RESUME;
      if (bytes > 0)
        turn_ms[k][nturn[k]++] = mpb_ms_per_gib(ms, bytes);
      r->pauses += e->op == MPB_PAUSE;
      mpb_live_event(&lv, e, e->tenant);
    } else if (e->op == MPB_ALLOC) {
      if (e->size != 0) {
        uint64_t t0 = mpb_now_ns();
        st = mpb_rig_alloc(&g, e);
        uint64_t t1 = mpb_now_ns();
        if (st != MP_OK) {
          *slot = NULL;
          r->completed = false;
          snprintf(r->error, sizeof r->error,
                   "%s at event %zu (allocate %zu bytes): %s",
                   mp_status_name(st), i + 1, e->size, mp_last_error());
          break;
        }
        ns[nns++] = mpb_call_ns(t0, t1, overhead);
        if (opts->on_block != NULL)
          opts->on_block(opts->on_block_ctx, i, e, *slot);
        mpb_rig_after(&g, e, false, opts->stream_work_us);
      }
      mpb_live_event(&lv, e, e->tenant);
    } else {
      uint8_t owner = g.owner[e->slot];
      if (*slot != NULL) {
        if (opts->on_block != NULL)
          opts->on_block(opts->on_block_ctx, i, e, *slot);
        uint64_t t0 = mpb_now_ns();
        mpb_rig_free(&g, e);
        uint64_t t1 = mpb_now_ns();
        ns[nns++] = mpb_call_ns(t0, t1, overhead);
        mpb_rig_after(&g, e, true, opts->stream_work_us);
      }
      mpb_live_event(&lv, e, owner);
    }
    size_t live = lv.on_device;
    mpb_rig_sample(&g, &smp);
    if (smp.reserved > peak_reserved)
      peak_reserved = smp.reserved;
    if (MP__UNLIKELY(w->has_graph)) {
      size_t pinned = mpb_allocator_graph_bytes(g.alloc);
      if (pinned > r->graph_pinned)
        r->graph_pinned = pinned;
    }
    if (live > r->peak_live) {
      r->peak_live = live;
      r->has_ext_frag = smp.has_free_info;
      r->ext_frag = smp.free_bytes ? 1.0 - (double)smp.largest_free /
                                               (double)smp.free_bytes
                                   : 0.0;
    }
    if (smp.reserved > 0)
      waste_sum += smp.reserved > live
                       ? (double)(smp.reserved - live) / (double)smp.reserved
                       : 0.0;
    size_t k = i / bucket;
    if (k >= r->npoints) {
      r->npoints = k + 1;
      r->point_live[k] = 0;
      r->point_reserved[k] = 0;
    }
    r->point_event[k] = i + 1;
    if (live > r->point_live[k])
      r->point_live[k] = live;
    if (smp.reserved > r->point_reserved[k])
      r->point_reserved[k] = smp.reserved;
  }
  r->events = i;
  r->pause_ms_per_gib = mpb_median(turn_ms[0], nturn[0]);
  r->resume_ms_per_gib = mpb_median(turn_ms[1], nturn[1]);
  free(turn_ms[0]);
  free(turn_ms[1]);
  /* Figures of the workload itself, read before anything is torn down. */
  mpb_rig_sample(&g, &smp);
  r->device_calls = smp.device_calls;
  r->has_device_calls = !smp.no_device_calls;
  mp_allocator_t *mp = mpb_allocator_mempool(g.alloc);
  mp_stats_t stats;
  /* One allocator's own peak is the device's only when it is alone. */
  if (g.ntenants == 1 && mp != NULL &&
      mp_allocator_get_stats(mp, &stats) == MP_OK &&
      stats.peak_reserved_bytes > peak_reserved)
    peak_reserved = stats.peak_reserved_bytes;
  r->peak_reserved = peak_reserved;
  r->ratio = r->peak_live ? (double)peak_reserved / (double)r->peak_live : 0;
  r->utilization =
      peak_reserved ? (double)r->peak_live / (double)peak_reserved : 0;
  r->avg_waste = i ? waste_sum / (double)i : 0;
  if (nns > 0) {
    qsort(ns, nns, sizeof *ns, mpb_cmp_u32);
    r->ns_p50 = ns[(nns - 1) / 2];
    r->ns_p99 = ns[(size_t)((double)(nns - 1) * 0.99)];
  }
  free(ns);
  mpb_rig_free_live(&g, w);
  mpb_rig_close(&g);

  if (!opts->capacity_search || !r->completed) {
    r->capacity_state = MPB_CAP_NONE;
  } else if (!is_host || mpb_allocator_is_pinned(allocator)) {
    /* capacity= bounds device memory, not page-locked host memory. */
    r->capacity_state = MPB_CAP_NA;
  } else {
    const char *base =
        opts->device_spec ? opts->device_spec : getenv("MEMPOOL_DEVICE");
    size_t gran = r->peak_live / 1000;
    if (gran < ((size_t)1 << 20))
      gran = (size_t)1 << 20;
    bool exact;
    double budget = opts->capacity_budget_s;
    if (opts->capacity_deadline_ns != 0) {
      uint64_t now = mpb_now_ns();
      double left = now < opts->capacity_deadline_ns
                        ? (double)(opts->capacity_deadline_ns - now) / 1e9
                        : 1e-9; /* spent: only the upper bound is probed */
      if (budget <= 0 || left < budget)
        budget = left;
    }
    st = mpb_capacity_search(w, allocator, opts->make, base, r->peak_live,
                             r->peak_reserved, gran, budget, &r->min_capacity,
                             &exact, &r->capacity_probes);
    if (st != MP_OK)
      return st;
    r->capacity_state = r->min_capacity == 0 ? MPB_CAP_NONE
                        : exact              ? MPB_CAP_EXACT
                                             : MPB_CAP_BOUND;
  }
  r->seconds = (double)(mpb_now_ns() - t_start) / 1e9;
  return MP_OK;
}
