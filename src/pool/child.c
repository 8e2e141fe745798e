/* child.c - child pools: a fixed range of a parent pool, carved by the
 * parent's allocator and managed by a pool of its own.
 *
 * The range is one live parent block marked MP__B_CHILD; the child holds it
 * as its one segment (MP__SEG_RANGE) and never grows (grow.c refuses:
 * MP_ELIMIT, "child pool full"). Destroy gives the block back to the
 * parent (mp__child_release). Locks: never both at once: the child is made
 * before the parent's lock is taken, and released after its own lock is
 * dropped.
 *
 * With history=N the child's trace starts with a segment_alloc of its
 * range (PyTorch's event for a segment appearing), under the parent's
 * alloc of it; at destroy the parent's trace frees it.
 *
 * Out of memory, the parent's handler is asked and the range tried once
 * more, as for mp_pool_alloc. On a pool with arenas the range is a block
 * of the calling thread's arena (or one an idle arena lends), taken through
 * the arenas' out-of-memory path (the handler its last step), and that
 * arena is the child's parent: it holds the block, counts
 * the child, and refuses to pause or be destroyed while the child lives. */
#include <stdlib.h>

#include "pool_internal.h"

/* Under pool's lock: MP_EBUSY while a destroy of pool is under way.
 * pool->export_sealed (pool.c) is set, under the lock, once the destroy
 * asked the children for the last time and goes on to free the memory
 * with the lock dropped, and cleared where it is refused; its meaning
 * ("the memory is being freed: nothing may hold a part of it from here
 * on") covers a child's range as it does a lease, so it seals children
 * out too. A range taken there would be freed under the child. */
static mp_status_t mp__child_sealed(const mp_pool_t *pool) {
  return pool->export_sealed
             ? mp__fail(MP_EBUSY, "mp_pool_create_child: the parent is being "
                                  "destroyed (its memory is being freed): "
                                  "no child made")
             : MP_OK;
}

/* The range at *base, just made live in owner, becomes child's (ctx),
 * under owner's lock: on a pool with arenas, the claim of the arenas'
 * path (mp__arena_claim_t), so that a raw free of its address (a stale
 * pointer) never meets the range unmarked. */
static mp_status_t mp__child_claim(mp_pool_t *owner, void *const *base,
                                   void *ctx) {
  mp_pool_t *child = ctx;
  mp__slot_t *slot = NULL;
  mp__block_t *b = mp__map_lookup(owner, (uintptr_t)*base, &slot);
  MP__ASSERT(b != NULL && !owner->paused);
  /* An arena being destroyed (sealed, mp__child_sealed): its range goes
   * back, as a refused graph pool's loan does (graph.c). */
  mp_status_t st = mp__child_sealed(owner);
  if (st != MP_OK) {
    mp__map_remove_slot(owner, slot);
    mp__block_release(owner, b);
    return st;
  }
  b->flags |= MP__B_CHILD;
  b->child = child;
  owner->children++;
  child->parent_block = b;
  child->segs->base = b->addr;
  child->segs->size = child->segs->span = b->size;
  return MP_OK;
}

mp_status_t mp_pool_create_child(mp_pool_t *parent, size_t bytes,
                                 mp_pool_t **out) {
  /* The parent's alloc event of the range and the child's segment_alloc
   * start their stacks at this call's caller (the child's config is the
   * parent's: both record stacks or neither). */
  if (parent != NULL)
    MP__HIST_ENTRY(parent);
  return mp__pool_create_child_marked(parent, bytes, out);
}

mp_status_t mp__pool_create_child_marked(mp_pool_t *parent, size_t bytes,
                                         mp_pool_t **out) {
  if (parent == NULL || out == NULL || bytes == 0)
    return mp__fail(MP_EINVAL, "mp_pool_create_child: %s",
                    parent == NULL ? "parent is NULL"
                    : out == NULL  ? "out is NULL"
                                   : "0 bytes");
  /* A graph pool goes with its last block (graph.c); a child's range
   * would keep it, and its parent, forever. */
  if (parent->graph)
    return mp__fail(MP_EINVAL,
                    "mp_pool_create_child: the parent is a graph pool");
  /* Under the lock: mp_pool_set_max_fraction changes it. */
  mp__pool_lock(parent);
  mp_pool_config_t cfg = parent->cfg;
  mp__pool_unlock(parent);
  cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  cfg.max_bytes = 0;
  /* max_split keeps big free blocks whole for requests that need them, and
   * lets reclaim and trim give them back; a child's range is fixed and goes
   * back only whole, so under the limit its one free block could never be
   * carved for a small request. */
  cfg.max_split = 0;
  cfg.arenas = 0;
  mp_pool_t *child;
  mp_status_t st = mp__pool_new(parent->dev, &cfg, &child);
  if (st != MP_OK)
    return st;
  mp__segment_t *seg = mp__host_calloc(1, sizeof *seg);
  mp__block_t *rec = mp__rec_new(child);
  if (seg == NULL || rec == NULL) {
    free(seg);
    mp__pool_free_host(child);
    return mp__fail(MP_ENOMEM, "out of host memory creating a child pool");
  }
  /* The range is the parent's block on the NULL stream: its allocation
   * there ordered the work of other streams still on it before that
   * stream's current point, and a block freed there may still be in use by
   * the NULL stream's own work. The child knows that stream from the start
   * and its one free block starts as freed on it now (below), so no other
   * stream of the child gets the memory before that work is done (at once
   * where the stream is idle, asked without a marker). */
  uint32_t sidx = 0;
  mp__pool_lock(child);
  st = mp__stream_index(child, NULL, &sidx);
  mp__pool_unlock(child);
  if (st != MP_OK) {
    free(seg);
    mp__pool_free_host(child);
    return st;
  }
  void *base = NULL;
  mp_pool_t *owner = parent; /* the block's pool: parent, or an arena */
  child->segs = seg; /* for the claim; the segment's other fields below */
  mp__pool_lock(parent);
  /* Paused: said by this call's name, not the allocation's. */
  st = mp__pool_paused(parent, "mp_pool_create_child");
  if (st == MP_OK)
    st = mp__child_sealed(parent);
  if (st == MP_OK && parent->arenas == NULL) {
    /* Out of memory, the handler first, as mp_pool_alloc's (the arenas'
     * path below asks it too). */
    st = mp__pool_alloc_locked(parent, bytes, NULL, &base);
    /* A pause the handler made is said by this call's name too, and so
     * is a destroy begun while it ran (the lock was dropped). */
    if (mp__pool_oom_retry(parent, st, bytes) &&
        (st = mp__pool_paused(parent, "mp_pool_create_child")) == MP_OK &&
        (st = mp__child_sealed(parent)) == MP_OK)
      st = mp__pool_alloc_locked(parent, bytes, NULL, &base);
    if (st == MP_OK) /* not sealed: asked under the lock held since */
      (void)mp__child_claim(parent, &base, child);
  }
  /* Counted under the pool's lock, so that a pause (which refuses while
   * the count is not 0) cannot reach the arena between the allocation and
   * the child's count there: a paused arena must not change. */
  bool making = st == MP_OK && parent->arenas != NULL;
  parent->children_making += making;
  mp__pool_unlock(parent);
  if (making) {
    st = mp__arena_alloc_any(parent, bytes, NULL, &base, &owner,
                             mp__child_claim, child);
    mp__pool_lock(parent);
    parent->children_making--;
    mp__pool_unlock(parent);
  }
  if (st != MP_OK) {
    child->segs = NULL;
    free(seg);
    mp__pool_free_host(child);
    return st;
  }
  child->parent = owner;
  child->cap = seg->size;
  child->cap_is_max = true;
  child->cfg.max_bytes = seg->size;
  seg->kind = MP__SEG_RANGE;
  child->st.reserved_bytes = child->st.peak_reserved_bytes = seg->size;
  child->st.segment_count = 1;
  rec->addr = seg->base;
  rec->size = seg->size;
  mp__block_link(seg, NULL, rec);
  mp__pool_lock(child);
  rec->sidx = sidx;
  child->streams[sidx].refs++;
  mp__deps_on_free(child, rec);
  mp__index_insert(child, rec);
  /* The range is the child's segment from here on: its trace starts with
   * it, as a pool's starts with its first growth and a graph pool's with
   * each range it borrows (segment.c), so that a reader of the snapshot
   * (memory_viz's segment timeline, a reserved-bytes curve summed from
   * segment events) sees the child's reserved memory appear. Its release
   * at destroy is no event of the child's: its history goes with it; the
   * parent's trace frees the range then (mp__child_release). */
  MP__HIST(child, MP__H_SEGMENT_ALLOC, seg->base, seg->size, 0);
  /* The NULL stream's part settled now (asked, or marked where busy),
   * while it can be: once a blocking stream captures, in any thread, it
   * can be neither asked nor recorded on (cuStreamIsCapturing answers
   * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT for the legacy stream), and the
   * range, free whole, would serve no other stream until that capture
   * ended (MP_ELIMIT, "child pool full"). */
  mp__streams_poll(child, true);
  mp__pool_unlock(child);
  child->st.free_blocks = 1;
  *out = child;
  return MP_OK;
}

void mp__child_release(mp_pool_t *pool) {
  mp_pool_t *parent = pool->parent;
  mp__pool_lock(parent);
  mp__block_t *b = pool->parent_block;
  MP__ASSERT((b->flags & MP__B_CHILD) && b->child == pool);
  mp__map_remove(parent, b);
  /* A free of the parent's like mp_pool_free's: release_threshold looks
   * first. */
  mp__segment_release_above(parent);
  mp__block_release(parent, b);
  MP__ASSERT(parent->children > 0);
  parent->children--;
  mp__pool_unlock(parent);
  for (mp__segment_t *s = pool->segs; s != NULL;) {
    mp__segment_t *n = s->next;
    free(s);
    s = n;
  }
}
