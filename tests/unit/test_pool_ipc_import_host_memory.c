/* test_pool_ipc_import_host_memory.c - an import's host memory is taken
 * before it maps: its lease is listed then (the process's list of import
 * leases, mp__ipc_leases), so once mapped it needs room in its device's
 * list of imports only. Failed before: the room check after mapping asked
 * for a free slot in the leases list too, which the import had taken
 * already, and with that list full it grew it, so an import refused
 * MP_ENOMEM where it needed no more memory. White-box: the importing host
 * device's ipc_open makes every later host allocation fail once it has
 * mapped. */
#include <criterion/criterion.h>

#include "../support/ipc_white_box.h"
#include "internal.h"

#define MiB ((size_t)1 << 20)
/* The leases list's first size (src/ipc.c, mp__ipc_room), which the last
 * import fills. */
#define N 8

static ipc_white_box_t w;
static bool starve;

static mp_status_t starved_ipc_open(mp_device_t *dev, const mp_ipc_handle_t *h,
                                    void **out) {
  mp_status_t st = w.host_ops->ipc_open(dev, h, out);
  if (starve)
    mp__fault_host_every(true);
  return st;
}

Test(pool_ipc_import_host_memory,
     an_import_mapped_needs_no_more_room_for_its_lease) {
  ipc_white_box_open(&w);
  w.ops.ipc_open = starved_ipc_open;
  void *p[N], *got[N];
  mp_ipc_handle_t h[N];
  for (int i = 0; i < N; i++) {
    cr_assert_eq(mp_pool_alloc(w.pool, MiB, NULL, &p[i]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(w.pool, p[i], &h[i]), MP_OK, "%s",
                 mp_last_error());
  }
  for (int i = 0; i < N; i++) {
    starve = i == N - 1;
    mp_status_t st = mp_ipc_import(w.imp, &h[i], &got[i]);
    mp__fault_host_every(false);
    cr_assert_eq(st, MP_OK, "import %d: %s", i, mp_last_error());
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(mp_ipc_close(w.imp, got[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_free(w.pool, p[i]), MP_OK);
  }
  ipc_white_box_close(&w);
}
