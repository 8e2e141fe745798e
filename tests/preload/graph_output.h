/* graph_output.h - for the tests of the shim's sources in the test's
 * process (in_process.h): a graph with one output (what its capture
 * allocated and did not free, which each launch allocates again: cuda.h,
 * cuGraphLaunch), and the report's check that the trace is balanced. */
#ifndef MP_TESTS_PRELOAD_GRAPH_OUTPUT_H
#define MP_TESTS_PRELOAD_GRAPH_OUTPUT_H

#include "in_process.h"

#define MP_OUT_BYTES (1u << 20)

/* A graph captured on *s, a new stream, that allocated *out (MP_OUT_BYTES)
 * and did not free it. */
static inline mp__cugraph mp_graph_with_output(mp__custream *s,
                                               mp__cuptr *out) {
  mp__cugraph g = NULL;
  cr_assert_eq(cuStreamCreate(s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamBeginCapture_v2(*s, 0 /* GLOBAL */), 0);
  cr_assert_eq(cuMemAllocAsync(out, MP_OUT_BYTES, *s), 0);
  cr_assert_eq(cuStreamEndCapture(*s, &g), 0);
  cr_assert_not_null(g);
  return g;
}

/* An executable (no flags) of a graph mp_graph_with_output captured on
 * *s, its output *out: the graph in *g, or destroyed when g is NULL. */
static inline mp__cugraphexec
mp_exec_with_output(mp__custream *s, mp__cuptr *out, mp__cugraph *g) {
  mp__cugraph made = mp_graph_with_output(s, out);
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, made, 0), 0);
  if (g != NULL)
    *g = made;
  else
    cr_assert_eq(cuGraphDestroy(made), 0);
  return x;
}

/* The report at exit of the recording so far: allocs allocations traced,
 * as many frees, nothing live. */
static inline void mp_trace_balanced(unsigned long long allocs) {
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  cr_expect_eq(n.allocs, allocs, "%llu allocations traced",
               (unsigned long long)n.allocs);
  cr_expect_eq(n.frees, n.allocs, "%llu frees traced for %llu allocations",
               (unsigned long long)n.frees, (unsigned long long)n.allocs);
  cr_expect_eq(n.live, 0, "the report's live bytes: %zu", n.live);
}

#endif
