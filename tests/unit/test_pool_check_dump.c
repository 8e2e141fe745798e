/* mp_pool_check finds injected corruption; mp_pool_dump writes text and
 * JSON. White-box: corruption is injected through pool_internal.h. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pool/pool_internal.h"
#include "pool_fakedev.h"

static mp_device_t *dev;
static mp_pool_t *pool;
static void *v[8];

/* A pool with live and free blocks: v0 live, v1 free, v2 live, ... */
static void setup(void) {
  dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_alloc(pool, 4096 * (size_t)(i + 1), NULL, &v[i]),
                 MP_OK);
  for (int i = 1; i < 8; i += 2)
    cr_assert_eq(mp_pool_free(pool, v[i]), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  mp_pool_destroy(pool);
  fake_close(dev);
}

static void expect_corrupt(const char *what) {
  cr_expect_eq(mp_pool_check(pool), MP_ECORRUPT, "%s went unnoticed", what);
  cr_expect(strstr(mp_last_error(), "pool check"), "%s", mp_last_error());
}

Test(pool_check, detects_a_cleared_bitmap_bit, .init = setup,
     .fini = teardown) {
  mp__block_t *b = mp__index_best_fit(pool, 8192);
  cr_assert_not_null(b);
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  pool->sl_bitmap[fl] ^= 1u << sl;
  expect_corrupt("a cleared bitmap bit");
  pool->sl_bitmap[fl] ^= 1u << sl;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, detects_an_index_node_that_names_another_class, .init = setup,
     .fini = teardown) {
  /* A removal finds the block's treap through the class its node names. */
  mp__block_t *b = mp__index_best_fit(pool, 8192);
  cr_assert_not_null(b);
  uint32_t cls = b->cls;
  b->cls = cls ^ 1u;
  expect_corrupt("an index node naming another class");
  b->cls = cls;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

/* The plain path takes a call's stream slot from the remembered stream
 * (last_s) without reading the table: one that names another slot's
 * stream is reported. */
Test(pool_check, detects_a_remembered_stream_of_another_slot, .init = setup,
     .fini = teardown) {
  cr_assert_eq(pool->last_s, (mp_stream_t)NULL); /* setup's calls */
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &p), MP_OK);
  cr_expect_eq(pool->last_s, s);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  pool->last_s = NULL; /* the other slot's stream */
  expect_corrupt("a remembered stream of another slot");
  pool->last_s = s;
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK);
  /* Forgotten: no call's stream matches it any more. */
  cr_expect_eq(pool->last_s, MP__STREAM_GONE);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

/* The free index's links live in the block records: a link that names no
 * record of the pool is reported, not followed (the junk it names would
 * send the walk to 0xa5a5... if it were read). */
Test(pool_check, detects_an_index_link_that_names_no_record, .init = setup,
     .fini = teardown) {
  mp__block_t *b = mp__index_best_fit(pool, 8192);
  cr_assert_not_null(b);
  mp__block_t *junk = malloc(sizeof *junk);
  memset(junk, 0xa5, sizeof *junk);
  mp__block_t *left = b->left, *right = b->right;
  b->left = junk;
  expect_corrupt("a left link to memory that is no record");
  b->left = left;
  b->right = junk;
  expect_corrupt("a right link to memory that is no record");
  b->right = right;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  free(junk);
}

Test(pool_check, detects_an_index_link_to_a_live_block, .init = setup,
     .fini = teardown) {
  mp__block_t *b = mp__index_best_fit(pool, 8192);
  mp__block_t *live = mp__map_find(pool, (uintptr_t)v[2]);
  cr_assert(b != NULL && live != NULL);
  mp__block_t *left = b->left;
  b->left = live;
  expect_corrupt("a free index link to a live block");
  b->left = left;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, detects_a_block_size_that_breaks_the_tiling, .init = setup,
     .fini = teardown) {
  mp__block_t *b = mp__map_find(pool, (uintptr_t)v[2]);
  cr_assert_not_null(b);
  b->size += 512;
  expect_corrupt("an overlapping block");
  b->size -= 512;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, detects_stats_that_disagree, .init = setup, .fini = teardown) {
  pool->st.allocated_bytes += 512;
  expect_corrupt("a wrong allocated_bytes");
  pool->st.allocated_bytes -= 512;
}

Test(pool_check, detects_uncoalesced_free_neighbours, .init = setup,
     .fini = teardown) {
  /* Make live v2 look free without coalescing it. */
  mp__block_t *b = mp__map_find(pool, (uintptr_t)v[2]);
  mp__map_remove(pool, b);
  mp__index_insert(pool, b);
  expect_corrupt("adjacent free blocks");
  mp__index_remove(pool, b);
  mp__map_insert(pool, b);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, detects_a_live_block_missing_from_the_map, .init = setup,
     .fini = teardown) {
  mp__block_t *b = mp__map_find(pool, (uintptr_t)v[4]);
  mp__map_remove(pool, b);
  expect_corrupt("a live block not in the map");
  mp__map_insert(pool, b);
}

Test(pool_check, detects_free_blocks_in_the_wrong_class, .init = setup,
     .fini = teardown) {
  /* Swap the treaps of the two smallest non-empty classes. */
  mp__block_t **first = NULL, **second = NULL;
  for (unsigned fl = 0; fl < MP__FL_COUNT && second == NULL; fl++)
    for (unsigned sl = 0; sl < MP__SL_COUNT && second == NULL; sl++)
      if (pool->bins[fl * MP__SL_COUNT + sl] != 0) {
        if (first == NULL)
          first = &pool->bins[fl * MP__SL_COUNT + sl];
        else
          second = &pool->bins[fl * MP__SL_COUNT + sl];
      }
  cr_assert_not_null(second, "the setup leaves free blocks in two classes");
  mp__block_t *t = *first;
  *first = *second;
  *second = t;
  expect_corrupt("blocks in the wrong class");
  *second = *first;
  *first = t;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_check, detects_a_free_block_with_a_wrong_priority, .init = setup,
     .fini = teardown) {
  /* The root of a class: its stored priority may be the top one (the
   * class's first block) or its address's hash, never anything else. */
  mp__block_t *b = NULL;
  for (size_t k = 0; k < MP__FL_COUNT * MP__SL_COUNT && b == NULL; k++)
    b = pool->bins[k];
  cr_assert_not_null(b, "the setup leaves free blocks");
  uint32_t keep = b->prio;
  b->prio = keep == UINT32_MAX ? keep - 1 : keep ^ 1;
  expect_corrupt("a free block whose priority is not its address's");
  b->prio = keep;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

static char *dump(const char *fmt, mp_status_t want) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_dump(pool, f, fmt), want, "%s", mp_last_error());
  fclose(f);
  return buf;
}

Test(pool_dump, text_lists_segments_blocks_classes_and_fragmentation,
     .init = setup, .fini = teardown) {
  char *t = dump("text", MP_OK);
  cr_expect(strstr(t, "segment"), "%s", t);
  cr_expect(strstr(t, "block"));
  cr_expect(strstr(t, "free lists by class"));
  cr_expect(strstr(t, "external fragmentation"));
  free(t);
  t = dump(NULL, MP_OK);
  cr_expect(strstr(t, "segment"));
  free(t);
}

Test(pool_dump, json_is_one_object_with_the_same_facts, .init = setup,
     .fini = teardown) {
  char *j = dump("json", MP_OK);
  cr_expect_eq(j[0], '{');
  cr_expect(strstr(j, "\"segments\":["));
  cr_expect(strstr(j, "\"free_classes\":["));
  cr_expect(strstr(j, "\"external_fragmentation\":"));
  /* Four free holes + the tail: fragmentation is above zero. */
  double frag = atof(strstr(j, "\"external_fragmentation\":") + 25);
  cr_expect_gt(frag, 0.0);
  cr_expect_lt(frag, 1.0);
  int opens = 0, closes = 0;
  for (char *p = j; *p; p++) {
    opens += *p == '{' || *p == '[';
    closes += *p == '}' || *p == ']';
  }
  cr_expect_eq(opens, closes);
  free(j);
}

/* A free block's record does not keep what it was last allocated for: the
 * dumps show requested 0 for it (setup freed v1, v3, v5 and v7 with
 * 8, 16, 24 and 32 KiB requested), the live blocks' own bytes. */
Test(pool_dump, free_blocks_show_no_requested_bytes, .init = setup,
     .fini = teardown) {
  char *t = dump("text", MP_OK);
  int nfree = 0;
  for (const char *l = t; (l = strstr(l, " free requested ")) != NULL; l++) {
    nfree++;
    cr_expect_eq(strtoull(l + strlen(" free requested "), NULL, 10), 0, "%.60s",
                 l);
  }
  cr_expect_geq(nfree, 4, "%s", t);
  cr_expect(strstr(t, " live requested 4096\n"), "%s", t);
  free(t);
  char *j = dump("json", MP_OK);
  nfree = 0;
  const char *key = "\"free\":true,\"requested\":";
  for (const char *l = j; (l = strstr(l, key)) != NULL; l++) {
    nfree++;
    cr_expect_eq(strtoull(l + strlen(key), NULL, 10), 0, "%.60s", l);
  }
  cr_expect_geq(nfree, 4, "%s", j);
  free(j);
}

Test(pool_dump, unknown_format_is_einval, .init = setup, .fini = teardown) {
  char *x = dump("yaml", MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "yaml"));
  cr_expect_eq(x[0], '\0', "nothing written");
  free(x);
  cr_expect_eq(mp_pool_dump(NULL, stdout, "text"), MP_EINVAL);
  cr_expect_eq(mp_pool_dump(pool, NULL, "text"), MP_EINVAL);
}

Test(pool_dump, a_write_that_fails_is_eio, .init = setup, .fini = teardown) {
  FILE *full = fopen("/dev/full", "w");
  cr_assert_not_null(full);
  cr_expect_eq(mp_pool_dump(pool, full, "text"), MP_EIO);
  cr_expect(strstr(mp_last_error(), "writing the dump failed"), "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_dump(pool, full, "json"), MP_EIO);
  fclose(full);
}

/* The stream's error flag is sticky: one the caller's earlier use left set
 * (here a read of a write-only stream) is no failure of the dump, whose own
 * writes went through. It was MP_EIO. */
Test(pool_dump, an_earlier_error_on_the_stream_is_not_the_dumps, .init = setup,
     .fini = teardown) {
  char path[] = "/tmp/mp_dump_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  cr_assert_not_null(f);
  cr_assert_eq(fgetc(f), EOF);
  cr_assert(ferror(f), "the test needs the stream's error flag set");
  cr_expect_eq(mp_pool_dump(pool, f, "text"), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_dump(pool, f, "json"), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_dump(pool, f, "torch"), MP_OK, "%s", mp_last_error());
  fclose(f);
  char buf[1 << 16];
  FILE *r = fopen(path, "r");
  cr_assert_not_null(r);
  buf[fread(buf, 1, sizeof buf - 1, r)] = '\0';
  fclose(r);
  unlink(path);
  cr_expect(strstr(buf, "free lists by class"), "%s", buf);
  cr_expect(strstr(buf, "\"free_classes\":["), "%s", buf);
}

/* A paused pool serves nothing: its header says free 0 (as the stats) and
 * it lists no free class, though it keeps its free blocks' records for the
 * resume. It listed them. */
Test(pool_dump, a_paused_pool_lists_no_free_class, .init = setup,
     .fini = teardown) {
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  char *t = dump("text", MP_OK);
  cr_expect(strstr(t, "  free 0  largest free 0 "), "%s", t);
  cr_expect_null(strstr(t, "    class "), "%s", t);
  free(t);
  char *j = dump("json", MP_OK);
  cr_expect(strstr(j, "\"free_bytes\":0,"), "%s", j);
  cr_expect(strstr(j, "\"free_classes\":[]}"), "%s", j);
  free(j);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  t = dump("text", MP_OK);
  cr_expect(strstr(t, "    class "), "resumed, it serves again: %s", t);
  free(t);
}

Test(pool_dump, torch_names_carry_the_stats_and_inactive_split_bytes,
     .init = setup, .fini = teardown) {
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(pool, 1 << 20, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 1 << 20, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 1 << 20, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  char *t = dump("torch", MP_OK);
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  char want[96];
  snprintf(want, sizeof want, "\"allocated_bytes.all.current\":%zu,",
           s.allocated_bytes);
  cr_expect(strstr(t, want), "%s lacks %s", t, want);
  snprintf(want, sizeof want, "\"reserved_bytes.all.peak\":%zu,",
           s.peak_reserved_bytes);
  cr_expect(strstr(t, want), "%s lacks %s", t, want);
  /* b's megabyte lies between live blocks: it cannot go back. */
  const char *k = strstr(t, "\"inactive_split_bytes.all.current\":");
  cr_assert_not_null(k, "%s", t);
  size_t split =
      strtoull(k + strlen("\"inactive_split_bytes.all.current\":"), NULL, 10);
  cr_expect_geq(split, (size_t)1 << 20);
  cr_expect_leq(split, s.free_bytes);
  cr_expect(strstr(t, "\"num_alloc_retries\":0}"), "%s", t);
  free(t);
  mp_pool_free(pool, a);
  mp_pool_free(pool, c);
}

/* Every free block's size lies in the range the text dump gives some
 * class ("class F.S [LO, HI]: ..."), whatever the pool's alignment. Failed
 * when the classes counted 512-byte units and the dump still counted the
 * alignment: a free 8192-byte block under align=4096 showed as [65536,
 * 65536]. */
static void class_ranges_hold(size_t align, size_t size) {
  mp_device_t *d = fake_open((size_t)1 << 30, 0);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.align = align;
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(d, &cfg, &p), MP_OK, "%s", mp_last_error());
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, size, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK); /* fenced: stays this size */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mp_pool_dump(p, f, "text"), MP_OK);
  fclose(f);
  const char *classes = strstr(buf, "free lists by class");
  cr_assert_not_null(classes);
  size_t nfree = 0;
  for (const char *l = buf; (l = strstr(l, " free requested")) != NULL; l++) {
    const char *z = l;
    while (z > buf && z[-1] != ' ')
      z--; /* the size before " free" */
    size_t bs = strtoull(z, NULL, 10);
    nfree++;
    bool held = false;
    for (const char *k = classes; (k = strstr(k, "\n    class ")) != NULL;) {
      k++;
      unsigned long long lo, hi;
      cr_assert_eq(sscanf(k, " class %*u.%*u [%llu, %llu]", &lo, &hi), 2);
      held = held || (lo <= bs && bs <= hi);
    }
    cr_expect(held, "align %zu: no class range holds a free %zu:\n%s", align,
              bs, classes);
  }
  cr_expect_geq(nfree, 1, "%s", buf);
  free(buf);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  mp_pool_destroy(p);
  fake_close(d);
}

Test(pool_dump, class_ranges_hold_the_free_blocks_whatever_the_alignment) {
  const size_t aligns[] = {512, 2048, 4096};
  for (size_t i = 0; i < 3; i++) {
    class_ranges_hold(aligns[i], 8192);
    class_ranges_hold(aligns[i], 2072576);
    class_ranges_hold(aligns[i], (size_t)192 << 20);
  }
}
