/* A host pool made with arenas (cfg->arenas, arenas_auto) holds a buffer
 * freed while a stream that used it captures, as one without arenas does
 * (host_pool.h, "Graphs"; test_host_pool_graph_capture.c): the copy
 * captured from it runs at each launch of the graph, so handing it out
 * again would let the host's writes into the next staging buffer reach the
 * graph. The free looked for the buffer's uses in the pool itself, which
 * with arenas holds no memory (its arenas do): it found none, and the
 * buffer was handed out again at once. Checked for a free by the thread
 * that allocated the buffer and by another one (another arena's thread). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "host_pool_graph.h"

TestSuite(host_pool_arenas_freed_in_capture, .init = hpg_setup,
          .fini = hpg_teardown);

/* hp made again with conf. */
static void remake(const char *conf) {
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  hp = NULL;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, conf), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_create(dev, &cfg, &hp), MP_OK, "%s",
               mp_last_error());
}

/* A buffer for stream a. */
static unsigned char *alloc_on_a(void) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, N, a, &p), MP_OK, "%s", mp_last_error());
  cr_assert_not_null(p);
  return p;
}

static void *free_it(void *p) {
  return (void *)(intptr_t)mp_host_pool_free(hp, p);
}

/* p freed by this thread or by another one (whose arena is not p's). */
static void free_by(unsigned char *p, bool other_thread) {
  mp_status_t st;
  if (other_thread) {
    pthread_t t;
    void *ret = NULL;
    cr_assert_eq(pthread_create(&t, NULL, free_it, p), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    st = (mp_status_t)(intptr_t)ret;
  } else {
    st = mp_host_pool_free(hp, p);
  }
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
}

/* A buffer for stream a filled with 0x5a; a copy of it into dst captured
 * on a; the buffer freed in the capture, by this thread or another one. A later
 * request must get another buffer, and the graph, once launched, reads 0x5a
 * although the host filled that other buffer. */
static void freed_in_capture(const char *conf, bool other_thread) {
  remake(conf);
  unsigned char *p = alloc_on_a();
  memset(p, 0x5a, N);
  cr_assert_eq(cu.begin((CUstream)a, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  cr_assert_eq(mp_memcpy_async(dev, dst, p, N, a), MP_OK, "%s",
               mp_last_error());
  free_by(p, other_thread);
  CUgraph g = NULL;
  cr_assert_eq(cu.end((CUstream)a, &g), CUDA_SUCCESS);
  unsigned char *q = alloc_on_a();
  cr_expect_neq(q, p, "%s: a buffer the graph reads was handed out again",
                conf);
  memset(q, 0xee, N);
  memset(dst, 0, N);
  CUgraphExec x;
  cr_assert_eq(cu.instantiate(&x, g, 0), CUDA_SUCCESS);
  cr_assert_eq(cu.launch(x, (CUstream)a), CUDA_SUCCESS);
  cr_assert_eq(cu.sync((CUstream)a), CUDA_SUCCESS);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(dst[i], 0x5a, "%s: the graph read a buffer handed out again",
                 conf);
  cr_assert_eq(mp_host_pool_free(hp, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cu.exec_destroy(x), CUDA_SUCCESS);
  cr_assert_eq(cu.graph_destroy(g), CUDA_SUCCESS);
  /* The driver tells that the graph is gone from its own thread, a while
   * after the destroy (fakecuda.c, user objects): the pool is destroyed
   * in the teardown either way. */
}

Test(host_pool_arenas_freed_in_capture, arenas) {
  freed_in_capture("arenas=2", false);
}

Test(host_pool_arenas_freed_in_capture, arenas_freed_by_another_thread) {
  freed_in_capture("arenas=2", true);
}

Test(host_pool_arenas_freed_in_capture, arenas_auto) {
  freed_in_capture("arenas=2,arenas_auto=1", false);
}

Test(host_pool_arenas_freed_in_capture, without_arenas) {
  freed_in_capture("arenas=0", false);
}
