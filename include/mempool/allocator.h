/* mempool/allocator.h - one interface over every allocator, chosen by name.
 *
 * bench/ and the LD_PRELOAD shim drive pools, child pools and the direct
 * allocator through this table, so an allocator is picked with a string:
 *   "pool"                 a best-fit caching pool with the default config
 *   "pool:KEY=VAL,..."     with the options of mp_pool_config_parse
 *   "direct"               the direct (non-caching) allocator
 *   "child:bytes=SIZE[,KEY=VAL...]"  a child pool of SIZE carved from a pool
 *                          made on the same device (options as for "pool")
 * An unknown name or option is MP_EINVAL and mp_last_error() names it. */
#ifndef MEMPOOL_ALLOCATOR_H
#define MEMPOOL_ALLOCATOR_H

#include <stddef.h>

#include <mempool/device.h>
#include <mempool/stats.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_allocator mp_allocator_t;

typedef struct mp_allocator_ops {
  const char *kind; /* "pool", "child", "direct" */
  mp_status_t (*alloc)(void *self, size_t bytes, mp_stream_t s, void **out);
  mp_status_t (*free)(void *self, void *ptr);
  mp_status_t (*record_stream)(void *self, void *ptr, mp_stream_t s);
  mp_status_t (*get_stats)(void *self, mp_stats_t *out);
  /* Gives cached memory back (pool: trim to 0; direct: end the session). */
  mp_status_t (*release)(void *self);
  mp_status_t (*destroy)(void *self);
} mp_allocator_ops_t;

MP_API mp_status_t mp_allocator_create(mp_device_t *dev, const char *spec,
                                       mp_allocator_t **out);
/* Wraps an allocator the caller made; self stays the caller's to destroy
 * unless ops->destroy is non-NULL. name is copied. */
MP_API mp_status_t mp_allocator_wrap(const mp_allocator_ops_t *ops, void *self,
                                     const char *name, mp_allocator_t **out);
MP_API const char *mp_allocator_name(const mp_allocator_t *a); /* the spec */
MP_API mp_status_t mp_allocator_alloc(mp_allocator_t *a, size_t bytes,
                                      mp_stream_t s, void **out);
MP_API mp_status_t mp_allocator_free(mp_allocator_t *a, void *ptr);
MP_API mp_status_t mp_allocator_record_stream(mp_allocator_t *a, void *ptr,
                                              mp_stream_t s);
MP_API mp_status_t mp_allocator_get_stats(mp_allocator_t *a, mp_stats_t *out);
/* As above, for a caller whose mp_stats_t is size bytes (see "Growing" in
 * mempool/stats.h). */
MP_API mp_status_t mp_allocator_get_stats_sized(mp_allocator_t *a,
                                                mp_stats_t *out, size_t size);
MP_API mp_status_t mp_allocator_release(mp_allocator_t *a);
/* Destroys the allocator (and, for "child", the pool it was carved from).
 * MP_EBUSY keeps it usable; so does any failure of "pool", "child" and
 * "direct" (a destroy from a host function cannot wait for the device),
 * except one that took the allocator's pool with it (a "child" allocator
 * whose parent's destroy failed, or a device free refused after others
 * went: see mp_pool_destroy_ex): the allocator then stays for a later
 * destroy to end what is left, every other call on it is MP_EINVAL and
 * mp_allocator_pool gives NULL. After another failure of a wrapped
 * allocator it is gone. */
MP_API mp_status_t mp_allocator_destroy(mp_allocator_t *a);
/* The underlying pool for "pool" and "child" allocators, else NULL (also
 * once a failed destroy took it, see above). */
MP_API mp_pool_t *mp_allocator_pool(const mp_allocator_t *a);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_ALLOCATOR_H */
