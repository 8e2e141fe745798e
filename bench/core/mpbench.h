/* mpbench.h - the pieces of mpbench, the fragmentation benchmark, shared by
 * its command line (bench/mpbench.c) and its tests (tests/bench/).
 *
 * A workload, whether parsed from an RMM-style trace or generated, is one
 * array of events over "slots": an allocation takes the lowest free slot, its
 * free names that slot, so a replay needs no address map and the same events
 * drive every allocator. Results are per (workload, allocator) pair; reports
 * and plots are written from an array of them. Nothing here calls exit():
 * every failure is an mp_status_t with mp_last_error() saying what and where.
 */
#ifndef MPBENCH_H
#define MPBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <mempool/mempool.h>

/* ---- workload.c: event arrays and the built-in workloads --------------- */

/* MPB_GRAPH events: slot says which (stream: the capturing stream).
 * MPB_PAUSE / MPB_RESUME: the event's tenant pauses (keeping its content)
 * or resumes; only allocators with mp_pool_pause can replay them. */
enum {
  MPB_ALLOC = 0,
  MPB_FREE = 1,
  MPB_GRAPH = 2,
  MPB_PAUSE = 3,
  MPB_RESUME = 4
};
enum { MPB_CAPTURE_BEGIN = 0, MPB_CAPTURE_END = 1, MPB_GRAPH_RELEASE = 2 };
enum { MPB_MAX_TENANTS = 2 };

typedef struct mpb_event {
  size_t size;     /* bytes asked for (the allocation's size, on a free too) */
  uint32_t slot;   /* which live allocation */
  uint16_t stream; /* index into the workload's streams (0: default) */
  uint8_t op;      /* MPB_ALLOC, MPB_FREE, MPB_GRAPH, MPB_PAUSE, MPB_RESUME */
  uint8_t tenant;  /* which of the replay's allocators (0: the first); a
                      free goes to the allocator its slot came from */
} mpb_event_t;

/* The longest workload name kept (a trace's is its path where its file
 * name is not enough): mpbench refuses a longer one rather than cut it. */
enum { MPB_MAX_NAME = 1023 };

typedef struct mpb_workload {
  char name[MPB_MAX_NAME + 1];
  mpb_event_t *ev;
  size_t n, cap;
  uint32_t nslots;   /* slots ever used: most allocations live at once */
  uint32_t nstreams; /* distinct streams; 1 when only the default is used */
  bool has_graph;    /* has MPB_GRAPH events */
  uint8_t ntenants;  /* allocators the replay makes on one device (1, or 2
                        for colocate); tenant: the one events go to now */
  uint8_t tenant;
  /* Slot bookkeeping while events are appended. */
  uint32_t *free_slots;
  size_t nfree, free_cap;
  size_t *slot_size;
  size_t live;       /* bytes allocated and not freed: they must fit a size_t */
  size_t max_events; /* events it may have (0: no bound): a built-in's */
  /* What a trace had that could not be replayed as is (see trace.c). */
  uint64_t unknown_frees;    /* frees of pointers the trace never allocated */
  uint64_t failure_rows;     /* "allocate failure" rows, skipped */
  uint64_t implicit_frees;   /* allocations of a still-live address */
  uint64_t zero_size_allocs; /* replayed as NULL without calling anything */
  /* Double frees: a second free of a block, its address not allocated
   * again between; skipped. double_free_at: where the first was ("line L
   * (freed by line M)", a snapshot's entries), "" where there was none. */
  uint64_t double_frees;
  char double_free_at[192];
} mpb_workload_t;

void mpb_workload_init(mpb_workload_t *w, const char *name);
void mpb_workload_free(mpb_workload_t *w);
/* The most distinct non-default streams a trace may name. Each is replayed
 * on a device stream of its own, which on the host device is a worker
 * thread: on this 2-core machine a replay of one allocation and one free
 * per stream took 5.9 s with 5 000 streams and 50 s with 20 000 (the
 * kernel's futex wake-ups over that many sleeping threads), and 65 000 did
 * not finish in 120 s. Real traces name a few (the llama trace 10). */
enum { MPB_MAX_TRACE_STREAMS = 4096 };

/* Appends an allocation on stream index `stream`; its slot in *slot. */
mp_status_t mpb_workload_alloc(mpb_workload_t *w, size_t size, uint16_t stream,
                               uint32_t *slot);
mp_status_t mpb_workload_free_slot(mpb_workload_t *w, uint32_t slot);
/* Appends a graph event (MPB_CAPTURE_BEGIN / _END on stream, or
 * MPB_GRAPH_RELEASE: the captured graphs are destroyed). */
mp_status_t mpb_workload_graph(mpb_workload_t *w, unsigned what,
                               uint16_t stream);
/* Frees every slot still live, lowest first, so a workload ends empty. */
mp_status_t mpb_workload_drain(mpb_workload_t *w);

/* Appends a pause (MPB_PAUSE) or resume (MPB_RESUME) of tenant. */
mp_status_t mpb_workload_turn(mpb_workload_t *w, uint8_t op, uint8_t tenant);

/* The most events a built-in workload may make: 16 times the largest
 * default one's (llm, about 257 000; 100 MB of events), as much as a
 * replay runs in minutes on every allocator.
 * Parameters each in range may together ask for far more (llm at its
 * maximums: about 10^13, hours to generate and more memory than a host
 * has). */
#define MPB_MAX_GENERATED_EVENTS ((size_t)1 << 22)

/* spec: "NAME" or "NAME:key=val,...", NAME one of mpb_builtin_names. A
 * spec whose parameters make more than MPB_MAX_GENERATED_EVENTS events is
 * MP_EINVAL, said once the generator reaches the bound (nothing kept). */
mp_status_t mpb_workload_generate(const char *spec, mpb_workload_t *out);
/* Whether spec names a built-in workload with known parameters, each
 * well formed and in its range, without generating it (MP_EINVAL naming
 * what is wrong). Constraints between parameters (random's max_size above
 * max_live, the events they make together) are the generator's to
 * refuse. */
mp_status_t mpb_workload_check(const char *spec);
/* NULL-terminated list of built-in workload names, and a help text. */
extern const char *const mpb_builtin_names[];
void mpb_workload_help(FILE *out);

/* ---- trace.c: RMM-style CSV traces (and snapshots, by content) ---------- */

/* Parses path into out (named name). A malformed line is MP_EINVAL and
 * mp_last_error() names the file and line; a missing file is MP_EINVAL too.
 * A snapshot pickle read from a file that is not a regular one (a pipe, a
 * device), which may never end, is refused once it is longer than
 * MPB_MAX_PIPED_SNAPSHOT bytes. out is left empty on failure. */
#define MPB_MAX_PIPED_SNAPSHOT ((size_t)256 << 20)
mp_status_t mpb_trace_load(const char *path, const char *name,
                           mpb_workload_t *out);
/* The same from a buffer; what names it in messages. */
mp_status_t mpb_trace_parse(const char *text, size_t len, const char *what,
                            const char *name, mpb_workload_t *out);
/* s[0, len) as a message may quote it: at most cap - 1 bytes, each one a
 * terminal could act on (a control, DEL, any non-ASCII byte) shown as '?';
 * written to buf, which is returned. */
const char *mpb_printable(const char *s, size_t len, char *buf, size_t cap);
/* A path or a name as a message quotes it (mp__clip: each control byte,
 * DEL, C1 control and byte of ill-formed UTF-8 '?', a long one shortened
 * around "..."), so that it cannot break the message's line or send the
 * terminal an escape sequence, and leaves room (mp_last_error holds 512
 * bytes) for what the message says of it. buf: MPB_SHOWN bytes; returned. */
#define MPB_SHOWN 96
const char *mpb_shown(const char *s, char *buf);
/* The traces folder when none is named: $MEMPOOL_TRACES, else the build's
 * MEMPOOL_TRACES_DIR, else shared/traces next to or above the executable's
 * folders; written to buf. NULL when there is none. */
const char *mpb_traces_dir(char *buf, size_t len);
/* The *.csv files of dir and of its direct subfolders, as paths relative to
 * dir ("pytorch/x.csv"), sorted by name: *out holds *n of them, freed with
 * mpb_traces_free. A folder that cannot be opened: MP_EINVAL. One file
 * reached by several paths (a link to a trace, a linked subfolder, a hard
 * link) is listed once, by the path through the fewest links (the first in
 * name order among those); unless same is NULL, *same holds *nsame lines
 * "REL is KEPT" for the paths left out, freed with mpb_traces_free. */
mp_status_t mpb_traces_scan(const char *dir, char ***out, size_t *n,
                            char ***same, size_t *nsame);
void mpb_traces_free(char **v, size_t n);

/* ---- pickle.c: PyTorch memory snapshots --------------------------------- */

/* Whether buf starts like a pickle (the PROTO opcode 0x80 at byte 0):
 * mpb_trace_parse and mpb_trace_load read such input with
 * mpb_snapshot_parse, whatever the file is called. */
bool mpb_snapshot_detect(const void *buf, size_t len);
/* Reads the pickled dict of torch.cuda.memory._snapshot() (as
 * _dump_snapshot writes it) and replays the first device trace that has an
 * allocation: "alloc" allocates, "free_completed" frees (see pickle.c for
 * the rules). A malformed pickle is MP_EINVAL and mp_last_error() names the
 * byte offset; out is left empty on failure. */
mp_status_t mpb_snapshot_parse(const void *buf, size_t len, const char *what,
                               const char *name, mpb_workload_t *out);

/* ---- allocators.c: every allocator behind one small table -------------- */

typedef struct mpb_allocator mpb_allocator_t;

typedef struct mpb_sample {
  size_t reserved;       /* device memory held now */
  size_t free_bytes;     /* reserved but not handed out (0 if unknown) */
  size_t largest_free;   /* biggest free block (0 if unknown) */
  uint64_t device_calls; /* device allocations + frees so far */
  bool no_device_calls;  /* the allocator cannot tell (cuda-async) */
  bool has_free_info;    /* free_bytes/largest_free are known */
} mpb_sample_t;

/* Whether name is an allocator mpbench knows (syntax only). */
mp_status_t mpb_allocator_check_name(const char *name);
/* Whether it can run on dev; if not, why (e.g. "needs a GPU"). */
bool mpb_allocator_available(const char *name, mp_device_t *dev, char *why,
                             size_t why_len);
/* Makes the mempool allocator called name on dev; tests and embedders pass
 * their own (for instance one wrapped with mp_allocator_wrap). NULL:
 * mp_allocator_create. */
typedef mp_status_t (*mpb_make_fn)(mp_device_t *dev, const char *name,
                                   mp_allocator_t **out);
mp_status_t mpb_allocator_open(const char *name, mp_device_t *dev,
                               mpb_make_fn make, mpb_allocator_t **out);
mp_status_t mpb_allocator_alloc(mpb_allocator_t *a, size_t size, mp_stream_t s,
                                void **out);
mp_status_t mpb_allocator_free(mpb_allocator_t *a, void *ptr);
/* A graph event (MPB_CAPTURE_BEGIN...) on stream s: mempool pools give the
 * capture a graph pool (mp_pool_graph_*); "pool-nograph" serves a capture
 * from the device directly and keeps it until the release; the others
 * ignore it. */
mp_status_t mpb_allocator_graph(mpb_allocator_t *a, unsigned what,
                                mp_stream_t s);
/* Bytes the captured graphs hold now (graph pools' reserved bytes, or the
 * device memory "pool-nograph" keeps for them). */
size_t mpb_allocator_graph_bytes(mpb_allocator_t *a);
void mpb_allocator_sample(mpb_allocator_t *a, mpb_sample_t *out);
/* The mempool allocator under it, or NULL (jemalloc, ...). */
mp_allocator_t *mpb_allocator_mempool(mpb_allocator_t *a);
/* Whether name serves page-locked host memory (host-pool, host-pow2,
 * host-direct): the host device's capacity= does not bound it. */
bool mpb_allocator_is_pinned(const char *name);
void mpb_allocator_close(mpb_allocator_t *a);
extern const char *const mpb_default_allocators[];
void mpb_allocator_help(FILE *out);

/* ---- cuda_async.c: cudaMallocAsync's pool (the "cuda-async" allocator) -- */

typedef struct mpb_cuasync mpb_cuasync_t;
/* MP_ENOTSUP where dev is not a CUDA device or the driver lacks the calls. */
mp_status_t mpb_cuasync_open(mp_device_t *dev, mpb_cuasync_t **out);
mp_status_t mpb_cuasync_alloc(mpb_cuasync_t *c, size_t size, mp_stream_t s,
                              void **out);
mp_status_t mpb_cuasync_free(mpb_cuasync_t *c, void *ptr);
size_t mpb_cuasync_reserved(mpb_cuasync_t *c);
void mpb_cuasync_close(mpb_cuasync_t *c);

/* ---- host_pow2.c: PyTorch-like power-of-two pinned cache ("host-pow2") - */

typedef struct mpb_pow2 mpb_pow2_t;
mp_status_t mpb_pow2_open(mp_device_t *dev, mpb_pow2_t **out);
mp_status_t mpb_pow2_alloc(mpb_pow2_t *p, size_t size, void **out);
mp_status_t mpb_pow2_free(mpb_pow2_t *p, void *ptr);
void mpb_pow2_sample(mpb_pow2_t *p, size_t *reserved, uint64_t *calls);
void mpb_pow2_close(mpb_pow2_t *p);

/* ---- pause.c: pause and resume of a pool, timed -------------------------
 * (mpbench's colocate workload and bench_pause_resume measure the same
 * way). bytes: what went back to the device (reserved before the pause) or
 * was mapped again (reserved after the resume). */
mp_status_t mpb_pool_pause_timed(mp_pool_t *pool, unsigned flags, double *ms,
                                 size_t *bytes);
mp_status_t mpb_pool_resume_timed(mp_pool_t *pool, double *ms, size_t *bytes);
/* Milliseconds per GiB moved; 0 when nothing moved. */
double mpb_ms_per_gib(double ms, size_t bytes);
/* The median of v[0..n) (sorts v); 0 when n is 0. */
double mpb_median(double *v, size_t n);

/* ---- replay.c: one workload through one allocator, and its figures ----- */

enum { MPB_SERIES_POINTS = 800 };

/* The longest allocator spec a result holds (mpbench refuses a longer
 * one: cut, two specs of a sweep would get rows of one name). */
enum { MPB_MAX_ALLOCATOR = 255 };

typedef struct mpb_result {
  char workload[MPB_MAX_NAME + 1];
  char allocator[MPB_MAX_ALLOCATOR + 1];
  char device[128];
  bool completed;  /* every allocation succeeded */
  char error[256]; /* why not, when !completed */
  uint64_t events;
  size_t peak_live;     /* bytes requested by the workload, at most at once */
  size_t peak_reserved; /* device memory held, at most at once */
  size_t graph_pinned;  /* most bytes captured graphs held (graph events) */
  double ratio;         /* peak_reserved / peak_live */
  double utilization;   /* peak_live / peak_reserved */
  double avg_waste;     /* mean over events of (reserved - live) / reserved */
  double ext_frag;      /* 1 - largest free / free, at peak live */
  bool has_ext_frag;
  uint64_t device_calls;
  bool has_device_calls; /* false: the allocator cannot tell */
  double ns_p50, ns_p99; /* per allocate or free call, less the clock's cost */
  double timer_overhead_ns; /* that cost: median of back-to-back clock reads */
  /* Smallest device capacity at which the workload completed; 0: unknown. */
  size_t min_capacity;
  int capacity_state; /* MPB_CAP_* */
  unsigned capacity_probes;
  double seconds; /* wall time of this pair, capacity search included */
  /* Workloads with MPB_PAUSE/MPB_RESUME (colocate): how many pauses ran,
   * and the median ms per GiB of a pause (content kept) and a resume. Live
   * bytes of a paused tenant do not count as live (they are not on the
   * device). */
  unsigned pauses;
  double pause_ms_per_gib, resume_ms_per_gib;
  /* What the workload's trace had that its replay skipped or changed
   * (mpb_workload_t's counts, copied): results.md notes them under the
   * table, results.json has them. */
  uint64_t unknown_frees, failure_rows, implicit_frees, zero_size_allocs;
  /* Bytes over time, MPB_SERIES_POINTS buckets of events (the maximum in
   * each), for the plots. */
  size_t npoints;
  uint64_t point_event[MPB_SERIES_POINTS];
  size_t point_live[MPB_SERIES_POINTS];
  size_t point_reserved[MPB_SERIES_POINTS];
  /* The workload's double frees and where the first was (mpb_workload_t's,
   * copied). */
  uint64_t double_frees;
  char double_free_at[192];
} mpb_result_t;

enum {
  MPB_CAP_NONE = 0, /* not searched (--no-capacity, or failed run) */
  MPB_CAP_EXACT,    /* to within the search's granularity */
  MPB_CAP_BOUND,    /* the time budget ran out: an upper bound */
  MPB_CAP_NA        /* the device has no capacity setting (not host) */
};

typedef struct mpb_replay_opts {
  const char *device_spec; /* NULL: mp_device_open(NULL) */
  mpb_make_fn make;        /* NULL: mp_allocator_create for mempool names */
  bool capacity_search;
  double capacity_budget_s; /* per pair; <= 0: no limit */
  /* mpb_now_ns() after which every search stops at its first probe (the
   * whole run's budget); 0: none. */
  uint64_t capacity_deadline_ns;
  /* Called in the measured run (not the capacity search), outside the
   * timed calls: after each allocation that succeeded and before each
   * free, with the event's index and the block's pointer. NULL: none. */
  void (*on_block)(void *ctx, size_t event, const mpb_event_t *e, void *ptr);
  void *on_block_ctx;
  /* > 0, on a workload with several streams (measured run only): after
   * each allocation and free, work of this many microseconds (a host
   * function that sleeps) on the event's stream, and no catching up after
   * frees, so that the streams really run behind the host. 0: the device
   * catches up after each free (the default). */
  unsigned stream_work_us;
} mpb_replay_opts_t;

/* Replays w through allocator on a fresh device and fills r. A workload
 * that runs out of memory is a result (completed = false), not an error;
 * errors are a device that cannot be opened or an allocator that cannot be
 * made. */
mp_status_t mpb_replay(const mpb_workload_t *w, const char *allocator,
                       const mpb_replay_opts_t *opts, mpb_result_t *r);
/* Whether w completes through allocator on a fresh device opened from spec. */
mp_status_t mpb_replay_fits(const mpb_workload_t *w, const char *allocator,
                            const char *spec, mpb_make_fn make, bool *fits);
/* Smallest capacity within [lo, hi] (hi known or assumed to fit) at which
 * fits() holds, to within gran, probing on fresh devices made from
 * base_spec plus ",capacity=N". Gives up after budget_s (<= 0: never) with
 * the best upper bound and *exact = false. */
mp_status_t mpb_capacity_search(const mpb_workload_t *w, const char *allocator,
                                mpb_make_fn make, const char *base_spec,
                                size_t lo, size_t hi, size_t gran,
                                double budget_s, size_t *out, bool *exact,
                                unsigned *probes);
/* base_spec (NULL or "": "host") less any capacity option of its own, with
 * "capacity=N" as its last option, into *out (malloc'd, whatever the spec's
 * length; the caller frees it). A malformed option list is MP_EINVAL, as
 * the device would refuse it. */
mp_status_t mpb_spec_with_capacity(const char *base_spec, size_t capacity,
                                   char **out);

/* Most bytes the workload has on the device at once, after any event: the
 * peak live bytes of every mpb_replay result (sizes as asked for; a paused
 * tenant's blocks are not on the device). */
size_t mpb_workload_peak_live(const mpb_workload_t *w);

/* ---- offline.c: the offline placement and the granule bound ------------ */

/* The heuristic orders offline.c tries, in mpb_offline_t.high_by order. */
enum { MPB_OFFLINE_ORDERS = 5 };
extern const char *const mpb_offline_orders[MPB_OFFLINE_ORDERS];

typedef struct mpb_offline {
  char workload[MPB_MAX_NAME + 1];
  size_t align;     /* every size rounded up to it, as the pool does */
  size_t granule;   /* the device's mapping unit */
  size_t peak_live; /* mpb_workload_peak_live */
  size_t items;     /* lifetimes placed (an allocation cut by pauses: more) */
  size_t high;      /* highest end offset of the best placement */
  size_t high_by[MPB_OFFLINE_ORDERS]; /* of each order's placement (the
                                         jittered rounds': their best; 0
                                         when none ran) */
  unsigned order;                     /* the one that gave high */
  unsigned rounds; /* jittered rounds run (0 when the fixed orders already
                      reached the granule bound) */
  double bound;    /* ceil(peak_live / granule) granules / peak live: the best
                      an allocator that maps whole granules can do */
  double ratio;    /* ceil(high / granule) granules / peak live */
  double raw;      /* high / peak live */
  /* The most granules live blocks touch at once, in bytes, over the
   * placements of every order (the lowest, from mapped_order's): what an
   * allocator with virtual memory maps if it unmaps each granule as soon as
   * nothing lives in it. At most ceil(high / granule) granules. */
  size_t mapped;
  unsigned mapped_order;
  double mapped_ratio; /* mapped / peak live */
} mpb_offline_t;

/* Places every allocation of w at a fixed offset of one flat range, knowing
 * every lifetime in advance, so that no two on the device at once overlap
 * (offline.c: greedy, the best of several orders), and fills out. Streams and
 * graph events are ignored (the caught-up case). offset: NULL, or room for
 * noffset offsets, written for the first noffset lifetimes in the order
 * they begin (without pauses and zero-byte allocations: the allocations in
 * event order). align: a power of two. */
mp_status_t mpb_offline_place(const mpb_workload_t *w, size_t align,
                              size_t granule, size_t *offset, size_t noffset,
                              mpb_offline_t *out);

/* The most granules an allocator's live blocks touch at once, from a
 * replay's blocks (mpb_replay_opts_t.on_block = mpb_touched_on_block,
 * on_block_ctx = the tracker): what that placement would hold if its
 * memory were granule-sized physical allocations (cuMemCreate), each
 * unmapped where it lies empty and mapped again wherever a request needs
 * it, so that free memory need not be contiguous to serve a request
 * (GMLake's "stitching"; whole allocations, as cuMemMap's offset "currently
 * must be zero": cuda.h, CUDA 13.0). Blocks count with the bytes asked
 * for. Not for workloads that pause (a paused tenant's blocks are off the
 * device but still count here). */
typedef struct mpb_touched {
  size_t granule;
  struct mp__ptrmap *map; /* granule number + 1 -> live blocks in it (the
                             first and last granules of blocks only) */
  size_t now, peak;       /* granules touched now, and at most */
  bool failed;            /* out of host memory: no figure */
} mpb_touched_t;

void mpb_touched_init(mpb_touched_t *t, size_t granule);
void mpb_touched_on_block(void *ctx, size_t event, const mpb_event_t *e,
                          void *ptr);
/* peak * granule; 0 when the tracker ran out of host memory. */
size_t mpb_touched_peak_bytes(const mpb_touched_t *t);
void mpb_touched_free(mpb_touched_t *t);

/* ---- report.c: table, JSON, CSV, plots --------------------------------- */

/* The table, then its notes: graph memory, pauses, what each trace had
 * that its replay skipped or changed, the runs that failed. MP_EINVAL
 * where a write to out failed (ferror), as mpb_report_json's. */
mp_status_t mpb_report_markdown(FILE *out, const mpb_result_t *r, size_t n);
/* The note of one trace (name) under a table, after a "Trace notes:"
 * heading when *noted is false (set then); nothing where every count is
 * 0. */
void mpb_report_trace_note(FILE *out, const char *name, uint64_t unknown_frees,
                           uint64_t failure_rows, uint64_t implicit_frees,
                           uint64_t zero_size_allocs, bool *noted);
/* Its double frees (count, where the first was: mpb_workload_t's), a note
 * of their own under the same heading; nothing where count is 0. */
void mpb_report_double_free_note(FILE *out, const char *name, uint64_t count,
                                 const char *at, bool *noted);
mp_status_t mpb_report_json(FILE *out, const mpb_result_t *r, size_t n);
/* `mpbench bound`'s table: per workload o[i], the granule bound, the
 * offline placement's figures, the ratio of each of nalloc allocators
 * (r[i * nalloc + a]) and the most bytes of granules its live blocks
 * touched (touched[i * nalloc + a], mpb_touched_t; 0 or touched NULL: not
 * known, shown as -), and whether 1.05 is within reach. */
void mpb_report_bound(FILE *out, const mpb_offline_t *o, size_t n,
                      const mpb_result_t *r, const size_t *touched,
                      size_t nalloc);

mp_status_t mpb_report_csv(FILE *out, const mpb_result_t *r, size_t n);
/* Writes results.json, results.csv, results.md, report.html and (with
 * gnuplot) PNG plots into dir, each through a temporary file renamed at the
 * end, so a failure leaves nothing half-written. A file in dir that is a
 * symbolic link is written through: its target is replaced (through a
 * temporary beside it) and the link kept; a link to nothing or to a folder
 * is an error naming it, found before anything is moved. The names written
 * go to dir/.run-files; once every file is in place, each regular file
 * (not a link) that the last run's list names, that is one of mpbench's
 * names (results.*, report.html, ratios.png, bytes_*.png) and that this run
 * did not write is removed: dir holds this run's results only. *plotted:
 * whether plots were made; why_not says why not. */
/* Whether dir can be made and written into, without creating anything:
 * checked before a run so that a bad --out fails in seconds, not after it. */
mp_status_t mpb_report_check_dir(const char *dir);
/* After mpb_report_check_dir, once the workloads are known (w[0..n)):
 * the plots a run with plots would write into dir (ratios.png, each
 * workload's bytes_NAME.png) can be put there, as mpb_report_check_dir
 * checks the other files: a folder or a link to nothing there, or a link
 * into a folder nothing can be made in, fails now, not after the run.
 * Without a gnuplot (no plot will be written) nothing is in the way. */
mp_status_t mpb_report_check_plots(const char *dir, const mpb_workload_t *w,
                                   size_t n);
mp_status_t mpb_report_write(const char *dir, const mpb_result_t *r, size_t n,
                             bool want_plots, bool *plotted, char *why_not,
                             size_t why_len);
/* A JSON string (quotes, backslashes, control characters and '<' escaped,
 * so that it may sit inside an HTML script element). */
void mpb_json_str(FILE *out, const char *s);

/* ---- html.c: report.html, a page that draws itself -------------------- */

/* One allocator's blocks over one workload: where each block lay (address)
 * from its allocation to its free (event indices), recorded through
 * mpb_replay_opts_t.on_block (ctx: the map). */
typedef struct mpb_block {
  uint64_t addr, size;
  uint64_t t0, t1; /* event of the allocation and of the free */
} mpb_block_t;

typedef struct mpb_blockmap {
  char workload[MPB_MAX_NAME + 1];
  char allocator[MPB_MAX_ALLOCATOR + 1];
  mpb_block_t *b;
  size_t n, cap;
  size_t *open; /* per slot: index in b + 1 of its live block; 0 none */
  uint32_t nslots;
  uint64_t events;    /* the workload's events, or those its replay ran
                         (mpb_blockmap_end): open blocks end there */
  bool out_of_memory; /* a block could not be recorded */
} mpb_blockmap_t;

/* A map for w's replay through allocator; false when out of memory. */
bool mpb_blockmap_init(mpb_blockmap_t *m, const mpb_workload_t *w,
                       const char *allocator);
void mpb_blockmap_on_block(void *ctx, size_t event, const mpb_event_t *e,
                           void *ptr);
/* After the replay: events, the events it ran (mpb_result_t.events; fewer
 * than the workload's when it failed), is where the map and the blocks
 * still open end. */
void mpb_blockmap_end(mpb_blockmap_t *m, uint64_t events);
void mpb_blockmap_free(mpb_blockmap_t *m);
/* The most blocks of one map written into report.html: beyond it the
 * largest are kept (the page says how many were left out). */
enum { MPB_HTML_MAX_BLOCKS = 6000 };
/* A self-contained page (no network): the results table, the reserved
 * and live curves of every run (zoomable) and the block maps given. */
mp_status_t mpb_report_html(FILE *out, const mpb_result_t *r, size_t n,
                            const mpb_blockmap_t *maps, size_t nmaps);
/* mpb_report_write, with block maps for report.html. */
mp_status_t mpb_report_write_maps(const char *dir, const mpb_result_t *r,
                                  size_t n, const mpb_blockmap_t *maps,
                                  size_t nmaps, bool want_plots, bool *plotted,
                                  char *why_not, size_t why_len);

/* ---- cli.c: the command line ------------------------------------------- */

/* mpbench's main: returns the process exit status. */
int mpb_main(int argc, char **argv);

/* ---- util (workload.c, replay.c) ------------------------------------------
 */
uint64_t mpb_now_ns(void);
/* Makes room for n + 1 elements of elem bytes in *arr (capacity *cap,
 * doubled as needed); false, with *arr unchanged, when out of memory. */
bool mpb_grow(void *arr, size_t *cap, size_t n, size_t elem);

#endif /* MPBENCH_H */
