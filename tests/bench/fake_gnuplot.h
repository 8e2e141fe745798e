/* fake_gnuplot.h - a stand-in gnuplot for mpbench's plot tests (the
 * machines that run the tests need not have one): a script named gnuplot
 * first on PATH. It accepts every terminal, copies the script and data
 * files it is given into a folder of the test's (fake_gnuplot_kept), and
 * makes each 'set output' file empty, as a gnuplot that drew them would.
 * Include after Criterion. */
#ifndef MPBENCH_TEST_FAKE_GNUPLOT_H
#define MPBENCH_TEST_FAKE_GNUPLOT_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* in: a folder of the test's (its scratch folder); the script goes into
 * in/bin, what it is given into in/kept. */
static inline void fake_gnuplot_install(const char *in) {
  char bin[512], kept[512], path[600];
  snprintf(bin, sizeof bin, "%s/bin", in);
  snprintf(kept, sizeof kept, "%s/kept", in);
  cr_assert_eq(mkdir(bin, 0777), 0);
  cr_assert_eq(mkdir(kept, 0777), 0);
  snprintf(path, sizeof path, "%s/gnuplot", bin);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "#!/bin/sh\n"
             "[ \"$1\" = -e ] && exit 0\n"
             "cp \"$1\" *.dat \"$MPB_FAKE_GNUPLOT_KEPT\"/ || exit 1\n"
             "sed -n \"s/^set output '\\(.*\\)'\\$/\\1/p\" \"$1\" |\n"
             "  while IFS= read -r png; do : >\"$png\" || exit 1; done\n");
  cr_assert_eq(fclose(f), 0);
  cr_assert_eq(chmod(path, 0755), 0);
  cr_assert_eq(setenv("MPB_FAKE_GNUPLOT_KEPT", kept, 1), 0);
  const char *old = getenv("PATH");
  char *p = NULL;
  cr_assert_geq(asprintf(&p, "%s:%s", bin, old ? old : "/usr/bin:/bin"), 0);
  cr_assert_eq(setenv("PATH", p, 1), 0);
  free(p);
}

/* A plot test's scratch folder (cli_files.h's, included before this),
 * made: in it a trace of one block whose file is named name (path into
 * trace, tlen bytes), out the path of a folder for --out in it (not made),
 * and the stand-in gnuplot installed. */
static inline void fake_gnuplot_scratch(const char *name, char *trace,
                                        size_t tlen, char *out, size_t olen) {
  scratch_make();
  snprintf(trace, tlen, "%s/%s", scratch_dir(), name);
  put_text(trace, "Thread,Time,Action,Pointer,Size,Stream\n"
                  "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "0,00:00:00.000002,free,0x1000,4096,0\n");
  snprintf(out, olen, "%s/out", scratch_dir());
  fake_gnuplot_install(scratch_dir());
}

/* in/kept/name: what the fake gnuplot was given. */
static inline const char *fake_gnuplot_kept(const char *in, const char *name) {
  static char path[600];
  snprintf(path, sizeof path, "%s/kept/%s", in, name);
  return path;
}

#endif /* MPBENCH_TEST_FAKE_GNUPLOT_H */
