/* test_pool_ipc_unstamped_lease.c - a lease descriptor that carries no
 * stamp is no lease of an export: every export writes one into its lease
 * (src/pool/export.c) before it shuts the pool's end for writing, and the
 * stamp stays readable at the importer's end also once the pool's end is
 * closed. A Unix socket whose peer hung up (or shut writing) with nothing
 * sent passes every other check of mp_ipc_import: a program's own
 * connection whose peer went away, at the number of a stale copy's lease.
 * Taken "as before stamps", the import owned the program's socket (and
 * closed it at mp_ipc_close), and for a plain CUDA segment's handle, which
 * has no memory descriptor to tell it, mapped the copy's old block under
 * no lease at all (the exporter free to reuse it). Refused now: MP_EINVAL,
 * the handle and its descriptors as they were. Failed before: the import
 * succeeded. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/ipc_helpers.h"
#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_ipc_unstamped_lease, "host:capacity=64M");

static bool fd_open(int fd) {
  return fcntl(fd, F_GETFD) != -1;
}

/* good, a genuine export, with its lease swapped for sock: refused, sock
 * and good's descriptors open; then good imports. */
static void refused_with_lease(mp_ipc_handle_t *good, int sock,
                               const char *what) {
  mp_ipc_handle_t bad = *good;
  bad.lease_fd = sock;
  void *q = NULL;
  mp_status_t st = mp_ipc_import(dev, &bad, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q); /* closes sock, as the import owned it */
  cr_expect_eq(st, MP_EINVAL, "%s: an unstamped lease was taken (%d)", what,
               st);
  cr_expect(strstr(mp_last_error(), "stamp") != NULL, "%s: '%s'", what,
            mp_last_error());
  cr_expect_null(q, "%s", what);
  cr_expect_eq(bad.lease_fd, sock, "%s: the refusal changed the handle", what);
  cr_expect_eq(bad.fd, good->fd, "%s: the refusal changed the handle", what);
  cr_expect(fd_open(sock) && fd_open(good->fd) && fd_open(good->lease_fd),
            "%s: a refused import closed a descriptor", what);
}

Test(pool_ipc_unstamped_lease, a_socket_whose_peer_hung_up_is_no_lease) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, NULL, &p), MP_OK);
  mp_ipc_handle_t good;
  cr_assert_eq(mp_pool_ipc_export(pool, p, &good), MP_OK, "%s",
               mp_last_error());
  int sv[2];
  /* The peer gone with nothing sent. */
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  cr_assert_eq(close(sv[1]), 0);
  refused_with_lease(&good, sv[0], "peer closed");
  cr_assert_eq(close(sv[0]), 0);
  /* The peer open, its writing shut with nothing sent (as an export's
   * lease, but unstamped). */
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  cr_assert_eq(shutdown(sv[1], SHUT_WR), 0);
  refused_with_lease(&good, sv[0], "peer shut writing");
  cr_assert_eq(close(sv[0]), 0);
  cr_assert_eq(close(sv[1]), 0);
  /* The genuine handle still imports, its lease stamped. */
  int lease = good.lease_fd;
  cr_assert_eq(mp_ipc_import(dev, &good, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_expect(!fd_open(lease), "the close kept the lease");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* The stamp outlives the pool's end: a handle of a virtual block whose
 * pool was destroyed (which closes the leases left, keeping the exported
 * memory for its importers) still imports, and reads what the exporter
 * wrote. */
Test(pool_ipc_unstamped_lease,
     a_lease_whose_pool_end_is_closed_keeps_its_stamp) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, NULL, &p), MP_OK);
  ipc_fill(dev, p, 3 * MiB, 7);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_import(dev, &h, &q), MP_OK, "%s", mp_last_error());
  ipc_expect(dev, q, 3 * MiB, 7);
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
}
