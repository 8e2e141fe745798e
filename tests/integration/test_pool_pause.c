/* test_pool_pause.c - mp_pool_pause / mp_pool_resume on the host device:
 * pause gives the memory back so that another pool can use it, resume maps
 * the same addresses again with the content kept byte for byte (or not),
 * every other call is MP_EBUSY while paused, and a resume that finds no
 * room (another tenant) or a failing device stays paused with nothing lost
 * or leaked. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/dump_json.h"
#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

enum { N = 6 };
static const size_t sizes[N] = {3 * MiB, 100000, 7 * MiB, 4096, 12 * MiB, 512};

static void fill(void *p, size_t n, unsigned tag) {
  for (size_t i = 0; i < n; i++)
    ((unsigned char *)p)[i] = (unsigned char)(i * 31 + tag);
}

static void expect_filled(const void *p, size_t n, unsigned tag) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != (unsigned char)(i * 31 + tag))
      cr_assert_fail("block %u differs at byte %zu", tag, i);
}

static mp_pool_t *loaded(mp_device_t *dev, void **v) {
  mp_pool_t *p = make_pool(dev, NULL);
  for (unsigned i = 0; i < N; i++) {
    cr_assert_eq(mp_pool_alloc(p, sizes[i], NULL, &v[i]), MP_OK, "%s",
                 mp_last_error());
    fill(v[i], sizes[i], i);
  }
  /* A free block between live ones too. */
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  v[1] = NULL;
  return p;
}

/* A host function on one of the pool's streams that asks the pool what a
 * paused pool answers (dump, snapshot, check), while a pause waits for
 * that stream: the pause goes through and so do the host function's
 * calls. The pause waited for the stream with a device call marked in
 * flight, which those calls wait for: each waited for the other for ever
 * (a pool with arenas too). */
typedef struct {
  mp_pool_t *pool;
  mp_status_t dump, check;
} asking_t;

static void ask_the_pool_late(void *arg) {
  asking_t *q = arg;
  struct timespec t = {0, 100 * 1000 * 1000};
  nanosleep(&t, NULL);
  FILE *null = fopen("/dev/null", "w");
  q->dump = mp_pool_dump(q->pool, null, "text");
  fclose(null);
  q->check = mp_pool_check(q->pool);
}

static void pause_beside_a_host_function_asking(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *p = make_pool(dev, opts);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, s, &a), MP_OK, "%s", mp_last_error());
  asking_t q = {p, MP_EINVAL, MP_EINVAL};
  cr_assert_eq(mp_stream_launch_host(dev, s, ask_the_pool_late, &q), MP_OK);
  cr_expect_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s: %s", opts,
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_expect_eq(q.dump, MP_OK, "%s: the host function's dump", opts);
  cr_expect(q.check == MP_OK || q.check == MP_EBUSY,
            "%s: the host function's check said %s", opts,
            mp_status_name(q.check));
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(p, a), MP_OK);
  check(p);
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  mp_stream_destroy(dev, s);
  mp_device_close(dev);
}

Test(pool_pause, a_host_function_asking_the_pool_does_not_stop_a_pause,
     .timeout = 60) {
  pause_beside_a_host_function_asking(NULL);
  pause_beside_a_host_function_asking("arenas=2");
}

Test(pool_pause, frees_the_device_for_another_pool_and_resumes_with_content) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  size_t free_before = free_bytes(dev);
  mp_stats_t held = stats(p);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.largest_free_bytes, 0);
  /* "segments (or mapped chunks) held now" (stats.h): none; it kept the
   * count from before the pause. */
  cr_expect_eq(s.segment_count, 0, "%zu segments while paused",
               s.segment_count);
  /* Nor does the cache hold a free block to serve from (free_bytes 0 too).
   * Failed before: free_blocks counted the blocks the pause unmapped. */
  cr_assert_gt(held.free_blocks, 0, "the test needs free blocks");
  cr_expect_eq(s.free_bytes, 0);
  cr_expect_eq(s.free_blocks, 0, "%llu free blocks while paused",
               (unsigned long long)s.free_blocks);
  /* The dump says what the stats say: nothing served while paused (it gave
   * the largest free block the pause had unmapped). */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_dump(p, f, "json"), MP_OK, "%s", mp_last_error());
  fclose(f);
  cr_expect(strstr(text, "\"largest_free_bytes\":0,") != NULL, "%s", text);
  free(text);
  cr_expect_eq(free_bytes(dev), free_before + held.reserved_bytes);
  /* Another tenant uses what the pause gave back. */
  mp_pool_t *other = make_pool(dev, NULL);
  void *big;
  cr_assert_eq(mp_pool_alloc(other, 56 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  fill(big, 56 * MiB, 99);
  cr_assert_eq(mp_pool_free(other, big), MP_OK);
  cr_assert_eq(mp_pool_destroy(other), MP_OK);

  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  s = stats(p);
  cr_expect_eq(s.reserved_bytes, held.reserved_bytes);
  cr_expect_eq(s.free_bytes, held.free_bytes);
  cr_expect_eq(s.segment_count, held.segment_count);
  cr_expect_eq(s.free_blocks, held.free_blocks);
  for (unsigned i = 0; i < N; i++)
    if (v[i] != NULL)
      expect_filled(v[i], sizes[i], i); /* same address, same bytes */
  check(p);
  for (unsigned i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  check(p);
  mp_pool_destroy(p);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
  mp_device_close(dev);
}

/* A paused pool's dump says what its stats say: its segment holds 0 bytes
 * (reserved_bytes 0, the memory given back), marked paused, and keeps
 * every block record the resume brings back, the live ones live
 * (allocated_bytes and live_blocks still count them). Failed before: the
 * segment said the bytes it held before the pause, with reserved_bytes
 * 0 and segment_count 0 beside it. */
Test(pool_pause, a_paused_pools_dump_says_its_segment_holds_nothing) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  mp_stats_t held = stats(p);
  size_t n, np;
  char *json = dump_of(p, "json");
  cr_expect_eq(json_segments(json, &n, &np), held.reserved_bytes, "%s", json);
  cr_expect_eq(np, 0, "%s", json);
  free(json);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s = stats(p);
  cr_assert_eq(s.reserved_bytes, 0);
  json = dump_of(p, "json");
  cr_expect_eq(json_segments(json, &n, &np), s.reserved_bytes, "%s", json);
  cr_expect_geq(n, 1, "no segment listed: %s", json);
  cr_expect_eq(np, n, "a segment not marked paused: %s", json);
  cr_expect(strstr(json, "\"reserved_bytes\":0,") != NULL, "%s", json);
  char want[64];
  for (unsigned i = 0; i < N; i++)
    if (v[i] != NULL) {
      snprintf(want, sizeof want, "{\"addr\":\"%p\",", v[i]);
      const char *b = strstr(json, want);
      cr_expect(b != NULL &&
                    strstr(b, "\"free\":false") == strstr(b, "\"free\":"),
                "block %u (%p) not listed live: %s", i, v[i], json);
    }
  free(json);
  char *text = dump_of(p, "text");
  cr_expect(strstr(text, " virtual size 0 paused\n") != NULL, "%s", text);
  free(text);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  json = dump_of(p, "json");
  cr_expect_eq(json_segments(json, &n, &np), held.reserved_bytes, "%s", json);
  cr_expect_eq(np, 0, "%s", json);
  free(json);
  text = dump_of(p, "text");
  cr_expect(strstr(text, "paused") == NULL, "%s", text);
  free(text);
  for (unsigned i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_pause, without_keep_content_addresses_stay_and_pool_works) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  for (unsigned i = 0; i < N; i++)
    if (v[i] != NULL) {
      fill(v[i], sizes[i], 7); /* mapped and writable at the same place */
      cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
    }
  void *x;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_pause, every_other_call_is_ebusy_while_paused) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(p, 8192, NULL, &h), MP_OK);
  void *hp = mp_handle_ptr(h);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK);
  mp_stats_t before = stats(p);
  void *x, *two[2];
  size_t sz[2] = {512, 512};
  mp_pool_t *child;
  cr_expect_eq(mp_pool_alloc(p, 4096, NULL, &x), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "paused"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc_contiguous(p, 2, sz, NULL, two), MP_EBUSY);
  cr_expect_eq(mp_pool_alloc_movable(p, 4096, NULL, &h), MP_EBUSY);
  cr_expect_eq(mp_pool_free(p, v[0]), MP_EBUSY);
  cr_expect_eq(mp_pool_record_stream(p, v[0], NULL), MP_EBUSY);
  cr_expect_eq(mp_handle_free(h), MP_EBUSY);
  cr_expect_eq(mp_pool_trim(p, 0), MP_EBUSY);
  cr_expect_eq(mp_pool_defragment(p, NULL, NULL), MP_EBUSY);
  cr_expect_eq(mp_pool_freeze(p), MP_EBUSY);
  cr_expect_eq(mp_pool_create_child(p, MiB, &child), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "mp_pool_create_child: the pool is "
                                    "paused") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(p), MP_EBUSY);
  size_t held = 7;
  cr_expect_eq(mp_pool_ipc_poll(p, &held), MP_EBUSY);
  cr_expect_eq(held, 7, "a refused poll sets nothing");
  cr_expect_eq(mp_pool_pause(p, 0), MP_EBUSY);
  /* The cap is no setting a paused pool takes (pool.h). */
  cr_expect_eq(mp_pool_set_max_fraction(p, 0.001), MP_EBUSY);
  cr_expect_eq(mp_handle_ptr(h), hp);
  mp_stats_t after = stats(p);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.free_count, before.free_count);
  FILE *null = fopen("/dev/null", "w");
  cr_expect_eq(mp_pool_dump(p, null, "torch"), MP_OK);
  fclose(null);
  cr_assert_eq(mp_pool_resume(p), MP_OK);
  cr_expect_eq(mp_pool_resume(p), MP_EINVAL);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

/* mp_pool_set_max_fraction below what the pool holds keeps that memory
 * until trimmed; a pause and resume then map it back with the content, and
 * only growth stops at the new cap. Failed before: every resume was
 * MP_ELIMIT (the cap below what was paused), and trim, free and a higher
 * cap were MP_EBUSY while paused: the pool stayed paused for good. */
Test(pool_pause, a_cap_lowered_below_what_the_pool_holds_still_resumes) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  mp_stats_t held = stats(p);
  cr_assert_gt(held.reserved_bytes, MiB, "the test needs more than 1 MiB");
  /* 1/64 of 64 MiB: 1 MiB, below what the pool holds. */
  cr_assert_eq(mp_pool_set_max_fraction(p, 1.0 / 64), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, held.reserved_bytes);
  cr_expect_eq(s.free_bytes, held.free_bytes);
  for (unsigned i = 0; i < N; i++)
    if (v[i] != NULL)
      expect_filled(v[i], sizes[i], i);
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 16 * MiB, NULL, &x), MP_ELIMIT,
               "growth stops at the lowered cap");
  check(p);
  for (unsigned i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 0, "trimmed at last");
  mp_pool_destroy(p);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
  mp_device_close(dev);
}

/* A cap raised after the pool grew (mp_pool_set_max_fraction, PyTorch's
 * set_per_process_memory_fraction) still lets it pause: its virtual range
 * was reserved at twice the cap of the moment, the pool outgrew it into
 * plain segments, and every pause after was MP_ENOTSUP. The range is now
 * sized from the device. With arenas too (each arena's range). */
static void raised_cap_pauses(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *p = make_pool(dev, opts);
  void *x, *y;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  fill(x, 4 * MiB, 1);
  cr_assert_eq(mp_pool_set_max_fraction(p, 1.0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 24 * MiB, NULL, &y), MP_OK, "%s",
               mp_last_error());
  fill(y, 24 * MiB, 2);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s: %s", opts,
               mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_filled(x, 4 * MiB, 1);
  expect_filled(y, 24 * MiB, 2);
  check(p);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(dev);
}

Test(pool_pause, a_cap_raised_after_growth_still_pauses) {
  raised_cap_pauses("max_fraction=0.125");
  raised_cap_pauses("max_fraction=0.125,arenas=2");
}

Test(pool_pause, resume_without_room_stays_paused_and_loses_nothing) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK);
  size_t free_paused = free_bytes(dev);
  mp_pool_t *other = make_pool(dev, NULL);
  void *big;
  cr_assert_eq(mp_pool_alloc(other, 56 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_resume(p), MP_ENOMEM);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_expect_eq(mp_pool_alloc(p, 4096, NULL, &big), MP_EBUSY, "still paused");
  cr_assert_eq(mp_pool_destroy(other), MP_OK);
  cr_expect_eq(free_bytes(dev), free_paused, "the failed resume leaked");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  for (unsigned i = 0; i < N; i++)
    if (v[i] != NULL)
      expect_filled(v[i], sizes[i], i);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_pause, a_device_failing_halfway_through_resume_leaves_it_paused) {
  /* Small steps, so the range has several chunks to map. */
  mp_device_t *probe = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(probe, v);
  uint64_t maps = stats(p).device_alloc_count;
  mp_pool_destroy(p);
  mp_device_close(probe);
  cr_assert_geq(maps, 2, "the test needs several chunks");
  /* The same run on a device whose allocation #(maps + 2) fails: the
   * pause's host buffer is #(maps + 1), so resume maps one chunk and fails
   * on the second. */
  char spec[64];
  snprintf(spec, sizeof spec, "host:capacity=64M,fail_after=%llu",
           (unsigned long long)maps + 3);
  mp_device_t *dev = open_dev(spec);
  p = loaded(dev, v);
  cr_assert_eq(stats(p).device_alloc_count, maps);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  size_t free_paused = free_bytes(dev);
  cr_expect_neq(mp_pool_resume(p), MP_OK);
  cr_expect_eq(free_bytes(dev), free_paused, "the failed resume leaked");
  cr_expect_eq(mp_pool_alloc(p, 4096, NULL, &v[1]), MP_EBUSY);
  /* Destroying a paused pool gives everything back. */
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
  mp_device_close(dev);
}

/* A pool without a virtual range (virtual=0) is refused also while it is
 * empty: it can never keep an address (an empty one was accepted and then
 * refused every allocation until resumed, and its next pause, once it
 * held memory, was MP_ENOTSUP). */
Test(pool_pause, plain_segments_child_pools_and_bad_input_are_refused) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *plain = make_pool(dev, "virtual=0");
  cr_expect_eq(mp_pool_pause(plain, 0), MP_ENOTSUP, "an empty plain pool");
  void *x;
  cr_assert_eq(mp_pool_alloc(plain, MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_pause(plain, 0), MP_ENOTSUP);
  cr_expect_eq(mp_pool_alloc(plain, MiB, NULL, &x), MP_OK, "not paused");
  mp_pool_destroy(plain);
  mp_pool_t *p = make_pool(dev, NULL), *child;
  cr_assert_eq(mp_pool_create_child(p, 4 * MiB, &child), MP_OK);
  cr_expect_eq(mp_pool_pause(p, 0), MP_EBUSY);
  cr_expect_eq(mp_pool_pause(child, 0), MP_ENOTSUP);
  mp_pool_destroy(child);
  cr_expect_eq(mp_pool_pause(p, 0x80), MP_EINVAL);
  cr_expect_eq(mp_pool_pause(NULL, 0), MP_EINVAL);
  cr_expect_eq(mp_pool_resume(NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_resume(p), MP_EINVAL);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

/* A virtual pool whose cap is no whole number of granules (max_bytes=21M:
 * 10 granules of 2 MiB and 1 MiB more) takes the last MiB as a plain
 * segment of the request's size, the one shape a pause cannot keep. Fills
 * the pool to its cap that way: *big in the range, *small in the plain
 * segment (opts: more options, e.g. arenas). */
static mp_pool_t *filled_past_the_granules(mp_device_t *dev, const char *opts,
                                           void **big, void **small) {
  char o[96];
  snprintf(o, sizeof o, "max_bytes=21M%s%s", opts ? "," : "", opts ? opts : "");
  mp_pool_t *p = make_pool(dev, o);
  cr_assert_eq(mp_pool_alloc(p, 20 * MiB, NULL, big), MP_OK, "%s",
               mp_last_error());
  fill(*big, 20 * MiB, 1);
  cr_assert_eq(mp_pool_alloc(p, 512 * 1024, NULL, small), MP_OK, "%s",
               mp_last_error());
  fill(*small, 512 * 1024, 2);
  return p;
}

/* Frees big, destroys p and closes dev, which must have all its memory. */
static void finish_filled(mp_device_t *dev, mp_pool_t *p, void *big) {
  cr_assert_eq(mp_pool_free(p, big), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
  mp_device_close(dev);
}

/* Sleep mode near the cap: the plain segment taken there holds no live
 * block any more, so the pause gives it back with the chunks and succeeds
 * (it was MP_ENOTSUP, "no virtual memory, or virtual=0", on a virtual
 * pool); the resume maps the chunks only. With arenas too. */
static void plain_segment_freed_pauses(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *big, *small;
  mp_pool_t *p = filled_past_the_granules(dev, opts, &big, &small);
  cr_assert_gt(stats(p).segment_count, 1, "%s: the test needs a plain segment",
               opts ? opts : "");
  cr_assert_eq(mp_pool_free(p, small), MP_OK);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s: %s",
               opts ? opts : "", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_expect_eq(free_bytes(dev), 64 * MiB, "the plain segment went back too");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_filled(big, 20 * MiB, 1);
  cr_expect_eq(stats(p).reserved_bytes, 20 * MiB, "the chunks only");
  check(p);
  /* The pool still grows to its cap afterwards. */
  cr_assert_eq(mp_pool_alloc(p, 512 * 1024, NULL, &small), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, small), MP_OK);
  finish_filled(dev, p, big);
}

Test(pool_pause, a_free_plain_segment_taken_near_the_cap_goes_back_at_pause) {
  plain_segment_freed_pauses(NULL);
  plain_segment_freed_pauses("arenas=2");
  plain_segment_freed_pauses("arenas=2,history=300");
}

/* A live block in such a plain segment: the pause is refused and changes
 * nothing, and its message names the cause (the cap, not whole granules)
 * and the ways out, not "no virtual memory, or virtual=0". */
static void plain_segment_live_refused(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *big, *small;
  mp_pool_t *p = filled_past_the_granules(dev, opts, &big, &small);
  mp_stats_t before = stats(p);
  cr_expect_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_ENOTSUP);
  const char *why = mp_last_error();
  cr_expect(strstr(why, "virtual=0") == NULL, "%s: %s", opts ? opts : "", why);
  cr_expect(strstr(why, "granule") != NULL && strstr(why, "cap") != NULL &&
                strstr(why, "free") != NULL,
            "%s: %s", opts ? opts : "", why);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(s.segment_count, before.segment_count);
  expect_filled(big, 20 * MiB, 1);
  expect_filled(small, 512 * 1024, 2);
  check(p);
  /* Freeing it is the way out. */
  cr_assert_eq(mp_pool_free(p, small), MP_OK);
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  finish_filled(dev, p, big);
}

Test(pool_pause, a_live_block_in_a_plain_segment_near_the_cap_says_why) {
  plain_segment_live_refused(NULL);
  plain_segment_live_refused("arenas=2");
}

/* pausable=1: a pool that must stay pausable takes no plain segment near
 * its cap; the request that only a plain segment could serve is
 * MP_ELIMIT, its message saying why, and the pool pauses with its blocks
 * live. With arenas too. */
static void pausable_pool_stays_pausable(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  char o[96];
  snprintf(o, sizeof o, "max_bytes=21M,pausable=1%s%s", opts ? "," : "",
           opts ? opts : "");
  mp_pool_t *p = make_pool(dev, o);
  void *big, *small;
  cr_assert_eq(mp_pool_alloc(p, 20 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  fill(big, 20 * MiB, 1);
  cr_expect_eq(mp_pool_alloc(p, 512 * 1024, NULL, &small), MP_ELIMIT, "%s", o);
  cr_expect(strstr(mp_last_error(), "pausable") != NULL, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 20 * MiB, "%s: whole granules only", o);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s: %s", o,
               mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  expect_filled(big, 20 * MiB, 1);
  check(p);
  finish_filled(dev, p, big);
}

Test(pool_pause, a_pausable_pool_takes_no_plain_segment_near_its_cap) {
  pausable_pool_stays_pausable(NULL);
  pausable_pool_stays_pausable("arenas=2,history=300");
}

/* The report's case: two threads churn near a cap that is no whole number
 * of granules on a pool with arenas and a history; each arena takes plain
 * segments at its edge. Once both have freed all they hold, the pool
 * pauses (it was MP_ENOTSUP, "no virtual memory, or virtual=0"). */
typedef struct {
  mp_pool_t *p;
  unsigned seed;
} churner_t;

static void *churn_near_the_cap(void *arg) {
  churner_t *c = arg;
  void *v[64] = {NULL};
  for (int it = 0; it < 4000; it++) {
    int i = rand_r(&c->seed) % 64;
    size_t bytes = (size_t)(rand_r(&c->seed) % 2048 + 1) * 1024;
    if (v[i] != NULL) {
      cr_assert_eq(mp_pool_free(c->p, v[i]), MP_OK);
      v[i] = NULL;
    } else if (mp_pool_alloc(c->p, bytes, NULL, &v[i]) != MP_OK) {
      v[i] = NULL; /* MP_ELIMIT at the cap */
    }
  }
  for (int i = 0; i < 64; i++)
    if (v[i] != NULL)
      cr_assert_eq(mp_pool_free(c->p, v[i]), MP_OK);
  return NULL;
}

Test(pool_pause, threads_that_churned_near_the_cap_and_freed_all_pause) {
  mp_device_t *dev = open_dev("host:capacity=256M");
  mp_pool_t *p = make_pool(dev, "max_bytes=33M,arenas=2,history=300");
  /* Until some plain segment (not whole granules) is left: the churn's
   * timing decides where the arenas' edges fall. */
  for (unsigned round = 0; round < 20; round++) {
    churner_t c[2] = {{p, 2 * round + 1}, {p, 2 * round + 2}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_create(&t[i], NULL, churn_near_the_cap, &c[i]), 0);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], NULL);
    if (stats(p).reserved_bytes % (2 * MiB) != 0)
      break;
  }
  cr_assert_neq(stats(p).reserved_bytes % (2 * MiB), 0,
                "no plain segment left by the churn");
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(free_bytes(dev), 256 * MiB);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes % (2 * MiB), 0, "the chunks only");
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(free_bytes(dev), 256 * MiB);
  mp_device_close(dev);
}

Test(pool_pause, peaks_reset_while_paused_cover_what_resume_maps_again) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  void *v[N];
  mp_pool_t *p = loaded(dev, v);
  mp_stats_t held = stats(p);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_reset_peaks(p), MP_OK);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, held.reserved_bytes);
  cr_expect_geq(s.peak_reserved_bytes, s.reserved_bytes,
                "peak %zu below reserved %zu", s.peak_reserved_bytes,
                s.reserved_bytes);
  check(p);
  for (unsigned i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

/* Racing pauses: worker threads call into the pool (never touching its
 * memory, which a pause takes away) while the test's thread pauses and
 * resumes it over and over. Every call must be MP_OK or MP_EBUSY, and the
 * pool must end consistent. */
typedef struct {
  mp_pool_t *p;
  mp_device_t *dev;
  _Atomic int *stop;
  _Atomic long done; /* calls made */
  int bad;
  char why[200]; /* the first bad result */
} worker_t;

/* Counts a result that is neither MP_OK nor MP_EBUSY, keeping the first;
 * MP_EBUSY yields the processor to the pausing thread. */
static void expect_ok_or_busy(worker_t *w, mp_status_t st, const char *call) {
  if (st == MP_EBUSY)
    sched_yield();
  if (st == MP_OK || st == MP_EBUSY)
    return;
  if (w->bad++ == 0)
    snprintf(w->why, sizeof w->why, "%s: %d %s", call, st, mp_last_error());
}

/* Under ThreadSanitizer every byte a kept content copies is checked, and a
 * round takes some 100 times longer: the races are the same in fewer
 * rounds, and the test binary must stay within ctest's timeout (at 40
 * rounds and 300 calls it took 148 to 354 s here, 2026-12-05, and past
 * ctest's 600 s in one CI run on a loaded machine). */
#if defined(__SANITIZE_THREAD__)
#define RACE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RACE_TSAN 1
#endif
#endif
#ifdef RACE_TSAN
enum { RACE_ROUNDS = 20, RACE_CALLS = 150 };
#else
enum { RACE_ROUNDS = 300, RACE_CALLS = 2000 };
#endif

/* Runs nthreads (at most 4) threads of fn on a fresh pool (options opts)
 * while pausing and resuming it: RACE_ROUNDS rounds, and until every thread
 * has made RACE_CALLS calls. */
static void race_pauses(void *(*fn)(void *), unsigned nthreads,
                        const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=512M");
  mp_pool_t *p = make_pool(dev, opts);
  _Atomic int stop = 0;
  worker_t w[4];
  pthread_t t[4];
  cr_assert_leq(nthreads, 4);
  for (unsigned i = 0; i < nthreads; i++) {
    w[i] = (worker_t){.p = p, .dev = dev, .stop = &stop};
    cr_assert_eq(pthread_create(&t[i], NULL, fn, &w[i]), 0);
  }
  int paused = 0;
  for (int round = 0;; round++) {
    bool enough = round >= RACE_ROUNDS;
    for (unsigned i = 0; i < nthreads; i++)
      enough = enough && atomic_load(&w[i].done) >= RACE_CALLS;
    if (enough)
      break;
    mp_status_t st = mp_pool_pause(p, round % 2 ? MP_PAUSE_KEEP_CONTENT : 0);
    if (st == MP_OK) {
      paused++;
      cr_assert_eq(mp_pool_resume(p), MP_OK, "round %d: %s", round,
                   mp_last_error());
    } else {
      cr_assert_eq(st, MP_ENOTSUP, "round %d: %d %s", round, st,
                   mp_last_error());
    }
  }
  atomic_store(&stop, 1);
  for (unsigned i = 0; i < nthreads; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(w[i].bad, 0, "thread %u: %d bad results, first %s", i,
                 w[i].bad, w[i].why);
  }
  cr_expect_gt(paused, 0);
  check(p);
  cr_expect_eq(stats(p).live_blocks, 0);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

/* Allocates on two streams, records and frees. */
static void *churn(void *arg) {
  worker_t *w = arg;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(w->dev, &s), MP_OK);
  void *held[8] = {0};
  for (unsigned i = 0; !atomic_load(w->stop); i++) {
    atomic_fetch_add(&w->done, 1);
    unsigned k = i % 8;
    mp_status_t st;
    if (held[k] != NULL) {
      expect_ok_or_busy(w, st = mp_pool_free(w->p, held[k]), "mp_pool_free");
      if (st == MP_EBUSY)
        continue;
      held[k] = NULL;
    }
    size_t n = 4096 + (size_t)((i * 7919u) % 2048) * 1024;
    void *x;
    st = mp_pool_alloc(w->p, n, k % 2 ? s : NULL, &x);
    expect_ok_or_busy(w, st, "mp_pool_alloc");
    if (st != MP_OK)
      continue;
    expect_ok_or_busy(w, mp_pool_record_stream(w->p, x, s),
                      "mp_pool_record_stream");
    held[k] = x;
  }
  for (unsigned k = 0; k < 8; k++)
    while (held[k] != NULL && mp_pool_free(w->p, held[k]) == MP_EBUSY)
      ;
  mp_stream_synchronize(w->dev, s);
  mp_stream_destroy(w->dev, s);
  return NULL;
}

/* The allocation's out-of-memory ladder drops the lock (waiting for another
 * thread's growth, for pending blocks, for a synchronization): a pause
 * running then must not leave it a block in unmapped memory, nor let it map
 * a chunk into the paused range. */
Test(pool_pause, allocations_racing_pauses_get_ebusy_and_map_nothing) {
  race_pauses(churn, 3, NULL);
}

/* The same on a pool with arenas: each thread in an arena of its own,
 * every arena paused and resumed (a thread's first allocation while paused
 * makes no arena), each arena's ladder dropping its lock as above. */
Test(pool_pause,
     allocations_on_arenas_racing_pauses_get_ebusy_and_map_nothing) {
  race_pauses(churn, 3, "arenas=4");
}

/* Allocates movable blocks, frees them and defragments. */
static void *defrag_churn(void *arg) {
  worker_t *w = arg;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(w->dev, &s), MP_OK);
  mp_handle_t *h[8] = {0};
  for (unsigned i = 0; !atomic_load(w->stop); i++) {
    atomic_fetch_add(&w->done, 1);
    unsigned k = i % 8;
    mp_status_t st;
    if (h[k] != NULL) {
      expect_ok_or_busy(w, st = mp_handle_free(h[k]), "mp_handle_free");
      if (st == MP_EBUSY)
        continue;
      h[k] = NULL;
    }
    if (k % 4 == 3) {
      expect_ok_or_busy(w, mp_pool_defragment(w->p, s, NULL),
                        "mp_pool_defragment");
      continue;
    }
    size_t n = 4096 + (size_t)((i * 7919u) % 1024) * 1024;
    st = mp_pool_alloc_movable(w->p, n, s, &h[k]);
    expect_ok_or_busy(w, st, "mp_pool_alloc_movable");
    if (st != MP_OK)
      h[k] = NULL;
  }
  for (unsigned k = 0; k < 8; k++)
    while (h[k] != NULL && mp_handle_free(h[k]) == MP_EBUSY)
      ;
  mp_stream_synchronize(w->dev, s);
  mp_stream_destroy(w->dev, s);
  return NULL;
}

/* mp_pool_defragment synchronizes the pool's streams with the lock dropped:
 * a pause running then must not leave it copying into unmapped memory. */
Test(pool_pause, defragmentation_racing_pauses_is_ebusy_and_copies_nothing) {
  race_pauses(defrag_churn, 2, NULL);
}

/* An allocation that cannot be served (the device is full) while pauses
 * run: its ladder drops the lock (the failing device call, the
 * synchronization, defragmentation) and a pause may run meanwhile. A
 * request answered MP_EBUSY did not fail for lack of memory: oom_count
 * (PyTorch's num_ooms) must count only the MP_ENOMEM answers. */
typedef struct {
  mp_pool_t *p;
  _Atomic int *stop;
  _Atomic long busy, ooms; /* read by the pausing thread */
  long miscounted, other;
  mp_status_t other_st;
} oom_racer_t;

static void *alloc_too_much(void *arg) {
  oom_racer_t *r = arg;
  while (!atomic_load(r->stop)) {
    mp_stats_t before, after;
    mp_pool_get_stats(r->p, &before);
    void *x;
    mp_status_t st = mp_pool_alloc(r->p, 48 * MiB, NULL, &x);
    mp_pool_get_stats(r->p, &after);
    uint64_t counted = after.oom_count - before.oom_count;
    if (st == MP_EBUSY) {
      atomic_fetch_add(&r->busy, 1);
      r->miscounted += counted != 0;
      sched_yield();
    } else if (st == MP_ENOMEM) {
      atomic_fetch_add(&r->ooms, 1);
      r->miscounted += counted != 1;
    } else {
      r->other++;
      r->other_st = st;
      if (st == MP_OK)
        mp_pool_free(r->p, x);
    }
  }
  return NULL;
}

Test(pool_pause, an_allocation_answered_ebusy_by_a_pause_counts_no_oom) {
  /* Each device call takes 200 us: the ladder's lock drops are wide. */
  mp_device_t *dev = open_dev("host:capacity=64M,latency_us=200");
  mp_pool_t *p = make_pool(dev, NULL);
  void *big;
  cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  _Atomic int stop = 0;
  oom_racer_t r = {.p = p, .stop = &stop};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_too_much, &r), 0);
  for (int round = 0;
       round < 400 || atomic_load(&r.busy) + atomic_load(&r.ooms) < 400;
       round++) {
    cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "round %d: %s", round,
                 mp_last_error());
    sched_yield();
    cr_assert_eq(mp_pool_resume(p), MP_OK, "round %d: %s", round,
                 mp_last_error());
    sched_yield();
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  cr_expect_eq(r.other, 0, "%ld answers neither MP_EBUSY nor MP_ENOMEM (%d)",
               r.other, r.other_st);
  cr_expect_eq(r.miscounted, 0,
               "%ld of %ld MP_EBUSY and %ld MP_ENOMEM answers moved oom_count "
               "wrongly",
               r.miscounted, atomic_load(&r.busy), atomic_load(&r.ooms));
  cr_expect_eq(stats(p).oom_count, (uint64_t)atomic_load(&r.ooms));
  cr_assert_eq(mp_pool_free(p, big), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}
