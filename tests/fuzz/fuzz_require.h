/* fuzz_require.h - what every harness shares: the check (a broken
 * expectation traps, so that libFuzzer and the ctest replay report the
 * input that broke it, with the condition, the place and the library's last
 * error), the entry point's prototype, and the input as a C string, as text
 * with a header in front (half the time, so that mutations reach the rows)
 * or as a file. */
#ifndef MEMPOOL_FUZZ_REQUIRE_H
#define MEMPOOL_FUZZ_REQUIRE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mempool/status.h>

#define FZ_REQUIRE(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond,    \
              mp_last_error());                                                \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A refusal of bad input (or for want of host memory): mp_last_error()
 * says why, naming `names` when it is not NULL. */
static inline void fz_refused(mp_status_t st, const char *names) {
  FZ_REQUIRE(st == MP_EINVAL || st == MP_ENOMEM);
  FZ_REQUIRE(mp_last_error()[0] != '\0');
  FZ_REQUIRE(names == NULL || strstr(mp_last_error(), names) != NULL);
}

/* data[0, size) as a C string in buf[0, cap), cut at cap - 1 bytes (specs
 * and option strings are short; longer adds nothing). */
static inline const char *fz_cstr(const uint8_t *data, size_t size, char *buf,
                                  size_t cap) {
  size_t n = size < cap - 1 ? size : cap - 1;
  memcpy(buf, data, n);
  buf[n] = '\0';
  return buf;
}

/* data as text, after header when data[0] is odd (that byte dropped);
 * malloc'd, its length in *len; NULL without host memory. */
static inline char *fz_with_header(const uint8_t *data, size_t size,
                                   const char *header, size_t *len) {
  int with = size > 0 && (data[0] & 1);
  size_t hl = with ? strlen(header) : 0, skip = with ? 1 : 0;
  char *text = malloc(hl + size + 1);
  if (text == NULL)
    return NULL;
  memcpy(text, header, hl);
  if (size > skip)
    memcpy(text + hl, data + skip, size - skip);
  *len = hl + size - skip;
  text[*len] = '\0';
  return text;
}

/* text[0, len) as the content of this process's scratch file (made once in
 * $TMPDIR, else /dev/shm, else /tmp, removed at exit); its path, or NULL if
 * it cannot be written. /dev/shm (memory) runs the file harness about three
 * times faster than a disk's /tmp. */
static char fz_path_[4096];
static void fz_remove_file_(void) {
  unlink(fz_path_);
}
static inline const char *fz_file(const char *text, size_t len) {
  static int fd = -1;
  if (fd < 0) {
    const char *env = getenv("TMPDIR");
    const char *dirs[] = {env != NULL && env[0] != '\0' ? env : "/dev/shm",
                          "/tmp"};
    for (size_t i = 0; i < 2 && fd < 0; i++) {
      snprintf(fz_path_, sizeof fz_path_, "%s/mempool_fuzz_XXXXXX", dirs[i]);
      fd = mkstemp(fz_path_);
    }
    if (fd < 0)
      return NULL;
    atexit(fz_remove_file_);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text, len, 0) != (ssize_t)len)
    return NULL;
  return fz_path_;
}

#endif /* MEMPOOL_FUZZ_REQUIRE_H */
