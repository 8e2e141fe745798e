/* free.c - a pool block's way back to its pool, shared by the free hooks
 * of driver.c (cuMemFree*) and runtime.c (cudaFree*): traced first, routed
 * to a capture's graph pool when its stream is being captured, then freed
 * after every stream's work (sync) or on the caller's stream; a block the
 * pool refuses stays the program's. Also what the free and the
 * synchronous allocation hooks of both APIs ask of a capture. */
#include "preload.h"

/* A synchronous call asks about the legacy NULL stream, which reports a
 * capture in progress anywhere that would forbid it. An error answer (for
 * instance CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) also means: let the driver
 * decide. */
static mp__curesult mp__capture_query(mp__custream s, bool ptsz,
                                      unsigned int *status) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__curesult (*fn)(mp__custream, unsigned int *) =
      ptsz && rc->cuStreamIsCapturing_ptsz ? rc->cuStreamIsCapturing_ptsz
                                           : rc->cuStreamIsCapturing;
  *status = 0;
  return fn != NULL ? fn(s, status) : MP__CU_SUCCESS;
}

bool mp__pl_capturing(const mp__pl_t *pl, mp__custream s, bool ptsz) {
  unsigned int status = 0;
  return !pl->host &&
         (mp__capture_query(s, ptsz, &status) != MP__CU_SUCCESS || status != 0);
}

bool mp__pl_sync_in_capture(const mp__pl_t *pl) {
  return !pl->host &&
         (mp__pl_capture_begun() || mp__pl_capturing(pl, NULL, false));
}

/* cuda.h, cuThreadExchangeStreamCaptureMode: "Sets the calling thread's
 * stream capture interaction mode to the value contained in *mode, and
 * overwrites *mode with the previous mode for the thread"; it touches no
 * stream. mp__pl_mode_relax with the driver's answer: CUDA_ERROR_UNKNOWN
 * where it has not the call. */
static mp__curesult mp__mode_relax(unsigned *old) {
  mp__curesult (*swap)(unsigned int *) =
      mp__pl_real_cuda()->cuThreadExchangeStreamCaptureMode;
  unsigned m = MP__CAPTURE_MODE_RELAXED;
  mp__curesult r = swap != NULL ? swap(&m) : MP__CU_UNKNOWN;
  if (r == MP__CU_SUCCESS)
    *old = m;
  return r;
}

bool mp__pl_mode_relax(unsigned *old) {
  return mp__mode_relax(old) == MP__CU_SUCCESS;
}

void mp__pl_mode_restore(unsigned old) {
  mp__curesult (*swap)(unsigned int *) =
      mp__pl_real_cuda()->cuThreadExchangeStreamCaptureMode;
  if (swap != NULL)
    (void)swap(&old);
}

/* This thread's capture mode: swapped out and back. False when the driver
 * cannot say. */
static bool mp__thread_capture_mode(unsigned *mode) {
  if (!mp__pl_mode_relax(mode))
    return false;
  mp__pl_mode_restore(*mode);
  return true;
}

/* A host function: cuda.h, cuLaunchHostFunc and cuStreamAddCallback, "The
 * host function must not make any CUDA API calls. Attempting to use a CUDA
 * API may result in CUDA_ERROR_NOT_PERMITTED"; the driver refuses the
 * free so and changes nothing. The pool never asks the driver, so the
 * question the free asks anyway, whether the stream it is ordered on is
 * being captured (the legacy stream for a synchronous free, which
 * mp__pl_capturing asked already), is asked first, once, and its answer
 * CUDA_ERROR_NOT_PERMITTED, and that alone, refuses the free (any other
 * failure keeps the rules below).
 * Then, for a synchronous free: where the legacy stream reports no
 * capture and the captures begun through the shim cannot prohibit the
 * free in this thread's mode (mp__pl_capture_prohibits), it is allowed
 * and nothing more is asked. Otherwise the API answers for the pool:
 * probe, an allocation of one byte, a call of the same kind (both
 * synchronize implicitly), is refused, with the capture invalidated,
 * exactly when the free would be. */
unsigned mp__pl_free_refused(const mp__pl_t *pl, bool sync, mp__custream s,
                             bool ptsz, unsigned (*probe)(void),
                             bool *captured) {
  if (captured != NULL)
    *captured = false;
  if (pl->host)
    return 0;
  unsigned int status = 0;
  mp__curesult q = sync ? mp__capture_query(NULL, false, &status)
                        : mp__capture_query(s, ptsz, &status);
  if (q == MP__CU_NOT_PERMITTED)
    return q;
  /* A synchronous free whose question the driver answers with an error
   * that is no capture's (a sticky one, CUDA_ERROR_ILLEGAL_ADDRESS: cuda.h,
   * cuStreamIsCapturing, \notefnerr): whether a capture prohibits the free
   * cannot be told, and the driver refuses its own free so; refused with
   * that code, the block still the program's (before, it went back to the
   * pool and the free answered success). */
  if (sync && q != MP__CU_SUCCESS &&
      (q < MP__CU_CAPTURE_FIRST || q > MP__CU_CAPTURE_LAST))
    return q;
  bool legacy = q != MP__CU_SUCCESS || status != 0;
  if (captured != NULL)
    *captured = legacy; /* as mp__pl_capturing answers */
  if (!sync || (!legacy && !mp__pl_capture_begun()))
    return 0;
  unsigned mode;
  if (!legacy && mp__thread_capture_mode(&mode) &&
      !mp__pl_capture_prohibits(mode))
    return 0;
  unsigned r = probe();
  return r >= MP__CU_CAPTURE_FIRST && r <= MP__CU_CAPTURE_LAST ? r : 0;
}

/* Waits for stream s (ptsz: of a per-thread call) of context owner, with
 * owner current (a stream is always its own context's to synchronize) and
 * in relaxed capture mode, a call of the shim's own (mp__pl_mode_relax; s
 * does not capture): cuda.h, cuStreamSynchronize. The driver's answer,
 * CUDA_ERROR_UNKNOWN where it has not the calls, with the call that gave
 * it in *what. Where the switch to relaxed mode is refused while a
 * capture is begun (mp__pl_capture_begun), nothing waits: in the caller's
 * mode the wait is a potentially unsafe call, which a global-mode capture
 * (this thread's, or another thread's with this one in global mode)
 * prohibits, and the driver invalidates that capture (cuda.h,
 * cuThreadExchangeStreamCaptureMode; an H200, driver 580.159.04,
 * 2026-11-28, refused cuStreamSynchronize so and invalidated the
 * capture). The switch's code is the answer. Before, the wait went ahead
 * in the caller's mode and could invalidate the program's capture. */
static mp__curesult mp__stream_wait(mp__custream s, bool ptsz, mp__cuctx owner,
                                    const char **what) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cuctx popped = NULL;
  *what = "cuStreamSynchronize";
  if (rc->cuStreamSynchronize == NULL || rc->cuCtxPushCurrent_v2 == NULL ||
      rc->cuCtxPopCurrent_v2 == NULL)
    return MP__CU_UNKNOWN;
  unsigned mode = MP__CAPTURE_MODE_RELAXED;
  mp__curesult relax = mp__mode_relax(&mode);
  if (relax != MP__CU_SUCCESS && mp__pl_capture_begun()) {
    *what = "cuThreadExchangeStreamCaptureMode";
    return relax;
  }
  mp__curesult r = rc->cuCtxPushCurrent_v2(owner);
  if (r == MP__CU_SUCCESS) {
    r = rc->cuStreamSynchronize(ptsz && s == NULL ? MP__CU_STREAM_PER_THREAD
                                                  : s);
    (void)rc->cuCtxPopCurrent_v2(&popped);
  }
  if (relax == MP__CU_SUCCESS)
    mp__pl_mode_restore(mode);
  return r;
}

/* The driver's name for r (cuGetErrorName), "a CUDA error" where it has
 * none. */
static const char *mp__error_name(mp__curesult r) {
  const char *name = NULL;
  mp__curesult (*named)(mp__curesult, const char **) =
      mp__pl_real_cuda()->cuGetErrorName;
  if (named == NULL || named(r, &name) != 0 || name == NULL)
    return "a CUDA error";
  return name;
}

mp_status_t mp__pl_capture_unknown(const char *what, mp__curesult r) {
  return mp__fail_driver((int)r, MP_EDRIVER,
                         "%s: cuStreamGetCaptureInfo: %s (%u): whether the "
                         "stream is being captured is not known; the block "
                         "stays the program's",
                         what, mp__error_name(r), r);
}

unsigned mp__pl_free_invalid(const mp__pl_t *pl) {
  return !pl->host && mp__pl_calls_refused() ? MP__CU_NOT_PERMITTED
                                             : MP__CU_INVALID_VALUE;
}

unsigned mp__pl_free_foreign(const mp__pl_t *pl, bool sync,
                             unsigned (*probe)(void)) {
  unsigned r =
      sync ? mp__pl_free_refused(pl, true, NULL, false, probe, NULL) : 0;
  return r != 0 ? r : mp__pl_free_invalid(pl);
}

void mp__pl_free_over(const mp__pl_block_t *b, bool freed) {
  mp__pl_table_end(b, freed);
  if (!freed)
    mp__pl_record_unfree(b->ptr, b->size, b->stream);
}

mp_status_t mp__pl_pool_served(mp_pool_t *pool, void **p, size_t size,
                               uintptr_t stream) {
  if (mp__pl_table_put_pool((uintptr_t)*p, size, stream, pool))
    return MP_OK;
  /* Stream-ordered on the block's own stream (mp_pool_free), where nothing
   * has used it: reusable at once, as it was before the call. */
  (void)mp_pool_free(pool, *p);
  *p = NULL;
  return MP_ENOMEM;
}

#define MP__CAPTURE_INVALIDATED 2u /* CU_STREAM_CAPTURE_STATUS_INVALIDATED */
#define MP__CU_CAPTURE_INVALIDATED                                             \
  901u /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */

/* A pool block freed on stream s (ptsz: a _ptsz call), which is being
 * captured, that the capture's graph pool could not take
 * (mp__pl_capture_route: every capture slot in use, no graph pool made, the
 * capture's list of streams full, or the capture invalidated). cuda.h,
 * cuMemFreeAsync: "During stream capture, this function results in the
 * creation of a free node and must therefore be passed the address of a
 * graph allocation", which a pool block is not: the driver cannot free it
 * (it is the pool's memory), and the pool cannot order its reuse on s,
 * whose work runs only when the graph is launched (another stream would
 * get the block while a launch still uses it), nor record on s. Refused,
 * the block still the program's: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
 * where the capture was invalidated (the driver's answer to any work on
 * such a stream), else out of memory, "unable to allocate enough memory
 * or other resources" (cuda.h, CUresult), the shim lacking room. Before,
 * the block went to the pool on s. */
static mp_status_t mp__capture_unrouted(mp__custream s, bool ptsz) {
  unsigned int status = 0;
  if (mp__capture_query(s, ptsz, &status) == MP__CU_SUCCESS &&
      status == MP__CAPTURE_INVALIDATED)
    return mp__fail_driver((int)MP__CU_CAPTURE_INVALIDATED, MP_EDRIVER,
                           "stream-ordered free: the stream's capture was "
                           "invalidated; the block stays the program's");
  return mp__fail(MP_ENOMEM,
                  "stream-ordered free on a capturing stream: the capture's "
                  "graph pool could not take the block (no capture slot, "
                  "graph pool or stream room); the block stays the "
                  "program's");
}

/* A pool block freed on a capturing stream of another device, or of a
 * context the program made (mp__pl_stream_of_pool). The block's pool can
 * neither route it to a graph pool of that capture, which would list the
 * stream and record its own events on it (cuda.h, cuEventRecord: "hEvent
 * and hStream must be from the same context otherwise
 * CUDA_ERROR_INVALID_HANDLE is returned"), nor wait for the stream as for
 * one that does not capture (cuda.h, cuStreamSynchronize: not allowed
 * during stream capture, the capture invalidated). Nor is the block a
 * graph allocation (cuda.h, cuMemFreeAsync: "During stream capture, this
 * function results in the creation of a free node and must therefore be
 * passed the address of a graph allocation"). Refused with
 * CUDA_ERROR_NOT_SUPPORTED, the block still the program's. Before, the
 * block's pool made a graph pool for that capture and was asked to begin
 * it on the other context's stream; on the fake driver the begin failed
 * and the free was refused as out of memory, "no room", a wrong reason. */
static mp_status_t mp__capture_elsewhere(void) {
  return mp__fail_driver((int)MP__CU_NOT_SUPPORTED, MP_EDRIVER,
                         "stream-ordered free on a capturing stream of "
                         "another device or context: the block's pool cannot "
                         "order its reuse there; the block stays the "
                         "program's");
}

mp_status_t mp__pl_pool_free(const mp__pl_t *pl, const mp__pl_block_t *b,
                             bool sync, mp__custream s, bool ptsz,
                             bool captured) {
  void *ptr = (void *)b->ptr;
  /* The trace says "free" before the block can be handed out again: once
   * the pool has it, another thread's allocation of the same address may
   * be logged first, and a replay would free the wrong block. */
  mp__pl_record_free(b->ptr, b->size, mp__pl_record_stream(s, ptsz));
  mp__curesult why = MP__CU_SUCCESS;
  if (mp__pl_output_free(pl, b->ptr, true, !sync, s, ptsz, &why)) {
    mp__pl_table_end(b, true);
    return MP_OK;
  }
  mp_status_t st;
  /* A free on a capturing stream: the stream allocates to the capture's
   * graph pool from now on, and neither pool records on it. Whether s is
   * captured, mp__pl_free_refused asked already: not asked again. Where
   * the driver cannot say whether s captures (a sticky error), the block
   * is neither routed nor freed on s, which would let the pool hand it
   * out while a capture may still use it: refused with the driver's
   * code, still the program's. */
  mp__cuctx owner = NULL;
  bool elsewhere = why == MP__CU_SUCCESS && !sync && !pl->host && captured &&
                   !mp__pl_stream_of_pool(pl, b->pool, s, &owner);
  bool routed = why == MP__CU_SUCCESS && !sync && !pl->host && captured &&
                !elsewhere && mp__pl_capture_route(pl, b->pool, s, ptsz, &why);
  if (why != MP__CU_SUCCESS)
    st = mp__pl_capture_unknown("stream-ordered free", why);
  else if (elsewhere)
    st = mp__capture_elsewhere();
  else if (!sync && !pl->host && captured && !routed)
    st = mp__capture_unrouted(s, ptsz);
  else if (sync) /* cuMemFree / cudaFree: after the work of every stream */
    st = pl->host ? mp_pool_free(b->pool, ptr)
                  : mp_pool_free_after_all(b->pool, ptr);
  else if (!routed && !pl->host && !captured &&
           !mp__pl_stream_of_pool(pl, b->pool, s, &owner)) {
    /* Another device's stream (or one of a context the program made),
     * which the pool cannot order on (its events are of its own context):
     * the free waits for that stream here, and the block is then free on
     * its own stream, whose work the pool still orders. Refused, the
     * driver's code is the answer (mp__pl_cu_error). */
    const char *what;
    mp__curesult r = mp__stream_wait(s, ptsz, owner, &what);
    st = r == MP__CU_SUCCESS
             ? mp_pool_free(b->pool, ptr)
             : mp__fail_driver((int)r, MP_EDRIVER,
                               "stream-ordered free: waiting for another "
                               "context's stream: %s: %s (%u); the block "
                               "stays the program's",
                               what, mp__error_name(r), r);
  } else
    /* On the caller's stream, always through the pool's stream table,
     * never by the handle the block was allocated on: the same handle may
     * name another stream (a per-thread one names another in each thread,
     * NULL in a _ptsz call too; a destroyed stream's handle may be given
     * to a new stream, cuda.h, cuStreamDestroy releasing its resources),
     * which the pool told apart when the old one was forgotten. On the
     * block's own stream it is mp_pool_free. */
    st = mp_pool_free_async(b->pool, ptr, mp__pl_stream(pl, s, ptsz));
  /* Refused: still the program's (a paused pool), traced so. */
  mp__pl_free_over(b, st == MP_OK);
  return st;
}
