/* cuda.c - the cuda backend: the device shim on NVIDIA's driver API.
 *
 * libcuda.so.1 is opened with dlopen the first time a "cuda" device is
 * opened, never linked, so mempool builds, loads and runs on machines without
 * a GPU. Only cuGetProcAddress is found with dlsym; every other entry point
 * comes from it at an explicit CUDA version (MP__CUDA_ABI, or the driver's own
 * version when that is older), so the driver hands back exactly the ABI this
 * file is written against (cuMemAlloc_v2, cuStreamDestroy_v2, ...) whatever
 * toolkit or driver is installed. Loading and cuInit happen once per process;
 * their outcome, and its message, is kept and repeated to later opens.
 *
 * A device works on its GPU's primary context, retained on open and released
 * on close, so its memory and streams are shared with CUDA runtime users.
 * Every call pushes that context around its driver calls, so it targets the
 * device the handle was opened on whatever the calling thread has current.
 *
 * Invariant: every driver object a device made and has not given back
 * (allocations, page-locked host memory, address reservations, mapped chunks
 * with their physical handles, physical handles no mapping holds whose
 * cuMemRelease the driver refused, streams, events) is in one of the
 * device's maps. Frees of foreign or stale pointers are refused before the
 * driver sees them, a chunk is unmapped with exactly the handle that backs
 * it, and close releases whatever the caller left behind, reporting the
 * first release the driver refuses while it still releases the rest. */
#include "backend.h"

#if MEMPOOL_HAVE_CUDA

#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The CUDA version whose ABI every entry point is resolved at. */
#define MP__CUDA_ABI 12000

/* X(field, parameter list): the driver entry points this file uses, by base
 * name without the "cu" prefix (cuGetProcAddress wants base names; the
 * version picks the _v2 variants). */
#define MP__CUDA_CORE_API(X)                                                   \
  X(GetErrorName, (CUresult, const char **))                                   \
  X(GetErrorString, (CUresult, const char **))                                 \
  X(Init, (unsigned))                                                          \
  X(DeviceGetCount, (int *))                                                   \
  X(DeviceGet, (CUdevice *, int))                                              \
  X(DeviceGetName, (char *, int, CUdevice))                                    \
  X(DeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                 \
  X(DevicePrimaryCtxRetain, (CUcontext *, CUdevice))                           \
  X(DevicePrimaryCtxRelease, (CUdevice))                                       \
  X(CtxPushCurrent, (CUcontext))                                               \
  X(CtxPopCurrent, (CUcontext *))                                              \
  X(CtxGetDevice, (CUdevice *))                                                \
  X(CtxSynchronize, (void))                                                    \
  X(MemGetInfo, (size_t *, size_t *))                                          \
  X(MemAlloc, (CUdeviceptr *, size_t))                                         \
  X(MemFree, (CUdeviceptr))                                                    \
  X(MemHostAlloc, (void **, size_t, unsigned))                                 \
  X(MemFreeHost, (void *))                                                     \
  X(StreamCreate, (CUstream *, unsigned))                                      \
  X(StreamDestroy, (CUstream))                                                 \
  X(StreamSynchronize, (CUstream))                                             \
  X(StreamQuery, (CUstream))                                                   \
  X(StreamGetFlags, (CUstream, unsigned *))                                    \
  X(StreamIsCapturing, (CUstream, CUstreamCaptureStatus *))                    \
  X(LaunchHostFunc, (CUstream, CUhostFn, void *))                              \
  X(MemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                 \
  X(MemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))             \
  X(EventCreate, (CUevent *, unsigned))                                        \
  X(EventDestroy, (CUevent))                                                   \
  X(EventRecord, (CUevent, CUstream))                                          \
  X(EventQuery, (CUevent))                                                     \
  X(EventSynchronize, (CUevent))                                               \
  X(StreamWaitEvent, (CUstream, CUevent, unsigned))                            \
  X(ThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *))

/* Virtual memory management: optional; without it vm_* is MP_ENOTSUP. */
#define MP__CUDA_VMM_API(X)                                                    \
  X(MemGetAllocationGranularity,                                               \
    (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)) \
  X(MemAddressReserve,                                                         \
    (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))          \
  X(MemAddressFree, (CUdeviceptr, size_t))                                     \
  X(MemCreate, (CUmemGenericAllocationHandle *, size_t,                        \
                const CUmemAllocationProp *, unsigned long long))              \
  X(MemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,        \
             unsigned long long))                                              \
  X(MemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))      \
  X(MemUnmap, (CUdeviceptr, size_t))                                           \
  X(MemRelease, (CUmemGenericAllocationHandle))

/* IPC: optional; without it ipc_* is MP_ENOTSUP. */
#define MP__CUDA_IPC_API(X)                                                    \
  X(IpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr))                          \
  X(IpcOpenMemHandle, (CUdeviceptr *, CUipcMemHandle, unsigned))               \
  X(IpcCloseMemHandle, (CUdeviceptr))                                          \
  X(MemGetAddressRange, (CUdeviceptr *, size_t *, CUdeviceptr))                \
  X(MemExportToShareableHandle,                                                \
    (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,          \
     unsigned long long))                                                      \
  X(MemImportFromShareableHandle,                                              \
    (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))

/* A stream's context: optional; without it a stream of another context is
 * not told apart (mp__cuda_stream_kind). */
#define MP__CUDA_CTX_API(X) X(StreamGetCtx, (CUstream, CUcontext *))

/* A capture's id (the _v2 signature at MP__CUDA_ABI): optional; without it
 * a capture is known by its status only (mp__cuda_stream_capture_id). */
#define MP__CUDA_CAPTURE_API(X)                                                \
  X(StreamGetCaptureInfo, (CUstream, CUstreamCaptureStatus *, cuuint64_t *,    \
                           CUgraph *, const CUgraphNode **, size_t *))

/* User objects, to learn when a captured graph goes: optional; without
 * them capture_on_release is MP_ENOTSUP. */
#define MP__CUDA_UOBJ_API(X)                                                   \
  X(UserObjectCreate, (CUuserObject *, void *, CUhostFn, unsigned, unsigned))  \
  X(UserObjectRelease, (CUuserObject, unsigned))                               \
  X(GraphRetainUserObject, (CUgraph, CUuserObject, unsigned, unsigned))

typedef struct mp__cuda_api {
#define MP__CUDA_FIELD(f, args) CUresult(*f) args;
  MP__CUDA_CORE_API(MP__CUDA_FIELD)
  MP__CUDA_VMM_API(MP__CUDA_FIELD)
  MP__CUDA_IPC_API(MP__CUDA_FIELD)
  MP__CUDA_CTX_API(MP__CUDA_FIELD)
  MP__CUDA_CAPTURE_API(MP__CUDA_FIELD)
  MP__CUDA_UOBJ_API(MP__CUDA_FIELD)
#undef MP__CUDA_FIELD
  bool has_vmm;  /* every MP__CUDA_VMM_API entry point resolved */
  bool has_ipc;  /* every MP__CUDA_IPC_API entry point resolved */
  bool has_uobj; /* every MP__CUDA_UOBJ_API entry point resolved */
} mp__cuda_api_t;

typedef struct mp__cuda_sym {
  const char *name;
  size_t offset;
} mp__cuda_sym_t;

#define MP__CUDA_SYM(f, args) {"cu" #f, offsetof(mp__cuda_api_t, f)},
static const mp__cuda_sym_t mp__cuda_core_syms[] = {
    MP__CUDA_CORE_API(MP__CUDA_SYM)};
static const mp__cuda_sym_t mp__cuda_vmm_syms[] = {
    MP__CUDA_VMM_API(MP__CUDA_SYM)};
static const mp__cuda_sym_t mp__cuda_ipc_syms[] = {
    MP__CUDA_IPC_API(MP__CUDA_SYM)};
static const mp__cuda_sym_t mp__cuda_ctx_syms[] = {
    MP__CUDA_CTX_API(MP__CUDA_SYM)};
static const mp__cuda_sym_t mp__cuda_capture_syms[] = {
    MP__CUDA_CAPTURE_API(MP__CUDA_SYM)};
static const mp__cuda_sym_t mp__cuda_uobj_syms[] = {
    MP__CUDA_UOBJ_API(MP__CUDA_SYM)};
#undef MP__CUDA_SYM

/* Written once under mp__cuda_once, read-only afterwards. */
static pthread_once_t mp__cuda_once = PTHREAD_ONCE_INIT;
static mp__cuda_api_t mp__cu;
static mp_status_t mp__cuda_load_status;
static char mp__cuda_load_msg[384];
static CUresult mp__cuda_load_cu; /* cuInit's refusal, else 0 */

/* ---- errors -------------------------------------------------------------- */

static mp_status_t mp__cuda_status_of(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return MP_OK;
  case CUDA_ERROR_OUT_OF_MEMORY: return MP_ENOMEM;
  case CUDA_ERROR_NO_DEVICE: return MP_ENODEV;
  case CUDA_ERROR_NOT_READY: return MP_EBUSY;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE: return MP_EINVAL;
  case CUDA_ERROR_NOT_SUPPORTED: return MP_ENOTSUP;
  /* A call the driver does not permit as it was made: from a host
   * function ("Attempting to use a CUDA API may result in
   * CUDA_ERROR_NOT_PERMITTED", cuLaunchHostFunc), which the host device
   * refuses with MP_EINVAL (host.c): one status for one mistake on both
   * backends. cuda.h lists it for some virtual memory calls too
   * (cuMemCreate, cuMemMap, cuMemExportToShareableHandle with a handle
   * type the allocation was not made for, ...): a request the call does
   * not allow, MP_EINVAL as well; nothing in the library tells the two
   * apart, and the message names the driver's error. */
  case CUDA_ERROR_NOT_PERMITTED: return MP_EINVAL;
  default: return MP_EDRIVER;
  }
}

/* The names of the errors mp__cuda_status_of maps, for a driver that
 * cannot name them itself: cuGetErrorName is a driver call too, refused
 * from a host function. */
static const char *mp__cuda_known_name(CUresult r) {
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
  case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
  case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
  case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
  case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
  case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
  case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
  default: return "unknown CUDA error";
  }
}

/* "<what>: CUDA_ERROR_X (the driver's sentence)" into buf. */
static void mp__cuda_describe(char *buf, size_t cap, CUresult r,
                              const char *what) {
  const char *name = NULL, *str = NULL;
  if (mp__cu.GetErrorName == NULL || mp__cu.GetErrorName(r, &name) != 0 ||
      name == NULL)
    name = mp__cuda_known_name(r);
  if (mp__cu.GetErrorString == NULL || mp__cu.GetErrorString(r, &str) != 0 ||
      str == NULL)
    str = "no description";
  snprintf(buf, cap, "%s: %s (%d: %s)", what, name, (int)r, str);
}

/* Whether this thread's last cuCtxPushCurrent (mp__cuda_push) was refused:
 * the r an MP__CU_IN_CTX hands on is then the push's answer, not the
 * call's, and mp__cuda_fail names cuCtxPushCurrent (the call that failed)
 * after what it was for. Read and cleared by mp__cuda_fail; cleared by every
 * push that succeeds and by the paths that take a refused push as an answer
 * without a message (mp__cuda_no_push). */
static _Thread_local bool mp__cuda_push_refused;

static void mp__cuda_no_push(void) {
  mp__cuda_push_refused = false;
}

/* A restore of this thread's capture mode (mp__cuda_unrelax) the driver
 * refused after a call that failed: its answer, and the mode it was to
 * restore, for that call's message (mp__cuda_fail) to tell; 0: none. */
static _Thread_local CUresult mp__cuda_unrestored;
static _Thread_local CUstreamCaptureMode mp__cuda_unrestored_mode;

static const char *mp__cuda_mode_name(CUstreamCaptureMode m) {
  switch (m) {
  case CU_STREAM_CAPTURE_MODE_GLOBAL: return "global";
  case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "thread-local";
  case CU_STREAM_CAPTURE_MODE_RELAXED: return "relaxed";
  default: return "unknown";
  }
}

/* "; and cuThreadExchangeStreamCaptureMode, restoring ..." into buf, for a
 * restore refused with x (mode: the thread's own mode, not restored). */
static void mp__cuda_describe_unrestored(char *buf, size_t cap, CUresult x,
                                         CUstreamCaptureMode mode) {
  char what[160];
  snprintf(what, sizeof what,
           "cuThreadExchangeStreamCaptureMode, restoring the thread's %s "
           "capture mode",
           mp__cuda_mode_name(mode));
  mp__cuda_describe(buf, cap, x, what);
}

/* "; and cuThreadExchangeStreamCaptureMode ...: the thread is left ..."
 * into buf where a restore was refused after the failing call
 * (mp__cuda_unrestored), which it takes; else "". */
static const char *mp__cuda_take_unrestored(char *buf, size_t cap) {
  buf[0] = '\0';
  if (mp__cuda_unrestored == CUDA_SUCCESS)
    return buf;
  char mode[224];
  mp__cuda_describe_unrestored(mode, sizeof mode, mp__cuda_unrestored,
                               mp__cuda_unrestored_mode);
  mp__cuda_unrestored = CUDA_SUCCESS;
  snprintf(buf, cap,
           "; and %s: the thread is left in relaxed capture mode "
           "(cuThreadExchangeStreamCaptureMode sets it back)",
           mode);
  return buf;
}

/* Fails with the status r maps to and a message naming the call; r itself
 * for mp_last_driver_error(). A refused push (mp__cuda_push_refused) is
 * named as the call that failed; a refused restore of the thread's capture
 * mode (mp__cuda_unrestored) is told after. */
static mp_status_t mp__cuda_fail(CUresult r, const char *fmt, ...)
    MP__PRINTF(2, 3);
static mp_status_t mp__cuda_fail(CUresult r, const char *fmt, ...) {
  char what[224], msg[384], mode[384];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (mp__cuda_push_refused && n >= 0 && (size_t)n < sizeof what)
    snprintf(what + n, sizeof what - (size_t)n, ": cuCtxPushCurrent");
  mp__cuda_push_refused = false;
  mp__cuda_describe(msg, sizeof msg, r, what);
  return mp__fail_driver((int)r, mp__cuda_status_of(r), "%s%s", msg,
                         mp__cuda_take_unrestored(mode, sizeof mode));
}

/* ---- loading the driver -------------------------------------------------- */

typedef CUresult (*mp__proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
typedef CUresult (*mp__proc_v1_fn)(const char *, void **, int, cuuint64_t);

static void mp__cuda_load_fail(mp_status_t st, const char *fmt, ...)
    MP__PRINTF(2, 3);
static void mp__cuda_load_fail(mp_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(mp__cuda_load_msg, sizeof mp__cuda_load_msg, fmt, ap);
  va_end(ap);
  mp__cuda_load_status = st;
}

/* Resolves syms into mp__cu; false (with *missing set) if one is absent. */
static bool mp__cuda_resolve(mp__proc_v2_fn get_v2, mp__proc_v1_fn get_v1,
                             int version, const mp__cuda_sym_t *syms, size_t n,
                             const char **missing) {
  /* The legacy default stream for NULL: mempool's own streams are
   * non-blocking, so NULL is just one more stream, as on the host backend. */
  const cuuint64_t flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  for (size_t i = 0; i < n; i++) {
    void *fn = NULL;
    CUresult r = get_v2 ? get_v2(syms[i].name, &fn, version, flags, NULL)
                        : get_v1(syms[i].name, &fn, version, flags);
    if (r != CUDA_SUCCESS || fn == NULL) {
      *missing = syms[i].name;
      return false;
    }
    /* Function pointers travel as void * through cuGetProcAddress, as
     * through dlsym; POSIX guarantees they have the same representation. */
    memcpy((char *)&mp__cu + syms[i].offset, &fn, sizeof fn);
  }
  return true;
}

static void mp__cuda_load(void) {
  mp__cuda_load_status = MP_OK;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *why = dlerror();
    mp__cuda_load_fail(MP_ENODEV,
                       "device 'cuda': no CUDA driver (cannot load "
                       "libcuda.so.1: %s)",
                       why ? why : "unknown reason");
    return;
  }
  /* The library stays loaded for the life of the process, as the CUDA
   * runtime keeps it: driver threads and callbacks may still run from it. */
  mp__proc_v2_fn get_v2 = NULL;
  mp__proc_v1_fn get_v1 = NULL;
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  if (sym != NULL)
    memcpy(&get_v2, &sym, sizeof sym);
  else if ((sym = dlsym(lib, "cuGetProcAddress")) != NULL)
    memcpy(&get_v1, &sym, sizeof sym);
  else {
    mp__cuda_load_fail(MP_ENODEV,
                       "device 'cuda': libcuda.so.1 has no cuGetProcAddress "
                       "(the driver is older than CUDA 11.3)");
    return;
  }

  /* Ask for the driver's own version when it is older than the ABI this
   * file targets: cuGetProcAddress refuses versions newer than the driver,
   * and every entry point used here kept its ABI since 11.3. */
  int version = MP__CUDA_ABI, drv = 0;
  void *fn = NULL;
  CUresult r = get_v2 ? get_v2("cuDriverGetVersion", &fn, 2020, 0, NULL)
                      : get_v1("cuDriverGetVersion", &fn, 2020, 0);
  if (r == CUDA_SUCCESS && fn != NULL) {
    CUresult (*get_version)(int *);
    memcpy(&get_version, &fn, sizeof fn);
    if (get_version(&drv) == CUDA_SUCCESS && drv > 0 && drv < version)
      version = drv;
  }

  const char *missing = NULL;
  if (!mp__cuda_resolve(get_v2, get_v1, version, mp__cuda_core_syms,
                        sizeof mp__cuda_core_syms / sizeof *mp__cuda_core_syms,
                        &missing)) {
    memset(&mp__cu, 0, sizeof mp__cu);
    mp__cuda_load_fail(MP_EDRIVER,
                       "device 'cuda': the CUDA driver (version %d) has no "
                       "usable %s at CUDA version %d",
                       drv, missing, version);
    return;
  }
  mp__cu.has_vmm = mp__cuda_resolve(
      get_v2, get_v1, version, mp__cuda_vmm_syms,
      sizeof mp__cuda_vmm_syms / sizeof *mp__cuda_vmm_syms, &missing);
  mp__cu.has_ipc = mp__cuda_resolve(
      get_v2, get_v1, version, mp__cuda_ipc_syms,
      sizeof mp__cuda_ipc_syms / sizeof *mp__cuda_ipc_syms, &missing);
  if (!mp__cuda_resolve(get_v2, get_v1, version, mp__cuda_ctx_syms,
                        sizeof mp__cuda_ctx_syms / sizeof *mp__cuda_ctx_syms,
                        &missing))
    mp__cu.StreamGetCtx = NULL;
  if (!mp__cuda_resolve(get_v2, get_v1, version, mp__cuda_capture_syms,
                        sizeof mp__cuda_capture_syms /
                            sizeof *mp__cuda_capture_syms,
                        &missing))
    mp__cu.StreamGetCaptureInfo = NULL;
  mp__cu.has_uobj = mp__cuda_resolve(
      get_v2, get_v1, version, mp__cuda_uobj_syms,
      sizeof mp__cuda_uobj_syms / sizeof *mp__cuda_uobj_syms, &missing);

  r = mp__cu.Init(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    mp__cuda_load_fail(MP_ENODEV,
                       "device 'cuda': the driver sees no CUDA-capable device "
                       "(cuInit: CUDA_ERROR_NO_DEVICE)");
  } else if (r != CUDA_SUCCESS) {
    char msg[320];
    mp__cuda_describe(msg, sizeof msg, r, "cuInit");
    mp__cuda_load_cu = r;
    mp__cuda_load_fail(MP_EDRIVER,
                       "device 'cuda': the CUDA driver failed to "
                       "initialise: %s",
                       msg);
  }
}

/* ---- address maps -------------------------------------------------------- */

/* An entry of the device's address maps (mp__ptrmap_t, see ptrmap.c). */
typedef struct mp__cuda_entry {
  uintptr_t key;
  size_t size;
  CUmemGenericAllocationHandle handle; /* chunks: the physical memory */
} mp__cuda_entry_t;

/* ---- the device ---------------------------------------------------------- */

typedef struct mp__cuda_dev {
  CUdevice cudev;
  int ordinal;
  int count;     /* the devices the driver sees (cuDeviceGetCount at open) */
  CUcontext ctx; /* the primary context, retained */
  bool vmm;
  size_t granularity;
  CUmemAllocationProp prop; /* pinned memory on this device */
  pthread_mutex_t lock;     /* guards the maps and pending */
  mp__ptrmap_t allocs, hosts, reserves, chunks, streams, events;
  /* Entries the maps keep room for (mp__cuda_room, mp__cuda_claim): one
   * for each object the driver is making or giving back right now. */
  size_t pending;
  /* Physical handles (the key: the handle) that no mapping holds any more
   * and whose cuMemRelease the driver refused: alive until released (cuda.h,
   * cuMemRelease: the memory is freed once "all outstanding references to
   * the handle" are released), so kept for close to release. */
  mp__ptrmap_t handles;
} mp__cuda_dev_t;

static mp__cuda_dev_t *mp__cuda_of(mp_device_t *dev) {
  return (mp__cuda_dev_t *)dev->impl;
}

/* Makes the device's context current for the calls that follow; a refusal
 * is remembered for the message (mp__cuda_push_refused). */
static CUresult mp__cuda_push(const mp__cuda_dev_t *cd) {
  CUresult r = mp__cu.CtxPushCurrent(cd->ctx);
  mp__cuda_push_refused = r != CUDA_SUCCESS;
  return r;
}

static void mp__cuda_pop(void) {
  CUcontext ignored;
  (void)mp__cu.CtxPopCurrent(&ignored);
}

/* Driver allocation and mapping calls (cuMemAlloc, cuMemFree, cuMemCreate,
 * cuMemMap, cuMemUnmap, cuMemHostAlloc, cuMemFreeHost, the address
 * reservations, the IPC calls that share, open or close memory, and the
 * undoing of any of them after a failure) are made in this thread's relaxed
 * capture mode: under the default (global) mode a "potentially
 * unsafe" call fails and invalidates a capture another thread has underway
 * (cuda.h, cuThreadExchangeStreamCaptureMode). A pool growing or shrinking for
 * one thread must not break another's capture; PyTorch's caching allocator
 * likewise allocates in relaxed mode. None of it is part of any capture.
 * So are the waits and queries of streams and events (cuStreamSynchronize,
 * cuStreamQuery, cuEventSynchronize, cuEventQuery), which the pool makes to
 * learn whether a freed block's work is done: on an H200 (driver
 * 580.159.04, 2026-11-28) each of them, made in global mode on a stream or
 * event outside the capture while another thread captured in global mode,
 * failed with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidated that
 * capture (gpu_cuda_graph_pool failed so); in relaxed mode they succeeded
 * and the capture held (PyTorch queries its events in relaxed mode for the
 * same reason). The fake models the rule for all of these; the virtual
 * memory calls were seen safe in global mode on that driver, but cuda.h
 * exempts none of them, and the fake refuses them too (FK_UNSAFE_VMM). */
typedef struct mp__cuda_relaxed {
  CUstreamCaptureMode mode;
  bool swapped;
} mp__cuda_relaxed_t;

static mp__cuda_relaxed_t mp__cuda_relax(void) {
  mp__cuda_unrestored = CUDA_SUCCESS; /* an earlier call's, told or not */
  mp__cuda_relaxed_t r = {.mode = CU_STREAM_CAPTURE_MODE_RELAXED};
  r.swapped = mp__cu.ThreadExchangeStreamCaptureMode(&r.mode) == CUDA_SUCCESS;
  return r;
}

/* Gives the thread back the mode mp__cuda_relax took; the driver's answer
 * (CUDA_SUCCESS where nothing was taken). */
static CUresult mp__cuda_restore(const mp__cuda_relaxed_t *r) {
  CUstreamCaptureMode mode = r->mode;
  return r->swapped ? mp__cu.ThreadExchangeStreamCaptureMode(&mode)
                    : CUDA_SUCCESS;
}

/* mp__cuda_restore after the calls it was relaxed for (failed: whether
 * they failed). A refused restore leaves the thread relaxed, a mode it did
 * not choose, in which its own captures no longer stop the unsafe calls of
 * other threads (cuda.h, cuThreadExchangeStreamCaptureMode): never
 * silently. After calls that failed, the failure's message tells it
 * (mp__cuda_fail or mp__cuda_take_unrestored, which follows). After calls
 * that succeeded (or answered not ready, which is no failure),
 * what it made or gave back is done and must be the caller's (failing it
 * would lose an allocation, or have a free retried), so the call still
 * succeeds, and the restore's refusal is the thread's last error, with its
 * driver code: the one way to say it, and the caller can set its mode back
 * itself. */
static void mp__cuda_unrelax_after(const mp__cuda_relaxed_t *r, bool failed) {
  CUresult x = mp__cuda_restore(r);
  if (x == CUDA_SUCCESS)
    return;
  if (failed) {
    mp__cuda_unrestored = x;
    mp__cuda_unrestored_mode = r->mode;
    return;
  }
  char msg[224];
  mp__cuda_describe_unrestored(msg, sizeof msg, x, r->mode);
  (void)mp__fail_driver((int)x, MP_EDRIVER,
                        "%s: the thread is left in relaxed capture mode "
                        "(cuThreadExchangeStreamCaptureMode sets it back); "
                        "the call it was relaxed for succeeded",
                        msg);
}

/* mp__cuda_unrelax_after a call that answered call_r. */
static void mp__cuda_unrelax(const mp__cuda_relaxed_t *r, CUresult call_r) {
  mp__cuda_unrelax_after(r, call_r != CUDA_SUCCESS &&
                                call_r != CUDA_ERROR_NOT_READY);
}

/* r = call, made with cd's context current (r is the push's failure if the
 * context cannot be made current). */
#define MP__CU_IN_CTX(cd, r, call)                                             \
  do {                                                                         \
    (r) = mp__cuda_push(cd);                                                   \
    if ((r) == CUDA_SUCCESS) {                                                 \
      (r) = (call);                                                            \
      mp__cuda_pop();                                                          \
    }                                                                          \
  } while (0)
/* The same in this thread's relaxed capture mode (mp__cuda_relax below). */
#define MP__CU_IN_CTX_RELAXED(cd, r, call)                                     \
  do {                                                                         \
    mp__cuda_relaxed_t rx_ = mp__cuda_relax();                                 \
    MP__CU_IN_CTX(cd, r, call);                                                \
    mp__cuda_unrelax(&rx_, (r));                                               \
  } while (0)

/* Tracking never fails once the driver has acted: an object it made must be
 * in a map (or close would not release it), and one whose release it
 * refused must go back in (or it would be forgotten while alive), but a
 * driver that refuses the undoing free cannot be made to take it back, nor
 * can a refused release be undone. So the room is taken before the driver
 * call: mp__cuda_room before an object is made (without host memory,
 * MP_ENOMEM with nothing made), mp__cuda_claim as it is given back (the
 * entry's own room kept), each ended by one mp__cuda_settle. Invariant,
 * for every map m: m's entries plus the pending entries of m take at most
 * half its slots, so that mp__ptrmap_put never grows a map (cd->pending,
 * the pending entries of every map, bounds m's). */
static bool mp__cuda_room(mp__cuda_dev_t *cd, mp__ptrmap_t *m) {
  pthread_mutex_lock(&cd->lock);
  bool ok = mp__ptrmap_reserve(m, cd->pending + 1);
  if (ok)
    cd->pending++;
  pthread_mutex_unlock(&cd->lock);
  return ok;
}

/* Takes key's entry out of m into *out (a racing second free of it finds
 * nothing), keeping its room; false when m has no such entry. */
static bool mp__cuda_claim(mp__cuda_dev_t *cd, mp__ptrmap_t *m, uintptr_t key,
                           mp__cuda_entry_t *out) {
  pthread_mutex_lock(&cd->lock);
  bool found = mp__ptrmap_take(m, key, out);
  if (found)
    cd->pending++;
  pthread_mutex_unlock(&cd->lock);
  return found;
}

/* Ends an mp__cuda_room or mp__cuda_claim: keep (an object the driver made
 * or refused to give back) goes into m, in the room kept for it; NULL:
 * nothing does. Cannot fail. */
static void mp__cuda_settle(mp__cuda_dev_t *cd, mp__ptrmap_t *m,
                            const mp__cuda_entry_t *keep) {
  pthread_mutex_lock(&cd->lock);
  cd->pending--;
  if (keep != NULL) {
    mp__cuda_entry_t *e = mp__ptrmap_put(m, keep->key);
    MP__ASSERT(e != NULL); /* a driver object's address, in kept room */
    if (e != NULL) {
      e->size = keep->size;
      e->handle = keep->handle;
    }
  }
  pthread_mutex_unlock(&cd->lock);
}

/* Tracks what a refused cleanup leaves with the driver (a reservation
 * whose cuMemAddressFree was refused after what it held was unmapped, an
 * imported handle whose cuMemRelease was refused), so that close gives it
 * back. Best effort: without host memory for its entry
 * it is left to the context, as before. */
static void mp__cuda_track_left(mp__cuda_dev_t *cd, mp__ptrmap_t *m,
                                const mp__cuda_entry_t *e) {
  if (mp__cuda_room(cd, m))
    mp__cuda_settle(cd, m, e);
}

/* What mp__cuda_settle keeps of an object the driver was asked to make:
 * the object where it made one (r), else nothing. */
#define MP__CUDA_MADE(r, k, sz, h)                                             \
  ((r) == CUDA_SUCCESS ? &(mp__cuda_entry_t){.key = (uintptr_t)(k),            \
                                             .size = (sz),                     \
                                             .handle = (h)}                    \
                       : NULL)

/* Keeps h, a physical handle that no mapping holds and whose cuMemRelease
 * the driver refused (0: none), in cd->handles for close to release; ends
 * an mp__cuda_room of cd->handles. */
static void mp__cuda_settle_handle(mp__cuda_dev_t *cd,
                                   CUmemGenericAllocationHandle h) {
  _Static_assert(sizeof h <= sizeof(uintptr_t), "a handle is a map key");
  mp__cuda_settle(cd, &cd->handles,
                  h != 0 ? &(mp__cuda_entry_t){.key = (uintptr_t)h, .handle = h}
                         : NULL);
}

/* What close met: the driver calls it saw refused, the first one's answer
 * and what it was asked (for the close's message). */
typedef struct mp__cuda_refusals {
  size_t n;
  CUresult first;
  char what[96];
} mp__cuda_refusals_t;

static void mp__cuda_refused(mp__cuda_refusals_t *f, CUresult r,
                             const char *call, uintptr_t obj) {
  if (r == CUDA_SUCCESS)
    return;
  if (f->n++ == 0) {
    f->first = r;
    snprintf(f->what, sizeof f->what, "%s(%#llx)", call,
             (unsigned long long)obj);
  }
}

/* Gives one tracked object back to the driver; close's cleanup, which
 * goes on past a refusal (f counts it): what the driver refuses to take
 * back stays the context's, everything else is still released. */
typedef void (*mp__cuda_release_fn)(const mp__cuda_entry_t *e,
                                    mp__cuda_refusals_t *f);

static void mp__cuda_release_stream(const mp__cuda_entry_t *e,
                                    mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.StreamDestroy((CUstream)e->key), "cuStreamDestroy",
                   e->key);
}
static void mp__cuda_release_event(const mp__cuda_entry_t *e,
                                   mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.EventDestroy((CUevent)e->key), "cuEventDestroy",
                   e->key);
}
/* The handle is released even where the unmap is refused: "The generic
 * memory handle can be freed when there are still outstanding mappings
 * made with this handle" (cuda.h, cuMemRelease); the memory goes with the
 * mapping, whenever that does. */
static void mp__cuda_release_chunk(const mp__cuda_entry_t *e,
                                   mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.MemUnmap((CUdeviceptr)e->key, e->size),
                   "cuMemUnmap", e->key);
  mp__cuda_refused(f, mp__cu.MemRelease(e->handle), "cuMemRelease",
                   (uintptr_t)e->handle);
}
static void mp__cuda_release_handle(const mp__cuda_entry_t *e,
                                    mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.MemRelease(e->handle), "cuMemRelease",
                   (uintptr_t)e->handle);
}
static void mp__cuda_release_reserve(const mp__cuda_entry_t *e,
                                     mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.MemAddressFree((CUdeviceptr)e->key, e->size),
                   "cuMemAddressFree", e->key);
}
static void mp__cuda_release_alloc(const mp__cuda_entry_t *e,
                                   mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.MemFree((CUdeviceptr)e->key), "cuMemFree", e->key);
}
static void mp__cuda_release_host(const mp__cuda_entry_t *e,
                                  mp__cuda_refusals_t *f) {
  mp__cuda_refused(f, mp__cu.MemFreeHost((void *)e->key), "cuMemFreeHost",
                   e->key);
}

static void mp__cuda_drain(mp__ptrmap_t *m, mp__cuda_release_fn release,
                           mp__cuda_refusals_t *f) {
  for (size_t i = 0; i < m->cap; i++) {
    const mp__cuda_entry_t *e = mp__ptrmap_at(m, i);
    if (e != NULL)
      release(e, f);
  }
  mp__ptrmap_destroy(m);
}

/* No wait here: mp_device_close waited for the device's work first
 * (close_ready: mp__cuda_close_ready), and closes nothing where that wait
 * is refused (from a host function, CUDA_ERROR_NOT_PERMITTED; beside a
 * capture, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): going on then unmapped
 * and freed memory that work still queued may use, and, from a host
 * function, freed the device while every driver call was refused.
 * Past that wait the close always completes: each destroy, unmap, release
 * and free is asked for, whatever the driver answered the ones before
 * (cuda.h lists CUDA_ERROR_INVALID_VALUE, _NOT_PERMITTED,
 * _DEINITIALIZED, ... for each), and a refusal is the close's status
 * (MP_EDRIVER with the driver's code: the device was fine, the driver kept
 * something; mp_device_close_checked gives it), its message naming the first
 * one refused and counting the others: what it names stays the context's until
 * the context goes (a primary context no one else retains goes with the release
 * below). */
static mp_status_t mp__cuda_close(mp_device_t *dev) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  mp__cuda_refusals_t f = {0};
  mp_status_t st = MP_OK;
  mp__cuda_relaxed_t rx = mp__cuda_relax();
  CUresult r = mp__cuda_push(cd);
  mp__cuda_refused(&f, r, "cuCtxPushCurrent", (uintptr_t)cd->ctx);
  mp__cuda_no_push(); /* named here */
  if (r == CUDA_SUCCESS) {
    /* Chunks before the reservations they sit in. */
    mp__cuda_drain(&cd->streams, mp__cuda_release_stream, &f);
    mp__cuda_drain(&cd->events, mp__cuda_release_event, &f);
    mp__cuda_drain(&cd->chunks, mp__cuda_release_chunk, &f);
    mp__cuda_drain(&cd->handles, mp__cuda_release_handle, &f);
    mp__cuda_drain(&cd->reserves, mp__cuda_release_reserve, &f);
    mp__cuda_drain(&cd->allocs, mp__cuda_release_alloc, &f);
    mp__cuda_drain(&cd->hosts, mp__cuda_release_host, &f);
    mp__cuda_pop();
  }
  /* A refused restore is one more refusal the close reports: the device
   * is closed, but the thread is left relaxed. */
  mp__cuda_refused(&f, mp__cuda_restore(&rx),
                   "cuThreadExchangeStreamCaptureMode", (uintptr_t)rx.mode);
  mp__cuda_refused(&f, mp__cu.DevicePrimaryCtxRelease(cd->cudev),
                   "cuDevicePrimaryCtxRelease", (uintptr_t)cd->cudev);
  if (f.n > 0) {
    char msg[384];
    mp__cuda_describe(msg, sizeof msg, f.first, f.what);
    st = mp__fail_driver((int)f.first, MP_EDRIVER,
                         "mp_device_close(%s): the driver refused %s "
                         "(%zu refusal%s in all)%s; the device is closed",
                         dev->name, msg, f.n, f.n == 1 ? "" : "s",
                         r != CUDA_SUCCESS ? ", so nothing it held was given "
                                             "back"
                                           : ", everything else was given "
                                             "back");
  }
  mp__ptrmap_destroy(&cd->streams);
  mp__ptrmap_destroy(&cd->events);
  mp__ptrmap_destroy(&cd->chunks);
  mp__ptrmap_destroy(&cd->handles);
  mp__ptrmap_destroy(&cd->reserves);
  mp__ptrmap_destroy(&cd->allocs);
  mp__ptrmap_destroy(&cd->hosts);
  pthread_mutex_destroy(&cd->lock);
  free(cd);
  dev->impl = NULL;
  return st;
}

/* Virtual memory is optional: anything missing leaves cd->vmm false. */
static void mp__cuda_probe_vmm(mp__cuda_dev_t *cd) {
  int supported = 0;
  if (!mp__cu.has_vmm ||
      mp__cu.DeviceGetAttribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
          cd->cudev) != CUDA_SUCCESS ||
      !supported)
    return;
  memset(&cd->prop, 0, sizeof cd->prop);
  cd->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  cd->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  cd->prop.location.id = cd->ordinal;
  /* What users do with device memory, where the device can: share it
   * with another process by a POSIX file descriptor (IPC), and register
   * it for GPUDirect RDMA (cuda.h: CUmemAllocationProp). A device without
   * them gets plain memory. */
  int fd = 0, rdma = 0;
  if (mp__cu.DeviceGetAttribute(
          &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
          cd->cudev) == CUDA_SUCCESS &&
      fd)
    cd->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (mp__cu.DeviceGetAttribute(
          &rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
          cd->cudev) == CUDA_SUCCESS &&
      rdma)
    cd->prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t g = 0;
  if (mp__cu.MemGetAllocationGranularity(
          &g, &cd->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      g == 0)
    return;
  cd->granularity = g;
  cd->vmm = true;
}

static mp_status_t mp__cuda_open(mp_device_t *dev, const char *opts) {
  int ordinal = 0;
  mp_status_t st = mp__cuda_spec_index(opts, &ordinal);
  if (st != MP_OK)
    return st;
  pthread_once(&mp__cuda_once, mp__cuda_load);
  if (mp__cuda_load_status != MP_OK)
    return mp__fail_driver((int)mp__cuda_load_cu, mp__cuda_load_status, "%s",
                           mp__cuda_load_msg);

  int count = 0;
  mp__cuda_no_push(); /* no push of this thread's is the failure below */
  CUresult r = mp__cu.DeviceGetCount(&count);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "device 'cuda:%d': cuDeviceGetCount", ordinal);
  if (ordinal >= count)
    return mp__fail(MP_ENODEV,
                    "device 'cuda:%d': no such device (the driver sees %d "
                    "CUDA device%s)",
                    ordinal, count, count == 1 ? "" : "s");

  mp__cuda_dev_t *cd = mp__host_calloc(1, sizeof *cd);
  if (cd == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory opening 'cuda:%d'", ordinal);
  cd->ordinal = ordinal;
  cd->count = count;
  char name[96] = "";
  if ((r = mp__cu.DeviceGet(&cd->cudev, ordinal)) != CUDA_SUCCESS ||
      (r = mp__cu.DeviceGetName(name, (int)sizeof name - 1, cd->cudev)) !=
          CUDA_SUCCESS) {
    free(cd);
    return mp__cuda_fail(r, "device 'cuda:%d'", ordinal);
  }
  if ((r = mp__cu.DevicePrimaryCtxRetain(&cd->ctx, cd->cudev)) !=
      CUDA_SUCCESS) {
    free(cd);
    return mp__cuda_fail(r, "device 'cuda:%d': cuDevicePrimaryCtxRetain",
                         ordinal);
  }
  if ((r = mp__cuda_push(cd)) != CUDA_SUCCESS) {
    (void)mp__cu.DevicePrimaryCtxRelease(cd->cudev);
    free(cd);
    return mp__cuda_fail(r, "device 'cuda:%d'", ordinal); /* the push's */
  }
  mp__cuda_probe_vmm(cd);
  mp__cuda_pop();
  mp__ptrmap_t *maps[] = {&cd->allocs,  &cd->hosts,  &cd->reserves, &cd->chunks,
                          &cd->streams, &cd->events, &cd->handles};
  for (size_t i = 0; i < sizeof maps / sizeof *maps; i++)
    mp__ptrmap_init(maps[i], sizeof(mp__cuda_entry_t));
  pthread_mutex_init(&cd->lock, NULL);
  snprintf(dev->name, sizeof dev->name, "cuda:%d %s", ordinal, name);
  dev->impl = cd;
  return MP_OK;
}

static mp_status_t mp__cuda_mem_info(mp_device_t *dev, size_t *free_b,
                                     size_t *total_b) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUresult r;
  MP__CU_IN_CTX(cd, r, mp__cu.MemGetInfo(free_b, total_b));
  return r == CUDA_SUCCESS ? MP_OK : mp__cuda_fail(r, "cuMemGetInfo");
}

static mp_status_t mp__cuda_alloc(mp_device_t *dev, size_t bytes, void **out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUdeviceptr p = 0;
  if (!mp__cuda_room(cd, &cd->allocs))
    return mp__fail(MP_ENOMEM, "mp_device_alloc: out of host memory");
  CUresult r;
  MP__CU_IN_CTX_RELAXED(cd, r, mp__cu.MemAlloc(&p, bytes));
  mp__cuda_settle(cd, &cd->allocs, MP__CUDA_MADE(r, p, bytes, 0));
  if (r != CUDA_SUCCESS) {
    char buf[16];
    return mp__cuda_fail(r, "cuMemAlloc(%s) on %s",
                         mp__fmt_bytes(buf, sizeof buf, bytes), dev->name);
  }
  *out = (void *)p;
  return MP_OK;
}

static mp_status_t mp__cuda_free(mp_device_t *dev, void *ptr) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  mp__cuda_entry_t e;
  /* Claimed before the driver call, so two racing frees cannot both reach
   * cuMemFree; put back if the driver refuses. */
  if (!mp__cuda_claim(cd, &cd->allocs, (uintptr_t)ptr, &e))
    return mp__fail(MP_EINVAL,
                    "mp_device_free: %p is not an allocation of %s (foreign "
                    "or already freed)",
                    ptr, dev->name);
  /* No cuCtxSynchronize before it: cuda.h promises only that cuMemFree
   * "may perform implicit synchronization", so every caller frees a
   * segment only once the work using it is done (the pool after a sync of
   * its streams or their events, the direct allocator after its event);
   * the fake waits anyway, as drivers do in practice. */
  CUresult r = mp__cuda_push(cd);
  if (r == CUDA_SUCCESS) {
    mp__cuda_relaxed_t rx = mp__cuda_relax();
    r = mp__cu.MemFree((CUdeviceptr)ptr);
    mp__cuda_unrelax(&rx, r);
    mp__cuda_pop();
  }
  mp__cuda_settle(cd, &cd->allocs, r != CUDA_SUCCESS ? &e : NULL);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuMemFree(%p)", ptr);
  return MP_OK;
}

static mp_status_t mp__cuda_host_alloc(mp_device_t *dev, size_t bytes,
                                       void **out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  void *p = NULL;
  if (!mp__cuda_room(cd, &cd->hosts))
    return mp__fail(MP_ENOMEM, "mp_device_host_alloc: out of host memory");
  mp__cuda_relaxed_t rx = mp__cuda_relax();
  CUresult r = mp__cuda_push(cd);
  if (r == CUDA_SUCCESS) {
    /* PORTABLE: every context's (the host pool serves all devices);
     * DEVICEMAP: cuMemHostGetDevicePointer "will fail if the
     * CU_MEMHOSTALLOC_DEVICEMAP flag was not specified at the time the
     * memory was allocated" (cuda.h), and the shim serves mapped requests
     * (cudaHostAllocMapped) from these chunks. */
    r = mp__cu.MemHostAlloc(
        &p, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    mp__cuda_pop();
  }
  mp__cuda_unrelax(&rx, r);
  mp__cuda_settle(cd, &cd->hosts, MP__CUDA_MADE(r, p, bytes, 0));
  if (r != CUDA_SUCCESS) {
    char buf[16];
    return mp__cuda_fail(r, "cuMemHostAlloc(%s)",
                         mp__fmt_bytes(buf, sizeof buf, bytes));
  }
  *out = p;
  return MP_OK;
}

static mp_status_t mp__cuda_host_free(mp_device_t *dev, void *ptr) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  mp__cuda_entry_t e;
  if (!mp__cuda_claim(cd, &cd->hosts, (uintptr_t)ptr, &e))
    return mp__fail(MP_EINVAL,
                    "mp_device_host_free: %p is not host memory of %s "
                    "(foreign or already freed)",
                    ptr, dev->name);
  CUresult r;
  mp__cuda_relaxed_t rx = mp__cuda_relax();
  MP__CU_IN_CTX(cd, r, mp__cu.MemFreeHost(ptr));
  mp__cuda_unrelax(&rx, r);
  mp__cuda_settle(cd, &cd->hosts, r != CUDA_SUCCESS ? &e : NULL);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuMemFreeHost(%p)", ptr);
  return MP_OK;
}

static mp_status_t mp__cuda_synchronize(mp_device_t *dev) {
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r, mp__cu.CtxSynchronize());
  return r == CUDA_SUCCESS ? MP_OK : mp__cuda_fail(r, "cuCtxSynchronize");
}

/* mp_device_close's wait (backend.h, close_ready). Refused only where a
 * later wait can succeed: from a host function (CUDA_ERROR_NOT_PERMITTED)
 * and beside a capture (CUDA_ERROR_STREAM_CAPTURE_* and
 * CUDA_ERROR_CAPTURED_EVENT, 900 to 908). A context the driver has given
 * up on (a sticky error after a kernel's fault: "any further CUDA work
 * will return the same error", cuda.h) runs nothing any more, and would
 * refuse every later wait too: its close goes on. */
static mp_status_t mp__cuda_close_ready(mp_device_t *dev) {
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r, mp__cu.CtxSynchronize());
  if (r == CUDA_ERROR_NOT_PERMITTED ||
      (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
       r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD))
    return mp__cuda_fail(r, "cuCtxSynchronize");
  return MP_OK;
}

/* ---- streams and events -------------------------------------------------- */

static mp_status_t mp__cuda_stream_create(mp_device_t *dev, mp_stream_t *out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUstream s = NULL;
  if (!mp__cuda_room(cd, &cd->streams))
    return mp__fail(MP_ENOMEM, "mp_stream_create: out of host memory");
  CUresult r;
  MP__CU_IN_CTX(cd, r, mp__cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  mp__cuda_settle(cd, &cd->streams, MP__CUDA_MADE(r, s, 0, 0));
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuStreamCreate");
  *out = (mp_stream_t)s;
  return MP_OK;
}

/* Only streams this device created are destroyed here: a stale or foreign
 * handle (a double destroy, a stream of the CUDA runtime, which
 * cudaStreamDestroy owns) would reach the driver as undefined behaviour.
 * No wait for the stream first: cuStreamDestroy "will return immediately"
 * while the device still works on it (cuda.h), which is what
 * mp_stream_destroy promises (device.h); the device synchronize of
 * mp_device_synchronize and close still waits for that work. */
static mp_status_t mp__cuda_stream_destroy(mp_device_t *dev, mp_stream_t s) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  mp__cuda_entry_t e;
  if (!mp__cuda_claim(cd, &cd->streams, (uintptr_t)s, &e))
    return mp__fail(MP_EINVAL,
                    "mp_stream_destroy: %p was not created by "
                    "mp_stream_create on this device (or is destroyed)",
                    (void *)s);
  CUresult r;
  MP__CU_IN_CTX(cd, r, mp__cu.StreamDestroy((CUstream)s));
  mp__cuda_settle(cd, &cd->streams, r != CUDA_SUCCESS ? &e : NULL);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuStreamDestroy(%p)", (void *)s);
  return MP_OK;
}

/* Whether key is in map m of cd (asks no driver). */
static bool mp__cuda_tracked(mp__cuda_dev_t *cd, const mp__ptrmap_t *m,
                             uintptr_t key) {
  pthread_mutex_lock(&cd->lock);
  bool found = mp__ptrmap_find(m, key) != NULL;
  pthread_mutex_unlock(&cd->lock);
  return found;
}

static bool mp__cuda_stream_owned(mp_device_t *dev, mp_stream_t s) {
  return mp__cuda_tracked(mp__cuda_of(dev), &mp__cuda_of(dev)->streams,
                          (uintptr_t)s);
}

static mp_status_t mp__cuda_stream_synchronize(mp_device_t *dev,
                                               mp_stream_t s) {
  CUresult r;
  MP__CU_IN_CTX_RELAXED(mp__cuda_of(dev), r,
                        mp__cu.StreamSynchronize((CUstream)s));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuStreamSynchronize(%p)", (void *)s);
}

/* A query's answer: not ready is an answer, not a failure (no message:
 * queries are polled). */
static mp_status_t mp__cuda_ready(CUresult r, const char *fn, void *h) {
  if (r == CUDA_ERROR_NOT_READY)
    return MP_EBUSY;
  return r == CUDA_SUCCESS ? MP_OK : mp__cuda_fail(r, "%s(%p)", fn, h);
}

/* cuStreamIsCapturing's answer for s: allowed during capture (it is how
 * PyTorch and the CUDA samples ask), never waits. *cap is NONE unless the
 * driver says otherwise. */
static CUresult mp__cuda_capture_status(mp__cuda_dev_t *cd, mp_stream_t s,
                                        CUstreamCaptureStatus *cap) {
  CUresult r;
  *cap = CU_STREAM_CAPTURE_STATUS_NONE;
  MP__CU_IN_CTX(cd, r, mp__cu.StreamIsCapturing((CUstream)s, cap));
  return r;
}

/* A stream being captured is busy, and is not asked: cuStreamQuery is "not
 * allowed during stream capture" (cuda.h) and would invalidate the capture
 * of a stream the pool was never told captures (one that joined a capture
 * through an event, say). Nor is the legacy stream while a blocking stream
 * captures: cuStreamIsCapturing answers it CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
 * and a cuStreamQuery of it then invalidates that capture, in relaxed mode
 * too (an H200, driver 580.159.04, 2026-11-28). Any other failure to tell
 * is the query's failure, with a message. */
static mp_status_t mp__cuda_stream_query(mp_device_t *dev, mp_stream_t s) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUstreamCaptureStatus cap;
  CUresult r = mp__cuda_capture_status(cd, s, &cap);
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
      (r == CUDA_SUCCESS && cap != CU_STREAM_CAPTURE_STATUS_NONE))
    return MP_EBUSY;
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuStreamIsCapturing(%p)", (void *)s);
  MP__CU_IN_CTX_RELAXED(cd, r, mp__cu.StreamQuery((CUstream)s));
  return mp__cuda_ready(r, "cuStreamQuery", (void *)s);
}

/* The device of s's context (cuStreamGetCtx, asked with dev's context
 * current as mp__cuda_stream_kind asks it, then, unless it is dev's own
 * primary context, cuCtxGetDevice with that context pushed): three driver
 * calls for a stream of dev, six for another device's; none where the
 * driver sees one device (the drop-in's mp_malloc, mp_malloc_async and
 * mp_free_async ask for every call). cuMemAllocAsync's "the
 * memory pool current to the stream's device". The default streams name no
 * context of their own and are the calling thread's current context's (cuda.h,
 * cuStreamGetCtx), as is a handle the driver cannot place (no cuStreamGetCtx,
 * or a handle it refuses: the pool that gets it says what is wrong with it).
 * MP_ENODEV when the thread has no context then. */
static mp_status_t mp__cuda_stream_ordinal(mp_device_t *dev, mp_stream_t s,
                                           int *out) {
  if (mp__cuda_of(dev)->count == 1) { /* every stream is this device's */
    *out = mp__cuda_of(dev)->ordinal;
    return MP_OK;
  }
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  CUcontext owner = NULL;
  if (s != NULL && s != (mp_stream_t)CU_STREAM_LEGACY &&
      s != (mp_stream_t)CU_STREAM_PER_THREAD && mp__cu.StreamGetCtx != NULL)
    MP__CU_IN_CTX(mp__cuda_of(dev), r,
                  mp__cu.StreamGetCtx((CUstream)s, &owner));
  if (r == CUDA_SUCCESS && owner == mp__cuda_of(dev)->ctx) {
    *out = mp__cuda_of(dev)->ordinal; /* this device's: nothing to ask */
    return MP_OK;
  }
  /* The stream's own context, where the driver named one: where it cannot
   * be made current, cuCtxGetDevice would answer the calling thread's
   * context, another device's perhaps, for a stream that is not on it. */
  bool pushed = r == CUDA_SUCCESS && owner != NULL;
  if (pushed && mp__cu.CtxPushCurrent(owner) != CUDA_SUCCESS) {
    mp__cuda_no_push();
    return MP_ENODEV;
  }
  CUdevice d = 0;
  r = mp__cu.CtxGetDevice(&d);
  if (pushed)
    mp__cuda_pop();
  mp__cuda_no_push(); /* a refused push is an answer here */
  if (r != CUDA_SUCCESS)
    return MP_ENODEV;
  *out = (int)d;
  return MP_OK;
}

static int mp__cuda_ordinal(mp_device_t *dev) {
  return mp__cuda_of(dev)->ordinal;
}

/* CU_STREAM_PER_THREAD names the calling thread's own default stream
 * (cuda.h: "Per-thread stream handle"); NULL and CU_STREAM_LEGACY the legacy
 * one. Any other handle is asked with cuStreamGetFlags, once, when a pool
 * first meets it, unless it captures (below): a query that waits for
 * nothing and queues no work, which the driver
 * answers with CUDA_ERROR_INVALID_HANDLE for a handle that is no stream of
 * the context (cuda.h lists it; the fake driver models it). Only that answer
 * refuses the handle; any other failure (a host function's call, not
 * permitted) leaves it to the calls that use it, as before. A handle that
 * never was a stream (a stale one after cuStreamDestroy, a random pointer)
 * is still undefined behaviour in a real driver: where the driver can tell,
 * the pool says MP_EINVAL instead of taking it. */
static int mp__cuda_stream_kind(mp_device_t *dev, mp_stream_t s) {
  if (s == (mp_stream_t)CU_STREAM_PER_THREAD)
    return MP__STREAM_PER_THREAD;
  if (s == NULL || s == (mp_stream_t)CU_STREAM_LEGACY)
    return MP__STREAM_SHARED;
  CUresult r;
  unsigned flags = 0;
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  /* cuStreamGetFlags of a stream that captures is refused and invalidates
   * the capture, in relaxed mode too (an H200, driver 580.159.04,
   * 2026-11-28), though cuda.h lists no capture error for it: a pool can
   * first meet a stream inside its capture (a graph pool, PyTorch's
   * allocation in a capture). cuStreamIsCapturing is allowed there; a
   * stream found capturing is live, and is not asked its flags. */
  CUstreamCaptureStatus cap;
  r = mp__cuda_capture_status(cd, s, &cap);
  if (r == CUDA_SUCCESS && cap == CU_STREAM_CAPTURE_STATUS_NONE)
    MP__CU_IN_CTX(cd, r, mp__cu.StreamGetFlags((CUstream)s, &flags));
  mp__cuda_no_push(); /* stream_kind's answers take no message */
  if (r == CUDA_ERROR_INVALID_HANDLE)
    return MP__STREAM_BAD;
  /* A stream of another context (another device's, or one made with
   * cuCtxCreate) is answered too: an H200 (driver 580.159.04, 2026-11-28)
   * gave its flags with the pool's context current. But an event of the
   * pool's context cannot be recorded on it (cuda.h, cuEventRecord: "must
   * be from the same context", CUDA_ERROR_INVALID_HANDLE, seen there too)
   * and a synchronization of the pool's context does not wait for it, so
   * the pool would hand its blocks on unordered: refused. */
  CUcontext owner = NULL;
  if (mp__cu.StreamGetCtx != NULL) {
    MP__CU_IN_CTX(cd, r, mp__cu.StreamGetCtx((CUstream)s, &owner));
    mp__cuda_no_push();
    if (r == CUDA_SUCCESS && owner != cd->ctx)
      return MP__STREAM_BAD;
  }
  return MP__STREAM_SHARED;
}

/* stream_capturing's answer (backend.h) from the answer of call (a
 * question allowed during capture: cuStreamIsCapturing,
 * cuStreamGetCaptureInfo). */
static int mp__cuda_capturing_of(CUresult r, CUstreamCaptureStatus st,
                                 const char *call) {
  if (r == CUDA_SUCCESS)
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
  /* A capture's own refusals (900 to 908: CUDA_ERROR_STREAM_CAPTURE_*,
   * CUDA_ERROR_CAPTURED_EVENT) and the errors of a bad handle or a call not
   * permitted here cannot be told from a capture: -1. Any other is the
   * driver's failure (a sticky one after a kernel's fault, "any further
   * CUDA work will return the same error", cuda.h), recorded: -2. */
  if (mp__cuda_status_of(r) != MP_EDRIVER ||
      (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
       r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)) {
    mp__cuda_no_push(); /* an answer, without a message */
    return -1;
  }
  (void)mp__cuda_fail(r, "%s", call);
  return -2;
}

static int mp__cuda_stream_capturing(mp_device_t *dev, mp_stream_t s) {
  CUstreamCaptureStatus st;
  CUresult r = mp__cuda_capture_status(mp__cuda_of(dev), s, &st);
  return mp__cuda_capturing_of(r, st, "cuStreamIsCapturing");
}

/* backend.h, capture_seen. A device synchronization (cuCtxSynchronize)
 * waits for every stream of the context, so during any capture of one of
 * them it is refused and invalidates the capture, whatever the modes (the
 * Programming Guide, "Prohibited and Unhandled Operations": synchronizing
 * "a broader handle which encompasses an active stream capture, such as a
 * device or context handle" is invalid, no mode excepted; the fake
 * driver refuses it so, as an H200, driver 580.159.04, did: fakecuda.c,
 * cuCtxSynchronize). Nor can the context be asked as a whole: cuda.h's
 * cuCtxRecordEvent "will return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED if
 * the specified context hCtx has a stream in the capture mode. In such a
 * case, the call will invalidate all the conflicting captures". So the
 * streams that can be asked are, with cuStreamIsCapturing, allowed during
 * a capture: every stream mp_stream_create made on dev (under cd->lock,
 * so that none is destroyed meanwhile: mp__cuda_stream_destroy untracks
 * first), the calling thread's per-thread stream, and the legacy stream,
 * which answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while any blocking
 * stream of the context captures (cuda.h, cuStreamIsCapturing). A
 * non-blocking stream the program made itself and never named to dev
 * cannot be asked: its capture goes unseen. */
static int mp__cuda_capture_seen(mp_device_t *dev, mp_stream_t *which) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = mp__cuda_push(cd);
  if (r != CUDA_SUCCESS) /* the push's (mp__cuda_fail names it) */
    return mp__cuda_capturing_of(r, st, "capture_seen");
  int seen = 0;
  pthread_mutex_lock(&cd->lock);
  for (size_t i = 0; seen == 0 && i < cd->streams.cap; i++) {
    const mp__cuda_entry_t *e = mp__ptrmap_at(&cd->streams, i);
    if (e == NULL)
      continue;
    st = CU_STREAM_CAPTURE_STATUS_NONE;
    r = mp__cu.StreamIsCapturing((CUstream)e->key, &st);
    seen = mp__cuda_capturing_of(r, st, "cuStreamIsCapturing");
    *which = (mp_stream_t)e->key;
  }
  pthread_mutex_unlock(&cd->lock);
  if (seen == 0) {
    st = CU_STREAM_CAPTURE_STATUS_NONE;
    r = mp__cu.StreamIsCapturing(CU_STREAM_PER_THREAD, &st);
    seen = mp__cuda_capturing_of(r, st, "cuStreamIsCapturing");
    *which = (mp_stream_t)CU_STREAM_PER_THREAD;
  }
  if (seen == 0) {
    st = CU_STREAM_CAPTURE_STATUS_NONE;
    r = mp__cu.StreamIsCapturing(CU_STREAM_LEGACY, &st);
    seen = r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
               ? 1
               : mp__cuda_capturing_of(r, st, "cuStreamIsCapturing");
    *which = NULL;
  }
  mp__cuda_pop();
  return seen;
}

static int mp__cuda_stream_capture_id(mp_device_t *dev, mp_stream_t s,
                                      uint64_t *id) {
  if (mp__cu.StreamGetCaptureInfo == NULL)
    return mp__cuda_stream_capturing(dev, s);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUresult r;
  MP__CU_IN_CTX(
      mp__cuda_of(dev), r,
      mp__cu.StreamGetCaptureInfo((CUstream)s, &st, &cid, NULL, NULL, NULL));
  /* Refused, the answer is stream_capturing's (backend.h): -1 where a
   * capture's own refusal or a bad handle cannot be told from a capture,
   * -2 with the driver's error recorded where it failed on its own (a
   * sticky error after a kernel's fault, which every later call answers):
   * that is no "cannot tell" for the caller to take as no capture. */
  if (r != CUDA_SUCCESS)
    return mp__cuda_capturing_of(r, st, "cuStreamGetCaptureInfo");
  if (st == CU_STREAM_CAPTURE_STATUS_NONE)
    return 0;
  /* An invalidated capture has no id to give (cuda.h: data other than the
   * status is valid only for an active capture; the strict fake leaves it
   * unwritten): cannot be told. Taken for an id, the 0 left in cid named
   * another capture, and PyTorch's automatic route made a graph pool for
   * it that was never released. */
  if (st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return -1;
  *id = (uint64_t)cid;
  return 1;
}

/* The destructor of a graph's user object: fn(arg) unless disarmed (the
 * object was never handed to a graph). */
typedef struct mp__cuda_on_release {
  void (*fn)(void *);
  void *arg;
  bool armed;
} mp__cuda_on_release_t;

static void CUDA_CB mp__cuda_released(void *p) {
  mp__cuda_on_release_t *r = p;
  if (r->armed)
    r->fn(r->arg);
  free(r);
}

static mp_status_t mp__cuda_capture_on_release(mp_device_t *dev, mp_stream_t s,
                                               void (*fn)(void *), void *arg) {
  if (!mp__cu.has_uobj || mp__cu.StreamGetCaptureInfo == NULL)
    return mp__fail(MP_ENOTSUP, "device 'cuda': the driver has no user "
                                "objects to tell when a graph goes");
  mp__cuda_on_release_t *rel = mp__host_alloc(sizeof *rel);
  if (rel == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for a graph's user object");
  *rel = (mp__cuda_on_release_t){fn, arg, true};
  CUresult r = mp__cuda_push(mp__cuda_of(dev));
  if (r != CUDA_SUCCESS) {
    free(rel);
    return mp__cuda_fail(r, "capture_on_release(%p)", (void *)s);
  }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph g = NULL;
  CUuserObject o = NULL;
  const char *what = "cuStreamGetCaptureInfo";
  r = mp__cu.StreamGetCaptureInfo((CUstream)s, &st, NULL, &g, NULL, NULL);
  /* No graph being captured to hold it: the caller's mistake, not the
   * driver's (which answered), said as such below. */
  bool uncaptured =
      r == CUDA_SUCCESS && (st != CU_STREAM_CAPTURE_STATUS_ACTIVE || g == NULL);
  if (uncaptured)
    r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    what = "cuUserObjectCreate";
    r = mp__cu.UserObjectCreate(&o, rel, mp__cuda_released, 1,
                                CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    if (r != CUDA_SUCCESS)
      o = NULL;
  }
  if (r == CUDA_SUCCESS) {
    what = "cuGraphRetainUserObject";
    r = mp__cu.GraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE);
  }
  if (r != CUDA_SUCCESS) {
    rel->armed = false;
    if (o == NULL)
      free(rel);
    else
      (void)mp__cu.UserObjectRelease(o, 1); /* its destructor frees rel */
  }
  mp__cuda_pop();
  if (uncaptured)
    return mp__fail(MP_EINVAL,
                    "capture_on_release: stream %p is not being captured "
                    "(%s), so no graph holds what tells when it goes",
                    (void *)s,
                    st == CU_STREAM_CAPTURE_STATUS_INVALIDATED
                        ? "its capture was invalidated"
                        : "no capture");
  return r == CUDA_SUCCESS ? MP_OK
                           : mp__cuda_fail(r, "%s(%p)", what, (void *)s);
}

static mp_status_t mp__cuda_launch_host(mp_device_t *dev, mp_stream_t s,
                                        void (*fn)(void *), void *arg) {
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r,
                mp__cu.LaunchHostFunc((CUstream)s, fn, arg));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuLaunchHostFunc(%p)", (void *)s);
}

static mp_status_t mp__cuda_memcpy_async(mp_device_t *dev, void *dst,
                                         const void *src, size_t n,
                                         mp_stream_t s) {
  CUresult r;
  MP__CU_IN_CTX(
      mp__cuda_of(dev), r,
      mp__cu.MemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)s));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuMemcpyAsync(%p <- %p, %zu)", dst, src, n);
}

static mp_status_t mp__cuda_memset_async(mp_device_t *dev, void *dst, int value,
                                         size_t n, mp_stream_t s) {
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r,
                mp__cu.MemsetD8Async((CUdeviceptr)dst, (unsigned char)value, n,
                                     (CUstream)s));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuMemsetD8Async(%p, %zu)", dst, n);
}

static mp_status_t mp__cuda_event_create(mp_device_t *dev, mp_event_t *out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUevent e = NULL;
  if (!mp__cuda_room(cd, &cd->events))
    return mp__fail(MP_ENOMEM, "mp_event_create: out of host memory");
  CUresult r;
  MP__CU_IN_CTX(cd, r, mp__cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  mp__cuda_settle(cd, &cd->events, MP__CUDA_MADE(r, e, 0, 0));
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuEventCreate");
  *out = (mp_event_t)e;
  return MP_OK;
}

static mp_status_t mp__cuda_event_destroy(mp_device_t *dev, mp_event_t e) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  mp__cuda_entry_t entry;
  if (!mp__cuda_claim(cd, &cd->events, (uintptr_t)e, &entry))
    return mp__fail(MP_EINVAL,
                    "mp_event_destroy: %p is not an event of %s (foreign or "
                    "already destroyed)",
                    (void *)e, dev->name);
  CUresult r;
  MP__CU_IN_CTX(cd, r, mp__cu.EventDestroy((CUevent)e));
  mp__cuda_settle(cd, &cd->events, r != CUDA_SUCCESS ? &entry : NULL);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuEventDestroy(%p)", (void *)e);
  return MP_OK;
}

/* Only events this device made, and has not destroyed, reach the driver:
 * a destroyed event's handle is as undefined there as a destroyed stream's
 * (mp_stream_destroy), and the driver may have given it to an event made
 * since, which the call would then touch. The host device refuses them
 * too. */
static mp_status_t mp__cuda_event_known(mp_device_t *dev, mp_event_t e,
                                        const char *fn) {
  if (mp__cuda_tracked(mp__cuda_of(dev), &mp__cuda_of(dev)->events,
                       (uintptr_t)e))
    return MP_OK;
  return mp__fail(MP_EINVAL,
                  "%s: %p is not an event of %s (foreign or already "
                  "destroyed)",
                  fn, (void *)e, dev->name);
}

static mp_status_t mp__cuda_event_record(mp_device_t *dev, mp_event_t e,
                                         mp_stream_t s) {
  if (mp__cuda_event_known(dev, e, "mp_event_record") != MP_OK)
    return MP_EINVAL;
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r,
                mp__cu.EventRecord((CUevent)e, (CUstream)s));
  return r == CUDA_SUCCESS ? MP_OK
                           : mp__cuda_fail(r, "cuEventRecord(%p, stream %p)",
                                           (void *)e, (void *)s);
}

static mp_status_t mp__cuda_event_query(mp_device_t *dev, mp_event_t e) {
  if (mp__cuda_event_known(dev, e, "mp_event_query") != MP_OK)
    return MP_EINVAL;
  CUresult r;
  MP__CU_IN_CTX_RELAXED(mp__cuda_of(dev), r, mp__cu.EventQuery((CUevent)e));
  return mp__cuda_ready(r, "cuEventQuery", (void *)e);
}

static mp_status_t mp__cuda_event_synchronize(mp_device_t *dev, mp_event_t e) {
  if (mp__cuda_event_known(dev, e, "mp_event_synchronize") != MP_OK)
    return MP_EINVAL;
  CUresult r;
  MP__CU_IN_CTX_RELAXED(mp__cuda_of(dev), r,
                        mp__cu.EventSynchronize((CUevent)e));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuEventSynchronize(%p)", (void *)e);
}

static mp_status_t mp__cuda_stream_wait_event(mp_device_t *dev, mp_stream_t s,
                                              mp_event_t e) {
  if (mp__cuda_event_known(dev, e, "mp_stream_wait_event") != MP_OK)
    return MP_EINVAL;
  CUresult r;
  MP__CU_IN_CTX(mp__cuda_of(dev), r,
                mp__cu.StreamWaitEvent((CUstream)s, (CUevent)e, 0));
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuStreamWaitEvent(stream %p, event %p)",
                             (void *)s, (void *)e);
}

/* ---- virtual memory ------------------------------------------------------ */

static mp_status_t mp__cuda_no_vmm(const mp_device_t *dev) {
  return mp__fail(MP_ENOTSUP,
                  "%s has no virtual memory management (cuMemCreate/cuMemMap)",
                  dev->name);
}

static mp_status_t mp__cuda_vm_granularity(mp_device_t *dev, size_t *out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!cd->vmm)
    return mp__cuda_no_vmm(dev);
  *out = cd->granularity;
  return MP_OK;
}

static mp_status_t mp__cuda_vm_reserve(mp_device_t *dev, size_t bytes,
                                       void **out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!cd->vmm)
    return mp__cuda_no_vmm(dev);
  CUdeviceptr p = 0;
  if (!mp__cuda_room(cd, &cd->reserves))
    return mp__fail(MP_ENOMEM, "vm_reserve: out of host memory");
  CUresult r;
  MP__CU_IN_CTX_RELAXED(
      cd, r, mp__cu.MemAddressReserve(&p, bytes, cd->granularity, 0, 0));
  mp__cuda_settle(cd, &cd->reserves, MP__CUDA_MADE(r, p, bytes, 0));
  if (r != CUDA_SUCCESS) {
    char buf[16];
    return mp__cuda_fail(r, "cuMemAddressReserve(%s)",
                         mp__fmt_bytes(buf, sizeof buf, bytes));
  }
  *out = (void *)p;
  return MP_OK;
}

/* Takes the reservation (base, bytes) out of cd->reserves into *e for its
 * release, keeping its room (mp__cuda_claim), when nothing is mapped in it;
 * refused otherwise, changing nothing: MP_EINVAL when it is not one
 * reservation of the device, MP_EBUSY while a chunk of cd->chunks (one
 * mapped, or left mapped by a refused undo) lies in it, as the host device
 * refuses (host.c, host_vm_release; backend.h: vm_release takes a
 * reservation with nothing mapped in it). The driver is not asked then:
 * cuda.h's cuMemAddressFree says only that "the size must match what was
 * given to memAddressReserve and the ptr given must match what was returned
 * from memAddressReserve" (/usr/local/cuda-13.0/include/cuda.h), nothing
 * of a range still mapped (cuMemUnmap turns a mapped range back into "an
 * address reservation" first), so a driver may free the range under its
 * mappings: they would stay in cd->chunks, in addresses no longer the
 * device's, for close to unmap after another reservation took them. One
 * look under the lock, so that no map or unmap of the device slips in
 * between the check and the claim. */
static mp_status_t mp__cuda_claim_reserve(mp_device_t *dev, void *base,
                                          size_t bytes, mp__cuda_entry_t *e) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  const uintptr_t lo = (uintptr_t)base;
  size_t size = 0, mapped = 0, chunks = 0;
  pthread_mutex_lock(&cd->lock);
  const mp__cuda_entry_t *found = mp__ptrmap_find(&cd->reserves, lo);
  if (found != NULL && found->size == bytes)
    for (size_t i = 0; i < cd->chunks.cap; i++) {
      const mp__cuda_entry_t *c = mp__ptrmap_at(&cd->chunks, i);
      if (c != NULL && c->key >= lo && c->key - lo < bytes) {
        mapped += c->size;
        chunks++;
      }
    }
  if (found != NULL)
    size = found->size;
  bool ok = found != NULL && size == bytes && chunks == 0 &&
            mp__ptrmap_take(&cd->reserves, lo, e);
  if (ok)
    cd->pending++;
  pthread_mutex_unlock(&cd->lock);
  if (ok)
    return MP_OK;
  if (found == NULL)
    return mp__fail(MP_EINVAL, "vm_release: %p is not a reservation of %s",
                    base, dev->name);
  if (size != bytes)
    return mp__fail(MP_EINVAL,
                    "vm_release: the reservation at %p is %zu bytes, not %zu",
                    base, size, bytes);
  return mp__fail(MP_EBUSY,
                  "vm_release: reservation %p of %s still has %zu bytes "
                  "mapped (%zu mapping%s); vm_unmap them first",
                  base, dev->name, mapped, chunks, chunks == 1 ? "" : "s");
}

static mp_status_t mp__cuda_vm_release(mp_device_t *dev, void *base,
                                       size_t bytes) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!cd->vmm)
    return mp__cuda_no_vmm(dev);
  mp__cuda_entry_t e;
  mp_status_t st = mp__cuda_claim_reserve(dev, base, bytes, &e);
  if (st != MP_OK)
    return st;
  CUresult r;
  MP__CU_IN_CTX_RELAXED(cd, r, mp__cu.MemAddressFree((CUdeviceptr)base, bytes));
  mp__cuda_settle(cd, &cd->reserves, r != CUDA_SUCCESS ? &e : NULL);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuMemAddressFree(%p, %zu)", base, bytes);
  return MP_OK;
}

/* Releases h, which no mapping holds; h itself where the driver refuses
 * (the handle is still alive then, its memory the device's: to be kept for
 * a later release, not forgotten), else 0. */
static CUmemGenericAllocationHandle
mp__cuda_release_unmapped(CUmemGenericAllocationHandle h) {
  return mp__cu.MemRelease(h) == CUDA_SUCCESS ? 0 : h;
}

/* Physical memory for [addr, addr + bytes): create, map, make it readable
 * and writable from the device; undone step by step if a step fails. A
 * refused access whose undoing cuMemUnmap is refused too leaves the chunk
 * mapped: *left, with its handle in *out (kept, not released: released,
 * the handle's number may name another allocation by the time the
 * mapping is undone). An undoing cuMemRelease refused leaves the handle
 * unmapped but alive: *stray (else 0). */
static CUresult mp__cuda_map_chunk(mp__cuda_dev_t *cd, CUdeviceptr addr,
                                   size_t bytes,
                                   CUmemGenericAllocationHandle *out,
                                   bool *left,
                                   CUmemGenericAllocationHandle *stray) {
  CUmemGenericAllocationHandle h = 0;
  CUresult r = mp__cu.MemCreate(&h, bytes, &cd->prop, 0);
  if (r != CUDA_SUCCESS)
    return r;
  r = mp__cu.MemMap(addr, bytes, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    *stray = mp__cuda_release_unmapped(h);
    return r;
  }
  CUmemAccessDesc access = {.location = cd->prop.location,
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  r = mp__cu.MemSetAccess(addr, bytes, &access, 1);
  *left = r != CUDA_SUCCESS && mp__cu.MemUnmap(addr, bytes) != CUDA_SUCCESS;
  if (r != CUDA_SUCCESS && !*left) {
    *stray = mp__cuda_release_unmapped(h);
    return r;
  }
  *out = h;
  return r;
}

static mp_status_t mp__cuda_vm_map(mp_device_t *dev, void *addr, size_t bytes) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!cd->vmm)
    return mp__cuda_no_vmm(dev);
  CUmemGenericAllocationHandle h = 0, stray = 0;
  bool left = false;
  if (!mp__cuda_room(cd, &cd->chunks))
    return mp__fail(MP_ENOMEM, "vm_map: out of host memory");
  if (!mp__cuda_room(cd, &cd->handles)) {
    mp__cuda_settle(cd, &cd->chunks, NULL);
    return mp__fail(MP_ENOMEM, "vm_map: out of host memory");
  }
  CUresult r;
  MP__CU_IN_CTX_RELAXED(
      cd, r,
      mp__cuda_map_chunk(cd, (CUdeviceptr)addr, bytes, &h, &left, &stray));
  /* A chunk left mapped is tracked as any other: vm_unmap or close
   * unmaps it and releases its handle. A handle the undoing release left
   * alive, close releases. */
  mp__cuda_settle(cd, &cd->chunks,
                  MP__CUDA_MADE(left ? CUDA_SUCCESS : r, addr, bytes, h));
  mp__cuda_settle_handle(cd, stray);
  if (r != CUDA_SUCCESS) {
    char buf[16];
    mp_status_t st =
        mp__cuda_fail(r, "vm_map(%p, %s) on %s", addr,
                      mp__fmt_bytes(buf, sizeof buf, bytes), dev->name);
    if (left)
      st = mp__fail_driver((int)r, st,
                           "%s; and the undoing cuMemUnmap was refused: the "
                           "chunk stays mapped, without access, until "
                           "vm_unmap or mp_device_close",
                           mp_last_error());
    return st;
  }
  return MP_OK;
}

/* Peer access to a mapped range: cuMemSetAccess for the peer's location
 * (cudaDeviceEnablePeerAccess does not cover virtual-memory mappings; the
 * CUDA Programming Guide, "Virtual Memory Management: Access Control").
 * Taken back with CU_MEM_ACCESS_FLAGS_PROT_NONE, "make the address range
 * not accessible" (/usr/local/cuda/include/cuda.h, CUmemAccess_flags). */
static mp_status_t mp__cuda_vm_access(mp_device_t *dev, void *addr,
                                      size_t bytes, mp_device_t *peer,
                                      bool grant) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE,
                                    .id = mp__cuda_of(peer)->ordinal},
                       .flags = grant ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                      : CU_MEM_ACCESS_FLAGS_PROT_NONE};
  CUresult r;
  mp__cuda_relaxed_t rx = mp__cuda_relax();
  MP__CU_IN_CTX(cd, r, mp__cu.MemSetAccess((CUdeviceptr)addr, bytes, &d, 1));
  mp__cuda_unrelax(&rx, r);
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "cuMemSetAccess(%p, %zu, peer %d)", addr, bytes,
                             d.location.id);
}

static mp_status_t mp__cuda_vm_unmap(mp_device_t *dev, void *addr,
                                     size_t bytes) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!cd->vmm)
    return mp__cuda_no_vmm(dev);
  mp__cuda_entry_t e;
  /* Room for the handle first, in case its release is refused after the
   * unmap (nothing can be undone then). */
  if (!mp__cuda_room(cd, &cd->handles))
    return mp__fail(MP_ENOMEM, "vm_unmap: out of host memory");
  if (!mp__cuda_claim(cd, &cd->chunks, (uintptr_t)addr, &e)) {
    mp__cuda_settle_handle(cd, 0);
    return mp__fail(MP_EINVAL, "vm_unmap: nothing is mapped at %p on %s", addr,
                    dev->name);
  }
  if (e.size != bytes) {
    mp__cuda_settle(cd, &cd->chunks, &e);
    mp__cuda_settle_handle(cd, 0);
    return mp__fail(MP_EINVAL,
                    "vm_unmap: the mapping at %p is %zu bytes, not %zu", addr,
                    e.size, bytes);
  }
  /* No device synchronize: the pool unmaps only chunks whose streams it
   * has seen finish (their marker events, or a wait for every stream it
   * knows; backend.h), and a cuCtxSynchronize here would be the call CUDA
   * forbids while another thread captures a graph in global mode. */
  CUmemGenericAllocationHandle stray = 0;
  CUresult r = mp__cuda_push(cd);
  if (r == CUDA_SUCCESS) {
    mp__cuda_relaxed_t rx = mp__cuda_relax();
    r = mp__cu.MemUnmap((CUdeviceptr)addr, bytes);
    /* Unmapped, the range is free whatever the release answers (MP_OK:
     * the pool takes it as unmapped); a handle the driver refuses to
     * release is still alive, and close releases it. */
    if (r == CUDA_SUCCESS)
      stray = mp__cuda_release_unmapped(e.handle);
    mp__cuda_unrelax(&rx, r);
    mp__cuda_pop();
  }
  mp__cuda_settle(cd, &cd->chunks, r != CUDA_SUCCESS ? &e : NULL);
  mp__cuda_settle_handle(cd, stray);
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuMemUnmap(%p, %zu)", addr, bytes);
  return MP_OK;
}

/* ---- IPC ------------------------------------------------------------------
 */

static mp_status_t mp__cuda_no_ipc(const mp_device_t *dev) {
  return mp__fail(MP_ENOTSUP, "%s: the driver has no IPC entry points",
                  dev->name);
}

/* A virtual chunk: its physical allocation as a POSIX descriptor (it was
 * created shareable where the device allows: mp__cuda_probe_vmm). A plain
 * allocation: cuIpcGetMemHandle of its base. */
static mp_status_t mp__cuda_ipc_export(mp_device_t *dev, void *base,
                                       size_t bytes, bool vm,
                                       mp_ipc_handle_t *h) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!mp__cu.has_ipc)
    return mp__cuda_no_ipc(dev);
  CUresult r;
  if (!vm) {
    CUipcMemHandle ih;
    MP__CU_IN_CTX_RELAXED(cd, r,
                          mp__cu.IpcGetMemHandle(&ih, (CUdeviceptr)base));
    if (r != CUDA_SUCCESS)
      return mp__cuda_fail(r, "cuIpcGetMemHandle(%p)", base);
    _Static_assert(sizeof ih <= sizeof h->opaque, "CUipcMemHandle fits");
    memcpy(h->opaque, &ih, sizeof ih);
    h->kind = MP_IPC_CUDA;
    return MP_OK;
  }
  if (!(cd->prop.requestedHandleTypes &
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return mp__fail(MP_ENOTSUP,
                    "%s cannot export virtual memory by file descriptor "
                    "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_"
                    "SUPPORTED is 0)",
                    dev->name);
  pthread_mutex_lock(&cd->lock);
  const mp__cuda_entry_t *e = mp__ptrmap_find(&cd->chunks, (uintptr_t)base);
  bool ok = e != NULL && e->size == bytes;
  CUmemGenericAllocationHandle gh = ok ? e->handle : 0;
  pthread_mutex_unlock(&cd->lock);
  if (!ok)
    return mp__fail(MP_EINVAL, "ipc_export: (%p, %zu) is not one mapping of %s",
                    base, bytes, dev->name);
  int fd = -1;
  MP__CU_IN_CTX_RELAXED(
      cd, r,
      mp__cu.MemExportToShareableHandle(
          &fd, gh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  if (r != CUDA_SUCCESS)
    return mp__cuda_fail(r, "cuMemExportToShareableHandle(%p)", base);
  /* Close-on-exec, as the lease and a received handle's descriptors are:
   * cuda.h does not say the driver's descriptor is, and a program that
   * starts another before closing the handle would hand it the memory. */
  (void)fcntl(fd, F_SETFD, FD_CLOEXEC); /* its only descriptor flag */
  h->kind = MP_IPC_FD;
  h->fd = fd;
  /* What tells this export from every other one in the lease's stamp
   * (ipc.c): the descriptors of two chunks may name one file (the fake
   * driver's all do; cuda.h does not say what a real one's are), so two
   * blocks of the same offset and size in different chunks would stamp
   * alike, and a stale copy of one would pass for the other's lease. The
   * import of a descriptor reads nothing of opaque. */
  static atomic_uint_fast64_t exports;
  uint64_t id[2] = {(uint64_t)getpid(), atomic_fetch_add(&exports, 1) + 1};
  memcpy(h->opaque, id, sizeof id);
  return MP_OK;
}

/* An import refused after it mapped (why: its refusal, in mp_last_error()
 * and r), whose unmap the driver refused too (unmap, what it answered):
 * the memory stays mapped at p. ipc_open's failure then sets *out to p,
 * which mp_ipc_import keeps for mp_device_close to unmap (ipc.c, left);
 * backend.h's ipc_open sets *out on success only otherwise. */
static mp_status_t mp__cuda_import_left(mp_device_t *dev, CUresult unmap,
                                        const char *call, CUdeviceptr p,
                                        void **out) {
  char why[MP__ERROR_MAX], refusal[384], mode[384];
  snprintf(why, sizeof why, "%s", mp_last_error());
  mp__cuda_describe(refusal, sizeof refusal, unmap, call);
  *out = (void *)p;
  return mp__fail_driver((int)unmap, mp__cuda_status_of(unmap),
                         "%s; and the undoing %s, so the memory stays mapped "
                         "at %p on %s until mp_device_close%s",
                         why, refusal, (void *)p, dev->name,
                         mp__cuda_take_unrestored(mode, sizeof mode));
}

/* Imports a descriptor's allocation and maps it at a fresh reservation,
 * readable and writable from this device; undone step by step on failure.
 * *map_refused: whether cuMemMap was the step refused. *left: what stays
 * mapped where the undoing cuMemUnmap was refused too (its answer in
 * *unmap_r), else 0. */
static CUresult mp__cuda_import_fd(mp__cuda_dev_t *cd, int fd, size_t bytes,
                                   CUdeviceptr *out, bool *map_refused,
                                   CUdeviceptr *left, CUresult *unmap_r) {
  CUmemGenericAllocationHandle gh = 0;
  CUdeviceptr va = 0;
  *map_refused = false;
  *left = 0;
  CUresult r = mp__cu.MemImportFromShareableHandle(
      &gh, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return r;
  r = mp__cu.MemAddressReserve(&va, bytes, cd->granularity, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = mp__cu.MemMap(va, bytes, 0, gh, 0);
    *map_refused = r != CUDA_SUCCESS;
    CUmemAccessDesc access = {.location = cd->prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (r == CUDA_SUCCESS &&
        (r = mp__cu.MemSetAccess(va, bytes, &access, 1)) != CUDA_SUCCESS &&
        (*unmap_r = mp__cu.MemUnmap(va, bytes)) != CUDA_SUCCESS)
      *left = va; /* mapped, in its reservation: ipc_close's to undo */
    if (r != CUDA_SUCCESS && *left == 0 &&
        mp__cu.MemAddressFree(va, bytes) != CUDA_SUCCESS)
      mp__cuda_track_left(cd, &cd->reserves,
                          &(mp__cuda_entry_t){.key = va, .size = bytes});
  }
  /* The mapping keeps the memory. A release refused keeps the exporter's
   * memory alive, mapped or not: close releases it. */
  CUmemGenericAllocationHandle stray = mp__cuda_release_unmapped(gh);
  if (stray != 0)
    mp__cuda_track_left(
        cd, &cd->handles,
        &(mp__cuda_entry_t){.key = (uintptr_t)stray, .handle = stray});
  if (r == CUDA_SUCCESS)
    *out = va;
  return r;
}

static mp_status_t mp__cuda_ipc_open(mp_device_t *dev, const mp_ipc_handle_t *h,
                                     void **out) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  if (!mp__cu.has_ipc)
    return mp__cuda_no_ipc(dev);
  CUdeviceptr p = 0;
  CUresult r;
  if (h->kind == MP_IPC_CUDA) {
    CUipcMemHandle ih;
    memcpy(&ih, h->opaque, sizeof ih);
    /* The handle's sizes are the sender's word: the memory mapped is the
     * exporter's whole allocation (cuda.h, cuIpcOpenMemHandle), which must
     * hold them, or the block would lie past it. The open, its check and
     * its undoing are one relaxed section: a refused restore of the
     * thread's mode is told once, after them all, with the failure (its
     * message, never in place of it) or as a success's last error. */
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult range = CUDA_SUCCESS, undo = CUDA_SUCCESS;
    bool bad = false;
    mp__cuda_relaxed_t rx = mp__cuda_relax();
    r = mp__cuda_push(cd);
    if (r == CUDA_SUCCESS) {
      r = mp__cu.IpcOpenMemHandle(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      if (r == CUDA_SUCCESS) {
        range = mp__cu.MemGetAddressRange(&base, &size, p);
        bad = range != CUDA_SUCCESS || base != p || size < h->mem_bytes;
        if (bad)
          undo = mp__cu.IpcCloseMemHandle(p);
      }
      mp__cuda_pop();
    }
    mp__cuda_unrelax_after(&rx, r != CUDA_SUCCESS || bad);
    if (r != CUDA_SUCCESS)
      return mp__cuda_fail(r, "cuIpcOpenMemHandle on %s", dev->name);
    if (bad) {
      char mode[384];
      mp_status_t st =
          range != CUDA_SUCCESS
              ? mp__cuda_fail(range,
                              "mp_ipc_import: cuMemGetAddressRange of what "
                              "the handle maps on %s",
                              dev->name)
              : mp__fail(MP_EINVAL,
                         "mp_ipc_import: the handle says %zu bytes of memory, "
                         "the allocation it names on %s has %zu%s",
                         h->mem_bytes, dev->name, size,
                         mp__cuda_take_unrestored(mode, sizeof mode));
      return undo == CUDA_SUCCESS
                 ? st
                 : mp__cuda_import_left(dev, undo, "cuIpcCloseMemHandle", p,
                                        out);
    }
  } else {
    if (!cd->vmm)
      return mp__cuda_no_vmm(dev);
    if (h->mem_bytes % cd->granularity != 0)
      return mp__fail(MP_EINVAL,
                      "mp_ipc_import: %zu bytes is not a multiple of %s's "
                      "granularity (%zu)",
                      h->mem_bytes, dev->name, cd->granularity);
    bool map_refused = false;
    CUdeviceptr left = 0;
    CUresult unmap_r = CUDA_SUCCESS;
    MP__CU_IN_CTX_RELAXED(cd, r,
                          mp__cuda_import_fd(cd, h->fd, h->mem_bytes, &p,
                                             &map_refused, &left, &unmap_r));
    /* The handle's mem_bytes is the sender's word too, and no driver call
     * tells an imported allocation's size: the map is the comparison,
     * since cuMemMap maps no more than the allocation ("offset + size must
     * be less than the size of the memory allocation", cuda.h) and the
     * size is a multiple of the granularity (checked above). */
    if (r == CUDA_ERROR_INVALID_VALUE && map_refused)
      return mp__cuda_fail(r,
                           "mp_ipc_import: the handle says %zu bytes of "
                           "memory, more than the allocation descriptor %d "
                           "names holds on %s (a forged or stale handle?): "
                           "cuMemMap",
                           h->mem_bytes, h->fd, dev->name);
    if (r != CUDA_SUCCESS) {
      (void)mp__cuda_fail(r, "mp_ipc_import of descriptor %d (%zu bytes) on %s",
                          h->fd, h->mem_bytes, dev->name);
      return left == 0
                 ? mp_last_status()
                 : mp__cuda_import_left(dev, unmap_r, "cuMemUnmap", left, out);
    }
  }
  *out = (void *)p;
  return MP_OK;
}

static mp_status_t mp__cuda_ipc_close(mp_device_t *dev, void *base,
                                      size_t bytes, unsigned kind,
                                      bool *unmapped) {
  mp__cuda_dev_t *cd = mp__cuda_of(dev);
  *unmapped = false;
  /* No wait here: ipc.c has waited for the work that may use it (the
   * device's, or one stream's). Relaxed, as every unmap and free. */
  CUresult r;
  if (kind == MP_IPC_CUDA) {
    MP__CU_IN_CTX_RELAXED(cd, r, mp__cu.IpcCloseMemHandle((CUdeviceptr)base));
    *unmapped = r == CUDA_SUCCESS;
  } else {
    /* Unmapped, the memory is gone: a failing address free after it
     * leaves only the reservation behind, which close releases. One
     * relaxed section for both: a refused restore of the thread's mode
     * is told once, with the address free's refusal (its message) or as
     * the close's last error, never lost to the other call. */
    mp__cuda_relaxed_t rx = mp__cuda_relax();
    r = mp__cuda_push(cd);
    if (r == CUDA_SUCCESS) {
      r = mp__cu.MemUnmap((CUdeviceptr)base, bytes);
      *unmapped = r == CUDA_SUCCESS;
      if (r == CUDA_SUCCESS)
        r = mp__cu.MemAddressFree((CUdeviceptr)base, bytes);
      mp__cuda_pop();
    }
    mp__cuda_unrelax(&rx, r);
    if (*unmapped && r != CUDA_SUCCESS)
      mp__cuda_track_left(
          cd, &cd->reserves,
          &(mp__cuda_entry_t){.key = (uintptr_t)base, .size = bytes});
  }
  return r == CUDA_SUCCESS
             ? MP_OK
             : mp__cuda_fail(r, "mp_ipc_close(%p) on %s", base, dev->name);
}

const mp__backend_t mp__cuda_backend = {
    .name = "cuda",
    .open = mp__cuda_open,
    .close_ready = mp__cuda_close_ready,
    .close = mp__cuda_close,
    .mem_info = mp__cuda_mem_info,
    .alloc = mp__cuda_alloc,
    .free = mp__cuda_free,
    .host_alloc = mp__cuda_host_alloc,
    .host_free = mp__cuda_host_free,
    .synchronize = mp__cuda_synchronize,
    .stream_create = mp__cuda_stream_create,
    .stream_destroy = mp__cuda_stream_destroy,
    .stream_synchronize = mp__cuda_stream_synchronize,
    .stream_query = mp__cuda_stream_query,
    .stream_kind = mp__cuda_stream_kind,
    .stream_capturing = mp__cuda_stream_capturing,
    .capture_seen = mp__cuda_capture_seen,
    .stream_capture_id = mp__cuda_stream_capture_id,
    .capture_on_release = mp__cuda_capture_on_release,
    .stream_owned = mp__cuda_stream_owned,
    .stream_ordinal = mp__cuda_stream_ordinal,
    .ordinal = mp__cuda_ordinal,
    .launch_host = mp__cuda_launch_host,
    .memcpy_async = mp__cuda_memcpy_async,
    .memset_async = mp__cuda_memset_async,
    .event_create = mp__cuda_event_create,
    .event_destroy = mp__cuda_event_destroy,
    .event_record = mp__cuda_event_record,
    .event_query = mp__cuda_event_query,
    .event_synchronize = mp__cuda_event_synchronize,
    .stream_wait_event = mp__cuda_stream_wait_event,
    .vm_granularity = mp__cuda_vm_granularity,
    .vm_reserve = mp__cuda_vm_reserve,
    .vm_release = mp__cuda_vm_release,
    .vm_map = mp__cuda_vm_map,
    .vm_unmap = mp__cuda_vm_unmap,
    .vm_access = mp__cuda_vm_access,
    .ipc_export = mp__cuda_ipc_export,
    .ipc_open = mp__cuda_ipc_open,
    .ipc_close = mp__cuda_ipc_close,
};

#endif /* MEMPOOL_HAVE_CUDA */
