/* mempool/torch.h - entry points for PyTorch's pluggable CUDA allocator.
 *
 * PyTorch loads the first two by name from libmempool.so and sends every
 * tensor allocation to mempool's default pool of the tensor's device
 * (mp_default_pool's per-device pools, made from $MEMPOOL_DEVICE and
 * $MEMPOOL_CONF on first use):
 *
 *   import torch
 *   a = torch.cuda.memory.CUDAPluggableAllocator(
 *       "/path/to/libmempool.so", "mp_torch_malloc", "mp_torch_free")
 *   torch.cuda.memory.change_current_allocator(a)
 *
 * The rest are what CUDAPluggableAllocator's C++ setters take
 * (torch/csrc/cuda/CUDAPluggableAllocator.h): set_init_fn, set_reset_fn
 * (torch.cuda.empty_cache), set_memory_fraction_fn, set_base_alloc_fn and
 * set_record_stream_fn take these functions as they are; the graph-capture
 * setters (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
 * set_release_pool) take C++ callables, which mempool/torch_hooks.hpp
 * makes from the C functions below. Without them (Python can set only
 * malloc and free) a capture still works: allocations on a stream that
 * the device reports capturing come from a graph pool of that capture,
 * released at the first mp_torch_reset after the graph and every
 * executable made from it are destroyed (the driver tells, through a user
 * object the graph holds; where it cannot, the pool stays pinned for the
 * life of the process, as a replay may still use it).
 *
 * The signatures are PyTorch's with mp_stream_t in place of cudaStream_t:
 * both are pointers to an opaque struct, passed the same way, so this
 * header needs no CUDA header. A device the backend does not have (the
 * emulated host device answers to 0 only), a negative or zero size, or a
 * failure returns NULL; mp_last_error() says why. PyTorch's
 * CUDAPluggableAllocator does not check that pointer: set from Python, a
 * failed allocation becomes a tensor at address 0 (its first kernel
 * faults); mempool/torch_hooks.hpp's malloc throws instead (std::bad_alloc,
 * which leaves PyTorch's allocate as an error) for any size above 0. The void
 * calls report failures through mp_last_error() only. mp_torch_free of NULL
 * (an empty tensor's storage, as mp_torch_malloc of 0 bytes gives) does
 * nothing; of a pointer no pool handed out, nothing but set
 * mp_last_error(). */
#ifndef MEMPOOL_TORCH_H
#define MEMPOOL_TORCH_H

#include <sys/types.h>

#include <mempool/device.h>
#include <mempool/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates size bytes for use on stream, which PyTorch passes as the
 * tensor's current stream. */
MP_API void *mp_torch_malloc(ssize_t size, int device, mp_stream_t stream);
/* Frees ptr, ordered after the work queued so far on stream (the block's
 * own stream and, when they differ, stream too). size is ignored: the pool
 * knows each block's size. A stream the block's device no longer has
 * (PyTorch passes the allocation's stream; destroyed since) cannot take
 * the free: the block is freed on its own stream all the same, and
 * mp_last_error() says why the stream was not used (refused, the block was
 * lost for good). The hooks know a stream is gone where its device tells
 * (the host device) or where it was forgotten: mp_stream_destroy,
 * mp_stream_forget, and the LD_PRELOAD shim's cuStreamDestroy and
 * cudaStreamDestroy hooks; such a handle is never passed to the driver
 * (on CUDA that is undefined behaviour) until mp_torch_malloc is given it
 * again (a new stream may get the handle). A stream the program destroys
 * on CUDA with none of these is unknown here, and a free naming it is
 * undefined behaviour, as any use of a destroyed handle.
 * While the pool is paused (mp_pool_pause, which refuses frees), the free
 * is kept and made at the first hook called after the resume (malloc,
 * free, or reset), the block live until then; a second free of it while
 * paused is refused. mp_last_error() says which. */
MP_API void mp_torch_free(void *ptr, ssize_t size, int device,
                          mp_stream_t stream);

/* set_init_fn: makes the default pool (PyTorch calls it once with the
 * device count). */
MP_API void mp_torch_init(int device_count);
/* set_reset_fn (torch.cuda.empty_cache): gives every default pool's idle
 * memory back to the device (mp_pool_trim to 0), and releases the graph
 * pools of captures seen without the capture hooks whose graphs are
 * destroyed (never the memory of a graph that may still be replayed). */
MP_API void mp_torch_reset(void);
/* set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction):
 * mp_pool_set_max_fraction on device's pool for a fraction in (0, 1]. A
 * fraction of 0 allows 0 bytes, as PyTorch's own allocator (fraction x
 * the device's memory), not the pool's "no cap"; so does one whose share
 * is under the pool's alignment (a cap no block fits, which PyTorch takes
 * and the pool refuses): from then until a larger fraction is set,
 * mp_torch_malloc on device fails (MP_ELIMIT), blocks the pool has cached
 * included (PyTorch's own still hands out what it has cached); the pool's own
 * cap, and its callers other than the torch hooks (mp_malloc), are left as they
 * were. PyTorch's hook returns nothing, so a refusal (a device no pool serves,
 * a fraction outside [0, 1], a paused pool for a fraction whose share holds a
 * block; one that allows nothing is taken while paused too), which changes
 * nothing, is in mp_last_error() only; mp_torch_memory_fraction_ex returns it
 * (mempool.torch raises it). */
MP_API void mp_torch_memory_fraction(double fraction, int device);
MP_API mp_status_t mp_torch_memory_fraction_ex(double fraction, int device);
/* set_base_alloc_fn (PyTorch's getBaseAllocation, which sharing a tensor
 * with another process exports with cudaIpcGetMemHandle): the device
 * allocation a tensor's storage lies in, its start returned and its size
 * in *size: for memory of a plain segment (virtual=0) that segment, as
 * PyTorch's own allocator answers; in the virtual range (no allocation
 * there that cudaIpcGetMemHandle takes, as PyTorch's expandable segments)
 * the live block holding ptr. ptr itself and *size unchanged when no live
 * block of a pool holds it. */
MP_API void *mp_torch_base_alloc(void *ptr, size_t *size);
/* set_record_stream_fn (tensor.record_stream): mp_pool_record_stream.
 * ptr is the block's start, as PyTorch passes its storage's pointer (a
 * view's data pointer inside the block is refused); NULL (an empty
 * tensor's storage) records nothing, as PyTorch's own. _ex returns the
 * status the void hook drops. */
MP_API void mp_torch_record_stream(void *ptr, mp_stream_t stream);
MP_API mp_status_t mp_torch_record_stream_ex(void *ptr, mp_stream_t stream);

/* PyTorch's MempoolId_t (std::pair<unsigned long long, unsigned long long>)
 * as two numbers; a graph's capture and graphs sharing a pool (pool=) name
 * the same id. */
typedef struct mp_torch_pool_id {
  unsigned long long first, second;
} mp_torch_pool_id_t;
/* The capture's stream test (PyTorch's std::function<bool(cudaStream_t)>):
 * nonzero when an allocation on stream belongs to the capture. It runs
 * under a lock of mempool's: it must not call mempool, and no C++
 * exception may leave it (mempool/torch_hooks.hpp catches PyTorch's). */
typedef int (*mp_torch_stream_filter_t)(mp_stream_t stream, void *ctx);

/* set_begin_allocate_to_pool: from now until the matching end,
 * allocations (and frees) on device whose stream filter accepts come from
 * the graph pool of id (made at its first begin; each begin is one use of
 * it), at addresses that stay while the pool lives; its snapshot
 * (mp_pool_graph_of, mp_pool_snapshot) names its segments' segment_pool_id
 * by id, as PyTorch's does. An id released (its last release_pool) and
 * begun again names a new pool. drop(ctx), if not NULL, is called when the
 * filter is no longer needed (at the end, or at once when the call
 * fails); like the filter, it may run under a lock of mempool's and must
 * not call mempool. A refused begin (filter NULL: MP_EINVAL; id being
 * allocated to already: MP_EBUSY; no host memory for the pool:
 * MP_ENOMEM) routes nothing: the capture's allocations would come from
 * the device's pool, and what it frees would go to others while replays
 * use it. _ex returns the status the void hook drops;
 * mempool/torch_hooks.hpp throws on it, as PyTorch's own beginAllocateToPool
 * does, so that the capture is not begun. */
MP_API void mp_torch_begin_allocate_to_pool(int device, mp_torch_pool_id_t id,
                                            mp_torch_stream_filter_t filter,
                                            void *ctx, void (*drop)(void *));
MP_API mp_status_t mp_torch_begin_allocate_to_pool_ex(
    int device, mp_torch_pool_id_t id, mp_torch_stream_filter_t filter,
    void *ctx, void (*drop)(void *));
/* set_end_allocate_to_pool_fn: the capture is about to end; its streams
 * allocate from the device's pool again. */
MP_API void mp_torch_end_allocate_to_pool(int device, mp_torch_pool_id_t id);
/* set_release_pool: one use of id ends (a graph reset or destroyed); at the
 * last, the graph pool is released (mp_pool_graph_release): its memory
 * returns to the device's pool once its live blocks are freed. While a
 * capture into id is open (begun, not ended), it keeps allocating to the
 * pool, as under PyTorch's releasePool, and the release is done at its
 * end_allocate_to_pool. */
MP_API void mp_torch_release_pool(int device, mp_torch_pool_id_t id);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_TORCH_H */
