/* test_ipc_import_in_host_function_says_mp_ipc_import.c - mp_ipc_import
 * called from a host function on a host device is refused (cuda.h,
 * cuLaunchHostFunc: "must not make any CUDA API calls"), with a message
 * that names the call the program made. It named "ipc_open", the
 * backend's operation (src/device/backend.h), which no program calls.
 * The refusal changes nothing: the handle imports afterwards. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/ipc_white_box.h"

#define MiB ((size_t)1 << 20)

typedef struct {
  mp_device_t *dev;
  mp_ipc_handle_t *h;
  mp_status_t st;
  void *got;
  char why[512];
} import_call_t;

static void import_here(void *arg) {
  import_call_t *c = arg;
  c->st = mp_ipc_import(c->dev, c->h, &c->got);
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
}

Test(ipc_import_in_host_function_says_mp_ipc_import,
     the_refusal_names_mp_ipc_import) {
  ipc_white_box_t w;
  ipc_white_box_open(&w);
  void *p = NULL;
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(w.pool, MiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(w.pool, p, &h), MP_OK, "%s", mp_last_error());
  import_call_t c = {.dev = w.imp, .h = &h};
  run_in_host_fn(w.imp, import_here, &c);
  cr_expect_eq(c.st, MP_EINVAL, "%s", mp_status_name(c.st));
  cr_expect(strncmp(c.why, "mp_ipc_import: ", 15) == 0, "%s", c.why);
  cr_expect(strstr(c.why, "host function") != NULL, "%s", c.why);
  cr_expect_null(c.got);
  /* Nothing changed: the same handle imports outside a host function. */
  void *got = NULL;
  cr_assert_eq(mp_ipc_import(w.imp, &h, &got), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(w.imp, got), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(w.pool, p), MP_OK);
  ipc_white_box_close(&w);
}
