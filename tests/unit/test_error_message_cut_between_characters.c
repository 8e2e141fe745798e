/* A message longer than mp_last_error() holds is cut between characters:
 * one that wraps another (a call saying what it was doing, then the
 * refusal it got, quoting multibyte input) lost its last bytes wherever
 * they fell, and could end with half a character, no longer valid UTF-8
 * (status.h: quoted input is cut between characters). Found by a review,
 * 2026-12-07. */
#include <criterion/criterion.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void expect_valid_utf8(const char *what, size_t c, size_t shift) {
  const char *msg = mp_last_error();
  size_t n = strlen(msg);
  cr_expect_neq(mbstowcs(NULL, msg, 0), (size_t)-1,
                "%s, char %zu, shift %zu: not valid UTF-8 (%zu bytes)", what, c,
                shift, n);
  /* Only the broken character goes: no more than three bytes. */
  cr_expect_geq(n, MP_ERROR_MESSAGE_MAX - 4, "%s: %zu bytes kept", what, n);
  cr_expect_lt(n, MP_ERROR_MESSAGE_MAX);
}

Test(error_message_cut, a_long_message_ends_on_a_whole_character) {
  cr_assert_not_null(setlocale(LC_CTYPE, "C.UTF-8"), "no C.UTF-8 locale");
  static const char *const chars[] = {"\xc3\xa9", "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80"};
  char s[2 * MP_ERROR_MESSAGE_MAX];
  for (size_t c = 0; c < sizeof chars / sizeof *chars; c++)
    for (size_t shift = 0; shift < 4; shift++) {
      size_t n = strlen(chars[c]), at = shift;
      memset(s, 'a', shift);
      while (at + n < sizeof s) {
        memcpy(s + at, chars[c], n);
        at += n;
      }
      s[at] = '\0';
      mp__fail(MP_EINVAL, "%s", s);
      expect_valid_utf8("whole", c, shift);
      /* A message quoting the one before, as the callers that wrap a
       * refusal write it. */
      mp__fail(MP_EINVAL, "wrapped%.*s: %s", (int)shift, "xyz",
               mp_last_error());
      expect_valid_utf8("wrapped", c, shift);
    }
  setlocale(LC_CTYPE, "C");
}

/* A message that fits is kept byte for byte, whatever it ends with. */
Test(error_message_cut, a_message_that_fits_is_kept_whole) {
  char s[MP_ERROR_MESSAGE_MAX];
  memset(s, 'a', sizeof s - 3);
  memcpy(s + sizeof s - 3, "\xc3\xa9", 3); /* its NUL too */
  mp__fail(MP_EINVAL, "%s", s);
  cr_expect_str_eq(mp_last_error(), s);
}
