/* test_preload_graph_handle_reuse.c - a graph or executable handle the
 * driver gives again while the shim is still noting the destruction of
 * the one it named before.
 *
 * The shim notes what a graph or executable holds (graph pools) by its
 * handle, and forgets a handle's holds after the real cuGraphDestroy /
 * cuGraphExecDestroy returns. The driver may hand the freed handle to a
 * new graph at once (the fake allocates graphs and executables with
 * calloc, so it does): another thread's cuGraphClone, or instantiation,
 * between the real destroy and the shim's bookkeeping registered the new
 * handle's holds, which the destroy then took for its own and dropped.
 * The new copy or executable held nothing, and the graph pool was
 * released under it when the last other holder went (its replays wrote
 * memory handed to others).
 *
 * The shim's sources run in this process on the fake driver; the link
 * wraps the shim's table of the driver's calls (mp__pl_real_cuda) to make
 * that interleaving every time: the real destroy, wrapped, leaves the
 * graph (or executable) alive in the fake and has this thread make the
 * other thread's call through the shim, whose real call, wrapped, answers
 * with the handle just "destroyed" (a live graph, a clone of the same
 * graph; a live executable of it): the driver's reuse, without depending
 * on when its allocator gives an address back. */
#include <string.h>

#include "in_process.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

/* Armed: the next destroy is the wrapped one, and runs the other thread's
 * call (other); the handle it "destroyed", which that call gets. */
static void (*other)(void);
static mp__cugraph reused_graph;
static mp__cugraphexec reused_exec;
static mp__real_cuda_t wrapped;
/* Armed: the next capture's end answers with end_as, the graph it really
 * ended with kept in ended_for_real, which a destroy of end_as then
 * destroys (the driver giving the new graph end_as's handle). */
static mp__cugraph end_as, ended_for_real, ended_as;

static mp__curesult graph_destroy(mp__cugraph g) {
  void (*then)(void) = other;
  other = NULL;
  reused_graph = g;
  then();
  return 0;
}

static mp__curesult exec_destroy(mp__cugraphexec x) {
  void (*then)(void) = other;
  other = NULL;
  reused_exec = x;
  then();
  return 0;
}

static mp__curesult clone_reusing(mp__cugraph *out, mp__cugraph from) {
  (void)from;
  *out = reused_graph;
  reused_graph = NULL;
  return 0;
}

static mp__curesult instantiate_reusing(mp__cugraphexec *out, mp__cugraph g,
                                        unsigned long long flags) {
  (void)g;
  (void)flags;
  *out = reused_exec;
  reused_exec = NULL;
  return 0;
}

static mp__curesult end_capture_as(mp__custream s, mp__cugraph *g) {
  mp__curesult r = __real_mp__pl_real_cuda()->cuStreamEndCapture(s, g);
  if (r == 0) {
    ended_for_real = *g;
    ended_as = *g = end_as;
  }
  end_as = NULL;
  return r;
}

static mp__curesult destroy_as(mp__cugraph g) {
  if (g != ended_as)
    return __real_mp__pl_real_cuda()->cuGraphDestroy(g);
  ended_as = NULL;
  return __real_mp__pl_real_cuda()->cuGraphDestroy(ended_for_real);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  const mp__real_cuda_t *real = __real_mp__pl_real_cuda();
  if (other == NULL && reused_graph == NULL && reused_exec == NULL &&
      end_as == NULL && ended_as == NULL)
    return real;
  wrapped = *real;
  if (other != NULL) {
    wrapped.cuGraphDestroy = graph_destroy;
    wrapped.cuGraphExecDestroy = exec_destroy;
  }
  if (reused_graph != NULL)
    wrapped.cuGraphClone = clone_reusing;
  if (reused_exec != NULL)
    wrapped.cuGraphInstantiateWithFlags = instantiate_reusing;
  if (end_as != NULL)
    wrapped.cuStreamEndCapture = end_capture_as;
  if (ended_as != NULL)
    wrapped.cuGraphDestroy = destroy_as;
  return &wrapped;
}

/* A graph captured on a new stream whose capture allocated and freed a
 * temporary: it holds a graph pool. */
static mp__cugraph captured(void) {
  mp__custream s = NULL;
  mp__cuptr p = 0;
  mp__cugraph g = NULL;
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamBeginCapture_v2(s, 0 /* GLOBAL */), 0);
  cr_assert_eq(cuMemAllocAsync(&p, 1 << 20, s), 0);
  cr_assert_eq(cuMemFreeAsync(p, s), 0);
  cr_assert_eq(cuStreamEndCapture(s, &g), 0);
  cr_assert_eq(cuStreamDestroy_v2(s), 0);
  cr_assert_eq(mp__pl_graph_pools(), 1, "the capture made no graph pool");
  return g;
}

static mp__cugraph keeper, made_graph;
static mp__cugraphexec made_exec;

static void clone_keeper(void) {
  cr_assert_eq(cuGraphClone(&made_graph, keeper), 0);
}

static void instantiate_keeper(void) {
  cr_assert_eq(cuGraphInstantiateWithFlags(&made_exec, keeper, 0), 0);
}

/* keeper: a clone of a captured graph, the graph itself destroyed. */
static void keep_a_clone(void) {
  mp__cugraph g = captured();
  cr_assert_eq(cuGraphClone(&keeper, g), 0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  cr_assert_eq(mp__pl_graph_pools(), 1);
}

static mp__curesult destroy_made_graph(void) {
  return cuGraphDestroy(made_graph);
}

static mp__curesult destroy_made_exec(void) {
  return cuGraphExecDestroy(made_exec);
}

/* After a destroy whose handle the new graph or executable (`what`) got
 * from the other thread's call: keeper goes, the new one alone must hold
 * the graph pool, and its destroy (destroy_new) must give it back. */
static void the_new_one_holds(mp__curesult (*destroy_new)(void),
                              const char *what) {
  cr_assert_null(other, "the real destroy was not wrapped");
  cr_assert_eq(cuGraphDestroy(keeper), 0);
  cr_expect_eq(mp__pl_graph_pools(), 1,
               "the graph pool was released under the new %s", what);
  cr_assert_eq(destroy_new(), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0, "the last holder went");
}

Test(preload_graph_handle_reuse, a_clone_given_a_destroyed_clones_handle,
     .init = mp_in_process_cuda) {
  keep_a_clone();
  mp__cugraph c = NULL;
  cr_assert_eq(cuGraphClone(&c, keeper), 0);
  other = clone_keeper;
  cr_assert_eq(cuGraphDestroy(c), 0);
  cr_assert_eq(made_graph, c);
  the_new_one_holds(destroy_made_graph, "clone");
}

Test(preload_graph_handle_reuse,
     an_executable_given_a_destroyed_executables_handle,
     .init = mp_in_process_cuda) {
  keep_a_clone();
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, keeper, 0), 0);
  other = instantiate_keeper;
  cr_assert_eq(cuGraphExecDestroy(x), 0);
  cr_assert_eq(made_exec, x);
  the_new_one_holds(destroy_made_exec, "executable");
}

/* The fake's own entry point `name` (one the shim does not hook). */
static void *fake(const char *name) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib, "%s", dlerror());
  void *fn = dlsym(lib, name);
  cr_assert_not_null(fn, "%s", name);
  return fn;
}

/* Captures into graph g on s (cuStreamBeginCaptureToGraph) a temporary
 * allocated and freed: the shim makes a graph pool. The graph the end
 * answers with. */
static mp__cugraph capture_into(mp__custream s, mp__cugraph g) {
  mp__cuptr p = 0;
  mp__cugraph ended = NULL;
  cr_assert_eq(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0, 0), 0);
  cr_assert_eq(cuMemAllocAsync(&p, 1 << 20, s), 0);
  cr_assert_eq(cuMemFreeAsync(p, s), 0);
  cr_assert_eq(cuStreamEndCapture(s, &ended), 0);
  return ended;
}

/* A capture into the body graph of a conditional node, the node then
 * destroyed (cuda.h, cuGraphDestroyNode; the body is "Valid for the
 * lifetime of the conditional node", CUDA_CONDITIONAL_NODE_PARAMS), and
 * the driver gives the body's handle to a new graph: the capture into the
 * body is released with the node (nothing else held it), and the new
 * graph's capture is the new graph's, released with it. Before, the shim
 * had no cuGraphDestroyNode: the parent held the body's graph pool until
 * its own destruction, and the shim kept the body's handle as embedded in
 * the parent, so the new graph's capture was held by the parent too. */
Test(preload_graph_handle_reuse, a_graph_given_a_destroyed_nodes_body_handle,
     .init = mp_in_process_cuda) {
  mp__curesult (*create)(mp__cugraph *, unsigned) = NULL;
  mp__curesult (*cond)(uint64_t *, mp__cugraph, void *, unsigned, unsigned) =
      NULL;
  mp__curesult (*current)(void **) = NULL;
  *(void **)&create = fake("cuGraphCreate");
  *(void **)&cond = fake("cuGraphConditionalHandleCreate");
  *(void **)&current = fake("cuCtxGetCurrent");
  mp__cugraph parent = NULL, g = NULL, *bodies = NULL;
  mp__cugraphnode node = NULL;
  mp__custream s = NULL;
  void *ctx = NULL;
  uint64_t h = 0;
  unsigned type = MP__GRAPH_NODE_TYPE_COND, size = 1;
  cr_assert_eq(current(&ctx), 0);
  cr_assert_eq(create(&parent, 0), 0);
  cr_assert_eq(cond(&h, parent, ctx, 1, 1 /* CU_GRAPH_COND_ASSIGN_DEFAULT */),
               0);
  /* cuda.h, CUgraphNodeParams (256 bytes): type, then the union's
   * CUDA_CONDITIONAL_NODE_PARAMS at 16: handle, type (at 24;
   * CU_GRAPH_COND_TYPE_IF is 0), size, phGraph_out, ctx (at 40). */
  _Alignas(8) unsigned char params[256] = {0};
  memcpy(params, &type, sizeof type);
  memcpy(params + 16, &h, sizeof h);
  memcpy(params + MP__NODE_PARAMS_COND_SIZE, &size, sizeof size);
  memcpy(params + 40, &ctx, sizeof ctx);
  cr_assert_eq(
      cuGraphAddNode(&node, parent, NULL, 0, (mp__cugraphnodeparams *)params),
      0);
  memcpy(&bodies, params + MP__NODE_PARAMS_COND_BODIES, sizeof bodies);
  mp__cugraph body = bodies[0];
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(capture_into(s, body), body);
  cr_assert_eq(mp__pl_graph_pools(), 1, "the capture made no graph pool");
  cr_assert_eq(cuGraphDestroyNode(node), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0,
               "the body's graph pool was not released with its node");
  cr_assert_eq(create(&g, 0), 0);
  end_as = body; /* the shim sees the new graph with the body's handle */
  cr_assert_eq(capture_into(s, g), body);
  cr_assert_eq(cuGraphDestroy(body), 0); /* the new graph, destroyed */
  cr_expect_eq(mp__pl_graph_pools(), 0,
               "the new graph's graph pool stayed held by the body's parent");
  cr_assert_eq(cuGraphDestroy(parent), 0);
  cr_assert_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
}
