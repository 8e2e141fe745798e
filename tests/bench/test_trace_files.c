/* Finding trace files (core/trace.c): the *.csv files of a folder and of
 * its direct subfolders, relative to it and in name order; hidden files,
 * other extensions and deeper folders are not traces; a folder that
 * cannot be opened is MP_EINVAL naming it; $MEMPOOL_TRACES names the
 * folder when none is given. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpbench.h"

static char root[64];

static void touch(const char *rel) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "%s", p);
  fclose(f);
}

static void sub(const char *rel) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  cr_assert_eq(mkdir(p, 0700), 0, "%s", p);
}

static void make_tree(void) {
  strcpy(root, "/tmp/mp_trace_files_XXXXXX");
  cr_assert_not_null(mkdtemp(root));
  sub("pytorch");
  sub("mindspore");
  sub("pytorch/deeper");
  touch("top.csv");
  touch(".hidden.csv");
  touch("notes.txt");
  touch("pytorch/b.csv");
  touch("pytorch/a.csv");
  touch("pytorch/.x.csv");
  touch("pytorch/deeper/too_deep.csv");
  touch("mindspore/z.csv");
  touch("mindspore/csv");
}

static void remove_tree(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  cr_expect_eq(system(cmd), 0);
}

Test(trace_files, csv_files_of_the_folder_and_its_subfolders_in_order,
     .init = make_tree, .fini = remove_tree) {
  char **v = NULL;
  size_t n = 0;
  cr_assert_eq(mpb_traces_scan(root, &v, &n), MP_OK, "%s", mp_last_error());
  const char *want[] = {"mindspore/z.csv", "pytorch/a.csv", "pytorch/b.csv",
                        "top.csv"};
  cr_assert_eq(n, 4, "found %zu files", n);
  for (size_t i = 0; i < n; i++)
    cr_expect_str_eq(v[i], want[i]);
  mpb_traces_free(v, n);
}

/* A FIFO (or socket, device) named *.csv in the folder is left out: a
 * replay would block opening it until something writes to it. A trace
 * given by name may still be a pipe (mpbench replay <(...)). */
Test(trace_files, a_folder_scan_takes_regular_files_only, .init = make_tree,
     .fini = remove_tree) {
  char p[256];
  snprintf(p, sizeof p, "%s/pipe.csv", root);
  cr_assert_eq(mkfifo(p, 0600), 0, "%s", p);
  snprintf(p, sizeof p, "%s/pytorch/pipe.csv", root);
  cr_assert_eq(mkfifo(p, 0600), 0, "%s", p);
  char **v = NULL;
  size_t n = 0;
  cr_assert_eq(mpb_traces_scan(root, &v, &n), MP_OK, "%s", mp_last_error());
  cr_expect_eq(n, 4, "found %zu files", n);
  for (size_t i = 0; i < n; i++)
    cr_expect(strstr(v[i], "pipe") == NULL, "%s", v[i]);
  mpb_traces_free(v, n);
}

Test(trace_files, a_missing_folder_is_einval_naming_it) {
  char **v = (char **)&v;
  size_t n = 7;
  cr_assert_eq(mpb_traces_scan("/nonexistent/mp_traces", &v, &n), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "/nonexistent/mp_traces") != NULL, "%s",
            mp_last_error());
  cr_expect_null(v);
  cr_expect_eq(n, 0);
}

Test(trace_files, mempool_traces_names_the_folder) {
  setenv("MEMPOOL_TRACES", "/some/where", 1);
  char buf[256];
  cr_expect_str_eq(mpb_traces_dir(buf, sizeof buf), "/some/where");
  unsetenv("MEMPOOL_TRACES");
}
