/* test_allocator_child_cap_from_env_is_named.c - a "child" spec whose
 * bytes are above the parent pool's cap is MP_EINVAL naming the cap; where
 * $MEMPOOL_CONF set that cap (the spec names none), the message says so,
 * rather than blaming a max_bytes or max_fraction the spec does not have.
 * Nothing is left on the device either way. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/allocator.h>
#include <mempool/mempool.h>

static void expect_refused(const char *conf, const char *spec,
                           const char *want) {
  setenv("MEMPOOL_CONF", conf, 1);
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=256M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_allocator_t *a = NULL;
  cr_expect_eq(mp_allocator_create(dev, spec, &a), MP_EINVAL, "%s: %s", spec,
               mp_last_error());
  cr_expect_null(a);
  cr_expect_neq(strstr(mp_last_error(), want), NULL,
                "MEMPOOL_CONF=%s, %s: '%s' lacks '%s'", conf, spec,
                mp_last_error(), want);
  size_t f, t;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  cr_expect_eq(f, t, "%s left device memory behind", spec);
  mp_device_close(dev);
  unsetenv("MEMPOOL_CONF");
}

Test(allocator_child_cap, a_cap_from_the_environment_is_named_so) {
  expect_refused("max_bytes=4M", "child:bytes=8M",
                 "its max_bytes, from $MEMPOOL_CONF");
  expect_refused("max_fraction=0.01", "child:bytes=8M",
                 "its max_fraction, from $MEMPOOL_CONF");
}

Test(allocator_child_cap, a_cap_the_spec_set_is_named_as_the_specs) {
  expect_refused("", "child:bytes=8M,max_bytes=4M", "(its max_bytes)");
  /* The spec's cap overrides the environment's. */
  expect_refused("max_bytes=64M", "child:bytes=8M,max_bytes=4M",
                 "(its max_bytes)");
}
