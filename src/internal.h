/* internal.h - declarations shared between mempool's source files.
 *
 * Never installed. Cross-file internals carry the mp__ prefix and are grouped
 * here by the file that defines them. Symbols are hidden from the shared
 * library unless declared MP_API in a public header. */
#ifndef MEMPOOL_INTERNAL_H
#define MEMPOOL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mempool/mempool.h>

/* MP__HOT: a function of the free+alloc path, inlined into every caller
 * that sees its body (the whole library, in the unity build): its own
 * frame would cost more than its work. Given on the definition only (the
 * header's declaration stays plain, so the definition is an external one
 * and callers elsewhere call it). MP__COLD: a rare path kept out of line,
 * so that its registers and stack do not weigh on the hot caller. */
#if defined(__GNUC__)
#define MP__LIKELY(x)    __builtin_expect(!!(x), 1)
#define MP__UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define MP__PRINTF(f, a) __attribute__((format(printf, f, a)))
#if defined(__clang__)
/* clang inlines always_inline without the keyword, and with it warns of
 * static helpers called from an inline function with external linkage
 * (-Wstatic-in-inline); GCC wants the keyword (-Wattributes). */
#define MP__HOT __attribute__((always_inline))
#else
#define MP__HOT __attribute__((always_inline)) inline
#endif
#define MP__COLD __attribute__((noinline, cold))
#else
#define MP__LIKELY(x)   (x)
#define MP__UNLIKELY(x) (x)
#define MP__PRINTF(f, a)
#define MP__HOT inline
#define MP__COLD
#endif

/* Internal invariants (TLSF's tlsf_assert, mimalloc's mi_assert_internal):
 * checked when built with MP_DEBUG (CMAKE_BUILD_TYPE=Debug, or
 * -DMEMPOOL_ASSERT=ON), compiled out otherwise. A failed check is a bug in
 * mempool, never bad input: bad input gets a status and an error message.
 * The condition is not evaluated in other builds, so it must not have side
 * effects. */
#if defined(MP_DEBUG) && MP_DEBUG
#define MP__ASSERT(c)                                                          \
  (MP__LIKELY(c) ? (void)0 : mp__assert_fail(#c, __FILE__, __LINE__, __func__))
#else
#define MP__ASSERT(c) ((void)sizeof(!(c)))
#endif

#define MP__KiB ((size_t)1 << 10)
#define MP__MiB ((size_t)1 << 20)
#define MP__GiB ((size_t)1 << 30)

/* ---- status.c ---------------------------------------------------------- */

/* The bytes mp_last_error() holds (its terminating NUL included): a copy of
 * a message kept across another call is this size, so nothing is cut. */
#define MP__ERROR_MAX 512

/* Records a one-line message for mp_last_error() in this thread and returns
 * st, so that failing paths read `return mp__fail(MP_EINVAL, "...", ...);`. */
mp_status_t mp__fail(mp_status_t st, const char *fmt, ...) MP__PRINTF(2, 3);
/* mp__fail for a driver call that returned code (a CUresult): the status it
 * maps to, with code kept for mp_last_driver_error(). */
mp_status_t mp__fail_driver(int code, mp_status_t st, const char *fmt, ...)
    MP__PRINTF(3, 4);
/* The status the last mp__fail on this thread gave (MP_OK: none yet). */
mp_status_t mp__last_failure(void);
/* The number of the thread's last failure (mp__fail, mp__error_restore),
 * counting from 1: unchanged, no failure was recorded since. */
uint64_t mp__error_serial(void);
/* The thread's last error, message and status, kept aside and put back
 * whole: a failure a call recovers from (pool.c: a device without virtual
 * memory) leaves mp_last_error() and mp_last_status() as they were. */
typedef struct mp__error_saved {
  mp_status_t st;
  int cu;
  char msg[MP__ERROR_MAX];
} mp__error_saved_t;
void mp__error_save(mp__error_saved_t *out);
void mp__error_restore(const mp__error_saved_t *saved);
/* The caller's last error kept across work that may record a failure it
 * then ignores (a trim's retries of what an earlier refusal kept): a call
 * that succeeds leaves the caller's last error as it was (status.h).
 * mp__error_keep before the work; mp__error_give_back after a success,
 * which puts it back only where a failure was recorded since. */
typedef struct mp__error_kept {
  mp__error_saved_t saved;
  uint64_t serial;
} mp__error_kept_t;
void mp__error_keep(mp__error_kept_t *k);
void mp__error_give_back(const mp__error_kept_t *k);
/* Input quoted in an error message (an option value, a path): s's len
 * bytes as they are when they fit in cap - 1 bytes, else their head and
 * tail around "...", so that a long input leaves room in the message
 * (mp_last_error holds 512 bytes) for what it says about it: the line,
 * the offset, the reason. Control characters (a newline, an escape, C1's
 * U+0080 to U+009F) and each byte of ill-formed UTF-8 come out as '?', so
 * that the message stays one line and valid UTF-8; the cut falls between
 * characters. Returns buf, NUL-terminated. cap >= 8. */
#define MP__CLIP 96
const char *mp__clip(const char *s, size_t len, char *buf, size_t cap);

/* Prints "mempool: internal check failed: cond (file:line, func)" to stderr
 * and aborts; reached only through MP__ASSERT in MP_DEBUG builds. */
_Noreturn void mp__assert_fail(const char *cond, const char *file, int line,
                               const char *func);

/* ---- thread.c ---------------------------------------------------------- */

/* pthread_create(t, NULL, fn, arg) for a thread of mempool's own: it starts
 * with every asynchronous signal blocked (a fault's own signals open), and
 * this returns once the thread runs fn (its start is over). */
int mp__thread_start(pthread_t *t, void *(*fn)(void *), void *arg);
/* How many threads mp__thread_start ever started have passed their start
 * (and are about to run, or ran, their function). */
unsigned long mp__threads_started(void);

/* ---- fault.c ----------------------------------------------------------- */

/* malloc, calloc and realloc for mempool's own bookkeeping (free() frees
 * them): the same, except that a test may make one fail. */
void *mp__host_alloc(size_t n);
void *mp__host_calloc(size_t count, size_t size);
void *mp__host_realloc(void *p, size_t n);
/* Room for one more element in a growable array v of *cap elements of elem
 * bytes, n of them used: v itself when n < *cap, else v grown to twice
 * *cap (16 at first) and *cap raised; NULL, v and *cap as they were, when
 * host memory runs out. */
void *mp__host_room(void *v, size_t *cap, size_t n, size_t elem);
/* Makes the allocation after the next n succeed fail once (n = 0: the next
 * one); n < 0 disarms. For tests of the failure branches. */
void mp__fault_host_after(long n);
/* true while a failure is armed and has not happened yet. */
bool mp__fault_host_pending(void);
/* on: every host allocation fails until it is called with false (host
 * memory gone for a while, where a retry cannot help). For tests. */
void mp__fault_host_every(bool on);

/* ---- conf.c ------------------------------------------------------------ */

/* Parses "123", "64K", "8M", "2G", "1T" (case-insensitive, optional "iB"/"B"
 * suffix: "8MiB", "8MB" both mean 8 << 20). false on anything else or on
 * overflow. */
bool mp__parse_size(const char *s, size_t len, size_t *out);
/* Decimal unsigned integer, no suffix. */
bool mp__parse_u64(const char *s, size_t len, uint64_t *out);
/* A plain decimal, "0.5", ".5", "5.", "2.5e-1": digits with at most one
 * '.', then an exponent if it likes; no blanks, sign, hex, inf or nan.
 * Read with '.' as the decimal point under any locale. MP_OK; MP_EINVAL on
 * anything else, and on a value out of a double's range ("1e400", and
 * "1e-400", which would read as 0); MP_ENOMEM when a long value (64
 * characters or more) found no host memory for its copy. No message set;
 * *out changed only on MP_OK. */
mp_status_t mp__read_decimal(const char *s, size_t len, double *out);
/* "1"/"0", "true"/"false", "yes"/"no", "on"/"off". */
bool mp__parse_bool(const char *s, size_t len, bool *out);

/* Walks "key=value,key=value": calls fn for each pair with pointers into the
 * string (not NUL-terminated). An empty string has no pairs. A pair without
 * '=', with an empty key, or with a key given before is MP_EINVAL naming
 * it, before fn sees anything
 * of it. fn returns MP_OK to go on; anything else stops the walk and is
 * returned. what names the string in messages ("device spec",
 * "MEMPOOL_CONF"). */
typedef mp_status_t (*mp__kv_fn)(void *ctx, const char *key, size_t key_len,
                                 const char *val, size_t val_len);
mp_status_t mp__kv_each(const char *what, const char *str, mp__kv_fn fn,
                        void *ctx);
/* Formats bytes as "1.50 GiB" into buf (at least 16 bytes), with a '.'
 * whatever the locale (mp__fmt_fixed); returns buf. */
const char *mp__fmt_bytes(char *buf, size_t cap, size_t bytes);
/* v >= 0 with decimals (at most 18) digits after a '.' whatever the
 * locale (printf's %f writes LC_NUMERIC's point, a ',' in de_DE, which no
 * JSON reader takes). Returns buf. */
const char *mp__fmt_fixed(char *buf, size_t cap, double v, unsigned decimals);
/* Any v (negative, tiny, NaN, infinite) as printf's %g writes it in the
 * "C" locale ("1.5", "-0.25", "1.5e-09", "nan", "-inf"), whatever
 * LC_NUMERIC's decimal point: for messages that quote a value given. buf
 * holds at least 32 bytes. Returns buf. */
const char *mp__fmt_g(char *buf, size_t cap, double v);

/* ---- pool/pool.c -------------------------------------------------------- */

/* Whether ptr lies in one of pool's segments (takes the lock). */
bool mp__pool_contains(mp_pool_t *pool, const void *ptr);
/* Marks pool as one that lives until the process exits (a default pool):
 * mp_pool_destroy refuses it. */
void mp__pool_for_good(mp_pool_t *pool);

/* ---- pool/stats.c ------------------------------------------------------- */

/* Adds b's counters to a: sums, peaks summed too (pool.h, Arenas; the
 * shim's report of its host pools), the largest free block the largest of
 * both. */
void mp__stats_add(mp_stats_t *a, const mp_stats_t *b);

/* ---- pool/pause.c ------------------------------------------------------- */

/* Whether pool is paused now (takes the lock). */
bool mp__pool_is_paused(mp_pool_t *pool);
/* Whether mp_pool_resume has something to resume now: the pool is paused,
 * or one of its arenas is (left paused by a pause that failed and could
 * not resume it, while the pool runs). Takes the locks. */
bool mp__pool_resume_wanted(mp_pool_t *pool);
/* MP_PAUSE_KEEP_CONTENT when pool, or one of its arenas, is paused holding
 * a host copy of its content, else 0: the flag a pause that undoes its
 * resume gives it back. Takes the locks. */
unsigned mp__pool_pause_kept(mp_pool_t *pool);

/* ---- host_pool.c -------------------------------------------------------- */

/* Whether ptr lies in the memory of host pool hp (its pool's chunks). */
bool mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);
/* mp_host_pool_free for a caller that has synchronized every stream the
 * buffer was used on (the shim's cudaFreeHost synchronizes the devices, as
 * the driver's does): the buffer serves the next request at once, without
 * waiting for a marker on those streams to be seen. */
mp_status_t mp__host_pool_free_done(mp_host_pool_t *hp, void *ptr);

/* ---- pool/snapshot.c --------------------------------------------------- */

/* mp_pool_snapshot of several pools in one pickle, pool k written as CUDA
 * device devices[k] (its segments' "device", device_traces[devices[k]]);
 * replaces path whole or leaves it untouched. */
mp_status_t mp__pool_snapshot_many(mp_pool_t *const *pools, const int *devices,
                                   size_t n, const char *path);

/* ---- default.c --------------------------------------------------------- */
/* Device ordinals that get a default pool of their own (0 ..
 * MP__DEFAULT_DEVICES - 1), besides $MEMPOOL_DEVICE's. */
#define MP__DEFAULT_DEVICES 64
/* The default pool of device ordinal `device` (made on first use), or NULL
 * with the error set: a device the backend does not have. */
mp_pool_t *mp__default_pool_for(int device);
/* fn on every default pool made so far. */
void mp__default_each(void (*fn)(mp_pool_t *pool));
/* True, with the error set (MP_EINVAL), in a child forked after the
 * default pools were made: they are the parent's, and so is what torch.c
 * keeps of them (its lock may have been held by a thread the child does
 * not have). */
bool mp__default_refused(void);
/* The default pool whose memory holds ptr, whatever the calling thread's
 * device, among those made (none is made for it). NULL, the error set:
 * none holds it (MP_EINVAL, the message naming fn) or there is none. */
mp_pool_t *mp__default_owner(void *ptr, const char *fn);

/* ---- ptrmap.c ---------------------------------------------------------- */

/* A hash map from addresses to caller-defined entries, O(1) per operation.
 * An entry is a struct whose first member is the uintptr_t key; key 0 is
 * never stored. Entry pointers stay valid until the next put, reserve or
 * remove. No locking: the owner guards the map. */
typedef struct mp__ptrmap {
  unsigned char *slots; /* cap entries of esize bytes */
  size_t esize;
  size_t cap; /* 0 or a power of two */
  size_t count;
} mp__ptrmap_t;

void mp__ptrmap_init(mp__ptrmap_t *m, size_t entry_size);
void mp__ptrmap_destroy(mp__ptrmap_t *m); /* frees the table; stays usable */
/* The entry of key, or NULL. */
void *mp__ptrmap_find(const mp__ptrmap_t *m, uintptr_t key);
/* The entry of key: the existing one, or a new one with key set and the
 * rest zeroed. NULL (map unchanged) when key is 0 or host memory ran out. */
void *mp__ptrmap_put(mp__ptrmap_t *m, uintptr_t key);
/* Room for `more` new keys, so that as many puts cannot fail. */
bool mp__ptrmap_reserve(mp__ptrmap_t *m, size_t more);
/* Removes an entry that find or put returned. */
void mp__ptrmap_remove(mp__ptrmap_t *m, void *entry);
/* Removes key, copying its entry to *out (if out); false when absent. */
bool mp__ptrmap_take(mp__ptrmap_t *m, uintptr_t key, void *out);
/* Iteration: the entry in slot i (0 <= i < m->cap), or NULL when empty. */
void *mp__ptrmap_at(const mp__ptrmap_t *m, size_t i);

#endif /* MEMPOOL_INTERNAL_H */
