/* real.c - the real entry points, in one room: glibc's dlsym, the real
 * driver's and runtime's functions (the tables of hooklist.h), and the
 * shim's own address range. Calls no other file of the shim.
 *
 * glibc's dlsym is found without pthread_once and the shim's range comes
 * from the linker, not from dl_iterate_phdr: both serve lookup.c's dlsym,
 * which a sanitizer runtime may call before it has started (see lookup.c),
 * and are built without the sanitizers' instrumentation. The tables are
 * resolved once each, on first use, by pthread_once; their lookups are made
 * from the shim, so dlsym returns the libraries' own functions, never the
 * hooks. */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "preload.h"

/* ---- glibc's dlsym --------------------------------------------------------
 */

/* The shim's mapped image, from its ELF header to the end of its bss, as
 * the linker placed them (GNU ld, gold and lld all define both). */
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden")));
extern const char _end[] __attribute__((visibility("hidden")));

static _Atomic(mp__dlsym_fn) mp__real_dlsym_fn;

/* glibc 2.34 moved dlsym into libc as dlsym@GLIBC_2.34 and kept the older
 * version names as aliases; one of these is always there. */
MP__UNSANITIZED static mp__dlsym_fn mp__find_real(void) {
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5",
                                         "GLIBC_2.17", "GLIBC_2.0"};
  mp__dlsym_fn fn = NULL;
  for (size_t i = 0; fn == NULL && i < sizeof versions / sizeof *versions; i++)
    fn = (mp__dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
  return fn;
}

/* No pthread_once (TSan's interceptor of it needs TSan started): threads
 * that race on the first lookup each find the same function and store it. */
MP__UNSANITIZED mp__dlsym_fn mp__pl_glibc_dlsym(void) {
  mp__dlsym_fn fn =
      atomic_load_explicit(&mp__real_dlsym_fn, memory_order_acquire);
  if (MP__UNLIKELY(fn == NULL)) {
    fn = mp__find_real();
    atomic_store_explicit(&mp__real_dlsym_fn, fn, memory_order_release);
  }
  return fn;
}

void *mp__pl_real_dlsym(void *handle, const char *name) {
  mp__dlsym_fn fn = mp__pl_glibc_dlsym();
  return fn ? fn(handle, name) : NULL;
}

MP__UNSANITIZED bool mp__pl_from_self(const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  return a >= (uintptr_t)&__ehdr_start && a < (uintptr_t)_end;
}

/* ---- the real driver and runtime ------------------------------------------
 */

static mp__real_cuda_t mp__rc;
static pthread_once_t mp__rc_once = PTHREAD_ONCE_INIT;
static mp__real_cudart_t mp__rrt;
static pthread_once_t mp__rrt_once = PTHREAD_ONCE_INIT;

/* Every member of the driver's table (cu) or the runtime's (!cu), looked
 * up in handle h. */
#define MP__PL_RESOLVE(lib, result, name, params) MP__PL_RESOLVE_##lib(name)
#define MP__PL_RESOLVE_cu(name)                                                \
  if (cu)                                                                      \
    mp__rc.name = (__typeof__(mp__rc.name))mp__pl_real_dlsym(h, #name);
#define MP__PL_RESOLVE_rt(name)                                                \
  if (!cu)                                                                     \
    mp__rrt.name = (__typeof__(mp__rrt.name))mp__pl_real_dlsym(h, #name);
#define MP__PL_RESOLVE_own(name) /* the shim's own */
static void mp__resolve(void *h, bool cu) {
  MP__PL_HOOKS(MP__PL_RESOLVE)
  MP__PL_REAL(MP__PL_RESOLVE)
}

/* The driver is whatever libcuda.so.1 the process has (or would load). */
static void mp__rc_start(void) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == NULL)
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL)
    return;
  mp__resolve(h, true);
}

const mp__real_cuda_t *mp__pl_real_cuda(void) {
  pthread_once(&mp__rc_once, mp__rc_start);
  return &mp__rc;
}

/* The first loaded object named like the runtime: its name copied into
 * ctx (an mp__cudart_name_t), for dlopen to open once the walk is over. */
typedef struct mp__cudart_name {
  char path[4096];
  bool found;
} mp__cudart_name_t;

static int mp__find_cudart(struct dl_phdr_info *info, size_t size, void *ctx) {
  (void)size;
  mp__cudart_name_t *n = ctx;
  const char *name = info->dlpi_name;
  size_t len = name != NULL ? strlen(name) : 0;
  if (len == 0 || len >= sizeof n->path || strstr(name, "libcudart.so") == NULL)
    return 0;
  memcpy(n->path, name, len + 1);
  n->found = true;
  return 1;
}

/* The shared runtime is normally next after the shim in the global scope.
 * A runtime loaded privately (a Python extension's dependency, opened
 * RTLD_LOCAL) is not, though its calls still reach the shim: it is then
 * found among the loaded objects by name, and opened after the walk.
 * glibc's dl_iterate_phdr calls its callback holding the loader's write
 * lock, which dlopen takes after the loader's lock: a dlopen from the
 * callback, with a dlopen on another thread in between, hung both. */
static void mp__rrt_start(void) {
  void *h = RTLD_NEXT;
  if (mp__pl_real_dlsym(h, "cudaMalloc") == NULL) {
    mp__cudart_name_t n;
    n.found = false;
    dl_iterate_phdr(mp__find_cudart, &n);
    h = n.found ? dlopen(n.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (h == NULL)
      return;
  }
  mp__resolve(h, false);
}

const mp__real_cudart_t *mp__pl_real_cudart(void) {
  pthread_once(&mp__rrt_once, mp__rrt_start);
  return &mp__rrt;
}
