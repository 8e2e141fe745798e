/* cuda.c - PLACEHOLDER: the cuda backend is being written; until it lands,
 * opening "cuda" fails with MP_ENODEV. */
#include "backend.h"

#if MEMPOOL_HAVE_CUDA
static mp_status_t mp__cuda_open(mp_device_t *dev, const char *opts) {
  (void)dev;
  (void)opts;
  return mp__fail(MP_ENODEV, "the cuda backend is not built yet");
}

const mp__backend_t mp__cuda_backend = {.name = "cuda", .open = mp__cuda_open};
#endif
