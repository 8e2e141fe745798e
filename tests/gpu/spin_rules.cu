/* spin_rules.cu - issue 9's pool rules on a real GPU, with kernels that
 * spin instead of host functions: a kernel holds a pool block (it waits on
 * a flag in mapped page-locked memory, then copies the block's first byte
 * out), the host frees the block and lets another stream (or thread) ask
 * for memory and overwrite what it gets, then raises the flag. The
 * kernel must read what was there before the free.
 *
 *   free_after_all    mp_pool_free_after_all (cuMemFree's meaning): no
 *                     stream reuses the block before the kernel is done
 *   per_thread        a block freed on thread A's per-thread default stream
 *                     is not thread B's (its per-thread stream is another)
 *   destroyed_stream  a block freed on a stream the program then destroys
 *                     (mp_stream_forget, cuStreamDestroy returns at once)
 *   host_staging      the host pool: a page-locked buffer whose copy on its
 *                     stream is held back is not handed to that stream's
 *                     next request, which the host fills at once (twin of
 *                     host_pool_streams'
 *                     same_stream_does_not_get_a_buffer_its_pending_copy_reads)
 *   sticky            last, as it leaves the context unusable: after a
 *                     kernel's illegal access a growth fails with MP_EDRIVER
 *                     and mp_last_driver_error() is 700,
 *                     CUDA_ERROR_ILLEGAL_ADDRESS (cuda.h: "any further CUDA
 *                     work will return the same error"); the twin of
 *                     test_cuda_driver_error_code.c on the fake's sticky
 *                     error; a pool made then is refused the same way
 *
 * Built and run by tests/gpu/run_spin.sh (ctest gpu_spin_rules) against
 * libmempool.so; exits 0 when every rule held, 1 naming the one that did
 * not, 77 without a usable GPU. A kernel gives up after 5 s (it then
 * reports 255), so a rule broken the other way, a deadlock, fails too. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <mempool/mempool.h>

#define BYTES (1u << 20)

static int failures;
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      printf("FAILED %s:%d: ", __FILE__, __LINE__);                            \
      printf(__VA_ARGS__);                                                     \
      printf("\n");                                                            \
      failures++;                                                              \
    }                                                                          \
  } while (0)

__device__ static unsigned long long now_ns(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Waits for *flag (5 s at most), then copies src[0] to *out (255: gave
 * up waiting). */
__global__ void hold_then_read(const volatile int *flag,
                               const unsigned char *src, unsigned char *out) {
  unsigned long long end = now_ns() + 5000000000ull;
  while (*flag == 0 && now_ns() < end) {
  }
  __threadfence_system();
  *out = *flag != 0 ? src[0] : 255;
}

typedef struct {
  volatile int *flag; /* host view */
  int *dflag;         /* device view */
  unsigned char *out; /* mapped too: what the kernel read */
  unsigned char *dout;
} gate_t;

static int gate_open(gate_t *g) {
  if (cudaHostAlloc((void **)&g->flag, sizeof(int), cudaHostAllocMapped) !=
          cudaSuccess ||
      cudaHostAlloc((void **)&g->out, 1, cudaHostAllocMapped) != cudaSuccess)
    return 0;
  *g->flag = 0;
  *g->out = 0;
  return cudaHostGetDevicePointer((void **)&g->dflag, (void *)g->flag, 0) ==
             cudaSuccess &&
         cudaHostGetDevicePointer((void **)&g->dout, g->out, 0) == cudaSuccess;
}

static void gate_close(gate_t *g) {
  cudaFreeHost((void *)g->flag);
  cudaFreeHost(g->out);
}

/* Fills p with v on s, then queues the holding kernel on s. */
static void hold(gate_t *g, void *p, cudaStream_t s) {
  CHECK(cudaMemsetAsync(p, 1, BYTES, s) == cudaSuccess, "memset");
  hold_then_read<<<1, 1, 0, s>>>(g->dflag, (const unsigned char *)p, g->dout);
  CHECK(cudaGetLastError() == cudaSuccess, "launch");
}

/* Another stream takes a block of the same size and overwrites it (not
 * waiting for it: the kernel still spins). */
static void *take_and_overwrite(mp_pool_t *pool, cudaStream_t s) {
  void *q = NULL;
  CHECK(mp_pool_alloc(pool, BYTES, (mp_stream_t)s, &q) == MP_OK, "alloc: %s",
        mp_last_error());
  if (q != NULL)
    CHECK(cudaMemsetAsync(q, 2, BYTES, s) == cudaSuccess, "memset");
  return q;
}

static void release_and_check(gate_t *g, const char *rule) {
  __atomic_store_n(g->flag, 1, __ATOMIC_SEQ_CST);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: sync", rule);
  CHECK(*g->out == 1,
        "%s: the kernel read %d, not 1 (255: it waited in vain; 2: the block "
        "was overwritten under it)",
        rule, *g->out);
  *g->flag = 0;
  *g->out = 0;
}

/* Two non-blocking streams, and a block on the first held by a kernel. */
static void *held_on_first(mp_pool_t *pool, gate_t *g, cudaStream_t *a,
                           cudaStream_t *b) {
  cudaStreamCreateWithFlags(a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(b, cudaStreamNonBlocking);
  void *p = NULL;
  CHECK(mp_pool_alloc(pool, BYTES, (mp_stream_t)*a, &p) == MP_OK, "alloc");
  hold(g, p, *a);
  return p;
}

/* A stream the pool has met is forgotten before it is destroyed
 * (mempool/device.h, mp_stream_forget): the pool's destroy records an event
 * on every stream it still knows, and on a destroyed handle a real driver
 * crashed (gpu_spin_rules: a segmentation fault on an H200, 2026-11-28;
 * the fake driver refuses such a handle instead). */
static void forget_and_destroy(mp_device_t *dev, cudaStream_t s) {
  CHECK(mp_stream_forget(dev, (mp_stream_t)s) == MP_OK, "forget");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "destroy");
}

static void free_after_all(mp_device_t *dev, mp_pool_t *pool, gate_t *g) {
  cudaStream_t a, b;
  void *p = held_on_first(pool, g, &a, &b);
  CHECK(mp_pool_free_after_all(pool, p) == MP_OK, "free: %s", mp_last_error());
  void *q = take_and_overwrite(pool, b);
  release_and_check(g, "free_after_all");
  mp_pool_free(pool, q);
  forget_and_destroy(dev, a);
  forget_and_destroy(dev, b);
}

typedef struct {
  mp_pool_t *pool;
  void *q;
} thread_arg_t;

static void *other_thread(void *p) {
  thread_arg_t *t = (thread_arg_t *)p;
  cudaSetDevice(0);
  t->q = take_and_overwrite(t->pool, cudaStreamPerThread);
  return NULL;
}

static void per_thread(mp_pool_t *pool, gate_t *g) {
  void *p = NULL;
  CHECK(mp_pool_alloc(pool, BYTES, (mp_stream_t)cudaStreamPerThread, &p) ==
            MP_OK,
        "alloc");
  hold(g, p, cudaStreamPerThread);
  CHECK(mp_pool_free(pool, p) == MP_OK, "free");
  thread_arg_t t = {pool, NULL};
  pthread_t th;
  pthread_create(&th, NULL, other_thread, &t);
  pthread_join(th, NULL);
  release_and_check(g, "per_thread");
  mp_pool_free(pool, t.q);
}

static void destroyed_stream(mp_device_t *dev, mp_pool_t *pool, gate_t *g) {
  cudaStream_t a, b;
  void *p = held_on_first(pool, g, &a, &b);
  CHECK(mp_pool_free(pool, p) == MP_OK, "free");
  forget_and_destroy(dev, a);
  void *q = take_and_overwrite(pool, b);
  release_and_check(g, "destroyed_stream");
  mp_pool_free(pool, q);
  forget_and_destroy(dev, b);
}

/* A staging loop: the host fills a buffer for stream a, a copy on a
 * (behind the spinning kernel) reads it into device memory, the buffer is
 * freed, and the next buffer for a is filled by the host at once. The copy
 * must move what the host wrote first. */
static void host_staging(mp_device_t *dev, gate_t *g) {
  mp_host_pool_t *hp = NULL;
  CHECK(mp_host_pool_create(dev, NULL, &hp) == MP_OK, "host pool: %s",
        mp_last_error());
  cudaStream_t a;
  unsigned char *d = NULL, first = 0;
  void *stage = NULL, *again = NULL;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  CHECK(cudaMalloc((void **)&d, BYTES) == cudaSuccess, "cudaMalloc");
  CHECK(cudaMemset(d, 0, BYTES) == cudaSuccess, "memset");
  if (hp == NULL || d == NULL ||
      mp_host_pool_alloc(hp, BYTES, (mp_stream_t)a, &stage) != MP_OK) {
    CHECK(0, "host_staging: set-up: %s", mp_last_error());
    return;
  }
  memset(stage, 1, BYTES);
  hold_then_read<<<1, 1, 0, a>>>(g->dflag, d, g->dout);
  CHECK(cudaMemcpyAsync(d, stage, BYTES, cudaMemcpyHostToDevice, a) ==
            cudaSuccess,
        "copy");
  CHECK(mp_host_pool_free(hp, stage) == MP_OK, "free");
  CHECK(mp_host_pool_alloc(hp, BYTES, (mp_stream_t)a, &again) == MP_OK,
        "alloc: %s", mp_last_error());
  CHECK(again != stage, "host_staging: a got back the buffer its copy reads");
  if (again != NULL)
    memset(again, 2, BYTES);
  __atomic_store_n(g->flag, 1, __ATOMIC_SEQ_CST);
  CHECK(cudaStreamSynchronize(a) == cudaSuccess, "sync");
  CHECK(cudaMemcpy(&first, d, 1, cudaMemcpyDeviceToHost) == cudaSuccess,
        "read back");
  CHECK(first == 1, "host_staging: the copy moved %d, not 1", first);
  *g->flag = 0;
  *g->out = 0;
  mp_host_pool_free(hp, again);
  cudaFree(d);
  forget_and_destroy(dev, a);
  CHECK(mp_host_pool_destroy(hp) == MP_OK, "destroy: %s", mp_last_error());
}

/* A store to an address no allocation holds. */
__global__ void fault(int *p) {
  *p = 1;
}

static void sticky(mp_pool_t *pool) {
  fault<<<1, 1>>>((int *)0x10);
  cudaError_t e = cudaDeviceSynchronize();
  CHECK(e == cudaErrorIllegalAddress, "sticky: the fault gave %d", (int)e);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, (size_t)1 << 30, NULL, &p);
  CHECK(st == MP_EDRIVER && mp_last_driver_error() == 700,
        "sticky: %s, driver code %d (%s)", mp_status_name(st),
        mp_last_driver_error(), mp_last_error());
  /* A pool asked for now is refused the same way (its size unknown). */
  mp_pool_t *again = NULL;
  st = mp_pool_create(mp_pool_device(pool), NULL, &again);
  CHECK(st == MP_EDRIVER && mp_last_driver_error() == 700 && again == NULL,
        "sticky: a new pool: %s, driver code %d (%s)", mp_status_name(st),
        mp_last_driver_error(), mp_last_error());
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0); /* what failed survives a crash */
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("skip: no usable GPU\n");
    return 77;
  }
  cudaSetDevice(0);
  cudaFree(0); /* the primary context, shared with the pool's backend */
  mp_device_t *dev = NULL;
  mp_pool_t *pool = NULL;
  if (mp_device_open("cuda:0", &dev) != MP_OK ||
      mp_pool_create(dev, NULL, &pool) != MP_OK) {
    printf("FAILED: %s\n", mp_last_error());
    return 1;
  }
  gate_t g;
  if (!gate_open(&g)) {
    printf("FAILED: mapped page-locked memory\n");
    return 1;
  }
  const char *only = argc > 1 ? argv[1] : NULL;
  if (only == NULL || strcmp(only, "free_after_all") == 0)
    free_after_all(dev, pool, &g);
  if (only == NULL || strcmp(only, "per_thread") == 0)
    per_thread(pool, &g);
  if (only == NULL || strcmp(only, "destroyed_stream") == 0)
    destroyed_stream(dev, pool, &g);
  if (only == NULL || strcmp(only, "host_staging") == 0)
    host_staging(dev, &g);
  CHECK(mp_pool_check(pool) == MP_OK, "check: %s", mp_last_error());
  if (only == NULL || strcmp(only, "sticky") == 0)
    sticky(pool); /* last: the context is unusable after it */
  gate_close(&g);
  mp_pool_destroy(pool);
  mp_device_close(dev);
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}
