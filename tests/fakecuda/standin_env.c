/* standin_env.c - linked into the stand-in of a real driver only (target
 * fakecuda_standin, with -Wl,--wrap=getenv): every FAKECUDA_* variable
 * reads as unset, as a real libcuda.so.1 reads none of them, so a GPU twin
 * that needs one (a capacity, a second device, a strict rule) fails on the
 * stand-in as it would on a GPU. Other names (the copy of mempool inside
 * the fake reads its own) are the environment's. The normal fake is built
 * without this file and reads them all.
 *
 * One exception, the machine rather than the fake: the number of GPUs.
 * MEMPOOL_STANDIN_DEVICES=N (ctest's standin2_* tests set 2) makes the
 * stand-in a machine with N devices, as FAKECUDA_DEVICE_COUNT makes the
 * fake; unset, it has one. A program's own FAKECUDA_DEVICE_COUNT is still
 * unread, so a twin that skips on one GPU runs its two-device cases only
 * there, as on a two-GPU machine. */
#include <stdlib.h>
#include <string.h>

char *__real_getenv(const char *name);
char *__wrap_getenv(const char *name);

char *__wrap_getenv(const char *name) {
  static const char prefix[] = "FAKECUDA_";
  if (name != NULL && strcmp(name, "FAKECUDA_DEVICE_COUNT") == 0)
    return __real_getenv("MEMPOOL_STANDIN_DEVICES");
  if (name != NULL && strncmp(name, prefix, sizeof prefix - 1) == 0)
    return NULL;
  return __real_getenv(name);
}
