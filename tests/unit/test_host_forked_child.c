/* test_host_forked_child.c - a child forked from a process using the host
 * device frees what it inherited without touching the parent's memory.
 * The device's memory is one shared memfd: the child's mappings of it are
 * the parent's pages, and a free in the child punched a hole in the file,
 * zeroing a block the parent still held (a child's mp_direct_destroy wiped
 * every live block of the parent's direct allocator). The child only lets
 * go of its own view. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"

#define BLOCK ((size_t)1 << 20)

/* Forks a child that runs in_child(ctx) and exits with its status; then
 * the parent's block p must still hold 0x5a in every byte. */
static void child_frees_parent_keeps(void *p, mp_status_t (*in_child)(void *),
                                     void *ctx) {
  memset(p, 0x5a, BLOCK);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    alarm(10);
    _exit((int)in_child(ctx));
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == MP_OK,
            "the child's free failed (status %d)",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  const unsigned char *b = p;
  size_t bad = 0;
  for (size_t i = 0; i < BLOCK; i++)
    bad += b[i] != 0x5a;
  cr_expect_eq(bad, 0, "%zu bytes of the parent's block changed (%#x first)",
               bad, b[0]);
}

typedef struct {
  mp_device_t *dev;
  void *p;
} device_block_t;

static mp_status_t free_device_block(void *ctx) {
  device_block_t *db = ctx;
  return mp_device_free(db->dev, db->p);
}

Test(host_forked_child, a_child_s_device_free_keeps_the_parent_s_block) {
  device_block_t db;
  cr_assert_eq(mp_device_open("host:capacity=64M", &db.dev), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_alloc(db.dev, BLOCK, &db.p), MP_OK, "%s",
               mp_last_error());
  child_frees_parent_keeps(db.p, free_device_block, &db);
  cr_assert_eq(mp_device_free(db.dev, db.p), MP_OK, "%s", mp_last_error());
  mp_device_close(db.dev);
}

/* The child's own allocations: refused (its copy of the device would hand
 * out the parent's offsets of the shared file: the same memory), with a
 * message that says why, and so is queueing work; its own device works.
 * 0 when all holds. */
static int child_allocs(mp_device_t *parents) {
  alarm(10);
  void *q = NULL;
  if (mp_device_alloc(parents, BLOCK, &q) != MP_ENODEV || q != NULL)
    return 1;
  if (strstr(mp_last_error(), "forked child") == NULL)
    return 2;
  /* No work queued (no stream thread would run it), and nothing that
   * would wait for it: a pool's calls end (before: its destroy waited
   * for ever for a marker recorded in the child). */
  mp_event_t ev;
  if (mp_event_create(parents, &ev) != MP_OK ||
      mp_event_record(parents, ev, NULL) != MP_ENODEV ||
      mp_event_destroy(parents, ev) != MP_OK)
    return 3;
  mp_pool_t *pool = NULL;
  if (mp_pool_create(parents, NULL, &pool) != MP_OK ||
      mp_pool_alloc(pool, BLOCK, NULL, &q) != MP_ENODEV ||
      mp_pool_destroy(pool) != MP_OK)
    return 4;
  /* Nor a stream: no work could be queued on it, and its thread outlived
   * its destroy (the child's stream threads grew with each create). */
  mp_stream_t s = NULL;
  if (mp_stream_create(parents, &s) != MP_ENODEV || s != NULL)
    return 7;
#ifdef __SANITIZE_THREAD__
  /* A device of its own starts stream threads, which TSan refuses in a
   * child forked from a multi-threaded process. */
  return 0;
#endif
  mp_device_t *own = NULL;
  if (mp_device_open("host:capacity=64M", &own) != MP_OK ||
      mp_device_alloc(own, BLOCK, &q) != MP_OK)
    return 5;
  memset(q, 0xc1, BLOCK);
  return mp_device_free(own, q) == MP_OK ? 0 : 6;
}

/* Before: the child's block was the parent's next block (the same offset
 * of the shared file): the parent read the child's 0xc1. */
Test(host_forked_child, a_child_cannot_allocate_from_the_parents_device) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0)
    _exit(child_allocs(dev));
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child check %d failed",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, BLOCK, &p), MP_OK, "%s", mp_last_error());
  const unsigned char *b = p;
  size_t seen = 0;
  for (size_t i = 0; i < BLOCK; i++)
    seen += b[i] == 0xc1;
  cr_expect_eq(seen, 0, "the parent's new block holds the child's bytes");
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

/* In the child: a memset queued on a device of its own into the parent's
 * block ctx. MP_OK when it is refused as no device memory (nothing
 * queued); MP_EIO when it was queued (it has run when this returns). */
static mp_status_t memset_parents_block(void *ctx) {
#ifdef __SANITIZE_THREAD__
  /* A device of its own starts stream threads, which TSan refuses in a
   * child forked from a multi-threaded process: not run there. */
  (void)ctx;
  return MP_OK;
#endif
  mp_device_t *own;
  mp_stream_t s;
  if (mp_device_open("host:capacity=16M", &own) != MP_OK)
    return MP_ENODEV;
  if (mp_stream_create(own, &s) != MP_OK)
    return MP_ENODEV;
  mp_status_t st = mp_memset_async(own, ctx, 0, BLOCK, s);
  bool refused =
      st == MP_EINVAL && strstr(mp_last_error(), "not device memory") != NULL;
  (void)mp_stream_synchronize(own, s);
  (void)mp_stream_destroy(own, s);
  mp_device_close(own);
  return refused ? MP_OK : MP_EIO;
}

/* A child's own device does not take its parent's block for device memory
 * of a host device: CUDA gives a forked child no part of its parent's
 * context, and the block is the parent's pages of the shared file. The
 * copies' and memsets' check looks at every open host device of the
 * process, but not at those the child inherited: before, it found the
 * block there, the memset ran and the parent's block was zeroed; and it
 * took each inherited device's memory lock, which a thread of the parent
 * may have held at the fork, so that the child could hang in any copy
 * between host memory and its own device. */
Test(host_forked_child,
     a_child_s_device_refuses_a_memset_of_the_parents_block) {
  device_block_t db;
  cr_assert_eq(mp_device_open("host:capacity=64M", &db.dev), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_alloc(db.dev, BLOCK, &db.p), MP_OK, "%s",
               mp_last_error());
  child_frees_parent_keeps(db.p, memset_parents_block, db.p);
  cr_assert_eq(mp_device_free(db.dev, db.p), MP_OK, "%s", mp_last_error());
  mp_device_close(db.dev);
}

static mp_status_t destroy_direct(void *ctx) {
  return mp_direct_destroy(ctx);
}

Test(host_forked_child, a_child_s_direct_destroy_keeps_the_parent_s_blocks) {
  mp_device_t *dev;
  mp_direct_t *d;
  void *p;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, BLOCK, NULL, &p), MP_OK, "%s",
               mp_last_error());
  child_frees_parent_keeps(p, destroy_direct, d);
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A child lets go of its parent's streams and device: the streams'
 * threads did not survive the fork, so stopping one joined a thread that
 * is not there, and the child hung (in mp_stream_destroy of an idle
 * stream, and always in mp_device_close). 0 when both return. */
static int child_lets_go(mp_device_t *parents, mp_stream_t s) {
  alarm(10);
  if (mp_stream_destroy(parents, s) != MP_OK)
    return 1;
  mp_device_close(parents);
  return 0;
}

Test(host_forked_child, a_child_destroys_and_closes_what_it_inherited) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0)
    _exit(child_lets_go(dev, s));
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child %s (status %d)", WIFSIGNALED(status) ? "hung" : "failed",
            status);
  /* The parent's own are as they were. */
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
