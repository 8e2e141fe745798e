/* test_pool_config_docs.c - the pool's option keys come from one table:
 * the parser's "expected one of" message, mp_pool_config_help (which
 * `mpbench --help` prints) and the README's "Pool options" table all list
 * exactly mp_pool_config_key_name's keys, in its order. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mempool/mempool.h>

#define BEGIN "<!-- pool options: mp_pool_config_help(out, \"markdown\") -->\n"
#define END   "<!-- /pool options -->"

static char *help(const char *format) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_config_help(f, format), MP_OK, "%s", mp_last_error());
  fclose(f);
  return buf;
}

static size_t key_count(void) {
  size_t n = 0;
  while (mp_pool_config_key_name(n) != NULL)
    n++;
  return n;
}

Test(pool_config_docs, readme_table_is_what_the_key_table_writes) {
  const char *dir = getenv("MEMPOOL_TEST_SOURCE_DIR");
  cr_assert_not_null(dir, "MEMPOOL_TEST_SOURCE_DIR is not set");
  char path[4096];
  snprintf(path, sizeof path, "%s/README.md", dir);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  /* The lines between the two markers. */
  static char block[1 << 16];
  char line[1024];
  size_t used = 0;
  int state = 0; /* 0 before, 1 inside, 2 after */
  while (state < 2 && fgets(line, sizeof line, f) != NULL) {
    if (state == 0 && strcmp(line, BEGIN) == 0)
      state = 1;
    else if (state == 1 && strncmp(line, END, strlen(END)) == 0)
      state = 2;
    else if (state == 1 && used + strlen(line) < sizeof block)
      used += (size_t)snprintf(block + used, sizeof block - used, "%s", line);
  }
  fclose(f);
  cr_assert_eq(state, 2, "README.md lacks the markers '%s' ... '%s'", BEGIN,
               END);
  char *begin = block;
  char *want = help("markdown");
  cr_expect_str_eq(begin, want,
                   "README.md's pool options differ from the key table; put "
                   "this between the markers:\n%s",
                   want);
  /* Its rows name exactly the keys, in order. */
  size_t row = 0;
  for (char *line = strstr(begin, "\n| `"); line != NULL;
       line = strstr(line + 1, "\n| `")) {
    const char *name = mp_pool_config_key_name(row);
    cr_assert_not_null(name, "README lists more keys than the table");
    cr_expect_eq(strncmp(line + 4, name, strlen(name)), 0,
                 "README row %zu is not '%s'", row, name);
    cr_expect_eq(line[4 + strlen(name)], '`');
    row++;
  }
  cr_expect_eq(row, key_count(), "README lists %zu keys, the table %zu", row,
               key_count());
  free(want);
}

Test(pool_config_docs, unknown_key_message_lists_every_key) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "colour=blue"), MP_EINVAL);
  char want[1024] = "expected one of ";
  for (size_t i = 0; mp_pool_config_key_name(i) != NULL; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
             i ? ", " : "", mp_pool_config_key_name(i));
  cr_expect(strstr(mp_last_error(), want) != NULL, "'%s' lacks '%s'",
            mp_last_error(), want);
}

Test(pool_config_docs, text_help_names_every_key_with_its_values) {
  char *text = help(NULL);
  cr_expect_geq(key_count(), 14);
  for (size_t i = 0; i < key_count(); i++) {
    char line[128];
    snprintf(line, sizeof line, "\n  %s ", mp_pool_config_key_name(i));
    cr_expect(i == 0 ? strncmp(text, line + 1, strlen(line + 1)) == 0
                     : strstr(text, line) != NULL,
              "no line for %s", mp_pool_config_key_name(i));
  }
  cr_expect(strstr(text, "a fraction in (0, 1]") != NULL, "%s", text);
  free(text);
}

/* The bounds an out-of-range value is told are the table's. */
Test(pool_config_docs, out_of_range_messages_give_the_tables_bounds) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "history=16777217"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "0 to 16777216") != NULL, "%s",
            mp_last_error());
  char *text = help("text");
  cr_expect(strstr(text, "a count (0 to 16777216)") != NULL, "%s", text);
  free(text);
  cr_assert_eq(mp_pool_config_parse(&c, "garbage_collection_threshold=1"),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "a fraction in (0, 1)") != NULL, "%s",
            mp_last_error());
}

/* The help is judged by its own writes: a stream whose error flag the
 * caller's earlier use left set (a read from a write-only stream) still
 * gets the whole text and MP_OK; a stream that cannot take it is MP_EIO. */
Test(pool_config_docs, help_judges_its_own_writes) {
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  FILE *w = fdopen(dup(fileno(f)), "w");
  cr_assert_not_null(w);
  cr_assert_eq(fgetc(w), EOF);
  cr_assert(ferror(w), "the test needs the stream's error flag set");
  cr_expect_eq(mp_pool_config_help(w, "text"), MP_OK, "%s", mp_last_error());
  fclose(w);
  cr_expect_gt(lseek(fileno(f), 0, SEEK_END), 1000);
  fclose(f);
  FILE *full = fopen("/dev/full", "w");
  if (full != NULL) {
    cr_expect_eq(mp_pool_config_help(full, "markdown"), MP_EIO);
    fclose(full);
  }
}

Test(pool_config_docs, help_refuses_bad_arguments) {
  cr_expect_eq(mp_pool_config_help(NULL, "text"), MP_EINVAL);
  cr_expect_eq(mp_pool_config_help(stdout, "html"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "markdown") != NULL, "%s", mp_last_error());
  cr_expect_null(mp_pool_config_key_name((size_t)-1));
}
