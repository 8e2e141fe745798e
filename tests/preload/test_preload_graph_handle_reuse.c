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
#include "in_process.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

/* Armed: the next destroy is the wrapped one, and runs the other thread's
 * call (other); the handle it "destroyed", which that call gets. */
static void (*other)(void);
static mp__cugraph reused_graph;
static mp__cugraphexec reused_exec;
static mp__real_cuda_t wrapped;

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

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  const mp__real_cuda_t *real = __real_mp__pl_real_cuda();
  if (other == NULL && reused_graph == NULL && reused_exec == NULL)
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
