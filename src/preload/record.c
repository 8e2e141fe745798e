/* record.c - the trace the shim writes, its counters, and the snapshot
 * signal.
 *
 * $MEMPOOL_TRACE=path.csv: every device allocation and free, one line each,
 * in RMM's logging format (API.md): Thread,Time,Action,Pointer,Size,Stream,
 * which `mpbench replay` and RMM's replay benchmark read. A path ending in
 * ".json" gets a Chrome / Perfetto trace instead: an instant event per call
 * and two counter tracks, reserved and live bytes. Pinned and managed
 * memory is not device memory the pool could serve: it is counted for the
 * report (report.c) and marked in the .json trace, never written to the
 * CSV, so a replay sees exactly the device allocations.
 * $MEMPOOL_SNAPSHOT_SIGNAL=USR1 (USR2, or a signal number) writes the
 * snapshot of $MEMPOOL_SNAPSHOT (devices.c) each time the process gets that
 * signal: the handler only writes a byte to a pipe (async-signal-safe);
 * a helper thread, started with the shim in pool mode and blocking every
 * signal, reads it and writes the snapshot, so a program stuck or asleep
 * outside any CUDA call still answers. Signals that come faster than
 * snapshots are written coalesce. The handler replaces the program's own
 * for that signal (installed at the first hooked call): choose one it does
 * not use. Under ThreadSanitizer the handler may never run (TSan defers
 * asynchronous handlers and, under load, sometimes drops one): send the
 * signal again.
 * In the paths "%p" stands for the process id. Only a process that made a
 * hooked call writes anything: the many processes a job starts with the
 * variables inherited (shells, tools) leave the files alone.
 *
 * One mutex orders the lines; a line is written whole or not at all, the
 * CSV's as it happens (line-buffered: a process that ends without exit
 * handlers, by _exit or a crash, keeps every row it traced). The
 * invariant: a forked child never writes to its parent's files (the buffer
 * is flushed before the fork and the child drops the stream), and the .json
 * trace is closed exactly once, at exit; later events are counted only.
 * Calls devices.c (the snapshot) and nothing else of the shim. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "preload.h"

static struct {
  pthread_mutex_t lock;
  FILE *trace;
  bool json, first, closed, child;
  int werr; /* errno of the trace's first failed write; 0: none */
  const mp__pl_t *pl;
  struct timespec t0;
  mp__pl_counts_t n; /* under lock */
} mp__rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void mp__snapshot_signal_arm(void);

/* The trace's stream writes through these (fopencookie): write(2) again
 * where a signal interrupted it (EINTR: a handler installed without
 * SA_RESTART, signal(7), ran while the write waited on a full FIFO or a
 * slow disk) and where it wrote part, until all is written or a write
 * fails otherwise (a full disk: its errno kept). glibc's own file stream
 * gives up on any failure of write(2), EINTR included, and drops what it
 * held: a row of the CSV, or a buffer of the .json trace cut through its
 * events, was lost, and the trace said to be incomplete, for an
 * interruption. */
typedef struct mp__trace_file {
  int fd;
  /* A write failed part way through a line, in a file that could not be
   * cut back to the line's start: the next write ends that line first. */
  bool cut;
} mp__trace_file_t;

/* The open files' states: the trace and the report take one slot each.
 * Static, not host memory: the CSV trace stays open until the process
 * ends (mp__pl_record_close: exit's stdio cleanup writes its last lines),
 * and LeakSanitizer does not see the cookie glibc keeps for it, so a state
 * from malloc was reported leaked at every traced program's exit. More
 * files open at once than slots (none today) take host memory. */
#define MP__TRACE_SLOTS 4
static mp__trace_file_t mp__trace_slots[MP__TRACE_SLOTS];
static atomic_bool mp__trace_slot_used[MP__TRACE_SLOTS];

static mp__trace_file_t *mp__trace_file_new(void) {
  for (size_t i = 0; i < MP__TRACE_SLOTS; i++)
    if (!atomic_exchange(&mp__trace_slot_used[i], true))
      return &mp__trace_slots[i];
  return malloc(sizeof(mp__trace_file_t));
}

static void mp__trace_file_free(mp__trace_file_t *t) {
  for (size_t i = 0; i < MP__TRACE_SLOTS; i++)
    if (t == &mp__trace_slots[i]) {
      atomic_store(&mp__trace_slot_used[i], false);
      return;
    }
  free(t);
}

/* What of buf write(2) took, all of it but where a write failed (errno
 * set). */
static size_t mp__write_all(int fd, const char *buf, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, buf + done, size - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      break;
    }
    done += (size_t)n;
  }
  return done;
}

/* A write that failed after done bytes of what stdio gave (whole CSV rows,
 * the last cut short; glibc drops the rest) leaves no line cut short,
 * which would run into the next row written (a line no reader can parse,
 * and the next row lost with it): the part written is cut off again
 * (a regular file), the rows dropped whole, 0 returned, or, where the file
 * cannot be cut back (a pipe, a terminal), the next write starts with the
 * newline that ends the cut line. errno is the failed write's. */
static ssize_t mp__trace_cut(mp__trace_file_t *t, const char *buf,
                             size_t done) {
  int e = errno;
  off_t end = lseek(t->fd, 0, SEEK_CUR);
  off_t start = end - (off_t)done;
  if (end >= (off_t)done && lseek(t->fd, start, SEEK_SET) == start) {
    if (ftruncate(t->fd, start) == 0) {
      errno = e;
      return 0;
    }
    (void)lseek(t->fd, end, SEEK_SET); /* as it was */
  }
  t->cut = buf[done - 1] != '\n';
  errno = e;
  return (ssize_t)done;
}

static ssize_t mp__trace_write(void *cookie, const char *buf, size_t size) {
  mp__trace_file_t *t = cookie;
  if (t->cut) {
    if (mp__write_all(t->fd, "\n", 1) != 1)
      return 0; /* fopencookie(3): 0 on error, never < 0 */
    t->cut = false;
  }
  size_t done = mp__write_all(t->fd, buf, size);
  if (done == 0 || done == size)
    return (ssize_t)done;
  return mp__trace_cut(t, buf, done);
}

static int mp__trace_close(void *cookie) {
  mp__trace_file_t *t = cookie;
  int r = close(t->fd);
  mp__trace_file_free(t);
  return r;
}

/* preload.h. Through mp__trace_write; an open a signal interrupted (a
 * FIFO waits in open(2) for its reader) is made again, as a write is:
 * before, the program went untraced. */
FILE *mp__pl_record_fopen(const char *path) {
  mp__trace_file_t *t = mp__trace_file_new();
  if (t == NULL)
    return NULL;
  do
    t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  while (t->fd < 0 && errno == EINTR);
  t->cut = false;
  FILE *f =
      t->fd < 0
          ? NULL
          : fopencookie(t, "w",
                        (cookie_io_functions_t){.write = mp__trace_write,
                                                .close = mp__trace_close});
  if (f == NULL) {
    int e = errno;
    if (t->fd >= 0)
      close(t->fd);
    mp__trace_file_free(t);
    errno = e;
  }
  return f;
}

static _Thread_local long mp__tid;

static long mp__thread_id(void) {
  if (mp__tid == 0)
    mp__tid = (long)syscall(SYS_gettid);
  return mp__tid;
}

/* Under the record lock, before writing the trace (or opening it): the
 * thread is not cancelled (pthread_cancel) until the lock is given back.
 * The trace's writes are cancellation points (fprintf's write(2):
 * pthreads(7)); a thread cancelled in one ended holding the lock, and
 * every later traced call of the process, the report at exit included,
 * hung. Its cancellation takes effect at its next cancellation point after
 * mp__rec_unlock. Only while there is a trace to write: -1, nothing done,
 * otherwise (the counts alone never reach a cancellation point). */
static int mp__rec_hold(void) {
  int was = -1;
  if (mp__rec.trace != NULL && !mp__rec.closed)
    (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &was);
  return was;
}

/* The lock given back, then the caller's cancellation state (was, from
 * mp__rec_hold). */
static void mp__rec_unlock(int was) {
  pthread_mutex_unlock(&mp__rec.lock);
  if (was != -1)
    (void)pthread_setcancelstate(was, NULL);
}

/* $MEMPOOL_TRACE / $MEMPOOL_REPORT with "%p" replaced by the process id,
 * so that the processes of one job (which inherit the variables) write
 * files of their own; NULL when unset or empty, and (said on stderr) when
 * the path does not fit buf: cut to fit, it would name another file. */
const char *mp__pl_env_path(const char *var, char *buf, size_t cap) {
  const char *v = getenv(var);
  if (v == NULL || v[0] == '\0')
    return NULL;
  size_t n = 0;
  bool fits = true;
  for (const char *c = v; *c != '\0' && fits; c++) {
    if (c[0] == '%' && c[1] == 'p') {
      int w = snprintf(buf + n, cap - n, "%d", (int)getpid());
      fits = w > 0 && (size_t)w < cap - n;
      n += fits ? (size_t)w : 0;
      c++;
    } else if ((fits = n + 1 < cap)) {
      buf[n++] = *c;
    }
  }
  if (!fits) {
    MP__PL_SAY("%s is longer than %zu bytes (with %%p as the process id); "
               "not used",
               var, cap - 1);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

bool mp__pl_path_taken(const char *var, const char *path) {
  static const char *const order[] = {"MEMPOOL_TRACE", "MEMPOOL_SNAPSHOT",
                                      "MEMPOOL_REPORT"};
  struct stat a;
  bool a_ok = stat(path, &a) == 0;
  for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
    if (strcmp(order[i], var) == 0)
      return false; /* only earlier writers count */
    char buf[4096];
    const char *other = mp__pl_env_path(order[i], buf, sizeof buf);
    struct stat b;
    if (other == NULL || (strcmp(other, path) != 0 &&
                          !(a_ok && stat(other, &b) == 0 &&
                            a.st_dev == b.st_dev && a.st_ino == b.st_ino)))
      continue;
    fprintf(stderr,
            "mempool preload: %s names the file of %s ('%s'); %s is not "
            "written\n",
            var, order[i], path, var);
    return true;
  }
  return false;
}

void mp__pl_record_open(const mp__pl_t *pl) {
  /* fopen and the first writes are cancellation points (mp__rec_hold). */
  int was;
  (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &was);
  pthread_mutex_lock(&mp__rec.lock);
  mp__rec.pl = pl;
  clock_gettime(CLOCK_MONOTONIC, &mp__rec.t0);
  char buf[4096];
  const char *path = mp__pl_env_path("MEMPOOL_TRACE", buf, sizeof buf);
  if (!mp__rec.child && mp__rec.trace == NULL && path != NULL) {
    size_t n = strlen(path);
    mp__rec.json = n >= 5 && strcmp(path + n - 5, ".json") == 0;
    mp__rec.trace = mp__pl_record_fopen(path);
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
      /* Line-buffered: each row reaches the file whole as it is written
       * (a row is far shorter than the buffer), so a process that ends
       * without running exit handlers (_exit, a crash, a kill) leaves a
       * trace of every call it made, never a row cut off by a buffer
       * boundary: one write(2) per traced call. */
      (void)setvbuf(mp__rec.trace, NULL, _IOLBF, BUFSIZ);
      fputs("Thread,Time,Action,Pointer,Size,Stream\n", mp__rec.trace);
    }
  }
  mp__rec_unlock(was);
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
  char ts[32]; /* a JSON number under any locale */
  mp__fmt_fixed(ts, sizeof ts, mp__since_start_us(), 3);
  int pid = (int)getpid();
  fprintf(mp__rec.trace,
          ",\n{\"name\":\"%s\",\"cat\":\"mempool\",\"ph\":\"i\",\"s\":\"t\","
          "\"ts\":%s,\"pid\":%d,\"tid\":%ld,\"args\":{\"ptr\":\"%#lx\","
          "\"size\":%zu,\"stream\":%lu}}",
          name, ts, pid, mp__thread_id(), (unsigned long)ptr, size,
          (unsigned long)stream);
  fprintf(mp__rec.trace,
          ",\n{\"name\":\"reserved bytes\",\"ph\":\"C\",\"ts\":%s,"
          "\"pid\":%d,\"args\":{\"bytes\":%zu}}"
          ",\n{\"name\":\"live bytes\",\"ph\":\"C\",\"ts\":%s,"
          "\"pid\":%d,\"args\":{\"bytes\":%zu}}",
          ts, pid, reserved, ts, pid, mp__rec.n.live);
}

/* Under the lock, after a write to the trace: its first failure (a full
 * disk) is said at once, with its errno, kept for the word at exit. A
 * process that ends by _exit or a crash runs no exit handler, and would
 * leave a trace cut short without a word; at exit errno may be another
 * call's. The program goes on; later rows are still tried. */
static void mp__check_written(void) {
  if (mp__rec.werr != 0 || !ferror(mp__rec.trace))
    return;
  mp__rec.werr = errno != 0 ? errno : EIO;
  char tb[4096];
  const char *tp = mp__pl_env_path("MEMPOOL_TRACE", tb, sizeof tb);
  fprintf(stderr,
          "mempool preload: writing MEMPOOL_TRACE '%s' failed (%s); the "
          "trace is incomplete from here, the program goes on\n",
          tp ? tp : "", strerror(mp__rec.werr));
}

/* Reserved bytes: the pool's, or (passthrough) the live ones. Read before
 * taking the record lock, so the pool's lock is never taken inside it. */
static size_t mp__reserved_now(void) {
  const mp__pl_t *pl = mp__rec.pl;
  mp_stats_t s;
  mp_pool_t *pool = pl != NULL ? mp__pl_pool_first(pl) : NULL;
  if (pool != NULL && mp_pool_get_stats(pool, &s) == MP_OK)
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
                   reserved == SIZE_MAX ? mp__rec.n.live : reserved);
  mp__check_written();
}

void mp__pl_record_alloc(uintptr_t ptr, size_t size, uintptr_t stream,
                         bool ok) {
  size_t reserved = mp__rec.json ? mp__reserved_now() : 0;
  pthread_mutex_lock(&mp__rec.lock);
  int was = mp__rec_hold();
  if (ok) {
    mp__rec.n.allocs++;
    mp__rec.n.live += size;
    if (mp__rec.n.live > mp__rec.n.peak_live)
      mp__rec.n.peak_live = mp__rec.n.live;
  } else {
    mp__rec.n.alloc_failures++;
  }
  mp__write(ok ? "allocate" : "allocate failure", ok ? ptr : 0, size, stream,
            reserved);
  mp__rec_unlock(was);
}

void mp__pl_record_free(uintptr_t ptr, size_t size, uintptr_t stream) {
  size_t reserved = mp__rec.json ? mp__reserved_now() : 0;
  pthread_mutex_lock(&mp__rec.lock);
  int was = mp__rec_hold();
  mp__rec.n.frees++;
  mp__rec.n.live -= size <= mp__rec.n.live ? size : mp__rec.n.live;
  mp__write("free", ptr, size, stream, reserved);
  mp__rec_unlock(was);
}

void mp__pl_record_unfree(uintptr_t ptr, size_t size, uintptr_t stream) {
  size_t reserved = mp__rec.json ? mp__reserved_now() : 0;
  pthread_mutex_lock(&mp__rec.lock);
  int was = mp__rec_hold();
  if (mp__rec.n.frees > 0)
    mp__rec.n.frees--;
  mp__rec.n.live += size;
  /* Another thread's allocation since the free may have set the peak
   * without this block: live again, it counts towards it. */
  if (mp__rec.n.live > mp__rec.n.peak_live)
    mp__rec.n.peak_live = mp__rec.n.live;
  /* The CSV knows allocate, free and allocate failure: live again is an
   * allocate row at the same address (a replay sees the block live until
   * its real free). The JSON trace names it. */
  if (mp__rec.trace != NULL && !mp__rec.closed) {
    if (!mp__rec.json)
      mp__csv_line("allocate", ptr, size, stream);
    else
      mp__json_event("free refused", ptr, size, stream,
                     reserved == SIZE_MAX ? mp__rec.n.live : reserved);
    mp__check_written();
  }
  mp__rec_unlock(was);
}

void mp__pl_record_other(const char *what, uintptr_t ptr, size_t size) {
  pthread_mutex_lock(&mp__rec.lock);
  int was = mp__rec_hold();
  if (strcmp(what, "managed") == 0)
    mp__rec.n.managed++;
  else if (strcmp(what, "pinned") == 0)
    mp__rec.n.pinned++;
  if (mp__rec.json && mp__rec.trace != NULL && !mp__rec.closed) {
    char ts[32]; /* a JSON number under any locale */
    mp__fmt_fixed(ts, sizeof ts, mp__since_start_us(), 3);
    fprintf(mp__rec.trace,
            ",\n{\"name\":\"%s\",\"cat\":\"mempool\",\"ph\":\"i\",\"s\":\"t\","
            "\"ts\":%s,\"pid\":%d,\"tid\":%ld,\"args\":{\"ptr\":\"%#lx\","
            "\"size\":%zu}}",
            what, ts, (int)getpid(), mp__thread_id(), (unsigned long)ptr, size);
    mp__check_written();
  }
  mp__rec_unlock(was);
}

void mp__pl_count_bypass(const char *why) {
  pthread_mutex_lock(&mp__rec.lock);
  if (strcmp(why, "capture") == 0)
    mp__rec.n.bypass_capture++;
  else if (strcmp(why, "other_device") == 0)
    mp__rec.n.bypass_other_device++;
  else
    mp__rec.n.foreign_frees++;
  pthread_mutex_unlock(&mp__rec.lock);
}

bool mp__pl_record_forked(void) {
  return mp__rec.child;
}

bool mp__pl_record_close(mp__pl_counts_t *out) {
  pthread_mutex_lock(&mp__rec.lock);
  if (mp__rec.child) {
    pthread_mutex_unlock(&mp__rec.lock);
    return false;
  }
  int was = mp__rec_hold();
  if (mp__rec.trace != NULL && !mp__rec.closed) {
    if (mp__rec.json) {
      fputs("\n]}\n", mp__rec.trace);
      mp__rec.closed = true;
    }
    /* The CSV stays open: exit's stdio cleanup writes the lines of frees
     * made by later exit handlers. A write that failed (a full disk),
     * said when it failed (mp__check_written), is said again here: the
     * trace is incomplete. */
    errno = 0;
    if (fflush(mp__rec.trace) != 0 || ferror(mp__rec.trace)) {
      char tb[4096];
      const char *tp = mp__pl_env_path("MEMPOOL_TRACE", tb, sizeof tb);
      int e = mp__rec.werr != 0 ? mp__rec.werr : errno != 0 ? errno : EIO;
      fprintf(stderr,
              "mempool preload: writing MEMPOOL_TRACE '%s' failed (%s); the "
              "trace is incomplete\n",
              tp ? tp : "", strerror(e));
    }
  }
  *out = mp__rec.n;
  mp__rec_unlock(was);
  return true;
}

/* ---- the snapshot signal ------------------------------------------------ */

/* The pipe's write end, -1 when no signal is armed (and in a forked
 * child, which records nothing). Read by the handler. */
static volatile sig_atomic_t mp__snap_wfd = -1;
static int mp__snap_rfd = -1;
/* The signal armed and what it did before (the program's handler or the
 * default action), given back in a forked child. */
static int mp__snap_sig;
static struct sigaction mp__snap_was;

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
    const char *path = mp__pl_env_path("MEMPOOL_SNAPSHOT", buf, sizeof buf);
    if (path != NULL && !mp__pl_path_taken("MEMPOOL_SNAPSHOT", path))
      (void)mp__pl_snapshot(mp__rec.pl, path);
  }
}

/* "USR1", "SIGUSR1", "USR2" or a number; 0 when it is none of these, a
 * signal that cannot be caught, or one a fault raises (SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL): the handler returns, the faulting instruction runs
 * again, and the program's crash becomes a hang. */
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
      n == SIGSTOP || n == SIGSEGV || n == SIGBUS || n == SIGFPE || n == SIGILL)
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
  if (sig == 0)
    why = "not USR1, USR2 or a signal number that can be caught and is "
          "not raised by faults (SEGV, BUS, FPE, ILL)";
  else if (getenv("MEMPOOL_SNAPSHOT") == NULL ||
           getenv("MEMPOOL_SNAPSHOT")[0] == '\0') /* as mp__pl_env_path */
    why = "MEMPOOL_SNAPSHOT (the path) is not set";
  else if (pipe2(fds, O_CLOEXEC) != 0 ||
           fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0)
    why = "no pipe";
  if (why == NULL) {
    /* The helper takes no signal: they go to the program's threads. */
    int rc = mp__thread_start(&t, mp__snap_thread, (void *)(intptr_t)fds[0]);
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
    mp__snap_sig = sig;
    if (sigaction(sig, &sa, &mp__snap_was) != 0) {
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

/* The forking thread's cancellation state, from prepare (its flush is a
 * cancellation point, the lock held: mp__rec_hold) to parent or child. */
static int mp__rec_fork_was = -1;

void mp__pl_record_prepare(void) {
  pthread_mutex_lock(&mp__rec.lock);
  mp__rec_fork_was = mp__rec_hold();
  if (mp__rec.trace != NULL)
    fflush(mp__rec.trace);
}

void mp__pl_record_parent(void) {
  mp__rec_unlock(mp__rec_fork_was);
}

void mp__pl_record_child(void) {
  pthread_mutex_init(&mp__rec.lock, NULL);
  if (mp__rec_fork_was != -1)
    (void)pthread_setcancelstate(mp__rec_fork_was, NULL);
  if (mp__rec.trace != NULL)
    fclose(mp__rec.trace); /* empty buffer: flushed in prepare */
  mp__rec.trace = NULL;
  mp__rec.child = true;
  mp__rec.pl = NULL;
  /* The parent's helper thread did not come along: the child's signal
   * must not reach the parent's pipe. A child writes no snapshot (as it
   * records nothing), so the signal does again what it did before the
   * shim armed it: inherited, the shim's handler took it and did nothing,
   * and a child that would have ended on it went on. */
  if (mp__snap_wfd >= 0) {
    int w = (int)mp__snap_wfd;
    mp__snap_wfd = -1;
    close(w);
    close(mp__snap_rfd);
    mp__snap_rfd = -1;
    /* Only if the shim's handler is still the signal's: a handler the
     * program installed since stays (a child keeps it, as without the
     * shim). */
    struct sigaction now;
    if (sigaction(mp__snap_sig, NULL, &now) == 0 &&
        !(now.sa_flags & SA_SIGINFO) && now.sa_handler == mp__snap_signal)
      (void)sigaction(mp__snap_sig, &mp__snap_was, NULL);
  }
}
