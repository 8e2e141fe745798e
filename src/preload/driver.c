/* driver.c - the driver-API hooks: cuMemAlloc_v2, cuMemFree_v2,
 * cuMemAllocAsync, cuMemFreeAsync (and their _ptsz forms), cuMemGetInfo_v2,
 * cuMemGetAddressRange_v2.
 *
 * An allocation is served, in pool mode, by the pool of the device the
 * calling thread's context is on (one pool per device, made on first use);
 * a stream-ordered one on a stream being captured into a graph by the
 * capture's graph pool (graphs.c). Otherwise (no context, no pool for the
 * device, cuMemAlloc during a capture, whose rules the driver applies) it
 * goes to the real driver and is only recorded.
 * A free goes wherever its pointer came from, found in the shim's table;
 * pointers the shim never saw go to the real driver untouched, but one in
 * a pool's memory (a second free, an interior pointer; a device pool's or
 * the page-locked host pool's) is refused as the driver refuses it, never
 * passed on to free the pool's segment or chunk. A call made
 * from inside another hook (the runtime's cudaMalloc calling cuMemAlloc_v2
 * on its way to the driver) is the real driver's and is not recorded twice.
 * Error codes follow the driver's: 0 bytes and NULL outputs are
 * CUDA_ERROR_INVALID_VALUE, a full pool CUDA_ERROR_OUT_OF_MEMORY. */
#include "hooks.h"

typedef enum { MP__SYNC, MP__ASYNC, MP__ASYNC_PTSZ } mp__variant_t;

static mp__curesult mp__real_alloc(mp__variant_t v, mp__cuptr *dptr,
                                   size_t bytes, mp__custream s) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  switch (v) {
  case MP__SYNC:
    return rc->cuMemAlloc_v2 ? rc->cuMemAlloc_v2(dptr, bytes)
                             : MP__CU_NOT_INITIALIZED;
  case MP__ASYNC:
    return rc->cuMemAllocAsync ? rc->cuMemAllocAsync(dptr, bytes, s)
                               : MP__CU_NOT_INITIALIZED;
  case MP__ASYNC_PTSZ:
    return rc->cuMemAllocAsync_ptsz ? rc->cuMemAllocAsync_ptsz(dptr, bytes, s)
                                    : MP__CU_NOT_INITIALIZED;
  }
  return MP__CU_NOT_INITIALIZED;
}

static mp__curesult mp__real_free(mp__variant_t v, mp__cuptr p,
                                  mp__custream s) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  switch (v) {
  case MP__SYNC:
    return rc->cuMemFree_v2 ? rc->cuMemFree_v2(p) : MP__CU_NOT_INITIALIZED;
  case MP__ASYNC:
    return rc->cuMemFreeAsync ? rc->cuMemFreeAsync(p, s)
                              : MP__CU_NOT_INITIALIZED;
  case MP__ASYNC_PTSZ:
    return rc->cuMemFreeAsync_ptsz ? rc->cuMemFreeAsync_ptsz(p, s)
                                   : MP__CU_NOT_INITIALIZED;
  }
  return MP__CU_NOT_INITIALIZED;
}

/* A 1-byte cuMemAlloc, freed at once: the driver's answer for a cuMemFree
 * it never sees (mp__pl_free_refused). */
static unsigned mp__free_probe(void) {
  mp__cuptr x = 0;
  mp__curesult r = mp__real_alloc(MP__SYNC, &x, 1, NULL);
  if (r == MP__CU_SUCCESS)
    (void)mp__real_free(MP__SYNC, x, NULL);
  return r;
}

static mp__curesult mp__alloc(mp__variant_t v, mp__cuptr *dptr, size_t bytes,
                              mp__custream s) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return mp__real_alloc(v, dptr, bytes, s);
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__curesult r = MP__CU_SUCCESS;
  bool ptsz = v == MP__ASYNC_PTSZ, served = false;
  uintptr_t ts = mp__pl_record_stream(s, ptsz); /* s as traced */
  mp_pool_t *pool = NULL;
  if (pl->mode == MP__PL_POOL) {
    /* A stream-ordered allocation comes from the stream's device's pool
     * (mp__pl_pool_for_stream); a capture's, from the current device's
     * graph pool, without asking the capturing stream anything more. */
    bool cap = v != MP__SYNC && mp__pl_capturing(pl, s, ptsz);
    if (dptr == NULL || bytes == 0) {
      r = MP__CU_INVALID_VALUE;
      served = true;
    } else if ((pool = v == MP__SYNC || cap
                           ? mp__pl_pool_here(pl)
                           : mp__pl_pool_for_stream(pl, s, mp__pl_pool_here)) ==
               NULL) {
      mp__pl_count_bypass("other_device");
    } else if (v == MP__SYNC
                   ? mp__pl_sync_in_capture(pl)
                   : cap && !mp__pl_capture_route(pl, pool, s, ptsz, NULL)) {
      /* cuMemAlloc during a capture: the driver applies the capture mode's
       * rules; stream-ordered allocations go to the graph pool. */
      mp__pl_count_bypass("capture");
    } else {
      void *p = NULL;
      mp_status_t st =
          mp_pool_alloc(pool, bytes, mp__pl_stream(pl, s, ptsz), &p);
      /* MP_EDRIVER: the driver refused one of the pool's own calls with
       * an error the pool has no status for (a sticky one after a
       * kernel's fault, CUDA_ERROR_ILLEGAL_ADDRESS ...): the driver
       * answers the request itself, with its own code, as it would
       * without the shim, never CUDA_ERROR_UNKNOWN (mp__pl_cu_error). */
      served = st != MP_EDRIVER || pl->host;
      if (st == MP_OK) /* recorded, or given back: out of memory */
        st = mp__pl_pool_served(pool, &p, bytes, ts);
      if (st == MP_OK)
        *dptr = (mp__cuptr)(uintptr_t)p;
      if (served)
        mp__pl_record_alloc((uintptr_t)p, bytes, ts, st == MP_OK);
      if (st == MP_OK && cap) /* routed to the capture's graph pool */
        mp__pl_capture_allocated(pl, s, ptsz, (uintptr_t)p, bytes);
      r = mp__pl_cu_error(st);
    }
  }
  if (!served) {
    r = mp__real_alloc(v, dptr, bytes, s);
    if (r == MP__CU_SUCCESS &&
        !mp__pl_table_put_real((uintptr_t)*dptr, bytes, ts, MP__PL_FROM_REAL,
                               mp__pl_reset_owner(v != MP__SYNC))) {
      /* Unrecorded, its free would reach the driver untraced: the trace
       * and the report would keep it live for good. It goes back now,
       * unused (stream-ordered on s, as it was allocated), and the answer
       * is out of memory, traced as a failed allocation. */
      (void)mp__real_free(v, *dptr, s);
      *dptr = 0;
      r = MP__CU_OUT_OF_MEMORY;
    }
    if (r == MP__CU_SUCCESS) {
      mp__pl_record_alloc((uintptr_t)*dptr, bytes, ts, true);
    } else if (dptr != NULL && bytes != 0) {
      mp__pl_record_alloc(0, bytes, ts, false);
    }
  }
  mp__pl_leave();
  return r;
}

static mp__curesult mp__free(mp__variant_t v, mp__cuptr p, mp__custream s) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return mp__real_free(v, p, s);
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__pl_block_t b;
  mp__curesult r;
  bool captured = false; /* mp__pl_free_refused's answer for s */
  if (!mp__pl_table_claim((uintptr_t)p, &b)) {
    /* Not the shim's: the driver's business, unless it lies in a pool's
     * memory (a second free, an interior pointer), a device pool's or the
     * page-locked host pool's, which the driver gave the pool: there the
     * driver's answer, without freeing it. */
    mp__curesult why = MP__CU_SUCCESS; /* s's capture could not be told */
    r = !mp__pl_memory_holds(pl, (uintptr_t)p) ? mp__real_free(v, p, s)
        : v != MP__SYNC && mp__pl_output_free(pl, (uintptr_t)p, false, true, s,
                                              v == MP__ASYNC_PTSZ, &why)
            ? MP__CU_SUCCESS /* a graph's output, freed inside a capture */
        : why != MP__CU_SUCCESS
            ? mp__pl_cu_error(mp__pl_capture_unknown("cuMemFreeAsync", why))
            : mp__pl_free_foreign(pl, v == MP__SYNC, mp__free_probe);
  } else if (b.kind == MP__PL_FROM_POOL &&
             (r = mp__pl_free_refused(pl, v == MP__SYNC, s, v == MP__ASYNC_PTSZ,
                                      mp__free_probe, &captured)) !=
                 MP__CU_SUCCESS) {
    /* Refused (a host function's, or prohibited by a capture): nothing
     * freed or traced, still the program's. */
    mp__pl_table_end(&b, false);
  } else if (b.kind == MP__PL_FROM_POOL) {
    r = mp__pl_cu_error(mp__pl_pool_free(pl, &b, v == MP__SYNC, s,
                                         v == MP__ASYNC_PTSZ, captured));
  } else if (b.kind == MP__PL_FROM_REAL) {
    /* First: preload.h. */
    mp__pl_record_free(b.ptr, b.size,
                       mp__pl_record_stream(s, v == MP__ASYNC_PTSZ));
    r = mp__real_free(v, p, s);
    mp__pl_free_over(&b, r == MP__CU_SUCCESS);
  } else if (b.kind == MP__PL_FROM_DEVICE) {
    /* Refused (a free from a host function): still the program's. */
    r = mp__pl_cu_error(mp_device_free(pl->dev, (void *)(uintptr_t)p));
    mp__pl_table_end(&b, r == MP__CU_SUCCESS);
  } else {
    /* Pinned host memory is not freed with cuMemFree. */
    mp__pl_table_end(&b, false);
    r = mp__pl_free_foreign(pl, v == MP__SYNC, mp__free_probe);
  }
  mp__pl_leave();
  return r;
}

mp__curesult cuMemAlloc_v2(mp__cuptr *dptr, size_t bytesize) {
  return mp__alloc(MP__SYNC, dptr, bytesize, NULL);
}

mp__curesult cuMemAllocAsync(mp__cuptr *dptr, size_t bytesize,
                             mp__custream hStream) {
  return mp__alloc(MP__ASYNC, dptr, bytesize, hStream);
}

mp__curesult cuMemAllocAsync_ptsz(mp__cuptr *dptr, size_t bytesize,
                                  mp__custream hStream) {
  return mp__alloc(MP__ASYNC_PTSZ, dptr, bytesize, hStream);
}

mp__curesult cuMemFree_v2(mp__cuptr dptr) {
  return mp__free(MP__SYNC, dptr, NULL);
}

mp__curesult cuMemFreeAsync(mp__cuptr dptr, mp__custream hStream) {
  return mp__free(MP__ASYNC, dptr, hStream);
}

mp__curesult cuMemFreeAsync_ptsz(mp__cuptr dptr, mp__custream hStream) {
  return mp__free(MP__ASYNC_PTSZ, dptr, hStream);
}

/* The pool's idle cache is free memory to anyone asking: it is released
 * to the device when an allocation needs it. */
mp__curesult cuMemGetInfo_v2(size_t *free, size_t *total) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_get() : NULL;
  mp__curesult r;
  mp_pool_t *pool = pl != NULL ? mp__pl_pool_here(pl) : NULL;
  if (pool != NULL && free != NULL && total != NULL) {
    /* The device as the pool sees it: its idle cache counts as free (it
     * goes back when an allocation needs it) and a cap is the total. */
    r = mp__pl_cu_error(mp_pool_mem_info(pool, free, total));
  } else {
    r = rc->cuMemGetInfo_v2 ? rc->cuMemGetInfo_v2(free, total)
                            : MP__CU_NOT_INITIALIZED;
  }
  mp__pl_leave();
  return r;
}

/* Whether addr lies in a pool's memory but in no block the program holds
 * (a freed block, cached; the pool's free space): no allocation of the
 * program's, so the range and pointer queries answer as the driver does
 * for freed memory, not with the segment or chunk holding it. */
static bool mp__pl_freed_in_pool(mp__cuptr addr) {
  const mp__pl_t *pl = mp__pl_started();
  mp__pl_block_t b;
  bool live = true;
  return pl != NULL &&
         ((mp__pl_pools_hold(pl, (uintptr_t)addr) &&
           !mp__pl_table_find_pool((uintptr_t)addr, &b)) ||
          (mp__pl_host_block(pl, (uintptr_t)addr, &b, &live) && !live));
}

/* The page-locked block of the host pool holding addr, live: its range is
 * the block, as a pool block's is (cuPointerGetAttribute below), not the
 * chunk the driver knows. */
static bool mp__pl_host_live(mp__cuptr addr, mp__pl_block_t *b) {
  const mp__pl_t *pl = mp__pl_started();
  bool live = false;
  return pl != NULL && mp__pl_host_block(pl, (uintptr_t)addr, b, &live) && live;
}

/* A sub-allocated pointer's range is its block, not the pool's segment:
 * what the program asked for is what it gets back; cuPointerGetAttribute's
 * range start and size say the same. A program that shares memory with
 * another process sends a CUipcMemHandle of that range's start and the
 * offset from it: cuIpcGetMemHandle below refuses the blocks for which that
 * would be wrong. So is a page-locked block of the host pool's: cuda.h
 * gives "the allocation ... that contains the input pointer dptr", and
 * with unified addressing a page-locked allocation's host address is its
 * device pointer ("Automatic Mapping of Host Allocated Host Memory": the
 * pointer value kernels use "is the same as the pointer value through
 * which that memory is accessed on the host"), so the driver answers the
 * pool's whole chunk for it; the block is the allocation the program
 * made, and a freed one is in none (CUDA_ERROR_NOT_FOUND, as for a freed
 * device block). */
mp__curesult cuMemGetAddressRange_v2(mp__cuptr *pbase, size_t *psize,
                                     mp__cuptr dptr) {
  mp__pl_block_t b;
  bool own =
      mp__pl_table_find_pool((uintptr_t)dptr, &b) || mp__pl_host_live(dptr, &b);
  /* Answered here, not by the driver, which refuses it in a host
   * function (mp__pl_calls_refused): so is it here. */
  if ((own || mp__pl_freed_in_pool(dptr)) && mp__pl_calls_refused())
    return MP__CU_NOT_PERMITTED;
  if (own) {
    if (pbase != NULL)
      *pbase = (mp__cuptr)b.ptr;
    if (psize != NULL)
      *psize = b.size;
    return MP__CU_SUCCESS;
  }
  if (mp__pl_freed_in_pool(dptr))
    return MP__CU_NOT_FOUND;
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return rc->cuMemGetAddressRange_v2
             ? rc->cuMemGetAddressRange_v2(pbase, psize, dptr)
             : MP__CU_NOT_INITIALIZED;
}

/* Whether pool block b starts the device allocation that holds it (the
 * real driver's range of its address): a plain segment's first block. */
static bool mp__pl_starts_allocation(const mp__pl_block_t *b) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cuptr base = 0;
  size_t size = 0;
  return rc->cuMemGetAddressRange_v2 != NULL &&
         rc->cuMemGetAddressRange_v2(&base, &size, (mp__cuptr)b->ptr) ==
             MP__CU_SUCCESS &&
         base == (mp__cuptr)b->ptr;
}

/* Whether dptr lies in a pool block that cuIpcGetMemHandle refuses (b:
 * that block): one that does not start its device allocation (see
 * cuIpcGetMemHandle below). */
static bool mp__pl_ipc_refused(mp__cuptr dptr, mp__pl_block_t *b) {
  return mp__pl_table_find_pool((uintptr_t)dptr, b) &&
         !mp__pl_starts_allocation(b);
}

/* The range of a pool block is the block (above). IS_LEGACY_CUDA_IPC_CAPABLE
 * says whether cuIpcGetMemHandle would give the pointer's allocation a
 * handle, and libraries (NCCL) ask it before choosing that path: for a
 * block the hook below refuses it is 0, as the refusal; for any other
 * pointer the driver answers. Its type: cuda.h says "Returns in \p *data a
 * boolean" without naming a C type; the one boolean pointer attribute whose
 * C type it names, SYNC_MEMOPS, is "a pointer to an unsigned integer"
 * (cuPointerSetAttribute), and programs pass an int (NCCL) or unsigned int:
 * an unsigned int is written, 4 bytes, never more. */
mp__curesult cuPointerGetAttribute(void *data, unsigned int attribute,
                                   mp__cuptr ptr) {
  mp__pl_block_t b;
  bool range =
      data != NULL &&
      (attribute == MP__CU_POINTER_RANGE_START ||
       attribute == MP__CU_POINTER_RANGE_SIZE) &&
      (mp__pl_table_find_pool((uintptr_t)ptr, &b) || mp__pl_host_live(ptr, &b));
  bool no_ipc = !range && data != NULL &&
                attribute == MP__CU_POINTER_LEGACY_IPC &&
                mp__pl_ipc_refused(ptr, &b);
  /* cuda.h: "If ptr was not allocated by, mapped by, or registered with a
   * CUcontext which uses unified virtual addressing then
   * CUDA_ERROR_INVALID_VALUE is returned": a freed block is not. */
  bool freed = !range && !no_ipc && mp__pl_freed_in_pool(ptr);
  /* What the shim answers itself, the driver refuses in a host function
   * (mp__pl_calls_refused): so is it here. */
  if ((range || no_ipc || freed) && mp__pl_calls_refused())
    return MP__CU_NOT_PERMITTED;
  if (range) {
    if (attribute == MP__CU_POINTER_RANGE_START)
      *(mp__cuptr *)data = (mp__cuptr)b.ptr;
    else
      *(size_t *)data = b.size;
    return MP__CU_SUCCESS;
  }
  if (no_ipc) {
    *(unsigned int *)data = 0;
    return MP__CU_SUCCESS;
  }
  if (freed)
    return MP__CU_INVALID_VALUE;
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return rc->cuPointerGetAttribute
             ? rc->cuPointerGetAttribute(data, attribute, ptr)
             : MP__CU_NOT_INITIALIZED;
}

/* The plural answers as cuPointerGetAttribute does, attribute by
 * attribute: the driver answers the whole list first (cuda.h: for a
 * pointer it does not know it gives "default NULL values" and
 * CUDA_SUCCESS, which a freed block gets too), then a pool block's range
 * and IPC capability are written over its answers, each as the singular
 * writes it. */
mp__curesult cuPointerGetAttributes(unsigned int numAttributes,
                                    unsigned int *attributes, void **data,
                                    mp__cuptr ptr) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuPointerGetAttributes == NULL)
    return MP__CU_NOT_INITIALIZED;
  /* A freed block (the singular's CUDA_ERROR_INVALID_VALUE): the driver's
   * answers for a pointer it does not know, asked of one it never knows
   * (0), so each attribute gets the driver's own default. */
  if (mp__pl_freed_in_pool(ptr))
    ptr = 0;
  mp__curesult r =
      rc->cuPointerGetAttributes(numAttributes, attributes, data, ptr);
  mp__pl_block_t b;
  bool host = false;
  if (r != MP__CU_SUCCESS || attributes == NULL || data == NULL ||
      (!mp__pl_table_find_pool((uintptr_t)ptr, &b) &&
       !(host = mp__pl_host_live(ptr, &b))))
    return r;
  /* A page-locked block: the driver's own IPC answer stands. */
  bool refused = !host && !mp__pl_starts_allocation(&b);
  for (unsigned int i = 0; i < numAttributes; i++) {
    if (data[i] == NULL)
      continue;
    if (attributes[i] == MP__CU_POINTER_RANGE_START)
      *(mp__cuptr *)data[i] = (mp__cuptr)b.ptr;
    else if (attributes[i] == MP__CU_POINTER_RANGE_SIZE)
      *(size_t *)data[i] = b.size;
    else if (attributes[i] == MP__CU_POINTER_LEGACY_IPC && refused)
      *(unsigned int *)data[i] = 0;
  }
  return r;
}

/* A CUipcMemHandle names a whole device allocation, "created with
 * ::cuMemAlloc" (cuda.h), and the importer's cuIpcOpenMemHandle maps it at
 * its start; the program adds the offset it computed from the range start,
 * which the shim answers with the block. So a pool block gets a handle only
 * where the two starts agree: a block that begins its plain segment (the
 * driver then answers as for any cuMemAlloc). Any other block would come
 * out at the wrong address in the importer, silently: it is refused with
 * CUDA_ERROR_NOT_SUPPORTED, said on stderr. A freed block (in a pool, in no
 * live block) is CUDA_ERROR_INVALID_VALUE. Memory the shim did not hand
 * out goes to the driver. The importer's side (cuIpcOpenMemHandle,
 * cuIpcCloseMemHandle) maps another process's memory, never the pool's,
 * and is not hooked. */
mp__curesult cuIpcGetMemHandle(mp__cuipcmemhandle *pHandle, mp__cuptr dptr) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__pl_block_t b;
  bool pool = mp__pl_table_find_pool((uintptr_t)dptr, &b);
  bool freed = !pool && mp__pl_freed_in_pool(dptr);
  /* Answered below without the driver, which refuses it in a host
   * function (mp__pl_calls_refused): so is it here. */
  if (((pool && !mp__pl_starts_allocation(&b)) || freed) &&
      mp__pl_calls_refused())
    return MP__CU_NOT_PERMITTED;
  if (pool && !mp__pl_starts_allocation(&b)) {
    MP__PL_SAY("cuIpcGetMemHandle(%p) refused: the pool block at %p (%zu "
               "bytes) does not start the device allocation holding it, so "
               "the importer would open that allocation at another address "
               "than the block's; MEMPOOL_CONF=virtual=0 gives requests "
               "above segment_bytes/2 device allocations of their own, "
               "which can be shared (see README, LD_PRELOAD)",
               (void *)(uintptr_t)dptr, (void *)b.ptr, b.size);
    return MP__CU_NOT_SUPPORTED;
  }
  /* A freed block is no "existing device memory allocation" (cuda.h): the
   * driver's refusal for such a pointer, not a handle of the segment that
   * the pool hands out again. */
  if (freed)
    return MP__CU_INVALID_VALUE;
  if (rc->cuIpcGetMemHandle == NULL)
    return MP__CU_NOT_INITIALIZED;
  mp__curesult r = rc->cuIpcGetMemHandle(pHandle, dptr);
  if (pool && r != MP__CU_SUCCESS)
    MP__PL_SAY("cuIpcGetMemHandle(%p): the driver refused the pool block "
               "(error %u); CUDA makes these handles of cuMemAlloc memory "
               "only, and the pool's virtual range is not: "
               "MEMPOOL_CONF=virtual=0 (see README, LD_PRELOAD)",
               (void *)(uintptr_t)dptr, r);
  return r;
}

/* cuda.h, cuDevicePrimaryCtxReset: "Destroy all allocations and reset all
 * state on the primary context" (cudaDeviceReset comes here too, through
 * cuGetProcAddress). The device's pool lives in that context, so its
 * memory goes with it: cached segments and the program's live blocks. The
 * pool is retired before the driver destroys the memory (no allocation is
 * served from it afterwards) and its blocks forgotten: a later free of one
 * is the driver's answer for memory it no longer knows, and the next
 * allocation on the device makes a new pool. The retired pool, its graph
 * pools and its device are released before the driver resets, while the
 * memory they free is still theirs (after it, the driver may hand those
 * addresses out again); one that cannot be is kept until exit. So is the
 * page-locked host pool when its chunks are that context's (host.c). */
static mp__curesult mp__primary_reset(int dev, mp__curesult (*real)(int)) {
  /* One made from a host function the driver refuses (cuda.h,
   * cuLaunchHostFunc, "The host function must not make any CUDA API
   * calls"; CUDA_ERROR_NOT_PERMITTED, mp__pl_calls_refused) and destroys
   * nothing: the device's pool, its host pool and the program's blocks in
   * both stay as they are, and the driver gives its answer. */
  if (mp__pl_calls_refused())
    return real != NULL ? real(dev) : MP__CU_NOT_PERMITTED;
  bool outer = mp__pl_enter();
  const mp__pl_t *pl = outer ? mp__pl_started() : NULL;
  mp_pool_t *gone = pl != NULL ? mp__pl_devices_retire(pl, dev) : NULL;
  if (gone != NULL) {
    (void)mp__pl_table_forget_pool(gone);
    mp__pl_graphs_forget(pl, gone);
    (void)mp__pl_devices_release(pl, gone);
  }
  if (pl != NULL)
    mp__pl_host_reset(pl, dev);
  mp__curesult r = real != NULL ? real(dev) : MP__CU_NOT_INITIALIZED;
  /* Until here a page-locked call on dev went to the driver, not to a new
   * host pool in the context being reset (host.c), and so did a device
   * allocation, not to a new device pool (devices.c). */
  if (pl != NULL) {
    mp__pl_host_reset_done(pl, dev);
    mp__pl_devices_reset_done(pl, dev);
  }
  /* What the driver handed out in that context while the shim passed
   * through (and its write-combined page-locked memory) is gone with it:
   * forgotten, traced as freed, once the driver has destroyed it (a reset
   * it refuses destroys nothing). */
  if (pl != NULL && r == MP__CU_SUCCESS)
    (void)mp__pl_table_forget_real(dev);
  mp__pl_leave();
  return r;
}

mp__curesult cuDevicePrimaryCtxReset_v2(int dev) {
  return mp__primary_reset(dev, mp__pl_real_cuda()->cuDevicePrimaryCtxReset_v2);
}

/* The original, before CUDA 11.0's _v2 (cudaTypedefs.h:
 * PFN_cuDevicePrimaryCtxReset_v7000; cuda.h maps the name to _v2 by a
 * macro, so only a binary built before 11.0 calls it): the same reset. */
mp__curesult cuDevicePrimaryCtxReset(int dev) {
  return mp__primary_reset(dev, mp__pl_real_cuda()->cuDevicePrimaryCtxReset);
}
