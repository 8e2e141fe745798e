/* config.c - pool configuration: defaults, $MEMPOOL_CONF, option strings and
 * validation.
 *
 * Keys: the table mp__conf_keys below, each with what it takes and what it
 * means; "key=value" or PyTorch's "key:value". A string is applied to a copy
 * and the copy is committed only when every pair parsed, so a rejected string
 * leaves the caller's config unchanged. A bad $MEMPOOL_CONF in
 * mp_pool_config_init leaves the defaults and marks struct_size with
 * MP_POOL_CONFIG_BAD_ENV, which mp_pool_config_parse and mp_pool_create
 * refuse (mp__config_env_check). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../structs.h"
#include "pool_internal.h"

/* Every key, in one table that the parser, its error messages (the known
 * keys, each key's values and bounds) and the documentation
 * (mp_pool_config_help: `mpbench --help`, the README's list, which
 * test_pool_config_docs checks against it) read. PyTorch's
 * PYTORCH_CUDA_ALLOC_CONF names are accepted where they mean the same thing
 * here (c10/cuda/CUDAAllocatorConfig: expandable_segments maps growing
 * segments in place, max_split_size_mb keeps bigger blocks whole). */
typedef enum {
  MP__KEY_SIZE,          /* a size with K/M/G/T, up to max */
  MP__KEY_MIB,           /* a count of MiB, up to max */
  MP__KEY_COUNT,         /* a count, up to max */
  MP__KEY_FLAG,          /* a boolean: the MP_POOL_* bit */
  MP__KEY_FRACTION,      /* a double in (0, 1] */
  MP__KEY_FRACTION_BELOW /* a double in (0, 1) */
} mp__key_kind_t;

typedef struct mp__conf_key {
  const char *name;
  mp__key_kind_t kind;
  size_t field; /* SIZE, MIB, COUNT: offsetof the size_t field; FRACTION:
                   of the double */
  unsigned bit; /* FLAG: the MP_POOL_* bit */
  size_t max;   /* SIZE, MIB, COUNT: the largest value */
  bool pow2;    /* SIZE: a power of two (or 0) */
  const char *help;
} mp__conf_key_t;

#define MP__SIZE_KEY(f, pow2, help)                                            \
  { #f, MP__KEY_SIZE, offsetof(mp_pool_config_t, f), 0, SIZE_MAX, pow2, help }
#define MP__FLAG_KEY(name, bit, help)                                          \
  { name, MP__KEY_FLAG, 0, bit, 0, 0, help }
#define MP__FIELD(f) offsetof(mp_pool_config_t, f)
static const mp__conf_key_t mp__conf_keys[] = {
    MP__SIZE_KEY(max_bytes, false,
                 "cap on reserved device memory; 0: the device's capacity"),
    MP__SIZE_KEY(align, true, "every block's address and size; 0: 512"),
    MP__SIZE_KEY(segment_bytes, false,
                 "smallest device allocation the pool makes; 0: 2 MiB"),
    MP__SIZE_KEY(max_split, false,
                 "a free block above this is never split for a smaller "
                 "request; 0: no limit"),
    MP__SIZE_KEY(release_threshold, false,
                 "idle memory kept; above it free chunks go back to the "
                 "device as frees happen; 0: keep all until trim"),
    MP__FLAG_KEY("virtual", MP_POOL_VIRTUAL,
                 "grow one reserved virtual range (default on)"),
    MP__FLAG_KEY("defrag_on_oom", MP_POOL_DEFRAG_ON_OOM,
                 "defragment movable blocks before MP_ENOMEM (default on)"),
    {"history", MP__KEY_COUNT, MP__FIELD(history), 0, MP__HIST_MAX, false,
     "events the history ring keeps; 0: no history"},
    MP__FLAG_KEY("history_stacks", MP_POOL_HISTORY_STACKS,
                 "record each allocation's stack (needs history)"),
    MP__FLAG_KEY("stream_waits", MP_POOL_STREAM_WAITS,
                 "reuse a block other streams' queued work still uses by "
                 "making the allocating stream wait for that work"),
    MP__FLAG_KEY("pausable", MP_POOL_PAUSABLE,
                 "never take a plain segment (near a cap that is no whole "
                 "number of granules), so that pause always can; the cap is "
                 "used in whole granules (needs virtual, and a device with "
                 "virtual memory)"),
    {"max_fraction", MP__KEY_FRACTION, MP__FIELD(max_fraction), 0, 0, false,
     "cap as a share of the device's memory (or max_bytes, not both)"},
    {"arenas", MP__KEY_COUNT, MP__FIELD(arenas), 0, MP_POOL_MAX_ARENAS, false,
     "per-thread arenas: each thread allocates from one of N private "
     "sub-pools; 0: none (see pool.h, Arenas)"},
    MP__FLAG_KEY("arenas_auto", MP_POOL_ARENAS_AUTO,
                 "start solo on the first allocating thread's arena (a plain "
                 "pool's path) and switch to per-thread arenas when threads "
                 "contend, that thread keeping the plain path (needs "
                 "arenas=N, N at least 2)"),
    MP__SIZE_KEY(map_piece, false,
                 "largest device mapping a growth makes (rounded up to the "
                 "granule): memory goes back in pieces this size, for more "
                 "device calls; 0: one mapping per growth"),
    /* PyTorch's names */
    MP__FLAG_KEY("expandable_segments", MP_POOL_VIRTUAL,
                 "PyTorch's name for virtual"),
    {"max_split_size_mb", MP__KEY_MIB, MP__FIELD(max_split), 0,
     SIZE_MAX / MP__MiB, false, "PyTorch's name for max_split, in MiB"},
    {"per_process_memory_fraction", MP__KEY_FRACTION, MP__FIELD(max_fraction),
     0, 0, false, "PyTorch's name for max_fraction"},
    {"garbage_collection_threshold", MP__KEY_FRACTION_BELOW,
     MP__FIELD(release_fraction), 0, 0, false,
     "release_threshold as a share of the memory the pool may hold (PyTorch's "
     "name)"},
};
#define MP__NKEYS (sizeof mp__conf_keys / sizeof *mp__conf_keys)

/* What a key takes, as the help and the error messages say it. */
static void mp__key_values(const mp__conf_key_t *k, char *buf, size_t n) {
  switch (k->kind) {
  case MP__KEY_SIZE:
    snprintf(buf, n, "%s",
             k->pow2 ? "a power of two (512, 4K, 2M)"
                     : "a size (123, 64K, 8M, 2G, 1T)");
    break;
  case MP__KEY_MIB: /* its bound is only what fits in a size_t */
    snprintf(buf, n, "a whole number of MiB");
    break;
  case MP__KEY_COUNT: snprintf(buf, n, "a count (0 to %zu)", k->max); break;
  case MP__KEY_FLAG:
    snprintf(buf, n, "a boolean (1/0, true/false, yes/no, on/off)");
    break;
  case MP__KEY_FRACTION: snprintf(buf, n, "a fraction in (0, 1]"); break;
  case MP__KEY_FRACTION_BELOW: snprintf(buf, n, "a fraction in (0, 1)"); break;
  }
}

const char *mp_pool_config_key_name(size_t i) {
  return i < MP__NKEYS ? mp__conf_keys[i].name : NULL;
}

mp_status_t mp_pool_config_help(FILE *out, const char *format) {
  bool md = format != NULL && strcmp(format, "markdown") == 0;
  if (out == NULL || !(md || format == NULL || strcmp(format, "text") == 0))
    return mp__fail(MP_EINVAL, "mp_pool_config_help: %s",
                    out == NULL ? "out is NULL"
                                : "format is not \"text\" or \"markdown\"");
  int bad =
      md ? fputs("| key | value | meaning |\n|---|---|---|\n", out) < 0 : 0;
  for (size_t i = 0; i < MP__NKEYS; i++) {
    char values[96];
    mp__key_values(&mp__conf_keys[i], values, sizeof values);
    int r = md ? fprintf(out, "| `%s` | %s | %s |\n", mp__conf_keys[i].name,
                         values, mp__conf_keys[i].help)
               : fprintf(out, "  %-29s %s\n  %-29s %s\n", mp__conf_keys[i].name,
                         mp__conf_keys[i].help, "", values);
    bad |= r < 0;
  }
  /* Its own writes and their flush, not the stream's error flag, which an
   * earlier write of the caller's may have left set (as mp_pool_dump). */
  if (bad || fflush(out) != 0)
    return mp__fail(MP_EIO, "mp_pool_config_help: write failed");
  return MP_OK;
}

typedef struct {
  mp_pool_config_t *cfg;
  const char *what;
  unsigned set; /* bit k: key k given (aliases of one setting collide) */
  size_t room;  /* bytes of the caller's config (its struct_size) */
} mp__conf_ctx_t;

/* Whether keys a and b set the same thing. */
static bool mp__same_setting(const mp__conf_key_t *a, const mp__conf_key_t *b) {
  return a->kind == MP__KEY_FLAG
             ? b->kind == MP__KEY_FLAG && a->bit == b->bit
             : b->kind != MP__KEY_FLAG && a->field == b->field;
}

static mp_status_t mp__unknown_key(const char *what, const char *k, size_t kl) {
  char known[512] = "";
  size_t n = 0;
  for (size_t i = 0; i < MP__NKEYS && n < sizeof known; i++)
    n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "",
                          mp__conf_keys[i].name);
  char shown[MP__CLIP];
  return mp__fail(MP_EINVAL, "bad %s: unknown key '%s' (expected one of %s)",
                  what, mp__clip(k, kl, shown, sizeof shown), known);
}

/* "bad <what>: key='value' is not <what the table says it takes>". */
static mp_status_t mp__bad_value(const mp__conf_ctx_t *ctx,
                                 const mp__conf_key_t *key, const char *v,
                                 size_t vl) {
  char values[96];
  mp__key_values(key, values, sizeof values);
  char shown[MP__CLIP];
  return mp__fail(MP_EINVAL, "bad %s: %s='%s' is not %s", ctx->what, key->name,
                  mp__clip(v, vl, shown, sizeof shown), values);
}

static mp_status_t mp__conf_pair(void *vctx, const char *k, size_t kl,
                                 const char *v, size_t vl) {
  mp__conf_ctx_t *ctx = vctx;
  size_t i = 0;
  while (i < MP__NKEYS && !(strlen(mp__conf_keys[i].name) == kl &&
                            memcmp(mp__conf_keys[i].name, k, kl) == 0))
    i++;
  if (i == MP__NKEYS)
    return mp__unknown_key(ctx->what, k, kl);
  const mp__conf_key_t *key = &mp__conf_keys[i];
  /* A field the caller's config does not have: dropped silently, the
   * option would do nothing (every field is 8 bytes). */
  if (key->kind != MP__KEY_FLAG && key->field + 8 > ctx->room)
    return mp__fail(MP_EINVAL,
                    "bad %s: %s needs a config of at least %zu bytes, and "
                    "this one has %zu (struct_size: a caller built against "
                    "an older header, or the mp_pool_config_init symbol, "
                    "which makes the first size; make it with "
                    "mp_pool_config_init_sized and mp_pool_config_sizeof())",
                    ctx->what, key->name, key->field + 8, ctx->room);
  for (size_t j = 0; j < MP__NKEYS; j++)
    if ((ctx->set >> j & 1u) && mp__same_setting(key, &mp__conf_keys[j]))
      return mp__fail(MP_EINVAL, "bad %s: %s and %s set the same thing",
                      ctx->what, mp__conf_keys[j].name, key->name);
  ctx->set |= 1u << i;
  mp_pool_config_t *c = ctx->cfg;
  if (key->kind == MP__KEY_FLAG) {
    bool on;
    if (!mp__parse_bool(v, vl, &on))
      return mp__bad_value(ctx, key, v, vl);
    c->flags = on ? (c->flags | key->bit) : (c->flags & ~key->bit);
    return MP_OK;
  }
  if (key->kind == MP__KEY_FRACTION || key->kind == MP__KEY_FRACTION_BELOW) {
    bool below = key->kind == MP__KEY_FRACTION_BELOW;
    double f = 0;
    mp_status_t st = mp__read_decimal(v, vl, &f);
    if (st == MP_ENOMEM)
      return mp__fail(MP_ENOMEM,
                      "%s: out of host memory reading %s's value (%zu "
                      "characters); nothing applied",
                      ctx->what, key->name, vl);
    if (st != MP_OK || !(f > 0 && (below ? f < 1 : f <= 1)))
      return mp__bad_value(ctx, key, v, vl);
    memcpy((char *)c + key->field, &f, sizeof f);
    return MP_OK;
  }
  size_t val;
  uint64_t n;
  if (key->kind == MP__KEY_SIZE) {
    if (!mp__parse_size(v, vl, &val) || val > key->max ||
        (key->pow2 && (val & (val - 1)) != 0))
      return mp__bad_value(ctx, key, v, vl);
  } else {
    if (!mp__parse_u64(v, vl, &n) || n > key->max)
      return mp__bad_value(ctx, key, v, vl);
    val = key->kind == MP__KEY_MIB ? (size_t)n * MP__MiB : (size_t)n;
  }
  memcpy((char *)c + key->field, &val, sizeof val);
  return MP_OK;
}

static mp_status_t mp__conf_apply(mp_pool_config_t *cfg, const char *what,
                                  const char *options, size_t room) {
  mp_pool_config_t tmp = *cfg;
  mp__conf_ctx_t ctx = {&tmp, what, 0, room};
  mp_status_t st = mp__kv_each(what, options, mp__conf_pair, &ctx);
  if (st == MP_OK)
    *cfg = tmp;
  return st;
}

mp_status_t mp_pool_config_init_sized(mp_pool_config_t *cfg, size_t size) {
  if (cfg == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_config_init: cfg is NULL");
  mp_status_t st = mp__config_size_check("mp_pool_config_init", size);
  if (st != MP_OK)
    return st;
  mp_pool_config_t c;
  memset(&c, 0, sizeof c);
  c.struct_size = size ? size : MP_POOL_CONFIG_SIZE_V1;
  c.align = MP__DEFAULT_ALIGN;
  c.segment_bytes = MP__DEFAULT_SEGMENT;
  c.flags = MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM;
  const char *env = getenv("MEMPOOL_CONF");
  bool bad = env != NULL && env[0] != '\0' &&
             mp__conf_apply(&c, "MEMPOOL_CONF", env, sizeof c) != MP_OK;
  mp__config_out(&c, cfg);
  if (bad)
    cfg->struct_size |= MP_POOL_CONFIG_BAD_ENV;
  return MP_OK;
}

mp_status_t mp__config_env_check(const char *fn, const mp_pool_config_t *cfg) {
  /* The mark is the top bit on a size mp_pool_config_init wrote: a
   * struct_size that is garbage (a config never made by init, a foreign
   * struct) is no bad $MEMPOOL_CONF but an unknown size, for
   * mp__config_size_check to name. */
  if (!(cfg->struct_size & MP_POOL_CONFIG_BAD_ENV) ||
      !mp__config_size_known(cfg->struct_size & ~MP_POOL_CONFIG_BAD_ENV))
    return MP_OK;
  /* Parse again only to name the culprit in the message. */
  mp_pool_config_t scratch;
  memset(&scratch, 0, sizeof scratch);
  const char *env = getenv("MEMPOOL_CONF");
  if (env != NULL &&
      mp__conf_apply(&scratch, "MEMPOOL_CONF", env, sizeof scratch) != MP_OK)
    return MP_EINVAL;
  return mp__fail(MP_EINVAL,
                  "%s: the config was made while $MEMPOOL_CONF "
                  "was bad",
                  fn);
}

size_t mp_pool_config_sizeof(void) {
  return sizeof(mp_pool_config_t);
}

/* The third layout's: what a program built with this header calls by the
 * name mp_pool_config_init. */
void mp_pool_config_init_v3(mp_pool_config_t *cfg) {
  (void)mp_pool_config_init_sized(cfg, offsetof(mp_pool_config_t, map_piece) +
                                           sizeof cfg->map_piece);
}

/* The symbol itself, for programs built before the header named the
 * layouts' symbols, and other languages: the first layout. */
#undef mp_pool_config_init
void mp_pool_config_init(mp_pool_config_t *cfg) {
  (void)mp_pool_config_init_sized(cfg, MP_POOL_CONFIG_SIZE_V1);
}
/* The header's name again, for the files after this one in a unity build
 * (MEMPOOL_UNITY_BUILD), which must reach this layout's symbol. */
#define mp_pool_config_init mp_pool_config_init_v3

mp_status_t mp_pool_config_parse(mp_pool_config_t *cfg, const char *options) {
  if (cfg == NULL || options == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_config_parse: %s is NULL",
                    cfg == NULL ? "cfg" : "options");
  mp_pool_config_t full;
  mp_status_t st = mp__config_env_check("mp_pool_config_parse", cfg);
  if (st == MP_OK)
    st = mp__config_in("mp_pool_config_parse", cfg, false, &full);
  if (st == MP_OK &&
      (st = mp__conf_apply(&full, "pool options", options,
                           cfg->struct_size ? cfg->struct_size
                                            : MP_POOL_CONFIG_SIZE_V1)) == MP_OK)
    mp__config_out(&full, cfg);
  return st;
}

mp_status_t mp__config_validate(const mp_pool_config_t *cfg) {
  mp_status_t st = mp__config_env_check("pool config", cfg);
  if (st != MP_OK)
    return st;
  st = mp__config_size_check("pool config", cfg->struct_size);
  if (st != MP_OK)
    return st;
  if (cfg->flags & ~MP__POOL_FLAGS)
    return mp__fail(MP_EINVAL, "pool config: unknown flags 0x%x",
                    cfg->flags & ~MP__POOL_FLAGS);
  if (cfg->align != 0 && (cfg->align & (cfg->align - 1)) != 0)
    return mp__fail(MP_EINVAL, "pool config: align %zu is not a power of two",
                    cfg->align);
  if (cfg->align > MP__GiB)
    return mp__fail(MP_EINVAL, "pool config: align %zu is above 1 GiB",
                    cfg->align);
  char num[32];
  if (!(cfg->max_fraction >= 0 && cfg->max_fraction <= 1))
    return mp__fail(MP_EINVAL, "pool config: max_fraction %s is not in (0, 1]",
                    mp__fmt_g(num, sizeof num, cfg->max_fraction));
  if (cfg->max_fraction > 0 && cfg->max_bytes != 0)
    return mp__fail(MP_EINVAL, "pool config: max_bytes and max_fraction both "
                               "cap the pool: give one");
  if (!(cfg->release_fraction >= 0 && cfg->release_fraction < 1))
    return mp__fail(MP_EINVAL,
                    "pool config: release_fraction %s is not in (0, 1)",
                    mp__fmt_g(num, sizeof num, cfg->release_fraction));
  if (cfg->release_fraction > 0 && cfg->release_threshold != 0)
    return mp__fail(MP_EINVAL,
                    "pool config: release_threshold and release_fraction "
                    "(garbage_collection_threshold) both set it: give one");
  if (cfg->history > MP__HIST_MAX)
    return mp__fail(MP_EINVAL, "pool config: history %zu is above %zu events",
                    cfg->history, MP__HIST_MAX);
  if ((cfg->flags & MP_POOL_HISTORY_STACKS) && cfg->history == 0)
    return mp__fail(MP_EINVAL,
                    "pool config: history_stacks=1 needs history=N (N > 0)");
  /* What pausable=1 promises (pause always can) needs the virtual range:
   * a pool of plain segments cannot keep its addresses through a pause. */
  if ((cfg->flags & MP_POOL_PAUSABLE) && !(cfg->flags & MP_POOL_VIRTUAL))
    return mp__fail(MP_EINVAL,
                    "pool config: pausable=1 needs virtual=1 "
                    "(expandable_segments): a pool of plain segments "
                    "cannot keep its addresses through a pause");
  if (cfg->map_piece > SIZE_MAX / 2)
    return mp__fail(MP_EINVAL, "pool config: map_piece %zu is absurd",
                    cfg->map_piece);
  /* Pieces are mappings in the virtual range: with virtual=0 every growth
   * is one plain segment, and map_piece would do nothing. */
  if (cfg->map_piece != 0 && !(cfg->flags & MP_POOL_VIRTUAL))
    return mp__fail(MP_EINVAL,
                    "pool config: map_piece=%zu needs virtual=1 "
                    "(expandable_segments): a pool of plain segments makes "
                    "each growth one device allocation",
                    cfg->map_piece);
  if (cfg->arenas > MP_POOL_MAX_ARENAS)
    return mp__fail(MP_EINVAL, "pool config: arenas %zu is above %d",
                    cfg->arenas, MP_POOL_MAX_ARENAS);
  if ((cfg->flags & MP_POOL_ARENAS_AUTO) && cfg->arenas < 2)
    return mp__fail(MP_EINVAL,
                    "pool config: arenas_auto=1 needs arenas=N with N at "
                    "least 2 (the arenas it switches to), not %zu",
                    cfg->arenas);
  size_t align = cfg->align ? cfg->align : MP__DEFAULT_ALIGN;
  if (cfg->max_bytes != 0 && cfg->max_bytes < align)
    return mp__fail(MP_EINVAL,
                    "pool config: max_bytes %zu is below the alignment %zu",
                    cfg->max_bytes, align);
  if (cfg->segment_bytes > SIZE_MAX / 2)
    return mp__fail(MP_EINVAL, "pool config: segment_bytes %zu is absurd",
                    cfg->segment_bytes);
  return MP_OK;
}
