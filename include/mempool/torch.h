/* mempool/torch.h - entry points for PyTorch's pluggable CUDA allocator.
 *
 * PyTorch loads these two functions by name from libmempool.so and sends
 * every tensor allocation to mempool's default pool (mp_default_pool, made
 * from $MEMPOOL_DEVICE and $MEMPOOL_CONF on first use):
 *
 *   import torch
 *   a = torch.cuda.memory.CUDAPluggableAllocator(
 *       "/path/to/libmempool.so", "mp_torch_malloc", "mp_torch_free")
 *   torch.cuda.memory.change_current_allocator(a)
 *
 * The signatures are PyTorch's (void *(ssize_t, int, cudaStream_t) and
 * void (void *, ssize_t, int, cudaStream_t)) with mp_stream_t in place of
 * cudaStream_t: both are pointers to an opaque struct, passed the same way,
 * so this header needs no CUDA header.
 *
 * The default pool serves one device (cuda:N, or the emulated host device,
 * which answers to device 0): a request for another device, a negative or
 * zero size, or a failure returns NULL, which PyTorch reports as out of
 * memory; mp_last_error() says why. mp_torch_free of NULL or of a pointer the
 * pool did not hand out does nothing but set mp_last_error(). */
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
 * knows each block's size. */
MP_API void mp_torch_free(void *ptr, ssize_t size, int device,
                          mp_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MEMPOOL_TORCH_H */
