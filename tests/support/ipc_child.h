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
  IPC_CHILD_FORGED_FD   /* as CLOSE, after a copy of a CUDA IPC handle
                           (which carries no descriptor) naming one of the
                           importer's own descriptors was refused and left
                           that descriptor open */
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

/* The importer's life; returns its exit status. */
static inline int ipc_child(int sock, const char *spec, ipc_child_mode_t mode) {
  mp_device_t *d = NULL;
  if (mp_device_open(spec, &d) != MP_OK)
    return 10;
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
