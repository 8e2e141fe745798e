/* cuda_async.c - the "cuda-async" allocator: CUDA's own stream-ordered pool
 * (cudaMallocAsync, i.e. cuMemAllocAsync on the device's default memory
 * pool), for comparison with mempool on a GPU.
 *
 * The driver is the one the cuda backend already loaded (libcuda.so.1);
 * entry points are found with dlsym. The device's primary context is made
 * current on the calling thread for the allocator's life (pushed at open,
 * popped at close), as the replay runs on one thread. The default pool's
 * release threshold is raised to "never", as RMM and PyTorch do, so that
 * it caches like mempool; at close everything is synchronized and the pool
 * trimmed to zero, so the next replay on the same GPU starts empty.
 * Reserved bytes are the pool's CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT where
 * the driver has memory-pool attributes, else the device's used memory
 * since open (cuMemGetInfo). The driver's own device calls are not
 * observable: they are reported as unknown. Frees go on the NULL stream. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* mp__fail (errors through mp_last_error) */
#include "mpbench.h"

#if MEMPOOL_HAVE_CUDA
#include <cuda.h>

struct mpb_cuasync {
  mp_device_t *dev;
  CUdevice cudev;
  CUcontext ctx;
  CUmemoryPool pool; /* NULL: the driver has no memory-pool calls */
  size_t base;       /* device memory used at open */
  CUresult (*alloc)(CUdeviceptr *, size_t, CUstream);
  CUresult (*free)(CUdeviceptr, CUstream);
  CUresult (*sync)(CUstream);
  CUresult (*pop)(CUcontext *);
  CUresult (*release)(CUdevice);
  CUresult (*get_attr)(CUmemoryPool, CUmemPool_attribute, void *);
  CUresult (*trim)(CUmemoryPool, size_t);
};

/* The first of names that libcuda.so.1 exports, or NULL. */
static void *mpb_cu_sym(void *lib, const char *a, const char *b) {
  void *p = dlsym(lib, a);
  return p != NULL || b == NULL ? p : dlsym(lib, b);
}

#define MPB_CU_SET(field, sym) memcpy(&(field), &(sym), sizeof(sym))

mp_status_t mpb_cuasync_open(mp_device_t *dev, mpb_cuasync_t **out) {
  int ordinal;
  if (sscanf(mp_device_name(dev), "cuda:%d", &ordinal) != 1)
    return mp__fail(MP_ENOTSUP, "cuda-async: %s is not a CUDA device",
                    mp_device_name(dev));
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL)
    return mp__fail(MP_ENODEV, "cuda-async: libcuda.so.1 is not loaded");
  void *get = dlsym(lib, "cuDeviceGet");
  void *retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  void *push = mpb_cu_sym(lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
  void *pop = mpb_cu_sym(lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
  void *release = mpb_cu_sym(lib, "cuDevicePrimaryCtxRelease_v2",
                             "cuDevicePrimaryCtxRelease");
  void *alloc = dlsym(lib, "cuMemAllocAsync");
  void *fr = dlsym(lib, "cuMemFreeAsync");
  void *sync = dlsym(lib, "cuStreamSynchronize");
  dlclose(lib); /* RTLD_NOLOAD took a reference; the backend keeps its own */
  if (!get || !retain || !push || !pop || !release || !alloc || !fr || !sync)
    return mp__fail(MP_ENOTSUP, "cuda-async: the driver has no "
                                "cuMemAllocAsync (CUDA 11.2 or newer needed)");
  mpb_cuasync_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return mp__fail(MP_ENOMEM, "cuda-async: out of host memory");
  c->dev = dev;
  CUresult (*get_fn)(CUdevice *, int);
  CUresult (*retain_fn)(CUcontext *, CUdevice);
  CUresult (*push_fn)(CUcontext);
  MPB_CU_SET(get_fn, get);
  MPB_CU_SET(retain_fn, retain);
  MPB_CU_SET(push_fn, push);
  MPB_CU_SET(c->pop, pop);
  MPB_CU_SET(c->release, release);
  MPB_CU_SET(c->alloc, alloc);
  MPB_CU_SET(c->free, fr);
  MPB_CU_SET(c->sync, sync);
  CUresult r = get_fn(&c->cudev, ordinal);
  if (r == CUDA_SUCCESS && (r = retain_fn(&c->ctx, c->cudev)) == CUDA_SUCCESS &&
      (r = push_fn(c->ctx)) != CUDA_SUCCESS)
    c->release(c->cudev);
  if (r != CUDA_SUCCESS) {
    free(c);
    return mp__fail(MP_EDRIVER,
                    "cuda-async: cannot make cuda:%d current "
                    "(CUresult %d)",
                    ordinal, (int)r);
  }
  /* Optional: the default pool, to cache like mempool and to read its
   * reserved bytes. */
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  void *defpool = lib ? dlsym(lib, "cuDeviceGetDefaultMemPool") : NULL;
  void *set_attr = lib ? dlsym(lib, "cuMemPoolSetAttribute") : NULL;
  void *get_attr = lib ? dlsym(lib, "cuMemPoolGetAttribute") : NULL;
  void *trim = lib ? dlsym(lib, "cuMemPoolTrimTo") : NULL;
  if (lib != NULL)
    dlclose(lib);
  CUresult (*defpool_fn)(CUmemoryPool *, CUdevice);
  CUresult (*set_fn)(CUmemoryPool, CUmemPool_attribute, void *);
  if (defpool && set_attr && get_attr && trim) {
    MPB_CU_SET(defpool_fn, defpool);
    MPB_CU_SET(set_fn, set_attr);
    MPB_CU_SET(c->get_attr, get_attr);
    MPB_CU_SET(c->trim, trim);
    cuuint64_t never = UINT64_MAX;
    if (defpool_fn(&c->pool, c->cudev) != CUDA_SUCCESS ||
        set_fn(c->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &never) !=
            CUDA_SUCCESS)
      c->pool = NULL;
  }
  size_t free_b, total_b;
  if (mp_device_mem_info(dev, &free_b, &total_b) == MP_OK)
    c->base = total_b - free_b;
  *out = c;
  return MP_OK;
}

mp_status_t mpb_cuasync_alloc(mpb_cuasync_t *c, size_t size, mp_stream_t s,
                              void **out) {
  CUdeviceptr p;
  CUresult r = c->alloc(&p, size, (CUstream)s);
  if (r != CUDA_SUCCESS)
    return mp__fail(r == CUDA_ERROR_OUT_OF_MEMORY ? MP_ENOMEM : MP_EDRIVER,
                    "cuda-async: cuMemAllocAsync of %zu bytes: CUresult %d",
                    size, (int)r);
  *out = (void *)(uintptr_t)p;
  return MP_OK;
}

mp_status_t mpb_cuasync_free(mpb_cuasync_t *c, void *ptr) {
  if (ptr == NULL)
    return MP_OK;
  CUresult r = c->free((CUdeviceptr)(uintptr_t)ptr, NULL);
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__fail(MP_EDRIVER, "cuda-async: cuMemFreeAsync: CUresult %d",
                        (int)r);
}

size_t mpb_cuasync_reserved(mpb_cuasync_t *c) {
  cuuint64_t v = 0;
  if (c->pool != NULL &&
      c->get_attr(c->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) ==
          CUDA_SUCCESS)
    return (size_t)v;
  size_t free_b, total_b;
  if (mp_device_mem_info(c->dev, &free_b, &total_b) != MP_OK ||
      total_b - free_b < c->base)
    return 0;
  return total_b - free_b - c->base;
}

void mpb_cuasync_close(mpb_cuasync_t *c) {
  if (c == NULL)
    return;
  c->sync(NULL);
  if (c->pool != NULL)
    c->trim(c->pool, 0);
  CUcontext popped;
  c->pop(&popped);
  c->release(c->cudev);
  free(c);
}

#else /* no CUDA headers: the allocator is never available */

mp_status_t mpb_cuasync_open(mp_device_t *dev, mpb_cuasync_t **out) {
  (void)dev, (void)out;
  return mp__fail(MP_ENOTSUP, "cuda-async: mpbench was built without the "
                              "CUDA headers");
}

mp_status_t mpb_cuasync_alloc(mpb_cuasync_t *c, size_t size, mp_stream_t s,
                              void **out) {
  (void)c, (void)size, (void)s, (void)out;
  return MP_ENOTSUP;
}

mp_status_t mpb_cuasync_free(mpb_cuasync_t *c, void *ptr) {
  (void)c, (void)ptr;
  return MP_ENOTSUP;
}

size_t mpb_cuasync_reserved(mpb_cuasync_t *c) {
  (void)c;
  return 0;
}

void mpb_cuasync_close(mpb_cuasync_t *c) {
  (void)c;
}
#endif
