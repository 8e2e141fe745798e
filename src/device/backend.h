/* backend.h - the interface every device backend implements.
 *
 * device.c validates arguments and dispatches through this table; a backend
 * trusts what it is given (non-NULL outputs, non-zero sizes) and reports
 * driver failures as MP_EDRIVER/MP_ENOMEM. Backends: host.c (emulated
 * device), cuda.c (libcuda.so.1 through dlopen). Each is one file.
 *
 * Virtual memory (vm_*) is an internal service for the pool, not public API:
 * reserve an address range, then map and unmap physical memory inside it in
 * multiples of the granularity. vm_unmap takes exactly an (addr, bytes) pair
 * that one vm_map call mapped (CUDA cannot unmap part of a mapping), and
 * vm_release takes a whole reservation with nothing mapped in it (the host
 * backend answers MP_EBUSY otherwise). vm_unmap does not wait for the
 * device: the caller has made sure no queued work still uses the range (the
 * pool unmaps only chunks whose streams it has seen finish). A backend without
 * virtual memory returns MP_ENOTSUP from vm_granularity and the pool falls back
 * to plain allocations. */
#ifndef MEMPOOL_DEVICE_BACKEND_H
#define MEMPOOL_DEVICE_BACKEND_H

#include "../internal.h"

typedef struct mp__backend {
  const char *name; /* "host", "cuda" */
  /* opts: the part of the spec after ':' ("" when none). Fills dev->impl and
   * dev->name. */
  mp_status_t (*open)(mp_device_t *dev, const char *opts);
  /* mp_device_close's first step, before anything goes: the wait for the
   * device's work that the close needs (the cuda device's
   * cuCtxSynchronize). A refusal (from a host function, or while a stream
   * captures: refusals a later close may not meet) leaves the device open
   * and as it was. NULL: close waits by itself (the host device stops its
   * streams). */
  mp_status_t (*close_ready)(mp_device_t *dev);
  /* Drains the streams, releases all, closes: always, past a release the
   * driver refuses (each is still asked for). MP_OK, or the first refusal
   * (mp__fail'd: its message names it and counts the others), the device
   * closed all the same. */
  mp_status_t (*close)(mp_device_t *dev);
  mp_status_t (*mem_info)(mp_device_t *dev, size_t *free_b, size_t *total_b);
  mp_status_t (*alloc)(mp_device_t *dev, size_t bytes, void **out);
  mp_status_t (*free)(mp_device_t *dev, void *ptr);
  mp_status_t (*host_alloc)(mp_device_t *dev, size_t bytes, void **out);
  mp_status_t (*host_free)(mp_device_t *dev, void *ptr);
  /* free and host_free wait for all queued work themselves (the host
   * device): mp_device_free adds no synchronize of its own. */
  bool free_waits;
  mp_status_t (*synchronize)(mp_device_t *dev);

  mp_status_t (*stream_create)(mp_device_t *dev, mp_stream_t *out);
  mp_status_t (*stream_destroy)(mp_device_t *dev, mp_stream_t s);
  /* The refusal (MP_EINVAL, said) of device call fn made where it may not
   * be (the host device: from a host function), before anything changes;
   * MP_OK else. NULL: no call is refused so (CUDA leaves it undefined).
   * The host backend's takes a NULL dev too (mp_device_open: no device
   * yet), and refuses from a host function of any host device. */
  mp_status_t (*caller_check)(mp_device_t *dev, const char *fn);
  /* true when s was made by stream_create on dev and is not destroyed yet;
   * asks no driver (a destroyed handle is undefined behaviour there). The
   * host backend answers true for every handle in a forked child whose
   * stream registry was held at the fork (it cannot look): mp_stream_destroy
   * is then refused by caller_check, with the reason, before any pool
   * forgets the stream (host.c, host_stream_owned, host_caller_check). */
  bool (*stream_owned)(mp_device_t *dev, mp_stream_t s);
  mp_status_t (*stream_synchronize)(mp_device_t *dev, mp_stream_t s);
  /* MP_OK when all work queued on s has completed, MP_EBUSY when not;
   * never waits. */
  mp_status_t (*stream_query)(mp_device_t *dev, mp_stream_t s);
  /* What s is (mp__stream_kind_t), asked once when a pool first meets s;
   * never waits and makes no call CUDA forbids during a capture. NULL: every
   * handle is a stream shared by all threads. */
  int (*stream_kind)(mp_device_t *dev, mp_stream_t s);
  /* 1 when s is being captured into a graph, 0 when not, -1 when it cannot
   * be told, -2 when the driver failed the question with an error of its
   * own (recorded, MP_EDRIVER: a capture may be running or not); allowed
   * during capture, never waits. NULL: no capture. */
  int (*stream_capturing)(mp_device_t *dev, mp_stream_t s);
  /* Whether a capture a device synchronization would invalidate is under
   * way on a stream of dev's context, as far as the backend can tell
   * without a call that conflicts with a capture: 1 (*which the stream, or
   * NULL for a capture only the legacy stream tells of), 0 when it sees
   * none, -1 and -2 as stream_capturing. CUDA has no question for the
   * whole context that leaves a capture valid (cuCtxSynchronize and
   * cuCtxRecordEvent refuse and invalidate it), so a capture of a stream
   * the backend does not know may go unseen (cuda.c). NULL: no capture. */
  int (*capture_seen)(mp_device_t *dev, mp_stream_t *which);
  /* stream_capturing, and when 1 the capture's id in *id: unique to one
   * capture, so two captures of one stream are told apart (CUDA:
   * cuStreamGetCaptureInfo); -1 also for an invalidated capture, which
   * has no id. NULL: stream_capturing answers, the id 0. */
  int (*stream_capture_id)(mp_device_t *dev, mp_stream_t s, uint64_t *id);
  /* Has fn(arg) called once the graph that s is being captured into, and
   * every executable made from it, are destroyed and their replays done:
   * from a driver thread, where no device call is allowed (CUDA: a user
   * object the graph holds). On failure fn is never called. NULL: the
   * backend cannot tell. */
  mp_status_t (*capture_on_release)(mp_device_t *dev, mp_stream_t s,
                                    void (*fn)(void *), void *arg);
  /* Which device of this kind work on s runs on: s's own (CUDA: its
   * context's device), the calling thread's for a default stream (NULL,
   * CUDA's legacy and per-thread ones: its current context's) and for a
   * handle the driver cannot place; no message on failure. NULL: one
   * device only. */
  mp_status_t (*stream_ordinal)(mp_device_t *dev, mp_stream_t s, int *out);
  int (*ordinal)(mp_device_t *dev); /* dev's own, for stream_ordinal */
  mp_status_t (*launch_host)(mp_device_t *dev, mp_stream_t s,
                             void (*fn)(void *), void *arg);
  mp_status_t (*memcpy_async)(mp_device_t *dev, void *dst, const void *src,
                              size_t n, mp_stream_t s);
  mp_status_t (*memset_async)(mp_device_t *dev, void *dst, int value, size_t n,
                              mp_stream_t s);

  mp_status_t (*event_create)(mp_device_t *dev, mp_event_t *out);
  mp_status_t (*event_destroy)(mp_device_t *dev, mp_event_t e);
  mp_status_t (*event_record)(mp_device_t *dev, mp_event_t e, mp_stream_t s);
  mp_status_t (*event_query)(mp_device_t *dev, mp_event_t e);
  mp_status_t (*event_synchronize)(mp_device_t *dev, mp_event_t e);
  mp_status_t (*stream_wait_event)(mp_device_t *dev, mp_stream_t s,
                                   mp_event_t e);

  /* The alignment every alloc result is guaranteed to have; NULL:
   * MP__DEVICE_ALLOC_ALIGN. */
  size_t (*alloc_align)(mp_device_t *dev);
  mp_status_t (*vm_granularity)(mp_device_t *dev, size_t *out);
  mp_status_t (*vm_reserve)(mp_device_t *dev, size_t bytes, void **out);
  mp_status_t (*vm_release)(mp_device_t *dev, void *base, size_t bytes);
  mp_status_t (*vm_map)(mp_device_t *dev, void *addr, size_t bytes);
  mp_status_t (*vm_unmap)(mp_device_t *dev, void *addr, size_t bytes);
  /* Lets device peer (of the same backend) read and write a mapped range
   * (grant), or takes that away again (!grant: the undo of a failed
   * mp_pool_set_access) (cuMemSetAccess); NULL: every device of the kind
   * shares memory. */
  mp_status_t (*vm_access)(mp_device_t *dev, void *addr, size_t bytes,
                           mp_device_t *peer, bool grant);

  /* IPC (src/ipc.c, src/pool/export.c). ipc_export: a handle for exactly
   * one allocation (vm false: one alloc) or one vm_map mapping (vm true),
   * (base, bytes); fills h->kind and h->fd or h->opaque, nothing else.
   * ipc_open maps what h names (h->mem_bytes bytes) into this process and
   * leaves h's descriptors to the caller; it sets *out on MP_OK, and on a
   * failure only where what it mapped stays mapped (the undoing unmap was
   * refused too: *out is that mapping, which the caller keeps for
   * mp_device_close; else *out is left as it was); ipc_close undoes it (without
   * a wait: the caller has waited for the work that may use it), setting
   * *unmapped when the memory is no longer mapped: always on MP_OK; on a
   * failure only when it came after the unmap (the mapping is gone, what
   * failed is cleanup), else the mapping is left as it was. NULL: the
   * backend cannot share memory (MP_ENOTSUP). */
  mp_status_t (*ipc_export)(mp_device_t *dev, void *base, size_t bytes, bool vm,
                            mp_ipc_handle_t *h);
  mp_status_t (*ipc_open)(mp_device_t *dev, const mp_ipc_handle_t *h,
                          void **out);
  mp_status_t (*ipc_close)(mp_device_t *dev, void *base, size_t bytes,
                           unsigned kind, bool *unmapped);
} mp__backend_t;

typedef struct mp__watch {
  void (*fn)(void *ctx, mp_stream_t s);
  void *ctx;
} mp__watch_t;

struct mp__import;

struct mp_device {
  const mp__backend_t *ops;
  void *impl;     /* the backend's state */
  char name[128]; /* mp_device_name() */
  /* Memory of other processes mapped here (mp_ipc_import), under ipc.c's
   * mutex. */
  struct mp__import *imports;
  size_t nimports, imports_cap;
  /* Who is told when a stream of the device goes away (device.c), under
   * one process-wide mutex. */
  mp__watch_t *watch;
  size_t nwatch, watch_cap;
  /* mp_stream_forget calls begun (counted before the watchers are told)
   * and done (after the last): mp__device_forgets. */
  _Atomic uint64_t forgets, forgets_done;
  /* Pools made on the device (or on its page-locked view) and not yet
   * destroyed (pool/core.c, mp__pool_new and mp__pool_free_host): while
   * any is, mp_device_close refuses (it would free what they use). */
  _Atomic size_t pools;
};
/* A pool made on dev (+1) or freed (-1): counted on the device its
 * watchers are told by (a page-locked view's root). */
void mp__device_pools_add(mp_device_t *dev, int delta);

extern const mp__backend_t mp__host_backend;
/* The host device's options opts (the spec after "host:") in canonical
 * form (mp_device_spec_canonical) into text: "host", then ':' and each
 * option that differs from its default, in a fixed order. */
mp_status_t mp__host_spec_canonical(const char *opts,
                                    char text[MP_DEVICE_SPEC_MAX]);
/* The device index of a "cuda" spec's opts ("" for device 0, else decimal
 * digits up to 1024), whether or not the CUDA backend is built; MP_EINVAL
 * naming the spec otherwise. */
mp_status_t mp__cuda_spec_index(const char *opts, int *out);
extern const mp__backend_t mp__pinned_backend;
#if MEMPOOL_HAVE_CUDA
extern const mp__backend_t mp__cuda_backend;
#endif

/* ---- device.c: internal device services for the allocators ------------ */

/* What mp_device_alloc's results are aligned to at least. Without a word
 * from the backend: 512 bytes, what cuMemAlloc returns in practice and what
 * the pool has always assumed (the CUDA Programming Guide promises 256:
 * "Device Memory Accesses"); the pool's default alignment. */
#define MP__DEVICE_ALLOC_ALIGN ((size_t)512)
size_t mp__device_alloc_align(mp_device_t *dev);
/* MP_ENOTSUP when the device has no virtual memory. */
/* mp_device_free and mp_device_host_free without their synchronize:
 * for callers that free only memory no queued work uses (the pools after
 * a sync of their streams or their events, the direct allocator after its
 * session's synchronize). */
mp_status_t mp__device_free(mp_device_t *dev, void *ptr);
mp_status_t mp__device_host_free(mp_device_t *dev, void *ptr);
mp_status_t mp__device_vm_granularity(mp_device_t *dev, size_t *out);
mp_status_t mp__device_vm_reserve(mp_device_t *dev, size_t bytes, void **out);
mp_status_t mp__device_vm_release(mp_device_t *dev, void *base, size_t bytes);
mp_status_t mp__device_vm_map(mp_device_t *dev, void *addr, size_t bytes);
mp_status_t mp__device_vm_unmap(mp_device_t *dev, void *addr, size_t bytes);
mp_status_t mp__device_vm_access(mp_device_t *dev, void *addr, size_t bytes,
                                 mp_device_t *peer);
/* Takes back what mp__device_vm_access gave peer. */
mp_status_t mp__device_vm_revoke(mp_device_t *dev, void *addr, size_t bytes,
                                 mp_device_t *peer);

/* What a pool is told about a stream handle it has not seen before. */
typedef enum mp__stream_kind {
  MP__STREAM_BAD,        /* not a stream of the device: MP_EINVAL */
  MP__STREAM_SHARED,     /* one stream, whichever thread names it */
  MP__STREAM_PER_THREAD, /* a different stream in every thread (CUDA's
                            CU_STREAM_PER_THREAD) */
} mp__stream_kind_t;
mp__stream_kind_t mp__device_stream_kind(mp_device_t *dev, mp_stream_t s);
/* ops->stream_owned; without it, a stream_kind other than MP__STREAM_BAD. */
bool mp__device_stream_owned(mp_device_t *dev, mp_stream_t s);
/* ops->stream_capturing, 0 where the backend has none. */
int mp__device_stream_capturing(mp_device_t *dev, mp_stream_t s);
/* 1 when s (unless NULL) or, as far as ops->capture_seen can tell, any
 * other stream of dev's context is being captured, *which the stream (NULL:
 * one only the legacy stream tells of); 0 when none is seen; -1 and -2 as
 * mp__device_stream_capturing. Asks nothing that a capture forbids: for a
 * caller about to synchronize the device (the direct allocator). */
int mp__device_capture_seen(mp_device_t *dev, mp_stream_t s,
                            mp_stream_t *which);
/* ops->stream_capture_id; *id is 0 unless it answers 1 with an id. */
int mp__device_stream_capture_id(mp_device_t *dev, mp_stream_t s, uint64_t *id);
/* ops->capture_on_release; MP_ENOTSUP where the backend has none. */
mp_status_t mp__device_capture_on_release(mp_device_t *dev, mp_stream_t s,
                                          void (*fn)(void *), void *arg);
/* The ordinal of the device of dev's kind that work on s runs on (the
 * calling thread's for NULL, see ops->stream_ordinal); MP_ENOTSUP when the
 * backend has one device only, MP_ENODEV when the thread is on none. */
mp_status_t mp__device_stream_ordinal(mp_device_t *dev, mp_stream_t s,
                                      int *out);
/* dev's own ordinal among the devices of its kind (0 with one device). */
int mp__device_ordinal(mp_device_t *dev);

/* Stream watchers: fn(ctx, s) runs before s is destroyed (mp_stream_destroy)
 * or when the application says it is going (mp_stream_forget), on the
 * calling thread, with no pool lock held, in the order they were added
 * (a pool with arenas before its arenas: arena.c copies its marks). A
 * pinned view's watchers are its underlying device's (the streams are the
 * same). */
mp_status_t mp__device_watch(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                             void *ctx);
void mp__device_unwatch(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                        void *ctx);
/* fn(ctx, s) for each watcher of dev whose function is fn, as
 * mp_stream_forget tells them (the same lock, the same order), for news of
 * s that is no forget: the other watchers are not told, and no forget is
 * counted (mp__device_forgets). stream.c: a new stream given s. */
void mp__device_watchers_tell(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                              mp_stream_t s);
/* Around the destroy of stream s that is no capture's (mp_stream_destroy,
 * the LD_PRELOAD shim's cuStreamDestroy; src/pool/stream.c): before it,
 * while the handle is valid, every pool of dev closes s's epoch with a
 * marker and sets its slot aside, so that a call naming s before the
 * driver answers gets a slot of its own; after it, destroyed, each forgets
 * both slots without touching the handle, else (refused) each gives s its
 * slot back as it was. Forgotten before the destroy, such a call made a
 * slot matched to a dead handle, which a stream the driver gave the same
 * handle then inherited; a refused destroy left the live stream unknown. */
void mp__stream_destroy_begin(mp_device_t *dev, mp_stream_t s);
void mp__stream_destroy_end(mp_device_t *dev, mp_stream_t s, bool destroyed);
/* How many forgets have begun on the device (its pinned view's, the
 * same), or UINT64_MAX while one is under way. A caller that read a value
 * other than UINT64_MAX before it looked at some pools' streams, and reads
 * the same under another pool's lock, knows that no stream it saw has been
 * forgotten there (a forget begun later tells that pool after the lock is
 * dropped); one under way may have passed that pool already. */
uint64_t mp__device_forgets(mp_device_t *dev);

/* ipc_export of device memory (the pool, the fake driver): MP_ENOTSUP
 * when the backend cannot share memory. */
mp_status_t mp__device_ipc_export(mp_device_t *dev, void *base, size_t bytes,
                                  bool vm, mp_ipc_handle_t *h);
/* Host backend only: vm_map, inside a reservation of dev, of bytes of the
 * memory a descriptor from ipc_export names (at its file offset), not
 * charged to dev; vm_unmap undoes it (the fake driver's
 * cuMemImportFromShareableHandle + cuMemMap). */
mp_status_t mp__host_vm_map_file(mp_device_t *dev, void *addr, size_t bytes,
                                 int fd);
/* Host backend only: (p, bytes), memory made the device's outside its
 * own calls (the fake driver's cuIpcOpenMemHandle, mapped from another
 * process, and its cuMemHostRegister, the program's own host memory
 * registered), is device memory to copies and memsets from now (mapped)
 * or no more (!mapped; bytes unused, p the start noted), as an
 * mp_ipc_import's. */
mp_status_t mp__host_note_import(mp_device_t *dev, void *p, size_t bytes,
                                 bool mapped);
/* ipc.c, at mp_device_close: closes what is still imported. MP_OK, or the
 * first forced close the device refused (mp__fail'd; the import is kept
 * mapped, its lease open), every other import closed all the same. */
mp_status_t mp__ipc_close_all(mp_device_t *dev);
/* ipc.c, at mp_pool_ipc_export: writes into the pool's end of a new lease
 * (before it shuts writing) what h, the handle made, names, which
 * mp_ipc_import checks a handle's lease holds. MP_EIO on failure. */
mp_status_t mp__ipc_lease_stamp(int lease, const mp_ipc_handle_t *h);

/* ---- pinned.c: the page-locked host memory of a device as a device ---- */

/* A device whose alloc/free are under's host_alloc/host_free and whose
 * streams and events are under's; no virtual memory. mp_device_close
 * closes the view only; under must outlive it. */
mp_status_t mp__device_pinned_open(mp_device_t *under, mp_device_t **out);
/* What dev's alloc hands out, for messages: "page-locked host memory" for a
 * pinned view, else "device memory". */
const char *mp__device_memory_name(const mp_device_t *dev);

#endif /* MEMPOOL_DEVICE_BACKEND_H */
