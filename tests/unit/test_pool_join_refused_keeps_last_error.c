/* stream_waits=1: a free whose block and its free neighbours name more
 * streams than a record holds merges them through the pool's join stream
 * (stream.c, mp__deps_join), made on first need. Where the join stream
 * cannot be had (the device refuses to make it, or the stream table has no
 * room for its slot) the free goes on without it and succeeds
 * (test_pool_host_faults); the refusal then replaced the caller's last
 * error, though the free succeeded (status.h). The scene is
 * join_scene.h's. */
#include <criterion/criterion.h>
#include <string.h>

#include "join_scene.h"
#include "pool/pool_internal.h"

static mp__backend_t ops;
static bool refuse_streams;
static unsigned refused;

static const mp__backend_t *host_ops;

static mp_status_t create_or_refuse(mp_device_t *dev, mp_stream_t *out) {
  if (!refuse_streams)
    return host_ops->stream_create(dev, out);
  refused++;
  return mp__fail(MP_EDRIVER, "test: stream create refused");
}

static void run(bool table_full) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  host_ops = dev->ops;
  ops = *dev->ops;
  ops.stream_create = create_or_refuse;
  dev->ops = &ops;
  join_scene_t j;
  join_scene_streams(dev, &j);
  mp_pool_t *p = make_pool(dev, "stream_waits=1");
  join_scene_set(dev, p, &j);
  /* The caller's own failure: a refused free of a pointer no pool made. */
  static int not_a_block;
  cr_assert_neq(mp_pool_free(p, &not_a_block), MP_OK);
  char was[512];
  strncpy(was, mp_last_error(), sizeof was - 1);
  was[sizeof was - 1] = '\0';
  uint32_t slots = p->streams_cap;
  if (table_full) {
    /* The join stream made already (the pool destroys it), its slot still
     * to come: the table, full, cannot grow for it. */
    cr_assert_eq(p->nstreams, p->streams_cap);
    cr_assert_eq(mp_stream_create(dev, &p->join), MP_OK, "%s", mp_last_error());
    mp__fault_host_every(true);
  } else
    refuse_streams = true;
  mp_status_t st = mp_pool_free(p, j.x[JS_NG - 1]);
  mp__fault_host_every(false);
  refuse_streams = false;
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  if (table_full)
    cr_expect_eq(p->streams_cap, slots, "the table grew");
  else
    cr_expect_eq(refused, 1, "the join stream was not asked for");
  cr_expect_str_eq(mp_last_error(), was,
                   "a free that succeeded without its join stream replaced "
                   "the caller's last error");
  join_scene_open(dev, &j);
  check(p);
  cr_assert_eq(mp_pool_free(p, j.guard), MP_OK);
  cr_assert_eq(mp_pool_free(p, j.low), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  for (int i = 0; i < JS_NG; i++) {
    cr_assert_eq(mp_stream_destroy(dev, j.gs[i]), MP_OK);
    gate_destroy(&j.g[i]);
  }
  for (int i = 0; i < JS_NO; i++)
    cr_assert_eq(mp_stream_destroy(dev, j.os[i]), MP_OK);
  dev->ops = host_ops;
  mp_device_close(dev);
}

Test(pool_join_refused, a_refused_join_stream_keeps_last_error, .timeout = 60) {
  run(false);
}

Test(pool_join_refused, a_full_table_keeps_last_error, .timeout = 60) {
  run(true);
}
