/* test_preload_graph_exec_flags_refused.c - an executable update
 * (cuGraphExecUpdate, _v2, cuGraphExecChildGraphNodeSetParams) whose
 * executable's flags the driver will not give (cuGraphExecGetFlags
 * refused: cuda.h, cuGraphExecGetFlags, "Returns the flags that were
 * passed to instantiation", answering CUDA_ERROR_INVALID_VALUE among
 * others) is refused with the driver's code and changes nothing; made
 * once the driver answers, the executable, instantiated with
 * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, is launched again with
 * its outputs unfreed, as the driver allows (cuda.h, cuGraphLaunch).
 *
 * Before, the refusal read as no flags: the update was made, and the
 * second launch refused CUDA_ERROR_INVALID_VALUE, a code the shim made
 * up. The shim's sources run in this process on the fake driver, whose
 * cuFakeRefuse refuses cuGraphExecGetFlags once. */
#include "graph_output.h"

#define ILLEGAL_ADDRESS 700u /* cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS */
#define AUTO_FREE       1ull /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

/* cuGraphExecGetFlags answers ILLEGAL_ADDRESS to its next call. */
static void next_flags_refused(void) {
  bool (*refuse)(const char *, int, long) = NULL;
  *(void **)&refuse = dlsym(RTLD_DEFAULT, "cuFakeRefuse");
  cr_assert_not_null(refuse, "the fake driver has no cuFakeRefuse");
  cr_assert(refuse("cuGraphExecGetFlags", (int)ILLEGAL_ADDRESS, 1));
}

static mp__curesult update(mp__cugraphexec x, mp__cugraph g) {
  mp__cugraphnode e = NULL;
  mp__cugraphupdateresult res = 0;
  return cuGraphExecUpdate(x, g, &e, &res);
}

static mp__curesult update_v2(mp__cugraphexec x, mp__cugraph g) {
  return cuGraphExecUpdate_v2(x, g, NULL);
}

/* x (AUTO_FREE) of one captured graph, updated by how from another. */
static void refused_then_made(mp__curesult (*how)(mp__cugraphexec,
                                                  mp__cugraph)) {
  mp__custream s = NULL, t = NULL;
  mp__cuptr out = 0, out2 = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out);
  mp__cugraph h = mp_graph_with_output(&t, &out2);
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, g, AUTO_FREE), 0);
  next_flags_refused();
  cr_expect_eq(how(x, h), ILLEGAL_ADDRESS,
               "an update whose flags the driver refused was made");
  cr_assert_eq(how(x, h), 0);
  cr_expect_eq(cuGraphLaunch(x, t), 0);
  cr_expect_eq(cuGraphLaunch(x, t), 0,
               "a launch with outputs unfreed was refused though the "
               "executable frees them at launch");
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuGraphDestroy(h), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(cuStreamDestroy_v2(t), 0);
}

Test(preload_graph_exec_flags_refused, update, .init = pooling) {
  refused_then_made(update);
}

Test(preload_graph_exec_flags_refused, update_v2, .init = pooling) {
  refused_then_made(update_v2);
}
