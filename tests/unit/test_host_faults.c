/* test_host_faults.c - host memory for mempool's bookkeeping running out
 * (src/fault.c): for k = 0, 1, 2, ... the k-th host allocation of a call
 * fails; the call is MP_ENOMEM with "out of host memory" in mp_last_error(),
 * changes nothing the caller can see, leaks nothing (ASan), and succeeds
 * once the fault is disarmed. Covers the direct allocator (create, alloc
 * with live map growth, free with deferred-list growth, free_session), the
 * host pool (create), allocator specs (create), the pool's live map, and
 * the host device's own tables (open, streams, events, queued work). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

#define MAX_K 64

static mp_device_t *dev;

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  mp__fault_host_after(-1);
  mp_device_close(dev);
}

TestSuite(host_faults, .init = setup, .fini = teardown);

static size_t device_free(void) {
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_device_mem_info(dev, &free_b, &total), MP_OK);
  return free_b;
}

static void expect_host_enomem(mp_status_t st, const char *what, long k) {
  cr_expect_eq(st, MP_ENOMEM, "%s, host allocation %ld failing: %s", what, k,
               mp_status_string(st));
  /* "out of host memory", or, where the device's own tracking map had no
   * room and the device answered MP_ENOMEM, what the pool says of that. */
  cr_expect(strstr(mp_last_error(), "out of") != NULL &&
                strstr(mp_last_error(), "memory") != NULL,
            "%s, host allocation %ld failing: '%s'", what, k, mp_last_error());
}

/* Runs make(k) with host allocation k failing, for k = 0, 1, ... until a
 * run makes fewer than k + 1 host allocations (the fault is still armed
 * after it), and returns how many failing runs there were. make reports
 * MP_OK with its object made, or the status with nothing made. */
typedef mp_status_t (*make_fn)(void **out);
static long each_fault_on_create(make_fn make, void (*destroy)(void *),
                                 const char *what) {
  for (long k = 0; k < MAX_K; k++) {
    void *sentinel = &k, *obj = sentinel;
    mp__fault_host_after(k);
    mp_status_t st = make(&obj);
    bool pending = mp__fault_host_pending();
    mp__fault_host_after(-1);
    if (pending) {
      cr_assert_eq(st, MP_OK, "%s: %s", what, mp_last_error());
      destroy(obj);
      return k;
    }
    if (st == MP_OK) {
      /* The failure was absorbed (a cache, a retry): still a working
       * object. */
      destroy(obj);
      continue;
    }
    expect_host_enomem(st, what, k);
    cr_expect_eq(obj, sentinel, "%s: *out was written on failure", what);
  }
  cr_assert_fail("%s made more than %d host allocations", what, MAX_K);
  return MAX_K;
}

static mp_status_t make_direct(void **out) {
  return mp_direct_create(dev, (mp_direct_t **)out);
}
static void destroy_direct(void *d) {
  cr_expect_eq(mp_direct_destroy(d), MP_OK);
}

static mp_status_t make_host_pool(void **out) {
  return mp_host_pool_create(dev, NULL, (mp_host_pool_t **)out);
}
static void destroy_host_pool(void *hp) {
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK);
}

static const char *spec;
static mp_status_t make_allocator(void **out) {
  return mp_allocator_create(dev, spec, (mp_allocator_t **)out);
}
static void destroy_allocator(void *a) {
  cr_expect_eq(mp_allocator_destroy(a), MP_OK);
}

Test(host_faults, direct_create_fails_cleanly) {
  cr_expect_geq(
      each_fault_on_create(make_direct, destroy_direct, "mp_direct_create"), 1);
}

Test(host_faults, host_pool_create_fails_cleanly) {
  cr_expect_geq(each_fault_on_create(make_host_pool, destroy_host_pool,
                                     "mp_host_pool_create"),
                2);
}

Test(host_faults, allocator_create_fails_cleanly) {
  const char *specs[] = {"pool", "direct", "child:bytes=4M"};
  for (size_t i = 0; i < 3; i++) {
    spec = specs[i];
    cr_expect_geq(each_fault_on_create(make_allocator, destroy_allocator, spec),
                  1, "%s", spec);
  }
}

/* Stats equal but for the counters a failed call may move (API.md: "apart
 * from counters"): oom_count (the device answered MP_ENOMEM, its own
 * tracking map having no room) and alloc_retry_count. */
static void expect_same_stats(mp_stats_t a, mp_stats_t b, const char *what,
                              long k) {
  a.oom_count = b.oom_count = 0;
  a.alloc_retry_count = b.alloc_retry_count = 0;
  cr_expect_eq(memcmp(&a, &b, sizeof a), 0,
               "%s, host allocation %ld failing: stats changed", what, k);
}

typedef mp_status_t (*alloc_fn)(void *obj, void **out);
typedef mp_status_t (*stats_fn)(void *obj, mp_stats_t *out);
typedef mp_status_t (*free_fn)(void *obj, void *p);

/* Allocates 40 blocks of 4 KiB, each with host allocation k failing for k
 * = 0, 1, ... (the device's tracking table, then the allocator's live map,
 * src/ptrmap.c, which grows at the first block and past half full): every
 * failure is MP_ENOMEM, gives the device memory back and changes no
 * counter but oom_count. Returns the failures seen. */
static long alloc_under_faults(void *obj, alloc_fn alloc, free_fn release,
                               stats_fn stats, const char *what, void **p) {
  long failures = 0;
  for (size_t n = 0; n < 40; n++) {
    for (long k = 0;; k++) {
      cr_assert_lt(k, MAX_K);
      mp_stats_t before, after;
      cr_assert_eq(stats(obj, &before), MP_OK);
      size_t dev_before = device_free();
      void *q = &n;
      mp__fault_host_after(k);
      mp_status_t st = alloc(obj, &q);
      bool pending = mp__fault_host_pending();
      mp__fault_host_after(-1);
      if (pending || st == MP_OK) {
        cr_assert_eq(st, MP_OK, "%s: %s", what, mp_last_error());
        p[n] = q;
        if (pending)
          break;
        /* Absorbed (a fallback: the pool grows without a virtual range
         * when the device cannot reserve one): give it back and fail a
         * later one. */
        cr_assert_eq(release(obj, q), MP_OK, "%s", mp_last_error());
        continue;
      }
      failures++;
      expect_host_enomem(st, what, k);
      cr_expect_eq(q, &n, "%s: *out written on failure", what);
      cr_assert_eq(stats(obj, &after), MP_OK);
      expect_same_stats(before, after, what, k);
      cr_expect_eq(device_free(), dev_before, "%s: device memory kept", what);
    }
  }
  return failures;
}

static mp_status_t direct_alloc(void *d, void **out) {
  return mp_direct_alloc(d, 4096, NULL, out);
}
static mp_status_t direct_release(void *d, void *p) {
  return mp_direct_free(d, p);
}
static mp_status_t direct_stats(void *d, mp_stats_t *out) {
  return mp_direct_get_stats(d, out);
}

Test(host_faults, direct_alloc_without_host_memory_changes_nothing) {
  mp_direct_t *d;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK);
  void *p[40];
  long failures = alloc_under_faults(d, direct_alloc, direct_release,
                                     direct_stats, "mp_direct_alloc", p);
  /* The device's table of allocations (doubling from 16) grows at blocks
   * 1, 17 and 33, our map at 1 and 33. */
  cr_expect_eq(failures, 5, "%ld", failures);
  for (size_t i = 0; i < 40; i++)
    cr_expect_eq(mp_direct_free(d, p[i]), MP_OK);
  cr_expect_eq(mp_direct_destroy(d), MP_OK);
}

/* A free whose deferred list cannot grow leaves the block live; a session
 * whose batch cannot be made releases nothing and keeps its blocks. */
Test(host_faults, direct_free_and_session_fail_cleanly) {
  mp_direct_t *d;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK);
  void *p, *q;
  cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, 8192, NULL, &q), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_direct_get_stats(d, &before), MP_OK);
  mp__fault_host_after(0);
  expect_host_enomem(mp_direct_free(d, p), "mp_direct_free", 0);
  mp__fault_host_after(-1);
  cr_assert_eq(mp_direct_get_stats(d, &after), MP_OK);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(mp_direct_record_stream(d, p, NULL), MP_OK, "still live");
  cr_assert_eq(mp_direct_free(d, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_free(d, q), MP_OK, "%s", mp_last_error());

  cr_assert_eq(mp_direct_get_stats(d, &before), MP_OK);
  size_t dev_before = device_free();
  mp__fault_host_after(0);
  expect_host_enomem(mp_direct_free_session(d), "mp_direct_free_session", 0);
  mp__fault_host_after(-1);
  cr_assert_eq(mp_direct_get_stats(d, &after), MP_OK);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(device_free(), dev_before, "nothing released");
  cr_expect_eq(after.free_blocks, 2);
  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_get_stats(d, &after), MP_OK);
  cr_expect_eq(after.free_blocks, 0);
  cr_expect_eq(after.reserved_bytes, 0);
  cr_expect_eq(mp_direct_destroy(d), MP_OK);
}

static mp_status_t pool_alloc(void *pool, void **out) {
  return mp_pool_alloc(pool, 4096, NULL, out);
}
static mp_status_t pool_release(void *pool, void *p) {
  return mp_pool_free(pool, p);
}
static mp_status_t pool_stats(void *pool, mp_stats_t *out) {
  return mp_pool_get_stats(pool, out);
}

/* The pool's stream table and live map, and the device's tables as the
 * pool grows: the pool says MP_ENOMEM and is as it was, except where the
 * device could not reserve a virtual range, which the pool absorbs by
 * growing without one. */
Test(host_faults, pool_alloc_without_host_memory_changes_nothing) {
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *p[40];
  long failures = alloc_under_faults(pool, pool_alloc, pool_release, pool_stats,
                                     "mp_pool_alloc", p);
  cr_expect_geq(failures, 1, "%ld", failures);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  for (size_t i = 0; i < 40; i++)
    cr_expect_eq(mp_pool_free(pool, p[i]), MP_OK);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
}

/* ---- the host device's own tables (src/device) ---------------------------
 * Opening the device, creating streams and events, and queueing work make
 * host allocations of their own; each failing one is MP_ENOMEM and leaves
 * nothing behind (ASan sees a leak or a half-made object). */
static mp_status_t make_device(void **out) {
  return mp_device_open("host:capacity=64M", (mp_device_t **)out);
}
static void destroy_device(void *d) {
  mp_device_close(d);
}

static mp_status_t make_stream(void **out) {
  return mp_stream_create(dev, (mp_stream_t *)out);
}
static void destroy_stream(void *s) {
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
}

static mp_status_t make_event(void **out) {
  return mp_event_create(dev, (mp_event_t *)out);
}
static void destroy_event(void *e) {
  cr_expect_eq(mp_event_destroy(dev, e), MP_OK);
}

Test(host_faults, host_device_open_and_its_streams_and_events_fail_cleanly) {
  /* The device, the backend's state and its null stream at least. */
  cr_expect_geq(
      each_fault_on_create(make_device, destroy_device, "mp_device_open(host)"),
      3);
  cr_expect_geq(
      each_fault_on_create(make_stream, destroy_stream, "mp_stream_create"), 1);
  cr_expect_geq(
      each_fault_on_create(make_event, destroy_event, "mp_event_create"), 1);
}

static atomic_int host_fn_runs;
static void count_run(void *arg) {
  (void)arg;
  atomic_fetch_add(&host_fn_runs, 1);
}

static mp_stream_t work_stream;
static mp_event_t work_event;
static mp_status_t launch_count(void) {
  return mp_stream_launch_host(dev, work_stream, count_run, NULL);
}
static mp_status_t record_event(void) {
  return mp_event_record(dev, work_event, work_stream);
}

/* Runs call() with host allocation k failing, k = 0, 1, ... until a run no
 * longer reaches the fault; returns how many calls succeeded. */
static int each_fault_on_call(mp_status_t (*call)(void), const char *what) {
  int ok = 0;
  for (long k = 0; k < MAX_K; k++) {
    mp__fault_host_after(k);
    mp_status_t st = call();
    bool pending = mp__fault_host_pending();
    mp__fault_host_after(-1);
    if (st == MP_OK)
      ok++;
    else
      expect_host_enomem(st, what, k);
    if (pending) {
      cr_assert_eq(st, MP_OK, "%s: %s", what, mp_last_error());
      cr_expect_geq(k, 1, "%s made no host allocation", what);
      return ok;
    }
  }
  cr_assert_fail("%s made more than %d host allocations", what, MAX_K);
  return ok;
}

Test(host_faults, work_that_cannot_be_queued_is_not_queued) {
  cr_assert_eq(mp_stream_create(dev, &work_stream), MP_OK);
  cr_assert_eq(mp_event_create(dev, &work_event), MP_OK);
  int launched = each_fault_on_call(launch_count, "mp_stream_launch_host");
  cr_assert_eq(mp_stream_synchronize(dev, work_stream), MP_OK);
  cr_expect_eq(atomic_load(&host_fn_runs), launched,
               "host functions run %d, launches that succeeded %d",
               atomic_load(&host_fn_runs), launched);
  each_fault_on_call(record_event, "mp_event_record");
  cr_expect_eq(mp_event_synchronize(dev, work_event), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_event_query(dev, work_event), MP_OK);
  cr_expect_eq(mp_event_destroy(dev, work_event), MP_OK);
  cr_expect_eq(mp_stream_destroy(dev, work_stream), MP_OK);
}

/* mp_host_pool_alloc for a stream the host pool has not met, with host
 * allocation k failing, after n other streams filled part of the pool's
 * stream table: a refusal keeps no page-locked memory. Before, the buffer
 * came first (growing a chunk for it) and the stream's record after, so
 * a stream table that could not grow left the new chunk cached. */
Test(host_faults, host_pool_alloc_for_a_new_stream_keeps_no_chunk) {
  enum { NS = 40 };
  mp_stream_t s[NS];
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  long refused = 0;
  for (int n = 0; n < NS - 1; n++) {
    for (long k = 0; k < MAX_K; k++) {
      mp_host_pool_t *hp;
      cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK);
      for (int i = 0; i < n; i++) {
        void *x;
        cr_assert_eq(mp_host_pool_alloc(hp, 512, s[i], &x), MP_OK);
        cr_assert_eq(mp_host_pool_free(hp, x), MP_OK);
      }
      mp_stats_t before, after;
      cr_assert_eq(mp_host_pool_get_stats(hp, &before), MP_OK);
      void *sentinel = &k, *q = sentinel;
      mp__fault_host_after(k);
      mp_status_t st = mp_host_pool_alloc(hp, 8 << 20, s[n], &q);
      bool pending = mp__fault_host_pending();
      mp__fault_host_after(-1);
      cr_assert_eq(mp_host_pool_get_stats(hp, &after), MP_OK);
      if (st == MP_OK) {
        cr_expect_eq(mp_host_pool_free(hp, q), MP_OK);
      } else {
        refused++;
        expect_host_enomem(st, "mp_host_pool_alloc", k);
        cr_expect_eq(q, sentinel, "*out written on failure");
        cr_expect_eq(after.reserved_bytes, before.reserved_bytes,
                     "%d streams met, host allocation %ld failing: the "
                     "refusal kept %zu bytes of page-locked memory",
                     n, k, after.reserved_bytes - before.reserved_bytes);
      }
      cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
      cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
      if (pending)
        break;
    }
  }
  cr_expect_geq(refused, NS - 1, "every stream's allocation was refused once");
  for (int i = 0; i < NS; i++)
    cr_expect_eq(mp_stream_destroy(dev, s[i]), MP_OK);
}
