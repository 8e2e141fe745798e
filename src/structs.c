/* structs.c - the sizes of mp_stats_t and mp_pool_config_t this library
 * knows, and copies through a caller's struct of one of them.
 *
 * Both structs only gain fields at their end, so a caller built against an
 * older header holds a prefix of today's struct: the library fills (stats)
 * or reads (config) exactly that prefix. A known size ends on a field: for
 * mp_stats_t any field from oom_count (the first published layout) on, for
 * mp_pool_config_t any field from struct_size on (the first layout that
 * carries it). When a field is appended, add its end to the table here. */
#include <string.h>

#include "structs.h"

#define MP__END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

static const size_t mp__stats_sizes[] = {
    MP__END(mp_stats_t, oom_count),     MP__END(mp_stats_t, free_bytes),
    MP__END(mp_stats_t, segment_count), MP__END(mp_stats_t, live_blocks),
    MP__END(mp_stats_t, free_blocks),   MP__END(mp_stats_t, defrag_count),
    MP__END(mp_stats_t, moved_bytes),   MP__END(mp_stats_t, alloc_retry_count),
    MP__END(mp_stats_t, struct_size),
};
static const size_t mp__config_sizes[] = {
    MP__END(mp_pool_config_t, struct_size),
    MP__END(mp_pool_config_t, arenas),
    MP__END(mp_pool_config_t, map_piece),
};
#define MP__COUNT(a) (sizeof(a) / sizeof *(a))

/* A field appended to either struct needs its symbols named (stats.h and
 * pool.h, "Growing"): the stats calls fill MP_STATS_SIZE_V1 bytes, and
 * mp_pool_config_init_v3 the config up to map_piece. */
_Static_assert(sizeof(mp_stats_t) == MP_STATS_SIZE_V1,
               "mp_stats_t grew: name the stats calls' new symbols");
_Static_assert(sizeof(mp_pool_config_t) == MP__END(mp_pool_config_t, map_piece),
               "mp_pool_config_t grew: add mp_pool_config_init_v4");

static bool mp__known(const size_t *sizes, size_t n, size_t size) {
  for (size_t i = 0; i < n; i++)
    if (sizes[i] == size)
      return true;
  return false;
}

/* "N bytes is not a size of T this library knows (X to Y, on a field's
 * end)". */
static mp_status_t mp__unknown_size(const char *fn, const char *type,
                                    size_t size, const size_t *sizes,
                                    size_t n) {
  return mp__fail(MP_EINVAL,
                  "%s: %zu bytes is not a size of %s this library knows "
                  "(%zu to %zu, ending on a field; %s)",
                  fn, size, type, sizes[0], sizes[n - 1],
                  size > sizes[n - 1] ? "built against a newer header?"
                                      : "a corrupt or foreign struct?");
}

mp_status_t mp__stats_put(const char *fn, const mp_stats_t *full,
                          mp_stats_t *out, size_t size) {
  if (!mp__known(mp__stats_sizes, MP__COUNT(mp__stats_sizes), size))
    return mp__unknown_size(fn, "mp_stats_t", size, mp__stats_sizes,
                            MP__COUNT(mp__stats_sizes));
  mp_stats_t s = *full;
  s.struct_size = size;
  memcpy(out, &s, size);
  return MP_OK;
}

bool mp__config_size_known(size_t size) {
  return mp__known(mp__config_sizes, MP__COUNT(mp__config_sizes), size);
}

mp_status_t mp__config_size_check(const char *fn, size_t size) {
  if (size == 0 ||
      mp__known(mp__config_sizes, MP__COUNT(mp__config_sizes), size))
    return MP_OK;
  return mp__unknown_size(fn, "mp_pool_config_t (struct_size)", size,
                          mp__config_sizes, MP__COUNT(mp__config_sizes));
}

static size_t mp__config_size(const mp_pool_config_t *c) {
  return c->struct_size ? c->struct_size : MP_POOL_CONFIG_SIZE_V1;
}

mp_status_t mp__config_in(const char *fn, const mp_pool_config_t *user,
                          bool env_tail, mp_pool_config_t *full) {
  mp_status_t st = mp__config_size_check(fn, user->struct_size);
  if (st != MP_OK)
    return st;
  /* Fields past the caller's bytes: zeros, or (env_tail) what
   * mp_pool_config_init gives them: their defaults, or $MEMPOOL_CONF's
   * values where it names them (a program built against an older header
   * cannot set them otherwise). A bad $MEMPOOL_CONF leaves the defaults, as
   * init does; its message is no failure of this call's. */
  size_t n = mp__config_size(user);
  memset(full, 0, sizeof *full);
  if (env_tail && n < sizeof *full) {
    mp__error_saved_t saved;
    mp__error_save(&saved);
    (void)mp_pool_config_init_sized(full, sizeof *full);
    mp__error_restore(&saved);
  }
  memcpy(full, user, n);
  return MP_OK;
}

void mp__config_out(const mp_pool_config_t *full, mp_pool_config_t *user) {
  memcpy(user, full, mp__config_size(full));
}
