/* state.c - the shim's state: environment, lazy start, fork, the nesting
 * of hooks, the table of pointers the shim knows, and the small helpers
 * every hook uses (error codes, streams). Calls devices.c and record.c
 * (the start opens the trace; fork), below it; the files above that keep
 * state of their own and must forget it in a forked child (graphs.c,
 * host.c) register their own handler.
 *
 * The start is lazy (the first hooked call), thread-safe (one mutex, after
 * which the state is read-only), and cannot recurse: a hook reached from
 * inside the start, in the starting thread, is passed through. Every
 * problem with the environment ends in a one-line message on stderr and
 * passthrough, never in a failed process.
 *
 * The invariants: the state is either not started or complete and never
 * changes again in this process (so hooks read it without a lock); a forked
 * child starts over with nothing of the parent's pool (its locks and
 * threads did not survive the fork); at exit nothing is torn down, because
 * the runtime's own exit handlers may still free memory after ours ran. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "preload.h"

/* ---- nesting ---------------------------------------------------------- */

static _Thread_local int mp__depth;

bool mp__pl_enter(void) {
  return mp__depth++ == 0;
}

void mp__pl_leave(void) {
  mp__depth--;
}

/* ---- the table of known pointers --------------------------------------- */

/* An mp__ptrmap_t of mp__pl_block_t keyed by address (ptrmap.c), so exact
 * lookups (every free) are O(1); the rare interior-pointer query of
 * cuMemGetAddressRange scans, which is fine for a call made once per
 * buffer by IPC and communication libraries. */
static struct {
  pthread_mutex_t lock;
  mp__ptrmap_t map;
  uint64_t claims; /* the last claim's number (mp__pl_table_claim) */
} mp__tab = {.lock = PTHREAD_MUTEX_INITIALIZER,
             .map = {.esize = sizeof(mp__pl_block_t)}};

/* Without host memory for the entry the pointer goes unrecorded and the put
 * says so (false). A block the shim served (a pool's, the host pool's, the
 * host device's) could never be freed, and its caller gives it back
 * (mp__pl_pool_served, host.c, runtime.c); memory of the real driver's
 * would be freed by it untraced (what happens to every pointer the shim
 * does not know), and its caller gives it back too (driver.c, runtime.c,
 * host.c); a graph's outputs stop their launch (graphs.c). A known
 * address is overwritten: the driver handed it out again after a free the
 * shim did not see. Claimed, the entry goes in with a claim of its own
 * (b->claim its number; mp__pl_table_put_pool_claimed), unclaimed
 * otherwise. */
static bool mp__table_put_whole(mp__pl_block_t *b, bool claimed) {
  pthread_mutex_lock(&mp__tab.lock);
  mp__pl_block_t *e = mp__ptrmap_put(&mp__tab.map, b->ptr);
  if (e != NULL) {
    b->claim = claimed ? ++mp__tab.claims : 0;
    *e = *b;
  }
  pthread_mutex_unlock(&mp__tab.lock);
  return e != NULL;
}

bool mp__pl_table_put(uintptr_t ptr, size_t size, uintptr_t stream,
                      mp__pl_kind_t kind) {
  return mp__table_put_whole(&(mp__pl_block_t){.ptr = ptr,
                                               .size = size,
                                               .stream = stream,
                                               .kind = kind,
                                               .ordinal = -1},
                             false);
}

bool mp__pl_table_put_hostmem(uintptr_t ptr, size_t size, unsigned flags,
                              int ordinal) {
  return mp__table_put_whole(&(mp__pl_block_t){.ptr = ptr,
                                               .size = size,
                                               .kind = MP__PL_FROM_HOSTMEM,
                                               .ordinal = ordinal,
                                               .host_flags = flags},
                             false);
}

/* A block of pool into *out and the table (claimed: see
 * mp__table_put_whole). */
static bool mp__table_put_pool_as(uintptr_t ptr, size_t size, uintptr_t stream,
                                  mp_pool_t *pool, mp__pl_block_t *out,
                                  bool claimed) {
  *out = (mp__pl_block_t){.ptr = ptr,
                          .size = size,
                          .stream = stream,
                          .kind = MP__PL_FROM_POOL,
                          .pool = pool,
                          .ordinal = -1};
  return mp__table_put_whole(out, claimed);
}

bool mp__pl_table_put_pool(uintptr_t ptr, size_t size, uintptr_t stream,
                           mp_pool_t *pool) {
  mp__pl_block_t b;
  return mp__table_put_pool_as(ptr, size, stream, pool, &b, false);
}

bool mp__pl_table_put_pool_claimed(uintptr_t ptr, size_t size, uintptr_t stream,
                                   mp_pool_t *pool, mp__pl_block_t *out) {
  return mp__table_put_pool_as(ptr, size, stream, pool, out, true);
}

bool mp__pl_table_put_real(uintptr_t ptr, size_t size, uintptr_t stream,
                           mp__pl_kind_t kind, int ordinal) {
  return mp__table_put_whole(&(mp__pl_block_t){.ptr = ptr,
                                               .size = size,
                                               .stream = stream,
                                               .kind = kind,
                                               .ordinal = ordinal},
                             false);
}

/* A free claims its entry (mp__pl_table_claim) and the entry stays where it
 * is until the free is done (mp__pl_table_end): dropped when the free went
 * through, its claim lifted when it was refused. Neither needs host memory, so
 * a refused free cannot lose the entry (before, the entry was taken out and put
 * back, and a put that found no host memory left the program's block unknown:
 * its next free refused, or passed to the driver untraced). A claimed entry is
 * as absent to every other reader (a second free, a lookup, a reset's
 * forgetting, a capture's end): the free in progress owns it. A put of the
 * same address overwrites it, unclaimed (its memory handed out again once
 * the free went through), and the claim's drop or lift then leaves that
 * new entry alone: each claim has its own number. */
bool mp__pl_table_claim(uintptr_t ptr, mp__pl_block_t *out) {
  pthread_mutex_lock(&mp__tab.lock);
  mp__pl_block_t *e = mp__ptrmap_find(&mp__tab.map, ptr);
  bool found = e != NULL && e->claim == 0;
  if (found) {
    e->claim = ++mp__tab.claims;
    *out = *e;
  }
  pthread_mutex_unlock(&mp__tab.lock);
  return found;
}

/* The entry b's claim holds, under the lock; NULL when it is gone or
 * another entry took its address. */
static mp__pl_block_t *mp__table_claimed(const mp__pl_block_t *b) {
  mp__pl_block_t *e = mp__ptrmap_find(&mp__tab.map, b->ptr);
  return e != NULL && b->claim != 0 && e->claim == b->claim ? e : NULL;
}

void mp__pl_table_end(const mp__pl_block_t *b, bool freed) {
  pthread_mutex_lock(&mp__tab.lock);
  mp__pl_block_t *e = mp__table_claimed(b);
  if (e != NULL && freed)
    mp__ptrmap_remove(&mp__tab.map, e);
  else if (e != NULL)
    e->claim = 0;
  pthread_mutex_unlock(&mp__tab.lock);
}

bool mp__pl_table_take(uintptr_t ptr, mp__pl_block_t *out) {
  pthread_mutex_lock(&mp__tab.lock);
  mp__pl_block_t *e = mp__ptrmap_find(&mp__tab.map, ptr);
  bool found = e != NULL && e->claim == 0;
  if (found) {
    *out = *e;
    mp__ptrmap_remove(&mp__tab.map, e);
  }
  pthread_mutex_unlock(&mp__tab.lock);
  return found;
}

/* The block of kind containing addr (its start or inside it). */
static bool mp__table_find_kind(uintptr_t addr, mp__pl_kind_t kind,
                                mp__pl_block_t *out) {
  bool found = false;
  pthread_mutex_lock(&mp__tab.lock);
  const mp__pl_block_t *exact = mp__ptrmap_find(&mp__tab.map, addr);
  if (exact != NULL && exact->kind == kind && exact->claim == 0) {
    *out = *exact;
    found = true;
  }
  for (size_t k = 0; !found && k < mp__tab.map.cap; k++) {
    const mp__pl_block_t *b = mp__ptrmap_at(&mp__tab.map, k);
    if (b != NULL && b->kind == kind && b->claim == 0 && addr >= b->ptr &&
        addr - b->ptr < (b->size ? b->size : 1)) {
      *out = *b;
      found = true;
    }
  }
  pthread_mutex_unlock(&mp__tab.lock);
  return found;
}

bool mp__pl_table_find_pool(uintptr_t addr, mp__pl_block_t *out) {
  return mp__table_find_kind(addr, MP__PL_FROM_POOL, out);
}

bool mp__pl_table_find_hostmem(uintptr_t addr, mp__pl_block_t *out) {
  return mp__table_find_kind(addr, MP__PL_FROM_HOSTMEM, out);
}

/* Removes every entry of kind, pool and ordinal (NULL and -1 where the
 * kind has none) and traces each with traced. The blocks are taken out under
 * the table's lock and traced after it (tracing reads the pool's statistics,
 * whose lock is never taken inside the table's), as many at a time as a buffer
 * sized from the table holds. A removal shifts later members of a probe
 * run back into the hole (ptrmap.c), never into a slot already passed but
 * this one: slot k is looked at again after each removal. */
static size_t mp__table_forget(mp__pl_kind_t kind, mp_pool_t *pool, int ordinal,
                               void (*traced)(const mp__pl_block_t *)) {
  size_t n = 0;
  bool more = true;
  while (more) {
    pthread_mutex_lock(&mp__tab.lock);
    size_t cap = mp__tab.map.count;
    pthread_mutex_unlock(&mp__tab.lock);
    mp__pl_block_t *gone = malloc((cap ? cap : 1) * sizeof *gone);
    size_t got = 0, room = gone != NULL ? (cap ? cap : 1) : 0;
    more = false;
    pthread_mutex_lock(&mp__tab.lock);
    for (size_t k = 0; k < mp__tab.map.cap;) {
      mp__pl_block_t *b = mp__ptrmap_at(&mp__tab.map, k);
      if (b == NULL || b->kind != kind || b->pool != pool ||
          b->ordinal != ordinal || b->claim != 0) {
        k++;
      } else if (got == room) {
        more = gone != NULL; /* without a buffer: left in the table */
        break;
      } else {
        gone[got++] = *b;
        mp__ptrmap_remove(&mp__tab.map, b);
      }
    }
    pthread_mutex_unlock(&mp__tab.lock);
    for (size_t i = 0; i < got; i++)
      traced(&gone[i]);
    n += got;
    free(gone);
  }
  return n;
}

static void mp__traced_free(const mp__pl_block_t *b) {
  mp__pl_record_free(b->ptr, b->size, b->stream);
}

static void mp__traced_pinned_free(const mp__pl_block_t *b) {
  mp__pl_record_other("pinned_free", b->ptr, b->size);
}

size_t mp__pl_table_forget_pool(mp_pool_t *pool) {
  return mp__table_forget(MP__PL_FROM_POOL, pool, -1, mp__traced_free);
}

size_t mp__pl_table_forget_hostmem(int ordinal) {
  return mp__table_forget(MP__PL_FROM_HOSTMEM, NULL, ordinal,
                          mp__traced_pinned_free);
}

/* -1 is every block of no primary context's: never forgotten by a reset
 * (a program's cuDevicePrimaryCtxReset(-1) is the driver's error). */
size_t mp__pl_table_forget_real(int ordinal) {
  if (ordinal < 0)
    return 0;
  return mp__table_forget(MP__PL_FROM_REAL, NULL, ordinal, mp__traced_free) +
         mp__table_forget(MP__PL_FROM_REAL_HOST, NULL, ordinal,
                          mp__traced_pinned_free);
}

/* ---- the start ---------------------------------------------------------- */

static atomic_int mp__started; /* 0: not yet, 1: complete */
static pthread_mutex_t mp__start_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool mp__starting_here;
static mp__pl_t mp__state = {.mode = MP__PL_PASSTHROUGH};
static const mp__pl_t mp__passthrough = {.mode = MP__PL_PASSTHROUGH};

/* Whether this thread's fork prepare took the start's lock: not when it
 * forks inside the start, which holds the lock already (cuInit forks and
 * execs nvidia-modprobe where the device files or the nvidia-uvm module
 * are missing, and the start's mp_device_open may be the process's first
 * cuInit: a program whose first call is cudaMalloc). Taken again there, a
 * lock of its own: the process hung in its first hooked call. */
static _Thread_local bool mp__fork_took_start;

static void mp__fork_prepare(void) {
  mp__fork_took_start = !mp__starting_here;
  if (mp__fork_took_start)
    pthread_mutex_lock(&mp__start_lock);
  pthread_mutex_lock(&mp__tab.lock);
  mp__pl_record_prepare();
}

static void mp__fork_parent(void) {
  mp__pl_record_parent();
  pthread_mutex_unlock(&mp__tab.lock);
  if (mp__fork_took_start)
    pthread_mutex_unlock(&mp__start_lock);
}

/* The child keeps none of the parent's pool: other threads may have held
 * its lock at the fork, the host device's workers are gone, and a CUDA
 * context does not survive fork. It is left untouched (its memory belongs
 * to the parent's device) and the child starts over on its first call.
 * Left, as the pool is at exit, not lost: mp__parents still points at it
 * (never read, so marked used to keep the store), and a leak checker in
 * the child does not report it. */
__attribute__((used)) static mp__pl_t mp__parents;

static void mp__fork_child(void) {
  pthread_mutex_init(&mp__start_lock, NULL);
  pthread_mutex_init(&mp__tab.lock, NULL);
  mp__pl_devices_child();
  mp__ptrmap_destroy(&mp__tab.map);
  mp__parents = mp__state;
  mp__state = mp__passthrough;
  atomic_store(&mp__started, 0);
  mp__pl_record_child();
}

/* "cuda:N" -> N; "cuda" -> 0. */
static int mp__spec_ordinal(const char *spec) {
  if (strncmp(spec, "cuda:", 5) != 0)
    return 0;
  char *end = NULL;
  long n = strtol(spec + 5, &end, 10);
  return (end != spec + 5 && n >= 0 && n < 1 << 20) ? (int)n : 0;
}

static void mp__start(mp__pl_t *pl) {
  static bool atfork_done; /* handlers survive fork: register once */
  if (!atfork_done) {
    atfork_done = true;
    pthread_atfork(mp__fork_prepare, mp__fork_parent, mp__fork_child);
  }
  *pl = mp__passthrough;
  const char *mode = getenv("MEMPOOL_PRELOAD");
  if (mode != NULL && mode[0] != '\0' && strcmp(mode, "pool") != 0) {
    if (strcmp(mode, "passthrough") != 0)
      MP__PL_SAY("MEMPOOL_PRELOAD='%s' is neither 'pool' nor 'passthrough'; "
                 "passing every call through to CUDA",
                 mode);
    mp__pl_record_open(pl);
    return;
  }
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  mp__pl_devices_config(&cfg);
  const char *conf = getenv("MEMPOOL_CONF");
  if (conf != NULL && mp_pool_config_parse(&cfg, conf) != MP_OK) {
    MP__PL_SAY("bad MEMPOOL_CONF: %s; passing every call through to CUDA",
               mp_last_error());
    mp__pl_record_open(pl);
    return;
  }
  const char *spec = getenv("MEMPOOL_DEVICE");
  if (spec == NULL || spec[0] == '\0')
    spec = "cuda";
  mp_device_t *dev = NULL;
  mp_pool_t *pool = NULL;
  mp_status_t st = mp_device_open(spec, &dev);
  if (st != MP_OK) {
    MP__PL_SAY("cannot open MEMPOOL_DEVICE '%s': %s; passing every call "
               "through to CUDA",
               spec, mp_last_error());
  } else if ((st = mp_pool_create(dev, &cfg, &pool)) != MP_OK) {
    MP__PL_SAY("cannot create the pool on '%s': %s; passing every call "
               "through to CUDA",
               mp_device_name(dev), mp_last_error());
    mp_device_close(dev);
  } else {
    pl->mode = MP__PL_POOL;
    pl->pool = pool;
    pl->dev = dev;
    pl->host = strncmp(mp_device_name(dev), "host", 4) == 0;
    pl->ordinal = mp__spec_ordinal(spec);
    mp__pl_devices_config(&cfg);
    /* cuMemFree waits for the legacy NULL stream's work too. */
    if (!pl->host)
      (void)mp_pool_add_stream(pool, NULL);
    if (!pl->host)
      mp__pl_devices_put(pl->ordinal, dev, pool);
  }
  mp__pl_record_open(pl);
}

const mp__pl_t *mp__pl_get(void) {
  if (MP__LIKELY(atomic_load_explicit(&mp__started, memory_order_acquire)))
    return &mp__state;
  if (mp__starting_here)
    return &mp__passthrough; /* a hook reached from inside the start */
  pthread_mutex_lock(&mp__start_lock);
  if (!atomic_load(&mp__started)) {
    mp__starting_here = true;
    mp__start(&mp__state);
    mp__starting_here = false;
    atomic_store_explicit(&mp__started, 1, memory_order_release);
  }
  pthread_mutex_unlock(&mp__start_lock);
  return &mp__state;
}

const mp__pl_t *mp__pl_started(void) {
  return atomic_load(&mp__started) ? &mp__state : NULL;
}

/* ---- helpers of the hooks ---------------------------------------------- */

mp__curesult mp__pl_cu_error(mp_status_t st) {
  switch (st) {
  case MP_OK: return MP__CU_SUCCESS;
  case MP_EINVAL: return MP__CU_INVALID_VALUE;
  case MP_ENOMEM:
  case MP_ELIMIT: return MP__CU_OUT_OF_MEMORY;
  case MP_ENODEV: return MP__CU_NO_DEVICE;
  case MP_EDRIVER: /* the driver's own code, where the pool kept it */
    return mp_last_driver_error() > 0 ? (mp__curesult)mp_last_driver_error()
                                      : MP__CU_UNKNOWN;
  default: return MP__CU_UNKNOWN;
  }
}

/* The runtime's code for the driver's code cu: the same number wherever
 * driver_types.h has one (CUDA 13.0's cuda.h and driver_types.h agree on
 * the number and the meaning of every code both name: 700 is
 * CUDA_ERROR_ILLEGAL_ADDRESS and cudaErrorIllegalAddress, 719
 * CUDA_ERROR_LAUNCH_FAILED and cudaErrorLaunchFailure); the driver's codes
 * the runtime does not name (202 CUDA_ERROR_CONTEXT_ALREADY_CURRENT, 916
 * CUDA_ERROR_KEY_ROTATION, any later one) are cudaErrorUnknown. */
static mp__cudaerr mp__pl_runtime_code(int cu) {
  static const int named[][2] = {{1, 8},     {34, 34},   {36, 36},   {46, 46},
                                 {100, 102}, {200, 201}, {205, 226}, {300, 304},
                                 {400, 402}, {500, 500}, {600, 600}, {700, 705},
                                 {708, 721}, {800, 812}, {900, 915}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    if (cu >= named[i][0] && cu <= named[i][1])
      return (mp__cudaerr)cu;
  return MP__CUDA_UNKNOWN;
}

mp__cudaerr mp__pl_cuda_error(mp_status_t st) {
  switch (st) {
  case MP_OK: return MP__CUDA_SUCCESS;
  case MP_EINVAL: return MP__CUDA_INVALID_VALUE;
  case MP_ENOMEM:
  case MP_ELIMIT: return MP__CUDA_MEMORY_ALLOCATION;
  case MP_ENODEV: return MP__CUDA_NO_DEVICE;
  case MP_EDRIVER: return mp__pl_runtime_code(mp_last_driver_error());
  default: return MP__CUDA_UNKNOWN;
  }
}

/* The host device has its own streams, unrelated to the program's handles:
 * everything goes to its NULL stream. On CUDA the legacy handle 0x1 is the
 * NULL stream, and NULL in a per-thread (_ptsz) call is the thread's
 * stream. */
mp_stream_t mp__pl_stream(const mp__pl_t *pl, mp__custream s, bool ptsz) {
  if (pl->host || s == MP__CU_STREAM_LEGACY)
    return NULL;
  if (ptsz && s == NULL)
    return (mp_stream_t)MP__CU_STREAM_PER_THREAD;
  return (mp_stream_t)s;
}
