/* test_cuda_alloc_properties.c - pool memory fits what users do with device
 * memory: on a device that supports them, the physical memory behind a
 * virtual pool is created shareable by POSIX file descriptor (IPC) and
 * GPUDirect-RDMA capable (cuda.h, CUmemAllocationProp); on one that does
 * not (FAKECUDA_NO_SHAREABLE=1, where cuMemCreate refuses such a request),
 * it is plain and the pool still serves. Its GPU twin checks that a real
 * driver accepts what the pool asks for. */
#include <stdlib.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static void last_create(int *types, int *rdma) {
  void (*last)(int *, int *);
  FK_LOAD(last, "cuFakeLastMemCreate");
  last(types, rdma);
}

static void grow_a_pool(void) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

Test(cuda_alloc_properties, shareable_and_rdma_capable_where_supported) {
  grow_a_pool(); /* on a GPU: the driver accepted what the pool asked */
  if (fk_is_real())
    return;
  int types = 0, rdma = 0;
  last_create(&types, &rdma);
  cr_assert(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "handle types %d",
            types);
  cr_assert_eq(rdma, 1);
}

Test(cuda_alloc_properties, plain_where_not_supported) {
  if (fk_is_real())
    cr_skip_test("the fake's knob");
  setenv("FAKECUDA_NO_SHAREABLE", "1", 1);
  grow_a_pool();
  int types = -1, rdma = -1;
  last_create(&types, &rdma);
  cr_assert_eq(types, 0);
  cr_assert_eq(rdma, 0);
}
