/* ipc_white_box.h - white-box IPC tests in one process: a pool on an
 * exporting host device, and an importing host device whose backend
 * operations are a copy of the host backend's (ops), for the test to
 * replace some of (calling host_ops' own from there). */
#ifndef MEMPOOL_TEST_IPC_WHITE_BOX_H
#define MEMPOOL_TEST_IPC_WHITE_BOX_H

#include "device/backend.h"
#include "pool_helpers.h"

typedef struct ipc_white_box {
  mp_device_t *exp, *imp;
  mp_pool_t *pool; /* on exp */
  const mp__backend_t *host_ops;
  mp__backend_t ops; /* imp's, a copy of host_ops' until changed */
} ipc_white_box_t;

static inline void ipc_white_box_open(ipc_white_box_t *w) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &w->exp), MP_OK);
  cr_assert_eq(mp_device_open("host:capacity=64M", &w->imp), MP_OK);
  w->host_ops = w->imp->ops;
  w->ops = *w->host_ops;
  w->imp->ops = &w->ops;
  w->pool = make_pool(w->exp, NULL);
}

/* An ipc_close for imp (w->ops.ipc_close = ipc_white_box_flaky_close, with
 * ipc_wb_host_ops set to w->host_ops) that refuses (MP_EDRIVER, nothing
 * unmapped) while ipc_wb_refuse is set, and counts its calls and the bases
 * it unmapped (the first 8). */
static const mp__backend_t *ipc_wb_host_ops;
static bool ipc_wb_refuse;
static unsigned ipc_wb_closes, ipc_wb_nunmapped;
static void *ipc_wb_unmapped[8];

static inline mp_status_t ipc_white_box_flaky_close(mp_device_t *dev,
                                                    void *base, size_t bytes,
                                                    unsigned kind,
                                                    bool *unmapped) {
  ipc_wb_closes++;
  if (ipc_wb_refuse) {
    *unmapped = false;
    return mp__fail(MP_EDRIVER, "fake ipc_close refuses");
  }
  mp_status_t st = ipc_wb_host_ops->ipc_close(dev, base, bytes, kind, unmapped);
  if (*unmapped && ipc_wb_nunmapped < 8)
    ipc_wb_unmapped[ipc_wb_nunmapped++] = base;
  return st;
}

/* Checks and destroys the pool, gives imp its ops back, closes both. */
static inline void ipc_white_box_close(ipc_white_box_t *w) {
  check(w->pool);
  cr_assert_eq(mp_pool_destroy(w->pool), MP_OK, "%s", mp_last_error());
  w->imp->ops = w->host_ops;
  mp_device_close(w->imp);
  mp_device_close(w->exp);
}

#endif
