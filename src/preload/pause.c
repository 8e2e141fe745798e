/* pause.c - pause and resume for the whole process, exported by the shim
 * so that a program that cannot see mempool (a Python process running an
 * unmodified inference library, as torch_memory_saver users do) can give
 * the GPU memory its allocations hold back to the device and take it again
 * at the same addresses:
 *
 *   lib = ctypes.CDLL(None)            # the preloaded shim is global
 *   lib.mempool_preload_pause(1)       # 1: keep the content
 * (MP_PAUSE_KEEP_CONTENT)
 *   ...                                # another process uses the memory
 *   lib.mempool_preload_resume()
 *
 * Every device's pool not paused yet is paused (mp_pool_pause), and resume
 * resumes every paused one, all or none: a pool that fails undoes the ones
 * done before it. A device whose pool was made while the others were
 * paused (its first allocation came then) is left as it is by the resume,
 * which resumes the rest. Both return an mp_status_t (0: done; MP_ENOTSUP
 * for a pool without virtual memory, MP_EBUSY when every pool is in that
 * state already, MP_EINVAL outside pool mode). While paused, allocations
 * and frees the program makes fail (cudaErrorUnknown / CUDA_ERROR_UNKNOWN)
 * and change nothing; the shim's own page-locked host pool is not paused. */
#include "hooks.h"

static pthread_mutex_t mp__pause_lock = PTHREAD_MUTEX_INITIALIZER;

static int mp__pause_all(bool pause, unsigned flags) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return MP_EBUSY;
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__pl_pools_t ps = {.n = 0};
  if (pl->mode == MP__PL_POOL)
    mp__pl_pools(pl, &ps);
  mp_status_t st = ps.n > 0 ? MP_OK : MP_EINVAL;
  pthread_mutex_lock(&mp__pause_lock);
  /* Only the pools not in the state asked for yet: a pool made while the
   * others were paused is not paused, and refusing the resume for it (and
   * pausing the others again) left the process paused for good. */
  int todo = 0;
  for (int i = 0; i < ps.n; i++)
    if (mp__pool_is_paused(ps.pool[i]) != pause)
      ps.pool[todo++] = ps.pool[i];
  if (st == MP_OK && todo == 0)
    st = mp__fail(MP_EBUSY, "every pool is %s already",
                  pause ? "paused" : "running (not paused)");
  int done = 0;
  for (; st == MP_OK && done < todo; done++) {
    st = pause ? mp_pool_pause(ps.pool[done], flags)
               : mp_pool_resume(ps.pool[done]);
    if (st != MP_OK)
      break;
  }
  /* All or none: undo the pools done before the one that failed. */
  for (int i = 0; st != MP_OK && i < done; i++)
    (void)(pause ? mp_pool_resume(ps.pool[i])
                 : mp_pool_pause(ps.pool[i], MP_PAUSE_KEEP_CONTENT));
  pthread_mutex_unlock(&mp__pause_lock);
  if (st != MP_OK)
    fprintf(stderr, "mempool preload: %s: %s\n",
            pause ? "mempool_preload_pause" : "mempool_preload_resume",
            ps.n > 0 ? mp_last_error() : "not serving from a pool");
  mp__pl_leave();
  return (int)st;
}

int mempool_preload_pause(unsigned flags) {
  return mp__pause_all(true, flags);
}

int mempool_preload_resume(void) {
  return mp__pause_all(false, 0);
}
