// gpu_prog.cu - the preload's GPU check program (tests/preload/gpu).
//
// Built twice by run_gpu.sh: with nvcc's default static runtime (the shim
// reaches it through dlsym and cuGetProcAddress on libcuda.so.1) and with
// -cudart shared (the shim replaces the runtime's own entry points). Both
// must run correctly under libmempool_preload.so and leave traces with the
// same numbers of allocations and frees.
//
// It allocates buffers of assorted sizes with cudaMalloc, fills them with a
// kernel and checks the contents on the host, allocates and frees
// stream-ordered with cudaMallocAsync / cudaFreeAsync on two streams,
// captures a graph whose allocation must bypass the pool, reads
// cudaMemGetInfo, and prints "allocs=A frees=F free=X total=T".
// Exit 0: all good; 2: a CUDA call failed (named); 3: wrong data.
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>
#include <vector>

static int allocs, frees;

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("FAILED %s: %s\n", #call, cudaGetErrorString(e_));           \
      std::exit(2);                                                            \
    }                                                                          \
  } while (0)

__global__ void fill(int *p, size_t n, int v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = v + (int)(i % 1000);
}

static bool verify(const int *dev, size_t n, int v) {
  std::vector<int> host(n);
  CHECK(cudaMemcpy(host.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    if (host[i] != v + (int)(i % 1000))
      return false;
  return true;
}

// What the runtime's cudaMalloc leaves behind holds when the shim serves
// it: the primary context is current afterwards (a driver-API call made
// next finds it), and a failure is the runtime's last error.
static int runtime_state_kept() {
  void *q = nullptr;
  CHECK(cudaMalloc(&q, 1 << 20));
  allocs++;
  CUcontext cur = nullptr, primary = nullptr;
  if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur == nullptr) {
    std::printf("FAILED no current context after cudaMalloc\n");
    return 2;
  }
  if (cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS || primary != cur) {
    std::printf("FAILED the current context is not the primary one\n");
    return 2;
  }
  cuDevicePrimaryCtxRelease(0);
  CHECK(cudaFree(q));
  frees++;
  void *huge = nullptr;
  if (cudaMalloc(&huge, (size_t)1 << 60) == cudaSuccess) {
    std::printf("FAILED cudaMalloc(2^60) succeeded\n");
    return 2;
  }
  if (cudaGetLastError() != cudaErrorMemoryAllocation) {
    std::printf("FAILED cudaGetLastError does not see the failure\n");
    return 2;
  }
  return 0;
}

int main() {
  const int n = 32;
  std::vector<int *> p(n);
  std::vector<size_t> len(n);
  if (int rc = runtime_state_kept())
    return rc;
  for (int i = 0; i < n; i++) {
    len[i] = (size_t)(i % 7 + 1) * 10000 + (size_t)i * 333;
    CHECK(cudaMalloc(&p[i], len[i] * sizeof(int)));
    allocs++;
    fill<<<64, 256>>>(p[i], len[i], i);
  }
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++)
    if (!verify(p[i], len[i], i)) {
      std::printf("FAILED data of buffer %d\n", i);
      return 3;
    }
  for (int i = 0; i < n; i += 2) {
    CHECK(cudaFree(p[i]));
    frees++;
  }

  cudaStream_t s[2];
  for (auto &st : s)
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int round = 0; round < 8; round++) {
    for (int k = 0; k < 2; k++) {
      int *q = nullptr;
      size_t m = (size_t)(round + 1) * 50000;
      CHECK(cudaMallocAsync(&q, m * sizeof(int), s[k]));
      allocs++;
      fill<<<64, 256, 0, s[k]>>>(q, m, round);
      if (round == 7 && k == 0) {
        CHECK(cudaStreamSynchronize(s[k]));
        if (!verify(q, m, round)) {
          std::printf("FAILED data of async buffer\n");
          return 3;
        }
      }
      CHECK(cudaFreeAsync(q, s[k]));
      frees++;
    }
  }
  for (auto &st : s)
    CHECK(cudaStreamSynchronize(st));

  // A captured allocation belongs to the graph: the pool stays out of it.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int *g = nullptr;
  CHECK(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeGlobal));
  CHECK(cudaMallocAsync(&g, 1 << 20, s[0]));
  allocs++;
  fill<<<64, 256, 0, s[0]>>>(g, (1 << 20) / sizeof(int), 7);
  CHECK(cudaFreeAsync(g, s[0]));
  frees++;
  CHECK(cudaStreamEndCapture(s[0], &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, s[0]));
  CHECK(cudaStreamSynchronize(s[0]));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));

  for (int i = 1; i < n; i += 2) {
    CHECK(cudaFree(p[i]));
    frees++;
  }
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  for (auto &st : s)
    CHECK(cudaStreamDestroy(st));
  std::printf("allocs=%d frees=%d free=%zu total=%zu\n", allocs, frees, free_b,
              total_b);
  return 0;
}
