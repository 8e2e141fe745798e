/* rt_prog.c - a CUDA runtime program (shared libcudart) that the preload
 * tests run with and without libmempool_preload.so.
 *
 *   rt_prog N [atexit|fork]
 * makes N cudaMalloc and one cudaMallocAsync allocation of assorted sizes,
 * frees them with cudaFree / cudaFreeAsync, reads cudaMemGetInfo while they
 * are live and after, and prints what it did as key=value words:
 *   allocs=A frees=F live_free=X free=Y total=T
 * It exits 0 when every call succeeded and 2 (naming the call) otherwise.
 * "atexit" leaves one block to an exit handler to free; "fork" also runs
 * allocations in a forked child and frees a parent's block there;
 * "fork-signal" does the same and the child then raises SIGUSR1, which
 * must end it (the default action: a forked child writes no snapshot, so
 * MEMPOOL_SNAPSHOT_SIGNAL must leave the signal as it was there);
 * "fork-handler" first installs a SIGUSR1 handler of its own, which the
 * child's raise must run (the child then exits 0);
 * "threads" first has 4 threads race through N allocate/free pairs each
 * (then goes on with at most 64);
 * "host-memory" writes to the pinned and managed blocks it makes (which it
 * always makes and frees once, outside the counts); "errors" first checks
 * that misuse is cudaErrorInvalidValue (a double free, an interior
 * pointer, cudaMemGetInfo with a NULL output); "pause" pauses the whole
 * process through the shim's mempool_preload_pause (content kept), checks
 * that the memory went back and allocations wait for the resume, resumes
 * and checks the content (prints paused_gain=bytes); "wait-snapshot PATH"
 * makes three blocks (1 MiB, 3 MiB, 12345 bytes), prints "ready", waits up
 * to 30 s for a snapshot to appear at PATH (a signal's, written while the
 * blocks are live), moves it to PATH.signal, prints snapshot_seen=0|1 and
 * frees them; "_exit" ends with _exit(0), past every exit handler (a
 * crash or a killed process leaves its files the same way); "locale"
 * first calls setlocale(LC_ALL, "") (as many programs do) and prints
 * radix=<its decimal point>. */
#define _GNU_SOURCE /* sigaction */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <locale.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int allocs, frees;
static void *leftover;

static void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    printf("FAILED %s: %s (%d)\n", what, cudaGetErrorName(e), (int)e);
    fflush(stdout);
    exit(2);
  }
}

static void free_leftover(void) {
  check(cudaFree(leftover), "cudaFree in an exit handler");
  frees++;
}

/* The child of a fork: the parent's pool is gone here; fresh allocations
 * work, and a parent's pointer is unknown (so not freed twice). */
static int child_work(void *parents) {
  void *p = NULL;
  if (cudaMalloc(&p, 1 << 16) != cudaSuccess || p == NULL)
    return 3;
  if (cudaFree(p) != cudaSuccess)
    return 4;
  if (cudaFree(parents) == cudaSuccess)
    return 5;
  return 0;
}

static int per_thread;

/* "fork-handler": the program's own SIGUSR1 handler. */
static volatile sig_atomic_t handled;

static void on_usr1(int sig) {
  (void)sig;
  handled = 1;
}

static int signal_handler_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGUSR1, &sa, NULL);
}

static void *thread_work(void *arg) {
  (void)arg;
  for (int i = 0; i < per_thread; i++) {
    void *q = NULL;
    check(cudaMalloc(&q, (size_t)(i % 5 + 1) * 1000), "cudaMalloc (thread)");
    allocs++;
    check(cudaFree(q), "cudaFree (thread)");
    frees++;
  }
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 16;
  const char *mode = argc > 2 ? argv[2] : "";
  if (n < 1 || n > 100000)
    n = 16;
  if (strcmp(mode, "locale") == 0) {
    setlocale(LC_ALL, "");
    printf("radix=%s\n", localeconv()->decimal_point);
  }
  if (strcmp(mode, "errors") == 0) {
    char *q = NULL;
    size_t t = 0;
    check(cudaMalloc((void **)&q, 1 << 16), "cudaMalloc");
    if (cudaFree(q + 256) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaFree of an interior pointer");
    check(cudaFree(q), "cudaFree");
    if (cudaFree(q) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "a second cudaFree");
    if (cudaMemGetInfo(NULL, &t) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaMemGetInfo(NULL, ...)");
    /* cudaMallocManaged: "flags must be one of cudaMemAttachGlobal or
     * cudaMemAttachHost" (CUDA Runtime API, cudaMallocManaged); anything
     * else is cudaErrorInvalidValue and allocates nothing. */
    void *m = NULL;
    if (cudaMallocManaged(&m, 4096, 0) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaMallocManaged with flags 0");
    if (cudaMallocManaged(&m, 4096, cudaMemAttachGlobal | cudaMemAttachHost) !=
        cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaMallocManaged with both flags");
  }
  if (strcmp(mode, "pause") == 0) {
    int (*pause_all)(unsigned);
    int (*resume_all)(void);
    *(void **)&pause_all = dlsym(RTLD_DEFAULT, "mempool_preload_pause");
    *(void **)&resume_all = dlsym(RTLD_DEFAULT, "mempool_preload_resume");
    if (pause_all == NULL || resume_all == NULL)
      check(cudaErrorUnknown, "the shim's pause entry points");
    unsigned char *q = NULL, *r = NULL;
    size_t f0 = 0, f1 = 0, t = 0;
    check(cudaMalloc((void **)&q, 8 << 20), "cudaMalloc");
    memset(q, 7, 8 << 20); /* host-accessible on the emulated device */
    check(cudaMemGetInfo(&f0, &t), "cudaMemGetInfo");
    if (pause_all(1) != 0)
      check(cudaErrorUnknown, "mempool_preload_pause");
    check(cudaMemGetInfo(&f1, &t), "cudaMemGetInfo (paused)");
    if (cudaMalloc((void **)&r, 4096) == cudaSuccess)
      check(cudaErrorUnknown, "cudaMalloc while paused succeeded");
    if (pause_all(1) == 0)
      check(cudaErrorUnknown, "a second pause succeeded");
    if (resume_all() != 0)
      check(cudaErrorUnknown, "mempool_preload_resume");
    for (size_t i = 0; i < (8u << 20); i++)
      if (q[i] != 7)
        check(cudaErrorUnknown, "content after resume");
    check(cudaFree(q), "cudaFree");
    printf("paused_gain=%zu ", f1 > f0 ? f1 - f0 : 0);
  }
  if (strcmp(mode, "wait-snapshot") == 0 && argc > 3) {
    static const size_t sizes[3] = {1 << 20, 3 << 20, 12345};
    void *b[3];
    for (int i = 0; i < 3; i++) {
      check(cudaMalloc(&b[i], sizes[i]), "cudaMalloc");
      allocs++;
    }
    printf("ready\n");
    fflush(stdout);
    char moved[4096];
    snprintf(moved, sizeof moved, "%s.signal", argv[3]);
    int seen = 0;
    for (int t = 0; t < 3000 && !seen; t++) {
      if (rename(argv[3], moved) == 0)
        seen = 1;
      else
        poll(NULL, 0, 10); /* 10 ms */
    }
    printf("snapshot_seen=%d ", seen);
    for (int i = 0; i < 3; i++) {
      check(cudaFree(b[i]), "cudaFree");
      frees++;
    }
  }
  if (strcmp(mode, "threads") == 0) {
    pthread_t t[4];
    per_thread = n;
    for (int i = 0; i < 4; i++)
      if (pthread_create(&t[i], NULL, thread_work, NULL) != 0)
        return 1;
    for (int i = 0; i < 4; i++)
      pthread_join(t[i], NULL);
    if (n > 64)
      n = 64; /* N is the threads' count; the rest stays small */
  }
  void **p = calloc((size_t)n, sizeof *p);
  if (p == NULL)
    return 1;
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)(i % 7 + 1) * 4096 + (size_t)i * 512;
    check(cudaMalloc(&p[i], bytes), "cudaMalloc");
    if (p[i] == NULL)
      check(cudaErrorMemoryAllocation, "cudaMalloc returned NULL");
    allocs++;
  }
  void *a = NULL;
  check(cudaMallocAsync(&a, 1 << 20, 0), "cudaMallocAsync");
  allocs++;
  size_t live_free = 0, total = 0;
  check(cudaMemGetInfo(&live_free, &total), "cudaMemGetInfo");
  check(cudaFreeAsync(a, 0), "cudaFreeAsync");
  frees++;
  for (int i = 0; i < n; i += 2) {
    check(cudaFree(p[i]), "cudaFree");
    frees++;
  }
  bool signal = strcmp(mode, "fork-signal") == 0;
  bool handler = strcmp(mode, "fork-handler") == 0;
  if (handler)
    (void)signal_handler_install();
  if (strcmp(mode, "fork") == 0 || signal || handler) {
    /* Pinned memory first, so that the child starts with its parent's
     * host pool, which the shim's fork reset must leave reachable (a leak
     * checker in the child reported it). The free's stream-ordered
     * bookkeeping queues work on the device, so the fork also lands while
     * a stream worker may be running it: the child must not inherit an
     * allocator lock from it (src/device/host.c, host_on_worker). */
    char *pinned = NULL;
    check(cudaMallocHost((void **)&pinned, 64), "cudaMallocHost");
    check(cudaFreeHost(pinned), "cudaFreeHost");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      int rc = child_work(p[1]);
      free(p);
      if (rc == 0 && (signal || handler))
        raise(SIGUSR1);
      /* ThreadSanitizer runs a signal's handler at the thread's next
       * blocking call: one is made (up to 30 s) before the check. */
      for (int i = 0; rc == 0 && handler && !handled && i < 3000; i++)
        usleep(10000);
      if (rc == 0 && handler && !handled)
        rc = 7; /* the program's handler did not run */
      exit(rc); /* exit, not _exit: the shim's exit runs */
    }
    int status = 0;
    bool ended = pid > 0 && waitpid(pid, &status, 0) == pid;
    if (!ended || (signal ? !WIFSIGNALED(status) || WTERMSIG(status) != SIGUSR1
                          : !WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
      printf("FAILED fork child: status %d\n", status);
      return 2;
    }
  }
  /* the last odd index is the exit handler's, in "atexit" mode */
  int keep = strcmp(mode, "atexit") == 0 && n >= 2
                 ? ((n - 1) % 2 == 1 ? n - 1 : n - 2)
                 : -1;
  for (int i = 1; i < n; i += 2) {
    if (i == keep) {
      leftover = p[i];
      continue;
    }
    check(cudaFree(p[i]), "cudaFree");
    frees++;
  }
  /* Pinned and managed memory: not device allocations, not in the trace. */
  char *pinned = NULL, *managed = NULL;
  check(cudaMallocHost((void **)&pinned, 4096), "cudaMallocHost");
  check(cudaMallocManaged((void **)&managed, 4096, cudaMemAttachGlobal),
        "cudaMallocManaged");
  if (strcmp(mode, "host-memory") == 0) {
    memset(pinned, 1, 4096); /* both are host-accessible on the emulator */
    memset(managed, 2, 4096);
  }
  check(cudaFreeHost(pinned), "cudaFreeHost");
  check(cudaFree(managed), "cudaFree (managed)");
  size_t idle_free = 0;
  check(cudaMemGetInfo(&idle_free, &total), "cudaMemGetInfo");
  if (leftover != NULL)
    atexit(free_leftover);
  printf("allocs=%d frees=%d live_free=%zu free=%zu total=%zu\n", (int)allocs,
         leftover ? (int)frees + 1 : (int)frees, live_free, idle_free, total);
  free(p);
  if (strcmp(mode, "_exit") == 0) {
    fflush(stdout);
    _exit(0); /* no exit handler runs, the shim's neither */
  }
  return 0;
}
