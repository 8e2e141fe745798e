/* Bad pointers given to the host pool are MP_EINVAL and change nothing:
 * NULL handles, pointers it never handed out (device memory, the device's
 * own page-locked memory, stack), interior pointers, double frees. */
#include <stdlib.h>
#include <string.h>

#include "../support/host_pool_fixture.h"

static void *live;

static void setup(void) {
  hp_open(NULL);
  cr_assert_eq(mp_host_pool_alloc(hp, 64 * KiB, NULL, &live), MP_OK);
}

static void teardown(void) {
  cr_expect_eq(mp_host_pool_free(hp, live), MP_OK);
  hp_close();
}

TestSuite(host_pool_bad_pointers, .init = setup, .fini = teardown);

/* Calls fn on a pointer and checks the refusal changed no counter. */
static void expect_refused(mp_status_t (*fn)(mp_host_pool_t *, void *),
                           void *ptr, const char *what) {
  mp_stats_t before = hp_stats();
  cr_expect_eq(fn(hp, ptr), MP_EINVAL, "%s was accepted", what);
  mp_stats_t after = hp_stats();
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0,
               "refusing %s changed the stats", what);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
}

static mp_status_t record_on_default(mp_host_pool_t *p, void *ptr) {
  return mp_host_pool_record_stream(p, ptr, NULL);
}

static void refuse_everywhere(void *ptr, const char *what) {
  expect_refused(mp_host_pool_free, ptr, what);
  expect_refused(record_on_default, ptr, what);
}

Test(host_pool_bad_pointers, free_of_null_is_a_no_op) {
  mp_stats_t before = hp_stats();
  cr_expect_eq(mp_host_pool_free(hp, NULL), MP_OK);
  cr_expect_eq(hp_stats().free_count, before.free_count);
}

Test(host_pool_bad_pointers, null_pool_is_einval) {
  void *p;
  mp_stats_t st;
  cr_expect_eq(mp_host_pool_alloc(NULL, 16, NULL, &p), MP_EINVAL);
  cr_expect_eq(mp_host_pool_free(NULL, live), MP_EINVAL);
  cr_expect_eq(mp_host_pool_record_stream(NULL, live, NULL), MP_EINVAL);
  cr_expect_eq(mp_host_pool_trim(NULL, 0), MP_EINVAL);
  cr_expect_eq(mp_host_pool_get_stats(NULL, &st), MP_EINVAL);
  cr_expect_eq(mp_host_pool_check(NULL), MP_EINVAL);
  cr_expect_eq(mp_host_pool_destroy(NULL), MP_EINVAL);
  cr_expect_eq(mp_host_pool_create(NULL, NULL, &hp), MP_EINVAL);
  cr_expect_eq(mp_host_pool_create(dev, NULL, NULL), MP_EINVAL);
}

Test(host_pool_bad_pointers, interior_pointer_is_einval) {
  refuse_everywhere((char *)live + 512, "an interior pointer");
}

Test(host_pool_bad_pointers, foreign_pointers_are_einval) {
  void *d, *pinned;
  int on_stack;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, &d), MP_OK);
  cr_assert_eq(mp_device_host_alloc(dev, 64 * KiB, &pinned), MP_OK);
  refuse_everywhere(d, "device memory");
  refuse_everywhere(pinned, "the device's own page-locked memory");
  refuse_everywhere(&on_stack, "a stack address");
  cr_expect_eq(mp_device_free(dev, d), MP_OK);
  cr_expect_eq(mp_device_host_free(dev, pinned), MP_OK,
               "the pool touched memory it did not own: %s", mp_last_error());
}

/* A refusal names the call the caller made, not the device pool's
 * function the host pool hands it to (it said "mp_pool_free: ..."). */
Test(host_pool_bad_pointers, refusals_name_the_host_pool_call) {
  char *inside = (char *)live + 512;
  cr_expect_eq(mp_host_pool_free(hp, inside), MP_EINVAL);
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_free: ", 19) == 0, "%s",
            mp_last_error());
  cr_expect_eq(mp_host_pool_record_stream(hp, inside, NULL), MP_EINVAL);
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_record_stream: ", 28) == 0,
            "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_dump(hp, stdout, "xml"), MP_EINVAL);
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_dump: ", 19) == 0, "%s",
            mp_last_error());
  cr_expect_eq(mp_host_pool_alloc(hp, 16, NULL, NULL), MP_EINVAL);
  cr_expect(strncmp(mp_last_error(), "mp_host_pool_alloc: ", 20) == 0, "%s",
            mp_last_error());
}

Test(host_pool_bad_pointers, double_free_is_einval) {
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 4 * KiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK);
  refuse_everywhere(p, "a freed pointer");
}

Test(host_pool_bad_pointers, bad_config_is_einval) {
  mp_host_pool_t *other = NULL;
  mp_pool_config_t cfg = {.align = 3000};
  cr_expect_eq(mp_host_pool_create(dev, &cfg, &other), MP_EINVAL);
  cr_expect_null(other);
}

/* A config mp_pool_config_init made under a bad $MEMPOOL_CONF is refused
 * as mp_pool_create refuses it, naming the culprit: the host pool dropped
 * the mark with the flags it ignores and made a pool with the defaults. */
Test(host_pool_bad_pointers, config_made_under_a_bad_mempool_conf_is_einval) {
  setenv("MEMPOOL_CONF", "max_bytes=64M,bogus_key=1", 1);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  mp_host_pool_t *other = NULL;
  cr_expect_eq(mp_host_pool_create(dev, &cfg, &other), MP_EINVAL);
  cr_expect_null(other);
  cr_expect(strstr(mp_last_error(), "MEMPOOL_CONF") != NULL &&
                strstr(mp_last_error(), "bogus_key") != NULL,
            "%s", mp_last_error());
  if (other != NULL)
    mp_host_pool_destroy(other);
  unsetenv("MEMPOOL_CONF");
}
