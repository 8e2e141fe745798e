/* Device specs: which strings open which device, and how a bad one is
 * reported (MP_EINVAL, nothing opened, a message naming the culprit). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

static void expect_rejected(const char *spec, const char *culprit) {
  mp_device_t *dev = (mp_device_t *)0x1;
  cr_expect_eq(mp_device_open(spec, &dev), MP_EINVAL, "spec '%s'", spec);
  cr_expect_eq(dev, (mp_device_t *)0x1, "spec '%s' wrote *out", spec);
  cr_expect_neq(strstr(mp_last_error(), culprit), NULL,
                "spec '%s': message '%s' should name '%s'", spec,
                mp_last_error(), culprit);
}

static size_t total_of(const char *spec) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "spec '%s': %s", spec,
               mp_last_error());
  size_t f = 0, t = 0;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  cr_expect_str_eq(mp_device_name(dev), "host");
  mp_device_close(dev);
  return t;
}

Test(device_spec, unknown_device_is_einval) {
  expect_rejected("gpu", "gpu");
  expect_rejected("hostess:capacity=1G", "hostess");
  expect_rejected("", "''");
}

Test(device_spec, unknown_option_is_einval) {
  expect_rejected("host:capacty=1G", "capacty");
  expect_rejected("host:capacity=1G,speed=9", "speed");
}

Test(device_spec, bad_values_are_einval) {
  expect_rejected("host:capacity=12X", "12X");
  expect_rejected("host:capacity=0", "capacity");
  expect_rejected("host:capacity=-1", "-1");
  expect_rejected("host:latency_us=fast", "fast");
  expect_rejected("host:latency_us=99999999999", "latency_us");
  expect_rejected("host:stream_latency_us=soon", "soon");
  expect_rejected("host:stream_latency_us=10000001", "stream_latency_us");
  expect_rejected("host:fail_after=-3", "fail_after");
  expect_rejected("host:vmm=2", "vmm");
  /* What it takes, as pool options' booleans (it said "0 or 1", and took
   * "yes" all the same). */
  expect_rejected("host:vmm=2", "true/false, yes/no, on/off");
  expect_rejected("host:granularity=3000", "3000");
  expect_rejected("host:granularity=1K", "granularity");
  expect_rejected("host:granularity=3M", "granularity");
}

Test(device_spec, empty_value_is_einval) {
  expect_rejected("host:capacity=", "capacity");
  expect_rejected("host:vmm=", "vmm");
}

Test(device_spec, malformed_pairs_are_einval) {
  expect_rejected("host:capacity", "capacity");
  expect_rejected("host:=1G", "=1G");
  expect_rejected("host:capacity=1G,,vmm=1", "");
}

Test(device_spec, duplicate_option_is_einval) {
  expect_rejected("host:capacity=1G,capacity=2G", "capacity");
  expect_rejected("host:vmm=1,latency_us=0,vmm=1", "vmm");
}

Test(device_spec, trailing_comma_is_einval) {
  expect_rejected("host:capacity=1G,", "trailing");
}

Test(device_spec, good_specs_open_the_host_device) {
  cr_expect_eq(total_of("host"), (size_t)16 << 30, "default capacity");
  cr_expect_eq(total_of("host:"), (size_t)16 << 30);
  cr_expect_eq(total_of("host:capacity=1T"), (size_t)1 << 40);
  cr_expect_eq(total_of("host:capacity=8MiB,latency_us=0,fail_after=0,vmm=0,"
                        "granularity=4M,stream_latency_us=0"),
               (size_t)8 << 20);
  cr_expect_eq(total_of("host:vmm=off,capacity=512k"), (size_t)512 << 10);
}

Test(device_spec, null_spec_reads_mempool_device) {
  cr_assert_eq(setenv("MEMPOOL_DEVICE", "host:capacity=3M", 1), 0);
  cr_expect_eq(total_of(NULL), (size_t)3 << 20);
  cr_assert_eq(setenv("MEMPOOL_DEVICE", "host:capacity=oops", 1), 0);
  expect_rejected(NULL, "oops");
}

Test(device_spec, null_output_is_einval) {
  cr_expect_eq(mp_device_open("host", NULL), MP_EINVAL);
}
