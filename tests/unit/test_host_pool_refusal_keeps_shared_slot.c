/* test_host_pool_refusal_keeps_shared_slot.c - an mp_host_pool_alloc that
 * made its stream's slot and is then refused takes the slot back only
 * when no other call in flight relies on it.
 *
 * Thread A allocates on a stream the pool has not met: it makes the slot,
 * then the device fails its page-locked memory. Thread B allocates on
 * that stream meanwhile: it finds the slot made, and waits for A's growth
 * (one at a time) before it grows. Before, A's refusal took the slot back
 * under B (nothing used it yet), so that B's record of the buffer made it
 * again (asking the device about the stream once more, and refused where
 * host memory had run out meanwhile). Now the slot stays while B is in
 * flight, and B's buffer uses it; when B is refused too, the slot goes
 * with the last of them, as a single refused call's does.
 *
 * The interleaving is fixed, not timed: A's device call waits until B is
 * asleep in the pool (waiting for A's growth, past its stream check), and
 * B's waits until A's call returned. White-box: a copy of the host
 * backend's operations (host_alloc and stream_kind wrapped), threads told
 * apart by a thread-local role. A fails with MP_EDRIVER (a device's own
 * failure), which the pool answers at once, without the retries an
 * out-of-memory answer gets (those would wait for B's growth). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mempool/host_pool.h>

#include "../support/device_helpers.h"
#include "../support/host_pool_streams.h"
#include "device/backend.h"

#define MiB     ((size_t)1 << 20)
#define WAIT_NS 30000000000LL /* 30 s: a hook's wait before it gives up */

enum { ROLE_MAIN, ROLE_A, ROLE_B };

static mp_device_t *dev;
static const mp__backend_t *host_ops;
static mp__backend_t ops; /* dev's: host_ops' but host_alloc, stream_kind */
static mp_host_pool_t *hp;
static mp_stream_t s, w;   /* w: the warm-up's */
static mp_stream_t target; /* the stream both threads allocate on */
static _Thread_local int role;
static atomic_bool a_in_alloc, a_done, b_started, b_refuses;
static atomic_int b_tid;
static atomic_uint b_asked; /* B's questions to the device about target */
static atomic_bool a_gave_up, b_gave_up;

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Whether thread tid of this process sleeps (state S: blocked in the
 * kernel, here on the pool's wait for A's growth). */
static bool asleep(int tid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *end = strrchr(buf, ')'); /* after the thread's name */
  return end != NULL && end[1] == ' ' && end[2] == 'S';
}

/* Polls until cond() holds or WAIT_NS passed; false then. */
static bool wait_for(bool (*cond)(void)) {
  long long until = now_ns() + WAIT_NS;
  while (!cond()) {
    if (now_ns() > until)
      return false;
    usleep(1000);
  }
  return true;
}

static bool b_waits_in_pool(void) {
  return atomic_load(&b_started) && asleep(atomic_load(&b_tid));
}

static bool a_returned(void) {
  return atomic_load(&a_done);
}

static mp_status_t hooked_host_alloc(mp_device_t *d, size_t bytes, void **out) {
  if (role == ROLE_A) {
    atomic_store(&a_in_alloc, true);
    if (!wait_for(b_waits_in_pool))
      atomic_store(&a_gave_up, true);
    return mp__fail(MP_EDRIVER, "fake host_alloc fails %zu bytes", bytes);
  }
  if (role == ROLE_B) {
    if (!wait_for(a_returned))
      atomic_store(&b_gave_up, true);
    if (atomic_load(&b_refuses))
      return mp__fail(MP_EDRIVER, "fake host_alloc fails %zu bytes", bytes);
  }
  return host_ops->host_alloc(d, bytes, out);
}

static int hooked_stream_kind(mp_device_t *d, mp_stream_t h) {
  if (role == ROLE_B && h == target)
    atomic_fetch_add(&b_asked, 1);
  return host_ops->stream_kind(d, h);
}

static void setup(void) {
  dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.host_alloc = hooked_host_alloc;
  ops.stream_kind = hooked_stream_kind;
  dev->ops = &ops;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &w), MP_OK, "%s", mp_last_error());
  /* The pool's own stream gets its slot at the first call: made here,
   * on w, so that the counts below move only with target's. */
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, w, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, w), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}

TestSuite(host_pool_refusal_keeps_shared_slot, .init = setup, .fini = teardown);

/* The streams the pool knows now. */
static unsigned streams_known(void) {
  return host_pool_streams_known(hp);
}

typedef struct call {
  int role;
  mp_status_t st;
  void *p;
} call_t;

static void *run_call(void *arg) {
  call_t *c = arg;
  role = c->role;
  if (role == ROLE_B) {
    atomic_store(&b_tid, (int)syscall(SYS_gettid));
    atomic_store(&b_started, true);
  }
  c->st = mp_host_pool_alloc(hp, 8 * MiB, target, &c->p);
  if (role == ROLE_A)
    atomic_store(&a_done, true);
  return NULL;
}

static bool a_allocates(void) {
  return atomic_load(&a_in_alloc);
}

/* A then B on target, interleaved as the file's comment says. */
static void race(call_t *a, call_t *b) {
  pthread_t ta, tb;
  *a = (call_t){.role = ROLE_A};
  *b = (call_t){.role = ROLE_B};
  cr_assert_eq(pthread_create(&ta, NULL, run_call, a), 0);
  cr_assert(wait_for(a_allocates), "A never reached the device");
  cr_assert_eq(pthread_create(&tb, NULL, run_call, b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  cr_assert(!atomic_load(&a_gave_up), "B never waited in the pool");
  cr_assert(!atomic_load(&b_gave_up), "A never returned while B grew");
}

static void a_refusal_keeps_the_slot_b_relies_on(mp_stream_t t) {
  target = t;
  unsigned before = streams_known();
  call_t a, b;
  race(&a, &b);
  cr_expect_eq(a.st, MP_EDRIVER, "A: %d", (int)a.st);
  cr_expect_null(a.p);
  cr_expect_eq(b.st, MP_OK, "B: %d", (int)b.st);
  cr_expect_eq(atomic_load(&b_asked), 0,
               "A's refusal took the slot back under B, whose record made "
               "it again (B asked the device about the stream %u times)",
               atomic_load(&b_asked));
  cr_expect_eq(streams_known(), before + 1, "the stream B used");
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  if (b.st == MP_OK)
    cr_expect_eq(mp_host_pool_free(hp, b.p), MP_OK, "%s", mp_last_error());
}

Test(host_pool_refusal_keeps_shared_slot, on_a_new_stream) {
  a_refusal_keeps_the_slot_b_relies_on(s);
}

Test(host_pool_refusal_keeps_shared_slot, on_the_default_stream) {
  a_refusal_keeps_the_slot_b_relies_on(NULL);
}

/* Both refused: the slot goes with the last of them. */
Test(host_pool_refusal_keeps_shared_slot, the_last_refusal_takes_it_back) {
  target = s;
  atomic_store(&b_refuses, true);
  unsigned before = streams_known();
  call_t a, b;
  race(&a, &b);
  cr_expect_eq(a.st, MP_EDRIVER, "A: %d", (int)a.st);
  cr_expect_eq(b.st, MP_EDRIVER, "B: %d", (int)b.st);
  cr_expect_eq(streams_known(), before,
               "two refused calls left their stream in the pool");
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  /* Made again at the next call, which is served. */
  atomic_store(&b_refuses, false);
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(streams_known(), before + 1);
  cr_expect_eq(mp_host_pool_free(hp, p), MP_OK);
}
