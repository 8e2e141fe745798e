/* fuzz_pool_life - random lifecycles around a pool, for libFuzzer
 * (fuzz_pool_life) and as a plain seed replayer (fuzz_pool_life_replay, run
 * by ctest).
 *
 * fuzz_pool drives one pool's blocks; this harness drives what happens
 * around them, in any order: graph pools (create, routing a stream with
 * mp_pool_graph_begin/end, release while the graph's blocks are live, frees
 * through the parent and through the graph pool), pause and resume (with and
 * without the content kept, with blocks live and frees pending on streams
 * that run behind the host), streams destroyed and made again while blocks
 * were allocated or freed on them (a new stream may get the old handle), a
 * cap lowered and lifted (mp_pool_set_max_fraction), mp_pool_free_after_all,
 * mp_pool_add_stream, record_stream, trim, over per-thread arenas too.
 *
 * The first two bytes pick the configuration (virtual range or plain
 * segments, granule, arenas, stream waits, release threshold, cap, pieces);
 * then each 4-byte group is one operation. What every call must return is
 * what pool.h promises for the state the harness tracks (paused: MP_EBUSY;
 * a routed stream: MP_EBUSY for a second begin, MP_EINVAL for an end of one
 * not routed; a release with a stream routed: MP_EBUSY; ...). Live blocks
 * are tagged at both ends and checked before they are freed, after a resume
 * that kept the content, and at the end. After every operation
 * mp_pool_check runs on the pool and the graph pool, and the stats are
 * compared with the harness's count where it can know them. Any broken
 * promise traps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "fuzz_pool_ops.h"
#include "fuzz_require.h"

#define LF_LIVE    48
#define LF_STREAMS 3 /* the default stream and two of the harness's */

typedef struct lf_block {
  unsigned char *p;
  size_t bytes;
  unsigned char tag;
  int in_graph; /* served by the graph pool */
} lf_block_t;

typedef struct lf_state {
  mp_device_t *dev;
  mp_pool_t *pool, *graph; /* graph: NULL, or a graph pool not gone yet */
  int released;            /* graph released; gone with its last block */
  int routed[LF_STREAMS];  /* stream k allocates to graph */
  int paused, kept;        /* paused, with MP_PAUSE_KEEP_CONTENT */
  int virt;                /* the pool is on its virtual range */
  int odd_cap, pausable;   /* a cap was set that may not be whole granules */
  mp_stream_t s[LF_STREAMS];
  lf_block_t live[LF_LIVE];
  size_t n;
  size_t parent_live, parent_requested; /* the parent's own blocks */
  unsigned char tag;
} lf_state_t;

/* Devices: [virtual granule 2 MiB, virtual granule 64 KiB, plain]. */
#define LF_DEVS 3
static mp_device_t *lf_dev[LF_DEVS];

static void lf_open(void) {
  if (lf_dev[0] != NULL)
    return;
  static const char *const specs[LF_DEVS] = {
      "host:capacity=256M", "host:capacity=256M,granularity=64K",
      "host:capacity=256M,vmm=0"};
  for (int i = 0; i < LF_DEVS; i++)
    FZ_REQUIRE(mp_device_open(specs[i], &lf_dev[i]) == MP_OK);
}

/* 1 B .. 4 MiB, log-scaled from two bytes. */
static size_t lf_size(uint8_t a, uint8_t b) {
  unsigned shift = a % 22;
  return 1 +
         (((size_t)b << 16 | (size_t)a << 8 | b) & (((size_t)1 << shift) - 1));
}

static void lf_tag(const lf_block_t *b) {
  b->p[0] = b->tag;
  b->p[b->bytes - 1] = b->tag;
}

static void lf_verify(const lf_block_t *b) {
  FZ_REQUIRE(b->p[0] == b->tag && b->p[b->bytes - 1] == b->tag);
}

static int lf_any_routed(const lf_state_t *z) {
  for (int k = 0; k < LF_STREAMS; k++)
    if (z->routed[k])
      return 1;
  return 0;
}

static size_t lf_graph_live(const lf_state_t *z) {
  size_t c = 0;
  for (size_t k = 0; k < z->n; k++)
    c += (size_t)z->live[k].in_graph;
  return c;
}

/* A released graph pool is gone once its last block is. */
static void lf_graph_settle(lf_state_t *z) {
  if (z->graph != NULL && z->released && lf_graph_live(z) == 0) {
    z->graph = NULL;
    z->released = 0;
  }
}

static void lf_check(const lf_state_t *z) {
  /* A pause is refused while a graph pool lives, and none is made while
   * paused. */
  FZ_REQUIRE(!(z->paused && z->graph != NULL));
  mp_status_t st = mp_pool_check(z->pool);
  FZ_REQUIRE(z->paused ? st == MP_EBUSY : st == MP_OK);
  if (z->graph != NULL)
    FZ_REQUIRE(mp_pool_check(z->graph) == MP_OK);
  mp_stats_t s;
  FZ_REQUIRE(mp_pool_get_stats(z->pool, &s) == MP_OK);
  if (z->paused && z->kept) {
    FZ_REQUIRE(s.free_bytes == 0);
  } else if (!z->paused) {
    FZ_REQUIRE(s.allocated_bytes + s.free_bytes == s.reserved_bytes);
    FZ_REQUIRE(s.largest_free_bytes <= s.free_bytes);
  }
  FZ_REQUIRE(s.peak_reserved_bytes >= s.reserved_bytes);
  /* A graph pool's ranges are blocks of the parent the harness does not
   * see; without one its count is exact. */
  if (z->graph == NULL) {
    FZ_REQUIRE(s.live_blocks == z->parent_live);
    FZ_REQUIRE(s.requested_bytes == z->parent_requested);
  } else {
    FZ_REQUIRE(s.live_blocks >= z->parent_live);
    mp_stats_t g;
    FZ_REQUIRE(mp_pool_get_stats(z->graph, &g) == MP_OK);
    FZ_REQUIRE(g.live_blocks == lf_graph_live(z));
    FZ_REQUIRE(g.allocated_bytes + g.free_bytes == g.reserved_bytes);
  }
}

static void lf_alloc(lf_state_t *z, int k, const uint8_t *op) {
  if (z->n == LF_LIVE)
    return;
  int direct = z->graph != NULL && (op[0] & 0x80);
  lf_block_t b = {NULL, lf_size(op[2], op[3]), z->tag++, 0};
  void *p = NULL;
  mp_status_t st =
      mp_pool_alloc(direct ? z->graph : z->pool, b.bytes, z->s[k], &p);
  if (z->paused) {
    FZ_REQUIRE(st == MP_EBUSY && p == NULL);
    return;
  }
  if (direct && z->released) {
    FZ_REQUIRE(st == MP_EINVAL);
    return;
  }
  FZ_REQUIRE(st == MP_OK || fz_is_oom(st));
  if (st != MP_OK)
    return;
  b.p = p;
  b.in_graph = direct || z->routed[k];
  lf_tag(&b);
  if (!b.in_graph) {
    z->parent_live++;
    z->parent_requested += b.bytes;
  }
  z->live[z->n++] = b;
}

static void lf_free(lf_state_t *z, int k, const uint8_t *op) {
  if (z->n == 0)
    return;
  size_t i = op[2] % z->n;
  lf_block_t b = z->live[i];
  if (!z->paused) /* paused: unmapped */
    lf_verify(&b);
  mp_pool_t *via = b.in_graph && (op[3] & 4) ? z->graph : z->pool;
  mp_stream_t s = (op[3] & 2) ? z->s[k] : NULL;
  int after_all = (op[3] & 8) != 0;
  mp_status_t st = after_all   ? mp_pool_free_after_all(via, b.p)
                   : s != NULL ? mp_pool_free_async(via, b.p, s)
                               : mp_pool_free(via, b.p);
  if (z->paused) {
    FZ_REQUIRE(st == MP_EBUSY);
    return;
  }
  FZ_REQUIRE(st == MP_OK);
  if (!b.in_graph) {
    z->parent_live--;
    z->parent_requested -= b.bytes;
  }
  z->live[i] = z->live[--z->n];
  lf_graph_settle(z);
  /* A second free of it changes nothing. */
  if (op[3] & 1)
    FZ_REQUIRE(mp_pool_free(z->pool, b.p) == MP_EINVAL);
}

static void lf_record(lf_state_t *z, int k, const uint8_t *op) {
  if (z->n == 0)
    return;
  lf_block_t *b = &z->live[op[2] % z->n];
  mp_status_t st = mp_pool_record_stream(z->pool, b->p, z->s[k]);
  FZ_REQUIRE(z->paused ? st == MP_EBUSY : st == MP_OK);
}

static void lf_graph_op(lf_state_t *z, int k, const uint8_t *op) {
  switch (op[2] % 4) {
  case 0: { /* a new graph pool */
    if (z->graph != NULL)
      return;
    mp_pool_t *g = NULL;
    mp_status_t st = mp_pool_graph_create(z->pool, &g);
    if (z->paused) {
      FZ_REQUIRE(st == MP_EBUSY);
      return;
    }
    FZ_REQUIRE(st == MP_OK && g != NULL);
    z->graph = g;
    z->released = 0;
    return;
  }
  case 1: { /* route stream k to it; the default stream is refused (CUDA
             * never captures the legacy stream, pool.h) */
    if (z->graph == NULL)
      return;
    mp_status_t st = mp_pool_graph_begin(z->pool, z->graph, z->s[k]);
    if (z->released || z->s[k] == NULL)
      FZ_REQUIRE(st == MP_EINVAL);
    else if (z->routed[k])
      FZ_REQUIRE(st == MP_EBUSY);
    else {
      FZ_REQUIRE(st == MP_OK);
      z->routed[k] = 1;
    }
    FZ_REQUIRE(mp_pool_graph_of(z->pool, z->s[k]) ==
               (z->routed[k] ? z->graph : NULL));
    return;
  }
  case 2: { /* end the routing of stream k */
    mp_status_t st = mp_pool_graph_end(z->pool, z->s[k]);
    FZ_REQUIRE(st == (z->routed[k] ? MP_OK : MP_EINVAL));
    if (st == MP_OK)
      z->routed[k] = 0;
    FZ_REQUIRE(mp_pool_graph_of(z->pool, z->s[k]) ==
               (z->routed[k] ? z->graph : NULL));
    return;
  }
  default: { /* release, its blocks live or not */
    if (z->graph == NULL)
      return;
    mp_status_t st = mp_pool_graph_release(z->graph);
    if (z->released)
      FZ_REQUIRE(st == MP_EINVAL);
    else if (lf_any_routed(z))
      FZ_REQUIRE(st == MP_EBUSY);
    else
      FZ_REQUIRE(st == MP_OK);
    if (st == MP_OK)
      z->released = 1;
    lf_graph_settle(z);
    return;
  }
  }
}

static void lf_pause(lf_state_t *z, const uint8_t *op) {
  unsigned flags = (op[3] & 1) ? MP_PAUSE_KEEP_CONTENT : 0;
  mp_status_t st = mp_pool_pause(z->pool, flags);
  if (z->paused || z->graph != NULL) {
    FZ_REQUIRE(st == MP_EBUSY);
    return;
  }
  /* A cap of no whole number of granules may have given a block a plain
   * segment of its own (pool.h), unless the pool is pausable. */
  if (!z->virt || (z->odd_cap && st == MP_ENOTSUP)) {
    FZ_REQUIRE(st == MP_ENOTSUP);
    return;
  }
  FZ_REQUIRE(st == MP_OK);
  z->paused = 1;
  z->kept = flags != 0;
  mp_stats_t s;
  FZ_REQUIRE(mp_pool_get_stats(z->pool, &s) == MP_OK);
  FZ_REQUIRE(s.reserved_bytes == 0 && s.free_bytes == 0);
}

static void lf_resume(lf_state_t *z) {
  mp_status_t st = mp_pool_resume(z->pool);
  if (!z->paused) {
    FZ_REQUIRE(st == MP_EINVAL);
    return;
  }
  FZ_REQUIRE(st == MP_OK);
  z->paused = 0;
  for (size_t k = 0; k < z->n; k++)
    if (z->kept)
      lf_verify(&z->live[k]);
    else
      lf_tag(&z->live[k]);
}

/* Stream k (not the default one) destroyed, whatever was allocated, freed
 * or recorded on it, and a new one made in its place. */
static void lf_restream(lf_state_t *z, int k) {
  if (k == 0)
    return;
  FZ_REQUIRE(mp_stream_destroy(z->dev, z->s[k]) == MP_OK);
  z->routed[k] = 0;
  FZ_REQUIRE(mp_stream_create(z->dev, &z->s[k]) == MP_OK);
  FZ_REQUIRE(mp_pool_graph_of(z->pool, z->s[k]) == NULL);
}

static void lf_cap(lf_state_t *z, const uint8_t *op) {
  double f = op[2] < 64 ? 0.0 : (double)op[3] / 255.0;
  mp_status_t st = mp_pool_set_max_fraction(z->pool, f);
  FZ_REQUIRE(z->paused ? st == MP_EBUSY : st == MP_OK);
  if (st == MP_OK && f > 0 && !z->pausable)
    z->odd_cap = 1;
  if (z->graph != NULL)
    FZ_REQUIRE(mp_pool_set_max_fraction(z->graph, f) == MP_EINVAL);
}

static void lf_misc(lf_state_t *z, int k, const uint8_t *op) {
  switch (op[2] % 5) {
  case 0: FZ_REQUIRE(mp_device_synchronize(z->dev) == MP_OK); return;
  case 1:
    FZ_REQUIRE(mp_stream_launch_host(z->dev, z->s[k], fz_busy,
                                     (void *)(uintptr_t)op[3]) == MP_OK);
    return;
  case 2: {
    mp_status_t st = mp_pool_add_stream(z->pool, z->s[k]);
    FZ_REQUIRE(z->paused ? st == MP_EBUSY : st == MP_OK);
    return;
  }
  case 3: { /* trim: refused while paused, and while a stream is routed
             * where it would wait for that stream's work (pool.h) */
    mp_stats_t before, after;
    FZ_REQUIRE(mp_pool_get_stats(z->pool, &before) == MP_OK);
    mp_status_t st = mp_pool_trim(z->pool, (size_t)op[3] << 16);
    if (z->paused)
      FZ_REQUIRE(st == MP_EBUSY);
    else if (lf_any_routed(z))
      FZ_REQUIRE(st == MP_OK || st == MP_EBUSY);
    else
      FZ_REQUIRE(st == MP_OK);
    FZ_REQUIRE(mp_pool_get_stats(z->pool, &after) == MP_OK);
    FZ_REQUIRE(after.reserved_bytes <= before.reserved_bytes &&
               after.allocated_bytes == before.allocated_bytes);
    return;
  }
  default: FZ_REQUIRE(mp_pool_reset_peaks(z->pool) == MP_OK); return;
  }
}

/* Everything back: resumed, routing ended, the graph released, every block
 * verified and freed, all memory given back, the pool destroyed. */
static void lf_finish(lf_state_t *z) {
  if (z->paused)
    lf_resume(z);
  for (int k = 0; k < LF_STREAMS; k++)
    if (z->routed[k]) {
      FZ_REQUIRE(mp_pool_graph_end(z->pool, z->s[k]) == MP_OK);
      z->routed[k] = 0;
    }
  if (z->graph != NULL && !z->released) {
    FZ_REQUIRE(mp_pool_graph_release(z->graph) == MP_OK);
    z->released = 1;
    lf_graph_settle(z);
  }
  FZ_REQUIRE(mp_device_synchronize(z->dev) == MP_OK);
  while (z->n > 0) {
    lf_block_t b = z->live[--z->n];
    lf_verify(&b);
    FZ_REQUIRE(mp_pool_free(z->pool, b.p) == MP_OK);
    if (!b.in_graph) {
      z->parent_live--;
      z->parent_requested -= b.bytes;
    }
    lf_graph_settle(z);
  }
  FZ_REQUIRE(z->graph == NULL);
  lf_check(z);
  FZ_REQUIRE(mp_pool_trim(z->pool, 0) == MP_OK);
  mp_stats_t st;
  FZ_REQUIRE(mp_pool_get_stats(z->pool, &st) == MP_OK);
  FZ_REQUIRE(st.live_blocks == 0 && st.allocated_bytes == 0);
  FZ_REQUIRE(st.reserved_bytes == 0 && st.free_bytes == 0);
  FZ_REQUIRE(mp_pool_destroy(z->pool) == MP_OK);
  for (int k = 1; k < LF_STREAMS; k++)
    FZ_REQUIRE(mp_stream_destroy(z->dev, z->s[k]) == MP_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  lf_open();
  static lf_state_t z;
  memset(&z, 0, sizeof z);
  int d = data[0] % LF_DEVS;
  z.dev = lf_dev[d];
  z.tag = 1;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (d == 2 || (data[0] & 0x80))
    cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  z.virt = (cfg.flags & MP_POOL_VIRTUAL) != 0;
  static const size_t arenas[4] = {0, 0, 2, 4};
  cfg.arenas = arenas[(data[0] >> 2) & 3];
  if (cfg.arenas > 0 && (data[0] & 0x10))
    cfg.flags |= MP_POOL_ARENAS_AUTO;
  if (data[0] & 0x20)
    cfg.flags |= MP_POOL_STREAM_WAITS;
  /* A cap of whole granules: pause never meets a plain segment. */
  cfg.max_bytes = (data[0] & 0x40) ? ((size_t)64 << 20) : 0;
  cfg.release_threshold = (data[1] & 1) ? ((size_t)4 << 20) : 0;
  static const size_t pieces[4] = {0, 1, (size_t)4 << 20, 0};
  /* map_piece is refused with virtual=0 (pool.h). */
  cfg.map_piece =
      (cfg.flags & MP_POOL_VIRTUAL) ? pieces[(data[1] >> 1) & 3] : 0;
  if (data[1] & 8)
    cfg.flags &= ~(unsigned)MP_POOL_DEFRAG_ON_OOM;
  z.pausable = z.virt && (data[1] & 16);
  if (z.pausable)
    cfg.flags |= MP_POOL_PAUSABLE;
  FZ_REQUIRE(mp_pool_create(z.dev, &cfg, &z.pool) == MP_OK);
  for (int k = 1; k < LF_STREAMS; k++)
    FZ_REQUIRE(mp_stream_create(z.dev, &z.s[k]) == MP_OK);
  for (size_t i = 2; i + 4 <= size; i += 4) {
    const uint8_t *op = data + i;
    int k = op[1] % LF_STREAMS;
    switch (op[0] % 12) {
    case 0:
    case 1:
    case 2: lf_alloc(&z, k, op); break;
    case 3:
    case 4: lf_free(&z, k, op); break;
    case 5: lf_record(&z, k, op); break;
    case 6: lf_graph_op(&z, k, op); break;
    case 7:
      if (op[2] & 1)
        lf_pause(&z, op);
      else
        lf_resume(&z);
      break;
    case 8: lf_restream(&z, k); break;
    case 9: lf_cap(&z, op); break;
    default: lf_misc(&z, k, op); break;
    }
    lf_check(&z);
  }
  lf_finish(&z);
  return 0;
}
