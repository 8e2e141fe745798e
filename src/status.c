/* status.c - status names and messages, and the per-thread error message.
 *
 * mp_last_error() holds the last failure's one-line description for the
 * calling thread; it lives in thread-local storage so that concurrent
 * callers never see each other's messages. Nothing clears it: status.h
 * promises that a later success leaves the last failure's message. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Thread_local char mp__error_buf[MP__ERROR_MAX];
/* The status of the last mp__fail on this thread, with its message
 * (mp__last_failure): for a call that returned NULL and must say why as a
 * status. */
static _Thread_local mp_status_t mp__error_st = MP_OK;
/* The driver's code behind it (mp_last_driver_error); 0: none. */
static _Thread_local int mp__error_cu;
/* Failures recorded on this thread so far (mp__error_serial): which one
 * the last is. */
static _Thread_local uint64_t mp__error_n;

const char *mp_status_string(mp_status_t s) {
  switch (s) {
#define MP__STATUS_MSG(name, msg)                                              \
  case name: return msg;
    MP_STATUS_LIST(MP__STATUS_MSG)
#undef MP__STATUS_MSG
  }
  return "unknown status";
}

const char *mp_status_name(mp_status_t s) {
  switch (s) {
#define MP__STATUS_NAME(name, msg)                                             \
  case name: return #name;
    MP_STATUS_LIST(MP__STATUS_NAME)
#undef MP__STATUS_NAME
  }
  return "MP_UNKNOWN";
}

const char *mp_last_error(void) {
  return mp__error_buf;
}

/* The length of the well-formed UTF-8 character at p (at most n bytes),
 * its code point in *cp; 0: ill-formed there (RFC 3629, section 4: no
 * overlong form, no surrogate, nothing past U+10FFFF). */
static size_t mp__utf8_char(const unsigned char *p, size_t n, uint32_t *cp) {
  unsigned char c = p[0];
  size_t len = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : (c & 0xf0) == 0xe0     ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
  if (len == 0 || len > n)
    return 0;
  uint32_t v = len == 1 ? c : c & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80)
      return 0;
    v = v << 6 | (p[i] & 0x3f);
  }
  static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < least[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

/* s[0, n) as shown in a message, into out, at most room bytes, whole
 * characters only: a control character (ASCII's, DEL, and C1's U+0080 to
 * U+009F, which a terminal also obeys) and each byte of ill-formed UTF-8
 * as '?', so quoted input keeps a message on one line, off the terminal's
 * controls, and valid UTF-8 (a clip never cuts a character in two).
 * Returns the bytes written; no NUL. */
static size_t mp__shown(const char *s, size_t n, char *out, size_t room) {
  const unsigned char *p = (const unsigned char *)s;
  size_t w = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp = 0;
    size_t len = mp__utf8_char(p + i, n - i, &cp);
    bool control = len == 0 || cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
    size_t out_len = control ? 1 : len;
    if (out_len > room - w)
      break;
    if (control)
      out[w] = '?';
    else
      memcpy(out + w, p + i, len);
    w += out_len;
    i += len != 0 ? len : 1;
  }
  return w;
}

const char *mp__clip(const char *s, size_t len, char *buf, size_t cap) {
  if (len < cap) {
    /* Never longer than s: a control or a bad byte shows as one byte. */
    buf[mp__shown(s, len, buf, cap - 1)] = '\0';
    return buf;
  }
  size_t keep = cap - 4; /* "..." and the NUL */
  size_t head = keep / 2, tail = keep - head;
  size_t w = mp__shown(s, len, buf, head);
  memcpy(buf + w, "...", 3);
  w += 3;
  /* The tail starts on a character: past at most three continuation
   * bytes (a character is at most four bytes long). */
  size_t t = len - tail;
  for (int k = 0; k < 3 && t < len && ((unsigned char)s[t] & 0xc0) == 0x80; k++)
    t++;
  w += mp__shown(s + t, len - t, buf + w, tail);
  buf[w] = '\0';
  return buf;
}

/* msg, len bytes cut from a longer message, ends on a whole character: a
 * UTF-8 sequence the cut left incomplete (a quote of multibyte input, in a
 * message that wraps another) goes, so that the message stays valid UTF-8
 * (status.h), as a clip keeps the quote. */
static void mp__cut_whole(char *msg, size_t len) {
  /* The last character's first byte: past at most three continuation
   * bytes, as mp__clip's tail; cut there unless it is whole. */
  size_t lead = len;
  for (int k = 0;
       k < 3 && lead > 0 && ((unsigned char)msg[lead - 1] & 0xc0) == 0x80; k++)
    lead--;
  uint32_t cp;
  if (lead > 0 && mp__utf8_char((const unsigned char *)msg + lead - 1,
                                len - (lead - 1), &cp) == 0)
    msg[lead - 1] = '\0';
}

/* Records msg as the thread's last failure, of status st and driver code
 * cu. */
static mp_status_t mp__fail_as(mp_status_t st, int cu, const char *fmt,
                               va_list ap) MP__PRINTF(3, 0);
static mp_status_t mp__fail_as(mp_status_t st, int cu, const char *fmt,
                               va_list ap) {
  /* Formatted aside first: an argument may be mp_last_error() itself (a
   * message that wraps the refusal before it), and formatting into the
   * buffer being read is undefined (C11 7.21.6.5, snprintf: "copying
   * takes place between objects that overlap"); glibc garbles it. */
  char msg[sizeof mp__error_buf];
  if (vsnprintf(msg, sizeof msg, fmt, ap) >= (int)sizeof msg)
    mp__cut_whole(msg, sizeof msg - 1);
  memcpy(mp__error_buf, msg, sizeof msg);
  mp__error_st = st;
  mp__error_cu = cu;
  mp__error_n++;
  return st;
}

mp_status_t mp__fail(mp_status_t st, const char *fmt, ...) {
  /* MP_EDRIVER comes only from a driver call (mp__fail_driver); a later
   * mp__fail of it wraps that failure's message and keeps its code. */
  int cu = st == MP_EDRIVER && mp__error_st == MP_EDRIVER ? mp__error_cu : 0;
  va_list ap;
  va_start(ap, fmt);
  mp__fail_as(st, cu, fmt, ap);
  va_end(ap);
  return st;
}

mp_status_t mp__fail_driver(int code, mp_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mp__fail_as(st, st == MP_EDRIVER ? code : 0, fmt, ap);
  va_end(ap);
  return st;
}

/* The one copy in and out of the thread's last error, for the internal
 * pair (mp__error_saved_t) and the public one (mp_error_state_t) alike. */
_Static_assert(sizeof((mp__error_saved_t *)0)->msg == sizeof mp__error_buf &&
                   sizeof((mp_error_state_t *)0)->message ==
                       sizeof mp__error_buf,
               "a saved message holds mp_last_error() whole");

static void mp__error_get(mp_status_t *st, int *cu, char *msg) {
  *st = mp__error_st;
  *cu = mp__error_cu;
  memcpy(msg, mp__error_buf, sizeof mp__error_buf);
}

/* msg: MP__ERROR_MAX bytes, not necessarily NUL-terminated (a caller's
 * mp_error_state_t): the last byte is the terminator, whatever it was. */
static void mp__error_set(mp_status_t st, int cu, const char *msg) {
  mp__error_st = st;
  mp__error_cu = cu;
  memcpy(mp__error_buf, msg, sizeof mp__error_buf - 1);
  mp__error_buf[sizeof mp__error_buf - 1] = '\0';
  mp__error_n++; /* recorded again: not the failure it was */
}

void mp__error_save(mp__error_saved_t *out) {
  mp__error_get(&out->st, &out->cu, out->msg);
}

void mp__error_restore(const mp__error_saved_t *saved) {
  mp__error_set(saved->st, saved->cu, saved->msg);
}

void mp__error_keep(mp__error_kept_t *k) {
  mp__error_save(&k->saved);
  k->serial = mp__error_serial();
}

void mp__error_give_back(const mp__error_kept_t *k) {
  if (mp__error_serial() != k->serial)
    mp__error_restore(&k->saved);
}

/* mp_error_state_t's layout is fixed for good (status.h, "Growing"): a
 * later field takes reserved room, never adds bytes or moves one. */
_Static_assert(sizeof(mp_error_state_t) == 592 &&
                   offsetof(mp_error_state_t, message) == 80,
               "mp_error_state_t keeps its size and the message its place");

size_t mp_error_state_size(void) {
  return sizeof(mp_error_state_t);
}

void mp_error_save(mp_error_state_t *out) {
  if (out == NULL)
    return;
  memset(out, 0, sizeof *out); /* reserved (and padding): 0 */
  out->version = MP_ERROR_STATE_VERSION;
  mp__error_get(&out->status, &out->driver_error, out->message);
}

void mp_error_restore(const mp_error_state_t *in) {
  /* Versions 1 to MP_ERROR_STATE_VERSION are read; any other is not a
   * state this library can read, and is ignored, changing nothing. */
  if (in == NULL || in->version < 1 || in->version > MP_ERROR_STATE_VERSION)
    return;
  mp__error_set(in->status, in->driver_error, in->message);
}

uint64_t mp__error_serial(void) {
  return mp__error_n;
}

mp_status_t mp__last_failure(void) {
  return mp__error_st;
}

mp_status_t mp_last_status(void) {
  return mp__last_failure();
}

int mp_last_driver_error(void) {
  return mp__error_cu;
}

void mp__assert_fail(const char *cond, const char *file, int line,
                     const char *func) {
  fprintf(stderr, "mempool: internal check failed: %s (%s:%d, %s)\n", cond,
          file, line, func);
  fflush(stderr);
  abort();
}
