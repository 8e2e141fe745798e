/* join_scene.h - a stream_waits=1 pool whose next free needs the pool's
 * join stream (stream.c, mp__deps_join): five gated streams keep the deps
 * of five neighbouring blocks unfinished, three more fill the stream
 * table's first 8 slots, and the first four blocks are freed already, so
 * that the free of the fifth names more streams than a record holds. */
#ifndef MEMPOOL_TEST_JOIN_SCENE_H
#define MEMPOOL_TEST_JOIN_SCENE_H

#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

enum { JS_NG = 5, JS_NO = 3 };
typedef struct join_scene {
  mp_stream_t gs[JS_NG], os[JS_NO];
  void *x[JS_NG], *guard, *low;
  gate_t g[JS_NG];
} join_scene_t;

static inline void join_scene_streams(mp_device_t *dev, join_scene_t *j) {
  for (int i = 0; i < JS_NG; i++)
    cr_assert_eq(mp_stream_create(dev, &j->gs[i]), MP_OK);
  for (int i = 0; i < JS_NO; i++)
    cr_assert_eq(mp_stream_create(dev, &j->os[i]), MP_OK);
}

/* In pool p: every stream met, the blocks allocated, the gates closed and
 * x[0..3] freed; x[4] is the free that needs the join stream. */
static inline void join_scene_set(mp_device_t *dev, mp_pool_t *p,
                                  join_scene_t *j) {
  const size_t mib = (size_t)1 << 20;
  void *t;
  for (int i = 0; i < JS_NG + JS_NO; i++) {
    mp_stream_t s = i < JS_NG ? j->gs[i] : j->os[i - JS_NG];
    cr_assert_eq(mp_pool_alloc(p, mib, s, &t), MP_OK);
    cr_assert_eq(mp_pool_free(p, t), MP_OK);
    /* Done before the next free looks: no join for these. */
    cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  }
  /* Live guards on both sides: the x blocks merge only with each other,
   * the fifth free being the first to need the join stream. */
  cr_assert_eq(mp_pool_alloc(p, 2 * mib, j->os[0], &j->low), MP_OK);
  for (int i = 0; i < JS_NG; i++)
    cr_assert_eq(mp_pool_alloc(p, 8 * mib, j->gs[i], &j->x[i]), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * mib, j->os[0], &j->guard), MP_OK);
  for (int i = 0; i < JS_NG; i++) {
    cr_assert_eq((char *)j->x[i], (char *)j->x[0] + (size_t)i * 8 * mib,
                 "the blocks are not neighbours");
    gate_init(&j->g[i]);
    cr_assert_eq(mp_stream_launch_host(dev, j->gs[i], gate_wait, &j->g[i]),
                 MP_OK);
  }
  for (int i = 0; i + 1 < JS_NG; i++)
    cr_assert_eq(mp_pool_free(p, j->x[i]), MP_OK);
}

/* After the fifth free: the gates open, the device idle. */
static inline void join_scene_open(mp_device_t *dev, join_scene_t *j) {
  for (int i = 0; i < JS_NG; i++)
    gate_open(&j->g[i]);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
}

#endif
