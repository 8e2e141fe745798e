/* hooks.h - the entry points libmempool_preload.so exports in place of
 * CUDA's (and dlsym), declared from hooklist.h's one list. Spelled with
 * preload.h's ABI types; sigcheck.c checks them against the toolkit's
 * headers. */
#ifndef MEMPOOL_PRELOAD_HOOKS_H
#define MEMPOOL_PRELOAD_HOOKS_H

#include "preload.h"

#define MP__EXPORT __attribute__((visibility("default")))

#define MP__PL_DECLARE(lib, result, name, params) MP__EXPORT result name params;
MP__PL_HOOKS(MP__PL_DECLARE)
#undef MP__PL_DECLARE

#endif /* MEMPOOL_PRELOAD_HOOKS_H */
