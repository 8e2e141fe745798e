// test_torch_hooks_adapter.cpp - mempool/torch_hooks.hpp from C++: install()
// sets every hook on an allocator whose setters take exactly the
// std::function types of torch::cuda::CUDAPluggableAllocator (a stand-in:
// no torch here), and a graph capture driven through those std::functions,
// as CUDAGraph::capture_begin/capture_end/reset drive them, gets a private
// pool, on the emulated device.
#include <criterion/criterion.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include <mempool/mempool.h>
#include <mempool/torch_hooks.hpp>

namespace {

using cudaStream_t = CUstream_st *;
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;

// The setters' parameter types, as PyTorch declares them.
struct PluggableStandIn {
  std::function<void(int)> init;
  std::function<void()> reset;
  std::function<void(double, int)> fraction;
  std::function<void *(void *, size_t *)> base_alloc;
  std::function<void(void *, cudaStream_t)> record_stream;
  std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>
      begin;
  std::function<void(int, MempoolId_t)> end, release;

  void set_init_fn(std::function<void(int)> f) {
    init = std::move(f);
  }
  void set_reset_fn(std::function<void()> f) {
    reset = std::move(f);
  }
  void set_memory_fraction_fn(std::function<void(double, int)> f) {
    fraction = std::move(f);
  }
  void set_base_alloc_fn(std::function<void *(void *, size_t *)> f) {
    base_alloc = std::move(f);
  }
  void set_record_stream_fn(std::function<void(void *, cudaStream_t)> f) {
    record_stream = std::move(f);
  }
  void set_begin_allocate_to_pool(
      std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>
          f) {
    begin = std::move(f);
  }
  void set_end_allocate_to_pool_fn(std::function<void(int, MempoolId_t)> f) {
    end = std::move(f);
  }
  void set_release_pool(std::function<void(int, MempoolId_t)> f) {
    release = std::move(f);
  }
};

std::function<void *(size_t, int, cudaStream_t)> alloc_fn =
    mempool::torch_hooks::malloc;
std::function<void(void *, size_t, int, cudaStream_t)> free_fn =
    mempool::torch_hooks::free;

void on_host() {
  setenv("MEMPOOL_DEVICE", "host", 1);
}

} // namespace

Test(torch_hooks_adapter, install_sets_every_hook, .init = on_host) {
  PluggableStandIn a;
  mempool::torch_hooks::install(a);
  cr_assert(a.init && a.reset && a.fraction && a.base_alloc &&
            a.record_stream && a.begin && a.end && a.release);
  a.init(1);
  void *p = alloc_fn(4096, 0, nullptr);
  cr_assert_not_null(p, "%s", mp_last_error());
  size_t size = 0;
  cr_expect_eq(a.base_alloc(static_cast<char *>(p) + 8, &size), p);
  cr_expect_geq(size, 4096u);
  free_fn(p, 4096, 0, nullptr);
  a.reset();
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.reserved_bytes, 0u, "reset gave the cache back");
}

Test(torch_hooks_adapter, a_capture_through_the_std_functions_gets_a_pool,
     .init = on_host) {
  PluggableStandIn a;
  mempool::torch_hooks::install(a);
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  mp_stream_t ms;
  cr_assert_eq(mp_stream_create(dev, &ms), MP_OK);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(ms);
  MempoolId_t id{0, 1};
  int asked = 0;
  a.begin(0, id, [s, &asked](cudaStream_t x) {
    asked++;
    return x == s;
  });
  void *p = alloc_fn(1 << 20, 0, s);
  cr_assert_not_null(p);
  cr_expect_gt(asked, 0, "PyTorch's filter was asked");
  cr_expect_not_null(mp_pool_graph_of(mp_default_pool(), ms));
  free_fn(p, 1 << 20, 0, s);
  a.end(0, id);
  cr_expect_null(mp_pool_graph_of(mp_default_pool(), ms));
  void *q = alloc_fn(1 << 20, 0, s);
  cr_expect_neq(q, p, "the private pool's memory stays the graph's");
  free_fn(q, 1 << 20, 0, s);
  a.release(0, id);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.allocated_bytes, 0u, "released back to the pool");
  mp_stream_destroy(dev, ms);
}

// PyTorch's filter asks the driver about the stream and throws where it
// cannot tell (AT_CUDA_CHECK of cudaStreamGetCaptureInfo: the legacy
// stream while a blocking stream captures). The exception crossed
// mempool's C code, which held its capture lock around the filter, so the
// lock was never dropped and the next capture call hung. Such a stream is
// now taken for one the capture does not own.
Test(torch_hooks_adapter, a_filter_that_throws_leaves_mempool_usable,
     .init = on_host) {
  PluggableStandIn a;
  mempool::torch_hooks::install(a);
  MempoolId_t id{0, 2};
  a.begin(0, id, [](cudaStream_t) -> bool {
    throw std::runtime_error("cudaErrorStreamCaptureImplicit");
  });
  bool threw = false;
  void *p = nullptr;
  try {
    p = alloc_fn(4096, 0, nullptr);
  } catch (...) {
    threw = true;
  }
  cr_assert(!threw, "the filter's exception crossed mempool's C code");
  cr_expect_not_null(p, "%s", mp_last_error());
  free_fn(p, 4096, 0, nullptr);
  a.end(0, id);
  a.release(0, id);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.allocated_bytes, 0u);
}

// PyTorch's CUDAPluggableAllocator::malloc keeps whatever the hook returns
// and hands it out as the tensor's memory: it never checks for NULL. A
// failed allocation (the pool's cap, the device full) came back as a
// tensor at address 0, and its first kernel faulted, taking the CUDA
// context with it, where PyTorch's own allocator raises an out-of-memory
// error. The adapter now throws (std::bad_alloc, mempool's message as
// what()); an empty tensor's size 0 is still NULL, without a throw.
Test(torch_hooks_adapter, a_failed_malloc_throws_instead_of_returning_null,
     .init = on_host) {
  setenv("MEMPOOL_CONF", "max_bytes=8M", 1);
  bool threw = false;
  void *p = nullptr;
  try {
    p = alloc_fn(size_t(64) << 20, 0, nullptr);
  } catch (const std::bad_alloc &e) {
    threw = true;
    cr_expect(std::strstr(e.what(), "max_bytes") != nullptr, "what(): %s",
              e.what());
  }
  cr_expect(threw, "a failed allocation returned %p to PyTorch", p);
  threw = false;
  try {
    p = alloc_fn(0, 0, nullptr);
  } catch (...) {
    threw = true;
  }
  cr_expect(!threw, "an empty tensor's allocation threw");
  cr_expect_null(p);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.allocated_bytes, 0u);
}

// A begin mempool refuses (here: the id is being allocated to already, a
// second capture into it before the first's end) throws, as PyTorch's own
// beginAllocateToPool does, so that CUDAGraph::capture_begin stops before
// the capture begins. The void hook dropped the refusal: the capture then
// allocated from the device's pool, whose memory others got once the
// capture freed it while replays still used it.
Test(torch_hooks_adapter, a_refused_begin_throws, .init = on_host) {
  PluggableStandIn a;
  mempool::torch_hooks::install(a);
  MempoolId_t id{0, 3};
  a.begin(0, id, [](cudaStream_t) { return false; });
  bool threw = false;
  try {
    a.begin(0, id, [](cudaStream_t) { return false; });
  } catch (const mempool::torch_hooks::refused &e) {
    threw = true;
    cr_expect(std::strstr(e.what(), "being allocated to") != nullptr,
              "what(): %s", e.what());
  }
  cr_expect(threw, "a refused begin returned as if the pool were routed");
  a.end(0, id);
  a.release(0, id);
}

// A size past SSIZE_MAX (what mp_torch_malloc's ssize_t holds) was cast to
// a negative ssize_t, and what() said "size -9223372036854775808 is not
// positive": neither the size PyTorch asked nor why it was too much. It now
// names both, and nothing is allocated.
Test(torch_hooks_adapter, a_size_past_ssize_max_names_the_size_and_the_limit,
     .init = on_host) {
  const size_t asked[] = {size_t(SSIZE_MAX) + 1, SIZE_MAX};
  for (size_t size : asked) {
    std::string what;
    try {
      (void)alloc_fn(size, 0, nullptr);
    } catch (const std::bad_alloc &e) {
      what = e.what();
    }
    // After a space: "-9223372036854775808" holds SSIZE_MAX + 1's digits.
    std::string want_size = " " + std::to_string(size);
    std::string want_limit = std::to_string(SSIZE_MAX);
    cr_expect(what.find(want_size) != std::string::npos,
              "what() does not name the size%s: %s", want_size.c_str(),
              what.c_str());
    cr_expect(what.find(want_limit) != std::string::npos,
              "what() does not name the limit %zd: %s", ssize_t(SSIZE_MAX),
              what.c_str());
  }
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &st), MP_OK);
  cr_expect_eq(st.allocated_bytes, 0u);
}
