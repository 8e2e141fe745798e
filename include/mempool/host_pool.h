/* mempool/host_pool.h - a caching allocator for page-locked host memory.
 *
 * cuMemHostAlloc/cudaHostAlloc cost a driver call (milliseconds on real
 * hardware) and pin whole pages. A host pool caches page-locked memory it
 * got from a device (mp_device_host_alloc) and serves staging buffers from
 * it with the device pool's own machinery (mempool/pool.h): best fit with
 * no power-of-two rounding (sizes round up to the alignment only), split
 * and coalesce, a cap, trim, the same stats, dump and check. Requests up
 * to segment_bytes/2 share segment_bytes chunks (default 2 MiB, one driver
 * call per chunk); larger ones get their own chunk rounded up to 2 MiB.
 *
 * Streams: a buffer used by async copies on stream s must be freed with
 * its stream known: it is allocated for s (mp_host_pool_alloc) and any
 * other stream that reads or writes it is named with
 * mp_host_pool_record_stream. A freed buffer is reused, by any request (its
 * own stream's included), only once every stream it was used on has
 * reached the free: the host fills a staging buffer outside any stream's
 * order, so handing a buffer back to s while a copy queued on s still reads
 * it would let the host's writes reach that copy. Until then a request is
 * served by another buffer or by growth. The NULL stream is a stream like
 * the others. Streams are the device's (mp_stream_create(dev, ...)).
 *
 * Graphs: work queued on a stream while it is captured (CUDA:
 * cuStreamBeginCapture) runs only when the graph is launched, as often as
 * it is launched, so no point of the stream stands for it. A buffer that
 * the host pool sees used by a capture (allocated for a capturing stream,
 * named for one with mp_host_pool_record_stream, or freed while a stream
 * that used it captures) is, once freed, not handed out again (nor given
 * back by trim) until that graph and every executable made from it are
 * destroyed, their launches done: the driver tells that a while after the
 * last destroy, and the next call of the host pool takes the buffer back.
 * Until then it counts as allocated in the stats. A buffer used by captured
 * work that the pool is not told of during the capture (the copy captured,
 * the buffer freed after the capture ended) is reused as any other: name
 * it with mp_host_pool_record_stream in the capture. Where the driver
 * cannot tell when a graph is gone (no user objects), the buffer is kept
 * until the host pool is destroyed. Destroying the host pool gives every
 * buffer back, held ones too: a graph that uses one must not be launched
 * again.
 *
 * All calls are thread-safe; the device must outlive the pool. */
#ifndef MEMPOOL_HOST_POOL_H
#define MEMPOOL_HOST_POOL_H

#include <stddef.h>
#include <stdio.h>

#include <mempool/device.h>
#include <mempool/pool.h>
#include <mempool/stats.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_host_pool mp_host_pool_t;

/* cfg NULL: every field 0, i.e. the defaults: no cap below the machine's
 * physical memory, 512-byte alignment, 2 MiB chunks, no split limit
 * ($MEMPOOL_CONF is the device pool's and is not read); align may be up to
 * the page size (page-locked memory is whole pages), and segment_bytes is
 * rounded up to a whole number of pages. max_bytes caps the
 * page-locked bytes held; an allocation it stops is MP_ELIMIT. cfg->flags
 * and cfg->map_piece are ignored: page-locked memory has no virtual memory
 * and host blocks never move. A bad cfg is MP_EINVAL, as for
 * mp_pool_create (one that mp_pool_config_init made under a bad
 * $MEMPOOL_CONF included). */
MP_API mp_status_t mp_host_pool_create(mp_device_t *dev,
                                       const mp_pool_config_t *cfg,
                                       mp_host_pool_t **out);
/* Synchronizes the streams that used the pool and gives every chunk back
 * to the device (mp_device_host_free). NULL: MP_EINVAL. A free the device
 * refuses first leaves the host pool as it was (its status); one refused
 * after others went is still reported, but the host pool is then
 * destroyed (as mp_pool_destroy) and hp must not be used again. */
MP_API mp_status_t mp_host_pool_destroy(mp_host_pool_t *hp);

/* Page-locked memory for use on stream s (NULL: the default stream, or
 * host-only use). 0 bytes: MP_OK with *out = NULL. MP_ELIMIT when the cap
 * stops it, MP_ENOMEM when the device does; *out is then unchanged. */
MP_API mp_status_t mp_host_pool_alloc(mp_host_pool_t *hp, size_t bytes,
                                      mp_stream_t s, void **out);
/* Stream-ordered on the buffer's stream (see above). NULL: MP_OK. A
 * pointer the pool did not hand out, one inside a buffer, or one already
 * freed: MP_EINVAL, and the pool is unchanged. */
MP_API mp_status_t mp_host_pool_free(mp_host_pool_t *hp, void *ptr);
/* ptr is also used by work queued on s: it is reused elsewhere only once s
 * has reached the free. Bad pointers as for mp_host_pool_free. */
MP_API mp_status_t mp_host_pool_record_stream(mp_host_pool_t *hp, void *ptr,
                                              mp_stream_t s);
/* Gives cached chunks back to the device, after synchronizing the streams
 * that used them, until at most keep_bytes of free memory stay held. */
MP_API mp_status_t mp_host_pool_trim(mp_host_pool_t *hp, size_t keep_bytes);
/* The device pool's counters: reserved_bytes is page-locked memory held,
 * device_alloc_count/device_free_count the driver calls made. */
MP_API mp_status_t mp_host_pool_get_stats(mp_host_pool_t *hp, mp_stats_t *out);
/* As above, for a caller whose mp_stats_t is size bytes (see "Growing" in
 * mempool/stats.h). */
MP_API mp_status_t mp_host_pool_get_stats_sized(mp_host_pool_t *hp,
                                                mp_stats_t *out, size_t size);
/* As mp_pool_dump: format "text" or "json" (NULL: "text"). */
MP_API mp_status_t mp_host_pool_dump(mp_host_pool_t *hp, FILE *out,
                                     const char *format);
/* Walks every invariant: MP_OK or MP_ECORRUPT. */
MP_API mp_status_t mp_host_pool_check(mp_host_pool_t *hp);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_HOST_POOL_H */
