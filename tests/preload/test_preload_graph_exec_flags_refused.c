/* test_preload_graph_exec_flags_refused.c - an executable update
 * (cuGraphExecUpdate, _v2) or child graph set
 * (cuGraphExecChildGraphNodeSetParams, cuGraphExecNodeSetParams) whose
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

/* Each call gives x graph g's memory: node, x's child graph node, for
 * the child graph sets; the updates ignore it. */
typedef mp__curesult (*how_t)(mp__cugraphexec x, mp__cugraphnode node,
                              mp__cugraph g);

static mp__curesult update(mp__cugraphexec x, mp__cugraphnode node,
                           mp__cugraph g) {
  (void)node;
  mp__cugraphnode e = NULL;
  mp__cugraphupdateresult res = 0;
  return cuGraphExecUpdate(x, g, &e, &res);
}

static mp__curesult update_v2(mp__cugraphexec x, mp__cugraphnode node,
                              mp__cugraph g) {
  (void)node;
  return cuGraphExecUpdate_v2(x, g, NULL);
}

static mp__curesult child_set(mp__cugraphexec x, mp__cugraphnode node,
                              mp__cugraph g) {
  return cuGraphExecChildGraphNodeSetParams(x, node, g);
}

/* cuda.h, CUgraphNodeParams: 256 bytes, the type first. */
static union {
  unsigned char b[256];
  long long align;
} params;

static mp__curesult node_set(mp__cugraphexec x, mp__cugraphnode node,
                             mp__cugraph g) {
  memset(&params, 0, sizeof params);
  memcpy(params.b, &(unsigned){MP__GRAPH_NODE_TYPE_GRAPH}, sizeof(unsigned));
  memcpy(params.b + MP__NODE_PARAMS_GRAPH, &g, sizeof g);
  return cuGraphExecNodeSetParams(x, node,
                                  (mp__cugraphnodeparams *)(void *)params.b);
}

/* An empty graph (cuGraphCreate, the fake's). */
static mp__cugraph created(void) {
  mp__curesult (*create)(mp__cugraph *, unsigned) = NULL;
  *(void **)&create = dlsym(RTLD_DEFAULT, "cuGraphCreate");
  cr_assert_not_null(create, "the fake driver has no cuGraphCreate");
  mp__cugraph g = NULL;
  cr_assert_eq(create(&g, 0), 0);
  return g;
}

/* x (AUTO_FREE) of base, given by how the memory of g, a captured graph
 * with an output: refused while cuGraphExecGetFlags is, then made, and x
 * launched twice with its outputs unfreed. base: another captured graph
 * for an update, else a graph whose child graph node holds an empty
 * one. */
static void refused_then_made(how_t how, bool child) {
  mp__custream s = NULL, t = NULL;
  mp__cuptr out = 0, out2 = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out), empty = created();
  mp__cugraph base = child ? created() : mp_graph_with_output(&t, &out2);
  mp__cugraphnode node = NULL;
  if (child)
    cr_assert_eq(cuGraphAddChildGraphNode(&node, base, NULL, 0, empty), 0);
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, base, AUTO_FREE), 0);
  next_flags_refused();
  cr_expect_eq(how(x, node, g), ILLEGAL_ADDRESS,
               "a call whose flags the driver refused was made");
  cr_assert_eq(how(x, node, g), 0);
  cr_expect_eq(cuGraphLaunch(x, s), 0);
  cr_expect_eq(cuGraphLaunch(x, s), 0,
               "a launch with outputs unfreed was refused though the "
               "executable frees them at launch");
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(base), 0);
  cr_expect_eq(cuGraphDestroy(empty), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  if (t != NULL)
    cr_expect_eq(cuStreamDestroy_v2(t), 0);
}

Test(preload_graph_exec_flags_refused, update, .init = pooling) {
  refused_then_made(update, false);
}

Test(preload_graph_exec_flags_refused, update_v2, .init = pooling) {
  refused_then_made(update_v2, false);
}

Test(preload_graph_exec_flags_refused, child_graph_node_set, .init = pooling) {
  refused_then_made(child_set, true);
}

Test(preload_graph_exec_flags_refused, node_set_params, .init = pooling) {
  refused_then_made(node_set, true);
}
