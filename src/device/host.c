/* host.c - PLACEHOLDER: the host backend is being written; until it lands,
 * opening "host" fails with MP_ENODEV. */
#include "backend.h"

static mp_status_t mp__host_open(mp_device_t *dev, const char *opts) {
  (void)dev;
  (void)opts;
  return mp__fail(MP_ENODEV, "the host backend is not built yet");
}

const mp__backend_t mp__host_backend = {.name = "host", .open = mp__host_open};
