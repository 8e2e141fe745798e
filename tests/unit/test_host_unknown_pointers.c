/* The host device refuses, when they are queued, copies and memsets of
 * memory it cannot touch, as a GPU driver refuses them: a memset's
 * destination must be device memory (cuda.h, cuMemsetD8Async: dstDevice
 * is a device pointer, else CUDA_ERROR_INVALID_VALUE), a copy's side that
 * is no device memory is host memory (cuMemcpyAsync infers the direction
 * from the pointers) and must be mapped. Such a call was queued and
 * crashed the whole process with SIGSEGV on the stream's worker thread. A
 * refused call queues nothing (a stream that reaches its work only after
 * 200 ms, stream_latency_us, stays idle) and the stream stays usable. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../support/device_helpers.h"

#define KiB  ((size_t)1 << 10)
#define SPEC "host:capacity=16M,stream_latency_us=200000"

/* st is MP_EINVAL, its message names fn, p and n, and nothing is queued
 * on s. */
static void expect_refused(mp_device_t *dev, mp_stream_t s, mp_status_t st,
                           const char *fn, const void *p, size_t n) {
  cr_expect_eq(st, MP_EINVAL, "%s(%p, %zu): %s", fn, p, n, mp_status_name(st));
  if (st != MP_EINVAL)
    return;
  char ptr[32], size[32];
  snprintf(ptr, sizeof ptr, "%p", p);
  snprintf(size, sizeof size, "%zu bytes", n);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, fn) != NULL && strstr(msg, ptr) != NULL &&
                strstr(msg, size) != NULL,
            "the message names %s, %s and %s: %s", fn, ptr, size, msg);
  cr_expect_eq(mp_stream_query(dev, s), MP_OK, "%s(%p) queued work", fn, p);
}

/* The stream still works: a memset and copies on it run. */
static void expect_usable(mp_device_t *dev, mp_stream_t s, unsigned char *d,
                          size_t n) {
  unsigned char *h = malloc(n);
  cr_assert_not_null(h);
  cr_assert_eq(mp_memset_async(dev, d, 0x42, n, s), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, d, n, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(h[0], 0x42);
  cr_expect_eq(h[n - 1], 0x42);
  free(h);
}

/* A device of SPEC, a stream of it and an allocation of n bytes. */
typedef struct rig {
  mp_device_t *dev;
  mp_stream_t s;
  unsigned char *d;
  size_t n;
} rig_t;

static rig_t rig_open(size_t n) {
  rig_t r = {.dev = open_dev(SPEC), .n = n};
  cr_assert_eq(mp_stream_create(r.dev, &r.s), MP_OK);
  cr_assert_eq(mp_device_alloc(r.dev, n, (void **)&r.d), MP_OK);
  return r;
}

/* Checks that the stream still works, then lets everything go. */
static void rig_close(rig_t *r) {
  expect_usable(r->dev, r->s, r->d, r->n);
  cr_assert_eq(mp_device_free(r->dev, r->d), MP_OK);
  cr_assert_eq(mp_stream_destroy(r->dev, r->s), MP_OK);
  mp_device_close(r->dev);
}

Test(host_unknown_pointers, a_foreign_pointer_is_refused_at_the_call) {
  rig_t r = rig_open(64 * KiB);
  mp_device_t *dev = r.dev;
  mp_stream_t s = r.s;
  unsigned char *d = r.d;
  void *foreign = (void *)(uintptr_t)0x1000;
  unsigned char host[256];
  memset(host, 0x5a, sizeof host);
  expect_refused(dev, s, mp_memset_async(dev, foreign, 1, 4096, s),
                 "mp_memset_async", foreign, 4096);
  expect_refused(dev, s, mp_memcpy_async(dev, host, foreign, 64, s),
                 "mp_memcpy_async", foreign, 64);
  expect_refused(dev, s, mp_memcpy_async(dev, foreign, d, 64, s),
                 "mp_memcpy_async", foreign, 64);
  /* Host memory is no device memory: a memset of it is refused too. */
  expect_refused(dev, s, mp_memset_async(dev, host, 1, sizeof host, s),
                 "mp_memset_async", host, sizeof host);
  for (size_t i = 0; i < sizeof host; i++)
    cr_assert_eq(host[i], 0x5a, "a refused call wrote the host buffer");
  rig_close(&r);
}

Test(host_unknown_pointers, a_range_past_its_allocations_end_is_refused) {
  const size_t n = 10000; /* not a whole page: the mapping runs on */
  rig_t r = rig_open(n);
  mp_device_t *dev = r.dev;
  mp_stream_t s = r.s;
  unsigned char *d = r.d;
  unsigned char *host = malloc(2 * n);
  cr_assert_not_null(host);
  unsigned char *in = d + n / 2;
  expect_refused(dev, s, mp_memset_async(dev, in, 1, n, s), "mp_memset_async",
                 in, n);
  expect_refused(dev, s, mp_memcpy_async(dev, host, in, n, s),
                 "mp_memcpy_async", in, n);
  expect_refused(dev, s, mp_memcpy_async(dev, in, host, n, s),
                 "mp_memcpy_async", in, n);
  free(host);
  rig_close(&r);
}

Test(host_unknown_pointers, a_freed_allocation_is_refused) {
  rig_t r = rig_open(64 * KiB);
  mp_device_t *dev = r.dev;
  mp_stream_t s = r.s;
  unsigned char *d = r.d, *gone = NULL, *pinned = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&gone), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 64 * KiB, (void **)&pinned), MP_OK);
  cr_assert_eq(mp_device_free(dev, gone), MP_OK);
  cr_assert_eq(mp_device_host_free(dev, pinned), MP_OK);
  unsigned char host[256];
  expect_refused(dev, s, mp_memset_async(dev, gone, 1, 4096, s),
                 "mp_memset_async", gone, 4096);
  expect_refused(dev, s, mp_memcpy_async(dev, host, gone, sizeof host, s),
                 "mp_memcpy_async", gone, sizeof host);
  expect_refused(dev, s, mp_memcpy_async(dev, gone, d, 4096, s),
                 "mp_memcpy_async", gone, 4096);
  expect_refused(dev, s, mp_memset_async(dev, pinned, 1, 4096, s),
                 "mp_memset_async", pinned, 4096);
  expect_refused(dev, s, mp_memcpy_async(dev, pinned, d, 4096, s),
                 "mp_memcpy_async", pinned, 4096);
  rig_close(&r);
}

/* What may be touched still is: device and page-locked memory for a
 * memset, and for a copy host memory too (malloc'ed, on the stack, or
 * both sides host memory: cuMemcpyAsync's host to host), and the memory of
 * another host device (host devices share their memory: backend.h). */
Test(host_unknown_pointers, device_page_locked_host_and_peer_memory_work) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  mp_device_t *peer = open_dev("host:capacity=16M");
  const size_t n = 8 * KiB;
  unsigned char *d = NULL, *pinned = NULL, *other = NULL;
  cr_assert_eq(mp_device_alloc(dev, n, (void **)&d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, n, (void **)&pinned), MP_OK);
  cr_assert_eq(mp_device_alloc(peer, n, (void **)&other), MP_OK);
  unsigned char *heap = malloc(n), *heap2 = malloc(n);
  cr_assert(heap != NULL && heap2 != NULL);
  unsigned char stack[64];
  memset(heap, 7, n);
  cr_assert_eq(mp_memset_async(dev, d, 1, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memset_async(dev, pinned, 2, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memset_async(dev, other, 3, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, heap2, heap, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, stack, d, sizeof stack, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, d + n / 2, heap, n / 2, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, heap, other, n, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(heap2[n - 1], 7);
  cr_expect_eq(stack[63], 1);
  cr_expect_eq(d[n - 1], 7);
  cr_expect_eq(pinned[n - 1], 2);
  cr_expect_eq(heap[0], 3);
  free(heap);
  free(heap2);
  cr_assert_eq(mp_device_free(peer, other), MP_OK);
  cr_assert_eq(mp_device_host_free(dev, pinned), MP_OK);
  cr_assert_eq(mp_device_free(dev, d), MP_OK);
  mp_device_close(peer);
  mp_device_close(dev);
}
