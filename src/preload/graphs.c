/* graphs.c - stream capture under the shim: graph-private pools, and the
 * graph hooks cuStreamBeginCapture(_ptsz), cuStreamBeginCapture_v2(_ptsz) and
 * cuStreamBeginCaptureToGraph(_ptsz) (counted, for mp__pl_capture_begun),
 * cuStreamEndCapture(_ptsz), cuGraphInstantiateWithFlags,
 * cuGraphInstantiateWithParams(_ptsz), the forms before CUDA 12.0
 * (cuGraphInstantiate, cuGraphInstantiate_v2), cuGraphExecDestroy,
 * cuGraphDestroy, cuGraphLaunch(_ptsz), cuGraphClone,
 * cuGraphAddChildGraphNode and cuGraphExecUpdate (both forms),
 * cuGraphAddNode (both forms), cuGraphChildGraphNodeGetGraph,
 * cuGraphExecChildGraphNodeSetParams, cuGraphExecNodeSetParams,
 * cuGraphNodeSetParams, cuGraphNodeFindInClone and cuGraphDestroyNode (the
 * runtime's cudaStreamEndCapture, cudaGraphInstantiate,
 * cudaGraphInstantiateWithFlags/WithParams, cudaGraphExecDestroy,
 * cudaGraphDestroy, cudaGraphLaunch, cudaGraphClone,
 * cudaGraphAddChildGraphNode and cudaGraphExecUpdate reach them through
 * cuGetProcAddress).
 *
 * A stream-ordered allocation or free on a stream being captured makes the
 * stream allocate to the capture's graph pool (mp_pool_graph_create, one per
 * capture id, mp_pool_graph_begin for each of its streams the program
 * allocates or frees on), so the pool serves it at an address the graph
 * keeps across replays, reuses what the capture frees only inside the same
 * graph pool, and never records on or queries the capturing stream. The
 * capture's end stops the routing and ties the graph pool to the graph;
 * each executable instantiated from the graph holds it too, and so do
 * copies of the graph (a clone, a graph with a child graph node made from
 * it) and their executables, and an executable updated from any of them;
 * when the last of these is destroyed the graph pool is released (its
 * memory back to the device's pool). A capture that ends in failure
 * releases it at once. Graph pools of graphs never destroyed live until
 * exit, left alone like the pool itself (something may still free into
 * them).
 *
 * A graph's outputs, what its capture allocated and did not free, are
 * graph allocations (cuda.h, cuGraphAddMemAllocNode): "recreated every
 * time a graph runs" (the Programming Guide, "Graph Memory Nodes"), freed
 * by the program between launches, and a launch with one still allocated
 * fails with CUDA_ERROR_INVALID_VALUE unless the executable was made with
 * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH (cuGraphLaunch). The
 * pool block of an output stays the graph pool's for the graph's life, at
 * its address; the shim keeps whether the program holds it, as the driver
 * would: from the capture's end it is not allocated (out of the table of
 * blocks, so a free is refused), cuGraphLaunch allocates it (into the
 * table; traced as an allocation), and the program's free leaves the block
 * where it is, free until the next launch (mp__pl_output_free). Before
 * 2026-12-01 an output was one allocation for the graph's life: the free
 * after the second launch was refused as a second free. What the program
 * still holds when the graph and its last executable go stays its own
 * ("Graph destruction does not automatically free any live
 * graph-allocated memory"), and keeps the graph pool until freed.
 *
 * Invariant: every slot in use names a live graph pool; `streams` are the
 * routes begun for it and are ended exactly once, at the capture's end;
 * an output not live is a block of the graph pool that no table entry
 * names; an output freed inside a capture (its graph's or another's,
 * cuda.h allowing both) becomes `inner`, the graph's memory until the
 * graph goes, no longer checked at launches, and a free of it outside a
 * capture is accepted and changes nothing (whether another graph's launch
 * freed it first cannot be told; a GPU would also refuse a relaunch of its
 * graph before the freeing graph ran: not modelled); mp__gr_outmask has
 * the bit of every output of an ended capture, so that a free of anything
 * else takes no lock. */
#include <stdlib.h>
#include <string.h>

#include "hooks.h"

#define MP__PL_CAPTURES    64  /* graphs alive at once the shim tracks */
#define MP__PL_CAP_STREAMS 8   /* streams of one capture it routes */
#define MP__PL_EXECS       256 /* the executables table's first room */
#define MP__CAPTURE_ACTIVE 1u  /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
#define MP__PL_BEGUN       64  /* captures in progress at once it counts */
/* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH (cuda.h) */
#define MP__GRAPH_AUTO_FREE_ON_LAUNCH 1ull

typedef struct mp__pl_capture {
  bool used;
  bool capturing;          /* between the first route and the end */
  unsigned long long id;   /* the capture's id (cuStreamGetCaptureInfo) */
  mp_pool_t *pool, *graph; /* the device's pool and the graph pool */
  mp__custream streams[MP__PL_CAP_STREAMS];
  bool ptsz[MP__PL_CAP_STREAMS];
  unsigned nstreams;
  mp__cugraph g; /* after the end: the graph, until destroyed */
  /* After an end into a graph embedded in g (mp__gr.embeds), that
   * embedding's id: the hold ends with the node that embeds it
   * (cuGraphDestroyNode). 0: into g itself. */
  unsigned long long via;
  unsigned graphs; /* other graphs holding it (mp__gr.gholds) */
  unsigned execs;
  bool kept; /* an executable could not be counted: kept until exit */
  /* The capture's allocations; after its end, those it did not free: its
   * outputs (live: a launch allocated it and the program has not freed
   * it). Without host memory for one, it stays an allocation for the
   * graph's life (as before 2026-12-01). */
  struct mp__pl_out {
    uintptr_t p;
    size_t size;
    bool live, inner;
    /* The number of the launch (mp__gr.launches) that put it in the table
     * and has not returned; 0: none. A launch ends only its own: another
     * launch of the same executable (one made with
     * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) may be in flight. */
    uint64_t launching;
    /* While launching: the claim its table entry went in with
     * (mp__pl_table_put_pool_claimed), which no free can take. */
    uint64_t claim;
  } * outs;
  size_t nouts, roomouts;
} mp__pl_capture_t;

static struct {
  pthread_mutex_t lock;
  mp__pl_capture_t caps[MP__PL_CAPTURES];
  /* The executables instantiated from tracked graphs, each with the slot
   * it holds: grown as needed (host memory only; without it the graph
   * pool is kept until exit, never released under a live executable). */
  struct mp__pl_exec {
    mp__cugraphexec x;
    unsigned cap;
    bool auto_free; /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
    bool held;      /* memory only: x was updated from another graph since,
                       its launches no longer allocate these outputs */
  } * execs;
  size_t nexecs, roomexecs, live;
  /* The graphs other than its capture's that hold a slot: clones of a
   * graph holding it (cuGraphClone) and graphs with a child graph node
   * made from one (cuGraphAddChildGraphNode copies the child in). Grown
   * as needed; without room the graph pool is kept until exit. */
  struct mp__pl_ghold {
    mp__cugraph g;
    unsigned cap;
  } * gholds;
  size_t ngholds, roomgholds;
  /* The child graph nodes added through the hooks, each with the graph it
   * was added to (cuGraphChildGraphNodeGetGraph names no parent), and the
   * graphs embedded in child graph nodes, given by
   * cuGraphChildGraphNodeGetGraph or moved in
   * (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE), each with the graph that is not
   * embedded and holds for it (its root: mp__graph_root). Grown as needed;
   * without room the graph pools concerned are kept until exit. An
   * embedded graph also has the node that embeds it (a child graph node,
   * or a conditional node for its bodies; NULL: not known) and the graph
   * that node is in, and an id no other embedding gets. `was`: a node's
   * or an embedded graph's handle while a cuGraphDestroyNode is under way
   * (the entry then bears that destroy's name, mp__dying_name), NULL
   * otherwise. */
  struct mp__pl_node {
    mp__cugraphnode n, was;
    mp__cugraph parent;
  } * nodes;
  size_t nnodes, roomnodes;
  struct mp__pl_embed {
    mp__cugraph e, root, in, was;
    mp__cugraphnode node;
    unsigned long long id;
  } * embeds;
  size_t nembeds, roomembeds;
  unsigned long long embed_ids; /* the last id given */
  /* The captures begun and not ended: origin stream (a per-thread stream
   * once per thread capturing it), mode and the thread that began it;
   * past MP__PL_BEGUN at once, `lost` keeps mp__pl_capture_begun true and
   * mp__pl_capture_prohibits true for good (the safe answers). */
  struct {
    mp__custream s;
    unsigned mode;
    pthread_t thread;
    bool known;            /* id was given at the begin */
    unsigned long long id; /* the capture's id */
  } begun[MP__PL_BEGUN];
  unsigned nbegun;
  bool lost;
  uint64_t launches; /* the last launch's number (mp__launching) */
  /* Broadcast when a launch is over (mp__launch): launches waiting for
   * one of the same executable go on. */
  pthread_cond_t launch_over;
  /* Entries of execs, gholds, nodes and embeds reserved by hooks in their
   * real call (mp__gr_reserve): no other put takes that room, so the
   * bookkeeping after a real call that succeeded cannot fail. */
  size_t resexecs, resgholds, resnodes, resembeds;
} mp__gr = {.lock = PTHREAD_MUTEX_INITIALIZER,
            .launch_over = PTHREAD_COND_INITIALIZER};
static atomic_uint mp__gr_begun; /* nbegun + lost, read without the lock */
/* A bit per output address (mp__out_bit) of the outputs of ended
 * captures: 0 when there are none. Rebuilt under the lock. */
static _Atomic uint64_t mp__gr_outmask;

/* fork() child: the parent's captures and graphs are not the child's. The
 * tables (execs, gholds, nodes, embeds) are emptied but kept with their
 * room, which the child's own entries reuse (their entries hold handles
 * only, nothing allocated): nothing is leaked. A capture's outputs are
 * freed, its slot emptied. */
static void mp__graphs_child(void) {
  for (size_t i = 0; i < MP__PL_CAPTURES; i++)
    free(mp__gr.caps[i].outs);
  memset(mp__gr.caps, 0, sizeof mp__gr.caps);
  mp__gr.nexecs = mp__gr.live = 0;
  mp__gr.ngholds = mp__gr.nnodes = mp__gr.nembeds = 0;
  mp__gr.resexecs = mp__gr.resgholds = mp__gr.resnodes = mp__gr.resembeds = 0;
  mp__gr.nbegun = 0;
  mp__gr.lost = false;
  atomic_store(&mp__gr_begun, 0);
  atomic_store(&mp__gr_outmask, 0);
  pthread_mutex_init(&mp__gr.lock, NULL);
  pthread_cond_init(&mp__gr.launch_over, NULL);
}

static pthread_once_t mp__gr_once = PTHREAD_ONCE_INIT;

static void mp__gr_atfork(void) {
  pthread_atfork(NULL, NULL, mp__graphs_child);
}

/* Takes mp__gr.lock; the first time, registers mp__graphs_child, so a
 * child forked while another thread held the lock or after a capture
 * starts over. */
static void mp__gr_lock(void) {
  pthread_once(&mp__gr_once, mp__gr_atfork);
  pthread_mutex_lock(&mp__gr.lock);
}

/* Whether s is being captured, asked of the driver: MP__CU_SUCCESS with
 * *captured (and, captured, its id in *id), or the driver's error, with
 * which nothing is known: cuda.h, cuStreamGetCaptureInfo, "Valid data
 * (other than capture status) is returned only if both of the following
 * are true: the call returns CUDA_SUCCESS; the returned capture status is
 * CU_STREAM_CAPTURE_STATUS_ACTIVE", and \notefnerr: it may answer a
 * previous launch's error, a sticky one (CUDA_ERROR_ILLEGAL_ADDRESS) for
 * good. Such an error is never "not captured": a free would release or
 * hand out memory a capture may hold. CUDA_ERROR_NOT_INITIALIZED where the
 * driver has not the call. */
static mp__curesult mp__capture_id(mp__custream s, bool ptsz, bool *captured,
                                   unsigned long long *id) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__curesult (*fn)(mp__custream, unsigned int *, unsigned long long *,
                     mp__cugraph *, const void **, size_t *) =
      ptsz && rc->cuStreamGetCaptureInfo_v2_ptsz
          ? rc->cuStreamGetCaptureInfo_v2_ptsz
          : rc->cuStreamGetCaptureInfo_v2;
  unsigned int status = 0;
  mp__curesult r = fn != NULL ? fn(s, &status, id, NULL, NULL, NULL)
                              : MP__CU_NOT_INITIALIZED;
  *captured = r == MP__CU_SUCCESS && status == MP__CAPTURE_ACTIVE;
  return r;
}

static uint64_t mp__out_bit(uintptr_t p) {
  return 1ull << ((uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull >> 58);
}

/* mp__gr_outmask from the slots. Under the lock. */
static void mp__outmask_rebuild(void) {
  uint64_t m = 0;
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    const mp__pl_capture_t *c = &mp__gr.caps[i];
    for (size_t k = 0; c->used && !c->capturing && k < c->nouts; k++)
      m |= mp__out_bit(c->outs[k].p);
  }
  atomic_store_explicit(&mp__gr_outmask, m, memory_order_relaxed);
}

/* Releases slot i's graph pool and frees the slot. The outputs the
 * program does not hold go back to the graph pool first; those it holds
 * stay its blocks (the graph pool lives until their free). Under the
 * lock. */
static void mp__capture_drop(mp__pl_capture_t *c) {
  for (size_t k = 0; k < c->nouts; k++)
    if (!c->outs[k].live)
      (void)mp_pool_free(c->pool, (void *)c->outs[k].p);
  (void)mp_pool_graph_release(c->graph);
  free(c->outs);
  memset(c, 0, sizeof *c);
  mp__gr.live--;
  mp__outmask_rebuild();
}

/* Whether a begin not yet over got no id (mp__capture_begun: the driver
 * could not say, cuStreamGetCaptureInfo failing). Under the lock. */
static bool mp__begun_unknown(void) {
  for (unsigned k = 0; k < mp__gr.nbegun; k++)
    if (!mp__gr.begun[k].known)
      return true;
  return false;
}

/* Whether capture c routes the stream the pool names ms: below. */
static bool mp__capture_routes(const mp__pl_t *pl, const mp__pl_capture_t *c,
                               mp_stream_t ms);

bool mp__pl_capture_route(const mp__pl_t *pl, mp_pool_t *pool, mp__custream s,
                          bool ptsz, mp__curesult *err) {
  unsigned long long id;
  bool captured = false;
  mp__curesult r = pl->host || pool == NULL
                       ? MP__CU_SUCCESS
                       : mp__capture_id(s, ptsz, &captured, &id);
  if (err != NULL)
    *err = r;
  if (!captured)
    return false;
  mp_stream_t ms = mp__pl_stream(pl, s, ptsz);
  bool ok = false;
  mp__gr_lock();
  mp__pl_capture_t *c = NULL, *free_slot = NULL;
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *x = &mp__gr.caps[i];
    if (x->used && x->capturing && x->id == id && x->pool == pool)
      c = x;
    else if (!x->used && free_slot == NULL)
      free_slot = x;
  }
  /* A capture with no graph pool yet gets none while a begin whose id the
   * driver could not give is not over (mp__capture_begun): id may be that
   * capture's, which its end could then not find by id (its end's own
   * question failing too) when it routes none of the origin stream's
   * work, its forked streams routed to the graph pool for good. Its
   * allocations are the driver's (a capture's allocation nodes, cuda.h,
   * cuMemAllocAsync), as for a capture the shim cannot route. */
  if (c == NULL && free_slot != NULL && !mp__begun_unknown() &&
      mp_pool_graph_create(pool, &free_slot->graph) == MP_OK) {
    c = free_slot;
    c->used = c->capturing = true;
    c->id = id;
    c->pool = pool;
    mp__gr.live++;
  }
  if (c != NULL) {
    ok = mp_pool_graph_of(pool, ms) == c->graph;
    /* A stream listed already whose route went (its pool forgot it) is
     * routed again, not listed again: a capture that re-routed one stream
     * eight times ran out of room for its other streams. */
    bool listed = !ok && mp__capture_routes(pl, c, ms);
    if (!ok && (listed || c->nstreams < MP__PL_CAP_STREAMS) &&
        mp_pool_graph_begin(pool, c->graph, ms) == MP_OK) {
      if (!listed) {
        c->streams[c->nstreams] = s;
        c->ptsz[c->nstreams++] = ptsz;
      }
      ok = true;
    }
    if (c->nstreams == 0) /* made here and never routed: not kept */
      mp__capture_drop(c);
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return ok;
}

size_t mp__pl_graph_pools(void) {
  mp__gr_lock();
  size_t n = mp__gr.live;
  pthread_mutex_unlock(&mp__gr.lock);
  return n;
}

/* The capture whose routes include s: below. */
static mp__pl_capture_t *mp__capture_of_stream(const mp__pl_t *pl,
                                               mp__custream s, bool ptsz);

void mp__pl_capture_allocated(const mp__pl_t *pl, mp__custream s, bool ptsz,
                              uintptr_t p, size_t bytes) {
  mp__gr_lock();
  mp__pl_capture_t *c = mp__capture_of_stream(pl, s, ptsz);
  size_t k = 0;
  while (c != NULL && k < c->nouts && c->outs[k].p != p)
    k++; /* an address the capture freed and got again: one entry */
  if (c != NULL && k == c->roomouts) {
    size_t room = c->roomouts ? 2 * c->roomouts : 8;
    struct mp__pl_out *t = realloc(c->outs, room * sizeof *t);
    if (t != NULL) {
      c->outs = t;
      c->roomouts = room;
    }
  }
  if (c != NULL && k < c->roomouts) {
    c->outs[k] = (struct mp__pl_out){.p = p, .size = bytes};
    c->nouts += k == c->nouts;
  }
  pthread_mutex_unlock(&mp__gr.lock);
}

/* Output ptr of an ended capture, or NULL. Under the lock. */
static struct mp__pl_out *mp__output_at(uintptr_t ptr) {
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    for (size_t k = 0; c->used && !c->capturing && k < c->nouts; k++)
      if (c->outs[k].p == ptr)
        return &c->outs[k];
  }
  return NULL;
}

/* Whether o is what a free of ptr (held: from the table) meets: an output
 * in that state, or, not held, an inner one. */
static bool mp__output_meets(const struct mp__pl_out *o, bool held) {
  return o != NULL && (o->inner ? !held && !o->live : o->live == held);
}

bool mp__pl_output_free(const mp__pl_t *pl, uintptr_t ptr, bool held,
                        bool ordered, mp__custream s, bool ptsz,
                        mp__curesult *err) {
  *err = MP__CU_SUCCESS;
  uint64_t m = atomic_load_explicit(&mp__gr_outmask, memory_order_relaxed);
  if ((m & mp__out_bit(ptr)) == 0)
    return false;
  mp__gr_lock();
  const struct mp__pl_out *o = mp__output_at(ptr);
  bool hit = mp__output_meets(o, held), inner = hit && o->inner;
  pthread_mutex_unlock(&mp__gr.lock);
  /* The graph's memory for its life: whether this free ends what another
   * graph's launch allocated, or repeats one, is not known; nothing to do
   * either way. */
  if (!hit || inner)
    return hit;
  /* The driver asked with no lock held. Where it cannot say whether s
   * captures, the free is neither one inside a graph nor one until the
   * next launch: refused, nothing changed (the output stays as it was,
   * held or not), the driver's code in *err. */
  unsigned long long id;
  bool captured = false;
  if (ordered && !pl->host &&
      (*err = mp__capture_id(s, ptsz, &captured, &id)) != MP__CU_SUCCESS)
    return false;
  if (!held && !captured)
    return false;
  mp__gr_lock();
  struct mp__pl_out *w = mp__output_at(ptr);
  bool done = mp__output_meets(w, held) && !w->inner;
  if (done) {
    w->live = false;
    w->inner = captured;
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return done;
}

/* Whether capture c, begun and not yet ended, routes the stream the pool
 * names ms. Streams are compared as the pool names them: an explicit
 * handle is one stream whichever entry point (plain or _ptsz) passed it. */
static bool mp__capture_routes(const mp__pl_t *pl, const mp__pl_capture_t *c,
                               mp_stream_t ms) {
  for (unsigned k = 0; c->used && c->capturing && k < c->nstreams; k++)
    if (mp__pl_stream(pl, c->streams[k], c->ptsz[k]) == ms)
      return true;
  return false;
}

/* The capture whose routes include s. */
static mp__pl_capture_t *mp__capture_of_stream(const mp__pl_t *pl,
                                               mp__custream s, bool ptsz) {
  mp_stream_t ms = mp__pl_stream(pl, s, ptsz);
  for (size_t i = 0; i < MP__PL_CAPTURES; i++)
    if (mp__capture_routes(pl, &mp__gr.caps[i], ms))
      return &mp__gr.caps[i];
  return NULL;
}

/* The graph that holds for g: g, or, for a graph embedded in a child
 * graph node (mp__gr.embeds), the graph not embedded that contains it,
 * which holds what the embedded graph's copies use (its parent's pools:
 * all of them, more than the embedded graph's own, as the shim does not
 * know which are). Under the lock. */
static mp__cugraph mp__graph_root(mp__cugraph g) {
  for (size_t k = 0; k < mp__gr.nembeds; k++)
    if (mp__gr.embeds[k].e == g)
      return mp__gr.embeds[k].root;
  return g;
}

/* The id of g's embedding (mp__gr.embeds), or 0 for a graph not
 * embedded. Under the lock. */
static unsigned long long mp__embed_id(mp__cugraph g) {
  for (size_t k = 0; k < mp__gr.nembeds; k++)
    if (mp__gr.embeds[k].e == g)
      return mp__gr.embeds[k].id;
  return 0;
}

/* Whether graph g holds slot i: its capture ended into g (several
 * captures may have, cuStreamBeginCaptureToGraph into one graph, each
 * with its own graph pool: the graph and its executables hold them all),
 * or g is a copy (mp__gr.gholds); an embedded graph as its root does.
 * Under the lock. */
static bool mp__capture_into(unsigned i, mp__cugraph g) {
  const mp__pl_capture_t *c = &mp__gr.caps[i];
  g = mp__graph_root(g);
  if (g == NULL || !c->used || c->capturing)
    return false;
  for (size_t k = 0; c->g != g && k < mp__gr.ngholds; k++)
    if (mp__gr.gholds[k].g == g && mp__gr.gholds[k].cap == i)
      return true;
  return c->g == g;
}

/* Releases slot c if nothing holds it any longer: no graph, no
 * executable, not kept, no output claimed by a launch still in its real
 * call (its executable destroyed meanwhile: the launch's end, mp__launch_over,
 * releases it). Under the lock. */
static void mp__capture_unheld(mp__pl_capture_t *c) {
  bool launching = false;
  for (size_t k = 0; c->used && k < c->nouts; k++)
    launching |= c->outs[k].launching != 0;
  if (c->used && !c->capturing && c->g == NULL && c->graphs == 0 &&
      c->execs == 0 && !c->kept && !launching)
    mp__capture_drop(c);
}

/* Ends every route of capture c (its streams allocate to the device's pool
 * again). Under the lock. */
static void mp__capture_unroute(const mp__pl_t *pl, mp__pl_capture_t *c) {
  for (unsigned k = 0; k < c->nstreams; k++)
    (void)mp_pool_graph_end(c->pool,
                            mp__pl_stream(pl, c->streams[k], c->ptsz[k]));
  c->nstreams = 0;
  c->capturing = false;
}

/* Capture c ended into a graph: what it allocated and did not free (still
 * in the table) are its outputs, not allocated until a launch (out of the
 * table, traced as freed); the rest are dropped. Under the lock. */
static void mp__capture_outputs(mp__pl_capture_t *c) {
  size_t n = 0;
  for (size_t k = 0; k < c->nouts; k++) {
    mp__pl_block_t b;
    if (!mp__pl_table_take(c->outs[k].p, &b))
      continue;
    mp__pl_record_free(b.ptr, b.size, b.stream);
    c->outs[n++] = c->outs[k];
  }
  c->nouts = n;
  mp__outmask_rebuild();
}

/* Capture bookkeeping over for the capture begun on key (its origin
 * stream, MP__CU_STREAM_PER_THREAD for this thread's per-thread stream),
 * whose id is *id (NULL: not known; for a known begin whose id differs,
 * another capture's, the begin is not this one's), and on which ms, as
 * the pools name it, was routed: its begin is no longer counted, and the
 * routes of every stream it allocated or freed on end, whether or not ms
 * was one (a capture begun on s0 that forked to s1, only s1 allocating);
 * ended into *g (NULL: none, an invalidated capture), the graph keeps the
 * graph pool; with none, it is released. Under the lock. */
static void mp__capture_over(const mp__pl_t *pl, mp__custream key,
                             mp_stream_t ms, const unsigned long long *id,
                             const mp__cugraph *g) {
  unsigned long long begun_id;
  for (unsigned k = 0; k < mp__gr.nbegun; k++)
    if (mp__gr.begun[k].s == key &&
        (key != MP__CU_STREAM_PER_THREAD ||
         pthread_equal(mp__gr.begun[k].thread, pthread_self())) &&
        (id == NULL || !mp__gr.begun[k].known || mp__gr.begun[k].id == *id)) {
      /* An invalidated capture has no id by now (cuStreamGetCaptureInfo
       * gives none): the one its begin got finds it, and so the routes of
       * every stream it forked to, not only the end's. */
      if (id == NULL && mp__gr.begun[k].known) {
        begun_id = mp__gr.begun[k].id;
        id = &begun_id;
      }
      mp__gr.begun[k] = mp__gr.begun[--mp__gr.nbegun];
      atomic_store(&mp__gr_begun, mp__gr.nbegun + mp__gr.lost);
      break;
    }
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    if (!c->used || !c->capturing ||
        (id != NULL ? c->id != *id : !mp__capture_routes(pl, c, ms)))
      continue;
    if (g != NULL && *g != NULL) {
      mp__capture_unroute(pl, c);
      c->g = mp__graph_root(*g); /* a capture into an embedded graph */
      c->via = mp__embed_id(*g);
      mp__capture_outputs(c);
    } else {
      c->nouts = 0; /* no graph: the blocks stay the program's */
      mp__capture_unroute(pl, c);
      mp__capture_drop(c);
    }
  }
}

/* After the real cuStreamEndCapture of the capture whose id the driver
 * gave before it (NULL: none was given, an invalidated capture):
 * mp__capture_over once the capture is over. */
static void mp__capture_ended(mp__custream s, bool ptsz,
                              const unsigned long long *id, mp__curesult r,
                              mp__cugraph *g) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return;
  }
  const mp__pl_t *pl = mp__pl_get();
  /* The capture is over when the end succeeded or the stream no longer
   * captures. A refused end of a capture that goes on (cuda.h,
   * cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_UNMATCHED on a stream
   * that did not begin it; a NULL phGraph) changes nothing: its graph pool
   * serves the capture to its real end. Where the driver cannot say, the
   * routes stay (the graph pool kept until exit, never released under a
   * capture that goes on). */
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__curesult (*is)(mp__custream, unsigned int *) =
      ptsz && rc->cuStreamIsCapturing_ptsz ? rc->cuStreamIsCapturing_ptsz
                                           : rc->cuStreamIsCapturing;
  unsigned int status = 0;
  bool over = r == MP__CU_SUCCESS ||
              (is != NULL && is(s, &status) == MP__CU_SUCCESS && status == 0);
  mp__gr_lock();
  if (over)
    mp__capture_over(pl, ptsz && s == NULL ? MP__CU_STREAM_PER_THREAD : s,
                     mp__pl_stream(pl, s, ptsz), id,
                     r == MP__CU_SUCCESS ? g : NULL);
  pthread_mutex_unlock(&mp__gr.lock);
  mp__pl_leave();
}

bool mp__pl_capture_origin(mp__custream s, unsigned long long *id,
                           bool *known) {
  if (!mp__pl_capture_begun())
    return false;
  bool found = false;
  mp__gr_lock();
  for (unsigned k = 0; !found && k < mp__gr.nbegun; k++)
    if (mp__gr.begun[k].s == s) {
      found = true;
      *id = mp__gr.begun[k].id;
      *known = mp__gr.begun[k].known;
    }
  pthread_mutex_unlock(&mp__gr.lock);
  return found;
}

void mp__pl_capture_destroyed(const mp__pl_t *pl, mp__custream s, bool origin,
                              const unsigned long long *id) {
  mp_stream_t ms = mp__pl_stream(pl, s, false);
  mp__gr_lock();
  /* Its routes went with its slots (mp__stream_set_aside_end): a capture
   * that goes on never ends them by the handle, which a new stream may
   * have by now. */
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    for (unsigned k = 0; c->used && c->capturing && k < c->nstreams;)
      if (mp__pl_stream(pl, c->streams[k], c->ptsz[k]) == ms) {
        c->streams[k] = c->streams[--c->nstreams];
        c->ptsz[k] = c->ptsz[c->nstreams];
      } else {
        k++;
      }
  }
  /* Found by the begin's id (the stream gone, its routes listed no more;
   * a begin that got no id has no routes either, mp__pl_capture_route
   * asking the same): every stream the capture forked to ends its route,
   * and the graph pool goes, as at the end of an invalidated capture. */
  if (origin)
    mp__capture_over(pl, s, ms, id, NULL);
  pthread_mutex_unlock(&mp__gr.lock);
}

/* A capture begun in `mode`: its origin stream counted until its end. */
static mp__curesult mp__capture_begun(mp__curesult r, mp__custream s, bool ptsz,
                                      unsigned mode) {
  if (r != MP__CU_SUCCESS)
    return r;
  unsigned long long id = 0;
  bool known = false;
  (void)mp__capture_id(s, ptsz, &known, &id);
  mp__gr_lock();
  if (mp__gr.nbegun < MP__PL_BEGUN) {
    mp__gr.begun[mp__gr.nbegun].s =
        ptsz && s == NULL ? MP__CU_STREAM_PER_THREAD : s;
    mp__gr.begun[mp__gr.nbegun].known = known;
    mp__gr.begun[mp__gr.nbegun].id = id;
    mp__gr.begun[mp__gr.nbegun].mode = mode;
    mp__gr.begun[mp__gr.nbegun++].thread = pthread_self();
  } else
    mp__gr.lost = true;
  atomic_store(&mp__gr_begun, mp__gr.nbegun + mp__gr.lost);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

void mp__pl_graphs_forget(const mp__pl_t *pl, mp_pool_t *pool) {
  mp__gr_lock();
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    if (!c->used || c->pool != pool)
      continue;
    /* The pool's memory is gone and the table forgot its blocks
     * (mp__pl_table_forget_pool): every output goes back to the graph pool
     * with the slot, so that both can be released. */
    if (c->capturing)
      c->nouts = 0; /* blocks of the table, forgotten */
    for (size_t k = 0; k < c->nouts; k++) {
      /* A launch in flight claimed its entry, which the table's forgetting
       * left: it goes, never traced (nor its launch's allocation now). */
      const struct mp__pl_out *o = &c->outs[k];
      if (o->launching != 0)
        mp__pl_table_end(&(mp__pl_block_t){.ptr = o->p, .claim = o->claim},
                         true);
      c->outs[k].live = false;
    }
    mp__capture_unroute(pl, c);
    for (size_t x = 0; x < mp__gr.nexecs;) /* no executable holds it now */
      if (mp__gr.execs[x].cap == i)
        mp__gr.execs[x] = mp__gr.execs[--mp__gr.nexecs];
      else
        x++;
    for (size_t k = 0; k < mp__gr.ngholds;) /* nor any copy of its graph */
      if (mp__gr.gholds[k].cap == i)
        mp__gr.gholds[k] = mp__gr.gholds[--mp__gr.ngholds];
      else
        k++;
    mp__capture_drop(c);
  }
  pthread_mutex_unlock(&mp__gr.lock);
}

/* cuda.h, cuThreadExchangeStreamCaptureMode: in GLOBAL mode a thread is
 * prohibited from potentially unsafe calls "If the local thread has an
 * ongoing capture sequence that was not initiated with
 * CU_STREAM_CAPTURE_MODE_RELAXED ..., or if any other thread has a
 * concurrent capture sequence initiated with CU_STREAM_CAPTURE_MODE_GLOBAL";
 * in THREAD_LOCAL mode only by the former; in RELAXED mode never. */
bool mp__pl_capture_prohibits(unsigned thread_mode) {
  if (thread_mode == MP__CAPTURE_MODE_RELAXED)
    return false;
  mp__gr_lock();
  bool no = mp__gr.lost;
  for (unsigned k = 0; !no && k < mp__gr.nbegun; k++) {
    bool mine = pthread_equal(mp__gr.begun[k].thread, pthread_self());
    no = mine ? mp__gr.begun[k].mode != MP__CAPTURE_MODE_RELAXED
              : thread_mode == MP__CAPTURE_MODE_GLOBAL &&
                    mp__gr.begun[k].mode == MP__CAPTURE_MODE_GLOBAL;
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return no;
}

bool mp__pl_capture_begun(void) {
  return atomic_load_explicit(&mp__gr_begun, memory_order_acquire) != 0;
}

/* CUDA 10.0's form, before the modes (cudaTypedefs.h:
 * PFN_cuStreamBeginCapture_v10000 and _ptsz): a capture in the default
 * mode, CU_STREAM_CAPTURE_MODE_GLOBAL ("This is the default mode", cuda.h,
 * cuThreadExchangeStreamCaptureMode). */
mp__curesult cuStreamBeginCapture(mp__custream hStream) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(rc->cuStreamBeginCapture
                               ? rc->cuStreamBeginCapture(hStream)
                               : MP__CU_NOT_INITIALIZED,
                           hStream, false, MP__CAPTURE_MODE_GLOBAL);
}

mp__curesult cuStreamBeginCapture_ptsz(mp__custream hStream) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(rc->cuStreamBeginCapture_ptsz
                               ? rc->cuStreamBeginCapture_ptsz(hStream)
                               : MP__CU_NOT_INITIALIZED,
                           hStream, true, MP__CAPTURE_MODE_GLOBAL);
}

mp__curesult cuStreamBeginCapture_v2(mp__custream hStream, unsigned int mode) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(rc->cuStreamBeginCapture_v2
                               ? rc->cuStreamBeginCapture_v2(hStream, mode)
                               : MP__CU_NOT_INITIALIZED,
                           hStream, false, mode);
}

mp__curesult cuStreamBeginCapture_v2_ptsz(mp__custream hStream,
                                          unsigned int mode) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(rc->cuStreamBeginCapture_v2_ptsz
                               ? rc->cuStreamBeginCapture_v2_ptsz(hStream, mode)
                               : MP__CU_NOT_INITIALIZED,
                           hStream, true, mode);
}

/* cuda.h, cuStreamBeginCaptureToGraph (CUDA 12.3): a capture like
 * cuStreamBeginCapture's, with its mode ("For more details see
 * ::cuThreadExchangeStreamCaptureMode"), into the program's graph hGraph,
 * which cuStreamEndCapture returns: counted the same way, and its
 * stream-ordered allocations routed the same way (by capture id). */
mp__curesult cuStreamBeginCaptureToGraph(mp__custream hStream,
                                         mp__cugraph hGraph,
                                         const mp__cugraphnode *dependencies,
                                         const mp__cugraphedgedata *edges,
                                         size_t numDependencies,
                                         unsigned int mode) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(
      rc->cuStreamBeginCaptureToGraph
          ? rc->cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies,
                                            edges, numDependencies, mode)
          : MP__CU_NOT_INITIALIZED,
      hStream, false, mode);
}

mp__curesult
cuStreamBeginCaptureToGraph_ptsz(mp__custream hStream, mp__cugraph hGraph,
                                 const mp__cugraphnode *dependencies,
                                 const mp__cugraphedgedata *edges,
                                 size_t numDependencies, unsigned int mode) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__capture_begun(
      rc->cuStreamBeginCaptureToGraph_ptsz
          ? rc->cuStreamBeginCaptureToGraph_ptsz(hStream, hGraph, dependencies,
                                                 edges, numDependencies, mode)
          : MP__CU_NOT_INITIALIZED,
      hStream, true, mode);
}

mp__curesult cuStreamEndCapture(mp__custream hStream, mp__cugraph *phGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  unsigned long long id;
  bool known = false;
  (void)mp__capture_id(hStream, false, &known, &id);
  mp__curesult r = rc->cuStreamEndCapture
                       ? rc->cuStreamEndCapture(hStream, phGraph)
                       : MP__CU_NOT_INITIALIZED;
  mp__capture_ended(hStream, false, known ? &id : NULL, r, phGraph);
  return r;
}

mp__curesult cuStreamEndCapture_ptsz(mp__custream hStream,
                                     mp__cugraph *phGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  unsigned long long id;
  bool known = false;
  (void)mp__capture_id(hStream, true, &known, &id);
  mp__curesult r = rc->cuStreamEndCapture_ptsz
                       ? rc->cuStreamEndCapture_ptsz(hStream, phGraph)
                       : MP__CU_NOT_INITIALIZED;
  mp__capture_ended(hStream, true, known ? &id : NULL, r, phGraph);
  return r;
}

/* Room for n entries (those in use, reserved and to be put) in a table a
 * of entries of `size` bytes, room of them allocated (first when it is
 * first allocated, doubled as it grows): the table, grown if need be, or
 * NULL without host memory (a unchanged). Under the lock. */
static void *mp__grown(void *a, size_t *room, size_t n, size_t size,
                       size_t first) {
  if (n <= *room)
    return a;
  size_t more = *room ? 2 * *room : first;
  while (more < n)
    more *= 2;
  void *t = realloc(a, more * size);
  if (t != NULL)
    *room = more;
  return t;
}

/* What a hook's bookkeeping after its real call may put in each table. */
typedef struct mp__gr_room {
  size_t execs, gholds, nodes, embeds;
} mp__gr_room_t;

/* The slots graph g holds (mp__capture_into): at most what copying g or
 * taking its memory puts in execs or gholds. Under the lock. */
static size_t mp__graph_slots(mp__cugraph g) {
  size_t n = 0;
  for (unsigned i = 0; g != NULL && i < MP__PL_CAPTURES; i++)
    n += mp__capture_into(i, g);
  return n;
}

/* Reserves room for q in the tables, grown if need be (host memory only),
 * before a real call whose success the shim must record: after it the
 * bookkeeping's puts cannot fail. False, nothing reserved, without host
 * memory: the hook then answers CUDA_ERROR_OUT_OF_MEMORY without the real
 * call, nothing changed ("unable to allocate enough memory or other
 * resources to perform the requested operation": cuda.h, CUresult; the
 * code a launch and an instantiation without host memory for their
 * bookkeeping answer, mp__launch, mp__exec_made). Before, the real call
 * was made first and a put that failed then left the graph pools kept
 * until exit and their outputs the program's for good. What a graph holds
 * cannot change under the call: cuda.h (note_graph_thread_safety) forbids
 * the program to use a graph from two threads at once; the reservation
 * keeps other graphs' puts out of the room. Under the lock. */
static bool mp__gr_reserve(const mp__gr_room_t *q) {
  void *t[4] = {mp__grown(mp__gr.execs, &mp__gr.roomexecs,
                          mp__gr.nexecs + mp__gr.resexecs + q->execs,
                          sizeof *mp__gr.execs, MP__PL_EXECS),
                mp__grown(mp__gr.gholds, &mp__gr.roomgholds,
                          mp__gr.ngholds + mp__gr.resgholds + q->gholds,
                          sizeof *mp__gr.gholds, 16),
                mp__grown(mp__gr.nodes, &mp__gr.roomnodes,
                          mp__gr.nnodes + mp__gr.resnodes + q->nodes,
                          sizeof *mp__gr.nodes, 16),
                mp__grown(mp__gr.embeds, &mp__gr.roomembeds,
                          mp__gr.nembeds + mp__gr.resembeds + q->embeds,
                          sizeof *mp__gr.embeds, 16)};
  /* A table grown is kept, whatever another's growth did (more room). */
  mp__gr.execs = t[0] != NULL ? t[0] : mp__gr.execs;
  mp__gr.gholds = t[1] != NULL ? t[1] : mp__gr.gholds;
  mp__gr.nodes = t[2] != NULL ? t[2] : mp__gr.nodes;
  mp__gr.embeds = t[3] != NULL ? t[3] : mp__gr.embeds;
  if ((t[0] == NULL && q->execs > 0) || (t[1] == NULL && q->gholds > 0) ||
      (t[2] == NULL && q->nodes > 0) || (t[3] == NULL && q->embeds > 0))
    return false;
  mp__gr.resexecs += q->execs;
  mp__gr.resgholds += q->gholds;
  mp__gr.resnodes += q->nodes;
  mp__gr.resembeds += q->embeds;
  return true;
}

/* Gives back what mp__gr_reserve reserved for q, its puts about to be
 * made. Under the lock. */
static void mp__gr_unreserve(const mp__gr_room_t *q) {
  mp__gr.resexecs -= q->execs;
  mp__gr.resgholds -= q->gholds;
  mp__gr.resnodes -= q->nodes;
  mp__gr.resembeds -= q->embeds;
}

/* mp__gr_reserve of q, with an entry of gholds for each slot graph
 * `copied` holds and one of execs for each slot graph `taken` holds
 * (NULL: none), added to q, taking the lock. False with q zero when
 * refused. */
static bool mp__gr_reserved(mp__gr_room_t *q, mp__cugraph copied,
                            mp__cugraph taken) {
  mp__gr_lock();
  q->gholds += mp__graph_slots(copied);
  q->execs += mp__graph_slots(taken);
  bool ok = mp__gr_reserve(q);
  if (!ok)
    *q = (mp__gr_room_t){0};
  pthread_mutex_unlock(&mp__gr.lock);
  return ok;
}

/* Room for one more executable in the table (beside those reserved).
 * Under the lock. */
static bool mp__execs_room(void) {
  struct mp__pl_exec *t =
      mp__grown(mp__gr.execs, &mp__gr.roomexecs,
                mp__gr.nexecs + mp__gr.resexecs + 1, sizeof *t, MP__PL_EXECS);
  if (t == NULL)
    return false;
  mp__gr.execs = t;
  return true;
}

/* Whether output o is one mp__outputs_held makes the program's block. */
static bool mp__output_unheld(const struct mp__pl_out *o) {
  return !o->inner && !o->live;
}

/* Takes out of the table the first k of capture c's outputs
 * mp__outputs_put put. Under the lock. */
static void mp__outputs_unput(mp__pl_capture_t *c, size_t k) {
  mp__pl_block_t b;
  while (k-- > 0)
    if (mp__output_unheld(&c->outs[k]))
      (void)mp__pl_table_take(c->outs[k].p, &b);
}

/* Puts in the table capture c's outputs mp__outputs_held makes the
 * program's; false, none put, when the table has no host memory for one.
 * Under the lock. */
static bool mp__outputs_put(mp__pl_capture_t *c) {
  size_t k = 0;
  while (k < c->nouts &&
         (!mp__output_unheld(&c->outs[k]) ||
          mp__pl_table_put_pool(c->outs[k].p, c->outs[k].size, 0, c->pool)))
    k++;
  if (k == c->nouts)
    return true;
  mp__outputs_unput(c, k);
  return false;
}

/* After mp__outputs_put: capture c's outputs are the program's (traced as
 * allocated) and no longer outputs; mp__outmask_rebuild to follow. Under
 * the lock. */
static void mp__outputs_owned(mp__pl_capture_t *c) {
  for (size_t k = 0; k < c->nouts; k++) {
    struct mp__pl_out *o = &c->outs[k];
    if (mp__output_unheld(o))
      mp__pl_record_alloc(o->p, o->size, 0, true);
    o->live = o->inner = true;
  }
}

/* Capture c's outputs not inner become the program's blocks for good
 * (traced as allocated: the capture's end traced them freed, and the
 * program's free of one is traced), and no longer outputs. False, with
 * nothing changed, when the table had no host memory for one: those put
 * already are taken out again. Before, a put that failed was ignored: the
 * output, neither in the table nor an output any more, could not be freed
 * (a pointer in the pool's memory the pool never handed out), and the
 * trace had a free of each output held with no allocation. Under the
 * lock. */
static bool mp__outputs_held(mp__pl_capture_t *c) {
  if (!mp__outputs_put(c))
    return false;
  mp__outputs_owned(c);
  mp__outmask_rebuild();
  return true;
}

/* Executable x holds slot i, its launches allocating the slot's
 * outputs. Without room in the table its replays may use the memory until
 * exit, and its launches are not seen: the slot is kept, its outputs
 * allocations for the graph's life (the program's to free once), as
 * before 2026-12-01. False when not even those could be recorded
 * (mp__outputs_held: the slot is kept, its outputs left as they were).
 * Under the lock. */
static bool mp__exec_hold(mp__cugraphexec x, unsigned i, bool auto_free) {
  mp__pl_capture_t *c = &mp__gr.caps[i];
  if (!mp__execs_room()) {
    c->kept = true;
    return mp__outputs_held(c);
  }
  mp__gr.execs[mp__gr.nexecs++] =
      (struct mp__pl_exec){.x = x, .cap = i, .auto_free = auto_free};
  c->execs++;
  return true;
}

/* Every slot graph g holds is kept until exit, its outputs the program's
 * blocks for good (mp__outputs_held), for an executable of g the table
 * has no room for (mp__exec_hold). False, with nothing changed, when the
 * table of pointers has no room for the outputs of one: those of the
 * slots before it are taken out again, which stay as they were. Before,
 * the slots before it stayed kept, their outputs the program's, though
 * the instantiation was refused: their graph pools lived until exit.
 * Under the lock. */
static bool mp__graph_held(mp__cugraph g) {
  unsigned i = 0;
  while (i < MP__PL_CAPTURES &&
         (!mp__capture_into(i, g) || mp__outputs_put(&mp__gr.caps[i])))
    i++;
  bool all = i == MP__PL_CAPTURES;
  while (!all && i-- > 0)
    if (mp__capture_into(i, g))
      mp__outputs_unput(&mp__gr.caps[i], mp__gr.caps[i].nouts);
  for (i = 0; all && i < MP__PL_CAPTURES; i++)
    if (mp__capture_into(i, g)) {
      mp__gr.caps[i].kept = true;
      mp__outputs_owned(&mp__gr.caps[i]);
    }
  mp__outmask_rebuild();
  return all;
}

/* After an instantiation that returned r: the executable holds its
 * graph's graph pools (one per capture into the graph). Returns r, or,
 * when neither the executables' table could grow for all its slots nor
 * the outputs be recorded as the program's (mp__graph_held: the slots
 * kept instead), CUDA_ERROR_OUT_OF_MEMORY with
 * the executable destroyed again and *phGraphExec NULL: its launches would
 * have allocated outputs no table knew, whose frees were refused. The
 * code: as a launch without host memory for its outputs (mp__launch),
 * "unable to allocate enough memory or other resources to perform the
 * requested operation" (cuda.h, CUresult); cuGraphInstantiate's list
 * names none for a resource it lacks. A refused instantiation changes
 * nothing. */
static mp__curesult mp__exec_made(mp__curesult r, mp__cugraphexec *phGraphExec,
                                  mp__cugraph hGraph,
                                  unsigned long long flags) {
  if (r != MP__CU_SUCCESS || phGraphExec == NULL)
    return r;
  mp__cugraphexec x = *phGraphExec;
  mp__gr_lock();
  mp__gr_room_t q = {.execs = mp__graph_slots(hGraph)};
  bool room = mp__gr_reserve(&q), held = room || mp__graph_held(hGraph);
  if (room) { /* reserved: an entry for every slot */
    mp__gr_unreserve(&q);
    for (unsigned i = 0; i < MP__PL_CAPTURES; i++)
      if (mp__capture_into(i, hGraph))
        (void)mp__exec_hold(x, i, flags & MP__GRAPH_AUTO_FREE_ON_LAUNCH);
  }
  pthread_mutex_unlock(&mp__gr.lock);
  if (held)
    return r;
  mp__curesult (*destroy)(mp__cugraphexec) =
      mp__pl_real_cuda()->cuGraphExecDestroy;
  if (destroy != NULL)
    (void)destroy(x);
  *phGraphExec = NULL;
  return MP__CU_OUT_OF_MEMORY;
}

mp__curesult cuGraphInstantiateWithFlags(mp__cugraphexec *phGraphExec,
                                         mp__cugraph hGraph,
                                         unsigned long long flags) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return mp__exec_made(
      rc->cuGraphInstantiateWithFlags
          ? rc->cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags)
          : MP__CU_NOT_INITIALIZED,
      phGraphExec, hGraph, flags);
}

/* The forms before CUDA 12.0 (an error node and a log buffer): what
 * binaries built with older headers call by name, and what the driver
 * answers cuGetProcAddress("cuGraphInstantiate") with below 12000 (which
 * the CUDA 11 runtime's cudaGraphInstantiate asks). An executable made
 * through them holds its graph pools as any other; before, it was not
 * counted, and a cuGraphDestroy of its graph released them under it. */
typedef mp__curesult (*mp__instantiate_legacy_fn)(mp__cugraphexec *,
                                                  mp__cugraph,
                                                  mp__cugraphnode *, char *,
                                                  size_t);

static mp__curesult mp__instantiate_legacy(mp__instantiate_legacy_fn real,
                                           mp__cugraphexec *phGraphExec,
                                           mp__cugraph hGraph,
                                           mp__cugraphnode *phErrorNode,
                                           char *logBuffer, size_t bufferSize) {
  return mp__exec_made(
      real ? real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)
           : MP__CU_NOT_INITIALIZED,
      phGraphExec, hGraph, 0);
}

mp__curesult cuGraphInstantiate(mp__cugraphexec *phGraphExec,
                                mp__cugraph hGraph,
                                mp__cugraphnode *phErrorNode, char *logBuffer,
                                size_t bufferSize) {
  return mp__instantiate_legacy(mp__pl_real_cuda()->cuGraphInstantiate,
                                phGraphExec, hGraph, phErrorNode, logBuffer,
                                bufferSize);
}

mp__curesult cuGraphInstantiate_v2(mp__cugraphexec *phGraphExec,
                                   mp__cugraph hGraph,
                                   mp__cugraphnode *phErrorNode,
                                   char *logBuffer, size_t bufferSize) {
  return mp__instantiate_legacy(mp__pl_real_cuda()->cuGraphInstantiate_v2,
                                phGraphExec, hGraph, phErrorNode, logBuffer,
                                bufferSize);
}

typedef mp__curesult (*mp__instantiate_params_fn)(mp__cugraphexec *,
                                                  mp__cugraph,
                                                  mp__cugraphparams);

static mp__curesult mp__instantiate_params(mp__instantiate_params_fn real,
                                           mp__cugraphexec *phGraphExec,
                                           mp__cugraph hGraph,
                                           mp__cugraphparams params) {
  /* cuda.h: CUDA_GRAPH_INSTANTIATE_PARAMS begins with its cuuint64_t
   * flags, those of cuGraphInstantiateWithFlags. */
  uint64_t flags = 0;
  if (params != NULL)
    memcpy(&flags, (const void *)params, sizeof flags);
  return mp__exec_made(real ? real(phGraphExec, hGraph, params)
                            : MP__CU_NOT_INITIALIZED,
                       phGraphExec, hGraph, flags);
}

mp__curesult cuGraphInstantiateWithParams(mp__cugraphexec *phGraphExec,
                                          mp__cugraph hGraph,
                                          mp__cugraphparams params) {
  return mp__instantiate_params(
      mp__pl_real_cuda()->cuGraphInstantiateWithParams, phGraphExec, hGraph,
      params);
}

mp__curesult cuGraphInstantiateWithParams_ptsz(mp__cugraphexec *phGraphExec,
                                               mp__cugraph hGraph,
                                               mp__cugraphparams params) {
  return mp__instantiate_params(
      mp__pl_real_cuda()->cuGraphInstantiateWithParams_ptsz, phGraphExec,
      hGraph, params);
}

/* A name for a handle being destroyed, that no handle of the driver's
 * can be (odd: the driver's are addresses of its objects), different for
 * each destroy under way. A destroy renames the handle's entries in the
 * tables before the real destroy and releases them by that name after it
 * (or names them back if it was refused): the driver may give the handle
 * to a new graph or executable as soon as the real destroy returns, and
 * another thread's clone or instantiation may note the new one's holds
 * under it before this destroy takes the lock again. Released by handle
 * after the real destroy, those holds were taken for the old one's and
 * dropped: the new graph or executable held nothing, and the graph pool
 * went under it. */
static uintptr_t mp__dying_name(void) {
  static atomic_uintptr_t seq;
  return atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed) << 1 | 1;
}

/* Renames executable `from`'s entries `to`. Under the lock. */
static void mp__execs_rename(mp__cugraphexec from, mp__cugraphexec to) {
  for (size_t i = 0; i < mp__gr.nexecs; i++)
    if (mp__gr.execs[i].x == from)
      mp__gr.execs[i].x = to;
}

/* Renames graph `from` `to` in the slots it ended into, its copies'
 * holds, its child graph nodes and its embedded graphs. Under the lock. */
static void mp__graph_rename(mp__cugraph from, mp__cugraph to) {
  for (size_t k = 0; k < mp__gr.ngholds; k++)
    if (mp__gr.gholds[k].g == from)
      mp__gr.gholds[k].g = to;
  for (size_t k = 0; k < mp__gr.nnodes; k++)
    if (mp__gr.nodes[k].parent == from)
      mp__gr.nodes[k].parent = to;
  for (size_t k = 0; k < mp__gr.nembeds; k++) {
    if (mp__gr.embeds[k].e == from)
      mp__gr.embeds[k].e = to;
    if (mp__gr.embeds[k].root == from)
      mp__gr.embeds[k].root = to;
  }
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    if (c->used && !c->capturing && c->g == from)
      c->g = to;
  }
}

mp__curesult cuGraphExecDestroy(mp__cugraphexec hGraphExec) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuGraphExecDestroy == NULL)
    return MP__CU_NOT_INITIALIZED;
  mp__cugraphexec dying = (mp__cugraphexec)mp__dying_name();
  mp__gr_lock();
  mp__execs_rename(hGraphExec, dying);
  pthread_mutex_unlock(&mp__gr.lock);
  mp__curesult r = rc->cuGraphExecDestroy(hGraphExec);
  mp__gr_lock();
  if (r != MP__CU_SUCCESS) {
    mp__execs_rename(dying, hGraphExec);
    pthread_mutex_unlock(&mp__gr.lock);
    return r;
  }
  for (size_t i = 0; i < mp__gr.nexecs;) {
    if (mp__gr.execs[i].x != dying) {
      i++;
      continue;
    }
    mp__pl_capture_t *c = &mp__gr.caps[mp__gr.execs[i].cap];
    mp__gr.execs[i] = mp__gr.execs[--mp__gr.nexecs];
    c->execs--;
    mp__capture_unheld(c);
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* After the real launch n on the stream traced as ts (launched: it went
 * through), each output mp__launching put in the table for it: traced as
 * allocated, then its
 * entry's claim lifted (the program's to free from now on: the trace has
 * the allocation before any free of it), or, the launch refused, out of
 * the table again and not allocated; a slot nothing holds any more is
 * released then (mp__capture_unheld keeps one with outputs in flight).
 * Found by the launch's number, not through its executable: the program
 * may destroy the executable while the launch is in its real call
 * (cuda.h, cuGraphExecDestroy: "If the executable graph is in-flight, it
 * will not be terminated, but rather freed asynchronously on
 * completion"). Before, found through the executable's entries, which the
 * destroy had taken out: the launch's outputs stayed claimed for good
 * (their free refused, every later launch of another executable of the
 * graph waiting for ever), and, the graph destroyed before, the slot was
 * released under them. Under the lock. */
static void mp__launch_over(uintptr_t ts, bool launched, uint64_t n) {
  for (size_t i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    bool had = false;
    for (size_t k = 0; c->used && !c->capturing && k < c->nouts; k++) {
      struct mp__pl_out *o = &c->outs[k];
      if (o->launching != n)
        continue;
      had = true;
      mp__pl_block_t b = {.ptr = o->p, .claim = o->claim};
      o->launching = o->claim = 0;
      if (launched)
        mp__pl_record_alloc(o->p, o->size, ts, true);
      else
        o->live = false;
      mp__pl_table_end(&b, !launched);
    }
    if (had)
      mp__capture_unheld(c);
  }
}

/* Before the real launch of x on the stream traced as ts
 * (mp__pl_record_stream), numbered *n: its outputs not allocated are put
 * in the table (blocks of their pool, on ts) and allocated, so that
 * nothing the launch allocates is unknown to the
 * table. False, with nothing changed, when the table had no host memory
 * for one: the outputs already put are taken out again. Before, the
 * launch went ahead and an output the table could not record was
 * allocated but unknown: its free refused as a pointer in the pool's
 * memory the pool never handed out, and every later launch refused as one
 * with an allocation still unfreed.
 * Each entry goes in claimed by the launch, until the real launch has
 * returned (mp__launch_over): a free of the output meanwhile (another
 * thread's, racing the launch) finds no entry and is answered as one of an
 * address no launch allocated yet, CUDA_ERROR_INVALID_VALUE (cuda.h,
 * cuMemFree: dptr "must have been returned by a previous call to one of
 * the following memory allocation APIs", and a graph's allocation is made
 * by its launch, cuGraphAddMemAllocNode: accessible "by stream operations
 * ordered after the graph's execution"), the free ordered before the
 * launch. Before, the free was accepted and traced, the launch's
 * allocation never traced: a free of nothing in the trace, and the output
 * allocated again by the next launch while this one's ran. Under the
 * lock. */
static bool mp__launching(mp__cugraphexec x, uintptr_t ts, uint64_t *n) {
  bool room = true;
  *n = ++mp__gr.launches;
  for (size_t i = 0; room && i < mp__gr.nexecs; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[mp__gr.execs[i].cap];
    for (size_t k = 0; room && mp__gr.execs[i].x == x &&
                       !mp__gr.execs[i].held && k < c->nouts;
         k++) {
      struct mp__pl_out *o = &c->outs[k];
      mp__pl_block_t b;
      if (o->live || o->inner)
        continue;
      room = mp__pl_table_put_pool_claimed(o->p, o->size, ts, c->pool, &b);
      o->live = room;
      o->launching = room ? *n : 0;
      o->claim = room ? b.claim : 0;
    }
  }
  if (!room)
    mp__launch_over(ts, false, *n);
  return room;
}

/* What a launch of x finds of its earlier launches' outputs (x not
 * freeing them at launch; cuda.h, cuGraphLaunch): MP__LAUNCH_WAIT, one put
 * in the table by a launch still in its real call (mp__launching; such an
 * output is allocated too); MP__LAUNCH_UNFREED, one still allocated, the
 * program's; MP__LAUNCH_GO, none. One walk of x's outputs. Under the
 * lock. */
enum { MP__LAUNCH_GO, MP__LAUNCH_UNFREED, MP__LAUNCH_WAIT };
static int mp__launch_finds(mp__cugraphexec x) {
  int found = MP__LAUNCH_GO;
  for (size_t i = 0; i < mp__gr.nexecs; i++) {
    const struct mp__pl_exec *e = &mp__gr.execs[i];
    const mp__pl_capture_t *c = &mp__gr.caps[e->cap];
    for (size_t k = 0; e->x == x && !e->auto_free && !e->held && k < c->nouts;
         k++) {
      const struct mp__pl_out *o = &c->outs[k];
      if (o->launching != 0)
        return MP__LAUNCH_WAIT;
      if (o->live && !o->inner)
        found = MP__LAUNCH_UNFREED;
    }
  }
  return found;
}

/* This thread is in a real launch. A launch made from inside one (from a
 * host function the driver runs in its call) is not ordered after it: it
 * would wait for itself, and is refused instead (mp__launch_made). */
static _Thread_local bool mp__in_launch;

/* mp__launch of x on s (ptsz: a _ptsz call), for an executable whose
 * outputs the shim keeps. */
static mp__curesult
mp__launch_made(mp__curesult (*real)(mp__cugraphexec, mp__custream),
                mp__cugraphexec x, mp__custream s, bool ptsz) {
  uintptr_t ts = mp__pl_record_stream(s, ptsz); /* s as traced */
  mp__gr_lock();
  /* A launch of an executable that does not free its outputs at launch,
   * made while another launch of it is in its real call (another thread's),
   * waits for that one to be over, and is then answered as the driver
   * answers a launch made after it: cuda.h, cuGraphLaunch, "Each launch is
   * ordered behind ... any previous launches of hGraphExec", and "If any
   * allocations created by hGraphExec remain unfreed (from a previous
   * launch) and hGraphExec was not instantiated with
   * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, the launch will fail
   * with CUDA_ERROR_INVALID_VALUE"; graph objects are not internally
   * synchronized, their calls serialized by the program (CUDA Driver API,
   * "Graph object thread safety"), so the driver sees one launch after
   * the other. Refused, the first allocated nothing, and the second goes
   * ahead; made, the second is refused (its outputs unfreed). Before, the
   * second was refused at once, as if the first's outputs were allocated,
   * also when the driver then refused the first: neither launch went
   * through, which no order of the two gives. */
  int finds;
  bool asked = false;
  while ((finds = mp__launch_finds(x)) == MP__LAUNCH_WAIT && !mp__in_launch) {
    /* Before the first wait: a host function that a real driver runs on a
     * thread of its own waits for no launch (below), asked with no lock
     * held. */
    if (!asked) {
      asked = true;
      pthread_mutex_unlock(&mp__gr.lock);
      bool refused = mp__pl_calls_refused();
      mp__gr_lock();
      if (refused) {
        pthread_mutex_unlock(&mp__gr.lock);
        return MP__CU_NOT_PERMITTED;
      }
      continue;
    }
    pthread_cond_wait(&mp__gr.launch_over, &mp__gr.lock);
  }
  bool allowed = finds == MP__LAUNCH_GO;
  uint64_t n = 0;
  bool room = allowed && mp__launching(x, ts, &n);
  pthread_mutex_unlock(&mp__gr.lock);
  /* A call from a host function (cuda.h, cuLaunchHostFunc: "The host
   * function must not make any CUDA API calls. Attempting to use a CUDA
   * API may result in CUDA_ERROR_NOT_PERMITTED") that the shim would
   * refuse or wait for is answered as the driver answers calls there
   * (mp__pl_calls_refused), asked with no lock held: made from inside a
   * launch of this thread that claimed its outputs (the fake driver runs
   * host functions in the launching call), which it cannot wait for; made
   * on the driver's own thread (a real driver's host functions) while
   * another thread's launch claims them, which it need not wait for; or
   * finding outputs unfreed. Elsewhere a launch whose outputs are
   * allocated is refused as the driver refuses it. Nothing claimed either
   * way. Before, a host function's launch was answered
   * CUDA_ERROR_INVALID_VALUE, on a real driver after waiting for the
   * other thread's launch. */
  if (!allowed && mp__pl_calls_refused())
    return MP__CU_NOT_PERMITTED;
  if (!allowed)
    return MP__CU_INVALID_VALUE; /* the driver's answer (cuGraphLaunch) */
  /* No host memory to record what the launch allocates: the launch is not
   * made (nothing allocated, nothing run), and the answer is
   * CUDA_ERROR_OUT_OF_MEMORY, "unable to allocate enough memory or other
   * resources to perform the requested operation" (cuda.h, CUresult).
   * cuGraphLaunch's own list in cuda.h names no code for a resource it
   * lacks; that is the one whose meaning fits, and a program checks it as
   * it checks any failed allocation. */
  if (!room)
    return MP__CU_OUT_OF_MEMORY;
  bool nested = mp__in_launch;
  mp__in_launch = true;
  mp__curesult r = real(x, s);
  mp__in_launch = nested;
  mp__gr_lock();
  mp__launch_over(ts, r == MP__CU_SUCCESS, n);
  pthread_cond_broadcast(&mp__gr.launch_over);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

static mp__curesult mp__launch(mp__curesult (*real)(mp__cugraphexec,
                                                    mp__custream),
                               mp__cugraphexec x, mp__custream s, bool ptsz) {
  if (real == NULL)
    return MP__CU_NOT_INITIALIZED;
  if (atomic_load_explicit(&mp__gr_outmask, memory_order_relaxed) == 0)
    return real(x, s); /* no graph has outputs: nothing to keep */
  /* Not cancelled (pthread_cancel) before the launch is over: its wait
   * (mp__launch_made) is a cancellation point (pthreads(7)), acted on with the
   * lock taken again, which the thread would end holding (every later graph
   * call hung), and a real call cancelled at one of the driver's left its
   * outputs claimed and in flight for good (later launches of x waiting
   * for ever, a free of one refused). Its cancellation takes effect at its
   * next cancellation point after the launch. */
  int cancel;
  (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
  mp__curesult r = mp__launch_made(real, x, s, ptsz);
  (void)pthread_setcancelstate(cancel, NULL);
  return r;
}

mp__curesult cuGraphLaunch(mp__cugraphexec hGraphExec, mp__custream hStream) {
  return mp__launch(mp__pl_real_cuda()->cuGraphLaunch, hGraphExec, hStream,
                    false);
}

mp__curesult cuGraphLaunch_ptsz(mp__cugraphexec hGraphExec,
                                mp__custream hStream) {
  return mp__launch(mp__pl_real_cuda()->cuGraphLaunch_ptsz, hGraphExec, hStream,
                    true);
}

/* Slot c's graph (c->g) holds it no more: released if nothing else does.
 * Under the lock. */
static void mp__capture_ungraphed(mp__pl_capture_t *c) {
  c->g = NULL;
  c->via = 0;
  mp__capture_unheld(c);
}

/* Graph g holds nothing any more (destroyed, or moved into another):
 * the slots only it held are released. Under the lock. */
static void mp__graph_release(mp__cugraph g) {
  for (size_t k = 0; k < mp__gr.ngholds;) {
    if (mp__gr.gholds[k].g != g) {
      k++;
      continue;
    }
    mp__pl_capture_t *c = &mp__gr.caps[mp__gr.gholds[k].cap];
    mp__gr.gholds[k] = mp__gr.gholds[--mp__gr.ngholds];
    c->graphs--;
    mp__capture_unheld(c);
  }
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    if (c->used && !c->capturing && c->g == g)
      mp__capture_ungraphed(c);
  }
}

mp__curesult cuGraphDestroy(mp__cugraph hGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuGraphDestroy == NULL)
    return MP__CU_NOT_INITIALIZED;
  if (hGraph == NULL) /* no graph: the driver's answer, nothing held */
    return rc->cuGraphDestroy(hGraph);
  /* Renamed for the real destroy, as an executable (mp__dying_name). */
  mp__cugraph dying = (mp__cugraph)mp__dying_name();
  mp__gr_lock();
  mp__graph_rename(hGraph, dying);
  pthread_mutex_unlock(&mp__gr.lock);
  mp__curesult r = rc->cuGraphDestroy(hGraph);
  mp__gr_lock();
  if (r != MP__CU_SUCCESS) {
    mp__graph_rename(dying, hGraph);
    pthread_mutex_unlock(&mp__gr.lock);
    return r;
  }
  /* Its child graph nodes and embedded graphs went with it (a graph moved
   * into it too: cuda.h, CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, "will be
   * destroyed when the parent is destroyed"). */
  for (size_t k = 0; k < mp__gr.nnodes;)
    if (mp__graph_root(mp__gr.nodes[k].parent) == dying)
      mp__gr.nodes[k] = mp__gr.nodes[--mp__gr.nnodes];
    else
      k++;
  for (size_t k = 0; k < mp__gr.nembeds;)
    if (mp__gr.embeds[k].root == dying || mp__gr.embeds[k].e == dying)
      mp__gr.embeds[k] = mp__gr.embeds[--mp__gr.nembeds];
    else
      k++;
  mp__graph_release(dying);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* Whether graph g (a root: mp__graph_root) holds slot i for as long as g
 * lives: a copy's hold, or its capture's end into g itself, not into a
 * graph embedded in g (a node's destruction ends that hold:
 * cuGraphDestroyNode). Under the lock. */
static bool mp__capture_firm(unsigned i, mp__cugraph g) {
  const mp__pl_capture_t *c = &mp__gr.caps[i];
  if (g == NULL || !c->used || c->capturing)
    return false;
  for (size_t k = 0; k < mp__gr.ngholds; k++)
    if (mp__gr.gholds[k].g == g && mp__gr.gholds[k].cap == i)
      return true;
  return c->g == g && c->via == 0;
}

/* Graph g now holds every slot that graph `from` holds: g is a copy of it, or
 * has one in a child graph node. A copy's replays use the same memory
 * (the graph pool's, at the addresses the capture gave) and its launches
 * allocate the same outputs, so the graph pool stays until the original,
 * every copy and every executable of any of them are destroyed. Without
 * room to note it, the graph pool is kept until exit. Under the lock. */
static void mp__graph_copied(mp__cugraph g, mp__cugraph from) {
  g = mp__graph_root(g); /* copied into an embedded graph: into its root */
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
    mp__pl_capture_t *c = &mp__gr.caps[i];
    if (!mp__capture_into(i, from) || mp__capture_firm(i, g))
      continue;
    struct mp__pl_ghold *t =
        mp__grown(mp__gr.gholds, &mp__gr.roomgholds,
                  mp__gr.ngholds + mp__gr.resgholds + 1, sizeof *t, 16);
    if (t == NULL) {  /* not reserved (mp__gr_reserve) and no room */
      c->kept = true; /* its copies' executables unseen: as exec_hold */
      (void)mp__outputs_held(c);
      continue;
    }
    mp__gr.gholds = t;
    mp__gr.gholds[mp__gr.ngholds++] = (struct mp__pl_ghold){.g = g, .cap = i};
    c->graphs++;
  }
}

/* Every slot g holds is kept until exit (something g's copies hold could
 * not be noted). Under the lock. */
static void mp__graph_kept(mp__cugraph g) {
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++)
    if (mp__capture_into(i, g) && !mp__gr.caps[i].kept) {
      mp__gr.caps[i].kept = true;
      (void)mp__outputs_held(&mp__gr.caps[i]); /* as graph_copied */
    }
}

/* Child graph node n was added to graph parent. Under the lock. */
static void mp__node_note(mp__cugraphnode n, mp__cugraph parent) {
  size_t k = 0;
  while (k < mp__gr.nnodes && mp__gr.nodes[k].n != n)
    k++; /* a handle given again after its node went */
  if (k == mp__gr.nnodes) {
    struct mp__pl_node *t =
        mp__grown(mp__gr.nodes, &mp__gr.roomnodes,
                  mp__gr.nnodes + mp__gr.resnodes + 1, sizeof *t, 16);
    if (t == NULL) {
      mp__graph_kept(parent);
      return;
    }
    mp__gr.nodes = t;
    mp__gr.nnodes++;
  }
  mp__gr.nodes[k] = (struct mp__pl_node){.n = n, .parent = parent};
}

/* The graph child graph node n was noted in (mp__node_note), or NULL for
 * a node the shim does not know. Under the lock. */
static mp__cugraph mp__node_parent(mp__cugraphnode n) {
  for (size_t k = 0; k < mp__gr.nnodes; k++)
    if (mp__gr.nodes[k].n == n)
      return mp__gr.nodes[k].parent;
  return NULL;
}

/* Graph e is embedded in node (NULL: not known) of graph in, a graph of
 * root's (root itself, or one embedded in it). Under the lock. */
static void mp__embed_note(mp__cugraph e, mp__cugraph root,
                           mp__cugraphnode node, mp__cugraph in) {
  size_t k = 0;
  while (k < mp__gr.nembeds && mp__gr.embeds[k].e != e)
    k++;
  if (k == mp__gr.nembeds) {
    struct mp__pl_embed *t =
        mp__grown(mp__gr.embeds, &mp__gr.roomembeds,
                  mp__gr.nembeds + mp__gr.resembeds + 1, sizeof *t, 16);
    if (t == NULL) {
      mp__graph_kept(root);
      return;
    }
    mp__gr.embeds = t;
    mp__gr.nembeds++;
    t[k].id = ++mp__gr.embed_ids;
  }
  mp__gr.embeds[k] = (struct mp__pl_embed){
      .e = e, .root = root, .in = in, .node = node, .id = mp__gr.embeds[k].id};
}

/* Reserves (mp__gr_reserved) in *q what mp__child_added of child into a
 * node (node NULL: not given) puts: what child holds, the node, and child
 * when moved. */
static bool mp__child_reserved(mp__gr_room_t *q, const mp__cugraphnode *node,
                               mp__cugraph child, bool moved) {
  *q = (mp__gr_room_t){.nodes = node != NULL, .embeds = moved};
  return mp__gr_reserved(q, child, NULL);
}

/* After an addition to g of a child graph node *node (NULL: not given)
 * made from child that returned r, q reserved for it (mp__child_reserved): g
 * (its root) holds what child holds; moved
 * (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE), child is g's, to be destroyed with it,
 * not by the program: child holds nothing of its own any longer and is embedded
 * in g's root, as the graphs embedded in it are. Returns r. */
static mp__curesult mp__child_added(mp__curesult r, const mp__gr_room_t *q,
                                    const mp__cugraphnode *node, mp__cugraph g,
                                    mp__cugraph child, bool moved) {
  mp__gr_lock();
  mp__gr_unreserve(q);
  if (r != MP__CU_SUCCESS) {
    pthread_mutex_unlock(&mp__gr.lock);
    return r;
  }
  mp__graph_copied(g, child);
  if (moved) {
    mp__cugraph root = mp__graph_root(g);
    mp__graph_release(child);
    for (size_t k = 0; k < mp__gr.nembeds; k++)
      if (mp__gr.embeds[k].root == child)
        mp__gr.embeds[k].root = root;
    mp__embed_note(child, root, node != NULL ? *node : NULL, g);
  }
  if (node != NULL)
    mp__node_note(*node, g);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* The flags executable x was instantiated with, in *flags: the driver's
 * (cuda.h, cuGraphExecGetFlags, CUDA 12.0: "Returns the flags that were
 * passed to instantiation", answering CUDA_SUCCESS or
 * CUDA_ERROR_INVALID_VALUE), none without the call. Asked before a call
 * that gives x more of the shim's slots (mp__exec_takes), which, refused
 * here, is refused with the driver's code and changes nothing. Before, a
 * refusal read as no flags (no auto-free on launch), and a later launch
 * with outputs unfreed was refused CUDA_ERROR_INVALID_VALUE where the
 * driver, x freeing them at launch, would have made it. */
static mp__curesult mp__exec_flags(mp__cugraphexec x, uint64_t *flags) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  *flags = 0;
  if (rc->cuGraphExecGetFlags == NULL)
    return MP__CU_SUCCESS;
  mp__curesult r = rc->cuGraphExecGetFlags(x, flags);
  if (r != MP__CU_SUCCESS)
    *flags = 0;
  return r;
}

/* Executable x holds every slot g holds that it did not (room reserved
 * for them: mp__gr_reserved). Under the lock. */
static void mp__exec_takes(mp__cugraphexec x, mp__cugraph g, uint64_t flags) {
  for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
    bool has = false;
    for (size_t k = 0; !has && k < mp__gr.nexecs; k++)
      has = mp__gr.execs[k].x == x && mp__gr.execs[k].cap == i;
    if (!has && mp__capture_into(i, g)) /* updated already: kept at worst */
      (void)mp__exec_hold(x, i, flags & MP__GRAPH_AUTO_FREE_ON_LAUNCH);
  }
}

/* cuda.h, cuGraphClone: "creates a copy of originalGraph", child graph
 * nodes "recursively copied into the clone"; and cuGraphAddChildGraphNode:
 * "The child graph is cloned in this call". cuda.h allows neither for a
 * graph with memory allocation or free nodes (cuGraphAddMemAllocNode: "The
 * graph cannot be cloned", and in a child node only if moved), but the
 * graph the shim's pool served has none, so the driver copies it: before,
 * the copy outlived the graph pool its memory came from (the original's
 * destruction released it), and its replays wrote memory handed out to
 * others. */
mp__curesult cuGraphClone(mp__cugraph *phGraphClone,
                          mp__cugraph originalGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q = {0};
  /* cuda.h, cuGraphClone: CUDA_ERROR_OUT_OF_MEMORY is among its codes. */
  if (!mp__gr_reserved(&q, originalGraph, NULL))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r = rc->cuGraphClone
                       ? rc->cuGraphClone(phGraphClone, originalGraph)
                       : MP__CU_NOT_INITIALIZED;
  mp__gr_lock();
  mp__gr_unreserve(&q);
  if (r == MP__CU_SUCCESS && phGraphClone != NULL)
    mp__graph_copied(*phGraphClone, originalGraph);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

mp__curesult cuGraphAddChildGraphNode(mp__cugraphnode *phGraphNode,
                                      mp__cugraph hGraph,
                                      const mp__cugraphnode *dependencies,
                                      size_t numDependencies,
                                      mp__cugraph childGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q;
  /* cuda.h, cuGraphAddChildGraphNode lists CUDA_ERROR_DEINITIALIZED,
   * _NOT_INITIALIZED and _INVALID_VALUE, none for a resource it lacks:
   * out of memory, as mp__gr_reserve says. */
  if (!mp__child_reserved(&q, phGraphNode, childGraph, false))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r =
      rc->cuGraphAddChildGraphNode
          ? rc->cuGraphAddChildGraphNode(phGraphNode, hGraph, dependencies,
                                         numDependencies, childGraph)
          : MP__CU_NOT_INITIALIZED;
  return mp__child_added(r, &q, phGraphNode, hGraph, childGraph, false);
}

/* A child graph node's graph and ownership from the parameters p of
 * cuGraphAddNode or cuGraphExecNodeSetParams (cuda.h, CUgraphNodeParams:
 * type, then the union's CUDA_CHILD_GRAPH_NODE_PARAMS graph), or false
 * for another node type. */
static bool mp__child_params(const mp__cugraphnodeparams *p, mp__cugraph *child,
                             bool *move) {
  unsigned type, ownership;
  if (p == NULL)
    return false;
  memcpy(&type, p, sizeof type);
  if (type != MP__GRAPH_NODE_TYPE_GRAPH)
    return false;
  memcpy(child, (const char *)p + MP__NODE_PARAMS_GRAPH, sizeof *child);
  memcpy(&ownership, (const char *)p + MP__NODE_PARAMS_OWNERSHIP,
         sizeof ownership);
  *move = ownership == MP__CHILD_GRAPH_OWNERSHIP_MOVE;
  return true;
}

/* cuda.h, cuGraphAddNode: "Creates a new node in hGraph described by
 * nodeParams"; for a CU_GRAPH_NODE_TYPE_GRAPH node,
 * CUDA_CHILD_GRAPH_NODE_PARAMS.graph is "The child graph to clone into the
 * node", CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE ("Child graph is cloned into
 * the parent"), as cuGraphAddChildGraphNode, or _MOVE ("The child graph is
 * moved to the parent. The handle to the child graph is owned by the
 * parent and will be destroyed when the parent is destroyed"; it "Cannot
 * be independently instantiated or destroyed"): then the parent holds
 * what the child held, and the child as an embedded graph
 * (mp__child_added). Before, neither was seen: a clone's graph pool was
 * released under the parent's executables with the child's destruction,
 * and a moved graph's, which the program may not destroy, lived until
 * exit. The form before CUDA 12.3 (cudaTypedefs.h:
 * PFN_cuGraphAddNode_v12020) and 12.3's, with edge data. */
/* The body graphs a node with parameters p has (CUDA_CONDITIONAL_NODE_PARAMS
 * size, an input), 0 for a node not conditional. */
static unsigned mp__cond_bodies(const mp__cugraphnodeparams *p) {
  unsigned type, size = 0;
  if (p == NULL)
    return 0;
  memcpy(&type, p, sizeof type);
  if (type == MP__GRAPH_NODE_TYPE_COND)
    memcpy(&size, (const char *)p + MP__NODE_PARAMS_COND_SIZE, sizeof size);
  return size;
}

/* Reserves (mp__gr_reserved) in *q what the addition of a node with
 * parameters p puts: a child graph node's (mp__child_reserved), or a
 * conditional node's bodies (mp__node_added). */
static bool mp__node_reserved(mp__gr_room_t *q, const mp__cugraphnode *node,
                              const mp__cugraphnodeparams *p, bool graph,
                              mp__cugraph child, bool move) {
  if (graph)
    return mp__child_reserved(q, node, child, move);
  *q = (mp__gr_room_t){.embeds = mp__cond_bodies(p)};
  return q->embeds == 0 || mp__gr_reserved(q, NULL, NULL); /* else none */
}

/* After an addition to g of a node with parameters p that returned r, q
 * reserved for it (mp__node_reserved): a
 * conditional node's body graphs (cuda.h, CUDA_CONDITIONAL_NODE_PARAMS:
 * phGraph_out, a "CUDA-owned array populated with conditional node child
 * graphs during creation of the node", `size` of them, "Valid for the
 * lifetime of the conditional node", which the program may fill "using
 * graph node creation APIs or ::cuStreamBeginCaptureToGraph") are
 * embedded in g's root, which holds what a capture into one ends with
 * (mp__capture_ended), as for a graph moved into a child graph node.
 * Before, a body was a graph of its own: the graph pool of a capture into
 * it was the body's, which no executable of the parent held and the
 * program never destroys, so it lived until exit (or went with a later
 * graph given the body's handle). Returns r. */
static mp__curesult mp__node_added(mp__curesult r, const mp__gr_room_t *q,
                                   const mp__cugraphnode *node, mp__cugraph g,
                                   const mp__cugraphnodeparams *p) {
  unsigned size = mp__cond_bodies(p);
  mp__cugraph *bodies;
  if (size == 0)
    return r;
  mp__gr_lock();
  mp__gr_unreserve(q);
  if (r != MP__CU_SUCCESS) {
    pthread_mutex_unlock(&mp__gr.lock);
    return r;
  }
  memcpy(&bodies, (const char *)p + MP__NODE_PARAMS_COND_BODIES, sizeof bodies);
  mp__cugraph root = mp__graph_root(g);
  for (unsigned k = 0; bodies != NULL && k < size; k++)
    if (bodies[k] != NULL)
      mp__embed_note(bodies[k], root, node != NULL ? *node : NULL, g);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

mp__curesult cuGraphAddNode(mp__cugraphnode *phGraphNode, mp__cugraph hGraph,
                            const mp__cugraphnode *dependencies,
                            size_t numDependencies,
                            mp__cugraphnodeparams *nodeParams) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cugraph child = NULL;
  bool move = false, graph = mp__child_params(nodeParams, &child, &move);
  mp__gr_room_t q = {0};
  /* cuda.h, cuGraphAddNode lists CUDA_ERROR_INVALID_VALUE,
   * _INVALID_CONTEXT and _NOT_SUPPORTED, none for a resource it lacks: out
   * of memory, as mp__gr_reserve says. */
  if (!mp__node_reserved(&q, phGraphNode, nodeParams, graph, child, move))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r = rc->cuGraphAddNode
                       ? rc->cuGraphAddNode(phGraphNode, hGraph, dependencies,
                                            numDependencies, nodeParams)
                       : MP__CU_NOT_INITIALIZED;
  return graph ? mp__child_added(r, &q, phGraphNode, hGraph, child, move)
               : mp__node_added(r, &q, phGraphNode, hGraph, nodeParams);
}

mp__curesult cuGraphAddNode_v2(mp__cugraphnode *phGraphNode, mp__cugraph hGraph,
                               const mp__cugraphnode *dependencies,
                               const mp__cugraphedgedata *dependencyData,
                               size_t numDependencies,
                               mp__cugraphnodeparams *nodeParams) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cugraph child = NULL;
  bool move = false, graph = mp__child_params(nodeParams, &child, &move);
  mp__gr_room_t q = {0};
  if (!mp__node_reserved(&q, phGraphNode, nodeParams, graph, child, move))
    return MP__CU_OUT_OF_MEMORY; /* as cuGraphAddNode */
  mp__curesult r =
      rc->cuGraphAddNode_v2
          ? rc->cuGraphAddNode_v2(phGraphNode, hGraph, dependencies,
                                  dependencyData, numDependencies, nodeParams)
          : MP__CU_NOT_INITIALIZED;
  return graph ? mp__child_added(r, &q, phGraphNode, hGraph, child, move)
               : mp__node_added(r, &q, phGraphNode, hGraph, nodeParams);
}

/* Reserves in *q, for child graph node n when the shim knows it
 * (mp__node_note), an entry of embeds (embed) or of nodes. False with q
 * zero when refused (mp__gr_reserve). */
static bool mp__known_reserved(mp__gr_room_t *q, mp__cugraphnode n,
                               bool embed) {
  mp__gr_lock();
  bool known = mp__node_parent(n) != NULL;
  *q = (mp__gr_room_t){.nodes = known && !embed, .embeds = known && embed};
  bool ok = mp__gr_reserve(q);
  if (!ok)
    *q = (mp__gr_room_t){0};
  pthread_mutex_unlock(&mp__gr.lock);
  return ok;
}

/* cuda.h, cuGraphChildGraphNodeGetGraph: "Gets a handle to the embedded
 * graph in a child graph node. This call does not clone the graph.
 * Changes to the graph will be reflected in the node, and the node
 * retains ownership of the graph." A clone of it, a child graph node made
 * from it, an executable instantiated or updated from it use what the
 * node's parent does: the embedded graph holds as its root
 * (mp__graph_root), and what is copied into it, its root holds. Before,
 * they held nothing, and the parent's destruction released the graph
 * pools under them. A node the shim did not see added or found in a
 * clone (cuGraphNodeFindInClone; one of cuGraphGetNodes) is not known:
 * its graph holds nothing. */
mp__curesult cuGraphChildGraphNodeGetGraph(mp__cugraphnode hNode,
                                           mp__cugraph *phGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q;
  /* cuda.h, cuGraphChildGraphNodeGetGraph lists CUDA_ERROR_DEINITIALIZED,
   * _NOT_INITIALIZED and _INVALID_VALUE, none for a resource it lacks: out
   * of memory, as mp__gr_reserve says. */
  if (!mp__known_reserved(&q, hNode, true))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r = rc->cuGraphChildGraphNodeGetGraph
                       ? rc->cuGraphChildGraphNodeGetGraph(hNode, phGraph)
                       : MP__CU_NOT_INITIALIZED;
  mp__gr_lock();
  mp__gr_unreserve(&q);
  bool got = r == MP__CU_SUCCESS && phGraph != NULL && *phGraph != NULL;
  mp__cugraph parent = got ? mp__node_parent(hNode) : NULL;
  if (parent != NULL) {
    mp__cugraph root = mp__graph_root(parent);
    if (root != *phGraph)
      mp__embed_note(*phGraph, root, hNode, parent);
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* After an update of executable x from graph g (cuda.h,
 * cuGraphExecUpdate: "Updates the node parameters in the instantiated
 * graph ... with the node parameters in" g): x's replays use g's memory
 * from now on, and its launches allocate g's outputs, so x holds g's
 * graph pools. The ones it held before stay held, for their memory only,
 * until x goes (a replay queued before the update may still use them);
 * before, an executable updated from a graph that was then destroyed
 * replayed into a released graph pool. Its flags are the driver's
 * (cuGraphExecGetFlags, CUDA 12.0; without it none). */
static mp__curesult mp__exec_updated(mp__curesult r, const mp__gr_room_t *q,
                                     mp__cugraphexec x, mp__cugraph g,
                                     uint64_t flags) {
  mp__gr_lock();
  mp__gr_unreserve(q);
  for (size_t k = 0; r == MP__CU_SUCCESS && k < mp__gr.nexecs; k++)
    if (mp__gr.execs[k].x == x)
      mp__gr.execs[k].held = !mp__capture_into(mp__gr.execs[k].cap, g);
  if (r == MP__CU_SUCCESS)
    mp__exec_takes(x, g, flags);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* The form before CUDA 12.0 (cudaTypedefs.h: PFN_cuGraphExecUpdate_v10020)
 * and CUDA 12.0's (cuGraphExecUpdate_v2, with a result info). */
mp__curesult cuGraphExecUpdate(mp__cugraphexec hGraphExec, mp__cugraph hGraph,
                               mp__cugraphnode *hErrorNode_out,
                               mp__cugraphupdateresult *updateResult_out) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q = {0};
  /* cuda.h, cuGraphExecUpdate lists CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
   * and CUDA_ERROR_INVALID_VALUE (both forms), none for a resource it
   * lacks: out of memory, as mp__gr_reserve says. */
  uint64_t flags;
  mp__curesult fr = mp__exec_flags(hGraphExec, &flags);
  if (fr != MP__CU_SUCCESS)
    return fr;
  if (!mp__gr_reserved(&q, NULL, hGraph))
    return MP__CU_OUT_OF_MEMORY;
  return mp__exec_updated(rc->cuGraphExecUpdate
                              ? rc->cuGraphExecUpdate(hGraphExec, hGraph,
                                                      hErrorNode_out,
                                                      updateResult_out)
                              : MP__CU_NOT_INITIALIZED,
                          &q, hGraphExec, hGraph, flags);
}

mp__curesult cuGraphExecUpdate_v2(mp__cugraphexec hGraphExec,
                                  mp__cugraph hGraph,
                                  mp__cugraphupdateinfo *resultInfo) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q = {0};
  uint64_t flags;
  mp__curesult fr = mp__exec_flags(hGraphExec, &flags);
  if (fr != MP__CU_SUCCESS)
    return fr; /* as cuGraphExecUpdate */
  if (!mp__gr_reserved(&q, NULL, hGraph))
    return MP__CU_OUT_OF_MEMORY; /* as cuGraphExecUpdate */
  return mp__exec_updated(
      rc->cuGraphExecUpdate_v2
          ? rc->cuGraphExecUpdate_v2(hGraphExec, hGraph, resultInfo)
          : MP__CU_NOT_INITIALIZED,
      &q, hGraphExec, hGraph, flags);
}

/* After x's child graph node was given another graph's parameters
 * (cuda.h, cuGraphExecChildGraphNodeSetParams: "Updates the work
 * represented by hNode in hGraphExec as though the nodes contained in
 * hNode's graph had the parameters contained in childGraph's nodes";
 * cuGraphExecNodeSetParams, for a child graph node "Topology must match
 * and restrictions apply recursively"), returning r: x's launches use
 * child's memory from now on, so x holds child's graph pools, as it holds
 * its own graph's (its launches allocate their outputs); what it held, it
 * keeps ("Already enqueued or running launches of hGraphExec are not
 * affected by this call", and its other nodes may use it). Before, child's
 * destruction released its graph pools under x. */
static mp__curesult mp__exec_child_set(mp__curesult r, const mp__gr_room_t *q,
                                       mp__cugraphexec x, mp__cugraph child,
                                       uint64_t flags) {
  mp__gr_lock();
  mp__gr_unreserve(q);
  if (r == MP__CU_SUCCESS)
    mp__exec_takes(x, child, flags);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

mp__curesult cuGraphExecChildGraphNodeSetParams(mp__cugraphexec hGraphExec,
                                                mp__cugraphnode hNode,
                                                mp__cugraph childGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q = {0};
  /* cuda.h, cuGraphExecChildGraphNodeSetParams lists
   * CUDA_ERROR_INVALID_VALUE and _NOT_SUPPORTED, none for a resource it
   * lacks: out of memory, as mp__gr_reserve says. */
  uint64_t flags;
  mp__curesult fr = mp__exec_flags(hGraphExec, &flags);
  if (fr != MP__CU_SUCCESS)
    return fr; /* as cuGraphExecUpdate */
  if (!mp__gr_reserved(&q, NULL, childGraph))
    return MP__CU_OUT_OF_MEMORY;
  return mp__exec_child_set(rc->cuGraphExecChildGraphNodeSetParams
                                ? rc->cuGraphExecChildGraphNodeSetParams(
                                      hGraphExec, hNode, childGraph)
                                : MP__CU_NOT_INITIALIZED,
                            &q, hGraphExec, childGraph, flags);
}

mp__curesult cuGraphExecNodeSetParams(mp__cugraphexec hGraphExec,
                                      mp__cugraphnode hNode,
                                      mp__cugraphnodeparams *nodeParams) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cugraph child = NULL;
  bool move = false, graph = mp__child_params(nodeParams, &child, &move);
  mp__gr_room_t q = {0};
  /* cuda.h, cuGraphExecNodeSetParams lists CUDA_ERROR_INVALID_VALUE,
   * and _NOT_SUPPORTED, none for a resource it lacks: out
   * of memory, as mp__gr_reserve says. */
  uint64_t flags = 0;
  mp__curesult fr = graph ? mp__exec_flags(hGraphExec, &flags) : MP__CU_SUCCESS;
  if (fr != MP__CU_SUCCESS)
    return fr; /* as cuGraphExecUpdate */
  if (graph && !mp__gr_reserved(&q, NULL, child))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r =
      rc->cuGraphExecNodeSetParams
          ? rc->cuGraphExecNodeSetParams(hGraphExec, hNode, nodeParams)
          : MP__CU_NOT_INITIALIZED;
  return graph ? mp__exec_child_set(r, &q, hGraphExec, child, flags) : r;
}

/* cuda.h, cuGraphNodeSetParams: "Sets the parameters of graph node hNode
 * to nodeParams"; for a child graph node, CUDA_CHILD_GRAPH_NODE_PARAMS.graph
 * is "The child graph to clone into the node": from then on the node's
 * graph, and so the graph it is in and that graph's copies and
 * executables, replay the child's memory. The graph holds what the child
 * holds (mp__child_added), as after cuGraphAddNode; what it held, it keeps
 * (its copies made before may still use it). A node the shim did not see
 * added names no graph (a node of a clone, cuGraphGetNodes'): what the
 * child holds is kept until exit, never released under it. Before, the
 * hook was missing: the child's destruction released its graph pools
 * under the graph given its parameters. */
mp__curesult cuGraphNodeSetParams(mp__cugraphnode hNode,
                                  mp__cugraphnodeparams *nodeParams) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cugraph child = NULL, parent = NULL;
  bool move = false, graph = mp__child_params(nodeParams, &child, &move);
  mp__gr_room_t q = {0};
  bool known = false;
  if (graph) {
    mp__gr_lock();
    known = mp__node_parent(hNode) != NULL;
    pthread_mutex_unlock(&mp__gr.lock);
  }
  /* cuda.h, cuGraphNodeSetParams lists CUDA_ERROR_INVALID_VALUE,
   * and _NOT_SUPPORTED, none for a resource it lacks: out
   * of memory, as mp__gr_reserve says. */
  if (known && !mp__child_reserved(&q, &hNode, child, move))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r = rc->cuGraphNodeSetParams
                       ? rc->cuGraphNodeSetParams(hNode, nodeParams)
                       : MP__CU_NOT_INITIALIZED;
  if (!graph)
    return r;
  mp__gr_lock();
  parent = mp__node_parent(hNode);
  if (parent == NULL) {
    mp__gr_unreserve(&q);
    if (r == MP__CU_SUCCESS)
      mp__graph_kept(child);
  }
  pthread_mutex_unlock(&mp__gr.lock);
  return parent != NULL ? mp__child_added(r, &q, &hNode, parent, child, move)
                        : r;
}

/* cuda.h, cuGraphNodeFindInClone: "returns the node in hClonedGraph
 * corresponding to hOriginalNode in the original graph". The clone's copy
 * of a child graph node the shim knows is a child graph node of the clone
 * (cuGraphClone: child graph nodes "recursively copied into the clone"):
 * noted with the clone as its graph, so that the graph it embeds
 * (cuGraphChildGraphNodeGetGraph) holds what the clone holds. Before, it
 * was not known: a clone of that embedded graph held nothing, and the
 * clone's destruction released the graph pools under it. */
mp__curesult cuGraphNodeFindInClone(mp__cugraphnode *phNode,
                                    mp__cugraphnode hOriginalNode,
                                    mp__cugraph hClonedGraph) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__gr_room_t q;
  /* cuda.h, cuGraphNodeFindInClone lists CUDA_ERROR_INVALID_VALUE, none
   * for a resource it lacks: out of memory, as mp__gr_reserve says. */
  if (!mp__known_reserved(&q, hOriginalNode, false))
    return MP__CU_OUT_OF_MEMORY;
  mp__curesult r =
      rc->cuGraphNodeFindInClone
          ? rc->cuGraphNodeFindInClone(phNode, hOriginalNode, hClonedGraph)
          : MP__CU_NOT_INITIALIZED;
  mp__gr_lock();
  mp__gr_unreserve(&q);
  if (r == MP__CU_SUCCESS && phNode != NULL && *phNode != NULL &&
      mp__node_parent(hOriginalNode) != NULL)
    mp__node_note(*phNode, hClonedGraph);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}

/* Whether graph g is one of those the node destroy named tag takes
 * (mp__node_doom). Under the lock. */
static bool mp__embed_doomed(mp__cugraph g, mp__cugraph tag) {
  for (size_t k = 0; g != NULL && k < mp__gr.nembeds; k++)
    if (mp__gr.embeds[k].e == tag && mp__gr.embeds[k].was == g)
      return true;
  return false;
}

/* Names tag (keeping their handles in `was`) the entries node n's
 * destruction takes with it: the graphs n embeds, the graphs embedded in
 * nodes of those in turn, and the child graph nodes in them, n among
 * them. Renamed before the real destroy, as cuGraphDestroy renames a
 * graph (mp__dying_name): the driver may give their handles to new
 * graphs and nodes as soon as it returns, which must not meet them.
 * Under the lock. */
static void mp__node_doom(mp__cugraphnode n, mp__cugraph tag) {
  for (bool more = true; more;) {
    more = false;
    for (size_t k = 0; k < mp__gr.nembeds; k++) {
      struct mp__pl_embed *m = &mp__gr.embeds[k];
      if (m->was == NULL && (m->node == n || mp__embed_doomed(m->in, tag))) {
        m->was = m->e;
        m->e = tag;
        more = true;
      }
    }
  }
  for (size_t k = 0; k < mp__gr.nnodes; k++) {
    struct mp__pl_node *x = &mp__gr.nodes[k];
    if (x->was == NULL && (x->n == n || mp__embed_doomed(x->parent, tag))) {
      x->was = x->n;
      x->n = (mp__cugraphnode)tag;
    }
  }
}

/* After the real destroy of the node whose entries bear tag (mp__node_doom)
 * answered r: refused, the entries get their handles back and nothing
 * changed; done, they go, and so do the holds of the captures that ended
 * into the graphs they embedded (a graph pool only they held is released
 * once no executable holds it either). Under the lock. */
static void mp__node_doomed(mp__cugraph tag, mp__curesult r) {
  for (size_t k = 0; k < mp__gr.nnodes;) {
    struct mp__pl_node *x = &mp__gr.nodes[k];
    if (x->n != (mp__cugraphnode)tag) {
      k++;
    } else if (r != MP__CU_SUCCESS) {
      x->n = x->was;
      x->was = NULL;
      k++;
    } else {
      *x = mp__gr.nodes[--mp__gr.nnodes];
    }
  }
  for (size_t k = 0; k < mp__gr.nembeds;) {
    struct mp__pl_embed *m = &mp__gr.embeds[k];
    if (m->e != tag) {
      k++;
      continue;
    }
    if (r != MP__CU_SUCCESS) {
      m->e = m->was;
      m->was = NULL;
      k++;
      continue;
    }
    for (unsigned i = 0; i < MP__PL_CAPTURES; i++) {
      mp__pl_capture_t *c = &mp__gr.caps[i];
      if (c->used && !c->capturing && c->g != NULL && c->via == m->id)
        mp__capture_ungraphed(c);
    }
    *m = mp__gr.embeds[--mp__gr.nembeds];
  }
}

/* cuda.h, cuGraphDestroyNode: "Removes hNode from its graph". What the
 * node owns goes with it: a child graph node's embedded graph
 * (cuGraphChildGraphNodeGetGraph: "the node retains ownership of the
 * graph") and a conditional node's bodies
 * (CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out: "Valid for the lifetime of
 * the conditional node"). The graph no longer replays what a capture into
 * one of them made: its hold on that capture's graph pool ends
 * (mp__node_doomed), as a graph's destruction ends its holds; its
 * executables made before keep the node, and their holds. A refused
 * destroy changes nothing. Before, the hook was missing: the graph pool
 * stayed held until the node's parent was destroyed, and the shim kept
 * the bodies' handles as embedded in that parent, so a later graph given
 * one of them had its captures held by the old parent. Copies into the
 * node's graphs (a clone, a child graph node made there), and a capture
 * made into a graph before it was moved into the node (its hold passed to
 * the parent, mp__child_added), still hold until the parent goes (the
 * shim notes them on the parent): held too long, never too briefly. */
mp__curesult cuGraphDestroyNode(mp__cugraphnode hNode) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuGraphDestroyNode == NULL)
    return MP__CU_NOT_INITIALIZED;
  if (hNode == NULL) /* no node: the driver's answer, nothing held */
    return rc->cuGraphDestroyNode(hNode);
  mp__cugraph tag = (mp__cugraph)mp__dying_name();
  mp__gr_lock();
  mp__node_doom(hNode, tag);
  pthread_mutex_unlock(&mp__gr.lock);
  mp__curesult r = rc->cuGraphDestroyNode(hNode);
  mp__gr_lock();
  mp__node_doomed(tag, r);
  pthread_mutex_unlock(&mp__gr.lock);
  return r;
}
