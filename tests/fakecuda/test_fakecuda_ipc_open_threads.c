/* test_fakecuda_ipc_open_threads.c - the fake driver's cuIpcOpenMemHandle
 * from two threads at once, one handle, one context: "If the memory handle
 * has already been opened by the current context, the reference count on
 * the handle is incremented by 1 and the existing device pointer is
 * returned" (cuda.h, cuIpcOpenMemHandle), so both get the same pointer and
 * it takes two cuIpcCloseMemHandle calls to unmap ("Decrements the
 * reference count ... When the reference count reaches 0, this API unmaps
 * the memory", cuda.h, cuIpcCloseMemHandle). Failed before: the fake
 * looked for an open, mapped, and listed the mapping as separate steps, so
 * two threads in between got two mappings.
 *
 * Not deterministic: the two opens start together (a barrier) and the race
 * is tried ROUNDS times; with the steps apart most runs saw it in a few
 * rounds. The exporter must be another process (the fake refuses a handle
 * of its own process, as a real driver does): a forked child holds the
 * allocation's descriptor (inherited) and waits, and the handle, made
 * here, is rewritten to name the child as its exporter (the fake's
 * handle: fk_ipc_t in fakecuda.c, the exporter's pid after 8 bytes of
 * magic). */
#include <criterion/criterion.h>
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 200

static CUcontext ctx;
static CUipcMemHandle handle;
static pthread_barrier_t start;

typedef struct opener {
  CUdeviceptr p;
  CUresult r;
} opener_t;

static void *open_handle(void *arg) {
  opener_t *o = arg;
  o->r = cuCtxSetCurrent(ctx);
  pthread_barrier_wait(&start);
  if (o->r == CUDA_SUCCESS)
    o->r =
        cuIpcOpenMemHandle(&o->p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return NULL;
}

Test(fakecuda_ipc_open_threads, two_threads_opening_one_handle_share_it) {
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr d;
  cr_assert_eq(cuMemAlloc(&d, (size_t)1 << 20), CUDA_SUCCESS);
  cr_assert_eq(cuIpcGetMemHandle(&handle, d), CUDA_SUCCESS);
  int gate[2];
  cr_assert_eq(pipe(gate), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) { /* the exporter: holds the descriptor until told */
    char c;
    close(gate[1]);
    (void)read(gate[0], &c, 1);
    _exit(0);
  }
  close(gate[0]);
  int32_t pid = (int32_t)child;
  memcpy(handle.reserved + 8, &pid, sizeof pid);
  cr_assert_eq(pthread_barrier_init(&start, NULL, 2), 0);
  int apart = 0;
  for (int round = 0; round < ROUNDS; round++) {
    opener_t o[2] = {{0, CUDA_SUCCESS}, {0, CUDA_SUCCESS}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_create(&t[i], NULL, open_handle, &o[i]), 0);
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_eq(o[0].r, CUDA_SUCCESS, "round %d", round);
    cr_assert_eq(o[1].r, CUDA_SUCCESS, "round %d", round);
    apart += o[0].p != o[1].p;
    /* One mapping counted twice: the first close leaves it mapped. */
    cr_assert_eq(cuIpcCloseMemHandle(o[1].p), CUDA_SUCCESS);
    cr_assert_eq(cuIpcCloseMemHandle(o[0].p), CUDA_SUCCESS);
    cr_assert_eq(cuIpcCloseMemHandle(o[0].p), CUDA_ERROR_INVALID_VALUE,
                 "round %d: a third close found it still open", round);
  }
  cr_expect_eq(apart, 0,
               "%d of %d rounds gave the two opens two mappings, not one "
               "counted twice",
               apart, ROUNDS);
  pthread_barrier_destroy(&start);
  close(gate[1]);
  int status;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}
