/* mempool/direct.h - the direct (non-caching) allocator.
 *
 * One device allocation per request and no caching: the baseline of the
 * benchmark and the debugging mode (exact bounds for memory checkers). Frees
 * are deferred: a device free implies a device synchronization on CUDA, so
 * blocks are released together by mp_direct_free_session, after the streams
 * involved are synchronized. */
#ifndef MEMPOOL_DIRECT_H
#define MEMPOOL_DIRECT_H

#include <stddef.h>

#include <mempool/device.h>
#include <mempool/stats.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_direct mp_direct_t;
MP_API mp_status_t mp_direct_create(mp_device_t *dev, mp_direct_t **out);
/* One device allocation each; 0 bytes: MP_OK with *out = NULL. */
MP_API mp_status_t mp_direct_alloc(mp_direct_t *d, size_t bytes, mp_stream_t s,
                                   void **out);
/* Deferred until the session ends; a second free in the session: MP_EINVAL. */
MP_API mp_status_t mp_direct_free(mp_direct_t *d, void *ptr);
/* Synchronizes, then releases every deferred block. */
MP_API mp_status_t mp_direct_free_session(mp_direct_t *d);
MP_API mp_status_t mp_direct_get_stats(mp_direct_t *d, mp_stats_t *out);
MP_API mp_status_t mp_direct_destroy(mp_direct_t *d);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_DIRECT_H */
