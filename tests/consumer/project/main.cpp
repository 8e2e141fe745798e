// A C++ program outside the tree that includes every installed header (the
// test's check.sh fails when a header is missing from this list) and uses the
// library through them: the C API from C++ (extern "C" linkage) and
// mempool/torch_hooks.hpp's adapters.
#include <mempool/allocator.h>
#include <mempool/device.h>
#include <mempool/direct.h>
#include <mempool/host_pool.h>
#include <mempool/mempool.h>
#include <mempool/pool.h>
#include <mempool/stats.h>
#include <mempool/status.h>
#include <mempool/torch.h>
#include <mempool/torch_hooks.hpp>

#include <cstdio>
#include <functional>

int main() {
  // The signatures PyTorch's CUDAPluggableAllocator takes.
  std::function<void *(std::size_t, int, mempool::torch_hooks::stream_t)> m =
      mempool::torch_hooks::malloc;
  std::function<void(void *, std::size_t, int, mempool::torch_hooks::stream_t)>
      f = mempool::torch_hooks::free;
  if (!m || !f)
    return 1;
  mp_device_t *dev = nullptr;
  mp_status_t st = mp_device_open("host:capacity=64M", &dev);
  if (st != MP_OK) {
    std::fprintf(stderr, "open: %s: %s\n", mp_status_name(st), mp_last_error());
    return 1;
  }
  mp_pool_t *pool = nullptr;
  st = mp_pool_create(dev, nullptr, &pool);
  void *p = nullptr;
  if (st == MP_OK)
    st = mp_pool_alloc(pool, 4096, nullptr, &p);
  if (st == MP_OK)
    st = mp_pool_free(pool, p);
  if (pool != nullptr && st == MP_OK)
    st = mp_pool_destroy(pool);
  mp_device_close(dev);
  if (st != MP_OK) {
    std::fprintf(stderr, "consumer_cxx: %s: %s\n", mp_status_name(st),
                 mp_last_error());
    return 1;
  }
  std::printf("consumer_cxx: ok\n");
  return 0;
}
