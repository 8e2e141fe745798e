/* preload.h - what the files of libmempool_preload.so share.
 *
 * The shim is one shared object built from mempool's own objects plus these
 * files; only the CUDA entry points it replaces (and dlsym) are exported:
 * hooklist.h lists them, one line each. Files, each with one job, bottom
 * first (a file calls only files listed before it; cmake/layers.py
 * checks it, test src_preload_layers):
 *   real.c     the real entry points: glibc's dlsym, the real driver's and
 *              runtime's functions, the shim's own address range
 *   devices.c  one pool per CUDA device, and the snapshot of them all
 *   record.c   the CSV / Chrome-trace recording, its counters, the
 *              snapshot signal
 *   state.c    environment, lazy thread-safe start, fork, hook nesting, the
 *              table of pointers the shim handed out
 *   graphs.c   stream capture: graph-private pools and the graph hooks
 *   host.c     page-locked host memory (cudaHostAlloc ...)
 *   free.c     a pool block's way back (the free hooks share it)
 *   driver.c   the driver-API hooks (cuMemAlloc_v2 ...)
 *   runtime.c  the runtime-API hooks (cudaMalloc ...)
 *   streams.c  the stream hooks: the pool learns and forgets streams
 *   pause.c    mempool_preload_pause / _resume for the whole process
 *   report.c   the report and snapshot at exit, mempool_preload_snapshot
 *   lookup.c   dlsym and cuGetProcAddress: which names resolve to the shim
 *
 * CUDA's types are spelled here with plain C types of the same ABI, so the
 * shim builds without the toolkit; sigcheck.c compares them with the
 * toolkit's own declarations where the toolkit is present. */
#ifndef MEMPOOL_PRELOAD_H
#define MEMPOOL_PRELOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../internal.h"
#include "hooklist.h"

/* ---- CUDA's ABI, as far as the hooks need it ---------------------------- */
typedef unsigned int mp__curesult;    /* CUresult (an enum of non-negatives) */
typedef unsigned int mp__cudaerr;     /* cudaError_t */
typedef unsigned long long mp__cuptr; /* CUdeviceptr (_v2, 64-bit) */
typedef struct CUstream_st *mp__custream;       /* CUstream == cudaStream_t */
typedef struct CUctx_st *mp__cuctx;             /* CUcontext */
typedef struct CUgraph_st *mp__cugraph;         /* CUgraph == cudaGraph_t */
typedef struct CUgraphExec_st *mp__cugraphexec; /* CUgraphExec */
typedef struct CUgraphNode_st *mp__cugraphnode; /* CUgraphNode */
/* CUgraphEdgeData, passed through untouched */
typedef struct CUgraphEdgeData_st mp__cugraphedgedata;
/* CUDA_GRAPH_INSTANTIATE_PARAMS *, passed through untouched */
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st *mp__cugraphparams;
/* CUgraphExecUpdateResultInfo, passed through untouched */
typedef struct CUgraphExecUpdateResultInfo_st mp__cugraphupdateinfo;
/* CUgraphExecUpdateResult (an enum of non-negatives), passed through */
typedef unsigned int mp__cugraphupdateresult;
/* CUgraphNodeParams, read only for a child graph node (type
 * CU_GRAPH_NODE_TYPE_GRAPH): its CUDA_CHILD_GRAPH_NODE_PARAMS' graph and
 * ownership, at the offsets cuda.h gives them (sigcheck.c checks), and
 * for a conditional node below */
typedef struct CUgraphNodeParams_st mp__cugraphnodeparams;
#define MP__GRAPH_NODE_TYPE_GRAPH 4u  /* CU_GRAPH_NODE_TYPE_GRAPH */
#define MP__NODE_PARAMS_GRAPH     16u /* graph.graph's offset */
#define MP__NODE_PARAMS_OWNERSHIP 24u /* graph.ownership's offset */
#define MP__CHILD_GRAPH_OWNERSHIP_MOVE                                         \
  1u /* CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE */
/* And for a conditional node (CU_GRAPH_NODE_TYPE_CONDITIONAL, 13, CUDA
 * 12.3): its CUDA_CONDITIONAL_NODE_PARAMS' size and phGraph_out */
#define MP__GRAPH_NODE_TYPE_COND    13u
#define MP__NODE_PARAMS_COND_SIZE   28u /* conditional.size's offset */
#define MP__NODE_PARAMS_COND_BODIES 32u /* conditional.phGraph_out's */
/* CUipcMemHandle (64 opaque bytes), only ever passed on by address */
typedef struct CUipcMemHandle_st mp__cuipcmemhandle;
#define MP__CU_SUCCESS         0u
#define MP__CU_INVALID_VALUE   1u
#define MP__CU_OUT_OF_MEMORY   2u
#define MP__CU_NOT_INITIALIZED 3u
#define MP__CU_NOT_SUPPORTED   801u
#define MP__CU_NOT_FOUND       500u
#define MP__CU_NO_DEVICE       100u
#define MP__CU_UNKNOWN         999u
/* CUDA_ERROR_NOT_PERMITTED (cuda.h); cudaErrorNotPermitted (driver_types.h)
 * is the same number: the driver's answer to a call from a host function. */
#define MP__CU_NOT_PERMITTED       800u
#define MP__CUDA_SUCCESS           0u
#define MP__CUDA_INVALID_VALUE     1u
#define MP__CUDA_MEMORY_ALLOCATION 2u
#define MP__CUDA_INIT_ERROR        3u
#define MP__CUDA_NO_DEVICE         100u
#define MP__CUDA_UNKNOWN           999u
#define MP__CU_POINTER_LEGACY_IPC                                              \
  10u /* CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE */
#define MP__CU_POINTER_RANGE_START                                             \
  11u /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR */
#define MP__CU_POINTER_RANGE_SIZE 12u /* CU_POINTER_ATTRIBUTE_RANGE_SIZE */
#define MP__CU_PROC_PER_THREAD    2u  /* CU_GET_PROC_ADDRESS_PER_THREAD_... */
#define MP__CU_STREAM_LEGACY      ((mp__custream)0x1)
#define MP__CU_STREAM_PER_THREAD  ((mp__custream)0x2)
#define MP__CAPTURE_MODE_GLOBAL   0u /* CU_STREAM_CAPTURE_MODE_GLOBAL */
#define MP__CAPTURE_MODE_RELAXED  2u /* CU_STREAM_CAPTURE_MODE_RELAXED */

/* ---- real.c ------------------------------------------------------------- */

/* The real entry points (real.c), resolved once, lazily, one member per
 * line of hooklist.h, named as the function. A NULL member: that library
 * or symbol is not there (no driver, no shared runtime). */
#define MP__PL_MEMBER(lib, result, name, params)                               \
  MP__PL_MEMBER_##lib(result, name, params)
#define MP__PL_MEMBER_cu(result, name, params) result(*name) params;
#define MP__PL_MEMBER_rt(result, name, params)
#define MP__PL_MEMBER_own(result, name, params)
typedef struct mp__real_cuda {
  MP__PL_HOOKS(MP__PL_MEMBER) MP__PL_REAL(MP__PL_MEMBER)
} mp__real_cuda_t;
#undef MP__PL_MEMBER_cu
#undef MP__PL_MEMBER_rt
#define MP__PL_MEMBER_cu(result, name, params)
#define MP__PL_MEMBER_rt(result, name, params) result(*name) params;
typedef struct mp__real_cudart {
  MP__PL_HOOKS(MP__PL_MEMBER) MP__PL_REAL(MP__PL_MEMBER)
} mp__real_cudart_t;
#undef MP__PL_MEMBER
#undef MP__PL_MEMBER_cu
#undef MP__PL_MEMBER_rt
#undef MP__PL_MEMBER_own

const mp__real_cuda_t *mp__pl_real_cuda(void);
const mp__real_cudart_t *mp__pl_real_cudart(void);

/* glibc's own dlsym, found without pthread_once or dl_iterate_phdr (see
 * lookup.c); NULL only if glibc has none. */
typedef void *(*mp__dlsym_fn)(void *, const char *);
mp__dlsym_fn mp__pl_glibc_dlsym(void);
/* glibc's dlsym(handle, name); NULL when it has none. */
void *mp__pl_real_dlsym(void *handle, const char *name);
/* Whether addr lies in the shim's own mapped image. */
bool mp__pl_from_self(const void *addr);

/* Code that may run before a sanitizer runtime has started (lookup.c):
 * built without ASan's and TSan's instrumentation. */
#define MP__UNSANITIZED __attribute__((no_sanitize("address", "thread")))

/* ---- what every file shares -----------------------------------------------
 */

#define MP__PL_SAY(...)                                                        \
  do {                                                                         \
    fprintf(stderr, "mempool preload: " __VA_ARGS__);                          \
    fputc('\n', stderr);                                                       \
  } while (0)

/* How a call is served, decided once at the first hooked call. */
typedef enum mp__pl_mode {
  MP__PL_POOL,        /* from the pool */
  MP__PL_PASSTHROUGH, /* the real entry point, recorded */
} mp__pl_mode_t;

typedef struct mp__pl {
  mp__pl_mode_t mode;
  mp_pool_t *pool;  /* MP__PL_POOL only: the first device's pool */
  mp_device_t *dev; /* its device */
  bool host;        /* the emulated device: no driver behind the pool */
  int ordinal;      /* the CUDA device of MEMPOOL_DEVICE (cuda mode); the
                       others get pools of their own on first use */
} mp__pl_t;

/* The most CUDA devices the shim keeps pools for; past it the driver
 * serves. */
#define MP__PL_MAX_DEVICES 64

/* Every pool and its ordinal (mp__pl_with_pools). */
typedef struct mp__pl_pools {
  mp_pool_t *pool[MP__PL_MAX_DEVICES];
  int ordinal[MP__PL_MAX_DEVICES];
  int n;
} mp__pl_pools_t;

/* ---- devices.c ---------------------------------------------------------- */

/* The pool of CUDA device `ordinal` (made on first use with MEMPOOL_CONF's
 * options), or NULL when it cannot be had (the reason said once on
 * stderr). Host mode: the one pool, whatever ordinal says. */
mp_pool_t *mp__pl_pool_of(const mp__pl_t *pl, int ordinal);
/* Calls fn(dev, ctx) for every device that has a pool. */
void mp__pl_each_device(void (*fn)(mp_device_t *, void *), void *ctx);
/* mp_pool_add_stream(pool, s) for a stream of the program's; where the
 * pool is paused (which refuses it: mempool/pool.h), s is held for the
 * resume (mp__pl_devices_resumed) and the answer is MP_OK. */
mp_status_t mp__pl_devices_add_stream(mp_pool_t *pool, mp__custream s);
/* s destroyed: no resume adds it (its hold, if any, dropped). */
void mp__pl_devices_unhold(mp__custream s);
/* After a resume of the pools: the streams held meanwhile, added. */
void mp__pl_devices_resumed(void);
/* Calls fn(pool, ordinal, ctx) for every pool, by CUDA ordinal (host
 * mode: the one, as ordinal 0). */
void mp__pl_each_pool(const mp__pl_t *pl, void (*fn)(mp_pool_t *, int, void *),
                      void *ctx);
/* Calls fn(ps, ctx) with every pool of pl and its ordinal in *ps (fn may
 * change *ps), all of them kept from a reset on another thread until fn
 * returns (mp__devs_walk held read, as by mp__pl_each_pool: fn must not
 * reset a device, nor make a call that does). */
void mp__pl_with_pools(const mp__pl_t *pl, void (*fn)(mp__pl_pools_t *, void *),
                       void *ctx);
/* Whether addr lies in the memory of one of pl's pools: a pointer the
 * shim's table does not know there (a second free, an interior pointer)
 * is not the driver's to free. */
bool mp__pl_pools_hold(const mp__pl_t *pl, uintptr_t addr);
/* Whether addr lies in memory the driver gave one of pl's pools: a device
 * pool's (mp__pl_pools_hold) or the page-locked host pool's (host.c). The
 * device-memory frees (cuMemFree*, cudaFree*) refuse a pointer there that
 * the table does not know (a second free, an interior pointer, one of the
 * host pool's blocks freed) without passing it on: the driver never gave
 * the program that pointer, but a live allocation of the pool's holds it. */
bool mp__pl_memory_holds(const mp__pl_t *pl, uintptr_t addr);
/* The pool of the device current(&ordinal) names (cuCtxGetDevice,
 * cudaGetDevice; both answer 0 on success), or NULL: no current device (the
 * real entry point answers), no pool for it, or a current context that is
 * not the device's primary one (a cuCtxCreate'd context: the pool's memory,
 * events and streams live in the primary context, so that context's
 * allocations and streams are the driver's). current NULL or host mode:
 * pl's own device. */
mp_pool_t *mp__pl_pool_current(const mp__pl_t *pl,
                               unsigned int (*current)(int *));
/* The pool of the calling thread's current context's device (driver API):
 * mp__pl_pool_current with cuCtxGetDevice. */
mp_pool_t *mp__pl_pool_here(const mp__pl_t *pl);
/* The device whose primary context is the calling thread's current
 * context; -1 when none is current or it is a context the program made. */
int mp__pl_primary_current(void);
/* The device whose primary context's reset destroys device memory the real
 * driver has just handed out to the calling thread (mp__pl_table_put_real):
 * mp__pl_primary_current for cuMemAlloc / cudaMalloc, -1 for a
 * stream-ordered allocation (from a memory pool, which a reset leaves). */
int mp__pl_reset_owner(bool stream_ordered);
/* Where a stream-ordered call on s belongs (devices.c): HERE for a default
 * stream, a stream of the current context or a handle the driver does not
 * know (the caller goes on as for the current device); DEVICE, with its
 * ordinal in *ordinal, for an explicit stream of a device's primary context
 * (another device's, or the current one's once its pool is made); FOREIGN for a
 * stream of a context the program made (cuCtxCreate), which no pool serves.
 * Asked only of a stream the driver last said does not capture: driver.c's
 * and runtime.c's stream-ordered allocations ask first
 * (mp__pl_capturing; cudaStreamIsCapturing, where the runtime has it), and
 * streams.c's refused destroy asked at its begin (a capturing stream's
 * destroy returns before). A capture begun since on another thread is not
 * harmed: of s it asks only cuStreamGetCtx, which queues nothing on s and
 * has no capture error (cuda.h, cuStreamGetCtx); its other calls ask about
 * contexts. */
typedef enum {
  MP__PL_STREAM_HERE,
  MP__PL_STREAM_DEVICE,
  MP__PL_STREAM_FOREIGN
} mp__pl_stream_where_t;
mp__pl_stream_where_t mp__pl_stream_where(const mp__pl_t *pl, mp__custream s,
                                          int *ordinal);
/* The pool serving a stream-ordered allocation on s, which cuda.h's
 * cuMemAllocAsync takes from "the memory pool current to the stream's
 * device": that device's pool when s is another device's
 * (mp__pl_stream_where), NULL (the driver's) when s is of a context the
 * program made, else `here`. */
mp_pool_t *mp__pl_pool_for_stream(const mp__pl_t *pl, mp__custream s,
                                  mp_pool_t *(*here)(const mp__pl_t *));
/* Whether a stream-ordered free of pool's block may be ordered on s by the
 * pool: s is a stream of the primary context of pool's device (a default
 * stream: the current context's), or the driver cannot say (the pool then
 * judges s). Asked of a capturing stream too, before the block is routed
 * to a graph pool (cuda.h, cuStreamGetCtx: no capture error; it queues
 * nothing on s). False for another device's
 * stream, or one of a context the program made (cuMemFreeAsync takes any
 * stream: cuda.h), with that stream's context in *owner. */
bool mp__pl_stream_of_pool(const mp__pl_t *pl, const mp_pool_t *pool,
                           mp__custream s, mp__cuctx *owner);
/* The ordinal of the device whose pool is pool, or -1. */
int mp__pl_pool_ordinal(const mp_pool_t *pool);
/* Every pool of pl as one snapshot pickle at path (mp_status_t; MP_EINVAL
 * outside pool mode), a failure said on stderr. */
int mp__pl_snapshot(const mp__pl_t *pl, const char *path);
/* The start: MEMPOOL_CONF's options for the pools made later, and the
 * first device's pool. */
void mp__pl_devices_config(const mp_pool_config_t *cfg);
void mp__pl_devices_put(int ordinal, mp_device_t *dev, mp_pool_t *pool);
/* fork() child: no pools (the parent's are left alone). */
void mp__pl_devices_child(void);
/* The pool of CUDA device `ordinal`, taken away before the driver destroys
 * its memory (cuDevicePrimaryCtxReset): the next allocation on the device
 * makes a new one. The old pool is kept aside, never used again, and
 * returned so that its blocks and graph pools can be forgotten, then
 * released (mp__pl_devices_release) while its memory is still there.
 * NULL: there was none (or host mode, or not pool mode). In every mode the
 * device's primary context handle kept without a pool is forgotten. */
mp_pool_t *mp__pl_devices_retire(const mp__pl_t *pl, int ordinal);
/* After the driver's reset of device `ordinal` has returned, whatever its
 * result: from the retirement until here no pool is made for the device
 * (mp__pl_pool_of answers NULL, the driver serves), as it would be the
 * primary context's that the driver is about to destroy. */
void mp__pl_devices_reset_done(const mp__pl_t *pl, int ordinal);
/* Destroys retired pool `pool` (and closes its device, unless it is
 * pl->dev), before the reset: after it, destroying the pool would free
 * addresses the driver may have handed out since. Its memory goes back
 * to the driver a moment before the reset would destroy it. A pool that
 * cannot go (mp_pool_destroy refused: a graph pool with live blocks, a
 * block another process imported, a stream captured; said on stderr) is
 * kept, never used again, until exit. Whether it went. */
bool mp__pl_devices_release(const mp__pl_t *pl, mp_pool_t *pool);
/* The pool of pl's own device as it is now (host mode: the one), without
 * making one; NULL when there is none (outside pool mode, or retired). */
mp_pool_t *mp__pl_pool_first(const mp__pl_t *pl);

/* ---- record.c ----------------------------------------------------------- */

/* Opens $MEMPOOL_TRACE and, in pool mode, arms $MEMPOOL_SNAPSHOT_SIGNAL
 * (called once from the start). */
void mp__pl_record_open(const mp__pl_t *pl);
/* The stream a call on s is traced with (ptsz: a _ptsz call), as the pool
 * sees it (mp__pl_stream): NULL in a _ptsz call (what cuda.h maps a call
 * to under CUDA_API_PER_THREAD_DEFAULT_STREAM) is the per-thread default
 * stream, CU_STREAM_PER_THREAD's 2, not the legacy one's 0 (a NULL stream
 * elsewhere, and CU_STREAM_LEGACY anywhere: cuda.h, "implicit stream with
 * legacy synchronization behavior"). A replay runs each traced stream on
 * a stream of its own (API.md, trace format); before, a _ptsz call's
 * NULL was traced as 0 and replayed in the legacy stream's order. Inline:
 * every alloc and free asks (out of line, the runtime's cudaMalloc hook
 * stopped being inlined, 55 more instructions a pair: preload_pairs.sh). */
static inline uintptr_t mp__pl_record_stream(mp__custream s, bool ptsz) {
  if (s == MP__CU_STREAM_LEGACY)
    return 0;
  if (ptsz && s == NULL)
    return (uintptr_t)MP__CU_STREAM_PER_THREAD;
  return (uintptr_t)s;
}
void mp__pl_record_alloc(uintptr_t ptr, size_t size, uintptr_t stream, bool ok);
void mp__pl_record_free(uintptr_t ptr, size_t size, uintptr_t stream);
/* A free recorded before the call that then failed: counted as no free,
 * and the block traced live again (the trace had said "free" first so
 * that another thread's allocation of the address comes after it). */
void mp__pl_record_unfree(uintptr_t ptr, size_t size, uintptr_t stream);
/* path opened for writing, truncated, close-on-exec (O_CLOEXEC: a program
 * the process execs must not inherit the descriptor), as a stream whose
 * writes (and open) a signal interrupted are made again, never given up
 * with what the stream held (glibc's own file stream drops it): the trace
 * and the report (report.c). NULL (errno set) when it cannot be. */
FILE *mp__pl_record_fopen(const char *path);
/* Pinned and managed memory: counted and marked, never in the CSV. */
void mp__pl_record_other(const char *what, uintptr_t ptr, size_t size);
/* Bypasses of the pool: "capture", "other_device", "foreign_free". */
void mp__pl_count_bypass(const char *why);
/* The counters of the report. */
typedef struct mp__pl_counts {
  uint64_t allocs, alloc_failures, frees, pinned, managed;
  uint64_t bypass_capture, bypass_other_device, foreign_frees;
  size_t live, peak_live;
} mp__pl_counts_t;
/* At exit: closes the .json trace, flushes the CSV (saying once if that
 * failed) and copies the counters to *out; false in a forked child, which
 * writes nothing. */
bool mp__pl_record_close(mp__pl_counts_t *out);
/* Whether this process is a forked child of the one that started. */
bool mp__pl_record_forked(void);
/* $var with "%p" replaced by the process id, in buf; NULL when unset or
 * empty. */
const char *mp__pl_env_path(const char *var, char *buf, size_t cap);
/* Whether path, var's file, is one that an earlier writer among
 * MEMPOOL_TRACE, MEMPOOL_SNAPSHOT, MEMPOOL_REPORT (in that order: the
 * trace is open from the start, the snapshot written before the report at
 * exit) names: the same path, or the same file through another name. Said
 * on stderr, naming both variables: var's file is not written, as it would
 * overwrite the other's (or the other its). */
bool mp__pl_path_taken(const char *var, const char *path);
/* fork(): flush before, drop in the child. */
void mp__pl_record_prepare(void);
void mp__pl_record_parent(void);
void mp__pl_record_child(void);

/* ---- state.c ------------------------------------------------------------ */

/* The started state (starting it on first use). Never NULL. */
const mp__pl_t *mp__pl_get(void);
/* The state if it was started (a hooked call was made), else NULL. */
const mp__pl_t *mp__pl_started(void);

/* Hook nesting in this thread: a hook that calls a real entry point which
 * comes back into another hook (cudaMalloc -> cuMemAlloc_v2) must see the
 * inner call go straight to the real one, unrecorded. */
bool mp__pl_enter(void); /* false: nested, go to the real entry point */
void mp__pl_leave(void);

/* The pointers the shim knows of: what it handed out from the pool or the
 * device, and what it recorded on the way to the real entry point. */
typedef enum mp__pl_kind {
  MP__PL_FROM_POOL,      /* mp_pool_alloc */
  MP__PL_FROM_DEVICE,    /* mp_device_alloc (managed memory, host mode) */
  MP__PL_FROM_HOSTMEM,   /* mp_device_host_alloc (pinned memory, host mode) */
  MP__PL_FROM_REAL,      /* the real entry point; only recorded */
  MP__PL_FROM_REAL_HOST, /* page-locked memory from the real entry point
                            (write-combined); only recorded */
} mp__pl_kind_t;

typedef struct mp__pl_block {
  uintptr_t ptr;
  size_t size;
  uintptr_t stream;
  mp__pl_kind_t kind;
  mp_pool_t *pool; /* MP__PL_FROM_POOL: the device's pool it came from */
  /* MP__PL_FROM_REAL and MP__PL_FROM_REAL_HOST: the device whose primary
   * context allocated it (its reset destroys it); -1: another context, a
   * stream-ordered allocation (a reset leaves it: driver.c), or any other
   * kind. MP__PL_FROM_HOSTMEM: the device whose host pool served it. */
  int ordinal;
  /* MP__PL_FROM_HOSTMEM: the flags the program asked for (cuMemHostAlloc,
   * cudaHostAlloc; 0 for cuMemAllocHost, cudaMallocHost), which
   * cuMemHostGetFlags answers (host.c); 0 for any other kind. */
  unsigned host_flags;
  /* The number of the free that claimed the entry (mp__pl_table_claim);
   * 0: none. */
  uint64_t claim;
} mp__pl_block_t;

/* Each put: false when no entry could be made (out of host memory). */
bool mp__pl_table_put(uintptr_t ptr, size_t size, uintptr_t stream,
                      mp__pl_kind_t kind);
/* Memory from the real entry point (kind MP__PL_FROM_REAL, device memory,
 * or MP__PL_FROM_REAL_HOST, page-locked), allocated in device ordinal's
 * primary context (-1: another context, or memory its reset leaves). */
bool mp__pl_table_put_real(uintptr_t ptr, size_t size, uintptr_t stream,
                           mp__pl_kind_t kind, int ordinal);
/* A block of device ordinal's host pool (MP__PL_FROM_HOSTMEM) asked for
 * with flags. */
bool mp__pl_table_put_hostmem(uintptr_t ptr, size_t size, unsigned flags,
                              int ordinal);
/* A block of pool (MP__PL_FROM_POOL). */
bool mp__pl_table_put_pool(uintptr_t ptr, size_t size, uintptr_t stream,
                           mp_pool_t *pool);
/* A block of pool put in the table claimed (*out the entry, out->claim
 * the claim's number), as a free's claim holds it (mp__pl_table_claim):
 * absent to every other reader, a free's claim included, until
 * mp__pl_table_end ends it (a graph launch's output, not allocated until
 * the real launch returns: graphs.c). */
bool mp__pl_table_put_pool_claimed(uintptr_t ptr, size_t size, uintptr_t stream,
                                   mp_pool_t *pool, mp__pl_block_t *out);
/* A free's hold on ptr's entry, copied into *out (out->claim its number):
 * the entry stays in the table, as absent to every other reader, until
 * the free is over (mp__pl_table_end). False when ptr is not a known
 * start, or another free holds it. */
bool mp__pl_table_claim(uintptr_t ptr, mp__pl_block_t *out);
/* Ends claim b, without host memory (a refused free never loses the
 * entry): freed, the entry goes (nothing when a put of the same address
 * replaced it since: the memory was handed out again); refused, the claim
 * is lifted and the pointer is as it was. */
void mp__pl_table_end(const mp__pl_block_t *b, bool freed);
/* Removes ptr's entry into *out; false when ptr is not a known start (or a
 * free holds it). */
bool mp__pl_table_take(uintptr_t ptr, mp__pl_block_t *out);
/* The pool block containing addr (its start or inside it). */
bool mp__pl_table_find_pool(uintptr_t addr, mp__pl_block_t *out);
/* The host pool block (MP__PL_FROM_HOSTMEM) containing addr. */
bool mp__pl_table_find_hostmem(uintptr_t addr, mp__pl_block_t *out);
/* Removes every block of pool (a retired pool: its memory is gone), each
 * traced as freed; how many there were. */
size_t mp__pl_table_forget_pool(mp_pool_t *pool);
/* Removes every block of device ordinal's host pool (MP__PL_FROM_HOSTMEM:
 * its chunks are gone with the device's reset), each traced as a pinned
 * free; how many. */
size_t mp__pl_table_forget_hostmem(int ordinal);
/* Removes every block of memory from the real entry point that device
 * ordinal's primary context allocated (gone with its reset), each device
 * block traced as freed and each page-locked one as a pinned free; how
 * many. An ordinal below 0 (no device) forgets nothing. */
size_t mp__pl_table_forget_real(int ordinal);

/* Maps a pool status to the API's error code. */
mp__curesult mp__pl_cu_error(mp_status_t st);
mp__cudaerr mp__pl_cuda_error(mp_status_t st);
/* The stream the pool sees for a caller's stream (host mode: always NULL). */
mp_stream_t mp__pl_stream(const mp__pl_t *pl, mp__custream s, bool ptsz);

/* ---- graphs.c ----------------------------------------------------------- */

/* Stream-ordered work of pool on stream s (ptsz: a per-thread call) while s
 * is being captured: routes s to the capture's graph pool (made on first
 * use, one per capture; mp_pool_graph_begin), so that the pool serves the
 * allocation from it and never records on s. False when s is not being
 * captured or the capture cannot be told (then nothing changed); *err
 * (unless NULL): the driver's error where it could not say whether s is
 * being captured (cuStreamGetCaptureInfo), MP__CU_SUCCESS otherwise. */
bool mp__pl_capture_route(const mp__pl_t *pl, mp_pool_t *pool, mp__custream s,
                          bool ptsz, mp__curesult *err);
/* A stream-ordered allocation of bytes at p that the pool served for the
 * capture of s (mp__pl_capture_route said yes): if the capture does not
 * free it, it is one of the graph's outputs, which cuda.h's graph
 * allocations make the program free after each launch and each launch
 * allocate again (cuGraphLaunch); graphs.c keeps them so. */
void mp__pl_capture_allocated(const mp__pl_t *pl, mp__custream s, bool ptsz,
                              uintptr_t p, size_t bytes);
/* The program frees ptr, a graph's output: held, one a launch allocated
 * (taken from the table), or not (not in the table). A free of one held
 * outside a capture leaves the block to the graph until its next launch;
 * a stream-ordered free (ordered) on a capturing stream s (ptsz: of a
 * per-thread call), held or not, is a free inside a graph (cuda.h allows
 * one in the output's graph or another), and makes the block the graph's
 * memory for its life. True when ptr was such an output and the free is
 * done so; false otherwise (nothing changed), *err then the driver's
 * error where ptr is such an output and the driver could not say whether
 * s is being captured (the free is to be refused with it), MP__CU_SUCCESS
 * otherwise. */
bool mp__pl_output_free(const mp__pl_t *pl, uintptr_t ptr, bool held,
                        bool ordered, mp__custream s, bool ptsz,
                        mp__curesult *err);
/* Live graph pools the shim made (for the report). */
size_t mp__pl_graph_pools(void);
/* Forgets every capture and graph of pool (retired at a reset, which
 * destroys the graphs' memory with the context): routes ended, graph
 * pools released, so that nothing reaches pool through them and it can
 * be released (mp__pl_devices_release). A later cuGraphDestroy or
 * cuGraphExecDestroy of such a graph finds nothing of the shim's. */
void mp__pl_graphs_forget(const mp__pl_t *pl, mp_pool_t *pool);
/* Whether a capture the program began (cuStreamBeginCapture, its _v2,
 * cuStreamBeginCaptureToGraph, their _ptsz forms) may still be in progress
 * in any thread. While one is, a synchronous allocation is the driver's to
 * answer, and a free is checked with mp__pl_capture_prohibits (the capture
 * modes may prohibit both in this thread: cuda.h,
 * cuThreadExchangeStreamCaptureMode); asking the legacy stream finds only
 * captures of blocking streams. */
bool mp__pl_capture_begun(void);
/* Whether a capture begun through the shim may prohibit a potentially
 * unsafe call (cuMemFree) of this thread, whose capture mode is
 * thread_mode (cuThreadExchangeStreamCaptureMode): false only where the
 * modes of the captures begun and not ended, and the threads that began
 * them, allow it. */
bool mp__pl_capture_prohibits(unsigned thread_mode);
/* Before a cuStreamDestroy of the explicit stream s: whether s began a
 * capture not yet ended, with the id its begin got in *id (*known false:
 * none). */
bool mp__pl_capture_origin(mp__custream s, unsigned long long *id, bool *known);
/* After a cuStreamDestroy that destroyed s while it was capturing (its
 * slots forgotten, routes with them): no capture lists s any longer; if
 * s began the capture whose id is *id (origin, from mp__pl_capture_origin;
 * NULL: no id), that capture is over, as an invalidated one ends. The
 * capture can end nowhere else: "Capture must be ended on the same stream
 * in which it was initiated" (cuda.h, cuStreamBeginCapture), and a
 * destroyed stream's handle is dead (cuda_runtime_api.h, cudaStreamDestroy:
 * \note_destroy_ub, "Use of the handle after this call is undefined
 * behavior" in the Runtime API reference). */
void mp__pl_capture_destroyed(const mp__pl_t *pl, mp__custream s, bool origin,
                              const unsigned long long *id);

/* ---- host.c ------------------------------------------------------------- */

/* Before the real cuDevicePrimaryCtxReset(ordinal) (the page-locked
 * memory the driver handed out in that primary context, write-combined
 * memory or any when the shim does not pool, is forgotten after it, with
 * the device memory: mp__pl_table_forget_real in driver.c). The device's
 * host pool, whose chunks are page-locked memory of that device's primary
 * context, which the reset destroys, is taken away (the other devices'
 * pools stay), its blocks forgotten
 * (mp__pl_table_forget_hostmem) and the pool destroyed while its chunks
 * are still the driver's to take back; the next page-locked allocation
 * makes a new pool, with new chunks. A pool that cannot be destroyed is
 * said on stderr and kept, never used again, until exit. */
void mp__pl_host_reset(const mp__pl_t *pl, int ordinal);
/* After the real cuDevicePrimaryCtxReset(ordinal) has returned, whatever
 * its result, once for each mp__pl_host_reset(pl, ordinal): from that
 * call until this one, a page-locked allocation on the device goes to the
 * driver (no new host pool is made in the context being reset, whose
 * chunks the driver's reset would destroy under the shim). */
void mp__pl_host_reset_done(const mp__pl_t *pl, int ordinal);
/* The report's "host_pool" object (",\n  \"host_pool\": {...}"), nothing
 * when no host pool was made. Blocks freed during a capture that no
 * page-locked call has returned to the pool yet go back first (after a
 * synchronization of the devices) unless a capture is under way. */
void mp__pl_host_report(FILE *f, const mp__pl_t *pl);
/* The runtime's last error (cudaGetLastError, cudaPeekAtLastError) set to
 * r, a failure the shim answered for a runtime call (cudaMalloc*, cudaFree*
 * in runtime.c; cudaMallocHost, cudaHostAlloc, cudaFreeHost here), as the
 * runtime's own call would have left it: a call the runtime refuses the
 * same way and that changes nothing is made (cudaMalloc with a NULL
 * output; cudaMalloc of SIZE_MAX). Only the errors it can raise
 * (cudaErrorInvalidValue, cudaErrorMemoryAllocation); nothing for another
 * one, nor on the host device (no runtime). In host.c, not runtime.c,
 * which calls host.c already (mp__pl_memory_holds). */
void mp__pl_rt_set_last_error(const mp__pl_t *pl, mp__cudaerr r);
/* Before a potentially unsafe call of the shim's own (cuda.h,
 * cuThreadExchangeStreamCaptureMode: the runtime's probes), the calling
 * thread's mode made relaxed (mp__pl_mode_relax: *relaxed, the old mode in
 * *mode, for mp__pl_mode_restore after the call). False, nothing changed,
 * where the switch is refused while a capture is begun
 * (mp__pl_capture_begun): the call must not be made, since in the caller's
 * mode a global-mode capture (the caller's, or another thread's with this
 * one in global mode) prohibits it and the driver invalidates that capture.
 * With no capture begun the call may go ahead in the caller's mode. */
bool mp__pl_own_call_begin(unsigned *mode, bool *relaxed);
/* Whether addr lies in a page-locked host pool's chunks (pool mode);
 * *live then says whether a block the program holds contains it, that
 * block in *b (its range and flags are the block's, not the chunk's). */
bool mp__pl_host_block(const mp__pl_t *pl, uintptr_t addr, mp__pl_block_t *b,
                       bool *live);

/* ---- free.c ------------------------------------------------------------- */

/* Whether stream s (ptsz: of a per-thread call) is being captured, asked
 * of the driver (cuStreamIsCapturing); an error answer counts as yes (the
 * API then decides). Host mode: false. */
bool mp__pl_capturing(const mp__pl_t *pl, mp__custream s, bool ptsz);
/* The calling thread's capture mode made relaxed (cuda.h,
 * cuThreadExchangeStreamCaptureMode), the one it had in *old, for a call
 * of the shim's own that no capture may prohibit or be invalidated by
 * (the runtime's probes); mp__pl_mode_restore(old) puts it back. False
 * (nothing changed) when the driver cannot. */
bool mp__pl_mode_relax(unsigned *old);
void mp__pl_mode_restore(unsigned old);
/* Whether a synchronous call (cuMemAlloc, cudaMalloc, their frees) may meet
 * a capture whose mode prohibits it: one begun through the shim
 * (mp__pl_capture_begun: any stream, blocking or not), or one the legacy
 * stream reports. Such an allocation is the API's to answer. */
bool mp__pl_sync_in_capture(const mp__pl_t *pl);
/* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED .. _WRONG_THREAD (cuda.h), and
 * cudaErrorStreamCaptureUnsupported .. WrongThread (driver_types.h): the
 * same numbers. */
#define MP__CU_CAPTURE_FIRST 900u
#define MP__CU_CAPTURE_LAST  908u

/* A free of a block the shim serves itself (a pool block: cuMemFree,
 * cudaFree, sync; their stream-ordered forms on stream s, ptsz for a
 * per-thread call; a page-locked block of the host pool, sync), which the
 * API would refuse, the block staying the program's:
 *  - from a host function (cuda.h, cuLaunchHostFunc, cuStreamAddCallback:
 *    "must not make any CUDA API calls"), where the driver answers the
 *    free's own capture question (cuStreamIsCapturing of s, or of the
 *    legacy stream when sync) with CUDA_ERROR_NOT_PERMITTED: that, 800
 *    (cudaErrorNotPermitted has the same number); one driver call, the
 *    only one for a stream-ordered free;
 *  - sync, while a capture may prohibit it in this thread (cuda.h,
 *    cuThreadExchangeStreamCaptureMode: "prohibited from potentially
 *    unsafe API calls"): the API refuses such a call with
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 *    (cudaErrorStreamCaptureUnsupported) and invalidates the capture: the
 *    capture error (900..908, the same numbers in CUresult and
 *    cudaError_t) that probe, a real allocation of one byte freed when
 *    allowed, got from the caller's API.
 * 0: the free may go on. *captured (unless NULL): the answer to that
 * question, as mp__pl_capturing gives it (captured, or the question
 * failed), false where the shim runs on the host device; mp__pl_pool_free
 * reads it rather than asking again (before, a stream-ordered free asked
 * three times). */
unsigned mp__pl_free_refused(const mp__pl_t *pl, bool sync, mp__custream s,
                             bool ptsz, unsigned (*probe)(void),
                             bool *captured);

/* Whether the driver refuses every call of this thread now, as it does in
 * a host function (cuda.h, cuLaunchHostFunc and cuStreamAddCallback: "The
 * host function must not make any CUDA API calls. Attempting to use a
 * CUDA API may result in CUDA_ERROR_NOT_PERMITTED"): its cuCtxGetCurrent
 * answers CUDA_ERROR_NOT_PERMITTED (no other failure counts). For the
 * queries the shim answers from its own tables (a pool block's range,
 * a page-locked block's flags), asked only when it would. */
bool mp__pl_calls_refused(void);
/* The answer to a free the shim refuses itself, without the driver (a
 * pointer in a pool's memory that is no block the program holds: a second
 * free, an interior pointer; a page-locked block given to a device free,
 * a device block to a page-locked one): from a host function the driver's
 * refusal of any call there, CUDA_ERROR_NOT_PERMITTED (cudaErrorNotPermitted,
 * the same number), as the driver answers such a free;
 * CUDA_ERROR_INVALID_VALUE otherwise. Asked only on that error path
 * (mp__pl_calls_refused); host mode: always the latter. */
unsigned mp__pl_free_invalid(const mp__pl_t *pl);
/* The refusal of a stream-ordered free (what: the API's call) of a block
 * whose stream the driver could not say is being captured or not (r, its
 * error from cuStreamGetCaptureInfo: mp__pl_capture_route,
 * mp__pl_output_free): MP_EDRIVER with the driver's code and a message
 * that says so; nothing is freed, the block stays as it was. */
mp_status_t mp__pl_capture_unknown(const char *what, mp__curesult r);
/* mp__pl_free_invalid for a free the shim refuses itself, but where the
 * free is synchronous (sync: cuMemFree, cudaFree, cuMemFreeHost,
 * cudaFreeHost), first the refusal a capture makes of it, as
 * mp__pl_free_refused asks (probe: a call of the same kind): the driver
 * refuses a call a capture prohibits whatever its argument (cuda.h,
 * cuThreadExchangeStreamCaptureMode: the thread "is prohibited from
 * potentially unsafe API calls"), and invalidates the capture. */
unsigned mp__pl_free_foreign(const mp__pl_t *pl, bool sync,
                             unsigned (*probe)(void));

/* A free of memory the real driver or runtime handed out (a block of kind
 * MP__PL_FROM_REAL the table's claim gave) is traced (mp__pl_record_free)
 * before the real call: once the driver has the memory back, another
 * thread's allocation of the same address may be traced, and a replay
 * would free the wrong block (as for mp__pl_pool_free). This ends the
 * claim after the call (or a pool's free), and where the free failed
 * (freed false) traces the block live again. */
void mp__pl_free_over(const mp__pl_block_t *b, bool freed);

/* The table's entry of block *p that pool just served for size bytes on
 * stream (mp__pl_table_put_pool): MP_OK. Without host memory for the entry
 * the block goes back to the pool, unused, *p becomes NULL and the answer
 * is MP_ENOMEM: unrecorded, it could never be freed (its free refused as a
 * pointer in the pool's memory the pool never handed out). */
mp_status_t mp__pl_pool_served(mp_pool_t *pool, void **p, size_t size,
                               uintptr_t stream);

/* Frees a pool block the table's claim gave (mp__pl_table_claim): sync
 * (cuMemFree, cudaFree) waits for every stream's work, async on s; traced
 * before the pool has it; the entry dropped when the pool took the block,
 * its claim lifted when it did not (a paused pool).
 * captured: mp__pl_free_refused's *captured for the same call (whether s is
 * being captured, asked once per free). */
mp_status_t mp__pl_pool_free(const mp__pl_t *pl, const mp__pl_block_t *b,
                             bool sync, mp__custream s, bool ptsz,
                             bool captured);

/* ---- lookup.c ----------------------------------------------------------- */

/* The shim's hook for a cuGetProcAddress query the real driver answered
 * with a function, or NULL to keep the driver's answer. */
void *mp__pl_proc_hook(const char *symbol, int cuda_version, uint64_t flags);

#endif /* MEMPOOL_PRELOAD_H */
