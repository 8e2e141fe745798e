/* The cuda backend's streams, copies, host functions and events, run on the
 * fake driver. A gate (a host function that blocks its stream until the
 * test opens it) holds work back, so ordering is observed, not assumed. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_destroy_check.h"
#include "../support/stream_gate.h"
#include "fakecuda_test.h"

Test(cuda_streams, memset_and_memcpy_round_trip_through_host_memory) {
  mp_device_t *dev = open_dev("cuda");
  const size_t n = 1 << 16;
  unsigned char *d = NULL, *h = NULL, *src = NULL;
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, n, (void **)&h), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, n, (void **)&src), MP_OK);
  for (size_t i = 0; i < n; i++)
    src[i] = (unsigned char)(i * 7 + 3);

  cr_assert_eq(mp_memset_async(dev, d, 0xab, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, d, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(h[i], 0xab, "byte %zu", i);

  cr_assert_eq(mp_memcpy_async(dev, d, src, n, NULL), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, h, d, n, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(memcmp(h, src, n), 0);
  fk_assert_calls("cuMemsetD8Async", 1);
  fk_assert_calls("cuMemcpyAsync", 3);

  cr_assert_eq(mp_device_host_free(dev, src), MP_OK);
  cr_assert_eq(mp_device_host_free(dev, h), MP_OK);
  cr_assert_eq(mp_device_free(dev, d), MP_OK);
  mp_device_close(dev);
}

Test(cuda_streams, work_on_a_stream_runs_in_order) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_not_null(s, "a created stream is not the default stream");
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 4096, (void **)&h), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  for (int v = 1; v <= 5; v++)
    cr_assert_eq(mp_memset_async(dev, d, v, 4096, s), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, h, d, 4096, s), MP_OK);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  for (int i = 0; i < 4096; i++)
    cr_assert_eq(h[i], 5, "byte %d", i);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  fk_assert_calls("cuStreamDestroy_v2", 1);
  gate_destroy(&g);
  mp_device_host_free(dev, h);
  mp_device_free(dev, d);
  mp_device_close(dev);
}

typedef struct probe {
  const unsigned char *h;
  atomic_int seen;
} probe_t;

static void read_first_byte(void *arg) {
  probe_t *p = arg;
  atomic_store(&p->seen, p->h[0]);
}

Test(cuda_streams, launch_host_runs_after_earlier_work) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 1 << 20, (void **)&h), MP_OK);
  h[0] = 0;
  probe_t p = {.h = h};
  atomic_init(&p.seen, -1);
  cr_assert_eq(mp_memset_async(dev, d, 7, 1 << 20, s), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, h, d, 1 << 20, s), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, read_first_byte, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(atomic_load(&p.seen), 7);
  fk_assert_calls("cuLaunchHostFunc", 1);
  mp_stream_destroy(dev, s);
  mp_device_host_free(dev, h);
  mp_device_free(dev, d);
  mp_device_close(dev);
}

Test(cuda_streams, event_is_busy_until_its_stream_reaches_it) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  mp_event_t e = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_query(dev, e), MP_OK, "a fresh event is complete");
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_query(dev, e), MP_EBUSY);
  gate_open(&g);
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_query(dev, e), MP_OK);
  cr_assert_eq(mp_event_destroy(dev, e), MP_OK);
  cr_assert_eq(mp_event_destroy(dev, e), MP_EINVAL, "destroyed twice");
  fk_assert_calls("cuEventDestroy_v2", 1);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_EINVAL, "destroyed twice");
  /* A stale stream must not reach the driver. */
  fk_assert_calls("cuStreamDestroy_v2", 1);
  gate_destroy(&g);
  mp_device_close(dev);
}

Test(cuda_streams, stream_waits_for_an_event_of_another_stream) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t a = NULL, b = NULL;
  mp_event_t e = NULL;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  unsigned char *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 4096, (void **)&h), MP_OK);
  cr_assert_eq(mp_memset_async(dev, d, 1, 4096, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);

  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_memset_async(dev, d, 2, 4096, a), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, a), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, b, e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, d, 4096, b), MP_OK);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_assert_eq(h[0], 2, "b copied before a's memset");
  cr_assert_eq(h[4095], 2);
  fk_assert_calls("cuStreamWaitEvent", 1);

  mp_event_destroy(dev, e);
  mp_stream_destroy(dev, a);
  mp_stream_destroy(dev, b);
  gate_destroy(&g);
  mp_device_host_free(dev, h);
  mp_device_free(dev, d);
  mp_device_close(dev);
}

Test(cuda_streams, bad_handles_are_reported_not_fatal) {
  mp_device_t *dev = open_dev("cuda");
  cr_assert_eq(mp_stream_destroy(dev, NULL), MP_EINVAL);
  cr_assert_eq(mp_event_query(dev, NULL), MP_EINVAL);
  int not_an_event;
  cr_assert_eq(mp_event_destroy(dev, (mp_event_t)&not_an_event), MP_EINVAL);
  mp_device_close(dev);
}

static void sleep_then_set(void *flag) {
  usleep(150000);
  atomic_store((atomic_int *)flag, 1);
}

/* mp_device_free keeps cuMemFree's meaning (cuda.h: it "may perform
 * implicit synchronization", cudaFree does): work the application queued on
 * a stream of its own, which mempool never saw, is done before the memory
 * goes. */
Test(cuda_streams, device_free_waits_for_the_applications_own_streams) {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*push)(CUcontext), (*pop)(CUcontext *);
  CUresult (*create)(CUstream *, unsigned), (*destroy)(CUstream);
  CUresult (*launch)(CUstream, CUhostFn, void *);
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(push, "cuCtxPushCurrent_v2");
  FK_LOAD(pop, "cuCtxPopCurrent_v2");
  FK_LOAD(create, "cuStreamCreate");
  FK_LOAD(destroy, "cuStreamDestroy_v2");
  FK_LOAD(launch, "cuLaunchHostFunc");
  mp_device_t *dev = open_dev("cuda");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK);
  CUcontext ctx;
  CUstream s;
  atomic_int flag = 0;
  cr_assert_eq(retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(push(ctx), CUDA_SUCCESS);
  cr_assert_eq(create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(launch(s, sleep_then_set, &flag), CUDA_SUCCESS);
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(atomic_load(&flag), 1, "freed under the application's work");
  cr_assert_eq(destroy(s), CUDA_SUCCESS);
  cr_assert_eq(pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}

/* mp_stream_destroy returns at once, as cuStreamDestroy does (device.h;
 * cuda.h: "In case the device is still doing work in the stream hStream
 * when cuStreamDestroy() is called, the function will return immediately"),
 * and the queued work still runs. It synchronized the stream first, so it
 * waited for the gated work: a program that opens the gate only after the
 * destroy would hang. */
Test(cuda_streams, destroy_returns_at_once_and_the_queued_work_still_runs) {
  mp_device_t *dev = open_dev("cuda");
  check_stream_destroy_returns_at_once(dev);
  mp_device_close(dev);
}

/* A stream being captured is not destroyed: MP_EBUSY, and the capture goes
 * on to its end. The destroy's stream synchronize, a wait on a capturing
 * stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "the operation is not
 * permitted when the stream is capturing", cuda.h; the fake refuses it in
 * every mode, as an H200 did), invalidated the program's capture and was
 * answered as a driver failure. */
Test(cuda_streams,
     destroying_a_capturing_stream_is_ebusy_and_keeps_the_capture) {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*push)(CUcontext), (*pop)(CUcontext *);
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *), (*graph_destroy)(CUgraph);
  CUresult (*capturing)(CUstream, CUstreamCaptureStatus *);
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(push, "cuCtxPushCurrent_v2");
  FK_LOAD(pop, "cuCtxPopCurrent_v2");
  FK_LOAD(begin, "cuStreamBeginCapture_v2");
  FK_LOAD(end, "cuStreamEndCapture");
  FK_LOAD(graph_destroy, "cuGraphDestroy");
  FK_LOAD(capturing, "cuStreamIsCapturing");
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  CUcontext ctx;
  cr_assert_eq(retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(push(ctx), CUDA_SUCCESS);
  cr_assert_eq(begin((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  mp_status_t st = mp_stream_destroy(dev, s);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "captur") != NULL, "%s", mp_last_error());
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cr_assert_eq(capturing((CUstream)s, &cs), CUDA_SUCCESS);
  cr_expect_eq(cs, CU_STREAM_CAPTURE_STATUS_ACTIVE,
               "the refused destroy broke the capture (status %d)", (int)cs);
  CUgraph graph = NULL;
  cr_expect_eq(end((CUstream)s, &graph), CUDA_SUCCESS);
  if (graph != NULL)
    cr_assert_eq(graph_destroy(graph), CUDA_SUCCESS);
  cr_assert_eq(pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(release(0), CUDA_SUCCESS);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A destroyed event's handle never reaches the driver, as a destroyed
 * stream's does not (test_cuda_stream_handles.c): to the driver it is
 * undefined behaviour (an H200 crashed given a destroyed stream's, and a
 * driver may give the handle to the next event made, which the call would
 * then touch). Record, query, synchronize and wait are MP_EINVAL, saying
 * so, as on the host device; they reached the driver before. */
Test(cuda_streams, a_destroyed_event_never_reaches_the_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  mp_event_t e = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_create(dev, &e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_synchronize(dev, e), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_event_destroy(dev, e), MP_OK, "%s", mp_last_error());
  static const char *const calls[] = {"cuEventRecord", "cuEventQuery",
                                      "cuEventSynchronize",
                                      "cuStreamWaitEvent"};
  /* Counted where the driver counts calls (the fake), else not asked. */
  bool counted = !fk_is_real();
  long long before[4] = {0};
  for (int i = 0; counted && i < 4; i++)
    before[i] = fk_calls(calls[i]);
  mp_status_t got[4] = {mp_event_record(dev, e, s), mp_event_query(dev, e),
                        mp_event_synchronize(dev, e),
                        mp_stream_wait_event(dev, s, e)};
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(got[i], MP_EINVAL, "%s: %s", calls[i], mp_status_name(got[i]));
    if (counted)
      cr_expect_eq(fk_calls(calls[i]), before[i],
                   "%s reached the driver with a destroyed event", calls[i]);
  }
  cr_expect(strstr(mp_last_error(), "destroyed") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* device.h: mp_device_free "Synchronizes the device first, like
 * cuMemFree", and mp_device_host_free too (test_device_memory.c checks it
 * on the host device). cuda.h promises neither wait (cuMemFree "may
 * perform implicit synchronization"; cuMemFreeHost says nothing), and
 * the cuda backend made none: with FAKECUDA_FREE_IN_USE=stop the fake
 * stopped the process, as a driver that does not wait would let the copy
 * run on freed memory. Work queued behind a gate uses the memory when it
 * is freed; a timer opens the gate. */
static void free_while_queued(bool host) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *d = NULL, *h = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 1 << 20, &h), MP_OK);
  gate_t g;
  gate_init(&g);
  gate_timer_t t;
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, h, d, 1 << 20, s), MP_OK);
  cr_assert_eq(gate_timer_start(&t, &g, 200000), 0);
  if (host)
    cr_assert_eq(mp_device_host_free(dev, h), MP_OK, "%s", mp_last_error());
  else
    cr_assert_eq(mp_device_free(dev, d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(atomic_load(&t.opened), 1, "the free did not wait");
  gate_timer_join(&t);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  if (host)
    cr_assert_eq(mp_device_free(dev, d), MP_OK);
  else
    cr_assert_eq(mp_device_host_free(dev, h), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}

Test(cuda_streams, device_free_waits_for_queued_work_as_documented) {
  free_while_queued(false);
}

Test(cuda_streams, host_free_waits_for_queued_work_as_documented) {
  free_while_queued(true);
}
