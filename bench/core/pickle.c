/* pickle.c - PyTorch memory snapshots (pickles) as replayable workloads.
 *
 * torch.cuda.memory._dump_snapshot() pickles the dict that
 * torch.cuda.memory._snapshot() returns: {"segments": [...],
 * "device_traces": [[entry, ...] per device], ...}, each trace entry a dict
 * with "action", "addr", "size", "stream", "time_us" and "frames" (the
 * TypedDicts Segment/TraceEntry of torch/cuda/memory.py document them; the
 * entries come from TraceEntry in c10/cuda/CUDACachingAllocator.h). That is
 * the format followed here; no PyTorch code is used.
 *
 * Two parts:
 *  - a small pickle machine for what Python's pickle protocols 2 to 5 emit
 *    for dict, list, tuple, str, bytes, int, float, bool and None (with the
 *    memo: MEMOIZE, BINPUT, BINGET and their long forms; FRAME). Anything
 *    else (a class, a reduce, protocol 0/1 text opcodes) is refused with
 *    the opcode and its byte offset; so is a truncated or inconsistent
 *    pickle. It never recurses, so deep nesting cannot overflow the C stack,
 *    and every allocation is bounded by the input's length (the CSV below
 *    by 4 times it: pk_csv_cap), but for a constant: the values come from
 *    chunks of 64 KiB, and the small ints shared from a table of 32 KiB
 *    (pk_alloc, pk_int). Each value made takes 40 bytes (None, True and
 *    False none), each item of a list or dict 8, at most twice that while
 *    its list grows.
 *  - the conversion of one device's trace into the RMM CSV that trace.c
 *    parses, so that both inputs replay through the same rules (unknown
 *    frees, reused addresses, streams numbered in order of appearance).
 *    Line k + 2 of that CSV is trace entry k (entries that do not become a
 *    row leave an empty line), so a refusal of line LINE is reported as
 *    one of trace entry LINE-2 (pk_name_entry). An entry is named by its
 *    device trace, its index and the byte of its dict (pk_where), as the
 *    pickle's own refusals name their offset.
 *
 * Which events become rows (TraceEntry's actions):
 *  - "alloc"                       -> allocate
 *  - "free_completed"              -> free. PyTorch logs "free_requested"
 *    when the tensor is dropped and "free_completed" when the block can be
 *    reused, after the work of every stream recorded on it is done; the
 *    block holds memory until then, so the completed free is its end.
 *  - "free_requested" (and "free", its name before PyTorch 2.1) -> free,
 *    but only in a trace that has no "free_completed" at all (older
 *    snapshots); otherwise it is skipped, as the completion follows.
 *  - "oom"                         -> an "allocate failure" row (counted,
 *    not replayed: the allocation never happened)
 *  - segment_alloc/segment_free/segment_map/segment_unmap/snapshot: what
 *    PyTorch's own allocator did with the device, not what the program
 *    asked for: skipped, since the replay measures each allocator's own.
 *  - "user_defined": an annotation the program recorded in the trace
 *    (TraceEntry::USER_DEFINED, which DeviceCachingAllocator's
 *    recordAnnotation writes with addr and size 0): no memory, skipped.
 * The replay takes the first device whose trace has an allocation.
 * Blocks allocated before the trace began (the history is a ring buffer)
 * appear only as frees of unknown pointers, which trace.c counts and skips.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* mp__fail, MP__PRINTF (errors through mp_last_error) */
#include "mpbench.h"

/* ---- values ----------------------------------------------------------- */

enum { PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_LIST, PK_DICT, PK_MARK };

/* 40 bytes: the fields that no type uses together share their room. */
typedef struct pk_val pk_val_t;
struct pk_val {
  unsigned char type;
  bool neg;        /* PK_INT: below 0 (u holds its two's complement) */
  bool has_fields; /* PK_DICT: fields is set (and cap no longer) */
  bool searched;   /* PK_LIST: looked through as a device trace, and no
                      "alloc" in it (mpb_snapshot_parse) */
  union {
    uint64_t u; /* PK_INT, PK_BOOL; PK_LIST, PK_DICT: the byte offset of
                   the opcode that made it */
    double f;   /* PK_FLOAT */
  };
  union {
    const char *s;    /* PK_STR: into the input, not NUL-terminated */
    pk_val_t **items; /* PK_LIST items; PK_DICT key, value, key, value... */
  };
  size_t n; /* PK_STR length; PK_LIST items; PK_DICT 2 * pairs */
  union {
    size_t cap;              /* PK_LIST, PK_DICT: room in items */
    const pk_val_t **fields; /* PK_DICT read as a trace entry, after the
                                pickle has run: its fields
                                (pk_entry_fields) */
  };
};
_Static_assert(sizeof(pk_val_t) <= 40, "pk_val_t grew past its 40 bytes");

/* Values, items arrays and entries' fields come from chunks freed together
 * (pk_free_all): a malloc each cost its header and, with the array of
 * them to free, made a pickle of empty lists take 80 times its size. An
 * array outgrown is left in its chunk until then (at most as much again
 * as the array it grew to). */
typedef struct pk_chunk pk_chunk_t;
struct pk_chunk {
  pk_chunk_t *next;
  size_t used, cap;
  max_align_t data[];
};
enum {
  PK_CHUNK = 64 << 10,
  PK_INTS = 4096,
  PK_BIG_ITEMS = PK_CHUNK / 16 / sizeof(pk_val_t *)
};

typedef struct pk_vm {
  const unsigned char *buf;
  size_t len, pos;
  const char *what;
  pk_chunk_t *chunks; /* the one bumped first, then the others */
  pk_val_t **stack;
  size_t nstack, stack_cap;
  pk_val_t **memo;
  size_t nmemo, memo_cap;
  size_t memo_len;        /* entries stored (not NULL): where MEMOIZE puts */
  pk_val_t mark;          /* the MARK sentinel pushed on the stack */
  pk_val_t none, yes, no; /* None, True and False: one value each */
  pk_val_t **ints;        /* PK_INTS small ints made, to share (pk_int) */
  pk_val_t **big;         /* the containers of more than PK_BIG_ITEMS items */
  size_t nbig, big_cap;
} pk_vm_t;

/* Room for n elements of elem bytes (8-byte aligned, not zeroed), or NULL.
 * A request of more than a sixteenth of a chunk gets a chunk of its own,
 * so a chunk left for a new one wastes at most that. */
static void *pk_alloc(pk_vm_t *vm, size_t n, size_t elem) {
  if (elem != 0 && n > (SIZE_MAX / 2 - sizeof(pk_chunk_t)) / elem)
    return NULL;
  size_t bytes = (n * elem + 7) & ~(size_t)7;
  pk_chunk_t *c = vm->chunks;
  if (c == NULL || c->cap - c->used < bytes) {
    size_t cap = bytes > PK_CHUNK / 16 ? bytes : PK_CHUNK;
    pk_chunk_t *nc = malloc(sizeof *nc + cap);
    if (nc == NULL)
      return NULL;
    nc->used = 0;
    nc->cap = cap;
    if (cap == bytes && c != NULL) { /* its own: bump the current one on */
      nc->next = c->next;
      c->next = nc;
    } else {
      nc->next = c;
      vm->chunks = nc;
    }
    c = nc;
  }
  void *p = (char *)c->data + c->used;
  c->used += bytes;
  return p;
}

static pk_val_t *pk_new(pk_vm_t *vm, int type) {
  pk_val_t *v = pk_alloc(vm, 1, sizeof *v);
  if (v != NULL) {
    memset(v, 0, sizeof *v);
    v->type = (unsigned char)type;
  }
  return v;
}

static void pk_free_all(pk_vm_t *vm) {
  for (size_t i = 0; i < vm->nbig; i++)
    free(vm->big[i]->items);
  free(vm->big);
  while (vm->chunks != NULL) {
    pk_chunk_t *next = vm->chunks->next;
    free(vm->chunks);
    vm->chunks = next;
  }
  free(vm->stack);
  free(vm->memo);
}

/* Room in container c for k more items: an array of exactly what the
 * first fill needs (a dict's SETITEMS brings all its pairs at once), then
 * twice as much at each growth. An array of more than PK_BIG_ITEMS is
 * malloc'd and grows in place (realloc), its container listed in vm->big
 * to free it; a smaller one is in a chunk, and one outgrown stays there. */
static bool pk_reserve(pk_vm_t *vm, pk_val_t *c, size_t k) {
  if (c->cap - c->n >= k)
    return true;
  size_t cap = c->cap * 2 > c->n + k ? c->cap * 2 : c->n + k;
  pk_val_t **items;
  if (cap <= PK_BIG_ITEMS)
    items = pk_alloc(vm, cap, sizeof *items);
  else if (cap > SIZE_MAX / sizeof *items)
    return false;
  else if (c->cap > PK_BIG_ITEMS)
    items = realloc(c->items, cap * sizeof *items);
  else if (!mpb_grow(&vm->big, &vm->big_cap, vm->nbig, sizeof *vm->big) ||
           (items = malloc(cap * sizeof *items)) == NULL)
    return false;
  else
    vm->big[vm->nbig++] = c;
  if (items == NULL)
    return false;
  if (c->n > 0 && c->cap <= PK_BIG_ITEMS)
    memcpy(items, c->items, c->n * sizeof *items);
  c->items = items;
  c->cap = cap;
  return true;
}

static bool pk_is_str(const pk_val_t *v, const char *s) {
  return v != NULL && v->type == PK_STR && v->n == strlen(s) &&
         memcmp(v->s, s, v->n) == 0;
}

/* The dict's value for the str key, or NULL. A key set twice (SETITEM
 * again) has its last value, as in Python's dict. */
static const pk_val_t *pk_get(const pk_val_t *d, const char *key) {
  for (size_t i = d->type == PK_DICT ? d->n & ~(size_t)1 : 0; i >= 2; i -= 2)
    if (pk_is_str(d->items[i - 2], key))
      return d->items[i - 1];
  return NULL;
}

/* ---- the machine ------------------------------------------------------ */

static mp_status_t pk_oom(pk_vm_t *vm) {
  return mp__fail(MP_ENOMEM, "%s: out of host memory reading the pickle",
                  vm->what);
}

/* n bytes of operand at the current position, or an error naming op. */
static mp_status_t pk_take(pk_vm_t *vm, size_t n, size_t op_at,
                           const unsigned char **out) {
  if (vm->len - vm->pos < n)
    return mp__fail(MP_EINVAL,
                    "%s: truncated pickle: opcode 0x%02x at byte %zu needs "
                    "%zu more bytes, the file ends at byte %zu",
                    vm->what, vm->buf[op_at], op_at, n, vm->len);
  *out = vm->buf + vm->pos;
  vm->pos += n;
  return MP_OK;
}

static uint64_t pk_le(const unsigned char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = v << 8 | p[i];
  return v;
}

static mp_status_t pk_push(pk_vm_t *vm, pk_val_t *v) {
  if (v == NULL ||
      !mpb_grow(&vm->stack, &vm->stack_cap, vm->nstack, sizeof *vm->stack))
    return pk_oom(vm);
  vm->stack[vm->nstack++] = v;
  return MP_OK;
}

/* Top of stack (not popped); NULL with an error when empty or a mark. */
static pk_val_t *pk_top(pk_vm_t *vm, size_t at, mp_status_t *st) {
  if (vm->nstack == 0 || vm->stack[vm->nstack - 1] == &vm->mark) {
    *st = mp__fail(MP_EINVAL,
                   "%s: bad pickle at byte %zu: opcode 0x%02x needs a value "
                   "on the stack",
                   vm->what, at, vm->buf[at]);
    return NULL;
  }
  return vm->stack[vm->nstack - 1];
}

/* Index of the topmost mark, or an error. */
static mp_status_t pk_find_mark(pk_vm_t *vm, size_t at, size_t *out) {
  for (size_t i = vm->nstack; i-- > 0;)
    if (vm->stack[i] == &vm->mark) {
      *out = i;
      return MP_OK;
    }
  return mp__fail(MP_EINVAL,
                  "%s: bad pickle at byte %zu: opcode '%c' without a MARK",
                  vm->what, at, vm->buf[at]);
}

/* Moves stack[from..] into container c (pairs for a dict). */
static mp_status_t pk_fill(pk_vm_t *vm, pk_val_t *c, size_t from, size_t at) {
  size_t k = vm->nstack - from;
  if (c->type == PK_DICT && k % 2 != 0)
    return mp__fail(MP_EINVAL,
                    "%s: bad pickle at byte %zu: odd number of items (%zu) "
                    "for a dict",
                    vm->what, at, k);
  if (!pk_reserve(vm, c, k))
    return pk_oom(vm);
  for (size_t i = from; i < vm->nstack; i++) {
    if (vm->stack[i] == &vm->mark)
      return mp__fail(MP_EINVAL, "%s: bad pickle at byte %zu: stray MARK",
                      vm->what, at);
    c->items[c->n++] = vm->stack[i];
  }
  vm->nstack = from;
  return MP_OK;
}

static mp_status_t pk_memo_put(pk_vm_t *vm, uint64_t idx, size_t at) {
  mp_status_t st = MP_OK;
  pk_val_t *v = pk_top(vm, at, &st);
  if (v == NULL)
    return st;
  /* Each memoized value costs at least one opcode byte, so an index above
   * the input's length is never real; refusing it bounds the memo. */
  if (idx > vm->len)
    return mp__fail(MP_EINVAL,
                    "%s: bad pickle at byte %zu: memo index %" PRIu64
                    " out of range",
                    vm->what, at, idx);
  while (vm->nmemo <= idx) {
    if (!mpb_grow(&vm->memo, &vm->memo_cap, vm->nmemo, sizeof *vm->memo))
      return pk_oom(vm);
    vm->memo[vm->nmemo++] = NULL;
  }
  vm->memo_len += vm->memo[idx] == NULL;
  vm->memo[idx] = v;
  return MP_OK;
}

static mp_status_t pk_memo_get(pk_vm_t *vm, uint64_t idx, size_t at) {
  if (idx >= vm->nmemo || vm->memo[idx] == NULL)
    return mp__fail(MP_EINVAL,
                    "%s: bad pickle at byte %zu: memo index %" PRIu64
                    " was never stored",
                    vm->what, at, idx);
  return pk_push(vm, vm->memo[idx]);
}

/* A little-endian two's complement integer of n bytes (LONG1/LONG4). */
static mp_status_t pk_long(pk_vm_t *vm, const unsigned char *p, size_t n,
                           size_t at) {
  pk_val_t *v = pk_new(vm, PK_INT);
  if (v == NULL)
    return pk_oom(vm);
  bool neg = n > 0 && (p[n - 1] & 0x80);
  /* Strip the sign extension, then what is left must fit 64 bits. */
  size_t m = n;
  while (m > 0 && p[m - 1] == (neg ? 0xff : 0x00))
    m--;
  if (m > 8 || (neg && m == 8 && !(p[7] & 0x80)))
    return mp__fail(MP_EINVAL,
                    "%s: bad pickle at byte %zu: integer of %zu bytes does "
                    "not fit 64 bits",
                    vm->what, at, n);
  uint64_t u = pk_le(p, m);
  if (neg)
    for (size_t i = m; i < 8; i++)
      u |= (uint64_t)0xff << (8 * i);
  v->u = u;
  v->neg = neg;
  return pk_push(vm, v);
}

/* An int of BININT, BININT1 or BININT2. A value is never changed once
 * made, so one is shared by the ints of the same value that meet in its
 * slot of vm->ints: frames repeat their line numbers, which made a value
 * each. */
static mp_status_t pk_int(pk_vm_t *vm, int64_t x) {
  if (vm->ints == NULL) {
    vm->ints = pk_alloc(vm, PK_INTS, sizeof *vm->ints);
    if (vm->ints == NULL)
      return pk_oom(vm);
    memset(vm->ints, 0, PK_INTS * sizeof *vm->ints);
  }
  pk_val_t **slot = &vm->ints[(uint64_t)x % PK_INTS];
  if (*slot == NULL || (*slot)->u != (uint64_t)x) {
    pk_val_t *v = pk_new(vm, PK_INT);
    if (v == NULL)
      return pk_oom(vm);
    v->u = (uint64_t)x;
    v->neg = x < 0;
    *slot = v;
  }
  return pk_push(vm, *slot);
}

static mp_status_t pk_str(pk_vm_t *vm, size_t lenbytes, size_t at) {
  const unsigned char *p = NULL;
  mp_status_t st = pk_take(vm, lenbytes, at, &p);
  if (st != MP_OK)
    return st;
  uint64_t n = pk_le(p, lenbytes);
  if (n > vm->len - vm->pos)
    return mp__fail(MP_EINVAL,
                    "%s: truncated pickle: string of %" PRIu64
                    " bytes at byte %zu, the file ends at byte %zu",
                    vm->what, n, at, vm->len);
  pk_val_t *v = pk_new(vm, PK_STR);
  if (v == NULL)
    return pk_oom(vm);
  v->s = (const char *)vm->buf + vm->pos;
  v->n = (size_t)n;
  vm->pos += (size_t)n;
  return pk_push(vm, v);
}

/* Runs the pickle in buf to its STOP; *out is the result (owned by vm). */
static mp_status_t pk_run(pk_vm_t *vm, const pk_val_t **out) {
  mp_status_t st = MP_OK;
  while (st == MP_OK) {
    if (vm->pos >= vm->len)
      return mp__fail(MP_EINVAL,
                      "%s: truncated pickle: no STOP opcode before the end "
                      "at byte %zu",
                      vm->what, vm->len);
    size_t at = vm->pos++;
    unsigned char op = vm->buf[at];
    const unsigned char *p = NULL;
    size_t mk = 0;
    pk_val_t *c = NULL;
    switch (op) {
    case 0x80: /* PROTO */
      st = pk_take(vm, 1, at, &p);
      if (st == MP_OK && (p[0] < 2 || p[0] > 5))
        st = mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: protocol %u (2 to 5 are "
                      "read)",
                      vm->what, at, p[0]);
      break;
    case 0x95: /* FRAME: a length hint; the frame must lie in the file */
      st = pk_take(vm, 8, at, &p);
      if (st == MP_OK && pk_le(p, 8) > vm->len - vm->pos)
        st = mp__fail(MP_EINVAL,
                      "%s: truncated pickle: frame at byte %zu of %" PRIu64
                      " bytes, the file ends at byte %zu",
                      vm->what, at, pk_le(p, 8), vm->len);
      break;
    case '.': /* STOP */
      if (vm->nstack == 1 && vm->stack[0] == &vm->mark)
        return mp__fail(MP_EINVAL,
                        "%s: bad pickle at byte %zu: STOP with a MARK on "
                        "the stack, not a value",
                        vm->what, at);
      if (vm->nstack != 1)
        return mp__fail(MP_EINVAL,
                        "%s: bad pickle at byte %zu: STOP with %zu values "
                        "on the stack (1 expected)",
                        vm->what, at, vm->nstack);
      *out = vm->stack[0];
      return MP_OK;
    case '}': /* EMPTY_DICT */
    case ']': /* EMPTY_LIST */
    case ')': /* EMPTY_TUPLE (tuples are lists here) */
      c = pk_new(vm, op == '}' ? PK_DICT : PK_LIST);
      if (c != NULL)
        c->u = at;
      st = pk_push(vm, c);
      break;
    case '(': /* MARK */ st = pk_push(vm, &vm->mark); break;
    case 'N': st = pk_push(vm, &vm->none); break;
    case 0x88: /* NEWTRUE */ st = pk_push(vm, &vm->yes); break;
    case 0x89: /* NEWFALSE */ st = pk_push(vm, &vm->no); break;
    case 'J': /* BININT: 4 bytes, signed */
      st = pk_take(vm, 4, at, &p);
      if (st == MP_OK)
        st = pk_int(vm, (int32_t)(uint32_t)pk_le(p, 4));
      break;
    case 'K': /* BININT1 */
      st = pk_take(vm, 1, at, &p);
      if (st == MP_OK)
        st = pk_int(vm, p[0]);
      break;
    case 'M': /* BININT2 */
      st = pk_take(vm, 2, at, &p);
      if (st == MP_OK)
        st = pk_int(vm, (int64_t)pk_le(p, 2));
      break;
    case 0x8a: /* LONG1 */
    case 0x8b: /* LONG4 */ {
      size_t lb = op == 0x8a ? 1 : 4;
      st = pk_take(vm, lb, at, &p);
      if (st != MP_OK)
        break;
      uint64_t n = pk_le(p, lb);
      if (n > vm->len - vm->pos) {
        st = mp__fail(MP_EINVAL,
                      "%s: truncated pickle: integer of %" PRIu64
                      " bytes at byte %zu, the file ends at byte %zu",
                      vm->what, n, at, vm->len);
        break;
      }
      p = vm->buf + vm->pos;
      vm->pos += (size_t)n;
      st = pk_long(vm, p, (size_t)n, at);
      break;
    }
    case 'G': /* BINFLOAT: 8 bytes, big-endian IEEE 754 */
      st = pk_take(vm, 8, at, &p);
      if (st == MP_OK) {
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++)
          bits = bits << 8 | p[i];
        c = pk_new(vm, PK_FLOAT);
        if (c != NULL)
          memcpy(&c->f, &bits, sizeof c->f);
        st = pk_push(vm, c);
      }
      break;
    case 0x8c: /* SHORT_BINUNICODE */
    case 'C': /* SHORT_BINBYTES */ st = pk_str(vm, 1, at); break;
    case 'X': /* BINUNICODE */
    case 'B': /* BINBYTES */ st = pk_str(vm, 4, at); break;
    case 0x8d: /* BINUNICODE8 */
    case 0x8e: /* BINBYTES8 */ st = pk_str(vm, 8, at); break;
    case 0x94: /* MEMOIZE: at the memo's length, its entries, as Python's
                  Unpickler does (memo[len(memo)]), not past the highest
                  index a BINPUT used */
      st = pk_memo_put(vm, vm->memo_len, at);
      break;
    case 'q': /* BINPUT */
    case 'r': /* LONG_BINPUT */
    case 'h': /* BINGET */
    case 'j': /* LONG_BINGET */ {
      size_t w = (op == 'q' || op == 'h') ? 1 : 4;
      st = pk_take(vm, w, at, &p);
      if (st == MP_OK)
        st = (op == 'q' || op == 'r') ? pk_memo_put(vm, pk_le(p, w), at)
                                      : pk_memo_get(vm, pk_le(p, w), at);
      break;
    }
    case 0x85: /* TUPLE1 */
    case 0x86: /* TUPLE2 */
    case 0x87: /* TUPLE3 */ {
      size_t k = (size_t)(op - 0x84);
      if (vm->nstack < k) {
        st = mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: TUPLE%zu with %zu values "
                      "on the stack",
                      vm->what, at, k, vm->nstack);
        break;
      }
      c = pk_new(vm, PK_LIST);
      if (c == NULL) {
        st = pk_oom(vm);
        break;
      }
      st = pk_fill(vm, c, vm->nstack - k, at);
      if (st == MP_OK)
        st = pk_push(vm, c);
      break;
    }
    case 't': /* TUPLE */
    case 'l': /* LIST */
    case 'd': /* DICT */
      st = pk_find_mark(vm, at, &mk);
      if (st != MP_OK)
        break;
      c = pk_new(vm, op == 'd' ? PK_DICT : PK_LIST);
      if (c == NULL) {
        st = pk_oom(vm);
        break;
      }
      c->u = at;
      vm->nstack--; /* the mark itself: items are above it */
      memmove(vm->stack + mk, vm->stack + mk + 1,
              (vm->nstack - mk) * sizeof *vm->stack);
      st = pk_fill(vm, c, mk, at);
      if (st == MP_OK)
        st = pk_push(vm, c);
      break;
    case 'a': /* APPEND */
    case 's': /* SETITEM */ {
      size_t k = op == 'a' ? 1 : 2;
      if (vm->nstack < k + 1) {
        st = mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: opcode '%c' with %zu "
                      "values on the stack",
                      vm->what, at, op, vm->nstack);
        break;
      }
      c = vm->stack[vm->nstack - k - 1];
      if (c->type != (op == 'a' ? PK_LIST : PK_DICT)) {
        st = mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: opcode '%c' on a value "
                      "that is not a %s",
                      vm->what, at, op, op == 'a' ? "list" : "dict");
        break;
      }
      st = pk_fill(vm, c, vm->nstack - k, at);
      break;
    }
    case 'e': /* APPENDS */
    case 'u': /* SETITEMS */
      st = pk_find_mark(vm, at, &mk);
      if (st != MP_OK)
        break;
      if (mk == 0 ||
          vm->stack[mk - 1]->type != (op == 'e' ? PK_LIST : PK_DICT)) {
        st = mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: opcode '%c' on a value "
                      "that is not a %s",
                      vm->what, at, op, op == 'e' ? "list" : "dict");
        break;
      }
      c = vm->stack[mk - 1];
      vm->nstack--;
      memmove(vm->stack + mk, vm->stack + mk + 1,
              (vm->nstack - mk) * sizeof *vm->stack);
      st = pk_fill(vm, c, mk, at);
      break;
    case '0': /* POP */
      if (vm->nstack == 0)
        st = mp__fail(MP_EINVAL, "%s: bad pickle at byte %zu: POP of nothing",
                      vm->what, at);
      else
        vm->nstack--;
      break;
    case '1': /* POP_MARK */
      st = pk_find_mark(vm, at, &mk);
      if (st == MP_OK)
        vm->nstack = mk;
      break;
    case '2': /* DUP */
      c = pk_top(vm, at, &st);
      if (c != NULL)
        st = pk_push(vm, c);
      break;
    default:
      return mp__fail(MP_EINVAL,
                      "%s: bad pickle at byte %zu: opcode 0x%02x is not read "
                      "(only dict, list, tuple, str, bytes, int, float, bool "
                      "and None of protocols 2 to 5)",
                      vm->what, at, op);
    }
  }
  return st;
}

/* ---- the snapshot ----------------------------------------------------- */

typedef struct pk_text {
  char *s;
  size_t n, cap;
} pk_text_t;

static bool pk_printf(pk_text_t *t, const char *fmt, ...) MP__PRINTF(2, 3);
static bool pk_printf(pk_text_t *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s ? t->s + t->n : NULL, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (k < 0)
      return false;
    if ((size_t)k < t->cap - t->n) {
      t->n += (size_t)k;
      return true;
    }
    size_t cap = t->cap ? t->cap * 2 : 1 << 16;
    while (cap - t->n <= (size_t)k)
      cap *= 2;
    char *ns = realloc(t->s, cap);
    if (ns == NULL)
      return false;
    t->s = ns;
    t->cap = cap;
  }
}

/* The fields of a trace entry that the conversion reads. */
enum {
  PK_F_ACTION,
  PK_F_ADDR,
  PK_F_SIZE,
  PK_F_STREAM,
  PK_F_TIME_US,
  PK_NFIELDS
};
static const char *const pk_field_names[PK_NFIELDS] = {"action", "addr", "size",
                                                       "stream", "time_us"};

/* A TraceEntry has a handful of keys (action, addr, size, stream, time_us,
 * frames, compile_context, ...): an entry of more is no snapshot's, and is
 * refused where it is rather than scanned. */
enum { PK_ENTRY_MAX_KEYS = 64 };

/* Entry k of device_traces[d]: its fields into *out (NULL where missing; a
 * key set twice has its last value, as in Python), found in one pass over
 * its keys the first time the entry is read and kept in it. An entry the
 * memo repeats (2 to 5 input bytes a repeat) is one dict, read once
 * however often it stands in the trace: a scan of its keys per repeat made
 * reading quadratic in the file's length. A value that is not a dict has
 * no fields. */
static mp_status_t pk_entry_fields(pk_vm_t *vm, pk_val_t *e, size_t d, size_t k,
                                   const pk_val_t *const **out) {
  static const pk_val_t *const none[PK_NFIELDS];
  const char *what = vm->what;
  *out = none;
  if (e->type != PK_DICT)
    return MP_OK;
  if (!e->has_fields) {
    if (e->n / 2 > PK_ENTRY_MAX_KEYS)
      return mp__fail(MP_EINVAL,
                      "%s: device_traces[%zu] entry %zu: the dict made at "
                      "byte %" PRIu64 " has %zu keys, more than a trace "
                      "entry has (at most %d are read)",
                      what, d, k, e->u, e->n / 2, (int)PK_ENTRY_MAX_KEYS);
    const pk_val_t **f = pk_alloc(vm, PK_NFIELDS, sizeof *f);
    if (f == NULL)
      return mp__fail(MP_ENOMEM, "%s: out of host memory", what);
    for (int j = 0; j < PK_NFIELDS; j++)
      f[j] = NULL;
    for (size_t i = 0; i + 1 < e->n; i += 2)
      for (int j = 0; j < PK_NFIELDS; j++)
        if (pk_is_str(e->items[i], pk_field_names[j]))
          f[j] = e->items[i + 1];
    e->fields = f;
    e->has_fields = true;
  }
  *out = e->fields;
  return MP_OK;
}

/* Entry k of device_traces[d] (e), as messages name it: with the byte of
 * the opcode that made its dict, where it is a dict. */
static const char *pk_where(char *buf, size_t len, size_t d, size_t k,
                            const pk_val_t *e) {
  if (e->type == PK_DICT)
    snprintf(buf, len,
             "device_traces[%zu] entry %zu (the dict at byte %" PRIu64 ")", d,
             k, e->u);
  else
    snprintf(buf, len, "device_traces[%zu] entry %zu", d, k);
  return buf;
}

/* A non-negative int field of entry k of device_traces[d] (e; v: the
 * field's value, NULL if missing), or an error naming it. */
static mp_status_t pk_field(const char *what, const pk_val_t *v, size_t d,
                            size_t k, const pk_val_t *e, const char *key,
                            bool required, uint64_t *out) {
  char where[128];
  if (v == NULL && !required) {
    *out = 0;
    return MP_OK;
  }
  if (v == NULL || v->type != PK_INT || v->neg)
    return mp__fail(MP_EINVAL, "%s: %s: '%s' %s", what,
                    pk_where(where, sizeof where, d, k, e), key,
                    v == NULL ? "is missing" : "is not a non-negative int");
  *out = v->u;
  return MP_OK;
}

/* The CSV a trace may make from a pickle of len bytes. A trace entry
 * PyTorch writes is a dict of its own, some 55 pickle bytes at the least
 * (its keys through the memo, its values, the dict's own opcodes) against
 * a row of about 45; but the memo can stand one dict in the list again
 * for 2 bytes, which makes a row each: an 8 MB pickle of 4 million
 * repeats took 754 MB and 11 s to read. Bounded at 4 times the input and
 * 1 MiB more, far above any snapshot's rows. */
static size_t pk_csv_cap(size_t len) {
  return len > (SIZE_MAX - ((size_t)1 << 20)) / 4 ? SIZE_MAX
                                                  : 4 * len + ((size_t)1 << 20);
}

/* device_traces[d] as the CSV; len: the pickle's bytes. */
static mp_status_t pk_trace_to_csv(pk_vm_t *vm, const pk_val_t *trace, size_t d,
                                   size_t len, pk_text_t *csv) {
  const char *what = vm->what;
  const pk_val_t *const *f;
  mp_status_t st = MP_OK;
  bool has_completed = false;
  for (size_t k = 0; k < trace->n; k++) {
    if ((st = pk_entry_fields(vm, trace->items[k], d, k, &f)) != MP_OK)
      return st;
    has_completed |= pk_is_str(f[PK_F_ACTION], "free_completed");
  }
  if (!pk_printf(csv, "Thread,Time,Action,Pointer,Size,Stream\n"))
    return mp__fail(MP_ENOMEM, "%s: out of host memory", what);
  for (size_t k = 0; k < trace->n; k++) {
    pk_val_t *e = trace->items[k];
    char where[128]; /* made only for a message (pk_where) */
    if (e->type != PK_DICT)
      return mp__fail(MP_EINVAL, "%s: %s is not a dict", what,
                      pk_where(where, sizeof where, d, k, e));
    if ((st = pk_entry_fields(vm, e, d, k, &f)) != MP_OK)
      return st;
    const pk_val_t *a = f[PK_F_ACTION];
    if (a == NULL || a->type != PK_STR)
      return mp__fail(MP_EINVAL, "%s: %s has no action", what,
                      pk_where(where, sizeof where, d, k, e));
    const char *row = NULL;
    bool oom = false;
    if (pk_is_str(a, "alloc"))
      row = "allocate";
    else if (pk_is_str(a, "free_completed"))
      row = "free";
    else if (pk_is_str(a, "free_requested") || pk_is_str(a, "free"))
      row = has_completed ? NULL : "free";
    else if ((oom = pk_is_str(a, "oom")))
      row = "allocate failure";
    else if (!(pk_is_str(a, "segment_alloc") || pk_is_str(a, "segment_free") ||
               pk_is_str(a, "segment_map") || pk_is_str(a, "segment_unmap") ||
               pk_is_str(a, "snapshot") || pk_is_str(a, "user_defined"))) {
      char shown[41];
      return mp__fail(MP_EINVAL, "%s: %s: unknown action '%s'", what,
                      pk_where(where, sizeof where, d, k, e),
                      mpb_printable(a->s, a->n, shown, sizeof shown));
    }
    uint64_t addr = 0, size = 0, stream = 0, t = 0;
    if (row != NULL) {
      if ((st = pk_field(what, f[PK_F_ADDR], d, k, e, "addr", !oom, &addr)) !=
              MP_OK ||
          (st = pk_field(what, f[PK_F_SIZE], d, k, e, "size", true, &size)) !=
              MP_OK ||
          (st = pk_field(what, f[PK_F_STREAM], d, k, e, "stream", false,
                         &stream)) != MP_OK ||
          (st = pk_field(what, f[PK_F_TIME_US], d, k, e, "time_us", false,
                         &t)) != MP_OK)
        return st;
      if (row[0] == 'a' && !oom && addr == 0 && size != 0)
        return mp__fail(MP_EINVAL,
                        "%s: %s: allocation of %" PRIu64 " bytes at address 0",
                        what, pk_where(where, sizeof where, d, k, e), size);
    }
    bool ok =
        row == NULL
            ? pk_printf(csv, "\n")
            : pk_printf(csv,
                        "0,%" PRIu64 ":%02u:%02u.%06u,%s,0x%" PRIx64 ",%" PRIu64
                        ",%" PRIu64 "\n",
                        t / UINT64_C(3600000000), (unsigned)(t / 60000000 % 60),
                        (unsigned)(t / 1000000 % 60), (unsigned)(t % 1000000),
                        row, addr, size, stream);
    if (!ok)
      return mp__fail(MP_ENOMEM, "%s: out of host memory", what);
    if (csv->n > pk_csv_cap(len))
      return mp__fail(MP_EINVAL,
                      "%s: %s: its %zu entries so far make more than 4 "
                      "times the snapshot's %zu bytes of rows (entries the "
                      "pickle's memo repeats): not a trace PyTorch writes",
                      what, pk_where(where, sizeof where, d, k, e), k + 1, len);
  }
  return MP_OK;
}

/* trace.c names the row it refuses "what:LINE: ...", a line of the CSV
 * made from the snapshot, which no file holds: said instead as the trace
 * entry it came from (line k + 2 is entry k of trace, device_traces[d]),
 * as this file's own refusals say it. Other messages are left as they
 * are. */
static mp_status_t pk_name_entry(mp_status_t st, const char *what,
                                 const pk_val_t *trace, size_t d) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  size_t wl = strlen(what), line = 0;
  const char *p = msg + wl + 1;
  if (strncmp(msg, what, wl) != 0 || msg[wl] != ':' || *p < '0' || *p > '9')
    return st;
  for (; *p >= '0' && *p <= '9' && line < SIZE_MAX / 10; p++)
    line = line * 10 + (size_t)(*p - '0');
  if (*p != ':' || line < 2 || line - 2 >= trace->n)
    return st;
  char where[128];
  return mp__fail(
      st, "%s: %s:%s", what,
      pk_where(where, sizeof where, d, line - 2, trace->items[line - 2]),
      p + 1);
}

/* Where trace.c says the first double free was ("line L (freed by line
 * M)", lines of the CSV made from the snapshot), said as the trace
 * entries they came from, as pk_name_entry says a refused row. */
static void pk_name_double_free(mpb_workload_t *w, const pk_val_t *trace,
                                size_t d) {
  size_t l, m;
  if (sscanf(w->double_free_at, "line %zu (freed by line %zu)", &l, &m) != 2 ||
      l < 2 || m < 2 || l - 2 >= trace->n || m - 2 >= trace->n)
    return;
  char a[128], b[128];
  snprintf(w->double_free_at, sizeof w->double_free_at, "%s (freed by %s)",
           pk_where(a, sizeof a, d, l - 2, trace->items[l - 2]),
           pk_where(b, sizeof b, d, m - 2, trace->items[m - 2]));
}

bool mpb_snapshot_detect(const void *buf, size_t len) {
  return len > 0 && ((const unsigned char *)buf)[0] == 0x80;
}

mp_status_t mpb_snapshot_parse(const void *buf, size_t len, const char *what,
                               const char *name, mpb_workload_t *out) {
  if (buf == NULL || out == NULL || what == NULL)
    return mp__fail(MP_EINVAL, "mpb_snapshot_parse: NULL argument");
  /* Named shortened in messages: a long path would leave no room for the
   * offset and the reason (mp__clip). */
  char shown[MP__CLIP];
  what = mp__clip(what, strlen(what), shown, sizeof shown);
  mpb_workload_init(out, name);
  if (!mpb_snapshot_detect(buf, len))
    return mp__fail(MP_EINVAL,
                    "%s: not a pickle (byte 0 is not the PROTO opcode 0x80)",
                    what);
  pk_vm_t vm = {.buf = buf, .len = len, .what = what};
  vm.mark.type = PK_MARK;
  vm.none.type = PK_NONE;
  vm.yes.type = vm.no.type = PK_BOOL;
  vm.yes.u = 1;
  const pk_val_t *root = NULL;
  mp_status_t st = pk_run(&vm, &root);
  const pk_val_t *traces = NULL, *trace = NULL;
  size_t d = 0;
  if (st == MP_OK) {
    traces = root->type == PK_DICT ? pk_get(root, "device_traces") : NULL;
    if (traces == NULL || traces->type != PK_LIST)
      st = mp__fail(MP_EINVAL,
                    "%s: a pickle, but not a PyTorch memory snapshot (no "
                    "'device_traces' list; record one with "
                    "torch.cuda.memory._record_memory_history())",
                    what);
  }
  for (; st == MP_OK && d < traces->n; d++) {
    pk_val_t *t = traces->items[d];
    if (t->type != PK_LIST) {
      st = mp__fail(MP_EINVAL, "%s: device_traces[%zu] is not a list", what, d);
      break;
    }
    /* A list the memo repeats (2 bytes a repeat) is looked through once:
     * once a repeat made the search quadratic in the file's length. */
    if (t->searched)
      continue;
    const pk_val_t *const *f;
    for (size_t k = 0; k < t->n && trace == NULL && st == MP_OK; k++)
      if ((st = pk_entry_fields(&vm, t->items[k], d, k, &f)) == MP_OK &&
          pk_is_str(f[PK_F_ACTION], "alloc"))
        trace = t;
    if (trace != NULL)
      break;
    t->searched = true;
  }
  if (st == MP_OK && trace == NULL)
    st = mp__fail(MP_EINVAL,
                  "%s: the snapshot's device traces have no allocation: "
                  "nothing to replay (was history recording on?)",
                  what);
  pk_text_t csv = {0};
  if (st == MP_OK)
    st = pk_trace_to_csv(&vm, trace, d, len, &csv);
  /* The values stay until then: a refusal names its entry's byte. */
  if (st == MP_OK &&
      (st = mpb_trace_parse(csv.s, csv.n, what, name, out)) != MP_OK)
    st = pk_name_entry(st, what, trace, d);
  if (st == MP_OK && out->double_frees > 0)
    pk_name_double_free(out, trace, d);
  pk_free_all(&vm);
  free(csv.s);
  return st;
}
