/* test_pool_ipc_import_entry_reserved.c - an import holds its entry in
 * the device's import list from before it maps: whatever the device maps
 * for it is tracked, also where other imports filled the list meanwhile
 * and host memory then runs out.
 *
 * An import refused after it mapped (here: host memory gone) unmaps what
 * it mapped; a device that refuses that unmap leaves the mapping, which
 * stays in the device's list for mp_device_close to unmap. Before, the
 * import made sure of room in the list before it mapped, but another
 * import could take that room while it mapped; with the list full and no
 * host memory to grow it, the import was refused after mapping, and the
 * mapping the device then refused to unmap went into no list: nothing
 * ever unmapped it. Now the entry is taken before the mapping (an import
 * without room is refused with nothing mapped), so the mapping always has
 * one. The other import is made here from inside the device's ipc_open,
 * a deterministic stand-in for another thread's.
 *
 * White-box: the importing host device's ipc_open and ipc_close are
 * wrapped to count the mappings made and taken back; host allocations
 * fail on demand (mp__fault_host_every). */
#include <criterion/criterion.h>

#include "../support/ipc_white_box.h"

#define MiB ((size_t)1 << 20)
/* The list's first size (ipc.c): FILL imports leave room for one. */
#define FILL 7

static ipc_white_box_t w;
static unsigned opened, unmapped_n;
/* Set: the next ipc_open, once it mapped, imports nested_h on the same
 * device (taking the last room in its list), then makes host memory run
 * out and the device refuse to unmap. */
static bool nest;
static mp_ipc_handle_t nested_h;
static void *nested_q;
static mp_status_t nested_st = MP_EINVAL;

static mp_status_t counting_open(mp_device_t *dev, const mp_ipc_handle_t *h,
                                 void **base) {
  mp_status_t st = w.host_ops->ipc_open(dev, h, base);
  if (st == MP_OK)
    opened++;
  if (st == MP_OK && nest) {
    nest = false;
    nested_st = mp_ipc_import(dev, &nested_h, &nested_q);
    mp__fault_host_every(true);
    ipc_wb_refuse = true;
  }
  return st;
}

static mp_status_t counting_close(mp_device_t *dev, void *base, size_t bytes,
                                  unsigned kind, bool *unmapped) {
  mp_status_t st = ipc_white_box_flaky_close(dev, base, bytes, kind, unmapped);
  if (*unmapped)
    unmapped_n++;
  return st;
}

static void setup(void) {
  ipc_white_box_open(&w);
  ipc_wb_host_ops = w.host_ops;
  w.ops.ipc_open = counting_open;
  w.ops.ipc_close = counting_close;
}

TestSuite(pool_ipc_import_entry_reserved, .init = setup);

/* n blocks of w.pool, exported into h. */
static void export_blocks(void **p, mp_ipc_handle_t *h, int n) {
  for (int i = 0; i < n; i++) {
    cr_assert_eq(mp_pool_alloc(w.pool, MiB, NULL, &p[i]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(w.pool, p[i], &h[i]), MP_OK, "%s",
                 mp_last_error());
  }
}

/* Closes imp (its imports with it), frees the n blocks, closes the rest. */
static void close_all(void **p, int n) {
  mp_device_close(w.imp); /* through counting_close */
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(w.pool, p[i]), MP_OK);
  size_t held = 99;
  cr_expect_eq(mp_pool_ipc_poll(w.pool, &held), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held, 0, "a lease outlived the importing device");
  check(w.pool);
  cr_assert_eq(mp_pool_destroy(w.pool), MP_OK, "%s", mp_last_error());
  mp_device_close(w.exp);
}

Test(pool_ipc_import_entry_reserved,
     a_mapping_made_while_another_import_filled_the_list_is_tracked) {
  void *p[FILL + 2], *q[FILL], *got = NULL;
  mp_ipc_handle_t h[FILL + 2];
  export_blocks(p, h, FILL + 2);
  for (int i = 0; i < FILL; i++)
    cr_assert_eq(mp_ipc_import(w.imp, &h[i], &q[i]), MP_OK, "%s",
                 mp_last_error());
  nested_h = h[FILL + 1];
  nest = true;
  mp_status_t st = mp_ipc_import(w.imp, &h[FILL], &got);
  mp__fault_host_every(false);
  ipc_wb_refuse = false;
  cr_assert(!nest, "the device's ipc_open was not called");
  /* The nested import ran while the first one mapped. */
  cr_expect_eq(nested_st, MP_OK, "nested import: %d", (int)nested_st);
  cr_expect_eq(opened, FILL + 2);
  if (st != MP_OK) { /* the handle keeps its descriptors */
    cr_expect_null(got);
    cr_expect_eq(mp_ipc_handle_close(&h[FILL]), MP_OK);
  }
  /* Everything the device mapped is unmapped once the device closes:
   * the imports left open, and what a refused import left mapped. */
  close_all(p, FILL + 2);
  cr_expect_eq(unmapped_n, opened,
               "%u mappings made, %u unmapped by mp_device_close (import: "
               "%d)",
               opened, unmapped_n, (int)st);
}

Test(pool_ipc_import_entry_reserved,
     an_import_without_room_in_the_list_maps_nothing) {
  void *p[FILL + 2], *q[FILL + 1], *got = NULL;
  mp_ipc_handle_t h[FILL + 2];
  export_blocks(p, h, FILL + 2);
  for (int i = 0; i < FILL + 1; i++)
    cr_assert_eq(mp_ipc_import(w.imp, &h[i], &q[i]), MP_OK, "%s",
                 mp_last_error());
  mp_ipc_handle_t before = h[FILL + 1];
  mp__fault_host_every(true);
  mp_status_t st = mp_ipc_import(w.imp, &h[FILL + 1], &got);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_ENOMEM, "%s", mp_last_error());
  cr_expect_null(got);
  cr_expect_eq(opened, FILL + 1, "a refused import mapped the handle");
  cr_expect_eq(h[FILL + 1].fd, before.fd, "the handle lost its descriptor");
  cr_expect_eq(h[FILL + 1].lease_fd, before.lease_fd);
  /* With host memory back, the handle imports. */
  cr_expect_eq(mp_ipc_import(w.imp, &h[FILL + 1], &got), MP_OK, "%s",
               mp_last_error());
  close_all(p, FILL + 2);
  cr_expect_eq(unmapped_n, opened);
}
