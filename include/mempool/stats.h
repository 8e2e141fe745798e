/* mempool/stats.h - counters of a pool or of the direct allocator.
 *
 * Byte counts: "reserved" is device memory held (mapped, for virtual
 * segments), "allocated" what is handed out after rounding, "requested" what
 * callers asked for. Fields are only ever appended, never reordered. */
#ifndef MEMPOOL_STATS_H
#define MEMPOOL_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <mempool/pool.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_stats {
  size_t reserved_bytes, peak_reserved_bytes; /* device memory held (mapped, for
                                                 virtual segments, with any
                                                 mapping the device refused
                                                 to take back) */
  size_t allocated_bytes, peak_allocated_bytes; /* handed out, after rounding */
  size_t requested_bytes, peak_requested_bytes; /* asked for by callers */
  size_t largest_free_bytes; /* biggest block one alloc could get without the
                                device */
  uint64_t alloc_count, free_count;
  uint64_t device_alloc_count, device_free_count; /* calls into the driver */
  uint64_t oom_count; /* allocations that ended in MP_ENOMEM or MP_ELIMIT */
  /* Appended fields. */
  size_t free_bytes;          /* reserved but not allocated: the cache */
  size_t segment_count;       /* segments (or mapped chunks) held now */
  uint64_t live_blocks;       /* blocks handed out now */
  uint64_t free_blocks;       /* free blocks in the cache now (0 while
                                 paused, as free_bytes) */
  uint64_t defrag_count;      /* defragmentations run */
  uint64_t moved_bytes;       /* bytes moved by defragmentation */
  uint64_t alloc_retry_count; /* allocations that gave cached memory back
                                 to the device and retried (PyTorch's
                                 num_alloc_retries) */
  size_t struct_size;         /* set by the library: the bytes of this struct it
                                 wrote (see "Growing" below) */
} mp_stats_t;

/* Growing: mp_stats_t only ever gains fields at its end. Each call that
 * fills one (mp_pool_get_stats, mp_direct_get_stats,
 * mp_allocator_get_stats, mp_host_pool_get_stats) has a _sized twin that
 * takes the caller's sizeof(mp_stats_t), so a program built against an
 * older header (a shorter mp_stats_t) keeps working with a newer library:
 * exactly its own bytes are written, never more. size must end on a field,
 * from oom_count (MP_STATS_SIZE_MIN, the first published layout) to the
 * last field this library knows (sizeof(mp_stats_t)); anything else (a
 * struct from a header newer than the library, a size inside a field) is
 * MP_EINVAL, says which sizes are known in mp_last_error(), and writes
 * nothing. struct_size is set to size when the struct has room for it. The
 * calls themselves are plain functions with the signatures of API.md and
 * fill MP_STATS_SIZE_V1 bytes, today the whole struct. When a field is
 * appended, those symbols keep filling MP_STATS_SIZE_V1 bytes for the
 * programs built before, and this header will name each call's new symbol
 * for the programs built after (as pool.h does with mp_pool_config_init). */
#define MP_STATS_SIZE_MIN (offsetof(mp_stats_t, oom_count) + sizeof(uint64_t))
#define MP_STATS_SIZE_V1  (offsetof(mp_stats_t, struct_size) + sizeof(size_t))

MP_API mp_status_t mp_pool_get_stats(mp_pool_t *pool, mp_stats_t *out);
MP_API mp_status_t mp_pool_get_stats_sized(mp_pool_t *pool, mp_stats_t *out,
                                           size_t size);
/* Peaks start again from the current values. */
MP_API mp_status_t mp_pool_reset_peaks(mp_pool_t *pool);
/* format: "text" (NULL), "json" (stats, segments with their blocks, free
 * classes with external fragmentation = 1 - largest free / total free; a
 * segment's size is the bytes it holds on the device now: while
 * paused, what the pause left mapped, as reserved_bytes, and the segment
 * says " paused" / "paused":true), or "torch": one JSON object with
 * torch.cuda.memory_stats()'s key names where they mean the same here
 * (allocated_bytes.all.current, ..., inactive_split_bytes.all.current: free
 * bytes that cannot go back to the device while their neighbours live,
 * num_alloc_retries, num_ooms). While paused it lists no free class (free
 * is 0: a paused pool serves nothing). A write of the dump's that fails:
 * MP_EIO (an error flag the stream had before the call is not one). */
MP_API mp_status_t mp_pool_dump(mp_pool_t *pool, FILE *out, const char *format);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_STATS_H */
