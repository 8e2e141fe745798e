/* host.c - the page-locked host memory hooks: cudaMallocHost,
 * cudaHostAlloc, cudaFreeHost, cuMemHostAlloc, cuMemAllocHost_v2 and
 * cuMemFreeHost, served from a host pool (mempool/host_pool.h) on the
 * shim's device, so that a program that pins and unpins staging buffers
 * makes a driver call per 2 MiB chunk instead of one per request.
 *
 * Served from the pool: an outer call in pool mode without the
 * write-combined flag (write-combined memory is a different memory type;
 * it goes to the driver; the host device has none, its pool serves all).
 * Portable and mapped requests are served: the pool's chunks are
 * cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), so
 * cuMemHostGetDevicePointer (which fails for memory allocated without
 * DEVICEMAP, cuda.h) answers for a mapped request, and with unified
 * addressing all page-locked memory from cuMemHostAlloc is mapped into
 * every device at the same address (CUDA Driver API, "Unified
 * Addressing"). cuMemHostGetFlags gives a block the flags it was asked
 * for, not the chunk's (PORTABLE | DEVICEMAP): cuda.h, "the flags pFlags
 * that were specified when allocating the pinned host buffer p"; an
 * address in the chunks but in no live block (a freed one) is
 * CUDA_ERROR_INVALID_VALUE, as it "will fail if the pointer does not
 * reside in an allocation performed by cuMemAllocHost() or
 * cuMemHostAlloc()". cuMemHostGetDevicePointer of a live block is the
 * driver's answer for that address in the chunk (the chunk's device
 * pointer plus the offset); of a freed one CUDA_ERROR_INVALID_VALUE, as
 * the driver refuses memory that is no "mapped, pinned host buffer p
 * allocated by cuMemHostAlloc" (cuda.h), where the chunk, still the
 * driver's, would have given one. A free goes to the pool
 * when the shim's table says the pool handed the pointer out; any other pointer
 * (the driver's, memory from cudaHostRegister is never freed here) goes to the
 * real entry point. Write-combined memory the driver handed out is in the
 * table too (MP__PL_FROM_REAL_HOST), so its free is marked in the trace
 * like its allocation, and a reset of the primary context that allocated
 * it forgets it, traced as freed there (driver.c). cudaHostRegister /
 * cuMemHostRegister are not hooked: registered memory is the program's, never
 * counted or traced. The device-memory frees (cuMemFree*, cudaFree*) of an
 * address in the pool's chunks that is no live block of the program's are
 * refused there, never passed on to the driver (mp__pl_memory_holds).
 *
 * cudaFreeHost and cuMemFreeHost synchronize the devices before the memory
 * goes (the driver's do, as an implicit synchronization); the shim keeps
 * that, so a buffer an async copy still reads is never handed out again,
 * and frees it as finished (mp__host_pool_free_done): the next request
 * gets it at once, not only once a stream thread has seen a marker
 * recorded at the free (under load that came late, and the pool grew a
 * chunk for a program that never holds two buffers).
 *
 * While a capture may be under way (mp__pl_sync_in_capture) a page-locked
 * allocation or free is a potentially unsafe call (cuda.h,
 * cuThreadExchangeStreamCaptureMode), and synchronizing a device is not
 * allowed at all (it would fail and invalidate the program's capture):
 * an allocation then goes to the driver, which answers it (refused where
 * the capture prohibits it, else its memory, known as
 * MP__PL_FROM_REAL_HOST); a free of a pool block gets the driver's refusal
 * where the capture prohibits it (a probe, as for cuMemFree), else
 * succeeds and the block goes back to the pool at the next page-locked
 * call made outside any capture, after that call's synchronization
 * (mp__hpl_flush).
 *
 * 0 bytes through the runtime (cudaMallocHost, cudaHostAlloc) is success
 * with a NULL pointer in pool mode, as the runtime answers it (and its
 * cudaMalloc, runtime.c); the driver's calls keep their invalid value.
 *
 * One host pool per CUDA device, made on the first call served there:
 * the device current at the request (cudaGetDevice for the runtime's
 * calls, cuCtxGetDevice for the driver's; the shim's own device when none
 * is), whose primary context holds the pool's chunks, as the real runtime
 * and driver allocate page-locked memory in the current context. A reset
 * of a device takes only its pool (mp__pl_host_reset): page-locked memory
 * asked for while another device was current survives it, as on a real
 * driver. While the reset is under way, a page-locked allocation on that
 * device goes to the driver (no pool is made in the context being reset;
 * the reset forgets that memory with it). The host device has one pool. A
 * forked child makes its own (its parent's devices are not its devices). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"

/* CU_MEMHOSTALLOC_WRITECOMBINED == cudaHostAllocWriteCombined (cuda.h,
 * cuda_runtime_api.h). */
#define MP__HOST_WRITECOMBINED 0x04u
/* Every flag the driver and the runtime know: PORTABLE, DEVICEMAP (the
 * runtime's Mapped) and WRITECOMBINED; any other is their invalid value. */
#define MP__HOST_FLAGS 0x07u

/* A device's host pool. */
typedef struct mp__hpl_one {
  mp_device_t *dev; /* the device hp was made on; NULL: none made */
  bool own_dev;     /* dev opened for hp (closed with it); else pl->dev */
  mp_host_pool_t *hp;
} mp__hpl_one_t;

static struct {
  pthread_mutex_t lock;
  mp__hpl_one_t at[MP__PL_MAX_DEVICES]; /* by CUDA ordinal (host: 0) */
  /* Blocks the program freed while a capture was under way, still live in
   * their pool: the synchronization a free makes first (mp__hsync_devices)
   * is not allowed then (cuCtxSynchronize during a capture is refused and
   * invalidates it), so they go back to it at the next call outside a
   * capture, after its synchronization (mp__hpl_flush). */
  struct mp__hpl_late {
    void *ptr;
    mp_host_pool_t *hp; /* the pool it came from */
    uint64_t seq;       /* late_seq when it came */
  } * late;
  size_t nlate, late_cap;
  uint64_t late_seq;
  /* The calls using slot i's pool after letting go of the lock (an
   * allocation from it, a free to it), each held from mp__hpl_get or
   * mp__hpl_at until mp__hpl_put: a reset retires the slot's pool, then
   * waits for users[i] to reach 0 (signalled on idle) before it destroys
   * it (mp__pl_host_reset). Counted per slot, not per pool: a call has its
   * slot to give back, and the pool's record leaves the slot when it is
   * retired. */
  unsigned users[MP__PL_MAX_DEVICES];
  pthread_cond_t idle;
  /* The resets of slot i's device under way, from the retirement of its
   * pool (mp__pl_host_reset) until the driver's reset has returned
   * (mp__pl_host_reset_done): meanwhile no pool is made in the slot
   * (mp__hpl_get), as its chunks would be the primary context's that the
   * driver is about to destroy, while the shim still hands out their
   * blocks; a page-locked call on the device goes to the driver, whose
   * memory the reset forgets with its context (driver.c). A count: two
   * threads may reset one device. */
  unsigned resetting[MP__PL_MAX_DEVICES];
} mp__hpl = {.lock = PTHREAD_MUTEX_INITIALIZER,
             .idle = PTHREAD_COND_INITIALIZER};

/* The parent's host pools, left alone in a forked child (their chunks are
 * the parent's devices') but kept reachable, as state.c keeps the parent's
 * pool: a leak checker in the child must not report them. Never read. */
__attribute__((used)) static mp__hpl_one_t mp__hpl_parents[MP__PL_MAX_DEVICES];

static void mp__hpl_child(void) {
  pthread_mutex_init(&mp__hpl.lock, NULL);
  pthread_cond_init(&mp__hpl.idle, NULL);
  memset(mp__hpl.users, 0, sizeof mp__hpl.users); /* the parent's threads' */
  memset(mp__hpl.resetting, 0, sizeof mp__hpl.resetting);
  memcpy(mp__hpl_parents, mp__hpl.at, sizeof mp__hpl_parents);
  memset(mp__hpl.at, 0, sizeof mp__hpl.at);
  free(mp__hpl.late); /* the parent's blocks, in the parent's pools */
  mp__hpl.late = NULL;
  mp__hpl.nlate = mp__hpl.late_cap = 0;
}

/* The slot of the device a page-locked request is made on: the one current
 * (the runtime's device for its calls, the current context's for the
 * driver's), else the shim's own; the host device's one pool is at 0. */
static int mp__hpl_ordinal(const mp__pl_t *pl, bool runtime) {
  if (pl->host)
    return 0;
  unsigned int (*current)(int *) = runtime ? mp__pl_real_cudart()->cudaGetDevice
                                           : mp__pl_real_cuda()->cuCtxGetDevice;
  int d = -1;
  if (current == NULL || current(&d) != 0 || d < 0 || d >= MP__PL_MAX_DEVICES)
    d = pl->ordinal; /* cudaSuccess, CUDA_SUCCESS */
  return d >= 0 && d < MP__PL_MAX_DEVICES ? d : 0;
}

/* Under mp__hpl.lock: whether hp is a pool not retired. */
static bool mp__hpl_live(const mp_host_pool_t *hp) {
  for (int i = 0; hp != NULL && i < MP__PL_MAX_DEVICES; i++)
    if (mp__hpl.at[i].hp == hp)
      return true;
  return false;
}

/* Under mp__hpl.lock: slot at's pool (NULL: none), held for the caller
 * until mp__hpl_put. */
static mp_host_pool_t *mp__hpl_hold_locked(int at) {
  mp_host_pool_t *hp = mp__hpl.at[at].hp;
  if (hp != NULL)
    mp__hpl.users[at]++;
  return hp;
}

/* Lets go of slot at's pool hp that mp__hpl_get or mp__hpl_at gave
 * (NULL: nothing held). */
static void mp__hpl_put(int at, const mp_host_pool_t *hp) {
  if (hp == NULL)
    return;
  pthread_mutex_lock(&mp__hpl.lock);
  if (--mp__hpl.users[at] == 0)
    pthread_cond_broadcast(&mp__hpl.idle);
  pthread_mutex_unlock(&mp__hpl.lock);
}

/* The host pool of device slot `at`, made on first use, held until
 * mp__hpl_put; NULL when it cannot be made, or while the device is
 * being reset and the slot has none (the call then goes to the driver).
 * Each CUDA device is opened for its pool ("cuda:N", a retain of its
 * primary context, which makes that context anew after a reset of it); the
 * host device's one pool is on pl->dev. */
static mp_host_pool_t *mp__hpl_get(const mp__pl_t *pl, int at) {
  static bool atfork_done;
  pthread_mutex_lock(&mp__hpl.lock);
  mp__hpl_one_t *one = &mp__hpl.at[at];
  if (one->hp == NULL && mp__hpl.resetting[at] == 0) {
    if (!atfork_done)
      atfork_done = pthread_atfork(NULL, NULL, mp__hpl_child) == 0;
    bool own = !pl->host;
    mp_device_t *dev = own ? NULL : pl->dev;
    char spec[32];
    snprintf(spec, sizeof spec, "cuda:%d", at);
    mp_host_pool_t *hp = NULL;
    if ((!own || mp_device_open(spec, &dev) == MP_OK) &&
        mp_host_pool_create(dev, NULL, &hp) == MP_OK)
      *one = (mp__hpl_one_t){.dev = dev, .own_dev = own, .hp = hp};
    else if (own && dev != NULL)
      mp_device_close(dev);
  }
  mp_host_pool_t *hp = mp__hpl_hold_locked(at);
  pthread_mutex_unlock(&mp__hpl.lock);
  return hp;
}

/* The host pool of device slot `at` as it is (none made, or out of range:
 * NULL), held until mp__hpl_put. */
static mp_host_pool_t *mp__hpl_at(int at) {
  if (at < 0 || at >= MP__PL_MAX_DEVICES)
    return NULL;
  pthread_mutex_lock(&mp__hpl.lock);
  mp_host_pool_t *hp = mp__hpl_hold_locked(at);
  pthread_mutex_unlock(&mp__hpl.lock);
  return hp;
}

/* Host pools a reset retired that could not be destroyed, and devices of
 * destroyed ones that could not be closed (hp NULL) (said on stderr):
 * never used again, kept reachable until exit (their devices open), as
 * the parent's pool is in a forked child. Under mp__hpl.lock. */
typedef struct mp__hpl_kept {
  mp__hpl_one_t one;
  struct mp__hpl_kept *next;
} mp__hpl_kept_t;
__attribute__((used)) static mp__hpl_kept_t *mp__hpl_kept;

/* Whether a reset of device ordinal takes a host pool (mp__pl_host_reset)
 * and marks its slot resetting until mp__pl_host_reset_done. A reset the
 * driver refuses (from a host function) never comes here (driver.c). */
static bool mp__hpl_resets(const mp__pl_t *pl, int ordinal) {
  return !pl->host && pl->mode == MP__PL_POOL && ordinal >= 0 &&
         ordinal < MP__PL_MAX_DEVICES;
}

/* The chunks of device ordinal's pool are cuMemHostAlloc'd in its primary
 * context (device/cuda.c pushes it for every driver call), and a reset
 * destroys them with it: cuda_runtime_api.h, cudaDeviceReset, "These
 * resources also include memory allocations by ::cudaMalloc,
 * ::cudaMallocHost, ...", and cuda.h, cuCtxDestroy, "memory allocations
 * by ::cuMemAlloc(), ::cuMemAllocHost(), ...". So the pool goes before
 * the reset, as the device pools do (driver.c): its blocks still live are
 * the program's problem, as after a real reset; a later free of one is
 * the driver's answer. The emulated device has no driver to reset. */
void mp__pl_host_reset(const mp__pl_t *pl, int ordinal) {
  if (!mp__hpl_resets(pl, ordinal))
    return;
  mp__hpl_kept_t *keep = calloc(1, sizeof *keep);
  pthread_mutex_lock(&mp__hpl.lock);
  mp__hpl_one_t one = mp__hpl.at[ordinal];
  mp__hpl.at[ordinal] = (mp__hpl_one_t){.dev = NULL};
  /* No new pool in the slot until the driver's reset has returned. */
  mp__hpl.resetting[ordinal]++;
  size_t k = 0; /* its blocks freed late go with it */
  for (size_t i = 0; i < mp__hpl.nlate; i++)
    if (mp__hpl.late[i].hp != one.hp)
      mp__hpl.late[k++] = mp__hpl.late[i];
  mp__hpl.nlate = k;
  /* Not under a call that took it before it was retired (one on another
   * thread, using another device, which the reset's rule does not bind). */
  while (one.hp != NULL && mp__hpl.users[ordinal] > 0)
    pthread_cond_wait(&mp__hpl.idle, &mp__hpl.lock);
  pthread_mutex_unlock(&mp__hpl.lock);
  if (one.hp == NULL) {
    free(keep);
    return;
  }
  (void)mp__pl_table_forget_hostmem(ordinal);
  /* Its own device, once the pool went: a close the device refuses
   * (mp_device_close_ex) leaves it open, kept and said as a pool that
   * cannot go (before, it was dropped open without a word). */
  if (mp_host_pool_destroy(one.hp) == MP_OK) {
    if (!one.own_dev || mp_device_close_ex(one.dev) == MP_OK) {
      free(keep);
      return;
    }
    one.hp = NULL; /* destroyed */
    MP__PL_SAY("cuDevicePrimaryCtxReset: the device of CUDA device %d's "
               "page-locked host pool cannot be closed and is kept open "
               "until exit: %s",
               ordinal, mp_last_error());
  } else
    MP__PL_SAY("cuDevicePrimaryCtxReset: the page-locked host pool of CUDA "
               "device %d cannot be released and is kept until exit: %s",
               ordinal, mp_last_error());
  if (keep == NULL)
    return; /* without memory for the record: lost, as a leak */
  pthread_mutex_lock(&mp__hpl.lock);
  *keep = (mp__hpl_kept_t){.one = one, .next = mp__hpl_kept};
  mp__hpl_kept = keep;
  pthread_mutex_unlock(&mp__hpl.lock);
}

void mp__pl_host_reset_done(const mp__pl_t *pl, int ordinal) {
  if (!mp__hpl_resets(pl, ordinal))
    return;
  pthread_mutex_lock(&mp__hpl.lock);
  if (mp__hpl.resetting[ordinal] > 0)
    mp__hpl.resetting[ordinal]--;
  pthread_mutex_unlock(&mp__hpl.lock);
}

/* Whether ptr lies in a host pool's memory (none made: false). The
 * lookup runs under mp__hpl.lock, which a reset takes to retire a pool
 * before destroying it (mp__pl_host_reset): a free of any device's memory
 * the shim does not know comes here, and a reset of a host pool's device
 * on another thread would otherwise destroy the pool under the lookup (the
 * reset's rule, cuda.h cuDevicePrimaryCtxReset, binds only users of that
 * device). The lock is the one this took already; it is held a little
 * longer, no new lock on the free path. */
static bool mp__hpl_holds(const void *ptr) {
  bool in = false;
  pthread_mutex_lock(&mp__hpl.lock);
  for (int i = 0; i < MP__PL_MAX_DEVICES && !in; i++)
    in = mp__host_pool_contains(mp__hpl.at[i].hp, ptr);
  pthread_mutex_unlock(&mp__hpl.lock);
  return in;
}

bool mp__pl_memory_holds(const mp__pl_t *pl, uintptr_t addr) {
  return mp__pl_pools_hold(pl, addr) || (pl->mode == MP__PL_POOL && addr != 0 &&
                                         mp__hpl_holds((const void *)addr));
}

bool mp__pl_host_block(const mp__pl_t *pl, uintptr_t addr, mp__pl_block_t *b,
                       bool *live) {
  if (pl->mode != MP__PL_POOL || addr == 0 ||
      !mp__hpl_holds((const void *)addr))
    return false;
  *live = mp__pl_table_find_hostmem(addr, b);
  return true;
}

static void mp__hpl_flush(const mp__pl_t *pl, const uint64_t *synced);

void mp__pl_host_report(FILE *f, const mp__pl_t *pl) {
  pthread_mutex_lock(&mp__hpl.lock);
  bool late = mp__hpl.nlate > 0;
  pthread_mutex_unlock(&mp__hpl.lock);
  /* Blocks the program freed during a capture, with no page-locked call
   * made after it, go back first (after a synchronization of the devices,
   * as at that call), so that the counts are the program's: else they
   * read as allocated, a leak it did not make. Not while a capture is
   * still under way (the synchronization is refused then). */
  if (late) {
    if (mp__pl_enter() && !mp__pl_sync_in_capture(pl))
      mp__hpl_flush(pl, NULL);
    mp__pl_leave();
  }
  /* Every device's pool, summed (the peak: the sum of theirs). */
  mp_stats_t s = {0}, one;
  bool any = false;
  pthread_mutex_lock(&mp__hpl.lock);
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++) {
    mp_host_pool_t *hp = mp__hpl.at[i].hp;
    if (hp == NULL || mp_host_pool_get_stats(hp, &one) != MP_OK)
      continue;
    any = true;
    mp__stats_add(&s, &one);
  }
  pthread_mutex_unlock(&mp__hpl.lock);
  if (!any)
    return;
  fprintf(f,
          ",\n  \"host_pool\": {\"alloc_count\": %llu, \"free_count\": %llu, "
          "\"device_alloc_count\": %llu, \"device_free_count\": %llu, "
          "\"reserved_bytes\": %zu, \"peak_reserved_bytes\": %zu, "
          "\"allocated_bytes\": %zu, \"requested_bytes\": %zu}",
          (unsigned long long)s.alloc_count, (unsigned long long)s.free_count,
          (unsigned long long)s.device_alloc_count,
          (unsigned long long)s.device_free_count, s.reserved_bytes,
          s.peak_reserved_bytes, s.allocated_bytes, s.requested_bytes);
}

/* ---- the real entry points --------------------------------------------- */

typedef enum {
  MP__H_RT_MALLOC_HOST,
  MP__H_RT_HOST_ALLOC,
  MP__H_CU_HOST_ALLOC,
  MP__H_CU_ALLOC_HOST
} mp__hvariant_t;

/* Status codes: the runtime's and the driver's agree on 0, 1 (invalid
 * value) and 2 (out of memory), the only ones the pool path returns. */
/* The runtime's table is resolved once, on its first use, and kept: it is
 * looked at only for a runtime call, which the runtime itself made, so it
 * is never resolved before a runtime is loaded (a driver call first, and a
 * runtime loaded after it, would have left it empty for good). */
static unsigned int mp__h_real_alloc(mp__hvariant_t v, void **p, size_t bytes,
                                     unsigned int flags) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  switch (v) {
  case MP__H_RT_MALLOC_HOST: {
    const mp__real_cudart_t *rt = mp__pl_real_cudart();
    return rt->cudaMallocHost ? rt->cudaMallocHost(p, bytes)
                              : MP__CUDA_INIT_ERROR;
  }
  case MP__H_RT_HOST_ALLOC: {
    const mp__real_cudart_t *rt = mp__pl_real_cudart();
    return rt->cudaHostAlloc ? rt->cudaHostAlloc(p, bytes, flags)
                             : MP__CUDA_INIT_ERROR;
  }
  case MP__H_CU_HOST_ALLOC:
    return rc->cuMemHostAlloc ? rc->cuMemHostAlloc(p, bytes, flags)
                              : MP__CU_NOT_INITIALIZED;
  case MP__H_CU_ALLOC_HOST:
    return rc->cuMemAllocHost_v2 ? rc->cuMemAllocHost_v2(p, bytes)
                                 : MP__CU_NOT_INITIALIZED;
  }
  return MP__CU_NOT_INITIALIZED;
}

static unsigned int mp__h_real_free(bool runtime, void *p) {
  if (runtime) {
    const mp__real_cudart_t *rt = mp__pl_real_cudart();
    return rt->cudaFreeHost ? rt->cudaFreeHost(p) : MP__CUDA_INIT_ERROR;
  }
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return rc->cuMemFreeHost ? rc->cuMemFreeHost(p) : MP__CU_NOT_INITIALIZED;
}

static unsigned int mp__h_error(bool runtime, mp_status_t st) {
  return runtime ? mp__pl_cuda_error(st) : mp__pl_cu_error(st);
}

bool mp__pl_own_call_begin(unsigned *mode, bool *relaxed) {
  *relaxed = mp__pl_mode_relax(mode);
  return *relaxed || !mp__pl_capture_begun();
}

/* Only the errors it can raise: no call at all for another one (a host
 * function's cudaErrorNotPermitted, mp__pl_free_invalid, which no call of
 * the runtime there would be let through to raise; a driver's code passed
 * on from a refused wait, mp__pl_cuda_error, which a sticky error raises
 * in the runtime by itself and another the runtime's last error does not
 * show). Both calls in relaxed capture mode (mp__pl_own_call_begin), as
 * runtime.c's own calls: in the caller's mode they could be refused, and
 * invalidate a capture, where the caller's call was none of that. Where
 * the switch is refused while a capture is begun, no call is made, and the
 * runtime's last error is left as it was: before, the cudaMalloc of
 * SIZE_MAX was made in the caller's mode and invalidated a global-mode
 * capture (the caller's own, or another thread's). */
void mp__pl_rt_set_last_error(const mp__pl_t *pl, mp__cudaerr r) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  if (pl->host || rt->cudaMalloc == NULL ||
      (r != MP__CUDA_INVALID_VALUE && r != MP__CUDA_MEMORY_ALLOCATION))
    return;
  void *x = NULL;
  unsigned mode;
  bool relaxed;
  if (!mp__pl_own_call_begin(&mode, &relaxed))
    return;
  if (r == MP__CUDA_INVALID_VALUE)
    (void)rt->cudaMalloc(NULL, 1);
  else if (r == MP__CUDA_MEMORY_ALLOCATION && rt->cudaMalloc(&x, SIZE_MAX) == 0)
    (void)rt->cudaFree(x); /* cannot happen; never leak if it does */
  if (relaxed)
    mp__pl_mode_restore(mode);
}

/* ---- the hooks ----------------------------------------------------------- */

/* The synchronize before a page-locked block goes back to the pool: the
 * pool's chunks are PORTABLE ("considered as pinned memory by all CUDA
 * contexts", cuda.h, cuMemHostAlloc), so work of any device may still read
 * or write the block. Every device the shim has a pool or a host pool on,
 * each once (work of a device it never served is not waited for; nor of a
 * device reset since, whose primary context is gone until it is used
 * again: synchronizing it would fail); the first failure is the answer.
 * The host device: its one. */
typedef struct mp__hsync {
  bool done[MP__PL_MAX_DEVICES]; /* by CUDA ordinal */
  mp_status_t st;
} mp__hsync_t;

static void mp__hsync_pool(mp_pool_t *pool, int ordinal, void *ctx) {
  mp__hsync_t *h = ctx;
  h->done[ordinal] = true;
  if (h->st == MP_OK)
    h->st = mp_device_synchronize(mp_pool_device(pool));
}

static mp_status_t mp__hsync_devices(const mp__pl_t *pl) {
  if (pl->host)
    return mp_device_synchronize(pl->dev);
  mp__hsync_t h = {.st = MP_OK};
  mp__pl_each_pool(pl, mp__hsync_pool, &h);
  /* The host pools' devices with no device pool, each held (a reset waits
   * for its users before it closes the device) rather than synchronized
   * under mp__hpl.lock, which every page-locked call and every lookup of a
   * pointer the shim does not know would then wait behind. */
  mp_host_pool_t *held[MP__PL_MAX_DEVICES] = {0};
  mp_device_t *devs[MP__PL_MAX_DEVICES] = {0};
  pthread_mutex_lock(&mp__hpl.lock);
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++)
    if (mp__hpl.at[i].dev != NULL && !h.done[i]) {
      devs[i] = mp__hpl.at[i].dev;
      held[i] = mp__hpl_hold_locked(i);
    }
  pthread_mutex_unlock(&mp__hpl.lock);
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++) {
    if (devs[i] != NULL && h.st == MP_OK)
      h.st = mp_device_synchronize(devs[i]);
    mp__hpl_put(i, held[i]);
  }
  return h.st;
}

/* A block of hp freed during a capture: kept for mp__hpl_flush. */
static mp_status_t mp__hpl_defer(mp_host_pool_t *hp, void *ptr) {
  mp_status_t st = MP_OK;
  pthread_mutex_lock(&mp__hpl.lock);
  if (!mp__hpl_live(hp)) {
    st = MP_EINVAL; /* retired by a reset meanwhile: gone with it */
  } else if (mp__hpl.nlate == mp__hpl.late_cap) {
    size_t cap = mp__hpl.late_cap ? 2 * mp__hpl.late_cap : 16;
    struct mp__hpl_late *l = realloc(mp__hpl.late, cap * sizeof *l);
    if (l == NULL) {
      st = MP_ENOMEM;
    } else {
      mp__hpl.late = l;
      mp__hpl.late_cap = cap;
    }
  }
  if (st == MP_OK)
    mp__hpl.late[mp__hpl.nlate++] =
        (struct mp__hpl_late){.ptr = ptr, .hp = hp, .seq = mp__hpl.late_seq++};
  pthread_mutex_unlock(&mp__hpl.lock);
  return st;
}

/* The mark of the blocks freed late so far, taken before a
 * synchronization of the devices: mp__hpl_flush(pl, &mark) after it. */
static uint64_t mp__hpl_mark(void) {
  pthread_mutex_lock(&mp__hpl.lock);
  uint64_t seq = mp__hpl.late_seq;
  pthread_mutex_unlock(&mp__hpl.lock);
  return seq;
}

/* Outside a capture: the blocks freed during one go back to the pool once
 * a synchronization of the devices begun after their free has returned
 * (synced: the caller's own, its mark taken before it; NULL: one made
 * here). One freed after the synchronization began waits for the next
 * call, as all do when it fails. */
static void mp__hpl_flush(const mp__pl_t *pl, const uint64_t *synced) {
  pthread_mutex_lock(&mp__hpl.lock);
  size_t n = mp__hpl.nlate;
  uint64_t upto = synced != NULL ? *synced : mp__hpl.late_seq;
  pthread_mutex_unlock(&mp__hpl.lock);
  if (n == 0 || (synced == NULL && mp__hsync_devices(pl) != MP_OK))
    return;
  pthread_mutex_lock(&mp__hpl.lock);
  size_t k = 0;
  for (size_t i = 0; i < mp__hpl.nlate; i++) {
    if (mp__hpl.late[i].seq < upto && mp__hpl_live(mp__hpl.late[i].hp))
      (void)mp__host_pool_free_done(mp__hpl.late[i].hp, mp__hpl.late[i].ptr);
    else
      mp__hpl.late[k++] = mp__hpl.late[i];
  }
  mp__hpl.nlate = k;
  pthread_mutex_unlock(&mp__hpl.lock);
}

/* The driver's or the runtime's answer to a page-locked allocation of one
 * byte (freed when given), for mp__pl_free_refused. */
static unsigned mp__h_probe(bool runtime) {
  void *x = NULL;
  unsigned r = mp__h_real_alloc(
      runtime ? MP__H_RT_MALLOC_HOST : MP__H_CU_ALLOC_HOST, &x, 1, 0);
  if (r == 0)
    (void)mp__h_real_free(runtime, x);
  return r;
}
static unsigned mp__h_probe_cu(void) {
  return mp__h_probe(false);
}
static unsigned mp__h_probe_rt(void) {
  return mp__h_probe(true);
}

static unsigned int mp__h_alloc(mp__hvariant_t v, void **p, size_t bytes,
                                unsigned int flags) {
  bool runtime = v == MP__H_RT_MALLOC_HOST || v == MP__H_RT_HOST_ALLOC;
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp_host_pool_t *hp = NULL;
  int at = 0; /* hp's device */
  /* The runtime's convention, as for its cudaMalloc (runtime.c): 0 bytes
   * is success with a NULL pointer, nothing allocated or recorded (the
   * driver's cuMemHostAlloc refuses it, as cuMemAlloc does). */
  bool empty =
      runtime && bytes == 0 && p != NULL && (flags & ~MP__HOST_FLAGS) == 0;
  /* The emulated device has no write-combined memory: the pool serves all.
   * While a capture may prohibit the call, the driver answers it (as a
   * cuMemAlloc then, driver.c): a page-locked allocation is a
   * potentially unsafe call (cuda.h, cuThreadExchangeStreamCaptureMode). */
  bool capture = pl != NULL && pl->mode == MP__PL_POOL && !empty &&
                 mp__pl_sync_in_capture(pl);
  if (pl != NULL && pl->mode == MP__PL_POOL && !empty && !capture &&
      (pl->host || (flags & MP__HOST_WRITECOMBINED) == 0))
    hp = mp__hpl_get(pl, at = mp__hpl_ordinal(pl, runtime));
  if (capture)
    mp__pl_count_bypass("capture");
  unsigned int r;
  if (pl != NULL && pl->mode == MP__PL_POOL && empty) {
    *p = NULL;
    mp__pl_leave();
    return 0;
  } else if (hp != NULL) {
    mp__hpl_flush(pl, NULL);
    mp_status_t st = p == NULL || bytes == 0 || (flags & ~MP__HOST_FLAGS)
                         ? MP_EINVAL
                         : mp_host_pool_alloc(hp, bytes, NULL, p);
    if (st == MP_OK &&
        !mp__pl_table_put_hostmem((uintptr_t)*p, bytes, flags, at)) {
      /* Without the table's entry the block could never be freed to the
       * pool (its free would be refused as a pointer the pool never handed
       * out): it goes back now, unused, and the answer is out of memory. */
      (void)mp__host_pool_free_done(hp, *p);
      *p = NULL;
      st = MP_ENOMEM;
    }
    mp__hpl_put(at, hp);
    r = mp__h_error(runtime, st);
    if (runtime && r != 0) /* the shim's answer: in the runtime's too */
      mp__pl_rt_set_last_error(pl, r);
  } else if (pl != NULL && pl->host) {
    r = mp__h_error(runtime, MP_ENOMEM); /* no driver behind the host device */
  } else {
    r = mp__h_real_alloc(v, p, bytes, flags);
    /* Known, so that its free is recorded too, and with the context that
     * holds it, current after the call (the runtime makes its primary
     * context in it), so that its reset forgets it (driver.c). */
    if (outer && r == 0 &&
        !mp__pl_table_put_real((uintptr_t)*p, bytes, 0, MP__PL_FROM_REAL_HOST,
                               mp__pl_primary_current())) {
      /* Unrecorded, its free would reach the driver uncounted (a "pinned"
       * with no "pinned_free" in the report): back now, unused, and out of
       * memory (the runtime's last error too), as for the host pool's. */
      (void)mp__h_real_free(runtime, *p);
      *p = NULL;
      r = mp__h_error(runtime, MP_ENOMEM);
      if (runtime && pl != NULL)
        mp__pl_rt_set_last_error(pl, r);
    }
  }
  if (outer && r == 0)
    mp__pl_record_other("pinned", (uintptr_t)*p, bytes);
  mp__pl_leave();
  return r;
}

static unsigned int mp__h_free(bool runtime, void *ptr) {
  bool outer = mp__pl_enter();
  mp__pl_block_t b;
  unsigned int r;
  /* The shim's own answer, not the runtime's (a probe's, the real
   * cudaFreeHost's): its failure is the runtime's last error too, as for
   * cudaFree (runtime.c). */
  bool answered = false;
  if (outer && ptr != NULL && mp__pl_table_claim((uintptr_t)ptr, &b)) {
    if (b.kind == MP__PL_FROM_HOSTMEM) {
      const mp__pl_t *pl = mp__pl_get();
      mp_host_pool_t *hp = mp__hpl_at(b.ordinal);
      mp_status_t st = MP_OK;
      /* The driver's refusal from a host function, or where a capture
       * prohibits the call (mp__pl_free_refused). */
      unsigned refused =
          mp__pl_free_refused(pl, true, NULL, false,
                              runtime ? mp__h_probe_rt : mp__h_probe_cu, NULL);
      if (refused != 0) {
        /* still the program's */
      } else if (mp__pl_sync_in_capture(pl)) {
        /* No synchronization now: the block goes back after the capture
         * (mp__hpl_flush). */
        st = hp ? mp__hpl_defer(hp, ptr) : MP_EINVAL;
      } else {
        uint64_t mark = mp__hpl_mark();
        st = mp__hsync_devices(pl);
        if (st == MP_OK)
          st = hp ? mp__host_pool_free_done(hp, ptr) : MP_EINVAL;
        if (st == MP_OK)
          mp__hpl_flush(pl, &mark);
      }
      bool freed = st == MP_OK && refused == 0;
      if (freed)
        mp__pl_record_other("pinned_free", b.ptr, b.size);
      mp__pl_table_end(&b, freed);
      /* After the claim's end: a reset waiting for hp forgets the
       * block with it (mp__pl_table_forget_hostmem skips a claimed one). */
      mp__hpl_put(b.ordinal, hp);
      r = refused != 0 ? refused : mp__h_error(runtime, st);
      answered = refused == 0;
    } else if (b.kind == MP__PL_FROM_REAL_HOST) {
      r = mp__h_real_free(runtime, ptr);
      if (r == 0)
        mp__pl_record_other("pinned_free", b.ptr, b.size);
      mp__pl_table_end(&b, r == 0);
    } else {
      /* Not pinned (a cudaMalloc block, say): refused, and left whole, its
       * pool included, for its own free. */
      mp__pl_table_end(&b, false);
      r = mp__pl_free_foreign(mp__pl_get(), true,
                              runtime ? mp__h_probe_rt : mp__h_probe_cu);
      answered = true;
    }
  } else if (ptr == NULL && outer && mp__pl_get()->host && runtime) {
    r = 0; /* cudaFreeHost(NULL); cuMemFreeHost(NULL) is the driver's */
  } else if (ptr != NULL && outer && mp__pl_get()->host && runtime) {
    /* The host device serves every page-locked allocation: a pointer it
     * never handed out (a second free, an interior or a malloc'd one) is
     * no memory of the runtime's to free, invalid as for its cudaFree
     * (runtime.c), never the real runtime's (absent, or one that would
     * make a context on a GPU the program does not use). */
    mp__pl_count_bypass("foreign_free");
    r = MP__CUDA_INVALID_VALUE;
  } else if (outer && ptr != NULL && mp__hpl_holds(ptr)) {
    /* In the host pool's memory but not handed out (a second free, an
     * interior pointer): the driver's answer, without freeing the chunk
     * the driver gave the pool; a capture's refusal first). */
    r = mp__pl_free_foreign(mp__pl_get(), true,
                            runtime ? mp__h_probe_rt : mp__h_probe_cu);
    answered = true;
  } else {
    r = mp__h_real_free(runtime, ptr);
  }
  if (runtime && answered && r != 0)
    mp__pl_rt_set_last_error(mp__pl_get(), r);
  mp__pl_leave();
  return r;
}

mp__cudaerr cudaMallocHost(void **ptr, size_t size) {
  return mp__h_alloc(MP__H_RT_MALLOC_HOST, ptr, size, 0);
}

mp__cudaerr cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  return mp__h_alloc(MP__H_RT_HOST_ALLOC, pHost, size, flags);
}

mp__cudaerr cudaFreeHost(void *ptr) {
  return mp__h_free(true, ptr);
}

mp__curesult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  return mp__h_alloc(MP__H_CU_HOST_ALLOC, pp, bytesize, Flags);
}

mp__curesult cuMemAllocHost_v2(void **pp, size_t bytesize) {
  return mp__h_alloc(MP__H_CU_ALLOC_HOST, pp, bytesize, 0);
}

mp__curesult cuMemFreeHost(void *p) {
  return mp__h_free(false, p);
}

/* The flags asked for (see the top of the file); any pointer outside the
 * host pool's chunks is the driver's (and costs no scan of the table). */
mp__curesult cuMemHostGetFlags(unsigned int *pFlags, void *p) {
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp__pl_block_t b;
  bool live = false;
  mp__curesult r;
  bool own = pl != NULL && mp__pl_host_block(pl, (uintptr_t)p, &b, &live);
  if (own && mp__pl_calls_refused()) {
    r = MP__CU_NOT_PERMITTED; /* a host function's, as the driver's */
  } else if (own) {
    if (live && pFlags != NULL)
      *pFlags = b.host_flags;
    /* Not live: freed, or never handed out. */
    r = live && pFlags != NULL ? MP__CU_SUCCESS : MP__CU_INVALID_VALUE;
  } else {
    const mp__real_cuda_t *rc = mp__pl_real_cuda();
    r = rc->cuMemHostGetFlags ? rc->cuMemHostGetFlags(pFlags, p)
                              : MP__CU_NOT_INITIALIZED;
  }
  mp__pl_leave();
  return r;
}

/* A live block's device pointer is the driver's; a freed block has none
 * (see the top of the file), and from a host function the driver refuses
 * the call whatever the pointer (mp__pl_calls_refused): so does the shim
 * where it answers itself. */
mp__curesult cuMemHostGetDevicePointer_v2(mp__cuptr *pdptr, void *p,
                                          unsigned int Flags) {
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp__pl_block_t b;
  bool live = true;
  mp__curesult r;
  if (pl != NULL && mp__pl_host_block(pl, (uintptr_t)p, &b, &live) && !live) {
    r = mp__pl_calls_refused() ? MP__CU_NOT_PERMITTED : MP__CU_INVALID_VALUE;
  } else {
    const mp__real_cuda_t *rc = mp__pl_real_cuda();
    r = rc->cuMemHostGetDevicePointer_v2
            ? rc->cuMemHostGetDevicePointer_v2(pdptr, p, Flags)
            : MP__CU_NOT_INITIALIZED;
  }
  mp__pl_leave();
  return r;
}
