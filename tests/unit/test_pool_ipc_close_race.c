/* test_pool_ipc_close_race.c - mp_device_close while another thread's
 * mp_ipc_close of one of the device's imports is under way (waiting for the
 * device's work). The device's close waits for that close to end, then
 * closes the imports left: both leases are closed, so the exporter gets
 * both blocks back. Failed before: the close stopped at the import being
 * closed, never unmapped the other (its lease open: the exporter held its
 * block for good), freed the list of imports under the other thread's
 * close, which then read it (a crash). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "device/backend.h"

#define MiB ((size_t)1 << 20)

static atomic_bool gate_open;

static void gate(void *arg) {
  (void)arg;
  while (!atomic_load(&gate_open))
    nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void sleep_ms(long ms) {
  nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000}, NULL);
}

typedef struct closer {
  mp_device_t *dev;
  void *ptr;
  mp_status_t st;
} closer_t;

static void *close_import(void *arg) {
  closer_t *c = arg;
  c->st = mp_ipc_close(c->dev, c->ptr);
  return NULL;
}

static void *close_device(void *arg) {
  mp_device_close(arg);
  return NULL;
}

Test(pool_ipc_close_race, a_device_close_waits_for_an_import_close_under_way) {
  mp_device_t *exp, *imp;
  cr_assert_eq(mp_device_open("host:capacity=64M", &exp), MP_OK);
  cr_assert_eq(mp_device_open("host:capacity=64M", &imp), MP_OK);
  mp_pool_t *pool = make_pool(exp, NULL);
  void *p[2], *q[2];
  for (int i = 0; i < 2; i++) {
    mp_ipc_handle_t h;
    cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p[i]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(pool, p[i], &h), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_ipc_import(imp, &h, &q[i]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK); /* held: imported */
  }
  /* Work on the importing device that runs until the gate opens: the
   * import's close waits for it. */
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(imp, &s), MP_OK);
  cr_assert_eq(mp_stream_launch_host(imp, s, gate, NULL), MP_OK);
  closer_t c = {imp, q[0], MP_EINVAL};
  pthread_t t_import, t_device;
  cr_assert_eq(pthread_create(&t_import, NULL, close_import, &c), 0);
  /* The import's close is waiting for the gate, its import marked: its
   * thread's start and first steps are not observable from here, so a
   * second's margin, for a loaded machine under a sanitizer (with 100 ms
   * the device's close could come first: the import's close then fails,
   * or runs on the closed device). */
  sleep_ms(1000);
  cr_assert_eq(pthread_create(&t_device, NULL, close_device, imp), 0);
  sleep_ms(100); /* the device's close has begun */
  atomic_store(&gate_open, true);
  pthread_join(t_import, NULL);
  pthread_join(t_device, NULL);
  cr_expect_eq(c.st, MP_OK, "the import's close failed");
  size_t held = 2;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0,
               "%zu blocks still held: an import's lease outlived "
               "its device",
               held);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(exp);
}
