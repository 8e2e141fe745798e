/* test_preload_graph_copy_refused_without_room.c - a call that copies a
 * graph with an output, or gives an executable its memory, when the
 * shim's tables cannot grow to note it (host memory ran out): refused,
 * CUDA_ERROR_OUT_OF_MEMORY, before the real call, with nothing changed
 * (the output still an output, not allocated before a launch), and the
 * same call with room goes through; once the graphs and executables are
 * destroyed no graph pool is left.
 *
 * Before, the real call was made first and the shim's put, failing after
 * it, kept the graph pool until exit and made the output the program's
 * block for good (its free accepted before any launch): cuGraphClone,
 * cuGraphAddChildGraphNode, cuGraphAddNode (both forms) and
 * cuGraphNodeSetParams (the tables of copies' holds), cuGraphExecUpdate
 * (both forms), cuGraphExecChildGraphNodeSetParams and
 * cuGraphExecNodeSetParams (the executables' table); and
 * cuGraphChildGraphNodeGetGraph, cuGraphNodeFindInClone and cuGraphAddNode
 * of a conditional node (the tables of child graph nodes and embedded
 * graphs) kept the graph holding them the same way. The shim's sources
 * run in this process on the fake driver; realloc (which grows the
 * tables) fails while refuse_realloc is set. */
#include <string.h>

#include "graph_output.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

static bool refuse_realloc;

void *__wrap_realloc(void *p, size_t n) {
  return refuse_realloc ? NULL : __real_realloc(p, n);
}

/* A graph with an output (g, its output out, captured on s); two empty
 * graphs (cuGraphCreate): parent, with a child graph node `node` made from
 * the other, empty; an executable of each (xp, xe), holding nothing; what
 * a call made (made, made_node). */
static struct {
  mp__custream s;
  mp__cuptr out;
  mp__cugraph g, parent, empty, made, got;
  mp__cugraphnode node, made_node, gnode;
  mp__cugraphexec xp, xe;
} f;

/* cuda.h, CUgraphNodeParams: 256 bytes, the type first. */
static union {
  unsigned char b[256];
  long long align;
} params;

/* The fake driver's fn, one the shim does not hook. */
static void *driver_fn(const char *fn) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib);
  return dlsym(lib, fn);
}

static mp__cugraph created(void) {
  mp__curesult (*create)(mp__cugraph *, unsigned) = NULL;
  *(void **)&create = driver_fn("cuGraphCreate");
  mp__cugraph g = NULL;
  cr_assert(create != NULL && create(&g, 0) == 0);
  return g;
}

static void setup(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
  memset(&f, 0, sizeof f);
  f.g = mp_graph_with_output(&f.s, &f.out);
  f.parent = created();
  f.empty = created();
  cr_assert_eq(cuGraphAddChildGraphNode(&f.node, f.parent, NULL, 0, f.empty),
               0);
  cr_assert_eq(cuGraphInstantiateWithFlags(&f.xp, f.parent, 0), 0);
  cr_assert_eq(cuGraphInstantiateWithFlags(&f.xe, f.empty, 0), 0);
  memset(&params, 0, sizeof params);
  memcpy(params.b, &(unsigned){MP__GRAPH_NODE_TYPE_GRAPH}, sizeof(unsigned));
  memcpy(params.b + MP__NODE_PARAMS_GRAPH, &f.g, sizeof f.g);
  /* ownership 0: CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE */
}

static mp__cugraphnodeparams *child_g(void) {
  return (mp__cugraphnodeparams *)(void *)params.b;
}

/* call refused without room, nothing changed; then made with room; then
 * everything destroyed leaves no graph pool. */
static void refused_then_made(mp__curesult (*call)(void), const char *name) {
  refuse_realloc = true;
  mp__curesult r = call();
  refuse_realloc = false;
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "%s answered %u without room", name, r);
  cr_expect_eq(cuMemFree_v2(f.out), MP__CU_INVALID_VALUE,
               "after %s: the output is allocated before any launch", name);
  cr_expect_eq(call(), MP__CU_SUCCESS, "%s with room", name);
  cr_expect_eq(cuGraphExecDestroy(f.xp), 0);
  cr_expect_eq(cuGraphExecDestroy(f.xe), 0);
  if (f.made != NULL)
    cr_expect_eq(cuGraphDestroy(f.made), 0);
  cr_expect_eq(cuGraphDestroy(f.parent), 0);
  cr_expect_eq(cuGraphDestroy(f.empty), 0);
  cr_expect_eq(cuGraphDestroy(f.g), 0);
  cr_expect_eq(cuStreamDestroy_v2(f.s), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0, "after %s: a graph pool kept", name);
}

static mp__curesult clone_g(void) {
  return cuGraphClone(&f.made, f.g);
}

static mp__curesult add_child(void) {
  return cuGraphAddChildGraphNode(&f.made_node, f.parent, NULL, 0, f.g);
}

static mp__curesult add_node(void) {
  return cuGraphAddNode(&f.made_node, f.parent, NULL, 0, child_g());
}

static mp__curesult add_node_v2(void) {
  return cuGraphAddNode_v2(&f.made_node, f.parent, NULL, NULL, 0, child_g());
}

static mp__curesult node_set(void) {
  return cuGraphNodeSetParams(f.node, child_g());
}

static mp__curesult update(void) {
  mp__cugraphnode e = NULL;
  mp__cugraphupdateresult res = 0;
  return cuGraphExecUpdate(f.xe, f.g, &e, &res);
}

static mp__curesult update_v2(void) {
  return cuGraphExecUpdate_v2(f.xe, f.g, NULL);
}

static mp__curesult exec_child_set(void) {
  return cuGraphExecChildGraphNodeSetParams(f.xp, f.node, f.g);
}

static mp__curesult exec_node_set(void) {
  return cuGraphExecNodeSetParams(f.xp, f.node, child_g());
}

Test(preload_graph_copy_refused_without_room, clone, .init = setup) {
  refused_then_made(clone_g, "cuGraphClone");
}

Test(preload_graph_copy_refused_without_room, add_child_graph_node,
     .init = setup) {
  refused_then_made(add_child, "cuGraphAddChildGraphNode");
}

Test(preload_graph_copy_refused_without_room, add_node, .init = setup) {
  refused_then_made(add_node, "cuGraphAddNode");
}

Test(preload_graph_copy_refused_without_room, add_node_v2, .init = setup) {
  refused_then_made(add_node_v2, "cuGraphAddNode_v2");
}

Test(preload_graph_copy_refused_without_room, node_set_params, .init = setup) {
  refused_then_made(node_set, "cuGraphNodeSetParams");
}

Test(preload_graph_copy_refused_without_room, exec_update, .init = setup) {
  refused_then_made(update, "cuGraphExecUpdate");
}

Test(preload_graph_copy_refused_without_room, exec_update_v2, .init = setup) {
  refused_then_made(update_v2, "cuGraphExecUpdate_v2");
}

Test(preload_graph_copy_refused_without_room, exec_child_graph_node_set,
     .init = setup) {
  refused_then_made(exec_child_set, "cuGraphExecChildGraphNodeSetParams");
}

Test(preload_graph_copy_refused_without_room, exec_node_set_params,
     .init = setup) {
  refused_then_made(exec_node_set, "cuGraphExecNodeSetParams");
}

/* g given a child graph node (gnode) made from empty. */
static void g_with_node(void) {
  cr_assert_eq(cuGraphAddChildGraphNode(&f.gnode, f.g, NULL, 0, f.empty), 0);
}

static mp__curesult get_graph(void) {
  return cuGraphChildGraphNodeGetGraph(f.gnode, &f.got);
}

Test(preload_graph_copy_refused_without_room, child_graph_node_get_graph,
     .init = setup) {
  g_with_node();
  refused_then_made(get_graph, "cuGraphChildGraphNodeGetGraph");
}

static mp__curesult find_in_clone(void) {
  mp__cugraphnode n = NULL;
  return cuGraphNodeFindInClone(&n, f.gnode, f.made);
}

Test(preload_graph_copy_refused_without_room, node_find_in_clone,
     .init = setup) {
  g_with_node();
  cr_assert_eq(cuGraphClone(&f.made, f.g), 0);
  /* The table of child graph nodes full (node and gnode in it): child
   * graph nodes added until one is refused for want of room (whatever the
   * table's first room or growth, graphs.c), the last refused changing
   * nothing. */
  refuse_realloc = true;
  mp__curesult r = MP__CU_SUCCESS;
  for (unsigned i = 0; r == MP__CU_SUCCESS && i < 1u << 16; i++) {
    mp__cugraphnode n = NULL;
    r = cuGraphAddChildGraphNode(&n, f.parent, NULL, 0, f.empty);
  }
  refuse_realloc = false;
  cr_assert_eq(r, MP__CU_OUT_OF_MEMORY,
               "the table of child graph nodes never full: %u", r);
  refused_then_made(find_in_clone, "cuGraphNodeFindInClone");
}

/* cuda.h, CUDA_CONDITIONAL_NODE_PARAMS in CUgraphNodeParams: the handle at
 * 16, type (CU_GRAPH_COND_TYPE_IF: 0) at 24, size, phGraph_out, ctx. */
static mp__curesult add_cond(void) {
  return cuGraphAddNode(&f.made_node, f.g, NULL, 0, child_g());
}

Test(preload_graph_copy_refused_without_room, add_conditional_node,
     .init = setup) {
  mp__curesult (*handle)(unsigned long long *, mp__cugraph, void *, unsigned,
                         unsigned) = NULL;
  *(void **)&handle = driver_fn("cuGraphConditionalHandleCreate");
  unsigned long long h = 0;
  cr_assert(handle != NULL && handle(&h, f.g, NULL, 0, 0) == 0);
  memset(&params, 0, sizeof params);
  memcpy(params.b, &(unsigned){MP__GRAPH_NODE_TYPE_COND}, sizeof(unsigned));
  memcpy(params.b + 16, &h, sizeof h);
  memcpy(params.b + MP__NODE_PARAMS_COND_SIZE, &(unsigned){1},
         sizeof(unsigned));
  refused_then_made(add_cond, "cuGraphAddNode (conditional)");
}
