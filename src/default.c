/* default.c - the drop-in replacement for cudaMalloc: one process-wide pool.
 *
 * The pool is made on first use, exactly once even when threads race
 * (pthread_once), on mp_device_open(NULL) (which honours $MEMPOOL_DEVICE)
 * with mp_pool_config_init ($MEMPOOL_CONF). When it cannot be made the
 * reason is kept and every later call fails with it; the pool and device
 * live until the process exits. */
#include <pthread.h>
#include <stdio.h>

#include "internal.h"
#include "pool/pool_internal.h"

static pthread_once_t mp__default_once = PTHREAD_ONCE_INIT;
static mp_pool_t *mp__default;
static mp_status_t mp__default_status = MP_OK;
static char mp__default_error[256];

static void mp__default_make(void) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open(NULL, &dev);
  if (st == MP_OK) {
    mp_pool_config_t cfg;
    mp_pool_config_init(&cfg);
    st = mp_pool_create(dev, &cfg, &mp__default);
    if (st != MP_OK)
      mp_device_close(dev);
  }
  if (st != MP_OK) {
    mp__default_status = st;
    snprintf(mp__default_error, sizeof mp__default_error, "%s",
             mp_last_error());
  }
}

mp_pool_t *mp_default_pool(void) {
  pthread_once(&mp__default_once, mp__default_make);
  if (mp__default == NULL)
    mp__fail(mp__default_status, "default pool unavailable: %s",
             mp__default_error);
  return mp__default;
}

mp_status_t mp_malloc(void **ptr, size_t bytes) {
  return mp_malloc_async(ptr, bytes, NULL);
}

mp_status_t mp_malloc_async(void **ptr, size_t bytes, mp_stream_t s) {
  if (ptr == NULL)
    return mp__fail(MP_EINVAL, "mp_malloc: ptr is NULL");
  mp_pool_t *pool = mp_default_pool();
  if (pool == NULL)
    return mp__default_status;
  return mp_pool_alloc(pool, bytes, s, ptr);
}

mp_status_t mp_free(void *ptr) {
  if (ptr == NULL)
    return MP_OK;
  mp_pool_t *pool = mp_default_pool();
  if (pool == NULL)
    return mp__default_status;
  return mp_pool_free(pool, ptr);
}

mp_status_t mp_free_async(void *ptr, mp_stream_t s) {
  if (ptr == NULL)
    return MP_OK;
  mp_pool_t *pool = mp_default_pool();
  if (pool == NULL)
    return mp__default_status;
  return mp__pool_free_on(pool, ptr, s, "mp_free_async");
}
