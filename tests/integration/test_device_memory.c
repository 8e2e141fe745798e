/* Device memory of the host backend: allocation, capacity, misuse, fault
 * injection and latency, through the public API. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
Test(device_memory, device_is_named_host) {
  mp_device_t *dev = open_dev("host");
  cr_expect_str_eq(mp_device_name(dev), "host");
  mp_device_close(dev);
}

Test(device_memory, allocation_is_writable_and_counted_until_freed) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  size_t total = 0, f = 0;
  cr_assert_eq(mp_device_mem_info(dev, &f, &total), MP_OK);
  cr_expect_eq(total, (size_t)64 << 20);
  cr_expect_eq(f, total);
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, (size_t)10 << 20, &p), MP_OK);
  cr_assert_not_null(p);
  memset(p, 0x5a, (size_t)10 << 20);
  cr_expect_eq(((unsigned char *)p)[(10 << 20) - 1], 0x5a);
  cr_expect_eq(free_bytes(dev), (size_t)54 << 20);
  cr_expect_eq(mp_device_free(dev, p), MP_OK);
  cr_expect_eq(free_bytes(dev), (size_t)64 << 20);
  mp_device_close(dev);
}

Test(device_memory, memset_and_memcpy_move_the_right_bytes) {
  mp_device_t *dev = open_dev("host");
  enum { N = 1 << 16 };
  unsigned char *a = NULL, *b = NULL;
  cr_assert_eq(mp_device_alloc(dev, N, (void **)&a), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, N, (void **)&b), MP_OK);
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0xab, N, s), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a + 100, 0x11, 50, s), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, b, a, N, s), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  for (size_t i = 0; i < N; i++) {
    unsigned char want = (i >= 100 && i < 150) ? 0x11 : 0xab;
    if (b[i] != want) {
      cr_expect_eq(b[i], want, "b[%zu]", i);
      break;
    }
  }
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_expect_eq(mp_device_free(dev, a), MP_OK);
  cr_expect_eq(mp_device_free(dev, b), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, exceeding_capacity_is_enomem_and_freeing_recovers) {
  mp_device_t *dev = open_dev("host:capacity=8M");
  void *p = NULL, *q = (void *)0x1;
  cr_assert_eq(mp_device_alloc(dev, (size_t)6 << 20, &p), MP_OK);
  cr_expect_eq(mp_device_alloc(dev, (size_t)4 << 20, &q), MP_ENOMEM);
  cr_expect_eq(q, (void *)0x1, "a failed alloc must not write *out");
  cr_expect_neq(strstr(mp_last_error(), "capacity"), NULL, "message: %s",
                mp_last_error());
  cr_expect_eq(free_bytes(dev), (size_t)2 << 20, "a failure changes nothing");
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  cr_expect_eq(mp_device_alloc(dev, (size_t)4 << 20, &q), MP_OK);
  cr_expect_eq(mp_device_free(dev, q), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, absurd_size_is_enomem) {
  mp_device_t *dev = open_dev("host:capacity=1G");
  void *p = NULL;
  cr_expect_eq(mp_device_alloc(dev, SIZE_MAX, &p), MP_ENOMEM);
  cr_expect_eq(mp_device_alloc(dev, 0, &p), MP_EINVAL);
  cr_expect_eq(free_bytes(dev), (size_t)1 << 30);
  mp_device_close(dev);
}

Test(device_memory, terabyte_capacity_serves_untouched_memory) {
  mp_device_t *dev = open_dev("host:capacity=1T");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, (size_t)64 << 30, &p), MP_OK);
  ((char *)p)[0] = 1; /* only the touched page is committed */
  ((char *)p)[((size_t)64 << 30) - 1] = 2;
  cr_expect_eq(free_bytes(dev), ((size_t)1 << 40) - ((size_t)64 << 30));
  cr_expect_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, free_of_unknown_pointer_is_einval) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  char *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, (void **)&p), MP_OK);
  int on_stack = 0;
  cr_expect_eq(mp_device_free(dev, &on_stack), MP_EINVAL);
  cr_expect_eq(mp_device_free(dev, p + 64), MP_EINVAL, "interior pointer");
  cr_expect_eq(mp_device_free(dev, NULL), MP_EINVAL);
  cr_expect_eq(free_bytes(dev), ((size_t)16 << 20) - 4096);
  cr_expect_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, double_free_is_einval_and_changes_nothing) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  void *p = NULL, *keep = NULL;
  cr_assert_eq(mp_device_alloc(dev, 8192, &p), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, 4096, &keep), MP_OK);
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  cr_expect_eq(mp_device_free(dev, p), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "mp_device_free"), NULL);
  cr_expect_eq(free_bytes(dev), ((size_t)16 << 20) - 4096);
  cr_expect_eq(mp_device_free(dev, keep), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, pointer_of_another_device_is_einval) {
  mp_device_t *a = open_dev("host"), *b = open_dev("host");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(a, 4096, &p), MP_OK);
  cr_expect_eq(mp_device_free(b, p), MP_EINVAL);
  cr_expect_eq(mp_device_free(a, p), MP_OK);
  mp_device_close(b);
  mp_device_close(a);
}

Test(device_memory, fail_after_fails_the_nth_and_every_later_allocation) {
  mp_device_t *dev = open_dev("host:fail_after=3");
  void *p[4] = {0};
  cr_expect_eq(mp_device_alloc(dev, 4096, &p[0]), MP_OK);
  cr_expect_eq(mp_device_alloc(dev, 4096, &p[1]), MP_OK);
  cr_expect_eq(mp_device_alloc(dev, 4096, &p[2]), MP_ENOMEM);
  cr_expect_neq(strstr(mp_last_error(), "fail_after"), NULL, "message: %s",
                mp_last_error());
  cr_expect_eq(mp_device_alloc(dev, 4096, &p[3]), MP_ENOMEM);
  cr_expect_eq(mp_device_free(dev, p[0]), MP_OK);
  cr_expect_eq(mp_device_alloc(dev, 4096, &p[3]), MP_ENOMEM,
               "freeing does not reset fault injection");
  cr_expect_eq(mp_device_free(dev, p[1]), MP_OK);
  mp_device_close(dev);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void expect_delayed(mp_status_t (*alloc)(mp_device_t *, size_t, void **),
                           mp_status_t (*release)(mp_device_t *, void *),
                           const char *what) {
  mp_device_t *dev = open_dev("host:latency_us=20000");
  void *p = NULL;
  double t0 = now_s();
  cr_assert_eq(alloc(dev, 4096, &p), MP_OK);
  double t1 = now_s();
  cr_assert_eq(release(dev, p), MP_OK);
  double t2 = now_s();
  cr_expect_geq(t1 - t0, 0.019, "%s alloc took %.4f s", what, t1 - t0);
  cr_expect_geq(t2 - t1, 0.019, "%s free took %.4f s", what, t2 - t1);
  mp_device_close(dev);
}

Test(device_memory, latency_us_delays_allocate_and_free) {
  expect_delayed(mp_device_alloc, mp_device_free, "device");
}

/* Pinning pages is a driver call too (cuMemHostAlloc): it pays the same. */
Test(device_memory, latency_us_delays_page_locked_allocate_and_free) {
  expect_delayed(mp_device_host_alloc, mp_device_host_free, "page-locked");
}

static void slow_increment(void *arg) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
  nanosleep(&ts, NULL);
  atomic_fetch_add((atomic_int *)arg, 1);
}

/* More streams than the free's list of them holds on its stack: every one
 * must still be drained before the memory goes. */
Test(device_memory, free_waits_for_work_on_every_stream) {
  enum { NSTREAMS = 40 };
  mp_device_t *dev = open_dev("host");
  mp_stream_t s[NSTREAMS];
  atomic_int done = 0;
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK);
  for (int i = 0; i < NSTREAMS; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, s[i], slow_increment, &done),
                 MP_OK);
  }
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(atomic_load(&done), NSTREAMS);
  for (int i = 0; i < NSTREAMS; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  mp_device_close(dev);
}

Test(device_memory, host_alloc_is_tracked) {
  mp_device_t *dev = open_dev("host:capacity=1M");
  char *h = NULL;
  /* Page-locked host memory does not count against device capacity. */
  cr_assert_eq(mp_device_host_alloc(dev, (size_t)4 << 20, (void **)&h), MP_OK);
  h[0] = 1;
  h[(4 << 20) - 1] = 2;
  cr_expect_eq(free_bytes(dev), (size_t)1 << 20);
  cr_expect_eq(mp_device_host_free(dev, h + 1), MP_EINVAL);
  cr_expect_eq(mp_device_host_alloc(dev, 0, (void **)&h), MP_EINVAL);
  cr_assert_eq(mp_device_host_free(dev, h), MP_OK);
  cr_expect_eq(mp_device_host_free(dev, h), MP_EINVAL, "double free");
  void *d = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &d), MP_OK);
  cr_expect_eq(mp_device_host_free(dev, d), MP_EINVAL,
               "device memory is not host memory");
  cr_expect_eq(mp_device_free(dev, d), MP_OK);
  mp_device_close(dev);
}

typedef struct churn {
  mp_device_t *dev;
  int failures;
} churn_t;

static void *churn_main(void *arg) {
  churn_t *c = arg;
  for (int i = 0; i < 200; i++) {
    void *p = NULL;
    size_t bytes = (size_t)4096 * (1 + (size_t)(i % 7));
    if (mp_device_alloc(c->dev, bytes, &p) != MP_OK) {
      c->failures++;
      continue;
    }
    memset(p, i, bytes);
    if (mp_device_free(c->dev, p) != MP_OK)
      c->failures++;
  }
  return NULL;
}

Test(device_memory, concurrent_alloc_and_free_keep_the_books) {
  mp_device_t *dev = open_dev("host:capacity=1G");
  enum { T = 4 };
  pthread_t th[T];
  churn_t c[T];
  for (int i = 0; i < T; i++) {
    c[i] = (churn_t){.dev = dev};
    cr_assert_eq(pthread_create(&th[i], NULL, churn_main, &c[i]), 0);
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(c[i].failures, 0);
  }
  cr_expect_eq(free_bytes(dev), (size_t)1 << 30);
  mp_device_close(dev);
}
