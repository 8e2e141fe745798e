/* ipc_exporter.h - a plain allocation of the "cuda" backend exported
 * (cuIpcGetMemHandle) for an import in the same process, by the word of a
 * forked child (the fake driver opens no handle in the process that made
 * it): the import tests of the cuda backend's ipc_open. */
#ifndef MEMPOOL_FAKECUDA_IPC_EXPORTER_H
#define MEMPOOL_FAKECUDA_IPC_EXPORTER_H

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define BYTES ((size_t)1 << 20)

struct exporter {
  pid_t pid;
  int done; /* written to let the child go */
  mp_device_t *dev;
  void *p;
  mp_ipc_handle_t h;
};

/* BYTES allocated on "cuda" and exported (cuIpcGetMemHandle) in this
 * process, and a forked child that only waits until e->done is written
 * to: the fake names the exporter by the pid in the handle, which becomes
 * the child's (as test_fakecuda_ipc_open_threads.c does), so that the
 * driver opens the handle here. The child starts no thread: TSan dies in
 * a child that starts one after a multi-threaded fork. */
static void start_exporter(struct exporter *e) {
  e->dev = open_dev("cuda");
  cr_assert_eq(mp_device_alloc(e->dev, BYTES, &e->p), MP_OK, "%s",
               mp_last_error());
  e->h = (mp_ipc_handle_t){0};
  cr_assert_eq(e->dev->ops->ipc_export(e->dev, e->p, BYTES, false, &e->h),
               MP_OK, "%s", mp_last_error());
  e->h.kind = MP_IPC_CUDA;
  e->h.mem_bytes = BYTES;
  int down[2];
  cr_assert_eq(pipe(down), 0);
  e->pid = fork();
  cr_assert_geq(e->pid, 0);
  if (e->pid == 0) {
    close(down[1]);
    char c;
    (void)!read(down[0], &c, 1);
    _exit(0);
  }
  close(down[0]);
  e->done = down[1];
  int32_t pid = (int32_t)e->pid;
  memcpy((char *)e->h.opaque + 8, &pid, sizeof pid);
}

static void stop_exporter(struct exporter *e) {
  cr_assert_eq(write(e->done, "x", 1), 1);
  close(e->done);
  int status = 0;
  cr_assert_eq(waitpid(e->pid, &status, 0), e->pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_expect_eq(mp_device_free(e->dev, e->p), MP_OK, "%s", mp_last_error());
  mp_device_close(e->dev);
}

#endif /* MEMPOOL_FAKECUDA_IPC_EXPORTER_H */
