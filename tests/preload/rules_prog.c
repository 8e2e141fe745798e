/* rules_prog.c - the issue-9 reproducer: a driver-API program that relies
 * on cuMemFree keeping CUDA's ordering, linked with the fake libcuda.so.1
 * (tests/fakecuda), run with or without the shim.
 *
 * A "kernel" on non-blocking stream n1 (a host function that sleeps, then
 * a copy of the buffer into page-locked memory: what the kernel read; the
 * host never touches device memory, so the same program runs on a GPU)
 * runs late; the program frees the buffer (cuMemFree waits for all work of
 * the context, or may: cuda.h), allocates the same size again and memsets
 * the new buffer on a second non-blocking stream n2. The kernel must still
 * read what was there before the free.
 * With the argument "streams" it instead creates, uses (cuMemAllocAsync and
 * cuMemFreeAsync) and destroys 70 000 streams one after another, more than
 * a pool's stream table holds at once, with a cuMemAlloc / cuMemFree pair
 * now and then, and checks with the fake's error counter that nobody used
 * a destroyed handle.
 * With "per_thread", the same reproducer on CU_STREAM_PER_THREAD: thread
 * A's kernel reads a block A freed with cuMemFreeAsync on its per-thread
 * stream while thread B allocates with cuMemAllocAsync on its own
 * per-thread stream (another stream) and overwrites what it gets.
 * With "per_thread_free", a block thread A allocated on its per-thread
 * stream is read and freed (cuMemFreeAsync) on thread B's per-thread
 * stream, whose kernel runs late; A then allocates on its own per-thread
 * stream and overwrites what it gets. The handle is the same in both
 * threads (CU_STREAM_PER_THREAD), the stream is not.
 * With "reused_handle", a block allocated with cuMemAllocAsync on stream
 * s1 is read and freed (cuMemFreeAsync) on s2, a stream made after s1 was
 * destroyed that the driver gave s1's handle (the fake does with
 * FAKECUDA_REUSE_STREAMS=1, which the program then requires; a real driver
 * may), whose kernel runs late; a third stream then allocates and
 * overwrites what it gets. s2 is another stream than s1 whatever its
 * handle: the block is not the third stream's before s2's kernel is done.
 * With "double_free", a second cuMemFree of a block is refused as the
 * driver refuses it, and what the program allocates next still works;
 * "double_free_modes" is free_modes's table for such a second free,
 * "double_free_host_modes" the same for cuMemFreeHost.
 * With "freed_range", the range and pointer attributes of a freed block are
 * those of memory the driver does not know.
 * With "own_context", memory and a stream of a context the program made
 * and destroyed: the destroy frees them, nothing touches them after.
 * With "pair_calls", how often stream-ordered pairs ask the driver for the
 * current context. With "other_context N", cuMemAllocAsync on a stream of a
 * context the program made on device N while device 0's primary context is
 * current. With "calls_in_capture [per_thread]", cuMemAlloc and cuMemFree
 * during a global capture are the driver's refusals; "calls_in_capture
 * to_graph" (or to_graph_proc, to_graph_per_thread) the same with a capture
 * into the program's graph (cuStreamBeginCaptureToGraph, CUDA 12.3);
 * "calls_in_capture v1" with a capture begun by CUDA 10.0's
 * cuStreamBeginCapture (no mode: global), found by cuGetProcAddress.
 * With "free_modes", cuMemFree during a capture in every mode, from a
 * thread in every mode, the one that began it or another: one line per
 * case with what the free and the capture's end got (the same with and
 * without the shim); "alloc_modes" the same with cuMemAlloc in place of
 * the free; either with "rt LIB", the runtime's cudaFree or cudaMalloc
 * from LIB (a CUDA runtime: libcudart.so, or stand_runtime.c over the
 * fake). With "oom_in_capture rt LIB", thread B's cudaMallocAsync that
 * may run out of memory leaves thread A's global capture valid. With
 * "free_probes", 50 frees during a relaxed
 * capture, which no thread's mode prohibits: on the fake no cuMemAlloc
 * may reach the driver meanwhile. With "trace_threads" (or "trace_threads
 * rt LIB", the runtime's cudaMalloc and cudaFree), four threads each
 * allocate and free 64 KiB 5000 times, so that one thread's allocation
 * often gets the address another thread has just freed: the test reads
 * the trace the shim recorded (MEMPOOL_TRACE). With "refused_free" (or
 * "refused_free rt LIB"), a free during a global capture is refused, the
 * capture ends, and the block is freed again, for good.
 * With "last_error rt LIB", the runtime's cudaFree of a block freed
 * already, and of a pointer inside a live block, prints what each returned
 * and what the runtime's cudaGetLastError said after it, twice.
 * With "host_fn" (or "host_fn rt LIB"), frees and queries of blocks the
 * program holds, made from a host function, are refused as the driver
 * refuses them, and the blocks stay the program's.
 * With "refused_destroy", a cuStreamDestroy the driver refuses changes
 * nothing: the reproducer above then runs on that stream.
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prog_try.h"

#define MP_BYTES (1u << 20)

static void slow_start(void *arg) {
  (void)arg;
  usleep(150000);
}

/* The fake's test hook; absent from a real driver (the GPU run). */
__attribute__((weak)) long long cuFakeGetErrorCount(CUresult r);

static long long bad_handles(void) {
  return cuFakeGetErrorCount ? cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE)
                             : 0;
}

static int many_streams(void) {
  long long bad = bad_handles();
  for (int i = 0; i < 70000; i++) {
    CUstream s;
    CUdeviceptr p;
    MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    MP_TRY(cuMemAllocAsync(&p, 4096, s));
    MP_TRY(cuMemFreeAsync(p, s));
    MP_TRY(cuStreamDestroy(s));
    /* cuMemFree waits for every stream the pool knows: none of them may
     * be a destroyed one. */
    if (i % 1000 == 0) {
      MP_TRY(cuMemAlloc(&p, 4096));
      MP_TRY(cuMemFree(p));
    }
  }
  MP_TRY(cuCtxSynchronize());
  if (bad_handles() != bad) {
    printf("a destroyed stream's handle was used %lld times\n",
           bad_handles() - bad);
    return 1;
  }
  puts("ok");
  return 0;
}

static CUcontext ctx;

static void *overwrite_on_own_per_thread_stream(void *unused) {
  (void)unused;
  CUdeviceptr q;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuMemAllocAsync(&q, MP_BYTES, CU_STREAM_PER_THREAD) != CUDA_SUCCESS ||
      cuMemsetD8Async(q, 2, MP_BYTES, CU_STREAM_PER_THREAD) != CUDA_SUCCESS ||
      cuMemFreeAsync(q, CU_STREAM_PER_THREAD) != CUDA_SUCCESS ||
      cuStreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS)
    return (void *)1;
  return NULL;
}

static int per_thread(void) {
  CUstream pt = CU_STREAM_PER_THREAD;
  CUdeviceptr p;
  unsigned char *seen = NULL;
  MP_TRY(cuMemAllocHost((void **)&seen, 1));
  MP_TRY(cuMemAllocAsync(&p, MP_BYTES, pt));
  MP_TRY(cuMemsetD8Async(p, 1, MP_BYTES, pt));
  MP_TRY(cuLaunchHostFunc(pt, slow_start, NULL));
  MP_TRY(cuMemcpyAsync((CUdeviceptr)(uintptr_t)seen, p, 1, pt));
  MP_TRY(cuMemFreeAsync(p, pt));
  pthread_t t;
  void *failed = NULL;
  if (pthread_create(&t, NULL, overwrite_on_own_per_thread_stream, NULL) != 0 ||
      pthread_join(t, &failed) != 0 || failed != NULL) {
    puts("thread B's allocation on its per-thread stream failed");
    return 1;
  }
  MP_TRY(cuStreamSynchronize(pt));
  if (*seen != 1) {
    printf("the kernel on thread A's per-thread stream read %d, not 1: "
           "thread B got the block A freed and overwrote it under it\n",
           *seen);
    return 1;
  }
  MP_TRY(cuMemFreeHost(seen));
  puts("ok");
  return 0;
}

/* The end of a rule that passed: every stream's work done, the host
 * byte the kernels wrote freed, "ok" said. */
static int settled_ok(unsigned char *seen) {
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuMemFreeHost(seen));
  puts("ok");
  return 0;
}

static CUdeviceptr shared_p;
static unsigned char *shared_seen;
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cv = PTHREAD_COND_INITIALIZER;
static int step;

static void step_to(int n) {
  pthread_mutex_lock(&step_mu);
  step = n;
  pthread_cond_broadcast(&step_cv);
  pthread_mutex_unlock(&step_mu);
}

static void step_wait(int n) {
  pthread_mutex_lock(&step_mu);
  while (step < n)
    pthread_cond_wait(&step_cv, &step_mu);
  pthread_mutex_unlock(&step_mu);
}

/* Thread B: its kernel reads A's block late on B's own per-thread stream
 * and, with frees (not NULL), B then frees the block there; B's stream is
 * waited for only once A is done. */
static void *read_late_on_own_per_thread_stream(void *frees) {
  CUstream pt = CU_STREAM_PER_THREAD;
  void *failed = NULL;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuLaunchHostFunc(pt, slow_start, NULL) != CUDA_SUCCESS ||
      cuMemcpyAsync((CUdeviceptr)(uintptr_t)shared_seen, shared_p, 1, pt) !=
          CUDA_SUCCESS ||
      (frees != NULL && cuMemFreeAsync(shared_p, pt) != CUDA_SUCCESS))
    failed = (void *)1;
  step_to(1);
  step_wait(2);
  if (cuStreamSynchronize(pt) != CUDA_SUCCESS)
    failed = (void *)1;
  return failed;
}

/* Thread B reads shared_p late on its per-thread stream (and frees it
 * there, with b_frees); meanwhile
 * thread A (after a cuMemFree of shared_p, with free_first) allocates a
 * block on s into *q and overwrites it. B must have read 1: else says
 * what happened (what) and returns 1. */
static int overwrite_while_b_reads(bool b_frees, bool free_first, CUstream s,
                                   CUdeviceptr *q, const char *what) {
  pthread_t t;
  void *failed = NULL;
  if (pthread_create(&t, NULL, read_late_on_own_per_thread_stream,
                     b_frees ? (void *)1 : NULL) != 0) {
    puts("no thread B");
    return 1;
  }
  step_wait(1);
  CUresult a = free_first ? cuMemFree(shared_p) : CUDA_SUCCESS;
  if (a == CUDA_SUCCESS)
    a = cuMemAllocAsync(q, MP_BYTES, s);
  if (a == CUDA_SUCCESS)
    a = cuMemsetD8Async(*q, 2, MP_BYTES, s);
  if (a == CUDA_SUCCESS)
    a = cuStreamSynchronize(s);
  step_to(2);
  if (pthread_join(t, &failed) != 0 || failed != NULL || a != CUDA_SUCCESS) {
    printf("a call failed (thread A: error %d)\n", (int)a);
    return 1;
  }
  if (*shared_seen != 1) {
    printf("the kernel on thread B's per-thread stream read %d, not 1: %s "
           "(new block %s the old) and overwrote it under it\n",
           *shared_seen, what, *q == shared_p ? "is" : "is not");
    return 1;
  }
  return 0;
}

static int per_thread_free(void) {
  CUstream pt = CU_STREAM_PER_THREAD;
  CUdeviceptr q;
  MP_TRY(cuMemAllocHost((void **)&shared_seen, 1));
  MP_TRY(cuMemAllocAsync(&shared_p, MP_BYTES, pt));
  MP_TRY(cuMemsetD8Async(shared_p, 1, MP_BYTES, pt));
  MP_TRY(cuStreamSynchronize(pt));
  if (overwrite_while_b_reads(true, false, pt, &q,
                              "thread A got the block B freed on B's stream"))
    return 1;
  MP_TRY(cuMemFreeAsync(q, pt));
  return settled_ok(shared_seen);
}

/* cuMemFree of a block a kernel on another thread's per-thread stream
 * still reads (a thread that never allocated, so the shim never met its
 * stream): cuda.h, cuMemFree; the per-thread stream is a blocking stream,
 * which the legacy stream's work waits for (the driver API's "Stream
 * synchronization behavior"). A non-blocking stream's allocation may not
 * get the block and overwrite it before that kernel has read it. With
 * same (under the shim, its pool capped at two blocks, one kept live),
 * the allocation must get that very block: the check is not passed by a
 * block from elsewhere. */
static int unseen_per_thread(bool same) {
  CUstream s;
  CUdeviceptr q, other;
  MP_TRY(cuMemAllocHost((void **)&shared_seen, 1));
  MP_TRY(cuMemAlloc(&shared_p, MP_BYTES));
  MP_TRY(cuMemAlloc(&other, MP_BYTES));
  MP_TRY(cuMemsetD8(shared_p, 1, MP_BYTES));
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  if (overwrite_while_b_reads(false, true, s, &q,
                              "the block A freed (cuMemFree) was given to "
                              "stream s"))
    return 1;
  if (same && q != shared_p) {
    puts("stream s got another block than the one freed: the check proves "
         "nothing (a pool capped at two blocks grew?)");
    return 1;
  }
  MP_TRY(cuMemFreeAsync(q, s));
  MP_TRY(cuMemFree(other));
  MP_TRY(cuStreamDestroy(s));
  return settled_ok(shared_seen);
}

static int reused_handle(void) {
  CUstream s1, s2, s3;
  CUdeviceptr p, q;
  unsigned char *seen = NULL;
  MP_TRY(cuMemAllocHost((void **)&seen, 1));
  MP_TRY(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAllocAsync(&p, MP_BYTES, s1));
  MP_TRY(cuMemsetD8Async(p, 1, MP_BYTES, s1));
  MP_TRY(cuStreamDestroy(s1));
  MP_TRY(cuCtxSynchronize()); /* s1's resources released */
  MP_TRY(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  const char *reuse = getenv("FAKECUDA_REUSE_STREAMS");
  if (s2 != s1 && reuse != NULL && strcmp(reuse, "1") == 0) {
    printf("FAKECUDA_REUSE_STREAMS=1, yet s2 (%p) is not s1's handle (%p)\n",
           (void *)s2, (void *)s1);
    return 1;
  }
  if (s2 != s1) /* a real driver that gave a new handle: still a check */
    fprintf(stderr, "reused_handle: the driver gave s2 a new handle\n");
  MP_TRY(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuLaunchHostFunc(s2, slow_start, NULL));
  MP_TRY(cuMemcpyAsync((CUdeviceptr)(uintptr_t)seen, p, 1, s2));
  MP_TRY(cuMemFreeAsync(p, s2));
  MP_TRY(cuMemAllocAsync(&q, MP_BYTES, s3));
  MP_TRY(cuMemsetD8Async(q, 2, MP_BYTES, s3));
  MP_TRY(cuCtxSynchronize());
  if (*seen != 1) {
    printf("the kernel on s2 read %d, not 1: s3 got the block freed on s2 "
           "(new block %s the old), s1's handle taken for s2, and "
           "overwrote it under it\n",
           *seen, q == p ? "is" : "is not");
    return 1;
  }
  MP_TRY(cuMemFreeAsync(q, s3));
  MP_TRY(cuStreamDestroy(s2));
  MP_TRY(cuStreamDestroy(s3));
  return settled_ok(seen);
}

static int double_free(void) {
  CUdeviceptr p, q;
  MP_TRY(cuMemAlloc(&p, MP_BYTES));
  MP_TRY(cuMemFree(p));
  CUresult again = cuMemFree(p);
  if (again == CUDA_SUCCESS) {
    puts("a second cuMemFree of the same block succeeded");
    return 1;
  }
  MP_TRY(cuMemAlloc(&q, MP_BYTES));
  MP_TRY(cuMemsetD8(q, 3, MP_BYTES));
  MP_TRY(cuMemFree(q));
  MP_TRY(cuCtxSynchronize());
  puts("ok");
  return 0;
}

/* A freed block is no allocation any more: cuMemGetAddressRange says
 * CUDA_ERROR_NOT_FOUND and cuPointerGetAttribute CUDA_ERROR_INVALID_VALUE
 * (cuda.h: "If ptr was not allocated by ... then CUDA_ERROR_INVALID_VALUE
 * is returned"), at its start and inside it, while a block after it (its
 * segment's, under the shim) lives on. */
static int freed_range(void) {
  CUdeviceptr p, q, base = 0;
  size_t size = 0;
  MP_TRY(cuMemAlloc(&p, MP_BYTES / 4));
  MP_TRY(cuMemAlloc(&q, MP_BYTES / 4));
  MP_TRY(cuMemFree(p));
  CUdeviceptr at[] = {p, p + 4096};
  for (int i = 0; i < 2; i++) {
    CUresult r = cuMemGetAddressRange(&base, &size, at[i]);
    if (r != CUDA_ERROR_NOT_FOUND) {
      printf("cuMemGetAddressRange of a freed block (+%d): error %d, range "
             "%#llx + %zu\n",
             i * 4096, (int)r, (unsigned long long)base, size);
      return 1;
    }
    r = cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                              at[i]);
    if (r != CUDA_ERROR_INVALID_VALUE) {
      printf("cuPointerGetAttribute(RANGE_START_ADDR) of a freed block "
             "(+%d): error %d, start %#llx\n",
             i * 4096, (int)r, (unsigned long long)base);
      return 1;
    }
  }
  /* The plural: "default NULL values" for a pointer the driver does not
   * know, and CUDA_SUCCESS (cuda.h). */
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  base = 1;
  size = 1;
  void *data[] = {&base, &size};
  MP_TRY(cuPointerGetAttributes(2, attrs, data, p + 4096));
  /* No allocation, no handle: another process would open the memory the
   * block was in, which the pool hands out again. */
  CUipcMemHandle h;
  CUresult ri = cuIpcGetMemHandle(&h, p);
  if (ri == CUDA_SUCCESS) {
    puts("cuIpcGetMemHandle of a freed block succeeded");
    return 1;
  }
  if (base != 0 || size != 0) {
    printf("cuPointerGetAttributes of a freed block: range %#llx + %zu\n",
           (unsigned long long)base, size);
    return 1;
  }
  MP_TRY(cuMemGetAddressRange(&base, &size, q + 4096));
  if (base != q || size != MP_BYTES / 4) {
    printf("the live block's range is %#llx + %zu\n", (unsigned long long)base,
           size);
    return 1;
  }
  MP_TRY(cuMemFree(q));
  puts("ok");
  return 0;
}

/* Memory of a context the program made (cuCtxCreate) is that context's:
 * cuMemAlloc and cuMemAllocAsync on its stream work in it, and
 * cuCtxDestroy frees it with the stream (cuda.h, cuCtxDestroy: "Destroys
 * the CUDA context specified by ctx ... all the resources"). A later
 * cuMemFree of such a block is refused, and nothing the program does in
 * the primary context afterwards touches the destroyed stream. */
static int own_context(void) {
  long long bad = bad_handles();
  CUcontext own;
  CUstream s;
  CUdeviceptr p, q, r2;
#if CUDA_VERSION >= 13000 /* cuCtxCreate is cuCtxCreate_v4 */
  MP_TRY(cuCtxCreate(&own, NULL, 0, 0));
#else
  MP_TRY(cuCtxCreate(&own, 0, 0));
#endif
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAlloc(&p, MP_BYTES));
  MP_TRY(cuMemAllocAsync(&q, MP_BYTES, s));
  MP_TRY(cuMemsetD8Async(q, 4, MP_BYTES, s));
  MP_TRY(cuMemsetD8(p, 5, MP_BYTES));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuCtxDestroy(own));
  MP_TRY(cuCtxSetCurrent(ctx));
  CUresult r = cuMemFree(p);
  if (r == CUDA_SUCCESS) {
    puts("cuMemFree of a block of a destroyed context succeeded");
    return 1;
  }
  for (int i = 0; i < 4; i++) {
    MP_TRY(cuMemAlloc(&r2, MP_BYTES));
    MP_TRY(cuMemsetD8(r2, 6, MP_BYTES));
    MP_TRY(cuMemFree(r2));
  }
  MP_TRY(cuCtxSynchronize());
  if (bad_handles() != bad) {
    printf("a destroyed context's stream was used %lld times\n",
           bad_handles() - bad);
    return 1;
  }
  puts("ok");
  return 0;
}

/* cuMemAlloc and cuMemFree while a stream of the program (non-blocking, so
 * the legacy stream never meets it) is being captured in global mode are
 * calls that mode prohibits: the driver refuses them with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture
 * (cuda.h, cuThreadExchangeStreamCaptureMode: "prohibited from potentially
 * unsafe API calls"); the block stays the program's, and freed after the
 * capture ended it goes. With "per_thread" the capture is of the thread's
 * per-thread stream, begun through the cuStreamBeginCapture that
 * cuGetProcAddress answers with its per-thread flag. With "to_graph" the
 * capture is into a graph the program made (cuStreamBeginCaptureToGraph,
 * whose mode means what cuStreamBeginCapture's does: cuda.h), called
 * directly, or found by cuGetProcAddress ("to_graph_proc", and
 * "to_graph_per_thread" with its per-thread flag); the
 * invalidated capture gives no graph back, and the program's graph is
 * still the program's to destroy. */
typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*begin_v1_fn)(CUstream);
typedef CUresult (*begin_to_graph_fn)(CUstream, CUgraph, const CUgraphNode *,
                                      const CUgraphEdgeData *, size_t,
                                      CUstreamCaptureMode);

static int calls_in_capture(bool per_thread, bool to_graph, bool proc,
                            bool v1) {
  CUstream s = CU_STREAM_PER_THREAD;
  CUdeviceptr p, q = 0;
  CUgraph g = NULL, into = NULL;
  void *begin = NULL;
  cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                : CU_GET_PROC_ADDRESS_DEFAULT;
  if (!to_graph && !v1)
    MP_TRY(
        cuGetProcAddress("cuStreamBeginCapture", &begin, 10010, flags, NULL));
  else if (v1)
    MP_TRY(
        cuGetProcAddress("cuStreamBeginCapture", &begin, 10000, flags, NULL));
  else if (proc || per_thread)
    MP_TRY(cuGetProcAddress("cuStreamBeginCaptureToGraph", &begin, 12030, flags,
                            NULL));
  if (!per_thread)
    MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAlloc(&p, MP_BYTES));
  MP_TRY(cuMemsetD8(p, 7, MP_BYTES));
  CUstream cs = per_thread ? NULL : s;
  if (v1) {
    MP_TRY(((begin_v1_fn)begin)(cs));
  } else if (!to_graph) {
    MP_TRY(((begin_fn)begin)(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  } else {
    MP_TRY(cuGraphCreate(&into, 0));
    begin_to_graph_fn b =
        begin != NULL ? (begin_to_graph_fn)begin : cuStreamBeginCaptureToGraph;
    MP_TRY(b(cs, into, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  }
  CUresult rf = cuMemFree(p);
  CUresult ra = cuMemAlloc(&q, MP_BYTES);
  CUresult end = cuStreamEndCapture(s, &g);
  if (rf != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
      ra != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
    printf("during a global capture: cuMemFree error %d, cuMemAlloc error "
           "%d\n",
           (int)rf, (int)ra);
    return 1;
  }
  if (end != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
    printf("the capture ended with error %d, not invalidated\n", (int)end);
    return 1;
  }
  if (to_graph && g != NULL) {
    puts("the invalidated capture gave a graph back (cuda.h: NULL)");
    return 1;
  }
  if (g != NULL)
    MP_TRY(cuGraphDestroy(g));
  if (into != NULL)
    MP_TRY(cuGraphDestroy(into));
  unsigned char b = 0;
  MP_TRY(cuMemcpyDtoH(&b, p + MP_BYTES - 1, 1));
  if (b != 7) {
    printf("the block the refused free left reads %d\n", b);
    return 1;
  }
  MP_TRY(cuMemFree(p));
  MP_TRY(cuMemAlloc(&q, MP_BYTES));
  MP_TRY(cuMemFree(q));
  if (!per_thread)
    MP_TRY(cuStreamDestroy(s));
  MP_TRY(cuCtxSynchronize());
  puts("ok");
  return 0;
}

/* The fake's call counter; absent from a real driver. */
__attribute__((weak)) long long cuFakeGetCallCount(const char *name);

/* The runtime's cudaMalloc and cudaFree (free_modes rt LIB), or NULL: the
 * driver's. Their codes for what they meet here are the driver's numbers
 * (driver_types.h: cudaErrorStreamCaptureUnsupported is 900, as cuda.h's
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). */
static unsigned (*rt_malloc)(void **, size_t);
static unsigned (*rt_free)(void *);

/* double_free_modes: the block is freed before the capture and freed
 * again during it: a second free, which the driver refuses as any free
 * where the capture prohibits the call (cuda.h,
 * cuThreadExchangeStreamCaptureMode: the thread "is prohibited from
 * potentially unsafe API calls"), else as memory it does not know. */
static bool free_twice;
/* double_free_host_modes: the same with page-locked memory (cuMemAllocHost,
 * cuMemFreeHost). */
static bool free_host;

typedef struct freer {
  CUdeviceptr p;
  CUstreamCaptureMode mode; /* the freeing thread's */
  bool alloc;               /* allocate one more instead of freeing p */
  CUresult got;
} freer_t;

static CUresult call_in_mode(freer_t *f) {
  if (f->alloc && rt_malloc != NULL) {
    void *q = NULL;
    CUresult r = (CUresult)rt_malloc(&q, MP_BYTES);
    f->p = (CUdeviceptr)(uintptr_t)q;
    return r;
  }
  if (f->alloc)
    return cuMemAlloc(&f->p, MP_BYTES);
  if (free_host)
    return cuMemFreeHost((void *)(uintptr_t)f->p);
  return rt_free != NULL ? (CUresult)rt_free((void *)(uintptr_t)f->p)
                         : cuMemFree(f->p);
}

static void *free_in_mode(void *arg) {
  freer_t *f = arg;
  CUstreamCaptureMode m = f->mode;
  f->got = cuCtxSetCurrent(ctx);
  if (f->got == CUDA_SUCCESS)
    f->got = cuThreadExchangeStreamCaptureMode(&m);
  if (f->got == CUDA_SUCCESS) {
    f->got = call_in_mode(f);
    (void)cuThreadExchangeStreamCaptureMode(&m);
  }
  return NULL;
}

/* alloc: the synchronous allocation instead of the free. */
static int free_modes(bool alloc) {
  CUstream s;
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int cap = 0; cap < 3; cap++)
    for (int thr = 0; thr < 3; thr++)
      for (int other = 0; other < 2; other++) {
        freer_t f = {.mode = (CUstreamCaptureMode)thr, .alloc = alloc};
        CUgraph g = NULL;
        pthread_t t;
        void *h = NULL;
        if (free_host) {
          MP_TRY(cuMemAllocHost(&h, MP_BYTES));
          f.p = (CUdeviceptr)(uintptr_t)h;
        } else if (!alloc) {
          MP_TRY(cuMemAlloc(&f.p, MP_BYTES));
        }
        if (free_twice && call_in_mode(&f) != CUDA_SUCCESS)
          return 1;
        MP_TRY(cuStreamBeginCapture(s, (CUstreamCaptureMode)cap));
        if (!other)
          free_in_mode(&f);
        else if (pthread_create(&t, NULL, free_in_mode, &f) != 0 ||
                 pthread_join(t, NULL) != 0)
          return 1;
        CUresult end = cuStreamEndCapture(s, &g);
        if (g != NULL)
          MP_TRY(cuGraphDestroy(g));
        /* Refused: still the program's (one freed twice is not). */
        if (f.got != CUDA_SUCCESS && !alloc && !free_twice)
          MP_TRY(cuMemFree(f.p));
        if (f.got == CUDA_SUCCESS && alloc)
          MP_TRY(cuMemFree(f.p));
        printf("capture mode %d, %s thread in mode %d: %s %d, end %d\n", cap,
               other ? "another" : "the same", thr, alloc ? "alloc" : "free",
               (int)f.got, (int)end);
      }
  MP_TRY(cuStreamDestroy(s));
  return 0;
}

/* oom_in_capture: thread A captures a non-blocking stream in global mode
 * while thread B (global mode too) makes a cudaMallocAsync of 128 MiB on
 * another stream, which may fail for want of memory (the shim's pool is
 * capped at 64 MiB: MEMPOOL_CONF) but is no call A's mode prohibits
 * (stream-ordered, on a stream not captured): A's capture must end
 * valid, whatever the shim does to set the runtime's last error. */
static unsigned (*rt_malloc_async)(void **, size_t, CUstream);
static unsigned (*rt_free_async)(void *, CUstream);

static void *oom_on_own_stream(void *unused) {
  (void)unused;
  CUstream s2;
  void *q = NULL;
  CUresult c = cuCtxSetCurrent(ctx);
  if (c == CUDA_SUCCESS)
    c = cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING);
  if (c != CUDA_SUCCESS) {
    printf("thread B: no stream: error %d\n", (int)c);
    return (void *)1;
  }
  unsigned r = rt_malloc_async(&q, (size_t)128 << 20, s2);
  if (r == 0)
    r = rt_free_async(q, s2);
  else if (r == 2) /* cudaErrorMemoryAllocation */
    r = 0;
  if (r != 0) {
    printf("thread B: cudaMallocAsync of 128 MiB (or its free): error %u\n", r);
    return (void *)1;
  }
  c = cuStreamDestroy(s2); /* no synchronize: the capture may prohibit it */
  if (c != CUDA_SUCCESS) {
    printf("thread B: cuStreamDestroy: error %d\n", (int)c);
    return (void *)1;
  }
  return NULL;
}

static int oom_in_capture(void) {
  CUstream s;
  CUgraph g = NULL;
  pthread_t t;
  void *failed = NULL;
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  if (pthread_create(&t, NULL, oom_on_own_stream, NULL) != 0 ||
      pthread_join(t, &failed) != 0 || failed != NULL) {
    (void)cuStreamEndCapture(s, &g);
    puts("thread B's calls failed");
    return 1;
  }
  CUresult end = cuStreamEndCapture(s, &g);
  if (end != CUDA_SUCCESS) {
    printf("thread A's global capture ended with error %d: thread B's "
           "cudaMallocAsync on its own stream invalidated it\n",
           (int)end);
    return 1;
  }
  MP_TRY(cuGraphDestroy(g));
  MP_TRY(cuStreamDestroy(s));
  puts("ok");
  return 0;
}

static int ordinal_of(void *p) {
  int ord = -1;
  CUresult r = cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     (CUdeviceptr)(uintptr_t)p);
  return r == CUDA_SUCCESS ? ord : -1;
}

/* "cross_device rt LIB" (FAKECUDA_DEVICE_COUNT=2, device 0 current):
 * cudaMallocAsync takes from "the memory pool associated with the stream's
 * device" (cuda_runtime_api.h), and cudaFreeAsync orders a free on any
 * stream. Under the shim the stream's device's pool serves (no driver
 * cuMemAllocAsync). */
static int cross_device(void) {
  CUcontext c1 = NULL;
  CUstream s0, s1;
  void *on1 = NULL, *on0 = NULL;
  MP_TRY(cuDevicePrimaryCtxRetain(&c1, 1));
  MP_TRY(cuCtxPushCurrent(c1));
  MP_TRY(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuCtxPopCurrent(NULL));
  MP_TRY(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  long long before =
      cuFakeGetCallCount ? cuFakeGetCallCount("cuMemAllocAsync") : 0;
  MP_TRY(rt_malloc_async(&on1, 1 << 20, s1));
  MP_TRY(rt_malloc_async(&on0, 1 << 20, s0));
  long long driver =
      cuFakeGetCallCount ? cuFakeGetCallCount("cuMemAllocAsync") - before : 0;
  int o1 = ordinal_of(on1), o0 = ordinal_of(on0);
  MP_TRY(rt_free_async(on1, s0));
  MP_TRY(rt_free_async(on0, s1));
  MP_TRY(cuStreamSynchronize(s0));
  MP_TRY(cuStreamDestroy(s0));
  MP_TRY(cuCtxPushCurrent(c1));
  MP_TRY(cuStreamSynchronize(s1));
  MP_TRY(cuStreamDestroy(s1));
  MP_TRY(cuCtxPopCurrent(NULL));
  printf("ordinals %d %d, driver allocations %lld\n", o1, o0, driver);
  return o1 == 1 && o0 == 0 ? 0 : 1;
}

/* "other_context N" (device 0's primary context current; N is 0 or 1,
 * the latter with FAKECUDA_DEVICE_COUNT=2): cuMemAllocAsync and
 * cuMemFreeAsync on a stream of a context the program made on device N
 * (cuCtxCreate), called while device 0's primary context is current. A
 * context the program made is no pool's: under the shim the calls must
 * get what the driver gives them (cuda.h, cuMemAllocAsync: memory from
 * "the memory pool current to the stream's device", in the stream's
 * context), and the shim must not retain device N's primary context to
 * tell, as a retain of an inactive one creates it (cuda.h,
 * cuDevicePrimaryCtxRetain). Prints what the allocation got (and the
 * block's device), the primary retains made meanwhile, whether device
 * N's primary context is active, and what cuMemFreeAsync of a block of the
 * current context on that stream got. */
static int other_context(int n) {
  CUcontext own = NULL;
  CUdevice dev;
  CUstream s;
  CUdeviceptr q = 0;
  int active = -1, ord = -1;
  unsigned flags = 0;
  MP_TRY(cuDeviceGet(&dev, n));
#if CUDA_VERSION >= 13000 /* cuCtxCreate is cuCtxCreate_v4 */
  MP_TRY(cuCtxCreate(&own, NULL, 0, dev));
#else
  MP_TRY(cuCtxCreate(&own, 0, dev));
#endif
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuCtxPopCurrent(NULL));
  long long before =
      cuFakeGetCallCount ? cuFakeGetCallCount("cuDevicePrimaryCtxRetain") : 0;
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < 4 && r == CUDA_SUCCESS; i++) {
    r = cuMemAllocAsync(&q, MP_BYTES, s);
    if (r == CUDA_SUCCESS) {
      ord = ordinal_of((void *)(uintptr_t)q);
      MP_TRY(cuMemFreeAsync(q, s));
    }
  }
  long long retains =
      cuFakeGetCallCount
          ? cuFakeGetCallCount("cuDevicePrimaryCtxRetain") - before
          : 0;
  MP_TRY(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  /* The current context's memory (under the shim a pool block) freed on
   * that stream: cuMemFreeAsync takes any stream (cuda.h). */
  CUdeviceptr mine = 0;
  MP_TRY(cuMemAlloc(&mine, MP_BYTES));
  CUresult freed = cuMemFreeAsync(mine, s);
  if (freed != CUDA_SUCCESS)
    MP_TRY(cuMemFree(mine));
  MP_TRY(cuCtxPushCurrent(own));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamDestroy(s));
  MP_TRY(cuCtxPopCurrent(NULL));
  MP_TRY(cuCtxDestroy(own));
  printf("allocation %d on device %d, primary retains %lld, primary active "
         "%d, a block of the current context freed on it %d\n",
         (int)r, ord, retains, active, (int)freed);
  return 0;
}

/* "pair_calls": 100 stream-ordered pairs (cuMemAllocAsync, cuMemFreeAsync)
 * on a stream of the current primary context, after one to start the
 * device's pool: prints how often anything asked the driver for the
 * current context or its device meanwhile (the stream's own context says
 * which pool serves it). */
static int pair_calls(void) {
  CUstream s;
  CUdeviceptr q;
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAllocAsync(&q, MP_BYTES, s));
  MP_TRY(cuMemFreeAsync(q, s));
  long long before = cuFakeGetCallCount
                         ? cuFakeGetCallCount("cuCtxGetCurrent") +
                               cuFakeGetCallCount("cuCtxGetDevice")
                         : 0;
  for (int i = 0; i < 100; i++) {
    MP_TRY(cuMemAllocAsync(&q, MP_BYTES, s));
    MP_TRY(cuMemFreeAsync(q, s));
  }
  long long n = cuFakeGetCallCount
                    ? cuFakeGetCallCount("cuCtxGetCurrent") +
                          cuFakeGetCallCount("cuCtxGetDevice") - before
                    : 0;
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamDestroy(s));
  printf("context questions %lld\n", n);
  return 0;
}

enum { TRACE_THREADS = 4, TRACE_PAIRS = 5000 };

/* One of trace_threads' threads: pairs of 64 KiB, through the runtime's
 * calls where rt_malloc is set, else the driver's. */
static void *trace_pairs(void *arg) {
  (void)arg;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return (void *)1;
  for (int i = 0; i < TRACE_PAIRS; i++) {
    if (rt_malloc != NULL) {
      void *q = NULL;
      if (rt_malloc(&q, 1 << 16) != 0 || rt_free(q) != 0)
        return (void *)1;
    } else {
      CUdeviceptr q;
      if (cuMemAlloc(&q, 1 << 16) != CUDA_SUCCESS ||
          cuMemFree(q) != CUDA_SUCCESS)
        return (void *)1;
    }
  }
  return NULL;
}

static int refused_free(void) {
  CUstream cs;
  CUgraph g = NULL;
  void *q = NULL;
  CUdeviceptr d = 0;
  MP_TRY(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
  if (rt_malloc != NULL ? rt_malloc(&q, 1 << 16) != 0
                        : cuMemAlloc(&d, 1 << 16) != CUDA_SUCCESS) {
    puts("allocation failed");
    return 1;
  }
  MP_TRY(cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  unsigned r = rt_free != NULL ? rt_free(q) : (unsigned)cuMemFree(d);
  if (cuStreamEndCapture(cs, &g) == CUDA_SUCCESS && g != NULL)
    MP_TRY(cuGraphDestroy(g));
  if (r == 0) {
    puts("the free in a global capture was not refused");
    return 1;
  }
  if (rt_free != NULL ? rt_free(q) != 0 : cuMemFree(d) != CUDA_SUCCESS) {
    puts("the refused block could not be freed after the capture");
    return 1;
  }
  MP_TRY(cuStreamDestroy(cs));
  puts("ok");
  return 0;
}

static int trace_threads(void) {
  pthread_t t[TRACE_THREADS];
  int failed = 0;
  for (int i = 0; i < TRACE_THREADS; i++)
    if (pthread_create(&t[i], NULL, trace_pairs, NULL) != 0) {
      puts("cannot start a thread");
      return 1;
    }
  for (int i = 0; i < TRACE_THREADS; i++) {
    void *f = NULL;
    failed |= pthread_join(t[i], &f) != 0 || f != NULL;
  }
  if (failed) {
    puts("an allocation or a free failed");
    return 1;
  }
  puts("ok");
  return 0;
}

/* host_fn: what a host function (cuLaunchHostFunc) gets for a free of a
 * device block the program holds, synchronous and stream-ordered (with
 * "rt LIB", the runtime's cudaFree and cudaFreeAsync), for a
 * cuMemHostGetFlags and a cuMemFreeHost of a page-locked block, a
 * cuMemHostGetDevicePointer of a page-locked block freed before (the shim
 * answers that one itself: its block is cached), and for cuMemGetInfo,
 * cuMemGetAddressRange, cuPointerGetAttribute and cuIpcGetMemHandle of the
 * device block, and for frees the shim answers itself, without the driver:
 * of a device block freed before (double_free), of a pointer inside the
 * live one (interior), of the page-locked block (pinned), and
 * cuMemFreeHost of the page-locked block freed before (host_twice) and of
 * the device block (host_dev_free).
 * cuda.h (cuLaunchHostFunc, cuStreamAddCallback): "The host function must
 * not make any CUDA API calls"; the driver answers such a call with
 * CUDA_ERROR_NOT_PERMITTED and does nothing. One line with the answers
 * (the same with and without the shim); then both blocks must still be
 * the program's: the device block is written, not handed out again by an
 * allocation of the same size, freed once for good (a second free is
 * refused), and the page-locked block freed. */
typedef struct host_fn_calls {
  CUdeviceptr p, freed;
  void *h, *freed_h;
  CUstream s;
  unsigned free, free_async, host_flags, free_host, mem_info, range, attribute,
      ipc, host_dev, double_free, interior, pinned, host_twice, host_dev_free;
} host_fn_calls_t;

static unsigned free_block(CUdeviceptr p) {
  return rt_free != NULL ? rt_free((void *)(uintptr_t)p) : cuMemFree(p);
}

static void calls_from_host_fn(void *arg) {
  host_fn_calls_t *c = arg;
  size_t free_b = 0, total = 0, size = 0, psize = 0;
  CUdeviceptr base = 0;
  c->free = free_block(c->p);
  c->free_async = rt_free_async != NULL
                      ? rt_free_async((void *)(uintptr_t)c->p, c->s)
                      : cuMemFreeAsync(c->p, c->s);
  unsigned int flags = 0;
  c->host_flags = cuMemHostGetFlags(&flags, c->h);
  c->free_host = cuMemFreeHost(c->h);
  c->mem_info = cuMemGetInfo(&free_b, &total);
  c->range = cuMemGetAddressRange(&base, &size, c->p);
  c->attribute =
      cuPointerGetAttribute(&psize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, c->p);
  CUipcMemHandle ipc;
  c->ipc = cuIpcGetMemHandle(&ipc, c->p);
  CUdeviceptr dp;
  c->host_dev = cuMemHostGetDevicePointer(&dp, c->freed_h, 0);
  c->double_free = free_block(c->freed);
  c->interior = free_block(c->p + 4096);
  c->pinned = free_block((CUdeviceptr)(uintptr_t)c->h);
  c->host_twice = cuMemFreeHost(c->freed_h);
  c->host_dev_free = cuMemFreeHost((void *)(uintptr_t)c->p);
}

static int host_fn(void) {
  host_fn_calls_t c = {0};
  CUdeviceptr q;
  MP_TRY(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAllocHost(&c.h, 4096));
  MP_TRY(cuMemAllocHost(&c.freed_h, 4096));
  MP_TRY(cuMemFreeHost(c.freed_h));
  if (rt_malloc != NULL) {
    void *d = NULL, *f = NULL;
    if (rt_malloc(&f, MP_BYTES) != 0 || rt_malloc(&d, MP_BYTES) != 0) {
      puts("cudaMalloc failed");
      return 1;
    }
    c.freed = (CUdeviceptr)(uintptr_t)f;
    c.p = (CUdeviceptr)(uintptr_t)d;
  } else {
    MP_TRY(cuMemAlloc(&c.freed, MP_BYTES));
    MP_TRY(cuMemAlloc(&c.p, MP_BYTES));
  }
  if (free_block(c.freed) != 0) {
    puts("a free failed");
    return 1;
  }
  MP_TRY(cuLaunchHostFunc(c.s, calls_from_host_fn, &c));
  MP_TRY(cuStreamSynchronize(c.s));
  printf("free %u, free_async %u, host_flags %u, free_host %u, mem_info %u, "
         "range %u, attribute %u, ipc %u, host_dev %u, double_free %u, "
         "interior %u, pinned %u, host_twice %u, host_dev_free %u\n",
         c.free, c.free_async, c.host_flags, c.free_host, c.mem_info, c.range,
         c.attribute, c.ipc, c.host_dev, c.double_free, c.interior, c.pinned,
         c.host_twice, c.host_dev_free);
  MP_TRY(cuMemsetD8(c.p, 5, MP_BYTES));
  MP_TRY(cuMemAlloc(&q, MP_BYTES));
  if (q == c.p) {
    puts("the block the host function failed to free was handed out again");
    return 1;
  }
  MP_TRY(cuMemFree(q));
  unsigned last = free_block(c.p);
  unsigned again = free_block(c.p);
  printf("free after %u, again %s\n", last, again != 0 ? "refused" : "0");
  MP_TRY(cuMemFreeHost(c.h));
  MP_TRY(cuStreamDestroy(c.s));
  MP_TRY(cuCtxSynchronize());
  return 0;
}

/* last_error: cuda_runtime_api.h, cudaGetLastError, "Returns the last error
 * that has been produced by any of the runtime calls in the same instance
 * of the CUDA Runtime library in the host thread and resets it to
 * cudaSuccess": a cudaFree the runtime refuses (cudaErrorInvalidValue for
 * a double free or an interior pointer) is the next cudaGetLastError's
 * answer, then cudaSuccess. Under the shim the shim answers such a free of
 * its pool's memory itself, without the runtime. */
static int last_error(void) {
  void *sym = dlsym(RTLD_DEFAULT, "cudaGetLastError");
  unsigned (*get_last)(void);
  if (sym == NULL) {
    puts("the runtime lacks cudaGetLastError");
    return 1;
  }
  memcpy(&get_last, &sym, sizeof sym);
  void *q = NULL, *live = NULL;
  MP_TRY((CUresult)rt_malloc(&q, 1 << 20));
  MP_TRY((CUresult)rt_malloc(&live, 1 << 20));
  MP_TRY((CUresult)rt_free(q));
  (void)get_last();
  unsigned twice = rt_free(q), after_twice = get_last(), then = get_last();
  unsigned inside = rt_free((char *)live + 4096), after_inside = get_last(),
           then_inside = get_last();
  MP_TRY((CUresult)rt_free(live));
  printf("double free %u, last error %u then %u; interior %u, last error %u "
         "then %u\n",
         twice, after_twice, then, inside, after_inside, then_inside);
  return 0;
}

/* free_modes / alloc_modes with "rt LIB": the runtime's calls, from LIB
 * (the real libcudart.so on a GPU, stand_runtime.c on the fake), loaded
 * before any of them is made, in the global scope as a program linked
 * with it has it. */
static int runtime_modes(const char *mode, const char *lib) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  if (h == NULL) {
    printf("cannot load %s: %s\n", lib, dlerror());
    return 1;
  }
  /* Through dlsym, as the program's own calls would bind: the shim's
   * hooks under LD_PRELOAD, LIB's without. */
  void *m = dlsym(RTLD_DEFAULT, "cudaMalloc"),
       *f = dlsym(RTLD_DEFAULT, "cudaFree"),
       *ma = dlsym(RTLD_DEFAULT, "cudaMallocAsync"),
       *fa = dlsym(RTLD_DEFAULT, "cudaFreeAsync");
  if (m == NULL || f == NULL || ma == NULL || fa == NULL) {
    printf("%s lacks cudaMalloc, cudaFree or their Async forms\n", lib);
    return 1;
  }
  memcpy(&rt_malloc, &m, sizeof m);
  memcpy(&rt_free, &f, sizeof f);
  memcpy(&rt_malloc_async, &ma, sizeof ma);
  memcpy(&rt_free_async, &fa, sizeof fa);
  /* The runtime started before any capture (cudaFree(NULL), its
   * documented start), as a program has it. */
  if (rt_free(NULL) != 0) {
    puts("cudaFree(NULL) failed");
    return 1;
  }
  if (strcmp(mode, "oom_in_capture") == 0)
    return oom_in_capture();
  if (strcmp(mode, "trace_threads") == 0)
    return trace_threads();
  if (strcmp(mode, "refused_free") == 0)
    return refused_free();
  if (strcmp(mode, "cross_device") == 0)
    return cross_device();
  if (strcmp(mode, "host_fn") == 0)
    return host_fn();
  if (strcmp(mode, "last_error") == 0)
    return last_error();
  free_twice = strcmp(mode, "double_free_modes") == 0;
  return free_modes(strcmp(mode, "alloc_modes") == 0);
}

/* The issue-9 reproducer on n1 and n2: a kernel on n1 reads a buffer
 * late, the program frees it (cuMemFree), allocates the same size again
 * and overwrites the new buffer on n2. The kernel must read what was
 * there before the free. 0, or 1 after saying what broke. */
static int late_reader(CUstream n1, CUstream n2) {
  CUdeviceptr p, q;
  unsigned char *seen = NULL;
  MP_TRY(cuMemAllocHost((void **)&seen, 1));
  MP_TRY(cuMemAlloc(&p, MP_BYTES));
  MP_TRY(cuMemsetD8(p, 1, MP_BYTES));
  MP_TRY(cuLaunchHostFunc(n1, slow_start, NULL));
  MP_TRY(cuMemcpyAsync((CUdeviceptr)(uintptr_t)seen, p, 1, n1));
  MP_TRY(cuMemFree(p));
  MP_TRY(cuMemAlloc(&q, MP_BYTES));
  MP_TRY(cuMemsetD8Async(q, 2, MP_BYTES, n2));
  MP_TRY(cuCtxSynchronize());
  if (*seen != 1) {
    printf("the kernel on n1 read %d, not 1: the freed buffer was reused "
           "(new buffer %s the old) and overwritten on n2 under it\n",
           *seen, q == p ? "==" : "!=");
    return 1;
  }
  MP_TRY(cuMemFreeHost(seen));
  MP_TRY(cuMemFree(q));
  return 0;
}

/* refused_destroy: a cuStreamDestroy the driver refuses leaves the stream
 * a stream, and the pool's view of it as it was: the reproducer above on
 * it, after the refusal. The destroy is asked while a context the program
 * made is current, of a stream of the primary context: the fake refuses
 * it (CUDA_ERROR_INVALID_HANDLE, a stream of another context); a driver
 * that destroys it leaves nothing to check (said, not failed). */
static int refused_destroy(void) {
  CUstream n1, n2;
  CUcontext own;
  MP_TRY(cuStreamCreate(&n1, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamCreate(&n2, CU_STREAM_NON_BLOCKING));
#if CUDA_VERSION >= 13000 /* cuCtxCreate is cuCtxCreate_v4 */
  MP_TRY(cuCtxCreate(&own, NULL, 0, 0));
#else
  MP_TRY(cuCtxCreate(&own, 0, 0));
#endif
  CUresult d = cuStreamDestroy(n1);
  MP_TRY(cuCtxDestroy(own));
  MP_TRY(cuCtxSetCurrent(ctx));
  if (d == CUDA_SUCCESS)
    puts("the driver destroyed the stream: nothing to check");
  else if (late_reader(n1, n2) != 0)
    return 1;
  if (d != CUDA_SUCCESS)
    MP_TRY(cuStreamDestroy(n1));
  MP_TRY(cuStreamDestroy(n2));
  MP_TRY(cuCtxSynchronize());
  puts("ok");
  return 0;
}

static int free_probes(void) {
  CUstream s;
  CUdeviceptr p[50];
  CUgraph g = NULL;
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 50; i++)
    MP_TRY(cuMemAlloc(&p[i], 4096));
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  long long before =
      cuFakeGetCallCount ? cuFakeGetCallCount("cuMemAlloc_v2") : 0;
  for (int i = 0; i < 50; i++)
    MP_TRY(cuMemFree(p[i]));
  long long n =
      cuFakeGetCallCount ? cuFakeGetCallCount("cuMemAlloc_v2") - before : 0;
  MP_TRY(cuStreamEndCapture(s, &g));
  MP_TRY(cuGraphDestroy(g));
  MP_TRY(cuStreamDestroy(s));
  if (n != 0) {
    printf("50 frees no mode prohibits made %lld cuMemAlloc calls\n", n);
    return 1;
  }
  puts("ok");
  return 0;
}

int main(int argc, char **argv) {
  CUstream n1, n2;
  MP_TRY(cuInit(0));
  MP_TRY(cuDevicePrimaryCtxRetain(&ctx, 0));
  MP_TRY(cuCtxPushCurrent(ctx));
  if (argc > 1 && strcmp(argv[1], "streams") == 0)
    return many_streams();
  if (argc > 1 && strcmp(argv[1], "per_thread") == 0)
    return per_thread();
  if (argc > 1 && strcmp(argv[1], "unseen_per_thread") == 0)
    return unseen_per_thread(argc > 2 && strcmp(argv[2], "same") == 0);
  if (argc > 1 && strcmp(argv[1], "per_thread_free") == 0)
    return per_thread_free();
  if (argc > 1 && strcmp(argv[1], "reused_handle") == 0)
    return reused_handle();
  if (argc > 1 && strcmp(argv[1], "double_free") == 0)
    return double_free();
  if (argc > 1 && strcmp(argv[1], "freed_range") == 0)
    return freed_range();
  if (argc > 1 && strcmp(argv[1], "own_context") == 0)
    return own_context();
  if (argc > 1 && strcmp(argv[1], "pair_calls") == 0)
    return pair_calls();
  if (argc > 2 && strcmp(argv[1], "other_context") == 0)
    return other_context(atoi(argv[2]));
  if (argc > 3 && strcmp(argv[2], "rt") == 0)
    return runtime_modes(argv[1], argv[3]);
  if (argc > 1 && strcmp(argv[1], "free_modes") == 0)
    return free_modes(false);
  if (argc > 1 && strcmp(argv[1], "alloc_modes") == 0)
    return free_modes(true);
  if (argc > 1 && (strcmp(argv[1], "double_free_modes") == 0 ||
                   strcmp(argv[1], "double_free_host_modes") == 0)) {
    free_twice = true;
    free_host = strcmp(argv[1], "double_free_host_modes") == 0;
    return free_modes(false);
  }
  if (argc > 1 && strcmp(argv[1], "free_probes") == 0)
    return free_probes();
  if (argc > 1 && strcmp(argv[1], "trace_threads") == 0)
    return trace_threads();
  if (argc > 1 && strcmp(argv[1], "refused_free") == 0)
    return refused_free();
  if (argc > 1 && strcmp(argv[1], "host_fn") == 0)
    return host_fn();
  if (argc > 1 && strcmp(argv[1], "calls_in_capture") == 0) {
    const char *how = argc > 2 ? argv[2] : "";
    bool to_graph = strstr(how, "to_graph") == how;
    return calls_in_capture(strstr(how, "per_thread") != NULL, to_graph,
                            strcmp(how, "to_graph_proc") == 0,
                            strcmp(how, "v1") == 0);
  }
  if (argc > 1 && strcmp(argv[1], "refused_destroy") == 0)
    return refused_destroy();
  MP_TRY(cuStreamCreate(&n1, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamCreate(&n2, CU_STREAM_NON_BLOCKING));
  if (late_reader(n1, n2) != 0)
    return 1;
  MP_TRY(cuStreamDestroy(n1));
  MP_TRY(cuStreamDestroy(n2));
  MP_TRY(cuCtxPopCurrent(NULL));
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}
