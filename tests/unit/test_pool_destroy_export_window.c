/* test_pool_destroy_export_window.c - mp_pool_ipc_export from another
 * thread while mp_pool_destroy is under way. Destroy refuses (MP_EBUSY,
 * nothing changed) while a plain segment's block is exported, asking its
 * leases last under the pool's lock; it then drops the lock to free its
 * first plain segment (unlocked, so that a device refusing it leaves the
 * pool as it was). An export made there, of a block of another plain
 * segment, must not succeed while the destroy goes on to free that
 * segment under the importer ("cuMemFree on an exported memory region
 * before calling cuIpcCloseMemHandle in the importing context will result
 * in undefined behavior", cuda.h, cuIpcOpenMemHandle): the export is
 * refused, or the destroy is. With arenas, destroy asks every arena first
 * (so that a refusal changes nothing) and then destroys them in turn: an
 * export into a later arena while an earlier one is being freed must not
 * make the later one refuse once the earlier one (and its live blocks)
 * went. A destroy refused exports again. White-box: the exporting host
 * device's free runs the export first, as another thread would there (the
 * pool's lock is not held). Failed before: the export returned MP_OK and
 * the destroy freed the exported segment with its lease; with arenas, the
 * destroy said MP_EBUSY, "nothing was released", the first arena gone. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static const mp__backend_t *host_ops;
static mp__backend_t ops; /* the exporter's: host_ops' with free hooked */
static mp_pool_t *the_pool;
static void *cand[2]; /* armed: the next free exports the one not freed */
static bool armed;
static bool refuse_next; /* the next device free is refused */
static mp_status_t export_st = MP_EINVAL;
static mp_ipc_handle_t export_h;

static mp_status_t free_exporting(mp_device_t *dev, void *ptr) {
  if (armed) {
    armed = false;
    void *other = cand[0] == ptr ? cand[1] : cand[0];
    export_st = mp_pool_ipc_export(the_pool, other, &export_h);
  }
  if (refuse_next) {
    refuse_next = false;
    return mp__fail(MP_EDRIVER, "the test's device refuses this free");
  }
  return host_ops->free(dev, ptr);
}

/* A host device whose frees run free_exporting, with the_pool (opts) on
 * it holding two 8 MiB blocks, cand[0] and cand[1]: allocated by this
 * thread (two plain segments, the newer first on the list, the one
 * destroy frees first), or with arenas by two workers (two arenas). */
static mp_device_t *open_two_blocks(const char *opts, bool arenas) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  host_ops = dev->ops;
  ops = *host_ops;
  ops.free = free_exporting;
  dev->ops = &ops;
  the_pool = make_pool(dev, opts);
  job_t j[2] = {{.pool = the_pool, .bytes = 8 * MiB, .tag = 1, .count = 1},
                {.pool = the_pool, .bytes = 8 * MiB, .tag = 2, .count = 1}};
  if (arenas)
    two_arenas(the_pool, &j[0], &j[1]);
  for (int i = 0; i < 2; i++) {
    if (!arenas)
      cr_assert_eq(on_thread(&j[i], ALLOC), MP_OK, "%s", j[i].why);
    cand[i] = j[i].ptrs[0];
  }
  return dev;
}

static void close_two_blocks(mp_device_t *dev, bool arenas) {
  if (arenas) {
    worker_stop(&wa);
    worker_stop(&wb);
  }
  dev->ops = host_ops;
  mp_device_close(dev);
}

/* Destroys the_pool with cand's other block exported at the first free. */
static void destroy_exporting(mp_device_t *dev, bool arenas) {
  armed = true;
  int destroyed = -1;
  mp_status_t st = mp_pool_destroy_ex(the_pool, &destroyed);
  cr_assert(!armed, "the destroy freed no plain segment");
  /* Refused, or (without arenas, where nothing went) refusing the destroy. */
  cr_expect(export_st != MP_OK || (!arenas && destroyed == 0),
            "an export made while the destroy freed (status %d), and the "
            "destroy (status %d: %s) %s",
            export_st, st, st == MP_OK ? "" : mp_last_error(),
            destroyed ? "went on: the exported segment was freed under its "
                        "lease"
                      : "refused after an arena went");
  if (export_st == MP_OK)
    cr_expect_eq(mp_ipc_handle_close(&export_h), MP_OK, "%s", mp_last_error());
  if (destroyed == 0)
    (void)mp_pool_destroy(the_pool);
  close_two_blocks(dev, arenas);
}

/* A refused destroy (the first free, or an arena asked after another)
 * leaves the pool as it was: it exports again. */
static void refused_destroy_exports_again(mp_device_t *dev, bool arenas,
                                          void *refused, void *again) {
  mp_ipc_handle_t h[2] = {{.kind = 0}, {.kind = 0}};
  if (arenas)
    cr_assert_eq(mp_pool_ipc_export(the_pool, refused, &h[0]), MP_OK, "%s",
                 mp_last_error());
  refuse_next = !arenas;
  mp_status_t st = mp_pool_destroy(the_pool);
  cr_assert_eq(st, arenas ? MP_EBUSY : MP_EDRIVER, "%s", mp_last_error());
  cr_expect_eq(mp_pool_ipc_export(the_pool, again, &h[1]), MP_OK, "%s",
               mp_last_error());
  check(the_pool);
  for (int i = 0; i < 2; i++)
    cr_expect_eq(mp_ipc_handle_close(&h[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(the_pool), MP_OK, "%s", mp_last_error());
  close_two_blocks(dev, arenas);
}

Test(pool_destroy_export_window, an_export_while_destroy_frees_is_refused) {
  destroy_exporting(open_two_blocks("virtual=0", false), false);
}

Test(pool_destroy_export_window, an_export_into_a_later_arena_is_refused) {
  destroy_exporting(open_two_blocks("arenas=2,virtual=0", true), true);
}

Test(pool_destroy_export_window, a_refused_destroy_exports_again) {
  mp_device_t *dev = open_two_blocks("virtual=0", false);
  refused_destroy_exports_again(dev, false, NULL, cand[0]);
}

/* The later arena's block exported refuses the destroy there, after the
 * earlier arena was asked (and sealed). */
Test(pool_destroy_export_window, a_destroy_refused_at_an_arena_exports_again) {
  mp_device_t *dev = open_two_blocks("arenas=2,virtual=0", true);
  bool first =
      arena_holding(the_pool, cand[0]) < arena_holding(the_pool, cand[1]);
  refused_destroy_exports_again(dev, true, cand[first], cand[!first]);
}
