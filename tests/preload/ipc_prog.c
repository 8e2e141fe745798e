/* ipc_prog.c - a driver-API program that shares device memory with another
 * process the way PyTorch's CUDA tensor sharing and vLLM's custom
 * all-reduce do, linked with the fake libcuda.so.1 (tests/fakecuda), run
 * with or without the shim (and on a real driver: tests/preload/gpu).
 *
 *   ipc_prog first|second   allocates two 64 KiB buffers, fills the first
 *                           with 0xAA and the second with 0xBB, and shares
 *                           the one named: its allocation's start from
 *                           cuPointerGetAttribute(RANGE_START_ADDR) (which
 *                           cuMemGetAddressRange must agree with), a
 *                           cuIpcGetMemHandle of that start and the offset
 *                           of the buffer from it. A second process (this
 *                           program again, "open") opens the handle, adds
 *                           the offset and writes 0xCC over the buffer.
 *                           Prints "shared" when the shared buffer holds
 *                           0xCC and the other still 0xBB/0xAA, or
 *                           "refused <error>" when cuIpcGetMemHandle fails
 *                           (both exit 0); "WRONG ..." and exit 1 when the
 *                           importer wrote anywhere else.
 *                           Before asking for the handle it asks, as NCCL
 *                           does, cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_
 *                           CAPABLE) of the range start: "WRONG ..." and
 *                           exit 1 when that answer and cuIpcGetMemHandle's
 *                           disagree.
 *   ipc_prog capable first|second
 *                           prints "capable B I": that attribute of the
 *                           buffer's range start (B) and of an address
 *                           inside the buffer (I), each 0 or 1; "WRONG ..."
 *                           and exit 1 when the answer is neither or runs
 *                           past the unsigned int it is written as, or
 *                           cuPointerGetAttributes (the plural) answers it
 *                           or the range start otherwise.
 *   ipc_prog open HEX OFF   the importer: HEX is the handle's 64 bytes.
 * Under the shim with MEMPOOL_CONF=virtual=0 the two buffers share one plain
 * segment: the first starts it, the second does not. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prog_try.h"

#define MP_BYTES ((size_t)64 << 10)

static int start(void) {
  CUdevice dev;
  CUcontext ctx;
  MP_TRY(cuInit(0));
  MP_TRY(cuDeviceGet(&dev, 0));
  MP_TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
  MP_TRY(cuCtxSetCurrent(ctx));
  return 0;
}

/* The importer: open the handle, write 0xCC at the offset, close. */
static int import(const char *hex, const char *off) {
  CUipcMemHandle h;
  if (strlen(hex) != 2 * sizeof h.reserved)
    return 2;
  for (size_t i = 0; i < sizeof h.reserved; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1)
      return 2;
    h.reserved[i] = (char)v;
  }
  if (start() != 0)
    return 1;
  CUdeviceptr p;
  MP_TRY(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  MP_TRY(cuMemsetD8(p + strtoull(off, NULL, 10), 0xCC, MP_BYTES));
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuIpcCloseMemHandle(p));
  return 0;
}

/* Whether the MP_BYTES at p all hold v. */
static int holds(CUdeviceptr p, unsigned char v, unsigned char *seen) {
  static unsigned char buf[MP_BYTES];
  if (cuMemcpyDtoH(buf, p, MP_BYTES) != CUDA_SUCCESS)
    return 0;
  *seen = buf[0];
  for (size_t i = 0; i < MP_BYTES; i++)
    if (buf[i] != v) {
      *seen = buf[i];
      return 0;
    }
  return 1;
}

/* IS_LEGACY_CUDA_IPC_CAPABLE of p (0 or 1) into *cap; the answer must fit
 * the unsigned int it is written as (cuda.h: "a boolean"): the bytes
 * after it are checked untouched. */
static int legacy_ipc_capable(CUdeviceptr p, unsigned int *cap) {
  union {
    unsigned int v;
    unsigned char b[2 * sizeof(unsigned int)];
  } u;
  memset(&u, 0x5A, sizeof u);
  CUresult r = cuPointerGetAttribute(
      &u.v, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
  if (r != CUDA_SUCCESS) {
    printf("WRONG: IS_LEGACY_CUDA_IPC_CAPABLE of %llx: error %d\n",
           (unsigned long long)p, (int)r);
    return 1;
  }
  for (size_t i = sizeof u.v; i < sizeof u.b; i++)
    if (u.b[i] != 0x5A) {
      printf("WRONG: IS_LEGACY_CUDA_IPC_CAPABLE wrote past an unsigned "
             "int\n");
      return 1;
    }
  if (u.v > 1) {
    printf("WRONG: IS_LEGACY_CUDA_IPC_CAPABLE is %u\n", u.v);
    return 1;
  }
  *cap = u.v;
  return 0;
}

static int capable(int second) {
  if (start() != 0)
    return 1;
  CUdeviceptr d[2], base = 0;
  MP_TRY(cuMemAlloc(&d[0], MP_BYTES));
  MP_TRY(cuMemAlloc(&d[1], MP_BYTES));
  CUdeviceptr p = d[second];
  MP_TRY(
      cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p));
  unsigned int b = 2, i = 2;
  if (legacy_ipc_capable(base, &b) != 0 ||
      legacy_ipc_capable(p + MP_BYTES / 2, &i) != 0)
    return 1;
  /* The plural (TensorRT-LLM, UCX) says what the singular says. */
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  unsigned int pcap = 2;
  CUdeviceptr pbase = 0;
  void *pdata[] = {&pcap, &pbase};
  MP_TRY(cuPointerGetAttributes(2, attrs, pdata, p + MP_BYTES / 2));
  if (pcap != i || pbase != base) {
    printf("WRONG: cuPointerGetAttributes says capable %u, range start "
           "%llx; cuPointerGetAttribute %u, %llx\n",
           pcap, (unsigned long long)pbase, i, (unsigned long long)base);
    return 1;
  }
  MP_TRY(cuMemFree(d[0]));
  MP_TRY(cuMemFree(d[1]));
  printf("capable %u %u\n", b, i);
  return 0;
}

static int share(const char *self, int second) {
  if (start() != 0)
    return 1;
  CUdeviceptr d[2];
  MP_TRY(cuMemAlloc(&d[0], MP_BYTES));
  MP_TRY(cuMemAlloc(&d[1], MP_BYTES));
  MP_TRY(cuMemsetD8(d[0], 0xAA, MP_BYTES));
  MP_TRY(cuMemsetD8(d[1], 0xBB, MP_BYTES));
  MP_TRY(cuCtxSynchronize());
  CUdeviceptr p = d[second], base = 0, base2 = 0;
  MP_TRY(
      cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p));
  MP_TRY(cuMemGetAddressRange(&base2, NULL, p));
  if (base != base2 || base > p) {
    printf("WRONG: range starts differ: %llx %llx\n", (unsigned long long)base,
           (unsigned long long)base2);
    return 1;
  }
  unsigned int cap = 2;
  if (legacy_ipc_capable(base, &cap) != 0)
    return 1;
  CUipcMemHandle h;
  CUresult r = cuIpcGetMemHandle(&h, base);
  if ((r == CUDA_SUCCESS) != (cap == 1)) {
    printf("WRONG: IS_LEGACY_CUDA_IPC_CAPABLE is %u, cuIpcGetMemHandle "
           "answered %d\n",
           cap, (int)r);
    return 1;
  }
  if (r != CUDA_SUCCESS) {
    printf("refused %d\n", (int)r);
    return 0;
  }
  char hex[2 * sizeof h.reserved + 1], off[32];
  for (size_t i = 0; i < sizeof h.reserved; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
  snprintf(off, sizeof off, "%llu", (unsigned long long)(p - base));
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", self, "open", hex, off, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    printf("the importer failed (status %d)\n", status);
    return 1;
  }
  unsigned char s0, s1;
  int ok0 = holds(d[0], second ? 0xAA : 0xCC, &s0);
  int ok1 = holds(d[1], second ? 0xCC : 0xBB, &s1);
  if (!ok0 || !ok1) {
    printf("WRONG: the importer wrote elsewhere: first holds %02x, second "
           "%02x\n",
           s0, s1);
    return 1;
  }
  MP_TRY(cuMemFree(d[0]));
  MP_TRY(cuMemFree(d[1]));
  printf("shared\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "open") == 0)
    return import(argv[2], argv[3]);
  if (argc == 3 && strcmp(argv[1], "capable") == 0 &&
      (strcmp(argv[2], "first") == 0 || strcmp(argv[2], "second") == 0))
    return capable(strcmp(argv[2], "second") == 0);
  if (argc == 2 &&
      (strcmp(argv[1], "first") == 0 || strcmp(argv[1], "second") == 0))
    return share(argv[0], strcmp(argv[1], "second") == 0);
  fprintf(stderr, "usage: ipc_prog first|second | capable first|second | "
                  "open HEX OFFSET\n");
  return 2;
}
