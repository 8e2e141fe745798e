/* mempool/torch_hooks.hpp - the C++ side of PyTorch's pluggable allocator:
 * the hooks whose signatures are C++ (std::function, MempoolId_t), made
 * from mempool/torch.h's C functions, and one call that sets every hook on
 * a torch::cuda::CUDAPluggableAllocator. Header-only; needs neither torch
 * nor CUDA headers (the allocator is a template parameter, cudaStream_t is
 * CUstream_st *, as cuda_runtime_api.h defines it):
 *
 *   #include <mempool/torch_hooks.hpp>
 *   #include <torch/csrc/cuda/CUDAPluggableAllocator.h>
 *   namespace tp = torch::cuda::CUDAPluggableAllocator;
 *   auto a = std::static_pointer_cast<tp::CUDAPluggableAllocator>(
 *       tp::createCustomAllocator(mempool::torch_hooks::malloc,
 *                                 mempool::torch_hooks::free));
 *   mempool::torch_hooks::install(*a);   // record_stream, empty_cache,
 *   tp::changeCurrentAllocator(a);       // graph pools, memory fraction
 *
 * The begin adapter keeps PyTorch's filter alive until the matching end. */
#ifndef MEMPOOL_TORCH_HOOKS_HPP
#define MEMPOOL_TORCH_HOOKS_HPP

#include <cstddef>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include <mempool/torch.h>

struct CUstream_st;

namespace mempool {
namespace torch_hooks {

using stream_t = CUstream_st *; /* cudaStream_t */
/* c10::cuda::MempoolId_t */
using mempool_id = std::pair<unsigned long long, unsigned long long>;
using stream_filter = std::function<bool(stream_t)>;

inline mp_stream_t to_mp(stream_t s) {
  return reinterpret_cast<mp_stream_t>(s);
}

/* What malloc throws when no memory is served for a size above 0:
 * PyTorch's CUDAPluggableAllocator does not check the pointer the hook
 * returns (a NULL would be the tensor's memory, and its first kernel
 * faults); an exception leaves PyTorch's allocate as its own allocator's
 * out-of-memory error does (Python: a RuntimeError with this message).
 * what(): mp_last_error(). */
class out_of_memory : public std::bad_alloc {
public:
  explicit out_of_memory(const char *why) : why_(why != nullptr ? why : "") {}
  const char *what() const noexcept override {
    return why_.c_str();
  }

private:
  std::string why_;
};

/* What begin_allocate_to_pool throws when mempool refuses the begin (an id
 * being allocated to already, no host memory): PyTorch's own
 * beginAllocateToPool throws there too (a TORCH_CHECK), before the
 * capture begins; routed nowhere, the capture would take memory that
 * others get once it is freed while replays still use it. what():
 * mp_last_error(). */
class refused : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/* std::function<void*(size_t, int, cudaStream_t)>: NULL only for size 0
 * (an empty tensor), else the memory or out_of_memory. A size past
 * SSIZE_MAX, which mp_torch_malloc's ssize_t cannot hold (cast, it was a
 * negative size), is out_of_memory naming the size and that limit. */
inline void *malloc(std::size_t size, int device, stream_t stream) {
  constexpr ssize_t most = std::numeric_limits<ssize_t>::max();
  if (size > static_cast<std::size_t>(most))
    throw out_of_memory(
        ("mempool::torch_hooks::malloc: " + std::to_string(size) +
         " bytes asked on device " + std::to_string(device) +
         ", past the most mp_torch_malloc takes (SSIZE_MAX, " +
         std::to_string(most) + " bytes)")
            .c_str());
  void *p = mp_torch_malloc(static_cast<ssize_t>(size), device, to_mp(stream));
  if (p == nullptr && size != 0)
    throw out_of_memory(mp_last_error());
  return p;
}
/* std::function<void(void*, size_t, int, cudaStream_t)> */
inline void free(void *ptr, std::size_t size, int device, stream_t stream) {
  mp_torch_free(ptr, static_cast<ssize_t>(size), device, to_mp(stream));
}
/* std::function<void(void*, cudaStream_t)> */
inline void record_stream(void *ptr, stream_t stream) {
  mp_torch_record_stream(ptr, to_mp(stream));
}

/* std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)> */
inline void begin_allocate_to_pool(int device, mempool_id id,
                                   stream_filter filter) {
  auto *kept = new stream_filter(std::move(filter));
  mp_status_t st = mp_torch_begin_allocate_to_pool_ex(
      device, mp_torch_pool_id_t{id.first, id.second},
      // No exception may cross mempool's C code (it holds a lock around
      // the filter): PyTorch's throws where the driver cannot tell a
      // stream's capture (the legacy stream while a blocking stream
      // captures), which is then no stream of this capture.
      [](mp_stream_t s, void *ctx) -> int {
        try {
          return (*static_cast<stream_filter *>(ctx))(
                     reinterpret_cast<stream_t>(s))
                     ? 1
                     : 0;
        } catch (...) {
          return 0;
        }
      },
      kept, [](void *ctx) { delete static_cast<stream_filter *>(ctx); });
  if (st != MP_OK) /* the filter was dropped already */
    throw refused(mp_last_error());
}
/* std::function<void(int, MempoolId_t)> */
inline void end_allocate_to_pool(int device, mempool_id id) {
  mp_torch_end_allocate_to_pool(device,
                                mp_torch_pool_id_t{id.first, id.second});
}
/* std::function<void(int, MempoolId_t)> */
inline void release_pool(int device, mempool_id id) {
  mp_torch_release_pool(device, mp_torch_pool_id_t{id.first, id.second});
}

/* Sets every hook CUDAPluggableAllocator takes besides malloc and free. */
template <class Allocator> void install(Allocator &a) {
  a.set_init_fn(mp_torch_init);
  a.set_reset_fn(mp_torch_reset);
  a.set_memory_fraction_fn(mp_torch_memory_fraction);
  a.set_base_alloc_fn(mp_torch_base_alloc);
  a.set_record_stream_fn(record_stream);
  a.set_begin_allocate_to_pool(begin_allocate_to_pool);
  a.set_end_allocate_to_pool_fn(end_allocate_to_pool);
  a.set_release_pool(release_pool);
}

} // namespace torch_hooks
} // namespace mempool

#endif /* MEMPOOL_TORCH_HOOKS_HPP */
