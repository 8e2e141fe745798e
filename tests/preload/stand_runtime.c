/* stand_runtime.c - a stand-in for the shared CUDA runtime over the driver
 * (the fake libcuda.so.1 of tests/fakecuda), for the runtime hooks' rules
 * on a machine without a GPU: rules_prog loads it (RTLD_GLOBAL) where a GPU
 * run loads the real libcudart.so. Each entry point the shim's runtime
 * table takes (hooklist.h) that the rules need calls its driver twin, as
 * the runtime does: cudaMalloc is cuMemAlloc, cudaFree cuMemFree (NULL: a
 * no-op), cudaMallocAsync and cudaFreeAsync theirs, cudaGetDevice
 * cuCtxGetDevice, cudaStreamIsCapturing
 * cuStreamIsCapturing. The driver's codes are returned as the runtime's:
 * the ones these calls give have the same numbers in both (cuda.h's
 * CUDA_ERROR_INVALID_VALUE 1, _OUT_OF_MEMORY 2, _STREAM_CAPTURE_UNSUPPORTED
 * 900 ... _WRONG_THREAD 908; driver_types.h's cudaErrorInvalidValue 1,
 * cudaErrorMemoryAllocation 2, cudaErrorStreamCaptureUnsupported 900 ...
 * cudaErrorStreamCaptureWrongThread 908). */
#include <cuda.h>
#include <stdint.h>

unsigned int cudaMalloc(void **p, size_t bytes);
unsigned int cudaFree(void *p);
unsigned int cudaMallocAsync(void **p, size_t bytes, CUstream s);
unsigned int cudaFreeAsync(void *p, CUstream s);
unsigned int cudaGetDevice(int *device);
unsigned int cudaStreamIsCapturing(CUstream s, unsigned int *status);

unsigned int cudaMalloc(void **p, size_t bytes) {
  CUdeviceptr d = 0;
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = cuMemAlloc(&d, bytes);
  *p = (void *)(uintptr_t)d;
  return r;
}

unsigned int cudaFree(void *p) {
  return p == NULL ? CUDA_SUCCESS : cuMemFree((CUdeviceptr)(uintptr_t)p);
}

unsigned int cudaMallocAsync(void **p, size_t bytes, CUstream s) {
  CUdeviceptr d = 0;
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = cuMemAllocAsync(&d, bytes, s);
  *p = (void *)(uintptr_t)d;
  return r;
}

unsigned int cudaFreeAsync(void *p, CUstream s) {
  return cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, s);
}

unsigned int cudaGetDevice(int *device) {
  return cuCtxGetDevice(device);
}

unsigned int cudaStreamIsCapturing(CUstream s, unsigned int *status) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = cuStreamIsCapturing(s, &st);
  *status = (unsigned int)st;
  return r;
}
