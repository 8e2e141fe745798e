/* results.md's list of the memory captured graphs pinned writes its names
 * as the table's rows do (mpb_md_cell): a control byte (a newline in a
 * trace file's name) as '?', a '|' escaped. Before, they went out raw: a
 * newline in a name split the list's line in two, the second looking like
 * text of its own. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

static mpb_result_t *pinned(const char *workload, const char *allocator) {
  static mpb_result_t r;
  memset(&r, 0, sizeof r);
  snprintf(r.workload, sizeof r.workload, "%s", workload);
  snprintf(r.allocator, sizeof r.allocator, "%s", allocator);
  r.completed = true;
  r.peak_live = 1 << 20;
  r.peak_reserved = 2 << 20;
  r.ratio = 2;
  r.graph_pinned = 3 << 20;
  return &r;
}

Test(report_graph_pinned_names, a_newline_and_a_bar_are_escaped) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  mpb_report_markdown(f, pinned("dir/a\nb\rc", "pool:x|y"), 1);
  cr_assert_eq(fclose(f), 0);
  const char *list = strstr(buf, "Memory captured graphs pinned");
  cr_assert_not_null(list, "%s", buf);
  cr_expect_not_null(strstr(list, "\n- dir/a?b?c / pool:x\\|y: 3.00 MiB\n"),
                     "%s", list);
  /* Every line of the list is an item. */
  const char *item = strchr(list, '\n') + 1;
  cr_expect(strncmp(item, "- ", 2) == 0, "%s", list);
  const char *end = strchr(item, '\n');
  cr_assert_not_null(end);
  cr_expect(end[1] == '\0' || end[1] == '\n', "the item split: %s", list);
  free(buf);
}
