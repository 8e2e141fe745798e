/* structs.h - the public structs that grow (mp_stats_t, mp_pool_config_t):
 * which sizes of them this library knows, and copying through a caller's
 * struct of one of those sizes. The rule is stated in mempool/stats.h and
 * mempool/pool.h ("Growing"); this is its one home. */
#ifndef MEMPOOL_STRUCTS_H
#define MEMPOOL_STRUCTS_H

#include "internal.h"

/* Writes the first size bytes of *full to out (with struct_size = size when
 * it fits), after checking size; fn names the caller in the message. A size
 * this library does not know: MP_EINVAL, nothing written. */
mp_status_t mp__stats_put(const char *fn, const mp_stats_t *full,
                          mp_stats_t *out, size_t size);

/* MP_OK when size is a mp_pool_config_t size this library knows (0 reads
 * as MP_POOL_CONFIG_SIZE_V1); else MP_EINVAL naming fn and the known sizes. */
mp_status_t mp__config_size_check(const char *fn, size_t size);
/* Whether size is one mp_pool_config_init_sized writes: a known size, not
 * 0. No message. */
bool mp__config_size_known(size_t size);
/* The caller's config as this library's full struct: its struct_size bytes,
 * then zeros (every appended field's default) or, with env_tail, what
 * mp_pool_config_init gives the fields past them (defaults, or
 * $MEMPOOL_CONF's values). Checks struct_size first. */
mp_status_t mp__config_in(const char *fn, const mp_pool_config_t *user,
                          bool env_tail, mp_pool_config_t *full);
/* Writes full->struct_size bytes (0: V1) of full to the caller's struct. */
void mp__config_out(const mp_pool_config_t *full, mp_pool_config_t *user);

#endif /* MEMPOOL_STRUCTS_H */
