/* The cuda backend keeps every driver object it made, and has not given
 * back, in its maps (src/device/cuda.c), so that close releases what the
 * caller left behind. Host memory for that bookkeeping can run out at the
 * worst moment: once the driver made the object (the undoing release may be
 * refused as well: then the object was alive and forgotten), or once the
 * driver refused to give one back (putting it back in the map may need a
 * bigger table: then it was forgotten while alive, and a second free of it
 * refused as foreign). The room is taken before the driver is called:
 * without host memory nothing is made, and a refused release always keeps
 * its object. Run on the fake driver, whose refusals (cuFakeRefuse) and
 * call hooks (cuFakeBeforeCall) only it has: no GPU twin. */
#include <stdlib.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"
#include "internal.h"

#define G ((size_t)64 << 10)

static mp_device_t *open_cuda(void) {
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  return open_dev("cuda");
}

/* The next host allocation fails and every call of undo is refused while
 * make runs; make must fail for host memory, with the driver's `made`
 * never called, so that nothing is left alive and untracked. */
static void expect_nothing_made(mp_device_t *dev, const char *made,
                                const char *undo, mp_status_t (*make)(void *),
                                void *arg) {
  long long before = fk_calls(made);
  fk_refuse(undo, CUDA_ERROR_UNKNOWN, -1);
  mp__fault_host_after(0);
  mp_status_t st = make(arg);
  mp__fault_host_after(-1);
  fk_refuse(undo, CUDA_SUCCESS, 0);
  cr_assert_eq(st, MP_ENOMEM, "%s: %s: %s", made, mp_status_name(st),
               mp_last_error());
  cr_expect_eq(fk_calls(made) - before, 0,
               "%s was called without room to track what it makes, and %s "
               "refused to undo it: left alive, untracked",
               made, undo);
  (void)dev;
}

struct make {
  mp_device_t *dev;
  void *addr;
  mp_stream_t stream;
  mp_event_t event;
};

static mp_status_t make_alloc(void *a) {
  struct make *m = a;
  return mp_device_alloc(m->dev, G, &m->addr);
}
static mp_status_t make_host(void *a) {
  struct make *m = a;
  return mp_device_host_alloc(m->dev, G, &m->addr);
}
static mp_status_t make_stream(void *a) {
  struct make *m = a;
  return mp_stream_create(m->dev, &m->stream);
}
static mp_status_t make_event(void *a) {
  struct make *m = a;
  return mp_event_create(m->dev, &m->event);
}
static mp_status_t make_reserve(void *a) {
  struct make *m = a;
  return mp__device_vm_reserve(m->dev, 4 * G, &m->addr);
}
static mp_status_t make_map(void *a) {
  struct make *m = a;
  return mp__device_vm_map(m->dev, m->addr, G);
}

Test(cuda_track, an_allocation_without_host_memory_makes_nothing) {
  mp_device_t *dev = open_cuda();
  struct make m = {.dev = dev};
  size_t free0 = free_bytes(dev);
  expect_nothing_made(dev, "cuMemAlloc_v2", "cuMemFree_v2", make_alloc, &m);
  cr_expect_eq(free_bytes(dev), free0, "device memory left behind");
  /* With host memory back, the same call works and is freed. */
  cr_assert_eq(make_alloc(&m), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, m.addr), MP_OK, "%s", mp_last_error());
  cr_expect_eq(free_bytes(dev), free0);
  mp_device_close(dev);
}

Test(cuda_track, page_locked_memory_without_host_memory_makes_nothing) {
  mp_device_t *dev = open_cuda();
  struct make m = {.dev = dev};
  expect_nothing_made(dev, "cuMemHostAlloc", "cuMemFreeHost", make_host, &m);
  cr_assert_eq(make_host(&m), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_host_free(dev, m.addr), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_track, a_stream_or_event_without_host_memory_makes_nothing) {
  mp_device_t *dev = open_cuda();
  struct make m = {.dev = dev};
  expect_nothing_made(dev, "cuStreamCreate", "cuStreamDestroy_v2", make_stream,
                      &m);
  expect_nothing_made(dev, "cuEventCreate", "cuEventDestroy_v2", make_event,
                      &m);
  cr_assert_eq(make_stream(&m), MP_OK, "%s", mp_last_error());
  cr_assert_eq(make_event(&m), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_destroy(dev, m.event), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, m.stream), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_track, a_reservation_or_mapping_without_host_memory_makes_nothing) {
  mp_device_t *dev = open_cuda();
  struct make m = {.dev = dev};
  expect_nothing_made(dev, "cuMemAddressReserve", "cuMemAddressFree",
                      make_reserve, &m);
  cr_assert_eq(make_reserve(&m), MP_OK, "%s", mp_last_error());
  size_t free0 = free_bytes(dev);
  expect_nothing_made(dev, "cuMemCreate", "cuMemUnmap", make_map, &m);
  cr_expect_eq(free_bytes(dev), free0, "device memory left behind");
  cr_assert_eq(make_map(&m), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_unmap(dev, m.addr, G), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_release(dev, m.addr, 4 * G), MP_OK, "%s",
               mp_last_error());
  mp_device_close(dev);
}

/* While cuMemFree runs, another allocation of the device takes the room
 * its entry left, and host memory runs out: the refused free must still
 * keep the allocation, which a second free then gives back. Before, the
 * entry was put back with a fresh insertion that needed a bigger table:
 * the allocation was forgotten while alive (the second free said "foreign
 * or already freed", and close never freed it). */
#define FILL 32 /* half the map's first table: the next entry grows it */

struct racer {
  mp_device_t *dev;
  void *extra;
  mp_status_t st;
};

static void alloc_then_run_out(void *arg) {
  struct racer *r = arg;
  r->st = mp_device_alloc(r->dev, 4096, &r->extra);
  mp__fault_host_after(0);
}

Test(cuda_track, a_refused_free_keeps_its_allocation_without_host_memory) {
  mp_device_t *dev = open_cuda();
  void *p[FILL];
  for (int i = 0; i < FILL; i++)
    cr_assert_eq(mp_device_alloc(dev, 4096, &p[i]), MP_OK, "%s",
                 mp_last_error());
  struct racer r = {.dev = dev};
  fk_before_call("cuMemFree_v2", alloc_then_run_out, &r);
  fk_refuse("cuMemFree_v2", CUDA_ERROR_UNKNOWN, 1);
  mp_status_t st = mp_device_free(dev, p[0]);
  mp__fault_host_after(-1);
  cr_assert_eq(r.st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(st, MP_EDRIVER, "the refused free: %s: %s", mp_status_name(st),
               mp_last_error());
  st = mp_device_free(dev, p[0]);
  cr_expect_eq(st, MP_OK,
               "the allocation whose free was refused was forgotten: %s",
               mp_last_error());
  for (int i = 1; i < FILL; i++)
    cr_assert_eq(mp_device_free(dev, p[i]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, r.extra), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
