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
/* One device allocation each; 0 bytes: MP_OK with *out = NULL. s is not
 * waited on (device allocations are not stream-ordered) but must be NULL
 * or a live stream of the device: else MP_EINVAL, nothing allocated. */
MP_API mp_status_t mp_direct_alloc(mp_direct_t *d, size_t bytes, mp_stream_t s,
                                   void **out);
/* Deferred until the session ends; a second free in the session, or a
 * pointer this allocator did not hand out: MP_EINVAL. NULL: MP_OK. */
MP_API mp_status_t mp_direct_free(mp_direct_t *d, void *ptr);
/* ptr is also used on s. Since a session synchronizes the whole device
 * before it releases anything, this only checks that ptr is live and that
 * s is NULL or a live stream of the device (for the allocator interface's
 * record_stream); anything else is MP_EINVAL. */
MP_API mp_status_t mp_direct_record_stream(mp_direct_t *d, void *ptr,
                                           mp_stream_t s);
/* Synchronizes the device, then releases every deferred block. An
 * allocation that finds the device full waits for the sessions other
 * threads were ending when it found it full, then ends the session itself
 * (once), and tries again as their memory, then its own, goes back: it is
 * MP_ENOMEM when none of that memory made room (sessions begun after its
 * try failed do not keep it trying), or when those sessions have not ended
 * within 5 s (their synchronization may wait for work the allocating
 * thread itself has yet to let go; the deferred blocks then stay). One
 * for more than the device has in all (mp_device_mem_info's total, asked
 * at create) is MP_ENOMEM at once, said so: no session ends for it.
 * A device synchronization during a capture of any stream of the device
 * invalidates the capture (CUDA Programming Guide, "Prohibited and
 * Unhandled Operations"), so while one is seen nothing synchronizes: this
 * call is MP_EBUSY and an allocation that finds the device full MP_ENOMEM,
 * each said so, the blocks still deferred for a later session. Seen: a
 * capture of the call's stream, of a stream mp_stream_create made on the
 * device, of the calling thread's per-thread stream, or of any blocking
 * stream (the legacy stream tells); CUDA cannot be asked about a
 * non-blocking stream the program made itself, whose capture the
 * synchronization then invalidates (the call fails, the blocks kept).
 * Stats: reserved = live + deferred bytes; nothing is rounded, so allocated
 * = requested; free_bytes / free_blocks count the deferred blocks;
 * alloc_retry_count counts the allocations that tried again after a
 * session (theirs or another thread's) gave memory back. A block the
 * device refuses to free stays deferred, for the next session, even when
 * host memory has run out meanwhile (the room to keep it is kept while its
 * session runs: an allocation or free that would take that room grows the
 * allocator's tables first, and is MP_ENOMEM where it cannot). */
MP_API mp_status_t mp_direct_free_session(mp_direct_t *d);
MP_API mp_status_t mp_direct_get_stats(mp_direct_t *d, mp_stats_t *out);
/* As above, for a caller whose mp_stats_t is size bytes (see "Growing" in
 * mempool/stats.h). */
MP_API mp_status_t mp_direct_get_stats_sized(mp_direct_t *d, mp_stats_t *out,
                                             size_t size);
/* Synchronizes the device and releases every block, live or deferred. On
 * failure the allocator stays, usable: a synchronization that fails
 * (called from a host function) or is not made (MP_EBUSY while a capture
 * is seen, as for mp_direct_free_session) changes nothing; blocks the device
 * refuses to free stay in it, for a later destroy. In a process forked while
 * another thread was ending a session, that session's blocks are released
 * too (but for one whose device free was under way at the fork: it may
 * have gone already, and is left alone). */
MP_API mp_status_t mp_direct_destroy(mp_direct_t *d);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_DIRECT_H */
