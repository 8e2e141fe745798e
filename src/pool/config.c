/* config.c - pool configuration: defaults, $MEMPOOL_CONF, option strings and
 * validation.
 *
 * Keys: max_bytes, align, segment_bytes, max_split (sizes with K/M/G/T),
 * virtual, defrag_on_oom (booleans). A string is applied to a copy and the
 * copy is committed only when every pair parsed, so a rejected string leaves
 * the caller's config unchanged. A bad $MEMPOOL_CONF in mp_pool_config_init
 * leaves the defaults and sets a private flag that mp_pool_create reports. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

static bool mp__key_is(const char *k, size_t kl, const char *name) {
  return strlen(name) == kl && memcmp(k, name, kl) == 0;
}

typedef struct {
  mp_pool_config_t *cfg;
  const char *what;
} mp__conf_ctx_t;

static mp_status_t mp__conf_pair(void *vctx, const char *k, size_t kl,
                                 const char *v, size_t vl) {
  mp__conf_ctx_t *ctx = vctx;
  mp_pool_config_t *c = ctx->cfg;
  size_t *field = NULL;
  if (mp__key_is(k, kl, "max_bytes"))
    field = &c->max_bytes;
  else if (mp__key_is(k, kl, "align"))
    field = &c->align;
  else if (mp__key_is(k, kl, "segment_bytes"))
    field = &c->segment_bytes;
  else if (mp__key_is(k, kl, "max_split"))
    field = &c->max_split;
  if (field != NULL) {
    size_t val;
    if (!mp__parse_size(v, vl, &val))
      return mp__fail(MP_EINVAL, "bad %s: %.*s='%.*s' is not a size", ctx->what,
                      (int)kl, k, (int)vl, v);
    if (field == &c->align && val != 0 && (val & (val - 1)) != 0)
      return mp__fail(MP_EINVAL, "bad %s: align='%.*s' is not a power of two",
                      ctx->what, (int)vl, v);
    *field = val;
    return MP_OK;
  }
  unsigned bit = 0;
  if (mp__key_is(k, kl, "virtual"))
    bit = MP_POOL_VIRTUAL;
  else if (mp__key_is(k, kl, "defrag_on_oom"))
    bit = MP_POOL_DEFRAG_ON_OOM;
  if (bit == 0)
    return mp__fail(MP_EINVAL,
                    "bad %s: unknown key '%.*s' (expected max_bytes, align, "
                    "segment_bytes, max_split, virtual, defrag_on_oom)",
                    ctx->what, (int)kl, k);
  bool on;
  if (!mp__parse_bool(v, vl, &on))
    return mp__fail(MP_EINVAL, "bad %s: %.*s='%.*s' is not a boolean",
                    ctx->what, (int)kl, k, (int)vl, v);
  c->flags = on ? (c->flags | bit) : (c->flags & ~bit);
  return MP_OK;
}

static mp_status_t mp__conf_apply(mp_pool_config_t *cfg, const char *what,
                                  const char *options) {
  mp_pool_config_t tmp = *cfg;
  mp__conf_ctx_t ctx = {&tmp, what};
  mp_status_t st = mp__kv_each(what, options, mp__conf_pair, &ctx);
  if (st == MP_OK)
    *cfg = tmp;
  return st;
}

void mp_pool_config_init(mp_pool_config_t *cfg) {
  if (cfg == NULL)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->align = MP__DEFAULT_ALIGN;
  cfg->segment_bytes = MP__DEFAULT_SEGMENT;
  cfg->flags = MP_POOL_VIRTUAL | MP_POOL_DEFRAG_ON_OOM;
  const char *env = getenv("MEMPOOL_CONF");
  if (env != NULL && env[0] != '\0' &&
      mp__conf_apply(cfg, "MEMPOOL_CONF", env) != MP_OK)
    cfg->flags |= MP__POOL_CONF_BAD;
}

mp_status_t mp_pool_config_parse(mp_pool_config_t *cfg, const char *options) {
  if (cfg == NULL || options == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_config_parse: %s is NULL",
                    cfg == NULL ? "cfg" : "options");
  return mp__conf_apply(cfg, "pool options", options);
}

mp_status_t mp__config_validate(const mp_pool_config_t *cfg) {
  if (cfg->flags & MP__POOL_CONF_BAD) {
    /* Parse again only to name the culprit in the message. */
    mp_pool_config_t scratch = *cfg;
    const char *env = getenv("MEMPOOL_CONF");
    if (env == NULL || mp__conf_apply(&scratch, "MEMPOOL_CONF", env) == MP_OK)
      return mp__fail(MP_EINVAL, "bad MEMPOOL_CONF when the config was made");
    return MP_EINVAL;
  }
  if (cfg->flags & ~MP__POOL_FLAGS)
    return mp__fail(MP_EINVAL, "pool config: unknown flags 0x%x",
                    cfg->flags & ~MP__POOL_FLAGS);
  if (cfg->align != 0 && (cfg->align & (cfg->align - 1)) != 0)
    return mp__fail(MP_EINVAL, "pool config: align %zu is not a power of two",
                    cfg->align);
  if (cfg->align > MP__GiB)
    return mp__fail(MP_EINVAL, "pool config: align %zu is above 1 GiB",
                    cfg->align);
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
