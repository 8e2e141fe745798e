/* Finding trace files (core/trace.c): the *.csv files of a folder and of
 * its direct subfolders, relative to it and in name order, each file once
 * through links; hidden files,
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
  cr_assert_eq(mpb_traces_scan(root, &v, &n, NULL, NULL), MP_OK, "%s",
               mp_last_error());
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
  cr_assert_eq(mpb_traces_scan(root, &v, &n, NULL, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(n, 4, "found %zu files", n);
  for (size_t i = 0; i < n; i++)
    cr_expect(strstr(v[i], "pipe") == NULL, "%s", v[i]);
  mpb_traces_free(v, n);
}

static void link_in(const char *to, const char *rel) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  cr_assert_eq(symlink(to, p), 0, "%s", p);
}

/* One file by several paths of the folder (a link to a trace, a link to a
 * subfolder or to the folder itself, a hard link) is listed once, by the
 * path through the fewest links; each path left out is said. Links in a
 * loop, and a subfolder's link back up, end the scan. */
Test(trace_files, a_file_reached_through_links_is_listed_once,
     .init = make_tree, .fini = remove_tree) {
  link_in("top.csv", "alias.csv");         /* sorts before top.csv */
  link_in("../top.csv", "pytorch/up.csv"); /* from a subfolder */
  link_in("pytorch", "linked");            /* linked/a.csv, linked/b.csv */
  link_in(".", "again");                   /* again/top.csv, again/alias.csv */
  link_in("..", "pytorch/parent");         /* a loop, two levels down */
  link_in("loop2.csv", "loop1.csv");       /* links in a loop */
  link_in("loop1.csv", "loop2.csv");
  char a[256], h[256];
  snprintf(a, sizeof a, "%s/mindspore/z.csv", root);
  snprintf(h, sizeof h, "%s/hard.csv", root);
  cr_assert_eq(link(a, h), 0);
  char **v = NULL, **same = NULL;
  size_t n = 0, nsame = 0;
  cr_assert_eq(mpb_traces_scan(root, &v, &n, &same, &nsame), MP_OK, "%s",
               mp_last_error());
  /* hard.csv and mindspore/z.csv: no link on either path, the first by
   * name kept. */
  const char *want[] = {"hard.csv", "pytorch/a.csv", "pytorch/b.csv",
                        "top.csv"};
  cr_assert_eq(n, 4, "found %zu files", n);
  for (size_t i = 0; i < n; i++)
    cr_expect_str_eq(v[i], want[i]);
  const char *said[] = {
      "again/alias.csv is top.csv",    "again/hard.csv is hard.csv",
      "again/top.csv is top.csv",      "alias.csv is top.csv",
      "linked/a.csv is pytorch/a.csv", "linked/b.csv is pytorch/b.csv",
      "linked/up.csv is top.csv",      "mindspore/z.csv is hard.csv",
      "pytorch/up.csv is top.csv"};
  cr_assert_eq(nsame, 9, "said %zu", nsame);
  for (size_t i = 0; i < nsame; i++)
    cr_expect_str_eq(same[i], said[i]);
  mpb_traces_free(v, n);
  mpb_traces_free(same, nsame);
}

Test(trace_files, a_missing_folder_is_einval_naming_it) {
  char **v = (char **)&v;
  size_t n = 7;
  cr_assert_eq(mpb_traces_scan("/nonexistent/mp_traces", &v, &n, NULL, NULL),
               MP_EINVAL);
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
