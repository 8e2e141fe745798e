/* mp_torch_malloc on a stream being captured routes it to a graph pool of
 * the capture's own (torch.c) and asks the device to tell when the graph
 * goes (capture_on_release: a user object the graph holds, cuda.h,
 * cuUserObjectCreate). Where the device refuses, the graph pool simply
 * stays pinned until mp_torch_reset and the allocation succeeds: a success
 * does not replace the caller's last error (status.h). The refusal was
 * recorded as the last error, so the malloc that succeeded reported it.
 * The refusal is the fake's: no GPU twin. */
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "capture_beside.h"
#pragma GCC diagnostic pop

#define MiB ((size_t)1 << 20)

static void on_cuda(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
}

TestSuite(cuda_torch_capture_watch_refused, .init = on_cuda);

Test(cuda_torch_capture_watch_refused, the_malloc_keeps_the_last_error) {
  if (fk_is_real())
    cr_skip_test("the refusal is the fake driver's");
  capture_load();
  /* The default pool made before the capture. */
  void *warm = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, NULL);
  CUstream s = capture_begin_here();
  mp_stream_t ms = (mp_stream_t)s;
  /* The caller's last error: a refused call of its own. */
  cr_assert_null(mp_torch_malloc(-1, 0, ms));
  cr_assert_eq(mp_last_status(), MP_EINVAL);
  char before[512];
  snprintf(before, sizeof before, "%s", mp_last_error());
  long long asked = fk_calls("cuUserObjectCreate");
  fk_refuse("cuUserObjectCreate", CUDA_ERROR_OUT_OF_MEMORY, 1);
  void *p = mp_torch_malloc(MiB, 0, ms);
  fk_refuse("cuUserObjectCreate", CUDA_SUCCESS, 0);
  mp_status_t st = mp_last_status();
  char after[512];
  snprintf(after, sizeof after, "%s", mp_last_error());
  cr_assert_not_null(p, "%s", after);
  cr_expect_eq(fk_calls("cuUserObjectCreate"), asked + 1,
               "the device was not asked");
  cr_expect_eq(st, MP_EINVAL, "the malloc that succeeded reported %s: %s",
               mp_status_name(st), after);
  cr_expect_str_eq(after, before);
  cr_expect_eq(mp_pool_graph_of(mp_default_pool(), ms) != NULL, true,
               "not routed to the capture's graph pool");
  mp_torch_free(p, MiB, 0, ms);
  CUgraph g = NULL;
  cr_expect_eq(capcu.end(s, &g), CUDA_SUCCESS, "the capture was invalidated");
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  /* The graph pool stays pinned: nothing tells when its graph went. */
  mp_torch_reset();
  cr_assert_eq(mp_stream_forget(mp_pool_device(mp_default_pool()), ms), MP_OK);
  cr_assert_eq(capcu.destroy(s), CUDA_SUCCESS);
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}
