/* The host pool: page-locked buffers cached with the device pool's best
 * fit. A buffer freed while a copy on its stream is still held back by a
 * gate is not handed to any request, its own stream's included (the host
 * fills a buffer outside stream order), until the stream reaches the free; the
 * cap is MP_ELIMIT; bad pointers are MP_EINVAL and change nothing; stats, trim
 * and check follow the cache. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/stream_gate.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_host_pool_t *hp;
static mp_stream_t s1, s2;
static gate_t gate;

static void setup(void) {
  gate_init(&gate);
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
}

static void teardown(void) {
  gate_open(&gate);
  mp_stream_synchronize(dev, s1);
  mp_stream_synchronize(dev, s2);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
  gate_destroy(&gate);
}

static mp_stats_t stats(void) {
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  return st;
}

/* A staging buffer allocated for `owner`, filled with `byte` by the host,
 * and a copy of it into new device memory *dst queued on `copier` behind
 * the gate. */
static void *stage_gated_copy(mp_stream_t owner, mp_stream_t copier, size_t n,
                              int byte, void **dst) {
  void *stage;
  cr_assert_eq(mp_device_alloc(dev, n, dst), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, n, owner, &stage), MP_OK);
  memset(stage, byte, n);
  cr_assert_eq(mp_stream_launch_host(dev, copier, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, *dst, stage, n, copier), MP_OK);
  return stage;
}

TestSuite(host_pool_streams, .init = setup, .fini = teardown);

/* A staging buffer: the host fills it, a copy on s1 (held by the gate)
 * reads it into device memory, and the buffer is freed right after the copy
 * is queued. Another stream must not get it while the copy has not run, so
 * the copy moves what the host wrote. */
Test(host_pool_streams, content_survives_until_the_streams_copy_ran) {
  const size_t n = 256 * KiB;
  void *dst, *other;
  void *stage = stage_gated_copy(s1, s1, n, 0x5A, &dst);
  cr_assert_eq(mp_host_pool_free(hp, stage), MP_OK);
  /* Same size on s2 and on the host: neither may get the pending buffer. */
  cr_assert_eq(mp_host_pool_alloc(hp, n, s2, &other), MP_OK);
  cr_expect_neq(other, stage, "a buffer pending on s1 went to s2");
  memset(other, 0xEE, n);
  void *host_use;
  cr_assert_eq(mp_host_pool_alloc(hp, n, NULL, &host_use), MP_OK);
  cr_expect_neq(host_use, stage, "a buffer pending on s1 went to the host");
  memset(host_use, 0xEE, n);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  unsigned char *d = dst;
  for (size_t i = 0; i < n; i += 4 * KiB)
    cr_assert_eq(d[i], 0x5A, "byte %zu of the copy was overwritten", i);
  cr_expect_eq(d[n - 1], 0x5A);
  cr_expect_eq(mp_host_pool_free(hp, other), MP_OK);
  cr_expect_eq(mp_host_pool_free(hp, host_use), MP_OK);
  cr_expect_eq(mp_device_free(dev, dst), MP_OK);
}

/* The staging loop of every engine: the host fills a buffer allocated for
 * s, a copy on s reads it, the buffer is freed, and the next buffer for s
 * is filled by the host at once. The stream the buffer was freed on must
 * not get it back while that copy has not run: the host's writes are not
 * in s's order, and would reach the copy. */
static void next_request_leaves_the_pending_copy_alone(mp_stream_t s, size_t n,
                                                       int byte) {
  void *dst, *again;
  void *stage = stage_gated_copy(s, s, n, byte, &dst);
  cr_assert_eq(mp_host_pool_free(hp, stage), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, n, s, &again), MP_OK);
  cr_expect_neq(again, stage, "the stream got back a buffer its copy reads");
  memset(again, ~byte & 0xFF, n);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  unsigned char *d = dst;
  for (size_t i = 0; i < n; i += 4 * KiB)
    cr_assert_eq(d[i], byte, "the copy read byte %zu after the host's write",
                 i);
  cr_expect_eq(mp_host_pool_free(hp, again), MP_OK);
  cr_expect_eq(mp_device_free(dev, dst), MP_OK);
}

Test(host_pool_streams,
     same_stream_does_not_get_a_buffer_its_pending_copy_reads) {
  next_request_leaves_the_pending_copy_alone(s1, 256 * KiB, 0x5A);
}

/* The NULL stream is a stream like the others. */
Test(host_pool_streams, null_stream_copy_holds_its_buffer_back) {
  next_request_leaves_the_pending_copy_alone(NULL, 64 * KiB, 0x42);
}

/* Once the copy has run, the stream gets the buffer straight back (the cache
 * works) and no driver call is made. */
Test(host_pool_streams, same_stream_reuses_the_buffer_once_its_copy_ran) {
  const size_t n = 256 * KiB;
  void *dst, *again;
  void *stage = stage_gated_copy(s1, s1, n, 0x5A, &dst);
  cr_assert_eq(mp_host_pool_free(hp, stage), MP_OK);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  uint64_t calls = stats().device_alloc_count;
  cr_assert_eq(mp_host_pool_alloc(hp, n, s1, &again), MP_OK);
  cr_expect_eq(again, stage, "s1 did not get its finished buffer back");
  cr_expect_eq(stats().device_alloc_count, calls, "a driver call was made");
  cr_expect_eq(mp_host_pool_free(hp, again), MP_OK);
  cr_expect_eq(mp_device_free(dev, dst), MP_OK);
}

/* Once the copy has run, the buffer is reused by another stream (the cache
 * works) instead of a new driver call. */
Test(host_pool_streams, buffer_is_reused_once_the_stream_reached_the_free) {
  void *a, *b;
  cr_assert_eq(mp_host_pool_alloc(hp, 64 * KiB, s1, &a), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 1, 64 * KiB, s1), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  uint64_t calls = stats().device_alloc_count;
  cr_assert_eq(mp_host_pool_alloc(hp, 64 * KiB, s2, &b), MP_OK);
  cr_expect_eq(b, a);
  cr_expect_eq(stats().device_alloc_count, calls);
  cr_expect_eq(mp_host_pool_free(hp, b), MP_OK);
}

/* record_stream: a buffer allocated for s1 but also read by a copy on s2
 * stays away from s1 and the host until s2 reached the free. */
Test(host_pool_streams, recorded_stream_holds_the_buffer_back) {
  const size_t n = 128 * KiB;
  void *dst, *again;
  void *stage = stage_gated_copy(s1, s2, n, 0x33, &dst);
  cr_assert_eq(mp_host_pool_record_stream(hp, stage, s2), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, stage), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, n, NULL, &again), MP_OK);
  cr_expect_neq(again, stage, "a buffer still read on s2 was reused");
  memset(again, 0, n);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_expect_eq(((unsigned char *)dst)[n / 2], 0x33);
  cr_expect_eq(mp_host_pool_free(hp, again), MP_OK);
  cr_expect_eq(mp_device_free(dev, dst), MP_OK);
}

/* A stream the device does not know (destroyed already, or another
 * device's) is MP_EINVAL naming the call, and changes nothing: *out stays,
 * and no page-locked memory is taken. Before, the buffer was allocated
 * first and the stream refused after: the pool kept a new 2 MiB chunk
 * cached and *out was set to NULL. */
static void alloc_on_refused(mp_stream_t bad, const char *what) {
  mp_stats_t before = stats();
  void *p = (void *)0x1234;
  cr_expect_eq(mp_host_pool_alloc(hp, 4 * MiB, bad, &p), MP_EINVAL,
               "%s was accepted", what);
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_alloc: ", 20) == 0, "%s",
            mp_last_error());
  cr_expect_eq(p, (void *)0x1234, "%s: *out changed to %p", what, p);
  mp_stats_t after = stats();
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0,
               "%s: the refusal changed the stats (reserved %zu -> %zu)", what,
               before.reserved_bytes, after.reserved_bytes);
}

/* refused(s, what) for each stream the device does not know: a destroyed
 * one and another device's. */
static void on_unknown_streams(void (*refused)(mp_stream_t, const char *)) {
  mp_stream_t gone;
  cr_assert_eq(mp_stream_create(dev, &gone), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, gone), MP_OK);
  refused(gone, "a destroyed stream");
  mp_device_t *other;
  mp_stream_t foreign;
  cr_assert_eq(mp_device_open("host", &other), MP_OK);
  cr_assert_eq(mp_stream_create(other, &foreign), MP_OK);
  refused(foreign, "another device's stream");
  cr_expect_eq(mp_stream_destroy(other, foreign), MP_OK);
  mp_device_close(other);
}

Test(host_pool_streams, an_unknown_stream_is_refused_and_takes_nothing) {
  on_unknown_streams(alloc_on_refused);
  /* A good stream after them still works. */
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * MiB, s1, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_host_pool_free(hp, p), MP_OK);
}

/* record_stream of a stream the device does not know is refused as the
 * allocation refuses it: MP_EINVAL naming the call and the caller's device,
 * and nothing changes (the buffer stays live, its stats as they were).
 * Before, the message named neither: "stream 0x... is not a live stream of
 * device 'pinned(host)'", a device view the caller never opened. */
static void record_on_refused(mp_stream_t bad, const char *what) {
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * KiB, s1, &p), MP_OK);
  mp_stats_t before = stats();
  cr_expect_eq(mp_host_pool_record_stream(hp, p, bad), MP_EINVAL,
               "%s was accepted", what);
  const char *m = mp_last_error();
  cr_expect(strncmp(m, "mp_host_pool_record_stream: ", 28) == 0, "%s: %s", what,
            m);
  cr_expect(strstr(m, "pinned(") == NULL, "%s: %s", what, m);
  mp_stats_t after = stats();
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0,
               "%s: the refusal changed the stats", what);
  cr_expect_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

Test(host_pool_streams,
     record_of_an_unknown_stream_is_refused_naming_the_call) {
  on_unknown_streams(record_on_refused);
}
