/* test_pool_ipc.c - IPC on the host device (its memory is a memfd, so
 * another process can map it): a forked child imports a pool block over a
 * Unix socket, writes it, and the parent reads what it wrote, for virtual
 * and plain segments; a block still imported elsewhere is not reused until
 * the importer lets go (mp_ipc_close, or its exit); destroy waits for the
 * importers of a plain segment's block (MP_EBUSY), not a virtual chunk's;
 * a freed block whose importers let go serves every kind of allocation,
 * with arenas or without; a trim while it is held gives nothing of it
 * back, and it goes back once, after the importer unmapped it; a block
 * exported again and again keeps no lease its importers let go; a stale
 * handle (its numbers reused for another export's) is refused; bad
 * handles, pointers, sockets and messages are refused with nothing changed
 * and nothing received left open; sockets that also pass credentials or
 * pidfds receive handles and leave nothing open. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/ipc_helpers.h"
#include "../support/pool_helpers.h"

#define MiB  ((size_t)1 << 20)
#define SPEC "host:capacity=256M"

Test(pool_ipc, forked_child_writes_a_virtual_block_the_parent_reads_it) {
  ipc_round_trip(SPEC, NULL);
}

Test(pool_ipc, forked_child_writes_a_plain_segment_block_the_parent_reads_it) {
  ipc_round_trip(SPEC, "virtual=0");
}

/* A handle whose sizes claim more memory than its descriptor holds: MP_EINVAL,
 * descriptors kept; the genuine handle then imports. */
Test(pool_ipc, a_handle_claiming_more_memory_than_it_names_is_einval) {
  ipc_round_trip_as(SPEC, NULL, IPC_CHILD_FORGED);
  ipc_round_trip_as(SPEC, "virtual=0", IPC_CHILD_FORGED);
}

Test(pool_ipc, imported_block_is_not_reused_until_the_importer_closes_it) {
  ipc_held_until_released(SPEC, IPC_CHILD_WAIT_CLOSE);
}

Test(pool_ipc, imported_block_is_released_when_the_importer_exits) {
  ipc_held_until_released(SPEC, IPC_CHILD_WAIT_EXIT);
}

Test(pool_ipc, destroy_is_ebusy_while_a_plain_segment_block_is_imported) {
  ipc_destroy_while_imported(SPEC, "virtual=0");
}

Test(pool_ipc, destroy_goes_while_a_virtual_block_is_imported) {
  ipc_destroy_while_imported(SPEC, NULL);
}

MP_DEVICE_SUITE(pool_ipc_args, SPEC);

static bool fd_open(int fd) {
  return fcntl(fd, F_GETFD) != -1;
}

/* A handle of this process's own block, to spoil field by field. */
static mp_ipc_handle_t exported(mp_pool_t *pool, void **p) {
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, NULL, p), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(pool, *p, &h), MP_OK, "%s", mp_last_error());
  return h;
}

/* Frees p, whose imports are all closed: nothing is held after a poll. */
static void free_released_and_destroy(mp_pool_t *pool, void *p) {
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_ipc_args, bad_handles_are_einval_and_keep_their_descriptors) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q;
  mp_ipc_handle_t good = exported(pool, &p);
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  mp_ipc_handle_t bad[8];
  for (int i = 0; i < 8; i++)
    bad[i] = good;
  bad[0].kind = 0;
  bad[1].kind = 99;
  bad[2].fd = -1;
  bad[3].lease_fd = -1;
  bad[4].offset = good.mem_bytes; /* the block would lie outside */
  snprintf(bad[5].backend, sizeof bad[5].backend, "cuda");
  bad[6].fd = pipefd[0]; /* not device memory */
  /* A CUDA IPC handle carries no descriptor (refused here by the check and
   * by the host device alike; test_cuda_ipc.c shows the check on a CUDA
   * handle, which imported and closed the descriptor named). */
  bad[7].kind = MP_IPC_CUDA;
  for (int i = 0; i < 8; i++) {
    cr_expect_eq(mp_ipc_import(dev, &bad[i], &q), MP_EINVAL, "bad handle %d",
                 i);
    cr_expect_eq(bad[i].lease_fd,
                 good.lease_fd == -1 || i == 3 ? -1 : good.lease_fd);
  }
  cr_expect(fd_open(pipefd[0]) && fd_open(good.fd) && fd_open(good.lease_fd),
            "a refused import closed a descriptor");
  cr_expect_eq(mp_ipc_import(NULL, &good, &q), MP_EINVAL);
  cr_expect_eq(mp_ipc_import(dev, NULL, &q), MP_EINVAL);
  cr_expect_eq(mp_ipc_import(dev, &good, NULL), MP_EINVAL);

  /* The genuine one maps the same memory (here, in this process). */
  int fd = good.fd, lease = good.lease_fd;
  cr_assert_eq(mp_ipc_import(dev, &good, &q), MP_OK, "%s", mp_last_error());
  cr_expect_eq(good.fd, -1);
  cr_expect_eq(good.lease_fd, -1);
  cr_expect(!fd_open(fd), "the memory's descriptor stays open once mapped");
  cr_expect(fd_open(lease), "the import must keep its lease");
  ipc_fill(dev, q, 3 * MiB, 3);
  ipc_expect(dev, p, 3 * MiB, 3);
  cr_expect_eq(mp_ipc_close(dev, p == q ? NULL : p), MP_EINVAL);
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_expect(!fd_open(lease), "close keeps the lease open");
  cr_expect_eq(mp_ipc_close(dev, q), MP_EINVAL, "closed twice");
  cr_expect_eq(mp_ipc_close(NULL, q), MP_EINVAL);
  close(pipefd[0]);
  close(pipefd[1]);
  free_released_and_destroy(pool, p);
}

/* A handle's backend name, which a handle received from another process
 * carries as it was sent (mp_ipc_recv checks only that it is a string), is
 * quoted in the refusal as any input is (status.h, mp_last_error): an
 * escape sequence and ill-formed UTF-8 come out as '?', not as bytes a
 * terminal obeys. */
Test(pool_ipc_args, a_foreign_backend_name_is_quoted_without_controls) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t h = exported(pool, &p);
  int fd = h.fd, lease = h.lease_fd;
  snprintf(h.backend, sizeof h.backend, "\x1b[2J\xc2\x9b\xffx");
  cr_expect_eq(mp_ipc_import(dev, &h, &q), MP_EINVAL);
  const char *msg = mp_last_error();
  for (const char *c = msg; *c != '\0'; c++)
    cr_expect((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f,
              "byte %#x at %zu of: %s", (unsigned)(unsigned char)*c,
              (size_t)(c - msg), msg);
  cr_expect(strstr(msg, "'?[2J??x'") != NULL, "%s", msg);
  cr_expect_eq(h.fd, fd);
  cr_expect_eq(h.lease_fd, lease);
  cr_expect(fd_open(fd) && fd_open(lease), "the refusal closed a descriptor");
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  free_released_and_destroy(pool, p);
}

/* A memory descriptor that is no host device's exported memory: any
 * other regular file (large enough, at an aligned offset or not), a memfd
 * of the program's own, or the device's file at an offset no export
 * hands out (not page-aligned). Refused as no mempool IPC handle, nothing
 * mapped, the handle and its descriptors as they were. Failed before: the
 * aligned file was mapped as if it were the block, the misaligned one was
 * an "mmap failed" MP_ENOMEM. */
Test(pool_ipc_args, a_descriptor_of_another_file_is_no_mempool_handle) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t good = exported(pool, &p);
  off_t good_at = lseek(good.fd, 0, SEEK_CUR);
  cr_assert_geq(good_at, 0);
  FILE *tmp = tmpfile();
  cr_assert_not_null(tmp);
  int other = memfd_create("not-mempool", MFD_CLOEXEC);
  cr_assert_geq(other, 0);
  /* Both hold more than the handle claims. */
  off_t len = (off_t)(good_at + good.mem_bytes + (8u << 20));
  cr_assert_eq(ftruncate(fileno(tmp), len), 0);
  cr_assert_eq(ftruncate(other, len), 0);
  struct {
    int fd;
    off_t at;
    const char *what;
  } forged[] = {{fileno(tmp), 0, "a regular file"},
                {fileno(tmp), 100, "a regular file, misaligned"},
                {other, 0, "another memfd"},
                {good.fd, good_at + 100, "the device file, misaligned"}};
  for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
    cr_assert_eq(lseek(forged[i].fd, forged[i].at, SEEK_SET), forged[i].at);
    mp_ipc_handle_t bad = good;
    bad.fd = forged[i].fd;
    mp_status_t st = mp_ipc_import(dev, &bad, &q);
    if (st == MP_OK)
      (void)mp_ipc_close(dev, q);
    cr_expect_eq(st, MP_EINVAL, "%s: %s", forged[i].what, mp_last_error());
    cr_expect(strstr(mp_last_error(), "not a mempool IPC handle") != NULL,
              "%s: %s", forged[i].what, mp_last_error());
    cr_expect(bad.fd == forged[i].fd && bad.lease_fd == good.lease_fd,
              "%s: a refusal changed the handle", forged[i].what);
    cr_expect(fd_open(forged[i].fd) && fd_open(good.lease_fd),
              "%s: a refused import closed a descriptor", forged[i].what);
  }
  /* The genuine handle, put back where it was, still imports. */
  cr_assert_eq(lseek(good.fd, good_at, SEEK_SET), good_at);
  cr_assert_eq(mp_ipc_import(dev, &good, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  fclose(tmp);
  close(other);
  free_released_and_destroy(pool, p);
}

/* A handle of the device's own file that names memory outside the
 * allocation exported: more of it than was exported (into the next
 * allocation of the file), or a start where no export starts (an
 * unexported allocation, or inside the exported one). The descriptor
 * opens the whole device file, so each fitted in it and was mapped: the
 * importer read and wrote memory nobody exported to it. Refused now, with
 * nothing mapped and the handle as it was; the genuine handle imports. */
Test(pool_ipc_args, a_handle_naming_memory_outside_its_export_is_einval) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *after, *q = NULL;
  mp_ipc_handle_t good = exported(pool, &p);
  /* An allocation of the file after the exported one: 64 MiB, a virtual
   * chunk of its own. */
  cr_assert_eq(mp_pool_alloc(pool, 64 * MiB, NULL, &after), MP_OK);
  off_t good_at = lseek(good.fd, 0, SEEK_CUR);
  cr_assert_geq(good_at, 0);
  const off_t page = (off_t)sysconf(_SC_PAGESIZE);
  struct {
    off_t at;
    size_t mem_bytes;
    const char *what;
  } forged[] = {
      {good_at, good.mem_bytes + 2 * MiB, "more than was exported"},
      {good_at + (off_t)good.mem_bytes, good.mem_bytes,
       "the allocation after the export"},
      {good_at + page, good.mem_bytes - (size_t)page,
       "a start inside the export"},
  };
  for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
    cr_assert_eq(lseek(good.fd, forged[i].at, SEEK_SET), forged[i].at);
    /* Copies of the descriptors (the file position is shared), which an
     * import that succeeds takes and closes. */
    mp_ipc_handle_t bad = good;
    bad.fd = dup(good.fd);
    bad.lease_fd = dup(good.lease_fd);
    cr_assert(bad.fd >= 0 && bad.lease_fd >= 0);
    bad.mem_bytes = forged[i].mem_bytes;
    bad.offset = 0;
    bad.bytes = forged[i].mem_bytes;
    int fd = bad.fd, lease = bad.lease_fd;
    mp_status_t st = mp_ipc_import(dev, &bad, &q);
    if (st == MP_OK)
      (void)mp_ipc_close(dev, q);
    cr_expect_eq(st, MP_EINVAL, "%s: %s", forged[i].what, mp_status_name(st));
    cr_expect(strstr(mp_last_error(), "export") != NULL, "%s: %s",
              forged[i].what, mp_last_error());
    if (st == MP_OK)
      continue;
    cr_expect(bad.fd == fd && bad.lease_fd == lease,
              "%s: a refusal changed the handle", forged[i].what);
    cr_expect(fd_open(fd) && fd_open(lease),
              "%s: a refused import closed a descriptor", forged[i].what);
    close(fd);
    close(lease);
  }
  cr_assert_eq(lseek(good.fd, good_at, SEEK_SET), good_at);
  cr_assert_eq(mp_ipc_import(dev, &good, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, after), MP_OK);
  free_released_and_destroy(pool, p);
}

/* An import that cannot ask which allocation its descriptor exports (the
 * process out of descriptors: the question opens one) says so, and keeps
 * the handle; before, it called the handle one no export made. */
Test(pool_ipc_args, an_import_out_of_descriptors_says_so) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t h = exported(pool, &p);
  struct rlimit was;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
  int fill[64], n = 0;
  int top = dup(0);
  cr_assert_geq(top, 0);
  close(top);
  struct rlimit low = {(rlim_t)top + 8, was.rlim_max};
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  while (n < 64 && (fill[n] = dup(0)) >= 0)
    n++;
  cr_assert_lt(n, 64, "the limit did not stop the copies");
  mp_status_t st = mp_ipc_import(dev, &h, &q);
  for (int i = 0; i < n; i++)
    close(fill[i]);
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
  cr_expect_eq(st, MP_EIO, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "cannot ask") != NULL &&
                strstr(mp_last_error(), strerror(EMFILE)) != NULL,
            "%s", mp_last_error());
  cr_expect(fd_open(h.fd) && fd_open(h.lease_fd));
  cr_assert_eq(mp_ipc_import(dev, &h, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  free_released_and_destroy(pool, p);
}

/* A lease that is not one (any open descriptor of the program, here a
 * pipe's) is refused like a missing one: the import would own it, and
 * mp_ipc_close would close the program's pipe, while the exporter's block
 * stayed held by the real lease that nobody imported. */
Test(pool_ipc_args, a_lease_descriptor_that_is_no_socket_is_einval) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t good = exported(pool, &p);
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  mp_ipc_handle_t bad = good;
  bad.lease_fd = pipefd[0];
  mp_status_t st = mp_ipc_import(dev, &bad, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q);
  cr_expect_eq(st, MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "lease") != NULL, "%s", mp_last_error());
  cr_expect_eq(bad.lease_fd, pipefd[0], "a refusal changed the handle");
  cr_expect(fd_open(pipefd[0]) && fd_open(good.fd) && fd_open(good.lease_fd),
            "a refused import closed a descriptor");
  /* Nor is a socket of another kind than the export's Unix socketpair:
   * its close, made under the process's IPC lock, might block (a TCP
   * socket with SO_LINGER). */
  int tcp = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(tcp, 0);
  bad.lease_fd = tcp;
  st = mp_ipc_import(dev, &bad, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q);
  cr_expect_eq(st, MP_EINVAL, "a TCP socket was taken for a lease");
  cr_expect(strstr(mp_last_error(), "not a Unix socket") != NULL, "%s",
            mp_last_error());
  cr_expect(fd_open(tcp) && fd_open(good.fd) && fd_open(good.lease_fd),
            "a refused import closed a descriptor");
  close(tcp);
  cr_assert_eq(mp_ipc_handle_close(&good), MP_OK);
  close(pipefd[0]);
  close(pipefd[1]);
  free_released_and_destroy(pool, p);
}

/* A handle naming one descriptor as both its memory and its lease (made by
 * hand: no export makes one) is refused by the import and by the close,
 * which would close the number twice (the second time, maybe a descriptor
 * another thread opened meanwhile); nothing is closed. Failed before: the
 * close closed it (twice). */
Test(pool_ipc_args, a_handle_whose_memory_is_its_lease_is_einval) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t good = exported(pool, &p);
  cr_assert_eq(good.kind, MP_IPC_FD);
  mp_ipc_handle_t bad = good;
  bad.fd = good.lease_fd;
  mp_status_t st = mp_ipc_import(dev, &bad, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q);
  cr_expect_eq(st, MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "both") != NULL, "%s", mp_last_error());
  cr_expect_eq(mp_ipc_handle_close(&bad), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "both") != NULL, "%s", mp_last_error());
  cr_expect_eq(bad.fd, good.lease_fd, "a refusal changed the handle");
  cr_expect(fd_open(good.fd) && fd_open(good.lease_fd),
            "a refusal closed a descriptor");
  cr_assert_eq(mp_ipc_handle_close(&good), MP_OK, "%s", mp_last_error());
  free_released_and_destroy(pool, p);
}

/* A lease descriptor that is a Unix socket but not the importer's end of a
 * lease (another socket pair's end here; the exporting pool's own end is
 * one too) is refused, and nothing is closed: the import would own it,
 * and its close close it. Taken before: the pool's own end of a lease,
 * named in a handle, was closed by the importer's close under the pool,
 * which later closed its number again (a program's descriptor by then). */
Test(pool_ipc_args, a_lease_that_is_no_importers_end_is_einval) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q = NULL;
  mp_ipc_handle_t good = exported(pool, &p);
  int sp[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  for (int end = 0; end < 2; end++) {
    mp_ipc_handle_t bad = good;
    bad.lease_fd = sp[end];
    mp_status_t st = mp_ipc_import(dev, &bad, &q);
    if (st == MP_OK)
      (void)mp_ipc_close(dev, q);
    cr_expect_eq(st, MP_EINVAL, "end %d", end);
    cr_expect(strstr(mp_last_error(), "importer's end") != NULL, "%s",
              mp_last_error());
    cr_expect(fd_open(sp[end]), "a refusal closed a descriptor");
  }
  close(sp[0]);
  close(sp[1]);
  /* The genuine handle still imports. */
  cr_assert_eq(mp_ipc_import(dev, &good, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  free_released_and_destroy(pool, p);
}

/* A copy of a handle taken before it was imported still names the lease
 * the import now owns; by the time it is imported, its memory descriptor's
 * number may name another export's memory (descriptor numbers are reused:
 * here set so). Refused: it would map another block under a lease that is
 * not its own, the first close would let the exporter reuse the block under
 * the second import, and the second close would close the number again.
 * Failed before: the copy was imported. */
Test(pool_ipc_args, a_copy_of_an_imported_handle_is_einval) {
  /* Both blocks in one device allocation, so that each can be exported. */
  mp_pool_t *pool = make_pool(dev, "segment_bytes=32M");
  void *p, *p2, *q = NULL, *q2 = NULL;
  mp_ipc_handle_t a = exported(pool, &p);
  mp_ipc_handle_t copy = a;
  cr_assert_eq(mp_ipc_import(dev, &a, &q), MP_OK, "%s", mp_last_error());
  mp_ipc_handle_t b = exported(pool, &p2);
  copy.fd = b.fd; /* the number a's import closed, reused by b */
  mp_status_t st = mp_ipc_import(dev, &copy, &q2);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q2);
  cr_expect_eq(st, MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "belongs to an open import") != NULL, "%s",
            mp_last_error());
  cr_expect(fd_open(b.fd) && fd_open(b.lease_fd) && fd_open(copy.lease_fd),
            "a refused import closed a descriptor");
  /* The genuine import and b's handle are as they were. */
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  free_released_and_destroy(pool, p2);
}

/* The same with the copy imported on another device of the process (a
 * program mapping one block on each of its GPUs from one received handle;
 * on CUDA a plain segment's handle carries no memory descriptor, so only
 * the lease tells the copy). Failed before: the lease check looked at the
 * importing device's imports only, so both imports owned one lease; the
 * first close let the exporter reuse the block under the second, which
 * then closed the same descriptor number again. */
Test(pool_ipc_args, a_copy_of_a_handle_imported_on_another_device_is_einval) {
  mp_device_t *dev2 = open_dev(SPEC);
  mp_pool_t *pool = make_pool(dev, "segment_bytes=32M");
  void *p, *p2, *q = NULL, *q2 = NULL;
  mp_ipc_handle_t a = exported(pool, &p);
  mp_ipc_handle_t copy = a;
  cr_assert_eq(mp_ipc_import(dev, &a, &q), MP_OK, "%s", mp_last_error());
  mp_ipc_handle_t b = exported(pool, &p2);
  copy.fd = b.fd; /* the number a's import closed, reused by b */
  mp_status_t st = mp_ipc_import(dev2, &copy, &q2);
  bool lease_open_after_close = false;
  if (st == MP_OK) {
    (void)mp_ipc_close(dev2, q2);
    lease_open_after_close = fd_open(copy.lease_fd);
  }
  cr_expect_eq(st, MP_EINVAL, "imported a copy whose lease an import owns");
  cr_expect(st != MP_OK || lease_open_after_close,
            "closing the copy's import closed the first import's lease");
  cr_expect(strstr(mp_last_error(), "belongs to an open import") != NULL, "%s",
            mp_last_error());
  cr_expect(fd_open(b.fd) && fd_open(b.lease_fd) && fd_open(copy.lease_fd),
            "a refused import closed a descriptor");
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  free_released_and_destroy(pool, p2);
  mp_device_close(dev2);
}

/* A stale handle: a copy kept after its descriptors were closed (by
 * mp_ipc_handle_close, an import, the exporter), whose numbers the OS has
 * since given to another export's descriptors (here copies of them stand
 * for the reused numbers). It names that export now, with its own sizes
 * and offset: imported, it mapped the other export's memory as its block,
 * under the other export's lease. Refused (nothing mapped, every
 * descriptor as it was), whether the other export is of another device
 * allocation (pool2 another pool) or of another block of the same one;
 * the other export's handle still imports. Failed before: both imported. */
static void a_stale_copy_is_einval(mp_pool_t *pool, mp_pool_t *pool2) {
  void *p, *p2, *q = NULL;
  mp_ipc_handle_t a = exported(pool, &p);
  mp_ipc_handle_t stale = a;
  cr_assert_eq(mp_ipc_handle_close(&a), MP_OK);
  mp_ipc_handle_t b = exported(pool2, &p2);
  cr_assert_eq(b.mem_bytes, stale.mem_bytes);
  stale.fd = dup(b.fd);
  stale.lease_fd = dup(b.lease_fd);
  cr_assert(stale.fd >= 0 && stale.lease_fd >= 0);
  mp_ipc_handle_t copy = stale;
  mp_status_t st = mp_ipc_import(dev, &copy, &q);
  if (st == MP_OK)
    (void)mp_ipc_close(dev, q);
  cr_expect_eq(st, MP_EINVAL, "a stale handle was imported as another export");
  cr_expect(strstr(mp_last_error(), "not the one its export") != NULL, "%s",
            mp_last_error());
  if (st != MP_OK) {
    cr_expect(memcmp(&copy, &stale, sizeof copy) == 0,
              "a refusal changed the handle");
    cr_expect(fd_open(stale.fd) && fd_open(stale.lease_fd),
              "a refused import closed a descriptor");
    close(stale.fd);
    close(stale.lease_fd);
  }
  cr_assert_eq(mp_ipc_import(dev, &b, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  if (pool2 == pool) {
    cr_assert_eq(mp_pool_free(pool, p2), MP_OK);
  } else {
    free_released_and_destroy(pool2, p2);
  }
  free_released_and_destroy(pool, p);
}

Test(pool_ipc_args, a_stale_copy_naming_another_allocation_is_einval) {
  a_stale_copy_is_einval(make_pool(dev, NULL), make_pool(dev, NULL));
}

Test(pool_ipc_args, a_stale_copy_naming_another_block_of_its_memory_is_einval) {
  /* Both blocks in one device allocation. */
  mp_pool_t *pool = make_pool(dev, "segment_bytes=32M");
  a_stale_copy_is_einval(pool, pool);
}

/* mp_ipc_handle_close of a copy of a handle imported already (one passed
 * by value to the import, the caller's copy then "cleaned up"): its lease
 * number is the import's. Failed before: the close closed the import's
 * lease, so the exporter reused the block while the import still mapped
 * it (here: freed, it was not held); and the memory descriptor the import
 * had closed, a number the program may have reused since. Now MP_EINVAL,
 * nothing closed. */
Test(pool_ipc_args, closing_a_copy_of_an_imported_handle_is_einval) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q;
  mp_ipc_handle_t h = exported(pool, &p);
  mp_ipc_handle_t copy = h;
  int lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(dev, &h, &q), MP_OK, "%s", mp_last_error());
  int other = open("/dev/null", O_RDONLY); /* gets the number h.fd had */
  cr_assert_geq(other, 0);
  cr_expect_eq(mp_ipc_handle_close(&copy), MP_EINVAL,
               "closed the lease of an open import");
  cr_expect(strstr(mp_last_error(), "open import") != NULL, "%s",
            mp_last_error());
  cr_expect(fd_open(lease), "the import's lease was closed");
  cr_expect(fd_open(other), "a descriptor of the program was closed");
  cr_expect_eq(copy.lease_fd, lease, "a refusal changed the handle");
  /* Still imported: a free holds the block. */
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  size_t held = 0;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 1, "the block was released while imported");
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  close(other);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_ipc_args, bad_exports_are_refused_and_change_nothing) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *gone;
  mp_ipc_handle_t h, untouched;
  memset(&untouched, 0x7b, sizeof untouched);
  h = untouched;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &gone), MP_OK);
  cr_assert_eq(mp_pool_free(pool, gone), MP_OK);
  mp_handle_t *mv;
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &mv), MP_OK);
  mp_stats_t before = stats(pool);
  cr_expect_eq(mp_pool_ipc_export(NULL, p, &h), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, NULL, &h), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, p, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, (char *)p + 512, &h), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, gone, &h), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, mp_handle_ptr(mv), &h), MP_EINVAL);
  cr_expect_eq(memcmp(&h, &untouched, sizeof h), 0, "a refusal wrote *out");
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);

  /* Paused: MP_EBUSY. */
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_ipc_export(pool, p, &h), MP_EBUSY);
  cr_assert_eq(mp_pool_resume(pool), MP_OK);
  /* A handle that never reaches an importer keeps pause away until it is
   * closed. */
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, 0), MP_EBUSY);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect_eq(h.kind, 0);
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(pool), MP_OK);

  /* A child pool's block: not supported. */
  mp_pool_t *child;
  void *c;
  cr_assert_eq(mp_pool_create_child(pool, 4 * MiB, &child), MP_OK);
  cr_assert_eq(mp_pool_alloc(child, MiB, NULL, &c), MP_OK);
  cr_expect_eq(mp_pool_ipc_export(child, c, &h), MP_ENOTSUP);
  cr_assert_eq(mp_pool_destroy(child), MP_OK);
  cr_assert_eq(mp_handle_free(mv), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* mp_ipc_close from a host function: the host device refuses the wait for
 * its own streams (MP_EINVAL), so the close fails before anything is
 * unmapped. */
Test(pool_ipc_args, a_close_that_fails_keeps_the_import_and_its_lease) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q;
  mp_ipc_handle_t h = exported(pool, &p);
  int lease = h.lease_fd;
  cr_assert_eq(mp_ipc_import(dev, &h, &q), MP_OK, "%s", mp_last_error());
  mp_status_t st = ipc_close_in_host_fn(dev, q);
  cr_expect_eq(st, MP_EINVAL, "a close from a host function: %d", st);
  /* Nothing changed: still mapped, still leased (the exporter must not
   * reuse the block), and a later close does it. */
  cr_expect(fd_open(lease), "a failed close let the exporter reuse the block");
  ipc_fill(dev, q, 3 * MiB, 5);
  ipc_expect(dev, p, 3 * MiB, 5);
  cr_expect_eq(mp_ipc_close(dev, q), MP_OK,
               "the import was dropped by the failed close: %s",
               mp_last_error());
  cr_expect(!fd_open(lease), "close keeps the lease open");
  free_released_and_destroy(pool, p);
}

Test(pool_ipc_args, a_socket_that_carries_no_handle_is_eio) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  mp_ipc_handle_t h;
  cr_assert_eq(write(sv[0], "not a handle", 12), 12);
  shutdown(sv[0], SHUT_WR);
  cr_expect_eq(mp_ipc_recv(sv[1], &h), MP_EIO);
  cr_expect_eq(mp_ipc_recv(sv[1], &h), MP_EIO, "peer gone");
  cr_expect_eq(mp_ipc_recv(sv[1], NULL), MP_EINVAL);
  /* A bad socket: MP_EIO, for a handle that holds its descriptors (one
   * without them is MP_EINVAL before the socket is tried). */
  h = (mp_ipc_handle_t){.kind = MP_IPC_FD, .fd = sv[0], .lease_fd = sv[0]};
  cr_expect_eq(mp_ipc_send(-1, &h), MP_EIO);
  cr_expect_eq(mp_ipc_send(sv[1], NULL), MP_EINVAL);
  cr_expect_eq(mp_ipc_handle_close(NULL), MP_EINVAL);
  close(sv[0]);
  close(sv[1]);
}

/* A handle zeroed by the program (as before an export that failed and left
 * it untouched) is empty: closing it closed descriptor 0 (the program's,
 * often its stdin), and sending it handed descriptor 0 to the peer as a
 * lease. A handle of an unknown kind is refused, and a CUDA handle has no
 * memory descriptor to close. */
Test(pool_ipc_args, an_empty_handle_closes_and_sends_nothing) {
  if (!fd_open(0))
    cr_assert_eq(open("/dev/null", O_RDONLY), 0);
  mp_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  cr_expect_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
  cr_expect(fd_open(0), "closing an empty handle closed descriptor 0");
  cr_expect(h.kind == 0 && h.fd == -1 && h.lease_fd == -1);
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  memset(&h, 0, sizeof h);
  cr_expect_eq(mp_ipc_send(sv[0], &h), MP_EINVAL);
  char byte;
  cr_expect_eq(read(sv[1], &byte, 1), -1, "an empty handle was sent");
  h.kind = 7;
  cr_expect_eq(mp_ipc_send(sv[0], &h), MP_EINVAL);
  cr_expect_eq(mp_ipc_handle_close(&h), MP_EINVAL);
  cr_expect(fd_open(0), "closing a handle of an unknown kind closed fd 0");
  h = (mp_ipc_handle_t){.kind = MP_IPC_CUDA, .fd = 0, .lease_fd = -1};
  cr_expect_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect(fd_open(0), "a CUDA handle's fd field was closed");
  close(sv[0]);
  close(sv[1]);
}

/* A handle its import took the descriptors of (or one missing its memory
 * descriptor) is refused by mp_ipc_send, which sends nothing: the peer
 * would get a handle no import accepts. Before, it was sent, and only the
 * peer's import failed. */
Test(pool_ipc_args, a_handle_without_its_descriptors_is_not_sent) {
  mp_pool_t *pool = make_pool(dev, "segment_bytes=32M");
  void *p, *q = NULL;
  mp_ipc_handle_t h = exported(pool, &p);
  mp_ipc_handle_t no_memory = h;
  no_memory.fd = -1;
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
  char byte;
  if (h.kind == MP_IPC_FD) {
    cr_expect_eq(mp_ipc_send(sv[0], &no_memory), MP_EINVAL);
    cr_expect(strstr(mp_last_error(), "no memory descriptor") != NULL, "%s",
              mp_last_error());
    cr_expect_eq(read(sv[1], &byte, 1), -1, "a handle was sent");
  }
  cr_assert_eq(mp_ipc_import(dev, &h, &q), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_ipc_send(sv[0], &h), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "no lease descriptor") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(read(sv[1], &byte, 1), -1, "an imported handle was sent");
  close(sv[0]);
  close(sv[1]);
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  free_released_and_destroy(pool, p);
}

/* One frame for both receives, so the failed one finds the first one's
 * control buffer on the stack, as a caller's loop would. */
__attribute__((noinline)) static mp_status_t receive(int sock,
                                                     mp_ipc_handle_t *h) {
  return mp_ipc_recv(sock, h);
}

/* A receive that fails (a bad socket) touches no descriptor: it walked
 * the control buffer it never received into and closed the descriptors
 * an earlier receive had handed to the caller. */
Test(pool_ipc_args, a_failed_receive_closes_no_descriptor) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p;
  mp_ipc_handle_t good = exported(pool, &p), got, junk;
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cr_assert_eq(mp_ipc_send(sv[0], &good), MP_OK, "%s", mp_last_error());
  cr_assert_eq(receive(sv[1], &got), MP_OK, "%s", mp_last_error());
  cr_assert_eq(receive(-1, &junk), MP_EIO);
  cr_expect(fd_open(got.fd) && fd_open(got.lease_fd),
            "a failed receive closed the descriptors of an earlier one");
  cr_expect_eq(mp_ipc_handle_close(&got), MP_OK);
  cr_expect_eq(mp_ipc_handle_close(&good), MP_OK);
  close(sv[0]);
  close(sv[1]);
  free_released_and_destroy(pool, p);
}

/* Sends h's bytes with n descriptors attached (SCM_RIGHTS), as a peer
 * that is not mp_ipc_send may. */
static void send_raw(int sock, const mp_ipc_handle_t *h, const int *fds,
                     size_t n) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(4 * sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)h, .iov_len = sizeof *h};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = CMSG_SPACE(n * sizeof(int))};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(n * sizeof(int));
  memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  cr_assert_eq(sendmsg(sock, &msg, 0), (ssize_t)sizeof *h);
}

/* Whether every copy of the pipe whose read end is rd was closed: it reads
 * EOF (rd non-blocking). */
static bool write_ends_closed(int rd) {
  char byte;
  return read(rd, &byte, 1) == 0;
}

/* A message whose handle is empty (kind 0) or of an unknown kind but
 * carries a descriptor as its lease: not one mp_ipc_send sends (it refuses
 * those), so MP_EIO with the descriptor closed. It was received as a
 * handle holding that descriptor, which mp_ipc_handle_close then left open
 * (an empty handle holds none; an unknown kind is refused): a leak per
 * message a peer chose to send. Seen through a pipe's write end travelling
 * as the lease: its read end reads EOF once no copy is left. */
Test(pool_ipc_args, a_message_of_no_handle_kind_is_eio_and_closes_its_fds) {
  unsigned kinds[] = {0, 99};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    int sv[2], pfd[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(pipe2(pfd, O_NONBLOCK), 0);
    mp_ipc_handle_t h = {.kind = kinds[k], .fd = -1, .lease_fd = 5};
    send_raw(sv[0], &h, &pfd[1], 1);
    close(pfd[1]);
    mp_ipc_handle_t got = {.kind = 0, .fd = -1, .lease_fd = -1};
    cr_expect_eq(mp_ipc_recv(sv[1], &got), MP_EIO, "kind %u", kinds[k]);
    (void)mp_ipc_handle_close(&got);
    cr_expect(write_ends_closed(pfd[0]),
              "kind %u: the received descriptor is still open", kinds[k]);
    close(pfd[0]);
    close(sv[0]);
    close(sv[1]);
  }
}

/* A message whose backend name is not a string (no terminating 0 in its
 * 16 bytes): not a handle mp_ipc_send sends (the export writes the name
 * with snprintf), so MP_EIO with its descriptors closed, rather than a
 * handle whose backend a program printing it reads past. */
Test(pool_ipc_args, a_message_whose_backend_is_no_string_is_eio) {
  int sv[2], pfd[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cr_assert_eq(pipe2(pfd, O_NONBLOCK), 0);
  mp_ipc_handle_t h = {.kind = MP_IPC_FD, .fd = 3, .lease_fd = 4};
  memset(h.backend, 'x', sizeof h.backend);
  int out[2] = {pfd[1], pfd[1]};
  send_raw(sv[0], &h, out, 2);
  close(pfd[1]);
  mp_ipc_handle_t got = {.kind = 0, .fd = -1, .lease_fd = -1};
  cr_expect_eq(mp_ipc_recv(sv[1], &got), MP_EIO);
  (void)mp_ipc_handle_close(&got);
  cr_expect(write_ends_closed(pfd[0]), "a received descriptor is still open");
  close(pfd[0]);
  close(sv[0]);
  close(sv[1]);
}

/* A message with more descriptors than its handle names (three, or four,
 * for a handle naming two): MP_EIO, every one of them closed. */
Test(pool_ipc_args, a_message_with_more_descriptors_than_its_handle_is_eio) {
  for (size_t n = 3; n <= 4; n++) {
    int sv[2], pfd[2], out[4];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(pipe2(pfd, O_NONBLOCK), 0);
    for (size_t i = 0; i < n; i++)
      out[i] = pfd[1];
    mp_ipc_handle_t h = {.kind = MP_IPC_FD, .fd = 3, .lease_fd = 4};
    send_raw(sv[0], &h, out, n);
    close(pfd[1]);
    mp_ipc_handle_t got = {.kind = 0, .fd = -1, .lease_fd = -1};
    cr_expect_eq(mp_ipc_recv(sv[1], &got), MP_EIO, "%zu descriptors", n);
    (void)mp_ipc_handle_close(&got);
    cr_expect(write_ends_closed(pfd[0]),
              "%zu descriptors: a received one is still open", n);
    close(pfd[0]);
    close(sv[0]);
    close(sv[1]);
  }
}

/* How many descriptors the process has open. */
static size_t open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A live block exported again and again (to one short-lived importer after
 * another), each handle closed: the leases its importers let go do not
 * pile up. Export never looked at the old ones, so each export kept one
 * descriptor more until the block was freed or the pool polled or trimmed:
 * a program that re-exports a block it keeps ran out of descriptors
 * (MP_EIO, "cannot make a lease"). */
Test(pool_ipc_args, exports_of_a_live_block_reap_the_leases_let_go) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p;
  mp_ipc_handle_t h = exported(pool, &p);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  size_t before = open_fds();
  for (int i = 0; i < 100; i++) {
    cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  }
  cr_expect_leq(open_fds(), before + 1,
                "%zu descriptors open after 100 exports, %zu before",
                open_fds(), before);
  check(pool);
  free_released_and_destroy(pool, p);
}

/* A socket that also receives its peer's credentials (SO_PASSCRED, as a
 * server that checks who sent what sets): the handle comes through with
 * its descriptors. The credentials did not fit the control buffer, sized
 * for two descriptors, so every receive was MP_EIO (MSG_CTRUNC). */
Test(pool_ipc_args, a_socket_passing_credentials_receives_handles) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p, *q;
  mp_ipc_handle_t good = exported(pool, &p), got;
  int sv[2], on = 1;
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cr_assert_eq(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
  cr_assert_eq(mp_ipc_send(sv[0], &good), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_recv(sv[1], &got), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&good), MP_OK);
  cr_assert_eq(mp_ipc_import(dev, &got, &q), MP_OK, "%s", mp_last_error());
  ipc_fill(dev, q, 3 * MiB, 5);
  ipc_expect(dev, p, 3 * MiB, 5);
  cr_assert_eq(mp_ipc_close(dev, q), MP_OK, "%s", mp_last_error());
  close(sv[0]);
  close(sv[1]);
  free_released_and_destroy(pool, p);
}

#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76 /* Linux 6.5, asm-generic/socket.h */
#endif

/* A socket that also receives its peer's pidfd (SO_PASSPIDFD, Linux 6.5):
 * the kernel installs one more descriptor with every message, which the
 * caller never sees (mp_ipc_recv hands out only the handle): the receive
 * closes it. It was left open, one descriptor per receive. Skipped where
 * the kernel has no such option. */
Test(pool_ipc_args, a_socket_passing_pidfds_leaves_none_open) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p;
  mp_ipc_handle_t good = exported(pool, &p), got;
  int sv[2], on = 1;
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  if (setsockopt(sv[1], SOL_SOCKET, SO_PASSPIDFD, &on, sizeof on) != 0)
    cr_skip_test("no SO_PASSPIDFD on this kernel");
  size_t before = open_fds();
  cr_assert_eq(mp_ipc_send(sv[0], &good), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_recv(sv[1], &got), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&got), MP_OK);
  cr_expect_eq(open_fds(), before, "%zu descriptors open after, %zu before",
               open_fds(), before);
  cr_assert_eq(mp_ipc_handle_close(&good), MP_OK);
  close(sv[0]);
  close(sv[1]);
  free_released_and_destroy(pool, p);
}

/* Two threads importing at once while the process's list of imports has
 * one free slot: both imports succeed. Each looked for room, mapped
 * without the lock, then took the slot; the second found it taken and was
 * MP_ENOMEM "out of host memory" (3 runs in 4), where the list grows. Tried
 * at the capacities 8, 16, 32 and 64 (one slot free at each). */
static mp_device_t *racing_dev;
static pthread_barrier_t racing;

typedef struct import_job {
  mp_ipc_handle_t h;
  void *q;
  mp_status_t st;
} import_job_t;

static void *import_racing(void *arg) {
  import_job_t *j = arg;
  pthread_barrier_wait(&racing);
  j->st = mp_ipc_import(racing_dev, &j->h, &j->q);
  return NULL;
}

Test(pool_ipc_args, two_imports_at_once_at_the_lists_capacity_both_succeed) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p;
  mp_ipc_handle_t h = exported(pool, &p);
  mp_ipc_handle_close(&h);
  racing_dev = dev;
  cr_assert_eq(pthread_barrier_init(&racing, NULL, 2), 0);
  enum { MAX_OPEN = 64 };
  void *open_q[MAX_OPEN];
  size_t nopen = 0;
  for (size_t cap = 8; cap <= MAX_OPEN; cap *= 2) {
    while (nopen < cap - 1) { /* one slot left */
      cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s",
                   mp_last_error());
      cr_assert_eq(mp_ipc_import(dev, &h, &open_q[nopen++]), MP_OK, "%s",
                   mp_last_error());
    }
    import_job_t j[2];
    memset(j, 0, sizeof j);
    for (int k = 0; k < 2; k++)
      cr_assert_eq(mp_pool_ipc_export(pool, p, &j[k].h), MP_OK, "%s",
                   mp_last_error());
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
      cr_assert_eq(pthread_create(&t[k], NULL, import_racing, &j[k]), 0);
    for (int k = 0; k < 2; k++)
      pthread_join(t[k], NULL);
    for (int k = 0; k < 2; k++) {
      cr_expect_eq(j[k].st, MP_OK, "capacity %zu: import %d: %s", cap, k,
                   mp_status_string(j[k].st));
      if (j[k].st != MP_OK)
        mp_ipc_handle_close(&j[k].h);
      else if (nopen < MAX_OPEN)
        open_q[nopen++] = j[k].q;
      else
        cr_assert_eq(mp_ipc_close(dev, j[k].q), MP_OK);
    }
  }
  for (size_t i = 0; i < nopen; i++)
    cr_assert_eq(mp_ipc_close(dev, open_q[i]), MP_OK, "%s", mp_last_error());
  pthread_barrier_destroy(&racing);
  free_released_and_destroy(pool, p);
}

/* A block freed while imported, whose importer then let go unnoticed (no
 * poll, no allocation since): what the next allocation of each kind
 * needs. opts: the pool; kind 0 mp_pool_alloc_contiguous, 1
 * mp_pool_create_child. Before, without arenas or with, the pieces failed
 * (MP_ENOMEM): their path never closed the leases, and the device had no
 * room beside the held block. */
static void released_block_serves(const char *opts, int kind) {
  mp_device_t *d;
  cr_assert_eq(mp_device_open("host:capacity=64M", &d), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = make_pool(d, opts);
  void *p;
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(pool, 48 * MiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK); /* the importer's end */
  cr_expect_eq(stats(pool).allocated_bytes, 48 * MiB, "held");
  mp_status_t st;
  void *pieces[2] = {NULL, NULL};
  mp_pool_t *child = NULL;
  if (kind == 0) {
    size_t sizes[2] = {24 * MiB, 24 * MiB};
    st = mp_pool_alloc_contiguous(pool, 2, sizes, NULL, pieces);
  } else {
    st = mp_pool_create_child(pool, 48 * MiB, &child);
  }
  cr_expect_eq(st, MP_OK, "%s, %s: %s", opts, kind == 0 ? "pieces" : "child",
               mp_last_error());
  size_t held = 1;
  cr_expect_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.oom_count, 0, "%s", opts);
  cr_expect_leq(s.reserved_bytes, 64 * MiB, "%s", opts);
  if (st == MP_OK && kind == 0)
    for (int i = 0; i < 2; i++)
      cr_assert_eq(mp_pool_free(pool, pieces[i]), MP_OK);
  if (st == MP_OK && kind == 1)
    cr_assert_eq(mp_pool_destroy(child), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(d);
}

Test(pool_ipc, a_released_block_serves_contiguous_pieces_without_arenas) {
  released_block_serves("arenas=0", 0);
}

Test(pool_ipc, a_released_block_serves_contiguous_pieces_with_arenas) {
  released_block_serves("arenas=2", 0);
}

Test(pool_ipc, a_released_block_serves_a_child_with_or_without_arenas) {
  released_block_serves("arenas=0", 1);
  released_block_serves("arenas=2", 1);
}

/* A pool on a device of its own (*d) whose 4 MiB block *b, filled with
 * tag, is exported, imported by this process (*q, mp_ipc_import) and then
 * freed: held while the import is open. */
static mp_pool_t *held_by_an_import(const char *opts, int tag, mp_device_t **d,
                                    void **b, void **q) {
  cr_assert_eq(mp_device_open("host:capacity=64M", d), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = make_pool(*d, opts);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, b), MP_OK);
  memset(*b, tag, 4 * MiB);
  cr_assert_eq(mp_pool_ipc_export(pool, *b, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_import(*d, &h, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, *b), MP_OK, "%s", mp_last_error());
  return pool;
}

/* Whether the first and last 4 KiB at q hold tag. */
static bool import_holds(const void *q, int tag) {
  unsigned char want[4096];
  memset(want, tag, sizeof want);
  return memcmp(q, want, sizeof want) == 0 &&
         memcmp((const char *)q + 4 * MiB - sizeof want, want, sizeof want) ==
             0;
}

/* The release order of a block freed while imported: the importer unmaps
 * it (mp_ipc_close), then closes its lease; the pool then frees the block
 * (once: free_count moves by one, a second poll or trim changes nothing),
 * and only then can a trim give its memory back. A trim while the import
 * is open gives nothing of it back: the import still reads what the block
 * held. opts: virtual chunks (NULL), plain segments, arenas. */
static void held_block_release_order(const char *opts) {
  mp_device_t *d;
  void *b, *q;
  mp_pool_t *pool = held_by_an_import(opts, 0x5a, &d, &b, &q);
  mp_stats_t held = stats(pool);
  cr_expect_eq(held.allocated_bytes, 4 * MiB, "%s: held", opts);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.reserved_bytes, held.reserved_bytes, "%s: trimmed", opts);
  cr_expect_eq(s.free_count, held.free_count, "%s", opts);
  cr_expect(import_holds(q, 0x5a), "%s: the import lost its memory", opts);
  size_t n = 0;
  cr_assert_eq(mp_pool_ipc_poll(pool, &n), MP_OK);
  cr_expect_eq(n, 1, "%s", opts);
  cr_assert_eq(mp_ipc_close(d, q), MP_OK, "%s", mp_last_error());
  for (int again = 0; again < 2; again++) {
    cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_ipc_poll(pool, &n), MP_OK);
    s = stats(pool);
    cr_expect_eq(n, 0, "%s", opts);
    cr_expect_eq(s.allocated_bytes, 0, "%s", opts);
    cr_expect_eq(s.reserved_bytes, 0, "%s: given back", opts);
    cr_expect_eq(s.free_count, held.free_count + 1, "%s: freed once", opts);
    check(pool);
  }
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(d);
}

Test(pool_ipc, a_held_virtual_block_goes_back_once_after_the_importer_unmaps) {
  held_block_release_order(NULL);
}

Test(pool_ipc, a_held_plain_block_goes_back_once_after_the_importer_unmaps) {
  held_block_release_order("virtual=0");
}

Test(pool_ipc,
     a_held_block_of_an_arena_goes_back_once_after_the_importer_unmaps) {
  held_block_release_order("arenas=2");
}

/* A pool destroyed while its freed virtual block is still imported (held):
 * the destroy goes (the importer holds its own reference to the memory),
 * the import still reads the block, and its close after the pool is gone
 * is clean. */
Test(pool_ipc, a_destroy_with_a_held_virtual_block_leaves_the_import_whole) {
  mp_device_t *d;
  void *b, *q;
  mp_pool_t *pool = held_by_an_import(NULL, 0x3c, &d, &b, &q);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect(import_holds(q, 0x3c));
  cr_assert_eq(mp_ipc_close(d, q), MP_OK, "%s", mp_last_error());
  mp_device_close(d);
}
