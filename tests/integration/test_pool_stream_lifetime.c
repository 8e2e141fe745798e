/* test_pool_stream_lifetime.c - the streams a pool knows: a handle the
 * device never made is refused with nothing changed, a destroyed stream is
 * forgotten (its slot reused, no limit on how many streams a program makes
 * over its life), and mp_pool_free_after_all keeps cuMemFree's meaning: a
 * block is not reused while work on any stream the pool knows may still
 * use it. On the host device, whose streams are real worker threads. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define KiB ((size_t)1 << 10)

MP_DEVICE_SUITE(stream_lifetime, "host:capacity=1G");

Test(stream_lifetime, a_handle_the_device_never_made_is_refused) {
  mp_pool_t *p = make_pool(dev, NULL);
  int not_a_stream;
  void *out = &not_a_stream;
  cr_assert_eq(mp_pool_alloc(p, 4 * KiB, (mp_stream_t)&not_a_stream, &out),
               MP_EINVAL);
  cr_assert(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(out, &not_a_stream, "the output was written");
  mp_stats_t s = stats(p);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(s.alloc_count, 0);
  cr_assert_eq(mp_pool_add_stream(p, (mp_stream_t)&not_a_stream), MP_EINVAL);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

Test(stream_lifetime, a_destroyed_stream_is_forgotten_and_then_refused) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 4 * KiB, s, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  void *b = NULL;
  cr_assert_eq(mp_pool_alloc(p, 4 * KiB, s, &b), MP_EINVAL,
               "the pool still matched the destroyed handle");
  cr_assert_null(b);
  /* What was freed on it serves the other streams once the device ran
   * what the destroyed stream still had queued (the marker the pool closed
   * its epoch with: a destroy returns at once, as cuStreamDestroy does). */
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4 * KiB, NULL, &b), MP_OK);
  cr_assert_eq(b, a);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

/* A pool had room for 65535 streams over its life, and every allocation on
 * a new stream after that was MP_ENOMEM, even after trim. Streams that are
 * destroyed give their slots back. */
Test(stream_lifetime,
     streams_made_and_destroyed_past_the_table_size_keep_being_served,
     .timeout = 600) {
  mp_pool_t *p = make_pool(dev, NULL);
  void *keep;
  cr_assert_eq(mp_pool_alloc(p, 4 * KiB, NULL, &keep), MP_OK);
  for (unsigned i = 0; i < 66000; i++) {
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
    void *a;
    mp_status_t st = mp_pool_alloc(p, 4 * KiB, s, &a);
    cr_assert_eq(st, MP_OK, "stream %u: %s", i, mp_last_error());
    cr_assert_eq(mp_pool_free(p, a), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  }
  cr_assert_eq(mp_pool_free(p, keep), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

/* cuMemFree's meaning: a "kernel" on stream r (a host function held by a
 * gate) still reads the block when it is freed; an allocation on a third
 * stream must not get it and write it before the gate opens. With
 * mp_pool_free (ordered on the block's own stream only) it would. */
typedef struct {
  gate_t gate;
  unsigned char *buf;
  unsigned char seen;
} reader_t;

static void read_after_gate(void *arg) {
  reader_t *r = arg;
  gate_wait(&r->gate);
  r->seen = r->buf[0];
}

static void free_while_another_stream_reads(bool after_all, bool *reused) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t r, w;
  cr_assert_eq(mp_stream_create(dev, &r), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &w), MP_OK);
  cr_assert_eq(mp_pool_add_stream(p, r), MP_OK);
  reader_t rd = {.seen = 0};
  gate_init(&rd.gate);
  /* The block lives on w, where the next allocation asks: a stream-ordered
   * free makes it w's again at once, with no event to wait for, so the
   * control below does not depend on stream-thread timing. */
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, w, (void **)&rd.buf), MP_OK);
  memset(rd.buf, 1, 64 * KiB);
  cr_assert_eq(mp_stream_launch_host(dev, r, read_after_gate, &rd), MP_OK);
  cr_assert_eq(after_all ? mp_pool_free_after_all(p, rd.buf)
                         : mp_pool_free(p, rd.buf),
               MP_OK);
  void *q;
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, w, &q), MP_OK);
  *reused = q == rd.buf;
  cr_assert_eq(mp_memset_async(dev, q, 2, 64 * KiB, w), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, w), MP_OK);
  gate_open(&rd.gate);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  if (after_all)
    cr_assert_eq(rd.seen, 1,
                 "the reader saw %d: the block was reused and "
                 "overwritten under it",
                 rd.seen);
  cr_assert_eq(mp_pool_free(p, q), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, r), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, w), MP_OK);
  gate_destroy(&rd.gate);
}

Test(stream_lifetime, free_after_all_waits_for_every_known_stream) {
  bool reused;
  free_while_another_stream_reads(true, &reused);
  cr_assert(!reused, "the block was handed out while a stream read it");
}

/* The control: the test above can fail. */
Test(stream_lifetime, a_stream_ordered_free_does_not_wait_for_other_streams) {
  bool reused;
  free_while_another_stream_reads(false, &reused);
  cr_assert(reused, "mp_pool_free waited for a stream it was not ordered on");
}

/* Once the reader's work is done the block serves everyone again. */
Test(stream_lifetime,
     free_after_all_block_is_reused_once_the_streams_are_done) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t r, w;
  cr_assert_eq(mp_stream_create(dev, &r), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &w), MP_OK);
  cr_assert_eq(mp_pool_add_stream(p, r), MP_OK);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free_after_all(p, a), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, w, &b), MP_OK);
  cr_assert_eq(b, a);
  cr_assert_eq(mp_pool_free_after_all(p, b), MP_OK);
  cr_assert_eq(mp_pool_free_after_all(p, b), MP_EINVAL, "double free");
  cr_assert_eq(mp_pool_free_after_all(p, NULL), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, r), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, w), MP_OK);
}

/* mp_pool_pause waits for every stream the pool knows, a destroyed one by
 * its last marker, and handed that stream's markers back to the event
 * cache without marking its epochs done: what was freed on it waited for
 * the next device synchronize (trim, the ladder), and an allocation grew
 * the pool instead of reusing it. */
Test(stream_lifetime, a_pause_completes_a_destroyed_streams_frees) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  mp_stats_t before = stats(p);
  void *c;
  cr_assert_eq(mp_pool_alloc(p, 64 * KiB, NULL, &c), MP_OK);
  mp_stats_t after = stats(p);
  cr_expect_eq(c, b, "the destroyed stream's free was not reused");
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes,
               "the pool grew beside a free block whose work was done");
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}
