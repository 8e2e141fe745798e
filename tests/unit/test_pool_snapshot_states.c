/* A snapshot's block states are PyTorch's: "active_allocated" while the
 * program holds a block, "active_pending_free" once it let go but the
 * block is not yet reusable, "inactive" when free
 * (torch/csrc/cuda/memory_snapshot.cpp writes allocated, else active,
 * else inactive; CUDACachingAllocator.cpp's snapshot() calls a block
 * active while it is allocated or its reuse waits for events or stream
 * uses). And its trace says free_requested when the program frees and
 * free_completed when the block can be reused, as PyTorch's does
 * (bench/core/pickle.c reads them so). A block freed while another
 * process imports it is held until its leases close (export.c): it was
 * written as active_allocated, and both free events came only when the
 * leases closed. The ladder's block: test_pool_pause.c. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_states, "host:capacity=64M");

Test(pool_snapshot_states, a_block_freed_while_imported_is_pending_free) {
  mp_pool_t *pool = make_pool(dev, "history=100");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &b), MP_OK);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, a, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());

  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_allocated"), 1);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  cr_expect_eq(snapshot_sum(s, len, "allocated_size", &n), 2 * MiB);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 3 * MiB);
  /* Each block's requested_size, and each segment's, which sums them. */
  cr_expect_eq(snapshot_sum(s, len, "requested_size", &n), 2 * 3 * MiB);
  cr_expect_eq(snapshot_str_count(s, len, "free_requested"), 1);
  cr_expect_eq(snapshot_str_count(s, len, "free_completed"), 0);
  free(s);

  /* The lease closed: a poll reaps it and the block goes back. */
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  size_t held;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  cr_assert_eq(held, 0);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  check(pool);
  s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_allocated"), 0);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 0);
  cr_expect_eq(snapshot_str_count(s, len, "free_requested"), 2);
  cr_expect_eq(snapshot_str_count(s, len, "free_completed"), 2);
  free(s);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}
