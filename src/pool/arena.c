/* arena.c - per-thread arenas (config arenas=N): a pool that threads share
 * without sharing its lock or its data.
 *
 * Why: one best-fit core behind one lock cannot scale with threads. Two
 * threads doing free+alloc pairs on one pool ran at 0.26-0.33x one thread
 * on two cores: the lock covers most of a pair, and the pool's data (class
 * treaps, live map, block records) moves between the cores' caches at
 * every hand-off. A pool per thread ran at 1.8-2.0x.
 *
 * So a pool with arenas is a table of N ordinary pools (the arenas), each
 * made on the first allocation of a thread that picks it, with the pool's
 * device and config (arenas 0), its own lock, live map and virtual range.
 * A thread picks arena (k mod N) once, k counting the threads that ever
 * used arenas (a thread-local number), so with N at least the thread count
 * every thread has an arena of its own, and its allocations and frees of
 * its own blocks take only that arena's lock. A thread remembers its arena
 * of the last pool it used (mp__arena_memo, keyed by the pool's serial,
 * which no later pool at the same address shares, and which a destroy
 * that failed after some arenas went renews). The pool itself holds no
 * memory; its lock orders the rare work across arenas: making one, sharing
 * the cap, add_stream. It is never held while an arena waits for its
 * streams (trim, the reclaim's trims and its retry's ladder): a host
 * function on one of them may call into the pool. Lock order: the pool's, then
 * one arena's at a time; the hot path takes only an arena's.
 *
 * Finding a pointer's arena: a free looks in the calling thread's arena's
 * live map, under its lock, as a pool without arenas does; a pointer
 * outside that arena's segments (another thread's block) goes on from
 * there (MP__EFORWARD, pool.c's mp__pool_free_forward) to the arena found
 * as record_stream finds it, from any thread: each arena's virtual range
 * is reserved before the arena is published and is fixed until the pool
 * is destroyed, so the ranges are read without a lock; a pointer in a
 * plain segment (no virtual memory, or a range used up) is looked up in
 * each arena's live map, under its lock, in turn. (Until 2026-12-02 the
 * free read the calling thread's arena's range first, and took its lock
 * only for a pointer in it: 13 instructions a pair more, count_pairs.sh.)
 *
 * Before an arena grows for a large request, it borrows a block that an
 * idle arena caches (mp__arena_borrow says which and why), so what one
 * thread freed serves another thread's next large request without growth.
 *
 * Pause and resume (pause.c) pause every arena made, each as a pool of its
 * own; the pool's paused flag keeps arenas from being made meanwhile (and
 * arenas from growing while the pause runs: grow_held), and
 * the paths across arenas (borrowing, the reclaim's trims) leave a paused
 * arena alone: its memory is unmapped, its free and reserved bytes read 0.
 * The cap's shares count it at what it maps back at its resume (what it
 * reserved when paused), and lower its share to that: the arenas resumed
 * before it run meanwhile, and may grow into the rest.
 *
 * Graph pools (graph.c): a graph pool of the pool is one pool, and its
 * upstream (mp__arena_graph_borrow) is the calling thread's arena, which
 * keeps the range in its table of ranges, so that a free through the pool
 * reaches the graph pool through it. A stream routed to a graph pool is
 * marked capturing in every arena (a new arena copies the pool's own
 * marks, mp__arena_make), which turns the arena's cache off: an
 * allocation on it misses the cache and finds the route (pool.c), and no
 * arena records on the stream or waits for it, as CUDA's capture rules
 * ask.
 *
 * Out of memory: memory cached in one arena must not be stuck there. When
 * an arena's allocation fails (MP_ENOMEM, MP_ELIMIT), first (capped pools)
 * the other arenas' unused share of the cap comes back and the arena gets
 * half of what is left; then every other arena is synchronized and
 * trimmed (not from a host function, which must not wait for the device:
 * mp__arena_reclaim_retry), the arena gets all the room, and it tries once
 * more (again, while the trims give memory back: another arena may have
 * grown into it meanwhile); only then the pool's out-of-memory handler,
 * then the failure.
 *
 * The cap (max_bytes, max_fraction) bounds the sum of the arenas' reserved
 * bytes. Invariant, under the pool's lock: the arenas' caps add up to at
 * most the pool's cap, and each arena's cap is at least what it reserved
 * when it was last set (growth never lifts reserved above an arena's cap,
 * and a share is lowered with a growth in flight only to what the arena
 * holds once it lands). So no atomic is shared on the hot path: an arena
 * grows within its share, and asks for more only when it runs out. Shares
 * are whole granules (but for what a cap that is none leaves over), so
 * that an arena near its share still grows its range and takes no plain
 * segment. Uncapped pools give each
 * arena the device's size and let the device say no.
 *
 * mp_pool_set_max_fraction moves the pool's cap (mp__arena_recap). Lifted
 * to no limit, every arena takes the device's size. Capped, every arena's
 * share goes to 0, so that each asks for one of the new cap at its next
 * growth; an arena that reserved more than that, or had a growth in
 * flight, is marked cap_cut: its reserved bytes may read above its share
 * (as a pool without arenas may read above a cap lowered below what it
 * holds) and it cannot grow until they come under it. A share counts
 * each other arena at the larger of its share and what it reserved (and,
 * while a growth checked against an older share is in flight, that share:
 * cap_held), so the arenas grow back to the new cap and no further.
 *
 * Solo (arenas_auto=1): the arenas' path costs a pair some 17 instructions
 * more than a pool without arenas (the thread's arena, from its memo,
 * twice; one more frame), which a program with one
 * allocating thread pays for nothing. So in such a pool the first arena
 * made (by the first allocation, on the calling thread's arena) runs solo:
 * pool->hot points at it, and mp_pool_alloc and mp_pool_free read hot (one
 * load, which a pool without arenas pays too: its hot is itself) and run
 * their plain path on that arena, from any thread, under its lock. Every
 * other call takes the arenas' path, which finds the solo arena there too
 * for the thread that made it. When threads contend for the solo arena's
 * lock (mp__pool_lock_wait counts the contended takes: MP__SOLO_WAITS of
 * them), or another arena is made, solo ends in the lane (below): every
 * other thread takes the arenas' path and its own arena. The solo arena
 * keeps its blocks and cache for the thread that made it, usually the one
 * that allocates most; the others borrow from it as from any idle arena.
 * (Arena 0 ran solo
 * before 2026-12-01, whichever thread came first: where no thread was
 * numbered 0 mod N, as for worker threads started after others had used
 * arenas, every thread's large requests borrowed from it after the switch
 * and freed back into it, under its lock: 1 443 to 10 686 loans in 300 000
 * pairs a thread against 5 to 8 for arenas=8, bench_pool_threads.) A
 * thread that read hot just before the switch finishes its call on the
 * solo arena, as the arenas' path may have it do: it is an arena like the
 * others (but an allocation there once a stream is marked capturing, which
 * only a graph pool made after the switch does, goes to the arenas' path:
 * mp__pool_alloc_rare). A free of a block of another arena can only come after
 * that arena was made, and making any other arena ends solo first (another
 * thread's first allocation on the arenas' path, or the calls that take
 * that path while solo, such as mp_pool_alloc_contiguous or a child pool's
 * range), so no free runs solo on a pointer the solo arena does not hold
 * (release / acquire). What the solo arena's plain path would not see:
 * the arenas' out-of-memory path (a failure there goes on to it,
 * mp__arena_solo_failed: the pool's handler), the cap's shares (the solo
 * arena holds the whole cap, also after mp_pool_set_max_fraction) and a
 * stream routed to a graph pool (a graph pool made of the pool ends solo,
 * or keeps it from starting). A pause needs nothing: it holds the solo
 * arena's growth and pauses it as any arena, and the arena's own paused
 * flag refuses its plain path.
 *
 * The lane (since 2026-12-02): when solo ends, hot stays the solo arena,
 * and its gate (pool->gate, which a pool without arenas reads as NULL
 * where it read its arenas before) sends every thread to the arenas' path
 * but the one that made the arena (gate_owner, its thread pointer: one
 * load, where a thread-local's address in the shared library is a call).
 * That thread keeps the plain path, some 17 instructions a pair shorter
 * than the arenas' (count_pairs.sh: arenas=1 against the plain pool), so
 * that a program whose main thread allocates beside helper threads keeps
 * the main thread's speed once a helper shows up. Its frees may now meet
 * other arenas' blocks: a pointer outside the lane arena's segments misses
 * its live map, and the miss (MP__EFORWARD, pool.c's
 * mp__pool_free_forward) looks for it in the other arenas before it is an
 * error, once (as every arena's free does; the arena found frees it
 * without a forward of its own). Its
 * allocations grow the arena where the arenas' path would first borrow
 * from an idle arena; its failures take the arenas' out-of-memory path,
 * which asks for a share of the cap (mp__arena_solo_failed), as solo's.
 * A pool in the lane has left solo: the solo arena no longer takes the
 * whole cap at mp_pool_set_max_fraction, and a graph pool ends the lane
 * as it ends solo (mp__arena_solo_never: hot becomes the pool). Which
 * thread owns the lane is a matter of speed only: any thread may run the
 * plain path of any arena, as one that read hot just before a switch
 * does. */
#include <stdlib.h>

#include "pool_internal.h"

/* 0: the thread has used no arena yet; else its number k + 1. */
_Thread_local unsigned mp__arena_thread;
_Thread_local mp__arena_memo_t mp__arena_memo;

mp_pool_t *mp__arena_memo_miss(mp_pool_t *pool) {
  size_t i = mp__arena_index(pool, SIZE_MAX);
  mp_pool_t *a = i != SIZE_MAX ? mp__arena_at(pool, i) : NULL;
  if (a != NULL)
    mp__arena_memo = (mp__arena_memo_t){pool->serial, a};
  return a;
}
static _Atomic unsigned mp__arena_threads;

static void mp__arena_number(void) {
  unsigned k =
      atomic_fetch_add_explicit(&mp__arena_threads, 1, memory_order_relaxed);
  mp__arena_thread = k % (1u << 30) + 1;
}

static mp_status_t mp__arena_make(mp_pool_t *pool, size_t i, mp_pool_t **out);
static void mp__arena_share(mp_pool_t *pool, mp_pool_t *a, bool all);

/* arenas_auto=1: the first arena made runs solo (the opening comment).
 * Not with a history (each arena's ring, and the stacks' caller, come from
 * the arenas' path) or a release threshold (split among the arenas): their
 * pools take no plain path anyway. */
static void mp__arena_solo_start(mp_pool_t *pool) {
  pool->solo_next = (pool->cfg.flags & MP_POOL_ARENAS_AUTO) &&
                    pool->cfg.history == 0 && pool->cfg.release_threshold == 0;
}

mp_status_t mp__arenas_init(mp_pool_t *pool) {
  pool->arenas = mp__host_calloc(pool->cfg.arenas, sizeof *pool->arenas);
  if (pool->arenas == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for %zu arenas",
                    pool->cfg.arenas);
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    atomic_init(&pool->arenas[i].pool, NULL);
  atomic_store_explicit(&pool->gate, pool, memory_order_relaxed);
  mp__arena_solo_start(pool);
  return MP_OK;
}

/* No lock held: arena i made (its virtual range reserved, the streams
 * given to mp_pool_add_stream known) and published. The new pool is made
 * and, if unused, freed with the pool's lock dropped: both take the
 * device's watcher lock, which mp_stream_forget holds while it takes each
 * pool's lock (device.c's order). */
static mp_status_t mp__arena_make(mp_pool_t *pool, size_t i, mp_pool_t **out) {
  /* Under the lock: mp_pool_set_max_fraction writes it. */
  mp__pool_lock(pool);
  mp_pool_config_t cfg = pool->cfg;
  mp__pool_unlock(pool);
  cfg.arenas = 0;
  /* The pool's idle memory, split evenly (0 would mean keep all). */
  if (cfg.release_threshold > 0) {
    cfg.release_threshold /= pool->cfg.arenas;
    cfg.release_threshold += cfg.release_threshold == 0;
  }
  mp_pool_t *a;
  mp_status_t st = mp__pool_new(pool->dev, &cfg, &a);
  if (st != MP_OK)
    return st;
  mp__pool_lock(pool);
  /* Paused (or being paused or resumed, pause.c): an arena made now would
   * allocate from memory the pool gave back. */
  if ((*out = mp__arena_at(pool, i)) != NULL ||
      (st = mp__pool_paused(pool, "allocation")) != MP_OK) {
    /* another thread made it meanwhile, or refused */
    mp__pool_unlock(pool);
    mp__pool_free_host(a);
    return st;
  }
  a->arena = true;
  a->arena_of = pool;
  a->arena_index = (uint32_t)i;
  a->cap = pool->cap;
  a->va_basis = pool->va_basis; /* its virtual range's size (vrange.c) */
  a->cap_is_max = pool->cap_is_max;
  a->granule = pool->granule;
  /* The peers given to mp_pool_set_access, before anything is mapped. */
  unsigned np = atomic_load(&pool->npeers);
  for (unsigned k = 0; k < np; k++)
    a->peers[k] = pool->peers[k];
  atomic_store_explicit(&a->npeers, np, memory_order_release);
  mp__pool_lock(a);
  if ((cfg.flags & MP_POOL_VIRTUAL) && a->granule != 0) {
    st = mp__vrange_ready(a);
    /* ENOTSUP: plain segments then; a host failure is MP_ENOMEM to the
     * caller (its message kept), as the ladder's. */
    st = st == MP_ENOTSUP ? MP_OK : st == MP__EHOST ? MP_ENOMEM : st;
  }
  /* Each with its owner: a per-thread stream is the adding thread's, not
   * this one's. */
  for (uint32_t k = 0; st == MP_OK && k < pool->nstreams; k++) {
    uint32_t sidx;
    const mp__strm_t *ps = &pool->streams[k];
    if (ps->gone)
      continue;
    /* A slot that only carries capture marks is copied as such. */
    if (!ps->mark_only)
      st = mp__stream_index_owned(a, ps->s, ps->owner, &sidx);
    /* A stream routed to a graph pool is marked capturing in every arena,
     * this one too (graph.c keeps the pool's own marks for it), so that
     * the arena's cache is off for it and nothing is recorded on it. */
    for (uint32_t m = 0; st == MP_OK && m < ps->capturing; m++)
      st = mp__stream_capture_mark_owned(a, ps->s, ps->owner, true, true);
  }
  /* A capped pool's arena starts with no share: its first allocation asks
   * for one (mp__arena_share). */
  if (a->cap_is_max)
    a->cap = 0;
  mp__pool_unlock(a);
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    (void)mp__segment_release_all(a); /* st says why it failed */
    mp__pool_free_host(a);
    return st;
  }
  if (a->vseg != NULL) {
    pool->arenas[i].vbase = a->vseg->base;
    pool->arenas[i].vsize = a->vseg->va_size;
  }
  /* Solo (arenas_auto=1), only the solo arena may hold blocks: the solo
   * free looks nowhere else. An arena made beside it (another thread's
   * first allocation, the arenas' path of mp_pool_alloc_contiguous, a
   * child pool's range, a movable block) ends solo before it is
   * published, so that any block it holds is freed after the switch
   * (release). The first arena made runs solo: published before hot
   * points at it, so that the arenas' path finds it once solo ends. */
  bool solo = pool->solo_next;
  pool->solo_next = false;
  if (!solo)
    mp__arena_lane(pool);
  atomic_store_explicit(&pool->arenas[i].pool, a, memory_order_release);
  if (solo) {
    mp__arena_share(pool, a, true);
    /* The lane's owner once solo ends: the thread that made it. */
    atomic_store_explicit(&a->gate_owner, mp__thread_self(),
                          memory_order_relaxed);
    atomic_store_explicit(&a->solo_of, pool, memory_order_relaxed);
    atomic_store_explicit(&pool->hot, a, memory_order_release);
  }
  mp__pool_unlock(pool);
  *out = a;
  return MP_OK;
}

/* Under arena a's lock: a cut arena is cut while it reserved more than
 * its share or has a growth in flight (checked against an older share),
 * and stays so; any other arena reserved at most its share. A paused
 * arena reads 0 reserved: it keeps its mark for the resume. */
static void mp__arena_cut_settle(mp_pool_t *a) {
  if (a->paused)
    return;
  a->cap_cut = a->st.reserved_bytes > a->cap || (a->cap_cut && a->inflight);
  if (!a->inflight)
    a->cap_held = 0;
}

/* Under arena b's lock: what b may hold, for another arena's share: the
 * larger of its share and what it reserved (with a defragmentation's
 * staging buffer, or what it maps back at its resume when paused), and
 * while a growth checked against an older share is in flight, that
 * share. */
static size_t mp__arena_may_hold(const mp_pool_t *b, size_t r) {
  size_t h = r > b->cap ? r : b->cap;
  return b->inflight && b->cap_held > h ? b->cap_held : h;
}

void mp__arena_recap(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  atomic_fetch_add_explicit(&pool->share_seq, 1, memory_order_acq_rel);
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    a->cap_is_max = pool->cap_is_max;
    a->cap = pool->cap_is_max ? 0 : pool->cap;
    /* A growth in flight was checked against the old share: the other
     * arenas' shares count what the arena holds once it lands (not that
     * whole share, which for a pool that had no cap was the device's
     * size: the other arenas could then not grow at all meanwhile). */
    a->cap_held =
        a->inflight ? a->st.reserved_bytes + a->staged + a->grow_inflight : 0;
    size_t r = a->paused ? a->paused_reserved : a->st.reserved_bytes;
    a->cap_cut = r > a->cap || a->inflight;
    mp__pool_unlock(a);
  }
  atomic_fetch_add_explicit(&pool->share_seq, 1, memory_order_acq_rel);
  /* Solo, the solo arena asks for no share (its plain path does not): it
   * takes the whole new cap at once. */
  mp_pool_t *solo = mp__pool_hot(pool);
  if (solo != pool &&
      atomic_load_explicit(&solo->solo_of, memory_order_relaxed) != NULL)
    mp__arena_share(pool, solo, true);
}

/* Half of the room left, rounded up to arena a's granule, at most all of
 * it: a share that is no whole number of granules left the arena unable to
 * map its last granule below it, and a request that fitted took a plain
 * segment (which no pause can keep) though the cap itself was whole
 * granules (34 MiB, 17 granules: shares of 17 MiB). */
static size_t mp__arena_half(const mp_pool_t *a, size_t left) {
  size_t half = left / 2;
  if (a->granule != 0)
    half = mp__round_up(half, a->granule);
  return half < left ? half : left;
}

/* Under the pool's lock: takes back every other arena's unused share of
 * the cap, and gives arena a what is left (all of it, or half). Another
 * arena's share is lowered to what it reserved, or with a growth in
 * flight to what it holds once that lands; one with a release in flight,
 * and a itself with either, keeps its share. Neither is waited for. A
 * release synchronizes the device (a plain segment's free, as cuMemFree),
 * which waits for host functions, and one of them may be waiting for this
 * lock, or be this share (a new arena's first allocation). */
static void mp__arena_share(mp_pool_t *pool, mp_pool_t *a, bool all) {
  MP__ASSERT_LOCKED(pool);
  /* Lifted to no limit since the caller looked (every arena has the
   * device's size then). */
  if (!pool->cap_is_max)
    return;
  atomic_fetch_add_explicit(&pool->share_seq, 1, memory_order_acq_rel);
  size_t held = 0;
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *b = mp__arena_at(pool, i);
    if (b == NULL || b == a)
      continue;
    mp__pool_lock(b);
    /* A paused arena reads 0 reserved: it counts at, and its share is
     * lowered to, what its resume maps back (paused_reserved; nothing
     * grows while paused). Kept whole, its share left an arena resumed
     * before it (running while the resume finishes the others, or beside
     * those a failed undo left paused) MP_ELIMIT with room under the cap. A
     * cut one keeps its lower share, and counts what it reserved. One
     * with a growth in flight (checked against its share, maybe the whole
     * cap: the solo arena's) keeps what it holds once the growth lands,
     * and no more: kept whole, it left no room for a new arena's first
     * request until the growth landed (two threads' first allocations in
     * a capped arenas_auto=1 pool). One with a release in flight keeps
     * its share: an unmap the device refuses takes its chunk back. */
    size_t r =
        b->paused ? b->paused_reserved : b->st.reserved_bytes + b->staged;
    size_t grow = b->inflight ? b->grow_inflight : 0;
    size_t will = mp__add_sat(r, grow);
    if ((b->paused || !b->inflight || grow != 0) && will < b->cap)
      b->cap = will;
    mp__arena_cut_settle(b);
    size_t h = mp__arena_may_hold(b, r);
    held = mp__add_sat(held, h);
    mp__pool_unlock(b);
  }
  /* Nor is a's own growth or release waited for (another thread sharing
   * the arena may hold one, whose device call waits for a host function
   * that waits for this lock): with one in flight a's share only grows,
   * which that growth's check against the old share still respects. Its
   * old share fits in room (the shares added up to at most the cap). */
  mp__pool_lock(a);
  size_t room = pool->cap > held ? pool->cap - held : 0;
  size_t r = a->st.reserved_bytes + a->staged;
  size_t cap = all || room <= r ? room : r + mp__arena_half(a, room - r);
  /* Paused meanwhile (its failure was out of memory): a keeps its share.
   * Less room than a reserved: only after a cut (the shares added up to
   * at most the cap otherwise), and a stays cut. */
  if (!a->paused)
    a->cap = a->inflight && a->cap > cap ? a->cap : cap;
  mp__arena_cut_settle(a);
  mp__pool_unlock(a);
  atomic_fetch_add_explicit(&pool->share_seq, 1, memory_order_acq_rel);
}

/* Gives arena a's cached memory back until at most keep bytes of it stay
 * (as mp_pool_trim: synchronize, then trim); *left: its free bytes after;
 * *gave: the reserved bytes it gave back. for_oom: a trim for another
 * arena's out-of-memory path (mp__arena_reclaim_retry). */
static mp_status_t mp__arena_trim_one(mp_pool_t *a, size_t keep, size_t *left,
                                      size_t *gave, bool for_oom) {
  mp_status_t st = MP_OK;
  *gave = 0;
  /* The retries below ignore a refusal (the next trim tries again), and a
   * trim that succeeds leaves the caller's last error as it was (status.h:
   * a success does not replace it), as mp__pool_trim_marked does. */
  mp__error_kept_t was;
  mp__error_keep(&was);
  (void)mp__defrag_stage_retry(a); /* as mp_pool_trim */
  mp__pool_lock(a);
  /* A paused arena has nothing mapped to give back (its free bytes read
   * 0 too). */
  /* Held blocks whose importers let go are free to give back too. */
  if (!a->paused && a->nexports > 0)
    mp__export_reap(a);
  if (!a->paused && mp__free_bytes(a) > keep) {
    st = mp__pool_sync(a);
    /* For another arena's out-of-memory path: beside a capture, the wait
     * that its own ladder makes then (mp__pool_sync_partial), so that
     * memory freed here while other streams still used it goes back. An
     * mp_pool_trim stays refused. */
    if (st != MP_OK && for_oom && a->ncapturing > 0)
      st = mp__pool_sync_partial(a);
    size_t before = a->st.reserved_bytes;
    if (st == MP_OK)
      st = mp__segment_trim(a, keep, "mp_pool_trim");
    /* At least (growth may run while a release has the lock down). */
    if (before > a->st.reserved_bytes)
      *gave = before - a->st.reserved_bytes;
  } else if (!a->paused) {
    (void)mp__vrange_strays_retry(a); /* as mp_pool_trim */
  }
  *left = mp__free_bytes(a);
  mp__pool_unlock(a);
  if (st == MP_OK)
    mp__error_give_back(&was);
  return st;
}

/* Without the pool's lock: each arena's synchronization waits for its
 * streams, whose host functions may call into the pool (make an arena,
 * reclaim, read the stats under the lock). Trim moves no share of the cap
 * (it lowers reserved bytes only), and the arena table is fixed. */
mp_status_t mp__arena_trim(mp_pool_t *pool, size_t keep_bytes) {
  mp_status_t st = mp__pool_paused_now(pool, "mp_pool_trim");
  if (st != MP_OK)
    return st;
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    size_t left = 0, gave;
    if (a == NULL)
      continue;
    mp_status_t s = mp__arena_trim_one(a, keep_bytes, &left, &gave, false);
    st = st == MP_OK ? s : st;
    keep_bytes -= left < keep_bytes ? left : keep_bytes;
  }
  return st;
}

mp_status_t mp__arena_add_stream_locked(mp_pool_t *pool, mp_stream_t s) {
  MP__ASSERT_LOCKED(pool);
  uint32_t sidx;
  /* The pool's own table remembers it for arenas made later. */
  mp_status_t st = mp__pool_paused(pool, "mp_pool_add_stream");
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  for (size_t i = 0;
       st == MP_OK && pool->arenas != NULL && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    st = mp__stream_index(a, s, &sidx);
    mp__pool_unlock(a);
  }
  return st;
}

mp_status_t mp__arena_add_stream(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  mp_status_t st = mp__arena_add_stream_locked(pool, s);
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp__arena_check(mp_pool_t *pool) {
  mp__pool_lock(pool);
  size_t caps = 0, reserved = 0;
  bool cut = false;
  mp_status_t st = MP_OK;
  for (size_t i = 0; st == MP_OK && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    /* Not waiting for a growth or release in flight (whose device call may
     * wait for a host function that waits for the pool's lock): neither
     * lifts reserved above the arena's share, nor is a share lowered
     * meanwhile, so both bounds hold at any moment under the lock. */
    mp__pool_lock(a);
    if (pool->cap_is_max && a->st.reserved_bytes > a->cap && !a->cap_cut)
      st = mp__fail(MP_ECORRUPT,
                    "pool check: arena %zu reserved %zu bytes, above its "
                    "share of the cap (%zu)",
                    i, a->st.reserved_bytes, a->cap);
    caps += a->cap;
    reserved += a->st.reserved_bytes;
    cut = cut || a->cap_cut;
    mp__pool_unlock(a);
  }
  /* A cut arena may hold more than the lowered cap (mp__arena_recap). */
  if (st == MP_OK && pool->cap_is_max &&
      (caps > pool->cap || (reserved > pool->cap && !cut)))
    st = mp__fail(MP_ECORRUPT,
                  "pool check: the arenas' shares add up to %zu bytes and "
                  "their reserved to %zu, above the cap (%zu)",
                  caps, reserved, pool->cap);
  mp__pool_unlock(pool);
  return st;
}

mp_pool_t *mp__arena_owner_slow(mp_pool_t *pool, uintptr_t p, size_t mine) {
  size_t n = pool->cfg.arenas;
  /* The calling thread's arena was looked at (mp__arena_owner). */
  for (size_t k = 1; k < n; k++) {
    size_t i = mine + k < n ? mine + k : mine + k - n;
    mp_pool_t *a = mp__arena_holding(pool, i, p);
    if (a != NULL)
      return a;
  }
  /* Plain segments: a block starting at p in an arena's live map (a hash
   * probe; a walk of the segment list would cost as many steps as there
   * are large blocks), then (not a live block's start: an interior,
   * freed or foreign pointer, or base_alloc's) the arena whose segments
   * hold p, so that its own path says what p is. */
  for (int walk = 0; walk < 2; walk++)
    for (size_t k = 0; k < n; k++) {
      size_t i = mine + k < n ? mine + k : mine + k - n;
      mp_pool_t *a = mp__arena_at(pool, i);
      if (a == NULL)
        continue;
      mp__pool_lock(a);
      bool in = walk ? mp__segment_containing(a, p) != NULL
                     : mp__map_find(a, p) != NULL;
      mp__pool_unlock(a);
      if (in)
        return a;
    }
  return NULL;
}

static bool mp__arena_oom(mp_status_t st) {
  return st == MP_ENOMEM || st == MP_ELIMIT;
}

/* The pool's cap, and whether it is a limit (*is_max), read under its
 * lock: mp_pool_set_max_fraction moves both. */
static size_t mp__arena_pool_cap(mp_pool_t *pool, bool *is_max) {
  mp__pool_lock(pool);
  size_t cap = pool->cap;
  *is_max = pool->cap_is_max;
  mp__pool_unlock(pool);
  return cap;
}

/* A request on the arenas' path: an allocation of bytes on s, or (sizes
 * set) mp_pool_alloc_contiguous's count pieces, bytes in all once rounded.
 * claim (an allocation of bytes only): run under the lock of the arena the
 * block became live in, before that lock is dropped (see
 * mp__arena_claim_t); *owner, if set, is then that arena. */
typedef struct mp__arena_req {
  size_t bytes;
  mp_stream_t s;
  void **out;
  size_t count;
  const size_t *sizes;
  mp__arena_claim_t claim;
  void *claim_ctx;
  mp_pool_t **owner;
  bool any; /* a graph pool's range: mp__pool_alloc_locked_done */
} mp__arena_req_t;

/* q (bytes, not pieces) in arena a, under its lock. */
static mp_status_t mp__arena_req_locked(mp_pool_t *a,
                                        const mp__arena_req_t *q) {
  return q->any ? mp__pool_alloc_locked_done(a, q->bytes, q->s, q->out)
                : mp__pool_alloc_locked(a, q->bytes, q->s, q->out);
}

/* The claim of a graph pool's range (mp__arena_graph_borrow). */
static mp_status_t mp__arena_lend(mp_pool_t *lender, void *const *out,
                                  void *loan);

/* Under x's lock, the request's block just made live in x: its claim, and
 * x as its owner. A claim that fails has given the block back. */
static mp_status_t mp__arena_claimed(mp_pool_t *x, const mp__arena_req_t *q) {
  if (q->owner != NULL)
    *q->owner = x;
  return q->claim != NULL ? q->claim(x, q->out, q->claim_ctx) : MP_OK;
}

/* st, an MP_ENOMEM of the calling thread's that counted no out-of-memory
 * failure since seen (mp__oom_seen then), as MP__EHOST: host memory ran
 * out, not the device. */
static mp_status_t mp__arena_host(mp_status_t st, uint64_t seen) {
  return st == MP_ENOMEM && mp__oom_seen == seen ? MP__EHOST : st;
}

/* One more try of q in arena a after a failed one, whose failure no longer
 * counts (an allocation that fails counts once in oom_count); MP__EHOST
 * for a host failure. */
static mp_status_t mp__arena_retry(mp_pool_t *a, const mp__arena_req_t *q) {
  uint64_t seen = mp__oom_seen;
  mp__pool_lock(a);
  if (!mp__oom_quiet && a->st.oom_count > 0)
    a->st.oom_count--;
  mp_status_t st;
  if (q->sizes != NULL) {
    mp__pool_unlock(a); /* the call takes it */
    st = mp__pool_alloc_pieces(a, q->count, q->sizes, q->s, q->out);
  } else {
    st = mp__arena_req_locked(a, q);
    if (st == MP_OK)
      st = mp__arena_claimed(a, q);
    mp__pool_unlock(a);
  }
  return mp__arena_host(st, seen);
}

/* Rounds of reclaim and retry at most, in one reclaim step. */
#define MP__ARENA_RECLAIM_ROUNDS 4

/* Under no lock: one reclaim step for arena a, then its retry. deep 0:
 * (capped pools) the other arenas' unused share comes back and a gets half
 * of what is left; 1: every other arena is trimmed too and a gets all the
 * room; 2: no reclaim (more than the whole pool may hold), just the retry.
 * The trims and the retry run without the pool's lock: they wait for
 * streams (the other arenas' trims, a's own ladder), whose host functions
 * may call into the pool (make an arena, ask for a share).
 * From a host function there are no trims: a trim waits for the arena's
 * device call or synchronization in flight (mp__pool_wait_sync), and a
 * plain segment's free there (release_threshold, another thread's trim)
 * waits for the host functions queued on the streams (cuMemFree "may
 * perform implicit synchronization", cuda.h; the host device's free
 * synchronizes the device), this one too: neither returned. Nor could a
 * trim give anything back there (its synchronization and frees are device
 * calls, refused). The share moves no memory and waits for nothing, so it
 * still runs; what it cannot find is MP_ELIMIT (MP_ENOMEM) as anywhere. */
static mp_status_t mp__arena_reclaim_retry(mp_pool_t *pool, mp_pool_t *a,
                                           int deep, const mp__arena_req_t *q) {
  bool share;
  (void)mp__arena_pool_cap(pool, &share);
  share = share && deep < 2;
  bool trim = deep == 1 && !mp__pool_in_host_fn(pool);
  for (int round = 1;; round++) {
    size_t gave = 0;
    for (size_t i = 0; trim && i < pool->cfg.arenas; i++) {
      mp_pool_t *b = mp__arena_at(pool, i);
      size_t left, g;
      if (b != NULL && b != a &&
          mp__arena_trim_one(b, 0, &left, &g, true) == MP_OK)
        gave += g;
    }
    uint64_t seq = 0;
    if (share) {
      mp__pool_lock(pool);
      mp__arena_share(pool, a, deep == 1);
      seq = atomic_load_explicit(&pool->share_seq, memory_order_acquire);
      mp__pool_unlock(pool);
    }
    mp_status_t st = mp__arena_retry(a, q);
    if (!mp__arena_oom(st) || round == MP__ARENA_RECLAIM_ROUNDS)
      return st;
    /* Again, while something may have overtaken the retry: another
     * arena's slow path took back the share just given before it was
     * used (arenas at the cap stealing from each other), or another
     * arena's fast path grew into what the trims gave back (while a later
     * trim waited for its streams) and cached it again. */
    bool moved = share && atomic_load_explicit(&pool->share_seq,
                                               memory_order_acquire) != seq;
    if (!moved && (deep != 1 || gave == 0))
      return st;
  }
}

/* The arena's allocation failed with st: reclaim across arenas and retry
 * (the opening comment's order), then the pool's out-of-memory handler.
 * seen: mp__oom_seen before the allocation. A failure for host memory (no
 * out-of-memory failure counted: the first or a retry's) stops there with
 * its own message, MP__EHOST to the caller, as it stops a pool's ladder:
 * no reclaim or handler frees host memory. */
static mp_status_t mp__arena_alloc_oom(mp_pool_t *pool, mp_pool_t *a,
                                       const mp__arena_req_t *q,
                                       mp_status_t st);
static mp_status_t mp__arena_borrow(mp_pool_t *pool, size_t mine,
                                    const mp__arena_req_t *q, bool wait);
/* mp__arena_alloc_oom, for a's failure st: a failure that it recovers
 * from (a capped arena's first try, which has no share yet; a block
 * borrowed or a share given on the out-of-memory path; the handler's
 * retry) is no failure of this call: status.h, a success leaves the
 * caller's last error as it was, which mp__pool_oom kept when it wrote
 * a's failure (copied now: the handler's own allocations may fail). */
static mp_status_t mp__arena_oom_path(mp_pool_t *pool, mp_pool_t *a,
                                      const mp__arena_req_t *q,
                                      mp_status_t st) {
  mp__error_saved_t before;
  bool told = mp__pool_oom_last(a);
  if (told)
    mp__pool_oom_before(&before);
  st = mp__arena_alloc_oom(pool, a, q, st);
  if (st == MP_OK && told)
    mp__error_restore(&before);
  return st;
}

static mp_status_t mp__arena_alloc_slow(mp_pool_t *pool, mp_pool_t *a,
                                        const mp__arena_req_t *q,
                                        mp_status_t st, uint64_t seen) {
  st = mp__arena_host(st, seen);
  if (!mp__arena_oom(st))
    return st;
  return mp__arena_oom_path(pool, a, q, st);
}

mp_status_t mp__arena_solo_failed(mp_pool_t *a, size_t bytes, mp_stream_t s,
                                  void **out, mp_status_t st) {
  /* Host memory (no out-of-memory failure counted) stops here, as in a
   * pool without arenas. */
  if (!mp__arena_oom(st) || !mp__pool_oom_last(a))
    return st;
  /* The lane ("The lane"): the plain path refuses a request above a's
   * share of the cap before it looks in a's cache, which the arenas' path
   * serves whatever the share; a cap lowered below what the other arenas
   * hold (mp__arena_recap) left a none, and the lane's thread failed with
   * MP_ELIMIT beside a cached block that any other thread got. Its cache
   * first, as there (the failure then no longer counts, as
   * mp__arena_retry's, nor says the last error: mp__pool_oom_give_back).
   * Solo, a holds the whole cap, as a pool without arenas. */
  if (atomic_load_explicit(&a->solo_of, memory_order_relaxed) == NULL) {
    mp__pool_lock(a);
    mp_status_t c = mp__pool_alloc_cached_rec(a, bytes, s, out, false, false);
    if (c == MP_OK && !mp__oom_quiet && a->st.oom_count > 0)
      a->st.oom_count--;
    mp__pool_unlock(a);
    if (c == MP_OK) {
      mp__pool_oom_give_back();
      return MP_OK;
    }
  }
  return mp__status_out(mp__arena_oom_path(
      a->arena_of, a, &(mp__arena_req_t){.bytes = bytes, .s = s, .out = out},
      st));
}

/* mp__arena_alloc_slow once st is the device's (or the cap's) refusal. */
static mp_status_t mp__arena_alloc_oom(mp_pool_t *pool, mp_pool_t *a,
                                       const mp__arena_req_t *q,
                                       mp_status_t st) {
  size_t bytes = q->bytes;
  /* First the loans the miss path passed over because their lender's lock
   * was held at that moment (mp__arena_borrow), its lock waited for now:
   * with plain segments a cached block in a segment still partly used
   * cannot be trimmed, and whether the request failed would depend on
   * that moment. */
  mp_status_t lent = mp__arena_borrow(pool, mp__arena_mine(pool), q, true);
  if (lent != MP__EMISS) {
    /* The request's answer is the loan's: a's failure no longer counts
     * (as mp__arena_retry). */
    mp__pool_lock(a);
    if (!mp__oom_quiet && a->st.oom_count > 0)
      a->st.oom_count--;
    mp__pool_unlock(a);
    return lent;
  }
  /* More than the whole pool may hold: no reclaim would help. */
  bool is_max;
  size_t cap = mp__arena_pool_cap(pool, &is_max);
  int deep = bytes > cap ? 2 : is_max ? 0 : 1;
  for (; deep < 2 && mp__arena_oom(st); deep++)
    st = mp__arena_reclaim_retry(pool, a, deep, q);
  if (!mp__arena_oom(st))
    return st;
  mp__pool_lock(pool);
  mp_pool_oom_handler_t fn = pool->oom_fn;
  void *ctx = pool->oom_ctx;
  const char *cap_name =
      pool->cfg.max_fraction > 0 ? "pool max_fraction" : "pool max_bytes";
  mp__pool_unlock(pool);
  /* A graph pool's range: asked once in the graph pool's allocation, whose
   * ladder may borrow again (mp__graph_ask). */
  if (q->claim == mp__arena_lend && !mp__graph_ask(st))
    fn = NULL;
  /* What the handler freed went to the arenas holding it (their cache,
   * their share of the cap): the retry reclaims it as the full step does. */
  if (fn != NULL && mp__oom_call(pool, fn, bytes, st, ctx) != 0)
    st = mp__arena_reclaim_retry(pool, a, bytes > cap ? 2 : 1, q);
  if (!mp__arena_oom(st))
    return st;
  /* The arena's message named its own figures: name the pool's. The
   * history's oom event (the arenas' failures were not recorded) goes to
   * a's ring, with what the pool could still reserve. */
  mp_stats_t sum;
  char as[32], r[32], al[32], lf[32], note[320];
  mp__stats_read(pool, &sum);
  size_t room = cap > sum.reserved_bytes ? cap - sum.reserved_bytes : 0;
  mp__pool_lock(a);
  if (!mp__oom_quiet)
    MP__HIST(a, MP__H_OOM, room, bytes, (uintptr_t)q->s);
  /* A virtual range that has no place left is a's (under its lock): the
   * pool has none of its own, and asked, read as the device's refusal. */
  snprintf(note, sizeof note, "%s",
           mp__pausable_note(st == MP_ENOMEM ? a : pool, st, bytes, room));
  mp__pool_unlock(a);
  return mp__fail(st,
                  "%s%s: asked %s; the pool's %zu arenas reserved %s, "
                  "allocated %s, largest free block %s%s",
                  st == MP_ELIMIT ? "" : "out of ",
                  st == MP_ELIMIT ? cap_name
                                  : mp__device_memory_name(pool->dev),
                  mp__fmt_bytes(as, sizeof as, bytes), pool->cfg.arenas,
                  mp__fmt_bytes(r, sizeof r, sum.reserved_bytes),
                  mp__fmt_bytes(al, sizeof al, sum.allocated_bytes),
                  mp__fmt_bytes(lf, sizeof lf, sum.largest_free_bytes), note);
}

/* No lock held: a request of at least MP__LARGE_ROUND that mine cannot
 * serve from its cache, served from what another arena caches before mine
 * runs its out-of-memory path (its wait for its own pending blocks, its
 * growth): memory one
 * thread freed serves another thread's next large request, as in a pool
 * without arenas (a training step's backward pass, on a thread of its own,
 * reuses what its forward pass freed). Only an idle arena lends: at least
 * half of what it reserved free, and its lock free at the moment it is
 * asked (not waited for: a held lock is its own thread at work). Threads
 * busy with blocks of their own keep to their arenas, and taking each
 * other's blocks would bring back the shared lock's traffic (two threads
 * doing pairs ran at 0.9x one thread when every arena lent). The lock test
 * is for an arena with much free memory whose own thread is at work: the
 * solo arena of a pool that left solo (arenas_auto=1) holds what every
 * thread freed before, and two threads doing pairs ran at 0.98x one
 * thread with one of them taking its large blocks from the other's arena,
 * waiting for its lock; 1.58x with the test (bench_pool_threads, medians of
 * nine; arenas=8 1.87x and 1.78x in the same runs). A thread that allocates
 * while another frees what it allocated (bench_pool_handoff) borrows as before:
 * the arenas=2 row 1.244 with and without it (a rule on the lender's
 * allocations since the last loans, instead of its lock, gave 1.323 and
 * 1.583 there). The out-of-memory path (mp__arena_alloc_oom) asks again,
 * waiting for each lender's lock, before it fails: whether a request fails
 * must not depend on the moment (with plain segments a lender's cached
 * block in a segment still in use cannot be trimmed). Smaller requests never
 * borrow: growth for one costs at most a granule. The arenas after mine in
 * turn, one lock at a time, the block taken as it is (no growth, no wait);
 * MP__EMISS when none can. An arena learns the request's stream only when it
 * lends (see mp__pool_alloc_cached). The block stays that arena's (its range,
 * its live map): a free from any thread finds it there. */
static mp_status_t mp__arena_borrow(mp_pool_t *pool, size_t mine,
                                    const mp__arena_req_t *q, bool wait) {
  size_t n = pool->cfg.arenas;
  if (q->bytes < MP__LARGE_ROUND || q->sizes != NULL)
    return MP__EMISS;
  for (size_t k = 1; k < n; k++) {
    mp_pool_t *b = mp__arena_at(pool, mine + k < n ? mine + k : mine + k - n);
    if (b == NULL)
      continue;
    if (wait)
      mp__pool_lock(b);
    else if (!mp__pool_trylock(b))
      continue; /* busy now */
    mp_status_t st =
        mp__free_bytes(b) >= b->st.allocated_bytes
            ? mp__pool_alloc_cached_rec(b, q->bytes, q->s, q->out, true, q->any)
            : MP__EMISS;
    if (st == MP_OK)
      st = mp__arena_claimed(b, q);
    mp__pool_unlock(b);
    if (st != MP__EMISS)
      return st;
  }
  return MP__EMISS;
}

mp_status_t mp__arena_mine_made(mp_pool_t *pool, mp_pool_t **out) {
  if (MP__UNLIKELY(mp__arena_thread == 0))
    mp__arena_number();
  size_t i = mp__arena_mine(pool);
  if ((*out = mp__arena_at(pool, i)) != NULL)
    return MP_OK;
  return mp__arena_make(pool, i, out);
}

/* mp__arena_alloc_miss for request q (bytes, not pieces). */
static mp_status_t mp__arena_miss(mp_pool_t *pool, mp_pool_t *a,
                                  const mp__arena_req_t *q) {
  mp_status_t st;
  /* An arena with an event history missed its cache on purpose (the fast
   * path leaves the history out): its cache, recorded, first. (The ring
   * is made before the arena is published and kept until it is
   * destroyed: read without the lock.) */
  if (a->hist.ev != NULL) {
    mp__pool_lock(a);
    st = mp__pool_alloc_cached_rec(a, q->bytes, q->s, q->out, false, q->any);
    if (st == MP_OK)
      st = mp__arena_claimed(a, q);
    mp__pool_unlock(a);
    if (st != MP__EMISS)
      return st;
  }
  /* Before a grows (or waits for its streams): a block another arena
   * caches. */
  st = mp__arena_borrow(pool, mp__arena_mine(pool), q, false);
  if (st != MP__EMISS)
    return st;
  uint64_t seen = mp__oom_seen;
  mp__pool_lock(a);
  st = mp__arena_req_locked(a, q);
  if (st == MP_OK)
    st = mp__arena_claimed(a, q);
  mp__pool_unlock(a);
  if (MP__UNLIKELY(st != MP_OK))
    st = mp__arena_alloc_slow(pool, a, q, st, seen);
  return st;
}

mp_status_t mp__arena_alloc_miss(mp_pool_t *pool, mp_pool_t *a, size_t bytes,
                                 mp_stream_t s, void **out) {
  return mp__arena_miss(pool, a,
                        &(mp__arena_req_t){.bytes = bytes, .s = s, .out = out});
}

mp_status_t mp__arena_alloc_contiguous(mp_pool_t *pool, size_t count,
                                       const size_t *sizes, mp_stream_t s,
                                       void **out) {
  mp_pool_t *a;
  mp_status_t st = mp__arena_mine_made(pool, &a);
  if (st != MP_OK)
    return st;
  size_t total;
  (void)mp__pool_pieces_total(pool, count, sizes, &total);
  /* No borrowing (mp__arena_borrow takes one block as it is, not split
   * into pieces): out of memory, the path below takes the other arenas'
   * caches back instead. */
  uint64_t seen = mp__oom_seen;
  st = mp__pool_alloc_pieces(a, count, sizes, s, out);
  if (MP__UNLIKELY(st != MP_OK))
    st = mp__arena_alloc_slow(
        pool, a,
        &(mp__arena_req_t){
            .bytes = total, .s = s, .out = out, .count = count, .sizes = sizes},
        st, seen);
  return mp__status_out(st);
}

/* mp__arena_alloc_any, MP__EHOST for host memory running out. */
static mp_status_t mp__arena_alloc_owned(mp_pool_t *pool, size_t bytes,
                                         mp_stream_t s, void **out,
                                         mp_pool_t **owner,
                                         mp__arena_claim_t claim, void *ctx) {
  mp_pool_t *a;
  uint64_t seen = mp__oom_seen;
  mp_status_t st = mp__arena_mine_made(pool, &a);
  /* Making the arena fails only for host memory (MP_ENOMEM). */
  if (st != MP_OK)
    return mp__arena_host(st, seen);
  st = mp__arena_miss(pool, a,
                      &(mp__arena_req_t){.bytes = bytes,
                                         .s = s,
                                         .out = out,
                                         .claim = claim,
                                         .claim_ctx = ctx,
                                         .owner = owner,
                                         .any = claim == mp__arena_lend});
  MP__ASSERT(st != MP_OK || *owner != NULL);
  return st;
}

mp_status_t mp__arena_alloc_any(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                void **out, mp_pool_t **owner,
                                mp__arena_claim_t claim, void *ctx) {
  return mp__status_out(
      mp__arena_alloc_owned(pool, bytes, s, out, owner, claim, ctx));
}

/* A graph pool's range request: the graph pool, and the bytes asked, then
 * lent (mp__graph_lend). */
typedef struct mp__arena_loan {
  mp_pool_t *graph;
  size_t bytes;
} mp__arena_loan_t;

/* The claim of a graph pool's range: lent to it (graph.c). */
static mp_status_t mp__arena_lend(mp_pool_t *lender, void *const *out,
                                  void *loan) {
  mp__arena_loan_t *l = loan;
  return mp__graph_lend(lender, l->graph, out, &l->bytes);
}

mp_status_t mp__arena_graph_borrow(mp_pool_t *graph, size_t *bytes,
                                   mp_stream_t s, void **out) {
  mp_pool_t *lender = NULL;
  /* MP__EHOST (host memory ran out) stops the graph pool's ladder with
   * its message (graph.c's borrowing says why). A failure counts once in
   * the graph pool's allocation, whose ladder may borrow again. The lent
   * ranges' room first, the calling thread's arena made for it: a lend
   * refused once the range is live would have counted it (graph.c). */
  mp_pool_t *mine;
  mp_status_t made = mp__arena_mine_made(graph->parent, &mine);
  if (made != MP_OK)
    return made == MP_ENOMEM ? MP__EHOST : made;
  if ((made = mp__graph_lend_rooms(graph->parent)) != MP_OK)
    return made;
  bool quiet = mp__oom_quiet;
  mp__oom_quiet = mp__graph_counted();
  mp__arena_loan_t loan = {graph, *bytes};
  mp_status_t st = mp__arena_alloc_owned(graph->parent, *bytes, s, out, &lender,
                                         mp__arena_lend, &loan);
  mp__oom_quiet = quiet;
  if (st == MP_OK)
    *bytes = loan.bytes;
  return st;
}
