/* The fake driver itself, as the cuda backend and the LD_PRELOAD shim see
 * it: entry points found by base name and version through cuGetProcAddress
 * (the _v2 ABIs, the per-thread-stream twins), nothing of mempool exported,
 * contexts required, and calls counted. */
#include <dlfcn.h>
#include <string.h>

#include <cuda.h>

#include "fakecuda_test.h"

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, cuuint64_t,
                                  CUdriverProcAddressQueryResult *);

static void *lookup(const char *name, int version, cuuint64_t flags,
                    CUdriverProcAddressQueryResult *status) {
  get_proc_v2_t get;
  FK_LOAD(get, "cuGetProcAddress_v2");
  void *fn = (void *)&fn;
  cr_assert_eq(get(name, &fn, version, flags, status), CUDA_SUCCESS, "%s",
               name);
  return fn;
}

Test(fakecuda, base_names_resolve_to_versioned_abis) {
  CUdriverProcAddressQueryResult st;
  cr_assert_eq(lookup("cuMemAlloc", 12000, 0, &st),
               fk_test_sym("cuMemAlloc_v2"));
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
  cr_assert_eq(lookup("cuMemGetInfo", 3020, 0, NULL),
               fk_test_sym("cuMemGetInfo_v2"));
  cr_assert_eq(lookup("cuStreamDestroy", 12000, 0, NULL),
               fk_test_sym("cuStreamDestroy_v2"));
  cr_assert_eq(lookup("cuDevicePrimaryCtxRelease", 11000, 0, NULL),
               fk_test_sym("cuDevicePrimaryCtxRelease_v2"));
  cr_assert_eq(lookup("cuGetProcAddress", 12000, 0, NULL),
               fk_test_sym("cuGetProcAddress_v2"));
  cr_assert_eq(lookup("cuGetProcAddress", 11030, 0, NULL),
               fk_test_sym("cuGetProcAddress"));
  /* cudaTypedefs.h: PFN_cuGraphInstantiate_v10000 and _v11000 (an error
   * node and a log), then the flags form, cuda.h's name since 12.0. */
  cr_assert_eq(lookup("cuGraphInstantiate", 12000, 0, NULL),
               fk_test_sym("cuGraphInstantiateWithFlags"));
  cr_assert_eq(lookup("cuGraphInstantiate", 11000, 0, NULL),
               fk_test_sym("cuGraphInstantiate_v2"));
  cr_assert_eq(lookup("cuGraphInstantiate", 10000, 0, NULL),
               fk_test_sym("cuGraphInstantiate"));
}

Test(fakecuda, too_old_a_version_or_unknown_name_gives_null) {
  CUdriverProcAddressQueryResult st;
  cr_assert_null(lookup("cuMemAlloc", 3000, 0, &st));
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  cr_assert_null(lookup("cuNoSuchThing", 12000, 0, &st));
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  /* The real driver wants base names, not the exported _v2 ones. */
  cr_assert_null(lookup("cuMemAlloc_v2", 12000, 0, &st));
}

Test(fakecuda, per_thread_flag_picks_ptsz_twins) {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  cr_assert_eq(lookup("cuMemAllocAsync", 12000, pt, NULL),
               fk_test_sym("cuMemAllocAsync_ptsz"));
  cr_assert_eq(lookup("cuMemAllocAsync", 12000, 0, NULL),
               fk_test_sym("cuMemAllocAsync"));
  cr_assert_eq(lookup("cuMemFreeAsync", 12000, pt, NULL),
               fk_test_sym("cuMemFreeAsync_ptsz"));
  cr_assert_eq(lookup("cuMemcpy", 12000, pt, NULL),
               fk_test_sym("cuMemcpy_ptds"));
  /* No twin: the legacy function. */
  cr_assert_eq(lookup("cuMemAlloc", 12000, pt, NULL),
               fk_test_sym("cuMemAlloc_v2"));
}

Test(fakecuda, version_newer_than_the_driver_is_invalid) {
  setenv("FAKECUDA_DRIVER_VERSION", "12040", 1);
  get_proc_v2_t get;
  FK_LOAD(get, "cuGetProcAddress_v2");
  void *fn = NULL;
  cr_assert_eq(get("cuMemAlloc", &fn, 12050, 0, NULL),
               CUDA_ERROR_INVALID_VALUE);
  int (*version)(int *);
  FK_LOAD(version, "cuDriverGetVersion");
  int v = 0;
  cr_assert_eq(version(&v), CUDA_SUCCESS);
  cr_assert_eq(v, 12040);
}

Test(fakecuda, exports_nothing_of_mempool) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  cr_assert_null(dlsym(h, "mp_device_open"));
  cr_assert_null(dlsym(h, "mp_pool_create"));
  cr_assert_null(dlsym(h, "mp__fail"));
  dlclose(h);
}

Test(fakecuda, calls_need_init_and_a_current_context) {
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*release)(CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*mfree)(CUdeviceptr);
  CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
  FK_LOAD(alloc, "cuMemAlloc_v2");
  FK_LOAD(init, "cuInit");
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(set, "cuCtxSetCurrent");
  FK_LOAD(mfree, "cuMemFree_v2");
  FK_LOAD(range, "cuMemGetAddressRange_v2");

  CUdeviceptr p = 0;
  cr_assert_eq(alloc(&p, 4096), CUDA_ERROR_NOT_INITIALIZED);
  cr_assert_eq(init(0), CUDA_SUCCESS);
  cr_assert_eq(alloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext ctx = NULL;
  cr_assert_eq(retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(set(ctx), CUDA_SUCCESS);
  cr_assert_eq(alloc(&p, 4096), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  cr_assert_eq(range(&base, &size, p + 100), CUDA_SUCCESS);
  cr_assert_eq(base, p);
  cr_assert_eq(size, 4096);
  cr_assert_eq(mfree(p + 1), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(mfree(p), CUDA_SUCCESS);
  cr_assert_eq(mfree(p), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(fk_calls("cuMemAlloc_v2"), 3);
  cr_assert_eq(fk_calls("cuMemFree_v2"), 3);
  fk_reset_calls();
  cr_assert_eq(fk_calls("cuMemAlloc_v2"), 0);
  cr_assert_eq(set(NULL), CUDA_SUCCESS);
  cr_assert_eq(release(0), CUDA_SUCCESS);
}

Test(fakecuda, error_names_and_strings) {
  CUresult (*name)(CUresult, const char **);
  CUresult (*str)(CUresult, const char **);
  FK_LOAD(name, "cuGetErrorName");
  FK_LOAD(str, "cuGetErrorString");
  const char *out = NULL;
  cr_assert_eq(name(CUDA_ERROR_OUT_OF_MEMORY, &out), CUDA_SUCCESS);
  cr_assert_str_eq(out, "CUDA_ERROR_OUT_OF_MEMORY");
  cr_assert_eq(str(CUDA_ERROR_OUT_OF_MEMORY, &out), CUDA_SUCCESS);
  cr_assert_str_eq(out, "out of memory");
  cr_assert_eq(name((CUresult)123456, &out), CUDA_ERROR_INVALID_VALUE);
  cr_assert_null(out);
}
