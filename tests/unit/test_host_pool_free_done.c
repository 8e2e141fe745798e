/* A page-locked buffer freed by a caller that has synchronized the streams
 * it was used on (mp__host_pool_free_done: the shim's cudaFreeHost, which
 * synchronizes the devices first, as the driver's does) serves the next
 * request at once, even while that stream is busy with later work: the
 * free must not wait for a marker the stream reaches only after that work.
 * A plain mp_host_pool_free in the same state keeps the rule of
 * mempool/host_pool.h (reused only once the stream reaches the free), so
 * the pool grows there instead. Bad pointers are refused as by
 * mp_host_pool_free, and change nothing. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include <mempool/host_pool.h>

#include "../support/device_helpers.h"

static atomic_int release;

/* Later work on the stream: runs until the test lets it go. */
static void busy(void *arg) {
  (void)arg;
  while (!atomic_load(&release))
    usleep(200);
}

typedef mp_status_t (*free_fn)(mp_host_pool_t *, void *);

/* Allocates a buffer for s, uses it there, synchronizes s, queues later
 * work on s that holds it busy, frees the buffer with fr and asks for one
 * of the same size. Returns whether the second is the first; *chunks is
 * the device allocations the pool made. */
static bool reused(free_fn fr, unsigned long long *chunks) {
  mp_device_t *dev = open_dev("host");
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *p = NULL, *q = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  memset(p, 0x5a, 4096);
  cr_assert_eq(mp_memset_async(dev, p, 0x33, 4096, s), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(((unsigned char *)p)[4095], 0x33);
  atomic_store(&release, 0);
  cr_assert_eq(mp_stream_launch_host(dev, s, busy, NULL), MP_OK);
  cr_assert_eq(fr(hp, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, s, &q), MP_OK, "%s",
               mp_last_error());
  bool same = q == p;
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  *chunks = st.device_alloc_count;
  atomic_store(&release, 1);
  cr_assert_eq(mp_host_pool_free(hp, q), MP_OK);
  cr_assert_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
  return same;
}

Test(host_pool_free_done, a_buffer_freed_as_done_serves_the_next_request) {
  unsigned long long chunks = 0;
  cr_assert(reused(mp__host_pool_free_done, &chunks),
            "the buffer freed as done was not handed out again");
  cr_assert_eq(chunks, 1, "%llu chunks", chunks);
}

Test(host_pool_free_done, a_plain_free_still_waits_for_the_stream) {
  unsigned long long chunks = 0;
  cr_assert_not(reused(mp_host_pool_free, &chunks),
                "a buffer the busy stream had not reached was reused");
  cr_assert_eq(chunks, 2, "%llu chunks", chunks);
}

Test(host_pool_free_done, bad_pointers_are_refused_and_change_nothing) {
  mp_device_t *dev = open_dev("host");
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK);
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp__host_pool_free_done(NULL, p), MP_EINVAL);
  cr_assert_eq(mp__host_pool_free_done(hp, (char *)p + 512), MP_EINVAL);
  cr_assert(strstr(mp_last_error(), "mp_host_pool_free") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp__host_pool_free_done(hp, NULL), MP_OK);
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  cr_assert_eq(st.free_count, 0);
  cr_assert_eq(mp__host_pool_free_done(hp, p), MP_OK);
  cr_assert_eq(mp__host_pool_free_done(hp, p), MP_EINVAL, "a second free");
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  cr_assert_eq(st.free_count, 1);
  cr_assert_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK);
  mp_device_close(dev);
}
