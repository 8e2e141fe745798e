/* A snapshot's device_traces may name one list many times through the memo
 * (2 input bytes a repeat). Looking for the first device trace with an
 * allocation must look through such a list once, not once a repeat: a
 * 1.5 MB pickle of a million-entry list repeated 131 072 times made the
 * search 1.4e11 steps (hours), where reading it is a moment. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"
#include "pickle_put.h"

/* {"device_traces": [t] * repeats + [[{"action": "alloc", "addr": 4096,
 * "size": 4096}]]}, t a list of `entries` Nones (no
 * allocation in it). */
static char *repeated_trace_pickle(size_t entries, size_t repeats,
                                   size_t *len) {
  char *buf = malloc(128 + entries + repeats * 2), *p = buf;
  cr_assert_not_null(buf);
  memcpy(p, "\x80\x02}", 3);
  p = pk_put_str(p + 3, "device_traces");
  memcpy(p, "(]q\x00(", 5); /* MARK, t, BINPUT 0, MARK */
  p += 5;
  memset(p, 'N', entries); /* None each */
  p += entries;
  *p++ = 'e'; /* APPENDS: t has its entries */
  for (size_t r = 1; r < repeats; r++) {
    memcpy(p, "h\x00", 2); /* BINGET 0: t again */
    p += 2;
  }
  memcpy(p, "](}(", 4); /* the trace with an allocation */
  p = pk_put_str(p + 4, "action");
  p = pk_put_str(p, "alloc");
  p = pk_put_str(p, "addr");
  memcpy(p, "M\x00\x10", 3);
  p = pk_put_str(p + 3, "size");
  memcpy(p, "M\x00\x10", 3);
  memcpy(p + 3, "uels.", 5); /* SETITEMS, APPENDS, LIST, SETITEM, STOP */
  *len = (size_t)(p + 8 - buf);
  return buf;
}

Test(snapshot_repeated_device_trace, is_searched_once_not_once_a_repeat,
     .timeout = 30) {
  size_t len;
  char *p = repeated_trace_pickle((size_t)1 << 20, (size_t)1 << 17, &len);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(p, len, "r.pickle", "r", &w), MP_OK, "%s",
               mp_last_error());
  /* The trace after the repeats, its allocation first. */
  cr_expect(w.n >= 1 && w.ev[0].op == MPB_ALLOC && w.ev[0].size == 4096);
  mpb_workload_free(&w);
  free(p);
}
