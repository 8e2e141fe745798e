/* direct.c - the direct (non-caching) allocator.
 *
 * Every request is one device allocation; nothing is cached or reused.
 * Frees are deferred: on CUDA a device free synchronizes the whole device,
 * so freed blocks wait in the session and mp_direct_free_session releases
 * them together after one device synchronization (the blocks' streams may
 * have been destroyed since, so synchronizing the device, not each stream,
 * is the one wait that is always valid). An allocation that finds the
 * device full ends the session first and retries, as a user of
 * cudaMalloc would expect memory they freed to be usable again; not one
 * for more than the device has in all, which nothing freed can make fit
 * (the session stays, and nothing waits).
 *
 * A device synchronization during a capture of any stream of the device
 * is invalid and invalidates the capture, so neither a session's end nor
 * destroy synchronizes while a capture the device can see is under way:
 * MP_EBUSY (MP_ENOMEM for the allocation), said, the blocks kept for a
 * later call (mp__direct_capture_check).
 *
 * Sessions run without the mutex, so another thread may have taken the
 * session's blocks and be on its way to give them back when an allocation
 * finds the device full. That allocation waits for the sessions in flight
 * when its try failed (inflight, numbered as taken: the horizon) and tries
 * again as memory goes back (release_gen): memory that was on its way back
 * is used, as it would be had the two threads run one after the other.
 * Sessions taken later are memory freed after the try failed: they do not
 * keep it trying, or a request that cannot fit would try for as long as
 * other threads free. So it tries at most twice more than the sessions it
 * waits for: once for what went back while its first try ran, once after
 * ending the session itself (once).
 * The wait is bounded (MP__DIRECT_INFLIGHT_WAIT_MS in all): a session's
 * device synchronization waits for every stream's work, and that work may
 * wait for the allocating thread itself (a stream held by a host function
 * this thread would let go next), which would then wait for ever; a plain
 * cudaMalloc would have been out of memory at once. Past the bound the
 * allocation is MP_ENOMEM, said so. For the same reason it ends the
 * session itself only once the sessions of its process in flight when its
 * try failed have ended (those begun since are not waited for: the
 * horizon, mp__direct_alloc_retry): its own synchronization would wait for
 * the work theirs waits for, without a bound (its blocks stay deferred if
 * they do not end in time).
 *
 * A child forked while another thread ended a session keeps the session
 * in its list, not the thread: its allocations do not wait for it
 * (mp__direct_pending), and its destroy frees the blocks the thread had
 * not yet given back at the fork (mp__direct_adopt_orphans).
 *
 * Blocks are found by address in an mp__ptrmap_t (ptrmap.c: O(1) per
 * operation), so a free costs the same with ten or a million blocks. The
 * deferred blocks of the session are also listed in an array, so ending a
 * session costs O(deferred blocks).
 *
 * Invariant (under the mutex): every block the device gave us and we have
 * not given back is in the map, LIVE or DEFERRED; the deferred array holds
 * exactly the DEFERRED ones; reserved = live + deferred bytes; inflight
 * lists the sessions taken and not yet done (their blocks are in neither
 * list), each numbered by taken when taken, and release_gen goes up, under
 * the mutex, as each one that gave any block back ends; the map and the
 * deferred array have room for restoring more entries each (the blocks of
 * the sessions in flight whose device free has not returned), so that a
 * block the device refuses goes back into the session without allocating:
 * taking a session leaves that room (its blocks leave both), and every
 * other addition reserves room beyond it; the map also has room for
 * allocating more entries (the allocations whose device allocation is
 * under way: each reserved its entry before it, so a block the device
 * gives is never refused a place, and never needs a device free that may
 * be refused in turn). The mutex is never held across a device call. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/backend.h"
#include "internal.h"
#include "structs.h"

enum { MP__DIRECT_LIVE = 1, MP__DIRECT_DEFERRED = 2 };

/* How long, in all, an allocation on a full device waits for other
 * threads' sessions in flight (see the top of the file). */
#define MP__DIRECT_INFLIGHT_WAIT_MS 5000

/* An entry of the block map. */
typedef struct mp__dslot {
  uintptr_t key; /* the block's address */
  size_t bytes;
  int state;
} mp__dslot_t;

typedef struct mp__dblock {
  void *ptr;
  size_t bytes;
} mp__dblock_t;

/* A session being given back, in its allocator's inflight list while it
 * runs. On the heap with its blocks, not on the stack of the thread that
 * ends it: a child forked meanwhile keeps it in its list, and there the
 * stack of a thread that did not survive the fork is memory glibc hands
 * to the child's next new thread, which writes over it. */
typedef struct mp__dsession {
  uint64_t ticket; /* its number: the sessions taken up to it */
  pid_t pid;       /* the process whose thread gives it back */
  struct mp__dsession *next;
  /* Its blocks, and how far the thread got (under the mutex): the device
   * free of blocks[0, started) has begun, that of [0, done) returned (each
   * then gone or back in the session). A child forked meanwhile frees
   * [started, n) itself (mp__direct_adopt_orphans). */
  size_t n, started, done;
} mp__dsession_t;

typedef struct mp__dbatch {
  mp__dsession_t sess;
  mp__dblock_t blocks[];
} mp__dbatch_t;

struct mp_direct {
  mp_device_t *dev;
  pthread_mutex_t mu;
  mp__ptrmap_t blocks; /* address -> mp__dslot_t, LIVE or DEFERRED */
  mp__dblock_t *deferred;
  size_t ndeferred, deferred_cap;
  size_t live_bytes, deferred_bytes;
  uint64_t taken;           /* sessions taken */
  mp__dsession_t *inflight; /* sessions taken, not yet given back */
  size_t restoring; /* blocks of the sessions in flight whose device free
                       has not returned: each may come back (refused), and
                       the map and the deferred array keep room for them */
  _Atomic uint64_t release_gen; /* sessions that gave back memory */
  pthread_cond_t released;      /* a session ended (left inflight) */
  mp_stats_t st; /* counters and peaks; byte fields derived on read */
  size_t total;  /* the device's memory in all, asked at create; 0: not told */
  size_t allocating; /* allocations whose device allocation is under way:
                        the map keeps room for each, reserved before it
                        (mp_direct_alloc), so that the block the device
                        gives is tracked without allocating */
};

/* ---- the block map --------------------------------------------------- */

static mp__dslot_t *mp__dmap_find(mp_direct_t *d, const void *p) {
  return mp__ptrmap_find(&d->blocks, (uintptr_t)p);
}

/* The block (live or freed in this session) whose bytes hold p past its
 * start, or NULL: for the message of a refused pointer only, so a scan of
 * the map is fine. Under the mutex. */
static const mp__dslot_t *mp__dmap_inside(const mp_direct_t *d, const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < d->blocks.cap; i++) {
    const mp__dslot_t *s = mp__ptrmap_at(&d->blocks, i);
    if (s != NULL && a > s->key && a - s->key < s->bytes)
      return s;
  }
  return NULL;
}

/* MP_EINVAL for p, no block's start (s NULL) or none live (s freed in this
 * session), naming what is wrong with it. Under the mutex, which it
 * drops. */
static mp_status_t mp__direct_refuse(mp_direct_t *d, const char *fn,
                                     const void *p, const mp__dslot_t *s) {
  const mp__dslot_t *in = s == NULL ? mp__dmap_inside(d, p) : NULL;
  void *at = in != NULL ? (void *)in->key : NULL;
  size_t bytes = in != NULL ? in->bytes : 0;
  bool freed = in != NULL ? in->state != MP__DIRECT_LIVE : s != NULL;
  pthread_mutex_unlock(&d->mu);
  if (at != NULL)
    return mp__fail(MP_EINVAL,
                    "%s: %p points inside the block at %p (%zu bytes%s), "
                    "not at its start",
                    fn, p, at, bytes, freed ? ", freed in this session" : "");
  if (freed)
    return mp__fail(MP_EINVAL, "%s: %p was already freed in this session", fn,
                    p);
  return mp__fail(MP_EINVAL,
                  "%s: %p was not allocated by this direct allocator (or "
                  "was already released)",
                  fn, p);
}

/* Adds a block; the caller made room with mp__ptrmap_reserve. */
static void mp__dmap_put(mp_direct_t *d, void *p, size_t bytes, int state) {
  mp__dslot_t *s = mp__ptrmap_put(&d->blocks, (uintptr_t)p);
  s->bytes = bytes;
  s->state = state;
}

/* ---- counters --------------------------------------------------------- */

static void mp__direct_update_peaks(mp_direct_t *d) {
  size_t reserved = d->live_bytes + d->deferred_bytes;
  if (reserved > d->st.peak_reserved_bytes)
    d->st.peak_reserved_bytes = reserved;
  if (d->live_bytes > d->st.peak_allocated_bytes)
    d->st.peak_allocated_bytes = d->live_bytes;
  if (d->live_bytes > d->st.peak_requested_bytes)
    d->st.peak_requested_bytes = d->live_bytes;
}

/* ---- public API ------------------------------------------------------- */

mp_status_t mp_direct_create(mp_device_t *dev, mp_direct_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_create: out is NULL");
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_create: device is NULL");
  mp_direct_t *d = mp__host_calloc(1, sizeof *d);
  if (d == NULL)
    return mp__fail(MP_ENOMEM, "mp_direct_create: out of host memory");
  mp__ptrmap_init(&d->blocks, sizeof(mp__dslot_t));
  if (pthread_mutex_init(&d->mu, NULL) != 0) {
    free(d);
    return mp__fail(MP_ENOMEM, "mp_direct_create: out of host memory");
  }
  /* Waited on with a deadline on the monotonic clock (mp__direct_alloc_retry),
   * which a change of the wall clock cannot stretch. */
  pthread_condattr_t ca;
  bool cond_ok = pthread_condattr_init(&ca) == 0;
  if (cond_ok) {
    cond_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&d->released, &ca) == 0;
    pthread_condattr_destroy(&ca);
  }
  if (!cond_ok) {
    pthread_mutex_destroy(&d->mu);
    free(d);
    return mp__fail(MP_ENOMEM, "mp_direct_create: out of host memory");
  }
  d->dev = dev;
  /* Asked once, here, not on an allocation's failure (which may come
   * during a capture); a device that does not tell is no failure. */
  mp__error_saved_t saved;
  mp__error_save(&saved);
  size_t free_b;
  if (mp_device_mem_info(dev, &free_b, &d->total) != MP_OK) {
    d->total = 0;
    mp__error_restore(&saved);
  }
  *out = d;
  return MP_OK;
}

/* Grows the deferred array for more blocks, beyond the room kept for
 * the sessions in flight (restoring); false when the host is out of
 * memory. */
static bool mp__direct_reserve_deferred(mp_direct_t *d, size_t more) {
  if (more > SIZE_MAX / 4 / sizeof *d->deferred - d->restoring)
    return false;
  more += d->restoring;
  if (more <= d->deferred_cap - d->ndeferred)
    return true;
  if (more > SIZE_MAX / 4 / sizeof *d->deferred - d->ndeferred)
    return false;
  size_t ncap = d->deferred_cap ? d->deferred_cap : 64;
  while (ncap - d->ndeferred < more)
    ncap *= 2;
  mp__dblock_t *nd = mp__host_realloc(d->deferred, ncap * sizeof *nd);
  if (nd == NULL)
    return false;
  d->deferred = nd;
  d->deferred_cap = ncap;
  return true;
}

/* Room in the block map for more blocks, beyond the room kept for the
 * sessions in flight (restoring) and the allocations under way
 * (allocating); false when the host is out of memory. */
static bool mp__direct_reserve_map(mp_direct_t *d, size_t more) {
  size_t kept = d->restoring + d->allocating;
  return more <= SIZE_MAX / 4 - kept &&
         mp__ptrmap_reserve(&d->blocks, more + kept);
}

/* A block of a session in flight whose device free returned (under the
 * mutex): gone (refused false), or refused and put back into the session,
 * so a later session can retry it, in the room kept for it (nothing
 * allocated: it cannot be lost for want of host memory). */
static void mp__direct_returned(mp_direct_t *d, mp__dblock_t b, bool refused) {
  d->restoring--;
  if (!refused)
    return;
  mp__dmap_put(d, b.ptr, b.bytes, MP__DIRECT_DEFERRED);
  d->deferred[d->ndeferred++] = b;
  d->deferred_bytes += b.bytes;
}

/* Synchronizes the device, then gives every block of batch back; *released:
 * how many went. Blocks the device refuses are put back into the session so
 * a later call can retry; the first failure is returned. The session's
 * started and done follow, under the mutex, with each block's step. */
static mp_status_t mp__direct_release(mp_direct_t *d, mp__dbatch_t *batch,
                                      size_t *released) {
  mp__dsession_t *sess = &batch->sess;
  size_t n = sess->n;
  *released = 0;
  if (n == 0)
    return MP_OK;
  mp_status_t first = mp_device_synchronize(d->dev);
  pthread_mutex_lock(&d->mu);
  if (first != MP_OK) {
    /* Nothing may be freed while work on it could still be running. */
    sess->started = sess->done = n;
    for (size_t i = 0; i < n; i++)
      mp__direct_returned(d, batch->blocks[i], true);
    pthread_mutex_unlock(&d->mu);
    return first;
  }
  sess->started = 1;
  pthread_mutex_unlock(&d->mu);
  for (size_t i = 0; i < n; i++) {
    mp_status_t st = mp__device_free(d->dev, batch->blocks[i].ptr);
    pthread_mutex_lock(&d->mu);
    if (st == MP_OK) {
      d->st.device_free_count++;
      (*released)++;
    } else if (first == MP_OK) {
      first = st;
    }
    mp__direct_returned(d, batch->blocks[i], st != MP_OK);
    sess->done = i + 1;
    if (i + 1 < n)
      sess->started = i + 2;
    pthread_mutex_unlock(&d->mu);
  }
  return first;
}

/* Takes the session's deferred blocks out of the map (they must be gone before
 * the device can hand their addresses out again) and returns them as a batch,
 * its session in the inflight list.
 */
static mp__dbatch_t *mp__direct_take_session(mp_direct_t *d, size_t *n,
                                             mp_status_t *st) {
  *st = MP_OK;
  *n = 0;
  pthread_mutex_lock(&d->mu);
  if (d->ndeferred == 0) {
    pthread_mutex_unlock(&d->mu);
    return NULL;
  }
  mp__dbatch_t *batch =
      mp__host_alloc(sizeof *batch + d->ndeferred * sizeof *batch->blocks);
  if (batch == NULL) {
    pthread_mutex_unlock(&d->mu);
    *st = mp__fail(MP_ENOMEM, "mp_direct_free_session: out of host memory");
    return NULL;
  }
  memcpy(batch->blocks, d->deferred, d->ndeferred * sizeof *batch->blocks);
  *n = d->ndeferred;
  for (size_t i = 0; i < d->ndeferred; i++)
    mp__ptrmap_remove(&d->blocks, mp__dmap_find(d, d->deferred[i].ptr));
  d->ndeferred = 0;
  d->deferred_bytes = 0;
  /* Their room in the map and the array stays theirs while they are out. */
  d->restoring += *n;
  /* In the same step: the blocks are always somewhere. */
  mp__dsession_t *sess = &batch->sess;
  sess->ticket = ++d->taken;
  sess->pid = getpid();
  sess->n = *n;
  sess->started = sess->done = 0;
  sess->next = d->inflight;
  d->inflight = sess;
  pthread_mutex_unlock(&d->mu);
  return batch;
}

/* MP_OK when the device may be synchronized now (to end the session,
 * what; for fn, NULL: the message names none); else MP_EBUSY, said, ending
 * with kept (what became of the blocks). A device synchronization waits for
 * every stream of the context, so during a capture of any of them it is refused
 * and invalidates that capture, in every capture mode, whichever thread
 * captures (the Programming Guide, "Prohibited and Unhandled Operations":
 * synchronizing "a device or context handle when any associated stream is in
 * capture mode" is invalid; src/device/cuda.c, mp__cuda_capture_seen). So it is
 * not made while s (unless NULL), or any stream of the device the backend
 * can ask, is being captured, or cannot say (-1). CUDA cannot be asked
 * about a stream the device never met (a non-blocking stream the program
 * made itself): such a capture goes unseen, and the synchronization is
 * refused and invalidates it; the caller's call fails, the blocks kept. A
 * driver failure (-2) goes on, the synchronization failing too. */
static mp_status_t mp__direct_capture_check(mp_direct_t *d, mp_stream_t s,
                                            const char *fn, const char *what,
                                            const char *kept) {
  mp_stream_t which;
  int c = mp__device_capture_seen(d->dev, s, &which);
  if (c != 1 && c != -1)
    return MP_OK;
  char at[64];
  if (which == NULL)
    snprintf(at, sizeof at, "a blocking stream");
  else
    snprintf(at, sizeof at, "stream %p", (void *)which);
  return mp__fail(MP_EBUSY,
                  "%s%s%s of device '%s' is being captured into a graph (or "
                  "cannot say), and the device synchronization %s would "
                  "invalidate the capture; %s",
                  fn != NULL ? fn : "", fn != NULL ? ": " : "", at,
                  mp_device_name(d->dev), what, kept);
}

/* Ends the session; *released: how many blocks went back to the device
 * (some may have, even when it fails). MP_EBUSY while a capture is seen
 * (mp__direct_capture_check: s, the stream of fn's call, or NULL), the
 * session as it was. */
static mp_status_t mp__direct_end_session(mp_direct_t *d, mp_stream_t s,
                                          const char *fn, size_t *released) {
  size_t n;
  mp_status_t st;
  *released = 0;
  pthread_mutex_lock(&d->mu);
  bool any = d->ndeferred > 0;
  pthread_mutex_unlock(&d->mu);
  if (!any)
    return MP_OK;
  st = mp__direct_capture_check(d, s, fn, "that ends the session",
                                "the freed blocks stay deferred, for a "
                                "session once the capture has ended");
  if (st != MP_OK)
    return st;
  mp__dbatch_t *batch = mp__direct_take_session(d, &n, &st);
  if (batch == NULL)
    return st;
  st = mp__direct_release(d, batch, released);
  pthread_mutex_lock(&d->mu);
  mp__dsession_t **at = &d->inflight;
  while (*at != &batch->sess)
    at = &(*at)->next;
  *at = batch->sess.next;
  if (*released > 0)
    atomic_fetch_add_explicit(&d->release_gen, 1, memory_order_release);
  pthread_cond_broadcast(&d->released);
  pthread_mutex_unlock(&d->mu);
  free(batch);
  return st;
}

mp_status_t mp_direct_free_session(mp_direct_t *d) {
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_free_session: allocator is NULL");
  size_t released;
  return mp__direct_end_session(d, NULL, "mp_direct_free_session", &released);
}

/* Under the mutex: how many sessions taken up to horizon are in flight in
 * this process. A child forked while another thread of its parent gave a
 * session back has the session in its copy of the list, but not the
 * thread: it never ends here, and waiting for it would be for ever. */
static size_t mp__direct_pending(const mp_direct_t *d, uint64_t horizon) {
  size_t n = 0;
  pid_t self = getpid();
  for (const mp__dsession_t *x = d->inflight; x != NULL; x = x->next)
    n += x->ticket <= horizon && x->pid == self;
  return n;
}

/* After a try begun at release generation gen found the device full:
 * waits for the sessions in flight now (the horizon), then ends the
 * session when it has blocks (once), and tries again as memory goes back.
 * A release counts when it may be what the last try missed: any since the
 * first try began, or since this thread ended the session; after that only
 * those of the sessions waited for (fewer of them left than when the last
 * try began). So the tries are bounded, however often other threads free
 * (see the top of the file). A session that gave nothing back (the device
 * refused it) ends the wait for it. Fails with the last try's MP_ENOMEM and
 * message, not what a session failed on; after waiting
 * MP__DIRECT_INFLIGHT_WAIT_MS for sessions that did not end, with a
 * message that says so too, as it does where s is being captured and the
 * session is not ended. */
static mp_status_t mp__direct_alloc_retry(mp_direct_t *d, size_t bytes,
                                          mp_stream_t s, uint64_t gen, void **p,
                                          bool *retried) {
  pthread_mutex_lock(&d->mu);
  uint64_t horizon = d->taken;
  size_t pending = mp__direct_pending(d, horizon); /* as the try began */
  pthread_mutex_unlock(&d->mu);
  bool any = true;    /* any release since the last try began counts */
  bool ended = false; /* this thread ended the session */
  bool late = false;  /* the deadline passed: no more waiting */
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += MP__DIRECT_INFLIGHT_WAIT_MS / 1000;
  deadline.tv_nsec += (long)(MP__DIRECT_INFLIGHT_WAIT_MS % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  for (;;) {
    mp__error_saved_t oom;
    mp__error_save(&oom);
    pthread_mutex_lock(&d->mu);
    bool went;
    size_t left;
    for (;;) {
      left = mp__direct_pending(d, horizon);
      went =
          atomic_load_explicit(&d->release_gen, memory_order_relaxed) != gen &&
          (any || left < pending);
      if (went || left == 0 || late)
        break;
      late =
          pthread_cond_timedwait(&d->released, &d->mu, &deadline) == ETIMEDOUT;
    }
    bool have_deferred = !ended && d->ndeferred > 0;
    /* The next try's start, read together under the mutex. */
    gen = atomic_load_explicit(&d->release_gen, memory_order_relaxed);
    pending = left;
    pthread_mutex_unlock(&d->mu);
    if (!went) {
      if (left > 0)
        return mp__fail(MP_ENOMEM,
                        "%s; %zu session(s) of other threads giving memory "
                        "back did not end within %d ms (a session's device "
                        "synchronization may wait for work this thread has "
                        "yet to let go)",
                        oom.msg, left, MP__DIRECT_INFLIGHT_WAIT_MS);
      if (!have_deferred)
        return MP_ENOMEM;
      /* Ending the session synchronizes the device, which invalidates
       * a capture of s or of any other stream of the device: not while
       * one is seen (mp__direct_capture_check). */
      size_t released;
      if (mp__direct_end_session(d, s, NULL, &released) == MP_EBUSY) {
        mp__error_saved_t busy;
        mp__error_save(&busy);
        return mp__fail(MP_ENOMEM, "%s; %s", oom.msg, busy.msg);
      }
      mp__error_restore(&oom);
      ended = any = true;
      continue;
    }
    *retried = true;
    any = false;
    mp_status_t st = mp_device_alloc(d->dev, bytes, p);
    if (st != MP_ENOMEM)
      return st;
  }
}

mp_status_t mp_direct_alloc(mp_direct_t *d, size_t bytes, mp_stream_t s,
                            void **out) {
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_alloc: allocator is NULL");
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_alloc: out is NULL");
  /* Device allocations are not stream-ordered, but a stream that is none
   * of the device's is the caller's mistake, refused as a pool refuses it. */
  if (s != NULL && mp__device_stream_kind(d->dev, s) == MP__STREAM_BAD)
    return mp__fail(MP_EINVAL,
                    "mp_direct_alloc: stream %p is not a live stream of "
                    "device '%s'",
                    (void *)s, mp_device_name(d->dev));
  if (bytes == 0) {
    *out = NULL;
    return MP_OK;
  }
  /* The block's room in the map before the device allocation, the one
   * step that can fail after it otherwise: a block the device gave could
   * only be freed again, and a free the device refused left it allocated
   * and tracked nowhere (lost until the device closed). */
  pthread_mutex_lock(&d->mu);
  bool room = mp__direct_reserve_map(d, 1);
  if (room)
    d->allocating++;
  pthread_mutex_unlock(&d->mu);
  if (!room)
    return mp__fail(MP_ENOMEM, "mp_direct_alloc: out of host memory");
  void *p = NULL;
  /* A try the device refuses records its MP_ENOMEM before the retry that
   * then succeeds (a session ended for it, or another thread's): a call
   * that succeeds leaves the caller's last error as it was (status.h).
   * Kept here, next to a device allocation, whose cost dwarfs it. */
  mp__error_kept_t was;
  mp__error_keep(&was);
  uint64_t gen = atomic_load_explicit(&d->release_gen, memory_order_acquire);
  mp_status_t st = mp_device_alloc(d->dev, bytes, &p);
  bool retried = false;
  if (st == MP_ENOMEM && d->total != 0 && bytes > d->total) {
    /* No session can make room for more than the device has: the freed
     * blocks stay deferred, and nothing waits for other threads. */
    mp__error_saved_t oom;
    mp__error_save(&oom);
    char want[32], all[32];
    st = mp__fail(MP_ENOMEM,
                  "%s; %s is more than device '%s' has in all (%s), so no "
                  "session was ended for it",
                  oom.msg, mp__fmt_bytes(want, sizeof want, bytes),
                  mp_device_name(d->dev),
                  mp__fmt_bytes(all, sizeof all, d->total));
  } else if (st == MP_ENOMEM) {
    st = mp__direct_alloc_retry(d, bytes, s, gen, &p, &retried);
  }
  pthread_mutex_lock(&d->mu);
  d->allocating--; /* its room is p's now, or no one's */
  if (retried)
    d->st.alloc_retry_count++;
  if (st != MP_OK) {
    if (st == MP_ENOMEM || st == MP_ELIMIT)
      d->st.oom_count++;
    pthread_mutex_unlock(&d->mu);
    return st;
  }
  mp__dmap_put(d, p, bytes, MP__DIRECT_LIVE); /* in the room kept for it */
  d->live_bytes += bytes;
  d->st.alloc_count++;
  d->st.device_alloc_count++;
  mp__direct_update_peaks(d);
  pthread_mutex_unlock(&d->mu);
  mp__error_give_back(&was);
  *out = p;
  return MP_OK;
}

mp_status_t mp_direct_free(mp_direct_t *d, void *ptr) {
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_free: allocator is NULL");
  if (ptr == NULL)
    return MP_OK;
  pthread_mutex_lock(&d->mu);
  mp__dslot_t *s = mp__dmap_find(d, ptr);
  if (s == NULL || s->state != MP__DIRECT_LIVE)
    return mp__direct_refuse(d, "mp_direct_free", ptr, s);
  if (!mp__direct_reserve_deferred(d, 1)) {
    pthread_mutex_unlock(&d->mu);
    return mp__fail(MP_ENOMEM, "mp_direct_free: out of host memory");
  }
  s->state = MP__DIRECT_DEFERRED;
  d->deferred[d->ndeferred++] = (mp__dblock_t){ptr, s->bytes};
  d->live_bytes -= s->bytes;
  d->deferred_bytes += s->bytes;
  d->st.free_count++;
  pthread_mutex_unlock(&d->mu);
  return MP_OK;
}

mp_status_t mp_direct_record_stream(mp_direct_t *d, void *ptr, mp_stream_t s) {
  /* The session synchronizes the whole device before releasing, so s is
   * not remembered; but one that is none of the device's is refused, as
   * mp_direct_alloc and a pool's record_stream refuse it. */
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_record_stream: allocator is NULL");
  if (ptr == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_record_stream: ptr is NULL");
  if (s != NULL && mp__device_stream_kind(d->dev, s) == MP__STREAM_BAD)
    return mp__fail(MP_EINVAL,
                    "mp_direct_record_stream: stream %p is not a live stream "
                    "of device '%s'",
                    (void *)s, mp_device_name(d->dev));
  pthread_mutex_lock(&d->mu);
  mp__dslot_t *slot = mp__dmap_find(d, ptr);
  if (slot == NULL || slot->state != MP__DIRECT_LIVE)
    return mp__direct_refuse(d, "mp_direct_record_stream", ptr, slot);
  pthread_mutex_unlock(&d->mu);
  return MP_OK;
}

mp_status_t mp_direct_get_stats_sized(mp_direct_t *d, mp_stats_t *out,
                                      size_t size) {
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_get_stats: allocator is NULL");
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_get_stats: out is NULL");
  pthread_mutex_lock(&d->mu);
  mp_stats_t s = d->st;
  s.reserved_bytes = d->live_bytes + d->deferred_bytes;
  s.allocated_bytes = d->live_bytes;
  s.requested_bytes = d->live_bytes;
  s.largest_free_bytes = 0; /* nothing is ever reused */
  s.free_bytes = d->deferred_bytes;
  s.segment_count = d->blocks.count;
  s.live_blocks = d->blocks.count - d->ndeferred;
  s.free_blocks = d->ndeferred;
  pthread_mutex_unlock(&d->mu);
  return mp__stats_put("mp_direct_get_stats", &s, out, size);
}

/* MP_STATS_SIZE_V1 bytes (stats.h, "Growing"). */
mp_status_t mp_direct_get_stats(mp_direct_t *d, mp_stats_t *out) {
  return mp_direct_get_stats_sized(d, out, MP_STATS_SIZE_V1);
}

/* After a destroy the device refused some blocks of: drops the entries of
 * the blocks it did free (state 0) and brings the deferred list and the
 * byte counts back in line with what is left. */
static void mp__direct_keep_refused(mp_direct_t *d) {
  for (size_t i = 0; i < d->blocks.cap; i++) {
    mp__dslot_t *b;
    /* A removal shifts a later entry into slot i: look at it again. */
    while ((b = mp__ptrmap_at(&d->blocks, i)) != NULL && b->state == 0)
      mp__ptrmap_remove(&d->blocks, b);
  }
  size_t kept = 0;
  d->live_bytes = d->deferred_bytes = 0;
  for (size_t i = 0; i < d->ndeferred; i++)
    if (mp__dmap_find(d, d->deferred[i].ptr) != NULL)
      d->deferred[kept++] = d->deferred[i];
  d->ndeferred = kept;
  for (size_t i = 0; i < d->blocks.cap; i++) {
    const mp__dslot_t *b = mp__ptrmap_at(&d->blocks, i);
    if (b != NULL)
      *(b->state == MP__DIRECT_LIVE ? &d->live_bytes : &d->deferred_bytes) +=
          b->bytes;
  }
}

/* In a child forked while threads of its parent (or of an earlier
 * ancestor) gave sessions back, those sessions stay in inflight, their
 * threads gone: nothing here would ever free their blocks or records. The
 * blocks whose device free had not begun at the fork ([started, n)) are
 * still allocated in this process's copy of the device: they go back into
 * the session (deferred), for destroy to free with the rest, and the
 * records are freed. A block whose free was under way (started > done)
 * may or may not have gone, and its address may since be another
 * allocation's: it is left alone, lost to this process, rather than freed
 * a second time. The blocks go into the room kept for them (restoring):
 * nothing is allocated. No other thread of this process uses d (destroy's
 * contract), so every session in flight is an orphan. */
static void mp__direct_adopt_orphans(mp_direct_t *d) {
  while (d->inflight != NULL) {
    mp__dsession_t *x = d->inflight;
    mp__dbatch_t *batch = (mp__dbatch_t *)x; /* sess is its first member */
    for (size_t i = x->started; i < x->n; i++)
      mp__direct_returned(d, batch->blocks[i], true);
    /* The one whose free was under way ([done, started)) is left alone. */
    d->restoring -= x->started - x->done;
    d->inflight = x->next;
    free(batch);
  }
}

mp_status_t mp_direct_destroy(mp_direct_t *d) {
  if (d == NULL)
    return mp__fail(MP_EINVAL, "mp_direct_destroy: allocator is NULL");
  mp__direct_adopt_orphans(d);
  /* No other thread may use d now, so the lock is not needed. A failure
   * leaves d usable and holding what it still holds: a synchronization
   * that fails (a call from a host function) frees nothing, since work on
   * the blocks could still be running; blocks the device refuses to free
   * stay, for a later destroy. Lost with d, their memory would be gone. */
  if (d->blocks.count > 0) {
    mp_status_t first = mp__direct_capture_check(
        d, NULL, "mp_direct_destroy", "that comes before the frees",
        "nothing was freed, and the allocator stays usable: destroy it once "
        "the capture has ended");
    if (first != MP_OK)
      return first;
    first = mp_device_synchronize(d->dev);
    if (first != MP_OK)
      return first;
    for (size_t i = 0; i < d->blocks.cap; i++) {
      mp__dslot_t *b = mp__ptrmap_at(&d->blocks, i);
      if (b == NULL)
        continue;
      mp_status_t st = mp__device_free(d->dev, (void *)b->key);
      if (st == MP_OK) {
        d->st.device_free_count++;
        b->state = 0;
      } else if (first == MP_OK) {
        first = st;
      }
    }
    if (first != MP_OK) {
      mp__direct_keep_refused(d);
      return first;
    }
  }
  pthread_cond_destroy(&d->released);
  pthread_mutex_destroy(&d->mu);
  mp__ptrmap_destroy(&d->blocks);
  free(d->deferred);
  free(d);
  return MP_OK;
}
