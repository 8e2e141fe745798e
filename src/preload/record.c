/* record.c - what the shim writes: the trace and the report.
 *
 * $MEMPOOL_TRACE=path.csv: every device allocation and free, one line each,
 * in RMM's logging format (API.md): Thread,Time,Action,Pointer,Size,Stream,
 * which `mpbench replay` and RMM's replay benchmark read. A path ending in
 * ".json" gets a Chrome / Perfetto trace instead: an instant event per call
 * and two counter tracks, reserved and live bytes. Pinned and managed
 * memory is not device memory the pool could serve: it is counted in the
 * report and marked in the .json trace, never written to the CSV, so a
 * replay sees exactly the device allocations.
 * $MEMPOOL_REPORT=path|stderr: JSON statistics at exit; "torch" holds every
 * pool's torch.cuda.memory_stats() names, keyed by device, as
 * mp_pool_dump(pool, f, "torch") writes them.
 * $MEMPOOL_SNAPSHOT=path: every device's pool as one PyTorch snapshot
 * pickle at exit (each segment's "device" and device_traces[ordinal]; open
 * it in memory_viz; with MEMPOOL_CONF=history=N it carries the last N
 * events per pool), and mempool_preload_snapshot(path) writes one whenever
 * the program asks (through ctypes, say). $MEMPOOL_SNAPSHOT_SIGNAL=USR1
 * (USR2, or a signal number) writes one each time the process gets that
 * signal: the handler only writes a byte to a pipe (async-signal-safe);
 * a helper thread, started with the shim in pool mode and blocking every
 * signal, reads it and writes the snapshot, so a program stuck or asleep
 * outside any CUDA call still answers. Signals that come faster than
 * snapshots are written coalesce. The handler replaces the program's own
 * for that signal (installed at the first hooked call): choose one it does
 * not use.
 * In both paths "%p" stands for the process id. Only a process that made a
 * hooked call writes anything: the many processes a job starts with the
 * variables inherited (shells, tools) leave the files alone.
 *
 * One mutex orders the lines; a line is written whole or not at all. The
 * invariant: a forked child never writes to its parent's files (the buffer
 * is flushed before the fork and the child drops the stream), and the .json
 * trace is closed exactly once, at exit; later events are counted only. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"

static struct {
  pthread_mutex_t lock;
  FILE *trace;
  bool json, first, closed, child;
  const mp__pl_t *pl;
  struct timespec t0;
  /* counters, under lock */
  uint64_t allocs, alloc_failures, frees, pinned, managed;
  uint64_t bypass_capture, bypass_other_device, foreign_frees;
  size_t live, peak_live;
} mp__rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void mp__snapshot_signal_arm(void);

static _Thread_local long mp__tid;

static long mp__thread_id(void) {
  if (mp__tid == 0)
    mp__tid = (long)syscall(SYS_gettid);
  return mp__tid;
}

/* $MEMPOOL_TRACE / $MEMPOOL_REPORT with "%p" replaced by the process id,
 * so that the processes of one job (which inherit the variables) write
 * files of their own; NULL when unset or empty. */
static const char *mp__env_path(const char *var, char *buf, size_t cap) {
  const char *v = getenv(var);
  if (v == NULL || v[0] == '\0')
    return NULL;
  size_t n = 0;
  for (const char *c = v; *c != '\0' && n + 1 < cap; c++) {
    if (c[0] == '%' && c[1] == 'p') {
      int w = snprintf(buf + n, cap - n, "%d", (int)getpid());
      n = w > 0 && (size_t)w < cap - n ? n + (size_t)w : cap - 1;
      c++;
    } else {
      buf[n++] = *c;
    }
  }
  buf[n] = '\0';
  return buf;
}

void mp__pl_record_open(const mp__pl_t *pl) {
  pthread_mutex_lock(&mp__rec.lock);
  mp__rec.pl = pl;
  clock_gettime(CLOCK_MONOTONIC, &mp__rec.t0);
  char buf[4096];
  const char *path = mp__env_path("MEMPOOL_TRACE", buf, sizeof buf);
  if (!mp__rec.child && mp__rec.trace == NULL && path != NULL) {
    size_t n = strlen(path);
    mp__rec.json = n >= 5 && strcmp(path + n - 5, ".json") == 0;
    mp__rec.trace = fopen(path, "w");
    if (mp__rec.trace == NULL) {
      fprintf(stderr,
              "mempool preload: cannot write MEMPOOL_TRACE '%s'; not "
              "tracing\n",
              path);
    } else if (mp__rec.json) {
      fprintf(mp__rec.trace,
              "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
              "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
              "\"args\":{\"name\":\"mempool preload\"}}",
              (int)getpid());
    } else {
      fputs("Thread,Time,Action,Pointer,Size,Stream\n", mp__rec.trace);
    }
  }
  pthread_mutex_unlock(&mp__rec.lock);
  if (pl->mode == MP__PL_POOL && !mp__rec.child)
    mp__snapshot_signal_arm();
}

/* Microseconds since the start, for the .json trace. */
static double mp__since_start_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - mp__rec.t0.tv_sec) * 1e6 +
         (double)(t.tv_nsec - mp__rec.t0.tv_nsec) / 1e3;
}

static void mp__csv_line(const char *action, uintptr_t ptr, size_t size,
                         uintptr_t stream) {
  struct timespec t;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &t);
  localtime_r(&t.tv_sec, &tm);
  char where[32];
  if (ptr != 0)
    snprintf(where, sizeof where, "%#lx", (unsigned long)ptr);
  else
    snprintf(where, sizeof where, "(nil)");
  fprintf(mp__rec.trace, "%ld,%02d:%02d:%02d.%06ld,%s,%s,%zu,%lu\n",
          mp__thread_id(), tm.tm_hour, tm.tm_min, tm.tm_sec,
          (long)(t.tv_nsec / 1000), action, where, size, (unsigned long)stream);
}

static void mp__json_event(const char *name, uintptr_t ptr, size_t size,
                           uintptr_t stream, size_t reserved) {
  double ts = mp__since_start_us();
  int pid = (int)getpid();
  fprintf(mp__rec.trace,
          ",\n{\"name\":\"%s\",\"cat\":\"mempool\",\"ph\":\"i\",\"s\":\"t\","
          "\"ts\":%.3f,\"pid\":%d,\"tid\":%ld,\"args\":{\"ptr\":\"%#lx\","
          "\"size\":%zu,\"stream\":%lu}}",
          name, ts, pid, mp__thread_id(), (unsigned long)ptr, size,
          (unsigned long)stream);
  fprintf(mp__rec.trace,
          ",\n{\"name\":\"reserved bytes\",\"ph\":\"C\",\"ts\":%.3f,"
          "\"pid\":%d,\"args\":{\"bytes\":%zu}}"
          ",\n{\"name\":\"live bytes\",\"ph\":\"C\",\"ts\":%.3f,"
          "\"pid\":%d,\"args\":{\"bytes\":%zu}}",
          ts, pid, reserved, ts, pid, mp__rec.live);
}

/* Reserved bytes: the pool's, or (passthrough) the live ones. Read before
 * taking the record lock, so the pool's lock is never taken inside it. */
static size_t mp__reserved_now(void) {
  const mp__pl_t *pl = mp__rec.pl;
  mp_stats_t s;
  if (pl != NULL && pl->pool != NULL &&
      mp_pool_get_stats(pl->pool, &s) == MP_OK)
    return s.reserved_bytes;
  return SIZE_MAX;
}

static void mp__write(const char *action, uintptr_t ptr, size_t size,
                      uintptr_t stream, size_t reserved) {
  if (mp__rec.trace == NULL || mp__rec.closed)
    return;
  if (!mp__rec.json)
    mp__csv_line(action, ptr, size, stream);
  else
    mp__json_event(action, ptr, size, stream,
                   reserved == SIZE_MAX ? mp__rec.live : reserved);
}

void mp__pl_record_alloc(uintptr_t ptr, size_t size, uintptr_t stream,
                         bool ok) {
  size_t reserved = mp__rec.json ? mp__reserved_now() : 0;
  pthread_mutex_lock(&mp__rec.lock);
  if (ok) {
    mp__rec.allocs++;
    mp__rec.live += size;
    if (mp__rec.live > mp__rec.peak_live)
      mp__rec.peak_live = mp__rec.live;
  } else {
    mp__rec.alloc_failures++;
  }
  mp__write(ok ? "allocate" : "allocate failure", ok ? ptr : 0, size, stream,
            reserved);
  pthread_mutex_unlock(&mp__rec.lock);
}

void mp__pl_record_free(uintptr_t ptr, size_t size, uintptr_t stream) {
  size_t reserved = mp__rec.json ? mp__reserved_now() : 0;
  pthread_mutex_lock(&mp__rec.lock);
  mp__rec.frees++;
  mp__rec.live -= size <= mp__rec.live ? size : mp__rec.live;
  mp__write("free", ptr, size, stream, reserved);
  pthread_mutex_unlock(&mp__rec.lock);
}

void mp__pl_record_other(const char *what, uintptr_t ptr, size_t size) {
  pthread_mutex_lock(&mp__rec.lock);
  if (strcmp(what, "managed") == 0)
    mp__rec.managed++;
  else if (strcmp(what, "pinned") == 0)
    mp__rec.pinned++;
  if (mp__rec.json && mp__rec.trace != NULL && !mp__rec.closed)
    fprintf(mp__rec.trace,
            ",\n{\"name\":\"%s\",\"cat\":\"mempool\",\"ph\":\"i\",\"s\":\"t\","
            "\"ts\":%.3f,\"pid\":%d,\"tid\":%ld,\"args\":{\"ptr\":\"%#lx\","
            "\"size\":%zu}}",
            what, mp__since_start_us(), (int)getpid(), mp__thread_id(),
            (unsigned long)ptr, size);
  pthread_mutex_unlock(&mp__rec.lock);
}

void mp__pl_count_bypass(const char *why) {
  pthread_mutex_lock(&mp__rec.lock);
  if (strcmp(why, "capture") == 0)
    mp__rec.bypass_capture++;
  else if (strcmp(why, "other_device") == 0)
    mp__rec.bypass_other_device++;
  else
    mp__rec.foreign_frees++;
  pthread_mutex_unlock(&mp__rec.lock);
}

static void mp__torch_one(mp_pool_t *pool, int ordinal, void *ctx) {
  (void)ordinal;
  FILE *f = ctx;
  fprintf(f, "%s\n    \"%s\": ", ftell(f) > 0 ? "," : "",
          mp_device_name(mp_pool_device(pool)));
  if (mp_pool_dump(pool, f, "torch") != MP_OK)
    fputs("null", f);
}

/* The members of the report's "torch" object: mp_pool_dump's "torch" view
 * of every pool, keyed by device, written before the record lock is taken
 * (the dump takes each pool's lock; see mp__reserved_now). NULL when there
 * is no pool; free() it. */
static char *mp__torch_views(const mp__pl_t *pl) {
  char *buf = NULL;
  size_t len = 0;
  if (pl == NULL || pl->mode != MP__PL_POOL)
    return NULL;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL)
    return NULL;
  mp__pl_each_pool(mp__torch_one, f);
  if (fclose(f) != 0 || len == 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* pool: the pool's statistics, read before the record lock was taken (see
 * mp__reserved_now); NULL in passthrough. torch: mp__torch_views. */
static void mp__report(FILE *f, const mp__pl_t *pl, const mp_stats_t *pool,
                       const char *torch) {
  const char *mode = pl->mode == MP__PL_POOL ? "pool" : "passthrough";
  fprintf(f,
          "{\n  \"mode\": \"%s\",\n  \"device\": \"%s\",\n"
          "  \"calls\": {\"allocate\": %llu, \"allocate_failure\": %llu, "
          "\"free\": %llu, \"pinned\": %llu, \"managed\": %llu},\n"
          "  \"bypassed\": {\"capture\": %llu, \"other_device\": %llu, "
          "\"foreign_free\": %llu},\n"
          "  \"graph_pools\": %zu,\n"
          "  \"live_bytes\": %zu,\n  \"peak_live_bytes\": %zu",
          mode, pl->dev ? mp_device_name(pl->dev) : "",
          (unsigned long long)mp__rec.allocs,
          (unsigned long long)mp__rec.alloc_failures,
          (unsigned long long)mp__rec.frees, (unsigned long long)mp__rec.pinned,
          (unsigned long long)mp__rec.managed,
          (unsigned long long)mp__rec.bypass_capture,
          (unsigned long long)mp__rec.bypass_other_device,
          (unsigned long long)mp__rec.foreign_frees, mp__pl_graph_pools(),
          mp__rec.live, mp__rec.peak_live);
  if (pool != NULL) {
    const mp_stats_t s = *pool;
    fprintf(f,
            ",\n  \"pool\": {\"reserved_bytes\": %zu, "
            "\"peak_reserved_bytes\": %zu, \"allocated_bytes\": %zu, "
            "\"peak_allocated_bytes\": %zu, \"requested_bytes\": %zu, "
            "\"peak_requested_bytes\": %zu, \"largest_free_bytes\": %zu, "
            "\"alloc_count\": %llu, \"free_count\": %llu, "
            "\"device_alloc_count\": %llu, \"device_free_count\": %llu, "
            "\"oom_count\": %llu}",
            s.reserved_bytes, s.peak_reserved_bytes, s.allocated_bytes,
            s.peak_allocated_bytes, s.requested_bytes, s.peak_requested_bytes,
            s.largest_free_bytes, (unsigned long long)s.alloc_count,
            (unsigned long long)s.free_count,
            (unsigned long long)s.device_alloc_count,
            (unsigned long long)s.device_free_count,
            (unsigned long long)s.oom_count);
  }
  if (torch != NULL)
    fprintf(f, ",\n  \"torch\": {%s  }", torch);
  mp__pl_host_report(f);
  fputs("\n}\n", f);
}

int mempool_preload_snapshot(const char *path) {
  const mp__pl_t *pl = mp__pl_get();
  if (path == NULL || pl->mode != MP__PL_POOL)
    return MP_EINVAL;
  mp__pl_pools_t ps;
  mp__pl_pools(&ps);
  mp_status_t st = ps.n == 0 ? MP_EINVAL
                             : mp__pool_snapshot_many(ps.pool, ps.ordinal,
                                                      (size_t)ps.n, path);
  if (st != MP_OK)
    fprintf(stderr, "mempool preload: snapshot '%s': %s\n", path,
            mp_last_error());
  return (int)st;
}

void mp__pl_record_finish(const mp__pl_t *pl) {
  char sbuf[4096];
  const char *spath = mp__env_path("MEMPOOL_SNAPSHOT", sbuf, sizeof sbuf);
  if (spath != NULL && pl != NULL && !mp__rec.child)
    (void)mempool_preload_snapshot(spath);
  mp_stats_t stats;
  bool have_stats = pl != NULL && pl->pool != NULL &&
                    mp_pool_get_stats(pl->pool, &stats) == MP_OK;
  char *torch = mp__rec.child ? NULL : mp__torch_views(pl);
  pthread_mutex_lock(&mp__rec.lock);
  if (mp__rec.child || pl == NULL) {
    pthread_mutex_unlock(&mp__rec.lock);
    free(torch);
    return;
  }
  if (mp__rec.trace != NULL && !mp__rec.closed) {
    if (mp__rec.json) {
      fputs("\n]}\n", mp__rec.trace);
      mp__rec.closed = true;
    }
    /* The CSV stays open: exit's stdio cleanup writes the lines of frees
     * made by later exit handlers. A write that failed (a full disk) is
     * said once, here: the trace is incomplete. */
    if (fflush(mp__rec.trace) != 0 || ferror(mp__rec.trace)) {
      char tb[4096];
      const char *tp = mp__env_path("MEMPOOL_TRACE", tb, sizeof tb);
      fprintf(stderr,
              "mempool preload: writing MEMPOOL_TRACE '%s' failed (%s); the "
              "trace is incomplete\n",
              tp ? tp : "", strerror(errno ? errno : EIO));
    }
  }
  char buf[4096];
  const char *path = mp__env_path("MEMPOOL_REPORT", buf, sizeof buf);
  if (path != NULL) {
    bool to_stderr = strcmp(path, "stderr") == 0;
    FILE *f = to_stderr ? stderr : fopen(path, "w");
    if (f == NULL) {
      fprintf(stderr, "mempool preload: cannot write MEMPOOL_REPORT '%s'\n",
              path);
    } else {
      mp__report(f, pl, have_stats ? &stats : NULL, torch);
      if (!to_stderr)
        fclose(f);
    }
  }
  pthread_mutex_unlock(&mp__rec.lock);
  free(torch);
}

/* ---- the snapshot signal ------------------------------------------------ */

/* The pipe's write end, -1 when no signal is armed (and in a forked child
 * until its own start arms a new one). Read by the handler. */
static volatile sig_atomic_t mp__snap_wfd = -1;
static int mp__snap_rfd = -1;

static void mp__snap_signal(int sig) {
  (void)sig;
  int saved = errno;
  int fd = (int)mp__snap_wfd;
  if (fd >= 0) {
    char c = 1;
    ssize_t n = write(fd, &c, 1); /* full pipe: a snapshot is pending */
    (void)n;
  }
  errno = saved;
}

static void *mp__snap_thread(void *arg) {
  int fd = (int)(intptr_t)arg;
  char c[64];
  for (;;) {
    ssize_t n = read(fd, c, sizeof c); /* a burst of signals: one snapshot */
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      close(fd);
      return NULL;
    }
    char buf[4096];
    const char *path = mp__env_path("MEMPOOL_SNAPSHOT", buf, sizeof buf);
    if (path != NULL)
      (void)mempool_preload_snapshot(path);
  }
}

/* "USR1", "SIGUSR1", "USR2" or a number; 0 when it is none of these or a
 * signal that cannot be caught. */
static int mp__signal_number(const char *v) {
  if (strncmp(v, "SIG", 3) == 0)
    v += 3;
  if (strcmp(v, "USR1") == 0)
    return SIGUSR1;
  if (strcmp(v, "USR2") == 0)
    return SIGUSR2;
  char *end = NULL;
  long n = strtol(v, &end, 10);
  if (end == v || *end != '\0' || n <= 0 || n > SIGRTMAX || n == SIGKILL ||
      n == SIGSTOP)
    return 0;
  return (int)n;
}

static void mp__snapshot_signal_arm(void) {
  const char *v = getenv("MEMPOOL_SNAPSHOT_SIGNAL");
  if (v == NULL || v[0] == '\0' || mp__snap_wfd >= 0)
    return;
  int sig = mp__signal_number(v);
  const char *why = NULL;
  int fds[2] = {-1, -1};
  pthread_t t;
  sigset_t all, old;
  if (sig == 0)
    why = "not USR1, USR2 or a signal number that can be caught";
  else if (getenv("MEMPOOL_SNAPSHOT") == NULL)
    why = "MEMPOOL_SNAPSHOT (the path) is not set";
  else if (pipe2(fds, O_CLOEXEC) != 0 ||
           fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0)
    why = "no pipe";
  if (why == NULL) {
    /* The helper takes no signal: they go to the program's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc =
        pthread_create(&t, NULL, mp__snap_thread, (void *)(intptr_t)fds[0]);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
      why = "no helper thread";
    else
      pthread_detach(t);
  }
  if (why == NULL) {
    mp__snap_rfd = fds[0];
    mp__snap_wfd = fds[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mp__snap_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) {
      why = "sigaction failed";
      mp__snap_wfd = -1;
      mp__snap_rfd = -1;
      close(fds[1]); /* the helper reads the end and goes */
    }
  } else {
    if (fds[0] >= 0)
      close(fds[0]);
    if (fds[1] >= 0)
      close(fds[1]);
  }
  if (why != NULL)
    fprintf(stderr,
            "mempool preload: MEMPOOL_SNAPSHOT_SIGNAL='%s': %s; no snapshot "
            "on a signal\n",
            v, why);
}

void mp__pl_record_prepare(void) {
  pthread_mutex_lock(&mp__rec.lock);
  if (mp__rec.trace != NULL)
    fflush(mp__rec.trace);
}

void mp__pl_record_parent(void) {
  pthread_mutex_unlock(&mp__rec.lock);
}

void mp__pl_record_child(void) {
  pthread_mutex_init(&mp__rec.lock, NULL);
  if (mp__rec.trace != NULL)
    fclose(mp__rec.trace); /* empty buffer: flushed in prepare */
  mp__rec.trace = NULL;
  mp__rec.child = true;
  mp__rec.pl = NULL;
  /* The parent's helper thread did not come along: the child's signal
   * must not reach the parent's pipe. Its own start arms a new one. */
  if (mp__snap_wfd >= 0) {
    int w = (int)mp__snap_wfd;
    mp__snap_wfd = -1;
    close(w);
    close(mp__snap_rfd);
    mp__snap_rfd = -1;
  }
}
