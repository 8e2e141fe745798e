/* runtime.c - the runtime-API hooks, for programs linked with the shared
 * CUDA runtime: cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync (and
 * their _ptsz forms) and cudaMemGetInfo are served by the pool;
 * cudaMallocManaged, cudaMallocHost, cudaHostAlloc and cudaFreeHost go to
 * the real runtime and are counted. With MEMPOOL_DEVICE=host everything is
 * served by the emulated device (managed memory as one device allocation,
 * pinned memory as the device's host memory), so no driver is needed.
 *
 * The rules are the driver hooks' (driver.c): the pool serves the pool's
 * device (a capture's stream-ordered allocations from its graph pool),
 * frees go where their pointer came from,
 * unknown pointers go to the real runtime, nested calls are not recorded.
 * The runtime's conventions hold: 0 bytes is success with a NULL pointer,
 * cudaFree(NULL) is the real runtime's (programs call it to create their
 * context) or, on the host device, a no-op. */
#include "hooks.h"

typedef enum { MP__RT_SYNC, MP__RT_ASYNC, MP__RT_ASYNC_PTSZ } mp__rt_variant_t;

static mp__cudaerr mp__rt_real_alloc(mp__rt_variant_t v, void **p, size_t bytes,
                                     mp__custream s) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  switch (v) {
  case MP__RT_SYNC:
    return rt->cudaMalloc ? rt->cudaMalloc(p, bytes) : MP__CUDA_INIT_ERROR;
  case MP__RT_ASYNC:
    return rt->cudaMallocAsync ? rt->cudaMallocAsync(p, bytes, s)
                               : MP__CUDA_INIT_ERROR;
  case MP__RT_ASYNC_PTSZ:
    return rt->cudaMallocAsync_ptsz ? rt->cudaMallocAsync_ptsz(p, bytes, s)
                                    : MP__CUDA_INIT_ERROR;
  }
  return MP__CUDA_INIT_ERROR;
}

static mp__cudaerr mp__rt_real_free(mp__rt_variant_t v, void *p,
                                    mp__custream s) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  switch (v) {
  case MP__RT_SYNC: return rt->cudaFree ? rt->cudaFree(p) : MP__CUDA_INIT_ERROR;
  case MP__RT_ASYNC:
    return rt->cudaFreeAsync ? rt->cudaFreeAsync(p, s) : MP__CUDA_INIT_ERROR;
  case MP__RT_ASYNC_PTSZ:
    return rt->cudaFreeAsync_ptsz ? rt->cudaFreeAsync_ptsz(p, s)
                                  : MP__CUDA_INIT_ERROR;
  }
  return MP__CUDA_INIT_ERROR;
}

/* The pool of the runtime's current device (cudaGetDevice). */
static mp_pool_t *mp__rt_pool_here(const mp__pl_t *pl) {
  return mp__pl_pool_current(pl, mp__pl_real_cudart()->cudaGetDevice);
}

static bool mp__rt_capturing(const mp__pl_t *pl, mp__custream s, bool ptsz) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  if (pl->host || rt->cudaStreamIsCapturing == NULL)
    return false;
  if (ptsz && s == NULL)
    s = MP__CU_STREAM_PER_THREAD; /* cudaStreamPerThread */
  unsigned int status = 0;
  return rt->cudaStreamIsCapturing(s, &status) != MP__CUDA_SUCCESS ||
         status != 0;
}

/* What the runtime's own cudaMalloc leaves behind, kept when the pool
 * serves it instead (cuda mode; the host device has no runtime under it):
 *  - the thread's current context: the runtime makes the device's primary
 *    context current on a thread's first call if none is; cudaFree(NULL),
 *    the documented way to start the runtime, does that once per thread;
 *  - the runtime's last error (cudaGetLastError, cudaPeekAtLastError): a
 *    failure the shim answers is raised again by a call the runtime refuses
 *    the same way and that changes nothing (mp__pl_rt_set_last_error,
 *    host.c, which the page-locked calls share). */
static _Thread_local bool mp__rt_started;

/* A call of the shim's own (as mp__pl_rt_set_last_error's are), made in
 * relaxed capture mode (mp__pl_own_call_begin): a cudaMalloc or cudaFree is
 * potentially unsafe (cuda.h, cuThreadExchangeStreamCaptureMode), and in the
 * caller's mode it could be refused, and invalidate a capture (another thread's
 * in global mode), where the caller's own call was none of that. Where the
 * switch is refused while a capture is begun, it is not made, and the thread
 * is not yet started: a later call starts it (before, the cudaFree was made
 * in the caller's mode). */
static void mp__rt_start_thread(const mp__pl_t *pl) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  if (pl->host || mp__rt_started || rt->cudaFree == NULL)
    return;
  unsigned mode;
  bool relaxed;
  if (!mp__pl_own_call_begin(&mode, &relaxed))
    return;
  mp__rt_started = true;
  (void)rt->cudaFree(NULL);
  if (relaxed)
    mp__pl_mode_restore(mode);
}

/* A 1-byte cudaMalloc, freed at once: the runtime's answer for a cudaFree
 * it never sees (mp__pl_free_refused), its last error set as
 * the refused cudaFree would have. */
static unsigned mp__rt_free_probe(void) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  void *x = NULL;
  if (rt->cudaMalloc == NULL)
    return MP__CUDA_SUCCESS;
  mp__cudaerr r = rt->cudaMalloc(&x, 1);
  if (r == MP__CUDA_SUCCESS && rt->cudaFree != NULL)
    (void)rt->cudaFree(x);
  return r;
}

static mp__cudaerr mp__rt_alloc(mp__rt_variant_t v, void **p, size_t bytes,
                                mp__custream s) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return mp__rt_real_alloc(v, p, bytes, s);
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__cudaerr r = MP__CUDA_SUCCESS;
  bool ptsz = v == MP__RT_ASYNC_PTSZ, served = false;
  uintptr_t ts = mp__pl_record_stream(s, ptsz); /* s as traced */
  mp_pool_t *pool = NULL;
  if (pl->mode == MP__PL_POOL)
    mp__rt_start_thread(pl);
  if (pl->mode == MP__PL_POOL) {
    /* As the driver's (driver.c): cudaMallocAsync takes from "the memory
     * pool associated with the stream's device" (cuda_runtime_api.h). */
    bool cap = v != MP__RT_SYNC && mp__rt_capturing(pl, s, ptsz);
    if (p == NULL) {
      r = MP__CUDA_INVALID_VALUE;
      served = true;
    } else if (bytes == 0) {
      *p = NULL;
      served = true;
    } else if ((pool = v == MP__RT_SYNC || cap
                           ? mp__rt_pool_here(pl)
                           : mp__pl_pool_for_stream(pl, s, mp__rt_pool_here)) ==
               NULL) {
      mp__pl_count_bypass("other_device");
    } else if (v == MP__RT_SYNC
                   ? mp__pl_sync_in_capture(pl)
                   : cap && !mp__pl_capture_route(pl, pool, s, ptsz, NULL)) {
      mp__pl_count_bypass("capture"); /* see driver.c */
    } else {
      void *ptr = NULL;
      mp_status_t st =
          mp_pool_alloc(pool, bytes, mp__pl_stream(pl, s, ptsz), &ptr);
      /* A driver error the pool has no status for: the runtime answers,
       * its own code in its last error (sticky ones included), never
       * cudaErrorUnknown (see driver.c). */
      served = st != MP_EDRIVER || pl->host;
      if (st == MP_OK) /* recorded, or given back: out of memory */
        st = mp__pl_pool_served(pool, &ptr, bytes, ts);
      if (st == MP_OK)
        *p = ptr;
      if (served)
        mp__pl_record_alloc((uintptr_t)ptr, bytes, ts, st == MP_OK);
      if (st == MP_OK && cap) /* routed to the capture's graph pool */
        mp__pl_capture_allocated(pl, s, ptsz, (uintptr_t)ptr, bytes);
      r = mp__pl_cuda_error(st);
    }
    if (served && r != MP__CUDA_SUCCESS)
      mp__pl_rt_set_last_error(pl, r);
  }
  if (!served) {
    r = mp__rt_real_alloc(v, p, bytes, s);
    if (r == MP__CUDA_SUCCESS && p != NULL && *p != NULL &&
        !mp__pl_table_put_real((uintptr_t)*p, bytes, ts, MP__PL_FROM_REAL,
                               mp__pl_reset_owner(v != MP__RT_SYNC))) {
      /* As driver.c's: back to the runtime, unused, and out of memory (in
       * the runtime's last error too, as its own failure would be). */
      (void)mp__rt_real_free(v, *p, s);
      *p = NULL;
      r = MP__CUDA_MEMORY_ALLOCATION;
      mp__pl_rt_set_last_error(pl, r);
    }
    if (r == MP__CUDA_SUCCESS && p != NULL && *p != NULL) {
      mp__pl_record_alloc((uintptr_t)*p, bytes, ts, true);
    } else if (r != MP__CUDA_SUCCESS && p != NULL && bytes != 0) {
      mp__pl_record_alloc(0, bytes, ts, false);
    }
  }
  mp__pl_leave();
  return r;
}

/* mp__pl_free_foreign for cudaFree*: a refusal the probe got is the
 * runtime's own, its last error set by it (*answered false). */
static mp__cudaerr mp__rt_free_foreign(const mp__pl_t *pl, mp__rt_variant_t v,
                                       bool *answered) {
  unsigned r = mp__pl_free_foreign(pl, v == MP__RT_SYNC, mp__rt_free_probe);
  if (r >= MP__CU_CAPTURE_FIRST && r <= MP__CU_CAPTURE_LAST)
    *answered = false;
  return r;
}

static mp__cudaerr mp__rt_free(mp__rt_variant_t v, void *p, mp__custream s) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return mp__rt_real_free(v, p, s);
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__pl_block_t b;
  mp__cudaerr r;
  bool captured = false; /* mp__pl_free_refused's answer for s */
  /* The shim's own answer, not the runtime's: its failure is raised in the
   * runtime's last error too (mp__pl_rt_set_last_error: invalid value, out of
   * memory), as the runtime's cudaFree would have. Not for a refusal the
   * runtime gave (the probe),
   * nor for a host function's (the driver's CUDA_ERROR_NOT_PERMITTED: no
   * call of the runtime would be let through to raise it). */
  bool answered = true;
  if (p == NULL && pl->host) {
    r = MP__CUDA_SUCCESS;
  } else if (!mp__pl_table_claim((uintptr_t)p, &b)) {
    /* On the host device there is no runtime memory to free: a pointer
     * the shim does not know (double free, interior pointer) is invalid;
     * elsewhere too when it lies in a pool's memory, the page-locked host
     * pool's included (the driver's answer, without freeing what the
     * driver gave the pool). */
    if (pl->host && p != NULL)
      mp__pl_count_bypass("foreign_free");
    answered = pl->mode == MP__PL_POOL &&
               (pl->host || mp__pl_memory_holds(pl, (uintptr_t)p));
    mp__curesult why = MP__CU_SUCCESS; /* s's capture could not be told */
    r = !answered ? mp__rt_real_free(v, p, s)
        : v != MP__RT_SYNC &&
                mp__pl_output_free(pl, (uintptr_t)p, false, true, s,
                                   v == MP__RT_ASYNC_PTSZ, &why)
            ? MP__CUDA_SUCCESS /* a graph's output, freed inside a capture */
        : why != MP__CU_SUCCESS
            ? mp__pl_cuda_error(mp__pl_capture_unknown("cudaFreeAsync", why))
            : mp__rt_free_foreign(pl, v, &answered);
  } else if (b.kind == MP__PL_FROM_POOL &&
             (r = mp__pl_free_refused(pl, v == MP__RT_SYNC, s,
                                      v == MP__RT_ASYNC_PTSZ, mp__rt_free_probe,
                                      &captured)) != MP__CUDA_SUCCESS) {
    /* As driver.c's: cudaErrorNotPermitted is CUDA_ERROR_NOT_PERMITTED's
     * number, the capture errors theirs. */
    mp__pl_table_end(&b, false);
    answered = false;
  } else if (b.kind == MP__PL_FROM_POOL) {
    r = mp__pl_cuda_error(mp__pl_pool_free(pl, &b, v == MP__RT_SYNC, s,
                                           v == MP__RT_ASYNC_PTSZ, captured));
  } else if (b.kind == MP__PL_FROM_REAL) {
    /* First: preload.h. */
    mp__pl_record_free(b.ptr, b.size,
                       mp__pl_record_stream(s, v == MP__RT_ASYNC_PTSZ));
    r = mp__rt_real_free(v, p, s);
    mp__pl_free_over(&b, r == MP__CUDA_SUCCESS);
    answered = false;
  } else if (b.kind == MP__PL_FROM_DEVICE) {
    /* Refused (a free from a host function): still the program's. */
    r = mp__pl_cuda_error(mp_device_free(pl->dev, p));
    mp__pl_table_end(&b, r == MP__CUDA_SUCCESS);
    answered = false;
  } else {
    mp__pl_table_end(&b, false); /* needs cudaFreeHost */
    r = mp__rt_free_foreign(pl, v, &answered);
  }
  if (answered && r != MP__CUDA_SUCCESS)
    mp__pl_rt_set_last_error(pl, r);
  mp__pl_leave();
  return r;
}

mp__cudaerr cudaMalloc(void **devPtr, size_t size) {
  return mp__rt_alloc(MP__RT_SYNC, devPtr, size, NULL);
}

mp__cudaerr cudaMallocAsync(void **devPtr, size_t size, mp__custream hStream) {
  return mp__rt_alloc(MP__RT_ASYNC, devPtr, size, hStream);
}

mp__cudaerr cudaMallocAsync_ptsz(void **devPtr, size_t size,
                                 mp__custream hStream) {
  return mp__rt_alloc(MP__RT_ASYNC_PTSZ, devPtr, size, hStream);
}

mp__cudaerr cudaFree(void *devPtr) {
  return mp__rt_free(MP__RT_SYNC, devPtr, NULL);
}

mp__cudaerr cudaFreeAsync(void *devPtr, mp__custream hStream) {
  return mp__rt_free(MP__RT_ASYNC, devPtr, hStream);
}

mp__cudaerr cudaFreeAsync_ptsz(void *devPtr, mp__custream hStream) {
  return mp__rt_free(MP__RT_ASYNC_PTSZ, devPtr, hStream);
}

mp__cudaerr cudaMemGetInfo(size_t *free, size_t *total) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp__cudaerr r;
  mp_pool_t *pool = pl != NULL ? mp__rt_pool_here(pl) : NULL;
  if (pool != NULL && free != NULL && total != NULL) {
    /* The device as the pool sees it: its idle cache counts as free (it
     * goes back when an allocation needs it) and a cap is the total. */
    r = mp__pl_cuda_error(mp_pool_mem_info(pool, free, total));
  } else if (pl != NULL && pl->mode == MP__PL_POOL && pl->host) {
    r = MP__CUDA_INVALID_VALUE; /* a NULL output; no runtime to ask */
  } else {
    r = rt->cudaMemGetInfo ? rt->cudaMemGetInfo(free, total)
                           : MP__CUDA_INIT_ERROR;
  }
  mp__pl_leave();
  return r;
}

/* ---- memory the pool does not serve ------------------------------------ */

/* cudaMemAttachGlobal, cudaMemAttachHost (cuda_runtime_api.h). */
#define MP__RT_ATTACH_GLOBAL 0x01u
#define MP__RT_ATTACH_HOST   0x02u

/* kind: MP__PL_FROM_DEVICE (managed) or MP__PL_FROM_HOSTMEM (pinned). On the
 * host device the emulator provides it, with the runtime's checks: for
 * cudaMallocManaged "flags must be one of cudaMemAttachGlobal or
 * cudaMemAttachHost" and "if size is 0, cudaMallocManaged returns
 * cudaErrorInvalidValue" (CUDA Runtime API reference, cudaMallocManaged);
 * elsewhere the real runtime does. */
static mp__cudaerr mp__rt_other_alloc(mp__pl_kind_t kind, void **p,
                                      size_t bytes, unsigned int flags,
                                      bool host_alloc) {
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp__cudaerr r;
  if (pl != NULL && pl->mode == MP__PL_POOL && pl->host) {
    if (p == NULL || bytes == 0 ||
        (kind == MP__PL_FROM_DEVICE && flags != MP__RT_ATTACH_GLOBAL &&
         flags != MP__RT_ATTACH_HOST)) {
      r = MP__CUDA_INVALID_VALUE;
    } else {
      mp_status_t st = kind == MP__PL_FROM_DEVICE
                           ? mp_device_alloc(pl->dev, bytes, p)
                           : mp_device_host_alloc(pl->dev, bytes, p);
      if (st == MP_OK && !mp__pl_table_put((uintptr_t)*p, bytes, 0, kind)) {
        /* Unrecorded, its free would be refused as a pointer the host
         * device never handed out: it goes back now, unused, and the
         * answer is out of memory (as host.c's page-locked blocks). */
        (void)(kind == MP__PL_FROM_DEVICE ? mp_device_free(pl->dev, *p)
                                          : mp_device_host_free(pl->dev, *p));
        *p = NULL;
        st = MP_ENOMEM;
      }
      r = mp__pl_cuda_error(st);
    }
  } else if (kind == MP__PL_FROM_DEVICE) {
    r = rt->cudaMallocManaged ? rt->cudaMallocManaged(p, bytes, flags)
                              : MP__CUDA_INIT_ERROR;
  } else if (host_alloc) {
    r = rt->cudaHostAlloc ? rt->cudaHostAlloc(p, bytes, flags)
                          : MP__CUDA_INIT_ERROR;
  } else {
    r = rt->cudaMallocHost ? rt->cudaMallocHost(p, bytes) : MP__CUDA_INIT_ERROR;
  }
  if (outer && r == MP__CUDA_SUCCESS)
    mp__pl_record_other(kind == MP__PL_FROM_DEVICE ? "managed" : "pinned",
                        (uintptr_t)*p, bytes);
  mp__pl_leave();
  return r;
}

mp__cudaerr cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  return mp__rt_other_alloc(MP__PL_FROM_DEVICE, devPtr, size, flags, false);
}

/* cudaMallocHost, cudaHostAlloc, cudaFreeHost: host.c. */
