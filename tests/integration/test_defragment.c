/* test_defragment.c - movable blocks and defragmentation on the host
 * device: data survives moves byte for byte (overlapping ones too), handles
 * follow their data, raw-pointer blocks never move, the freed space
 * coalesces and can be trimmed, and defragmentation is a rung of the
 * out-of-memory ladder. mp_pool_check passes after every operation. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "../support/stream_gate.h"
#include "movable_fixture.h"

static void setup(void) {
  open_pool("host:capacity=512M", NULL);
}

static void teardown(void) {
  close_pool();
}

TestSuite(defrag, .init = setup, .fini = teardown);

Test(defrag, data_survives_defragmentation_byte_for_byte) {
  enum { N = 48 };
  mp_handle_t *h[N];
  size_t size[N];
  for (unsigned i = 0; i < N; i++) {
    size[i] = 4096 + (size_t)(i % 7) * 70000 + (i % 3) * 333;
    h[i] = movable(size[i], i);
  }
  check();
  free_all_but(h, N, 2, 1);
  check();
  mp_stats_t before = stats();
  void *old[N];
  for (unsigned i = 1; i < N; i += 2)
    old[i] = mp_handle_ptr(h[i]);

  size_t moved = defragment();
  mp_stats_t after = stats();
  cr_assert_gt(moved, 0);
  cr_assert_gt(after.largest_free_bytes, before.largest_free_bytes,
               "holes coalesced: largest free %zu -> %zu",
               before.largest_free_bytes, after.largest_free_bytes);
  cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
  cr_assert_eq(after.live_blocks, before.live_blocks);
  cr_assert_eq(after.defrag_count, before.defrag_count + 1);
  cr_assert_eq(after.moved_bytes, before.moved_bytes + moved);

  size_t changed = 0;
  for (unsigned i = 1; i < N; i += 2) {
    changed += mp_handle_ptr(h[i]) != old[i];
    expect_pattern(mp_handle_ptr(h[i]), size[i], i);
  }
  cr_assert_gt(changed, 0, "handles follow their moved data");
  for (unsigned i = 1; i < N; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  check();
}

Test(defrag, a_compact_pool_moves_nothing) {
  mp_handle_t *a = movable(1 << 16, 1), *b = movable(1 << 16, 2);
  void *pa = mp_handle_ptr(a), *pb = mp_handle_ptr(b);
  defragment();
  size_t moved = defragment();
  cr_assert_eq(moved, 0, "nothing left to move the second time");
  cr_assert_eq(mp_handle_ptr(a), pa);
  cr_assert_eq(mp_handle_ptr(b), pb);
  expect_pattern(pa, 1 << 16, 1);
  cr_assert_eq(mp_handle_free(a), MP_OK);
  cr_assert_eq(mp_handle_free(b), MP_OK);
}

/* A small hole under a big block: the block moves by less than its size,
 * so source and destination overlap. */
Test(defrag, overlapping_moves_keep_data) {
  size_t gaps[] = {512, 4096, 100 * 1024};
  for (unsigned k = 0; k < 3; k++) {
    mp_handle_t *small = movable(gaps[k], 100 + k);
    mp_handle_t *big = movable(3u << 20, 200 + k);
    char *bp = mp_handle_ptr(big), *sp = mp_handle_ptr(small);
    cr_assert_eq(mp_handle_free(small), MP_OK);
    size_t moved = defragment();
    if (sp + gaps[k] == bp) {
      /* The hole was right below: the block slid down onto its own bytes. */
      cr_assert_eq((char *)mp_handle_ptr(big), sp);
      cr_assert_geq(moved, 3u << 20);
    }
    expect_pattern(mp_handle_ptr(big), 3u << 20, 200 + k);
    cr_assert_eq(mp_handle_free(big), MP_OK);
    check();
  }
}

Test(defrag, raw_pointer_blocks_never_move) {
  enum { N = 24 };
  void *raw[N];
  mp_handle_t *h[N];
  for (unsigned i = 0; i < N; i++) {
    cr_assert_eq(mp_pool_alloc(pool, 8192, stream, &raw[i]), MP_OK);
    fill(raw[i], 8192, 1000 + i);
    h[i] = movable(20000 + i * 512, i);
  }
  for (unsigned i = 0; i < N; i += 3) {
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
    h[i] = NULL;
  }
  for (unsigned i = 1; i < N; i += 3) {
    cr_assert_eq(mp_pool_free(pool, raw[i]), MP_OK);
    raw[i] = NULL;
  }
  defragment();
  for (unsigned i = 0; i < N; i++) {
    if (raw[i] != NULL) {
      expect_pattern(raw[i], 8192, 1000 + i);
      /* Still the pool's live block at the same address. */
      cr_assert_eq(mp_pool_record_stream(pool, raw[i], stream), MP_OK);
    }
    if (h[i] != NULL)
      expect_pattern(mp_handle_ptr(h[i]), 20000 + i * 512, i);
  }
  for (unsigned i = 0; i < N; i++) {
    if (raw[i] != NULL)
      cr_assert_eq(mp_pool_free(pool, raw[i]), MP_OK);
    if (h[i] != NULL)
      cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  }
  check();
}

Test(defrag, pool_free_of_a_movable_blocks_pointer_is_einval) {
  mp_handle_t *h = movable(10000, 7);
  mp_stats_t before = stats();
  cr_assert_eq(mp_pool_free(pool, mp_handle_ptr(h)), MP_EINVAL);
  cr_assert_neq(strstr(mp_last_error(), "movable"), NULL, "%s",
                mp_last_error());
  mp_stats_t after = stats();
  cr_assert_eq(after.live_blocks, before.live_blocks);
  cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
  expect_pattern(mp_handle_ptr(h), 10000, 7);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  check();
}

Test(defrag, movable_blocks_count_as_allocated) {
  mp_stats_t before = stats();
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(pool, 1000, NULL, &h), MP_OK);
  mp_stats_t mid = stats();
  cr_assert_eq(mid.live_blocks, before.live_blocks + 1);
  cr_assert_geq(mid.allocated_bytes, before.allocated_bytes + 1000);
  cr_assert_eq(mid.requested_bytes, before.requested_bytes + 1000);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  mp_stats_t end = stats();
  cr_assert_eq(end.live_blocks, before.live_blocks);
  cr_assert_eq(end.allocated_bytes, before.allocated_bytes);
  cr_assert_eq(end.free_count, before.free_count + 1);
}

/* Every mapped chunk keeps a live block above a free one, so trim alone
 * can return nothing (it unmaps only wholly free chunks): sliding the
 * blocks down frees whole chunks at the top. */
Test(defrag, freed_space_coalesces_and_can_be_trimmed) {
  enum { N = 64 };
  mp_handle_t *h[N];
  for (unsigned i = 0; i < N; i++)
    h[i] = movable(1u << 20, i);
  free_all_but(h, N, 2, 1);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  mp_stats_t before = stats();
  defragment();
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  check();
  mp_stats_t after = stats();
  cr_assert_lt(after.reserved_bytes, before.reserved_bytes,
               "reserved %zu -> %zu", before.reserved_bytes,
               after.reserved_bytes);
  for (unsigned i = 1; i < N; i += 2) {
    expect_pattern(mp_handle_ptr(h[i]), 1u << 20, i);
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  }
}

typedef struct {
  atomic_int done;
} flag_t;

static void slow(void *arg) {
  struct timespec ts = {0, 30 * 1000 * 1000};
  nanosleep(&ts, NULL);
  atomic_store(&((flag_t *)arg)->done, 1);
}

/* Work queued on the block's own stream before the defragmentation is part
 * of the data that moves. */
Test(defrag, moves_wait_for_work_queued_on_other_streams) {
  mp_stream_t other;
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  mp_handle_t *low = movable(1 << 16, 1);
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(pool, 1 << 16, other, &h), MP_OK);
  unsigned char *pat = malloc(1 << 16);
  for (size_t i = 0; i < (1 << 16); i++)
    pat[i] = (unsigned char)(5 * 131u + i * 7u + (i >> 9));
  flag_t flag = {0};
  cr_assert_eq(mp_stream_launch_host(dev, other, slow, &flag), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, mp_handle_ptr(h), pat, 1 << 16, other),
               MP_OK);
  cr_assert_eq(mp_handle_free(low), MP_OK);
  defragment();
  cr_assert_eq(atomic_load(&flag.done), 1);
  expect_pattern(mp_handle_ptr(h), 1 << 16, 5);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, other), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK);
  free(pat);
}

/* A movable block used on another stream says so like any block: its
 * current pointer is given to mp_pool_record_stream, and after
 * mp_handle_free the block waits for that stream's work. */
Test(defrag, movable_block_used_on_another_stream_waits_for_it) {
  gate_t gate;
  gate_init(&gate);
  mp_stream_t other;
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  mp_handle_t *h;
  cr_assert_eq(mp_pool_alloc_movable(pool, 2 << 20, stream, &h), MP_OK);
  void *p = mp_handle_ptr(h);
  cr_assert_eq(mp_pool_record_stream(pool, p, other), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, other, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, p, 0x6B, 2 << 20, other), MP_OK);
  cr_assert_eq(mp_handle_free(h), MP_OK);
  void *q;
  cr_assert_eq(mp_pool_alloc(pool, 2 << 20, stream, &q), MP_OK);
  cr_expect_neq(q, p,
                "the block went back to use while another stream "
                "still writes it");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, other), MP_OK);
  cr_expect_eq(((unsigned char *)p)[(2 << 20) - 1], 0x6B);
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK);
  gate_destroy(&gate);
  check();
}

Test(defrag, bad_input_is_einval_on_every_call) {
  mp_handle_t *h = (mp_handle_t *)0x1;
  cr_assert_eq(mp_pool_alloc_movable(NULL, 16, NULL, &h), MP_EINVAL);
  cr_assert_eq(mp_pool_alloc_movable(pool, 16, NULL, NULL), MP_EINVAL);
  cr_assert_eq(h, (mp_handle_t *)0x1);
  cr_assert_neq(mp_pool_alloc_movable(pool, SIZE_MAX, NULL, &h), MP_OK);
  cr_assert_eq(h, (mp_handle_t *)0x1, "out untouched on failure");
  cr_assert_eq(mp_pool_alloc_movable(pool, 0, NULL, &h), MP_OK);
  cr_assert_eq(h, NULL, "0 bytes: no handle");
  cr_assert_eq(mp_handle_free(NULL), MP_OK);
  cr_assert_eq(mp_handle_ptr(NULL), NULL);
  cr_assert_eq(mp_pool_defragment(NULL, NULL, NULL), MP_EINVAL);
  size_t moved = 77;
  cr_assert_eq(mp_pool_defragment(pool, NULL, &moved), MP_OK);
  cr_assert_eq(moved, 0);
  cr_assert_eq(stats().live_blocks, 0);
  check();
}

TestSuite(defrag_oom, .fini = teardown);
TestSuite(defrag_plain, .fini = teardown);
TestSuite(defrag_child, .fini = teardown);

/* Out of memory: a pool that cannot grow makes room by moving its movable
 * blocks together, unless told not to. */
static void fragment_full_pool(mp_handle_t **h, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    h[i] = movable(1u << 20, i);
  free_all_but(h, n, 2, 1);
}

/* The fragmented pool's 4 MiB allocation from `from` (the pool, or a graph
 * pool of it), which only a defragmentation makes room for: the moved
 * blocks h[1], h[3], ... keep their bytes. */
static void *alloc_by_defrag(mp_pool_t *from, mp_handle_t **h) {
  mp_stats_t before = stats();
  cr_assert_lt(before.largest_free_bytes, 4u << 20);
  void *p;
  cr_assert_eq(mp_pool_alloc(from, 4u << 20, stream, &p), MP_OK, "%s",
               mp_last_error());
  mp_stats_t after = stats();
  cr_assert_gt(after.defrag_count, before.defrag_count);
  cr_assert_gt(after.moved_bytes, before.moved_bytes);
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  for (unsigned i = 1; i < 16; i += 2)
    expect_pattern(mp_handle_ptr(h[i]), 1u << 20, i);
  return p;
}

Test(defrag_oom, defragmentation_is_a_rung_of_the_oom_ladder) {
  open_pool("host:capacity=512M", "max_bytes=16M");
  mp_handle_t *h[16];
  fragment_full_pool(h, 16);
  void *p = alloc_by_defrag(pool, h);
  check();
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  for (unsigned i = 1; i < 16; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
}

Test(defrag_oom, without_the_flag_the_pool_fails_instead) {
  open_pool("host:capacity=512M", "max_bytes=16M,defrag_on_oom=0");
  mp_handle_t *h[16];
  fragment_full_pool(h, 16);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, stream, &p), MP_ELIMIT);
  cr_assert_eq(stats().defrag_count, 0);
  for (unsigned i = 1; i < 16; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  check();
}

/* A graph pool's growth outside a capture (no mp_pool_graph_begin) is an
 * allocation of its parent's, whose ladder defragments as for its own:
 * after d54c583 the borrowing take named no stream, and the rung was
 * skipped (MP_ELIMIT). Found by a review. */
Test(defrag_oom, a_graph_pools_borrowing_defragments_the_parent) {
  open_pool("host:capacity=512M", "max_bytes=16M");
  mp_handle_t *h[16];
  fragment_full_pool(h, 16);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  void *p = alloc_by_defrag(g, h);
  cr_assert_eq(mp_pool_free(g, p), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  for (unsigned i = 1; i < 16; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  check();
}

/* Plain segments (no virtual memory): blocks leave sparse segments for free
 * space in others, so whole segments empty and trim releases them. */
Test(defrag_plain, sparse_segments_are_evacuated_and_trimmed) {
  open_pool("host:capacity=512M", "virtual=0,segment_bytes=2M");
  enum { N = 16 };
  mp_handle_t *h[N];
  for (unsigned i = 0; i < N; i++)
    h[i] = movable(1u << 20, i);
  mp_stats_t full = stats();
  cr_assert_geq(full.segment_count, N / 2);
  /* One block stays in every other segment. */
  free_all_but(h, N, 4, 0);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  mp_stats_t before = stats();
  size_t moved = defragment();
  cr_assert_gt(moved, 0);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  check();
  mp_stats_t after = stats();
  cr_assert_lt(after.segment_count, before.segment_count, "segments %zu -> %zu",
               before.segment_count, after.segment_count);
  cr_assert_lt(after.reserved_bytes, before.reserved_bytes);
  for (unsigned i = 0; i < N; i += 4) {
    expect_pattern(mp_handle_ptr(h[i]), 1u << 20, i);
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  }
  check();
}

Test(defrag_child, a_child_pool_defragments_inside_its_range) {
  open_pool("host:capacity=512M", NULL);
  mp_pool_t *parent = pool, *child;
  cr_assert_eq(mp_pool_create_child(parent, 8u << 20, &child), MP_OK, "%s",
               mp_last_error());
  pool = child;
  mp_handle_t *h[8];
  for (unsigned i = 0; i < 8; i++)
    h[i] = movable(512 * 1024, i);
  for (unsigned i = 0; i < 8; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  size_t moved = defragment();
  cr_assert_gt(moved, 0);
  for (unsigned i = 1; i < 8; i += 2) {
    expect_pattern(mp_handle_ptr(h[i]), 512 * 1024, i);
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  }
  check();
  cr_assert_eq(mp_pool_destroy(child), MP_OK);
  pool = parent;
  cr_assert_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

/* With the device full, no staging buffer can be had: the overlapping slide
 * falls back to chunks the size of its gap and still keeps every byte. */
Test(defrag_oom, overlapping_move_without_room_for_staging) {
  open_pool("host:capacity=4M", NULL);
  mp_handle_t *small = movable(512, 1);
  mp_handle_t *big = movable(3u << 20, 2);
  size_t f, t;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  cr_assert_lt(f, 3u << 20, "the device has no room for a 3M buffer");
  char *sp = mp_handle_ptr(small), *bp = mp_handle_ptr(big);
  cr_assert_eq(mp_handle_free(small), MP_OK);
  size_t moved = defragment();
  if (sp + 512 == bp) {
    cr_assert_eq((char *)mp_handle_ptr(big), sp);
    cr_assert_eq(moved, 3u << 20);
  }
  expect_pattern(mp_handle_ptr(big), 3u << 20, 2);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  check();
}

/* Other threads allocate and free raw blocks on their own streams while
 * this one defragments: the pool stays consistent and no byte is lost. */
enum { CHURN_ROUNDS = 400 };

static void *churn(void *arg) {
  (void)arg;
  mp_stream_t s;
  if (mp_stream_create(dev, &s) != MP_OK)
    return (void *)1;
  void *mine[6] = {0};
  for (unsigned r = 0; r < CHURN_ROUNDS; r++) {
    unsigned k = r % 6;
    if (mine[k] != NULL && mp_pool_free(pool, mine[k]) != MP_OK)
      return (void *)1;
    if (mp_pool_alloc(pool, 4096 + (r % 11) * 20000, s, &mine[k]) != MP_OK)
      return (void *)1;
  }
  for (unsigned k = 0; k < 6; k++)
    if (mp_pool_free(pool, mine[k]) != MP_OK)
      return (void *)1;
  return mp_stream_destroy(dev, s) == MP_OK ? NULL : (void *)1;
}

Test(defrag, defragments_while_other_threads_allocate) {
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, churn, NULL), 0);
  enum { N = 24 };
  mp_handle_t *h[N];
  size_t size[N];
  for (unsigned round = 0; round < 4; round++) {
    for (unsigned i = 0; i < N; i++) {
      size[i] = 8192 + (size_t)((i * 7 + round) % 9) * 9000;
      h[i] = movable(size[i], round * N + i);
    }
    free_all_but(h, N, 3, round % 3);
    defragment();
    for (unsigned i = 0; i < N; i++)
      if (h[i] != NULL) {
        expect_pattern(mp_handle_ptr(h[i]), size[i], round * N + i);
        cr_assert_eq(mp_handle_free(h[i]), MP_OK);
      }
  }
  for (int i = 0; i < 2; i++) {
    void *ret;
    pthread_join(t[i], &ret);
    cr_assert_eq(ret, NULL, "churn thread %d: %s", i, mp_last_error());
  }
  check();
  cr_assert_eq(stats().live_blocks, 0);
}
