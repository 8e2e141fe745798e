/* ipc_helpers.h - the IPC scenario shared by the host, fake-driver and GPU
 * tests: a forked child (the importer) opens its own device, receives a
 * handle over a Unix socket, checks what the parent (the exporter) wrote,
 * writes its own pattern and closes the import; the parent reads what the
 * child wrote. Device memory is read and written through device copies
 * only, so the same code holds on a GPU.
 *
 * The child speaks in bytes on the socket: 'I' imported, 'D' done (import
 * closed); it waits for 'G' before closing when asked to. Its exit status
 * says which step failed (0: none). It is a fresh process (ipc_importer,
 * started by fork and exec, MP_IPC_IMPORTER its path), as an importer is:
 * nothing of the parent's driver or threads (TSan refuses threads started
 * in a forked copy of a threaded process). */
#ifndef MEMPOOL_TEST_IPC_HELPERS_H
#define MEMPOOL_TEST_IPC_HELPERS_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "device_helpers.h"
#include "ipc_child.h"

static inline void ipc_wait_child(pid_t pid) {
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the importer died (status %d)", status);
  cr_assert_eq(WEXITSTATUS(status), 0,
               "the importer failed at step %d (see ipc_child)",
               WEXITSTATUS(status));
}

/* Writes the parent's pattern into [p, p + n) through dev. */
static inline void ipc_fill(mp_device_t *dev, void *p, size_t n, unsigned tag) {
  unsigned char *buf = malloc(n);
  cr_assert_not_null(buf);
  ipc_pattern(buf, n, tag);
  cr_assert(ipc_copy(dev, p, buf, n), "%s", mp_last_error());
  free(buf);
}

/* Asserts that [p, p + n) holds tag's pattern. */
static inline void ipc_expect(mp_device_t *dev, const void *p, size_t n,
                              unsigned tag) {
  unsigned char *buf = malloc(n);
  cr_assert_not_null(buf);
  cr_assert(ipc_copy(dev, buf, p, n), "%s", mp_last_error());
  size_t at = ipc_mismatch(buf, n, tag);
  free(buf);
  cr_assert_eq(at, n, "byte %zu of %zu is not what was written", at, n);
}

/* mp_ipc_close(dev, ptr) called by a host function on a new stream of
 * dev (a call that may not wait for the device): its status. */
typedef struct {
  mp_device_t *dev;
  void *ptr;
  mp_status_t st;
} ipc_close_call_t;

static inline void ipc_close_call(void *arg) {
  ipc_close_call_t *c = arg;
  c->st = mp_ipc_close(c->dev, c->ptr);
}

static inline mp_status_t ipc_close_in_host_fn(mp_device_t *dev, void *ptr) {
  ipc_close_call_t c = {.dev = dev, .ptr = ptr, .st = MP_OK};
  run_in_host_fn(dev, ipc_close_call, &c);
  return c.st;
}

#ifdef MP_IPC_IMPORTER /* tests that start the importer (CMake:                \
                          mempool_ipc_test) */

/* Forks the importer; *sock is the parent's end. */
static inline pid_t ipc_fork_child(const char *spec, ipc_child_mode_t mode,
                                   int *sock) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  char fd[16], how[16];
  snprintf(fd, sizeof fd, "%d", sv[1]);
  snprintf(how, sizeof how, "%d", (int)mode);
  pid_t pid = fork();
  cr_assert_geq(pid, 0, "fork failed");
  if (pid == 0) {
    (void)fcntl(sv[1], F_SETFD, 0); /* the importer's end survives exec */
    execl(MP_IPC_IMPORTER, "ipc_importer", fd, spec, how, (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  *sock = sv[0];
  return pid;
}

/* The exporter's device (spec) and a pool on it made from pool_opts (NULL:
 * the defaults). */
static inline mp_pool_t *ipc_open_pool(const char *spec, const char *pool_opts,
                                       mp_device_t **dev) {
  *dev = NULL;
  cr_assert_eq(mp_device_open(spec, dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (pool_opts != NULL)
    cr_assert_eq(mp_pool_config_parse(&cfg, pool_opts), MP_OK);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(*dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  return pool;
}

/* The whole round trip on spec, with a pool made from pool_opts: a block
 * at a nonzero offset of its device allocation goes to the child, which
 * writes it; the parent reads what the child wrote. */
static inline void ipc_round_trip_as(const char *spec, const char *pool_opts,
                                     ipc_child_mode_t mode) {
  int sock;
  pid_t pid = ipc_fork_child(spec, mode, &sock);
  mp_device_t *dev;
  mp_pool_t *pool = ipc_open_pool(spec, pool_opts, &dev);
  void *before, *p;
  const size_t n = ((size_t)1 << 19) + 4096 + 512; /* shares a segment */
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &before), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, n, NULL, &p), MP_OK, "%s", mp_last_error());
  ipc_fill(dev, p, n, IPC_PARENT_TAG);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, p, &h), MP_OK, "%s", mp_last_error());
  cr_expect_eq(h.bytes, n);
  cr_expect_gt(h.offset, 0, "the block should not start its allocation");
  cr_assert_eq(mp_ipc_send(sock, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  bool done = ipc_get(sock, 'I') && ipc_get(sock, 'D');
  ipc_wait_child(pid); /* its status says where it stopped */
  cr_assert(done, "the importer did not finish");
  ipc_expect(dev, p, n, IPC_CHILD_TAG);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, before), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
  close(sock);
}

static inline void ipc_round_trip(const char *spec, const char *pool_opts) {
  ipc_round_trip_as(spec, pool_opts, IPC_CHILD_CLOSE);
}

#define IPC_MiB ((size_t)1 << 20)

static inline mp_stats_t ipc_stats(mp_pool_t *p) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(p, &s), MP_OK);
  return s;
}

/* The parent exports b, frees it while the child still imports it, and
 * checks that the pool does not hand it out again until the child lets go
 * (by mp_ipc_close, or by exiting without it). */
static inline void ipc_held_until_released(const char *spec,
                                           ipc_child_mode_t mode) {
  int sock;
  pid_t pid = ipc_fork_child(spec, mode, &sock);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *b, *spacer, *other;
  cr_assert_eq(mp_pool_alloc(pool, IPC_MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &spacer), MP_OK);
  ipc_fill(dev, b, IPC_MiB, IPC_PARENT_TAG);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, b, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_send(sock, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert(ipc_get(sock, 'I'), "the importer did not import");

  mp_stats_t live = ipc_stats(pool);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  size_t held = 0;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 1);
  cr_expect_eq(ipc_stats(pool).allocated_bytes, live.allocated_bytes,
               "a held block still counts as allocated");
  cr_expect_eq(mp_pool_free(pool, b), MP_EINVAL, "a held block is freed");
  cr_expect_eq(mp_pool_ipc_export(pool, b, &h), MP_EINVAL);
  cr_assert_eq(mp_pool_alloc(pool, IPC_MiB, NULL, &other), MP_OK);
  cr_expect_neq(other, b, "a block imported elsewhere was handed out again");
  cr_expect_eq(mp_pool_pause(pool, 0), MP_EBUSY,
               "pause while a block is imported elsewhere");
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, other), MP_OK);

  cr_assert(ipc_put(sock, 'G'));
  if (mode == IPC_CHILD_WAIT_CLOSE)
    cr_assert(ipc_get(sock, 'D'), "the importer did not finish");
  ipc_wait_child(pid);
  ipc_expect(dev, b, IPC_MiB, IPC_CHILD_TAG);
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
  cr_expect_eq(held, 0);
  cr_expect_eq(ipc_stats(pool).allocated_bytes, live.allocated_bytes - IPC_MiB);
  /* Free again: the same size comes back at the same (lowest, exact) place. */
  cr_assert_eq(mp_pool_alloc(pool, IPC_MiB, NULL, &other), MP_OK);
  cr_expect_eq(other, b);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
  close(sock);
}

/* The parent destroys its pool while the child still imports a block of
 * it, live and then freed (held). A plain segment's block (pool_opts
 * "virtual=0"): destroy is MP_EBUSY with a message that names the block,
 * and changes nothing (the pool still checks, allocates and frees, its
 * figures as they were), until the child closes its import; then it
 * succeeds. cuMemFree of the segment before the importer's
 * cuIpcCloseMemHandle would be undefined (cuda.h, cuIpcOpenMemHandle).
 * A virtual chunk's block (pool_opts NULL): destroy succeeds at once (the
 * importer holds its own reference to the memory), and the child still
 * closes its import after it. */
static inline void ipc_destroy_while_imported(const char *spec,
                                              const char *pool_opts) {
  bool plain = pool_opts != NULL;
  int sock;
  pid_t pid = ipc_fork_child(spec, IPC_CHILD_WAIT_CLOSE, &sock);
  mp_device_t *dev;
  mp_pool_t *pool = ipc_open_pool(spec, pool_opts, &dev);
  void *b, *spacer, *other;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &spacer), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, IPC_MiB, NULL, &b), MP_OK);
  ipc_fill(dev, b, IPC_MiB, IPC_PARENT_TAG);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, b, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_send(sock, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert(ipc_get(sock, 'I'), "the importer did not import");

  if (!plain) {
    cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  } else {
    char addr[32];
    snprintf(addr, sizeof addr, "%p", b);
    mp_stats_t before = ipc_stats(pool);
    for (int freed = 0; freed < 2; freed++) {
      if (freed)
        cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
      before = ipc_stats(pool);
      cr_assert_eq(mp_pool_destroy(pool), MP_EBUSY,
                   "destroy freed a plain segment another process imports "
                   "(block %s)",
                   freed ? "freed, held" : "live");
      const char *msg = mp_last_error();
      cr_expect(strstr(msg, addr) != NULL && strstr(msg, "imported") != NULL,
                "the message should name block %s and say it is imported: "
                "'%s'",
                addr, msg);
      /* Nothing changed: the pool still works, its figures as they were. */
      cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
      mp_stats_t after = ipc_stats(pool);
      cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
      cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
      cr_expect_eq(after.live_blocks, before.live_blocks);
      cr_expect_eq(after.segment_count, before.segment_count);
      cr_assert_eq(mp_pool_alloc(pool, 8192, NULL, &other), MP_OK, "%s",
                   mp_last_error());
      cr_expect_neq(other, b);
      cr_assert_eq(mp_pool_free(pool, other), MP_OK);
    }
    size_t held = 0;
    cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK);
    cr_expect_eq(held, 1);
  }

  cr_assert(ipc_put(sock, 'G'));
  cr_assert(ipc_get(sock, 'D'), "the importer did not finish");
  ipc_wait_child(pid);
  if (plain) {
    /* The importer let go: the held block goes at destroy's poll. */
    cr_assert_eq(mp_pool_free(pool, spacer), MP_OK);
    cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  }
  mp_device_close(dev);
  close(sock);
}

#endif /* MP_IPC_IMPORTER */

#endif /* MEMPOOL_TEST_IPC_HELPERS_H */
