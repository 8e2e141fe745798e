/* test_cuda_ipc.c - IPC through the cuda backend: a forked child imports a
 * pool block over a Unix socket (virtual chunks by POSIX file descriptor,
 * cuMemExportToShareableHandle / cuMemImportFromShareableHandle + cuMemMap;
 * plain segments by cuIpcGetMemHandle / cuIpcOpenMemHandle), writes it, and
 * the parent reads what it wrote; a block imported elsewhere is held until
 * the importer lets go, and destroy waits for the importers of a plain
 * segment's block (MP_EBUSY), not a virtual chunk's; an exported
 * memory descriptor is close-on-exec; without shareable memory a virtual
 * block is MP_ENOTSUP; mp_ipc_close_after waits for one stream's work and
 * leaves another thread's global-mode capture valid (mp_ipc_close's device
 * synchronization invalidated it). On the fake the export calls are
 * counted; the GPU twin (gpu_cuda_ipc) runs the same on a real driver. */
#include <fcntl.h>
#include <stdlib.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/ipc_helpers.h"
#include "../support/stream_gate.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

/* A pool on "cuda" with one small block, exported into *h. */
static mp_status_t export_small(mp_device_t *d, mp_pool_t **pool, void **p,
                                mp_ipc_handle_t *h) {
  cr_assert_eq(mp_pool_create(d, NULL, pool), MP_OK);
  cr_assert_eq(mp_pool_alloc(*pool, 4096, NULL, p), MP_OK);
  return mp_pool_ipc_export(*pool, *p, h);
}

/* p freed, no block of the pool held by an importer any more, then the pool
 * destroyed. */
static void free_unheld_destroy(mp_pool_t *pool, void *p) {
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

static void skip_without_vmm_fd(void) {
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  void *p;
  mp_ipc_handle_t h;
  mp_status_t st = export_small(d, &pool, &p, &h);
  if (st == MP_OK)
    mp_ipc_handle_close(&h);
  mp_pool_destroy(pool);
  mp_device_close(d);
  if (st == MP_ENOTSUP)
    cr_skip_test("this device cannot export virtual memory: %s",
                 mp_last_error());
}

Test(cuda_ipc, forked_child_writes_a_virtual_block_the_parent_reads_it) {
  if (!fk_is_real()) {
    ipc_round_trip("cuda", NULL);
    cr_expect_eq(fk_calls("cuMemExportToShareableHandle"), 1);
    cr_expect_eq(fk_calls("cuIpcGetMemHandle"), 0);
    return;
  }
  ipc_round_trip("cuda", NULL);
}

Test(cuda_ipc, forked_child_writes_a_plain_segment_block_the_parent_reads_it) {
  ipc_round_trip("cuda", "virtual=0");
  if (!fk_is_real()) {
    cr_expect_eq(fk_calls("cuIpcGetMemHandle"), 1);
    cr_expect_eq(fk_calls("cuMemExportToShareableHandle"), 0);
  }
}

/* The descriptors of an exported virtual block are close-on-exec, as the
 * host device's and a received handle's are: a program that starts another
 * (posix_spawn, fork and exec) between the export and mp_ipc_handle_close
 * handed it the memory's descriptor, cuMemExportToShareableHandle's own,
 * which cuda.h does not say is close-on-exec: the child then kept the
 * device memory alive and reachable. */
Test(cuda_ipc, an_exported_memory_descriptor_is_close_on_exec) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  void *p;
  mp_ipc_handle_t h;
  cr_assert_eq(export_small(d, &pool, &p, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(h.kind, MP_IPC_FD);
  cr_expect(fcntl(h.fd, F_GETFD) & FD_CLOEXEC,
            "the memory's descriptor is inherited across exec");
  cr_expect(fcntl(h.lease_fd, F_GETFD) & FD_CLOEXEC);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(d);
}

/* A handle whose sizes claim more memory than the exporter's allocation
 * (its block past that allocation's end) is MP_EINVAL and keeps its
 * descriptors; the genuine handle then imports. A forged MP_IPC_CUDA
 * handle imported with MP_OK at an address no allocation held. */
Test(cuda_ipc, a_handle_claiming_more_memory_than_it_names_is_einval) {
  ipc_round_trip_as("cuda", "virtual=0", IPC_CHILD_FORGED);
}

/* A CUDA IPC handle (a plain segment's: cuIpcGetMemHandle) carries no
 * descriptor. One naming a descriptor of the importer's own is MP_EINVAL
 * and leaves it open; the import used to succeed and then close it, as it
 * closes the memory descriptor of a virtual block's handle once mapped. */
Test(cuda_ipc, a_cuda_handle_naming_a_descriptor_is_einval_and_keeps_it) {
  ipc_round_trip_as("cuda", "virtual=0", IPC_CHILD_FORGED_FD);
}

Test(cuda_ipc, a_virtual_handle_claiming_more_memory_is_einval) {
  skip_without_vmm_fd();
  ipc_round_trip_as("cuda", NULL, IPC_CHILD_FORGED);
}

/* The same in the importing process itself, where the message is seen: a
 * virtual block's handle whose mem_bytes is more than the allocation its
 * descriptor names. The driver maps no more than the allocation (cuda.h,
 * cuMemMap: "offset + size must be less than the size of the memory
 * allocation"), and there is no call that tells an imported allocation's
 * size: the refused map is the comparison. MP_EINVAL, a message that
 * names both sizes' source and the handle's claim, no reservation left
 * behind, the handle's descriptors as they were; the genuine handle then
 * imports. Before, the message was the driver's "invalid argument" for a
 * descriptor, with no word of the handle's size being wrong. */
Test(cuda_ipc, a_virtual_handle_claiming_more_memory_says_so) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  void *p, *q = NULL;
  mp_ipc_handle_t h;
  cr_assert_eq(export_small(d, &pool, &p, &h), MP_OK, "%s", mp_last_error());
  mp_ipc_handle_t f = h;
  f.mem_bytes = 2 * h.mem_bytes; /* still a multiple of the granularity */
  long long reserves = fk_is_real() ? 0 : fk_calls("cuMemAddressReserve");
  long long frees = fk_is_real() ? 0 : fk_calls("cuMemAddressFree");
  mp_status_t st = mp_ipc_import(d, &f, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(d, q);
  cr_expect_eq(st, MP_EINVAL, "%s", mp_last_error());
  char want[64];
  snprintf(want, sizeof want, "says %zu bytes", f.mem_bytes);
  cr_expect(strstr(mp_last_error(), want) != NULL &&
                strstr(mp_last_error(), "forged or stale") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(f.fd, h.fd);
  cr_expect_eq(f.lease_fd, h.lease_fd);
  cr_expect_neq(fcntl(h.fd, F_GETFD), -1, "the refusal closed the descriptor");
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuMemAddressReserve") - reserves,
                 fk_calls("cuMemAddressFree") - frees,
                 "the refused import left a reservation");
  cr_assert_eq(mp_ipc_import(d, &h, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(d, q), MP_OK, "%s", mp_last_error());
  free_unheld_destroy(pool, p);
  mp_device_close(d);
}

/* Starts the importer in mode (*pid, its socket *sock) and makes a pool of
 * plain segments on "cuda" (*dev) with blocks p[0] and p[1] of n[0] and
 * n[1] bytes, one segment's. */
static mp_pool_t *plain_blocks_for(ipc_child_mode_t mode, const size_t n[2],
                                   int *sock, pid_t *pid, mp_device_t **dev,
                                   void *p[2]) {
  *pid = ipc_fork_child("cuda", mode, sock);
  mp_pool_t *pool = ipc_open_pool("cuda", "virtual=0", dev);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_alloc(pool, n[k], NULL, &p[k]), MP_OK, "%s",
                 mp_last_error());
  return pool;
}

/* Exports the plain-segment blocks p[0] and p[1] of pool and sends their
 * handles in turn to the importer pid (its socket sock), then waits for it
 * to finish. */
static void send_plain_blocks(int sock, pid_t pid, mp_pool_t *pool,
                              void *const p[2]) {
  for (int k = 0; k < 2; k++) {
    mp_ipc_handle_t h;
    cr_assert_eq(mp_pool_ipc_export(pool, p[k], &h), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(h.kind, MP_IPC_CUDA);
    cr_assert_eq(mp_ipc_send(sock, &h), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  }
  bool done = ipc_get(sock, 'D');
  ipc_wait_child(pid);
  cr_assert(done, "the importer did not finish");
}

/* Two blocks of one plain segment, exported each, imported in one process:
 * cuIpcGetMemHandle names the segment for both, and the importer's driver
 * opens it once, counted (cuda.h, cuIpcOpenMemHandle: "the existing device
 * pointer is returned"), so the imports share one mapping at the
 * exporter's distance. Closing the first leaves the second mapped (one
 * cuIpcCloseMemHandle each: the fake unmaps at the last, as cuda.h says);
 * what the child wrote through it reaches the parent. Before the fake
 * counted opens, each import was a mapping of its own (the child failed
 * at step 32). */
Test(cuda_ipc, two_blocks_of_one_segment_share_the_importers_mapping) {
  int sock;
  pid_t pid;
  mp_device_t *dev;
  void *p[2];
  const size_t n[2] = {4096, (size_t)1 << 19};
  mp_pool_t *pool =
      plain_blocks_for(IPC_CHILD_TWO_BLOCKS, n, &sock, &pid, &dev, p);
  for (int k = 0; k < 2; k++)
    ipc_fill(dev, p[k], n[k], IPC_PARENT_TAG);
  send_plain_blocks(sock, pid, pool, p);
  ipc_expect(dev, p[1], n[1], IPC_CHILD_TAG);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, p[k]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  close(sock);
}

/* A stale copy of a plain segment's handle (its lease closed, the number
 * given out again to another handle's lease) is refused in the importer
 * (ipc_child_stale_lease): cuIpcGetMemHandle names the whole segment for
 * both blocks, so only the lease told them apart, and it was another's.
 * Failed before: the copy imported, the first block mapped under the
 * second block's lease (the child failed at step 43). */
Test(cuda_ipc, a_stale_copy_of_a_plain_handle_with_another_lease_is_einval) {
  int sock;
  pid_t pid;
  mp_device_t *dev;
  void *p[2];
  const size_t n[2] = {4096, 4096};
  mp_pool_t *pool =
      plain_blocks_for(IPC_CHILD_STALE_LEASE, n, &sock, &pid, &dev, p);
  send_plain_blocks(sock, pid, pool, p);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, p[k]), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  close(sock);
}

/* A stale copy of h[0] whose lease number (and, with own_memory false,
 * memory number) are h[1]'s, two virtual blocks of `bytes` on the cuda
 * backend, in one process (dups stand for the reused numbers): refused
 * naming `says`, the handle and its descriptors as they were; both
 * genuine handles still import. */
static void stale_virtual_copy_refused(size_t bytes, bool own_memory,
                                       const char *says) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(d, NULL, &pool), MP_OK);
  void *p[2], *q = NULL;
  mp_ipc_handle_t h[2];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mp_pool_alloc(pool, bytes, NULL, &p[k]), MP_OK);
    cr_assert_eq(mp_pool_ipc_export(pool, p[k], &h[k]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(h[k].kind, MP_IPC_FD);
  }
  /* One chunk, two offsets; or two chunks, one offset and size. */
  cr_assert_eq(h[0].offset == h[1].offset, own_memory, "%zu, %zu", h[0].offset,
               h[1].offset);
  mp_ipc_handle_t stale = h[0];
  stale.fd = dup(h[own_memory ? 0 : 1].fd);
  stale.lease_fd = dup(h[1].lease_fd);
  cr_assert(stale.fd >= 0 && stale.lease_fd >= 0);
  mp_ipc_handle_t copy = stale;
  mp_status_t st = mp_ipc_import(d, &copy, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(d, q);
  cr_expect_eq(st, MP_EINVAL, "a stale copy imported under another lease");
  cr_expect(strstr(mp_last_error(), says) != NULL, "%s", mp_last_error());
  if (st != MP_OK) {
    cr_expect(memcmp(&copy, &stale, sizeof copy) == 0,
              "a refusal changed the handle");
    cr_expect_neq(fcntl(stale.fd, F_GETFD), -1, "the refusal closed the fd");
    cr_expect_neq(fcntl(stale.lease_fd, F_GETFD), -1,
                  "the refusal closed the lease");
    close(stale.fd);
    close(stale.lease_fd);
  }
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mp_ipc_import(d, &h[k], &q), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_ipc_close(d, q), MP_OK, "%s", mp_last_error());
  }
  cr_assert_eq(mp_pool_free(pool, p[0]), MP_OK);
  free_unheld_destroy(pool, p[1]);
  mp_device_close(d);
}

/* The same for a virtual chunk's handle: a copy of one block's handle
 * whose memory and lease numbers are another block's of the same chunk.
 * The descriptor names the right allocation, so the map fits: only the
 * lease's stamp tells that it leases the other block. Failed before: the
 * copy mapped the first block under the second block's lease. */
Test(cuda_ipc, a_stale_copy_of_a_virtual_handle_with_another_lease_is_einval) {
  stale_virtual_copy_refused(4096, false, "another block of its memory");
}

/* Two whole chunks, each block at offset 0 with the same size: a copy of
 * the first's handle (its own memory) under the second's lease. The
 * descriptors of both chunks may name one file (the fake's do), so only
 * the export's own number in the handle tells the stamps apart. Failed
 * before (the day's review): the copy imported, the first chunk mapped
 * under the second's lease. */
Test(cuda_ipc, a_stale_copy_of_another_chunks_handle_with_its_lease_is_einval) {
  stale_virtual_copy_refused((size_t)2 << 20, true, "under another export");
}

Test(cuda_ipc, imported_block_is_not_reused_until_the_importer_closes_it) {
  ipc_held_until_released("cuda", IPC_CHILD_WAIT_CLOSE);
}

Test(cuda_ipc, imported_block_is_released_when_the_importer_exits) {
  ipc_held_until_released("cuda", IPC_CHILD_WAIT_EXIT);
}

/* The fake cannot see the rule broken itself: the importer opens the
 * exporter's memory through /proc in its own process, and the exporter's
 * cuMemFree knows of no open there. What is checked is the pool: no
 * cuMemFree of the segment while the import is open. */
Test(cuda_ipc, destroy_is_ebusy_while_a_plain_segment_block_is_imported) {
  long long frees = fk_is_real() ? 0 : fk_calls("cuMemFree_v2");
  ipc_destroy_while_imported("cuda", "virtual=0");
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuMemFree_v2") - frees, 1,
                 "the segment is freed once, by the destroy that succeeds");
}

Test(cuda_ipc, destroy_goes_while_a_virtual_block_is_imported) {
  skip_without_vmm_fd();
  ipc_destroy_while_imported("cuda", NULL);
}

static void no_shareable(void) {
  setenv("FAKECUDA_NO_SHAREABLE", "1", 1);
}

Test(cuda_ipc, virtual_block_without_shareable_memory_is_enotsup,
     .init = no_shareable) {
  if (fk_is_real())
    cr_skip_test("the knob is the fake's");
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  void *p;
  mp_ipc_handle_t h;
  cr_expect_eq(export_small(d, &pool, &p, &h), MP_ENOTSUP);
  cr_expect_eq(fk_calls("cuMemExportToShareableHandle"), 0);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(d);
}

Test(cuda_ipc, a_handle_from_another_device_kind_is_einval) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda"), *host = open_dev("host");
  mp_pool_t *pool;
  void *p, *q;
  mp_ipc_handle_t h;
  cr_assert_eq(export_small(d, &pool, &p, &h), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_ipc_import(host, &h, &q), MP_EINVAL);
  cr_expect_geq(h.fd, 0, "a refused import closed the descriptor");
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(host);
  mp_device_close(d);
}

/* mp_ipc_close from a host function: cuCtxSynchronize there is a call CUDA
 * forbids (cuda.h, cuLaunchHostFunc: "The host function must not make any
 * CUDA API calls"; the fake answers CUDA_ERROR_NOT_PERMITTED). The close
 * fails before anything is unmapped, so it must change nothing: the import
 * stays mapped and leased, and a later close unmaps it. Not on a GPU,
 * where the forbidden call may hang. */
Test(cuda_ipc, a_close_that_fails_keeps_the_import_and_its_lease) {
  if (fk_is_real())
    cr_skip_test("a driver call from a host function may hang a GPU");
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool;
  void *p, *q;
  mp_ipc_handle_t h;
  cr_assert_eq(export_small(d, &pool, &p, &h), MP_OK, "%s", mp_last_error());
  int lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(d, &h, &q), MP_OK, "%s", mp_last_error());
  long long unmaps = fk_calls("cuMemUnmap");
  cr_expect_neq(ipc_close_in_host_fn(d, q), MP_OK,
                "a close from a host function succeeded");
  cr_expect_eq(fk_calls("cuMemUnmap"), unmaps, "the failed close unmapped");
  cr_expect_neq(fcntl(lease, F_GETFD), -1,
                "a failed close let the exporter reuse the block");
  cr_expect_eq(mp_ipc_close(d, q), MP_OK,
               "the import was dropped by the failed close: %s",
               mp_last_error());
  cr_expect_eq(fcntl(lease, F_GETFD), -1, "close keeps the lease open");
  free_unheld_destroy(pool, p);
  mp_device_close(d);
}

/* A copy of a handle imported already, imported on a second mp_device_t
 * of the process (the same GPU opened twice here; a program mapping one
 * block on each of its GPUs alike): both imports would own one lease, and
 * the first close would let the exporter reuse the block under the second.
 * The copy's memory descriptor number is reused by a second export, as a
 * program's next descriptor would be. Refused before any driver call. */
Test(cuda_ipc, a_copy_of_a_handle_imported_on_another_device_is_einval) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda"), *d2 = open_dev("cuda");
  mp_pool_t *pool;
  void *p, *p2, *q = NULL, *q2 = NULL;
  mp_ipc_handle_t a, b;
  cr_assert_eq(export_small(d, &pool, &p, &a), MP_OK, "%s", mp_last_error());
  mp_ipc_handle_t copy = a;
  cr_assert_eq(mp_ipc_import(d, &a, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p2), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(pool, p2, &b), MP_OK, "%s", mp_last_error());
  copy.fd = b.fd;
  long long imports =
      fk_is_real() ? 0 : fk_calls("cuMemImportFromShareableHandle");
  mp_status_t st = mp_ipc_import(d2, &copy, &q2);
  if (st == MP_OK)
    (void)mp_ipc_close(d2, q2);
  cr_expect_eq(st, MP_EINVAL, "imported a copy whose lease an import owns");
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuMemImportFromShareableHandle"), imports,
                 "the refused import reached the driver");
  cr_expect_neq(fcntl(copy.lease_fd, F_GETFD), -1,
                "the refusal closed the first import's lease");
  cr_assert_eq(mp_ipc_close(d, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p2), MP_OK);
  free_unheld_destroy(pool, p);
  mp_device_close(d2);
  mp_device_close(d);
}

/* ---- closing beside another thread's capture ----------------------------
 * mp_ipc_close waits for the device's queued work with cuCtxSynchronize,
 * which CUDA refuses while another thread captures a graph in global mode:
 * that capture is invalidated, whatever the closing thread's capture mode
 * (the fake models what an H200 did: fakecuda.c, cuCtxSynchronize).
 * mp_ipc_close_after waits for the work queued on one stream only. */

/* An import (q) of a small block (p) of a new pool on "cuda", written on a
 * new stream s; lease: the import's lease descriptor. Skipped where the
 * device cannot export virtual memory. */
typedef struct {
  mp_device_t *d;
  mp_pool_t *pool;
  void *p, *q;
  mp_stream_t s;
  int lease;
} used_import_t;

static used_import_t import_used_on_a_stream(void) {
  skip_without_vmm_fd();
  used_import_t u;
  u.d = open_dev("cuda");
  mp_ipc_handle_t h;
  cr_assert_eq(export_small(u.d, &u.pool, &u.p, &h), MP_OK, "%s",
               mp_last_error());
  u.lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(u.d, &h, &u.q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(u.d, &u.s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_memset_async(u.d, u.q, 0x5a, 4096, u.s), MP_OK, "%s",
               mp_last_error());
  return u;
}

/* The import is closed (its lease too); then everything goes. */
static void closed_then_done(used_import_t *u) {
  cr_expect_eq(fcntl(u->lease, F_GETFD), -1, "the close kept the lease open");
  cr_assert_eq(mp_stream_destroy(u->d, u->s), MP_OK);
  free_unheld_destroy(u->pool, u->p);
  mp_device_close(u->d);
}

Test(cuda_ipc, a_close_after_a_stream_keeps_another_threads_global_capture) {
  used_import_t u = import_used_on_a_stream();
  long long syncs = fk_is_real() ? 0 : fk_calls("cuCtxSynchronize");
  capture_t c;
  capture_start(&c);
  mp_status_t st = mp_ipc_close_after(u.d, u.q, u.s);
  capture_finish(&c);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuCtxSynchronize"), syncs,
                 "the close synchronized the device");
  closed_then_done(&u);
}

/* Export, import and close of a virtual block, and the export of a plain
 * segment's block, while another thread captures in global mode:
 * cuMemExportToShareableHandle, cuMemImportFromShareableHandle,
 * cuMemAddressReserve, cuMemMap, cuMemSetAccess, cuMemUnmap,
 * cuMemAddressFree and cuIpcGetMemHandle make, share or map memory outside
 * any stream, potentially unsafe as cudaMalloc (cuda.h,
 * cuThreadExchangeStreamCaptureMode; the fake refuses them there,
 * FK_UNSAFE_VMM): the backend makes them in relaxed mode. The blocks are
 * allocated before the capture (growth: test_cuda_pool_rules.c). Failed
 * before: the export was refused and the capture invalidated. */
Test(cuda_ipc, export_import_and_close_keep_another_threads_global_capture) {
  skip_without_vmm_fd();
  mp_device_t *d = open_dev("cuda");
  mp_pool_t *pool, *plain;
  void *p, *q = NULL, *r;
  cr_assert_eq(mp_pool_create(d, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "virtual=0"), MP_OK);
  cr_assert_eq(mp_pool_create(d, &cfg, &plain), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(plain, 4096, NULL, &r), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(d, &s), MP_OK, "%s", mp_last_error());
  capture_t c;
  capture_start(&c);
  mp_ipc_handle_t h, hr;
  mp_status_t ex = mp_pool_ipc_export(pool, p, &h);
  mp_status_t im = ex == MP_OK ? mp_ipc_import(d, &h, &q) : ex;
  mp_status_t cl = im == MP_OK ? mp_ipc_close_after(d, q, s) : im;
  mp_status_t exr = mp_pool_ipc_export(plain, r, &hr);
  capture_finish(&c);
  cr_assert_eq(ex, MP_OK, "%s", mp_last_error());
  cr_assert_eq(im, MP_OK, "%s", mp_last_error());
  cr_assert_eq(cl, MP_OK, "%s", mp_last_error());
  cr_assert_eq(exr, MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&hr), MP_OK);
  cr_assert_eq(mp_stream_destroy(d, s), MP_OK);
  cr_assert_eq(mp_pool_free(plain, r), MP_OK);
  cr_assert_eq(mp_pool_destroy(plain), MP_OK, "%s", mp_last_error());
  free_unheld_destroy(pool, p);
  mp_device_close(d);
}

/* It waits for that stream's work: a host function on it, held behind a
 * gate a timer opens after 300 ms, has run when the close returns. */
Test(cuda_ipc, a_close_after_a_stream_waits_for_its_work) {
  used_import_t u = import_used_on_a_stream();
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(u.d, u.s, gate_wait, &g), MP_OK);
  gate_timer_t timer;
  cr_assert_eq(gate_deadline_start(&timer, &g, 300000u), 0);
  mp_status_t st = mp_ipc_close_after(u.d, u.q, u.s);
  bool waited = atomic_load(&timer.opened) != 0;
  gate_open(&g);
  gate_timer_join(&timer);
  gate_destroy(&g);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect(waited, "the close returned before the stream's work ran");
  closed_then_done(&u);
}

/* A stream that is none of the device's: MP_EINVAL; one being captured:
 * MP_EBUSY (its work runs only when the graph is launched). Neither
 * changes anything: the import is still open and closes after. */
Test(cuda_ipc, a_close_after_a_bad_or_capturing_stream_is_refused) {
  used_import_t u = import_used_on_a_stream();
  int not_a_stream; /* a driver may crash on it: only the fake is asked */
  if (!fk_is_real()) {
    cr_expect_eq(mp_ipc_close_after(u.d, u.q, (mp_stream_t)&not_a_stream),
                 MP_EINVAL);
    cr_expect(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
              mp_last_error());
  }
  capture_load();
  CUstream k = capture_begin_here();
  mp_status_t st = mp_ipc_close_after(u.d, u.q, (mp_stream_t)k);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(u.d, (mp_stream_t)k), MP_OK);
  CUresult end = capture_end_here(k);
  cr_expect_eq(st, MP_EBUSY, "%s", msg);
  cr_expect(strstr(msg, "captured") != NULL, "%s", msg);
  cr_expect_eq(end, CUDA_SUCCESS, "the refusal invalidated the capture");
  cr_expect_neq(fcntl(u.lease, F_GETFD), -1,
                "a refused close closed the lease");
  cr_assert_eq(mp_ipc_close_after(u.d, u.q, u.s), MP_OK, "%s", mp_last_error());
  closed_then_done(&u);
}

/* The legacy stream (s NULL) while a blocking stream of the device's
 * context captures, in any capture mode: a wait for it would wait for that
 * capture's work, and the driver refuses it and invalidates the capture
 * (cuda.h, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: "a disallowed implicit
 * dependency on a current capture sequence from cudaStreamLegacy"), as
 * cuStreamIsCapturing of it says (that code, the capture left alone).
 * MP_EBUSY, as for a stream being captured, nothing changed. Failed before:
 * the close waited on the legacy stream, the driver's refusal (MP_EDRIVER)
 * and an invalidated capture. */
Test(cuda_ipc, a_close_after_the_legacy_stream_beside_a_blocking_capture) {
  used_import_t u = import_used_on_a_stream();
  /* The legacy stream covers no work of the non-blocking u.s: done first,
   * so that a close after the legacy stream is the program's right one. */
  cr_assert_eq(mp_stream_synchronize(u.d, u.s), MP_OK, "%s", mp_last_error());
  capture_load();
  CUstream k =
      capture_begin_with(CU_STREAM_DEFAULT, CU_STREAM_CAPTURE_MODE_RELAXED);
  mp_status_t st = mp_ipc_close_after(u.d, u.q, NULL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  CUresult end = capture_end_here(k);
  cr_expect_eq(st, MP_EBUSY, "%s (%s)", mp_status_name(st), msg);
  cr_expect_eq(end, CUDA_SUCCESS, "the close invalidated the capture (%d)",
               (int)end);
  cr_expect_neq(fcntl(u.lease, F_GETFD), -1,
                "a refused close closed the lease");
  cr_assert_eq(mp_ipc_close_after(u.d, u.q, NULL), MP_OK, "%s",
               mp_last_error());
  closed_then_done(&u);
}

/* mp_device_close beside another thread's global-mode capture: its wait
 * for the device's work (cuCtxSynchronize) is refused (fakecuda.c, as on
 * an H200), so it closes nothing, the imports left open included: the
 * import stays mapped and leased (the exporter may not reuse the block
 * while this process may still read it), and the message says why. Once
 * the capture has ended, a close unmaps the import and lets the lease go.
 * Before, the close went on after the refused wait: it unmapped the import
 * and released the device's memory under work that may still use it. */
Test(cuda_ipc, a_device_close_beside_a_global_capture_closes_nothing) {
  used_import_t u = import_used_on_a_stream();
  cr_assert_eq(mp_stream_synchronize(u.d, u.s), MP_OK);
  cr_assert_eq(mp_stream_destroy(u.d, u.s), MP_OK);
  cr_assert_eq(mp_pool_free(u.pool, u.p), MP_OK);
  cr_assert_eq(mp_pool_destroy(u.pool), MP_OK, "%s", mp_last_error());
  capture_load();
  CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
  FK_LOAD(range, "cuMemGetAddressRange_v2");
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  CUdeviceptr base = 0;
  size_t size = 0;
  cr_assert_eq(range(&base, &size, (CUdeviceptr)(uintptr_t)u.q), CUDA_SUCCESS);
  capture_t c;
  capture_start(&c);
  mp_device_close(u.d); /* its wait breaks the capture: not checked */
  mp_status_t st = mp_last_status();
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  atomic_store(&c.stage, 2);
  pthread_join(c.thread, NULL);
  cr_expect_neq(st, MP_OK, "%s", msg);
  cr_expect(strstr(msg, "nothing was closed") != NULL, "%s", msg);
  cr_expect_eq(range(&base, &size, (CUdeviceptr)(uintptr_t)u.q), CUDA_SUCCESS,
               "the refused close unmapped the import");
  cr_expect_neq(fcntl(u.lease, F_GETFD), -1,
                "the refused close let the lease go");
  mp_device_close(u.d);
  CUresult r = range(&base, &size, (CUdeviceptr)(uintptr_t)u.q);
  cr_expect_neq(r, CUDA_SUCCESS,
                "the closed device left the import mapped (%p, %zu bytes)",
                (void *)(uintptr_t)base, size);
  cr_expect_eq(fcntl(u.lease, F_GETFD), -1, "the close kept the lease open");
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
}
