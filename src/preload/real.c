/* real.c - the real entry points, in one room: glibc's dlsym, the real
 * driver's and runtime's functions (the tables of hooklist.h), and the
 * shim's own address range. Calls no other file of the shim.
 *
 * glibc's dlsym is found without pthread_once and the shim's range comes
 * from the linker, not from dl_iterate_phdr: both serve lookup.c's dlsym,
 * which a sanitizer runtime may call before it has started (see lookup.c),
 * and are built without the sanitizers' instrumentation. The tables are
 * resolved once each, on first use, with no lock held over the lookups
 * (see mp__publish); their lookups are made from the shim, so dlsym
 * returns the libraries' own functions, never the hooks. */
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

/* Each table is resolved by the first calls, with no lock held (neither a
 * pthread_once nor a mutex around the dlopen and dlsym): glibc runs a
 * library's constructors holding the loader's lock, which those calls
 * take, so a constructor whose CUDA call asked for a table while another
 * thread's first lookup held a once over its dlopen waited for the once,
 * the dlopen for the constructor's lock, and both hung. Threads that race
 * each resolve into a scratch table; the first to finish copies its own
 * in under mp__publish_lock, which is held for the copy only, and ready
 * tells the later calls. */
static mp__real_cuda_t mp__rc;
static atomic_bool mp__rc_ready;
static mp__real_cudart_t mp__rrt;
static atomic_bool mp__rrt_ready;
static pthread_mutex_t mp__publish_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread held mp__publish_lock left it held for good
 * in the child, which has only the forking thread, and the child's first
 * lookup waited for ever (pthread_once recovered there). The child starts
 * with the lock free: a copy the fork cut short was never marked ready
 * (ready is set last, under the lock), so its table is resolved and
 * copied again by the child's first caller. Every first caller registers
 * the handler before it takes the lock, so none holds it unregistered (two
 * racing callers register it twice, which does no harm); only when
 * pthread_atfork is refused (out of memory) does a caller take the lock
 * with no handler, as before, and the next first caller tries again. */
static atomic_bool mp__publish_atfork;

static void mp__publish_child(void) {
  pthread_mutex_init(&mp__publish_lock, NULL);
}

static void mp__publish(void *table, const void *scratch, size_t size,
                        atomic_bool *ready) {
  if (!atomic_load_explicit(&mp__publish_atfork, memory_order_acquire) &&
      pthread_atfork(NULL, NULL, mp__publish_child) == 0)
    atomic_store_explicit(&mp__publish_atfork, true, memory_order_release);
  pthread_mutex_lock(&mp__publish_lock);
  if (!atomic_load_explicit(ready, memory_order_relaxed)) {
    memcpy(table, scratch, size);
    atomic_store_explicit(ready, true, memory_order_release);
  }
  pthread_mutex_unlock(&mp__publish_lock);
}

/* Every member of the driver's table (rc non-NULL) or the runtime's (rrt),
 * looked up in handle h. */
#define MP__PL_RESOLVE(lib, result, name, params) MP__PL_RESOLVE_##lib(name)
#define MP__PL_RESOLVE_cu(name)                                                \
  if (rc != NULL)                                                              \
    rc->name = (__typeof__(rc->name))mp__pl_real_dlsym(h, #name);
#define MP__PL_RESOLVE_rt(name)                                                \
  if (rrt != NULL)                                                             \
    rrt->name = (__typeof__(rrt->name))mp__pl_real_dlsym(h, #name);
#define MP__PL_RESOLVE_own(name) /* the shim's own */
static void mp__resolve(void *h, mp__real_cuda_t *rc, mp__real_cudart_t *rrt) {
  MP__PL_HOOKS(MP__PL_RESOLVE)
  MP__PL_REAL(MP__PL_RESOLVE)
}

/* The driver is whatever libcuda.so.1 the process has (or would load). */
static void mp__rc_start(mp__real_cuda_t *rc) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == NULL)
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL)
    return;
  mp__resolve(h, rc, NULL);
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
static void mp__rrt_start(mp__real_cudart_t *rrt) {
  void *h = RTLD_NEXT;
  if (mp__pl_real_dlsym(h, "cudaMalloc") == NULL) {
    mp__cudart_name_t n;
    n.found = false;
    dl_iterate_phdr(mp__find_cudart, &n);
    h = n.found ? dlopen(n.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (h == NULL)
      return;
  }
  mp__resolve(h, NULL, rrt);
}

/* The getter fn of table (its type, ready flag and start), as
 * mp__publish says: a scratch table on each first caller's stack, in a
 * function of its own, out of the way of the getter's every later call. */
#define MP__PL_TABLE_GETTER(fn, type, table, ready, start)                     \
  __attribute__((noinline, cold)) static void fn##_first(void) {               \
    type scratch;                                                              \
    memset(&scratch, 0, sizeof scratch);                                       \
    start(&scratch);                                                           \
    mp__publish(&table, &scratch, sizeof scratch, &ready);                     \
  }                                                                            \
  const type *fn(void) {                                                       \
    if (MP__UNLIKELY(!atomic_load_explicit(&ready, memory_order_acquire)))     \
      fn##_first();                                                            \
    return &table;                                                             \
  }
MP__PL_TABLE_GETTER(mp__pl_real_cuda, mp__real_cuda_t, mp__rc, mp__rc_ready,
                    mp__rc_start)
MP__PL_TABLE_GETTER(mp__pl_real_cudart, mp__real_cudart_t, mp__rrt,
                    mp__rrt_ready, mp__rrt_start)
