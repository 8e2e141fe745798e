/* streams.c - the stream hooks: cuStreamCreate, cuStreamCreateWithPriority
 * and cuStreamDestroy_v2 (the runtime's cudaStreamCreate* and
 * cudaStreamDestroy reach them through cuGetProcAddress).
 *
 * They keep the pool's view of the program's streams true:
 *  - a stream the program creates on the pool's device is added to the pool
 *    (mp_pool_add_stream), so that cuMemFree/cudaFree of a pool pointer,
 *    served by mp_pool_free_after_all, waits for the work queued on it as
 *    CUDA's free would ("cuMemFree ... synchronizes", cuda.h) without a
 *    device synchronize;
 *  - a stream the program destroys is forgotten around the destroy
 *    (mp__stream_destroy_begin/_end): while its handle is still valid the
 *    pool closes its epoch with one marker event and sets its slot aside;
 *    once the driver destroyed it, the pool never touches the handle again
 *    (nor a slot a call naming it meanwhile made), and meets a new stream
 *    that the driver gives the same handle as a new stream; a destroy the
 *    driver refuses gives the stream its slot back, as it was.
 * What the shim cannot see: streams created before it started (none under
 * LD_PRELOAD) and per-thread default streams of threads that never
 * allocated through the shim. A kernel on such a per-thread stream is
 * still waited for by a free: the stream is a blocking one, which the
 * legacy stream's work (the pool's marker there) waits for. */
#include "../pool/pool_internal.h"
#include "hooks.h"

static void mp__born_on(mp_device_t *dev, void *s) {
  mp__stream_born(dev, (mp_stream_t)s);
}

static void mp__stream_made(mp__curesult r, mp__custream *ps) {
  /* A refused create enters nothing, so leaves nothing: a leave without
   * its enter left the thread's depth at -1, and every later hook on the
   * thread went to the driver (a pool block's cuMemFree included). */
  if (r != MP__CU_SUCCESS || ps == NULL)
    return;
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return;
  }
  const mp__pl_t *pl = mp__pl_get();
  /* First, before anyone has the handle: a destroy whose slots are still
   * set aside went through if the driver gave its handle out again. */
  if (pl->mode == MP__PL_POOL && !pl->host)
    mp__pl_each_device(mp__born_on, *ps);
  mp_pool_t *pool = pl->host ? NULL : mp__pl_pool_here(pl);
  if (pool != NULL)
    (void)mp__pl_devices_add_stream(pool, *ps);
  mp__pl_leave();
}

mp__curesult cuStreamCreate(mp__custream *phStream, unsigned int Flags) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__curesult r = rc->cuStreamCreate ? rc->cuStreamCreate(phStream, Flags)
                                      : MP__CU_NOT_INITIALIZED;
  mp__stream_made(r, phStream);
  return r;
}

mp__curesult cuStreamCreateWithPriority(mp__custream *phStream,
                                        unsigned int flags, int priority) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__curesult r =
      rc->cuStreamCreateWithPriority
          ? rc->cuStreamCreateWithPriority(phStream, flags, priority)
          : MP__CU_NOT_INITIALIZED;
  mp__stream_made(r, phStream);
  return r;
}

static void mp__destroy_begin_on(mp_device_t *dev, void *s) {
  mp__stream_destroy_begin(dev, (mp_stream_t)s);
}

static void mp__destroy_end_on(mp_device_t *dev, void *s) {
  mp__stream_destroy_end(dev, (mp_stream_t)s, true);
}

static void mp__set_aside_on(mp_device_t *dev, void *s) {
  mp__stream_set_aside(dev, (mp_stream_t)s);
}

static void mp__destroyed_on(mp_device_t *dev, void *s) {
  mp__stream_set_aside_end(dev, (mp_stream_t)s, true, false);
}

/* Destroyed, with the capture it began: over, without a graph. */
static void mp__destroyed_origin_on(mp_device_t *dev, void *s) {
  mp__stream_set_aside_end(dev, (mp_stream_t)s, true, true);
}

static void mp__kept_on(mp_device_t *dev, void *s) {
  mp__stream_set_aside_end(dev, (mp_stream_t)s, false, false);
}

mp__curesult cuStreamDestroy_v2(mp__custream hStream) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  bool forgot = false, aside = false, origin = false, known = false;
  unsigned long long id = 0;
  if (mp__pl_enter()) {
    const mp__pl_t *pl = mp__pl_get();
    /* The default streams are never destroyed (nor forgotten). */
    forgot = pl->mode == MP__PL_POOL && !pl->host && hStream != NULL &&
             hStream != MP__CU_STREAM_LEGACY &&
             hStream != MP__CU_STREAM_PER_THREAD;
    /* A stream being captured (or whose state the driver cannot tell):
     * no marker can close its epoch, so a forget would leave that epoch
     * open in a slot gone for good, and drop its capture's route; were the
     * destroy refused, the stream would live on unknown to its pool, and
     * what its capture freed in the graph pool would wait for a device
     * synchronize. Its slots are set aside instead, whole, until the
     * driver has answered (cuda.h lists no capture error for
     * cuStreamDestroy; any refusal, a stream of another context one,
     * must change nothing). */
    aside = forgot && mp__pl_capturing(pl, hStream, false);
    /* The capture it began, if any, which its destroy ends (below). */
    origin = hStream != NULL && hStream != MP__CU_STREAM_LEGACY &&
             hStream != MP__CU_STREAM_PER_THREAD &&
             mp__pl_capture_origin(hStream, &id, &known);
    if (forgot) {
      mp__pl_each_device(aside ? mp__set_aside_on : mp__destroy_begin_on,
                         hStream);
      mp__pl_devices_unhold(hStream); /* made during a pause */
    }
  }
  mp__pl_leave();
  mp__curesult r = rc->cuStreamDestroy_v2 ? rc->cuStreamDestroy_v2(hStream)
                                          : MP__CU_NOT_INITIALIZED;
  /* Destroyed, the set-aside slots are forgotten with the handle dead
   * (never asked: a new stream may have it already). So is a slot the
   * handle matched during the destroy (src/pool/stream.c,
   * mp__stream_forget_met), capture marks and route with it, unless a new
   * stream was given the handle meanwhile (mp__stream_made told the pools:
   * the slot is that stream's, and stays); any other new stream with the
   * handle gets a slot at its next call. Refused, they are the stream's again,
   * epochs and routes as they were. Destroyed, a capture the stream began is
   * over: nothing can end it now (mp__pl_capture_destroyed); left begun, it
   * prohibited this thread's cuMemAlloc and cuMemFree in global mode for good,
   * and its graph pool lived until exit. */
  if (forgot || (origin && r == MP__CU_SUCCESS)) {
    (void)mp__pl_enter();
    if (aside)
      mp__pl_each_device(r != MP__CU_SUCCESS ? mp__kept_on
                         : origin            ? mp__destroyed_origin_on
                                             : mp__destroyed_on,
                         hStream);
    else if (forgot) /* the plain destroy's end (mp__stream_destroy_end) */
      mp__pl_each_device(r != MP__CU_SUCCESS ? mp__kept_on : mp__destroy_end_on,
                         hStream);
    if (r == MP__CU_SUCCESS)
      mp__pl_capture_destroyed(mp__pl_get(), hStream, origin,
                               known ? &id : NULL);
    mp__pl_leave();
    if (aside)
      return r;
  }
  /* A destroy the driver refused (a stream of another context, a call it
   * does not permit) changes nothing: the stream lives on, its slots given
   * back above (mp__kept_on), and a free waits for its work as before. Added
   * again here too: a pool that could not give its slot back (no room), and
   * a paused pool, whose hold on the stream went before the destroy
   * (mp__pl_devices_unhold). */
  if (r != MP__CU_SUCCESS && forgot) {
    if (mp__pl_enter()) {
      const mp__pl_t *pl = mp__pl_get();
      mp_pool_t *pool = mp__pl_pool_for_stream(pl, hStream, mp__pl_pool_here);
      if (pool != NULL)
        (void)mp__pl_devices_add_stream(pool, hStream);
    }
    mp__pl_leave();
  }
  return r;
}
