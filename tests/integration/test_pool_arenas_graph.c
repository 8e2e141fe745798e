/* Graph pools of a pool with arenas (arenas=2): every test of
 * test_pool_graph.c, the same contract, on such a parent. The ranges are
 * lent by the calling thread's arena, frees through the parent reach the
 * graph pool through that arena, and each arena marks the captured stream
 * (test_pool_arenas_graph in tests/unit checks what only arenas have). */
#define POOL_GRAPH_CONF "arenas=2"
#include "test_pool_graph.c"
