/* allocator.c - one interface over every allocator, chosen by name.
 *
 * An mp_allocator_t is an ops table plus the object it drives. The built-in
 * kinds ("pool", "child", "direct") are thin adapters over mp_pool_* and
 * mp_direct_*; mp_allocator_wrap puts a caller's own table behind the same
 * interface, so bench/ and the LD_PRELOAD shim compare them side by side.
 *
 * Spec grammar: NAME or NAME:KEY=VAL,...; pool options are parsed by
 * mp_pool_config_parse on top of mp_pool_config_init, so "pool" honours
 * $MEMPOOL_CONF exactly as mp_pool_create(dev, NULL) does. A spec is parsed
 * completely before anything is created, and a failure destroys whatever was
 * made, so a bad spec leaves nothing behind.
 *
 * History stacks (history_stacks=1): the dispatch of the "pool" and
 * "child" kinds marks its caller (MP__HIST_ENTRY) and the ops call the
 * pools without their own mark, so that an event's stack starts at the
 * code that called mp_allocator_*, not at this file's frames, as under
 * mp_pool_* itself. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool/pool_internal.h"
#include "structs.h"

/* A "child" allocator owns both its child pool and the parent it is carved
 * from; destroying it destroys them in that order. */
typedef struct mp__child_alloc {
  mp_pool_t *parent;
  mp_pool_t *child;
} mp__child_alloc_t;

struct mp_allocator {
  mp_allocator_ops_t ops;
  void *self;
  mp_pool_t *pool; /* "pool" and "child": the pool allocations come from */
  /* The built-in kinds' destroy (NULL: a wrapped allocator, ops.destroy).
   * On failure it leaves in a what is left, so that a later destroy ends
   * it, and names nothing that went: self is NULL once nothing is left. */
  mp_status_t (*destroy)(mp_allocator_t *a);
  /* A built-in kind's destroy failed after its pool went (pool and child
   * kinds: mp_pool_destroy_ex's destroyed): only destroy is left. */
  bool lost;
  char name[]; /* the spec (or the wrapped allocator's name) */
};

/* ---- "pool" ----------------------------------------------------------- */

static mp_status_t mp__pool_op_alloc(void *self, size_t bytes, mp_stream_t s,
                                     void **out) {
  return mp__pool_alloc_marked(self, bytes, s, out);
}
static mp_status_t mp__pool_op_free(void *self, void *ptr) {
  return mp__pool_free_marked(self, ptr);
}
static mp_status_t mp__pool_op_record(void *self, void *ptr, mp_stream_t s) {
  return mp_pool_record_stream(self, ptr, s);
}
static mp_status_t mp__pool_op_stats(void *self, mp_stats_t *out) {
  return mp_pool_get_stats(self, out);
}
static mp_status_t mp__pool_op_release(void *self) {
  return mp__pool_trim_marked(self, 0);
}
/* A failure that took the pool with it (a device free refused after
 * others went) leaves nothing but the allocator. */
static mp_status_t mp__pool_allocator_destroy(mp_allocator_t *a) {
  int gone = 0;
  mp_status_t st = mp_pool_destroy_ex(a->self, &gone);
  if (gone && st != MP_OK) {
    a->self = a->pool = NULL;
    a->lost = true;
  }
  return st;
}

static const mp_allocator_ops_t mp__pool_ops = {"pool",
                                                mp__pool_op_alloc,
                                                mp__pool_op_free,
                                                mp__pool_op_record,
                                                mp__pool_op_stats,
                                                mp__pool_op_release,
                                                NULL};

/* ---- "child" ---------------------------------------------------------- */

static mp_status_t mp__child_op_alloc(void *self, size_t bytes, mp_stream_t s,
                                      void **out) {
  return mp__pool_alloc_marked(((mp__child_alloc_t *)self)->child, bytes, s,
                               out);
}
static mp_status_t mp__child_op_free(void *self, void *ptr) {
  return mp__pool_free_marked(((mp__child_alloc_t *)self)->child, ptr);
}
static mp_status_t mp__child_op_record(void *self, void *ptr, mp_stream_t s) {
  return mp_pool_record_stream(((mp__child_alloc_t *)self)->child, ptr, s);
}
static mp_status_t mp__child_op_stats(void *self, mp_stats_t *out) {
  return mp_pool_get_stats(((mp__child_alloc_t *)self)->child, out);
}
static mp_status_t mp__child_op_release(void *self) {
  mp__child_alloc_t *c = self;
  mp_status_t st = mp__pool_trim_marked(c->child, 0);
  mp_status_t pst = mp__pool_trim_marked(c->parent, 0);
  return st != MP_OK ? st : pst;
}
/* A failure keeps what is left, so a later destroy ends it: the parent
 * once the child went (the allocator then has no pool to allocate from),
 * nothing once the parent went too (a device free refused after others
 * went). */
static mp_status_t mp__child_destroy(mp_allocator_t *a) {
  mp__child_alloc_t *c = a->self;
  int gone = 1;
  mp_status_t st =
      c->child != NULL ? mp_pool_destroy_ex(c->child, &gone) : MP_OK;
  if (gone) {
    c->child = NULL;
    a->pool = NULL;
  }
  if (st == MP_OK && (st = mp_pool_destroy_ex(c->parent, &gone), gone)) {
    free(c);
    a->self = NULL;
  }
  a->lost = st != MP_OK && a->pool == NULL;
  return st;
}

static const mp_allocator_ops_t mp__child_ops = {"child",
                                                 mp__child_op_alloc,
                                                 mp__child_op_free,
                                                 mp__child_op_record,
                                                 mp__child_op_stats,
                                                 mp__child_op_release,
                                                 NULL};

/* ---- "direct" --------------------------------------------------------- */

static mp_status_t mp__direct_op_alloc(void *self, size_t bytes, mp_stream_t s,
                                       void **out) {
  return mp_direct_alloc(self, bytes, s, out);
}
static mp_status_t mp__direct_op_free(void *self, void *ptr) {
  return mp_direct_free(self, ptr);
}
static mp_status_t mp__direct_op_record(void *self, void *ptr, mp_stream_t s) {
  return mp_direct_record_stream(self, ptr, s);
}
static mp_status_t mp__direct_op_stats(void *self, mp_stats_t *out) {
  return mp_direct_get_stats(self, out);
}
static mp_status_t mp__direct_op_release(void *self) {
  return mp_direct_free_session(self);
}
/* A failure leaves the allocator as it was (mp_direct_destroy). */
static mp_status_t mp__direct_destroy(mp_allocator_t *a) {
  return mp_direct_destroy(a->self);
}

static const mp_allocator_ops_t mp__direct_ops = {"direct",
                                                  mp__direct_op_alloc,
                                                  mp__direct_op_free,
                                                  mp__direct_op_record,
                                                  mp__direct_op_stats,
                                                  mp__direct_op_release,
                                                  NULL};

/* ---- construction ----------------------------------------------------- */

static mp_status_t mp__allocator_new(const mp_allocator_ops_t *ops,
                                     mp_status_t (*destroy)(mp_allocator_t *),
                                     void *self, mp_pool_t *pool,
                                     const char *name, mp_allocator_t **out) {
  size_t len = strlen(name);
  mp_allocator_t *a = mp__host_alloc(sizeof *a + len + 1);
  if (a == NULL)
    return mp__fail(MP_ENOMEM, "mp_allocator: out of host memory");
  a->ops = *ops;
  a->self = self;
  a->pool = pool;
  a->destroy = destroy;
  a->lost = false;
  memcpy(a->name, name, len + 1);
  *out = a;
  return MP_OK;
}

/* Collects the options of a "child" spec: bytes= for the child, the rest
 * (re-joined) for the parent pool. */
typedef struct mp__child_spec {
  size_t bytes;
  bool have_bytes;
  char *rest; /* as long as the whole options string, so it always fits */
  size_t rest_len;
} mp__child_spec_t;

static mp_status_t mp__child_kv(void *ctx, const char *key, size_t key_len,
                                const char *val, size_t val_len) {
  mp__child_spec_t *c = ctx;
  if (key_len == 5 && memcmp(key, "bytes", 5) == 0) {
    char shown[MP__CLIP];
    if (!mp__parse_size(val, val_len, &c->bytes) || c->bytes == 0)
      return mp__fail(MP_EINVAL,
                      "bad allocator spec: child bytes '%s' is not a "
                      "non-zero size",
                      mp__clip(val, val_len, shown, sizeof shown));
    c->have_bytes = true;
    return MP_OK;
  }
  if (c->rest_len > 0)
    c->rest[c->rest_len++] = ',';
  memcpy(c->rest + c->rest_len, key, key_len + 1 + val_len);
  c->rest_len += key_len + 1 + val_len;
  c->rest[c->rest_len] = '\0';
  return MP_OK;
}

/* A pool made with opts; *cfg: its config. */
static mp_status_t mp__make_pool(mp_device_t *dev, const char *opts,
                                 mp_pool_config_t *cfg, mp_pool_t **out) {
  mp_pool_config_init(cfg);
  mp_status_t st = mp_pool_config_parse(cfg, opts);
  if (st != MP_OK)
    return st;
  return mp_pool_create(dev, cfg, out);
}

/* ra: the return address of mp_allocator_create, where the child's first
 * event (its range) starts its stack. */
static mp_status_t mp__make_child(mp_device_t *dev, const char *spec,
                                  const char *opts, void *ra,
                                  mp_allocator_t **out) {
  mp__child_spec_t c = {0};
  c.rest = mp__host_alloc(strlen(opts) + 1);
  if (c.rest == NULL)
    return mp__fail(MP_ENOMEM, "mp_allocator_create: out of host memory");
  c.rest[0] = '\0';
  mp_status_t st = mp__kv_each("allocator spec", opts, mp__child_kv, &c);
  char shown[MP__CLIP]; /* the spec as messages quote it */
  mp__clip(spec, strlen(spec), shown, sizeof shown);
  if (st == MP_OK && !c.have_bytes)
    st = mp__fail(MP_EINVAL, "bad allocator spec '%s': child needs bytes=SIZE",
                  shown);
  mp__child_alloc_t *ca = NULL;
  if (st == MP_OK) {
    ca = mp__host_calloc(1, sizeof *ca);
    if (ca == NULL)
      st = mp__fail(MP_ENOMEM, "mp_allocator_create: out of host memory");
  }
  mp_pool_config_t cfg;
  if (st == MP_OK)
    st = mp__make_pool(dev, c.rest, &cfg, &ca->parent);
  if (st == MP_OK) {
    MP__HIST_ENTRY_AT(ca->parent, ra);
    st = mp__pool_create_child_marked(ca->parent, c.bytes, &ca->child);
    /* The parent is new and empty: only its cap can stop the child, and
     * the spec set that cap, or $MEMPOOL_CONF did where the spec set none
     * (the parent's config starts from mp_pool_config_init). */
    if (st == MP_ELIMIT) {
      mp_pool_config_t env;
      mp_pool_config_init(&env);
      bool by_bytes = cfg.max_bytes != 0;
      bool from_env = by_bytes ? env.max_bytes == cfg.max_bytes
                               : env.max_fraction == cfg.max_fraction;
      st = mp__fail(MP_EINVAL,
                    "bad allocator spec '%s': child bytes %zu are above the "
                    "parent's cap (its %s%s)",
                    shown, c.bytes, by_bytes ? "max_bytes" : "max_fraction",
                    from_env ? ", from $MEMPOOL_CONF" : "");
    }
    if (st != MP_OK)
      (void)mp_pool_destroy(ca->parent);
  }
  if (st == MP_OK) {
    st = mp__allocator_new(&mp__child_ops, mp__child_destroy, ca, ca->child,
                           spec, out);
    if (st != MP_OK) {
      (void)mp_pool_destroy(ca->child);
      (void)mp_pool_destroy(ca->parent);
    }
  }
  if (st != MP_OK)
    free(ca);
  free(c.rest);
  return st;
}

mp_status_t mp_allocator_create(mp_device_t *dev, const char *spec,
                                mp_allocator_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_create: out is NULL");
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_create: device is NULL");
  if (spec == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_create: spec is NULL");
  const char *colon = strchr(spec, ':');
  size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *opts = colon ? colon + 1 : "";
  mp_status_t st;
  if (name_len == 4 && memcmp(spec, "pool", 4) == 0) {
    mp_pool_t *pool;
    mp_pool_config_t cfg;
    st = mp__make_pool(dev, opts, &cfg, &pool);
    if (st != MP_OK)
      return st;
    st = mp__allocator_new(&mp__pool_ops, mp__pool_allocator_destroy, pool,
                           pool, spec, out);
    if (st != MP_OK)
      (void)mp_pool_destroy(pool);
    return st;
  }
  if (name_len == 5 && memcmp(spec, "child", 5) == 0)
    return mp__make_child(dev, spec, opts, __builtin_return_address(0), out);
  char shown[MP__CLIP], name[MP__CLIP]; /* spec as messages quote it */
  mp__clip(spec, strlen(spec), shown, sizeof shown);
  if (name_len == 6 && memcmp(spec, "direct", 6) == 0) {
    if (opts[0] != '\0')
      return mp__fail(
          MP_EINVAL, "bad allocator spec '%s': direct takes no options", shown);
    mp_direct_t *d;
    st = mp_direct_create(dev, &d);
    if (st != MP_OK)
      return st;
    st = mp__allocator_new(&mp__direct_ops, mp__direct_destroy, d, NULL, spec,
                           out);
    if (st != MP_OK)
      (void)mp_direct_destroy(d);
    return st;
  }
  return mp__fail(MP_EINVAL,
                  "bad allocator spec '%s': unknown allocator '%s' "
                  "(expected pool, child or direct)",
                  shown, mp__clip(spec, name_len, name, sizeof name));
}

mp_status_t mp_allocator_wrap(const mp_allocator_ops_t *ops, void *self,
                              const char *name, mp_allocator_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_wrap: out is NULL");
  if (ops == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_wrap: ops is NULL");
  if (ops->alloc == NULL || ops->free == NULL)
    return mp__fail(MP_EINVAL,
                    "mp_allocator_wrap: ops->alloc and ops->free are required");
  if (name == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_wrap: name is NULL");
  return mp__allocator_new(ops, NULL, self, NULL, name, out);
}

/* ---- dispatch --------------------------------------------------------- */

const char *mp_allocator_name(const mp_allocator_t *a) {
  return a ? a->name : "";
}

mp_pool_t *mp_allocator_pool(const mp_allocator_t *a) {
  return a ? a->pool : NULL;
}

#define MP__CHECK_ALLOCATOR(a)                                                 \
  do {                                                                         \
    if (MP__UNLIKELY((a) == NULL))                                             \
      return mp__fail(MP_EINVAL, "%s: allocator is NULL", __func__);           \
    if (MP__UNLIKELY((a)->lost))                                               \
      return mp__fail(MP_EINVAL,                                               \
                      "%s: allocator '%s' lost its pool to a destroy that "    \
                      "failed; destroy it again",                              \
                      __func__, (a)->name);                                    \
  } while (0)

/* The "pool" and "child" kinds' pool records this call's caller as its
 * events' (see the top); a wrapped allocator's calls mark their own. */
#define MP__ALLOCATOR_ENTRY(a)                                                 \
  do {                                                                         \
    if ((a)->pool != NULL)                                                     \
      MP__HIST_ENTRY((a)->pool);                                               \
  } while (0)

/* An optional operation the wrapped table left out. */
#define MP__CHECK_OP(a, op)                                                    \
  do {                                                                         \
    if ((a)->ops.op == NULL)                                                   \
      return mp__fail(MP_ENOTSUP, "%s: allocator '%s' has no " #op, __func__,  \
                      (a)->name);                                              \
  } while (0)

/* A wrapped allocator's failure that recorded no message of its own (a
 * caller's table that returns a bare MP_ENOMEM): recorded here, so that
 * mp_last_status() is the status the call returned and mp_last_error()
 * says which allocator failed, not some older failure (status.h). The
 * built-in kinds record every failure themselves. */
static mp_status_t mp__wrapped_said(const mp_allocator_t *a, const char *fn,
                                    uint64_t serial, mp_status_t st) {
  if (st != MP_OK && mp__error_serial() == serial)
    (void)mp__fail(st,
                   "%s: allocator '%s' failed with %s (%s), giving no "
                   "reason",
                   fn, a->name, mp_status_name(st), mp_status_string(st));
  return st;
}

/* a->ops.op(args...), with its failure recorded where a wrapped table
 * gave no message. */
#define MP__CALL_OP(a, op, ...)                                                \
  do {                                                                         \
    if ((a)->destroy != NULL)                                                  \
      return (a)->ops.op(__VA_ARGS__);                                         \
    uint64_t serial_ = mp__error_serial();                                     \
    return mp__wrapped_said((a), __func__, serial_, (a)->ops.op(__VA_ARGS__)); \
  } while (0)

mp_status_t mp_allocator_alloc(mp_allocator_t *a, size_t bytes, mp_stream_t s,
                               void **out) {
  MP__CHECK_ALLOCATOR(a);
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_alloc: out is NULL");
  MP__ALLOCATOR_ENTRY(a);
  MP__CALL_OP(a, alloc, a->self, bytes, s, out);
}

mp_status_t mp_allocator_free(mp_allocator_t *a, void *ptr) {
  MP__CHECK_ALLOCATOR(a);
  MP__ALLOCATOR_ENTRY(a);
  MP__CALL_OP(a, free, a->self, ptr);
}

mp_status_t mp_allocator_record_stream(mp_allocator_t *a, void *ptr,
                                       mp_stream_t s) {
  MP__CHECK_ALLOCATOR(a);
  MP__CHECK_OP(a, record_stream);
  MP__CALL_OP(a, record_stream, a->self, ptr, s);
}

mp_status_t mp_allocator_get_stats_sized(mp_allocator_t *a, mp_stats_t *out,
                                         size_t size) {
  MP__CHECK_ALLOCATOR(a);
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_get_stats: out is NULL");
  MP__CHECK_OP(a, get_stats);
  /* The ops (this library's own, or an application's through
   * mp_allocator_wrap, built against this header) fill a whole struct. */
  mp_stats_t s;
  memset(&s, 0, sizeof s);
  uint64_t serial = mp__error_serial();
  mp_status_t st = a->ops.get_stats(a->self, &s);
  if (st != MP_OK)
    return mp__wrapped_said(a, "mp_allocator_get_stats", serial, st);
  return mp__stats_put("mp_allocator_get_stats", &s, out, size);
}

/* MP_STATS_SIZE_V1 bytes (stats.h, "Growing"). */
mp_status_t mp_allocator_get_stats(mp_allocator_t *a, mp_stats_t *out) {
  return mp_allocator_get_stats_sized(a, out, MP_STATS_SIZE_V1);
}

mp_status_t mp_allocator_release(mp_allocator_t *a) {
  MP__CHECK_ALLOCATOR(a);
  MP__CHECK_OP(a, release);
  MP__ALLOCATOR_ENTRY(a);
  MP__CALL_OP(a, release, a->self);
}

mp_status_t mp_allocator_destroy(mp_allocator_t *a) {
  if (a == NULL)
    return mp__fail(MP_EINVAL, "mp_allocator_destroy: allocator is NULL");
  mp_status_t st = MP_OK;
  if (a->destroy != NULL) {
    /* Any failure of the allocators made here keeps the allocator, holding
     * what is left (a pool with live children, a destroy from a host
     * function that cannot wait for the device, memory the device refused
     * to free), so the caller can fix the cause and destroy it again. */
    if (a->self != NULL && (st = a->destroy(a)) != MP_OK)
      return st;
  } else if (a->ops.destroy != NULL) {
    /* MP_EBUSY keeps a wrapped allocator; any other failure ends it. */
    uint64_t serial = mp__error_serial();
    st = mp__wrapped_said(a, "mp_allocator_destroy", serial,
                          a->ops.destroy(a->self));
    if (st == MP_EBUSY)
      return st;
  }
  free(a);
  return st;
}
