/* test_preload_graph_launch_untracked_output.c - a graph launch whose
 * output (what its capture allocated and did not free, a graph allocation
 * each launch makes again: cuda.h, cuGraphLaunch) the shim's table of
 * pointers has no room to record (host memory ran out for its entry) is
 * not made: CUDA_ERROR_OUT_OF_MEMORY, the output not allocated (its free
 * refused as before any launch), and the next launch, with room, makes it
 * the program's as usual: freed once, launched again. Before, the launch
 * went ahead and the output was allocated but unknown to the table: its
 * free refused, and every later launch refused as one with an allocation
 * still unfreed (CUDA_ERROR_INVALID_VALUE). The shim's sources run in this
 * process on the fake driver; the table's puts fail when asked
 * (refuse_table_puts.h). */
#include "graph_output.h"
#include "refuse_table_puts.h"

/* An executable of a graph captured on s that allocated *out and did not
 * free it: its one output. */
static mp__cugraphexec graph_with_output(mp__custream *s, mp__cuptr *out) {
  mp__cugraph g = mp_graph_with_output(s, out);
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, g, 0), 0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  /* Not allocated before a launch: the driver's answer to its free. */
  cr_assert_eq(cuMemFree_v2(*out), MP__CU_INVALID_VALUE);
  return x;
}

Test(preload_graph_launch_untracked_output, is_out_of_memory_and_not_made,
     .init = mp_in_process_cuda) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = graph_with_output(&s, &out);
  refuse_table_puts = 1;
  mp__curesult r = cuGraphLaunch(x, s);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "the launch answered %u", r);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_INVALID_VALUE,
               "the output of the refused launch was allocated");
  /* With room: the launch allocates the output, the program frees it,
   * and the graph launches again. */
  r = cuGraphLaunch(x, s);
  cr_expect_eq(r, MP__CU_SUCCESS,
               "the next launch answered %u (an output still allocated, "
               "unknown to the table)",
               r);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the output of the next launch could not be freed");
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
