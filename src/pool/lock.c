/* lock.c - the pool lock, and the one protocol for dropping it around a
 * device call.
 *
 * mp__pool_lock / mp__pool_unlock (inline in pool_internal.h: they are on
 * the hot path) take and drop the lock; in MP_DEBUG builds they also
 * record which thread holds it, so that a function that expects the lock
 * held says so with MP__ASSERT_LOCKED.
 *
 * The lock is one 32-bit word: MP__LOCK_HELD, MP__LOCK_WOKEN (a wake is in
 * flight) and, above them, how many takers are counted as sleepers. Taking a
 * free lock is one atomic OR and dropping it one compare-and-swap, against
 * some 55 instructions for a pthread mutex round trip (callgrind,
 * bench_pool_pairs): a pair of free + alloc takes it twice. The contended path
 * is built for throughput, because a hand-off costs more than the critical
 * section: the pool's data moves to the other core with the lock. A taker that
 * finds the lock held tries a few times (MP__LOCK_SPINS), then counts itself a
 * sleeper and sleeps on lock_seq (not on the word, which every take and drop
 * changes). A drop that finds sleepers counted and no wake in flight sets
 * WOKEN and bumps lock_seq while it still holds the lock, then drops it and
 * wakes one; after the drop it touches no memory of the pool, only the futex
 * system call's address (as a mutex's unlock must: the next holder may free
 * the pool at once, a graph pool's last free does, and TSan caught the
 * earlier drop, which set WOKEN and bumped the seq after dropping, writing
 * into a graph pool another thread had freed). Whoever uncounts itself
 * (the woken sleeper, or any counted taker back from its sleep or its last try)
 * clears WOKEN, so a spare wake may follow, never a missing one. So a holder
 * that retakes the lock at once sends at most one wake per sleeper's round
 * trip, instead of one per drop. A taker that was woken and still lost the lock
 * (another thread retook it back to back) sleeps MP__LOCK_PATIENT_US uncounted
 * before it tries again: the holder then drops without a system call, and the
 * taker, not woken, cannot lose a wake-up. The price: when that holder leaves
 * for good, the taker finds the lock free only when its sleep ends, 50 us plus
 * the timer slack (a reviewer's harness measured 80-100 us from the drop,
 * against 9 us with the old lock). Polling the word instead (a read every 32
 * pauses, taking it only when free at two reads) cost the shared pool most of
 * the gain: 0.28x-0.39x with two threads, as reading the word moves its line
 * away from the holder. The previous lock (Drepper's three-state futex mutex,
 * in which a taker sleeps on the word itself and every drop that finds it
 * contended wakes one) gave two threads on one pool 0.13x-0.29x of one
 * thread's pairs per second in bench_pool_threads; this one 0.65x-0.83x
 * (README, Threads).
 * No wake-up is lost: a sleeper is counted (an atomic add on the word) after it
 * read lock_seq and before its last try; a drop that comes after the count in
 * the word's order sees it (one word: every change to it is ordered, and the
 * drop itself is a compare-and-swap from the value it looked at, so a count
 * made meanwhile makes it look again). That drop bumps lock_seq and wakes one,
 * which makes the sleeper's FUTEX_WAIT return at once if it is not asleep yet;
 * or it leaves the wake to the wake in flight (whose sleeper clears WOKEN and
 * then takes the lock or finds it held, and so on). A drop before the count
 * left the lock free for the last try.
 * WOKEN only skips a wake while the one before is sure to land: it is set with
 * sleepers counted, each of them read lock_seq before the bump, so one is woken
 * or finds the seq moved, and whoever returns clears it.
 * Fork: a child inherits the word as it was, counts of its parent's sleepers
 * included; like a lock held at the fork, that makes the pool unusable in the
 * child (the preload shim makes the child a pool of its own).
 * Waiting for a flag to drop (mp__pool_wait) sleeps on idle_seq, a counter
 * the flag's clearer bumps: read under the lock, so a bump after the
 * lock is dropped makes FUTEX_WAIT return at once (no lost wake-up).
 * Without futex (not Linux) the sleeps are sched_yield loops. Acquire and
 * release orders on the word are what TSan sees. futex(2) is the source
 * for FUTEX_WAIT returning at once when the word differs from the
 * expected value, and for spurious wake-ups (so every wait loops).
 *
 * Invariant: the pool lock is never held across a blocking device call, and
 * is dropped in one of three ways only:
 *  - around a device call that changes what the pool holds (a map, unmap,
 *    allocation, free or reservation: growth and release):
 *    mp__pool_device_begin / mp__pool_device_end, with pool->inflight set
 *    meanwhile. One at a time: mp__pool_wait_idle waits for the one in
 *    flight.
 *  - around a synchronization (waiting for the pool's streams):
 *    mp__pool_sync_begin / mp__pool_sync_end, with pool->syncing set. One
 *    at a time and never beside a grow or release (mp__pool_wait_sync);
 *    growth and frees do not wait for it (the stream it waits for may be
 *    waiting for them).
 *  - around a call out of the pool that takes the lock itself or may take
 *    long (the application's out-of-memory handler, defragmentation, a
 *    short sleep, destroy's wait for its streams): mp__pool_unlock, then
 *    mp__pool_lock, no flag.
 * Whoever drops the lock reads the pool's state again after retaking it:
 * anything may have changed but what the flag it set keeps out. */
#include <limits.h>
#include <sched.h>
#include <time.h>

#include "pool_internal.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleeps while *word == expected (or until a spurious wake-up). */
static void mp__futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL,
          0);
}

static void mp__futex_wake(_Atomic uint32_t *word, int n) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Sleeps us microseconds (plus the thread's timer slack, 50 us by
 * default): the system call itself, as nanosleep(3) is a cancellation
 * point and a thread cancelled in the pool's lock would leave the pool
 * half changed. */
static void mp__lock_nap(unsigned us) {
  struct timespec ts = {0, (long)us * 1000};
  syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
}
#else
static void mp__futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  if (atomic_load_explicit(word, memory_order_relaxed) == expected)
    sched_yield();
}

static void mp__futex_wake(_Atomic uint32_t *word, int n) {
  (void)word;
  (void)n;
}

static void mp__lock_nap(unsigned us) {
  (void)us;
  sched_yield();
}
#endif

static bool mp__lock_try(_Atomic uint32_t *w) {
  return !(atomic_load_explicit(w, memory_order_relaxed) & MP__LOCK_HELD) &&
         !(atomic_fetch_or_explicit(w, MP__LOCK_HELD, memory_order_acquire) &
           MP__LOCK_HELD);
}

/* Tries before a taker counts itself a sleeper: a few, as a hold is
 * short; more measured no better (bench_pool_threads, 10 against 100). */
#define MP__LOCK_SPINS 10
static void mp__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* How long a taker that was woken and lost the lock again sleeps before
 * its next try, uncounted (plus the timer slack). */
#define MP__LOCK_PATIENT_US 50

MP__COLD void mp__pool_lock_wait(mp_pool_t *pool) {
  _Atomic uint32_t *w = &pool->lock;
  bool patient = false;
  mp_pool_t *solo = atomic_load_explicit(&pool->solo_of, memory_order_relaxed);
  if (MP__UNLIKELY(solo != NULL))
    mp__arena_solo_contended(pool, solo);
  for (;;) {
    for (unsigned i = MP__LOCK_SPINS; i > 0; i--) {
      if (mp__lock_try(w))
        return;
      mp__cpu_relax();
    }
    if (mp__lock_try(w))
      return;
    if (patient) {
      mp__lock_nap(MP__LOCK_PATIENT_US);
      patient = false;
      continue;
    }
    /* Counted as a sleeper, then a last try: a drop ordered after the
     * count (one word, so every change to it is) sees the sleeper, and
     * it, the holder after it or the wake in flight bumps lock_seq, read
     * before the count, so the sleep below does not miss it. */
    uint32_t seq = atomic_load_explicit(&pool->lock_seq, memory_order_acquire);
    atomic_fetch_add_explicit(w, MP__LOCK_SLEEPER, memory_order_seq_cst);
    bool got = mp__lock_try(w);
    if (!got)
      mp__futex_wait(&pool->lock_seq, seq);
    /* No longer a sleeper; and the wake in flight, if any, has landed or
     * found the seq moved (this thread may be the one it was for), so the
     * next drop may send another. */
    uint32_t o = atomic_load_explicit(w, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(
        w, &o, (o - MP__LOCK_SLEEPER) & ~MP__LOCK_WOKEN, memory_order_relaxed,
        memory_order_relaxed))
      ;
    if (got || mp__lock_try(w))
      return;
    patient = true;
  }
}

MP__COLD void mp__pool_unlock_contended(mp_pool_t *pool, uint32_t v) {
  _Atomic uint32_t *w = &pool->lock;
  bool bumped = false;
  for (;;) {
    MP__ASSERT(v & MP__LOCK_HELD);
    if (v >= MP__LOCK_SLEEPER && !(v & MP__LOCK_WOKEN)) {
      /* Sleepers and no wake in flight: WOKEN and a bump while the lock is
       * still held. Every sleeper counted before the WOKEN read lock_seq
       * before the bump: it is asleep (one is woken) or it will find the
       * seq moved. */
      if (!atomic_compare_exchange_weak_explicit(w, &v, v | MP__LOCK_WOKEN,
                                                 memory_order_seq_cst,
                                                 memory_order_relaxed))
        continue;
      atomic_fetch_add_explicit(&pool->lock_seq, 1, memory_order_release);
      bumped = true;
      v |= MP__LOCK_WOKEN;
    }
    /* The release, from exactly the word looked at: a sleeper counted or
     * uncounted meanwhile (one that cleared this WOKEN and counted itself
     * again, say) makes the drop look again, and set WOKEN and bump again
     * if need be. A plain subtraction here lost that sleeper's wake-up (a
     * model of every interleaving found it, and a stress run with the
     * window widened hung). */
    if (atomic_compare_exchange_weak_explicit(w, &v, v - MP__LOCK_HELD,
                                              memory_order_release,
                                              memory_order_relaxed))
      break;
  }
  /* After the drop only the system call names the pool (its address, not
   * its memory): the next holder may free the pool at once (a graph pool's
   * last free, graph.c), and a wake on a freed address wakes nobody or, if
   * the address is reused, someone whose wait loops. */
  if (bumped)
    mp__futex_wake(&pool->lock_seq, 1);
}

static void mp__pool_wait(mp_pool_t *pool) {
  uint32_t seq = atomic_load_explicit(&pool->idle_seq, memory_order_relaxed);
  pool->idle_waiters++;
  mp__pool_unlock(pool);
  mp__futex_wait(&pool->idle_seq, seq);
  mp__pool_lock(pool);
  pool->idle_waiters--;
}

/* Under the lock: wakes every mp__pool_wait sleeper (they recheck). */
static void mp__pool_wake_idle(mp_pool_t *pool) {
  if (pool->idle_waiters == 0)
    return;
  atomic_fetch_add_explicit(&pool->idle_seq, 1, memory_order_relaxed);
  mp__futex_wake(&pool->idle_seq, INT_MAX);
}

void mp__pool_wait_idle(mp_pool_t *pool) {
  while (pool->inflight)
    mp__pool_wait(pool);
}

bool mp__pool_wait_sync(mp_pool_t *pool) {
  bool waited = false;
  for (; pool->inflight || pool->syncing; waited = true)
    mp__pool_wait(pool);
  return waited;
}

mp_status_t mp__pool_caller_check(const mp_pool_t *pool, const char *fn) {
  mp_device_t *d = pool->dev;
  return d->ops->caller_check != NULL ? d->ops->caller_check(d, fn) : MP_OK;
}

bool mp__pool_in_host_fn(const mp_pool_t *pool) {
  mp__error_saved_t e; /* the check's message is not the caller's answer */
  mp__error_save(&e);
  bool in = mp__pool_caller_check(pool, "mp_pool_alloc") != MP_OK;
  mp__error_restore(&e);
  return in;
}

_Thread_local const mp_pool_t *mp__graph_growing;

bool mp__graph_growing_here(const mp_pool_t *pool) {
  return pool == mp__graph_growing;
}

mp_status_t mp__pool_may_wait(const mp_pool_t *pool, const char *fn) {
  mp_status_t st = mp__pool_caller_check(pool, fn);
  if (st == MP_OK && mp__graph_growing_here(pool))
    st = mp__fail(MP_EBUSY,
                  "%s: called from the parent's out-of-memory handler during "
                  "this graph pool's own growth: call it after that "
                  "allocation",
                  fn);
  return st;
}

mp_status_t mp__pool_wait_for(mp_pool_t *pool, const char *fn, bool sync) {
  /* A graph pool's growth that this thread runs (its parent's
   * out-of-memory handler calls fn): the wait would be for itself, for
   * good. That growth only borrows, nothing of the graph pool changed yet
   * (segment.c): fn sees it as it is. */
  if (mp__graph_growing_here(pool))
    return MP_OK;
  if ((pool->inflight || (sync && pool->syncing)) && mp__pool_in_host_fn(pool))
    return mp__fail(MP_EBUSY,
                    "%s: called from a host function while another thread's "
                    "device call on the pool is under way, which may wait "
                    "for the host functions queued: call it after the host "
                    "function returns",
                    fn);
  if (sync)
    (void)mp__pool_wait_sync(pool);
  else
    mp__pool_wait_idle(pool);
  return MP_OK;
}

/* The drop of both flagged kinds: *flag marks what is in flight while the
 * lock is down; the retake clears it and wakes whoever waits for it. */
static void mp__pool_drop_flagged(mp_pool_t *pool, bool *flag) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT(!*flag);
  *flag = true;
  mp__pool_unlock(pool);
}

static void mp__pool_retake_flagged(mp_pool_t *pool, bool *flag) {
  mp__pool_lock(pool);
  MP__ASSERT(*flag);
  *flag = false;
  mp__pool_wake_idle(pool);
}

void mp__pool_device_begin(mp_pool_t *pool) {
  mp__pool_drop_flagged(pool, &pool->inflight);
}

void mp__pool_device_end(mp_pool_t *pool) {
  mp__pool_retake_flagged(pool, &pool->inflight);
  /* An arena's growth checked against an older share has landed (its
   * bytes are counted before the lock is dropped again; arena.c). */
  pool->cap_held = 0;
  pool->grow_inflight = 0;
}

void mp__pool_sync_begin(mp_pool_t *pool) {
  mp__pool_wait_sync(pool);
  mp__pool_drop_flagged(pool, &pool->syncing);
}

void mp__pool_sync_end(mp_pool_t *pool) {
  mp__pool_retake_flagged(pool, &pool->syncing);
}
