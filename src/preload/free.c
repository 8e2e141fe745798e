/* free.c - a pool block's way back to its pool, shared by the free hooks
 * of driver.c (cuMemFree*) and runtime.c (cudaFree*): traced first, routed
 * to a capture's graph pool when its stream is being captured, then freed
 * after every stream's work (sync) or on the caller's stream; a block the
 * pool refuses stays the program's. */
#include "preload.h"

mp_status_t mp__pl_pool_free(const mp__pl_t *pl, const mp__pl_block_t *b,
                             bool sync, mp__custream s, bool ptsz) {
  void *ptr = (void *)b->ptr;
  /* The trace says "free" before the block can be handed out again: once
   * the pool has it, another thread's allocation of the same address may
   * be logged first, and a replay would free the wrong block. */
  mp__pl_record_free(b->ptr, b->size, (uintptr_t)s);
  mp_status_t st;
  /* A free on a capturing stream: the stream allocates to the capture's
   * graph pool from now on, and neither pool records on it. */
  if (!sync && !pl->host)
    (void)mp__pl_capture_route(pl, b->pool, s, ptsz);
  if (sync) /* cuMemFree / cudaFree: after the work of every stream */
    st = pl->host ? mp_pool_free(b->pool, ptr)
                  : mp_pool_free_after_all(b->pool, ptr);
  else
    /* On the caller's stream, always through the pool's stream table,
     * never by the handle the block was allocated on: the same handle may
     * name another stream (a per-thread one names another in each thread,
     * NULL in a _ptsz call too; a destroyed stream's handle may be given
     * to a new stream, cuda.h, cuStreamDestroy releasing its resources),
     * which the pool told apart when the old one was forgotten. On the
     * block's own stream it is mp_pool_free. */
    st = mp_pool_free_async(b->pool, ptr, mp__pl_stream(pl, s, ptsz));
  if (st != MP_OK) { /* still the program's (a paused pool): say so */
    mp__pl_table_put_pool(b->ptr, b->size, b->stream, b->pool);
    mp__pl_record_alloc(b->ptr, b->size, b->stream, true);
  }
  return st;
}
