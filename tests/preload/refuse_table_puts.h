/* refuse_table_puts.h - the shim's table of pointers out of host memory,
 * when a test asks: mp__ptrmap_put (ptrmap.c), wrapped (-Wl,--wrap=
 * mp__ptrmap_put), fails for the table's map (entries of mp__pl_block_t)
 * refuse_table_puts times, counting each in refused, after letting
 * pass_table_puts through; other maps are left alone. For one test file
 * of the shim's sources in the test process. */
#ifndef MP_TESTS_PRELOAD_REFUSE_TABLE_PUTS_H
#define MP_TESTS_PRELOAD_REFUSE_TABLE_PUTS_H

#include "preload/hooks.h"

void *__real_mp__ptrmap_put(mp__ptrmap_t *m, uintptr_t key);
void *__wrap_mp__ptrmap_put(mp__ptrmap_t *m, uintptr_t key);

static int refuse_table_puts; /* how many to refuse */
static int pass_table_puts;   /* how many to let through before those */
static int refused;

void *__wrap_mp__ptrmap_put(mp__ptrmap_t *m, uintptr_t key) {
  if (refuse_table_puts > 0 && m->esize == sizeof(mp__pl_block_t)) {
    if (pass_table_puts > 0) {
      pass_table_puts--;
      return __real_mp__ptrmap_put(m, key);
    }
    refuse_table_puts--;
    refused++;
    return NULL; /* as when host memory runs out */
  }
  return __real_mp__ptrmap_put(m, key);
}

#endif
