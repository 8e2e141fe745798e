/* The cuda backend on a real GPU: the same core checks as the fake-driver
 * tests (tests/fakecuda), against NVIDIA's driver. Without a usable GPU the
 * executable exits 77, which ctest reports as skipped.
 *
 * The probe runs in a child process: CUDA does not survive fork(), and
 * Criterion runs each test in a process of its own, so the runner itself
 * must never initialise the driver. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <mempool/mempool.h>

#include "../support/stream_destroy_check.h"
#include "../support/stream_gate.h"
#include "device/backend.h"

/* CUDA needs the address range ASan protects by default. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "protect_shadow_gap=0";
}

static mp_device_t *open_gpu(void) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open("cuda", &dev);
  cr_assert_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  return dev;
}

Test(cuda_gpu, opens_the_real_driver) {
  mp_device_t *dev = open_gpu();
  cr_assert(strncmp(mp_device_name(dev), "cuda:0 ", 7) == 0, "%s",
            mp_device_name(dev));
  /* Never the test double. */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(h);
  cr_assert_null(dlsym(h, "cuFakeGetCallCount"), "the fake driver is loaded");
  dlclose(h);
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_device_mem_info(dev, &free_b, &total), MP_OK, "%s",
               mp_last_error());
  cr_assert_gt(total, 0);
  cr_assert_leq(free_b, total);
  mp_device_close(dev);
}

Test(cuda_gpu, alloc_free_and_enomem) {
  mp_device_t *dev = open_gpu();
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_device_mem_info(dev, &free_b, &total), MP_OK);
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_EINVAL);
  void *huge = (void *)&huge;
  cr_assert_eq(mp_device_alloc(dev, total * 2, &huge), MP_ENOMEM, "%s",
               mp_last_error());
  cr_assert_eq(huge, (void *)&huge);
  mp_device_close(dev);
}

Test(cuda_gpu, memset_memcpy_round_trip) {
  mp_device_t *dev = open_gpu();
  const size_t n = 1 << 20;
  mp_stream_t s = NULL;
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, n, (void **)&h), MP_OK, "%s",
               mp_last_error());
  for (size_t i = 0; i < n; i++)
    h[i] = (unsigned char)(i * 13);
  cr_assert_eq(mp_memcpy_async(dev, d, h, n / 2, s), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memset_async(dev, d + n / 2, 0x3c, n / 2, s), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  memset(h, 0, n);
  cr_assert_eq(mp_memcpy_async(dev, h, d, n, s), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  for (size_t i = 0; i < n / 2; i++)
    cr_assert_eq(h[i], (unsigned char)(i * 13), "byte %zu", i);
  for (size_t i = n / 2; i < n; i++)
    cr_assert_eq(h[i], 0x3c, "byte %zu", i);
  cr_assert_eq(mp_device_host_free(dev, h), MP_OK);
  cr_assert_eq(mp_device_free(dev, d), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}

Test(cuda_gpu, events_and_cross_stream_waits) {
  mp_device_t *dev = open_gpu();
  mp_stream_t a = NULL, b = NULL;
  mp_event_t e = NULL;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_query(dev, e), MP_OK);
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 4096, (void **)&h), MP_OK);
  cr_assert_eq(mp_memset_async(dev, d, 1, 4096, a), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, a), MP_OK);

  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memset_async(dev, d, 2, 4096, a), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, a), MP_OK);
  cr_assert_eq(mp_event_query(dev, e), MP_EBUSY);
  cr_assert_eq(mp_stream_wait_event(dev, b, e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, d, 4096, b), MP_OK);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_assert_eq(mp_event_query(dev, e), MP_OK);
  cr_assert_eq(h[0], 2);
  cr_assert_eq(h[4095], 2);
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK);
  cr_assert_eq(mp_event_destroy(dev, e), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, a), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, b), MP_OK);
  gate_destroy(&g);
  mp_device_host_free(dev, h);
  mp_device_free(dev, d);
  mp_device_close(dev);
}

/* Twin of test_cuda_streams' destroy_returns_at_once_and_the_queued_work_
 * still_runs: mp_stream_destroy returns while the stream's work is held
 * back (cuStreamDestroy returns at once), and that work still runs. */
Test(cuda_gpu, stream_destroy_returns_at_once) {
  mp_device_t *dev = open_gpu();
  check_stream_destroy_returns_at_once(dev);
  mp_device_close(dev);
}

Test(cuda_gpu, vmm_map_unmap) {
  mp_device_t *dev = open_gpu();
  size_t g = 0;
  mp_status_t st = mp__device_vm_granularity(dev, &g);
  if (st == MP_ENOTSUP) { /* a GPU without VMM: nothing else to check */
    mp_device_close(dev);
    return;
  }
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_gt(g, 0);
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * g, (void **)&base), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_map(dev, base, g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_map(dev, base + g, 2 * g), MP_OK, "%s",
               mp_last_error());
  unsigned char *h = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 3 * g, (void **)&h), MP_OK);
  cr_assert_eq(mp_memset_async(dev, base, 0x77, 3 * g, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, base, 3 * g, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(h[0], 0x77);
  cr_assert_eq(h[3 * g - 1], 0x77);
  cr_assert_eq(mp__device_vm_unmap(dev, base + g, g), MP_EINVAL);
  cr_assert_eq(mp__device_vm_unmap(dev, base + g, 2 * g), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_unmap(dev, base, g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_release(dev, base, 4 * g), MP_OK, "%s",
               mp_last_error());
  mp_device_host_free(dev, h);
  mp_device_close(dev);
}

Test(cuda_gpu, bad_index_is_enodev) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda:1000", &dev), MP_ENODEV);
  cr_assert_null(dev);
}

/* 0 when a GPU is usable, 77 when there is no driver or no device (the
 * only reason to skip), 1 when the open fails otherwise (a broken driver or
 * backend is a failure, not a skip). Checked in a child so this process
 * stays clean. */
static int probe_gpu(void) {
  pid_t pid = fork();
  if (pid < 0)
    return 1;
  if (pid == 0) {
    mp_device_t *dev = NULL;
    mp_status_t st = mp_device_open("cuda", &dev);
    if (st != MP_OK)
      fprintf(stderr, "test_cuda_gpu: %s: %s\n",
              st == MP_ENODEV ? "skipped" : "FAILED to open cuda",
              mp_last_error());
    mp_device_close(dev);
    _exit(st == MP_OK ? 0 : st == MP_ENODEV ? 77 : 1);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return 1;
  return WEXITSTATUS(status);
}

int main(int argc, char *argv[]) {
  int probe = probe_gpu();
  if (probe != 0)
    return probe;
  struct criterion_test_set *tests = criterion_initialize();
  int result = 0;
  if (criterion_handle_args(argc, argv, true))
    result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return result;
}
