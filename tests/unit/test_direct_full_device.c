/* test_direct_full_device.c - mp_direct_alloc finding the device full: it
 * ends the session and retries once. A session the device refused part of
 * (pool_fakedev.h's refuse_frees) still gave the rest back, so the retry
 * must happen: it used to be skipped whenever the session reported any
 * failure, and the allocation was MP_ENOMEM with room on the device. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mempool/mempool.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "../support/stream_gate.h"
#include "pool_fakedev.h"

/* A direct allocator on a new fake device of 64 MiB. */
static mp_direct_t *direct_on_fake(mp_device_t **dev) {
  *dev = fake_open((size_t)64 << 20, 0);
  mp_direct_t *d;
  cr_assert_eq(mp_direct_create(*dev, &d), MP_OK);
  return d;
}

Test(direct_full_device, a_session_refused_in_part_still_lets_the_alloc_retry) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  size_t sizes[3] = {(size_t)16 << 20, (size_t)16 << 20, (size_t)32 << 20};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_alloc(d, sizes[i], NULL, &p[i]), MP_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_free(d, p[i]), MP_OK);
  /* The session's first free is refused: 48 MiB go back, 16 MiB stay. */
  f->refuse_frees = 1;
  void *q = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_OK,
               "48 MiB were given back: %s", mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(s.free_blocks, 1, "the refused block stays deferred");
  cr_expect_eq(s.reserved_bytes, f->used);
  cr_assert_eq(mp_direct_free(d, q), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}

/* The fake device with a message on its refusals, and a synchronization
 * that fails (as one from a host function, or a driver error, does). */
static mp_status_t say_full(mp_device_t *dev, size_t bytes, void **out) {
  mp_status_t st = fake_alloc(dev, bytes, out);
  return st == MP_ENOMEM ? mp__fail(st, "fake: out of memory") : st;
}
static mp_status_t refuse_sync(mp_device_t *dev) {
  (void)dev;
  return mp__fail(MP_EDRIVER, "fake: synchronize refused");
}

/* A session that cannot end releases nothing: the allocation is MP_ENOMEM
 * and mp_last_error() explains the MP_ENOMEM. It said what the session's
 * synchronization said, so the status and the message disagreed. */
Test(direct_full_device, an_oom_whose_session_cannot_end_explains_the_oom) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  mp__backend_t ops = fake_backend;
  ops.alloc = say_full;
  dev->ops = &ops;
  void *p, *q = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  ops.synchronize = refuse_sync;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_ENOMEM);
  cr_expect_eq(mp_last_status(), MP_ENOMEM);
  cr_expect_neq(strstr(mp_last_error(), "out of memory"), NULL, "%s",
                mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.free_blocks, 1, "the deferred block stays");
  ops.synchronize = fake_backend.synchronize;
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  fake_close(dev);
}

/* ---- another thread's session on its way back -------------------------
 * A session runs without the allocator's lock, so while one thread gives
 * its blocks back another may find the device full. That allocation used
 * to fail at once: the session it would have ended was taken already, and
 * the memory came back a moment later. The interleaving is forced: the
 * session's first device free (thread B) starts the allocation (thread A)
 * and lets the free go only once A's first try has found the device full;
 * whether A then looks before or after B is done, it must get the memory.
 * The fake device is not thread-safe: every call to it here takes dev_mu. */

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_cv = PTHREAD_COND_INITIALIZER;
static _Thread_local bool in_a; /* this thread is A */
static bool a_found_it_full;    /* under dev_mu */
static bool start_a;            /* the next free starts A (B's thread) */
static pthread_t a_thread;
static mp_direct_t *a_direct;
static mp_device_t *a_dev;
static mp_status_t a_status;
static void *a_ptr;
static char a_error[256]; /* A's mp_last_error() */

static mp_status_t locked_alloc(mp_device_t *dev, size_t bytes, void **out) {
  pthread_mutex_lock(&dev_mu);
  mp_status_t st = fake_alloc(dev, bytes, out);
  if (st == MP_ENOMEM)
    st = mp__fail(st, "fake: out of memory");
  if (st == MP_ENOMEM && in_a) {
    a_found_it_full = true;
    pthread_cond_broadcast(&dev_cv);
  }
  pthread_mutex_unlock(&dev_mu);
  return st;
}

static void *thread_a(void *arg) {
  (void)arg;
  in_a = true;
  a_status = mp_direct_alloc(a_direct, (size_t)40 << 20, NULL, &a_ptr);
  snprintf(a_error, sizeof a_error, "%s", mp_last_error());
  return NULL;
}

static mp_status_t locked_free(mp_device_t *dev, void *ptr) {
  if (start_a) { /* only B's thread frees while it is set */
    start_a = false;
    cr_assert_eq(pthread_create(&a_thread, NULL, thread_a, NULL), 0);
    pthread_mutex_lock(&dev_mu);
    while (!a_found_it_full)
      pthread_cond_wait(&dev_cv, &dev_mu);
    pthread_mutex_unlock(&dev_mu);
  }
  pthread_mutex_lock(&dev_mu);
  mp_status_t st = fake_free(dev, ptr);
  pthread_mutex_unlock(&dev_mu);
  return st;
}

static mp_status_t locked_sync(mp_device_t *dev) {
  pthread_mutex_lock(&dev_mu);
  mp_status_t st = fake_ok(dev);
  pthread_mutex_unlock(&dev_mu);
  return st;
}

static mp__backend_t locked_ops;

/* A direct allocator on a 64 MiB fake device (set up for threads) with a
 * 48 MiB block freed into its session: a 40 MiB request does not fit until
 * the session ends. B (this thread) ends it, starting A as it gives the
 * block back; refused: how many of the device frees from then on fail. */
static void race_a_session(unsigned refused) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  locked_ops = fake_backend;
  locked_ops.alloc = locked_alloc;
  locked_ops.free = locked_free;
  locked_ops.synchronize = locked_sync;
  dev->ops = &locked_ops;
  void *p;
  cr_assert_eq(mp_direct_alloc(d, (size_t)48 << 20, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  a_direct = d;
  a_dev = dev;
  fake_of(dev)->refuse_frees = refused;
  start_a = true;
  mp_status_t b = mp_direct_free_session(d);
  cr_assert_eq(b, refused > 0 ? MP_EDRIVER : MP_OK);
  cr_assert_eq(pthread_join(a_thread, NULL), 0);
}

Test(direct_full_device,
     an_alloc_uses_memory_another_threads_session_gives_back, .timeout = 60) {
  race_a_session(0);
  cr_assert_eq(a_status, MP_OK, "the 48 MiB were on their way back: %s",
               a_error);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(a_direct, &s), MP_OK);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(s.alloc_retry_count, 1);
  cr_expect_eq(s.device_free_count, 1);
  cr_expect_eq(s.live_blocks, 1);
  cr_expect_eq(s.reserved_bytes, (size_t)40 << 20);
  cr_expect_eq(s.reserved_bytes, fake_of(a_dev)->used);
}

/* B's session is refused: nothing came back, so A ends the session itself
 * (the block is in it again) rather than waiting or failing. */
Test(direct_full_device, an_alloc_ends_a_session_another_thread_could_not,
     .timeout = 60) {
  race_a_session(1);
  cr_assert_eq(a_status, MP_OK, "%s", a_error);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(a_direct, &s), MP_OK);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(s.device_free_count, 1);
  cr_expect_eq(s.free_blocks, 0);
  cr_expect_eq(s.reserved_bytes, fake_of(a_dev)->used);
}

/* Both sessions are refused: A stops waiting and fails, with the device's
 * MP_ENOMEM message, and the block stays in the session. */
Test(direct_full_device, an_alloc_fails_when_no_session_gives_anything_back,
     .timeout = 60) {
  race_a_session(2);
  cr_assert_eq(a_status, MP_ENOMEM);
  cr_expect_neq(strstr(a_error, "out of memory"), NULL, "%s", a_error);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(a_direct, &s), MP_OK);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.alloc_retry_count, 0);
  cr_expect_eq(s.device_free_count, 0);
  cr_expect_eq(s.free_blocks, 1, "the refused block stays deferred");
  cr_expect_eq(s.reserved_bytes, fake_of(a_dev)->used);
}

/* ---- a request that cannot fit while others keep freeing -------------
 * An allocation used to try again for as long as any memory went back
 * since its last try began: with another thread freeing and ending
 * sessions as fast as it tried (or freeing into the session, which it then
 * ended again), a request the device could never hold tried without end
 * instead of being MP_ENOMEM. Only memory on its way back when the try
 * failed (a session in flight then, and the session it ends itself, once)
 * is waited for. Each failed try of the 80 MiB request here frees 1 MiB
 * into the session, and, with session set, ends that session too, as
 * another thread could at that moment; after churn_max of them it stops,
 * so that the unbounded loop ends and the count shows it. */

static mp_direct_t *churn_direct;
static bool churn_session; /* each failed try also ends a session */
static unsigned churn_tries, churn_max = 1000;

static mp_status_t churn_alloc(mp_device_t *dev, size_t bytes, void **out) {
  mp_status_t st = fake_alloc(dev, bytes, out);
  if (st != MP_ENOMEM || bytes != (size_t)80 << 20 ||
      churn_tries++ >= churn_max)
    return st;
  void *p;
  cr_assert_eq(mp_direct_alloc(churn_direct, (size_t)1 << 20, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(churn_direct, p), MP_OK);
  if (churn_session)
    cr_assert_eq(mp_direct_free_session(churn_direct), MP_OK);
  return mp__fail(MP_ENOMEM, "fake: out of memory");
}

static void churn(bool session) {
  mp_device_t *dev;
  churn_direct = direct_on_fake(&dev);
  mp__backend_t ops = fake_backend;
  ops.alloc = churn_alloc;
  dev->ops = &ops;
  churn_session = session;
  churn_tries = 0;
  void *q = NULL;
  cr_assert_eq(mp_direct_alloc(churn_direct, (size_t)80 << 20, NULL, &q),
               MP_ENOMEM);
  cr_expect_neq(strstr(mp_last_error(), "out of memory"), NULL, "%s",
                mp_last_error());
  cr_expect_leq(churn_tries, 3, "%u tries of a request that cannot fit",
                churn_tries);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(churn_direct, &s), MP_OK);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.reserved_bytes, fake_of(dev)->used);
  cr_assert_eq(mp_direct_destroy(churn_direct), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(direct_full_device, an_alloc_stops_when_others_keep_ending_sessions,
     .timeout = 60) {
  churn(true);
}

Test(direct_full_device, an_alloc_ends_the_session_once_while_others_free,
     .timeout = 60) {
  churn(false);
}

/* ---- a child forked while a session is in flight ----------------------
 * A session another thread of the parent is giving back when the process
 * forks is copied into the child, but not the thread that would end it:
 * the child's allocation on a full device waited for it for ever. Only
 * the sessions of the calling process are waited for; the child's
 * allocation is MP_ENOMEM. The parent's session waits in its device
 * synchronization (held_sync) until the child is done; the child's alarm
 * turns a hang into a failure. */

static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cv = PTHREAD_COND_INITIALIZER;
static bool held_in, held_go; /* under held_mu */

/* Waits until the test lets it go (held_go), saying it is here (held_in). */
static void held_here(void) {
  pthread_mutex_lock(&held_mu);
  held_in = true;
  pthread_cond_broadcast(&held_cv);
  while (!held_go)
    pthread_cond_wait(&held_cv, &held_mu);
  pthread_mutex_unlock(&held_mu);
}

static mp_status_t held_sync(mp_device_t *dev) {
  held_here();
  return fake_ok(dev);
}

/* A device free held once it is done (the first; the rest pass once the
 * test lets go): a fork then finds the block gone from the device, and the
 * session's thread not yet back in the allocator. */
static mp_status_t held_free(mp_device_t *dev, void *ptr) {
  mp_status_t st = fake_free(dev, ptr);
  held_here();
  return st;
}

static void *end_held_session(void *arg) {
  return (void *)(intptr_t)mp_direct_free_session(arg);
}

/* In the child, a thread that writes over the stack it was given: glibc
 * hands a forked child's new thread a stack of a thread that did not
 * survive the fork (its stack cache), here the one that was giving the
 * session back. */
static void *scribble_stack(void *arg) {
  unsigned char buf[256 << 10];
  memset(buf, 0xA5, sizeof buf);
  __asm__ volatile("" : : "r"(buf) : "memory");
  return arg;
}

/* What the child does with the allocator, and the exit codes that say
 * what went wrong there. */
typedef enum {
  CHILD_ALLOCS,                /* a 40 MiB request on the full device */
  CHILD_ALLOCS_AFTER_A_THREAD, /* the same after a thread of its own */
  CHILD_DESTROYS,              /* mp_direct_destroy, then nothing left behind */
} child_does_t;
enum {
  CHILD_OK,
  CHILD_NOT_ENOMEM = 1,
  CHILD_NO_THREAD = 2,
  CHILD_DESTROY_FAILED = 3,
  CHILD_DEVICE_LEFT = 4,
  CHILD_HOST_LEFT = 5,
};

/* Whether LeakSanitizer finds host memory nothing points to (it says
 * what); false where there is none. */
static bool child_leaks(void) {
#if defined(__SANITIZE_ADDRESS__)
  return __lsan_do_recoverable_leak_check() != 0;
#else
  return false;
#endif
}

/* In the child: destroys d, whose device has to hold nothing afterwards
 * (the parent's session's blocks were the child's copies too), and whose
 * records must all be freed. The parent's thread is not here to let the
 * held device calls go: they are the fake's own again. */
static int child_destroys(mp_direct_t *d, mp_device_t *dev,
                          mp__backend_t *ops) {
  ops->synchronize = fake_backend.synchronize;
  ops->free = fake_backend.free;
  mp_status_t st = mp_direct_destroy(d);
  size_t used = fake_of(dev)->used;
  if (st != MP_OK) {
    fprintf(stderr, "child: mp_direct_destroy: %s: %s\n", mp_status_name(st),
            mp_last_error());
    return CHILD_DESTROY_FAILED;
  }
  if (used != 0) {
    fprintf(stderr, "child: %zu bytes still used on the device\n", used);
    return CHILD_DEVICE_LEFT;
  }
  fake_close(dev);
  return child_leaks() ? CHILD_HOST_LEFT : CHILD_OK;
}

/* in_free: the session is held in its first device free, done (two blocks,
 * 16 and 32 MiB), instead of in its synchronization (one of 48 MiB). */
static void fork_mid_session(child_does_t does, bool in_free) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  mp__backend_t ops = fake_backend;
  if (in_free)
    ops.free = held_free;
  else
    ops.synchronize = held_sync;
  dev->ops = &ops;
  void *p, *p2, *q = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)(in_free ? 16 : 48) << 20, NULL, &p),
               MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  if (in_free) {
    cr_assert_eq(mp_direct_alloc(d, (size_t)32 << 20, NULL, &p2), MP_OK);
    cr_assert_eq(mp_direct_free(d, p2), MP_OK);
  }
  pthread_t b;
  cr_assert_eq(pthread_create(&b, NULL, end_held_session, d), 0);
  pthread_mutex_lock(&held_mu);
  while (!held_in)
    pthread_cond_wait(&held_cv, &held_mu);
  pthread_mutex_unlock(&held_mu);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    alarm(10);
    pthread_t t;
    if (does == CHILD_DESTROYS)
      _exit(child_destroys(d, dev, &ops));
    if (does == CHILD_ALLOCS_AFTER_A_THREAD &&
        (pthread_create(&t, NULL, scribble_stack, NULL) != 0 ||
         pthread_join(t, NULL) != 0))
      _exit(CHILD_NO_THREAD);
    mp_status_t st = mp_direct_alloc(d, (size_t)40 << 20, NULL, &q);
    _exit(st == MP_ENOMEM ? CHILD_OK : CHILD_NOT_ENOMEM);
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  pthread_mutex_lock(&held_mu);
  held_go = true;
  pthread_cond_broadcast(&held_cv);
  pthread_mutex_unlock(&held_mu);
  void *bst;
  cr_assert_eq(pthread_join(b, &bst), 0);
  cr_expect_eq((mp_status_t)(intptr_t)bst, MP_OK);
  cr_expect(!WIFSIGNALED(status),
            "the child waited for the parent's session (SIGALRM) or "
            "crashed (signal %d)",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  cr_expect(code == CHILD_OK || WIFSIGNALED(status), "%s",
            code == CHILD_NOT_ENOMEM
                ? "the child's allocation was not MP_ENOMEM"
            : code == CHILD_NO_THREAD ? "the child could not start a thread"
            : code == CHILD_DESTROY_FAILED
                ? "the child's destroy failed (a block freed twice?)"
            : code == CHILD_DEVICE_LEFT
                ? "the child's destroy left the parent's session's blocks "
                  "on its device"
            : code == CHILD_HOST_LEFT
                ? "the child's destroy leaked host memory (LeakSanitizer)"
                : "the child failed");
  /* The parent's session went back: the request fits here. */
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, q), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  fake_close(dev);
}

Test(direct_full_device, a_child_forked_mid_session_does_not_wait_for_it,
     .timeout = 60) {
  fork_mid_session(CHILD_ALLOCS, false);
}

/* The parent's session was on the stack of the thread giving it back: in
 * the child, a new thread's stack is that memory, and the allocation read
 * the session's list through what the thread wrote there (SIGSEGV). */
Test(direct_full_device,
     a_child_forked_mid_session_survives_a_new_thread_over_its_stack,
     .timeout = 60) {
#ifdef __SANITIZE_THREAD__
  /* TSan dies at a thread started in a child forked from a process with
   * threads ("not supported"); the plain and ASan runs cover it. */
  cr_skip_test("TSan cannot start a thread in a forked child");
#endif
  fork_mid_session(CHILD_ALLOCS_AFTER_A_THREAD, false);
}

/* The child's destroy freed the blocks it owned but those of the parent's
 * session in flight at the fork: that session was out of the map, and its
 * record and blocks stayed behind in the child (on the host device, its
 * memory charged to the child's copy of the device). */
Test(direct_full_device,
     a_child_forked_mid_session_frees_the_session_s_blocks_at_destroy) {
  fork_mid_session(CHILD_DESTROYS, false);
}

/* Forked while the session's first device free had returned but the
 * session's thread had not yet told the allocator: that block is gone
 * from the device (and its address may be another allocation's by now);
 * the child's destroy frees the other one and leaves it alone. */
Test(direct_full_device,
     a_child_forked_mid_free_frees_the_rest_and_nothing_twice) {
  fork_mid_session(CHILD_DESTROYS, true);
}

/* ---- a session held up by work the allocating thread releases ---------
 * A session's device synchronization waits for every stream's work, and
 * that work may wait for the very thread whose allocation then finds the
 * device full (a stream gated on a host function that thread opens next).
 * The allocation waited for that session without end, and the session
 * for it: a deadlock of the library's making, where cudaMalloc would have
 * answered out of memory. It waits a bounded time, then is MP_ENOMEM with
 * a message that says so. The gate (hold) is opened by a deadline thread
 * after 30 s, so that a wait for the session fails the test instead of
 * hanging it; the deadline's opened flag tells that it had to. These
 * tests set no Criterion .timeout (the deadline bounds them): with one,
 * Criterion's runner leaked 48 bytes under ASan with --jobs 2 in 6 of 7
 * runs of this file (LeakSanitizer, allocated in libcriterion), none in 7
 * without. */

static gate_t hold;

/* The fake device's synchronization, held behind the gate as a stream's
 * gated work holds a real one; held_in says it has begun. */
static mp_status_t gated_sync(mp_device_t *dev) {
  pthread_mutex_lock(&held_mu);
  held_in = true;
  pthread_cond_broadcast(&held_cv);
  pthread_mutex_unlock(&held_mu);
  gate_wait(&hold);
  return fake_ok(dev);
}

/* d's session, with a block of 48 MiB, is ended by a thread of its own,
 * which waits in the session's synchronization until the gate opens;
 * in_sync(d) tells when it has begun. Then this thread, the one that
 * would open the gate, asks for 40 MiB, which fit only once the session
 * is done: the answer must come before the deadline opens the gate, and
 * be MP_ENOMEM with a message about the sessions. Then the gate opens and
 * the request fits. */
static void alloc_beside_a_gated_session(mp_direct_t *d, gate_t *g,
                                         bool (*in_sync)(mp_direct_t *),
                                         bool own_deferred) {
  void *p, *q = NULL, *r = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)48 << 20, NULL, &p), MP_OK);
  if (own_deferred)
    cr_assert_eq(mp_direct_alloc(d, (size_t)8 << 20, NULL, &r), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  gate_timer_t deadline;
  pthread_t b;
  cr_assert_eq(gate_deadline_start(&deadline, g, 30000000u), 0);
  cr_assert_eq(pthread_create(&b, NULL, end_held_session, d), 0);
  while (!in_sync(d))
    usleep(1000);
  /* A block this thread frees meanwhile waits in the next session. */
  if (own_deferred)
    cr_assert_eq(mp_direct_free(d, r), MP_OK);
  mp_status_t st = mp_direct_alloc(d, (size_t)40 << 20, NULL, &q);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  bool waited = atomic_load(&deadline.opened) != 0;
  gate_open(g);
  void *bst;
  cr_assert_eq(pthread_join(b, &bst), 0);
  gate_timer_join(&deadline);
  cr_assert(!waited,
            "the allocation waited for the gated session until the deadline "
            "opened the gate (status %s)",
            mp_status_name(st));
  cr_assert_eq(st, MP_ENOMEM, "%s", msg);
  cr_expect_neq(strstr(msg, "session"), NULL, "%s", msg);
  cr_expect_eq((mp_status_t)(intptr_t)bst, MP_OK);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.free_blocks, own_deferred,
               "this thread's block stays deferred");
  /* The session went back once the gate opened: the request fits now. */
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, q), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
}

static bool fake_in_sync(mp_direct_t *d) {
  (void)d;
  pthread_mutex_lock(&held_mu);
  bool in = held_in;
  pthread_mutex_unlock(&held_mu);
  return in;
}

/* alloc_beside_a_gated_session on the fake device, its synchronization
 * held behind the gate. */
static void gated_on_fake(bool own_deferred) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  mp__backend_t ops = fake_backend;
  ops.alloc = say_full;
  ops.synchronize = gated_sync;
  dev->ops = &ops;
  held_in = false;
  gate_init(&hold);
  alloc_beside_a_gated_session(d, &hold, fake_in_sync, own_deferred);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
  gate_destroy(&hold);
}

Test(direct_full_device,
     an_alloc_gives_up_on_a_session_held_by_work_it_would_release) {
  gated_on_fake(false);
}

/* The same with a block this thread freed since the session began: the
 * allocation ended that session itself, and its device synchronization
 * waited for the same gated work as the other thread's, without a bound
 * (until the test's deadline opened the gate). It leaves its blocks
 * deferred while another thread's session is in flight. */
Test(direct_full_device,
     an_alloc_with_blocks_of_its_own_deferred_gives_up_on_a_held_session) {
  gated_on_fake(true);
}

/* The same on the emulated host device, with a stream held by a host
 * function behind the gate: the session's mp_device_synchronize waits for
 * it. The session has begun once its blocks left the allocator's deferred
 * list (free_blocks 0). */
static bool session_taken(mp_direct_t *d) {
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  return s.free_blocks == 0;
}

Test(direct_full_device,
     an_alloc_gives_up_on_a_session_waiting_for_a_gated_stream) {
  mp_device_t *host;
  mp_direct_t *d;
  mp_stream_t s;
  cr_assert_eq(mp_device_open("host:capacity=64M", &host), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_create(host, &d), MP_OK);
  cr_assert_eq(mp_stream_create(host, &s), MP_OK);
  gate_init(&hold);
  cr_assert_eq(mp_stream_launch_host(host, s, gate_wait, &hold), MP_OK);
  alloc_beside_a_gated_session(d, &hold, session_taken, false);
  cr_assert_eq(mp_stream_synchronize(host, s), MP_OK);
  mp_stream_destroy(host, s);
  mp_device_close(host);
  gate_destroy(&hold);
}
