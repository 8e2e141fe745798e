/* test_pool_resume_host_free_refused_keeps_the_copy.c - a resume whose free
 * of the page-locked host copy of the paused content the device refuses
 * keeps that copy (pause.c, mp__pause_copies_free) and frees it at the next
 * pause, resume or destroy. Before, mp__resume_finish cleared pause_copy
 * whatever the free said: the copy leaked. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* The host copy whose free was refused, and whether it was freed since. */
static void *refused;
static bool refused_freed;

/* Refuses the first host free (nothing freed), then frees as the device
 * does, noting the free of the refused copy. */
static mp_status_t host_free_refused_once(mp_device_t *dev, void *ptr) {
  if (refused == NULL) {
    refused = ptr;
    return mp__fail(MP_EDRIVER, "fake host_free refused once");
  }
  if (ptr == refused)
    refused_freed = true;
  return flaky_host_free(dev, ptr);
}

/* A pool paused with its content kept, resumed while the device refuses
 * that copy's free. */
static mp_pool_t *resumed_with_a_refused_free(mp_device_t *dev, void **v) {
  refused = NULL;
  refused_freed = false;
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, v), MP_OK);
  memset(*v, 0x3c, MiB);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  flaky_backend.host_free = host_free_refused_once;
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_not_null(refused, "the resume freed its host copy");
  cr_expect_not(refused_freed);
  return p;
}

Test(pool_resume_host_free_refused_keeps_the_copy, freed_at_destroy) {
  mp_device_t *dev = flaky_open(0);
  void *v;
  mp_pool_t *p = resumed_with_a_refused_free(dev, &v);
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect(refused_freed, "the refused host copy was never freed");
  flaky_backend.host_free = flaky_host_free;
  fake_close(dev);
}

Test(pool_resume_host_free_refused_keeps_the_copy, freed_at_the_next_pause) {
  mp_device_t *dev = flaky_open(0);
  void *v;
  mp_pool_t *p = resumed_with_a_refused_free(dev, &v);
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect(refused_freed, "the next pause did not free the refused copy");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  flaky_backend.host_free = flaky_host_free;
  fake_pool_finish(p, dev);
}
