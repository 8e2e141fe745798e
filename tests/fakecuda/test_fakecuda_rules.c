/* CUDA's documented rules, as the fake driver keeps them: programs call the
 * driver API directly (this test links the fake libcuda.so.1). A "kernel" is
 * a host function (cuLaunchHostFunc) that sleeps or waits for a flag; a
 * rule's test fails on a fake that is kinder than a GPU. tests/gpu has the
 * same rules on real hardware. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "driver_rules.h"
#include "fakecuda_test.h"

long long cuFakeGetCallCount(const char *name);
CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *arg);
CUresult cuStreamSynchronize_ptsz(CUstream s);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);

static CUcontext ctx;

static void open_ctx(void) {
  fk_primary_open(&ctx);
}

TestSuite(fakecuda_rules, .init = open_ctx, .fini = fk_primary_close);

/* A kernel that sleeps 150 ms, then raises its flag. */
static void slow_set(void *flag) {
  usleep(150000);
  atomic_store((atomic_int *)flag, 1);
}

/* What a later kernel saw of an earlier one's flag. */
typedef struct {
  atomic_int *flag;
  atomic_int seen;
} probe_t;

static void probe(void *p) {
  probe_t *pr = p;
  atomic_store(&pr->seen, atomic_load(pr->flag) + 1); /* 1: not set, 2: set */
}

/* A kernel that waits (up to 60 s: longer than event_completes waits) for
 * a flag the host raises. */
static void wait_for_flag(void *p) {
  probe_t *pr = p;
  double end = now_s() + 60.0;
  while (atomic_load(pr->flag) == 0 && now_s() < end)
    usleep(1000);
  atomic_store(&pr->seen, atomic_load(pr->flag) + 1);
}

static void set_flag(void *flag) {
  atomic_store((atomic_int *)flag, 1);
}

/* Kernel `first` on stream a, then `second` on stream b; the one that
 * probes (first when first_probes) watches the other's flag. Returns what
 * the probe saw: 2 when the flag was up. */
static int run_pair(CUstream a, CUhostFn first, bool first_probes, CUstream b,
                    CUhostFn second) {
  atomic_int flag = 0;
  probe_t pr = {.flag = &flag};
  cr_assert_eq(cuLaunchHostFunc(a, first, first_probes ? (void *)&pr : &flag),
               CUDA_SUCCESS);
  cr_assert_eq(cuLaunchHostFunc(b, second, first_probes ? (void *)&flag : &pr),
               CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_neq(atomic_load(&pr.seen), 0, "the probe never ran");
  return atomic_load(&pr.seen);
}

/* Stream A's slow kernel, then a probe on stream B: did B wait for A? */
static bool b_waited_for_a(CUstream a, CUstream b) {
  return run_pair(a, slow_set, false, b, probe) == 2;
}

/* cuda.h "Stream synchronization behavior": the legacy default stream
 * waits for blocking streams and they wait for it. */
Test(fakecuda_rules, legacy_stream_and_blocking_streams_wait_for_each_other) {
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  cr_assert(b_waited_for_a(s, NULL), "legacy work overtook a blocking stream");
  cr_assert(b_waited_for_a(NULL, s), "a blocking stream overtook legacy work");
  cr_assert(b_waited_for_a(s, CU_STREAM_LEGACY));
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* "CU_STREAM_NON_BLOCKING: work running in the created stream may run
 * concurrently with work in stream 0 (the NULL stream), and the created
 * stream should perform no implicit synchronization with stream 0": a
 * legacy kernel that waits for a non-blocking stream's kernel must see it. */
/* Whether an event recorded on `other` (on `ptsz`'s entry point) completes
 * within 30 s (1 s was short for a loaded machine: the other stream's
 * worker need only be scheduled); then raises *flag from the host. */
static bool event_completes(CUstream other, bool ptsz, atomic_int *flag) {
  CUevent e;
  cr_assert_eq(cuEventCreate(&e, 0), CUDA_SUCCESS);
  cr_assert_eq(ptsz ? cuEventRecord_ptsz(e, other) : cuEventRecord(e, other),
               CUDA_SUCCESS);
  CUresult q;
  double end = now_s() + 30.0;
  while ((q = cuEventQuery(e)) == CUDA_ERROR_NOT_READY && now_s() < end)
    usleep(1000);
  atomic_store(flag, 1);
  cr_assert_eq(cuEventDestroy(e), CUDA_SUCCESS);
  return q == CUDA_SUCCESS;
}

/* While `held` runs a kernel that waits for a flag, work on `other`
 * completes (it does not wait for `held`). The flag is raised from the
 * host, never by another host function: a real driver runs host functions
 * one at a time (cuda.h, cuLaunchHostFunc: they "may be serialized"; an
 * H200 did, 2026-11-28, and this test's first form, which raised the flag
 * from a host function on the other stream, failed there). */
static bool runs_beside(CUstream held, CUstream other) {
  atomic_int flag = 0;
  probe_t pr = {.flag = &flag};
  cr_assert_eq(cuLaunchHostFunc(held, wait_for_flag, &pr), CUDA_SUCCESS);
  bool done = event_completes(other, false, &flag);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&pr.seen), 2, "the held kernel gave up waiting");
  return done;
}

Test(fakecuda_rules, non_blocking_streams_run_beside_the_legacy_stream) {
  CUstream n;
  cr_assert_eq(cuStreamCreate(&n, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert(runs_beside(NULL, n), "the non-blocking stream waited");
  cr_assert(runs_beside(n, NULL), "the legacy stream waited");
  cr_assert_eq(cuStreamDestroy(n), CUDA_SUCCESS);
}

/* The per-thread default stream (CU_STREAM_PER_THREAD, or NULL for the
 * _ptsz entry points) is a different stream in every thread. */
typedef struct {
  atomic_int *gate;
  bool ptsz;
  bool done; /* its own per-thread stream's work completed meanwhile */
} pt_arg_t;

/* Work on this thread's per-thread stream while the main thread's is held;
 * then raises the gate from the host (see runs_beside). */
static void *raise_on_per_thread_stream(void *p) {
  pt_arg_t *a = p;
  cr_assert_eq(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
  a->done =
      event_completes(a->ptsz ? NULL : CU_STREAM_PER_THREAD, a->ptsz, a->gate);
  (void)cuCtxPopCurrent(NULL);
  return NULL;
}

static void per_thread_streams_are_apart(bool ptsz) {
  atomic_int gate = 0;
  probe_t pr = {.flag = &gate};
  CUresult r = ptsz
                   ? cuLaunchHostFunc_ptsz(NULL, wait_for_flag, &pr)
                   : cuLaunchHostFunc(CU_STREAM_PER_THREAD, wait_for_flag, &pr);
  cr_assert_eq(r, CUDA_SUCCESS);
  pthread_t t;
  pt_arg_t a = {.gate = &gate, .ptsz = ptsz};
  cr_assert_eq(pthread_create(&t, NULL, raise_on_per_thread_stream, &a), 0);
  pthread_join(t, NULL);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert(a.done, "two threads' per-thread streams were one stream");
  cr_assert_eq(atomic_load(&pr.seen), 2);
}

Test(fakecuda_rules, per_thread_stream_is_a_different_stream_in_each_thread) {
  per_thread_streams_are_apart(false);
}

Test(fakecuda_rules, ptsz_entry_points_use_the_threads_own_stream) {
  per_thread_streams_are_apart(true);
}

/* The _ptds entry points (synchronous calls made on the calling thread's
 * per-thread default stream, cuda.h's CUDA_API_PER_THREAD_DEFAULT_STREAM)
 * wait for that stream only: another thread's synchronous copy returns
 * while this thread's per-thread stream is held by a kernel, and the
 * kernel sees what the other thread did after its copy. */
typedef struct {
  atomic_int *gate;
  CUresult copy;
} ptds_arg_t;

static void *copy_ptds_then_raise(void *p) {
  ptds_arg_t *a = p;
  cr_assert_eq(cuCtxPushCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr d;
  cr_assert_eq(cuMemAlloc(&d, 64), CUDA_SUCCESS);
  unsigned char host[64] = {1};
  a->copy = cuMemcpyHtoD_v2_ptds(d, host, sizeof host);
  atomic_store(a->gate, 1);
  cr_assert_eq(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
  (void)cuCtxPopCurrent(NULL);
  return NULL;
}

Test(fakecuda_rules, ptds_entry_points_wait_for_the_threads_own_stream_only) {
  atomic_int gate = 0;
  probe_t pr = {.flag = &gate};
  cr_assert_eq(cuLaunchHostFunc_ptsz(NULL, wait_for_flag, &pr), CUDA_SUCCESS);
  pthread_t t;
  ptds_arg_t a = {.gate = &gate, .copy = CUDA_ERROR_UNKNOWN};
  cr_assert_eq(pthread_create(&t, NULL, copy_ptds_then_raise, &a), 0);
  pthread_join(t, NULL);
  cr_assert_eq(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
  cr_assert_eq(a.copy, CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&pr.seen), 2,
               "the other thread's synchronous copy waited for this "
               "thread's per-thread stream");
}

/* Programming Guide: the per-thread default stream "is not a non-blocking
 * stream and will synchronize with the legacy default stream". */
Test(fakecuda_rules, per_thread_stream_synchronizes_with_the_legacy_stream) {
  cr_assert(b_waited_for_a(NULL, CU_STREAM_PER_THREAD));
  cr_assert(b_waited_for_a(CU_STREAM_PER_THREAD, NULL));
}

/* cuda.h, cuCtxSynchronize: it waits for all work of the context, streams
 * the application made included. cuMemFree of cuMemAlloc memory only "may
 * perform implicit synchronization" (cuda.h), which drivers do in practice
 * and the fake does (fk_free_in_use); the library never relies on it
 * (mp__cuda_free), so a real driver is not held to it (the GPU twin skips
 * that case). */
static void free_or_sync_waits_for_app_stream(bool free_it) {
  if (free_it && fk_real())
    cr_skip_test("cuda.h: cuMemFree \"may perform implicit synchronization\"; "
                 "only the fake promises it");
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr p;
  cr_assert_eq(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  atomic_int flag = 0;
  cr_assert_eq(cuLaunchHostFunc(s, slow_set, &flag), CUDA_SUCCESS);
  cr_assert_eq(free_it ? cuMemFree(p) : cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&flag), 1, "returned before the stream's work");
  if (!free_it)
    cr_assert_eq(cuMemFree(p), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

Test(fakecuda_rules, mem_free_waits_for_the_applications_streams) {
  free_or_sync_waits_for_app_stream(true);
}

Test(fakecuda_rules, ctx_synchronize_waits_for_the_applications_streams) {
  free_or_sync_waits_for_app_stream(false);
}

/* A kernel that waits for its gate (30 s at most, so that a destroy that
 * waits for it comes back), then raises its flag. */
typedef struct {
  atomic_int gate, flag;
} gated_t;

static void gated_set(void *p) {
  gated_t *g = p;
  double end = now_s() + 30.0;
  while (!atomic_load(&g->gate) && now_s() < end)
    usleep(1000);
  atomic_store(&g->flag, 1);
}

/* cuda.h, cuStreamDestroy: returns at once while the stream still has
 * work, which completes; the handle is invalid afterwards. The work is
 * held on a gate the test opens after the destroy: it timed a sleeping
 * kernel instead (the destroy within 0.1 s, the 150 ms kernel not yet
 * done), which a loaded machine can miss with no fault in the driver. */
Test(fakecuda_rules, stream_destroy_returns_at_once_and_kills_the_handle) {
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  static gated_t held;
  atomic_int flag = 0;
  cr_assert_eq(cuLaunchHostFunc(s, gated_set, &held), CUDA_SUCCESS);
  cr_assert_eq(cuLaunchHostFunc(s, set_flag, &flag), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&held.flag), 0,
               "cuStreamDestroy waited for the stream");
  cr_assert_eq(atomic_load(&flag), 0);
  atomic_store(&held.gate, 1);
  /* A real driver leaves the use of a destroyed handle undefined. */
  if (fk_real()) {
    cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
    cr_assert_eq(atomic_load(&flag), 1);
    return;
  }
  setenv("FAKECUDA_DEAD_STREAMS", "refuse", 1); /* answered, not fatal */
  long long bad = cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuLaunchHostFunc(s, set_flag, &flag), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE) - bad, 4);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&flag), 1, "the destroyed stream's work was lost");
}

/* A stream made and destroyed: its handle is dead. On a GPU the tests of
 * what a use of it does stop here, with what they expect (a GPU's answer is
 * undefined). */
static CUstream a_dead_stream(void) {
  if (fk_real())
    abort();
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  return s;
}

/* A destroyed stream's handle is undefined behaviour on a GPU, which may
 * crash (an H200 did in cuEventRecord and cuStreamIsCapturing, 2026-11-28):
 * the fake stops the process there, so a caller that keeps using one fails
 * its test here too. */
Test(fakecuda_rules, a_destroyed_streams_handle_stops_the_process,
     .signal = SIGABRT) {
  CUstream s = a_dead_stream();
  CUevent e;
  cr_assert_eq(cuEventCreate(&e, 0), CUDA_SUCCESS);
  (void)cuEventRecord(e, s);
}

/* However many streams come and go after it (the fake once remembered only
 * the last 64 handles, so an old one was answered instead). */
Test(fakecuda_rules, a_handle_stays_dead_while_many_streams_come_and_go,
     .signal = SIGABRT) {
  CUstream s = a_dead_stream(), t[200];
  for (int i = 0; i < 200; i++)
    cr_assert_eq(cuStreamCreate(&t[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (int i = 0; i < 200; i++)
    cr_assert_eq(cuStreamDestroy(t[i]), CUDA_SUCCESS);
  for (int i = 0; i < 200; i++)
    cr_assert_neq(t[i], s, "a new stream reused the dead handle");
  (void)cuStreamQuery(s);
}

/* Destroying a stream twice is a use of its dead handle like any other. */
Test(fakecuda_rules, destroying_a_stream_twice_stops_the_process,
     .signal = SIGABRT) {
  CUstream s = a_dead_stream();
  (void)cuStreamDestroy(s);
}

Test(fakecuda_rules, default_streams_cannot_be_destroyed) {
  cr_assert_eq(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuStreamDestroy(CU_STREAM_PER_THREAD),
               CUDA_ERROR_INVALID_HANDLE);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, 0x40), CUDA_ERROR_INVALID_VALUE);
}

/* cuda.h, cuLaunchHostFunc: "The host function must not make any CUDA API
 * calls. Attempting to use a CUDA API may result in
 * CUDA_ERROR_NOT_PERMITTED". */
typedef struct {
  CUresult alloc, ctx;
} in_host_t;

static void call_cuda(void *p) {
  in_host_t *r = p;
  CUdeviceptr d;
  CUcontext c;
  r->alloc = cuMemAlloc(&d, 64);
  r->ctx = cuCtxGetCurrent(&c);
}

Test(fakecuda_rules, cuda_calls_from_a_host_function_are_refused) {
  if (fk_real())
    cr_skip_test("a real driver only \"may\" refuse (or hang)");
  in_host_t r = {CUDA_SUCCESS, CUDA_SUCCESS};
  long long before = cuFakeGetErrorCount(CUDA_ERROR_NOT_PERMITTED);
  cr_assert_eq(cuLaunchHostFunc(NULL, call_cuda, &r), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(r.alloc, CUDA_ERROR_NOT_PERMITTED);
  cr_assert_eq(r.ctx, CUDA_ERROR_NOT_PERMITTED);
  cr_assert_eq(cuFakeGetErrorCount(CUDA_ERROR_NOT_PERMITTED) - before, 2);
  /* The stream's thread is an ordinary thread again afterwards. */
  CUdeviceptr d;
  cr_assert_eq(cuMemAlloc(&d, 64), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
}

/* One granule of device memory mapped at a fresh reservation, readable and
 * writable; *va and *g say where and how much. */
static CUmemGenericAllocationHandle map_granule(CUdeviceptr *va, size_t *g) {
  CUmemAllocationProp prop = {
      .type = CU_MEM_ALLOCATION_TYPE_PINNED,
      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  cr_assert_eq(
      cuMemGetAllocationGranularity(g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      CUDA_SUCCESS);
  CUmemGenericAllocationHandle h;
  cr_assert_eq(cuMemCreate(&h, *g, &prop, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressReserve(va, *g, *g, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemMap(*va, *g, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc rw = {.location = prop.location,
                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  cr_assert_eq(cuMemSetAccess(*va, *g, &rw, 1), CUDA_SUCCESS);
  return h;
}

/* A memset of the granule at va queued on a new stream behind a kernel
 * that waits for pr's flag. */
static CUstream gated_memset(CUdeviceptr va, size_t g, probe_t *pr) {
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuLaunchHostFunc(s, wait_for_flag, pr), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8Async(va, 1, g, s), CUDA_SUCCESS);
  return s;
}

/* A memset of [p, p + n) queued behind a kernel whose gate stays shut: the
 * tests that use it stop the process while it waits. */
static void memset_behind_a_shut_gate(CUdeviceptr p, size_t n) {
  static atomic_int gate;
  static probe_t pr = {.flag = &gate};
  (void)gated_memset(p, n, &pr);
}

/* cuMemUnmap does not wait for work queued on the memory (cuda.h promises
 * no such wait; a GPU faults, or writes into whatever is mapped there
 * next): the fake refuses an unmap of memory a queued memset still writes.
 * Once the stream is done, the unmap goes through. */
Test(fakecuda_rules, unmapping_memory_queued_work_still_uses_is_refused) {
  if (fk_real())
    return; /* undefined behaviour on a GPU */
  setenv("FAKECUDA_UNMAP_IN_USE", "refuse", 1); /* answered, not fatal */
  CUdeviceptr va;
  size_t g;
  CUmemGenericAllocationHandle h = map_granule(&va, &g);
  atomic_int gate = 0;
  probe_t pr = {.flag = &gate};
  CUstream s = gated_memset(va, g, &pr);
  cr_expect_eq(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE,
               "unmapped under a queued memset");
  atomic_store(&gate, 1);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  cr_expect_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  unsetenv("FAKECUDA_UNMAP_IN_USE");
}

/* Without FAKECUDA_UNMAP_IN_USE=refuse it stops the process, so a caller
 * that unmaps too early fails its test. */
Test(fakecuda_rules, unmapping_memory_queued_work_still_uses_stops_the_process,
     .signal = SIGABRT) {
  if (fk_real())
    abort();
  CUdeviceptr va;
  size_t g;
  (void)map_granule(&va, &g);
  memset_behind_a_shut_gate(va, g);
  (void)cuMemUnmap(va, g);
}

/* cuda.h, cuMemFree: "This API will not perform any implicit
 * synchronization when the pointer was allocated with ::cuMemAllocAsync",
 * and "Callers must ensure that all accesses to these pointer have
 * completed": a free of such memory that a queued memset still writes
 * stops the process. (cuMemAlloc memory, for which it only "may", is
 * waited for: mem_free_waits_for_the_applications_streams.) Undefined on
 * a GPU. */
Test(fakecuda_rules, freeing_stream_ordered_memory_in_use_stops_the_process,
     .signal = SIGABRT) {
  if (fk_real())
    abort();
  CUdeviceptr a;
  cr_assert_eq(cuMemAllocAsync(&a, 1 << 20, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
  memset_behind_a_shut_gate(a, 1 << 20);
  (void)cuMemFree(a);
}

/* With FAKECUDA_FREE_IN_USE=refuse, a free of memory a queued memset still
 * writes is refused instead, with nothing freed, for cuMemAlloc memory too
 * (the variable asks the fake to check a caller that never relies on the
 * "may" of cuMemFree's implicit synchronization); once the stream is done
 * it goes through. */
Test(fakecuda_rules, freeing_memory_queued_work_still_uses_is_refused) {
  if (fk_real())
    return;
  setenv("FAKECUDA_FREE_IN_USE", "refuse", 1);
  CUdeviceptr d, a;
  cr_assert_eq(cuMemAlloc(&d, 1 << 20), CUDA_SUCCESS);
  cr_assert_eq(cuMemAllocAsync(&a, 1 << 20, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
  const CUdeviceptr mem[] = {d, a};
  for (int i = 0; i < 2; i++) {
    atomic_int gate = 0;
    probe_t pr = {.flag = &gate};
    CUstream s = gated_memset(mem[i], 1 << 20, &pr);
    cr_expect_eq(cuMemFree(mem[i]), CUDA_ERROR_INVALID_VALUE,
                 "%s memory freed under a queued memset",
                 i ? "stream-ordered" : "cuMemAlloc");
    atomic_store(&gate, 1);
    cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
    cr_expect_eq(cuMemFree(mem[i]), CUDA_SUCCESS, "not freed once done");
    cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  }
  unsetenv("FAKECUDA_FREE_IN_USE");
}

/* A mapping is accessible only as cuMemSetAccess says: "all mappings start
 * with no accessibility setup" (cuda.h, cuMemUnmap; cuMemMap: "calling
 * ::cuMemMap does not make the address accessible"), PROT_READ allows
 * reads only, PROT_READWRITE writes too, PROT_NONE takes access away
 * (cuda.h, CUmemAccess_flags). A GPU faults on a use without access; the
 * fake refuses the copy or memset with CUDA_ERROR_ILLEGAL_ADDRESS. On a
 * real driver only the legal uses are made. */
Test(fakecuda_rules, a_mapping_is_accessible_only_as_cu_mem_set_access_says) {
  CUmemAllocationProp prop = {
      .type = CU_MEM_ALLOCATION_TYPE_PINNED,
      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  size_t g = 0;
  cr_assert_eq(cuMemGetAllocationGranularity(&g, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CUDA_SUCCESS);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va, buf;
  cr_assert_eq(cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressReserve(&va, g, g, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemMap(va, g, 0, h, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&buf, g), CUDA_SUCCESS);
  long long before =
      fk_real() ? 0 : cuFakeGetErrorCount(CUDA_ERROR_ILLEGAL_ADDRESS);
  if (!fk_real())
    cr_expect_eq(cuMemsetD8Async(va, 1, g, NULL), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a fresh mapping has no access");
  CUmemAccessDesc d = {.location = prop.location, .flags = 2};
  if (!fk_real()) /* not a CUmemAccess_flags value: undefined on a GPU */
    cr_expect_eq(cuMemSetAccess(va, g, &d, 1), CUDA_ERROR_INVALID_VALUE);
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  /* "a fully mapped address range containing all allocations" (cuda.h):
   * not a part of the mapping, at either end. */
  if (!fk_real()) {
    cr_expect_eq(cuMemSetAccess(va, g / 2, &d, 1), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemSetAccess(va + g / 2, g / 2, &d, 1),
                 CUDA_ERROR_INVALID_VALUE);
  }
  cr_assert_eq(cuMemSetAccess(va, g, &d, 1), CUDA_SUCCESS);
  cr_expect_eq(cuMemcpyAsync(buf, va, g, NULL), CUDA_SUCCESS, "read-only");
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  if (!fk_real()) {
    cr_expect_eq(cuMemsetD8Async(va, 1, g, NULL), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a memset of read-only memory");
    cr_expect_eq(cuMemcpyAsync(va, buf, g, NULL), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a copy into read-only memory");
  }
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cr_assert_eq(cuMemSetAccess(va, g, &d, 1), CUDA_SUCCESS);
  cr_expect_eq(cuMemsetD8Async(va, 1, g, NULL), CUDA_SUCCESS);
  cr_expect_eq(cuMemcpyAsync(va, buf, g, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  cr_expect_eq(cuMemSetAccess(va, g, &d, 1), CUDA_SUCCESS);
  if (!fk_real())
    cr_expect_eq(cuMemcpyAsync(buf, va, g, NULL), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "PROT_NONE takes access away");
  /* Mapped again, the range starts without access again. */
  cr_assert_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemMap(va, g, 0, h, 0), CUDA_SUCCESS);
  if (!fk_real()) {
    cr_expect_eq(cuMemsetD8Async(va, 1, g, NULL), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a new mapping has no access");
    cr_expect_eq(cuFakeGetErrorCount(CUDA_ERROR_ILLEGAL_ADDRESS) - before, 5);
  }
  cr_assert_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(buf), CUDA_SUCCESS);
}

/* cuIpcGetMemHandle takes "a pointer to the base of an existing device
 * memory allocation created with ::cuMemAlloc" (cuda.h): a cuMemCreate
 * mapping and cuMemAllocAsync's stream-ordered memory have no such handle
 * (their IPC is cuMemExportToShareableHandle and the memory pools' export),
 * and on the fake neither has a pointer inside an allocation, unless
 * FAKECUDA_IPC_INTERIOR=1 asks for what a real driver is seen to do: a
 * handle of the whole allocation. */
Test(fakecuda_rules, ipc_handles_are_of_the_start_of_cuMemAlloc_memory_only) {
  CUipcMemHandle h;
  CUdeviceptr d, a;
  cr_assert_eq(cuMemAlloc(&d, 1 << 20), CUDA_SUCCESS);
  cr_expect_eq(cuIpcGetMemHandle(&h, d), CUDA_SUCCESS);
  if (!fk_real()) {
    cr_expect_eq(cuIpcGetMemHandle(&h, d + 4096), CUDA_ERROR_INVALID_VALUE,
                 "a pointer inside the allocation");
    setenv("FAKECUDA_IPC_INTERIOR", "1", 1);
    cr_expect_eq(cuIpcGetMemHandle(&h, d + 4096), CUDA_SUCCESS);
    unsetenv("FAKECUDA_IPC_INTERIOR");
  }
  cr_assert_eq(cuMemAllocAsync(&a, 1 << 20, NULL), CUDA_SUCCESS);
  cr_expect_neq(cuIpcGetMemHandle(&h, a), CUDA_SUCCESS,
                "stream-ordered memory");
  cr_assert_eq(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
  CUdeviceptr va;
  size_t g;
  CUmemGenericAllocationHandle m = map_granule(&va, &g);
  cr_expect_neq(cuIpcGetMemHandle(&h, va), CUDA_SUCCESS, "a cuMemMap mapping");
  cr_assert_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(m), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, g), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
}

/* cuda.h, cuEventCreate: the flags are CU_EVENT_DEFAULT, _BLOCKING_SYNC,
 * _DISABLE_TIMING and _INTERPROCESS, which "must be specified along with
 * CU_EVENT_DISABLE_TIMING"; anything else is refused and makes no event. */
Test(fakecuda_rules, event_create_takes_the_documented_flags_only) {
  CUevent e = NULL;
  cr_expect_eq(cuEventCreate(&e, CU_EVENT_INTERPROCESS),
               CUDA_ERROR_INVALID_VALUE);
  cr_expect_eq(cuEventCreate(&e, 0x40), CUDA_ERROR_INVALID_VALUE);
  cr_expect_null(e, "a refused create wrote an event");
  const unsigned ok[] = {CU_EVENT_DEFAULT, CU_EVENT_BLOCKING_SYNC,
                         CU_EVENT_DISABLE_TIMING,
                         CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    cr_assert_eq(cuEventCreate(&e, ok[i]), CUDA_SUCCESS, "flags %#x", ok[i]);
    cr_expect_eq(cuEventDestroy(e), CUDA_SUCCESS);
  }
}

/* A copy or memset that runs past the end of a cuMemAlloc allocation
 * touches memory the caller does not own: on the fake (host memory behind
 * it, which would take it silently) it is refused and changes nothing. A
 * GPU may fault instead, so this is checked on the fake only. */
Test(fakecuda_rules, copies_past_an_allocations_end_are_refused) {
  if (fk_real())
    cr_skip_test("a GPU's answer to an overrun is not documented");
  const size_t n = 1 << 20, page = 4096;
  CUdeviceptr d, e;
  cr_assert_eq(cuMemAlloc(&d, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&e, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(d, 0x11, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(e, 0x22, n), CUDA_SUCCESS);
  cr_expect_eq(cuMemsetD8Async(d + n - page, 0, 2 * page, NULL),
               CUDA_ERROR_INVALID_VALUE);
  cr_expect_eq(cuMemcpyDtoD(e, d + page, n), CUDA_ERROR_INVALID_VALUE,
               "source past its end");
  cr_expect_eq(cuMemcpyAsync(d + page, e, n, NULL), CUDA_ERROR_INVALID_VALUE,
               "destination past its end");
  /* Up to the last byte is fine. */
  cr_expect_eq(cuMemsetD8Async(d + n - page, 0x33, page, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  unsigned char b[2];
  cr_assert_eq(cuMemcpyDtoH(&b[0], d + page, 1), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpyDtoH(&b[1], d + n - 1, 1), CUDA_SUCCESS);
  cr_expect_eq(b[0], 0x11, "a refused copy ran");
  cr_expect_eq(b[1], 0x33);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(e), CUDA_SUCCESS);
}

/* cuda.h, cuMemHostRegister: it "Page-locks the memory range ... and maps
 * it for the device(s)"; "For devices that have a non-zero value for the
 * device attribute CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
 * the memory can also be accessed from the device using the host pointer
 * p": a memset and a copy take it as device memory, inside the range only.
 * cuMemHostUnregister "Unmaps the memory range": a memset of it is then
 * refused again (cuMemsetD8: dstDevice, a device pointer, else
 * CUDA_ERROR_INVALID_VALUE; not where the device reads pageable memory
 * itself, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS), a copy takes it as
 * pageable host memory, and once unmapped by the program (the fake only:
 * what a GPU does with an address nothing is mapped at is its own) a copy
 * of it is refused. Before, the fake remembered the range but its device
 * did not know it: a memset of registered memory was refused. */
Test(fakecuda_rules,
     registered_host_memory_is_device_memory_until_unregistered) {
  int by_host_ptr = 0, pageable = 0;
  cr_assert_eq(cuDeviceGetAttribute(
                   &by_host_ptr,
                   CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                   0),
               CUDA_SUCCESS);
  cr_assert_eq(cuDeviceGetAttribute(
                   &pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0),
               CUDA_SUCCESS);
  if (!by_host_ptr)
    cr_skip_test("the device does not take registered memory's host pointer");
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 3 * page;
  /* One page more, never registered: a memset running into it is refused. */
  unsigned char *reg = mmap(NULL, n + page, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(reg, MAP_FAILED);
  CUdeviceptr r = (CUdeviceptr)(uintptr_t)reg, d = 0;
  cr_assert_eq(cuMemHostRegister(reg, n, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&d, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(r, 0x3c, n), CUDA_SUCCESS);
  cr_assert(reg[0] == 0x3c && reg[n - 1] == 0x3c);
  cr_assert_eq(cuMemsetD8Async(r + page, 0x5a, page, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
  cr_assert(reg[page - 1] == 0x3c && reg[page] == 0x5a &&
            reg[2 * page - 1] == 0x5a && reg[2 * page] == 0x3c);
  cr_assert_eq(cuMemcpyDtoD(d, r, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(r, 0, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpy(r, d, n), CUDA_SUCCESS);
  cr_assert(reg[0] == 0x3c && reg[page] == 0x5a);
  /* The fake only, as for cuMemAlloc memory
   * (copies_past_an_allocations_end_are_refused): cuda.h names a bad
   * start pointer for cuMemsetD8, not a range that runs past a
   * registration, and a GPU that takes the start may write the page after
   * it, which nothing mapped for the device: a fault, whose sticky error
   * (CUDA_ERROR_ILLEGAL_ADDRESS) would fail every later call here. */
  if (!fk_real())
    cr_assert_eq(cuMemsetD8(r + n - 8, 1, 16), CUDA_ERROR_INVALID_VALUE,
                 "a memset past the registered range's end");
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  if (!pageable)
    cr_assert_eq(cuMemsetD8(r, 0, n), CUDA_ERROR_INVALID_VALUE,
                 "a memset of memory no longer registered");
  cr_assert_eq(cuMemcpyHtoD(d, reg, n), CUDA_SUCCESS);
  cr_assert_eq(munmap(reg, n + page), 0);
  if (!fk_real())
    cr_assert_eq(cuMemcpyHtoD(d, reg, n), CUDA_ERROR_INVALID_VALUE,
                 "a copy of unmapped memory");
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
}

/* cuda.h, cuMemHostRegister: "CU_MEMHOSTREGISTER_DEVICEMAP: Maps the
 * allocation into the CUDA address space. The device pointer to the memory
 * may be obtained by calling ::cuMemHostGetDevicePointer()", which "will
 * match the original pointer p" where every device has
 * CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM. Its Flags
 * "must be set to 0"; it "will fail if the ::CU_MEMHOSTALLOC_DEVICEMAP flag
 * was not specified" (the fake reads that of a registration made without
 * DEVICEMAP too; a GPU's answer is not asked), and memory no longer
 * registered has no device pointer. Before, the fake refused every
 * registered range: it looked only at cuMemHostAlloc's. */
Test(fakecuda_rules, registered_mapped_memory_has_a_device_pointer) {
  int by_host_ptr = 0;
  cr_assert_eq(cuDeviceGetAttribute(
                   &by_host_ptr,
                   CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                   0),
               CUDA_SUCCESS);
  size_t n = 2 * (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *reg =
      mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(reg, MAP_FAILED);
  CUdeviceptr d = 0;
  cr_assert_eq(cuMemHostRegister(reg, n, CU_MEMHOSTREGISTER_DEVICEMAP),
               CUDA_SUCCESS);
  cr_assert_eq(cuMemHostGetDevicePointer(&d, reg, 0), CUDA_SUCCESS,
               "registered DEVICEMAP memory has a device pointer");
  cr_assert_neq(d, 0);
  if (by_host_ptr)
    cr_assert_eq(d, (CUdeviceptr)(uintptr_t)reg, "not the host pointer");
  cr_assert_eq(cuMemsetD8(d, 0x6b, n), CUDA_SUCCESS);
  cr_assert(reg[0] == 0x6b && reg[n - 1] == 0x6b);
  CUdeviceptr inner = 0;
  cr_assert_eq(cuMemHostGetDevicePointer(&inner, reg + 100, 0), CUDA_SUCCESS);
  cr_assert_eq(inner, d + 100);
  cr_assert_eq(cuMemHostGetDevicePointer(&inner, reg, 1),
               CUDA_ERROR_INVALID_VALUE, "Flags must be 0");
  cr_assert_eq(cuMemHostGetDevicePointer(NULL, reg, 0),
               CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  cr_assert_eq(cuMemHostGetDevicePointer(&inner, reg, 0),
               CUDA_ERROR_INVALID_VALUE, "memory no longer registered");
  cr_assert_eq(cuMemHostRegister(reg, n, 0), CUDA_SUCCESS);
  if (!fk_real())
    cr_assert_eq(cuMemHostGetDevicePointer(&inner, reg, 0),
                 CUDA_ERROR_INVALID_VALUE, "registered without DEVICEMAP");
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  cr_assert_eq(munmap(reg, n), 0);
}

/* cuda.h, cuMemHostRegister: "CU_MEMHOSTREGISTER_READ_ONLY: The pointer is
 * treated as pointing to memory that is considered read-only by the
 * device"; "Support for the use of this flag can be queried from the device
 * attribute CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED. Using
 * this flag with a current context associated with a device that does not
 * have this attribute set will cause cuMemHostRegister to error with
 * CUDA_ERROR_NOT_SUPPORTED". The fake's devices have it (before, they
 * answered 0 and took the flag all the same). A device write to such memory
 * is undefined (a GPU faults); the fake refuses a memset of it and a copy
 * into it with CUDA_ERROR_ILLEGAL_ADDRESS, counted, writing nothing, as
 * for a mapping the device may only read (fk_access_ok). Reads are taken,
 * and the host's own writes. Before, the device wrote it. */
Test(fakecuda_rules, read_only_registered_memory_is_not_written_by_the_device) {
  int ro = 0;
  cr_assert_eq(
      cuDeviceGetAttribute(
          &ro, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0),
      CUDA_SUCCESS);
  if (!fk_real())
    cr_assert_eq(ro, 1, "the fake's devices take READ_ONLY registrations");
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 2 * page;
  /* One page more, never registered: written freely. */
  unsigned char *reg = mmap(NULL, n + page, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(reg, MAP_FAILED);
  memset(reg, 0x11, n + page);
  const unsigned flags =
      CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_DEVICEMAP;
  if (!ro) {
    cr_assert_eq(cuMemHostRegister(reg, n, flags), CUDA_ERROR_NOT_SUPPORTED);
    cr_assert_eq(munmap(reg, n + page), 0);
    cr_skip_test("the device takes no READ_ONLY registration");
  }
  CUdeviceptr r = 0, d = 0;
  cr_assert_eq(cuMemHostRegister(reg, n, flags), CUDA_SUCCESS);
  cr_assert_eq(cuMemHostGetDevicePointer(&r, reg, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&d, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpyDtoD(d, r, n), CUDA_SUCCESS, "a device read");
  cr_assert_eq(cuMemcpyHtoD(d, reg, n), CUDA_SUCCESS, "a read of the host's");
  reg[0] = 0x22; /* the host still writes it */
  if (!fk_real()) {
    long long before = cuFakeGetErrorCount(CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_expect_eq(cuMemsetD8(r, 0, n), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a memset of read-only memory");
    cr_expect_eq(cuMemsetD8Async(r + n - 1, 0, 1, NULL),
                 CUDA_ERROR_ILLEGAL_ADDRESS, "its last byte");
    cr_expect_eq(cuMemcpyDtoD(r + page, d, page), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a copy into read-only memory");
    cr_expect_eq(cuMemcpyDtoH(reg, d, 1), CUDA_ERROR_ILLEGAL_ADDRESS,
                 "a copy to its host pointer");
    cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
    cr_expect_eq(cuFakeGetErrorCount(CUDA_ERROR_ILLEGAL_ADDRESS) - before, 4);
    cr_assert(reg[0] == 0x22 && reg[1] == 0x11 && reg[n - 1] == 0x11,
              "the device wrote read-only memory");
  }
  cr_assert_eq(cuMemsetD8(d, 0x33, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpyDtoH(reg + n, d, page), CUDA_SUCCESS,
               "a copy to the page after it");
  cr_assert_eq(reg[n], 0x33);
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  /* Registered again without the flag, the device writes it. */
  cr_assert_eq(cuMemHostRegister(reg, n, CU_MEMHOSTREGISTER_DEVICEMAP),
               CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(r, 0x44, n), CUDA_SUCCESS);
  cr_assert(reg[0] == 0x44 && reg[n - 1] == 0x44);
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
  cr_assert_eq(munmap(reg, n + page), 0);
}

/* cuda.h, CU_MEMHOSTREGISTER_READ_ONLY (and cuMemHostRegister's list of
 * flags): "On platforms without
 * CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, this
 * flag is required in order to register memory mapped to the CPU as
 * read-only". Registering a range with a page the CPU may only read, without
 * it, fails (cuda.h names no code for it: the fake answers
 * CUDA_ERROR_INVALID_VALUE, the code cuMemHostRegister lists for a bad
 * range) and registers nothing; with it the range is registered, read by the
 * device. Before, the fake took the registration without the flag. */
Test(fakecuda_rules, read_only_mapped_memory_needs_the_read_only_flag) {
  int host_tables = 0, ro = 0;
  cr_assert_eq(
      cuDeviceGetAttribute(
          &host_tables,
          CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0),
      CUDA_SUCCESS);
  cr_assert_eq(
      cuDeviceGetAttribute(
          &ro, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0),
      CUDA_SUCCESS);
  if (host_tables || !ro)
    cr_skip_test("the flag is not required, or not supported");
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 2 * page;
  unsigned char *reg =
      mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(reg, MAP_FAILED);
  memset(reg, 0x5e, n);
  /* The second page read-only: the range is partly so. */
  cr_assert_eq(mprotect(reg + page, page, PROT_READ), 0);
  CUresult r = cuMemHostRegister(reg, n, CU_MEMHOSTREGISTER_DEVICEMAP);
  cr_assert_neq(r, CUDA_SUCCESS,
                "read-only memory registered without the "
                "flag");
  if (!fk_real())
    cr_assert_eq(r, CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(cuMemHostRegister(reg + page, page, 0), r,
               "a range read-only throughout");
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
               "a failed registration registered the range");
  /* The writable page alone needs no flag: nothing was left registered. */
  cr_assert_eq(cuMemHostRegister(reg, page, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  CUdeviceptr r0 = 0, d = 0;
  cr_assert_eq(cuMemHostRegister(reg, n,
                                 CU_MEMHOSTREGISTER_READ_ONLY |
                                     CU_MEMHOSTREGISTER_DEVICEMAP),
               CUDA_SUCCESS, "with the flag");
  cr_assert_eq(cuMemHostGetDevicePointer(&r0, reg, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&d, n), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpyDtoD(d, r0, n), CUDA_SUCCESS, "the device reads it");
  unsigned char b = 0;
  cr_assert_eq(cuMemcpyDtoH(&b, d + n - 1, 1), CUDA_SUCCESS);
  cr_assert_eq(b, 0x5e);
  cr_assert_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
  cr_assert_eq(munmap(reg, n), 0);
}
