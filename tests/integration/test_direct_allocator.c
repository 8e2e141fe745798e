/* test_direct_allocator.c - the direct allocator through the public API:
 * one device allocation per request, frees deferred to the session, which
 * synchronizes before it releases; bad input changes nothing. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"

static mp_device_t *dev;
static mp_direct_t *d;

static void open_device(const char *spec) {
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
}

static void setup(void) {
  open_device("host:capacity=64M");
}

static void teardown(void) {
  if (d != NULL)
    cr_expect_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  d = NULL;
  mp_device_close(dev);
  dev = NULL;
}

static mp_stats_t stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  return s;
}

static size_t device_free_bytes(void) {
  size_t f, t;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  return f;
}

TestSuite(direct, .init = setup, .fini = teardown);

Test(direct, each_allocation_is_one_device_allocation) {
  size_t before = device_free_bytes();
  void *a, *b;
  cr_assert_eq(mp_direct_alloc(d, 1000, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, 3000, NULL, &b), MP_OK);
  cr_assert_neq(a, NULL);
  cr_assert_neq(b, NULL);
  cr_assert_neq(a, b);
  mp_stats_t s = stats();
  cr_assert_eq(s.device_alloc_count, 2);
  cr_assert_eq(s.alloc_count, 2);
  cr_assert_eq(s.allocated_bytes, 4000);
  cr_assert_eq(s.requested_bytes, 4000);
  cr_assert_eq(s.reserved_bytes, 4000);
  cr_assert_eq(s.live_blocks, 2);
  cr_assert_eq(s.largest_free_bytes, 0, "the direct allocator caches nothing");
  cr_assert_leq(device_free_bytes(), before - 4000);
}

Test(direct, memory_holds_data_written_through_the_device) {
  enum { N = 1 << 16 };
  unsigned char *host = malloc(N), *back = malloc(N);
  for (size_t i = 0; i < N; i++)
    host[i] = (unsigned char)(i * 7 + 3);
  void *p;
  cr_assert_eq(mp_direct_alloc(d, N, NULL, &p), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, p, host, N, NULL), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, back, p, N, NULL), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  cr_assert_eq(memcmp(host, back, N), 0);
  free(host);
  free(back);
}

Test(direct, zero_bytes_is_ok_with_null) {
  void *p = (void *)0x1;
  cr_assert_eq(mp_direct_alloc(d, 0, NULL, &p), MP_OK);
  cr_assert_eq(p, NULL);
  cr_assert_eq(stats().device_alloc_count, 0);
}

Test(direct, free_is_deferred_until_the_session_ends) {
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &p), MP_OK);
  size_t held = device_free_bytes();
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  mp_stats_t s = stats();
  cr_assert_eq(s.device_free_count, 0);
  cr_assert_eq(s.free_count, 1);
  cr_assert_eq(s.allocated_bytes, 0);
  cr_assert_eq(s.reserved_bytes, 1 << 20, "deferred blocks stay reserved");
  cr_assert_eq(s.free_bytes, 1 << 20);
  cr_assert_eq(s.free_blocks, 1);
  cr_assert_eq(device_free_bytes(), held, "nothing went back to the device");

  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  s = stats();
  cr_assert_eq(s.device_free_count, 1);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(s.free_blocks, 0);
  cr_assert_geq(device_free_bytes(), held + (1 << 20));
}

Test(direct, double_free_in_a_session_is_einval_and_changes_nothing) {
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  mp_stats_t before = stats();
  cr_assert_eq(mp_direct_free(d, p), MP_EINVAL);
  cr_assert_neq(strstr(mp_last_error(), "already freed"), NULL, "%s",
                mp_last_error());
  mp_stats_t after = stats();
  cr_assert_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  cr_assert_eq(stats().device_free_count, 1, "released exactly once");
}

Test(direct, free_after_the_session_released_it_is_einval) {
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_EINVAL);
  cr_assert_eq(stats().free_count, 1);
}

Test(direct, free_of_unknown_pointer_is_einval_and_changes_nothing) {
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  mp_stats_t before = stats();
  int local;
  cr_assert_eq(mp_direct_free(d, &local), MP_EINVAL);
  cr_assert_eq(mp_direct_free(d, (char *)p + 1), MP_EINVAL,
               "an interior pointer is not a block");
  mp_stats_t after = stats();
  cr_assert_eq(memcmp(&before, &after, sizeof before), 0);
}

/* A handle that is no stream of the device, or a destroyed stream: refused
 * with nothing allocated, as a pool refuses it (it was MP_OK before); the
 * device's own live streams and NULL are served. */
Test(direct, a_stream_that_is_none_of_the_devices_is_einval) {
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *p = NULL;
  cr_assert_eq(mp_direct_alloc(d, 4096, s, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  size_t before = device_free_bytes();
  uint64_t calls = stats().device_alloc_count;
  p = (void *)1;
  cr_expect_eq(mp_direct_alloc(d, 4096, s, &p), MP_EINVAL);
  cr_expect_eq(mp_direct_alloc(d, 4096, (mp_stream_t)0xdeadbeef, &p),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(p, (void *)1, "*out written on a refusal");
  cr_expect_eq(device_free_bytes(), before);
  cr_expect_eq(stats().device_alloc_count, calls);
  cr_expect_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_expect_eq(mp_direct_free(d, p), MP_OK);
}

Test(direct, free_of_null_is_ok) {
  cr_assert_eq(mp_direct_free(d, NULL), MP_OK);
  cr_assert_eq(stats().free_count, 0);
}

Test(direct, empty_session_is_ok) {
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  cr_assert_eq(stats().device_free_count, 0);
}

Test(direct, stats_keep_peaks_and_counts) {
  void *p[8];
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_direct_alloc(d, (size_t)(i + 1) * 1000, NULL, &p[i]),
                 MP_OK);
  for (int i = 0; i < 8; i += 2)
    cr_assert_eq(mp_direct_free(d, p[i]), MP_OK);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  mp_stats_t s = stats();
  size_t all = 36 * 1000, odd = (2 + 4 + 6 + 8) * 1000;
  cr_assert_eq(s.peak_allocated_bytes, all);
  cr_assert_eq(s.peak_requested_bytes, all);
  cr_assert_eq(s.peak_reserved_bytes, all);
  cr_assert_eq(s.allocated_bytes, odd);
  cr_assert_eq(s.reserved_bytes, odd);
  cr_assert_eq(s.alloc_count, 8);
  cr_assert_eq(s.free_count, 4);
  cr_assert_eq(s.device_alloc_count, 8);
  cr_assert_eq(s.device_free_count, 4);
  cr_assert_eq(s.live_blocks, 4);
  cr_assert_eq(s.oom_count, 0);
}

/* Found by address, not by scan: many blocks, freed in a scrambled order. */
Test(direct, many_blocks_are_tracked_and_released) {
  enum { N = 3000 };
  void **p = calloc(N, sizeof *p);
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_direct_alloc(d, 512, NULL, &p[i]), MP_OK);
  for (int i = 0; i < N; i++) {
    int j = (i * 1237) % N;
    cr_assert_eq(mp_direct_free(d, p[j]), MP_OK, "block %d", j);
  }
  for (int i = 0; i < N; i += 97)
    cr_assert_eq(mp_direct_free(d, p[i]), MP_EINVAL);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  mp_stats_t s = stats();
  cr_assert_eq(s.device_free_count, N);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(s.live_blocks, 0);
  free(p);
}

typedef struct {
  atomic_int done;
} flag_t;

static void slow_host_fn(void *arg) {
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  atomic_store(&((flag_t *)arg)->done, 1);
}

Test(direct, session_waits_for_work_queued_on_the_blocks_stream) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  enum { N = 4096 };
  unsigned char src[N], dst[N];
  memset(src, 0x5a, N);
  memset(dst, 0, N);
  void *p;
  flag_t flag = {0};
  cr_assert_eq(mp_direct_alloc(d, N, s, &p), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, p, src, N, s), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, slow_host_fn, &flag), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, dst, p, N, s), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  /* The block was given back only after the stream's work on it finished. */
  cr_assert_eq(atomic_load(&flag.done), 1);
  cr_assert_eq(memcmp(src, dst, N), 0);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(direct, out_of_memory_is_enomem_counted_and_explained) {
  void *p = (void *)0x1;
  cr_assert_eq(mp_direct_alloc(d, (size_t)1 << 30, NULL, &p), MP_ENOMEM);
  cr_assert_eq(p, (void *)0x1, "out untouched on failure");
  cr_assert_neq(mp_last_error()[0], '\0');
  mp_stats_t s = stats();
  cr_assert_eq(s.oom_count, 1);
  cr_assert_eq(s.alloc_count, 0);
  cr_assert_eq(s.reserved_bytes, 0);
}

Test(direct, full_device_ends_the_session_and_retries) {
  void *a, *b;
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_free(d, a), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &b), MP_OK,
               "the deferred 40M must be given back to make room: %s",
               mp_last_error());
  mp_stats_t s = stats();
  cr_assert_eq(s.device_free_count, 1);
  cr_assert_eq(s.oom_count, 0);
  cr_assert_eq(s.reserved_bytes, 40u << 20);
}

Test(direct, record_stream_accepts_only_live_blocks) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_record_stream(d, p, s), MP_OK);
  int local;
  cr_assert_eq(mp_direct_record_stream(d, &local, s), MP_EINVAL);
  cr_assert_eq(mp_direct_record_stream(d, NULL, s), MP_EINVAL);
  cr_assert_eq(mp_direct_record_stream(NULL, p, s), MP_EINVAL);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  cr_assert_eq(mp_direct_record_stream(d, p, s), MP_EINVAL);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(direct, bad_input_is_einval_on_every_call) {
  mp_direct_t *x = (mp_direct_t *)0x1;
  cr_assert_eq(mp_direct_create(NULL, &x), MP_EINVAL);
  cr_assert_eq(x, (mp_direct_t *)0x1);
  cr_assert_eq(mp_direct_create(dev, NULL), MP_EINVAL);
  void *p;
  cr_assert_eq(mp_direct_alloc(NULL, 16, NULL, &p), MP_EINVAL);
  cr_assert_eq(mp_direct_alloc(d, 16, NULL, NULL), MP_EINVAL);
  cr_assert_eq(mp_direct_free(NULL, (void *)0x1000), MP_EINVAL);
  cr_assert_eq(mp_direct_free_session(NULL), MP_EINVAL);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(NULL, &s), MP_EINVAL);
  cr_assert_eq(mp_direct_get_stats(d, NULL), MP_EINVAL);
  cr_assert_eq(mp_direct_destroy(NULL), MP_EINVAL);
  cr_assert_neq(strstr(mp_last_error(), "mp_direct_destroy"), NULL);
  cr_assert_eq(stats().alloc_count, 0);
}

/* A deferred block of 1 MiB and a live one of 2 MiB, returned. */
static void *one_deferred_one_live(void) {
  void *a, *b;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, 2 << 20, NULL, &b), MP_OK);
  cr_assert_eq(mp_direct_free(d, a), MP_OK);
  return b;
}

Test(direct, destroy_releases_live_and_deferred_blocks) {
  size_t before = device_free_bytes();
  (void)one_deferred_one_live();
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  d = NULL;
  cr_assert_eq(device_free_bytes(), before);
}

static void destroy_call(void *arg) {
  *(mp_status_t *)arg = mp_direct_destroy(d);
}

/* A destroy that cannot wait for the device (from a host function) fails
 * with nothing changed: it freed the allocator and went on to free blocks
 * the device then refused, so their memory was lost for good. */
Test(direct, destroy_that_cannot_wait_keeps_the_allocator_and_its_blocks) {
  size_t before = device_free_bytes();
  void *b = one_deferred_one_live();
  mp_stats_t was = stats();
  mp_status_t st = MP_OK;
  run_in_host_fn(dev, destroy_call, &st);
  cr_assert_eq(st, MP_EINVAL, "%s", mp_last_error());
  mp_stats_t now = stats();
  cr_expect_eq(memcmp(&was, &now, sizeof was), 0, "the stats changed");
  cr_assert_eq(mp_direct_free(d, b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  d = NULL;
  cr_assert_eq(device_free_bytes(), before, "device memory lost");
}

enum { THREADS = 4, ROUNDS = 300 };

static void *churn(void *arg) {
  (void)arg;
  void *mine[8] = {0};
  for (int r = 0; r < ROUNDS; r++) {
    int k = r % 8;
    if (mine[k] != NULL && mp_direct_free(d, mine[k]) != MP_OK)
      return (void *)1;
    if (mp_direct_alloc(d, 512 + (size_t)r, NULL, &mine[k]) != MP_OK)
      return (void *)1;
    if (r % 50 == 49 && mp_direct_free_session(d) != MP_OK)
      return (void *)1;
  }
  for (int k = 0; k < 8; k++)
    if (mp_direct_free(d, mine[k]) != MP_OK)
      return (void *)1;
  return NULL;
}

Test(direct, concurrent_threads_keep_counts_consistent) {
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, churn, NULL), 0);
  for (int i = 0; i < THREADS; i++) {
    void *ret;
    pthread_join(t[i], &ret);
    cr_assert_eq(ret, NULL, "thread %d failed: %s", i, mp_last_error());
  }
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  mp_stats_t s = stats();
  cr_assert_eq(s.alloc_count, THREADS * ROUNDS);
  cr_assert_eq(s.free_count, THREADS * ROUNDS);
  cr_assert_eq(s.device_free_count, THREADS * ROUNDS);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(s.allocated_bytes, 0);
}

/* A stream the device does not know is refused by record_stream as by
 * mp_direct_alloc (and by a pool's record_stream): it used to be ignored,
 * so the allocator interface accepted through "direct" a stream every
 * other kind refuses. */
Test(direct, record_stream_on_a_stream_that_is_none_of_the_devices_is_einval) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  void *p;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_expect_eq(mp_direct_record_stream(d, p, s), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "stream"), NULL, "%s", mp_last_error());
  cr_expect_eq(mp_direct_record_stream(d, p, NULL), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
}

/* An allocation that gave the session's memory back and retried counts in
 * alloc_retry_count, as a pool's does (it stayed 0). */
Test(direct, a_retry_after_ending_the_session_is_counted) {
  void *a, *b;
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_direct_free(d, a), MP_OK);
  cr_assert_eq(stats().alloc_retry_count, 0);
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats().alloc_retry_count, 1);
  cr_assert_eq(mp_direct_free(d, b), MP_OK);
}
