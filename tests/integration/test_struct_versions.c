/* test_struct_versions.c - public structs that grow (stats.h and pool.h,
 * "Growing"): a caller whose mp_stats_t or mp_pool_config_t comes from an
 * older header gets exactly its own bytes written; a size the library does
 * not know is MP_EINVAL, named in mp_last_error(), and writes nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#define GUARD     0xAB
#define END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

static mp_device_t *dev;

static void setup(void) {
  unsetenv("MEMPOOL_CONF");
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  mp_device_close(dev);
}

/* A stats struct with guard bytes after it. */
typedef struct {
  mp_stats_t st;
  unsigned char after[64];
} guarded_t;

static void fill(void *p, size_t n) {
  memset(p, GUARD, n);
}

static size_t first_changed(const void *p, size_t from, size_t to) {
  const unsigned char *b = p;
  for (size_t i = from; i < to; i++)
    if (b[i] != GUARD)
      return i;
  return to;
}

/* The four entry points that fill a mp_stats_t, each with one allocation
 * live (so alloc_count is 1 in whatever they write). */
typedef struct {
  mp_pool_t *pool;
  mp_direct_t *direct;
  mp_allocator_t *alloc;
  mp_host_pool_t *hp;
  void *p[4];
} sources_t;

static void make_sources(sources_t *s) {
  memset(s, 0, sizeof *s);
  cr_assert_eq(mp_pool_create(dev, NULL, &s->pool), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(s->pool, 4096, NULL, &s->p[0]), MP_OK);
  cr_assert_eq(mp_direct_create(dev, &s->direct), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_alloc(s->direct, 4096, NULL, &s->p[1]), MP_OK);
  cr_assert_eq(mp_allocator_create(dev, "pool", &s->alloc), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_allocator_alloc(s->alloc, 4096, NULL, &s->p[2]), MP_OK);
  cr_assert_eq(mp_host_pool_create(dev, NULL, &s->hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_alloc(s->hp, 4096, NULL, &s->p[3]), MP_OK);
}

static void drop_sources(sources_t *s) {
  cr_expect_eq(mp_pool_free(s->pool, s->p[0]), MP_OK);
  cr_expect_eq(mp_pool_destroy(s->pool), MP_OK);
  cr_expect_eq(mp_direct_destroy(s->direct), MP_OK);
  cr_expect_eq(mp_allocator_free(s->alloc, s->p[2]), MP_OK);
  cr_expect_eq(mp_allocator_destroy(s->alloc), MP_OK);
  cr_expect_eq(mp_host_pool_free(s->hp, s->p[3]), MP_OK);
  cr_expect_eq(mp_host_pool_destroy(s->hp), MP_OK);
}

static mp_status_t get_sized(sources_t *s, int which, mp_stats_t *out,
                             size_t size) {
  switch (which) {
  case 0: return mp_pool_get_stats_sized(s->pool, out, size);
  case 1: return mp_direct_get_stats_sized(s->direct, out, size);
  case 2: return mp_allocator_get_stats_sized(s->alloc, out, size);
  default: return mp_host_pool_get_stats_sized(s->hp, out, size);
  }
}

static const char *const names[] = {"mp_pool_get_stats", "mp_direct_get_stats",
                                    "mp_allocator_get_stats",
                                    "mp_host_pool_get_stats"};

TestSuite(struct_versions, .init = setup, .fini = teardown);

Test(struct_versions, stats_from_an_older_header_get_only_their_bytes) {
  sources_t s;
  make_sources(&s);
  /* Every layout mp_stats_t has had: API.md's first one ends at oom_count,
   * then one field at a time. */
  const size_t sizes[] = {MP_STATS_SIZE_MIN,
                          END(mp_stats_t, free_bytes),
                          END(mp_stats_t, segment_count),
                          END(mp_stats_t, alloc_retry_count),
                          MP_STATS_SIZE_V1,
                          sizeof(mp_stats_t)};
  for (int w = 0; w < 4; w++)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      guarded_t g;
      fill(&g, sizeof g);
      cr_assert_eq(get_sized(&s, w, &g.st, sizes[i]), MP_OK, "%s %zu: %s",
                   names[w], sizes[i], mp_last_error());
      cr_expect_eq(first_changed(&g, sizes[i], sizeof g), sizeof g,
                   "%s with %zu bytes wrote byte %zu", names[w], sizes[i],
                   first_changed(&g, sizes[i], sizeof g));
      cr_expect_eq(g.st.alloc_count, 1, "%s %zu", names[w], sizes[i]);
      cr_expect_eq(g.st.oom_count, 0, "%s %zu", names[w], sizes[i]);
      if (sizes[i] >= MP_STATS_SIZE_V1)
        cr_expect_eq(g.st.struct_size, sizes[i]);
    }
  drop_sources(&s);
}

Test(struct_versions, stats_of_an_unknown_size_are_einval_and_write_nothing) {
  sources_t s;
  make_sources(&s);
  const size_t bad[] = {0,
                        1,
                        MP_STATS_SIZE_MIN - sizeof(uint64_t),
                        MP_STATS_SIZE_MIN + 4,
                        MP_STATS_SIZE_V1 - 1,
                        sizeof(mp_stats_t) + sizeof(uint64_t),
                        (size_t)-1};
  for (int w = 0; w < 4; w++)
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      guarded_t g;
      fill(&g, sizeof g);
      cr_expect_eq(get_sized(&s, w, &g.st, bad[i]), MP_EINVAL, "%s %zu",
                   names[w], bad[i]);
      cr_expect_eq(first_changed(&g, 0, sizeof g), sizeof g,
                   "%s with %zu bytes wrote something", names[w], bad[i]);
      cr_expect(strstr(mp_last_error(), names[w]) != NULL &&
                    strstr(mp_last_error(), "mp_stats_t") != NULL,
                "%s", mp_last_error());
    }
  cr_expect(strstr(mp_last_error(), "newer header") != NULL, "%s",
            mp_last_error());
  drop_sources(&s);
}

Test(struct_versions, stats_calls_pass_this_headers_size) {
  sources_t s;
  make_sources(&s);
  mp_stats_t st[4];
  memset(st, 0, sizeof st);
  cr_assert_eq(mp_pool_get_stats(s.pool, &st[0]), MP_OK);
  cr_assert_eq(mp_direct_get_stats(s.direct, &st[1]), MP_OK);
  cr_assert_eq(mp_allocator_get_stats(s.alloc, &st[2]), MP_OK);
  cr_assert_eq(mp_host_pool_get_stats(s.hp, &st[3]), MP_OK);
  for (int w = 0; w < 4; w++)
    cr_expect_eq(st[w].struct_size, sizeof(mp_stats_t), "%s", names[w]);
  /* The functions themselves (a pointer, another language): V1. */
  mp_status_t (*fn)(mp_pool_t *, mp_stats_t *) = mp_pool_get_stats;
  mp_stats_t v1;
  memset(&v1, 0, sizeof v1);
  cr_assert_eq(fn(s.pool, &v1), MP_OK);
  cr_expect_eq(v1.struct_size, MP_STATS_SIZE_V1);
  cr_expect_eq(v1.alloc_count, 1);
  cr_expect_eq((mp_direct_get_stats)(s.direct, &v1), MP_OK);
  cr_expect_eq((mp_allocator_get_stats)(s.alloc, &v1), MP_OK);
  cr_expect_eq((mp_host_pool_get_stats)(s.hp, &v1), MP_OK);
  cr_expect_eq(v1.struct_size, MP_STATS_SIZE_V1);
  drop_sources(&s);
}

Test(struct_versions, config_init_sets_this_headers_size) {
  mp_pool_config_t c;
  fill(&c, sizeof c);
  mp_pool_config_init(&c);
  cr_expect_eq(c.struct_size, sizeof(mp_pool_config_t));
  cr_expect_eq(c.align, 512);
  fill(&c, sizeof c);
  mp_pool_config_init_v3(&c); /* the symbol the name above reaches */
  cr_expect_eq(c.struct_size, sizeof(mp_pool_config_t));
  /* The symbol mp_pool_config_init itself (a program built before the
   * header named the layouts' symbols, another language): V1. */
  fill(&c, sizeof c);
#undef mp_pool_config_init
  mp_pool_config_init(&c);
#define mp_pool_config_init mp_pool_config_init_v3
  cr_expect_eq(c.struct_size, MP_POOL_CONFIG_SIZE_V1);
  /* init_sized writes exactly size bytes. */
  struct {
    mp_pool_config_t c;
    unsigned char after[64];
  } g;
  fill(&g, sizeof g);
  cr_assert_eq(mp_pool_config_init_sized(&g.c, sizeof g.c), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(first_changed(&g, sizeof g.c, sizeof g), sizeof g);
  cr_expect_eq(g.c.struct_size, sizeof g.c);
}

static const size_t bad_config_sizes[] = {
    1, sizeof(size_t), offsetof(mp_pool_config_t, struct_size),
    MP_POOL_CONFIG_SIZE_V1 - 1, sizeof(mp_pool_config_t) + sizeof(size_t)};
#define NBAD (sizeof bad_config_sizes / sizeof *bad_config_sizes)

Test(struct_versions,
     config_init_of_an_unknown_size_is_einval_and_writes_nothing) {
  cr_expect_eq(mp_pool_config_init_sized(NULL, sizeof(mp_pool_config_t)),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "NULL") != NULL, "%s", mp_last_error());
  for (size_t i = 0; i < NBAD; i++) {
    struct {
      mp_pool_config_t c;
      unsigned char after[64];
    } g;
    fill(&g, sizeof g);
    cr_expect_eq(mp_pool_config_init_sized(&g.c, bad_config_sizes[i]),
                 MP_EINVAL, "%zu", bad_config_sizes[i]);
    cr_expect_eq(first_changed(&g, 0, sizeof g), sizeof g, "%zu",
                 bad_config_sizes[i]);
    cr_expect(strstr(mp_last_error(), "mp_pool_config_init") != NULL &&
                  strstr(mp_last_error(), "struct_size") != NULL,
              "%s", mp_last_error());
  }
}

Test(struct_versions, config_of_an_unknown_size_is_refused_unchanged) {
  for (size_t i = 0; i < NBAD; i++) {
    mp_pool_config_t c, before;
    mp_pool_config_init(&c);
    c.struct_size = bad_config_sizes[i];
    before = c;
    cr_expect_eq(mp_pool_config_parse(&c, "max_bytes=1M"), MP_EINVAL, "%zu",
                 bad_config_sizes[i]);
    cr_expect(strstr(mp_last_error(), "mp_pool_config_parse") != NULL, "%s",
              mp_last_error());
    cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
    mp_pool_t *pool = (mp_pool_t *)&before; /* must stay as it is */
    cr_expect_eq(mp_pool_create(dev, &c, &pool), MP_EINVAL, "%zu",
                 bad_config_sizes[i]);
    cr_expect(strstr(mp_last_error(), "pool config") != NULL &&
                  strstr(mp_last_error(), "struct_size") != NULL,
              "%s", mp_last_error());
    cr_expect_eq(pool, (mp_pool_t *)&before);
  }
}

Test(struct_versions, config_made_without_init_reads_as_v1) {
  /* A config zeroed by hand (struct_size 0) is the first versioned
   * layout: it parses and makes a pool as before. */
  mp_pool_config_t c;
  memset(&c, 0, sizeof c);
  cr_assert_eq(mp_pool_config_parse(&c, "max_bytes=8M"), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(c.max_bytes, (size_t)8 << 20);
  cr_expect_eq(c.struct_size, 0);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
}

/* An option whose field a V1 config lacks (arenas, appended after
 * struct_size) would be dropped on the way out: it is refused by name and
 * the config stays as it was. The Python package made its configs with
 * the mp_pool_config_init symbol (V1) and so lost arenas=N silently; it
 * now makes them at mp_pool_config_sizeof(). */
Test(struct_versions, an_option_a_short_config_lacks_is_refused_unchanged) {
  cr_expect_eq(mp_pool_config_sizeof(), sizeof(mp_pool_config_t));
  mp_pool_config_t c, before;
  cr_assert_eq(mp_pool_config_init_sized(&c, MP_POOL_CONFIG_SIZE_V1), MP_OK);
  cr_assert_eq(c.struct_size, MP_POOL_CONFIG_SIZE_V1);
  before = c;
  cr_expect_eq(mp_pool_config_parse(&c, "max_bytes=8M,arenas=2"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "arenas") != NULL &&
                strstr(mp_last_error(), "mp_pool_config_init_sized") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(memcmp(&c, &before, sizeof c), 0);
  /* The same options in a config of this header's size. */
  cr_assert_eq(mp_pool_config_init_sized(&c, mp_pool_config_sizeof()), MP_OK);
  cr_assert_eq(mp_pool_config_parse(&c, "max_bytes=8M,arenas=2"), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(c.arenas, 2);
  cr_expect_eq(c.max_bytes, (size_t)8 << 20);
}

/* Chunks an 8 MiB block's growth mapped in a pool made from c. */
static size_t chunks_for_8m(mp_pool_config_t *c) {
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, c, &pool), MP_OK, "%s", mp_last_error());
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, (size_t)8 << 20, NULL, &p), MP_OK);
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  return s.segment_count;
}

/* A program built against an older header cannot set the fields appended
 * since: $MEMPOOL_CONF still reaches them (they take what
 * mp_pool_config_init gives them), where it was dropped on the way out of
 * init, and arenas_auto=1 (a V1 flag) with its arenas=N dropped made every
 * pool MP_EINVAL. */
Test(struct_versions, mempool_conf_reaches_the_fields_a_short_config_lacks) {
  mp_pool_config_t c;
  setenv("MEMPOOL_CONF", "map_piece=2M", 1);
  cr_assert_eq(mp_pool_config_init_sized(&c, MP_POOL_CONFIG_SIZE_V1), MP_OK);
  cr_expect_eq(chunks_for_8m(&c), 4);
  memset(&c, 0, sizeof c); /* filled by hand: V1 too */
  c.flags = MP_POOL_VIRTUAL;
  cr_expect_eq(chunks_for_8m(&c), 4);
  setenv("MEMPOOL_CONF", "arenas=2,arenas_auto=1", 1);
  cr_assert_eq(mp_pool_config_init_sized(&c, MP_POOL_CONFIG_SIZE_V1), MP_OK);
  cr_expect(c.flags & MP_POOL_ARENAS_AUTO);
  cr_expect_eq(chunks_for_8m(&c), 1);
  /* A bad $MEMPOOL_CONF: a config filled by hand gets the defaults, and
   * the parse's message is not left as the last error. */
  setenv("MEMPOOL_CONF", "map_piece=2M,colour=blue", 1);
  memset(&c, 0, sizeof c);
  c.flags = MP_POOL_VIRTUAL;
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &pool), MP_OK, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "colour") == NULL, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  cr_expect_eq(chunks_for_8m(&c), 1);
  unsetenv("MEMPOOL_CONF");
}
