/* test_pool_visible_cap.c - a pool's cap is what a program sees: with
 * max_bytes or max_fraction, mp_pool_mem_info reports the cap as total and
 * what is left under it above the live blocks as free (frameworks size
 * their caches from cudaMemGetInfo, which the shim answers with it), and
 * the next allocation that fits what it says succeeds. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

MP_DEVICE_SUITE(visible_cap, "host:capacity=4G");

Test(visible_cap, without_a_cap_the_device_is_the_total) {
  mp_pool_t *p = make_pool(dev, NULL);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(t, 4 * GiB);
  cr_assert_eq(f, 4 * GiB);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 100 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* The idle cache is free memory to the program. */
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(f, 4 * GiB);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

static void cap_is_seen(const char *opts, size_t cap) {
  mp_pool_t *p = make_pool(dev, opts);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(t, cap, "total %zu, cap %zu", t, cap);
  cr_assert_eq(f, cap);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 300 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_mem_info(p, &f, NULL), MP_OK);
  cr_assert_leq(f, cap - 300 * MiB);
  cr_assert_geq(f, cap - 300 * MiB - 2 * MiB, "free %zu", f);
  /* What it says is free can be had; more cannot. */
  cr_assert_eq(mp_pool_alloc(p, f - 2 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, f + 4 * MiB, NULL, &b), MP_ELIMIT);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

Test(visible_cap, max_bytes_is_the_total_and_bounds_free) {
  cap_is_seen("max_bytes=1G", GiB);
}

Test(visible_cap, max_fraction_caps_a_share_of_the_device) {
  cap_is_seen("max_fraction=0.25", GiB);
}

Test(visible_cap, bad_fractions_and_two_caps_are_refused) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  const char *bad[] = {"max_fraction=0",    "max_fraction=1.5",
                       "max_fraction=-1",   "max_fraction=half",
                       "max_fraction=0.5x", "max_fraction=",
                       "max_fraction= 0.5", "max_fraction=0.5 ",
                       "max_fraction=nan",  "max_fraction=0x0.8p0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_eq(mp_pool_config_parse(&c, bad[i]), MP_EINVAL, "%s", bad[i]);
    cr_assert_eq(c.max_fraction, 0.0, "%s changed the config", bad[i]);
  }
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=0.5,max_bytes=1G"),
               MP_OK);
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_assert_null(p);
  cr_assert_eq(mp_pool_mem_info(NULL, NULL, NULL), MP_EINVAL);
}

/* A fraction whose cap comes out below the alignment is refused, naming
 * max_fraction, at create and at mp_pool_set_max_fraction (a pool was made
 * that could hold nothing, and its failures blamed max_bytes). */
Test(visible_cap, a_fraction_that_leaves_no_room_is_refused) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=1e-300"), MP_OK);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "max_fraction") != NULL, "%s",
            mp_last_error());
  cr_expect_null(p);
  cr_assert_eq(mp_pool_create(dev, NULL, &p), MP_OK);
  size_t total_before = 0, total_after = 0;
  cr_assert_eq(mp_pool_mem_info(p, NULL, &total_before), MP_OK);
  cr_expect_eq(mp_pool_set_max_fraction(p, 1e-300), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "max_fraction") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_mem_info(p, NULL, &total_after), MP_OK);
  cr_expect_eq(total_after, total_before, "a refused fraction changed the cap");
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 512, NULL, &x), MP_OK);
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

/* On a device whose size is near 2^64, the whole of it as a fraction is
 * the device's size: the product rounded up to 2^64 as a double, and its
 * conversion (undefined) gave 0, refused as "below the alignment". */
Test(visible_cap, a_whole_fraction_of_the_largest_device_is_its_size) {
  mp_device_t *big = NULL;
  cr_assert_eq(mp_device_open("host:capacity=18446744073709551615", &big),
               MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(big, "max_fraction=1");
  size_t t = 0;
  cr_assert_eq(mp_pool_mem_info(p, NULL, &t), MP_OK);
  cr_expect_eq(t, SIZE_MAX & ~(size_t)511, "total %zu", t);
  cr_expect_eq(mp_pool_set_max_fraction(p, 1.0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_mem_info(p, NULL, &t), MP_OK);
  cr_expect_eq(t, SIZE_MAX & ~(size_t)511, "total %zu", t);
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 1 << 20, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(big);
}

/* mp_pool_set_max_fraction beside calls of other threads that read the
 * cap or the config. The two sides are ordered by a relaxed flag, which
 * orders nothing for TSan: a read of the pool's cap or config outside
 * the pool's lock is then a race it reports, whichever runs first (a
 * read before the write, when the reader takes the lock no more after
 * it; else the write first, when the reader reads before it takes the
 * lock). */
typedef struct fraction_turn {
  mp_pool_t *p;
  atomic_int turn; /* 0: the reader's, 1: the writer's, 2: the reader's */
  bool write_first;
} fraction_turn_t;

static void wait_turn(fraction_turn_t *t, int turn) {
  while (atomic_load_explicit(&t->turn, memory_order_relaxed) != turn)
    ;
}

static void *set_fraction(void *arg) {
  fraction_turn_t *t = arg;
  wait_turn(t, t->write_first ? 0 : 1);
  cr_assert_eq(mp_pool_set_max_fraction(t->p, 0.25), MP_OK, "%s",
               mp_last_error());
  atomic_store_explicit(&t->turn, 2, memory_order_relaxed);
  return NULL;
}

/* Runs read(p) before (or after) another thread sets the fraction to
 * 0.25 on a pool made with max_fraction=0.5 (of 4 GiB). */
static void race_fraction(void (*read)(mp_pool_t *p), bool write_first) {
  fraction_turn_t t = {make_pool(dev, "max_fraction=0.5"), 0, write_first};
  pthread_t w;
  cr_assert_eq(pthread_create(&w, NULL, set_fraction, &t), 0);
  if (write_first)
    wait_turn(&t, 2);
  read(t.p);
  atomic_store_explicit(&t.turn, write_first ? 3 : 1, memory_order_relaxed);
  pthread_join(w, NULL);
  size_t total = 0;
  cr_assert_eq(mp_pool_mem_info(t.p, NULL, &total), MP_OK);
  cr_expect_eq(total, GiB);
  cr_assert_eq(mp_pool_destroy(t.p), MP_OK, "%s", mp_last_error());
}

static void read_mem_info(mp_pool_t *p) {
  size_t total = 0;
  cr_assert_eq(mp_pool_mem_info(p, NULL, &total), MP_OK);
  cr_expect(total == GiB || total == 2 * GiB, "total %zu", total);
}

static void make_graph(mp_pool_t *p) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
}

static void make_child(mp_pool_t *p) {
  mp_pool_t *c;
  cr_assert_eq(mp_pool_create_child(p, MiB, &c), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(c), MP_OK, "%s", mp_last_error());
}

Test(visible_cap, mem_info_reads_the_cap_another_thread_sets_under_the_lock) {
  race_fraction(read_mem_info, false);
}

Test(visible_cap, a_new_graph_pool_reads_the_config_being_set_under_the_lock) {
  race_fraction(make_graph, true);
}

Test(visible_cap, a_new_child_pool_reads_the_config_being_set_under_the_lock) {
  race_fraction(make_child, true);
}
