/* test_pool_pause_refused_keeps_stale_copies.c - a pause refused for lack
 * of host memory (fault.c: the k-th host allocation fails, k = 0, 1, ...
 * until the pause goes through) changes nothing (status.h): the host copy
 * whose free the device refused at an earlier resume (pause_stale) stays
 * kept, and only the pause that goes through frees it. Before,
 * mp__pause_one freed those copies right after marking the pool paused, so
 * a pause refused later (listing the live blocks, the events for the
 * streams) had freed them already. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* While refusing, every host free is refused (each copy noted, up to 8);
 * frees_of_refused: how many of those copies were freed since. */
static void *refused_all[8];
static int nrefused, frees_of_refused;
static bool refusing;

static mp_status_t host_free_refused_while(mp_device_t *dev, void *ptr) {
  if (refusing && nrefused < 8) {
    refused_all[nrefused++] = ptr;
    return mp__fail(MP_EDRIVER, "fake host_free refused");
  }
  for (int i = 0; i < nrefused; i++)
    if (refused_all[i] == ptr)
      frees_of_refused++;
  return flaky_host_free(dev, ptr);
}

static void *stale_head(mp_pool_t *p) {
  mp__pool_lock(p);
  void *head = p->pause_stale;
  mp__pool_unlock(p);
  return head;
}

/* Pauses and resumes p (its content kept) with every host free refused:
 * want copies kept (one per arena holding content). */
static void resume_refusing_frees(mp_pool_t *p, int want) {
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  flaky_backend.host_free = host_free_refused_while;
  refusing = true;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  refusing = false;
  cr_assert_eq(nrefused, want, "host copies refused: %d", nrefused);
}

/* Pauses p with the k-th host allocation failing, k = 0, 1, ..., until the
 * pause goes through; every refused one keeps the copies (pools[0..n) each
 * with its own). Returns how many were refused. */
static int pause_under_faults(mp_pool_t *p, mp_pool_t *const *pools, size_t n) {
  int failed = 0;
  for (long k = 0; k < 1000; k++) {
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      return failed;
    failed++;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    cr_expect(strstr(mp_last_error(), "host memory") != NULL,
              "k=%ld: unclear message '%s'", k, mp_last_error());
    cr_assert_eq(frees_of_refused, 0,
                 "k=%ld: a refused pause freed a kept host copy (%s)", k,
                 mp_last_error());
    for (size_t i = 0; i < n; i++)
      cr_assert_not_null(stale_head(pools[i]), "k=%ld: a kept copy is gone", k);
    cr_assert_not(mp__pool_resume_wanted(p), "k=%ld: left paused", k);
  }
  cr_assert_fail("the pause never went through: %s", mp_last_error());
  return failed;
}

/* Resumes p, checks the content and finishes. */
static void finish(mp_pool_t *p, mp_device_t *dev, void *v, void *w) {
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(((unsigned char *)v)[MiB - 1], 0x3c);
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  if (w != NULL) {
    cr_assert_eq(((unsigned char *)w)[MiB - 1], 0x5a);
    cr_assert_eq(mp_pool_free(p, w), MP_OK);
  }
  flaky_backend.host_free = flaky_host_free;
  fake_pool_finish(p, dev);
}

Test(pool_pause_refused_keeps_stale_copies, host_faults) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &v), MP_OK);
  memset(v, 0x3c, MiB);
  resume_refusing_frees(p, 1);
  cr_assert_eq(stale_head(p), refused_all[0], "the refused copy was not kept");
  int failed = pause_under_faults(p, &p, 1);
  cr_expect_geq(failed, 1, "no host allocation failed the pause");
  cr_expect_eq(frees_of_refused, 1, "the pause that went through kept it");
  cr_expect_null(stale_head(p));
  finish(p, dev, v, NULL);
}

static void *alloc_thread(void *v) {
  mp_pool_t *p = v;
  void *x = NULL;
  if (mp_pool_alloc(p, MiB, NULL, &x) == MP_OK)
    memset(x, 0x5a, MiB);
  return x;
}

/* With arenas: both arenas hold a copy whose free was refused; a pause
 * refused in one arena after another arena paused (and was resumed by the
 * undo) frees none of them. Before, the arena that paused first had freed
 * its own (mp__pause_one, per arena), and the undo's resume of it too
 * (mp__resume_finish). */
Test(pool_pause_refused_keeps_stale_copies, arenas) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, "arenas=2");
  void *v, *w;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &v), MP_OK);
  memset(v, 0x3c, MiB);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, alloc_thread, p), 0);
  cr_assert_eq(pthread_join(th, &w), 0);
  cr_assert_not_null(w, "%s", mp_last_error());
  mp_pool_t *arenas[2] = {mp__arena_at(p, 0), mp__arena_at(p, 1)};
  cr_assert_not_null(arenas[0]);
  cr_assert_not_null(arenas[1], "the second thread shared an arena");
  resume_refusing_frees(p, 2);
  int failed = pause_under_faults(p, arenas, 2);
  cr_expect_geq(failed, 2, "too few host allocations failed the pause");
  cr_expect_eq(frees_of_refused, 2, "the pause that went through kept them");
  finish(p, dev, v, w);
}
