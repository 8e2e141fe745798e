/* Option strings and sizes: one parser for device specs and MEMPOOL_CONF. */
#include <criterion/criterion.h>
#include <string.h>

#include "internal.h"

static size_t size_of(const char *s) {
  size_t v = 0;
  cr_assert(mp__parse_size(s, strlen(s), &v), "'%s' should parse", s);
  return v;
}

Test(conf, sizes_take_binary_suffixes) {
  cr_expect_eq(size_of("0"), 0);
  cr_expect_eq(size_of("512"), 512);
  cr_expect_eq(size_of("64K"), (size_t)64 << 10);
  cr_expect_eq(size_of("8m"), (size_t)8 << 20);
  cr_expect_eq(size_of("8MiB"), (size_t)8 << 20);
  cr_expect_eq(size_of("8MB"), (size_t)8 << 20);
  cr_expect_eq(size_of("2G"), (size_t)2 << 30);
  cr_expect_eq(size_of("1T"), (size_t)1 << 40);
  cr_expect_eq(size_of("100b"), 100);
}

Test(conf, malformed_sizes_are_rejected) {
  const char *bad[] = {"",
                       "G",
                       "-1",
                       "1.5G",
                       "12X",
                       "8Mx",
                       "1Gib2",
                       "99999999999999999999",
                       "17179869184T",
                       " 1"};
  size_t v = 7;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_expect_not(mp__parse_size(bad[i], strlen(bad[i]), &v),
                  "'%s' should be rejected", bad[i]);
    cr_expect_eq(v, 7, "a rejected size must not change the output");
  }
}

/* A fraction written with more digits than a short buffer holds is still
 * that fraction (it was refused as "not a fraction"); what is not a number
 * is refused however long. */
Test(conf, long_decimals_are_numbers) {
  char s[300];
  memset(s, '0', sizeof s - 1);
  s[sizeof s - 1] = '\0';
  s[1] = '.';
  s[2] = '5';
  double v = 0;
  cr_expect_eq(mp__read_decimal(s, strlen(s), &v), MP_OK, "%s", s);
  cr_expect_eq(v, 0.5);
  s[200] = 'x';
  v = 7;
  cr_expect_eq(mp__read_decimal(s, strlen(s), &v), MP_EINVAL);
  cr_expect_eq(v, 7, "a rejected decimal must not change the output");
}

Test(conf, bools_accept_common_spellings) {
  bool b = false;
  cr_expect(mp__parse_bool("on", 2, &b) && b);
  cr_expect(mp__parse_bool("0", 1, &b) && !b);
  cr_expect(mp__parse_bool("TRUE", 4, &b) && b);
  cr_expect_not(mp__parse_bool("2", 1, &b));
}

struct kv_log {
  char text[256];
  int pairs;
};

static mp_status_t log_pair(void *ctx, const char *k, size_t kl, const char *v,
                            size_t vl) {
  struct kv_log *log = ctx;
  size_t n = strlen(log->text);
  snprintf(log->text + n, sizeof log->text - n, "[%.*s=%.*s]", (int)kl, k,
           (int)vl, v);
  log->pairs++;
  return MP_OK;
}

Test(conf, pairs_are_walked_in_order) {
  struct kv_log log = {{0}, 0};
  cr_assert_eq(mp__kv_each("test", "a=1,bb=,c=x=y", log_pair, &log), MP_OK);
  cr_expect_str_eq(log.text, "[a=1][bb=][c=x=y]");
  cr_expect_eq(log.pairs, 3);
}

Test(conf, malformed_pairs_name_the_culprit) {
  const char *bad[] = {"novalue", "a=1,=2", "a=1,", "a=1,,b=2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct kv_log log = {{0}, 0};
    cr_expect_eq(mp__kv_each("MEMPOOL_CONF", bad[i], log_pair, &log), MP_EINVAL,
                 "'%s'", bad[i]);
    cr_expect(strstr(mp_last_error(), "MEMPOOL_CONF") != NULL, "%s",
              mp_last_error());
  }
}

Test(conf, repeated_keys_are_rejected_before_any_is_applied) {
  struct kv_log log = {{0}, 0};
  cr_expect_eq(mp__kv_each("pool options", "a=1,b=2,a=3", log_pair, &log),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "'a' given twice") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(log.pairs, 2, "the walk stops at the repeated key");
  struct kv_log ok = {{0}, 0};
  cr_expect_eq(mp__kv_each("t", "ab=1,a=2,b=3", log_pair, &ok), MP_OK,
               "keys that share a prefix are different keys");
}

Test(conf, empty_string_has_no_pairs) {
  struct kv_log log = {{0}, 0};
  cr_expect_eq(mp__kv_each("test", "", log_pair, &log), MP_OK);
  cr_expect_eq(mp__kv_each("test", NULL, log_pair, &log), MP_OK);
  cr_expect_eq(log.pairs, 0);
}

Test(status, every_code_has_a_name_and_message) {
  for (int s = MP_OK; s <= MP_EIO; s++) {
    cr_expect_str_neq(mp_status_string((mp_status_t)s), "unknown status");
    cr_expect_eq(strncmp(mp_status_name((mp_status_t)s), "MP_", 3), 0);
  }
  cr_expect_str_eq(mp_status_string((mp_status_t)999), "unknown status");
  cr_expect_str_eq(mp_status_name(MP_ENOMEM), "MP_ENOMEM");
}
