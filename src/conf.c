/* conf.c - parsing of option strings and sizes.
 *
 * One parser serves every "key=value,key=value" string of the library: the
 * device spec ("host:capacity=8G"), $MEMPOOL_CONF and the preload's options.
 * Sizes take K/M/G/T suffixes (powers of 1024). Parsing never allocates and
 * never changes anything: callers apply values only after a whole string
 * parsed. */
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int mp__lower(int c) {
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

static bool mp__word_eq(const char *s, size_t len, const char *word) {
  size_t n = strlen(word);
  if (n != len)
    return false;
  for (size_t i = 0; i < n; i++)
    if (mp__lower((unsigned char)s[i]) != word[i])
      return false;
  return true;
}

bool mp__parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool mp__parse_size(const char *s, size_t len, size_t *out) {
  size_t digits = 0;
  while (digits < len && s[digits] >= '0' && s[digits] <= '9')
    digits++;
  uint64_t v;
  if (!mp__parse_u64(s, digits, &v))
    return false;
  const char *suf = s + digits;
  size_t slen = len - digits;
  unsigned shift = 0;
  if (slen > 0) {
    switch (mp__lower((unsigned char)suf[0])) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    case 'b': shift = 0; break;
    default: return false;
    }
    /* What may follow the letter: nothing, "B", or "iB". */
    const char *rest = suf + 1;
    size_t rlen = slen - 1;
    if (mp__lower((unsigned char)suf[0]) == 'b') {
      if (rlen != 0)
        return false;
    } else if (!(rlen == 0 || mp__word_eq(rest, rlen, "b") ||
                 mp__word_eq(rest, rlen, "ib"))) {
      return false;
    }
  }
  if (shift && v > (UINT64_MAX >> shift))
    return false;
  v <<= shift;
  if (v > SIZE_MAX)
    return false;
  *out = (size_t)v;
  return true;
}

static size_t mp__digits(const char *s, size_t len) {
  size_t n = 0;
  while (n < len && s[n] >= '0' && s[n] <= '9')
    n++;
  return n;
}

/* buf (len bytes, a decimal number mp__read_decimal checked, its
 * mantissa the first mantissa bytes) as a double in *out. */
static bool mp__strtod_c(const char *buf, size_t len, size_t mantissa,
                         double *out) {
  /* strtod reads the decimal point of LC_NUMERIC (a program that called
   * setlocale(LC_ALL, "") under de_DE has ','): strtod_l in the "C"
   * locale reads '.' whatever the program set. glibc hands "C" out
   * without allocating; elsewhere a failed newlocale is a refusal. */
  locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (c == (locale_t)0)
    return false;
  char *end = NULL;
  double v = strtod_l(buf, &end, c);
  freelocale(c);
  if (end != buf + len)
    return false;
  /* Out of a double's range: strtod gives inf for "1e400" and 0 for
   * "1e-400" (ERANGE), values the text does not say (to a caller, 0 and inf
   * may mean "no limit"). A subnormal result is still the number. */
  if (isinf(v) || (v == 0 && strcspn(buf, "123456789") < mantissa))
    return false;
  *out = v;
  return true;
}

mp_status_t mp__read_decimal(const char *s, size_t len, double *out) {
  size_t i = mp__digits(s, len);
  size_t digits = i;
  if (i < len && s[i] == '.') {
    size_t frac = mp__digits(s + i + 1, len - i - 1);
    digits += frac;
    i += 1 + frac;
  }
  if (digits == 0)
    return MP_EINVAL;
  size_t mantissa = i;
  if (i < len && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < len && (s[i] == '+' || s[i] == '-'))
      i++;
    size_t exp = mp__digits(s + i, len - i);
    if (exp == 0)
      return MP_EINVAL;
    i += exp;
  }
  if (i != len)
    return MP_EINVAL;
  /* A copy to end the text for strtod: on the heap when long (a fraction
   * written with many digits is still a fraction); no room for it is no
   * room, not a bad number. */
  char small[64];
  char *buf = len < sizeof small ? small : mp__host_alloc(len + 1);
  if (buf == NULL)
    return MP_ENOMEM;
  memcpy(buf, s, len);
  buf[len] = '\0';
  bool ok = mp__strtod_c(buf, len, mantissa, out);
  if (buf != small)
    free(buf);
  return ok ? MP_OK : MP_EINVAL;
}

bool mp__parse_bool(const char *s, size_t len, bool *out) {
  static const char *yes[] = {"1", "true", "yes", "on"};
  static const char *no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (mp__word_eq(s, len, yes[i])) {
      *out = true;
      return true;
    }
    if (mp__word_eq(s, len, no[i])) {
      *out = false;
      return true;
    }
  }
  return false;
}

/* The separator of a key=value pair of len bytes at p: '=', or ':' for
 * strings written the way PYTORCH_CUDA_ALLOC_CONF is ("key:value"). */
static const char *mp__kv_sep(const char *p, size_t len) {
  const char *eq = memchr(p, '=', len);
  return eq != NULL ? eq : memchr(p, ':', len);
}

#define MP__KV_MAX 64

/* Whether the key at p (key_len bytes) already stands in str before p: a
 * repeated key is ambiguous (which value was meant?), so it is an error for
 * every option string. Option strings are short; a scan is fine. */
static bool mp__key_seen(const char *str, const char *p, size_t key_len) {
  for (const char *q = str; q < p;) {
    const char *end = strchr(q, ',');
    const char *eq = mp__kv_sep(q, (size_t)(end - q));
    if (eq != NULL && (size_t)(eq - q) == key_len && memcmp(q, p, key_len) == 0)
      return true;
    q = end + 1;
  }
  return false;
}

mp_status_t mp__kv_each(const char *what, const char *str, mp__kv_fn fn,
                        void *ctx) {
  if (str == NULL)
    return MP_OK;
  const char *p = str;
  /* No option string has more keys than MP__KV_MAX (each key may stand
   * once): more pairs are refused before the scan for repeats, which grows
   * with their square (200 000 pairs took seconds to refuse). */
  for (unsigned pairs = 1; *p; pairs++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = mp__kv_sep(p, len);
    char shown[MP__CLIP]; /* a long pair leaves room for the reason */
    if (pairs > MP__KV_MAX)
      return mp__fail(MP_EINVAL,
                      "bad %s: more than %d key=value pairs (at '%s')", what,
                      MP__KV_MAX, mp__clip(p, len, shown, sizeof shown));
    if (eq == NULL || eq == p)
      return mp__fail(MP_EINVAL, "bad %s: '%s' is not key=value", what,
                      mp__clip(p, len, shown, sizeof shown));
    size_t key_len = (size_t)(eq - p);
    if (mp__key_seen(str, p, key_len))
      return mp__fail(MP_EINVAL, "bad %s: '%s' given twice", what,
                      mp__clip(p, key_len, shown, sizeof shown));
    mp_status_t st = fn(ctx, p, key_len, eq + 1, len - key_len - 1);
    if (st != MP_OK)
      return st;
    if (end == NULL)
      break;
    p = end + 1;
    if (*p == '\0')
      return mp__fail(MP_EINVAL, "bad %s: trailing ','", what);
  }
  return MP_OK;
}

const char *mp__fmt_fixed(char *buf, size_t cap, double v, unsigned decimals) {
  uint64_t scale = 1;
  for (unsigned i = 0; i < decimals; i++)
    scale *= 10;
  if (!(v >= 0)) /* negative or NaN: none of the figures written so */
    v = 0;
  if (v >= (double)(UINT64_MAX / 2) / (double)scale) {
    snprintf(buf, cap, "%.0f", v); /* no decimal point to localize */
    return buf;
  }
  uint64_t x = (uint64_t)(v * (double)scale + 0.5);
  if (decimals == 0)
    snprintf(buf, cap, "%llu", (unsigned long long)x);
  else
    snprintf(buf, cap, "%llu.%0*llu", (unsigned long long)(x / scale),
             (int)decimals, (unsigned long long)(x % scale));
  return buf;
}

const char *mp__fmt_g(char *buf, size_t cap, double v) {
  snprintf(buf, cap, "%g", v);
  /* %g writes the calling thread's LC_NUMERIC radix character, which
   * nl_langinfo(RADIXCHAR) names (one or more bytes), at most once: a '.'
   * goes in its place. */
  const char *radix = nl_langinfo(RADIXCHAR);
  size_t n = strlen(radix);
  char *at = n == 0 || strcmp(radix, ".") == 0 ? NULL : strstr(buf, radix);
  if (at != NULL) {
    *at = '.';
    memmove(at + 1, at + n, strlen(at + n) + 1);
  }
  return buf;
}

const char *mp__fmt_bytes(char *buf, size_t cap, size_t bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  size_t u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0) {
    snprintf(buf, cap, "%zu B", bytes);
  } else {
    char num[32]; /* "1.50", never "1,50": not the locale's point */
    snprintf(buf, cap, "%s %s", mp__fmt_fixed(num, sizeof num, v, 2), units[u]);
  }
  return buf;
}
