/* mempool/device.h - the thin device shim every allocator is built on.
 *
 * Two backends sit behind it:
 *  - "cuda": loads libcuda.so.1 at run time and uses the driver API on the
 *    device's primary context, so memory and streams are shared with CUDA
 *    runtime users. An mp_stream_t is a CUstream / cudaStream_t cast; NULL is
 *    the default stream. Every call targets the device the handle was opened
 *    on, never an implicit current device.
 *  - "host": an emulated device. Device memory is host memory reserved with
 *    mmap and committed lazily; every stream is a worker thread that runs its
 *    queue strictly in order; events complete when their stream reaches them.
 *    Spec options (sizes take K/M/G/T suffixes):
 *      capacity=SIZE    device memory; exceeding it is MP_ENOMEM (default
 *                       16G). Plain allocations and mapped virtual memory
 *                       count; reservations and host_alloc memory do not.
 *      latency_us=N     sleep added to every device allocate and free (and
 *                       virtual-memory map and unmap, and page-locked
 *                       host_alloc and host_free); 0 to 10000000
 *      stream_latency_us=N  a stream reaches each queued operation (copy,
 *                       memset, host function, event record) N us after it
 *                       was queued, as a GPU takes a while to reach its
 *                       launch queue: an event recorded on an idle stream
 *                       is pending meanwhile; 0 (default) to 10000000
 *      fail_after=N     the N-th device allocation (1-based; mp_device_alloc
 *                       and virtual-memory maps both count) and every later
 *                       one fail with MP_ENOMEM; 0 disables
 *      vmm=BOOL         emulate virtual-memory segments (default 1): 1/0,
 *                       true/false, yes/no or on/off, as pool options
 *      granularity=SIZE the virtual-memory granule (default 2M, as CUDA); a
 *                       power of two from the page size to 1T
 *    An unknown, repeated or malformed option is MP_EINVAL.
 *    The NULL stream of the host device is one more in-order stream; it does
 *    not synchronize with the others (like cudaStreamNonBlocking streams).
 *    Events follow CUDA: a wait or synchronize refers to the event's latest
 *    record at the time of the call; re-recording re-arms the event.
 *
 * Memory is given back to the device only after the streams that used it are
 * synchronized: mp_device_free synchronizes the device first, as cuMemFree
 * does. */
#ifndef MEMPOOL_DEVICE_H
#define MEMPOOL_DEVICE_H

#include <stddef.h>

#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_device mp_device_t;
/* cuda: a CUstream / cudaStream_t cast; NULL: the default stream. */
typedef struct mp_stream *mp_stream_t;
typedef struct mp_event *mp_event_t;

/* spec: "cuda", "cuda:N", "host", "host:capacity=8G,latency_us=20,...", or
 * NULL: $MEMPOOL_DEVICE if set, else "cuda" where a GPU is usable, else
 * "host". "cuda" with no driver or GPU: MP_ENODEV; a driver that fails to
 * initialise: MP_EDRIVER. A malformed spec is MP_EINVAL and mp_last_error()
 * names the bad key or value. From a host function (mp_stream_launch_host)
 * of a host device: MP_EINVAL, nothing opened (CUDA forbids API calls
 * there). */
MP_API mp_status_t mp_device_open(const char *spec, mp_device_t **out);
/* spec as mp_device_open reads it, in canonical form, without opening
 * anything: specs that open the same kind of device with the same
 * settings give the same text, so that a program can tell whether two
 * spellings mean one device ("cuda", "cuda:0" and "cuda:00" are "cuda:0";
 * "host", "host:" and "host:capacity=16G" are "host"; "host:capacity=8G"
 * and "host:capacity=8192M" are "host:capacity=8589934592"). A host spec
 * lists, in the order of the list above, each option that differs from its
 * default, as a decimal number (sizes in bytes, vmm as 0); granularity is
 * left out with vmm=0, where it means nothing. Written to buf, cap bytes
 * with the NUL (MP_DEVICE_SPEC_MAX always suffices). A NULL spec or buf, a
 * spec mp_device_open refuses as malformed (the same message), or a cap
 * too small (the message says how many bytes): MP_EINVAL, buf untouched.
 * Whether the device is there is not asked ("cuda:7" is canonical where no
 * GPU is, and in a build without the CUDA backend). */
MP_API mp_status_t mp_device_spec_canonical(const char *spec, char *buf,
                                            size_t cap);
#define MP_DEVICE_SPEC_MAX 256
/* Drains every stream, releases what is left, then closes. NULL: no-op.
 * From a host function of a host device (which runs on one of its
 * streams): refused, nothing closed, and mp_last_error() says so. While a
 * pool made on the device is not destroyed (the default pools never are):
 * refused the same way (MP_EBUSY from mp_device_close_ex). On CUDA
 * a close that cannot wait for the device's work (cuCtxSynchronize
 * refused: called from a host function, or while a stream of the device
 * is being captured) closes nothing: the device stays open and usable,
 * mp_last_error() says why, and a later close (once the wait is possible)
 * closes it. Beside another thread's capture the refused wait still
 * invalidates that capture (a device-wide synchronize from another
 * thread does on a GPU, in global and thread-local captures alike): close a
 * device once its captures ended. A refused close cannot be told from one that
 * closed here (no status, and mp_last_status() keeps an earlier failure):
 * callers that may meet one use mp_device_close_ex. A device dropped after a
 * refused close is never closed: its memory, page-locked buffers, streams,
 * events and imports, and on CUDA its hold on the primary context, stay until
 * the process exits. Close a device only once other threads' calls on it
 * have returned (a call that races the close may use freed memory); an
 * mp_ipc_close on another thread that already took its import (and waits
 * for the device's work) is waited for, so that the import is unmapped once
 * and its lease closed, but one that has not may fail or use freed memory. */
MP_API void mp_device_close(mp_device_t *dev);
/* mp_device_close with its status: MP_OK when the device was closed (NULL
 * too), else the refusal's status (MP_EINVAL from a host function; the
 * driver's refusal of the wait on CUDA), the device open and unchanged. */
MP_API mp_status_t mp_device_close_ex(mp_device_t *dev);
/* mp_device_close that also says what the driver refused once the close
 * went ahead: *closed is 1 when the device was closed (its handle must not
 * be used again; NULL too), 0 when it was refused and is open and
 * unchanged (the status of mp_device_close_ex's refusals). Closed, the
 * status is MP_OK, or the first refusal of what the close gives back: an
 * import's unmap (ipc.c: that import stays mapped, its lease open, until
 * the process exits) or a release of what the caller left (on CUDA
 * cuStreamDestroy, cuEventDestroy, cuMemUnmap, cuMemRelease,
 * cuMemAddressFree, cuMemFree, cuMemFreeHost, cuCtxPushCurrent,
 * cuThreadExchangeStreamCaptureMode restoring the thread's capture mode, or
 * cuDevicePrimaryCtxRelease: MP_EDRIVER with the driver's code), its
 * message naming it and counting the others; each other release was still
 * asked for, and what the driver refused stays its own (until the context
 * goes, for what it holds). mp_device_close and mp_device_close_ex say
 * MP_OK then, and leave the caller's last error as it was. A process that
 * closes devices at its exit may meet CUDA_ERROR_DEINITIALIZED here
 * (cuda.h: the driver is shutting down). closed may be NULL. */
MP_API mp_status_t mp_device_close_checked(mp_device_t *dev, int *closed);
/* e.g. "host", "cuda:0 NVIDIA H200"; "" for NULL. */
MP_API const char *mp_device_name(const mp_device_t *dev);
MP_API mp_status_t mp_device_mem_info(mp_device_t *dev, size_t *free_bytes,
                                      size_t *total_bytes);

/* Raw device memory, one driver allocation each: what pools and the direct
 * allocator are made of. 0 bytes is MP_EINVAL. */
MP_API mp_status_t mp_device_alloc(mp_device_t *dev, size_t bytes, void **out);
/* Synchronizes the device first, like cuMemFree. A pointer that
 * mp_device_alloc did not return is MP_EINVAL. */
MP_API mp_status_t mp_device_free(mp_device_t *dev, void *ptr);
/* Page-locked host memory; on CUDA portable and mapped
 * (cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)). */
MP_API mp_status_t mp_device_host_alloc(mp_device_t *dev, size_t bytes,
                                        void **out);
/* Synchronizes the device first, as mp_device_free (cuMemFreeHost promises
 * no wait). A pointer that mp_device_host_alloc did not return is
 * MP_EINVAL. */
MP_API mp_status_t mp_device_host_free(mp_device_t *dev, void *ptr);
/* Waits for all work on every stream of the device. */
MP_API mp_status_t mp_device_synchronize(mp_device_t *dev);

MP_API mp_status_t mp_stream_create(mp_device_t *dev, mp_stream_t *out);
/* Destroys the stream. It returns at once, on the host device as on CUDA
 * (cuStreamDestroy): work already queued on s still runs afterwards, and
 * mp_device_synchronize (and mp_device_close) waits for it, so what that
 * work reads or writes must outlive it, not just the call. Every pool on
 * the device forgets the handle around the destroy (as mp_stream_forget
 * says): a call naming s before the driver answers leaves nothing matched
 * to the dead handle, and a destroy the driver refuses leaves s known to
 * the pools as it was. A stream being captured into a graph is MP_EBUSY:
 * end the capture first. */
MP_API mp_status_t mp_stream_destroy(mp_device_t *dev, mp_stream_t s);
/* Tells the pools on dev that the application is about to destroy s, a
 * stream mempool did not create (the LD_PRELOAD shim calls it from its
 * cuStreamDestroy / cudaStreamDestroy hooks); call it while s is still
 * valid. Each pool closes what s still owes with a marker event and stops
 * matching the handle, so that a new stream given the same handle is a new
 * stream to the pool; blocks freed on s stay unusable by others until the
 * work queued on s before this call has completed. The pool's slot for s
 * is reused once that is so and no live block names s. NULL and unknown
 * handles: MP_OK, nothing to do. */
MP_API mp_status_t mp_stream_forget(mp_device_t *dev, mp_stream_t s);
MP_API mp_status_t mp_stream_synchronize(mp_device_t *dev, mp_stream_t s);
/* MP_OK when all work queued on s so far has completed, MP_EBUSY when some
 * has not (cuStreamQuery); never waits. */
MP_API mp_status_t mp_stream_query(mp_device_t *dev, mp_stream_t s);
/* Run fn(arg) on the host once all earlier work on s is done
 * (cuLaunchHostFunc). fn must not call into any device (cuda.h: "must not
 * make any CUDA API calls"); on the host device every device call from fn
 * (allocations, frees, streams, copies, memsets, events, synchronizes) is
 * MP_EINVAL and changes nothing. */
MP_API mp_status_t mp_stream_launch_host(mp_device_t *dev, mp_stream_t s,
                                         void (*fn)(void *), void *arg);
/* Copies n bytes from src to dst in s's order (cuMemcpyAsync: the
 * direction is told from the pointers, unified addressing). Either side
 * may be device memory (an allocation, a virtual memory mapping,
 * page-locked host memory, an IPC import; the whole range inside one) or
 * ordinary host memory; overlapping ranges are MP_EINVAL ("The memory
 * areas may not overlap", cudaMemcpyAsync). The host device refuses at the
 * call (MP_EINVAL, nothing queued) a range that reaches past the device
 * memory it starts in, or is neither device memory nor mapped host memory
 * (a freed or made-up pointer), where a GPU's copy would fault. */
MP_API mp_status_t mp_memcpy_async(mp_device_t *dev, void *dst, const void *src,
                                   size_t n, mp_stream_t s);
/* Sets n bytes at dst to (unsigned char)value in s's order
 * (cuMemsetD8Async): dst must be device memory, the whole range inside one
 * piece of it, else MP_EINVAL and nothing queued. */
MP_API mp_status_t mp_memset_async(mp_device_t *dev, void *dst, int value,
                                   size_t n, mp_stream_t s);

/* The event calls below take events made by mp_event_create on dev and
 * not destroyed yet; any other handle is MP_EINVAL. */
MP_API mp_status_t mp_event_create(mp_device_t *dev, mp_event_t *out);
MP_API mp_status_t mp_event_destroy(mp_device_t *dev, mp_event_t e);
MP_API mp_status_t mp_event_record(mp_device_t *dev, mp_event_t e,
                                   mp_stream_t s);
/* MP_OK when done (or never recorded), MP_EBUSY when not. */
MP_API mp_status_t mp_event_query(mp_device_t *dev, mp_event_t e);
MP_API mp_status_t mp_event_synchronize(mp_device_t *dev, mp_event_t e);
/* Work queued on s afterwards waits until e has completed. */
MP_API mp_status_t mp_stream_wait_event(mp_device_t *dev, mp_stream_t s,
                                        mp_event_t e);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_DEVICE_H */
