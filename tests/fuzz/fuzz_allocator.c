/* fuzz_allocator - libFuzzer harness for allocator specs
 * (mp_allocator_create: "pool[:KEY=VAL,...]", "child:bytes=SIZE[,...]",
 * "direct"), on one small host device. A refused spec leaves *out alone
 * and says why; an accepted one gives an allocator named by the spec that
 * allocates (or is out of room), frees, releases and is destroyed, and
 * gives back every byte of device memory it took. */
#include <mempool/mempool.h>

#include "fuzz_require.h"

static mp_device_t *dev;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (dev == NULL)
    FZ_REQUIRE(mp_device_open("host:capacity=256M", &dev) == MP_OK);
  char buf[256];
  const char *spec = fz_cstr(data, size, buf, sizeof buf);
  size_t free0 = 0, total = 0;
  FZ_REQUIRE(mp_device_mem_info(dev, &free0, &total) == MP_OK);
  mp_allocator_t *sentinel = (mp_allocator_t *)&sentinel, *a = sentinel;
  mp_status_t st = mp_allocator_create(dev, spec, &a);
  if (st != MP_OK) {
    fz_refused(st, NULL);
    FZ_REQUIRE(a == sentinel);
    return 0;
  }
  FZ_REQUIRE(a != NULL && a != sentinel);
  FZ_REQUIRE(strcmp(mp_allocator_name(a), spec) == 0);
  void *p = NULL;
  st = mp_allocator_alloc(a, 4096 + (size_t)size * 512, NULL, &p);
  FZ_REQUIRE(st == MP_OK || st == MP_ENOMEM || st == MP_ELIMIT);
  mp_stats_t s;
  FZ_REQUIRE(mp_allocator_get_stats(a, &s) == MP_OK);
  FZ_REQUIRE(st != MP_OK || s.allocated_bytes >= 4096);
  if (st == MP_OK)
    FZ_REQUIRE(mp_allocator_free(a, p) == MP_OK);
  FZ_REQUIRE(mp_allocator_release(a) == MP_OK);
  FZ_REQUIRE(mp_allocator_destroy(a) == MP_OK);
  size_t free1 = 0;
  FZ_REQUIRE(mp_device_mem_info(dev, &free1, &total) == MP_OK);
  FZ_REQUIRE(free1 == free0);
  return 0;
}
