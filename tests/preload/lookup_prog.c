/* lookup_prog.c - checks, from inside a program, what dlsym answers.
 *
 *   lookup_prog [preloaded]
 * Always: dlsym(RTLD_NEXT) made by a library finds the next definition
 * after that library, the same on every call. With "preloaded" (run under
 * libmempool_preload.so): the runtime's allocation entry points resolve to
 * the shim through RTLD_DEFAULT, RTLD_NEXT and the runtime's own handle;
 * its other entry points stay the runtime's; a handle without a hooked
 * name still lacks it. Prints "ok" and exits 0, or names the first failed
 * check and exits 1. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "prog_check.h"

int probe_a_next(void);
int probe_b_id(void);

int main(int argc, char **argv) {
  int preloaded = argc > 1 && strcmp(argv[1], "preloaded") == 0;
  expect(probe_b_id() == 'B', "probe_b linked");
  for (int i = 0; i < 3; i++)
    expect(probe_a_next() == 'b', "RTLD_NEXT from probe_a finds probe_b");

  Dl_info rt;
  expect(dladdr((void *)&cudaGetErrorName, &rt) != 0, "dladdr of runtime");
  void *cudart = dlopen(rt.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  expect(cudart != NULL && libc != NULL, "handles of runtime and libc");

  void *memcpy_rt = dlsym(cudart, "cudaMemcpy");
  expect(memcpy_rt != NULL && strstr(owner(memcpy_rt), "libcudart") != NULL,
         "cudaMemcpy stays the runtime's");
  expect(dlsym(libc, "cuMemAlloc_v2") == NULL, "libc has no cuMemAlloc_v2");
  expect(dlsym(cudart, "no_such_symbol_anywhere") == NULL,
         "an unknown name stays unknown");
  const char *hooked[] = {"cudaMalloc", "cudaFree", "cudaMallocAsync",
                          "cudaFreeAsync", "cudaMemGetInfo"};
  for (size_t i = 0; i < sizeof hooked / sizeof *hooked; i++) {
    void *by_default = dlsym(RTLD_DEFAULT, hooked[i]);
    void *by_handle = dlsym(cudart, hooked[i]);
    void *by_next = dlsym(RTLD_NEXT, hooked[i]);
    if (preloaded) {
      expect(in_shim(by_default), hooked[i]);
      expect(in_shim(by_handle), hooked[i]);
      expect(in_shim(by_next), hooked[i]);
      expect(by_handle == by_default && by_next == by_default, hooked[i]);
    } else {
      expect(strstr(owner(by_handle), "libcudart") != NULL, hooked[i]);
    }
  }
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}
