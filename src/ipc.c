/* ipc.c - the importing side of IPC: mapping a block another process
 * exported (mp_ipc_import / mp_ipc_close), and moving handles between
 * processes over a Unix socket (mp_ipc_send / mp_ipc_recv).
 *
 * An import keeps the lease's importer end open until it is closed: the
 * exporter learns that the block is free to reuse when every copy of that
 * end is gone (src/pool/export.c), which also happens when the importing
 * process dies. Imports are listed per device (an array, under one
 * process-wide mutex: imports are rare) so that mp_ipc_close can find
 * what it maps and mp_device_close can close what was left.
 *
 * Invariant: a handle that fails to import keeps its descriptors; one
 * that imports gives them to the import (the memory's descriptor is closed
 * once mapped, the lease kept). Every open import's lease is also in
 * mp__ipc_leases, whatever its device, so that no two imports of the
 * process own one lease; so is the lease of an import under way (listed
 * before it maps), so that mp_ipc_handle_close of a copy of its handle
 * cannot close it. An import under way also holds its entry in its
 * device's list from then (pending), so that what it maps always has room
 * there: a device's list also holds what refused imports left mapped
 * (left: no lease), until mp_device_close. An import whose unmap the
 * device refuses at mp_device_close keeps its lease open and listed until
 * the process exits (mp__ipc_done, abandoned). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/backend.h"

struct mp__import {
  uintptr_t ptr; /* what mp_ipc_import returned */
  void *base;    /* what the backend mapped */
  size_t bytes;
  unsigned kind;
  int lease;    /* -1: none (left) */
  bool closing; /* an mp_ipc_close of it is under way */
  /* What an import refused after it mapped left mapped, the device having
   * refused its unmap (mp__ipc_refuse): no import of the program's (no
   * mp_ipc_close finds it) and no lease, kept so that mp_device_close
   * unmaps it, as the imports left open. */
  bool left;
  /* The entry an import under way reserved before it mapped (lease set,
   * nothing else): no import of the program's yet, which mp__ipc_settle
   * makes the import, or what its refusal left mapped, or drops. */
  bool pending;
};

static pthread_mutex_t mp__ipc_mu = PTHREAD_MUTEX_INITIALIZER;
/* A close ended (mp__ipc_done): mp__ipc_close_all waits on it for the
 * closes of other threads under way. With mp__ipc_mu. */
static pthread_cond_t mp__ipc_cv = PTHREAD_COND_INITIALIZER;
/* The lease descriptors of the process's open imports and imports under
 * way, on every device (mp_ipc_import's copy check). Under mp__ipc_mu. */
static int *mp__ipc_leases;
static size_t mp__ipc_nleases, mp__ipc_leases_cap;

/* The index of lease in mp__ipc_leases, or SIZE_MAX. mp__ipc_mu held. */
static size_t mp__ipc_lease_at(int lease) {
  for (size_t i = 0; i < mp__ipc_nleases; i++)
    if (mp__ipc_leases[i] == lease)
      return i;
  return SIZE_MAX;
}

/* Room for one more import in dev's list; false without host memory.
 * mp__ipc_mu held. */
static bool mp__ipc_dev_room(mp_device_t *dev) {
  if (dev->nimports == dev->imports_cap) {
    size_t cap = dev->imports_cap ? 2 * dev->imports_cap : 8;
    struct mp__import *n = mp__host_realloc(dev->imports, cap * sizeof *n);
    if (n == NULL)
      return false;
    dev->imports = n;
    dev->imports_cap = cap;
  }
  return true;
}

/* Room for one more import in dev's list and in mp__ipc_leases; false
 * without host memory. mp__ipc_mu held. */
static bool mp__ipc_room(mp_device_t *dev) {
  if (!mp__ipc_dev_room(dev))
    return false;
  if (mp__ipc_nleases == mp__ipc_leases_cap) {
    size_t cap = mp__ipc_leases_cap ? 2 * mp__ipc_leases_cap : 8;
    int *n = mp__host_realloc(mp__ipc_leases, cap * sizeof *n);
    if (n == NULL)
      return false;
    mp__ipc_leases = n;
    mp__ipc_leases_cap = cap;
  }
  return true;
}

/* A handle whose memory descriptor is its lease's number (a handle made
 * by hand, or corrupted): no export makes one, and closing both would
 * close the number twice (the second time maybe another thread's new
 * descriptor). MP_EINVAL naming fn, or MP_OK. */
static mp_status_t mp__ipc_fds_apart(const mp_ipc_handle_t *h, const char *fn) {
  if (h->kind == MP_IPC_FD && h->fd >= 0 && h->fd == h->lease_fd)
    return mp__fail(MP_EINVAL,
                    "%s: the handle names descriptor %d as both its memory "
                    "and its lease (no export makes such a handle): nothing "
                    "closed",
                    fn, h->fd);
  return MP_OK;
}

/* What a lease certifies: the pool writes it into its end before it shuts
 * writing (mp__ipc_lease_stamp), where it waits, unread, for the importer's
 * end to peek at it. A handle's descriptors are numbers, which the OS
 * gives out again once closed: a copy of a handle kept after its import
 * closed (or after mp_ipc_handle_close) may name another export's lease
 * by now, and for a plain CUDA segment (no memory descriptor) nothing else
 * tells them apart. Imported, it would map its old block (reused by the
 * exporter since its lease closed) under a lease of another block. The
 * stamp names what the lease holds: the block (offset, size), the memory
 * (a CUipcMemHandle, or the memory descriptor's file and the host
 * device's export tag), so that no other handle passes for its own. Its
 * padding is zeroed, so that it compares as bytes. */
typedef struct mp__lease_stamp {
  char magic[8]; /* "mplease" */
  unsigned kind;
  size_t offset, bytes;
  uint64_t mem_dev, mem_ino; /* MP_IPC_FD: the memory descriptor's file */
  unsigned char opaque[sizeof((mp_ipc_handle_t *)0)->opaque];
} mp__lease_stamp_t;

/* h's stamp into *s; false when its memory descriptor cannot be asked. */
static bool mp__ipc_stamp_of(const mp_ipc_handle_t *h, mp__lease_stamp_t *s) {
  memset(s, 0, sizeof *s);
  memcpy(s->magic, "mplease", sizeof s->magic);
  s->kind = h->kind;
  s->offset = h->offset;
  s->bytes = h->bytes;
  memcpy(s->opaque, h->opaque, sizeof s->opaque);
  if (h->kind == MP_IPC_FD) {
    struct stat sb;
    if (fstat(h->fd, &sb) != 0)
      return false;
    s->mem_dev = (uint64_t)sb.st_dev;
    s->mem_ino = (uint64_t)sb.st_ino;
  }
  return true;
}

mp_status_t mp__ipc_lease_stamp(int lease, const mp_ipc_handle_t *h) {
  mp__lease_stamp_t s;
  if (!mp__ipc_stamp_of(h, &s))
    return mp__fail(MP_EIO, "mp_pool_ipc_export: cannot make a lease: %s",
                    strerror(errno));
  ssize_t n;
  do
    n = send(lease, &s, sizeof s, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof s)
    return mp__fail(MP_EIO, "mp_pool_ipc_export: cannot make a lease: %s",
                    n < 0 ? strerror(errno) : "short write");
  return MP_OK;
}

/* Whether h's lease is its own export's (its stamp names h's block and
 * memory). Every export stamps its lease before it shuts the pool's end,
 * and the stamp stays queued at the importer's end also once the pool's
 * end is closed (a Unix socket keeps what was sent to it). A socket that
 * holds none (n == 0: its peer hung up, or shut writing, with nothing
 * sent) is no lease: a program's own connection whose peer went away, at
 * the number of a stale copy's lease, which the import would own and
 * close, while it mapped (for a plain CUDA segment, with no memory
 * descriptor to tell it) the copy's old block under no lease. */
static mp_status_t mp__ipc_lease_is_hs(const mp_ipc_handle_t *h) {
  mp__lease_stamp_t got, want;
  ssize_t n;
  do
    n = recv(h->lease_fd, &got, sizeof got, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n == 0)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: lease descriptor %d holds no stamp of an "
                    "export (a socket whose peer hung up with nothing sent: "
                    "a stale copy of a handle whose lease number was given "
                    "out again, or a forged handle)",
                    h->lease_fd);
  if (n != (ssize_t)sizeof got || memcmp(got.magic, "mplease", 8) != 0)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: lease descriptor %d is not the importer's "
                    "end of a lease (it holds no stamp of an export)",
                    h->lease_fd);
  if (!mp__ipc_stamp_of(h, &want))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: memory descriptor %d cannot be asked "
                    "which file it is: %s",
                    h->fd, strerror(errno));
  /* What the stamp names instead, for the message: a descriptor's memory
   * is its file (opaque is then the export's own: its tag, its number), a
   * CUipcMemHandle's is opaque. */
  bool same_memory =
      got.kind == MP_IPC_FD
          ? got.mem_dev == want.mem_dev && got.mem_ino == want.mem_ino
          : memcmp(got.opaque, want.opaque, sizeof got.opaque) == 0;
  if (memcmp(&got, &want, sizeof got) != 0)
    return mp__fail(
        MP_EINVAL,
        "mp_ipc_import: lease descriptor %d is not the one its "
        "export made: it leases %s (%zu bytes at offset %zu), "
        "not the block this handle names (%zu bytes at offset "
        "%zu; a stale copy of a handle whose descriptor numbers "
        "were given out again, or a forged handle)",
        h->lease_fd,
        got.kind != h->kind ? "memory of another kind"
        : !same_memory      ? "a block of other memory"
        : got.offset != want.offset || got.bytes != want.bytes
            ? "another block of its memory"
            : "a block of that offset and size under another export",
        got.bytes, got.offset, h->bytes, h->offset);
  return MP_OK;
}

/* Whether fd is a Unix socket, as the export's socketpair: only such a
 * lease is imported (mp__ipc_check), as another kind (TCP with SO_LINGER
 * set, a file on a network file system) may block its close, which an
 * import's lease gets under the process's IPC lock. */
static bool mp__ipc_unix_socket(int fd) {
  struct stat sb;
  int domain = -1;
  socklen_t dlen = sizeof domain;
  return fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
         getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) == 0 &&
         domain == AF_UNIX;
}

static mp_status_t mp__ipc_check(const mp_device_t *dev,
                                 const mp_ipc_handle_t *h) {
  if (h->kind != MP_IPC_FD && h->kind != MP_IPC_CUDA)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: the handle is empty or of unknown kind %u",
                    h->kind);
  if (h->kind == MP_IPC_FD && h->fd < 0)
    return mp__fail(MP_EINVAL, "mp_ipc_import: the handle has no memory "
                               "descriptor (closed already, or imported?)");
  /* A CUDA IPC handle carries its memory in the handle, no descriptor
   * (mp_ipc_recv gives it -1): one named here is none of the import's, and
   * the import would close it, a descriptor of the program's own. */
  if (h->kind == MP_IPC_CUDA && h->fd != -1)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: a CUDA IPC handle carries no memory "
                    "descriptor, but this one names %d",
                    h->fd);
  if (h->lease_fd < 0)
    return mp__fail(MP_EINVAL, "mp_ipc_import: the handle has no lease "
                               "descriptor (closed already, or imported?)");
  mp_status_t st = mp__ipc_fds_apart(h, "mp_ipc_import");
  if (st != MP_OK)
    return st;
  /* The import owns the lease and mp_ipc_close closes it: any other
   * descriptor of the program (a file, a pipe) is no lease, and closing
   * it later would close the program's own. */
  if (!mp__ipc_unix_socket(h->lease_fd))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: lease descriptor %d is not a Unix socket "
                    "(the lease end mp_pool_ipc_export made)",
                    h->lease_fd);
  /* The importer's end: its peer, the pool's end, has shut writing (or is
   * gone). The pool's own end, or another socket pair's, is no lease: the
   * import would own it, and its close would close the pool's. */
  struct pollfd pl = {.fd = h->lease_fd, .events = POLLRDHUP};
  if (poll(&pl, 1, 0) != 1 || !(pl.revents & (POLLRDHUP | POLLHUP)))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: lease descriptor %d is not the importer's "
                    "end of a lease (the exporting pool's own end, or "
                    "another socket)",
                    h->lease_fd);
  if (h->bytes == 0 || h->mem_bytes == 0 || h->offset > h->mem_bytes ||
      h->bytes > h->mem_bytes - h->offset)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: a block of %zu bytes at offset %zu does "
                    "not lie in %zu bytes of memory",
                    h->bytes, h->offset, h->mem_bytes);
  /* The name as sent (mp_ipc_recv checks only that it is a string):
   * quoted as input is (mp__clip). */
  char shown[sizeof h->backend + 1];
  if (strncmp(h->backend, dev->ops->name, sizeof h->backend) != 0)
    return mp__fail(
        MP_EINVAL,
        "mp_ipc_import: a handle from a '%s' device cannot be imported on %s",
        mp__clip(h->backend, strnlen(h->backend, sizeof h->backend), shown,
                 sizeof shown),
        dev->name);
  if (dev->ops->ipc_open == NULL)
    return mp__fail(MP_ENOTSUP,
                    "mp_ipc_import: %s cannot map memory of "
                    "another process",
                    dev->name);
  return MP_OK;
}

/* Ends the import under way of lease on dev: the entry it reserved in
 * dev's list becomes *im (NULL: dropped, nothing of it mapped), and lease
 * leaves mp__ipc_leases unless *im is its import. Wakes
 * mp__ipc_close_all, which waits for imports under way. */
static void mp__ipc_settle(mp_device_t *dev, int lease,
                           const struct mp__import *im) {
  pthread_mutex_lock(&mp__ipc_mu);
  size_t i = 0;
  while (i < dev->nimports &&
         !(dev->imports[i].pending && dev->imports[i].lease == lease))
    i++;
  MP__ASSERT(i < dev->nimports); /* reserved by its import, settled once */
  if (im == NULL && i < dev->nimports)
    dev->imports[i] = dev->imports[--dev->nimports];
  else if (i < dev->nimports)
    dev->imports[i] = *im;
  if (im == NULL || im->lease != lease) {
    size_t l = mp__ipc_lease_at(lease);
    MP__ASSERT(l != SIZE_MAX); /* listed by its import, unlisted only here */
    if (l != SIZE_MAX)
      mp__ipc_leases[l] = mp__ipc_leases[--mp__ipc_nleases];
  }
  pthread_cond_broadcast(&mp__ipc_cv);
  pthread_mutex_unlock(&mp__ipc_mu);
}

/* What an import of h refused after it mapped base leaves mapped in dev's
 * list (left, without a lease: h's is not its own), for mp_device_close
 * to unmap. */
static struct mp__import mp__ipc_left(const mp_ipc_handle_t *h, void *base) {
  return (struct mp__import){.ptr = (uintptr_t)base,
                             .base = base,
                             .bytes = h->mem_bytes,
                             .kind = h->kind,
                             .lease = -1,
                             .left = true};
}

/* Ends an import refused after the backend mapped base for h (the refusal
 * in mp_last_error()): unmaps it, unlists h's lease (h keeps its
 * descriptors) and returns the refusal's status. A device that refuses
 * the unmap leaves the mapping in this process: its status then, with a
 * message that names the refusal and what stays mapped, which stays in
 * dev's list (left, without a lease: h's is not its own), in the entry
 * the import reserved before it mapped, for mp_device_close to unmap. */
static mp_status_t mp__ipc_refuse(mp_device_t *dev, const mp_ipc_handle_t *h,
                                  void *base) {
  mp_status_t st = mp_last_status();
  char why[MP__ERROR_MAX];
  snprintf(why, sizeof why, "%s", mp_last_error());
  bool unmapped = false;
  mp_status_t cst =
      dev->ops->ipc_close(dev, base, h->mem_bytes, h->kind, &unmapped);
  struct mp__import left = mp__ipc_left(h, base);
  mp__ipc_settle(dev, h->lease_fd, unmapped ? NULL : &left);
  if (unmapped)
    return mp__fail(st, "%s", why);
  return mp__fail(cst != MP_OK ? cst : MP_EDRIVER,
                  "%s; and %s refused to unmap what it had mapped for the "
                  "handle (%zu bytes at %p), which stays mapped in this "
                  "process until mp_device_close unmaps it: %s",
                  why, dev->name, h->mem_bytes, base,
                  cst != MP_OK ? mp_last_error() : "no reason given");
}

mp_status_t mp_ipc_import(mp_device_t *dev, mp_ipc_handle_t *h, void **out) {
  if (dev == NULL || h == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_import: %s is NULL",
                    dev == NULL ? "dev"
                    : h == NULL ? "h"
                                : "out");
  mp_status_t st = mp__ipc_check(dev, h);
  if (st != MP_OK)
    return st;
  pthread_mutex_lock(&mp__ipc_mu);
  /* A copy of a handle imported already still names the lease that import
   * owns (and, by the time it comes, maybe another export's memory under
   * the memory descriptor's reused number): two imports would share one
   * lease, the first close would let the exporter reuse the block under
   * the second, and the second close would close that number again.
   * Checked among the imports of every device of the process: a program
   * mapping one block on each of its GPUs from one received handle (a
   * plain CUDA segment's handle has no memory descriptor to tell it) is
   * the same mistake. */
  if (mp__ipc_lease_at(h->lease_fd) != SIZE_MAX) {
    pthread_mutex_unlock(&mp__ipc_mu);
    return mp__fail(MP_EINVAL,
                    "mp_ipc_import: lease descriptor %d belongs to an open "
                    "import (a copy of a handle imported already?)",
                    h->lease_fd);
  }
  /* Listed from here, while it maps (taken back if it fails): neither an
   * import of a copy on another thread nor mp_ipc_handle_close of a copy
   * takes or closes the lease under this import. One closed before this
   * point fails the stamp's check below (its number closed, or another
   * lease's by now). Its entry in dev's list is reserved now too, before
   * anything is mapped: without host memory for it the import is refused
   * here, where nothing is mapped, not once mapped, where what a device
   * refusing to unmap left mapped would have no entry for mp_device_close
   * (other imports may take the room meanwhile). */
  bool room = mp__ipc_room(dev);
  if (room) {
    mp__ipc_leases[mp__ipc_nleases++] = h->lease_fd;
    dev->imports[dev->nimports++] =
        (struct mp__import){.lease = h->lease_fd, .pending = true};
  }
  pthread_mutex_unlock(&mp__ipc_mu);
  if (!room)
    return mp__fail(MP_ENOMEM, "mp_ipc_import: out of host memory");
  void *base = NULL;
  st = dev->ops->ipc_open(dev, h, &base);
  if (st != MP_OK) {
    /* Refused, and base set: the backend mapped it, and the driver refused
     * to unmap it again (cuda.c, mp__cuda_import_left; its message says
     * so). Kept in the entry reserved for it, as mp__ipc_refuse keeps
     * what it cannot unmap. */
    struct mp__import left = mp__ipc_left(h, base);
    mp__ipc_settle(dev, h->lease_fd, base != NULL ? &left : NULL);
    return st;
  }
  /* Asked once the backend has said what it can of the memory descriptor
   * (a file that is no export's, memory outside the export): what is left
   * is a lease of another export's, which only the stamp tells. */
  st = mp__ipc_lease_is_hs(h);
  if (st != MP_OK)
    return mp__ipc_refuse(dev, h, base);
  struct mp__import im = {.ptr = (uintptr_t)base + h->offset,
                          .base = base,
                          .bytes = h->mem_bytes,
                          .kind = h->kind,
                          .lease = h->lease_fd};
  mp__ipc_settle(dev, h->lease_fd, &im);
  if (h->kind == MP_IPC_FD)
    close(h->fd); /* mapped: the memory stays */
  h->fd = -1;
  h->lease_fd = -1;
  *out = (void *)im.ptr;
  return MP_OK;
}

/* The index of the import at ptr in dev's list whose closing flag is
 * closing, or SIZE_MAX; one closing also matches lease (a mapping left
 * by a refused import may share ptr with an import: a CUDA IPC handle's
 * segment is mapped once, at one address, cuIpcOpenMemHandle), one not
 * closing is the program's own (not left). mp__ipc_mu held. */
static size_t mp__ipc_find(const mp_device_t *dev, void *ptr, bool closing,
                           int lease) {
  for (size_t i = 0; i < dev->nimports; i++) {
    const struct mp__import *im = &dev->imports[i];
    if (im->ptr == (uintptr_t)ptr && im->closing == closing && !im->pending &&
        (closing ? im->lease == lease : !im->left))
      return i;
  }
  return SIZE_MAX;
}

/* Marks import i of dev as closing and copies it to *out. mp__ipc_mu
 * held. */
static void mp__ipc_mark(mp_device_t *dev, size_t i, struct mp__import *out) {
  dev->imports[i].closing = true;
  *out = dev->imports[i];
}

/* Marks the import at ptr as closing and copies it to *out; false when
 * there is none (or another close of it is under way). */
static bool mp__ipc_take(mp_device_t *dev, void *ptr, struct mp__import *out) {
  pthread_mutex_lock(&mp__ipc_mu);
  size_t i = mp__ipc_find(dev, ptr, false, -1);
  if (i != SIZE_MAX)
    mp__ipc_mark(dev, i, out);
  pthread_mutex_unlock(&mp__ipc_mu);
  return i != SIZE_MAX;
}

/* How the close of an import ends (mp__ipc_done). */
typedef enum {
  MP__IPC_KEPT,    /* still mapped and leased, not closing any more */
  MP__IPC_GONE,    /* unmapped: its lease closed, dropped from the list */
  MP__IPC_ABANDON, /* dropped from the list, still mapped: lease kept */
} mp__ipc_end_t;

/* Ends the close of import im as end says. An abandoned import's lease
 * stays open, and listed in mp__ipc_leases (no import of a copy of its
 * handle, no mp_ipc_handle_close of one takes it), for the life of the
 * process: the exporter must not reuse a block still mapped here, and
 * learns it is free when the process exits, as the mapping goes. */
static void mp__ipc_done(mp_device_t *dev, const struct mp__import *im,
                         mp__ipc_end_t end) {
  pthread_mutex_lock(&mp__ipc_mu);
  size_t i = mp__ipc_find(dev, (void *)im->ptr, true, im->lease);
  MP__ASSERT(i != SIZE_MAX); /* mp__ipc_take marked it; only this unmarks */
  if (end == MP__IPC_ABANDON || (end == MP__IPC_GONE && im->left)) {
    dev->imports[i] = dev->imports[--dev->nimports];
  } else if (end == MP__IPC_GONE) {
    size_t l = mp__ipc_lease_at(dev->imports[i].lease);
    MP__ASSERT(l != SIZE_MAX); /* listed with its import */
    /* Closed before it leaves the list, under the lock: once unlisted, a
     * copy of the handle imported on another thread would pass the copy
     * check and own a lease closed under it. The exporter may reuse the
     * block from now on. */
    close(dev->imports[i].lease);
    if (l != SIZE_MAX)
      mp__ipc_leases[l] = mp__ipc_leases[--mp__ipc_nleases];
    dev->imports[i] = dev->imports[--dev->nimports];
  } else
    dev->imports[i].closing = false;
  pthread_cond_broadcast(&mp__ipc_cv);
  pthread_mutex_unlock(&mp__ipc_mu);
}

/* Unmaps an import mp__ipc_take marked and closes its lease, once the work
 * that may use it is done: the work queued on s so far (on_stream), else
 * the device's. A close that failed before the memory was unmapped (the
 * wait included) changes nothing (unless force: the device is closing, and
 * the import is unmapped whatever the wait said): the import stays listed
 * with its lease open (the exporter must not reuse a block still mapped
 * here), and may be closed again. */
static mp_status_t mp__ipc_unmap(mp_device_t *dev, const struct mp__import *im,
                                 bool force, bool on_stream, mp_stream_t s) {
  bool unmapped = false;
  mp_status_t st =
      on_stream ? mp_stream_synchronize(dev, s) : mp_device_synchronize(dev);
  /* Forced, unmapped even when the wait failed: the lease goes, so the
   * exporter may reuse the block, and the device's close releases the
   * rest of its memory after such a failure too; a mapping kept would
   * outlive the device (its context may be the program's too) and show
   * the reused memory. */
  if (st == MP_OK || force) {
    mp_status_t cst =
        dev->ops->ipc_close(dev, im->base, im->bytes, im->kind, &unmapped);
    if (st == MP_OK)
      st = cst;
  }
  /* But a device that refuses the unmap itself leaves the memory mapped
   * in this process, device closed or not: its lease stays open (the
   * exporter reusing the block would show through the mapping). */
  mp__ipc_done(dev, im,
               unmapped ? MP__IPC_GONE
               : force  ? MP__IPC_ABANDON
                        : MP__IPC_KEPT);
  if (force && !unmapped)
    return mp__fail(st != MP_OK ? st : MP_EDRIVER,
                    "%s (the device closes, but the import stays mapped, and "
                    "its lease open, until the process exits)",
                    mp_last_error());
  /* MP_ENODEV is a refusal for good (the host device in a forked child
   * of the process that opened it, which no thread of the child will
   * drain): a close again would be refused the same. */
  if (!unmapped && !force)
    return mp__fail(st, "%s (the import is still mapped and leased%s)",
                    mp_last_error(),
                    st == MP_ENODEV ? ": this process cannot close it"
                                    : ": close it again");
  if (st != MP_OK && unmapped)
    return mp__fail(st, "%s (the memory is unmapped and the import closed)",
                    mp_last_error());
  return st;
}

/* mp_ipc_close's refusal of a ptr that is no open import of dev. */
static mp_status_t mp__ipc_not_open(const char *fn, const mp_device_t *dev,
                                    const void *ptr) {
  return mp__fail(MP_EINVAL,
                  "%s: %p is not memory mp_ipc_import mapped on %s (closed "
                  "already?)",
                  fn, ptr, dev->name);
}

mp_status_t mp_ipc_close(mp_device_t *dev, void *ptr) {
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_close: dev is NULL");
  struct mp__import im;
  if (!mp__ipc_take(dev, ptr, &im))
    return mp__ipc_not_open("mp_ipc_close", dev, ptr);
  return mp__ipc_unmap(dev, &im, false, false, NULL);
}

/* As mp_ipc_close, waiting only for the work queued on s: no device
 * synchronization, which CUDA refuses (and which invalidates the capture)
 * while another thread captures a graph in global mode, whatever this
 * thread's capture mode (the fake models it, cuCtxSynchronize). A stream
 * being captured runs nothing until its graph is launched: refused; so is
 * one whose wait would join a capture (below). */
mp_status_t mp_ipc_close_after(mp_device_t *dev, void *ptr, mp_stream_t s) {
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_close_after: dev is NULL");
  if (s != NULL && mp__device_stream_kind(dev, s) == MP__STREAM_BAD)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_close_after: stream %p is not a live stream of "
                    "device '%s'",
                    (void *)s, mp_device_name(dev));
  int capturing = mp__device_stream_capturing(dev, s);
  if (capturing == -2) /* the driver's own failure (a kernel's fault) */
    return mp__fail(MP_EDRIVER, "mp_ipc_close_after: %s", mp_last_error());
  if (capturing == 1)
    return mp__fail(MP_EBUSY,
                    "mp_ipc_close_after: stream %p is being captured: its "
                    "work runs when the graph is launched, not before the "
                    "close",
                    (void *)s);
  /* The driver cannot say: the legacy stream while a blocking stream of
   * the context captures, in any mode (cuStreamIsCapturing answers
   * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), where a wait for it is refused
   * with that code and invalidates the program's capture (cuda.h). */
  if (capturing < 0)
    return mp__fail(MP_EBUSY,
                    "mp_ipc_close_after: the device cannot tell whether "
                    "stream %p joins a capture (the legacy stream while a "
                    "blocking stream captures): a wait for it would "
                    "invalidate that capture",
                    (void *)s);
  struct mp__import im;
  if (!mp__ipc_take(dev, ptr, &im))
    return mp__ipc_not_open("mp_ipc_close_after", dev, ptr);
  return mp__ipc_unmap(dev, &im, false, true, s);
}

/* Closes every import of dev, at mp_device_close. An import another
 * thread is closing (its mp_ipc_close waits for the device's work) is
 * waited for: that close ends in dev's list, and one that failed leaves
 * the import to be closed here; so is an import under way (its entry
 * pending), which ends as an import, what it left mapped, or nothing. */
mp_status_t mp__ipc_close_all(mp_device_t *dev) {
  /* The first refusal's status and message, kept over the later closes'
   * (a later one that succeeds leaves the last error as it is). */
  mp_status_t first = MP_OK;
  mp_error_state_t refused;
  pthread_mutex_lock(&mp__ipc_mu);
  while (dev->nimports > 0) {
    size_t i = 0;
    while (i < dev->nimports &&
           (dev->imports[i].closing || dev->imports[i].pending))
      i++;
    if (i == dev->nimports) {
      pthread_cond_wait(&mp__ipc_cv, &mp__ipc_mu);
      continue;
    }
    struct mp__import im;
    mp__ipc_mark(dev, i, &im);
    pthread_mutex_unlock(&mp__ipc_mu);
    mp_status_t st = mp__ipc_unmap(dev, &im, true, false, NULL);
    if (st != MP_OK && first == MP_OK) {
      first = st;
      mp_error_save(&refused);
    }
    pthread_mutex_lock(&mp__ipc_mu);
  }
  free(dev->imports);
  dev->imports = NULL;
  dev->imports_cap = 0;
  if (mp__ipc_nleases == 0) { /* the last device with imports */
    free(mp__ipc_leases);
    mp__ipc_leases = NULL;
    mp__ipc_leases_cap = 0;
  }
  pthread_mutex_unlock(&mp__ipc_mu);
  if (first != MP_OK)
    mp_error_restore(&refused);
  return first;
}

/* ---- handles over a Unix socket ---------------------------------------- */

/* SO_PASSPIDFD's control message (Linux 6.5, include/linux/socket.h, next
 * to SCM_RIGHTS), which older headers lack. */
#ifdef SCM_PIDFD
#define MP__SCM_PIDFD SCM_PIDFD
#else
#define MP__SCM_PIDFD 0x04
#endif

/* Whether h is of a kind that carries descriptors: an empty handle (kind
 * 0, or a struct zeroed before a failed export, whose 0s are no
 * descriptors) or one of an unknown kind holds none of the caller's. */
static bool mp__ipc_kind_ok(const mp_ipc_handle_t *h) {
  return h->kind == MP_IPC_FD || h->kind == MP_IPC_CUDA;
}

/* The descriptors a handle carries, in the order they travel. */
static size_t mp__ipc_fds(const mp_ipc_handle_t *h, int fds[2]) {
  size_t n = 0;
  if (h->kind == MP_IPC_FD && h->fd >= 0)
    fds[n++] = h->fd;
  if (h->lease_fd >= 0)
    fds[n++] = h->lease_fd;
  return n;
}

mp_status_t mp_ipc_send(int sock, const mp_ipc_handle_t *h) {
  if (h == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_send: h is NULL");
  if (!mp__ipc_kind_ok(h))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_send: the handle is %s (kind %u): nothing sent",
                    h->kind == 0 ? "empty" : "of an unknown kind", h->kind);
  /* A handle imported already (the import took its descriptors) or half
   * closed: the peer would get a handle no import accepts. */
  if (h->lease_fd < 0 || (h->kind == MP_IPC_FD && h->fd < 0))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_send: the handle holds no %s descriptor "
                    "(imported or closed already?): nothing sent",
                    h->lease_fd < 0 ? "lease" : "memory");
  int fds[2];
  size_t nfds = mp__ipc_fds(h, fds);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof fds)];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)h, .iov_len = sizeof *h};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof *h)
    return mp__fail(MP_EIO, "mp_ipc_send: socket %d: %s", sock,
                    n < 0 ? strerror(errno) : "short send");
  return MP_OK;
}

mp_status_t mp_ipc_recv(int sock, mp_ipc_handle_t *out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_recv: out is NULL");
  mp_ipc_handle_t h;
  int fds[2];
  /* Room for the sender's credentials and pidfd too, which a socket with
   * SO_PASSCRED or SO_PASSPIDFD set gets with every message: without it
   * they would not fit, and every receive on such a socket would be
   * refused as truncated. */
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof fds) + CMSG_SPACE(sizeof(struct ucred)) +
             CMSG_SPACE(sizeof(int))];
  } ctl;
  struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do
    n = recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  int err = errno;
  size_t nfds = 0;
  /* A failed recvmsg filled in nothing: its control buffer holds whatever
   * the stack held (an earlier call's descriptor numbers, which the loop
   * below would close). */
  if (n < 0)
    msg.msg_controllen = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL;
       c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == MP__SCM_PIDFD &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      /* The sender's pidfd, installed in this process: the caller never
       * sees the control data, so nobody else would close it. */
      int fd;
      memcpy(&fd, CMSG_DATA(c), sizeof fd);
      close(fd);
    } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (nfds < 2)
          fds[nfds] = fd;
        else
          close(fd); /* more than any handle carries: refused below */
        nfds++;
      }
    }
  size_t kept = nfds < 2 ? nfds : 2;
  /* An empty handle or one of an unknown kind is none mp_ipc_send sends:
   * received, the descriptors it came with would be the caller's to close
   * and mp_ipc_handle_close would close none of them. Nor is one whose
   * backend is no string (the export writes it with snprintf), which a
   * program printing it would read past. */
  mp_ipc_handle_t want = h;
  size_t expect = n == (ssize_t)sizeof h && mp__ipc_kind_ok(&want) &&
                          memchr(want.backend, '\0', sizeof want.backend)
                      ? mp__ipc_fds(&want, (int[2]){0})
                      : (size_t)-1;
  if (expect != nfds || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    for (size_t i = 0; i < kept; i++)
      close(fds[i]);
    return mp__fail(MP_EIO, "mp_ipc_recv: socket %d: %s", sock,
                    n < 0    ? strerror(err)
                    : n == 0 ? "the peer closed the connection"
                             : "not a handle sent by mp_ipc_send");
  }
  size_t i = 0;
  if (h.kind == MP_IPC_FD && h.fd >= 0)
    h.fd = fds[i++];
  else
    h.fd = -1;
  h.lease_fd = h.lease_fd >= 0 ? fds[i++] : -1;
  *out = h;
  return MP_OK;
}

mp_status_t mp_ipc_handle_close(mp_ipc_handle_t *h) {
  if (h == NULL)
    return mp__fail(MP_EINVAL, "mp_ipc_handle_close: h is NULL");
  /* Empty: nothing to close (its fields may be a zeroed struct's, and fd 0
   * is the program's). Of an unknown kind: not a handle of ours. */
  if (h->kind == 0) {
    h->fd = -1;
    h->lease_fd = -1;
    return MP_OK;
  }
  if (!mp__ipc_kind_ok(h))
    return mp__fail(MP_EINVAL,
                    "mp_ipc_handle_close: unknown handle kind %u: nothing "
                    "closed",
                    h->kind);
  mp_status_t st = mp__ipc_fds_apart(h, "mp_ipc_handle_close");
  if (st != MP_OK)
    return st;
  /* A copy of a handle imported already: its lease is the import's (closing
   * it would let the exporter reuse the block under the import), and its
   * memory descriptor the import closed (a number the program may have
   * reused since). Checked and closed under one hold of the lock: an
   * import of the original on another thread lists the lease (from before
   * it maps) under the lock too, so the lease is either listed, and kept,
   * or closed before the import lists it, which then fails (its memory
   * descriptor closed, or its lease's stamp gone) and keeps nothing. Only
   * a lease an import could list (a Unix socket, whose close does not
   * block) is closed under the lock: any other descriptor (the memory's,
   * or a lease of another kind in a handle received from a peer) after
   * it, as its close may block (a TCP socket with SO_LINGER, a file on a
   * network file system) and would hold every IPC call of the process. */
  bool unix_lease = h->lease_fd >= 0 && mp__ipc_unix_socket(h->lease_fd);
  pthread_mutex_lock(&mp__ipc_mu);
  bool imported = h->lease_fd >= 0 && mp__ipc_lease_at(h->lease_fd) != SIZE_MAX;
  if (!imported && unix_lease)
    close(h->lease_fd);
  pthread_mutex_unlock(&mp__ipc_mu);
  if (imported)
    return mp__fail(MP_EINVAL,
                    "mp_ipc_handle_close: lease descriptor %d belongs to an "
                    "open import (a copy of a handle imported already?): "
                    "nothing closed",
                    h->lease_fd);
  if (h->kind == MP_IPC_FD && h->fd >= 0)
    close(h->fd);
  if (h->lease_fd >= 0 && !unix_lease)
    close(h->lease_fd);
  h->kind = 0;
  h->fd = -1;
  h->lease_fd = -1;
  return MP_OK;
}
