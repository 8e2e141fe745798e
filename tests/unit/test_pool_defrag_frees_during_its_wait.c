/* test_pool_defrag_frees_during_its_wait.c - a defragmentation waits for
 * the pool's streams with the pool's lock dropped (defrag.c: after its
 * plan, before the copies), and meanwhile another thread may free the
 * very block the plan would move and allocate in its place. The moves are
 * chosen only once the lock is taken again, from the blocks as they are
 * then, so the pool stays whole (mp_pool_check), the block that was still
 * there moves with its content, and the new block keeps its own. (Moves
 * chosen before the wait, by address, overwrite the new block: checked by
 * hand with that change to mp__defragment.) */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_defrag_frees_during_its_wait, "host:capacity=256M");

typedef struct job {
  mp_pool_t *pool;
  mp_stream_t s;
  size_t moved;
  mp_status_t st;
} job_t;

static void *defrag_main(void *arg) {
  job_t *j = arg;
  j->st = mp_pool_defragment(j->pool, j->s, &j->moved);
  return NULL;
}

static bool syncing(mp_pool_t *p) {
  mp__pool_lock(p);
  bool s = p->syncing;
  mp__pool_unlock(p);
  return s;
}

/* Whether n bytes at p all hold v. */
static size_t first_other(const void *p, size_t n, int v) {
  const unsigned char *b = p;
  size_t at = 0;
  while (at < n && b[at] == v)
    at++;
  return at;
}

#define KiB ((size_t)1024)

Test(pool_defrag_frees_during_its_wait, the_block_to_move_freed_and_reused) {
  mp_pool_t *p = make_pool(dev, "virtual=0,segment_bytes=4M,align=512");
  mp_stream_t x, s;
  cr_assert_eq(mp_stream_create(dev, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  /* A hole of 4 KiB under a 1 MiB movable block, and a 256 KiB one
   * above: the plan slides both. */
  mp_handle_t *small, *big, *mid, *c;
  void *raw;
  cr_assert_eq(mp_pool_alloc_movable(p, 4 * KiB, x, &small), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, MiB, s, &big), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, 256 * KiB, s, &mid), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, MiB, s, &raw), MP_OK);
  char *base = mp_handle_ptr(small);
  cr_assert_eq((char *)mp_handle_ptr(big), base + 4 * KiB);
  cr_assert_eq((char *)mp_handle_ptr(mid), base + 4 * KiB + MiB);
  memset(mp_handle_ptr(mid), 0x4d, 256 * KiB);
  cr_assert_eq(mp_handle_free(small), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, x), MP_OK);
  /* x held back: the defragmentation's wait for it lasts until the gate
   * opens. */
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, x, gate_wait, &g), MP_OK);
  job_t j = {.pool = p, .s = s};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, defrag_main, &j), 0);
  for (long k = 0; !syncing(p); k++) {
    if (k == 200000)
      gate_open(&g); /* never waited: let it end, and say so */
    cr_assert_lt(k, 200000, "the defragmentation never waited for x");
    usleep(100);
  }
  /* In its wait: the block it planned to move first goes, and a new one
   * is made (both on s, the copies' stream: its space is theirs at once). */
  cr_assert_eq(mp_handle_free(big), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc_movable(p, 64 * KiB, s, &c), MP_OK, "%s",
               mp_last_error());
  memset(mp_handle_ptr(c), 0x6b, 64 * KiB);
  gate_open(&g);
  pthread_join(t, NULL);
  cr_expect_eq(j.st, MP_OK, "%s", mp_last_error());
  check(p);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  /* What moved is what was there after the wait: mid (and c, were it
   * above free space), never the freed block. */
  cr_expect_lt((char *)mp_handle_ptr(mid), base + 4 * KiB + MiB,
               "mid did not slide");
  cr_expect_leq(j.moved, (256 + 64) * KiB, "moved %zu bytes", j.moved);
  cr_expect_geq(j.moved, 256 * KiB, "moved %zu bytes", j.moved);
  size_t at = first_other(mp_handle_ptr(mid), 256 * KiB, 0x4d);
  cr_expect_eq(at, 256 * KiB, "mid lost its content from byte %zu", at);
  at = first_other(mp_handle_ptr(c), 64 * KiB, 0x6b);
  cr_expect_eq(at, 64 * KiB, "the new block lost its content from byte %zu",
               at);
  cr_assert_eq(mp_handle_free(c), MP_OK);
  cr_assert_eq(mp_handle_free(mid), MP_OK);
  cr_assert_eq(mp_pool_free(p, raw), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, x), MP_OK);
  check(p);
  mp_pool_destroy(p);
  cr_assert_eq(mp_stream_destroy(dev, x), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}
