/* The virtual memory calls' documented rules, as the fake driver keeps them
 * (source: /usr/local/cuda-13.0/include/cuda.h, the comments of
 * cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease, cuMemMap,
 * cuMemUnmap, cuMemGetInfo and cuPointerGetAttribute). The program calls the
 * driver API itself (this test links the fake libcuda.so.1); its GPU twin
 * gpu_fakecuda_vmm_rules runs it on the real driver. Where cuda.h says a call
 * fails but not with which code, the fake's code is asserted on the fake and
 * only the failure on a GPU, which logs the code it got as a warning
 * (expect_refused). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>

#include "driver_rules.h"
#include "fakecuda_test.h"

static CUcontext ctx;

static void open_ctx(void) {
  fk_primary_open(&ctx);
}

TestSuite(fakecuda_vmm, .init = open_ctx, .fini = fk_primary_close);

static const CUmemAllocationProp prop = {
    .type = CU_MEM_ALLOCATION_TYPE_PINNED,
    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};

static size_t granularity(void) {
  size_t g = 0;
  cr_assert_eq(cuMemGetAllocationGranularity(&g, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CUDA_SUCCESS);
  cr_assert_gt(g, 0);
  return g;
}

static size_t round_up(size_t n, size_t g) {
  return (n + g - 1) / g * g;
}

static size_t free_bytes(void) {
  size_t fr = 0, total = 0;
  cr_assert_eq(cuMemGetInfo(&fr, &total), CUDA_SUCCESS);
  return fr;
}

/* A call cuda.h says fails: on the fake with fake_code, on a GPU with any
 * code, logged so that a GPU run tells the real one (cr_log_info: a
 * Criterion 2.4 run that logged a warning exits 1, failing the test). */
static void expect_refused(CUresult r, CUresult fake_code, const char *what) {
  const char *name = NULL;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = "?";
  if (fk_real()) {
    cr_log_info("real driver: %s answers %s (%d)", what, name, (int)r);
    cr_expect_neq(r, CUDA_SUCCESS, "%s succeeded", what);
  } else {
    cr_expect_eq(r, fake_code, "%s answers %s (%d)", what, name, (int)r);
  }
}

/* Maps handle h (size bytes) at va and lets device 0 read and write it. */
static void map_rw(CUdeviceptr va, size_t size,
                   CUmemGenericAllocationHandle h) {
  cr_assert_eq(cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc rw = {.location = prop.location,
                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  cr_assert_eq(cuMemSetAccess(va, size, &rw, 1), CUDA_SUCCESS);
}

/* Writes a byte pattern to [va, va + 64) and reads it back. */
static void expect_usable(CUdeviceptr va, unsigned char seed) {
  unsigned char in[64], out[64];
  for (size_t i = 0; i < sizeof in; i++)
    in[i] = (unsigned char)(seed + i);
  memset(out, 0, sizeof out);
  cr_assert_eq(cuMemcpyHtoD(va, in, sizeof in), CUDA_SUCCESS);
  cr_assert_eq(cuMemcpyDtoH(out, va, sizeof out), CUDA_SUCCESS);
  cr_expect_arr_eq(in, out, sizeof in, "the mapping lost its memory");
}

/* cuMemCreate "creates a memory allocation on the target device": the
 * memory is used from there, mapped or not, until the handle is released
 * and its last mapping unmapped (cuMemRelease); cuMemGetInfo says so. The
 * fake charged memory only while it was mapped. */
Test(fakecuda_vmm, a_handle_holds_device_memory_until_released_and_unmapped) {
  size_t g = granularity(), size = round_up((size_t)1 << 30, g);
  /* At least this much less is free while the handle holds its memory:
   * all of it on the fake, half on a GPU, whose free figure moves with
   * the other tests' and processes' allocations and frees meanwhile
   * (cuda.h, cuMemGetInfo: "In a multi-tenet situation, free estimate
   * returned is prone to race condition where a new allocation/free done
   * by a different process or a different thread in the same process
   * [...] will result in deviation"); the twin's other cases and the gpu
   * tests beside it move far less than 512 MiB. */
  size_t held = fk_real() ? size / 2 : size;
  size_t before = free_bytes();
  CUmemGenericAllocationHandle h;
  cr_assert_eq(cuMemCreate(&h, size, &prop, 0), CUDA_SUCCESS);
  cr_expect_leq(free_bytes(), before - held, "created, not counted used");
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, size, g, 0, 0), CUDA_SUCCESS);
  map_rw(va, size, h);
  cr_expect_leq(free_bytes(), before - held, "mapped, not counted used");
  cr_assert_eq(cuMemUnmap(va, size), CUDA_SUCCESS);
  cr_expect_leq(free_bytes(), before - held, "unmapped but not released");
  map_rw(va, size, h);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  cr_expect_leq(free_bytes(), before - held, "released but still mapped");
  cr_assert_eq(cuMemUnmap(va, size), CUDA_SUCCESS);
  cr_expect_geq(free_bytes(), before - size / 2, "not given back");
  cr_assert_eq(cuMemAddressFree(va, size), CUDA_SUCCESS);
}

/* So a handle that does not fit fails at cuMemCreate with
 * CUDA_ERROR_OUT_OF_MEMORY (in cuMemCreate's list), before any cuMemMap,
 * and the memory unmapped handles keep is not cuMemAlloc's either. Filling
 * the device is asked of the fake only: on a GPU the twin's other tests,
 * and other processes, share the device. */
Test(fakecuda_vmm, creating_more_than_the_device_holds_fails_at_create) {
  size_t g = granularity(), fr = 0, total = 0;
  cr_assert_eq(cuMemGetInfo(&fr, &total), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h[8];
  cr_expect_eq(cuMemCreate(&h[0], round_up(total + 1, g), &prop, 0),
               CUDA_ERROR_OUT_OF_MEMORY, "more than the device was created");
  if (fk_real())
    return;
  size_t size = round_up(total / 4 + 1, g);
  int made = 0;
  CUresult r = CUDA_SUCCESS;
  while (made < 8 &&
         (r = cuMemCreate(&h[made], size, &prop, 0)) == CUDA_SUCCESS)
    made++;
  cr_expect_eq(r, CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate #%d answered %d",
               made + 1, (int)r);
  cr_expect_eq(made, 3, "%d handles of a quarter of the device", made);
  CUdeviceptr d = 0;
  cr_expect_eq(cuMemAlloc(&d, size), CUDA_ERROR_OUT_OF_MEMORY,
               "cuMemAlloc took memory unmapped handles keep");
  for (int i = 0; i < made; i++)
    cr_assert_eq(cuMemRelease(h[i]), CUDA_SUCCESS);
  cr_assert_eq(cuMemAlloc(&d, size), CUDA_SUCCESS, "released, not given back");
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
}

/* "The generic memory handle can be freed when there are still
 * outstanding mappings made with this handle" (cuMemRelease): the mapping
 * keeps the memory, but the handle is gone ("If handle is not a valid
 * handle the behavior is undefined"): the fake refuses a map or a second
 * release of it, where it mapped it again before. Undefined on a GPU, so
 * not asked there. */
Test(fakecuda_vmm, a_released_handle_is_no_handle_while_its_mapping_lives) {
  size_t g = granularity();
  size_t before = free_bytes();
  CUmemGenericAllocationHandle h;
  cr_assert_eq(cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, 2 * g, g, 0, 0), CUDA_SUCCESS);
  map_rw(va, g, h);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  expect_usable(va, 7);
  if (!fk_real()) {
    cr_expect_eq(cuMemMap(va + g, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE,
                 "a released handle was mapped again");
    cr_expect_eq(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE,
                 "a handle was released twice");
    expect_usable(va, 9);
  }
  cr_assert_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
  if (!fk_real())
    cr_expect_eq(free_bytes(), before, "the last unmap did not free it");
  cr_assert_eq(cuMemAddressFree(va, 2 * g), CUDA_SUCCESS);
}

/* cuMemAddressFree: "The size must match what was given to
 * memAddressReserve and the ptr given must match what was returned"; a
 * reservation that still has a mapping is refused (cuMemUnmap converts a
 * range back to "an address reservation" first) and keeps its mapping. The
 * fake answered CUDA_ERROR_NOT_READY, which cuda.h does not list. */
Test(fakecuda_vmm,
     a_reservation_is_freed_whole_and_only_when_nothing_is_mapped) {
  size_t g = granularity();
  CUmemGenericAllocationHandle h;
  cr_assert_eq(cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, 2 * g, g, 0, 0), CUDA_SUCCESS);
  expect_refused(cuMemAddressFree(va, g), CUDA_ERROR_INVALID_VALUE,
                 "cuMemAddressFree of half a reservation");
  map_rw(va + g, g, h);
  expect_refused(cuMemAddressFree(va, 2 * g), CUDA_ERROR_INVALID_VALUE,
                 "cuMemAddressFree of a reservation with a mapping");
  expect_usable(va + g, 3);
  cr_assert_eq(cuMemUnmap(va + g, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, 2 * g), CUDA_SUCCESS);
}

/* cuMemMap: ptr, size and offset multiples of the granularity, offset
 * "currently must be zero", flags zero, offset + size within the
 * allocation, and only on "VA range reservations that are not currently
 * mapped"; cuMemUnmap "cannot unmap a sub-range of an address range
 * mapped". Each refusal changes nothing: the mapping made stays usable. */
Test(fakecuda_vmm, maps_and_unmaps_keep_the_granularity_and_whole_mappings) {
  size_t g = granularity();
  CUmemGenericAllocationHandle h2, h1;
  cr_assert_eq(cuMemCreate(&h2, 2 * g, &prop, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemCreate(&h1, g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, 4 * g, g, 0, 0), CUDA_SUCCESS);
  expect_refused(cuMemMap(va, g, g, h2, 0), CUDA_ERROR_INVALID_VALUE,
                 "cuMemMap at a non-zero offset");
  expect_refused(cuMemMap(va + g / 2, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE,
                 "cuMemMap at an address off the granularity");
  expect_refused(cuMemMap(va, 2 * g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE,
                 "cuMemMap of more than the allocation");
  expect_refused(cuMemMap(va, g, 0, h1, 1), CUDA_ERROR_INVALID_VALUE,
                 "cuMemMap with flags");
  map_rw(va, 2 * g, h2);
  expect_refused(cuMemMap(va + g, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE,
                 "cuMemMap over a mapping");
  expect_refused(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE,
                 "cuMemUnmap of a mapping's first half");
  expect_refused(cuMemUnmap(va + g, g), CUDA_ERROR_INVALID_VALUE,
                 "cuMemUnmap of a mapping's second half");
  expect_usable(va, 1);
  expect_usable(va + g, 2);
  map_rw(va + 2 * g, g, h1);
  expect_usable(va + 2 * g, 5);
  cr_assert_eq(cuMemUnmap(va + 2 * g, g), CUDA_SUCCESS);
  cr_assert_eq(cuMemUnmap(va, 2 * g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h1), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h2), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, 4 * g), CUDA_SUCCESS);
}

/* cuMemAddressReserve: "the alignment must be a power of two or zero";
 * flags "must be zero". */
Test(fakecuda_vmm, a_reservation_needs_a_power_of_two_alignment_and_no_flags) {
  size_t g = granularity();
  CUdeviceptr va = 0;
  expect_refused(cuMemAddressReserve(&va, g, 3 * g, 0, 0),
                 CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve aligned to 3g");
  expect_refused(cuMemAddressReserve(&va, g, g, 0, 1), CUDA_ERROR_INVALID_VALUE,
                 "cuMemAddressReserve with flags");
  cr_assert_eq(cuMemAddressReserve(&va, g, 0, 0, 0), CUDA_SUCCESS);
  cr_expect_eq(va % g, 0, "not aligned to the granularity");
  cr_assert_eq(cuMemAddressFree(va, g), CUDA_SUCCESS);
}

/* cuPointerGetAttribute's RANGE_START_ADDR and RANGE_SIZE of mapped memory
 * are "not necessarily the address of the mapped region, but the address
 * of the mappable address range ptr references (e.g. from
 * ::cuMemAddressReserve)", and "To retrieve the size of the mapped region,
 * see ::cuMemGetAddressRange". The fake gave the mapping for both. */
Test(fakecuda_vmm, pointer_ranges_of_mapped_memory_are_the_reservation) {
  size_t g = granularity();
  CUmemGenericAllocationHandle h;
  cr_assert_eq(cuMemCreate(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, 4 * g, g, 0, 0), CUDA_SUCCESS);
  map_rw(va + g, 2 * g, h);
  CUdeviceptr p = va + g + g / 2, start = 0, base = 0;
  size_t range = 0, size = 0;
  cr_assert_eq(
      cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p),
      CUDA_SUCCESS);
  cr_assert_eq(
      cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p),
      CUDA_SUCCESS);
  cr_expect_eq(start, va, "the range starts at %#llx, not the reservation's",
               (unsigned long long)start);
  cr_expect_eq(range, 4 * g, "the range is %zu bytes, not the reservation's",
               range);
  cr_assert_eq(cuMemGetAddressRange(&base, &size, p), CUDA_SUCCESS);
  cr_expect_eq(base, va + g, "cuMemGetAddressRange is not the mapping");
  cr_expect_eq(size, 2 * g);
  cr_assert_eq(cuMemUnmap(va + g, 2 * g), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(h), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(va, 4 * g), CUDA_SUCCESS);
}

/* Memory a handle holds stays the device's while it is being mapped:
 * cuMemCreate "creates a memory allocation on the target device", so a
 * cuMemMap of it never runs out of memory, and no other allocation can take
 * that memory meanwhile. Thread A maps and unmaps handle h (size bytes)
 * over and over while thread B asks for a handle of all the device has
 * free beside h and one granule more, which never fits. The fake counted
 * h's memory neither as a handle's nor as a mapping's for a moment inside
 * each cuMemMap and cuMemUnmap: B's handle was made then (and A's next
 * cuMemMap could fail with CUDA_ERROR_OUT_OF_MEMORY). Fake only: a GPU is
 * shared. */
typedef struct {
  CUdeviceptr va;
  size_t size;
  CUmemGenericAllocationHandle h;
  atomic_bool stop;
  atomic_int rounds; /* maps made; -1 - the code of a refused one */
} mapper_t;

static void *map_over_and_over(void *arg) {
  mapper_t *m = arg;
  CUresult r = cuCtxSetCurrent(ctx);
  while (r == CUDA_SUCCESS && !atomic_load(&m->stop)) {
    if ((r = cuMemMap(m->va, m->size, 0, m->h, 0)) == CUDA_SUCCESS) {
      (void)cuMemUnmap(m->va, m->size);
      atomic_fetch_add(&m->rounds, 1);
    }
  }
  if (r != CUDA_SUCCESS)
    atomic_store(&m->rounds, -1 - (int)r);
  return NULL;
}

Test(fakecuda_vmm, a_handle_being_mapped_keeps_its_memory) {
  if (fk_real())
    return;
  size_t g = granularity(), size = 16 * g;
  mapper_t m = {.size = size};
  cr_assert_eq(cuMemCreate(&m.h, size, &prop, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressReserve(&m.va, size, g, 0, 0), CUDA_SUCCESS);
  size_t too_big = round_up(free_bytes() + 1, g);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, map_over_and_over, &m), 0);
  int made = 0;
  /* Until A has mapped h 20000 times (or 10 s), or B got a handle. */
  double until = now_s() + 10;
  int rounds = 0;
  while (made == 0 && (rounds = atomic_load(&m.rounds)) >= 0 &&
         rounds < 20000 && now_s() < until) {
    CUmemGenericAllocationHandle b;
    if (cuMemCreate(&b, too_big, &prop, 0) == CUDA_SUCCESS) {
      made++;
      (void)cuMemRelease(b);
    }
  }
  atomic_store(&m.stop, true);
  cr_assert_eq(pthread_join(t, NULL), 0);
  rounds = atomic_load(&m.rounds);
  cr_expect_eq(made, 0, "a handle made of memory h held (map %d)", rounds);
  cr_expect_geq(rounds, 0, "cuMemMap of h answered %d", -1 - rounds);
  cr_assert_eq(cuMemRelease(m.h), CUDA_SUCCESS);
  cr_assert_eq(cuMemAddressFree(m.va, size), CUDA_SUCCESS);
}

/* A device never hands out more memory than it has: cuMemAlloc and
 * cuMemCreate both take "memory on the target device" (cuda.h, cuMemAlloc:
 * "Allocates bytesize bytes of linear memory on the device"; cuMemCreate:
 * "creates a memory allocation on the target device"), and fail with
 * CUDA_ERROR_OUT_OF_MEMORY where it has none left. In each round four
 * threads ask together for three eighths of a 64 MiB device each, in
 * chunks of an eighth, from cuMemAlloc and cuMemCreate in turn; what
 * succeeded (all of it still held: the round's frees wait for the count)
 * must not sum to more than the device's total. The fake checked a
 * cuMemAlloc's fit and then charged it outside its lock, the host device
 * slow to allocate (latency_us) widening the gap: a cuMemCreate in
 * between took the same memory. Fake only: a GPU is shared, so filling it
 * is not asked there. */
enum { RACE_THREADS = 4, RACE_KEEP = 3, RACE_ROUNDS = 60 };

typedef struct {
  size_t chunk, total;
  atomic_size_t held;  /* bytes held by all threads this round */
  atomic_size_t most;  /* the most held after any round */
  atomic_int failures; /* calls that failed with another code */
  pthread_barrier_t go;
} race_t;

static void *race_allocate(void *arg) {
  race_t *rc = arg;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    atomic_fetch_add(&rc->failures, 1);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    CUdeviceptr d[RACE_KEEP] = {0};
    CUmemGenericAllocationHandle h[RACE_KEEP] = {0};
    bool live[RACE_KEEP] = {false};
    pthread_barrier_wait(&rc->go);
    for (int k = 0; k < RACE_KEEP; k++) {
      bool alloc = (k + round) % 2 == 0;
      CUresult r = alloc ? cuMemAlloc(&d[k], rc->chunk)
                         : cuMemCreate(&h[k], rc->chunk, &prop, 0);
      live[k] = r == CUDA_SUCCESS;
      if (live[k])
        atomic_fetch_add(&rc->held, rc->chunk);
      else if (r != CUDA_ERROR_OUT_OF_MEMORY)
        atomic_fetch_add(&rc->failures, 1);
    }
    pthread_barrier_wait(&rc->go); /* every thread's calls returned */
    size_t now = atomic_load(&rc->held);
    size_t most = atomic_load(&rc->most);
    while (now > most && !atomic_compare_exchange_weak(&rc->most, &most, now))
      ;
    pthread_barrier_wait(&rc->go); /* every thread read the count */
    for (int k = 0; k < RACE_KEEP; k++) {
      if (!live[k])
        continue;
      atomic_fetch_sub(&rc->held, rc->chunk);
      if ((d[k] != 0 ? cuMemFree(d[k]) : cuMemRelease(h[k])) != CUDA_SUCCESS)
        atomic_fetch_add(&rc->failures, 1);
    }
  }
  return NULL;
}

static void open_slow_ctx(void) {
  setenv("FAKECUDA_DEVICE", "capacity=64M,latency_us=1000", 1);
  fk_primary_open(&ctx);
}

TestSuite(fakecuda_vmm_race);

Test(fakecuda_vmm_race, allocations_and_handles_never_hold_more_than_the_device,
     .init = open_slow_ctx, .fini = fk_primary_close) {
  if (fk_real())
    return;
  size_t g = granularity(), fr = 0;
  race_t rc = {0};
  cr_assert_eq(cuMemGetInfo(&fr, &rc.total), CUDA_SUCCESS);
  cr_assert_eq(rc.total, (size_t)64 << 20, "FAKECUDA_DEVICE was not read");
  rc.chunk = round_up(rc.total / 8, g);
  cr_assert_eq(pthread_barrier_init(&rc.go, NULL, RACE_THREADS), 0);
  pthread_t t[RACE_THREADS];
  for (int i = 0; i < RACE_THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, race_allocate, &rc), 0);
  for (int i = 0; i < RACE_THREADS; i++)
    cr_assert_eq(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&rc.go);
  cr_expect_eq(atomic_load(&rc.failures), 0, "a call failed otherwise");
  cr_expect_leq(atomic_load(&rc.most), rc.total,
                "%zu bytes held at once of a device of %zu",
                atomic_load(&rc.most), rc.total);
  cr_expect_eq(free_bytes(), rc.total, "not all given back");
}

/* A handle cuMemRelease released is no handle (cuda.h, cuMemRelease: "If
 * handle is not a valid handle the behavior is undefined"), also once the
 * driver made others since: the fake named a handle by the address of its
 * record, which the next cuMemCreate got back from calloc, so the stale
 * handle named the new allocation (a map of it, or a second release, took
 * the new handle's memory). A GPU's handles are not host addresses that
 * come back. Undefined on a GPU, so not asked there. */
Test(fakecuda_vmm, a_released_handle_stays_refused_after_new_ones_are_made) {
  if (fk_real())
    return;
  size_t g = granularity();
  CUmemGenericAllocationHandle stale, fresh[8];
  cr_assert_eq(cuMemCreate(&stale, g, &prop, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemRelease(stale), CUDA_SUCCESS);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(cuMemCreate(&fresh[i], g, &prop, 0), CUDA_SUCCESS);
    cr_expect_neq(fresh[i], stale, "new handle #%d is the released one", i);
  }
  CUdeviceptr va;
  cr_assert_eq(cuMemAddressReserve(&va, g, g, 0, 0), CUDA_SUCCESS);
  cr_expect_eq(cuMemMap(va, g, 0, stale, 0), CUDA_ERROR_INVALID_VALUE,
               "a released handle was mapped");
  cr_expect_eq(cuMemRelease(stale), CUDA_ERROR_INVALID_VALUE,
               "a released handle was released again");
  int fd = -1;
  cr_expect_eq(cuMemExportToShareableHandle(
                   &fd, stale, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               CUDA_ERROR_INVALID_VALUE, "a released handle was exported");
  /* The new ones are untouched: each maps, and is released once. */
  for (int i = 0; i < 8; i++) {
    map_rw(va, g, fresh[i]);
    expect_usable(va, (unsigned char)i);
    cr_assert_eq(cuMemUnmap(va, g), CUDA_SUCCESS);
    cr_expect_eq(cuMemRelease(fresh[i]), CUDA_SUCCESS, "handle #%d lost", i);
  }
  cr_assert_eq(cuMemAddressFree(va, g), CUDA_SUCCESS);
}
