/* ipc_child.h - the importer's side of the IPC tests (ipc_helpers.h),
 * shared by the tests and by ipc_importer, the program the tests start as
 * the importing process. No Criterion here: the importer reports through
 * its exit status. */
#ifndef MEMPOOL_TEST_IPC_CHILD_H
#define MEMPOOL_TEST_IPC_CHILD_H

#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mempool/mempool.h>

enum { IPC_PARENT_TAG = 0x5a, IPC_CHILD_TAG = 0xa5 };

typedef enum ipc_child_mode {
  IPC_CHILD_CLOSE,      /* import, write, close, report */
  IPC_CHILD_WAIT_CLOSE, /* as CLOSE, but wait for 'G' before closing */
  IPC_CHILD_WAIT_EXIT,  /* wait for 'G', then exit without closing */
  IPC_CHILD_FORGED,     /* as CLOSE, after a copy of the handle that
                           claims more memory (its block past the real
                           allocation's end) was refused, h left as it
                           was */
  IPC_CHILD_FORGED_FD,  /* as CLOSE, after a copy of a CUDA IPC handle
                           (which carries no descriptor) naming one of the
                           importer's own descriptors was refused and left
                           that descriptor open */
  IPC_CHILD_TWO_BLOCKS, /* imports two handles of blocks of one plain
                           segment, sent in turn: each reads the parent's
                           pattern at the exporter's distance; the first
                           closed, the second still reads and writes; then
                           closed (ipc_child_two) */
  IPC_CHILD_STALE_LEASE /* receives two handles of blocks of one plain
                           segment; a copy of the first whose lease number
                           is the second's (a stale copy, its number given
                           out again) is refused, the second's lease left
                           open; then both import and close
                           (ipc_child_stale_lease) */
} ipc_child_mode_t;

static inline unsigned char ipc_byte(size_t i, unsigned tag) {
  return (unsigned char)(i * 7 + (i >> 12) + tag);
}

/* Host buffer <-> device memory, through the device's NULL stream. */
static inline bool ipc_copy(mp_device_t *d, void *dst, const void *src,
                            size_t n) {
  return mp_memcpy_async(d, dst, src, n, NULL) == MP_OK &&
         mp_stream_synchronize(d, NULL) == MP_OK;
}

static inline void ipc_pattern(unsigned char *buf, size_t n, unsigned tag) {
  for (size_t i = 0; i < n; i++)
    buf[i] = ipc_byte(i, tag);
}

static inline size_t ipc_mismatch(const unsigned char *buf, size_t n,
                                  unsigned tag) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != ipc_byte(i, tag))
      return i;
  return n;
}

static inline bool ipc_put(int sock, char c) {
  return send(sock, &c, 1, MSG_NOSIGNAL) == 1;
}

static inline bool ipc_get(int sock, char want) {
  char c = 0;
  return recv(sock, &c, 1, MSG_WAITALL) == 1 && c == want;
}

/* Reads [p, p + n) and checks it holds tag's pattern. */
static inline bool ipc_holds(mp_device_t *d, const void *p, size_t n,
                             unsigned tag) {
  unsigned char *buf = malloc(n);
  bool ok =
      buf != NULL && ipc_copy(d, buf, p, n) && ipc_mismatch(buf, n, tag) == n;
  free(buf);
  return ok;
}

/* IPC_CHILD_TWO_BLOCKS. A CUDA IPC handle names a block's whole device
 * allocation, and one opened again in a context is counted and gives "the
 * existing device pointer" (cuda.h, cuIpcOpenMemHandle): the two imports
 * share one mapping, which the first close must leave to the second
 * ("When the reference count reaches 0, this API unmaps the memory",
 * cuIpcCloseMemHandle). */
static inline int ipc_child_two(int sock, mp_device_t *d) {
  mp_ipc_handle_t h[2];
  void *p[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    if (mp_ipc_recv(sock, &h[k]) != MP_OK ||
        mp_ipc_import(d, &h[k], &p[k]) != MP_OK)
      return 30 + k;
  if ((uintptr_t)p[1] - h[1].offset != (uintptr_t)p[0] - h[0].offset)
    return 32; /* not one mapping of the segment */
  for (int k = 0; k < 2; k++)
    if (!ipc_holds(d, p[k], h[k].bytes, IPC_PARENT_TAG))
      return 33 + k;
  if (mp_ipc_close(d, p[0]) != MP_OK)
    return 35;
  if (!ipc_holds(d, p[1], h[1].bytes, IPC_PARENT_TAG))
    return 36; /* the first close unmapped the second's memory */
  unsigned char *buf = malloc(h[1].bytes);
  if (buf == NULL)
    return 37;
  ipc_pattern(buf, h[1].bytes, IPC_CHILD_TAG);
  bool wrote = ipc_copy(d, p[1], buf, h[1].bytes);
  free(buf);
  if (!wrote)
    return 38;
  if (mp_ipc_close(d, p[1]) != MP_OK)
    return 39;
  if (!ipc_put(sock, 'D'))
    return 19;
  mp_device_close(d);
  return 0;
}

/* IPC_CHILD_STALE_LEASE. A plain segment's handle carries no memory
 * descriptor: its lease is the only descriptor that tells two handles of
 * the segment apart. A copy of the first handle kept after its lease was
 * closed, whose number the second handle's lease got (dup stands for the
 * reused number), must not import: it would map the first block under
 * the second block's lease, and the exporter, whose first lease is gone,
 * may reuse the first block meanwhile. */
static inline int ipc_child_stale_lease(int sock, mp_device_t *d) {
  mp_ipc_handle_t h[2];
  void *p[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    if (mp_ipc_recv(sock, &h[k]) != MP_OK)
      return 40 + k;
  mp_ipc_handle_t stale = h[0];
  stale.lease_fd = dup(h[1].lease_fd);
  if (stale.lease_fd < 0)
    return 42;
  int lease = stale.lease_fd;
  void *q = NULL;
  mp_status_t st = mp_ipc_import(d, &stale, &q);
  if (st == MP_OK) {
    (void)mp_ipc_close(d, q);
    return 43; /* the first block mapped under the second's lease */
  }
  if (st != MP_EINVAL || strstr(mp_last_error(), "stale") == NULL)
    return 44;
  if (stale.lease_fd != lease || fcntl(lease, F_GETFD) == -1)
    return 45; /* the refusal changed the handle or closed the lease */
  close(lease);
  for (int k = 0; k < 2; k++)
    if (mp_ipc_import(d, &h[k], &p[k]) != MP_OK)
      return 46 + k;
  for (int k = 0; k < 2; k++)
    if (mp_ipc_close(d, p[k]) != MP_OK)
      return 48 + k;
  if (!ipc_put(sock, 'D'))
    return 19;
  mp_device_close(d);
  return 0;
}

/* The importer's life; returns its exit status. */
static inline int ipc_child(int sock, const char *spec, ipc_child_mode_t mode) {
  mp_device_t *d = NULL;
  if (mp_device_open(spec, &d) != MP_OK)
    return 10;
  if (mode == IPC_CHILD_TWO_BLOCKS)
    return ipc_child_two(sock, d);
  if (mode == IPC_CHILD_STALE_LEASE)
    return ipc_child_stale_lease(sock, d);
  mp_ipc_handle_t h;
  void *p = NULL;
  if (mp_ipc_recv(sock, &h) != MP_OK)
    return 11;
  if (mode == IPC_CHILD_FORGED) {
    mp_ipc_handle_t f = h;
    f.mem_bytes = h.mem_bytes + ((size_t)1 << 30);
    f.offset = f.mem_bytes - h.bytes;
    if (mp_ipc_import(d, &f, &p) != MP_EINVAL)
      return 20;
    if (f.fd != h.fd || f.lease_fd != h.lease_fd)
      return 21;
  }
  if (mode == IPC_CHILD_FORGED_FD) {
    int own = dup(sock);
    if (h.kind != MP_IPC_CUDA || own < 0)
      return 22;
    mp_ipc_handle_t f = h;
    f.fd = own;
    mp_status_t st = mp_ipc_import(d, &f, &p);
    if (st == MP_OK)
      (void)mp_ipc_close(d, p);
    if (st != MP_EINVAL)
      return 23;
    if (fcntl(own, F_GETFD) == -1)
      return 24; /* the refusal closed the importer's own descriptor */
    close(own);
  }
  if (mp_ipc_import(d, &h, &p) != MP_OK)
    return 12;
  if (!ipc_put(sock, 'I'))
    return 13;
  unsigned char *buf = malloc(h.bytes);
  if (buf == NULL || !ipc_copy(d, buf, p, h.bytes))
    return 14;
  if (ipc_mismatch(buf, h.bytes, IPC_PARENT_TAG) != h.bytes)
    return 15;
  ipc_pattern(buf, h.bytes, IPC_CHILD_TAG);
  if (!ipc_copy(d, p, buf, h.bytes))
    return 16;
  free(buf);
  bool wait = mode == IPC_CHILD_WAIT_CLOSE || mode == IPC_CHILD_WAIT_EXIT;
  if (wait && !ipc_get(sock, 'G'))
    return 17;
  if (mode == IPC_CHILD_WAIT_EXIT)
    _exit(0); /* as a crash would: no cleanup, the lease goes with the
                 process */
  if (mp_ipc_close(d, p) != MP_OK)
    return 18;
  if (!ipc_put(sock, 'D'))
    return 19;
  mp_device_close(d);
  return 0;
}

#endif /* MEMPOOL_TEST_IPC_CHILD_H */
