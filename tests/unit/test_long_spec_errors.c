/* A long option string, device spec or allocator spec is quoted shortened
 * in its refusal, so that mp_last_error (512 bytes) still says what is wrong
 * with it: quoted whole, the input filled the message and the reason ("is
 * not key=value", "unknown device") was cut off. */
#include <criterion/criterion.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mempool/allocator.h"
#include "mempool/device.h"
#include "mempool/pool.h"

#define LONG_LEN 1500

/* LONG_LEN letters 'a', NUL-terminated, in buf (LONG_LEN + 1 bytes). */
static const char *long_word(char *buf) {
  memset(buf, 'a', LONG_LEN);
  buf[LONG_LEN] = '\0';
  return buf;
}

/* The last failure ends with reason and fits the buffer with room. */
static void expect_reason(const char *input, const char *reason) {
  const char *msg = mp_last_error();
  size_t n = strlen(msg), r = strlen(reason);
  cr_expect_lt(n, MP__ERROR_MAX - 1, "message filled the buffer: %s", msg);
  cr_expect(n >= r && strcmp(msg + n - r, reason) == 0,
            "input %.40s...: message does not end with '%s': %s", input, reason,
            msg);
}

Test(long_spec_errors, pool_options_keep_their_reason) {
  char w[LONG_LEN + 1], s[2 * LONG_LEN + 16];
  long_word(w);
  mp_pool_config_t cfg, before;
  mp_pool_config_init(&cfg);
  before = cfg;
  cr_assert_eq(mp_pool_config_parse(&cfg, w), MP_EINVAL);
  expect_reason(w, "' is not key=value");
  snprintf(s, sizeof s, "%s=1,%s=2", w, w);
  cr_assert_eq(mp_pool_config_parse(&cfg, s), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "unknown key") != NULL, "%s",
            mp_last_error());
  snprintf(s, sizeof s, "max_split=1,max_split:%s", w);
  cr_assert_eq(mp_pool_config_parse(&cfg, s), MP_EINVAL);
  expect_reason(s, "' given twice");
  cr_expect_eq(memcmp(&cfg, &before, sizeof cfg), 0, "a refusal changed cfg");
}

Test(long_spec_errors, device_specs_keep_their_reason) {
  char w[LONG_LEN + 1], s[LONG_LEN + 64];
  long_word(w);
  mp_device_t *dev = NULL;
  snprintf(s, sizeof s, "host:capacity=1G,%s", w);
  cr_assert_eq(mp_device_open(s, &dev), MP_EINVAL);
  expect_reason(s, "' is not key=value");
  snprintf(s, sizeof s, "host:%s=1", w);
  cr_assert_eq(mp_device_open(s, &dev), MP_EINVAL);
  expect_reason(s, "' (known: capacity, latency_us, stream_latency_us, "
                   "fail_after, vmm, granularity)");
  snprintf(s, sizeof s, "host:capacity=%s", w);
  cr_assert_eq(mp_device_open(s, &dev), MP_EINVAL);
  expect_reason(s, "': expected a size above 0 (e.g. 16G)");
  cr_assert_eq(mp_device_open(w, &dev), MP_EINVAL);
  expect_reason(w, "' (expected 'host' or 'cuda')");
  cr_expect_null(dev);
}

Test(long_spec_errors, allocator_specs_keep_their_reason) {
  char w[LONG_LEN + 1], s[LONG_LEN + 64];
  long_word(w);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  mp_allocator_t *a = NULL;
  cr_assert_eq(mp_allocator_create(dev, w, &a), MP_EINVAL);
  expect_reason(w, "' (expected pool, child or direct)");
  snprintf(s, sizeof s, "child:bytes=%s", w);
  cr_assert_eq(mp_allocator_create(dev, s, &a), MP_EINVAL);
  expect_reason(s, "' is not a non-zero size");
  snprintf(s, sizeof s, "child:max_split=1%s", w);
  cr_assert_eq(mp_allocator_create(dev, s, &a), MP_EINVAL);
  expect_reason(s, "': child needs bytes=SIZE");
  snprintf(s, sizeof s, "direct:%s", w);
  cr_assert_eq(mp_allocator_create(dev, s, &a), MP_EINVAL);
  expect_reason(s, "': direct takes no options");
  cr_expect_null(a);
  mp_device_close(dev);
}

Test(long_spec_errors, a_dump_format_keeps_its_reason) {
  char w[LONG_LEN + 1];
  long_word(w);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  FILE *out = tmpfile();
  cr_assert_not_null(out);
  cr_assert_eq(mp_pool_dump(pool, out, w), MP_EINVAL);
  expect_reason(w, "' (expected text, json or torch)");
  cr_expect_eq(ftell(out), 0, "a refused dump wrote");
  fclose(out);
  mp_pool_destroy(pool);
  mp_device_close(dev);
}

/* A clipped quote cuts between characters, never inside one: for runs of
 * two-, three- and four-byte characters, shifted by 0 to 3 ASCII bytes so
 * that the cut meets every offset inside a character, the message is valid
 * UTF-8 (mbstowcs in a UTF-8 locale) and still ends with its reason. */
Test(long_spec_errors, a_clip_never_cuts_a_character) {
  cr_assert_not_null(setlocale(LC_CTYPE, "C.UTF-8"), "no C.UTF-8 locale");
  static const char *const chars[] = {"\xc3\xa9", "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80"};
  char s[LONG_LEN + 8];
  for (size_t c = 0; c < sizeof chars / sizeof *chars; c++)
    for (size_t shift = 0; shift < 4; shift++)
      for (size_t tailshift = 0; tailshift < 4; tailshift++) {
        size_t n = strlen(chars[c]), at = 0;
        memset(s, 'a', shift);
        at = shift;
        while (at + n < LONG_LEN) {
          memcpy(s + at, chars[c], n);
          at += n;
        }
        memset(s + at, 'b', tailshift);
        s[at + tailshift] = '\0';
        mp_pool_config_t cfg;
        mp_pool_config_init(&cfg);
        cr_assert_eq(mp_pool_config_parse(&cfg, s), MP_EINVAL);
        const char *msg = mp_last_error();
        cr_expect_neq(mbstowcs(NULL, msg, 0), (size_t)-1,
                      "char %zu, shift %zu/%zu: not valid UTF-8: %s", c, shift,
                      tailshift, msg);
        cr_expect(strstr(msg, "...") != NULL, "not clipped: %s", msg);
        expect_reason(s, "' is not key=value");
      }
  setlocale(LC_CTYPE, "C");
}

/* A spec of many pairs is refused at its 65th (no option string has more
 * keys than that): a child spec takes any key until the pool options are
 * parsed, and the scan for repeated keys grows with the square of the
 * pairs (20 000 took 2.85 s to refuse, 40 000 18 s). The refusal names the
 * first pair past the limit, wherever the spec is given. */
Test(long_spec_errors, a_spec_of_many_pairs_is_refused_at_the_limit) {
  size_t pairs = 20000;
  char *spec = malloc(pairs * 16 + 32);
  cr_assert_not_null(spec);
  size_t n = (size_t)sprintf(spec, "child:bytes=1M");
  for (size_t i = 0; i < pairs; i++)
    n += (size_t)sprintf(spec + n, ",k%zu=1", i);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  mp_allocator_t *a = NULL;
  cr_assert_eq(mp_allocator_create(dev, spec, &a), MP_EINVAL);
  cr_expect(strstr(mp_last_error(),
                   "more than 64 key=value pairs (at 'k63=1')") != NULL,
            "%s", mp_last_error());
  cr_expect_null(a);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_expect_eq(mp_pool_config_parse(&cfg, spec + strlen("child:")), MP_EINVAL);
  mp_device_close(dev);
  free(spec);
}
