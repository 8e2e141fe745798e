/* host_pool.c - the host pool: a caching allocator for page-locked host
 * memory, made of the device pool (src/pool) over the pinned view of a
 * device (device/pinned.c). Nothing here allocates: every call goes to the
 * mp_pool_t, which brings best fit, stream-ordered reuse, the cap, trim,
 * stats, dump and check; this file only owns the view's lifetime and fixes
 * the configuration a page-locked pool needs.
 *
 * The host writes a page-locked buffer directly, outside any stream's
 * order (it fills a staging buffer, then queues the copy that reads it), so
 * a freed buffer may serve the next request, whatever its stream, only once
 * every stream it was used on has reached the free: stream order alone
 * would let the host overwrite a buffer that a copy still queued on that
 * stream has not read yet. PyTorch's CachingHostAllocator keeps the same
 * rule (a pinned block is reused only after the events recorded for each
 * stream that used it complete). The device pool's own rule is stream
 * order (a block freed on s is reused at once on s), so every buffer is
 * allocated for a private stream of the host pool that never carries work
 * (hp->host: it stands for the host), and the caller's stream is recorded
 * as a use of it (as mp_pool_record_stream records it, in the
 * allocation's own hold of the pool's lock: mp__pool_alloc_used): the
 * pool then hands a freed buffer to anyone only once that stream has
 * reached the free.
 *
 * Invariant: hp->pool draws from hp->view, which lives until the pool is
 * destroyed; hp->host is a stream of the underlying device that no work is
 * ever queued on, destroyed after the pool. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "pool/pool_internal.h" /* mp__config_env_check, mp__round_up */
#include "structs.h"

struct mp_host_pool {
  mp_pool_t *pool;
  mp_device_t *view;
  mp_device_t *dev; /* the underlying device, hp->host's */
  /* The host's own stream: every buffer is allocated for it. */
  mp_stream_t host;
  /* The pool has the default stream's slot for good (made at its first
   * allocation, and a call was served on it: mp__hp_enter then looks no
   * further; never forgotten: mp_stream_forget ignores NULL). */
  atomic_bool null_slot;
  /* A stream other than the default one was named to the pool (an
   * allocation's, a record's), before its use was recorded: until then
   * every use of a live buffer is the default stream's, which is never
   * captured (mp__hp_capturing), and a free looks for none. */
  atomic_bool named;
  /* Buffers a captured graph uses (mp__hp_hold_t), under the pool's
   * lock; nholds counts them (0: nothing to look for, no lock taken). */
  struct mp__hp_hold *holds;
  atomic_size_t nholds;
  struct mp__hp_keep *keep;
  unsigned seen; /* keep->gone when the holds were last looked at */
};

/* Graphs. Work queued on a capturing stream is not run: it is recorded
 * into the graph and runs at each cuGraphLaunch of an executable made
 * from it, and so is an event recorded there (cuda.h, cuStreamBeginCapture
 * and cuEventRecord: "the event records a node in the graph"). No fence
 * the pool records stands for a graph's reads then: one recorded in the
 * capture never completes outside it, and one recorded after it completes
 * at once. So a buffer used by captured work is held: once it is freed it
 * goes back to the pool only when every graph that may use it is gone
 * (mp__device_capture_on_release: the graph and every executable made
 * from it destroyed, their launches done; CUDA's user objects). The pool
 * learns of such a use where the host pool is told of a stream while it
 * captures: a buffer allocated for it or named for it (record_stream), or
 * freed while a stream that used it captures. PyTorch's
 * CachingHostAllocator never reuses a pinned block allocated during a
 * capture; a graph's end is a closer bound. A hold that cannot learn its
 * graph's end (no user objects) keeps its buffer until the pool is
 * destroyed. */

/* Shared with the driver's callbacks, which may come after the host pool
 * is destroyed: one reference for the pool, one per callback pending. */
typedef struct mp__hp_keep {
  atomic_uint refs;
  atomic_uint gone; /* graphs gone so far: a change asks for a look */
} mp__hp_keep_t;

typedef struct mp__hp_hold {
  struct mp__hp_hold *next; /* hp->holds, under the pool's lock */
  void *ptr;
  mp__hp_keep_t *keep;
  atomic_uint refs;   /* listed in hp->holds, and one per callback pending */
  atomic_uint graphs; /* graphs that may use ptr and are not gone yet */
  bool freed;         /* the program freed ptr (under the pool's lock) */
} mp__hp_hold_t;

static void mp__hp_keep_drop(mp__hp_keep_t *k) {
  if (atomic_fetch_sub(&k->refs, 1) == 1)
    free(k);
}

static void mp__hp_hold_drop(mp__hp_hold_t *h) {
  if (atomic_fetch_sub(&h->refs, 1) == 1)
    free(h);
}

/* The driver's call (its own thread, where no device call is allowed): a
 * graph that may use h->ptr is gone. */
static void mp__hp_graph_gone(void *arg) {
  mp__hp_hold_t *h = arg;
  mp__hp_keep_t *k = h->keep;
  atomic_fetch_sub(&h->graphs, 1);
  atomic_fetch_add(&k->gone, 1);
  mp__hp_hold_drop(h);
  mp__hp_keep_drop(k);
}

#define MP__CHECK_HP(hp)                                                       \
  do {                                                                         \
    if (MP__UNLIKELY((hp) == NULL))                                            \
      return mp__fail(MP_EINVAL, "%s: host pool is NULL", __func__);           \
  } while (0)

/* The device's refusal of fn where it may not be called (a host function:
 * cuda.h, cuLaunchHostFunc, "must not make any CUDA API calls"), or MP_OK.
 * Create and destroy make and give back the host pool's own stream and the
 * view, which the device refuses there. */
static mp_status_t mp__hp_caller_check(mp_device_t *dev, const char *fn) {
  return dev->ops->caller_check != NULL ? dev->ops->caller_check(dev, fn)
                                        : MP_OK;
}

mp_status_t mp_host_pool_create(mp_device_t *dev, const mp_pool_config_t *cfg,
                                mp_host_pool_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_host_pool_create: out is NULL");
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_host_pool_create: device is NULL");
  /* Before anything is made: the view opened, the stream's create
   * refused there, and the view's close was refused too (it stayed for
   * good, its refusal the message). */
  mp_status_t cst = mp__hp_caller_check(dev, "mp_host_pool_create");
  if (cst != MP_OK)
    return cst;
  mp_pool_config_t c = {0};
  if (cfg != NULL) {
    /* Only as much of *cfg as the caller's header has. */
    mp_status_t st = mp__config_env_check("mp_host_pool_create", cfg);
    if (st != MP_OK ||
        (st = mp__config_in("mp_host_pool_create", cfg, false, &c)) != MP_OK)
      return st;
  }
  /* Page-locked memory cannot be mapped into a reserved range (so it has
   * no pieces of one either), and host buffers are raw pointers that must
   * never move. */
  c.flags = 0;
  c.map_piece = 0;
  /* Every field is set now: a size below this library's would have
   * mp_pool_create fill the rest from $MEMPOOL_CONF, which is the device
   * pool's (host_pool.h). */
  c.struct_size = sizeof c;
  mp_host_pool_t *hp = mp__host_calloc(1, sizeof *hp);
  if (hp == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory creating a host pool");
  hp->dev = dev;
  atomic_init(&hp->null_slot, false);
  atomic_init(&hp->named, false);
  atomic_init(&hp->nholds, 0);
  hp->keep = mp__host_calloc(1, sizeof *hp->keep);
  if (hp->keep == NULL) {
    free(hp);
    return mp__fail(MP_ENOMEM, "out of host memory creating a host pool");
  }
  atomic_init(&hp->keep->refs, 1);
  atomic_init(&hp->keep->gone, 0);
  mp_status_t st = mp__device_pinned_open(dev, &hp->view);
  if (st == MP_OK) {
    /* Page-locking pins whole pages (mlock(2): "all pages that contain a
     * part of the specified address range"): a chunk of part of a page
     * would pin the rest of it unseen, neither counted in reserved_bytes
     * (nor against max_bytes) nor handed out. The view's alignment is the
     * page (pinned.c). A size the rounding would carry past the pool's
     * limit (SIZE_MAX / 2) is left as given, for the pool to judge as it
     * would judge it on the device. */
    size_t page = mp__device_alloc_align(hp->view);
    if (c.segment_bytes % page != 0 && c.segment_bytes <= SIZE_MAX / 2 - page)
      c.segment_bytes = mp__round_up(c.segment_bytes, page);
    st = mp_stream_create(dev, &hp->host);
    bool made = st == MP_OK;
    if (made)
      st = mp_pool_create(hp->view, &c, &hp->pool);
    if (st != MP_OK) {
      /* The refusal is the caller's to read, not what the undoing says. */
      mp__error_saved_t why;
      mp__error_save(&why);
      if (made)
        mp_stream_destroy(dev, hp->host);
      mp_device_close(hp->view);
      mp__error_restore(&why);
    }
  }
  if (st != MP_OK) {
    free(hp->keep);
    free(hp);
    return st;
  }
  *out = hp;
  return MP_OK;
}

static mp_status_t mp__hp_said(mp_status_t st, const char *pool_fn,
                               const char *fn);
static void mp__hp_drain(mp_host_pool_t *hp);

mp_status_t mp_host_pool_destroy(mp_host_pool_t *hp) {
  MP__CHECK_HP(hp);
  /* Before anything changes: a pool with nothing to wait for is destroyed
   * there without a device call, but the host's stream and the view are
   * not (the device refuses mp_stream_destroy and mp_device_close there),
   * and with hp gone they would stay for good, the call MP_OK with their
   * refusal as the last error. */
  mp_status_t cst = mp__hp_caller_check(hp->dev, __func__);
  if (cst != MP_OK)
    return cst;
  mp__hp_drain(hp);
  int gone = 0;
  mp_status_t st = mp__hp_said(mp_pool_destroy_ex(hp->pool, &gone),
                               "mp_pool_destroy", __func__);
  if (!gone)
    return st;
  /* The pool is gone also when the device refused a free after others
   * went (pool.h): the rest of hp goes with it, and that refusal is what
   * the caller hears (hp must not be used again). */
  mp__error_saved_t why;
  mp__error_save(&why);
  mp_stream_destroy(hp->dev, hp->host);
  mp_device_close(hp->view);
  /* Held buffers went with their chunks; a graph still using one must not
   * run again (host_pool.h). Its callback still comes, to the hold. */
  for (mp__hp_hold_t *h = hp->holds, *next; h != NULL; h = next) {
    next = h->next;
    mp__hp_hold_drop(h);
  }
  mp__hp_keep_drop(hp->keep);
  free(hp);
  /* The pool's refusal, or (MP_OK) the caller's last error: what the
   * stream's destroy or the view's close may have recorded is not the
   * call's. */
  mp__error_restore(&why);
  return st;
}

/* The pool's refusal st, said as the host pool's call the caller made:
 * a message "mp_pool_free: ..." names a function they never called. So
 * does a wait the pool refused because a stream that used it is being
 * captured (stream.c, mp__streams_unwaitable: "no mp_pool_destroy while
 * ...", or "no synchronize while ..." from a trim, which names no call at
 * all): an event recorded there would be a node of the graph, and a
 * synchronize would invalidate the capture (cuda.h, cuStreamBeginCapture).
 * That one also says what a host-pool user can do: call again once the
 * capture has ended (the host pool makes no graph pool, so the pool's
 * "until mp_pool_graph_end" forms never reach it). */
static mp_status_t mp__hp_said(mp_status_t st, const char *pool_fn,
                               const char *fn) {
  if (st == MP_OK)
    return st;
  const char *m = mp_last_error();
  char rest[MP__ERROR_MAX];
  size_t n = strlen(pool_fn);
  if (strncmp(m, pool_fn, n) == 0 && m[n] == ':') {
    snprintf(rest, sizeof rest, "%s", m + n);
    return mp__fail(st, "%s%s", fn, rest);
  }
  /* A growth refused (from a host function: src/pool/grow.c) names no
   * call; it is fn's. */
  if (strncmp(m, "growing the pool: ", 18) == 0) {
    snprintf(rest, sizeof rest, "%s", m);
    return mp__fail(st, "%s: %s", fn, rest);
  }
  const char *what[] = {pool_fn, "synchronize"};
  for (size_t i = 0; i < sizeof what / sizeof what[0]; i++) {
    size_t w = strlen(what[i]);
    if (strncmp(m, "no ", 3) != 0 || strncmp(m + 3, what[i], w) != 0)
      continue;
    const char *tail = m + 3 + w;
    if (strncmp(tail, " while ", 7) == 0) {
      snprintf(rest, sizeof rest, "%s", tail + 7);
      return mp__fail(st,
                      "%s: refused while %s; call it again once the capture "
                      "has ended",
                      fn, rest);
    }
    if (tail[0] == ':') { /* "no WHAT: " and the driver's failure */
      snprintf(rest, sizeof rest, "%s", tail);
      return mp__fail(st, "%s%s", fn, rest);
    }
  }
  return st;
}

/* Whether hp's pool has a slot for stream s (the pool forgets a stream
 * when it is destroyed). */
static bool mp__hp_knows(mp_host_pool_t *hp, mp_stream_t s) {
  mp__pool_lock(hp->pool);
  bool known = mp__stream_known(hp->pool, s);
  mp__pool_unlock(hp->pool);
  return known;
}

/* MP_EINVAL, said by fn, unless the device says s is a live stream. */
static mp_status_t mp__hp_stream_live(mp_host_pool_t *hp, mp_stream_t s,
                                      const char *fn) {
  if (mp__device_stream_kind(hp->view, s) == MP__STREAM_BAD)
    return mp__fail(MP_EINVAL, "%s: stream %p is not a live stream of %s", fn,
                    (void *)s, mp_device_name(hp->dev));
  return MP_OK;
}

/* Whether s may be named to hp's pool by fn: a stream the pool has met,
 * else one the device says is live. The pool's own refusal would come
 * only once a buffer is allocated (mp_host_pool_alloc), and names the
 * device view, which the caller never opened. The device is asked (driver
 * calls on CUDA) only for a stream the pool has not met; NULL (the default
 * stream) needs no question. Makes no slot. */
static mp_status_t mp__hp_stream_check(mp_host_pool_t *hp, mp_stream_t s,
                                       const char *fn) {
  if (s == NULL || mp__hp_knows(hp, s))
    return MP_OK;
  return mp__hp_stream_live(hp, s, fn);
}

/* Ends the hold of a call of mp_host_pool_alloc on s's slot (pool's
 * lock held; served: it got a buffer, which uses s). The last call of a
 * fresh slot, refused, takes it back (a refusal changes nothing, and trim
 * and destroy wait only for streams that used the pool), in every arena
 * too, as it was made there (the pool's lock, then each arena's); kept
 * where something else used it meanwhile. A slot a call was served on
 * stays for good: the default stream's is found without the lock from
 * then on. */
static void mp__hp_unpin(mp_host_pool_t *hp, mp_stream_t s, uint64_t pin,
                         bool served) {
  mp_pool_t *pool = hp->pool;
  if (mp__stream_unpin(pool, s, pin, served))
    for (size_t i = 0; pool->arenas != NULL && i < pool->cfg.arenas; i++) {
      mp_pool_t *a = mp__arena_at(pool, i);
      if (a == NULL)
        continue;
      mp__pool_lock(a);
      (void)mp__stream_unmake(a, s);
      mp__pool_unlock(a);
    }
  if (s == NULL && served)
    atomic_store_explicit(&hp->null_slot, true, memory_order_release);
}

/* Makes the slot of s, which the pool lacks (its lock held), as
 * mp_pool_add_stream makes it (in the pool, then in each arena), fresh
 * and pinned for the calling mp_host_pool_alloc (*pin: its pin); on
 * failure none of it stays. */
static mp_status_t mp__hp_make(mp_host_pool_t *hp, mp_stream_t s,
                               uint64_t *pin) {
  mp_status_t st = mp__arena_add_stream_locked(hp->pool, s);
  /* Refused in an arena: the pool's slot, made, goes again with them. */
  if (mp__stream_pin(hp->pool, s, true, pin) >= 0 && st != MP_OK)
    mp__hp_unpin(hp, s, *pin, false);
  return st;
}

/* mp_host_pool_alloc's stream check (mp__hp_stream_check's), which with
 * add also makes the slot of a stream the pool has not met, and holds the
 * slot for the call (*pinned: the pin, 0 for none) while it is fresh
 * (made by a call in flight, none of them served yet), so that no other
 * call's refusal takes it back before this one ends (mp__hp_leave). A
 * slot is made under the lock that found it missing: fresh only where a
 * call of the host pool made it. The default stream's slot is made at its
 * first allocation, not at create: trim and destroy wait for every stream
 * the pool knows, and the default stream (on CUDA the legacy stream,
 * which waits for every blocking stream, and makes them MP_EBUSY while
 * one captures) need not have used the pool. */
static mp_status_t mp__hp_enter(mp_host_pool_t *hp, mp_stream_t s, bool add,
                                const char *fn, uint64_t *pinned) {
  mp_pool_t *pool = hp->pool;
  uint64_t pin = 0;
  *pinned = 0;
  if (s == NULL && atomic_load_explicit(&hp->null_slot, memory_order_acquire))
    return MP_OK;
  mp__pool_lock(pool);
  int k = mp__stream_pin(pool, s, false, &pin);
  mp__pool_unlock(pool);
  if (k >= 0) {
    *pinned = k == 1 ? pin : 0;
    if (s == NULL && k == 0) /* settled: it stays for good */
      atomic_store_explicit(&hp->null_slot, true, memory_order_release);
    return MP_OK;
  }
  mp_status_t st = s != NULL ? mp__hp_stream_live(hp, s, fn) : MP_OK;
  if (st != MP_OK || !add)
    return st;
  mp__pool_lock(pool);
  k = mp__stream_pin(pool, s, false, &pin); /* made meanwhile by another */
  if (k < 0 && (st = mp__hp_make(hp, s, &pin)) == MP_OK)
    k = 1;
  mp__pool_unlock(pool);
  if (st != MP_OK)
    return mp__hp_said(st, "mp_pool_add_stream", fn);
  *pinned = k == 1 ? pin : 0;
  return MP_OK;
}

/* Ends mp__hp_enter's hold on s's slot, if it took one (pinned, its pin:
 * 0 when none). */
static void mp__hp_leave(mp_host_pool_t *hp, mp_stream_t s, uint64_t pinned,
                         bool served) {
  if (pinned == 0)
    return;
  mp__pool_lock(hp->pool);
  mp__hp_unpin(hp, s, pinned, served);
  mp__pool_unlock(hp->pool);
}

/* Whether work queued on s now goes into a graph (cuStreamIsCapturing:
 * allowed during a capture, never waits). An invalidated capture (-1) makes
 * no graph that runs; the legacy stream (NULL) is never captured (cuda.h,
 * cuStreamBeginCapture: not "the legacy NULL stream"). */
static bool mp__hp_capturing(mp_host_pool_t *hp, mp_stream_t s) {
  return s != NULL && mp__device_stream_capturing(hp->dev, s) == 1;
}

/* ptr's hold, or NULL; under the pool's lock. */
static mp__hp_hold_t *mp__hp_hold_of(mp_host_pool_t *hp, const void *ptr,
                                     mp__hp_hold_t ***at) {
  for (mp__hp_hold_t **p = &hp->holds; *p != NULL; p = &(*p)->next)
    if ((*p)->ptr == ptr) {
      if (at != NULL)
        *at = p;
      return *p;
    }
  return NULL;
}

/* Unlinks *at's hold (under the pool's lock) and drops the list's
 * reference. */
static void mp__hp_unhold(mp_host_pool_t *hp, mp__hp_hold_t **at) {
  mp__hp_hold_t *h = *at;
  *at = h->next;
  atomic_fetch_sub(&hp->nholds, 1);
  mp__hp_hold_drop(h);
}

/* MP_EINVAL, said by fn, when ptr is a held buffer the program freed
 * already: live in the pool, but no longer the program's. */
static mp_status_t mp__hp_not_freed(mp_host_pool_t *hp, const void *ptr,
                                    const char *fn) {
  if (MP__LIKELY(atomic_load_explicit(&hp->nholds, memory_order_relaxed) == 0))
    return MP_OK;
  mp__pool_lock(hp->pool);
  mp__hp_hold_t *h = mp__hp_hold_of(hp, ptr, NULL);
  bool freed = h != NULL && h->freed;
  mp__pool_unlock(hp->pool);
  return freed
             ? mp__fail(MP_EINVAL, "%s: %p is not live (double free?)", fn, ptr)
             : MP_OK;
}

/* ptr's hold at its free: when a graph that may use it lives, it is marked
 * freed (*kept: the pool gets it from mp__hp_drain); else it goes. */
static void mp__hp_free_held(mp_host_pool_t *hp, void *ptr, bool *kept) {
  *kept = false;
  if (atomic_load(&hp->nholds) == 0)
    return;
  mp__pool_lock(hp->pool);
  mp__hp_hold_t **at = NULL;
  mp__hp_hold_t *h = mp__hp_hold_of(hp, ptr, &at);
  if (h != NULL && atomic_load(&h->graphs) != 0)
    *kept = h->freed = true;
  else if (h != NULL)
    mp__hp_unhold(hp, at);
  mp__pool_unlock(hp->pool);
}

/* A hold's record, zeroed; NULL (said, as fn's refusal) without host
 * memory. */
static mp__hp_hold_t *mp__hp_hold_new(const char *fn) {
  mp__hp_hold_t *h = mp__host_calloc(1, sizeof *h);
  if (h == NULL)
    mp__fail(MP_ENOMEM,
             "%s: out of host memory holding a buffer a captured graph uses",
             fn);
  return h;
}

/* Live buffer ptr is used by the graph that s is being captured into: held
 * until that graph is gone. A new hold takes *spare when set (made before
 * a step that cannot be undone: *spare is then NULL), else its own record:
 * MP_ENOMEM (nothing changed) when none can be made. A graph whose end
 * cannot be learnt (s NULL: one not named) holds it for good. */
static mp_status_t mp__hp_hold(mp_host_pool_t *hp, void *ptr, mp_stream_t s,
                               const char *fn, mp__hp_hold_t **spare) {
  mp__pool_lock(hp->pool);
  mp__hp_hold_t *h = mp__hp_hold_of(hp, ptr, NULL);
  if (h == NULL) {
    if (spare != NULL && *spare != NULL) {
      h = *spare;
      *spare = NULL;
    } else if ((h = mp__hp_hold_new(fn)) == NULL) {
      mp__pool_unlock(hp->pool);
      return MP_ENOMEM;
    }
    h->ptr = ptr;
    h->keep = hp->keep;
    atomic_init(&h->refs, 1);
    atomic_init(&h->graphs, 0);
    h->next = hp->holds;
    hp->holds = h;
    atomic_fetch_add(&hp->nholds, 1);
  }
  atomic_fetch_add(&h->graphs, 1);
  atomic_fetch_add(&h->refs, 1);
  atomic_fetch_add(&hp->keep->refs, 1);
  mp__pool_unlock(hp->pool);
  mp__error_saved_t why;
  mp__error_save(&why);
  if (s == NULL || mp__device_capture_on_release(hp->dev, s, mp__hp_graph_gone,
                                                 h) != MP_OK) {
    /* Never told: h->graphs keeps the count (held for good). */
    atomic_fetch_sub(&h->refs, 1);
    mp__hp_keep_drop(hp->keep);
    mp__error_restore(&why);
  }
  return MP_OK;
}

/* Gives the pool back the freed buffers whose graphs are all gone, and
 * forgets the holds of live buffers whose graphs are. No device call
 * under the lock: the buffers are freed after it, a few at a time. */
static void mp__hp_drain(mp_host_pool_t *hp) {
  if (MP__LIKELY(atomic_load_explicit(&hp->nholds, memory_order_relaxed) == 0))
    return;
  bool more = false;
  do {
    void *ready[16];
    size_t n = 0;
    mp__pool_lock(hp->pool);
    unsigned gone = atomic_load(&hp->keep->gone);
    if (more || gone != hp->seen) {
      hp->seen = gone;
      more = false;
      for (mp__hp_hold_t **at = &hp->holds; *at != NULL;) {
        mp__hp_hold_t *h = *at;
        if (atomic_load(&h->graphs) != 0) {
          at = &h->next;
        } else if (!h->freed) {
          mp__hp_unhold(hp, at);
        } else if (n < sizeof ready / sizeof ready[0]) {
          ready[n++] = h->ptr;
          mp__hp_unhold(hp, at);
        } else {
          more = true;
          break;
        }
      }
    }
    mp__pool_unlock(hp->pool);
    for (size_t i = 0; i < n; i++)
      (void)mp_pool_free(hp->pool, ready[i]);
  } while (more);
}

/* s is named to the pool: from now on a live buffer may have a use on a
 * stream that captures (hp->named). Before the use is recorded. */
static void mp__hp_named(mp_host_pool_t *hp, mp_stream_t s) {
  if (s != NULL && !atomic_load_explicit(&hp->named, memory_order_relaxed))
    atomic_store_explicit(&hp->named, true, memory_order_release);
}

mp_status_t mp_host_pool_alloc(mp_host_pool_t *hp, size_t bytes, mp_stream_t s,
                               void **out) {
  MP__CHECK_HP(hp);
  if (out == NULL)
    return mp__fail(MP_EINVAL, "%s: out is NULL", __func__);
  /* The stream before the buffer, and its slot too: a record refused
   * after the buffer grew a chunk (a stream the device does not know, or
   * no host memory for the stream table) would leave that chunk cached.
   * But no slot for a request that gets no buffer: 0 bytes, or a size the
   * pool refuses before it looks for one (it cannot be rounded, or it is
   * past the cap: alloc.c), else trim and destroy would wait for a stream
   * that never used the pool. Nothing of the host pool changes hp->pool's
   * cap or alignment after create: read unlocked. A slot made here for a
   * request the pool then refuses (the device has no page-locked memory
   * for it) is taken back, once no other call that relies on it is in
   * flight (mp__hp_enter). */
  size_t size = 0;
  bool takes = bytes != 0 && mp__pool_round(hp->pool, bytes, &size) &&
               size <= hp->pool->cap;
  uint64_t pinned = 0;
  mp_status_t st = mp__hp_enter(hp, s, takes, __func__, &pinned);
  if (st != MP_OK)
    return st;
  mp__hp_drain(hp);
  mp__hp_named(hp, s);
  void *p = NULL;
  const char *who = "mp_pool_alloc";
  if (MP__LIKELY(takes)) {
    /* The buffer and s's use of it in one hold of the pool's lock (a
     * record refused gives the buffer back, and *out stays). */
    st = mp__pool_alloc_used(hp->pool, bytes, hp->host, s, &p, &who);
  } else {
    st = mp_pool_alloc(hp->pool, bytes, hp->host, &p);
    /* Served after all: the slot now (the one pinned, if any, is there). */
    if (st == MP_OK && p != NULL && pinned == 0)
      st = mp__hp_enter(hp, s, true, __func__, &pinned);
    if (st == MP_OK && p != NULL &&
        (st = mp_pool_record_stream(hp->pool, p, s)) != MP_OK)
      /* Refused (out of host memory for the stream table): the buffer
       * goes back unused, and *out stays. */
      who = "mp_pool_record_stream";
  }
  st = mp__hp_said(st, who, __func__);
  /* Allocated while s captures: the graph uses it (above). */
  if (st == MP_OK && p != NULL && mp__hp_capturing(hp, s))
    st = mp__hp_hold(hp, p, s, __func__, NULL);
  if (st != MP_OK && p != NULL)
    (void)mp_pool_free(hp->pool, p);
  mp__hp_leave(hp, s, pinned, st == MP_OK && p != NULL);
  if (st == MP_OK)
    *out = p;
  return st;
}

/* mp__hp_captured_uses in pool, the pool or the arena holding ptr (its
 * lock held). */
static size_t mp__hp_uses_capturing(mp_host_pool_t *hp, mp_pool_t *pool,
                                    void *ptr, mp_stream_t *cap, size_t n) {
  mp__block_t *b = NULL;
  mp__slot_t *slot = NULL;
  if (mp__pool_find_live(pool, "mp_host_pool_free", ptr, true, false, &b,
                         &slot) != MP_OK)
    return 0;
  /* A use past the block's room (MP__B_MANY_USES) is not named: every
   * stream of the pool may be one. */
  bool many = (b->flags & MP__B_MANY_USES) != 0;
  uint32_t k = many ? pool->nstreams : b->ndeps;
  size_t got = 0;
  for (uint32_t i = 0; i < k; i++) {
    mp__strm_t *t = &pool->streams[many ? i : mp__dep_sidx(b->deps[i])];
    if (t->gone || t->s == hp->host || !mp__hp_capturing(hp, t->s))
      continue;
    if (got < n)
      cap[got] = t->s;
    else
      cap[n - 1] = NULL;
    got++;
  }
  return got < n ? got : n;
}

/* The streams that used live buffer ptr and capture now (at most n of
 * them in cap; more: the rest as NULL, a hold for good); *freed: ptr is
 * held and was freed already. Under the pool's lock. With arenas
 * (cfg->arenas) the pool itself holds no memory (pool_internal.h): ptr's
 * block, and the stream table its uses index, are those of the arena
 * holding ptr, looked at under that arena's lock too (taken after the
 * pool's, the order mp__hp_unpin takes them in). */
static size_t mp__hp_captured_uses(mp_host_pool_t *hp, void *ptr,
                                   mp_stream_t *cap, size_t n, bool *freed) {
  mp__hp_hold_t *h = hp->holds != NULL ? mp__hp_hold_of(hp, ptr, NULL) : NULL;
  *freed = h != NULL && h->freed;
  if (*freed)
    return 0;
  mp_pool_t *pool = hp->pool;
  if (hp->pool->arenas != NULL) {
    pool = mp__arena_owner(hp->pool, ptr);
    if (pool == NULL) /* in no arena: the free says what ptr is */
      return 0;
    mp__pool_lock(pool);
  }
  size_t got = mp__hp_uses_capturing(hp, pool, ptr, cap, n);
  if (pool != hp->pool)
    mp__pool_unlock(pool);
  return got;
}

mp_status_t mp_host_pool_free(mp_host_pool_t *hp, void *ptr) {
  MP__CHECK_HP(hp);
  mp__hp_drain(hp);
  if (ptr == NULL)
    return MP_OK;
  /* Freed while a stream that used it captures: the graph uses it. Only
   * a stream named to the pool may (hp->named; a hold needs one too). */
  mp_stream_t cap[4];
  bool freed = false;
  size_t n = 0;
  if (atomic_load_explicit(&hp->named, memory_order_acquire)) {
    mp__pool_lock(hp->pool);
    n = mp__hp_captured_uses(hp, ptr, cap, 4, &freed);
    mp__pool_unlock(hp->pool);
  }
  if (freed)
    return mp__fail(MP_EINVAL, "%s: %p is not live (double free?)", __func__,
                    ptr);
  for (size_t i = 0; i < n; i++) {
    mp_status_t st = mp__hp_hold(hp, ptr, cap[i], __func__, NULL);
    if (st != MP_OK)
      return st;
  }
  bool kept;
  mp__hp_free_held(hp, ptr, &kept);
  if (kept)
    return MP_OK;
  return mp__hp_said(mp_pool_free(hp->pool, ptr), "mp_pool_free", __func__);
}

mp_status_t mp__host_pool_free_done(mp_host_pool_t *hp, void *ptr) {
  MP__CHECK_HP(hp);
  mp__hp_drain(hp);
  /* Its streams' work is done, but a graph's launches may come later. */
  mp_status_t st = mp__hp_not_freed(hp, ptr, "mp_host_pool_free");
  bool kept = false;
  if (st == MP_OK && ptr != NULL)
    mp__hp_free_held(hp, ptr, &kept);
  return st != MP_OK || kept
             ? st
             : mp__pool_free_done(hp->pool, ptr, "mp_host_pool_free");
}

bool mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr) {
  return hp != NULL && ptr != NULL && mp__pool_contains(hp->pool, ptr);
}

mp_status_t mp_host_pool_record_stream(mp_host_pool_t *hp, void *ptr,
                                       mp_stream_t s) {
  MP__CHECK_HP(hp);
  /* No slot made here: a bad ptr must change nothing (the pool makes the
   * slot only once it found the buffer). */
  mp_status_t st = mp__hp_stream_check(hp, s, __func__);
  if (st == MP_OK)
    st = mp__hp_not_freed(hp, ptr, __func__);
  if (st != MP_OK)
    return st;
  /* Named while s captures: the graph uses it (above). The hold's record
   * first: a use once recorded is not taken back, and a refusal changes
   * nothing (refused after the record, the buffer kept s's use, and its
   * free later held it for a graph whose use was never held). */
  mp__hp_hold_t *spare = NULL;
  if (mp__hp_capturing(hp, s) && (spare = mp__hp_hold_new(__func__)) == NULL)
    return MP_ENOMEM;
  mp__hp_named(hp, s);
  st = mp__hp_said(mp_pool_record_stream(hp->pool, ptr, s),
                   "mp_pool_record_stream", __func__);
  if (st == MP_OK && spare != NULL)
    st = mp__hp_hold(hp, ptr, s, __func__, &spare);
  free(spare); /* unused: refused, or ptr held already */
  return st;
}

mp_status_t mp_host_pool_trim(mp_host_pool_t *hp, size_t keep_bytes) {
  MP__CHECK_HP(hp);
  mp__hp_drain(hp);
  return mp__hp_said(mp_pool_trim(hp->pool, keep_bytes), "mp_pool_trim",
                     __func__);
}

mp_status_t mp_host_pool_get_stats_sized(mp_host_pool_t *hp, mp_stats_t *out,
                                         size_t size) {
  MP__CHECK_HP(hp);
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_host_pool_get_stats: out is NULL");
  mp_stats_t s;
  mp_status_t st = mp_pool_get_stats(hp->pool, &s);
  return st != MP_OK ? st
                     : mp__stats_put("mp_host_pool_get_stats", &s, out, size);
}

/* MP_STATS_SIZE_V1 bytes (stats.h, "Growing"). */
mp_status_t mp_host_pool_get_stats(mp_host_pool_t *hp, mp_stats_t *out) {
  return mp_host_pool_get_stats_sized(hp, out, MP_STATS_SIZE_V1);
}

mp_status_t mp_host_pool_dump(mp_host_pool_t *hp, FILE *out,
                              const char *format) {
  MP__CHECK_HP(hp);
  return mp__hp_said(mp_pool_dump(hp->pool, out, format), "mp_pool_dump",
                     __func__);
}

mp_status_t mp_host_pool_check(mp_host_pool_t *hp) {
  MP__CHECK_HP(hp);
  return mp__hp_said(mp_pool_check(hp->pool), "mp_pool_check", __func__);
}
