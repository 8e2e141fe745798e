/* fuzz_pool - random operation sequences against the pool, for libFuzzer
 * (fuzz_pool) and as a plain seed replayer (fuzz_pool_replay, run by ctest).
 *
 * The input is a program: the first two bytes pick the configuration
 * (virtual range or plain segments, a small or CUDA-sized granule,
 * alignment, max_split, max_bytes, segment_bytes, defrag on OOM, map_piece,
 * stream_waits, release_threshold), then each 4-byte group is one operation
 * on one of three streams: alloc, free (on a stream too, free_async; and a
 * double free), contiguous alloc, record_stream, trim with several keep
 * values, child pool create/alloc/free/destroy, bad frees (interior,
 * foreign, movable and child-range pointers), movable alloc/free,
 * defragment, freeze, reset_peaks, a device synchronize or work that keeps
 * a stream behind the host. Live blocks are tagged at both ends and
 * checked before they are freed and after every move. After every
 * operation mp_pool_check runs on the pool (and the child) and the stats
 * are compared with what the harness itself counts: live blocks,
 * requested bytes, alloc/free/oom counts, peaks. Any broken invariant, lost
 * tag or unexpected status traps, which is what libFuzzer (and ctest)
 * reports. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "fuzz_pool_ops.h"
#include "fuzz_require.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_LIVE    64
#define FUZZ_STREAMS 3

typedef struct fz_block {
  unsigned char *p; /* raw blocks; NULL for movable ones */
  mp_handle_t *h;   /* movable blocks */
  size_t bytes;
  unsigned char tag;
  int in_child;
} fz_block_t;

/* What the harness expects a pool's stats to say. */
typedef struct fz_count {
  uint64_t live, allocs, frees, ooms;
  size_t requested, peak_requested;
} fz_count_t;

/* Devices: [virtual granule 2 MiB, virtual granule 64 KiB, plain]. */
#define FUZZ_DEVS 3
static mp_device_t *fz_dev[FUZZ_DEVS];
static mp_stream_t fz_stream[FUZZ_DEVS][FUZZ_STREAMS - 1];

static void fz_open(void) {
  if (fz_dev[0] != NULL)
    return;
  static const char *const specs[FUZZ_DEVS] = {
      "host:capacity=256M", "host:capacity=256M,granularity=64K",
      "host:capacity=256M,vmm=0"};
  for (int i = 0; i < FUZZ_DEVS; i++) {
    FZ_REQUIRE(mp_device_open(specs[i], &fz_dev[i]) == MP_OK);
    for (int k = 0; k < FUZZ_STREAMS - 1; k++)
      FZ_REQUIRE(mp_stream_create(fz_dev[i], &fz_stream[i][k]) == MP_OK);
  }
}

/* 1 B .. 8 MiB, log-scaled from two bytes. */
static size_t fz_size(uint8_t a, uint8_t b) {
  unsigned shift = a % 23;
  return 1 +
         (((size_t)b << 16 | (size_t)a << 8 | b) & (((size_t)1 << shift) - 1));
}

static unsigned char *fz_ptr(const fz_block_t *b) {
  return b->h != NULL ? mp_handle_ptr(b->h) : b->p;
}

static void fz_tag(fz_block_t *b) {
  unsigned char *p = fz_ptr(b);
  p[0] = b->tag;
  p[b->bytes - 1] = b->tag;
}

static void fz_verify(const fz_block_t *b) {
  const unsigned char *p = fz_ptr(b);
  FZ_REQUIRE(p[0] == b->tag && p[b->bytes - 1] == b->tag);
}

static void fz_alloced(fz_count_t *c, size_t bytes) {
  c->live++;
  c->allocs++;
  c->requested += bytes;
  if (c->requested > c->peak_requested)
    c->peak_requested = c->requested;
}

static void fz_freed(fz_count_t *c, size_t bytes) {
  c->live--;
  c->frees++;
  c->requested -= bytes;
}

/* The pool's invariants and its stats against the harness's own count. */
static void fz_check(mp_pool_t *p, const fz_count_t *c) {
  FZ_REQUIRE(mp_pool_check(p) == MP_OK);
  mp_stats_t st;
  FZ_REQUIRE(mp_pool_get_stats(p, &st) == MP_OK);
  FZ_REQUIRE(st.live_blocks == c->live);
  FZ_REQUIRE(st.requested_bytes == c->requested);
  FZ_REQUIRE(st.peak_requested_bytes == c->peak_requested);
  FZ_REQUIRE(st.alloc_count == c->allocs && st.free_count == c->frees);
  FZ_REQUIRE(st.oom_count == c->ooms);
  FZ_REQUIRE(st.allocated_bytes >= st.requested_bytes);
  FZ_REQUIRE(st.allocated_bytes + st.free_bytes == st.reserved_bytes);
  FZ_REQUIRE(st.largest_free_bytes <= st.free_bytes);
  FZ_REQUIRE(st.peak_reserved_bytes >= st.reserved_bytes &&
             st.peak_allocated_bytes >= st.allocated_bytes);
}

/* An allocation on s may have defragmented (the OOM rung), even one that
 * failed: its copies are queued on s, and host writes and reads (tags) are
 * not, so they wait for s (a program's own work would be ordered on s). */
static void fz_settle(mp_device_t *dev, mp_stream_t s, size_t movables) {
  if (movables > 0)
    FZ_REQUIRE(mp_stream_synchronize(dev, s) == MP_OK);
}

/* Removes live[k]; frees it when it is still live in the pool, on stream s
 * (mp_pool_free_async) when s is not NULL. */
static void fz_drop_on(fz_block_t *live, size_t *n, size_t k, mp_pool_t *pool,
                       mp_pool_t *child, fz_count_t *pc, fz_count_t *cc,
                       mp_stream_t s) {
  fz_block_t *b = &live[k];
  fz_verify(b);
  if (b->h != NULL) {
    FZ_REQUIRE(mp_handle_free(b->h) == MP_OK);
    FZ_REQUIRE(mp_handle_free(b->h) == MP_EINVAL);
  } else {
    mp_pool_t *owner = b->in_child ? child : pool;
    FZ_REQUIRE((s != NULL ? mp_pool_free_async(owner, b->p, s)
                          : mp_pool_free(owner, b->p)) == MP_OK);
  }
  fz_freed(b->in_child ? cc : pc, b->bytes);
  live[k] = live[--*n];
}

static void fz_drop(fz_block_t *live, size_t *n, size_t k, mp_pool_t *pool,
                    mp_pool_t *child, fz_count_t *pc, fz_count_t *cc) {
  fz_drop_on(live, n, k, pool, child, pc, cc, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  fz_open();
  int d = data[0] % FUZZ_DEVS;
  mp_device_t *dev = fz_dev[d];
  mp_stream_t streams[FUZZ_STREAMS] = {NULL, fz_stream[d][0], fz_stream[d][1]};
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (d == 2 || (data[1] & 0x40))
    cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  if (data[1] & 0x80)
    cfg.flags &= ~(unsigned)MP_POOL_DEFRAG_ON_OOM;
  cfg.align = (size_t)256 << ((data[0] >> 2) & 3);
  static const size_t splits[4] = {0, (size_t)1 << 20, (size_t)4 << 20, 0};
  cfg.max_split = splits[(data[0] >> 4) & 3];
  cfg.max_bytes = (data[0] & 0x40) ? ((size_t)64 << 20) : 0;
  static const size_t segs[4] = {0, (size_t)1 << 20, (size_t)64 << 10, 0};
  cfg.segment_bytes = segs[data[1] & 3];
  /* Mappings of one granule or of 4 MiB (the reclaim and trim of pieces),
   * stream waits, and memory given back as frees happen. */
  static const size_t pieces[4] = {0, 1, (size_t)4 << 20, 0};
  /* map_piece is refused with virtual=0 (pool.h). */
  cfg.map_piece =
      (cfg.flags & MP_POOL_VIRTUAL) ? pieces[(data[1] >> 2) & 3] : 0;
  if (data[1] & 0x10)
    cfg.flags |= MP_POOL_STREAM_WAITS;
  cfg.release_threshold = (data[1] & 0x20) ? ((size_t)4 << 20) : 0;
  mp_pool_t *pool, *child = NULL;
  FZ_REQUIRE(mp_pool_create(dev, &cfg, &pool) == MP_OK);
  fz_count_t pc = {0}, cc = {0};
  size_t child_bytes = 0;
  fz_block_t live[FUZZ_LIVE];
  size_t n = 0, movables = 0;
  unsigned char tag = 1;
  for (size_t i = 2; i + 4 <= size; i += 4) {
    const uint8_t *op = data + i;
    mp_stream_t s = streams[op[1] % FUZZ_STREAMS];
    switch (op[0] % 16) {
    case 0:
    case 1:
    case 2: { /* alloc, in the child when there is one and bit 7 says so */
      if (n == FUZZ_LIVE)
        break;
      int in_child = child != NULL && (op[0] & 0x80);
      fz_block_t b = {NULL, NULL, fz_size(op[2], op[3]), tag++, in_child};
      void *p;
      fz_count_t *c = in_child ? &cc : &pc;
      mp_status_t st = mp_pool_alloc(in_child ? child : pool, b.bytes, s, &p);
      fz_settle(dev, s, movables);
      FZ_REQUIRE(st == MP_OK || fz_is_oom(st));
      if (st != MP_OK) {
        c->ooms++;
        break;
      }
      FZ_REQUIRE((uintptr_t)p % cfg.align == 0);
      b.p = p;
      fz_tag(&b);
      fz_alloced(c, b.bytes);
      live[n++] = b;
      break;
    }
    case 3:
    case 4: { /* free; a second free of the same pointer is MP_EINVAL */
      if (n == 0)
        break;
      size_t k = op[2] % n;
      fz_block_t b = live[k];
      fz_drop_on(live, &n, k, pool, child, &pc, &cc,
                 (op[3] & 2) && s != NULL ? s : NULL);
      if ((op[3] & 1) && b.p != NULL)
        FZ_REQUIRE(mp_pool_free(b.in_child ? child : pool, b.p) == MP_EINVAL);
      break;
    }
    case 5: { /* contiguous: 1 to 4 pieces */
      size_t count = 1 + op[1] % 4;
      if (n + count > FUZZ_LIVE)
        break;
      size_t sizes[4] = {fz_size(op[2], op[3]), fz_size(op[3], op[2]),
                         fz_size(op[1], op[2]), fz_size(op[2] ^ op[3], op[1])};
      void *out[4];
      mp_status_t st = mp_pool_alloc_contiguous(pool, count, sizes, s, out);
      fz_settle(dev, s, movables);
      FZ_REQUIRE(st == MP_OK || fz_is_oom(st));
      if (st != MP_OK) {
        pc.ooms++;
        break;
      }
      for (size_t k = 0; k < count; k++) {
        FZ_REQUIRE(k == 0 || (unsigned char *)out[k] >=
                                 (unsigned char *)out[k - 1] + sizes[k - 1]);
        fz_block_t b = {out[k], NULL, sizes[k], tag++, 0};
        fz_tag(&b);
        fz_alloced(&pc, sizes[k]);
        live[n++] = b;
      }
      break;
    }
    case 6: /* record_stream: raw and movable blocks alike */
      if (n > 0) {
        fz_block_t *b = &live[op[2] % n];
        mp_pool_t *owner = b->in_child ? child : pool;
        FZ_REQUIRE(mp_pool_record_stream(owner, fz_ptr(b), s) == MP_OK);
      }
      break;
    case 7: { /* trim, keeping 0, some or everything */
      size_t keep = op[2] < 64 ? 0
                    : op[2] < 128
                        ? (size_t)op[3] << 16
                        : (op[2] < 250 ? (size_t)op[3] << 12 : SIZE_MAX);
      mp_stats_t before, after;
      FZ_REQUIRE(mp_pool_get_stats(pool, &before) == MP_OK);
      FZ_REQUIRE(mp_pool_trim(pool, keep) == MP_OK);
      FZ_REQUIRE(mp_pool_get_stats(pool, &after) == MP_OK);
      FZ_REQUIRE(after.allocated_bytes == before.allocated_bytes &&
                 after.reserved_bytes <= before.reserved_bytes);
      if (child != NULL)
        FZ_REQUIRE(mp_pool_trim(child, keep) == MP_OK);
      break;
    }
    case 8: { /* child lifecycle */
      if (child == NULL) {
        size_t bytes = fz_size(op[2], op[3]);
        mp_status_t st = mp_pool_create_child(pool, bytes, &child);
        fz_settle(dev, NULL, movables);
        FZ_REQUIRE(st == MP_OK || fz_is_oom(st));
        if (st != MP_OK) {
          pc.ooms++;
          child = NULL;
          break;
        }
        fz_alloced(&pc, bytes);
        child_bytes = bytes;
        memset(&cc, 0, sizeof cc);
      } else {
        FZ_REQUIRE(mp_pool_destroy(pool) == MP_EBUSY);
        if (op[2] & 1) { /* destroy with its blocks still live */
          for (size_t k = 0; k < n;)
            if (live[k].in_child)
              live[k] = live[--n];
            else
              k++;
        } else {
          for (size_t k = 0; k < n;)
            if (live[k].in_child)
              fz_drop(live, &n, k, pool, child, &pc, &cc);
            else
              k++;
          fz_check(child, &cc);
        }
        FZ_REQUIRE(mp_pool_destroy(child) == MP_OK);
        fz_freed(&pc, child_bytes);
        child = NULL;
      }
      break;
    }
    case 9: /* bad frees change nothing */
      if (n > 0) {
        fz_block_t *b = &live[op[2] % n];
        mp_pool_t *owner = b->in_child ? child : pool;
        if (b->bytes > 1)
          FZ_REQUIRE(mp_pool_free(owner, fz_ptr(b) + 1) == MP_EINVAL);
        if (b->h != NULL)
          FZ_REQUIRE(mp_pool_free(pool, fz_ptr(b)) == MP_EINVAL);
        if (b->in_child)
          FZ_REQUIRE(mp_pool_free(pool, b->p) == MP_EINVAL);
      }
      FZ_REQUIRE(mp_pool_free(pool, (void *)&tag) == MP_EINVAL);
      break;
    case 10:
    case 11: { /* movable alloc */
      if (n == FUZZ_LIVE)
        break;
      fz_block_t b = {NULL, NULL, fz_size(op[2], op[3]), tag++, 0};
      mp_status_t st = mp_pool_alloc_movable(pool, b.bytes, s, &b.h);
      fz_settle(dev, s, movables + 1);
      FZ_REQUIRE(st == MP_OK || fz_is_oom(st));
      if (st != MP_OK) {
        pc.ooms++;
        break;
      }
      movables++;
      fz_tag(&b);
      fz_alloced(&pc, b.bytes);
      live[n++] = b;
      break;
    }
    case 12: { /* defragment on s; the moved data is there once s is done */
      size_t moved = 0;
      FZ_REQUIRE(mp_pool_defragment(pool, s, &moved) == MP_OK);
      FZ_REQUIRE(mp_stream_synchronize(dev, s) == MP_OK);
      for (size_t k = 0; k < n; k++)
        fz_verify(&live[k]);
      break;
    }
    case 13: /* freeze (rarely), else reset the peaks */
      if (op[2] < 32) {
        FZ_REQUIRE(mp_pool_freeze(pool) == MP_OK);
        for (size_t k = 0; k < n; k++)
          fz_verify(&live[k]);
      } else {
        FZ_REQUIRE(mp_pool_reset_peaks(pool) == MP_OK);
        pc.peak_requested = pc.requested;
      }
      break;
    case 14: /* the device finishes everything queued, or a stream runs
              * behind the host for up to 255 us (blocks freed on it wait) */
      if (op[2] < 160)
        FZ_REQUIRE(mp_device_synchronize(dev) == MP_OK);
      else
        FZ_REQUIRE(mp_stream_launch_host(dev, s, fz_busy,
                                         (void *)(uintptr_t)op[3]) == MP_OK);
      break;
    case 15: /* absurd sizes fail, count as OOM and change nothing else */
      if (op[2] & 1) {
        void *p;
        FZ_REQUIRE(
            fz_is_oom(mp_pool_alloc(pool, SIZE_MAX - (op[3] & 0x7f), s, &p)));
      } else {
        size_t sizes[2] = {SIZE_MAX / 2 + op[3], SIZE_MAX / 2};
        void *out[2];
        FZ_REQUIRE(fz_is_oom(mp_pool_alloc_contiguous(pool, 2, sizes, s, out)));
      }
      pc.ooms++;
      break;
    }
    fz_check(pool, &pc);
    if (child != NULL)
      fz_check(child, &cc);
  }
  /* Movable data can be moved by an OOM rung on any stream; everything is
   * settled once the device is. */
  FZ_REQUIRE(mp_device_synchronize(dev) == MP_OK);
  while (n > 0)
    fz_drop(live, &n, n - 1, pool, child, &pc, &cc);
  fz_check(pool, &pc);
  if (child != NULL) {
    fz_check(child, &cc);
    FZ_REQUIRE(mp_pool_destroy(child) == MP_OK);
    fz_freed(&pc, child_bytes);
  }
  fz_check(pool, &pc);
  mp_stats_t st;
  FZ_REQUIRE(mp_pool_get_stats(pool, &st) == MP_OK);
  FZ_REQUIRE(st.allocated_bytes == 0 && st.live_blocks == 0);
  FZ_REQUIRE(mp_pool_trim(pool, 0) == MP_OK);
  FZ_REQUIRE(mp_pool_get_stats(pool, &st) == MP_OK);
  FZ_REQUIRE(st.reserved_bytes == 0 && st.free_bytes == 0);
  FZ_REQUIRE(mp_pool_destroy(pool) == MP_OK);
  return 0;
}
