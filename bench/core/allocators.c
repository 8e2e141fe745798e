/* allocators.c - every allocator mpbench compares, behind one small table.
 *
 * mempool's own allocators ("pool", "pool:OPTS", "child:bytes=...") are made
 * with mp_allocator_create and measured from their mp_stats_t. "direct" is
 * mempool's direct allocator used as a cudaMalloc/cudaFree program uses the
 * driver: its session is ended after every free, so each free is one device
 * free (the library's own default, frees deferred until the device fills,
 * would make its reserved bytes a function of the device's size).
 *
 * "jemalloc" is a jemalloc arena whose extents come from the same mp_device
 * through extent hooks: alloc is mp_device_alloc, dalloc opts out (returns
 * true: jemalloc keeps the extent, as retained memory), split and merge are
 * allowed (an extent may span parts of device allocations that are never
 * returned separately), decommit and purge opt out. Reserved bytes are what
 * the hooks got from the device; everything is given back when the arena is
 * destroyed. jemalloc runs with retain:false (see malloc_conf below), as
 * its address-space reservations ahead would otherwise be device memory.
 * jemalloc writes its metadata into extents it gets from these hooks, so it
 * runs on the host device only, where device memory is host memory. Invariant:
 * reserved = sum of the device allocations in chunks[].
 * "host-jemalloc" is the same arena over page-locked host memory: its hooks
 * draw chunks with mp_device_host_alloc (cuMemHostAlloc on CUDA) instead,
 * so it compares with the host pool on the staging workload, on any device
 * (the metadata lives in host memory).
 *
 * "cuda-malloc" is the device with nothing between: mp_device_alloc per
 * request and the backend's free per free (cuMemAlloc/cuMemFree on CUDA;
 * mp__device_free, without the synchronize mp_device_free adds), its
 * reserved bytes the device's used memory since it was opened, as
 * cuMemGetInfo reports it (so the driver's own rounding shows).
 * "cuda-async" is CUDA's own pool (cuda_async.c). Both are listed on the
 * host device so that a run without a GPU says they were skipped.
 *
 * Page-locked host memory (a staging workload's buffers): "host-pool" and
 * "host-pool:OPTS" are mempool's host pool (mempool/host_pool.h; OPTS as a
 * pool's: max_bytes, align, segment_bytes, max_split), measured from its
 * stats; "host-pow2" is PyTorch's CachingHostAllocator's policy
 * (host_pow2.c); "host-direct" is one mp_device_host_alloc per request and
 * one backend host free per free (cudaHostAlloc/cudaFreeHost);
 * "host-jemalloc" is above.
 *
 * Graph events (the "graph" workload): a mempool pool gives the captures a
 * graph-private pool (mp_pool_graph_create once, begin/end per capture,
 * released at MPB_GRAPH_RELEASE), so what a graph pins is its graph pool's
 * reserved bytes, inside the pool's own. "pool-nograph" is the pool
 * without graph awareness, as the shim was before graph pools: every
 * allocation on a capturing stream comes from the device directly
 * (mp_device_alloc, cuMemAlloc in relaxed capture mode) and stays the
 * graph's until the release, even when freed inside the capture (the
 * replays still use it), so it pins the capture's every allocation, never
 * reused (CUDA's own graph memory nodes may reuse inside one graph; this
 * baseline does not model that). Other allocators ignore graph events.
 *
 * Device calls (mpb_sample_t.device_calls) are the same thing for every
 * allocator: the device (or page-locked) allocations and frees the driver
 * made, as mempool's stats count them (mempool/stats.h: device_alloc_count
 * and device_free_count are "calls into the driver", counted where the call
 * succeeded). One the driver refused made nothing and is not counted, so
 * that a row that ran out of memory compares with the pool's. */
#include <stdlib.h>
#include <string.h>

/* internal.h for: mp__fail (errors through mp_last_error), mp__ptrmap_* (the
 * jemalloc adaptor's extent table). */
#include "device/backend.h"
#include "internal.h"
#include "mpbench.h"

#if MPBENCH_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

typedef enum {
  MPB_KIND_MEMPOOL,
  MPB_KIND_DIRECT,
  MPB_KIND_JEMALLOC,
  MPB_KIND_RAW,
  MPB_KIND_CUDA_ASYNC,
  MPB_KIND_HOST_POOL,
  MPB_KIND_HOST_POW2,
  MPB_KIND_HOST_DIRECT
} mpb_kind_t;

typedef struct mpb_jemalloc mpb_jemalloc_t;

struct mpb_allocator {
  mpb_kind_t kind;
  mp_device_t *dev;
  mp_allocator_t *mp; /* MEMPOOL, DIRECT */
  mpb_jemalloc_t *je; /* JEMALLOC */
  size_t raw_base;    /* RAW: device memory in use when it was opened */
  uint64_t raw_calls; /* RAW, HOST_DIRECT: allocations + frees made */
  mpb_cuasync_t *cu;  /* CUDA_ASYNC */
  mp_host_pool_t *hp; /* HOST_POOL */
  mpb_pow2_t *pow2;   /* HOST_POW2 */
  size_t raw_held;    /* HOST_DIRECT: page-locked bytes held now */
  mp__ptrmap_t held;  /* HOST_DIRECT: ptr -> bytes (mpb_held_t) */
  /* graph events */
  mp_pool_t *graph;      /* MEMPOOL: the captures' graph pool */
  bool nograph;          /* "pool-nograph" */
  bool capturing;        /* between begin and end (nograph) */
  bool glive;            /* nograph: captured graphs not yet released */
  mp_stream_t cap;       /* the capturing stream (both) */
  struct mpb_gblock *gb; /* nograph: the captures' device allocations */
  size_t ngb, gb_cap, gb_bytes;
  uint64_t gb_calls; /* nograph: device allocations + frees it made */
};

typedef struct mpb_gblock {
  void *ptr;
  size_t bytes;
  bool freed; /* by the program; kept while the graph lives */
} mpb_gblock_t;

typedef struct mpb_held {
  uintptr_t key;
  size_t bytes;
} mpb_held_t;

const char *const mpb_default_allocators[] = {
    "pool",     "pool:virtual=0", "pool:max_split=64M", "direct",
    "jemalloc", "cuda-async",     "cuda-malloc",        NULL};

void mpb_allocator_help(FILE *out) {
  fprintf(out,
          "  pool                 mempool's best-fit caching pool, defaults\n"
          "  pool-nograph         the pool without graph pools: a capture's\n"
          "                       allocations straight from the device, "
          "kept until\n"
          "                       its graphs go (graph workload)\n"
          "  pool:KEY=VAL,...     the pool with options, e.g. virtual=0 "
          "(plain\n"
          "                       segments), max_split=64M, segment_bytes=20M\n"
          "  child:bytes=SIZE     a child pool of SIZE carved from a pool\n"
          "  direct               one device allocation per request, one "
          "device\n"
          "                       free per free (cudaMalloc/cudaFree)\n"
          "  jemalloc             a jemalloc arena whose extents come from "
          "the\n"
          "                       device through extent hooks, retain:false "
          "(host\n"
          "                       device only)%s\n"
          "  cuda-async           CUDA's stream-ordered pool "
          "(cuMemAllocAsync on the\n"
          "                       default pool, release threshold raised "
          "to never)\n"
          "                       (needs a GPU)\n"
          "  cuda-malloc          the driver itself, no library between: "
          "cuMemAlloc\n"
          "                       per request, cuMemFree per free; "
          "reserved is the\n"
          "                       device's used memory (cuMemGetInfo) "
          "(needs a GPU)\n"
          "  host-pool[:KEY=VAL]  page-locked host memory: mempool's host "
          "pool\n"
          "  host-pow2            page-locked, PyTorch CachingHostAllocator's "
          "policy:\n"
          "                       power-of-two sizes, cached, never split\n"
          "  host-direct          page-locked, one host_alloc per request, "
          "one\n"
          "                       host_free per free "
          "(cudaHostAlloc/cudaFreeHost)\n"
          "  host-jemalloc        page-locked: the jemalloc arena with its "
          "extents\n"
          "                       from host_alloc (cuMemHostAlloc)%s\n",
#if MPBENCH_HAVE_JEMALLOC
          "", ""
#else
          "\n                       (not in this build: no libjemalloc)",
          " (not in this build)"
#endif
  );
}

static bool mpb_prefix(const char *name, const char *word) {
  size_t n = strlen(word);
  return strncmp(name, word, n) == 0 && (name[n] == '\0' || name[n] == ':');
}

bool mpb_allocator_is_pinned(const char *name) {
  return mpb_prefix(name, "host-pool") || strcmp(name, "host-pow2") == 0 ||
         strcmp(name, "host-direct") == 0 || strcmp(name, "host-jemalloc") == 0;
}

static bool mpb_is_gpu_only(const char *name) {
  return strcmp(name, "cuda-async") == 0 || strcmp(name, "cuda-malloc") == 0;
}

mp_status_t mpb_allocator_check_name(const char *name) {
  if (name == NULL || name[0] == '\0')
    return mp__fail(MP_EINVAL, "empty allocator name");
  if (mpb_prefix(name, "pool") || mpb_prefix(name, "child") ||
      strcmp(name, "pool-nograph") == 0 || strcmp(name, "direct") == 0 ||
      strcmp(name, "jemalloc") == 0 || mpb_is_gpu_only(name) ||
      mpb_allocator_is_pinned(name))
    return MP_OK;
  char shown[MPB_SHOWN];
  return mp__fail(MP_EINVAL,
                  "unknown allocator '%s' (pool, pool:OPTS, pool-nograph, "
                  "child:bytes=SIZE, "
                  "direct, jemalloc, cuda-async, cuda-malloc, host-pool, "
                  "host-pool:OPTS, host-pow2, host-direct, host-jemalloc)",
                  mpb_shown(name, shown));
}

static bool mpb_device_is_host(mp_device_t *dev) {
  return strncmp(mp_device_name(dev), "host", 4) == 0;
}

bool mpb_allocator_available(const char *name, mp_device_t *dev, char *why,
                             size_t why_len) {
  if (mpb_is_gpu_only(name) && !mpb_device_is_host(dev))
    return true;
  if (mpb_is_gpu_only(name)) {
    snprintf(why, why_len, "needs a GPU (device is host)");
    return false;
  }
  if (strcmp(name, "jemalloc") == 0 || strcmp(name, "host-jemalloc") == 0) {
#if MPBENCH_HAVE_JEMALLOC
    if (name[0] == 'j' && !mpb_device_is_host(dev)) {
      snprintf(why, why_len,
               "runs on the host device only (its metadata "
               "lives in the memory it manages)");
      return false;
    }
#else
    snprintf(why, why_len, "mpbench was built without jemalloc");
    return false;
#endif
  }
  return true;
}

/* ---- jemalloc arena over the device ------------------------------------- */

#if MPBENCH_HAVE_JEMALLOC
/* jemalloc reads this when it starts. With retain (its default on 64-bit
 * Linux) it grows by reserving ever larger runs of address space,
 * uncommitted, and commits pages as it needs them; the hooks here cannot
 * reserve without allocating device memory, so every such run would count
 * in full as reserved, up to twice the memory jemalloc uses. Without
 * retain it asks the hooks for extents the size it needs. Extents it lets
 * go still stay with it (dalloc opts out), so it caches as the pool does. */
const char *malloc_conf = "retain:false";

struct mpb_jemalloc {
  extent_hooks_t hooks; /* first: a hook's extent_hooks_t * is this struct */
  mp_device_t *dev;
  bool pinned; /* chunks from mp_device_host_alloc, not mp_device_alloc */
  unsigned arena;
  size_t reserved;
  uint64_t device_calls;
  void **chunks;
  size_t nchunks, cap;
};

/* A chunk from the device: device memory, or page-locked host memory. */
static mp_status_t mpb_je_get(mpb_jemalloc_t *j, size_t size, void **p) {
  return j->pinned ? mp_device_host_alloc(j->dev, size, p)
                   : mp_device_alloc(j->dev, size, p);
}

/* Gives a chunk back; a free the driver made is a device call. */
static void mpb_je_put(mpb_jemalloc_t *j, void *p) {
  mp_status_t st =
      j->pinned ? mp__device_host_free(j->dev, p) : mp__device_free(j->dev, p);
  j->device_calls += st == MP_OK;
}

static bool mpb_je_track(mpb_jemalloc_t *j, void *p) {
  if (!mpb_grow(&j->chunks, &j->cap, j->nchunks, sizeof *j->chunks))
    return false;
  j->chunks[j->nchunks++] = p;
  return true;
}

static void *mpb_je_alloc(extent_hooks_t *h, void *new_addr, size_t size,
                          size_t alignment, bool *zero, bool *commit,
                          unsigned arena_ind) {
  (void)arena_ind;
  mpb_jemalloc_t *j = (mpb_jemalloc_t *)h;
  if (new_addr != NULL)
    return NULL; /* the device cannot place memory at a given address */
  void *p;
  size_t got = size;
  if (mpb_je_get(j, size, &p) != MP_OK)
    return NULL;
  j->device_calls++;
  if (((uintptr_t)p & (alignment - 1)) != 0) {
    /* Not aligned enough: ask again with room to align inside. */
    mpb_je_put(j, p);
    if (size + alignment < size || mpb_je_get(j, size + alignment, &p) != MP_OK)
      return NULL;
    j->device_calls++;
    got = size + alignment;
  }
  if (!mpb_je_track(j, p)) {
    mpb_je_put(j, p);
    return NULL;
  }
  j->reserved += got;
  void *ret =
      (void *)(((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1));
  if (*zero)
    memset(ret, 0, size); /* host memory: pinned, or the host device's */
  *commit = true;
  return ret;
}

static bool mpb_je_dalloc(extent_hooks_t *h, void *addr, size_t size,
                          bool committed, unsigned arena_ind) {
  (void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
  return true; /* opt out: jemalloc retains it; freed with the arena */
}

static void mpb_je_destroy(extent_hooks_t *h, void *addr, size_t size,
                           bool committed, unsigned arena_ind) {
  (void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
}

static bool mpb_je_commit(extent_hooks_t *h, void *addr, size_t size,
                          size_t offset, size_t length, unsigned arena_ind) {
  (void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
  return false; /* always committed */
}

static bool mpb_je_decommit(extent_hooks_t *h, void *addr, size_t size,
                            size_t offset, size_t length, unsigned arena_ind) {
  (void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
  return true; /* opt out */
}

static bool mpb_je_split(extent_hooks_t *h, void *addr, size_t size,
                         size_t size_a, size_t size_b, bool committed,
                         unsigned arena_ind) {
  (void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed,
      (void)arena_ind;
  return false;
}

static bool mpb_je_merge(extent_hooks_t *h, void *addr_a, size_t size_a,
                         void *addr_b, size_t size_b, bool committed,
                         unsigned arena_ind) {
  (void)h, (void)addr_a, (void)size_a, (void)addr_b, (void)size_b,
      (void)committed, (void)arena_ind;
  return false;
}

static void mpb_je_close(mpb_jemalloc_t *j) {
  char cmd[64];
  snprintf(cmd, sizeof cmd, "arena.%u.destroy", j->arena);
  mallctl(cmd, NULL, NULL, NULL, 0);
  for (size_t i = 0; i < j->nchunks; i++)
    mpb_je_put(j, j->chunks[i]);
  free(j->chunks);
  free(j);
}

static mp_status_t mpb_je_open(mp_device_t *dev, bool pinned,
                               mpb_jemalloc_t **out) {
  mpb_jemalloc_t *j = calloc(1, sizeof *j);
  if (j == NULL)
    return mp__fail(MP_ENOMEM, "jemalloc: out of host memory");
  j->hooks = (extent_hooks_t){
      .alloc = mpb_je_alloc,
      .dalloc = mpb_je_dalloc,
      .destroy = mpb_je_destroy,
      .commit = mpb_je_commit,
      .decommit = mpb_je_decommit,
      .split = mpb_je_split,
      .merge = mpb_je_merge,
  };
  j->dev = dev;
  j->pinned = pinned;
  extent_hooks_t *hp = &j->hooks;
  size_t sz = sizeof j->arena;
  if (mallctl("arenas.create", &j->arena, &sz, &hp, sizeof hp) != 0) {
    /* The hooks may have run (arena metadata) before it failed. */
    for (size_t i = 0; i < j->nchunks; i++)
      mpb_je_put(j, j->chunks[i]);
    free(j->chunks);
    free(j);
    return mp__fail(MP_ENOMEM, "jemalloc: arenas.create failed (the device "
                               "has no room for the arena's metadata?)");
  }
  *out = j;
  return MP_OK;
}
#endif

/* ---- the table ------------------------------------------------------------
 */

mp_status_t mpb_allocator_open(const char *name, mp_device_t *dev,
                               mpb_make_fn make, mpb_allocator_t **out) {
  mp_status_t st = MP_OK;
  char why[128], shown[MPB_SHOWN];
  if (make == NULL) {
    if ((st = mpb_allocator_check_name(name)) != MP_OK)
      return st;
    if (!mpb_allocator_available(name, dev, why, sizeof why))
      return mp__fail(MP_ENOTSUP, "allocator %s: %s", mpb_shown(name, shown),
                      why);
  }
  mpb_allocator_t *a = calloc(1, sizeof *a);
  if (a == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory");
  a->dev = dev;
  if (make == NULL && strcmp(name, "cuda-async") == 0) {
    a->kind = MPB_KIND_CUDA_ASYNC;
    st = mpb_cuasync_open(dev, &a->cu);
  } else if (make == NULL && strcmp(name, "cuda-malloc") == 0) {
    a->kind = MPB_KIND_RAW;
    size_t free_b, total_b;
    st = mp_device_mem_info(dev, &free_b, &total_b);
    a->raw_base = total_b - free_b;
  } else if (make == NULL && mpb_prefix(name, "host-pool")) {
    a->kind = MPB_KIND_HOST_POOL;
    /* Every field 0: the host pool's defaults ($MEMPOOL_CONF is the device
     * pool's). At this header's size, or the options appended after the
     * first size (arenas=, map_piece=) would be refused. */
    mp_pool_config_t cfg = {.struct_size = sizeof cfg};
    st = name[9] == ':' ? mp_pool_config_parse(&cfg, name + 10) : MP_OK;
    if (st == MP_OK)
      st = mp_host_pool_create(dev, &cfg, &a->hp);
  } else if (make == NULL && strcmp(name, "host-pow2") == 0) {
    a->kind = MPB_KIND_HOST_POW2;
    st = mpb_pow2_open(dev, &a->pow2);
  } else if (make == NULL && strcmp(name, "host-direct") == 0) {
    a->kind = MPB_KIND_HOST_DIRECT;
    mp__ptrmap_init(&a->held, sizeof(mpb_held_t));
  } else if (make == NULL && (strcmp(name, "jemalloc") == 0 ||
                              strcmp(name, "host-jemalloc") == 0)) {
    a->kind = MPB_KIND_JEMALLOC;
#if MPBENCH_HAVE_JEMALLOC
    st = mpb_je_open(dev, name[0] == 'h', &a->je);
#endif
  } else if (make == NULL && strcmp(name, "pool-nograph") == 0) {
    a->kind = MPB_KIND_MEMPOOL;
    a->nograph = true;
    st = mp_allocator_create(dev, "pool", &a->mp);
  } else {
    a->kind = make == NULL && strcmp(name, "direct") == 0 ? MPB_KIND_DIRECT
                                                          : MPB_KIND_MEMPOOL;
    st =
        make ? make(dev, name, &a->mp) : mp_allocator_create(dev, name, &a->mp);
  }
  if (st != MP_OK) {
    free(a);
    return st;
  }
  *out = a;
  return MP_OK;
}

/* ---- host-direct: the driver's page-locked calls, nothing between ---- */

static mp_status_t mpb_host_direct_alloc(mpb_allocator_t *a, size_t size,
                                         void **out) {
  mp_status_t st = mp_device_host_alloc(a->dev, size, out);
  if (st != MP_OK)
    return st;
  a->raw_calls++;
  mpb_held_t *e = mp__ptrmap_put(&a->held, (uintptr_t)*out);
  if (e == NULL) {
    a->raw_calls += mp__device_host_free(a->dev, *out) == MP_OK;
    return mp__fail(MP_ENOMEM, "host-direct: out of host memory");
  }
  e->bytes = size;
  a->raw_held += size;
  return MP_OK;
}

static mp_status_t mpb_host_direct_free(mpb_allocator_t *a, void *ptr) {
  if (ptr == NULL)
    return MP_OK;
  mpb_held_t e;
  if (!mp__ptrmap_take(&a->held, (uintptr_t)ptr, &e))
    return mp__fail(MP_EINVAL, "host-direct: %p is not live", ptr);
  a->raw_held -= e.bytes;
  mp_status_t st = mp__device_host_free(a->dev, ptr);
  a->raw_calls += st == MP_OK;
  return st;
}

/* ---- graph events -------------------------------------------------------
 */

static mp_status_t mpb_nograph_alloc(mpb_allocator_t *a, size_t size,
                                     void **out) {
  if (a->ngb == a->gb_cap) {
    size_t cap = a->gb_cap ? a->gb_cap * 2 : 64;
    mpb_gblock_t *gb = realloc(a->gb, cap * sizeof *gb);
    if (gb == NULL)
      return mp__fail(MP_ENOMEM, "pool-nograph: out of host memory");
    a->gb = gb;
    a->gb_cap = cap;
  }
  mp_status_t st = mp_device_alloc(a->dev, size, out);
  if (st == MP_OK) {
    a->gb_calls++;
    a->gb[a->ngb++] = (mpb_gblock_t){*out, size, false};
    a->gb_bytes += size;
  }
  return st;
}

/* A graph's block freed: kept while the graph lives. false: not one. */
static bool mpb_nograph_free(mpb_allocator_t *a, void *ptr) {
  for (size_t i = 0; i < a->ngb; i++)
    if (a->gb[i].ptr == ptr && !a->gb[i].freed) {
      a->gb[i].freed = true;
      return true;
    }
  return false;
}

/* The graphs are gone: their freed blocks go back to the device. */
static void mpb_nograph_release(mpb_allocator_t *a, bool all) {
  size_t k = 0;
  for (size_t i = 0; i < a->ngb; i++) {
    if (a->gb[i].freed || all) {
      a->gb_calls += mp__device_free(a->dev, a->gb[i].ptr) == MP_OK;
      a->gb_bytes -= a->gb[i].bytes;
    } else {
      a->gb[k++] = a->gb[i];
    }
  }
  a->ngb = k;
}

mp_status_t mpb_allocator_graph(mpb_allocator_t *a, unsigned what,
                                mp_stream_t s) {
  mp_pool_t *pool =
      a->kind == MPB_KIND_MEMPOOL ? mp_allocator_pool(a->mp) : NULL;
  if (pool == NULL)
    return MP_OK; /* not graph-aware */
  mp_status_t st = MP_OK;
  switch (what) {
  case MPB_CAPTURE_BEGIN:
    a->cap = s;
    if (a->nograph) {
      a->capturing = a->glive = true;
      return MP_OK;
    }
    if (a->graph == NULL &&
        (st = mp_pool_graph_create(pool, &a->graph)) != MP_OK)
      return st == MP_EINVAL ? MP_OK : st; /* a child: not graph-aware */
    return mp_pool_graph_begin(pool, a->graph, s);
  case MPB_CAPTURE_END:
    a->capturing = false;
    return a->graph != NULL ? mp_pool_graph_end(pool, s) : MP_OK;
  case MPB_GRAPH_RELEASE:
    if (a->nograph)
      mpb_nograph_release(a, false);
    a->glive = false;
    if (a->graph != NULL)
      st = mp_pool_graph_release(a->graph);
    a->graph = NULL;
    return st;
  }
  return mp__fail(MP_EINVAL, "graph event %u", what);
}

size_t mpb_allocator_graph_bytes(mpb_allocator_t *a) {
  mp_stats_t s;
  if (a->graph != NULL && mp_pool_get_stats(a->graph, &s) == MP_OK)
    return s.reserved_bytes;
  return a->gb_bytes;
}

mp_status_t mpb_allocator_alloc(mpb_allocator_t *a, size_t size, mp_stream_t s,
                                void **out) {
  if (MP__UNLIKELY(a->capturing) && s == a->cap)
    return mpb_nograph_alloc(a, size, out);
  if (a->kind == MPB_KIND_RAW) {
    mp_status_t st = mp_device_alloc(a->dev, size, out);
    a->raw_calls += st == MP_OK;
    return st;
  }
  if (a->kind == MPB_KIND_CUDA_ASYNC)
    return mpb_cuasync_alloc(a->cu, size, s, out);
  if (a->kind == MPB_KIND_HOST_POOL)
    return mp_host_pool_alloc(a->hp, size, s, out);
  if (a->kind == MPB_KIND_HOST_POW2)
    return mpb_pow2_alloc(a->pow2, size, out);
  if (a->kind == MPB_KIND_HOST_DIRECT)
    return mpb_host_direct_alloc(a, size, out);
#if MPBENCH_HAVE_JEMALLOC
  if (a->kind == MPB_KIND_JEMALLOC) {
    *out = mallocx(size, MALLOCX_ARENA(a->je->arena) | MALLOCX_TCACHE_NONE);
    return *out ? MP_OK
                : mp__fail(MP_ENOMEM, "jemalloc: no room for %zu bytes", size);
  }
#endif
  return mp_allocator_alloc(a->mp, size, s, out);
}

mp_status_t mpb_allocator_free(mpb_allocator_t *a, void *ptr) {
  if (MP__UNLIKELY(a->ngb > 0) && mpb_nograph_free(a, ptr)) {
    if (!a->glive)
      mpb_nograph_release(a, false); /* freed after the release */
    return MP_OK;
  }
  if (a->kind == MPB_KIND_RAW) {
    if (ptr == NULL)
      return MP_OK; /* no call */
    mp_status_t st = mp__device_free(a->dev, ptr);
    a->raw_calls += st == MP_OK;
    return st;
  }
  if (a->kind == MPB_KIND_CUDA_ASYNC)
    return mpb_cuasync_free(a->cu, ptr);
  if (a->kind == MPB_KIND_HOST_POOL)
    return mp_host_pool_free(a->hp, ptr);
  if (a->kind == MPB_KIND_HOST_POW2)
    return mpb_pow2_free(a->pow2, ptr);
  if (a->kind == MPB_KIND_HOST_DIRECT)
    return mpb_host_direct_free(a, ptr);
#if MPBENCH_HAVE_JEMALLOC
  if (a->kind == MPB_KIND_JEMALLOC) {
    if (ptr != NULL)
      dallocx(ptr, MALLOCX_TCACHE_NONE);
    return MP_OK;
  }
#endif
  mp_status_t st = mp_allocator_free(a->mp, ptr);
  if (st == MP_OK && a->kind == MPB_KIND_DIRECT)
    st = mp_allocator_release(a->mp);
  return st;
}

void mpb_allocator_sample(mpb_allocator_t *a, mpb_sample_t *out) {
  memset(out, 0, sizeof *out);
  if (a->kind == MPB_KIND_RAW) {
    size_t free_b, total_b;
    if (mp_device_mem_info(a->dev, &free_b, &total_b) == MP_OK &&
        total_b - free_b > a->raw_base)
      out->reserved = total_b - free_b - a->raw_base;
    out->device_calls = a->raw_calls;
    return;
  }
  if (a->kind == MPB_KIND_HOST_POW2) {
    mpb_pow2_sample(a->pow2, &out->reserved, &out->device_calls);
    return;
  }
  if (a->kind == MPB_KIND_HOST_DIRECT) {
    out->reserved = a->raw_held;
    out->device_calls = a->raw_calls;
    return;
  }
  if (a->kind == MPB_KIND_CUDA_ASYNC) {
    out->reserved = mpb_cuasync_reserved(a->cu);
    out->no_device_calls = true;
    return;
  }
#if MPBENCH_HAVE_JEMALLOC
  if (a->kind == MPB_KIND_JEMALLOC) {
    out->reserved = a->je->reserved;
    out->device_calls = a->je->device_calls;
    return;
  }
#endif
  mp_stats_t s;
  if ((a->kind == MPB_KIND_HOST_POOL
           ? mp_host_pool_get_stats(a->hp, &s)
           : mp_allocator_get_stats(a->mp, &s)) != MP_OK)
    return;
  out->reserved = s.reserved_bytes + a->gb_bytes;
  out->device_calls = s.device_alloc_count + s.device_free_count + a->gb_calls;
  if (a->kind == MPB_KIND_MEMPOOL || a->kind == MPB_KIND_HOST_POOL) {
    out->has_free_info = true;
    out->free_bytes = s.reserved_bytes > s.allocated_bytes
                          ? s.reserved_bytes - s.allocated_bytes
                          : 0;
    out->largest_free = s.largest_free_bytes;
  }
}

mp_allocator_t *mpb_allocator_mempool(mpb_allocator_t *a) {
  return a->mp;
}

void mpb_allocator_close(mpb_allocator_t *a) {
  if (a == NULL)
    return;
#if MPBENCH_HAVE_JEMALLOC
  if (a->kind == MPB_KIND_JEMALLOC)
    mpb_je_close(a->je);
#endif
  if (a->kind == MPB_KIND_CUDA_ASYNC)
    mpb_cuasync_close(a->cu);
  if (a->hp != NULL)
    mp_host_pool_destroy(a->hp);
  mpb_pow2_close(a->pow2);
  if (a->kind == MPB_KIND_HOST_DIRECT) {
    for (size_t i = 0; i < a->held.cap; i++) {
      mpb_held_t *e = mp__ptrmap_at(&a->held, i);
      if (e != NULL)
        mp__device_host_free(a->dev, (void *)e->key);
    }
    mp__ptrmap_destroy(&a->held);
  }
  mpb_nograph_release(a, true);
  free(a->gb);
  if (a->graph != NULL) { /* a run that stopped inside a capture */
    mp_pool_t *pool = mp_allocator_pool(a->mp);
    if (mp_pool_graph_of(pool, a->cap) == a->graph)
      (void)mp_pool_graph_end(pool, a->cap);
    (void)mp_pool_graph_release(a->graph);
  }
  if (a->mp != NULL)
    mp_allocator_destroy(a->mp);
  free(a);
}
