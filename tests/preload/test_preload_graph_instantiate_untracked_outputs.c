/* test_preload_graph_instantiate_untracked_outputs.c - an instantiation of
 * a graph with outputs when the shim's table of executables cannot grow
 * (host memory ran out for it): the outputs become the program's blocks
 * for the graph's life, traced as allocated (each freed once by the
 * program, as many frees as allocations in the trace); and when the table
 * of pointers has no room to record them either, the instantiation is
 * refused, CUDA_ERROR_OUT_OF_MEMORY, with nothing changed: the output is
 * still an output, not allocated before a launch (its free refused), and
 * the next instantiation, with room, makes an executable whose launches
 * allocate it as usual. With two captures into the graph, the refusal on
 * the second's outputs leaves the first's as they were too.
 *
 * Before, the failed puts were ignored: the instantiation went through,
 * the outputs neither in the table nor outputs any more, so their frees
 * were refused (pointers in the pool's memory the pool never handed out);
 * and held outputs were never traced as allocated, though their frees
 * were; and, before 2026-12-06, the captures before the one refused
 * stayed kept (their graph pools until exit) with their outputs made the
 * program's, though the instantiation was refused. The shim's sources run
 * in this process on the fake driver;
 * realloc (which grows the executables' table) fails while refuse_realloc
 * is set, and the table's puts when asked (refuse_table_puts.h). */
#include "graph_output.h"
#include "refuse_table_puts.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

static bool refuse_realloc;

void *__wrap_realloc(void *p, size_t n) {
  return refuse_realloc ? NULL : __real_realloc(p, n);
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

/* An instantiation of g into *x with the executables' table unable to
 * grow and puts refused of the table of pointers; its answer. */
static mp__curesult instantiate_short(mp__cugraphexec *x, mp__cugraph g,
                                      int puts) {
  refuse_realloc = true;
  refuse_table_puts = puts;
  mp__curesult r = cuGraphInstantiateWithFlags(x, g, 0);
  refuse_realloc = false;
  refuse_table_puts = 0;
  cr_assert_eq(refused, puts, "%d of the table's puts refused", refused);
  return r;
}

Test(preload_graph_instantiate_untracked_outputs, outputs_held_are_traced,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out);
  mp__cugraphexec x = NULL;
  mp__curesult r = instantiate_short(&x, g, 0);
  cr_assert_eq(r, MP__CU_SUCCESS, "the instantiation answered %u", r);
  /* Held: the program's block for the graph's life, freed once. */
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the held output could not be freed");
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  /* The capture's allocation (freed at its end), the output held. */
  mp_trace_balanced(2);
}

Test(preload_graph_instantiate_untracked_outputs, refused_when_unrecorded,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out);
  mp__cugraphexec x = NULL;
  mp__curesult r = instantiate_short(&x, g, 1);
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "the instantiation answered %u", r);
  cr_expect_null(x, "an executable was handed out");
  if (r == MP__CU_SUCCESS && x != NULL)
    cr_expect_eq(cuGraphExecDestroy(x), 0);
  /* Nothing changed: still an output, not allocated before a launch. */
  cr_expect_eq(cuMemFree_v2(out), MP__CU_INVALID_VALUE,
               "the output is allocated before any launch");
  /* With room: an executable whose launches allocate the output. */
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, g, 0), MP__CU_SUCCESS);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS, "launch %d", i);
    cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
                 "the output of launch %d could not be freed", i);
  }
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  /* The capture's allocation and two launches'. */
  mp_trace_balanced(3);
}

Test(preload_graph_instantiate_untracked_outputs,
     refused_leaves_earlier_captures, .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr a = 0, b = 0;
  mp__cugraph g = mp_graph_with_output(&s, &a), g2 = NULL;
  /* A second capture into g (cuStreamBeginCaptureToGraph), another
   * output. */
  cr_assert_eq(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, 0), 0);
  cr_assert_eq(cuMemAllocAsync(&b, MP_OUT_BYTES, s), 0);
  cr_assert_eq(cuStreamEndCapture(s, &g2), 0);
  cr_assert_eq(g2, g);
  cr_assert_eq(mp__pl_graph_pools(), 2);
  mp__cugraphexec x = NULL;
  pass_table_puts = 1; /* the first capture's output recorded */
  mp__curesult r = instantiate_short(&x, g, 1);
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "the instantiation answered %u", r);
  cr_expect_null(x, "an executable was handed out");
  /* Nothing changed: both still outputs, not allocated before a launch. */
  cr_expect_eq(cuMemFree_v2(a), MP__CU_INVALID_VALUE,
               "the first capture's output is allocated before any launch");
  cr_expect_eq(cuMemFree_v2(b), MP__CU_INVALID_VALUE,
               "the second capture's output is allocated before any launch");
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, g, 0), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(a), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(b), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0,
               "a graph pool kept by the refused instantiation");
  /* The captures' allocations and the launch's two. */
  mp_trace_balanced(4);
}
