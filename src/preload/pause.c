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
 * and change nothing; the shim's own page-locked host pool is not paused.
 * A reset of a device (cuDevicePrimaryCtxReset, cudaDeviceReset) on
 * another thread waits for a pause or resume under way before it destroys
 * the device's pool (mp__pl_with_pools). */
#include "hooks.h"

static pthread_mutex_t mp__pause_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct mp__pause_job {
  bool pause;
  unsigned flags;
  int n;          /* the pools found */
  mp_status_t st; /* the answer */
} mp__pause_job_t;

/* The pause or resume of the pools in ps, under mp__pl_with_pools: a reset
 * of a device on another thread waits for it before it destroys that
 * device's pool (a pause waits for the pools' streams, and copies their
 * content with MP_PAUSE_KEEP_CONTENT: the reset waits that long). The
 * pools' calls reach the driver directly (the cuda backend), never a hook,
 * so nothing here resets a device. */
static void mp__pause_pools(mp__pl_pools_t *ps, void *ctx) {
  mp__pause_job_t *job = ctx;
  bool pause = job->pause;
  mp_status_t st = ps->n > 0 ? MP_OK : MP_EINVAL;
  job->n = ps->n;
  pthread_mutex_lock(&mp__pause_lock);
  /* Only the pools not in the state asked for yet: a pool made while the
   * others were paused is not paused, and refusing the resume for it (and
   * pausing the others again) left the process paused for good. A resume
   * also takes a pool with arenas that runs with one of them paused (a
   * pause that failed in one arena and could not resume another it had
   * paused: pool.h, Arenas): only mp_pool_resume brings that arena back,
   * and it was taken for running, so "every pool is running already"
   * while its threads' calls were MP_EBUSY for good. */
  int todo = 0;
  for (int i = 0; i < ps->n; i++)
    if (pause ? !mp__pool_is_paused(ps->pool[i])
              : mp__pool_resume_wanted(ps->pool[i]))
      ps->pool[todo++] = ps->pool[i];
  if (st == MP_OK && todo == 0)
    st = mp__fail(MP_EBUSY, "every pool is %s already",
                  pause ? "paused" : "running (not paused)");
  /* A resume's undo pauses each pool as it was paused: with its content
   * kept only where it kept it (undone with MP_PAUSE_KEEP_CONTENT, a pool
   * paused without copied all its live memory to page-locked host memory,
   * content the caller had given up, and where that copy could not be had
   * the pool stayed running, against all or none). */
  unsigned kept[MP__PL_MAX_DEVICES];
  int done = 0;
  for (; st == MP_OK && done < todo; done++) {
    if (!pause)
      kept[done] = mp__pool_pause_kept(ps->pool[done]);
    st = pause ? mp_pool_pause(ps->pool[done], job->flags)
               : mp_pool_resume(ps->pool[done]);
    if (st != MP_OK)
      break;
  }
  /* All or none: undo the pools done before the one that failed; the
   * message stays the failure's, not an undo's. */
  if (st != MP_OK && done > 0) {
    mp__error_saved_t failure;
    mp__error_save(&failure);
    for (int i = 0; i < done; i++)
      (void)(pause ? mp_pool_resume(ps->pool[i])
                   : mp_pool_pause(ps->pool[i], kept[i]));
    mp__error_restore(&failure);
  }
  pthread_mutex_unlock(&mp__pause_lock);
  job->st = st;
}

static int mp__pause_all(bool pause, unsigned flags) {
  if (!mp__pl_enter()) {
    mp__pl_leave();
    return MP_EBUSY;
  }
  const mp__pl_t *pl = mp__pl_get();
  mp__pause_job_t job = {.pause = pause, .flags = flags, .st = MP_EINVAL};
  if (pl->mode == MP__PL_POOL)
    mp__pl_with_pools(pl, mp__pause_pools, &job);
  if (!pause && job.st == MP_OK) /* streams made while paused (devices.c) */
    mp__pl_devices_resumed();
  if (job.st != MP_OK)
    fprintf(stderr, "mempool preload: %s: %s\n",
            pause ? "mempool_preload_pause" : "mempool_preload_resume",
            job.n > 0 ? mp_last_error() : "not serving from a pool");
  mp__pl_leave();
  return (int)job.st;
}

int mempool_preload_pause(unsigned flags) {
  return mp__pause_all(true, flags);
}

int mempool_preload_resume(void) {
  return mp__pause_all(false, 0);
}
