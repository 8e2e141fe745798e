/* export.c - the exporting side of IPC: mp_pool_ipc_export hands a live
 * block's device memory to another process, and a lease tells the pool
 * when that process has let go, so that the block is never reused while
 * it is imported elsewhere.
 *
 * A lease is a Unix socket pair: the pool keeps one end, the other travels
 * in the handle and is kept open by the import (src/ipc.c). When every copy
 * of the importer's end is closed (mp_ipc_close, mp_ipc_handle_close, the
 * process exiting) the pool's end polls as hung up. That needs no protocol
 * and no message: a crashed importer releases its blocks too.
 *
 * Invariants: every record in pool->exports names a live block flagged
 * MP__B_EXPORTED, and every such block has at least one record; a block
 * freed while a record of it is still open is MP__B_HELD (still in the live
 * map, still counted allocated) and pool->nheld counts those. Polls never
 * wait.
 *
 * With arenas each arena is an exporting pool of its own: an export goes
 * to the arena holding the block, a poll to every arena. An arena's
 * allocations from its cache do not reap (that path stays as short as a
 * pool without exports): its held blocks go back when it misses its cache,
 * frees or exports a block, trims or is polled. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pool_internal.h"

struct mp__export {
  mp__block_t *b;
  int lease; /* the pool's end */
};

/* Whether the importer's end of a lease is closed everywhere. */
static bool mp__lease_gone(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Closes record i (swapped with the last). */
static void mp__export_drop(mp_pool_t *pool, size_t i) {
  close(pool->exports[i].lease);
  pool->exports[i] = pool->exports[--pool->nexports];
}

static bool mp__export_has(const mp_pool_t *pool, const mp__block_t *b) {
  for (size_t i = 0; i < pool->nexports; i++)
    if (pool->exports[i].b == b)
      return true;
  return false;
}

/* Frees held block b now that nobody imports it. */
static void mp__export_release(mp_pool_t *pool, mp__block_t *b) {
  pool->nheld--;
  mp__pool_rare_update(pool);
  mp__map_remove(pool, b);
  mp__segment_release_above(pool);
  mp__block_release(pool, b);
}

void mp__export_reap(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  for (size_t i = 0; i < pool->nexports;) {
    mp__block_t *b = pool->exports[i].b;
    if (!mp__lease_gone(pool->exports[i].lease)) {
      i++;
      continue;
    }
    mp__export_drop(pool, i);
    if (mp__export_has(pool, b))
      continue;
    if (b->flags & MP__B_HELD)
      mp__export_release(pool, b);
    else
      b->flags &= ~(uint32_t)MP__B_EXPORTED;
  }
}

size_t mp__export_open(const mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  size_t n = 0;
  for (size_t i = 0; i < pool->nexports; i++)
    n += !mp__lease_gone(pool->exports[i].lease);
  return n;
}

bool mp__export_hold(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT_LOCKED(pool);
  /* b's own leases only: a release of another block (mp__export_reap) may
   * drop the lock, and b must be decided first, in the live map or out of
   * it for good, never out of it while other threads look (or allocate:
   * the room its removal left would go to them). */
  bool open = false;
  for (size_t i = 0; i < pool->nexports;) {
    if (pool->exports[i].b != b) {
      i++;
    } else if (mp__lease_gone(pool->exports[i].lease)) {
      mp__export_drop(pool, i);
    } else {
      open = true;
      i++;
    }
  }
  if (!open) {
    b->flags &= ~(uint32_t)MP__B_EXPORTED;
    return false;
  }
  b->flags |= MP__B_HELD;
  pool->nheld++;
  mp__pool_rare_update(pool);
  /* PyTorch's free_requested: the program let go of it; its
   * free_completed comes when the leases close (mp__export_release). */
  MP__HIST(pool, MP__H_FREE_REQUESTED, b->addr, b->requested,
           MP__HIST_STREAM(pool, b->sidx));
  return true;
}

/* A plain segment's memory travels as a CUipcMemHandle, and "calling
 * ::cuMemFree on an exported memory region before calling
 * ::cuIpcCloseMemHandle in the importing context will result in undefined
 * behavior" (cuda.h, cuIpcOpenMemHandle): destroy waits for its importers,
 * as pause does. A chunk of the virtual range needs no wait: the importer
 * holds its own reference to the physical memory ("the memory allocation
 * will be freed when all outstanding mappings to the memory are unmapped
 * and when all outstanding references to the handle (including its
 * shareable counterparts) are also released", cuda.h, cuMemRelease; each
 * cuMemImportFromShareableHandle is such a reference). */
mp_status_t mp__export_destroy_busy(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  mp__export_reap(pool);
  for (size_t i = 0; i < pool->nexports; i++) {
    const mp__block_t *b = pool->exports[i].b;
    if (b->seg->kind != MP__SEG_PLAIN)
      continue;
    return mp__fail(MP_EBUSY,
                    "mp_pool_destroy: the block at %p (%zu bytes, %s, in the "
                    "plain segment at %p) is still imported by another "
                    "process (or a handle of it is still open): its memory "
                    "may not be freed before the importer closes it "
                    "(mp_ipc_close); nothing was released",
                    (void *)b->addr, b->size,
                    (b->flags & MP__B_HELD) ? "freed, held" : "live",
                    (void *)b->seg->base);
  }
  return MP_OK;
}

void mp__export_release_all(mp_pool_t *pool) {
  while (pool->nexports > 0)
    mp__export_drop(pool, pool->nexports - 1);
  free(pool->exports);
  pool->exports = NULL;
  pool->exports_cap = 0;
  pool->nheld = 0;
  mp__pool_rare_update(pool);
}

void mp__export_unseal(mp_pool_t *pool) {
  mp__pool_lock(pool);
  pool->export_sealed = false;
  mp__pool_unlock(pool);
}

mp_status_t mp__export_check(const mp_pool_t *pool) {
  size_t held = 0;
  for (size_t i = 0; i < pool->nexports; i++) {
    const mp__block_t *b = pool->exports[i].b;
    if (mp__map_find(pool, b->addr) != b || !(b->flags & MP__B_EXPORTED))
      return mp__fail(MP_ECORRUPT,
                      "pool check: export %zu names %p, not a live exported "
                      "block",
                      i, (void *)b->addr);
  }
  for (size_t i = 0; i < mp__map_slots(pool->map_cap); i++) {
    const mp__block_t *b = pool->map[i].blk;
    if (pool->map[i].addr == 0 || b == NULL)
      continue;
    if ((b->flags & MP__B_EXPORTED) && !mp__export_has(pool, b))
      return mp__fail(MP_ECORRUPT,
                      "pool check: block %p is marked exported without a "
                      "lease",
                      (void *)b->addr);
    if ((b->flags & MP__B_HELD) && !(b->flags & MP__B_EXPORTED))
      return mp__fail(MP_ECORRUPT, "pool check: block %p is held, not exported",
                      (void *)b->addr);
    held += (b->flags & MP__B_HELD) != 0;
  }
  if (held != pool->nheld)
    return mp__fail(MP_ECORRUPT, "pool check: %zu blocks held, %zu counted",
                    held, pool->nheld);
  return MP_OK;
}

/* The device allocation holding b: one mapped chunk of the virtual range,
 * or a plain segment. */
static mp_status_t mp__export_memory(const mp_pool_t *pool,
                                     const mp__block_t *b, uintptr_t *base,
                                     size_t *bytes, bool *vm) {
  const mp__segment_t *g = b->seg;
  if (pool->graph)
    return mp__fail(MP_ENOTSUP,
                    "mp_pool_ipc_export: %p is a graph pool's memory, which "
                    "is not exported",
                    (void *)b->addr);
  if (pool->parent != NULL || g->kind == MP__SEG_RANGE)
    return mp__fail(MP_ENOTSUP,
                    "mp_pool_ipc_export: %p is in a child pool; export from "
                    "the parent",
                    (void *)b->addr);
  if (g->kind == MP__SEG_PLAIN) {
    *base = g->base;
    *bytes = g->size;
    *vm = false;
    return MP_OK;
  }
  mp__chunk_t c;
  if (!mp__vrange_chunk_of(g, b->addr, &c) ||
      b->addr + b->size > c.addr + c.size)
    return mp__fail(MP_ENOTSUP,
                    "mp_pool_ipc_export: the block at %p (%zu bytes) spans "
                    "more than one mapped chunk; only a block inside one "
                    "device allocation can be exported",
                    (void *)b->addr, b->size);
  *base = c.addr;
  *bytes = c.size;
  *vm = true;
  return MP_OK;
}

mp_status_t mp__export_block(mp_pool_t *pool, void *ptr, mp_ipc_handle_t *out) {
  mp__pool_lock(pool);
  mp__block_t *b = NULL;
  mp__slot_t *slot = NULL;
  uintptr_t base = 0;
  size_t bytes = 0;
  bool vm = false;
  mp_status_t st = mp__pool_paused(pool, "mp_pool_ipc_export");
  if (st == MP_OK)
    st = mp__pool_find_live(pool, "mp_pool_ipc_export", ptr, false, false, &b,
                            &slot);
  /* The leases whose importers let go, before a new one: a live block
   * exported again and again would otherwise keep one descriptor per
   * export until it is freed (or the pool polled or trimmed). An export
   * refused before it (bad pointer, paused) reaps nothing; one refused
   * later keeps what the reap released (pool.h). The reap may drop the lock (a
   * release that unmaps, with release_threshold): a pause, or another thread's
   * free of ptr, may have come meanwhile, so both are asked again. */
  if (st == MP_OK && pool->nexports > 0) {
    mp__export_reap(pool);
    st = mp__pool_paused(pool, "mp_pool_ipc_export");
    if (st == MP_OK)
      st = mp__pool_find_live(pool, "mp_pool_ipc_export", ptr, false, false, &b,
                              &slot);
  }
  /* The lock is held from here to the record: a destroy that asked the
   * leases for the last time is freeing the memory unlocked (pool.c), and
   * would free this block's under the lease. */
  if (st == MP_OK && pool->export_sealed)
    st = mp__fail(MP_EBUSY,
                  "mp_pool_ipc_export: the pool is being destroyed (its "
                  "memory is being freed): nothing exported");
  if (st == MP_OK)
    st = mp__export_memory(pool, b, &base, &bytes, &vm);
  if (st == MP_OK && pool->nexports == pool->exports_cap) {
    size_t cap = pool->exports_cap ? 2 * pool->exports_cap : 8;
    struct mp__export *n = mp__host_realloc(pool->exports, cap * sizeof *n);
    if (n == NULL) {
      st = mp__fail(MP_ENOMEM, "mp_pool_ipc_export: out of host memory");
    } else {
      pool->exports = n;
      pool->exports_cap = cap;
    }
  }
  int lease[2] = {-1, -1};
  if (st == MP_OK &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lease) != 0)
    st = mp__fail(MP_EIO, "mp_pool_ipc_export: cannot make a lease: %s",
                  strerror(errno));
  mp_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  h.fd = -1;
  /* The block is live, so its memory stays mapped while the lock is
   * held; exporting a handle waits for no device work. */
  if (st == MP_OK)
    st = mp__device_ipc_export(pool->dev, (void *)base, bytes, vm, &h);
  bool made = st == MP_OK; /* h.fd (MP_IPC_FD) is ours to close */
  if (made) {
    h.mem_bytes = bytes;
    h.offset = b->addr - base;
    h.bytes = b->size;
    snprintf(h.backend, sizeof h.backend, "%s", pool->dev->ops->name);
  }
  /* The pool's end writes what the handle names (the stamp mp_ipc_import
   * checks: a stale copy of another handle, its numbers reused, is no
   * handle of this lease) and nothing more: shut so, it marks the
   * importer's end (its peer has shut writing, POLLRDHUP there), which
   * mp_ipc_import requires, so that no handle can name the pool's own end
   * as a lease (the import would own it and close it under the pool). */
  if (st == MP_OK)
    st = mp__ipc_lease_stamp(lease[0], &h);
  if (st == MP_OK && shutdown(lease[0], SHUT_WR) != 0)
    st = mp__fail(MP_EIO, "mp_pool_ipc_export: cannot make a lease: %s",
                  strerror(errno));
  if (st != MP_OK) {
    if (lease[0] >= 0) {
      close(lease[0]);
      close(lease[1]);
    }
    if (made && h.kind == MP_IPC_FD && h.fd >= 0)
      close(h.fd);
    mp__pool_unlock(pool);
    return st;
  }
  pool->exports[pool->nexports++] = (struct mp__export){b, lease[0]};
  b->flags |= MP__B_EXPORTED;
  mp__pool_unlock(pool);
  h.lease_fd = lease[1];
  *out = h;
  return MP_OK;
}

mp_status_t mp__export_poll(mp_pool_t *pool, size_t *held) {
  mp__pool_lock(pool);
  /* Paused: MP_EBUSY, as pool.h's pause contract says of every call it
   * does not name (a paused pool has no leases: pause refuses while any
   * is open). */
  mp_status_t st = mp__pool_paused(pool, "mp_pool_ipc_poll");
  if (st == MP_OK) {
    mp__export_reap(pool);
    if (held != NULL)
      *held = pool->nheld;
  }
  mp__pool_unlock(pool);
  return st;
}
