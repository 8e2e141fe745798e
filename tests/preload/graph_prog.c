/* graph_prog.c - a driver-API program that captures a graph with
 * stream-ordered allocations in it (a decode step: temporaries allocated,
 * written and freed on the capturing stream, an output kept), replays it,
 * and lets it go; linked with the fake libcuda.so.1 (tests/fakecuda), run
 * with or without the shim. Checks, whoever serves the memory:
 *  - the global-mode capture ends with CUDA_SUCCESS;
 *  - replays write the output at its captured address;
 *  - the output is a graph allocation (cuda.h, cuGraphAddMemAllocNode,
 *    cuGraphLaunch): each launch allocates it and the program frees it
 *    before the next launch, which fails while it is still allocated; on
 *    the fake (with or without the shim) a free before the first launch
 *    and a second free are refused; the output launched last and held
 *    outlives the graph and its executable, and is freed after them. A
 *    second argument "auto" instantiates with
 *    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH instead: launches
 *    with the output allocated are allowed, and it is freed once, last;
 *  - (under the shim, argument "pool") memory handed out during the
 *    capture is not handed out after it until the graph and its executable
 *    are destroyed (nor while the program holds the output after them);
 *    afterwards it is. A second argument "params"
 *    instantiates with cuGraphInstantiateWithParams instead and destroys
 *    the graph at once: the executable alone must hold the memory; so do
 *    "v1", "v2" and "proc11", with the forms before CUDA 12.0 (an error
 *    node and a log buffer): the symbols cuGraphInstantiate and
 *    cuGraphInstantiate_v2 as a program built with older headers binds
 *    them, and what cuGetProcAddress answers for "cuGraphInstantiate" at
 *    11000 (the CUDA 11 runtime's cudaGraphInstantiate). A
 *    second argument "ptsz" allocates and frees in the capture with the
 *    per-thread-default-stream entry points (cuMemAllocAsync_ptsz, as a
 *    library built with --default-stream per-thread does) on the same
 *    explicit stream, and ends the capture with the plain entry point.
 *    A second argument "to_graph_twice" instead captures twice into one
 *    graph the program made (cuStreamBeginCaptureToGraph), each capture
 *    allocating an output on the stream, replays the graph and destroys
 *    it with its executable (the test reads the report: no graph pool
 *    may be left); on the fake, a cuGraphDestroy of the graph during the
 *    second capture must be refused. A second argument "many_execs"
 *    instantiates the captured graph NEXECS times (more than the shim's
 *    first table of executables holds), then destroys the graph and every
 *    executable but the last: that one alone must hold the memory, and
 *    its destruction must give it back. "consumer": another graph frees
 *    the output (consumer() below); "to_graph_free": a second capture
 *    into the graph frees the first's allocation (to_graph_free()). The
 *    test reads the report for both: no graph pool may be left.
 *    "refused_end", "side_stream" and "invalidated_side": the functions
 *    of those names; "clone", "child" and "update": copy_outlives() and
 *    updated_from(); "copy_chain" and "update_refused": the functions of
 *    those names; "add_node" (copy_outlives() with cuGraphAddNode;
 *    "add_node_proc" with what cuGetProcAddress answers for it),
 *    "add_node_move" (moved_in()), "exec_child_set" and "exec_node_set"
 *    (child_set()), "embedded" (embedded_outlives()), "node_set"
 *    (node_set()), "clone_parent" (clone_parent()),
 *    "destroyed_capture" (destroyed_capture()), "conditional_body"
 *    (conditional_body()) and "destroyed_body" (destroyed_body()).
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "prog_try.h"

/* The per-thread-default-stream twins, which cuda.h declares only to
 * programs built that way. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);

/* The fake's count of its own entry point; absent on a real driver (the
 * GPU twin in gpu/run_gpu.sh), where what only the fake promises is left
 * out. */
__attribute__((weak)) long long cuFakeGetCallCount(const char *name);

#define NTMP   6
#define BYTES  ((size_t)1 << 20)
#define NPROBE 24

static CUdeviceptr lo = ~(CUdeviceptr)0, hi;

static void note(CUdeviceptr p, size_t n) {
  if (p < lo)
    lo = p;
  if (p + n > hi)
    hi = p + n;
}

/* Allocates NPROBE buffers on s and frees them: how many land in the
 * memory the capture got. */
static int probe(CUstream s, int *inside) {
  CUdeviceptr p[NPROBE];
  *inside = 0;
  for (int i = 0; i < NPROBE; i++) {
    MP_TRY(cuMemAllocAsync(&p[i], BYTES, s));
    *inside += p[i] >= lo && p[i] < hi;
  }
  for (int i = 0; i < NPROBE; i++)
    MP_TRY(cuMemFreeAsync(p[i], s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

/* probe() on s, which must get none of the capture's memory while `what`
 * holds it: 0, or 1 after saying so. */
static int probe_none(CUstream s, const char *what) {
  int inside;
  if (probe(s, &inside) != 0)
    return 1;
  if (inside != 0)
    printf("%d of %d allocations got the graph's memory while %s\n", inside,
           NPROBE, what);
  return inside != 0;
}

/* g destroyed, then probe_none: what still holds g's graph pool keeps it. */
static int destroyed_then_none(CUgraph g, CUstream other, const char *what) {
  MP_TRY(cuGraphDestroy(g));
  return probe_none(other, what);
}

/* After the graph and its executables went: the device idle first, so
 * that whether the probe gets the graph's memory does not hang on when the
 * streams' last markers complete (a stream of the fake runs on a thread
 * of its own: under TSan on a loaded machine the probe came before them
 * and grew instead, once in a CI run). */
static int probe_after(CUstream s, int *inside) {
  MP_TRY(cuCtxSynchronize());
  return probe(s, inside);
}

#define NEXECS 300

/* Captures on s a step into *g: a temporary allocated, written and
 * freed, and an output *out (4096 bytes of 42) kept; both noted. */
static int capture_step(CUstream s, CUdeviceptr *out, CUgraph *g) {
  CUdeviceptr t;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(out, 4096, s));
  note(*out, 4096);
  MP_TRY(cuMemAllocAsync(&t, BYTES, s));
  note(t, BYTES);
  MP_TRY(cuMemsetD8Async(t, 1, BYTES, s));
  MP_TRY(cuMemsetD8Async(*out, 42, 4096, s));
  MP_TRY(cuMemFreeAsync(t, s));
  MP_TRY(cuStreamEndCapture(s, g));
  return 0;
}

/* The "many_execs" mode (above), probing on other. */
static int many_execs(CUstream s, CUstream other) {
  static CUgraphExec x[NEXECS];
  CUdeviceptr out;
  CUgraph g;
  int inside;
  if (capture_step(s, &out, &g) != 0)
    return 1;
  for (int i = 0; i < NEXECS; i++)
    MP_TRY(cuGraphInstantiate(&x[i], g, 0));
  MP_TRY(cuGraphDestroy(g));
  for (int i = 0; i < NEXECS - 1; i++)
    MP_TRY(cuGraphExecDestroy(x[i]));
  MP_TRY(cuGraphLaunch(x[NEXECS - 1], s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamSynchronize(s));
  if (probe_none(other, "its last executable lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x[NEXECS - 1]));
  if (probe_after(other, &inside) != 0)
    return 1;
  if (inside == 0) {
    puts("the graph's memory did not come back after its last executable");
    return 1;
  }
  return 0;
}

/* Two captures into one graph, each with an allocation; the graph
 * replayed, then destroyed with its executable. */
static int into_one_graph_twice(CUstream s, CUstream other) {
  (void)other;
  CUgraph g, out = NULL;
  CUgraphExec x;
  CUdeviceptr o[2];
  unsigned char h[2];
  MP_TRY(cuGraphCreate(&g, 0));
  for (int k = 0; k < 2; k++) {
    MP_TRY(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0,
                                       CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_TRY(cuMemAllocAsync(&o[k], 4096, s));
    MP_TRY(cuMemsetD8Async(o[k], (unsigned char)(42 + k), 4096, s));
    /* cuda.h, cuStreamGetCaptureInfo: destroy is not permitted on the
     * graph "while the capture sequence is in progress"; the fake refuses
     * it, and the shim must pass the refusal on with the graph, and the
     * first capture's graph pool, left as they were (a real driver's
     * answer is undocumented: not asked there). */
    CUresult r = k == 1 && cuFakeGetCallCount != NULL
                     ? cuGraphDestroy(g)
                     : CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_ERROR_INVALID_VALUE) {
      printf("cuGraphDestroy of the graph being captured into: error %d, "
             "not refused\n",
             (int)r);
      return 1;
    }
    MP_TRY(cuStreamEndCapture(s, &out));
    if (out != g) {
      puts("cuStreamEndCapture gave another graph than the one captured into");
      return 1;
    }
  }
  MP_TRY(cuGraphInstantiate(&x, g, 0));
  MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuMemcpyDtoH(&h[0], o[0] + 4095, 1));
  MP_TRY(cuMemcpyDtoH(&h[1], o[1] + 4095, 1));
  if (h[0] != 42 || h[1] != 43) {
    printf("the replay wrote %d and %d\n", h[0], h[1]);
    return 1;
  }
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(g));
  for (int k = 0; k < 2; k++)
    MP_TRY(cuMemFreeAsync(o[k], s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

/* The "consumer" mode: graph G1 allocates an output, graph G2 writes and
 * frees it (cuda.h, cuGraphAddMemAllocNode: an allocation not freed in its
 * graph can be freed by "launching a graph with a free node for that
 * allocation"); X1 and X2 launched in turn, then X1 alone after G2 went,
 * and the program frees the output. */
static int consumer(CUstream s, CUstream other) {
  (void)other;
  CUdeviceptr out;
  CUgraph g1, g2;
  CUgraphExec x1, x2;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&out, 4096, s));
  MP_TRY(cuMemsetD8Async(out, 42, 4096, s));
  MP_TRY(cuStreamEndCapture(s, &g1));
  MP_TRY(cuGraphInstantiate(&x1, g1, 0));
  MP_TRY(cuGraphLaunch(x1, s));
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemsetD8Async(out, 7, 4096, s));
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamEndCapture(s, &g2));
  MP_TRY(cuGraphInstantiate(&x2, g2, 0));
  unsigned char h = 0;
  for (int k = 0; k < 4; k++) {
    MP_TRY(cuGraphLaunch(x2, s));
    if (k == 3)
      break;
    MP_TRY(cuGraphLaunch(x1, s));
    MP_TRY(cuStreamSynchronize(s));
    MP_TRY(cuMemcpyDtoH(&h, out, 1));
    if (h != 42) {
      printf("round %d: the output reads %d\n", k, h);
      return 1;
    }
  }
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuGraphExecDestroy(x2));
  MP_TRY(cuGraphDestroy(g2));
  MP_TRY(cuGraphLaunch(x1, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuMemcpyDtoH(&h, out + 4095, 1));
  if (h != 42) {
    printf("after the freeing graph went the output reads %d\n", h);
    return 1;
  }
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuGraphExecDestroy(x1));
  MP_TRY(cuGraphDestroy(g1));
  return 0;
}

/* The "to_graph_free" mode: two captures into one graph, the second
 * freeing what the first allocated ("freed in the same graph", cuda.h,
 * cuGraphAddMemAllocNode), before any launch; the graph launched three
 * times, the program freeing nothing. */
static int to_graph_free(CUstream s, CUstream other) {
  (void)other;
  CUgraph g, out;
  CUgraphExec x;
  CUdeviceptr o;
  MP_TRY(cuGraphCreate(&g, 0));
  MP_TRY(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0,
                                     CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&o, 4096, s));
  MP_TRY(cuStreamEndCapture(s, &out));
  MP_TRY(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0,
                                     CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemsetD8Async(o, 3, 4096, s));
  MP_TRY(cuMemFreeAsync(o, s));
  MP_TRY(cuStreamEndCapture(s, &out));
  MP_TRY(cuGraphInstantiate(&x, g, 0));
  for (int k = 0; k < 3; k++)
    MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(g));
  return 0;
}

/* capture_step() twice, into *g1 and *g2; the probes watch g2's memory
 * alone. */
static int capture_two(CUstream s, CUdeviceptr *out1, CUgraph *g1,
                       CUdeviceptr *out2, CUgraph *g2) {
  if (capture_step(s, out1, g1) != 0)
    return 1;
  lo = ~(CUdeviceptr)0;
  hi = 0;
  return capture_step(s, out2, g2);
}

/* Launches x on s: its output out (capture_step's) must read 42; then
 * frees it. */
static int launch_reads(CUgraphExec x, CUstream s, CUdeviceptr out) {
  unsigned char h[4096];
  MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuMemcpyDtoH(h, out, sizeof h));
  if (h[0] != 42 || h[4095] != 42) {
    printf("the replay did not write the output (%d)\n", h[0]);
    return 1;
  }
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

/* After the copies and executables holding the capture's memory went,
 * probing on other: the memory must be back (1 after saying so if not). */
static int memory_back(CUstream other) {
  int inside;
  if (probe_after(other, &inside) != 0)
    return 1;
  if (inside == 0)
    puts("the graph's memory did not come back after its last holder went");
  return inside == 0;
}

/* Instantiates holder, a graph holding the captured step's memory, and
 * launches it (launch_reads: out is the step's output; `also`, unless 0,
 * another output its launch allocates, freed after); after its
 * executable goes, holder must still keep the memory from others (`what`
 * says why), and its destruction here must give it back. */
static int holder_replays_also(CUstream s, CUstream other, CUgraph holder,
                               CUdeviceptr out, const char *what,
                               CUdeviceptr also) {
  CUgraphExec x;
  MP_TRY(cuGraphInstantiate(&x, holder, 0));
  if (launch_reads(x, s, out) != 0)
    return 1;
  if (also != 0) {
    MP_TRY(cuMemFreeAsync(also, s));
    MP_TRY(cuStreamSynchronize(s));
  }
  MP_TRY(cuGraphExecDestroy(x));
  if (probe_none(other, what) != 0)
    return 1;
  MP_TRY(cuGraphDestroy(holder));
  return memory_back(other);
}

static int holder_replays(CUstream s, CUstream other, CUgraph holder,
                          CUdeviceptr out, const char *what) {
  return holder_replays_also(s, other, holder, out, what, 0);
}

/* The "clone" and "child" modes: a copy of a captured graph, a clone
 * (cuGraphClone) or a graph with a child graph node made from it
 * (cuGraphAddChildGraphNode, which "clones" the child: cuda.h), outlives
 * the graph. cuda.h allows neither for a graph with memory nodes: without
 * the shim the driver refuses the copy (checked, and nothing more to do).
 * Under the shim the graph has none, the driver copies it, and the copy's
 * replays use the graph pool's memory: it must stay out of others' hands
 * until the copy and its executable are destroyed, then come back. The
 * shim released it with the original graph. */
static int copy_outlives(CUstream s, CUstream other, bool pool, int child) {
  CUdeviceptr out;
  CUgraph g, copy = NULL;
  CUgraphNode node;
  if (capture_step(s, &out, &g) != 0)
    return 1;
  CUresult r;
  if (child >= 2) { /* "add_node": cuGraphAddNode (_v2), cloned in */
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
    p.graph.graph = g;
    p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE;
    MP_TRY(cuGraphCreate(&copy, 0));
    /* "add_node_proc": as cuGetProcAddress answers it at 12030 (how the
     * runtime's cudaGraphAddNode reaches it, cudaTypedefs.h:
     * PFN_cuGraphAddNode_v12030). */
    PFN_cuGraphAddNode_v12030 add = cuGraphAddNode;
    CUdriverProcAddressQueryResult st;
    if (child == 3)
      MP_TRY(cuGetProcAddress("cuGraphAddNode", (void **)&add, 12030, 0, &st));
    r = add(&node, copy, NULL, NULL, 0, &p);
  } else if (child) {
    MP_TRY(cuGraphCreate(&copy, 0));
    r = cuGraphAddChildGraphNode(&node, copy, NULL, 0, g);
  } else {
    r = cuGraphClone(&copy, g);
  }
  if (!pool) { /* the driver's own memory nodes */
    if (r == CUDA_SUCCESS) {
      puts("a graph with memory nodes was copied");
      return 1;
    }
    if (copy != NULL)
      MP_TRY(cuGraphDestroy(copy));
    MP_TRY(cuGraphDestroy(g));
    return 0;
  }
  MP_TRY(r);
  if (destroyed_then_none(g, other, "a copy of its graph lives") != 0)
    return 1;
  return holder_replays(s, other, copy, out, "a copy of its graph lives");
}

static int clone_outlives(CUstream s, CUstream other, bool pool) {
  return copy_outlives(s, other, pool, 0);
}

static int child_outlives(CUstream s, CUstream other, bool pool) {
  return copy_outlives(s, other, pool, 1);
}

static int add_node_outlives(CUstream s, CUstream other, bool pool) {
  return copy_outlives(s, other, pool, 2);
}

static int add_node_proc_outlives(CUstream s, CUstream other, bool pool) {
  return copy_outlives(s, other, pool, 3);
}

/* The "add_node_move" mode: a captured graph moved into a parent's child
 * graph node (cuGraphAddNode, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE: "The
 * handle to the child graph is owned by the parent and will be destroyed
 * when the parent is destroyed", and "Cannot be independently
 * instantiated or destroyed", cuda.h). The parent and its executable
 * hold the memory; the parent's destruction must give it back. The shim
 * did not see the move: the graph pool stayed the moved graph's, which
 * the program never destroys, until exit. Without the shim the graph has
 * memory nodes, which cuda.h lets a move take (the fake does not model
 * it): the mode ends after the driver's answer, whichever. */
static int moved_in(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out;
  CUgraph g, parent;
  CUgraphNode node;
  if (capture_step(s, &out, &g) != 0)
    return 1;
  MP_TRY(cuGraphCreate(&parent, 0));
  CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
  p.graph.graph = g;
  p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
  CUresult r = cuGraphAddNode(&node, parent, NULL, NULL, 0, &p);
  if (!pool) {
    if (r != CUDA_SUCCESS)
      MP_TRY(cuGraphDestroy(g));
    MP_TRY(cuGraphDestroy(parent));
    return 0;
  }
  MP_TRY(r);
  if (cuFakeGetCallCount != NULL &&
      cuGraphDestroy(g) != CUDA_ERROR_INVALID_VALUE) {
    puts("a graph moved into a child graph node was destroyed on its own");
    return 1;
  }
  if (probe_none(other, "the graph it was moved into lives") != 0)
    return 1;
  return holder_replays(s, other, parent, out,
                        "the graph it was moved into lives");
}

/* The "exec_child_set" and "exec_node_set" modes (under the shim only: a
 * graph with memory nodes is no child): the executable x of a parent with
 * a child graph node made from one captured graph (g1) is given another's
 * (g2, the same step captured again) in that node: cuda.h,
 * cuGraphExecChildGraphNodeSetParams, "as though the nodes contained in
 * hNode's graph had the parameters contained in childGraph's nodes", and
 * cuGraphExecNodeSetParams with CUDA_CHILD_GRAPH_NODE_PARAMS. g2 then
 * goes: x's replays use g2's memory, which must stay out of others' hands
 * until x goes. The shim released it with g2. x holds g1's as before (its
 * launch allocates both outputs, freed after). */
static int child_set(CUstream s, CUstream other, bool node_params) {
  CUdeviceptr out1, out2;
  CUgraph g1, g2, parent;
  CUgraphNode node;
  CUgraphExec x;
  if (capture_two(s, &out1, &g1, &out2, &g2) != 0)
    return 1;
  MP_TRY(cuGraphCreate(&parent, 0));
  MP_TRY(cuGraphAddChildGraphNode(&node, parent, NULL, 0, g1));
  MP_TRY(cuGraphInstantiate(&x, parent, 0));
  if (node_params) {
    CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
    p.graph.graph = g2;
    MP_TRY(cuGraphExecNodeSetParams(x, node, &p));
  } else {
    MP_TRY(cuGraphExecChildGraphNodeSetParams(x, node, g2));
  }
  if (destroyed_then_none(g2, other,
                          "an executable given its parameters lives") != 0)
    return 1;
  if (launch_reads(x, s, out2) != 0)
    return 1;
  MP_TRY(cuMemFreeAsync(out1, s));
  MP_TRY(cuStreamSynchronize(s));
  if (probe_none(other, "an executable given its parameters lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(parent));
  MP_TRY(cuGraphDestroy(g1));
  return memory_back(other);
}

static int exec_child_set(CUstream s, CUstream other, bool pool) {
  (void)pool;
  return child_set(s, other, false);
}

static int exec_node_set(CUstream s, CUstream other, bool pool) {
  (void)pool;
  return child_set(s, other, true);
}

/* The "node_set" mode (under the shim only: a graph with memory nodes is
 * no child): a parent's child graph node made from one captured graph
 * (g1) is given another's (g2, the same step captured again) by
 * cuGraphNodeSetParams with CUDA_CHILD_GRAPH_NODE_PARAMS ("The child graph
 * to clone into the node", cuda.h); g2 then goes. The parent's replays
 * use g2's memory, which must stay out of others' hands until the parent
 * and its executable go. The shim did not hook the call and released
 * g2's graph pool with g2. */
static int node_set(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out1, out2;
  CUgraph g1, g2, parent;
  CUgraphNode node;
  (void)pool;
  if (capture_two(s, &out1, &g1, &out2, &g2) != 0)
    return 1;
  MP_TRY(cuGraphCreate(&parent, 0));
  MP_TRY(cuGraphAddChildGraphNode(&node, parent, NULL, 0, g1));
  CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
  p.graph.graph = g2;
  p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE;
  MP_TRY(cuGraphNodeSetParams(node, &p));
  if (destroyed_then_none(g2, other, "a graph given its parameters lives") != 0)
    return 1;
  MP_TRY(cuGraphDestroy(g1));
  /* The shim's launch allocates g1's output too (the parent holds both). */
  return holder_replays_also(s, other, parent, out2,
                             "a graph given its parameters lives", out1);
}

/* capture_step() into a graph made the child of a new graph *parent (its
 * node *node, cuGraphAddChildGraphNode), then destroyed: the parent alone
 * holds the step's memory. */
static int step_in_parent(CUstream s, CUdeviceptr *out, CUgraph *parent,
                          CUgraphNode *node) {
  CUgraph g;
  if (capture_step(s, out, &g) != 0)
    return 1;
  MP_TRY(cuGraphCreate(parent, 0));
  MP_TRY(cuGraphAddChildGraphNode(node, *parent, NULL, 0, g));
  MP_TRY(cuGraphDestroy(g));
  return 0;
}

/* The "clone_parent" mode (under the shim only): a clone (cuGraphClone)
 * of a parent whose child graph node was made from a captured graph; the
 * clone's copy of the node (cuGraphNodeFindInClone) and the graph it
 * embeds (cuGraphChildGraphNodeGetGraph), cloned in turn. The child
 * graph, the parent, then the first clone go: each copy replays the
 * captured step's memory, which must stay out of others' hands until the
 * last copy and its executable go. */
static int clone_parent(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out;
  CUgraph parent, c, ce, cc;
  CUgraphNode node, cn;
  (void)pool;
  if (step_in_parent(s, &out, &parent, &node) != 0)
    return 1;
  MP_TRY(cuGraphClone(&c, parent));
  MP_TRY(cuGraphNodeFindInClone(&cn, node, c));
  MP_TRY(cuGraphChildGraphNodeGetGraph(cn, &ce));
  MP_TRY(cuGraphClone(&cc, ce));
  if (destroyed_then_none(parent, other, "a clone of its parent lives") != 0)
    return 1;
  if (destroyed_then_none(c, other, "a clone of its clone's child lives") != 0)
    return 1;
  return holder_replays(s, other, cc, out,
                        "a clone of its clone's child lives");
}

/* The "embedded" mode (under the shim only): the graph embedded in a
 * child graph node (cuda.h, cuGraphChildGraphNodeGetGraph: "This call
 * does not clone the graph"), cloned and instantiated; the parent then
 * goes, and the embedded graph with it. The clone and the executable
 * replay the captured step's memory: it must stay out of others' hands
 * until both go. The shim knew neither as a holder and released the
 * graph pool with the parent. */
static int embedded_outlives(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out;
  CUgraph parent, e, c;
  CUgraphNode node;
  CUgraphExec x;
  (void)pool;
  if (step_in_parent(s, &out, &parent, &node) != 0)
    return 1;
  MP_TRY(cuGraphChildGraphNodeGetGraph(node, &e));
  MP_TRY(cuGraphClone(&c, e));
  MP_TRY(cuGraphInstantiate(&x, e, 0));
  if (destroyed_then_none(parent, other, "copies of its embedded graph live") !=
      0)
    return 1;
  if (launch_reads(x, s, out) != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  if (probe_none(other, "a clone of its embedded graph lives") != 0)
    return 1;
  MP_TRY(cuGraphDestroy(c));
  return memory_back(other);
}

/* A new graph *parent with a conditional node *node (cuGraphAddNode,
 * CU_GRAPH_NODE_TYPE_CONDITIONAL, one body: *body, its phGraph_out[0],
 * "CUDA-owned", "Valid for the lifetime of the conditional node"). */
static int conditional_parent(CUgraph *parent, CUgraphNode *node,
                              CUgraph *body) {
  CUgraphConditionalHandle h;
  CUcontext cur;
  MP_TRY(cuCtxGetCurrent(&cur));
  MP_TRY(cuGraphCreate(parent, 0));
  MP_TRY(cuGraphConditionalHandleCreate(&h, *parent, cur, 1,
                                        CU_GRAPH_COND_ASSIGN_DEFAULT));
  CUgraphNodeParams p = {.type = CU_GRAPH_NODE_TYPE_CONDITIONAL};
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = cur;
  MP_TRY(cuGraphAddNode(node, *parent, NULL, NULL, 0, &p));
  *body = p.conditional.phGraph_out[0];
  return 0;
}

/* Captures into graph g on s (cuStreamBeginCaptureToGraph) a temporary
 * allocated, written and freed, noted; the capture must end with g. On
 * the fake, a destroy of `busy` (unless NULL: the node whose graph g is)
 * during the capture must be refused (cuda.h, cuStreamGetCaptureInfo:
 * "All operations other than destroy and node removal are permitted on
 * the graph while the capture sequence is in progress"), changing
 * nothing. */
static int capture_temporary_into(CUstream s, CUgraph g, CUgraphNode busy) {
  CUgraph ended = NULL;
  CUdeviceptr t;
  MP_TRY(cuStreamBeginCaptureToGraph(s, g, NULL, NULL, 0,
                                     CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&t, BYTES, s));
  note(t, BYTES);
  MP_TRY(cuMemsetD8Async(t, 4, BYTES, s));
  MP_TRY(cuMemFreeAsync(t, s));
  if (busy != NULL && cuFakeGetCallCount != NULL &&
      cuGraphDestroyNode(busy) != CUDA_ERROR_INVALID_VALUE) {
    puts("a node whose graph a capture builds was destroyed");
    return 1;
  }
  MP_TRY(cuStreamEndCapture(s, &ended));
  if (ended != g) {
    puts("a capture into a graph did not end with it");
    return 1;
  }
  return 0;
}

/* conditional_parent(), capture_temporary_into() its body (busy: the
 * node's destroy tried during the capture), then *x instantiated from the
 * parent and launched on s, done. */
static int body_launched(CUstream s, bool busy, CUgraph *parent,
                         CUgraphNode *node, CUgraph *body, CUgraphExec *x) {
  if (conditional_parent(parent, node, body) != 0 ||
      capture_temporary_into(s, *body, busy ? *node : NULL) != 0)
    return 1;
  MP_TRY(cuGraphInstantiate(x, *parent, 0));
  MP_TRY(cuGraphLaunch(*x, s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

/* The "conditional_body" mode (under the shim only: without it the
 * capture makes memory nodes, which a body may not hold, cuda.h,
 * CUDA_CONDITIONAL_NODE_PARAMS: "Allowed node types are kernel nodes,
 * empty nodes, child graphs, memsets, memcopies, and conditionals"): a
 * capture (cuStreamBeginCaptureToGraph) into the body graph of a
 * conditional node (cuGraphAddNode, CU_GRAPH_NODE_TYPE_CONDITIONAL: its
 * phGraph_out, "CUDA-owned", "Valid for the lifetime of the conditional
 * node") allocates, writes and frees a temporary; the parent is
 * instantiated, then destroyed, the body with it. The executable replays
 * the body: the memory must stay out of others' hands until it goes, then
 * come back. The shim tied the graph pool to the body, which no
 * executable of the parent held and the program never destroys: it lived
 * until exit. */
static int conditional_body(CUstream s, CUstream other, bool pool) {
  CUgraph parent, body;
  CUgraphNode node;
  CUgraphExec x;
  (void)pool;
  if (body_launched(s, false, &parent, &node, &body, &x) != 0)
    return 1;
  if (destroyed_then_none(parent, other,
                          "an executable of its body's parent lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  return memory_back(other);
}

/* The "destroyed_body" mode (under the shim only, as conditional_body): a
 * capture into the body graph of a conditional node; the parent
 * instantiated and launched, then the node destroyed (cuda.h,
 * cuGraphDestroyNode: "Removes hNode from its graph"; its bodies are
 * "Valid for the lifetime of the conditional node",
 * CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out). The executable made before
 * keeps the node (cuda.h, cuGraphExecNodeSetParams: "hNode must not have
 * been removed from the original graph", the executable still holding
 * it), so the memory stays out of others' hands until it goes; then it
 * must come back with the parent still alive, which replays the body no
 * more. Next a new graph (which may get the body's handle) captured into
 * and destroyed: its memory must come back too. On the fake, first a
 * destroy of the node during the capture into its body, refused
 * (capture_temporary_into), must change nothing. The shim had no
 * cuGraphDestroyNode: the graph pool stayed held until the parent was
 * destroyed (0 of 24 probes got its memory), and a new graph given the
 * body's handle had its captures held by the parent. */
static int destroyed_body(CUstream s, CUstream other, bool pool) {
  CUgraph parent, body, g;
  CUgraphNode node;
  CUgraphExec x;
  (void)pool;
  if (body_launched(s, true, &parent, &node, &body, &x) != 0)
    return 1;
  MP_TRY(cuGraphDestroyNode(node));
  if (probe_none(other, "an executable made before its node went lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  if (memory_back(other) != 0)
    return 1;
  MP_TRY(cuGraphCreate(&g, 0));
  if (g == body) /* where the driver reuses it: what the mode is after */
    fputs("the new graph got the destroyed body's handle\n", stderr);
  if (capture_temporary_into(s, g, NULL) != 0)
    return 1;
  MP_TRY(cuGraphDestroy(g));
  if (memory_back(other) != 0)
    return 1;
  MP_TRY(cuGraphDestroy(parent));
  return 0;
}

/* The "update" mode: an executable of one captured graph (g1) updated
 * from another (g2, the same step captured again: cuGraphExecUpdate,
 * "topologically identical"), g2 then destroyed. The executable's
 * replays use g2's memory and allocate g2's output, not g1's: g2's memory
 * must stay out of others' hands until the executable goes. Without the
 * shim the graphs have memory nodes, whose update the fake refuses (not
 * modelled; what a GPU does is its own): the mode ends after the update,
 * whatever it said. The shim released g2's graph pool with g2. */
static int updated_from(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out1, out2;
  CUgraph g1, g2;
  CUgraphExec x;
  if (capture_two(s, &out1, &g1, &out2, &g2) != 0)
    return 1;
  MP_TRY(cuGraphInstantiate(&x, g1, 0));
  CUgraphExecUpdateResultInfo info;
  CUresult r = cuGraphExecUpdate(x, g2, &info);
  if (!pool) { /* the driver's own memory nodes: its answer, whichever */
    MP_TRY(cuGraphExecDestroy(x));
    MP_TRY(cuGraphDestroy(g1));
    MP_TRY(cuGraphDestroy(g2));
    return 0;
  }
  MP_TRY(r);
  if (destroyed_then_none(g2, other, "an executable updated from it lives") !=
      0)
    return 1;
  for (int k = 0; k < 2; k++) /* the second: g1's output is not live */
    if (launch_reads(x, s, out2) != 0)
      return 1;
  if (cuFakeGetCallCount != NULL &&
      cuMemFreeAsync(out1, s) != CUDA_ERROR_INVALID_VALUE) {
    puts("a free of the output of the graph before the update succeeded");
    return 1;
  }
  if (probe_none(other, "an executable updated from it lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(g1));
  return memory_back(other);
}

/* The "copy_chain" mode (under the shim only: a graph with memory nodes
 * has no copies): copies of copies hold the graph pool as the first copy
 * does. A clone of a clone, a parent with both as children (the second
 * adds nothing to hold), and a clone of the parent; every graph but the
 * last destroyed, the original first among them: the last copy, then its
 * executable, must keep the memory out of others' hands, and its
 * destruction must give it back. */
static int copy_chain(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out;
  CUgraph g, c1, c2, parent, pc;
  CUgraphNode node;
  CUgraphExec x;
  (void)pool;
  if (capture_step(s, &out, &g) != 0)
    return 1;
  MP_TRY(cuGraphClone(&c1, g));
  MP_TRY(cuGraphClone(&c2, c1));
  MP_TRY(cuGraphCreate(&parent, 0));
  MP_TRY(cuGraphAddChildGraphNode(&node, parent, NULL, 0, c2));
  MP_TRY(cuGraphAddChildGraphNode(&node, parent, NULL, 0, c1)); /* twice */
  MP_TRY(cuGraphClone(&pc, parent));
  MP_TRY(cuGraphDestroy(c1));
  MP_TRY(cuGraphDestroy(g));
  MP_TRY(cuGraphDestroy(parent));
  if (destroyed_then_none(c2, other, "a clone of a parent lives") != 0)
    return 1;
  MP_TRY(cuGraphInstantiate(&x, pc, 0));
  MP_TRY(cuGraphDestroy(pc));
  if (launch_reads(x, s, out) != 0)
    return 1;
  if (probe_none(other, "an executable of a clone of a parent lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  return memory_back(other);
}

/* The "update_refused" mode (under the shim only): a cuGraphExecUpdate
 * the driver refuses (another topology: cuda.h,
 * CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED) changes nothing. The
 * executable x of g1 does not hold the other graph's graph pool, which
 * comes back with that graph; x still holds g1's after g1 goes, and its
 * launch allocates g1's output. */
static int update_refused(CUstream s, CUstream other, bool pool) {
  CUdeviceptr out1, out2, t;
  CUgraph g1, two;
  CUgraphExec x;
  (void)pool;
  if (capture_step(s, &out1, &g1) != 0)
    return 1;
  lo = ~(CUdeviceptr)0; /* the probe watches the other graph's memory */
  hi = 0;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&out2, 4096, s));
  note(out2, 4096);
  MP_TRY(cuMemAllocAsync(&t, BYTES, s));
  note(t, BYTES);
  MP_TRY(cuMemsetD8Async(t, 3, BYTES, s));
  MP_TRY(cuMemsetD8Async(out2, 5, 4096, s));
  MP_TRY(cuMemsetD8Async(out2, 6, 4096, s));
  MP_TRY(cuMemFreeAsync(t, s));
  MP_TRY(cuStreamEndCapture(s, &two));
  MP_TRY(cuGraphInstantiate(&x, g1, 0));
  CUgraphExecUpdateResultInfo info;
  if (cuGraphExecUpdate(x, two, &info) !=
      CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
    puts("an update from another topology was not refused");
    return 1;
  }
  MP_TRY(cuGraphDestroy(two));
  if (memory_back(other) != 0)
    return 1;
  MP_TRY(cuGraphDestroy(g1));
  if (launch_reads(x, s, out1) != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  return 0;
}

/* The "refused_end" and "side_stream" modes. A capture begun on s forks
 * to other and joins back; its temporary is allocated, written and freed
 * on s, or (side) on other alone, so that the end is on a stream that
 * never allocated in the capture. After the end, with the graph alive,
 * other's allocations must not get the temporary's memory, and the
 * graph's destruction must release its graph pool (the test reads the
 * report).
 *  - refused_end: before the real end, ends the driver refuses while the
 *    capture goes on (cuda.h, cuStreamEndCapture: a NULL phGraph; on the
 *    joined stream, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED). The shim once
 *    took them for the capture's end and gave its graph pool back.
 *  - side_stream: the shim once found the capture by the end's stream
 *    only; it never ended other's route, which went on allocating from
 *    the graph pool, and the graph pool outlived the graph. */
static CUevent fork_ev, join_ev;

/* Begins a global capture on s, forks it to other, allocates, writes and
 * frees a temporary (*t) on `on` and joins other back. */
static int fork_and_allocate(CUstream s, CUstream other, CUstream on,
                             CUdeviceptr *t) {
  MP_TRY(cuEventCreate(&fork_ev, CU_EVENT_DISABLE_TIMING));
  MP_TRY(cuEventCreate(&join_ev, CU_EVENT_DISABLE_TIMING));
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuEventRecord(fork_ev, s));
  MP_TRY(cuStreamWaitEvent(other, fork_ev, 0));
  MP_TRY(cuMemAllocAsync(t, BYTES, on));
  MP_TRY(cuMemsetD8Async(*t, 7, BYTES, on));
  MP_TRY(cuMemFreeAsync(*t, on));
  MP_TRY(cuEventRecord(join_ev, other));
  MP_TRY(cuStreamWaitEvent(s, join_ev, 0));
  return 0;
}

static int forked_capture(CUstream s, CUstream other, bool side) {
  CUdeviceptr t;
  CUgraph g;
  CUgraphExec x;
  if (fork_and_allocate(s, other, side ? other : s, &t) != 0)
    return 1;
  if (!side && (cuStreamEndCapture(s, NULL) == CUDA_SUCCESS ||
                cuStreamEndCapture(other, &g) == CUDA_SUCCESS)) {
    puts("a refused end of the capture succeeded");
    return 1;
  }
  MP_TRY(cuStreamEndCapture(s, &g));
  MP_TRY(cuGraphInstantiate(&x, g, 0));
  CUdeviceptr q[NPROBE];
  int hits = 0;
  for (int i = 0; i < NPROBE; i++) {
    MP_TRY(cuMemAllocAsync(&q[i], BYTES, other));
    hits += q[i] < t + BYTES && t < q[i] + BYTES;
  }
  if (hits != 0) {
    printf("%d allocations got the live graph's memory\n", hits);
    return 1;
  }
  for (int i = 0; i < NPROBE; i++)
    MP_TRY(cuMemFreeAsync(q[i], other));
  MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamSynchronize(other));
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(g));
  MP_TRY(cuEventDestroy(fork_ev));
  MP_TRY(cuEventDestroy(join_ev));
  return 0;
}

static int refused_end(CUstream s, CUstream other) {
  return forked_capture(s, other, false);
}

static int side_stream(CUstream s, CUstream other) {
  return forked_capture(s, other, true);
}

/* The "invalidated_side" mode: the capture of side_stream, allocating on
 * other alone, invalidated before its end by a call global mode prohibits
 * (cuCtxSynchronize: cuda.h, cuThreadExchangeStreamCaptureMode), so that
 * its end has no graph (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). other
 * then allocates outside any capture: from the device's pool, the graph
 * pool released at the end (the test reads the report). The shim found
 * an invalidated capture by the end's stream only, which never allocated:
 * other's route stayed, its allocations went on coming from the graph
 * pool, and the graph pool lived until exit. */
static int invalidated_side(CUstream s, CUstream other) {
  CUdeviceptr t, q[NPROBE];
  CUgraph g = NULL;
  if (fork_and_allocate(s, other, other, &t) != 0)
    return 1;
  if (cuCtxSynchronize() != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
    puts("a cuCtxSynchronize during a global capture was not refused");
    return 1;
  }
  if (cuStreamEndCapture(s, &g) != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
      g != NULL) {
    puts("the end of an invalidated capture did not say so");
    return 1;
  }
  for (int i = 0; i < NPROBE; i++)
    MP_TRY(cuMemAllocAsync(&q[i], BYTES, other));
  for (int i = 0; i < NPROBE; i++)
    MP_TRY(cuMemFreeAsync(q[i], other));
  MP_TRY(cuStreamSynchronize(other));
  MP_TRY(cuEventDestroy(fork_ev));
  MP_TRY(cuEventDestroy(join_ev));
  return 0;
}

/* cuStreamDestroy(s) asked while a context the program made is current:
 * the fake refuses it (CUDA_ERROR_INVALID_HANDLE, a stream of another
 * context), as rules_prog's refused_destroy relies on; 0 when refused. */
static int destroy_refused(CUstream s) {
  CUcontext prim, own;
  MP_TRY(cuCtxGetCurrent(&prim));
#if CUDA_VERSION >= 13000 /* cuCtxCreate is cuCtxCreate_v4 */
  MP_TRY(cuCtxCreate(&own, NULL, 0, 0));
#else
  MP_TRY(cuCtxCreate(&own, 0, 0));
#endif
  CUresult d = cuStreamDestroy(s);
  MP_TRY(cuCtxDestroy(own));
  MP_TRY(cuCtxSetCurrent(prim));
  if (d == CUDA_SUCCESS)
    puts("the driver destroyed a stream of another context");
  return d == CUDA_SUCCESS;
}

/* Allocates NPROBE buffers of BYTES on other, holding them all, then
 * frees them: in *hits, how many met one of the n ranges of BYTES at t. */
static int probe_ranges(CUstream other, const CUdeviceptr *t, int n,
                        int *hits) {
  CUdeviceptr q[NPROBE];
  *hits = 0;
  for (int i = 0; i < NPROBE; i++) {
    MP_TRY(cuMemAllocAsync(&q[i], BYTES, other));
    for (int k = 0; k < n; k++)
      *hits += q[i] < t[k] + BYTES && t[k] < q[i] + BYTES;
  }
  for (int i = 0; i < NPROBE; i++)
    MP_TRY(cuMemFreeAsync(q[i], other));
  MP_TRY(cuStreamSynchronize(other));
  return 0;
}

/* The "refused_destroy" (rounds 1) and "refused_destroy_many" (rounds 10)
 * modes: a relaxed capture on s allocates, writes and frees a temporary,
 * then a destroy of s is refused, each round. The capture ends, its graph
 * is launched and goes; with s and other synchronized, not the device,
 * other must get the temporaries' memory back. The shim forgot s before
 * the real destroy: its pools retired their slots of s with the capture's
 * epoch open (no marker on a capturing stream), so that memory waited for
 * a device synchronize, and each next round listed s again in the
 * capture's 8 routes, the ninth allocation bypassing the pool. */
static int refused_destroy_rounds(CUstream s, CUstream other, int rounds) {
  CUdeviceptr t[10];
  CUgraph g;
  CUgraphExec x;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  for (int k = 0; k < rounds; k++) {
    MP_TRY(cuMemAllocAsync(&t[k], BYTES, s));
    MP_TRY(cuMemsetD8Async(t[k], 5, BYTES, s));
    MP_TRY(cuMemFreeAsync(t[k], s));
    if (destroy_refused(s) != 0)
      return 1;
  }
  MP_TRY(cuStreamEndCapture(s, &g));
  MP_TRY(cuGraphInstantiate(&x, g, 0));
  MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuGraphExecDestroy(x));
  MP_TRY(cuGraphDestroy(g));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamSynchronize(other));
  int hits;
  if (probe_ranges(other, t, rounds, &hits) != 0)
    return 1;
  if (hits == 0)
    puts("the graph's memory did not come back without a device "
         "synchronize after a refused destroy");
  return hits == 0;
}

static int refused_destroy(CUstream s, CUstream other) {
  return refused_destroy_rounds(s, other, 1);
}

static int refused_destroy_many(CUstream s, CUstream other) {
  return refused_destroy_rounds(s, other, 10);
}

/* The "destroyed_capture" mode: a global-mode capture begun on a stream
 * c of its own allocates, writes and frees a temporary, then c is
 * destroyed: cuda.h lists no capture error for cuStreamDestroy, and the
 * fake ends c's capture with it. That capture can never end ("Capture must
 * be ended on the same stream in which it was initiated", cuda.h,
 * cuStreamBeginCapture). Then a cuMemAlloc and a cuMemFree, which the
 * capture would have prohibited (global mode: cuda.h,
 * cuThreadExchangeStreamCaptureMode), are served (the test reads the
 * report: no capture bypass, no graph pool left), and under the shim
 * the temporary's memory comes back: with the pool capped at 24 MiB (the
 * test's MEMPOOL_CONF=max_bytes=24M), other's NPROBE probes of 1 MiB
 * held at once fit only with it, one of them getting it. The shim never
 * learnt of the destroy: the capture stayed begun, so the cuMemAlloc went
 * to the driver and every cuMemFree was checked with a probe, for good,
 * and its graph pool, never released, kept the memory (a probe out of
 * memory). */
static int destroyed_capture(CUstream s, CUstream other, bool pool) {
  CUstream c;
  CUdeviceptr t, p;
  (void)s;
  MP_TRY(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&t, BYTES, c));
  MP_TRY(cuMemsetD8Async(t, 3, BYTES, c));
  MP_TRY(cuMemFreeAsync(t, c));
  MP_TRY(cuStreamDestroy(c));
  MP_TRY(cuMemAlloc(&p, BYTES));
  MP_TRY(cuMemFree(p));
  if (!pool)
    return 0;
  int hits;
  if (probe_ranges(other, &t, 1, &hits) != 0)
    return 1;
  if (hits == 0)
    puts("the memory of a capture whose stream was destroyed did not come "
         "back");
  return hits == 0;
}

/* The "prior_work" mode: a block b allocated on s is used on a stream c
 * of its own by work queued before c begins a capture (a host function
 * that holds c, then a memset of b), freed on c during the capture
 * (cuMemFreeAsync: after c's work so far), then c, the capture's origin,
 * is destroyed. While c's memset is still queued, none of other's NPROBE
 * probes may get b's memory. The pool counted the capture's open epoch on
 * c done with c's last marker, recorded before that work, and handed b to
 * a probe, which c's memset then overwrote. */
static atomic_int prior_go;

static void CUDA_CB prior_hold(void *arg) {
  (void)arg;
  for (int i = 0; i < 3000 && !atomic_load(&prior_go); i++)
    usleep(10000); /* at most 30 s */
}

static int prior_work(CUstream s, CUstream other) {
  CUstream c;
  CUdeviceptr b;
  MP_TRY(cuMemAllocAsync(&b, BYTES, s));
  MP_TRY(cuMemsetD8Async(b, 1, BYTES, s));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuLaunchHostFunc(c, prior_hold, NULL));
  MP_TRY(cuMemsetD8Async(b, 7, BYTES, c));
  MP_TRY(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  MP_TRY(cuMemFreeAsync(b, c));
  MP_TRY(cuStreamDestroy(c));
  int hits;
  int st = probe_ranges(other, &b, 1, &hits);
  bool held = !atomic_load(&prior_go);
  atomic_store(&prior_go, 1);
  MP_TRY(cuCtxSynchronize());
  if (st != 0)
    return 1;
  if (hits > 0 && held)
    puts("a block freed during a capture went to another stream while "
         "work queued before the capture still used it");
  return hits > 0 && held;
}

/* cudaTypedefs.h: PFN_cuGraphInstantiate_v10000 and _v11000, the forms
 * before CUDA 12.0 (cuda.h declares them for the driver's own build). */
typedef CUresult (*legacy_instantiate_fn)(CUgraphExec *, CUgraph, CUgraphNode *,
                                          char *, size_t);

/* x from g through the legacy form how names: "v1" and "v2" by symbol,
 * bound as a program's call is (the shim's first when preloaded), "proc11"
 * through cuGetProcAddress at 11000. */
static int instantiate_legacy(const char *how, CUgraphExec *x, CUgraph g) {
  void *f = NULL;
  if (strcmp(how, "proc11") == 0) {
    CUdriverProcAddressQueryResult st;
    MP_TRY(cuGetProcAddress("cuGraphInstantiate", &f, 11000, 0, &st));
  } else {
    f = dlsym(RTLD_DEFAULT, strcmp(how, "v1") == 0 ? "cuGraphInstantiate"
                                                   : "cuGraphInstantiate_v2");
  }
  if (f == NULL) {
    printf("no %s form of cuGraphInstantiate\n", how);
    return 1;
  }
  legacy_instantiate_fn fn;
  memcpy(&fn, &f, sizeof f);
  CUgraphNode err = NULL;
  char log[64] = "?";
  MP_TRY(fn(x, g, &err, log, sizeof log));
  if (err != NULL || log[0] != '\0') {
    printf("%s: an error node or a log on success\n", how);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  bool pool = argc > 1 && strcmp(argv[1], "pool") == 0;
  const char *how = argc > 2 ? argv[2] : "";
  /* Instantiated through another entry point, the graph destroyed at once:
   * the executable alone holds the memory. */
  bool params = strcmp(how, "params") == 0 || strcmp(how, "v1") == 0 ||
                strcmp(how, "v2") == 0 || strcmp(how, "proc11") == 0;
  bool ptsz = argc > 2 && strcmp(argv[2], "ptsz") == 0;
  bool autofree = strcmp(how, "auto") == 0;
  CUresult (*alloc)(CUdeviceptr *, size_t, CUstream) =
      ptsz ? cuMemAllocAsync_ptsz : cuMemAllocAsync;
  CUresult (*release)(CUdeviceptr, CUstream) =
      ptsz ? cuMemFreeAsync_ptsz : cuMemFreeAsync;
  CUcontext ctx;
  CUdevice dev;
  MP_TRY(cuInit(0));
  MP_TRY(cuDeviceGet(&dev, 0));
  MP_TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
  MP_TRY(cuCtxSetCurrent(ctx));
  CUstream s, other;
  MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  /* Warm-up, as engines do before capturing, on both streams: the
   * capture's allocations then meet blocks freed on the other stream, whose
   * work the pool asks about (an event query) during the capture. In global
   * mode that query invalidated the capture on a GPU (gpu_prog.cu under the
   * shim, 2026-11-28), and the fake now refuses it as a real driver does. */
  CUdeviceptr w, wo;
  MP_TRY(cuMemAllocAsync(&w, BYTES, s));
  MP_TRY(cuMemAllocAsync(&wo, 2 * BYTES, other));
  MP_TRY(cuMemFreeAsync(w, s));
  MP_TRY(cuMemFreeAsync(wo, other));
  MP_TRY(cuStreamSynchronize(s));
  MP_TRY(cuStreamSynchronize(other));

  /* The modes with a flow of their own: */
  int (*mode)(CUstream, CUstream) =
      strcmp(how, "consumer") == 0               ? consumer
      : strcmp(how, "to_graph_free") == 0        ? to_graph_free
      : strcmp(how, "to_graph_twice") == 0       ? into_one_graph_twice
      : strcmp(how, "many_execs") == 0           ? many_execs
      : strcmp(how, "refused_end") == 0          ? refused_end
      : strcmp(how, "side_stream") == 0          ? side_stream
      : strcmp(how, "invalidated_side") == 0     ? invalidated_side
      : strcmp(how, "refused_destroy") == 0      ? refused_destroy
      : strcmp(how, "refused_destroy_many") == 0 ? refused_destroy_many
      : strcmp(how, "prior_work") == 0           ? prior_work
                                                 : NULL;
  int (*copy_mode)(CUstream, CUstream, bool) =
      strcmp(how, "clone") == 0               ? clone_outlives
      : strcmp(how, "child") == 0             ? child_outlives
      : strcmp(how, "update") == 0            ? updated_from
      : strcmp(how, "copy_chain") == 0        ? copy_chain
      : strcmp(how, "update_refused") == 0    ? update_refused
      : strcmp(how, "add_node") == 0          ? add_node_outlives
      : strcmp(how, "add_node_proc") == 0     ? add_node_proc_outlives
      : strcmp(how, "add_node_move") == 0     ? moved_in
      : strcmp(how, "exec_child_set") == 0    ? exec_child_set
      : strcmp(how, "exec_node_set") == 0     ? exec_node_set
      : strcmp(how, "embedded") == 0          ? embedded_outlives
      : strcmp(how, "node_set") == 0          ? node_set
      : strcmp(how, "clone_parent") == 0      ? clone_parent
      : strcmp(how, "destroyed_capture") == 0 ? destroyed_capture
      : strcmp(how, "conditional_body") == 0  ? conditional_body
      : strcmp(how, "destroyed_body") == 0    ? destroyed_body
                                              : NULL;
  if (mode != NULL || copy_mode != NULL) {
    if (mode != NULL ? mode(s, other) != 0 : copy_mode(s, other, pool) != 0)
      return 1;
    MP_TRY(cuStreamDestroy(s));
    MP_TRY(cuStreamDestroy(other));
    MP_TRY(cuDevicePrimaryCtxRelease(dev));
    puts("ok");
    return 0;
  }
  CUdeviceptr out, tmp[NTMP];
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(alloc(&out, 4096, s));
  note(out, 4096);
  for (int i = 0; i < NTMP; i++) {
    MP_TRY(alloc(&tmp[i], BYTES, s));
    note(tmp[i], BYTES);
    MP_TRY(cuMemsetD8Async(tmp[i], (unsigned char)i, BYTES, s));
    if (i > 0)
      MP_TRY(release(tmp[i - 1], s));
  }
  MP_TRY(cuMemsetD8Async(out, 42, 4096, s));
  MP_TRY(release(tmp[NTMP - 1], s));
  CUgraph g;
  MP_TRY(cuStreamEndCapture(s, &g));
  CUgraphExec x;
  if (params && strcmp(how, "params") != 0) {
    if (instantiate_legacy(how, &x, g) != 0)
      return 1;
    MP_TRY(cuGraphDestroy(g)); /* the executable stands alone (cuda.h) */
    g = NULL;
  } else if (autofree) {
    MP_TRY(cuGraphInstantiateWithFlags(
        &x, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  } else if (params) {
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {.flags = 0};
    MP_TRY(cuGraphInstantiateWithParams(&x, g, &ip));
    if (ip.result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS) {
      printf("instantiation said %d\n", (int)ip.result_out);
      return 1;
    }
    MP_TRY(cuGraphDestroy(g)); /* the executable stands alone (cuda.h) */
    g = NULL;
  } else {
    MP_TRY(cuGraphInstantiate(&x, g, 0));
  }
  bool fake = cuFakeGetCallCount != NULL;
  /* The output is a graph allocation (cuda.h, cuGraphAddMemAllocNode):
   * each launch allocates it, the program frees it before the next launch
   * (or the executable frees it at launch: "auto"). Before the first
   * launch it is not allocated: a free is refused (the fake's answer and
   * the shim's; cuda.h names none, so not asked of a real driver). */
  if (fake && cuMemFreeAsync(out, s) != CUDA_ERROR_INVALID_VALUE) {
    puts("a free of the output before the first launch was not refused");
    return 1;
  }
  for (int k = 0; k < 3; k++) {
    unsigned char h[4096];
    MP_TRY(cuGraphLaunch(x, s));
    MP_TRY(cuStreamSynchronize(s));
    MP_TRY(cuMemcpyDtoH(h, out, sizeof h));
    if (h[0] != 42 || h[4095] != 42) {
      printf("replay %d did not write the output (%d)\n", k, h[0]);
      return 1;
    }
    /* Zeroed while allocated: the next launch must write it again. */
    MP_TRY(cuMemsetD8(out, 0, sizeof h));
    if (autofree)
      continue;
    /* cuda.h, cuGraphLaunch: with an allocation of the last launch still
     * unfreed, "the launch will fail with CUDA_ERROR_INVALID_VALUE". */
    if (k == 0 && cuGraphLaunch(x, s) != CUDA_ERROR_INVALID_VALUE) {
      puts("a launch with the output still allocated was not refused");
      return 1;
    }
    MP_TRY(release(out, s));
    if (k == 0 && fake && cuMemFreeAsync(out, s) != CUDA_ERROR_INVALID_VALUE) {
      puts("a second free of the output was not refused");
      return 1;
    }
  }
  /* Launched once more and kept: "Graph destruction does not
   * automatically free any live graph-allocated memory" (the Programming
   * Guide, "Graph Memory Nodes"); the program frees it after the graph. */
  MP_TRY(cuGraphLaunch(x, s));
  MP_TRY(cuStreamSynchronize(s));
  int inside = 0;
  if (pool && probe_none(other, "it lives") != 0)
    return 1;
  MP_TRY(cuGraphExecDestroy(x));
  if (g != NULL)
    MP_TRY(cuGraphDestroy(g));
  unsigned char h = 0;
  MP_TRY(cuMemcpyDtoH(&h, out + 4095, 1));
  if (h != 42) {
    printf("the output held after the graph went reads %d\n", h);
    return 1;
  }
  /* The output held keeps the graph's memory from others until freed. */
  if (pool && probe_none(other, "its output is held") != 0)
    return 1;
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamSynchronize(s));
  if (fake && cuMemFreeAsync(out, s) != CUDA_ERROR_INVALID_VALUE) {
    puts("a second free of the output after the graph was not refused");
    return 1;
  }
  if (pool) {
    if (probe_after(other, &inside) != 0)
      return 1;
    if (inside == 0) {
      printf("the graph's memory did not come back after the graph went\n");
      return 1;
    }
  }
  MP_TRY(cuStreamDestroy(s));
  MP_TRY(cuStreamDestroy(other));
  MP_TRY(cuDevicePrimaryCtxRelease(dev));
  puts("ok");
  return 0;
}
