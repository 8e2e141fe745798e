/* The pool reads and writes numbers the same under any locale: a program
 * that called setlocale(LC_ALL, "") under a locale whose decimal point is
 * ',' (de_DE) still gets max_fraction=0.5 as one half, a JSON dump
 * whose fractions are JSON numbers, and text dumps and messages whose
 * fractions and sizes ("1.50 MiB") have a '.', as do the fractions error
 * messages quote ("max_fraction 1.5 is not in [0, 1]"). */
#include <criterion/criterion.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* glibc's newlocale under $LOCPATH does not free its copy of the path
 * (seen with glibc 2.36): not the pool's leak, so LeakSanitizer is told
 * to look away from that call in the sanitizer build. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LIBC_LEAK_BEGIN() __lsan_disable()
#define LIBC_LEAK_END()   __lsan_enable()
#else
#define LIBC_LEAK_BEGIN() ((void)0)
#define LIBC_LEAK_END()   ((void)0)
#endif

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

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
      LIBC_LEAK_BEGIN();
      locale_t l = newlocale(LC_ALL_MASK, names[i], (locale_t)0);
      LIBC_LEAK_END();
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

Test(pool_locale, fractions_read_with_a_point_under_a_comma_locale,
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

/* Dumps, in format fmt, a pool with a hole between two live blocks (so
 * fragmented) and reads the number after key as the "C" locale reads it:
 * the value, and in *end the character after it. */
static double fragmented_dump_number(const char *fmt, const char *key,
                                     char *end) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=2M,align=512");
  void *p[3];
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p[i]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[1]), MP_OK); /* a hole: fragmented */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  cr_assert_eq(mp_pool_dump(pool, f, fmt), MP_OK, "%s", mp_last_error());
  fclose(f);
  const char *at = strstr(text, key);
  cr_assert_not_null(at, "%s", text);
  at += strlen(key);
  char *stop = NULL;
  locale_t c = newlocale(LC_NUMERIC_MASK, "C", 0);
  double v = strtod_l(at, &stop, c);
  freelocale(c);
  *end = *stop;
  cr_expect(v > 0 && v < 1, "%.40s", at);
  free(text);
  cr_assert_eq(mp_pool_free(pool, p[0]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[2]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  fake_close(dev);
  return v;
}

/* Failed before: "external_fragmentation":0,333333 (printf follows
 * LC_NUMERIC), which no JSON reader takes. */
Test(pool_locale, a_json_dump_writes_fractions_with_a_point,
     .init = use_comma_locale, .fini = back_to_c) {
  char end = 0;
  double frag =
      fragmented_dump_number("json", "\"external_fragmentation\":", &end);
  cr_expect(frag > 0 && frag < 1);
  cr_expect_eq(end, ',', "not one JSON number");
}

/* Failed before: "external fragmentation 0,3333" (printf's %.4f follows
 * LC_NUMERIC), which a reader of the text dump in the C locale, or one
 * comparing it with the JSON dump, reads as 0. */
Test(pool_locale, a_text_dump_writes_fractions_with_a_point,
     .init = use_comma_locale, .fini = back_to_c) {
  char end = 0;
  double frag = fragmented_dump_number("text", "external fragmentation ", &end);
  cr_expect(frag > 0 && frag < 1);
  cr_expect_eq(end, '\n', "not one number with a point");
}

/* Sizes in messages (mp__fmt_bytes: "1.50 MiB") too. Failed before: an
 * allocation over max_bytes said "asked 1,50 MiB". */
Test(pool_locale, a_message_writes_sizes_with_a_point, .init = use_comma_locale,
     .fini = back_to_c) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = make_pool(dev, "virtual=0,max_bytes=1M");
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 3 * ((size_t)1 << 19), NULL, &p), MP_ELIMIT);
  cr_expect(strstr(mp_last_error(), "asked 1.50 MiB") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  fake_close(dev);
}

/* mp_last_error() holds want. */
static void expect_said(const char *want) {
  cr_expect(strstr(mp_last_error(), want) != NULL, "wanted \"%s\" in: %s", want,
            mp_last_error());
}

/* A config refused for its fractions (mp_pool_create checks it). */
static void expect_refused(mp_device_t *dev, double max_fraction,
                           double release_fraction, const char *want) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  c.max_fraction = max_fraction;
  c.release_fraction = release_fraction;
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &pool), MP_EINVAL);
  cr_expect_null(pool);
  expect_said(want);
}

/* Fractions quoted in messages, with their sign, exponent, NaN and
 * infinity as printf's %g writes them in the "C" locale. Failed before:
 * "mp_pool_set_max_fraction: 1,5 is not in [0, 1]" (%g follows
 * LC_NUMERIC). */
Test(pool_locale, a_message_writes_fractions_with_a_point,
     .init = use_comma_locale, .fini = back_to_c) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = make_pool(dev, "virtual=0");
  cr_assert_eq(mp_pool_set_max_fraction(pool, 1.5), MP_EINVAL);
  expect_said("mp_pool_set_max_fraction: 1.5 is not in [0, 1]");
  cr_assert_eq(mp_pool_set_max_fraction(pool, -0.25), MP_EINVAL);
  expect_said("mp_pool_set_max_fraction: -0.25 is not in [0, 1]");
  cr_assert_eq(mp_pool_set_max_fraction(pool, (double)NAN), MP_EINVAL);
  expect_said("mp_pool_set_max_fraction: nan is not in [0, 1]");
  cr_assert_eq(mp_pool_set_max_fraction(pool, -(double)INFINITY), MP_EINVAL);
  expect_said("mp_pool_set_max_fraction: -inf is not in [0, 1]");
  /* 1.5e-9 of 1 GiB is 1 byte, below the alignment: no block fits. */
  cr_assert_eq(mp_pool_set_max_fraction(pool, 1.5e-9), MP_EINVAL);
  expect_said("max_fraction 1.5e-09 of the device's");
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  expect_refused(dev, 1.25, 0, "max_fraction 1.25 is not in");
  expect_refused(dev, 0, 1.875, "release_fraction 1.875 is not in");
  expect_refused(dev, 0, -0.125, "release_fraction -0.125 is not in");
  fake_close(dev);
}
