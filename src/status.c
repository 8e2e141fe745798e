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

/* buf with each ASCII control byte (a newline, an escape) as '?': quoted
 * input keeps a message on one line, and off the terminal's controls. */
static const char *mp__no_controls(char *buf) {
  for (char *c = buf; *c != '\0'; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f)
      *c = '?';
  return buf;
}

const char *mp__clip(const char *s, size_t len, char *buf, size_t cap) {
  if (len < cap) {
    memcpy(buf, s, len);
    buf[len] = '\0';
    return mp__no_controls(buf);
  }
  size_t keep = cap - 4; /* "..." and the NUL */
  size_t head = keep / 2, tail = keep - head;
  memcpy(buf, s, head);
  memcpy(buf + head, "...", 3);
  memcpy(buf + head + 3, s + len - tail, tail);
  buf[cap - 1] = '\0';
  return mp__no_controls(buf);
}

mp_status_t mp__fail(mp_status_t st, const char *fmt, ...) {
  /* Formatted aside first: an argument may be mp_last_error() itself (a
   * message that wraps the refusal before it), and formatting into the
   * buffer being read is undefined (C11 7.21.6.5, snprintf: "copying
   * takes place between objects that overlap"); glibc garbles it. */
  char msg[sizeof mp__error_buf];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(mp__error_buf, msg, sizeof msg);
  mp__error_st = st;
  mp__error_n++;
  return st;
}

void mp__error_save(mp__error_saved_t *out) {
  out->st = mp__error_st;
  memcpy(out->msg, mp__error_buf, sizeof out->msg);
}

void mp__error_restore(const mp__error_saved_t *saved) {
  mp__error_st = saved->st;
  memcpy(mp__error_buf, saved->msg, sizeof mp__error_buf);
  mp__error_n++; /* recorded again: not the failure it was */
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

void mp__assert_fail(const char *cond, const char *file, int line,
                     const char *func) {
  fprintf(stderr, "mempool: internal check failed: %s (%s:%d, %s)\n", cond,
          file, line, func);
  fflush(stderr);
  abort();
}
