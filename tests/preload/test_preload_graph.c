/* test_preload_graph.c - stream capture under the shim, on the strict fake
 * libcuda.so.1 (tests/fakecuda): graph_prog captures a step with
 * cuMemAllocAsync/cuMemFreeAsync on the capturing stream. Without the shim
 * the fake makes them graph memory nodes; under it the pool serves them
 * from a graph-private pool (the report counts no capture bypass), keeps
 * that memory from everyone else while the graph lives and takes it back
 * when the graph and its executable are destroyed. */
#include "spawn.h"

static spawn_result_t r;

/* graph_prog's probes of a mode (its NPROBE). */
#define NPROBE_ALLOCS 24

Test(preload_graph, without_the_shim_the_capture_replays) {
  const char *argv[] = {MP_GRAPH_PROG, NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* how: NULL (cuGraphInstantiate), "params" (cuGraphInstantiateWithParams)
 * or "ptsz" (the capture allocates through the _ptsz entry points): either
 * way the executable holds the graph pool until it is destroyed. */
static void capture_under_the_shim_with(const char *how, const char *conf) {
  char dir[64], report[128], env_report[160];
  scratch_dir(dir, sizeof dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  snprintf(env_report, sizeof env_report, "MEMPOOL_REPORT=%s", report);
  const char *argv[] = {MP_GRAPH_PROG, "pool", how, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", env_report,
                       conf, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
  /* 2 in the warm-up, 1 + 6 in the capture, 4 launches allocating the
   * output (the capture's end traced as its free), 3 * 24 probes; as many
   * frees. auto: the output allocated by the first launch only.
   * to_graph_twice: 2 in the warm-up, 2 in the captures, 2 by the launch;
   * many_execs: 2 in the warm-up, 2 in the capture, 1 by the launch, 2 *
   * 24 probes; clone and child: the same with 3 * 24 probes; update: with
   * 2 captures, 2 launches and 3 * 24 probes; copy_chain: as clone;
   * update_refused: 2 captures, 1 launch and 24 probes. */
  int n = how == NULL                                ? 85
          : strcmp(how, "auto") == 0                 ? 82
          : strcmp(how, "to_graph_twice") == 0       ? 6
          : strcmp(how, "many_execs") == 0           ? 53
          : strcmp(how, "consumer") == 0             ? 4
          : strcmp(how, "to_graph_free") == 0        ? 3
          : strcmp(how, "refused_end") == 0          ? 2 + 1 + NPROBE_ALLOCS
          : strcmp(how, "side_stream") == 0          ? 2 + 1 + NPROBE_ALLOCS
          : strcmp(how, "invalidated_side") == 0     ? 2 + 1 + NPROBE_ALLOCS
          : strcmp(how, "refused_destroy") == 0      ? 2 + 1 + NPROBE_ALLOCS
          : strcmp(how, "refused_destroy_many") == 0 ? 2 + 10 + NPROBE_ALLOCS
          : strcmp(how, "prior_work") == 0           ? 2 + 1 + NPROBE_ALLOCS
          : strcmp(how, "clone") == 0          ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "child") == 0          ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "update") == 0         ? 2 + 4 + 2 + 3 * NPROBE_ALLOCS
          : strcmp(how, "copy_chain") == 0     ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "update_refused") == 0 ? 2 + 4 + 1 + NPROBE_ALLOCS
          : strcmp(how, "add_node") == 0       ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "add_node_move") == 0  ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "add_node_proc") == 0  ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "exec_child_set") == 0 ? 2 + 4 + 2 + 3 * NPROBE_ALLOCS
          : strcmp(how, "exec_node_set") == 0  ? 2 + 4 + 2 + 3 * NPROBE_ALLOCS
          : strcmp(how, "embedded") == 0       ? 2 + 2 + 1 + 3 * NPROBE_ALLOCS
          : strcmp(how, "node_set") == 0       ? 2 + 4 + 2 + 3 * NPROBE_ALLOCS
          : strcmp(how, "clone_parent") == 0   ? 2 + 2 + 1 + 4 * NPROBE_ALLOCS
          : strcmp(how, "destroyed_capture") == 0 ? 2 + 1 + 1 + NPROBE_ALLOCS
          : strcmp(how, "conditional_body") == 0  ? 2 + 1 + 2 * NPROBE_ALLOCS
          : strcmp(how, "destroyed_body") == 0    ? 2 + 2 + 3 * NPROBE_ALLOCS
                                                  : 85;
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "sys.exit(0 if d[\"mode\"]==\"pool\" and "
         "d[\"bypassed\"][\"capture\"]==0 and d[\"graph_pools\"]==0 and "
         "d[\"calls\"][\"allocate\"]==%d and d[\"calls\"][\"free\"]==%d "
         "else 1)' %s",
         n, n, report),
      0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  unlink(report);
  rmdir(dir);
}

static void capture_under_the_shim(const char *how) {
  capture_under_the_shim_with(how, NULL);
}

Test(preload_graph, under_the_shim_capture_allocations_come_from_a_graph_pool) {
  capture_under_the_shim(NULL);
}

/* The same with per-thread arenas (MEMPOOL_CONF=arenas=2): the device's
 * pool routes the capture from its arenas to the graph pool, and gives
 * the graph pool back when the graph goes. Refused before 2026-11-30
 * night (graph pools on arenas were MP_EINVAL): the shim passed the
 * capture's allocations to the driver, counted as bypassed. */
Test(preload_graph, with_arenas_capture_allocations_come_from_a_graph_pool) {
  capture_under_the_shim_with(NULL, "MEMPOOL_CONF=arenas=2");
}

Test(preload_graph, instantiated_with_params_the_graph_pool_is_held_and_freed) {
  capture_under_the_shim("params");
}

/* Executables made through the forms of cuGraphInstantiate before CUDA
 * 12.0 (an error node and a log buffer): the symbols cuGraphInstantiate
 * and cuGraphInstantiate_v2, which binaries built with older headers call,
 * and cuGetProcAddress("cuGraphInstantiate") at 11000, which the CUDA 11
 * runtime's cudaGraphInstantiate asks. The shim did not hook them: such an
 * executable was not counted, and destroying its graph released the graph
 * pool under it, so that another stream's allocations got the memory its
 * replays write (2 of 24 probes with cuGraphInstantiate_v2). */
Test(preload_graph, legacy_instantiate_v1_holds_the_graph_pool) {
  capture_under_the_shim("v1");
}

Test(preload_graph, legacy_instantiate_v2_holds_the_graph_pool) {
  capture_under_the_shim("v2");
}

Test(preload_graph, instantiate_found_at_11000_holds_the_graph_pool) {
  capture_under_the_shim("proc11");
}

/* graph_prog run without the shim in each mode of hows. */
static void without_the_shim(const char *const *hows, int n) {
  const char *env[] = {"LD_PRELOAD=", NULL};
  for (int i = 0; i < n; i++) {
    const char *argv[] = {MP_GRAPH_PROG, "plain", hows[i], NULL};
    spawn(argv, env, &r);
    cr_assert(r.exited && r.code == 0, "%s: out: %s\nerr: %s", hows[i], r.out,
              r.err);
    cr_assert_str_eq(r.out, "ok\n", "%s", hows[i]);
  }
}

/* how under the shim (capture_under_the_shim) and without it. */
static void both_ways(const char *how) {
  capture_under_the_shim(how);
  without_the_shim(&how, 1);
}

/* Without the shim the graph destroyed after instantiation replays on the
 * fake, as on a driver, through every form of instantiation (the fake
 * freed the graph's memory with the graph before 2026-12-01). */
Test(preload_graph, without_the_shim_a_lone_executable_replays) {
  const char *const hows[] = {"params", "v1", "v2", "proc11"};
  without_the_shim(hows, 4);
}

/* The canonical use of a graph's output (cuda.h, cuGraphLaunch): freed
 * after each launch, allocated again by the next. The shim kept the
 * output one allocation for the graph's life: the free after the second
 * launch was refused as a second free (CUDA_ERROR_INVALID_VALUE), and a
 * launch with the output still allocated was not refused. graph_prog
 * checks both, a free before the first launch, a second free, and the
 * output held past the graph; the default run above does it with
 * cuGraphInstantiate, this one with AUTO_FREE_ON_LAUNCH (launches with
 * the output allocated allowed). */
Test(preload_graph, an_output_freed_after_each_launch_is_allocated_again) {
  capture_under_the_shim("auto");
}

/* An output freed inside another capture: by another graph (each of its
 * launches frees it, cuda.h allowing it) or by a later capture into its
 * own graph. The shim took the first free for the program's own, so the
 * freeing graph's launches, then the program's free, were refused
 * (CUDA_ERROR_INVALID_VALUE), and the second refused outright, leaving the
 * graph pool behind; found by a review. The freed output is the graph's
 * memory for its life now. The fake gave another graph's free node the
 * memory, freed with that graph under the first one's executable. */
Test(preload_graph, an_output_freed_by_another_graph_stays_its_graphs) {
  both_ways("consumer");
}

Test(preload_graph, an_output_freed_by_a_later_capture_into_its_graph) {
  both_ways("to_graph_free");
}

/* Without the shim the fake keeps the same rules (its allocation nodes'
 * memory allocated at each launch), so that graph_prog's checks are
 * CUDA's and not the shim's. The fake allowed a second launch with the
 * output allocated before 2026-12-01, as the shim did. */
Test(preload_graph, without_the_shim_outputs_are_allocated_at_each_launch) {
  const char *const hows[] = {"auto", "ptsz"};
  without_the_shim(hows, 2);
}

/* A capture whose allocations came through the per-thread-default-stream
 * entry points (cuMemAllocAsync_ptsz) on an explicit stream, ended through
 * cuStreamEndCapture: the shim looked the capture up by handle and entry
 * point both, found none, and never ended its routes. The stream went on
 * allocating to the graph pool after the capture, and the pool was never
 * released. For an explicit handle the entry point names the same stream. */
Test(preload_graph, a_capture_allocating_through_ptsz_entry_points_ends) {
  capture_under_the_shim("ptsz");
}

/* Two captures into one graph the program made
 * (cuStreamBeginCaptureToGraph), each with its own graph pool: the graph's
 * and its executable's destruction must release both, not the first
 * found. A cuGraphDestroy of the graph during the second capture is the
 * fake's refusal (cuda.h, cuStreamGetCaptureInfo: no destroy "while the
 * capture sequence is in progress"), passed on with the graph pools left
 * as they were. */
Test(preload_graph, two_captures_into_one_graph_release_both_graph_pools) {
  capture_under_the_shim("to_graph_twice");
}

/* More executables of one graph than the shim's first table of them
 * (256): those past it were not counted, and a graph destroyed with only
 * such an executable left released its graph pool under it, handing its
 * memory to others while replays still used it. */
Test(preload_graph, the_last_of_many_executables_holds_the_graph_pool) {
  capture_under_the_shim("many_execs");
}

/* An end the driver refuses while the capture goes on (a NULL graph, or
 * on a stream joined into the capture) changes nothing: the graph pool
 * keeps serving the capture and is tied to the graph at the real end. The
 * shim dropped the capture at the refused end, and the live graph's memory
 * went to other allocations. */
Test(preload_graph, a_refused_end_leaves_the_capture_its_graph_pool) {
  both_ways("refused_end");
}

/* A capture whose only allocating stream is one it forked to ends on its
 * origin stream: the shim now finds it by its capture id, ends the side
 * stream's route and ties the graph pool to the graph. */
Test(preload_graph, a_capture_allocating_only_on_a_forked_stream_ends) {
  both_ways("side_stream");
}

/* The same capture invalidated before its end (no graph): the end must
 * end the side stream's route and release the graph pool. The shim found
 * an invalidated capture by the end's stream alone (its id is gone by
 * then), so the side stream kept allocating from the graph pool, which
 * lived until exit; it now finds it by the id its begin got. */
Test(preload_graph, an_invalidated_capture_ends_its_forked_streams_route) {
  both_ways("invalidated_side");
}

/* A cuStreamDestroy of a capturing stream that the driver refuses (here a
 * stream of another context; cuda.h lists no capture error for
 * cuStreamDestroy, and the fake destroys a capturing stream, its capture
 * with it) changes nothing: the pools keep the stream's slots, capture
 * epoch and route, so what the capture freed comes back to other streams
 * once the graph goes, without a device synchronize. The shim forgot the
 * stream before the real destroy: its epoch stayed open in a slot gone
 * for good, and the memory waited for a device synchronize. */
Test(preload_graph, a_refused_destroy_of_a_capturing_stream_changes_nothing) {
  capture_under_the_shim("refused_destroy");
}

/* Ten refused destroys in one capture, each after an allocation: the
 * capture's list of routed streams (8) holds the stream once. Each
 * re-route after a refusal listed it again, and the ninth allocation
 * found no room and bypassed the pool. */
Test(preload_graph, a_capture_lists_a_rerouted_stream_once) {
  capture_under_the_shim("refused_destroy_many");
}

/* A copy of a captured graph (cuGraphClone, or a child graph node made
 * from it by cuGraphAddChildGraphNode) holds the graph pool as the graph
 * does: its replays use that memory. The shim did not see the copies and
 * released the graph pool with the original graph, under the copy's
 * executable. Without the shim the fake refuses both for a graph with
 * memory nodes, as cuda.h says. */
Test(preload_graph, a_clone_of_a_captured_graph_holds_its_graph_pool) {
  both_ways("clone");
}

Test(preload_graph, a_child_graph_node_holds_its_graphs_graph_pool) {
  both_ways("child");
}

/* An executable updated from another captured graph (cuGraphExecUpdate)
 * replays into that graph's memory and allocates its output: it holds its
 * graph pool until destroyed. The shim released it with the graph. */
Test(preload_graph, an_updated_executable_holds_the_new_graphs_graph_pool) {
  both_ways("update");
}

/* Holders of holders: a clone of a clone, a parent of copies and a clone
 * of the parent each hold the graph pool, the last alone at the end. */
Test(preload_graph, copies_of_copies_hold_the_graph_pool) {
  capture_under_the_shim("copy_chain");
}

/* A cuGraphExecUpdate the driver refuses changes nothing under the shim:
 * the executable holds neither the other graph's graph pool nor less of
 * its own, and its launch allocates its own graph's output. */
Test(preload_graph, a_refused_update_changes_nothing) {
  capture_under_the_shim("update_refused");
}

/* A child graph node added by cuGraphAddNode (CUDA_CHILD_GRAPH_NODE_PARAMS)
 * holds the child's graph pool as cuGraphAddChildGraphNode's does: cloned
 * in, the parent holds it after the child goes; moved in
 * (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE), the child is the parent's, never
 * destroyed by the program, and the parent's destruction gives it back.
 * The shim did not hook cuGraphAddNode: the clone's graph pool went with
 * the child under the parent's executable, the moved one's lived until
 * exit. Without the shim the fake refuses both for a graph with memory
 * nodes (the move: not modelled). */
Test(preload_graph, a_child_graph_node_added_by_cuGraphAddNode_holds) {
  both_ways("add_node");
}

/* The same through what cuGetProcAddress answers for "cuGraphAddNode" at
 * 12030 (the runtime's way): the shim's hook, which holds. */
Test(preload_graph, cuGraphAddNode_from_cuGetProcAddress_holds) {
  both_ways("add_node_proc");
}

Test(preload_graph,
     a_graph_moved_into_a_child_node_is_released_with_its_parent) {
  both_ways("add_node_move");
}

/* An executable whose child graph node is given another graph's
 * parameters (cuGraphExecChildGraphNodeSetParams, cuGraphExecNodeSetParams)
 * replays that graph's memory: it holds its graph pool until destroyed.
 * The shim released it with that graph. */
Test(preload_graph, an_executable_given_a_child_graphs_params_holds_its_pool) {
  capture_under_the_shim("exec_child_set");
}

Test(preload_graph, an_executable_given_child_node_params_holds_its_pool) {
  capture_under_the_shim("exec_node_set");
}

/* The graph a child graph node embeds (cuGraphChildGraphNodeGetGraph),
 * cloned and instantiated: the clone and the executable hold the parent's
 * graph pools after the parent goes. The shim knew neither and released
 * them with the parent. */
Test(preload_graph, copies_of_an_embedded_graph_hold_the_parents_pool) {
  capture_under_the_shim("embedded");
}

/* A graph whose child graph node is given another graph's parameters
 * (cuGraphNodeSetParams, CUDA_CHILD_GRAPH_NODE_PARAMS) replays that
 * graph's memory: it holds its graph pool after that graph goes, as after
 * cuGraphAddNode. The shim did not hook the call and released the graph
 * pool with that graph. */
Test(preload_graph, a_graph_given_child_node_params_holds_their_pool) {
  capture_under_the_shim("node_set");
}

/* A clone of a graph with a child graph node holds the child's graph pool
 * (cuGraphClone copies child graph nodes "recursively"), and so does a
 * clone of the graph the clone's copy of the node embeds (found with
 * cuGraphNodeFindInClone, then cuGraphChildGraphNodeGetGraph), after the
 * parent and its clone go. */
Test(preload_graph, clones_of_a_parent_and_of_its_clones_child_hold_the_pool) {
  capture_under_the_shim("clone_parent");
}

/* A capturing stream that began a global-mode capture, destroyed
 * (cuStreamDestroy succeeds: cuda.h lists no capture error for it, and
 * the fake ends the capture with the stream): the capture can never end
 * ("Capture must be ended on the same stream in which it was initiated",
 * cuda.h, cuStreamBeginCapture), so it ends there, as an invalidated one
 * would. The shim was never told: the capture stayed begun, a later
 * cuMemAlloc went to the driver (a capture bypass) and every cuMemFree
 * was probed, for good, and the graph pool lived until exit, its memory
 * lost to the pool (capped here, so that other streams need it). */
Test(preload_graph, a_destroyed_capturing_stream_ends_the_capture_it_began) {
  const char *how = "destroyed_capture";
  capture_under_the_shim_with(how, "MEMPOOL_CONF=max_bytes=24M");
  without_the_shim(&how, 1);
}

/* The same, with no cap: the temporary's memory comes back to other
 * streams without a device synchronize, which the pool makes only under
 * pressure. What the capture freed was never to run (the capture is over
 * without a graph), and the stream was new; the pools' slots of it were
 * dropped with their epoch open, as if queued work were still to use it,
 * and other's probes got new memory instead. */
Test(preload_graph, a_destroyed_capturing_streams_memory_comes_back_at_once) {
  capture_under_the_shim("destroyed_capture");
}

/* A block freed on a capturing stream (cuMemFreeAsync during the capture)
 * after work queued there before the capture, the stream then destroyed:
 * its memory waits for that work (graph_prog's "prior_work" mode). The
 * pool counted the capture's epoch done with the stream's last marker,
 * recorded before that work, and gave the block to another stream. */
Test(preload_graph,
     a_destroyed_capture_origin_keeps_earlier_work_on_its_frees) {
  capture_under_the_shim("prior_work");
}

/* A capture into the body graph of a conditional node (cuGraphAddNode,
 * CU_GRAPH_NODE_TYPE_CONDITIONAL; cuStreamBeginCaptureToGraph): the
 * parent's executable replays the body, so it holds the graph pool after
 * the parent (and its body) go, and its destruction gives the memory back.
 * The shim did not see the body embedded in the parent: the graph pool
 * was the body's, which the program never destroys, and lived until
 * exit. */
Test(preload_graph, a_conditional_nodes_body_capture_is_held_by_its_parent) {
  capture_under_the_shim("conditional_body");
}

/* A capture into a conditional node's body graph, then the node destroyed
 * (cuGraphDestroyNode: the node's bodies go with it): the executable made
 * before keeps the graph pool, and its destruction gives the memory back
 * though the parent lives on; a new graph (the fake may give it the
 * body's handle) captured into and destroyed gives its memory back too;
 * a destroy refused during the capture changes nothing. The shim had no
 * cuGraphDestroyNode: the parent held the graph pool until its own
 * destruction (0 of 24 probes got the memory), and kept the body's handle
 * as embedded in it. */
Test(preload_graph, a_destroyed_nodes_body_capture_is_released_with_its_node) {
  capture_under_the_shim("destroyed_body");
}
