/* ctor_call.c - a library whose constructor calls the function whose
 * address $MP_CTOR_CALL gives (hex), for a test that needs a call made
 * while the loader's lock is held: glibc runs the constructors of a
 * library dlopen loads with it held. Without the variable it does nothing. */
#include <stdint.h>
#include <stdlib.h>

__attribute__((constructor)) static void ctor_call(void) {
  const char *s = getenv("MP_CTOR_CALL");
  if (s == NULL)
    return;
  void (*fn)(void) = (void (*)(void))(uintptr_t)strtoull(s, NULL, 16);
  if (fn != NULL)
    fn();
}
