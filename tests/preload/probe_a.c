/* probe_a.c - a library that looks a symbol up with dlsym(RTLD_NEXT): the
 * answer depends on where the caller sits in the search order, which a
 * dlsym replacement must preserve. probe_b.c defines the same symbol. */
#define _GNU_SOURCE
#include <dlfcn.h>

int probe_value(void);
int probe_a_next(void);

int probe_value(void) {
  return 'a';
}

/* The probe_value after this library: probe_b's. */
int probe_a_next(void) {
  int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe_value");
  return next ? next() : 0;
}
