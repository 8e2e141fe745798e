/* Closing the host device: queued work runs to completion, and whatever is
 * still allocated or alive is released (ASan's leak check would say). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/mapped_bytes.h"

static void slow_increment(void *arg) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 2000000};
  nanosleep(&ts, NULL);
  atomic_fetch_add((atomic_int *)arg, 1);
}

Test(device_close, close_runs_queued_work_to_completion) {
  mp_device_t *dev = open_dev("host");
  atomic_int count = 0;
  mp_stream_t s[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  for (int j = 0; j < 10; j++) {
    cr_assert_eq(mp_stream_launch_host(dev, s[0], slow_increment, &count),
                 MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, s[1], slow_increment, &count),
                 MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, NULL, slow_increment, &count),
                 MP_OK);
  }
  mp_device_close(dev);
  cr_expect_eq(atomic_load(&count), 30);
}

Test(device_close, close_waits_on_cross_stream_dependencies) {
  mp_device_t *dev = open_dev("host");
  atomic_int count = 0;
  mp_stream_t s[3];
  mp_event_t e[3];
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    cr_assert_eq(mp_event_create(dev, &e[i]), MP_OK);
  }
  /* A chain s0 -> s1 -> s2, queued in every creation order. */
  for (int i = 0; i < 3; i++) {
    if (i > 0)
      cr_assert_eq(mp_stream_wait_event(dev, s[i], e[i - 1]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, s[i], slow_increment, &count),
                 MP_OK);
    cr_assert_eq(mp_event_record(dev, e[i], s[i]), MP_OK);
  }
  mp_device_close(dev);
  cr_expect_eq(atomic_load(&count), 3);
}

Test(device_close, close_releases_live_memory_and_handles) {
  mp_device_t *dev = open_dev("host");
  void *p[4];
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mp_device_alloc(dev, (size_t)1 << 20, &p[i]), MP_OK);
    cr_assert_eq(mp_memset_async(dev, p[i], i, (size_t)1 << 20, NULL), MP_OK);
  }
  void *h;
  cr_assert_eq(mp_device_host_alloc(dev, 4096, &h), MP_OK);
  mp_stream_t s;
  mp_event_t e, unrecorded;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_event_create(dev, &e), MP_OK);
  cr_assert_eq(mp_event_create(dev, &unrecorded), MP_OK);
  /* The copy on s waits for the memsets on the default stream, and the
   * default stream then waits for the copy: all of it still queued. */
  cr_assert_eq(mp_event_record(dev, e, NULL), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, s, e), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, p[0], p[1], (size_t)1 << 20, s), MP_OK);
  cr_assert_eq(mp_event_record(dev, e, s), MP_OK);
  cr_assert_eq(mp_stream_wait_event(dev, NULL, e), MP_OK);
  cr_assert_eq(mp_memset_async(dev, p[1], 9, (size_t)1 << 20, NULL), MP_OK);
  mp_device_close(dev);
}

Test(device_close, close_gives_live_allocations_back) {
  const size_t each = (size_t)1 << 30;
  mp_device_t *dev = open_dev("host");
  size_t before = mapped_bytes();
  void *p[4];
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mp_device_alloc(dev, each, &p[i]), MP_OK);
    ((char *)p[i])[each - 1] = 1;
  }
  void *h;
  cr_assert_eq(mp_device_host_alloc(dev, each, &h), MP_OK);
  size_t during = mapped_bytes();
  cr_assert_geq(during - before, 5 * each);
  mp_device_close(dev);
  size_t after = mapped_bytes();
  /* Thread stacks and the like may come and go; 5 GiB must be gone. */
  cr_expect_leq(after + 5 * each, during + ((size_t)64 << 20),
                "mapped: %zu before close, %zu after", during, after);
}

Test(device_close, close_of_null_is_a_no_op) {
  mp_device_close(NULL);
  cr_expect_str_eq(mp_device_name(NULL), "");
}
