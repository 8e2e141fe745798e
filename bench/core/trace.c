/* trace.c - the RMM-style CSV trace parser.
 *
 * A file that starts with the pickle PROTO opcode (0x80) is read as a
 * PyTorch memory snapshot instead (pickle.c), which converts to this CSV.
 *
 * Format (API.md): a header "Thread,Time,Action,Pointer,Size,Stream", then
 * one row per event: decimal thread, HH:MM:SS.ffffff time, "allocate",
 * "free" or "allocate failure", a hex pointer or "(nil)", a decimal size and
 * a decimal (or 0x-hex) stream. Rows are strict: any other shape is an error
 * naming the file and line, and the workload is left empty. So is a trace
 * whose live bytes would not fit a size_t (every figure is built on them),
 * one with no allocation of a nonzero size (nothing to measure), a free
 * whose size is neither its allocation's nor 0 (a log that does not know a
 * free's size, as cudaFree takes none, writes 0), and a free of (nil) with
 * a size (free(NULL) frees nothing).
 *
 * Pointers become slots through the library's address map (src/ptrmap.c)
 * from address to slot; a free marks the address freed (with its line), so
 * a log that reuses addresses after a free replays right. What a real log
 * has that a replay cannot do, counted and skipped:
 *  - "allocate failure" rows (the allocation never happened);
 *  - frees of pointers the trace never allocated: a log that began mid-run
 *    frees blocks allocated before it started; there is nothing to free;
 *    so is the late free of a block that an allocation of its live address
 *    replaced (below);
 *  - double frees: a second free of a block, its address not allocated
 *    again between (where the first was is kept for the notes);
 *  - an allocation of an address still live: a missing free (threads logged
 *    out of order); the old block is freed first, as the address shows the
 *    device must have done.
 * A pointer only names its block: ranges are not checked, since the
 * MindSpore plans (shared/traces/mindspore) give tensors ids 4 KiB apart
 * whatever their sizes, so live ranges overlap by design. Times are checked
 * for their form only and rows replay in file order: converted traces have
 * times out of order (a block live before recording began is at time 0).
 * Streams are numbered in order of first appearance; stream 0 of the log
 * (the default stream) is always index 0.
 *
 * Finding trace files (mpb_traces_dir, mpb_traces_scan) lives here too:
 * which folder holds the traces when none is named, and the *.csv files of
 * it and its direct subfolders (pytorch/, mindspore/), in name order, each
 * file once however many links lead to it. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* internal.h for: mp__fail, mp__parse_u64, mp__ptrmap_* (the live-address map).
 */
#include "internal.h"
#include "mpbench.h"

/* The live-address map is the library's own (src/ptrmap.c: the same murmur3
 * finalizer, linear probing and backward-shift deletion this file once kept
 * a copy of): address -> the workload slot of the block there. */
/* Every address the trace allocated stays in the map, freed ones too (for
 * the double-free note), so an entry is 16 bytes, not 24: on
 * shared/traces/mindspore/pangu_2.6B.csv (18 692 addresses, 1 104 live at
 * most) the map was 2.4 MB of the load's 4.0 MB peak, 1.5 MB in 16 bytes. */
typedef struct mpb_addr_entry {
  uintptr_t key; /* the address; 0 never stored (a NULL pointer is never
                    live) */
  /* MPB_ADDR_FREED clear: a block is live there, its slot in the low 32
   * bits; set: none is, the low MPB_ADDR_LINE_BITS the line of the free
   * that ended the last one (so that a second free of it is told as a
   * double free; a line past them, of a file of hundreds of terabytes,
   * shows as the last they hold). Above them, the frees owed: allocations
   * of the address while it was live (implicit frees), whose own frees may
   * come late (threads logged out of order); they stop counting at
   * MPB_ADDR_OWED_MAX. */
  uint64_t state;
} mpb_addr_entry_t;

#define MPB_ADDR_LINE_BITS 44
#define MPB_ADDR_LOW       ((UINT64_C(1) << MPB_ADDR_LINE_BITS) - 1)
#define MPB_ADDR_FREED     (UINT64_C(1) << 63)
#define MPB_ADDR_OWED_MAX  ((UINT64_C(1) << (63 - MPB_ADDR_LINE_BITS)) - 1)

static uint64_t mpb_addr_owed(const mpb_addr_entry_t *e) {
  return (e->state & ~MPB_ADDR_FREED) >> MPB_ADDR_LINE_BITS;
}

/* e's state: freed (low: the free's line) or live (low: its slot). */
static void mpb_addr_set(mpb_addr_entry_t *e, bool freed, uint64_t low,
                         uint64_t owed) {
  e->state = (freed ? MPB_ADDR_FREED : 0) |
             (owed < MPB_ADDR_OWED_MAX ? owed : MPB_ADDR_OWED_MAX)
                 << MPB_ADDR_LINE_BITS |
             (low < MPB_ADDR_LOW ? low : MPB_ADDR_LOW);
}

/* ---- fields ---------------------------------------------------------------
 */

static bool mpb_all_digits(const char *s, size_t len) {
  if (len == 0)
    return false;
  for (size_t i = 0; i < len; i++)
    if (s[i] < '0' || s[i] > '9')
      return false;
  return true;
}

/* The value of hex digit c, or -1. */
static int mpb_hex_digit(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Whether s[0, len) is hex digits, after "0x" if it has one (of any
 * value: mpb_parse_hex says whether it fits). */
static bool mpb_hex_form(const char *s, size_t len) {
  if (len >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s += 2;
    len -= 2;
  }
  if (len == 0)
    return false;
  for (size_t i = 0; i < len; i++)
    if (mpb_hex_digit((unsigned char)s[i]) < 0)
      return false;
  return true;
}

/* Hex (mpb_hex_form) whose value fits 64 bits, leading zeros any number
 * (0x%016llx is 16 digits, but a log may pad wider). */
static bool mpb_parse_hex(const char *s, size_t len, uint64_t *out) {
  if (!mpb_hex_form(s, len))
    return false;
  if (len >= 2 && (s[1] == 'x' || s[1] == 'X')) {
    s += 2;
    len -= 2;
  }
  while (len > 1 && s[0] == '0') {
    s++;
    len--;
  }
  if (len > 16)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++)
    v = v << 4 | (uint64_t)mpb_hex_digit((unsigned char)s[i]);
  *out = v;
  return true;
}

/* HH:MM:SS.ffffff: hours of any width, minutes and seconds below 60, one
 * to nine fraction digits. */
static bool mpb_valid_time(const char *s, size_t len) {
  const char *c1 = memchr(s, ':', len);
  if (c1 == NULL || !mpb_all_digits(s, (size_t)(c1 - s)))
    return false;
  const char *m = c1 + 1, *end = s + len;
  if (end - m < 6 || !mpb_all_digits(m, 2) || m[2] != ':' ||
      !mpb_all_digits(m + 3, 2) || m[5] != '.')
    return false;
  if ((m[0] - '0') * 10 + (m[1] - '0') > 59 ||
      (m[3] - '0') * 10 + (m[4] - '0') > 60) /* 60: a leap second */
    return false;
  size_t frac = (size_t)(end - (m + 6));
  return frac >= 1 && frac <= 9 && mpb_all_digits(m + 6, frac);
}

const char *mpb_printable(const char *s, size_t len, char *buf, size_t cap) {
  size_t n = len < cap - 1 ? len : cap - 1;
  for (size_t i = 0; i < n; i++)
    buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
  buf[n] = '\0';
  return buf;
}

const char *mpb_shown(const char *s, char *buf) {
  return mp__clip(s, strlen(s), buf, MPB_SHOWN);
}

static bool mpb_field_is(const char *s, size_t len, const char *word) {
  return strlen(word) == len && memcmp(s, word, len) == 0;
}

/* ---- the parser -----------------------------------------------------------
 */

/* A stream's handle in the trace -> its number in the workload (1 up; the
 * trace's 0, the default stream, is 0). A map, not a scan: a trace may
 * name tens of thousands of streams (a scan of them per row made a
 * 13 MB trace of 65 533 streams take 7 s to read, against 0.3 s for one
 * stream). */
typedef struct mpb_stream_entry {
  uintptr_t key; /* the handle; 0 never stored */
  uint16_t index;
} mpb_stream_entry_t;

typedef struct mpb_parser {
  const char *what;
  mpb_workload_t *w;
  mp__ptrmap_t map;     /* of mpb_addr_entry_t */
  mp__ptrmap_t streams; /* of mpb_stream_entry_t */
  uint32_t nstream_ids;
  size_t live;    /* bytes the trace has live now */
  bool any_bytes; /* an allocation of a nonzero size was seen */
  size_t line;    /* lines parsed so far */
} mpb_parser_t;

static mp_status_t mpb_stream_index(mpb_parser_t *p, uint64_t id, size_t line,
                                    uint16_t *out) {
  if (id == 0) {
    *out = 0;
    return MP_OK;
  }
  const mpb_stream_entry_t *e = mp__ptrmap_find(&p->streams, (uintptr_t)id);
  if (e != NULL) {
    *out = e->index;
    return MP_OK;
  }
  if (p->nstream_ids >= MPB_MAX_TRACE_STREAMS)
    return mp__fail(MP_EINVAL,
                    "%s:%zu: more than %d streams (each is replayed on a "
                    "device stream of its own)",
                    p->what, line, MPB_MAX_TRACE_STREAMS);
  mpb_stream_entry_t *n = mp__ptrmap_put(&p->streams, (uintptr_t)id);
  if (n == NULL) /* the cause, which mpb_trace_parse's "too big" quotes */
    return mp__fail(MP_ENOMEM, "out of host memory for the streams' map");
  n->index = (uint16_t)++p->nstream_ids;
  *out = n->index;
  return MP_OK;
}

static mp_status_t mpb_parse_row(mpb_parser_t *p, const char *s, size_t len,
                                 size_t line) {
  const char *f[6];
  size_t fl[6], nf = 0;
  const char *start = s, *end = s + len;
  for (const char *c = s;; c++) {
    if (c == end || *c == ',') {
      if (nf < 6) {
        f[nf] = start;
        fl[nf] = (size_t)(c - start);
      }
      nf++;
      start = c + 1;
      if (c == end)
        break;
    }
  }
  char shown[81]; /* a bad field as the message quotes it */
  if (nf != 6)
    return mp__fail(MP_EINVAL,
                    "%s:%zu: expected 6 comma-separated fields "
                    "(Thread,Time,Action,Pointer,Size,Stream), "
                    "found %zu",
                    p->what, line, nf);
  if (!mpb_all_digits(f[0], fl[0]))
    return mp__fail(MP_EINVAL, "%s:%zu: bad thread '%s' (a decimal number)",
                    p->what, line,
                    mpb_printable(f[0], fl[0], shown, sizeof shown));
  if (!mpb_valid_time(f[1], fl[1]))
    return mp__fail(MP_EINVAL, "%s:%zu: bad time '%s' (HH:MM:SS.ffffff)",
                    p->what, line,
                    mpb_printable(f[1], fl[1], shown, sizeof shown));
  int action;
  if (mpb_field_is(f[2], fl[2], "allocate"))
    action = MPB_ALLOC;
  else if (mpb_field_is(f[2], fl[2], "free"))
    action = MPB_FREE;
  else if (mpb_field_is(f[2], fl[2], "allocate failure"))
    action = -1;
  else
    return mp__fail(MP_EINVAL,
                    "%s:%zu: bad action '%s' (allocate, free or allocate "
                    "failure)",
                    p->what, line,
                    mpb_printable(f[2], fl[2], shown, sizeof shown));
  uint64_t addr = 0;
  /* A number of the right form that does not fit is said as such: "bad
   * size '99999999999999999999' (a decimal number)" named the form it
   * had. */
  if (!mpb_field_is(f[3], fl[3], "(nil)") && !mpb_parse_hex(f[3], fl[3], &addr))
    return mp__fail(MP_EINVAL, "%s:%zu: bad pointer '%s' (%s)", p->what, line,
                    mpb_printable(f[3], fl[3], shown, sizeof shown),
                    mpb_hex_form(f[3], fl[3]) ? "wider than 64 bits"
                                              : "hex such as 0x7f00 or (nil)");
  uint64_t size, stream;
  if (!mp__parse_u64(f[4], fl[4], &size) || size > SIZE_MAX)
    return mp__fail(MP_EINVAL, "%s:%zu: bad size '%s' (%s)", p->what, line,
                    mpb_printable(f[4], fl[4], shown, sizeof shown),
                    mpb_all_digits(f[4], fl[4])
                        ? "more bytes than this machine's size_t holds"
                        : "a decimal number");
  bool hex5 = fl[5] > 2 && f[5][0] == '0' && (f[5][1] == 'x' || f[5][1] == 'X');
  if (!mp__parse_u64(f[5], fl[5], &stream) &&
      !(hex5 && mpb_parse_hex(f[5], fl[5], &stream)))
    return mp__fail(MP_EINVAL, "%s:%zu: bad stream '%s' (%s)", p->what, line,
                    mpb_printable(f[5], fl[5], shown, sizeof shown),
                    mpb_all_digits(f[5], fl[5]) ||
                            (hex5 && mpb_hex_form(f[5], fl[5]))
                        ? "wider than 64 bits"
                        : "a decimal number, or hex such as 0x7f00");

  mpb_workload_t *w = p->w;
  /* A failure's pointer is not checked: RMM's log writes a null one, but a
   * PyTorch snapshot's "oom" entry has the device's free bytes in its addr
   * field (CUDACachingAllocator.cpp: record_trace(TraceEntry::OOM,
   * device_free, ...)), which pickle.c writes as the row's pointer. */
  if (action < 0) {
    w->failure_rows++;
    return MP_OK;
  }
  if (addr == 0) {
    /* free(NULL) frees nothing, so has no size: a size names a block the
     * row does not (no shared trace has one; the shim records only frees
     * of blocks it found). */
    if (action == MPB_FREE && size != 0)
      return mp__fail(MP_EINVAL,
                      "%s:%zu: free of %llu bytes at pointer (nil) (a free "
                      "of (nil) frees nothing: its size is 0)",
                      p->what, line, (unsigned long long)size);
    if (action == MPB_FREE)
      return MP_OK; /* free(NULL) */
    if (size != 0)
      return mp__fail(MP_EINVAL,
                      "%s:%zu: allocation of %llu bytes at pointer (nil)",
                      p->what, line, (unsigned long long)size);
    w->zero_size_allocs++;
    return MP_OK;
  }
#if UINTPTR_MAX < UINT64_MAX /* the map's keys are addresses of this machine   \
                              */
  if (addr > UINTPTR_MAX)
    return mp__fail(MP_EINVAL,
                    "%s:%zu: pointer 0x%llx is wider than this machine's "
                    "addresses",
                    p->what, line, (unsigned long long)addr);
#endif
  if (!mp__ptrmap_reserve(&p->map, 1))
    return mp__fail(MP_ENOMEM, "%s: out of host memory", p->what);
  mpb_addr_entry_t *e = mp__ptrmap_find(&p->map, (uintptr_t)addr);
  if (action == MPB_FREE) {
    if (e == NULL) {
      w->unknown_frees++;
      return MP_OK;
    }
    uint64_t owed = mpb_addr_owed(e);
    if (e->state & MPB_ADDR_FREED) {
      /* The late free of a block that an allocation of its address
       * replaced: no free of a block the trace has, as it always was. */
      if (owed > 0) {
        mpb_addr_set(e, true, e->state & MPB_ADDR_LOW, owed - 1);
        w->unknown_frees++;
      } else if (w->double_frees++ == 0) {
        snprintf(w->double_free_at, sizeof w->double_free_at,
                 "line %zu (freed by line %llu)", line,
                 (unsigned long long)(e->state & MPB_ADDR_LOW));
      }
      return MP_OK;
    }
    uint32_t slot = (uint32_t)e->state;
    /* A free names its block's size, or 0 where the log does not know it
     * (cudaFree takes none); another size: rows that do not go together. */
    if (size != 0 && size != w->slot_size[slot])
      return mp__fail(MP_EINVAL,
                      "%s:%zu: free of 0x%llx gives %llu bytes, but it was "
                      "allocated with %zu (a free's size is its "
                      "allocation's, or 0)",
                      p->what, line, (unsigned long long)addr,
                      (unsigned long long)size, w->slot_size[slot]);
    mpb_addr_set(e, true, line, owed);
    p->live -= w->slot_size[slot];
    return mpb_workload_free_slot(w, slot);
  }
  if (e != NULL && !(e->state & MPB_ADDR_FREED)) {
    w->implicit_frees++;
    uint32_t old = (uint32_t)e->state;
    mpb_addr_set(e, false, old, mpb_addr_owed(e) + 1);
    p->live -= w->slot_size[old];
    mp_status_t st = mpb_workload_free_slot(w, old);
    if (st != MP_OK)
      return st;
  }
  /* Live bytes must fit a size_t, or every figure built on them wraps. */
  if (size > SIZE_MAX - p->live)
    return mp__fail(MP_EINVAL,
                    "%s:%zu: allocation of %llu bytes makes the live bytes "
                    "exceed the address space",
                    p->what, line, (unsigned long long)size);
  p->live += (size_t)size;
  p->any_bytes |= size != 0;
  if (size == 0)
    w->zero_size_allocs++;
  uint16_t sidx = 0;
  mp_status_t st = mpb_stream_index(p, stream, line, &sidx);
  uint32_t slot;
  if (st == MP_OK)
    st = mpb_workload_alloc(w, (size_t)size, sidx, &slot);
  if (st != MP_OK)
    return st;
  /* Room was reserved above and nothing touched the map since. */
  if (e == NULL)
    e = mp__ptrmap_put(&p->map, (uintptr_t)addr);
  mpb_addr_set(e, false, slot, mpb_addr_owed(e));
  return MP_OK;
}

/* The first line (without its end of line): the header, after a UTF-8 byte
 * order mark if there is one (spreadsheet tools write it). */
static mp_status_t mpb_trace_header(const char *s, size_t l, const char *what) {
  if (l >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
    s += 3;
    l -= 3;
  }
  if (memchr(s, '\0', l) != NULL)
    return mp__fail(MP_EINVAL, "%s:1: NUL byte in a text file", what);
  if (mpb_field_is(s, l, "Thread,Time,Action,Pointer,Size,Stream"))
    return MP_OK;
  /* JSON (the shim's MEMPOOL_TRACE=*.json, a Chrome/Perfetto trace): the
   * header's message alone would not say which trace mpbench reads. */
  size_t b = 0;
  while (b < l && (s[b] == ' ' || s[b] == '\t'))
    b++;
  if (b < l && (s[b] == '{' || s[b] == '['))
    return mp__fail(MP_EINVAL,
                    "%s:1: a JSON file, not a trace: mpbench replays RMM's "
                    "CSV (a MEMPOOL_TRACE path ending in .json gets a "
                    "Chrome/Perfetto trace to view; record to a .csv path to "
                    "replay) or a PyTorch snapshot pickle",
                    what);
  char shown[61]; /* binary input shows as '?' */
  return mp__fail(MP_EINVAL,
                  "%s:1: expected the header "
                  "'Thread,Time,Action,Pointer,Size,Stream', found '%s'",
                  what, mpb_printable(s, l, shown, sizeof shown));
}

/* Out of host memory at line of what (at_end: freeing, after its last
 * line, the blocks it left live): which line made the trace too big, with
 * the cause. */
static mp_status_t mpb_too_big(const char *what, size_t line, bool at_end) {
  char why[256];
  snprintf(why, sizeof why, "%s", mp_last_error());
  return mp__fail(
      MP_ENOMEM, "%s:%zu: trace too big for host memory%s (%s)", what, line,
      at_end ? ", freeing the blocks still live at its end" : "", why);
}

/* The CSV parser, fed line by line (below). */
static mp_status_t mpb_csv_begin(mpb_parser_t **out_p, const char *what,
                                 const char *name, mpb_workload_t *out);
static mp_status_t mpb_csv_line(mpb_parser_t *p, const char *s, size_t l);
static mp_status_t mpb_csv_end(mpb_parser_t *p, mp_status_t st);

mp_status_t mpb_trace_parse(const char *text, size_t len, const char *what,
                            const char *name, mpb_workload_t *out) {
  if (text == NULL || out == NULL || what == NULL)
    return mp__fail(MP_EINVAL, "mpb_trace_parse: NULL argument");
  /* Named shortened in messages: a long path would leave no room for the
   * line and the reason (mp__clip; the same for a name clipped before). */
  char shown[MP__CLIP];
  what = mp__clip(what, strlen(what), shown, sizeof shown);
  /* A pickle (PyTorch memory snapshot) by content, whatever its name. */
  if (mpb_snapshot_detect(text, len))
    return mpb_snapshot_parse(text, len, what, name, out);
  mpb_parser_t *p = NULL;
  mp_status_t st = mpb_csv_begin(&p, what, name, out);
  if (st != MP_OK)
    return st;
  const char *s = text, *end = text + len;
  while (s < end && st == MP_OK) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    const char *le = nl ? nl : end;
    st = mpb_csv_line(p, s, (size_t)(le - s));
    s = nl ? nl + 1 : end;
  }
  return mpb_csv_end(p, st);
}

/* The CSV parser, fed line by line: mpb_trace_parse gives it a whole text,
 * mpb_trace_load each line as it is read, so that what is not a trace is
 * refused at its first bad line without reading on. what is kept (the
 * caller's, clipped); out is emptied on a failure. */
static mp_status_t mpb_csv_begin(mpb_parser_t **out_p, const char *what,
                                 const char *name, mpb_workload_t *out) {
  mpb_workload_init(out, name);
  mpb_parser_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return mp__fail(MP_ENOMEM, "%s: out of host memory", what);
  p->what = what;
  p->w = out;
  mp__ptrmap_init(&p->map, sizeof(mpb_addr_entry_t));
  mp__ptrmap_init(&p->streams, sizeof(mpb_stream_entry_t));
  *out_p = p;
  return MP_OK;
}

/* The next line, s[0, l) without its '\n' (a '\r' before it is dropped). */
static mp_status_t mpb_csv_line(mpb_parser_t *p, const char *s, size_t l) {
  if (l > 0 && s[l - 1] == '\r')
    l--;
  mp_status_t st = MP_OK;
  if (++p->line == 1)
    st = mpb_trace_header(s, l, p->what);
  else if (memchr(s, '\0', l) != NULL)
    st = mp__fail(MP_EINVAL, "%s:%zu: NUL byte in a text file", p->what,
                  p->line);
  else if (l > 0)
    st = mpb_parse_row(p, s, l, p->line);
  return st == MP_ENOMEM ? mpb_too_big(p->what, p->line, false) : st;
}

/* After the last line (st: how the lines went): the workload, or the
 * reason there is none. Frees p. */
static mp_status_t mpb_csv_end(mpb_parser_t *p, mp_status_t st) {
  if (st == MP_OK && p->line == 0)
    st = mp__fail(MP_EINVAL, "%s: empty file (no header)", p->what);
  /* Nothing to replay would give figures of zero that look like results. */
  if (st == MP_OK && !p->any_bytes)
    st = mp__fail(MP_EINVAL,
                  "%s: no allocation of a nonzero size: nothing to replay",
                  p->what);
  /* The maps are done with: freed before the drain, which may grow the
   * workload's events (one free per block still live). */
  mp__ptrmap_destroy(&p->map);
  mp__ptrmap_destroy(&p->streams);
  /* Blocks the trace never freed are freed at its end, so every replay
   * ends empty and allocators are compared on the same events. */
  if (st == MP_OK && (st = mpb_workload_drain(p->w)) == MP_ENOMEM)
    st = mpb_too_big(p->what, p->line, true);
  mpb_workload_t *out = p->w;
  free(p);
  if (st != MP_OK)
    mpb_workload_free(out);
  return st;
}

/* Lines counted as the file is read, so that a file with bytes no trace
 * has stops the read where they are. */
typedef struct mpb_scan {
  size_t line;     /* the line being read, from 1 */
  size_t line_len; /* its bytes so far */
} mpb_scan_t;

#define MPB_MAX_LINE 4096 /* a trace row is under 200 bytes */

static mp_status_t mpb_trace_scan(mpb_scan_t *sc, const char *p, size_t n,
                                  const char *path) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n') {
      sc->line++;
      sc->line_len = 0;
    } else if (p[i] == '\0') {
      return mp__fail(MP_EINVAL, "%s:%zu: NUL byte in a text file", path,
                      sc->line);
    } else if (p[i] == '\r' && (i + 1 == n || p[i + 1] == '\n')) {
      /* A CRLF's '\r' is no byte of the line (mpb_csv_line drops it): a
       * line of MPB_MAX_LINE bytes ending in CRLF was refused. One that
       * ends what was read is judged again once its line is whole. */
      continue;
    } else if (++sc->line_len > MPB_MAX_LINE) {
      return mp__fail(MP_EINVAL,
                      "%s:%zu: line longer than %d bytes: not a trace", path,
                      sc->line, MPB_MAX_LINE);
    }
  }
  return MP_OK;
}

mp_status_t mpb_trace_load(const char *path, const char *name,
                           mpb_workload_t *out) {
  if (path == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mpb_trace_load: NULL argument");
  /* Empty on every failure, the read's too (mpbench.h). */
  mpb_workload_init(out, name);
  /* Named shortened in messages (see mpb_trace_parse). */
  char shown[MP__CLIP];
  const char *what = mp__clip(path, strlen(path), shown, sizeof shown);
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return mp__fail(MP_EINVAL, "cannot open trace %s: %s", what,
                    strerror(errno));
  struct stat sb;
  bool stat_ok = fstat(fileno(f), &sb) == 0;
  if (stat_ok && S_ISDIR(sb.st_mode)) {
    fclose(f);
    return mp__fail(MP_EINVAL,
                    "trace %s is a folder, not a CSV file or snapshot", what);
  }
  /* A regular file ends where its size says; a pipe or a device may not. */
  bool regular = stat_ok && S_ISREG(sb.st_mode);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  /* CSV (known from the first byte) goes to the parser line by line as it
   * is read, and only the line being read stays in buf: what is not a
   * trace is refused at its first bad line, not read to its end (a device
   * or a pipe, /dev/zero, may have none). A snapshot pickle is binary: its
   * reader checks it once it is read whole, so from a pipe or a device it
   * is read up to a limit. */
  mpb_parser_t *csv = NULL;
  bool pickle = false;
  mpb_scan_t scan = {.line = 1};
  mp_status_t st = MP_OK;
  size_t off = 0; /* bytes read so far */
  for (;;) {
    /* 128 KiB to start: a CSV line is at most MPB_MAX_LINE bytes, so a
     * CSV never grows it, and each read is 64 KiB or more. It was 1 MiB,
     * a third of the load's heap peak on shared/traces/mindspore/
     * pangu_2.6B.csv (3.17 MB under valgrind's massif, 2.26 MB with
     * 128 KiB), beside the address map (1 MiB for its 18 692 addresses, as
     * much again while it grows) and the workload. A pickle, read whole,
     * grows it by doubling as before. */
    if (cap - len < 65536) {
      size_t ncap = cap ? cap * 2 : 1 << 17;
      char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
      if (nb == NULL) {
        st = mp__fail(MP_ENOMEM,
                      "%s:%zu: out of host memory reading the trace (%zu "
                      "bytes read)",
                      what, scan.line, len);
        break;
      }
      buf = nb;
      cap = ncap;
    }
    /* A pickle from a pipe or a device: one byte past the limit at most. */
    size_t want = cap - len;
    if (pickle && !regular && want > MPB_MAX_PIPED_SNAPSHOT + 1 - len)
      want = MPB_MAX_PIPED_SNAPSHOT + 1 - len;
    errno = 0;
    size_t got = fread(buf + len, 1, want, f);
    if (got < want && ferror(f) != 0) {
      /* Said at once, while errno is the read's. */
      int err = errno;
      st = mp__fail(MP_EINVAL, "cannot read trace %s at offset %zu: %s", what,
                    off + got, err != 0 ? strerror(err) : "read error");
      break;
    }
    if (got == 0)
      break;
    off += got;
    if (csv == NULL && !pickle) {
      pickle = mpb_snapshot_detect(buf, got);
      if (!pickle && (st = mpb_csv_begin(&csv, what, name, out)) != MP_OK)
        break;
    }
    len += got;
    if (pickle && !regular && len > MPB_MAX_PIPED_SNAPSHOT) {
      st = mp__fail(MP_EINVAL,
                    "%s: a snapshot pickle read from a pipe or device (not a "
                    "regular file) may be at most %zu bytes: read stopped at "
                    "offset %zu; save it to a file",
                    what, MPB_MAX_PIPED_SNAPSHOT, len);
      break;
    }
    if (csv == NULL)
      continue;
    /* Each whole line checked (a NUL, its length) just before it is
     * parsed, so that the first bad line is the one named; then the
     * unfinished one, on a copy of the scan (it is checked again once
     * whole), so that a read of what is no text (/dev/zero) stops here. */
    size_t used = 0;
    for (const char *nl;
         st == MP_OK && (nl = memchr(buf + used, '\n', len - used)) != NULL;
         used = (size_t)(nl - buf) + 1) {
      st = mpb_trace_scan(&scan, buf + used, (size_t)(nl - buf) + 1 - used,
                          what);
      if (st == MP_OK)
        st = mpb_csv_line(csv, buf + used, (size_t)(nl - buf) - used);
    }
    mpb_scan_t tail = scan;
    if (st == MP_OK)
      st = mpb_trace_scan(&tail, buf + used, len - used, what);
    if (st != MP_OK)
      break;
    memmove(buf, buf + used, len - used);
    len -= used;
  }
  fclose(f);
  if (csv != NULL) { /* the last line, if it has no '\n' */
    if (st == MP_OK && len > 0)
      st = mpb_csv_line(csv, buf, len);
    st = mpb_csv_end(csv, st);
  } else if (st == MP_OK) {
    st = mpb_trace_parse(buf, len, what, name, out);
  }
  free(buf);
  return st;
}

/* ---- finding trace files ---------------------------------------------- */

#ifndef MPBENCH_TRACES_DIR
#define MPBENCH_TRACES_DIR ""
#endif

static bool mpb_is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool mpb_is_csv(const char *name) {
  size_t n = strlen(name);
  return name[0] != '.' && n > 4 && strcmp(name + n - 4, ".csv") == 0;
}

/* A folder scan's trace: a *.csv name that is a regular file (a FIFO would
 * block the replay that opens it until something writes to it). */
static bool mpb_is_csv_file(const char *dir, const char *name) {
  char p[PATH_MAX * 2];
  struct stat sb;
  return mpb_is_csv(name) &&
         snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p &&
         stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int mpb_cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends a copy of str to *v (n, capacity *cap); false when out of
 * memory, with *v unchanged. */
static bool mpb_push_copy(char ***v, size_t *n, size_t *cap, const char *str) {
  if (!mpb_grow(v, cap, *n, sizeof **v))
    return false;
  char *copy = strdup(str);
  if (copy == NULL)
    return false;
  (*v)[(*n)++] = copy;
  return true;
}

void mpb_traces_free(char **v, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

/* How many of the two steps from dir to dir/rel (its subfolder, the file)
 * are symbolic links. */
static unsigned mpb_links_on_path(const char *dir, const char *rel) {
  char p[PATH_MAX * 2];
  unsigned links = 0;
  struct stat sb;
  for (const char *c = rel;; c++) {
    if (*c != '/' && *c != '\0')
      continue;
    if (snprintf(p, sizeof p, "%s/%.*s", dir, (int)(c - rel), rel) <
            (int)sizeof p &&
        lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode))
      links++;
    if (*c == '\0')
      return links;
  }
}

/* One file reached by several of v's n paths (a link to a trace, a linked
 * folder, a hard link: one device and inode) keeps one of them: the one
 * through the fewest links, the first in v's order among those. The others
 * leave v; each is said in *same as "REL is KEPT" (same NULL: not said).
 * MP_ENOMEM: v and *same as they were then (the caller frees them). */
static mp_status_t mpb_traces_one_each(const char *dir, char **v, size_t *n,
                                       char ***same, size_t *nsame) {
  size_t cap = 0, nv = *n;
  struct stat *sb = calloc(nv ? nv : 1, sizeof *sb);
  unsigned *links = calloc(nv ? nv : 1, sizeof *links);
  bool *known = calloc(nv ? nv : 1, sizeof *known);
  mp_status_t st = MP_OK;
  if (sb == NULL || links == NULL || known == NULL)
    st = mp__fail(MP_ENOMEM, "out of host memory");
  for (size_t i = 0; i < nv && st == MP_OK; i++) {
    char p[PATH_MAX * 2];
    known[i] = snprintf(p, sizeof p, "%s/%s", dir, v[i]) < (int)sizeof p &&
               stat(p, &sb[i]) == 0;
    links[i] = mpb_links_on_path(dir, v[i]);
  }
  /* keep: for each path, the index of the one kept for its file. */
  size_t *keep = st == MP_OK ? calloc(nv ? nv : 1, sizeof *keep) : NULL;
  if (st == MP_OK && keep == NULL)
    st = mp__fail(MP_ENOMEM, "out of host memory");
  for (size_t i = 0; i < nv && st == MP_OK; i++) {
    keep[i] = i;
    for (size_t j = 0; j < nv && known[i]; j++)
      if (known[j] && sb[j].st_dev == sb[i].st_dev &&
          sb[j].st_ino == sb[i].st_ino &&
          (links[j] < links[keep[i]] ||
           (links[j] == links[keep[i]] && j < keep[i])))
        keep[i] = j;
  }
  for (size_t i = 0; i < nv && st == MP_OK && same != NULL; i++) {
    if (keep[i] == i)
      continue;
    char line[PATH_MAX * 2 + 8];
    snprintf(line, sizeof line, "%s is %s", v[i], v[keep[i]]);
    if (!mpb_push_copy(same, nsame, &cap, line))
      st = mp__fail(MP_ENOMEM, "out of host memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < nv && st == MP_OK; i++) {
    if (keep[i] == i)
      v[k++] = v[i];
    else
      free(v[i]);
  }
  if (st == MP_OK)
    *n = k;
  free(keep);
  free(sb);
  free(links);
  free(known);
  return st;
}

mp_status_t mpb_traces_scan(const char *dir, char ***out, size_t *nout,
                            char ***same, size_t *nsame) {
  *out = NULL;
  *nout = 0;
  if (same != NULL) {
    *same = NULL;
    *nsame = 0;
  }
  DIR *d = opendir(dir);
  char shown[MPB_SHOWN];
  if (d == NULL)
    return mp__fail(MP_EINVAL, "cannot open traces folder %s: %s",
                    mpb_shown(dir, shown), strerror(errno));
  char **v = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  char path[PATH_MAX];
  mp_status_t st = MP_OK;
  while ((e = readdir(d)) != NULL && st == MP_OK) {
    if (e->d_name[0] == '.')
      continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >=
        (int)sizeof path)
      continue;
    if (mpb_is_dir(path)) {
      DIR *sd = opendir(path);
      if (sd == NULL)
        continue;
      struct dirent *se;
      while ((se = readdir(sd)) != NULL && st == MP_OK) {
        if (mpb_is_csv_file(path, se->d_name)) {
          char rel[PATH_MAX];
          snprintf(rel, sizeof rel, "%s/%s", e->d_name, se->d_name);
          if (!mpb_push_copy(&v, &n, &cap, rel))
            st = mp__fail(MP_ENOMEM, "out of host memory");
        }
      }
      closedir(sd);
    } else if (mpb_is_csv_file(dir, e->d_name)) {
      if (!mpb_push_copy(&v, &n, &cap, e->d_name))
        st = mp__fail(MP_ENOMEM, "out of host memory");
    }
  }
  closedir(d);
  if (st != MP_OK) {
    mpb_traces_free(v, n);
    return st;
  }
  if (n > 1)
    qsort(v, n, sizeof *v, mpb_cmp_str);
  st = mpb_traces_one_each(dir, v, &n, same, nsame);
  if (st != MP_OK) {
    mpb_traces_free(v, n);
    if (same != NULL) {
      mpb_traces_free(*same, *nsame);
      *same = NULL;
      *nsame = 0;
    }
    return st;
  }
  *out = v;
  *nout = n;
  return MP_OK;
}

const char *mpb_traces_dir(char *buf, size_t len) {
  const char *env = getenv("MEMPOOL_TRACES");
  if (env != NULL && env[0] != '\0') {
    snprintf(buf, len, "%s", env);
    return buf;
  }
  if (MPBENCH_TRACES_DIR[0] != '\0' && mpb_is_dir(MPBENCH_TRACES_DIR)) {
    snprintf(buf, len, "%s", MPBENCH_TRACES_DIR);
    return buf;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return NULL;
  exe[n] = '\0';
  for (int up = 0; up < 6; up++) {
    char *slash = strrchr(exe, '/');
    if (slash == NULL || slash == exe)
      break;
    *slash = '\0';
    if (snprintf(buf, len, "%s/../shared/traces", exe) < (int)len &&
        mpb_is_dir(buf))
      return buf;
    if (snprintf(buf, len, "%s/shared/traces", exe) < (int)len &&
        mpb_is_dir(buf))
      return buf;
  }
  return NULL;
}
