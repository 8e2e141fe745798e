/* Pool options read the same under any locale: a program that called
 * setlocale(LC_ALL, "") under a locale whose decimal point is ',' (de_DE)
 * still gets max_fraction=0.5 as one half. */
#include <criterion/criterion.h>
#include <langinfo.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>

#include "pool/pool_internal.h"

/* A locale whose decimal point is ',': one the system has, else the one
 * the build made with localedef under $MEMPOOL_TEST_LOCALES (LOCPATH is
 * read by newlocale at each call). (locale_t)0 when there is none. */
static locale_t comma_locale(void) {
  static const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
                                "fr_FR.utf8",  "de_DE",      "fr_FR"};
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      const char *dir = getenv("MEMPOOL_TEST_LOCALES");
      if (dir == NULL || dir[0] == '\0')
        break;
      setenv("LOCPATH", dir, 1);
    }
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
      locale_t l = newlocale(LC_ALL_MASK, names[i], (locale_t)0);
      if (l == (locale_t)0)
        continue;
      if (strcmp(nl_langinfo_l(RADIXCHAR, l), ",") == 0)
        return l;
      freelocale(l);
    }
  }
  return (locale_t)0;
}

static locale_t comma;

static void use_comma_locale(void) {
  comma = comma_locale();
  if (comma == (locale_t)0)
    cr_skip_test("no locale with a decimal comma: none installed and the "
                 "build could not make one with localedef");
  uselocale(comma);
  /* The locale does what the test is about: strtod stops at the '.'. */
  cr_assert_eq(strtod("0.5", NULL), 0.0);
}

static void back_to_c(void) {
  uselocale(LC_GLOBAL_LOCALE);
  if (comma != (locale_t)0)
    freelocale(comma);
}

Test(pool_config_locale, fractions_read_with_a_point_under_a_comma_locale,
     .init = use_comma_locale, .fini = back_to_c) {
  unsetenv("MEMPOOL_CONF");
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(
                   &c, "max_fraction=0.5,garbage_collection_threshold=0.25"),
               MP_OK, "%s", mp_last_error());
  cr_expect_eq(c.max_fraction, 0.5);
  cr_expect_eq(c.release_fraction, 0.25);
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=.75"), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(c.max_fraction, 0.75);
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=2.5e-1"), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(c.max_fraction, 0.25);
}
