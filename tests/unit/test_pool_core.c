/* The pool's core on a synchronous fake device: best fit, split and
 * coalesce, stats, trim, virtual and plain segments, bad input. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

Test(pool_core, blocks_are_aligned_and_counted_rounded_and_requested) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 1, NULL, &b), MP_OK);
  cr_expect_eq((uintptr_t)a % 512, 0);
  cr_expect_eq((uintptr_t)b % 512, 0);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.requested_bytes, 1001);
  cr_expect_eq(s.allocated_bytes, 1024 + 512);
  cr_expect_eq(s.live_blocks, 2);
  cr_expect_eq(s.alloc_count, 2);
  cr_expect_eq(s.reserved_bytes, 2 * MiB);
  cr_expect_eq(s.free_bytes, s.reserved_bytes - s.allocated_bytes);
  check(p);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  s = stats(p);
  cr_expect_eq(s.allocated_bytes, 0);
  cr_expect_eq(s.requested_bytes, 0);
  cr_expect_eq(s.peak_requested_bytes, 1001);
  cr_expect_eq(s.alloc_count, 2, "the allocations stay counted once freed");
  cr_expect_eq(s.free_count, 2);
  cr_expect_eq(s.free_blocks, 1, "both frees coalesce back to one block");
  cr_expect_eq(s.largest_free_bytes, 2 * MiB);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_core, custom_alignment_applies_to_address_and_size) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "align=4096");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 100, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 5000, NULL, &b), MP_OK);
  cr_expect_eq((uintptr_t)a % 4096, 0);
  cr_expect_eq((uintptr_t)b % 4096, 0);
  cr_expect_eq(stats(p).allocated_bytes, 4096 + 8192);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, best_fit_takes_smallest_block_then_lowest_address) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "segment_bytes=64M");
  /* Carve free holes of 8K, 4K, 4K, 16K separated by live blocks. */
  size_t sizes[] = {8192, 512, 4096, 512, 4096, 512, 16384, 512};
  void *v[8];
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_alloc(p, sizes[i], NULL, &v[i]), MP_OK);
  for (int i = 0; i < 8; i += 2)
    mp_pool_free(p, v[i]);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 3000, NULL, &x), MP_OK);
  cr_expect_eq(x, v[2], "4K hole at the lower address is the best fit");
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &x), MP_OK);
  cr_expect_eq(x, v[4]);
  cr_assert_eq(mp_pool_alloc(p, 6000, NULL, &x), MP_OK);
  cr_expect_eq(x, v[0]);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, free_coalesces_both_neighbours) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &v[i]), MP_OK);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[2]);
  cr_expect_eq(stats(p).free_blocks, 3); /* v0, v2, tail */
  mp_pool_free(p, v[1]);
  cr_expect_eq(stats(p).free_blocks, 2); /* v0..v2, tail */
  check(p);
  void *big;
  cr_assert_eq(mp_pool_alloc(p, 3 * 4096, NULL, &big), MP_OK);
  cr_expect_eq(big, v[0]);
  mp_pool_free(p, big);
  mp_pool_free(p, v[3]);
  cr_expect_eq(stats(p).free_blocks, 1);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, plain_segments_never_coalesce_across_segments) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &b), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.segment_count, 2);
  cr_expect_eq(s.reserved_bytes, 8 * MiB, "large requests round to 2 MiB");
  mp_pool_free(p, a);
  mp_pool_free(p, b);
  s = stats(p);
  cr_expect_eq(s.free_blocks, 2);
  cr_expect_eq(s.largest_free_bytes, 4 * MiB);
  check(p);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  s = stats(p);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.device_free_count, 2);
  cr_expect_eq(fake_of(dev)->used, 0);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, virtual_growth_maps_at_the_top_and_coalesces) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &b), MP_OK);
  cr_expect_eq((uintptr_t)b, (uintptr_t)a + MiB, "grows in place");
  cr_assert_eq(mp_pool_alloc(p, 5 * MiB, NULL, &c), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes,
               s.device_alloc_count > 0 ? s.reserved_bytes : 0);
  cr_expect_leq(s.reserved_bytes, 10 * MiB);
  cr_expect_eq(s.segment_count, fake_of(dev)->nmap);
  mp_pool_free(p, a);
  mp_pool_free(p, b);
  mp_pool_free(p, c);
  s = stats(p);
  cr_expect_eq(s.free_blocks, 1, "one range: everything coalesces");
  cr_expect_eq(s.largest_free_bytes, s.reserved_bytes);
  check(p);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0, "unmaps match maps exactly");
  cr_expect_eq(fake_of(dev)->nmap, 0);
  check(p);
  /* Usable again after a full trim. */
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &a), MP_OK);
  check(p);
  mp_pool_destroy(p);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_core, trim_keeps_what_it_is_asked_to_keep) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *v[6];
  for (int i = 0; i < 6; i++)
    cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &v[i]), MP_OK);
  for (int i = 0; i < 6; i++)
    mp_pool_free(p, v[i]);
  cr_assert_eq(mp_pool_trim(p, 8 * MiB), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_leq(s.free_bytes, 8 * MiB);
  cr_expect_geq(s.free_bytes, 4 * MiB);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, zero_bytes_is_null_and_free_of_null_is_ok) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *x = (void *)1;
  cr_expect_eq(mp_pool_alloc(p, 0, NULL, &x), MP_OK);
  cr_expect_null(x);
  cr_expect_eq(mp_pool_free(p, NULL), MP_OK);
  cr_expect_eq(stats(p).alloc_count, 0);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, bad_pointers_are_einval_and_change_nothing) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &b), MP_OK);
  mp_stats_t before = stats(p);
  int local;
  cr_expect_eq(mp_pool_free(p, &local), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not allocated from this pool"));
  cr_expect_eq(mp_pool_free(p, (char *)a + 512), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "inside"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_record_stream(p, (char *)a + 8, NULL), MP_EINVAL);
  mp_stats_t after = stats(p);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_expect_eq(mp_pool_free(p, a), MP_EINVAL, "double free");
  cr_expect(strstr(mp_last_error(), "double free"), "%s", mp_last_error());
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, null_arguments_are_einval) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *x;
  mp_stats_t s;
  size_t sz = 512;
  cr_expect_eq(mp_pool_alloc(NULL, 1, NULL, &x), MP_EINVAL);
  cr_expect_eq(mp_pool_alloc(p, 1, NULL, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_free(NULL, &x), MP_EINVAL);
  cr_expect_eq(mp_pool_record_stream(NULL, &x, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  cr_expect_eq(mp_pool_get_stats(NULL, &s), MP_EINVAL);
  cr_expect_eq(mp_pool_get_stats(p, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_reset_peaks(NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_check(NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_destroy(NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_create(NULL, NULL, &p), MP_EINVAL);
  cr_expect_eq(mp_pool_create(dev, NULL, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_alloc_contiguous(p, 0, &sz, NULL, &x), MP_EINVAL);
  cr_expect_eq(mp_pool_alloc_contiguous(p, 1, NULL, NULL, &x), MP_EINVAL);
  cr_expect_eq(mp_pool_create_child(NULL, MiB, &p), MP_EINVAL);
  cr_expect_eq(mp_pool_create_child(p, 0, (mp_pool_t **)&x), MP_EINVAL);
  cr_expect_null(mp_pool_device(NULL));
  cr_expect_eq(mp_pool_device(p), dev);
  cr_expect_eq(stats(p).alloc_count, 0);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, absurd_sizes_fail_with_a_message_and_count_as_oom) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  void *x = NULL;
  cr_expect_eq(mp_pool_alloc(p, SIZE_MAX, NULL, &x), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "asked"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc(p, SIZE_MAX / 2, NULL, &x), MP_ENOMEM);
  size_t two[2] = {SIZE_MAX / 2, SIZE_MAX / 2};
  void *out[2];
  cr_expect_eq(mp_pool_alloc_contiguous(p, 2, two, NULL, out), MP_ENOMEM);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.oom_count, 3);
  cr_expect_eq(s.reserved_bytes, 0);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, contiguous_pieces_are_adjacent_aligned_and_free_alone) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  size_t sizes[4] = {100, 4096, 513, 70000};
  void *out[4];
  cr_assert_eq(mp_pool_alloc_contiguous(p, 4, sizes, NULL, out), MP_OK);
  uintptr_t at = (uintptr_t)out[0];
  for (int i = 0; i < 4; i++) {
    cr_expect_eq((uintptr_t)out[i], at);
    cr_expect_eq((uintptr_t)out[i] % 512, 0);
    at += (sizes[i] + 511) / 512 * 512;
  }
  mp_stats_t s = stats(p);
  cr_expect_eq(s.live_blocks, 4);
  cr_expect_eq(s.requested_bytes, 100 + 4096 + 513 + 70000);
  check(p);
  cr_assert_eq(mp_pool_free(p, out[2]), MP_OK);
  cr_assert_eq(mp_pool_free(p, out[0]), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_free(p, out[3]), MP_OK);
  cr_assert_eq(mp_pool_free(p, out[1]), MP_OK);
  cr_expect_eq(stats(p).free_blocks, 1);
  size_t zero[2] = {512, 0};
  cr_expect_eq(mp_pool_alloc_contiguous(p, 2, zero, NULL, out), MP_EINVAL);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, block_above_max_split_is_not_split_for_a_small_request) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0,max_split=4M");
  void *big, *small;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &big), MP_OK);
  mp_pool_free(p, big);
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &small), MP_OK);
  cr_expect_neq(small, big, "the 8 MiB block must stay whole");
  mp_stats_t s = stats(p);
  cr_expect_eq(s.largest_free_bytes, 8 * MiB);
  void *again;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB - 4096, NULL, &again), MP_OK);
  cr_expect_eq(again, big, "a large request close to its size takes it whole");
  cr_expect_eq(stats(p).allocated_bytes, 8 * MiB + 4096);
  check(p);
  mp_pool_destroy(p);
  fake_close(dev);
}

Test(pool_core, reset_peaks_starts_from_current_values) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b;
  mp_pool_alloc(p, MiB, NULL, &a);
  mp_pool_alloc(p, 512, NULL, &b);
  mp_pool_free(p, a);
  cr_expect_eq(stats(p).peak_allocated_bytes, MiB + 512);
  cr_assert_eq(mp_pool_reset_peaks(p), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.peak_allocated_bytes, 512);
  cr_expect_eq(s.peak_requested_bytes, 512);
  cr_expect_eq(s.peak_reserved_bytes, s.reserved_bytes);
  mp_pool_destroy(p);
  fake_close(dev);
}

/* The fake device, with event creation failing while no_events is set. */
static bool no_events;
static mp_status_t failing_event_create(mp_device_t *dev, mp_event_t *out) {
  return no_events ? MP_EDRIVER : fake_event_create(dev, out);
}

/* A stream forgotten (destroyed) while its open epoch could get no marker
 * (no event to be had) has work only a device synchronize covers: the
 * pool's synchronize must make one. It snapshotted the epochs first, which
 * clears the dirty marks, and then looked for the forgotten stream's dirty
 * mark to choose a device synchronize: it never saw it, waited on no
 * event for that stream and still marked its epochs done, so what was
 * freed on it went to other streams with that work maybe still running. */
Test(pool_core, a_sync_covers_a_forgotten_stream_left_without_a_marker) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp__backend_t ops = *dev->ops;
  ops.event_create = failing_event_create;
  dev->ops = &ops;
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *b;
  cr_assert_eq(mp_pool_alloc(p, 4096, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  no_events = true;
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK);
  no_events = false;
  unsigned syncs = fake_of(dev)->syncs;
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->syncs, syncs + 1,
               "the trim's synchronize waited for no work of the forgotten "
               "stream");
  cr_assert_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  dev->ops = &fake_backend;
  fake_close(dev);
}
