/* A pool called from a host function (mp_stream_launch_host,
 * cuLaunchHostFunc: "The host function must not make any CUDA API calls",
 * cuda.h) answers at once, and a refused call changes nothing.
 *
 * The hang: another thread's free gives a plain segment back
 * (release_threshold), and that device free waits for the host functions
 * queued on the streams (cuMemFree "may perform implicit synchronization",
 * cuda.h; the host device's free synchronizes the device), the running one
 * too, while it holds the pool's device call in flight (inflight, the lock
 * dropped). An allocation at the cap from the host function went down the
 * out-of-memory ladder, whose growth waited for that device call
 * (mp__segment_grow: mp__pool_wait_idle); a trim's synchronization waited
 * for it too (mp__pool_wait_sync). Neither returned. (A pool with arenas:
 * test_pool_arenas_reclaim_host_function.c; its trim is refused here.)
 * White-box: the host function watches pool->inflight for the release's device
 * call. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

enum call {
  CALL_ALLOC,
  CALL_TRIM,
  CALL_CHECK,
  CALL_DUMP,
  CALL_DEFRAG,
  CALL_PAUSE
};

typedef struct {
  mp_pool_t *pool;
  enum call call;
  size_t bytes;      /* CALL_ALLOC: asked; CALL_TRIM: kept */
  bool beside;       /* call once another thread's device call is in flight */
  bool saw_inflight; /* it was, at the call */
  mp_stats_t before, after; /* around the call, from the host function */
  bool stats_failed;        /* either read failed (no assert off the main
                               thread: Criterion's run there) */
  mp_status_t st;
  char why[512];
  void *p;
  long wrote; /* CALL_DUMP: bytes written */
} call_t;

/* The host function: (beside) waits at most 30 s for the release's device
 * call (pool->inflight, read under the lock that is dropped around it),
 * then makes its call, the stats read around it. */
static void call_from_host_fn(void *v) {
  call_t *c = v;
  for (int ms = 0;; ms++) {
    mp__pool_lock(c->pool);
    c->saw_inflight = c->pool->inflight;
    mp__pool_unlock(c->pool);
    if (c->saw_inflight || !c->beside || ms == 30000)
      break;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  mp_status_t got = mp_pool_get_stats(c->pool, &c->before);
  FILE *f = NULL;
  switch (c->call) {
  case CALL_ALLOC: c->st = mp_pool_alloc(c->pool, c->bytes, NULL, &c->p); break;
  case CALL_TRIM: c->st = mp_pool_trim(c->pool, c->bytes); break;
  case CALL_CHECK: c->st = mp_pool_check(c->pool); break;
  case CALL_DUMP:
    f = tmpfile();
    c->st = f != NULL ? mp_pool_dump(c->pool, f, "json") : MP_EIO;
    c->wrote = f != NULL ? ftell(f) : -1;
    if (f != NULL)
      fclose(f);
    break;
  case CALL_DEFRAG: c->st = mp_pool_defragment(c->pool, NULL, NULL); break;
  case CALL_PAUSE: c->st = mp_pool_pause(c->pool, 0); break;
  }
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
  if (mp_pool_get_stats(c->pool, &c->after) != MP_OK || got != MP_OK)
    c->stats_failed = true;
}

static void *blocks[4];

/* Four 2 MiB blocks, each a plain segment of its own (more than half of
 * segment_bytes), the last freed: cached, above release_threshold (the
 * next free looks for memory to give back before its own block joins). */
static mp_pool_t *four_segments_one_cached(mp_device_t *dev, const char *cap) {
  char opts[128];
  snprintf(opts, sizeof opts, "%s,release_threshold=1M,virtual=0", cap);
  mp_pool_t *pool = make_pool(dev, opts);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &blocks[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_free(pool, blocks[3]), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool);
  cr_assert_eq(s.segment_count, 4, "the test needs plain segments");
  cr_assert_eq(s.free_bytes, 2 * MiB, "the test needs one segment cached");
  return pool;
}

/* Runs c from a host function on a stream of dev; with c->beside, while
 * this thread frees blocks[2], which gives blocks[3]'s cached segment back
 * first (above release_threshold): a device free that waits for the host
 * function. A hang there ends in ctest's timeout (no Criterion .timeout
 * here: with tests run in parallel its timers leaked 48 bytes in the runner
 * under LeakSanitizer in 5 runs of 6). */
static void run_call(mp_device_t *dev, call_t *c) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, s, call_from_host_fn, c), MP_OK, "%s",
               mp_last_error());
  if (c->beside) {
    cr_expect_eq(mp_pool_free(c->pool, blocks[2]), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq(stats(c->pool).segment_count, 3, "no segment given back");
  }
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_not(c->stats_failed, "the host function read no stats");
  if (c->beside)
    cr_expect(c->saw_inflight, "the release's device call was not in flight "
                               "at the call: the test needs it");
  else
    cr_expect_not(c->saw_inflight, "a device call in flight");
}

/* The pool runs on afterwards, and goes. */
static void finish(mp_device_t *dev, mp_pool_t *pool, call_t *c, int live) {
  if (c->call == CALL_ALLOC && c->st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, c->p), MP_OK, "%s", mp_last_error());
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < live; i++)
    cr_assert_eq(mp_pool_free(pool, blocks[i]), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* What the call changed in the stats (only oom_count may differ: set to
 * before's by the caller when the answer is an out of memory). */
static void expect_stats_unchanged(const call_t *c) {
  cr_expect_eq(c->after.reserved_bytes, c->before.reserved_bytes);
  cr_expect_eq(c->after.segment_count, c->before.segment_count);
  cr_expect_eq(c->after.free_bytes, c->before.free_bytes);
  cr_expect_eq(c->after.device_alloc_count, c->before.device_alloc_count);
  cr_expect_eq(c->after.device_free_count, c->before.device_free_count);
  cr_expect_eq(c->after.alloc_retry_count, c->before.alloc_retry_count,
               "the host function's call counted a retry it cannot make");
  cr_expect_eq(memcmp(&c->after, &c->before, sizeof c->after), 0,
               "the stats changed");
}

/* call (bytes: asked, or kept) from a host function while the release
 * runs, in a pool made with opts: want, the message holding says; the
 * pool runs on; returns what a dump wrote. (An allocation: the ladder's growth
 * waited for the release, which waited for the host function.) */
static long call_beside_a_release(enum call call, size_t bytes,
                                  const char *opts, mp_status_t want,
                                  const char *says) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = four_segments_one_cached(dev, opts);
  call_t c = {.pool = pool, .call = call, .bytes = bytes, .beside = true};
  run_call(dev, &c);
  cr_expect_eq(c.st, want, "%s: %s", mp_status_name(c.st), c.why);
  cr_expect_neq(strstr(c.why, says), NULL, "%s", c.why);
  finish(dev, pool, &c, 2);
  return c.wrote;
}

static void alloc_beside_a_release(const char *cap, mp_status_t want,
                                   const char *says) {
  (void)call_beside_a_release(CALL_ALLOC, 4 * MiB, cap, want, says);
}

/* At the cap (8 MiB reserved): MP_ELIMIT, as anywhere. */
Test(pool_host_function_no_wait, alloc_at_the_cap_beside_a_release_is_elimit) {
  alloc_beside_a_release("max_bytes=8M", MP_ELIMIT, "pool max_bytes");
}

/* Below the cap: growth is a device call the host function may not make,
 * so the answer is the device's refusal, not a wait for the release. */
Test(pool_host_function_no_wait,
     alloc_below_the_cap_beside_a_release_is_refused) {
  alloc_beside_a_release("max_bytes=32M", MP_EINVAL,
                         "growing the pool: called from a host function");
}

/* Nothing in flight: at the cap the answer is MP_ELIMIT, and the ladder
 * runs no rung that synchronizes or gives memory back (device calls a host
 * function may not make): nothing changes but the out-of-memory count. */
Test(pool_host_function_no_wait,
     alloc_at_the_cap_changes_nothing_but_oom_count) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = four_segments_one_cached(dev, "max_bytes=8M");
  call_t c = {.pool = pool, .call = CALL_ALLOC, .bytes = 4 * MiB};
  run_call(dev, &c);
  cr_expect_eq(c.st, MP_ELIMIT, "%s: %s", mp_status_name(c.st), c.why);
  cr_expect_neq(strstr(c.why, "pool max_bytes"), NULL, "%s", c.why);
  cr_expect_eq(c.after.oom_count, c.before.oom_count + 1);
  c.after.oom_count = c.before.oom_count;
  expect_stats_unchanged(&c);
  finish(dev, pool, &c, 3);
}

/* A trim while the release runs: its synchronization waited for the
 * release's device call. A trim gives memory back by device calls: from a
 * host function it is refused. */
Test(pool_host_function_no_wait, trim_beside_a_release_is_refused) {
  (void)call_beside_a_release(CALL_TRIM, 0, "max_bytes=8M", MP_EINVAL,
                              "mp_pool_trim: called from a host function");
}

/* A trim from a host function of a pool made with opts, nothing in
 * flight: refused, and nothing changes (the cached segment stays). */
static void trim_refused(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = four_segments_one_cached(dev, opts);
  call_t c = {.pool = pool, .call = CALL_TRIM, .bytes = 0};
  run_call(dev, &c);
  cr_expect_eq(c.st, MP_EINVAL, "%s: %s", mp_status_name(c.st), c.why);
  cr_expect_neq(strstr(c.why, "mp_pool_trim: called from a host function"),
                NULL, "%s", c.why);
  expect_stats_unchanged(&c);
  cr_expect_eq(c.after.free_bytes, 2 * MiB, "the cached segment went");
  finish(dev, pool, &c, 3);
}

Test(pool_host_function_no_wait, trim_refused_changes_nothing) {
  trim_refused("max_bytes=8M");
}

/* So does one of a pool with arenas (every arena's trim synchronizes). */
Test(pool_host_function_no_wait, trim_with_arenas_refused_changes_nothing) {
  trim_refused("max_bytes=32M,arenas=2");
}

/* A check or a dump waited for the release's device call to end, to see
 * the pool at rest; from a host function that call may be waiting for,
 * MP_EBUSY instead (a dump writes nothing). Defragmentation and pause,
 * device work (copies, unmaps) that waited for the release first, are
 * refused from a host function. */
Test(pool_host_function_no_wait,
     looks_and_device_work_beside_a_release_answer) {
  static const struct {
    enum call call;
    mp_status_t want;
    const char *says;
  } calls[] = {
      {CALL_CHECK, MP_EBUSY, "mp_pool_check: called from a host function "},
      {CALL_DUMP, MP_EBUSY, "mp_pool_dump: called from a host function "},
      {CALL_DEFRAG, MP_EINVAL, "mp_pool_defragment: called from a host "},
      {CALL_PAUSE, MP_EINVAL, "mp_pool_pause: called from a host function"},
  };
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    long wrote = call_beside_a_release(calls[i].call, 0, "max_bytes=32M",
                                       calls[i].want, calls[i].says);
    if (calls[i].call == CALL_DUMP)
      cr_expect_eq(wrote, 0, "the refused dump wrote %ld bytes", wrote);
  }
}

/* Nothing in flight: a host function may look at the pool (no device call,
 * no wait), and the look changes nothing. */
static void look_at_rest(enum call call) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = four_segments_one_cached(dev, "max_bytes=32M");
  call_t c = {.pool = pool, .call = call};
  run_call(dev, &c);
  cr_expect_eq(c.st, MP_OK, "%s: %s", mp_status_name(c.st), c.why);
  expect_stats_unchanged(&c);
  finish(dev, pool, &c, 3);
}

Test(pool_host_function_no_wait, check_at_rest_passes) {
  look_at_rest(CALL_CHECK);
}

Test(pool_host_function_no_wait, dump_at_rest_writes) {
  look_at_rest(CALL_DUMP);
}
