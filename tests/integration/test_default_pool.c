/* The drop-in API: one process-wide pool made on first use from
 * $MEMPOOL_DEVICE and $MEMPOOL_CONF. Each Criterion test runs in its own
 * process, so each sees a fresh default pool. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mempool/mempool.h>
#include <mempool/torch.h>

static void *grab(void *arg) {
  *(mp_pool_t **)arg = mp_default_pool();
  return NULL;
}

Test(default_pool, made_once_on_first_use_even_when_threads_race) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  pthread_t t[4];
  mp_pool_t *got[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, grab, &got[i]);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  cr_assert_not_null(got[0], "%s", mp_last_error());
  for (int i = 1; i < 4; i++)
    cr_expect_eq(got[i], got[0]);
  cr_expect_eq(mp_default_pool(), got[0]);
}

Test(default_pool, malloc_and_free_round_trip) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  setenv("MEMPOOL_CONF", "align=1024", 1);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 1000), MP_OK, "%s", mp_last_error());
  cr_expect_eq((uintptr_t)p % 1024, 0, "MEMPOOL_CONF was applied");
  memset(p, 1, 1000);
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &s), MP_OK);
  cr_expect_eq(s.requested_bytes, 1000);
  cr_expect_eq(mp_free(p), MP_OK);
  cr_expect_eq(mp_free(p), MP_EINVAL, "double free");
  cr_expect_eq(mp_free(NULL), MP_OK);
  cr_expect_eq(mp_malloc(NULL, 8), MP_EINVAL);
}

/* The default pool on the host device, its device and a new stream. */
static mp_pool_t *host_pool_with_stream(mp_device_t **dev, mp_stream_t *s) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  mp_pool_t *pool = mp_default_pool();
  cr_assert_not_null(pool, "%s", mp_last_error());
  *dev = mp_pool_device(pool);
  cr_assert_eq(mp_stream_create(*dev, s), MP_OK);
  return pool;
}

Test(default_pool, free_async_orders_reuse_after_the_stream) {
  mp_device_t *dev;
  mp_stream_t s;
  host_pool_with_stream(&dev, &s);
  void *p, *q;
  cr_assert_eq(mp_malloc_async(&p, 2 << 20, NULL), MP_OK);
  cr_assert_eq(mp_memset_async(dev, p, 7, 2 << 20, s), MP_OK);
  cr_assert_eq(mp_free_async(p, s), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_malloc_async(&q, 2 << 20, s), MP_OK);
  cr_expect_eq(mp_free_async(q, s), MP_OK);
  cr_expect_eq(mp_free_async((char *)q + 1, s), MP_EINVAL);
  mp_stream_destroy(dev, s);
}

Test(default_pool, unusable_device_is_null_with_a_reason) {
  setenv("MEMPOOL_DEVICE", "nosuchdevice", 1);
  cr_expect_null(mp_default_pool());
  cr_expect(strstr(mp_last_error(), "nosuchdevice"), "%s", mp_last_error());
  void *p;
  cr_expect_eq(mp_malloc(&p, 16), MP_EINVAL);
}

/* A bad $MEMPOOL_CONF: every call says why, whole, however long the
 * reason (an unknown key lists every known one: some 280 characters,
 * which the default pool's copy of the reason used to cut at 255, in the
 * middle of a key's name). */
Test(default_pool, a_bad_conf_is_refused_with_its_whole_reason) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  setenv("MEMPOOL_CONF", "no_such_key_of_a_pool=1", 1);
  void *p = NULL;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_malloc(&p, 16), MP_EINVAL);
    const char *m = mp_last_error();
    cr_expect(strstr(m, "no_such_key_of_a_pool") != NULL, "%s", m);
    /* The list ends with the last key the parser knows. */
    cr_expect(strstr(m, "garbage_collection_threshold)") != NULL, "%s", m);
  }
  cr_expect_null(p);
}

/* mp_free_async of a pointer it must refuse (a movable block's) changes
 * nothing: no use of the stream is left on the block, so once the block is
 * freed through its handle its own stream reuses it at once, busy stream or
 * not. */
static void hold(void *arg) {
  struct timespec ts = {0, 200 * 1000 * 1000};
  (void)arg;
  nanosleep(&ts, NULL);
}

Test(default_pool, refused_free_async_leaves_no_stream_use_behind) {
  mp_device_t *dev;
  mp_stream_t busy;
  mp_pool_t *pool = host_pool_with_stream(&dev, &busy);
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(pool, 2 << 20, NULL, &h), MP_OK);
  void *p = mp_handle_ptr(h);
  cr_assert_eq(mp_stream_launch_host(dev, busy, hold, NULL), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  cr_expect_eq(mp_free_async(p, busy), MP_EINVAL);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  void *q;
  cr_assert_eq(mp_malloc_async(&q, 2 << 20, NULL), MP_OK);
  cr_expect_eq(q, p, "the busy stream was left recorded as a use");
  cr_expect_eq(mp_free(q), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, busy), MP_OK);
  mp_stream_destroy(dev, busy);
}

/* mp_free's refusals name mp_free, the call the program made, as
 * mp_free_async's do: they said "mp_pool_free: ... this pool", a function
 * and a pool the program never named. Nothing is freed. */
Test(default_pool, refused_free_names_mp_free_and_frees_nothing) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  void *p = NULL, *q = NULL;
  cr_assert_eq(mp_malloc(&p, 4096), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_malloc(&q, 4096), MP_OK, "%s", mp_last_error());
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &before), MP_OK);
  int local;
  void *bad[] = {&local, (char *)p + 512};
  for (size_t i = 0; i < 2; i++) {
    cr_expect_eq(mp_free(bad[i]), MP_EINVAL);
    cr_expect_eq(strncmp(mp_last_error(), "mp_free: ", 9), 0, "%s",
                 mp_last_error());
  }
  cr_expect_eq(mp_free(q), MP_OK);
  cr_expect_eq(mp_free(q), MP_EINVAL, "double free");
  cr_expect_eq(strncmp(mp_last_error(), "mp_free: ", 9), 0, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &after), MP_OK);
  cr_expect_eq(after.allocated_bytes + 4096, before.allocated_bytes,
               "only q was freed");
  cr_expect_eq(mp_free(p), MP_OK, "%s", mp_last_error());
}

/* In the child: the parent's pools refused, nothing waited for. 0 when
 * every check holds, else the number of the first that failed. */
static int child_checks(void *parents) {
  alarm(20);        /* a hang is a failure, not a stuck test */
  mp_torch_reset(); /* PyTorch's empty_cache: trims every default pool */
  void *p = NULL;
  if (mp_malloc(&p, 4096) != MP_EINVAL || p != NULL)
    return 1;
  if (strstr(mp_last_error(), "forked") == NULL)
    return 2;
  if (mp_free(parents) != MP_EINVAL ||
      mp_free_async(parents, NULL) != MP_EINVAL)
    return 3;
  if (mp_default_pool() != NULL || mp_last_status() != MP_EINVAL)
    return 4;
  /* PyTorch's graph-pool hooks (its CUDAGraph's destructor calls
   * releasePool): they took the lock a thread of the parent may have held
   * at the fork, and worked on the parent's graph pools. */
  mp_torch_pool_id_t id = {1, 0};
  mp_torch_release_pool(0, id);
  mp_torch_end_allocate_to_pool(0, id);
  if (mp_last_status() != MP_EINVAL ||
      strstr(mp_last_error(), "forked") == NULL)
    return 5;
  return 0;
}

/* A child forked after the default pools were made has copies of them but
 * not the threads their streams run on: PyTorch's empty_cache (a trim of
 * every default pool, which waits for the streams' work) hung there for
 * ever, and an allocation took from the copy. The child's calls are now
 * refused; the parent's pool is as it was. Found by a review, 2026-12-01. */
Test(default_pool, a_forked_child_is_refused_the_parents_pools) {
  mp_device_t *dev;
  mp_stream_t s;
  mp_pool_t *pool = host_pool_with_stream(&dev, &s);
  void *p = NULL, *q = NULL;
  cr_assert_eq(mp_malloc_async(&p, 1 << 20, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_malloc_async(&q, 1 << 20, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_free_async(q, s), MP_OK); /* cached, on s: a trim waits */
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0)
    _exit(child_checks(p));
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child was killed (signal %d): it hung",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  cr_assert_eq(WEXITSTATUS(status), 0, "child check %d failed",
               WEXITSTATUS(status));
  cr_expect_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

/* mp_default_pool_made: 0 until the first default pool is made (asking
 * makes nothing), 1 from then on, also where making it failed (the device
 * and options were read then, for good). */
Test(default_pool, made_says_whether_the_device_was_read_and_makes_nothing) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  cr_expect_eq(mp_default_pool_made(), 0);
  cr_expect_eq(mp_default_pool_made(), 0, "asking made the pools");
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 64), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_default_pool_made(), 1);
  cr_expect_eq(mp_free(p), MP_OK);
}

Test(default_pool, made_is_one_after_a_failed_make_too) {
  setenv("MEMPOOL_DEVICE", "nosuchdevice", 1);
  cr_expect_eq(mp_default_pool_made(), 0);
  cr_expect_null(mp_default_pool());
  cr_expect_eq(mp_default_pool_made(), 1);
}

/* A free of a pointer before any default pool was made: no pool can hold
 * it, so it is MP_EINVAL (API.md: a foreign pointer) and makes nothing.
 * It made the default pool, reading $MEMPOOL_DEVICE and $MEMPOOL_CONF for
 * good (mempool.torch.use then refused another device), and where that
 * pool could not be made answered with the device's failure (here
 * MP_ENOTSUP) instead of MP_EINVAL. */
Test(default_pool, a_free_before_any_allocation_is_einval_and_makes_nothing) {
  setenv("MEMPOOL_DEVICE", "host:vmm=0", 1);
  setenv("MEMPOOL_CONF", "pausable=1", 1); /* a pool this device refuses */
  int local;
  cr_expect_eq(mp_free(&local), MP_EINVAL, "%s", mp_last_error());
  cr_expect_eq(strncmp(mp_last_error(), "mp_free: ", 9), 0, "%s",
               mp_last_error());
  cr_expect_eq(mp_free_async(&local, NULL), MP_EINVAL, "%s", mp_last_error());
  cr_expect_eq(strncmp(mp_last_error(), "mp_free_async: ", 15), 0, "%s",
               mp_last_error());
  cr_expect_eq(mp_default_pool_made(), 0, "a refused free made the pools");
  /* The device and options are still free to change. */
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 64), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_free(p), MP_OK, "%s", mp_last_error());
}

/* PyTorch's empty_cache (mp_torch_reset) before anything was allocated
 * has nothing to trim: it makes no pool, as PyTorch's own makes none. */
Test(default_pool, empty_cache_before_any_allocation_makes_nothing) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  mp_torch_reset();
  cr_expect_eq(mp_default_pool_made(), 0, "a trim of nothing made the pools");
}

/* Where the default pool could not be made no pool holds any pointer: a
 * free of one is MP_EINVAL (API.md: a foreign pointer) that names mp_free
 * and still says why there is no pool. It answered with the device's
 * failure (here MP_ENOTSUP), a status mp_free has for no pointer. */
Test(default_pool, a_free_after_the_pool_failed_to_be_made_is_einval) {
  setenv("MEMPOOL_DEVICE", "host:vmm=0", 1);
  setenv("MEMPOOL_CONF", "pausable=1", 1); /* a pool this device refuses */
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 64), MP_ENOTSUP, "%s", mp_last_error());
  int local;
  cr_expect_eq(mp_free(&local), MP_EINVAL, "%s", mp_last_error());
  cr_expect_eq(strncmp(mp_last_error(), "mp_free: ", 9), 0, "%s",
               mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), "pausable=1"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(mp_free_async(&local, NULL), MP_EINVAL, "%s", mp_last_error());
  cr_expect_eq(strncmp(mp_last_error(), "mp_free_async: ", 15), 0, "%s",
               mp_last_error());
}
