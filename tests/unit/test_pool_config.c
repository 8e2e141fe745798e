/* Pool configuration: defaults, $MEMPOOL_CONF, option strings, validation. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pool/pool_internal.h"
#include "pool_fakedev.h"

Test(pool_config, defaults_without_environment) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_expect_eq(c.max_bytes, 0);
  cr_expect_eq(c.align, 512);
  cr_expect_eq(c.segment_bytes, (size_t)2 << 20);
  cr_expect_eq(c.max_split, 0);
  cr_expect_eq(c.flags, MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM);
}

Test(pool_config, every_key_parses) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "max_bytes=8G,align=4K,segment_bytes="
                                        "20M,max_split=64M,virtual=0,"
                                        "defrag_on_oom=off"),
               MP_OK, "%s", mp_last_error());
  cr_expect_eq(c.max_bytes, (size_t)8 << 30);
  cr_expect_eq(c.align, 4096);
  cr_expect_eq(c.segment_bytes, (size_t)20 << 20);
  cr_expect_eq(c.max_split, (size_t)64 << 20);
  cr_expect_eq(c.flags, 0);
  cr_assert_eq(mp_pool_config_parse(&c, "virtual=yes"), MP_OK);
  cr_expect_eq(c.flags, MP_POOL_VIRTUAL);
  cr_expect_eq(mp_pool_config_parse(&c, ""), MP_OK);
}

Test(pool_config, bad_strings_name_the_culprit_and_change_nothing) {
  unsetenv("MEMPOOL_CONF");
  const char *bad[][2] = {{"max_bytez=1G", "max_bytez"},
                          {"align=3", "align"},
                          {"align=12X", "align"},
                          {"virtual=maybe", "virtual"},
                          {"segment_bytes=", "segment_bytes"},
                          {"max_split=4M,oops", "oops"},
                          {"align=1024,bogus=1", "bogus"},
                          {"align=512,align=1024", "given twice"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mp_pool_config_t c, orig;
    mp_pool_config_init(&c);
    orig = c;
    cr_expect_eq(mp_pool_config_parse(&c, bad[i][0]), MP_EINVAL, "%s",
                 bad[i][0]);
    cr_expect(strstr(mp_last_error(), bad[i][1]), "'%s': message '%s'",
              bad[i][0], mp_last_error());
    cr_expect_eq(memcmp(&c, &orig, sizeof c), 0, "'%s' changed the config",
                 bad[i][0]);
  }
  cr_expect_eq(mp_pool_config_parse(NULL, "align=512"), MP_EINVAL);
}

Test(pool_config, environment_overrides_defaults) {
  setenv("MEMPOOL_CONF", "align=1024,max_bytes=1G", 1);
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_expect_eq(c.align, 1024);
  cr_expect_eq(c.max_bytes, (size_t)1 << 30);
  unsetenv("MEMPOOL_CONF");
}

Test(pool_config, bad_environment_keeps_defaults_and_create_reports_it) {
  setenv("MEMPOOL_CONF", "align=512,colour=blue", 1);
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_expect_eq(c.align, 512);
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "colour"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_create(dev, NULL, &p), MP_EINVAL);
  cr_expect_null(p);
  unsetenv("MEMPOOL_CONF");
  fake_close(dev);
}

/* The mark of a bad $MEMPOOL_CONF lives in struct_size, not in flags: a
 * caller that sets flags by assignment (the usual way) keeps it, and flags
 * hold only the documented bits. */
Test(pool_config, a_bad_environment_is_refused_whatever_flags_are_set) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_expect_eq(c.flags, MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM);
  setenv("MEMPOOL_CONF", "colour=blue", 1);
  mp_pool_config_init(&c);
  cr_expect_eq(c.flags, MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM);
  cr_expect_eq(c.struct_size & ~MP_POOL_CONFIG_BAD_ENV,
               sizeof(mp_pool_config_t));
  c.flags = MP_POOL_VIRTUAL;
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "colour"), "%s", mp_last_error());
  mp_pool_config_t before = c;
  cr_expect_eq(mp_pool_config_parse(&c, "align=1024"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "colour"), "%s", mp_last_error());
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
  /* The variable put right after the config was made: still refused. */
  unsetenv("MEMPOOL_CONF");
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "MEMPOOL_CONF"), "%s", mp_last_error());
  cr_expect_null(p);
  /* The top flag bit is an unknown flag like any other. */
  mp_pool_config_init(&c);
  c.flags = 0x80000000u;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "unknown flags"), "%s", mp_last_error());
  cr_expect_null(p);
  fake_close(dev);
}

/* The mark of a bad $MEMPOOL_CONF is the top bit on a size
 * mp_pool_config_init wrote. A struct_size that is garbage with that bit
 * set (a config never made by init: stack garbage, a foreign struct) is an
 * unknown size, named as such and changing nothing; it was blamed on
 * $MEMPOOL_CONF, unset here ("the config was made while $MEMPOOL_CONF was
 * bad"). */
Test(pool_config, a_garbage_struct_size_is_no_bad_environment) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  memset(&c.struct_size, 0xee, sizeof c.struct_size);
  cr_assert(c.struct_size & MP_POOL_CONFIG_BAD_ENV, "set-up: the top bit");
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "is not a size of mp_pool_config_t"), "%s",
            mp_last_error());
  cr_expect_null(strstr(mp_last_error(), "MEMPOOL_CONF"), "%s",
                 mp_last_error());
  cr_expect_null(p);
  mp_pool_config_t before = c;
  cr_expect_eq(mp_pool_config_parse(&c, "align=1024"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "is not a size of mp_pool_config_t"), "%s",
            mp_last_error());
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
  /* The mark on a size init writes is still the bad $MEMPOOL_CONF's. */
  c.struct_size = sizeof c | MP_POOL_CONFIG_BAD_ENV;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "MEMPOOL_CONF"), "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_config, create_validates_the_config) {
  unsetenv("MEMPOOL_CONF");
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_config_t c;
  mp_pool_t *p = NULL;
  mp_pool_config_init(&c);
  c.align = 768;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "power of two"), "%s", mp_last_error());
  mp_pool_config_init(&c);
  c.flags |= 0x100;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  mp_pool_config_init(&c);
  c.max_bytes = 100;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect_null(p);
  mp_pool_config_init(&c);
  c.align = 0; /* 0 means the default */
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK);
  mp_pool_destroy(p);
  fake_close(dev);
}

/* pausable=1 promises that pause always can, which only the virtual range
 * does: with virtual=0 (or PyTorch's expandable_segments=0) create is
 * MP_EINVAL, from an option string, $MEMPOOL_CONF or the struct's flags
 * alike. It used to make a pool of plain segments that no pause could
 * keep, without a word. */
static void expect_pausable_refused(mp_device_t *dev, mp_pool_config_t *c,
                                    mp_status_t want, const char *says) {
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, c, &p), want, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), says) != NULL, "%s", mp_last_error());
  cr_expect_null(p);
  if (p != NULL)
    mp_pool_destroy(p);
}

Test(pool_config, pausable_without_virtual_is_einval_at_create) {
  unsetenv("MEMPOOL_CONF");
  mp_device_t *dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  const char *opts[] = {"pausable=1,virtual=0", "virtual=off,pausable=yes",
                        "expandable_segments=0,pausable=1"};
  mp_pool_config_t c;
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    mp_pool_config_init(&c);
    cr_assert_eq(mp_pool_config_parse(&c, opts[i]), MP_OK, "%s", opts[i]);
    expect_pausable_refused(dev, &c, MP_EINVAL, "pausable=1 needs virtual=1");
  }
  setenv("MEMPOOL_CONF", "pausable=1,virtual=0", 1);
  mp_pool_config_init(&c);
  unsetenv("MEMPOOL_CONF");
  expect_pausable_refused(dev, &c, MP_EINVAL, "pausable=1 needs virtual=1");
  mp_pool_config_init(&c);
  c.flags = MP_POOL_PAUSABLE | MP_POOL_DEFRAG_ON_OOM;
  expect_pausable_refused(dev, &c, MP_EINVAL, "pausable=1 needs virtual=1");
  /* With the range (the default), and without pausable: made. */
  mp_pool_t *p = NULL;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "pausable=1"), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s", mp_last_error());
  mp_pool_destroy(p);
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "virtual=0"), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s", mp_last_error());
  mp_pool_destroy(p);
  fake_close(dev);
}

/* The same asked of a device without virtual memory: every segment would
 * be plain. MP_ENOTSUP (the device cannot), the message naming it. A pool
 * without pausable=1 is made there as before, on plain segments. */
Test(pool_config, pausable_on_a_device_without_virtual_memory_is_enotsup) {
  unsetenv("MEMPOOL_CONF");
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "pausable=1"), MP_OK);
  expect_pausable_refused(dev, &c, MP_ENOTSUP, "needs virtual memory");
  cr_expect(strstr(mp_last_error(), "'fake'") != NULL, "%s", mp_last_error());
  mp_pool_t *p = NULL;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s", mp_last_error());
  mp_pool_destroy(p);
  fake_close(dev);
  /* The emulated device with its virtual memory off. */
  cr_assert_eq(mp_device_open("host:vmm=0", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "pausable=1"), MP_OK);
  expect_pausable_refused(dev, &c, MP_ENOTSUP, "needs virtual memory");
  mp_device_close(dev);
}

Test(pool_config, pytorch_option_names_mean_the_same_here) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  /* Written as PYTORCH_CUDA_ALLOC_CONF is: key:value. */
  cr_assert_eq(mp_pool_config_parse(
                   &c, "expandable_segments:False,max_split_size_mb:128"),
               MP_OK, "%s", mp_last_error());
  cr_expect_eq(c.flags & MP_POOL_VIRTUAL, 0);
  cr_expect_eq(c.max_split, (size_t)128 << 20);
  cr_assert_eq(mp_pool_config_parse(&c, "expandable_segments=True"), MP_OK);
  cr_expect_neq(c.flags & MP_POOL_VIRTUAL, 0);
}

Test(pool_config, two_names_for_one_setting_are_einval_and_change_nothing) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c, before;
  mp_pool_config_init(&c);
  before = c;
  cr_expect_eq(mp_pool_config_parse(&c, "virtual=1,expandable_segments=0"),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "same thing"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_config_parse(&c, "max_split_size_mb:1,max_split=2M"),
               MP_EINVAL);
  cr_expect_eq(mp_pool_config_parse(&c, "max_split_size_mb:1.5"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "max_split_size_mb"), "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_config_parse(&c, "roundup_power2_divisions:4"),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "expandable_segments"),
            "the message lists the known keys: %s", mp_last_error());
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(pool_config, per_process_memory_fraction_is_max_fraction) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c, before;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "per_process_memory_fraction:0.5"),
               MP_OK, "%s", mp_last_error());
  cr_expect_eq(c.max_fraction, 0.5);
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(p->cap, (size_t)512 << 20);
  mp_pool_destroy(p);
  fake_close(dev);
  /* Both names at once: one setting given twice. */
  mp_pool_config_init(&c);
  before = c;
  cr_expect_eq(mp_pool_config_parse(
                   &c, "max_fraction=0.5,per_process_memory_fraction:0.5"),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "same thing"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_config_parse(&c, "per_process_memory_fraction:1.5"),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "per_process_memory_fraction"), "%s",
            mp_last_error());
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
}

/* garbage_collection_threshold=f gives release_threshold = f x the memory
 * the pool may hold, fixed at create. */
static size_t release_threshold_of(mp_device_t *dev, const char *opts) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, opts), MP_OK, "%s: %s", opts,
               mp_last_error());
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_OK, "%s: %s", opts,
               mp_last_error());
  size_t th = p->cfg.release_threshold;
  mp_pool_destroy(p);
  return th;
}

Test(pool_config, garbage_collection_threshold_is_a_share_of_the_cap) {
  unsetenv("MEMPOOL_CONF");
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  cr_expect_eq(release_threshold_of(
                   dev, "max_bytes=256M,garbage_collection_threshold:0.5"),
               (size_t)128 << 20);
  cr_expect_eq(release_threshold_of(dev, "per_process_memory_fraction:0.5,"
                                         "garbage_collection_threshold:0.25"),
               (size_t)128 << 20);
  /* No cap: the device's memory is what the pool may hold. */
  cr_expect_eq(release_threshold_of(dev, "garbage_collection_threshold:0.75"),
               (size_t)768 << 20);
  /* A share under one byte is one byte, not 0, which would mean "keep all
   * until trim": the smallest threshold kept the most memory. */
  cr_expect_eq(release_threshold_of(dev, "garbage_collection_threshold:1e-12"),
               1);
  fake_close(dev);
}

Test(pool_config, bad_garbage_collection_threshold_is_einval) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c, before;
  mp_pool_config_init(&c);
  before = c;
  /* PyTorch's range: strictly between 0 and 1. */
  const char *bad[] = {
      "garbage_collection_threshold:1", "garbage_collection_threshold:0",
      "garbage_collection_threshold:-0.5", "garbage_collection_threshold:most"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(mp_pool_config_parse(&c, bad[i]), MP_EINVAL, "%s", bad[i]);
    cr_expect(strstr(mp_last_error(), "garbage_collection_threshold"), "%s",
              mp_last_error());
  }
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
  /* Both ways of setting the threshold: refused at create. */
  cr_assert_eq(
      mp_pool_config_parse(
          &c, "release_threshold=64M,garbage_collection_threshold:0.5"),
      MP_OK);
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "give one"), "%s", mp_last_error());
  cr_expect_null(p);
  fake_close(dev);
}

/* A long bad value is quoted shortened, so that the message still says
 * what is wrong with it (the error buffer holds 512 bytes). Failed
 * before: the quoted value filled the message and the reason was cut. */
Test(pool_config, a_long_bad_value_leaves_room_for_the_reason) {
  unsetenv("MEMPOOL_CONF");
  char opts[1024] = "max_bytes=";
  size_t l = strlen(opts);
  memset(opts + l, '7', 700);
  opts[l + 700] = 'Q';
  opts[l + 701] = '\0';
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, opts), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "7Q' is not a size") != NULL, "'%s'",
            mp_last_error());
  char key[1024];
  memset(key, 'k', 700);
  snprintf(key + 700, sizeof key - 700, "z=1");
  cr_assert_eq(mp_pool_config_parse(&c, key), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "kz' (expected one of max_bytes") != NULL,
            "'%s'", mp_last_error());
}
