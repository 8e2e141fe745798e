/* A trace whose read fails says why and where: "cannot read trace FILE at
 * offset N: REASON" (strerror of the read's errno, N the bytes read
 * before it). Before, it said only "cannot read trace FILE". A read that
 * fails at once is /proc/self/mem's (EIO at offset 0, no page mapped
 * there); one part way is injected: this executable's fread and ferror
 * (they come before the C library's) give the first bytes of a file named
 * failing, then fail with EIO. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "mpbench.h"
#include "stream_named.h"

static const char *failing; /* a file name: its reads fail past limit */
static size_t limit;        /* bytes given before the failure */
static size_t given;
static FILE *failed; /* the stream whose read failed (its ferror says so) */

size_t fread(void *restrict p, size_t size, size_t n, FILE *restrict f) {
  size_t (*next)(void *restrict, size_t, size_t, FILE *restrict) = (size_t(*)(
      void *restrict, size_t, size_t, FILE *restrict))dlsym(RTLD_NEXT, "fread");
  if (size != 1 || !stream_named(f, failing))
    return next(p, size, n, f);
  if (given >= limit) {
    failed = f;
    errno = EIO;
    return 0;
  }
  size_t got = next(p, 1, n < limit - given ? n : limit - given, f);
  given += got;
  return got;
}

int ferror(FILE *f) {
  int (*next)(FILE *) = (int (*)(FILE *))dlsym(RTLD_NEXT, "ferror");
  return (failed != NULL && f == failed) || next(f);
}

Test(trace_read_error_said, at_once) {
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load("/proc/self/mem", "mem", &w), MP_EINVAL);
  const char *want = "cannot read trace /proc/self/mem at offset 0: ";
  cr_expect_eq(strncmp(mp_last_error(), want, strlen(want)), 0, "%s",
               mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), strerror(EIO)), "%s",
                     mp_last_error());
  cr_expect_eq(w.n, 0);
}

/* mpb_trace_load of a file made of text, its reads failing past limit
 * bytes. */
static mp_status_t load_limited(const char *text, size_t lim, char *path,
                                size_t path_len, mpb_workload_t *w) {
  snprintf(path, path_len, "%s/t.csv", scratch_dir());
  put_text(path, text);
  failing = "t.csv";
  limit = lim;
  mp_status_t st = mpb_trace_load(path, "t", w);
  failing = NULL;
  return st;
}

Test(trace_read_error_said, part_way, .init = scratch_make,
     .fini = scratch_drop) {
  char path[256];
  mpb_workload_t w;
  mp_status_t st = load_limited("Thread,Time,Action,Pointer,Size,Stream\n"
                                "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                                "0,00:00:00.000002,free,0x1000,4096,0\n",
                                50, path, sizeof path, &w);
  cr_assert_eq(st, MP_EINVAL, "%s", mp_last_error());
  char want[512];
  snprintf(want, sizeof want, "cannot read trace %s at offset 50: %s", path,
           strerror(EIO));
  cr_expect_str_eq(mp_last_error(), want);
  cr_expect_eq(w.n, 0);
}

/* The injection by itself fails nothing: the whole file read, it loads. */
Test(trace_read_error_said, all_read, .init = scratch_make,
     .fini = scratch_drop) {
  char path[256];
  mpb_workload_t w;
  mp_status_t st = load_limited("Thread,Time,Action,Pointer,Size,Stream\n"
                                "0,00:00:00.000001,allocate,0x1000,4096,0\n",
                                1000, path, sizeof path, &w);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect_gt(w.n, 0);
  mpb_workload_free(&w);
}
