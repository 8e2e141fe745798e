/* mp_device_spec_canonical: specs that open the same device with the same
 * settings give one text, others differ; the text opens that device; a
 * malformed spec or a short buffer is MP_EINVAL with the buffer untouched. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

static const char *canon(const char *spec, char *buf) {
  cr_assert_eq(mp_device_spec_canonical(spec, buf, MP_DEVICE_SPEC_MAX), MP_OK,
               "'%s': %s", spec, mp_last_error());
  return buf;
}

static void expect_same(const char *a, const char *b) {
  char x[MP_DEVICE_SPEC_MAX], y[MP_DEVICE_SPEC_MAX];
  cr_expect_str_eq(canon(a, x), canon(b, y), "'%s' and '%s'", a, b);
}

static void expect_differ(const char *a, const char *b) {
  char x[MP_DEVICE_SPEC_MAX], y[MP_DEVICE_SPEC_MAX];
  cr_expect_str_neq(canon(a, x), canon(b, y), "'%s' and '%s'", a, b);
}

Test(device_spec_canonical, spellings_of_one_device_give_one_text) {
  char buf[MP_DEVICE_SPEC_MAX];
  cr_expect_str_eq(canon("cuda", buf), "cuda:0");
  cr_expect_str_eq(canon("cuda:007", buf), "cuda:7");
  cr_expect_str_eq(canon("host", buf), "host");
  cr_expect_str_eq(canon("host:capacity=8G", buf), "host:capacity=8589934592");
  expect_same("cuda", "cuda:0");
  expect_same("cuda:1024", "cuda:01024");
  expect_same("host", "host:");
  expect_same("host", "host:capacity=16G,vmm=on,granularity=2M,latency_us=0");
  expect_same("host:capacity=8G", "host:capacity=8192M");
  expect_same("host:capacity=8GiB", "host:capacity=8589934592");
  expect_same("host:capacity=64M,latency_us=20",
              "host:latency_us=20,capacity=64M");
  expect_same("host:vmm=0", "host:vmm=false,granularity=64K");
  expect_same("host:fail_after=0,stream_latency_us=0", "host");
}

Test(device_spec_canonical, other_settings_give_other_texts) {
  expect_differ("cuda:0", "cuda:1");
  expect_differ("cuda", "host");
  expect_differ("host", "host:capacity=8G");
  expect_differ("host:capacity=64M", "host:capacity=65M");
  expect_differ("host", "host:vmm=0");
  expect_differ("host", "host:granularity=64K");
  expect_differ("host:latency_us=1", "host:stream_latency_us=1");
  expect_differ("host", "host:fail_after=3");
}

/* The text is a spec that opens a device with the same settings, and is
 * its own canonical form. */
Test(device_spec_canonical, the_text_opens_the_same_device) {
  const char *specs[] = {"host", "host:capacity=64M,granularity=64K",
                         "host:vmm=no,capacity=1G,latency_us=5",
                         "host:fail_after=9,stream_latency_us=3"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    char c[MP_DEVICE_SPEC_MAX], again[MP_DEVICE_SPEC_MAX];
    canon(specs[i], c);
    cr_expect_str_eq(canon(c, again), c, "'%s'", specs[i]);
    mp_device_t *a = NULL, *b = NULL;
    cr_assert_eq(mp_device_open(specs[i], &a), MP_OK);
    cr_assert_eq(mp_device_open(c, &b), MP_OK, "'%s': %s", c, mp_last_error());
    size_t fa, ta, fb, tb, ga = 0, gb = 0;
    cr_assert_eq(mp_device_mem_info(a, &fa, &ta), MP_OK);
    cr_assert_eq(mp_device_mem_info(b, &fb, &tb), MP_OK);
    cr_expect_eq(ta, tb, "'%s' and '%s'", specs[i], c);
    mp_pool_t *pa, *pb;
    mp_pool_config_t cfg;
    mp_pool_config_init(&cfg);
    cr_assert_eq(mp_pool_create(a, &cfg, &pa), MP_OK);
    cr_assert_eq(mp_pool_create(b, &cfg, &pb), MP_OK);
    void *x, *y;
    cr_assert_eq(mp_pool_alloc(pa, 1, NULL, &x), MP_OK);
    cr_assert_eq(mp_pool_alloc(pb, 1, NULL, &y), MP_OK);
    mp_stats_t sa, sb;
    mp_pool_get_stats(pa, &sa);
    mp_pool_get_stats(pb, &sb);
    ga = sa.reserved_bytes;
    gb = sb.reserved_bytes;
    cr_expect_eq(ga, gb, "'%s' and '%s': the granule", specs[i], c);
    mp_pool_free(pa, x);
    mp_pool_free(pb, y);
    mp_pool_destroy(pa);
    mp_pool_destroy(pb);
    mp_device_close(a);
    mp_device_close(b);
  }
}

/* Refused as mp_device_open refuses it, with its message; buf untouched. */
Test(device_spec_canonical, a_malformed_spec_is_einval_as_mp_device_open_says) {
  const char *bad[] = {"",
                       "gpu",
                       "cuda:",
                       "cuda:x",
                       "cuda:1025",
                       "cuda:-1",
                       "host:",
                       "host:,",
                       "host:capacity=0",
                       "host:vmm=2",
                       "host:size=1G",
                       "host:capacity=1G,capacity=2G",
                       "HOST",
                       "cuda:0,capacity=1G"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_device_t *dev = NULL;
    mp_status_t opened = mp_device_open(bad[i], &dev);
    if (opened == MP_OK) { /* "host:" opens the host device */
      mp_device_close(dev);
      continue;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", mp_last_error());
    char buf[MP_DEVICE_SPEC_MAX] = "untouched";
    cr_expect_eq(mp_device_spec_canonical(bad[i], buf, sizeof buf), MP_EINVAL,
                 "'%s'", bad[i]);
    cr_expect_str_eq(mp_last_error(), why, "'%s'", bad[i]);
    cr_expect_str_eq(buf, "untouched", "'%s'", bad[i]);
  }
  char buf[8] = "x";
  cr_expect_eq(mp_device_spec_canonical(NULL, buf, sizeof buf), MP_EINVAL);
  cr_expect_str_eq(buf, "x");
  cr_expect_eq(mp_device_spec_canonical("host", NULL, 8), MP_EINVAL);
}

/* A cap that leaves no room for the NUL: MP_EINVAL saying how many bytes,
 * buf untouched; the exact size is enough. */
Test(device_spec_canonical, a_short_buffer_is_einval_saying_how_much) {
  char buf[MP_DEVICE_SPEC_MAX];
  memset(buf, 'z', sizeof buf);
  cr_expect_eq(mp_device_spec_canonical("cuda:12", buf, 7), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "8 bytes") != NULL, "%s", mp_last_error());
  cr_expect_eq(buf[0], 'z');
  cr_expect_eq(mp_device_spec_canonical("cuda:12", buf, 0), MP_EINVAL);
  cr_expect_eq(buf[0], 'z');
  cr_expect_eq(mp_device_spec_canonical("cuda:12", buf, 8), MP_OK);
  cr_expect_str_eq(buf, "cuda:12");
  /* The longest host text fits in MP_DEVICE_SPEC_MAX. */
  cr_expect_eq(mp_device_spec_canonical(
                   "host:capacity=18446744073709551615,latency_us=10000000,"
                   "stream_latency_us=10000000,fail_after=18446744073709551615,"
                   "granularity=1T",
                   buf, sizeof buf),
               MP_OK, "%s", mp_last_error());
}
