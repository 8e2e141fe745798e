/* refused.c - whether the driver refuses this thread's calls now, as it
 * does in a host function. In a file of its own, below every file that
 * asks it (free.c, driver.c, host.c, graphs.c: src_preload_layers forbids
 * a circle among them), and apart from real.c, whose table of the
 * driver's calls (mp__pl_real_cuda) the tests wrap at link time: a call
 * from inside real.c would not be wrapped. */
#include "preload.h"

/* cuda.h, cuLaunchHostFunc and cuStreamAddCallback: see preload.h. */
bool mp__pl_calls_refused(void) {
  mp__curesult (*current)(mp__cuctx *) = mp__pl_real_cuda()->cuCtxGetCurrent;
  mp__cuctx c = NULL;
  return current != NULL && current(&c) == MP__CU_NOT_PERMITTED;
}
