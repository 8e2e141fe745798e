/* stand_runtime.c - a stand-in for the shared CUDA runtime over the driver
 * (the fake libcuda.so.1 of tests/fakecuda), for the runtime hooks' rules
 * on a machine without a GPU: rules_prog loads it (RTLD_GLOBAL) where a GPU
 * run loads the real libcudart.so. Each entry point the shim's runtime
 * table takes (hooklist.h) that the rules need calls its driver twin, as
 * the runtime does: cudaMalloc is cuMemAlloc, cudaFree cuMemFree (NULL: a
 * no-op), cudaMallocAsync and cudaFreeAsync theirs (and their _ptsz
 * forms theirs), cudaMallocHost
 * cuMemAllocHost, cudaHostAlloc cuMemHostAlloc, cudaFreeHost cuMemFreeHost
 * (NULL: a no-op), cudaGetDevice cuCtxGetDevice, cudaStreamIsCapturing
 * cuStreamIsCapturing. The driver's codes are returned as the runtime's:
 * the ones these calls give have the same numbers in both (cuda.h's
 * CUDA_ERROR_INVALID_VALUE 1, _OUT_OF_MEMORY 2, _STREAM_CAPTURE_UNSUPPORTED
 * 900 ... _WRONG_THREAD 908; driver_types.h's cudaErrorInvalidValue 1,
 * cudaErrorMemoryAllocation 2, cudaErrorStreamCaptureUnsupported 900 ...
 * cudaErrorStreamCaptureWrongThread 908). Each call's failure is also the
 * thread's last error, which cudaGetLastError returns and resets and
 * cudaPeekAtLastError returns (cuda_runtime_api.h: "Returns the last error
 * that has been produced by any of the runtime calls in the same instance
 * of the CUDA Runtime library in the host thread and resets it to
 * cudaSuccess"; sticky errors, which a reset does not clear, are not
 * modelled). */
#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

unsigned int cudaMalloc(void **p, size_t bytes);
unsigned int cudaFree(void *p);
unsigned int cudaMallocAsync(void **p, size_t bytes, CUstream s);
unsigned int cudaFreeAsync(void *p, CUstream s);
unsigned int cudaMallocAsync_ptsz(void **p, size_t bytes, CUstream s);
unsigned int cudaFreeAsync_ptsz(void *p, CUstream s);
/* The driver's per-thread forms, which cuda.h names only through its
 * CUDA_API_PER_THREAD_DEFAULT_STREAM macros (the plain forms' signatures). */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
unsigned int cudaMallocHost(void **p, size_t bytes);
unsigned int cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
unsigned int cudaFreeHost(void *p);
unsigned int cudaGetDevice(int *device);
unsigned int cudaStreamIsCapturing(CUstream s, unsigned int *status);
unsigned int cudaGetLastError(void);
unsigned int cudaPeekAtLastError(void);

/* The thread's last error, in a pthread key rather than a thread-local:
 * this library is dlopen'ed, so a thread-local of its own is dynamic TLS,
 * allocated at a thread's first use; written first from the fake driver's
 * thread that runs host functions, LeakSanitizer's stop-the-world at exit
 * crashed reading it (ASan build, glibc 2.36: "Tracer caught signal 11",
 * in most runs of rules_prog's host_fn mode). */
static pthread_key_t last_key;
static pthread_once_t last_once = PTHREAD_ONCE_INIT;

static void last_key_make(void) {
  (void)pthread_key_create(&last_key, NULL);
}

static unsigned int last_get(void) {
  pthread_once(&last_once, last_key_make);
  return (unsigned int)(uintptr_t)pthread_getspecific(last_key);
}

static void last_set(unsigned int r) {
  pthread_once(&last_once, last_key_make);
  (void)pthread_setspecific(last_key, (void *)(uintptr_t)r);
}

/* r, kept as the thread's last error when it is one. */
static unsigned int kept(unsigned int r) {
  if (r != CUDA_SUCCESS)
    last_set(r);
  return r;
}

unsigned int cudaGetLastError(void) {
  unsigned int r = last_get();
  last_set(CUDA_SUCCESS);
  return r;
}

unsigned int cudaPeekAtLastError(void) {
  return last_get();
}

unsigned int cudaMalloc(void **p, size_t bytes) {
  CUdeviceptr d = 0;
  if (p == NULL)
    return kept(CUDA_ERROR_INVALID_VALUE);
  CUresult r = cuMemAlloc(&d, bytes);
  *p = (void *)(uintptr_t)d;
  return kept(r);
}

unsigned int cudaFree(void *p) {
  return p == NULL ? CUDA_SUCCESS : kept(cuMemFree((CUdeviceptr)(uintptr_t)p));
}

/* cudaMallocAsync, or (ptsz) its per-thread form. */
static unsigned int malloc_async(void **p, size_t bytes, CUstream s,
                                 bool ptsz) {
  CUdeviceptr d = 0;
  if (p == NULL)
    return kept(CUDA_ERROR_INVALID_VALUE);
  CUresult r =
      ptsz ? cuMemAllocAsync_ptsz(&d, bytes, s) : cuMemAllocAsync(&d, bytes, s);
  *p = (void *)(uintptr_t)d;
  return kept(r);
}

unsigned int cudaMallocAsync(void **p, size_t bytes, CUstream s) {
  return malloc_async(p, bytes, s, false);
}

unsigned int cudaFreeAsync(void *p, CUstream s) {
  return kept(cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, s));
}

unsigned int cudaMallocAsync_ptsz(void **p, size_t bytes, CUstream s) {
  return malloc_async(p, bytes, s, true);
}

unsigned int cudaFreeAsync_ptsz(void *p, CUstream s) {
  return kept(cuMemFreeAsync_ptsz((CUdeviceptr)(uintptr_t)p, s));
}

unsigned int cudaMallocHost(void **p, size_t bytes) {
  return kept(cuMemAllocHost(p, bytes));
}

unsigned int cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
  return kept(cuMemHostAlloc(p, bytes, flags));
}

unsigned int cudaFreeHost(void *p) {
  return p == NULL ? CUDA_SUCCESS : kept(cuMemFreeHost(p));
}

unsigned int cudaGetDevice(int *device) {
  return kept(cuCtxGetDevice(device));
}

unsigned int cudaStreamIsCapturing(CUstream s, unsigned int *status) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = cuStreamIsCapturing(s, &st);
  *status = (unsigned int)st;
  return kept(r);
}
