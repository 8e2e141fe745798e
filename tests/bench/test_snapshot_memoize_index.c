/* MEMOIZE stores the top of the stack at the memo's length: how many
 * entries it holds (Python's Unpickler: memo[len(memo)] = stack[-1]), not
 * one past the highest index a BINPUT used. So after BINPUT 1 a MEMOIZE
 * stores at 1 again, replacing it, and BINGET 1 gets what it stored
 * (pickle.loads(b'\x80\x04\x8c\x01Aq\x010\x8c\x01B\x940h\x01.') is 'B').
 * Read otherwise, a snapshot's values are not the ones Python reads. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"
#include "pickle_put.h"

/* {"device_traces": [[{"action": A, "addr": 4096, "size": 4096}]]}, A
 * read as BINGET 1 after "free" was stored by BINPUT 1 and "alloc" by
 * MEMOIZE: Python's A is "alloc". */
Test(snapshot_memoize_index, memoize_stores_at_the_memo_length) {
  char buf[256], *p = buf;
  memcpy(p, "\x80\x04", 2);
  p = pk_put_str(p + 2, "free");
  memcpy(p,
         "q\x01"
         "0",
         3); /* BINPUT 1, POP */
  p = pk_put_str(p + 3, "alloc");
  memcpy(p,
         "\x94"
         "0}",
         3); /* MEMOIZE (at 1), POP; the snapshot's dict */
  p = pk_put_str(p + 3, "device_traces");
  memcpy(p, "]](}(", 5);
  p = pk_put_str(p + 5, "action");
  memcpy(p, "h\x01", 2); /* BINGET 1 */
  p = pk_put_str(p + 2, "addr");
  memcpy(p, "M\x00\x10", 3);
  p = pk_put_str(p + 3, "size");
  memcpy(p,
         "M\x00\x10"
         "ueas.",
         8);
  size_t len = (size_t)(p + 8 - buf);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(buf, len, "m.pickle", "m", &w), MP_OK, "%s",
               mp_last_error());
  cr_assert_geq(w.n, 1);
  cr_expect_eq(w.ev[0].op, MPB_ALLOC, "the action is 'alloc'");
  cr_expect_eq(w.ev[0].size, 4096);
  mpb_workload_free(&w);
}
