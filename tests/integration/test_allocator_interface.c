/* test_allocator_interface.c - pools, child pools and the direct allocator
 * driven through the one mp_allocator_* interface, chosen by spec string;
 * caller-provided tables through mp_allocator_wrap; bad specs and bad
 * arguments are MP_EINVAL naming the culprit. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/allocator.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"

static mp_device_t *dev;

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=256M", &dev), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  mp_device_close(dev);
  dev = NULL;
}

TestSuite(allocator, .init = setup, .fini = teardown);

static const char *const specs[] = {"pool", "pool:max_bytes=64M", "direct",
                                    "child:bytes=8M",
                                    "child:bytes=8M,max_bytes=32M"};
enum { NSPECS = sizeof specs / sizeof specs[0] };

/* The whole life of an allocator through the interface. */
static void exercise(const char *spec) {
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_create(dev, spec, &a), MP_OK, "%s: %s", spec,
               mp_last_error());
  cr_assert_str_eq(mp_allocator_name(a), spec);

  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *p[4];
  size_t sizes[4] = {1000, 4096, 100000, 1 << 20};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mp_allocator_alloc(a, sizes[i], NULL, &p[i]), MP_OK, "%s: %s",
                 spec, mp_last_error());
    cr_assert_neq(p[i], NULL);
  }
  /* The memory is real device memory. */
  unsigned char in[1000], out[1000];
  for (int i = 0; i < 1000; i++)
    in[i] = (unsigned char)(i ^ 0x3c);
  cr_assert_eq(mp_memcpy_async(dev, p[0], in, sizeof in, NULL), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, out, p[0], sizeof in, NULL), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  cr_assert_eq(memcmp(in, out, sizeof in), 0, "%s", spec);

  cr_assert_eq(mp_allocator_record_stream(a, p[1], s), MP_OK, "%s: %s", spec,
               mp_last_error());
  void *z = (void *)0x1;
  cr_assert_eq(mp_allocator_alloc(a, 0, NULL, &z), MP_OK);
  cr_assert_eq(z, NULL, "%s: 0 bytes gives NULL", spec);

  mp_stats_t st;
  cr_assert_eq(mp_allocator_get_stats(a, &st), MP_OK);
  size_t want = 1000 + 4096 + 100000 + (1 << 20);
  cr_assert_geq(st.allocated_bytes, want, "%s", spec);
  cr_assert_geq(st.reserved_bytes, st.allocated_bytes, "%s", spec);
  cr_assert_geq(st.alloc_count, 4, "%s", spec);
  cr_assert_eq(st.live_blocks, 4, "%s", spec);

  int local;
  cr_assert_eq(mp_allocator_free(a, &local), MP_EINVAL, "%s", spec);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_allocator_free(a, p[i]), MP_OK, "%s: %s", spec,
                 mp_last_error());
  cr_assert_eq(mp_allocator_free(a, p[2]), MP_EINVAL, "%s: double free", spec);
  cr_assert_eq(mp_allocator_release(a), MP_OK, "%s: %s", spec, mp_last_error());
  cr_assert_eq(mp_allocator_get_stats(a, &st), MP_OK);
  cr_assert_eq(st.allocated_bytes, 0, "%s", spec);
  cr_assert_eq(st.live_blocks, 0, "%s", spec);
  cr_assert_eq(st.free_count, 4, "%s", spec);
  if (strcmp(spec, "direct") == 0 || strncmp(spec, "pool", 4) == 0)
    cr_assert_eq(st.reserved_bytes, 0, "%s: release gives memory back", spec);

  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s: %s", spec, mp_last_error());
}

Test(allocator, every_kind_works_through_the_interface) {
  for (size_t i = 0; i < NSPECS; i++)
    exercise(specs[i]);
}

Test(allocator, pool_kinds_expose_their_pool_and_direct_does_not) {
  for (size_t i = 0; i < NSPECS; i++) {
    mp_allocator_t *a;
    cr_assert_eq(mp_allocator_create(dev, specs[i], &a), MP_OK, "%s",
                 mp_last_error());
    mp_pool_t *pool = mp_allocator_pool(a);
    if (strcmp(specs[i], "direct") == 0) {
      cr_assert_eq(pool, NULL);
    } else {
      cr_assert_neq(pool, NULL, "%s", specs[i]);
      cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
      void *p;
      cr_assert_eq(mp_allocator_alloc(a, 4096, NULL, &p), MP_OK);
      /* The allocator's blocks are the pool's blocks. */
      cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s: %s", specs[i],
                   mp_last_error());
    }
    cr_assert_eq(mp_allocator_destroy(a), MP_OK);
  }
  cr_assert_eq(mp_allocator_pool(NULL), NULL);
}

Test(allocator, pool_options_reach_the_pool) {
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_create(dev, "pool:max_bytes=4M", &a), MP_OK, "%s",
               mp_last_error());
  void *p;
  cr_assert_eq(mp_allocator_alloc(a, 8u << 20, NULL, &p), MP_ELIMIT,
               "8M does not fit a 4M cap");
  mp_stats_t st;
  cr_assert_eq(mp_allocator_get_stats(a, &st), MP_OK);
  cr_assert_eq(st.oom_count, 1);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK);
}

Test(allocator, child_never_grows_past_its_bytes) {
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_create(dev, "child:bytes=4M", &a), MP_OK, "%s",
               mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_allocator_get_stats(a, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 4u << 20);
  void *p;
  mp_status_t s = mp_allocator_alloc(a, 8u << 20, NULL, &p);
  cr_assert(s == MP_ELIMIT || s == MP_ENOMEM, "got %s", mp_status_name(s));
  cr_assert_eq(mp_allocator_destroy(a), MP_OK);
}

static void expect_bad_spec(const char *spec, const char *culprit) {
  mp_allocator_t *a = (mp_allocator_t *)0x1;
  cr_assert_eq(mp_allocator_create(dev, spec, &a), MP_EINVAL, "spec '%s'",
               spec);
  cr_assert_eq(a, (mp_allocator_t *)0x1, "out untouched for '%s'", spec);
  cr_assert_neq(strstr(mp_last_error(), culprit), NULL,
                "'%s': message '%s' should name '%s'", spec, mp_last_error(),
                culprit);
}

Test(allocator, bad_specs_are_einval_naming_the_culprit) {
  expect_bad_spec("", "''");
  expect_bad_spec("nope", "nope");
  expect_bad_spec("pools", "pools");
  expect_bad_spec("pool:bogus=1", "bogus");
  expect_bad_spec("pool:max_bytes=lots", "max_bytes");
  expect_bad_spec("pool:align", "align");
  expect_bad_spec("direct:x=1", "direct");
  expect_bad_spec("child", "bytes");
  expect_bad_spec("child:max_bytes=8M", "bytes");
  expect_bad_spec("child:bytes=abc", "abc");
  expect_bad_spec("child:bytes=0", "bytes");
  expect_bad_spec("child:bytes=4M,wrong=2", "wrong");
  expect_bad_spec("child:bytes=4M,bytes=8M", "bytes");
  /* A child its own parent's cap can never hold (the fuzzer's find: it was
   * MP_ELIMIT, as if memory had run out). */
  expect_bad_spec("child:max_bytes=9M,bytes=99M", "max_bytes");
  expect_bad_spec("child:bytes=99M,max_fraction=0.01", "max_fraction");
  /* Nothing was left behind on the device by the failed creations. */
  size_t f, t;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  cr_assert_eq(f, t);
}

Test(allocator, bad_arguments_are_einval) {
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_create(NULL, "pool", &a), MP_EINVAL);
  cr_assert_eq(mp_allocator_create(dev, NULL, &a), MP_EINVAL);
  cr_assert_eq(mp_allocator_create(dev, "pool", NULL), MP_EINVAL);
  void *p;
  mp_stats_t st;
  cr_assert_eq(mp_allocator_alloc(NULL, 16, NULL, &p), MP_EINVAL);
  cr_assert_eq(mp_allocator_free(NULL, p), MP_EINVAL);
  cr_assert_eq(mp_allocator_record_stream(NULL, p, NULL), MP_EINVAL);
  cr_assert_eq(mp_allocator_get_stats(NULL, &st), MP_EINVAL);
  cr_assert_eq(mp_allocator_release(NULL), MP_EINVAL);
  cr_assert_eq(mp_allocator_destroy(NULL), MP_EINVAL);
  cr_assert_str_eq(mp_allocator_name(NULL), "");

  cr_assert_eq(mp_allocator_create(dev, "direct", &a), MP_OK);
  cr_assert_eq(mp_allocator_alloc(a, 16, NULL, NULL), MP_EINVAL);
  cr_assert_eq(mp_allocator_get_stats(a, NULL), MP_EINVAL);
  cr_assert_eq(mp_allocator_record_stream(a, (void *)0x1000, NULL), MP_EINVAL);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK);
}

/* ---- a caller's own allocator behind the interface -------------------- */

typedef struct counting {
  int allocs, frees, destroyed;
  char buf[4][64];
  int used[4];
} counting_t;

static mp_status_t c_alloc(void *self, size_t bytes, mp_stream_t s,
                           void **out) {
  (void)s;
  counting_t *c = self;
  if (bytes > 64)
    return MP_ENOMEM;
  for (int i = 0; i < 4; i++)
    if (!c->used[i]) {
      c->used[i] = 1;
      c->allocs++;
      *out = c->buf[i];
      return MP_OK;
    }
  return MP_ENOMEM;
}

static mp_status_t c_free(void *self, void *ptr) {
  counting_t *c = self;
  for (int i = 0; i < 4; i++)
    if (ptr == c->buf[i] && c->used[i]) {
      c->used[i] = 0;
      c->frees++;
      return MP_OK;
    }
  return MP_EINVAL;
}

static mp_status_t c_destroy(void *self) {
  ((counting_t *)self)->destroyed++;
  return MP_OK;
}

Test(allocator, wrap_dispatches_to_the_callers_table) {
  counting_t c = {0};
  mp_allocator_ops_t ops = {.kind = "counting",
                            .alloc = c_alloc,
                            .free = c_free,
                            .destroy = c_destroy};
  char name[] = "mine";
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_wrap(&ops, &c, name, &a), MP_OK);
  name[0] = 'X';
  memset(&ops, 0, sizeof ops);
  cr_assert_str_eq(mp_allocator_name(a), "mine", "name and ops are copied");
  void *p;
  cr_assert_eq(mp_allocator_alloc(a, 32, NULL, &p), MP_OK);
  cr_assert_eq(p, c.buf[0]);
  cr_assert_eq(mp_allocator_free(a, p), MP_OK);
  cr_assert_eq(c.allocs, 1);
  cr_assert_eq(c.frees, 1);
  cr_assert_eq(mp_allocator_pool(a), NULL);
  mp_stats_t st;
  cr_assert_eq(mp_allocator_get_stats(a, &st), MP_ENOTSUP);
  cr_assert_eq(mp_allocator_record_stream(a, p, NULL), MP_ENOTSUP);
  cr_assert_eq(mp_allocator_release(a), MP_ENOTSUP);
  cr_assert_neq(strstr(mp_last_error(), "mine"), NULL, "%s", mp_last_error());
  cr_assert_eq(mp_allocator_destroy(a), MP_OK);
  cr_assert_eq(c.destroyed, 1);
}

Test(allocator, wrap_without_destroy_leaves_self_to_the_caller) {
  counting_t c = {0};
  mp_allocator_ops_t ops = {.alloc = c_alloc, .free = c_free};
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_wrap(&ops, &c, "plain", &a), MP_OK);
  cr_assert_eq(mp_allocator_destroy(a), MP_OK);
  cr_assert_eq(c.destroyed, 0);
}

Test(allocator, wrap_rejects_incomplete_tables) {
  counting_t c = {0};
  mp_allocator_ops_t ops = {.alloc = c_alloc};
  mp_allocator_t *a = (mp_allocator_t *)0x1;
  cr_assert_eq(mp_allocator_wrap(&ops, &c, "x", &a), MP_EINVAL);
  cr_assert_neq(strstr(mp_last_error(), "free"), NULL);
  ops.free = c_free;
  cr_assert_eq(mp_allocator_wrap(NULL, &c, "x", &a), MP_EINVAL);
  cr_assert_eq(mp_allocator_wrap(&ops, &c, NULL, &a), MP_EINVAL);
  cr_assert_eq(mp_allocator_wrap(&ops, &c, "x", NULL), MP_EINVAL);
  cr_assert_eq(a, (mp_allocator_t *)0x1);
}

typedef struct {
  mp_allocator_t *a;
  mp_status_t st;
} destroy_call_t;

static void destroy_call(void *arg) {
  destroy_call_t *c = arg;
  c->st = mp_allocator_destroy(c->a);
}

/* A destroy that cannot wait for the device (from a host function) fails
 * with the allocator kept, usable, and its memory its own: the direct
 * allocator freed itself and its blocks were lost, the pools answered
 * MP_OK with their memory lost, and the allocator went either way. */
Test(allocator, destroy_that_cannot_wait_keeps_every_kind) {
  for (int i = 0; i < NSPECS; i++) {
    size_t before = free_bytes(dev);
    mp_allocator_t *a;
    cr_assert_eq(mp_allocator_create(dev, specs[i], &a), MP_OK, "%s: %s",
                 specs[i], mp_last_error());
    void *p, *q;
    cr_assert_eq(mp_allocator_alloc(a, 1 << 20, NULL, &p), MP_OK);
    cr_assert_eq(mp_allocator_alloc(a, 1 << 20, NULL, &q), MP_OK);
    cr_assert_eq(mp_allocator_free(a, q), MP_OK);
    destroy_call_t c = {.a = a, .st = MP_OK};
    run_in_host_fn(dev, destroy_call, &c);
    cr_assert_eq(c.st, MP_EINVAL, "%s", specs[i]);
    cr_assert_eq(mp_allocator_free(a, p), MP_OK, "%s: %s", specs[i],
                 mp_last_error());
    cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s: %s", specs[i],
                 mp_last_error());
    cr_expect_eq(free_bytes(dev), before, "%s: device memory lost", specs[i]);
  }
}

/* The same where every stream the allocator used was destroyed and a
 * release saw their work done, so that no stream leaves a wait: the pools
 * made none, answered MP_OK while the device refused their frees, and
 * their memory was lost with the allocator. */
Test(allocator,
     destroy_that_cannot_wait_after_its_streams_went_keeps_every_kind) {
  for (int i = 0; i < NSPECS; i++) {
    size_t before = free_bytes(dev);
    mp_allocator_t *a;
    cr_assert_eq(mp_allocator_create(dev, specs[i], &a), MP_OK, "%s: %s",
                 specs[i], mp_last_error());
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
    void *p, *q;
    cr_assert_eq(mp_allocator_alloc(a, 1 << 20, s, &p), MP_OK);
    cr_assert_eq(mp_allocator_alloc(a, 1 << 20, s, &q), MP_OK);
    cr_assert_eq(mp_allocator_free(a, q), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_allocator_release(a), MP_OK, "%s: %s", specs[i],
                 mp_last_error());
    destroy_call_t c = {.a = a, .st = MP_OK};
    run_in_host_fn(dev, destroy_call, &c);
    cr_assert_eq(c.st, MP_EINVAL, "%s", specs[i]);
    cr_assert_eq(mp_allocator_free(a, p), MP_OK, "%s: %s", specs[i],
                 mp_last_error());
    cr_assert_eq(mp_allocator_destroy(a), MP_OK, "%s: %s", specs[i],
                 mp_last_error());
    cr_expect_eq(free_bytes(dev), before, "%s: device memory lost", specs[i]);
  }
}
