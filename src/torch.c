/* torch.c - PyTorch's pluggable-allocator entry points (mempool/torch.h).
 *
 * Both calls are thin: they check what PyTorch passes, then go to the
 * default pool. PyTorch frees a block with the stream it was allocated on;
 * a different stream is recorded on the block first, so the block is reused
 * elsewhere only after the work on both streams is done. The invariant: a
 * pointer returned here is a live block of mp_default_pool(), and only
 * mp_torch_free (or mp_free) ends it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The device ordinal the pool serves: N for "cuda:N ...", 0 for the host
 * device, -1 when the name says neither. */
static int mp__torch_pool_ordinal(mp_pool_t *pool) {
  const char *name = mp_device_name(mp_pool_device(pool));
  if (strncmp(name, "host", 4) == 0)
    return 0;
  if (strncmp(name, "cuda:", 5) != 0)
    return -1;
  char *end = NULL;
  long n = strtol(name + 5, &end, 10);
  return (end != name + 5 && n >= 0 && n < 1 << 20) ? (int)n : -1;
}

void *mp_torch_malloc(ssize_t size, int device, mp_stream_t stream) {
  if (size <= 0) {
    mp__fail(MP_EINVAL, "mp_torch_malloc: size %zd is not positive", size);
    return NULL;
  }
  mp_pool_t *pool = mp_default_pool();
  if (pool == NULL)
    return NULL; /* mp_last_error() says why the pool could not be made */
  int ordinal = mp__torch_pool_ordinal(pool);
  if (device != ordinal) {
    mp__fail(MP_EINVAL,
             "mp_torch_malloc: device %d asked, but the default pool serves "
             "'%s'",
             device, mp_device_name(mp_pool_device(pool)));
    return NULL;
  }
  void *ptr = NULL;
  if (mp_pool_alloc(pool, (size_t)size, stream, &ptr) != MP_OK)
    return NULL;
  return ptr;
}

void mp_torch_free(void *ptr, ssize_t size, int device, mp_stream_t stream) {
  (void)size;
  (void)device;
  if (ptr == NULL)
    return;
  /* Freed in order on the free's stream (it matters when PyTorch frees on
   * another stream than the block's), in one step: a refused pointer leaves
   * nothing behind. */
  (void)mp_free_async(ptr, stream);
}
