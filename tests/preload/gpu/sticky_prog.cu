// sticky_prog.cu - the GPU twin of unit_preload_driver_error: after a
// kernel's illegal access, a sticky error (cuda_runtime_api.h,
// cudaDeviceSynchronize: "this function may also return error codes from
// previous, asynchronous launches"; driver_types.h, cudaErrorIllegalAddress:
// "the process is left in an inconsistent state and any further CUDA work
// will return the same error"), an allocation the pool's cache cannot
// serve makes the pool ask the driver, which refuses with that error. The
// shim answers with the driver's code, as without it (before 2026-12-02:
// cudaErrorUnknown). Prints the codes; run_gpu.sh compares the output with
// and without the shim.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void fault(int *p) { *p = 1; }

int main() {
  void *warm = nullptr;
  if (cudaMalloc(&warm, 1 << 20) != cudaSuccess || cudaFree(warm) != cudaSuccess) {
    printf("no device\n");
    return 1;
  }
  fault<<<1, 1>>>(reinterpret_cast<int *>(0x10));
  cudaError_t s = cudaDeviceSynchronize();
  void *p = nullptr;
  cudaError_t m = cudaMalloc(&p, size_t(1) << 30);
  cudaError_t last = cudaGetLastError();
  printf("sync=%d malloc=%d last=%d\n", (int)s, (int)m, (int)last);
  return 0;
}
