/* pool_internal.h - the pool's private structures, shared by src/pool/ files
 * and by the white-box unit tests. Never installed.
 *
 * Map of src/pool, bottom first: each file, its one job, and the files it
 * may call (only files below it; ctest src_pool_layers checks that no file
 * calls, directly or not, a file that calls it: cmake/layers.py --show).
 *   lock.c      the pool lock and the one protocol for dropping it around a
 *               device call or a synchronization (invariant stated there);
 *               the waits a host function or a graph pool's own growth
 *               must not make. Calls nothing.
 *   index.c     size classes, bitmaps, class treaps of free blocks. Nothing.
 *   history.c   the event ring of mp_pool_history. Nothing.
 *   config.c    config defaults, parsing, validation. Nothing.
 *   stats.c     peaks and the largest free block. index.
 *   stream.c    stream table, epochs, markers, events, deps of free blocks,
 *               the pool's synchronization (mp__pool_sync). lock.
 *   block.c     block records, the live map, split and the one merge
 *               (mp__block_absorb, coalesce). index, stream.
 *   segment.c   the segment list and plain segments. block, index, stream,
 *               history, stats, lock.
 *   vrange.c    the virtual range: chunks, holes, placement, map/unmap
 *               bookkeeping, reclaim. segment and what it calls.
 *   grow.c      grow / trim / release dispatch. vrange, segment, block,
 *               stream, lock.
 *   defrag.c    defragmentation and freeze. block, index, stream, stats,
 *               lock.
 *   core.c      the allocation core: search, take (the out-of-memory
 *               ladder, defrag its last rung), make live, release; a
 *               pool's host structures. grow, segment, defrag, block,
 *               index, stream, history, stats.
 *   export.c    IPC exports and the leases the free path needs (hold, reap,
 *               release all). core, grow, vrange, block.
 *   alloc.c     an allocation under the lock. core, export, block, stream.
 *   check.c     mp_pool_check. export, block, index, lock.
 *   dump.c      mp_pool_dump. stats, lock.
 *   snapshot.c  mp_pool_snapshot. Nothing (the lock is inline).
 *   pause.c     pause and resume. export, vrange, stream, defrag, lock.
 *   child.c     child pools. alloc, core, block, index.
 *   graph.c     graph-private pools: routes, capture marks (in every
 *               arena of a parent with arenas), lending and giving back
 *               ranges. alloc, core, block, stream.
 *   handle.c    movable-block handles. alloc, core, block, history.
 *   arena.c     per-thread arenas (arenas=N): a thread's arena, the
 *               arena holding a pointer, sharing the cap, reclaiming the
 *               other arenas' cache on out-of-memory, trim, lending to
 *               graph pools. alloc, core, grow, vrange, block, stream,
 *               stats, contiguous, graph, defrag.
 *   pool.c      the public entry points (create, destroy, alloc, free,
 *               record_stream, trim, ...): route to graph pools, leases,
 *               pause, handles, children, then the core. Any file above.
 * The one call downwards-up: a graph pool's growth (segment.c) borrows
 * from its parent through pool->upstream, a function pointer set at
 * mp_pool_graph_create (as an RMM resource's upstream): graph.c's, which
 * marks the growth as this thread's and calls pool->borrow, chosen by
 * pool.c: graph.c's borrowing, or arena.c's for a parent with arenas. The fit
 * and split rules, the paused check and the lock itself are inline functions of
 * this header.
 *
 * Object model:
 *   mp_pool_t     one lock, a free index, a live-block map, segments, a
 *                 stream table and an event cache.
 *   mp__segment_t memory the pool holds: a plain device allocation, the one
 *                 virtual range (mapped prefix grown by vm_map chunks), or
 *                 a child pool's range carved from its parent.
 *   mp__block_t   a host record for one block of a segment, never stored in
 *                 device memory. Blocks of a segment tile it exactly and form
 *                 an address-ordered list. A free block sits in the free index
 *                 (size class treap); a live block sits in the live map.
 *
 * Stream safety: a free block carries deps, (stream, epoch) pairs naming the
 * work that must finish before a stream other than that one may reuse it
 * (stream.c). Everything here expects pool->lock held unless it says
 * otherwise. Functions for defrag.c are marked [defrag]. */
#ifndef MEMPOOL_POOL_INTERNAL_H
#define MEMPOOL_POOL_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "../device/backend.h"
#include "../internal.h"

/* ---- size classes (index.c) --------------------------------------------
 * Sizes are counted in 512-byte units, whatever the pool's alignment (best
 * fit is exact whatever the classes; a constant shift is cheaper). Units below
 * MP__SL_COUNT map one class per size; above, each power of two (first
 * level) is cut into MP__SL_COUNT equal classes (second level), so a class
 * spans at most 1/32 of its sizes. */
#define MP__SL_LOG2       5
#define MP__SL_COUNT      (1u << MP__SL_LOG2)
#define MP__FL_COUNT      64
#define MP__CLS_UNIT_LOG2 9 /* the classes count sizes in 512-byte units */

#define MP__DEFAULT_ALIGN   ((size_t)512)
#define MP__DEFAULT_SEGMENT ((size_t)2 << 20)
/* Plain segments for requests above segment_bytes/2 are rounded to this,
 * the allocation granularity of cuMemAlloc. */
#define MP__LARGE_ROUND ((size_t)2 << 20)
/* Defragmentation's staging buffers alive or kept at once (defrag.c). */
#define MP__STAGE_SLOTS 2

#define MP__POOL_FLAGS                                                         \
  (MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM | MP_POOL_HISTORY_STACKS |          \
   MP_POOL_STREAM_WAITS | MP_POOL_PAUSABLE | MP_POOL_ARENAS_AUTO)

/* Internal status, never returned to a caller: growth ran out of host
 * memory for its bookkeeping (the message says so). The out-of-memory
 * ladder stops at once and reports MP_ENOMEM with that message: the device
 * is not what failed, and no rung would help. */
#define MP__EHOST ((mp_status_t)0x4854)
/* st as a caller sees it: MP__EHOST is MP_ENOMEM, its message kept. */
static inline mp_status_t mp__status_out(mp_status_t st) {
  return st == MP__EHOST ? MP_ENOMEM : st;
}
/* Internal status, never returned to a caller: mp__pool_alloc_cached found
 * nothing cached to serve the request (not a failure). */
#define MP__EMISS ((mp_status_t)0x4d53)
/* Internal status, never returned to a caller: mp__pool_alloc_cached did
 * not look, its cache being off (cached_off: paused, a history, a stream
 * captured); mp__pool_alloc_cached_off says more. */
#define MP__EOFF ((mp_status_t)0x4f46)
/* Internal status, never returned to a caller: a free on the lane arena
 * (arena.c, "The lane") of a pointer outside its segments, which the
 * free looks for in the other arenas (mp__pool_find_live_why). */
#define MP__EFORWARD ((mp_status_t)0x4657)

/* ---- blocks ------------------------------------------------------------ */
enum {
  MP__B_FREE = 1u << 0,      /* in the free index */
  MP__B_CHILD = 1u << 1,     /* live: a child pool's range */
  MP__B_MOVABLE = 1u << 2,   /* live: owned by an mp_handle_t (defrag.c) */
  MP__B_FROZEN = 1u << 3,    /* live: fenced off from defragmentation */
  MP__B_SYNC = 1u << 4,      /* free: too many deps; reusable by any stream
                                only after a device sync (gen < sync_done) */
  MP__B_MANY_USES = 1u << 5, /* live: more record_stream uses than fit */
  MP__B_UNMERGED = 1u << 6,  /* free: left apart from a free neighbour:
                                grown next to a block another stream waits
                                on (so the new memory is usable at once),
                                kept under max_split, their pending
                                streams do not fit one record, or the
                                neighbour's work on another stream would
                                hold a block just freed back, or a graph's
                                range given back its neighbour (block.c);
                                merged by a later free, a sync or trim, or
                                (the last kind) by an allocation that finds
                                no block (merge_later) */
  MP__B_HOLE = 1u << 7,      /* an unmapped gap of the virtual range: neither
                                free nor live, never next to another hole,
                                never the range's last block; sidx is its
                                slot in seg->holes */
  MP__B_EXPORTED = 1u << 8,  /* live: exported, leases in pool->exports */
  MP__B_HELD = 1u << 9,      /* live: freed by its owner while imported
                                elsewhere; released when its leases close */
  MP__B_LADDER = 1u << 10    /* in the live map but no caller's: taken by the
                                out-of-memory ladder while it waits for the
                                streams (core.c, mp__block_hold) */
};

#define MP__MAX_DEPS 4

/* MP_DEBUG builds track the pool lock's owner (lock.c). */
#if defined(MP_DEBUG) && MP_DEBUG
#define MP__LOCK_OWNER 1
#else
#define MP__LOCK_OWNER 0
#endif

/* 8 bytes, so that a block record fits two cache lines: at most
 * MP__MAX_STREAMS streams per pool, 2^48 epochs per stream. One word, read
 * and written through the accessors below: the epoch (the stream's epoch
 * when the block was freed) in the low 48 bits, the stream's index into
 * pool->streams in the top 16. Not bit-fields, which GCC 12 builds and
 * compares through extra masks, shifts and moves: a one-stream free's dep
 * (slot 0) is the epoch alone, and two deps on one stream order as their
 * words do. */
#define MP__MAX_STREAMS    65535u
#define MP__DEP_EPOCH_BITS 48
#define MP__DEP_EPOCH_MASK (((uint64_t)1 << MP__DEP_EPOCH_BITS) - 1)
typedef struct mp__dep {
  uint64_t w;
} mp__dep_t;
_Static_assert(MP__MAX_STREAMS <= UINT64_MAX >> MP__DEP_EPOCH_BITS,
               "a stream index fits a dep's top bits");
/* The dep on stream sidx's epoch (its low 48 bits, as the word keeps). */
static inline mp__dep_t mp__dep(uint32_t sidx, uint64_t epoch) {
  return (mp__dep_t){((uint64_t)sidx << MP__DEP_EPOCH_BITS) |
                     (epoch & MP__DEP_EPOCH_MASK)};
}
static inline uint32_t mp__dep_sidx(mp__dep_t d) {
  return (uint32_t)(d.w >> MP__DEP_EPOCH_BITS);
}
static inline uint64_t mp__dep_epoch(mp__dep_t d) {
  return d.w & MP__DEP_EPOCH_MASK;
}
/* 0 when a and b are deps on the same stream, else nonzero (one xor, one
 * shift): a word a caller may or with others to test them all at once. */
static inline uint64_t mp__dep_other_stream(mp__dep_t a, mp__dep_t b) {
  return (a.w ^ b.w) >> MP__DEP_EPOCH_BITS;
}
/* Whether a and b are deps on the same stream. */
static inline bool mp__dep_same_stream(mp__dep_t a, mp__dep_t b) {
  return mp__dep_other_stream(a, b) == 0;
}

typedef struct mp__segment mp__segment_t;

typedef struct mp__block {
  /* First cache line: what alloc, free, the tiling and a free index
   * descent touch. */
  _Alignas(64) uintptr_t addr;
  size_t size; /* multiple of the pool's align, > 0 */
  /* free: the block's own node in its class's treap (index.c), keyed by
   * (size, addr), priority from addr: no node to allocate or copy. */
  struct mp__block *left, *right;
  struct mp__block *prev, *next; /* address order within seg */
  uint32_t cls;   /* free: its class in the free index, fl * SL_COUNT + sl */
  uint32_t flags; /* MP__B_* */
  union {
    uint32_t sidx; /* live: allocating stream; hole: slot in seg->holes */
    uint32_t prio; /* free: treap priority, mp__prio(addr) (index.c) */
  };
  uint32_t ndeps; /* free: deps used; live: uses used */
  /* Second cache line: the rest. */
  mp__segment_t *seg;
  union {
    size_t requested;           /* live: the caller's bytes; else unread */
    struct mp__block *next_rec; /* idle record: the record free list */
  };
  uint64_t gen;                 /* MP__B_SYNC: pool sync generation */
  mp__dep_t deps[MP__MAX_DEPS]; /* free: deps; live: extra uses (sidx) */
  union {
    void *handle;     /* MP__B_MOVABLE: its handle's slot (handle.c) */
    mp_pool_t *child; /* MP__B_CHILD: the child pool */
  };
} mp__block_t;

/* Whether b is memory the program holds: live, and not the block the
 * out-of-memory ladder holds while it waits (MP__B_LADDER: free memory on
 * its way to becoming an allocation, which the ladder may yet give back).
 * What a pause keeps (pause.c) and what a freeze fences (defrag.c). */
static inline bool mp__block_owned(const mp__block_t *b) {
  return !(b->flags & (MP__B_FREE | MP__B_HOLE | MP__B_LADDER));
}

/* ---- segments (segment.c, vrange.c) ------------------------------------ */
enum { MP__SEG_PLAIN, MP__SEG_VIRTUAL, MP__SEG_RANGE };

typedef struct mp__chunk {
  uintptr_t addr;
  size_t size; /* exactly one vm_map call */
  /* The virtual range's: the stream handle of the request it was mapped
   * for (0: a take for every stream), which its segment_unmap and a
   * resume's segment_map name (vrange.c, pause.c). */
  uintptr_t made_for;
} mp__chunk_t;
/* The first of the n chunks c (sorted by address) at or above a; n where
 * none is. */
static inline size_t mp__chunks_at(const mp__chunk_t *c, size_t n,
                                   uintptr_t a) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c[mid].addr < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
/* Whether chunk c and [a, a + n) share a byte. */
static inline bool mp__chunk_meets(mp__chunk_t c, uintptr_t a, size_t n) {
  return c.addr < a + n && a < c.addr + c.size;
}

struct mp__segment {
  uintptr_t base;
  size_t size; /* bytes held: allocated, mapped, or the child range */
  size_t span; /* the blocks tile [base, base + span): size, or for the
                  virtual range up to the top of its highest chunk */
  int kind;
  bool small; /* plain: made for a request of at most segment_bytes/2,
                 the one such requests share (PyTorch's small pool) */
  mp__block_t *first, *last;
  mp__segment_t *prev, *next;
  size_t va_size;      /* virtual: reserved address range */
  mp__chunk_t *chunks; /* virtual: mapped chunks, ascending; the gaps
                          between them are exactly the hole blocks */
  size_t nchunks, chunk_cap;
  mp__block_t **holes; /* virtual: the hole blocks, in no order */
  size_t nholes, holes_cap;
  uintptr_t fence; /* [defrag] 0, or the top of what the last freeze
                      fenced: nothing is moved below it */
  /* plain: the stream handle of the request it was made for (0: a take
   * for every stream, a child's), which its segment_free names
   * (segment.c); kept here, not looked up in the history's ring. */
  uintptr_t made_for;
};

/* A live map slot: the block's address (0: empty) and its record. */
typedef struct mp__slot {
  uintptr_t addr;
  mp__block_t *blk;
} mp__slot_t;

/* ---- streams (stream.c) ------------------------------------------------ */
#define MP__MAX_MARKS 8

typedef struct mp__marker {
  mp_event_t ev;
  uint64_t epoch; /* recorded when this epoch closed */
} mp__marker_t;

/* A stream slot. Padded to 256 bytes, a power of two, so that a slot's
 * address is its index shifted (an allocation's refs++ scaled it by 200
 * with two lea before); at most MP__MAX_STREAMS slots. */
typedef union mp__strm {
  struct {
    mp_stream_t s;      /* MP__STREAM_GONE once forgotten */
    uint64_t owner;     /* per-thread default stream: its thread; else 0 */
    uint64_t epoch;     /* open epoch: blocks freed now get it */
    uint64_t done;      /* every epoch < done has completed */
    uint32_t refs;      /* live blocks allocated on it or using it */
    bool dirty;         /* a block was freed in the open epoch */
    bool want_close;    /* per-thread: another thread needs its epoch closed */
    bool gone;          /* forgotten (mp_stream_forget): never matched again;
                           the slot is reused once refs is 0 and every epoch
                           is done, its epoch counter carrying on */
    uint32_t capturing; /* graph.c: begins not yet ended that route it to a
                           graph pool (being captured): while nonzero never
                           recorded on nor queried */
    bool join;          /* the pool's own join stream (stream.c), on which
                           nothing runs but waits */
    bool mark_only;     /* added only to carry capture marks (a pool with
                           arenas: mp__stream_capture_mark_owned); it goes
                           with its last mark if no block used it */
    bool capture_only;  /* marked capturing while the device said so, with
                           no live block and no open epoch: what its open
                           epoch holds since is the capture's alone, which
                           never runs once the capture is over without a
                           graph (mp__stream_drop); cleared by a use of
                           another stream's block on it */
    uint64_t sync_snap; /* epoch closed by the device sync in flight */
    bool sync_owed;     /* forgotten, with work that sync is to cover */
    mp__marker_t marks[MP__MAX_MARKS]; /* FIFO of recorded markers */
    unsigned mark_head, nmarks;
    /* host_pool.c (mp__stream_pin): fresh, made by an mp_host_pool_alloc
     * in flight, none of the calls relying on it served yet; pins, those
     * calls, while it is fresh. It goes when the last of them ends
     * refused (nothing else used it); last, past every hot field.
     * fresh_id names this making of the slot (the pool's fresh_ids): a
     * call's unpin finds the slot by its handle, and once the stream is
     * forgotten in the call (destroyed) the handle may have another slot,
     * pinned by other calls, that this call must leave alone. */
    uint32_t pins;
    bool fresh;
    uint64_t fresh_id;
    /* Set aside (mp__stream_hide), and its handle since given to a new
     * stream (mp__stream_born): the destroy went through, and the slot the
     * handle matches from then on is the new stream's (stream.c). */
    bool reborn;
    /* A partial sync (mp__pool_sync_partial) leaves this stream's epochs
     * as they are: captured, or no event could mark it; its sync_snap then
     * names the newest marker the sync waited for (0: none). */
    bool sync_keep;
  };
  uint8_t stride_[256];
} mp__strm_t;
_Static_assert(sizeof(mp__strm_t) == 256,
               "a stream slot is 256 bytes: its fields fit and the stride is "
               "a power of two");

/* ---- history (history.c) ----------------------------------------------- */
enum {
  MP__H_ALLOC,
  MP__H_FREE_REQUESTED,
  MP__H_FREE_COMPLETED,
  MP__H_SEGMENT_MAP,
  MP__H_SEGMENT_UNMAP,
  MP__H_SEGMENT_ALLOC,
  MP__H_SEGMENT_FREE,
  MP__H_OOM,
  MP__H_NACTIONS
};
#define MP__HIST_MAX    ((size_t)1 << 24) /* most events a ring keeps */
#define MP__HIST_FRAMES 16                /* return addresses per event */

typedef struct mp__hevent {
  uint64_t time_us; /* CLOCK_REALTIME, as PyTorch's trace */
  uintptr_t addr;   /* oom: what the pool could still reserve */
  size_t size;
  uintptr_t stream;
  uint8_t action; /* MP__H_* */
  uint8_t nframes;
  /* An alloc a resume recorded for a block that was live before the pause
   * (pause.c): a snapshot gives the block the frames of its own earlier
   * alloc while the ring still holds it (snapshot.c). */
  bool restored;
  /* free_requested, free_completed: the freed block's bytes past its
   * request rounded as the pool rounds (a block taken whole: mp__whole_ok,
   * or no record to split it with), in units of the pool's align, at most
   * UINT32_MAX; else 0. A snapshot writes a pending free block that size,
   * as PyTorch's block keeps its size (snapshot.c). In the padding: an
   * event stays 40 bytes. */
  uint32_t over;
} mp__hevent_t;
_Static_assert(sizeof(mp__hevent_t) == 40, "an event is 40 bytes");

typedef struct mp__history {
  mp__hevent_t *ev; /* NULL: no history */
  void **frames;    /* stacks: MP__HIST_FRAMES per event, else NULL */
  /* history_stacks=1: the entry points mark their caller (MP__HIST_ENTRY);
   * set with frames, and in a pool with arenas, whose arenas hold them. */
  bool marks;
  size_t cap;     /* events kept */
  size_t next;    /* slot the next event goes to */
  uint64_t total; /* events ever recorded (total > cap: wrapped) */
} mp__history_t;

/* ---- the pool ---------------------------------------------------------- */
struct mp_pool {
  /* lock.c: MP__LOCK_HELD | MP__LOCK_WOKEN | sleepers * MP__LOCK_SLEEPER;
   * the sleepers sleep on lock_seq, which a wake bumps. */
  _Atomic uint32_t lock;
  _Atomic uint32_t lock_seq;
  /* The pool mp_pool_alloc and mp_pool_free work on: the pool itself, or
   * while a pool made with arenas_auto=1 runs solo, its solo arena (the
   * first one made), used as a plain pool (arena.c, "Solo"). Read without
   * the lock (acquire); changes at most twice, from the pool to the solo
   * arena and back (release). */
  _Atomic(mp_pool_t *) hot;
#if MP__LOCK_OWNER
  /* MP_DEBUG: the thread holding lock, if owned; atomics, as an
   * assertion that the caller does not hold the lock reads them while
   * another thread may take it (the owner stored before the flag, with
   * release: a flag seen set comes with its owner). */
  _Atomic(pthread_t) lock_owner;
  atomic_bool lock_owned;
#endif
  /* lock.c: bumped, and its sleepers woken, when inflight or syncing
   * drops; idle_waiters (under the lock) counts those sleepers. */
  _Atomic uint32_t idle_seq;
  uint32_t idle_waiters;
  bool inflight; /* a grow/release is in progress with lock dropped */
  bool syncing;  /* a synchronization is in progress with the lock dropped:
                    other syncs wait for it, growth and frees do not (the
                    stream it waits for may be waiting for them) */
  mp_device_t *dev;
  mp_pool_config_t cfg;
  /* cfg.align - 1 and its complement, set with it (mp__pool_new): a
   * request's rounding (mp__pool_round) is an add and an and. */
  size_t align_add, align_mask;
  /* cfg.max_split, or SIZE_MAX when it is 0 (no limit), set with it
   * (mp__pool_new): whether a block may be split is one compare for the
   * blocks under the limit (mp__split_allowed), no test of 0 first. */
  size_t split_free_max;
  bool paused; /* pause.c: memory given back, addresses kept */
  /* paused, an event history, or a stream marked capturing (its pool
   * routes streams to graph pools): an arena's allocation from its cache
   * takes its rare path (alloc.c, pool.c). Kept by mp__pool_rare_update. */
  bool cached_off;
  bool pause_turn;    /* pause.c, a pool with arenas: a pause or resume of
                         its arenas is under way (the pool's lock dropped) */
  bool grow_held;     /* pause.c, an arena: its pool is being paused, so it
                         does not grow (into what arenas paused before it
                         gave back: resume could not map them all again) */
  uint32_t rare;      /* mp__pool_rare_of, kept by mp__pool_rare_update */
  bool merge_later;   /* a free kept apart from a neighbour another stream's
                         work holds (block.c): an allocation that finds no
                         block joins such pairs, waiting as for a pending one */
  size_t apart_bytes; /* the largest run of free neighbours the last joining
                         walk left apart (merge_later): a request above it
                         does not wait for them */
  void *pause_copy;   /* MP_PAUSE_KEEP_CONTENT: the live blocks, in order */
  /* st's reserved bytes before the pause: what the resume maps back (and
   * the strays held meanwhile: vrange.c), at which the cap's shares count
   * a paused arena (arena.c) */
  size_t paused_reserved;
  mp_pool_oom_handler_t oom_fn; /* mp_pool_set_oom_handler */
  void *oom_ctx;
  /* pause.c, paused: vseg's chunks [0, pause_mapped) are still mapped (an
   * undo that failed left them), 0 after a clean pause. */
  size_t pause_mapped;
  size_t cap;      /* effective cap on reserved bytes */
  size_t staged;   /* device bytes held outside the segments that count
                      against cap: defragmentation's staging buffer while
                      it lives (defrag.c) */
  bool cap_is_max; /* cap came from cfg.max_bytes (MP_ELIMIT) */
  /* An arena whose share (cap) mp_pool_set_max_fraction cut below what it
   * reserved, or while its growth was in flight: its reserved bytes may
   * read above its share until they drop under it (arena.c). */
  bool cap_cut;
  /* An arena cut while a growth was in flight: what it may hold once the
   * growth lands (its reserved and staged bytes and the growth's), which
   * the other arenas' shares count while the growth is in flight
   * (arena.c); 0 otherwise. */
  size_t cap_held;
  /* One of a pool's arenas (arena.c): its out-of-memory failures are not
   * final (the arenas' path retries), so they are no history events.
   * arena_index: its index in arena_of's table (set once, at its make). */
  bool arena;
  uint32_t arena_index;
  /* The solo arena of a pool made with arenas_auto=1 while that pool runs
   * solo (its hot is this arena): the pool; NULL otherwise, and once
   * contention on this arena's lock ended solo (arena.c, "Solo").
   * solo_waits counts those contended takes. Read without a lock. */
  _Atomic(mp_pool_t *) solo_of;
  _Atomic uint32_t solo_waits;
  /* A pool made with arenas_auto=1 whose first arena, not yet made, is to
   * run solo (arena.c, "Solo"). Under the pool's lock. */
  bool solo_next;
  mp_pool_t *arena_of; /* an arena: its pool (set once, at its make) */
  size_t granule;      /* virtual memory granule; 0: plain segments */

  mp_pool_t *parent;         /* child pools: the parent */
  mp__block_t *parent_block; /* child pools: the range's block in parent */
  size_t children;           /* live child pools (graph pools included) */
  size_t children_making;    /* a pool with arenas: mp_pool_create_child
                                calls between their allocation and the
                                child's count in an arena (child.c) */

  /* Growth from the parent instead of the device (graph pools, set in
   * graph.c): called with the lock dropped (inflight) for a new plain
   * segment of bytes on stream s. NULL: the device. */
  mp_status_t (*upstream)(mp_pool_t *pool, size_t *bytes, mp_stream_t s,
                          void **out); /* an mp__upstream_t */

  /* graph.c */
  bool graph;          /* a graph-private pool: grows by borrowing ranges of
                          parent (MP__SEG_RANGE segments) */
  bool released;       /* graph: mp_pool_graph_release called; the pool
                          goes with its last live block */
  uint32_t ncalls;     /* graph: allocations inside it (mp__graph_enter) */
  uint32_t ncapturing; /* stream slots whose capturing count is nonzero */
  struct mp__route *routes; /* parent: streams allocating to graph pools */
  size_t nroutes, routes_cap;
  struct mp__grange *granges; /* parent: ranges lent to graph pools */
  size_t ngranges, granges_cap;

  /* free index */
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[MP__FL_COUNT];
  mp__block_t *bins[MP__FL_COUNT * MP__SL_COUNT]; /* treap roots, by class
                                                    fl * SL_COUNT + sl */

  /* live map: open addressing, linear probing, backward-shift delete; keys
   * stored in the slots, so that probes never touch block records. map_cap
   * home slots, mp__map_slots(map_cap) in all (runs go on past the last
   * home slot instead of wrapping) */
  mp__slot_t *map;
  size_t map_cap;
  /* Entries that still fit before the map must grow (map_cap /
   * MP__MAP_LOAD less the entries: mp__map_count), so that the
   * allocation's room test is one compare with zero. */
  size_t map_room;
  unsigned map_shift; /* 64 - log2(map_cap): mp__map_slot's shift */

  mp__segment_t *segs; /* every segment, newest first */
  mp__segment_t *vseg; /* the virtual segment, if any */
  bool vm_failed;      /* the virtual range could not be reserved */

  mp__strm_t *streams;
  uint32_t nstreams, streams_cap, last_sidx;
  mp_stream_t last_s; /* streams[last_sidx].s, or MP__STREAM_GONE: the
                         stream of the pool's last call, compared without
                         reading the table (mp__stream_remember) */
  uint32_t *shash;    /* (handle, owner) -> sidx + 1; 0 empty; linear probing,
                         backward-shift delete; never more than half full */
  uint32_t shash_cap; /* power of two, or 0 */
  uint32_t *gone;     /* forgotten slots not yet reusable (room for
                         streams_cap) */
  uint32_t ngone;
  mp_stream_t pt_handle; /* the handle the device calls per-thread, if met */
  bool has_pt;
  bool pt_registered; /* in stream.c's list of pools whose threads' slots
                         go at thread exit */
  uint32_t pt_pins;   /* stream.c: exiting threads working on the pool
                         without the list's lock (destroy waits for them) */
  uint64_t sync_gen, sync_done; /* device-sync generations (MP__B_SYNC) */

  mp_event_t *events; /* idle events */
  size_t nevents, events_cap;

  mp__block_t *rec_free; /* idle block records */
  void **slabs;
  size_t nslabs, slabs_cap;

  /* Every field but largest_free_bytes, live_blocks and free_bytes, kept
   * current; live_blocks is the live map's count and free_bytes is
   * mp__free_bytes (mp__stats_copy), not kept here. */
  mp_stats_t st;
  /* mp_pool_set_access: append-only, so that a map made with the lock
   * dropped reads a prefix that was complete when it began. */
  mp_device_t *peers[32];
  _Atomic unsigned npeers;
  /* vrange.c: mappings a growth or resume left on the device outside the
   * virtual range's chunks (a peer's access refused, then the unmap
   * refused too: mp__pool_vm_map); unmapped before anything is mapped
   * over them (growth maps around those still kept), tried again at
   * growth, trim and pause (mp__vrange_strays_retry),
   * and unmapped at release. Grown on the host before a map that may
   * leave one, so none is forgotten. Changed only with a device call in
   * flight (inflight) or at destroy. */
  mp__chunk_t *strays;
  size_t nstrays, strays_cap;
  /* Their bytes as counted in st.reserved_bytes (and, paused, in
   * paused_reserved): device memory held, as the device's own figure and
   * the cap count it, though none of it serves a block. Brought up to the
   * strays under the lock after each device call that may change them
   * (mp__vrange_strays_count). */
  size_t stray_bytes;
  uint64_t release_next_free; /* release_threshold: the free_count at which
                                 a try to release may come again */
  /* arena.c: cfg.arenas entries (NULL: no arenas). An arena is a pool of
   * its own with arenas NULL; the pool itself then holds no memory. */
  struct mp__arena *arenas;
  /* Where mp_pool_alloc and mp_pool_free go from hot (arena.c, "The
   * lane"): NULL, hot's own plain path; else the pool with arenas whose
   * path they take (a pool with arenas: itself; the lane arena: its pool),
   * but for the thread whose thread pointer is gate_owner, which takes
   * hot's plain path anyway (0: none). One load on the plain path, as the
   * arenas' test it replaces. Read without the lock (relaxed: any value
   * read is a path that works). Here, among fields written rarely: every
   * other thread reads the lane arena's gate at each call, and beside its
   * lock word (written at each call of the lane's thread) the line went
   * back and forth between the cores (two threads in the lane ran at
   * 1.09x to 1.24x one thread, against 1.48x to 1.71x on the arenas'
   * path, bench_pool_threads). */
  _Atomic(mp_pool_t *) gate;
  _Atomic uintptr_t gate_owner;
  /* Unique among the pools a process makes (never 0), set at create: the
   * key of a thread's memo of its arena (mp__arena_memo), which a pool
   * made later at the same address does not match; a new one where a
   * destroy that failed freed some arenas (pool.c). */
  uint64_t serial;
  /* arena.c: odd while mp__arena_share moves the cap's shares (under the
   * pool's lock), bumped again when done: a stats read across arenas that
   * saw it change reads again (stats.c). */
  _Atomic uint64_t share_seq;
  struct mp__export *exports; /* export.c: open leases */
  size_t nexports, exports_cap;
  size_t nheld;   /* blocks MP__B_HELD */
  size_t nladder; /* blocks the ladder holds (mp__block_hold): in the live
                     map, not allocations (mp__stats_copy's alloc_count) */
  mp__history_t hist;
  mp_stream_t join;     /* stream.c (stream_waits): the pool's own stream
                           that joins more streams' deps than a block
                           record holds; NULL until needed */
  bool growth_no_waits; /* core.c: growth in this take counted on a wait
                           that could not be made; mp__deps_usable then
                           counts no busy block */
  /* The bytes of the growth in flight (inflight), set where growth drops
   * the lock to map or allocate (segment.c, vrange.c); 0 otherwise (a
   * release in flight). */
  size_t grow_inflight;
  /* Nonzero: the sync generation from which the pool's next sync must be a
   * device synchronize, not an event on each stream it knows (a graph
   * range given back to an arena while other arenas, or a capture, know
   * streams its replays may still run on: graph.c). Cleared by the first
   * sync that began at or after it (stream.c). */
  uint64_t sync_device_from;
  /* vrange.c: what the virtual range is sized from, the device's size
   * where it is larger than the cap (set at create; an arena's is its
   * pool's): mp_pool_set_max_fraction may raise the cap up to it after
   * the range is reserved. */
  size_t va_basis;
  /* graph: its id, its snapshot segments' segment_pool_id (snapshot.c):
   * (0, n), n from 1, one per graph pool in the process, or the MempoolId_t
   * PyTorch names it by (mp__graph_set_id); else (0, 0). At the end, off
   * the hot path's cache lines. */
  uint64_t graph_id[2];
  /* Free neighbours are kept apart until device-sync generation
   * apart_sync has passed (mp__sync_apart; 0: none; the earliest of the
   * pairs'): only a sync joins them, so they owe no joining walk
   * (merge_later) before it, where every allocation that found no block
   * walked every block again. */
  uint64_t apart_sync;
  /* defrag.c: staging buffers alive or kept (stage_slots, at most
   * MP__STAGE_SLOTS), and those the device refused to free (kept, their
   * bytes still in staged), freed again by mp__defrag_stage_retry. */
  unsigned stage_slots, nstage_kept;
  void *stage_kept[MP__STAGE_SLOTS];
  size_t stage_kept_bytes[MP__STAGE_SLOTS];
  /* A graph pool's: what lends its ranges, which upstream (graph.c's)
   * calls marking the growth as this thread's (mp__graph_growing_here).
   * At the end, off the hot path's cache lines (placed after upstream it
   * cost 0.7 / 1.1 instructions a pair, count_pairs.sh). */
  mp_status_t (*borrow)(mp_pool_t *pool, size_t *bytes, mp_stream_t s,
                        void **out);
  /* A graph pool's: released, and never cleared (released is, by the
   * caller that finishes the pool): read without graph's lock by its
   * growth in flight, which then borrows nothing more (graph.c). At the
   * end too: beside the graph fields it cost 0.7 / 1.1 instructions a
   * pair, as borrow did. */
  _Atomic bool graph_gone;
  /* stream.c (mp__stream_pin): slots made fresh so far, each one's
   * fresh_id; under the lock. */
  uint64_t fresh_ids;
  /* stream.c (mp__stream_index_second): the slot of the stream last used
   * beside last_s, or any index (checked against the slot at each use). */
  uint32_t second_sidx;
  /* segment.c and vrange.c: frees and unmaps of free memory the device
   * refused (the memory stays the pool's, free); mp__segment_trim reports
   * those of its own scan; give_back_st: the last refusal's status. Under
   * the lock. */
  uint64_t give_back_refused;
  mp_status_t give_back_st;
  /* pool.c (mp__pool_destroy): set under the lock once destroy last asked
   * the leases (mp__export_destroy_busy) and goes on to free the memory
   * unlocked; mp_pool_ipc_export refuses while it is set (an export made
   * there would name memory the destroy frees). Cleared where that free
   * is refused and the pool stays as it was. */
  bool export_sealed;
  /* default.c (mp__pool_for_good): a default pool, which lives until the
   * process exits; mp_pool_destroy refuses it (mp_malloc would go on
   * using it freed). */
  bool for_good;
  /* pause.c (mp__pause_copies_free): host copies of a paused content
   * whose free the device refused, kept for a retry at the next pause,
   * resume or destroy; linked through their own first bytes (each is
   * page-locked host memory, at least one block's size, no longer read).
   * Under the lock. */
  void *pause_stale;
};

/* ---- lock.c: the pool lock and the one way to drop it ------------------- */
/* The contended halves of the lock (lock.c): sleep until the lock is
 * taken; drop it when the word is v (held, with sleepers or a wake in
 * flight), waking one sleeper if need be. */
void mp__pool_lock_wait(mp_pool_t *pool);
void mp__pool_unlock_contended(mp_pool_t *pool, uint32_t v);
/* Takes / drops the pool's lock (inline: the hot path takes it once per
 * call; uncontended, each is one atomic instruction). MP_DEBUG builds
 * record the owner for MP__ASSERT_LOCKED. */
/* The lock word (lock.c): held, a wake in flight, sleepers above. */
#define MP__LOCK_HELD    1u
#define MP__LOCK_WOKEN   2u
#define MP__LOCK_SLEEPER 4u
static inline void mp__pool_lock(mp_pool_t *pool) {
  if (MP__UNLIKELY(atomic_fetch_or_explicit(&pool->lock, MP__LOCK_HELD,
                                            memory_order_acquire) &
                   MP__LOCK_HELD))
    mp__pool_lock_wait(pool);
#if MP__LOCK_OWNER
  atomic_store_explicit(&pool->lock_owner, pthread_self(),
                        memory_order_relaxed);
  atomic_store_explicit(&pool->lock_owned, true, memory_order_release);
#endif
}
/* Takes the pool's lock if it is free now (true), else false at once. */
static inline bool mp__pool_trylock(mp_pool_t *pool) {
  if ((atomic_load_explicit(&pool->lock, memory_order_relaxed) &
       MP__LOCK_HELD) ||
      (atomic_fetch_or_explicit(&pool->lock, MP__LOCK_HELD,
                                memory_order_acquire) &
       MP__LOCK_HELD))
    return false;
#if MP__LOCK_OWNER
  atomic_store_explicit(&pool->lock_owner, pthread_self(),
                        memory_order_relaxed);
  atomic_store_explicit(&pool->lock_owned, true, memory_order_release);
#endif
  return true;
}
/* Whether the calling thread holds pool's lock (MP_DEBUG builds; true
 * otherwise, where MP__ASSERT never evaluates it). */
static inline bool mp__pool_held(const mp_pool_t *pool) {
#if MP__LOCK_OWNER
  return atomic_load_explicit(&pool->lock_owned, memory_order_acquire) &&
         pthread_equal(
             atomic_load_explicit(&pool->lock_owner, memory_order_relaxed),
             pthread_self());
#else
  (void)pool;
  return true;
#endif
}
#define MP__ASSERT_LOCKED(pool) MP__ASSERT(mp__pool_held(pool))
static inline void mp__pool_unlock(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
#if MP__LOCK_OWNER
  atomic_store_explicit(&pool->lock_owned, false, memory_order_relaxed);
#endif
  uint32_t v = MP__LOCK_HELD;
  if (MP__UNLIKELY(!atomic_compare_exchange_strong_explicit(
          &pool->lock, &v, 0, memory_order_release, memory_order_relaxed)))
    mp__pool_unlock_contended(pool, v);
}
/* Around a device call that changes what the pool holds: sets inflight and
 * drops the lock; _end retakes it, clears inflight and wakes waiters. */
void mp__pool_device_begin(mp_pool_t *pool);
void mp__pool_device_end(mp_pool_t *pool);
/* Waits until no grow/release is in flight (drops the lock meanwhile). */
void mp__pool_wait_idle(mp_pool_t *pool);
/* mp__pool_wait_idle (sync: mp__pool_wait_sync) for entry point fn, but
 * from a host function (mp__pool_in_host_fn) MP_EBUSY naming fn instead of
 * a wait: the device call in flight may wait for the host function; and
 * no wait in the graph pool's own growth (mp__graph_growing_here: its
 * parent's out-of-memory handler calls fn), MP_OK. */
mp_status_t mp__pool_wait_for(mp_pool_t *pool, const char *fn, bool sync);
/* For entry point fn, which makes device calls and waits (trim,
 * defragment, freeze, pause, resume, set_access): refused before anything
 * changes from a host function (mp__pool_caller_check) and, MP_EBUSY, in
 * the graph pool's own growth (mp__graph_growing_here). */
mp_status_t mp__pool_may_wait(const mp_pool_t *pool, const char *fn);
/* Around a synchronization with the lock dropped: one at a time, after any
 * grow or release in flight; growth does not wait for it. wait_sync waits
 * for the turn (call it before snapshotting stream epochs) and says
 * whether it had to (the lock was dropped: what was checked before may have
 * changed); begin waits too and returns with the lock dropped, end retakes
 * it. */
bool mp__pool_wait_sync(mp_pool_t *pool);
void mp__pool_sync_begin(mp_pool_t *pool);
void mp__pool_sync_end(mp_pool_t *pool);

/* The device's refusal naming fn when the calling thread runs a host
 * function of pool's device (backend.h's caller_check: the host device
 * tells; CUDA leaves it undefined, cuda.h, cuLaunchHostFunc: "The host
 * function must not make any CUDA API calls"), else MP_OK. in_host_fn: the
 * same, as a bool, the thread's last error kept. No wait can be made there
 * either: another thread's device call in flight may be a free that waits
 * for the queued host functions, this one too (cuMemFree "may perform
 * implicit synchronization", cuda.h; the host device's free synchronizes
 * the device). lock.c. */
mp_status_t mp__pool_caller_check(const mp_pool_t *pool, const char *fn);
bool mp__pool_in_host_fn(const mp_pool_t *pool);

/* MP_EBUSY naming fn while the pool is paused (pause.c), else MP_OK. */
static inline mp_status_t mp__pool_paused(const mp_pool_t *pool,
                                          const char *fn) {
  return pool->paused ? mp__fail(MP_EBUSY, "%s: the pool is paused", fn)
                      : MP_OK;
}
/* mp__pool_paused, the lock taken for it (a pool with arenas, before a
 * walk of its arenas each under its own lock). */
static inline mp_status_t mp__pool_paused_now(mp_pool_t *pool, const char *fn) {
  mp__pool_lock(pool);
  mp_status_t st = mp__pool_paused(pool, fn);
  mp__pool_unlock(pool);
  return st;
}

/* Under the lock: how many of virtual segment v's chunks are mapped, the
 * first ones: all while running; paused, those a failed undo left mapped
 * (pause_mapped, pause.c). */
static inline size_t mp__pool_chunks_mapped(const mp_pool_t *pool,
                                            const mp__segment_t *v) {
  return v == NULL ? 0 : pool->paused ? pool->pause_mapped : v->nchunks;
}

/* Nonzero while any state holds that the plain alloc and free paths
 * (pool.c) leave out: streams routed or ranges lent to graph pools, a graph
 * pool itself, paused, exported blocks held, a per-thread stream met, an
 * event history, a release threshold, an arena with a stream marked
 * capturing (routed to a graph pool by its pool: a call that reaches the
 * arena's plain path past solo goes to the arenas' path, pool.c). Kept in
 * pool->rare (under the lock), so that those paths test one word instead
 * of each; whoever changes one of these calls mp__pool_rare_update after
 * (mp_pool_check checks it). */
static inline uint32_t mp__pool_rare_of(const mp_pool_t *pool) {
  return (pool->nroutes | pool->ngranges | pool->nheld) != 0 || pool->graph ||
         pool->paused || pool->has_pt || pool->hist.ev != NULL ||
         pool->cfg.release_threshold != 0 ||
         (pool->arena && pool->ncapturing > 0);
}
static inline void mp__pool_rare_update(mp_pool_t *pool) {
  pool->rare = mp__pool_rare_of(pool);
  pool->cached_off =
      pool->paused || pool->hist.ev != NULL || pool->ncapturing > 0;
}

/* Under the lock: device bytes the pool may still take before its cap,
 * what it reserved and what it staged counted; 0 at or above the cap. */
static inline size_t mp__pool_room(const mp_pool_t *pool) {
  size_t held = pool->st.reserved_bytes + pool->staged;
  return pool->cap > held ? pool->cap - held : 0;
}

/* ---- arena.c: per-thread arenas ----------------------------------------- */
typedef struct mp__arena {
  /* Set once, by the first thread that picks this arena (release, under
   * the pool's lock); read without a lock (acquire). */
  _Atomic(mp_pool_t *) pool;
  /* Its virtual range, reserved before pool is published and kept until
   * the pool is destroyed: [vbase, vbase + vsize); 0, 0: none. */
  uintptr_t vbase;
  size_t vsize;
  /* To 32 bytes: an entry's offset is one shift (24 took an lea and a
   * shift, in each free and allocation). */
  size_t pad;
} mp__arena_t;
/* Arena i of pool, or NULL while no thread has used it. */
static inline mp_pool_t *mp__arena_at(const mp_pool_t *pool, size_t i) {
  return atomic_load_explicit(&pool->arenas[i].pool, memory_order_acquire);
}
/* At create: the table of cfg.arenas empty arenas; with arenas_auto=1
 * (and no history or release threshold), the first arena made runs solo
 * (solo_next). */
mp_status_t mp__arenas_init(mp_pool_t *pool);
/* The pool mp_pool_alloc and mp_pool_free work on (pool->hot). */
static inline mp_pool_t *mp__pool_hot(mp_pool_t *pool) {
  return atomic_load_explicit(&pool->hot, memory_order_acquire);
}
/* The calling thread's number among the threads that ever used arenas,
 * plus 1; 0: it has used none yet (arena.c numbers it at its first
 * allocation). */
extern _Thread_local unsigned mp__arena_thread;
/* The calling thread's thread pointer (gate_owner): one load, where a
 * thread-local's address in a shared library is a call (__tls_get_addr). */
static inline uintptr_t mp__thread_self(void) {
#if defined(__x86_64__) || defined(__aarch64__)
  return (uintptr_t)__builtin_thread_pointer();
#else
  return (uintptr_t)&mp__arena_thread;
#endif
}
/* The pool mp_pool_alloc and mp_pool_free take the arenas' path on from
 * pool (their hot), NULL for hot's plain path (the gate). */
static inline mp_pool_t *mp__pool_gate(mp_pool_t *pool) {
  mp_pool_t *g = atomic_load_explicit(&pool->gate, memory_order_relaxed);
  if (MP__LIKELY(g == NULL) || g == pool) /* a pool with arenas: itself */
    return g;
  return atomic_load_explicit(&pool->gate_owner, memory_order_relaxed) ==
                 mp__thread_self()
             ? NULL
             : g;
}
/* Ends solo for good (no lock needed; any thread, more than once): every
 * call then takes the arenas' path. Once solo ran (or under the pool's
 * lock: mp__arena_solo_never). Inline, as the next ones: lock.c and
 * graph.c call them, and arena.c calls theirs (src/pool's files call in
 * one direction, cmake/layers.py). */
static inline void mp__arena_unsolo(mp_pool_t *pool) {
  mp_pool_t *a = mp__pool_hot(pool);
  if (a == pool)
    return;
  atomic_store_explicit(&a->solo_of, NULL, memory_order_release);
  atomic_store_explicit(&pool->hot, pool, memory_order_release);
}
/* Solo ends in the lane (arena.c, "The lane"): hot stays the solo arena,
 * whose gate sends every thread but the one that made it to the arenas'
 * path. No lock needed; any thread, more than once; a pool that left
 * solo for good (hot is the pool) or is in the lane already stays so. */
static inline void mp__arena_lane(mp_pool_t *pool) {
  mp_pool_t *a = mp__pool_hot(pool);
  /* Acquire: a maker of another arena that finds the lane started by
   * contention publishes its arena after the gate (the lane arena's free
   * of that arena's blocks reads the gate to forward them). */
  if (a == pool ||
      atomic_load_explicit(&a->solo_of, memory_order_acquire) == NULL)
    return;
  atomic_store_explicit(&a->gate, pool, memory_order_release);
  atomic_store_explicit(&a->solo_of, NULL, memory_order_release);
}
/* Ends solo, or keeps it from starting, before any change that the
 * arenas' path sees and the solo arena's plain path would not (a stream
 * routed to a graph pool). Under the pool's lock, which the make of the
 * solo arena holds. */
static inline void mp__arena_solo_never(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  pool->solo_next = false;
  mp__arena_unsolo(pool);
}
/* Contended takes of the solo arena's lock that end solo. A take is contended
 * when another thread holds the lock: a thread that allocates now and then
 * beside the main one (a host function's free, a stats reader) meets it
 * rarely; two threads doing pairs meet it within microseconds. */
#define MP__SOLO_WAITS 64
/* mp__pool_lock_wait on arena a, which runs solo for pool: one contended
 * take more; MP__SOLO_WAITS of them end solo. */
static inline void mp__arena_solo_contended(mp_pool_t *a, mp_pool_t *pool) {
  if (atomic_fetch_add_explicit(&a->solo_waits, 1, memory_order_relaxed) + 1 >=
      MP__SOLO_WAITS)
    mp__arena_lane(pool);
}
/* mp_pool_alloc's plain path failed with st on arena a (solo: the only way
 * that path runs on an arena), a's lock dropped: the arenas' out-of-memory
 * path from there (the cap's share, the pool's handler, the retries), as
 * the arenas' path would have taken. */
mp_status_t mp__arena_solo_failed(mp_pool_t *a, size_t bytes, mp_stream_t s,
                                  void **out, mp_status_t st);
/* mp_pool_check on a pool with arenas, beyond each arena's own check
 * (no lock held): under the pool's lock, no arena above its share of the
 * cap, and the shares within the cap. */
mp_status_t mp__arena_check(mp_pool_t *pool);
/* The calling thread's arena in pool: its number mod the arena count;
 * none for a thread without a number. No division while the number is
 * below the count, the case of a thread with an arena of its own. The
 * number is read as mp__arena_thread - 1, unsigned: a thread without one
 * reads UINT_MAX, which no arena count reaches (MP_POOL_MAX_ARENAS), so
 * one compare finds the common case (testing for 0 first cost 2
 * instructions a call more). */
static inline size_t mp__arena_index_of(const mp_pool_t *pool, unsigned thread,
                                        size_t none) {
  size_t k = thread - 1u, n = pool->cfg.arenas;
  return MP__LIKELY(k < n) ? k : k == UINT_MAX ? none : k % n;
}
/* The calling thread's arena in the pool whose serial is serial (the last
 * pool with arenas the thread used; arena.c): one compare instead of the
 * number, the table and the arena's load (8 instructions a call with
 * arenas=1, count_pairs.sh). */
typedef struct mp__arena_memo {
  uint64_t serial;
  mp_pool_t *arena;
} mp__arena_memo_t;
extern _Thread_local mp__arena_memo_t mp__arena_memo;
/* mp__arena_mine_memo's miss: the thread's arena by its number, NULL where
 * it has none yet; the memo keeps one made. */
mp_pool_t *mp__arena_memo_miss(mp_pool_t *pool);
/* The calling thread's arena in pool (which has arenas), NULL where it
 * has none yet. */
static inline mp_pool_t *mp__arena_mine_memo(mp_pool_t *pool) {
  if (MP__LIKELY(mp__arena_memo.serial == pool->serial))
    return mp__arena_memo.arena;
  return mp__arena_memo_miss(pool);
}
/* mp__arena_index_of the calling thread's number. */
static inline size_t mp__arena_index(const mp_pool_t *pool, size_t none) {
  return mp__arena_index_of(pool, mp__arena_thread, none);
}
/* mp__arena_index, arena 0 for a thread without a number. */
static inline size_t mp__arena_mine(const mp_pool_t *pool) {
  return mp__arena_index(pool, 0);
}
/* mp__arena_owner's other half: every arena but mine, by virtual range,
 * then each arena's live map (under its lock) for plain segments. */
mp_pool_t *mp__arena_owner_slow(mp_pool_t *pool, uintptr_t p, size_t mine);
/* Arena i of pool where its virtual range holds p, NULL otherwise (not
 * made yet, or on plain segments). No lock held; the range is read after
 * the arena itself (published with release). */
static inline mp_pool_t *mp__arena_holding(mp_pool_t *pool, size_t i,
                                           uintptr_t p) {
  /* Its range through e, taken before the acquire: pool->arenas is not
   * read again after it. */
  const mp__arena_t *e = &pool->arenas[i];
  mp_pool_t *a = mp__arena_at(pool, i);
  return MP__LIKELY(a != NULL && p - e->vbase < e->vsize) ? a : NULL;
}
/* The arena whose memory holds ptr (the calling thread's first, inline: a
 * thread freeing what it allocated), or NULL. No lock held. */
static inline mp_pool_t *mp__arena_owner(mp_pool_t *pool, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  size_t i = mp__arena_mine(pool);
  mp_pool_t *a = mp__arena_holding(pool, i, p);
  return MP__LIKELY(a != NULL) ? a : mp__arena_owner_slow(pool, p, i);
}
/* The upstream of a graph pool of a pool with arenas (mp__upstream_t): the
 * calling thread's arena lends the range (or an idle arena's cache, or the
 * arenas' out-of-memory path), and keeps it in its table of ranges. */
mp_status_t mp__arena_graph_borrow(mp_pool_t *graph, size_t *bytes,
                                   mp_stream_t s, void **out);
/* mp_pool_trim / mp_pool_add_stream on a pool with arenas (no lock held). */
mp_status_t mp__arena_trim(mp_pool_t *pool, size_t keep_bytes);
mp_status_t mp__arena_add_stream(mp_pool_t *pool, mp_stream_t s);
/* The same with pool's lock held (mp_host_pool_alloc makes a slot under
 * the hold that found it missing); also for a pool without arenas. */
mp_status_t mp__arena_add_stream_locked(mp_pool_t *pool, mp_stream_t s);
/* Under the pool's lock, after mp_pool_set_max_fraction set its cap: every
 * arena made takes the new cap (uncapped) or gives its share back
 * (capped), so that each asks for a share of the new cap at its next
 * growth. */
void mp__arena_recap(mp_pool_t *pool);
/* What a caller that marks its block (a handle, a child pool's range, a
 * graph pool's range) does with it: run under the lock of the arena the
 * block became live in (a), before that lock is dropped, so that no other
 * thread meets the block unmarked (a stale raw pointer freed it, and a
 * NULL record was marked). A claim that fails gives the block back. */
typedef mp_status_t (*mp__arena_claim_t)(mp_pool_t *a, void *const *out,
                                         void *ctx);
/* An allocation of bytes on s in a pool with arenas through the whole
 * path (the calling thread's arena, a loan of an idle arena, the
 * out-of-memory path), claimed by claim(ctx) unless NULL; *owner: the
 * arena holding it. No lock held. */
mp_status_t mp__arena_alloc_any(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                void **out, mp_pool_t **owner,
                                mp__arena_claim_t claim, void *ctx);
/* mp_pool_alloc_contiguous on a pool with arenas (no lock held): in the
 * calling thread's arena, with the arenas' out-of-memory path. */
mp_status_t mp__arena_alloc_contiguous(mp_pool_t *pool, size_t count,
                                       const size_t *sizes, mp_stream_t s,
                                       void **out);

/* ---- contiguous.c: mp_pool_alloc_contiguous's pieces -------------------- */
/* *total: the sizes rounded as the pool rounds, summed; false (and
 * SIZE_MAX) when a size cannot be rounded or the sum wraps. */
bool mp__pool_pieces_total(const mp_pool_t *pool, size_t count,
                           const size_t *sizes, size_t *total);
/* mp_pool_alloc_contiguous past its checks of the arguments, on a pool
 * without arenas (or an arena): takes the lock, routes a graph pool's
 * stream there, and cuts one block into the pieces. */
mp_status_t mp__pool_alloc_pieces(mp_pool_t *pool, size_t count,
                                  const size_t *sizes, mp_stream_t s,
                                  void **out);

/* ---- pause.c ------------------------------------------------------------ */
/* Destroy: frees what a paused pool holds beside its reservation. */
void mp__pool_pause_release(mp_pool_t *pool);

/* ---- graph.c: graph-private pools -------------------------------------- */
typedef struct mp__route {
  mp_stream_t s;
  uint64_t owner; /* mp__stream_owner: the per-thread stream's thread */
  mp_pool_t *graph;
} mp__route_t;
typedef struct mp__grange {
  uintptr_t base;
  size_t size;
  mp_pool_t *graph;
} mp__grange_t;
/* How a graph pool grows: it borrows *bytes of its parent on stream s
 * (called with the graph pool's lock dropped, inflight); on MP_OK *bytes
 * is what the range holds, more when the parent lent a block whole. */
typedef mp_status_t (*mp__upstream_t)(mp_pool_t *graph, size_t *bytes,
                                      mp_stream_t s, void **out);
/* mp_pool_graph_create, the graph pool growing through upstream (pool.c
 * chooses: NULL, graph.c's own borrowing under the parent's lock, or
 * arena.c's for a parent with arenas). */
mp_status_t mp__graph_create(mp_pool_t *parent, mp__upstream_t upstream,
                             mp_pool_t **out);
/* Whether pool is a graph pool whose growth the calling thread runs, now
 * borrowing from its parent (inflight, nothing of pool changed yet): its
 * parent's out-of-memory handler runs inside that growth, where a call
 * that waits for pool's growth to end would wait for itself. */
bool mp__graph_growing_here(const mp_pool_t *pool);
/* That graph pool (NULL: none), set by graph.c around the borrowing; in
 * lock.c, whose waits read it. */
extern _Thread_local const mp_pool_t *mp__graph_growing;
/* Under lender's lock (the parent, or the arena of a parent with arenas
 * that allocated it): its live block at *out becomes graph's range, in
 * lender's table of ranges, so that frees through it reach graph; *bytes:
 * the block's size (at least what was asked). Without host memory for the
 * table the block goes back: MP__EHOST. */
mp_status_t mp__graph_lend(mp_pool_t *lender, mp_pool_t *graph,
                           void *const *out, size_t *bytes);
/* No lock held: room for one more range in the table of every arena of
 * parent made so far (each under its own lock), taken before a graph
 * pool's range is borrowed on the arenas' path (the calling thread's arena
 * made first), so that the arena that makes it live lends it without
 * allocating: host memory running out refuses the borrow before anything
 * is taken, and changes nothing. MP__EHOST (said) when there is none. */
mp_status_t mp__graph_lend_rooms(mp_pool_t *parent);
/* Under parent's lock: the graph pool stream s (the calling thread's, for
 * a per-thread stream) allocates to, or NULL. */
mp_pool_t *mp__graph_route(const mp_pool_t *parent, mp_stream_t s);
/* mp_pool_graph_begin, telling which thread's stream s was routed
 * (*owner: mp__stream_owner there, 0 but for the per-thread handle). */
mp_status_t mp__graph_begin_owned(mp_pool_t *parent, mp_pool_t *graph,
                                  mp_stream_t s, uint64_t *owner);
/* mp_pool_graph_end of the route of s as owner's stream, from any thread
 * (mp_pool_graph_end ends the calling thread's per-thread stream). */
mp_status_t mp__graph_end_owned(mp_pool_t *parent, mp_stream_t s,
                                uint64_t owner);
/* Whether s as owner's stream still allocates to a graph pool of parent
 * (a per-thread stream's route goes when its thread exits, stream.c). */
bool mp__graph_routed_owned(mp_pool_t *parent, mp_stream_t s, uint64_t owner);
/* Names graph by (first, second) in its snapshot (torch.c: the MempoolId_t
 * PyTorch gave it, as PyTorch's snapshot names a private pool's segments).
 * Not (0, 0), the id of a pool's own segments: MP_EINVAL. */
mp_status_t mp__graph_set_id(mp_pool_t *graph, uint64_t first, uint64_t second);
/* Under parent's lock: the range lent to a graph pool that holds p, or
 * NULL (a walk of the ranges; mp__graph_owner asks the live map first). */
static inline const mp__grange_t *mp__grange_of(const mp_pool_t *parent,
                                                uintptr_t p) {
  for (size_t i = 0; i < parent->ngranges; i++) {
    const mp__grange_t *r = &parent->granges[i];
    if (p >= r->base && p - r->base < r->size)
      return r;
  }
  return NULL;
}
/* Under parent's lock: the graph pool whose range holds p, or NULL. */
mp_pool_t *mp__graph_owner(const mp_pool_t *parent, uintptr_t p);
/* Under graph's lock: whether it is released and empty, its last block
 * gone; true for one caller only, which then calls mp__graph_finish_if with
 * the lock dropped: the ranges go back to the parent and the pool is freed.
 * Deciding under the lock of the free that emptied it keeps two frees (or a
 * free and the release) from both finishing it. */
bool mp__graph_take_last(mp_pool_t *graph);
void mp__graph_finish_if(mp_pool_t *graph, bool last);
/* mp_pool_graph_release without its history mark: for mp_pool_destroy of a
 * graph pool, whose own mark (its caller's) the events keep. */
mp_status_t mp__graph_release(mp_pool_t *graph);
/* Under graph's lock, around an allocation in a graph pool, which may drop
 * the lock (growth, the out-of-memory handler, the nap for pending blocks,
 * a synchronize): while one is inside, a free that empties a released pool
 * does not finish it, and the last allocation out does instead. _leave
 * returns mp__graph_take_last's answer, for mp__graph_finish_if once the
 * lock is dropped. They also scope, on the calling thread, whether the
 * allocation asked the parent's out-of-memory handler (mp__graph_ask):
 * _enter returns the enclosing allocation's answer (one made inside a
 * handler) and starts this one's at false; _leave restores outer. */
bool mp__graph_enter(mp_pool_t *graph);
bool mp__graph_leave(mp_pool_t *graph, bool outer);
/* Under a graph pool's lock, which it drops: fn's refusal of a new block
 * in graph, released (mp_pool_graph_release): a new block would borrow
 * from the parent for a graph that is gone. Every allocation into a graph
 * pool (mp_pool_alloc, mp_pool_alloc_contiguous) refuses so before
 * mp__graph_enter. */
mp_status_t mp__graph_refuse_released(mp_pool_t *graph, const char *fn);
/* The same for the retry an out-of-memory handler asked for after it
 * released the graph pool: MP_EINVAL, the lock kept. */
mp_status_t mp__graph_refuse_retry(const mp_pool_t *graph, const char *fn);
/* In a graph pool's growth, its range refused by the parent with st: true
 * (and from then false) the first time in the allocation this thread is in
 * (mp__graph_enter) that st is out of memory, when the parent's handler may
 * be asked; false after, so that one allocation asks it at most once
 * however many times its ladder (each growth rung, the graph pool's own
 * retry) borrows. */
bool mp__graph_ask(mp_status_t st);
/* Before a graph pool's growth borrows from the parent: whether an out of
 * memory of the parent's counted already in the allocation this thread is
 * in (mp__graph_ask answered it; a retry that served would have ended the
 * ladder), so that this borrow's failure counts nothing (mp__oom_quiet). */
bool mp__graph_counted(void);
/* [segment] On around a graph pool's borrow of a whole segment when a
 * range of the request's own size would do: the borrow is a try, whose
 * refusal counts nothing and asks no handler (mp__graph_counted is true,
 * mp__graph_ask false); the request's size is borrowed next. */
extern _Thread_local bool mp__segment_trying;
/* ---- export.c: IPC exports and their leases ------------------------------ */
/* A free of exported b (lock held): true when b is still imported
 * elsewhere and is now held instead of freed. Polls b's leases only and
 * never drops the lock; the caller reaps the others (mp__export_reap)
 * once b is settled. */
bool mp__export_hold(mp_pool_t *pool, mp__block_t *b);
/* Closes the leases whose importers have let go (one poll each) and
 * releases held blocks left with none. */
void mp__export_reap(mp_pool_t *pool);
/* The lease records whose importers still hold them (one poll each), what
 * pool->nexports would be after mp__export_reap; changes nothing (lock
 * held), for a check that must refuse before the reap (pause.c). */
size_t mp__export_open(const mp_pool_t *pool);
/* Destroy's check (lock held), after a poll of every lease: MP_EBUSY, with
 * a message naming the block, while a block of a plain segment is still
 * imported elsewhere (its memory may not be freed before the importer
 * closes it); MP_OK otherwise. */
mp_status_t mp__export_destroy_busy(mp_pool_t *pool);
/* mp_pool_ipc_export and mp_pool_ipc_poll past their checks of the
 * arguments, on a pool without arenas (or an arena; pool.c sends each
 * call to the arena holding the block, or to every arena). */
mp_status_t mp__export_block(mp_pool_t *pool, void *ptr, mp_ipc_handle_t *out);
mp_status_t mp__export_poll(mp_pool_t *pool, size_t *held);
/* Destroy: closes every lease. */
void mp__export_release_all(mp_pool_t *pool);
/* Exports again after a destroy refused once it had sealed them
 * (pool->export_sealed); takes the lock. */
void mp__export_unseal(mp_pool_t *pool);
/* mp_pool_check: every record names a live exported block, every exported
 * block has a record, nheld counts the held ones. */
mp_status_t mp__export_check(const mp_pool_t *pool);

/* ---- handle.c: movable-block handles ------------------------------------ */
/* Under the lock: b's handle (every copy) is stale from now on. */
void mp__handle_retire(mp_pool_t *pool, mp__block_t *b);
/* Under the lock, at destroy: retires the handle of every live movable
 * block. */
void mp__handle_retire_all(mp_pool_t *pool);

/* ---- core.c: the allocation core --------------------------------------- */
/* bytes rounded up to the pool's align in *out; false on overflow. The
 * one rounding of the pool, inline for the layers below core.c (history.c)
 * that may not call into it. */
static inline bool mp__pool_align_up(const mp_pool_t *pool, size_t bytes,
                                     size_t *out) {
  size_t up;
  /* The overflow check is the add's carry: no separate compare. */
  if (__builtin_add_overflow(bytes, pool->align_add, &up))
    return false;
  *out = up & pool->align_mask;
  return true;
}
/* [defrag] Rounds bytes up to the pool's align; false on overflow
 * (mp__pool_align_up, out of line). */
bool mp__pool_round(const mp_pool_t *pool, size_t bytes, size_t *out);
/* The stream a take for every stream (sidx UINT32_MAX: a graph pool's
 * borrowing, mp__pool_alloc_locked_done) is for: the ladder's
 * defragmentation moves blocks on it. Set by the caller of the take. */
extern _Thread_local mp_stream_t mp__take_stream;
/* Best fit for `size` (rounded) usable on stream sidx (UINT32_MAX: on
 * every stream), through the whole out-of-memory ladder (drops and
 * retakes the lock). On MP_OK *out is a block of at least `size` bytes,
 * out of the index, not yet live.
 * *laddered: the first look found nothing and the ladder ran (it may have
 * dropped the lock); false, the lock was held throughout, and then the
 * caller must make the block live under this hold of the lock, never put
 * it back (mp__block_split_low gave it a record without its deps). */
mp_status_t mp__pool_take(mp_pool_t *pool, size_t size, uint32_t sidx,
                          mp__block_t **out, bool *laddered);
/* The cache's answer alone: the best fit for `size` usable on sidx, taken
 * (as mp__pool_take's first look), or false: no ladder, no growth, no
 * wait, nothing counted (an arena asking its siblings, arena.c).
 * live_next: the caller makes the block live under this hold of the lock,
 * never puts it back (as mp__pool_take without the ladder); false: it may
 * (mp__block_untake), so the block keeps its record, deps and all. */
bool mp__pool_take_cached(mp_pool_t *pool, size_t size, uint32_t sidx,
                          mp__block_t **out, bool live_next);
/* Puts a taken, never-live block back. */
void mp__block_untake(mp_pool_t *pool, mp__block_t *b);
/* Counts an out-of-memory failure of a request of `asked` bytes and
 * returns st (MP_ENOMEM or MP_ELIMIT) with a message naming the figures. */
mp_status_t mp__pool_oom(mp_pool_t *pool, mp_status_t st, size_t asked,
                         uintptr_t hs);
/* What an out-of-memory message adds where pausable=1 (MP_POOL_PAUSABLE)
 * turned down the plain segment a request of `asked` bytes would have
 * taken: an MP_ENOMEM where pool's virtual range is full (no hole nor its
 * top holds the request; pool's lock held, and for a pool with arenas the
 * arena's, as the pool has no range of its own), an MP_ELIMIT where the
 * request fitted in room, the bytes left under the cap, or an MP_ENOMEM
 * where the range could not be reserved: why; else "". */
const char *mp__pausable_note(const mp_pool_t *pool, mp_status_t st,
                              size_t asked, size_t room);
/* The calling thread's count of mp__pool_oom calls: an MP_ENOMEM that did
 * not move it is host memory running out, not the device (arena.c asks,
 * where other threads move the pools' own counts meanwhile). */
extern _Thread_local uint64_t mp__oom_seen;
/* Set by the calling thread around a graph pool's borrow whose allocation
 * had a failure of the parent's counted already (mp__graph_counted): an
 * out of memory of the parent's is then a failure like any other
 * (message, mp__oom_seen, mp__pool_oom_last) but counts nothing, neither
 * in oom_count nor as an oom event, and no retry takes a count back: one
 * failed allocation counts once. */
extern _Thread_local bool mp__oom_quiet;
/* Under the lock, after an allocation of bytes failed with st: calls the
 * pool's out-of-memory handler (lock dropped) if one is set and the
 * failure was the pool's out of memory (mp__pool_oom, the thread's last
 * failure; not host memory); true: the caller tries once more, and the
 * failure no longer counts in oom_count (the retry's counts, if it
 * fails). */
bool mp__pool_oom_retry(mp_pool_t *pool, mp_status_t st, size_t bytes);
/* Whether the calling thread's last failure (mp__error_serial) is an out
 * of memory mp__pool_oom counted in pool: an MP_ENOMEM that is not is host
 * memory running out. Told per failure, not by pool's oom_count, which
 * other threads and an out-of-memory handler's own allocations move. */
bool mp__pool_oom_last(const mp_pool_t *pool);
/* The calling thread's last error as it was before the latest failure
 * mp__pool_oom wrote (while mp__pool_oom_last says that failure is still
 * the last): what an allocation a later rung serves gives back (status.h:
 * a success does not replace it). */
void mp__pool_oom_before(mp__error_saved_t *out);
/* Makes that error the last again: the failure was served after all. */
void mp__pool_oom_give_back(void);
/* No lock held: pool's out-of-memory handler fn(pool, bytes, st, ctx), or 0
 * without calling it while a handler runs on this thread (one that
 * allocates, and answers retry whatever happens, would recurse for ever:
 * its own allocations that run out fail at once). */
int mp__oom_call(mp_pool_t *pool, mp_pool_oom_handler_t fn, size_t bytes,
                 mp_status_t st, void *ctx);
/* Why ptr is not a live block for a caller's fn (b: the map's block at
 * ptr, or NULL): the failure, with a message naming what is wrong with it.
 * mp__pool_find_live's slow half (inline below the live map's). fwd (a
 * free): in an arena, a pointer outside its segments is MP__EFORWARD, with
 * no message: another arena's, maybe (pool.c, mp__pool_free_forward). */
mp_status_t mp__pool_find_live_why(mp_pool_t *pool, const char *fn, void *ptr,
                                   bool movable_ok, bool fwd,
                                   const mp__block_t *b);
/* Makes a taken block live: map, stats, stream, history (plain: the pool
 * has no history, as where pool->rare is 0, or in an arena). */
void mp__block_make_live(mp_pool_t *pool, mp__block_t *b, size_t requested,
                         uint32_t sidx, bool plain);
/* [defrag] Frees a live block (already removed from the map): deps, stats,
 * coalescing, back into the index. */
void mp__block_release(mp_pool_t *pool, mp__block_t *b);
/* mp__block_release but the last step: returns the block (b merged with
 * its free neighbours) for the caller to insert in the index. mp_pool_free
 * inserts it with the inline mp__index_insert_hot, the other callers
 * through mp__block_release, so the insert's code is copied once. plain:
 * pool->rare is 0 (no history to record the free in). */
mp__block_t *mp__block_release_merged(mp_pool_t *pool, mp__block_t *b,
                                      bool plain);
/* mp__block_release of a block whose uses name streams it never ran on (a
 * graph pool's range given back: every stream the lender knows, graph.c):
 * merged through mp__block_coalesce_apart. */
void mp__block_release_apart(mp_pool_t *pool, mp__block_t *b);
/* A pool's host structures with cfg (no checks; the caller fills in cap and
 * memory). */
mp_status_t mp__pool_new(mp_device_t *dev, const mp_pool_config_t *cfg,
                         mp_pool_t **out);
/* A pool serial no pool had (never 0): mp__pool_new's, and a pool's new
 * one where the arenas its threads' memos name went (mp_pool_destroy). */
uint64_t mp__pool_serial_new(void);
/* Frees a pool's host structures (it holds no memory any more). */
void mp__pool_free_host(mp_pool_t *pool);

/* ---- recorded.c --------------------------------------------------------- */
/* mp_pool_alloc(pool, bytes, own) and mp_pool_record_stream of s on the
 * block, in one hold of the lock where the pool's plain path serves it
 * (else the two calls). A record refused gives the block back (*out
 * unchanged). *who names the call that refused ("mp_pool_alloc" or
 * "mp_pool_record_stream"), whose message the failure carries. */
mp_status_t mp__pool_alloc_used(mp_pool_t *pool, size_t bytes, mp_stream_t own,
                                mp_stream_t s, void **out, const char **who);

/* ---- alloc.c ------------------------------------------------------------ */
/* mp_pool_alloc under the lock the caller holds; _hot is the same, inline
 * (mp_pool_alloc's first try: a call's frame costs some 20 instructions a
 * pair), and with plain (pool->rare is 0) leaves out what only a rare
 * state needs (mp__pool_rare_of). */
mp_status_t mp__pool_alloc_locked(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out);
mp_status_t mp__pool_alloc_locked_hot(mp_pool_t *pool, size_t bytes,
                                      mp_stream_t s, void **out, bool plain);
/* mp__pool_alloc_locked of a block no work queued so far uses, on any
 * stream, s included (searched for as stream UINT32_MAX; the block is s's
 * once live): a graph pool's range, which a replay launched on another
 * stream uses after nothing queued before the capture. */
mp_status_t mp__pool_alloc_locked_done(mp_pool_t *pool, size_t bytes,
                                       mp_stream_t s, void **out);
/* Under the lock, in an arena: an allocation the arena's cache serves as
 * it is, or MP__EMISS with no message (paused, an event history, a
 * stream it cannot take, no free block that fits and is usable on s
 * now): no ladder, no growth, no wait, no failure counted. lend: for
 * another arena's thread (arena.c); a stream
 * the pool does not know then gets a slot only once a block serves it (one
 * whose work is done on every stream: searched for as stream UINT32_MAX,
 * so with MP_POOL_STREAM_WAITS no wait is made for it), and a miss adds no
 * stream (its search may still close and poll epochs, as any search). */
mp_status_t mp__pool_alloc_cached(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out, bool lend);
/* The same where it answered MP__EOFF: MP__EMISS when paused, with an
 * event history, or for a stream marked capturing (a graph pool's: pool.c
 * routes it); any other stream is served as the cache would, as a pool
 * without arenas serves it during a capture. */
mp_status_t mp__pool_alloc_cached_off(mp_pool_t *pool, size_t bytes,
                                      mp_stream_t s, void **out);
/* The same in an arena with an event history, which records the
 * allocation (MP__EMISS only when paused, or as above); any: only a block
 * whose work is done on every stream, s's own included (a graph pool's
 * range, mp__pool_alloc_locked_done). */
mp_status_t mp__pool_alloc_cached_rec(mp_pool_t *pool, size_t bytes,
                                      mp_stream_t s, void **out, bool lend,
                                      bool any);
/* The calling thread's arena in pool (no lock held): the thread numbered
 * and the arena made on first use. */
mp_status_t mp__arena_mine_made(mp_pool_t *pool, mp_pool_t **out);
/* mp_pool_alloc on a pool with arenas, past what the calling thread's
 * arena a caches (mp_pool_alloc asked that, inline): a block an idle arena
 * lends (mp__arena_borrow), a's own ladder, and out of memory there,
 * mp__arena_alloc_slow. No lock held. MP__EHOST when host memory ran out
 * (mp__status_out for a caller). */
mp_status_t mp__arena_alloc_miss(mp_pool_t *pool, mp_pool_t *a, size_t bytes,
                                 mp_stream_t s, void **out);
/* mp__pool_take for fn, answering MP_EBUSY (with nothing taken) when the
 * pool was paused while the ladder had the lock dropped; *laddered as
 * mp__pool_take's. */
mp_status_t mp__pool_take_unpaused(mp_pool_t *pool, size_t size, uint32_t sidx,
                                   mp__block_t **out, const char *fn,
                                   bool *laddered);

/* ---- defrag.c ----------------------------------------------------------- */
/* Out-of-memory rung (core.c's ladder): moves movable blocks so that a free
 * block of at least `need` bytes forms. Called without the lock. Returns
 * bytes moved. */
size_t mp__defrag_on_oom(mp_pool_t *pool, size_t need, mp_stream_t s);
/* No lock held: frees again the staging buffers the device refused to free
 * at the end of a defragmentation (kept, booked against the cap); MP_OK
 * when none is left or a stream of the pool is captured (they wait), else
 * the device's refusal (the rest stay kept). At
 * every defragmentation, trim, pause and destroy (which fails with the
 * refusal, the pool as it was). */
mp_status_t mp__defrag_stage_retry(mp_pool_t *pool);
/* mp__defrag_stage_retry whose refusal is ignored (the next call tries
 * again): the caller's last error stays as it was, for a call that may
 * still succeed (status.h: a success does not replace it). */
void mp__defrag_stage_retry_quiet(mp_pool_t *pool);

/* ---- child.c ------------------------------------------------------------ */
/* Destroy of a child pool: its range back to the parent, its segment record
 * freed (the caller then frees the pool's host structures). */
void mp__child_release(mp_pool_t *pool);

/* ---- pool.c ------------------------------------------------------------- */
/* The live block holding ptr (its start or inside it), through graph
 * pools: its start and size. Takes the lock; false when none is live
 * there. */
bool mp__pool_block_of(mp_pool_t *pool, const void *ptr, void **base,
                       size_t *size);
/* The device allocation holding the live block at ptr (PyTorch's
 * getBaseAllocation, whose base PyTorch exports with cudaIpcGetMemHandle):
 * in a plain segment, the segment's start and size; in the virtual range,
 * whose chunks no IPC handle of PyTorch's can name, the block's
 * (mp__pool_block_of). False when no block is live there. */
bool mp__pool_base_of(mp_pool_t *pool, const void *ptr, void **base,
                      size_t *size);
/* mp_pool_free of ptr, with s recorded as a use first (mp_free_async): one
 * locked step, so a pointer it refuses leaves no use behind. fn names the
 * caller in messages. */
mp_status_t mp__pool_free_on(mp_pool_t *pool, void *ptr, mp_stream_t s,
                             const char *fn);
/* mp_pool_free of ptr, fn naming the caller in messages (mp_free). */
mp_status_t mp__pool_free_named(mp_pool_t *pool, void *ptr, const char *fn);
/* For the library's own entry points over the pools (the allocator
 * interface, PyTorch's hooks, mp_malloc and its kin), which mark their
 * caller first (MP__HIST_ENTRY), so that the events' stacks start at the
 * user's code, not at the wrapper: mp_pool_alloc, mp_pool_free and
 * mp_pool_trim without their own mark (their messages name them). */
mp_status_t mp__pool_alloc_marked(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out);
mp_status_t mp__pool_free_marked(mp_pool_t *pool, void *ptr);
mp_status_t mp__pool_trim_marked(mp_pool_t *pool, size_t keep_bytes);
/* mp_pool_create_child without its own mark (the allocator interface's
 * "child", child.c). */
mp_status_t mp__pool_create_child_marked(mp_pool_t *parent, size_t bytes,
                                         mp_pool_t **out);
/* mp_pool_free for a caller that has synchronized every stream the block
 * was used on (the device, or each one it recorded): its recorded uses are
 * dropped, so the block is reusable at once on its own stream, and by the
 * others once that stream reaches the free. The shim's cudaFreeHost, which
 * synchronizes the devices first (src/preload/host.c). */
mp_status_t mp__pool_free_done(mp_pool_t *pool, void *ptr, const char *fn);

/* ---- index.c: size classes, bitmaps, class treaps ----------------------- */
void mp__class_of(const mp_pool_t *pool, size_t size, unsigned *fl,
                  unsigned *sl);
/* [defrag] Adds/removes a free block to/from its class. */
void mp__index_insert(mp_pool_t *pool, mp__block_t *b);
void mp__index_remove(mp_pool_t *pool, mp__block_t *b);
/* The same, inline (MP__HOT) in unity builds: for the take's remove and
 * mp_pool_free's insert only (together 27 and 23 instructions per pair
 * less at 100 and 10 000 live blocks, for 6 KB of code). */
void mp__index_insert_hot(mp_pool_t *pool, mp__block_t *b);
/* mp__index_insert_hot for a block whose MP__B_FREE its caller set, with
 * its size and address given (the split's rest: no second flag store, no
 * reload of what the caller just wrote). */
void mp__index_link_hot(mp_pool_t *pool, mp__block_t *b, size_t size,
                        uintptr_t addr);
/* b must be in the index (MP__B_FREE set): its class is read unchecked,
 * and MP__B_FREE is left set (the take and the coalesce replace the flags
 * or insert b again). mp__index_remove takes any record, and one not
 * indexed changes nothing; it clears MP__B_FREE. */
void mp__index_remove_hot(mp_pool_t *pool, mp__block_t *b);
/* mp__index_remove_hot with the link that points at b given (at, from
 * mp__index_best_fit_hot, the index unchanged since): no descent. The
 * take after the search: the best fit's descent passed that link already
 * (357.5 / 329.2 -> 356.7 / 318.6 instructions per pair at 100 / 10 000
 * live, where the removal descended again from the class's root). */
void mp__index_remove_at(mp_pool_t *pool, mp__block_t *b,
                         mp__block_t *const *at);
/* Smallest free block of >= size, lowest address on ties; NULL if none. */
mp__block_t *mp__index_best_fit(const mp_pool_t *pool, size_t size);
/* The same for the free+alloc path's search, with in *at the link that
 * points at the block returned (set only then: mp__index_remove_at).
 * MP__HOT: inlined there in unity builds; other callers take the
 * out-of-line copy. Insert and remove are inlined at two places only, the
 * take's remove and mp_pool_free's insert (their _hot forms): inlined into
 * their dozen call sites they grew the library's code by 45 KB. */
mp__block_t *mp__index_best_fit_hot(const mp_pool_t *pool, size_t size,
                                    mp__block_t *const **at);
/* The next free block after b in (size, address) order; NULL at the end. */
mp__block_t *mp__index_next(const mp_pool_t *pool, const mp__block_t *b);
/* The largest free block; NULL if none. */
mp__block_t *mp__index_largest(const mp_pool_t *pool);
/* Whether p names one of pool's block records (mp__rec_owned): the index
 * follows no link it does not vouch for when it checks itself. */
typedef bool (*mp__rec_owned_fn)(const mp_pool_t *pool, const void *p);
/* True when b is in its class's treap. */
bool mp__index_contains(const mp_pool_t *pool, const mp__block_t *b,
                        mp__rec_owned_fn owned);
/* Walks a class treap checking its links (records of this pool), order,
 * heap priority and classes; counts nodes. */
bool mp__index_check_class(const mp_pool_t *pool, unsigned fl, unsigned sl,
                           mp__rec_owned_fn owned, size_t *count,
                           size_t *bytes);

/* ---- block.c: records, live map, split, coalesce ------------------------ */
/* Puts a new slab of records on the free list; false: out of host memory. */
bool mp__rec_refill(mp_pool_t *pool);
/* Whether p names a record in one of pool's slabs (for mp_pool_check, before
 * it follows a free index link: a binary search of the slabs). */
bool mp__rec_owned(const mp_pool_t *pool, const void *p);
/* A record off the free list with whatever it held (the caller sets every
 * field), or NULL without host memory. Inline: a split on every other
 * allocation takes one, and the free list almost always has it. */
static inline mp__block_t *mp__rec_pop(mp_pool_t *pool) {
  if (MP__UNLIKELY(pool->rec_free == NULL) && !mp__rec_refill(pool))
    return NULL;
  mp__block_t *b = pool->rec_free;
  pool->rec_free = b->next_rec;
  return b;
}
/* A zeroed record, or NULL without host memory. */
static inline mp__block_t *mp__rec_new(mp_pool_t *pool) {
  mp__block_t *b = mp__rec_pop(pool);
  if (b != NULL)
    memset(b, 0, sizeof *b);
  return b;
}
void mp__rec_free(mp_pool_t *pool, mp__block_t *b);
/* n fresh records chained by next_rec (taken with mp__recs_pop), so that
 * work needing several cannot fail halfway; NULL (none kept) when host
 * memory runs out. */
mp__block_t *mp__recs_new(mp_pool_t *pool, size_t n);
/* Gives back what is left of a chain. */
void mp__recs_free(mp_pool_t *pool, mp__block_t *chain);
/* The next record of a chain, as mp__rec_new gives it (zeroed). */
static inline mp__block_t *mp__recs_pop(mp__block_t **chain) {
  mp__block_t *b = *chain;
  *chain = b->next_rec;
  b->next_rec = NULL;
  return b;
}
void mp__rec_release_all(mp_pool_t *pool);
/* [defrag] The live block starting at addr, or NULL. */
mp__block_t *mp__map_find(const mp_pool_t *pool, uintptr_t addr);
/* Makes room for n more entries, so that the next n inserts cannot fail. */
bool mp__map_reserve(mp_pool_t *pool, size_t n);
/* A new pool's map, before its first entry (map_cap 0): a shared table of
 * two empty slots, read-only, which every address's home (map_shift 63)
 * falls in, so that a probe needs no test of map_cap. Never written (an
 * entry is only added after mp__map_reserve) nor freed. */
void mp__map_init(mp_pool_t *pool);
/* The live map's load is at most 1 / MP__MAP_LOAD (mp__map_reserve's rule),
 * so that probe runs stay short. An eighth, not a quarter: the free's
 * backward-shift removal and the allocation's put walk fewer occupied
 * slots (363.9 / 339.5 -> 359.9 / 337.0 instructions per pair at 100 /
 * 10 000 live; a sixteenth gave 358.2 / 335.7 for twice the memory
 * again), for about 1.8 times the table's host memory (16 bytes a slot:
 * 2.4 MB at 10 000 live blocks, 1.3 MB before). */
#define MP__MAP_LOAD 8
/* Whether n more entries fit without growing the map. */
static inline bool mp__map_has_room(const mp_pool_t *pool, size_t n) {
  return pool->map_room >= n;
}
/* The entries in the live map: exactly the live blocks. */
static inline size_t mp__map_count(const mp_pool_t *pool) {
  return pool->map_cap / MP__MAP_LOAD - pool->map_room;
}
/* The slots of a map of cap home slots: cap / MP__MAP_LOAD more past the
 * last home slot, where probe runs go on instead of wrapping to slot 0 (no
 * mask per probe step, no cyclic distance in the removal). A run holds at
 * most mp__map_count <= cap / MP__MAP_LOAD entries (mp__map_has_room), so
 * one that starts at a home slot h ends at h + cap / MP__MAP_LOAD - 1 at
 * the latest: the last slot stays empty and ends every probe, and no probe
 * tests a bound. */
static inline size_t mp__map_slots(size_t cap) {
  return cap + cap / MP__MAP_LOAD;
}
bool mp__map_insert(mp_pool_t *pool, mp__block_t *b);
/* mp__map_insert where room was made before (mp__map_reserve, or a removal
 * under the same lock): no room test, cannot fail. */
void mp__map_add(mp_pool_t *pool, mp__block_t *b);
void mp__map_remove(mp_pool_t *pool, mp__block_t *b);
/* addr's home slot: the top log2(map_cap) bits of one multiply (Knuth's
 * multiplicative hashing; the address's low zero bits do not matter). */
static inline size_t mp__map_slot(const mp_pool_t *pool, uintptr_t addr) {
  return (size_t)(((uint64_t)addr * 0x9E3779B97F4A7C15ull) >> pool->map_shift);
}
/* addr's slot in the live map, or NULL when it is not there (inline: every
 * free looks its pointer up). A pointer, not an index: the removal starts
 * from it without scaling an index again. A slot's record is never NULL,
 * so a caller that found the slot tests nothing more. */
static inline mp__slot_t *mp__map_probe(const mp_pool_t *pool, uintptr_t addr) {
  if (addr == 0)
    return NULL; /* an empty slot's key */
  mp__slot_t *p = pool->map + mp__map_slot(pool, addr);
  if (MP__LIKELY(p->addr == addr))
    return p; /* at its home slot: most entries (a map at most 1/8 full) */
  for (;; p++) {
    if (p->addr == addr)
      return p;
    if (p->addr == 0)
      return NULL;
  }
}
/* The live block at addr and its slot, for mp__map_remove_slot. */
static inline mp__block_t *mp__map_lookup(const mp_pool_t *pool, uintptr_t addr,
                                          mp__slot_t **slot) {
  *slot = mp__map_probe(pool, addr);
  return *slot != NULL ? (*slot)->blk : NULL;
}
/* (core.c) The live block at ptr for a caller's fn, with a message naming
 * what is wrong with it; movable_ok: a movable block's pointer is
 * accepted. A held block is not live to callers. */
static inline mp_status_t mp__pool_find_live(mp_pool_t *pool, const char *fn,
                                             void *ptr, bool movable_ok,
                                             bool fwd, mp__block_t **out,
                                             mp__slot_t **slot) {
  mp__slot_t *i = mp__map_probe(pool, (uintptr_t)ptr);
  if (MP__UNLIKELY(i == NULL))
    return mp__pool_find_live_why(pool, fn, ptr, movable_ok, fwd, NULL);
  mp__block_t *b = i->blk;
  uint32_t bad = MP__B_CHILD | MP__B_HELD | MP__B_LADDER |
                 (movable_ok ? 0 : MP__B_MOVABLE);
  if (MP__UNLIKELY(b->flags & bad))
    return mp__pool_find_live_why(pool, fn, ptr, movable_ok, fwd, b);
  *slot = i;
  *out = b;
  return MP_OK;
}
void mp__map_remove_slot(mp_pool_t *pool, mp__slot_t *slot);
/* [defrag] Cuts b (not in the index) to `size`; the rest becomes a new free
 * block after it, with b's deps, inserted in the index. Returns it or NULL
 * when the rest is empty (or no record could be made). */
mp__block_t *mp__block_split(mp_pool_t *pool, mp__block_t *b, size_t size);
/* mp__block_split with the upper piece's record r given (it cannot fail):
 * b (out of the index) keeps [addr, addr + size), r takes the rest with b's
 * deps and sync marks and goes into the index; every field a free block's
 * readers use is set (r may come straight off the record free list), not
 * sidx nor requested, which only a live or unmapped block's readers use. */
void mp__block_split_into(mp_pool_t *pool, mp__block_t *b, size_t size,
                          mp__block_t *r);
/* The take's split when the taken block is made live next, under the same
 * hold of the lock (never put back: mp__block_untake): r (off the record
 * free list, flags 0) takes [addr, addr + size) and is returned; b keeps
 * the rest above it with its flags, deps and sync generation, so nothing
 * is copied, and goes back into the index (MP__B_FREE still set). The
 * same addresses as mp__block_split_rest: only the records swap roles. */
mp__block_t *mp__block_split_low(mp_pool_t *pool, mp__block_t *b, size_t size,
                                 mp__block_t *r);
/* mp__block_split_into without the free-block count: for the take, whose
 * taken block leaves the count and whose rest joins it (no change). */
void mp__block_split_rest(mp_pool_t *pool, mp__block_t *b, size_t size,
                          mp__block_t *r);
/* The one merge of two free blocks: gone (into's next, both out of the
 * index) joins into: deps merged, into keeps gone's MP__B_UNMERGED mark,
 * gone's record freed. force: past MP__MAX_DEPS pending streams into waits
 * for the next device sync (MP__B_SYNC); else such a pair stays apart,
 * both marked MP__B_UNMERGED, and the result is false. */
bool mp__block_absorb(mp_pool_t *pool, mp__block_t *into, mp__block_t *gone,
                      bool force);
/* [defrag] Merges free b (not in the index) with its free neighbours (taken
 * out of the index) and returns the merged block, still not in the index. */
mp__block_t *mp__block_coalesce(mp_pool_t *pool, mp__block_t *b);
/* mp__block_coalesce, but b stays apart from a free neighbour while b waits
 * for other streams' work (more than its own stream's), which merged would
 * hold the neighbour back too (merged once that work is done, as any pair
 * left apart). */
mp__block_t *mp__block_coalesce_apart(mp_pool_t *pool, mp__block_t *b);
/* Merges every pair of adjacent free blocks left apart (MP__B_UNMERGED)
 * that can join now: after a device sync, at trim, and before growth when
 * a free kept one apart (merge_later). */
void mp__block_merge_deferred(mp_pool_t *pool);
/* Links a new block after `after` (NULL: at the head) in seg. */
void mp__block_link(mp__segment_t *seg, mp__block_t *after, mp__block_t *b);
void mp__block_unlink(mp__segment_t *seg, mp__block_t *b);

/* ---- stream.c: stream table, epochs, markers, events -------------------- */
/* A forgotten slot's handle, and last_s where no slot is remembered: no
 * stream is ever at this address. */
#define MP__STREAM_GONE ((mp_stream_t)UINTPTR_MAX)
/* Slot i's stream is the one the next call most likely names. */
static inline void mp__stream_remember(mp_pool_t *pool, uint32_t i) {
  pool->last_sidx = i;
  pool->last_s = pool->streams[i].s;
}
/* mp__stream_index's general case: any stream, added on first use. */
mp_status_t mp__stream_lookup(mp_pool_t *pool, mp_stream_t s, uint32_t *out);
/* Who owns s in pool's table: the calling thread for the per-thread
 * default stream (one handle, a stream per thread), else 0. */
uint64_t mp__stream_owner(const mp_pool_t *pool, mp_stream_t s);
/* The calling thread as mp__stream_owner names it: a number never given to
 * another thread. */
uint64_t mp__self(void);
/* mp__stream_index of s, a stream used beside the pool's last one (the
 * host pool's caller's, beside its own: recorded.c): its slot is kept in
 * pool->second_sidx, not made the last (mp__stream_remember), so that
 * the last stream's next call keeps mp__stream_index's inline path and
 * this one needs no hash. Added (and remembered) on first use. */
mp_status_t mp__stream_index_second(mp_pool_t *pool, mp_stream_t s,
                                    uint32_t *out);
/* Whether stream s (the calling thread's, for a per-thread stream) has a
 * slot in the table; adds nothing. */
bool mp__stream_known(const mp_pool_t *pool, mp_stream_t s);
/* Known, and not only through a capture's mark (mark_only): a stream the
 * pool met. */
bool mp__stream_met(const mp_pool_t *pool, mp_stream_t s);
/* Whether s (the calling thread's, for a per-thread stream) is marked
 * capturing in pool's table (graph.c). */
bool mp__stream_captured(const mp_pool_t *pool, mp_stream_t s);
/* MP_OK when s is a live stream of dev (NULL, the legacy stream, is);
 * else MP_EINVAL, saying so. Adds nothing. */
mp_status_t mp__stream_check(mp_device_t *dev, mp_stream_t s);
/* The slot of (s, owner), added on first use: another pool's slot with its
 * owner (arena.c: a per-thread stream given to mp_pool_add_stream is the
 * adding thread's in an arena another thread makes later). */
mp_status_t mp__stream_index_owned(mp_pool_t *pool, mp_stream_t s,
                                   uint64_t owner, uint32_t *out);
/* The slot of stream s in the table, added on first use. Inline: the
 * stream of the pool's last call, the common case, costs a few loads.
 * Without per-thread streams every slot's owner is 0, the owner the
 * lookup would ask for, and no slot's want_close is set: only a slot with
 * an owner gets it (mp__stream_close), and a slot gets an owner only for
 * a per-thread stream, which sets has_pt (mp__stream_add). So the fast
 * path, taken only without has_pt, does not read want_close (that cost
 * an arena's allocation 4 instructions). plain: pool->rare is 0, so
 * has_pt is false too. */
static inline mp_status_t mp__stream_index_as(mp_pool_t *pool, mp_stream_t s,
                                              uint32_t *out, bool plain) {
  if (MP__LIKELY(s == pool->last_s && (plain || !pool->has_pt))) {
    uint32_t i = pool->last_sidx;
    MP__ASSERT(i < pool->nstreams && pool->streams[i].s == s);
    MP__ASSERT(!pool->has_pt && !pool->streams[i].want_close);
    *out = i;
    return MP_OK;
  }
  /* Through a local: the caller's variable never has its address taken,
   * so that it may stay in a register. */
  uint32_t found;
  mp_status_t st = mp__stream_lookup(pool, s, &found);
  if (st == MP_OK)
    *out = found;
  return st;
}
static inline mp_status_t mp__stream_index(mp_pool_t *pool, mp_stream_t s,
                                           uint32_t *out) {
  return mp__stream_index_as(pool, s, out, false);
}
/* One capture mark more (on) or one fewer on slot sidx of pool's stream
 * table (graph.c: a route, or a begin in flight). A count, not a flag: two
 * begins on one stream (threads, each marking before the parent's lock
 * says which one routes) each take back only their own mark. The slot is
 * capturing while its count is nonzero (never recorded on nor queried),
 * and pool->ncapturing counts such slots. At the first mark the stream's
 * open epoch is settled (done at once where it is idle, else a marker)
 * while it may still be asked and recorded on: frees after the first of a
 * run leave the epoch open (mp__deps_on_free_uses), and nobody could close
 * it until the capture ends. At the last, the epoch the capture left open
 * is closed. Here, not in graph.c, as arena.c marks a new arena's slots
 * too. */
void mp__stream_capture_mark(mp_pool_t *pool, uint32_t sidx, bool on);
/* The same for s as owner's stream (a pool with arenas, and its arenas:
 * graph.c, arena.c), which may not know s. A mark on a stream it does not
 * know adds its slot (MP_ENOMEM/MP_EINVAL as mp__stream_index may fail),
 * marked mark_only when carry: at its last mark, a slot that no block
 * used meanwhile goes again, so that the capture leaves no stream in an
 * arena that never used it (another thread's per-thread stream there
 * would make its synchronization a device synchronize, and a free after
 * all streams wait for that thread). Taking a mark back never adds a
 * slot: without one, nothing happens. */
mp_status_t mp__stream_capture_mark_owned(mp_pool_t *pool, mp_stream_t s,
                                          uint64_t owner, bool on, bool carry);
/* Takes back the slot of s (the calling thread's, for a per-thread
 * stream) that a call made and then used nothing of (mp_host_pool_alloc
 * refused after it made the slot): forgotten, as if the pool had never
 * met s, unless something used it meanwhile (a block allocated on it or
 * using it, a free on it, a marker, a capture mark). True when it went.
 * Lock held. */
bool mp__stream_unmake(mp_pool_t *pool, mp_stream_t s);
/* mp_host_pool_alloc's hold on the slot of s (the calling thread's, for a
 * per-thread stream), under pool's lock: -1 when there is none; else 1
 * when the slot is fresh (made: the caller made it now, under this hold
 * of the lock), pinned for the call (*pin: the pin, never 0, to give
 * back to mp__stream_unpin), or 0 (the slot stays, whatever the call's
 * end). */
int mp__stream_pin(mp_pool_t *pool, mp_stream_t s, bool made, uint64_t *pin);
/* The end of a call mp__stream_pin pinned s's slot for (pin, its pin;
 * served: it got a buffer, which uses s): unpinned; a served call settles
 * the slot, and the last one of a fresh slot, refused, takes it back
 * (mp__stream_unmake: kept where something else used it). Nothing when
 * the pinned slot was forgotten meanwhile (s destroyed during the call),
 * whatever slot s has now. True when it went. Lock held. */
bool mp__stream_unpin(mp_pool_t *pool, mp_stream_t s, uint64_t pin,
                      bool served);
/* Live block b is also used on stream sidx (record_stream, a move). */
void mp__stream_add_use(mp_pool_t *pool, mp__block_t *b, uint32_t sidx);
/* A copy queued on stream sidx now reads or writes b: a use that ends
 * when the stream's open epoch is done (room for it made by dropping the
 * copies' uses that are; defrag.c). */
void mp__stream_add_copy_use(mp_pool_t *pool, mp__block_t *b, uint32_t sidx);
/* Live block b's recorded uses are all finished (the caller synchronized
 * the device): forgotten, so that its free waits for its own stream only
 * (mp__pool_free_done). */
void mp__stream_drop_uses(mp_pool_t *pool, mp__block_t *b);
/* Live block b's use on stream sidx, if it names one, is finished (the
 * caller waited for that stream): forgotten, so that sidx's slot may go
 * once the stream is (a freeze's own stream, defrag.c). */
void mp__stream_use_done(mp_pool_t *pool, mp__block_t *b, uint32_t sidx);
/* Live block b may be in use on every stream whose work is not known done
 * (mp_pool_free_after_all). */
void mp__stream_use_all(mp_pool_t *pool, mp__block_t *b);
/* Whether forgotten slot i's work is done (its markers asked): a destroyed
 * stream gets no new work. */
bool mp__stream_gone_done(mp_pool_t *pool, uint32_t i);
/* The same for a block released before pool's lock is dropped: a slot only
 * a capture's mark holds stays so (mark_only), as the use ends with the
 * release; the deps the release gives b then wait for the marker the
 * capture's end records, and the slot goes with its last mark (graph.c: a
 * range given back to an arena during another thread's capture kept that
 * thread's stream in the arena for good). */
void mp__stream_use_all_released(mp_pool_t *pool, mp__block_t *b);
/* Free-to-be block b (taken, not yet released) waits for a device
 * synchronize of pool instead of its streams' work: the next sync of pool
 * is one (sync_device_from). */
void mp__stream_use_device(mp_pool_t *pool, mp__block_t *b);
/* Whether pool knows stream s of owner as more than a capture's mark. */
bool mp__stream_met_owned(const mp_pool_t *pool, mp_stream_t s, uint64_t owner);
/* The device watcher: s is going away (mp_stream_forget). */
void mp__stream_gone(void *pool, mp_stream_t s);
/* Around a destroy of stream s that the driver may refuse (a stream being
 * captured, whose epoch no marker can close: mp_stream_forget would leave
 * it open in a slot gone for good): before it, while the handle is valid,
 * every pool of dev sets its slot of s aside, whole (matched by no handle,
 * never recorded on or asked); after it, destroyed, each forgets that slot
 * without touching the handle (a new stream given the same handle
 * meanwhile keeps its own slot), else each gives it back as it was. */
void mp__stream_set_aside(mp_device_t *dev, mp_stream_t s);
/* destroyed: the real destroy succeeded; over too: the stream began the
 * capture it was in, which is over with it, without a graph. */
void mp__stream_set_aside_end(mp_device_t *dev, mp_stream_t s, bool destroyed,
                              bool over);
/* In a stream watcher (mp__device_watch's fn, on the forgetting thread):
 * whether the forget it is told of leaves the handle a live stream's: the
 * set-aside before a destroy the driver may refuse, or the give-back after
 * a refused one (a destroy that succeeds is told once more after it). */
bool mp__stream_forget_keeps_handle(void);
/* The driver has just made a stream whose handle is s (the shim's
 * cuStreamCreate hooks, before the program has the handle): where a pool of
 * dev has a slot of s set aside, the destroy of the stream that had the
 * handle went through, so the slot the handle matches now is that dead
 * stream's (forgotten), and the one it matches from now on, until
 * mp__stream_set_aside_end, is the new stream's (kept there). */
void mp__stream_born(mp_device_t *dev, mp_stream_t s);
/* mp__deps_on_free for a block with recorded uses, or in a pool of
 * several streams. */
void mp__deps_on_free_uses(mp_pool_t *pool, mp__block_t *b);
/* Sets b's deps for a free now: its stream and its recorded uses. Inline:
 * the common case (no recorded use, one stream, nothing to close) is a
 * few stores. */
static inline void mp__deps_on_free(mp_pool_t *pool, mp__block_t *b) {
  if (MP__UNLIKELY(b->ndeps != 0 || pool->nstreams != 1)) {
    mp__deps_on_free_uses(pool, b);
    return;
  }
  /* One stream slot: b's is slot 0 (a live block's slot is below
   * nstreams), and its dep is written whole, not field by field. */
  MP__ASSERT(b->sidx == 0);
  mp__strm_t *own = &pool->streams[0];
  own->refs--;
  b->deps[0] = mp__dep(0, own->epoch);
  own->dirty = true;
  b->ndeps = 1;
}
/* Whether b waits for a device synchronize not yet made (MP__B_SYNC). */
static inline bool mp__sync_pending(const mp_pool_t *pool,
                                    const mp__block_t *b) {
  return (b->flags & MP__B_SYNC) && b->gen >= pool->sync_done;
}
/* Whether free neighbours b and n stay apart because one of them waits
 * for a device synchronize and the other does not: joined, the other
 * would wait for it too (a forced merge hands the mark on). A graph
 * pool's range given back to an arena that cannot learn every stream its
 * replays may run on waits so (graph.c, mp__stream_use_device); merged
 * into the arena's cache, that cache waited for the device sync as well,
 * which the arena cannot make during a capture: it grew at each one. The
 * pair joins after that sync (mp__block_merge_deferred). */
static inline bool mp__sync_apart(const mp_pool_t *pool, const mp__block_t *b,
                                  const mp__block_t *n) {
  return mp__sync_pending(pool, b) != mp__sync_pending(pool, n);
}
/* Records a pair mp__sync_apart keeps apart: owed a walk once the sync
 * its waiting half waits for has passed (mp__apart_sync_due). With several
 * pairs the earliest such sync is kept: the walk that joins those it may
 * records the rest again. (The latest hid a pair whose sync had passed
 * behind one noted after it, until the later sync: the pool grew
 * meanwhile.) */
static inline void mp__sync_apart_note(mp_pool_t *pool, const mp__block_t *b,
                                       const mp__block_t *n) {
  uint64_t g = mp__sync_pending(pool, b) ? b->gen : n->gen;
  if (pool->apart_sync == 0 || g + 1 < pool->apart_sync)
    pool->apart_sync = g + 1;
}
/* Whether a pair kept apart for a device sync may join now: the sync has
 * passed (mp__block_merge_deferred). */
static inline bool mp__apart_sync_due(const mp_pool_t *pool) {
  return pool->apart_sync != 0 && pool->sync_done >= pool->apart_sync;
}
/* mp__deps_try_merge when the two name more than one stream, or one waits
 * for a device sync: the union of what is still pending. False, nothing
 * changed, for a pair mp__sync_apart keeps apart (noted: a free on the
 * plain path reaches it here, as its neighbour's MP__B_SYNC takes the
 * merge off the fast path), or one whose streams do not fit. */
bool mp__deps_try_union(mp_pool_t *pool, mp__block_t *dst,
                        const mp__block_t *src);
/* Merges src's deps into dst (coalescing); false, nothing changed, when the
 * union of what is still pending spans more than MP__MAX_DEPS streams, or
 * one of the two waits for a device sync and the other does not. */
static inline bool mp__deps_try_merge(mp_pool_t *pool, mp__block_t *dst,
                                      const mp__block_t *src) {
  /* One dep each, on the same stream (a pool of one stream has no other
   * case but the next): the later epoch. Finished deps may stay;
   * mp__deps_safe drops them when it looks. */
  /* The last two tests as one word (| rather than &&): one branch. */
  if (MP__LIKELY(dst->ndeps == 1 && src->ndeps == 1 &&
                 (mp__dep_other_stream(dst->deps[0], src->deps[0]) |
                  ((dst->flags | src->flags) & MP__B_SYNC)) == 0)) {
    /* One stream: the words order as the epochs. */
    if (dst->deps[0].w < src->deps[0].w)
      dst->deps[0] = src->deps[0];
    return true;
  }
  if (MP__UNLIKELY(((dst->flags | src->flags) & MP__B_SYNC) || dst->ndeps > 1 ||
                   src->ndeps > 1 || (src->ndeps == 1 && dst->ndeps == 1)))
    return mp__deps_try_union(pool, dst, src);
  /* At most one of them has a dep (on one stream): it. */
  if (src->ndeps == 1)
    dst->deps[0] = src->deps[0];
  dst->ndeps |= src->ndeps;
  return true;
}
/* [defrag] Adds src's deps to dst; always succeeds: past MP__MAX_DEPS
 * streams dst waits for the next device sync (MP__B_SYNC). Returns true. */
bool mp__deps_merge(mp_pool_t *pool, mp__block_t *dst, const mp__block_t *src);
/* mp__deps_safe but for a block freed on sidx alone: drops the finished
 * deps, and asks (poll) the streams of the rest. */
bool mp__deps_check(mp_pool_t *pool, mp__block_t *b, uint32_t sidx, bool poll);
/* mp__deps_safe's inline half: b was freed on sidx alone. */
static inline bool mp__deps_own(const mp__block_t *b, uint32_t sidx) {
  return b->ndeps == 1 && mp__dep_sidx(b->deps[0]) == sidx &&
         !(b->flags & MP__B_SYNC);
}
/* True when a block with these deps can be reused on stream sidx now.
 * poll: query markers and close open epochs of the streams it waits on.
 * Inline: a block freed on the asking stream needs nothing more (stream
 * order suffices). */
static inline bool mp__deps_safe(mp_pool_t *pool, mp__block_t *b, uint32_t sidx,
                                 bool poll) {
  if (mp__deps_own(b, sidx))
    return true;
  return mp__deps_check(pool, b, sidx, poll);
}
/* MP_POOL_STREAM_WAITS: makes stream sidx wait, on the device, for the
 * markers of every unfinished dep of b (closing open epochs to get them),
 * so that sidx may use b at once; false, with no wait made (or only some,
 * when a wait failed), when a dep has no marker to wait on (a capturing or
 * unaware-captured stream, a block waiting for a device sync, no event). */
bool mp__deps_order(mp_pool_t *pool, mp__block_t *b, uint32_t sidx);
/* Whether free block b waits, as far as the pool knows now (no device
 * call), for the work of other streams whichever stream asks: it waits for
 * the next device sync (MP__B_SYNC), or unfinished deps name two streams or
 * more, so that even one of them must wait for the other. PyTorch's
 * snapshot calls such a block active ("active_pending_free"): a freed
 * block whose events are not yet done. One with unfinished work on one
 * stream is that stream's at once, as a PyTorch block is its stream's. */
bool mp__deps_pending(const mp_pool_t *pool, const mp__block_t *b);
/* Whether mp__deps_order would likely succeed, with no device call: every
 * unfinished dep has a marker or an open epoch this thread can close. */
bool mp__deps_orderable(mp_pool_t *pool, const mp__block_t *b, uint32_t sidx);
/* Whether stream sidx may use free block b now: no unfinished work of
 * other streams on it, or (MP_POOL_STREAM_WAITS) work it can be ordered
 * after (growth counts such a block as its own). */
static inline bool mp__deps_usable(mp_pool_t *pool, mp__block_t *b,
                                   uint32_t sidx) {
  return mp__deps_safe(pool, b, sidx, false) ||
         (sidx != UINT32_MAX && (pool->cfg.flags & MP_POOL_STREAM_WAITS) &&
          !pool->growth_no_waits && mp__deps_orderable(pool, b, sidx));
}
/* Polls every stream's markers; closes open epochs when close is set. */
void mp__streams_poll(mp_pool_t *pool, bool close);
/* Snapshot before a device sync, and completion after it; _failed instead
 * of _end when the wait failed: forgotten streams whose work the wait was
 * to cover are marked dirty again (their markers went to the wait's set,
 * and only a device synchronize covers them now). */
uint64_t mp__streams_sync_begin(mp_pool_t *pool);
void mp__streams_sync_end(mp_pool_t *pool, uint64_t snap);
void mp__streams_sync_failed(mp_pool_t *pool);
void mp__streams_release(mp_pool_t *pool); /* destroy: events back */
/* Waits for every stream the pool knows, by an event each (a device
 * synchronize only where a stream cannot be marked), with the lock dropped
 * meanwhile (lock.c's sync protocol), and marks every stream epoch before
 * it done. _alloc also takes a device buffer of buf_bytes while the lock is
 * down (*buf NULL when there is no room). */
mp_status_t mp__pool_sync(mp_pool_t *pool);
mp_status_t mp__pool_sync_alloc(mp_pool_t *pool, size_t buf_bytes, void **buf);
/* A synchronization of the streams the pool knows, without a device
 * synchronize: an event recorded on each live stream (under the lock),
 * waited for with the lock dropped. */
typedef struct mp__sync_set {
  mp_event_t *ev;
  size_t n;
  bool partial; /* mp__pool_sync_partial: no device sync, none counted */
} mp__sync_set_t;
/* MP_EBUSY with a message naming what (a synchronize, a pause) when a live
 * stream the pool knows cannot be waited for by an event now: one the
 * application captures without telling the pool, or whose capture state
 * cannot be told (the legacy stream while a blocking stream captures,
 * where an event recorded or waited for invalidates that capture: an H200,
 * 2026-11-28). Another thread's per-thread stream is waited for by an
 * event on the legacy stream (mp__streams_sync_events): that one is asked
 * then. MP_OK otherwise. Asks the device of each stream (no wait). Under
 * the lock. */
mp_status_t mp__streams_unwaitable(const mp_pool_t *pool, const char *what);
/* Under the lock: whether a wait of pool's streams is a device synchronize
 * by design, not for want of an event: one owed (sync_device_from: an
 * arena given a graph range back, mp__stream_use_device), or a destroyed
 * stream that could not be marked (gone and dirty, not capturing). */
bool mp__streams_owe_device(const mp_pool_t *pool);
/* Under the lock, before mp__streams_sync_begin (which clears the dirty
 * marks this reads for forgotten streams). False (nothing held) when only
 * a device synchronize will do: a stream that could not be marked, no
 * events. Another thread's per-thread streams share one event on the
 * legacy stream. */
bool mp__streams_sync_events(mp_pool_t *pool, mp__sync_set_t *set);
/* The out-of-memory ladder's wait while a stream of pool is captured, when
 * mp__pool_sync is refused: an event on each stream not captured, as
 * mp__pool_sync records, and for each captured stream the newest marker
 * recorded on it before its capture began (a device wait of the pool's
 * join stream on it, never a record on or a query of the captured stream),
 * waited for with the lock dropped. Blocks whose work is behind those are
 * counted done; nothing a capture queued is, and no device synchronize is
 * made or counted (one owed stays owed). MP_EBUSY where a stream the pool
 * knows is captured without its knowledge (mp__streams_unwaitable). */
mp_status_t mp__pool_sync_partial(mp_pool_t *pool);
/* Waits for the set's events; a set that mp__streams_sync_events gave up on
 * (no events held) synchronizes the device instead. Lock dropped. */
mp_status_t mp__sync_set_wait(mp_device_t *dev, const mp__sync_set_t *set);
void mp__sync_set_release(mp_pool_t *pool, mp__sync_set_t *set); /* locked */
/* Locked, after the set's wait answered st: releases the set, and closes
 * the streams' epochs up to snap (mp__streams_sync_begin) if the wait
 * succeeded, or records that it failed. */
void mp__sync_set_done(mp_pool_t *pool, mp__sync_set_t *set, uint64_t snap,
                       mp_status_t st);
/* Whether stream sidx has finished all its work (asked without waiting);
 * if so every epoch of it opened before is marked done. */
bool mp__stream_idle_now(mp_pool_t *pool, uint32_t sidx);
/* mp__stream_idle_now for every stream (destroyed ones: their markers);
 * true when all of them are done. Never waits. */
bool mp__streams_all_idle_now(mp_pool_t *pool);
mp_status_t mp__event_get(mp_pool_t *pool, mp_event_t *out);
void mp__event_put(mp_pool_t *pool, mp_event_t e);

/* ---- segment.c: the segment list and plain segments ---------------------
 * Called with the lock held; growth drops it around device calls (lock.c). */
mp__segment_t *mp__segment_containing(const mp_pool_t *pool, uintptr_t p);
/* Whether a free (fwd) of p on pool goes on to another arena: pool is an
 * arena and p lies outside its segments. */
static inline bool mp__arena_forwards(mp_pool_t *pool, uintptr_t p, bool fwd) {
  return fwd && pool->arena && mp__segment_containing(pool, p) == NULL;
}
/* Adds s at the head of the pool's segment list. */
void mp__segment_push(mp_pool_t *pool, mp__segment_t *s);
/* Reserved (and free) bytes grow / shrink by bytes; peaks follow. */
void mp__reserved_add(mp_pool_t *pool, size_t bytes);
void mp__reserved_sub(mp_pool_t *pool, size_t bytes);
/* What growth stopped by the cap returns: MP_ELIMIT under max_bytes (or a
 * child's range), else MP_ENOMEM. */
mp_status_t mp__segment_limit(mp_pool_t *pool);
/* A new plain segment for a block of size on sidx; *fresh: the free block
 * holding its memory. */
mp_status_t mp__plain_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                           mp__block_t **fresh);
/* Gives one wholly free, releasable plain segment back; false if none. */
bool mp__plain_trim_one(mp_pool_t *pool);
/* Destroy's first device free (takes the lock: a refused free leaves the
 * pool to other threads), made before anything else is given up: the
 * first plain segment, if any. A device that refuses it leaves the pool
 * as it was, with a message naming the segment. */
mp_status_t mp__plain_release_first(mp_pool_t *pool);

/* ---- vrange.c: the virtual range ----------------------------------------- */
/* Reserves the virtual range on first use: MP_OK; MP_ENOTSUP: use plain
 * segments (no virtual memory); MP__EHOST; MP_ENODEV: the device refuses
 * this process (a forked child of its opener). */
mp_status_t mp__vrange_ready(mp_pool_t *pool);
/* Maps memory for a block of size on sidx where it best completes a fitting
 * block (reclaiming free chunks first when the map would lift reserved
 * above its peak); *fresh: the free block holding it. MP_ENOTSUP: the range
 * is exhausted (the caller goes plain). */
mp_status_t mp__vrange_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                            mp__block_t **fresh);
/* Unmaps free chunks until want bytes went back, never one inside k1 or k2
 * (patient: the growth rung); each segment_unmap event says the stream its
 * chunk was mapped for. Returns the bytes released. */
size_t mp__vrange_reclaim(mp_pool_t *pool, size_t want, const mp__block_t *k1,
                          const mp__block_t *k2, bool patient);
/* The mapped chunk of virtual segment v holding address a; false if none. */
bool mp__vrange_chunk_of(const mp__segment_t *v, uintptr_t a, mp__chunk_t *out);
/* vm_map, then the peers' access (mp_pool_set_access); unmapped again if
 * that fails. Callable with the lock dropped. */
mp_status_t mp__pool_vm_map(mp_pool_t *pool, void *addr, size_t bytes);
/* Under the lock, unless a device call is in flight (then nothing):
 * unmaps the strays again (a later driver call may succeed), the lock
 * dropped for the calls; the failure of the first that stays mapped (the
 * others are tried too). */
mp_status_t mp__vrange_strays_retry(mp_pool_t *pool);
/* Under the lock, after a device call that may have left strays or
 * unmapped some (mp__pool_vm_map, a retry): counts them in reserved_bytes
 * (stray_bytes), lifting the peak. */
void mp__vrange_strays_count(mp_pool_t *pool);
/* What a destroy could not give back to the device: the first refusal
 * (its status, what was refused, where, and the driver's message), and how
 * many refusals in all (grow.c). */
typedef struct mp__lost {
  mp_status_t first;
  const char *what;
  uintptr_t at;
  size_t bytes, n;
  char why[MP__ERROR_MAX];
} mp__lost_t;
/* Where a device call that refused with st recorded no message (the
 * thread's error serial is still `since`, mp__error_serial() before the
 * call: a backend's table promises none), records st's name and that the
 * device gave no reason; returns st. So that mp_last_error(), copied as
 * the device's reason (mp__lost_note, a stray's message, a kept staging
 * buffer's), is never an older failure of the thread. */
static inline mp_status_t mp__device_said(mp_status_t st, uint64_t since) {
  if (mp__error_serial() != since)
    return st;
  return mp__fail(st, "%s (the device gave no reason)", mp_status_string(st));
}
/* Notes refusal st (mp_last_error() its message: mp__device_said makes it
 * the refusing call's) of what at [at, +bytes). Inline: grow.c and
 * vrange.c, which grow.c calls, both note. */
static inline void mp__lost_note(mp__lost_t *lost, mp_status_t st,
                                 const char *what, uintptr_t at, size_t bytes) {
  if (lost->n++ > 0)
    return;
  lost->first = st;
  lost->what = what;
  lost->at = at;
  lost->bytes = bytes;
  snprintf(lost->why, sizeof lost->why, "%s", mp_last_error());
}
/* Destroy: unmaps (unless paused) and releases virtual segment s and frees
 * its tables; a refusal goes on with the rest, noted in lost. */
void mp__vrange_release(mp_pool_t *pool, mp__segment_t *s, mp__lost_t *lost);

/* ---- grow.c: growth and release dispatch --------------------------------- */
/* Makes room for a block of `size` usable on sidx. MP_ELIMIT when the cap
 * stops it, MP_ENOMEM / MP_EDRIVER from the device, MP__EHOST without host
 * memory for the records. On MP_OK *fresh is the
 * free block the new memory went to, or NULL when another thread's grow or
 * release was waited for instead (the caller looks at the cache again). */
mp_status_t mp__segment_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                             mp__block_t **fresh);
/* Releases free memory (synchronized already) until free bytes <= keep:
 * wholly free plain segments, and free chunks anywhere in the virtual
 * range. MP_OK, or the device's refusal (the last one, its count and the
 * bytes still free said) when it refused to take some back: that memory
 * stays the pool's, free, and the next trim tries it again. who: the call
 * named in the message. */
mp_status_t mp__segment_trim(mp_pool_t *pool, size_t keep, const char *who);
/* release_threshold: after a free, gives idle memory above the threshold
 * back to the device where its streams are known done; never waits. */
void mp__segment_release_over(mp_pool_t *pool);
/* Inline: without a threshold (the default) a free pays one test. */
static inline void mp__segment_release_above(mp_pool_t *pool) {
  if (MP__UNLIKELY(pool->cfg.release_threshold != 0))
    mp__segment_release_over(pool);
}
/* Destroy: releases every segment, live or not, and frees their records.
 * A plain segment the device refuses to free is lost to the pool (the
 * others still go): the first refusal's status, with a message naming the
 * segment and how many more. */
mp_status_t mp__segment_release_all(mp_pool_t *pool);

/* ---- history.c ---------------------------------------------------------- */
/* At create: the ring for cfg.history events (none when 0). */
mp_status_t mp__history_init(mp_pool_t *pool);
void mp__history_release(mp_pool_t *pool);
/* Under the lock: appends one event, overwriting the oldest when full. */
void mp__history_record(mp_pool_t *pool, unsigned action, uintptr_t addr,
                        size_t size, uintptr_t stream);
/* The clock read and (history_stacks) the stack of one call, for several
 * events (mp__history_put): a pause's and a resume's events of every live
 * block take one backtrace, not one each. */
typedef struct mp__hstamp {
  uint64_t us;
  int nframes;
  void *frames[MP__HIST_FRAMES];
} mp__hstamp_t;
void mp__history_stamp(const mp_pool_t *pool, mp__hstamp_t *out);
/* Under the lock, the ring on: one event at the stamp's time and stack;
 * restored: an alloc of a block that was live before a pause, at its
 * resume (mp__hevent_t). */
void mp__history_put(mp_pool_t *pool, const mp__hstamp_t *at, unsigned action,
                     uintptr_t addr, size_t size, uintptr_t stream,
                     bool restored);
/* A free: free_requested and free_completed with one clock read and one
 * stack (a block is reusable on its own stream at once); requested: the
 * free_requested was recorded already (a block freed while imported,
 * whose free_completed comes when its leases close: export.c), only the
 * free_completed. */
void mp__history_free(mp_pool_t *pool, uintptr_t addr, size_t size,
                      size_t block, uintptr_t stream, bool requested);
/* An event's slot as it was (its stack too, where stacks are kept): what
 * mp__history_take_back puts back. */
typedef struct mp__hkept {
  mp__hevent_t ev;
  void *frames[MP__HIST_FRAMES];
} mp__hkept_t;
/* Under the lock, the ring on: the slot the next event goes to, kept in
 * *out before that event is recorded. */
void mp__history_save_next(const mp_pool_t *pool, mp__hkept_t *out);
/* Under the lock: the newest event taken back, its slot given what was
 * there before it (mp__history_save_next's, for an event that overwrote
 * the oldest). */
void mp__history_take_back(mp_pool_t *pool, const mp__hkept_t *was);
/* The hot-path hook: one predictable branch when history is off. */
#define MP__HIST(pool, action, addr, size, stream)                             \
  do {                                                                         \
    if (MP__UNLIKELY((pool)->hist.ev != NULL))                                 \
      mp__history_record((pool), (action), (uintptr_t)(addr), (size),          \
                         (uintptr_t)(stream));                                 \
  } while (0)
/* Where the public entry point running on this thread returns to: a
 * recorded stack starts at that frame, the pool's caller, however deep the
 * pool's own frames went. Stored only when stacks are recorded; an event
 * whose stack does not hold it (a stale value) drops a fixed count. */
extern _Thread_local void *mp__hist_caller;
#define MP__HIST_ENTRY(pool)                                                   \
  MP__HIST_ENTRY_AT(pool, __builtin_return_address(0))
/* The same with that return address given (ra), where the entry point
 * passes it on to where it is stored. */
#define MP__HIST_ENTRY_AT(pool, ra)                                            \
  do {                                                                         \
    if (MP__UNLIKELY((pool)->hist.marks))                                      \
      mp__hist_caller = (ra);                                                  \
  } while (0)
/* The stream handle of stream index sidx, for events. */
#define MP__HIST_STREAM(pool, sidx)                                            \
  ((sidx) < (pool)->nstreams ? (uintptr_t)(pool)->streams[(sidx)].s : 0)

/* ---- stats.c ------------------------------------------------------------ */
void mp__stats_peaks(mp_pool_t *pool);
/* The peaks an allocation can lift (allocated, requested): reserved moves
 * only in mp__reserved_add and at resume, which check its peak. */
void mp__stats_live_peaks(mp_pool_t *pool);
/* The pool's counters now (takes the lock), summed over its arenas if it
 * has them (pool.h, Arenas: peaks are sums of the arenas' peaks). */
void mp__stats_read(mp_pool_t *pool, mp_stats_t *out);
/* One pool's counters (under its lock) as callers see them: pool->st with
 * live_blocks filled in (the live map holds exactly the live blocks). */
void mp__stats_copy(const mp_pool_t *pool, mp_stats_t *out);
size_t mp__stats_largest_free(const mp_pool_t *pool);
/* The bytes reserved but not allocated: the cache. Not kept (every change
 * of reserved or allocated would move it too); 0 while paused, when the
 * pool serves nothing (reserved is then the bytes a failed undo left
 * mapped, which the live blocks' bytes may exceed). Strays are reserved
 * but serve nothing: not the cache. */
static inline size_t mp__free_bytes(const mp_pool_t *pool) {
  return pool->paused ? 0
                      : pool->st.reserved_bytes - pool->st.allocated_bytes -
                            pool->stray_bytes;
}
/* ---- check.c ------------------------------------------------------------ */
mp_status_t mp__pool_check_locked(mp_pool_t *pool);
/* ---- config.c ----------------------------------------------------------- */
mp_status_t mp__config_validate(const mp_pool_config_t *cfg);
/* MP_EINVAL, naming the bad pair, for a config mp_pool_config_init marked
 * with MP_POOL_CONFIG_BAD_ENV (a bad $MEMPOOL_CONF); else MP_OK. */
mp_status_t mp__config_env_check(const char *fn, const mp_pool_config_t *cfg);

/* True when free block b can be given back now: no work pending on it. */
static inline bool mp__releasable(mp_pool_t *pool, mp__block_t *b) {
  return (b->flags & MP__B_FREE) && mp__deps_safe(pool, b, UINT32_MAX, false);
}

/* v rounded up to a multiple of to. */
static inline size_t mp__round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

/* a + b, SIZE_MAX where that overflows. */
static inline size_t mp__add_sat(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* ---- fit and split policy (inline rules; no file of their own) ----------
 * A block above max_split is never split for a smaller request; it goes
 * whole only to a request above max_split that it fits within the slack
 * max(1/8, 2 MiB), as the large segments made for such requests do. In
 * plain segments a free block spanning a whole small-request segment
 * (segment_bytes) is fresh memory and exempt, or nothing could be carved
 * from it; in the virtual range the limit is mp__vsplit_limit (at least
 * one growth step), and growth for a small request keeps the new memory
 * apart from free neighbours it would push above that limit
 * (mp__merge_ok), while the big free blocks that cannot serve small
 * requests are what reclaim and trim unmap first. One exception: in a pool
 * used from several streams the free block at the top of the virtual range
 * may be split whatever its size. Reclaim there cannot wait for its
 * streams, and a top block whose last use is still running would otherwise
 * swallow every chunk grown above it once freed, so the range grew without
 * bound (a graph workload under max_split=64M: 14x its live bytes). */

/* How far a block taken whole may exceed a request above the split limit:
 * max(size/8, 2 MiB). */
static inline size_t mp__whole_slack(size_t size) {
  return size / 8 > MP__LARGE_ROUND ? size / 8 : MP__LARGE_ROUND;
}

/* The largest free block of the virtual range that may be split for a
 * smaller request: max(max_split, segment_bytes rounded to the granule);
 * 0: no limit. */
static inline size_t mp__vsplit_limit(const mp_pool_t *pool) {
  size_t ms = pool->cfg.max_split;
  if (ms == 0)
    return 0;
  size_t g = pool->granule ? pool->granule : 1;
  size_t seg = (pool->cfg.segment_bytes + g - 1) / g * g;
  ms = ms > seg ? ms : seg;
  /* Growth maps whole granules: a limit between two multiples would leave
   * the memory grown for a request just under it above it, unsplittable
   * and too big to be taken whole. */
  return ms > SIZE_MAX - (g - 1) ? ms : (ms + g - 1) / g * g;
}

/* The split limit of plain segments: max_split rounded up to the unit large
 * segments are made in, for the same reason. */
static inline size_t mp__plain_split_limit(const mp_pool_t *pool) {
  size_t ms = pool->cfg.max_split, u = MP__LARGE_ROUND;
  return ms > SIZE_MAX - (u - 1) ? ms : (ms + u - 1) / u * u;
}

/* Whether free block b may be split for a request of size. */
static inline bool mp__split_allowed(const mp_pool_t *pool,
                                     const mp__block_t *b, size_t size) {
  if (b->size <= pool->split_free_max || b->size == size)
    return true;
  if (b->seg->kind == MP__SEG_VIRTUAL)
    return b->size <= mp__vsplit_limit(pool) ||
           (b->next == NULL && pool->nstreams > 1);
  if (b->size <= mp__plain_split_limit(pool))
    return true;
  return b->prev == NULL && b->next == NULL &&
         b->seg->size == pool->cfg.segment_bytes;
}

/* Whether free block b may be taken whole by a request of size above
 * max_split. Out of line (core.c): asked only where a split limit refuses
 * the split, and inline its slack, the same for every block a search looks
 * at, was computed ahead of every search (12 instructions per allocation
 * without a split limit). */
bool mp__whole_ok(const mp_pool_t *pool, const mp__block_t *b, size_t size);

/* Whether free block b can serve a request of size at all (split or
 * whole). */
static inline bool mp__fits(const mp_pool_t *pool, const mp__block_t *b,
                            size_t size) {
  return mp__split_allowed(pool, b, size) || mp__whole_ok(pool, b, size);
}

/* Growth: whether a merged block of m bytes suits a request of size under
 * the split limit lim: splittable (m <= lim), or for a request above lim
 * taken whole (within the slack). */
static inline bool mp__merge_ok(size_t lim, size_t m, size_t size) {
  if (lim == 0)
    return true;
  if (size <= lim)
    return m <= lim;
  return m - size < mp__whole_slack(size);
}

#endif /* MEMPOOL_POOL_INTERNAL_H */
