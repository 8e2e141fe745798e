/* The cuda backend's import of a plain allocation's handle (ipc_open:
 * cuIpcOpenMemHandle, then cuMemGetAddressRange to check the handle's size
 * against what it maps) when the driver refuses a step. A refused
 * cuMemGetAddressRange is the driver's failure, said as such (before, it
 * was reported as a handle claiming more memory than its allocation has,
 * "has 0"); and where the undoing cuIpcCloseMemHandle is refused too, the
 * memory stays mapped: ipc_open says so and hands back where (*out), for
 * mp_ipc_import to keep for mp_device_close (before, it was forgotten,
 * mapped). The exporter is a forked child: the driver opens no handle in
 * the process that made it. The refusals are the fake's (cuFakeRefuse): no
 * GPU twin. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define BYTES ((size_t)1 << 20)

struct exporter {
  pid_t pid;
  int done; /* written to let the child go */
  mp_ipc_handle_t h;
};

/* A child process that allocates BYTES on "cuda" and exports them
 * (cuIpcGetMemHandle); it lives until e->done is written to. */
static void start_exporter(struct exporter *e) {
  int up[2], down[2];
  cr_assert_eq(pipe(up), 0);
  cr_assert_eq(pipe(down), 0);
  e->pid = fork();
  cr_assert_geq(e->pid, 0);
  if (e->pid == 0) {
    close(up[0]);
    close(down[1]);
    mp_device_t *d = NULL;
    void *p = NULL;
    mp_ipc_handle_t h = {0};
    if (mp_device_open("cuda", &d) != MP_OK ||
        mp_device_alloc(d, BYTES, &p) != MP_OK ||
        d->ops->ipc_export(d, p, BYTES, false, &h) != MP_OK)
      _exit(1);
    if (write(up[1], h.opaque, sizeof(CUipcMemHandle)) !=
        (ssize_t)sizeof(CUipcMemHandle))
      _exit(2);
    char c;
    (void)!read(down[0], &c, 1);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  e->done = down[1];
  e->h = (mp_ipc_handle_t){.kind = MP_IPC_CUDA, .mem_bytes = BYTES};
  cr_assert_eq(read(up[0], e->h.opaque, sizeof(CUipcMemHandle)),
               (ssize_t)sizeof(CUipcMemHandle), "the exporter failed");
  close(up[0]);
}

static void stop_exporter(struct exporter *e) {
  cr_assert_eq(write(e->done, "x", 1), 1);
  close(e->done);
  int status = 0;
  cr_assert_eq(waitpid(e->pid, &status, 0), e->pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* An open that works, closed again: the handle itself was good. */
static void open_and_close(mp_device_t *dev, const mp_ipc_handle_t *h) {
  void *out = NULL;
  cr_assert_eq(dev->ops->ipc_open(dev, h, &out), MP_OK, "%s", mp_last_error());
  bool unmapped = false;
  cr_assert_eq(dev->ops->ipc_close(dev, out, BYTES, MP_IPC_CUDA, &unmapped),
               MP_OK, "%s", mp_last_error());
  cr_assert(unmapped);
}

Test(cuda_ipc_open_refusals, a_refused_address_range_is_the_drivers_failure) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  long long closes = fk_calls("cuIpcCloseMemHandle");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuMemGetAddressRange") != NULL &&
                strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL,
            "the refusal is not named: %s", mp_last_error());
  cr_expect_null(out);
  cr_expect_eq(fk_calls("cuIpcCloseMemHandle") - closes, 1,
               "what was opened was not closed");
  open_and_close(dev, &e.h);
  mp_device_close(dev);
  stop_exporter(&e);
}

Test(cuda_ipc_open_refusals, a_refused_undoing_close_says_what_stays_mapped) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuIpcCloseMemHandle", CUDA_ERROR_UNKNOWN, 1);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  cr_expect_neq(st, MP_OK);
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
            mp_last_error());
  cr_assert_not_null(out, "what stays mapped was not handed back");
  long long closes = fk_calls("cuIpcCloseMemHandle");
  bool unmapped = false;
  cr_expect_eq(dev->ops->ipc_close(dev, out, BYTES, MP_IPC_CUDA, &unmapped),
               MP_OK, "%s", mp_last_error());
  cr_expect(unmapped);
  cr_expect_eq(fk_calls("cuIpcCloseMemHandle") - closes, 1);
  open_and_close(dev, &e.h);
  mp_device_close(dev);
  stop_exporter(&e);
}
