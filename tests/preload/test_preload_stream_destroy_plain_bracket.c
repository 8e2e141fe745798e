/* test_preload_stream_destroy_plain_bracket.c - the shim's cuStreamDestroy
 * of a stream no capture holds forgets it in the pools around the driver's
 * destroy (src/preload/streams.c, mp__stream_destroy_begin/_end), not
 * before it:
 *  - a pool call that names the stream before the driver answers (another
 *    thread's) makes a slot of its own, which a destroy that succeeded
 *    forgets with the handle: forgotten before the destroy, that slot
 *    stayed matched to the dead handle, and a stream the driver gave the
 *    same handle inherited it;
 *  - a destroy the driver refuses leaves the stream its own slot, as it
 *    was (it was forgotten, then added again as a new slot).
 * The shim's table of the driver's calls is wrapped (mp__pl_real_cuda) so
 * that its cuStreamDestroy_v2 makes that call first, and refuses where
 * told. The shim's sources run in the test's process, on the fake driver
 * (tests/fakecuda). */
#include "in_process.h"
#include "pool/pool_internal.h"

#define MP_NON_BLOCKING    1u   /* CU_STREAM_NON_BLOCKING */
#define MP_INVALID_CONTEXT 201u /* CUDA_ERROR_INVALID_CONTEXT */

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static bool hooking, refuse;
static mp__real_cuda_t table;
static mp__curesult (*real_destroy)(mp__custream);

static mp_pool_t *pool_of_device_0(void) {
  mp_pool_t *pool = mp__pl_pool_first(mp__pl_get());
  cr_assert_not_null(pool, "device 0 has no pool");
  return pool;
}

/* Another thread's call naming s during its destroy, then the driver. */
static mp__curesult destroy_with_a_call_between(mp__custream s) {
  mp_pool_t *pool = pool_of_device_0();
  void *v = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, (mp_stream_t)s, &v), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, v), MP_OK, "%s", mp_last_error());
  return refuse ? MP_INVALID_CONTEXT : real_destroy(s);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  const mp__real_cuda_t *r = __real_mp__pl_real_cuda();
  if (!hooking)
    return r;
  table = *r;
  real_destroy = r->cuStreamDestroy_v2;
  table.cuStreamDestroy_v2 = destroy_with_a_call_between;
  return &table;
}

/* The slot a call naming s uses, or UINT32_MAX where none is live. */
static uint32_t slot_of(mp__custream s) {
  mp_pool_t *pool = pool_of_device_0();
  mp__pool_lock(pool);
  uint32_t i = UINT32_MAX;
  if (!mp__stream_known(pool, (mp_stream_t)s) ||
      mp__stream_lookup(pool, (mp_stream_t)s, &i) != MP_OK ||
      pool->streams[i].gone)
    i = UINT32_MAX;
  mp__pool_unlock(pool);
  return i;
}

Test(preload_stream_destroy_plain_bracket, a_slot_made_meanwhile_is_forgotten,
     .init = mp_in_process_cuda) {
  mp__custream s = NULL;
  cr_assert_eq(cuStreamCreate(&s, MP_NON_BLOCKING), 0);
  cr_assert_neq(slot_of(s), UINT32_MAX, "the new stream is unknown");
  hooking = true;
  cr_assert_eq(cuStreamDestroy_v2(s), 0);
  hooking = false;
  cr_expect_eq(slot_of(s), UINT32_MAX,
               "a slot made during the destroy stays matched to the "
               "destroyed stream's handle");
}

Test(preload_stream_destroy_plain_bracket, refused_keeps_the_streams_slot,
     .init = mp_in_process_cuda) {
  mp__custream s = NULL;
  cr_assert_eq(cuStreamCreate(&s, MP_NON_BLOCKING), 0);
  uint32_t before = slot_of(s);
  cr_assert_neq(before, UINT32_MAX, "the new stream is unknown");
  hooking = refuse = true;
  cr_assert_eq(cuStreamDestroy_v2(s), MP_INVALID_CONTEXT);
  hooking = refuse = false;
  cr_expect_eq(slot_of(s), before,
               "after a refused destroy the stream's slot is %u, not %u",
               slot_of(s), before);
  cr_assert_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(slot_of(s), UINT32_MAX);
}
