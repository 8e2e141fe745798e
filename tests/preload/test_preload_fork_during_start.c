/* test_preload_fork_during_start.c - a fork made inside the shim's start
 * (the first hooked call), on the starting thread: cuInit forks and execs
 * nvidia-modprobe where the device files or the nvidia-uvm module are
 * missing (libfabric's hmem PR #6272: "cuInit() forks and execs
 * nvidia-modprobe to setup device files and load drivers if they are
 * missing"), and a program whose first CUDA call is cudaMalloc on the
 * shared runtime starts the shim before the driver is initialized, so the
 * start's mp_device_open makes that cuInit. fork(2) runs the shim's
 * prepare handler there, which took the start's lock, held by the same
 * thread: the program hung for good in its first cudaMalloc.
 *
 * mp_device_open is wrapped (-Wl,--wrap) to fork (the child exits at
 * once) before the real open, as cuInit's fork comes inside it. The
 * scenario runs in a child of the test (child_within.h), the shim's
 * sources in it on the fake driver. */
#include <stdbool.h>
#include <sys/wait.h>

#include "child_within.h"
#include "in_process.h"

mp_status_t __real_mp_device_open(const char *spec, mp_device_t **out);
mp_status_t __wrap_mp_device_open(const char *spec, mp_device_t **out);

static bool fork_in_open;

mp_status_t __wrap_mp_device_open(const char *spec, mp_device_t **out) {
  if (fork_in_open) {
    pid_t pid = fork();
    if (pid == 0)
      _exit(0);
    if (pid > 0)
      (void)waitpid(pid, NULL, 0);
  }
  return __real_mp_device_open(spec, out);
}

/* 0 when the first allocation (the start) came back served by the pool. */
static int scenario(void) {
  fork_in_open = true;
  int rc = mp_in_process_child_served();
  if (rc != 0)
    return rc;
  const mp__pl_t *pl = mp__pl_started();
  return pl != NULL && pl->mode == MP__PL_POOL ? 0 : 9;
}

MP_CHILD_SCENARIO("MP_FORK_DURING_START_CHILD", scenario)

/* Failed before: "the first hooked call, forking in the start: hung". */
Test(preload_fork_during_start, a_fork_in_the_start_does_not_hang_it) {
  mp_child_within("MP_FORK_DURING_START_CHILD", 20,
                  "the first hooked call, forking in the start");
}
