/* reset_prog.c - a driver-API program that resets the device's primary
 * context (cuDevicePrimaryCtxReset, what cudaDeviceReset does) while it
 * holds device memory, linked with the fake libcuda.so.1 (tests/fakecuda),
 * run with or without the shim (and on a GPU by tests/preload/gpu).
 *
 * cuda.h, cuDevicePrimaryCtxReset: "Destroy all allocations and reset all
 * state on the primary context." So a block allocated before the reset is
 * no longer the program's: cuMemFree of it is refused, as for any pointer
 * the driver does not know; and what the program allocates after it (in
 * the primary context retained again) is memory that holds what is
 * written to it, never the destroyed memory of before.
 * With the argument "proc" the reset is the one cuGetProcAddress answers
 * for "cuDevicePrimaryCtxReset" at CUDA 11.0, as cudaDeviceReset finds it.
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "prog_try.h"

#define MP_BYTES (1u << 20)

static int start(CUcontext *ctx) {
  MP_TRY(cuDevicePrimaryCtxRetain(ctx, 0));
  MP_TRY(cuCtxSetCurrent(*ctx));
  return 0;
}

typedef CUresult (*reset_fn)(CUdevice);

int main(int argc, char **argv) {
  static unsigned char seen[MP_BYTES];
  reset_fn reset = cuDevicePrimaryCtxReset;
  CUcontext ctx;
  CUdeviceptr live, cached, after;
  MP_TRY(cuInit(0));
  if (start(&ctx) != 0)
    return 1;
  if (argc > 1 && strcmp(argv[1], "proc") == 0) {
    void *fn = NULL;
    MP_TRY(cuGetProcAddress("cuDevicePrimaryCtxReset", &fn, 11000,
                            CU_GET_PROC_ADDRESS_DEFAULT, NULL));
    reset = (reset_fn)fn;
  }
  MP_TRY(cuMemAlloc(&live, MP_BYTES));
  MP_TRY(cuMemAlloc(&cached, MP_BYTES));
  MP_TRY(cuMemFree(cached)); /* a pool keeps it */
  MP_TRY(reset(0));
  if (start(&ctx) != 0)
    return 1;
  CUresult r = cuMemFree(live);
  if (r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_INVALID_CONTEXT) {
    printf("cuMemFree of a block the reset destroyed: error %d, not "
           "refused\n",
           (int)r);
    return 1;
  }
  for (int i = 0; i < 4; i++) {
    MP_TRY(cuMemAlloc(&after, MP_BYTES));
    MP_TRY(cuMemsetD8(after, (unsigned char)(0x40 + i), MP_BYTES));
    memset(seen, 0, sizeof seen);
    MP_TRY(cuMemcpyDtoH(seen, after, MP_BYTES));
    for (size_t k = 0; k < MP_BYTES; k++)
      if (seen[k] != (unsigned char)(0x40 + i)) {
        printf("byte %zu of an allocation after the reset reads %d\n", k,
               seen[k]);
        return 1;
      }
    CUdeviceptr base = 0;
    size_t size = 0;
    MP_TRY(cuMemGetAddressRange(&base, &size, after));
    MP_TRY(cuMemFree(after));
  }
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}
