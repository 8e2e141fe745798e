/* A page-locked buffer that work captured into a CUDA graph uses is not
 * handed out again while that graph may still run. Work queued on a
 * capturing stream is not run but recorded into the graph (cuda.h,
 * cuStreamBeginCapture), and so is an event recorded there (cuEventRecord):
 * no point the host can wait for stands for the graph's reads, which
 * happen at each cuGraphLaunch. So a buffer freed while a stream that used
 * it captures, or used by a stream while it captures (allocated for it,
 * named by mp_host_pool_record_stream), is kept until the graph and every
 * executable made from it are destroyed (host_pool.h); the fake tells that
 * from its own thread, a while after the destroy (fakecuda.c, user
 * objects). */
#include <string.h>
#include <unistd.h>

#include "host_pool_graph.h"

TestSuite(host_pool_graph_capture, .init = hpg_setup, .fini = hpg_teardown);

static void begin(void) {
  cr_assert_eq(cu.begin((CUstream)a, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
}

static CUgraph end(void) {
  CUgraph g = NULL;
  cr_assert_eq(cu.end((CUstream)a, &g), CUDA_SUCCESS);
  cr_assert_not_null(g);
  return g;
}

/* A buffer of N bytes for stream a. */
static unsigned char *alloc(void) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, N, a, &p), MP_OK, "%s", mp_last_error());
  cr_assert_not_null(p);
  return p;
}

/* Launches g once on a, waits for it, and checks that it copied 0x5a
 * bytes (what the host wrote before the capture) into dst. */
static void launch_reads_what_was_written(CUgraph g, CUgraphExec *x) {
  memset(dst, 0, N);
  cr_assert_eq(cu.instantiate(x, g, 0), CUDA_SUCCESS);
  cr_assert_eq(cu.launch(*x, (CUstream)a), CUDA_SUCCESS);
  cr_assert_eq(cu.sync((CUstream)a), CUDA_SUCCESS);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(dst[i], 0x5a, "the graph read a buffer handed out again");
}

/* Trims until the pool holds no page-locked memory (at most 30 s: the
 * fake tells that a graph is gone from a thread of its own, a while after
 * the destroy): every buffer, the held one too, went back to the pool. */
static bool all_back(void) {
  for (int i = 0; i < 3000; i++) {
    cr_assert_eq(mp_host_pool_trim(hp, 0), MP_OK, "%s", mp_last_error());
    mp_stats_t st;
    cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
    if (st.reserved_bytes == 0)
      return true;
    usleep(10000);
  }
  return false;
}

/* The capture of a ended into g, and p (filled with 0x5a by the host, read
 * by a copy in the capture) freed: a later request gets another buffer,
 * which the host fills, and the launched graph reads what was written in p.
 * p is kept through a trim too (it is not the pool's to give back), and
 * once the graph and its executable are gone it is the pool's again. */
static void kept_for(CUgraph g, unsigned char *p) {
  unsigned char *q = alloc();
  cr_expect_neq(q, p, "a buffer the graph reads was handed out again");
  memset(q, 0xee, N); /* the host fills its new staging buffer */
  CUgraphExec x;
  launch_reads_what_was_written(g, &x);
  cr_assert_eq(mp_host_pool_free(hp, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_trim(hp, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  cr_expect_geq(st.reserved_bytes, N, "trim gave back a buffer a graph uses");
  cr_assert_eq(cu.exec_destroy(x), CUDA_SUCCESS);
  cr_assert_eq(cu.graph_destroy(g), CUDA_SUCCESS);
  cr_expect(all_back(), "the buffer never came back once the graph went");
}

/* p read by a copy into dst queued on a. */
static void copied(unsigned char *p) {
  cr_assert_eq(mp_memcpy_async(dev, dst, p, N, a), MP_OK, "%s",
               mp_last_error());
}

static void freed(unsigned char *p) {
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

/* Allocated for a before the capture, freed in it. */
Test(host_pool_graph_capture, freed_in_the_capture) {
  unsigned char *p = alloc();
  memset(p, 0x5a, N);
  begin();
  copied(p);
  freed(p);
  kept_for(end(), p);
}

/* Allocated for a while it captures, freed after the capture ended. */
Test(host_pool_graph_capture, allocated_in_the_capture) {
  /* A chunk grown before the capture: its growth would be refused in
   * it (cuMemHostAlloc, cuda.h cuThreadExchangeStreamCaptureMode). */
  freed(alloc());
  begin();
  unsigned char *p = alloc();
  memset(p, 0x5a, N);
  copied(p);
  CUgraph g = end();
  freed(p);
  kept_for(g, p);
}

/* Allocated for the NULL stream, named for a by record_stream while a
 * captures, freed after the capture ended. */
Test(host_pool_graph_capture, recorded_in_the_capture) {
  void *v = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, N, NULL, &v), MP_OK, "%s",
               mp_last_error());
  unsigned char *p = v;
  memset(p, 0x5a, N);
  begin();
  copied(p);
  cr_assert_eq(mp_host_pool_record_stream(hp, p, a), MP_OK, "%s",
               mp_last_error());
  CUgraph g = end();
  freed(p);
  kept_for(g, p);
}

/* A held buffer is the program's only until its free: a second free, or
 * a record_stream after it, is refused as for any freed buffer, and a destroy
 * while the graph lives gives everything back (the graph must not run again).
 */
Test(host_pool_graph_capture, double_free_and_destroy) {
  unsigned char *p = alloc();
  begin();
  copied(p);
  freed(p);
  cr_expect_eq(mp_host_pool_free(hp, p), MP_EINVAL);
  CUgraph g = end();
  cr_expect_eq(mp_host_pool_free(hp, p), MP_EINVAL);
  /* Nor is it named for a stream once freed. */
  cr_expect_eq(mp_host_pool_record_stream(hp, p, a), MP_EINVAL);
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  hp = NULL;
  cr_assert_eq(cu.graph_destroy(g), CUDA_SUCCESS);
  usleep(50000); /* the fake's release runs after the pool is gone */
}
