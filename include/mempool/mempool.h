/* mempool/mempool.h - everything, and the drop-in replacement for cudaMalloc.
 *
 * mp_malloc / mp_free serve from one process-wide pool per process, made on
 * first use on the device $MEMPOOL_DEVICE names (see mp_device_open) with
 * the options of $MEMPOOL_CONF (see mp_pool_config_init). It lives until the
 * process exits. */
#ifndef MEMPOOL_MEMPOOL_H
#define MEMPOOL_MEMPOOL_H

#include <stddef.h>

#include <mempool/allocator.h>
#include <mempool/device.h>
#include <mempool/direct.h>
#include <mempool/host_pool.h>
#include <mempool/pool.h>
#include <mempool/stats.h>
#include <mempool/status.h>
#include <mempool/torch.h>

#define MEMPOOL_VERSION_MAJOR 0
#define MEMPOOL_VERSION_MINOR 1
#define MEMPOOL_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* One process-wide pool per device, made on first use from $MEMPOOL_DEVICE
 * and $MEMPOOL_CONF. On CUDA the calling thread's device is served (its
 * current context's, as cudaMalloc; a thread without a context gets the
 * first pool's device), and mp_malloc_async serves the device of its
 * stream, as cuMemAllocAsync ("the memory pool current to the stream's
 * device"); the default streams are the calling thread's. mp_free and
 * mp_free_async find the pool that holds the pointer, whatever context is
 * current, among the pools already made: before the first mp_malloc, a
 * free is MP_EINVAL and makes nothing ($MEMPOOL_DEVICE and $MEMPOOL_CONF
 * still unread); where no pool could be made, MP_EINVAL naming why. */
MP_API mp_status_t mp_malloc(void **ptr, size_t bytes);
MP_API mp_status_t mp_malloc_async(void **ptr, size_t bytes, mp_stream_t s);
MP_API mp_status_t mp_free(void *ptr);
/* The block may still be in use by work on s. s may be another device's
 * stream than the block's (as cudaFreeAsync's; the default streams are the
 * calling thread's device's): the call then waits for s's work and frees
 * the block on its own stream; a child forked after the pools were made
 * gets MP_EINVAL from every call above. */
MP_API mp_status_t mp_free_async(void *ptr, mp_stream_t s);
/* The calling thread's device's pool; NULL if it cannot be made
 * (mp_last_error() says why). */
MP_API mp_pool_t *mp_default_pool(void);
/* 1 once the first default pool was made, or failed to be: from then on
 * $MEMPOOL_DEVICE and $MEMPOOL_CONF are read and fixed for the process (a
 * later change of either changes nothing). 0 before. Makes nothing, so a
 * binding can tell whether a device it is about to name could still take
 * effect (mempool.torch.use). */
MP_API int mp_default_pool_made(void);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_MEMPOOL_H */
