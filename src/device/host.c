/* host.c - the "host" backend: an emulated device made of host memory and
 * threads, so that pools, benchmarks and tests run where there is no GPU.
 *
 * Memory. The device's memory is one memfd (a sparse shared-memory file,
 * the emulated "physical memory"); every device allocation and every
 * vm_map is its own MAP_SHARED|MAP_NORESERVE mapping of a fresh range of
 * that file (offsets are handed out upwards and never reused; a range is
 * given back with a hole punch, never by a forked child, whose view of the
 * file is the parent's memory). The OS commits pages only when they are
 * touched, so a capacity of terabytes costs nothing for workloads that
 * never write their memory. Because the memory is a file, another process
 * can map it: ipc_export hands out a new open file description of the
 * memfd positioned at the range's offset (what a CUDA shareable handle
 * is to cuMemMap), and ipc_open maps such a descriptor. A range once
 * exported is not hole-punched when freed or unmapped (an importer may
 * still map it, as CUDA keeps exported physical memory alive until every
 * importer lets go); its pages go when the last mapping of the file does.
 * The descriptor opens the whole device file, where a CUDA handle names
 * one allocation: it carries the allocation as a lock of its own (an
 * open file description's, F_OFD_SETLK), and an import of memory outside
 * it is refused. Each export also holds a lock of its own far past the
 * file's end (its tag), which the handle names: a handle whose descriptor
 * number was closed and reused for another export's descriptor is
 * refused, not mapped as that other export's memory. Live allocations are kept
 * in a table sorted by address, which is what makes a free of an unknown or
 * already freed pointer MP_EINVAL instead of a crash, and a copy or memset that
 * runs past an allocation's end MP_EINVAL instead of a stray write. Virtual
 * memory is emulated the way CUDA does it: a reservation is a PROT_NONE mapping
 * aligned to the granularity; vm_map maps a granule-aligned range of the device
 * file over it (MAP_FIXED), vm_unmap fences the range again with a PROT_NONE
 * anonymous mapping and punches the file range out. A per-reservation bitmap of
 * mapped granules rejects overlapping maps; a hash map of (addr -> bytes) makes
 * vm_unmap accept only exactly what one vm_map mapped. vm_release of a
 * reservation that still has mappings is MP_EBUSY (the pool must unmap first,
 * as it must on CUDA); device close releases whatever is left. Copies and
 * memsets that reach into a reservation must stay on mapped granules, or they
 * are MP_EINVAL when queued instead of a fault later. Like cuMemFree,
 * mp_device_free and host_free synchronize the device before the memory goes;
 * vm_unmap, like cuMemUnmap (cuda.h promises no wait), does not: its caller
 * vouches that no queued work still touches the range, and work that does
 * faults on the fence.
 *
 * Streams. Each stream, and the default (NULL) stream, is a worker thread
 * that runs its FIFO queue of operations strictly in order. Destroying a
 * stream that still has work queued returns at once, as cuStreamDestroy
 * does: its worker finishes the queue, then hands the stream to the
 * device's dead list and leaves; the next stream create, destroy or close
 * joins it and frees the stream, and close waits for every such worker
 * before it frees what they touch, so no thread of a closed device is
 * left. An idle stream's worker is joined at once. An
 * event record
 * enqueues a "marker": a small refcounted flag that the worker sets when the
 * stream reaches it. The event points at the marker of its latest record, so
 * re-recording re-arms it, and a stream wait holds on to the marker that was
 * latest when the wait was issued (CUDA's semantics), however often the
 * event is recorded afterwards.
 *
 * A host function runs on its stream's worker, so a call from it that
 * waits for the device would wait for itself: such calls are refused with
 * MP_EINVAL (CUDA says cudaErrorNotPermitted) rather than hang.
 *
 * Invariants:
 *  - used == sum of live plain allocations + sum of live mappings
 *    <= capacity; every byte counted is in exactly one of the two maps.
 *  - A stream's memory is freed only when nobody holds a reference to it:
 *    the registry holds one; synchronizers take one while they wait. Quick
 *    operations (enqueue) hold the registry's read lock instead.
 *  - Memory goes back to the OS only after every stream is drained, so no
 *    queued copy can touch freed memory (as cuMemFree synchronizes).
 * Locks: reg (rwlock) may be held while taking ev_lock or a stream mutex;
 * those two are never held together; mem_lock is never held with another
 * lock (but the process-wide host_devs_mu, taken before it), nor across a
 * sleep or a synchronization; busy_mu and dying_mu are
 * taken inside a stream mutex (a stream joins or leaves the busy list, is
 * orphaned) or alone, never together. host_probe_mu is taken alone; a
 * forked child's probe under it only tries the locks of a device it
 * inherited and the mutex of such a device's stream (trylock, never a
 * wait: host_fork_held). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

/* The name of every host device's file (memfd_create): an import checks
 * it (host_fd_range). */
#define HOST_MEMFD_NAME "mempool-host-device"

/* An entry of the address maps (mp__ptrmap_t, see ptrmap.c) and of the
 * table of plain allocations: memory keeps its size; the stream and event
 * registries only the handle. */
typedef struct host_entry {
  uintptr_t key;
  size_t bytes;
  uint64_t off;   /* memory maps: the range's offset in the device file */
  unsigned flags; /* HOST_MEM_* */
} host_entry_t;

enum {
  HOST_MEM_EXPORTED = 1u << 0, /* handed to ipc_export: never punched out */
  HOST_MEM_FOREIGN = 1u << 1   /* vm_map_file: another device's memory, not
                                  charged to this one, never punched out */
};

/* ---- device state ------------------------------------------------------ */

typedef struct host_marker {
  unsigned refs; /* the record op + the event; guarded by ev_lock */
  bool done;     /* the stream reached the record */
  struct host_marker *next_dead; /* on host_dev.dead_markers */
} host_marker_t;

typedef enum host_op_kind {
  HOST_OP_COPY,
  HOST_OP_SET,
  HOST_OP_HOST_FN,
  HOST_OP_RECORD,
  HOST_OP_WAIT
} host_op_kind_t;

typedef struct host_op {
  struct host_op *next;
  host_op_kind_t kind;
  void *dst;
  const void *src;
  size_t n;
  int value;
  void (*fn)(void *);
  void *arg;
  host_marker_t *marker;
  struct timespec start; /* stream_latency_us: not run before (monotonic) */
} host_op_t;

typedef struct host_dev host_dev_t;

typedef struct host_stream {
  host_dev_t *dev;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* work queued, or stopping */
  pthread_cond_t idle_cv; /* completed moved */
  host_op_t *head, *tail;
  /* The op the worker took off the queue and runs, so that it stays
   * reachable from the stream meanwhile: a process that forks then has no
   * worker in the child, and a leak checker there (LeakSanitizer at the
   * child's exit) found the op in no memory but the missing thread's
   * stack. */
  host_op_t *running;
  host_op_t *done; /* run, freed by the next push or drain (not the worker) */
  uint64_t submitted, completed; /* ops ever queued / ever finished */
  bool stopping;                 /* no more work accepted; exit when drained */
  bool busy; /* submitted > completed: on the device's busy list */
  struct host_stream *busy_prev, *busy_next; /* under host_dev.busy_mu */
  atomic_uint refs;
  /* Destroyed with work queued: the worker, once drained, puts the stream
   * on host_dev.dead itself (under dying_mu), where host_streams_reap
   * joins it. */
  bool orphan;
  struct host_stream *dead_next; /* on host_dev.dead, under dying_mu */
  /* A forked child's probe of mu (host_stream_held): the process that
   * made it, and whether mu was held at the fork. */
  atomic_int fork_probed;
  unsigned fork_held;
} host_stream_t;

typedef struct host_event {
  host_marker_t *last; /* the latest record; NULL: never recorded */
} host_event_t;

/* The reservations, and the plain and page-locked allocations
 * (host_entry_t, host_atab_t), are tables sorted by base (host_tab_*):
 * every entry starts with its base and size. */
typedef struct host_atab {
  host_entry_t *e;
  size_t n, cap;
} host_atab_t;

typedef struct host_resv {
  uintptr_t base;
  size_t bytes;
  size_t mapped;  /* bytes mapped inside */
  uint64_t *bits; /* one bit per granule: mapped */
} host_resv_t;

_Static_assert(offsetof(host_entry_t, bytes) == sizeof(uintptr_t) &&
                   offsetof(host_resv_t, bytes) == sizeof(uintptr_t),
               "host_tab_* read an entry's base and size at these offsets");

struct host_dev {
  /* options, fixed at open */
  size_t capacity;
  uint64_t latency_us;
  uint64_t stream_latency_us;
  uint64_t fail_after;
  bool vmm;
  size_t granularity;
  pid_t owner; /* the process that opened it (host_file_release) */
  /* On host_devs, the process's open host devices (host_devs_mu). */
  struct host_dev *peer_prev, *peer_next;

  int memfd; /* the device's memory (a sparse memfd) */

  pthread_mutex_t mem_lock; /* everything below up to the next comment */
  size_t used;
  uint64_t file_next;   /* the next unused offset of memfd (page aligned) */
  uint64_t alloc_calls; /* device allocations attempted (fail_after) */
  uint64_t export_tag;  /* the last tag host_ipc_export tried */
  host_atab_t allocs;   /* plain allocations (mp_device_alloc) */
  host_atab_t pins;     /* page-locked host memory (mp_device_host_alloc) */
  host_atab_t imports;  /* IPC imports mapped by ipc_open (mp_ipc_import),
                           and the fake driver's (mp__host_note_import:
                           its IPC imports and registered host memory) */
  mp__ptrmap_t maps;    /* vm_map address -> bytes */
  host_resv_t *resv;    /* sorted by base */
  size_t nresv, resv_cap;

  pthread_rwlock_t reg; /* the handle registries */
  mp__ptrmap_t streams; /* live host_stream_t * */
  mp__ptrmap_t events;  /* live host_event_t * */
  host_stream_t *null_stream;

  pthread_mutex_t ev_lock;     /* markers and host_event_t.last */
  pthread_cond_t ev_cv;        /* some marker completed */
  host_marker_t *dead_markers; /* unreferenced on a worker; ev_lock */

  /* Streams with queued work, so that a device synchronize costs what is
   * busy, not every stream ever made. */
  pthread_mutex_t busy_mu;
  host_stream_t *busy_head;

  /* Destroyed streams whose orphaned workers still run their queued work
   * (dying), and those whose workers are done with them (dead: the
   * registry's reference, dropped by host_streams_reap). Close waits on
   * dying_cv for dying to reach 0. */
  pthread_mutex_t dying_mu;
  pthread_cond_t dying_cv;
  size_t dying;
  host_stream_t *dead;

  /* A forked child's probe of the locks above (host_dev_held): the process
   * that made it, and the locks held at the fork (HOST_HELD_*). */
  atomic_int fork_probed;
  unsigned fork_held;
};

/* The process's open host devices (host_open, host_close): a copy or
 * memset queued on one may name another's memory, as host devices share
 * their memory (backend.h: the host backend has no vm_access). Taken
 * before a device's mem_lock, never inside one. */
static pthread_mutex_t host_devs_mu = PTHREAD_MUTEX_INITIALIZER;
static host_dev_t *host_devs;

static host_dev_t *host_of(mp_device_t *dev) {
  return (host_dev_t *)dev->impl;
}

static void host_sleep_us(uint64_t us) {
  if (us == 0)
    return;
  struct timespec ts = {.tv_sec = (time_t)(us / 1000000),
                        .tv_nsec = (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---- markers (ev_lock held) -------------------------------------------- */

/* Whether this thread is a stream worker. A worker never calls malloc or
 * free (what it is done with is freed by the next API call that comes by):
 * a process that forks while a worker is inside the allocator leaves the
 * allocator's lock held in the child, and not every allocator takes care
 * of that. glibc's malloc does (its fork handlers); the AddressSanitizer
 * runtime of GCC 12 does not (LLVM added one in pull request 75290,
 * LLVM 18), and a forked child hung at its first allocation. Host
 * functions are the application's code and may still allocate. */
static _Thread_local bool host_on_worker;

static void host_marker_unref(host_dev_t *h, host_marker_t *m) {
  if (m == NULL || --m->refs != 0)
    return;
  if (host_on_worker) {
    m->next_dead = h->dead_markers;
    h->dead_markers = m;
  } else {
    free(m);
  }
}

/* The markers workers let go of, taken off the device for the caller to
 * free once ev_lock is dropped. */
static host_marker_t *host_markers_take_dead(host_dev_t *h) {
  host_marker_t *dead = h->dead_markers;
  h->dead_markers = NULL;
  return dead;
}

/* Without ev_lock. */
static void host_markers_free(host_marker_t *m) {
  while (m != NULL) {
    host_marker_t *next = m->next_dead;
    free(m);
    m = next;
  }
}

static void host_ops_free(host_op_t *op) {
  while (op != NULL) {
    host_op_t *next = op->next;
    free(op);
    op = next;
  }
}

/* ---- streams ----------------------------------------------------------- */

/* The device whose host function this thread (a stream worker) is running,
 * NULL elsewhere. CUDA forbids every API call there, not only the waits:
 * "The host function must not make any CUDA API calls. Attempting to use a
 * CUDA API may result in CUDA_ERROR_NOT_PERMITTED, but this is not
 * required." (cuda.h, cuLaunchHostFunc). So every call into a host device
 * that is a driver call on the cuda backend (opening and closing a device,
 * allocations, frees, streams, copies, events, virtual memory, IPC) is
 * refused with MP_EINVAL from any host function, not only the ones that would
 * wait for their own stream and hang: code that works here would fail on a GPU.
 */
static _Thread_local host_dev_t *host_fn_dev;

static mp_status_t host_check_caller(const char *fn) {
  if (MP__UNLIKELY(host_fn_dev != NULL))
    return mp__fail(MP_EINVAL,
                    "%s: called from a host function, which must not call "
                    "into a device (cuda.h, cuLaunchHostFunc: \"must not "
                    "make any CUDA API calls\"; a wait there would wait for "
                    "itself)",
                    fn);
  return MP_OK;
}

/* Returns the refusal from the enclosing function (see host_fn_dev). */
#define HOST_NOT_IN_HOST_FN(fn)                                                \
  do {                                                                         \
    mp_status_t host_st_ = host_check_caller(fn);                              \
    if (host_st_ != MP_OK)                                                     \
      return host_st_;                                                         \
  } while (0)

static void host_op_run(host_dev_t *h, host_op_t *op) {
  switch (op->kind) {
  case HOST_OP_COPY: memcpy(op->dst, op->src, op->n); break; /* disjoint */
  case HOST_OP_SET: memset(op->dst, op->value, op->n); break;
  case HOST_OP_HOST_FN:
    host_fn_dev = h;
    op->fn(op->arg);
    host_fn_dev = NULL;
    break;
  case HOST_OP_RECORD:
    pthread_mutex_lock(&h->ev_lock);
    op->marker->done = true;
    pthread_cond_broadcast(&h->ev_cv);
    host_marker_unref(h, op->marker);
    pthread_mutex_unlock(&h->ev_lock);
    break;
  case HOST_OP_WAIT:
    pthread_mutex_lock(&h->ev_lock);
    while (!op->marker->done)
      pthread_cond_wait(&h->ev_cv, &h->ev_lock);
    host_marker_unref(h, op->marker);
    pthread_mutex_unlock(&h->ev_lock);
    break;
  }
}

/* Under s->mu. */
static void host_stream_set_busy(host_stream_t *s, bool busy) {
  if (s->busy == busy)
    return;
  host_dev_t *h = s->dev;
  pthread_mutex_lock(&h->busy_mu);
  if (busy) {
    s->busy_prev = NULL;
    s->busy_next = h->busy_head;
    if (h->busy_head != NULL)
      h->busy_head->busy_prev = s;
    h->busy_head = s;
  } else {
    if (s->busy_prev != NULL)
      s->busy_prev->busy_next = s->busy_next;
    else
      h->busy_head = s->busy_next;
    if (s->busy_next != NULL)
      s->busy_next->busy_prev = s->busy_prev;
  }
  pthread_mutex_unlock(&h->busy_mu);
  s->busy = busy;
}

static void *host_stream_main(void *arg) {
  host_stream_t *s = arg;
  host_on_worker = true;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == NULL && !s->stopping)
      pthread_cond_wait(&s->work_cv, &s->mu);
    host_op_t *op = s->head;
    if (op == NULL)
      break; /* stopping, and everything queued has run */
    s->head = op->next;
    if (s->head == NULL)
      s->tail = NULL;
    s->running = op;
    pthread_mutex_unlock(&s->mu);
    /* stream_latency_us: the device reaches the operation only that long
     * after it was queued (the queue still runs in order, and operations
     * queued together wait together, as on a GPU's launch queue). */
    if (s->dev->stream_latency_us != 0)
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &op->start,
                             NULL) == EINTR) {
      }
    host_op_run(s->dev, op);
    pthread_mutex_lock(&s->mu);
    s->running = NULL;
    op->next = s->done; /* see host_on_worker */
    s->done = op;
    s->completed++;
    if (s->completed == s->submitted)
      host_stream_set_busy(s, false);
    pthread_cond_broadcast(&s->idle_cv);
  }
  bool orphan = s->orphan;
  pthread_mutex_unlock(&s->mu);
  if (orphan) {
    /* Destroyed with work queued (host_stream_destroy). The stream goes
     * on the dead list for a later API call to join this thread and free
     * it (a worker frees nothing, see host_on_worker); neither s nor,
     * after the unlock, h is touched again. The joining call (close among
     * them) returns only once this thread has left, so a closed device
     * leaves no thread behind, and a program may unload the library
     * (dlclose) right after closing it. */
    host_dev_t *h = s->dev;
    pthread_mutex_lock(&h->dying_mu);
    s->dead_next = h->dead;
    h->dead = s;
    if (--h->dying == 0)
      pthread_cond_broadcast(&h->dying_cv);
    pthread_mutex_unlock(&h->dying_mu);
  }
  return NULL;
}

static mp_status_t host_stream_start(host_dev_t *h, host_stream_t **out) {
  host_stream_t *s = mp__host_calloc(1, sizeof *s);
  if (s == NULL)
    return mp__fail(MP_ENOMEM, "host device: out of host memory for a stream");
  s->dev = h;
  atomic_init(&s->refs, 1);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  int rc = mp__thread_start(&s->thread, host_stream_main, s);
  if (rc != 0) {
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return mp__fail(MP_ENOMEM, "host device: cannot start a stream thread: %s",
                    strerror(rc));
  }
  *out = s;
  return MP_OK;
}

static void host_stream_put(host_stream_t *s) {
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    host_ops_free(s->done);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
  }
}

/* Joins the orphaned workers that are done with their streams and frees
 * the streams (wait: first waits for every orphaned worker to finish, for
 * close). A worker on the dead list has only its return left to run, so
 * the join is short. Never called in a forked child (host_inherited),
 * where the parent's threads do not exist. */
static void host_streams_reap(host_dev_t *h, bool wait) {
  pthread_mutex_lock(&h->dying_mu);
  while (wait && h->dying != 0)
    pthread_cond_wait(&h->dying_cv, &h->dying_mu);
  host_stream_t *dead = h->dead;
  h->dead = NULL;
  pthread_mutex_unlock(&h->dying_mu);
  while (dead != NULL) {
    host_stream_t *next = dead->dead_next;
    pthread_join(dead->thread, NULL);
    host_stream_put(dead);
    dead = next;
  }
}

/* Lets the queued work finish, joins the worker, drops the caller's ref. */
static void host_stream_stop(host_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  host_stream_put(s);
}

/* Set in every child forked from a process that opened a host device
 * (pthread_atfork, registered at the first open), so that the check below
 * costs a load, not a getpid(), in a process that never forked. */
static atomic_bool host_in_child;
static pthread_once_t host_atfork_once = PTHREAD_ONCE_INIT;

/* Serializes a forked child's probes (host_fork_held); new in every child,
 * as a thread of the parent's may have held it at the fork. */
static pthread_mutex_t host_probe_mu = PTHREAD_MUTEX_INITIALIZER;

static void host_mark_child(void) {
  atomic_store_explicit(&host_in_child, true, memory_order_relaxed);
}

/* A child starts a list of open host devices of its own, empty, with
 * host_devs_mu new: the devices it inherited are no device of its own
 * (host_inherited; never unlinked there, host_devs_link), and a thread
 * that held the mutex at the fork did not come along. The mutex is not
 * held across the fork: a prepare handler taking it ran before the preload
 * shim's, which takes its state lock, the lock a device open holds while
 * it takes host_devs_mu (TSan: lock-order inversion). */
static void host_fork_child(void) {
  pthread_mutex_init(&host_devs_mu, NULL);
  pthread_mutex_init(&host_probe_mu, NULL);
  host_devs = NULL;
  host_mark_child();
}

static void host_atfork(void) {
  (void)pthread_atfork(NULL, NULL, host_fork_child);
}

/* Whether h is a device this process inherited: it is a child forked from
 * the process that opened h. Such a child shares h's memory file (its
 * mappings are the parent's pages) but has none of its stream threads:
 * work queued there would never run, and a wait for work queued before
 * the fork would never end. So the child may free (its own view) and ask,
 * but not allocate, queue, export or wait for queued work: as CUDA refuses
 * a forked child its parent's context, it opens a device of its own. The
 * calls that allocate, queue or export are refused at their start, before
 * any lock of the device (HOST_NOT_INHERITED); those that free or ask take
 * only the locks no thread of the parent held at the fork
 * (HOST_CHILD_NEEDS). */
static bool host_inherited(const host_dev_t *h) {
  return MP__UNLIKELY(
             atomic_load_explicit(&host_in_child, memory_order_relaxed)) &&
         getpid() != h->owner;
}

static mp_status_t host_refuse_inherited(const char *fn) {
  return mp__fail(MP_ENODEV,
                  "host device: %s: this process is a forked child of the "
                  "one that opened the device, whose memory it shares and "
                  "whose stream threads did not survive the fork: open a "
                  "device of its own",
                  fn);
}

/* Returns from the enclosing function the refusal of fn, a call that
 * allocates or queues work on h, in a child that inherited h: before any
 * lock of h is taken, since a thread of the parent that held one at the
 * fork did not come along and the child would wait for it for ever (a
 * refusal that came after the memory lock or the registry's hung there). */
#define HOST_NOT_INHERITED(h, fn)                                              \
  do {                                                                         \
    if (host_inherited(h))                                                     \
      return host_refuse_inherited(fn);                                        \
  } while (0)

/* The locks of a device that a forked child finds held: a thread of the
 * parent held them at the fork and did not come along, so they stay held
 * for good, and what they guard may be half changed. Taking the locks
 * before the fork instead (a prepare handler) and letting them go after it
 * would deadlock: the preload shim's prepare handler, which runs after this
 * file's (registered later, run first), takes its table lock, and a thread
 * that holds that lock calls into the device and waits for these. */
enum {
  HOST_HELD_MEM = 1u << 0,  /* mem_lock */
  HOST_HELD_REG = 1u << 1,  /* reg, by a writer or a reader */
  HOST_HELD_EV = 1u << 2,   /* ev_lock */
  HOST_HELD_BUSY = 1u << 3, /* busy_mu */
};

/* Whether m is held, in a child where only the calling thread and those
 * started since the fork run. */
static bool host_mutex_held(pthread_mutex_t *m) {
  if (pthread_mutex_trylock(m) != 0)
    return true;
  pthread_mutex_unlock(m);
  return false;
}

static unsigned host_dev_probe(void *obj) {
  host_dev_t *h = obj;
  unsigned held = 0;
  if (host_mutex_held(&h->mem_lock))
    held |= HOST_HELD_MEM;
  if (pthread_rwlock_trywrlock(&h->reg) != 0)
    held |= HOST_HELD_REG;
  else
    pthread_rwlock_unlock(&h->reg);
  if (host_mutex_held(&h->ev_lock))
    held |= HOST_HELD_EV;
  if (host_mutex_held(&h->busy_mu))
    held |= HOST_HELD_BUSY;
  return held;
}

static unsigned host_stream_probe(void *obj) {
  return host_mutex_held(&((host_stream_t *)obj)->mu) ? 1u : 0u;
}

/* In a forked child, what probe(obj) found held: probed once per process,
 * at the child's first call that asks, before any thread of the child
 * takes one of the locks probed (every such call asks first), so a lock
 * found held was held at the fork. A grandchild probes again. */
static unsigned host_fork_held(atomic_int *probed, unsigned *held,
                               unsigned (*probe)(void *), void *obj) {
  int me = (int)getpid();
  if (atomic_load_explicit(probed, memory_order_acquire) != me) {
    pthread_mutex_lock(&host_probe_mu);
    if (atomic_load_explicit(probed, memory_order_relaxed) != me) {
      *held = probe(obj);
      atomic_store_explicit(probed, me, memory_order_release);
    }
    pthread_mutex_unlock(&host_probe_mu);
  }
  return *held;
}

/* Which of h's locks were held at the fork (HOST_HELD_*), in a child that
 * inherited h; 0 elsewhere. */
static unsigned host_dev_held(host_dev_t *h) {
  if (!host_inherited(h))
    return 0;
  return host_fork_held(&h->fork_probed, &h->fork_held, host_dev_probe, h);
}

/* Whether s's mutex was held at the fork, in a child that inherited s. */
static bool host_stream_held(host_stream_t *s) {
  if (!host_inherited(s->dev))
    return false;
  return host_fork_held(&s->fork_probed, &s->fork_held, host_stream_probe, s) !=
         0;
}

static mp_status_t host_refuse_held(const char *fn) {
  return mp__fail(MP_ENODEV,
                  "host device: %s: this process is a forked child of the "
                  "one that opened the device, one of whose threads held a "
                  "lock of the device at the fork, which no thread here will "
                  "let go of: open a device of its own",
                  fn);
}

/* Returns from the enclosing function the refusal of fn, which takes the
 * locks held of h (HOST_HELD_*), in a child that inherited h where one of
 * them was held at the fork: it would wait for ever. */
#define HOST_CHILD_NEEDS(h, held, fn)                                          \
  do {                                                                         \
    if ((host_dev_held(h) & (held)) != 0)                                      \
      return host_refuse_held(fn);                                             \
  } while (0)

static mp_status_t host_caller_check(mp_device_t *dev, const char *fn) {
  mp_status_t st = host_check_caller(fn);
  if (st != MP_OK || dev == NULL)
    return st;
  /* mp_stream_destroy asks stream_owned, then this, then has every pool
   * forget the stream, then destroys it: in a forked child whose registry
   * was held at the fork, stream_owned cannot tell (it says yes, see
   * host_stream_owned) and the destroy would be refused, so it is refused
   * here, before any pool forgets a stream the call then keeps. */
  if ((host_dev_held(host_of(dev)) & HOST_HELD_REG) != 0 &&
      strcmp(fn, "mp_stream_destroy") == 0)
    return host_refuse_held(fn);
  return MP_OK;
}

/* Waits for the work queued on s so far; false (without waiting) in a
 * child that inherited s with work still queued, which no thread runs, or
 * with its mutex held at the fork. */
static bool host_stream_drain(host_stream_t *s) {
  if (host_stream_held(s))
    return false;
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->submitted;
  if (s->completed < target && host_inherited(s->dev)) {
    pthread_mutex_unlock(&s->mu);
    return false;
  }
  while (s->completed < target)
    pthread_cond_wait(&s->idle_cv, &s->mu);
  host_op_t *done = s->done;
  s->done = NULL;
  pthread_mutex_unlock(&s->mu);
  host_ops_free(done);
  return true;
}

/* Takes ownership of op: queues it, or frees it when the stream is being
 * destroyed. */
static mp_status_t host_stream_push(host_stream_t *s, host_op_t *op) {
  if (host_inherited(s->dev)) {
    free(op);
    return host_refuse_inherited("queueing work on a stream");
  }
  pthread_mutex_lock(&s->mu);
  if (s->stopping) {
    pthread_mutex_unlock(&s->mu);
    free(op);
    return mp__fail(MP_EINVAL, "host device: stream %p is being destroyed",
                    (void *)s);
  }
  op->next = NULL;
  uint64_t lat = s->dev->stream_latency_us;
  if (lat != 0) {
    clock_gettime(CLOCK_MONOTONIC, &op->start);
    uint64_t ns = (uint64_t)op->start.tv_nsec + lat % 1000000 * 1000;
    op->start.tv_sec += (time_t)(lat / 1000000 + ns / 1000000000);
    op->start.tv_nsec = (long)(ns % 1000000000);
  }
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->submitted++;
  host_stream_set_busy(s, true);
  pthread_cond_signal(&s->work_cv);
  host_op_t *done = s->done;
  s->done = NULL;
  pthread_mutex_unlock(&s->mu);
  host_ops_free(done);
  return MP_OK;
}

/* reg held (read or write). NULL when handle is not a stream of h. */
static host_stream_t *host_stream_find(host_dev_t *h, mp_stream_t handle) {
  if (handle == NULL)
    return h->null_stream;
  if (mp__ptrmap_find(&h->streams, (uintptr_t)handle) == NULL)
    return NULL;
  return (host_stream_t *)handle;
}

static mp_status_t host_unknown_stream(const char *fn, mp_stream_t s) {
  return mp__fail(MP_EINVAL, "%s: %p is not a live stream of this device", fn,
                  (void *)s);
}

static mp_status_t host_unknown_event(const char *fn, mp_event_t e) {
  return mp__fail(MP_EINVAL, "%s: %p is not a live event of this device", fn,
                  (void *)e);
}

/* A reference to the stream that survives a concurrent destroy; fn names
 * the caller's entry point in the error. */
static mp_status_t host_stream_get(host_dev_t *h, const char *fn,
                                   mp_stream_t handle, host_stream_t **out) {
  HOST_CHILD_NEEDS(h, HOST_HELD_REG, fn);
  pthread_rwlock_rdlock(&h->reg);
  host_stream_t *s = host_stream_find(h, handle);
  if (s != NULL)
    atomic_fetch_add(&s->refs, 1);
  pthread_rwlock_unlock(&h->reg);
  if (s == NULL)
    return host_unknown_stream(fn, handle);
  *out = s;
  return MP_OK;
}

/* Drains every stream of the device. */
static mp_status_t host_sync_all(host_dev_t *h, const char *fn) {
  mp_status_t st = host_check_caller(fn);
  if (st != MP_OK)
    return st;
  HOST_CHILD_NEEDS(h, HOST_HELD_BUSY, fn);
  /* Only the streams with work queued now: what is queued later is not
   * preceding work. Every device free and unmap comes here: a process with
   * a few busy streams should not pay a heap allocation for the list. */
  host_stream_t *few[32];
  pthread_mutex_lock(&h->busy_mu);
  size_t n = 0, count = 0;
  for (host_stream_t *s = h->busy_head; s != NULL; s = s->busy_next)
    count++;
  host_stream_t **all = few;
  if (count > sizeof few / sizeof *few)
    all = mp__host_alloc(count * sizeof *all);
  if (all == NULL) {
    pthread_mutex_unlock(&h->busy_mu);
    return mp__fail(MP_ENOMEM, "host device: out of host memory to "
                               "synchronize");
  }
  for (host_stream_t *s = h->busy_head; s != NULL; s = s->busy_next) {
    atomic_fetch_add(&s->refs, 1); /* it outlives a concurrent destroy */
    all[n++] = s;
  }
  pthread_mutex_unlock(&h->busy_mu);
  bool drained = true;
  for (size_t i = 0; i < n; i++) {
    drained = host_stream_drain(all[i]) && drained;
    host_stream_put(all[i]);
  }
  if (all != few)
    free(all);
  return drained ? MP_OK : host_refuse_inherited(fn);
}

static mp_status_t host_synchronize(mp_device_t *dev) {
  return host_sync_all(host_of(dev), "mp_device_synchronize");
}

static mp_status_t host_stream_create(mp_device_t *dev, mp_stream_t *out) {
  HOST_NOT_IN_HOST_FN("mp_stream_create");
  host_dev_t *h = host_of(dev);
  /* No work could be queued on it (host_stream_push), and its worker
   * would outlive every destroy and close of the inherited device. */
  HOST_NOT_INHERITED(h, "mp_stream_create");
  host_streams_reap(h, false);
  host_stream_t *s = NULL;
  mp_status_t st = host_stream_start(h, &s);
  if (st != MP_OK)
    return st;
  pthread_rwlock_wrlock(&h->reg);
  bool ok = mp__ptrmap_put(&h->streams, (uintptr_t)s) != NULL;
  pthread_rwlock_unlock(&h->reg);
  if (!ok) {
    host_stream_stop(s);
    return mp__fail(MP_ENOMEM, "host device: out of host memory for a stream");
  }
  *out = (mp_stream_t)s;
  return MP_OK;
}

static mp_status_t host_stream_destroy(mp_device_t *dev, mp_stream_t handle) {
  host_dev_t *h = host_of(dev);
  mp_status_t st = host_check_caller("mp_stream_destroy");
  if (st != MP_OK)
    return st;
  HOST_CHILD_NEEDS(h, HOST_HELD_REG, "mp_stream_destroy");
  pthread_rwlock_wrlock(&h->reg);
  bool found = mp__ptrmap_take(&h->streams, (uintptr_t)handle, NULL);
  pthread_rwlock_unlock(&h->reg);
  if (!found)
    return host_unknown_stream("mp_stream_destroy", handle);
  /* A forked child: the stream's worker did not come along (a join would
   * wait for ever), and a lock it held at the fork stays held here. The
   * stream is only let go, as the rest of the parent's state. */
  if (host_inherited(h))
    return MP_OK;
  /* "In case the device is still doing work in the stream hStream when
   * cuStreamDestroy() is called, the function will return immediately and
   * the resources associated with hStream will be released automatically
   * once the device has completed all work in hStream." (cuda.h,
   * cuStreamDestroy). An idle stream's worker is joined here; one with
   * work queued is orphaned: it runs the queue (a device synchronize or
   * free still waits for it through the busy list), then gives the stream
   * up itself (host_stream_main) to be joined by host_streams_reap. */
  host_stream_t *s = (host_stream_t *)handle;
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  s->orphan = s->completed != s->submitted;
  if (s->orphan) {
    pthread_mutex_lock(&h->dying_mu);
    h->dying++;
    pthread_mutex_unlock(&h->dying_mu);
  }
  bool orphan = s->orphan;
  pthread_cond_broadcast(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  if (!orphan)
    host_stream_stop(s);
  host_streams_reap(h, false);
  return MP_OK;
}

static mp_status_t host_stream_synchronize(mp_device_t *dev,
                                           mp_stream_t handle) {
  host_dev_t *h = host_of(dev);
  host_stream_t *s = NULL;
  mp_status_t st = host_check_caller("mp_stream_synchronize");
  if (st == MP_OK)
    st = host_stream_get(h, "mp_stream_synchronize", handle, &s);
  if (st != MP_OK)
    return st;
  bool drained = host_stream_drain(s);
  host_stream_put(s);
  return drained ? MP_OK : host_refuse_inherited("mp_stream_synchronize");
}

static mp_status_t host_stream_query(mp_device_t *dev, mp_stream_t handle) {
  HOST_NOT_IN_HOST_FN("mp_stream_query");
  host_dev_t *h = host_of(dev);
  host_stream_t *s = NULL;
  mp_status_t st = host_stream_get(h, "mp_stream_query", handle, &s);
  if (st != MP_OK)
    return st;
  if (host_stream_held(s)) {
    host_stream_put(s);
    return host_refuse_held("mp_stream_query");
  }
  pthread_mutex_lock(&s->mu);
  bool idle = s->completed == s->submitted;
  pthread_mutex_unlock(&s->mu);
  host_stream_put(s);
  return idle ? MP_OK : MP_EBUSY;
}

static bool host_stream_owned(mp_device_t *dev, mp_stream_t handle) {
  host_dev_t *h = host_of(dev);
  /* No answer in a child whose registry was held at the fork: every handle
   * may be one, so that mp_stream_destroy goes on to the refusal that says
   * why (host_caller_check) rather than call it unknown. host_stream_kind
   * still calls none a stream there. */
  if ((host_dev_held(h) & HOST_HELD_REG) != 0)
    return true;
  pthread_rwlock_rdlock(&h->reg);
  bool known = host_stream_find(h, handle) != NULL;
  pthread_rwlock_unlock(&h->reg);
  return known;
}

static int host_stream_kind(mp_device_t *dev, mp_stream_t handle) {
  if ((host_dev_held(host_of(dev)) & HOST_HELD_REG) != 0)
    return MP__STREAM_BAD;
  return host_stream_owned(dev, handle) ? MP__STREAM_SHARED : MP__STREAM_BAD;
}

/* Queues a filled-in op on a stream of h; takes ownership of op. */
static mp_status_t host_enqueue(host_dev_t *h, const char *fn,
                                mp_stream_t handle, host_op_t *op) {
  pthread_rwlock_rdlock(&h->reg);
  host_stream_t *s = host_stream_find(h, handle);
  mp_status_t st;
  if (s == NULL) {
    free(op);
    st = host_unknown_stream(fn, handle);
  } else {
    st = host_stream_push(s, op);
  }
  pthread_rwlock_unlock(&h->reg);
  return st;
}

static host_op_t *host_op_new(host_op_kind_t kind) {
  host_op_t *op = mp__host_calloc(1, sizeof *op);
  if (op != NULL)
    op->kind = kind;
  return op;
}

static mp_status_t host_no_op_memory(void) {
  return mp__fail(MP_ENOMEM, "host device: out of host memory to queue work");
}

static mp_status_t host_launch_host(mp_device_t *dev, mp_stream_t s,
                                    void (*fn)(void *), void *arg) {
  HOST_NOT_IN_HOST_FN("mp_stream_launch_host");
  HOST_NOT_INHERITED(host_of(dev), "mp_stream_launch_host");
  host_op_t *op = host_op_new(HOST_OP_HOST_FN);
  if (op == NULL)
    return host_no_op_memory();
  op->fn = fn;
  op->arg = arg;
  return host_enqueue(host_of(dev), "mp_stream_launch_host", s, op);
}

/* What a copy or memset needs of a range it touches (host_check_access). */
typedef enum host_access {
  HOST_ACCESS_DEVICE, /* device memory (a memset's destination) */
  HOST_ACCESS_READ,   /* device memory, or host memory it may read */
  HOST_ACCESS_WRITE   /* device memory, or host memory it may write */
} host_access_t;

static mp_status_t host_check_access(host_dev_t *h, const char *fn,
                                     const void *p, size_t n,
                                     host_access_t access);

static mp_status_t host_memcpy_async(mp_device_t *dev, void *dst,
                                     const void *src, size_t n, mp_stream_t s) {
  HOST_NOT_IN_HOST_FN("mp_memcpy_async");
  host_dev_t *h = host_of(dev);
  HOST_NOT_INHERITED(h, "mp_memcpy_async");
  /* "The memory areas may not overlap" (cuda_runtime_api.h,
   * cudaMemcpyAsync): a GPU's copy engine does not promise memmove's
   * order, so an overlapping copy is refused here rather than done right. */
  uintptr_t d = (uintptr_t)dst, from = (uintptr_t)src;
  if ((d > from ? d - from : from - d) < n)
    return mp__fail(MP_EINVAL,
                    "mp_memcpy_async: [%p, +%zu) and [%p, +%zu) overlap "
                    "(cuda_runtime_api.h, cudaMemcpyAsync: \"The memory "
                    "areas may not overlap\")",
                    dst, n, src, n);
  /* Either side may be host memory (cuMemcpyAsync infers the direction
   * from the pointers: host_check_access). */
  mp_status_t st =
      host_check_access(h, "mp_memcpy_async", dst, n, HOST_ACCESS_WRITE);
  if (st == MP_OK)
    st = host_check_access(h, "mp_memcpy_async", src, n, HOST_ACCESS_READ);
  if (st != MP_OK)
    return st;
  host_op_t *op = host_op_new(HOST_OP_COPY);
  if (op == NULL)
    return host_no_op_memory();
  op->dst = dst;
  op->src = src;
  op->n = n;
  return host_enqueue(h, "mp_memcpy_async", s, op);
}

static mp_status_t host_memset_async(mp_device_t *dev, void *dst, int value,
                                     size_t n, mp_stream_t s) {
  HOST_NOT_IN_HOST_FN("mp_memset_async");
  host_dev_t *h = host_of(dev);
  HOST_NOT_INHERITED(h, "mp_memset_async");
  /* Device memory only (host_check_access). */
  mp_status_t st =
      host_check_access(h, "mp_memset_async", dst, n, HOST_ACCESS_DEVICE);
  if (st != MP_OK)
    return st;
  host_op_t *op = host_op_new(HOST_OP_SET);
  if (op == NULL)
    return host_no_op_memory();
  op->dst = dst;
  op->value = value;
  op->n = n;
  return host_enqueue(h, "mp_memset_async", s, op);
}

/* ---- events ------------------------------------------------------------ */

/* reg held. */
static host_event_t *host_event_find(host_dev_t *h, mp_event_t handle) {
  if (mp__ptrmap_find(&h->events, (uintptr_t)handle) == NULL)
    return NULL;
  return (host_event_t *)handle;
}

static mp_status_t host_event_create(mp_device_t *dev, mp_event_t *out) {
  HOST_NOT_IN_HOST_FN("mp_event_create");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_REG, "mp_event_create");
  host_event_t *e = mp__host_calloc(1, sizeof *e);
  if (e == NULL)
    return mp__fail(MP_ENOMEM, "host device: out of host memory for an event");
  pthread_rwlock_wrlock(&h->reg);
  bool ok = mp__ptrmap_put(&h->events, (uintptr_t)e) != NULL;
  pthread_rwlock_unlock(&h->reg);
  if (!ok) {
    free(e);
    return mp__fail(MP_ENOMEM, "host device: out of host memory for an event");
  }
  *out = (mp_event_t)e;
  return MP_OK;
}

static mp_status_t host_event_destroy(mp_device_t *dev, mp_event_t handle) {
  HOST_NOT_IN_HOST_FN("mp_event_destroy");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_REG | HOST_HELD_EV, "mp_event_destroy");
  pthread_rwlock_wrlock(&h->reg);
  bool found = mp__ptrmap_take(&h->events, (uintptr_t)handle, NULL);
  pthread_rwlock_unlock(&h->reg);
  if (!found)
    return host_unknown_event("mp_event_destroy", handle);
  /* A record still queued keeps its marker alive through its own ref. */
  host_event_t *e = (host_event_t *)handle;
  pthread_mutex_lock(&h->ev_lock);
  host_marker_unref(h, e->last);
  host_marker_t *dead = host_markers_take_dead(h);
  pthread_mutex_unlock(&h->ev_lock);
  host_markers_free(dead);
  free(e);
  return MP_OK;
}

static mp_status_t host_event_record(mp_device_t *dev, mp_event_t handle,
                                     mp_stream_t stream) {
  HOST_NOT_IN_HOST_FN("mp_event_record");
  host_dev_t *h = host_of(dev);
  HOST_NOT_INHERITED(h, "mp_event_record");
  host_marker_t *m = mp__host_alloc(sizeof *m);
  host_op_t *op = host_op_new(HOST_OP_RECORD);
  if (m == NULL || op == NULL) {
    free(m);
    free(op);
    return host_no_op_memory();
  }
  *m = (host_marker_t){.refs = 2, .done = false};
  op->marker = m;
  pthread_rwlock_rdlock(&h->reg);
  host_event_t *e = host_event_find(h, handle);
  host_stream_t *s = host_stream_find(h, stream);
  mp_status_t st;
  if (e == NULL || s == NULL) {
    free(op);
    free(m);
    st = e == NULL ? host_unknown_event("mp_event_record", handle)
                   : host_unknown_stream("mp_event_record", stream);
  } else if ((st = host_stream_push(s, op)) != MP_OK) {
    free(m);
  } else {
    pthread_mutex_lock(&h->ev_lock);
    host_marker_unref(h, e->last);
    e->last = m;
    host_marker_t *dead = host_markers_take_dead(h);
    pthread_mutex_unlock(&h->ev_lock);
    host_markers_free(dead);
  }
  pthread_rwlock_unlock(&h->reg);
  return st;
}

static mp_status_t host_event_query(mp_device_t *dev, mp_event_t handle) {
  HOST_NOT_IN_HOST_FN("mp_event_query");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_REG | HOST_HELD_EV, "mp_event_query");
  pthread_rwlock_rdlock(&h->reg);
  host_event_t *e = host_event_find(h, handle);
  mp_status_t st = MP_OK;
  if (e == NULL) {
    st = host_unknown_event("mp_event_query", handle);
  } else {
    pthread_mutex_lock(&h->ev_lock);
    if (e->last != NULL && !e->last->done)
      st = MP_EBUSY;
    pthread_mutex_unlock(&h->ev_lock);
  }
  pthread_rwlock_unlock(&h->reg);
  return st;
}

static mp_status_t host_event_synchronize(mp_device_t *dev, mp_event_t handle) {
  host_dev_t *h = host_of(dev);
  mp_status_t st = host_check_caller("mp_event_synchronize");
  if (st != MP_OK)
    return st;
  HOST_CHILD_NEEDS(h, HOST_HELD_REG | HOST_HELD_EV, "mp_event_synchronize");
  pthread_rwlock_rdlock(&h->reg);
  host_event_t *e = host_event_find(h, handle);
  if (e == NULL) {
    pthread_rwlock_unlock(&h->reg);
    return host_unknown_event("mp_event_synchronize", handle);
  }
  pthread_mutex_lock(&h->ev_lock);
  host_marker_t *m = e->last;
  if (m != NULL)
    m->refs++;
  /* The marker ref keeps what we wait on alive if e is destroyed. */
  pthread_rwlock_unlock(&h->reg);
  bool never = m != NULL && !m->done && host_inherited(h);
  while (!never && m != NULL && !m->done)
    pthread_cond_wait(&h->ev_cv, &h->ev_lock);
  host_marker_unref(h, m);
  pthread_mutex_unlock(&h->ev_lock);
  return never ? host_refuse_inherited("mp_event_synchronize") : MP_OK;
}

static mp_status_t host_stream_wait_event(mp_device_t *dev, mp_stream_t stream,
                                          mp_event_t handle) {
  HOST_NOT_IN_HOST_FN("mp_stream_wait_event");
  host_dev_t *h = host_of(dev);
  HOST_NOT_INHERITED(h, "mp_stream_wait_event");
  host_op_t *op = host_op_new(HOST_OP_WAIT);
  if (op == NULL)
    return host_no_op_memory();
  pthread_rwlock_rdlock(&h->reg);
  host_event_t *e = host_event_find(h, handle);
  host_stream_t *s = host_stream_find(h, stream);
  mp_status_t st = MP_OK;
  if (e == NULL || s == NULL) {
    free(op);
    st = e == NULL ? host_unknown_event("mp_stream_wait_event", handle)
                   : host_unknown_stream("mp_stream_wait_event", stream);
  } else {
    pthread_mutex_lock(&h->ev_lock);
    host_marker_t *m = e->last;
    bool pending = m != NULL && !m->done;
    if (pending)
      m->refs++;
    pthread_mutex_unlock(&h->ev_lock);
    if (!pending) {
      free(op); /* nothing to wait for: like CUDA, a no-op */
    } else {
      op->marker = m;
      st = host_stream_push(s, op);
      if (st != MP_OK) {
        pthread_mutex_lock(&h->ev_lock);
        host_marker_unref(h, m);
        pthread_mutex_unlock(&h->ev_lock);
      }
    }
  }
  pthread_rwlock_unlock(&h->reg);
  return st;
}

/* ---- sorted range tables ---------------------------------------------- */

/* Entry i's base and size in a table of entries stride bytes apart. */
static uintptr_t host_tab_base(const void *tab, size_t stride, size_t i) {
  return *(const uintptr_t *)((const char *)tab + i * stride);
}

static size_t host_tab_bytes(const void *tab, size_t stride, size_t i) {
  return *(const size_t *)((const char *)tab + i * stride + sizeof(uintptr_t));
}

/* The number of entries whose base is below key. */
static size_t host_tab_below(const void *tab, size_t n, size_t stride,
                             uintptr_t key) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (host_tab_base(tab, stride, mid) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The index of the entry holding addr, or n. */
static size_t host_tab_find(const void *tab, size_t n, size_t stride,
                            uintptr_t addr) {
  size_t i = host_tab_below(tab, n, stride, addr);
  if (i < n && host_tab_base(tab, stride, i) == addr)
    return i;
  if (i > 0 && addr - host_tab_base(tab, stride, i - 1) <
                   host_tab_bytes(tab, stride, i - 1))
    return i - 1;
  return n;
}

/* The index of the last entry that [a, end) reaches into, or n when it
 * touches none. The range lies inside that entry, or crosses its edge. */
static size_t host_tab_touched(const void *tab, size_t n, size_t stride,
                               uintptr_t a, uintptr_t end) {
  size_t i = host_tab_below(tab, n, stride, end);
  if (i > 0 &&
      host_tab_base(tab, stride, i - 1) + host_tab_bytes(tab, stride, i - 1) >
          a)
    return i - 1;
  return n;
}

/* Opens the slot at base's place in a table with room (mp__host_room) and
 * counts it in *n; returns its index, for the caller to fill. */
static size_t host_tab_open(void *tab, size_t *n, size_t stride,
                            uintptr_t base) {
  size_t i = host_tab_below(tab, *n, stride, base);
  char *at = (char *)tab + i * stride;
  memmove(at + stride, at, (*n - i) * stride);
  (*n)++;
  return i;
}

/* Removes entry i. */
static void host_tab_close(void *tab, size_t *n, size_t stride, size_t i) {
  char *at = (char *)tab + i * stride;
  memmove(at, at + stride, (*n - i - 1) * stride);
  (*n)--;
}

/* mem_lock held. Adds e to allocation table t; false without host memory
 * for it (t unchanged). */
static bool host_atab_add(host_atab_t *t, host_entry_t e) {
  host_entry_t *room = mp__host_room(t->e, &t->cap, t->n, sizeof *room);
  if (room == NULL)
    return false;
  t->e = room;
  room[host_tab_open(room, &t->n, sizeof *room, e.key)] = e;
  return true;
}

/* mem_lock held. The allocation of t that starts at ptr, or NULL. */
static host_entry_t *host_atab_at(const host_atab_t *t, const void *ptr) {
  size_t i = host_tab_find(t->e, t->n, sizeof *t->e, (uintptr_t)ptr);
  return i < t->n && t->e[i].key == (uintptr_t)ptr ? &t->e[i] : NULL;
}

/* mem_lock held. Removes the allocation of t that starts at ptr into
 * *out; false when there is none. */
static bool host_atab_take(host_atab_t *t, const void *ptr, host_entry_t *out) {
  host_entry_t *at = host_atab_at(t, ptr);
  if (at == NULL)
    return false;
  *out = *at;
  host_tab_close(t->e, &t->n, sizeof *t->e, (size_t)(at - t->e));
  return true;
}

/* ---- device memory ----------------------------------------------------- */

/* mem_lock held. Counts one device allocation against fail_after and
 * capacity, and claims bytes of capacity on success. */
static mp_status_t host_charge(host_dev_t *h, const char *what, size_t bytes) {
  h->alloc_calls++;
  if (h->fail_after != 0 && h->alloc_calls >= h->fail_after)
    return mp__fail(MP_ENOMEM,
                    "host device: %s of %zu bytes failed by fault injection "
                    "(device allocation #%" PRIu64 ", fail_after=%" PRIu64 ")",
                    what, bytes, h->alloc_calls, h->fail_after);
  if (bytes > h->capacity - h->used) {
    char a[32], u[32], c[32];
    return mp__fail(MP_ENOMEM,
                    "host device out of memory: %s of %s (%zu bytes) asked, "
                    "%s in use, capacity %s",
                    what, mp__fmt_bytes(a, sizeof a, bytes), bytes,
                    mp__fmt_bytes(u, sizeof u, h->used),
                    mp__fmt_bytes(c, sizeof c, h->capacity));
  }
  h->used += bytes;
  return MP_OK;
}

/* ---- the device file -------------------------------------------------- */

static uint64_t host_page_round(uint64_t bytes) {
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  return (bytes + page - 1) & ~(page - 1);
}

/* mem_lock held. A fresh page-aligned range of the device file for bytes
 * (the file grows as ranges are handed out; it stays sparse). Only in the
 * process that opened the device: a forked child shares the file but has
 * its own copy of file_next, so the two would hand out the same offsets
 * (the same memory) and the child's ftruncate could cut the file under
 * the parent's newer mappings. Refused there, as CUDA refuses a forked
 * child its parent's context (the child opens a device of its own). */
static mp_status_t host_file_range(host_dev_t *h, const char *what,
                                   size_t bytes, uint64_t *off) {
  if (host_inherited(h))
    return host_refuse_inherited(what);
  uint64_t len = host_page_round(bytes);
  /* len may exceed the bound itself (a size of 4 EiB and more with a
   * capacity that large): the subtraction alone would wrap and let it
   * through, past the export tags (HOST_TAG_BASE). */
  if (len > (uint64_t)INT64_MAX / 2 ||
      h->file_next > (uint64_t)INT64_MAX / 2 - len)
    return mp__fail(MP_ENOMEM, "host device: %s: the device file is full",
                    what);
  if (ftruncate(h->memfd, (off_t)(h->file_next + len)) != 0)
    return mp__fail(MP_ENOMEM,
                    "host device: %s: cannot grow the device file: "
                    "%s",
                    what, strerror(errno));
  *off = h->file_next;
  h->file_next += len;
  return MP_OK;
}

/* mem_lock held. Takes back the range (off, bytes) that host_file_range
 * handed out and nothing wrote to (the mmap, or the table entry that
 * tracks it, failed: host_alloc, host_vm_map_at), when no range was
 * handed out after it: offsets are never reused, so without this a size
 * the address space cannot hold (mmap fails, past 128 TiB on x86-64) would
 * use up the file's offsets for good, and every later allocation and map
 * of the device would fail as "the device file is full". */
static void host_file_unrange(host_dev_t *h, uint64_t off, size_t bytes) {
  if (h->file_next == off + host_page_round(bytes))
    h->file_next = off;
}

/* Gives a range of the device file back (its pages go), unless another
 * process may still map it. A child forked from the process that opened
 * the device shares the file (its mappings are MAP_SHARED) but is not that
 * process: a range it frees is the parent's memory still (a live block of
 * the parent's, or one the parent freed that its queued work still uses),
 * so the child only lets go of its own view (unmapped, uncharged): a hole
 * punched there zeroed the parent's data. */
static void host_file_release(host_dev_t *h, const host_entry_t *e) {
  if ((e->flags & (HOST_MEM_EXPORTED | HOST_MEM_FOREIGN)) || host_inherited(h))
    return;
  (void)fallocate(h->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)e->off, (off_t)host_page_round(e->bytes));
}

static void host_uncharge(host_dev_t *h, size_t bytes) {
  pthread_mutex_lock(&h->mem_lock);
  h->used -= bytes;
  pthread_mutex_unlock(&h->mem_lock);
}

static mp_status_t host_mem_info(mp_device_t *dev, size_t *free_b,
                                 size_t *total_b) {
  HOST_NOT_IN_HOST_FN("mp_device_mem_info");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM, "mp_device_mem_info");
  pthread_mutex_lock(&h->mem_lock);
  *free_b = h->capacity - h->used;
  *total_b = h->capacity;
  pthread_mutex_unlock(&h->mem_lock);
  return MP_OK;
}

/* Every allocation is its own mmap: page aligned. */
static size_t host_alloc_align(mp_device_t *dev) {
  (void)dev;
  return (size_t)sysconf(_SC_PAGESIZE);
}

static mp_status_t host_alloc(mp_device_t *dev, size_t bytes, void **out) {
  HOST_NOT_IN_HOST_FN("mp_device_alloc");
  host_dev_t *h = host_of(dev);
  HOST_NOT_INHERITED(h, "mp_device_alloc");
  host_sleep_us(h->latency_us);
  pthread_mutex_lock(&h->mem_lock);
  uint64_t off = 0;
  mp_status_t st = host_charge(h, "mp_device_alloc", bytes);
  if (st == MP_OK &&
      (st = host_file_range(h, "mp_device_alloc", bytes, &off)) != MP_OK)
    h->used -= bytes;
  pthread_mutex_unlock(&h->mem_lock);
  if (st != MP_OK)
    return st;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, h->memfd, (off_t)off);
  if (p == MAP_FAILED) {
    int err = errno;
    pthread_mutex_lock(&h->mem_lock);
    h->used -= bytes;
    host_file_unrange(h, off, bytes);
    pthread_mutex_unlock(&h->mem_lock);
    return mp__fail(MP_ENOMEM, "host device: mmap of %zu bytes failed: %s",
                    bytes, strerror(err));
  }
  pthread_mutex_lock(&h->mem_lock);
  bool kept = host_atab_add(&h->allocs, (host_entry_t){.key = (uintptr_t)p,
                                                       .bytes = bytes,
                                                       .off = off,
                                                       .flags = 0});
  if (!kept) {
    /* Nothing was written through p: no pages to punch out. */
    h->used -= bytes;
    host_file_unrange(h, off, bytes);
  }
  pthread_mutex_unlock(&h->mem_lock);
  if (!kept) {
    munmap(p, bytes);
    return mp__fail(MP_ENOMEM, "host device: out of host memory to track an "
                               "allocation");
  }
  *out = p;
  return MP_OK;
}

/* Whether ptr starts an allocation of t (mem_lock taken here); *in is
 * the allocation holding ptr (bytes 0: none), for the refusal's message
 * (host_not_allocated). */
static bool host_atab_has(host_dev_t *h, const host_atab_t *t, const void *ptr,
                          host_entry_t *in) {
  pthread_mutex_lock(&h->mem_lock);
  size_t i = host_tab_find(t->e, t->n, sizeof *t->e, (uintptr_t)ptr);
  *in = i < t->n ? t->e[i] : (host_entry_t){0};
  pthread_mutex_unlock(&h->mem_lock);
  return in->bytes != 0 && in->key == (uintptr_t)ptr;
}

/* fn's refusal of ptr, which starts no allocation of those by made: it
 * names the allocation ptr lies inside (in, from host_atab_has), as the
 * pools and the direct allocator name a block. */
static mp_status_t host_not_allocated(const char *fn, const char *by,
                                      const void *ptr, const host_entry_t *in) {
  if (in->bytes != 0)
    return mp__fail(MP_EINVAL,
                    "%s: %p points inside the allocation at %p (%zu bytes), "
                    "not at its start",
                    fn, ptr, (void *)in->key, in->bytes);
  return mp__fail(MP_EINVAL,
                  "%s: %p was not returned by %s on this device, or was "
                  "already freed",
                  fn, ptr, by);
}

/* Takes the allocation of t that starts at ptr (mem_lock taken here). */
static bool host_atab_take_locked(host_dev_t *h, host_atab_t *t,
                                  const void *ptr, host_entry_t *out) {
  pthread_mutex_lock(&h->mem_lock);
  bool found = host_atab_take(t, ptr, out);
  pthread_mutex_unlock(&h->mem_lock);
  return found;
}

static mp_status_t host_free(mp_device_t *dev, void *ptr) {
  HOST_NOT_IN_HOST_FN("mp_device_free");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM | HOST_HELD_BUSY, "mp_device_free");
  host_entry_t in;
  if (!host_atab_has(h, &h->allocs, ptr, &in))
    return host_not_allocated("mp_device_free", "mp_device_alloc", ptr, &in);
  mp_status_t st = host_sync_all(h, "mp_device_free");
  if (st != MP_OK)
    return st;
  host_sleep_us(h->latency_us);
  host_entry_t e;
  /* Checked again: another thread may have freed it meanwhile. */
  if (!host_atab_take_locked(h, &h->allocs, ptr, &e))
    return mp__fail(MP_EINVAL, "mp_device_free: %p was already freed", ptr);
  munmap(ptr, e.bytes);
  host_file_release(h, &e);
  host_uncharge(h, e.bytes);
  return MP_OK;
}

static mp_status_t host_host_alloc(mp_device_t *dev, size_t bytes, void **out) {
  HOST_NOT_IN_HOST_FN("mp_device_host_alloc");
  host_dev_t *h = host_of(dev);
  /* An allocation like any other (host_inherited): CUDA refuses a forked
   * child its parent's context, cuMemHostAlloc included. */
  HOST_NOT_INHERITED(h, "mp_device_host_alloc");
  /* Pinning pages is a driver call like any other (cuMemHostAlloc). */
  host_sleep_us(h->latency_us);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return mp__fail(MP_ENOMEM,
                    "mp_device_host_alloc: mmap of %zu bytes failed: %s", bytes,
                    strerror(errno));
  pthread_mutex_lock(&h->mem_lock);
  bool kept = host_atab_add(
      &h->pins, (host_entry_t){.key = (uintptr_t)p, .bytes = bytes});
  pthread_mutex_unlock(&h->mem_lock);
  if (!kept) {
    munmap(p, bytes);
    return mp__fail(MP_ENOMEM, "host device: out of host memory to track a "
                               "host allocation");
  }
  *out = p;
  return MP_OK;
}

static mp_status_t host_host_free(mp_device_t *dev, void *ptr) {
  HOST_NOT_IN_HOST_FN("mp_device_host_free");
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM | HOST_HELD_BUSY, "mp_device_host_free");
  host_entry_t in;
  if (!host_atab_has(h, &h->pins, ptr, &in))
    return host_not_allocated("mp_device_host_free", "mp_device_host_alloc",
                              ptr, &in);
  /* Queued copies may still read or write it (cuMemFreeHost syncs too). */
  mp_status_t st = host_sync_all(h, "mp_device_host_free");
  if (st != MP_OK)
    return st;
  host_sleep_us(h->latency_us);
  host_entry_t e;
  if (!host_atab_take_locked(h, &h->pins, ptr, &e))
    return mp__fail(MP_EINVAL, "mp_device_host_free: %p was already freed",
                    ptr);
  munmap(ptr, e.bytes);
  return MP_OK;
}

/* ---- virtual memory ---------------------------------------------------- */

static mp_status_t host_no_vmm(const char *fn) {
  return mp__fail(MP_ENOTSUP, "%s: the host device was opened with vmm=0", fn);
}

static mp_status_t host_vm_granularity(mp_device_t *dev, size_t *out) {
  host_dev_t *h = host_of(dev);
  if (!h->vmm)
    return host_no_vmm("vm_granularity");
  *out = h->granularity;
  return MP_OK;
}

/* mem_lock held. Index of the reservation holding addr, or nresv. */
static size_t host_resv_find(const host_dev_t *h, uintptr_t addr) {
  return host_tab_find(h->resv, h->nresv, sizeof *h->resv, addr);
}

/* mem_lock held. true when granules [first, first + n) are all mapped. */
static bool host_resv_all_mapped(const host_resv_t *r, size_t first, size_t n) {
  for (size_t i = first; i < first + n; i++)
    if (!(r->bits[i / 64] & (UINT64_C(1) << (i % 64))))
      return false;
  return true;
}

/* mem_lock held. MP_EINVAL when [p, p + n), which does not wrap, reaches
 * into an allocation of t (what: its kind, for the message) without lying
 * inside it; else MP_OK, with *inside set when it lies inside one. */
static mp_status_t host_atab_inside(const host_atab_t *t, const char *what,
                                    const char *fn, const void *p, size_t n,
                                    bool *inside) {
  uintptr_t a = (uintptr_t)p, end = a + n;
  size_t k = host_tab_touched(t->e, t->n, sizeof *t->e, a, end);
  const host_entry_t *m = k < t->n ? &t->e[k] : NULL;
  if (m == NULL)
    return MP_OK;
  if (a >= m->key && end <= m->key + m->bytes) {
    *inside = true;
    return MP_OK;
  }
  return mp__fail(MP_EINVAL,
                  "%s: (%p, %zu bytes) crosses the edge of the %s "
                  "allocation at %p (%zu bytes): a copy or memset must lie "
                  "inside one allocation",
                  fn, p, n, what, (void *)m->key, m->bytes);
}

/* mem_lock held. Where [p, p + n), which does not wrap, lies in h's
 * memory: MP_EINVAL (said) when it reaches into a reservation, an
 * allocation, page-locked host memory or an IPC import without lying
 * inside it (or on granules not mapped); else MP_OK, with *inside set when
 * it lies inside one of them. */
static mp_status_t host_locate(host_dev_t *h, const char *fn, const void *p,
                               size_t n, bool *inside) {
  uintptr_t a = (uintptr_t)p, end = a + n;
  mp_status_t st = MP_OK;
  size_t i = host_tab_touched(h->resv, h->nresv, sizeof *h->resv, a, end);
  const host_resv_t *r = i < h->nresv ? &h->resv[i] : NULL;
  if (r != NULL) {
    size_t g = h->granularity;
    if (a < r->base || end > r->base + r->bytes)
      st = mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) crosses the edge of the virtual "
                    "memory reservation at %p",
                    fn, p, n, (void *)r->base);
    else if (!host_resv_all_mapped(r, (a - r->base) / g,
                                   (end - 1 - r->base) / g - (a - r->base) / g +
                                       1))
      st = mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) touches virtual memory that is not "
                    "mapped",
                    fn, p, n);
    else
      *inside = true;
  }
  if (st == MP_OK)
    st = host_atab_inside(&h->allocs, "device", fn, p, n, inside);
  if (st == MP_OK)
    st = host_atab_inside(&h->pins, "page-locked host", fn, p, n, inside);
  if (st == MP_OK)
    st = host_atab_inside(&h->imports, "IPC-imported or registered host", fn, p,
                          n, inside);
  return st;
}

static void host_devs_link(host_dev_t *h, bool in) {
  /* On the parent's list, which a child does not have (host_fork_child). */
  if (!in && host_inherited(h))
    return;
  pthread_mutex_lock(&host_devs_mu);
  if (in) {
    h->peer_prev = NULL;
    h->peer_next = host_devs;
    if (host_devs != NULL)
      host_devs->peer_prev = h;
    host_devs = h;
  } else {
    if (h->peer_prev != NULL)
      h->peer_prev->peer_next = h->peer_next;
    else
      host_devs = h->peer_next;
    if (h->peer_next != NULL)
      h->peer_next->peer_prev = h->peer_prev;
  }
  pthread_mutex_unlock(&host_devs_mu);
}

/* How host memory a copy names is mapped (host_host_access). */
typedef enum host_hmem {
  HOST_HMEM_OK,        /* mapped, with the access the copy needs */
  HOST_HMEM_UNMAPPED,  /* some page is not mapped */
  HOST_HMEM_NO_ACCESS, /* mapped, some of it without that access */
  HOST_HMEM_UNKNOWN,   /* /proc/self/maps cannot be read */
  HOST_HMEM_FAULTS     /* mapped with that access, but a page of it cannot
                          be brought in (past the end of its file) */
} host_hmem_t;

/* What /proc/self/maps says of [a, end), which does not wrap: the
 * mappings it lists in order must cover it without a gap, each with the
 * permission letter need ('r' or 'w'). Read with read(2) into the stack
 * (no allocation; a forked child may call it), its lines cut to their
 * head: "start-end perms ...". Costs a walk of the process's mappings (tens
 * of microseconds, more with many mappings): host_host_access asks it only
 * for large ranges, and to say why the kernel's probe refused one. */
static host_hmem_t host_maps_check(uintptr_t a, uintptr_t end, char need) {
  if (a >= end)
    return HOST_HMEM_OK;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return HOST_HMEM_UNKNOWN;
  char buf[4096], head[80];
  size_t hn = 0;
  uintptr_t cur = a;
  host_hmem_t res = HOST_HMEM_UNMAPPED; /* the list ended short of end */
  bool done = false;
  ssize_t got = 0;
  while (!done && (got = read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < got && !done; i++) {
      if (buf[i] != '\n') {
        if (hn < sizeof head - 1)
          head[hn++] = buf[i];
        continue;
      }
      head[hn] = '\0';
      hn = 0;
      unsigned long long lo, hi;
      char perms[5];
      if (sscanf(head, "%llx-%llx %4s", &lo, &hi, perms) != 3 || hi <= cur)
        continue;
      if (lo > cur) {
        done = true; /* a gap at cur */
      } else if (strchr(perms, need) == NULL) {
        res = HOST_HMEM_NO_ACCESS;
        done = true;
      } else if ((cur = (uintptr_t)hi) >= end) {
        res = HOST_HMEM_OK;
        done = true;
      }
    }
  }
  if (!done && got < 0)
    res = HOST_HMEM_UNKNOWN;
  close(fd);
  return res;
}

/* Linux 5.14's madvise advice (include/uapi/asm-generic/mman-common.h),
 * for C libraries whose headers predate it: an older kernel answers EINVAL,
 * and host_host_access reads /proc/self/maps then. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Ranges up to this many bytes are probed with madvise (host_host_access);
 * larger ones are looked up in /proc/self/maps. */
#define HOST_PROBE_MAX ((size_t)1 << 20)

/* How [p, p + n), which does not wrap, is mapped in this process, for a
 * copy that reads it (write false) or writes it.
 *
 * The common case is asked of the kernel in one system call that cannot
 * fault: madvise MADV_POPULATE_READ or MADV_POPULATE_WRITE (Linux 5.14)
 * brings the range's pages in as the copy's reads or writes would, without
 * touching the memory (its contents stay as they are), and succeeds only
 * where each page is mapped with that access and can be brought in. So it
 * costs about a page fault per page the copy would fault in anyway, where
 * the walk of /proc/self/maps (host_maps_check) made every copy of pageable
 * memory, however small, read and parse the process's whole list of
 * mappings. Its access rule is the kernel's for pinning pages (the
 * get_user_pages rule a device's DMA goes through): the mapping's
 * permissions, as /proc/self/maps shows them; so a write-only mapping
 * (PROT_WRITE without PROT_READ) is no copy's source, though an x86 CPU
 * could read it (see host_check_access).
 *
 * A range larger than HOST_PROBE_MAX is looked up in /proc/self/maps
 * instead: populating it would do on the caller's thread the page faults
 * of a long copy that its stream's worker is to take, and the walk costs
 * little beside such a copy. A refusal (or an older kernel's EINVAL) is
 * asked of /proc/self/maps too, which says why: not mapped (ENOMEM), or
 * without the access (EINVAL on recent kernels, EFAULT on older ones);
 * when it finds nothing wrong, a page past the end of its file (EFAULT,
 * SIGBUS when touched) faults. Where /proc is not mounted, only whether it
 * is mapped: msync answers ENOMEM for a range with pages not mapped, and
 * with MS_ASYNC it writes nothing back. */
static host_hmem_t host_host_access(const void *p, size_t n, bool write) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p & ~(page - 1), end = (uintptr_t)p + n;
  int err = 0;
  if (end - a <= HOST_PROBE_MAX) {
    if (madvise((void *)a, end - a,
                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
      return HOST_HMEM_OK;
    err = errno;
  }
  host_hmem_t res = host_maps_check(a, end, write ? 'w' : 'r');
  if (res == HOST_HMEM_OK && err == EFAULT)
    return HOST_HMEM_FAULTS;
  if (res != HOST_HMEM_UNKNOWN)
    return res;
  return msync((void *)a, end - a, MS_ASYNC) == 0 ? HOST_HMEM_OK
                                                  : HOST_HMEM_UNMAPPED;
}

/* Checks [p, p + n), a range a copy or memset queued on h touches, when it
 * is queued, so that what would fault on a worker thread (and kill the
 * process) is MP_EINVAL for the caller instead. The memory a host device
 * knows (its own, or any other open host device's: host_devs, but not
 * one a forked child inherited) is its plain allocations, the mapped
 * granules of its reservations, its page-locked host memory and its IPC
 * imports; a range that reaches into
 * one of them must lie inside it, and inside mapped granules. access:
 * HOST_ACCESS_DEVICE, the range must be such memory (a memset's
 * destination); else it may also be host memory the process has mapped
 * with the access the copy needs (a copy's sides: read its source, write
 * its destination).
 *
 * This is the driver's rule. It knows the allocation each device pointer
 * is in (cuda.h, cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
 * "Starting address for this requested pointer", and
 * CU_POINTER_ATTRIBUTE_RANGE_SIZE), and a copy past its end is
 * CUDA_ERROR_INVALID_VALUE or, once run, a fault
 * (CUDA_ERROR_ILLEGAL_ADDRESS); page-locked host memory (cuMemHostAlloc)
 * answers the same attributes. cuMemsetD8Async takes "dstDevice -
 * Destination device pointer" and returns CUDA_ERROR_INVALID_VALUE for
 * one that is not (cuda.h), so a memset is refused unless its whole range
 * is such memory. cuMemcpyAsync "infers the type of the transfer (host to
 * host, host to device, device to device, or device to host) from the
 * pointer values" (cuda.h, unified addressing): a pointer the driver does
 * not know is host memory, so a copy may take any host memory the process
 * has mapped, malloc'ed or not, but not an address nothing is mapped at
 * (a foreign pointer, a freed allocation), which would fault on the
 * worker, nor host memory mapped without the access the copy needs (a
 * destination mapped read-only, a side mapped PROT_NONE), which would
 * fault there too (host_host_access), nor a page that cannot be brought
 * in (a file mapping past its file's end: SIGBUS there).
 *
 * The access needed is the one the mapping grants (mmap's prot, as
 * /proc/self/maps shows it), not what a CPU happens to allow: a source
 * mapped PROT_WRITE without PROT_READ is refused, though x86 page tables
 * cannot say write-only and a memcpy there would read it. POSIX lets an
 * implementation "permit accesses other than those specified by prot"
 * (mmap), it does not promise them, and the kernel's rule for a device
 * that reads host memory (get_user_pages, which pins the pages for DMA:
 * cuMemHostRegister, process_vm_readv) is the mapping's: no read without
 * PROT_READ, on every architecture. A write-only destination is taken:
 * the copy only writes it. The check is made at enqueue time only:
 * vm_unmap does not wait for queued work (its caller must, as on CUDA),
 * so a range unmapped before the work ran faults on its worker thread
 * then. */
static mp_status_t host_check_access(host_dev_t *h, const char *fn,
                                     const void *p, size_t n,
                                     host_access_t access) {
  uintptr_t a = (uintptr_t)p;
  if (n > UINTPTR_MAX - a)
    return mp__fail(MP_EINVAL, "%s: (%p, %zu bytes) wraps around memory", fn, p,
                    n);
  bool inside = false;
  pthread_mutex_lock(&h->mem_lock);
  mp_status_t st = host_locate(h, fn, p, n, &inside);
  pthread_mutex_unlock(&h->mem_lock);
  if (st == MP_OK && !inside) {
    pthread_mutex_lock(&host_devs_mu);
    for (host_dev_t *o = host_devs; o != NULL && st == MP_OK && !inside;
         o = o->peer_next) {
      /* Not a device this process inherited (a forked child): its memory
       * is the parent's, no device memory of the child's (host_inherited),
       * and its mem_lock may have been held at the fork by a thread that
       * did not come along (host_close): taken, it would hang the child. */
      if (o == h || host_inherited(o))
        continue;
      pthread_mutex_lock(&o->mem_lock);
      st = host_locate(o, fn, p, n, &inside);
      pthread_mutex_unlock(&o->mem_lock);
    }
    pthread_mutex_unlock(&host_devs_mu);
  }
  if (st != MP_OK || inside)
    return st;
  if (access == HOST_ACCESS_DEVICE)
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is not device memory: no allocation, "
                    "virtual memory mapping, page-locked host memory or IPC "
                    "import of a host device holds it (cuda.h, "
                    "cuMemsetD8Async: dstDevice must be a device pointer, "
                    "else CUDA_ERROR_INVALID_VALUE)",
                    fn, p, n);
  host_hmem_t hm = host_host_access(p, n, access == HOST_ACCESS_WRITE);
  if (hm == HOST_HMEM_UNMAPPED)
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is neither memory of a host device "
                    "nor host memory mapped in this process (a foreign or "
                    "freed pointer?): cuMemcpyAsync takes a pointer the "
                    "device does not know for host memory",
                    fn, p, n);
  if (hm == HOST_HMEM_NO_ACCESS)
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is host memory mapped without %s "
                    "access (read-only or PROT_NONE): the copy %s it would "
                    "fault when it ran",
                    fn, p, n, access == HOST_ACCESS_WRITE ? "write" : "read",
                    access == HOST_ACCESS_WRITE ? "into" : "from");
  if (hm == HOST_HMEM_FAULTS)
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is host memory whose pages cannot be "
                    "brought in (a file mapping past the file's end?): the "
                    "copy %s it would fault (SIGBUS) when it ran",
                    fn, p, n, access == HOST_ACCESS_WRITE ? "into" : "from");
  return MP_OK;
}

static mp_status_t host_vm_reserve(mp_device_t *dev, size_t bytes, void **out) {
  HOST_NOT_IN_HOST_FN("vm_reserve");
  host_dev_t *h = host_of(dev);
  size_t g = h->granularity;
  if (!h->vmm)
    return host_no_vmm("vm_reserve");
  /* An allocation (of the device's address space) like vm_map's and
   * mp_device_alloc's: refused in a child that inherited h, before any
   * lock (host_inherited; cuMemAddressReserve needs the context CUDA
   * refuses a forked child). vm_release is a free: the child lets go of
   * its view of a reservation, as vm_unmap of a mapping. */
  HOST_NOT_INHERITED(h, "vm_reserve");
  if (out == NULL || bytes == 0 || bytes % g != 0)
    return mp__fail(MP_EINVAL,
                    "vm_reserve: %zu bytes is not a positive multiple of the "
                    "granularity (%zu)",
                    bytes, g);
  /* The reservation is made a granule larger, to align its base. */
  if (bytes > SIZE_MAX - g)
    return mp__fail(MP_EINVAL,
                    "vm_reserve: %zu bytes is too large: with the granule "
                    "(%zu) its base is aligned with, it passes the address "
                    "space (SIZE_MAX)",
                    bytes, g);
  size_t nbits = bytes / g;
  uint64_t *bits = mp__host_calloc((nbits + 63) / 64, sizeof *bits);
  /* Over-reserve by a granule so that the base can be aligned to it. */
  char *raw = bits ? mmap(NULL, bytes + g, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                   : MAP_FAILED;
  if (raw == MAP_FAILED) {
    free(bits);
    return mp__fail(MP_ENOMEM, "vm_reserve: cannot reserve %zu bytes", bytes);
  }
  uintptr_t base = ((uintptr_t)raw + g - 1) & ~(uintptr_t)(g - 1);
  size_t head = base - (uintptr_t)raw;
  if (head)
    munmap(raw, head);
  if (g - head)
    munmap((char *)base + bytes, g - head);

  pthread_mutex_lock(&h->mem_lock);
  host_resv_t *t = mp__host_room(h->resv, &h->resv_cap, h->nresv, sizeof *t);
  bool ok = t != NULL;
  if (ok) {
    h->resv = t;
    size_t i = host_tab_open(t, &h->nresv, sizeof *t, base);
    t[i] = (host_resv_t){.base = base, .bytes = bytes, .bits = bits};
  }
  pthread_mutex_unlock(&h->mem_lock);
  if (!ok) {
    munmap((void *)base, bytes);
    free(bits);
    return mp__fail(MP_ENOMEM, "vm_reserve: out of host memory");
  }
  *out = (void *)base;
  return MP_OK;
}

static mp_status_t host_vm_release(mp_device_t *dev, void *base, size_t bytes) {
  HOST_NOT_IN_HOST_FN("vm_release");
  host_dev_t *h = host_of(dev);
  if (!h->vmm)
    return host_no_vmm("vm_release");
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM, "vm_release");
  pthread_mutex_lock(&h->mem_lock);
  size_t i = host_resv_find(h, (uintptr_t)base);
  mp_status_t st = MP_OK;
  if (i == h->nresv || h->resv[i].base != (uintptr_t)base ||
      h->resv[i].bytes != bytes) {
    st = mp__fail(MP_EINVAL,
                  "vm_release: (%p, %zu bytes) is not a reservation made by "
                  "vm_reserve",
                  base, bytes);
  } else if (h->resv[i].mapped != 0) {
    st = mp__fail(MP_EBUSY,
                  "vm_release: reservation %p still has %zu bytes mapped; "
                  "vm_unmap them first",
                  base, h->resv[i].mapped);
  }
  uint64_t *bits = NULL;
  if (st == MP_OK) {
    bits = h->resv[i].bits;
    host_tab_close(h->resv, &h->nresv, sizeof *h->resv, i);
  }
  pthread_mutex_unlock(&h->mem_lock);
  if (st == MP_OK) {
    munmap(base, bytes);
    free(bits);
  }
  return st;
}

/* mem_lock held. Sets (on) or clears granules [first, first + n). Returns
 * false, changing nothing, when setting would hit a granule already set. */
static bool host_resv_mark(host_resv_t *r, size_t first, size_t n, bool on) {
  if (on)
    for (size_t i = first; i < first + n; i++)
      if (r->bits[i / 64] & (UINT64_C(1) << (i % 64)))
        return false;
  for (size_t i = first; i < first + n; i++) {
    if (on)
      r->bits[i / 64] |= UINT64_C(1) << (i % 64);
    else
      r->bits[i / 64] &= ~(UINT64_C(1) << (i % 64));
  }
  return true;
}

/* mem_lock held. The reservation wholly holding a granule-aligned range. */
static mp_status_t host_vm_range(host_dev_t *h, const char *fn, void *addr,
                                 size_t bytes, host_resv_t **out) {
  uintptr_t a = (uintptr_t)addr;
  size_t g = h->granularity;
  if (bytes == 0 || a % g != 0 || bytes % g != 0)
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is not aligned to the granularity "
                    "(%zu)",
                    fn, addr, bytes, g);
  size_t i = host_resv_find(h, a);
  if (i == h->nresv || bytes > h->resv[i].bytes - (a - h->resv[i].base))
    return mp__fail(MP_EINVAL,
                    "%s: (%p, %zu bytes) is not inside one reservation", fn,
                    addr, bytes);
  *out = &h->resv[i];
  return MP_OK;
}

/* vm_map of fresh device memory (fd < 0), or of the range of another
 * device's file that fd names at foreign_off (vm_map_file). */
static mp_status_t host_vm_map_at(mp_device_t *dev, void *addr, size_t bytes,
                                  int fd, uint64_t foreign_off) {
  HOST_NOT_IN_HOST_FN("vm_map");
  host_dev_t *h = host_of(dev);
  if (!h->vmm)
    return host_no_vmm("vm_map");
  HOST_NOT_INHERITED(h, "vm_map");
  host_sleep_us(h->latency_us);
  pthread_mutex_lock(&h->mem_lock);
  host_resv_t *r = NULL;
  size_t g = h->granularity;
  mp_status_t st = host_vm_range(h, "vm_map", addr, bytes, &r);
  size_t first = st == MP_OK ? ((uintptr_t)addr - r->base) / g : 0;
  if (st == MP_OK && !host_resv_mark(r, first, bytes / g, true))
    st = mp__fail(MP_EINVAL, "vm_map: (%p, %zu bytes) overlaps a mapping", addr,
                  bytes);
  if (st == MP_OK) {
    /* Another device's memory (vm_map_file) is not charged here. */
    bool own = fd < 0;
    uint64_t off = 0;
    if (own) {
      st = host_charge(h, "vm_map", bytes);
      if (st == MP_OK &&
          (st = host_file_range(h, "vm_map", bytes, &off)) != MP_OK)
        h->used -= bytes;
    } else {
      off = foreign_off;
    }
    bool charged = own && st == MP_OK;
    host_entry_t *e = NULL;
    if (st == MP_OK && (e = mp__ptrmap_put(&h->maps, (uintptr_t)addr)) == NULL)
      st = mp__fail(MP_ENOMEM, "vm_map: out of host memory");
    if (st == MP_OK)
      *e = (host_entry_t){.key = (uintptr_t)addr,
                          .bytes = bytes,
                          .off = off,
                          .flags = own ? 0 : HOST_MEM_FOREIGN};
    if (st == MP_OK && mmap(addr, bytes, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_FIXED | MAP_NORESERVE,
                            own ? h->memfd : fd, (off_t)off) == MAP_FAILED) {
      mp__ptrmap_remove(&h->maps, e);
      st = mp__fail(MP_ENOMEM, "vm_map: mmap of %zu bytes failed: %s", bytes,
                    strerror(errno));
    }
    /* A failure after the charge gives back the capacity and the file
     * range, as host_alloc does: mem_lock was held since the range was
     * handed out, so it is the last one and its offsets are reused. */
    if (st != MP_OK && charged) {
      h->used -= bytes;
      host_file_unrange(h, off, bytes);
    }
    if (st == MP_OK)
      r->mapped += bytes;
    else
      host_resv_mark(r, first, bytes / g, false);
  }
  pthread_mutex_unlock(&h->mem_lock);
  return st;
}

static mp_status_t host_vm_map(mp_device_t *dev, void *addr, size_t bytes) {
  return host_vm_map_at(dev, addr, bytes, -1, 0);
}

/* Whether fd is a descriptor of a host device's file: a memfd made under
 * HOST_MEMFD_NAME, which /proc shows as "/memfd:NAME (deleted)". */
static bool host_fd_is_device_file(int fd) {
  static const char want[] = "/memfd:" HOST_MEMFD_NAME;
  char path[48], link[sizeof want + 16];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < (ssize_t)sizeof want - 1)
    return false;
  link[n] = '\0';
  return memcmp(link, want, sizeof want - 1) == 0 &&
         (link[sizeof want - 1] == '\0' || link[sizeof want - 1] == ' ');
}

/* Export tags (host_ipc_export): byte HOST_TAG_BASE + tag of the device
 * file, past every range host_file_range hands out (the file stays under
 * INT64_MAX / 2 bytes), write-locked by one export's open file description
 * only. The handle names its tag, and the file's identity, in its opaque
 * bytes (a host_ipc_tag_t). */
#define HOST_TAG_BASE  ((uint64_t)INT64_MAX / 2 + 1)
#define HOST_TAG_MAGIC UINT64_C(0x6d70686f73747467)
#define HOST_TAG_TRIES 4096u

typedef struct host_ipc_tag {
  uint64_t magic, dev, ino, tag;
} host_ipc_tag_t;
_Static_assert(sizeof(host_ipc_tag_t) <= sizeof(((mp_ipc_handle_t *)0)->opaque),
               "an export's tag fits in a handle's opaque bytes");

static struct flock host_tag_lock(short type, uint64_t tag) {
  return (struct flock){.l_type = type,
                        .l_whence = SEEK_SET,
                        .l_start = (off_t)(HOST_TAG_BASE + tag),
                        .l_len = 1};
}

/* What host_fd_range learns of descriptor fd from another open file
 * description of its file, made for the questions (F_OFD_GETLK reports the
 * locks of other descriptions only): the range of the export lock
 * (host_ipc_export) covering the byte at `at` (*start, *len; *len 0: none),
 * and whether fd's own description holds export tag `tag` (*tagged: a lock
 * there that the new description sees and fd's does not; a tag is only
 * ever write-locked by one description). Exports lock whole allocations,
 * whose ranges of the file are disjoint, so a lock over that byte is one
 * of the allocation holding it. 0, or the errno that kept a question from
 * being asked (out of descriptors: EMFILE). */
static int host_fd_export(int fd, off_t at, uint64_t tag, off_t *start,
                          off_t *len, bool *tagged) {
  char path[48];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int other = open(path, O_RDONLY | O_CLOEXEC);
  if (other < 0)
    return errno;
  struct flock fl = {
      .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
  struct flock seen = host_tag_lock(F_WRLCK, tag);
  struct flock own = seen;
  int err = fcntl(other, F_OFD_GETLK, &fl) == 0 &&
                    fcntl(other, F_OFD_GETLK, &seen) == 0 &&
                    fcntl(fd, F_OFD_GETLK, &own) == 0
                ? 0
                : errno;
  close(other);
  *start = fl.l_start;
  *len = fl.l_type != F_UNLCK ? fl.l_len : 0;
  *tagged = seen.l_type != F_UNLCK && own.l_type == F_UNLCK;
  return err;
}

/* The descriptor's file offset, and whether (offset, bytes) lies in it:
 * what a descriptor from ipc_export names, a host device's file positioned
 * at the page-aligned start of a range (host_file_range). Anything else
 * (another file, a misaligned offset) is refused as no IPC handle, before
 * mmap would fail on it with an error that tells nothing; and so is a
 * range outside the allocation exported (host_fd_export): the descriptor
 * opens the whole file, its neighbours too. With id (an import), the
 * descriptor must also be the one that export made (its description holds
 * the export's tag): a number closed and reused for another descriptor of
 * the file (another export's) names memory the handle's sizes and lease
 * are not of. */
static mp_status_t host_fd_range(const char *fn, int fd, size_t bytes,
                                 const host_ipc_tag_t *id, uint64_t *off) {
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
      !host_fd_is_device_file(fd))
    return mp__fail(MP_EINVAL,
                    "%s: not a mempool IPC handle: descriptor %d is not a "
                    "host device's memory file",
                    fn, fd);
  if (id != NULL && id->magic != HOST_TAG_MAGIC)
    return mp__fail(MP_EINVAL,
                    "%s: not a mempool IPC handle: it names no host device "
                    "export (its opaque bytes are not an export's)",
                    fn);
  off_t at = lseek(fd, 0, SEEK_CUR);
  if (at < 0 || (uint64_t)at % (uint64_t)sysconf(_SC_PAGESIZE) != 0)
    return mp__fail(MP_EINVAL,
                    "%s: not a mempool IPC handle: descriptor %d is at "
                    "offset %lld of the device file, where no exported "
                    "range starts (not page-aligned)",
                    fn, fd, (long long)at);
  if ((uint64_t)sb.st_size < (uint64_t)at ||
      (uint64_t)sb.st_size - (uint64_t)at < bytes)
    return mp__fail(MP_EINVAL,
                    "%s: descriptor %d does not hold %zu bytes of host device "
                    "memory",
                    fn, fd, bytes);
  off_t start = 0, len = 0;
  bool tagged = false;
  int err =
      host_fd_export(fd, at, id != NULL ? id->tag : 0, &start, &len, &tagged);
  if (err != 0)
    return mp__fail(MP_EIO,
                    "%s: cannot ask which allocation descriptor %d exports: "
                    "%s",
                    fn, fd, strerror(err));
  if (id != NULL &&
      (id->dev != (uint64_t)sb.st_dev || id->ino != (uint64_t)sb.st_ino ||
       id->tag >= HOST_TAG_BASE || !tagged))
    return mp__fail(MP_EINVAL,
                    "%s: descriptor %d is not the one its export made (its "
                    "number closed and reused for another descriptor, maybe "
                    "another export's?): nothing mapped",
                    fn, fd);
  if (len == 0 || start != at)
    return mp__fail(MP_EINVAL,
                    "%s: descriptor %d is at offset %lld of the device file, "
                    "where no exported allocation starts (a handle no "
                    "export made, or of another one)",
                    fn, fd, (long long)at);
  if ((uint64_t)len < bytes)
    return mp__fail(MP_EINVAL,
                    "%s: descriptor %d names an exported allocation of %lld "
                    "bytes, not the %zu the handle claims",
                    fn, fd, (long long)len, bytes);
  *off = (uint64_t)at;
  return MP_OK;
}

mp_status_t mp__host_vm_map_file(mp_device_t *dev, void *addr, size_t bytes,
                                 int fd) {
  if (dev->ops != &mp__host_backend)
    return mp__fail(MP_ENOTSUP, "vm_map_file: %s is not a host device",
                    dev->name);
  uint64_t off = 0;
  mp_status_t st = host_fd_range("vm_map_file", fd, bytes, NULL, &off);
  return st == MP_OK ? host_vm_map_at(dev, addr, bytes, fd, off) : st;
}

/* mem_lock held. MP_OK when (addr, bytes) is exactly one live mapping. */
static mp_status_t host_vm_mapping(host_dev_t *h, void *addr, size_t bytes,
                                   host_entry_t **out) {
  host_entry_t *e = mp__ptrmap_find(&h->maps, (uintptr_t)addr);
  *out = e;
  if (e == NULL || e->bytes != bytes)
    return mp__fail(MP_EINVAL,
                    "vm_unmap: (%p, %zu bytes) is not a range that one "
                    "vm_map call mapped",
                    addr, bytes);
  return MP_OK;
}

/* Makes the mapped range (addr, bytes) of a reservation PROT_NONE again,
 * keeping it taken, so that no other mmap lands inside the reservation: an
 * anonymous PROT_NONE mapping over it, or, where the kernel refuses that
 * (ENOMEM: too many mappings), the mapping itself made PROT_NONE. false
 * (errno set) when both fail: the range is as it was, unless the failed
 * mmap took the mapping away (Linux may), which a retry fences again. */
static bool host_fence(void *addr, size_t bytes) {
  if (mmap(addr, bytes, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0) != MAP_FAILED)
    return true;
  return mprotect(addr, bytes, PROT_NONE) == 0;
}

static mp_status_t host_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  HOST_NOT_IN_HOST_FN("vm_unmap");
  host_dev_t *h = host_of(dev);
  if (!h->vmm)
    return host_no_vmm("vm_unmap");
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM, "vm_unmap");
  host_entry_t *e = NULL;
  pthread_mutex_lock(&h->mem_lock);
  mp_status_t st = host_vm_mapping(h, addr, bytes, &e);
  pthread_mutex_unlock(&h->mem_lock);
  if (st != MP_OK)
    return st;
  /* No wait for the streams, as on CUDA (backend.h): the caller vouches
   * that no queued work touches the range; work that did would fault on
   * the fenced pages below, which is how the tests catch it. */
  host_sleep_us(h->latency_us);
  pthread_mutex_lock(&h->mem_lock);
  st = host_vm_mapping(h, addr, bytes, &e);
  if (st == MP_OK && !host_fence(addr, bytes))
    st = mp__fail(MP_ENOMEM,
                  "vm_unmap: cannot fence (%p, %zu bytes) again (%s): the "
                  "range stays mapped",
                  addr, bytes, strerror(errno));
  if (st == MP_OK) {
    host_entry_t gone = *e;
    mp__ptrmap_remove(&h->maps, e);
    host_resv_t *r = &h->resv[host_resv_find(h, (uintptr_t)addr)];
    host_resv_mark(r, ((uintptr_t)addr - r->base) / h->granularity,
                   bytes / h->granularity, false);
    r->mapped -= bytes;
    if (!(gone.flags & HOST_MEM_FOREIGN))
      h->used -= bytes;
    /* The range is fenced: give the file range back (the next map reads
     * zeros). */
    host_file_release(h, &gone);
  }
  pthread_mutex_unlock(&h->mem_lock);
  return st;
}

/* ---- IPC ---------------------------------------------------------------- */

/* mem_lock held. The allocation (vm: the mapping) of h that is exactly
 * (base, bytes), of h's own memory, and its offset in the device file;
 * NULL when there is none. */
static host_entry_t *host_export_entry(host_dev_t *h, void *base, size_t bytes,
                                       bool vm, uint64_t *off) {
  host_entry_t *e = vm ? mp__ptrmap_find(&h->maps, (uintptr_t)base)
                       : host_atab_at(&h->allocs, base);
  if (e == NULL || e->bytes != bytes || (e->flags & HOST_MEM_FOREIGN))
    return NULL;
  *off = e->off;
  return e;
}

/* A new open file description of the device file positioned at the
 * range's offset, so that the descriptor alone names the memory (as a
 * CUDA shareable handle does); exporting twice gives two descriptors. The
 * description opens the whole file: it holds a read lock (F_OFD_SETLK,
 * which no one else takes) over the range exported, which an import
 * checks its range against (host_fd_range), and a write lock on a tag of
 * its own, which the handle names (an import checks that its descriptor's
 * description holds it). The locks go with the description, when its last
 * descriptor closes, in any process. */
static mp_status_t host_ipc_export(mp_device_t *dev, void *base, size_t bytes,
                                   bool vm, mp_ipc_handle_t *h) {
  HOST_NOT_IN_HOST_FN("ipc_export");
  host_dev_t *hd = host_of(dev);
  /* Not the memory of a device this process inherited (a forked child):
   * it is the parent's, which would never learn of the export (its entry
   * is not marked exported here), free it with its pages punched out and
   * reuse it while an importer still maps it. As allocations and queued
   * work are, refused before any lock (host_inherited). */
  HOST_NOT_INHERITED(hd, "ipc_export");
  uint64_t off = 0;
  pthread_mutex_lock(&hd->mem_lock);
  bool ok = host_export_entry(hd, base, bytes, vm, &off) != NULL;
  pthread_mutex_unlock(&hd->mem_lock);
  if (!ok)
    return mp__fail(MP_EINVAL,
                    "ipc_export: (%p, %zu bytes) is not one %s of this device",
                    base, bytes, vm ? "mapping" : "allocation");
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", hd->memfd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct flock fl = {.l_type = F_RDLCK,
                     .l_whence = SEEK_SET,
                     .l_start = (off_t)off,
                     .l_len = (off_t)bytes};
  struct stat sb;
  host_ipc_tag_t id = {.magic = HOST_TAG_MAGIC};
  int err = fd < 0 || lseek(fd, (off_t)off, SEEK_SET) != (off_t)off ||
                    fcntl(fd, F_OFD_SETLK, &fl) != 0 || fstat(fd, &sb) != 0
                ? errno
                : 0;
  /* A tag no other description holds: another process sharing the file
   * (a forked child) counts tags of its own, so a taken one is skipped. */
  bool tagged = false;
  for (unsigned i = 0; err == 0 && !tagged && i < HOST_TAG_TRIES; i++) {
    pthread_mutex_lock(&hd->mem_lock);
    id.tag = ++hd->export_tag;
    pthread_mutex_unlock(&hd->mem_lock);
    struct flock tl = host_tag_lock(F_WRLCK, id.tag);
    tagged = fcntl(fd, F_OFD_SETLK, &tl) == 0;
    if (!tagged && errno != EAGAIN && errno != EACCES)
      err = errno;
  }
  if (err == 0 && !tagged)
    err = EAGAIN; /* every tag tried is another description's */
  /* Marked exported (never punched out: an importer may map it) only
   * now: a refused export left the range marked, and its pages stayed
   * taken after the free, until the device closed. The range is the one
   * the descriptor names: a free meanwhile took it out of the table (and
   * punched its pages out), and the export is refused. */
  uint64_t now = 0;
  if (err == 0) {
    pthread_mutex_lock(&hd->mem_lock);
    host_entry_t *e = host_export_entry(hd, base, bytes, vm, &now);
    if (e != NULL && now == off)
      e->flags |= HOST_MEM_EXPORTED;
    else
      err = ENOENT;
    pthread_mutex_unlock(&hd->mem_lock);
  }
  if (err != 0) {
    if (fd >= 0)
      close(fd);
    if (err == ENOENT)
      return mp__fail(MP_EINVAL,
                      "ipc_export: (%p, %zu bytes) was freed or unmapped "
                      "while it was exported",
                      base, bytes);
    return mp__fail(MP_EIO,
                    "ipc_export: cannot open or lock the device file: %s",
                    strerror(err));
  }
  id.dev = (uint64_t)sb.st_dev;
  id.ino = (uint64_t)sb.st_ino;
  h->kind = MP_IPC_FD;
  h->fd = fd;
  memcpy(h->opaque, &id, sizeof id);
  return MP_OK;
}

/* (p, bytes), mapped from another process's memory, is an import of h:
 * device memory to copies and memsets until taken out of h->imports. */
static mp_status_t host_import_add(host_dev_t *h, const char *fn, void *p,
                                   size_t bytes) {
  pthread_mutex_lock(&h->mem_lock);
  bool kept = host_atab_add(
      &h->imports, (host_entry_t){.key = (uintptr_t)p, .bytes = bytes});
  pthread_mutex_unlock(&h->mem_lock);
  return kept ? MP_OK
              : mp__fail(MP_ENOMEM, "%s: out of host memory to track an import",
                         fn);
}

static mp_status_t host_ipc_open(mp_device_t *dev, const mp_ipc_handle_t *h,
                                 void **out) {
  /* Named as the call made (include/mempool/pool.h): ipc_open is the
   * backend's operation, no function of the API. */
  HOST_NOT_IN_HOST_FN("mp_ipc_import");
  HOST_CHILD_NEEDS(host_of(dev), HOST_HELD_MEM, "mp_ipc_import");
  uint64_t off = 0;
  host_ipc_tag_t id;
  memcpy(&id, h->opaque, sizeof id);
  mp_status_t st =
      h->kind == MP_IPC_FD
          ? host_fd_range("mp_ipc_import", h->fd, h->mem_bytes, &id, &off)
          : mp__fail(MP_EINVAL,
                     "mp_ipc_import: a host device imports "
                     "descriptors only (kind %u)",
                     h->kind);
  if (st != MP_OK)
    return st;
  void *p = mmap(NULL, h->mem_bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_NORESERVE, h->fd, (off_t)off);
  if (p == MAP_FAILED)
    return mp__fail(MP_ENOMEM, "mp_ipc_import: mmap of %zu bytes failed: %s",
                    h->mem_bytes, strerror(errno));
  /* Known to copies and memsets (host_check_access) until ipc_close. */
  st = host_import_add(host_of(dev), "mp_ipc_import", p, h->mem_bytes);
  if (st != MP_OK) {
    munmap(p, h->mem_bytes);
    return st;
  }
  *out = p;
  return MP_OK;
}

mp_status_t mp__host_note_import(mp_device_t *dev, void *p, size_t bytes,
                                 bool mapped) {
  if (dev->ops != &mp__host_backend)
    return mp__fail(MP_ENOTSUP, "note_import: %s is not a host device",
                    dev->name);
  host_dev_t *h = host_of(dev);
  HOST_CHILD_NEEDS(h, HOST_HELD_MEM, "note_import");
  if (!mapped) {
    host_entry_t gone;
    return host_atab_take_locked(h, &h->imports, p, &gone)
               ? MP_OK
               : mp__fail(MP_EINVAL, "note_import: %p is no import", p);
  }
  return host_import_add(h, "note_import", p, bytes);
}

static mp_status_t host_ipc_close(mp_device_t *dev, void *base, size_t bytes,
                                  unsigned kind, bool *unmapped) {
  (void)kind;
  /* No wait here: ipc.c has waited for the work that may use it (the
   * device's, or one stream's). A driver call on the cuda backend. */
  mp_status_t st = host_check_caller("mp_ipc_close");
  if (st == MP_OK) {
    host_dev_t *h = host_of(dev);
    host_entry_t gone;
    /* In a forked child whose memory lock was held at the fork, the table
     * of imports stays as it was (the lock is never free there), but the
     * mapping, the child's own view, still goes: ipc.c names it, and no
     * call of the child reads that table again (it queues no copy on the
     * device it inherited, and its own devices' checks pass over that
     * device: host_check_access), so the entry left is never taken for
     * memory. Refused, the import stayed mapped in the child for good. */
    if ((host_dev_held(h) & HOST_HELD_MEM) == 0)
      (void)host_atab_take_locked(h, &h->imports, base, &gone);
    munmap(base, bytes);
  }
  *unmapped = st == MP_OK;
  return st;
}

/* ---- options, open, close ---------------------------------------------- */

enum {
  HOST_OPT_CAPACITY,
  HOST_OPT_LATENCY,
  HOST_OPT_STREAM_LATENCY,
  HOST_OPT_FAIL_AFTER,
  HOST_OPT_VMM,
  HOST_OPT_GRANULARITY,
  HOST_OPT_COUNT
};
static const char *const host_opt_names[HOST_OPT_COUNT] = {
    "capacity",   "latency_us", "stream_latency_us",
    "fail_after", "vmm",        "granularity"};

#define HOST_MAX_LATENCY_US UINT64_C(10000000) /* 10 s */

typedef struct host_opts {
  size_t capacity;
  uint64_t latency_us, stream_latency_us, fail_after;
  bool vmm;
  size_t granularity;
} host_opts_t;

static mp_status_t host_bad_value(const char *key, const char *val,
                                  size_t val_len, const char *expected) {
  char shown[MP__CLIP];
  return mp__fail(MP_EINVAL,
                  "bad device spec: host option %s='%s': expected %s", key,
                  mp__clip(val, val_len, shown, sizeof shown), expected);
}

static mp_status_t host_opt(void *ctx, const char *key, size_t key_len,
                            const char *val, size_t val_len) {
  host_opts_t *o = ctx;
  int k = 0;
  while (k < HOST_OPT_COUNT && !(strlen(host_opt_names[k]) == key_len &&
                                 memcmp(host_opt_names[k], key, key_len) == 0))
    k++;
  char shown[MP__CLIP];
  if (k == HOST_OPT_COUNT)
    return mp__fail(MP_EINVAL,
                    "bad device spec: unknown host option '%s' (known: "
                    "capacity, latency_us, stream_latency_us, fail_after, vmm, "
                    "granularity)",
                    mp__clip(key, key_len, shown, sizeof shown));
  const char *name = host_opt_names[k];
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  switch (k) {
  case HOST_OPT_CAPACITY:
    if (!mp__parse_size(val, val_len, &o->capacity) || o->capacity == 0)
      return host_bad_value(name, val, val_len, "a size above 0 (e.g. 16G)");
    break;
  case HOST_OPT_LATENCY:
  case HOST_OPT_STREAM_LATENCY: {
    uint64_t *us =
        k == HOST_OPT_LATENCY ? &o->latency_us : &o->stream_latency_us;
    if (!mp__parse_u64(val, val_len, us) || *us > HOST_MAX_LATENCY_US)
      return host_bad_value(name, val, val_len,
                            "microseconds from 0 to 10000000");
    break;
  }
  case HOST_OPT_FAIL_AFTER:
    if (!mp__parse_u64(val, val_len, &o->fail_after))
      return host_bad_value(name, val, val_len, "a count (0: never)");
    break;
  case HOST_OPT_VMM:
    if (!mp__parse_bool(val, val_len, &o->vmm))
      return host_bad_value(name, val, val_len,
                            "a boolean (1/0, true/false, yes/no, on/off)");
    break;
  case HOST_OPT_GRANULARITY:
    if (!mp__parse_size(val, val_len, &o->granularity) ||
        o->granularity < page || (o->granularity & (o->granularity - 1)) ||
        o->granularity > ((size_t)1 << 40))
      return host_bad_value(name, val, val_len,
                            "a power of two from the page size to 1T");
    break;
  }
  return MP_OK;
}

static void host_free_state(host_dev_t *h) {
  close(h->memfd);
  mp__ptrmap_destroy(&h->maps);
  mp__ptrmap_destroy(&h->streams);
  mp__ptrmap_destroy(&h->events);
  free(h->resv);
  free(h->allocs.e);
  free(h->pins.e);
  free(h->imports.e);
  pthread_cond_destroy(&h->ev_cv);
  pthread_mutex_destroy(&h->ev_lock);
  pthread_mutex_destroy(&h->busy_mu);
  pthread_cond_destroy(&h->dying_cv);
  pthread_mutex_destroy(&h->dying_mu);
  pthread_rwlock_destroy(&h->reg);
  pthread_mutex_destroy(&h->mem_lock);
  free(h);
}

static const host_opts_t host_opts_default = {
    .capacity = 16 * MP__GiB, .vmm = true, .granularity = 2 * MP__MiB};

/* The options of opts over the defaults, or mp__kv_each's refusal. */
static mp_status_t host_opts_read(const char *opts, host_opts_t *o) {
  *o = host_opts_default;
  return mp__kv_each("device spec", opts, host_opt, o);
}

/* o's options as numbers, in host_opt_names' order. */
static void host_opt_values(const host_opts_t *o, uint64_t v[HOST_OPT_COUNT]) {
  v[HOST_OPT_CAPACITY] = o->capacity;
  v[HOST_OPT_LATENCY] = o->latency_us;
  v[HOST_OPT_STREAM_LATENCY] = o->stream_latency_us;
  v[HOST_OPT_FAIL_AFTER] = o->fail_after;
  v[HOST_OPT_VMM] = o->vmm;
  v[HOST_OPT_GRANULARITY] = o->granularity;
}

mp_status_t mp__host_spec_canonical(const char *opts,
                                    char text[MP_DEVICE_SPEC_MAX]) {
  host_opts_t o;
  mp_status_t st = host_opts_read(opts, &o);
  if (st != MP_OK)
    return st;
  /* The granule means nothing without virtual memory (host_vm_*). */
  if (!o.vmm)
    o.granularity = host_opts_default.granularity;
  uint64_t v[HOST_OPT_COUNT], dv[HOST_OPT_COUNT];
  host_opt_values(&o, v);
  host_opt_values(&host_opts_default, dv);
  size_t n = (size_t)snprintf(text, MP_DEVICE_SPEC_MAX, "host");
  for (int k = 0; k < HOST_OPT_COUNT; k++)
    if (v[k] != dv[k])
      n += (size_t)snprintf(text + n, MP_DEVICE_SPEC_MAX - n, "%c%s=%" PRIu64,
                            n == 4 ? ':' : ',', host_opt_names[k], v[k]);
  return MP_OK;
}

static mp_status_t host_open(mp_device_t *dev, const char *opts) {
  host_opts_t o;
  mp_status_t st = host_opts_read(opts, &o);
  if (st != MP_OK)
    return st;
  host_dev_t *h = mp__host_calloc(1, sizeof *h);
  if (h == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory opening the host device");
  h->capacity = o.capacity;
  h->latency_us = o.latency_us;
  h->stream_latency_us = o.stream_latency_us;
  h->fail_after = o.fail_after;
  h->vmm = o.vmm;
  h->granularity = o.granularity;
  (void)pthread_once(&host_atfork_once, host_atfork);
  h->owner = getpid();
  h->memfd = memfd_create(HOST_MEMFD_NAME, MFD_CLOEXEC);
  if (h->memfd < 0) {
    int err = errno;
    free(h);
    return mp__fail(MP_ENOMEM, "host device: memfd_create failed: %s",
                    strerror(err));
  }
  mp__ptrmap_init(&h->maps, sizeof(host_entry_t));
  mp__ptrmap_init(&h->streams, sizeof(host_entry_t));
  mp__ptrmap_init(&h->events, sizeof(host_entry_t));
  pthread_mutex_init(&h->mem_lock, NULL);
  pthread_rwlock_init(&h->reg, NULL);
  pthread_mutex_init(&h->ev_lock, NULL);
  pthread_cond_init(&h->ev_cv, NULL);
  pthread_mutex_init(&h->busy_mu, NULL);
  pthread_mutex_init(&h->dying_mu, NULL);
  pthread_cond_init(&h->dying_cv, NULL);
  st = host_stream_start(h, &h->null_stream);
  if (st != MP_OK) {
    host_free_state(h);
    return st;
  }
  dev->impl = h;
  snprintf(dev->name, sizeof dev->name, "host");
  host_devs_link(h, true);
  return MP_OK;
}

/* Nothing here is refused: MP_OK. */
static mp_status_t host_close(mp_device_t *dev) {
  host_dev_t *h = host_of(dev);
  host_devs_link(h, false); /* no copy or memset elsewhere looks at it */
  /* A forked child closing its parent's device: the stream threads did not
   * come along (stopping one joins it: it would wait for ever), and a lock
   * one of them held at the fork stays held here. Nothing is stopped,
   * taken or freed: what h holds goes with the process, whose mappings are
   * the parent's pages, left alone (host_inherited). */
  if (host_inherited(h)) {
    close(h->memfd);
    dev->impl = NULL;
    return MP_OK;
  }
  /* Stopping one stream never waits on a stream stopped before it: a wait
   * only refers to records queued earlier, and the streams that hold them
   * keep running until their own turn comes. */
  for (size_t i = 0; i < h->streams.cap; i++) {
    host_entry_t *e = mp__ptrmap_at(&h->streams, i);
    if (e != NULL)
      host_stream_stop((host_stream_t *)e->key);
  }
  host_stream_stop(h->null_stream);
  /* Orphaned workers (streams destroyed with work queued) may still run
   * it: what they touch (markers, memory, this device) stays until they
   * are done. */
  host_streams_reap(h, true);
  for (size_t i = 0; i < h->events.cap; i++) {
    host_entry_t *e = mp__ptrmap_at(&h->events, i);
    if (e != NULL) {
      host_event_t *ev = (host_event_t *)e->key;
      host_marker_unref(h, ev->last);
      free(ev);
    }
  }
  for (size_t i = 0; i < h->allocs.n; i++)
    munmap((void *)h->allocs.e[i].key, h->allocs.e[i].bytes);
  for (size_t i = 0; i < h->pins.n; i++)
    munmap((void *)h->pins.e[i].key, h->pins.e[i].bytes);
  for (size_t i = 0; i < h->nresv; i++) {
    munmap((void *)h->resv[i].base, h->resv[i].bytes);
    free(h->resv[i].bits);
  }
  host_markers_free(h->dead_markers); /* every worker has stopped */
  host_free_state(h);
  dev->impl = NULL;
  return MP_OK;
}

const mp__backend_t mp__host_backend = {
    .name = "host",
    .open = host_open,
    .close = host_close,
    .mem_info = host_mem_info,
    .alloc = host_alloc,
    .free = host_free,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .free_waits = true,
    .synchronize = host_synchronize,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .caller_check = host_caller_check,
    .stream_synchronize = host_stream_synchronize,
    .stream_query = host_stream_query,
    .stream_kind = host_stream_kind,
    .stream_owned = host_stream_owned,
    .launch_host = host_launch_host,
    .memcpy_async = host_memcpy_async,
    .memset_async = host_memset_async,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_synchronize = host_event_synchronize,
    .stream_wait_event = host_stream_wait_event,
    .vm_granularity = host_vm_granularity,
    .alloc_align = host_alloc_align,
    .vm_reserve = host_vm_reserve,
    .vm_release = host_vm_release,
    .vm_map = host_vm_map,
    .vm_unmap = host_vm_unmap,
    .ipc_export = host_ipc_export,
    .ipc_open = host_ipc_open,
    .ipc_close = host_ipc_close,
};
