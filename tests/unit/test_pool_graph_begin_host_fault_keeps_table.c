/* test_pool_graph_begin_host_fault_keeps_table.c - mp_pool_graph_begin
 * refused for lack of host memory (fault.c: the k-th host allocation
 * fails, k = 0, 1, ... until the begin goes through) changes nothing
 * (status.h): neither the graph pool nor the parent keeps a slot for the
 * stream, nor a capture mark. Before, a begin whose parent mark (or an
 * arena's) failed after the graph pool's mark had added the stream to the
 * graph pool's table took the mark back but left the slot (graph.c,
 * mp__graph_begin_owned). */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

static bool met(mp_pool_t *p, mp_stream_t s) {
  mp__pool_lock(p);
  bool known = mp__stream_known(p, s);
  mp__pool_unlock(p);
  return known;
}

static size_t capturing(mp_pool_t *p) {
  mp__pool_lock(p);
  size_t n = p->ncapturing;
  mp__pool_unlock(p);
  return n;
}

static void begin_under_faults(const char *opts) {
  const char *how = opts != NULL ? opts : "no arenas";
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *parent = make_pool(dev, opts);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  int refused = 0;
  mp_status_t st = MP_ENOMEM;
  for (long k = 0; k < 1000 && st != MP_OK; k++) {
    mp__fault_host_after(k);
    st = mp_pool_graph_begin(parent, g, s);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    refused++;
    cr_assert_eq(st, MP_ENOMEM, "%s, k=%ld: %s", how, k, mp_last_error());
    cr_expect(strstr(mp_last_error(), "host memory") != NULL,
              "%s, k=%ld: unclear message '%s'", how, k, mp_last_error());
    cr_expect(!met(g, s),
              "%s, k=%ld: the refused begin left s in the graph pool's table",
              how, k);
    cr_expect(!met(parent, s),
              "%s, k=%ld: the refused begin left s in the parent's table", how,
              k);
    cr_expect_eq(capturing(g), 0, "%s, k=%ld: graph pool left capturing", how,
                 k);
    cr_expect_eq(capturing(parent), 0, "%s, k=%ld: parent left capturing", how,
                 k);
    cr_expect_null(mp_pool_graph_of(parent, s), "%s, k=%ld: routed", how, k);
  }
  cr_assert_eq(st, MP_OK, "%s: the begin never went through: %s", how,
               mp_last_error());
  cr_expect_geq(refused, 3, "%s: too few host allocations failed (%d)", how,
                refused);
  cr_expect_eq(mp_pool_graph_of(parent, s), g);
  cr_expect(met(g, s));
  cr_expect_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(pool_graph_begin_host_fault_keeps_table, no_arenas) {
  begin_under_faults(NULL);
}

Test(pool_graph_begin_host_fault_keeps_table, arenas) {
  begin_under_faults("arenas=2");
}
