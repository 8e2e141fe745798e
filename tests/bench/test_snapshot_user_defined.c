/* A PyTorch snapshot's device trace may hold "user_defined" entries: the
 * annotations a program records while history is on (TraceEntry::
 * USER_DEFINED, written by the caching allocator's recordAnnotation with
 * addr and size 0 and the annotation in its frames). They are no memory:
 * the trace around them replays as it would without them, where such a
 * snapshot was refused whole as one of an "unknown action". */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "mpbench.h"
#include "pickle_put.h"

/* Appends {"action": action, "addr": addr, "size": size, "stream": 0,
 * "time_us": 7, "frames": [{"name": "fwd"}]} (addr, size as BININT2) to
 * the pickle at p; returns the end. */
static char *put_entry(char *p, const char *action, uint16_t addr,
                       uint16_t size) {
  memcpy(p, "}(", 2);
  p = pk_put_str(p + 2, "action");
  p = pk_put_str(p, action);
  p = pk_put_str(p, "addr");
  *p++ = 'M';
  *p++ = (char)(addr & 0xff);
  *p++ = (char)(addr >> 8);
  p = pk_put_str(p, "size");
  *p++ = 'M';
  *p++ = (char)(size & 0xff);
  *p++ = (char)(size >> 8);
  p = pk_put_str(p, "stream");
  memcpy(p, "K\x00", 2);
  p = pk_put_str(p + 2, "time_us");
  memcpy(p, "K\x07", 2);
  p = pk_put_str(p + 2, "frames");
  memcpy(p, "]}", 2); /* [{"name": "fwd"}] */
  p = pk_put_str(p + 2, "name");
  p = pk_put_str(p, "fwd");
  memcpy(p, "sau", 3); /* SETITEM, APPEND, the entry's SETITEMS */
  return p + 3;
}

/* {"device_traces": [[user_defined, alloc 0x1000, user_defined, alloc
 * 0x2000, free_completed 0x1000, user_defined, free_completed 0x2000]]} */
static size_t annotated_snapshot(char *buf) {
  char *p = buf;
  memcpy(p, "\x80\x04}", 3);
  p = pk_put_str(p + 3, "device_traces");
  memcpy(p, "]](", 3); /* device_traces, its one trace, MARK */
  p += 3;
  p = put_entry(p, "user_defined", 0, 0);
  p = put_entry(p, "alloc", 0x1000, 0x1000);
  p = put_entry(p, "user_defined", 0, 0);
  p = put_entry(p, "alloc", 0x2000, 0x0800);
  p = put_entry(p, "free_completed", 0x1000, 0x1000);
  p = put_entry(p, "user_defined", 0, 0);
  p = put_entry(p, "free_completed", 0x2000, 0x0800);
  memcpy(p, "eas.", 4); /* APPENDS, into device_traces, SETITEM, STOP */
  return (size_t)(p + 4 - buf);
}

Test(snapshot_user_defined, annotations_are_skipped_and_the_trace_replays) {
  char buf[2048];
  size_t len = annotated_snapshot(buf);
  cr_assert_lt(len, sizeof buf);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(buf, len, "a.pickle", "a", &w), MP_OK, "%s",
               mp_last_error());
  /* The four memory events, in order; nothing for the annotations. */
  cr_assert_eq(w.n, 4);
  static const struct {
    uint8_t op;
    size_t size;
  } want[4] = {{MPB_ALLOC, 0x1000},
               {MPB_ALLOC, 0x0800},
               {MPB_FREE, 0x1000},
               {MPB_FREE, 0x0800}};
  for (size_t i = 0; i < 4; i++) {
    cr_expect_eq(w.ev[i].op, want[i].op, "event %zu", i);
    cr_expect_eq(w.ev[i].size, want[i].size, "event %zu", i);
  }
  cr_expect_eq(mpb_workload_peak_live(&w), 0x1800);
  /* Nothing counted as skipped: an annotation is no free, failure or
   * zero-byte allocation. */
  cr_expect_eq(w.unknown_frees, 0);
  cr_expect_eq(w.failure_rows, 0);
  cr_expect_eq(w.zero_size_allocs, 0);
  mpb_workload_free(&w);
}

/* An action PyTorch does not write is still refused, naming the entry. */
Test(snapshot_user_defined, an_unknown_action_is_still_refused) {
  char buf[2048], *p = buf;
  memcpy(p, "\x80\x04}", 3);
  p = pk_put_str(p + 3, "device_traces");
  memcpy(p, "]](", 3);
  p += 3;
  p = put_entry(p, "alloc", 0x1000, 0x1000);
  p = put_entry(p, "user_definedx", 0, 0);
  memcpy(p, "eas.", 4);
  mpb_workload_t w;
  cr_assert_eq(
      mpb_snapshot_parse(buf, (size_t)(p + 4 - buf), "u.pickle", "u", &w),
      MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "device_traces[0] entry 1") != NULL &&
                strstr(mp_last_error(), "unknown action 'user_definedx'") !=
                    NULL,
            "%s", mp_last_error());
  cr_expect_eq(w.n, 0);
}
