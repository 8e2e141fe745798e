/* test_pool_never_waits.c - an allocation never waits for work it cannot
 * know will finish: not for the application's own work on its stream (a
 * gated host function holds it), not behind another thread's trim,
 * defragmentation, freeze or out-of-memory ladder that is inside a device
 * synchronization (virtual and plain pools), and not behind
 * a trim that waits for the very stream the allocating host function runs
 * on. Each case holds a gate closed until a watchdog opens it 20 s later;
 * the allocation must have returned while the gate was still closed. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static gate_t gate;
static pthread_t watchdog;

static void *open_later(void *arg) {
  (void)arg;
  struct timespec ts = {20, 0};
  nanosleep(&ts, NULL);
  gate_open(&gate);
  return NULL;
}

static bool gate_is_open(void) {
  pthread_mutex_lock(&gate.mu);
  bool o = gate.open;
  pthread_mutex_unlock(&gate.mu);
  return o;
}

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=2G", &dev), MP_OK, "%s",
               mp_last_error());
  gate_init(&gate);
}
static void teardown(void) {
  gate_open(&gate);
  mp_device_close(dev);
}
TestSuite(never_waits, .init = setup, .fini = teardown);

static void start_watchdog(void) {
  pthread_create(&watchdog, NULL, open_later, NULL);
  pthread_detach(watchdog);
}

static void settle_ms(long ms) {
  struct timespec ts = {0, ms * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static void settle(void) {
  settle_ms(50); /* let the other side block */
}

Test(never_waits,
     growth_does_not_wait_for_the_applications_work_on_its_stream) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, s, &a), MP_OK);
  /* A live block above a, so a's chunk cannot be grown into. */
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, s, &c), MP_OK);
  /* The application's kernel reads a until the gate opens. */
  start_watchdog();
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* Bigger than the free chunk: growth past the peak, with a free chunk
   * whose stream is busy. */
  cr_assert_eq(mp_pool_alloc(p, 128 * MiB, s, &b), MP_OK, "%s",
               mp_last_error());
  cr_expect(!gate_is_open(), "the allocation waited for the stream");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_stream_destroy(dev, s);
}

/* Another thread's call that synchronizes the device while a gated stream
 * holds it: trim, defragment, freeze, or an allocation that the pool's cap
 * sends down the out-of-memory ladder to its synchronize-and-trim rung. */
typedef enum { TRIM, DEFRAGMENT, FREEZE, LADDER } busy_what_t;
static const char *const busy_name[] = {"trim", "defragment", "freeze",
                                        "out-of-memory ladder"};

typedef struct busy {
  mp_pool_t *pool;
  mp_stream_t s;
  busy_what_t what;
  mp_status_t st;
  void *p; /* LADDER: its allocation */
} busy_t;

/* The ladder's request: over the cap until the free blocks are trimmed. */
#define LADDER_CAP     (512 * MiB)
#define LADDER_REQUEST (LADDER_CAP - 8 * MiB)

static void *busy_call(void *arg) {
  busy_t *b = arg;
  size_t moved;
  switch (b->what) {
  case TRIM: b->st = mp_pool_trim(b->pool, 0); break;
  case DEFRAGMENT: b->st = mp_pool_defragment(b->pool, b->s, &moved); break;
  case FREEZE: b->st = mp_pool_freeze(b->pool); break;
  case LADDER:
    b->st = mp_pool_alloc(b->pool, LADDER_REQUEST, b->s, &b->p);
    break;
  }
  return NULL;
}

static void growth_beside_a_sync(bool plain, busy_what_t what) {
  char opts[64];
  snprintf(opts, sizeof opts, "virtual=%d%s", plain ? 0 : 1,
           what == LADDER ? ",max_bytes=512M" : "");
  mp_pool_t *p = make_pool(dev, opts);
  mp_stream_t s, other;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  /* Something to trim, and something to move. */
  mp_handle_t *h[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc_movable(p, 8 * MiB, s, &h[i]), MP_OK);
  cr_assert_eq(mp_handle_free(h[0]), MP_OK);
  cr_assert_eq(mp_handle_free(h[2]), MP_OK);
  mp_stats_t before = stats(p);
  start_watchdog();
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &gate), MP_OK);
  busy_t b = {.pool = p, .s = s, .what = what};
  pthread_t t;
  pthread_create(&t, NULL, busy_call, &b);
  settle();
  /* The ladder's pool has room for this growth only beside what it holds. */
  size_t x_bytes = what == LADDER ? 16 * MiB : 256 * MiB;
  void *x;
  mp_stats_t mid = stats(p);
  /* The ladder is on its synchronize rung now (and waits there): waited
   * for (30 s at most), not taken for reached after settle()'s 50 ms,
   * which a loaded machine's busy thread can take longer to get to. */
  for (int i = 0; what == LADDER && i < 3000 &&
                  mid.alloc_retry_count == before.alloc_retry_count;
       i++) {
    settle_ms(10);
    mid = stats(p);
  }
  if (what == LADDER)
    cr_expect_gt(mid.alloc_retry_count, before.alloc_retry_count,
                 "%s: the ladder did not reach its synchronize rung", opts);
  size_t reserved = mid.reserved_bytes;
  cr_assert_eq(mp_pool_alloc(p, x_bytes, other, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_gt(stats(p).reserved_bytes, reserved,
               "the allocation did not grow the pool: the test proves nothing");
  cr_expect(!gate_is_open(), "%s %s: the allocation waited behind the sync",
            opts, busy_name[what]);
  gate_open(&gate);
  pthread_join(t, NULL);
  if (what == LADDER) {
    if (b.st == MP_OK)
      cr_assert_eq(mp_pool_free(p, b.p), MP_OK);
    else
      cr_expect_eq(b.st, MP_ELIMIT, "%s", mp_status_name(b.st));
  } else {
    cr_expect_eq(b.st, MP_OK, "%s", mp_last_error());
  }
  cr_assert_eq(mp_stream_synchronize(dev, other), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_handle_free(h[1]), MP_OK);
  cr_assert_eq(mp_handle_free(h[3]), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_stream_destroy(dev, s);
  mp_stream_destroy(dev, other);
}

Test(never_waits, growth_does_not_wait_behind_another_threads_trim) {
  growth_beside_a_sync(false, TRIM);
}
Test(never_waits, growth_does_not_wait_behind_a_plain_pools_trim) {
  growth_beside_a_sync(true, TRIM);
}
Test(never_waits, growth_does_not_wait_behind_another_threads_defragment) {
  growth_beside_a_sync(false, DEFRAGMENT);
}
Test(never_waits, growth_does_not_wait_behind_a_plain_pools_defragment) {
  growth_beside_a_sync(true, DEFRAGMENT);
}
Test(never_waits, growth_does_not_wait_behind_another_threads_freeze) {
  growth_beside_a_sync(false, FREEZE);
}
Test(never_waits, growth_does_not_wait_behind_a_plain_pools_freeze) {
  growth_beside_a_sync(true, FREEZE);
}
Test(never_waits, growth_does_not_wait_behind_another_threads_oom_ladder) {
  growth_beside_a_sync(false, LADDER);
}
Test(never_waits, growth_does_not_wait_behind_a_plain_pools_oom_ladder) {
  growth_beside_a_sync(true, LADDER);
}

/* A host function on s allocates (needing growth) while another thread's
 * trim waits for s. */
typedef struct hostalloc {
  mp_pool_t *pool;
  atomic_bool running, done;
  mp_status_t st;
  void *p;
} hostalloc_t;

static void alloc_from_host_fn(void *arg) {
  hostalloc_t *h = arg;
  atomic_store(&h->running, true);
  settle(); /* the trim is now waiting for this stream */
  h->st = mp_pool_alloc(h->pool, 256 * MiB, NULL, &h->p);
  atomic_store(&h->done, true);
}

static void *trim_call(void *arg) {
  mp_pool_trim((mp_pool_t *)arg, 0);
  return NULL;
}

Test(never_waits, host_function_allocating_beside_a_trim_does_not_deadlock) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 32 * MiB, s, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK); /* something to trim */
  hostalloc_t h = {.pool = p};
  cr_assert_eq(mp_stream_launch_host(dev, s, alloc_from_host_fn, &h), MP_OK);
  while (!atomic_load(&h.running))
    sched_yield();
  pthread_t t;
  pthread_create(&t, NULL, trim_call, p);
  for (int i = 0; i < 3000 && !atomic_load(&h.done); i++) /* 30 s */
    settle_ms(10);
  cr_assert(atomic_load(&h.done), "the host function's allocation hung");
  pthread_join(t, NULL);
  cr_expect(h.st == MP_OK || h.st == MP_EINVAL, "%s", mp_status_name(h.st));
  if (h.st == MP_OK)
    cr_assert_eq(mp_pool_free(p, h.p), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_stream_destroy(dev, s);
}
