/* A fraction written with 64 characters or more is copied to the heap to
 * be read (conf.c, mp__read_decimal). When that copy finds no host
 * memory, the option string is refused with MP_ENOMEM, saying so, and
 * nothing of it is applied: it was refused as MP_EINVAL, "is not a
 * fraction in (0, 1]", which the value is. Each host allocation of the
 * parse fails in turn (fault.c) until one k lets the parse through. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool/pool_internal.h"

Test(pool_config_long_fraction_out_of_memory,
     refused_as_enomem_applying_nothing) {
  unsetenv("MEMPOOL_CONF");
  /* "max_bytes=1G,max_fraction=0.25000...0" with 100 characters of value. */
  char opts[160] = "max_bytes=1G,max_fraction=0.25";
  size_t n = strlen(opts);
  memset(opts + n, '0', 100 - 4);
  opts[n + 100 - 4] = '\0';
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=0.5"), MP_OK);
  mp_pool_config_t before = c;
  int failures = 0;
  mp_status_t st = MP_ENOMEM;
  for (long k = 0; k < 16 && st != MP_OK; k++) {
    mp__fault_host_after(k);
    st = mp_pool_config_parse(&c, opts);
    bool hit = !mp__fault_host_pending();
    mp__fault_host_after(-1);
    if (!hit) {
      cr_assert_eq(st, MP_OK, "%s", mp_last_error());
      break;
    }
    failures++;
    cr_assert_eq(st, MP_ENOMEM,
                 "host allocation %ld failed: want MP_ENOMEM, got %d (%s)", k,
                 (int)st, mp_last_error());
    cr_expect(strstr(mp_last_error(), "out of host memory") != NULL, "%s",
              mp_last_error());
    cr_assert(memcmp(&c, &before, sizeof c) == 0,
              "a refused option string changed the config");
  }
  cr_assert_gt(failures, 0, "the long value was parsed with no allocation");
  cr_expect_eq(st, MP_OK);
  cr_expect_eq(c.max_bytes, (size_t)1 << 30);
  cr_expect_eq(c.max_fraction, 0.25);
}
